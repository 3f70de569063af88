//! Every constant of the `sessionfs.packet` format (versions 1 and 2) and
//! every limit, in one place.
//!
//! Constants marked **FORMAT** are part of the on-disk format: changing one
//! changes the bytes a packet is made of, so it needs a new schema version and
//! a golden-file update (`tests/golden/`). The limits below them are policy:
//! a reader refuses a packet over a limit, but the limit does not change bytes.

/// A version of the format, named by the schema string that is the first
/// key of `packet.json`. Readers read every version here; writers write
/// [`Version::CURRENT`] unless asked for another (`--packet-version`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Version {
    /// `sessionfs.packet/1`: every file carries the SHA-256 of its whole
    /// content, a file over one chunk its chunk hashes as well.
    #[serde(rename = "1")]
    V1,
    /// `sessionfs.packet/2`: a file over one chunk carries its chunk hashes
    /// only, and its content is identified by them (its [chunk-list
    /// hash](crate::packet::digest::chunk_list_hash)), so that a writer
    /// that keeps some chunks of a file never reads or hashes them.
    #[default]
    #[serde(rename = "2")]
    V2,
}

impl Version {
    /// What writers write by default.
    pub const CURRENT: Version = Version::V2;
    /// Every version, oldest first.
    pub const ALL: [Version; 2] = [Version::V1, Version::V2];

    /// FORMAT: the schema string.
    pub fn schema(self) -> &'static str {
        match self {
            Version::V1 => "sessionfs.packet/1",
            Version::V2 => "sessionfs.packet/2",
        }
    }

    /// The version a schema string names, if this build reads it.
    pub fn from_schema(s: &str) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.schema() == s)
    }

    /// The version's number (1, 2).
    pub fn number(self) -> u32 {
        match self {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }

    /// FORMAT: whether a file of `size` bytes carries `sha256`, the hash of
    /// its whole content (in `/2`, only files without chunks do).
    pub fn whole_file_hash(self, size: u64) -> bool {
        self == Version::V1 || chunk_count(size) == 0
    }
}

/// The schema strings this build reads, for messages.
pub const SUPPORTED_SCHEMAS: &str = "sessionfs.packet/1 or sessionfs.packet/2";

/// FORMAT: name of the first member, the manifest.
pub const MANIFEST_NAME: &str = "packet.json";

/// FORMAT: tar block size; every header and every padded data run is a multiple.
pub const BLOCK: u64 = 512;

/// FORMAT: the end-of-archive marker is this many zero blocks, then end of file.
pub const END_BLOCKS: u64 = 2;

/// FORMAT: files larger than this carry per-chunk hashes, and this is the chunk
/// size. 4 MiB keeps the chunk list of a 1 GiB file at 256 hashes (17 KiB of
/// manifest) while a random 4 KiB read hashes at most 4 MiB (about 2.5 ms here).
pub const CHUNK_SIZE: u64 = 4 * 1024 * 1024;

/// FORMAT: the two parts of a packet, in sort order. `workspace` is required.
pub const PART_HARNESS: &str = "harness";
/// FORMAT: see [`PART_HARNESS`].
pub const PART_WORKSPACE: &str = "workspace";

/// FORMAT: header mode of regular files, executable files, directories, symlinks.
pub const MODE_FILE: u32 = 0o644;
/// FORMAT: see [`MODE_FILE`].
pub const MODE_EXEC: u32 = 0o755;
/// FORMAT: see [`MODE_FILE`].
pub const MODE_DIR: u32 = 0o755;
/// FORMAT: see [`MODE_FILE`].
pub const MODE_SYMLINK: u32 = 0o777;

/// FORMAT: the name field of every PAX extended header. Python's `tarfile`
/// writes the same fixed name; GNU tar's default embeds a process id, which
/// would make packets differ between runs.
pub const PAX_HEADER_NAME: &str = "././@PaxHeader";

/// FORMAT: ustar `name`, `prefix` and `linkname` field widths.
pub const USTAR_NAME_LEN: usize = 100;
/// FORMAT: see [`USTAR_NAME_LEN`].
pub const USTAR_PREFIX_LEN: usize = 155;
/// FORMAT: see [`USTAR_NAME_LEN`].
pub const USTAR_LINKNAME_LEN: usize = 100;

/// FORMAT: largest value of a 12-byte octal header field (11 digits): 8 GiB - 1.
/// It bounds a single file's size and a file's mtime in seconds (year 2242).
/// Base-256 and PAX `size`/`mtime` records are deliberately not used: one
/// encoding per value.
pub const MAX_OCTAL_11: u64 = 0o77_777_777_777;

/// FORMAT: largest file size a packet can hold.
pub const MAX_FILE_SIZE: u64 = MAX_OCTAL_11;

