//! What differs between Linux and macOS, in one place: each function here
//! is a thin wrapper whose Linux fast path and macOS equivalent sit side by
//! side, and whose answer "not here" sends the caller (in `sys` or above)
//! down its portable path. docs/SEMANTICS.md "Portability" lists them.
//!
//! The Linux fast paths can be turned off at run time by the test suite
//! ([`fallbacks_forced`]), so that the portable paths a Mac runs are run
//! by the tests on Linux too.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// The environment variable that forces the portable fallbacks (`1`), read
/// only by debug builds: see [`fallbacks_forced`].
#[cfg(debug_assertions)]
pub const FORCE_FALLBACKS_VAR: &str = "SESSIONFS_TEST_FALLBACKS";

/// Whether the Linux fast paths are off, so that every place with a
/// portable fallback takes it, as on macOS. A test switch, not an option:
/// only a debug build (what `cargo test` builds and runs, the binary
/// included) reads [`FORCE_FALLBACKS_VAR`]; in a release build this is a
/// constant `false` and the variable is never looked at, so the binary
/// users run has no such switch.
#[cfg(debug_assertions)]
pub fn fallbacks_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| std::env::var_os(FORCE_FALLBACKS_VAR).is_some_and(|v| v == "1"))
}

/// Whether the Linux fast paths are off: never, in a release build.
#[cfg(not(debug_assertions))]
pub const fn fallbacks_forced() -> bool {
    false
}

/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, with
/// `RESOLVE_NO_XDEV` when `same_mount` (Linux 5.6 and later): `None`
/// where there is no such call (not Linux, an older kernel, the fallbacks
/// forced), and the caller walks the path a component at a time with
/// `O_NOFOLLOW` (macOS has `O_RESOLVE_BENEATH` only from macOS 15, and no
/// `RESOLVE_NO_XDEV` at all).
pub(super) fn openat2_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    mode: Mode,
    same_mount: bool,
) -> Option<nix::Result<OwnedFd>> {
    #[cfg(target_os = "linux")]
    if !fallbacks_forced() {
        use nix::fcntl::{OpenHow, ResolveFlag, openat2};
        let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
        if same_mount {
            resolve |= ResolveFlag::RESOLVE_NO_XDEV;
        }
        let how = OpenHow::new().flags(flags).mode(mode).resolve(resolve);
        return match openat2(dir, rel, how) {
            Err(nix::errno::Errno::ENOSYS) => None,
            r => Some(r),
        };
    }
    let _ = (dir, rel, flags, mode, same_mount);
    None
}

/// The flag that opens a handle for `fstat` only, without reading
/// permission (`O_PATH`, Linux); read-only elsewhere, where
/// [`openat2_beneath`] never runs.
#[cfg(target_os = "linux")]
pub(super) const STAT_ONLY: OFlag = OFlag::O_PATH;
#[cfg(not(target_os = "linux"))]
pub(super) const STAT_ONLY: OFlag = OFlag::O_RDONLY;

/// `rename` that fails with `EEXIST` rather than replace `to`, done by the
/// kernel: `renameat2(RENAME_NOREPLACE)` (Linux) or
/// `renameatx_np(RENAME_EXCL)` (macOS). `None` where the file system
/// cannot (`EINVAL` on NFS and some FUSE file systems; `ENOTSUP` on macOS
/// volumes without it, such as FAT or SMB) or the fallbacks are forced:
/// the caller then looks and renames.
pub(super) fn rename_exclusive(
    from_dir: BorrowedFd<'_>,
    from: &Path,
    to_dir: BorrowedFd<'_>,
    to: &Path,
) -> Option<io::Result<()>> {
    if fallbacks_forced() {
        return None;
    }
    #[cfg(target_os = "linux")]
    {
        use nix::fcntl::{RenameFlags, renameat2};
        match renameat2(from_dir, from, to_dir, to, RenameFlags::RENAME_NOREPLACE) {
            Err(nix::errno::Errno::EINVAL) => None,
            r => Some(r.map_err(io::Error::from)),
        }
    }
    #[cfg(target_os = "macos")]
    {
        use rustix::fs::{RenameFlags, renameat_with};
        match renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOTSUP) => None,
            r => Some(r.map_err(io::Error::from)),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (from_dir, from, to_dir, to);
        None
    }
}

