//! `seal`: the merged view written as a fresh packet, atomically, at a cost
//! proportional to what changed.
//!
//! Changes are held (readers keep going) while the merged view is walked
//! and written. Unchanged files keep their manifest hashes and their bytes
//! come from the old packet: chunks a mount already verified (and every
//! chunk of a packet this daemon wrote) are copied as they are, the others
//! are verified against the parent's hashes as they are copied; only new
//! and changed content gets new hashes. The output
//! follows the same exclusion and symlink policy as `pack`, so sealing a
//! mount gives the bytes `pack` gives for an extracted copy of its view.

mod collect;
mod contents;
mod copies;
mod rebase;
mod receipt;

use collect::refusal;
use contents::SealContents;
use receipt::receipt;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use super::error::{Error, Result};
use super::index::Idx;
use super::ino::Ino;
use super::journal::Record;
use super::node::{ChunkMap, Content, Kind};
use super::split;
use super::state::{Lower, Ref};
use super::{Overlay, Stale};
use crate::output::parts::copy_runs;
use crate::output::{
    Check, ContentReader, Contents, Keep, Output, RemoteOutput, Uploaded, WriteOptions, WriteStats,
    Writing, hash_new, write_in_order,
};
use crate::packet::digest::{Digest, Sha256, chunk_list_hash};
use crate::packet::format::{Limits, MAX_MTIME_NS, Version, chunk_count};
use crate::packet::layout::Layout;
use crate::packet::manifest::{Entry, EntryKind, FileMeta, Manifest};
use crate::packet::path::Part;
use crate::packet::reader::Packet;
use crate::source::policy::Policy;
use crate::source::report::{Clamped, EntryType, ScanReport, Step, judge};
use crate::store::{CopySource, Location, Settings};

