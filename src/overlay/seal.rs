//! `seal`: the merged view written as a fresh packet, atomically, at a cost
//! proportional to what changed.
//!
//! Changes are held (readers keep going) while the merged view is walked
//! and written. Unchanged files keep their manifest hashes and their bytes
//! come from the old packet: chunks a mount already verified are copied as
//! they are (by the kernel when a file is large), the others are verified
//! as they are copied; only new and changed content is hashed. The output
//! follows the same exclusion and symlink policy as `pack`, so sealing a
//! mount gives the bytes `pack` gives for an extracted copy of its view.

use std::collections::{BTreeMap, HashMap, HashSet};
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
use super::node::{Content, Kind};
use super::split;
use super::state::{Lower, Ref};
use super::{Overlay, Stale};
use crate::output::{
    Check, ContentReader, Contents, Keep, Output, WriteOptions, WriteStats, hash_new,
    write_in_order,
};
use crate::packet::digest::{Digest, Sha256};
use crate::packet::format::{Limits, MAX_MTIME_NS, chunk_count};
use crate::packet::layout::Layout;
use crate::packet::manifest::{Entry, EntryKind, FileMeta, Manifest};
use crate::packet::path::{Part, check_path};
use crate::packet::reader::Packet;
use crate::source::policy::{ChildType, Policy, Verdict};
use crate::source::walk::{Clamped, Dropped, Excluded, ScanReport};

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
    /// Test hook: pause at named points (see `barrier`).
    pub barrier: Option<PathBuf>,
    /// After sealing, continue on the new packet with an empty upper
    /// directory.
    pub rebase: bool,
    /// Set to give the seal up (its client went away): it stops at the
    /// next file it reads or step it takes, unless it has committed the
    /// packet, after which it runs to the end.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl SealOptions {
    /// Refuses to go on when the seal was given up (see `cancel`).
    fn go_on(&self) -> Result<()> {
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
    /// What the policy left out, and other reports as for `pack`.
    #[serde(flatten)]
    pub report: ScanReport,
    /// Whether the mount now serves the new packet.
    pub rebased: bool,
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
    moved: bool,
    renamed: Vec<(Ino, String)>,
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
        let mut renamed = Vec::new();
        let sealed = self.seal_holding(opts, progress, &mut renamed);
        // Once changes may go on: a node forgotten after this finds the
        // gate open and is dropped at once (see `forget`).
        self.drop_forgotten();
        // Names a rebase gave other numbers, told to the kernel once
        // changes may go on: it drops a name under its directory's lock,
        // which an operation waiting for the seal may hold. Until then a
        // cached name still leads to the file that kept the number.
        if let Some(f) = &*self.invalidate.lock() {
            for (dir, name) in &renamed {
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
            opts.go_on()?;
            if let Some(turn) = self
                .seal_turn
                .try_lock_for(std::time::Duration::from_millis(20))
            {
                return Ok(turn);
            }
        }
    }

    /// [`Overlay::seal`], holding changes; the names a rebase gave other
    /// numbers go to `renamed` (their directory's number and the name).
    fn seal_holding(
        &self,
        opts: &SealOptions,
        progress: &(dyn Fn(u64) + Sync),
        renamed: &mut Vec<(Ino, String)>,
    ) -> Result<SealOutcome> {
        let _turn = self.take_turn(opts)?;
        let _hold = self.hold_changes();
        // A seal given up while it waited for changes to stop.
        opts.go_on()?;
        let t0 = std::time::Instant::now();
        let phase = |name: &str| {
            tracing::debug!(phase = name, ms = t0.elapsed().as_millis() as u64, "seal")
        };
        // Nothing can rebase while the seal holds changes.
        let lower = self.lower();
        let parent = lower.packet.digest;
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
        opts.go_on()?;

        // The manifest: known hashes for reused content, placeholders for
        // the rest until they are hashed.
        let old = lower.manifest();
        // The harness part cannot be removed on a mount, so its kind carries over.
        let has_harness = items.iter().any(|i| i.path == "harness");
        let mut manifest = Manifest {
            harness: if has_harness { harness } else { None },
            entries: Vec::with_capacity(items.len()),
        };
        for it in &items {
            let kind = match &it.kind {
                ItemKind::Dir => EntryKind::Dir,
                ItemKind::Symlink(t, _) => EntryKind::Symlink(t.as_str().into()),
                ItemKind::File(f) => {
                    let (sha256, chunks) =
                        match f.reuse.and_then(|i| old.entries[i as usize].file()) {
                            Some(m) => (m.sha256, m.chunks.clone()),
                            None => (
                                Sha256::default(),
                                vec![Sha256::default(); chunk_count(f.size) as usize].into(),
                            ),
                        };
                    EntryKind::File(FileMeta {
                        size: f.size,
                        mtime_ns: if opts.zero_mtimes { 0 } else { f.mtime_ns },
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
        report
            .check_manifest(&manifest, &opts.limits, opts.reject_external_symlinks)
            .map_err(refusal)?;
        phase("validated");
        let sources = SealContents {
            opts,
            overlay: self,
            lower: &lower,
            direct: DirectLower::new(&lower),
            items: &items,
            stamps: items
                .iter()
                .enumerate()
                .filter(|(_, it)| {
                    matches!(&it.kind, ItemKind::File(f) if matches!(f.from, Source::Upper(_)))
                })
                .map(|(i, _)| (i, OnceLock::new()))
                .collect(),
        };
        // New content is hashed first, so the manifest is complete before
        // anything is written and the packet goes out in one ordered pass.
        let stats = WriteStats::default();
        for h in hash_new(&manifest, &sources, &stats, Keep::default(), &|_| {})? {
            if let EntryKind::File(f) = &mut manifest.entries[h.entry].kind {
                f.sha256 = h.sha256;
                f.chunks = h.chunks.into();
            }
        }
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Hashed);
        phase("hashed");
        opts.go_on()?;
        let manifest_bytes = manifest.encode();
        let manifest_len = manifest_bytes.len() as u64;
        let layout = Layout::compute(&manifest, manifest_len);
        let output = Output::create(&opts.output)?;
        output.size_for(&layout)?;
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Sized);
        phase("sized");

        // Chunks verified earlier are trusted only in the file they were
        // verified in: the bits are forgotten before the copy if it moved,
        // and the copy fails if it moved during it.
        let epoch = lower.verifier.settle(&lower.packet)?;
        // Around the page cache: the packet is shipped, or read back
        // lazily by a rebased mount; copying it into the cache cost more
        // than it saved (docs/SEMANTICS.md, "Seal").
        let file_sha256 = write_in_order(
            &output,
            WriteOptions {
                direct: true,
                file_sha256: opts.file_sha256,
            },
            &manifest,
            &manifest_bytes,
            &layout,
            &sources,
            &stats,
            progress,
        )?;
        lower.verifier.check_still(&lower.packet, epoch)?;
        for i in 0..manifest.entries.len() {
            if sources.check_whole(i)
                && let ItemKind::File(FileItem {
                    from: Source::Lower(idx),
                    ..
                }) = &sources.items[i].kind
            {
                lower.verifier.mark_whole(&lower.packet, *idx, epoch);
            }
        }
        let digest = Digest::of_manifest(&manifest_bytes);
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Written);
        phase("written");
        // The last moment to give up: the packet goes into place next.
        opts.go_on()?;
        output.sync_data()?;
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Synced);
        phase("synced");
        // Over the packet this mount serves (`--rebase` onto the same
        // path), the rename is the seal's own change to it.
        let written = if lower.serves(&opts.output) {
            lower
                .verifier
                .around_own_rename(&lower.packet, || output.commit(opts.mode))?
        } else {
            output.commit(opts.mode)?
        };
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Committed);
        phase("committed");
        if opts.rebase {
            let mut moved = Moved::default();
            let rebased = self.rebase_onto(
                &opts.output,
                (&written, digest),
                &items,
                &opts.limits,
                opts.barrier.as_deref(),
                &mut moved,
            );
            renamed.append(&mut moved.renamed);
            rebased.map_err(|e| Error::Rebase {
                output: crate::packet::path::shown_path(&opts.output),
                digest: digest.to_string(),
                moved: moved.moved,
                source: Box::new(e),
            })?;
        }

        let changes = receipt(old, &items, &manifest);
        let count = |f: fn(&Change) -> bool| changes.iter().filter(|c| f(c)).count() as u64;
        let added = count(|c| matches!(c, Change::Added { .. }));
        let modified = count(|c| matches!(c, Change::Modified { .. }));
        let deleted = count(|c| matches!(c, Change::Deleted { .. }));
        let renamed = count(|c| matches!(c, Change::Renamed { .. }));
        let entries = manifest.entries.len() as u64;
        report.sort();
        Ok(SealOutcome {
            output: opts.output.clone(),
            digest,
            parent,
            file_sha256,
            packet_bytes: layout.total_len(),
            entries,
            added,
            modified,
            deleted,
            renamed,
            reused: items
                .iter()
                .filter(|it| matches!(&it.kind, ItemKind::File(f) if f.reuse.is_some()))
                .count() as u64,
            bytes_hashed: stats.hashed.load(Ordering::Relaxed) + manifest_len,
            bytes_verified: stats.verified.load(Ordering::Relaxed),
            bytes_copied: stats.copied.load(Ordering::Relaxed),
            report,
            rebased: opts.rebase,
            changes,
        })
    }

    /// Continues the mount on the packet just written at `output`, with an
    /// empty upper directory, without unmounting. Paths keep their inode
    /// numbers (but for the other names of a hard-linked file, which go to
    /// `renamed`), open files keep working. The commit point is one journal
    /// record: a crash before it re-mounts the old packet with the old
    /// changes, after it the new packet (see docs/upper-format.md). The
    /// file at `output` is first checked to be `written` (the file as
    /// committed, and its digest) and the new view built, all before that
    /// record; `moved.moved` is set once the mount serves the new packet (a
    /// failure says which, see [`Error::Rebase`]).
    fn rebase_onto(
        &self,
        output: &std::path::Path,
        written: (&crate::output::Committed, Digest),
        items: &[Item],
        limits: &Limits,
        bar: Option<&std::path::Path>,
        moved: &mut Moved,
    ) -> Result<()> {
        use rayon::prelude::*;
        use std::os::unix::fs::MetadataExt;
        let t0 = std::time::Instant::now();
        let phase = |name: &str| {
            tracing::debug!(phase = name, ms = t0.elapsed().as_millis() as u64, "rebase")
        };
        let packet = crate::packet::reader::Packet::open(output, limits)?;
        phase("opened");
        // The file this seal wrote, as it left it: its chunks are trusted
        // below as written here, unverified.
        let refuse = |what: &str| Error::Refused {
            path: crate::packet::path::shown_path(output),
            kind: crate::packet::error::ErrorKind::PacketChanged,
            reason: format!(
                "was {what} after this seal wrote it; the mount moves only onto the file \
                 the seal wrote, as it wrote it"
            ),
        };
        let opened = packet.file().metadata().map(|m| (m.dev(), m.ino())).ok();
        let placed = &written.0.placed;
        if opened != Some((placed.dev(), placed.ino())) || packet.digest != written.1 {
            return Err(refuse("replaced"));
        }
        let digest = packet.digest;
        // One number is one file: the names of a file hard-linked on the
        // mount are separate files in the packet, so one name keeps the
        // number (the one whose own number it is, else the first in path
        // order); the others get numbers of their own, and the kernel is
        // told to look them up again.
        let mut by_ino: Vec<(Ino, usize)> = items
            .iter()
            .enumerate()
            .map(|(k, it)| (it.ino, k))
            .collect();
        by_ino.sort_unstable();
        let mut renumbered: HashSet<usize> = HashSet::new();
        for run in by_ino.chunk_by(|a, b| a.0 == b.0).filter(|r| r.len() > 1) {
            let own = |&&(ino, k): &&(Ino, usize)| super::ino::candidate(&items[k].path, 0) == ino;
            let keeper = run.iter().find(own).unwrap_or(&run[0]).1;
            renumbered.extend(run.iter().map(|&(_, k)| k).filter(|&k| k != keeper));
        }
        // Numbers a fresh mount of the new packet would not give: kept.
        let mut given: Vec<(String, Ino)> = items
            .par_iter()
            .enumerate()
            .filter(|(k, it)| {
                it.ino != super::ino::ROOT
                    && super::ino::candidate(&it.path, 0) != it.ino
                    && !renumbered.contains(k)
            })
            .map(|(_, it)| (it.path.clone(), it.ino))
            .collect();
        given.sort();
        // The new lower view, built before the record: nothing after the
        // record may fail but making it durable (rolled back if it fails)
        // and tidying the upper directory once the mount has moved.
        let given_map: hashbrown::HashMap<String, Ino> = given.iter().cloned().collect();
        // Numbers the kernel holds that no entry of the new packet has (an
        // entry removed while open or mapped, or whose `FORGET` has not come
        // yet; one the seal left out): their nodes live on in the new view,
        // in no directory, files on their own data files, until the kernel
        // forgets them. Their numbers go to no new entry meanwhile: the
        // kernel drops an inode whose number comes back with another
        // generation, failing its descriptors with `EIO`, and would count
        // its late `FORGET` against the new entry.
        let in_packet: HashSet<Ino> = items.iter().map(|it| it.ino).collect();
        // What the packet leaves out stays on the mount (see `left_out`).
        let left_out = self.left_out(items, &in_packet)?;
        let kept: HashSet<Ino> = left_out
            .iter()
            .map(|&(_, _, ino)| ino)
            .filter(|ino| !in_packet.contains(ino))
            .collect();
        let held: Vec<(Ino, Kind)> = {
            let st = self.state.read_recursive();
            st.kernel_refs()
                .into_iter()
                .filter(|(ino, _)| !in_packet.contains(ino) && !kept.contains(ino))
                .filter_map(|(ino, _)| Some((ino, st.kind(&st.lower, ino)?)))
                .collect()
        };
        let reserved: Vec<Ino> = held
            .iter()
            .map(|&(ino, _)| ino)
            .chain(kept.iter().copied())
            .collect();
        let (lower, inos) = super::new_lower(packet, self.opts, &given_map, &reserved)?;
        // A renumbered name's new number depends on the numbers reserved
        // here, which a remount does not reserve: the record keeps it, so
        // that the journal replays to these very numbers.
        let mut new_numbers: HashMap<usize, Ino> = HashMap::new();
        for &k in &renumbered {
            let path = items[k].path.as_str();
            let at = lower
                .manifest()
                .entries
                .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()));
            if let Ok(i) = at {
                let ino = lower.ino(i as Idx);
                new_numbers.insert(k, ino);
                if super::ino::candidate(path, 0) != ino {
                    given.push((path.to_owned(), ino));
                }
            }
        }
        given.sort();
        if !lower.verifier.opened_as(&lower.packet, written.0) {
            return Err(refuse("modified"));
        }
        // Every chunk was verified or hashed as this daemon wrote it.
        lower.verifier.mark_all();
        let lower = Arc::new(lower);
        phase("indexed");
        let mut fresh = super::state::State::new(lower, inos);
        for &(ino, kind) in &held {
            if kind == Kind::File {
                self.copy_up_held(ino, None)?;
            }
        }
        let t = super::now();
        let mut kept = self.remake(&left_out, &in_packet, t)?;
        // Made in the new view first: a record it refuses is never written,
        // so the journal replays at the next mount. (With the generations
        // handed out so far: a directory these records materialize must
        // keep the one the kernel knows.)
        let stale_times = {
            let st = self.state.read_recursive();
            fresh.carry_generations(&st);
            let new_lower = fresh.lower.clone();
            for r in &kept {
                fresh.apply(&new_lower, r)?;
            }
            let (modes, stale) = carry_modes(&st, &fresh, items, &new_numbers, t);
            for r in &modes {
                fresh.apply(&new_lower, r)?;
            }
            kept.extend(modes);
            stale
        };
        let carried_data: HashSet<u64> = kept
            .iter()
            .filter_map(|r| match r {
                Record::Mknode { data, .. } => *data,
                _ => None,
            })
            .collect();
        // One line: a crash that cuts it leaves the journal as it was
        // before the rebase (its torn tail is dropped), never a rebase
        // without the entries it keeps.
        let rec = Record::Rebase {
            t,
            packet: digest.to_string(),
            output: crate::packet::path::shown_path(output),
            inos: given,
            kept,
        };
        self.upper.append_durable(&rec)?;
        crate::barrier::wait(bar, crate::barrier::Point::RebaseRecorded);
        phase("recorded");
        let (old_inos, old_data, kept_data) = {
            let mut st = self.state.write();
            let old_lower = st.lower.clone();
            let mut carried: HashSet<Ino> = HashSet::new();
            for &(ino, _) in &held {
                // (A lower entry is materialized, taking the kernel's count.)
                let Ok(n) = st.node_mut(&old_lower, ino) else {
                    continue;
                };
                // A file's content the old packet holds goes with the old
                // packet: one held since `copy_up` above is only kept from
                // its number's next user, never served.
                if matches!(n.content, Content::Lower(_)) {
                    continue;
                }
                if n.kind == Kind::Symlink && n.target.is_none() {
                    n.target = Some(super::target_of(&old_lower, n).into());
                }
                n.lower = None;
                n.nlink = 0;
                if n.kind == Kind::Dir {
                    n.children = Some(Default::default());
                    n.subdirs = 0;
                }
                carried.insert(ino);
            }
            let old_inos: Vec<Ino> = st.nodes.keys().copied().collect();
            let mut old_data: Vec<u64> = Vec::new();
            let mut kept_data: Vec<u64> = Vec::new();
            let refs = st.kernel_refs();
            for (ino, n) in &st.nodes {
                if let Content::Upper(id) = n.content {
                    if carried.contains(ino) || carried_data.contains(&id) {
                        kept_data.push(id);
                    } else {
                        old_data.push(id);
                    }
                }
            }
            for &ino in &carried {
                if let Some(n) = st.nodes.remove(&ino) {
                    fresh.nodes.insert(ino, n);
                }
            }
            fresh.next_data = st.next_data;
            fresh.applied += st.applied;
            *st = fresh;
            moved.moved = true;
            // The kernel's references carry over: paths keep their numbers
            // (the moved nodes brought their own).
            for (ino, count) in refs {
                if !carried.contains(&ino) {
                    st.add_ref(ino, count as i64);
                }
            }
            // One the kernel forgot since it was counted goes now.
            for &ino in &carried {
                if let Some(id) = st.drop_if_unused(ino) {
                    kept_data.retain(|&k| k != id);
                    old_data.push(id);
                }
            }
            (old_inos, old_data, kept_data)
        };
        // The record is durable, so what follows it is tidying: a failed
        // compaction (a full disk) leaves the journal as it is, which a
        // mount replays from its last rebase record. The old data files
        // are of no use either way, and the kernel's attributes of the old
        // nodes are out of date either way.
        let compacted = self.upper.compact(&rec, &digest);
        if compacted.is_ok() {
            crate::barrier::wait(bar, crate::barrier::Point::RebaseCompacted);
            phase("compacted");
        }
        for id in old_data {
            if !kept_data.contains(&id) {
                self.upper.remove_data(id);
            }
        }
        if let Some(f) = &*self.invalidate.lock() {
            for ino in old_inos {
                f(Stale::Attr(ino));
            }
            f(Stale::Attr(super::ino::ROOT));
            // Entries the old view served from its packet whose time the
            // new packet gives otherwise (`--zero-mtimes`, a directory's
            // time, which is its packet's newest file's).
            for ino in stale_times {
                f(Stale::Attr(ino));
            }
            // A symlink whose target the seal rewrote now reads as the
            // packet stores it: the kernel's cached target goes too.
            for it in items {
                if let ItemKind::Symlink(_, true) = it.kind {
                    f(Stale::Content(it.ino));
                }
            }
        }
        for &k in &renumbered {
            let Some((dir, name)) = items[k].path.rsplit_once('/') else {
                continue;
            };
            let at = items.binary_search_by(|it| it.path.as_bytes().cmp(dir.as_bytes()));
            if let Ok(d) = at {
                moved.renamed.push((items[d].ino, name.to_owned()));
            }
        }
        phase("invalidated");
        compacted?;
        tracing::info!(%digest, "rebased onto the sealed packet");
        Ok(())
    }

    /// The names of the merged view a packet of `items` leaves out
    /// (credentials, FIFOs and other special files, `--exclude`d entries,
    /// the other names of an excluded file), with everything under them,
    /// parents first: `(directory, name, number)`. A rebase keeps them on
    /// the mount, never in a packet; a left-out name of a file the packet
    /// holds under another name comes with that file's number, to be
    /// linked to it. Files whose content the old packet holds are copied
    /// up (and synced), so that they outlive it.
    fn left_out(
        &self,
        items: &[Item],
        in_packet: &HashSet<Ino>,
    ) -> Result<Vec<(Ino, String, Ino)>> {
        let mut out = Vec::new();
        {
            let st = self.state.read_recursive();
            let lower = &*st.lower;
            let mut stack: Vec<(Ino, String, Ino)> = Vec::new();
            // Another name of a file the packet holds (a hard link made on
            // the mount, `--exclude`d): kept as a link to it.
            let linked = |dir: &str, name: &str, ino: Ino| {
                matches!(st.get(lower, ino), Some(Ref::Node(n)) if n.kind == Kind::File && n.nlink > 1)
                    && {
                        let path = format!("{dir}/{name}");
                        items
                            .binary_search_by(|x| x.path.as_bytes().cmp(path.as_bytes()))
                            .is_err()
                    }
            };
            for it in items.iter().filter(|it| matches!(it.kind, ItemKind::Dir)) {
                for (name, ino) in st.list(lower, it.ino)? {
                    if in_packet.contains(&ino) {
                        if linked(&it.path, &name, ino) {
                            out.push((it.ino, name.to_string(), ino));
                        }
                        continue;
                    }
                    stack.push((it.ino, name.to_string(), ino));
                    while let Some((dir, name, ino)) = stack.pop() {
                        out.push((dir, name, ino));
                        if st.kind(lower, ino) == Some(Kind::Dir) {
                            for (n, i) in st.list(lower, ino)? {
                                if in_packet.contains(&i) {
                                    out.push((ino, n.to_string(), i));
                                } else {
                                    stack.push((ino, n.to_string(), i));
                                }
                            }
                        }
                    }
                }
            }
        }
        // Files copied up here outlive the old packet, which this seal may
        // have replaced: made durable before the record that refers to
        // them.
        for &(_, _, ino) in out.iter().filter(|(_, _, ino)| !in_packet.contains(ino)) {
            let lower_content = {
                let st = self.state.read_recursive();
                match st.get(&st.lower, ino) {
                    Some(Ref::Node(n)) => matches!(n.content, Content::Lower(_)),
                    Some(Ref::Lower(i)) => st.lower.kind(i) == Kind::File,
                    None => false,
                }
            };
            if lower_content {
                let id = self.copy_up_held(ino, None)?;
                let f = self.upper.data(id)?;
                f.sync_all()
                    .map_err(Error::upper("fsync a file kept out of the packet"))?;
                self.upper.sync_data_name(id)?;
            }
        }
        Ok(out)
    }

    /// The records that make `left_out` again, at time `t`, over a lower
    /// layer that lacks them: a node each, with its number, generation,
    /// owner, mode and data file (a file's times are its data file's), a
    /// link for a file's next name (or a name of a file in the packet), and
    /// last the times of the other kinds.
    fn remake(
        &self,
        left_out: &[(Ino, String, Ino)],
        in_packet: &HashSet<Ino>,
        t: super::journal::Nanos,
    ) -> Result<Vec<Record>> {
        let st = self.state.read_recursive();
        let lower = &*st.lower;
        let mut made: HashSet<Ino> = HashSet::new();
        let mut recs = Vec::new();
        // Last: making an entry sets its directory's times.
        let mut times = Vec::new();
        for (dir, name, ino) in left_out {
            if made.contains(ino) || in_packet.contains(ino) {
                recs.push(Record::Link {
                    t,
                    ino: *ino,
                    parent: *dir,
                    name: name.clone(),
                });
                continue;
            }
            let a = self.attr_of(&st, *ino)?;
            let (data, target) = match st.get(lower, *ino).ok_or(Error::NotFound)? {
                Ref::Node(n) => match n.content {
                    Content::Upper(id) => (Some(id), None),
                    // Copied up by `left_out`; not otherwise.
                    Content::Lower(_) => continue,
                    Content::None if n.kind == Kind::Symlink => {
                        (None, Some(super::target_of(lower, n).to_string()))
                    }
                    Content::None => (None, None),
                },
                Ref::Lower(i) => match &lower.manifest().entries[i as usize].kind {
                    EntryKind::Symlink(target) => (None, Some(target.to_string())),
                    EntryKind::Dir => (None, None),
                    EntryKind::File(_) => continue,
                },
            };
            made.insert(*ino);
            recs.push(Record::Mknode {
                t,
                ino: *ino,
                generation: a.generation,
                parent: *dir,
                name: name.clone(),
                kind: a.kind,
                perm: a.perm,
                uid: a.uid,
                gid: a.gid,
                rdev: a.rdev,
                data,
                target,
            });
            if data.is_none() {
                times.push(Record::Setattr {
                    t,
                    ino: *ino,
                    perm: None,
                    uid: None,
                    gid: None,
                    atime: Some(a.atime),
                    mtime: Some(a.mtime),
                });
            }
        }
        recs.append(&mut times);
        Ok(recs)
    }

    /// Walks the merged view (both parts, whichever is mounted), applying
    /// the policy, in path order.
    fn collect(&self, opts: &SealOptions, policy: &Policy) -> Result<(Vec<Item>, ScanReport)> {
        let st = self.state.read_recursive();
        let lower = &*st.lower;
        let mut items = Vec::new();
        let mut report = ScanReport::default();
        let mut stack: Vec<(Ino, String, Part, usize)> = Vec::new();
        let mut linked_out = Vec::new();
        let mut credential_dirs = Vec::new();
        for &r in lower.index.roots() {
            let path = lower.manifest().entries[r as usize].path.to_string();
            let Some(part) = Part::parse(&path) else {
                continue;
            };
            items.push(Item {
                path: path.clone(),
                ino: lower.ino(r),
                kind: ItemKind::Dir,
                origin: Some(r),
            });
            stack.push((lower.ino(r), path, part, 0));
        }
        crate::barrier::wait(opts.barrier.as_deref(), crate::barrier::Point::Collecting);
        while let Some((dir, dpath, part, depth)) = stack.pop() {
            let list = st.list(lower, dir)?;
            let kinds: Vec<(Kind, Ino)> = list
                .iter()
                .map(|(_, ino)| (st.kind(lower, *ino).unwrap_or(Kind::File), *ino))
                .collect();
            let judged: Vec<(&str, ChildType)> = list
                .iter()
                .zip(&kinds)
                .map(|((name, _), (k, _))| {
                    let t = match k {
                        Kind::Dir => ChildType::Dir,
                        Kind::File => ChildType::File,
                        _ => ChildType::Other,
                    };
                    (&**name, t)
                })
                .collect();
            let verdicts = policy.judge_dir(part, &dpath, &judged);
            for (((name, _), (kind, ino)), verdict) in list.iter().zip(&kinds).zip(verdicts) {
                let path = format!("{dpath}/{name}");
                match verdict {
                    Verdict::Include => {}
                    Verdict::Exclude(reason) => {
                        if *kind == Kind::File && reason.is_credential() {
                            linked_out.push((*ino, path.clone()));
                        }
                        if *kind == Kind::Dir && reason.is_credential() {
                            credential_dirs.push((*ino, path.clone()));
                        }
                        let kind = if *kind == Kind::Dir { "dir" } else { "file" };
                        report.excluded.push(Excluded { path, kind, reason });
                        continue;
                    }
                    Verdict::Refuse(reason) => {
                        return Err(Error::Refused {
                            path,
                            kind: crate::packet::error::ErrorKind::CredentialStore,
                            reason,
                        });
                    }
                }
                check_path(&path, &opts.limits)
                    .map_err(crate::source::Error::from_validation)
                    .map_err(refusal)?;
                let r = st.get(lower, *ino).ok_or(Error::NotFound)?;
                let origin = match r {
                    Ref::Node(n) => n.lower,
                    Ref::Lower(i) => Some(i),
                };
                match kind {
                    Kind::Dir => {
                        items.push(Item {
                            path: path.clone(),
                            ino: *ino,
                            kind: ItemKind::Dir,
                            origin,
                        });
                        stack.push((*ino, path, part, depth + 1));
                    }
                    Kind::Symlink => {
                        let target = match r {
                            Ref::Node(n) => super::target_of(lower, n).to_string(),
                            Ref::Lower(i) => match &lower.manifest().entries[i as usize].kind {
                                EntryKind::Symlink(t) => t.to_string(),
                                _ => String::new(),
                            },
                        };
                        let spellings = opts.roots.get(&part).map_or(&[][..], Vec::as_slice);
                        let stored = match report.symlink(
                            &path,
                            &target,
                            depth,
                            spellings,
                            part,
                            opts.reject_external_symlinks,
                        ) {
                            Ok(stored) => stored,
                            Err(reason) => {
                                return Err(Error::Refused {
                                    path,
                                    kind: crate::packet::error::ErrorKind::ExternalSymlink,
                                    reason,
                                });
                            }
                        };
                        let rewritten = stored != target;
                        items.push(Item {
                            path,
                            ino: *ino,
                            kind: ItemKind::Symlink(stored, rewritten),
                            origin,
                        });
                    }
                    Kind::File => {
                        let f = self.file_item(lower, r, &path, &mut report)?;
                        items.push(Item {
                            path,
                            ino: *ino,
                            kind: ItemKind::File(f),
                            origin,
                        });
                    }
                    Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => {
                        let kind = match kind {
                            Kind::Fifo => "fifo",
                            Kind::Socket => "socket",
                            Kind::CharDev => "char_device",
                            _ => "block_device",
                        };
                        report.dropped.push(Dropped { path, kind });
                    }
                }
            }
        }
        // The files with other names in a directory left out as holding
        // credentials (`ln .ssh/id_ed25519 key.txt` on the mount): a
        // packet has no hard links, so only files made or linked on the
        // mount (nodes) can have them.
        while let Some((dir, dpath)) = credential_dirs.pop() {
            for (name, ino) in st.list(lower, dir)? {
                let path = format!("{dpath}/{name}");
                match st.get(lower, ino) {
                    Some(Ref::Node(n)) if n.kind == Kind::File && n.nlink > 1 => {
                        linked_out.push((ino, path));
                    }
                    Some(Ref::Node(n)) if n.kind == Kind::Dir => credential_dirs.push((ino, path)),
                    Some(Ref::Lower(i)) if lower.kind(i) == Kind::Dir => {
                        credential_dirs.push((ino, path));
                    }
                    _ => {}
                }
            }
        }
        // An excluded file's other names (hard links made on the mount).
        report.exclude_other_names(&mut items, linked_out, |it| match it.kind {
            ItemKind::File(_) => Some((it.ino, it.path.as_str())),
            _ => None,
        });
        items.sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        Ok((items, report))
    }

    /// What a seal takes from one file of the merged view.
    fn file_item(
        &self,
        lower: &Lower,
        r: Ref<'_>,
        path: &str,
        report: &mut ScanReport,
    ) -> Result<FileItem> {
        let m = lower.manifest();
        let lower_file = |i: Idx| m.entries[i as usize].file();
        let (from, reuse, origin, size, mtime, perm) = match r {
            Ref::Lower(i) => {
                let f = lower_file(i).ok_or(Error::NotFound)?;
                let perm = if f.executable { 0o755 } else { 0o644 };
                (
                    Source::Lower(i),
                    Some(i),
                    Some(i),
                    f.size,
                    f.mtime_ns as i64,
                    perm,
                )
            }
            Ref::Node(n) => match n.content {
                Content::Lower(i) => {
                    let f = lower_file(i).ok_or(Error::NotFound)?;
                    (Source::Lower(i), Some(i), n.lower, f.size, n.mtime, n.perm)
                }
                Content::Upper(id) => {
                    let st = self.upper.stat_data(id)?;
                    let mtime = st.st_mtime * 1_000_000_000 + st.st_mtime_nsec;
                    let size = st.st_size as u64;
                    // A copy-up nothing wrote to since holds the lower bytes.
                    match n.lower.filter(|_| !n.modified.get()) {
                        Some(i) if lower_file(i).is_some_and(|f| f.size == size) => {
                            (Source::Lower(i), Some(i), Some(i), size, mtime, n.perm)
                        }
                        _ => (Source::Upper(id), None, n.lower, size, mtime, n.perm),
                    }
                }
                Content::None => return Err(Error::NotFound),
            },
        };
        let clamped = mtime.clamp(0, MAX_MTIME_NS.min(i64::MAX as u64) as i64);
        if clamped != mtime {
            report.clamped_mtimes.push(Clamped {
                path: path.into(),
                mtime_ns: mtime.to_string(),
                recorded_ns: clamped as u64,
            });
        }
        Ok(FileItem {
            from,
            reuse,
            origin,
            size,
            mtime_ns: clamped as u64,
            executable: perm & 0o111 != 0,
        })
    }
}

