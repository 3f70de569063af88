//! The `fuser::Filesystem` adapter: for each request, a span, a call into
//! the overlay, a conversion, a reply. Failures are logged once, here.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::errno::errno;
use crate::overlay::{Attr, Caller, Error, Kind, Overlay, SetAttr, SetTime};

/// How long the kernel may cache entries and attributes. Every change goes
/// through this daemon and the kernel updates or invalidates what the
/// operations it forwards touch, so long timeouts are safe; the daemon
/// notifies the kernel of changes it makes on its own.
pub const TTL: Duration = Duration::from_secs(3600);

/// Largest read and write the kernel sends in one request.
const MAX_IO: u32 = 1 << 20;

/// Entries fetched per readdir request; more than a reply buffer holds.
const READDIR_BATCH: usize = 512;

/// The filesystem served over FUSE.
pub struct SessionFs {
    overlay: Arc<Overlay>,
    /// The kernel opens files without asking (`FUSE_NO_OPEN_SUPPORT`).
    zero_message_open: bool,
    /// The kernel opens directories without asking
    /// (`FUSE_NO_OPENDIR_SUPPORT`).
    zero_message_opendir: bool,
}

/// The timeout for a secret (`mount --secret`): none, since its host
/// file changes without telling the daemon (a rotated Secret), and the
/// kernel drops its cached pages when it sees new attributes
/// (`FUSE_AUTO_INVAL_DATA`).
const SECRET_TTL: Duration = Duration::ZERO;

impl SessionFs {
    /// How long the kernel may cache `ino`'s entry and attributes.
    fn ttl(&self, ino: u64) -> &'static Duration {
        if self.overlay.is_secret(ino) {
            &SECRET_TTL
        } else {
            &TTL
        }
    }

    /// Wraps an overlay.
    pub fn new(overlay: Arc<Overlay>) -> SessionFs {
        SessionFs {
            overlay,
            zero_message_open: false,
            zero_message_opendir: false,
        }
    }
}

thread_local! {
    /// Read buffer reused across requests on each dispatch thread.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        // The birth time macOS shows as "Created" (Linux ignores it): the
        // mtime, not the ctime, which for a lower file is a content stamp
        // decades back (docs/SEMANTICS.md, "Times").
        crtime: system_time(a.mtime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's 32-bit device encoding, passed through as received.
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// The attributes of a negative entry: only the inode number (0) counts.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => SetTime::At(kernel_nanos(st)),
    }
}

/// The time the kernel sent, in nanoseconds since the epoch, clamped to
/// what the mount holds (an `i64` of nanoseconds: 1677-09-21 to
/// 2262-04-11, docs/SEMANTICS.md "Times").
///
/// fuser 0.18 builds a time before the epoch from the kernel's
/// `(sec < 0, nsec)` as `UNIX_EPOCH - (-sec s + nsec ns)` instead of
/// `UNIX_EPOCH - (-sec s - nsec ns)` (its `system_time_from_time`, marked
/// "TODO: 1_000_000_000 - nsec"), so `1969-12-31 23:59:59.25` arrives as
/// 1.25 s before the epoch. Its mapping is one to one, so this undoes it:
/// whole seconds back, nanoseconds forward. (Tested through a real mount
/// in tests/stat_times.rs, which fails if fuser changes.)
fn kernel_nanos(st: SystemTime) -> i64 {
    const NS: i128 = 1_000_000_000;
    let ns: i128 = match st.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => {
            let d = e.duration();
            -(d.as_secs() as i128) * NS + d.subsec_nanos() as i128
        }
    };
    ns.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Logs a failed request once: routine "no such entry" at debug, the rest
/// at warn (corruption at error, in the overlay).
fn failed(op: &'static str, ino: u64, e: &Error) -> Errno {
    let code = errno(e);
    match e {
        Error::NotFound | Error::Exists | Error::NotEmpty | Error::NoData => {
            tracing::debug!(op, ino, errno = code.code(), "{e}")
        }
        Error::Upper { .. }
        | Error::PacketIo { .. }
        | Error::Corrupt { .. }
        | Error::PacketChanged { .. } => {
            tracing::warn!(op, ino, errno = code.code(), "{e}")
        }
        _ => tracing::debug!(op, ino, errno = code.code(), "{e}"),
    }
    code
}

