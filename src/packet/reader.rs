//! The strict reader: opens a packet, checks its manifest member in time
//! proportional to the manifest, and checks members' bytes on demand.
//!
//! Opening reads only the first header and `packet.json`. Everything else
//! about the file is implied by the manifest (see [`super::layout`]), so the
//! full check ([`Packet::check_batch`]) compares each member's bytes with the
//! bytes the manifest implies instead of trusting any header field.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::backing::Backing;
use super::digest::{ContentHasher, Digest, Sha256};
use super::error::{Error, LimitKind, Result};
use super::format::{BLOCK, CHUNK_SIZE, END_BLOCKS, Limits, MANIFEST_NAME, pad_to_block};
use super::layout::{self, Layout, MANIFEST_DATA_OFFSET};
use super::manifest::{Entry, EntryKind, Manifest};

/// The manifest member of a packet, read but not parsed.
pub struct RawManifest {
    /// The exact bytes of `packet.json`.
    pub bytes: Vec<u8>,
    /// `sha256:` of those bytes.
    pub digest: Digest,
    /// Length of the packet file.
    pub file_len: u64,
}

/// Where the manifest is read from: a local packet file, or a remote
/// object of the store layer.
pub trait Source {
    /// The length of the packet.
    fn source_len(&self) -> Result<u64>;
    /// Fills `buf` from `offset`; `file_len` is the length first seen.
    fn read_at(&self, buf: &mut [u8], offset: u64, file_len: u64) -> Result<()>;
}

impl Source for File {
    fn source_len(&self) -> Result<u64> {
        Ok(self
            .metadata()
            .map_err(|e| Error::io("cannot stat the packet", e))?
            .len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64, file_len: u64) -> Result<()> {
        read_exact_at(self, buf, offset, file_len)
    }
}

impl Source for Box<dyn crate::store::ReadAt> {
    fn source_len(&self) -> Result<u64> {
        (**self).source_len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64, file_len: u64) -> Result<()> {
        (**self).read_at(buf, offset, file_len)
    }
}

impl Source for dyn crate::store::ReadAt + '_ {
    fn source_len(&self) -> Result<u64> {
        Ok(self.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64, _file_len: u64) -> Result<()> {
        Ok(self.read_exact_at(buf, offset, self.deadline())?)
    }
}

/// Reads the first member of `file` (see [`read_manifest_bytes`]) and
/// computes its digest.
pub fn read_raw_manifest<S: Source + ?Sized>(file: &S, limits: &Limits) -> Result<RawManifest> {
    let mut raw = read_manifest_bytes(file, limits)?;
    raw.digest = Digest::of_manifest(&raw.bytes);
    Ok(raw)
}

/// The manifest is read in pieces of at most this many bytes (see
/// [`read_manifest_bytes`]): one request for any manifest of a few
/// thousand entries, a few for the largest.
const MANIFEST_PIECE: u64 = 16 << 20;

/// Reads the first member of `file`, which must be the canonical header of
/// `packet.json`, and returns the manifest bytes (the digest is left for
/// the caller). Allocates only after the size field is checked against the
/// file length and the manifest bound.
pub fn read_manifest_bytes<S: Source + ?Sized>(file: &S, limits: &Limits) -> Result<RawManifest> {
    let file_len = file.source_len()?;
    let mut first = [0u8; BLOCK as usize];
    if file_len < BLOCK {
        return Err(Error::NotAPacket {
            reason: format!("the file is {file_len} bytes, shorter than one tar block"),
        });
    }
    file.read_at(&mut first, 0, file_len)?;
    let header = tar::Header::from_byte_slice(&first);
    if first.iter().all(|&b| b == 0) || header.as_ustar().is_none() {
        return Err(Error::NotAPacket {
            reason: "the first block is not a ustar header".into(),
        });
    }
    let name = header.path_bytes();
    if &*name != MANIFEST_NAME.as_bytes() {
        return Err(Error::ManifestMissing {
            found: super::path::shown(&name),
        });
    }
    let size = header.entry_size().map_err(|_| Error::NonCanonicalHeader {
        offset: 0,
        member: MANIFEST_NAME.into(),
        field: "size",
    })?;
    if size > limits.max_manifest_bytes() {
        return Err(LimitKind::ManifestBytes.exceeded(size, limits, None));
    }
    let padded = pad_to_block(size);
    // The manifest member only: what follows it is the layout's to check
    // (`inspect` reports a length that does not match, `open` refuses it).
    let needed = MANIFEST_DATA_OFFSET + padded;
    if needed > file_len {
        return Err(Error::Truncated {
            expected: needed,
            actual: file_len,
        });
    }
    let expected = layout::manifest_header(size);
    if first != expected {
        return Err(layout::diagnose(&first, &expected, 0, MANIFEST_NAME));
    }
    // Bounded above by the manifest limit and the file length, and read
    // in pieces into a buffer that grows as they arrive: a source that
    // claims more than it gives (a server's length is its word) costs a
    // piece past what it gave, not the length it claimed.
    let mut bytes: Vec<u8> = Vec::new();
    let mut at = 0u64;
    while at < padded {
        let n = MANIFEST_PIECE.min(padded - at);
        let want = (at + n) as usize;
        // Exactly: a large buffer grows in place (`mremap`), and never past
        // what has come.
        bytes.reserve_exact(want - bytes.len());
        bytes.resize(want, 0);
        file.read_at(
            &mut bytes[at as usize..],
            MANIFEST_DATA_OFFSET + at,
            file_len,
        )?;
        at += n;
    }
    if bytes[size as usize..].iter().any(|&b| b != 0) {
        return Err(Error::BadPadding {
            member: MANIFEST_NAME.into(),
        });
    }
    bytes.truncate(size as usize);
    Ok(RawManifest {
        bytes,
        digest: Digest(Sha256::default()),
        file_len,
    })
}

fn read_exact_at(file: &File, buf: &mut [u8], offset: u64, file_len: u64) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            // Cut short since it was opened (its length was checked then):
            // the length it had, against the one it has now.
            Error::Truncated {
                expected: file_len.max(offset + buf.len() as u64),
                actual: file.metadata().map_or(offset, |m| m.len()),
            }
        } else {
            Error::io(format!("cannot read the packet at byte {offset}"), e)
        }
    })
}

