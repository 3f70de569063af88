//! Where a readable packet's bytes are: a [`Backing`].
//!
//! A packet is read from a local file, or (mounted, or sealed, from an
//! object store) from a [`Spool`]: a local copy of the remote object that
//! holds only what was fetched and hashed against the manifest. The two
//! are one type with two variants, so that every read goes through a
//! method that does the right thing for each: a spooled packet's bytes
//! cannot be read without first being fetched and verified (the spool's
//! file is not reachable from here), and a local one is read as it is
//! (the layer above hashes what it serves).
//!
//! The one opener of a remote packet read this way,
//! [`Packet::open_remote`], is here too: a mount, an offline seal and a
//! rebase onto an uploaded packet all open it with the node's
//! [`RemoteReading`] (the cache, the spool's options, the trace prefetch).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use super::error::{Error, Result};
use super::format::Limits;
use super::layout::Layout;
use super::manifest::Manifest;
use super::reader::{Packet, Source};
use crate::store::cache::Cache;
use crate::store::spool::{Gaps, Prefetch, Spool, SpoolOptions, SpoolReport};
use crate::store::{Location, ReadAt, Settings};

/// The bytes of a readable packet (see the module's text).
pub enum Backing {
    /// A packet file on this machine, read as it is: whoever serves its
    /// content hashes it first (a mount, lazily; `verify`, all of it).
    File(File),
    /// A remote object's spool: every read of content first fills the
    /// units it touches, each hashed against the manifest on arrival.
    Spool(Arc<Spool>),
}

/// What identifies the bytes a packet's backing holds: for a file, its
/// length, mtime and ctime (which move when someone writes it); for a
/// spool, its length only (the spool is this process's own file, written
/// as it fills; the object is pinned by its ETag in the store layer).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Stamp {
    /// The length.
    pub len: u64,
    /// The mtime (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// The ctime (seconds, nanoseconds).
    pub ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file's metadata.
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

impl Backing {
    /// Fills `buf` with the packet's bytes at `at`, for a reader whose next
    /// read is not known (a mount's): a spool fetches and verifies the
    /// units the range touches first (a miss brings the units around it,
    /// and a reader moving forward gets read-ahead). A failure of the store
    /// is an I/O error whose inner error is the store's
    /// ([`crate::store::Error`]).
    pub fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.read_exact_at(buf, at),
            Backing::Spool(s) => s.read_exact_at(buf, at).map_err(io::Error::other),
        }
    }

    /// [`Backing::read_at`] for a reader that asks for whole runs it will
    /// read and nothing around them (a seal writing a packet in order): a
    /// spool fetches only the units of the range, in large requests, and
    /// reads nothing ahead ([`Spool::ensure_planned`]).
    pub fn read_planned_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.read_exact_at(buf, at),
            Backing::Spool(s) => s.read_planned_at(buf, at).map_err(io::Error::other),
        }
    }

    /// Makes the content in `range` ready to read with no wait: a spool
    /// fetches and verifies the units it touches (as a mount's read does);
    /// a file is asked for it from the disk, without waiting.
    pub fn fill(&self, range: Range<u64>) -> io::Result<()> {
        match self {
            Backing::File(f) => {
                crate::sys::will_need(f, range.start, range.end - range.start);
                Ok(())
            }
            Backing::Spool(s) if !range.is_empty() => s.ensure(range).map_err(io::Error::other),
            Backing::Spool(_) => Ok(()),
        }
    }

    /// [`Backing::fill`] for a planned reader ([`Backing::read_planned_at`]).
    pub fn fill_planned(&self, range: Range<u64>) -> io::Result<()> {
        match self {
            Backing::File(f) => {
                crate::sys::will_need(f, range.start, range.end - range.start);
                Ok(())
            }
            Backing::Spool(s) if !range.is_empty() => {
                s.ensure_planned(range).map_err(io::Error::other)
            }
            Backing::Spool(_) => Ok(()),
        }
    }

    /// Asks the disk for `range` of a packet file without waiting (a
    /// spool's content is fetched by its reads, not hinted).
    pub fn will_need(&self, range: Range<u64>) {
        if let Backing::File(f) = self {
            crate::sys::will_need(f, range.start, range.end - range.start);
        }
    }

    /// Whether its content has been hashed against the manifest by the
    /// time a read returns it (a spool's units), so that a reader need
    /// not hash it again; a file's content is as the disk holds it.
    pub fn verifies_content(&self) -> bool {
        matches!(self, Backing::Spool(_))
    }

    /// Whether each read of content not read before costs a round trip
    /// to a store (a spool), so that a reader should ask for several
    /// pieces at once rather than one after another.
    pub fn round_trips(&self) -> bool {
        matches!(self, Backing::Spool(_))
    }

    /// What identifies its bytes now (see [`Stamp`]).
    pub fn stamp(&self, len: u64) -> io::Result<Stamp> {
        match self {
            Backing::File(f) => Ok(Stamp::of(&f.metadata()?)),
            Backing::Spool(_) => Ok(Stamp {
                len,
                mtime: (0, 0),
                ctime: (0, 0),
            }),
        }
    }

    /// The packet file, for what only a local file allows (a second
    /// handle for direct reads, its identity on the disk); `None` for a
    /// spool, whose file is the store layer's own.
    pub fn local(&self) -> Option<&File> {
        match self {
            Backing::File(f) => Some(f),
            Backing::Spool(_) => None,
        }
    }

    /// The spool of a remote packet: its location, its object pinned to
    /// an ETag, what it has fetched.
    pub fn spool(&self) -> Option<&Arc<Spool>> {
        match self {
            Backing::File(_) => None,
            Backing::Spool(s) => Some(s),
        }
    }

    /// Whether `path` names this packet file: the open file, by device and
    /// inode, not the path it was opened by. No path names a spool.
    pub fn serves(&self, path: &Path) -> bool {
        let Backing::File(f) = self else {
            return false;
        };
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let served = f.metadata().map(id).ok();
        served.is_some() && std::fs::metadata(path).map(id).ok() == served
    }

    /// Offers bytes of content starting at byte `start` of the packet,
    /// from a copy the caller holds (what a seal just uploaded, from its
    /// upper directory): a spool keeps the units among them that match the
    /// manifest (and adds them to the cache), so that reading them costs no
    /// request. Returns how many bytes were taken (a file takes none).
    pub fn offer(&self, start: u64, bytes: &[u8]) -> u64 {
        let Backing::Spool(s) = self else { return 0 };
        let mut taken = 0;
        for u in s.units_of(&(start..start + bytes.len() as u64)) {
            let w = &s.units()[u];
            let Some(piece) = w
                .start
                .checked_sub(start)
                .and_then(|at| bytes.get(at as usize..(at + w.len) as usize))
            else {
                continue;
            };
            if s.supply(u, piece) {
                taken += w.len;
            }
        }
        taken
    }

    /// What a spool has done so far (`status`'s `remote`).
    pub fn report(&self) -> Option<SpoolReport> {
        self.spool().map(|s| s.report())
    }

    /// Ends a spool's work when its mount ends: its background fetches
    /// stop and what it fetched reaches the cache ([`Spool::finish`]).
    pub fn finish(&self) {
        if let Backing::Spool(s) = self {
            s.finish();
        }
    }
}

