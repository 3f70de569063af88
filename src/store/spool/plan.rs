//! What a spool fetches, decided in plain functions over its units (no
//! I/O, no locks; tested with tables): which units a miss brings, how
//! they become requests, how a request is cut to fit the memory budget,
//! and how far a reader moving forward is read ahead.

use std::ops::Range;

use super::Unit;

/// Units closer than this are fetched in one request (the bytes between
/// are member headers and padding: a few hundred bytes, more for long
/// names); a gap this short beside a unit fetched is fetched with it, so
/// that its bytes are checked too.
pub const MAX_GAP: u64 = 64 << 10;

/// The units one request should bring for a miss of unit `u`: those
/// around it for which `free` holds (not filled, not being fetched) and
/// close to their neighbours, first back from `u` within half a block (a
/// listing runs in hash order, so a reader of a directory lands in the
/// middle of its files and wants those before too), then forward within
/// the block; all within `bounds`. A unit of a block or more comes alone.
pub fn around(
    units: &[Unit],
    u: usize,
    free: impl Fn(usize) -> bool,
    block: u64,
    bounds: &Range<usize>,
) -> Range<usize> {
    if units[u].len >= block {
        return u..u + 1;
    }
    let mut lo = u;
    while lo > bounds.start {
        let (w, next) = (&units[lo - 1], &units[lo]);
        if next.start - w.end() > MAX_GAP || units[u].end() - w.start > block / 2 || !free(lo - 1) {
            break;
        }
        lo -= 1;
    }
    let start = units[lo].start;
    let mut hi = u + 1;
    while let Some(w) = units.get(hi).filter(|_| hi < bounds.end) {
        if w.start - units[hi - 1].end() > MAX_GAP || w.end() - start > block || !free(hi) {
            break;
        }
        hi += 1;
    }
    lo..hi
}

/// The bytes between unit `g - 1` and unit `g` (gap 0 runs from `first`,
/// the end of the manifest member, to the first unit; gap `units.len()`
/// from the last unit to `end`, the object's end).
pub fn gap(units: &[Unit], g: usize, first: u64, end: u64) -> Range<u64> {
    let start = match g.checked_sub(1) {
        Some(p) => units[p].end(),
        None => first,
    };
    let stop = units.get(g).map_or(end, |w| w.start);
    start..stop.max(start)
}

/// Cuts `stretches` (byte ranges that must be fetched, sorted by start,
/// overlapping at most their neighbours' ends) into the spans of requests: stretches less than [`MAX_GAP`]
/// apart go together while the span stays within `max_len` (a stretch
/// longer than that is a span of its own).
pub fn spans(stretches: impl IntoIterator<Item = Range<u64>>, max_len: u64) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for s in stretches.into_iter().filter(|s| !s.is_empty()) {
        match out.last_mut() {
            // (Stretches may share their ends: a gap between two units.)
            Some(last)
                if s.start.saturating_sub(last.end) <= MAX_GAP
                    && s.end.max(last.end) - last.start <= max_len =>
            {
                last.end = last.end.max(s.end);
            }
            _ => out.push(s),
        }
    }
    out
}

/// `span` cut into the ranged GETs of at most `piece` bytes that fetch it
/// one after another (a request larger than its share of the memory
/// budget is split, never let through whole).
pub fn pieces(span: Range<u64>, piece: u64) -> impl Iterator<Item = Range<u64>> {
    let piece = piece.max(1);
    (span.start..span.end)
        .step_by(usize::try_from(piece).unwrap_or(usize::MAX))
        .map(move |s| s..(s + piece).min(span.end))
}

/// A reader's read-ahead: the units it has read, and those handed out
/// to be fetched ahead of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    /// The window, in bytes.
    pub window: u64,
    /// Units before this one have been handed out to read-ahead.
    pub ahead_to: usize,
    /// The stream's first unit: a read of a unit from here to `ahead_to`
    /// (in any order: a directory's files are read in hash order) goes on
    /// with it.
    pub from: usize,
    /// Bytes of the units read in the stream: the window is twice that.
    pub read: u64,
    /// The last unit read (its reads are counted once).
    pub last: usize,
}

/// A read ahead grows to at most this many bytes ahead of a reader.
pub const MAX_WINDOW: u64 = 32 << 20;

