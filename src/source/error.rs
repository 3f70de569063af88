//! Errors of reading a real tree into a packet.

use std::io;
use std::path::Path;

use crate::packet;
use crate::packet::error::ErrorClass;

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
        kind: &'static str,
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
                kind: "invalid_path",
                reason: format!("invalid path: {reason}"),
            },
            packet::Error::PathCollision { path, other } => Error::Refused {
                reason: format!(
                    "collides with `{other}` on case-insensitive or normalizing filesystems \
                     (macOS APFS); rename one of them"
                ),
                path,
                kind: "path_collision",
            },
            packet::Error::InvalidTarget { path, reason } => Error::Refused {
                path,
                kind: "invalid_symlink_target",
                reason,
            },
            other => Error::Packet(other),
        }
    }

    /// Stable machine-readable kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotADirectory { .. } => "not_a_directory",
            Error::Refused { kind, .. } => kind,
            Error::Changed { .. } => "changed_while_packing",
            Error::Pattern(_) => "bad_pattern",
            Error::Io { .. } => "io",
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