impl Source for Backing {
    fn source_len(&self) -> Result<u64> {
        match self {
            Backing::File(f) => f.source_len(),
            Backing::Spool(s) => Ok(s.remote().len()),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64, file_len: u64) -> Result<()> {
        match self {
            Backing::File(f) => Source::read_at(f, buf, offset, file_len),
            Backing::Spool(s) => Ok(s.read_exact_at(buf, offset)?),
        }
    }
}

/// How this node reads remote packets whose content it serves or seals:
/// the store's settings, the node-wide cache, and the spool's options
/// (`--cache`, `--cache-size`, `--max-memory`, `--block-size`,
/// `--prefetch`), given once by the command line and kept by a mount for
/// the packets it moves onto.
#[derive(Clone)]
pub struct RemoteReading {
    /// How requests behave.
    pub settings: Settings,
    /// The node-wide content cache (`None`: none, a test's choice).
    pub cache: Option<Arc<Cache>>,
    /// How the spool fetches.
    pub spool: SpoolOptions,
}

impl Packet {
    /// Opens the remote packet at `location` for reading its content (a
    /// mount, an offline seal, a rebase onto an upload): its manifest
    /// member is read and checked (one request when it is small), and its
    /// content is read through a spool, filled on demand from the cache
    /// and the object and verified unit by unit (see
    /// [`crate::store::spool`]), with `--prefetch trace` started here. The
    /// spool is made in the cache's directory (so cached content is copied
    /// locally), else the system's temporary directory.
    pub fn open_remote(
        location: &Location,
        limits: &Limits,
        reading: &RemoteReading,
    ) -> Result<Packet> {
        let t = std::time::Instant::now();
        let object: Box<dyn ReadAt> = Box::new(crate::store::open_remote(
            location,
            &reading.settings,
            crate::store::FIRST_FETCH,
        )?);
        let p = Packet::from_source(object, Path::new(&location.shown()), limits)?;
        let units = p.units();
        let dir = match &reading.cache {
            Some(c) => c.tmp_dir(),
            None => std::env::temp_dir(),
        };
        let gaps = gaps_of(&p.manifest, &p.layout);
        let (file, path) = (p.file, p.path);
        let spool = Spool::new(
            location.clone(),
            file,
            units,
            Some(gaps),
            &dir,
            reading.cache.clone(),
            reading.spool,
        )
        .map_err(|e| Error::io("cannot make the spool of the remote packet", e))?;
        tracing::debug!(location = %location.shown(), elapsed = ?t.elapsed(), "remote packet opened");
        let packet = Packet {
            file: Backing::Spool(spool),
            path,
            manifest: p.manifest,
            digest: p.digest,
            layout: p.layout,
            parents: p.parents,
        };
        if reading.spool.prefetch == Prefetch::Trace {
            prefetch_trace(&packet, location, &reading.settings);
        }
        Ok(packet)
    }
}

/// What the bytes of a packet between its content are (member headers as
/// the manifest implies them, zero padding, the end marker), for the
/// spool to check the bytes between units it fetches: the first gap
/// starts after the manifest member.
pub fn gaps_of(manifest: &Manifest, layout: &Layout) -> Gaps {
    let (manifest, layout) = (Arc::new(manifest.clone()), Arc::new(layout.clone()));
    let from = if layout.is_empty() {
        layout.end_offset()
    } else {
        layout.member_start(0)
    };
    Gaps {
        from,
        check: Arc::new(move |at, bytes| outside_content_is(&manifest, &layout, at, bytes)),
    }
}

/// Whether `bytes` at `at` are the packet's bytes there, for a range
/// holding no content (headers, padding, the end marker); `false` for a
/// range that holds content, which has its hashes instead.
fn outside_content_is(manifest: &Manifest, layout: &Layout, at: u64, bytes: &[u8]) -> bool {
    let end = at + bytes.len() as u64;
    let first = if layout.is_empty() {
        layout.end_offset()
    } else {
        layout.member_start(0)
    };
    if at < first || end > layout.total_len() {
        return false;
    }
    let n = layout.len();
    // The first member that ends after `at`.
    let mut i = {
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if layout.member_end(mid) <= at {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let mut header = Vec::new();
    let mut pos = at;
    let zeros = |r: Range<u64>| {
        bytes[(r.start - at) as usize..(r.end - at) as usize]
            .iter()
            .all(|&b| b == 0)
    };
    while pos < end {
        let Some(e) = manifest.entries.get(i).filter(|_| i < n) else {
            // The end-of-archive marker.
            return zeros(pos..end);
        };
        let (start, data) = (layout.member_start(i), layout.data_offset(i, e));
        let (content_end, member_end) = (data + e.size(), layout.member_end(i));
        if pos < data {
            header.clear();
            super::layout::write_entry_headers(e, &mut header);
            let stop = data.min(end);
            let want = &header[(pos - start) as usize..(stop - start) as usize];
            if bytes[(pos - at) as usize..(stop - at) as usize] != *want {
                return false;
            }
            pos = stop;
        } else if pos < content_end {
            return false;
        } else {
            let stop = member_end.min(end);
            if !zeros(pos..stop) {
                return false;
            }
            pos = stop;
        }
        if pos >= member_end {
            i += 1;
        }
    }
    true
}

/// Where the trace sidecar of the packet at `location` is: `KEY.trace`
/// beside an S3 object, `PATH.trace` beside an URL's path (none for an
/// URL with a query: a presigned URL's signature covers its path).
fn trace_location(location: &Location) -> Option<Location> {
    match location {
        Location::Local(p) => {
            let mut name = p.as_os_str().to_owned();
            name.push(".trace");
            Some(Location::Local(name.into()))
        }
        Location::S3 { bucket, key } => Some(Location::S3 {
            bucket: bucket.clone(),
            key: format!("{key}.trace"),
        }),
        Location::Http(u) if u.query().is_none() => {
            let mut u = u.clone();
            u.set_path(&format!("{}.trace", u.path()));
            Some(Location::Http(u))
        }
        Location::Http(_) => None,
    }
}

/// `--prefetch trace`: fetches the trace sidecar beside the remote packet
/// `p` (at `location`) on a thread of its own (the mount does not wait for
/// it), and has the spool prefetch the units it names, in its order. A
/// sidecar that is not there, or not a trace, prefetches nothing.
fn prefetch_trace(p: &Packet, location: &Location, settings: &Settings) {
    let (Some(spool), Some(at)) = (p.file.spool().cloned(), trace_location(location)) else {
        return;
    };
    let manifest = p.manifest.clone();
    let settings = settings.clone();
    let spawned = std::thread::Builder::new()
        .name("trace".into())
        .spawn(move || {
            use super::trace::{MAX_TRACE_BYTES, Trace};
            let fetched = crate::store::open_remote(&at, &settings, MAX_TRACE_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|object| {
                    let len = object.len();
                    if len > MAX_TRACE_BYTES {
                        return Err(format!("{len} bytes, more than a trace holds"));
                    }
                    let mut buf = vec![0; len as usize];
                    object
                        .read_exact_at(&mut buf, 0, object.deadline())
                        .map_err(|e| e.to_string())?;
                    Ok(buf)
                });
            let trace = match fetched.map(|b| Trace::parse(&b)) {
                Ok(Some(t)) => t,
                Ok(None) => {
                    tracing::warn!(trace = at.shown(), "not a trace; prefetching nothing");
                    return;
                }
                Err(e) => {
                    tracing::debug!(trace = at.shown(), error = %e, "no trace; prefetching nothing");
                    return;
                }
            };
            let units = trace.units(&manifest, spool.units());
            tracing::debug!(trace = at.shown(), units = units.len(), "prefetching what the last turn read");
            if let Err(e) = spool.prefetch(units) {
                tracing::warn!(error = %e, "cannot start the prefetch");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start fetching the trace");
    }
}
