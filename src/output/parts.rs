//! The parts of a multipart upload: which bytes of the new packet are sent
//! and which are copied by the store from the parent packet. Pure: no I/O,
//! tested with tables.
//!
//! A seal whose parent is in the same store copies every unchanged run of
//! the parent's members (identical entries, so identical header, content
//! and padding bytes, contiguous in both packets) with `UploadPartCopy`
//! ([`copy_runs`]); [`plan`] cuts the packet into parts within S3's rules:
//! every part but the last at least [`MIN_PART`], none over [`MAX_PART`],
//! at most [`MAX_PARTS`]. Runs too short to be a part are merged into the
//! bytes sent around them; a sent stretch too short is lengthened with
//! bytes taken from the copy beside it.

use std::ops::Range;

use crate::packet::format::CHUNK_SIZE;
use crate::packet::layout::Layout;
use crate::packet::manifest::Manifest;

/// S3's smallest part, except the last (5 MiB).
pub const MIN_PART: u64 = 5 << 20;

/// S3's largest part (5 GiB).
pub const MAX_PART: u64 = 5 << 30;

/// S3's most parts in one upload.
pub const MAX_PARTS: usize = 10_000;

/// Parts of bytes sent are at least this long (8 MiB): fewer requests
/// than at the minimum, and a part in memory stays small.
pub const SEND_PART_MIN: u64 = 8 << 20;

/// Unchanged bytes of the parent at the same place in the new packet's
/// order: bytes `dst` of the new packet are bytes `src..` of the parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyRun {
    /// Where they go in the new packet.
    pub dst: Range<u64>,
    /// Where they start in the parent.
    pub src: u64,
}

/// One part of the upload, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The bytes of the new packet it holds.
    pub range: Range<u64>,
    /// `Some(offset)`: copied from the parent's bytes at `offset`; `None`:
    /// sent.
    pub copy_from: Option<u64>,
}

impl Part {
    /// Its length.
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }
}

/// The runs of members of `new` (laid out as `new_layout`) that are
/// byte for byte those of `parent` (as `parent_layout`), in order and
/// maximal: an entry equal to the parent's of the same path (path, kind,
/// size, mtime, mode and hashes, so the same header, content and padding),
/// contiguous with the one before in both packets; and, of a file with
/// chunks that changed (a write to some of its chunks: an append, a page
/// of a database), each run of its chunks whose hashes are the parent
/// file's at the same place.
pub fn copy_runs(
    parent: &Manifest,
    parent_layout: &Layout,
    new: &Manifest,
    new_layout: &Layout,
) -> Vec<CopyRun> {
    let mut runs: Vec<CopyRun> = Vec::new();
    // The parent entry the previous new entry matched, if it did.
    let mut prev: Option<usize> = None;
    for (i, e) in new.entries.iter().enumerate() {
        let found = parent
            .entries
            .binary_search_by(|p| p.path.as_bytes().cmp(e.path.as_bytes()))
            .ok()
            .filter(|&j| parent.entries[j] == *e);
        let Some(j) = found else {
            prev = None;
            runs.extend(same_chunks(parent, parent_layout, new, new_layout, i));
            continue;
        };
        let (dst, src) = (
            new_layout.member_start(i)..new_layout.member_end(i),
            parent_layout.member_start(j),
        );
        match runs.last_mut() {
            Some(r) if prev.is_some_and(|p| p + 1 == j) && r.dst.end == dst.start => {
                r.dst.end = dst.end;
            }
            _ => runs.push(CopyRun { dst, src }),
        }
        prev = Some(j);
    }
    runs
}

/// The runs of chunks of new entry `i` (a file with chunks) equal to the
/// chunks at the same place of the parent's file of the same path.
fn same_chunks(
    parent: &Manifest,
    parent_layout: &Layout,
    new: &Manifest,
    new_layout: &Layout,
    i: usize,
) -> Vec<CopyRun> {
    let e = &new.entries[i];
    let found = parent
        .entries
        .binary_search_by(|p| p.path.as_bytes().cmp(e.path.as_bytes()))
        .ok();
    let (Some(f), Some(j)) = (e.file(), found) else {
        return Vec::new();
    };
    let Some(old) = parent.entries[j].file() else {
        return Vec::new();
    };
    let (dst, src) = (
        new_layout.data_offset(i, e),
        parent_layout.data_offset(j, &parent.entries[j]),
    );
    let mut runs: Vec<CopyRun> = Vec::new();
    for (k, (a, b)) in f.chunks.iter().zip(old.chunks.iter()).enumerate() {
        let at = k as u64 * CHUNK_SIZE;
        // Equal hashes, equal bytes: the same length too.
        let len = (f.size - at).min(CHUNK_SIZE);
        if a != b || len != (old.size - at).min(CHUNK_SIZE) {
            continue;
        }
        match runs.last_mut() {
            Some(r) if r.dst.end == dst + at => r.dst.end += len,
            _ => runs.push(CopyRun {
                dst: dst + at..dst + at + len,
                src: src + at,
            }),
        }
    }
    runs
}

