//! `pack`: a real tree into a packet.
//!
//! The walk yields every entry with its size and stamp; the manifest is
//! validated before any file is read. Then two passes, as in the seal:
//! every file is hashed on all cores, and the packet is written once, in
//! file order, around the page cache (with `--file-sha256`, while a thread
//! hashes it for `file_sha256`; nothing is read back). The smallest files, up to a
//! memory budget, are read once: the first pass holds their bytes for the
//! second. Any other file must be the same in both
//! passes: the first takes a fingerprint of every file (or of each chunk)
//! beside its hashes, and the second fingerprints it again as it copies
//! it and compares (timestamps cannot prove a file unchanged: stores
//! through a shared mapping move no ctime until writeback); see
//! `crate::output::fingerprint` for why a fingerprint, not a second
//! SHA-256. After every read the file must still be the one the walk saw,
//! with the same size and mtime.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde::Serialize;

use super::error::Error;
use super::policy::Policy;
use super::report::ScanReport;
use super::report::Tally;
use super::tar::{TarIn, TarInput};
use super::walk::{FoundFile, FoundKind, OnDisk, Origin, Root, ScanOptions, scan};
use crate::output::{
    Check, ContentReader, Contents, Keep, Output, WriteOptions, WriteStats, hash_new,
    write_in_order,
};
use crate::output::{RemoteOutput, Uploaded, Writing};
use crate::packet::digest::{Digest, Sha256};
use crate::packet::format::{HarnessKind, Limits, Version, chunk_count};
use crate::packet::layout::Layout;
use crate::packet::manifest::{Entry, EntryKind, FileMeta, Manifest};
use crate::packet::path::Part;
use crate::store::{Location, Settings};
use crate::sys;

/// Where a part's tree is read from.
#[derive(Clone, Debug)]
pub enum Input {
    /// A directory, walked.
    Dir(PathBuf),
    /// A tar stream, read as the tree (never extracted): see
    /// [`super::tar`].
    Tar(TarIn),
}

impl Input {
    fn dir(&self) -> Option<&Path> {
        match self {
            Input::Dir(d) => Some(d),
            Input::Tar(_) => None,
        }
    }
}

/// What to pack.
pub struct PackOptions {
    /// The workspace.
    pub workspace: Input,
    /// The harness and its kind.
    pub harness: Option<(Input, HarnessKind)>,
    /// Where the packet goes (with `remote`, only its name in messages).
    pub output: PathBuf,
    /// Upload the packet to this location (`s3://BUCKET/KEY`) as it is
    /// written, instead of writing a file.
    pub remote: Option<(Location, Settings)>,
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
    /// Bytes of small files' content held between the two passes, at most
    /// (`None`: 256 MiB, or a sixteenth of the memory the process may use
    /// where that is less; never more than half of that memory).
    pub hold_memory: Option<u64>,
    /// Compute the SHA-256 of the whole packet file (`--file-sha256`).
    pub file_sha256: bool,
    /// The format version to write.
    pub version: Version,
    /// Test barrier directory (see `crate::barrier`); its point is
    /// `hashed`, between the two passes.
    pub barrier: Option<PathBuf>,
}

/// What `pack` produced.
#[derive(Debug, Serialize)]
pub struct PackOutcome {
    /// The packet digest.
    pub digest: Digest,
    /// SHA-256 of the whole file, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_sha256: Option<Sha256>,
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
    /// Bytes of a tar stream's files copied to a temporary file, when a
    /// stream was read from a pipe (`--workspace-tar -`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spooled_bytes: Option<u64>,
    /// What was left out or rewritten.
    #[serde(flatten)]
    pub report: ScanReport,
    /// For an upload: bytes sent and copied, parts.
    #[serde(flatten)]
    pub upload: Option<Uploaded>,
    /// Where the packet is: the output, its `{digest}` filled in.
    #[serde(skip)]
    pub output: PathBuf,
    /// A digest-named file output held the packet already (verified):
    /// nothing was written.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_there: bool,
}

/// What [`pack`] tells its progress display: it works in two passes over
/// the tree, first hashing every file's content, then writing the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackProgress {
    /// A pass begins: its name and how many bytes it goes through.
    Pass(&'static str, u64),
    /// That many more bytes of the current pass are done.
    Bytes(u64),
}

