//! `seal`: equivalence with `pack` of the merged view, atomicity under
//! SIGKILL, cost proportional to the change, receipts, exclusions, bad
//! states, concurrency with writers, and `--rebase`.

mod common;

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::ops::{apply, op};
use common::*;
use proptest::prelude::*;
use serde_json::Value;

fn seal(m: &Mounted, out: &Path, extra: &[&str]) -> Value {
    m.seal(out, extra)
}

/// Makes `path` (with `make`), removes it and makes it again until it has
/// the number it had first, which is free again once the kernel has
/// forgotten the removed entry (a `FORGET` of the kernel's own time):
/// the entry then has that number under its next generation. Returns the
/// number.
#[track_caller]
fn made_again(
    path: &Path,
    make: impl Fn(&Path) -> std::io::Result<()>,
    remove: impl Fn(&Path) -> std::io::Result<()>,
) -> u64 {
    make(path).unwrap();
    let first = fs::metadata(path).unwrap().ino();
    wait_for("a removed entry's number to be handed out again", || {
        remove(path).unwrap();
        make(path).unwrap();
        fs::metadata(path).unwrap().ino() == first
    });
    first
}

/// `ls -la` of `paths`, which has the kernel send `READDIRPLUS` (entries
/// with their numbers and generations) for the directories.
#[track_caller]
fn list_long(paths: &[&Path]) {
    let ls = std::process::Command::new("ls")
        .arg("-la")
        .args(paths)
        .output()
        .unwrap();
    assert!(ls.status.success(), "{ls:?}");
}

/// Copies the mount's file mtimes onto the model, so both record the same.
fn copy_mtimes(from: &Path, to: &Path) {
    for (rel, desc) in snapshot(to) {
        if desc.starts_with("file") {
            let m = fs::metadata(from.join(&rel)).unwrap();
            set_mtime(&to.join(&rel), m.mtime() * 1_000_000_000 + m.mtime_nsec());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// "The sealed packet is byte-identical to sessionfs pack run on an
    /// extracted copy of the merged view" (and the offline seal to the
    /// daemon's).
    #[test]
    fn seal_equals_pack_of_the_merged_view(ops in prop::collection::vec(op(), 1..30)) {
        if !fuse_available() {
            return Ok(());
        }
        let tmp = tempfile::tempdir().unwrap();
        let (packet, model) = model_packet(tmp.path());
        let m = Mounted::new(&packet, &tmp.path().join("mnt"), &tmp.path().join("upper"), &["--part", "workspace"]);
        for op in &ops {
            prop_assert_eq!(apply(&m.mnt, op), apply(&model, op));
        }
        let z_seal = tmp.path().join("z-seal.packet");
        let z_pack = tmp.path().join("z-pack.packet");
        // (`app.db` and its side files: an exclusion acting on them.)
        let exclude = ["--exclude", "workspace/app.db"];
        let a = seal(&m, &z_seal, &["--zero-mtimes", exclude[0], exclude[1]]);
        let b = pack(&model, &z_pack, &["--zero-mtimes", exclude[0], exclude[1]]);
        prop_assert_eq!(&a["excluded"], &b["excluded"]);
        prop_assert_eq!(&a["dropped"], &b["dropped"]);
        prop_assert_eq!(&a["external_symlinks"], &b["external_symlinks"]);
        prop_assert_eq!(&a["digest"], &b["digest"]);
        prop_assert!(fs::read(&z_seal).unwrap() == fs::read(&z_pack).unwrap(), "same digest, different bytes");
        // With mtimes: the mount's, copied onto the model.
        copy_mtimes(&m.mnt, &model);
        let t_seal = tmp.path().join("t-seal.packet");
        let t_pack = tmp.path().join("t-pack.packet");
        let a = seal(&m, &t_seal, &exclude);
        let b = pack(&model, &t_pack, &exclude);
        prop_assert_eq!(&a["digest"], &b["digest"]);
        m.umount();
        // Offline, from the same packet and upper directory.
        let off = tmp.path().join("offline.packet");
        run(["seal", "--packet", packet.to_str().unwrap(), "--upper", tmp.path().join("upper").to_str().unwrap(), "-o", off.to_str().unwrap(), exclude[0], exclude[1]]).ok();
        prop_assert!(fs::read(&off).unwrap() == fs::read(&t_seal).unwrap(), "the offline seal differs from the daemon's");
        run(["verify", t_seal.to_str().unwrap()]).ok();
    }
}

/// A directory moved on the mount is reported as its new path added and
/// its old one deleted (its files as renamed); another name of a file
/// (a hard link) is added, the file itself not renamed.
#[test]
fn receipts_report_moved_directories_and_new_links() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    fs::hard_link(m.path("src/main.rs"), m.path("a-link.rs")).unwrap();
    fs::rename(m.path("src/lib"), m.path("src/lib2")).unwrap();
    let out = tmp.path().join("s.packet");
    let receipt = tmp.path().join("receipt.json");
    let v = seal(&m, &out, &["--receipt", receipt.to_str().unwrap()]);
    let r: Value = serde_json::from_slice(&fs::read(&receipt).unwrap()).unwrap();
    let changes: Vec<(String, String)> = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let path = match c["op"].as_str().unwrap() {
                "renamed" => format!("{} -> {}", c["from"], c["to"]),
                _ => c["path"].to_string(),
            };
            (c["op"].as_str().unwrap().to_owned(), path.replace('"', ""))
        })
        .collect();
    let want = [
        ("added", "workspace/a-link.rs"),
        ("deleted", "workspace/src/lib"),
        ("added", "workspace/src/lib2"),
        (
            "renamed",
            "workspace/src/lib/mod.rs -> workspace/src/lib2/mod.rs",
        ),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(op, p)| (op.to_string(), p.to_string()))
        .collect();
    assert_eq!(changes, want, "{r}");
    assert_eq!(
        (
            v["added"].as_u64(),
            v["deleted"].as_u64(),
            v["renamed"].as_u64(),
            v["modified"].as_u64()
        ),
        (Some(2), Some(1), Some(1), Some(0)),
        "{v}"
    );
    m.umount();
}

#[test]
fn renames_are_cheap_and_editor_saves_leave_no_trace() {
    // "a file renamed on the mount keeps its digest and its bytes are
    // copied, not re-hashed; a rename that replaces a file through a
    // temporary name (sed -i, editors) leaves no trace of the temporary name".
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    fs::rename(m.path("data/big.bin"), m.path("moved.bin")).unwrap();
    let st = std::process::Command::new("sed")
        .args(["-i", "s/sample/edited/"])
        .arg(m.path("README.md"))
        .status()
        .unwrap();
    assert!(st.success());
    fs::remove_file(m.path("bin/run.sh")).unwrap();
    let out = tmp.path().join("s.packet");
    let receipt = tmp.path().join("receipt.json");
    let v = seal(&m, &out, &["--receipt", receipt.to_str().unwrap()]);
    assert_eq!(
        (
            v["renamed"].as_u64(),
            v["modified"].as_u64(),
            v["added"].as_u64(),
            v["deleted"].as_u64()
        ),
        (Some(1), Some(1), Some(0), Some(1)),
        "{v}"
    );
    // Files whose hashes were kept: src/main.rs, src/lib/mod.rs, empty, and
    // the renamed big file (not the edited README, nor directories).
    assert_eq!(v["reused"], 4, "{v}");
    let manifest_bytes = tar::Header::from_byte_slice(&fs::read(&out).unwrap()[..512])
        .entry_size()
        .unwrap();
    let hashed = v["bytes_hashed"].as_u64().unwrap();
    assert!(
        hashed <= manifest_bytes + 64,
        "hashed {hashed} bytes for a rename and a 16-byte edit"
    );
    assert!(v["bytes_copied"].as_u64().unwrap() >= 4 * 1024 * 1024);
    let listing = tar_listing(&out);
    assert!(
        !listing.contains("sed"),
        "a temporary name leaked: {listing}"
    );
    let r: Value = serde_json::from_slice(&fs::read(&receipt).unwrap()).unwrap();
    assert_eq!(r["schema"], "sessionfs.receipt/1");
    assert_eq!(r["parent"], m.result["digest"]);
    assert_eq!(r["digest"], v["digest"]);
    let changes = r["changes"].as_array().unwrap();
    // Sorted by path, a rename by its new one.
    let order: Vec<&str> = changes
        .iter()
        .map(|c| c["path"].as_str().or(c["to"].as_str()).unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "workspace/README.md",
            "workspace/bin/run.sh",
            "workspace/moved.bin"
        ]
    );
    let renamed = changes.iter().find(|c| c["op"] == "renamed").unwrap();
    assert_eq!(
        (&renamed["from"], &renamed["to"]),
        (
            &Value::from("workspace/data/big.bin"),
            &Value::from("workspace/moved.bin")
        )
    );
    assert_eq!(renamed["old_sha256"], renamed["new_sha256"]);
    let modified = changes.iter().find(|c| c["op"] == "modified").unwrap();
    assert_eq!(modified["path"], "workspace/README.md");
    assert_ne!(modified["old_sha256"], modified["new_sha256"]);
    m.umount();
}

