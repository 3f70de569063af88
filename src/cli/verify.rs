//! `sessionfs verify`: check every byte of a packet.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::{LimitArgs, parse_digest};
use super::error::CliError;
use super::location::{Opened, at_shown, open_packet};
use super::progress::Progress;
use crate::packet::digest::{Digest, Sha256};
use crate::packet::reader::{Packet, Source};
use crate::packet::verify::verify;

/// Check a packet completely: manifest, every header's canonical encoding,
/// every file and chunk hash, order, padding, end marker, no trailing bytes,
/// limits. Exits 0 only for a valid packet (and the given digest).
///
/// Examples:
///   sessionfs verify session.packet --digest sha256:3f2a…
///   sessionfs verify big.packet --max-bytes 8GiB --max-entries 1000000 --max-path-bytes 8192
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The packet: a file, `s3://BUCKET/KEY`, or an `http(s)://` URL
    /// (see docs/remote.md).
    packet: PathBuf,
    /// Also require this digest (`sha256:` and 64 hex digits).
    #[arg(long, value_parser = parse_digest)]
    digest: Option<Digest>,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Serialize)]
struct Result {
    packet: String,
    valid: bool,
    digest: Digest,
    file_sha256: Sha256,
    entries: u64,
    files: u64,
    content_bytes: u64,
    packet_bytes: u64,
    seconds: f64,
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let started = std::time::Instant::now();
    let limits = a.limits.limits()?;
    match open_packet(&a.packet, &limits)? {
        (Opened::Local(p), shown) => finish(&p, &a, shown, started),
        (Opened::Remote(p), shown) => finish(&p, &a, shown, started),
    }
}

fn finish<B: Source + Sync>(
    packet: &Packet<B>,
    a: &Args,
    shown: String,
    started: std::time::Instant,
) -> std::result::Result<Output, CliError> {
    let at = at_shown(&shown);
    packet.check_digest(a.digest.as_ref()).map_err(&at)?;
    let progress = Progress::bytes("verifying", packet.manifest.content_bytes() + packet.len());
    let report = verify(packet, &|n| progress.add(n)).map_err(&at)?;
    drop(progress);
    Ok(Output::new(
        "sessionfs.verify-result/1",
        Result {
            packet: shown.clone(),
            valid: true,
            digest: packet.digest,
            file_sha256: report.file_sha256,
            entries: report.entries,
            files: report.files,
            content_bytes: report.content_bytes,
            packet_bytes: packet.len(),
            seconds: started.elapsed().as_secs_f64(),
        },
    ))
}