/// `(dev, ino)` of the temporary files an earlier pack to the same output
/// left when it was killed (`.<name>.<random>.tmp` beside it): should the
/// output lie inside the tree, they are left out like an older output.
fn stale_temporaries(output: &Path) -> Vec<(u64, u64)> {
    let (Some(dir), Some(name)) = (output.parent(), output.file_name()) else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = crate::output::temp_prefix(&name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // Exactly what Output::create names: six random alphanumerics between.
    let ours = |n: &str| {
        n.strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
            .is_some_and(|r| r.len() == 6 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| ours(&e.file_name().to_string_lossy()))
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// The identity (`(dev, ino)`) of each part's root, for the walk to know
/// the other part's root when it meets it inside a part (`--workspace ~
/// --harness ~/.codex`): left out there because it is packed as its own
/// part, under that part's rules (the harness kind's credential
/// exclusions). Known by identity, not by path, so that a bind mount of
/// the harness inside the workspace is known too. The same directory for
/// both is refused.
fn part_root_identities(
    workspace: &Path,
    harness: Option<&Path>,
) -> Result<Vec<(sys::FileId, Part)>, Error> {
    let Some(harness) = harness else {
        return Ok(Vec::new());
    };
    // A root that cannot be read is reported by the walk.
    let (Ok(w), Ok(h)) = (std::fs::metadata(workspace), std::fs::metadata(harness)) else {
        return Ok(Vec::new());
    };
    let (w, h) = ((w.dev(), w.ino()), (h.dev(), h.ino()));
    if w == h {
        return Err(Error::Refused {
            path: crate::packet::path::shown_path(harness),
            kind: crate::packet::error::ErrorKind::PartsOverlap,
            reason: "--workspace and --harness name the same directory; the harness part is \
                     the agent's home (such as ~/.codex), give it apart from the workspace"
                .into(),
        });
    }
    Ok(vec![(w, Part::Workspace), (h, Part::Harness)])
}

/// Packs the tree described by `opts`. On error, nothing is left at the
/// output path (the temporary file is removed). `progress` is told of each
/// pass as it begins and of its bytes as they are done.
pub fn pack(
    opts: &PackOptions,
    progress: &(dyn Fn(PackProgress) + Sync),
) -> Result<PackOutcome, Error> {
    let bytes = |n| progress(PackProgress::Bytes(n));
    let kind = opts.harness.as_ref().map(|(_, k)| *k);
    if kind.is_none()
        && let Some(p) = opts
            .exclude
            .iter()
            .chain(&opts.keep)
            .find(|p| p.starts_with("harness/"))
    {
        return Err(Error::Pattern(format!(
            "pattern `{p}` names the harness part, but no --harness is packed: it could \
             match nothing; give --harness, or drop the pattern"
        )));
    }
    let policy = Policy::new(kind, &opts.exclude, &opts.keep).map_err(Error::Pattern)?;
    let other_parts = match (
        opts.workspace.dir(),
        opts.harness.as_ref().map(|h| h.0.dir()),
    ) {
        (Some(w), Some(Some(h))) => part_root_identities(w, Some(h))?,
        _ => Vec::new(),
    };
    // The tar streams first: one may be standard input, read once.
    let mut tars = Vec::new();
    let mut parts = Vec::new();
    for (part, input) in [
        opts.harness.as_ref().map(|h| (Part::Harness, &h.0)),
        Some((Part::Workspace, &opts.workspace)),
    ]
    .into_iter()
    .flatten()
    {
        match input {
            Input::Dir(dir) => parts.push((part, dir.clone())),
            Input::Tar(from) => tars.push(super::tar::read(part, from, &policy, &opts.limits)?),
        }
    }
    // An object named by the digest: its key is known once the digest
    // is (after the hashing pass, before a byte is written), and its
    // upload starts then.
    let named_object = opts.remote.is_some() && crate::output::digest_named(&opts.output);
    let mut output = match &opts.remote {
        Some(_) if named_object => None,
        Some((location, settings)) => Some(Writing::Remote(Box::new(RemoteOutput::create(
            location, settings,
        )?))),
        None => {
            if let Some(reason) = crate::output::refuse_replacing(&opts.output) {
                return Err(Error::Refused {
                    path: crate::packet::path::shown_path(&opts.output),
                    kind: crate::packet::error::ErrorKind::TargetUnusable,
                    reason,
                });
            }
            Some(Writing::File(Output::create(&opts.output)?))
        }
    };
    let (skip, own) = match &output {
        Some(Writing::File(o)) => {
            let mut skip = stale_temporaries(&opts.output);
            if let Ok(m) = std::fs::symlink_metadata(&opts.output) {
                skip.push((m.dev(), m.ino()));
            }
            (skip, Some(o.identity()?))
        }
        Some(Writing::Remote(_)) | None => (Vec::new(), None),
    };
    let tally = Tally::default();
    let scan_opts = ScanOptions {
        policy: &policy,
        zero_mtimes: opts.zero_mtimes,
        reject_external_symlinks: opts.reject_external_symlinks,
        limits: opts.limits,
        skip,
        own,
        other_parts,
        barrier: opts.barrier.as_deref(),
        tally: &tally,
    };
    let t = std::time::Instant::now();
    let mut scan = scan(&parts, &scan_opts)?;
    for (k, tar) in tars.iter().enumerate() {
        let (found, report) = tar.walk(
            k,
            &policy,
            opts.zero_mtimes,
            opts.reject_external_symlinks,
            &opts.limits,
            &tally,
        )?;
        scan.found.extend(found);
        scan.report.merge(report);
    }
    scan.report.sort();
    tracing::debug!(elapsed = ?t.elapsed(), entries = scan.found.len(), "walked");
    scan.found
        .sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));

    // The manifest with placeholder hashes, checked before any file is read.
    let mut sources: Vec<Option<FoundFile>> = Vec::with_capacity(scan.found.len());
    let mut manifest = Manifest {
        version: opts.version,
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
    scan.report
        .check_manifest(&manifest, &opts.limits, opts.reject_external_symlinks)?;

    // Two passes, like the seal: hash every file on all cores, then write
    // the packet once, in file order, hashing it on the way for
    // `file_sha256` if asked (see crate::output::in_order); the smallest files are
    // copied from the bytes the first pass held, every other one
    // fingerprinted again as it is copied and compared with the first pass.
    let stats = WriteStats::default();
    let first = PackContents {
        roots: &scan.roots,
        tars: &tars,
        manifest: &manifest,
        sources: &sources,
        fingerprints: None,
        held: &[],
    };
    let keep = Keep {
        fingerprints: true,
        hold_max: hold_max(&manifest, hold_budget(opts.hold_memory)),
    };
    progress(PackProgress::Pass("hashing", manifest.content_bytes()));
    let hashes = hash_new(&manifest, &first, &stats, keep, &bytes)?;
    tracing::debug!(elapsed = ?t.elapsed(), hold_max = ?keep.hold_max, "content hashed");
    crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Hashed);
    let mut fingerprints = vec![Vec::new(); manifest.entries.len()];
    let mut held: Vec<Option<Box<[u8]>>> = vec![None; manifest.entries.len()];
    for h in hashes {
        if let EntryKind::File(f) = &mut manifest.entries[h.entry].kind {
            f.sha256 = h.sha256;
            f.chunks = h.chunks.into();
        }
        fingerprints[h.entry] = h.fingerprints;
        held[h.entry] = h.held;
    }
    let manifest_bytes = manifest.encode();
    let layout = Layout::compute(&manifest, manifest_bytes.len() as u64);
    let digest = Digest::of_manifest(&manifest_bytes);
    let mut placed_at = opts.output.clone();
    // A digest-named object: its upload starts now, under its name (one
    // already there is compared with the packet as it is written).
    if let (None, Some((location, settings))) = (&output, &opts.remote) {
        let named = crate::output::digest_location(location, &digest);
        placed_at = PathBuf::from(named.shown());
        output = Some(Writing::Remote(Box::new(RemoteOutput::create(
            &named, settings,
        )?)));
    }
    let Some(mut output) = output else {
        return Err(Error::Io {
            path: crate::packet::path::shown_path(&opts.output),
            op: "internal: no output to write",
            source: std::io::Error::other("the output was never made"),
        });
    };
    // A digest-named file: known now, before anything is written; the
    // packet already there (verified) is not written again.
    if let Writing::File(o) = &mut output
        && crate::output::digest_named(&opts.output)
    {
        placed_at = crate::output::digest_name(&opts.output, &digest);
        if let crate::output::AtDigestName::Same { len, file_sha256 } =
            crate::output::at_digest_name(&placed_at, &digest, &opts.limits)?
        {
            let spooled = spooled_bytes(&tars);
            return Ok(outcome(
                opts,
                &manifest,
                (digest, len, file_sha256),
                spooled,
                scan.report,
                placed_at,
            ));
        }
        o.retarget(&placed_at);
    }
    match &mut output {
        Writing::File(o) => o.size_for(&layout)?,
        Writing::Remote(r) => r.plan(&layout, None)?,
    }
    let second = PackContents {
        roots: &scan.roots,
        tars: &tars,
        manifest: &manifest,
        sources: &sources,
        fingerprints: Some(&fingerprints),
        held: &held,
    };
    // Around the page cache, as the seal does: the packet is shipped.
    progress(PackProgress::Pass("writing", layout.total_len()));
    let file_sha256 = write_in_order(
        output.dest(),
        WriteOptions {
            direct: true,
            file_sha256: opts.file_sha256,
        },
        &manifest,
        &manifest_bytes,
        &layout,
        &second,
        &stats,
        &bytes,
    )
    .map_err(|e| match e {
        // Bytes that differ from the first pass: the file changed between
        // the passes (its size and mtime may well be the same).
        Error::Packet(crate::packet::error::Error::ContentMismatch { path, .. }) => {
            Error::Changed {
                path,
                what: "was modified",
            }
        }
        e => e,
    })?;
    tracing::debug!(elapsed = ?t.elapsed(), "written");
    let upload = match output {
        Writing::File(o) => {
            match o.commit(opts.mode) {
                Ok(_) => {}
                // Another pack of the same tree placed it meanwhile.
                Err(e) if crate::output::digest_named(&opts.output) => {
                    if let Ok(crate::output::AtDigestName::Same { len, file_sha256 }) =
                        crate::output::at_digest_name(&placed_at, &digest, &opts.limits)
                    {
                        let spooled = spooled_bytes(&tars);
                        return Ok(outcome(
                            opts,
                            &manifest,
                            (digest, len, file_sha256),
                            spooled,
                            scan.report,
                            placed_at,
                        ));
                    }
                    return Err(e.into());
                }
                Err(e) => return Err(e.into()),
            }
            None
        }
        Writing::Remote(r) => Some(r.commit(&digest)?),
    };
    tracing::debug!(elapsed = ?t.elapsed(), "committed");
    crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Committed);

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
        spooled_bytes: spooled_bytes(&tars),
        report: scan.report,
        upload,
        output: placed_at,
        already_there: false,
    })
}

