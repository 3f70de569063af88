//! Copy-up by chunk and seal by chunk, through the in-process `Overlay`
//! API (what the FUSE adapter calls): a write to a lower file larger than a
//! chunk copies only the chunks it touches into the upper directory, reads
//! of the others come from the packet, a remount (journal replay) shows the
//! same bytes, and a seal hashes only the chunks written and is, byte for
//! byte, `pack` of the same tree (docs/upper-format.md, "Copy-up by
//! chunk"; docs/SEMANTICS.md, "Copy-up"). What the kernel decides (a real
//! mount, `SIGKILL` of the daemon) is in tests/mount_chunks.rs.

mod common;

use std::fs;
use std::path::PathBuf;

use common::chunk_ops::{C, Op, apply_to_model, bytes, op, packed_workspace};
use common::*;
use proptest::prelude::*;
use sessionfs::api::{FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, Overlay, ROOT, SetAttr};

fn ino(o: &Overlay, name: &str) -> u64 {
    o.lookup(ROOT, name.as_bytes()).unwrap().ino
}

fn read_all(o: &Overlay, name: &str) -> Vec<u8> {
    let i = ino(o, name);
    let size = o.getattr(i).unwrap().size;
    let mut out = Vec::new();
    // In pieces across chunk boundaries, as the kernel reads.
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(3 << 20) as u32;
        o.read(i, pos, n, &mut out).unwrap();
        pos += u64::from(n);
    }
    out
}

/// A workspace holding `big` (`size` bytes) and a small file, packed with
/// mtimes zeroed (so that a pack of the merged tree compares byte for byte).
struct Session {
    tmp: tempfile::TempDir,
    /// The packet the overlay is over (a rebase moves it).
    packet: PathBuf,
    upper: PathBuf,
    /// What `big` should hold.
    model: Vec<u8>,
    /// `alias`, when there is one: a hard link to `big` made on the mount
    /// (`None` inside: the same bytes), or, after a rebase made it a file
    /// of its own, its bytes.
    alias: Option<Option<Vec<u8>>>,
}

impl Session {
    fn new(size: u64) -> Session {
        let tmp = tempfile::tempdir().unwrap();
        let (model, packet) = packed_workspace(tmp.path(), size, &[]);
        let upper = tmp.path().join("upper");
        Session {
            tmp,
            packet,
            upper,
            model,
            alias: None,
        }
    }

    /// What `alias` holds, if it exists.
    fn alias(&self) -> Option<&Vec<u8>> {
        self.alias
            .as_ref()
            .map(|a| a.as_ref().unwrap_or(&self.model))
    }

    fn open(&self) -> Overlay {
        overlay_of(&self.packet, &self.upper)
    }

    /// Seals `o` into `name` (mtimes zeroed), checks the packet is `pack`
    /// of the model tree, and returns the seal's result as JSON.
    fn seal(&mut self, o: &Overlay, name: &str, rebase: bool) -> serde_json::Value {
        let out = self.tmp.path().join(format!("{name}.packet"));
        let mut opts = seal_options(out.clone(), None);
        opts.zero_mtimes = true;
        opts.rebase = rebase;
        let sealed = o.seal(&opts, &|_| {}).unwrap();
        let ws = self.tmp.path().join(format!("{name}-model"));
        write(&ws, "big", &self.model);
        write(&ws, "small.txt", b"small\n");
        if let Some(a) = self.alias() {
            write(&ws, "alias", a);
        }
        let want = packet_of(
            &ws,
            self.tmp.path(),
            &format!("{name}-pack"),
            &["--zero-mtimes"],
        );
        assert!(
            fs::read(&out).unwrap() == fs::read(&want).unwrap(),
            "{name}: the seal differs from pack of the same tree"
        );
        if rebase {
            self.packet = out;
            // The packet holds the names of a file as separate files: so
            // is the mount after the rebase.
            if let Some(a) = self.alias().cloned() {
                self.alias = Some(Some(a));
            }
        }
        let mut v = serde_json::to_value(&sealed).unwrap();
        v["changes"] = serde_json::to_value(&sealed.changes).unwrap();
        v
    }
}