/// What a read that ended in unit `u` does to its stream `s` (the stream
/// of `u`'s file when `chunked`, else that of small files): the stream
/// after it (`None`: forgotten) and the units to hand to read-ahead. A
/// stream goes on when `u` lies within what it covers; a new one starts
/// when the reader is moving `forward` (the unit before was read, or `u`
/// is a file's first chunk); its window is twice what it has read, from
/// one block up to [`MAX_WINDOW`]. Growing with what was read, not with
/// each read, keeps a reader of a few small files in a row (an agent's
/// edits copying them up) from fetching megabytes it never reads.
pub fn follow(
    units: &[Unit],
    s: Option<Stream>,
    u: usize,
    forward: bool,
    chunked: bool,
    block: u64,
) -> (Option<Stream>, Range<usize>) {
    let unit = &units[u];
    let first = block.max(unit.len);
    let mut s = match s {
        Some(s) if (s.from..s.ahead_to).contains(&u) => {
            let read = s.read + if u == s.last { 0 } else { unit.len };
            Stream {
                window: (2 * read).clamp(first, MAX_WINDOW.max(first)),
                read,
                last: u,
                ..s
            }
        }
        _ if forward => Stream {
            window: first,
            ahead_to: u + 1,
            from: u,
            read: unit.len,
            last: u,
        },
        _ => return (None, u..u),
    };
    let limit = unit.end() + s.window;
    let begin = s.ahead_to.max(u + 1);
    let mut end = begin;
    while units
        .get(end)
        .is_some_and(|w| w.start < limit && (!chunked || w.group == unit.group))
    {
        end += 1;
    }
    s.ahead_to = end;
    (Some(s), begin..end)
}