/// What the merged view breaks (packet rules, limits, symlinks leaving
/// their part): refused input.
fn refusal(e: crate::source::Error) -> Error {
    match e {
        crate::source::Error::Refused { path, kind, reason } => {
            Error::Refused { path, kind, reason }
        }
        crate::source::Error::Packet(p) => Error::Packet(p),
        other => Error::Refused {
            path: other.path().unwrap_or_default().to_string(),
            kind: other.kind(),
            reason: other.to_string(),
        },
    }
}

/// Every difference between the old manifest and the sealed one.
fn receipt(old: &Manifest, items: &[Item], new: &Manifest) -> Vec<Change> {
    let old_by_path: HashMap<&str, usize> = old
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (&*e.path, i))
        .collect();
    let sha = |e: &Entry| e.file().map(|f| f.sha256);
    let origin_of = |it: &Item| {
        match &it.kind {
            ItemKind::File(f) => f.origin,
            _ => it.origin,
        }
        .map(|i| i as usize)
    };
    // A lower entry still at its path is accounted for there, whatever
    // comes before it in path order: another name of it (a hard link made
    // on the mount) is new, not the entry renamed.
    let mut accounted = vec![false; old.entries.len()];
    for (it, e) in items.iter().zip(&new.entries) {
        if let Some(o) = origin_of(it)
            && old_by_path.get(&*e.path) == Some(&o)
        {
            accounted[o] = true;
        }
    }
    let mut changes = Vec::new();
    for (it, e) in items.iter().zip(&new.entries) {
        let origin = origin_of(it);
        let same_path = old_by_path.get(&*e.path).copied();
        match (origin, same_path) {
            // From the lower entry at the same path.
            (Some(o), Some(p)) if o == p => {
                accounted[o] = true;
                if old.entries[o] != *e {
                    changes.push(Change::Modified {
                        path: e.path.to_string(),
                        old_sha256: sha(&old.entries[o]),
                        new_sha256: sha(e),
                    });
                }
            }
            // A lower entry moved here (directories are not reported: their
            // contents are), unless it is accounted for at its own path or
            // by an earlier name.
            (Some(o), _) if !e.is_dir() && !accounted[o] => {
                accounted[o] = true;
                changes.push(Change::Renamed {
                    from: old.entries[o].path.to_string(),
                    to: e.path.to_string(),
                    old_sha256: sha(&old.entries[o]),
                    new_sha256: sha(e),
                });
            }
            // Something new where a lower entry of the same path was.
            (_, Some(p)) => {
                if !accounted[p] && old.entries[p].type_name() == e.type_name() {
                    accounted[p] = true;
                    if old.entries[p] != *e {
                        changes.push(Change::Modified {
                            path: e.path.to_string(),
                            old_sha256: sha(&old.entries[p]),
                            new_sha256: sha(e),
                        });
                    }
                } else {
                    changes.push(Change::Added {
                        path: e.path.to_string(),
                        kind: e.type_name(),
                        sha256: sha(e),
                    });
                }
            }
            // New: a directory moved here (its old path, gone, is
            // deleted), or another name of a file accounted for.
            (_, None) => {
                changes.push(Change::Added {
                    path: e.path.to_string(),
                    kind: e.type_name(),
                    sha256: sha(e),
                });
            }
        }
    }
    // A lower entry that moved is reported as renamed, not also deleted.
    let mut deleted: BTreeMap<&str, Option<Sha256>> = BTreeMap::new();
    for (i, e) in old.entries.iter().enumerate() {
        if !accounted[i] && !new_has(new, &e.path) {
            deleted.insert(&e.path, sha(e));
        }
    }
    for (path, old_sha256) in deleted {
        changes.push(Change::Deleted {
            path: path.to_string(),
            old_sha256,
        });
    }
    // By path (a rename by its new one), as the receipt promises.
    changes.sort_by(|a, b| a.path().as_bytes().cmp(b.path().as_bytes()));
    changes
}