/// What to seal, and how.
pub struct SealOptions {
    /// Where the new packet goes.
    pub output: PathBuf,
    /// Its mode.
    pub mode: u32,
    /// Record every mtime as 0.
    pub zero_mtimes: bool,
    /// Refuse symlinks leaving their part.
    pub reject_external_symlinks: bool,
    /// `--exclude` patterns.
    pub exclude: Vec<String>,
    /// `--keep` patterns.
    pub keep: Vec<String>,
    /// Limits of the new packet.
    pub limits: Limits,
    /// Absolute spellings of each part's root where it is mounted, for
    /// rebasing absolute symlinks into it (empty: none are rebased).
    pub roots: HashMap<Part, Vec<String>>,
    /// Compute the SHA-256 of the whole packet file (`--file-sha256`).
    pub file_sha256: bool,
    /// The format version to write.
    pub version: Version,
    /// Test hook: pause at named points (see `barrier`).
    pub barrier: Option<PathBuf>,
    /// After sealing, continue on the new packet with an empty upper
    /// directory.
    pub rebase: bool,
    /// Upload the packet to an object instead of writing `output` (which
    /// then only names it).
    pub remote: Option<RemoteSeal>,
    /// Set to give the seal up (its client went away): it stops at the
    /// next file it reads or step it takes, unless it has committed the
    /// packet, after which it runs to the end.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// A seal uploaded to an S3-compatible store.
pub struct RemoteSeal {
    /// Where the packet goes (`s3://BUCKET/KEY`).
    pub location: Location,
    /// How requests behave.
    pub settings: Settings,
    /// Where the parent packet is in the store, if it is: unchanged runs of
    /// it are copied by the store instead of read and sent, when it is in
    /// the same bucket, is the parent (its manifest's digest and length,
    /// checked first), and no `--file-sha256` is asked (that needs every
    /// byte here).
    pub parent: Option<Location>,
    /// With `--rebase`: how the mount reads the uploaded packet it moves
    /// onto (its own cache and fetch settings); without, `None` (no cache
    /// is opened for a seal that does not read it).
    pub reading: Option<crate::packet::backing::RemoteReading>,
    /// Fetch and check every byte the store copies from the parent that
    /// the seal has not seen in the parent's object, before the upload
    /// completes (`--verify-copies`; without it, only when they are few:
    /// see [`copies`]).
    pub verify_copies: bool,
}

impl SealOptions {
    /// Refuses to go on when the seal was given up (see `cancel`).
    fn refuse_if_cancelled(&self) -> Result<()> {
        match &self.cancel {
            Some(c) if c.load(std::sync::atomic::Ordering::Relaxed) => Err(Error::Refused {
                path: crate::packet::path::shown_path(&self.output),
                kind: crate::packet::error::ErrorKind::Cancelled,
                reason: "the seal was given up before it placed the packet (its client went \
                         away): nothing was written and the mount is as it was"
                    .into(),
            }),
            _ => Ok(()),
        }
    }
}

/// One change, in the receipt.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Change {
    /// A new entry.
    Added {
        /// Its path.
        path: String,
        /// `file`, `dir` or `symlink`.
        #[serde(rename = "type")]
        kind: &'static str,
        /// Content hash of a file.
        #[serde(skip_serializing_if = "Option::is_none")]
        sha256: Option<Sha256>,
    },
    /// An entry whose content or metadata changed.
    Modified {
        /// Its path.
        path: String,
        /// Previous content hash of a file.
        #[serde(skip_serializing_if = "Option::is_none")]
        old_sha256: Option<Sha256>,
        /// New content hash of a file.
        #[serde(skip_serializing_if = "Option::is_none")]
        new_sha256: Option<Sha256>,
        /// For a file with chunks: how many of its chunks are not the
        /// parent's at the same place (a partly written file: an append
        /// changes one or two).
        #[serde(skip_serializing_if = "Option::is_none")]
        chunks_changed: Option<u64>,
    },
    /// An entry gone.
    Deleted {
        /// Its path.
        path: String,
        /// Content hash of a file.
        #[serde(skip_serializing_if = "Option::is_none")]
        old_sha256: Option<Sha256>,
    },
    /// A file or symlink moved (possibly changed too).
    Renamed {
        /// Old path.
        from: String,
        /// New path.
        to: String,
        /// Previous content hash of a file.
        #[serde(skip_serializing_if = "Option::is_none")]
        old_sha256: Option<Sha256>,
        /// New content hash of a file.
        #[serde(skip_serializing_if = "Option::is_none")]
        new_sha256: Option<Sha256>,
    },
}

/// What a seal did.
#[derive(Debug, Serialize)]
pub struct SealOutcome {
    /// The new packet.
    pub output: PathBuf,
    /// Its digest.
    pub digest: Digest,
    /// The digest of the packet the mount served.
    pub parent: Digest,
    /// SHA-256 of the new packet file, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_sha256: Option<Sha256>,
    /// Its length.
    pub packet_bytes: u64,
    /// Entries in it.
    pub entries: u64,
    /// Entries added.
    pub added: u64,
    /// Entries modified.
    pub modified: u64,
    /// Entries deleted.
    pub deleted: u64,
    /// Entries renamed.
    pub renamed: u64,
    /// Entries carried over unchanged.
    pub reused: u64,
    /// Bytes hashed to compute new hashes (new and changed content, and the
    /// manifest).
    pub bytes_hashed: u64,
    /// Bytes of unchanged content hashed to verify them as they were copied.
    pub bytes_verified: u64,
    /// Bytes of unchanged content copied from the old packet.
    pub bytes_copied: u64,
    /// For an upload: bytes sent, bytes the store copied from the parent
    /// packet, parts.
    #[serde(flatten)]
    pub upload: Option<Uploaded>,
    /// For an upload: bytes the store copied from the parent that this
    /// seal did not see in the parent's object and find to be the
    /// packet's (0 when every copied byte was; see `copies`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unverified_copied_bytes: Option<u64>,
    /// What the policy left out, and other reports as for `pack`.
    #[serde(flatten)]
    pub report: ScanReport,
    /// Whether the mount now serves the new packet.
    pub rebased: bool,
    /// A digest-named file output held the packet already (verified):
    /// nothing was written (without `--rebase` only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_there: bool,
    /// Every change, for the receipt.
    #[serde(skip)]
    pub changes: Vec<Change>,
}

