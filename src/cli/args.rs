//! Arguments shared by several subcommands.

use crate::packet::digest::Digest;
use crate::packet::format::{Limits, Version};

use super::error::CliError;

/// The three limits, by flag or environment variable.
#[derive(clap::Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Most content bytes in a packet (suffixes KiB, MiB, GiB, TiB; ceiling 1 TiB).
    #[arg(long, env = "SESSIONFS_MAX_BYTES", value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Most entries in a packet (ceiling 4000000).
    #[arg(long, env = "SESSIONFS_MAX_ENTRIES", value_name = "N", default_value_t = Limits::DEFAULT.max_entries)]
    pub max_entries: u64,
    /// Most bytes in one path or symlink target (ceiling 16384).
    #[arg(long, env = "SESSIONFS_MAX_PATH_BYTES", value_name = "N", default_value_t = Limits::DEFAULT.max_path_bytes)]
    pub max_path_bytes: u64,
}

impl LimitArgs {
    /// The limits, checked against the ceilings.
    pub fn limits(&self) -> Result<Limits, CliError> {
        let c = Limits::CEILING;
        let check = |name: &str, v: u64, ceiling: u64| {
            if v == 0 || v > ceiling {
                Err(CliError::usage(format!(
                    "{name} {v} is out of range: it must be between 1 and the ceiling {ceiling}"
                )))
            } else {
                Ok(v)
            }
        };
        Ok(Limits {
            max_bytes: check("--max-bytes", self.max_bytes, c.max_bytes)?,
            max_entries: check("--max-entries", self.max_entries, c.max_entries)?,
            max_path_bytes: check("--max-path-bytes", self.max_path_bytes, c.max_path_bytes)?,
        })
    }
}

/// What packets a writer (`pack`, `seal`) writes: one definition, so that
/// the two take the same flag and a seal requested of a daemon carries it.
#[derive(clap::Args, Debug, Clone)]
pub struct WriteArgs {
    /// The packet format version to write: 2 (a file over 4 MiB is
    /// identified by its chunk hashes, so a seal that keeps some of its
    /// chunks never reads them), or 1 (every file also carries the SHA-256
    /// of its whole content, for readers from before version 2).
    #[arg(long, value_name = "N", default_value = "2", value_parser = parse_version)]
    pub packet_version: Version,
}

/// Parses a packet format version number (`1`, `2`).
pub fn parse_version(s: &str) -> Result<Version, String> {
    Version::ALL
        .into_iter()
        .find(|v| v.number().to_string() == s.trim())
        .ok_or_else(|| format!("`{s}` is not a packet version this sessionfs writes: 1 or 2"))
}

/// How remote packets are fetched and cached (docs/remote.md): taken by
/// every command that reads a packet; used when the packet is remote.
#[derive(clap::Args, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[command(next_help_heading = "Remote packets")]
pub struct RemoteArgs {
    /// The node-wide content cache, shared by every mount and command
    /// [default: $SESSIONFS_CACHE_DIR, else /var/cache/sessionfs as root,
    /// else $XDG_CACHE_HOME/sessionfs or ~/.cache/sessionfs].
    #[arg(long, value_name = "DIR")]
    pub cache: Option<std::path::PathBuf>,
    /// The cache's size bound; least recently used content goes first.
    #[arg(long, value_name = "SIZE", default_value = "10GiB", value_parser = parse_size)]
    pub cache_size: u64,
    /// Bytes of buffers a remote packet's fetches hold at most (read-ahead
    /// and prefetch included, which hold at most half); at least 16MiB.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    pub max_memory: u64,
    /// Small files are fetched in requests of up to this many bytes.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size)]
    pub block_size: u64,
    /// What a mount fetches before it is read, in the background, yielding
    /// to reads: `trace` (what the turn that sealed the packet read, in
    /// that order, from the `.trace` sidecar beside it, when there is one),
    /// `all` (the whole packet) or `none` (only what is read, and
    /// read-ahead of sequential readers).
    #[arg(long, value_enum, default_value = "trace")]
    pub prefetch: PrefetchArg,
}

/// `--prefetch`.
#[derive(
    clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize,
)]
pub enum PrefetchArg {
    /// Nothing before it is read.
    None,
    /// What the trace sidecar names.
    Trace,
    /// The whole packet, in the background.
    All,
}

impl RemoteArgs {
    /// How remote packets are read ([`Packet::open_remote`]): the
    /// environment's store settings, the cache (opened, made if needed),
    /// the spool's options. A daemon asks for it when a seal moves its
    /// mount onto an upload, hence the daemon layer's error.
    ///
    /// [`Packet::open_remote`]: crate::packet::reader::Packet::open_remote
    pub fn reading(&self) -> Result<crate::packet::backing::RemoteReading, crate::daemon::Error> {
        use crate::daemon::Error;
        if !(4096..=(64 << 20)).contains(&self.block_size) {
            return Err(Error::Usage(format!(
                "--block-size {} is out of range: 4KiB to 64MiB",
                self.block_size
            )));
        }
        let spool = crate::store::spool::SpoolOptions {
            block: self.block_size,
            max_memory: self.max_memory.max(crate::store::spool::MIN_MAX_MEMORY),
            prefetch: match self.prefetch {
                PrefetchArg::None => crate::store::spool::Prefetch::None,
                PrefetchArg::Trace => crate::store::spool::Prefetch::Trace,
                PrefetchArg::All => crate::store::spool::Prefetch::All,
            },
        };
        let settings = crate::store::Settings::from_env().map_err(Error::Usage)?;
        let dir = self
            .cache
            .clone()
            .unwrap_or_else(crate::store::cache::default_dir);
        let cache = crate::store::cache::Cache::open(&dir, self.cache_size).map_err(|e| {
            Error::failed(
                crate::kind::ErrorKind::TargetUnusable,
                crate::packet::error::ErrorClass::Refused,
                format!("--cache {}: {e}", dir.display()),
                &dir,
            )
        })?;
        Ok(crate::packet::backing::RemoteReading {
            settings,
            cache: Some(std::sync::Arc::new(cache)),
            spool,
        })
    }
}

/// Parses a byte count: digits with an optional binary suffix
/// (K, KiB, M, MiB, G, GiB, T, TiB; all powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("`{s}` is not a size: expected digits with an optional KiB/MiB/GiB/TiB suffix")
    })?;
    let shift = match suffix.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => {
            return Err(format!(
                "unknown size suffix `{other}` (use KiB, MiB, GiB or TiB)"
            ));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Parses `sha256:<hex>`.
pub fn parse_digest(s: &str) -> Result<Digest, String> {
    s.parse()
}

/// The mode new files get from the process umask (0666 & !umask).
pub fn file_mode_from_umask() -> u32 {
    use nix::sys::stat::{Mode, umask};
    // umask can only be read by setting it; set it straight back.
    let old = umask(Mode::from_bits_truncate(0o022));
    umask(old);
    0o666 & !old.bits() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("3MiB"), Ok(3 << 20));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("1PB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }
}
