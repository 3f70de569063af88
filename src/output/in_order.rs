//! Writing a packet whose manifest is already complete, in one pass in file
//! order: the seal's writer.
//!
//! A seal knows every hash before it writes (reused entries keep theirs,
//! new content is hashed first by [`hash_new`]), so it can write the
//! manifest first and stream the rest behind it. The file is cut into
//! pieces of about one chunk (small members grouped, a larger file split
//! at its chunk boundaries); worker threads, one per core, take pieces in
//! order, assemble them (headers, content, padding), verify reused content
//! against the manifest (a small file's hash, or the one chunk a piece of a
//! large file holds), write them, and start their writeback; one more
//! thread hashes the pieces in file order for `file_sha256`. Nothing is
//! read back, and the final fsync waits only for the tail.
//!
//! Why not `copy_file_range` for reused content: its bytes pass through
//! memory anyway, to be verified and to feed `file_sha256`; and the
//! extent sharing that makes it cheap on reflink filesystems needs content
//! at block-aligned offsets in both files, which tar's 512-byte members
//! rarely give.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};

use sha2::Digest as _;

use super::{Check, Computed, ContentReader, Contents, Output, WriteStats};
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

/// Reads new content in pieces of this size when hashing it.
const READ_PIECE: usize = 1 << 20;

/// Hashes the content of every file `src` marks [`Check::Compute`], on all
/// cores. The caller puts the hashes into the manifest before
/// [`write_in_order`], which then writes that content without hashing it
/// again (a source must refuse, in [`ContentReader::finish`], content that
/// changed in between).
pub fn hash_new<S: Contents>(
    manifest: &Manifest,
    src: &S,
    stats: &WriteStats,
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
            buf.resize(READ_PIECE, 0);
            let mut h = ContentHasher::new(size);
            let mut r = src.open(i)?;
            let mut left = size;
            while left > 0 {
                let n = left.min(READ_PIECE as u64) as usize;
                r.read_exact(&mut buf[..n])?;
                h.update(&buf[..n]);
                left -= n as u64;
            }
            r.finish()?;
            stats.hashed.fetch_add(size, Ordering::Relaxed);
            let (sha, chunks) = h.finish();
            Ok((i, sha, chunks))
        })
        .collect()
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

/// Writes the whole packet for a complete `manifest` (whose encoding is
/// `manifest_bytes`) into `out`, as the module describes, and returns the
/// SHA-256 of the file. The caller syncs and commits.
pub fn write_in_order<S: Contents>(
    out: &Output,
    manifest: &Manifest,
    manifest_bytes: &[u8],
    layout: &Layout,
    src: &S,
    stats: &WriteStats,
    progress: &(dyn Fn(u64) + Sync),
) -> std::result::Result<Sha256, S::Error> {
    let a = Assembler {
        manifest,
        manifest_bytes,
        layout,
        src,
        stats,
        progress,
    };
    let pieces = pieces(manifest, layout);
    let count = pieces.len();
    let next = AtomicUsize::new(0);
    let write_lock = parking_lot::Mutex::new(());
    let failed = AtomicBool::new(false);
    let (pool_tx, pool_rx) = mpsc::channel::<Vec<u8>>();
    for _ in 0..IN_FLIGHT {
        let _ = pool_tx.send(Vec::new());
    }
    let pool_rx = Mutex::new(pool_rx);
    // `None` says a worker failed: the hasher stops waiting.
    let (done_tx, done_rx) = mpsc::channel::<Option<(usize, Vec<u8>)>>();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let trailer = layout.total_len() - layout.end_offset();

    std::thread::scope(|s| {
        // The hasher holds the pool's only sender: when it stops, workers
        // waiting for a buffer stop too.
        let hasher = s.spawn(move || -> Option<Sha256> {
            let mut h = sha2::Sha256::new();
            let mut waiting = BTreeMap::new();
            let mut want = 0;
            while want < count {
                let (idx, buf) = done_rx.recv().ok()??;
                waiting.insert(idx, buf);
                while let Some(buf) = waiting.remove(&want) {
                    h.update(&buf);
                    let _ = pool_tx.send(buf);
                    want += 1;
                }
            }
            h.update(vec![0u8; trailer as usize]);
            Some(Sha256(h.finalize().into()))
        });
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let done_tx = done_tx.clone();
                let (a, pieces, next, failed, pool_rx, write_lock) =
                    (&a, &pieces, &next, &failed, &pool_rx, &write_lock);
                s.spawn(move || -> std::result::Result<(), S::Error> {
                    let _guard = FailOnPanic(&done_tx);
                    loop {
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        // A buffer first, then a piece: the lowest piece
                        // in progress always has its buffer, so the
                        // hasher can never wait on a piece that waits on it.
                        let Ok(mut buf) = pool_rx
                            .lock()
                            .map_err(|_| ())
                            .and_then(|rx| rx.recv().map_err(|_| ()))
                        else {
                            return Ok(());
                        };
                        let idx = next.fetch_add(1, Ordering::Relaxed);
                        let Some(piece) = pieces.get(idx) else {
                            return Ok(());
                        };
                        match a.fill(piece, &mut buf).and_then(|at| {
                            // The kernel serializes buffered writes to a
                            // file (and spins while it waits): a waiter
                            // that sleeps here leaves the core to others.
                            let _one = write_lock.lock();
                            out.write_at(&buf, at).map_err(S::Error::from)?;
                            crate::sys::start_writeback(out.file(), at, buf.len() as u64);
                            Ok(())
                        }) {
                            Ok(()) => {
                                let _ = done_tx.send(Some((idx, buf)));
                            }
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                let _ = done_tx.send(None);
                                return Err(e);
                            }
                        }
                    }
                })
            })
            .collect();
        drop(done_tx);
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
        let hash = hasher
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match (first_err, hash) {
            (Some(e), _) => Err(e),
            (None, Some(h)) => Ok(h),
            (None, None) => Err(S::Error::from(Error::io(
                "the packet writer stopped early",
                std::io::Error::other("internal error"),
            ))),
        }
    })
}

