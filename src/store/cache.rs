//! The node-wide content cache: verified content of remote packets, kept on
//! disk under the SHA-256 of its bytes, shared by every mount and command
//! on the node and across packets (turn N+1's packet finds turn N's
//! content here).
//!
//! Each entry is one unit a manifest names a hash for: a whole small file
//! or one chunk of a larger one, so never more than a chunk (4 MiB). The
//! rules (STYLE habits 14 and 18, after Nydus's blob cache and systemd's
//! `chase()`):
//!
//! - **The directory is trusted only when nobody else can change it.**
//!   The cache directory and everything in it must belong to the user
//!   that runs sessionfs and be writable by nobody else; every directory
//!   on the way to it must belong to root or that user and be writable by
//!   nobody else, or be sticky (`/tmp`), and a symlink on the way is
//!   followed only when root or that user made it. Anything else is
//!   refused at open, naming the path and the fix: a root daemon never
//!   uses a directory another user can write. A missing directory is made
//!   (`0700` for the cache itself, `0755` on the way to it).
//! - **Nothing inside is followed.** The directories are held open and
//!   everything is reached from them one name at a time with
//!   `O_NOFOLLOW`; only regular files are read, opened with `O_NONBLOCK`
//!   and their type checked on the handle (a FIFO is never waited on);
//!   every removal is an `unlinkat` of a name in a held directory, which
//!   removes that name and never what a symlink there points to. A
//!   symlink, FIFO or other non-directory found where a shard directory
//!   or the lock should be is removed (nobody but this user can have put
//!   it there); a directory of the wrong owner or mode is refused, as is
//!   anything but a directory of ours at `v1`, `objects` or `tmp`.
//! - **An entry is its own proof.** Its name is the hash of its bytes; it
//!   is checked (type, owner, mode, length and SHA-256) every time it is
//!   read, and one that does not match is removed and reported as absent,
//!   so the caller fetches the content again. Nothing is trusted for
//!   having been written here: another process, a full disk or a crash
//!   may have damaged it.
//! - **Visible only when complete.** An entry is written to a private
//!   temporary file in `tmp/` and renamed into place: a process killed at
//!   any moment leaves at most a temporary file, never a partial entry
//!   under a hash. No fsync: after a power loss an entry may hold zeros,
//!   which the check above catches. Temporary files older than an hour
//!   are removed by the next eviction.
//! - **Bounded.** The entries' total size is kept under the cache's size:
//!   every [`EVICT_EVERY`]th of the bound added by this process, one thread
//!   lists the cache (under an advisory lock, so one process at a time) and
//!   removes the least recently used entries (by mtime, which a hit moves
//!   forward) until the total is [`EVICT_TO`] of the bound. An entry in use
//!   is read whole into memory when it is used, and a removal never
//!   affects a read already open, so no read in progress loses an entry.
//!
//! Layout: `DIR/v1/objects/<2 hex>/<64 hex>`, `DIR/v1/tmp/`, `DIR/v1/lock`.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use sha2::Digest as _;

use crate::sys::file_type;

/// An eviction runs each time this process has added this fraction of the
/// bound (as 1/N) since the last one.
pub const EVICT_EVERY: u64 = 16;

/// An eviction removes entries until the total is at most this fraction of
/// the bound (in percent), so that it does not run again at once.
pub const EVICT_TO: u64 = 90;

/// Temporary files older than this are left by a killed process and are
/// removed by an eviction.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// Symlinks followed on the way to the cache directory at most: the
/// kernel's own limit (`MAXSYMLINKS`), so a loop is an error, not a hang.
const MAX_SYMLINKS: u32 = 40;

/// Mode bits that let users other than the owner add, remove or rename
/// a directory's entries, or change a file's bytes: group and other write.
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// The sticky bit: in a directory that has it (`/tmp`), only an entry's
/// owner (or the directory's, or root) may remove or rename it.
const STICKY: u32 = 0o1000;

/// The mode of the directories the cache makes for itself (the cache
/// directory and those in it): private to their user, as the content may
/// be.
const PRIVATE_DIR: u32 = 0o700;

/// The mode of the directories it makes on the way to the cache directory
/// (`/var/cache`, `~/.cache` where missing): as `mkdir -p` makes them.
const PATH_DIR: u32 = 0o755;

/// Flags of every directory opened here: never through a symlink, never
/// blocking (a FIFO at the name fails `O_DIRECTORY` before it is opened).
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_CLOEXEC);

/// What a [`Cache`] has done, for results and tests.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Entries found and verified.
    pub hits: AtomicU64,
    /// Entries looked for and absent.
    pub misses: AtomicU64,
    /// Entries found damaged and removed.
    pub damaged: AtomicU64,
    /// Entries added.
    pub added: AtomicU64,
    /// Entries removed by eviction.
    pub evicted: AtomicU64,
}

/// The content cache at a directory (see the module's text).
pub struct Cache {
    dirs: Arc<Dirs>,
    max_bytes: u64,
    /// Bytes added by this process since the last eviction.
    added_since: AtomicU64,
    evicting: Arc<AtomicBool>,
    /// What it has done.
    pub stats: CacheStats,
}

/// The cache's directories, held open and checked: everything in the
/// cache is reached from them, one name at a time.
struct Dirs {
    /// `DIR/v1`, through the directories it was found through (for
    /// messages, and for [`Cache::tmp_dir`]).
    path: PathBuf,
    v1: OwnedFd,
    objects: OwnedFd,
    tmp: OwnedFd,
    /// The user everything must belong to: the one running sessionfs.
    me: u32,
}

/// The cache directory unless `--cache` names one: `SESSIONFS_CACHE_DIR`,
/// else `/var/cache/sessionfs` for root, else `$XDG_CACHE_HOME/sessionfs`,
/// else `~/.cache/sessionfs`.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SESSIONFS_CACHE_DIR").filter(|d| !d.is_empty()) {
        return d.into();
    }
    if nix::unistd::geteuid().is_root() {
        return "/var/cache/sessionfs".into();
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("sessionfs");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/sessionfs"),
        // In a sticky /tmp: another user who makes this name first has
        // it refused (it is not ours), never used.
        None => std::env::temp_dir().join(format!("sessionfs-cache-{}", nix::unistd::geteuid())),
    }
}

