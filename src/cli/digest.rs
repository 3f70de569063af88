//! `sessionfs digest`: print a packet's digest.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::LimitArgs;
use super::error::{CliError, at_packet};
use crate::packet::Error;
use crate::packet::manifest::Manifest;
use crate::packet::reader::read_raw_manifest;

/// Print the packet digest: `sha256:` of the exact bytes of its manifest.
///
/// Reads only the first member, and checks that it is a manifest (as
/// `inspect` does; a future schema's digest is printed too). The digest
/// names the whole packet, since every other byte is implied by the
/// manifest; `verify` checks that it does.
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
    // A digest is only printed for a manifest: bytes that are not one
    // name no packet, and a caller could take them for one.
    match Manifest::parse(&raw.bytes, &limits) {
        Ok(_) | Err(Error::UnsupportedSchema { .. }) => {}
        Err(e) => return Err(at_packet(&a.packet)(e)),
    }
    Ok(Output::new(
        "sessionfs.digest-result/1",
        Result {
            packet: crate::packet::path::shown_path(&a.packet),
            digest: raw.digest.to_string(),
        },
    ))
}
