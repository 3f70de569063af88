//! Writing packet files: positional writes into a pre-sized temporary file
//! beside the destination, then fsync, rename and directory fsync, so the
//! destination holds either nothing new or the complete packet.
//!
//! Two writers. `pack` ([`write_members`]) learns the hashes as it writes:
//! because a packet's layout is known from the manifest's length alone
//! (hashes are fixed-width), it sizes the file first and fills members in
//! parallel, in any order; the manifest, which needs every hash, goes last,
//! and the whole file is read back for `file_sha256`. `seal`
//! ([`write_in_order`]) knows every hash before it writes, so it writes the
//! file once, in order, hashing it as it goes (see [`in_order`]).
//! Padding and the end marker are the zeros of the freshly sized file.
//!
//! Writes are buffered. `O_DIRECT` was measured (docs/benchmarks.md): it
//! makes the writes themselves cheaper on the benchmark machine, but every
//! write then waits for the device, and the whole-file hash must read the
//! packet back from disk instead of the page cache; pack got slower.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::packet::digest::{ContentHasher, Digest, Sha256};
use crate::packet::error::{Error, Result};
use crate::packet::format::BLOCK;
use crate::packet::layout::{Layout, MANIFEST_DATA_OFFSET, manifest_header};
use crate::packet::manifest::Manifest;

pub mod in_order;
pub use in_order::{hash_new, write_in_order};

/// Size of the pieces read back when hashing the finished file.
const HASH_PIECE: usize = 4 << 20;

/// A packet being written: a temporary file in the destination's directory.
pub struct Output {
    tmp: tempfile::NamedTempFile,
    dest: PathBuf,
}

impl Output {
    /// Creates the temporary file (`.<name>.<random>.tmp`, mode 0600).
    pub fn create(dest: &Path) -> Result<Output> {
        let dir = parent_dir(dest);
        let name = dest
            .file_name()
            .ok_or_else(|| {
                Error::io(
                    format!("{}: not a file name", dest.display()),
                    io::Error::from(io::ErrorKind::InvalidInput),
                )
            })?
            .to_string_lossy();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(|e| {
                Error::io(
                    format!("cannot create a temporary file in {}", dir.display()),
                    e,
                )
            })?;
        Ok(Output {
            tmp,
            dest: dest.to_owned(),
        })
    }

    /// The temporary file (buffered handle).
    pub fn file(&self) -> &File {
        self.tmp.as_file()
    }

    /// `(dev, ino)` of the temporary file, so a walk can skip it.
    pub fn identity(&self) -> Result<(u64, u64)> {
        let m = self
            .file()
            .metadata()
            .map_err(|e| Error::io("cannot stat the temporary file", e))?;
        Ok((m.dev(), m.ino()))
    }

    /// Sizes the file for `layout` (zeros everywhere until written) and
    /// reserves its blocks, so a full disk fails here rather than midway.
    pub fn size_for(&self, layout: &Layout) -> Result<()> {
        let len = layout.total_len();
        self.file()
            .set_len(len)
            .map_err(|e| Error::io("cannot size the output file", e))?;
        crate::sys::reserve(self.file(), len)
            .map_err(|e| Error::io(format!("cannot reserve {len} bytes for the output"), e))
    }