/// A file of the merged view, as the walk found it.
#[derive(Clone, Debug)]
struct FileItem {
    /// Where its bytes are read from.
    from: Source,
    /// The lower entry whose hashes apply (unchanged content).
    reuse: Option<Idx>,
    /// The lower entry it descends from (for the receipt).
    origin: Option<Idx>,
    size: u64,
    mtime_ns: u64,
    executable: bool,
    /// A file copied up by chunk (`from` is its data file): the chunks
    /// still read from the lower entry, whose hashes apply to them.
    chunks: Option<Arc<ChunkMap>>,
}

impl FileItem {
    /// The parent's chunk `k` of a file copied up by chunk, when this
    /// file's chunk `k` is still it: its lower entry's chunk of the same
    /// bytes (within the file's size, the same range). In a packet that
    /// carries no whole-file hash for it (`/2`), its hash is the parent's
    /// and its bytes are copied, not hashed.
    fn lower_chunk(&self, k: u64, version: Version) -> Option<Idx> {
        let map = self.chunks.as_ref()?;
        (!version.whole_file_hash(self.size) && self.reads_lower(k)).then_some(map.lower)
    }

    /// Whether chunk `k` of a file copied up by chunk is read from its
    /// lower entry (the same bytes at the same place; a hole in its data
    /// file).
    fn reads_lower(&self, k: u64) -> bool {
        let c = crate::packet::format::CHUNK_SIZE;
        self.chunks.as_ref().is_some_and(|map| {
            map.is_lower(k) && ((k + 1) * c).min(self.size) == ((k + 1) * c).min(map.lower_size)
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Source {
    Lower(Idx),
    Upper(u64),
}

/// An entry of the merged view.
struct Item {
    path: String,
    /// Its inode number on the mount.
    ino: Ino,
    kind: ItemKind,
    /// The lower entry a directory or symlink descends from.
    origin: Option<Idx>,
}

/// How far a rebase went: whether the mount serves the new packet, and
/// the names it gave other numbers (their directory's number, the name),
/// for the kernel to drop once changes may go on.
#[derive(Default)]
struct Moved {
    /// The mount serves the new packet.
    serves_new: bool,
    /// Names given other numbers: `(directory's number, name)`.
    renumbered: Vec<(Ino, String)>,
}

enum ItemKind {
    Dir,
    /// Its target as stored, and whether that differs from the target on
    /// the mount (an absolute one rebased).
    Symlink(String, bool),
    File(FileItem),
}

impl Overlay {
    /// Seals the merged view into `opts.output`. Changes wait until it is
    /// done; readers do not.
    pub fn seal(&self, opts: &SealOptions, progress: &(dyn Fn(u64) + Sync)) -> Result<SealOutcome> {
        let mut renumbered = Vec::new();
        let sealed = self.seal_holding(opts, progress, &mut renumbered);
        // Once changes may go on: a node forgotten after this finds the
        // gate open and is dropped at once (see `forget`).
        self.drop_forgotten();
        // Names a rebase gave other numbers, told to the kernel once
        // changes may go on: it drops a name under its directory's lock,
        // which an operation waiting for the seal may hold. Until then a
        // cached name still leads to the file that kept the number.
        if let Some(f) = &*self.invalidate.lock() {
            for (dir, name) in &renumbered {
                f(Stale::Entry(*dir, name));
            }
        }
        sealed
    }

    /// Holds changes at a moment no `write` call is half sent: a request
    /// the kernel may have cut off a write is waited out until the rest
    /// arrives, or [`split::SETTLE`] has passed (see `split`). A writer
    /// that keeps leaving such requests open holds a seal up at most five
    /// times that long.
    fn hold_changes(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        use std::time::{Duration, Instant};
        let give_up = Instant::now() + 5 * split::SETTLE;
        loop {
            let hold = self.mutations.write();
            let now = Instant::now();
            let wait = self.splits.unsettled(now);
            if wait.is_zero() || now >= give_up {
                return hold;
            }
            drop(hold);
            std::thread::sleep(wait.min(Duration::from_micros(200)));
        }
    }

    /// Waits for the seal before this one to end, unless this one is
    /// given up meanwhile (its client went away): a seal queued behind a
    /// long one must not run, and move the mount, long after its client
    /// stopped waiting. The wait for changes to stop that follows is
    /// short (the operations in progress), so it need not be given up.
    fn take_turn(&self, opts: &SealOptions) -> Result<parking_lot::MutexGuard<'_, ()>> {
        loop {
            opts.refuse_if_cancelled()?;
            if let Some(turn) = self
                .seal_turn
                .try_lock_for(std::time::Duration::from_millis(20))
            {
                return Ok(turn);
            }
        }
    }

    /// [`Overlay::seal`], holding changes, in phases: collect the merged
    /// view, build and check the manifest, hash new content, write the
    /// packet, commit it, rebase onto it, and report. The names a rebase
    /// gave other numbers go to `renumbered` (their directory's number and
    /// the name).
    fn seal_holding(
        &self,
        opts: &SealOptions,
        progress: &(dyn Fn(u64) + Sync),
        renumbered: &mut Vec<(Ino, String)>,
    ) -> Result<SealOutcome> {
        let _turn = self.take_turn(opts)?;
        let _hold = self.hold_changes();
        // A seal given up while it waited for changes to stop.
        opts.refuse_if_cancelled()?;
        let t0 = std::time::Instant::now();
        let phase = |name: &str| {
            tracing::debug!(phase = name, ms = t0.elapsed().as_millis() as u64, "seal")
        };
        // Nothing can rebase while the seal holds changes.
        let lower = self.lower();
        let harness = lower.manifest().harness;
        let policy =
            Policy::new(harness, &opts.exclude, &opts.keep).map_err(|reason| Error::Refused {
                path: String::new(),
                kind: crate::packet::error::ErrorKind::BadPattern,
                reason,
            })?;
        let (items, mut report) = self.collect(opts, &policy)?;
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Collected);
        phase("collected");
        opts.refuse_if_cancelled()?;

        let mut manifest = manifest_of(lower.manifest(), &items, opts.zero_mtimes, opts.version);
        report
            .check_manifest(&manifest, &opts.limits, opts.reject_external_symlinks)
            .map_err(refusal)?;
        phase("validated");

        let sources = SealContents::new(opts, self, &lower, &items);
        let stats = WriteStats::default();
        hash_new_content(&mut manifest, &sources, &stats, lower.manifest())?;
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Hashed);
        phase("hashed");
        opts.refuse_if_cancelled()?;

        // A digest-named file output is named now, before anything is
        // written; the packet already there (verified whole) is not
        // written again, unless the mount is to move onto it (then it is
        // written again, the same bytes, and the mount moves onto the
        // file the seal wrote, as always).
        let (output, there) = match &opts.remote {
            None if crate::output::digest_named(&opts.output) => {
                let bytes = manifest.encode();
                let digest = Digest::of_manifest(&bytes);
                let to = crate::output::digest_name(&opts.output, &digest);
                let there = match crate::output::at_digest_name(&to, &digest, &opts.limits)? {
                    crate::output::AtDigestName::Same { len, file_sha256 } if !opts.rebase => {
                        Some(Written {
                            output: None,
                            unverified_copied_bytes: 0,
                            digest,
                            file_sha256: opts.file_sha256.then_some(file_sha256),
                            packet_bytes: len,
                            manifest_len: bytes.len() as u64,
                        })
                    }
                    _ => None,
                };
                (to, there)
            }
            _ => (opts.output.clone(), None),
        };
        // A digest-named object likewise: its upload starts under its
        // name; one already there is compared as the packet is written.
        let named_remote = match &opts.remote {
            Some(r) if crate::output::digest_named(&opts.output) => {
                let digest = Digest::of_manifest(&manifest.encode());
                Some(RemoteSeal {
                    location: crate::output::digest_location(&r.location, &digest),
                    settings: r.settings.clone(),
                    parent: r.parent.clone(),
                    reading: r.reading.clone(),
                    verify_copies: r.verify_copies,
                })
            }
            _ => None,
        };
        let remote = named_remote.as_ref().or(opts.remote.as_ref());
        let output = &match remote {
            Some(r) => std::path::PathBuf::from(r.location.shown()),
            None => output,
        };
        let already_there = there.is_some();
        let (written, committed, upload) = match there {
            Some(written) => (written, None, None),
            None => {
                let mut written = write_packet(
                    opts, output, remote, &manifest, &sources, &stats, progress, &phase,
                )?;
                let (committed, upload) = commit_packet(
                    opts,
                    output,
                    &lower,
                    written.output.take(),
                    &written.digest,
                    &phase,
                )?;
                (written, committed, upload)
            }
        };

        let placed = match (&committed, remote) {
            (Some(c), _) => Some(rebase::Placed::File(c)),
            (None, Some(remote)) => Some(rebase::Placed::Remote(remote)),
            (None, None) => None,
        };
        if let Some(placed) = placed.filter(|_| opts.rebase) {
            let mut moved = Moved::default();
            let rebased = self.rebase_onto(
                output,
                (placed, written.digest),
                &items,
                &opts.limits,
                opts.barrier.as_deref(),
                &mut moved,
            );
            renumbered.append(&mut moved.renumbered);
            rebased.map_err(|e| Error::Rebase {
                output: crate::packet::path::shown_path(output),
                digest: written.digest.to_string(),
                moved: moved.serves_new,
                source: Box::new(e),
            })?;
        }

        report.sort();
        let changes = receipt(lower.manifest(), &items, &manifest);
        let count = |f: fn(&Change) -> bool| changes.iter().filter(|c| f(c)).count() as u64;
        Ok(SealOutcome {
            output: output.clone(),
            digest: written.digest,
            parent: lower.packet.digest,
            file_sha256: written.file_sha256,
            packet_bytes: written.packet_bytes,
            entries: manifest.entries.len() as u64,
            added: count(|c| matches!(c, Change::Added { .. })),
            modified: count(|c| matches!(c, Change::Modified { .. })),
            deleted: count(|c| matches!(c, Change::Deleted { .. })),
            renamed: count(|c| matches!(c, Change::Renamed { .. })),
            reused: items
                .iter()
                .filter(|it| matches!(&it.kind, ItemKind::File(f) if f.reuse.is_some()))
                .count() as u64,
            bytes_hashed: stats.hashed.load(Ordering::Relaxed) + written.manifest_len,
            bytes_verified: stats.verified.load(Ordering::Relaxed),
            bytes_copied: stats.copied.load(Ordering::Relaxed),
            report,
            rebased: opts.rebase,
            unverified_copied_bytes: upload.map(|_| written.unverified_copied_bytes),
            already_there,
            upload,
            changes,
        })
    }
}

/// Writes the packet of `manifest` (complete: every hash known) to a
/// temporary file beside `opts.output`, in one ordered pass, and syncs
/// it. Chunks of the parent that were verified earlier are trusted only
/// in the file they were verified in.
#[allow(clippy::too_many_arguments)]
fn write_packet(
    opts: &SealOptions,
    to: &std::path::Path,
    remote: Option<&RemoteSeal>,
    manifest: &Manifest,
    sources: &SealContents<'_>,
    stats: &WriteStats,
    progress: &(dyn Fn(u64) + Sync),
    phase: &dyn Fn(&str),
) -> Result<Written> {
    let lower = sources.lower;
    let manifest_bytes = manifest.encode();
    let manifest_len = manifest_bytes.len() as u64;
    let layout = Layout::compute(manifest, manifest_len);
    let mut copying = None;
    let output = match remote {
        None => {
            let output = Output::create(to)?;
            output.size_for(&layout)?;
            Writing::File(output)
        }
        Some(remote) => {
            let mut output = RemoteOutput::create(&remote.location, &remote.settings)?;
            let parent = match copy_source(opts, remote, lower) {
                Some((src, from)) => {
                    let runs = copy_runs(lower.manifest(), &lower.packet.layout, manifest, &layout);
                    copying = Some(from);
                    Some((src, runs))
                }
                None => None,
            };
            output.plan(&layout, parent)?;
            Writing::Remote(Box::new(output))
        }
    };
    crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Sized);
    phase("sized");
    // The bits are forgotten before the copy if the parent moved, and
    // the copy fails if it moved during it.
    let epoch = lower.verifier.settle(&lower.packet)?;
    // Around the page cache: the packet is shipped, or read back
    // lazily by a rebased mount; copying it into the cache cost more
    // than it saved (docs/SEMANTICS.md, "Seal").
    let file_sha256 = write_in_order(
        output.dest(),
        WriteOptions {
            direct: true,
            file_sha256: opts.file_sha256,
        },
        manifest,
        &manifest_bytes,
        &layout,
        sources,
        stats,
        progress,
    )?;
    lower.verifier.check_still(&lower.packet, epoch)?;
    let unverified_copied_bytes = match (&copying, &output) {
        (Some(from), Writing::Remote(r)) => {
            prove_copies(from, &r.copied_from_parent(), opts, phase)?
        }
        _ => 0,
    };
    // Files partly copied by the store were not hashed whole here.
    for i in (0..manifest.entries.len()).filter(|_| copying.is_none()) {
        if sources.check_whole(i)
            && let ItemKind::File(FileItem {
                from: Source::Lower(idx),
                ..
            }) = &sources.items[i].kind
        {
            lower.verifier.mark_whole(&lower.packet, *idx, epoch);
        }
    }
    crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Written);
    phase("written");
    // The last moment to give up: the packet goes into place next.
    opts.refuse_if_cancelled()?;
    if let Writing::File(o) = &output {
        o.sync_data()?;
    }
    crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Synced);
    phase("synced");
    Ok(Written {
        unverified_copied_bytes,
        output: Some(output),
        digest: Digest::of_manifest(&manifest_bytes),
        file_sha256,
        packet_bytes: layout.total_len(),
        manifest_len,
    })
}

