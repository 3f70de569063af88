//! `sessionfs umount`: unmount a sessionfs mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Output;
use super::error::CliError;
use crate::daemon::client::ask;
use crate::fuse::control;
use crate::overlay::mount_info::lock_free;
use crate::packet::error::{ErrorClass, ErrorKind};
use crate::sys::{exited, is_sessionfs_mount, real_path};

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
