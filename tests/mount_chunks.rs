//! Copy-up by chunk on a real mount (docs/SEMANTICS.md, "Copy-up"): what
//! the kernel sends (appends through the page cache, writes cut at page
//! boundaries) reaches the upper directory as the chunks it touches, a
//! seal hashes only those, and a `SIGKILL` of the daemon in the middle of
//! writes to a file copied up by chunk loses no acknowledged write and
//! shows nothing that was not (docs/upper-format.md, "Copy-up by chunk").
//! tests/chunks.rs's model test runs here through mounts of a local and of
//! an `s3://` packet, with `SIGKILL`s between its steps, every seal
//! compared byte for byte with `pack` of the model (issue 33: "seal ==
//! pack, still byte for byte").
//! The logic itself is tested without a kernel in tests/chunks.rs.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::chunk_ops::{
    C, Op, apply_to_file, apply_to_model, bytes, mount_op, packed_workspace, try_apply_to_file,
};
use common::*;
use proptest::prelude::*;

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

/// Where a [`Rig`]'s packets live: its directory, or a bucket of moto's.
enum Store {
    Local,
    S3(&'static common::s3::Moto, String),
}

/// A workspace of `big` (the file the operations change) and a small
/// file, packed with mtimes zeroed and mounted (the workspace part), with
/// the model of `big`: the operations of [`common::chunk_ops`] applied to
/// both, the mount checked against the model after each, every seal
/// checked byte for byte against `pack` of the model's tree.
struct Rig {
    /// (Unmounted when dropped, before the directory goes.)
    m: Option<Mounted>,
    tmp: tempfile::TempDir,
    store: Store,
    /// The packet mounted, a path or an `s3://` location (a rebase moves it).
    packet: String,
    /// The name of the file the operations change (empty once it has
    /// none: unlinked), and its bytes.
    big: String,
    model: Vec<u8>,
    /// The other files of the tree, and their bytes.
    others: std::collections::BTreeMap<String, Vec<u8>>,
    seals: usize,
    /// The test barrier directory the next mount's daemon is given.
    barrier: Option<PathBuf>,
}

impl Rig {
    /// `big` of `size` bytes, in a packet on this machine or, when
    /// `remote`, in a bucket of its own.
    fn new(size: u64, remote: bool) -> Rig {
        Rig::with(size, remote, &[])
    }

    /// [`Rig::new`], with `extra` arguments to the `pack` of the packet.
    fn with(size: u64, remote: bool, extra: &[&str]) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let (model, p) = packed_workspace(tmp.path(), size, extra);
        let (store, packet) = if remote {
            let (moto, b) = (common::s3::moto(), common::s3::bucket());
            moto.put(&b, "p.packet", &fs::read(&p).unwrap());
            let loc = format!("s3://{b}/p.packet");
            (Store::S3(moto, b), loc)
        } else {
            (Store::Local, p.display().to_string())
        };
        let mut rig = Rig {
            m: None,
            tmp,
            store,
            packet,
            big: "big".into(),
            model,
            others: [("small.txt".to_string(), b"small\n".to_vec())].into(),
            seals: 0,
            barrier: None,
        };
        rig.mount();
        rig
    }

    fn m(&self) -> &Mounted {
        self.m.as_ref().unwrap()
    }

    /// Mounts the packet over the upper directory (a remote one with a
    /// cache of its own and moto's environment).
    fn mount(&mut self) {
        let t = self.tmp.path();
        let cache = t.join("cache").display().to_string();
        let mut extra = vec!["--part", "workspace"];
        let env = match &self.store {
            Store::Local => Vec::new(),
            Store::S3(moto, _) => {
                extra.extend(["--cache", cache.as_str()]);
                common::s3::env(moto.port)
            }
        };
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if let Some(bar) = &self.barrier {
            env.push(("SESSIONFS_TEST_BARRIER", bar.to_str().unwrap()));
        }
        let m = Mounted::with_env(
            Path::new(&self.packet),
            &t.join("mnt"),
            &t.join("upper"),
            &extra,
            &env,
        );
        self.m = Some(m);
    }

