//! Packet arguments that may name a remote object: `s3://BUCKET/KEY`,
//! `http://…`, `https://…` (see docs/remote.md). A local path is opened
//! exactly as before.

use std::path::Path;

use super::error::{CliError, at_packet};
use crate::packet::format::Limits;
use crate::packet::reader::{RawManifest, read_raw_manifest};
use crate::store::{Location, ReadAt, Settings};

/// The first request for a remote packet asks for this many bytes: the
/// manifest's header and, for packets of up to a few thousand entries,
/// the whole manifest, so that `inspect` and `digest` cost one request
/// (a larger manifest costs a second one for the rest). A little over
/// what one round trip carries at no extra latency in region.
pub const FIRST_FETCH: u64 = 256 * 1024;

/// A packet argument, parsed; a usage error names what is wrong.
pub fn parse(packet: &Path) -> Result<Location, CliError> {
    Location::parse(packet.as_os_str()).map_err(CliError::usage)
}

/// The location as results show it.
pub fn shown(location: &Location) -> String {
    match location {
        Location::Local(p) => crate::packet::path::shown_path(p),
        remote => remote.shown(),
    }
}

/// Reads the manifest member of the packet at `packet` (local or remote)
/// and computes its digest; also returns the location as shown.
pub fn read_manifest(packet: &Path, limits: &Limits) -> Result<(RawManifest, String), CliError> {
    let location = parse(packet)?;
    let shown = shown(&location);
    let raw = match &location {
        Location::Local(p) => {
            let file = crate::packet::reader::open_file(p).map_err(at_packet(p))?;
            read_raw_manifest(&file, limits).map_err(at_packet(p))?
        }
        remote => {
            let settings = Settings::from_env().map_err(CliError::usage)?;
            let at = at_shown(&shown);
            let object = crate::store::open_remote(remote, &settings, FIRST_FETCH)
                .map_err(|e| at(e.into()))?;
            let raw = read_raw_manifest(&object as &dyn ReadAt, limits).map_err(at)?;
            tracing::debug!(location = %shown, requests = object.requests(), "manifest fetched");
            raw
        }
    };
    Ok((raw, shown))
}

/// Maps an error about the packet at `shown` ([`CliError::in_named`]).
pub fn at_shown(shown: &str) -> impl Fn(crate::packet::Error) -> CliError + '_ {
    move |e| CliError::from(e).in_named(shown.to_owned())
}