/// What a rename request on the mount asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameMode {
    /// A plain rename, replacing what is at the new name.
    Replace,
    /// Fail with `EEXIST` rather than replace.
    NoReplace,
    /// Exchange the two names, both of which must exist.
    Exchange,
}

/// The flag bits of a rename request of one kernel.
struct RenameBits {
    no_replace: u32,
    exchange: u32,
}

/// Linux `renameat2`: `RENAME_NOREPLACE`, `RENAME_EXCHANGE` (and
/// `RENAME_WHITEOUT`, 4, which the overlay does not implement).
const LINUX_RENAME: RenameBits = RenameBits {
    no_replace: 1,
    exchange: 2,
};

/// macOS `renamex_np`, as macFUSE passes it on: `RENAME_EXCL`,
/// `RENAME_SWAP` (and `RENAME_SECLUDE`, 1, which is refused). The same
/// bit, 4, means "no replace" here and "whiteout" on Linux: hence one
/// table per kernel.
const MACOS_RENAME: RenameBits = RenameBits {
    no_replace: 4,
    exchange: 2,
};

/// What a FUSE rename request with flag bits `flags` asks for, decoded
/// with this kernel's values; `None` (answered `EINVAL`) for a flag the
/// overlay does not implement or a combination that means nothing.
pub fn rename_mode(flags: u32) -> Option<RenameMode> {
    if cfg!(target_os = "macos") {
        decode_rename(flags, &MACOS_RENAME)
    } else {
        decode_rename(flags, &LINUX_RENAME)
    }
}

fn decode_rename(flags: u32, bits: &RenameBits) -> Option<RenameMode> {
    match flags {
        0 => Some(RenameMode::Replace),
        f if f == bits.no_replace => Some(RenameMode::NoReplace),
        f if f == bits.exchange => Some(RenameMode::Exchange),
        _ => None,
    }
}