    /// Writes whole blocks at a block-aligned `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        debug_assert!(offset % BLOCK == 0 && bytes.len() as u64 % BLOCK == 0);
        self.file()
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io(format!("cannot write the output at byte {offset}"), e))
    }

    /// Writes the manifest member (header and JSON) and returns the digest.
    /// `expected_len` is the length the layout was computed for.
    pub fn write_manifest(&self, manifest: &Manifest, expected_len: u64) -> Result<Digest> {
        let bytes = manifest.encode();
        if bytes.len() as u64 != expected_len {
            // A bug, not bad input: the layout would be wrong.
            return Err(Error::io(
                format!(
                    "manifest is {} bytes, the layout was computed for {expected_len}",
                    bytes.len()
                ),
                io::Error::other("internal error"),
            ));
        }
        let mut buf = Vec::with_capacity(MANIFEST_DATA_OFFSET as usize + bytes.len() + 512);
        buf.extend_from_slice(&manifest_header(expected_len));
        buf.extend_from_slice(&bytes);
        buf.resize(buf.len().next_multiple_of(BLOCK as usize), 0);
        self.write_at(&buf, 0)?;
        Ok(Digest::of_manifest(&bytes))
    }

    /// SHA-256 of the first `len` bytes as written, read back in order (a
    /// reader thread and the hashing thread overlap), and the data synced.
    pub fn hash_and_sync(&self, len: u64) -> Result<Sha256> {
        use sha2::Digest as _;
        let reader = self.file();
        let (full_tx, full_rx) = mpsc::sync_channel::<(Vec<u8>, usize)>(2);
        let (empty_tx, empty_rx) = mpsc::sync_channel::<Vec<u8>>(3);
        for _ in 0..3 {
            let _ = empty_tx.send(vec![0u8; HASH_PIECE]);
        }
        let (hash, read, synced) = std::thread::scope(|s| {
            let read = s.spawn(move || -> io::Result<()> {
                let mut pos = 0;
                while pos < len {
                    let Ok(mut buf) = empty_rx.recv() else { break };
                    let n = (len - pos).min(HASH_PIECE as u64) as usize;
                    reader.read_exact_at(&mut buf[..n], pos)?;
                    pos += n as u64;
                    if full_tx.send((buf, n)).is_err() {
                        break;
                    }
                }
                Ok(())
            });
            let sync = s.spawn(|| self.file().sync_data());
            let mut hasher = sha2::Sha256::new();
            while let Ok((buf, n)) = full_rx.recv() {
                hasher.update(&buf[..n]);
                let _ = empty_tx.send(buf);
            }
            let read = read
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("reader panicked")));
            let synced = sync
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("fsync panicked")));
            (Sha256(hasher.finalize().into()), read, synced)
        });
        read.map_err(|e| Error::io("cannot read the output back", e))?;
        synced.map_err(|e| Error::io("cannot fsync the output", e))?;
        Ok(hash)
    }

    /// The temporary file opened again with `O_DIRECT` (Linux), or `None`
    /// where the file system (or a missing /proc) refuses it.
    pub fn open_direct(&self) -> Option<File> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::OpenOptionsExt;
            // Through /proc, so that it is the same inode even if someone
            // renamed another file to the temporary name meanwhile.
            let path = format!("/proc/self/fd/{}", self.file().as_raw_fd());
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    /// Waits until the data written is on disk (`fdatasync`).
    pub fn sync_data(&self) -> Result<()> {
        self.file()
            .sync_data()
            .map_err(|e| Error::io("cannot fsync the output", e))
    }

    /// Makes the packet durable and visible: mode, fsync, rename over the
    /// destination, fsync of the directory.
    pub fn commit(self, mode: u32) -> Result<()> {
        let file = self.file();
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("cannot set the output's mode", e))?;
        file.sync_all()
            .map_err(|e| Error::io("cannot fsync the output", e))?;
        let dest = self.dest.clone();
        self.tmp.persist(&dest).map_err(|e| {
            Error::io(
                format!("cannot rename the output into {}", dest.display()),
                e.error,
            )
        })?;
        let dir = parent_dir(&dest);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("cannot fsync {}", dir.display()), e))
    }
}

fn parent_dir(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

// ---------------------------------------------------------------------------
// Writing members from content sources (pack and seal)

/// What the writer does with a file's bytes as they go by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// New content: hash it; the manifest takes the result.
    Compute,
    /// Content the manifest already describes: hash it and compare, failing
    /// on a mismatch.
    Verify,
    /// Content known to match the manifest (verified before): copy it.
    Trust,
}

