//! Errors of the packet layer: one variant per way a packet can be refused.
//!
//! Every variant names what it refuses (an entry path, a byte offset, a digest)
//! and has a stable [`Error::kind`] string that the CLI prints in
//! `sessionfs.error/1` objects and that tests match on.

use std::io;

pub use crate::kind::ErrorKind;

/// What the CLI turns into an exit code. Higher layers classify their own
/// errors into the same classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The packet is malformed, tampered with, or not the one asked for.
    Invalid,
    /// The packet is of a schema version this build does not support.
    Unsupported,
    /// A configured limit was exceeded.
    Limit,
    /// The operating system refused an operation (missing file, permission,
    /// disk full).
    Io,
    /// The input holds something a packet must not hold (pack and seal):
    /// a name that is not UTF-8, a path collision, an external symlink under
    /// `--reject-external-symlinks`, a credential store.
    Refused,
    /// A mount could not be made or reached: FUSE unavailable, mountpoint
    /// unusable, no daemon serving it.
    Mount,
    /// A remote packet could not be read: the store's configuration, the
    /// object missing or replaced, access denied, the server unavailable.
    Remote,
}

/// A packet-layer error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on the packet file failed.
    #[error("{context}: {source}")]
    Io {
        /// The file or directory on disk, when the caller knows it (also
        /// at the start of `context`).
        file: Option<String>,
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Reading a remote packet failed (see [`crate::store::Error`]).
    #[error(transparent)]
    Store(#[from] crate::store::Error),

    /// The file is not a tar archive shaped like a packet at all.
    #[error("not a session packet: {reason}")]
    NotAPacket {
        /// Why not.
        reason: String,
    },

    /// The first member is not `packet.json`.
    #[error("the first member is `{found}`, not the manifest `packet.json`")]
    ManifestMissing {
        /// The name found instead.
        found: String,
    },

    /// The manifest is not well-formed JSON.
    #[error("packet.json byte {offset}: {reason}")]
    ManifestSyntax {
        /// Byte offset inside packet.json.
        offset: usize,
        /// What was wrong.
        reason: String,
    },

    /// The manifest is JSON but not in the one canonical encoding.
    #[error("packet.json byte {offset}: not canonical: {reason}")]
    ManifestNotCanonical {
        /// Byte offset inside packet.json.
        offset: usize,
        /// What was wrong.
        reason: String,
    },

    /// An object has a key the schema does not define.
    #[error("packet.json byte {offset}: unknown field `{field}`")]
    ManifestUnknownField {
        /// Byte offset inside packet.json.
        offset: usize,
        /// The key.
        field: String,
    },

    /// A field is `null` (optional fields are left out instead).
    #[error("packet.json byte {offset}: field `{field}` is null; optional fields must be left out")]
    ManifestNullField {
        /// Byte offset inside packet.json.
        offset: usize,
        /// The key.
        field: String,
    },

    /// A required field is absent.
    #[error("packet.json byte {offset}: missing field `{field}`")]
    ManifestMissingField {
        /// Byte offset inside packet.json.
        offset: usize,
        /// The key.
        field: String,
    },

    /// A field has a value of the wrong type or out of range.
    #[error("packet.json byte {offset}: field `{field}`: {reason}")]
    ManifestBadValue {
        /// Byte offset inside packet.json.
        offset: usize,
        /// The key.
        field: String,
        /// What was wrong.
        reason: String,
    },

    /// The manifest's schema is not one this build reads.
    #[error(
        "packet schema `{found}` is not supported: this sessionfs reads {supported}; {}",
        schema_advice(found)
    )]
    UnsupportedSchema {
        /// The schema string found.
        found: String,
        /// The schema this build supports.
        supported: &'static str,
    },

    /// An entry path breaks the path rules.
    #[error("{path}: invalid path: {reason}")]
    InvalidPath {
        /// The path (lossy if it was not UTF-8).
        path: String,
        /// Which rule.
        reason: String,
    },

    /// Entries are not in ascending raw-byte order.
    #[error("{path}: entries are not sorted by path bytes (it follows `{previous}`)")]
    NotSorted {
        /// The entry out of order.
        path: String,
        /// The entry before it.
        previous: String,
    },

    /// Two entries have the same path.
    #[error("{path}: duplicate entry")]
    DuplicatePath {
        /// The path.
        path: String,
    },

    /// Two paths differ only by letter case or Unicode normalization, so they
    /// would collide on a case-insensitive or normalizing filesystem (APFS).
    #[error(
        "{path}: collides with `{other}` on case-insensitive or normalizing filesystems \
         (macOS APFS); rename one of them"
    )]
    PathCollision {
        /// The later path.
        path: String,
        /// The earlier path it collides with.
        other: String,
    },

    /// An entry's parent is missing, or is a file or a symlink.
    #[error("{path}: {reason}")]
    BadParent {
        /// The entry.
        path: String,
        /// Why its parent is unacceptable.
        reason: String,
    },

    /// A symlink target is empty, too long, or contains NUL.
    #[error("{path}: invalid symlink target: {reason}")]
    InvalidTarget {
        /// The symlink.
        path: String,
        /// What was wrong.
        reason: String,
    },

    /// In strict-symlink mode: a symlink resolves outside the packet root.
    #[error("{path}: symlink target `{target}` escapes the packet root")]
    SymlinkEscapes {
        /// The symlink.
        path: String,
        /// Its target.
        target: String,
    },

    /// In strict-symlink mode: resolving the symlinks takes more steps than
    /// the check allows (see [`crate::packet::resolve`]).
    #[error(
        "{path}: resolving the packet's symlinks takes more steps than the strict check allows ({steps}): they chain long targets"
    )]
    SymlinkBudget {
        /// The symlink being resolved when the budget ran out.
        path: String,
        /// The budget.
        steps: String,
    },

    /// The manifest names a harness kind without a harness part, or the reverse.
    #[error("{reason}")]
    HarnessMismatch {
        /// What disagrees.
        reason: String,
    },

    /// A limit was exceeded.
    #[error("{what} {value} exceeds the limit of {limit}{path_note}; raise it with {flag} or {env} (ceiling {ceiling})",
        path_note = path.as_ref().map(|p| format!(" at {p}")).unwrap_or_default())]
    LimitExceeded {
        /// What was counted.
        what: &'static str,
        /// The value found (or reached).
        value: u64,
        /// The limit in force.
        limit: u64,
        /// The hard ceiling.
        ceiling: u64,
        /// The flag that raises it.
        flag: &'static str,
        /// The environment variable that raises it.
        env: &'static str,
        /// The entry where it was exceeded, when there is one.
        path: Option<String>,
    },

    /// A format limit that no flag can raise (file size, mtime, name length).
    #[error("{path}: {reason}")]
    FormatLimit {
        /// The entry.
        path: String,
        /// Which bound.
        reason: String,
    },

    /// A tar header's checksum does not match its bytes.
    #[error("header at byte {offset} (expected `{member}`): bad checksum")]
    BadChecksum {
        /// Offset of the header in the packet.
        offset: u64,
        /// The member the manifest puts there.
        member: String,
    },

    /// A member type other than directory, file, symlink (or our PAX header).
    #[error(
        "header at byte {offset} (expected `{member}`): member type {typeflag} is not allowed in a packet"
    )]
    UnsupportedMember {
        /// Offset of the header.
        offset: u64,
        /// The member the manifest puts there.
        member: String,
        /// Human name of the type found (`hard link`, `FIFO`, ...).
        typeflag: String,
    },

    /// The member at this position is not the one the manifest puts there.
    #[error("header at byte {offset}: found member `{found}` where the manifest puts `{member}`")]
    MemberMismatch {
        /// Offset of the header.
        offset: u64,
        /// The member the manifest puts there.
        member: String,
        /// The name found.
        found: String,
    },

    /// A header field is not the canonical encoding.
    #[error("header at byte {offset} (`{member}`): field `{field}` is not the canonical encoding")]
    NonCanonicalHeader {
        /// Offset of the header.
        offset: u64,
        /// The member.
        member: String,
        /// The tar field that differs.
        field: &'static str,
    },

    /// The header's size disagrees with the manifest.
    #[error("{member}: header says {header_size} bytes, manifest says {manifest_size}")]
    SizeMismatch {
        /// The member.
        member: String,
        /// Size in the manifest.
        manifest_size: u64,
        /// Size in the header (0 if unreadable).
        header_size: u64,
    },

    /// File content does not hash to the manifest's value.
    #[error(
        "{path}: content at bytes {start}..{end} of the file does not match the manifest hash; the packet was modified or corrupted"
    )]
    ContentMismatch {
        /// The file.
        path: String,
        /// First byte of the mismatching range, within the file.
        start: u64,
        /// End of the range.
        end: u64,
    },

    /// Bytes after a member's data, before the next block, are not zero.
    #[error("{member}: padding after its data is not zero")]
    BadPadding {
        /// The member.
        member: String,
    },

    /// The end-of-archive marker is missing or not zero.
    #[error("the end-of-archive marker at byte {offset} is not two zero blocks")]
    BadEndMarker {
        /// Where the marker starts.
        offset: u64,
    },

    /// The file is shorter than its manifest says.
    #[error("truncated: the manifest describes {expected} bytes but the file has {actual}")]
    Truncated {
        /// Length the layout implies.
        expected: u64,
        /// Length of the file.
        actual: u64,
    },

    /// The file is longer than its manifest says.
    #[error("{extra} bytes after the end of the archive (the manifest describes {expected} bytes)", extra = actual - expected)]
    TrailingBytes {
        /// Length the layout implies.
        expected: u64,
        /// Length of the file.
        actual: u64,
    },

    /// The packet's digest is not the one asked for.
    #[error("digest mismatch: expected {expected}, the packet's manifest is {found}")]
    DigestMismatch {
        /// The digest asked for.
        expected: String,
        /// The digest found.
        found: String,
    },

    /// The output path holds something a packet must not replace (a
    /// directory, a file that is not a packet, a device), found there at
    /// the start or when the packet was to be put in place.
    #[error("{path}: {reason}")]
    TargetUnusable {
        /// The output path.
        path: String,
        /// What is there, and what to do.
        reason: String,
    },
}

