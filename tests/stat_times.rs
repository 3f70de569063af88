//! Stat fidelity across seals and rebases (docs/SEMANTICS.md, "Times"):
//! git, make and cargo decide what changed from stat data, so a file whose
//! content changed must never show the stat data recorded for its old
//! content, on the same mount, after a rebase or on a fresh mount of the
//! sealed packet, in either mtime mode; an unchanged file shows the same
//! stat data on every mount; and the times a mount has shown never go
//! back across a rebase.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// What git compares of a file (besides its mode, owner and device):
/// `(ino, mtime ns, ctime ns, size)`.
fn git_stat(path: &Path) -> (u64, i128, i128, u64) {
    let md = fs::symlink_metadata(path).unwrap();
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (
        md.ino(),
        ns(md.mtime(), md.mtime_nsec()),
        ns(md.ctime(), md.ctime_nsec()),
        md.size(),
    )
}

/// `(mtime ns, ctime ns)` of `path`, not following a symlink.
fn times(path: &Path) -> (i128, i128) {
    let (_, m, c, _) = git_stat(path);
    (m, c)
}

/// The seal options of a mode: `--zero-mtimes` or none, `--rebase` or none.
fn seal_args(zero: bool, rebase: bool) -> Vec<&'static str> {
    let mut args = Vec::new();
    if zero {
        args.push("--zero-mtimes");
    }
    if rebase {
        args.push("--rebase");
    }
    args
}

/// A mount of `packet`'s workspace at `tmp/name/mnt` with a new upper
/// directory `tmp/name/upper`: a fresh placement.
#[track_caller]
fn placed(packet: &Path, tmp: &Path, name: &str) -> Mounted {
    Mounted::new(
        packet,
        &tmp.join(name).join("mnt"),
        &tmp.join(name).join("upper"),
        &["--part", "workspace"],
    )
}

/// Whether `git diff --quiet` finds a difference in `dir`.
fn git_diff_differs(dir: &Path) -> bool {
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("{GIT} diff --quiet"))
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(matches!(st.code(), Some(0 | 1)), "git diff: {st}");
    st.code() == Some(1)
}

/// The issue's reproducer, in one of four modes: a same-size edit, sealed,
/// is seen by `git status`, `git diff` and `git commit -a` on the mount the
/// turn goes on with (the same one after `--rebase`, else a fresh mount of
/// the packet) and on a fresh mount of the sealed packet; an unchanged file
/// shows the same stat data on both.
fn git_sees_a_same_size_edit(zero: bool, rebase: bool) {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let ws = tmp.join("ws");
    write(&ws, "README.md", b"hello\n");
    write(&ws, "keep.txt", b"never changed\n");
    write(&ws, "src/lib.rs", b"pub fn f() {}\n");
    let mode: &[&str] = if zero { &["--zero-mtimes"] } else { &[] };
    let base = packet_of(&ws, tmp, "base", mode);
    let m = placed(&base, tmp, "first");
    sh(
        &m.mnt,
        &format!("{GIT} init -q . && {GIT} add -A && {GIT} commit -qm init"),
    );
    let p1 = tmp.join("p1.packet");
    m.seal(&p1, &seal_args(zero, rebase));
    // Where the turn goes on: the same mount, or a fresh one of p1.
    let m = if rebase {
        m
    } else {
        m.umount();
        placed(&p1, tmp, "second")
    };
    assert_eq!(sh(&m.mnt, &format!("{GIT} status --porcelain")), "");
    let keep = git_stat(&m.path("keep.txt"));
    fs::write(m.path("README.md"), b"hellO\n").unwrap();
    assert_eq!(
        sh(&m.mnt, &format!("{GIT} status --porcelain")),
        " M README.md\n"
    );
    let p2 = tmp.join("p2.packet");
    m.seal(&p2, &seal_args(zero, rebase));
    if rebase {
        assert_eq!(
            sh(&m.mnt, &format!("{GIT} status --porcelain")),
            " M README.md\n",
            "on the mount, after the rebase"
        );
        assert!(git_diff_differs(&m.mnt));
    }

    // A fresh mount of the sealed packet, elsewhere.
    let f = placed(&p2, tmp, "fresh");
    assert_eq!(
        sh(&f.mnt, &format!("{GIT} status --porcelain")),
        " M README.md\n",
        "on a fresh mount of the sealed packet"
    );
    assert!(git_diff_differs(&f.mnt));
    let (ino, mtime, ctime, size) = git_stat(&f.path("keep.txt"));
    assert_eq!(
        (mtime, ctime, size),
        (keep.1, keep.2, keep.3),
        "an unchanged file shows the same times on every mount"
    );
    if !rebase {
        // (On the same path, the same number: the mounts are elsewhere.)
        assert_eq!(ino, git_stat(&m.path("keep.txt")).0);
    }
    sh(&f.mnt, &format!("{GIT} commit -qam edit"));
    assert_eq!(sh(&f.mnt, &format!("{GIT} status --porcelain")), "");
    assert_eq!(sh(&f.mnt, "cat README.md"), "hellO\n");
    if rebase {
        sh(&m.mnt, &format!("{GIT} commit -qam edit"));
        assert_eq!(sh(&m.mnt, &format!("{GIT} status --porcelain")), "");
    }
}

