//! `sessionfs status`: what a running mount serves, and its counters.

use std::path::PathBuf;
use std::time::Duration;

use super::Output;
use super::error::CliError;
use crate::fuse::control;

/// Show what a running mount serves (packet, digest, upper directory,
/// daemon pid) and its counters (lookups, reads, writes, copy-ups, bytes
/// verified).
///
/// Examples:
///   sessionfs status /workspace
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The mountpoint.
    mountpoint: PathBuf,
}

pub fn run(a: Args) -> Result<Output, CliError> {
    match control::request(
        &a.mountpoint,
        &serde_json::json!({"op": "status"}),
        Some(Duration::from_secs(10)),
    ) {
        Ok(v) if v["schema"] == "sessionfs.error/1" => Err(CliError::relayed(v)),
        Ok(v) => Ok(Output::raw(v)),
        Err(e) => Err(super::umount::unreachable(&a.mountpoint, &e)),
    }
}