impl Change {
    /// The path a change is listed by: a rename's new one.
    fn path(&self) -> &str {
        match self {
            Change::Added { path, .. }
            | Change::Modified { path, .. }
            | Change::Deleted { path, .. } => path,
            Change::Renamed { to, .. } => to,
        }
    }
}

fn new_has(new: &Manifest, path: &str) -> bool {
    new.entries
        .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
        .is_ok()
}

/// The merged view's files as a content source for the writer.
struct SealContents<'a> {
    /// The seal's options (whether it was given up).
    opts: &'a SealOptions,
    overlay: &'a Overlay,
    lower: &'a Lower,
    /// Reads of the parent around the page cache, when it is not in it.
    direct: Option<DirectLower>,
    items: &'a [Item],
    /// Per entry: how its upper data file looked when first read, so that
    /// content hashed once and written later is known to be the same.
    /// (Only files read from the upper directory have one.)
    stamps: HashMap<usize, OnceLock<Stamp>>,
}

/// Size, mtime and ctime of an upper data file: any write changes them.
type Stamp = (u64, i64, i64, i64, i64);

fn stamp_of(file: &File, path: &str) -> Result<Stamp> {
    let m = file.metadata().map_err(|e| Error::Upper {
        path: Some(path.to_string()),
        context: format!("{path}: stat"),
        source: e,
    })?;
    Ok((
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

fn changed_while_sealing(path: &str) -> Error {
    Error::Refused {
        path: path.to_string(),
        kind: crate::packet::error::ErrorKind::ChangedWhileSealing,
        reason: "its upper data file changed while the seal read it (only the daemon may write the upper directory)".into(),
    }
}

/// Reading one file for the seal.
enum SealReader<'a> {
    /// From the old packet, at an absolute offset.
    Lower {
        packet: &'a Packet,
        direct: Option<&'a DirectLower>,
        pos: u64,
    },
    /// From an upper data file.
    Upper {
        file: Arc<File>,
        pos: u64,
        path: &'a str,
        stamp: &'a OnceLock<Stamp>,
    },
}

impl Contents for SealContents<'_> {
    type Error = Error;
    type Reader<'a>
        = SealReader<'a>
    where
        Self: 'a;

    fn check(&self, i: usize) -> Check {
        match &self.items[i].kind {
            ItemKind::File(f) => match (f.from, f.reuse) {
                (Source::Lower(idx), Some(_)) => {
                    if self.lower.verifier.all_verified(&self.lower.packet, idx) {
                        Check::Trust
                    } else {
                        Check::Verify
                    }
                }
                _ => Check::Compute,
            },
            _ => Check::Trust,
        }
    }

    /// A reused lower file with chunks, until a seal has checked its whole
    /// hash (every file of a packet this daemon wrote is checked).
    fn check_whole(&self, i: usize) -> bool {
        match &self.items[i].kind {
            ItemKind::File(f) => match (f.from, f.reuse) {
                (Source::Lower(idx), Some(_)) => {
                    !self.lower.verifier.whole_checked(&self.lower.packet, idx)
                }
                _ => false,
            },
            _ => false,
        }
    }

    fn prefetch(&self, entries: std::ops::Range<usize>, window: Option<(u64, u64)>) {
        if self.direct.is_some() {
            // Direct reads skip the page cache this would fill.
            return;
        }
        // The lower bytes these entries come from, as one range of the old
        // packet when they lie close together (they mostly keep their order).
        let p = &self.lower.packet;
        let (mut lo, mut hi, mut sum) = (u64::MAX, 0u64, 0u64);
        for it in &self.items[entries] {
            let ItemKind::File(f) = &it.kind else {
                continue;
            };
            let Source::Lower(idx) = f.from else { continue };
            let (off, len) =
                window.map_or((0, f.size), |(o, l)| (o, l.min(f.size.saturating_sub(o))));
            let start = p.content_offset(idx as usize) + off;
            lo = lo.min(start);
            hi = hi.max(start + len);
            sum += len;
        }
        if sum > 0 && hi - lo <= 2 * sum + (1 << 20) {
            crate::sys::will_need(p.file(), lo, hi - lo);
        }
    }

    fn open(&self, i: usize) -> Result<SealReader<'_>> {
        self.opts.go_on()?;
        let ItemKind::File(f) = &self.items[i].kind else {
            return Err(Error::NotFound);
        };
        let path = self.items[i].path.as_str();
        match f.from {
            Source::Lower(idx) => {
                let p = &self.lower.packet;
                let e = &p.manifest.entries[idx as usize];
                // Positional reads: every reader shares the packet's file.
                Ok(SealReader::Lower {
                    packet: p,
                    direct: self.direct.as_ref(),
                    pos: p.layout.data_offset(idx as usize, e),
                })
            }
            Source::Upper(id) => {
                // The stamp is taken before the first read, and must match
                // the size the seal recorded, at every open and every end.
                let file = self.overlay.upper.data(id)?;
                let cell = self.stamps.get(&i).ok_or(Error::NotFound)?;
                let now = stamp_of(&file, path)?;
                if *cell.get_or_init(|| now) != now || now.0 != f.size {
                    return Err(changed_while_sealing(path));
                }
                Ok(SealReader::Upper {
                    file,
                    pos: 0,
                    path,
                    stamp: cell,
                })
            }
        }
    }
}