    /// `SIGKILL` of the daemon, the dead mount detached, and a mount again.
    fn kill_and_remount(&mut self) {
        let m = self.m.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(m.pid());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        wait_for("the daemon's end", || {
            nix::sys::signal::kill(pid, None).is_err()
        });
        detach(&m.mnt);
        std::mem::forget(m);
        self.mount();
    }

    /// Seals (mtimes zeroed, `--rebase` when asked) next to the packet and
    /// checks the sealed packet is `pack` of the model's tree; a rebase
    /// makes it the packet mounted.
    fn seal(&mut self, rebase: bool) -> serde_json::Value {
        self.seal_with(rebase, &[])
    }

    /// [`Rig::seal`] with `extra` arguments, given to the `pack` too.
    fn seal_with(&mut self, rebase: bool, extra: &[&str]) -> serde_json::Value {
        self.seals += 1;
        let name = format!("s{}", self.seals);
        let out = match &self.store {
            Store::Local => self.tmp.path().join(format!("{name}.packet")),
            Store::S3(_, b) => format!("s3://{b}/{name}.packet").into(),
        };
        let mut args = vec!["--zero-mtimes"];
        args.extend(extra);
        let v = if rebase {
            self.m().seal(&out, &[&args[..], &["--rebase"]].concat())
        } else {
            self.m().seal(&out, &args)
        };
        let got = match &self.store {
            Store::Local => fs::read(&out).unwrap(),
            Store::S3(moto, b) => moto.get(b, &format!("{name}.packet")).unwrap(),
        };
        let ws = self.tmp.path().join(format!("{name}-model"));
        fs::create_dir_all(&ws).unwrap();
        if !self.big.is_empty() {
            write(&ws, &self.big, &self.model);
        }
        for (name, bytes) in &self.others {
            write(&ws, name, bytes);
        }
        let want = packet_of(&ws, self.tmp.path(), &format!("{name}-pack"), &args);
        assert!(
            got == fs::read(&want).unwrap(),
            "{name}: the seal differs from pack of the same tree: {v}"
        );
        if rebase {
            assert_eq!(v["rebased"], true, "{v}");
            self.packet = out.display().to_string();
        }
        v
    }

