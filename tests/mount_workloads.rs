//! What a coding agent runs, on a mount of a packet made from a real git
//! repository: git, cargo, an editor's save, sqlite in WAL mode, tar; and a
//! non-root agent on a mount made for it.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

/// A git repository holding a small Rust crate.
fn repo(root: &Path) {
    write(
        root,
        "Cargo.toml",
        b"[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    write(
        root,
        "src/main.rs",
        b"fn main() {\n    println!(\"hello from the mount\");\n}\n",
    );
    write(root, "README.md", b"# demo\n");
    sh(
        root,
        &format!(
            "{GIT} init -q . && {GIT} add -A && {GIT} commit -qm first && {GIT} branch other && {GIT} checkout -q other && echo other > OTHER && {GIT} add OTHER && {GIT} commit -qm other && {GIT} checkout -q main"
        ),
    );
}

#[test]
fn git_cargo_editor_sqlite_and_tar_work_on_a_mount() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    repo(&ws);
    let packet = packet_of(&ws, tmp.path(), "repo", &[]);
    let m = Mounted::new(
        &packet,
        &tmp.path().join("mnt"),
        &tmp.path().join("upper"),
        &["--part", "workspace"],
    );
    let w = &m.mnt;

    // git: status, add, commit, checkout of another branch.
    assert_eq!(sh(w, "git status --porcelain"), "");
    sh(w, "echo 'fn helper() {}' >> src/main.rs");
    assert_eq!(sh(w, "git status --porcelain"), " M src/main.rs\n");
    sh(w, &format!("{GIT} add -A && {GIT} commit -qm edit"));
    assert_eq!(sh(w, "git log --format=%s"), "edit\nfirst\n");
    sh(w, &format!("{GIT} checkout -q other"));
    assert_eq!(fs::read(m.path("OTHER")).unwrap(), b"other\n");
    sh(w, &format!("{GIT} checkout -q main"));
    assert!(!m.path("OTHER").exists());
    assert_eq!(sh(w, "git status --porcelain"), "");
    sh(w, "git fsck --no-progress");

    // cargo build of a small crate, target directory on the mount.
    let out = sh(
        w,
        "CARGO_TARGET_DIR=target cargo build --quiet --offline 2>&1 && ./target/debug/demo",
    );
    assert!(out.contains("hello from the mount"), "{out}");

    // An editor's save: write a temporary file, fsync, rename over.
    let py = r##"
import os, sys
p = sys.argv[1]
tmp = p + ".swp"
with open(tmp, "w") as f:
    f.write("# saved by an editor\n"); f.flush(); os.fsync(f.fileno())
os.rename(tmp, p)
d = os.open(os.path.dirname(p), os.O_RDONLY); os.fsync(d); os.close(d)
"##;
    let st = Command::new("python3")
        .arg("-c")
        .arg(py)
        .arg(m.path("README.md"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        fs::read(m.path("README.md")).unwrap(),
        b"# saved by an editor\n"
    );
    assert!(!m.path("README.md.swp").exists());

    // sqlite3 in WAL mode.
    let out = sh(
        w,
        "sqlite3 app.db 'PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1),(2),(3);' && \
         sqlite3 app.db 'INSERT INTO t SELECT x*10 FROM t; SELECT sum(x) FROM t; PRAGMA integrity_check;'",
    );
    assert!(
        out.contains("wal") && out.contains("66") && out.contains("ok"),
        "{out}"
    );

    // tar -c of the mount lists every file, with the bytes read back.
    let tarball = tmp.path().join("mount.tar");
    sh(
        w,
        &format!("tar -cf {} --exclude=./target .", tarball.display()),
    );
    let listing = sh(tmp.path(), &format!("tar -tf {}", tarball.display()));
    for want in [
        "./Cargo.toml",
        "./src/main.rs",
        "./README.md",
        "./.git/HEAD",
        "./app.db",
    ] {
        assert!(
            listing.lines().any(|l| l == want),
            "{want} missing from tar -c"
        );
    }
    let x = tmp.path().join("x");
    fs::create_dir(&x).unwrap();
    sh(&x, &format!("tar -xf {} ./src/main.rs", tarball.display()));
    assert_eq!(
        fs::read(x.join("src/main.rs")).unwrap(),
        fs::read(m.path("src/main.rs")).unwrap()
    );
    m.umount();
}