/// Bytes the tar streams read from pipes spooled, if any was.
fn spooled_bytes(tars: &[TarInput]) -> Option<u64> {
    tars.iter().filter_map(|t| t.spooled).reduce(|a, b| a + b)
}

/// The outcome of a pack whose digest-named output held the packet
/// already (its digest, length and `file_sha256`, verified): nothing was
/// written.
fn outcome(
    opts: &PackOptions,
    manifest: &Manifest,
    (digest, len, file_sha256): (Digest, u64, Sha256),
    spooled_bytes: Option<u64>,
    report: ScanReport,
    output: PathBuf,
) -> PackOutcome {
    let count =
        |pred: fn(&Entry) -> bool| manifest.entries.iter().filter(|e| pred(e)).count() as u64;
    PackOutcome {
        digest,
        file_sha256: opts.file_sha256.then_some(file_sha256),
        packet_bytes: len,
        entries: manifest.entries.len() as u64,
        files: count(|e| matches!(e.kind, EntryKind::File(_))),
        dirs: count(|e| matches!(e.kind, EntryKind::Dir)),
        symlinks: count(|e| matches!(e.kind, EntryKind::Symlink(_))),
        content_bytes: manifest.content_bytes(),
        spooled_bytes,
        report,
        upload: None,
        output,
        already_there: true,
    }
}