impl ContentReader for SealReader<'_> {
    type Error = Error;

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        match self {
            SealReader::Lower {
                packet,
                direct,
                pos,
            } => {
                let file = packet.file();
                match direct {
                    Some(d) => d.read_exact_at(file, buf, *pos),
                    None => file.read_exact_at(buf, *pos),
                }
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        // Its length was checked when the seal began.
                        Error::PacketChanged {
                            packet: crate::packet::path::shown_path(packet.path()),
                        }
                    } else {
                        Error::packet_io(packet, e)
                    }
                })?;
                *pos += buf.len() as u64;
            }
            SealReader::Upper {
                file, pos, path, ..
            } => {
                file.read_exact_at(buf, *pos).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        Error::Refused {
                            path: path.to_string(),
                            kind: crate::packet::error::ErrorKind::ChangedWhileSealing,
                            reason: "its upper data file is shorter than when the seal began \
                                     (only the daemon may write the upper directory)"
                                .into(),
                        }
                    } else {
                        Error::Upper {
                            path: Some(path.to_string()),
                            context: format!("{path}: read"),
                            source: e,
                        }
                    }
                })?;
                *pos += buf.len() as u64;
            }
        }
        Ok(())
    }

    fn skip(&mut self, n: u64) -> Result<()> {
        match self {
            SealReader::Lower { pos, .. } | SealReader::Upper { pos, .. } => *pos += n,
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        let SealReader::Upper {
            file,
            path,
            stamp: seen,
            ..
        } = self
        else {
            return Ok(());
        };
        if seen.get() != Some(&stamp_of(&file, path)?) {
            return Err(changed_while_sealing(path));
        }
        Ok(())
    }
}