#[test]
fn a_non_root_agent_can_use_a_mount_made_for_it() {
    // "Files appear owned by the mounting user (or --uid/--gid), with the
    // packet's modes: a non-root agent can use a mount made for it."
    if !fuse_available() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to mount for another user");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let ws = tmp.path().join("ws");
    repo(&ws);
    let packet = packet_of(&ws, tmp.path(), "repo", &[]);
    // `nobody` (65534) works in the workspace as if it were its own.
    let m = Mounted::new(
        &packet,
        &tmp.path().join("mnt"),
        &tmp.path().join("upper"),
        &[
            "--part",
            "workspace",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--allow-other",
        ],
    );
    let script = format!(
        "cd {} && echo change >> README.md && mkdir newdir && echo x > newdir/f && mv src/main.rs src/moved.rs && \
         HOME=/tmp {GIT} -c safe.directory='*' status --porcelain | sort",
        m.mnt.display()
    );
    let out = succeed(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "sh",
        "-ec",
        &script,
    ]));
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains(" M README.md") && status.contains("?? newdir/"),
        "{status}"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(m.path("newdir/f")).unwrap().uid(), 65534);
    m.umount();
}

/// The inode numbers of the tracked worktree files of the repository at `w`.
fn tracked_inodes(w: &Path) -> std::collections::BTreeMap<u64, String> {
    use std::os::unix::fs::MetadataExt;
    sh(w, "git ls-files")
        .lines()
        .map(|f| (fs::metadata(w.join(f)).unwrap().ino(), f.to_owned()))
        .collect()
}

/// The tracked files the daemon of `m` was asked to read since it started.
fn tracked_files_opened(m: &Mounted) -> Vec<String> {
    let tracked = tracked_inodes(&m.mnt);
    let status = m.status();
    assert_eq!(status["schema"], "sessionfs.status-result/2");
    let opened = status["read_inodes"].as_array().unwrap();
    let mut files: Vec<String> = opened
        .iter()
        .filter_map(|i| tracked.get(&i.as_u64().unwrap()).cloned())
        .collect();
    files.sort();
    files.dedup();
    files
}

#[test]
fn git_status_after_seal_and_remount_elsewhere_reads_no_unchanged_file() {
    // "git's index, refreshed once on a mount, still matches after seal and
    // remount elsewhere: `git status` right after resuming from a sealed
    // packet reads no unchanged file. ... Test it by counting the file reads
    // on the mount."
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    for d in 0..10 {
        for f in 0..20 {
            write(
                &ws,
                &format!("dir{d}/sub/file{f}.txt"),
                format!("file {f} of directory {d}\n")
                    .repeat(f + 1)
                    .as_bytes(),
            );
        }
    }
    // Sources older than the index, as in a real session: git compares
    // whole seconds, and re-reads ("racily clean") files whose mtime is not
    // older than the index whatever the filesystem does.
    sh(
        &ws,
        &format!(
            "{GIT} init -q . && {GIT} add -A && {GIT} commit -qm first && \
             find . -path ./.git -prune -o -type f -exec touch -d '1 hour ago' {{}} +"
        ),
    );
    let packet = packet_of(&ws, tmp.path(), "repo", &[]);

    // First placement: the index was made natively, so every stat differs
    // and git re-reads every file once (the measure can see reads).
    let m = Mounted::new(
        &packet,
        &tmp.path().join("first/mnt"),
        &tmp.path().join("first/upper"),
        &["--part", "workspace"],
    );
    assert_eq!(sh(&m.mnt, "git status --porcelain"), "");
    let first = tracked_files_opened(&m);
    assert!(
        first.len() >= 200,
        "git on a stale index read only {} files",
        first.len()
    );
    sh(&m.mnt, "git update-index -q --refresh");
    let sealed = tmp.path().join("sealed.packet");
    run([
        "seal",
        m.mnt.to_str().unwrap(),
        "-o",
        sealed.to_str().unwrap(),
    ])
    .ok();
    m.umount();

    // Second placement: another mountpoint, a fresh upper directory.
    let m = Mounted::new(
        &sealed,
        &tmp.path().join("elsewhere/mnt"),
        &tmp.path().join("elsewhere/upper"),
        &["--part", "workspace"],
    );
    assert_eq!(sh(&m.mnt, "git status --porcelain"), "");
    let second = tracked_files_opened(&m);
    assert!(
        second.is_empty(),
        "git status after resuming read {} unchanged files: {second:?}",
        second.len()
    );
    // A real change is still seen, by reading that one file.
    fs::write(m.path("dir3/sub/file7.txt"), b"changed\n").unwrap();
    assert_eq!(
        sh(&m.mnt, "git status --porcelain"),
        " M dir3/sub/file7.txt\n"
    );
    m.umount();
}