/// How long parts of sent bytes are for a packet of `total` bytes: at
/// least [`SEND_PART_MIN`], and long enough that the packet fits in
/// [`MAX_PARTS`] (in MiB).
pub fn send_part_len(total: u64) -> u64 {
    total
        .div_ceil(MAX_PARTS as u64)
        .next_multiple_of(1 << 20)
        .max(SEND_PART_MIN)
}

/// Why a packet cannot be uploaded as planned.
#[derive(Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The packet, of this many bytes, does not fit in [`MAX_PARTS`]
    /// parts of at most [`MAX_PART`].
    TooLarge(u64),
    /// A run to copy is not within the packet and the source, or not in
    /// order: a bug of the caller, caught before any request.
    BadRun(String),
    /// A part breaks one of S3's rules (a bug of the planner, caught
    /// before any request).
    BadPart(String),
}

/// The parts of a packet of `total` bytes with `runs` copyable from a
/// source of `source_len` bytes (in order, not overlapping, within
/// `0..total` and the source): as many bytes copied as S3's rules let, the
/// rest sent in parts of [`send_part_len`]. The plan is checked against
/// S3's rules ([`check`]) before it is returned.
pub fn plan(total: u64, runs: &[CopyRun], source_len: u64) -> Result<Vec<Part>, PlanError> {
    let send = send_part_len(total);
    if send > MAX_PART / 2 {
        return Err(PlanError::TooLarge(total));
    }
    let mut at = 0;
    for (k, r) in runs.iter().enumerate() {
        let len = r.dst.end.checked_sub(r.dst.start);
        let in_source = len
            .and_then(|l| r.src.checked_add(l))
            .is_some_and(|e| e <= source_len);
        if r.dst.start < at || r.dst.end > total || !in_source {
            return Err(PlanError::BadRun(format!(
                "run {k} (bytes {}..{} from {} of a source of {source_len}) is out of order or \
                 outside the packet of {total} bytes or the source",
                r.dst.start, r.dst.end, r.src
            )));
        }
        at = r.dst.end;
    }
    // Each copy is a part at least this long; should there be too many
    // parts, fewer and longer copies are kept.
    let mut min_copy = MIN_PART;
    loop {
        let parts = plan_with(total, runs, min_copy, send);
        if parts.len() <= MAX_PARTS {
            check(&parts, total, source_len)?;
            return Ok(parts);
        }
        min_copy *= 2;
    }
}

/// Checks `parts` against S3's rules for a packet of `total` bytes copied
/// in part from a source of `source_len` bytes: they tile `0..total` in
/// order; each is at most [`MAX_PART`] and, but the last, at least
/// [`MIN_PART`]; there are at most [`MAX_PARTS`]; a copied part's range
/// lies within the source (S3: `EntityTooSmall`, `EntityTooLarge`,
/// `InvalidArgument` for a part number over 10,000, `InvalidRange`).
pub fn check(parts: &[Part], total: u64, source_len: u64) -> Result<(), PlanError> {
    if parts.len() > MAX_PARTS {
        return Err(PlanError::BadPart(format!(
            "{} parts, more than S3's {MAX_PARTS}",
            parts.len()
        )));
    }
    let mut at = 0;
    for (k, p) in parts.iter().enumerate() {
        let n = k + 1;
        let bad = |what: String| Err(PlanError::BadPart(format!("part {n}: {what}")));
        if p.range.start != at || p.range.end < p.range.start {
            return bad(format!("bytes {:?} do not follow byte {at}", p.range));
        }
        if p.len() > MAX_PART {
            return bad(format!("{} bytes, more than S3's {MAX_PART}", p.len()));
        }
        if n < parts.len() && p.len() < MIN_PART {
            return bad(format!(
                "{} bytes, less than S3's {MIN_PART} for a part but the last",
                p.len()
            ));
        }
        if let Some(src) = p.copy_from
            && src.checked_add(p.len()).is_none_or(|e| e > source_len)
        {
            return bad(format!(
                "copies bytes {src}..+{} of a source of {source_len} bytes",
                p.len()
            ));
        }
        at = p.range.end;
    }
    if at != total {
        return Err(PlanError::BadPart(format!(
            "the parts end at byte {at}, the packet at {total}"
        )));
    }
    Ok(())
}

