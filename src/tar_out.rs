//! `unpack --tar`: one part of a packet (or the whole packet) as a
//! `.`-rooted tar stream, every byte verified before it is written.
//!
//! The stream is what tar extractors that trust nothing take: a root
//! directory member `./`, then every entry beneath the root as
//! `./<path>` (directories with a trailing `/`, as GNU tar and Python
//! write them), in the packet's order (parents first), regular files,
//! directories and symlinks only, owner 0, modes 0644/0755 (0755 for
//! executables and directories), each file's mtime (its nanoseconds in a
//! PAX `mtime` record when the second is not whole), names and targets
//! longer than ustar holds in PAX `path` and `linkpath` records.
//!
//! Verified as it is written: the packet is read in order through the
//! strict reader ([`Packet::check_batch`]), and no byte of a file leaves
//! before the manifest's hash for it held: a file of one chunk (4 MiB)
//! or less is held until the whole file verified; a larger one is let out
//! a chunk at a time, each checked against its chunk hash here, the last
//! one held until the whole-file hash (which the chunks do not prove)
//! verified too. Memory: about two chunks.
//!
//! A tampered packet never gives a valid-looking end. The end-of-archive
//! blocks are written only after every member of the packet (the other
//! part's too) and the packet's own end marker verified. A failure
//! between members leaves the stream ending in a PAX header with no
//! member after it, which every tar reader refuses (GNU tar, bsdtar:
//! unexpected end of archive; Python: "missing or bad subsequent header"),
//! where a stream simply cut between members would read, to Python's
//! `tarfile`, as a complete archive. A failure inside a large file leaves
//! it cut short inside its content, which every reader refuses.

use std::io::Write;

use serde::Serialize;

use crate::packet::digest::{Digest, Sha256};
use crate::packet::format::{
    BLOCK, CHUNK_SIZE, END_BLOCKS, MODE_DIR, MODE_EXEC, MODE_FILE, MODE_SYMLINK, PAX_HEADER_NAME,
    USTAR_LINKNAME_LEN, USTAR_NAME_LEN,
};
use crate::packet::layout::{base_header, push_record, set_name, truncate_utf8, ustar_split};
use crate::packet::manifest::{Entry, EntryKind};
use crate::packet::path::Part;
use crate::packet::reader::{Event, Packet, Source};
use crate::packet::{self};
use crate::restore::{Error, rel};

/// What to write.
pub struct TarOptions {
    /// Only this part, as the stream's root.
    pub part: Option<Part>,
    /// Refuse symlinks that resolve outside the part (or the packet).
    pub strict_symlinks: bool,
    /// Expected digest.
    pub digest: Option<Digest>,
    /// Where the stream goes, for messages (`-` for stdout).
    pub shown: String,
}

/// What was written.
#[derive(Debug, Serialize)]
pub struct TarOutcome {
    /// Packet digest.
    pub digest: Digest,
    /// Entries written (the root `./` included).
    pub entries: u64,
    /// Files written.
    pub files: u64,
    /// Bytes of content written.
    pub content_bytes: u64,
    /// Bytes of the whole stream.
    pub tar_bytes: u64,
}

/// The PAX comment of the header that ends a stream cut short by a
/// refusal (see the module's doc): readers that show it say why.
const ABORTED: &[u8] = b"sessionfs: the packet was refused while this stream was written; \
the stream is incomplete and must not be used";

