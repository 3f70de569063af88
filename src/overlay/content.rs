//! Reading lower content: lazily verified, chunk by chunk.
//!
//! Each lower file is a run of chunks (4 MiB, or the whole file when it has
//! no `chunks`); one bit per chunk records that it was hashed and matched
//! the manifest. The first read touching a chunk reads and hashes all of it
//! (serving the request from the same buffer); later reads go straight to
//! the packet file. Bits only go from 0 to 1, so readers need no lock.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{Error, Result};
use super::index::Idx;
use sha2::Digest as _;

use crate::packet::digest::Sha256;
use crate::packet::format::CHUNK_SIZE;
use crate::packet::manifest::{EntryKind, Manifest};
use crate::packet::reader::Packet;

/// What identifies the packet file's content at open time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Identity {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn identity(p: &Packet) -> std::io::Result<Identity> {
    let m = p.file().metadata()?;
    Ok(Identity {
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

/// Verified-chunk bitmap and counters.
pub struct Verifier {
    /// First bit of each entry (files only).
    base: Vec<u64>,
    bits: Vec<AtomicU64>,
    at_open: Identity,
    /// Bytes hashed to verify chunks.
    pub hashed: AtomicU64,
    /// Chunks verified.
    pub chunks: AtomicU64,
    /// Striped locks over chunk bits: a chunk is hashed by one reader while
    /// the others that want it wait (the kernel sends a file's readahead
    /// requests to several threads at once; without this each of them
    /// hashed the same chunk).
    hashing: Box<[parking_lot::Mutex<()>]>,
    /// The read buffer of a verification, kept for the next one.
    spare: parking_lot::Mutex<Vec<u8>>,
    /// Set by [`Self::mark_all`].
    written_here: std::sync::atomic::AtomicBool,
}

/// Stripes of [`Verifier::hashing`].
const HASH_STRIPES: u64 = 64;

/// A chunk being verified is requested from the disk in pieces of this
/// size, all at once (measured on the benchmark disk: four 1 MiB requests
/// in flight arrive sooner than one of 4 MiB)...
const VERIFY_PIECE: u64 = 1 << 20;

/// ...and read and hashed through a buffer of this size: a fresh 4 MiB
/// buffer cost 2.8 ms of page faults on a first random read here, more
/// than hashing half the chunk.
const READ_PIECE: u64 = 256 << 10;

/// Number of chunks of a file of `size` bytes as verified by a mount.
fn chunks_of(size: u64, chunked: bool) -> u64 {
    match (size, chunked) {
        (0, _) => 0,
        (_, false) => 1,
        (s, true) => s.div_ceil(CHUNK_SIZE),
    }
}

impl Verifier {
    /// A bitmap for every chunk of `packet`'s files, all unverified.
    pub fn new(packet: &Packet) -> std::io::Result<Verifier> {
        let m: &Manifest = &packet.manifest;
        let mut base = Vec::with_capacity(m.entries.len());
        let mut total = 0u64;
        for e in &m.entries {
            base.push(total);
            if let EntryKind::File(f) = &e.kind {
                total += chunks_of(f.size, !f.chunks.is_empty());
            }
        }
        let bits = (0..total.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(Verifier {
            base,
            bits,
            at_open: identity(packet)?,
            hashed: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            hashing: (0..HASH_STRIPES)
                .map(|_| parking_lot::Mutex::new(()))
                .collect(),
            spare: parking_lot::Mutex::new(Vec::new()),
            written_here: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Marks every chunk verified: for a packet this daemon just wrote from
    /// bytes it verified or hashed itself.
    pub fn mark_all(&self) {
        for w in &self.bits {
            w.store(u64::MAX, Ordering::Release);
        }
        self.written_here.store(true, Ordering::Release);
    }

    /// Whether the packet is one this daemon wrote (see [`Self::mark_all`]):
    /// written around the page cache, so not in it.
    pub fn written_here(&self) -> bool {
        self.written_here.load(Ordering::Acquire)
    }

    /// Fails with [`Error::PacketChanged`] if the packet file is not the
    /// one the chunks were verified in (its size, mtime or ctime moved):
    /// nothing verified before can be trusted then.
    pub fn check_unchanged(&self, packet: &Packet) -> Result<()> {
        if identity(packet).map_err(Error::PacketIo)? != self.at_open {
            tracing::error!(packet = %packet.path().display(), "the packet file changed while mounted");
            return Err(Error::PacketChanged);
        }
        Ok(())
    }

    fn is_verified(&self, bit: u64) -> bool {
        self.bits[(bit / 64) as usize].load(Ordering::Acquire) & (1 << (bit % 64)) != 0
    }

    fn mark(&self, bit: u64) {
        self.bits[(bit / 64) as usize].fetch_or(1 << (bit % 64), Ordering::AcqRel);
    }

    /// Whether every chunk of entry `i` has been verified.
    pub fn all_verified(&self, packet: &Packet, i: Idx) -> bool {
        let Some(f) = packet.manifest.entries[i as usize].file() else {
            return true;
        };
        let b = self.base[i as usize];
        (0..chunks_of(f.size, !f.chunks.is_empty())).all(|k| self.is_verified(b + k))
    }

    /// Appends to `out` the bytes `offset..offset + len` of lower file `i`
    /// (clamped to its size), verifying every chunk they touch first.
    pub fn read(
        &self,
        packet: &Packet,
        i: Idx,
        offset: u64,
        len: u64,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let e = &packet.manifest.entries[i as usize];
        let Some(f) = e.file() else {
            return Err(Error::IsDir);
        };
        if offset >= f.size || len == 0 {
            return Ok(());
        }
        self.check_unchanged(packet)?;
        let end = f.size.min(offset.saturating_add(len));
        let chunked = !f.chunks.is_empty();
        let csize = if chunked { CHUNK_SIZE } else { f.size };
        let mut pos = offset;
        let mut piece_buf: Vec<u8> = Vec::new();
        while pos < end {
            let k = pos / csize;
            let cstart = k * csize;
            let cend = (cstart + csize).min(f.size);
            let take_end = end.min(cend);
            let bit = self.base[i as usize] + k;
            // Whoever hashes this chunk holds its stripe; a reader that
            // waited finds it verified.
            let _hashing = (!self.is_verified(bit))
                .then(|| self.hashing[(bit % HASH_STRIPES) as usize].lock());
            if self.is_verified(bit) {
                let at = out.len();
                out.resize(at + (take_end - pos) as usize, 0);
                packet
                    .read_content_at(i as usize, pos, &mut out[at..])
                    .map_err(Error::PacketIo)?;
            } else {
                // A large chunk is asked for in pieces, all at once (the
                // disk serves several requests sooner than one large one),
                // and hashed piece by piece as they arrive.
                let base = packet.content_offset(i as usize);
                let len = cend - cstart;
                if len > VERIFY_PIECE {
                    let mut at = 0;
                    while at < len {
                        let n = VERIFY_PIECE.min(len - at);
                        crate::sys::will_need(packet.file(), base + cstart + at, n);
                        at += n;
                    }
                }
                // A reader moving forward will want the next chunk: the disk
                // fetches it while this one is hashed. (Not for a reader
                // that jumped here: asking costs the request 0.6 ms.)
                let forward = k == 0 || self.is_verified(bit - 1);
                if cend < f.size && forward {
                    crate::sys::will_need(packet.file(), base + cend, csize.min(f.size - cend));
                }
                // Streamed through a small buffer, kept between reads: the
                // part the caller asked for is copied out on the way, and
                // taken back if the chunk fails.
                if piece_buf.capacity() == 0 {
                    piece_buf = std::mem::take(&mut *self.spare.lock());
                }
                let need = READ_PIECE.min(len) as usize;
                if piece_buf.len() < need {
                    piece_buf.resize(need, 0);
                }
                // Bytes copied out before the chunk is known good are taken
                // back on every failure.
                let kept = out.len();
                let streamed = (|| -> Result<Sha256> {
                    let mut hasher = sha2::Sha256::new();
                    let mut at = cstart;
                    while at < cend {
                        let n = READ_PIECE.min(cend - at);
                        let piece = &mut piece_buf[..n as usize];
                        packet
                            .read_content_at(i as usize, at, piece)
                            .map_err(Error::PacketIo)?;
                        hasher.update(&*piece);
                        let (lo, hi) = (pos.max(at), take_end.min(at + n));
                        if lo < hi {
                            out.extend_from_slice(&piece[(lo - at) as usize..(hi - at) as usize]);
                        }
                        at += n;
                    }
                    Ok(Sha256(hasher.finalize().into()))
                })();
                let got = match streamed {
                    Ok(got) => got,
                    Err(e) => {
                        out.truncate(kept);
                        return Err(e);
                    }
                };
                let want = if chunked {
                    f.chunks[k as usize]
                } else {
                    f.sha256
                };
                self.hashed.fetch_add(cend - cstart, Ordering::Relaxed);
                if got != want {
                    out.truncate(kept);
                    tracing::error!(path = %e.path, start = cstart, end = cend, "lower content does not match the manifest; failing the read");
                    return Err(Error::Corrupt {
                        path: e.path.to_string(),
                        start: cstart,
                        end: cend,
                    });
                }
                self.mark(bit);
                self.chunks.fetch_add(1, Ordering::Relaxed);
            }
            pos = take_end;
        }
        if piece_buf.capacity() > 0 {
            *self.spare.lock() = piece_buf;
        }
        Ok(())
    }
}