/// Where the members' file content comes from.
pub trait Contents: Sync {
    /// Errors of the source; packet errors (a failed verification) convert.
    type Error: From<Error> + Send;
    /// A file opened for reading from its start.
    type Reader<'a>: ContentReader<Error = Self::Error>
    where
        Self: 'a;
    /// How entry `i`'s bytes are checked.
    fn check(&self, i: usize) -> Check;
    /// Opens entry `i` (a regular file) for reading.
    fn open(&self, i: usize) -> Result<Self::Reader<'_>, Self::Error>;
    /// A hint that `entries` (only bytes `window` of them, when given: a
    /// large file's chunk) will be read soon: a source on disk can start
    /// reading them in now.
    fn prefetch(&self, _entries: std::ops::Range<usize>, _window: Option<(u64, u64)>) {}
}

/// A file's content being read from its start.
pub trait ContentReader {
    /// Errors.
    type Error;
    /// Fills `buf` with the next bytes; a short file is an error.
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Self::Error>;
    /// Skips the next `n` bytes (by reading them, unless the source can
    /// seek).
    fn skip(&mut self, mut n: u64) -> Result<(), Self::Error> {
        let mut scratch = vec![0u8; n.min(1 << 20) as usize];
        while n > 0 {
            let k = n.min(scratch.len() as u64) as usize;
            self.read_exact(&mut scratch[..k])?;
            n -= k as u64;
        }
        Ok(())
    }
    /// Called after the last byte: a source can check it did not change.
    fn finish(self) -> Result<(), Self::Error>;
}

/// Hashes computed for [`Check::Compute`] entries: `(entry, sha256, chunks)`.
pub type Computed = Vec<(usize, Sha256, Vec<Sha256>)>;

/// Byte counts of a [`write_members`] run.
#[derive(Default, Debug)]
pub struct WriteStats {
    /// Bytes hashed to compute new manifest hashes.
    pub hashed: AtomicU64,
    /// Bytes hashed to verify content against the manifest.
    pub verified: AtomicU64,
    /// Bytes copied whose hashes the manifest already had (verified or trusted).
    pub copied: AtomicU64,
}

