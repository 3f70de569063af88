//! A remote packet as a mount reads it: a sparse local file of the
//! object's length (the spool), filled on demand by ranged GETs and from
//! the node-wide [`Cache`], one verified unit at a time.
//!
//! The layer above gives the units: the byte ranges of the object the
//! manifest names a SHA-256 for (a small file's content, a chunk of a
//! larger one). A range is asked for with [`Spool::ensure`]; every unit it
//! touches is filled before it returns:
//!
//! 1. from the cache, when it holds an entry of that hash (checked);
//! 2. else by one ranged GET that also takes the units around it that are
//!    not filled yet (back within half a block, then forward), while they
//!    lie close together and the request stays within the block size
//!    (small files are fetched a block at a time, not one request each);
//! 3. each unit fetched is hashed: one that matches is written to the
//!    spool and added to the cache; one that does not is fetched once more
//!    on its own, then refused ([`Error::Corrupt`]).
//!
//! So no byte reaches the spool without matching the manifest, and the
//! layer above reads the spool as it reads a local packet, but does not
//! hash it again: its chunks are these units, and the spool is written by
//! nothing else. The spool is an unlinked file in the cache's directory: a
//! killed daemon leaves nothing of it.
//!
//! A reader moving forward gets read-ahead: the units after it are fetched
//! on background threads, in a window of twice what its stream has read
//! (from one block up to [`MAX_WINDOW`]). A reader that says what it will
//! read (a seal: [`Spool::ensure_planned`]) gets exactly that, in larger
//! requests, and no read-ahead. Fetched bytes are
//! held in memory only between the response and the spool, and all
//! fetches together hold at most the memory budget: a read waits for
//! room, read-ahead that finds none is skipped.

use std::collections::HashSet;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use sha2::Digest as _;

use super::ReadAt;
use super::cache::Cache;
use super::error::{Error, Result};

/// The default block size: a fetch of small files covers up to this much
/// of the object. 1 MiB: a little over what one round trip carries at no
/// extra latency in region (mountpoint-s3's first request is about the
/// same), and few enough bytes that reading one small file costs little
/// more than the file.
pub const DEFAULT_BLOCK: u64 = 1 << 20;

/// The default memory budget of all fetches in flight.
pub const DEFAULT_MAX_MEMORY: u64 = 256 << 20;

/// Read-ahead grows to at most this many bytes ahead of a reader.
pub const MAX_WINDOW: u64 = 32 << 20;

/// Threads fetching ahead of readers.
const BACKGROUND_THREADS: usize = 4;

/// Requests a prefetch (`--prefetch all|trace`) keeps in flight: one at a
/// time waits a round trip per request (1 GiB in requests of 4 MiB took
/// 21 s at 10 ms and 1 Gbit/s, twice the transfer).
const PREFETCH_STREAMS: usize = 4;

/// A prefetch's requests bring up to this much (or the block size, if
/// larger): nobody waits for them, so they are sized for the link.
const PREFETCH_BLOCK: u64 = 4 << 20;

/// Units closer than this are fetched in one request (the bytes between
/// are member headers and padding: a few hundred bytes, more for long
/// names).
const MAX_GAP: u64 = 64 << 10;

/// A range of the object with the SHA-256 the manifest gives for it.
#[derive(Clone, Debug)]
pub struct Unit {
    /// Its first byte in the object.
    pub start: u64,
    /// Its length (not 0).
    pub len: u64,
    /// The SHA-256 of its bytes.
    pub hash: [u8; 32],
    /// The file it belongs to (units of one file are consecutive):
    /// read-ahead follows a reader within a file.
    pub group: u32,
}

impl Unit {
    fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// What to fetch before it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// Only what is read, and read-ahead of sequential readers.
    #[default]
    None,
    /// The units a trace names, in its order, in the background, yielding
    /// to reads (the caller hands them over: [`Spool::prefetch`]).
    Trace,
    /// Everything, in object order, in the background, yielding to reads.
    All,
}

/// How a spool fetches.
#[derive(Clone, Copy, Debug)]
pub struct SpoolOptions {
    /// See [`DEFAULT_BLOCK`].
    pub block: u64,
    /// See [`DEFAULT_MAX_MEMORY`].
    pub max_memory: u64,
    /// What to fetch in the background.
    pub prefetch: Prefetch,
}

impl Default for SpoolOptions {
    fn default() -> SpoolOptions {
        SpoolOptions {
            block: DEFAULT_BLOCK,
            max_memory: DEFAULT_MAX_MEMORY,
            prefetch: Prefetch::None,
        }
    }
}

/// What a spool has done, for `status` and tests.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Bytes fetched from the store (what the responses carried).
    pub fetched_bytes: AtomicU64,
    /// Fetches (one ranged GET each, retries aside).
    pub fetches: AtomicU64,
    /// Bytes filled from the cache.
    pub cache_bytes: AtomicU64,
    /// Units that did not match their hash when fetched (and were fetched
    /// again).
    pub refetched: AtomicU64,
    /// Bytes fetched ahead of readers or by `--prefetch all`.
    pub background_bytes: AtomicU64,
}

