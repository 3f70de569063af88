//! Running a mount: the FUSE session, signals, and the control socket.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::{Config, MountOption, Session, SessionACL};
use nix::sys::signal::{SigSet, Signal};

use super::control::{self, Reply, Request, SealRequest};
use super::fs::SessionFs;
use crate::overlay::{Overlay, Stale};
use crate::packet::backing::Backing;
use crate::packet::error::ErrorKind;

/// How to serve.
pub struct ServeOptions {
    /// Where: a canonical path (the daemon does not resolve it: a
    /// connection not yet initialised would make it wait on itself).
    pub mountpoint: PathBuf,
    /// Let other users in (`allow_other`).
    pub allow_other: bool,
    /// Dispatch threads.
    pub threads: usize,
    /// How the FUSE connection is had.
    pub connection: Connection,
    /// Who unmounts, when this process may not: a privileged mounter
    /// asked to (`lazy`: detach a busy mount). `None`: this process, with
    /// `umount2`, or `fusermount3` when it is not root.
    pub unmounter: Option<Unmounter>,
    /// Run once, on the first SIGTERM, SIGINT or SIGHUP, before the
    /// unmount: a seal on the way out (`mount --seal-on-term`).
    pub on_term: Option<Box<dyn FnOnce() + Send>>,
}

/// How often a daemon told to stop tries again to unmount a mount that is
/// busy (files open on it, a process working in it).
pub const TERM_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Unmounts this daemon's mount for it (`true`: detach it even if busy).
pub type Unmounter = Box<dyn Fn(bool) -> io::Result<()> + Send + Sync>;

/// How a daemon has its FUSE connection.
pub enum Connection {
    /// It mounts at the mountpoint itself (fuser's `Session::new`: the
    /// mount system call as root, `fusermount3` otherwise).
    Mount,
    /// Another process opened `/dev/fuse` and mounted it at the mountpoint
    /// (`mount PACKET /dev/fd/N`, or a privileged mounter): fuser's
    /// `Session::from_fd` serves it, starting with the kernel's
    /// `FUSE_INIT`, so the connection must be fresh (never served).
    /// Linux only: macOS has no such hand-over (macFUSE mounts itself).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Fd(std::os::fd::OwnedFd),
    /// A privileged mounter is asked to mount as the given file system
    /// name (once the control socket is bound) and hands the connection
    /// over. Linux only, as `Fd`.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Ask(Asker),
}

/// Asks a mounter to mount as the given file system name; the
/// connection's descriptor.
pub type Asker = Box<dyn FnOnce(&str) -> io::Result<std::os::fd::OwnedFd> + Send>;

/// The file system name (mount source) of a mount of the packet of
/// `digest` (`sessionfs:` and the digest's first 12 hex digits): how this
/// daemon knows its mount in the mount table, and how `umount` and
/// `status` know a sessionfs mount.
pub fn fs_name(digest: &crate::packet::digest::Digest) -> String {
    let digest = digest.to_string();
    format!("sessionfs:{}", digest.get(7..19).unwrap_or(&digest))
}

/// The mount options a mounter gives the kernel for a FUSE connection on
/// descriptor `fd` (what fuser gives it when it mounts, and the type
/// `fuse.sessionfs`): pure, so tests read it. Linux's mount(2) options.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn kernel_options(fd: i32, uid: u32, gid: u32, allow_other: bool) -> String {
    let mut o = format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid},default_permissions");
    if allow_other {
        o.push_str(",allow_other");
    }
    o
}

/// What the daemon reports once the mount is ready.
pub struct Ready {
    /// The control socket.
    pub socket: PathBuf,
}

/// Blocks the signals that end a mount (SIGTERM, SIGINT, SIGHUP) in the
/// calling thread, and so in every thread it spawns from then on, and
/// returns them for the thread that waits for them. Call it before any
/// other thread starts (the overlay's setup starts a thread pool): a thread
/// that does not block them would take one and die with the process,
/// leaving the mount behind. Blocking them again is harmless.
pub fn block_signals() -> io::Result<SigSet> {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().map_err(io::Error::from)?;
    Ok(signals)
}

