//! The format cannot drift silently: a tree built the same way every time
//! must pack to the exact bytes checked in under `tests/golden/`, in each
//! version of the format (`NAME.packet` is the current version,
//! `NAME.v1.packet` `sessionfs.packet/1`).
//!
//! After an intended format change (a new schema version), regenerate with
//! `SESSIONFS_BLESS=1 cargo test --test golden` and review the diff.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::*;

fn golden_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The small golden tree: every entry type, an executable, an empty file,
/// a path and a link target long enough to need PAX records, a name split
/// across ustar's prefix and name fields, non-ASCII and quoted names, and a
/// harness part.
fn small_tree(root: &Path) {
    let ws = root.join("ws");
    let h = root.join("h");
    write(&ws, "README.md", b"golden\n");
    write(&ws, "empty", b"");
    write(&ws, "bin/tool", b"#!/bin/sh\nexit 0\n");
    chmod(&ws.join("bin/tool"), 0o755);
    write(
        &ws,
        "caf\u{e9}/\"quoted\" name.txt",
        b"unicode and quotes\n",
    );
    let split_dir = format!("{}/{}", "p".repeat(80), "q".repeat(60));
    write(
        &ws,
        &format!("{split_dir}/{}", "n".repeat(90)),
        b"split across prefix and name\n",
    );
    let pax_dir = "d".repeat(200);
    write(
        &ws,
        &format!("{pax_dir}/{}", "f".repeat(120)),
        b"needs a PAX path record\n",
    );
    symlink("README.md", ws.join("link")).unwrap();
    symlink(
        format!("{pax_dir}/{}", "f".repeat(120)),
        ws.join("long-link"),
    )
    .unwrap();
    fs::create_dir_all(ws.join("empty-dir")).unwrap();
    write(&h, "history.jsonl", b"{\"turn\":1}\n");
    let mut t = 1_234_567_890_123_456_789i64;
    for rel in [
        "README.md",
        "empty",
        "bin/tool",
        "caf\u{e9}/\"quoted\" name.txt",
    ] {
        set_mtime(&ws.join(rel), t);
        t += 86_400_000_000_001;
    }
    set_mtime(&ws.join(format!("{split_dir}/{}", "n".repeat(90))), 0);
    set_mtime(&ws.join(format!("{pax_dir}/{}", "f".repeat(120))), 1);
    set_mtime(&h.join("history.jsonl"), 4_000_000_000_999_999_999);
}

/// The file names of the golden files of `name` in packet version
/// `version` (`2` or `1`).
fn golden_name(name: &str, version: &str, ext: &str) -> String {
    match version {
        "2" => format!("{name}.{ext}"),
        v => format!("{name}.v{v}.{ext}"),
    }
}

#[test]
fn small_packet_is_byte_exact() {
    for version in ["2", "1"] {
        small_packet_is_byte_exact_in(version);
    }
}

fn small_packet_is_byte_exact_in(version: &str) {
    let tmp = tempfile::tempdir().unwrap();
    small_tree(tmp.path());
    let out = tmp.path().join("small.packet");
    let r = run([
        "pack",
        "--workspace",
        tmp.path().join("ws").to_str().unwrap(),
        "--harness",
        tmp.path().join("h").to_str().unwrap(),
        "--harness-kind",
        "generic",
        "--packet-version",
        version,
        "-o",
        out.to_str().unwrap(),
    ]);
    let v = r.ok();
    let got = fs::read(&out).unwrap();
    let golden = golden_dir().join(golden_name("small", version, "packet"));
    let digest_file = golden_dir().join(golden_name("small", version, "digest"));
    if std::env::var_os("SESSIONFS_BLESS").is_some() {
        fs::write(&golden, &got).unwrap();
        fs::write(&digest_file, format!("{}\n", v["digest"].as_str().unwrap())).unwrap();
    }
    let want =
        fs::read(&golden).expect("tests/golden/small*.packet (bless with SESSIONFS_BLESS=1)");
    assert!(
        got == want,
        "packet bytes drifted from {}; if the format changed on purpose, bump the schema and re-bless",
        golden.display()
    );
    let digest = fs::read_to_string(&digest_file).unwrap();
    assert_eq!(v["digest"].as_str().unwrap(), digest.trim());
    // The checked-in packet verifies and restores on its own.
    run([
        "verify",
        golden.to_str().unwrap(),
        "--digest",
        digest.trim(),
    ])
    .ok();
    // Inspect names the version.
    let i = run(["inspect", golden.to_str().unwrap()]).ok().clone();
    assert_eq!(i["packet_schema"], format!("sessionfs.packet/{version}"));
    assert_eq!(i["packet_version"].to_string(), version);
}

/// A tree with multi-chunk files, pinned by digest and whole-file hash
/// (the packet itself would be too large to check in).
#[test]
fn chunked_packet_is_pinned_by_its_hashes() {
    for version in ["2", "1"] {
        chunked_packet_is_pinned_by_its_hashes_in(version);
    }
}

fn chunked_packet_is_pinned_by_its_hashes_in(version: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..(9 * 1024 * 1024 + 123))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    write(&ws, "big.bin", &data);
    write(&ws, "exactly-one-chunk", &data[..4 * 1024 * 1024]);
    set_mtime(&ws.join("big.bin"), 1_700_000_000_000_000_000);
    set_mtime(&ws.join("exactly-one-chunk"), 1_700_000_000_000_000_000);
    let out = tmp.path().join("chunked.packet");
    let v = pack(&ws, &out, &["--file-sha256", "--packet-version", version]);
    let line = format!(
        "{} {}\n",
        v["digest"].as_str().unwrap(),
        v["file_sha256"].as_str().unwrap()
    );
    let golden = golden_dir().join(golden_name("chunked", version, "hashes"));
    if std::env::var_os("SESSIONFS_BLESS").is_some() {
        fs::write(&golden, &line).unwrap();
    }
    assert_eq!(line, fs::read_to_string(&golden).unwrap());
    let bytes = fs::read(&out).unwrap();
    let len = tar::Header::from_byte_slice(&bytes[..512])
        .entry_size()
        .unwrap() as usize;
    let manifest = String::from_utf8(bytes[512..512 + len].to_vec()).unwrap();
    assert_eq!(
        manifest.matches("\"chunks\"").count(),
        1,
        "only the file over one chunk carries chunks"
    );
    // Beside them, its whole-file hash in `/1` only.
    assert_eq!(
        manifest.matches("\"sha256\"").count(),
        if version == "1" { 2 } else { 1 },
        "{manifest}"
    );
}
