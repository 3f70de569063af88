//! `pack --workspace-tar` / `--harness-tar`: a tar stream read as the
//! part's tree, never extracted, under the policy a directory gets (issue
//! 35). The same tree as a directory or as a tar gives the same packet,
//! byte for byte, and the same report; hostile streams are refused.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::trees::{build, name, node};
use common::*;
use proptest::prelude::*;
use serde_json::Value;

/// `sessionfs pack ARGS…` with `stdin` on its standard input.
fn pack_stdin(args: &[&std::ffi::OsStr], stdin: &[u8]) -> Run {
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    // Written from a thread: pack may stop reading (and close) early.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    Run {
        code: out.status.code().unwrap_or(-1),
        json: serde_json::from_str(stdout.trim()).unwrap(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `sessionfs pack --workspace-tar IN -o OUT EXTRA…`.
fn pack_tar(input: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "pack".as_ref(),
        "--workspace-tar".as_ref(),
        input.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    run(&args)
}

/// The same with the stream `bytes` on standard input (`--workspace-tar -`).
fn pack_piped(bytes: &[u8], out: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "pack".as_ref(),
        "--workspace-tar".as_ref(),
        "-".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    pack_stdin(&args, bytes)
}

/// A result without what differs between two packs of one tree: where it
/// went, how long it took, what was spooled.
fn comparable(r: &Value) -> Value {
    let mut r = r.clone();
    for k in ["output", "seconds", "spooled_bytes"] {
        r.as_object_mut().unwrap().remove(k);
    }
    r
}

/// Packs `ws` as a directory, as a tar file made by GNU tar (POSIX format:
/// nanosecond mtimes), and as that tar through a pipe; asserts one packet
/// and one report.
fn same_three_ways(ws: &Path, tmp: &Path, extra: &[&str]) -> Value {
    let dir_packet = tmp.join("dir.packet");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "-o".as_ref(),
        dir_packet.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let from_dir = run(&args).ok().clone();
    let tar = tmp.join("ws.tar");
    succeed(
        Command::new("tar")
            .args(["--format=posix", "-C"])
            .arg(ws)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    );
    let tar_packet = tmp.join("tar.packet");
    let from_tar = pack_tar(&tar, &tar_packet, extra).ok().clone();
    assert!(
        from_tar.get("spooled_bytes").is_none(),
        "a tar file is read where it is"
    );
    let pipe_packet = tmp.join("pipe.packet");
    let from_pipe = pack_piped(&fs::read(&tar).unwrap(), &pipe_packet, extra);
    let from_pipe = from_pipe.ok().clone();
    assert!(from_pipe["spooled_bytes"].as_u64().is_some(), "{from_pipe}");
    assert_eq!(comparable(&from_tar), comparable(&from_dir));
    assert_eq!(comparable(&from_pipe), comparable(&from_dir));
    let bytes = fs::read(&dir_packet).unwrap();
    assert!(
        fs::read(&tar_packet).unwrap() == bytes,
        "tar file: another packet"
    );
    assert!(
        fs::read(&pipe_packet).unwrap() == bytes,
        "pipe: another packet"
    );
    from_dir
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// The property tests' trees: the same packet from the directory, its
    /// tar file, and that tar through a pipe.
    #[test]
    fn random_trees_give_the_same_packet_as_a_directory_or_a_tar(
        children in prop::collection::btree_map(name(), node(), 0..8),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        build(&ws, &children);
        same_three_ways(&ws, tmp.path(), &[]);
    }
}

/// What the policy does to a tree, it does to the tar of it: credentials
/// (and their other names), `--exclude`, SQLite side files, special files
/// dropped, an excluded name that is not UTF-8, clamped mtimes, hard links
/// as independent files, external symlinks.
#[test]
fn the_policy_reports_the_same_for_a_tar_as_for_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    write(&ws, ".ssh/id_ed25519", b"key");
    std::fs::hard_link(ws.join(".ssh/id_ed25519"), ws.join("copy-of-key")).unwrap();
    write(&ws, ".env", b"SECRET=1");
    write(&ws, "logs/a.log", b"log");
    write(&ws, "db/state.db", b"db");
    write(&ws, "db/state.db-wal", b"wal");
    write(&ws, "node_modules/x/index.js", b"x");
    std::fs::hard_link(ws.join("src/main.rs"), ws.join("main-again.rs")).unwrap();
    nix::unistd::mkfifo(
        &ws.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::os::unix::fs::symlink("/usr/bin/python3", ws.join("py")).unwrap();
    use std::os::unix::ffi::OsStrExt;
    write(&ws, "junk", b"");
    fs::rename(
        ws.join("junk"),
        ws.join(std::ffi::OsStr::from_bytes(b"caf\xe9.tmp")),
    )
    .unwrap();
    set_mtime(&ws.join("README.md"), -5_000_000_000);
    let r = same_three_ways(
        &ws,
        tmp.path(),
        &[
            "--exclude",
            "*.log",
            "--exclude",
            "workspace/db/state.db",
            "--exclude",
            "caf*",
            "--exclude",
            "node_modules",
        ],
    );
    let excluded = excluded_paths(&r);
    for p in [
        "workspace/.env",
        "workspace/.ssh",
        "workspace/copy-of-key",
        "workspace/logs/a.log",
        "workspace/db/state.db",
        "workspace/db/state.db-wal",
        "workspace/caf\\xe9.tmp",
        "workspace/node_modules",
    ] {
        assert!(excluded.contains(&p), "{p} not in {excluded:?}");
    }
    assert_eq!(r["dropped"][0]["path"], "workspace/pipe");
    assert_eq!(r["external_symlinks"][0]["path"], "workspace/py");
    assert_eq!(r["clamped_mtimes"][0]["path"], "workspace/README.md");
    // A hard link is an independent file, in both.
    let restored = tmp.path().join("restored");
    unpack(
        &tmp.path().join("pipe.packet"),
        &restored,
        &["--part", "workspace"],
    );
    assert_eq!(
        fs::read(restored.join("main-again.rs")).unwrap(),
        fs::read(ws.join("src/main.rs")).unwrap()
    );
}

/// `unpack --tar` then `pack --workspace-tar` gives the workspace back,
/// digest for digest (nanosecond mtimes through PAX records).
#[test]
fn a_stream_unpacked_packs_to_the_same_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let packet = tmp.path().join("s.packet");
    let packed = pack(&ws, &packet, &[]);
    let tar = tmp.path().join("ws.tar");
    run([
        "unpack".as_ref(),
        packet.as_os_str(),
        "--part".as_ref(),
        "workspace".as_ref(),
        "--tar".as_ref(),
        tar.as_os_str(),
    ])
    .ok();
    let r = pack_tar(&tar, &tmp.path().join("again.packet"), &[]);
    assert_eq!(r.ok()["digest"], packed["digest"]);
}

/// Python's tarfile (what the Agents SDK writes its snapshots with) makes
/// microsecond mtimes, so with `--zero-mtimes` the digest is the
/// directory's.
#[test]
fn a_python_tarfile_stream_packs_like_the_directory_with_zero_mtimes() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let tar = tmp.path().join("py.tar");
    python(
        "import sys, tarfile\nwith tarfile.open(sys.argv[2], 'w') as t: t.add(sys.argv[1], arcname='.')",
        &[ws.as_os_str(), tar.as_os_str()],
    );
    let a = pack(&ws, &tmp.path().join("a.packet"), &["--zero-mtimes"]);
    let b = pack_tar(&tar, &tmp.path().join("b.packet"), &["--zero-mtimes"]);
    assert_eq!(b.ok()["digest"], a["digest"]);
}