/// Mounts and serves until unmounted (by `sessionfs umount`, a signal, or
/// `fusermount3 -u`). `ready` runs once the kernel has completed the FUSE
/// handshake: the mount is usable from then on. The daemon answers the
/// control requests `status` and `unmount` itself, and `seal` with `seal`.
pub fn serve(
    overlay: Arc<Overlay>,
    opts: ServeOptions,
    ready: impl FnOnce(&Ready),
    seal: impl Fn(&Overlay, &SealRequest, control::Notify) -> Reply + Send + Sync + 'static,
) -> io::Result<()> {
    let signals = block_signals()?;

    let (listener, socket) = control::bind(&opts.mountpoint)?;
    let own_socket = Arc::new(OwnSocket::new(socket.clone()));
    control::Record {
        mountpoint: opts.mountpoint.clone(),
        packet: overlay.lower().packet.path().to_owned(),
        upper: resolved(overlay.upper_dir()),
        pid: std::process::id(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
    .save(&socket);
    let fs_name = fs_name(&overlay.lower().packet.digest);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(fs_name.clone()),
        MountOption::DefaultPermissions,
        MountOption::RW,
        MountOption::NoAtime,
        MountOption::NoSuid,
        MountOption::NoDev,
    ];
    #[cfg(not(target_os = "macos"))]
    config
        .mount_options
        .push(MountOption::Subtype("sessionfs".into()));
    #[cfg(target_os = "macos")]
    config.mount_options.extend(
        macos_options(
            overlay.lower().packet.path(),
            &overlay.lower().packet.digest.to_string(),
        )
        .into_iter()
        .map(MountOption::CUSTOM),
    );
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    if cfg!(target_os = "linux") {
        config.n_threads = Some(opts.threads.max(1));
        // A clone opens /dev/fuse again, which a daemon handed its
        // connection may not be able to (a container without the device):
        // its threads share the one descriptor instead.
        config.clone_fd = match opts.connection {
            Connection::Mount => true,
            // Root can open the device again (a mount it made itself).
            Connection::Ask(_) => nix::unistd::geteuid().is_root(),
            Connection::Fd(_) => false,
        };
    }
    let fs = SessionFs::new(overlay.clone());
    let canonical = opts.mountpoint.clone();
    let acl = config.acl;
    let session = match opts.connection {
        Connection::Mount => Session::new(fs, &opts.mountpoint, &config),
        Connection::Fd(fd) => Session::from_fd(fs, fd, acl, config),
        Connection::Ask(ask) => ask(&fs_name).and_then(|fd| Session::from_fd(fs, fd, acl, config)),
    };
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            own_socket.remove();
            return Err(e);
        }
    };
    let ours = Arc::new(Ours::new(canonical, fs_name, opts.unmounter));
    let notifier = session.notifier();
    overlay.set_invalidator(Box::new(move |stale| {
        let _ = match stale {
            // Attributes only (offset -1): content does not change on a rebase.
            Stale::Attr(ino) => notifier.inval_inode(fuser::INodeNo(ino), -1, 0),
            // Offset 0, length 0: the whole page cache too.
            Stale::Content(ino) => notifier.inval_inode(fuser::INodeNo(ino), 0, 0),
            Stale::Entry(dir, name) => notifier.inval_entry(fuser::INodeNo(dir), name.as_ref()),
        };
    }));

    {
        let (mountpoint, ours) = (opts.mountpoint.clone(), ours.clone());
        let on_term = opts.on_term;
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Ok(sig) = signals.wait() {
                    // A pod being stopped sends SIGTERM, then SIGKILL after
                    // its grace period (docs/pods.md).
                    tracing::warn!(?sig, "ending the mount on signal");
                    if let Some(f) = on_term {
                        f();
                    }
                    end_on_signal(&mountpoint, &ours);
                }
            })?;
    }
    {
        let overlay = overlay.clone();
        let mountpoint = opts.mountpoint.clone();
        let ours = ours.clone();
        let own_socket = own_socket.clone();
        std::thread::Builder::new().name("control".into()).spawn(move || {
            control::serve(listener, move |req, notify| match req {
                Request::Status => Reply::Status(status(&overlay, &mountpoint)),
                // The mount is gone from here once unmounted, but the kernel
                // may keep it alive in another mount namespace that copied
                // it (a sandbox a harness started: bwrap), which this
                // daemon serves until that ends. Its socket goes now, so
                // that a new mount can be made at this mountpoint meanwhile.
                Request::Unmount { lazy } => match unmount(&mountpoint, lazy, &ours)
                    .inspect(|()| own_socket.remove())
                {
                    Ok(()) => Reply::Unmounted {
                        mountpoint: mountpoint.clone(),
                        unmounted: true,
                        pid: std::process::id(),
                        upper: resolved(overlay.upper_dir()),
                    },
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Reply::error(
                        ErrorKind::Busy,
                        &format!(
                            "{}: cannot unmount: files on it are open or a process works in it; close them, or use `sessionfs umount --lazy`",
                            mountpoint.display()
                        ),
                        Some(&mountpoint),
                    ),
                    Err(e) => Reply::error(
                        ErrorKind::Io,
                        &format!("{}: cannot unmount: {e}", mountpoint.display()),
                        Some(&mountpoint),
                    ),
                },
                Request::Seal(r) => seal(&overlay, &r, notify),
            })
        })?;
    }
    ready(&Ready {
        socket: socket.clone(),
    });
    // Served on fuser's threads until the kernel ends the session (the
    // mount is gone, or detached and its last file closed). Not joined:
    // joining drops fuser's handle on the mount, which unmounts the
    // mountpoint's path again, and that path then names whatever lies
    // beneath it (a pod's volume). It is forgotten instead; its
    // descriptors close when the process exits, right after.
    let background = session.spawn()?;
    while !background.guard.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::mem::forget(background);
    // Ended with the mount still in place: fuser's loop failed (a thread
    // or a descriptor it could not get). Detach it rather than leave a
    // mount nobody serves.
    let result = if ours.known() && ours.still_mounted() {
        tracing::error!("the FUSE session ended while mounted; detaching the mount");
        let _ = unmount(&opts.mountpoint, true, &ours);
        Err(io::Error::other(
            "the FUSE session ended while still mounted (see the log); the mount was detached",
        ))
    } else {
        Ok(())
    };
    own_socket.remove();
    control::drain(std::time::Duration::from_secs(5));
    // A remote packet's last fetches go into the node's cache (the overlay
    // is not dropped: see `forget` above).
    overlay.lower().packet.backing().finish();
    if let Err(e) = overlay.fsyncdir() {
        tracing::warn!(error = %e, "cannot sync the journal at exit");
    }
    tracing::info!("unmounted");
    result
}

