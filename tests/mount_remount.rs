//! A mount right after an unmount done without `sessionfs umount`
//! (`fusermount3 -u`, `umount`): the daemon that served the upper
//! directory lets its lock go as it exits, some milliseconds after its
//! mount is gone, and the new mount waits for it (docs/CLI.md, `mount`).
//! A daemon still serving the upper directory is refused at once.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Mounts, unmounts with `unmount` (a command given the mountpoint), and
/// mounts again at once, `times` times over, every mount succeeding.
fn remount_after(unmount: &[&str], times: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let (packet, mut m) = sample_mount(tmp.path());
    for round in 0..times {
        fs_write_in(&m, round);
        let (mnt, upper) = (m.mnt.clone(), m.upper.clone());
        succeed(Command::new(unmount[0]).args(&unmount[1..]).arg(&mnt));
        m.unmounted_elsewhere();
        m = Mounted::new(&packet, &mnt, &upper, &["--part", "workspace"]);
        // The new daemon serves what the old one was given.
        let got = std::fs::read_to_string(m.path(&format!("round-{round}"))).unwrap();
        assert_eq!(got, format!("{round}"), "round {round}");
    }
    m.umount();
}

fn fs_write_in(m: &Mounted, round: usize) {
    std::fs::write(m.path(&format!("round-{round}")), format!("{round}")).unwrap();
}

#[test]
fn a_mount_right_after_fusermount3_u_waits_for_the_exiting_daemon() {
    if !fuse_available() {
        return;
    }
    remount_after(&["fusermount3", "-u"], 20);
}

#[test]
fn a_mount_right_after_umount_waits_for_the_exiting_daemon() {
    if !fuse_available() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: only root may unmount with umount(8)");
        return;
    }
    remount_after(&["umount"], 20);
}

#[test]
fn an_upper_directory_a_live_mount_serves_is_refused_at_once_naming_that_mount() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, m) = sample_mount(tmp.path());
    let other = tmp.path().join("mnt2");
    std::fs::create_dir(&other).unwrap();
    let start = Instant::now();
    let r = run([
        "mount".as_ref(),
        packet.as_os_str(),
        other.as_os_str(),
        "--upper".as_ref(),
        m.upper.as_os_str(),
        "--part".as_ref(),
        "workspace".as_ref(),
    ]);
    let e = r.fails(7, "upper_refused");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "refused only after {:?}",
        start.elapsed()
    );
    let message = e["message"].as_str().unwrap();
    let mnt = m.mnt.display().to_string();
    assert!(message.contains(&mnt), "{message}");
    assert!(
        message.contains(&format!("daemon pid {}", m.pid())),
        "{message}"
    );
    assert!(
        e["hint"]
            .as_str()
            .unwrap()
            .contains(&format!("sessionfs umount {mnt}")),
        "{e}"
    );
    assert!(!umount_is_mounted(&other));
    m.umount();
}

/// An offline seal right after `fusermount3 -u` waits for the exiting
/// daemon too (docs/CLI.md, `seal`): it reads the upper directory the
/// mount left, the moment the mount is gone.
#[test]
fn an_offline_seal_right_after_fusermount3_u_waits_for_the_exiting_daemon() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, mut m) = sample_mount(tmp.path());
    for round in 0..20 {
        fs_write_in(&m, round);
        let (mnt, upper) = (m.mnt.clone(), m.upper.clone());
        succeed(Command::new("fusermount3").arg("-u").arg(&mnt));
        m.unmounted_elsewhere();
        let out = tmp.path().join(format!("round-{round}.packet"));
        seal_offline(&packet, &upper, &out, &[]).ok();
        m = Mounted::new(&packet, &mnt, &upper, &["--part", "workspace"]);
    }
    m.umount();
}

fn umount_is_mounted(p: &std::path::Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == p.to_str())
}