/// An open packet whose manifest passed the strict checks and whose length
/// matches the layout. Content is checked by [`Packet::check_batch`] (all of
/// it, by `verify` and `unpack`) or lazily by a mount. Its bytes are a
/// [`Backing`] (a local file, or the spool of a remote object whose
/// content is read by a mount or a seal), or (`B = Box<dyn ReadAt>`) a
/// remote object of the store, read member by member.
pub struct Packet<B = Backing> {
    pub(super) file: B,
    pub(super) path: PathBuf,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Its digest.
    pub digest: Digest,
    /// Offsets of every member.
    pub layout: Layout,
    /// The parent directory of each entry, as indexes into the entries
    /// ([`NO_PARENT`](super::manifest::NO_PARENT) for a part root), found
    /// while validating; a mount's index takes it (leaving it empty).
    pub parents: Vec<u32>,
}

/// One piece of what [`Packet::check_batch`] reports to its sink.
pub enum Event<'a> {
    /// The next bytes of entry `.0`'s content, not yet known to be valid.
    Data(usize, &'a [u8]),
    /// Entry `.0` is complete and verified (header, content, padding).
    Verified(usize),
}

/// Members are checked in batches of about this many bytes: large enough to
/// amortize syscalls over many small files, small enough to spread work over
/// both cores and bound the buffer each thread holds.
pub const BATCH_BYTES: u64 = 1 << 20;