/// Result alias of the packet layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            file: None,
            context: context.into(),
            source,
        }
    }

    /// An I/O error on the file or directory `file`, which the message
    /// starts with and the error's path names.
    pub fn io_at(file: &std::path::Path, context: &str, source: io::Error) -> Error {
        let file = crate::packet::path::shown_path(file);
        Error::Io {
            context: format!("{file}: {context}"),
            file: Some(file),
            source,
        }
    }

    /// Names `file` as where an I/O error happened, if it names no file
    /// yet; any other error is returned as it is.
    pub fn at_file(self, file: &std::path::Path) -> Error {
        match self {
            Error::Io {
                file: None,
                context,
                source,
            } => Error::io_at(file, &context, source),
            e => e,
        }
    }

    /// The stable machine-readable kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { .. } => ErrorKind::Io,
            Error::Store(e) => e.kind(),
            Error::NotAPacket { .. } => ErrorKind::NotAPacket,
            Error::ManifestMissing { .. } => ErrorKind::ManifestMissing,
            Error::ManifestSyntax { .. } => ErrorKind::ManifestSyntax,
            Error::ManifestNotCanonical { .. } => ErrorKind::ManifestNotCanonical,
            Error::ManifestUnknownField { .. } => ErrorKind::ManifestUnknownField,
            Error::ManifestNullField { .. } => ErrorKind::ManifestNullField,
            Error::ManifestMissingField { .. } => ErrorKind::ManifestMissingField,
            Error::ManifestBadValue { .. } => ErrorKind::ManifestBadValue,
            Error::UnsupportedSchema { .. } => ErrorKind::UnsupportedSchema,
            Error::InvalidPath { .. } => ErrorKind::InvalidPath,
            Error::NotSorted { .. } => ErrorKind::NotSorted,
            Error::DuplicatePath { .. } => ErrorKind::DuplicatePath,
            Error::PathCollision { .. } => ErrorKind::PathCollision,
            Error::BadParent { .. } => ErrorKind::BadParent,
            Error::InvalidTarget { .. } => ErrorKind::InvalidSymlinkTarget,
            Error::SymlinkEscapes { .. } => ErrorKind::SymlinkEscapes,
            Error::SymlinkBudget { .. } => ErrorKind::SymlinkBudget,
            Error::HarnessMismatch { .. } => ErrorKind::HarnessMismatch,
            Error::LimitExceeded { .. } => ErrorKind::LimitExceeded,
            Error::FormatLimit { .. } => ErrorKind::FormatLimit,
            Error::BadChecksum { .. } => ErrorKind::BadHeaderChecksum,
            Error::UnsupportedMember { .. } => ErrorKind::UnsupportedMemberType,
            Error::MemberMismatch { .. } => ErrorKind::MemberMismatch,
            Error::NonCanonicalHeader { .. } => ErrorKind::NonCanonicalHeader,
            Error::SizeMismatch { .. } => ErrorKind::SizeMismatch,
            Error::ContentMismatch { .. } => ErrorKind::ContentMismatch,
            Error::BadPadding { .. } => ErrorKind::BadPadding,
            Error::BadEndMarker { .. } => ErrorKind::BadEndMarker,
            Error::Truncated { .. } => ErrorKind::Truncated,
            Error::TrailingBytes { .. } => ErrorKind::TrailingBytes,
            Error::DigestMismatch { .. } => ErrorKind::DigestMismatch,
            Error::TargetUnusable { .. } => ErrorKind::TargetUnusable,
        }
    }

    /// The class that decides the exit code.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Io { .. } => ErrorClass::Io,
            // Bytes fetched that are not the manifest's: the object is not
            // the packet it says it is, as for a local file.
            Error::Store(crate::store::Error::Corrupt { .. }) => ErrorClass::Invalid,
            Error::Store(_) => ErrorClass::Remote,
            Error::UnsupportedSchema { .. } => ErrorClass::Unsupported,
            Error::LimitExceeded { .. } => ErrorClass::Limit,
            Error::NotAPacket { .. }
            | Error::ManifestMissing { .. }
            | Error::ManifestSyntax { .. }
            | Error::ManifestNotCanonical { .. }
            | Error::ManifestUnknownField { .. }
            | Error::ManifestNullField { .. }
            | Error::ManifestMissingField { .. }
            | Error::ManifestBadValue { .. }
            | Error::InvalidPath { .. }
            | Error::NotSorted { .. }
            | Error::DuplicatePath { .. }
            | Error::PathCollision { .. }
            | Error::BadParent { .. }
            | Error::InvalidTarget { .. }
            | Error::SymlinkEscapes { .. }
            | Error::SymlinkBudget { .. }
            | Error::HarnessMismatch { .. }
            | Error::FormatLimit { .. }
            | Error::BadChecksum { .. }
            | Error::UnsupportedMember { .. }
            | Error::MemberMismatch { .. }
            | Error::NonCanonicalHeader { .. }
            | Error::SizeMismatch { .. }
            | Error::ContentMismatch { .. }
            | Error::BadPadding { .. }
            | Error::BadEndMarker { .. }
            | Error::Truncated { .. }
            | Error::TrailingBytes { .. }
            | Error::DigestMismatch { .. } => ErrorClass::Invalid,
            Error::TargetUnusable { .. } => ErrorClass::Refused,
        }
    }

    /// The path the error is about, when there is one: the entry of the
    /// packet at fault, or for an I/O error the file on disk.
    pub fn path(&self) -> Option<&str> {
        match self {
            Error::Io { file, .. } => file.as_deref(),
            Error::Store(e) => Some(e.location()),
            Error::InvalidPath { path, .. }
            | Error::NotSorted { path, .. }
            | Error::DuplicatePath { path }
            | Error::PathCollision { path, .. }
            | Error::BadParent { path, .. }
            | Error::InvalidTarget { path, .. }
            | Error::SymlinkEscapes { path, .. }
            | Error::SymlinkBudget { path, .. }
            | Error::FormatLimit { path, .. }
            | Error::TargetUnusable { path, .. }
            | Error::ContentMismatch { path, .. } => Some(path),
            Error::LimitExceeded { path, .. } => path.as_deref(),
            Error::BadChecksum { member, .. }
            | Error::UnsupportedMember { member, .. }
            | Error::MemberMismatch { member, .. }
            | Error::NonCanonicalHeader { member, .. }
            | Error::SizeMismatch { member, .. }
            | Error::BadPadding { member } => Some(member),
            Error::NotAPacket { .. }
            | Error::ManifestMissing { .. }
            | Error::ManifestSyntax { .. }
            | Error::ManifestNotCanonical { .. }
            | Error::ManifestUnknownField { .. }
            | Error::ManifestNullField { .. }
            | Error::ManifestMissingField { .. }
            | Error::ManifestBadValue { .. }
            | Error::UnsupportedSchema { .. }
            | Error::HarnessMismatch { .. }
            | Error::BadEndMarker { .. }
            | Error::Truncated { .. }
            | Error::TrailingBytes { .. }
            | Error::DigestMismatch { .. } => None,
        }
    }
}

