//! The upper directory on disk: its header, the journal, and the data files.
//! See docs/upper-format.md for the contract.
//!
//! Every path the daemon opens in it is a name it generates, opened beneath
//! a directory handle with `O_NOFOLLOW`: nothing in the upper directory can
//! make the daemon follow a symlink.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use lru::LruCache;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::journal::{self, Record};
use crate::packet::digest::Digest;
use crate::packet::path::Part;

/// Name of the header file.
pub const HEADER: &str = "sessionfs-upper.json";
/// Name of the journal.
pub const JOURNAL: &str = "journal";
/// Name of the data directory.
pub const DATA: &str = "data";
/// Schema of the header.
pub const SCHEMA: &str = "sessionfs.upper/2";
/// The schema before data files were spread over shard directories: read,
/// and moved to this layout when opened.
const SCHEMA_FLAT: &str = "sessionfs.upper/1";
/// Data file `id` lives in shard directory `id % SHARDS` (named in two hex
/// digits). On ext4 the shards sit in different block groups (the data
/// directory is marked `+T`); one flat directory put every data file in one
/// group, where a disk without a journal skips recently freed inodes one
/// by one: creating 5,000 files after deleting as many took 0.2-0.7 s
/// there against 0.05 s spread over 64 shards.
pub const SHARDS: u64 = 64;

/// Open data files kept at once (the rest are reopened on demand), so the
/// daemon never holds a descriptor per inode.
const OPEN_FILES: usize = 256;

/// The header: which packet this upper directory belongs to.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    schema: String,
    packet: String,
    /// The part mounted as the root, when the mount was of one part: the
    /// journal names inodes relative to that root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    part: Option<Part>,
}

/// An open upper directory, locked for one daemon.
pub struct Upper {
    /// The exclusive lock on the directory, held while the daemon runs.
    _lock: nix::fcntl::Flock<OwnedFd>,
    root: PathBuf,
    /// The part mounted as the root, recorded in the header.
    part: Option<Part>,
    dir: OwnedFd,
    data: OwnedFd,
    /// The shard directories, by number.
    shards: Shards,
    /// Shards whose entry in `data/` was fsynced by this daemon, a bit each.
    shards_synced: AtomicU64,
    /// Data files whose entry in their shard was fsynced by this daemon.
    names_synced: Mutex<HashSet<u64>>,
    /// The journal open for appending, and its length (to roll back a
    /// failed append). Replaced when a rebase compacts the journal.
    journal: Mutex<(File, u64)>,
    /// The journal's name (after a compaction) is not known durable: the
    /// next sync of the journal syncs the directory too.
    journal_name_unsynced: AtomicBool,
    fds: Mutex<LruCache<u64, Arc<File>>>,
}

/// What opening found in the journal.
pub struct Opened {
    /// The directory.
    pub upper: Upper,
    /// The journal's records that apply: from the last `rebase` record (the
    /// first one returned, if there is one) to the end.
    pub records: Vec<Record>,
}

fn io_at(path: &Path, what: &str) -> impl FnOnce(io::Error) -> Error + use<> {
    let shown = crate::packet::path::shown_path(path);
    let context = format!("{shown}: {what}");
    move |e| Error::Upper {
        path: Some(shown),
        context,
        source: e,
    }
}

fn nix_at(path: &Path, what: &str) -> impl FnOnce(nix::Error) -> Error + use<> {
    let f = io_at(path, what);
    move |e| f(e.into())
}

