//! A second implementation of the packet format: `scripts/reference/write_packet.py`,
//! written from docs/packet-format.md alone, must write the very bytes
//! `sessionfs pack` writes, and the same digest, for trees that need no
//! policy decision. Each test builds trees that exercise one part of the
//! spec, in each version of the format (`sessionfs.packet/2` and `/1`); a
//! difference names the first differing byte and its member.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The reference writer.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/reference/write_packet.py")
}

/// Runs the reference writer and returns the digest it prints. A missing
/// `python3` fails the test: this check must not be skipped.
#[track_caller]
fn python_pack(
    ws: &Path,
    harness: Option<(&Path, &str)>,
    out: &Path,
    zero: bool,
    version: &str,
) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg(script())
        .args(["--packet-version", version])
        .arg("--workspace")
        .arg(ws)
        .arg("-o")
        .arg(out);
    if let Some((dir, kind)) = harness {
        cmd.arg("--harness")
            .arg(dir)
            .arg("--harness-kind")
            .arg(kind);
    }
    if zero {
        cmd.arg("--zero-mtimes");
    }
    let o = succeed(&mut cmd);
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

/// A block of a packet, printable: offset, then text with other bytes as
/// `\xNN`.
fn show_block(bytes: &[u8], block: usize) -> String {
    let start = block * 512;
    let end = (start + 512).min(bytes.len());
    if start >= bytes.len() {
        return "(past the end)".into();
    }
    let mut s = String::new();
    for &b in &bytes[start..end] {
        if b.is_ascii_graphic() || b == b' ' {
            s.push(b as char);
        } else if b == 0 {
            s.push('.');
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

/// Packs the tree with both writers, in each version, and asserts equal
/// bytes and digests.
#[track_caller]
fn assert_same(tmp: &Path, name: &str, ws: &Path, harness: Option<(&Path, &str)>, zero: bool) {
    for version in ["2", "1"] {
        assert_same_in(tmp, name, ws, harness, zero, version);
    }
}

#[track_caller]
fn assert_same_in(
    tmp: &Path,
    name: &str,
    ws: &Path,
    harness: Option<(&Path, &str)>,
    zero: bool,
    version: &str,
) {
    let name = &format!("{name}-v{version}");
    let ours = tmp.join(format!("{name}.rust.packet"));
    let theirs = tmp.join(format!("{name}.py.packet"));
    let mut extra: Vec<&str> = vec!["--packet-version", version];
    if let Some((dir, kind)) = harness {
        extra.extend(["--harness", dir.to_str().unwrap(), "--harness-kind", kind]);
    }
    if zero {
        extra.push("--zero-mtimes");
    }
    let result = pack(ws, &ours, &extra);
    for list in ["excluded", "dropped", "rebased_symlinks"] {
        assert_eq!(result[list], serde_json::json!([]), "{name}: {list}");
    }
    let digest = python_pack(ws, harness, &theirs, zero, version);
    let a = fs::read(&ours).unwrap();
    let b = fs::read(&theirs).unwrap();
    if a != b {
        let at = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        let block = at / 512;
        panic!(
            "{name}: packets differ (sessionfs {} bytes, write_packet.py {} bytes), \
             first at byte {at} (block {block}, offset {} in it)\n\
             sessionfs:      {}\nwrite_packet.py: {}\nkept in {}",
            a.len(),
            b.len(),
            at % 512,
            show_block(&a, block),
            show_block(&b, block),
            tmp.display()
        );
    }
    assert_eq!(result["digest"].as_str().unwrap(), digest, "{name}: digest");
}

/// A file with `content` at `root/rel` and mtime `ns`.
fn file_at(root: &Path, rel: &str, content: &[u8], ns: i64) {
    write(root, rel, content);
    set_mtime(&root.join(rel), ns);
}

/// `root/rel` as a directory, parents included.
fn dir(root: &Path, rel: &str) {
    fs::create_dir_all(root.join(rel)).unwrap();
}

/// A symlink at `root/rel` to `target`, parents included.
fn link(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    symlink(target, p).unwrap();
}

/// A name of exactly `n` bytes: `stem` repeated and cut, then `x` to fill.
fn name_of(stem: &str, n: usize) -> String {
    let mut s = String::new();
    for c in stem.chars().cycle() {
        if s.len() + c.len_utf8() > n {
            break;
        }
        s.push(c);
    }
    while s.len() < n {
        s.push('x');
    }
    s
}

#[test]
fn every_entry_type_mode_and_name() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    file_at(&ws, "README.md", b"# readme\n", 1_700_000_000_123_456_789);
    file_at(&ws, "empty", b"", 1_700_000_001_000_000_000);
    dir(&ws, "empty-dir");
    dir(&ws, "nested/empty/deeper");
    // Modes: any x bit is executable; other bits are not recorded.
    for (rel, mode) in [
        ("modes/rwx", 0o755),
        ("modes/owner-x", 0o700),
        ("modes/group-x", 0o610),
        ("modes/other-x", 0o601),
        ("modes/private", 0o600),
        ("modes/setuid", 0o4755),
        ("modes/sticky", 0o1644),
        ("modes/readonly", 0o444),
    ] {
        file_at(&ws, rel, rel.as_bytes(), 1_600_000_000_000_000_001);
        chmod(&ws.join(rel), mode);
    }
    dir(&ws, "private-dir/inner");
    chmod(&ws.join("private-dir"), 0o700);
    chmod(&ws.join("private-dir/inner"), 0o2775);
    // Byte order: `a`, `a-b`, `a.c`, `a/b`, `a0`, `aZ`, `ab`.
    for rel in ["a/b", "a-b", "a.c", "a0", "aZ", "ab", "a/b-c", "a/b/c"] {
        if rel == "a/b" {
            dir(&ws, rel);
        } else {
            file_at(&ws, rel, rel.as_bytes(), 1);
        }
    }
    // Non-ASCII names and characters the path rules allow.
    for rel in [
        "café/naïve.txt",
        "日本語/ファイル",
        "emoji/🦀🦀.rs",
        "combining/e\u{301}x",
        "quote\"d",
        "sp ace",
        "eq=al",
        "nbsp\u{a0}",
        "del-free~!@#$%^&*()",
        "zero-width\u{200b}",
        "\u{ffff}max-bmp",
        "\u{10ffff}",
        "separators\u{2028}\u{2029}\u{feff}",
    ] {
        file_at(&ws, rel, rel.as_bytes(), 1_234_567_890_987_654_321);
    }
    // Symlinks: relative, to directories, dangling, climbing, and targets
    // holding characters the manifest must escape.
    link(&ws, "link", "README.md");
    link(&ws, "dirlink", "nested");
    link(&ws, "dangling", "no/such/file");
    link(&ws, "nested/up", "../../outside");
    link(&ws, "dot", ".");
    link(&ws, "esc/quote", "a\"b");
    link(&ws, "esc/backslash", "a\\b");
    link(
        &ws,
        "esc/controls",
        "\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1b}\u{1f} \u{7f}\u{80}\u{9f}",
    );
    link(&ws, "esc/slash-and-unicode", "./x/é/日/🦀/");
    link(&ws, "esc/trailing-slash", "nested/");
    link(&ws, "esc/separators", "\u{2028}\u{2029}\u{feff}/");
    // A hard link is an independent file.
    fs::hard_link(ws.join("README.md"), ws.join("hardlink")).unwrap();
    assert_same(tmp.path(), "types", &ws, None, false);
    assert_same(tmp.path(), "types-zero", &ws, None, true);
}

#[test]
fn ustar_prefix_split_and_pax_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    // "workspace/" is 10 bytes.
    let w = 10;
    // Exactly 100 bytes: whole in `name`.
    file_at(&ws, &name_of("n", 100 - w), b"100", 5);
    // 101 bytes, one component: no `/` leaves a name of at most 100: PAX.
    file_at(&ws, &name_of("o", 101 - w), b"101", 5);
    // 101 bytes, split: prefix `workspace/d`, name of 89.
    file_at(
        &ws,
        &format!("d/{}", name_of("p", 101 - w - 2)),
        b"split",
        5,
    );
    // Longest prefix (155 bytes) and longest name (100): 256 bytes, fits.
    let pre = name_of("q", 155 - w);
    file_at(&ws, &format!("{pre}/{}", name_of("r", 100)), b"256", 5);
    // Name one byte too long for that prefix: PAX.
    file_at(&ws, &format!("{pre}/{}", name_of("s", 101)), b"257", 5);
    // Prefix one byte too long: the last `/` within 156 bytes is earlier.
    let pre2 = format!("{}/{}", name_of("t", 60), name_of("u", 155 - w - 60));
    file_at(&ws, &format!("{pre2}/{}", name_of("v", 14)), b"early", 5);
    file_at(&ws, &format!("{pre2}/{}", name_of("w", 100)), b"pax", 5);
    // Directories of exactly 100 and 256 bytes, and a 255-byte component.
    dir(&ws, &name_of("D", 100 - w));
    dir(&ws, &format!("{}/{}", name_of("E", 145), name_of("F", 100)));
    file_at(&ws, &name_of("G", 255), b"255", 5);
    // A directory whose path needs a split, and one that needs PAX.
    dir(&ws, &format!("{}/{}", name_of("x", 120), name_of("y", 50)));
    dir(&ws, &format!("{}/{}", name_of("z", 200), name_of("y", 200)));
    // Non-ASCII: the split and the cut `name` at a character boundary.
    for k in 0..4 {
        let stem = format!("{}{}", "k".repeat(k), "é日🦀");
        file_at(&ws, &format!("cut/{}", name_of(&stem, 150)), b"cut", 5);
        file_at(
            &ws,
            &format!("cut/{}/{}", name_of(&stem, 140), name_of(&stem, 99)),
            b"s",
            5,
        );
    }
    // Paths over 255 bytes, up to the default limit, with PAX record
    // lengths crossing from 3 to 4 digits (at 990 bytes of path).
    let mut deep = String::from("deep");
    while deep.len() < 3900 {
        deep.push('/');
        deep.push_str(&name_of("d", 250));
    }
    file_at(&ws, &format!("{deep}/leaf"), b"deep", 5);
    for total in 985..=995 {
        // workspace/long/<l>/<l>/<l>/<m> of `total` bytes
        let l = name_of("l", 250);
        let m = name_of("m", total - w - "long/".len() - 3 * 251);
        file_at(&ws, &format!("long/{l}/{l}/{l}/{m}"), b"", 5);
    }
    assert_same(tmp.path(), "paths", &ws, None, false);
}

#[test]
fn long_symlink_targets_and_linkname() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    dir(&ws, "t");
    for n in [
        1, 99, 100, 101, 155, 156, 255, 256, 512, 985, 986, 987, 988, 989, 4000, 4095,
    ] {
        link(&ws, &format!("t/ascii-{n}"), &name_of("../a/", n));
    }
    // Multi-byte characters straddling byte 100 of the target.
    for k in 0..4 {
        let target = format!("{}{}", "k".repeat(k), name_of("é日🦀", 140));
        link(&ws, &format!("t/utf8-{k}"), &target);
    }
    // Control characters in a long target: escaped in JSON, raw in PAX.
    link(
        &ws,
        "t/controls",
        &format!("{}\n\t\u{1}\"\\", name_of("c", 120)),
    );
    // A path and a target that both need PAX records.
    let long_dir = format!("{}/{}", name_of("p", 200), name_of("q", 200));
    link(&ws, &format!("{long_dir}/both"), &name_of("../", 300));
    link(&ws, &format!("{long_dir}/path-only"), "short");
    assert_same(tmp.path(), "targets", &ws, None, false);
}

