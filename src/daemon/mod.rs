//! A mount's processes, apart from the command line that starts them and
//! the FUSE adapter they serve through: the seal a daemon runs for its
//! mount (and an offline seal runs alike), the client that asks a running
//! daemon over its control socket, and the wait for an upper directory's
//! holder. The mounter/daemon split lives here (see docs/pods.md).

pub mod client;
#[cfg(target_os = "linux")]
pub mod mounter;
pub mod seal;

use std::io::{self, Read};
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

/// The longest line a daemon reads from whoever started it (its options,
/// a mounter's channel; a configuration with many secrets and patterns is
/// a few KiB).
pub const MAX_LINE: usize = 1 << 20;

/// Reads one line (without its newline) of at most [`MAX_LINE`] bytes
/// from `r`, a byte at a time, so nothing after it is taken from the
/// channel; `None` at the end of the stream.
pub fn read_line(mut r: impl Read) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match r.read(&mut byte) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if line.len() > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a line of more than {MAX_LINE} bytes on the channel"),
            ));
        }
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
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