impl Upper {
    /// Opens (creating if absent or empty) the upper directory for the
    /// packet `digest` mounted with `part` as its root, takes its lock, and
    /// reads its journal.
    pub fn open(root: &Path, digest: &Digest, part: Option<Part>) -> Result<Opened> {
        match std::fs::symlink_metadata(root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .mode_0700()
                    .create(root)
                    .map_err(io_at(root, "cannot create the upper directory"))?;
            }
            Err(e) => return Err(io_at(root, "cannot stat the upper directory")(e)),
            Ok(m) if !m.is_dir() => {
                let what = if m.file_type().is_symlink() {
                    "a symlink, which is not followed: name the directory itself"
                } else {
                    "not a directory: name a new or empty directory, or a mount's upper directory"
                };
                return Err(Error::UpperRefused {
                    path: crate::packet::path::shown_path(root),
                    reason: what.into(),
                });
            }
            Ok(_) => {}
        }
        let dir = nix::fcntl::open(
            root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(nix_at(root, "cannot open the upper directory"))?;
        let lock_fd = dir
            .try_clone()
            .map_err(io_at(root, "cannot lock the upper directory"))?;
        let lock =
            match nix::fcntl::Flock::lock(lock_fd, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => lock,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(Error::UpperRefused {
                        path: crate::packet::path::shown_path(root),
                        reason: "in use by another sessionfs mount (the directory is locked)"
                            .into(),
                    });
                }
                Err((_, errno)) => {
                    return Err(io_at(root, "cannot lock the upper directory")(errno.into()));
                }
            };
        let header_path = root.join(HEADER);
        let has_header = fstatat(&dir, HEADER, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
        if !has_header {
            let empty = std::fs::read_dir(root)
                .map_err(io_at(root, "cannot read the upper directory"))?
                .next()
                .is_none();
            if !empty {
                return Err(Error::UpperRefused {
                    path: crate::packet::path::shown_path(root),
                    reason: format!("not empty and has no {HEADER}: not an upper directory"),
                });
            }
            write_header(&dir, root, digest, part)?;
        }
        let mut flat = None;
        let header_digest = if !has_header {
            digest.to_string()
        } else {
            let h = read_header(&dir, &header_path)?;
            if h.schema == SCHEMA_FLAT {
                flat = Some(h.packet.clone());
            }
            if h.part != part {
                return Err(Error::UpperRefused {
                    path: crate::packet::path::shown_path(root),
                    reason: format!(
                        "made for a mount of {}, not of {}: its journal is relative to that root",
                        part_name(h.part),
                        part_name(part)
                    ),
                });
            }
            h.packet
        };
        let jfd = openat(
            &dir,
            JOURNAL,
            OFlag::O_RDWR | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(nix_at(&root.join(JOURNAL), "cannot open the journal"))?;
        let mut journal = File::from(jfd);
        let mut bytes = Vec::new();
        journal
            .read_to_end(&mut bytes)
            .map_err(io_at(&root.join(JOURNAL), "cannot read the journal"))?;
        let parsed = journal::parse(&bytes).map_err(|reason| Error::UpperRefused {
            path: crate::packet::path::shown_path(&root.join(JOURNAL)),
            reason,
        })?;
        if parsed.valid_len < bytes.len() {
            tracing::warn!(
                dropped = bytes.len() - parsed.valid_len,
                "the journal ends with a record cut short by a crash; dropping it"
            );
            journal
                .set_len(parsed.valid_len as u64)
                .map_err(io_at(&root.join(JOURNAL), "cannot truncate the journal"))?;
        }
        // The packet this directory belongs to: the last rebase's, else the
        // header's (a crash may leave the header behind a rebase).
        let mut records = parsed.records;
        let last_rebase = records
            .iter()
            .rposition(|r| matches!(r, Record::Rebase { .. }));
        let (effective, rebased_to) = match last_rebase.map(|k| &records[k]) {
            Some(Record::Rebase { packet, output, .. }) => (packet.clone(), Some(output.clone())),
            _ => (header_digest, None),
        };
        if effective != digest.to_string() {
            return Err(Error::UpperMismatch {
                path: crate::packet::path::shown_path(root),
                upper: match rebased_to {
                    Some(out) => format!("{effective} (sealed with --rebase to {out})"),
                    None => effective,
                },
                packet: digest.to_string(),
            });
        }
        if let Some(k) = last_rebase {
            records.drain(..k);
        }
        if let Err(e) = mkdirat(&dir, DATA, Mode::from_bits_truncate(0o700)) {
            if e != nix::errno::Errno::EEXIST {
                return Err(nix_at(&root.join(DATA), "cannot create")(e));
            }
        }
        let data = openat(
            &dir,
            DATA,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(nix_at(
            &root.join(DATA),
            "cannot open (it must be a directory, not a symlink)",
        ))?;
        // Before any shard is made: ext4 spreads them over the disk then.
        crate::sys::mark_top_dir(&data);
        let shards = Shards::open(&data, &root.join(DATA))?;
        if let Some(packet) = flat {
            move_to_shards(root, &data, &shards)?;
            write_header(&dir, root, &packet, part)?;
            tracing::info!(upper = %root.display(), "moved the data files to shard directories ({SCHEMA})");
        }
        Ok(Opened {
            upper: Upper {
                _lock: lock,
                root: root.to_owned(),
                part,
                dir,
                data,
                shards,
                shards_synced: AtomicU64::new(0),
                names_synced: Mutex::new(HashSet::new()),
                journal: Mutex::new((journal, parsed.valid_len as u64)),
                journal_name_unsynced: AtomicBool::new(false),
                fds: Mutex::new(LruCache::new(
                    NonZeroUsize::new(OPEN_FILES).unwrap_or(NonZeroUsize::MIN),
                )),
            },
            records,
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Appends one record. On failure the journal is cut back to its
    /// previous length, so no partial line remains (a crash midway leaves
    /// a cut-short last line, which replay drops). A short write is
    /// followed by another for the rest, so that a full disk fails with
    /// its own error (`ENOSPC`, which the application is told), not as a
    /// bare short write.
    pub fn append(&self, rec: &Record) -> Result<()> {
        let line = rec.to_line();
        let mut j = self.journal.lock();
        let (file, len) = &mut *j;
        match (&*file).write_all(&line) {
            Ok(()) => {
                *len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = file.set_len(*len);
                Err(io_at(
                    &self.root.join(JOURNAL),
                    "cannot append to the journal",
                )(e))
            }
        }
    }

    /// Appends `rec` and makes the journal durable; if it cannot be made
    /// durable, takes the record back out, so that the running mount and
    /// its journal agree (a commit record is not left for a later sync to
    /// carry; best effort: the cut itself may fail).
    pub fn append_durable(&self, rec: &Record) -> Result<()> {
        let before = self.journal.lock().1;
        self.append(rec)?;
        self.sync_journal().inspect_err(|_| {
            let mut j = self.journal.lock();
            let (file, len) = &mut *j;
            if file.set_len(before).is_ok() {
                *len = before;
                let _ = file.sync_data();
            }
        })
    }

    /// Makes the journal durable.
    pub fn sync_journal(&self) -> Result<()> {
        self.journal
            .lock()
            .0
            .sync_data()
            .map_err(io_at(&self.root.join(JOURNAL), "cannot fsync the journal"))?;
        if self.journal_name_unsynced.load(Ordering::Acquire) {
            nix::unistd::fsync(&self.dir).map_err(nix_at(&self.root, "cannot fsync"))?;
            self.journal_name_unsynced.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Starts a new journal holding only `first` (a rebase record), and
    /// records `digest` in the header: the journal through a temporary file
    /// renamed over the old one, so a crash leaves one or the other, and
    /// both replay to the same state.
    pub fn compact(&self, first: &Record, digest: &Digest) -> Result<()> {
        let tmp = format!("{JOURNAL}.tmp");
        let at = self.root.join(JOURNAL);
        // Opened for appending now: once renamed it is the journal, with no
        // reopening that could fail and leave appends going to the old one.
        let fd = openat(
            &self.dir,
            tmp.as_str(),
            OFlag::O_RDWR
                | OFlag::O_APPEND
                | OFlag::O_CREAT
                | OFlag::O_TRUNC
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(nix_at(&at, "cannot create a new journal"))?;
        let mut f = File::from(fd);
        let line = first.to_line();
        // Should the new journal not be placed (a full disk, say), the old
        // one stays, and replays to the same state; the new one goes.
        let gone = |e| {
            let _ = unlinkat(&self.dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            e
        };
        f.write_all(&line)
            .and_then(|_| f.sync_all())
            .map_err(io_at(&at, "cannot write a new journal"))
            .map_err(gone)?;
        let mut j = self.journal.lock();
        nix::fcntl::renameat(&self.dir, tmp.as_str(), &self.dir, JOURNAL)
            .map_err(nix_at(&at, "cannot replace the journal"))
            .map_err(gone)?;
        // The rename made durable before anything is appended to the new
        // journal: appends sync only the file, and a lost rename would
        // lose them with it.
        let synced = nix::unistd::fsync(&self.dir).map_err(nix_at(&self.root, "cannot fsync"));
        *j = (f, line.len() as u64);
        if synced.is_err() {
            // Until a sync of the directory succeeds, every sync of the
            // journal tries again.
            self.journal_name_unsynced.store(true, Ordering::Release);
        }
        synced?;
        drop(j);
        write_header(&self.dir, &self.root, digest, self.part)
    }

    /// Creates data file `id` (empty, mode 0600, `O_EXCL`).
    pub fn create_data(&self, id: u64) -> Result<Arc<File>> {
        let name = data_name(id);
        let shard = self.shards.get_or_make(&self.data, id, &self.root)?;
        let fd = openat(
            shard,
            name.as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| self.data_err(id, "cannot create")(e.into()))?;
        let f = Arc::new(File::from(fd));
        self.fds.lock().put(id, f.clone());
        Ok(f)
    }

    /// An open handle on data file `id` (from the cache, or opened).
    pub fn data(&self, id: u64) -> Result<Arc<File>> {
        if let Some(f) = self.fds.lock().get(&id) {
            return Ok(f.clone());
        }
        let fd = openat(
            self.shard(id, "cannot open")?,
            data_name(id).as_str(),
            OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.data_err(id, "cannot open")(e.into()))?;
        let f = Arc::new(File::from(fd));
        self.fds.lock().put(id, f.clone());
        Ok(f)
    }

    /// Stat of data file `id`.
    pub fn stat_data(&self, id: u64) -> Result<FileStat> {
        if let Some(f) = self.fds.lock().peek(&id) {
            return nix::sys::stat::fstat(f.as_fd())
                .map_err(|e| self.data_err(id, "cannot stat")(e.into()));
        }
        fstatat(
            self.shard(id, "cannot stat")?,
            data_name(id).as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.data_err(id, "cannot stat")(e.into()))
    }

    /// Removes data file `id` (its last name is gone and nothing has it open).
    pub fn remove_data(&self, id: u64) {
        self.fds.lock().pop(&id);
        self.names_synced.lock().remove(&id);
        let Some(shard) = self.shards.get(id) else {
            return;
        };
        if let Err(e) = unlinkat(shard, data_name(id).as_str(), UnlinkatFlags::NoRemoveDir) {
            tracing::warn!(id, error = %e, "cannot remove an unused data file; it will be removed at the next mount");
        }
    }

    /// Ids of every data file present (names that are not ids are ignored).
    pub fn list_data(&self) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        for (k, shard) in self.shards.made() {
            let at = self.root.join(DATA).join(shard_name(k));
            ids.extend(list_ids(shard, &at)?);
        }
        Ok(ids)
    }

    /// The shard directory of data file `id`, which must exist (a data file
    /// in a shard never made does not: `ENOENT`, as for the file itself).
    fn shard(&self, id: u64, what: &str) -> Result<&OwnedFd> {
        self.shards
            .get(id)
            .ok_or_else(|| self.data_err(id, what)(io::Error::from_raw_os_error(libc::ENOENT)))
    }

    /// Makes data file `id`'s name durable, once per file: its entry in its
    /// shard, and the shard's entry in `data/`. With the file's own
    /// `fsync`, the file then survives a power cut on any filesystem, not
    /// only on those whose journal commits a new name with the file.
    pub fn sync_data_name(&self, id: u64) -> Result<()> {
        if self.names_synced.lock().contains(&id) {
            return Ok(());
        }
        let shard = self.shard(id, "cannot fsync the directory of")?;
        let bit = 1u64 << (id % SHARDS);
        let at = self.root.join(DATA);
        nix::unistd::fsync(shard)
            .map_err(nix_at(&at.join(shard_name(id % SHARDS)), "cannot fsync"))?;
        if self.shards_synced.load(Ordering::Acquire) & bit == 0 {
            nix::unistd::fsync(&self.data).map_err(nix_at(&at, "cannot fsync"))?;
            self.shards_synced.fetch_or(bit, Ordering::AcqRel);
        }
        self.names_synced.lock().insert(id);
        Ok(())
    }

    /// Numbers of the upper directory's filesystem.
    pub fn statfs(&self) -> Result<nix::sys::statvfs::Statvfs> {
        nix::sys::statvfs::fstatvfs(&self.data).map_err(nix_at(&self.root, "cannot statfs"))
    }

    fn data_err(&self, id: u64, what: &str) -> impl FnOnce(io::Error) -> Error + use<> {
        let path = self.root.join(data_path(id));
        io_at(&path, what)
    }
}

/// Where data file `id` is, relative to the upper directory.
pub fn data_path(id: u64) -> PathBuf {
    Path::new(DATA)
        .join(shard_name(id % SHARDS))
        .join(data_name(id))
}

fn shard_name(k: u64) -> String {
    format!("{k:02x}")
}

/// The shard directories beneath `data/`: those that exist are opened with
/// the upper directory, the others made when a data file first needs one.
/// (Making all 64 at every mount of a fresh upper directory cost the mount
/// several ms on ext4, whose allocator looks over the disk's block groups
/// for each new directory.)
struct Shards {
    dirs: Box<[OnceLock<OwnedFd>]>,
    /// Held while a shard is made, so that it is made once.
    making: Mutex<()>,
}

impl Shards {
    /// Opens the shards present in `data` (at `at`).
    fn open(data: &OwnedFd, at: &Path) -> Result<Shards> {
        let dirs: Box<[OnceLock<OwnedFd>]> = (0..SHARDS).map(|_| OnceLock::new()).collect();
        for (k, slot) in dirs.iter().enumerate() {
            match open_shard(data, k as u64) {
                Ok(fd) => drop(slot.set(fd)),
                Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(shard_open_failed(at, k as u64)(e)),
            }
        }
        Ok(Shards {
            dirs,
            making: Mutex::new(()),
        })
    }

    /// The shard of data file `id`, if it exists.
    fn get(&self, id: u64) -> Option<&OwnedFd> {
        self.dirs[(id % SHARDS) as usize].get()
    }

    /// The shard of data file `id`, made now if it does not exist yet
    /// (`root` is the upper directory, for errors).
    fn get_or_make(&self, data: &OwnedFd, id: u64, root: &Path) -> Result<&OwnedFd> {
        let k = id % SHARDS;
        let slot = &self.dirs[k as usize];
        if let Some(fd) = slot.get() {
            return Ok(fd);
        }
        let _making = self.making.lock();
        if let Some(fd) = slot.get() {
            return Ok(fd);
        }
        let name = shard_name(k);
        match mkdirat(data, name.as_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(nix_at(&root.join(DATA).join(&name), "cannot create")(e)),
        }
        let fd = open_shard(data, k).map_err(shard_open_failed(&root.join(DATA), k))?;
        Ok(slot.get_or_init(|| fd))
    }

    /// The shards that exist, with their numbers.
    fn made(&self) -> impl Iterator<Item = (u64, &OwnedFd)> {
        (0..SHARDS).filter_map(|k| Some((k, self.dirs[k as usize].get()?)))
    }
}

/// Opens shard directory `k` beneath `data`, never through a symlink.
fn open_shard(data: &OwnedFd, k: u64) -> nix::Result<OwnedFd> {
    openat(
        data,
        shard_name(k).as_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// The error of a shard directory `k` beneath `data` (at `data_at`) that
/// does not open.
fn shard_open_failed(data_at: &Path, k: u64) -> impl FnOnce(nix::errno::Errno) -> Error + use<> {
    nix_at(
        &data_at.join(shard_name(k)),
        "cannot open (it must be a directory, not a symlink)",
    )
}

/// Ids of the data files in directory `dir` (at `at`).
fn list_ids(dir: &OwnedFd, at: &Path) -> Result<Vec<u64>> {
    let fd = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(nix_at(at, "cannot open"))?;
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(nix_at(at, "cannot read"))?;
    let mut ids = Vec::new();
    for ent in dir.iter() {
        let ent = ent.map_err(nix_at(at, "cannot read"))?;
        if let Some(id) = parse_data_name(ent.file_name().to_bytes()) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Moves the data files of a `sessionfs.upper/1` directory, all in `data/`,
/// into their shards, and makes the moves durable before the caller writes
/// the new header: a crash in between leaves the old header, and the next
/// open moves what is left.
fn move_to_shards(root: &Path, data: &OwnedFd, shards: &Shards) -> Result<()> {
    let at = root.join(DATA);
    for id in list_ids(data, &at)? {
        let name = data_name(id);
        let shard = shards.get_or_make(data, id, root)?;
        nix::fcntl::renameat(data, name.as_str(), shard, name.as_str())
            .map_err(nix_at(&at.join(&name), "cannot move into its shard"))?;
    }
    for (k, shard) in shards.made() {
        nix::unistd::fsync(shard).map_err(nix_at(&at.join(shard_name(k)), "cannot fsync"))?;
    }
    nix::unistd::fsync(data).map_err(nix_at(&at, "cannot fsync"))
}

/// File name of data file `id`: 16 lowercase hex digits.
pub fn data_name(id: u64) -> String {
    format!("{id:016x}")
}

fn parse_data_name(name: &[u8]) -> Option<u64> {
    if name.len() != 16 || !name.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(name).ok()?, 16).ok()
}

/// The part the upper directory at `root` was made for (`None`: the whole
/// packet), as its header records; `None` too when it has no header yet.
/// An offline seal mounts it the same way.
pub fn recorded_part(root: &Path) -> Result<Option<Part>> {
    let dir = match nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        // Upper::open reports what is wrong with the directory itself.
        Err(_) => return Ok(None),
    };
    match fstatat(&dir, HEADER, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(read_header(&dir, &root.join(HEADER))?.part),
        Err(_) => Ok(None),
    }
}

fn part_name(part: Option<Part>) -> String {
    match part {
        Some(p) => format!("--part {p}"),
        None => "the whole packet".into(),
    }
}

fn read_header(dir: &OwnedFd, header_path: &Path) -> Result<Header> {
    let mut text = String::new();
    let fd = openat(
        dir,
        HEADER,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(nix_at(header_path, "cannot open"))?;
    File::from(fd)
        .take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(io_at(header_path, "cannot read"))?;
    let h: Header = serde_json::from_str(&text).map_err(|e| Error::UpperRefused {
        path: crate::packet::path::shown_path(header_path),
        reason: format!("not a valid upper header: {e}"),
    })?;
    if h.schema != SCHEMA && h.schema != SCHEMA_FLAT {
        return Err(Error::UpperRefused {
            path: crate::packet::path::shown_path(header_path),
            reason: format!(
                "upper schema `{}` is not supported (this sessionfs uses {SCHEMA})",
                h.schema
            ),
        });
    }
    Ok(h)
}

fn write_header(
    dir: &OwnedFd,
    root: &Path,
    packet: &dyn std::fmt::Display,
    part: Option<Part>,
) -> Result<()> {
    let header = Header {
        schema: SCHEMA.into(),
        packet: packet.to_string(),
        part,
    };
    let mut text = serde_json::to_vec(&header).unwrap_or_default();
    text.push(b'\n');
    let tmp = format!("{HEADER}.tmp");
    let fd = openat(
        dir,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(nix_at(&root.join(&tmp), "cannot create"))?;
    let mut f = File::from(fd);
    // Not placed, the temporary file goes; the old header stays.
    let gone = |e| {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        e
    };
    f.write_all(&text)
        .and_then(|_| f.sync_all())
        .map_err(io_at(&root.join(&tmp), "cannot write"))
        .map_err(gone)?;
    nix::fcntl::renameat(dir, tmp.as_str(), dir, HEADER)
        .map_err(nix_at(&root.join(HEADER), "cannot create"))
        .map_err(gone)?;
    nix::unistd::fsync(dir).map_err(nix_at(root, "cannot fsync"))
}

trait DirBuilderExt {
    fn mode_0700(&mut self) -> &mut Self;
}

impl DirBuilderExt for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt as _;
        self.mode(0o700)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_names() {
        assert_eq!(data_name(255), "00000000000000ff");
        assert_eq!(parse_data_name(b"00000000000000ff"), Some(255));
        assert_eq!(parse_data_name(b"00000000000000FF"), None);
        assert_eq!(parse_data_name(b"ff"), None);
    }
}