/// Reserves the blocks of the first `len` bytes of `file`, whose length is
/// already `len`: `fallocate(FALLOC_FL_KEEP_SIZE)` (Linux),
/// `fcntl(F_PREALLOCATE)` (macOS). A file system that cannot reserve, and
/// the fallbacks forced, reserve nothing, which is not an error: a full
/// disk is then found by the writes.
pub(super) fn preallocate(file: &std::fs::File, len: u64) -> io::Result<()> {
    if fallbacks_forced() {
        return Ok(());
    }
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    #[cfg(target_os = "linux")]
    {
        use nix::fcntl::{FallocateFlags, fallocate};
        match fallocate(file, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, len) {
            Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
    #[cfg(target_os = "macos")]
    {
        use nix::fcntl::{FcntlArg, fcntl};
        // From the physical end of the file, which a file just sized (a
        // hole) has at 0: all of it, or nothing.
        let mut store = libc::fstore_t {
            fst_flags: libc::F_ALLOCATEALL,
            fst_posmode: libc::F_PEOFPOSMODE,
            fst_offset: 0,
            fst_length: len,
            fst_bytesalloc: 0,
        };
        match fcntl(file, FcntlArg::F_PREALLOCATE(&mut store)) {
            Ok(_) | Err(nix::errno::Errno::ENOTSUP | nix::errno::Errno::EINVAL) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (file, len);
        Ok(())
    }
}

/// `fallocate(2)` with raw `mode` flags, for the mount's `fallocate`
/// (Linux). `EOPNOTSUPP` elsewhere (macFUSE sends no such request; macOS
/// has no call that takes Linux's modes) and with the fallbacks forced.
pub(super) fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if !fallbacks_forced() {
        use nix::fcntl::FallocateFlags;
        let flags = FallocateFlags::from_bits(mode)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
        let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        return nix::fcntl::fallocate(file, flags, off, len).map_err(io::Error::from);
    }
    let _ = (file, mode, offset, len);
    Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

/// `file` opened again, for reading or, when `write`, for writing, past
/// the page cache: `O_DIRECT` through `/proc/self/fd` (Linux, the same
/// inode even if its name now points elsewhere), or by its path
/// (`F_GETPATH`) with `F_NOCACHE` (macOS), checked to be the same file.
/// `None` where the file system refuses, or with the fallbacks forced:
/// the caller then writes through the cache.
pub(super) fn reopen_uncached(file: &std::fs::File, write: bool) -> Option<std::fs::File> {
    if fallbacks_forced() {
        return None;
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(!write).write(write);
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        options
            .custom_flags(libc::O_DIRECT)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .ok()
    }
    #[cfg(target_os = "macos")]
    {
        use nix::fcntl::{FcntlArg, fcntl};
        use std::os::unix::fs::MetadataExt;
        let mut path = std::path::PathBuf::new();
        fcntl(file, FcntlArg::F_GETPATH(&mut path)).ok()?;
        let again = options.open(&path).ok()?;
        let (a, b) = (file.metadata().ok()?, again.metadata().ok()?);
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return None;
        }
        rustix::fs::fcntl_nocache(&again, true).ok()?;
        Some(again)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (file, options);
        None
    }
}

/// `posix_fadvise(advice)` over `len` bytes at `offset` of `file` (Linux):
/// advice only, so nothing elsewhere (macOS has no `posix_fadvise`) or
/// with the fallbacks forced.
pub(super) fn advise(file: &std::fs::File, offset: u64, len: u64, advice: Advice) {
    #[cfg(target_os = "linux")]
    if !fallbacks_forced() {
        use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
        let advice = match advice {
            Advice::WillNeed => PosixFadviseAdvice::POSIX_FADV_WILLNEED,
            Advice::DontNeed => PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        };
        if let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) {
            let _ = posix_fadvise(file, off, len, advice);
        }
    }
    let _ = (file, offset, len, advice);
}

/// The `posix_fadvise` advice sessionfs gives.
#[derive(Clone, Copy)]
pub(super) enum Advice {
    /// `POSIX_FADV_WILLNEED`: read it in now.
    WillNeed,
    /// `POSIX_FADV_DONTNEED`: start writing it back.
    DontNeed,
}

/// Sets ext4's `FS_TOPDIR_FL` on `dir` (Linux). Advice only: nothing
/// elsewhere or with the fallbacks forced.
pub(super) fn set_top_dir_flag(dir: &impl std::os::fd::AsFd) {
    #[cfg(target_os = "linux")]
    if !fallbacks_forced() {
        use rustix::fs::{IFlags, ioctl_getflags, ioctl_setflags};
        if let Ok(flags) = ioctl_getflags(dir)
            && !flags.contains(IFlags::TOPDIR)
        {
            let _ = ioctl_setflags(dir, flags | IFlags::TOPDIR);
        }
    }
    let _ = dir;
}

/// Unmounts the file system at `point` (a real path; a symlink there is
/// not followed on Linux): `umount2` (Linux), `unmount(2)` (macOS). With
/// `lazy`, even while files are open on it: `MNT_DETACH` on Linux, which
/// detaches it now and lets open files be served until closed; macOS has
/// no detach, and `MNT_FORCE` unmounts at once, after which open files
/// fail (`ENXIO`/`EBADF`) rather than being served.
pub fn unmount(point: &Path, lazy: bool) -> nix::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use nix::mount::MntFlags;
        let lazy = if lazy {
            MntFlags::MNT_DETACH
        } else {
            MntFlags::empty()
        };
        nix::mount::umount2(point, MntFlags::UMOUNT_NOFOLLOW | lazy)
    }
    #[cfg(target_os = "macos")]
    {
        use nix::mount::MntFlags;
        let flags = if lazy {
            MntFlags::MNT_FORCE
        } else {
            MntFlags::empty()
        };
        nix::mount::unmount(point, flags)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (point, lazy);
        Err(nix::errno::Errno::ENOSYS)
    }
}

/// Whether this process runs with `no_new_privs` (Linux; elsewhere never):
/// set-user-ID programs such as `fusermount3` then gain nothing.
pub fn no_new_privs() -> bool {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::get_no_new_privs().unwrap_or(false)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// The system call [`unmount`] makes, as `sessionfs umount` reports it
/// (`via`).
pub const UNMOUNT_CALL: &str = if cfg!(target_os = "linux") {
    "umount2"
} else {
    "unmount"
};

/// The user id of the process at the other end of the Unix socket
/// `conn`: `SO_PEERCRED` (Linux), `getpeereid` (macOS, through
/// `LOCAL_PEERCRED`). No fallback: without a peer's identity the control
/// socket refuses the connection.
pub fn peer_uid(conn: &std::os::unix::net::UnixStream) -> io::Result<u32> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials)
            .map(|c| c.uid())
            .map_err(io::Error::from)
    }
    #[cfg(not(target_os = "linux"))]
    {
        nix::unistd::getpeereid(conn)
            .map(|(uid, _)| uid.as_raw())
            .map_err(io::Error::from)
    }
}

