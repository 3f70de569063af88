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
    // The daemon this mount's record names (for one that does not answer).
    let recorded = control::socket_path(mp)
        .ok()
        .and_then(|s| control::Record::load(&s))
        .filter(|r| &r.mountpoint == mp);
    let asked = ask(mp, &request, Some(control::ANSWER_BOUND), &mut |_| {});
    let root = nix::unistd::geteuid().is_root();
    let via = match asked {
        Ok(control::Reply::Unmounted { pid, upper, .. }) => {
            // The daemon holds the upper directory's lock until it exits:
            // wait for that, so the same upper directory can be mounted
            // again right away (a lazy unmount exits when files close).
            if let (Ok(pid), false) = (i32::try_from(pid), a.lazy) {
                let start = Instant::now();
                while !exited(pid) && start.elapsed() < EXIT_BOUND {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // A process whose main thread is a zombie may still have
                // threads finishing their exit, holding its files (and the
                // lock): wait for the lock itself.
                while !lock_free(&upper) && start.elapsed() < EXIT_BOUND {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if !exited(pid) {
                    return Err(still_running(mp, pid as u32, &upper));
                }
            }
            "daemon"
        }
        // A daemon that may not unmount (without privileges, handed its
        // connection) says so: root does it.
        Ok(control::Reply::Error(e))
            if root && e.get("kind").and_then(|k| k.as_str()) != Some("busy") =>
        {
            tracing::warn!(error = ?e, "the daemon did not unmount; unmounting without it");
            unmount_here(mp, a.lazy, &fail)?
        }
        Ok(r) => return Err(super::error::unexpected_reply(r)),
        // The daemon may have unmounted and exited without answering.
        Err(_) if !is_sessionfs_mount(mp) => "daemon",
        Err(e) => {
            tracing::warn!("{e}; unmounting without the daemon");
            let via = unmount_here(mp, a.lazy, &fail)?;
            // A daemon that did not answer and still runs once its mount
            // is gone is stopped or stuck: its upper directory stays
            // locked until it ends.
            if let Some(r) = recorded.filter(|_| !a.lazy) {
                let start = Instant::now();
                while !exited(r.pid as i32) && start.elapsed() < UNANSWERED_EXIT_BOUND {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if wait_gone(mp, EXIT_BOUND) && !exited(r.pid as i32) {
                    return Err(still_running(mp, r.pid, &r.upper));
                }
            }
            via
        }
    };
    if !wait_gone(mp, EXIT_BOUND) {
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

/// How long `umount` waits for a daemon to exit once it has unmounted
/// (docs/CLI.md): it syncs its journal and lets its upper directory's
/// lock go. One still running then serves a copy of the mount in another
/// mount namespace, or is stuck.
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// How long `umount` waits for a daemon that did not answer to exit once
/// its mount is gone without it.
const UNANSWERED_EXIT_BOUND: Duration = Duration::from_secs(2);

/// `umount_failed` for a mount gone from here whose daemon `pid` still
/// runs: `umount` never reports success while it does.
fn still_running(mp: &Path, pid: u32, upper: &Path) -> CliError {
    CliError::new(
        Some(ErrorClass::Mount),
        ErrorKind::UmountFailed,
        format!(
            "{}: the mount is gone from here, but its daemon (pid {pid}) still runs: it serves a \
             copy of the mount in another mount namespace (a sandbox), or it is stopped or \
             stuck; its upper directory {} stays locked until it ends",
            mp.display(),
            upper.display()
        ),
        Some(crate::packet::path::shown_path(mp)),
    )
    .with_hint(format!(
        "end what holds the copy (the sandbox), or the daemon (`kill {pid}`); a mount of the \
         same upper directory waits for it"
    ))
}

/// Unmounts `mp` without its daemon: `fusermount3`, else the system call;
/// the way it went.
fn unmount_here(
    mp: &Path,
    lazy: bool,
    fail: &dyn Fn(ErrorKind, String) -> CliError,
) -> std::result::Result<&'static str, CliError> {
    let flag = if lazy { "-uz" } else { "-u" };
    match std::process::Command::new("fusermount3")
        .arg(flag)
        .arg(mp)
        .stderr(std::process::Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok("fusermount3"),
        _ => {
            crate::sys::platform::unmount(mp, lazy).map_err(|e| {
                let kind = if e == nix::errno::Errno::EBUSY {
                    ErrorKind::Busy
                } else {
                    ErrorKind::UmountFailed
                };
                fail(kind, format!("{}: cannot unmount: {e}", mp.display()))
            })?;
            Ok(crate::sys::platform::UNMOUNT_CALL)
        }
    }
}
