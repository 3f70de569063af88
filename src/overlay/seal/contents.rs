//! The merged view's files as the content source the writer reads: lower
//! bytes from the parent packet (around the page cache when this daemon
//! wrote it), upper bytes from data files, each checked not to change.

use super::*;

/// Lower files closer than this in the parent are read as one run (what
/// lies between is member headers): one request of a remote parent's spool.
const RUN_GAP: u64 = 64 << 10;

/// The merged view's files as a content source for the writer.
pub(super) struct SealContents<'a> {
    /// The seal's options (whether it was given up).
    pub(super) opts: &'a SealOptions,
    pub(super) overlay: &'a Overlay,
    pub(super) lower: &'a Lower,
    /// Reads of the parent around the page cache, when it is not in it.
    pub(super) direct: Option<DirectLower>,
    pub(super) items: &'a [Item],
    /// Per entry: how its upper data file looked when first read, so that
    /// content hashed once and written later is known to be the same.
    /// (Only files read from the upper directory have one.)
    pub(super) stamps: HashMap<usize, OnceLock<Stamp>>,
}

impl<'a> SealContents<'a> {
    /// The files of `items`, read from `lower` and `overlay`'s upper
    /// directory.
    pub(super) fn new(
        opts: &'a SealOptions,
        overlay: &'a Overlay,
        lower: &'a Lower,
        items: &'a [Item],
    ) -> SealContents<'a> {
        SealContents {
            opts,
            overlay,
            lower,
            direct: DirectLower::new(lower),
            items,
            stamps: items
                .iter()
                .enumerate()
                .filter(|(_, it)| {
                    matches!(&it.kind, ItemKind::File(f) if matches!(f.from, Source::Upper(_)))
                })
                .map(|(i, _)| (i, OnceLock::new()))
                .collect(),
        }
    }
}

/// Size, mtime and ctime of an upper data file: any write changes them.
type Stamp = (u64, i64, i64, i64, i64);

