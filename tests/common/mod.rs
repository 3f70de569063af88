//! Helpers shared by the integration tests: run the built binary, parse its
//! one JSON object, and build trees on disk.
#![allow(dead_code)]

pub mod chunk_ops;
pub mod ops;
pub mod s3;
pub mod trees;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sessionfs"))
}

/// `cmd`, started with SIGINT, SIGTERM and SIGHUP at their defaults. A
/// test run started ignoring one (a background job of a non-interactive
/// shell ignores SIGINT; `nohup`, SIGHUP) passes that on to what it
/// starts, and sessionfs leaves a signal it was started ignoring alone, by
/// design: tests that send those signals start their commands with this.
pub fn with_default_signals(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only signal(2), which is async-signal-safe, between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
}

impl Run {
    /// The `kind` of an error result.
    pub fn kind(&self) -> &str {
        self.json["kind"].as_str().unwrap_or("")
    }

    /// Asserts success and returns the JSON.
    #[track_caller]
    pub fn ok(&self) -> &Value {
        assert_eq!(
            self.code, 0,
            "expected success: {:#} {}",
            self.json, self.stderr
        );
        &self.json
    }

    /// Asserts an error of `kind` with exit `code`.
    #[track_caller]
    pub fn fails(&self, code: i32, kind: &str) -> &Value {
        assert_eq!(
            (self.code, self.kind()),
            (code, kind),
            "{:#}\n{}",
            self.json,
            self.stderr
        );
        assert_eq!(self.json["schema"], "sessionfs.error/1");
        assert!(!self.json["message"].as_str().unwrap_or("").is_empty());
        &self.json
    }
}

/// Runs `sessionfs args…` and parses stdout, which must be exactly one JSON
/// object with a `schema`.
pub fn run<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    run_env(args, &[])
}

