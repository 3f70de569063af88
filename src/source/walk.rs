//! Reading a real directory tree into packet entries, without following a
//! single symlink: every directory is opened beneath its part root with
//! symlink traversal refused by the kernel (`openat2`), names are judged by
//! the exclusion policy, special files are dropped and reported.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};
use rayon::prelude::*;

use super::error::Error;
use super::policy::{Policy, Reason, Verdict};
use super::report::{
    EntryType, Excluded, ScanReport, Step, Tally, check_file_size, judge, non_utf8_name,
    non_utf8_target,
};
use super::symlink::{rebase, rebase_after};
use crate::packet::error::LimitKind;
use crate::packet::format::Limits;
use crate::packet::path::Part;
use crate::sys;

/// One part root being packed.
pub struct Root {
    /// Which part.
    pub part: Part,
    /// The directory as given.
    pub dir: PathBuf,
    /// Open directory handle; every open beneath it refuses symlinks.
    pub fd: OwnedFd,
    /// Absolute spellings of the root (lexical and canonical), for rebasing,
    /// as bytes: a root whose path is not UTF-8 still rebases the links
    /// into it whose rest is.
    spellings: Vec<Vec<u8>>,
}

impl Root {
    /// Opens a part root. The root itself may be reached through a symlink
    /// (it is what the user named); nothing beneath it is.
    pub fn open(part: Part, dir: &Path) -> Result<Root, Error> {
        let io = |op, e| Error::io(dir, op, e);
        let meta = std::fs::metadata(dir).map_err(|e| io("cannot stat", e))?;
        if !meta.is_dir() {
            return Err(Error::NotADirectory {
                path: crate::packet::path::shown_path(dir),
            });
        }
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io("cannot open", e.into()))?;
        let spellings = root_spellings_raw(dir);
        Ok(Root {
            part,
            dir: dir.to_owned(),
            fd,
            spellings,
        })
    }
}

/// The absolute spellings of a directory for symlink rebasing: as given
/// (made absolute) and canonical; those that are UTF-8 (a spelling made
/// lossy would rebase links into another directory).
pub fn root_spellings(dir: &Path) -> Vec<String> {
    root_spellings_raw(dir)
        .into_iter()
        .filter_map(|s| String::from_utf8(s).ok())
        .collect()
}

/// [`root_spellings`], as bytes, UTF-8 or not.
fn root_spellings_raw(dir: &Path) -> Vec<Vec<u8>> {
    let mut spellings = Vec::new();
    if let Ok(abs) = std::path::absolute(dir) {
        spellings.push(lexical_root(&abs));
    }
    if let Ok(canon) = std::fs::canonicalize(dir) {
        spellings.push(lexical_root(&canon));
    }
    spellings.dedup();
    spellings
}

/// An absolute path as a rebasing root: `.` and repeated or trailing
/// separators removed; `/` becomes the empty string.
fn lexical_root(p: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for c in p
        .as_os_str()
        .as_bytes()
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
    {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    out
}

/// An entry found in the tree.
pub struct Found {
    /// Packet path.
    pub path: String,
    /// What it is.
    pub kind: FoundKind,
}

/// The type-specific part of [`Found`].
pub enum FoundKind {
    /// A directory.
    Dir,
    /// A regular file, with what the walk saw of it.
    File(FoundFile),
    /// A symlink with its (possibly rebased) target.
    Symlink(String),
}

/// A regular file as the walk (or a tar stream) gave it.
pub struct FoundFile {
    /// Size in bytes.
    pub size: u64,
    /// Modification time to record (after `--zero-mtimes` and clamping).
    pub mtime_ns: u64,
    /// Any execute bit set.
    pub executable: bool,
    /// Where its content is.
    pub origin: Origin,
}

/// Where a found file's content is read from.
pub enum Origin {
    /// A file of a directory walked.
    Disk(OnDisk),
    /// A member of a tar stream ([`super::tar`]): bytes `offset..offset +
    /// size` of that input's content file (the tar file itself, or the
    /// spool of a stream).
    Tar {
        /// Index into the tar inputs.
        input: usize,
        /// Where the content starts.
        offset: u64,
        /// The member holding the content (hard links share it): its
        /// identity, as `(dev, ino)` is a file's on disk.
        id: u64,
    },
}

/// A file of a directory as the walk saw it; pack re-checks it when
/// reading.
pub struct OnDisk {
    /// Index into the roots.
    pub root: usize,
    /// Path relative to the root.
    pub rel: PathBuf,
    /// Device and inode, to detect replacement before reading.
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
    /// The raw mtime seen, to detect modification while reading.
    pub seen_mtime_ns: i128,
    /// It has other names (hard links).
    pub linked: bool,
}

/// Walk settings.
pub struct ScanOptions<'a> {
    /// Exclusions.
    pub policy: &'a Policy,
    /// Record every mtime as 0.
    pub zero_mtimes: bool,
    /// Refuse symlinks that leave their part.
    pub reject_external_symlinks: bool,
    /// Limits, checked as the walk goes.
    pub limits: Limits,
    /// `(dev, ino)` of files to leave out and report: an older output.
    pub skip: Vec<(u64, u64)>,
    /// `(dev, ino)` of a file to leave out unreported: pack's own temporary
    /// file, whose random name would make the result differ run to run.
    pub own: Option<(u64, u64)>,
    /// Directories to leave out and report because they are the root of
    /// the other part: the `(dev, ino)` of each part's root, and that part.
    pub other_parts: Vec<(sys::FileId, Part)>,
    /// Test barrier directory (see `crate::barrier`): the walk pauses
    /// at `walked-roots` once the part roots are read.
    pub barrier: Option<&'a Path>,
    /// Entries and bytes taken so far, by every part.
    pub tally: &'a Tally,
}