#[test]
fn macos_litter_written_on_the_mount_is_excluded_unless_kept() {
    // CLI.md: Finder and Spotlight litter is "excluded by default by `pack`
    // and `seal`", and `--keep` keeps one knowingly.
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let m = mount_workspace(&packet, tmp.path());
    fs::write(m.path(".DS_Store"), b"Bud1").unwrap();
    fs::write(m.path("._README.md"), b"AppleDouble").unwrap();
    fs::create_dir(m.path(".Spotlight-V100")).unwrap();
    fs::write(m.path(".Spotlight-V100/x"), b"index").unwrap();
    let out = tmp.path().join("s.packet");
    let v = seal(&m, &out, &[]);
    assert_eq!(
        excluded_paths(&v),
        [
            "workspace/.DS_Store",
            "workspace/.Spotlight-V100",
            "workspace/._README.md"
        ],
        "{v}"
    );
    assert_eq!(v["excluded"][0]["reason"]["rule"], "macos_metadata");
    let listing = tar_listing(&out);
    assert!(!listing.contains(".DS_Store") && !listing.contains("Spotlight"));
    assert!(!listing.contains("._README.md"));
    let kept = tmp.path().join("k.packet");
    let v = seal(&m, &kept, &["--keep", ".DS_Store"]);
    assert_eq!(excluded_paths(&v).len(), 2, "{v}");
    assert!(
        tar_listing(&kept)
            .lines()
            .any(|l| l == "workspace/.DS_Store")
    );
    m.umount();
}