/// "The first write to a lower file larger than a chunk copies into the
/// upper only the chunks the write touches ... the seal hashes at most
/// one chunk plus the manifest" (issue 33's reproducer, in bytes: before
/// copy-up by chunk, one byte appended to a 64 MiB file put 64 MiB in the
/// upper directory and hashed 64 MiB at the seal).
#[test]
fn one_byte_appended_to_a_large_file_costs_one_chunk() {
    let mut s = Session::new(16 * C + 1000);
    let o = s.open();
    let big = ino(&o, "big");
    let end = o.getattr(big).unwrap().size;
    assert_eq!(o.write(big, end, b"x").unwrap(), 1);
    s.model.push(b'x');
    assert!(
        upper_data_bytes(&s.upper) <= 8 << 20,
        "upper holds {} bytes for a 1-byte append",
        upper_data_bytes(&s.upper)
    );
    assert_eq!(read_all(&o, "big"), s.model);
    let v = s.seal(&o, "t1", true);
    let hashed = v["bytes_hashed"].as_u64().unwrap();
    assert!(hashed <= (8 << 20) + 64 * 1024, "hashed {hashed}: {v}");
    // The receipt: modified, one chunk of seventeen changed.
    let change = &v["changes"][0];
    assert_eq!(change["op"], "modified", "{v}");
    assert_eq!(change["chunks_changed"], 1, "{v}");
    // Again on the rebased mount: the next append costs one chunk too.
    assert_eq!(upper_data_bytes(&s.upper), 0);
    let end = o.getattr(big).unwrap().size;
    o.write(big, end, b"yz").unwrap();
    s.model.extend(b"yz");
    assert!(upper_data_bytes(&s.upper) <= 8 << 20);
    let v = s.seal(&o, "t2", true);
    let hashed = v["bytes_hashed"].as_u64().unwrap();
    assert!(hashed <= (8 << 20) + 64 * 1024, "hashed {hashed}: {v}");
}

/// A write covering a whole chunk copies nothing: the upper holds the
/// written bytes only.
#[test]
fn a_write_of_a_whole_chunk_copies_nothing() {
    let mut s = Session::new(4 * C);
    let o = s.open();
    let big = ino(&o, "big");
    let new = bytes(C, 7);
    o.write(big, C, &new).unwrap();
    s.model[C as usize..2 * C as usize].copy_from_slice(&new);
    let upper = upper_data_bytes(&s.upper);
    assert!(upper <= C + (64 << 10), "upper holds {upper}");
    assert_eq!(read_all(&o, "big"), s.model);
    // st_blocks counts the chunks still read from the packet too.
    let blocks = o.getattr(big).unwrap().blocks;
    assert!(blocks * 512 >= 4 * C, "{blocks} blocks");
    drop(o);
    let o = s.open();
    assert_eq!(read_all(&o, "big"), s.model, "after replaying the journal");
    s.seal(&o, "t", false);
}

/// Applies `ops` to `big` (2.5 chunks, and a hard link to it, `alias`,
/// made on the mount) and to the model, comparing both names' bytes with
/// the model after every step, and seal with pack at each seal and at the
/// end.
fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut s = Session::new(2 * C + C / 2);
    let mut o = s.open();
    o.link(ino(&o, "big"), ROOT, b"alias").unwrap();
    s.alias = Some(None);
    let mut seals = 0;
    for (k, op) in ops.iter().enumerate() {
        let big = ino(&o, "big");
        if apply_to_model(&mut s.model, op) {
            match *op {
                Op::WriteAt(off, len, seed) => {
                    o.write(big, off, &bytes(len, seed)).unwrap();
                }
                Op::Append(len, seed) => {
                    let at = o.getattr(big).unwrap().size;
                    o.write(big, at, &bytes(len, seed)).unwrap();
                }
                Op::Truncate(size) => {
                    let size = Some(size);
                    o.setattr(
                        big,
                        SetAttr {
                            size,
                            ..SetAttr::default()
                        },
                    )
                    .unwrap();
                }
                Op::Punch(off, len) => {
                    let mode = FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE;
                    o.fallocate(big, off, len, mode).unwrap();
                }
                _ => unreachable!(),
            }
        }
        match op {
            Op::Remount | Op::Kill => {
                drop(o);
                o = s.open();
            }
            Op::Seal(rebase) => {
                seals += 1;
                s.seal(&o, &format!("s{seals}"), *rebase);
            }
            _ => {}
        }
        prop_assert!(
            read_all(&o, "big") == s.model,
            "big after step {} {:?}",
            k,
            op
        );
        let alias = s.alias().cloned().unwrap_or_default();
        prop_assert!(
            read_all(&o, "alias") == alias,
            "alias after step {} {:?}",
            k,
            op
        );
    }
    s.seal(&o, "last", false);
    drop(o);
    let o = s.open();
    prop_assert!(read_all(&o, "big") == s.model, "after the last remount");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn chunked_copy_up_matches_the_model_across_remounts_and_seals(
        ops in prop::collection::vec(op(), 1..10)
    ) {
        check(&ops)?;
    }
}

/// Truncations at each chunk boundary and one byte either side, then
/// growth again: the cut chunks never come back from the packet.
#[test]
fn truncations_at_chunk_boundaries_and_growth_again() {
    for size in [C - 1, C, C + 1, 2 * C - 1, 2 * C, 2 * C + 1, 0] {
        let ops = [
            Op::Truncate(size),
            Op::Remount,
            Op::Truncate(3 * C),
            Op::WriteAt(size.saturating_sub(1), 3, 5),
            Op::Remount,
            Op::Seal(true),
            Op::Append(10, 3),
        ];
        check(&ops).unwrap_or_else(|e| panic!("size {size}: {e}"));
    }
}
