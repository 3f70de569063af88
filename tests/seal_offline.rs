//! Seal, receipt and rebase without FUSE: the changes made through the
//! in-process `Overlay` API (what the FUSE adapter calls), sealed in
//! process or by `seal --packet --upper`. The kernel decides what reaches
//! the overlay; what a seal makes of it is decided here, so these run on
//! any machine (tests/seal.rs keeps what needs a real mount).

mod common;

use std::fs;
use std::path::PathBuf;

use common::*;
use serde_json::{Value, json};
use sessionfs::api::SealOutcome;
use sessionfs::api::{Caller, Error, Overlay, ROOT, SetAttr, SetTime};

const ME: Caller = Caller { uid: 0, gid: 0 };

/// A packet of [`sample_tree`] (mtimes zeroed, so a pack of the merged
/// tree on disk is comparable byte for byte) and an upper directory for it.
struct Session {
    tmp: tempfile::TempDir,
    packet: PathBuf,
    upper: PathBuf,
}

impl Session {
    fn new() -> Session {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        sample_tree(&ws);
        let packet = packet_of(&ws, tmp.path(), "p", &["--zero-mtimes"]);
        let upper = tmp.path().join("upper");
        Session { tmp, packet, upper }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    fn overlay(&self) -> Overlay {
        overlay_of(&self.packet, &self.upper)
    }

    /// Seals `o` in process into `name`, with `--zero-mtimes` and the
    /// other defaults of `sessionfs seal`.
    fn seal(&self, o: &Overlay, name: &str, rebase: bool) -> SealOutcome {
        let mut opts = seal_options(self.path(name), None);
        opts.zero_mtimes = true;
        opts.rebase = rebase;
        o.seal(&opts, &|_| {}).unwrap()
    }
}

fn ino(o: &Overlay, path: &str) -> u64 {
    path.split('/').fold(ROOT, |dir, name| {
        o.lookup(dir, name.as_bytes()).unwrap().ino
    })
}

fn write_new(o: &Overlay, dir: u64, name: &str, data: &[u8]) -> u64 {
    let f = o.create(dir, name.as_bytes(), 0o644, ME).unwrap().ino;
    o.write(f, 0, data).unwrap();
    f
}

/// The receipt's changes, as JSON, in the seal's order.
fn changes(out: &SealOutcome) -> Vec<Value> {
    serde_json::to_value(&out.changes)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// `(op, path)` of each change (a rename as `from -> to`).
fn ops(out: &SealOutcome) -> Vec<(String, String)> {
    changes(out)
        .iter()
        .map(|c| {
            let op = c["op"].as_str().unwrap().to_owned();
            let path = match (&c["path"], &c["from"], &c["to"]) {
                (Value::String(p), _, _) => p.clone(),
                (_, Value::String(f), Value::String(t)) => format!("{f} -> {t}"),
                _ => panic!("{c}"),
            };
            (op, path)
        })
        .collect()
}

#[test]
fn an_in_process_seal_is_the_pack_of_the_merged_tree() {
    let s = Session::new();
    let o = s.overlay();
    write_new(&o, ROOT, "new.txt", b"new\n");
    o.write(ino(&o, "README.md"), 0, b"# edited").unwrap();
    o.unlink(ino(&o, "bin"), b"run.sh").unwrap();
    o.rename(ROOT, b"src", ROOT, b"source", false, false)
        .unwrap();
    let d = o.mkdir(ROOT, b"made", 0o755, ME).unwrap().ino;
    o.symlink(d, b"to-readme", b"../README.md", ME).unwrap();
    let sealed = s.seal(&o, "sealed.packet", false);
    // The same tree on disk, packed.
    let ws = s.path("ws");
    write(&ws, "new.txt", b"new\n");
    let mut readme = fs::read(ws.join("README.md")).unwrap();
    readme[..8].copy_from_slice(b"# edited");
    fs::write(ws.join("README.md"), readme).unwrap();
    fs::remove_file(ws.join("bin/run.sh")).unwrap();
    fs::rename(ws.join("src"), ws.join("source")).unwrap();
    fs::create_dir(ws.join("made")).unwrap();
    std::os::unix::fs::symlink("../README.md", ws.join("made/to-readme")).unwrap();
    let want = packet_of(&ws, s.tmp.path(), "want", &["--zero-mtimes"]);
    assert!(
        fs::read(s.path("sealed.packet")).unwrap() == fs::read(&want).unwrap(),
        "the seal differs from pack of the merged tree"
    );
    assert_eq!(
        sealed.digest.to_string(),
        pack(&ws, &s.path("again.packet"), &["--zero-mtimes"])["digest"]
    );
}

#[test]
fn the_receipt_names_every_change_with_its_hashes() {
    let s = Session::new();
    let o = s.overlay();
    write_new(&o, ROOT, "added.txt", b"added");
    o.write(ino(&o, "README.md"), 0, b"X").unwrap();
    o.unlink(ROOT, b"empty").unwrap();
    o.rename(ino(&o, "src"), b"main.rs", ROOT, b"main.rs", false, false)
        .unwrap();
    let out = s.seal(&o, "s.packet", false);
    let c = changes(&out);
    let find = |op: &str| c.iter().find(|x| x["op"] == op).unwrap().clone();
    let added = find("added");
    assert_eq!(added["path"], "workspace/added.txt");
    assert_eq!(added["type"], "file");
    assert_eq!(added["sha256"], sha256_hex(b"added"));
    let modified = find("modified");
    assert_eq!(modified["path"], "workspace/README.md");
    assert_eq!(modified["old_sha256"], sha256_hex(b"# sample\n"));
    assert_eq!(modified["new_sha256"], sha256_hex(b"X sample\n"));
    let deleted = find("deleted");
    assert_eq!(deleted["path"], "workspace/empty");
    assert_eq!(deleted["old_sha256"], sha256_hex(b""));
    let renamed = find("renamed");
    assert_eq!(
        (&renamed["from"], &renamed["to"]),
        (&json!("workspace/src/main.rs"), &json!("workspace/main.rs"))
    );
    assert_eq!(renamed["old_sha256"], renamed["new_sha256"]);
    assert_eq!(
        (out.added, out.modified, out.deleted, out.renamed),
        (1, 1, 1, 1),
        "{c:?}"
    );
}

fn sha256_hex(b: &[u8]) -> String {
    sessionfs::api::Sha256::of(b).to_string()
}

#[test]
fn a_write_of_the_same_bytes_is_no_change() {
    let s = Session::new();
    let o = s.overlay();
    // Copied up, rewritten with what it held: the content is the same.
    o.write(ino(&o, "README.md"), 0, b"# sample\n").unwrap();
    let out = s.seal(&o, "s.packet", false);
    assert_eq!(ops(&out), Vec::<(String, String)>::new());
    assert_eq!(
        fs::read(s.path("s.packet")).unwrap(),
        fs::read(&s.packet).unwrap(),
        "the packet it was mounted from"
    );
}

#[test]
fn a_moved_directory_is_added_and_deleted_and_its_files_renamed() {
    let s = Session::new();
    let o = s.overlay();
    o.rename(ROOT, b"bin", ROOT, b"tools", false, false)
        .unwrap();
    let out = s.seal(&o, "s.packet", false);
    let mut got = ops(&out);
    got.sort();
    let want: Vec<(String, String)> = [
        ("added", "workspace/tools"),
        ("deleted", "workspace/bin"),
        ("renamed", "workspace/bin/run.sh -> workspace/tools/run.sh"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
    assert_eq!(
        (out.added, out.deleted, out.renamed),
        (1, 1, 1),
        "{:?}",
        ops(&out)
    );
}

#[test]
fn a_hard_link_made_on_the_mount_is_added_and_the_file_not_renamed() {
    let s = Session::new();
    let o = s.overlay();
    o.link(ino(&o, "README.md"), ROOT, b"again.md").unwrap();
    let out = s.seal(&o, "s.packet", false);
    assert_eq!(
        ops(&out),
        [("added".to_owned(), "workspace/again.md".to_owned())]
    );
}

#[test]
fn mode_mtime_and_target_changes_are_modifications() {
    let s = Session::new();
    let o = s.overlay();
    let readme = ino(&o, "README.md");
    o.setattr(
        readme,
        SetAttr {
            mode: Some(0o755),
            ..Default::default()
        },
    )
    .unwrap();
    o.setattr(
        ino(&o, "src/main.rs"),
        SetAttr {
            mtime: Some(SetTime::At(1_000_000_000)),
            ..Default::default()
        },
    )
    .unwrap();
    o.unlink(ROOT, b"link").unwrap();
    o.symlink(ROOT, b"link", b"README.md", ME).unwrap();
    let mut opts = seal_options(s.path("s.packet"), None);
    // Mtimes recorded: the mtime change shows.
    opts.zero_mtimes = false;
    let out = o.seal(&opts, &|_| {}).unwrap();
    let mut got = ops(&out);
    got.sort();
    assert_eq!(
        got,
        [
            ("modified".to_owned(), "workspace/README.md".to_owned()),
            ("modified".to_owned(), "workspace/link".to_owned()),
            ("modified".to_owned(), "workspace/src/main.rs".to_owned()),
        ]
    );
}

#[test]
fn a_credential_written_on_the_mount_is_left_out_of_the_seal() {
    let s = Session::new();
    let o = s.overlay();
    write_new(&o, ROOT, ".env", b"TOKEN=x\n");
    let out = s.seal(&o, "s.packet", false);
    assert_eq!(ops(&out), Vec::<(String, String)>::new());
    let v = serde_json::to_value(&out).unwrap();
    assert_eq!(v["excluded"][0]["path"], "workspace/.env", "{v}");
    assert_eq!(v["excluded"][0]["reason"]["rule"], "credential", "{v}");
}

#[test]
fn a_rebase_moves_the_overlay_onto_the_new_packet_with_an_empty_journal() {
    let s = Session::new();
    let o = s.overlay();
    write_new(&o, ROOT, "turn1.txt", b"one");
    let moved = ino(&o, "README.md");
    o.rename(ROOT, b"README.md", ROOT, b"README.txt", false, false)
        .unwrap();
    let out = s.seal(&o, "turn1.packet", true);
    assert_eq!(o.lower().packet.digest, out.digest);
    // The journal holds one record: the rebase.
    let journal = fs::read_to_string(s.upper.join("journal")).unwrap();
    assert_eq!(journal.lines().count(), 1, "{journal}");
    assert!(journal.starts_with(r#"{"op":"rebase""#), "{journal}");
    // A renamed file keeps its inode number across the rebase.
    assert_eq!(ino(&o, "README.txt"), moved);
    // The next seal costs what changed since: nothing yet.
    let next = s.seal(&o, "turn2.packet", false);
    assert_eq!(next.parent, out.digest);
    assert_eq!(ops(&next), Vec::<(String, String)>::new());
    assert_eq!(
        fs::read(s.path("turn2.packet")).unwrap(),
        fs::read(s.path("turn1.packet")).unwrap()
    );
    drop(o);
    // The upper directory now belongs to the new packet, not the old one.
    let again = overlay_of(&s.path("turn1.packet"), &s.upper);
    assert_eq!(ino(&again, "README.txt"), moved);
    drop(again);
    let old = sessionfs::api::Overlay::mount(
        sessionfs::api::Packet::open(&s.packet, &sessionfs::api::Limits::DEFAULT).unwrap(),
        &s.upper,
        sessionfs::api::Options {
            uid: 0,
            gid: 0,
            part: Some(sessionfs::api::Part::Workspace),
        },
    );
    assert!(matches!(old, Err(Error::UpperMismatch { .. })));
}

#[test]
fn an_offline_seal_writes_the_bytes_an_in_process_seal_does() {
    let s = Session::new();
    let o = s.overlay();
    write_new(&o, ROOT, "new.txt", b"new");
    o.unlink(ROOT, b"empty").unwrap();
    let inproc = s.seal(&o, "inproc.packet", false);
    drop(o);
    let out = s.path("offline.packet");
    let receipt = s.path("r.json");
    let v = seal_offline(
        &s.packet,
        &s.upper,
        &out,
        &["--zero-mtimes", "--receipt", receipt.to_str().unwrap()],
    );
    let v = v.ok();
    assert_eq!(v["digest"], inproc.digest.to_string());
    assert_eq!(
        fs::read(&out).unwrap(),
        fs::read(s.path("inproc.packet")).unwrap()
    );
    let r: Value = serde_json::from_slice(&fs::read(&receipt).unwrap()).unwrap();
    assert_eq!(r["schema"], "sessionfs.receipt/1");
    assert_eq!(r["changes"], json!(changes(&inproc)));
}

#[test]
fn an_offline_seal_refuses_an_upper_directory_in_use() {
    let s = Session::new();
    let o = s.overlay();
    let out = s.path("s.packet");
    seal_offline(&s.packet, &s.upper, &out, &[]).fails(7, "upper_refused");
    assert!(!out.exists());
    drop(o);
    seal_offline(&s.packet, &s.upper, &out, &[]).ok();
}

#[test]
fn an_offline_seal_refuses_an_upper_directory_of_another_packet() {
    let s = Session::new();
    drop(s.overlay());
    let ws = s.path("other");
    write(&ws, "x", b"x");
    let other = packet_of(&ws, s.tmp.path(), "other", &[]);
    let out = s.path("s.packet");
    seal_offline(&other, &s.upper, &out, &[]).fails(7, "upper_mismatch");
    assert!(!out.exists());
}

#[test]
fn an_offline_seal_refuses_a_directory_that_is_no_upper_directory() {
    let s = Session::new();
    let plain = s.path("plain");
    fs::create_dir(&plain).unwrap();
    let out = s.path("s.packet");
    let e = seal_offline(&s.packet, &plain, &out, &[]);
    e.fails(7, "upper_refused");
    assert!(!out.exists());
    assert_eq!(
        names_in(&plain, |_| true),
        Vec::<String>::new(),
        "nothing made in it"
    );
}

/// "seal writes the version it is asked for whatever its parent's, so
/// seal == pack holds in each version" (packet-format.md §8): a file with
/// chunks kept from a parent of either version, sealed in either.
#[test]
fn a_seal_writes_the_version_asked_whatever_its_parents() {
    use sessionfs::api::Version;
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let big: Vec<u8> = (0..(9u32 << 20) + 7).map(|i| (i % 253) as u8).collect();
    write(&ws, "big.bin", &big);
    for (parent, asked) in [("1", "2"), ("2", "1"), ("2", "2"), ("1", "1")] {
        let name = format!("p{parent}-{asked}");
        let packet = packet_of(
            &ws,
            tmp.path(),
            &format!("{name}-parent"),
            &["--zero-mtimes", "--packet-version", parent],
        );
        let o = overlay_of(&packet, &tmp.path().join(format!("{name}-upper")));
        o.write(ino(&o, "README.md"), 0, b"X").unwrap();
        let mut opts = seal_options(tmp.path().join(format!("{name}.packet")), None);
        opts.zero_mtimes = true;
        opts.version = if asked == "1" {
            Version::V1
        } else {
            Version::V2
        };
        let sealed = o.seal(&opts, &|_| {}).unwrap();
        // Only the README changed: the file with chunks is not modified,
        // whatever the two versions make of its id.
        assert_eq!(
            ops(&sealed),
            vec![("modified".to_string(), "README.md".to_string())]
                .into_iter()
                .map(|(op, p)| (op, format!("workspace/{p}")))
                .collect::<Vec<_>>(),
            "{name}"
        );
        let merged = tmp.path().join(format!("{name}-ws"));
        succeed(
            std::process::Command::new("cp")
                .arg("-a")
                .arg(&ws)
                .arg(&merged),
        );
        let mut readme = fs::read(merged.join("README.md")).unwrap();
        readme[0] = b'X';
        fs::write(merged.join("README.md"), readme).unwrap();
        let want = packet_of(
            &merged,
            tmp.path(),
            &format!("{name}-want"),
            &["--zero-mtimes", "--packet-version", asked],
        );
        assert!(
            fs::read(tmp.path().join(format!("{name}.packet"))).unwrap()
                == fs::read(&want).unwrap(),
            "{name}: the seal differs from pack of the merged tree"
        );
        let i = run(["inspect", want.to_str().unwrap()]).ok().clone();
        assert_eq!(i["packet_schema"], format!("sessionfs.packet/{asked}"));
    }
}