    /// The path of `rel` on the mount.
    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.m().path(rel)
    }

    /// Applies `op` to the mount and the model.
    fn apply(&mut self, op: &Op) {
        if apply_to_file(&self.path(&self.big), op) {
            apply_to_model(&mut self.model, op);
            return;
        }
        match op {
            Op::Remount => {
                self.m.take().unwrap().umount();
                self.mount();
            }
            Op::Kill => self.kill_and_remount(),
            Op::Seal(rebase) => {
                self.seal(*rebase);
            }
            _ => unreachable!("{op:?}"),
        }
    }

    /// Whether `big` on the mount is the model.
    fn matches(&self) -> bool {
        self.big.is_empty() || fs::read(self.path(&self.big)).unwrap() == self.model
    }

    /// Checks every file of the mount against the model.
    #[track_caller]
    fn check(&self, what: &str) {
        assert!(
            self.matches(),
            "{what}: {} differs from the model",
            self.big
        );
        for (name, bytes) in &self.others {
            assert!(
                fs::read(self.path(name)).unwrap() == *bytes,
                "{what}: {name} differs from the model"
            );
        }
    }

    /// Writes `data` at `at` through `f` (a descriptor of `big`, or of a
    /// name of the same file), and into the model.
    fn write_through(&mut self, f: &fs::File, at: u64, data: &[u8]) {
        f.write_all_at(data, at).unwrap();
        let end = at as usize + data.len();
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        self.model[at as usize..end].copy_from_slice(data);
    }

    /// Checks that `f` reads the model from the daemon (its cached pages
    /// dropped first).
    #[track_caller]
    fn check_through(&self, f: &fs::File, what: &str) {
        drop_cached_pages(f);
        let mut got = vec![0; self.model.len()];
        f.read_exact_at(&mut got, 0).unwrap();
        assert!(got == self.model, "{what}");
    }

    /// Unmounts and mounts again.
    fn remount(&mut self) {
        self.apply(&Op::Remount);
    }

    /// Applies `ops`, checking the mount against the model after each,
    /// then seals and remounts a last time.
    fn run(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for (k, op) in ops.iter().enumerate() {
            self.apply(op);
            prop_assert!(self.matches(), "big after step {} {:?}", k, op);
        }
        self.seal(false);
        self.apply(&Op::Remount);
        prop_assert!(self.matches(), "big after the last remount");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    /// tests/chunks.rs's model test through a real mount of a local
    /// packet ("seal == pack, still byte for byte", issue 33): writes,
    /// appends, truncations and holes at chunk boundaries and one byte
    /// either side, seals with and without `--rebase`, remounts, and
    /// `SIGKILL`s of the daemon, each followed by a remount; the file is
    /// the model after every step (after a `SIGKILL`: every change that
    /// returned, all of which did), and every seal is `pack` of the model.
    #[test]
    fn chunked_copy_up_on_a_mount_matches_the_model_across_kills_and_seals(
        ops in prop::collection::vec(mount_op(), 1..8)
    ) {
        if fuse_available() {
            Rig::new(2 * C + C / 2, false).run(&ops)?;
        }
    }
}

/// "seal == pack, still byte for byte" on a mount of an `s3://` packet:
/// fixed sequences of writes, appends, truncations and holes at chunk
/// boundaries and one byte either side, seals to `s3://` with and without
/// `--rebase`, remounts and a `SIGKILL` of the daemon; every uploaded
/// packet is `pack` of the model's tree, byte for byte.
#[test]
fn chunked_copy_up_on_a_remote_mount_seals_as_pack() {
    if !fuse_available() {
        return;
    }
    use Op::*;
    let sequences: [(u64, Vec<Op>); 3] = [
        // Untouched chunks on both sides of the changed ones, for the
        // upload's server-side copies (S3's least part is 5 MiB).
        (
            6 * C + 100,
            vec![
                WriteAt(3 * C - 1, 3, 1),
                Append(10, 2),
                Seal(false),
                Truncate(5 * C + 1),
                Seal(true),
                WriteAt(C, C + 1, 3),
                Remount,
                Seal(false),
            ],
        ),
        (
            2 * C + C / 2,
            vec![
                Punch(C, C),
                WriteAt(C + 1, 1, 4),
                Kill,
                Append(C - 1, 5),
                Seal(true),
                Truncate(C - 1),
                Kill,
                Seal(true),
                Truncate(2 * C + 1),
            ],
        ),
        (
            3 * C,
            vec![
                Truncate(3 * C + 1),
                WriteAt(2 * C - 1, 2, 6),
                Seal(true),
                Kill,
                WriteAt(0, C, 7),
                Append(1, 8),
                Seal(true),
                Punch(2 * C - 1, 3),
            ],
        ),
    ];
    for (size, mut ops) in sequences {
        ops.retain(common::chunk_ops::on_mounts);
        Rig::new(size, true)
            .run(&ops)
            .unwrap_or_else(|e| panic!("{ops:?}: {e}"));
    }
}

/// A local mount of a workspace whose `big` (4 chunks less a few bytes)
/// is partly copied up: chunks 0 and 1 held by a write across their
/// boundary, chunks 2 and 3 still the packet's.
fn partly_written() -> Rig {
    let mut r = Rig::new(4 * C - 777, false);
    r.apply(&Op::WriteAt(C - 1000, 3000, 11));
    r.check("after the first write");
    r
}