/// Puts the written packet in place at `to`: the file committed, or the
/// upload completed.
fn commit_packet(
    opts: &SealOptions,
    to: &std::path::Path,
    lower: &Lower,
    output: Option<Writing>,
    digest: &Digest,
    phase: &dyn Fn(&str),
) -> Result<(Option<crate::output::Committed>, Option<Uploaded>)> {
    let output = match output {
        None => return Ok((None, None)),
        Some(Writing::File(o)) => o,
        Some(Writing::Remote(r)) => {
            let uploaded = r.commit(digest)?;
            crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Committed);
            phase("committed");
            return Ok((None, Some(uploaded)));
        }
    };
    // Over the packet this mount serves (`--rebase` onto the same
    // path), the rename is the seal's own change to it.
    let committed = if lower.serves(to) {
        lower
            .verifier
            .around_own_rename(&lower.packet, || output.commit(opts.mode))?
    } else {
        output.commit(opts.mode)?
    };
    crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Committed);
    phase("committed");
    Ok((Some(committed), None))
}

/// The parent packet's object to copy unchanged runs from, if the seal
/// may: the object a remote mount reads (pinned to the ETag it was opened
/// with), else the one `remote.parent` names once it is checked to be the
/// parent (its manifest's digest and its length, read now; its ETag then
/// pins every copy); in the bucket the seal uploads to, and with no
/// `--file-sha256` asked. Otherwise the seal sends every byte, and the
/// log says why.
fn copy_source(
    opts: &SealOptions,
    remote: &RemoteSeal,
    lower: &Lower,
) -> Option<(CopySource, copies::CopyParent)> {
    use crate::store::ReadAt;
    let mounted = lower.packet.backing().spool().map(|spool| spool.location());
    let Some(Location::S3 { bucket, key }) = mounted.or(remote.parent.as_ref()) else {
        return None;
    };
    let skip = |why: &str| {
        tracing::info!(parent = %format!("s3://{bucket}/{key}"), why, "the seal sends every byte");
        None
    };
    if !matches!(&remote.location, Location::S3 { bucket: b, .. } if b == bucket) {
        return skip("the parent is in another bucket");
    }
    if opts.file_sha256 {
        return skip("--file-sha256 needs every byte here");
    }
    let (etag, spool) = match lower.packet.backing().spool() {
        Some(spool) => (spool.remote().etag().map(str::to_owned), spool.clone()),
        None => {
            let parent = remote.parent.as_ref()?;
            let object = match crate::store::open_remote(parent, &remote.settings, 256 * 1024) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the parent's object");
                    return None;
                }
            };
            let raw =
                crate::packet::reader::read_raw_manifest(&object as &dyn ReadAt, &opts.limits).ok();
            if raw.map(|r| r.digest) != Some(lower.packet.digest)
                || object.len() != lower.packet.layout.total_len()
            {
                return skip("the object named as the parent is not the parent packet");
            }
            let etag = object.etag().map(str::to_owned);
            // Only what is fetched from the object proves anything of it:
            // no cache, nothing read ahead.
            let p = &lower.packet;
            let spool = crate::store::spool::Spool::new(
                parent.clone(),
                Box::new(object),
                p.units(),
                Some(crate::packet::backing::gaps_of(&p.manifest, &p.layout)),
                &std::env::temp_dir(),
                None,
                crate::store::spool::SpoolOptions::default(),
            );
            match spool {
                Ok(s) => (etag, s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the parent's object");
                    return None;
                }
            }
        }
    };
    let Some(etag) = etag else {
        return skip("the parent's object has no strong ETag to pin copies to");
    };
    let source = CopySource {
        bucket: bucket.clone(),
        key: key.clone(),
        etag,
        len: lower.packet.layout.total_len(),
    };
    Some((source, copies::CopyParent { spool }))
}

