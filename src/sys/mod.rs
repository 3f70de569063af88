//! Small portable wrappers over the system calls sessionfs needs beyond std:
//! opening beneath a directory without following symlinks, and the stat
//! fields we read. Linux-only calls sit behind `cfg`, with a portable path.
//! The mount table and the memory limits, read from files rather than
//! asked of the kernel, live in modules of their own.

//! What differs between Linux and macOS is in `platform`.

#[cfg(target_os = "linux")]
pub mod fd;
mod memory;
mod mountinfo;
pub mod platform;

pub use memory::{fit_malloc_to_address_space, memory_limit};
pub use mountinfo::{
    LOCAL_FILE_SYSTEMS, Mount, MountAt, is_sessionfs_mount, mount_at, mount_owner, mounts,
    real_path, real_path_beside, sessionfs_mount_device,
};
pub use platform::{fallbacks_forced, fuse_fsname, is_fuse_path, mode};

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// `p` made absolute against the working directory, without touching
/// the file system (a path that answers nothing, such as a dead mount's,
/// included); `p` as given where even that fails.
pub fn absolute(p: &Path) -> std::path::PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_owned())
}

/// Opens `rel` beneath the directory `root`, refusing to traverse any
/// symlink or to leave `root` (`..` components are refused too). `rel` may
/// be empty, meaning `root` itself. `flags` should carry the access mode and
/// `O_DIRECTORY` when a directory is wanted; `O_NOFOLLOW` and `O_CLOEXEC`
/// are added here.
pub fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let rel_bytes = rel.as_os_str().as_bytes();
    let rel: &Path = if rel_bytes.is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    // openat2 refuses a mode without O_CREAT (EINVAL), unlike openat.
    let mode = if flags.contains(OFlag::O_CREAT) {
        mode
    } else {
        Mode::empty()
    };
    match platform::openat2_beneath(root, rel, flags, mode, false) {
        // No openat2 here, or a path of PATH_MAX or more (legal in a
        // packet, up to its path limit): walk by hand.
        None | Some(Err(nix::errno::Errno::ENAMETOOLONG)) => {
            open_beneath_by_components(root, rel, flags, mode)
        }
        Some(other) => other.map_err(io::Error::from),
    }
}

/// The portable path: one `openat(O_NOFOLLOW)` per component, so no
/// symlink is ever traversed; `..` is refused.
fn open_beneath_by_components(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let comps: Vec<&OsStr> = rel
        .as_os_str()
        .as_bytes()
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(OsStr::from_bytes)
        .collect();
    if comps.iter().any(|c| c.as_bytes() == b"..") {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Some((last, dirs)) = comps.split_last() else {
        return openat(root, ".", flags, mode).map_err(io::Error::from);
    };
    let mut current: Option<OwnedFd> = None;
    for c in dirs {
        let base = current.as_ref().map_or(root, |fd| fd.as_fd());
        current = Some(openat(base, *c, dir_flags, Mode::empty()).map_err(io::Error::from)?);
    }
    let base = current.as_ref().map_or(root, |fd| fd.as_fd());
    openat(base, *last, flags, mode).map_err(io::Error::from)
}

/// Opens the directory `rel` beneath the directory `dir` for reading,
/// without following a symlink or entering another mount: `Ok(None)` when
/// `rel` is, or passes through, a mount point (of any file system, a bind
/// mount included), which is then not touched at all, so a mount whose
/// server hangs cannot hang the caller. Linux only (`openat2` with
/// `RESOLVE_NO_XDEV`); elsewhere, on kernels before 5.6 and with the
/// fallbacks forced, an `Unsupported` error: there is no way to open it
/// knowing that it is not a mount.
pub fn open_dir_same_mount(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<Option<OwnedFd>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    open_same_mount(dir, rel, flags)
}

/// The stat of the entry `name` of the directory `dir` (a symlink's own),
/// or `None` when it is a mount point (a file can be one, bind-mounted),
/// which is then not touched: as [`open_dir_same_mount`], through an
/// `O_PATH` handle. Where that cannot be told, a plain `fstatat`.
pub fn stat_same_mount(dir: BorrowedFd<'_>, name: &Path) -> io::Result<Option<FileStat>> {
    let flags = platform::STAT_ONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match open_same_mount(dir, name, flags) {
        Ok(Some(fd)) => return Ok(Some(nix::sys::stat::fstat(fd.as_fd())?)),
        Ok(None) => return Ok(None),
        Err(e) if e.kind() != io::ErrorKind::Unsupported => return Err(e),
        Err(_) => {}
    }
    let flags = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
    Ok(Some(nix::sys::stat::fstatat(dir, name, flags)?))
}

fn open_same_mount(dir: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> io::Result<Option<OwnedFd>> {
    match platform::openat2_beneath(dir, rel, flags, Mode::empty(), true) {
        Some(Ok(fd)) => Ok(Some(fd)),
        Some(Err(nix::errno::Errno::EXDEV)) => Ok(None),
        Some(Err(e)) => Err(e.into()),
        None => Err(io::ErrorKind::Unsupported.into()),
    }
}

/// Whether the directory held open as `dir` is still the one at `path`
/// (same device and inode): not moved, nor replaced (by a symlink to
/// another, say) since it was opened.
pub fn is_at(dir: BorrowedFd<'_>, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let held = nix::sys::stat::fstat(dir).map(|st| dev_ino(&st));
    let here = std::fs::metadata(path).map(|m| (m.dev(), m.ino()));
    matches!((held, here), (Ok(a), Ok(b)) if a == b)
}

/// Whether the real path `p` is a mount point, told without a mount table:
/// it is on another device than its parent, or is its own parent (`/`). A
/// dead FUSE mount (`ENOTCONN`) is one. Asks the mount itself.
pub fn is_mount_point(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let here = match std::fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) => return e.raw_os_error() == Some(libc::ENOTCONN),
    };
    let parent = p.parent().unwrap_or(p);
    std::fs::metadata(parent)
        .is_ok_and(|up| up.dev() != here.dev() || (up.dev(), up.ino()) == (here.dev(), here.ino()))
}