/// What [`Spool::report`] gives (`status`'s `remote`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct SpoolReport {
    /// The location.
    pub location: String,
    /// Bytes fetched from the store.
    pub fetched_bytes: u64,
    /// Ranged GETs that brought them (retries not counted).
    pub fetches: u64,
    /// Bytes taken from the node-wide cache instead.
    pub cache_bytes: u64,
    /// Bytes fetched ahead of readers or by `--prefetch all`.
    pub background_bytes: u64,
    /// Units fetched again because their bytes did not match.
    pub refetched: u64,
    /// Units of content filled so far.
    pub filled_units: u64,
    /// Units of content in the packet.
    pub units: u64,
}

/// A memory budget: bytes of fetches in flight.
struct Budget {
    used: Mutex<u64>,
    freed: Condvar,
    max: u64,
}

impl Budget {
    /// Takes `n` bytes, waiting for room if `wait` (a fetch larger than
    /// the whole budget gets it when nothing else is in flight), else
    /// only if there is room now.
    fn take(&self, n: u64, wait: bool) -> Option<Taken<'_>> {
        let mut used = self.used.lock();
        loop {
            if *used == 0 || *used + n <= self.max {
                *used += n;
                return Some(Taken(self, n));
            }
            if !wait {
                return None;
            }
            self.freed.wait(&mut used);
        }
    }
}

struct Taken<'a>(&'a Budget, u64);

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        *self.0.used.lock() -= self.1;
        self.0.freed.notify_all();
    }
}

/// The spool of one remote object (see the module's text).
pub struct Spool {
    location: super::Location,
    remote: Box<dyn ReadAt>,
    file: File,
    units: Vec<Unit>,
    filled: Vec<AtomicU64>,
    /// Units being filled: others wanting them wait on `done`.
    claims: Mutex<HashSet<usize>>,
    done: Condvar,
    cache: Option<Arc<Cache>>,
    options: SpoolOptions,
    budget: Budget,
    /// Read-ahead state per stream: the file of the last unit a reader
    /// filled (or `u32::MAX` for runs of small files), and the window.
    streams: Mutex<lru::LruCache<u32, Stream>>,
    /// Reads waiting on a fetch: background work yields while any do.
    waiting: AtomicUsize,
    /// Units fetched and in the spool, to be added to the cache by its
    /// writer thread, so that no read waits for the cache's files (a
    /// block of small files is hundreds of entries).
    to_cache: Arc<ToCache>,
    /// Work for the read-ahead threads.
    background: Mutex<Option<mpsc::Sender<usize>>>,
    stopped: AtomicBool,
    /// What it has done.
    pub stats: SpoolStats,
}

#[derive(Clone, Copy)]
struct Stream {
    /// The window, in bytes.
    window: u64,
    /// Units before this one have been handed out to read-ahead.
    ahead_to: usize,
    /// The stream's first unit: a read of a unit from here to `ahead_to`
    /// (in any order: a directory's files are read in hash order) goes on
    /// with it.
    from: usize,
    /// Bytes of the units read in the stream: the window is twice that.
    read: u64,
    /// The last unit read (its reads are counted once).
    last: usize,
}

/// Streams whose read-ahead state is kept (a reader per file; 64 readers
/// at once keep theirs).
const STREAMS: usize = 128;

