//! The spool against objects in memory that count requests and fail as
//! told (STYLE habit 13: a mock and a failing client); the planner's
//! tables are in `plan.rs`, the budget's in `budget.rs`.

use super::*;
use std::sync::atomic::AtomicUsize;

/// How [`Mem`] answers.
#[derive(Default)]
struct Faults {
    /// Corrupt the next this many responses (`usize::MAX`: every one).
    corrupt: AtomicUsize,
    /// Each response takes this long (ms).
    delay_ms: AtomicU64,
    /// A request that touches this offset waits until it is cleared.
    hold_at: Mutex<Option<u64>>,
    released: Condvar,
}

/// An object in memory.
struct Mem {
    bytes: Vec<u8>,
    requests: Arc<AtomicUsize>,
    faults: Arc<Faults>,
    bound: Duration,
}

impl ReadAt for Mem {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn etag(&self) -> Option<&str> {
        None
    }
    fn deadline(&self) -> Deadline {
        Deadline::after(self.bound)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64, deadline: Deadline) -> Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let range = offset..offset + buf.len() as u64;
        {
            let mut h = self.faults.hold_at.lock();
            while h.is_some_and(|at| range.contains(&at)) {
                self.faults.released.wait(&mut h);
            }
        }
        let delay = Duration::from_millis(self.faults.delay_ms.load(Ordering::Relaxed));
        if delay > deadline.remaining() {
            std::thread::sleep(deadline.remaining());
            return Err(Error::Unavailable {
                location: "mem://object".into(),
                what: format!("read bytes {}..{}", range.start, range.end),
                attempts: 1,
                elapsed: deadline.elapsed(),
                last: "timed out".into(),
            });
        }
        std::thread::sleep(delay);
        let at = offset as usize;
        buf.copy_from_slice(&self.bytes[at..at + buf.len()]);
        if self
            .faults
            .corrupt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| match n {
                usize::MAX => Some(n),
                n => n.checked_sub(1),
            })
            .is_ok()
        {
            // A byte in every unit of the response (they are 1000 bytes
            // or more).
            for b in buf.iter_mut().step_by(997) {
                *b ^= 1;
            }
        }
        Ok(())
    }
    fn shown(&self) -> &str {
        "mem://object"
    }
}

/// 40 small units of 1000 bytes, 512 bytes apart (headers of 512 bytes
/// of 0xAA), then one of 3 MiB. Gap bytes are 0xAA (the tail of the last
/// unit's block up to 512 more are 0xAA too).
fn object() -> (Vec<u8>, Vec<Unit>) {
    let mut bytes = Vec::new();
    let mut units = Vec::new();
    for i in 0..41u32 {
        bytes.extend_from_slice(&[0xAA; 512]);
        let len = if i == 40 { 3 << 20 } else { 1000 };
        let data: Vec<u8> = (0..len).map(|j| (j as u32 * 7 + i) as u8).collect();
        units.push(Unit {
            start: bytes.len() as u64,
            len: len as u64,
            hash: sha2::Sha256::digest(&data).into(),
            group: i,
        });
        bytes.extend_from_slice(&data);
    }
    bytes.extend_from_slice(&[0xAA; 512]);
    (bytes, units)
}

/// The gaps of [`object`]: every byte 0xAA.
fn gaps() -> Gaps {
    Gaps {
        from: 0,
        check: Arc::new(|_, b: &[u8]| b.iter().all(|&x| x == 0xAA)),
    }
}

struct Setup {
    cache: Option<Arc<Cache>>,
    block: u64,
    max_memory: u64,
    bound: Duration,
    gaps: Option<Gaps>,
    prefetch: Prefetch,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            cache: None,
            block: 8 * 1512,
            max_memory: MIN_MAX_MEMORY,
            bound: Duration::from_secs(30),
            gaps: None,
            prefetch: Prefetch::None,
        }
    }
}

struct Made {
    s: Arc<Spool>,
    bytes: Vec<u8>,
    requests: Arc<AtomicUsize>,
    faults: Arc<Faults>,
}

fn make(setup: Setup) -> Made {
    let (bytes, units) = object();
    let (requests, faults) = (Arc::new(AtomicUsize::new(0)), Arc::new(Faults::default()));
    let mem = Mem {
        bytes: bytes.clone(),
        requests: Arc::clone(&requests),
        faults: Arc::clone(&faults),
        bound: setup.bound,
    };
    let options = SpoolOptions {
        block: setup.block,
        max_memory: setup.max_memory,
        prefetch: setup.prefetch,
    };
    let location = super::super::Location::Local("mem".into());
    let dir = std::env::temp_dir();
    let s = Spool::new(
        location,
        Box::new(mem),
        units,
        setup.gaps,
        &dir,
        setup.cache,
        options,
    )
    .unwrap();
    Made {
        s,
        bytes,
        requests,
        faults,
    }
}