/// Like [`run`], with extra environment variables.
pub fn run_env<I, S>(args: I, env: &[(&str, &str)]) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run sessionfs");
    let stdout = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    let mut lines = stdout.lines();
    let first = lines.next().unwrap_or_else(|| {
        panic!(
            "no stdout; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        lines.next().is_none(),
        "more than one line on stdout: {stdout}"
    );
    let json: Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {first}"));
    assert!(
        json["schema"]
            .as_str()
            .is_some_and(|s| s.starts_with("sessionfs.")
                && s.rsplit_once('/')
                    .is_some_and(|(_, v)| v.parse::<u32>().is_ok())),
        "{json}"
    );
    Run {
        code: out.status.code().unwrap_or(-1),
        json,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes `content` at `root/rel`, creating parents.
pub fn write(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, content).unwrap();
}

/// Sets a file's mode.
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Sets mtime (and atime) to `ns` nanoseconds since the epoch, without
/// following symlinks.
pub fn set_mtime(path: &Path, ns: i64) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let t = TimeSpec::new(ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

/// Every data file of upper directory `upper` (`data/<shard>/<id>`), and
/// any file directly in `data/` (where none belongs), sorted.
pub fn data_files(upper: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in fs::read_dir(upper.join("data")).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            v.push(p);
        }
    }
    v.sort();
    v
}

/// Bytes the data files of upper directory `upper` take on disk (blocks:
/// a file copied up by chunk is sparse where it holds no chunk).
pub fn upper_data_bytes(upper: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    data_files(upper)
        .iter()
        .map(|p| fs::metadata(p).unwrap().blocks() * 512)
        .sum()
}

/// The sample tree without its multi-chunk file, for model tests that
/// compare whole trees after every step.
pub fn model_tree(root: &Path) {
    sample_tree(root);
    fs::remove_dir_all(root.join("data")).unwrap();
}

/// A small workspace used by many tests: files, an executable, nested
/// directories, a symlink, an empty file, a file over one chunk.
pub fn sample_tree(root: &Path) {
    write(root, "README.md", b"# sample\n");
    write(root, "src/main.rs", b"fn main() { println!(\"hi\"); }\n");
    write(root, "src/lib/mod.rs", b"pub fn f() {}\n");
    write(root, "empty", b"");
    write(root, "bin/run.sh", b"#!/bin/sh\necho run\n");
    chmod(&root.join("bin/run.sh"), 0o755);
    let big: Vec<u8> = (0..(4 * 1024 * 1024 + 4097) as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    write(root, "data/big.bin", &big);
    std::os::unix::fs::symlink("src/main.rs", root.join("link")).unwrap();
    fs::create_dir_all(root.join("emptydir")).unwrap();
    let mut t = 1_700_000_000_123_456_789i64;
    for rel in [
        "README.md",
        "src/main.rs",
        "src/lib/mod.rs",
        "empty",
        "bin/run.sh",
        "data/big.bin",
    ] {
        set_mtime(&root.join(rel), t);
        t += 1_000_000_007;
    }
}

/// Every file, dir and symlink under `root` with its content, mode bits and
/// link target, for comparing trees.
pub fn snapshot(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = fs::symlink_metadata(&p).unwrap();
            let desc = if m.file_type().is_symlink() {
                format!("symlink {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                walk(root, &p, out);
                format!("dir {:o}", m.permissions().mode() & 0o7777)
            } else if !m.is_file() {
                // (A FIFO, not opened: an open would wait for a writer.)
                use std::os::unix::fs::FileTypeExt;
                format!(
                    "{} {:o}",
                    if m.file_type().is_fifo() {
                        "fifo"
                    } else {
                        "special"
                    },
                    m.permissions().mode() & 0o7777
                )
            } else {
                use std::hash::{Hash, Hasher};
                let data = fs::read(&p).unwrap();
                let mut h = std::collections::hash_map::DefaultHasher::new();
                data.hash(&mut h);
                format!(
                    "file {:o} {} {:x}",
                    m.permissions().mode() & 0o7777,
                    data.len(),
                    h.finish()
                )
            };
            out.push((rel, desc));
        }
    }
    walk(root, root, &mut out);
    out
}

/// Packs `ws` into `out` (extra args appended) and returns the result JSON.
#[track_caller]
pub fn pack(ws: &Path, out: &Path, extra: &[&str]) -> Value {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    run(&args).ok().clone()
}

/// Unpacks `packet` into `into` (extra args appended) and returns the
/// result JSON.
#[track_caller]
pub fn unpack(packet: &Path, into: &Path, extra: &[&str]) -> Value {
    let mut args: Vec<String> = vec![
        "unpack".into(),
        packet.display().to_string(),
        "--into".into(),
        into.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args).ok().clone()
}

/// Whether FUSE can be used here. Without /dev/fuse the mount tests print
/// why they skip, except under `SESSIONFS_REQUIRE_FUSE=1` (set by
/// `make test`), where a missing FUSE fails them.
pub fn fuse_available() -> bool {
    if Path::new("/dev/fuse").exists() {
        return true;
    }
    if std::env::var_os("SESSIONFS_REQUIRE_FUSE").is_some() {
        panic!("/dev/fuse is missing but SESSIONFS_REQUIRE_FUSE is set: FUSE tests must run");
    }
    // Named after the test (its thread's name), which may ask more than once.
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    eprintln!(
        "SKIPPED {test}: /dev/fuse does not exist on this machine, so no FUSE mount can be made"
    );
    false
}

/// A mounted packet, unmounted on drop.
pub struct Mounted {
    pub mnt: PathBuf,
    pub upper: PathBuf,
    pub packet: PathBuf,
    pub result: Value,
    mounted: bool,
}

impl Mounted {
    /// Mounts `packet` at `mnt` (created) with upper directory `upper`.
    #[track_caller]
    pub fn new(packet: &Path, mnt: &Path, upper: &Path, extra: &[&str]) -> Mounted {
        Mounted::with_env(packet, mnt, upper, extra, &[])
    }

    /// [`Mounted::new`] with `env` added to the environment (the daemon
    /// inherits it).
    #[track_caller]
    pub fn with_env(
        packet: &Path,
        mnt: &Path,
        upper: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Mounted {
        fs::create_dir_all(mnt).unwrap();
        let mut args: Vec<String> = vec![
            "mount".into(),
            packet.display().to_string(),
            mnt.display().to_string(),
            "--upper".into(),
            upper.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let r = run_env(&args, env);
        let result = r.ok().clone();
        assert_eq!(result["schema"], "sessionfs.mount-result/1");
        Mounted {
            mnt: mnt.to_owned(),
            upper: upper.to_owned(),
            packet: packet.to_owned(),
            result,
            mounted: true,
        }
    }

    /// Path `rel` inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.mnt.clone()
        } else {
            self.mnt.join(rel)
        }
    }

    /// The daemon's `status` object.
    pub fn status(&self) -> Value {
        run(["status", self.mnt.to_str().unwrap()]).ok().clone()
    }

    /// Unmounts, asserting success.
    #[track_caller]
    pub fn umount(mut self) {
        self.mounted = false;
        run(["umount", self.mnt.to_str().unwrap()]).ok();
    }

    /// Forgets the mount, which something other than `sessionfs umount`
    /// took away (`fusermount3 -u`, `umount`): dropping it does nothing.
    pub fn unmounted_elsewhere(mut self) {
        self.mounted = false;
    }

    /// Unmounts (asserting success) and mounts the workspace part of
    /// `packet` again at the same mountpoint over the same upper
    /// directory: the remount after a rebase, or after a restart.
    #[track_caller]
    pub fn remount_workspace(self, packet: &Path) -> Mounted {
        let (mnt, upper) = (self.mnt.clone(), self.upper.clone());
        self.umount();
        Mounted::new(packet, &mnt, &upper, &["--part", "workspace"])
    }

    /// `sessionfs seal` of this mount to `out` (extra args), which must
    /// succeed; its result.
    #[track_caller]
    pub fn seal(&self, out: &Path, extra: &[&str]) -> Value {
        let mut args = vec![
            "seal".to_string(),
            self.mnt.display().to_string(),
            "-o".into(),
            out.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        run(&args).ok().clone()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        self.result["pid"].as_i64().unwrap() as i32
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new(bin()).arg("umount").arg(&self.mnt).output();
            detach(&self.mnt);
        }
    }
}

/// `n` bytes that differ from those of another `seed` (and from chunk to
/// chunk: an xorshift stream).
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The overlay a mount of `packet`'s workspace part over upper directory
/// `upper` (made if absent) serves, in this process and without FUSE: the
/// seal logic's test bench (the kernel is not needed to change the upper
/// directory, only to decide what reaches it).
pub fn overlay_of(packet: &Path, upper: &Path) -> sessionfs::api::Overlay {
    use sessionfs::api::{Options, Overlay};
    let limits = sessionfs::api::Limits::DEFAULT;
    Overlay::mount(
        sessionfs::api::Packet::open(packet, &limits).unwrap(),
        upper,
        Options {
            uid: 0,
            gid: 0,
            part: Some(sessionfs::api::Part::Workspace),
        },
    )
    .unwrap()
}

/// What an in-process seal into `output` is given: the defaults of
/// `sessionfs seal`, and the test barrier at `barrier`.
pub fn seal_options(
    output: std::path::PathBuf,
    barrier: Option<std::path::PathBuf>,
) -> sessionfs::api::SealOptions {
    sessionfs::api::SealOptions {
        output,
        mode: 0o644,
        zero_mtimes: false,
        reject_external_symlinks: false,
        exclude: vec![],
        keep: vec![],
        limits: sessionfs::api::Limits::DEFAULT,
        roots: Default::default(),
        file_sha256: false,
        version: sessionfs::api::Version::CURRENT,
        barrier,
        rebase: false,
        cancel: None,
        remote: None,
    }
}

/// Runs an offline seal, `seal --packet packet --upper upper -o out`
/// (extra args appended).
pub fn seal_offline(packet: &Path, upper: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "seal".as_ref(),
        "--packet".as_ref(),
        packet.as_os_str(),
        "--upper".as_ref(),
        upper.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    run(&args)
}

/// Packs `ws` (extra pack args) into `dir/name.packet` and returns its path.
pub fn packet_of(ws: &Path, dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let p = dir.join(format!("{name}.packet"));
    pack(ws, &p, extra);
    p
}

/// A packet of [`model_tree`] in `tmp`, and the model: the packet's
/// workspace unpacked beside it, for tests that replay operations on both.
pub fn model_packet(tmp: &Path) -> (PathBuf, PathBuf) {
    let ws = tmp.join("ws");
    model_tree(&ws);
    let packet = packet_of(&ws, tmp, "p", &[]);
    let model = tmp.join("model");
    run([
        "unpack",
        packet.to_str().unwrap(),
        "--into",
        model.to_str().unwrap(),
        "--part",
        "workspace",
    ])
    .ok();
    (packet, model)
}

/// `packet` mounted with `--part workspace` at `tmp/mnt`, with upper
/// directory `tmp/upper`.
#[track_caller]
pub fn mount_workspace(packet: &Path, tmp: &Path) -> Mounted {
    Mounted::new(
        packet,
        &tmp.join("mnt"),
        &tmp.join("upper"),
        &["--part", "workspace"],
    )
}

/// A packet of [`sample_tree`] (made at `tmp/ws`) at `tmp/p.packet`.
pub fn sample_packet(tmp: &Path) -> PathBuf {
    let ws = tmp.join("ws");
    sample_tree(&ws);
    packet_of(&ws, tmp, "p", &[])
}

/// A packet of [`sample_tree`] in `tmp`, mounted by [`mount_workspace`].
#[track_caller]
pub fn sample_mount(tmp: &Path) -> (PathBuf, Mounted) {
    let packet = sample_packet(tmp);
    let m = mount_workspace(&packet, tmp);
    (packet, m)
}

/// The member names GNU tar lists in `archive`, one per line.
pub fn tar_listing(archive: &Path) -> String {
    let out = std::process::Command::new("tar")
        .arg("-tf")
        .arg(archive)
        .output()
        .unwrap();
    assert!(out.status.success(), "tar -tf {}", archive.display());
    String::from_utf8(out.stdout).unwrap()
}

/// The `path` of every entry in a result's `excluded` list, in order.
pub fn excluded_paths(result: &Value) -> Vec<&str> {
    result["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect()
}

/// The `(path, reason[field])` of each exclusion in `result`, as text
/// (`field`: `rule`, `what`, ...).
pub fn exclusion_reasons<'v>(result: &'v Value, field: &str) -> Vec<(&'v str, &'v str)> {
    result["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap(),
                e["reason"][field].as_str().unwrap(),
            )
        })
        .collect()
}

