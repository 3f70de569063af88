//! The node-wide content cache: verified content of remote packets, kept on
//! disk under the SHA-256 of its bytes, shared by every mount and command
//! on the node and across packets (turn N+1's packet finds turn N's
//! content here).
//!
//! Each entry is one unit a manifest names a hash for: a whole small file
//! or one chunk of a larger one, so never more than a chunk (4 MiB). The
//! rules (STYLE habit 14, after Nydus's blob cache):
//!
//! - **An entry is its own proof.** Its name is the hash of its bytes; it
//!   is checked (length and SHA-256) every time it is read, and one that
//!   does not match is removed and reported as absent, so the caller
//!   fetches the content again. Nothing is trusted for having been written
//!   here: another process, a full disk or a crash may have damaged it.
//! - **Visible only when complete.** An entry is written to a private
//!   temporary file in `tmp/` and renamed into place: a process killed at
//!   any moment leaves at most a temporary file, never a partial entry
//!   under a hash. No fsync: after a power loss an entry may hold zeros,
//!   which the check above catches. Temporary files older than an hour
//!   are removed by the next eviction.
//! - **Bounded.** The entries' total size is kept under the cache's size:
//!   every [`EVICT_EVERY`]th of the bound added by this process, one thread
//!   lists the cache (under an advisory lock, so one process at a time) and
//!   removes the least recently used entries (by mtime, which a hit moves
//!   forward) until the total is [`EVICT_TO`] of the bound. An entry in use
//!   is read whole into memory when it is used, and a removal never
//!   affects a read already open, so no read in progress loses an entry.
//!
//! Layout: `DIR/v1/objects/<2 hex>/<64 hex>`, `DIR/v1/tmp/`, `DIR/v1/lock`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sha2::Digest as _;

/// An eviction runs each time this process has added this fraction of the
/// bound (as 1/N) since the last one.
pub const EVICT_EVERY: u64 = 16;

/// An eviction removes entries until the total is at most this fraction of
/// the bound (in percent), so that it does not run again at once.
pub const EVICT_TO: u64 = 90;

/// Temporary files older than this are left by a killed process and are
/// removed by an eviction.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// What a [`Cache`] has done, for results and tests.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Entries found and verified.
    pub hits: AtomicU64,
    /// Entries looked for and absent.
    pub misses: AtomicU64,
    /// Entries found damaged and removed.
    pub damaged: AtomicU64,
    /// Entries added.
    pub added: AtomicU64,
    /// Entries removed by eviction.
    pub evicted: AtomicU64,
}

/// The content cache at a directory (see the module's text).
pub struct Cache {
    root: PathBuf,
    max_bytes: u64,
    /// Bytes added by this process since the last eviction.
    added_since: AtomicU64,
    evicting: Arc<AtomicBool>,
    /// What it has done.
    pub stats: CacheStats,
}

/// The cache directory unless `--cache` names one: `SESSIONFS_CACHE_DIR`,
/// else `/var/cache/sessionfs` for root, else `$XDG_CACHE_HOME/sessionfs`,
/// else `~/.cache/sessionfs`.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SESSIONFS_CACHE_DIR").filter(|d| !d.is_empty()) {
        return d.into();
    }
    if nix::unistd::geteuid().is_root() {
        return "/var/cache/sessionfs".into();
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("sessionfs");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/sessionfs"),
        None => std::env::temp_dir().join(format!("sessionfs-cache-{}", nix::unistd::geteuid())),
    }
}