/// `fallocate(fd, mode, offset, length)`.
#[cfg(target_os = "linux")]
fn fallocate(f: &fs::File, mode: i32, offset: u64, length: u64) -> std::io::Result<()> {
    let mode = nix::fcntl::FallocateFlags::from_bits_retain(mode);
    nix::fcntl::fallocate(f, mode, offset as i64, length as i64)?;
    Ok(())
}

/// `copy_file_range` of `len` bytes from `from` at `at` to `to` at `to_at`,
/// to the last byte.
#[cfg(target_os = "linux")]
fn copy_range(from: &fs::File, at: u64, to: &fs::File, to_at: u64, len: u64) {
    let (mut off_in, mut off_out) = (at as i64, to_at as i64);
    let mut left = len as usize;
    while left > 0 {
        let n = nix::fcntl::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), left)
            .unwrap_or_else(|e| panic!("copy_file_range: {e}"));
        assert!(n > 0, "copy_file_range: the source ended");
        left -= n;
    }
}

/// Writes through a shared writable mapping of a partly copied file,
/// in a held chunk across a boundary, in a chunk still the packet's and
/// in the last one, reach the daemon at `msync`: the mount shows them,
/// so does a remount after a `SIGKILL` (msync returned: they are
/// acknowledged), and the seal is `pack` of them.
#[test]
fn mmap_writes_to_a_partly_copied_file_survive_a_kill_and_seal_as_pack() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.path("big"))
        .unwrap();
    let len = r.model.len();
    let edits = [
        (C as usize - 2, bytes(4, 21)),
        (2 * C as usize + 100, bytes(5000, 22)),
        (3 * C as usize - 1, bytes(2, 23)),
        (len - 1, bytes(1, 24)),
    ];
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh mapping of `len` bytes of an open file, written
        // within its bounds and unmapped before the file is closed.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
            let p = p.cast::<u8>();
            for (at, d) in &edits {
                std::ptr::copy_nonoverlapping(d.as_ptr(), p.add(*at), d.len());
            }
            let synced = libc::msync(p.cast(), len, libc::MS_SYNC);
            assert_eq!(synced, 0, "{}", std::io::Error::last_os_error());
            libc::munmap(p.cast(), len);
        }
    }
    drop(f);
    for (at, d) in &edits {
        r.model[*at..*at + d.len()].copy_from_slice(d);
    }
    r.check("after msync");
    r.apply(&Op::Kill);
    r.check("after a SIGKILL and a remount");
    r.seal(false);
    r.seal(true);
    r.check("after the rebase");
}

/// `copy_file_range` into a partly copied file (across a held chunk and
/// one still the packet's, and past its end) and out of it (from held and
/// packet chunks alike) copies the bytes the mount shows; a remount shows
/// the same and the seal is `pack` of them.
#[test]
#[cfg(target_os = "linux")] // copy_file_range
fn copy_file_range_into_and_out_of_a_partly_copied_file() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    let src = bytes(10_000, 30);
    fs::write(r.path("src.bin"), &src).unwrap();
    r.others.insert("src.bin".into(), src.clone());
    let big = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.path("big"))
        .unwrap();
    let from = fs::File::open(r.path("src.bin")).unwrap();
    // Into: across chunks 1 (held) and 2 (the packet's), and past the end.
    copy_range(&from, 0, &big, 2 * C - 5000, 10_000);
    r.model[2 * C as usize - 5000..2 * C as usize + 5000].copy_from_slice(&src);
    let end = r.model.len() as u64 - 3;
    copy_range(&from, 100, &big, end, 50);
    r.model.truncate(end as usize);
    r.model.extend(&src[100..150]);
    // Out: from chunk 0's end (held) through chunk 1 into chunk 2, and all
    // of chunk 3 (the packet's but for its grown end).
    let out = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(r.path("out.bin"))
        .unwrap();
    copy_range(&big, C - 100, &out, 0, C + 200);
    let tail = r.model.len() as u64 - 3 * C;
    copy_range(&big, 3 * C, &out, C + 200, tail);
    let mut want = r.model[C as usize - 100..2 * C as usize + 100].to_vec();
    want.extend(&r.model[3 * C as usize..]);
    r.others.insert("out.bin".into(), want);
    drop((big, from, out));
    r.check("after the copies");
    r.remount();
    r.check("after a remount");
    r.seal(false);
}

