//! Copy-up by chunk on a real mount (docs/SEMANTICS.md, "Copy-up"): what
//! the kernel sends (appends through the page cache, writes cut at page
//! boundaries) reaches the upper directory as the chunks it touches, a
//! seal hashes only those, and a `SIGKILL` of the daemon in the middle of
//! writes to a file copied up by chunk loses no acknowledged write and
//! shows nothing that was not (docs/upper-format.md, "Copy-up by chunk").
//! The logic itself is tested without a kernel in tests/chunks.rs.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const C: u64 = 4 * 1024 * 1024;

/// `n` bytes that differ from chunk to chunk and from `seed` to `seed`.
fn bytes(n: u64, seed: u64) -> Vec<u8> {
    noise(seed, n as usize)
}

/// A workspace of `big` (`size` bytes) and a small file, packed with
/// mtimes zeroed, mounted.
fn mounted(tmp: &Path, size: u64) -> (Mounted, Vec<u8>) {
    let ws = tmp.join("ws");
    let big = bytes(size, 1);
    write(&ws, "big", &big);
    write(&ws, "small.txt", b"small\n");
    let packet = packet_of(&ws, tmp, "p", &["--zero-mtimes"]);
    (mount_workspace(&packet, tmp), big)
}

/// Seals the mount (mtimes zeroed, `--rebase` when asked) and checks the
/// packet is `pack` of a tree holding `big` and the small file.
fn seal_is_pack(
    m: &Mounted,
    tmp: &Path,
    name: &str,
    big: &[u8],
    rebase: bool,
) -> serde_json::Value {
    let out = tmp.join(format!("{name}.packet"));
    let mut extra = vec!["--zero-mtimes"];
    if rebase {
        extra.push("--rebase");
    }
    let v = m.seal(&out, &extra);
    let ws = tmp.join(format!("{name}-model"));
    write(&ws, "big", big);
    write(&ws, "small.txt", b"small\n");
    let want = packet_of(&ws, tmp, &format!("{name}-pack"), &["--zero-mtimes"]);
    assert!(
        fs::read(&out).unwrap() == fs::read(&want).unwrap(),
        "{name}: the seal differs from pack of the same tree"
    );
    v
}

/// Issue 33's reproducer on a mount: `printf x >> M/big` copied the whole
/// file up (the upper grew by the file's size) and the seal hashed all of
/// it. Now the append copies one chunk and the seal hashes one, turn after
/// turn with `--rebase`.
#[test]
fn appending_one_byte_to_a_large_file_copies_and_hashes_one_chunk() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (m, mut big) = mounted(t, 16 * C + 100);
    for turn in 1..=3u8 {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(m.path("big"))
            .unwrap();
        f.write_all(&[b'0' + turn]).unwrap();
        drop(f);
        big.push(b'0' + turn);
        let upper = upper_data_bytes(&m.upper);
        assert!(
            upper <= 8 << 20,
            "turn {turn}: the upper holds {upper} bytes"
        );
        assert_eq!(fs::metadata(m.path("big")).unwrap().len(), big.len() as u64);
        let v = seal_is_pack(&m, t, &format!("t{turn}"), &big, true);
        let hashed = v["bytes_hashed"].as_u64().unwrap();
        assert!(hashed <= (8 << 20) + (64 << 10), "turn {turn}: {v}");
        assert_eq!(v["modified"], 1, "{v}");
    }
    assert_eq!(fs::read(m.path("big")).unwrap(), big);
}

/// A write: where, and the bytes.
type Logged = (u64, Vec<u8>);

