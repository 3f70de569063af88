//! Writing a packet to an S3-compatible store (`s3://BUCKET/KEY`): a
//! multipart upload fed as the packet is written, in file order, with no
//! copy of the packet on disk.
//!
//! The packet is cut into parts first ([`super::parts::plan`]): bytes
//! sent, and, for a seal whose parent is in the same store, unchanged runs
//! of the parent copied by the store (`UploadPartCopy`, pinned to the
//! parent's ETag). The writer ([`super::in_order`]) skips every piece that
//! lies wholly inside a copied part (its bytes are never read) and hands
//! the others, in file order, to a [`Feeder`], which assembles the sent
//! parts and queues them, and the copies, for uploader threads
//! ([`RemoteOutput::run_jobs`]). Memory: the part being assembled, one
//! queued, and one per uploader. Every part sent carries its SHA-256,
//! which the store checks (docs/remote.md, "What is verified").
//!
//! An object never replaces another: a HEAD before the upload starts (and
//! another just before it completes) looks at the key, and the completion
//! is conditional (`If-None-Match: *`) against a write in between. Where
//! something is there, nothing is uploaded: the parts are only hashed, and
//! [`compare_at_key`] decides whether the object holds exactly the bytes
//! this command would have written (`already_there`), or says what differs.
//! After a completion, a HEAD checks that the object at the key is the one
//! completed (a store that ignores `If-None-Match` is caught there). An
//! upload that fails, or is interrupted (SIGINT, SIGTERM, SIGHUP: see
//! [`crate::interrupt`]), is aborted; one that cannot be (the process
//! killed) is left to the bucket's lifecycle rule (docs/remote.md).

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};

use serde::Serialize;

use super::parts::{CopyRun, Part, PlanError, plan};
use crate::packet::digest::Digest;
use crate::packet::error::{Error, Result};
use crate::packet::format::Limits;
use crate::packet::layout::Layout;
use crate::store::upload::{composite, same_checksum, sha256_b64};
use crate::store::{Completion, CopySource, Head, Key, Location, PartDone, Settings, Upload};

/// Threads sending parts: two requests in flight keep a link busy while
/// the next part is assembled (four measured no faster on a store 10 ms
/// away at 1 Gbit/s, docs/benchmarks.md).
pub const UPLOADERS: usize = 2;

/// A packet being uploaded to one key.
pub struct RemoteOutput {
    key: Key,
    /// The upload, unless something was at the key when it was to start:
    /// then the parts are only hashed, to compare.
    upload: Option<Upload>,
    /// What a HEAD saw at the key when the upload was to start.
    found: Option<Head>,
    location: Location,
    settings: Settings,
    parts: Vec<Part>,
    copy_from: Option<CopySource>,
    done_parts: Mutex<Vec<Option<PartDone>>>,
    sent: AtomicU64,
    copied: AtomicU64,
    /// The upload is aborted if the process is interrupted (until done).
    pending: Option<crate::interrupt::Pending>,
    /// Completed or aborted: nothing to abort on drop.
    done: bool,
}

/// What an upload did, for the command's result.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Uploaded {
    /// Bytes sent to the store.
    pub uploaded_bytes: u64,
    /// Bytes the store copied from the parent packet (`UploadPartCopy`).
    pub copied_bytes: u64,
    /// Parts of the upload.
    pub parts: u64,
    /// The object at the key already held exactly the bytes this command
    /// would have written (proven: see [`compare_at_key`]); nothing was
    /// replaced or uploaded.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_there: bool,
}

/// What is at a key, against the packet a command would write there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtKey {
    /// Nothing.
    Nothing,
    /// Exactly the bytes of the packet, proven as said.
    Same(Proof),
    /// Something else: what it is, and how it differs.
    Differs(String),
}

/// How an object was proven to hold a packet's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The store's composite checksum of the object equals the one of the
    /// parts this command hashed (same part layout, same bytes): one HEAD.
    Checksum,
    /// The object was read and verified whole: a valid packet with this
    /// digest and length is, byte for byte, the packet (the format is
    /// canonical, every content byte checked against the manifest).
    Verified,
}

