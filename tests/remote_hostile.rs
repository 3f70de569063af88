//! Hostile neighbours and hostile locations, through real mounts of
//! packets in moto behind the fault proxy: a node cache directory another
//! user prepared or filled with symlinks and FIFOs (finding 7 of issue
//! 32), and keys or URL paths with `.`, `..` or empty segments (finding
//! 9). See docs/remote.md ("The cache", "Locations").

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::s3::{self, Proxy, setup};
use common::{Mounted, fuse_available, snapshot, write};
use sha2::Digest as _;

/// `nobody`: the other user of these tests.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Gives `p` itself (a symlink's own owner, not its target's) to `uid`.
fn give(p: &Path, uid: u32) {
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        p,
        Some(nix::unistd::Uid::from_raw(uid)),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A workspace of 60 small files and one of 300 KB (more than a 64 KiB
/// cache holds), packed and put in a bucket of its own at `t.packet`.
/// Returns the directory, the workspace, the moto port and the location.
fn packet_in_store() -> (tempfile::TempDir, PathBuf, u16, String) {
    let (tmp, moto, b) = setup();
    let ws = tmp.path().join("ws");
    for i in 0..60u32 {
        let data: Vec<u8> = (0..2000 + i * 37).map(|j| (i * 7 + j) as u8).collect();
        write(&ws, &format!("src/f{i:02}.rs"), &data);
    }
    let big: Vec<u8> = (0..300_000u32).map(|j| (j % 251) as u8).collect();
    write(&ws, "data/big.bin", &big);
    let packet = tmp.path().join("t.packet");
    common::pack(&ws, &packet, &[]);
    moto.put(&b, "t.packet", &std::fs::read(&packet).unwrap());
    let loc = format!("s3://{b}/t.packet");
    (tmp, ws, moto.port, loc)
}

/// A directory only root can read, holding a file of root's and files
/// named as the cache's entries of every file of `ws` would be: what a
/// cache that follows a symlinked shard directory would delete (in an
/// eviction) or write (an entry) or create (the lock's target).
fn secret_dir(t: &Path, ws: &Path) -> PathBuf {
    let secret = t.join("secret");
    std::fs::create_dir(&secret).unwrap();
    write(&secret, "victim", b"root's own");
    for f in files(ws) {
        let bytes = std::fs::read(&f).unwrap();
        write(&secret, &hex(&bytes), &bytes);
    }
    chmod(&secret, 0o700);
    secret
}

/// Every regular file under `root`.
fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Fills the cache directory `cache` as a hostile neighbour would: every
/// shard directory a symlink into `secret` except the one of the FIFO, the
/// lock a symlink to `secret/lock-target`, and a FIFO at the entry of
/// `fifo_of` (a small file's bytes: one unit). Made by `owner` where root
/// can give them away.
fn booby_trap(cache: &Path, secret: &Path, fifo_of: &[u8], owner: Option<u32>) {
    let v1 = cache.join("v1");
    let fifo_hash = hex(fifo_of);
    for d in ["v1", "v1/objects", "v1/tmp"] {
        std::fs::create_dir_all(cache.join(d)).unwrap();
    }
    let fifo_shard = v1.join("objects").join(&fifo_hash[..2]);
    std::fs::create_dir(&fifo_shard).unwrap();
    nix::unistd::mkfifo(
        &fifo_shard.join(&fifo_hash),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let mut made = vec![fifo_shard.join(&fifo_hash)];
    for i in 0..=255u8 {
        let shard = v1.join(format!("objects/{i:02x}"));
        if shard != fifo_shard {
            std::os::unix::fs::symlink(secret, &shard).unwrap();
            made.push(shard);
        }
    }
    std::os::unix::fs::symlink(secret.join("lock-target"), v1.join("lock")).unwrap();
    made.push(v1.join("lock"));
    if let Some(uid) = owner {
        for p in made {
            give(&p, uid);
        }
    }
}

/// A packet in the store, a root-only directory beside it
/// ([`secret_dir`]) and the cache directory `cache` (the user's, `0700`),
/// trapped ([`booby_trap`]) with a FIFO at the entry of `src/f00.rs`.
struct Trapped {
    tmp: tempfile::TempDir,
    ws: PathBuf,
    port: u16,
    loc: String,
    secret: PathBuf,
    cache: PathBuf,
    /// The bytes whose entry is a FIFO.
    fifo_of: Vec<u8>,
}

fn trapped(owner: Option<u32>) -> Trapped {
    let (tmp, ws, port, loc) = packet_in_store();
    let secret = secret_dir(tmp.path(), &ws);
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o700);
    let fifo_of = std::fs::read(ws.join("src/f00.rs")).unwrap();
    booby_trap(&cache, &secret, &fifo_of, owner);
    Trapped {
        tmp,
        ws,
        port,
        loc,
        secret,
        cache,
        fifo_of,
    }
}

/// Reads every file of `ws` through `mnt` on a thread of its own, and
/// asserts it matches, within `bound`: a read that blocks fails the test
/// instead of hanging it.
fn reads_match_within(ws: &Path, mnt: &Path, bound: Duration) {
    let n = files(ws).len();
    let (ws, mnt) = (ws.to_owned(), mnt.to_owned());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for f in files(&ws) {
            let rel = f.strip_prefix(&ws).unwrap();
            let got = std::fs::read(mnt.join(rel));
            let _ = tx.send((rel.to_owned(), got.map(|g| g == std::fs::read(&f).unwrap())));
        }
    });
    for _ in 0..n {
        let (rel, same) = rx
            .recv_timeout(bound)
            .expect("a read through the mount blocked");
        assert!(same.unwrap(), "{} differs", rel.display());
    }
}

