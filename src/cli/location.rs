//! Packet arguments that may name a remote object: `s3://BUCKET/KEY`,
//! `http://…`, `https://…` (see docs/remote.md). A local path is opened
//! exactly as before.

use std::path::Path;

use super::error::{CliError, at_packet};
use crate::packet::format::Limits;
use crate::packet::reader::{Packet, RawManifest, read_raw_manifest};
use crate::store::{Location, ReadAt, Settings};

pub use crate::store::FIRST_FETCH;

/// A packet argument, parsed; `invalid_location` (a usage error) names
/// what is wrong.
pub fn parse(packet: &Path) -> Result<Location, CliError> {
    Location::parse(packet.as_os_str()).map_err(|message| {
        CliError::new(None, crate::kind::ErrorKind::InvalidLocation, message, None)
    })
}

/// An output argument (`pack -o`, `seal -o`): a local path, or an
/// `s3://BUCKET/KEY` to upload to, with the settings of the environment.
/// An `http(s)://` URL cannot be written to: a usage error.
pub fn output(arg: &Path, what: &str) -> Result<Option<(Location, Settings)>, CliError> {
    match parse(arg)? {
        Location::Local(_) => Ok(None),
        s3 @ Location::S3 { .. } => {
            let settings = Settings::from_env().map_err(CliError::usage)?;
            Ok(Some((s3, settings)))
        }
        http @ Location::Http(_) => Err(CliError::usage(format!(
            "{}: {what} writes a file or an s3://BUCKET/KEY object; an http(s) URL cannot be \
             written to (docs/remote.md)",
            http.shown()
        ))),
    }
}

/// A `{digest}` in an output (`pack -o`, `seal -o`): anywhere in an
/// `s3://` key; in a local file's name only (its directory exists).
pub fn check_digest_named(output: &Path, remote: bool) -> Result<(), CliError> {
    if !crate::output::digest_named(output) || remote {
        return Ok(());
    }
    crate::output::check_digest_template(output).map_err(CliError::usage)
}

/// A packet argument as results give it: a local path made absolute (the
/// result is read where a relative path may not lead), a remote location
/// as shown.
pub fn absolute(packet: &Path) -> std::path::PathBuf {
    match Location::parse(packet.as_os_str()) {
        Ok(Location::Local(p)) => {
            crate::sys::resolved(&p).unwrap_or_else(|| crate::sys::absolute(&p))
        }
        Ok(remote) => remote.shown().into(),
        Err(_) => crate::sys::absolute(packet),
    }
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
            let object = open_object(remote, &shown)?;
            let raw =
                read_raw_manifest(&object as &dyn ReadAt, limits).map_err(at_shown(&shown))?;
            tracing::debug!(location = %shown, requests = object.requests(), "manifest fetched");
            raw
        }
    };
    Ok((raw, shown))
}

/// Maps an error about the packet at `shown` ([`CliError::in_named`]).
pub fn at_shown<E: Into<CliError>>(shown: &str) -> impl Fn(E) -> CliError + '_ {
    move |e| e.into().in_named(shown.to_owned())
}

/// A packet opened for reading its members: a local file or a remote
/// object (the commands run the same generic code on either).
pub enum Opened {
    /// A packet file.
    Local(Packet),
    /// A remote object, read by ranged GETs.
    Remote(Packet<Box<dyn ReadAt>>),
}

/// Opens the packet at `packet` (local or remote) and checks its manifest
/// and length ([`Packet::open`]); also returns the location as shown.
pub fn open_packet(packet: &Path, limits: &Limits) -> Result<(Opened, String), CliError> {
    let location = parse(packet)?;
    let shown = shown(&location);
    let at = at_shown::<crate::packet::Error>(&shown);
    let opened = match &location {
        Location::Local(p) => Opened::Local(Packet::open(p, limits).map_err(at)?),
        remote => {
            let object: Box<dyn ReadAt> = Box::new(open_object(remote, &shown)?);
            Opened::Remote(Packet::from_source(object, Path::new(&shown), limits).map_err(at)?)
        }
    };
    Ok((opened, shown))
}

/// Opens the packet at `packet` for a mount or an offline seal: a local
/// file as [`Packet::open`] does, a remote object with its content read
/// through a spool and the node-wide cache, as `remote` says
/// ([`Packet::open_remote`], the one opener); also returns the location as
/// shown.
pub fn open_lower(
    packet: &Path,
    limits: &Limits,
    remote: &super::args::RemoteArgs,
) -> Result<(Packet, String), CliError> {
    let location = parse(packet)?;
    let shown = shown(&location);
    let at = at_shown::<crate::packet::Error>(&shown);
    let p = match &location {
        Location::Local(p) => Packet::open(p, limits).map_err(at)?,
        loc => Packet::open_remote(loc, limits, &remote.reading()?).map_err(at)?,
    };
    Ok((p, shown))
}

/// Opens a remote object with the settings of the environment.
fn open_object(remote: &Location, shown: &str) -> Result<crate::store::Remote, CliError> {
    let settings = Settings::from_env().map_err(CliError::usage)?;
    crate::store::open_remote(remote, &settings, FIRST_FETCH)
        .map_err(|e| at_shown(shown)(crate::packet::Error::from(e)))
}