fn hex(hash: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether `name` is one of `objects/`'s shard directories: two
/// lowercase hex digits.
fn is_shard_name(name: &[u8]) -> bool {
    name.len() == 2 && name.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is the name of an entry of shard `shard`: 64 lowercase
/// hex digits starting with the shard's two.
fn is_entry_name(name: &[u8], shard: &[u8]) -> bool {
    name.len() == 64
        && name.starts_with(shard)
        && name.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A stat's permission and special bits (`mode_t` is `u16` on macOS).
#[allow(clippy::useless_conversion)]
fn mode_bits(st: &FileStat) -> u32 {
    u32::from(st.st_mode) & 0o7777
}

/// A file type as messages name it.
fn type_name(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR | SFlag::S_IFBLK => "a device",
        _ => "of an unknown type",
    }
}

/// Where a directory is, which decides what it must be to be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// On the way to the cache directory (`/`, `/var`, `/home/u`):
    /// root's or the user's, writable by nobody else unless sticky (the
    /// names in a sticky directory can be removed or renamed only by
    /// their owners, and the next one must be root's or the user's).
    Ancestor,
    /// The cache directory, or one inside it: the user's, writable by
    /// nobody else.
    Own,
}

/// Why a directory is not trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Untrusted {
    /// Not a directory (its type).
    NotADirectory(SFlag),
    /// Of another owner (its uid).
    Owner(u32),
    /// Writable by others (its mode).
    Writable(u32),
}

/// Whether a directory of type `kind`, owner `uid` and mode `mode`, in
/// `role`, may be trusted by user `me` (pure: tested with a table).
fn judge_dir(kind: SFlag, uid: u32, mode: u32, me: u32, role: Role) -> Result<(), Untrusted> {
    if kind != SFlag::S_IFDIR {
        return Err(Untrusted::NotADirectory(kind));
    }
    let owner_ok = match role {
        Role::Ancestor => uid == 0 || uid == me,
        Role::Own => uid == me,
    };
    if !owner_ok {
        return Err(Untrusted::Owner(uid));
    }
    let sticky_ok = role == Role::Ancestor && mode & STICKY != 0;
    if mode & WRITABLE_BY_OTHERS != 0 && !sticky_ok {
        return Err(Untrusted::Writable(mode));
    }
    Ok(())
}

/// The refusal of `path` for `why`: what is wrong and what fixes it.
fn refusal(path: &Path, why: Untrusted, me: u32, role: Role) -> io::Error {
    let p = path.display();
    let message = match (why, role) {
        (Untrusted::NotADirectory(kind), _) => format!(
            "{p} is {}, not a directory: remove it, or use another --cache",
            type_name(kind)
        ),
        (Untrusted::Owner(uid), Role::Ancestor) => format!(
            "{p} belongs to uid {uid}, who could replace what is in it: the cache must be \
             reached through directories of root or of uid {me} (who runs sessionfs); use \
             another --cache"
        ),
        (Untrusted::Owner(uid), Role::Own) => format!(
            "{p} belongs to uid {uid}, not to uid {me} who runs sessionfs, and a cache another \
             user can change is not trusted: use a directory of your own (--cache DIR), or \
             `chown -R {me} {p}` if it is yours"
        ),
        (Untrusted::Writable(mode), Role::Ancestor) => format!(
            "{p} is writable by users other than its owner and not sticky (mode {mode:04o}), \
             so they could replace the cache in it: `chmod go-w {p}`, or use another --cache"
        ),
        (Untrusted::Writable(mode), Role::Own) => format!(
            "{p} is writable by users other than its owner (mode {mode:04o}), who could change \
             the cache: `chmod go-w {p}`, or use another --cache"
        ),
    };
    io::Error::new(io::ErrorKind::PermissionDenied, message)
}

/// An error of a system call on `path`, naming it.
fn at(path: &Path, what: &str, e: impl Into<io::Error>) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
}

/// `path`'s names, in order: `..` kept (resolved as the walk goes), `.`
/// and the root left out.
fn names(path: &Path) -> impl DoubleEndedIterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_owned()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