/// Detaches whatever is mounted at the path when dropped, for tests that
/// mount by hand (with a barrier in the environment, or to kill the daemon):
/// a failed assertion then leaves no mount behind.
pub struct LazyUnmount(pub PathBuf);

impl Drop for LazyUnmount {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

/// Detaches what is mounted at `mnt` (a mount whose daemon is gone answers
/// `ENOTCONN` until then): with `fusermount3 -uz`, or `umount -l` where
/// there is no fusermount3 (root mounts without it), so that a test does
/// not go on to find the dead mount there.
pub fn detach(mnt: &Path) {
    let done = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
    if !done(Command::new("fusermount3").arg("-uz").arg(mnt)) {
        done(Command::new("umount").arg("-l").arg(mnt));
    }
}

/// Every point the seal's test barrier knows, in the order a seal passes them.
pub const POINTS: [&str; 9] = [
    "collecting",
    "collected",
    "hashed",
    "sized",
    "written",
    "synced",
    "committed",
    "rebase-recorded",
    "rebase-compacted",
];

/// The points a mount's daemon passes outside a seal (src/barrier.rs).
pub const MOUNT_POINTS: [&str; 1] = ["chunk-hold"];

/// Prepares barrier directory `bar` so that a seal, or a mount's daemon,
/// pauses at `point` only: every other point finds its `.go` file already
/// there.
pub fn arm_barrier(bar: &Path, point: &str) {
    fs::create_dir_all(bar).unwrap();
    for p in POINTS.iter().chain(&MOUNT_POINTS).filter(|p| **p != point) {
        fs::write(bar.join(format!("{p}.go")), b"").unwrap();
    }
}

/// Waits (at most 30 s) until `done`, else fails naming `what`.
#[track_caller]
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed().as_secs() < 30, "waited in vain for {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Waits (at most 30 s) until a process paused by test barrier directory
/// `bar` reaches `point` (see src/barrier.rs).
#[track_caller]
pub fn wait_reached(bar: &Path, point: &str) {
    wait_for(point, || bar.join(format!("{point}.reached")).exists());
}

/// A file system mounted for a test (root only), detached when dropped.
pub struct FsMount(PathBuf);

impl FsMount {
    /// A tmpfs of `size` (`4m`) at `at`.
    pub fn tmpfs(at: &Path, size: &str) -> FsMount {
        FsMount::new(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"], at)
    }

    /// Directory `from` bound at `at`: the same file system, seen twice.
    pub fn bind(from: &Path, at: &Path) -> FsMount {
        FsMount::new(&["--bind", from.to_str().unwrap()], at)
    }

    /// A mount made otherwise at `at`: unmounted on drop.
    pub fn adopt(at: &Path) -> FsMount {
        FsMount(at.to_owned())
    }

    fn new(args: &[&str], at: &Path) -> FsMount {
        let st = std::process::Command::new("mount")
            .args(args)
            .arg(at)
            .status()
            .expect("cannot run mount(8)");
        assert!(st.success(), "mount {args:?} failed: this test needs root");
        FsMount(at.to_owned())
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A child killed outright when dropped: a test that fails while its child
/// hangs leaves no process behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl KillOnDrop {
    /// Waits for the command to end: its exit code and the one JSON
    /// object it printed.
    pub fn finished(&mut self) -> (Option<i32>, Value) {
        let code = self.0.wait().unwrap().code();
        let mut stdout = String::new();
        std::io::Read::read_to_string(&mut self.0.stdout.take().unwrap(), &mut stdout).unwrap();
        (code, serde_json::from_str(&stdout).unwrap())
    }
}

/// Aborts the FUSE connection of the mount at `mnt` (through fusectl,
/// mounted if it is not): every request waiting on it fails, so that a
/// test that found the mount deadlocked can end instead of hanging (a
/// process waiting for a request already sent to the daemon cannot be
/// killed, nor can a daemon stuck in the kernel).
pub fn abort_fuse_connection(mnt: &Path) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.to_str().unwrap();
    let Some(minor) = info
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.len() > 4 && f[4] == want)
        .filter_map(|f| f[2].split(':').nth(1).map(str::to_owned))
        .next_back()
    else {
        return;
    };
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(&minor).exists() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(dir)
            .status();
    }
    let _ = fs::write(dir.join(minor).join("abort"), b"1");
}