/// The units of `range` at which each request of read-ahead starts: the
/// first not `filled`, then the first after a block's worth of units.
pub fn starts(
    units: &[Unit],
    range: Range<usize>,
    filled: impl Fn(usize) -> bool,
    block: u64,
) -> Vec<usize> {
    let mut out = Vec::new();
    let mut request_start: Option<u64> = None;
    for v in range.filter(|&v| !filled(v)) {
        let w = &units[v];
        if request_start.is_none_or(|rs| w.end() - rs > block) {
            request_start = Some(w.start);
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
// Tables of byte ranges read best as ranges, one or several.
#[allow(clippy::single_range_in_vec_init, clippy::type_complexity)]
mod tests {
    use super::*;

    /// Units at `(start, len)`, each its own file.
    fn units(at: &[(u64, u64)]) -> Vec<Unit> {
        at.iter()
            .enumerate()
            .map(|(i, &(start, len))| Unit {
                start,
                len,
                hash: [0; 32],
                group: i as u32,
            })
            .collect()
    }

    #[test]
    fn a_miss_brings_free_units_around_it_within_the_block() {
        // Ten units of 1000 bytes, 512 apart (headers).
        let u: Vec<Unit> = units(&(0..10).map(|i| (512 + i * 1512, 1000)).collect::<Vec<_>>());
        let all = 0..10;
        let free = |_: usize| true;
        // (miss, block, free, bounds) -> units
        type Case<'a> = (
            usize,
            u64,
            &'a dyn Fn(usize) -> bool,
            Range<usize>,
            Range<usize>,
        );
        let cases: &[Case<'_>] = &[
            // A block of 4 units' worth: back within half of it, then on.
            (5, 4 * 1512, &free, all.clone(), 4..8),
            // From the first unit: forward only.
            (0, 4 * 1512, &free, all.clone(), 0..4),
            // A unit being fetched stops it on either side.
            (5, 4 * 1512, &|v| v != 6, all.clone(), 4..6),
            (5, 4 * 1512, &|v| v != 4, all.clone(), 5..9),
            // Bounds (a planned reader) keep it inside.
            (5, 8 * 1512, &free, 5..7, 5..7),
            // A block smaller than the unit: the unit alone.
            (5, 1000, &free, all.clone(), 5..6),
        ];
        for (miss, block, free, bounds, want) in cases {
            assert_eq!(
                around(&u, *miss, free, *block, bounds),
                *want,
                "miss {miss} block {block}"
            );
        }
        // Far apart: alone.
        let far = units(&[(0, 10), (MAX_GAP + 100, 10), (2 * MAX_GAP + 200, 10)]);
        assert_eq!(around(&far, 1, free, 1 << 30, &(0..3)), 1..2);
    }

    #[test]
    fn stretches_close_together_share_a_request_within_its_length() {
        let cases: &[(&[Range<u64>], u64, &[Range<u64>])] = &[
            (&[0..10, 20..30, 40..50], 100, &[0..50]),
            // The length bounds a span.
            (&[0..10, 20..30, 40..50], 30, &[0..30, 40..50]),
            // A stretch longer than the length is a span of its own.
            (&[0..10, 20..200, 210..220], 50, &[0..10, 20..200, 210..220]),
            // Too far apart.
            (
                &[0..10, 11 + MAX_GAP..20 + MAX_GAP],
                1 << 30,
                &[0..10, 11 + MAX_GAP..20 + MAX_GAP],
            ),
            (
                &[0..10, 10 + MAX_GAP..20 + MAX_GAP],
                1 << 30,
                &[0..20 + MAX_GAP],
            ),
            // Empty stretches are nothing to fetch.
            (&[0..0, 5..5], 10, &[]),
            // Stretches sharing a gap.
            (&[0..30, 20..50, 40..60], 100, &[0..60]),
        ];
        for (stretches, max, want) in cases {
            assert_eq!(
                spans(stretches.iter().cloned(), *max),
                *want,
                "{stretches:?} {max}"
            );
        }
    }

    #[test]
    fn a_span_larger_than_a_piece_is_fetched_in_pieces() {
        let cases: &[(Range<u64>, u64, &[Range<u64>])] = &[
            (0..10, 4, &[0..4, 4..8, 8..10]),
            (5..13, 4, &[5..9, 9..13]),
            (0..3, 4, &[0..3]),
            (7..7, 4, &[]),
        ];
        for (span, piece, want) in cases {
            assert_eq!(pieces(span.clone(), *piece).collect::<Vec<_>>(), *want);
        }
    }

    #[test]
    fn gaps_run_between_units_and_at_the_ends() {
        let u = units(&[(1024, 100), (1636, 50), (1686, 10)]);
        let cases: &[(usize, Range<u64>)] = &[
            (0, 512..1024),
            (1, 1124..1636),
            // Chunks of one file: no bytes between.
            (2, 1686..1686),
            (3, 1696..4096),
        ];
        for (g, want) in cases {
            assert_eq!(gap(&u, *g, 512, 4096), *want, "gap {g}");
        }
    }

    #[test]
    fn read_ahead_follows_a_reader_by_twice_what_it_read() {
        // 20 small files of 1000 bytes, 512 apart.
        let u: Vec<Unit> = units(&(0..20).map(|i| (512 + i * 1512, 1000)).collect::<Vec<_>>());
        let block = 3 * 1512;
        // A first forward read: a stream with a window of one block.
        let (s, out) = follow(&u, None, 0, true, false, block);
        let s = s.unwrap();
        assert_eq!((s.window, s.from, s.read), (block, 0, 1000));
        assert_eq!(out, 1..4);
        // The next read goes on with it: the window is twice what it read
        // (at least a block), and only what is new is handed out.
        let (s2, out) = follow(&u, Some(s), 1, true, false, block);
        let s2 = s2.unwrap();
        assert_eq!((s2.window, s2.read), (block, 2000));
        assert_eq!(out, 4..5);
        // The same unit again counts once.
        let (s3, _) = follow(&u, Some(s2), 1, true, false, block);
        assert_eq!(s3.unwrap().read, 2000);
        // Reads within the stream, in any order, grow it.
        let (s4, out) = follow(&u, Some(s2), 3, false, false, block);
        let s4 = s4.unwrap();
        assert_eq!((s4.read, s4.window), (3000, 6000));
        // Up to 6000 bytes past the end of unit 3 (at 6048): units 5 to 7.
        assert_eq!((out, s4.ahead_to), (5..8, 8));
        // A read elsewhere that is not moving forward forgets it.
        assert_eq!(
            follow(&u, Some(s4), 15, false, false, block),
            (None, 15..15)
        );
        // A chunked file's read-ahead stays within the file.
        let mut c = u.clone();
        for w in &mut c[..5] {
            w.group = 0;
        }
        let (_, out) = follow(&c, None, 2, true, true, 1 << 30);
        assert_eq!(out, 3..5);
    }

    #[test]
    fn read_ahead_starts_a_request_per_block_of_units_not_filled() {
        let u: Vec<Unit> = units(&(0..10).map(|i| (512 + i * 1512, 1000)).collect::<Vec<_>>());
        let cases: &[(u64, &[usize], &[usize])] = &[
            (3 * 1512, &[], &[0, 3, 6, 9]),
            (3 * 1512, &[0, 1], &[2, 5, 8]),
            (1 << 30, &[], &[0]),
            (1, &[], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
        ];
        for (block, filled, want) in cases {
            assert_eq!(
                starts(&u, 0..10, |v| filled.contains(&v), *block),
                *want,
                "block {block}, filled {filled:?}"
            );
        }
    }
}