#[test]
fn credentials_written_on_the_mount_are_excluded_and_reported() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let m = mount_workspace(&packet, tmp.path());
    fs::write(m.path(".env"), b"TOKEN=x").unwrap();
    fs::create_dir(m.path(".ssh")).unwrap();
    fs::write(m.path(".ssh/id_ed25519"), b"key").unwrap();
    fs::write(m.path("auth.pem"), b"pem").unwrap();
    // Another name of an excluded file is left out with it.
    fs::hard_link(m.path(".env"), m.path("config.txt")).unwrap();
    // And one of a file in an excluded directory, which is not walked.
    fs::create_dir(m.path(".ssh/old")).unwrap();
    fs::write(m.path(".ssh/old/id_rsa"), b"old key").unwrap();
    fs::hard_link(m.path(".ssh/old/id_rsa"), m.path("key.txt")).unwrap();
    nix::unistd::mkfifo(
        &m.path("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let out = tmp.path().join("s.packet");
    let v = seal(&m, &out, &[]);
    let ex: Vec<&str> = excluded_paths(&v);
    assert_eq!(
        ex,
        [
            "workspace/.env",
            "workspace/.ssh",
            "workspace/auth.pem",
            "workspace/config.txt",
            "workspace/key.txt"
        ]
    );
    assert_eq!(
        v["excluded"][3]["reason"],
        serde_json::json!({"rule": "hard_link", "of": "workspace/.env"})
    );
    assert_eq!(
        v["excluded"][4]["reason"],
        serde_json::json!({"rule": "hard_link", "of": "workspace/.ssh/old/id_rsa"})
    );
    assert_eq!(v["dropped"][0]["path"], "workspace/pipe");
    let listing = tar_listing(&out);
    assert!(
        !listing.contains(".env")
            && !listing.contains(".ssh")
            && !listing.contains("pem")
            && !listing.contains("config.txt")
            && !listing.contains("key")
            && !listing.contains("pipe")
    );
    m.umount();
}

#[test]
fn bad_states_fail_closed_with_no_output() {
    // "an upper directory from another packet, a whiteout over nothing, an
    // entry the packet limits forbid, a path differing only by case from
    // another: a clear error and no output file."
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let upper = tmp.path().join("upper");
    let m = Mounted::new(
        &packet,
        &tmp.path().join("mnt"),
        &upper,
        &["--part", "workspace"],
    );
    let out = tmp.path().join("s.packet");
    let o = out.to_str().unwrap();
    let mp = m.mnt.to_str().unwrap();
    // A bad pattern is a usage error, as for pack.
    run(["seal", mp, "-o", o, "--exclude", "["]).fails(2, "bad_pattern");
    fs::write(m.path("readme.md"), b"lower case").unwrap();
    let e = run(["seal", mp, "-o", o]);
    assert_eq!(e.fails(7, "path_collision")["path"], "workspace/readme.md");
    fs::remove_file(m.path("readme.md")).unwrap();
    fs::write(m.path("tab\tname"), b"x").unwrap();
    run(["seal", mp, "-o", o]).fails(7, "invalid_path");
    fs::remove_file(m.path("tab\tname")).unwrap();
    run(["seal", mp, "-o", o, "--max-entries", "3"]).fails(5, "limit_exceeded");
    assert!(!out.exists());
    let leftovers = names_in(tmp.path(), |n| n.ends_with(".tmp"));
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The mount is untouched by the failed seals.
    run(["seal", mp, "-o", o]).ok();
    m.umount();
    // Offline: an upper directory from another packet, a whiteout over nothing.
    let other_ws = tmp.path().join("other");
    write(&other_ws, "x", b"x");
    let other = packet_of(&other_ws, tmp.path(), "other", &[]);
    let o2 = tmp.path().join("o2.packet");
    run([
        "seal",
        "--packet",
        other.to_str().unwrap(),
        "--upper",
        upper.to_str().unwrap(),
        "-o",
        o2.to_str().unwrap(),
    ])
    .fails(7, "upper_mismatch");
    let mut j = fs::OpenOptions::new()
        .append(true)
        .open(upper.join("journal"))
        .unwrap();
    writeln!(
        j,
        "{{\"op\":\"unlink\",\"t\":1,\"parent\":1,\"name\":\"no-such-file\"}}"
    )
    .unwrap();
    run([
        "seal",
        "--packet",
        packet.to_str().unwrap(),
        "--upper",
        upper.to_str().unwrap(),
        "-o",
        o2.to_str().unwrap(),
    ])
    .fails(7, "upper_damaged");
    assert!(!o2.exists());
}

#[test]
fn destinations_are_checked_before_anything_is_written() {
    // "Refusals write nothing at the output path and leave the mount and
    // its upper directory as they were": a destination on the mount (the
    // seal would wait on itself for good), a receipt with no directory
    // (found once the packet was already written and rebased), the packet
    // the mount serves without --rebase, and an offline seal of an upper
    // directory that does not exist.
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let upper = tmp.path().join("upper");
    let m = Mounted::new(
        &packet,
        &tmp.path().join("mnt"),
        &upper,
        &["--part", "workspace"],
    );
    fs::write(m.path("new.txt"), b"new").unwrap();
    let mp = m.mnt.to_str().unwrap();
    let out = tmp.path().join("s.packet");
    let o = out.to_str().unwrap();
    let inside = m.path("inside.packet");
    let e = run(["seal", mp, "-o", inside.to_str().unwrap()]);
    assert!(
        e.fails(7, "target_unusable")["message"]
            .as_str()
            .unwrap()
            .contains("on the mount being sealed")
    );
    let receipt = tmp.path().join("no-dir/r.json");
    run([
        "seal",
        mp,
        "-o",
        o,
        "--rebase",
        "--receipt",
        receipt.to_str().unwrap(),
    ])
    .fails(7, "target_unusable");
    assert!(!out.exists());
    let before = fs::read(&packet).unwrap();
    run(["seal", mp, "-o", packet.to_str().unwrap()]).fails(7, "target_unusable");
    // A receipt over the output, or over the packet being served.
    run(["seal", mp, "-o", o, "--receipt", o]).fails(7, "target_unusable");
    let pk = packet.to_str().unwrap();
    run(["seal", mp, "-o", o, "--rebase", "--receipt", pk]).fails(7, "target_unusable");
    assert!(!out.exists());
    assert_eq!(fs::read(&packet).unwrap(), before);
    // A file that is not a packet, kept.
    let notes = tmp.path().join("notes.txt");
    fs::write(&notes, b"notes").unwrap();
    let e = run(["seal", mp, "-o", notes.to_str().unwrap()]);
    assert!(
        e.fails(7, "target_unusable")["message"]
            .as_str()
            .unwrap()
            .contains("is not a sessionfs packet")
    );
    assert_eq!(fs::read(&notes).unwrap(), b"notes");
    // Nor a receipt over it; an older receipt may be replaced.
    let e = run(["seal", mp, "-o", o, "--receipt", notes.to_str().unwrap()]);
    let message = e.fails(7, "target_unusable")["message"].as_str().unwrap();
    assert!(message.contains("is not a sessionfs receipt"), "{message}");
    assert_eq!(fs::read(&notes).unwrap(), b"notes");
    assert!(!out.exists());
    // Nothing goes into the upper directory: not over its journal, not
    // beside it.
    let journal = upper.join("journal");
    let journal_before = fs::read(&journal).unwrap();
    for (output, receipt) in [
        (o.to_owned(), journal.display().to_string()),
        (
            upper.join("out.packet").display().to_string(),
            String::new(),
        ),
        (upper.join("data/x").display().to_string(), String::new()),
    ] {
        let mut a = vec!["seal", mp, "-o", output.as_str()];
        if !receipt.is_empty() {
            a.extend(["--receipt", receipt.as_str()]);
        }
        let e = run(a);
        let message = e.fails(7, "target_unusable")["message"].as_str().unwrap();
        assert!(message.contains("upper directory"), "{message}");
    }
    assert_eq!(fs::read(&journal).unwrap(), journal_before);
    assert!(!out.exists() && !upper.join("out.packet").exists());
    // Still the same mount, serving the same packet, with the change.
    assert_eq!(m.status()["digest"], m.result["digest"]);
    assert_eq!(fs::read(m.path("new.txt")).unwrap(), b"new");
    let receipt = tmp.path().join("r.json");
    run(["seal", mp, "-o", o, "--receipt", receipt.to_str().unwrap()]).ok();
    run(["seal", mp, "-o", o, "--receipt", receipt.to_str().unwrap()]).ok();
    m.umount();
    let missing = tmp.path().join("no-such-upper");
    run([
        "seal",
        "--packet",
        packet.to_str().unwrap(),
        "--upper",
        missing.to_str().unwrap(),
        "-o",
        tmp.path().join("o3.packet").to_str().unwrap(),
    ])
    .fails(7, "upper_refused");
    assert!(!missing.exists(), "an offline seal made an upper directory");
}

/// Starts `seal --packet PACKET --upper UPPER -o OUT` with the test
/// barrier at `bar`, its stdout going to `stdout`.
fn spawn_offline_seal(
    packet: &Path,
    upper: &Path,
    out: &Path,
    bar: &Path,
    stdout: std::process::Stdio,
) -> std::process::Child {
    std::process::Command::new(bin())
        .args(["seal", "--packet", packet.to_str().unwrap()])
        .args([
            "--upper",
            upper.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .env("SESSIONFS_TEST_BARRIER", bar)
        .stdout(stdout)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Runs an offline seal that pauses at `point`, kills it there, and checks
/// the output path holds nothing or the complete packet.
fn kill_offline_seal_at(packet: &Path, upper: &Path, out: &Path, point: &str, bar: &Path) {
    arm_barrier(bar, point);
    let mut child = spawn_offline_seal(packet, upper, out, bar, std::process::Stdio::null());
    wait_reached(bar, point);
    child.kill().unwrap();
    child.wait().unwrap();
    fs::remove_dir_all(bar).unwrap();
}

#[test]
fn large_files_are_copied_chunk_by_chunk_and_tampering_is_caught() {
    // Reused content is verified as it is copied: a small file against its
    // hash, a large one chunk by chunk; the packet equals `pack` of the
    // merged view, and a tampered chunk fails the seal with nothing written.
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let ws = tmp.join("ws");
    fs::create_dir_all(ws.join("d")).unwrap();
    let big: Vec<u8> = (0..(9u32 << 20) + 123)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(ws.join("big.bin"), &big).unwrap();
    fs::write(ws.join("exact.bin"), vec![3u8; 4 << 20]).unwrap();
    fs::write(ws.join("d/small.txt"), b"small").unwrap();
    let packet = packet_of(&ws, tmp, "p", &["--zero-mtimes"]);
    let m = mount_workspace(&packet, tmp);
    fs::write(m.path("d/new.txt"), b"new").unwrap();
    let out = tmp.join("s.packet");
    let v = seal(&m, &out, &["--zero-mtimes", "--file-sha256"]);
    let lower_bytes = big.len() as u64 + (4 << 20) + 5;
    assert_eq!(v["bytes_verified"], lower_bytes, "{v}");
    assert_eq!(v["bytes_copied"], lower_bytes, "{v}");
    fs::write(ws.join("d/new.txt"), b"new").unwrap();
    let want = packet_of(&ws, tmp, "want", &["--zero-mtimes"]);
    assert!(
        fs::read(&out).unwrap() == fs::read(&want).unwrap(),
        "the seal differs from pack of the merged view"
    );
    let checked = run(["verify", out.to_str().unwrap()]);
    assert_eq!(checked.ok()["file_sha256"], v["file_sha256"]);

    // Tamper with chunk 1 of big.bin in the packet under the mount.
    let bytes = fs::read(&packet).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &big[..64])
        .expect("big.bin's content in the packet") as u64;
    let f = fs::OpenOptions::new().write(true).open(&packet).unwrap();
    let pos = at + (5 << 20);
    std::os::unix::fs::FileExt::write_all_at(&f, &[bytes[pos as usize] ^ 1], pos).unwrap();
    drop(f);
    let out2 = tmp.join("s2.packet");
    let args = [
        "seal",
        m.mnt.to_str().unwrap(),
        "-o",
        out2.to_str().unwrap(),
    ];
    // The packet moved since its chunks were verified: they are verified
    // again as the seal copies them, and the changed one's hash catches it.
    let r = run(args);
    let err = r.fails(3, "content_mismatch");
    assert_eq!(err["path"], "workspace/big.bin", "{err}");
    assert!(!out2.exists());
    m.umount();
    // Offline, the packet is opened afresh: the chunk's hash catches it too.
    let r = run([
        "seal",
        "--packet",
        packet.to_str().unwrap(),
        "--upper",
        tmp.join("upper").to_str().unwrap(),
        "-o",
        out2.to_str().unwrap(),
    ]);
    let e = r.fails(3, "content_mismatch");
    assert_eq!(e["path"], "workspace/big.bin", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(&(4u64 << 20).to_string()), "{msg}");
    assert!(!out2.exists());
}

#[test]
fn content_changed_between_hashing_and_writing_is_refused() {
    // New content is hashed before the packet is written and not hashed
    // again: if anything rewrites an upper data file in between (possible
    // only offline, where no daemon holds changes back), the seal must fail
    // rather than write a packet whose manifest lies.
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    let upper = m.upper.clone();
    fs::write(m.path("new.txt"), b"turn one").unwrap();
    m.umount();
    let data = walk_files(&upper)
        .into_iter()
        .find(|p| fs::read(p).is_ok_and(|b| b == b"turn one"))
        .expect("the data file of new.txt");
    let bar = tmp.path().join("barrier");
    arm_barrier(&bar, "hashed");
    let out = tmp.path().join("out.packet");
    let child = spawn_offline_seal(&packet, &upper, &out, &bar, std::process::Stdio::piped());
    wait_reached(&bar, "hashed");
    fs::write(&data, b"turn two").unwrap(); // same size: only the stamp tells
    fs::write(bar.join("hashed.go"), b"").unwrap();
    let done = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(done.status.code(), Some(7), "{v}");
    assert_eq!(v["kind"], "changed_while_sealing", "{v}");
    assert!(v["path"].as_str().unwrap().ends_with("new.txt"), "{v}");
    assert!(!out.exists());
    let leftovers = names_in(tmp.path(), |n| n.ends_with(".tmp"));
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn sigkill_at_any_point_leaves_nothing_or_the_whole_packet() {
    // "A seal killed with SIGKILL at any point ... leaves either no file at
    // the output path or the complete packet, never a partial one, and
    // leaves the mount and its upper directory intact; running the same
    // seal again gives the same digest."
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    let upper = m.upper.clone();
    fs::write(m.path("new.txt"), b"turn one").unwrap();
    fs::rename(m.path("src"), m.path("source")).unwrap();
    let reference = tmp.path().join("reference.packet");
    let want = seal(&m, &reference, &[])["digest"].clone();
    m.umount();
    // Every point up to the rebase's, which an offline seal never reaches.
    for &point in POINTS.iter().take_while(|p| !p.starts_with("rebase")) {
        let out = tmp.path().join(format!("{point}.packet"));
        kill_offline_seal_at(&packet, &upper, &out, point, &tmp.path().join("barrier"));
        if out.exists() {
            assert_eq!(
                point, "committed",
                "a file appeared at the output before the rename"
            );
            assert!(
                fs::read(&out).unwrap() == fs::read(&reference).unwrap(),
                "a different packet at the output after a kill at {point}"
            );
        }
        let again = run([
            "seal",
            "--packet",
            packet.to_str().unwrap(),
            "--upper",
            upper.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(again.ok()["digest"], want, "after a kill at {point}");
    }
    // The upper directory still mounts to the same view.
    let m = Mounted::new(
        &packet,
        &tmp.path().join("mnt"),
        &upper,
        &["--part", "workspace"],
    );
    assert_eq!(fs::read(m.path("new.txt")).unwrap(), b"turn one");
    assert_eq!(
        seal(&m, &tmp.path().join("last.packet"), &[])["digest"],
        want
    );
    m.umount();
}

#[test]
fn a_seal_concurrent_with_a_writer_captures_whole_writes() {
    // "A seal concurrent with a writer captures a consistent state: no torn
    // file".
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let m = mount_workspace(&packet, tmp.path());
    let path = m.path("log.bin");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut f = fs::File::create(&path).unwrap();
        let mut k = 0u32;
        // Paced, so the file stays far below the content limit.
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            f.write_all(&vec![(k % 251) as u8; 64 * 1024]).unwrap();
            k += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut digests = Vec::new();
    for n in 0..3 {
        let out = tmp.path().join(format!("s{n}.packet"));
        seal(&m, &out, &[]);
        let r = tmp.path().join(format!("r{n}"));
        unpack(&out, &r, &["--part", "workspace"]);
        let data = fs::read(r.join("log.bin")).unwrap();
        assert_eq!(
            data.len() % (64 * 1024),
            0,
            "a write was torn: {} bytes",
            data.len()
        );
        for (k, rec) in data.chunks(64 * 1024).enumerate() {
            assert!(
                rec.iter().all(|&b| b == (k % 251) as u8),
                "record {k} damaged"
            );
        }
        digests.push(data.len());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        digests.windows(2).all(|w| w[0] <= w[1]) && digests[2] > 0,
        "{digests:?}"
    );
    m.umount();
}

/// An appender's `write` that runs past the end of a page the kernel holds
/// only in part reaches the daemon as two requests. A seal between the two
/// held half a record; a seal now waits for the second (found by a stress
/// run: about one seal in 15 cut a record of a flat-out appender).
#[test]
fn a_seal_never_holds_half_of_an_append() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let m = mount_workspace(&packet, tmp.path());
    let path = m.path("turn.log");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .unwrap();
        let mut k = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            // Records of 12 to 312 bytes, one `write` each.
            let pad = "x".repeat((k.wrapping_mul(7919) % 301) as usize);
            let rec = format!("{k:010}{pad}\n");
            assert_eq!(f.write(rec.as_bytes()).unwrap(), rec.len());
            k += 1;
        }
        k
    });
    std::thread::sleep(Duration::from_millis(100));
    for n in 0..60 {
        let out = tmp.path().join("turn.packet");
        seal(&m, &out, &[]);
        let r = tmp.path().join(format!("r{n}"));
        unpack(&out, &r, &["--part", "workspace"]);
        let data = fs::read(r.join("turn.log")).unwrap();
        let text = String::from_utf8(data).unwrap();
        assert!(
            text.ends_with('\n'),
            "seal {n} cut a record: {} bytes, ending {:?}",
            text.len(),
            &text[text.rfind('\n').map_or(0, |i| i + 1)..]
        );
        for (k, line) in text.lines().enumerate() {
            let pad = (k as u64).wrapping_mul(7919) % 301;
            assert_eq!(line.len() as u64, 10 + pad, "seal {n}, record {k}");
            assert_eq!(line[..10].parse::<usize>().unwrap(), k, "seal {n}");
        }
        fs::remove_dir_all(&r).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.join().unwrap() > 0);
    m.umount();
}

#[test]
fn files_opened_before_any_change_survive_unlink_and_rebase() {
    // A lower file opened before anything changed it has no node yet; its
    // handle must still keep it alive when it is unlinked and the mount
    // rebases (found in review: opening no longer copies up).
    if !fuse_available() {
        return;
    }
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    let rw = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("README.md"))
        .unwrap();
    let ro = fs::File::open(m.path("src/main.rs")).unwrap();
    let main_rs = fs::read(m.path("src/main.rs")).unwrap();
    rw.write_all_at(b"##", 0).unwrap();
    fs::remove_file(m.path("README.md")).unwrap();
    fs::remove_file(m.path("src/main.rs")).unwrap();
    seal(&m, &tmp.path().join("turn1.packet"), &["--rebase"]);
    seal(&m, &tmp.path().join("turn2.packet"), &["--rebase"]);
    rw.write_all_at(b"!", 2).unwrap();
    let mut got = vec![0u8; 9];
    rw.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, b"##!ample\n");
    let mut back = vec![0u8; main_rs.len()];
    ro.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, main_rs);
    assert!(!m.path("README.md").exists());
    drop((rw, ro));
    m.umount();
}