/// Unmounts once nothing holds the mount, serving it meanwhile; never
/// detaches it. A detached mount gives its mountpoint's path back to the
/// directory beneath, where a process still working by path (an agent
/// writing `/workspace/log`) would write outside the session, and leave
/// the mountpoint not empty for the next mount (docs/SEMANTICS.md,
/// "Termination"). A daemon killed meanwhile leaves a dead mount, which
/// fails every request (`ENOTCONN`) and takes no write either.
fn end_on_signal(mountpoint: &Path, ours: &Ours) {
    let mut told = false;
    loop {
        match unmount(mountpoint, false, ours) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if !told {
                    tracing::warn!(
                        "files are open on the mount, or a process works in it: serving until \
                         they are closed, then unmounting (not detaching: a write by path must \
                         not land beneath the mountpoint)"
                    );
                    told = true;
                }
                std::thread::sleep(TERM_RETRY);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot unmount; serving until the mount is taken away, or this daemon is killed");
                return;
            }
        }
    }
}

/// `p` absolute and normalised, as results give paths.
fn resolved(p: &Path) -> PathBuf {
    crate::sys::resolved(p).unwrap_or_else(|| crate::sys::absolute(p))
}

/// The control socket this daemon bound, known by its identity: removed
/// only while the path still names that socket, since a new daemon at the
/// same mountpoint may have bound its own there once this one's mount was
/// gone (see the `unmount` request).
struct OwnSocket {
    path: PathBuf,
    /// Device and inode of the socket file, once bound.
    id: Option<(u64, u64)>,
}

