//! Reading lower content: lazily verified, chunk by chunk.
//!
//! Each lower file is a run of chunks (4 MiB, or the whole file when it has
//! no `chunks`); one bit per chunk records that it was hashed and matched
//! the manifest. The first read touching a chunk reads and hashes all of it
//! (serving the request from the same buffer); later reads go straight to
//! the packet file. A reader moving forward through a chunked file gets the
//! next chunk verified on another thread while it reads this one.
//!
//! The bits hold for the packet file as it was when the mount opened it:
//! its size, mtime and ctime (its identity). When those move, the bits
//! are forgotten and never set again: from then on every read hashes the
//! chunks it serves. A `chmod`, a hard link, a rename or an unlink of the
//! packet moves its ctime and nothing else (the daemon holds the file
//! open, so its bytes stay), and the mount goes on serving, more slowly;
//! a write is caught by the hashes. The identity cannot vouch for the bytes
//! once somebody has written the file: a long `write` moves the times
//! once, at its start, then copies for as long as it takes, and stores
//! through a shared mapping move them only at a page's first store after
//! writeback, so a chunk hashed after the change shows may still change
//! without the identity moving again.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{Error, Result};
use super::index::Idx;
use sha2::Digest as _;

use crate::packet::backing::Stamp;
use crate::packet::digest::Sha256;
use crate::packet::format::CHUNK_SIZE;
use crate::packet::manifest::{EntryKind, FileMeta, Manifest};
use crate::packet::reader::Packet;

/// What identifies the packet file's content (see [`Stamp`]).
type Identity = Stamp;

fn identity(p: &Packet) -> std::io::Result<Identity> {
    p.backing().stamp(p.len())
}

/// The identity the verified bits hold for, and how many times they were
/// forgotten (a reader that saw another epoch trusts none of its reads).
#[derive(Clone, Copy, Debug)]
struct Trusted {
    identity: Identity,
    epoch: u64,
}

/// What a reader saw of [`Trusted`] when it began.
#[derive(Clone, Copy, Debug)]
struct Seen {
    epoch: u64,
    /// The packet is as the mount opened it: chunks verified now may be
    /// marked (see the module's text for why never after a change).
    may_mark: bool,
}

/// Times a read starts over when the packet changes under it, before it
/// fails with [`Error::PacketChanged`].
const READ_TRIES: usize = 3;

/// Verified-chunk bitmap and counters.
pub struct Verifier {
    /// First bit of each entry (files only).
    base: Vec<u64>,
    bits: Vec<AtomicU64>,
    /// The packet file's identity the bits hold for: at open, then as
    /// [`Self::refresh`] finds it moved (forgetting the bits), or as a
    /// rename of this daemon's own seal over the packet's path leaves it
    /// (see [`Self::around_own_rename`]). Written while bits are forgotten,
    /// read while one is marked.
    trusted: parking_lot::RwLock<Trusted>,
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
    /// Chunks read (by a read or a copy-up) since the mount opened this
    /// packet, one bit each as in `bits`...
    touched: Vec<AtomicU64>,
    /// ...and in the order first read (at most [`TRACE_MAX`]): the turn's
    /// trace (see `crate::packet::trace`).
    order: parking_lot::Mutex<Vec<(Idx, u32)>>,
}

