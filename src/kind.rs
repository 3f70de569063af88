//! The stable error kinds: the `kind` of every `sessionfs.error/1` object,
//! one enum for every layer. docs/CLI.md's table of exit codes lists each
//! (a test holds the two together, both ways).

macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// A stable, machine-readable error kind (`kind` in an error object).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorKind {
            /// Every kind.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$variant,)*];

            /// The kind as error objects spell it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorKind::$variant => $name,)*
                }
            }
        }
    };
}

kinds! {
    /// A bug: please report it.
    Internal = "internal",
    /// Bad usage: an unknown flag, a missing or bad argument.
    Usage = "usage",
    /// A pattern that is refused (it could match nothing).
    BadPattern = "bad_pattern",
    /// A remote location that is malformed or would not be taken
    /// literally (`.`, `..` or an empty segment in a key or URL path).
    InvalidLocation = "invalid_location",
    /// Not a packet at all.
    NotAPacket = "not_a_packet",
    /// The packet has no manifest first.
    ManifestMissing = "manifest_missing",
    /// The manifest is not JSON of the expected shape.
    ManifestSyntax = "manifest_syntax",
    /// The manifest is not in canonical form.
    ManifestNotCanonical = "manifest_not_canonical",
    /// A field the format does not have.
    ManifestUnknownField = "manifest_unknown_field",
    /// A field that is null.
    ManifestNullField = "manifest_null_field",
    /// A field that is missing.
    ManifestMissingField = "manifest_missing_field",
    /// A field with a bad value.
    ManifestBadValue = "manifest_bad_value",
    /// A path breaking the path rules.
    InvalidPath = "invalid_path",
    /// Entries out of order.
    NotSorted = "not_sorted",
    /// A path twice.
    DuplicatePath = "duplicate_path",
    /// Two paths that differ only by case or normalization.
    PathCollision = "path_collision",
    /// An entry whose parent is missing or not a directory.
    BadParent = "bad_parent",
    /// A symlink target breaking the rules.
    InvalidSymlinkTarget = "invalid_symlink_target",
    /// A symlink leading out of its part (strict unpack).
    SymlinkEscapes = "symlink_escapes",
    /// Symlinks too costly to resolve.
    SymlinkBudget = "symlink_budget",
    /// The harness fields disagree with the entries.
    HarnessMismatch = "harness_mismatch",
    /// A limit of the format itself.
    FormatLimit = "format_limit",
    /// A tar header whose checksum is wrong.
    BadHeaderChecksum = "bad_header_checksum",
    /// A tar member of a type the format does not use.
    UnsupportedMemberType = "unsupported_member_type",
    /// A member that is not the one the manifest implies.
    MemberMismatch = "member_mismatch",
    /// A header that differs from the canonical one.
    NonCanonicalHeader = "non_canonical_header",
    /// A member of the wrong size.
    SizeMismatch = "size_mismatch",
    /// Content whose hash is not the manifest's.
    ContentMismatch = "content_mismatch",
    /// Padding that is not zeros.
    BadPadding = "bad_padding",
    /// An end marker that is not zeros.
    BadEndMarker = "bad_end_marker",
    /// The file ends early.
    Truncated = "truncated",
    /// Bytes after the end marker.
    TrailingBytes = "trailing_bytes",
    /// Not the digest asked for.
    DigestMismatch = "digest_mismatch",
    /// The packet a mount serves changed under it.
    PacketChanged = "packet_changed",
    /// A packet schema this build does not know.
    UnsupportedSchema = "unsupported_schema",
    /// A configured limit was exceeded.
    LimitExceeded = "limit_exceeded",
    /// The operating system refused an operation.
    Io = "io",
    /// An operation on the merged view failed (its errno in the message).
    Filesystem = "filesystem",
    /// A path that must be a directory is not.
    NotADirectory = "not_a_directory",
    /// A file changed while `pack` read it.
    ChangedWhilePacking = "changed_while_packing",
    /// The packet was sealed, the move onto it failed.
    RebaseFailed = "rebase_failed",
    /// A name that is not UTF-8.
    NonUtf8Name = "non_utf8_name",
    /// A symlink target that is not UTF-8.
    NonUtf8Target = "non_utf8_target",
    /// A symlink leaving its part, refused.
    ExternalSymlink = "external_symlink",
    /// A tar stream `pack` does not take (damaged, cut short, or holding
    /// what a tree cannot: absolute names, `..`, a name twice).
    BadTar = "bad_tar",
    /// A credential store that packing must not take.
    CredentialStore = "credential_store",
    /// One part inside the other in a way pack will not take.
    PartsOverlap = "parts_overlap",
    /// An output, target or directory that cannot be used.
    TargetUnusable = "target_unusable",
    /// `--part` names a part the packet does not have.
    PartMissing = "part_missing",
    /// An upper directory that is in use or not one.
    UpperRefused = "upper_refused",
    /// An upper directory of another packet.
    UpperMismatch = "upper_mismatch",
    /// A journal record that does not apply.
    UpperDamaged = "upper_damaged",
    /// An upper data file changed under an offline seal.
    ChangedWhileSealing = "changed_while_sealing",
    /// A `mount --secret` that cannot be shown.
    SecretUnusable = "secret_unusable",
    /// A daemon's seal given up when its client went away.
    Cancelled = "cancelled",
    /// No usable remote configuration (credentials, endpoint, profile).
    RemoteConfig = "remote_config",
    /// No such bucket or key (HTTP 404).
    RemoteNotFound = "remote_not_found",
    /// The store refused the credentials (HTTP 401/403).
    RemoteDenied = "remote_denied",
    /// The object was replaced while it was read.
    RemoteChanged = "remote_changed",
    /// The server answered something other than what was asked.
    RemoteBadResponse = "remote_bad_response",
    /// The store did not answer within the retries and the time bound.
    RemoteUnavailable = "remote_unavailable",
    /// Another object is at the key a packet was to be written to.
    RemoteExists = "remote_exists",
    /// The store replaced what an upload completed at once: it does not
    /// honour conditional writes.
    RemoteOverwritten = "remote_overwritten",
    /// A mount that could not be made.
    MountFailed = "mount_failed",
    /// A mountpoint that cannot be used.
    MountpointUnusable = "mountpoint_unusable",
    /// A mountpoint that is not empty.
    MountpointNotEmpty = "mountpoint_not_empty",
    /// A sessionfs mount is already served there.
    AlreadyMounted = "already_mounted",
    /// No sessionfs daemon serves that path.
    NotMounted = "not_mounted",
    /// The mount is another user's.
    NotOwner = "not_owner",
    /// A sessionfs mount whose daemon is gone (killed, crashed).
    DaemonDied = "daemon_died",
    /// The daemon did not answer its control socket within the bound.
    DaemonNotAnswering = "daemon_not_answering",
    /// The mount is busy.
    Busy = "busy",
    /// The unmount failed.
    UmountFailed = "umount_failed",
    /// Stopped by a signal.
    Interrupted = "interrupted",
}

impl ErrorKind {
    /// The kind spelt `name`, if there is one.
    pub fn parse(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn every_kind_has_a_name_of_its_own_that_parses_back() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(k.as_str()), Some(*k));
        }
        let mut names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        assert_eq!(ErrorKind::parse("no_such_kind"), None);
    }
}
