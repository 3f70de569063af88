//! Writing a packet whose manifest is already complete, in one pass in file
//! order: the writer of `pack` and `seal`.
//!
//! Both know every hash before they write (new content is hashed first by
//! [`hash_new`]; a seal's reused entries keep theirs), so they can write
//! the manifest first and stream the rest behind it. The file is cut into
//! pieces of about one chunk (small members grouped, a larger file split
//! at its chunk boundaries). Worker threads (one per core) take pieces in
//! order, assemble them (headers, content, padding) and check content as
//! its source asks ([`Check`]): reused content against the manifest (a
//! small file's hash, or the one chunk a piece of a large file holds),
//! content `pack` hashed in its first pass against that pass's
//! fingerprint, per file or chunk likewise; two writer threads write them (two writes
//! in flight); a hasher thread takes them in file order, checks the files that span
//! pieces whole, and hashes them for `file_sha256` when asked (that hash is
//! sequential, so the pipeline then runs at its pace at best).
//! Nothing is read back.
//!
//! The writer goes around the page cache (`O_DIRECT`) when asked: for a
//! packet that is shipped rather than read here, that saves the copy into
//! the cache (the largest cost after hashing) and leaves nothing dirty for
//! the final fsync. Otherwise it writes through the cache and starts each
//! piece's writeback at once, so the fsync waits only for the tail.
//!
//! Why not `copy_file_range` for reused content: its bytes pass through
//! memory anyway, to be verified; and the
//! extent sharing that makes it cheap on reflink filesystems needs content
//! at block-aligned offsets in both files, which tar's 512-byte members
//! rarely give.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use sha2::Digest as _;

use super::remote::{Job, UPLOADERS};
use super::{
    AlignedBuf, Check, Computed, ContentReader, Contents, Dest, Hashed, Output, WriteStats,
    fingerprint,
};
use crate::packet::digest::{ContentHasher, Sha256};
use crate::packet::error::{Error, Result};
use crate::packet::format::{BLOCK, CHUNK_SIZE};
use crate::packet::layout::{Layout, manifest_header, write_entry_headers};
use crate::packet::manifest::{Entry, Manifest};

/// Members are grouped into pieces of about this many bytes.
const PIECE_BYTES: u64 = CHUNK_SIZE;

/// Pieces assembled but not yet hashed in file order, at most: bounds the
/// memory to this many buffers of about a chunk.
const IN_FLIGHT: usize = 8;

/// How many pieces ahead of the one being assembled its sources are asked
/// to start reading (16 MiB: enough to keep a disk busy).
const LOOKAHEAD: usize = 4;

/// Reads new content in pieces of this size when hashing it: one chunk, so
/// that each read is a whole small file or one chunk of a larger one, the
/// units the writer checks a fingerprint of.
const READ_PIECE: usize = CHUNK_SIZE as usize;

/// Hashes the content of every file `src` marks [`Check::Compute`], on all
/// cores, and keeps what `keep` asks for: the [`fingerprint`]s of files
/// read again later, the bytes of files small enough to hold. The caller
/// puts the hashes into the manifest before [`write_in_order`], which then
/// writes that content without hashing it again; content that changed in
/// between must be refused, by the source marking it
/// [`Check::Unchanged`] (checked against the fingerprints it kept), or in
/// [`ContentReader::finish`] (a seal's upper files, which nothing else
/// writes while it runs). Held bytes are the bytes hashed: the writer
/// copies them as they are.
pub fn hash_new<S: Contents>(
    manifest: &Manifest,
    src: &S,
    stats: &WriteStats,
    keep: Keep,
    progress: &(dyn Fn(u64) + Sync),
) -> std::result::Result<Computed, S::Error> {
    use rayon::prelude::*;
    let todo: Vec<(usize, u64)> = manifest
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Some((i, e.file()?.size)))
        .filter(|&(i, _)| src.check(i) == Check::Compute)
        .collect();
    todo.into_par_iter()
        .map_init(Vec::new, |buf, (i, size)| {
            let mut h = ContentHasher::new(size, manifest.version);
            let mut r = src.open(i)?;
            let mut prints = Vec::new();
            let held = if keep.hold_max.is_some_and(|max| size <= max) {
                // One read into memory the writer copies from: no second
                // open, read and compare.
                let mut data = vec![0u8; size as usize];
                r.read_exact(&mut data)?;
                h.update(&data);
                progress(size);
                Some(data.into_boxed_slice())
            } else {
                buf.resize(READ_PIECE, 0);
                let mut left = size;
                while left > 0 {
                    let n = left.min(READ_PIECE as u64) as usize;
                    r.read_exact(&mut buf[..n])?;
                    h.update(&buf[..n]);
                    if keep.fingerprints {
                        prints.push(fingerprint(&buf[..n]));
                    }
                    left -= n as u64;
                    progress(n as u64);
                }
                if keep.fingerprints && size == 0 {
                    // An empty file is read in no piece; its one is of nothing.
                    prints.push(fingerprint(&[]));
                }
                None
            };
            r.finish()?;
            stats.count(Check::Compute, size);
            let (sha256, chunks) = h.finish();
            Ok(Hashed {
                entry: i,
                sha256,
                chunks,
                fingerprints: prints,
                held,
            })
        })
        .collect()
}