/// FORMAT: largest `mtime_ns`; its whole seconds must fit the header field.
pub const MAX_MTIME_NS: u64 = MAX_OCTAL_11 * 1_000_000_000 + 999_999_999;

/// FORMAT: longest path component in bytes (`NAME_MAX` on Linux, APFS and ext4).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// FORMAT: longest symlink target in bytes, whatever the path limit:
/// `PATH_MAX` - 1 on Linux, where `symlink(2)` refuses a longer one, so a
/// valid packet's links can be made where it is restored.
pub const MAX_TARGET_BYTES: usize = 4095;

/// Number of chunks of a file of `size` bytes that carries `chunks`, else 0.
pub fn chunk_count(size: u64) -> u64 {
    if size > CHUNK_SIZE {
        size.div_ceil(CHUNK_SIZE)
    } else {
        0
    }
}

/// `n` rounded up to a whole number of blocks (saturating: callers check sizes
/// against [`MAX_FILE_SIZE`] first, so saturation never happens on valid input).
pub fn pad_to_block(n: u64) -> u64 {
    n.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// The limits a reader and a writer enforce. Defaults suit one coding session;
/// each can be raised by flag or environment variable up to [`Limits::CEILING`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Total bytes of file content (`SESSIONFS_MAX_BYTES`).
    pub max_bytes: u64,
    /// Entries after the manifest (`SESSIONFS_MAX_ENTRIES`).
    pub max_entries: u64,
    /// Bytes of one path, and of one symlink target (`SESSIONFS_MAX_PATH_BYTES`).
    pub max_path_bytes: u64,
}

/// Manifest bytes allowed per permitted entry: generous for long paths and
/// targets (the average entry of a source tree takes about 170 bytes), while
/// still bounding what a reader allocates before it has parsed anything.
const MANIFEST_BYTES_PER_ENTRY: u64 = 2048;
/// Manifest bytes per chunk hash: `"` + 64 hex digits + `",`.
const MANIFEST_BYTES_PER_CHUNK: u64 = 67;
/// Fixed manifest overhead (schema, harness, brackets).
const MANIFEST_BYTES_FIXED: u64 = 4096;

impl Limits {
    /// The defaults: 1 GiB of content, 250,000 entries, 4096-byte paths.
    pub const DEFAULT: Limits = Limits {
        max_bytes: 1 << 30,
        max_entries: 250_000,
        max_path_bytes: 4096,
    };

    /// The hard ceilings no flag can exceed: 1 TiB of content, 4 million
    /// entries (an index of about 600 MiB in a mount), 16 KiB paths.
    pub const CEILING: Limits = Limits {
        max_bytes: 1 << 40,
        max_entries: 4_000_000,
        max_path_bytes: 16 * 1024,
    };

    /// Largest `packet.json` accepted under these limits (derived, not configurable).
    pub fn max_manifest_bytes(&self) -> u64 {
        MANIFEST_BYTES_FIXED
            + self.max_entries * MANIFEST_BYTES_PER_ENTRY
            + self.max_bytes.div_ceil(CHUNK_SIZE) * MANIFEST_BYTES_PER_CHUNK
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// The kinds of agent harness a packet's `harness` part can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HarnessKind {
    /// OpenAI Codex CLI home (`~/.codex`).
    Codex,
    /// Claude Code home (`~/.claude`).
    Claude,
    /// OpenCode data directory.
    Opencode,
    /// Anything else: only the generic credential exclusions apply.
    Generic,
}

impl HarnessKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [HarnessKind; 4] = [
        HarnessKind::Codex,
        HarnessKind::Claude,
        HarnessKind::Opencode,
        HarnessKind::Generic,
    ];

    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            HarnessKind::Codex => "codex",
            HarnessKind::Claude => "claude",
            HarnessKind::Opencode => "opencode",
            HarnessKind::Generic => "generic",
        }
    }

    /// Parses the manifest spelling.
    pub fn parse(s: &str) -> Option<HarnessKind> {
        HarnessKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for HarnessKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_count_boundaries() {
        for (size, chunks) in [
            (0, 0),
            (CHUNK_SIZE, 0),
            (CHUNK_SIZE + 1, 2),
            (2 * CHUNK_SIZE, 2),
            (2 * CHUNK_SIZE + 1, 3),
        ] {
            assert_eq!(chunk_count(size), chunks, "size {size}");
        }
    }

    #[test]
    fn ceilings_keep_derived_values_in_range() {
        // The derived manifest bound must not overflow at the ceilings.
        let m = Limits::CEILING.max_manifest_bytes();
        assert!(m > Limits::DEFAULT.max_manifest_bytes());
        assert!(
            MAX_MTIME_NS < i64::MAX as u64,
            "mtime_ns must fit a timespec"
        );
    }
}