fn stamp_of(file: &File, path: &str) -> Result<Stamp> {
    let m = file.metadata().map_err(|e| Error::Upper {
        path: Some(path.to_string()),
        context: format!("{path}: stat"),
        source: e,
    })?;
    Ok((
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

fn changed_while_sealing(path: &str) -> Error {
    Error::Refused {
        path: path.to_string(),
        kind: crate::packet::error::ErrorKind::ChangedWhileSealing,
        reason: "its upper data file changed while the seal read it (only the daemon may write the upper directory)".into(),
    }
}

/// Reading one file for the seal.
pub(super) enum SealReader<'a> {
    /// From the old packet, at an absolute offset.
    Lower {
        packet: &'a Packet,
        direct: Option<&'a DirectLower>,
        pos: u64,
    },
    /// From an upper data file.
    Upper {
        file: Arc<File>,
        pos: u64,
        path: &'a str,
        stamp: &'a OnceLock<Stamp>,
    },
}

impl SealContents<'_> {
    /// The bytes of the lower packet that `entries` (bytes `window` of
    /// each, when given) are read from, as runs in their order, files
    /// closer than [`RUN_GAP`] in one run.
    fn lower_runs(
        &self,
        entries: std::ops::Range<usize>,
        window: Option<(u64, u64)>,
    ) -> Vec<std::ops::Range<u64>> {
        let p = &self.lower.packet;
        let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
        for it in &self.items[entries] {
            let ItemKind::File(f) = &it.kind else {
                continue;
            };
            let Source::Lower(idx) = f.from else { continue };
            let (off, len) =
                window.map_or((0, f.size), |(o, l)| (o, l.min(f.size.saturating_sub(o))));
            if len == 0 {
                continue;
            }
            let start = p.content_offset(idx as usize) + off;
            match runs.last_mut() {
                Some(r) if start >= r.end && start - r.end <= RUN_GAP => r.end = start + len,
                _ => runs.push(start..start + len),
            }
        }
        runs
    }
}

impl Contents for SealContents<'_> {
    type Error = Error;
    type Reader<'a>
        = SealReader<'a>
    where
        Self: 'a;

    fn check(&self, i: usize) -> Check {
        match &self.items[i].kind {
            ItemKind::File(f) => match (f.from, f.reuse) {
                // A whole-file hash a `/2` parent does not carry.
                (Source::Lower(_), Some(_))
                    if self.opts.version.whole_file_hash(f.size)
                        && !self.lower.manifest().version.whole_file_hash(f.size) =>
                {
                    Check::Compute
                }
                (Source::Lower(idx), Some(_)) => {
                    if self.lower.verifier.all_verified(&self.lower.packet, idx) {
                        Check::Trust
                    } else {
                        Check::Verify
                    }
                }
                _ => Check::Compute,
            },
            _ => Check::Trust,
        }
    }

    /// A reused lower file with chunks, until a seal has checked its whole
    /// hash (every file of a packet this daemon wrote is checked).
    fn check_whole(&self, i: usize) -> bool {
        match &self.items[i].kind {
            // Only a `/1` packet's whole-file hash, copied from a `/1` parent.
            ItemKind::File(f)
                if !self.opts.version.whole_file_hash(f.size)
                    || !self.lower.manifest().version.whole_file_hash(f.size) =>
            {
                false
            }
            ItemKind::File(f) => match (f.from, f.reuse) {
                (Source::Lower(idx), Some(_)) => {
                    !self.lower.verifier.whole_checked(&self.lower.packet, idx)
                }
                _ => false,
            },
            _ => false,
        }
    }

    fn prefetch(&self, entries: std::ops::Range<usize>, window: Option<(u64, u64)>) {
        if self.direct.is_some() {
            // Direct reads skip the page cache this would fill.
            return;
        }
        let p = &self.lower.packet;
        if p.backing().round_trips() {
            // A remote parent: each piece is fetched by the worker that
            // assembles it (`ready`), several at a time.
            return;
        }
        let runs = self.lower_runs(entries, window);
        // The lower bytes these entries come from, as one range of the old
        // packet when they lie close together (they mostly keep their order).
        let (lo, hi) = runs.iter().fold((u64::MAX, 0), |(lo, hi), r| {
            (lo.min(r.start), hi.max(r.end))
        });
        let sum: u64 = runs.iter().map(|r| r.end - r.start).sum();
        if sum > 0 && hi - lo <= 2 * sum + (1 << 20) {
            p.backing().will_need(lo..hi);
        }
    }

    fn round_trips(&self) -> bool {
        self.lower.packet.backing().round_trips()
    }

    fn ready(&self, entries: std::ops::Range<usize>, window: Option<(u64, u64)>) -> Result<()> {
        let p = &self.lower.packet;
        if !p.backing().round_trips() {
            return Ok(());
        }
        for r in self.lower_runs(entries, window) {
            p.backing()
                .fill_planned(r)
                .map_err(|e| Error::packet_io(p, e))?;
        }
        Ok(())
    }

    fn open(&self, i: usize) -> Result<SealReader<'_>> {
        self.opts.refuse_if_cancelled()?;
        let ItemKind::File(f) = &self.items[i].kind else {
            return Err(Error::NotFound);
        };
        let path = self.items[i].path.as_str();
        match f.from {
            Source::Lower(idx) => {
                let p = &self.lower.packet;
                let e = &p.manifest.entries[idx as usize];
                // Positional reads: every reader shares the packet's file.
                Ok(SealReader::Lower {
                    packet: p,
                    direct: self.direct.as_ref(),
                    pos: p.layout.data_offset(idx as usize, e),
                })
            }
            Source::Upper(id) => {
                // The stamp is taken before the first read, and must match
                // the size the seal recorded, at every open and every end.
                let file = self.overlay.upper.data(id)?;
                let cell = self.stamps.get(&i).ok_or(Error::NotFound)?;
                let now = stamp_of(&file, path)?;
                if *cell.get_or_init(|| now) != now || now.0 != f.size {
                    return Err(changed_while_sealing(path));
                }
                Ok(SealReader::Upper {
                    file,
                    pos: 0,
                    path,
                    stamp: cell,
                })
            }
        }
    }
}