#[test]
fn chunks_of_large_files() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    const MIB4: usize = 4 * 1024 * 1024;
    let data: Vec<u8> = (0..(2 * MIB4 + 12345) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for (rel, n) in [
        ("exactly-4mib", MIB4),
        ("4mib-minus-1", MIB4 - 1),
        ("4mib-plus-1", MIB4 + 1),
        ("two-chunks-exact", 2 * MIB4),
        ("three-chunks-partial", 2 * MIB4 + 12345),
        ("block-511", 511),
        ("block-512", 512),
        ("block-513", 513),
    ] {
        file_at(&ws, rel, &data[..n], 1_700_000_000_000_000_000 + n as i64);
    }
    chmod(&ws.join("three-chunks-partial"), 0o755);
    assert_same(tmp.path(), "chunks", &ws, None, false);
}

#[test]
fn mtimes_nanoseconds_and_out_of_range() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    for (i, ns) in [
        0i64,
        1,
        999_999_999,
        1_000_000_000,
        1_700_000_000_999_999_999,
        -1,                        // clamped to 0
        -1_500_000_000,            // clamped to 0
        8_589_934_591_999_999_999, // the largest mtime_ns
        8_589_934_592_000_000_000, // past 2242: clamped
        9_000_000_000_123_456_789, // past 2242: clamped
    ]
    .into_iter()
    .enumerate()
    {
        file_at(&ws, &format!("f{i}"), b"t", ns);
    }
    // Directory and symlink times are not recorded.
    link(&ws, "l", "f0");
    set_mtime(&ws.join("l"), 1_234_000_000_000);
    set_mtime(&ws, 1_234_000_000_000);
    assert_same(tmp.path(), "mtimes", &ws, None, false);
    assert_same(tmp.path(), "mtimes-zero", &ws, None, true);
}