/// The result of walking every root.
pub struct Scan {
    /// The roots, in part order.
    pub roots: Vec<Root>,
    /// Every entry, unsorted.
    pub found: Vec<Found>,
    /// What was left out.
    pub report: ScanReport,
}

/// The type of an entry whose `S_IFMT` bits are `ty`.
fn entry_type(ty: SFlag) -> EntryType {
    match ty {
        SFlag::S_IFDIR => EntryType::Dir,
        SFlag::S_IFREG => EntryType::File,
        SFlag::S_IFLNK => EntryType::Symlink,
        SFlag::S_IFIFO => EntryType::Fifo,
        SFlag::S_IFSOCK => EntryType::Socket,
        SFlag::S_IFCHR => EntryType::CharDevice,
        SFlag::S_IFBLK => EntryType::BlockDevice,
        _ => EntryType::Unknown,
    }
}

/// Walks each `(part, dir)`: directories of one depth are read in parallel,
/// level by level; limits are counted across all of them as they go.
pub fn scan(parts: &[(Part, PathBuf)], opts: &ScanOptions<'_>) -> Result<Scan, Error> {
    let mut roots = Vec::new();
    for (part, dir) in parts {
        roots.push(Root::open(*part, dir)?);
    }
    let walker = Walker {
        opts,
        roots: &roots,
    };
    let mut found = Vec::new();
    let mut report = ScanReport::default();
    let mut level = Vec::new();
    for (k, root) in roots.iter().enumerate() {
        let name = root.part.as_str().to_owned();
        walker.count(&name, 0)?;
        found.push(Found {
            path: name.clone(),
            kind: FoundKind::Dir,
        });
        level.push(DirTask {
            root: k,
            rel: PathBuf::new(),
            ppath: name,
            depth: 0,
            id: None,
        });
    }
    let mut roots_read = true;
    let mut linked_out = Vec::new();
    let mut credential_dirs = Vec::new();
    while !level.is_empty() {
        let outs: Vec<DirOut> = level
            .into_par_iter()
            .map(|t| walker.visit(t))
            .collect::<Result<_, Error>>()?;
        level = Vec::new();
        for o in outs {
            found.extend(o.found);
            report.merge(o.report);
            level.extend(o.subdirs);
            linked_out.extend(o.linked_out);
            credential_dirs.extend(o.credential_dirs);
        }
        if std::mem::take(&mut roots_read) {
            crate::barrier::wait(opts.barrier, crate::barrier::Point::WalkedRoots);
        }
    }
    let linked = found.iter().any(|f| {
        matches!(&f.kind, FoundKind::File(FoundFile { origin: Origin::Disk(d), .. }) if d.linked)
    });
    let mut seen = 0;
    for dir in &credential_dirs {
        linked_out.extend(walker.files_in(dir, linked, &mut seen)?);
    }
    report.exclude_other_names(&mut found, linked_out, |f| match &f.kind {
        FoundKind::File(FoundFile {
            origin: Origin::Disk(d),
            ..
        }) => Some(((d.dev, d.ino), f.path.as_str())),
        _ => None,
    });
    report.sort();
    Ok(Scan {
        roots,
        found,
        report,
    })
}