/// Compares what is at `location` with the packet of manifest digest
/// `digest` and `len` bytes: [`AtKey::Same`] only if the object holds
/// exactly the packet's bytes. `checksum` is the composite checksum this
/// command's parts would have (`BASE64-N`, [`crate::store::upload::composite`]),
/// if known: where the store's equals it, one HEAD proves it; otherwise the
/// object is read and verified whole (its cost: a download of the object,
/// docs/remote.md). `head` is what a HEAD of the key just saw, if one did.
pub fn compare_at_key(
    location: &Location,
    settings: &Settings,
    digest: &Digest,
    len: u64,
    checksum: Option<&str>,
    head: Option<Head>,
) -> Result<AtKey> {
    let head = match head {
        Some(h) => h,
        None => match Key::new(location, settings)?.head()? {
            Some(h) => h,
            None => return Ok(AtKey::Nothing),
        },
    };
    if head.len == len
        && let (Some(theirs), Some(ours)) = (&head.sha256, checksum)
        && same_checksum(theirs, ours)
    {
        return Ok(AtKey::Same(Proof::Checksum));
    }
    let object = crate::store::open_remote(location, settings, crate::store::FIRST_FETCH)?;
    let shown = location.shown();
    let boxed: Box<dyn crate::store::ReadAt> = Box::new(object);
    let packet = match crate::packet::reader::Packet::from_source(
        boxed,
        Path::new(&shown),
        &Limits::DEFAULT,
    ) {
        Ok(p) => p,
        Err(Error::Store(e)) => return Err(e.into()),
        Err(e) => {
            return Ok(AtKey::Differs(format!(
                "an object of {} bytes that is not a sessionfs packet ({})",
                head.len,
                e.kind().as_str()
            )));
        }
    };
    if packet.digest != *digest || packet.len() != len {
        return Ok(AtKey::Differs(format!(
            "another packet ({}, {} bytes)",
            packet.digest,
            packet.len()
        )));
    }
    match crate::packet::verify::verify(&packet, &|_| {}) {
        Ok(_) => Ok(AtKey::Same(Proof::Verified)),
        Err(Error::Store(e)) => Err(e.into()),
        Err(e) => Ok(AtKey::Differs(format!(
            "an object with this packet's manifest ({digest}) whose bytes are not this \
             packet's: {e}"
        ))),
    }
}

/// An internal inconsistency of the feeder (a bug, never input): an error
/// rather than a panic.
fn internal(what: String) -> Error {
    Error::io(
        "the upload's parts do not match the packet written",
        std::io::Error::other(what),
    )
}

impl RemoteOutput {
    /// Prepares the packet's upload to `location` (`s3://BUCKET/KEY`):
    /// looks at the key, and, where nothing is there, starts a multipart
    /// upload, aborted if the process is interrupted before it completes.
    pub fn create(location: &Location, settings: &Settings) -> Result<RemoteOutput> {
        let key = Key::new(location, settings)?;
        let found = key.head()?;
        let upload = match &found {
            Some(h) => {
                tracing::info!(location = %key.shown(), len = h.len, "something is at the key: nothing is uploaded, the packet is compared with it");
                None
            }
            None => Some(key.upload()?),
        };
        let pending = upload.as_ref().map(|u| {
            let abort = u.clone();
            crate::interrupt::undo_on_interrupt(
                format!("the upload to {}", u.shown()),
                Box::new(move || abort.abort().map_err(std::io::Error::other)),
            )
        });
        Ok(RemoteOutput {
            key,
            upload,
            found,
            location: location.clone(),
            settings: settings.clone(),
            parts: Vec::new(),
            copy_from: None,
            done_parts: Mutex::new(Vec::new()),
            sent: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            pending,
            done: false,
        })
    }

    /// The location, as shown.
    pub fn shown(&self) -> &str {
        self.key.shown()
    }

