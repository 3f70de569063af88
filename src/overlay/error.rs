//! Errors of the overlay: what a filesystem operation can fail with (each
//! mapped to exactly one errno by the FUSE adapter's table), and what
//! opening a mount can fail with.

use std::io;

use crate::packet;
use crate::packet::error::{ErrorClass, ErrorKind};

/// An overlay error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such entry.
    #[error("no such file or directory")]
    NotFound,
    /// The name exists.
    #[error("file exists")]
    Exists,
    /// A directory was needed.
    #[error("not a directory")]
    NotDir,
    /// A non-directory was needed.
    #[error("is a directory")]
    IsDir,
    /// The directory has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// A name longer than 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// A name that is not UTF-8: packets (and the journal) hold UTF-8 only.
    #[error("file name is not UTF-8")]
    NotUtf8,
    /// An argument that makes no sense (moving a directory into itself).
    #[error("invalid argument")]
    Invalid,
    /// Not allowed here (the packet root holds only the two parts).
    #[error("operation not permitted")]
    NotPermitted,
    /// Not supported by this filesystem (setting xattrs).
    #[error("operation not supported")]
    NotSupported,
    /// No such attribute.
    #[error("no data")]
    NoData,
    /// Too many links.
    #[error("too many links")]
    TooManyLinks,
    /// Past the largest file a packet can hold.
    #[error("file too large")]
    TooBig,
    /// A secret (`mount --secret`) is read-only: writes, truncates and
    /// metadata changes of it are refused.
    #[error("read-only file system")]
    ReadOnly,
    /// The mount is ending (its daemon was told to stop and seals on the
    /// way out): changes are refused.
    #[error("read-only file system: the mount is ending (its daemon was told to stop)")]
    Ending,
    /// A secret's name cannot be removed, renamed or replaced, as a
    /// mount point's cannot.
    #[error("device or resource busy")]
    Busy,
    /// A secret cannot get another name: it is not the view's file.
    #[error("invalid cross-device link")]
    CrossDevice,
    /// Reading a secret's host file failed.
    #[error("{path}: cannot read the secret's file {host}: {source}")]
    Secret {
        /// The secret's path in the view.
        path: String,
        /// The host file.
        host: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Lower content failed verification.
    #[error("{path}: content at bytes {start}..{end} does not match the packet's manifest")]
    Corrupt {
        /// The lower entry.
        path: String,
        /// Chunk start within the file.
        start: u64,
        /// Chunk end.
        end: u64,
    },
    /// The packet file changed while content verified earlier was read
    /// from it without hashing it again.
    #[error(
        "{packet}: the packet file changed while content was copied from it (it must not be written while in use); try again: content is then verified afresh"
    )]
    PacketChanged {
        /// The packet file.
        packet: String,
    },
    /// An operation on the upper directory failed.
    #[error("{context}: {source}")]
    Upper {
        /// The file or directory on disk, or the entry of the merged view
        /// a seal was reading, when known (also at the start of `context`).
        path: Option<String>,
        /// What and where.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Reading the packet failed.
    #[error("{packet}: cannot read the packet: {source}")]
    PacketIo {
        /// The packet file.
        packet: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The upper directory cannot be used.
    #[error("{path}: {reason}")]
    UpperRefused {
        /// The upper directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// The upper directory belongs to another packet.
    #[error(
        "{path}: this upper directory belongs to packet {upper}, not {packet}; mount it over that packet, or use a new upper directory"
    )]
    UpperMismatch {
        /// The upper directory.
        path: String,
        /// The digest it records.
        upper: String,
        /// The packet being mounted.
        packet: String,
    },
    /// The journal does not apply to this packet (a damaged upper directory).
    #[error("{journal}: record {index} does not apply: {reason}")]
    Replay {
        /// The journal.
        journal: String,
        /// Record number, from 1.
        index: usize,
        /// Why.
        reason: String,
    },
    /// The packet was refused.
    #[error(transparent)]
    Packet(#[from] packet::Error),
    /// A seal wrote its packet, then could not move the mount onto it
    /// (`--rebase`): the packet stands, and what the mount serves is said.
    #[error(
        "{output}: the packet was written ({digest}), but {}: {source}",
        if *.moved {
            "the mount, which now serves it, could not tidy its upper directory"
        } else {
            "the mount could not move onto it and still serves the previous packet with its changes (seal again to move)"
        }
    )]
    Rebase {
        /// The packet written.
        output: String,
        /// Its digest.
        digest: String,
        /// Whether the mount serves the new packet.
        moved: bool,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// A seal refused what the merged view holds (a name a packet cannot
    /// hold, a collision, a credential store): no packet is written.
    #[error("{path}: {reason}")]
    Refused {
        /// Packet path of the entry.
        path: String,
        /// Stable kind (`path_collision`, `invalid_path`, ...).
        kind: ErrorKind,
        /// What is wrong and what to do.
        reason: String,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Maps an OS error of operation `op` on the upper directory, at no
    /// path a user names (a FUSE request's file), to [`Error::Upper`].
    pub fn upper(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Upper {
            path: None,
            context: op.into(),
            source,
        }
    }

    /// An error reading `packet` (the path is formatted only here, off
    /// the read path's success case).
    pub fn packet_io(packet: &packet::reader::Packet, source: io::Error) -> Error {
        Error::PacketIo {
            packet: crate::packet::path::shown_path(packet.path()),
            source,
        }
    }

    /// The store's error inside an I/O error of a remote packet, if that
    /// is what it is.
    pub fn remote_cause(&self) -> Option<&crate::store::Error> {
        match self {
            Error::PacketIo { source, .. } => store_error(source),
            _ => None,
        }
    }

    /// Stable kind, for errors reported by commands.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Packet(e) => e.kind(),
            Error::Rebase { .. } => ErrorKind::RebaseFailed,
            Error::UpperRefused { .. } => ErrorKind::UpperRefused,
            Error::UpperMismatch { .. } => ErrorKind::UpperMismatch,
            Error::Replay { .. } => ErrorKind::UpperDamaged,
            // A remote packet's fetch failed: the store's own kind.
            Error::PacketIo { source, .. } if store_error(source).is_some() => {
                store_error(source).map_or(ErrorKind::Io, |e| e.kind())
            }
            Error::Upper { .. } | Error::PacketIo { .. } | Error::Secret { .. } => ErrorKind::Io,
            Error::Corrupt { .. } => ErrorKind::ContentMismatch,
            Error::PacketChanged { .. } => ErrorKind::PacketChanged,
            Error::Refused { kind, .. } => *kind,
            _ => ErrorKind::Filesystem,
        }
    }

    /// The path the error is about, when there is one: a packet path for
    /// entries, a filesystem path for the upper directory or the packet file.
    pub fn path(&self) -> Option<&str> {
        match self {
            Error::Packet(p) => p.path(),
            Error::Rebase { output, .. } => Some(output),
            Error::Corrupt { path, .. }
            | Error::PacketChanged { packet: path }
            | Error::PacketIo { packet: path, .. }
            | Error::Refused { path, .. }
            | Error::Secret { path, .. }
            | Error::UpperRefused { path, .. }
            | Error::UpperMismatch { path, .. }
            | Error::Replay { journal: path, .. } => Some(path),
            Error::Upper { path, .. } => path.as_deref(),
            _ => None,
        }
    }

    /// Exit-code class, for errors reported by commands.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Packet(e) => e.class(),
            Error::Rebase { .. } => ErrorClass::Io,
            Error::UpperRefused { .. }
            | Error::UpperMismatch { .. }
            | Error::Replay { .. }
            | Error::Refused { .. } => ErrorClass::Refused,
            Error::Corrupt { .. } | Error::PacketChanged { .. } => ErrorClass::Invalid,
            _ => ErrorClass::Io,
        }
    }
}

/// The store's error an I/O error carries (see [`crate::packet::backing::Backing::fill`]).
fn store_error(e: &io::Error) -> Option<&crate::store::Error> {
    e.get_ref()?.downcast_ref::<crate::store::Error>()
}
