//! `pack`: a real tree into a packet, reading every file once.
//!
//! The walk yields every entry with its size, so the layout (and the length
//! of the manifest, whose hashes are fixed-width) is known before any file
//! is read. Each worker then reads a run of files, hashes them and writes
//! their members straight to their final offsets; the manifest goes last.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use rayon::prelude::*;
use serde::Serialize;

use super::error::Error;
use super::policy::Policy;
use super::walk::{FoundFile, FoundKind, Root, ScanOptions, ScanReport, scan};
use crate::output::Output;
use crate::packet::digest::{ContentHasher, Digest, Sha256};
use crate::packet::format::{HarnessKind, Limits, chunk_count};
use crate::packet::layout::{self, Layout};
use crate::packet::manifest::{Entry, EntryKind, FileMeta, Manifest};
use crate::packet::path::Part;
use crate::packet::reader::BATCH_BYTES;
use crate::sys;

/// What to pack.
pub struct PackOptions {
    /// The workspace directory.
    pub workspace: PathBuf,
    /// The harness directory and its kind.
    pub harness: Option<(PathBuf, HarnessKind)>,
    /// Where the packet goes.
    pub output: PathBuf,
    /// Record every mtime as 0.
    pub zero_mtimes: bool,
    /// Refuse symlinks leaving their part.
    pub reject_external_symlinks: bool,
    /// `--exclude` patterns.
    pub exclude: Vec<String>,
    /// `--keep` patterns.
    pub keep: Vec<String>,
    /// Limits.
    pub limits: Limits,
    /// Mode of the packet file.
    pub mode: u32,
}

/// What `pack` produced.
#[derive(Debug, Serialize)]
pub struct PackOutcome {
    /// The packet digest.
    pub digest: Digest,
    /// SHA-256 of the whole file.
    pub file_sha256: Sha256,
    /// Length of the packet file.
    pub packet_bytes: u64,
    /// Entry counts.
    pub entries: u64,
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Bytes of file content.
    pub content_bytes: u64,
    /// What was left out or rewritten.
    #[serde(flatten)]
    pub report: ScanReport,
}

/// Packs the tree described by `opts`. On error, nothing is left at the
/// output path (the temporary file is removed).
pub fn pack(opts: &PackOptions, progress: &(dyn Fn(u64) + Sync)) -> Result<PackOutcome, Error> {
    let kind = opts.harness.as_ref().map(|(_, k)| *k);
    let policy = Policy::new(kind, &opts.exclude, &opts.keep).map_err(Error::Pattern)?;
    let output = Output::create(&opts.output)?;
    let mut skip = vec![output.identity()?];
    if let Ok(m) = std::fs::symlink_metadata(&opts.output) {
        skip.push((m.dev(), m.ino()));
    }
    let mut parts = vec![(Part::Workspace, opts.workspace.clone())];
    if let Some((dir, _)) = &opts.harness {
        parts.insert(0, (Part::Harness, dir.clone()));
    }
    let scan_opts = ScanOptions {
        policy: &policy,
        zero_mtimes: opts.zero_mtimes,
        reject_external_symlinks: opts.reject_external_symlinks,
        limits: opts.limits,
        skip,
    };
    let t = std::time::Instant::now();
    let mut scan = scan(&parts, &scan_opts)?;
    tracing::debug!(elapsed = ?t.elapsed(), entries = scan.found.len(), "walked");
    scan.found
        .sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));

    // The manifest with placeholder hashes: same length as the final one.
    let mut sources: Vec<Option<FoundFile>> = Vec::with_capacity(scan.found.len());
    let mut manifest = Manifest {
        harness: kind,
        entries: Vec::with_capacity(scan.found.len()),
    };
    for f in scan.found.drain(..) {
        let (kind, source) = match f.kind {
            FoundKind::Dir => (EntryKind::Dir, None),
            FoundKind::Symlink(t) => (EntryKind::Symlink(t.into()), None),
            FoundKind::File(file) => (
                EntryKind::File(FileMeta {
                    size: file.size,
                    mtime_ns: file.mtime_ns,
                    executable: file.executable,
                    sha256: Sha256::default(),
                    chunks: vec![Sha256::default(); chunk_count(file.size) as usize].into(),
                }),
                Some(file),
            ),
        };
        manifest.entries.push(Entry {
            path: f.path.into(),
            kind,
        });
        sources.push(source);
    }
    manifest
        .validate(&opts.limits)
        .map_err(Error::from_validation)?;
    let manifest_len = manifest.encode().len() as u64;
    let layout = Layout::compute(&manifest, manifest_len);
    output.size_for(&layout)?;

    let writer = BatchWriter {
        roots: &scan.roots,
        manifest: &manifest,
        sources: &sources,
        layout: &layout,
        output: &output,
        progress,
    };
    tracing::debug!(elapsed = ?t.elapsed(), "laid out");
    let hashes: Vec<Vec<(usize, Sha256, Vec<Sha256>)>> = layout
        .batches(BATCH_BYTES)
        .into_par_iter()
        .map_init(Vec::new, |buf, range| writer.write_batch(range, buf))
        .collect::<Result<_, Error>>()?;
    for (i, sha, chunks) in hashes.into_iter().flatten() {
        if let EntryKind::File(f) = &mut manifest.entries[i].kind {
            f.sha256 = sha;
            f.chunks = chunks.into();
        }
    }
    tracing::debug!(elapsed = ?t.elapsed(), "content written");
    let digest = output.write_manifest(&manifest, manifest_len)?;
    let file_sha256 = output.hash_and_sync(layout.total_len())?;
    tracing::debug!(elapsed = ?t.elapsed(), "file hashed and synced");
    output.commit(opts.mode)?;
    tracing::debug!(elapsed = ?t.elapsed(), "committed");

    let count =
        |pred: fn(&Entry) -> bool| manifest.entries.iter().filter(|e| pred(e)).count() as u64;
    Ok(PackOutcome {
        digest,
        file_sha256,
        packet_bytes: layout.total_len(),
        entries: manifest.entries.len() as u64,
        files: count(|e| matches!(e.kind, EntryKind::File(_))),
        dirs: count(|e| matches!(e.kind, EntryKind::Dir)),
        symlinks: count(|e| matches!(e.kind, EntryKind::Symlink(_))),
        content_bytes: manifest.content_bytes(),
        report: scan.report,
    })
}

