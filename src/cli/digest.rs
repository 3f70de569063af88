//! `sessionfs digest`: print a packet's digest.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::LimitArgs;
use super::error::CliError;
use crate::packet::Error;
use crate::packet::manifest::Manifest;

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
    /// The packet: a file, `s3://BUCKET/KEY`, or an `http(s)://` URL
    /// (see docs/remote.md). Only the manifest is fetched.
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
    let (raw, shown) = super::location::read_manifest(&a.packet, &limits)?;
    // A digest is only printed for a manifest: bytes that are not one
    // name no packet, and a caller could take them for one.
    match Manifest::parse(&raw.bytes, &limits) {
        Ok(_) | Err(Error::UnsupportedSchema { .. }) => {}
        Err(e) => return Err(super::location::at_shown(&shown)(e)),
    }
    Ok(Output::new(
        "sessionfs.digest-result/1",
        Result {
            packet: shown,
            digest: raw.digest.to_string(),
        },
    ))
}
