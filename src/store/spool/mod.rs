//! A remote packet as a mount reads it: a sparse local file of the
//! object's length (the spool), filled on demand by ranged GETs and from
//! the node-wide [`Cache`], one verified unit at a time.
//!
//! The layer above gives the units: the byte ranges of the object the
//! manifest names a SHA-256 for (a small file's content, a chunk of a
//! larger one), and how to check the bytes between them (member headers
//! and padding: [`Gaps`]). A range is asked for with [`Spool::ensure`];
//! every unit it touches is filled before it returns:
//!
//! 1. from the cache, when it holds an entry of that hash (checked);
//! 2. else by ranged GETs that also take the units around it that are
//!    not filled yet (back within half a block, then forward: small files
//!    are fetched a block at a time, not one request each) and the short
//!    gaps beside them ([`plan`]);
//! 3. each unit fetched is hashed as it arrives: one that matches is
//!    marked filled and added to the cache; the unit asked for, if it does
//!    not match, is fetched once more on its own, then refused
//!    ([`Error::Corrupt`]). The bytes between units are compared with what
//!    the layer above says they must be.
//!
//! So no byte is read from the spool without matching the manifest, and
//! the layer above reads it as it reads a local packet, but does not hash
//! it again: its chunks are these units, and the spool is written by
//! nothing else. The spool is an unlinked file in the cache's directory: a
//! killed daemon leaves nothing of it.
//!
//! What was checked against the object itself (fetched from it, pinned to
//! its ETag, and found to match) is recorded apart from what was filled
//! ([`Spool::unproven`]): a unit taken from the cache matches the
//! manifest, but says nothing of the object's bytes, which is what a
//! seal's server-side copy publishes ([`Spool::prove`] fetches the rest).
//!
//! Every read has one time bound for all it does ([`Deadline`], the
//! store's read bound): waiting for a fetch of the same unit by another
//! reader, for memory, every request and the refetch. A unit whose read
//! just failed fails at once for [`FAIL_FAST`] (the kernel asks again at
//! once for a failed readahead). [`Spool::stop`] wakes every wait.
//!
//! A reader moving forward gets read-ahead: the units after it are fetched
//! on background threads, in a window of twice what its stream has read
//! (from one block up to [`plan::MAX_WINDOW`]). A reader that says what it
//! will read (a seal: [`Spool::ensure_planned`]) gets exactly that, in
//! larger requests, and no read-ahead. `--prefetch all|trace` runs
//! [`PREFETCH_STREAMS`] streams of large requests beside the reads, which
//! keep their own requests. Every buffer is taken from the memory budget
//! ([`budget`]): fetches hold at most `--max-memory`, background work at
//! most half of it, and a request larger than a quarter of it is fetched
//! in pieces.

mod budget;
pub mod plan;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use sha2::Digest as _;

use super::cache::Cache;
use super::error::{Error, Result};
use super::{Deadline, ReadAt};
use budget::{Budget, Priority};

/// The default block size: a fetch of small files covers up to this much
/// of the object. 1 MiB: a little over what one round trip carries at no
/// extra latency in region (mountpoint-s3's first request is about the
/// same), and few enough bytes that reading one small file costs little
/// more than the file.
pub const DEFAULT_BLOCK: u64 = 1 << 20;

/// The default memory budget of the spool's buffers.
pub const DEFAULT_MAX_MEMORY: u64 = 256 << 20;

/// The smallest memory budget: four of the largest unit (a 4 MiB chunk),
/// which is held whole when it is read from the cache or added to it.
pub const MIN_MAX_MEMORY: u64 = 16 << 20;

/// Threads fetching ahead of readers.
const BACKGROUND_THREADS: usize = 4;

/// Requests a prefetch (`--prefetch all|trace`) keeps in flight: one at a
/// time waits a round trip per request (1 GiB in requests of 4 MiB took
/// 21 s at 10 ms and 1 Gbit/s, twice the transfer).
pub const PREFETCH_STREAMS: usize = 4;

/// A prefetch's requests bring up to this much (or the block size, if
/// larger): nobody waits for them, so they are sized for the link.
const PREFETCH_BLOCK: u64 = 4 << 20;

/// How long a unit whose read failed fails again at once, with the same
/// error, rather than waiting a whole time bound again: the kernel retries
/// a failed readahead as a second read at once, and a reader retrying in
/// a loop should not hold a thread for the bound each time.
pub const FAIL_FAST: Duration = Duration::from_secs(2);