/// Finding 7 of issue 32, refused: as root, a world-writable cache
/// directory `nobody` prepared (shard directories symlinks into a
/// root-only directory, the lock a symlink, a FIFO at an entry) is
/// refused at mount, naming it and the fix, and nothing is touched:
/// nothing outside deleted, written or made, nothing inside changed.
#[test]
fn a_cache_directory_another_user_prepared_is_refused_at_mount() {
    if !fuse_available() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: needs root (the other user's directory is made with chown)");
        return;
    }
    let Trapped {
        tmp,
        port,
        loc,
        secret,
        cache,
        fifo_of,
        ..
    } = trapped(Some(NOBODY));
    let t = tmp.path();
    let fifo_shard = format!("v1/objects/{}", &hex(&fifo_of)[..2]);
    for d in ["", "v1", "v1/objects", "v1/tmp", &fifo_shard] {
        give(&cache.join(d), NOBODY);
        chmod(&cache.join(d), 0o777);
    }
    let (secret_before, cache_before) = (snapshot(&secret), snapshot(&cache));
    let mnt = t.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let env = s3::env(Proxy::start(port).port);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("SESSIONFS_REMOTE_TIMEOUT", "20"));
    let started = std::time::Instant::now();
    let r = common::run_env(
        [
            "mount",
            &loc,
            mnt.to_str().unwrap(),
            "--upper",
            t.join("upper").to_str().unwrap(),
            "--part",
            "workspace",
            "--cache",
            cache.to_str().unwrap(),
            "--cache-size",
            "64KiB",
        ],
        &env,
    );
    if r.code == 0 {
        common::detach(&mnt);
    }
    let e = r.fails(7, "target_unusable");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(cache.to_str().unwrap()) && msg.contains("belongs to uid 65534"),
        "{msg}"
    );
    assert!(msg.contains("chown") || msg.contains("--cache"), "{msg}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(snapshot(&secret), secret_before, "nothing outside changed");
    assert!(!secret.join("lock-target").exists());
    assert_eq!(snapshot(&cache), cache_before, "nothing inside changed");
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        0,
        "nothing mounted"
    );
}