/// What [`hash_new`] keeps of the content it reads, besides its hashes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Keep {
    /// A [`fingerprint`] of each file (or chunk) not held.
    pub fingerprints: bool,
    /// Hold the bytes of every file of at most this many bytes.
    pub hold_max: Option<u64>,
}

/// One unit of work: a contiguous range of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// The manifest member.
    Manifest,
    /// Whole members, none larger than a chunk.
    Members(Range<usize>),
    /// Chunk `k` of a file larger than a chunk; the first carries the
    /// member's headers, the last its padding.
    Chunk { member: usize, k: u64 },
}

/// Cuts the packet into pieces, in file order.
fn pieces(manifest: &Manifest, layout: &Layout) -> Vec<Piece> {
    let mut out = vec![Piece::Manifest];
    let mut group: Option<usize> = None;
    for (i, e) in manifest.entries.iter().enumerate() {
        let size = e.size();
        if size > CHUNK_SIZE {
            if let Some(s) = group.take() {
                out.push(Piece::Members(s..i));
            }
            out.extend((0..size.div_ceil(CHUNK_SIZE)).map(|k| Piece::Chunk { member: i, k }));
            continue;
        }
        if let Some(s) = group
            && layout.member_end(i) - layout.member_start(s) > PIECE_BYTES
        {
            out.push(Piece::Members(s..i));
            group = None;
        }
        group.get_or_insert(i);
    }
    if let Some(s) = group {
        out.push(Piece::Members(s..manifest.entries.len()));
    }
    out
}

/// Entries, and bytes `(offset, len)` of each when given (a chunk), as
/// [`Contents::prefetch`] and [`Contents::ready`] take them.
type Span = (Range<usize>, Option<(u64, u64)>);

/// The entries whose content a piece holds; `None` for the manifest.
fn content_of(piece: &Piece) -> Option<Span> {
    match *piece {
        Piece::Manifest => None,
        Piece::Members(ref r) => Some((r.clone(), None)),
        Piece::Chunk { member, k } => {
            Some((member..member + 1, Some((k * CHUNK_SIZE, CHUNK_SIZE))))
        }
    }
}

/// The output bytes a piece covers.
fn range(piece: &Piece, manifest: &Manifest, layout: &Layout) -> Range<u64> {
    match *piece {
        Piece::Manifest => 0..layout.member_start(0),
        Piece::Members(ref r) => layout.member_start(r.start)..layout.member_end(r.end - 1),
        Piece::Chunk { member, k } => {
            let e = &manifest.entries[member];
            let data = layout.data_offset(member, e);
            let start = if k == 0 {
                layout.member_start(member)
            } else {
                data + k * CHUNK_SIZE
            };
            let end = if (k + 1) * CHUNK_SIZE >= e.size() {
                layout.member_end(member)
            } else {
                data + (k + 1) * CHUNK_SIZE
            };
            start..end
        }
    }
}

/// How [`write_in_order`] writes.
#[derive(Clone, Copy, Debug)]
pub struct WriteOptions {
    /// The bytes go to the disk without the page cache (`O_DIRECT`, where
    /// the file system takes it): no copy into the cache and nothing left
    /// dirty, for a packet that will not be read here soon.
    pub direct: bool,
    /// Compute the SHA-256 of the whole file (`--file-sha256`): one more
    /// pass over every byte, on a thread of its own.
    pub file_sha256: bool,
}

/// Writes the whole packet for a complete `manifest` (whose encoding is
/// `manifest_bytes`) into `out`, as the module describes, and returns the
/// SHA-256 of the file when `how` asks for it. The caller syncs and
/// commits. Into an upload, the pieces wholly inside the parts it copies
/// are not made at all (their content is not read), and the others go to
/// it in file order; the file's SHA-256 then needs every piece made.
#[allow(clippy::too_many_arguments)]
pub fn write_in_order<S: Contents>(
    out: Dest<'_>,
    how: WriteOptions,
    manifest: &Manifest,
    manifest_bytes: &[u8],
    layout: &Layout,
    src: &S,
    stats: &WriteStats,
    progress: &(dyn Fn(u64) + Sync),
) -> std::result::Result<Option<Sha256>, S::Error> {
    let a = Assembler {
        manifest,
        manifest_bytes,
        layout,
        src,
        stats,
        progress,
    };
    // One worker per core assembles and checks; the hasher (sequential)
    // and the writers (mostly waiting on the disk) come on top. Measured on
    // 2 cores when the check was a second SHA-256: two workers beat one,
    // whose per-file work left the hasher waiting.
    // A source whose reads wait on round trips gets a worker per buffer,
    // so that that many pieces are fetched at once.
    let workers = if src.round_trips() {
        IN_FLIGHT
    } else {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    };
    write_pieces(&a, out, how, workers)
}

