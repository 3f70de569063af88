//! The memory budget of a spool (`--max-memory`): every buffer it holds a
//! fetched body, a cache entry or a unit on its way to the cache in is
//! taken from it first, and given back when dropped. So it counts what is
//! held, not what is asked for: nothing is allocated past it, and a fetch
//! larger than a share of it is cut into pieces by the planner instead of
//! being let through.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};

use crate::store::Deadline;

/// Who asks: a read (which may use the whole budget), or work nobody
/// waits for (read-ahead, prefetch, the cache's writer), which together
/// hold at most half of it, so that reads always find room soon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// A read waiting for the bytes.
    Read,
    /// Work ahead of the reads.
    Background,
}

#[derive(Default)]
struct Held {
    all: u64,
    background: u64,
}

/// Bytes of buffers held, bounded by `max`.
pub struct Budget {
    held: Mutex<Held>,
    freed: Condvar,
    max: u64,
    /// The most held at once.
    peak: std::sync::atomic::AtomicU64,
}

/// A buffer of `len` bytes, taken from a [`Budget`].
pub struct Buffer<'a> {
    budget: &'a Budget,
    priority: Priority,
    /// The bytes (zeroed when taken).
    pub bytes: Vec<u8>,
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        let n = self.bytes.capacity() as u64;
        let mut h = self.budget.held.lock();
        h.all -= n;
        if self.priority == Priority::Background {
            h.background -= n;
        }
        drop(h);
        self.budget.freed.notify_all();
    }
}

impl Budget {
    /// A budget of `max` bytes.
    pub fn new(max: u64) -> Budget {
        Budget {
            held: Mutex::new(Held::default()),
            freed: Condvar::new(),
            max: max.max(1),
            peak: Default::default(),
        }
    }

    /// The most a piece of one fetch may take: a quarter of the budget,
    /// so that a few fetches run at once and none waits for all of it.
    pub fn piece(&self) -> u64 {
        (self.max / 4).max(1)
    }

    /// The bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.held.lock().all
    }

    /// The most bytes held at once so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn fits(&self, h: &Held, n: u64, priority: Priority) -> bool {
        h.all + n <= self.max && (priority == Priority::Read || h.background + n <= self.max / 2)
    }

    /// A buffer of `n` bytes (at most [`Budget::piece`] for what the
    /// caller cuts, at most the budget in any case), waiting for room
    /// until `deadline`; `None` if the deadline passes or `stop` is set
    /// first (see [`Budget::wake`]).
    pub fn take(
        &self,
        n: u64,
        priority: Priority,
        deadline: Deadline,
        stop: &AtomicBool,
    ) -> Option<Buffer<'_>> {
        let n = n.min(self.max);
        let mut h = self.held.lock();
        loop {
            if stop.load(Ordering::Acquire) {
                return None;
            }
            if self.fits(&h, n, priority) {
                return Some(self.grant(&mut h, n, priority));
            }
            let left = deadline.remaining();
            if left.is_zero() {
                return None;
            }
            self.freed.wait_for(&mut h, left);
        }
    }

    /// A buffer of `n` bytes if there is room now.
    pub fn try_take(&self, n: u64, priority: Priority) -> Option<Buffer<'_>> {
        let n = n.min(self.max);
        let mut h = self.held.lock();
        self.fits(&h, n, priority)
            .then(|| self.grant(&mut h, n, priority))
    }

    fn grant(&self, h: &mut Held, n: u64, priority: Priority) -> Buffer<'_> {
        h.all += n;
        self.peak.fetch_max(h.all, Ordering::Relaxed);
        if priority == Priority::Background {
            h.background += n;
        }
        // Exactly `n` bytes of capacity: what is counted is what is held.
        let bytes = vec![0; n as usize];
        Buffer {
            budget: self,
            priority,
            bytes,
        }
    }

    /// Wakes every waiter (to see `stop`).
    pub fn wake(&self) {
        self.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn what_is_held_stays_within_the_budget_and_reads_keep_half() {
        let b = Budget::new(100);
        let stop = AtomicBool::new(false);
        let soon = || Deadline::after(Duration::from_millis(50));
        // Larger than the budget: capped at it, never let through whole.
        let big = b.take(1000, Priority::Read, soon(), &stop).unwrap();
        assert_eq!(big.bytes.len(), 100);
        assert!(b.take(1, Priority::Read, soon(), &stop).is_none());
        drop(big);
        // Background work holds at most half.
        let a = b.try_take(40, Priority::Background).unwrap();
        assert!(b.try_take(20, Priority::Background).is_none());
        let r = b.try_take(60, Priority::Read).unwrap();
        assert_eq!(b.held(), 100);
        drop((a, r));
        assert_eq!(b.held(), 0);
        assert_eq!(b.piece(), 25);
    }

    #[test]
    fn a_waiter_gets_room_when_it_is_freed_and_gives_up_at_its_deadline_or_stop() {
        let b = std::sync::Arc::new(Budget::new(100));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let held = b.try_take(100, Priority::Read).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                b.take(
                    50,
                    Priority::Read,
                    Deadline::after(Duration::from_secs(10)),
                    &stop,
                )
                .map(|buf| buf.bytes.len())
            });
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
            assert_eq!(waiter.join().unwrap(), Some(50));
        });
        let held = b.try_take(100, Priority::Read).unwrap();
        let t = std::time::Instant::now();
        let none = b.take(
            1,
            Priority::Read,
            Deadline::after(Duration::from_millis(100)),
            &stop,
        );
        assert!(none.is_none() && t.elapsed() >= Duration::from_millis(100));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                b.take(
                    1,
                    Priority::Read,
                    Deadline::after(Duration::from_secs(60)),
                    &stop,
                )
                .is_none()
            });
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::Release);
            b.wake();
            assert!(waiter.join().unwrap());
        });
        drop(held);
    }
}