/// Writes `packet` per `opts` to `out` as a tar stream. On error the
/// stream has no end-of-archive blocks and ends where no reader takes it
/// for complete (see the module's doc).
pub fn write_tar<B: Source + Sync>(
    packet: &Packet<B>,
    opts: &TarOptions,
    out: &mut dyn Write,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<TarOutcome, Error> {
    let root = crate::restore::preflight(
        packet,
        opts.digest.as_ref(),
        opts.part,
        opts.strict_symlinks,
    )?;
    let mut w = TarWriter {
        out,
        shown: &opts.shown,
        written: 0,
        midway: false,
        outcome: TarOutcome {
            digest: packet.digest,
            entries: 0,
            files: 0,
            content_bytes: 0,
            tar_bytes: 0,
        },
    };
    let streamed = stream(packet, root, &mut w, progress);
    if let Err(e) = streamed {
        w.abort();
        return Err(e);
    }
    w.outcome.tar_bytes = w.written;
    Ok(w.outcome)
}

/// The members in order, then the end: the body of [`write_tar`].
fn stream<B: Source + Sync>(
    packet: &Packet<B>,
    root: &str,
    w: &mut TarWriter<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), Error> {
    w.member(&headers(".", &EntryKind::Dir))?;
    let entries = &packet.manifest.entries;
    let mut held = Held::default();
    let mut buf = Vec::new();
    for range in packet.batches() {
        let mut failure: Option<Error> = None;
        let mut sink = |ev: Event<'_>| -> packet::Result<()> {
            let result = match ev {
                Event::Data(i, bytes) => held.data(w, &entries[i], root, bytes, progress),
                Event::Verified(i) => held.verified(w, &entries[i], root),
            };
            // The packet layer gets a marker; the error itself is kept.
            result.map_err(|e| {
                let marker = packet::Error::io("tar", std::io::Error::other(e.to_string()));
                failure = Some(e);
                marker
            })
        };
        let checked = packet.check_batch(range, &mut buf, &mut sink);
        match (checked, failure) {
            (_, Some(e)) => return Err(e),
            (Err(e), None) => return Err(e.into()),
            (Ok(()), None) => {}
        }
    }
    packet.check_end()?;
    w.write(&[0u8; (END_BLOCKS * BLOCK) as usize])?;
    w.flush()
}

/// The content of the file being written that is not out yet, and the
/// number of its chunks already out.
#[derive(Default)]
struct Held {
    bytes: Vec<u8>,
    chunks_out: usize,
}

impl Held {
    /// The next bytes of entry `e`'s content, not yet verified: held,
    /// and let out a chunk at a time once that chunk's hash holds (but the
    /// last chunk, which waits for [`Held::verified`]).
    fn data(
        &mut self,
        w: &mut TarWriter<'_>,
        e: &Entry,
        root: &str,
        mut bytes: &[u8],
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        let (Some(rel), EntryKind::File(f)) = (rel(root, &e.path), &e.kind) else {
            return Ok(());
        };
        progress(bytes.len() as u64);
        if f.chunks.is_empty() {
            self.bytes.extend_from_slice(bytes);
            return Ok(());
        }
        while !bytes.is_empty() {
            let take = bytes.len().min(CHUNK_SIZE as usize - self.bytes.len());
            self.bytes.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            let last = self.chunks_out + 1 == f.chunks.len();
            if self.bytes.len() as u64 == CHUNK_SIZE && !last {
                let k = self.chunks_out;
                if Sha256::of(&self.bytes) != f.chunks[k] {
                    let start = k as u64 * CHUNK_SIZE;
                    return Err(Error::Packet(packet::Error::ContentMismatch {
                        path: e.path.to_string(),
                        start,
                        end: start + CHUNK_SIZE,
                    }));
                }
                if k == 0 {
                    w.member(&headers(rel, &e.kind))?;
                }
                w.midway = true;
                w.write(&self.bytes)?;
                self.bytes.clear();
                self.chunks_out += 1;
            }
        }
        Ok(())
    }

    /// Entry `e` verified whole: out with what is held of it.
    fn verified(&mut self, w: &mut TarWriter<'_>, e: &Entry, root: &str) -> Result<(), Error> {
        let Some(rel) = rel(root, &e.path) else {
            return Ok(());
        };
        if rel.is_empty() {
            return Ok(()); // the root, written first as `./`
        }
        if self.chunks_out == 0 {
            w.member(&headers(rel, &e.kind))?;
        }
        if let EntryKind::File(f) = &e.kind {
            w.write(&self.bytes)?;
            let pad = f.size.next_multiple_of(BLOCK) - f.size;
            w.write(&[0u8; BLOCK as usize][..pad as usize])?;
            w.outcome.files += 1;
            w.outcome.content_bytes += f.size;
        }
        w.midway = false;
        self.bytes.clear();
        self.chunks_out = 0;
        Ok(())
    }
}

/// The stream, and what went into it.
struct TarWriter<'a> {
    out: &'a mut dyn Write,
    shown: &'a str,
    /// Bytes written.
    written: u64,
    /// Inside a member's content: a failure now leaves it cut short.
    midway: bool,
    outcome: TarOutcome,
}

