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
/// (`error`, from its control socket): `not_mounted`, saying so when a
/// sessionfs mount is there all the same, and whose it is when it is
/// another user's (whose daemon's socket is in that user's runtime
/// directory, and answers that user and root only).
pub fn unreachable(mp: &Path, error: &std::io::Error) -> Error {
    let not_mounted =
        |message: String| Error::failed(ErrorKind::NotMounted, ErrorClass::Mount, message, mp);
    if !is_sessionfs_mount(mp) {
        return not_mounted(error.to_string());
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