    /// The bytes of the parent the planned upload has the store copy
    /// (where each copied part comes from), in order: what a seal has
    /// not sent, and may have to prove.
    pub fn copied_from_parent(&self) -> Vec<Range<u64>> {
        self.parts
            .iter()
            .filter_map(|p| p.copy_from.map(|src| src..src + p.len()))
            .collect()
    }

    /// Plans the parts of the packet laid out as `layout`: bytes `runs`
    /// copied from `parent` where given, the rest sent.
    pub fn plan(
        &mut self,
        layout: &Layout,
        parent: Option<(CopySource, Vec<CopyRun>)>,
    ) -> Result<()> {
        let total = layout.total_len();
        let (copy_from, runs) = parent.unzip();
        let source_len = copy_from.as_ref().map_or(0, |c| c.len);
        self.parts =
            plan(total, runs.as_deref().unwrap_or_default(), source_len).map_err(|e| match e {
                PlanError::TooLarge(_) => Error::FormatLimit {
                    path: self.shown().into(),
                    reason: format!(
                        "a packet of {total} bytes is too large for one upload (S3 takes at \
                         most 10,000 parts of 5 GiB)"
                    ),
                },
                PlanError::BadRun(what) | PlanError::BadPart(what) => {
                    internal(format!("the upload's plan: {what}"))
                }
            })?;
        self.copy_from = copy_from;
        *self.done_parts.lock().unwrap_or_else(|p| p.into_inner()) = vec![None; self.parts.len()];
        tracing::debug!(location = %self.shown(), parts = self.parts.len(), copies = self.parts.iter().filter(|p| p.copy_from.is_some()).count(), "upload planned");
        Ok(())
    }

    /// Whether bytes `r` of the packet lie wholly in a copied part: the
    /// writer need not make them.
    pub(crate) fn is_copied(&self, r: &Range<u64>) -> bool {
        let k = self.parts.partition_point(|p| p.range.end <= r.start);
        self.parts.get(k).is_some_and(|p| {
            p.copy_from.is_some() && p.range.start <= r.start && r.end <= p.range.end
        })
    }

