//! A mount's processes, apart from the command line that starts them and
//! the FUSE adapter they serve through: the seal a daemon runs for its
//! mount (and an offline seal runs alike), the client that asks a running
//! daemon over its control socket, and the wait for an upper directory's
//! holder. The mounter/daemon split lives here (see docs/pods.md).

pub mod client;
pub mod seal;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::kind::ErrorKind;
use crate::overlay::mount_info::{MountInfo, lock_free, lock_holder};
use crate::packet::error::ErrorClass;

/// What the daemon layer fails with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The overlay refused or failed (a seal's refusal, the upper
    /// directory, the packet).
    #[error(transparent)]
    Overlay(#[from] crate::overlay::Error),
    /// A request that cannot be carried out as asked (an output location
    /// that cannot be written, a configuration the environment lacks).
    #[error("{0}")]
    Usage(String),
    /// A refusal or failure of `kind` and exit-code `class`, about `path`
    /// (named in `message`), with advice of its own when `hint` is set.
    #[error("{message}")]
    Failed {
        /// Stable kind.
        kind: ErrorKind,
        /// Exit-code class.
        class: ErrorClass,
        /// What went wrong, naming the path.
        message: String,
        /// The path concerned.
        path: Option<PathBuf>,
        /// What to do about it, when the kind's advice would not do.
        hint: Option<String>,
    },
}

impl Error {
    /// A [`Error::Failed`] about `path`.
    pub fn failed(kind: ErrorKind, class: ErrorClass, message: String, path: &Path) -> Error {
        Error::Failed {
            kind,
            class,
            message,
            path: Some(path.to_owned()),
            hint: None,
        }
    }

    /// The same error with advice of its own.
    pub fn with_hint(self, hint: String) -> Error {
        match self {
            Error::Failed {
                kind,
                class,
                message,
                path,
                ..
            } => Error::Failed {
                kind,
                class,
                message,
                path,
                hint: Some(hint),
            },
            other => other,
        }
    }
}

/// How long a mount (or an offline seal) waits for the process holding
/// its upper directory's lock when that process serves no mount: a daemon
/// whose mount was taken away (`fusermount3 -u`, `umount`, a pod's
/// teardown) lets the lock go as it exits, some milliseconds later.
/// (docs/CLI.md says 5 s.)
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Waits until nothing holds the lock on upper directory `upper`, for at
/// most [`LOCK_WAIT`]: refuses at once when the holder is a daemon still
/// serving a mount (named with its pid, from `mount.json`), and after the
/// wait when the lock is still held.
pub fn wait_for_upper(upper: &Path) -> Result<(), Error> {
    let start = Instant::now();
    let refuse = |message: String, hint: String| {
        Error::failed(ErrorKind::UpperRefused, ErrorClass::Refused, message, upper).with_hint(hint)
    };
    loop {
        if lock_free(upper) {
            return Ok(());
        }
        let holder = lock_holder(upper);
        let info = MountInfo::load(upper);
        // The daemon mount.json names, if it is the holder (or the holder
        // cannot be told) and its mount is still there.
        let serving = info.and_then(|i| {
            let (mp, pid) = (i.mountpoint?, i.pid?);
            let holds = holder.is_none_or(|h| h == pid) && !crate::sys::exited(pid as i32);
            (holds && crate::sys::is_sessionfs_mount(&mp)).then_some((mp, pid))
        });
        if let Some((mp, pid)) = serving {
            return Err(refuse(
                format!(
                    "{}: in use by the sessionfs mount at {} (daemon pid {pid})",
                    upper.display(),
                    mp.display()
                ),
                format!(
                    "unmount it first (`sessionfs umount {}`), or mount another upper directory",
                    mp.display()
                ),
            ));
        }
        if start.elapsed() >= LOCK_WAIT {
            let who = match holder {
                Some(pid) => format!("process {pid}"),
                None => "another process".to_owned(),
            };
            return Err(refuse(
                format!(
                    "{}: locked by {who}, which serves no mount here, and still after {} s",
                    upper.display(),
                    LOCK_WAIT.as_secs()
                ),
                "an offline `sessionfs seal` of it, or a mount in another mount namespace, holds \
                 it: wait for it to end (or end it), then try again"
                    .to_owned(),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
