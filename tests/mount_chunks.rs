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
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::chunk_ops::{C, Op, apply_to_file, apply_to_model, mount_op};
use common::*;
use proptest::prelude::*;

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
}

impl Rig {
    fn new(size: u64, remote: bool) -> Rig {
        Rig::with(size, remote, &[])
    }

    /// [`Rig::new`], with `extra` arguments to the `pack` of the packet.
    fn with(size: u64, remote: bool, extra: &[&str]) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let model = bytes(size, 1);
        write(&ws, "big", &model);
        write(&ws, "small.txt", b"small\n");
        let mut args = vec!["--zero-mtimes"];
        args.extend(extra);
        let p = packet_of(&ws, tmp.path(), "p", &args);
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
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
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
    #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

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
    for (size, ops) in sequences {
        Rig::new(size, true)
            .run(&ops)
            .unwrap_or_else(|e| panic!("{ops:?}: {e}"));
    }
}