/// Tells the hasher to stop waiting when a worker panics.
struct FailOnPanic<'a>(&'a mpsc::Sender<Option<(usize, Vec<u8>)>>);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.send(None);
        }
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
    /// Fills `buf` with the bytes of `piece`, returning its offset.
    fn fill(&self, piece: &Piece, buf: &mut Vec<u8>) -> std::result::Result<u64, S::Error> {
        let r = range(piece, self.manifest, self.layout);
        buf.clear();
        match *piece {
            Piece::Manifest => {
                buf.extend_from_slice(&manifest_header(self.manifest_bytes.len() as u64));
                buf.extend_from_slice(self.manifest_bytes);
            }
            Piece::Members(ref members) => {
                for i in members.clone() {
                    let e = &self.manifest.entries[i];
                    write_entry_headers(e, buf);
                    let Some(f) = e.file() else { continue };
                    let at = buf.len();
                    buf.resize(at + f.size as usize, 0);
                    let mut reader = self.src.open(i)?;
                    reader.read_exact(&mut buf[at..])?;
                    reader.finish()?;
                    self.check(i, e, None, &buf[at..])?;
                    buf.resize(buf.len().next_multiple_of(BLOCK as usize), 0);
                }
            }
            Piece::Chunk { member, k } => {
                let e = &self.manifest.entries[member];
                if k == 0 {
                    write_entry_headers(e, buf);
                }
                let skip = k * CHUNK_SIZE;
                let n = (e.size() - skip).min(CHUNK_SIZE) as usize;
                let at = buf.len();
                buf.resize(at + n, 0);
                let mut reader = self.src.open(member)?;
                reader.skip(skip)?;
                reader.read_exact(&mut buf[at..])?;
                reader.finish()?;
                self.check(member, e, Some(k), &buf[at..])?;
            }
        }
        buf.resize(buf.len().next_multiple_of(BLOCK as usize), 0);
        debug_assert_eq!(buf.len() as u64, r.end - r.start, "{piece:?}");
        Ok(r.start)
    }

    /// Verifies reused content that is not trusted yet (a whole small file,
    /// or chunk `k`), and counts it.
    fn check(&self, i: usize, e: &Entry, k: Option<u64>, data: &[u8]) -> Result<()> {
        let n = data.len() as u64;
        match self.src.check(i) {
            Check::Compute => {}
            Check::Trust => {
                self.stats.copied.fetch_add(n, Ordering::Relaxed);
            }
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
                    let end = start + n;
                    tracing::error!(path = %e.path, start, end, "lower content does not match the manifest");
                    return Err(Error::ContentMismatch {
                        path: e.path.to_string(),
                        start,
                        end,
                    });
                }
                self.stats.verified.fetch_add(n, Ordering::Relaxed);
                self.stats.copied.fetch_add(n, Ordering::Relaxed);
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

    #[test]
    fn pieces_tile_the_file_in_order() {
        let m = Manifest {
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