impl TarWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.out.write_all(bytes).map_err(|source| Error::Io {
            path: self.shown.to_owned(),
            op: "cannot write the tar stream",
            source,
        })?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// A member's header blocks (PAX records included).
    fn member(&mut self, headers: &[u8]) -> Result<(), Error> {
        self.outcome.entries += 1;
        self.write(headers)
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.out.flush().map_err(|source| Error::Io {
            path: self.shown.to_owned(),
            op: "cannot write the tar stream",
            source,
        })
    }

    /// Ends a stream cut short so that no reader takes it for complete:
    /// between members, with a PAX header followed by a header block whose
    /// checksum cannot hold; inside a member's content, as it is. Best
    /// effort: the stream may be the reason it is cut short.
    fn abort(&mut self) {
        if !self.midway {
            let _ = self.write(&aborted());
        }
        let _ = self.flush();
    }
}

/// What ends a stream refused between members. Each reader takes a stream
/// that simply stops there for complete (Python's `tarfile` even takes a
/// damaged header there for the end), and refuses this: a PAX header (its
/// comment says why), then a header block whose checksum is wrong. Python:
/// `ReadError` (the PAX header's member is bad); GNU tar: "Skipping to next
/// header", exit 2; bsdtar: "Damaged tar archive", exit 1 (all tested).
fn aborted() -> Vec<u8> {
    let mut records = Vec::new();
    push_record(&mut records, "comment", ABORTED);
    let mut out = pax_header(&records);
    let mut h = base_header(tar::EntryType::Regular, MODE_FILE, 0, 0);
    set_name(&mut h, b"sessionfs-stream-aborted", b"");
    h.set_cksum();
    // The sum of the other bytes is far below 0o7777777: one more never holds.
    let wrong = h.cksum().map_or(1, |c| c + 1);
    let digits = format!("{wrong:07o}\0");
    if let Some(u) = h.as_ustar_mut() {
        u.cksum.copy_from_slice(digits.as_bytes());
    }
    out.extend_from_slice(h.as_bytes());
    out
}

/// A PAX extended header member (its header block and records).
fn pax_header(records: &[u8]) -> Vec<u8> {
    let mut pax = base_header(tar::EntryType::XHeader, MODE_FILE, records.len() as u64, 0);
    set_name(&mut pax, PAX_HEADER_NAME.as_bytes(), b"");
    pax.set_cksum();
    let mut out = pax.as_bytes().to_vec();
    out.extend_from_slice(records);
    out.resize(out.len().next_multiple_of(BLOCK as usize), 0);
    out
}

/// The header blocks of the member for `rel` (`.` for the root), of kind
/// `kind`: `./rel`, a directory's with a trailing `/`.
fn headers(rel: &str, kind: &EntryKind) -> Vec<u8> {
    let mut name = if rel == "." {
        String::from(".")
    } else {
        format!("./{rel}")
    };
    if matches!(kind, EntryKind::Dir) {
        name.push('/');
    }
    let name = name.as_bytes();
    let split = ustar_split(name);
    let mut records = Vec::new();
    if split.is_none() {
        push_record(&mut records, "path", name);
    }
    if let EntryKind::Symlink(t) = kind
        && t.len() > USTAR_LINKNAME_LEN
    {
        push_record(&mut records, "linkpath", t.as_bytes());
    }
    let (ty, mode, size, mtime) = match kind {
        EntryKind::Dir => (tar::EntryType::Directory, MODE_DIR, 0, 0),
        EntryKind::File(f) => {
            let (secs, nanos) = (f.mtime_ns / 1_000_000_000, f.mtime_ns % 1_000_000_000);
            if nanos != 0 {
                let exact = format!("{secs}.{nanos:09}");
                push_record(&mut records, "mtime", exact.as_bytes());
            }
            let mode = if f.executable { MODE_EXEC } else { MODE_FILE };
            (tar::EntryType::Regular, mode, f.size, secs)
        }
        EntryKind::Symlink(_) => (tar::EntryType::Symlink, MODE_SYMLINK, 0, 0),
    };
    let mut out = if records.is_empty() {
        Vec::new()
    } else {
        pax_header(&records)
    };
    let mut h = base_header(ty, mode, size, mtime);
    match split {
        Some((prefix, name)) => set_name(&mut h, name, prefix),
        None => set_name(&mut h, truncate_utf8(name, USTAR_NAME_LEN), b""),
    }
    if let EntryKind::Symlink(t) = kind {
        let t = truncate_utf8(t.as_bytes(), USTAR_LINKNAME_LEN);
        if let Some(u) = h.as_ustar_mut() {
            u.linkname[..t.len()].copy_from_slice(t);
        }
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out
}