/// Opens the directory `dir` (made if missing) for user `me`, reached
/// from `/` one name at a time and only through directories and symlinks
/// `me` can trust, and checks that it is `me`'s and writable by nobody
/// else (see the module's text). Returns it and the path it was found at
/// (symlinks resolved).
fn open_trusted_dir(dir: &Path, me: u32) -> io::Result<(OwnedFd, PathBuf)> {
    let abs = std::path::absolute(dir).map_err(|e| at(dir, "find", e))?;
    let root = Path::new("/");
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(
        OwnedFd::from(File::open(root).map_err(|e| at(root, "open", e))?),
        root.to_owned(),
    )];
    if let Some((fd, path)) = stack.first() {
        let st = fstat(fd).map_err(|e| at(path, "look at", e))?;
        judge_dir(
            file_type(&st),
            st.st_uid,
            mode_bits(&st),
            me,
            Role::Ancestor,
        )
        .map_err(|why| refusal(path, why, me, Role::Ancestor))?;
    }
    let mut todo: VecDeque<OsString> = names(&abs).collect();
    let (mut links, mut made) = (0, 0);
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let Some((cur, cur_path)) = stack.last() else {
            return Err(io::Error::other("the walk lost its root"));
        };
        let here = cur_path.join(&name);
        let st = match fstatat(cur, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Made, then looked at again like any other (a bound: a
            // name that keeps vanishing is an error, not a loop).
            Err(Errno::ENOENT) if made < 8 => {
                let mode = if todo.is_empty() {
                    PRIVATE_DIR
                } else {
                    PATH_DIR
                };
                match mkdirat(cur, name.as_os_str(), Mode::from_bits_truncate(mode as _)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(at(&here, "make the directory", e)),
                }
                made += 1;
                todo.push_front(name);
                continue;
            }
            Err(e) => return Err(at(&here, "look at", e)),
        };
        if file_type(&st) == SFlag::S_IFLNK {
            if st.st_uid != 0 && st.st_uid != me {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is a symlink of uid {}: on the way to the cache only root's and uid \
                         {me}'s (who runs sessionfs) are followed; give the path it leads to, \
                         or use another --cache",
                        here.display(),
                        st.st_uid
                    ),
                ));
            }
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(at(&abs, "resolve", Errno::ELOOP));
            }
            let target = PathBuf::from(
                readlinkat(cur, name.as_os_str()).map_err(|e| at(&here, "read the symlink", e))?,
            );
            if target.is_absolute() {
                stack.truncate(1);
            }
            for n in names(&target).rev() {
                todo.push_front(n);
            }
            continue;
        }
        let role = if todo.is_empty() {
            Role::Own
        } else {
            Role::Ancestor
        };
        judge_dir(file_type(&st), st.st_uid, mode_bits(&st), me, role)
            .map_err(|why| refusal(&here, why, me, role))?;
        let fd = openat(cur, name.as_os_str(), DIR_FLAGS, Mode::empty())
            .map_err(|e| at(&here, "open", e))?;
        // What was opened, checked again: the name may have changed.
        let st = fstat(&fd).map_err(|e| at(&here, "look at", e))?;
        judge_dir(file_type(&st), st.st_uid, mode_bits(&st), me, role)
            .map_err(|why| refusal(&here, why, me, role))?;
        stack.push((fd, here));
    }
    let Some((fd, path)) = stack.pop() else {
        return Err(io::Error::other("the walk lost its root"));
    };
    // The last directory (after a `..`, one checked on the way only).
    let st = fstat(&fd).map_err(|e| at(&path, "look at", e))?;
    judge_dir(file_type(&st), st.st_uid, mode_bits(&st), me, Role::Own)
        .map_err(|why| refusal(&path, why, me, Role::Own))?;
    Ok((fd, path))
}

/// Opens the directory `name` of `parent` (at `path`), made if missing,
/// and checks that it is `me`'s and writable by nobody else; anything
/// else there is refused.
fn open_own_dir(parent: BorrowedFd<'_>, name: &str, path: &Path, me: u32) -> io::Result<OwnedFd> {
    let fd = match openat(parent, name, DIR_FLAGS, Mode::empty()) {
        Err(Errno::ENOENT) => {
            match mkdirat(parent, name, Mode::from_bits_truncate(PRIVATE_DIR as _)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(at(path, "make the directory", e)),
            }
            openat(parent, name, DIR_FLAGS, Mode::empty())
        }
        other => other,
    };
    let fd = match fd {
        Ok(fd) => fd,
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            let kind = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_or(SFlag::S_IFLNK, |st| file_type(&st));
            return Err(refusal(path, Untrusted::NotADirectory(kind), me, Role::Own));
        }
        Err(e) => return Err(at(path, "open", e)),
    };
    let st = fstat(&fd).map_err(|e| at(path, "look at", e))?;
    judge_dir(file_type(&st), st.st_uid, mode_bits(&st), me, Role::Own)
        .map_err(|why| refusal(path, why, me, Role::Own))?;
    Ok(fd)
}

/// The names in the directory `dir` (`.` and `..` left out).
fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    use std::os::unix::ffi::OsStrExt;
    let mut d = nix::dir::Dir::openat(dir, ".", DIR_FLAGS, Mode::empty())?;
    let mut out = Vec::new();
    for e in d.iter() {
        let n = e?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(&n).to_owned());
        }
    }
    Ok(out)
}

/// Whether an entry of type `kind`, owner `uid`, mode `mode` and length
/// `len` may be served for a unit of `want` bytes to user `me`; if not,
/// why (pure: tested with a table). Its hash is checked after.
fn judge_entry(
    kind: SFlag,
    uid: u32,
    mode: u32,
    len: i64,
    want: usize,
    me: u32,
) -> Result<(), String> {
    if kind != SFlag::S_IFREG {
        return Err(format!("it is {}", type_name(kind)));
    }
    if uid != me {
        return Err(format!("it belongs to uid {uid}, not {me}"));
    }
    if mode & WRITABLE_BY_OTHERS != 0 {
        return Err(format!("it is writable by others (mode {mode:04o})"));
    }
    if u64::try_from(len).ok() != u64::try_from(want).ok() {
        return Err(format!("it holds {len} bytes, not {want}"));
    }
    Ok(())
}

/// What reading an entry found, when it cannot be served.
enum Unsound {
    /// There is none.
    Absent,
    /// There is one, not to be served (why): it is removed.
    Damaged(String),
}

/// Reads the entry `name` of the shard `shard` into `out` if it is a
/// regular file of `me`'s, writable by nobody else, of `out.len()` bytes
/// whose SHA-256 is `hash`; a read moves its mtime forward. Nothing but a
/// regular file is opened (a FIFO would block the reader), and the file
/// opened is checked on its handle.
fn read_entry(
    shard: BorrowedFd<'_>,
    name: &str,
    hash: &[u8; 32],
    out: &mut [u8],
    me: u32,
) -> Result<(), Unsound> {
    let damaged = |why: String| Unsound::Damaged(why);
    match fstatat(shard, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => return Err(Unsound::Absent),
        Err(e) => return Err(damaged(format!("cannot look at it: {e}"))),
        Ok(st) if file_type(&st) != SFlag::S_IFREG => {
            return Err(damaged(format!("it is {}", type_name(file_type(&st)))));
        }
        Ok(_) => {}
    }
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = match openat(shard, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Err(Unsound::Absent),
        Err(e) => return Err(damaged(format!("cannot open it: {e}"))),
    };
    let st = fstat(&fd).map_err(|e| damaged(format!("cannot look at it: {e}")))?;
    judge_entry(
        file_type(&st),
        st.st_uid,
        mode_bits(&st),
        st.st_size,
        out.len(),
        me,
    )
    .map_err(damaged)?;
    let mut f = File::from(fd);
    f.read_exact(out)
        .map_err(|e| damaged(format!("cannot read it: {e}")))?;
    // Nothing more: the entry is as long as its handle said.
    if sha2::Sha256::digest(&*out).as_slice() != hash {
        return Err(damaged("its bytes do not match its hash".into()));
    }
    // Recently used: moves it back in the eviction order.
    let _ = f.set_modified(SystemTime::now());
    Ok(())
}