/// The names in directory `dir` that `keep` takes (as text): what a run
/// left there, such as temporary files (`.tmp`) or staging directories.
pub fn names_in(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| keep(n))
        .collect()
}

/// Every file (not directory) under `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// Runs `cmd`, which must succeed (if not, the command, its status,
/// stdout and stderr are shown); its output.
#[track_caller]
pub fn succeed(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (make test installs what tests run): {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `script` with `sh -e` in `dir` (it must succeed); its stdout.
#[track_caller]
pub fn sh(dir: &Path, script: &str) -> String {
    let out = succeed(Command::new("sh").arg("-ec").arg(script).current_dir(dir));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// git with an identity and a default branch, whatever the machine's
/// configuration says.
pub const GIT: &str =
    "git -c user.name=agent -c user.email=agent@example.com -c init.defaultBranch=main";

/// Runs a Python script with `args`; its stdout, trimmed (it must succeed).
#[track_caller]
pub fn python(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = succeed(Command::new("python3").arg("-c").arg(script).args(args));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether this run forces the portable fallbacks (`SESSIONFS_TEST_FALLBACKS=1`,
/// read by the debug builds the tests run): a test of what only a Linux
/// fast path can tell checks it only when they are not.
pub fn fallbacks_forced() -> bool {
    sessionfs::api::fallbacks_forced()
}

/// Drops the kernel's cached pages of the open file `f` (a file on a
/// mount), so that the next read of it reaches the daemon:
/// `POSIX_FADV_DONTNEED` on Linux. macOS has no such call: nothing there.
pub fn drop_cached_pages(f: &fs::File) {
    #[cfg(target_os = "linux")]
    nix::fcntl::posix_fadvise(f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .unwrap();
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}
