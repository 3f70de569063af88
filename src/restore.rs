//! `unpack`: restores a packet's tree for placements without FUSE.
//!
//! Nothing appears at the target until every byte has verified: the tree is
//! built in a private staging directory (mode 0700) beside the target, each
//! file created `O_EXCL` with mode 0600 and given its final mode and mtime
//! only once its content verified, symlinks created last, and the staging
//! directory renamed onto the target at the end. Every path is opened
//! beneath the staging directory with symlink traversal refused.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, fchmod, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::symlinkat;
use rayon::prelude::*;
use serde::Serialize;

use crate::packet::digest::Digest;
use crate::packet::error::{ErrorClass, ErrorKind};
use crate::packet::format::{MODE_DIR, MODE_EXEC, MODE_FILE};
use crate::packet::manifest::EntryKind;
use crate::packet::path::Part;
use crate::packet::reader::{Event, Packet, Source};
use crate::packet::{self, resolve};
use crate::sys;

/// An unpack error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The packet was refused.
    #[error(transparent)]
    Packet(#[from] packet::Error),
    /// The target cannot be used.
    #[error("{path}: {reason}")]
    Target {
        /// The target directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// `--part` names a part the packet does not have.
    #[error(
        "{path}: the packet has no {part} part to unpack; unpack without --part, or with the part it has"
    )]
    PartMissing {
        /// The packet.
        path: String,
        /// The part asked for.
        part: Part,
    },
    /// The operating system refused an operation.
    #[error("{path}: {op}: {source}")]
    Io {
        /// Where.
        path: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Stable kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Packet(e) => e.kind(),
            Error::Target { .. } => ErrorKind::TargetUnusable,
            Error::PartMissing { .. } => ErrorKind::PartMissing,
            Error::Io { .. } => ErrorKind::Io,
        }
    }

    /// Exit-code class.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Packet(e) => e.class(),
            Error::Target { .. } | Error::PartMissing { .. } => ErrorClass::Refused,
            Error::Io { .. } => ErrorClass::Io,
        }
    }

    /// The path concerned.
    pub fn path(&self) -> Option<&str> {
        match self {
            Error::Packet(e) => e.path(),
            Error::Target { path, .. }
            | Error::PartMissing { path, .. }
            | Error::Io { path, .. } => Some(path),
        }
    }
}

fn io_err<'a>(path: &'a str, op: &'static str) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// What to restore.
pub struct UnpackOptions {
    /// Target directory (absent or empty).
    pub into: PathBuf,
    /// Restore only this part, as the target's root.
    pub part: Option<Part>,
    /// Refuse symlinks that resolve outside the restored tree.
    pub strict_symlinks: bool,
    /// Expected digest.
    pub digest: Option<Digest>,
    /// Owner (uid, gid) given to every restored entry; `None` leaves them
    /// to the user running the unpack.
    pub owner: Option<(u32, u32)>,
}

/// What was restored.
#[derive(Debug, Serialize)]
pub struct UnpackOutcome {
    /// Packet digest.
    pub digest: Digest,
    /// Entries restored.
    pub entries: u64,
    /// Files restored.
    pub files: u64,
    /// Bytes of content written.
    pub content_bytes: u64,
    /// Where.
    pub into: String,
}

/// The checks made of the manifest before a byte of content is read,
/// for a restore to a tree or to a tar stream: the digest, the part
/// (returned: the entry that becomes the root, `""` for the packet's
/// root), and with `strict`, that no symlink leaves it.
pub fn preflight<B: Source>(
    packet: &Packet<B>,
    digest: Option<&Digest>,
    part: Option<Part>,
    strict: bool,
) -> Result<&'static str, Error> {
    packet.check_digest(digest)?;
    let root_name = part.map_or("", Part::as_str);
    if let Some(part) = part
        && !packet.manifest.has_part(part)
    {
        return Err(Error::PartMissing {
            path: crate::packet::path::shown_path(packet.path()),
            part,
        });
    }
    if strict {
        resolve::check_no_escapes(&packet.manifest, root_name)?;
    }
    Ok(root_name)
}

/// Where entry `path` goes beneath the root `root` (`""` for the packet's
/// root): `None` when it is not restored, `Some("")` for the root itself.
pub fn rel<'p>(root: &str, path: &'p str) -> Option<&'p str> {
    if root.is_empty() {
        return Some(path);
    }
    let rest = path.strip_prefix(root)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

