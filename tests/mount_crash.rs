//! "The upper directory must survive the daemon being killed (SIGKILL) at
//! any moment: a write that returned to the application is in the upper
//! file; a metadata change is on disk before the reply; a re-mount of the
//! same packet and upper shows exactly the state the application saw."

mod common;

use std::fs;
use std::io::Write;
use std::time::{Duration, Instant};

use common::ops::{Op, apply, op, tree};
use common::*;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn kill_daemon(m: &Mounted) {
    let pid = nix::unistd::Pid::from_raw(m.pid());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let start = Instant::now();
    while nix::sys::signal::kill(pid, None).is_ok() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The dead mount answers ENOTCONN until detached.
    detach(&m.mnt);
}

/// A fixed pseudo-random sequence of operations.
fn sequence(seed: u8, len: usize) -> Vec<Op> {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    (0..len)
        .map(|_| op().new_tree(&mut runner).unwrap().current())
        .collect()
}

#[test]
fn sigkill_between_operations_loses_nothing() {
    if !fuse_available() {
        return;
    }
    for (seed, kill_after) in [(1u8, 5usize), (2, 17), (3, 33), (4, 60)] {
        let tmp = tempfile::tempdir().unwrap();
        let (packet, model) = model_packet(tmp.path());
        let ops = sequence(seed, kill_after + 20);
        let m = mount_workspace(&packet, tmp.path());
        for (k, o) in ops[..kill_after].iter().enumerate() {
            assert_eq!(
                apply(&m.mnt, o),
                apply(&model, o),
                "seed {seed} step {k} {o:?}"
            );
        }
        kill_daemon(&m);
        std::mem::forget(m); // already gone
        let m = mount_workspace(&packet, tmp.path());
        assert_eq!(
            tree(&m.mnt),
            tree(&model),
            "seed {seed}: state after SIGKILL at step {kill_after}"
        );
        // The resumed mount keeps working from there.
        for (k, o) in ops[kill_after..].iter().enumerate() {
            assert_eq!(
                apply(&m.mnt, o),
                apply(&model, o),
                "seed {seed} step {} {o:?}",
                kill_after + k
            );
        }
        assert_eq!(tree(&m.mnt), tree(&model));
        m.umount();
    }
}

#[test]
fn sigkill_during_writes_keeps_every_completed_write() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let m = mount_workspace(&packet, tmp.path());
    // A writer appends numbered 4 KiB records; each write that returned is
    // counted. The daemon dies under it.
    let path = m.path("log.bin");
    let writer = std::thread::spawn(move || {
        let mut f = fs::File::create(&path).unwrap();
        let mut done = 0u32;
        loop {
            let rec = vec![(done % 251) as u8; 4096];
            if f.write_all(&rec).is_err() {
                return done;
            }
            done += 1;
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    kill_daemon(&m);
    std::mem::forget(m);
    let done = writer.join().unwrap();
    assert!(done > 10, "the writer made no progress");
    let m = mount_workspace(&packet, tmp.path());
    let data = fs::read(m.path("log.bin")).unwrap();
    assert!(
        data.len() >= done as usize * 4096,
        "{} bytes kept of {} acknowledged",
        data.len(),
        done as usize * 4096
    );
    for (k, rec) in data.chunks(4096).take(done as usize).enumerate() {
        assert!(
            rec.iter().all(|&b| b == (k % 251) as u8),
            "record {k} damaged"
        );
    }
    m.umount();
}

/// A file unlinked while open when the daemon is killed has no name and
/// no holder after a remount: its data file goes then, and its number is
/// free again, as if the kernel had let it go before the kill.
#[test]
fn a_file_unlinked_while_open_at_a_kill_is_gone_after_the_remount() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (packet, _) = model_packet(tmp.path());
    let m = mount_workspace(&packet, tmp.path());
    fs::write(m.path("kept.txt"), b"kept").unwrap();
    fs::write(m.path("gone.txt"), b"unlinked while open").unwrap();
    let open = fs::File::open(m.path("gone.txt")).unwrap();
    fs::remove_file(m.path("gone.txt")).unwrap();
    assert_eq!(data_files(&m.upper).len(), 2);
    kill_daemon(&m);
    std::mem::forget(m);
    drop(open);
    let m = mount_workspace(&packet, tmp.path());
    assert_eq!(fs::read(m.path("kept.txt")).unwrap(), b"kept");
    assert!(!m.path("gone.txt").exists());
    assert_eq!(
        data_files(&m.upper).len(),
        1,
        "the unlinked file's data outlived it: {:?}",
        data_files(&m.upper)
    );
    m.umount();
}