#[test]
fn a_harness_tar_gets_its_kinds_rules_and_limits_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    model_tree(&ws);
    let home = tmp.path().join("home");
    write(&home, "auth.json", b"{\"token\":1}");
    write(&home, "history.jsonl", b"{}\n");
    let tar = tmp.path().join("home.tar");
    sh(tmp.path(), "tar --format=posix -C home -cf home.tar .");
    let out = tmp.path().join("s.packet");
    let r = run([
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "--harness-tar".as_ref(),
        tar.as_os_str(),
        "--harness-kind".as_ref(),
        "codex".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(excluded_paths(r.ok()).contains(&"harness/auth.json"));
    // Limits count both parts together, as for two directories.
    let r = run([
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "--harness-tar".as_ref(),
        tar.as_os_str(),
        "--harness-kind".as_ref(),
        "codex".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        "--max-entries".as_ref(),
        "8".as_ref(),
    ]);
    r.fails(5, "limit_exceeded");
    // Symlink rules: an absolute target is external, refused on demand.
    let links = tmp.path().join("links");
    fs::create_dir(&links).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", links.join("pw")).unwrap();
    sh(tmp.path(), "tar -C links -cf links.tar .");
    let r = pack_tar(
        &tmp.path().join("links.tar"),
        &out,
        &["--reject-external-symlinks"],
    );
    assert_eq!(r.fails(7, "external_symlink")["path"], "workspace/pw");
    // Both parts from standard input: a usage error.
    let r = run([
        "pack".as_ref(),
        "--workspace-tar".as_ref(),
        "-".as_ref(),
        "--harness-tar".as_ref(),
        "-".as_ref(),
        "--harness-kind".as_ref(),
        "codex".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    r.fails(2, "usage");
}

/// One ustar header block for `name`, of type `ty`, `size` bytes.
fn header(name: &str, ty: u8, size: u64, link: &str) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(tar::EntryType::new(ty));
    h.set_mode(0o644);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.as_mut_bytes()[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A member: header and content, padded.
fn member(name: &str, content: &[u8]) -> Vec<u8> {
    let mut out = header(name, b'0', content.len() as u64, "");
    out.extend_from_slice(content);
    out.resize(out.len().next_multiple_of(512), 0);
    out
}

const END: [u8; 1024] = [0; 1024];

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Hostile and broken streams: each refused with `bad_tar` (exit 7) naming
/// what is wrong, from a file and from a pipe alike, leaving no output.
#[test]
fn hostile_streams_are_refused_with_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = member("./a.txt", b"hello");
    let mut bad_sum = ok.clone();
    bad_sum[0] = b'b';
    let mut pax_huge = header("././@PaxHeader", b'x', 1 << 40, "");
    pax_huge.extend_from_slice(&[b'9'; 512]);
    let gz = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "absolute",
            cat(&[&member("/etc/passwd", b"x"), &END]),
            "absolute name",
        ),
        (
            "dotdot",
            cat(&[&member("a/../../x", b"x"), &END]),
            "absolute name, or one with `..`",
        ),
        (
            "duplicate",
            cat(&[&ok, &member("a.txt", b"other"), &END]),
            "comes twice",
        ),
        (
            "link out",
            cat(&[&header("l", b'1', 0, "../x"), &END]),
            "outside the tree",
        ),
        (
            "link to nothing",
            cat(&[&header("l", b'1', 0, "nothing"), &END]),
            "not a file before it",
        ),
        (
            "beneath a symlink",
            cat(&[&header("s", b'2', 0, "/tmp"), &member("s/x", b"x"), &END]),
            "a symlink",
        ),
        (
            "beneath a file",
            cat(&[&ok, &member("a.txt/x", b"x"), &END]),
            "not a directory",
        ),
        (
            "huge pax header",
            cat(&[&pax_huge, &END]),
            "extension header of 1099511627776 bytes",
        ),
        ("bad checksum", cat(&[&bad_sum, &END]), "checksum is wrong"),
        ("cut inside a member", ok[..600].to_vec(), "cut short"),
        ("no end", ok.clone(), "without its end-of-archive block"),
        (
            "trailing bytes",
            cat(&[&ok, &END, &ok]),
            "bytes after the end",
        ),
        ("gzip", gz.to_vec(), "gzip-compressed"),
        ("empty", Vec::new(), "empty"),
        ("sparse", cat(&[&header("s", b'S', 0, ""), &END]), "sparse"),
        ("not a tar", b"hello, world\n".repeat(100), "not ustar"),
    ];
    for (what, bytes, says) in cases {
        let file = tmp.path().join(format!("{what}.tar"));
        fs::write(&file, &bytes).unwrap();
        let out = tmp.path().join("out.packet");
        let from_file = pack_tar(&file, &out, &[]);
        let e = from_file.fails(7, "bad_tar");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(says), "{what}: {message}");
        assert!(!out.exists(), "{what}");
        let from_pipe = pack_piped(&bytes, &out, &[]);
        from_pipe.fails(7, "bad_tar");
        assert!(!out.exists(), "{what}");
    }
    // A directory is not a stream.
    pack_tar(tmp.path(), &tmp.path().join("x.packet"), &[]).fails(7, "bad_tar");
}