/// Restores `packet` per `opts`. On error the target is as it was.
pub fn unpack<B: Source + Sync>(
    packet: &Packet<B>,
    opts: &UnpackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<UnpackOutcome, Error> {
    let root_name = preflight(
        packet,
        opts.digest.as_ref(),
        opts.part,
        opts.strict_symlinks,
    )?;
    let into = &lexical_target(&opts.into);
    let exists = check_target(into)?;
    let shown = crate::packet::path::shown_path(into);
    let parent = match into.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = into
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The staging directory is made in the target (when it exists) or
    // beside it, and named, moved and removed relative to that directory
    // held open, never by path: a directory moved during the run (or a
    // parent of it) keeps nothing behind, and the tree goes into place
    // only if the directory is still where the target says.
    let (anchor_path, anchor_op) = if exists {
        (
            into.as_path(),
            "cannot create a staging directory in the target",
        )
    } else {
        (
            parent,
            "cannot create a staging directory beside the target",
        )
    };
    let anchor: OwnedFd = nix::fcntl::open(
        anchor_path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR if !exists => Error::Target {
            path: shown.clone(),
            reason: crate::output::missing_directory(parent),
        },
        e => io_err(&shown, anchor_op)(e.into()),
    })?;
    let registered = anchor.try_clone().map_err(io_err(&shown, anchor_op))?;
    // Private (0700) until its entries are in place; removed on any error.
    // Beside a new target, renamed onto it; inside an existing (empty)
    // one, emptied into it, so that the directory keeps its owner, mode
    // and inode, and a mountpoint (a pod's volume) stays one.
    let prefix = if exists {
        ".sessionfs-unpack.".to_owned()
    } else {
        format!(
            ".{}.sessionfs-unpack.",
            // Room for the rest (25 bytes with the random part).
            crate::sys::name_part(&name, crate::sys::NAME_MAX - 25)
        )
    };
    // Made and registered as one step: an interrupt between the two would
    // leave it.
    let creating = crate::interrupt::creating();
    // tempfile picks the names (and tries again where one is taken); the
    // directory is made in the one held open, not by path.
    let made = tempfile::Builder::new()
        .prefix(&prefix)
        .make_in(anchor_path, |path| {
            let name = path.file_name().unwrap_or_default();
            mkdirat(anchor.as_fd(), name, Mode::from_bits_truncate(0o700))
                .map_err(std::io::Error::from)
        })
        .map_err(io_err(&shown, anchor_op))?;
    let (_, staging_path) = made
        .keep()
        .map_err(|e| io_err(&shown, anchor_op)(e.error))?;
    let staging_name = staging_path.file_name().unwrap_or_default().to_owned();
    let staging = StagingDir {
        dir: anchor.as_fd(),
        name: &staging_name,
        placed: false,
    };
    let pending =
        crate::interrupt::remove_on_interrupt_at(registered, &staging_name, &staging_path);
    drop(creating);
    let stage_fd: OwnedFd = nix::fcntl::openat(
        anchor.as_fd(),
        staging_name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(&shown, "cannot open the staging directory")(e.into()))?;
    // Held until the end: a staging directory nobody holds is the debris of
    // a killed unpack, which the next one into this target removes.
    let _held = stage_fd.try_clone().ok().and_then(|fd| {
        nix::fcntl::Flock::lock(fd, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()
    });

    let writer = Restorer {
        packet,
        stage: stage_fd.as_fd(),
        root_name,
        owner: opts.owner,
    };
    // An entry that could not be written is named where it was going (the
    // target, not the packet's path): a full disk is the target's.
    let outcome = writer.restore(progress).map_err(|e| match e {
        Error::Io { path, op, source } => Error::Io {
            path: match writer.rel(&path) {
                Some("") | None => shown.clone(),
                Some(rel) => format!("{}/{rel}", shown.trim_end_matches('/')),
            },
            op,
            source,
        },
        e => e,
    })?;
    crate::barrier::wait(
        crate::barrier::from_env().as_deref(),
        crate::barrier::Point::Restored,
    );
    if !exists {
        // The new root's owner, before it is in place: it widens nothing
        // (the directory is private) and a refusal leaves nothing behind.
        writer.chown(stage_fd.as_fd(), &shown)?;
    }
    // The directory held is still the one the target names: one moved or
    // replaced meanwhile (by a symlink, say) does not get the tree.
    if !sys::is_at(anchor.as_fd(), anchor_path) {
        let which = if exists {
            "the target"
        } else {
            "the target's directory"
        };
        return Err(Error::Target {
            path: shown,
            reason: format!(
                "{which} was moved or replaced while the packet was restored; nothing was \
                 placed: unpack again"
            ),
        });
    }
    // An interrupt sees the tree either not moved (and removes the staging
    // directory) or in place (and leaves it be).
    let commit = crate::interrupt::creating();
    if exists {
        move_into(stage_fd.as_fd(), anchor.as_fd()).map_err(|e| Error::Target {
            path: shown.clone(),
            reason: format!("cannot move the restored tree into place: {e}"),
        })?;
    } else {
        // Not over a directory made there meanwhile (an empty one would be
        // replaced, its owner and mode lost): that one is someone's.
        let to = Path::new(into.file_name().unwrap_or_default());
        let from = Path::new(&staging_name);
        sys::rename_noreplace_at(anchor.as_fd(), from, anchor.as_fd(), to).map_err(|e| {
            Error::Target {
                path: shown.clone(),
                reason: match e.raw_os_error() {
                    Some(libc::EEXIST | libc::ENOTEMPTY) => "was made by someone else while the \
                        packet was restored; it is left as it is: unpack into it again (if it \
                        is an empty directory) or into another one"
                        .into(),
                    _ => format!("cannot move the restored tree into place: {e}"),
                },
            }
        })?;
        // The directory now lives at the target: not to be removed.
        let mut staging = staging;
        staging.placed = true;
        // Private until now, so that a staging directory a killed unpack
        // left is known by its mode; it becomes the target root.
        fchmod(stage_fd.as_fd(), crate::sys::mode(MODE_DIR))
            .map_err(|err| io_err(&shown, "cannot set directory mode")(err.into()))?;
    }
    drop(pending);
    crate::interrupt::committed();
    drop(commit);
    crate::barrier::wait(
        crate::barrier::from_env().as_deref(),
        crate::barrier::Point::Committed,
    );
    Ok(UnpackOutcome {
        into: shown,
        ..outcome
    })
}

/// The staging directory, by its name in the directory held: removed
/// (with what is in it, but never through a mount) when dropped, unless
/// it was `placed` at the target.
struct StagingDir<'a> {
    dir: std::os::fd::BorrowedFd<'a>,
    name: &'a std::ffi::OsStr,
    placed: bool,
}