/// Reads of the parent packet with `O_DIRECT`, a span of about a piece at a
/// time per thread, for a parent this daemon wrote itself (around the page
/// cache, so not in it): filling the cache only to read each byte once
/// cost the second turn of a rebased session 0.3-0.5 s on 1 GiB here.
/// A parent from elsewhere may be in the cache, and is read through it.
struct DirectLower {
    file: File,
    len: u64,
    /// The span each thread read last.
    spans: parking_lot::Mutex<HashMap<std::thread::ThreadId, Span>>,
    /// Set when a direct read is refused: the rest goes through the cache.
    refused: std::sync::atomic::AtomicBool,
}

/// Bytes `start..start + valid` of the packet.
#[derive(Default)]
struct Span {
    buf: crate::output::AlignedBuf,
    start: u64,
    valid: usize,
}

/// A direct read covers at least this much (a piece of the packet being
/// written comes from about that much of the parent).
const SPAN: u64 = crate::packet::format::CHUNK_SIZE;

impl DirectLower {
    fn new(lower: &Lower) -> Option<DirectLower> {
        if !lower.verifier.written_here() {
            return None;
        }
        let file = crate::sys::reopen_direct(lower.packet.file(), false)?;
        Some(DirectLower {
            file,
            len: lower.packet.file().metadata().ok()?.len(),
            spans: parking_lot::Mutex::new(HashMap::new()),
            refused: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Fills `buf` from `pos`, from this thread's span or a new one;
    /// through `cached` (the buffered handle) once direct reads fail.
    fn read_exact_at(&self, cached: &File, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        if !self.refused.load(Ordering::Relaxed) {
            let tid = std::thread::current().id();
            let mut span = self.spans.lock().remove(&tid).unwrap_or_default();
            let r = self.read_via_span(&mut span, buf, pos);
            self.spans.lock().insert(tid, span);
            match r {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!(
                        "direct read refused; reading the parent through the page cache"
                    );
                    self.refused.store(true, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        cached.read_exact_at(buf, pos)
    }

    fn read_via_span(&self, span: &mut Span, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let align = crate::output::DIRECT_ALIGN as u64;
        let end = pos + buf.len() as u64;
        if pos < span.start || end > span.start + span.valid as u64 {
            let start = pos - pos % align;
            let want = (end - start)
                .max(SPAN)
                .min(self.len.next_multiple_of(align).saturating_sub(start))
                .next_multiple_of(align);
            span.valid = 0; // until the new bytes are in
            let window = span.buf.window(want as usize);
            let mut got = 0;
            while got < window.len() {
                match self.file.read_at(&mut window[got..], start + got as u64) {
                    Ok(0) => break,
                    // A short read ends at the end of the file (or the next
                    // read would not be aligned): what is here is all.
                    Ok(n) if n % align as usize != 0 => {
                        got += n;
                        break;
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            span.start = start;
            span.valid = got;
            if end > start + got as u64 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        let at = (pos - span.start) as usize;
        buf.copy_from_slice(&span.buf.bytes()[at..at + buf.len()]);
        Ok(())
    }
}

/// What a packet cannot hold of the entries it holds, kept on the mount
/// across a rebase onto it: their permission bits beyond the executable
/// one, and their owners. A file made private on the mount (`chmod 600`)
/// must not turn readable by others when the mount moves onto the packet,
/// nor a file change hands. Returns the records that set them again in
/// `fresh` (the new view, with the left-out entries made again; the
/// renumbered names of `items` by index in `new_numbers`), and the
/// numbers the kernel holds of entries the old view served from its
/// packet whose time `fresh` gives otherwise, to tell the kernel.
fn carry_modes(
    old: &super::state::State,
    fresh: &super::state::State,
    items: &[Item],
    new_numbers: &HashMap<usize, Ino>,
    t: super::journal::Nanos,
) -> (Vec<Record>, Vec<Ino>) {
    use super::state::Ref;
    let shown = |st: &super::state::State,
                 ino: Ino|
     -> Option<(u16, u32, u32, Option<super::journal::Nanos>)> {
        Some(match st.get(&st.lower, ino)? {
            // (A node's own time, for one without a data file: a data
            // file's is the file's.)
            Ref::Node(n) => {
                let own_time = !matches!(n.content, Content::Upper(_));
                (n.perm, n.uid, n.gid, own_time.then_some(n.mtime))
            }
            Ref::Lower(i) => {
                let a = super::lower_attr(&st.lower, ino, i, 0);
                (a.perm, a.uid, a.gid, Some(a.mtime))
            }
        })
    };
    let held: HashSet<Ino> = old.kernel_refs().into_iter().map(|(i, _)| i).collect();
    let mut records = Vec::new();
    let mut stale = Vec::new();
    for (k, it) in items.iter().enumerate() {
        // A renumbered name (another name of a hard-linked file) has the
        // number the new packet gave it.
        let ino = new_numbers.get(&k).copied().unwrap_or(it.ino);
        let (Some(was), Some(now)) = (shown(old, it.ino), shown(fresh, ino)) else {
            continue;
        };
        let perm = (was.0 != now.0).then_some(was.0);
        let uid = (was.1 != now.1).then_some(was.1);
        let gid = (was.2 != now.2).then_some(was.2);
        if perm.is_some() || uid.is_some() || gid.is_some() {
            records.push(Record::Setattr {
                t,
                ino,
                perm,
                uid,
                gid,
                atime: None,
                mtime: None,
            });
        }
        // (The old view's nodes are all told of anyway.)
        let was_lower = matches!(old.get(&old.lower, it.ino), Some(Ref::Lower(_)));
        if was_lower && was.3 != now.3 && held.contains(&it.ino) {
            stale.push(ino);
        }
    }
    (records, stale)
}