/// What a packet leaves out stays on the mount across `--rebase`, and
/// after a remount: credentials made on the mount (a harness's refreshed
/// token, a `.env`), their other names, FIFOs, and lower entries a seal
/// `--exclude`s, with their content, numbers, modes and times, in no
/// packet. Before, the rebase dropped them all from the running mount.
#[test]
fn what_a_packet_leaves_out_stays_on_the_mount_across_a_rebase() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    fs::write(m.path(".env"), b"TOKEN=1\n").unwrap();
    fs::create_dir(m.path(".ssh")).unwrap();
    fs::write(m.path(".ssh/id_ed25519"), b"key\n").unwrap();
    fs::hard_link(m.path(".ssh/id_ed25519"), m.path("key.txt")).unwrap();
    // Another name of a file the packet holds, left out by `--exclude`.
    fs::hard_link(m.path("src/main.rs"), m.path("main.rs.log")).unwrap();
    nix::unistd::mkfifo(
        &m.path("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    set_mtime(&m.path(".ssh"), 1_600_000_000_000_000_001);
    let names = [
        ".env",
        ".ssh",
        ".ssh/id_ed25519",
        "key.txt",
        "pipe",
        "README.md",
        "main.rs.log",
        "src/main.rs",
    ];
    let look = |m: &Mounted| -> Vec<(u64, u32, u32, i64, i64, Vec<u8>)> {
        names
            .iter()
            .map(|n| {
                let md = fs::symlink_metadata(m.path(n)).unwrap();
                let content = if md.is_file() {
                    fs::read(m.path(n)).unwrap()
                } else {
                    Vec::new()
                };
                (
                    md.ino(),
                    md.mode(),
                    md.nlink() as u32,
                    md.mtime(),
                    md.mtime_nsec(),
                    content,
                )
            })
            .collect()
    };
    let before = look(&m);
    let out = tmp.path().join("turn1.packet");
    let v = seal(
        &m,
        &out,
        &["--rebase", "--exclude", "README.md", "--exclude", "*.log"],
    );
    assert_eq!(v["rebased"], true);
    let listing = tar_listing(&out);
    assert!(listing.contains("workspace/src/main.rs\n"), "{listing}");
    for n in names.iter().filter(|n| **n != "src/main.rs") {
        assert!(
            !listing.contains(&format!("workspace/{n}\n")),
            "{n} in {listing}"
        );
    }
    assert_eq!(look(&m), before, "the mount changed across the rebase");
    // The next turn: they stay there, and out of its packet, again.
    fs::write(m.path(".env"), b"TOKEN=2\n").unwrap();
    let out2 = tmp.path().join("turn2.packet");
    seal(
        &m,
        &out2,
        &["--rebase", "--exclude", "README.md", "--exclude", "*.log"],
    );
    assert!(!tar_listing(&out2).contains(".env"));
    let after = look(&m);
    assert_eq!(after[0].5, b"TOKEN=2\n");
    assert_eq!(after[1..], before[1..]);
    // A remount replays them from the journal.
    let m = m.remount_workspace(&out2);
    assert_eq!(look(&m), after);
    drop(packet);
    m.umount();
}

/// A name a rebase renumbers (another name of a file hard-linked on the
/// mount) gets a number that depends on what the rebase keeps taken (here
/// the `.env` that stays on the mount holds the name's own number); the
/// rebase record keeps it, so a remount gives the same numbers: before, the
/// remount gave `b` the `.env`'s number, and a `chmod` of `b` made after
/// the rebase named a number the remount did not have (`upper_damaged`).
/// (Found in review.)
#[test]
fn a_remount_after_a_rebase_gives_renumbered_names_their_numbers() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    fs::write(m.path("b"), b"SECRET=1\n").unwrap();
    fs::rename(m.path("b"), m.path(".env")).unwrap();
    fs::hard_link(m.path("README.md"), m.path("b")).unwrap();
    let out = tmp.path().join("turn1.packet");
    seal(&m, &out, &["--rebase"]);
    let numbers =
        |m: &Mounted| [".env", "b", "README.md"].map(|n| fs::metadata(m.path(n)).unwrap().ino());
    let live = numbers(&m);
    assert_ne!(live[0], live[1]);
    fs::set_permissions(m.path("b"), fs::Permissions::from_mode(0o600)).unwrap();
    let m = m.remount_workspace(&out);
    assert_eq!(numbers(&m), live);
    assert_eq!(fs::read(m.path(".env")).unwrap(), b"SECRET=1\n");
    assert_eq!(fs::read(m.path("b")).unwrap(), b"# sample\n");
    assert_eq!(fs::metadata(m.path("b")).unwrap().mode() & 0o777, 0o600);
    m.umount();
}