impl Spool {
    /// A spool for `remote` with `units` (sorted by start, not
    /// overlapping, inside the object), its file made in `dir` (the
    /// cache's directory, so cached content is copied locally) and
    /// removed from it at once.
    pub fn new(
        location: super::Location,
        remote: Box<dyn ReadAt>,
        units: Vec<Unit>,
        dir: &std::path::Path,
        cache: Option<Arc<Cache>>,
        options: SpoolOptions,
    ) -> std::io::Result<Arc<Spool>> {
        debug_assert!(units.windows(2).all(|w| w[0].end() <= w[1].start));
        let file = tempfile::tempfile_in(dir).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot make the spool file in {}: {e}", dir.display()),
            )
        })?;
        file.set_len(remote.len())?;
        let words = units.len().div_ceil(64);
        let spool = Arc::new(Spool {
            location,
            remote,
            file,
            filled: (0..words).map(|_| AtomicU64::new(0)).collect(),
            units,
            claims: Mutex::new(HashSet::new()),
            done: Condvar::new(),
            cache,
            budget: Budget {
                used: Mutex::new(0),
                freed: Condvar::new(),
                max: options.max_memory.max(1),
            },
            options,
            streams: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(STREAMS).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
            waiting: AtomicUsize::new(0),
            to_cache: Arc::default(),
            background: Mutex::new(None),
            stopped: AtomicBool::new(false),
            stats: SpoolStats::default(),
        });
        spool.start_background()?;
        Ok(spool)
    }

    /// The content cache it fills from and into, and how it fetches: what
    /// a mount that moves onto another remote packet (a rebase) goes on
    /// with.
    pub fn settings(&self) -> (Option<Arc<Cache>>, SpoolOptions) {
        (self.cache.clone(), self.options)
    }

    /// Fills `buf` with the object's bytes at `at`, as a mount reads
    /// ([`Spool::ensure`] first): content from the spool, verified; bytes
    /// outside units (member headers and padding, which no mount reads)
    /// fetched as they are, for the packet layer to check.
    pub fn read_exact_at(&self, buf: &mut [u8], at: u64) -> Result<()> {
        let range = at..at + buf.len() as u64;
        self.ensure(range.clone())?;
        self.read_filled(buf, range)
    }

    /// [`Spool::read_exact_at`] for a planned reader
    /// ([`Spool::ensure_planned`]).
    pub fn read_planned_at(&self, buf: &mut [u8], at: u64) -> Result<()> {
        let range = at..at + buf.len() as u64;
        self.ensure_planned(range.clone())?;
        self.read_filled(buf, range)
    }

    /// Reads `range` (into `buf`) once its units are filled: their bytes
    /// from the spool file, the bytes between them from the object.
    fn read_filled(&self, buf: &mut [u8], range: Range<u64>) -> Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        self.file
            .read_exact_at(buf, range.start)
            .map_err(|e| Error::Config {
                location: self.remote.shown().into(),
                reason: format!("cannot read the mount's spool file: {e}"),
            })?;
        let mut pos = range.start;
        let units = self.units_of(&range);
        let ends = self.units[units]
            .iter()
            .map(|u| (u.start, u.end()))
            .chain(std::iter::once((range.end, range.end)));
        for (start, end) in ends {
            let gap = pos..start.min(range.end);
            if !gap.is_empty() {
                let at = (gap.start - range.start) as usize;
                let n = (gap.end - gap.start) as usize;
                self.fetch(&mut buf[at..at + n], gap.start, true)?;
            }
            pos = pos.max(end);
        }
        Ok(())
    }

    /// Where the object is (for a seal's server-side copies: its bucket
    /// and key).
    pub fn location(&self) -> &super::Location {
        &self.location
    }

    /// The remote object, pinned to its length and ETag
    /// ([`ReadAt::etag`]).
    pub fn remote(&self) -> &dyn ReadAt {
        &*self.remote
    }

    /// The units.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Whether unit `u` is filled.
    pub fn is_filled(&self, u: usize) -> bool {
        self.filled[u / 64].load(Ordering::Acquire) & (1 << (u % 64)) != 0
    }

    fn set_filled(&self, u: usize) {
        self.filled[u / 64].fetch_or(1 << (u % 64), Ordering::AcqRel);
    }

    /// Offers the bytes of unit `u` from a copy the caller holds (what a
    /// seal just uploaded, from its upper directory): hashed, and written
    /// to the spool and queued for the cache if they match the manifest.
    /// Returns whether the unit is filled now.
    pub fn supply(&self, u: usize, bytes: &[u8]) -> bool {
        let Some(w) = self.units.get(u).filter(|w| w.len == bytes.len() as u64) else {
            return false;
        };
        self.is_filled(u)
            || (sha2::Sha256::digest(bytes).as_slice() == w.hash && self.put_new(u, bytes).is_ok())
    }

    /// Writes bytes that are not part of any unit (the manifest member,
    /// fetched when the packet was opened) into the spool.
    pub fn put_raw(&self, bytes: &[u8], at: u64) -> std::io::Result<()> {
        self.file.write_all_at(bytes, at)
    }

    /// What it has done so far.
    pub fn report(&self) -> SpoolReport {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SpoolReport {
            location: self.remote.shown().into(),
            fetched_bytes: n(&self.stats.fetched_bytes),
            fetches: n(&self.stats.fetches),
            cache_bytes: n(&self.stats.cache_bytes),
            background_bytes: n(&self.stats.background_bytes),
            refetched: n(&self.stats.refetched),
            filled_units: self.filled_units() as u64,
            units: self.units.len() as u64,
        }
    }

    /// Units wholly filled, as a count.
    pub fn filled_units(&self) -> usize {
        self.filled
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    /// Makes every unit that `range` (of the object) touches filled and
    /// verified, fetching what is missing; bytes outside units (headers)
    /// are not fetched. For a reader whose next read is not known (a
    /// mount's): a miss brings the units around it (a block), and a reader
    /// moving forward gets read-ahead.
    pub fn ensure(&self, range: Range<u64>) -> Result<()> {
        if let Some(last) = self.ensure_within(range, None)? {
            self.read_ahead(last);
        }
        Ok(())
    }

    /// [`Spool::ensure`] for a reader that knows what it reads, a seal
    /// writing the packet in order, which asks for each run of the parent
    /// it needs whole: a miss brings only units of `range`, in requests of
    /// up to 4 MiB, and nothing is read ahead (a seal reads runs of the
    /// parent between the runs the store copies, and read-ahead would fetch
    /// the copied runs too).
    pub fn ensure_planned(&self, range: Range<u64>) -> Result<()> {
        let units = self.units_of(&range);
        let block = self.options.block.max(PREFETCH_BLOCK);
        self.ensure_within(range, Some((units, block))).map(|_| ())
    }

    /// The units `range` touches.
    pub fn units_of(&self, range: &Range<u64>) -> Range<usize> {
        let first = self.units.partition_point(|u| u.end() <= range.start);
        let end = first + self.units[first..].partition_point(|u| u.start < range.end);
        first..end
    }

    /// Fills the units of `range`, each miss's request kept within
    /// `bounds` (units) and its block when given (else the block size,
    /// anywhere); the last unit it touched, if any.
    fn ensure_within(
        &self,
        range: Range<u64>,
        bounds: Option<(Range<usize>, u64)>,
    ) -> Result<Option<usize>> {
        let units = self.units_of(&range);
        let (bounds, block) = bounds.unwrap_or((0..self.units.len(), self.options.block));
        for u in units.clone() {
            if !self.is_filled(u) {
                self.waiting.fetch_add(1, Ordering::AcqRel);
                let r = self.fill(u, true, block, &bounds);
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                r?;
            }
        }
        Ok(units.end.checked_sub(1).filter(|_| !units.is_empty()))
    }

    /// Fills unit `u` (and, in the same request, units around it within
    /// `bounds`; see the module's text). A read (`foreground`) waits for a
    /// fetch of `u` already in flight and for memory; background work
    /// skips instead.
    fn fill(&self, u: usize, foreground: bool, block: u64, bounds: &Range<usize>) -> Result<()> {
        {
            let mut claims = self.claims.lock();
            loop {
                if self.is_filled(u) {
                    return Ok(());
                }
                if !claims.contains(&u) {
                    claims.insert(u);
                    break;
                }
                if !foreground {
                    return Ok(());
                }
                self.done.wait(&mut claims);
            }
        }
        let mut plan = vec![u];
        let release = Release {
            spool: self,
            units: &mut plan,
        };
        let unit = &self.units[u];
        if let Some(cache) = &self.cache {
            let mut buf = vec![0u8; unit.len as usize];
            if cache.get(&unit.hash, &mut buf) {
                self.put(u, &buf)?;
                self.stats
                    .cache_bytes
                    .fetch_add(unit.len, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.extend(&mut *release.units, block, bounds);
        let plan = &release.units[..];
        let (start, end) = (
            self.units[plan[0]].start,
            self.units[plan[plan.len() - 1]].end(),
        );
        let Some(_room) = self.budget.take(end - start, foreground) else {
            return Ok(());
        };
        let mut buf = vec![0u8; (end - start) as usize];
        self.fetch(&mut buf, start, foreground)?;
        let mut result = Ok(());
        for &v in plan {
            let w = &self.units[v];
            let at = (w.start - start) as usize;
            let bytes = &mut buf[at..at + w.len as usize];
            if sha2::Sha256::digest(&*bytes).as_slice() != w.hash {
                self.stats.refetched.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    location = self.remote.shown(),
                    start = w.start,
                    end = w.end(),
                    "fetched content does not match the manifest; fetching it again"
                );
                self.fetch(bytes, w.start, foreground)?;
                if sha2::Sha256::digest(&*bytes).as_slice() != w.hash {
                    tracing::error!(
                        location = self.remote.shown(),
                        start = w.start,
                        end = w.end(),
                        "fetched content does not match the manifest, twice"
                    );
                    if v == u {
                        result = Err(Error::Corrupt {
                            location: self.remote.shown().into(),
                            start: w.start,
                            end: w.end(),
                        });
                    }
                    continue;
                }
            }
            self.put_new(v, bytes)?;
        }
        result
    }

    /// One ranged GET into `buf`, counted.
    fn fetch(&self, buf: &mut [u8], at: u64, foreground: bool) -> Result<()> {
        self.remote.read_exact_at(buf, at, self.remote.deadline())?;
        let n = buf.len() as u64;
        self.stats.fetched_bytes.fetch_add(n, Ordering::Relaxed);
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        if !foreground {
            self.stats.background_bytes.fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes the verified bytes of unit `u` to the spool and marks it.
    fn put(&self, u: usize, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all_at(bytes, self.units[u].start)
            .map_err(|e| Error::Config {
                location: self.remote.shown().into(),
                reason: format!("cannot write the mount's spool file: {e}"),
            })?;
        self.set_filled(u);
        Ok(())
    }

    /// [`Spool::put`] of bytes that did not come from the cache: they are
    /// queued for the cache's writer thread too.
    fn put_new(&self, u: usize, bytes: &[u8]) -> Result<()> {
        self.put(u, bytes)?;
        if self.cache.is_some() {
            self.to_cache.state.lock().units.push_back(u);
            self.to_cache.more.notify_one();
        }
        Ok(())
    }

    /// Makes `plan` (which holds one claimed unit, `u`) the units one
    /// request should bring: those around `u` that are not filled, not
    /// claimed, not in the cache, and close to their neighbours, first
    /// back from `u` within half a block (a listing runs in hash order, so
    /// a reader of a directory lands in the middle of its files and wants
    /// those before too), then forward within the block.
    fn extend(&self, plan: &mut Vec<usize>, block: u64, bounds: &Range<usize>) {
        let u = plan[0];
        if self.units[u].len >= block {
            return;
        }
        let mut claims = self.claims.lock();
        let free = |v: usize, claims: &HashSet<usize>| {
            !self.is_filled(v)
                && !claims.contains(&v)
                && !self
                    .cache
                    .as_ref()
                    .is_some_and(|c| c.has(&self.units[v].hash))
        };
        let mut lo = u;
        while lo > bounds.start {
            let (w, next) = (&self.units[lo - 1], &self.units[lo]);
            if next.start - w.end() > MAX_GAP
                || self.units[u].end() - w.start > block / 2
                || !free(lo - 1, &claims)
            {
                break;
            }
            lo -= 1;
        }
        let start = self.units[lo].start;
        let mut hi = u + 1;
        while let Some(w) = self.units.get(hi).filter(|_| hi < bounds.end) {
            if w.start - self.units[hi - 1].end() > MAX_GAP
                || w.end() - start > block
                || !free(hi, &claims)
            {
                break;
            }
            hi += 1;
        }
        claims.extend((lo..hi).filter(|&v| v != u));
        plan.clear();
        plan.extend(lo..hi);
    }

    /// After a read that ended in unit `u`: if the reader is moving
    /// forward, or reading within what its stream covers, hands the units
    /// ahead of it (within its window: twice what the stream has read,
    /// from one block up to [`MAX_WINDOW`]) to the background threads.
    /// Growing with what was read, not with each read, keeps a reader of a
    /// few small files in a row (an agent's edits copying them up) from
    /// fetching megabytes it never reads.
    fn read_ahead(&self, u: usize) {
        let unit = &self.units[u];
        let chunked = self.units.get(u + 1).is_some_and(|n| n.group == unit.group)
            || (u > 0 && self.units[u - 1].group == unit.group);
        let key = if chunked { unit.group } else { u32::MAX };
        // Forward: the unit before was read (or, in a chunked file, this
        // is its first chunk).
        let forward =
            u == 0 || self.is_filled(u - 1) || (chunked && self.units[u - 1].group != unit.group);
        let mut streams = self.streams.lock();
        let s = streams.get(&key).copied();
        let first = self.options.block.max(unit.len);
        let mut s = match s {
            Some(s) if (s.from..s.ahead_to).contains(&u) => {
                let read = s.read + if u == s.last { 0 } else { unit.len };
                Stream {
                    window: (2 * read).clamp(first, MAX_WINDOW.max(first)),
                    read,
                    last: u,
                    ..s
                }
            }
            _ if forward => Stream {
                window: first,
                ahead_to: u + 1,
                from: u,
                read: unit.len,
                last: u,
            },
            _ => {
                streams.pop(&key);
                return;
            }
        };
        // Hand out units up to `window` bytes past the end of `u`.
        let limit = unit.end() + s.window;
        let mut end = s.ahead_to.max(u + 1);
        while self
            .units
            .get(end)
            .is_some_and(|w| w.start < limit && (!chunked || w.group == unit.group))
        {
            end += 1;
        }
        self.hand_out(s.ahead_to.max(u + 1)..end);
        s.ahead_to = end;
        streams.put(key, s);
    }

    /// Hands `units` that are not filled to the read-ahead threads, a
    /// request's worth (a block) at a time.
    fn hand_out(&self, units: Range<usize>) {
        let Some(tx) = self.background.lock().clone() else {
            return;
        };
        let mut request_start = None;
        for v in units {
            if self.is_filled(v) {
                continue;
            }
            let w = &self.units[v];
            if request_start.is_none_or(|rs| w.end() - rs > self.options.block) {
                request_start = Some(w.start);
                let _ = tx.send(v);
            }
        }
    }

    /// Starts the background threads: read-ahead, and `--prefetch all`.
    fn start_background(self: &Arc<Spool>) -> std::io::Result<()> {
        let (tx, rx) = mpsc::channel::<usize>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..BACKGROUND_THREADS {
            let (weak, rx) = (Arc::downgrade(self), rx.clone());
            std::thread::Builder::new()
                .name(format!("fetch-ahead-{i}"))
                .spawn(move || {
                    loop {
                        let next = rx.lock().recv_timeout(Duration::from_millis(200));
                        let Some(spool) = weak.upgrade() else { return };
                        if spool.stopped.load(Ordering::Acquire) {
                            return;
                        }
                        match next {
                            Ok(u) => {
                                let (block, all) = (spool.options.block, 0..spool.units.len());
                                if let Err(e) = spool.fill(u, false, block, &all) {
                                    tracing::debug!(unit = u, error = %e, "fetching ahead failed; left to the reader");
                                }
                            }
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    }
                })?;
        }
        *self.background.lock() = Some(tx);
        if self.cache.is_some() {
            // Holds the spool only while it adds a unit, so that the spool
            // ends (and drains what is left) when its owner lets it go.
            let (weak, queue) = (Arc::downgrade(self), self.to_cache.clone());
            std::thread::Builder::new()
                .name("cache-writer".into())
                .spawn(move || {
                    loop {
                        let next = queue.take(Some(Duration::from_millis(200)));
                        // Ends with the spool; until then it takes turns
                        // with `finish`, which drains what is left.
                        let Some(spool) = weak.upgrade() else {
                            if next.is_some() {
                                queue.done();
                            }
                            return;
                        };
                        if let Some(u) = next {
                            spool.add_to_cache(u);
                            queue.done();
                        }
                    }
                })?;
        }
        if self.options.prefetch == Prefetch::All {
            self.prefetch(0..self.units.len())?;
        }
        Ok(())
    }

    /// Fills `units`, in their order, at low priority: on
    /// [`PREFETCH_STREAMS`] threads taking them in turn, each request
    /// bringing up to [`PREFETCH_BLOCK`], while no read waits on a fetch.
    pub fn prefetch(
        self: &Arc<Spool>,
        units: impl IntoIterator<Item = usize, IntoIter: Send + 'static>,
    ) -> std::io::Result<()> {
        let units = Arc::new(Mutex::new(units.into_iter()));
        for i in 0..PREFETCH_STREAMS {
            let (weak, units) = (Arc::downgrade(self), units.clone());
            std::thread::Builder::new()
                .name(format!("prefetch-{i}"))
                .spawn(move || prefetch_in_order(weak, &units))?;
        }
        Ok(())
    }

    /// Stops the background threads (they end within a fraction of a
    /// second; a fetch in flight completes first).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.background.lock().take();
        self.to_cache.more.notify_all();
    }

    /// Ends the spool's work when its mount ends: the background threads
    /// stop, and what was fetched but is not in the cache yet is added
    /// (for at most a few seconds; what is left after that is fetched
    /// again if it is needed).
    pub fn finish(&self) {
        self.stop();
        self.drain_to_cache(DRAIN_LIMIT);
    }

    /// Adds unit `u` (filled: verified, and never written again) to the
    /// cache, read back from the spool file.
    fn add_to_cache(&self, u: usize) {
        let Some(cache) = &self.cache else { return };
        let w = &self.units[u];
        let mut buf = vec![0u8; w.len as usize];
        match self.file.read_exact_at(&mut buf, w.start) {
            Ok(()) => cache.put(&w.hash, &buf),
            Err(e) => {
                tracing::debug!(unit = u, error = %e, "cannot read the spool to fill the cache")
            }
        }
    }

    /// Adds what is waiting to the cache, for at most `limit`: a mount's
    /// last reads reach the cache when it ends (what is left after that is
    /// fetched again if it is needed).
    fn drain_to_cache(&self, limit: Duration) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            if let Some(u) = self.to_cache.take(None) {
                self.add_to_cache(u);
                self.to_cache.done();
                continue;
            }
            // Nothing queued: wait for the writer thread's unit, if any.
            let mut q = self.to_cache.state.lock();
            if q.busy == 0 {
                return;
            }
            self.to_cache
                .added
                .wait_for(&mut q, Duration::from_millis(50));
        }
        tracing::debug!(
            left = self.to_cache.state.lock().units.len(),
            "content left out of the cache at the end"
        );
    }
}

/// How long the end of a mount may spend adding its last fetches to the
/// cache.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

impl Drop for Spool {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Units for the cache's writer thread.
#[derive(Default)]
struct ToCache {
    state: Mutex<Queue>,
    /// Units were queued.
    more: Condvar,
    /// A unit was added to the cache.
    added: Condvar,
}

#[derive(Default)]
struct Queue {
    units: std::collections::VecDeque<usize>,
    /// Units taken from `units`, being added.
    busy: usize,
}

impl ToCache {
    /// The next unit to add, counted as busy until [`ToCache::done`].
    fn take(&self, wait: Option<Duration>) -> Option<usize> {
        let mut q = self.state.lock();
        if q.units.is_empty()
            && let Some(w) = wait
        {
            self.more.wait_for(&mut q, w);
        }
        let u = q.units.pop_front()?;
        q.busy += 1;
        Some(u)
    }

    fn done(&self) {
        self.state.lock().busy -= 1;
        self.added.notify_all();
    }
}

/// One of [`Spool::prefetch`]'s streams: fills the units it takes from
/// `units`, in order, while no read waits on a fetch.
fn prefetch_in_order(weak: Weak<Spool>, units: &Mutex<impl Iterator<Item = usize>>) {
    let mut next = units.lock().next();
    loop {
        let Some(u) = next else {
            tracing::debug!("prefetch done");
            return;
        };
        let Some(spool) = weak.upgrade() else { return };
        if spool.stopped.load(Ordering::Acquire) || u >= spool.units.len() {
            return;
        }
        if spool.waiting.load(Ordering::Acquire) > 0 {
            drop(spool);
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        if spool.is_filled(u) {
            next = units.lock().next();
            continue;
        }
        let block = spool.options.block.max(PREFETCH_BLOCK);
        match spool.fill(u, false, block, &(0..spool.units.len())) {
            Ok(()) if spool.is_filled(u) || spool.claims.lock().contains(&u) => {
                next = units.lock().next();
            }
            // No memory to spare now: again a little later.
            Ok(()) => {
                drop(spool);
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                tracing::debug!(unit = u, error = %e, "prefetch failed; left to the readers");
                next = units.lock().next();
            }
        }
    }
}

/// Releases the claims of a fill, however it ends, and wakes the readers
/// waiting for them.
struct Release<'a> {
    spool: &'a Spool,
    units: &'a mut Vec<usize>,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut claims = self.spool.claims.lock();
        for u in self.units.iter() {
            claims.remove(u);
        }
        drop(claims);
        self.spool.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// An object in memory that counts requests and corrupts the next
    /// `corrupt` responses (STYLE habit 13: a mock and a failing client).
    struct Mem {
        bytes: Vec<u8>,
        requests: Arc<AtomicUsize>,
        corrupt: Arc<AtomicUsize>,
    }

    impl ReadAt for Mem {
        fn len(&self) -> u64 {
            self.bytes.len() as u64
        }
        fn etag(&self) -> Option<&str> {
            None
        }
        fn read_exact_at(
            &self,
            buf: &mut [u8],
            offset: u64,
            _: crate::store::Deadline,
        ) -> Result<()> {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let at = offset as usize;
            buf.copy_from_slice(&self.bytes[at..at + buf.len()]);
            if self
                .corrupt
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                buf[0] ^= 1;
            }
            Ok(())
        }
        fn shown(&self) -> &str {
            "mem://object"
        }
    }

    /// 40 small units of 1000 bytes, 512 bytes apart (headers), then one of
    /// 3 MiB.
    fn object() -> (Vec<u8>, Vec<Unit>) {
        let mut bytes = Vec::new();
        let mut units = Vec::new();
        for i in 0..41u32 {
            bytes.extend_from_slice(&[0u8; 512]);
            let len = if i == 40 { 3 << 20 } else { 1000 };
            let data: Vec<u8> = (0..len).map(|j| (j as u32 * 7 + i) as u8).collect();
            units.push(Unit {
                start: bytes.len() as u64,
                len: len as u64,
                hash: sha2::Sha256::digest(&data).into(),
                group: i,
            });
            bytes.extend_from_slice(&data);
        }
        (bytes, units)
    }

    fn spool(
        cache: Option<Arc<Cache>>,
        block: u64,
    ) -> (Arc<Spool>, Vec<u8>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (bytes, units) = object();
        let (requests, corrupt) = (Arc::default(), Arc::default());
        let mem = Mem {
            bytes: bytes.clone(),
            requests: Arc::clone(&requests),
            corrupt: Arc::clone(&corrupt),
        };
        let dir = std::env::temp_dir();
        let options = SpoolOptions {
            block,
            max_memory: 1 << 20,
            prefetch: Prefetch::None,
        };
        let location = super::super::Location::Local("mem".into());
        let s = Spool::new(location, Box::new(mem), units, &dir, cache, options).unwrap();
        (s, bytes, requests, corrupt)
    }

    fn spooled(s: &Spool, range: Range<u64>) -> Vec<u8> {
        let mut buf = vec![0; (range.end - range.start) as usize];
        s.file.read_exact_at(&mut buf, range.start).unwrap();
        buf
    }

    #[test]
    fn small_units_come_a_block_at_a_time_and_verified() {
        let (s, bytes, _, _) = spool(None, 8 * 1512);
        // Bytes the reads fetched themselves (read-ahead runs beside them).
        let read = |s: &Spool| {
            s.stats.fetched_bytes.load(Ordering::Relaxed)
                - s.stats.background_bytes.load(Ordering::Relaxed)
        };
        let u = s.units()[0].clone();
        s.ensure(u.start..u.start + 10).unwrap();
        // The request brought the units after it, up to the block.
        let last = s.units()[7].clone();
        assert_eq!(read(&s), last.end() - u.start);
        assert!((0..8).all(|v| s.is_filled(v)));
        s.ensure(last.start..last.end()).unwrap();
        assert_eq!(read(&s), last.end() - u.start);
        assert_eq!(
            spooled(&s, u.start..last.end()),
            bytes[u.start as usize..last.end() as usize]
        );
        // A reader landing in the middle of a run gets the units before it
        // too (within half a block), then those after it.
        let (s, _, _, _) = spool(None, 8 * 1512);
        let mid = s.units()[20].clone();
        s.ensure(mid.start..mid.start + 1).unwrap();
        let (lo, hi) = (s.units()[17].clone(), s.units()[24].clone());
        assert_eq!(read(&s), hi.end() - lo.start);
        assert!((17..=24).all(|v| s.is_filled(v)));
        assert!(!s.is_filled(16));
    }

    #[test]
    fn a_planned_reader_fetches_only_what_it_names() {
        let (s, bytes, requests, _) = spool(None, 8 * 1512);
        let (a, b) = (s.units()[3].clone(), s.units()[5].clone());
        s.ensure_planned(a.start..b.end()).unwrap();
        // One request, for units 3 to 5 only: nothing around them, nothing
        // ahead (a reader's miss here brings units up to the block, then
        // reads ahead: small_units_come_a_block_at_a_time_and_verified).
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(requests.load(Ordering::Relaxed), 1);
        assert_eq!(
            s.stats.fetched_bytes.load(Ordering::Relaxed),
            b.end() - a.start
        );
        assert!((3..=5).all(|v| s.is_filled(v)));
        assert!(!s.is_filled(2) && !s.is_filled(6));
        assert_eq!(
            spooled(&s, a.start..b.end()),
            bytes[a.start as usize..b.end() as usize]
        );
        // A second run: one more request, nothing from before.
        let (c, d) = (s.units()[10].clone(), s.units()[12].clone());
        s.ensure_planned(c.start..d.end()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(requests.load(Ordering::Relaxed), 2);
        assert!(!s.is_filled(9) && !s.is_filled(13));
        assert_eq!(
            s.stats.fetched_bytes.load(Ordering::Relaxed),
            (b.end() - a.start) + (d.end() - c.start)
        );
    }

    #[test]
    fn read_ahead_grows_with_what_was_read_not_with_each_read() {
        let (s, _, _, _) = spool(None, 1512);
        for u in 0..10 {
            let w = s.units()[u].clone();
            s.ensure(w.start..w.end()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(500));
        let filled = (0..41).filter(|&v| s.is_filled(v)).count();
        // Read ahead by about twice the 10,000 bytes read (13 more units
        // with their headers); a window doubled at each of the 10 reads
        // would have reached all 40 small units.
        assert!(filled > 10, "no read-ahead: {filled}");
        assert!(filled <= 10 + 14, "{filled} units filled");
    }

    #[test]
    fn a_corrupted_response_is_fetched_once_more_then_refused() {
        let (s, bytes, requests, corrupt) = spool(None, 4096);
        let big = s.units()[40].clone();
        corrupt.store(1, Ordering::Relaxed);
        s.ensure(big.start..big.start + 1).unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), 2);
        assert_eq!(s.stats.refetched.load(Ordering::Relaxed), 1);
        assert_eq!(
            spooled(&s, big.start..big.end()),
            bytes[big.start as usize..big.end() as usize]
        );
        // Corrupted every time: refused, and not filled.
        let small = s.units()[3].clone();
        corrupt.store(2, Ordering::Relaxed);
        let e = s.ensure(small.start..small.end()).unwrap_err();
        assert!(
            matches!(e, Error::Corrupt { start, .. } if start == small.start),
            "{e}"
        );
        assert!(!s.is_filled(3));
        // The next read fetches it again.
        s.ensure(small.start..small.end()).unwrap();
        assert!(s.is_filled(3));
    }

    #[test]
    fn units_in_the_cache_cost_no_request() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(dir.path(), 1 << 30).unwrap());
        let (s, _, requests, _) = spool(Some(cache.clone()), 1 << 20);
        s.ensure(0..s.remote().len()).unwrap();
        let first = requests.load(Ordering::Relaxed);
        assert!(first >= 2, "{first}");
        // Its last fetches reach the cache when it ends (a mount's end).
        s.finish();
        assert_eq!(cache.stats.added.load(Ordering::Relaxed), 41);
        // Another spool on the same cache (another mount, the next turn).
        let (t, bytes, requests, _) = spool(Some(cache), 1 << 20);
        t.ensure(0..t.remote().len()).unwrap();
        assert_eq!(requests.load(Ordering::Relaxed), 0);
        assert_eq!(t.stats.fetched_bytes.load(Ordering::Relaxed), 0);
        for u in t.units() {
            assert_eq!(
                spooled(&t, u.start..u.end()),
                bytes[u.start as usize..u.end() as usize]
            );
        }
    }

    #[test]
    fn a_fetch_larger_than_the_budget_goes_alone() {
        let b = Budget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            max: 100,
        };
        let big = b.take(1000, true).expect("alone, it goes");
        assert!(b.take(1, false).is_none(), "no room beside it");
        drop(big);
        let a = b.take(60, false).unwrap();
        assert!(b.take(60, false).is_none());
        let c = b.take(40, false).unwrap();
        drop((a, c));
        assert_eq!(*b.used.lock(), 0);
    }
}
