//! `sessionfs unpack`: restore a packet's tree where FUSE is not available.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::{LimitArgs, parse_digest};
use super::error::CliError;
use super::location::{Opened, at_shown, open_packet};
use super::progress::Progress;
use crate::packet::digest::Digest;
use crate::packet::path::Part;
use crate::packet::reader::{Packet, Source};
use crate::restore::{UnpackOptions, UnpackOutcome, unpack};

/// Restore a packet's tree into a new or empty directory.
///
/// Verifies every byte as it restores; nothing appears at the target until
/// the whole packet has verified (the tree is built in a private staging
/// directory beside the target, then moved into place). File modes and
/// mtimes (to the nanosecond) are restored.
///
/// Examples:
///   sessionfs unpack session.packet --into ./restored
///   sessionfs unpack session.packet --into /workspace --part workspace --digest sha256:…
///   sessionfs unpack session.packet --into /workspace --part workspace --uid 1000 --gid 1000
///   sessionfs unpack untrusted.packet --into ./look --strict-symlinks
///   sessionfs unpack big.packet --into ./big --max-bytes 8GiB --max-entries 1000000
///   sessionfs unpack deep.packet --into ./deep --max-path-bytes 8192
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The packet: a file, `s3://BUCKET/KEY`, or an `http(s)://` URL
    /// (see docs/remote.md).
    packet: PathBuf,
    /// Target directory: must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    into: PathBuf,
    /// Require this digest.
    #[arg(long, value_parser = parse_digest)]
    digest: Option<Digest>,
    /// Restore only one part, as the target's root.
    #[arg(long, value_enum)]
    part: Option<PartArg>,
    /// Refuse symlinks whose targets resolve outside the restored tree.
    #[arg(long)]
    strict_symlinks: bool,
    /// Owner of every restored entry, a user id (default: the user running
    /// the unpack; another needs root). For a directory prepared for the
    /// agent's user: `--uid 1000 --gid 1000`
    #[arg(long, value_name = "N", requires = "gid")]
    uid: Option<u32>,
    /// Group of every restored entry, a group id (with `--uid`)
    #[arg(long, value_name = "N", requires = "uid")]
    gid: Option<u32>,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum PartArg {
    Workspace,
    Harness,
}

#[derive(Serialize)]
struct Result {
    #[serde(flatten)]
    outcome: UnpackOutcome,
    seconds: f64,
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let started = std::time::Instant::now();
    let limits = a.limits.limits()?;
    match open_packet(&a.packet, &limits)? {
        (Opened::Local(p), shown) => finish(&p, a, &shown, started),
        (Opened::Remote(p), shown) => finish(&p, a, &shown, started),
    }
}

fn finish<B: Source + Sync>(
    packet: &Packet<B>,
    a: Args,
    shown: &str,
    started: std::time::Instant,
) -> std::result::Result<Output, CliError> {
    let opts = UnpackOptions {
        into: a.into,
        part: a.part.map(|p| match p {
            PartArg::Workspace => Part::Workspace,
            PartArg::Harness => Part::Harness,
        }),
        strict_symlinks: a.strict_symlinks,
        owner: a.uid.zip(a.gid),
        digest: a.digest,
    };
    let progress = Progress::bytes("unpacking", packet.manifest.content_bytes());
    let outcome = unpack(packet, &opts, &|n| progress.add(n)).map_err(at_shown(shown))?;
    drop(progress);
    Ok(Output::new(
        "sessionfs.unpack-result/1",
        Result {
            outcome,
            seconds: started.elapsed().as_secs_f64(),
        },
    ))
}