/// [`write_in_order`]'s pipeline, with `workers` assembling threads (at
/// most [`IN_FLIGHT`]: more would only wait for buffers).
fn write_pieces<S: Contents>(
    a: &Assembler<'_, S>,
    out: Dest<'_>,
    how: WriteOptions,
    workers: usize,
) -> std::result::Result<Option<Sha256>, S::Error> {
    let workers = workers.clamp(1, IN_FLIGHT);
    let (manifest, layout) = (a.manifest, a.layout);
    let mut pieces = pieces(manifest, layout);
    // Members some of whose pieces are copied, not made: not hashed whole.
    let mut partial = std::collections::HashSet::new();
    if let Dest::Remote(r) = out {
        let all = pieces.len();
        pieces.retain(|p| {
            let bytes = range(p, manifest, layout);
            if !r.is_copied(&bytes) {
                return true;
            }
            if let Piece::Chunk { member, .. } = p {
                partial.insert(*member);
            }
            (a.progress)(bytes.end - bytes.start);
            false
        });
        if how.file_sha256 && pieces.len() < all {
            return Err(S::Error::from(Error::io(
                "the file's SHA-256 needs every byte, and some are copied by the store",
                std::io::Error::other("internal error"),
            )));
        }
    }
    let count = pieces.len();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let sink = match out {
        Dest::File(out) => Some(Sink {
            out,
            direct: if how.direct { out.open_direct() } else { None },
            direct_refused: AtomicBool::new(false),
        }),
        Dest::Remote(_) => None,
    };
    tracing::debug!(
        direct = sink.as_ref().is_some_and(|s| s.direct.is_some()),
        remote = sink.is_none(),
        workers,
        pieces = count,
        "writing the packet in file order"
    );
    // Into an upload: parts queued in order by the hasher, sent by the
    // uploaders; one queued at most, so memory stays a few parts.
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(1);
    let job_rx = Mutex::new(job_rx);
    let to_file = sink.is_some();
    let sink_ref = &sink;
    let mut feeder = match out {
        Dest::Remote(r) => Some(r.feeder(job_tx)),
        Dest::File(_) => {
            drop(job_tx);
            None
        }
    };
    let (pool_tx, pool_rx) = mpsc::channel::<AlignedBuf>();
    for _ in 0..IN_FLIGHT {
        let _ = pool_tx.send(AlignedBuf::default());
    }
    let pool_rx = Mutex::new(pool_rx);
    let (hash_tx, hash_rx) = mpsc::channel::<(usize, Arc<AlignedBuf>)>();
    let (write_tx, write_rx) = mpsc::channel::<(u64, Arc<AlignedBuf>)>();
    let write_rx = Mutex::new(write_rx);
    let trailer = layout.total_len() - layout.end_offset();

    std::thread::scope(|s| {
        let (failed, pool_rx) = (&failed, &pool_rx);
        let hasher = {
            let pool_tx = pool_tx.clone();
            let pieces = &pieces;
            // `Some` once every piece is checked; in it, the file's hash
            // if asked for. The pieces go through here either way: files
            // that span pieces are checked whole here.
            start(s, failed, move || -> Result<Option<Option<Sha256>>> {
                let _guard = FailOnPanic(failed);
                let mut h = how.file_sha256.then(sha2::Sha256::new);
                let mut whole = None;
                let mut waiting = BTreeMap::new();
                let mut want = 0;
                while want < count {
                    if failed.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    match hash_rx.recv_timeout(POLL) {
                        Ok((idx, buf)) => waiting.insert(idx, buf),
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
                    };
                    while let Some(buf) = waiting.remove(&want) {
                        if let Some(h) = &mut h {
                            h.update(buf.bytes());
                        }
                        let piece = &pieces[want];
                        let whole_ok = match piece {
                            Piece::Chunk { member, .. } if partial.contains(member) => Ok(()),
                            _ => a.check_whole(piece, buf.bytes(), &mut whole),
                        };
                        let fed = whole_ok.and_then(|()| match &mut feeder {
                            Some(f) => f.push(range(piece, manifest, layout).start, buf.bytes()),
                            None => Ok(()),
                        });
                        if let Err(e) = fed {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        give_back(&pool_tx, buf);
                        want += 1;
                    }
                }
                let zeros = vec![0u8; trailer as usize];
                if let Some(mut f) = feeder.take() {
                    let fed = f
                        .push(layout.end_offset(), &zeros)
                        .and_then(|()| f.finish());
                    if let Err(e) = fed {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                Ok(Some(h.map(|mut h| {
                    h.update(&zeros);
                    Sha256(h.finalize().into())
                })))
            })
        };
        // Two writers keep two writes in flight: a direct write waits for
        // the device, and one at a time left it idle between requests.
        let writers: Vec<_> = (0..WRITERS)
            .filter_map(|_| sink_ref.as_ref())
            .map(|sink| {
                let (pool_tx, write_rx) = (pool_tx.clone(), &write_rx);
                start(s, failed, move || -> Result<()> {
                    let _guard = FailOnPanic(failed);
                    // Ends when every worker is done (their senders dropped).
                    loop {
                        let next = match write_rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return Ok(()),
                        };
                        let Ok((at, buf)) = next else { return Ok(()) };
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if let Err(e) = sink.write(buf.bytes(), at) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        give_back(&pool_tx, buf);
                    }
                })
            })
            .chain((0..UPLOADERS).filter(|_| !to_file).map(|_| {
                let (job_rx, remote) = (&job_rx, out);
                start(s, failed, move || -> Result<()> {
                    let _guard = FailOnPanic(failed);
                    match remote {
                        Dest::Remote(r) => r.run_jobs(job_rx, failed),
                        Dest::File(_) => Ok(()),
                    }
                })
            }))
            .collect();
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (hash_tx, write_tx) = (hash_tx.clone(), write_tx.clone());
                let pool_tx = pool_tx.clone();
                let (pieces, next) = (&pieces, &next);
                start(s, failed, move || -> std::result::Result<(), S::Error> {
                    let _guard = FailOnPanic(failed);
                    loop {
                        // A buffer first, then a piece: the lowest piece
                        // in progress always has its buffer, so the
                        // hasher never waits on a piece that waits on it.
                        let Some(mut buf) = take_buffer(pool_rx, failed) else {
                            return Ok(());
                        };
                        let idx = next.fetch_add(1, Ordering::Relaxed);
                        let Some(piece) = pieces.get(idx) else {
                            // Done: the buffer goes back, so that every
                            // other worker gets one and finds out too.
                            let _ = pool_tx.send(buf);
                            return Ok(());
                        };
                        if let Some(ahead) = pieces.get(idx + LOOKAHEAD) {
                            a.prefetch(ahead);
                        }
                        let r = range(piece, a.manifest, a.layout);
                        if let Err(e) = a.fill(piece, buf.window((r.end - r.start) as usize)) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        let buf = Arc::new(buf);
                        if (to_file && write_tx.send((r.start, buf.clone())).is_err())
                            || hash_tx.send((idx, buf)).is_err()
                        {
                            // The writer or the hasher stopped: it reports why.
                            failed.store(true, Ordering::Relaxed);
                            return Ok(());
                        }
                    }
                })
            })
            .collect();
        drop((hash_tx, write_tx, pool_tx));
        // A thread that could not start: those started stop (`failed`).
        let mut not_started = None;
        let hasher = started(hasher, &mut not_started);
        let writers: Vec<_> = writers
            .into_iter()
            .filter_map(|h| started(h, &mut not_started))
            .collect();
        let handles: Vec<_> = handles
            .into_iter()
            .filter_map(|h| started(h, &mut not_started))
            .collect();
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        let mut written = Ok(());
        for w in writers {
            let r = w
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            if written.is_ok() {
                written = r;
            }
        }
        let hash = hasher.map(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        if let Some(e) = not_started {
            return Err(S::Error::from(Error::io(
                "cannot start a thread to write the packet (a limit on processes, `ulimit -u` \
                 or the container's pids.max, or on address space, `ulimit -v`, was reached)",
                e,
            )));
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let Some(hash) = hash else {
            unreachable!("a hasher that did not start is reported above")
        };
        written?;
        hash?.ok_or_else(|| {
            S::Error::from(Error::io(
                "the packet writer stopped early",
                std::io::Error::other("internal error"),
            ))
        })
    })
}

/// Starts a thread of scope `s`; one that cannot start (a limit on
/// processes reached) sets `failed`, so that those started stop.
fn start<'s, T: Send + 's>(
    s: &'s std::thread::Scope<'s, '_>,
    failed: &AtomicBool,
    f: impl FnOnce() -> T + Send + 's,
) -> std::io::Result<std::thread::ScopedJoinHandle<'s, T>> {
    std::thread::Builder::new()
        .spawn_scoped(s, f)
        .inspect_err(|_| failed.store(true, Ordering::Relaxed))
}

/// The thread `h` if it started; if not, its error kept in `first`
/// (unless one is there already).
fn started<T>(h: std::io::Result<T>, first: &mut Option<std::io::Error>) -> Option<T> {
    h.map_err(|e| first.get_or_insert(e)).ok()
}

/// Writer threads, so many writes in flight.
const WRITERS: usize = 2;

/// How often threads waiting on a channel look at the failure flag.
const POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// A free buffer, or `None` once something failed.
fn take_buffer(
    pool: &Mutex<mpsc::Receiver<AlignedBuf>>,
    failed: &AtomicBool,
) -> Option<AlignedBuf> {
    loop {
        if failed.load(Ordering::Relaxed) {
            return None;
        }
        let rx = pool.lock().ok()?;
        match rx.recv_timeout(POLL) {
            Ok(buf) => return Some(buf),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Returns a buffer to the pool once both the writer and the hasher are
/// done with it (whichever is last gets it back).
fn give_back(pool: &mpsc::Sender<AlignedBuf>, buf: Arc<AlignedBuf>) {
    if let Some(buf) = Arc::into_inner(buf) {
        let _ = pool.send(buf);
    }
}

/// Stops the other threads when one panics.
struct FailOnPanic<'a>(&'a AtomicBool);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Where pieces go: the output, through the page cache or around it.
struct Sink<'a> {
    out: &'a Output,
    /// The output opened with `O_DIRECT`.
    direct: Option<std::fs::File>,
    /// Set once a direct write was refused: the rest goes through the cache.
    direct_refused: AtomicBool,
}

impl Sink<'_> {
    fn write(&self, bytes: &[u8], at: u64) -> Result<()> {
        if let Some(d) = self
            .direct
            .as_ref()
            .filter(|_| !self.direct_refused.load(Ordering::Relaxed))
        {
            use std::os::unix::fs::FileExt;
            match d.write_all_at(bytes, at) {
                Ok(()) => return Ok(()),
                // Not aligned enough for this disk: the page cache takes it.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!(at, "direct write refused; writing through the page cache");
                    self.direct_refused.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    let what = format!("cannot write the output at byte {at}");
                    return Err(Error::io_at(self.out.dest(), &what, e));
                }
            }
        }
        self.out.write_at(bytes, at)?;
        crate::sys::start_writeback(self.out.file(), at, bytes.len() as u64);
        Ok(())
    }
}

