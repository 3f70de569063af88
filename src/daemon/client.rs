//! Asking a running mount's daemon, from its mountpoint alone: this
//! user's daemon through this user's runtime directory, or, for root,
//! another user's; and what to say when none answers.

use std::path::Path;
use std::time::Duration;

use super::Error;
use crate::fuse::control;
use crate::kind::ErrorKind;
use crate::packet::error::ErrorClass;
use crate::sys::{is_sessionfs_mount, mount_owner, real_path};

/// `daemon_died` for the sessionfs mount at `mp` when the record its
/// daemon left (in this user's runtime directory, or for root in the mount
/// owner's) names a daemon that is gone.
fn died(mp: &Path) -> Option<Error> {
    let real = real_path(mp)?;
    let mut sockets: Vec<std::path::PathBuf> = control::socket_path(mp).into_iter().collect();
    if nix::unistd::geteuid().is_root()
        && let Some(owner) = mount_owner(&real)
    {
        sockets.extend(control::socket_paths_of(owner, mp).unwrap_or_default());
    }
    let record = sockets
        .iter()
        .filter_map(|s| control::Record::load(s))
        .find(|r| r.mountpoint == real)?;
    if !crate::sys::exited(i32::try_from(record.pid).ok()?) {
        return None;
    }
    let when = |secs: u64| {
        jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX))
            .map_or_else(|_| format!("{secs} s after the epoch"), |t| t.to_string())
    };
    let journal = record.upper.join(crate::overlay::upper::JOURNAL);
    let last = std::fs::metadata(&journal)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or_else(
            || "no change recorded".to_owned(),
            |d| format!("its last change recorded at {}", when(d.as_secs())),
        );
    let message = format!(
        "{}: the sessionfs mount here is dead: its daemon (pid {}, started {}) is gone \
         ({last}, in {}); nothing it acknowledged is lost",
        mp.display(),
        record.pid,
        when(record.started),
        journal.display(),
    );
    Some(
        Error::failed(ErrorKind::DaemonDied, ErrorClass::Mount, message, mp).with_hint(format!(
            "`sessionfs umount --lazy {mp}` detaches the dead mount; mount {packet} again over \
             {upper} to go on from where it stopped (restart the processes that worked in the \
             old mount: docs/pods.md), or `sessionfs seal --packet {packet} --upper {upper} -o …`",
            mp = mp.display(),
            packet = record.packet.display(),
            upper = record.upper.display(),
        )),
    )
}

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

/// The error for mountpoint `mp` when its daemon cannot be reached
/// (`error`, from its control socket): `daemon_not_answering` when it did
/// not answer in time; `not_mounted`, saying so when a sessionfs mount is
/// there all the same; `daemon_died` when the record its daemon left says
/// the daemon is gone (when it started, when it last recorded a change,
/// where its upper directory is); and whose it is when it is another
/// user's (whose daemon's socket is in that user's runtime directory, and
/// answers that user and root only).
pub fn unreachable(mp: &Path, error: &std::io::Error) -> Error {
    let not_mounted =
        |message: String| Error::failed(ErrorKind::NotMounted, ErrorClass::Mount, message, mp);
    if error.kind() == std::io::ErrorKind::TimedOut {
        return Error::failed(
            ErrorKind::DaemonNotAnswering,
            ErrorClass::Mount,
            error.to_string(),
            mp,
        )
        .with_hint(format!(
            "the daemon (see `ps`, and its log in the runtime directory) is stopped or stuck: \
             `sessionfs umount --lazy {}` detaches the mount without it",
            mp.display()
        ));
    }
    if !is_sessionfs_mount(mp) {
        return not_mounted(error.to_string());
    }
    if let Some(dead) = died(mp) {
        return dead;
    }
    let me = nix::unistd::geteuid().as_raw();
    match real_path(mp).and_then(|p| mount_owner(&p)) {
        Some(owner) if owner != me => {
            let name = nix::unistd::User::from_uid(owner.into())
                .ok()
                .flatten()
                .map_or_else(String::new, |u| format!(" ({})", u.name));
            Error::failed(
                ErrorKind::NotOwner,
                ErrorClass::Mount,
                format!(
                    "{}: the sessionfs mount here is uid {owner}'s{name}, not this user's (uid \
                     {me}): only its owner may ask its daemon, whose control socket is in the \
                     owner's runtime directory",
                    mp.display()
                ),
                mp,
            )
            .with_hint(format!(
                "run the command as uid {owner}{name} (as root: `setpriv --reuid={owner} \
                 --regid=GID --init-groups sessionfs …`, or `sudo -u`)"
            ))
        }
        _ => not_mounted(format!(
            "{error}; a sessionfs mount is there all the same, but its daemon has exited \
             (`sessionfs umount` detaches the mount)"
        )),
    }
}