#[test]
fn harness_part_of_each_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let h = tmp.path().join("h");
    sample_tree(&ws);
    file_at(
        &h,
        "history.jsonl",
        b"{\"a\":1}\n",
        1_700_000_000_000_000_123,
    );
    file_at(&h, "sessions/2025/01/s.jsonl", b"{}\n", 42);
    dir(&h, "empty");
    link(&h, "current", "sessions/2025");
    chmod(&h, 0o700);
    for kind in ["codex", "claude", "opencode", "generic"] {
        assert_same(tmp.path(), kind, &ws, Some((&h, kind)), false);
    }
    assert_same(tmp.path(), "harness-zero", &ws, Some((&h, "codex")), true);
    // An empty harness and an empty workspace.
    let e1 = tmp.path().join("e1");
    let e2 = tmp.path().join("e2");
    dir(&e1, "");
    dir(&e2, "");
    assert_same(tmp.path(), "empty", &e1, None, false);
    assert_same(
        tmp.path(),
        "empty-harness",
        &e1,
        Some((&e2, "generic")),
        false,
    );
}

/// A small deterministic generator (xorshift64*), so that no dependency
/// decides the trees and a failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Characters for random names: none has a case or a decomposition, so
/// distinct names never collide after folding, and none is `.`.
const ALPHABET: &[&str] = &[
    "a", "b", "c", "d", "0", "1", "-", "_", " ", "=", "\"", "~", "日", "本", "🦀", "\u{a0}", "ø",
    "ŋ", "€",
];