/// A stream of members is bounded in what it keeps: past twice
/// `--max-entries` members (left out ones included) it is refused, and a
/// file larger than the format holds is refused by its header, before a
/// byte of it is read.
#[test]
fn what_a_stream_makes_pack_keep_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let mut many = Vec::new();
    for k in 0..50 {
        many.extend(member(&format!("node_modules/f{k}"), b""));
    }
    many.extend_from_slice(&END);
    let out = tmp.path().join("o.packet");
    let r = pack_piped(
        &many,
        &out,
        &["--exclude", "node_modules", "--max-entries", "20"],
    );
    r.fails(5, "limit_exceeded");
    // With room, the same stream packs, node_modules left out.
    let r = pack_piped(
        &many,
        &out,
        &["--exclude", "node_modules", "--max-entries", "60"],
    );
    assert_eq!(r.ok()["entries"], 1);
    // A header claiming 64 GiB: refused at once, with no content behind it.
    let mut huge = header("big", b'0', 0, "");
    huge[124..136].copy_from_slice(b"\x80\0\0\0\0\0\0\x10\0\0\0\0");
    let mut h = tar::Header::from_byte_slice(&huge).clone();
    h.set_cksum();
    let r = pack_piped(h.as_bytes(), &out, &[]);
    r.fails(7, "format_limit");
    // Content past --max-bytes from a pipe: refused as it is spooled.
    let big = cat(&[&member("big", &vec![7u8; 3 << 20]), &END]);
    let r = pack_piped(&big, &out, &["--max-bytes", "1MiB"]);
    r.fails(5, "limit_exceeded");
}