/// [`plan`] keeping only copies of at least `min_copy` bytes, sent bytes
/// in parts of `send`.
fn plan_with(total: u64, runs: &[CopyRun], min_copy: u64, send: u64) -> Vec<Part> {
    // Stretches: (range, copied from).
    let mut out: Vec<(Range<u64>, Option<u64>)> = Vec::new();
    let mut pos = 0;
    for run in runs.iter().filter(|r| r.dst.end - r.dst.start >= min_copy) {
        let mut run = run.clone();
        let gap = run.dst.start - pos;
        if gap > 0 && gap < MIN_PART {
            // Too short to be a part: lengthened from the copy after it,
            // else from the one before, else the copy is sent instead.
            let need = MIN_PART - gap;
            let prev_copy = out.last_mut().filter(|(r, from)| {
                from.is_some() && r.end == pos && r.end - r.start >= MIN_PART + need
            });
            if run.dst.end - run.dst.start >= MIN_PART + need {
                run.dst.start += need;
                run.src += need;
            } else if let Some((r, _)) = prev_copy {
                r.end -= need;
                pos = r.end;
            } else {
                continue;
            }
        }
        if run.dst.start > pos {
            out.push((pos..run.dst.start, None));
        }
        pos = run.dst.end;
        out.push((run.dst, Some(run.src)));
    }
    if total > pos {
        out.push((pos..total, None));
    }
    let mut parts = Vec::new();
    for (range, from) in out {
        let len = range.end - range.start;
        // Sent stretches in parts of `send` (the last of them up to twice
        // that), copies in parts of at most MAX_PART.
        let n = match from {
            None => (len / send).max(1),
            Some(_) => len.div_ceil(MAX_PART),
        };
        let each = match from {
            None => send,
            Some(_) => len.div_ceil(n),
        };
        let mut at = range.start;
        for k in 0..n {
            let end = if k + 1 == n { range.end } else { at + each };
            parts.push(Part {
                range: at..end,
                copy_from: from.map(|src| src + (at - range.start)),
            });
            at = end;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::digest::Sha256;
    use crate::packet::manifest::{Entry, EntryKind, FileMeta};

    const M: u64 = 1 << 20;
    /// A source long enough for every run of the tables.
    const SOURCE: u64 = 1 << 50;

    fn run(start: u64, end: u64, src: u64) -> CopyRun {
        CopyRun {
            dst: start..end,
            src,
        }
    }

    fn sent(start: u64, end: u64) -> Part {
        Part {
            range: start..end,
            copy_from: None,
        }
    }

    fn copied(start: u64, end: u64, src: u64) -> Part {
        Part {
            range: start..end,
            copy_from: Some(src),
        }
    }

    /// Every plan tiles the packet, keeps S3's rules, and copies bytes
    /// from where the runs say.
    fn check_plan(total: u64, runs: &[CopyRun], parts: &[Part]) {
        check(parts, total, SOURCE).unwrap();
        let mut at = 0;
        for (k, p) in parts.iter().enumerate() {
            assert_eq!(p.range.start, at, "part {k} leaves a gap or overlaps");
            assert!(p.len() <= MAX_PART, "part {k} is too long");
            if k + 1 < parts.len() {
                assert!(p.len() >= MIN_PART, "part {k} is too short: {p:?}");
            }
            if let Some(src) = p.copy_from {
                let r = runs
                    .iter()
                    .find(|r| r.dst.start <= p.range.start && p.range.end <= r.dst.end)
                    .expect("a copied part lies within a run");
                assert_eq!(src, r.src + (p.range.start - r.dst.start));
            }
            at = p.range.end;
        }
        assert_eq!(at, total);
        assert!(parts.len() <= MAX_PARTS);
    }

    #[test]
    fn plans_follow_s3_rules_and_copy_what_they_can() {
        let cases: Vec<(&str, u64, Vec<CopyRun>, Vec<Part>)> = vec![
            ("empty-ish packet", 10_240, vec![], vec![sent(0, 10_240)]),
            (
                "no copies, 3 parts",
                25 * M,
                vec![],
                vec![sent(0, 8 * M), sent(8 * M, 16 * M), sent(16 * M, 25 * M)],
            ),
            (
                "a long run after a short manifest borrows for the first part",
                40 * M,
                vec![run(M, 40 * M, 2 * M)],
                vec![sent(0, 5 * M), copied(5 * M, 40 * M, 6 * M)],
            ),
            (
                "a run too short to be a part is sent",
                20 * M,
                vec![run(6 * M, 9 * M, 0)],
                vec![sent(0, 8 * M), sent(8 * M, 20 * M)],
            ),
            (
                "a short gap between two runs borrows from the next one",
                60 * M,
                vec![run(5 * M, 20 * M, 5 * M), run(21 * M, 60 * M, 30 * M)],
                vec![
                    sent(0, 5 * M),
                    copied(5 * M, 20 * M, 5 * M),
                    sent(20 * M, 25 * M),
                    copied(25 * M, 60 * M, 34 * M),
                ],
            ),
            (
                "a short gap before a short run borrows from the run before",
                40 * M,
                vec![run(5 * M, 30 * M, 0), run(31 * M, 37 * M, 40 * M)],
                vec![
                    sent(0, 5 * M),
                    copied(5 * M, 26 * M, 0),
                    sent(26 * M, 31 * M),
                    copied(31 * M, 37 * M, 40 * M),
                    sent(37 * M, 40 * M),
                ],
            ),
            (
                "a short tail is a part of its own",
                30 * M,
                vec![run(5 * M, 30 * M - 1024, 0)],
                vec![
                    sent(0, 5 * M),
                    copied(5 * M, 30 * M - 1024, 0),
                    sent(30 * M - 1024, 30 * M),
                ],
            ),
        ];
        for (what, total, runs, want) in cases {
            let got = plan(total, &runs, SOURCE).unwrap();
            check_plan(total, &runs, &got);
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn long_copies_are_split_and_part_counts_stay_within_limits() {
        let total = 12 << 30;
        let runs = vec![run(8 * M, total, 0)];
        let parts = plan(total, &runs, SOURCE).unwrap();
        check_plan(total, &runs, &parts);
        assert_eq!(parts.iter().filter(|p| p.copy_from.is_some()).count(), 3);
        // Many short runs, each long enough alone: too many parts at
        // first, so the shorter ones are sent.
        let total = 200_000 * M;
        let runs: Vec<CopyRun> = (0..15_000u64)
            .map(|k| run(k * 13 * M + 6 * M, k * 13 * M + 6 * M + (5 + k % 3) * M, k))
            .collect();
        let parts = plan(total, &runs, SOURCE).unwrap();
        check_plan(total, &runs, &parts);
        assert_eq!(send_part_len(total), 20 * M);
        assert!(plan(u64::MAX / 2, &[], 0).is_err());
    }

    /// What S3 refuses, the planner and its check refuse first, naming
    /// the run or part.
    #[test]
    fn runs_and_parts_outside_s3_rules_are_refused_before_any_request() {
        let bad_runs: &[(&str, u64, Vec<CopyRun>, u64)] = &[
            (
                "beyond the source",
                40 * M,
                vec![run(5 * M, 40 * M, 10 * M)],
                40 * M,
            ),
            (
                "beyond the packet",
                40 * M,
                vec![run(5 * M, 41 * M, 0)],
                SOURCE,
            ),
            (
                "out of order",
                60 * M,
                vec![run(30 * M, 50 * M, 0), run(5 * M, 20 * M, 0)],
                SOURCE,
            ),
            ("reversed", 60 * M, vec![run(30 * M, 20 * M, 0)], SOURCE),
            (
                "overflowing",
                60 * M,
                vec![run(5 * M, 20 * M, u64::MAX - M)],
                u64::MAX,
            ),
        ];
        for (what, total, runs, source) in bad_runs {
            assert!(
                matches!(plan(*total, runs, *source), Err(PlanError::BadRun(_))),
                "{what}"
            );
        }
        let ok = vec![
            sent(0, 8 * M),
            copied(8 * M, 20 * M, 0),
            sent(20 * M, 21 * M),
        ];
        assert_eq!(check(&ok, 21 * M, 12 * M), Ok(()));
        let bad_parts: &[(&str, Vec<Part>, u64, u64)] = &[
            (
                "a short part but the last",
                vec![sent(0, M), sent(M, 10 * M)],
                10 * M,
                0,
            ),
            (
                "a gap",
                vec![sent(0, 8 * M), sent(9 * M, 10 * M)],
                10 * M,
                0,
            ),
            ("short of the end", vec![sent(0, 8 * M)], 10 * M, 0),
            (
                "a part over 5 GiB",
                vec![sent(0, MAX_PART + 1)],
                MAX_PART + 1,
                0,
            ),
            ("a copy beyond the source", ok.clone(), 21 * M, 12 * M - 1),
            (
                "more than 10,000 parts",
                (0..MAX_PARTS as u64 + 1)
                    .map(|k| sent(k * 5 * M, (k + 1) * 5 * M))
                    .collect(),
                (MAX_PARTS as u64 + 1) * 5 * M,
                0,
            ),
        ];
        for (what, parts, total, source) in bad_parts {
            assert!(
                matches!(check(parts, *total, *source), Err(PlanError::BadPart(_))),
                "{what}"
            );
        }
    }

    /// A file entry of `size` bytes, its hash and chunk hashes given.
    fn file_entry(path: &str, size: u64, sha256: Sha256, chunks: Vec<Sha256>) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File(FileMeta {
                size,
                mtime_ns: 0,
                executable: false,
                sha256,
                chunks: chunks.into(),
            }),
        }
    }

    fn file(path: &str, size: u64, tag: u8) -> Entry {
        let chunks = vec![Sha256::default(); crate::packet::format::chunk_count(size) as usize];
        file_entry(path, size, Sha256([tag; 32]), chunks)
    }

    #[test]
    fn copy_runs_are_the_unchanged_members_contiguous_in_both() {
        let dir = Entry {
            path: "workspace".into(),
            kind: EntryKind::Dir,
        };
        let parent = Manifest {
            version: Default::default(),
            harness: None,
            entries: vec![
                dir.clone(),
                file("workspace/a", 100, 1),
                file("workspace/b", 2000, 2),
                file("workspace/c", 10, 3),
                file("workspace/d", 10, 4),
            ],
        };
        // b changed, c unchanged, an entry inserted before d.
        let new = Manifest {
            version: Default::default(),
            harness: None,
            entries: vec![
                dir,
                file("workspace/a", 100, 1),
                file("workspace/b", 2000, 9),
                file("workspace/c", 10, 3),
                file("workspace/cc", 10, 5),
                file("workspace/d", 10, 4),
            ],
        };
        let (pl, nl) = (Layout::compute(&parent, 700), Layout::compute(&new, 900));
        let runs = copy_runs(&parent, &pl, &new, &nl);
        assert_eq!(
            runs,
            vec![
                run(nl.member_start(0), nl.member_end(1), pl.member_start(0)),
                run(nl.member_start(3), nl.member_end(3), pl.member_start(3)),
                run(nl.member_start(5), nl.member_end(5), pl.member_start(4)),
            ]
        );
    }

    /// A file of chunks tagged `tags` (its last chunk `tail` bytes long).
    fn chunked(path: &str, tags: &[u8], tail: u64) -> Entry {
        let c = crate::packet::format::CHUNK_SIZE;
        let size = (tags.len() as u64 - 1) * c + tail;
        let chunks: Vec<Sha256> = tags.iter().map(|&t| Sha256([t; 32])).collect();
        let sha256 = crate::packet::digest::chunk_list_hash(&chunks);
        file_entry(path, size, sha256, chunks)
    }

    #[test]
    fn copy_runs_take_the_unchanged_chunks_of_a_changed_file() {
        let c = crate::packet::format::CHUNK_SIZE;
        let dir = Entry {
            path: "workspace".into(),
            kind: EntryKind::Dir,
        };
        let m = |entries| Manifest {
            version: Default::default(),
            harness: None,
            entries,
        };
        // Chunk 2 of 5 written; the last one grown by an append.
        let parent = m(vec![
            dir.clone(),
            chunked("workspace/db", &[1, 2, 3, 4, 5], 100),
        ]);
        let new = m(vec![dir, chunked("workspace/db", &[1, 2, 9, 4, 6], 200)]);
        let (pl, nl) = (Layout::compute(&parent, 700), Layout::compute(&new, 900));
        let (nd, pd) = (
            nl.data_offset(1, &new.entries[1]),
            pl.data_offset(1, &parent.entries[1]),
        );
        assert_eq!(
            copy_runs(&parent, &pl, &new, &nl),
            vec![
                // The directory, unchanged; chunks 0-1 and 3 (4 grew).
                run(nl.member_start(0), nl.member_end(0), pl.member_start(0)),
                run(nd, nd + 2 * c, pd),
                run(nd + 3 * c, nd + 4 * c, pd + 3 * c),
            ]
        );
        // A last chunk of the same hash is the same bytes: copied too.
        let same_tail = m(vec![
            new.entries[0].clone(),
            chunked("workspace/db", &[1, 2, 9, 4, 5], 100),
        ]);
        let sl = Layout::compute(&same_tail, 900);
        let runs = copy_runs(&parent, &pl, &same_tail, &sl);
        let sd = sl.data_offset(1, &same_tail.entries[1]);
        assert_eq!(
            runs.last(),
            Some(&run(sd + 3 * c, sd + 4 * c + 100, pd + 3 * c))
        );
    }
}