/// Writes into a piece's buffer from its start.
struct Cursor<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Cursor<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    /// The next `n` bytes, for the caller to fill whole.
    fn take(&mut self, n: usize) -> &mut [u8] {
        self.at += n;
        &mut self.buf[self.at - n..self.at]
    }

    /// Zeros up to the next block boundary (a member's padding).
    fn pad(&mut self) {
        let end = self.at.next_multiple_of(BLOCK as usize);
        self.buf[self.at..end].fill(0);
        self.at = end;
    }

    /// Zeros the rest (the manifest's or a large file's last padding).
    fn zero_rest(&mut self) {
        self.buf[self.at..].fill(0);
        self.at = self.buf.len();
    }
}

struct Assembler<'a, S> {
    manifest: &'a Manifest,
    manifest_bytes: &'a [u8],
    layout: &'a Layout,
    src: &'a S,
    stats: &'a WriteStats,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl<S: Contents> Assembler<'_, S> {
    /// Asks the source to start reading what `piece` will need.
    fn prefetch(&self, piece: &Piece) {
        if let Some((entries, window)) = content_of(piece) {
            self.src.prefetch(entries, window);
        }
    }

    /// Fills `out` (exactly the piece's length) with the bytes of `piece`.
    /// Every byte is written: a reused buffer's old bytes never leak.
    fn fill(&self, piece: &Piece, out: &mut [u8]) -> std::result::Result<(), S::Error> {
        if let Some((entries, window)) = content_of(piece) {
            self.src.ready(entries, window)?;
        }
        let mut cur = Cursor { buf: out, at: 0 };
        let mut headers = Vec::new();
        match *piece {
            Piece::Manifest => {
                cur.put(&manifest_header(self.manifest_bytes.len() as u64));
                cur.put(self.manifest_bytes);
            }
            Piece::Members(ref members) => {
                for i in members.clone() {
                    let e = &self.manifest.entries[i];
                    headers.clear();
                    write_entry_headers(e, &mut headers);
                    cur.put(&headers);
                    let Some(f) = e.file() else { continue };
                    let dst = cur.take(f.size as usize);
                    let mut reader = self.src.open(i)?;
                    reader.read_exact(dst)?;
                    reader.finish()?;
                    self.check(i, e, None, dst)?;
                    cur.pad();
                }
            }
            Piece::Chunk { member, k } => {
                let e = &self.manifest.entries[member];
                if k == 0 {
                    write_entry_headers(e, &mut headers);
                    cur.put(&headers);
                }
                let skip = k * CHUNK_SIZE;
                let dst = cur.take((e.size() - skip).min(CHUNK_SIZE) as usize);
                let mut reader = self.src.open(member)?;
                reader.skip(skip)?;
                reader.read_exact(dst)?;
                reader.finish()?;
                self.check(member, e, Some(k), dst)?;
            }
        }
        cur.zero_rest();
        Ok(())
    }

    /// For a file whose whole hash must be checked ([`Contents::check_whole`]):
    /// hashes the content `bytes` (all of `piece`) hold, into `whole`, and
    /// compares at its last chunk. The hasher calls it with every piece in
    /// file order, so a file's chunks come one after the other.
    fn check_whole(
        &self,
        piece: &Piece,
        bytes: &[u8],
        whole: &mut Option<sha2::Sha256>,
    ) -> Result<()> {
        let Piece::Chunk { member, k } = *piece else {
            return Ok(());
        };
        if !self.src.check_whole(member) {
            return Ok(());
        }
        let e = &self.manifest.entries[member];
        let Some(f) = e.file() else { return Ok(()) };
        if !self.manifest.version.whole_file_hash(f.size) {
            // A `/2` file with chunks has no whole-file hash to check.
            return Ok(());
        }
        let start = range(piece, self.manifest, self.layout).start;
        let data = self.layout.data_offset(member, e);
        let from = data + k * CHUNK_SIZE;
        let to = (from + CHUNK_SIZE).min(data + f.size);
        if k == 0 {
            *whole = Some(sha2::Sha256::new());
        }
        let h = whole.get_or_insert_with(sha2::Sha256::new);
        h.update(&bytes[(from - start) as usize..(to - start) as usize]);
        if to == data + f.size {
            let got = Sha256(whole.take().unwrap_or_default().finalize().into());
            if got != f.sha256 {
                return Err(super::content_mismatch(&e.path, 0, f.size));
            }
        }
        Ok(())
    }

    /// Checks content per its [`Check`] (a whole small file, or chunk `k`):
    /// reused content not trusted yet against the manifest, content hashed
    /// before against its fingerprint; and counts it.
    fn check(&self, i: usize, e: &Entry, k: Option<u64>, data: &[u8]) -> Result<()> {
        let n = data.len() as u64;
        let check = self.src.check(i);
        match check {
            // Counted when it was hashed, before the write.
            Check::Compute => {}
            Check::Trust => self.stats.count(check, n),
            Check::Verify => {
                let f = e
                    .file()
                    .ok_or_else(|| Error::io("verify", std::io::Error::other("not a file")))?;
                let (want, start) = match k {
                    None => (f.sha256, 0),
                    Some(k) => (
                        f.chunks.get(k as usize).copied().unwrap_or_default(),
                        k * CHUNK_SIZE,
                    ),
                };
                if Sha256::of(data) != want {
                    return Err(super::content_mismatch(&e.path, start, start + n));
                }
                self.stats.count(check, n);
            }
            Check::Unchanged => {
                if self.src.fingerprint(i, k) != Some(fingerprint(data)) {
                    let start = k.map_or(0, |k| k * CHUNK_SIZE);
                    return Err(super::content_mismatch(&e.path, start, start + n));
                }
                self.stats.count(check, n);
            }
        }
        if n > 0 {
            (self.progress)(n);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::format::Version;
    use crate::packet::manifest::{EntryKind, FileMeta};

    fn entry(path: &str, size: Option<u64>) -> Entry {
        Entry {
            path: path.into(),
            kind: match size {
                None => EntryKind::Dir,
                Some(size) => EntryKind::File(FileMeta {
                    size,
                    mtime_ns: 0,
                    executable: false,
                    sha256: Sha256::default(),
                    chunks: vec![
                        Sha256::default();
                        crate::packet::format::chunk_count(size) as usize
                    ]
                    .into(),
                }),
            },
        }
    }

    /// Files held in memory, all to be verified against the manifest, or,
    /// with fingerprints (of each entry as the first pass saw it), checked
    /// unchanged against those.
    struct Memory(Vec<Option<Vec<u8>>>, Option<Vec<Vec<u128>>>);

    struct MemReader<'a>(&'a [u8]);

    impl ContentReader for MemReader<'_> {
        type Error = Error;
        fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
            let (head, rest) = self.0.split_at(buf.len());
            buf.copy_from_slice(head);
            self.0 = rest;
            Ok(())
        }
        fn finish(self) -> Result<()> {
            Ok(())
        }
    }

    impl Contents for Memory {
        type Error = Error;
        type Reader<'a> = MemReader<'a>;
        fn check(&self, _i: usize) -> Check {
            if self.1.is_some() {
                Check::Unchanged
            } else {
                Check::Verify
            }
        }
        fn fingerprint(&self, i: usize, k: Option<u64>) -> Option<u128> {
            self.1
                .as_ref()?
                .get(i)?
                .get(k.unwrap_or(0) as usize)
                .copied()
        }
        fn open(&self, i: usize) -> Result<MemReader<'_>> {
            Ok(MemReader(self.0[i].as_deref().unwrap_or_default()))
        }
    }

    fn file_entry(path: &str, data: &[u8]) -> Entry {
        file_entry_in(path, data, Default::default())
    }

    /// A file of `data`, hashed as `version` records it.
    fn file_entry_in(path: &str, data: &[u8], version: Version) -> Entry {
        let mut h = ContentHasher::new(data.len() as u64, version);
        h.update(data);
        let (sha256, chunks) = h.finish();
        Entry {
            path: path.into(),
            kind: EntryKind::File(FileMeta {
                size: data.len() as u64,
                mtime_ns: 0,
                executable: false,
                sha256,
                chunks: chunks.into(),
            }),
        }
    }

    /// Writes a packet of `files` (directly or through the page cache)
    /// and returns its bytes and the hash the writer reported.
    fn write(
        dir: &std::path::Path,
        direct: bool,
        workers: usize,
        files: &[(&str, Vec<u8>)],
        tamper: bool,
    ) -> Result<(Vec<u8>, Sha256)> {
        write_checking(dir, direct, workers, files, tamper, Check::Verify)
    }

    /// [`write`], checking reused content by `check`: [`Check::Verify`]
    /// or [`Check::Unchanged`] (against fingerprints of `files`).
    fn write_checking(
        dir: &std::path::Path,
        direct: bool,
        workers: usize,
        files: &[(&str, Vec<u8>)],
        tamper: bool,
        check: Check,
    ) -> Result<(Vec<u8>, Sha256)> {
        let mut entries = vec![entry("workspace", None)];
        let mut data = vec![None];
        for (p, d) in files {
            entries.push(file_entry(p, d));
            data.push(Some(d.clone()));
        }
        let prints = fingerprints_of(&entries, &data);
        if tamper {
            // The last file's bytes no longer match its manifest hash.
            if let Some(Some(d)) = data.last_mut() {
                let mid = d.len() / 2;
                d[mid] ^= 1;
            }
        }
        let m = Manifest {
            version: Default::default(),
            harness: None,
            entries,
        };
        let bytes = m.encode();
        let layout = Layout::compute(&m, bytes.len() as u64);
        let dest = dir.join(format!("p-{direct}.packet"));
        let out = Output::create(&dest)?;
        out.size_for(&layout)?;
        let stats = WriteStats::default();
        let src = Memory(data, (check == Check::Unchanged).then_some(prints));
        let a = Assembler {
            manifest: &m,
            manifest_bytes: &bytes,
            layout: &layout,
            src: &src,
            stats: &stats,
            progress: &|_| {},
        };
        let sha =
            write_pieces(&a, Dest::File(&out), with_sha(direct), workers)?.unwrap_or_default();
        out.sync_data()?;
        out.commit(0o644)?;
        Ok((std::fs::read(&dest).unwrap(), sha))
    }

    /// Writes the packet of manifest `m` with content from `src` into
    /// `dir/name` (through the page cache) and returns the writer's hash.
    fn write_from<S: Contents<Error = Error>>(
        dir: &std::path::Path,
        name: &str,
        m: &Manifest,
        src: &S,
        workers: usize,
    ) -> Result<Sha256> {
        let bytes = m.encode();
        let layout = Layout::compute(m, bytes.len() as u64);
        let out = Output::create(&dir.join(name))?;
        out.size_for(&layout)?;
        let a = Assembler {
            manifest: m,
            manifest_bytes: &bytes,
            layout: &layout,
            src,
            stats: &WriteStats::default(),
            progress: &|_| {},
        };
        Ok(write_pieces(&a, Dest::File(&out), with_sha(false), workers)?.unwrap_or_default())
    }

    /// Writes with the file's hash, `direct` or not.
    fn with_sha(direct: bool) -> WriteOptions {
        WriteOptions {
            direct,
            file_sha256: true,
        }
    }

    /// New content: [`hash_new`] takes it from a [`Memory`] source.
    struct Fresh<'m>(&'m Memory);

    impl Contents for Fresh<'_> {
        type Error = Error;
        type Reader<'a>
            = MemReader<'a>
        where
            Self: 'a;
        fn check(&self, _i: usize) -> Check {
            Check::Compute
        }
        fn open(&self, i: usize) -> Result<MemReader<'_>> {
            self.0.open(i)
        }
    }

    /// The fingerprints [`hash_new`] takes of each entry's `data`.
    fn fingerprints_of(entries: &[Entry], data: &[Option<Vec<u8>>]) -> Vec<Vec<u128>> {
        let m = Manifest {
            version: Default::default(),
            harness: None,
            entries: entries.to_vec(),
        };
        let src = Memory(data.to_vec(), None);
        let mut prints = vec![Vec::new(); entries.len()];
        let keep = Keep {
            fingerprints: true,
            hold_max: None,
        };
        for h in hash_new(&m, &Fresh(&src), &WriteStats::default(), keep, &|_| {}).unwrap() {
            prints[h.entry] = h.fingerprints;
        }
        prints
    }

    /// A file's fingerprints are those of its chunks (or of the whole
    /// file up to one chunk), so the writer can check each piece it reads
    /// on its own; one changed byte changes its chunk's only.
    #[test]
    fn fingerprints_are_those_of_each_chunk() {
        let big = CHUNK_SIZE as usize;
        let sizes = [0, 1, 4095, big - 1, big, big + 1, 2 * big, 2 * big + 77];
        let mut entries = vec![entry("workspace", None)];
        let mut data = vec![None];
        for (n, size) in sizes.iter().enumerate() {
            let d: Vec<u8> = (0..*size).map(|i| (i * 7 % 251) as u8).collect();
            entries.push(file_entry(&format!("workspace/{n:02}"), &d));
            data.push(Some(d));
        }
        let prints = fingerprints_of(&entries, &data);
        for (n, size) in sizes.iter().enumerate() {
            let d = data[n + 1].as_deref().unwrap();
            let want: Vec<u128> = if *size > big {
                d.chunks(big).map(fingerprint).collect()
            } else {
                vec![fingerprint(d)]
            };
            assert_eq!(prints[n + 1], want, "size {size}");
        }
        let two = |d: Vec<u8>| {
            let e = [entry("workspace", None), file_entry("workspace/x", &d)];
            fingerprints_of(&e, &[None, Some(d)]).swap_remove(1)
        };
        let mut d = vec![0u8; 2 * big];
        let before = two(d.clone());
        d[big + 5] = 1;
        let after = two(d);
        assert_eq!(after[0], before[0]);
        assert_ne!(after[1], before[1]);
    }

    #[test]
    fn direct_and_cached_writes_give_the_same_valid_packet() {
        let tmp = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..(9u32 << 20) + 77)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let files = [
            ("workspace/a", b"alpha".to_vec()),
            ("workspace/big", big),
            ("workspace/empty", Vec::new()),
            ("workspace/z", vec![7u8; 3 << 20]),
        ];
        let (direct, d_sha) = write(tmp.path(), true, 2, &files, false).unwrap();
        let (cached, c_sha) = write(tmp.path(), false, 1, &files, false).unwrap();
        assert!(direct == cached, "the two modes wrote different bytes");
        assert_eq!(d_sha, Sha256::of(&direct));
        assert_eq!(c_sha, d_sha);
        // As many workers as buffers (and more, clamped): all finish.
        let (many, m_sha) = write(tmp.path(), true, IN_FLIGHT + 4, &files, false).unwrap();
        assert!(many == direct && m_sha == d_sha);
        let p = crate::packet::reader::Packet::open(
            &tmp.path().join("p-true.packet"),
            &crate::packet::format::Limits::DEFAULT,
        )
        .unwrap();
        let report = crate::packet::verify::verify(&p, &|_| {}).unwrap();
        assert_eq!(report.files, 4);
    }

    #[test]
    fn a_mismatch_fails_the_write_with_the_chunk() {
        let tmp = tempfile::tempdir().unwrap();
        let files = [
            ("workspace/a", b"alpha".to_vec()),
            ("workspace/big", vec![1u8; 9 << 20]),
        ];
        for direct in [true, false] {
            match write(tmp.path(), direct, 2, &files, true) {
                Err(Error::ContentMismatch { path, start, end }) => {
                    assert_eq!(
                        (path.as_str(), start, end),
                        ("workspace/big", 4 << 20, 8 << 20)
                    );
                }
                other => panic!("{:?}", other.map(|(_, s)| s)),
            }
            assert!(!tmp.path().join(format!("p-{direct}.packet")).exists());
        }
    }

    /// Reused content trusted chunk by chunk, its whole-file hash checked
    /// or not.
    struct Whole<'m>(&'m Memory, bool);

    impl Contents for Whole<'_> {
        type Error = Error;
        type Reader<'a>
            = MemReader<'a>
        where
            Self: 'a;
        fn check(&self, _i: usize) -> Check {
            Check::Trust
        }
        fn check_whole(&self, _i: usize) -> bool {
            self.1
        }
        fn open(&self, i: usize) -> Result<MemReader<'_>> {
            self.0.open(i)
        }
    }

    #[test]
    fn a_wrong_whole_hash_beside_right_chunks_is_refused_when_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..(9u32 << 20) + 1000).map(|i| (i % 251) as u8).collect();
        let data = vec![None, Some(big.clone()), Some(b"tail".to_vec())];
        for (wrong, checked) in [(true, true), (true, false), (false, true)] {
            // Only `/1` has a whole-file hash beside the chunks.
            let mut big_entry = file_entry_in("workspace/big", &big, Version::V1);
            if wrong {
                // Right chunks, a wrong whole: a packet readers refuse.
                if let EntryKind::File(f) = &mut big_entry.kind {
                    f.sha256.0[0] ^= 1;
                }
            }
            let m = Manifest {
                version: Version::V1,
                harness: None,
                entries: vec![
                    entry("workspace", None),
                    big_entry,
                    file_entry("workspace/c", b"tail"),
                ],
            };
            let memory = Memory(data.clone(), None);
            let got = write_from(tmp.path(), "w.packet", &m, &Whole(&memory, checked), 2);
            match (wrong && checked, got) {
                (true, Err(Error::ContentMismatch { path, start, end })) => {
                    assert_eq!(
                        (path.as_str(), start, end),
                        ("workspace/big", 0, big.len() as u64)
                    );
                }
                (false, Ok(_)) => {}
                (_, other) => panic!("wrong={wrong} checked={checked}: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn a_changed_chunk_fails_the_unchanged_check_with_its_range() {
        let tmp = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..9u32 << 20).map(|i| (i % 251) as u8).collect();
        let files = [("workspace/a", b"alpha".to_vec()), ("workspace/big", big)];
        // Unchanged, the bytes are those a verified write gives.
        let (fp, fp_sha) = write_checking(tmp.path(), true, 2, &files, false, Check::Unchanged)
            .expect("unchanged content passes");
        let (verified, _) = write(tmp.path(), true, 2, &files, false).unwrap();
        assert!(fp == verified && fp_sha == Sha256::of(&fp));
        // One byte in the middle chunk changed: that chunk is named.
        match write_checking(tmp.path(), false, 2, &files, true, Check::Unchanged) {
            Err(Error::ContentMismatch { path, start, end }) => {
                assert_eq!(
                    (path.as_str(), start, end),
                    ("workspace/big", 4 << 20, 8 << 20)
                );
            }
            other => panic!("{:?}", other.map(|(_, s)| s)),
        }
        // A source with no fingerprint for a file refuses it.
        let m = Manifest {
            version: Default::default(),
            harness: None,
            entries: vec![
                entry("workspace", None),
                file_entry("workspace/a", b"alpha"),
            ],
        };
        let src = Memory(vec![None, Some(b"alpha".to_vec())], Some(vec![Vec::new()]));
        let r = write_from(tmp.path(), "none.packet", &m, &src, 1);
        assert!(
            matches!(r, Err(Error::ContentMismatch { ref path, .. }) if path == "workspace/a"),
            "{r:?}"
        );
    }

    #[test]
    fn pieces_tile_the_file_in_order() {
        let m = Manifest {
            version: Default::default(),
            harness: None,
            entries: vec![
                entry("workspace", None),
                entry("workspace/a", Some(3 << 20)),
                entry("workspace/b", Some(2 << 20)),
                entry("workspace/big", Some(9 << 20)),
                entry("workspace/c", Some(0)),
                entry("workspace/d", Some(CHUNK_SIZE)),
                entry("workspace/e", Some(CHUNK_SIZE + 1)),
            ],
        };
        let layout = Layout::compute(&m, 1000);
        let p = pieces(&m, &layout);
        assert_eq!(
            p,
            vec![
                Piece::Manifest,
                Piece::Members(0..2),
                Piece::Members(2..3),
                Piece::Chunk { member: 3, k: 0 },
                Piece::Chunk { member: 3, k: 1 },
                Piece::Chunk { member: 3, k: 2 },
                Piece::Members(4..5),
                Piece::Members(5..6),
                Piece::Chunk { member: 6, k: 0 },
                Piece::Chunk { member: 6, k: 1 },
            ]
        );
        let mut at = 0;
        for piece in &p {
            let r = range(piece, &m, &layout);
            assert_eq!(r.start, at, "{piece:?} leaves a gap or overlaps");
            assert!(r.end > r.start);
            at = r.end;
        }
        assert_eq!(at, layout.end_offset());
    }
}