/// Failures remembered at most (the oldest go first).
const FAILURES: usize = 4096;

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

/// What the bytes between units must be, as the layer above knows
/// (canonical member headers, zero padding): `check(at, bytes)` says
/// whether `bytes` found at `at` are those. Gap 0 starts at `from` (the end
/// of the manifest member), the last ends at the object's end.
#[derive(Clone)]
pub struct Gaps {
    /// Where the first gap starts.
    pub from: u64,
    /// The check.
    pub check: GapCheck,
}

/// See [`Gaps::check`].
pub type GapCheck = Arc<dyn Fn(u64, &[u8]) -> bool + Send + Sync>;

/// What to fetch before it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// Only what is read, and read-ahead of sequential readers.
    #[default]
    None,
    /// The units a trace names, in its order, in the background, beside
    /// the reads (the caller hands them over: [`Spool::prefetch`]).
    Trace,
    /// Everything, in object order, in the background, beside the reads.
    All,
}

/// How a spool fetches.
#[derive(Clone, Copy, Debug)]
pub struct SpoolOptions {
    /// See [`DEFAULT_BLOCK`].
    pub block: u64,
    /// See [`DEFAULT_MAX_MEMORY`] (at least [`MIN_MAX_MEMORY`]).
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
    /// Units that did not match their hash when fetched.
    pub refetched: AtomicU64,
    /// Bytes fetched ahead of readers or by `--prefetch`.
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
    /// Bytes fetched ahead of readers or by `--prefetch`.
    pub background_bytes: u64,
    /// Units whose fetched bytes did not match the manifest.
    pub refetched: u64,
    /// Units of content filled so far.
    pub filled_units: u64,
    /// Units of content in the packet.
    pub units: u64,
    /// The most bytes of buffers it held at once (fetched bodies, cache
    /// entries): at most `--max-memory`.
    #[serde(default)]
    pub memory_peak_bytes: u64,
}