impl ContentReader for SealReader<'_> {
    type Error = Error;

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        match self {
            SealReader::Lower {
                packet,
                direct,
                pos,
            } => {
                // A remote packet's content is fetched and verified into
                // its spool first (nothing for a local one).
                match direct {
                    Some(d) => d.read_exact_at(packet.backing(), buf, *pos),
                    None => packet.backing().read_planned_at(buf, *pos),
                }
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        // Its length was checked when the seal began.
                        Error::PacketChanged {
                            packet: crate::packet::path::shown_path(packet.path()),
                        }
                    } else {
                        Error::packet_io(packet, e)
                    }
                })?;
                *pos += buf.len() as u64;
            }
            SealReader::Upper {
                file, pos, path, ..
            } => {
                file.read_exact_at(buf, *pos).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        Error::Refused {
                            path: path.to_string(),
                            kind: crate::packet::error::ErrorKind::ChangedWhileSealing,
                            reason: "its upper data file is shorter than when the seal began \
                                     (only the daemon may write the upper directory)"
                                .into(),
                        }
                    } else {
                        Error::Upper {
                            path: Some(path.to_string()),
                            context: format!("{path}: read"),
                            source: e,
                        }
                    }
                })?;
                *pos += buf.len() as u64;
            }
        }
        Ok(())
    }

    fn skip(&mut self, n: u64) -> Result<()> {
        match self {
            SealReader::Lower { pos, .. } | SealReader::Upper { pos, .. } => *pos += n,
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        let SealReader::Upper {
            file,
            path,
            stamp: seen,
            ..
        } = self
        else {
            return Ok(());
        };
        if seen.get() != Some(&stamp_of(&file, path)?) {
            return Err(changed_while_sealing(path));
        }
        Ok(())
    }
}

/// Reads of the parent packet with `O_DIRECT`, a span of about a piece at a
/// time per thread, for a parent this daemon wrote itself (around the page
/// cache, so not in it): filling the cache only to read each byte once
/// cost the second turn of a rebased session 0.3-0.5 s on 1 GiB here.
/// A parent from elsewhere may be in the cache, and is read through it.
pub(super) struct DirectLower {
    file: File,
    len: u64,
    /// The span each thread read last.
    spans: parking_lot::Mutex<HashMap<std::thread::ThreadId, Span>>,
    /// Set when a direct read is refused: the rest goes through the cache.
    refused: std::sync::atomic::AtomicBool,
}

/// Bytes `start..start + valid` of the packet.
#[derive(Default)]
struct Span {
    buf: crate::output::AlignedBuf,
    start: u64,
    valid: usize,
}

/// A direct read covers at least this much (a piece of the packet being
/// written comes from about that much of the parent).
const SPAN: u64 = crate::packet::format::CHUNK_SIZE;

impl DirectLower {
    pub(super) fn new(lower: &Lower) -> Option<DirectLower> {
        if !lower.verifier.written_here() {
            return None;
        }
        let file = crate::sys::reopen_direct(lower.packet.backing().local()?, false)?;
        Some(DirectLower {
            file,
            len: lower.packet.len(),
            spans: parking_lot::Mutex::new(HashMap::new()),
            refused: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Fills `buf` from `pos`, from this thread's span or a new one;
    /// through `cached` (the packet's own handle) once direct reads fail.
    fn read_exact_at(
        &self,
        cached: &crate::packet::backing::Backing,
        buf: &mut [u8],
        pos: u64,
    ) -> std::io::Result<()> {
        if !self.refused.load(Ordering::Relaxed) {
            let tid = std::thread::current().id();
            let mut span = self.spans.lock().remove(&tid).unwrap_or_default();
            let r = self.read_via_span(&mut span, buf, pos);
            self.spans.lock().insert(tid, span);
            match r {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!(
                        "direct read refused; reading the parent through the page cache"
                    );
                    self.refused.store(true, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        cached.read_planned_at(buf, pos)
    }

    fn read_via_span(&self, span: &mut Span, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let align = crate::output::DIRECT_ALIGN as u64;
        let end = pos + buf.len() as u64;
        if pos < span.start || end > span.start + span.valid as u64 {
            let start = pos - pos % align;
            let want = (end - start)
                .max(SPAN)
                .min(self.len.next_multiple_of(align).saturating_sub(start))
                .next_multiple_of(align);
            span.valid = 0; // until the new bytes are in
            let window = span.buf.window(want as usize);
            let mut got = 0;
            while got < window.len() {
                match self.file.read_at(&mut window[got..], start + got as u64) {
                    Ok(0) => break,
                    // A short read ends at the end of the file (or the next
                    // read would not be aligned): what is here is all.
                    Ok(n) if n % align as usize != 0 => {
                        got += n;
                        break;
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            span.start = start;
            span.valid = got;
            if end > start + got as u64 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        let at = (pos - span.start) as usize;
        buf.copy_from_slice(&span.buf.bytes()[at..at + buf.len()]);
        Ok(())
    }
}
