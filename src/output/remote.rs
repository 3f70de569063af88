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
//! queued, and one per uploader.
//!
//! The object appears at the key only when the upload completes
//! ([`RemoteOutput::commit`]), and only where nothing is there yet; the
//! same packet already there counts as written. An upload that fails, or
//! is interrupted (SIGINT, SIGTERM, SIGHUP: see [`crate::interrupt`]), is
//! aborted; one that cannot be (the process killed) is left to the
//! bucket's lifecycle rule (docs/remote.md).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};

use serde::Serialize;

use super::parts::{CopyRun, Part, plan};
use crate::packet::digest::Digest;
use crate::packet::error::{Error, Result};
use crate::packet::format::Limits;
use crate::packet::layout::Layout;
use crate::store::{Completion, CopySource, Location, Settings, Upload};

/// Threads sending parts: two requests in flight keep a link busy while
/// the next part is assembled (four measured no faster on a store 10 ms
/// away at 1 Gbit/s, docs/benchmarks.md).
pub const UPLOADERS: usize = 2;

/// A packet being uploaded to one key.
pub struct RemoteOutput {
    upload: Upload,
    location: Location,
    settings: Settings,
    parts: Vec<Part>,
    copy_from: Option<CopySource>,
    etags: Mutex<Vec<Option<String>>>,
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
    /// The same packet was already at the key: nothing was replaced, and
    /// the upload was aborted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_there: bool,
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
    /// Starts a multipart upload to `location` (`s3://BUCKET/KEY`),
    /// aborted if the process is interrupted before it completes.
    pub fn create(location: &Location, settings: &Settings) -> Result<RemoteOutput> {
        let upload = Upload::create(location, settings)?;
        let abort = upload.clone();
        let pending = crate::interrupt::undo_on_interrupt(
            format!("the upload to {}", upload.shown()),
            Box::new(move || abort.abort().map_err(std::io::Error::other)),
        );
        Ok(RemoteOutput {
            upload,
            location: location.clone(),
            settings: settings.clone(),
            parts: Vec::new(),
            copy_from: None,
            etags: Mutex::new(Vec::new()),
            sent: AtomicU64::new(0),
            copied: AtomicU64::new(0),
            pending: Some(pending),
            done: false,
        })
    }

    /// The location, as shown.
    pub fn shown(&self) -> &str {
        self.upload.shown()
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
        self.parts =
            plan(total, runs.as_deref().unwrap_or_default()).map_err(|_| Error::FormatLimit {
                path: self.shown().into(),
                reason: format!(
                    "a packet of {total} bytes is too large for one upload (S3 takes at most \
                     10,000 parts of 5 GiB)"
                ),
            })?;
        self.copy_from = copy_from;
        *self.etags.lock().unwrap_or_else(|p| p.into_inner()) = vec![None; self.parts.len()];
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
            let t0 = std::time::Instant::now();
            let (number, done) = match job {
                Job::Send { number, bytes } => {
                    let r = self.upload.part(number, &bytes);
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
                    let r = match &self.copy_from {
                        Some(src) => self.upload.copy_part(number, src, from..from + len),
                        None => Err(crate::store::Error::BadResponse {
                            location: self.shown().into(),
                            what: "a copied part without a parent to copy from".into(),
                        }),
                    };
                    self.copied.fetch_add(len, Ordering::Relaxed);
                    tracing::debug!(
                        part = number,
                        bytes = len,
                        ms = t0.elapsed().as_millis() as u64,
                        "part copied"
                    );
                    (number, r)
                }
            };
            match done {
                Ok(etag) => {
                    let mut etags = self.etags.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(slot) = etags.get_mut(usize::from(number) - 1) {
                        *slot = Some(etag);
                    }
                }
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    if first.is_ok() {
                        first = Err(e.into());
                    }
                }
            }
        }
    }

    /// Completes the upload of the packet whose digest is `digest`: the
    /// object appears at the key. Something already there is left as it
    /// is: the same packet (its digest and length) counts as written,
    /// anything else fails with `remote_exists`.
    pub fn commit(mut self, digest: &Digest) -> Result<Uploaded> {
        let etags: Vec<String> = {
            let etags = self.etags.lock().unwrap_or_else(|p| p.into_inner());
            etags
                .iter()
                .cloned()
                .collect::<Option<_>>()
                .ok_or_else(|| internal("a part was not uploaded".into()))?
        };
        let total = self.parts.last().map_or(0, |p| p.range.end);
        let mut uploaded = Uploaded {
            uploaded_bytes: self.sent.load(Ordering::Relaxed),
            copied_bytes: self.copied.load(Ordering::Relaxed),
            parts: etags.len() as u64,
            already_there: false,
        };
        {
            // An interrupt sees the upload either not completed (and
            // aborts it) or completed (and lets the run report it).
            let _commit = crate::interrupt::creating();
            if self.upload.complete(&etags)? == Completion::Created {
                self.done = true;
                self.pending = None;
                crate::interrupt::committed();
                tracing::info!(location = %self.shown(), parts = uploaded.parts, uploaded = uploaded.uploaded_bytes, copied = uploaded.copied_bytes, "uploaded");
                return Ok(uploaded);
            }
        }
        self.abort();
        let there = self.existing()?;
        if there.as_ref() == Some(&(*digest, total)) {
            tracing::info!(location = %self.shown(), "the same packet is already there");
            crate::interrupt::committed();
            uploaded.already_there = true;
            return Ok(uploaded);
        }
        let what = match there {
            Some((d, len)) => format!("another packet ({d}, {len} bytes)"),
            None => "an object that is not a sessionfs packet".into(),
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

    /// The digest and length of the packet at the key, or `None` when
    /// what is there is not a packet.
    fn existing(&self) -> Result<Option<(Digest, u64)>> {
        use crate::store::ReadAt;
        let object =
            crate::store::open_remote(&self.location, &self.settings, crate::store::FIRST_FETCH)?;
        match crate::packet::reader::read_raw_manifest(&object as &dyn ReadAt, &Limits::DEFAULT) {
            Ok(raw) => Ok(Some((raw.digest, object.len()))),
            Err(Error::Store(e)) => Err(e.into()),
            Err(_) => Ok(None),
        }
    }

    /// Aborts the upload (once), logging a failure: the parts then stay
    /// until the bucket's lifecycle rule removes them.
    fn abort(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.pending = None;
        if let Err(e) = self.upload.abort() {
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