fn spooled(s: &Spool, range: Range<u64>) -> Vec<u8> {
    let mut buf = vec![0; (range.end - range.start) as usize];
    s.file.read_exact_at(&mut buf, range.start).unwrap();
    buf
}

/// The spool holds the object's bytes in every unit of `units`.
#[track_caller]
fn assert_spooled(s: &Spool, bytes: &[u8], units: Range<usize>) {
    for u in units {
        let w = s.units()[u].clone();
        assert!(
            spooled(s, w.start..w.end()) == bytes[w.start as usize..w.end() as usize],
            "unit {u}"
        );
    }
}

/// Bytes the reads fetched themselves (read-ahead runs beside them).
fn read_bytes(s: &Spool) -> u64 {
    s.stats.fetched_bytes.load(Ordering::Relaxed) - s.stats.background_bytes.load(Ordering::Relaxed)
}

#[test]
fn small_units_come_a_block_at_a_time_and_verified() {
    let Made { s, bytes, .. } = make(Setup::default());
    let u = s.units()[0].clone();
    s.ensure(u.start..u.start + 10).unwrap();
    // The request brought the units after it, up to the block.
    let last = s.units()[7].clone();
    assert_eq!(read_bytes(&s), last.end() - u.start);
    assert!((0..8).all(|v| s.is_filled(v)));
    s.ensure(last.start..last.end()).unwrap();
    assert_eq!(read_bytes(&s), last.end() - u.start);
    assert_spooled(&s, &bytes, 0..8);
    // A reader landing in the middle of a run gets the units before it
    // too (within half a block), then those after it.
    let Made { s, .. } = make(Setup::default());
    let mid = s.units()[20].clone();
    s.ensure(mid.start..mid.start + 1).unwrap();
    let (lo, hi) = (s.units()[17].clone(), s.units()[24].clone());
    assert_eq!(read_bytes(&s), hi.end() - lo.start);
    assert!((17..=24).all(|v| s.is_filled(v)));
    assert!(!s.is_filled(16));
}