struct Walker<'o, 'p> {
    opts: &'o ScanOptions<'p>,
    roots: &'o [Root],
}

/// A directory to read.
struct DirTask {
    root: usize,
    rel: PathBuf,
    ppath: String,
    depth: usize,
    /// Its identity when its parent was read, if taken (two parts).
    id: Option<sys::FileId>,
}

/// What reading one directory found.
#[derive(Default)]
struct DirOut {
    found: Vec<Found>,
    report: ScanReport,
    subdirs: Vec<DirTask>,
    /// Files excluded as credentials, by identity, and their paths.
    linked_out: Vec<(sys::FileId, String)>,
    /// Directories excluded as holding credentials.
    credential_dirs: Vec<CredentialDir>,
}

/// The directory `rel` of `root`, opened, when it is the mount point of a
/// file system on this machine's own storage, which cannot hang (a
/// container's `-v ~/.ssh:/workspace/.ssh`); `None` for any other (FUSE,
/// NFS, SMB, 9p: their servers may hang), or where the mount table cannot
/// be read.
fn local_mount(root: &Root, rel: &Path) -> Option<OwnedFd> {
    let point = std::fs::canonicalize(&root.dir).ok()?.join(rel);
    let sys::MountAt::Mount(top) = sys::mount_at(&point) else {
        return None;
    };
    if !sys::LOCAL_FILE_SYSTEMS.contains(&top.fstype.as_str()) {
        return None;
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    sys::open_beneath(root.fd.as_fd(), rel, flags, Mode::empty()).ok()
}

/// A directory left out as holding credentials (`.ssh`, codex's
/// `secrets`): not walked, but read for the identities of its files.
struct CredentialDir {
    root: usize,
    rel: PathBuf,
    path: String,
}

/// One name read from a directory, with its stat when needed.
struct Child {
    /// The name (a name that is not UTF-8: its lossy spelling, to judge).
    name: String,
    /// A name that is not UTF-8, as read: left out if a rule says so,
    /// else refused.
    raw: Option<Vec<u8>>,
    st: Option<FileStat>,
    ty: SFlag,
}

impl Walker<'_, '_> {
    /// Counts one entry of `size` content bytes against the limits.
    fn count(&self, path: &str, size: u64) -> Result<(), Error> {
        self.opts.tally.count(path, size, &self.opts.limits)
    }

    /// The identity of directory `child` (of the directory `dirfd`), when
    /// there are two parts: to know the other part's root by it (a bind
    /// mount as well as a nested path), and to check that the directory
    /// opened later is this one. A stat per directory, only then.
    fn dir_identity(&self, dirfd: &OwnedFd, child: &Child) -> Option<sys::FileId> {
        if child.ty != SFlag::S_IFDIR || self.opts.other_parts.is_empty() {
            return None;
        }
        // A child that cannot be read now is reported when it is opened.
        let name = match &child.raw {
            Some(raw) => OsStr::from_bytes(raw),
            None => OsStr::new(&child.name),
        };
        fstatat(dirfd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| sys::dev_ino(&st))
    }

    /// The other part, when `id` is its root, met walking `part`.
    fn other_part(&self, id: sys::FileId, part: Part) -> Option<Part> {
        self.opts
            .other_parts
            .iter()
            .find(|(root, p)| *root == id && *p != part)
            .map(|(_, p)| *p)
    }

    /// The identities and paths of the files in the directory `dir`, left
    /// out as holding credentials, which the walk did not enter: so that
    /// another name of one of them is left out too, a hard link from a
    /// packed name to a key in `.ssh`, or `secrets/` bind-mounted into the
    /// workspace. Only names and stats are read, with two handles open at
    /// most; nothing on another mount is touched (one may hang): a mount
    /// inside is passed over, and so is `dir` itself when it is a mount
    /// point, unless of a local file system ([`local_mount`]); where a
    /// mount cannot be told without touching it (before Linux 5.6, or not
    /// Linux) nothing is read, and a warning says so when a packed file has
    /// other names (`linked`). The other part's root is not read as this
    /// one's. A directory that cannot be read is warned of and passed over:
    /// this finds what can be found. `seen` counts the names read in all
    /// such directories, against the entry limit.
    fn files_in(
        &self,
        dir: &CredentialDir,
        linked: bool,
        seen: &mut u64,
    ) -> Result<Vec<(sys::FileId, String)>, Error> {
        let root = &self.roots[dir.root];
        let warn = |path: &str, error: &io::Error| {
            let unsupported = error.kind() == io::ErrorKind::Unsupported;
            if unsupported && !linked {
                tracing::debug!(%path, %error, "not looked in for other names of its files");
                return;
            }
            tracing::warn!(
                %path,
                %error,
                "cannot look in it for other names of its files; a hard link from a packed \
                 name to one of them would be packed"
            );
        };
        let parent = dir.rel.parent().unwrap_or(Path::new(""));
        let name = Path::new(dir.rel.file_name().unwrap_or_default());
        let top = sys::open_beneath(
            root.fd.as_fd(),
            parent,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .and_then(|p| sys::open_dir_same_mount(p.as_fd(), name));
        let top = match top {
            Ok(Some(fd)) => fd,
            Ok(None) => match local_mount(root, &dir.rel) {
                Some(fd) => fd,
                None => {
                    tracing::debug!(path = %dir.path, "a mount point: not looked in");
                    return Ok(Vec::new());
                }
            },
            Err(e) => {
                warn(&dir.path, &e);
                return Ok(Vec::new());
            }
        };
        let mut files = Vec::new();
        // Directories to read, relative to `top`, each opened only when
        // read.
        let mut todo = vec![(PathBuf::new(), dir.path.clone())];
        while let Some((rel, path)) = todo.pop() {
            let fd = if rel.as_os_str().is_empty() {
                top.try_clone().map(Some)
            } else {
                sys::open_dir_same_mount(top.as_fd(), &rel)
            };
            let fd = match fd {
                Ok(Some(fd)) => fd,
                Ok(None) => continue,
                Err(e) => {
                    warn(&path, &e);
                    continue;
                }
            };
            if let Ok(st) = nix::sys::stat::fstat(fd.as_fd())
                && self.other_part(sys::dev_ino(&st), root.part).is_some()
            {
                continue;
            }
            let names = fd.try_clone().and_then(|d| {
                let mut d = Dir::from_fd(d)?;
                d.iter()
                    .map(|e| e.map(|e| (e.file_name().to_bytes().to_vec(), e.file_type())))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(io::Error::from)
            });
            let names = match names {
                Ok(names) => names,
                Err(e) => {
                    warn(&path, &e);
                    continue;
                }
            };
            for (raw, ty) in names {
                if raw == b"." || raw == b".." {
                    continue;
                }
                *seen += 1;
                if *seen > self.opts.limits.max_entries {
                    return Err(LimitKind::Entries
                        .exceeded(*seen, &self.opts.limits, Some(&dir.path))
                        .into());
                }
                let cpath = format!("{path}/{}", crate::packet::path::shown(&raw));
                let name = Path::new(OsStr::from_bytes(&raw));
                let is_dir = match ty {
                    Some(Type::Directory) => true,
                    Some(Type::File) | None => match sys::stat_same_mount(fd.as_fd(), name) {
                        Ok(Some(st)) if sys::file_type(&st) == SFlag::S_IFREG => {
                            files.push((sys::dev_ino(&st), cpath.clone()));
                            false
                        }
                        Ok(Some(st)) => sys::file_type(&st) == SFlag::S_IFDIR,
                        // A mount point, or gone since the directory was read.
                        Ok(None) | Err(_) => false,
                    },
                    Some(_) => false,
                };
                if is_dir {
                    todo.push((rel.join(name), cpath));
                }
            }
        }
        Ok(files)
    }

    /// Reads one directory: its entries, and the subdirectories to visit.
    fn visit(&self, task: DirTask) -> Result<DirOut, Error> {
        let root = &self.roots[task.root];
        let part = root.part;
        let DirTask {
            rel,
            ppath,
            depth,
            id,
            ..
        } = task;
        let mut out = DirOut::default();
        let shown = root.dir.join(&rel);
        let fd = sys::open_beneath(
            root.fd.as_fd(),
            &rel,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .map_err(|e| match e.raw_os_error() {
            // Gone, or swapped for something else, since its parent was read.
            Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV) if depth > 0 => {
                Error::Changed {
                    path: ppath.clone(),
                    what: "was removed or replaced",
                }
            }
            _ => Error::io(&shown, "cannot open directory", e),
        })?;
        // The directory judged by its identity is the one opened.
        if let Some(id) = id
            && nix::sys::stat::fstat(&fd).map(|st| sys::dev_ino(&st)) != Ok(id)
        {
            return Err(Error::Changed {
                path: ppath,
                what: "was removed or replaced",
            });
        }
        let (dirfd, children) = self.read_dir(fd, &shown, &ppath)?;
        let verdicts = self.judge_all(part, &ppath, &children);
        for (child, verdict) in children.iter().zip(verdicts) {
            // Pack's own temporary file, whatever rule would name it.
            if self.opts.own.is_some() && child.st.as_ref().map(sys::dev_ino) == self.opts.own {
                continue;
            }
            let (cpath, crel) = match &child.raw {
                Some(raw) => (
                    format!("{ppath}/{}", crate::packet::path::shown(raw)),
                    rel.join(OsStr::from_bytes(raw)),
                ),
                None => (format!("{ppath}/{}", child.name), rel.join(&child.name)),
            };
            // Only a directory going in is stat'ed: one left out may be a
            // mount that hangs.
            let id = match verdict {
                Verdict::Include => self.dir_identity(&dirfd, child),
                _ => None,
            };
            let verdict = match id.and_then(|id| self.other_part(id, part)) {
                Some(other) => Verdict::Exclude(Reason::OtherPart {
                    part: other.as_str(),
                }),
                None => verdict,
            };
            if matches!(verdict, Verdict::Include) && child.raw.is_some() {
                return Err(non_utf8_name(cpath));
            }
            let ty = entry_type(child.ty);
            match out
                .report
                .classify(&cpath, ty, verdict, &self.opts.limits)?
            {
                Step::Take => {}
                Step::LeftOut => continue,
                Step::CredentialFile => {
                    if let Some(st) = child.st.as_ref() {
                        out.linked_out.push((sys::dev_ino(st), cpath));
                    }
                    continue;
                }
                Step::CredentialDir => {
                    out.credential_dirs.push(CredentialDir {
                        root: task.root,
                        rel: crel,
                        path: cpath,
                    });
                    continue;
                }
            }
            match ty {
                EntryType::Dir => {
                    self.count(&cpath, 0)?;
                    out.found.push(Found {
                        path: cpath.clone(),
                        kind: FoundKind::Dir,
                    });
                    out.subdirs.push(DirTask {
                        root: task.root,
                        rel: crel,
                        ppath: cpath,
                        depth: depth + 1,
                        id,
                    });
                }
                EntryType::File => {
                    let Some(st) = child.st else { continue };
                    if self.opts.skip.contains(&sys::dev_ino(&st)) {
                        out.report.excluded.push(Excluded {
                            path: cpath,
                            kind: "file",
                            reason: Reason::OutputFile,
                        });
                        continue;
                    }
                    let file = self.file(task.root, crel, &cpath, &st, &mut out.report)?;
                    self.count(&cpath, file.size)?;
                    out.found.push(Found {
                        path: cpath,
                        kind: FoundKind::File(file),
                    });
                }
                EntryType::Symlink => {
                    let target =
                        readlinkat(dirfd.as_fd(), child.name.as_str()).map_err(|e| match e {
                            // No longer a symlink, or gone, since the directory was read.
                            nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT => {
                                Error::Changed {
                                    path: cpath.clone(),
                                    what: "was replaced or removed",
                                }
                            }
                            e => {
                                Error::io(&shown.join(&child.name), "cannot read symlink", e.into())
                            }
                        })?;
                    let target = target.as_bytes();
                    let stored = self.link(root, depth, &cpath, target, &mut out.report)?;
                    self.count(&cpath, 0)?;
                    out.found.push(Found {
                        path: cpath,
                        kind: FoundKind::Symlink(stored),
                    });
                }
                // (Special files: dropped and reported by `classify`.)
                _ => {}
            }
        }
        Ok(out)
    }

    /// Reads every name of a directory (UTF-8 only) with the stat each needs.
    fn read_dir(
        &self,
        fd: OwnedFd,
        shown: &Path,
        ppath: &str,
    ) -> Result<(OwnedFd, Vec<Child>), Error> {
        let dupfd = fd
            .try_clone()
            .map_err(|e| Error::io(shown, "cannot duplicate directory handle", e))?;
        let mut dir =
            Dir::from_fd(fd).map_err(|e| Error::io(shown, "cannot read directory", e.into()))?;
        let mut children = Vec::new();
        for ent in dir.iter() {
            let ent = ent.map_err(|e| Error::io(shown, "cannot read directory", e.into()))?;
            let raw = ent.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            // A name that is not UTF-8 is judged by its lossy spelling: an
            // exclusion may leave it out; otherwise it is refused.
            let (name, not_utf8) = match std::str::from_utf8(raw) {
                Ok(name) => (std::borrow::Cow::Borrowed(name), None),
                Err(_) => (String::from_utf8_lossy(raw), Some(raw.to_vec())),
            };
            let name = &*name;
            // How the name is shown in messages (made only for one).
            let shown_name = || match &not_utf8 {
                Some(raw) => crate::packet::path::shown(raw),
                None => name.to_owned(),
            };
            let known = match ent.file_type() {
                Some(Type::Directory) => Some(SFlag::S_IFDIR),
                Some(Type::Symlink) => Some(SFlag::S_IFLNK),
                Some(Type::Fifo) => Some(SFlag::S_IFIFO),
                Some(Type::Socket) => Some(SFlag::S_IFSOCK),
                Some(Type::CharacterDevice) => Some(SFlag::S_IFCHR),
                Some(Type::BlockDevice) => Some(SFlag::S_IFBLK),
                Some(Type::File) | None => None,
            };
            let (ty, st) = match known {
                Some(ty) => (ty, None),
                None => {
                    let st = fstatat(
                        dupfd.as_fd(),
                        OsStr::from_bytes(raw),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| match e {
                        nix::errno::Errno::ENOENT => Error::Changed {
                            path: format!("{ppath}/{}", shown_name()),
                            what: "was removed",
                        },
                        e => Error::io(&shown.join(shown_name()), "cannot stat", e.into()),
                    })?;
                    (sys::file_type(&st), Some(st))
                }
            };
            children.push(Child {
                name: name.to_owned(),
                raw: not_utf8,
                st,
                ty,
            });
        }
        Ok((dupfd, children))
    }

    /// Applies the policy to a directory's children; SQLite side files then
    /// follow their database.
    fn judge_all(&self, part: Part, ppath: &str, children: &[Child]) -> Vec<Verdict> {
        let typed: Vec<(&str, EntryType)> = children
            .iter()
            .map(|c| (c.name.as_str(), entry_type(c.ty)))
            .collect();
        judge(self.opts.policy, part, ppath, &typed)
    }

    fn file(
        &self,
        root: usize,
        rel: PathBuf,
        path: &str,
        st: &FileStat,
        report: &mut ScanReport,
    ) -> Result<FoundFile, Error> {
        let size = st.st_size as u64;
        check_file_size(path, size)?;
        let seen = sys::mtime_ns(st);
        Ok(FoundFile {
            size,
            mtime_ns: report.record_mtime(path, seen, self.opts.zero_mtimes),
            executable: st.st_mode & 0o111 != 0,
            origin: Origin::Disk(OnDisk {
                root,
                rel,
                dev: sys::dev_ino(st).0,
                ino: sys::dev_ino(st).1,
                seen_mtime_ns: seen,
                linked: st.st_nlink > 1,
            }),
        })
    }

    /// The target to store for the symlink at `path` whose target on disk
    /// is `target`. Rebasing compares bytes, so that a link into a root
    /// whose own path is not UTF-8 is rebased; what is stored must be UTF-8.
    fn link(
        &self,
        root: &Root,
        depth: usize,
        path: &str,
        target: &[u8],
        report: &mut ScanReport,
    ) -> Result<String, Error> {
        let rebased = root.spellings.iter().find_map(|r| {
            let after = std::str::from_utf8(target.strip_prefix(r.as_slice())?).ok()?;
            rebase_after(after, depth)
        });
        let shown = crate::packet::path::shown(target);
        let decided = match rebased {
            Some(decided) => decided,
            None => match std::str::from_utf8(target) {
                Ok(t) => rebase(t, depth, &[]),
                Err(_) => return Err(non_utf8_target(path, &shown)),
            },
        };
        report
            .note_symlink(
                path,
                &shown,
                decided,
                root.part,
                self.opts.reject_external_symlinks,
            )
            .map_err(|reason| Error::Refused {
                path: path.into(),
                kind: crate::packet::error::ErrorKind::ExternalSymlink,
                reason,
            })
    }
}