/// A partly copied file renamed keeps its chunk map under the new name:
/// written again there, remounted, sealed with `--rebase`, written again
/// (a chunk the rebased packet holds) and sealed: each seal `pack` of it.
#[test]
fn a_partly_copied_file_renamed_then_remounted_seals_as_pack() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    fs::create_dir(r.path("d")).unwrap();
    fs::rename(r.path("big"), r.path("d/moved")).unwrap();
    r.big = "d/moved".into();
    r.apply(&Op::WriteAt(3 * C - 1, 2, 31));
    r.check("after the rename");
    r.remount();
    r.check("after a remount");
    r.seal(true);
    r.check("after the rebase");
    r.apply(&Op::WriteAt(2 * C + 1, 1, 32));
    r.apply(&Op::Append(C, 33));
    r.remount();
    r.seal(false);
}

/// `fallocate` mode 0 on a partly copied file: inside a chunk still the
/// packet's it changes no byte; past the end it extends the file with
/// zeros. `FALLOC_FL_ZERO_RANGE` zeroes across a chunk boundary. A
/// remount shows the same, and the seal is `pack` of it.
#[test]
#[cfg(target_os = "linux")] // macFUSE sends no fallocate
fn fallocate_on_a_partly_copied_file() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(r.path("big"))
        .unwrap();
    fallocate(&f, 0, 2 * C + 10, 100).unwrap();
    r.check("after an allocation inside");
    let end = r.model.len() as u64 - 10;
    fallocate(&f, 0, end, C).unwrap();
    r.model.resize((end + C) as usize, 0);
    r.check("after an allocation past the end");
    // The kernel passes the mode on to the daemon (Linux 6.18 does), which
    // zeroes the range in the data file (ext4, tmpfs and xfs take it).
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 3 * C - 1, 3).unwrap();
    r.model[3 * C as usize - 1..3 * C as usize + 2].fill(0);
    drop(f);
    r.check("after FALLOC_FL_ZERO_RANGE");
    r.remount();
    r.check("after a remount");
    r.seal(false);
}

/// A descriptor opened on the lower file before its first write (for
/// reading, and one for writing) sees the writes made through another,
/// from the daemon (its cached pages dropped); a write through it copies
/// up as any other.
#[test]
fn a_descriptor_opened_before_the_first_write_sees_the_writes() {
    if !fuse_available() {
        return;
    }
    let mut r = Rig::new(4 * C - 777, false);
    let early = fs::File::open(r.path("big")).unwrap();
    let early_rw = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.path("big"))
        .unwrap();
    let mut head = vec![0; 100];
    early.read_exact_at(&mut head, C).unwrap();
    r.apply(&Op::WriteAt(C + 1, 10, 41));
    r.apply(&Op::Append(7, 42));
    r.check_through(&early, "the early descriptor reads other bytes");
    r.write_through(&early_rw, 2 * C - 1, &bytes(3, 43));
    r.check_through(&early, "the early descriptor misses its own write");
    drop((early, early_rw));
    r.check("after the writes");
    r.apply(&Op::Kill);
    r.check("after a SIGKILL and a remount");
    r.seal(false);
}