impl OwnSocket {
    fn new(path: PathBuf) -> OwnSocket {
        use std::os::unix::fs::MetadataExt;
        let id = std::fs::symlink_metadata(&path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        OwnSocket { path, id }
    }

    /// Removes the socket file if it is still this daemon's.
    fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        let still = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| Some((m.dev(), m.ino())) == self.id);
        if still {
            let _ = std::fs::remove_file(&self.path);
            // Its record, if still this daemon's.
            if control::Record::load(&self.path).is_some_and(|r| r.pid == std::process::id()) {
                control::Record::remove(&self.path);
            }
        }
    }
}

/// This daemon's mount: the device of the sessionfs mount made at the
/// canonical mountpoint, so that an unmount is only ever aimed at it. Once
/// it is gone (unmounted or detached by anyone), the path names whatever
/// lies beneath, such as a pod's volume, which must be left alone.
struct Ours {
    mountpoint: PathBuf,
    /// The mount's source, as mountinfo shows it (`sessionfs:<digest>`).
    source: String,
    /// `major:minor` from mountinfo; `None` where it cannot be read.
    dev: Option<String>,
    /// Who unmounts it, when not this process.
    unmounter: Option<Unmounter>,
}

impl Ours {
    fn new(mountpoint: PathBuf, source: String, unmounter: Option<Unmounter>) -> Ours {
        let dev = sessionfs_mount_at(&mountpoint, &source);
        if dev.is_none() {
            tracing::warn!(mountpoint = %mountpoint.display(), "cannot find this mount in the mount table");
        }
        Ours {
            mountpoint,
            source,
            dev,
            unmounter,
        }
    }

    /// Whether the mount's device is known.
    fn known(&self) -> bool {
        self.dev.is_some()
    }

    /// Whether the topmost mount at the mountpoint is still this one
    /// (assumed when its device is unknown).
    fn still_mounted(&self) -> bool {
        self.dev.is_none() || sessionfs_mount_at(&self.mountpoint, &self.source) == self.dev
    }
}

/// The device (`major:minor`) of the topmost mount at `mountpoint` (a
/// canonical path), when it is a FUSE mount of `source`. Read from
/// `/proc/self/mountinfo`, so the mount itself is not touched (a FUSE
/// request to a mount whose daemon is busy could wait); on macOS from
/// `statfs` (`sys::mount_at`).
fn sessionfs_mount_at(mountpoint: &Path, source: &str) -> Option<String> {
    let crate::sys::MountAt::Mount(top) = crate::sys::mount_at(mountpoint) else {
        return None;
    };
    let fsname = crate::sys::fuse_fsname(&top.fstype, &top.source)?;
    (fsname == source.as_bytes()).then_some(top.dev)
}

