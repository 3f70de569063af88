//! Reading lower content: lazily verified, chunk by chunk.
//!
//! Each lower file is a run of chunks (4 MiB, or the whole file when it has
//! no `chunks`); one bit per chunk records that it was hashed and matched
//! the manifest. The first read touching a chunk reads and hashes all of it
//! (serving the request from the same buffer); later reads go straight to
//! the packet file. Bits only go from 0 to 1, so readers need no lock. A
//! reader moving forward through a chunked file gets the next chunk
//! verified on another thread while it reads this one.

use std::ops::Range;
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
    Ok(identity_of(&p.file().metadata()?))
}

fn identity_of(m: &std::fs::Metadata) -> Identity {
    Identity {
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

/// Verified-chunk bitmap and counters.
pub struct Verifier {
    /// First bit of each entry (files only).
    base: Vec<u64>,
    bits: Vec<AtomicU64>,
    /// The packet file's identity at open, moved on only by a rename of
    /// this daemon's own seal over the packet's path (which moves the old
    /// file's ctime): see [`Self::around_own_rename`].
    at_open: parking_lot::RwLock<Identity>,
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
    /// The bit of the last chunk handed out by [`Self::ahead`].
    ahead: AtomicU64,
    /// Set by [`Self::mark_all`].
    written_here: std::sync::atomic::AtomicBool,
}

/// How many chunks past a sequential reader's are verified ahead of it. One
/// takes a cold 1 GiB read from 1.37 s to 0.86 s here; two measured the same
/// (0.87 s), hashing a chunk more for a reader that stops.
const AHEAD: u64 = 1;

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
                // A file with chunks has one bit more, after its chunks':
                // its whole-file hash checked (see Self::whole_checked).
                total += chunks_of(f.size, !f.chunks.is_empty()) + u64::from(!f.chunks.is_empty());
            }
        }
        let bits = (0..total.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(Verifier {
            base,
            bits,
            at_open: parking_lot::RwLock::new(identity(packet)?),
            hashed: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            hashing: (0..HASH_STRIPES)
                .map(|_| parking_lot::Mutex::new(()))
                .collect(),
            spare: parking_lot::Mutex::new(Vec::new()),
            ahead: AtomicU64::new(u64::MAX),
            written_here: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether the packet was opened as the file `committed`, unmodified
    /// (see [`crate::output::Committed::is`]), as its stat at open shows.
    pub fn opened_as(&self, packet: &Packet, committed: &crate::output::Committed) -> bool {
        packet
            .file()
            .metadata()
            .is_ok_and(|m| committed.is(&m) && identity_of(&m) == *self.at_open.read())
    }

    /// Marks every chunk verified: for a packet this daemon just wrote from
    /// bytes it verified or hashed itself (and found [`Self::opened_as`]
    /// it).
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
        let at_open = *self.at_open.read();
        if identity(packet).map_err(|e| Error::packet_io(packet, e))? != at_open {
            tracing::error!(packet = %packet.path().display(), "the packet file changed while mounted");
            return Err(Error::PacketChanged {
                packet: crate::packet::path::shown_path(packet.path()),
            });
        }
        Ok(())
    }

    /// Runs `rename`, a seal's commit of a packet over the path of this
    /// one (`seal -o SERVED --rebase`), with reads of the packet held back
    /// meanwhile: the rename moves this file's ctime (its link count
    /// drops), which is then taken as its new identity if its size and
    /// mtime are unchanged, so that the mount goes on serving it, and
    /// moving onto the new packet, instead of taking the rename for a
    /// change and failing every read.
    pub fn around_own_rename<R>(&self, packet: &Packet, rename: impl FnOnce() -> R) -> R {
        let mut at_open = self.at_open.write();
        let r = rename();
        if let Ok(now) = identity(packet)
            && (now.len, now.mtime) == (at_open.len, at_open.mtime)
        {
            *at_open = now;
        }
        r
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

    /// Whether the whole-file SHA-256 of entry `i` is known to match its
    /// content: always for a file without chunks (its one chunk is the
    /// whole), else once [`Self::mark_whole`] said so. Verifying every
    /// chunk does not prove it: a manifest may pair right chunk hashes
    /// with a wrong whole hash, and a packet holding it is invalid.
    pub fn whole_checked(&self, packet: &Packet, i: Idx) -> bool {
        match packet.manifest.entries[i as usize].file() {
            Some(f) if !f.chunks.is_empty() => {
                self.is_verified(self.base[i as usize] + chunks_of(f.size, true))
            }
            _ => true,
        }
    }

    /// Records that entry `i`'s whole-file hash was checked against its
    /// content (by a seal that copied it).
    pub fn mark_whole(&self, packet: &Packet, i: Idx) {
        if let Some(f) = packet.manifest.entries[i as usize].file()
            && !f.chunks.is_empty()
        {
            self.mark(self.base[i as usize] + chunks_of(f.size, true));
        }
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
        let csize = chunk_size(f);
        let mut pos = offset;
        let mut trusted = false;
        while pos < end {
            let k = pos / csize;
            let take_end = end.min((k + 1) * csize).min(f.size);
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
                    .map_err(|e| Error::packet_io(packet, e))?;
                trusted = true;
            } else {
                // A reader moving forward will want the next chunk: the disk
                // fetches it while this one is hashed. (Not for a reader
                // that jumped here: asking costs the request 0.6 ms.)
                if self.forward(i, k) {
                    prefetch_after(packet, i, k);
                }
                if let Err(err) = self.verify(packet, i, k, (pos, take_end), out) {
                    if let Error::Corrupt { path, start, end } = &err {
                        tracing::error!(%path, start, end, "lower content does not match the manifest; failing the read");
                    }
                    return Err(err);
                }
            }
            pos = take_end;
        }
        // Bytes of chunks verified earlier were read without hashing: the
        // packet is checked again after reading them, so that a write to
        // it that landed between the first check and the read is caught
        // (a write moves the file's times before it copies its bytes).
        if trusted {
            self.check_unchanged(packet)?;
        }
        Ok(())
    }

    /// Whether a reader of chunk `k` of file `i` is moving forward through
    /// the file: it starts there, or read the chunk before.
    fn forward(&self, i: Idx, k: u64) -> bool {
        k == 0 || self.is_verified(self.base[i as usize] + k - 1)
    }

    /// The chunks to verify ahead of a reader that just read `len` bytes at
    /// `offset` of lower file `i`: the next `AHEAD` ones, if the reader is
    /// moving forward, less those handed out already. The caller runs
    /// [`Self::verify_ahead`] for each on another thread, so that a
    /// sequential reader finds each chunk verified when it gets there
    /// instead of waiting for its hash (the cores hash while the dispatch
    /// threads serve the reads).
    pub fn ahead(&self, packet: &Packet, i: Idx, offset: u64, len: u64) -> Range<u64> {
        let none = 0..0;
        let Some(f) = packet.manifest.entries[i as usize].file() else {
            return none;
        };
        if f.chunks.is_empty() || len == 0 {
            return none;
        }
        let k = (offset.saturating_add(len) - 1) / CHUNK_SIZE;
        let last = (k + AHEAD).min(f.chunks.len() as u64 - 1);
        if last <= k || !self.forward(i, k) {
            return none;
        }
        let base = self.base[i as usize];
        let prev = self.ahead.swap(base + last, Ordering::AcqRel);
        let from = if (base + k + 1..=base + last).contains(&prev) {
            prev - base + 1
        } else {
            k + 1
        };
        from..last + 1
    }

    /// Verifies chunk `k` of lower file `i` unless it is verified or being
    /// verified. A failure is not reported here: the reader that gets to
    /// the chunk verifies it again and fails its read.
    pub fn verify_ahead(&self, packet: &Packet, i: Idx, k: u64) {
        let bit = self.base[i as usize] + k;
        let Some(_hashing) = self.hashing[(bit % HASH_STRIPES) as usize].try_lock() else {
            return;
        };
        if self.is_verified(bit) || self.check_unchanged(packet).is_err() {
            return;
        }
        prefetch_after(packet, i, k);
        if let Err(e) = self.verify(packet, i, k, (0, 0), &mut Vec::new()) {
            tracing::debug!(entry = i, chunk = k, error = %e, "verifying ahead failed; left to the reader");
        }
    }

    /// Reads and hashes chunk `k` of lower file `i`, appending the bytes of
    /// `want` (a range of file offsets inside the chunk) to `out` on the
    /// way, and marks the chunk verified if it matches the manifest. On any
    /// failure `out` is left as it was. The caller holds the chunk's stripe.
    fn verify(
        &self,
        packet: &Packet,
        i: Idx,
        k: u64,
        (pos, take_end): (u64, u64),
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let e = &packet.manifest.entries[i as usize];
        let f = e.file().ok_or(Error::IsDir)?;
        let csize = chunk_size(f);
        let cstart = k * csize;
        let cend = (cstart + csize).min(f.size);
        // A large chunk is asked for in pieces, all at once (the disk serves
        // several requests sooner than one large one), and hashed piece by
        // piece as they arrive.
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
        // Streamed through a small buffer, kept between reads: the part the
        // caller asked for is copied out on the way, and taken back if the
        // chunk fails.
        let mut piece_buf = std::mem::take(&mut *self.spare.lock());
        let need = READ_PIECE.min(len) as usize;
        if piece_buf.len() < need {
            piece_buf.resize(need, 0);
        }
        let kept = out.len();
        let streamed = (|| -> Result<Sha256> {
            let mut hasher = sha2::Sha256::new();
            let mut at = cstart;
            while at < cend {
                let n = READ_PIECE.min(cend - at);
                let piece = &mut piece_buf[..n as usize];
                packet
                    .read_content_at(i as usize, at, piece)
                    .map_err(|e| Error::packet_io(packet, e))?;
                hasher.update(&*piece);
                let (lo, hi) = (pos.max(at), take_end.min(at + n));
                if lo < hi {
                    out.extend_from_slice(&piece[(lo - at) as usize..(hi - at) as usize]);
                }
                at += n;
            }
            Ok(Sha256(hasher.finalize().into()))
        })();
        *self.spare.lock() = piece_buf;
        let got = match streamed {
            Ok(got) => got,
            Err(e) => {
                out.truncate(kept);
                return Err(e);
            }
        };
        let want = if f.chunks.is_empty() {
            f.sha256
        } else {
            f.chunks[k as usize]
        };
        self.hashed.fetch_add(len, Ordering::Relaxed);
        if got != want {
            out.truncate(kept);
            return Err(Error::Corrupt {
                path: e.path.to_string(),
                start: cstart,
                end: cend,
            });
        }
        self.mark(self.base[i as usize] + k);
        self.chunks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Asks the disk for the chunk after chunk `k` of lower file `i`, if there
/// is one, so that it arrives while chunk `k` is hashed.
fn prefetch_after(packet: &Packet, i: Idx, k: u64) {
    let Some(f) = packet.manifest.entries[i as usize].file() else {
        return;
    };
    let csize = chunk_size(f);
    let next = (k + 1) * csize;
    if next < f.size {
        let at = packet.content_offset(i as usize) + next;
        crate::sys::will_need(packet.file(), at, csize.min(f.size - next));
    }
}

/// The size of the chunks a mount verifies file `f` in.
fn chunk_size(f: &crate::packet::manifest::FileMeta) -> u64 {
    if f.chunks.is_empty() {
        f.size.max(1)
    } else {
        CHUNK_SIZE
    }
}
