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
use serde::Serialize;

use super::error::Error;
use super::policy::Policy;
use super::walk::{FoundFile, FoundKind, Root, ScanOptions, ScanReport, scan};
use crate::output::{Check, ContentReader, Contents, Output, WriteStats, write_members};
use crate::packet::digest::{Digest, Sha256};
use crate::packet::format::{HarnessKind, Limits, chunk_count};
use crate::packet::layout::Layout;
use crate::packet::manifest::{Entry, EntryKind, FileMeta, Manifest};
use crate::packet::path::Part;
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

    let contents = PackContents {
        roots: &scan.roots,
        manifest: &manifest,
        sources: &sources,
    };
    let stats = WriteStats::default();
    let hashes = write_members(&output, &manifest, &layout, &contents, &stats, progress)?;
    for (i, sha, chunks) in hashes {
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

/// The files of the walked tree, as a content source for the writer.
struct PackContents<'a> {
    roots: &'a [Root],
    manifest: &'a Manifest,
    sources: &'a [Option<FoundFile>],
}

/// One source file being read.
struct PackReader<'a> {
    file: File,
    path: &'a str,
    src: &'a FoundFile,
    roots: &'a [Root],
}

impl Contents for PackContents<'_> {
    type Error = Error;
    type Reader<'a>
        = PackReader<'a>
    where
        Self: 'a;

    fn check(&self, _i: usize) -> Check {
        Check::Compute
    }

    fn open(&self, i: usize) -> Result<PackReader<'_>, Error> {
        let path: &str = &self.manifest.entries[i].path;
        let src = self.sources[i].as_ref().ok_or_else(|| Error::Changed {
            path: path.into(),
            what: "is not a regular file",
        })?;
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
        Ok(PackReader {
            file: File::from(fd),
            path,
            src,
            roots: self.roots,
        })
    }
}

impl ContentReader for PackReader<'_> {
    type Error = Error;

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        read_exact(&mut self.file, buf, self.path)
    }

    /// After reading: the same regular file, same size and mtime as walked.
    fn finish(self) -> Result<(), Error> {
        let src = self.src;
        let m = self
            .file
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
            path: self.path.into(),
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