/// FUSE-T's mounts are NFS (or SMB) mounts of a local server, whose
/// source it writes as this prefix and the file system's name.
const FUSE_T_SOURCE: &[u8] = b"fuse-t:/";

/// The name a FUSE file system was mounted with (its `fsname`, such as
/// `sessionfs:<digest>`), when a mount of type `fstype` from `source` (as
/// the mount table or `statfs` give them) is served by FUSE: `fuse` and
/// `fuse.<subtype>` (Linux), `macfuse` (macFUSE 4 and 5) and `osxfuse`
/// (older), and FUSE-T's NFS and SMB mounts. `None` for any other. Not
/// platform-specific, so that one table test checks every name.
pub fn fuse_fsname<'s>(fstype: &str, source: &'s [u8]) -> Option<&'s [u8]> {
    match fstype {
        "fuse" | "macfuse" | "osxfuse" => Some(source),
        "nfs" | "smbfs" => source.strip_prefix(FUSE_T_SOURCE),
        t if t.starts_with("fuse.") => Some(source),
        _ => None,
    }
}

/// Whether `p` is on a FUSE file system (a dead one, which answers
/// `ENOTCONN`, counts): from `statfs`, which asks the mount itself. Linux
/// by the file system's magic number; macOS by its type name
/// (`f_fstypename`) and source, as [`fuse_fsname`] tells.
pub fn is_fuse_path(p: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        /// `FUSE_SUPER_MAGIC`, as `statfs` gives it for any FUSE mount.
        const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
        match nix::sys::statfs::statfs(p) {
            // f_type's C type differs between architectures.
            #[allow(clippy::unnecessary_cast)]
            Ok(s) => s.filesystem_type().0 as i64 == FUSE_SUPER_MAGIC,
            Err(nix::errno::Errno::ENOTCONN) => true,
            Err(_) => false,
        }
    }
    #[cfg(target_os = "macos")]
    {
        match rustix::fs::statfs(p) {
            Ok(s) => {
                let source = c_bytes(&s.f_mntfromname);
                fuse_fsname(&c_text(&s.f_fstypename), &source).is_some()
            }
            Err(rustix::io::Errno::NOTCONN) => true,
            Err(_) => false,
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = p;
        false
    }
}

/// The mount at `point` (a real path) from `statfs` (macOS, which has no
/// mount table file): `Ok(None)` when `point` is not itself a mount point.
/// Elsewhere, and with the fallbacks forced, `Err(())`: not known here;
/// Linux reads `/proc/self/mountinfo` instead (`sys::mount_at`).
pub(super) fn statfs_mount_at(point: &Path) -> Result<Option<super::Mount>, ()> {
    #[cfg(target_os = "macos")]
    if !fallbacks_forced() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let Ok(s) = rustix::fs::statfs(point) else {
            return Ok(None);
        };
        if c_bytes(&s.f_mntonname) != point.as_os_str().as_bytes() {
            return Ok(None);
        }
        // The device of the mounted root, so that another mount at the
        // same point later is not taken for this one.
        let dev = std::fs::symlink_metadata(point).map_or(0, |m| m.dev());
        return Ok(Some(super::Mount {
            dev: dev.to_string(),
            point: c_bytes(&s.f_mntonname),
            fstype: c_text(&s.f_fstypename),
            source: c_bytes(&s.f_mntfromname),
        }));
    }
    let _ = point;
    Err(())
}

/// The bytes of a NUL-terminated C string field.
#[cfg(target_os = "macos")]
#[allow(clippy::unnecessary_cast)] // c_char is i8 on macOS, u8 elsewhere
fn c_bytes(field: &[libc::c_char]) -> Vec<u8> {
    field
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect()
}

/// [`c_bytes`] as text.
#[cfg(target_os = "macos")]
fn c_text(field: &[libc::c_char]) -> String {
    String::from_utf8_lossy(&c_bytes(field)).into_owned()
}

/// Whether signal `s` is ignored (`SIG_IGN`), as a parent may have set it:
/// read from `/proc/self/status` (Linux; asking `sigaction` needs
/// `unsafe`, which this crate forbids). Elsewhere, and with the fallbacks
/// forced, taken as not ignored: the handler is installed.
pub fn signal_ignored(s: nix::sys::signal::Signal) -> bool {
    if fallbacks_forced() {
        return false;
    }
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (s as u32 - 1)) != 0)
}