/// The memory for the content of small files held from the hashing pass
/// to the writing pass: `asked`, by default 256 MiB or a sixteenth of the
/// memory this process may use where that is less; never more than half
/// of that memory.
fn hold_budget(asked: Option<u64>) -> u64 {
    let limit = sys::memory_limit();
    asked.unwrap_or((256 << 20).min(limit / 16)).min(limit / 2)
}

/// Files held between the passes are at most this large: holding saves a
/// second open, read and stat of each file, a cost per file, not per byte.
const HOLD_FILE_MAX: u64 = 1 << 20;

/// The size up to which files are held so that they fit in `budget`
/// together, the smallest first (each file held saves the same work,
/// whatever its size); `None` when not even the smallest fit, and with no
/// budget at all (every file is then read twice, empty ones included).
fn hold_max(manifest: &Manifest, budget: u64) -> Option<u64> {
    if budget == 0 {
        return None;
    }
    let mut sizes: Vec<u64> = manifest
        .entries
        .iter()
        .filter_map(|e| e.file().map(|f| f.size))
        .filter(|&n| n <= HOLD_FILE_MAX)
        .collect();
    sizes.sort_unstable();
    let mut total = 0u64;
    let mut max = None;
    for (k, &n) in sizes.iter().enumerate() {
        total = total.saturating_add(n);
        if total > budget {
            break;
        }
        // Files of one size are held all or none.
        if sizes.get(k + 1) != Some(&n) {
            max = Some(n);
        }
    }
    max
}

