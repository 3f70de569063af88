//! `-o 'dir/{digest}.packet'` of pack and seal (issue 35): named by the
//! packet's digest, written once; the packet already there is verified and
//! not written again (`already_there`); anything else there is refused and
//! left as it is.

mod common;

use common::s3;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

/// A file `name` holding `bytes` made in the upper directory `upper` of
/// `packet`'s workspace, as a mount would (in process, no kernel).
fn add_file(packet: &Path, upper: &Path, name: &str, bytes: &[u8]) {
    let o = overlay_of(packet, upper);
    let me = sessionfs::api::Caller { uid: 0, gid: 0 };
    let f = o
        .create(sessionfs::api::ROOT, name.as_bytes(), 0o644, me)
        .unwrap();
    o.write(f.ino, 0, bytes).unwrap();
}

fn digest_file(dir: &Path, digest: &str) -> std::path::PathBuf {
    dir.join(format!("{}.packet", digest.replacen(':', "-", 1)))
}

#[test]
fn pack_names_the_packet_by_its_digest_and_writes_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    let template = out.join("{digest}.packet");
    let first = pack(&ws, &template, &[]);
    let digest = first["digest"].as_str().unwrap();
    let placed = digest_file(&out, digest);
    assert_eq!(first["output"], placed.to_str().unwrap());
    assert!(first.get("already_there").is_none(), "{first}");
    run([
        "verify".as_ref(),
        placed.as_os_str(),
        "--digest".as_ref(),
        digest.as_ref(),
    ])
    .ok();
    let before = fs::metadata(&placed).unwrap();

    // Again: the same packet, verified there, not written.
    let second = pack(&ws, &template, &["--file-sha256"]);
    assert_eq!(second["already_there"], true);
    assert_eq!(second["output"], first["output"]);
    assert_eq!(second["packet_bytes"], first["packet_bytes"]);
    let verified = run(["verify".as_ref(), placed.as_os_str()]);
    assert_eq!(second["file_sha256"], verified.ok()["file_sha256"]);
    let after = fs::metadata(&placed).unwrap();
    assert_eq!(
        (before.ino(), before.mtime(), before.mtime_nsec()),
        (after.ino(), after.mtime(), after.mtime_nsec())
    );
    assert_eq!(names_in(&out, |_| true).len(), 1, "no temporary file left");

    // A changed tree: another name beside it.
    write(&ws, "new.txt", b"new");
    let third = pack(&ws, &template, &[]);
    assert_ne!(third["digest"], first["digest"]);
    assert!(digest_file(&out, third["digest"].as_str().unwrap()).exists());

    // A damaged file at the name: refused, left as it is.
    fs::remove_file(ws.join("new.txt")).unwrap();
    let mut bytes = fs::read(&placed).unwrap();
    let at = bytes.len() - 2000;
    bytes[at] ^= 1;
    fs::write(&placed, &bytes).unwrap();
    let r = run([
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "-o".as_ref(),
        template.as_os_str(),
    ]);
    let e = r.fails(7, "target_unusable");
    assert!(
        e["message"].as_str().unwrap().contains("does not hold it"),
        "{e}"
    );
    assert_eq!(fs::read(&placed).unwrap(), bytes);
}

#[test]
fn a_placeholder_outside_a_file_name_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    model_tree(&ws);
    let out = tmp.path().join("{digest}/x.packet");
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    r.fails(2, "usage");
}

/// An object key named by the digest: the digest is known after the
/// hashing pass, before a byte is written, so the upload starts under its
/// name; one pack, no staging key. Again: `already_there`, nothing
/// uploaded. An offline seal likewise, its trace beside it.
#[test]
fn an_object_key_is_named_by_the_digest_in_one_pack() {
    let (tmp, moto, bucket) = s3::setup();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let key = format!("s3://{bucket}/sessions/{{digest}}.packet");
    let first = s3::remote(
        moto.port,
        &["pack", "--workspace", ws.to_str().unwrap(), "-o", &key],
        &[],
    );
    let first = first.ok().clone();
    let digest = first["digest"].as_str().unwrap().replacen(':', "-", 1);
    let named = format!("sessions/{digest}.packet");
    assert_eq!(first["output"], format!("s3://{bucket}/{named}"));
    assert!(first.get("already_there").is_none(), "{first}");
    let object = moto
        .get(&bucket, &named)
        .expect("the object under its digest");
    assert_eq!(object.len() as u64, first["packet_bytes"].as_u64().unwrap());
    let local = tmp.path().join("local.packet");
    pack(&ws, &local, &[]);
    assert!(
        fs::read(&local).unwrap() == object,
        "byte for byte what -o FILE writes"
    );
    moto.assert_no_uploads(&bucket);

    let again = s3::remote(
        moto.port,
        &["pack", "--workspace", ws.to_str().unwrap(), "-o", &key],
        &[],
    );
    assert_eq!(again.ok()["already_there"], true);
    assert_eq!(again.json["output"], first["output"]);

    // An offline seal of a change, named by its digest in the same prefix.
    let upper = tmp.path().join("upper");
    add_file(&local, &upper, "turn.txt", b"turn");
    let sealed = s3::remote(
        moto.port,
        &[
            "seal",
            "--packet",
            local.to_str().unwrap(),
            "--upper",
            upper.to_str().unwrap(),
            "-o",
            &key,
        ],
        &[],
    );
    let sealed = sealed.ok().clone();
    let d2 = sealed["digest"].as_str().unwrap().replacen(':', "-", 1);
    assert_ne!(d2, digest);
    assert_eq!(
        sealed["output"],
        format!("s3://{bucket}/sessions/{d2}.packet")
    );
    assert!(
        moto.get(&bucket, &format!("sessions/{d2}.packet"))
            .is_some()
    );
}

#[test]
fn seal_names_the_packet_by_its_digest_and_the_receipt_says_where() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    model_tree(&ws);
    let packet = tmp.path().join("base.packet");
    let packed = pack(&ws, &packet, &[]);
    let upper = tmp.path().join("upper");
    add_file(&packet, &upper, "added.txt", b"turn one");
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    let template = out.join("{digest}.packet");
    let receipt = tmp.path().join("r.json");
    let first = seal_offline(
        &packet,
        &upper,
        &template,
        &["--receipt", receipt.to_str().unwrap()],
    );
    let first = first.ok().clone();
    let digest = first["digest"].as_str().unwrap();
    assert_ne!(first["digest"], packed["digest"]);
    let placed = digest_file(&out, digest);
    assert_eq!(first["output"], placed.to_str().unwrap());
    let r: serde_json::Value = serde_json::from_slice(&fs::read(&receipt).unwrap()).unwrap();
    assert_eq!(r["output"], placed.to_str().unwrap());
    // The same state again: already there.
    let second = seal_offline(&packet, &upper, &template, &[]);
    assert_eq!(second.ok()["already_there"], true);
    assert_eq!(second.json["digest"], first["digest"]);
    assert_eq!(names_in(&out, |n| n.ends_with(".packet")).len(), 1);
}