fn hex(hash: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Cache {
    /// Opens (making it if needed) the cache at `dir`, bounded to
    /// `max_bytes`. A directory that cannot be made or written is an
    /// error naming it and why.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Cache> {
        let root = dir.join("v1");
        for sub in ["objects", "tmp"] {
            std::fs::create_dir_all(root.join(sub)).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot make the cache directory {}: {e}",
                        root.join(sub).display()
                    ),
                )
            })?;
        }
        Ok(Cache {
            root,
            max_bytes: max_bytes.max(1),
            added_since: AtomicU64::new(0),
            evicting: Arc::new(AtomicBool::new(false)),
            stats: CacheStats::default(),
        })
    }

    /// The directory temporary files go to (on the cache's file system).
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn entry_path(&self, hash: &[u8; 32]) -> PathBuf {
        let h = hex(hash);
        self.root.join("objects").join(&h[..2]).join(h)
    }

    /// Whether an entry for `hash` is there (unchecked: [`Cache::get`]
    /// checks it when it is read).
    pub fn has(&self, hash: &[u8; 32]) -> bool {
        self.entry_path(hash).exists()
    }

    /// Fills `out` with the entry for `hash` if there is one of exactly
    /// `out.len()` bytes whose SHA-256 is `hash`; removes an entry that
    /// does not match. Whether `out` holds it.
    pub fn get(&self, hash: &[u8; 32], out: &mut [u8]) -> bool {
        let path = self.entry_path(hash);
        let found = (|| -> std::io::Result<bool> {
            let mut f = File::open(&path)?;
            let len = f.metadata()?.len();
            if len != out.len() as u64 {
                return Ok(false);
            }
            f.read_exact(out)?;
            // Nothing more: the entry is as long as its metadata said.
            let sound = sha2::Sha256::digest(&*out).as_slice() == hash;
            if sound {
                // Recently used: moves it back in the eviction order.
                let _ = f.set_modified(SystemTime::now());
            }
            Ok(sound)
        })();
        match found {
            Ok(true) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                false
            }
            other => {
                tracing::warn!(entry = %path.display(), result = ?other.map_err(|e| e.to_string()),
                    "a cache entry does not match its hash; removed, and fetched again");
                self.stats.damaged.fetch_add(1, Ordering::Relaxed);
                let _ = std::fs::remove_file(&path);
                false
            }
        }
    }

    /// Adds `bytes`, whose SHA-256 the caller has checked is `hash`. A
    /// failure (a full disk, a read-only cache) is logged and otherwise
    /// ignored: the cache only saves fetching again.
    pub fn put(&self, hash: &[u8; 32], bytes: &[u8]) {
        let path = self.entry_path(hash);
        if path.exists() {
            return;
        }
        let put = (|| -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut tmp = tempfile::Builder::new()
                .prefix(".entry-")
                .tempfile_in(self.tmp_dir())?;
            tmp.write_all(bytes)?;
            tmp.persist(&path).map_err(|e| e.error)?;
            Ok(())
        })();
        match put {
            Ok(()) => {
                self.stats.added.fetch_add(1, Ordering::Relaxed);
                let added = self
                    .added_since
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed)
                    + bytes.len() as u64;
                if added >= self.max_bytes / EVICT_EVERY {
                    self.evict_in_background();
                }
            }
            Err(e) => {
                tracing::warn!(entry = %path.display(), error = %e, "cannot add to the cache")
            }
        }
    }

    /// Starts an eviction on a thread of its own unless one is running in
    /// this process.
    fn evict_in_background(&self) {
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        self.added_since.store(0, Ordering::Relaxed);
        let (root, max, flag) = (self.root.clone(), self.max_bytes, self.evicting.clone());
        let spawned = std::thread::Builder::new()
            .name("cache-evict".into())
            .spawn(move || {
                match evict(&root, max) {
                    Ok(n) if n > 0 => tracing::debug!(removed = n, "cache eviction"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "cache eviction failed"),
                }
                flag.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.evicting.store(false, Ordering::Release);
        }
    }

    /// Runs an eviction now, in this thread; returns the entries removed.
    pub fn evict_now(&self) -> std::io::Result<u64> {
        let n = evict(&self.root, self.max_bytes)?;
        self.stats.evicted.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }
}

/// Removes the least recently used entries under `root` until their total
/// is at most [`EVICT_TO`] percent of `max`, and stale temporary files;
/// one process at a time (others skip). Returns the entries removed.
fn evict(root: &Path, max: u64) -> std::io::Result<u64> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o644)
        .open(root.join("lock"))?;
    let Ok(_held) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
    else {
        return Ok(0);
    };
    let now = SystemTime::now();
    for e in std::fs::read_dir(root.join("tmp"))?.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > STALE_TMP);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let mut entries = Vec::new();
    let mut total = 0u64;
    for d in std::fs::read_dir(root.join("objects"))?.flatten() {
        let Ok(files) = std::fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.flatten() {
            let Ok(m) = f.metadata() else { continue };
            total += m.len();
            entries.push((
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                f.path(),
            ));
        }
    }
    if total <= max {
        return Ok(0);
    }
    let target = max / 100 * EVICT_TO;
    entries.sort_unstable_by_key(|e| e.0);
    let mut removed = 0;
    for (_, len, path) in entries {
        if total <= target {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(b: &[u8]) -> [u8; 32] {
        sha2::Sha256::digest(b).into()
    }

    #[test]
    fn entries_are_served_only_when_they_match_their_hash() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        let data = b"hello cache".to_vec();
        let h = hash(&data);
        let mut out = vec![0; data.len()];
        assert!(!c.get(&h, &mut out), "empty cache");
        c.put(&h, &data);
        assert!(c.get(&h, &mut out));
        assert_eq!(out, data);
        // Damaged on disk: removed and reported absent.
        std::fs::write(c.entry_path(&h), b"hello cachE").unwrap();
        assert!(!c.get(&h, &mut out));
        assert!(!c.entry_path(&h).exists());
        assert_eq!(c.stats.damaged.load(Ordering::Relaxed), 1);
        // Of another length than asked: not served.
        c.put(&h, &data);
        assert!(!c.get(&h, &mut vec![0; data.len() + 1]));
        // Nothing but entries is left behind.
        assert_eq!(std::fs::read_dir(c.tmp_dir()).unwrap().count(), 0);
    }

    #[test]
    fn eviction_removes_the_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        // Filled through a handle with room (no eviction in the background
        // meanwhile), then bounded to 10,000 bytes: 12,000 are there.
        let big = Cache::open(dir.path(), 1 << 30).unwrap();
        let c = Cache::open(dir.path(), 10_000).unwrap();
        let blobs: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 1000]).collect();
        for (i, b) in blobs.iter().enumerate() {
            big.put(&hash(b), b);
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64);
            File::open(c.entry_path(&hash(b)))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // The oldest, used again, is the newest now.
        assert!(c.get(&hash(&blobs[0]), &mut vec![0; 1000]));
        c.evict_now().unwrap();
        let left: Vec<bool> = blobs
            .iter()
            .map(|b| c.entry_path(&hash(b)).exists())
            .collect();
        assert!(left.iter().filter(|l| **l).count() <= 9, "{left:?}");
        assert!(left[0], "the entry used last is kept: {left:?}");
        assert!(!left[1], "the least recently used goes first: {left:?}");
        assert!(left[11], "{left:?}");
    }
}