impl Drop for StagingDir<'_> {
    fn drop(&mut self) {
        if !self.placed
            && let Err(e) = sys::remove_tree_at(self.dir, self.name)
        {
            tracing::warn!(name = ?self.name, error = %e, "cannot remove the staging directory");
        }
    }
}

/// Moves every entry of the directory `staging` into `into` (its
/// parent), none over an existing name; on a failure, moves back those
/// already moved, so that `into` holds only the staging directory again
/// (removed by the caller).
fn move_into(
    staging: std::os::fd::BorrowedFd<'_>,
    into: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    let mut names = Vec::new();
    for e in nix::dir::Dir::from_fd(staging.try_clone_to_owned()?)?.iter() {
        let n = e?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            names.push(std::ffi::OsString::from_vec(n));
        }
    }
    let mut moved: Vec<&Path> = Vec::new();
    for n in &names {
        let n = Path::new(n);
        if let Err(e) = sys::rename_noreplace_at(staging, n, into, n) {
            for &m in moved.iter().rev() {
                let _ = sys::rename_noreplace_at(into, m, staging, m);
            }
            return Err(e);
        }
        moved.push(n);
    }
    Ok(())
}

/// What [`remove_stale_staging`] found.
enum Staging {
    /// Not a staging directory of a killed unpack: the target is not empty.
    No,
    /// One, removed.
    Removed,
    /// One, kept: why.
    Kept(String),
}