fn entry(reply: ReplyEntry, r: Result<Attr, Error>, op: &'static str, ino: u64) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(a.generation)),
        Err(e) => reply.error(failed(op, ino, &e)),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Error>, op: &'static str, ino: u64) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(failed(op, ino, &e)),
    }
}

impl Filesystem for SessionFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_ATOMIC_O_TRUNC: with it the kernel sends O_TRUNC in OPEN,
        // and the daemon truncates before the kernel's ETXTBSY check, which
        // then fails the open of a running executable with its content
        // already gone. Without it the kernel checks first and truncates
        // with SETATTR.
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_AUTO_INVAL_DATA;
        let have = config.capabilities();
        // Linux's zero-message opens; macFUSE has neither, and the tests
        // run without them when the portable fallbacks are forced.
        let fast = !crate::sys::fallbacks_forced();
        self.zero_message_open = fast && have.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        self.zero_message_opendir = fast && have.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        let _ = config.add_capabilities(wanted & have);
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _s = tracing::trace_span!("lookup", parent = parent.0).entered();
        match self.overlay.lookup(parent.0, name.as_bytes()) {
            // A name that does not exist is answered as an entry with
            // inode 0: the kernel then caches the absence (a negative
            // dentry) for the TTL instead of asking again. Tools probe
            // for absent names all the time (`git status` looks for
            // `.gitignore` and `.git` in every directory: 4,947 lookups
            // per run on S, every run). Safe because every change to
            // the tree goes through this kernel mount, which turns the
            // negative dentry positive itself.
            Err(Error::NotFound) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Ok(a) => reply.entry(self.ttl(a.ino), &file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(failed("lookup", parent.0, &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.overlay.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.overlay.getattr(ino.0) {
            Ok(a) => reply.attr(self.ttl(a.ino), &file_attr(&a)),
            Err(e) => reply.error(failed("getattr", ino.0, &e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let req = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        match self.overlay.setattr(ino.0, req) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(failed("setattr", ino.0, &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.overlay.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(failed("readlink", ino.0, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.overlay.mknod(
            parent.0,
            name.as_bytes(),
            mode,
            u64::from(rdev),
            caller(req),
        );
        entry(reply, r, "mknod", parent.0);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self
            .overlay
            .mkdir(parent.0, name.as_bytes(), mode, caller(req));
        entry(reply, r, "mkdir", parent.0);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.overlay.unlink(parent.0, name.as_bytes()),
            "unlink",
            parent.0,
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.overlay.rmdir(parent.0, name.as_bytes()),
            "rmdir",
            parent.0,
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.overlay.symlink(
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            caller(req),
        );
        entry(reply, r, "symlink", parent.0);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        use crate::sys::platform::{RenameMode, rename_mode};
        // Whiteouts, RENAME_SECLUDE and unknown flags: EINVAL.
        let Some(mode) = rename_mode(flags.bits()) else {
            return reply.error(failed("rename", parent.0, &Error::Invalid));
        };
        let r = self.overlay.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            mode == RenameMode::NoReplace,
            mode == RenameMode::Exchange,
        );
        empty(reply, r, "rename", parent.0);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.overlay.link(ino.0, newparent.0, newname.as_bytes()),
            "link",
            ino.0,
        );
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Open files need no state here: reads and writes name the inode,
        // and a file unlinked while open stays alive through the kernel's
        // reference to its inode, counted like any lookup until `FORGET`.
        // So the first open is answered ENOSYS: the kernel then opens
        // files without asking (a zero-message open, keeping its page
        // cache: FOPEN_KEEP_CACHE is its default then) and sends no
        // `RELEASE` either. Two round trips fewer per file: warm `grep -r`
        // of 20,000 files 0.88 s -> 0.17 s, native 0.17 s. A kernel
        // without that support gets a reply carrying no handle. Lower
        // content never changes and upper content changes only through
        // this mount, so the kernel's page cache stays valid either way.
        if self.zero_message_open {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            match self.overlay.read(ino.0, offset, size, &mut buf) {
                Ok(()) => reply.data(&buf),
                Err(e) => reply.error(failed("read", ino.0, &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.overlay.write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(failed("write", ino.0, &e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do at close: writes reach the upper file as they are
        // made, and locks are the kernel's. ENOSYS tells the kernel so, and
        // it stops sending FLUSH (a synchronous round trip on every close).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Only for files made by CREATE before the first open (see `open`).
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.overlay.fsync(ino.0, datasync), "fsync", ino.0);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Zero-message opendir: the kernel then opens directories without
        // asking, with FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, so listings stay
        // in its cache (it drops a directory's cache when a change through
        // this mount bumps its version; nothing else changes a directory),
        // and no releasedir follows. A kernel without that support (macFUSE)
        // gets a reply carrying no handle and the same cache flags.
        if self.zero_message_opendir {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            );
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.overlay.readdir(ino.0, offset, READDIR_BATCH) {
            Ok(e) => e,
            Err(e) => return reply.error(failed("readdir", ino.0, &e)),
        };
        for e in &entries {
            if reply.add(INodeNo(e.ino), e.offset, file_type(e.kind), &*e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.overlay.readdir(ino.0, offset, READDIR_BATCH) {
            Ok(e) => e,
            Err(e) => return reply.error(failed("readdirplus", ino.0, &e)),
        };
        for e in &entries {
            let dot = &*e.name == "." || &*e.name == "..";
            let Ok(a) = self.overlay.entry_attr(e.ino, !dot) else {
                continue; // removed since the listing was taken
            };
            if reply.add(
                INodeNo(e.ino),
                e.offset,
                &*e.name,
                self.ttl(e.ino),
                &file_attr(&a),
                Generation(a.generation),
            ) {
                if !dot {
                    self.overlay.forget(e.ino, 1); // not sent after all
                }
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.overlay.fsyncdir(), "fsyncdir", ino.0);
    }

    // The statvfs field types differ between platforms: the casts are for macOS.
    #[allow(clippy::unnecessary_cast)]
    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.overlay.statfs() {
            Ok(s) => reply.statfs(
                s.blocks() as u64,
                s.blocks_free() as u64,
                s.blocks_available() as u64,
                s.files() as u64,
                s.files_free() as u64,
                s.block_size() as u32,
                crate::packet::format::MAX_COMPONENT_BYTES as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(failed("statfs", ino.0, &e)),
        }
    }

    // Extended attributes: packets hold none, so the mount stores none.
    // ENOSYS makes the kernel remember that and answer EOPNOTSUPP itself
    // from then on, instead of asking on every `ls -l` (ACL probes).
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // `default_permissions`: the kernel checks modes itself.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .overlay
            .create(parent.0, name.as_bytes(), mode, caller(req))
        {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(a.generation),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(failed("create", parent.0, &e)),
        }
    }

    /// No ioctl is supported: `ENOTTY`, as a file that is not a terminal
    /// answers `isatty` (`TCGETS`, which every Python `open` asks), and
    /// without fuser's default warning, which logged three lines per call.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            self.overlay.fallocate(ino.0, offset, length, mode),
            "fallocate",
            ino.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_times_keep_their_sign_and_clamp_at_the_ends() {
        let before = |s: u64, n: u32| UNIX_EPOCH - Duration::new(s, n);
        let after = |s: u64, n: u32| UNIX_EPOCH + Duration::new(s, n);
        // As fuser 0.18 builds them from the kernel's (sec, nsec).
        for (st, ns) in [
            (after(0, 0), 0),
            (after(1, 250_000_000), 1_250_000_000),
            // (-1 s, 0.25 s): 1969-12-31 23:59:59.25.
            (before(1, 250_000_000), -750_000_000),
            // (-2 s, 0.75 s).
            (before(2, 750_000_000), -1_250_000_000),
            (before(1, 0), -1_000_000_000),
            // 2^40 s: past what an i64 of nanoseconds holds.
            (after(1 << 40, 0), i64::MAX),
            (before(1 << 40, 0), i64::MIN),
        ] {
            assert_eq!(kernel_nanos(st), ns, "{st:?}");
        }
    }
}