#[test]
fn git_sees_a_same_size_edit_sealed_with_zero_mtimes_and_rebase() {
    git_sees_a_same_size_edit(true, true);
}

#[test]
fn git_sees_a_same_size_edit_sealed_with_zero_mtimes_on_a_fresh_mount() {
    git_sees_a_same_size_edit(true, false);
}

#[test]
fn git_sees_a_same_size_edit_sealed_with_rebase() {
    git_sees_a_same_size_edit(false, true);
}

#[test]
fn git_sees_a_same_size_edit_sealed_and_mounted_afresh() {
    git_sees_a_same_size_edit(false, false);
}

/// "The ctime a lower file or symlink shows is a stamp of its content":
/// files and symlinks with the same content show the same ctime in two
/// packets, others do not, and a stamp is never in the future.
#[test]
fn a_lower_ctime_is_a_stamp_of_the_content() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let ws = tmp.join("ws");
    write(&ws, "a.txt", b"same\n");
    write(&ws, "b.txt", b"other\n");
    std::os::unix::fs::symlink("a.txt", ws.join("link")).unwrap();
    let one = packet_of(&ws, tmp, "one", &[]);
    fs::write(ws.join("b.txt"), b"OTHER\n").unwrap();
    set_mtime(&ws.join("a.txt"), 1_000_000_000_000_000_000);
    let two = packet_of(&ws, tmp, "two", &["--zero-mtimes"]);
    let m1 = placed(&one, tmp, "one");
    let m2 = placed(&two, tmp, "two");
    let ctime = |m: &Mounted, rel: &str| times(&m.path(rel)).1;
    assert_eq!(ctime(&m1, "a.txt"), ctime(&m2, "a.txt"), "same content");
    assert_eq!(ctime(&m1, "link"), ctime(&m2, "link"), "same target");
    assert_ne!(ctime(&m1, "b.txt"), ctime(&m2, "b.txt"), "new content");
    assert_ne!(ctime(&m1, "a.txt"), ctime(&m1, "b.txt"));
    assert_ne!(times(&m2.path("a.txt")).0, times(&m1.path("a.txt")).0);
    for rel in ["a.txt", "b.txt", "link"] {
        assert!(ctime(&m1, rel) < (1i128 << 30) * 1_000_000_000, "{rel}");
    }
}

/// The entries whose times the tests below follow.
const FOLLOWED: [&str; 7] = [
    "",
    "pkg",
    "pkg/new_mod.py",
    "edited.txt",
    "pristine.txt",
    "moved",
    "link",
];

