//! `sessionfs inspect`: a packet's metadata, from its manifest alone.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::LimitArgs;
use super::error::CliError;
use crate::packet::layout::Layout;
use crate::packet::manifest::{EntryKind, Manifest};
use crate::packet::path::Part;
use crate::packet::{Error, format::HarnessKind};

/// Show a packet's metadata: schema, digest, counts, harness kind, parts.
///
/// Reads the manifest and nothing else, but for a Codex packet's rollouts
/// (its threads: id, cwd, history mode, last update, size, whether they
/// carry provider-encrypted reasoning), verified as they are read. Works on
/// packets of future schema versions too, reporting them as unsupported
/// (exit 0): use it to find out what a packet is before deciding what to
/// do with it.
///
/// Examples:
///   sessionfs inspect session.packet
///   sessionfs inspect big.packet --max-bytes 8GiB --max-entries 1000000 --max-path-bytes 8192
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
    packet_schema: String,
    /// The format version's number, for a version this build reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    packet_version: Option<u32>,
    supported: bool,
    digest: String,
    manifest_bytes: u64,
    packet_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    harness: Option<HarnessKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parts: Option<Vec<Part>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dirs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlinks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_bytes: Option<u64>,
    /// Whether the file length matches the layout the manifest implies.
    #[serde(skip_serializing_if = "Option::is_none")]
    length_matches: Option<bool>,
    /// A Codex packet's threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    threads: Option<Vec<crate::harness::Thread>>,
}

/// The result's schema: version 2 added `threads`.
const RESULT_SCHEMA: &str = "sessionfs.inspect-result/2";

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let limits = a.limits.limits()?;
    let (raw, shown) = super::location::read_manifest(&a.packet, &limits)?;
    let mut out = Result {
        packet: shown.clone(),
        packet_schema: String::new(),
        packet_version: None,
        supported: true,
        digest: raw.digest.to_string(),
        manifest_bytes: raw.bytes.len() as u64,
        packet_bytes: raw.file_len,
        harness: None,
        parts: None,
        entries: None,
        files: None,
        dirs: None,
        symlinks: None,
        content_bytes: None,
        length_matches: None,
        threads: None,
    };
    let manifest = match Manifest::parse(&raw.bytes, &limits) {
        Ok(m) => m,
        Err(Error::UnsupportedSchema { found, .. }) => {
            out.packet_schema = found;
            out.supported = false;
            return Ok(Output::new(RESULT_SCHEMA, out));
        }
        Err(e) => return Err(super::location::at_shown(&shown)(e)),
    };
    out.packet_schema = manifest.version.schema().into();
    out.packet_version = Some(manifest.version.number());
    let count =
        |f: fn(&EntryKind) -> bool| manifest.entries.iter().filter(|e| f(&e.kind)).count() as u64;
    let layout = Layout::compute(&manifest, raw.bytes.len() as u64);
    out.harness = manifest.harness;
    out.parts = Some(
        [Part::Harness, Part::Workspace]
            .into_iter()
            .filter(|p| manifest.has_part(*p))
            .collect(),
    );
    out.entries = Some(manifest.entries.len() as u64);
    out.files = Some(count(|k| matches!(k, EntryKind::File(_))));
    out.dirs = Some(count(|k| matches!(k, EntryKind::Dir)));
    out.symlinks = Some(count(|k| matches!(k, EntryKind::Symlink(_))));
    out.content_bytes = Some(manifest.content_bytes());
    out.length_matches = Some(layout.total_len() == raw.file_len);
    if manifest.harness == Some(HarnessKind::Codex) {
        out.threads = Some(match super::location::open_packet(&a.packet, &limits) {
            Ok((super::location::Opened::Local(p), _)) => crate::harness::codex_threads(&p),
            Ok((super::location::Opened::Remote(p), _)) => crate::harness::codex_threads(&p),
            Err(e) => crate::harness::codex_threads_unread(&manifest, &e.message),
        });
    }
    Ok(Output::new(RESULT_SCHEMA, out))
}
