//! `sessionfs umount`: unmount a sessionfs mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Output;
use super::error::CliError;
use crate::fuse::control;
use crate::packet::error::ErrorClass;

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
/// sessionfs mount is there all the same (another user's daemon, whose
/// socket is in that user's runtime directory, or one that died).
pub fn unreachable(mp: &Path, error: &std::io::Error) -> CliError {
    let mut message = error.to_string();
    if is_sessionfs_mount(mp) {
        message.push_str(
            "; a sessionfs mount is there all the same: its daemon runs as another user (ask \
             as that user) or has exited (`sessionfs umount` detaches the mount)",
        );
    }
    CliError::new(
        Some(ErrorClass::Mount),
        "not_mounted",
        message,
        Some(crate::packet::path::shown_path(mp)),
    )
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
fn exited(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Whether nothing holds the lock on upper directory `dir` (taken and
/// released at once to find out).
fn lock_free(dir: &Path) -> bool {
    let Ok(d) = std::fs::File::open(dir) else {
        return true;
    };
    nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    // Named through a symlink, the mount is unmounted where it is.
    let real = real_path(&a.mountpoint).unwrap_or_else(|| a.mountpoint.clone());
    let mp = &real;
    let fail = |kind: &str, message: String| {
        CliError::new(
            Some(ErrorClass::Mount),
            kind,
            message,
            Some(crate::packet::path::shown_path(mp)),
        )
    };
    if !is_sessionfs_mount(mp) {
        return Err(fail(
            "not_mounted",
            format!("{}: no sessionfs mount here", mp.display()),
        ));
    }
    let request = serde_json::json!({"op": "unmount", "lazy": a.lazy});
    let via = match control::request(mp, &request, Some(Duration::from_secs(60))) {
        Ok(v) if v["schema"] == "sessionfs.error/1" => return Err(CliError::relayed(v)),
        Ok(v) => {
            // The daemon holds the upper directory's lock until it exits:
            // wait for that, so the same upper directory can be mounted
            // again right away (a lazy unmount exits when files close).
            if let (Some(pid), false) = (
                v["pid"].as_i64().and_then(|p| i32::try_from(p).ok()),
                a.lazy,
            ) {
                let start = Instant::now();
                while !exited(pid) && start.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // A process whose main thread is a zombie may still have
                // threads finishing their exit, holding its files (and the
                // lock): wait for the lock itself.
                if let Some(upper) = v["upper"].as_str() {
                    while !lock_free(Path::new(upper)) && start.elapsed() < Duration::from_secs(30)
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            "daemon"
        }
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
                            "busy"
                        } else {
                            "umount_failed"
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
            "umount_failed",
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