/// Unmounts now, failing with EBUSY when files are open on the mount, or
/// with `lazy` detaches it (the daemon serves open files until they are
/// closed). Not fuser's unmount: it can run only once per session, and
/// never reports a busy mount.
fn unmount(mountpoint: &Path, lazy: bool, ours: &Ours) -> io::Result<()> {
    if !ours.still_mounted() {
        // Already unmounted or detached: the path is no longer this mount.
        tracing::info!("the mount is already gone; nothing to unmount");
        return Ok(());
    }
    if let Some(unmounter) = &ours.unmounter {
        return unmounter(lazy);
    }
    match crate::sys::platform::unmount(mountpoint, lazy) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) if crate::sys::platform::no_new_privs() => {
            // fusermount3 is set-user-ID root, which no_new_privs
            // disarms: only the process that mounted may unmount.
            Err(io::Error::other(
                "this daemon runs without privileges (no_new_privs) and cannot unmount; the \
                 process that mounted it must (`sessionfs umount` as root, or the mounter)",
            ))
        }
        Err(nix::errno::Errno::EPERM) => {
            // Not root: the setuid helper checks for a busy mount too.
            let out = std::process::Command::new("fusermount3")
                .arg(if lazy { "-uz" } else { "-u" })
                .arg(mountpoint)
                .output()?;
            if out.status.success() {
                Ok(())
            } else if String::from_utf8_lossy(&out.stderr).contains("busy") {
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            } else {
                Err(io::Error::other(
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ))
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The macFUSE options of a mount (docs/macos.md says why each):
/// `volname=` (the name Finder shows: the packet's file name without its
/// extension, or `sessionfs <digest>`), `noappledouble` (macFUSE refuses
/// `._*` and `.DS_Store` on the mount, so Finder's litter never reaches the
/// upper directory), `noapplexattr` (`com.apple.*` attributes refused
/// likewise) and `nobrowse` (not listed in Finder's sidebar, so neither
/// Finder nor Spotlight walks it unasked). Not `local`: macFUSE volumes
/// are then not local, and Spotlight by default indexes none. No
/// `subtype`: the type is `macfuse` whatever it says, and mounts are known
/// by their `fsname`. Pure, so that Linux tests check it.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
fn macos_options(packet: &Path, digest: &str) -> Vec<String> {
    /// Finder shows about this many characters of a volume's name.
    const VOLNAME_MAX: usize = 63;
    let stem = packet.file_stem().map(|s| s.to_string_lossy().into_owned());
    let short = digest.get(7..19).unwrap_or(digest);
    let name = match stem {
        Some(s) if !s.trim().is_empty() => s,
        _ => format!("sessionfs {short}"),
    };
    // Options are split at commas; a slash or control byte has no place
    // in a volume name.
    let name: String = name
        .chars()
        .map(|c| {
            if c == ',' || c == '/' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .take(VOLNAME_MAX)
        .collect();
    vec![
        format!("volname={name}"),
        "noappledouble".into(),
        "noapplexattr".into(),
        "nobrowse".into(),
    ]
}

fn status(o: &Overlay, mountpoint: &Path) -> control::Status {
    let s = &o.stats;
    // Absolute: the asker's working directory need not be the daemon's.
    let abs = crate::sys::absolute;
    control::Status {
        mountpoint: abs(mountpoint),
        packet: match o.lower().packet.backing() {
            Backing::File(_) => resolved(o.lower().packet.path()),
            // A remote location, as shown.
            Backing::Spool(_) => o.lower().packet.path().to_owned(),
        },
        digest: o.lower().packet.digest.to_string(),
        upper: resolved(o.upper_dir()),
        pid: std::process::id(),
        records: o.records(),
        lookups: s.lookups.load(Ordering::Relaxed),
        reads: s.reads.load(Ordering::Relaxed),
        read_bytes: s.read_bytes.load(Ordering::Relaxed),
        writes: s.writes.load(Ordering::Relaxed),
        copy_ups: s.copy_ups.load(Ordering::Relaxed),
        chunks_held: s.chunks_held.load(Ordering::Relaxed),
        verified_bytes: o.verified_bytes(),
        read_inodes: s.read_inodes.lock().clone(),
        remote: o.lower().packet.backing().report().map(Box::new),
        secrets: o
            .secrets()
            .iter()
            .map(|s| control::ShownSecret {
                path: s.path.clone(),
                host: s.host.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macos_volume_names_come_from_the_packet() {
        let digest = "sha256:0123456789abcdef";
        let table = [
            ("/p/session-42.packet", "volname=session-42"),
            ("/p/a,b/c\nd.packet", "volname=c_d"),
            ("/p/a,noexec.tar", "volname=a_noexec"),
            ("/p/.packet", "volname=.packet"),
            ("/", "volname=sessionfs 0123456789ab"),
        ];
        for (packet, want) in table {
            let o = macos_options(Path::new(packet), digest);
            assert_eq!(o[0], want, "{packet}");
            assert_eq!(o[1..], ["noappledouble", "noapplexattr", "nobrowse"]);
        }
        let long = format!("/p/{}.packet", "x".repeat(300));
        assert_eq!(macos_options(Path::new(&long), digest)[0].len(), 8 + 63);
    }

    #[test]
    fn only_a_sessionfs_mount_on_top_is_ours() {
        // The root is mounted, and not by sessionfs.
        assert_eq!(sessionfs_mount_at(Path::new("/"), "sessionfs:0"), None);
        assert_eq!(
            sessionfs_mount_at(Path::new("/no/such"), "sessionfs:0"),
            None
        );
    }
}