/// Permission bits as a [`Mode`]: `mode_t` is 32 bits on Linux and 16 on
/// macOS, and every mode sessionfs sets fits in 12.
#[allow(clippy::unnecessary_cast)] // a no-op on Linux, narrowing on macOS
pub fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate((bits & 0o7777) as libc::mode_t)
}

/// The major and minor numbers of device `dev`, as `/proc/locks` and
/// `/proc/self/mountinfo` spell them (Linux's encoding); macOS packs them
/// as 8 and 24 bits, and has no such tables.
#[allow(clippy::unnecessary_cast)] // (`dev_t` is 64 bits on Linux, 32 on macOS)
pub fn device_numbers(dev: u64) -> (u64, u64) {
    #[cfg(target_os = "linux")]
    {
        (
            nix::sys::stat::major(dev as libc::dev_t),
            nix::sys::stat::minor(dev as libc::dev_t),
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        ((dev >> 24) & 0xff, dev & 0xff_ffff)
    }
}

/// The machine's physical memory (Linux: `_SC_PHYS_PAGES`); `u64::MAX`
/// where it is not asked (macOS would need `sysctl hw.memsize`, which nix
/// does not wrap): the callers' own caps and limits apply.
pub(super) fn physical_memory() -> u64 {
    #[cfg(target_os = "linux")]
    {
        use nix::unistd::{SysconfVar, sysconf};
        match (
            sysconf(SysconfVar::PAGE_SIZE),
            sysconf(SysconfVar::_PHYS_PAGES),
        ) {
            (Ok(Some(a)), Ok(Some(b))) if a > 0 && b > 0 => (a as u64).saturating_mul(b as u64),
            _ => u64::MAX,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_flags_are_decoded_per_kernel() {
        use RenameMode::*;
        // (flags, on Linux, on macOS)
        let table = [
            (0, Some(Replace), Some(Replace)),
            (1, Some(NoReplace), None), // RENAME_NOREPLACE / RENAME_SECLUDE
            (2, Some(Exchange), Some(Exchange)), // RENAME_EXCHANGE / RENAME_SWAP
            (4, None, Some(NoReplace)), // RENAME_WHITEOUT / RENAME_EXCL
            (3, None, None),
            (6, None, None), // RENAME_SWAP | RENAME_EXCL: EINVAL on macOS too
            (8, None, None),
        ];
        for (flags, linux, macos) in table {
            assert_eq!(decode_rename(flags, &LINUX_RENAME), linux, "{flags}");
            assert_eq!(decode_rename(flags, &MACOS_RENAME), macos, "{flags}");
        }
    }

    #[test]
    fn fuse_mounts_are_known_by_type_and_source() {
        type Row = (&'static str, &'static [u8], Option<&'static [u8]>);
        let table: &[Row] = &[
            ("fuse", b"sessionfs:abc", Some(b"sessionfs:abc")),
            ("fuse.sessionfs", b"sessionfs:abc", Some(b"sessionfs:abc")),
            ("fuse.sshfs", b"host:/x", Some(b"host:/x")),
            ("macfuse", b"sessionfs:abc", Some(b"sessionfs:abc")),
            ("osxfuse", b"x", Some(b"x")),
            ("nfs", b"fuse-t:/sessionfs:abc", Some(b"sessionfs:abc")),
            ("smbfs", b"fuse-t:/x", Some(b"x")),
            ("nfs", b"server:/export", None),
            ("apfs", b"/dev/disk3s1", None),
            ("ext4", b"/dev/sda1", None),
            ("fusectl", b"fusectl", None),
        ];
        for &(fstype, source, fsname) in table {
            assert_eq!(fuse_fsname(fstype, source), fsname, "{fstype}");
        }
    }

    #[test]
    fn modes_keep_permission_bits_only() {
        assert_eq!(mode(0o100755), Mode::from_bits_truncate(0o755));
        assert_eq!(mode(0o104700), Mode::from_bits_truncate(0o4700));
    }

    #[test]
    #[cfg(debug_assertions)]
    fn the_switch_is_on_when_the_test_run_asks() {
        // The fallback run of `make test` sets the variable: check that the
        // build it runs reads it, or that run would test the fast paths.
        let asked = std::env::var_os(FORCE_FALLBACKS_VAR).is_some_and(|v| v == "1");
        assert_eq!(fallbacks_forced(), asked);
    }
}
