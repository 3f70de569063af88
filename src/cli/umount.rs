//! `sessionfs umount`: unmount a sessionfs mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Output;
use super::error::CliError;
use crate::fuse::control;
use crate::packet::error::{ErrorClass, ErrorKind};

/// Unmount a sessionfs mount: asks its daemon (found from the mountpoint
/// through its control socket) to unmount cleanly, and waits until the
/// mount is gone. Without a daemon to ask, falls back to `fusermount3 -u`.
/// A mount with open files is busy (exit 8) unless `--lazy`.
///
/// Examples:
///   sessionfs umount /workspace
///   sessionfs umount /workspace --lazy   # detach now, even with files open
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The mountpoint.
    mountpoint: PathBuf,
    /// Detach now even if busy; the daemon exits once the last open file
    /// on the mount is closed.
    #[arg(long)]
    lazy: bool,
}

#[derive(Serialize)]
struct Result {
    mountpoint: PathBuf,
    unmounted: bool,
    via: &'static str,
}

/// Whether the topmost mount at `p` is a sessionfs mount (a dead one
/// counts): from the mount table, by its type (`fuse`, or `fuse.sessionfs`
/// through fusermount3) and its source (`sessionfs:<digest>`), so that
/// another FUSE file system (fuse-overlayfs, sshfs) mounted there, or a
/// directory inside a mount, is not taken for one. On macOS from
/// `statfs` (`macfuse`, or FUSE-T's NFS mounts). Where neither can say,
/// any FUSE mount point counts.
pub fn is_sessionfs_mount(p: &Path) -> bool {
    use crate::sys::MountAt;
    let Some(real) = real_path(p) else {
        return crate::sys::is_fuse_path(p);
    };
    match crate::sys::mount_at(&real) {
        MountAt::Unknown => crate::sys::is_fuse_path(&real) && crate::sys::is_mount_point(&real),
        MountAt::Nothing => false,
        MountAt::Mount(m) => crate::sys::fuse_fsname(&m.fstype, &m.source)
            .is_some_and(|name| name.starts_with(b"sessionfs:")),
    }
}

/// The error for mountpoint `mp` when its daemon cannot be reached
/// (`error`, from its control socket): `not_mounted`, saying so when a
/// sessionfs mount is there all the same, and whose it is when it is
/// another user's (whose daemon's socket is in that user's runtime
/// directory, and answers that user and root only).
pub fn unreachable(mp: &Path, error: &std::io::Error) -> CliError {
    let at = Some(crate::packet::path::shown_path(mp));
    if !is_sessionfs_mount(mp) {
        return CliError::new(
            Some(ErrorClass::Mount),
            ErrorKind::NotMounted,
            error.to_string(),
            at,
        );
    }
    let me = nix::unistd::geteuid().as_raw();
    match real_path(mp).and_then(|p| mount_owner(&p)) {
        Some(owner) if owner != me => {
            let name = nix::unistd::User::from_uid(owner.into())
                .ok()
                .flatten()
                .map_or_else(String::new, |u| format!(" ({})", u.name));
            CliError::new(
                Some(ErrorClass::Mount),
                ErrorKind::NotOwner,
                format!(
                    "{}: the sessionfs mount here is uid {owner}'s{name}, not this user's (uid \
                     {me}): only its owner may ask its daemon, whose control socket is in the \
                     owner's runtime directory",
                    mp.display()
                ),
                at,
            )
            .with_hint(format!(
                "run the command as uid {owner}{name} (as root: `setpriv --reuid={owner} \
                 --regid=GID --init-groups sessionfs …`, or `sudo -u`)"
            ))
        }
        _ => CliError::new(
            Some(ErrorClass::Mount),
            ErrorKind::NotMounted,
            format!(
                "{error}; a sessionfs mount is there all the same, but its daemon has exited \
                 (`sessionfs umount` detaches the mount)"
            ),
            at,
        ),
    }
}

/// The user a FUSE mount at `real` (a real path) belongs to: its
/// `user_id=` in `/proc/self/mountinfo` (the topmost mount there).
/// Sends `req` to the daemon of the mount at `mp`: this user's, or, for
/// root, another user's (whose socket is in that user's runtime
/// directory: the daemon answers its owner and root).
pub fn ask(
    mp: &Path,
    req: &control::Request,
    timeout: Option<Duration>,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<control::Reply> {
    let mine = control::request_with_progress(mp, req, timeout, progress);
    let Err(e) = mine else { return mine };
    if !nix::unistd::geteuid().is_root() {
        return Err(e);
    }
    let Some(owner) = real_path(mp)
        .and_then(|p| mount_owner(&p))
        .filter(|&o| o != 0)
    else {
        return Err(e);
    };
    for path in control::socket_paths_of(owner, mp).unwrap_or_default() {
        if std::fs::symlink_metadata(&path).is_ok() {
            tracing::debug!(socket = %path.display(), owner, "asking another user's daemon, as root");
            return control::request_at(&path, mp, req, timeout, progress);
        }
    }
    Err(e)
}

fn mount_owner(real: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    // Mountinfo writes a space, tab, newline and backslash in a path as
    // an octal escape: the path is escaped the same way to compare.
    let mut point = String::new();
    for &b in real.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => point.push_str(&format!("\\{b:03o}")),
            _ => point.push(char::from(b)),
        }
    }
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    owner_in(&String::from_utf8_lossy(&info), &point)
}