/// Removes `path` if it is the staging directory of an unpack into this
/// target that was killed (named `.sessionfs-unpack.*`, a real directory,
/// mode 0700 and ours, and no live unpack holds its lock), unless a file
/// system is mounted inside it: what is mounted there is not the killed
/// unpack's to remove.
fn remove_stale_staging(path: &Path) -> Staging {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(".sessionfs-unpack."));
    // Ours as made: a real directory, private (0700) and owned by us; a
    // directory someone made with that name is not removed.
    let ours = std::fs::symlink_metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        // (A setgid parent makes it 02700: a pod's fsGroup volume.)
        m.is_dir() && m.mode() & 0o777 == 0o700 && m.uid() == nix::unistd::geteuid().as_raw()
    });
    if !named || !ours {
        return Staging::No;
    }
    let Ok(fd) = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return Staging::No;
    };
    let Ok(_lock) = nix::fcntl::Flock::lock(fd, nix::fcntl::FlockArg::LockExclusiveNonblock) else {
        return Staging::No; // an unpack at work
    };
    if let Some(inside) = mounted_inside(path) {
        return Staging::Kept(format!(
            "the target holds the staging directory of an unpack that was killed, and a file \
             system is mounted inside it ({}); unmount it, then unpack again",
            inside.display()
        ));
    }
    tracing::info!(path = %path.display(), "removing the staging directory of an unpack that was killed");
    if std::fs::remove_dir_all(path).is_ok() {
        Staging::Removed
    } else {
        Staging::No
    }
}

/// A mount point at or under directory `dir`, if there is one: from the
/// mount table where there is one (a bind mount shares its device), else
/// the first entry on another device.
fn mounted_inside(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(dir).ok()?;
    if let Some(mounts) = crate::sys::mounts() {
        let under = |p: &[u8]| {
            p.strip_prefix(real.as_os_str().as_bytes())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
        };
        return mounts
            .into_iter()
            .find(|m| under(&m.point))
            .map(|m| PathBuf::from(std::ffi::OsStr::from_bytes(&m.point)));
    }
    let dev = std::fs::symlink_metadata(dir).ok()?.dev();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let m = e.metadata().ok()?;
            if m.dev() != dev {
                return Some(e.path());
            }
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    None
}

/// The target as it names itself: without trailing separators or `.`
/// components (`link/` and `link/.` are `link`, which must not be a
/// symlink: with them, every call would resolve it). A last `..` names the
/// directory the path climbs to, resolved (it cannot be a symlink).
fn lexical_target(into: &Path) -> PathBuf {
    use std::path::Component;
    let p: PathBuf = into.components().collect();
    match p.components().next_back() {
        Some(Component::ParentDir) => std::fs::canonicalize(&p).unwrap_or(p),
        _ if p.as_os_str().is_empty() => PathBuf::from("."),
        _ => p,
    }
}

/// The target must be absent, or an empty directory (not a symlink), or
/// hold only the staging directory of a killed unpack (removed); returns
/// whether it exists.
fn check_target(into: &Path) -> Result<bool, Error> {
    let shown = crate::packet::path::shown_path(into);
    let refuse = |reason: &str| Error::Target {
        path: shown.clone(),
        reason: reason.into(),
    };
    match std::fs::symlink_metadata(into) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(&shown, "cannot stat the target")(e)),
        Ok(m) if m.file_type().is_symlink() => {
            Err(refuse("the target is a symlink; name a real directory"))
        }
        Ok(m) if !m.is_dir() => Err(refuse("the target exists and is not a directory")),
        Ok(_) => {
            let it = std::fs::read_dir(into).map_err(io_err(&shown, "cannot read the target"))?;
            for e in it {
                let e = e.map_err(io_err(&shown, "cannot read the target"))?;
                match remove_stale_staging(&e.path()) {
                    Staging::Removed => {}
                    Staging::Kept(why) => return Err(refuse(&why)),
                    Staging::No => {
                        return Err(refuse(
                            "the target directory is not empty; unpack into an empty or new \
                             directory",
                        ));
                    }
                }
            }
            Ok(true)
        }
    }
}

struct Restorer<'a, B> {
    packet: &'a Packet<B>,
    stage: std::os::fd::BorrowedFd<'a>,
    /// `""`, or the part restored as the root.
    root_name: &'a str,
    /// Owner for every entry, if asked.
    owner: Option<(u32, u32)>,
}