/// Which limit, for [`Error::LimitExceeded`].
#[derive(Clone, Copy, Debug)]
pub enum LimitKind {
    /// Total content bytes.
    Bytes,
    /// Number of entries.
    Entries,
    /// Bytes of one path or target.
    PathBytes,
    /// Bytes of the manifest (derived from the others).
    ManifestBytes,
}

impl LimitKind {
    /// Builds the error for `value` over `limit`.
    pub fn exceeded(self, value: u64, limits: &super::format::Limits, path: Option<&str>) -> Error {
        use super::format::Limits;
        let (what, limit, ceiling, flag, env) = match self {
            LimitKind::Bytes => (
                "content bytes",
                limits.max_bytes,
                Limits::CEILING.max_bytes,
                "--max-bytes",
                "SESSIONFS_MAX_BYTES",
            ),
            LimitKind::Entries => (
                "entry count",
                limits.max_entries,
                Limits::CEILING.max_entries,
                "--max-entries",
                "SESSIONFS_MAX_ENTRIES",
            ),
            LimitKind::PathBytes => (
                "path bytes",
                limits.max_path_bytes,
                Limits::CEILING.max_path_bytes,
                "--max-path-bytes",
                "SESSIONFS_MAX_PATH_BYTES",
            ),
            LimitKind::ManifestBytes => (
                "manifest bytes",
                limits.max_manifest_bytes(),
                // The flag's ceiling: the bound is raised through it.
                Limits::CEILING.max_entries,
                "--max-entries (a manifest may take 2 KiB per entry allowed)",
                "SESSIONFS_MAX_ENTRIES",
            ),
        };
        Error::LimitExceeded {
            what,
            value,
            limit,
            ceiling,
            flag,
            env,
            path: path.map(str::to_owned),
        }
    }
}

/// What to do about a packet of schema `found`: a later version of the
/// format needs a later sessionfs; anything else is not a session packet.
fn schema_advice(found: &str) -> &'static str {
    if found.starts_with("sessionfs.packet/") {
        "upgrade sessionfs to use this packet"
    } else {
        "this file is not a sessionfs packet"
    }
}

#[cfg(test)]
mod schema_tests {
    use super::*;

    #[test]
    fn an_unknown_schema_says_whether_a_later_sessionfs_would_read_it() {
        let said = |found: &str| {
            Error::UnsupportedSchema {
                found: found.into(),
                supported: "sessionfs.packet/1 or sessionfs.packet/2",
            }
            .to_string()
        };
        assert!(said("sessionfs.packet/3").contains("upgrade sessionfs"));
        let other = said("other.thing/1");
        assert!(!other.contains("upgrade"), "{other}");
        assert!(other.contains("not a sessionfs packet"), "{other}");
    }
}
