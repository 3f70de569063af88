//! `sessionfs unpack`: restore a packet's tree where FUSE is not available.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

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
use crate::tar_out::{TarOptions, TarOutcome, write_tar};

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
///   sessionfs unpack s.packet --part workspace --tar ws.tar
///   sessionfs unpack s.packet --part workspace --strict-symlinks --tar - | tar -x -C /ws
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The packet: a file, `s3://BUCKET/KEY`, or an `http(s)://` URL
    /// (see docs/remote.md).
    packet: PathBuf,
    /// Target directory: must not exist, or be empty.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "tar",
        conflicts_with = "tar"
    )]
    into: Option<PathBuf>,
    /// Write a `.`-rooted tar stream instead (`-` for stdout: the result
    /// object then goes to stderr, as its last line), every byte verified
    /// before it is written; a refused packet leaves no file at OUT, and a
    /// stream to stdout without its end-of-archive blocks.
    #[arg(long, value_name = "OUT")]
    tar: Option<PathBuf>,
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
    #[arg(long, value_name = "N", requires = "gid", conflicts_with = "tar")]
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
    let part = a.part.map(|p| match p {
        PartArg::Workspace => Part::Workspace,
        PartArg::Harness => Part::Harness,
    });
    let Some(into) = a.into else {
        let out = a.tar.unwrap_or_default();
        return tar(
            packet,
            part,
            a.strict_symlinks,
            a.digest,
            &out,
            shown,
            started,
        );
    };
    let opts = UnpackOptions {
        into,
        part,
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

/// The result of `unpack --tar`.
#[derive(Serialize)]
struct TarResult {
    #[serde(flatten)]
    outcome: TarOutcome,
    tar: String,
    seconds: f64,
}

/// `--tar OUT`: the stream to a temporary file beside `OUT`, renamed onto
/// it once the whole packet verified, or to stdout (`-`).
fn tar<B: Source + Sync>(
    packet: &Packet<B>,
    part: Option<Part>,
    strict_symlinks: bool,
    digest: Option<Digest>,
    out: &Path,
    shown: &str,
    started: std::time::Instant,
) -> std::result::Result<Output, CliError> {
    let to_stdout = out.as_os_str() == "-";
    if to_stdout && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return Err(CliError::usage(
            "--tar - writes a tar stream to stdout, which is a terminal; redirect it to a file \
             or a pipe, or name a file",
        ));
    }
    let opts = TarOptions {
        part,
        strict_symlinks,
        digest,
        shown: if to_stdout {
            "-".to_owned()
        } else {
            crate::packet::path::shown_path(out)
        },
    };
    let progress = Progress::bytes("unpacking", packet.manifest.content_bytes());
    let outcome = if to_stdout {
        let stdout = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| {
                CliError::from(crate::restore::Error::Io {
                    path: "-".into(),
                    op: "cannot write the tar stream",
                    source: e,
                })
            })?;
        let mut w = std::io::BufWriter::with_capacity(STREAM_BUFFER, std::fs::File::from(stdout));
        write_tar(packet, &opts, &mut w, &|n| progress.add(n)).map_err(at_shown(shown))?
    } else {
        if let Some(why) = crate::output::names_a_directory(out)
            .map(str::to_owned)
            .or_else(|| crate::output::refuse_replacing_tar(out))
        {
            return Err(CliError::from(crate::packet::Error::TargetUnusable {
                path: opts.shown.clone(),
                reason: why,
            }));
        }
        let output =
            crate::output::Output::create_replacing(out, crate::output::refuse_replacing_tar)?;
        let mut w = std::io::BufWriter::with_capacity(STREAM_BUFFER, output.file());
        let outcome =
            write_tar(packet, &opts, &mut w, &|n| progress.add(n)).map_err(at_shown(shown))?;
        drop(w);
        output.commit(super::args::file_mode_from_umask())?;
        outcome
    };
    drop(progress);
    Ok(Output::new(
        "sessionfs.unpack-result/1",
        TarResult {
            outcome,
            tar: opts.shown,
            seconds: started.elapsed().as_secs_f64(),
        },
    ))
}

/// Bytes gathered before each write of the stream.
const STREAM_BUFFER: usize = 1 << 20;