/// The bytes the store copies from the parent (`copied`, ranges of the
/// parent) that the seal has not seen in the parent's object, after
/// fetching and checking them when asked (`--verify-copies`) or when they
/// are few ([`copies::AUTO_VERIFY_MAX`]): 0 then, or the seal fails.
fn prove_copies(
    from: &copies::CopyParent,
    copied: &[std::ops::Range<u64>],
    opts: &SealOptions,
    phase: &dyn Fn(&str),
) -> Result<u64> {
    let unverified = from.unverified(copied);
    let asked = opts.remote.as_ref().is_some_and(|r| r.verify_copies);
    if unverified == 0 || !(asked || unverified <= copies::AUTO_VERIFY_MAX) {
        if unverified > 0 {
            tracing::info!(
                unverified,
                "bytes the store copies from the parent were not seen in its object; \
                 --verify-copies fetches and checks them"
            );
        }
        return Ok(unverified);
    }
    let t = std::time::Instant::now();
    from.prove(copied)?;
    tracing::info!(bytes = unverified, elapsed = ?t.elapsed(), "copies proven");
    phase("copies proven");
    Ok(from.unverified(copied))
}

/// A packet written and synced, not yet in place.
struct Written {
    /// Of the bytes the store copies (none for a file).
    unverified_copied_bytes: u64,
    /// The packet written (taken by the commit).
    output: Option<Writing>,
    digest: Digest,
    file_sha256: Option<Sha256>,
    packet_bytes: u64,
    manifest_len: u64,
}

