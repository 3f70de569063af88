//! Full verification: every byte of a packet checked against its manifest,
//! on all cores, with the whole-file hash computed alongside.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::digest::Sha256;
use super::error::Result;
use super::reader::{Event, Packet, Source};

/// What a successful verification found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    /// Number of entries.
    pub entries: u64,
    /// Number of regular files.
    pub files: u64,
    /// Bytes of file content hashed.
    pub content_bytes: u64,
    /// SHA-256 of the whole packet file.
    pub file_sha256: Sha256,
}

/// Verifies everything: headers, content, padding, the end marker, and
/// hashes the whole file. `progress` receives byte counts as work is done
/// (content and whole-file hashing both count, so the total is twice the
/// file length).
pub fn verify<B: Source + Sync>(
    packet: &Packet<B>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Report> {
    let content = AtomicU64::new(0);
    let batches = packet.batches();
    let (members, whole) = rayon::join(
        || {
            batches
                .into_par_iter()
                .try_for_each_init(Vec::new, |buf, range| {
                    packet.check_batch(range, buf, &mut |ev| {
                        if let Event::Data(_, bytes) = ev {
                            content.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                            progress(bytes.len() as u64);
                        }
                        Ok(())
                    })
                })
        },
        || packet.file_sha256(progress),
    );
    members?;
    let file_sha256 = whole?;
    packet.check_end()?;
    let files = packet
        .manifest
        .entries
        .iter()
        .filter(|e| e.file().is_some())
        .count() as u64;
    Ok(Report {
        entries: packet.manifest.entries.len() as u64,
        files,
        content_bytes: content.into_inner(),
        file_sha256,
    })
}