/// "A file that has been rewritten wholly may become a plain upper file
/// again": a partly copied file opened with `O_TRUNC` and written whole
/// is; its journal holds every chunk of the lower entry (an empty chunk
/// map, docs/upper-format.md), the remount shows the new bytes, and the
/// seal hashes all of them and is `pack` of them.
#[test]
fn a_whole_rewrite_leaves_a_plain_upper_file() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(r.path("big")).unwrap());
    let new = bytes(4 * C - 777, 50);
    fs::write(r.path("big"), &new).unwrap();
    r.model = new;
    r.check("after the rewrite");
    // The journal: copied up by chunk, and every lower chunk held since.
    let journal = fs::read_to_string(r.m().upper.join("journal")).unwrap();
    let records: Vec<serde_json::Value> = journal
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["ino"] == ino)
        .collect();
    assert!(
        records
            .iter()
            .any(|v| v["op"] == "copy_up" && v["chunks"] == true),
        "{journal}"
    );
    let mut held = [false; 4];
    for v in records.iter().filter(|v| v["op"] == "hold") {
        for run in v["chunks"].as_array().unwrap() {
            (run[0].as_u64().unwrap()..run[1].as_u64().unwrap())
                .for_each(|k| held[k as usize] = true);
        }
    }
    assert_eq!(held, [true; 4], "{journal}");
    r.remount();
    r.check("after a remount");
    let v = r.seal(false);
    let hashed = v["bytes_hashed"].as_u64().unwrap();
    assert!(hashed >= 4 * C - 777, "hashed {hashed}: {v}");
}

/// A hard link made on the mount to a partly copied file: a write through
/// either name shows through both, across a `SIGKILL` and a remount; the
/// seal is `pack` of two files; after a `--rebase` the two names are two
/// files (as the packet holds them), each sealed as it is.
#[test]
fn a_hard_link_to_a_partly_copied_file() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    fs::hard_link(r.path("big"), r.path("alias")).unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(r.path("alias"))
        .unwrap();
    r.write_through(&f, 2 * C - 1, &bytes(3, 60));
    drop(f);
    r.apply(&Op::Append(5, 61));
    r.others.insert("alias".into(), r.model.clone());
    r.check("after writes through both names");
    r.apply(&Op::Kill);
    r.check("after a SIGKILL and a remount");
    r.seal(false);
    r.seal(true);
    r.apply(&Op::WriteAt(3 * C, 2, 62));
    r.check("after a write to one of the two files the rebase made");
    r.seal(false);
}

/// A rebase that keeps a partly copied file out of its packet
/// (`--exclude`) keeps it on the mount, whole: its chunks still the old
/// packet's are copied into its data file first ("a file kept on the mount
/// across a `--rebase` ... every chunk still in the map", upper-format.md),
/// so that it reads the same once the old packet is gone, after a remount
/// too; sealed without the exclusion it is `pack` of it.
#[test]
fn a_rebase_keeps_an_excluded_partly_copied_file_whole() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    let old = PathBuf::from(&r.packet);
    r.seal_with(true, &["--exclude", "big"]);
    fs::remove_file(&old).unwrap();
    drop_cached_pages(&fs::File::open(r.path("big")).unwrap());
    r.check("after the rebase, the old packet gone");
    r.remount();
    r.check("after a remount");
    r.apply(&Op::WriteAt(2 * C + 7, 2, 70));
    r.seal(false);
}

/// A rebase while a partly copied file is unlinked but open keeps it for
/// its descriptor, whole: it reads the same through the descriptor once
/// the old packet is gone (cached pages dropped), takes writes in chunks
/// the old packet held, and no seal holds it.
#[test]
fn a_rebase_keeps_an_unlinked_open_partly_copied_file_whole() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.path("big"))
        .unwrap();
    fs::remove_file(r.path("big")).unwrap();
    r.big = String::new();
    let old = PathBuf::from(&r.packet);
    r.seal(true);
    fs::remove_file(&old).unwrap();
    r.check_through(&f, "the unlinked file reads other bytes");
    r.write_through(&f, 3 * C - 1, &bytes(3, 71));
    r.check_through(&f, "the unlinked file misses its write");
    r.seal(false);
    drop(f);
    r.check("after the descriptor closed");
    r.remount();
    assert!(!r.path("big").exists());
    r.seal(false);
}