    /// A feeder of this upload's parts, queuing them on `tx`.
    pub(crate) fn feeder(&self, tx: mpsc::SyncSender<Job>) -> Feeder<'_> {
        Feeder {
            parts: &self.parts,
            next: 0,
            buf: Vec::new(),
            tx,
        }
    }

    /// One part: sent (or, with no upload, only hashed), or copied.
    fn run_job(&self, job: Job) -> (u16, crate::store::Result<PartDone>) {
        let t0 = std::time::Instant::now();
        match job {
            Job::Send { number, bytes } => {
                let Some(upload) = &self.upload else {
                    let hashed = PartDone {
                        etag: String::new(),
                        sha256: Some(sha256_b64(&bytes)),
                    };
                    return (number, Ok(hashed));
                };
                let r = upload.part(number, &bytes);
                self.sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                tracing::debug!(
                    part = number,
                    bytes = bytes.len(),
                    ms = t0.elapsed().as_millis() as u64,
                    "part sent"
                );
                (number, r)
            }
            Job::Copy {
                number,
                range,
                from,
            } => {
                let len = range.end - range.start;
                let (Some(upload), Some(src)) = (&self.upload, &self.copy_from) else {
                    // Nothing to copy into (or from): the store's checksum
                    // of the copied bytes stays unknown.
                    let unknown = PartDone {
                        etag: String::new(),
                        sha256: None,
                    };
                    return (number, Ok(unknown));
                };
                let r = upload.copy_part(number, src, from..from + len);
                self.copied.fetch_add(len, Ordering::Relaxed);
                tracing::debug!(
                    part = number,
                    bytes = len,
                    ms = t0.elapsed().as_millis() as u64,
                    "part copied"
                );
                (number, r)
            }
        }
    }

    /// An uploader thread: sends or copies the parts queued on `rx` until
    /// the feeder is gone. After a failure (`failed` set, by any thread)
    /// it takes what is queued and drops it, so the feeder never waits
    /// for good; the first error it met is returned.
    pub(crate) fn run_jobs(
        &self,
        rx: &Mutex<mpsc::Receiver<Job>>,
        failed: &AtomicBool,
    ) -> Result<()> {
        let mut first = Ok(());
        loop {
            let job = match rx.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return first,
            };
            let Ok(job) = job else { return first };
            if failed.load(Ordering::Relaxed) {
                continue;
            }
            match self.run_job(job) {
                (number, Ok(part)) => {
                    let mut parts = self.done_parts.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(slot) = parts.get_mut(usize::from(number) - 1) {
                        *slot = Some(part);
                    }
                }
                (_, Err(e)) => {
                    failed.store(true, Ordering::Relaxed);
                    if first.is_ok() {
                        first = Err(e.into());
                    }
                }
            }
        }
    }

    /// Completes the upload of the packet whose digest is `digest`: the
    /// object appears at the key, where nothing is. Something already
    /// there is left as it is: an object holding exactly this packet's
    /// bytes counts as written (`already_there`), anything else fails with
    /// `remote_exists`, saying what differs.
    pub fn commit(mut self, digest: &Digest) -> Result<Uploaded> {
        let parts: Vec<PartDone> = {
            let parts = self.done_parts.lock().unwrap_or_else(|p| p.into_inner());
            parts
                .iter()
                .cloned()
                .collect::<Option<_>>()
                .ok_or_else(|| internal("a part was not uploaded".into()))?
        };
        let total = self.parts.last().map_or(0, |p| p.range.end);
        let ours = composite(&parts);
        let mut uploaded = Uploaded {
            uploaded_bytes: self.sent.load(Ordering::Relaxed),
            copied_bytes: self.copied.load(Ordering::Relaxed),
            parts: parts.len() as u64,
            already_there: false,
        };
        let Some(upload) = self.upload.clone() else {
            let found = self.found.clone();
            return self.settle(digest, total, ours, found, uploaded);
        };
        // Again just before completing: a store that ignores the
        // condition below then replaces nothing written meanwhile.
        if let Some(h) = self.key.head()? {
            self.abort();
            return self.settle(digest, total, ours, Some(h), uploaded);
        }
        let completed = {
            // An interrupt sees the upload either not completed (and
            // aborts it) or completed (and lets the run report it).
            let _commit = crate::interrupt::creating();
            let c = upload.complete(&parts)?;
            if matches!(c, Completion::Created { .. }) {
                self.done = true;
                self.pending = None;
                crate::interrupt::committed();
            }
            c
        };
        let Completion::Created { etag, sha256 } = completed else {
            self.abort();
            uploaded.uploaded_bytes = self.sent.load(Ordering::Relaxed);
            return self.settle(digest, total, ours, None, uploaded);
        };
        // The store assembled what it was sent: its checksum of the object
        // is the one of the parts it checked.
        if let (Some(o), Some(t)) = (&ours, &sha256)
            && !same_checksum(t, o)
        {
            return Err(crate::store::Error::BadResponse {
                location: self.shown().into(),
                what: format!(
                    "the store completed the object with the checksum {t}, not {o} (that of \
                     the parts it accepted): what is at the key is not proven to be this packet"
                ),
            }
            .into());
        }
        // And the object at the key is the one completed.
        let now = self.key.head()?;
        let ours_there = match (&now, &etag) {
            (Some(h), Some(e)) => h.etag.as_deref().is_none_or(|t| t == e),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if !ours_there {
            return Err(crate::store::Error::Overwritten {
                location: self.shown().into(),
                what: format!(
                    "the object this upload completed (ETag {}) is no longer what is at the key \
                     ({}): another write replaced it at once, which a store that honours \
                     `If-None-Match: *` refuses; do not rely on this store never to replace a \
                     packet",
                    etag.as_deref().unwrap_or("none given"),
                    now.and_then(|h| h.etag)
                        .map_or("nothing".into(), |e| format!("ETag {e}"))
                ),
            }
            .into());
        }
        tracing::info!(location = %self.shown(), parts = uploaded.parts, uploaded = uploaded.uploaded_bytes, copied = uploaded.copied_bytes, "uploaded");
        Ok(uploaded)
    }

    /// Decides what an upload that did not complete (something is at the
    /// key) ends with: success if it holds exactly this packet, else
    /// `remote_exists` saying what differs.
    fn settle(
        &self,
        digest: &Digest,
        total: u64,
        ours: Option<String>,
        head: Option<Head>,
        mut uploaded: Uploaded,
    ) -> Result<Uploaded> {
        let t = std::time::Instant::now();
        let found = compare_at_key(
            &self.location,
            &self.settings,
            digest,
            total,
            ours.as_deref(),
            head,
        )?;
        tracing::debug!(location = %self.shown(), ?found, elapsed = ?t.elapsed(), "compared with what is at the key");
        let what = match found {
            AtKey::Same(proof) => {
                tracing::info!(location = %self.shown(), ?proof, "the same packet is already there");
                crate::interrupt::committed();
                uploaded.already_there = true;
                return Ok(uploaded);
            }
            AtKey::Differs(what) => what,
            AtKey::Nothing => {
                return Err(crate::store::Error::Changed {
                    location: self.shown().into(),
                    what: "what was at the key is gone; run the command again".into(),
                }
                .into());
            }
        };
        Err(crate::store::Error::Exists {
            location: self.shown().into(),
            what: format!(
                "{what} is already at this key, and it is left as it is (an upload never \
                 replaces an object): write to another key; naming packets by digest \
                 (…/sha256-<hex>.packet) makes a key's content never change"
            ),
        }
        .into())
    }

    /// Aborts the upload (once), logging a failure: the parts then stay
    /// until the bucket's lifecycle rule removes them.
    fn abort(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.pending = None;
        let Some(upload) = &self.upload else { return };
        if let Err(e) = upload.abort() {
            tracing::warn!(location = %self.shown(), error = %e, "cannot abort the upload; its parts stay until the bucket's AbortIncompleteMultipartUpload rule removes them");
        }
    }
}