/// A directory the kernel knows under a generation past 1 (made again at
/// its path) and holding an entry the packet leaves out keeps that
/// generation across a rebase: the records that keep the entry make the
/// directory a node of the new view, which took generation 1 before, and
/// the kernel failed every use of the open directory with `EIO`. (Found
/// in review.)
#[test]
fn a_directory_holding_a_left_out_entry_keeps_its_generation() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    let d = m.path("build");
    let first = made_again(&d, |p| fs::create_dir(p), |p| fs::remove_dir(p));
    fs::write(d.join(".env"), b"T=x\n").unwrap();
    fs::write(d.join("f"), b"hi\n").unwrap();
    let held = fs::File::open(&d).unwrap();
    seal(&m, &tmp.path().join("turn1.packet"), &["--rebase"]);
    list_long(&[&m.mnt, &d]);
    assert_eq!(held.metadata().unwrap().ino(), first);
    assert_eq!(fs::read(d.join(".env")).unwrap(), b"T=x\n");
    drop(held);
    m.umount();
}

/// A number the kernel still holds stays taken across a rebase, whatever
/// the entry: a directory removed while open is in no packet, yet until the
/// kernel forgets it its number must go to no new entry. Before, the rebase
/// let it go: a directory made again at that path took the number, the
/// kernel's late `FORGET` of the old one was counted against the new one,
/// which was then dropped and its number handed out while open, and the
/// kernel failed every use of the open directory with `EIO` (found by a
/// stress run of writers across `seal --rebase`).
#[test]
fn numbers_the_kernel_holds_stay_taken_across_a_rebase() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    let d = m.path("held");
    fs::create_dir(&d).unwrap();
    let old = fs::File::open(&d).unwrap();
    fs::remove_dir(&d).unwrap();
    seal(&m, &tmp.path().join("turn1.packet"), &["--rebase"]);
    fs::create_dir(&d).unwrap();
    let new = fs::File::open(&d).unwrap();
    let new_ino = new.metadata().unwrap().ino();
    assert_ne!(
        old.metadata().unwrap().ino(),
        new_ino,
        "a number the kernel holds was handed out again"
    );
    drop(old);
    // Once the daemon has had the old directory's `FORGET`, the new one,
    // removed while open, must stay known to it.
    std::thread::sleep(Duration::from_millis(300));
    fs::remove_dir(&d).unwrap();
    fs::create_dir(&d).unwrap();
    let md = new.metadata().unwrap();
    assert_eq!((md.ino(), md.nlink()), (new_ino, 0));
    assert_ne!(fs::metadata(&d).unwrap().ino(), new_ino);
    drop(new);
    m.umount();
}

/// A file made again at a path keeps the number of the file it replaces,
/// under the next generation. A rebase makes it a lower entry; it must
/// keep that generation there: the kernel, still holding it for an open
/// descriptor, takes the number coming back with another generation (in
/// `ls -l`'s `READDIRPLUS`) for a new file, drops its inode as stale, and
/// every write through the descriptor fails with `EIO` (found by a stress
/// run of writers across `seal --rebase`).
#[test]
fn a_file_made_again_keeps_its_generation_across_a_rebase() {
    use std::os::unix::fs::FileExt;
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    let f = m.path("src/again.txt");
    let first = made_again(&f, |p| fs::write(p, b"again\n"), |p| fs::remove_file(p));
    let held = fs::OpenOptions::new().write(true).open(&f).unwrap();
    seal(&m, &tmp.path().join("turn1.packet"), &["--rebase"]);
    list_long(&[&m.path("src")]);
    held.write_all_at(b"AGAIN", 0).unwrap();
    held.sync_all().unwrap();
    drop(held);
    assert_eq!(fs::read(&f).unwrap(), b"AGAIN\n");
    assert_eq!(fs::metadata(&f).unwrap().ino(), first);
    m.umount();
}

/// The orchestrator's loop: every turn seals with `--rebase` onto the
/// path of the packet the mount serves. The rename over that path moves
/// the served file's ctime; the mount takes it for its own seal's doing,
/// not for a change to its packet: while a reader reads lower content
/// through it (its page cache dropped each time), every seal moves the
/// mount on and no read fails.
#[test]
fn rebase_onto_the_served_path_while_reading() {
    use std::os::unix::fs::FileExt;
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    let big = m.path("data/big.bin");
    let want = fs::read(&big).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (big, want, stop) = (big.clone(), want.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let f = fs::File::open(&big).unwrap();
                drop_cached_pages(&f);
                let mut got = vec![0u8; want.len()];
                f.read_exact_at(&mut got, 0)
                    .unwrap_or_else(|e| panic!("read {reads} failed: {e}"));
                assert!(got == want, "read {reads} returned other bytes");
                reads += 1;
            }
            reads
        })
    };
    let p = packet.to_str().unwrap();
    for turn in 0..4 {
        fs::write(m.path(&format!("turn-{turn}.txt")), b"turn").unwrap();
        let v = seal(&m, &packet, &["--rebase"]);
        assert_eq!(v["rebased"], true, "{v}");
        assert_eq!(m.status()["digest"], v["digest"], "turn {turn}");
        run(["verify", p]).ok();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0);
    assert_eq!(fs::read(&big).unwrap(), want);
    m.umount();
}

/// An absolute symlink into the mount is stored rebased (relative); after
/// `--rebase` the mount shows it as stored, its target and its size
/// alike, not a target the kernel cached before.
#[test]
fn a_rebased_symlink_reads_as_stored_after_a_rebase() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    let link = m.path("abs");
    std::os::unix::fs::symlink(m.path("src"), &link).unwrap();
    assert_eq!(fs::read_link(&link).unwrap(), m.path("src"));
    let out = tmp.path().join("s.packet");
    seal(&m, &out, &["--rebase"]);
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("src"));
    assert_eq!(fs::symlink_metadata(&link).unwrap().len(), 3);
    assert!(link.join("main.rs").is_file());
    m.umount();
}

#[test]
fn rebase_continues_on_the_new_packet() {
    // "--rebase: after a successful seal the mount continues on the new
    // packet with an empty upper directory, atomically, without unmounting:
    // open files keep working, paths keep their inode numbers, and the next
    // seal costs only what changed since this one."
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    let upper = m.upper.clone();
    fs::rename(m.path("data/big.bin"), m.path("big.bin")).unwrap();
    fs::write(m.path("turn1.txt"), b"one").unwrap();
    let inos: Vec<(String, u64)> = snapshot(&m.mnt)
        .into_iter()
        .map(|(r, _)| {
            let i = fs::symlink_metadata(m.path(&r)).unwrap().ino();
            (r, i)
        })
        .collect();
    let mut open = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("README.md"))
        .unwrap();
    let p2 = tmp.path().join("turn1.packet");
    let v = seal(&m, &p2, &["--rebase"]);
    assert_eq!(v["rebased"], true);
    assert_eq!(m.status()["digest"], v["digest"]);
    let after: Vec<(String, u64)> = snapshot(&m.mnt)
        .into_iter()
        .map(|(r, _)| {
            let i = fs::symlink_metadata(m.path(&r)).unwrap().ino();
            (r, i)
        })
        .collect();
    assert_eq!(inos, after, "inode numbers changed across the rebase");
    let journal = fs::read_to_string(upper.join("journal")).unwrap();
    assert_eq!(journal.lines().count(), 1, "{journal}");
    assert!(journal.contains("\"op\":\"rebase\""));
    assert!(data_files(&upper).is_empty());
    open.write_all(b"# still open\n").unwrap();
    drop(open);
    assert!(
        fs::read_to_string(m.path("README.md"))
            .unwrap()
            .starts_with("# still open")
    );
    // Turn two: the seal copies everything it did not see change.
    fs::write(m.path("turn2.txt"), b"two").unwrap();
    let p3 = tmp.path().join("turn2.packet");
    let v2 = seal(&m, &p3, &["--rebase"]);
    assert_eq!(
        (v2["added"].as_u64(), v2["modified"].as_u64()),
        (Some(1), Some(1)),
        "{v2}"
    );
    assert_eq!(
        v2["bytes_verified"], 0,
        "chunks written by the last seal count as verified"
    );
    assert_eq!(v2["parent"], v["digest"]);
    // That seal read its parent (written by the daemon, so read around the
    // page cache) in spans at unaligned offsets, big.bin's chunks among
    // them, and trusted the bytes: they must be exactly the merged view.
    run(["verify", p3.to_str().unwrap()]).ok();
    let out = tmp.path().join("turn2.tree");
    unpack(&p3, &out, &["--part", "workspace"]);
    assert_eq!(snapshot(&out), snapshot(&m.mnt));
    let mnt = m.mnt.clone();
    m.umount();
    // The upper directory now belongs to the last packet; the first is refused.
    let e = run(mount_args(&packet, &mnt, &upper));
    assert!(
        e.fails(7, "upper_mismatch")["message"]
            .as_str()
            .unwrap()
            .contains("turn2.packet")
    );
    let m = Mounted::new(&p3, &mnt, &upper, &["--part", "workspace"]);
    assert_eq!(fs::read(m.path("turn2.txt")).unwrap(), b"two");
    assert_eq!(
        fs::metadata(m.path("big.bin")).unwrap().ino(),
        inos.iter().find(|(r, _)| r == "big.bin").unwrap().1
    );
    m.umount();
}