/// `p` made absolute (and normalised: no `.` or `..` left) through its longest existing ancestor, canonicalized
/// (symlinks resolved), with the missing components after it appended.
pub fn resolved(p: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let abs = std::path::absolute(p).ok()?;
    let comps: Vec<Component> = abs.components().collect();
    // The longest prefix that exists, canonicalized; the rest (which names
    // nothing yet, so no symlink) applied lexically, `..` included.
    (0..=comps.len()).rev().find_map(|n| {
        let prefix: PathBuf = comps[..n].iter().collect();
        let mut out = std::fs::canonicalize(&prefix).ok()?;
        for c in &comps[n..] {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::Normal(name) => out.push(name),
                _ => {}
            }
        }
        Some(out)
    })
}

/// Whether process `pid` has exited (a zombie has: its files are closed).
pub fn exited(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Removes the entry `name` of the directory `dir`: a file, or a
/// directory and everything in it, without following a symlink and
/// without entering a mount (one inside is left, and the removal fails
/// with `EBUSY`: what is mounted there is not the caller's to remove).
/// Where a mount cannot be told without entering it (not Linux), a
/// directory on another device than its parent is taken for one; a bind
/// mount of the same file system (Linux only) then cannot be told. The
/// first error is returned once all else that can go is gone.
pub fn remove_tree_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    use nix::errno::Errno;
    use nix::unistd::{UnlinkatFlags, unlinkat};
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        // A directory: EISDIR on Linux, EPERM elsewhere.
        Err(Errno::EISDIR | Errno::EPERM) => {}
        r => return r.map_err(io::Error::from),
    }
    let sub = match open_dir_same_mount(dir, Path::new(name)) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Err(Errno::EBUSY.into()),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            let sub = openat(
                dir,
                name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            let dev = |fd| nix::sys::stat::fstat(fd).map(|st| dev_ino(&st).0);
            if dev(sub.as_fd())? != dev(dir)? {
                return Err(Errno::EBUSY.into());
            }
            sub
        }
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for e in nix::dir::Dir::from_fd(sub.try_clone()?)?.iter() {
        let n = e?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            names.push(n);
        }
    }
    let mut first = None;
    for n in names {
        if let Err(e) = remove_tree_at(sub.as_fd(), OsStr::from_bytes(&n)) {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => unlinkat(dir, name, UnlinkatFlags::RemoveDir).map_err(io::Error::from),
    }
}

/// Where to create `rel` beneath `root`: `root` and `rel` itself when the
/// OS takes the path whole, else the directory holding it (opened beneath
/// `root` a component at a time) and its last name. The `OwnedFd`, when
/// there is one, is the directory to use.
pub fn parent_beneath<'r>(
    root: BorrowedFd<'_>,
    rel: &'r Path,
) -> io::Result<(Option<OwnedFd>, &'r Path)> {
    let bytes = rel.as_os_str().as_bytes();
    if bytes.len() < libc::PATH_MAX as usize {
        return Ok((None, rel));
    }
    let (dir, name) = match bytes.iter().rposition(|&b| b == b'/') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG)),
    };
    let fd = open_beneath(
        root,
        Path::new(OsStr::from_bytes(dir)),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )?;
    Ok((Some(fd), Path::new(OsStr::from_bytes(name))))
}