/// Finding 7 of issue 32, recovered: a cache directory of the daemon's
/// user that holds the same traps (made by `nobody` where the test runs
/// as root) is used: the symlinks and the FIFO are removed, never followed
/// or opened; every read is served, none blocks; eviction under
/// `--cache-size 64KiB` removes only entries; nothing outside is deleted,
/// written or made.
#[test]
fn symlinks_and_fifos_in_the_cache_are_removed_and_reads_go_on() {
    if !fuse_available() {
        return;
    }
    let Trapped {
        tmp,
        ws,
        port,
        loc,
        secret,
        cache,
        ..
    } = trapped(is_root().then_some(NOBODY));
    let t = tmp.path();
    let secret_before = snapshot(&secret);
    let proxy = Proxy::start(port);
    let env = s3::env(proxy.port);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let m = Mounted::with_env(
        Path::new(&loc),
        &t.join("mnt"),
        &t.join("upper"),
        &[
            "--part",
            "workspace",
            "--cache",
            cache.to_str().unwrap(),
            "--cache-size",
            "64KiB",
            "--prefetch",
            "none",
        ],
        &env,
    );
    reads_match_within(&ws, &m.mnt, Duration::from_secs(60));
    m.umount();
    assert_eq!(snapshot(&secret), secret_before, "nothing outside changed");
    assert!(!secret.join("lock-target").exists());
    let lock = std::fs::symlink_metadata(cache.join("v1/lock")).unwrap();
    assert!(lock.is_file(), "the lock is a file of the cache's own");
    // What is left is entries in directories, each named by its hash,
    // and fewer than the packet's files (the bound evicted some).
    let mut entries = 0;
    for shard in std::fs::read_dir(cache.join("v1/objects")).unwrap() {
        let shard = shard.unwrap().path();
        assert!(
            std::fs::symlink_metadata(&shard).unwrap().is_dir(),
            "{}",
            shard.display()
        );
        for e in std::fs::read_dir(&shard).unwrap() {
            let e = e.unwrap().path();
            assert!(
                std::fs::symlink_metadata(&e).unwrap().is_file(),
                "{}",
                e.display()
            );
            assert_eq!(
                hex(&std::fs::read(&e).unwrap()),
                e.file_name().unwrap().to_str().unwrap()
            );
            entries += 1;
        }
    }
    assert!(entries < files(&ws).len(), "{entries} entries");
}

/// Finding 9 of issue 32: `.`, `..` and empty segments of a key or an URL
/// path are refused (`invalid_location`, exit 2) before any request, not
/// resolved into another bucket or object; a key of unusual characters is
/// written and read exactly as given.
#[test]
fn keys_and_url_paths_are_taken_literally() {
    let (tmp, moto, b) = setup();
    let t = tmp.path();
    let ws = t.join("ws");
    write(&ws, "a.txt", b"literal keys");
    let proxy = Proxy::start(moto.port);
    let run = |args: &[&str]| s3::remote(proxy.port, args, &[]);
    let ws_arg = ws.to_str().unwrap();
    let escape = format!("s3://other-{b}/x/../../{b}/dotdot.packet");
    for (args, says) in [
        (vec!["pack", "--workspace", ws_arg, "-o", &escape], "`..`"),
        (
            vec![
                "pack",
                "--workspace",
                ws_arg,
                "-o",
                &format!("s3://{b}//k.packet"),
            ],
            "empty segment",
        ),
        (vec!["inspect", &format!("s3://{b}/./k.packet")], "`.`"),
        (
            vec![
                "inspect",
                &format!("http://127.0.0.1:{}/{b}/x/../k.packet", proxy.port),
            ],
            "`..`",
        ),
        (
            vec![
                "digest",
                &format!("http://127.0.0.1:{}/{b}/x/%2e%2e/k.packet", proxy.port),
            ],
            "`%2e%2e`",
        ),
    ] {
        let r = run(&args);
        let e = r.fails(2, "invalid_location");
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(says) && msg.contains("literally"), "{msg}");
    }
    assert!(proxy.requests().is_empty(), "{:?}", proxy.requests());
    assert_eq!(moto.get(&b, "dotdot.packet"), None);
    // Unusual characters: stored at exactly that key, read back from it.
    let key = "dir/a%2Fb c+ü;=~.packet";
    let out = format!("s3://{b}/{key}");
    let r = run(&["pack", "--workspace", ws_arg, "-o", &out]);
    assert_eq!(r.ok()["output"], out.as_str());
    let listing = ureq::get(&format!("http://127.0.0.1:{}/{b}?list-type=2", moto.port))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let keys: Vec<&str> = listing
        .split("<Key>")
        .skip(1)
        .filter_map(|k| k.split_once("</Key>").map(|(k, _)| k))
        .collect();
    assert_eq!(keys, [key], "{listing}");
    let local = t.join("p.packet");
    common::pack(&ws, &local, &[]);
    assert_eq!(moto.get(&b, key).unwrap(), std::fs::read(&local).unwrap());
    let r = run(&["digest", &out]);
    assert_eq!(r.ok()["packet"], out.as_str());
}
