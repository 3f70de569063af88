//! Copy-up by chunk: a change to a lower file larger than one chunk copies
//! into the upper directory only the chunks it touches (none for a write
//! that covers whole chunks); the others keep being read from the packet,
//! verified as any lower read. See docs/upper-format.md ("Copy-up by
//! chunk") for the records and why every order of steps is crash-safe,
//! and docs/SEMANTICS.md ("Copy-up") for what an application sees.
//!
//! The one rule every change follows: the data file first gets the bytes
//! a chunk will show (the lower chunk's, then the change), then the `hold`
//! record goes to the journal, then the chunk's bit is cleared. Until the
//! bit is clear the chunk is read from the packet, so a reader, or a
//! remount after `SIGKILL`, sees the chunk before the change or after it,
//! never a half-made one. Only a change of size shows before its record
//! (the size is the data file's): a remount finds the chunks it cut or
//! moved past the end by the size, and holds them then
//! ([`Overlay::hold_invalid_chunks`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::error::{Error, Result};
use super::ino::Ino;
use super::journal::Record;
use super::node::{ChunkMap, Content};
use super::state::{Lower, Ref};
use super::{Overlay, now};
use crate::packet::format::CHUNK_SIZE;

/// Whether a change of a lower file of `size` bytes copies it up by
/// chunk: only a file with chunks, so a small file stays whole.
pub(super) fn by_chunk(size: u64) -> bool {
    size > CHUNK_SIZE
}

/// The chunks `offset .. end` touches (empty for an empty range).
fn touched(offset: u64, end: u64) -> std::ops::Range<u64> {
    if end <= offset {
        return 0..0;
    }
    offset / CHUNK_SIZE..end.div_ceil(CHUNK_SIZE)
}

/// Contiguous `[first, end)` runs of the chunk numbers `ks` (in order).
fn runs(ks: &[u64]) -> Vec<[u64; 2]> {
    let mut out: Vec<[u64; 2]> = Vec::new();
    for &k in ks {
        match out.last_mut() {
            Some(r) if r[1] == k => r[1] = k + 1,
            _ => out.push([k, k + 1]),
        }
    }
    out
}

/// The data file's length.
fn len_of(file: &File) -> Result<u64> {
    Ok(file.metadata().map_err(Error::upper("stat"))?.len())
}

impl Overlay {
    /// The chunk map of `ino`, when it is a file copied up by chunk, with
    /// its data file and the lower layer the map refers to.
    pub(super) fn chunk_map(&self, ino: Ino) -> Option<(u64, Arc<ChunkMap>, Arc<Lower>)> {
        let st = self.view();
        match st.get(&st.lower, ino)? {
            Ref::Node(n) => match (n.content, &n.chunks) {
                (Content::Upper(id), Some(map)) => Some((id, map.clone(), st.lower.clone())),
                _ => None,
            },
            Ref::Lower(_) => None,
        }
    }