#[test]
fn a_planned_reader_fetches_only_what_it_names() {
    let Made {
        s, bytes, requests, ..
    } = make(Setup::default());
    let (a, b) = (s.units()[3].clone(), s.units()[5].clone());
    s.ensure_planned(a.start..b.end()).unwrap();
    // One request, for units 3 to 5 only: nothing around them, nothing
    // ahead (a reader's miss here brings units up to the block, then
    // reads ahead: small_units_come_a_block_at_a_time_and_verified).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(requests.load(Ordering::Relaxed), 1);
    assert_eq!(
        s.stats.fetched_bytes.load(Ordering::Relaxed),
        b.end() - a.start
    );
    assert!((3..=5).all(|v| s.is_filled(v)));
    assert!(!s.is_filled(2) && !s.is_filled(6));
    assert_spooled(&s, &bytes, 3..6);
    let (c, d) = (s.units()[10].clone(), s.units()[12].clone());
    s.ensure_planned(c.start..d.end()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(requests.load(Ordering::Relaxed), 2);
    assert!(!s.is_filled(9) && !s.is_filled(13));
}

#[test]
fn read_ahead_grows_with_what_was_read_not_with_each_read() {
    let Made { s, .. } = make(Setup {
        block: 1512,
        ..Setup::default()
    });
    for u in 0..10 {
        let w = s.units()[u].clone();
        s.ensure(w.start..w.end()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let filled = (0..41).filter(|&v| s.is_filled(v)).count();
    // Read ahead by about twice the 10,000 bytes read (13 more units
    // with their headers); a window doubled at each of the 10 reads
    // would have reached all 40 small units.
    assert!(filled > 10, "no read-ahead: {filled}");
    assert!(filled <= 10 + 14, "{filled} units filled");
}

#[test]
fn a_corrupted_response_is_fetched_once_more_then_refused() {
    let Made {
        s,
        bytes,
        requests,
        faults,
    } = make(Setup {
        block: 4096,
        ..Setup::default()
    });
    let big = s.units()[40].clone();
    faults.corrupt.store(1, Ordering::Relaxed);
    s.ensure(big.start..big.start + 1).unwrap();
    assert_eq!(requests.load(Ordering::Relaxed), 2);
    assert_eq!(s.stats.refetched.load(Ordering::Relaxed), 1);
    assert_spooled(&s, &bytes, 40..41);
    // Corrupted every time: refused, and not filled.
    let small = s.units()[3].clone();
    faults.corrupt.store(2, Ordering::Relaxed);
    let e = s.ensure(small.start..small.end()).unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { start, .. } if start == small.start),
        "{e}"
    );
    assert!(!s.is_filled(3));
    // A read right after fails at once, with the same error, without a
    // request (the kernel retries a failed readahead at once)...
    let before = requests.load(Ordering::Relaxed);
    let again = s.ensure(small.start..small.end()).unwrap_err();
    assert!(matches!(again, Error::Corrupt { .. }), "{again}");
    assert_eq!(requests.load(Ordering::Relaxed), before);
    // ...and once that while is over, the next read fetches it again.
    std::thread::sleep(FAIL_FAST);
    s.ensure(small.start..small.end()).unwrap();
    assert!(s.is_filled(3));
}

/// Finding 6: every response corrupted, each after a delay. The whole read
/// (its fetches and its refetch) ends within its one bound; the old spool
/// refetched each unit of the block on its own, each with a fresh bound
/// (`cat` of one 1.5 KB file: EIO after 190 s and 606 GETs).
#[test]
fn a_read_of_corrupted_responses_ends_within_one_bound() {
    let Made {
        s,
        requests,
        faults,
        ..
    } = make(Setup {
        block: 1 << 20,
        bound: Duration::from_millis(1500),
        ..Setup::default()
    });
    faults.corrupt.store(usize::MAX, Ordering::Relaxed);
    faults.delay_ms.store(300, Ordering::Relaxed);
    let w = s.units()[20].clone();
    let t = Instant::now();
    let e = s.ensure(w.start..w.end()).unwrap_err();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(2000), "{took:?}: {e}");
    // One request for the block, one refetch of the unit asked for.
    assert!(requests.load(Ordering::Relaxed) <= 2, "{requests:?}");
    // The kernel's second READ of the same bytes fails at once.
    let t = Instant::now();
    assert!(s.ensure(w.start..w.end()).is_err());
    assert!(t.elapsed() < Duration::from_millis(100));
    // A store that answers too slowly: the bound holds as well.
    faults.corrupt.store(0, Ordering::Relaxed);
    faults.delay_ms.store(5000, Ordering::Relaxed);
    let w = s.units()[2].clone();
    let t = Instant::now();
    let e = s.ensure(w.start..w.end()).unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(2000), "{e}");
}

/// A read waiting for another read's fetch of the same unit waits within
/// its own bound, and a stop wakes it at once.
#[test]
fn a_waiting_read_ends_at_its_bound_or_at_once_when_the_spool_stops() {
    let Made { s, faults, .. } = make(Setup {
        bound: Duration::from_millis(800),
        ..Setup::default()
    });
    let w = s.units()[5].clone();
    *faults.hold_at.lock() = Some(w.start);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| s.ensure(w.start..w.end()));
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        let second = s.ensure(w.start..w.end());
        assert!(second.is_err());
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        let waiter = scope.spawn(|| {
            let t = Instant::now();
            (s.ensure(w.start..w.end()), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        s.stop();
        let (r, took) = waiter.join().unwrap();
        assert!(r.is_err() && took < Duration::from_millis(400), "{took:?}");
        *faults.hold_at.lock() = None;
        faults.released.notify_all();
        let _ = first.join().unwrap();
    });
}