/// Opens the packet file at `path` for reading. Packets are read from
/// regular files: a FIFO is opened without waiting for a writer (a read
/// would block forever, or see a pipe's bytes and no length) and refused,
/// like a directory, a socket or a device, as an I/O error.
pub fn open_file(path: &Path) -> Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Error::io_at(path, "cannot open the packet", e))?;
    let t = file
        .metadata()
        .map_err(|e| Error::io_at(path, "cannot stat the packet", e))?
        .file_type();
    let what = if t.is_file() {
        // Reads block as usual from here (a FUSE-backed file may care).
        nix::fcntl::fcntl(
            &file,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )
        .map_err(|e| Error::io_at(path, "cannot open the packet", e.into()))?;
        return Ok(file);
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO or pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    // What was named is not something to read a packet from (as with a
    // missing file, an I/O error), rather than a file that is not one.
    let why = format!("it is {what}, not a regular file; write the packet to a file first");
    Err(Error::io_at(
        path,
        "cannot read the packet",
        io::Error::new(io::ErrorKind::InvalidInput, why),
    ))
}

impl Packet {
    /// Opens `path` and checks its manifest member and length.
    pub fn open(path: &Path, limits: &Limits) -> Result<Packet> {
        Packet::from_file(open_file(path)?, path, limits)
    }

    /// Like [`Packet::open`], for a file already open.
    pub fn from_file(file: File, path: &Path, limits: &Limits) -> Result<Packet> {
        let p = Packet::from_source(file, path, limits)?;
        Ok(Packet {
            file: Backing::File(p.file),
            path: p.path,
            manifest: p.manifest,
            digest: p.digest,
            layout: p.layout,
            parents: p.parents,
        })
    }

    /// Where its bytes are: every read of a mount or a seal goes through
    /// the backing's methods.
    pub fn backing(&self) -> &Backing {
        &self.file
    }

    /// Reads `buf.len()` bytes of entry `i`'s content at `offset` within the
    /// file, as a mount reads ([`Backing::read_at`]: a remote packet's
    /// bytes are fetched and verified first; a local one's are not checked
    /// here, callers verify chunks themselves).
    pub fn read_content_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.content_offset(i) + offset;
        self.file.read_at(buf, at)
    }
}

impl<B: Source> Packet<B> {
    /// Checks the manifest member and length of the packet whose bytes
    /// are `file`, named `path` in errors (a remote packet: its location
    /// as shown).
    pub fn from_source(file: B, path: &Path, limits: &Limits) -> Result<Packet<B>> {
        let t = std::time::Instant::now();
        let raw = read_manifest_bytes(&file, limits).map_err(|e| e.at_file(path))?;
        tracing::debug!(elapsed = ?t.elapsed(), bytes = raw.bytes.len(), "manifest read");
        // The digest and the parse are independent: one core each.
        let (digest, manifest) = rayon::join(
            || Digest::of_manifest(&raw.bytes),
            || Manifest::parse_tree(&raw.bytes, limits),
        );
        let (manifest, parents) = manifest?;
        tracing::debug!(elapsed = ?t.elapsed(), entries = manifest.entries.len(), "manifest hashed, parsed and validated");
        let layout = Layout::compute(&manifest, raw.bytes.len() as u64);
        let expected = layout.total_len();
        if raw.file_len < expected {
            return Err(Error::Truncated {
                expected,
                actual: raw.file_len,
            });
        }
        if raw.file_len > expected {
            return Err(Error::TrailingBytes {
                expected,
                actual: raw.file_len,
            });
        }
        Ok(Packet {
            file,
            path: path.to_owned(),
            manifest,
            digest,
            layout,
            parents,
        })
    }

    /// The ranges of content the manifest gives a SHA-256 for, in file
    /// order: each non-empty small file's content, each chunk of a larger
    /// one.
    pub fn units(&self) -> Vec<crate::store::spool::Unit> {
        let mut out = Vec::new();
        for (i, e) in self.manifest.entries.iter().enumerate() {
            let Some(f) = e.file().filter(|f| f.size > 0) else {
                continue;
            };
            let base = self.content_offset(i);
            let unit = |start: u64, len: u64, hash: &Sha256| crate::store::spool::Unit {
                start,
                len,
                hash: hash.0,
                group: i as u32,
            };
            if f.chunks.is_empty() {
                out.push(unit(base, f.size, &f.sha256));
            } else {
                for (k, h) in f.chunks.iter().enumerate() {
                    let at = k as u64 * CHUNK_SIZE;
                    out.push(unit(base + at, CHUNK_SIZE.min(f.size - at), h));
                }
            }
        }
        out
    }