impl<B: Source + Sync> Restorer<'_, B> {
    /// Where entry `path` goes, relative to the staging directory; `None`
    /// when it is not restored; `Some("")` for the root itself.
    fn rel<'p>(&self, path: &'p str) -> Option<&'p str> {
        rel(self.root_name, path)
    }

    fn restore(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<UnpackOutcome, Error> {
        let m = &self.packet.manifest;
        let private = Mode::from_bits_truncate(0o700);
        for e in &m.entries {
            if let (EntryKind::Dir, Some(rel)) = (&e.kind, self.rel(&e.path)) {
                if !rel.is_empty() {
                    let (dir, name) = sys::parent_beneath(self.stage, Path::new(rel))
                        .map_err(io_err(&e.path, "cannot open the directory of"))?;
                    let at = dir.as_ref().map_or(self.stage, |d| d.as_fd());
                    let _creating = crate::interrupt::creating();
                    mkdirat(at, name, private)
                        .map_err(|err| io_err(&e.path, "cannot create directory")(err.into()))?;
                }
            }
        }
        let batches = self.packet.batches();
        batches
            .into_par_iter()
            .try_for_each_init(Vec::new, |buf, range| {
                self.restore_batch(range, buf, progress)
            })?;
        self.packet.check_end()?;
        let (mut entries, mut files, mut bytes) = (0, 0, 0);
        for e in &m.entries {
            let Some(rel) = self.rel(&e.path) else {
                continue;
            };
            entries += 1;
            match &e.kind {
                EntryKind::Symlink(target) => {
                    let (dir, name) = sys::parent_beneath(self.stage, Path::new(rel))
                        .map_err(io_err(&e.path, "cannot open the directory of"))?;
                    let at = dir.as_ref().map_or(self.stage, |d| d.as_fd());
                    let _creating = crate::interrupt::creating();
                    symlinkat(&**target, at, name)
                        .map_err(|err| io_err(&e.path, "cannot create symlink")(err.into()))?;
                    if let Some((uid, gid)) = self.owner {
                        nix::unistd::fchownat(
                            at,
                            name,
                            Some(uid.into()),
                            Some(gid.into()),
                            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                        )
                        .map_err(|err| io_err(&e.path, "cannot set owner")(err.into()))?;
                    }
                }
                EntryKind::File(f) => {
                    files += 1;
                    bytes += f.size;
                }
                EntryKind::Dir => {}
            }
        }
        // Directories get their final mode last, deepest first order does
        // not matter for chmod. The staging root stays private (0700) until
        // it is in place (see `finish_root`).
        for e in m.entries.iter().filter(|e| e.is_dir()) {
            if let Some(rel) = self.rel(&e.path).filter(|r| !r.is_empty()) {
                let fd = self.open(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, &e.path)?;
                self.chown(&fd, &e.path)?;
                fchmod(&fd, crate::sys::mode(MODE_DIR))
                    .map_err(|err| io_err(&e.path, "cannot set directory mode")(err.into()))?;
            }
        }
        Ok(UnpackOutcome {
            digest: self.packet.digest,
            entries,
            files,
            content_bytes: bytes,
            into: String::new(),
        })
    }

    /// Gives `fd` (entry `shown`) the owner asked for, if any.
    fn chown(&self, fd: impl AsFd, shown: &str) -> Result<(), Error> {
        let Some((uid, gid)) = self.owner else {
            return Ok(());
        };
        nix::unistd::fchown(fd, Some(uid.into()), Some(gid.into()))
            .map_err(|err| io_err(shown, "cannot set owner")(err.into()))
    }

    fn open(&self, rel: &str, flags: OFlag, shown: &str) -> Result<OwnedFd, Error> {
        sys::open_beneath(
            self.stage,
            Path::new(rel),
            flags,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(io_err(shown, "cannot open"))
    }

    fn restore_batch(
        &self,
        range: std::ops::Range<usize>,
        buf: &mut Vec<u8>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        let entries = &self.packet.manifest.entries;
        let mut current: Option<(usize, Sparse)> = None;
        let mut failure: Option<Error> = None;
        let create = |i: usize| -> Result<Sparse, Error> {
            let e = &entries[i];
            let rel = self.rel(&e.path).unwrap_or_default();
            let _creating = crate::interrupt::creating();
            let fd = self.open(
                rel,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                &e.path,
            )?;
            Ok(Sparse::new(File::from(fd)))
        };
        let mut sink = |ev: Event<'_>| -> packet::Result<()> {
            let result = (|| -> Result<(), Error> {
                match ev {
                    Event::Data(i, bytes) => {
                        if self.rel(&entries[i].path).is_none() {
                            return Ok(());
                        }
                        if current.as_ref().map(|c| c.0) != Some(i) {
                            current = Some((i, create(i)?));
                        }
                        if let Some((_, f)) = current.as_mut() {
                            f.write(bytes)
                                .map_err(io_err(&entries[i].path, "cannot write"))?;
                        }
                        progress(bytes.len() as u64);
                    }
                    Event::Verified(i) => {
                        let e = &entries[i];
                        let (EntryKind::File(meta), Some(_)) = (&e.kind, self.rel(&e.path)) else {
                            return Ok(());
                        };
                        let file = match current.take() {
                            Some((j, f)) if j == i => f,
                            _ => create(i)?, // empty file: no data events
                        }
                        .finish(meta.size)
                        .map_err(io_err(&e.path, "cannot write"))?;
                        let t = TimeSpec::new(
                            (meta.mtime_ns / 1_000_000_000) as _,
                            (meta.mtime_ns % 1_000_000_000) as _,
                        );
                        futimens(&file, &t, &t)
                            .map_err(|err| io_err(&e.path, "cannot set mtime")(err.into()))?;
                        self.chown(&file, &e.path)?;
                        let mode = if meta.executable {
                            MODE_EXEC
                        } else {
                            MODE_FILE
                        };
                        fchmod(&file, crate::sys::mode(mode))
                            .map_err(|err| io_err(&e.path, "cannot set mode")(err.into()))?;
                    }
                }
                Ok(())
            })();
            result.map_err(|e| {
                // Keep the rich error; hand the packet layer a marker.
                let marker = packet::Error::io("restore", std::io::Error::other(e.to_string()));
                failure = Some(e);
                marker
            })
        };
        let checked = self.packet.check_batch(range, buf, &mut sink);
        match (checked, failure) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(e.into()),
            (Ok(()), None) => Ok(()),
        }
    }
}