/// The manifest of `items` in `version`: the old manifest's hashes for
/// reused content, placeholders for the rest until [`hash_new_content`]
/// fills them in.
fn manifest_of(old: &Manifest, items: &[Item], zero_mtimes: bool, version: Version) -> Manifest {
    // The harness part cannot be removed on a mount, so its kind carries over.
    let has_harness = items.iter().any(|i| i.path == "harness");
    let mut manifest = Manifest {
        version,
        harness: if has_harness { old.harness } else { None },
        entries: Vec::with_capacity(items.len()),
    };
    for it in items {
        let kind = match &it.kind {
            ItemKind::Dir => EntryKind::Dir,
            ItemKind::Symlink(t, _) => EntryKind::Symlink(t.as_str().into()),
            ItemKind::File(f) => {
                let (sha256, mut chunks): (Sha256, Box<[Sha256]>) =
                    match f.reuse.and_then(|i| old.entries[i as usize].file()) {
                        // A `/2` id from a `/1` parent follows from the chunk
                        // list; a whole-file hash a `/2` parent lacks is
                        // computed (`SealContents::check`).
                        Some(m) if version.whole_file_hash(m.size) => (m.sha256, m.chunks.clone()),
                        Some(m) => (chunk_list_hash(&m.chunks), m.chunks.clone()),
                        None => (
                            Sha256::default(),
                            vec![Sha256::default(); chunk_count(f.size) as usize].into(),
                        ),
                    };
                // A file copied up by chunk keeps the parent's hash of
                // each chunk it did not change.
                for (k, c) in chunks.iter_mut().enumerate() {
                    if let Some(i) = f.lower_chunk(k as u64, version)
                        && let Some(old) = old.entries[i as usize].file()
                        && let Some(h) = old.chunks.get(k)
                    {
                        *c = *h;
                    }
                }
                EntryKind::File(FileMeta {
                    size: f.size,
                    mtime_ns: if zero_mtimes { 0 } else { f.mtime_ns },
                    executable: f.executable,
                    sha256,
                    chunks,
                })
            }
        };
        manifest.entries.push(Entry {
            path: it.path.as_str().into(),
            kind,
        });
    }
    manifest
}