/// Chunks a trace holds at most (a few MiB of JSON).
pub const TRACE_MAX: usize = 200_000;

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
        let touched = (0..total.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(Verifier {
            base,
            bits,
            touched,
            order: parking_lot::Mutex::new(Vec::new()),
            trusted: parking_lot::RwLock::new(Trusted {
                identity: identity(packet)?,
                epoch: 0,
            }),
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
    /// (see `crate::output::Committed::is`), as its stat at open shows.
    pub fn opened_as(&self, packet: &Packet, committed: &crate::output::Committed) -> bool {
        let Some(file) = packet.backing().local() else {
            return false;
        };
        file.metadata()
            .is_ok_and(|m| committed.is(&m) && Stamp::of(&m) == self.trusted.read().identity)
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

    /// The bits as they hold for the packet file now: forgotten for good
    /// if its size, mtime or ctime moved since the last look.
    fn refresh(&self, packet: &Packet) -> Result<Seen> {
        let now = identity(packet).map_err(|e| Error::packet_io(packet, e))?;
        let seen = |t: &Trusted| Seen {
            epoch: t.epoch,
            may_mark: t.epoch == 0,
        };
        {
            let t = self.trusted.read();
            if t.identity == now {
                return Ok(seen(&t));
            }
        }
        let mut t = self.trusted.write();
        if t.identity != now {
            self.forget(packet, &mut t, now);
        }
        Ok(seen(&t))
    }

    /// Forgets every verified chunk for good and takes the file's identity
    /// now as the one to compare with (see the module's text).
    fn forget(&self, packet: &Packet, t: &mut Trusted, now: Identity) {
        tracing::warn!(
            packet = %packet.path().display(),
            "the packet file's size, times or links changed while mounted; every read of its \
             content is hashed from now on (a remount makes reads fast again)"
        );
        for w in &self.bits {
            w.store(0, Ordering::Release);
        }
        t.identity = now;
        t.epoch += 1;
    }

    /// Whether the packet file is still as it was when `seen`: bytes read
    /// since without hashing them were verified in it.
    fn still(&self, packet: &Packet, seen: Seen) -> Result<bool> {
        let now = identity(packet).map_err(|e| Error::packet_io(packet, e))?;
        let t = self.trusted.read();
        Ok(t.identity == now && t.epoch == seen.epoch)
    }

    /// For a seal, before it copies lower content: the bits as they hold
    /// now (forgotten if the file moved); pass the result to [`Self::check_still`]
    /// after the copy.
    pub fn settle(&self, packet: &Packet) -> Result<u64> {
        Ok(self.refresh(packet)?.epoch)
    }

    /// After a seal's copy begun at `epoch` (from [`Self::settle`]): fails
    /// with [`Error::PacketChanged`] if the packet file moved meanwhile,
    /// since chunks verified earlier were copied without hashing them.
    pub fn check_still(&self, packet: &Packet, epoch: u64) -> Result<()> {
        let seen = Seen {
            epoch,
            may_mark: false,
        };
        if self.still(packet, seen)? {
            return Ok(());
        }
        Err(Error::PacketChanged {
            packet: crate::packet::path::shown_path(packet.path()),
        })
    }

    /// Runs `rename`, a seal's commit of a packet over the path of this
    /// one (`seal -o SERVED --rebase`), with reads of the packet held back
    /// meanwhile: the rename moves this file's ctime (its link count
    /// drops), which is then taken as its new identity if its size and
    /// mtime are unchanged, so that the mount goes on serving it, and
    /// moving onto the new packet, instead of taking the rename for a
    /// change and failing every read.
    pub fn around_own_rename<R>(&self, packet: &Packet, rename: impl FnOnce() -> R) -> R {
        let mut t = self.trusted.write();
        // A change before the rename is not the rename's: forgotten as
        // any change is, before the rename's own move is taken for one.
        if let Ok(now) = identity(packet)
            && now != t.identity
        {
            self.forget(packet, &mut t, now);
        }
        let r = rename();
        if let Ok(now) = identity(packet)
            && (now.len, now.mtime) == (t.identity.len, t.identity.mtime)
        {
            t.identity = now;
        }
        r
    }

    /// Records the chunks of lower file `i` (metadata `f`) that a read of
    /// `len` bytes at `offset` touches, the first time each is touched.
    fn touch(&self, i: Idx, f: &FileMeta, offset: u64, len: u64) {
        let csize = chunk_size(f);
        let end = f.size.min(offset.saturating_add(len));
        for k in offset / csize..end.div_ceil(csize) {
            let bit = self.base[i as usize] + k;
            let mask = 1 << (bit % 64);
            let word = &self.touched[(bit / 64) as usize];
            if word.load(Ordering::Relaxed) & mask == 0
                && word.fetch_or(mask, Ordering::AcqRel) & mask == 0
            {
                let mut order = self.order.lock();
                if order.len() < TRACE_MAX {
                    order.push((i, k as u32));
                }
            }
        }
    }

    /// The chunks read so far, in the order first read: `(entry, chunk)`.
    pub fn touched(&self) -> Vec<(Idx, u32)> {
        self.order.lock().clone()
    }

    fn is_verified(&self, bit: u64) -> bool {
        self.bits[(bit / 64) as usize].load(Ordering::Acquire) & (1 << (bit % 64)) != 0
    }

    fn mark(&self, bit: u64) {
        self.bits[(bit / 64) as usize].fetch_or(1 << (bit % 64), Ordering::AcqRel);
    }

    /// Marks `bit` verified by a read that began as `seen`, if the bits
    /// were not forgotten since and the read may mark (see [`Seen`]).
    fn mark_seen(&self, bit: u64, seen: Seen) {
        let t = self.trusted.read();
        if seen.may_mark && t.epoch == seen.epoch {
            self.mark(bit);
        }
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
    /// with a wrong whole hash, and a packet holding it is invalid. (A
    /// `/2` packet has no such hash: always.)
    pub fn whole_checked(&self, packet: &Packet, i: Idx) -> bool {
        match packet.manifest.entries[i as usize].file() {
            Some(f) if !f.chunks.is_empty() && packet.manifest.version.whole_file_hash(f.size) => {
                self.is_verified(self.base[i as usize] + chunks_of(f.size, true))
            }
            _ => true,
        }
    }

    /// Records that entry `i`'s whole-file hash was checked against its
    /// content (by a seal that copied it, begun at `epoch`: see
    /// [`Self::settle`]), unless the bits were forgotten since.
    pub fn mark_whole(&self, packet: &Packet, i: Idx, epoch: u64) {
        if let Some(f) = packet.manifest.entries[i as usize].file()
            && !f.chunks.is_empty()
        {
            let seen = Seen {
                epoch,
                may_mark: true,
            };
            self.mark_seen(self.base[i as usize] + chunks_of(f.size, true), seen);
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
        self.touch(i, f, offset, len);
        let kept = out.len();
        for _ in 0..READ_TRIES {
            let seen = self.refresh(packet)?;
            // Bytes of chunks verified earlier are read without hashing:
            // the packet is checked again after reading them, so that a
            // write to it that landed between the first check and the read
            // is caught (a write moves the file's times before it copies
            // its bytes); the read then starts over, hashing every chunk.
            if !self.read_once(packet, i, f, (offset, len), out, seen)?
                || self.still(packet, seen)?
            {
                return Ok(());
            }
            out.truncate(kept);
        }
        tracing::error!(packet = %packet.path().display(), "the packet file keeps changing while it is read");
        Err(Error::PacketChanged {
            packet: crate::packet::path::shown_path(packet.path()),
        })
    }

    /// One try of [`Self::read`] of lower file `i` (whose metadata is `f`),
    /// as the bits stood when `seen`; returns
    /// whether it read bytes of chunks verified earlier, without hashing
    /// them.
    fn read_once(
        &self,
        packet: &Packet,
        i: Idx,
        f: &FileMeta,
        (offset, len): (u64, u64),
        out: &mut Vec<u8>,
        seen: Seen,
    ) -> Result<bool> {
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
                if let Err(err) = self.verify(packet, i, k, (pos, take_end), out, seen) {
                    if let Error::Corrupt { path, start, end } = &err {
                        tracing::error!(%path, start, end, "lower content does not match the manifest; failing the read");
                    }
                    return Err(err);
                }
            }
            pos = take_end;
        }
        Ok(trusted)
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
        if self.is_verified(bit) {
            return;
        }
        // Nothing is marked after a change: hashing ahead would be lost.
        let Some(seen) = self.refresh(packet).ok().filter(|seen| seen.may_mark) else {
            return;
        };
        prefetch_after(packet, i, k);
        if let Err(e) = self.verify(packet, i, k, (0, 0), &mut Vec::new(), seen) {
            tracing::debug!(entry = i, chunk = k, error = %e, "verifying ahead failed; left to the reader");
        }
    }

    /// Reads and hashes chunk `k` of lower file `i`, appending the bytes of
    /// `want` (a range of file offsets inside the chunk) to `out` on the
    /// way, and marks the chunk verified if it matches the manifest (and the
    /// read began as `seen` allows, see [`Self::mark_seen`]). On any
    /// failure `out` is left as it was. The caller holds the chunk's stripe.
    fn verify(
        &self,
        packet: &Packet,
        i: Idx,
        k: u64,
        (pos, take_end): (u64, u64),
        out: &mut Vec<u8>,
        seen: Seen,
    ) -> Result<()> {
        let e = &packet.manifest.entries[i as usize];
        let f = e.file().ok_or(Error::IsDir)?;
        let csize = chunk_size(f);
        let cstart = k * csize;
        let cend = (cstart + csize).min(f.size);
        let base = packet.content_offset(i as usize);
        if packet.backing().verifies_content() {
            // A remote packet: its spool's units are these chunks (a small
            // file, or one chunk of a larger one), and each was hashed
            // against the manifest before it reached the spool, which
            // nothing else writes. So they are not hashed a second time.
            packet
                .backing()
                .fill(base + cstart..base + cend)
                .map_err(|e| Error::packet_io(packet, e))?;
            if pos < take_end {
                let at = out.len();
                out.resize(at + (take_end - pos) as usize, 0);
                if let Err(e) = packet.read_content_at(i as usize, pos, &mut out[at..]) {
                    out.truncate(at);
                    return Err(Error::packet_io(packet, e));
                }
            }
            self.mark_seen(self.base[i as usize] + k, seen);
            self.chunks.fetch_add(1, Ordering::Relaxed);
            // (Verified bytes, as `status` counts them: the spool hashed them.)
            self.hashed.fetch_add(cend - cstart, Ordering::Relaxed);
            return Ok(());
        }
        // A large chunk is asked for in pieces, all at once (the disk serves
        // several requests sooner than one large one), and hashed piece by
        // piece as they arrive.
        let len = cend - cstart;
        if len > VERIFY_PIECE {
            let mut at = 0;
            while at < len {
                let n = VERIFY_PIECE.min(len - at);
                packet
                    .backing()
                    .will_need(base + cstart + at..base + cstart + at + n);
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
        self.mark_seen(self.base[i as usize] + k, seen);
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
        packet
            .backing()
            .will_need(at..at + csize.min(f.size - next));
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
