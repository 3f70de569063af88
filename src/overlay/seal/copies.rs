//! What a seal to `s3://` publishes without sending it: the runs of the
//! parent the store copies (`UploadPartCopy`), and what the seal knows of
//! them (docs/remote.md, "What a seal proves").
//!
//! A copied byte is **verified** when this seal, or the mount it seals,
//! fetched it from the parent's object (pinned to the ETag the copies are
//! pinned to) and found it to be the packet's: a unit of content whose
//! SHA-256 matched the manifest, or bytes between units (member headers,
//! padding) equal to what the manifest implies. Everything else is taken
//! on trust, and counted in the result (`unverified_copied_bytes`): a unit
//! the mount took from the node's cache (it matches the manifest, but says
//! nothing of the object's bytes), one never read, a local parent's bytes
//! (`SESSIONFS_SEAL_COPY_FROM`: the object named is checked to hold the
//! parent's manifest, not its content). `--verify-copies` fetches and
//! checks the rest before the upload completes, so that a parent object
//! whose bytes differ from its manifest fails the seal
//! (`content_mismatch`) and leaves nothing at the key; without it a seal
//! proves them anyway when they are few ([`AUTO_VERIFY_MAX`]).

use std::ops::Range;
use std::sync::Arc;

use super::super::error::{Error, Result};
use crate::store::spool::Spool;

/// A seal proves its copies without being asked when no more than this
/// many of their bytes are unverified: 16 MiB is about 0.15 s at 1 Gbit/s
/// (a few requests in flight), small beside an upload, and leaves no
/// unverified byte in the common case of a turn that read what it kept.
pub const AUTO_VERIFY_MAX: u64 = 16 << 20;

/// Requests of a proof in flight.
const PROVERS: usize = 4;

/// A proof's work is cut into slices of about this many bytes, taken in
/// turn by the provers.
const SLICE: u64 = 16 << 20;

/// The parent's object a seal copies from, as a spool: the mounted one,
/// or one made for the seal over the object `SESSIONFS_SEAL_COPY_FROM`
/// names (no cache: only bytes fetched from the object prove anything).
pub struct CopyParent {
    /// The spool.
    pub spool: Arc<Spool>,
}

impl CopyParent {
    /// Bytes of `copied` (ranges of the parent) not proven to be the
    /// packet's in the object.
    pub fn unverified(&self, copied: &[Range<u64>]) -> u64 {
        copied.iter().map(|r| self.spool.unproven(r.clone())).sum()
    }

    /// Fetches and checks what of `copied` is not proven, several
    /// requests at a time; the first mismatch fails it
    /// ([`crate::store::Error::Corrupt`], `content_mismatch`).
    pub fn prove(&self, copied: &[Range<u64>]) -> Result<()> {
        let mut slices: Vec<Range<u64>> = Vec::new();
        for r in copied {
            let mut at = r.start;
            while at < r.end {
                let end = (at + SLICE).min(r.end);
                if self.spool.unproven(at..end) > 0 {
                    slices.push(at..end);
                }
                at = end;
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = parking_lot::Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..PROVERS.min(slices.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(r) = slices.get(i) else { return };
                        if failed.lock().is_some() {
                            return;
                        }
                        let deadline = self.spool.remote().deadline();
                        if let Err(e) = self.spool.prove(r.clone(), deadline) {
                            failed.lock().get_or_insert(e);
                            return;
                        }
                    }
                });
            }
        });
        match failed.into_inner() {
            Some(e) => Err(Error::Packet(e.into())),
            None => Ok(()),
        }
    }
}