/// The names of a file hard-linked on the mount are separate files in the
/// sealed packet, and after a rebase separate files on the mount too, with
/// numbers of their own (now and after a remount): a write to one leaves
/// the others alone, and a later seal judges each by its own name.
#[test]
fn hard_links_are_separate_files_after_a_rebase() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    fs::create_dir(m.path("sub")).unwrap();
    fs::write(m.path("m.txt"), b"made").unwrap();
    for name in ["l1.txt", "sub/l2.txt"] {
        fs::hard_link(m.path("m.txt"), m.path(name)).unwrap();
    }
    let ino = |m: &Mounted, name: &str| fs::metadata(m.path(name)).unwrap().ino();
    let before = ino(&m, "m.txt");
    let p2 = tmp.path().join("turn1.packet");
    assert_eq!(seal(&m, &p2, &["--rebase"])["rebased"], true);
    let separate = |m: &Mounted| {
        let names = ["l1.txt", "m.txt", "sub/l2.txt"];
        let inos: HashSet<u64> = names.iter().map(|n| ino(m, n)).collect();
        assert_eq!(inos.len(), 3, "{names:?} share numbers");
        for n in names {
            assert_eq!(fs::metadata(m.path(n)).unwrap().nlink(), 1, "{n}");
        }
    };
    separate(&m);
    // The name the file was made under keeps the number it had.
    assert_eq!(ino(&m, "m.txt"), before);
    fs::write(m.path("l1.txt"), b"changed").unwrap();
    assert_eq!(fs::read(m.path("m.txt")).unwrap(), b"made");
    assert_eq!(fs::read(m.path("sub/l2.txt")).unwrap(), b"made");
    // A credential name given to one of them excludes that one only.
    fs::rename(m.path("m.txt"), m.path(".env")).unwrap();
    let v = seal(&m, &tmp.path().join("turn2.packet"), &[]);
    assert_eq!(excluded_paths(&v), ["workspace/.env"], "{v}");
    let m = m.remount_workspace(&p2);
    fs::rename(m.path(".env"), m.path("m.txt")).unwrap();
    separate(&m);
    assert_eq!(fs::read(m.path("l1.txt")).unwrap(), b"changed");
    assert_eq!(fs::read(m.path("sub/l2.txt")).unwrap(), b"made");
    m.umount();
}

/// A rebase that gives a hard link's other name a number of its own tells
/// the kernel only once changes may go on: an operation in that directory
/// waiting for the seal (holding the directory's lock, which the kernel
/// needs to drop the name) would otherwise never end, nor the seal.
#[test]
fn a_rebase_renumbering_names_waits_for_no_operation() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let (mnt, upper, bar) = (
        tmp.path().join("mnt"),
        tmp.path().join("upper"),
        tmp.path().join("bar"),
    );
    let (_unmount, _) = mount_paused_at(&packet, &mnt, &upper, &bar, "rebase-compacted");
    fs::write(mnt.join("m.txt"), b"made").unwrap();
    fs::hard_link(mnt.join("m.txt"), mnt.join("l.txt")).unwrap();
    let mut seal_cmd = KillOnDrop(spawn_seal_rebase(&mnt, &tmp.path().join("next.packet")));
    wait_reached(&bar, "rebase-compacted");
    // A create in the same directory, waiting for the seal (in a process
    // of its own: one waiting on a mount that never answers cannot exit).
    let mut create = KillOnDrop(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo new > '{}'", mnt.join("new.txt").display()))
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(200));
    fs::write(bar.join("rebase-compacted.go"), b"").unwrap();
    let ended = |c: &mut KillOnDrop| {
        (0..3000).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            c.0.try_wait().unwrap().is_some()
        })
    };
    if !ended(&mut seal_cmd) {
        // Deadlocked: only aborting the connection frees them.
        abort_fuse_connection(&mnt);
        panic!("the seal and a create waiting for it never ended");
    }
    assert_eq!(seal_cmd.0.wait().unwrap().code(), Some(0));
    assert!(ended(&mut create), "the create never ended");
    assert!(create.0.wait().unwrap().success());
    assert_eq!(fs::read(mnt.join("new.txt")).unwrap(), b"new\n");
    let ino = |n: &str| fs::metadata(mnt.join(n)).unwrap().ino();
    assert_ne!(ino("m.txt"), ino("l.txt"));
    run(["umount", mnt.to_str().unwrap()]).ok();
}

/// A rebase that fails after the packet is written says so (`rebase_failed`,
/// exit 6): the error names the packet, gives its digest and says truly
/// what the mount serves. Before the record that commits the move (the
/// packet damaged, replaced by another valid one, or written in place: its
/// unverified bytes must never be served as the seal's own): the previous
/// packet with
/// its changes, and sealing again works. After it (the upper directory's
/// disk full as it is tidied): the new packet, edits after it survive a
/// remount over the new packet.
#[test]
fn a_failed_rebase_says_the_packet_was_written_and_what_is_served() {
    if !fuse_available() {
        return;
    }
    for case in [
        "damaged",
        "replaced",
        "copied",
        "modified",
        "modified_times_restored",
        "disk_full",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (packet, _) = model_packet(tmp.path());
        let other = tmp.path().join("other.packet");
        let ws = tmp.path().join("other-ws");
        write(&ws, "x", b"another session");
        pack(&ws, &other, &[]);
        // The upper directory on a small file system of its own.
        let small = tmp.path().join("small");
        fs::create_dir(&small).unwrap();
        let tmpfs = FsMount::tmpfs(&small, "4m");
        let upper = small.join("upper");
        let mnt = tmp.path().join("mnt");
        let bar = tmp.path().join("barrier");
        let point = if case == "disk_full" {
            "rebase-recorded"
        } else {
            "committed"
        };
        let (_unmount, mounted) = mount_paused_at(&packet, &mnt, &upper, &bar, point);
        let old_digest = mounted["digest"].clone();
        fs::write(mnt.join("made.txt"), b"made").unwrap();
        // Two names of one file here; two files in the sealed packet.
        fs::hard_link(mnt.join("made.txt"), mnt.join("link.txt")).unwrap();
        assert_eq!(fs::metadata(mnt.join("made.txt")).unwrap().nlink(), 2);
        let out = tmp.path().join("next.packet");
        let seal_cmd = spawn_seal_rebase(&mnt, &out);
        wait_reached(&bar, point);
        let filler = small.join("filler");
        match case {
            "damaged" => fs::OpenOptions::new()
                .write(true)
                .open(&out)
                .unwrap()
                .set_len(1024)
                .unwrap(),
            "replaced" => {
                fs::copy(&other, tmp.path().join("swap")).unwrap();
                fs::rename(tmp.path().join("swap"), &out).unwrap();
            }
            "copied" => {
                // The same bytes in another file: same digest, not the
                // file the seal wrote.
                fs::copy(&out, tmp.path().join("swap")).unwrap();
                fs::rename(tmp.path().join("swap"), &out).unwrap();
            }
            "modified" | "modified_times_restored" => {
                // In place, past the manifest: same file, same digest.
                use std::os::unix::fs::FileExt;
                let f = fs::OpenOptions::new().write(true).open(&out).unwrap();
                let before = f.metadata().unwrap();
                let at = before.len() - 1024 - 4;
                f.write_all_at(b"EVIL", at).unwrap();
                if case == "modified_times_restored" {
                    let t = |s: i64, ns: i64| nix::sys::time::TimeSpec::new(s, ns);
                    nix::sys::stat::futimens(
                        &f,
                        &t(before.atime(), before.atime_nsec()),
                        &t(before.mtime(), before.mtime_nsec()),
                    )
                    .unwrap();
                }
            }
            _ => {
                // Fill the upper directory's file system to the last block.
                let mut f = fs::File::create(&filler).unwrap();
                let block = vec![0x55u8; 4096];
                while f.write_all(&block).is_ok() {}
            }
        }
        fs::write(bar.join(format!("{point}.go")), b"").unwrap();
        let o = seal_cmd.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(o.status.code(), Some(6), "{case}: {v}");
        assert_eq!(v["kind"], "rebase_failed", "{case}: {v}");
        assert_eq!(v["path"], out.to_str().unwrap(), "{case}: {v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.contains("the packet was written (sha256:"),
            "{case}: {v}"
        );
        let status = run(["status", mnt.to_str().unwrap()]);
        let serving = status.ok()["digest"].clone();
        if case == "disk_full" {
            assert!(message.contains("which now serves it"), "{case}: {v}");
            assert_ne!(serving, old_digest, "{case}: the mount did not move");
            // The tidying failed, and still: the kernel was told the old
            // nodes changed, nothing half-written is left, and the old
            // data files (of no use past the durable record) are gone.
            assert_eq!(fs::metadata(mnt.join("made.txt")).unwrap().nlink(), 1);
            let left = names_in(&upper, |n| n.ends_with(".tmp"));
            assert!(
                left.is_empty(),
                "{case}: {left:?} left in the upper directory"
            );
            let data: Vec<_> = fs::read_dir(upper.join("data"))
                .unwrap()
                .flat_map(|shard| fs::read_dir(shard.unwrap().path()).unwrap())
                .map(|e| e.unwrap().path())
                .collect();
            assert!(data.is_empty(), "{case}: old data files left: {data:?}");
            fs::remove_file(&filler).unwrap();
            fs::write(mnt.join("after.txt"), b"after").unwrap();
            run(["umount", mnt.to_str().unwrap()]).ok();
            let m = Mounted::new(&out, &mnt, &upper, &["--part", "workspace"]);
            assert_eq!(fs::read(m.path("made.txt")).unwrap(), b"made");
            assert_eq!(fs::read(m.path("after.txt")).unwrap(), b"after");
            m.umount();
        } else {
            assert!(
                message.contains("still serves the previous packet"),
                "{case}: {v}"
            );
            assert_eq!(serving, old_digest, "{case}: the mount moved");
            assert_eq!(fs::read(mnt.join("made.txt")).unwrap(), b"made");
            let again = tmp.path().join("again.packet");
            run(["seal", mnt.to_str().unwrap(), "-o", again.to_str().unwrap()]).ok();
            run(["verify", again.to_str().unwrap()]).ok();
            run(["umount", mnt.to_str().unwrap()]).ok();
            // The upper directory still belongs to the previous packet.
            let m = Mounted::new(&packet, &mnt, &upper, &["--part", "workspace"]);
            assert_eq!(fs::read(m.path("made.txt")).unwrap(), b"made");
            m.umount();
        }
        drop(tmpfs);
    }
}

/// Mounts the workspace part of `packet` at `mnt` over `upper`, its daemon
/// (which seals) pausing at barrier `point` only, in directory `bar`.
/// Returns a guard that unmounts lazily, and the mount's result.
fn mount_paused_at(
    packet: &Path,
    mnt: &Path,
    upper: &Path,
    bar: &Path,
    point: &str,
) -> (LazyUnmount, Value) {
    arm_barrier(bar, point);
    fs::create_dir_all(mnt).unwrap();
    let guard = LazyUnmount(mnt.to_owned());
    let r = run_env(
        mount_args(packet, mnt, upper),
        &[
            ("SESSIONFS_TEST_BARRIER", bar.to_str().unwrap()),
            // The log then says when the daemon took a seal request.
            ("SESSIONFS_LOG", "info"),
        ],
    );
    (guard, r.ok().clone())
}

/// The arguments that mount the workspace part of `packet` at `mnt` over
/// `upper`.
fn mount_args<'a>(packet: &'a Path, mnt: &'a Path, upper: &'a Path) -> [&'a str; 7] {
    [
        "mount",
        packet.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "--upper",
        upper.to_str().unwrap(),
        "--part",
        "workspace",
    ]
}