/// One bit per thing, set once.
struct Bits(Vec<AtomicU64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    fn get(&self, i: usize) -> bool {
        self.0[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    fn set(&self, i: usize) {
        self.0[i / 64].fetch_or(1 << (i % 64), Ordering::AcqRel);
    }

    fn count(&self) -> usize {
        self.0
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }
}

/// Who fills a unit: a read waits for it (for a fetch of it in flight,
/// for memory) and its failure is remembered; work ahead of the reads
/// skips what is being fetched and holds at most half the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Read,
    Ahead,
    Prefetch,
}

impl Who {
    fn priority(self) -> Priority {
        match self {
            Who::Read => Priority::Read,
            Who::Ahead | Who::Prefetch => Priority::Background,
        }
    }
}

/// The units being fetched, and the recent failures of reads.
#[derive(Default)]
struct Claims {
    claimed: HashSet<usize>,
    failed: HashMap<usize, (Instant, Error)>,
}

impl Claims {
    /// The failure of a read of `u` within [`FAIL_FAST`], if any.
    fn recent(&mut self, u: usize) -> Option<Error> {
        match self.failed.get(&u) {
            Some((at, e)) if at.elapsed() < FAIL_FAST => Some(e.clone()),
            Some(_) => {
                self.failed.remove(&u);
                None
            }
            None => None,
        }
    }

    fn remember(&mut self, units: impl IntoIterator<Item = usize>, e: &Error) {
        if self.failed.len() >= FAILURES {
            self.failed.retain(|_, (at, _)| at.elapsed() < FAIL_FAST);
        }
        let now = Instant::now();
        for u in units.into_iter().take(FAILURES) {
            self.failed.insert(u, (now, e.clone()));
        }
    }
}

/// The spool of one remote object (see the module's text).
pub struct Spool {
    location: super::Location,
    remote: Box<dyn ReadAt>,
    file: File,
    units: Vec<Unit>,
    /// Units whose bytes are in the spool, verified.
    filled: Bits,
    /// Units whose bytes were fetched from the object and matched.
    proven: Bits,
    /// Gaps (see [`plan::gap`]) whose bytes were fetched from the object
    /// and matched; a gap of no bytes counts as proven.
    gaps_proven: Bits,
    gaps: Option<Gaps>,
    /// Units being filled: others wanting them wait on `done`.
    claims: Mutex<Claims>,
    done: Condvar,
    cache: Option<Arc<Cache>>,
    options: SpoolOptions,
    budget: Budget,
    /// Read-ahead state per stream: the file of the last unit a reader
    /// filled (or `u32::MAX` for runs of small files).
    streams: Mutex<lru::LruCache<u32, plan::Stream>>,
    /// Units fetched and in the spool, to be added to the cache by its
    /// writer thread, so that no read waits for the cache's files (a
    /// block of small files is hundreds of entries).
    to_cache: Arc<ToCache>,
    /// Work for the read-ahead threads (dropped to end them).
    background: Mutex<Option<mpsc::Sender<usize>>>,
    stopped: AtomicBool,
    /// What it has done.
    pub stats: SpoolStats,
}

/// Streams whose read-ahead state is kept (a reader per file; 64 readers
/// at once keep theirs).
const STREAMS: usize = 128;

/// What a fetch found wrong.
#[derive(Default)]
struct Checked {
    /// Units whose bytes did not match the manifest.
    units: Vec<usize>,
    /// Gaps whose bytes are not what they must be.
    gaps: Vec<usize>,
}

impl Spool {
    /// A spool for `remote` with `units` (sorted by start, not
    /// overlapping, inside the object) and the bytes between them checked
    /// by `gaps` (if given), its file made in `dir` (the cache's
    /// directory, so cached content is copied locally) and removed from it
    /// at once.
    pub fn new(
        location: super::Location,
        remote: Box<dyn ReadAt>,
        units: Vec<Unit>,
        gaps: Option<Gaps>,
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
        let n = units.len();
        let spool = Arc::new(Spool {
            location,
            remote,
            file,
            filled: Bits::new(n),
            proven: Bits::new(n),
            gaps_proven: Bits::new(n + 1),
            gaps,
            units,
            claims: Mutex::new(Claims::default()),
            done: Condvar::new(),
            cache,
            budget: Budget::new(options.max_memory.max(MIN_MAX_MEMORY)),
            options,
            streams: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(STREAMS).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
            to_cache: Arc::default(),
            background: Mutex::new(None),
            stopped: AtomicBool::new(false),
            stats: SpoolStats::default(),
        });
        spool.start_background()?;
        Ok(spool)
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
            .map_err(|e| self.local_error("read", e))?;
        let mut pos = range.start;
        let ends = self.units[self.units_of(&range)]
            .iter()
            .map(|u| (u.start, u.end()))
            .chain(std::iter::once((range.end, range.end)));
        let deadline = self.remote.deadline();
        for (start, end) in ends {
            let gap = pos..start.min(range.end);
            if !gap.is_empty() {
                let at = (gap.start - range.start) as usize;
                let n = (gap.end - gap.start) as usize;
                self.remote
                    .read_exact_at(&mut buf[at..at + n], gap.start, deadline)?;
                self.count_fetch(n as u64, Who::Read);
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
        self.filled.get(u)
    }

    /// Offers the bytes of unit `u` from a copy the caller holds (what a
    /// seal just uploaded, from its upper directory): hashed, and written
    /// to the spool and queued for the cache if they match the manifest
    /// (unless a fetch of it is in flight). Returns whether the unit is
    /// filled now.
    pub fn supply(&self, u: usize, bytes: &[u8]) -> bool {
        let Some(w) = self.units.get(u).filter(|w| w.len == bytes.len() as u64) else {
            return false;
        };
        if self.filled.get(u) || sha2::Sha256::digest(bytes).as_slice() != w.hash {
            return self.filled.get(u);
        }
        {
            let mut c = self.claims.lock();
            if self.filled.get(u) || !c.claimed.insert(u) {
                return self.filled.get(u);
            }
        }
        let mine = [u];
        let _release = Release {
            spool: self,
            units: &mine,
        };
        self.file.write_all_at(bytes, w.start).is_ok() && {
            self.mark_filled(u);
            true
        }
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
            filled_units: self.filled.count() as u64,
            units: self.units.len() as u64,
            memory_peak_bytes: self.budget.peak(),
        }
    }

    /// Makes every unit that `range` (of the object) touches filled and
    /// verified, fetching what is missing, within one time bound for all
    /// of it; bytes outside units (headers) are not fetched. For a reader
    /// whose next read is not known (a mount's): a miss brings the units
    /// around it (a block), and a reader moving forward gets read-ahead.
    pub fn ensure(&self, range: Range<u64>) -> Result<()> {
        let all = 0..self.units.len();
        let deadline = self.remote.deadline();
        if let Some(last) = self.ensure_within(range, &all, self.options.block, deadline)? {
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
        self.ensure_within(range, &units, block, self.remote.deadline())
            .map(|_| ())
    }

    /// The units `range` touches.
    pub fn units_of(&self, range: &Range<u64>) -> Range<usize> {
        let first = self.units.partition_point(|u| u.end() <= range.start);
        let end = first + self.units[first..].partition_point(|u| u.start < range.end);
        first..end
    }

    /// Fills the units of `range`, each miss's request kept within
    /// `bounds` (units) and `block`; the last unit it touched, if any.
    fn ensure_within(
        &self,
        range: Range<u64>,
        bounds: &Range<usize>,
        block: u64,
        deadline: Deadline,
    ) -> Result<Option<usize>> {
        let units = self.units_of(&range);
        for u in units.clone() {
            if !self.filled.get(u) {
                self.fill(u, Who::Read, block, bounds, deadline)?;
            }
        }
        Ok(units.end.checked_sub(1).filter(|_| !units.is_empty()))
    }

    /// Fills unit `u` (and, in the same requests, units around it within
    /// `bounds` and `block`: [`plan::around`]). A read waits for a fetch
    /// of `u` already in flight, until `deadline`; work ahead of the reads
    /// leaves it to that fetch.
    fn fill(
        &self,
        u: usize,
        who: Who,
        block: u64,
        bounds: &Range<usize>,
        deadline: Deadline,
    ) -> Result<()> {
        let mine: Vec<usize> = {
            let mut c = self.claims.lock();
            loop {
                if self.filled.get(u) {
                    return Ok(());
                }
                if who == Who::Read
                    && let Some(e) = c.recent(u)
                {
                    return Err(e);
                }
                if !c.claimed.contains(&u) {
                    let free = |v: usize| !self.filled.get(v) && !c.claimed.contains(&v);
                    let r = plan::around(&self.units, u, free, block, bounds);
                    let mine: Vec<usize> = r.collect();
                    c.claimed.extend(mine.iter().copied());
                    break mine;
                }
                if who != Who::Read {
                    return Ok(());
                }
                if self.stopped.load(Ordering::Acquire) {
                    return Err(self.gave_up(u, "the mount is ending", deadline));
                }
                let left = deadline.remaining();
                if left.is_zero() {
                    return Err(self.gave_up(
                        u,
                        "another read's fetch of these bytes did not end within the time bound",
                        deadline,
                    ));
                }
                self.done.wait_for(&mut c, left);
            }
        };
        let _release = Release {
            spool: self,
            units: &mine,
        };
        // The cache first, outside the lock (its files are I/O).
        let want: Vec<usize> = mine
            .iter()
            .copied()
            .filter(|&v| !self.fill_from_cache(v, who, deadline))
            .collect();
        let checked = self.fetch_units(&want, who, deadline);
        let result = match checked {
            Ok(c) if c.units.contains(&u) && !self.filled.get(u) && who == Who::Read => {
                // A truncated or corrupted response: once more, alone.
                tracing::warn!(
                    location = self.remote.shown(),
                    start = self.units[u].start,
                    end = self.units[u].end(),
                    "fetched content does not match the manifest; fetching it again"
                );
                self.fetch_units(&[u], who, deadline).map(|_| ())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        if self.filled.get(u) {
            return Ok(());
        }
        let e = result.err().unwrap_or_else(|| {
            tracing::error!(
                location = self.remote.shown(),
                start = self.units[u].start,
                end = self.units[u].end(),
                "fetched content does not match the manifest"
            );
            self.corrupt(self.units[u].start..self.units[u].end())
        });
        if who == Who::Read {
            let failed = want.iter().copied().filter(|&v| !self.filled.get(v));
            let failed: Vec<usize> = match e {
                // Only `u` was fetched twice; its neighbours may be fine.
                Error::Corrupt { .. } => vec![u],
                _ => failed.collect(),
            };
            self.claims.lock().remember(failed, &e);
        }
        Err(e)
    }

    /// Fills unit `v` (claimed) from the cache if it holds it; whether it
    /// did. Background work that finds no memory free leaves it to a fetch.
    fn fill_from_cache(&self, v: usize, who: Who, deadline: Deadline) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let w = &self.units[v];
        let buf = match who {
            Who::Read => self
                .budget
                .take(w.len, who.priority(), deadline, &self.stopped),
            _ => self.budget.try_take(w.len, who.priority()),
        };
        let Some(mut buf) = buf.filter(|b| b.bytes.len() as u64 == w.len) else {
            return false;
        };
        if !cache.get(&w.hash, &mut buf.bytes) {
            return false;
        }
        if let Err(e) = self.file.write_all_at(&buf.bytes, w.start) {
            tracing::warn!(error = %self.local_error("write", e), "a cached unit is fetched instead");
            return false;
        }
        self.filled.set(v);
        self.stats.cache_bytes.fetch_add(w.len, Ordering::Relaxed);
        true
    }

    /// Fetches `want` (units claimed by the caller, sorted) with the short
    /// gaps beside them, in requests of close stretches cut into pieces
    /// within the memory budget, all within `deadline`. What did not match
    /// is returned; an error of the store ends it (units fetched so far
    /// stay filled).
    fn fetch_units(&self, want: &[usize], who: Who, deadline: Deadline) -> Result<Checked> {
        let stretches = want.iter().map(|&v| self.stretch_of(v));
        let mut checked = Checked::default();
        for span in plan::spans(stretches, u64::MAX) {
            self.fetch_span(span, want, who, deadline, &mut checked)?;
        }
        Ok(checked)
    }

    /// The bytes of unit `v` and of the gaps beside it that are short
    /// ([`plan::MAX_GAP`]) and not proven yet: fetching them with it costs
    /// a few hundred bytes and checks the member's header.
    fn stretch_of(&self, v: usize) -> Range<u64> {
        let w = &self.units[v];
        let Some(gaps) = &self.gaps else {
            return w.start..w.end();
        };
        let end = self.remote.len();
        let short = |g: usize| {
            let r = plan::gap(&self.units, g, gaps.from, end);
            (r.end - r.start <= plan::MAX_GAP && !self.gaps_proven.get(g)).then_some(r)
        };
        let start = short(v).map_or(w.start, |r| r.start);
        let stop = short(v + 1).map_or(w.end(), |r| r.end);
        start..stop
    }

    /// Fetches `span` in pieces and checks what it holds: units of
    /// `mine` (claimed by the caller) are hashed as they arrive and written
    /// to the spool, and filled if they match; units already filled but
    /// not proven are hashed (a match proves them); gaps are checked.
    fn fetch_span(
        &self,
        span: Range<u64>,
        mine: &[usize],
        who: Who,
        deadline: Deadline,
        checked: &mut Checked,
    ) -> Result<()> {
        // The unit being hashed, and whether each gap seen so far matched.
        let mut hashing: Option<(usize, sha2::Sha256)> = None;
        let mut gaps: Vec<(usize, bool)> = Vec::new();
        for piece in plan::pieces(span.clone(), self.budget.piece()) {
            let n = piece.end - piece.start;
            let mut buf = self
                .budget
                .take(n, who.priority(), deadline, &self.stopped)
                .ok_or_else(|| {
                    let why = if self.stopped.load(Ordering::Acquire) {
                        "the mount is ending"
                    } else {
                        "no memory came free within the time bound"
                    };
                    self.gave_up_range(piece.clone(), why, deadline)
                })?;
            let bytes = &mut buf.bytes[..n as usize];
            self.remote.read_exact_at(bytes, piece.start, deadline)?;
            self.count_fetch(n, who);
            let mut pos = piece.start;
            while pos < piece.end {
                let k = self.units.partition_point(|w| w.end() <= pos);
                let inside = self.units.get(k).is_some_and(|w| w.start <= pos);
                let stop = match self.units.get(k) {
                    Some(w) if inside => w.end(),
                    Some(w) => w.start,
                    None => self.remote.len(),
                }
                .min(piece.end);
                let slice = &bytes[(pos - piece.start) as usize..(stop - piece.start) as usize];
                if inside {
                    self.take_unit_bytes(k, pos, slice, mine, &mut hashing, checked)?;
                } else if let Some(g) = &self.gaps {
                    let ok = (g.check)(pos, slice);
                    match gaps.last_mut() {
                        Some((last, good)) if *last == k => *good &= ok,
                        _ => gaps.push((k, ok)),
                    }
                }
                pos = stop;
            }
        }
        let end = self.remote.len();
        for (g, ok) in gaps {
            let from = self.gaps.as_ref().map_or(0, |g| g.from);
            let r = plan::gap(&self.units, g, from, end);
            if !ok {
                tracing::warn!(
                    location = self.remote.shown(),
                    start = r.start,
                    end = r.end,
                    "the bytes between members are not the packet's"
                );
                checked.gaps.push(g);
            } else if span.start <= r.start && r.end <= span.end {
                self.gaps_proven.set(g);
            }
        }
        Ok(())
    }

    /// Bytes `slice` found at `pos`, inside unit `k`: hashed when the
    /// unit is one to check, written to the spool when it is the caller's
    /// to fill, and the unit marked when its last byte is in.
    fn take_unit_bytes(
        &self,
        k: usize,
        pos: u64,
        slice: &[u8],
        mine: &[usize],
        hashing: &mut Option<(usize, sha2::Sha256)>,
        checked: &mut Checked,
    ) -> Result<()> {
        let w = &self.units[k];
        let ours = mine.binary_search(&k).is_ok() && !self.filled.get(k);
        let check = ours || (self.filled.get(k) && !self.proven.get(k));
        if !check {
            return Ok(());
        }
        if pos == w.start {
            *hashing = Some((k, sha2::Sha256::new()));
        }
        let Some((_, h)) = hashing.as_mut().filter(|(h, _)| *h == k) else {
            return Ok(());
        };
        h.update(slice);
        if ours {
            self.file
                .write_all_at(slice, pos)
                .map_err(|e| self.local_error("write", e))?;
        }
        if pos + slice.len() as u64 == w.end() {
            let Some((_, h)) = hashing.take() else {
                return Ok(());
            };
            if h.finalize().as_slice() == w.hash {
                self.proven.set(k);
                if ours {
                    self.mark_filled(k);
                }
            } else {
                self.stats.refetched.fetch_add(1, Ordering::Relaxed);
                checked.units.push(k);
            }
        }
        Ok(())
    }

    /// Marks unit `u` filled (its verified bytes are in the spool, never
    /// written again) and queues it for the cache.
    fn mark_filled(&self, u: usize) {
        self.filled.set(u);
        if self.cache.is_some() {
            self.to_cache.state.lock().units.push_back(u);
            self.to_cache.more.notify_one();
        }
    }

    fn count_fetch(&self, n: u64, who: Who) {
        self.stats.fetched_bytes.fetch_add(n, Ordering::Relaxed);
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        if who != Who::Read {
            self.stats.background_bytes.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn local_error(&self, what: &str, e: std::io::Error) -> Error {
        Error::Config {
            location: self.remote.shown().into(),
            reason: format!("cannot {what} the mount's spool file: {e}"),
        }
    }

    fn corrupt(&self, r: Range<u64>) -> Error {
        Error::Corrupt {
            location: self.remote.shown().into(),
            start: r.start,
            end: r.end,
        }
    }

    fn gave_up(&self, u: usize, why: &str, deadline: Deadline) -> Error {
        let w = &self.units[u];
        self.gave_up_range(w.start..w.end(), why, deadline)
    }

    fn gave_up_range(&self, r: Range<u64>, why: &str, deadline: Deadline) -> Error {
        Error::Unavailable {
            location: self.remote.shown().into(),
            what: format!("read bytes {}..{}", r.start, r.end),
            attempts: 0,
            elapsed: deadline.elapsed(),
            last: why.into(),
        }
    }

    /// Bytes of `range` of the object not proven to be the packet's: in
    /// units not fetched from the object and matched (filled from the
    /// cache, offered, or not filled), and between units, not fetched and
    /// checked. What a seal copying `range` from the object has not seen.
    pub fn unproven(&self, range: Range<u64>) -> u64 {
        let overlap = |r: Range<u64>| {
            r.end
                .min(range.end)
                .saturating_sub(r.start.max(range.start))
        };
        let units = self.units_of(&range);
        let mut n: u64 = units
            .clone()
            .filter(|&u| !self.proven.get(u))
            .map(|u| overlap(self.units[u].start..self.units[u].end()))
            .sum();
        let from = self.gaps.as_ref().map_or(0, |g| g.from);
        let end = self.remote.len();
        // The gaps `range` touches: those around its units, or the one it
        // lies in.
        let first_gap = units.start;
        let last_gap = units.end;
        for g in first_gap..=last_gap.min(self.units.len()) {
            if !self.gaps_proven.get(g) {
                n += overlap(plan::gap(&self.units, g, from, end));
            }
        }
        n
    }

    /// Fetches from the object what of `range` is not proven (see
    /// [`Spool::unproven`]) and checks it, within `deadline`: afterwards
    /// every byte of `range` was seen in the object and matched, or it
    /// fails ([`Error::Corrupt`] naming the first range that does not
    /// match, once fetched again).
    pub fn prove(&self, range: Range<u64>, deadline: Deadline) -> Result<()> {
        let units = self.units_of(&range);
        let from = self.gaps.as_ref().map_or(0, |g| g.from);
        let end = self.remote.len();
        // Claim the units not filled (to write them); wait for those a
        // fetch has in flight.
        let mut mine = Vec::new();
        {
            let mut c = self.claims.lock();
            for u in units.clone().filter(|&u| !self.proven.get(u)) {
                while !self.filled.get(u) && c.claimed.contains(&u) {
                    if self.stopped.load(Ordering::Acquire) || deadline.expired() {
                        return Err(self.gave_up(u, "another fetch did not end in time", deadline));
                    }
                    self.done.wait_for(&mut c, deadline.remaining());
                }
                if !self.filled.get(u) {
                    c.claimed.insert(u);
                    mine.push(u);
                }
            }
        }
        let _release = Release {
            spool: self,
            units: &mine,
        };
        // Whole gaps and units, even where they reach past `range`: a gap
        // is proven only when fetched whole.
        let mut stretches: Vec<Range<u64>> = Vec::new();
        for g in units.start..=units.end.min(self.units.len()) {
            if !self.gaps_proven.get(g) {
                stretches.push(plan::gap(&self.units, g, from, end));
            }
            if let Some(w) = self
                .units
                .get(g)
                .filter(|_| g < units.end && !self.proven.get(g))
            {
                stretches.push(w.start..w.end());
            }
        }
        stretches.retain(|r| !r.is_empty());
        let mut checked = Checked::default();
        for span in plan::spans(stretches, PREFETCH_BLOCK.max(self.options.block)) {
            self.fetch_span(span, &mine, Who::Read, deadline, &mut checked)?;
        }
        // What did not match, once more on its own.
        for u in std::mem::take(&mut checked.units) {
            let w = &self.units[u];
            let mut again = Checked::default();
            self.fetch_span(w.start..w.end(), &mine, Who::Read, deadline, &mut again)?;
            if !again.units.is_empty() {
                return Err(self.corrupt(w.start..w.end()));
            }
        }
        match checked.gaps.first() {
            Some(&g) => Err(self.corrupt(plan::gap(&self.units, g, from, end))),
            None => Ok(()),
        }
    }

    /// After a read that ended in unit `u`: the units ahead of a reader
    /// moving forward ([`plan::follow`]) go to the read-ahead threads, a
    /// request's worth (a block) at a time.
    fn read_ahead(&self, u: usize) {
        let unit = &self.units[u];
        let chunked = self.units.get(u + 1).is_some_and(|n| n.group == unit.group)
            || (u > 0 && self.units[u - 1].group == unit.group);
        let key = if chunked { unit.group } else { u32::MAX };
        // Forward: the unit before was read (or, in a chunked file, this
        // is its first chunk).
        let forward =
            u == 0 || self.filled.get(u - 1) || (chunked && self.units[u - 1].group != unit.group);
        let hand = {
            let mut streams = self.streams.lock();
            let s = streams.get(&key).copied();
            let (s, hand) = plan::follow(&self.units, s, u, forward, chunked, self.options.block);
            match s {
                Some(s) => {
                    streams.put(key, s);
                }
                None => {
                    streams.pop(&key);
                }
            }
            hand
        };
        if hand.is_empty() {
            return;
        }
        let starts = plan::starts(
            &self.units,
            hand,
            |v| self.filled.get(v),
            self.options.block,
        );
        if let Some(tx) = self.background.lock().clone() {
            for v in starts {
                let _ = tx.send(v);
            }
        }
    }

    /// Starts the background threads: read-ahead, the cache's writer, and
    /// `--prefetch all`.
    fn start_background(self: &Arc<Spool>) -> std::io::Result<()> {
        let (tx, rx) = mpsc::channel::<usize>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..BACKGROUND_THREADS {
            let (weak, rx) = (Arc::downgrade(self), rx.clone());
            std::thread::Builder::new()
                .name(format!("fetch-ahead-{i}"))
                .spawn(move || {
                    // Ends when the spool stops (its sender is dropped).
                    while let Ok(u) = rx.lock().recv() {
                        let Some(spool) = weak.upgrade() else { return };
                        if spool.stopped.load(Ordering::Acquire) {
                            return;
                        }
                        let (block, all) = (spool.options.block, 0..spool.units.len());
                        let deadline = spool.remote.deadline();
                        if let Err(e) = spool.fill(u, Who::Ahead, block, &all, deadline) {
                            tracing::debug!(unit = u, error = %e, "fetching ahead failed; left to the reader");
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
                    while let Some(u) = queue.take(true) {
                        // Ends with the spool; until then it takes turns
                        // with `finish`, which drains what is left.
                        let Some(spool) = weak.upgrade() else {
                            queue.done();
                            return;
                        };
                        spool.add_to_cache(u);
                        queue.done();
                    }
                })?;
        }
        if self.options.prefetch == Prefetch::All {
            self.prefetch(0..self.units.len())?;
        }
        Ok(())
    }

    /// Fills `units`, in their order, in the background beside the reads:
    /// on [`PREFETCH_STREAMS`] threads taking them in turn, each request
    /// bringing up to [`PREFETCH_BLOCK`] (or the block size) of the units
    /// from there on, within half the memory budget. Reads keep their own
    /// requests: a read of a unit a prefetch is fetching waits for it, any
    /// other is fetched at once.
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

    /// Stops the background work and wakes every wait: reads waiting for
    /// a fetch or for memory fail at once; fetches in flight are abandoned
    /// to end with their request.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.background.lock().take();
        {
            let mut q = self.to_cache.state.lock();
            q.stopped = true;
        }
        self.to_cache.more.notify_all();
        // Under the lock, so that no waiter misses it between its check
        // and its wait.
        drop(self.claims.lock());
        self.done.notify_all();
        self.budget.wake();
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
    /// cache, read back from the spool file into memory of the budget.
    fn add_to_cache(&self, u: usize) {
        let Some(cache) = &self.cache else { return };
        let w = &self.units[u];
        let Some(mut buf) = self
            .budget
            .take(
                w.len,
                Priority::Background,
                self.remote.deadline(),
                &AtomicBool::new(false),
            )
            .filter(|b| b.bytes.len() as u64 == w.len)
        else {
            tracing::debug!(unit = u, "no memory to add the unit to the cache");
            return;
        };
        match self.file.read_exact_at(&mut buf.bytes, w.start) {
            Ok(()) => cache.put(&w.hash, &buf.bytes),
            Err(e) => {
                tracing::debug!(unit = u, error = %e, "cannot read the spool to fill the cache")
            }
        }
    }

    /// Adds what is waiting to the cache, for at most `limit`: a mount's
    /// last reads reach the cache when it ends (what is left after that is
    /// fetched again if it is needed).
    fn drain_to_cache(&self, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(u) = self.to_cache.take(false) {
                self.add_to_cache(u);
                self.to_cache.done();
                continue;
            }
            // Nothing queued: wait for the writer thread's unit, if any.
            let mut q = self.to_cache.state.lock();
            if q.busy == 0 {
                return;
            }
            self.to_cache.added.wait_until(&mut q, until);
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
    /// Units were queued, or the spool stopped.
    more: Condvar,
    /// A unit was added to the cache.
    added: Condvar,
}

#[derive(Default)]
struct Queue {
    units: std::collections::VecDeque<usize>,
    /// Units taken from `units`, being added.
    busy: usize,
    /// The spool stopped: the writer thread ends.
    stopped: bool,
}

impl ToCache {
    /// The next unit to add, counted as busy until [`ToCache::done`];
    /// with `wait`, waits for one until the spool stops (then `None`).
    fn take(&self, wait: bool) -> Option<usize> {
        let mut q = self.state.lock();
        while wait && q.units.is_empty() && !q.stopped {
            self.more.wait(&mut q);
        }
        if wait && q.stopped {
            return None;
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
/// `units`, in order, beside the reads.
fn prefetch_in_order(weak: Weak<Spool>, units: &Mutex<impl Iterator<Item = usize>>) {
    loop {
        let Some(spool) = weak.upgrade() else { return };
        if spool.stopped.load(Ordering::Acquire) {
            return;
        }
        let n = spool.units.len();
        let next = units.lock().find(|&u| u < n && !spool.filled.get(u));
        let Some(u) = next else {
            tracing::debug!("prefetch done");
            return;
        };
        let block = spool.options.block.max(PREFETCH_BLOCK);
        let deadline = spool.remote.deadline();
        if let Err(e) = spool.fill(u, Who::Prefetch, block, &(u..n), deadline) {
            tracing::debug!(unit = u, error = %e, "prefetch failed; left to the readers");
        }
    }
}

/// Releases the claims of a fill, however it ends, and wakes the readers
/// waiting for them.
struct Release<'a> {
    spool: &'a Spool,
    units: &'a [usize],
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut c = self.spool.claims.lock();
        for u in self.units {
            c.claimed.remove(u);
        }
        drop(c);
        self.spool.done.notify_all();
    }
}