/// `seal --packet-version 1` of a partly copied file (through the
/// daemon) is `pack --packet-version 1` of it, whose whole-file hash the
/// seal computes from chunks it did not write; and after a `--rebase` onto
/// that /1 packet, a /2 seal is `pack` /2.
#[test]
fn a_partly_copied_file_sealed_as_version_1_is_pack_version_1() {
    if !fuse_available() {
        return;
    }
    let mut r = partly_written();
    r.apply(&Op::Append(3, 80));
    let v1 = ["--packet-version", "1"];
    r.seal_with(false, &v1);
    r.seal_with(true, &v1);
    r.apply(&Op::WriteAt(3 * C + 1, 5, 81));
    r.seal(false);
    r.seal_with(false, &v1);
}

/// A /1 packet mounted, a file in it partly written: the /2 seal (the
/// default) is `pack` /2 of it, before and after a `SIGKILL`.
#[test]
fn a_version_1_packet_partly_written_seals_as_pack_version_2() {
    if !fuse_available() {
        return;
    }
    let mut r = Rig::with(4 * C - 777, false, &["--packet-version", "1"]);
    r.apply(&Op::WriteAt(2 * C - 1, 2, 90));
    r.apply(&Op::Truncate(3 * C + 1));
    r.seal(false);
    r.apply(&Op::Kill);
    r.apply(&Op::WriteAt(C, 1, 91));
    r.seal(true);
    r.apply(&Op::Append(10, 92));
    r.seal(false);
}

/// The window between a change to a file copied up by chunk and its
/// `hold` record (docs/upper-format.md, "Why every order of steps is
/// safe"): "a change of size ... shows as soon as `set_len` (or a write
/// past the end) returns, before its `hold` record ... So a remount after
/// a kill between a truncation and its record shows the file truncated,
/// as the data file is, and holds the cut chunks then"; a change that
/// keeps the size shows as before it, its chunk still the packet's. The
/// daemon is killed there (test barrier `chunk-hold`), the change never
/// answered. After the remount the file is as the model says, and grown
/// again it shows zeros where chunks were cut, never the packet's bytes;
/// it seals as `pack` of that.
#[test]
fn a_kill_between_a_change_and_its_hold_record() {
    if !fuse_available() {
        return;
    }
    // (the change, whether the remount shows it)
    let cases = [
        // Cuts chunk 2 (the packet's), drops chunk 3.
        (Op::Truncate(2 * C + 5), true),
        // Drops chunks 2 and 3, at a boundary.
        (Op::Truncate(2 * C), true),
        // Grows: chunk 3's end moves.
        (Op::WriteAt(4 * C + 10, 3, 100), true),
        // Overwrites in chunk 2: the size stays.
        (Op::WriteAt(2 * C + 100, 10, 101), false),
    ];
    for (op, shows) in cases {
        let mut r = partly_written();
        let bar = r.tmp.path().join("bar");
        fs::create_dir(&bar).unwrap();
        r.barrier = Some(bar.clone());
        r.remount();
        let change = {
            let (path, op) = (r.path("big"), op.clone());
            std::thread::spawn(move || try_apply_to_file(&path, &op))
        };
        wait_reached(&bar, "chunk-hold");
        r.barrier = None;
        r.apply(&Op::Kill);
        let answer = change.join().unwrap();
        assert!(answer.is_err(), "{op:?} was answered: {answer:?}");
        if shows {
            apply_to_model(&mut r.model, &op);
        }
        r.check(&format!("{op:?}, after the remount"));
        r.apply(&Op::Truncate(5 * C));
        r.check(&format!("{op:?}, grown after the remount"));
        r.seal(false);
    }
}