/// The issue's Python reproducer: a long-lived interpreter imports a module
/// renamed during the turn after `seal --rebase`; and every followed time
/// never goes back across rebases (in both mtime modes) and a remount.
#[test]
fn directory_times_do_not_go_back_at_a_rebase() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let ws = tmp.join("ws");
    write(&ws, "edited.txt", b"before\n");
    write(&ws, "pristine.txt", b"untouched\n");
    write(&ws, "dir/inner.txt", b"inner\n");
    let base = packet_of(&ws, tmp, "base", &[]);
    let m = placed(&base, tmp, "m");
    fs::create_dir(m.path("pkg")).unwrap();
    fs::write(m.path("pkg/old_mod.py"), b"A = 1\n").unwrap();
    m.seal(&tmp.join("p1.packet"), &["--rebase"]);

    let p2 = tmp.join("p2.packet");
    let imported = python(
        r#"
import os, subprocess, sys
sessionfs, mnt, out = sys.argv[1:]
sys.path.insert(0, os.path.join(mnt, "pkg"))
import old_mod
os.rename(os.path.join(mnt, "pkg/old_mod.py"), os.path.join(mnt, "pkg/new_mod.py"))
subprocess.run([sessionfs, "seal", mnt, "-o", out, "--rebase"], check=True, capture_output=True)
import new_mod
print(new_mod.A)
"#,
        &[bin().as_os_str(), m.mnt.as_os_str(), p2.as_os_str()],
    );
    assert_eq!(imported, "1");

    // Times the mount showed stay, through rebases in both modes.
    fs::write(m.path("edited.txt"), b"after!\n").unwrap();
    fs::rename(m.path("dir"), m.path("moved")).unwrap();
    std::os::unix::fs::symlink("edited.txt", m.path("link")).unwrap();
    let shown = |m: &Mounted| -> Vec<(i128, i128)> {
        FOLLOWED.iter().map(|rel| times(&m.path(rel))).collect()
    };
    let before = shown(&m);
    let p3 = tmp.join("p3.packet");
    m.seal(&p3, &["--rebase", "--zero-mtimes"]);
    let after = shown(&m);
    for ((rel, b), a) in FOLLOWED.iter().zip(&before).zip(&after) {
        assert!(
            a.0 >= b.0 && a.1 >= b.1,
            "{rel:?} went back: {b:?} -> {a:?}"
        );
    }
    assert_eq!(
        times(&m.path("edited.txt")),
        before[3],
        "a zero-mtime seal leaves the mount's times"
    );
    m.seal(&tmp.join("p4.packet"), &["--rebase"]);
    let again = shown(&m);
    for ((rel, b), a) in FOLLOWED.iter().zip(&after).zip(&again) {
        assert!(
            a.0 >= b.0 && a.1 >= b.1,
            "{rel:?} went back: {b:?} -> {a:?}"
        );
    }
    // The same upper directory mounted again goes on as the mount was.
    let m = m.remount_workspace(&tmp.join("p4.packet"));
    assert_eq!(shown(&m), again, "after a remount");

    // A fresh mount shows the packet's times: zero mtimes, content stamps.
    let f = placed(&p3, tmp, "fresh");
    assert_eq!(times(&f.path("edited.txt")).0, 0);
    assert_eq!(times(&f.path("pkg")).0, 0, "the newest file time is 0");
}

/// "Times before 1970 keep their sign": `1969-12-31 23:59:59.25` reads
/// back as -0.75 s, on the mount, after a remount and in the seal's
/// report; a time past what the mount holds (2^40 s) is clamped to
/// 2262-04-11, its last nanosecond.
#[test]
fn times_before_1970_keep_their_sign_and_far_future_ones_clamp() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    let mtime_ns = |p: PathBuf| {
        let md = fs::metadata(p).unwrap();
        i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec())
    };
    let before = m.path("README.md");
    let after = m.path("bin/run.sh");
    sh(
        &m.mnt,
        "touch -d '1969-12-31 23:59:59.25 UTC' README.md && \
         touch -d @1099511627776 bin/run.sh && mkdir old && \
         touch -d '1969-12-31 23:59:59.25 UTC' old",
    );
    assert_eq!(mtime_ns(before.clone()), -750_000_000);
    assert_eq!(mtime_ns(m.path("old")), -750_000_000);
    assert_eq!(mtime_ns(after.clone()), i128::from(i64::MAX));
    let m = m.remount_workspace(&packet);
    assert_eq!(mtime_ns(m.path("README.md")), -750_000_000, "remounted");
    assert_eq!(mtime_ns(m.path("old")), -750_000_000, "remounted");
    assert_eq!(mtime_ns(m.path("bin/run.sh")), i128::from(i64::MAX));
    let sealed = m.seal(&tmp.path().join("s.packet"), &[]);
    let clamped: Vec<&str> = sealed["clamped_mtimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        clamped,
        ["workspace/README.md", "workspace/bin/run.sh"],
        "{sealed:#}"
    );
}