/// A new file written in order, its blocks of zeros left as holes (see
/// [`sys::write_sparse`]) so that a sparse file packed (its holes read as
/// zeros) comes back sparse instead of taking its full size on disk.
struct Sparse {
    file: File,
    /// Offset of the next byte given.
    pos: u64,
    /// End of the last byte written.
    end: u64,
}

impl Sparse {
    fn new(file: File) -> Sparse {
        Sparse {
            file,
            pos: 0,
            end: 0,
        }
    }

    /// Writes `bytes` at the current offset.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(end) = sys::write_sparse(&self.file, bytes, self.pos)? {
            self.end = end;
        }
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// The file, `size` long: a hole at its end is made by the length.
    fn finish(self, size: u64) -> std::io::Result<File> {
        if self.end < size {
            self.file.set_len(size)?;
        }
        Ok(self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Content of blocks (zero or not, of any length) written in pieces
    /// split anywhere comes back the same, whatever was left as holes.
    fn write_split(content: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut f = Sparse::new(tempfile::tempfile().unwrap());
        let mut at = 0;
        for &c in cuts.iter().chain([&content.len()]) {
            let c = c.clamp(at, content.len());
            f.write(&content[at..c]).unwrap();
            at = c;
        }
        let mut back = Vec::new();
        // Written with pwrite: the shared offset is still 0.
        std::io::Read::read_to_end(&mut f.finish(content.len() as u64).unwrap(), &mut back)
            .unwrap();
        back
    }

    proptest! {
        #[test]
        fn sparse_writes_keep_the_content(
            blocks in proptest::collection::vec((any::<bool>(), 1usize..9000, any::<u8>()), 0..12),
            mut cuts in proptest::collection::vec(0usize..60_000, 0..8),
        ) {
            let mut content = Vec::new();
            for (zero, len, byte) in blocks {
                content.extend(std::iter::repeat_n(if zero { 0 } else { byte | 1 }, len));
            }
            cuts.sort_unstable();
            prop_assert_eq!(write_split(&content, &cuts), content);
        }
    }
}