impl WriteStats {
    /// Counts `n` bytes handled per `check`: hashed for new content,
    /// verified and copied for reused content checked on the way, copied
    /// for trusted content.
    pub fn count(&self, check: Check, n: u64) {
        let counters: &[&AtomicU64] = match check {
            Check::Compute => &[&self.hashed],
            Check::Verify => &[&self.verified, &self.copied],
            Check::Trust => &[&self.copied],
        };
        for c in counters {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Writes every member of `manifest` (headers from the manifest, content
/// from `src`) at its offset in `out`, on all cores, in batches of about
/// `BATCH_BYTES` assembled in memory and written with one call; a member
/// larger than a batch is streamed. Returns the hashes computed.
pub fn write_members<S: Contents>(
    out: &Output,
    manifest: &Manifest,
    layout: &Layout,
    src: &S,
    stats: &WriteStats,
    progress: &(dyn Fn(u64) + Sync),
) -> std::result::Result<Computed, S::Error> {
    use rayon::prelude::*;
    let w = MemberWriter {
        out,
        manifest,
        layout,
        src,
        stats,
        progress,
    };
    let per_batch: Vec<Computed> = layout
        .batches(BATCH_BYTES)
        .into_par_iter()
        .map_init(Vec::new, |buf, range| w.batch(range, buf))
        .collect::<std::result::Result<_, S::Error>>()?;
    Ok(per_batch.into_iter().flatten().collect())
}

/// Members gathered per batch before one write.
const BATCH_BYTES: u64 = crate::packet::reader::BATCH_BYTES;

struct MemberWriter<'a, S> {
    out: &'a Output,
    manifest: &'a Manifest,
    layout: &'a Layout,
    src: &'a S,
    stats: &'a WriteStats,
    progress: &'a (dyn Fn(u64) + Sync),
}

/// The error (and log line) for reused content that does not match the
/// manifest, bytes `start..end` of the file at `path`.
fn content_mismatch(path: &str, start: u64, end: u64) -> Error {
    tracing::error!(
        path,
        start,
        end,
        "lower content does not match the manifest"
    );
    Error::ContentMismatch {
        path: path.to_string(),
        start,
        end,
    }
}

/// Hashing state for one file, per its [`Check`].
struct Digesting {
    check: Check,
    hasher: Option<ContentHasher>,
}

impl Digesting {
    fn new(check: Check, size: u64) -> Digesting {
        let hasher = (check != Check::Trust).then(|| ContentHasher::new(size));
        Digesting { check, hasher }
    }

    fn update(&mut self, data: &[u8], stats: &WriteStats) {
        if let Some(h) = &mut self.hasher {
            h.update(data);
        }
        stats.count(self.check, data.len() as u64);
    }

    /// The computed hashes, or a check against the manifest's.
    fn finish(
        self,
        e: &crate::packet::manifest::Entry,
        i: usize,
        out: &mut Computed,
    ) -> Result<()> {
        let Some(h) = self.hasher else { return Ok(()) };
        let (sha, chunks) = h.finish();
        match self.check {
            Check::Compute => out.push((i, sha, chunks)),
            Check::Verify => {
                let f = e
                    .file()
                    .ok_or_else(|| Error::io("verify", io::Error::other("not a file")))?;
                if f.sha256 != sha || *f.chunks != *chunks {
                    let k = f.chunks.iter().zip(&chunks).position(|(a, b)| a != b);
                    let size = f.size;
                    let (start, end) = k.map_or((0, size), |k| {
                        let s = k as u64 * crate::packet::format::CHUNK_SIZE;
                        (s, (s + crate::packet::format::CHUNK_SIZE).min(size))
                    });
                    return Err(content_mismatch(&e.path, start, end));
                }
            }
            Check::Trust => {}
        }
        Ok(())
    }
}

impl<S: Contents> MemberWriter<'_, S> {
    fn batch(
        &self,
        range: std::ops::Range<usize>,
        buf: &mut Vec<u8>,
    ) -> std::result::Result<Computed, S::Error> {
        let start = self.layout.member_start(range.start);
        let end = self.layout.member_end(range.end - 1);
        let mut computed = Vec::new();
        if range.len() == 1 && end - start > BATCH_BYTES {
            let i = range.start;
            if self.manifest.entries[i].file().is_some() {
                self.stream(i, buf, &mut computed)?;
                return Ok(computed);
            }
        }
        buf.clear();
        for i in range {
            let e = &self.manifest.entries[i];
            crate::packet::layout::write_entry_headers(e, buf);
            let Some(f) = e.file() else { continue };
            let at = buf.len();
            buf.resize(at + f.size as usize, 0);
            let mut d = Digesting::new(self.src.check(i), f.size);
            let mut r = self.src.open(i)?;
            r.read_exact(&mut buf[at..])?;
            r.finish()?;
            d.update(&buf[at..], self.stats);
            d.finish(e, i, &mut computed)?;
            buf.resize(buf.len().next_multiple_of(BLOCK as usize), 0);
            (self.progress)(f.size);
        }
        debug_assert_eq!(buf.len() as u64, end - start);
        self.out.write_at(buf, start)?;
        Ok(computed)
    }

    /// A file larger than a batch: headers, then the content in pieces (or
    /// copied by the kernel when it is trusted and the source allows).
    fn stream(
        &self,
        i: usize,
        buf: &mut Vec<u8>,
        computed: &mut Computed,
    ) -> std::result::Result<(), S::Error> {
        let e = &self.manifest.entries[i];
        let size = e.size();
        buf.clear();
        crate::packet::layout::write_entry_headers(e, buf);
        self.out.write_at(buf, self.layout.member_start(i))?;
        let base = self.layout.data_offset(i, e);
        let check = self.src.check(i);
        let mut d = Digesting::new(check, size);
        let mut r = self.src.open(i)?;
        let mut done = 0;
        while done < size {
            let n = (size - done).min(BATCH_BYTES) as usize;
            buf.clear();
            buf.resize(n, 0);
            r.read_exact(buf)?;
            d.update(buf, self.stats);
            // The last piece carries the member's zero padding.
            buf.resize(n.next_multiple_of(BLOCK as usize), 0);
            self.out.write_at(buf, base + done)?;
            done += n as u64;
            (self.progress)(n as u64);
        }
        r.finish()?;
        d.finish(e, i, computed)?;
        Ok(())
    }
}