/// The files of the walked tree, as a content source for the writer.
struct PackContents<'a> {
    roots: &'a [Root],
    tars: &'a [TarInput],
    manifest: &'a Manifest,
    sources: &'a [Option<FoundFile>],
    /// In the writing pass, the first pass's fingerprints of each entry,
    /// against which it checks every file it reads again.
    fingerprints: Option<&'a [Vec<u128>]>,
    /// In the writing pass, the content the first pass held, by entry:
    /// copied as it is, since it is exactly the bytes that were hashed.
    held: &'a [Option<Box<[u8]>>],
}

/// One source file being read: from the tree, from a tar stream's content
/// (where the next byte is), or held in memory (what is left of it to
/// read, and its path).
enum PackReader<'a> {
    Disk(DiskReader<'a>),
    Tar(&'a TarInput, u64, &'a str),
    Held(&'a [u8], &'a str),
}

/// A file of the tree being read.
struct DiskReader<'a> {
    file: File,
    path: &'a str,
    size: u64,
    src: &'a OnDisk,
    roots: &'a [Root],
}

impl Contents for PackContents<'_> {
    type Error = Error;
    type Reader<'a>
        = PackReader<'a>
    where
        Self: 'a;

    /// Every file is hashed in the first pass; in the second, a held file
    /// is copied as it was hashed, any other fingerprinted again and
    /// compared.
    fn check(&self, i: usize) -> Check {
        if self.held.get(i).is_some_and(Option::is_some) {
            Check::Trust
        } else if self.fingerprints.is_some() {
            Check::Unchanged
        } else {
            Check::Compute
        }
    }

    fn fingerprint(&self, i: usize, k: Option<u64>) -> Option<u128> {
        let k = usize::try_from(k.unwrap_or(0)).ok()?;
        self.fingerprints?.get(i)?.get(k).copied()
    }

    fn open(&self, i: usize) -> Result<PackReader<'_>, Error> {
        if let Some(Some(bytes)) = self.held.get(i) {
            return Ok(PackReader::Held(bytes, &self.manifest.entries[i].path));
        }
        let path: &str = &self.manifest.entries[i].path;
        let src = self.sources[i].as_ref().ok_or_else(|| Error::Changed {
            path: path.into(),
            what: "is not a regular file",
        })?;
        let size = src.size;
        let src = match &src.origin {
            Origin::Disk(d) => d,
            Origin::Tar { input, offset, .. } => {
                return Ok(PackReader::Tar(&self.tars[*input], *offset, path));
            }
        };
        let root = &self.roots[src.root];
        // O_NONBLOCK: a file swapped for a FIFO since the walk cannot hang us.
        let fd = sys::open_beneath(
            root.fd.as_fd(),
            &src.rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| match e.raw_os_error() {
            // (ENXIO: a socket in its place.)
            Some(libc::ELOOP | libc::ENOENT | libc::EXDEV | libc::ENOTDIR | libc::ENXIO) => {
                Error::Changed {
                    path: path.into(),
                    what: "was replaced or removed",
                }
            }
            _ => Error::io(&root.dir.join(&src.rel), "cannot open", e),
        })?;
        // Its stamp is checked after the read: any change since the walk
        // shows there, whenever it happened.
        Ok(PackReader::Disk(DiskReader {
            file: File::from(fd),
            path,
            size,
            src,
            roots: self.roots,
        }))
    }
}