#[test]
fn units_in_the_cache_cost_no_request_but_prove_nothing_of_the_object() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(Cache::open(dir.path(), 1 << 30).unwrap());
    let Made { s, requests, .. } = make(Setup {
        cache: Some(cache.clone()),
        block: 1 << 20,
        ..Setup::default()
    });
    s.ensure(0..s.remote().len()).unwrap();
    let first = requests.load(Ordering::Relaxed);
    assert!(first >= 2, "{first}");
    assert_eq!(s.unproven(0..s.remote().len()) - gap_bytes(&s), 0);
    // Its last fetches reach the cache when it ends (a mount's end).
    s.finish();
    assert_eq!(cache.stats.added.load(Ordering::Relaxed), 41);
    // Another spool on the same cache (another mount, the next turn).
    let Made {
        s: t,
        bytes,
        requests,
        faults,
    } = make(Setup {
        cache: Some(cache),
        block: 1 << 20,
        gaps: Some(gaps()),
        ..Setup::default()
    });
    t.ensure(0..t.remote().len()).unwrap();
    assert_eq!(requests.load(Ordering::Relaxed), 0);
    assert_spooled(&t, &bytes, 0..41);
    // The object itself was never seen: all of it is unproven, and a
    // proof fetches it. An object whose bytes differ fails the proof,
    // though the cache served the reads.
    let all = 0..t.remote().len();
    assert_eq!(t.unproven(all.clone()), t.remote().len());
    faults.corrupt.store(usize::MAX, Ordering::Relaxed);
    let e = t
        .prove(all.clone(), Deadline::after(Duration::from_secs(30)))
        .unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    faults.corrupt.store(0, Ordering::Relaxed);
    t.prove(all.clone(), Deadline::after(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(t.unproven(all), 0);
}

/// The bytes of [`object`] outside its units.
fn gap_bytes(s: &Spool) -> u64 {
    s.remote().len() - s.units().iter().map(|u| u.len).sum::<u64>()
}

#[test]
fn fetched_gaps_are_checked_and_a_wrong_one_fails_a_proof() {
    let Made { s, .. } = make(Setup {
        gaps: Some(gaps()),
        ..Setup::default()
    });
    // A read proves the units it fetches and the short gaps around them.
    let w = s.units()[0].clone();
    s.ensure(w.start..w.end()).unwrap();
    let first8 = 0..s.units()[7].end();
    assert_eq!(s.unproven(first8.clone()), 0);
    assert!(s.unproven(0..s.remote().len()) > 0);
    // A gap that is not what the packet says fails a proof.
    let Made { s, .. } = make(Setup {
        gaps: Some(Gaps {
            from: 0,
            check: Arc::new(|at, b: &[u8]| at > 20_000 || b.iter().all(|&x| x == 0xAA)),
        }),
        ..Setup::default()
    });
    s.prove(0..20_000, Deadline::after(Duration::from_secs(30)))
        .unwrap();
    let s = make(Setup {
        gaps: Some(Gaps {
            from: 0,
            check: Arc::new(|at, _: &[u8]| at < 20_000),
        }),
        ..Setup::default()
    })
    .s;
    let e = s
        .prove(
            0..s.remote().len(),
            Deadline::after(Duration::from_secs(30)),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { start, .. } if start >= 20_000),
        "{e}"
    );
}

/// Finding 11: a block larger than the budget is fetched in pieces, and
/// nothing held goes past the budget, with many readers at once.
#[test]
fn what_is_held_stays_within_the_budget_with_a_block_larger_than_it() {
    let Made { s, bytes, .. } = make(Setup {
        block: 64 << 20,
        max_memory: MIN_MAX_MEMORY,
        ..Setup::default()
    });
    let len = s.remote().len();
    std::thread::scope(|scope| {
        for i in 0..16u64 {
            let s = &s;
            scope.spawn(move || {
                let at = (i * 7919) % len;
                s.ensure(at..(at + 4096).min(len)).unwrap();
            });
        }
    });
    s.ensure(0..len).unwrap();
    assert!(s.budget.peak() <= MIN_MAX_MEMORY, "{}", s.budget.peak());
    assert_spooled(&s, &bytes, 0..41);
}

/// Finding 12: `--prefetch all` keeps fetching while a read waits (the
/// old prefetch slept whenever any read waited on a fetch).
#[test]
fn a_prefetch_runs_beside_a_read_that_waits() {
    let Made { s, faults, .. } = make(Setup {
        block: 1512,
        ..Setup::default()
    });
    // Every request that touches unit 39 waits until released.
    let held = s.units()[39].clone();
    *faults.hold_at.lock() = Some(held.start);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| s.ensure(held.start..held.end()));
        std::thread::sleep(Duration::from_millis(100));
        s.prefetch(0..41).unwrap();
        // While the read waits, the prefetch fills what it can.
        let t = Instant::now();
        while (0..39).any(|v| !s.is_filled(v)) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!((0..39).all(|v| s.is_filled(v)), "the prefetch stalled");
        assert!(!s.is_filled(39));
        *faults.hold_at.lock() = None;
        faults.released.notify_all();
        reader.join().unwrap().unwrap();
    });
}

/// A mount that reads every unit has seen all of the object (the gaps
/// fetched with the units), with read-ahead beside it.
#[test]
fn reading_everything_proves_everything() {
    let Made { s, .. } = make(Setup {
        gaps: Some(gaps()),
        block: 1 << 20,
        ..Setup::default()
    });
    for u in (0..41).rev() {
        let w = s.units()[u].clone();
        s.ensure(w.start..w.end()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.unproven(0..s.remote().len()), 0);
}
