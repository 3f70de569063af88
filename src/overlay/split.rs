//! Writes the kernel may have cut in two. Without a writeback cache the
//! kernel sends one `WRITE` per `write` call (up to the mount's `max_write`),
//! except that it ends a request after a page it holds only in part: a
//! write that starts inside a page not in its cache (as an append does)
//! and runs past that page's end goes as two requests, the rest following
//! the first's reply while the writer still holds the inode's lock. A seal
//! taken between the two would hold half of one `write` call. So a request
//! that starts inside a page and ends on a page boundary is noted until the
//! request that continues it arrives, and a seal waits for that (never
//! longer than [`SETTLE`] after the request) before it holds changes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Ino;

/// How long a seal waits, after a request that may be the first half of a
/// cut write, for the second. The kernel sends it as soon as the first is
/// answered; this covers a writer preempted in between on a busy machine.
/// A write that really ended there costs a seal at most this much.
pub const SETTLE: Duration = Duration::from_millis(100);

/// The requests that may be first halves, with when they were answered.
#[derive(Default)]
pub struct Splits {
    open: Mutex<Vec<(Ino, u64, Instant)>>,
    /// `open` is not empty (read without the lock on every write).
    any: AtomicBool,
}

impl Splits {
    /// Notes a `WRITE` of `len` bytes at `offset` to `ino`, done; `page` is
    /// the kernel's page size.
    pub fn wrote(&self, ino: Ino, offset: u64, len: u64, page: u64) {
        let end = offset.saturating_add(len);
        let first_half = len > 0 && offset % page != 0 && end % page == 0;
        if !first_half && !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut open = self.open.lock();
        // The request continuing a cut write starts where the first ended.
        open.retain(|&(i, e, _)| !(i == ino && e == offset));
        if first_half {
            open.push((ino, end, Instant::now()));
        }
        self.any.store(!open.is_empty(), Ordering::Release);
    }

    /// How long until no noted request can still be a first half waiting
    /// for its second (zero when none is). Forgets the ones past waiting
    /// for.
    pub fn unsettled(&self, now: Instant) -> Duration {
        if !self.any.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let mut open = self.open.lock();
        open.retain(|&(_, _, t)| now.saturating_duration_since(t) < SETTLE);
        self.any.store(!open.is_empty(), Ordering::Release);
        open.iter()
            .map(|&(_, _, t)| SETTLE.saturating_sub(now.saturating_duration_since(t)))
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_ending_on_a_page_boundary_waits_for_its_continuation() {
        let s = Splits::default();
        let t = Instant::now();
        // Page-aligned writes, and writes inside one page, are whole.
        s.wrote(7, 0, 4096, 4096);
        s.wrote(7, 4096, 100, 4096);
        assert_eq!(s.unsettled(t), Duration::ZERO);
        // An append from 4196 to the page end may be the first half.
        s.wrote(7, 4196, 3996, 4096);
        assert!(s.unsettled(Instant::now()) > Duration::ZERO);
        // Another file's write, or one elsewhere in this file, continues
        // nothing.
        s.wrote(8, 8192, 10, 4096);
        s.wrote(7, 0, 10, 4096);
        assert!(s.unsettled(Instant::now()) > Duration::ZERO);
        // The second half starts where the first ended.
        s.wrote(7, 8192, 57, 4096);
        assert_eq!(s.unsettled(Instant::now()), Duration::ZERO);
    }

    #[test]
    fn a_first_half_without_a_second_is_forgotten_after_settle() {
        let s = Splits::default();
        s.wrote(3, 10, 4086, 4096);
        let later = Instant::now() + SETTLE;
        assert_eq!(s.unsettled(later), Duration::ZERO);
        assert!(!s.any.load(Ordering::Acquire));
    }
}