impl Drop for RemoteOutput {
    fn drop(&mut self) {
        self.abort();
    }
}

/// A part for an uploader.
pub(crate) enum Job {
    /// Send these bytes as part `number`.
    Send { number: u16, bytes: Vec<u8> },
    /// Copy the parent's bytes at `from` as part `number`, bytes `range`
    /// of the packet.
    Copy {
        number: u16,
        range: Range<u64>,
        from: u64,
    },
}

/// Takes the packet's bytes in file order (pieces wholly inside copied
/// parts left out) and queues its parts.
pub(crate) struct Feeder<'a> {
    parts: &'a [Part],
    /// The part being filled, or next to queue.
    next: usize,
    buf: Vec<u8>,
    tx: mpsc::SyncSender<Job>,
}

impl Feeder<'_> {
    /// Takes bytes `at..at + bytes.len()` of the packet; those inside a
    /// copied part are dropped (the store copies them).
    pub(crate) fn push(&mut self, mut at: u64, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let Some(p) = self.parts.get(self.next) else {
                return Err(internal(format!("bytes at {at} beyond the last part")));
            };
            let (range, copied) = (p.range.clone(), p.copy_from.is_some());
            if at >= range.end && copied {
                self.queue_copy()?;
                continue;
            }
            let filled = range.start + self.buf.len() as u64;
            if copied && at >= range.start {
                let skip = (range.end - at).min(bytes.len() as u64);
                (at, bytes) = (at + skip, &bytes[skip as usize..]);
                if at == range.end {
                    self.queue_copy()?;
                }
                continue;
            }
            if copied || at != filled {
                return Err(internal(format!(
                    "bytes at {at}, where part {} expects {filled}",
                    self.next + 1
                )));
            }
            let n = ((range.end - at) as usize).min(bytes.len());
            if self.buf.is_empty() {
                self.buf.reserve_exact((range.end - range.start) as usize);
            }
            self.buf.extend_from_slice(&bytes[..n]);
            (at, bytes) = (at + n as u64, &bytes[n..]);
            if at == range.end {
                let bytes = std::mem::take(&mut self.buf);
                self.queue(Job::Send {
                    number: self.number(),
                    bytes,
                })?;
            }
        }
        Ok(())
    }

    /// Queues what is left (copied parts): every part must be queued.
    pub(crate) fn finish(mut self) -> Result<()> {
        while let Some(p) = self.parts.get(self.next) {
            if p.copy_from.is_none() {
                return Err(internal(format!(
                    "part {} got {} of its {} bytes",
                    self.next + 1,
                    self.buf.len(),
                    p.len()
                )));
            }
            self.queue_copy()?;
        }
        Ok(())
    }

    /// The current part's number (1-based; at most 10,000 by the plan).
    fn number(&self) -> u16 {
        u16::try_from(self.next + 1).unwrap_or(u16::MAX)
    }

    fn queue_copy(&mut self) -> Result<()> {
        let p = &self.parts[self.next];
        let job = Job::Copy {
            number: self.number(),
            range: p.range.clone(),
            from: p.copy_from.unwrap_or_default(),
        };
        self.queue(job)
    }

    /// Hands a part to the uploaders; fails once they are all gone (they
    /// report why).
    fn queue(&mut self, job: Job) -> Result<()> {
        self.next += 1;
        self.tx
            .send(job)
            .map_err(|_| internal("the uploaders stopped".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part queued: its number, its range, where it is copied from.
    type Queued = (u16, Range<u64>, Option<u64>);

    /// What the feeder queued: `(number, range, Some(from))` for a copy,
    /// `(number, bytes' range, None)` for bytes sent (checked against
    /// the packet's bytes).
    fn feed(parts: &[Part], total: u64, pieces: &[Range<u64>]) -> Result<Vec<Queued>> {
        let packet: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let (tx, rx) = mpsc::sync_channel(parts.len() + 1);
        let mut f = Feeder {
            parts,
            next: 0,
            buf: Vec::new(),
            tx,
        };
        for r in pieces {
            f.push(r.start, &packet[r.start as usize..r.end as usize])?;
        }
        f.finish()?;
        let mut out = Vec::new();
        for job in rx.try_iter() {
            match job {
                Job::Send { number, bytes } => {
                    let p = &parts[usize::from(number) - 1];
                    assert!(
                        bytes == packet[p.range.start as usize..p.range.end as usize],
                        "part {number}'s bytes"
                    );
                    out.push((number, p.range.clone(), None));
                }
                Job::Copy {
                    number,
                    range,
                    from,
                } => out.push((number, range, Some(from))),
            }
        }
        Ok(out)
    }

    #[test]
    fn the_feeder_queues_parts_in_order_and_drops_copied_bytes() {
        let part = |a: u64, b: u64, c: Option<u64>| Part {
            range: a..b,
            copy_from: c,
        };
        let parts = [
            part(0, 10, None),
            part(10, 30, Some(100)),
            part(30, 35, None),
            part(35, 50, Some(7)),
        ];
        // Pieces straddle part boundaries; those wholly copied are left out.
        let pieces = [0..4, 4..12, 28..33, 33..36, 48..50];
        let got = feed(&parts, 50, &pieces).unwrap();
        assert_eq!(
            got,
            vec![
                (1, 0..10, None),
                (2, 10..30, Some(100)),
                (3, 30..35, None),
                (4, 35..50, Some(7))
            ]
        );
        // A gap in bytes that are sent, or a part left short, is an error.
        assert!(feed(&parts, 50, &[0..4, 5..12]).is_err());
        assert!(feed(&parts, 50, &[0..4, 4..5]).is_err());
        // Bytes past the last part too.
        assert!(feed(&parts[..1], 50, &[0..10, 10..12]).is_err());
    }
}