impl ContentReader for PackReader<'_> {
    type Error = Error;

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        match self {
            // A read that fails on a file replaced since the walk (by a
            // directory: EISDIR) says so.
            PackReader::Disk(d) => {
                read_exact(&mut d.file, buf, d.path).map_err(|e| match d.check_stamp() {
                    Err(changed @ Error::Changed { .. }) => changed,
                    _ => e,
                })
            }
            PackReader::Tar(tar, at, path) => {
                tar.read_at(buf, *at).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Error::Changed {
                        path: (*path).into(),
                        what: "is cut short in its tar stream (the tar file shrank)",
                    },
                    _ => Error::Io {
                        path: tar.shown.clone(),
                        op: "cannot read the tar stream's content",
                        source: e,
                    },
                })?;
                *at += buf.len() as u64;
                Ok(())
            }
            PackReader::Held(rest, path) => {
                // The writer asks for no more than the size the walk saw,
                // which is the size held.
                let (head, tail) =
                    rest.split_at_checked(buf.len())
                        .ok_or_else(|| Error::Changed {
                            path: (*path).into(),
                            what: "shrank",
                        })?;
                buf.copy_from_slice(head);
                *rest = tail;
                Ok(())
            }
        }
    }

    /// A large file's later chunk: seek, read nothing.
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        match self {
            PackReader::Disk(d) => d.skip(n),
            PackReader::Tar(_, at, _) => {
                *at += n;
                Ok(())
            }
            PackReader::Held(rest, _) => {
                *rest = rest.get(n as usize..).unwrap_or_default();
                Ok(())
            }
        }
    }

    /// After reading: still the file the walk saw.
    fn finish(self) -> Result<(), Error> {
        match self {
            PackReader::Disk(d) => d.check_stamp(),
            // (A tar file changed since it was read shows in the second
            // pass's fingerprints.)
            PackReader::Tar(..) | PackReader::Held(..) => Ok(()),
        }
    }
}

impl DiskReader<'_> {
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        use std::io::{Seek, SeekFrom};
        let to = i64::try_from(n).map_err(|_| Error::Changed {
            path: self.path.into(),
            what: "is too large",
        })?;
        self.file
            .seek(SeekFrom::Current(to))
            .map_err(|e| Error::Io {
                path: self.path.into(),
                op: "cannot seek",
                source: e,
            })?;
        Ok(())
    }

    /// The open file is the regular file the walk saw, with the same size
    /// and mtime: not replaced, not visibly written since. (Not the ctime:
    /// `chmod` or a new hard link move it without touching the content,
    /// which the second pass compares anyway.)
    fn check_stamp(&self) -> Result<(), Error> {
        let src = self.src;
        let m = self
            .file
            .metadata()
            .map_err(|e| Error::io(&self.roots[src.root].dir.join(&src.rel), "cannot stat", e))?;
        let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
        let what = if !m.file_type().is_file() || (m.dev(), m.ino()) != (src.dev, src.ino) {
            "was replaced"
        } else if m.len() != self.size {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64]) -> Manifest {
        let entries = sizes
            .iter()
            .enumerate()
            .map(|(k, &size)| Entry {
                path: format!("workspace/f{k}").into(),
                kind: EntryKind::File(FileMeta {
                    size,
                    mtime_ns: 0,
                    executable: false,
                    sha256: Sha256::default(),
                    chunks: vec![Sha256::default(); chunk_count(size) as usize].into(),
                }),
            })
            .collect();
        Manifest {
            version: Default::default(),
            harness: None,
            entries,
        }
    }

    #[test]
    fn the_smallest_files_are_held_within_the_budget() {
        let m = files(&[10, 30, 20, 20, 5 << 20, 0]);
        // 0 + 10 + 20 + 20 = 50 fit; 30 more would not.
        assert_eq!(hold_max(&m, 50), Some(20));
        assert_eq!(hold_max(&m, 79), Some(20));
        assert_eq!(hold_max(&m, 80), Some(30));
        // Files of one size go together: with room for one of the two
        // 20-byte files, neither is held.
        assert_eq!(hold_max(&m, 30), Some(10));
        // An empty file costs nothing and is held with any budget.
        assert_eq!(hold_max(&m, 1), Some(0));
        // No budget: nothing held, so every file is read twice.
        assert_eq!(hold_max(&m, 0), None);
        assert_eq!(hold_max(&files(&[7]), 6), None);
        // Never a file over the size limit, whatever the budget.
        assert_eq!(hold_max(&m, u64::MAX), Some(30));
    }

    #[test]
    fn the_hold_is_bounded_by_memory() {
        let limit = sys::memory_limit();
        assert!(limit > 0);
        let hold = hold_budget(None);
        assert!(hold <= 256 << 20 && hold <= limit / 16, "{hold} of {limit}");
        assert_eq!(hold_budget(Some(0)), 0);
        assert_eq!(hold_budget(Some(u64::MAX)), limit / 2);
    }
}
