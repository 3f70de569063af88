//! What a new user tripped over, tried as a new user would (issue 24,
//! item 11): each test is named after the surprise it guards against.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use common::*;
use sessionfs::api::{Caller, ROOT};

const ME: Caller = Caller { uid: 0, gid: 0 };

/// The names in runtime directory `run`'s `sessionfs/` (see
/// docs/CLI.md, the control socket).
fn runtime_files(run: &Path) -> Vec<String> {
    let dir = run.join("sessionfs");
    if !dir.exists() {
        return Vec::new();
    }
    names_in(&dir, |_| true)
}

/// `sessionfs mount PACKET MNT --upper UPPER extra…`, its runtime
/// directory `run` (through `XDG_RUNTIME_DIR`).
fn mount_in(run: &Path, packet: &Path, mnt: &Path, upper: &Path, extra: &[&str]) -> Run {
    fs::create_dir_all(run).unwrap();
    let mut args: Vec<&OsStr> = vec![
        "mount".as_ref(),
        packet.as_os_str(),
        mnt.as_os_str(),
        "--upper".as_ref(),
        upper.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    run_env(&args, &[("XDG_RUNTIME_DIR", run.to_str().unwrap())])
}

/// A packet of [`sample_tree`] in a new temporary directory, an empty
/// mountpoint and a runtime directory there.
fn to_mount() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let packet = sample_packet(tmp.path());
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let run_dir = tmp.path().join("run");
    (tmp, packet, mnt, run_dir)
}

#[test]
fn an_upper_directory_whose_parent_is_missing_is_refused_naming_the_parent() {
    let (tmp, packet, mnt, run_dir) = to_mount();
    let upper = tmp.path().join("state/session/upper");
    let r = mount_in(&run_dir, &packet, &mnt, &upper, &["--part", "workspace"]);
    let e = r.fails(7, "target_unusable");
    let parent = tmp.path().join("state/session");
    assert_eq!(e["path"], parent.to_str().unwrap(), "{e}");
    assert!(
        e["hint"]
            .as_str()
            .unwrap()
            .contains(&format!("mkdir -p {}", parent.display())),
        "{e}"
    );
    assert!(!tmp.path().join("state").exists());
    assert_eq!(runtime_files(&run_dir), Vec::<String>::new());
}

#[test]
fn a_mount_refused_by_its_daemon_leaves_no_upper_directory_and_no_log() {
    let (tmp, packet, mnt, run_dir) = to_mount();
    let upper = tmp.path().join("upper");
    // The packet has no harness part: refused by the daemon it started.
    let r = mount_in(&run_dir, &packet, &mnt, &upper, &["--part", "harness"]);
    r.fails(7, "part_missing");
    assert!(!upper.exists());
    assert_eq!(runtime_files(&run_dir), Vec::<String>::new());
}

#[test]
fn mount_takes_uid_and_gid_together_as_unpack_does() {
    let (tmp, packet, mnt, run_dir) = to_mount();
    let upper = tmp.path().join("upper");
    for flag in ["--uid", "--gid"] {
        let r = mount_in(&run_dir, &packet, &mnt, &upper, &[flag, "1000"]);
        r.fails(2, "usage");
        let u = run([
            "unpack",
            packet.to_str().unwrap(),
            "--into",
            "x",
            flag,
            "1000",
        ]);
        u.fails(2, "usage");
    }
    assert!(!upper.exists());
}

#[test]
fn keep_lifts_the_key_rule_in_any_case_as_the_rule_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "CERT.PEM", b"-----BEGIN CERTIFICATE-----\n");
    write(&ws, "id_rsa", b"key\n");
    let out = tmp.path().join("p.packet");
    let v = pack(&ws, &out, &[]);
    assert_eq!(
        excluded_paths(&v),
        ["workspace/CERT.PEM", "workspace/id_rsa"]
    );
    // The report names the rule `*.pem`: `--keep '*.pem'` lifts it.
    assert_eq!(v["excluded"][0]["reason"]["what"], "*.pem", "{v}");
    let v = pack(&ws, &out, &["--keep", "*.pem", "--keep", "ID_RSA"]);
    assert_eq!(excluded_paths(&v), ["workspace/id_rsa"], "{v}");
}