/// [`mount_owner`] in `info`, the text of a mountinfo, for the escaped
/// mount point `point` (compared as bytes; a path that is not UTF-8
/// matches nothing, and has no owner named).
fn owner_in(info: &str, point: &str) -> Option<u32> {
    info.lines().rev().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        if fields.split(' ').nth(4)? != point {
            return None;
        }
        let options = rest.split(' ').nth(2)?;
        options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    })
}

/// The real path of `p`, as the mount table has it, without touching a
/// dead mount (its stat fails): resolved whole, or through its parent.
fn real_path(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok().or_else(|| {
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
    })
}

fn wait_gone(p: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !is_sessionfs_mount(p) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !is_sessionfs_mount(p)
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

/// Whether nothing holds the lock on upper directory `dir` (taken and
/// released at once to find out; a directory that cannot be opened, or is
/// absent, holds none).
pub fn lock_free(dir: &Path) -> bool {
    let Ok(d) = std::fs::File::open(dir) else {
        return true;
    };
    nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
}

/// The process holding the `flock` on directory `dir`, from
/// `/proc/locks` (`None` where it cannot be read or names none).
pub fn lock_holder(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let (major, minor) = crate::sys::platform::device_numbers(m.dev());
    holder_in(&locks, major, minor, m.ino())
}

/// The pid of the granted `FLOCK` on inode `ino` of device `major:minor`
/// in `locks`, the text of `/proc/locks`: lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF` (device numbers in
/// hex; a waiter's line has `->` after the number).
fn holder_in(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [_, "FLOCK", _, _, pid, id, ..] if *id == want => pid.parse().ok(),
            _ => None,
        }
    })
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    // Named through a symlink, the mount is unmounted where it is.
    let real = real_path(&a.mountpoint).unwrap_or_else(|| a.mountpoint.clone());
    let mp = &real;
    let fail = |kind: ErrorKind, message: String| {
        CliError::new(
            Some(ErrorClass::Mount),
            kind,
            message,
            Some(crate::packet::path::shown_path(mp)),
        )
    };
    if !is_sessionfs_mount(mp) {
        return Err(fail(
            ErrorKind::NotMounted,
            format!("{}: no sessionfs mount here", mp.display()),
        ));
    }
    let request = control::Request::Unmount { lazy: a.lazy };
    let via = match ask(mp, &request, Some(Duration::from_secs(60)), &mut |_| {}) {
        Ok(control::Reply::Unmounted { pid, upper, .. }) => {
            // The daemon holds the upper directory's lock until it exits:
            // wait for that, so the same upper directory can be mounted
            // again right away (a lazy unmount exits when files close).
            if let (Ok(pid), false) = (i32::try_from(pid), a.lazy) {
                let start = Instant::now();
                while !exited(pid) && start.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // A process whose main thread is a zombie may still have
                // threads finishing their exit, holding its files (and the
                // lock): wait for the lock itself.
                while !lock_free(&upper) && start.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            "daemon"
        }
        Ok(r) => return Err(super::error::unexpected_reply(r)),
        // The daemon may have unmounted and exited without answering.
        Err(_) if !is_sessionfs_mount(mp) => "daemon",
        Err(e) => {
            tracing::warn!("{e}; unmounting without the daemon");
            let flag = if a.lazy { "-uz" } else { "-u" };
            match std::process::Command::new("fusermount3")
                .arg(flag)
                .arg(mp)
                .status()
            {
                Ok(s) if s.success() => "fusermount3",
                _ => {
                    crate::sys::platform::unmount(mp, a.lazy).map_err(|e| {
                        let kind = if e == nix::errno::Errno::EBUSY {
                            ErrorKind::Busy
                        } else {
                            ErrorKind::UmountFailed
                        };
                        fail(kind, format!("{}: cannot unmount: {e}", mp.display()))
                    })?;
                    crate::sys::platform::UNMOUNT_CALL
                }
            }
        }
    };
    if !wait_gone(mp, Duration::from_secs(30)) {
        return Err(fail(
            ErrorKind::UmountFailed,
            format!("{}: still mounted after the unmount request", mp.display()),
        ));
    }
    Ok(Output::new(
        "sessionfs.umount-result/1",
        Result {
            // Resolved, as mount, status and seal give it.
            mountpoint: real.clone(),
            unmounted: true,
            via,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::{holder_in, owner_in};

    #[test]
    fn the_owner_of_a_fuse_mount_is_its_user_id_in_mountinfo() {
        let info = "36 25 0:32 / /mnt/a\\040b rw,nosuid - fuse.sessionfs sessionfs:ab rw,user_id=1000,group_id=1000\n\
                    37 25 0:33 / /mnt/c rw - fuse sessionfs:cd rw,user_id=0,group_id=0\n\
                    38 25 0:34 / /mnt/c rw - fuse sessionfs:ef rw,user_id=7,group_id=7\n";
        assert_eq!(owner_in(info, "/mnt/a\\040b"), Some(1000));
        assert_eq!(owner_in(info, "/mnt/c"), Some(7), "the topmost mount");
        assert_eq!(owner_in(info, "/mnt"), None);
    }

    #[test]
    fn the_lock_holder_is_read_from_the_granted_flock_on_that_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 08:01:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 99 00:2d:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 5 00:2d:12345 0 EOF\n";
        assert_eq!(holder_in(locks, 0, 0x2d, 1234), Some(4242));
        assert_eq!(holder_in(locks, 0, 0x2d, 12345), Some(5));
        assert_eq!(holder_in(locks, 8, 1, 77), None, "a POSIX lock is not ours");
        assert_eq!(holder_in(locks, 0, 0x2e, 1234), None);
        assert_eq!(holder_in("", 0, 0x2d, 1234), None);
    }
}