/// Reserves the blocks of the first `len` bytes of `file`, already that
/// long (`fallocate`, `F_PREALLOCATE` on macOS), so a full disk is
/// reported before writing starts. A filesystem that cannot reserve is not
/// an error.
pub fn reserve(file: &std::fs::File, len: u64) -> io::Result<()> {
    platform::preallocate(file, len)
}

/// Asks the kernel to start reading `len` bytes at `offset` of `file` into
/// the page cache now (`POSIX_FADV_WILLNEED`), so that I/O overlaps the
/// caller's work. Advice only: does nothing where unsupported.
pub fn will_need(file: &std::fs::File, offset: u64, len: u64) {
    platform::advise(file, offset, len, platform::Advice::WillNeed);
}

/// Marks directory `dir` as the top of a directory hierarchy (ext4's
/// `chattr +T`, `FS_TOPDIR_FL`), so that the directories made in it are
/// spread over the disk's block groups (the Orlov allocator) instead of
/// sharing their parent's. Advice only: does nothing where unsupported.
pub fn mark_top_dir(dir: &impl std::os::fd::AsFd) {
    platform::set_top_dir_flag(dir);
}

/// `file` opened again past the page cache (`O_DIRECT`; `F_NOCACHE` on
/// macOS), for reading, or writing when `write`; `None` where the file
/// system (or a missing /proc) refuses it.
pub fn reopen_direct(file: &std::fs::File, write: bool) -> Option<std::fs::File> {
    platform::reopen_uncached(file, write)
}

/// `fallocate(2)`'s `FALLOC_FL_KEEP_SIZE` and `FALLOC_FL_PUNCH_HOLE`, with
/// Linux's values on every platform: the values FUSE carries in a
/// `fallocate` request's mode, which [`fallocate`] takes (macOS's libc has
/// no such constants).
pub const FALLOC_KEEP_SIZE: i32 = 0x01;
/// See [`FALLOC_KEEP_SIZE`].
pub const FALLOC_PUNCH_HOLE: i32 = 0x02;
#[cfg(target_os = "linux")]
const _: () = assert!(
    FALLOC_KEEP_SIZE == libc::FALLOC_FL_KEEP_SIZE
        && FALLOC_PUNCH_HOLE == libc::FALLOC_FL_PUNCH_HOLE
);

/// `fallocate(2)` with raw `mode` flags (Linux); `EOPNOTSUPP` elsewhere.
pub fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    platform::fallocate(file, mode, offset, len)
}

/// Starts writing back the dirty pages of `len` bytes at `offset` of
/// `file` without waiting for them, so that a later fsync waits only for
/// what was written since. Linux has no safe call for exactly this
/// (`sync_file_range` is not in nix); `POSIX_FADV_DONTNEED` does it: it
/// submits the range's dirty pages for writeback (without waiting) and then
/// drops only pages that are clean and idle, so the pages just written stay
/// cached. PostgreSQL uses it the same way where `sync_file_range` is
/// missing. Advice only: does nothing elsewhere.
pub fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    platform::advise(file, offset, len, platform::Advice::DontNeed);
}

/// Writes `bytes` to `path` through a temporary file beside it, fsynced
/// and renamed into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".sessionfs.")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The file type bits of a stat.
pub fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// A file's identity on this machine: its device and inode numbers.
pub type FileId = (u64, u64);

/// `(st_dev, st_ino)` as u64 (their C types differ between platforms).
#[allow(clippy::unnecessary_cast)]
pub fn dev_ino(st: &FileStat) -> FileId {
    (st.st_dev as u64, st.st_ino as u64)
}

/// Modification time of a stat in nanoseconds since the epoch (may be
/// negative for files dated before 1970).
pub fn mtime_ns(st: &FileStat) -> i128 {
    i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec)
}

/// Appends up to `size` bytes of `file` at `offset` to `out`: fewer at
/// its end. `EINTR` is retried; on another error `out` is left as it was.
pub fn read_append_at(
    file: &std::fs::File,
    offset: u64,
    size: u32,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let at = out.len();
    out.resize(at + size as usize, 0);
    let mut got = 0;
    while got < size as usize {
        match file.read_at(&mut out[at + got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                out.truncate(at);
                return Err(e);
            }
        }
    }
    out.truncate(at + got);
    Ok(())
}

/// The kernel's page size (4096 where it cannot be asked).
pub fn page_size() -> u64 {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(n)) if n > 0 => n as u64,
        _ => 4096,
    }
}