/// Starts `seal MNT -o OUT --rebase`, its output captured.
fn spawn_seal_rebase(mnt: &Path, out: &Path) -> std::process::Child {
    std::process::Command::new(bin())
        .args([
            "seal",
            mnt.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--rebase",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_crash_during_a_rebase_remounts_to_what_the_application_saw() {
    // "A crash at any point of a rebase leaves a state that re-mounts to
    // exactly what the application saw."
    if !fuse_available() {
        return;
    }
    for point in ["committed", "rebase-recorded", "rebase-compacted"] {
        let tmp = tempfile::tempdir().unwrap();
        let (packet, _) = model_packet(tmp.path());
        let upper = tmp.path().join("upper");
        let mnt = tmp.path().join("mnt");
        let bar = tmp.path().join("barrier");
        let (_unmount, mounted) = mount_paused_at(&packet, &mnt, &upper, &bar, point);
        let pid = mounted["pid"].as_i64().unwrap() as i32;
        fs::write(mnt.join("made.txt"), b"seen by the application").unwrap();
        fs::remove_file(mnt.join("README.md")).unwrap();
        let want = snapshot(&mnt);
        let out = tmp.path().join("next.packet");
        let seal_cmd = spawn_seal_rebase(&mnt, &out);
        wait_reached(&bar, point);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = seal_cmd.wait_with_output();
        std::thread::sleep(Duration::from_millis(100));
        detach(&mnt);
        // Whichever packet the upper directory now belongs to shows the view.
        let old = run(mount_args(&packet, &mnt, &upper));
        let remounted_on_new = old.code != 0;
        if remounted_on_new {
            assert_ne!(point, "committed", "the switch happened before its record");
            let m = Mounted::new(&out, &mnt, &upper, &["--part", "workspace"]);
            assert_eq!(snapshot(&m.mnt), want, "after a kill at {point}");
            m.umount();
        } else {
            assert_eq!(
                point, "committed",
                "the rebase record was written but the old packet still mounts"
            );
            assert_eq!(snapshot(&mnt), want, "after a kill at {point}");
            run(["umount", mnt.to_str().unwrap()]).ok();
        }
    }
}

#[test]
fn a_seal_through_the_control_socket_reports_progress_before_its_answer() {
    // "Progress shows on stderr when it is a terminal": the daemon sends the
    // byte count to a client that asks, before the result.
    if !fuse_available() {
        return;
    }
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let (_, m) = sample_mount(tmp.path());
    fs::write(m.path("new.bin"), vec![7u8; 1 << 20]).unwrap();
    let out = tmp.path().join("s.packet");
    let socket = m.result["control_socket"].as_str().unwrap().to_owned();
    let conn = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let req = serde_json::json!({
        "op": "seal", "output": out, "receipt": null, "rebase": false, "zero_mtimes": false,
        "reject_external_symlinks": false, "exclude": [], "keep": [],
        "max_bytes": 1u64 << 30, "max_entries": 250000, "max_path_bytes": 4096,
        "mode": 0o644, "progress": true,
    });
    (&conn).write_all(format!("{req}\n").as_bytes()).unwrap();
    let lines: Vec<Value> = BufReader::new(&conn)
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let (answer, interim) = lines.split_last().unwrap();
    assert_eq!(answer["schema"], "sessionfs.seal-result/2", "{answer}");
    assert!(!interim.is_empty(), "no progress before the answer");
    let counts: Vec<u64> = interim
        .iter()
        .map(|v| v["progress"]["bytes"].as_u64().unwrap())
        .collect();
    assert!(
        counts[0] > 0 && counts.windows(2).all(|w| w[0] <= w[1]),
        "{counts:?}"
    );
    assert!(out.exists());
    m.umount();
}

/// A seal whose client goes away (killed, or given up by an orchestrator's
/// timeout) before its packet is placed is given up: nothing is written,
/// the mount serves what it served, and the next seal works. Once the
/// packet is placed, the seal runs to its end, the rebase included.
#[test]
fn a_seal_whose_client_goes_away_is_given_up_until_its_packet_is_placed() {
    if !fuse_available() {
        return;
    }
    for (point, placed) in [
        ("collected", false),
        ("written", false),
        ("committed", true),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (packet, _) = model_packet(tmp.path());
        let before = run(["digest", packet.to_str().unwrap()]).ok()["digest"].clone();
        let upper = tmp.path().join("upper");
        let mnt = tmp.path().join("mnt");
        let bar = tmp.path().join("barrier");
        let (_unmount, mounted) = mount_paused_at(&packet, &mnt, &upper, &bar, point);
        let log = std::path::PathBuf::from(mounted["log"].as_str().unwrap());
        let logged = || fs::read_to_string(&log).unwrap_or_default();
        let went_away = |text: &str| text.matches("the seal's client went away").count();
        let seen = went_away(&logged());
        fs::write(mnt.join("made.txt"), b"made on the mount").unwrap();
        let out = tmp.path().join("out/next.packet");
        fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut client = spawn_seal_rebase(&mnt, &out);
        wait_reached(&bar, point);
        client.kill().unwrap();
        client.wait().unwrap();
        wait_for("the daemon to see the client go", || {
            went_away(&logged()) > seen
        });
        fs::write(bar.join(format!("{point}.go")), b"").unwrap();
        // Seals take turns: this one starts once the first has ended.
        let next = tmp.path().join("after.packet");
        let r = run(["seal", mnt.to_str().unwrap(), "-o", next.to_str().unwrap()]);
        assert_eq!(r.ok()["schema"], "sessionfs.seal-result/2");
        run(["verify", next.to_str().unwrap()]).ok();
        let served = run(["status", mnt.to_str().unwrap()]).ok()["digest"].clone();
        if placed {
            let written = run(["verify", out.to_str().unwrap()]).ok()["digest"].clone();
            assert_eq!(served, written, "given up after {point}");
            assert_eq!(r.json["parent"], written);
        } else {
            assert_eq!(
                fs::read_dir(out.parent().unwrap()).unwrap().count(),
                0,
                "given up at {point}: something was left in the output's directory"
            );
            assert_eq!(served, before, "given up at {point}: the mount moved");
            assert_eq!(r.json["parent"], before);
        }
        assert_eq!(
            fs::read(mnt.join("made.txt")).unwrap(),
            b"made on the mount"
        );
        // The log says what became of the seal nobody waited for.
        let said = if placed {
            "the seal ran to its end"
        } else {
            "the seal ended without its client"
        };
        wait_for(said, || logged().contains(said));
        if !placed {
            assert!(logged().contains("kind=\"cancelled\""), "{}", logged());
        }
        run(["umount", mnt.to_str().unwrap()]).ok();
    }
}

/// A seal queued behind another (paused in its walk here) is given up as
/// soon as its client goes away, not when its turn comes: it must not
/// run, and move the mount, long after anyone waited for it.
#[test]
fn a_seal_waiting_for_its_turn_is_given_up_when_its_client_goes_away() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let upper = tmp.path().join("upper");
    let mnt = tmp.path().join("mnt");
    let bar = tmp.path().join("barrier");
    let (_unmount, mounted) = mount_paused_at(&packet, &mnt, &upper, &bar, "collected");
    let log = std::path::PathBuf::from(mounted["log"].as_str().unwrap());
    let logged = || fs::read_to_string(&log).unwrap_or_default();
    fs::write(mnt.join("made.txt"), b"made on the mount").unwrap();
    let first = tmp.path().join("first/first.packet");
    let queued = tmp.path().join("queued/queued.packet");
    for out in [&first, &queued] {
        fs::create_dir_all(out.parent().unwrap()).unwrap();
    }
    let first_client = spawn_seal_rebase(&mnt, &first);
    wait_reached(&bar, "collected");
    let mut queued_client = spawn_seal_rebase(&mnt, &queued);
    let queued_shown = queued.display().to_string();
    wait_for("the daemon to take the queued seal's request", || {
        logged()
            .lines()
            .any(|l| l.contains("seal requested") && l.contains(&queued_shown))
    });
    queued_client.kill().unwrap();
    queued_client.wait().unwrap();
    // The first seal is still paused in its walk: the queued one ends now.
    wait_for(
        "the queued seal to be given up while the first runs",
        || {
            logged().lines().any(|l| {
                l.contains("the seal ended without its client") && l.contains(&queued_shown)
            })
        },
    );
    assert!(!bar.join("collected.go").exists());
    fs::write(bar.join("collected.go"), b"").unwrap();
    let done = first_client.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let written = run(["verify", first.to_str().unwrap()]).ok()["digest"].clone();
    assert_eq!(
        run(["status", mnt.to_str().unwrap()]).ok()["digest"],
        written
    );
    assert_eq!(
        fs::read_dir(queued.parent().unwrap()).unwrap().count(),
        0,
        "the queued seal left something in its output's directory"
    );
    assert_eq!(
        fs::read(mnt.join("made.txt")).unwrap(),
        b"made on the mount"
    );
    run(["umount", mnt.to_str().unwrap()]).ok();
}

/// "A rebase keeps on the mount what a packet cannot hold of the entries
/// it holds: permission bits beyond the executable one, and owners." A
/// file made private on the mount stays private when the mount moves onto
/// the packet, across a remount too; the packet is the same with or
/// without them. And no time the mount showed goes back: a file sealed
/// `--zero-mtimes` keeps its mtime on the mount, across a remount too.
#[test]
fn a_rebase_keeps_modes_and_owners_and_keeps_the_times_it_showed() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_packet, m) = sample_mount(tmp.path());
    fs::write(m.path("private.txt"), b"secret").unwrap();
    // (path, mode, owner)
    type Change = (&'static str, u32, Option<(u32, u32)>);
    let changed: [Change; 6] = [
        ("", 0o750, None), // the mount's root
        ("private.txt", 0o600, None),
        ("README.md", 0o640, Some((1234, 5678))),
        ("src", 0o700, None),
        ("bin/run.sh", 0o750, None),
        ("src/lib/mod.rs", 0o644, Some((4321, 0))),
    ];
    for (rel, mode, owner) in changed {
        chmod(&m.path(rel), mode);
        if let Some((u, g)) = owner {
            std::os::unix::fs::chown(m.path(rel), Some(u), Some(g)).unwrap();
        }
    }
    let shown = |m: &Mounted| -> Vec<(String, u32, u32, u32)> {
        changed
            .iter()
            .map(|(rel, ..)| {
                let md = fs::metadata(m.path(rel)).unwrap();
                (rel.to_string(), md.mode() & 0o7777, md.uid(), md.gid())
            })
            .collect()
    };
    let before = shown(&m);
    for (rel, mode, owner) in changed {
        let (_, shown_mode, uid, gid) = before.iter().find(|b| b.0 == rel).unwrap();
        assert_eq!(*shown_mode, mode, "{rel}");
        if let Some(o) = owner {
            assert_eq!((*uid, *gid), o, "{rel}");
        }
    }
    // The kernel has the lower file's time cached.
    let old_time = fs::metadata(m.path("empty")).unwrap().mtime();
    assert_ne!(old_time, 0);
    let first = seal(&m, &tmp.path().join("first.packet"), &["--rebase"]);
    assert_eq!(shown(&m), before, "after a rebase");
    let again = seal(&m, &tmp.path().join("again.packet"), &[]);
    assert_eq!(again["digest"], first["digest"], "nothing changed since");
    let zero = seal(
        &m,
        &tmp.path().join("zero.packet"),
        &["--rebase", "--zero-mtimes"],
    );
    assert_eq!(m.status()["digest"], zero["digest"]);
    assert_eq!(fs::metadata(m.path("empty")).unwrap().mtime(), old_time);
    assert_eq!(shown(&m), before, "after a second rebase");
    let packet = tmp.path().join("zero.packet");
    let m = m.remount_workspace(&packet);
    assert_eq!(m.status()["digest"], zero["digest"]);
    assert_eq!(shown(&m), before, "after a remount");
    assert_eq!(fs::metadata(m.path("empty")).unwrap().mtime(), old_time);
    // A fresh mount shows the packet's.
    let fresh = Mounted::new(
        &packet,
        &tmp.path().join("fresh/mnt"),
        &tmp.path().join("fresh/upper"),
        &["--part", "workspace"],
    );
    assert_eq!(fs::metadata(fresh.path("empty")).unwrap().mtime(), 0);
}