/// Shared state of the parallel writers.
struct BatchWriter<'a> {
    roots: &'a [Root],
    manifest: &'a Manifest,
    sources: &'a [Option<FoundFile>],
    layout: &'a Layout,
    output: &'a Output,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl BatchWriter<'_> {
    /// Writes the members of `range`: assembled in `buf` and written with one
    /// call, or streamed when a single member is larger than a batch.
    fn write_batch(
        &self,
        range: std::ops::Range<usize>,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<(usize, Sha256, Vec<Sha256>)>, Error> {
        let start = self.layout.member_start(range.start);
        let end = self.layout.member_end(range.end - 1);
        let mut out = Vec::new();
        if range.len() == 1 && end - start > BATCH_BYTES {
            let i = range.start;
            if let Some(src) = &self.sources[i] {
                let (sha, chunks) = self.stream_file(i, src, buf)?;
                out.push((i, sha, chunks));
                return Ok(out);
            }
        }
        buf.clear();
        for i in range {
            let e = &self.manifest.entries[i];
            layout::write_entry_headers(e, buf);
            if let Some(src) = &self.sources[i] {
                let at = buf.len();
                buf.resize(at + src.size as usize, 0);
                let mut file = self.open(&e.path, src)?;
                read_exact(&mut file, &mut buf[at..], &e.path)?;
                self.check_unchanged(&file, &e.path, src)?;
                let mut h = ContentHasher::new(src.size);
                h.update(&buf[at..]);
                let (sha, chunks) = h.finish();
                out.push((i, sha, chunks));
                buf.resize(buf.len().next_multiple_of(512), 0);
                (self.progress)(src.size);
            }
        }
        debug_assert_eq!(buf.len() as u64, end - start);
        self.output.write_at(buf, start)?;
        Ok(out)
    }

    /// A large file, read and written in pieces.
    fn stream_file(
        &self,
        i: usize,
        src: &FoundFile,
        buf: &mut Vec<u8>,
    ) -> Result<(Sha256, Vec<Sha256>), Error> {
        let e = &self.manifest.entries[i];
        buf.clear();
        layout::write_entry_headers(e, buf);
        self.output.write_at(buf, self.layout.member_start(i))?;
        let mut file = self.open(&e.path, src)?;
        let mut h = ContentHasher::new(src.size);
        let base = self.layout.data_offset(i, e);
        let mut done = 0;
        while done < src.size {
            let n = (src.size - done).min(BATCH_BYTES) as usize;
            buf.clear();
            buf.resize(n, 0);
            read_exact(&mut file, buf, &e.path)?;
            h.update(buf);
            // The last piece carries the member's zero padding.
            buf.resize(n.next_multiple_of(512), 0);
            self.output.write_at(buf, base + done)?;
            done += n as u64;
            (self.progress)(n as u64);
        }
        self.check_unchanged(&file, &e.path, src)?;
        Ok(h.finish())
    }

    fn open(&self, path: &str, src: &FoundFile) -> Result<File, Error> {
        let root = &self.roots[src.root];
        // O_NONBLOCK: a file swapped for a FIFO since the walk cannot hang us.
        let fd = sys::open_beneath(
            root.fd.as_fd(),
            &src.rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOENT | libc::EXDEV | libc::ENOTDIR) => Error::Changed {
                path: path.into(),
                what: "was replaced or removed",
            },
            _ => Error::io(&root.dir.join(&src.rel), "cannot open", e),
        })?;
        Ok(File::from(fd))
    }

    /// After reading: the same regular file, same size and mtime as walked.
    fn check_unchanged(&self, file: &File, path: &str, src: &FoundFile) -> Result<(), Error> {
        let m = file
            .metadata()
            .map_err(|e| Error::io(&self.roots[src.root].dir.join(&src.rel), "cannot stat", e))?;
        let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
        let what = if !m.file_type().is_file() || (m.dev(), m.ino()) != (src.dev, src.ino) {
            "was replaced"
        } else if m.len() != src.size {
            "changed size"
        } else if mtime != src.seen_mtime_ns {
            "was modified"
        } else {
            return Ok(());
        };
        Err(Error::Changed {
            path: path.into(),
            what,
        })
    }
}

fn read_exact(file: &mut File, buf: &mut [u8], path: &str) -> Result<(), Error> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::WouldBlock => Error::Changed {
            path: path.into(),
            what: "shrank or was replaced",
        },
        _ => Error::Io {
            path: path.into(),
            op: "cannot read",
            source: e,
        },
    })
}