fn random_name(rng: &mut Rng) -> String {
    let len = match rng.below(10) {
        0 => 60 + rng.below(60),
        1 => 100 + rng.below(60),
        _ => 1 + rng.below(12),
    };
    let mut s = String::from("n");
    while s.len() < len {
        let c = ALPHABET[rng.below(ALPHABET.len())];
        if s.len() + c.len() > 255 {
            break;
        }
        s.push_str(c);
    }
    s
}

fn random_tree(rng: &mut Rng, root: &Path) {
    let mut dirs = vec![root.to_path_buf()];
    for _ in 0..200 {
        let parent = dirs[rng.below(dirs.len())].clone();
        let p = parent.join(random_name(rng));
        if fs::symlink_metadata(&p).is_ok() || p.as_os_str().len() > 3000 {
            continue;
        }
        match rng.below(10) {
            0..=1 => {
                fs::create_dir(&p).unwrap();
                dirs.push(p);
            }
            2..=7 => {
                let size = match rng.below(6) {
                    0 => 0,
                    1 => 512 * rng.below(4),
                    _ => rng.below(3000),
                };
                let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                fs::write(&p, data).unwrap();
                if rng.below(3) == 0 {
                    chmod(&p, 0o700 + rng.below(0o100) as u32);
                }
                let ns = rng.next() as i64 % 4_000_000_000_000_000_000;
                set_mtime(&p, ns);
            }
            _ => {
                let mut target = String::new();
                for _ in 0..=rng.below(4) {
                    if !target.is_empty() {
                        target.push('/');
                    }
                    if rng.below(3) == 0 {
                        target.push_str("..");
                    } else {
                        target.push_str(&random_name(rng));
                    }
                }
                symlink(target, &p).unwrap();
            }
        }
    }
}

#[test]
fn random_trees_with_fixed_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in [1u64, 0x5e55_10f5, 0xdead_beef_cafe] {
        let ws = tmp.path().join(format!("ws-{seed}"));
        let h = tmp.path().join(format!("h-{seed}"));
        let mut rng = Rng(seed);
        dir(&ws, "");
        dir(&h, "");
        random_tree(&mut rng, &ws);
        random_tree(&mut rng, &h);
        let name = format!("random-{seed}");
        assert_same(tmp.path(), &name, &ws, Some((&h, "generic")), false);
    }
}