impl Dirs {
    /// The shard directory `name` of `objects/`, opened: made when `make`
    /// (else `None` when there is none). A non-directory at its name (a
    /// symlink, a FIFO) is removed, never followed; a directory of
    /// another owner or mode is an error naming it.
    fn shard(&self, name: &str, make: bool) -> io::Result<Option<OwnedFd>> {
        let path = || self.path.join("objects").join(name);
        for _ in 0..3 {
            match openat(&self.objects, name, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => {
                    let st = fstat(&fd).map_err(|e| at(&path(), "look at", e))?;
                    judge_dir(
                        file_type(&st),
                        st.st_uid,
                        mode_bits(&st),
                        self.me,
                        Role::Own,
                    )
                    .map_err(|why| refusal(&path(), why, self.me, Role::Own))?;
                    return Ok(Some(fd));
                }
                Err(Errno::ENOENT) if !make => return Ok(None),
                Err(Errno::ENOENT) => {
                    match mkdirat(
                        &self.objects,
                        name,
                        Mode::from_bits_truncate(PRIVATE_DIR as _),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(at(&path(), "make the directory", e)),
                    }
                }
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    tracing::warn!(path = %path().display(),
                        "not a directory where a cache shard belongs; removed");
                    match unlinkat(&self.objects, name, UnlinkatFlags::NoRemoveDir) {
                        Ok(()) | Err(Errno::ENOENT) => {}
                        Err(e) => return Err(at(&path(), "remove", e)),
                    }
                    if !make {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(at(&path(), "open", e)),
            }
        }
        Err(at(&path(), "open", Errno::EAGAIN))
    }

    /// Removes what is at `lock` when it is not a regular file of ours,
    /// writable by nobody else (a symlink, a FIFO): nothing else could
    /// have put it in a directory only we can write.
    fn clear_lock(&self) -> io::Result<()> {
        let st = match fstatat(&self.v1, "lock", AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(at(&self.path.join("lock"), "look at", e)),
        };
        if judge_entry(file_type(&st), st.st_uid, mode_bits(&st), 0, 0, self.me).is_ok() {
            return Ok(());
        }
        tracing::warn!(path = %self.path.join("lock").display(), kind = type_name(file_type(&st)),
            owner = st.st_uid, "not a lock file of ours; removed");
        match unlinkat(&self.v1, "lock", UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(at(&self.path.join("lock"), "remove", e)),
        }
    }

    /// The lock file, opened (made if missing) without following a
    /// symlink or waiting on a FIFO, and checked on its handle.
    fn open_lock(&self) -> io::Result<File> {
        let path = self.path.join("lock");
        self.clear_lock()?;
        let flags = OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = openat(&self.v1, "lock", flags, Mode::from_bits_truncate(0o600))
            .map_err(|e| at(&path, "open", e))?;
        let st = fstat(&fd).map_err(|e| at(&path, "look at", e))?;
        judge_entry(file_type(&st), st.st_uid, mode_bits(&st), 0, 0, self.me).map_err(|why| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: {why}", path.display()),
            )
        })?;
        Ok(File::from(fd))
    }

    /// Writes `bytes` to a new temporary file in `tmp/`; returns its name.
    fn write_temp(&self, bytes: &[u8]) -> io::Result<String> {
        /// Makes names unique within the process (the pid across them).
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        for _ in 0..16 {
            let name = format!(
                ".entry-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            );
            match openat(
                &self.tmp,
                name.as_str(),
                flags,
                Mode::from_bits_truncate(0o600),
            ) {
                Ok(fd) => {
                    let mut f = File::from(fd);
                    if let Err(e) = f.write_all(bytes) {
                        let _ = unlinkat(&self.tmp, name.as_str(), UnlinkatFlags::NoRemoveDir);
                        return Err(e);
                    }
                    return Ok(name);
                }
                // One a process of the same pid left behind.
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Errno::EEXIST.into())
    }
}

impl Cache {
    /// Opens (making it if needed) the cache at `dir`, bounded to
    /// `max_bytes`, after checking that it can be trusted (see the
    /// module's text). A directory that cannot be made, or that another
    /// user could change, is an error naming it, why, and what fixes it.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<Cache> {
        Cache::open_as(dir, max_bytes, nix::unistd::geteuid().as_raw())
    }

    /// [`Cache::open`] for user `me` (tests pose as another user).
    fn open_as(dir: &Path, max_bytes: u64, me: u32) -> io::Result<Cache> {
        let (top, top_path) = open_trusted_dir(dir, me)?;
        let path = top_path.join("v1");
        let v1 = open_own_dir(top.as_fd(), "v1", &path, me)?;
        let objects = open_own_dir(v1.as_fd(), "objects", &path.join("objects"), me)?;
        let tmp = open_own_dir(v1.as_fd(), "tmp", &path.join("tmp"), me)?;
        let dirs = Dirs {
            path,
            v1,
            objects,
            tmp,
            me,
        };
        // Every shard directory and the lock, checked now: one of another
        // user refuses the cache here, not at a read; a symlink or FIFO
        // at their names is removed.
        for name in
            list(dirs.objects.as_fd()).map_err(|e| at(&dirs.path.join("objects"), "list", e))?
        {
            if let Some(name) = name.to_str().filter(|n| is_shard_name(n.as_bytes())) {
                dirs.shard(name, false)?;
            }
        }
        dirs.clear_lock()?;
        Ok(Cache {
            dirs: Arc::new(dirs),
            max_bytes: max_bytes.max(1),
            added_since: AtomicU64::new(0),
            evicting: Arc::new(AtomicBool::new(false)),
            stats: CacheStats::default(),
        })
    }

    /// The directory temporary files go to (on the cache's file system).
    pub fn tmp_dir(&self) -> PathBuf {
        self.dirs.path.join("tmp")
    }

    /// Where the entry for `hash` is, for messages and tests.
    fn entry_path(&self, hash: &[u8; 32]) -> PathBuf {
        let h = hex(hash);
        self.dirs.path.join("objects").join(&h[..2]).join(h)
    }

    /// Whether an entry for `hash` is there, a regular file (unchecked
    /// otherwise: [`Cache::get`] checks it when it is read). A hint for
    /// planning fetches, asked for many units at a time, so one `fstatat`
    /// of `ab/<hash>`: it opens nothing, and a shard that is a symlink
    /// (removed whenever one is met) can only make it answer wrongly.
    pub fn has(&self, hash: &[u8; 32]) -> bool {
        let h = hex(hash);
        let rel = format!("{}/{h}", &h[..2]);
        fstatat(
            &self.dirs.objects,
            rel.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|st| file_type(&st) == SFlag::S_IFREG)
    }

    /// Fills `out` with the entry for `hash` if there is one of exactly
    /// `out.len()` bytes whose SHA-256 is `hash` (and a regular file of
    /// ours, writable by nobody else); removes an entry that does not
    /// match. Whether `out` holds it.
    pub fn get(&self, hash: &[u8; 32], out: &mut [u8]) -> bool {
        let h = hex(hash);
        let shard = match self.dirs.shard(&h[..2], false) {
            Ok(Some(shard)) => shard,
            Ok(None) => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "a cache shard cannot be used");
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        };
        match read_entry(shard.as_fd(), &h, hash, out, self.dirs.me) {
            Ok(()) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(Unsound::Absent) => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(Unsound::Damaged(why)) => {
                tracing::warn!(entry = %self.entry_path(hash).display(), %why,
                    "a damaged cache entry; removed, and fetched again");
                self.stats.damaged.fetch_add(1, Ordering::Relaxed);
                let _ = unlinkat(&shard, h.as_str(), UnlinkatFlags::NoRemoveDir);
                false
            }
        }
    }

    /// Adds `bytes`, whose SHA-256 the caller has checked is `hash`. A
    /// failure (a full disk, a read-only cache) is logged and otherwise
    /// ignored: the cache only saves fetching again.
    pub fn put(&self, hash: &[u8; 32], bytes: &[u8]) {
        let h = hex(hash);
        let put = (|| -> io::Result<bool> {
            let Some(shard) = self.dirs.shard(&h[..2], true)? else {
                return Err(Errno::ENOENT.into());
            };
            let there = fstatat(&shard, h.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
            if there.is_ok_and(|st| file_type(&st) == SFlag::S_IFREG) {
                return Ok(false);
            }
            let tmp = self.dirs.write_temp(bytes)?;
            // Replaces whatever else is at the name (a symlink, a FIFO),
            // never what it leads to.
            if let Err(e) = renameat(&self.dirs.tmp, tmp.as_str(), &shard, h.as_str()) {
                let _ = unlinkat(&self.dirs.tmp, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
                return Err(e.into());
            }
            Ok(true)
        })();
        match put {
            Ok(false) => {}
            Ok(true) => {
                self.stats.added.fetch_add(1, Ordering::Relaxed);
                let added = self
                    .added_since
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed)
                    + bytes.len() as u64;
                if added >= self.max_bytes / EVICT_EVERY {
                    self.evict_in_background();
                }
            }
            Err(e) => {
                tracing::warn!(entry = %self.entry_path(hash).display(), error = %e,
                    "cannot add to the cache")
            }
        }
    }

    /// Starts an eviction on a thread of its own unless one is running in
    /// this process.
    fn evict_in_background(&self) {
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        self.added_since.store(0, Ordering::Relaxed);
        let (dirs, max, flag) = (self.dirs.clone(), self.max_bytes, self.evicting.clone());
        let spawned = std::thread::Builder::new()
            .name("cache-evict".into())
            .spawn(move || {
                match evict(&dirs, max) {
                    Ok(n) if n > 0 => tracing::debug!(removed = n, "cache eviction"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "cache eviction failed"),
                }
                flag.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.evicting.store(false, Ordering::Release);
        }
    }

    /// Runs an eviction now, in this thread; returns the entries removed.
    pub fn evict_now(&self) -> io::Result<u64> {
        let n = evict(&self.dirs, self.max_bytes)?;
        self.stats.evicted.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }
}

/// Removes the least recently used entries of the cache until their total
/// is at most [`EVICT_TO`] percent of `max`, and stale temporary files;
/// one process at a time (others skip). Only names of entries and
/// temporary files are removed, each by `unlinkat` in its held directory.
/// Returns the entries removed.
fn evict(dirs: &Dirs, max: u64) -> io::Result<u64> {
    let lock = dirs.open_lock()?;
    let Ok(_held) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
    else {
        return Ok(0);
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let stale = STALE_TMP.as_nanos() as i128;
    for name in list(dirs.tmp.as_fd())? {
        let old =
            fstatat(&dirs.tmp, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
                file_type(&st) != SFlag::S_IFDIR && now - crate::sys::mtime_ns(&st) > stale
            });
        if old {
            let _ = unlinkat(&dirs.tmp, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
    // (mtime, length, shard, name) of every entry that is a regular file.
    let mut entries: Vec<(i128, u64, String, OsString)> = Vec::new();
    let mut total = 0u64;
    for shard_name in list(dirs.objects.as_fd())? {
        let Some(shard_name) = shard_name.to_str().filter(|n| is_shard_name(n.as_bytes())) else {
            continue;
        };
        let Ok(Some(shard)) = dirs.shard(shard_name, false) else {
            continue;
        };
        for name in list(shard.as_fd())? {
            if !is_entry_name(name.as_encoded_bytes(), shard_name.as_bytes()) {
                continue;
            }
            let Ok(st) = fstatat(&shard, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            if file_type(&st) != SFlag::S_IFREG {
                continue;
            }
            let len = u64::try_from(st.st_size).unwrap_or(0);
            total = total.saturating_add(len);
            entries.push((crate::sys::mtime_ns(&st), len, shard_name.to_owned(), name));
        }
    }
    if total <= max {
        return Ok(0);
    }
    let target = max / 100 * EVICT_TO;
    entries.sort_unstable_by_key(|e| e.0);
    let mut doomed: BTreeMap<String, Vec<OsString>> = BTreeMap::new();
    for (_, len, shard, name) in entries {
        if total <= target {
            break;
        }
        total -= len;
        doomed.entry(shard).or_default().push(name);
    }
    let mut removed = 0;
    for (shard_name, names) in doomed {
        let Ok(Some(shard)) = dirs.shard(&shard_name, false) else {
            continue;
        };
        for name in names {
            if unlinkat(&shard, name.as_os_str(), UnlinkatFlags::NoRemoveDir).is_ok() {
                removed += 1;
            }
        }
    }
    Ok(removed)
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn hash(b: &[u8]) -> [u8; 32] {
        sha2::Sha256::digest(b).into()
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Every name under `dir` with what it is: a directory, a symlink's
    /// target, a file's SHA-256; sorted.
    fn tree(dir: &Path) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.push((p.clone(), "dir".into()));
                out.extend(tree(&p));
            } else if m.is_symlink() {
                out.push((
                    p.clone(),
                    format!("-> {}", std::fs::read_link(&p).unwrap().display()),
                ));
            } else {
                out.push((p.clone(), hex(&hash(&std::fs::read(&p).unwrap()))));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn directories_are_trusted_by_owner_and_mode_as_the_table_says() {
        use Role::{Ancestor, Own};
        const ME: u32 = 1000;
        let dir = SFlag::S_IFDIR;
        let ok: &[(SFlag, u32, u32, Role)] = &[
            (dir, 0, 0o755, Ancestor),
            (dir, ME, 0o700, Ancestor),
            (dir, ME, 0o755, Own),
            (dir, ME, 0o700, Own),
            // /tmp: others write, but cannot move what is not theirs.
            (dir, 0, 0o1777, Ancestor),
            (dir, ME, 0o1777, Ancestor),
        ];
        for &(kind, uid, mode, role) in ok {
            assert_eq!(
                judge_dir(kind, uid, mode, ME, role),
                Ok(()),
                "{uid} {mode:o} {role:?}"
            );
        }
        let bad: &[(SFlag, u32, u32, Role, Untrusted)] = &[
            (dir, 65534, 0o755, Ancestor, Untrusted::Owner(65534)),
            (dir, 0, 0o755, Own, Untrusted::Owner(0)),
            (dir, 65534, 0o700, Own, Untrusted::Owner(65534)),
            (dir, 0, 0o777, Ancestor, Untrusted::Writable(0o777)),
            (dir, 0, 0o775, Ancestor, Untrusted::Writable(0o775)),
            (dir, ME, 0o757, Own, Untrusted::Writable(0o757)),
            (dir, ME, 0o770, Own, Untrusted::Writable(0o770)),
            // A sticky cache directory still lets others add entries.
            (dir, ME, 0o1777, Own, Untrusted::Writable(0o1777)),
            (
                SFlag::S_IFLNK,
                ME,
                0o777,
                Own,
                Untrusted::NotADirectory(SFlag::S_IFLNK),
            ),
            (
                SFlag::S_IFIFO,
                ME,
                0o600,
                Ancestor,
                Untrusted::NotADirectory(SFlag::S_IFIFO),
            ),
            (
                SFlag::S_IFREG,
                ME,
                0o600,
                Own,
                Untrusted::NotADirectory(SFlag::S_IFREG),
            ),
        ];
        for &(kind, uid, mode, role, why) in bad {
            assert_eq!(
                judge_dir(kind, uid, mode, ME, role),
                Err(why),
                "{uid} {mode:o} {role:?}"
            );
        }
        // As root, another user's directory is never trusted either.
        assert_eq!(
            judge_dir(dir, 65534, 0o700, 0, Ancestor),
            Err(Untrusted::Owner(65534))
        );
        assert_eq!(judge_dir(dir, 0, 0o700, 0, Own), Ok(()));
    }

    #[test]
    fn entries_are_served_only_as_regular_files_of_ours_as_the_table_says() {
        const ME: u32 = 1000;
        let reg = SFlag::S_IFREG;
        assert_eq!(judge_entry(reg, ME, 0o600, 10, 10, ME), Ok(()));
        assert_eq!(judge_entry(reg, ME, 0o644, 10, 10, ME), Ok(()));
        let bad: &[(SFlag, u32, u32, i64, &str)] = &[
            (SFlag::S_IFIFO, ME, 0o600, 0, "a FIFO"),
            (SFlag::S_IFLNK, ME, 0o777, 10, "a symlink"),
            (SFlag::S_IFCHR, ME, 0o600, 0, "a device"),
            (SFlag::S_IFDIR, ME, 0o700, 10, "a directory"),
            (reg, 65534, 0o600, 10, "uid 65534"),
            (reg, 0, 0o600, 10, "uid 0"),
            (reg, ME, 0o666, 10, "writable by others"),
            (reg, ME, 0o600, 11, "11 bytes"),
            (reg, ME, 0o600, -1, "-1 bytes"),
        ];
        for &(kind, uid, mode, len, says) in bad {
            let why = judge_entry(kind, uid, mode, len, 10, ME).unwrap_err();
            assert!(why.contains(says), "{why}");
        }
    }

    #[test]
    fn entries_are_served_only_when_they_match_their_hash() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        let data = b"hello cache".to_vec();
        let h = hash(&data);
        let mut out = vec![0; data.len()];
        assert!(!c.get(&h, &mut out), "empty cache");
        assert!(!c.has(&h));
        c.put(&h, &data);
        assert!(c.has(&h));
        assert!(c.get(&h, &mut out));
        assert_eq!(out, data);
        // Damaged on disk: removed and reported absent.
        std::fs::write(c.entry_path(&h), b"hello cachE").unwrap();
        assert!(!c.get(&h, &mut out));
        assert!(!c.entry_path(&h).exists());
        assert_eq!(c.stats.damaged.load(Ordering::Relaxed), 1);
        // Of another length than asked: not served.
        c.put(&h, &data);
        assert!(!c.get(&h, &mut vec![0; data.len() + 1]));
        // Writable by others: removed, then added again and served.
        c.put(&h, &data);
        chmod(&c.entry_path(&h), 0o666);
        assert!(!c.get(&h, &mut out));
        assert!(!c.entry_path(&h).exists());
        c.put(&h, &data);
        assert!(c.get(&h, &mut out));
        // Nothing but entries is left behind.
        assert_eq!(std::fs::read_dir(c.tmp_dir()).unwrap().count(), 0);
        // The directories it made are private.
        for d in [
            "v1",
            "v1/objects",
            "v1/tmp",
            &format!("v1/objects/{}", &hex(&h)[..2]),
        ] {
            let mode = std::fs::metadata(dir.path().join(d)).unwrap().mode();
            assert_eq!(mode & 0o077, 0, "{d}: {mode:o}");
        }
    }

    /// Finding 7 of issue 32: a directory other users can write, or that
    /// is not the user's, is refused at open, naming the path and the fix,
    /// and nothing is made in it.
    #[test]
    fn a_directory_others_can_change_is_refused_naming_it_and_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let refused = |dir: &Path, me: u32, says: &[&str]| {
            let e = Cache::open_as(dir, 1 << 20, me)
                .err()
                .unwrap_or_else(|| panic!("{} opened", dir.display()));
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            let m = e.to_string();
            for s in says {
                assert!(m.contains(s), "{m} (wanted {s})");
            }
        };
        // The cache directory itself writable by others.
        let ww = t.join("ww");
        std::fs::create_dir(&ww).unwrap();
        chmod(&ww, 0o777);
        refused(
            &ww,
            me(),
            &[&ww.display().to_string(), "chmod go-w", "0777"],
        );
        assert_eq!(
            std::fs::read_dir(&ww).unwrap().count(),
            0,
            "nothing made in it"
        );
        // On the way: a directory others can write, not sticky.
        refused(
            &ww.join("c"),
            me(),
            &[&ww.display().to_string(), "not sticky"],
        );
        assert!(!ww.join("c").exists());
        // Sticky (as /tmp is): taken, and the cache made private in it.
        let sticky = t.join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        chmod(&sticky, 0o1777);
        Cache::open(&sticky.join("c"), 1 << 20).unwrap();
        assert_eq!(
            std::fs::metadata(sticky.join("c")).unwrap().mode() & 0o777,
            0o700
        );
        // Another user's (posing as uid 4242, to whom ours is another's).
        let ours = t.join("ours");
        Cache::open(&ours, 1 << 20).unwrap();
        refused(&ours, 4242, &["belongs to uid", "not to uid 4242", "chown"]);
        // Inside it: writable by others, or not a directory.
        chmod(&ours.join("v1/objects"), 0o777);
        refused(&ours, me(), &["v1/objects", "chmod go-w"]);
        chmod(&ours.join("v1/objects"), 0o700);
        std::fs::create_dir(ours.join("v1/objects/ab")).unwrap();
        chmod(&ours.join("v1/objects/ab"), 0o770);
        refused(&ours, me(), &["v1/objects/ab", "chmod go-w"]);
        std::fs::remove_dir(ours.join("v1/objects/ab")).unwrap();
        std::fs::remove_dir(ours.join("v1/tmp")).unwrap();
        std::os::unix::fs::symlink(t, ours.join("v1/tmp")).unwrap();
        refused(&ours, me(), &["v1/tmp is a symlink", "remove it"]);
        // A file where the directory should be.
        std::fs::write(t.join("file"), b"x").unwrap();
        refused(
            &t.join("file"),
            me(),
            &["is a regular file, not a directory"],
        );
        // A symlink loop is an error, not a hang.
        std::os::unix::fs::symlink("loop", t.join("loop")).unwrap();
        let e = Cache::open(&t.join("loop/c"), 1 << 20).err().unwrap();
        assert!(e.to_string().contains("loop"), "{e}");
        // Symlinks of the user and `..` are resolved, one name at a time.
        std::fs::create_dir(t.join("real")).unwrap();
        std::os::unix::fs::symlink("real", t.join("link")).unwrap();
        let c = Cache::open(&t.join("link/x/../c"), 1 << 20).unwrap();
        assert!(t.join("real/c/v1/objects").is_dir());
        assert!(
            c.tmp_dir().starts_with(t.join("real/c")),
            "{}",
            c.tmp_dir().display()
        );
    }

    /// Root, given a cache directory another user prepared (world-writable,
    /// or theirs, or reached through their symlink), refuses it.
    #[test]
    fn root_refuses_a_directory_another_user_prepared() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        let sticky = t.join("tmp");
        std::fs::create_dir(&sticky).unwrap();
        chmod(&sticky, 0o1777);
        let theirs = sticky.join("cache");
        std::fs::create_dir(&theirs).unwrap();
        nix::unistd::chown(&theirs, nobody, None).unwrap();
        for mode in [0o777, 0o755] {
            chmod(&theirs, mode);
            let e = Cache::open(&theirs, 1 << 20).err().unwrap();
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
            assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
        }
        // Their symlink in a sticky directory, to a directory of root's.
        let mine = t.join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::os::unix::fs::symlink(&mine, sticky.join("link")).unwrap();
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &sticky.join("link"),
            nobody,
            None,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let e = Cache::open(&sticky.join("link"), 1 << 20).err().unwrap();
        assert!(e.to_string().contains("is a symlink of uid 65534"), "{e}");
        assert_eq!(std::fs::read_dir(&mine).unwrap().count(), 0);
    }

    /// Finding 7 of issue 32: shard directories and the lock that are
    /// symlinks out of the cache, entries that are symlinks or FIFOs. No
    /// file outside is deleted, written or made; no read blocks; each bad
    /// name is removed and the content added again.
    #[test]
    fn symlinks_and_fifos_in_the_cache_are_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (outside, dir) = (tmp.path().join("outside"), tmp.path().join("cache"));
        std::fs::create_dir(&outside).unwrap();
        let blobs: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1000]).collect();
        // Outside: a victim file, and files named as the entries would be
        // (so that an eviction through a symlinked shard would see them).
        std::fs::write(outside.join("victim"), b"root's").unwrap();
        for b in &blobs[..20] {
            std::fs::write(outside.join(hex(&hash(b))), b).unwrap();
        }
        let before = tree(&outside);
        // Inside: every shard a symlink out, the lock a symlink out.
        std::fs::create_dir_all(dir.join("v1/objects")).unwrap();
        std::fs::create_dir_all(dir.join("v1/tmp")).unwrap();
        for i in 0..=255u8 {
            std::os::unix::fs::symlink(&outside, dir.join(format!("v1/objects/{i:02x}"))).unwrap();
        }
        std::os::unix::fs::symlink(outside.join("lock-target"), dir.join("v1/lock")).unwrap();
        // Filled through a handle with room (no eviction in the background
        // meanwhile), then evicted down to 9,000 bytes.
        let big = Cache::open(&dir, 1 << 30).unwrap();
        for b in &blobs {
            big.put(&hash(b), b);
        }
        let c = Cache::open(&dir, 10_000).unwrap();
        c.evict_now().unwrap();
        assert_eq!(tree(&outside), before, "nothing outside changed");
        assert!(!outside.join("lock-target").exists());
        // The cache holds real entries in real directories, within bound.
        let mut held = 0;
        for b in &blobs {
            let p = c.entry_path(&hash(b));
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                assert!(m.is_file(), "{}", p.display());
                assert!(
                    std::fs::symlink_metadata(p.parent().unwrap())
                        .unwrap()
                        .is_dir()
                );
                held += 1;
            }
        }
        assert!((1..=9).contains(&held), "{held} entries");
        assert!(
            std::fs::symlink_metadata(dir.join("v1/lock"))
                .unwrap()
                .is_file()
        );

        // An entry that is a FIFO: reported absent at once, removed.
        let b = &blobs[39];
        let p = c.entry_path(&hash(b));
        let _ = std::fs::remove_file(&p);
        nix::unistd::mkfifo(&p, Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let c = Arc::new(c);
        let c2 = c.clone();
        let h = hash(b);
        std::thread::spawn(move || tx.send(c2.get(&h, &mut [0; 1000])).unwrap());
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a read of a FIFO entry blocked");
        assert!(!got);
        assert!(
            std::fs::symlink_metadata(&p).is_err(),
            "the FIFO is removed"
        );
        assert!(!c.has(&h));
        // An entry that is a symlink to a file with the right bytes.
        std::fs::write(outside.join("copy"), b).unwrap();
        std::os::unix::fs::symlink(outside.join("copy"), &p).unwrap();
        assert!(!c.has(&h));
        assert!(!c.get(&h, &mut [0; 1000]));
        assert!(
            std::fs::symlink_metadata(&p).is_err(),
            "the symlink is removed"
        );
        assert_eq!(std::fs::read(outside.join("copy")).unwrap(), *b);
        // Added again over whatever is at its name, and served.
        std::os::unix::fs::symlink(outside.join("victim"), &p).unwrap();
        c.put(&h, b);
        assert!(c.get(&h, &mut [0; 1000]));
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"root's");
    }

    /// An entry of another owner is removed and added again (as root; a
    /// user cannot give a file away).
    #[test]
    fn an_entry_of_another_owner_is_removed_and_added_again() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 1 << 20).unwrap();
        let data = vec![7u8; 5000];
        let h = hash(&data);
        c.put(&h, &data);
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(&c.entry_path(&h), nobody, None).unwrap();
        let mut out = vec![0; data.len()];
        assert!(!c.get(&h, &mut out));
        assert!(!c.entry_path(&h).exists());
        assert_eq!(c.stats.damaged.load(Ordering::Relaxed), 1);
        c.put(&h, &data);
        assert!(c.get(&h, &mut out));
        assert_eq!(std::fs::metadata(c.entry_path(&h)).unwrap().uid(), 0);
    }

    #[test]
    fn eviction_removes_the_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        // Filled through a handle with room (no eviction in the background
        // meanwhile), then bounded to 10,000 bytes: 12,000 are there.
        let big = Cache::open(dir.path(), 1 << 30).unwrap();
        let c = Cache::open(dir.path(), 10_000).unwrap();
        let blobs: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 1000]).collect();
        for (i, b) in blobs.iter().enumerate() {
            big.put(&hash(b), b);
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64);
            File::open(c.entry_path(&hash(b)))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // A stale temporary file goes too; a fresh one stays.
        let stale = c.tmp_dir().join(".entry-stale");
        std::fs::write(&stale, b"x").unwrap();
        File::open(&stale)
            .unwrap()
            .set_modified(SystemTime::UNIX_EPOCH)
            .unwrap();
        std::fs::write(c.tmp_dir().join(".entry-fresh"), b"x").unwrap();
        // The oldest, used again, is the newest now.
        assert!(c.get(&hash(&blobs[0]), &mut vec![0; 1000]));
        c.evict_now().unwrap();
        let left: Vec<bool> = blobs
            .iter()
            .map(|b| c.entry_path(&hash(b)).exists())
            .collect();
        assert!(left.iter().filter(|l| **l).count() <= 9, "{left:?}");
        assert!(left[0], "the entry used last is kept: {left:?}");
        assert!(!left[1], "the least recently used goes first: {left:?}");
        assert!(left[11], "{left:?}");
        assert!(!stale.exists());
        assert!(c.tmp_dir().join(".entry-fresh").exists());
    }
}