/// Blocks of zeros left as holes by [`write_sparse`]: the filesystems'
/// block size.
pub const HOLE_BLOCK: u64 = 4096;

/// Writes `bytes` at `offset` of a new `file`, leaving holes where a piece
/// between 4 KiB boundaries of the file is all zeros (what is not written
/// of a new file reads as zeros; the caller sets the length). Runs of data
/// go in one `pwrite` each. Returns the end of the last byte written, if
/// any was.
pub fn write_sparse(file: &std::fs::File, bytes: &[u8], offset: u64) -> io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    let mut written = None;
    let mut run: Option<usize> = None;
    let mut flush = |start: usize, end: usize| -> io::Result<()> {
        file.write_all_at(&bytes[start..end], offset + start as u64)?;
        written = Some(offset + end as u64);
        Ok(())
    };
    let mut i = 0;
    while i < bytes.len() {
        let at = offset + i as u64;
        let end = (i + (HOLE_BLOCK - at % HOLE_BLOCK) as usize).min(bytes.len());
        match (is_zero(&bytes[i..end]), run) {
            (true, Some(start)) => {
                flush(start, i)?;
                run = None;
            }
            (false, None) => run = Some(i),
            _ => {}
        }
        i = end;
    }
    if let Some(start) = run {
        flush(start, bytes.len())?;
    }
    Ok(written)
}

/// Whether `b` is all zeros: the inner fold vectorizes, the outer stops at
/// the first piece with data (the first, for most data).
fn is_zero(b: &[u8]) -> bool {
    b.chunks(256).all(|c| c.iter().fold(0, |a, &x| a | x) == 0)
}

/// `rename` of `from` in the directory `from_dir` to `to` in `to_dir`
/// that fails (EEXIST) rather than replace what is at `to`; the names are
/// found in those directories wherever they have been moved since they
/// were opened. Where the file system cannot rename so
/// (`RENAME_NOREPLACE` is EINVAL on NFS and some FUSE file systems,
/// `RENAME_EXCL` ENOTSUP on some macOS volumes), it looks first and
/// renames: something made at `to` in between is replaced.
pub fn rename_noreplace_at(
    from_dir: BorrowedFd<'_>,
    from: &Path,
    to_dir: BorrowedFd<'_>,
    to: &Path,
) -> io::Result<()> {
    use nix::fcntl::renameat;
    if let Some(r) = platform::rename_exclusive(from_dir, from, to_dir, to) {
        return r;
    }
    let flags = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
    if nix::sys::stat::fstatat(to_dir, to, flags).is_ok() {
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    renameat(from_dir, from, to_dir, to).map_err(io::Error::from)
}

/// The longest name a directory entry may have, in bytes (Linux and
/// macOS).
pub const NAME_MAX: usize = 255;

/// `name` cut to at most `room` bytes, at a character boundary: for the
/// names of temporary files made from a user's name plus a fixed part.
pub fn name_part(name: &str, room: usize) -> &str {
    let mut end = name.len().min(room);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn refuses_symlinks_and_escapes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"x").unwrap();
        std::os::unix::fs::symlink("d", dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("abs")).unwrap();
        let root = std::fs::File::open(dir.path()).unwrap();
        let ro = OFlag::O_RDONLY;
        for f in [open_beneath, open_beneath_by_components] {
            assert!(f(root.as_fd(), Path::new("d/f"), ro, Mode::empty()).is_ok());
            assert!(
                f(
                    root.as_fd(),
                    Path::new(""),
                    ro | OFlag::O_DIRECTORY,
                    Mode::empty()
                )
                .is_ok()
            );
            assert!(f(root.as_fd(), Path::new("link/f"), ro, Mode::empty()).is_err());
            assert!(f(root.as_fd(), Path::new("link"), ro, Mode::empty()).is_err());
            assert!(f(root.as_fd(), Path::new("abs/passwd"), ro, Mode::empty()).is_err());
            assert!(f(root.as_fd(), Path::new("../x"), ro, Mode::empty()).is_err());
        }
    }

    #[test]
    fn sparse_writes_leave_holes() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let f = tempfile::tempfile().unwrap();
        let mut data = vec![0u8; 1 << 20];
        data[100] = 1;
        data[(1 << 20) - 1] = 2;
        assert_eq!(write_sparse(&f, &data, 0).unwrap(), Some(1 << 20));
        f.set_len(1 << 20).unwrap();
        let m = f.metadata().unwrap();
        assert!(
            m.blocks() * 512 < 64 * 1024,
            "{} blocks allocated",
            m.blocks()
        );
        let mut back = vec![0u8; 1 << 20];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, data);
    }
}