    /// Fails unless the packet's digest is `expected`.
    pub fn check_digest(&self, expected: Option<&Digest>) -> Result<()> {
        match expected {
            Some(d) if *d != self.digest => Err(Error::DigestMismatch {
                expected: d.to_string(),
                found: self.digest.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the packet file.
    pub fn len(&self) -> u64 {
        self.layout.total_len()
    }

    /// Whether the packet has no entries (never true of a valid packet).
    pub fn is_empty(&self) -> bool {
        self.manifest.entries.is_empty()
    }

    /// Contiguous batches of entries for parallel checking.
    pub fn batches(&self) -> Vec<Range<usize>> {
        self.layout.batches(BATCH_BYTES)
    }

    /// Checks the members in `range` byte for byte: each header against its
    /// canonical encoding, content against the manifest's hashes, padding
    /// zero. Content goes to `sink` as it is read; `Verified(i)` follows once
    /// entry `i` is known good. Stops at the first problem.
    pub fn check_batch(
        &self,
        range: Range<usize>,
        buf: &mut Vec<u8>,
        sink: &mut dyn FnMut(Event<'_>) -> Result<()>,
    ) -> Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        let mut r = RangeReader {
            packet: self,
            pos: self.layout.member_start(range.start),
            end: self.layout.member_end(range.end - 1),
            buf,
            filled: 0..0,
        };
        let mut expected = Vec::with_capacity(BLOCK as usize);
        let mut actual = Vec::with_capacity(BLOCK as usize);
        for i in range {
            let e = &self.manifest.entries[i];
            let start = self.layout.member_start(i);
            expected.clear();
            layout::write_entry_headers(e, &mut expected);
            actual.clear();
            r.take_into(expected.len() as u64, &mut actual)?;
            if actual != expected {
                return Err(diagnose_blocks(&actual, &expected, start, &e.path));
            }
            if let EntryKind::File(f) = &e.kind {
                let mut hasher = ContentHasher::new(f.size, self.manifest.version);
                let mut left = f.size;
                while left > 0 {
                    let piece = r.take(left)?;
                    hasher.update(piece);
                    left -= piece.len() as u64;
                    sink(Event::Data(i, piece))?;
                }
                let mut pad = pad_to_block(f.size) - f.size;
                while pad > 0 {
                    let piece = r.take(pad)?;
                    if piece.iter().any(|&b| b != 0) {
                        return Err(Error::BadPadding {
                            member: e.path.to_string(),
                        });
                    }
                    pad -= piece.len() as u64;
                }
                let (whole, chunks) = hasher.finish();
                if whole != f.sha256 || *chunks != *f.chunks {
                    return Err(content_mismatch(e, &chunks));
                }
            }
            sink(Event::Verified(i))?;
        }
        Ok(())
    }

    /// Checks the end-of-archive marker.
    pub fn check_end(&self) -> Result<()> {
        let offset = self.layout.end_offset();
        let mut end = [0u8; (END_BLOCKS * BLOCK) as usize];
        self.file.read_at(&mut end, offset, self.len())?;
        if end.iter().any(|&b| b != 0) {
            return Err(Error::BadEndMarker { offset });
        }
        Ok(())
    }

    /// Where entry `i`'s content starts in the packet file.
    pub fn content_offset(&self, i: usize) -> u64 {
        self.layout.data_offset(i, &self.manifest.entries[i])
    }

    /// Hashes the whole file (for `file_sha256`), reading it in order.
    pub fn file_sha256(&self, progress: &dyn Fn(u64)) -> Result<Sha256> {
        hash_file(&self.file, self.len(), progress)
    }
}

/// SHA-256 of the first `len` bytes of `file`, read in order.
pub fn hash_file<S: Source + ?Sized>(file: &S, len: u64, progress: &dyn Fn(u64)) -> Result<Sha256> {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; BATCH_BYTES as usize];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(BATCH_BYTES) as usize;
        file.read_at(&mut buf[..n], pos, len)?;
        hasher.update(&buf[..n]);
        pos += n as u64;
        progress(n as u64);
    }
    Ok(Sha256(hasher.finalize().into()))
}

/// Names the first chunk whose hash differs, or the whole file.
fn content_mismatch(e: &Entry, chunks: &[Sha256]) -> Error {
    let size = e.size();
    let (start, end) = e
        .file()
        .and_then(|f| {
            f.chunks
                .iter()
                .zip(chunks)
                .position(|(a, b)| a != b)
                .map(|k| {
                    let s = k as u64 * CHUNK_SIZE;
                    (s, (s + CHUNK_SIZE).min(size))
                })
        })
        .unwrap_or((0, size));
    Error::ContentMismatch {
        path: e.path.to_string(),
        start,
        end,
    }
}

/// Diagnoses a header run (PAX header, records, ustar header) that differs
/// from the canonical bytes, block by block.
fn diagnose_blocks(actual: &[u8], expected: &[u8], start: u64, member: &str) -> Error {
    let b = BLOCK as usize;
    let mut k = 0;
    while k + b <= expected.len() {
        let (a, e) = (&actual[k..k + b], &expected[k..k + b]);
        if a != e {
            let is_pax_records = expected.len() > b && k != 0 && k + b != expected.len();
            if is_pax_records {
                // The records are as long as the PAX header (the first
                // block, equal here) says; the rest of their blocks is
                // padding, which must be zero.
                let records = tar::Header::from_byte_slice(&expected[..b])
                    .entry_size()
                    .map_or(usize::MAX, |n| n as usize);
                let first = (k..k + b).find(|&j| actual[j] != expected[j]).unwrap_or(k);
                if first - b >= records {
                    return Error::BadPadding {
                        member: member.into(),
                    };
                }
                return Error::NonCanonicalHeader {
                    offset: start + k as u64,
                    member: member.into(),
                    field: "pax records",
                };
            }
            return layout::diagnose(a, e, start + k as u64, member);
        }
        k += b;
    }
    layout::diagnose(actual, expected, start, member)
}

/// Sequential reader over a byte range of the packet, in windows of at
/// most [`BATCH_BYTES`].
struct RangeReader<'p, 'b, B> {
    packet: &'p Packet<B>,
    /// File offset of the next byte not yet in the buffer.
    pos: u64,
    /// End of the range.
    end: u64,
    buf: &'b mut Vec<u8>,
    /// Unconsumed part of `buf`.
    filled: Range<usize>,
}

impl<B: Source> RangeReader<'_, '_, B> {
    /// Up to `max` next bytes (at least one).
    fn take(&mut self, max: u64) -> Result<&[u8]> {
        if self.filled.is_empty() {
            let n = (self.end - self.pos).min(BATCH_BYTES) as usize;
            if n == 0 {
                return Err(Error::Truncated {
                    expected: self.end + 1,
                    actual: self.end,
                });
            }
            if self.buf.len() < n {
                self.buf.resize(n, 0);
            }
            self.packet
                .file
                .read_at(&mut self.buf[..n], self.pos, self.packet.len())?;
            self.pos += n as u64;
            self.filled = 0..n;
        }
        let n = (self.filled.len() as u64).min(max) as usize;
        let s = self.filled.start;
        self.filled.start += n;
        Ok(&self.buf[s..s + n])
    }

    /// Exactly `n` next bytes, appended to `out`.
    fn take_into(&mut self, mut n: u64, out: &mut Vec<u8>) -> Result<()> {
        while n > 0 {
            let piece = self.take(n)?;
            n -= piece.len() as u64;
            out.extend_from_slice(piece);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet cut short while it is read: the length it had when opened
    /// (checked against its layout then) against the one it has now.
    #[test]
    fn truncation_while_reading_names_both_lengths() {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &[7u8; 4096]).unwrap();
        f.set_len(1024).unwrap();
        let mut buf = [0u8; 512];
        match read_exact_at(&f, &mut buf, 2048, 4096) {
            Err(Error::Truncated { expected, actual }) => {
                assert_eq!((expected, actual), (4096, 1024));
            }
            other => panic!("{other:?}"),
        }
        read_exact_at(&f, &mut buf, 512, 4096).unwrap();
    }
}
