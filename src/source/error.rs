//! Errors of reading a real tree into a packet.

use std::io;
use std::path::Path;

use crate::packet;
use crate::packet::error::{ErrorClass, ErrorKind};

/// A pack-side error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A part root is not a directory.
    #[error("{path}: not a directory")]
    NotADirectory {
        /// The root given.
        path: String,
    },

    /// The input holds something a packet must not (a name that is not
    /// UTF-8, an external symlink under `--reject-external-symlinks`, a
    /// credential store, a path collision).
    #[error("{path}: {reason}")]
    Refused {
        /// Packet path of the offending entry.
        path: String,
        /// Stable kind, e.g. `non_utf8_name`, `external_symlink`.
        kind: ErrorKind,
        /// What is wrong and what to do.
        reason: String,
    },

    /// A file changed between the walk and the read.
    #[error("{path}: {what} while it was being packed; pack again once the tree is quiet")]
    Changed {
        /// Packet path.
        path: String,
        /// What changed.
        what: &'static str,
    },

    /// A bad `--exclude` or `--keep` pattern.
    #[error("{0}")]
    Pattern(String),

    /// The operating system refused an operation.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The path on disk.
        path: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The packet layer refused (limits, validation) or failed.
    #[error(transparent)]
    Packet(#[from] packet::Error),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: &Path, op: &'static str, source: io::Error) -> Error {
        Error::Io {
            path: crate::packet::path::shown_path(path),
            op,
            source,
        }
    }

    /// Turns a validation refusal of entries built from the tree into a
    /// refusal of the input (exit code of refused input, not of a bad packet).
    pub fn from_validation(e: packet::Error) -> Error {
        match e {
            packet::Error::InvalidPath { path, reason } => Error::Refused {
                path,
                kind: crate::packet::error::ErrorKind::InvalidPath,
                reason: format!("invalid path: {reason}"),
            },
            packet::Error::PathCollision { path, other } => Error::Refused {
                reason: format!(
                    "collides with `{other}` on case-insensitive or normalizing filesystems \
                     (macOS APFS); rename one of them"
                ),
                path,
                kind: crate::packet::error::ErrorKind::PathCollision,
            },
            packet::Error::InvalidTarget { path, reason } => Error::Refused {
                path,
                kind: crate::packet::error::ErrorKind::InvalidSymlinkTarget,
                reason,
            },
            other => Error::Packet(other),
        }
    }

    /// Stable machine-readable kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotADirectory { .. } => ErrorKind::NotADirectory,
            Error::Refused { kind, .. } => *kind,
            Error::Changed { .. } => ErrorKind::ChangedWhilePacking,
            Error::Pattern(_) => ErrorKind::BadPattern,
            Error::Io { .. } => ErrorKind::Io,
            Error::Packet(e) => e.kind(),
        }
    }

    /// Class for the exit code; `None` means a usage error.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            Error::NotADirectory { .. } | Error::Io { .. } | Error::Changed { .. } => {
                Some(ErrorClass::Io)
            }
            Error::Refused { .. } => Some(ErrorClass::Refused),
            Error::Pattern(_) => None,
            Error::Packet(e) => Some(e.class()),
        }
    }

    /// The path the error is about.
    pub fn path(&self) -> Option<&str> {
        match self {
            Error::NotADirectory { path }
            | Error::Refused { path, .. }
            | Error::Changed { path, .. }
            | Error::Io { path, .. } => Some(path),
            Error::Pattern(_) => None,
            Error::Packet(e) => e.path(),
        }
    }
}