/// A file removed while open, which a rebase carries on for its holder
/// but the new journal does not hold, takes a `chmod` through its
/// descriptor, and the mount still mounts again afterwards.
#[test]
fn a_change_to_a_file_a_rebase_carried_does_not_fail_the_next_mount() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_packet, m) = sample_mount(tmp.path());
    fs::write(m.path("held.txt"), b"held open").unwrap();
    let held = fs::File::open(m.path("held.txt")).unwrap();
    fs::remove_file(m.path("held.txt")).unwrap();
    let next = tmp.path().join("next.packet");
    seal(&m, &next, &["--rebase"]);
    held.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(held.metadata().unwrap().mode() & 0o777, 0o600);
    let mut read = String::new();
    std::io::Read::read_to_string(&mut &held, &mut read).unwrap();
    assert_eq!(read, "held open");
    drop(held);
    let m = m.remount_workspace(&next);
    assert!(!m.path("held.txt").exists());
    m.umount();
}

/// A directory the rebase gives a time of its own (an entry the packet
/// leaves out is made again in it) shows that time at once, though the
/// kernel had the old one cached.
#[test]
fn a_directory_a_rebase_changes_shows_its_new_time_at_once() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "logs/a.log", b"log");
    write(&ws, "logs/keep.txt", b"kept");
    set_mtime(&ws.join("logs/a.log"), 1_600_000_000_000_000_000);
    set_mtime(&ws.join("logs/keep.txt"), 1_600_000_000_000_000_000);
    let packet = packet_of(&ws, tmp.path(), "p", &[]);
    let m = mount_workspace(&packet, tmp.path());
    assert_eq!(
        fs::metadata(m.path("logs")).unwrap().mtime(),
        1_600_000_000,
        "a packet's directory shows its newest file time"
    );
    seal(
        &m,
        &tmp.path().join("next.packet"),
        &["--rebase", "--exclude", "*.log"],
    );
    assert!(m.path("logs/a.log").exists(), "left out, kept on the mount");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let shown = fs::metadata(m.path("logs")).unwrap().mtime();
    assert!((now - shown).abs() < 600, "shows {shown}, now is {now}");
}