    /// Reads `size` bytes at `offset` of a file copied up by chunk into
    /// `out`: each chunk from the packet while it is the lower entry's
    /// (verified), from the data file once it holds it. Short at the end.
    pub(super) fn read_chunked(
        &self,
        id: u64,
        map: &ChunkMap,
        lower: &Arc<Lower>,
        offset: u64,
        size: u64,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let file = self.upper.data(id)?;
        let end = len_of(&file)?.min(offset.saturating_add(size));
        let mut pos = offset;
        while pos < end {
            let k = pos / CHUNK_SIZE;
            let n = ((k + 1) * CHUNK_SIZE).min(end) - pos;
            // A bit read set is a chunk whose data-file bytes may not be
            // there yet: the packet's are the ones to serve.
            if map.is_lower(k) && pos + n <= k * CHUNK_SIZE + map.lower_len(k) {
                let v = &lower.verifier;
                v.read(&lower.packet, map.lower, pos, n, out)?;
                for a in v.ahead(&lower.packet, map.lower, pos, n) {
                    let lower = lower.clone();
                    let i = map.lower;
                    rayon::spawn(move || lower.verifier.verify_ahead(&lower.packet, i, a));
                }
            } else {
                let n32 = u32::try_from(n).unwrap_or(u32::MAX);
                let at = out.len();
                crate::sys::read_append_at(&file, pos, n32, out).map_err(Error::upper("read"))?;
                if out.len() - at < n as usize {
                    break; // the data file ended (cut while read)
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// Writes the lower bytes of chunk `k` into `file` at their place,
    /// leaving holes for runs of zero blocks (after punching the range, so
    /// that bytes a change left there and never committed go).
    fn copy_chunk(&self, lower: &Lower, map: &ChunkMap, file: &File, k: u64) -> Result<()> {
        let len = map.lower_len(k);
        let mut buf = Vec::with_capacity(len as usize);
        lower
            .verifier
            .read(&lower.packet, map.lower, k * CHUNK_SIZE, len, &mut buf)?;
        let at = k * CHUNK_SIZE;
        let punched = crate::sys::fallocate(
            file,
            crate::sys::FALLOC_PUNCH_HOLE | crate::sys::FALLOC_KEEP_SIZE,
            at,
            len,
        )
        .is_ok();
        if punched {
            crate::sys::write_sparse(file, &buf, at).map_err(Error::upper("copy-up"))?;
        } else {
            file.write_all_at(&buf, at)
                .map_err(Error::upper("copy-up"))?;
        }
        Ok(())
    }

    /// Records that the data file of `ino` holds chunks `ks` from now on
    /// (journal first, then the bits), under the chunk lock.
    fn hold(&self, ino: Ino, ks: &[u64]) -> Result<()> {
        if ks.is_empty() {
            return Ok(());
        }
        let rec = Record::Hold {
            t: now(),
            ino,
            chunks: runs(ks),
        };
        // The window a kill may hit: the change made, its record not.
        let bar = crate::barrier::from_env();
        crate::barrier::wait(bar.as_deref(), crate::barrier::Point::ChunkHold);
        self.commit_unless_unnamed(&mut self.state.write(), ino, rec)?;
        self.stats
            .chunks_held
            .fetch_add(ks.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// `write` of `data` at `offset` to a file copied up by chunk: the
    /// lower chunks it touches, and the one a growth moves the end of, get
    /// their lower bytes first (those it covers wholly do not), then the
    /// data, then their `hold` record. Returns the bytes written (short
    /// when the disk took only part).
    pub(super) fn write_chunked(
        &self,
        ino: Ino,
        id: u64,
        map: &ChunkMap,
        lower: &Lower,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        let file = self.upper.data(id)?;
        let end = offset + data.len() as u64;
        let needed = |size: u64| -> Vec<u64> {
            let t = touched(offset, end);
            let mut ks: Vec<u64> = map.lower_chunks().filter(|k| t.contains(k)).collect();
            ks.extend(map.invalid_at(size.max(end)));
            ks.sort_unstable();
            ks.dedup();
            ks
        };
        if needed(len_of(&file)?).is_empty() {
            return write_all(&file, offset, data);
        }
        let _one = self.chunk_copy.lock();
        let ks = needed(len_of(&file)?);
        // A chunk whose every lower byte the write replaces is not copied.
        let covered = |k: u64| offset <= k * CHUNK_SIZE && k * CHUNK_SIZE + map.lower_len(k) <= end;
        for &k in ks.iter().filter(|&&k| !covered(k)) {
            self.copy_chunk(lower, map, &file, k)?;
        }
        let done = write_all(&file, offset, data)?;
        // A covered chunk the write did not reach the end of stays the
        // packet's (its bytes here are never shown; the next change copies).
        let reached = offset + done as u64;
        let held: Vec<u64> = ks
            .into_iter()
            .filter(|&k| !covered(k) || k * CHUNK_SIZE + map.lower_len(k) <= reached)
            .collect();
        self.hold(ino, &held)?;
        Ok(done)
    }

    /// Sets the size of a file copied up by chunk: the chunk the new size
    /// cuts, or the last one a growth moves the end of, gets its lower
    /// bytes first; then the size; then the `hold` record for every chunk
    /// that is no longer the lower entry's (cut, or past the end).
    pub(super) fn resize_chunked(
        &self,
        ino: Ino,
        id: u64,
        map: &ChunkMap,
        lower: &Lower,
        size: u64,
    ) -> Result<()> {
        let file = self.upper.data(id)?;
        let _one = self.chunk_copy.lock();
        let ks = map.invalid_at(size);
        for &k in &ks {
            // Chunks wholly past the new end lose their bytes: nothing to copy.
            if k * CHUNK_SIZE < size {
                self.copy_chunk(lower, map, &file, k)?;
            }
        }
        file.set_len(size).map_err(Error::upper("truncate"))?;
        self.hold(ino, &ks)
    }

    /// `fallocate` of a file copied up by chunk: every lower chunk of the
    /// range, and the one a growth moves the end of, is copied first
    /// (whatever the mode: allocating keeps their bytes), then held.
    pub(super) fn fallocate_chunked(
        &self,
        ino: Ino,
        id: u64,
        map: &ChunkMap,
        lower: &Lower,
        (offset, length, mode): (u64, u64, i32),
    ) -> Result<()> {
        let file = self.upper.data(id)?;
        let _one = self.chunk_copy.lock();
        let end = offset.saturating_add(length);
        let grows = mode & crate::sys::FALLOC_KEEP_SIZE == 0;
        let size = len_of(&file)?;
        let t = touched(offset, end);
        let mut ks: Vec<u64> = map.lower_chunks().filter(|k| t.contains(k)).collect();
        if grows {
            ks.extend(map.invalid_at(size.max(end)));
        }
        ks.sort_unstable();
        ks.dedup();
        for &k in &ks {
            self.copy_chunk(lower, map, &file, k)?;
        }
        crate::sys::fallocate(&file, mode, offset, length).map_err(|e| {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                Error::NotSupported
            } else {
                Error::upper("fallocate")(e)
            }
        })?;
        self.hold(ino, &ks)
    }

    /// Makes the data file of a file copied up by chunk hold all of it
    /// (for a file that outlives its packet: one a rebase keeps on the
    /// mount). Nothing for any other file.
    pub(super) fn hold_all_chunks(&self, ino: Ino) -> Result<()> {
        let Some((id, map, lower)) = self.chunk_map(ino) else {
            return Ok(());
        };
        let file = self.upper.data(id)?;
        let _one = self.chunk_copy.lock();
        let ks: Vec<u64> = map.lower_chunks().collect();
        for &k in &ks {
            self.copy_chunk(&lower, &map, &file, k)?;
        }
        self.hold(ino, &ks)
    }

    /// At mount: holds the chunks a change of size left the lower entry's
    /// in the journal (the daemon stopped between the size and its
    /// record), so that no later growth can show them again.
    pub(super) fn hold_invalid_chunks(&self) -> Result<()> {
        let files: Vec<(Ino, u64, Arc<ChunkMap>)> = {
            let st = self.state.read();
            st.nodes
                .iter()
                .filter_map(|(&ino, n)| match (n.content, &n.chunks) {
                    (Content::Upper(id), Some(map)) => Some((ino, id, map.clone())),
                    _ => None,
                })
                .collect()
        };
        for (ino, id, map) in files {
            let size = len_of(&*self.upper.data(id)?)?;
            let ks = map.invalid_at(size);
            if !ks.is_empty() {
                tracing::info!(ino, chunks = ?ks, "holding chunks a change of size left behind");
                self.hold(ino, &ks)?;
            }
        }
        Ok(())
    }
}

/// Writes `data` at `offset`, answering the bytes written: short when the
/// disk took only part (the caller learns of the failure at its next
/// write), an error when it took none.
pub(super) fn write_all(file: &File, offset: u64, data: &[u8]) -> Result<usize> {
    let mut done = 0;
    while done < data.len() {
        match file.write_at(&data[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if done == 0 => return Err(Error::upper("write")(e)),
            Err(_) => break,
        }
    }
    if done == 0 && !data.is_empty() {
        return Err(Error::upper("write")(std::io::Error::from(
            std::io::ErrorKind::WriteZero,
        )));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_touched_chunks() {
        assert_eq!(runs(&[0, 1, 2, 5, 7, 8]), vec![[0, 3], [5, 6], [7, 9]]);
        assert_eq!(runs(&[]), Vec::<[u64; 2]>::new());
        let c = CHUNK_SIZE;
        assert_eq!(touched(0, 0), 0..0);
        assert_eq!(touched(c - 1, c), 0..1);
        assert_eq!(touched(c - 1, c + 1), 0..2);
        assert_eq!(touched(c, 2 * c), 1..2);
    }

    #[test]
    fn chunks_a_size_cannot_read_from_the_lower_entry() {
        let c = CHUNK_SIZE;
        // 2.5 chunks.
        let map = ChunkMap::all_lower(0, 2 * c + c / 2);
        let check = |size: u64, want: &[u64]| assert_eq!(map.invalid_at(size), want, "{size}");
        check(2 * c + c / 2, &[]);
        // Grown: the last chunk's end moved.
        check(2 * c + c / 2 + 1, &[2]);
        check(5 * c, &[2]);
        // Cut in the middle of chunk 1: it and what follows.
        check(c + 1, &[1, 2]);
        // Cut at a boundary: only what is past it.
        check(2 * c, &[2]);
        check(c, &[1, 2]);
        check(c - 1, &[0, 1, 2]);
        check(0, &[0, 1, 2]);
        map.hold(1);
        check(c + 1, &[2]);
        assert_eq!(map.lower_bytes(), c + c / 2);
        assert!(!map.is_empty());
        map.hold(0);
        map.hold(2);
        assert!(map.is_empty());
        // An exact number of chunks grows without any chunk moving.
        let even = ChunkMap::all_lower(0, 2 * c);
        assert_eq!(even.invalid_at(3 * c), Vec::<u64>::new());
        let wide = ChunkMap::all_lower(0, 130 * c);
        assert_eq!(wide.lower_chunks().count(), 130);
    }
}