/// Hashes new content on all cores and completes `manifest` with it, so
/// that the manifest is complete before anything is written and the
/// packet goes out in one ordered pass.
fn hash_new_content(
    manifest: &mut Manifest,
    sources: &SealContents<'_>,
    stats: &WriteStats,
    old: &Manifest,
) -> Result<()> {
    for h in hash_new(manifest, sources, stats, Keep::default(), &|_| {})? {
        // Parent content hashed for a whole-file hash its `/2` manifest
        // lacks: its chunks must be the parent's, or the new packet would
        // vouch for bytes the parent's hashes refuse.
        if let ItemKind::File(FileItem {
            from: Source::Lower(idx),
            ..
        }) = &sources.items[h.entry].kind
            && let Some(f) = old.entries[*idx as usize].file()
            && *f.chunks != *h.chunks
        {
            let at = f.chunks.iter().zip(&h.chunks).position(|(a, b)| a != b);
            let start = at.unwrap_or(0) as u64 * crate::packet::format::CHUNK_SIZE;
            return Err(Error::Packet(crate::output::content_mismatch(
                &old.entries[*idx as usize].path,
                start,
                (start + crate::packet::format::CHUNK_SIZE).min(f.size),
            )));
        }
        if let EntryKind::File(f) = &mut manifest.entries[h.entry].kind {
            f.sha256 = h.sha256;
            f.chunks = h.chunks.into();
        }
    }
    Ok(())
}
