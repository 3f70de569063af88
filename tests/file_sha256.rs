//! `file_sha256`, the SHA-256 of the whole packet file: given by `pack`
//! and `seal` only with `--file-sha256` (docs/CLI.md), and then the hash
//! of the file's bytes. Offline, so without FUSE.

mod common;

use std::path::Path;

use common::*;
use sessionfs::api::Sha256;

fn sha256_of(path: &Path) -> String {
    Sha256::of(&std::fs::read(path).unwrap()).to_string()
}

#[test]
fn pack_gives_file_sha256_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let plain = tmp.path().join("plain.packet");
    let v = pack(&ws, &plain, &[]);
    assert_eq!(v["schema"], "sessionfs.pack-result/2");
    assert!(v.get("file_sha256").is_none(), "{v}");
    let hashed = tmp.path().join("hashed.packet");
    let w = pack(&ws, &hashed, &["--file-sha256"]);
    assert_eq!(w["file_sha256"], sha256_of(&hashed), "{w}");
    assert_eq!(w["digest"], v["digest"]);
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&hashed).unwrap()
    );
}

#[test]
fn an_offline_seal_gives_file_sha256_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let packet = sample_packet(tmp.path());
    let upper = tmp.path().join("upper");
    // An upper directory as a mount leaves it, made in-process.
    drop(overlay_of(&packet, &upper));
    let seal = |out: &Path, extra: &[&str]| seal_offline(&packet, &upper, out, extra).ok().clone();
    let plain = tmp.path().join("plain.packet");
    let v = seal(&plain, &[]);
    assert_eq!(v["schema"], "sessionfs.seal-result/2");
    assert!(v.get("file_sha256").is_none(), "{v}");
    let hashed = tmp.path().join("hashed.packet");
    let w = seal(&hashed, &["--file-sha256"]);
    assert_eq!(w["file_sha256"], sha256_of(&hashed), "{w}");
    assert_eq!(w["digest"], v["digest"]);
}