/// "The daemon can be killed (SIGKILL) at any moment: a re-mount ...
/// shows exactly the state the application saw", for a file copied up by
/// chunk: a writer overwrites 4 KiB records across the chunks of a large
/// lower file (and across their boundaries) and appends, each write that
/// returned logged; the daemon dies under it. After a remount the file is
/// the lower bytes with every logged write applied; each byte of the
/// write in flight (never acknowledged) is its old value or its new one,
/// so that write may show wholly, not at all, or in part (the kernel may
/// send it as two requests), and the length is the model's or reaches
/// the end of that write.
#[test]
fn sigkill_during_writes_to_a_file_copied_up_by_chunk() {
    if !fuse_available() {
        return;
    }
    // (seed, writes acknowledged before the kill, then a pause in ms)
    for (seed, acked, ms) in [(1u64, 6usize, 0u64), (2, 13, 7), (3, 25, 31)] {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let (m, base) = mounted(t, 3 * C + 777);
        let path = m.path("big");
        let log: Arc<Mutex<Vec<Logged>>> = Arc::default();
        let next: Arc<Mutex<Option<Logged>>> = Arc::default();
        let writer = {
            let (log, next) = (log.clone(), next.clone());
            std::thread::spawn(move || {
                let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
                let mut size = 3 * C + 777;
                for k in 0u64.. {
                    let data = bytes(4096, seed * 1_000_003 + k);
                    // Across a chunk boundary, inside a chunk, or at the end.
                    let at = match k % 4 {
                        0 => ((k / 4) % 4 + 1) * C - 2048,
                        1 => ((k * 7919) % 3) * C + (k * 104_729) % (C - 4096),
                        2 => size,
                        _ => (k * 7) % 3 * C,
                    };
                    *next.lock().unwrap() = Some((at, data.clone()));
                    if f.write_all_at(&data, at).is_err() {
                        return;
                    }
                    size = size.max(at + 4096);
                    log.lock().unwrap().push((at, data));
                }
            })
        };
        // Each chunk's first write copies it (the debug daemon is slow at
        // it under load): wait for progress, not a fixed time.
        let start = Instant::now();
        while log.lock().unwrap().len() < acked && start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(ms));
        let pid = nix::unistd::Pid::from_raw(m.pid());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        let start = Instant::now();
        while nix::sys::signal::kill(pid, None).is_ok() && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        detach(&m.mnt);
        std::mem::forget(m);
        writer.join().unwrap();
        let log = log.lock().unwrap().clone();
        assert!(
            log.len() >= acked,
            "seed {seed}: the writer made no progress"
        );
        let apply = |model: &mut Vec<u8>, (at, data): &Logged| {
            let end = *at as usize + data.len();
            if model.len() < end {
                model.resize(end, 0);
            }
            model[*at as usize..end].copy_from_slice(data);
        };
        let mut model = base.clone();
        log.iter().for_each(|w| apply(&mut model, w));
        // The write in flight (not acknowledged) may be there, or not,
        // or in part (the kernel sends a write that starts inside an
        // uncached page and runs into the next as two requests); every
        // other byte is the model's.
        let next = next
            .lock()
            .unwrap()
            .clone()
            .filter(|w| log.last() != Some(w));
        let (lo, hi) = next
            .as_ref()
            .map_or((0, 0), |(at, d)| (*at as usize, *at as usize + d.len()));
        let m = mount_workspace(&t.join("p.packet"), t);
        let got = fs::read(m.path("big")).unwrap();
        let lengths = model.len()..=model.len().max(hi);
        assert!(
            lengths.contains(&got.len()),
            "seed {seed}: {} bytes after the remount, want {lengths:?}",
            got.len()
        );
        for (i, &b) in got.iter().enumerate() {
            let old = model.get(i).copied().unwrap_or(0);
            let new = next
                .as_ref()
                .filter(|_| (lo..hi).contains(&i))
                .map(|(at, d)| d[i - *at as usize]);
            let ok = b == old || Some(b) == new;
            assert!(
                ok,
                "seed {seed}: byte {i} is {b}, the model's is {old} (in flight: {lo}..{hi}), \
                 after {} acknowledged writes",
                log.len()
            );
        }
        // It seals as pack of what it shows.
        seal_is_pack(&m, t, "after", &got, false);
        m.umount();
    }
}