/// What make and cargo decide after a source was edited and sealed without
/// a rebuild (docs/SEMANTICS.md, "Times"): with mtimes kept they rebuild
/// on a fresh mount; with `--zero-mtimes` every time there is 0 and both
/// take the old output as up to date, while the mount that sealed with
/// `--rebase` keeps its times and still rebuilds.
fn build_tools_after_an_unbuilt_edit(zero: bool) {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let ws = tmp.join("ws");
    write(&ws, "Makefile", b"out: in\n\tcp in out\n");
    write(&ws, "in", b"v1\n");
    write(
        &ws,
        "Cargo.toml",
        b"[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    write(&ws, "src/main.rs", b"fn main() { println!(\"v1\"); }\n");
    let mode: &[&str] = if zero { &["--zero-mtimes"] } else { &[] };
    let base = packet_of(&ws, tmp, "base", mode);
    let mnt = tmp.join("mnt");
    let m = Mounted::new(&base, &mnt, &tmp.join("u1"), &["--part", "workspace"]);
    // (The target directory on the mount, whatever the caller's environment says.)
    let build = "make -s out >/dev/null && CARGO_TARGET_DIR=target cargo build -q --offline \
                 && ./target/debug/demo";
    assert_eq!(sh(&m.mnt, build), "v1\n");
    // An edit nothing builds before the seal.
    fs::write(m.path("in"), b"v2\n").unwrap();
    fs::write(m.path("src/main.rs"), b"fn main() { println!(\"v2\"); }\n").unwrap();
    let sealed = tmp.join("sealed.packet");
    let mut args = vec!["--rebase"];
    args.extend(mode);
    m.seal(&sealed, &args);
    // What each tool decides: make's question (`-q`: 0 up to date, 1 not)
    // and what cargo's binary prints after `cargo build`.
    let decide = |dir: &Path| -> (i32, String) {
        let q = Command::new("make")
            .args(["-q", "out"])
            .current_dir(dir)
            .status()
            .unwrap();
        (q.code().unwrap(), sh(dir, build))
    };
    assert_eq!(
        decide(&m.mnt),
        (1, "v2\n".into()),
        "the mount that sealed keeps its times"
    );
    // The same path, a fresh upper: cargo's records name absolute paths.
    let sealed_again = tmp.join("again.packet");
    fs::write(m.path("in"), b"v3\n").unwrap();
    fs::write(m.path("src/main.rs"), b"fn main() { println!(\"v3\"); }\n").unwrap();
    m.seal(&sealed_again, mode);
    m.umount();
    let f = Mounted::new(
        &sealed_again,
        &mnt,
        &tmp.join("u2"),
        &["--part", "workspace"],
    );
    let expected = if zero {
        (0, "v2\n".to_string())
    } else {
        (1, "v3\n".to_string())
    };
    assert_eq!(
        decide(&f.mnt),
        expected,
        "a fresh mount, zero mtimes {zero}"
    );
}

#[test]
fn make_and_cargo_rebuild_an_unbuilt_edit_when_mtimes_are_kept() {
    build_tools_after_an_unbuilt_edit(false);
}

#[test]
fn make_and_cargo_miss_an_unbuilt_edit_on_a_fresh_mount_of_zero_mtimes() {
    build_tools_after_an_unbuilt_edit(true);
}
