//! `sessionfs status`: what a running mount serves, and its counters.

use std::path::PathBuf;

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
    let req = control::Request::Status;
    let asked = crate::daemon::client::ask(
        &a.mountpoint,
        &req,
        Some(control::ANSWER_BOUND),
        &mut |_| {},
    );
    match asked {
        Ok(r @ control::Reply::Status(_)) => Ok(Output::raw(r.into_value())),
        Ok(r) => Err(super::error::unexpected_reply(r)),
        Err(e) => Err(crate::daemon::client::unreachable(&a.mountpoint, &e).into()),
    }
}