#[test]
fn a_utf8_name_with_a_backslash_is_shown_apart_from_the_name_with_that_byte() {
    let tmp = tempfile::tempdir().unwrap();
    // `caf\xe9` typed literally: UTF-8, with a backslash (refused by the
    // path rules).
    let typed = tmp.path().join("typed");
    write(&typed, "caf\\xe9", b"x");
    let out = tmp.path().join("p.packet");
    let args = |ws: &Path| {
        vec![
            "pack".to_owned(),
            "--workspace".to_owned(),
            ws.to_str().unwrap().to_owned(),
            "-o".to_owned(),
            out.to_str().unwrap().to_owned(),
        ]
    };
    let a = run(args(&typed));
    let a = a.fails(7, "invalid_path");
    // The non-UTF-8 name `caf` + byte 0xe9.
    let raw = tmp.path().join("raw");
    fs::create_dir(&raw).unwrap();
    fs::write(raw.join(OsStr::from_bytes(b"caf\xe9")), b"x").unwrap();
    let b = run(args(&raw));
    let b = b.fails(7, "non_utf8_name");
    assert_eq!(a["path"], "workspace/caf\\\\xe9", "{a}");
    assert_eq!(b["path"], "workspace/caf\\xe9", "{b}");
}

#[test]
fn the_seal_result_counts_changes_in_the_receipts_words() {
    let tmp = tempfile::tempdir().unwrap();
    let packet = sample_packet(tmp.path());
    let upper = tmp.path().join("upper");
    {
        let o = overlay_of(&packet, &upper);
        let readme = o.lookup(ROOT, b"README.md").unwrap().ino;
        o.write(readme, 0, b"edited").unwrap();
        o.unlink(ROOT, b"empty").unwrap();
        let new = o.create(ROOT, b"new.txt", 0o644, ME).unwrap().ino;
        o.write(new, 0, b"new").unwrap();
    }
    let out = tmp.path().join("s.packet");
    let receipt = tmp.path().join("r.json");
    let r = seal_offline(
        &packet,
        &upper,
        &out,
        &["--receipt", receipt.to_str().unwrap()],
    );
    let v = r.ok();
    let receipt: serde_json::Value = serde_json::from_slice(&fs::read(&receipt).unwrap()).unwrap();
    let ops: Vec<&str> = receipt["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["op"].as_str().unwrap())
        .collect();
    for word in ["added", "modified", "deleted", "renamed"] {
        let n = ops.iter().filter(|op| **op == word).count() as u64;
        assert_eq!(v[word], n, "{word}: {v} against {receipt}");
    }
    assert_eq!(
        (
            v["added"].as_u64(),
            v["modified"].as_u64(),
            v["deleted"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
    assert!(
        v.get("changed").is_none() && v.get("removed").is_none(),
        "{v}"
    );
}

#[test]
fn a_dev_fuse_this_user_cannot_open_is_named_with_its_mode_and_owner() {
    if !fuse_available() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED: needs root, to give a private mount namespace a /dev/fuse of mode 0600"
        );
        return;
    }
    let (tmp, packet) = readable_by_nobody();
    let t = tmp.path();
    let (mnt, state, run_dir, dev) = (t.join("mnt"), t.join("state"), t.join("run"), t.join("dev"));
    for d in [&mnt, &state, &run_dir] {
        own(d);
    }
    fs::create_dir(&dev).unwrap();
    let upper = state.join("upper");
    // Some machines ship /dev/fuse as root's, mode 0600.
    let script = format!(
        "set -e; mount --make-rprivate /; mount -t tmpfs none {dev}; \
         mknod -m 0600 {dev}/fuse c 10 229; mount --bind {dev}/fuse /dev/fuse; \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups \
         env XDG_RUNTIME_DIR={run} {bin} mount {packet} {mnt} --upper {upper}",
        dev = dev.display(),
        run = run_dir.display(),
        bin = bin().display(),
        packet = packet.display(),
        mnt = mnt.display(),
        upper = upper.display(),
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("{}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(
        (out.status.code(), e["kind"].as_str()),
        (Some(8), Some("mount_failed")),
        "{e}"
    );
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("/dev/fuse (mode 0600, owner uid 0 gid 0)"),
        "{e}"
    );
    assert!(message.contains("uid 65534"), "{e}");
    assert!(
        e["hint"].as_str().unwrap().contains("chmod 0666 /dev/fuse"),
        "{e}"
    );
    // A failed mount leaves behind no upper directory it made, and no log.
    assert!(!upper.exists(), "{e}");
    assert_eq!(runtime_files(&run_dir), Vec::<String>::new());
}

/// Issue 24, item 11: root can ask another user's mount (`status`, `seal`,
/// `umount`): its daemon's socket is in the owner's runtime directory,
/// found from the mount table's `user_id`, and the daemon answers root.
#[test]
fn root_reaches_another_users_mount() {
    if !fuse_available() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root, to mount as another user and ask as root");
        return;
    }
    let (tmp, packet) = readable_by_nobody();
    let t = tmp.path();
    let (mnt, state, dev) = (t.join("mnt"), t.join("state"), t.join("dev"));
    own(&mnt);
    own(&state);
    fs::create_dir(&dev).unwrap();
    // (The daemon, running as its owner, writes the packet.)
    let sealed = state.join("sealed.packet");
    // nobody mounts (a /dev/fuse it may open, in a mount namespace of the
    // test's own; no XDG_RUNTIME_DIR, as for a pod's agent user), writes,
    // and root asks: status, seal, umount, one JSON line each.
    let script = format!(
        "set -e; mount --make-rprivate /; mount -t tmpfs none {dev}; \
         mknod -m 0666 {dev}/fuse c 10 229; mount --bind {dev}/fuse /dev/fuse; \
         setpriv --reuid=65534 --regid=65534 --clear-groups env -u XDG_RUNTIME_DIR \
           {bin} mount {packet} {mnt} --upper {state}/upper --part workspace >/dev/null; \
         trap 'umount -l {mnt} 2>/dev/null || true' EXIT; \
         setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo new > {mnt}/new.txt'; \
         {bin} status {mnt}; echo; {bin} seal {mnt} -o {sealed}; echo; {bin} umount {mnt}; echo",
        dev = dev.display(),
        bin = bin().display(),
        packet = packet.display(),
        mnt = mnt.display(),
        state = state.display(),
        sealed = sealed.display(),
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        3,
        "{lines:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        lines[0]["schema"], "sessionfs.status-result/2",
        "{}",
        lines[0]
    );
    assert_eq!(lines[0]["digest"], sample_digest(&packet), "{}", lines[0]);
    assert_eq!(lines[1]["added"], 1, "{}", lines[1]);
    assert_eq!(lines[2]["unmounted"], true, "{}", lines[2]);
    assert!(sealed.is_file());
}

fn sample_digest(packet: &Path) -> String {
    let out = std::process::Command::new(bin())
        .args(["digest", packet.to_str().unwrap()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["digest"].as_str().unwrap().to_owned()
}

/// A directory any user may enter, with the sample packet readable by all:
/// for the tests that mount as `nobody` (65534).
fn readable_by_nobody() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let packet = sample_packet(tmp.path());
    chmod(&packet, 0o644);
    (tmp, packet)
}

/// Makes `p` (and its parents) and gives it to `nobody`: everything that
/// user mounts with is its own.
fn own(p: &Path) {
    fs::create_dir_all(p).unwrap();
    std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
}
