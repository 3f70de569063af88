//! `sessionfs digest`: print a packet's digest.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::LimitArgs;
use super::error::{CliError, at_packet};
use crate::packet::reader::read_raw_manifest;

/// Print the packet digest: `sha256:` of the exact bytes of its manifest.
///
/// Reads only the first member. The digest names the whole packet, since
/// every other byte is implied by the manifest; `verify` checks that it does.
///
/// Examples:
///   sessionfs digest session.packet
///   sessionfs digest big.packet --max-bytes 8GiB --max-entries 1000000 --max-path-bytes 8192
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The packet file.
    packet: PathBuf,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Serialize)]
struct Result {
    packet: String,
    digest: String,
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let limits = a.limits.limits()?;
    let file = crate::packet::reader::open_file(&a.packet).map_err(at_packet(&a.packet))?;
    let raw = read_raw_manifest(&file, &limits).map_err(at_packet(&a.packet))?;
    Ok(Output::new(
        "sessionfs.digest-result/1",
        Result {
            packet: a.packet.display().to_string(),
            digest: raw.digest.to_string(),
        },
    ))
}
