//! Property tests: random trees round-trip byte-exactly; the manifest codec
//! is its own inverse; garbage and mutations never panic the reader.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::trees::{build, name, node};
use common::*;
use proptest::prelude::*;
use sessionfs::api::Packet;
use sessionfs::api::Sha256;
use sessionfs::api::verify;
use sessionfs::api::{Entry, EntryKind, FileMeta, Manifest};
use sessionfs::api::{HarnessKind, Limits, Version, chunk_count};
use sessionfs::api::{PackOptions, pack as pack_lib};
use sessionfs::api::{UnpackOptions, unpack};

fn opts(ws: &Path, out: &Path) -> PackOptions {
    opts_holding(ws, out, 256 << 20)
}

/// Options holding at most `hold_memory` bytes of small files between
/// pack's passes.
fn opts_holding(ws: &Path, out: &Path, hold_memory: u64) -> PackOptions {
    PackOptions {
        workspace: sessionfs::api::Input::Dir(ws.to_owned()),
        harness: None,
        output: out.to_owned(),
        remote: None,
        zero_mtimes: false,
        reject_external_symlinks: false,
        exclude: vec![],
        keep: vec![],
        limits: Limits::DEFAULT,
        mode: 0o644,
        hold_memory: Some(hold_memory),
        file_sha256: true,
        version: Version::CURRENT,
        barrier: None,
    }
}

fn mtimes(root: &Path) -> Vec<(PathBuf, i64, i64)> {
    let mut out = Vec::new();
    for (rel, desc) in snapshot(root) {
        if desc.starts_with("file") {
            let m = fs::metadata(root.join(&rel)).unwrap();
            out.push((PathBuf::from(rel), m.mtime(), m.mtime_nsec()));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_trees_round_trip(
        children in prop::collection::btree_map(name(), node(), 0..8),
        hold in 0u64..12_000,
        version in prop::sample::select(&Version::ALL[..]),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        build(&ws, &children);
        let p1 = tmp.path().join("1.packet");
        let r1 = pack_lib(&PackOptions { version, ..opts(&ws, &p1) }, &|_| {}).unwrap();
        let packet = Packet::open(&p1, &Limits::DEFAULT).unwrap();
        verify(&packet, &|_| {}).unwrap();
        let out = tmp.path().join("out");
        let u = UnpackOptions { into: out.clone(), part: None, strict_symlinks: false, digest: Some(r1.digest), owner: None };
        unpack(&packet, &u, &|_| {}).unwrap();
        prop_assert_eq!(snapshot(&ws), snapshot(&out.join("workspace")));
        prop_assert_eq!(mtimes(&ws), mtimes(&out.join("workspace")));
        let p2 = tmp.path().join("2.packet");
        // Packed again with some, or none, of its files held between the
        // passes: the same bytes.
        let r2 = pack_lib(
            &PackOptions { version, ..opts_holding(&out.join("workspace"), &p2, hold) },
            &|_| {},
        )
        .unwrap();
        prop_assert_eq!(r1.digest, r2.digest);
        prop_assert_eq!(fs::read(&p1).unwrap(), fs::read(&p2).unwrap());
        // What pack calls external is what strict unpack refuses: packed
        // with --reject-external-symlinks, a tree passes
        // --strict-symlinks; refused, it had links reported external.
        let p3 = tmp.path().join("3.packet");
        let strict = PackOptions { reject_external_symlinks: true, ..opts(&ws, &p3) };
        match pack_lib(&strict, &|_| {}) {
            Ok(_) => {
                prop_assert!(r1.report.external_symlinks.is_empty());
                let packet = Packet::open(&p3, &Limits::DEFAULT).unwrap();
                let u = UnpackOptions {
                    into: tmp.path().join("strict"),
                    part: Some(sessionfs::api::Part::Workspace),
                    strict_symlinks: true,
                    digest: None,
                    owner: None,
                };
                let restored = unpack(&packet, &u, &|_| {});
                prop_assert!(restored.is_ok(), "strict unpack refused: {:?}", restored.err());
            }
            Err(e) => {
                prop_assert_eq!(e.kind(), "external_symlink");
                prop_assert!(!r1.report.external_symlinks.is_empty());
            }
        }
    }
}

fn manifest_strategy() -> impl Strategy<Value = Manifest> {
    let entry = (
        "[a-zA-Z0-9é\"' ]{1,10}",
        prop_oneof![
            Just(None),
            (
                0u64..20_000_000,
                0u64..=sessionfs::api::MAX_MTIME_NS,
                any::<bool>(),
                any::<[u8; 32]>()
            )
                .prop_map(Some),
        ],
        prop::option::of("[ -~\u{1}-\u{1f}é]{1,30}"),
    );
    (
        prop::collection::vec(entry, 0..20),
        prop::option::of(0usize..4),
        prop::sample::select(&Version::ALL[..]),
    )
        .prop_map(|(raw, harness, version)| {
            let mut entries = vec![Entry {
                path: "workspace".into(),
                kind: EntryKind::Dir,
            }];
            let mut keys = std::collections::HashSet::new();
            for (n, file, link) in raw {
                let path = format!("workspace/{n}");
                if !keys.insert(sessionfs::api::collision_key(&path).into_owned()) {
                    continue;
                }
                let kind = match (file, link) {
                    (Some((size, mtime_ns, executable, h)), _) => {
                        let chunks: Box<[Sha256]> =
                            vec![Sha256(h); chunk_count(size) as usize].into();
                        EntryKind::File(FileMeta {
                            size,
                            mtime_ns,
                            executable,
                            // In `/2` a file with chunks is known by them.
                            sha256: if version.whole_file_hash(size) {
                                Sha256(h)
                            } else {
                                sessionfs::api::chunk_list_hash(&chunks)
                            },
                            chunks,
                        })
                    }
                    (None, Some(t)) => EntryKind::Symlink(t.into()),
                    (None, None) => EntryKind::Dir,
                };
                entries.push(Entry {
                    path: path.into(),
                    kind,
                });
            }
            let mut harness_kind = None;
            if let Some(k) = harness {
                harness_kind = Some(HarnessKind::ALL[k]);
                entries.push(Entry {
                    path: "harness".into(),
                    kind: EntryKind::Dir,
                });
            }
            entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
            Manifest {
                version,
                harness: harness_kind,
                entries,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn manifest_codec_round_trips(m in manifest_strategy()) {
        let bytes = m.encode();
        let parsed = Manifest::parse(&bytes, &Limits::DEFAULT).unwrap();
        prop_assert_eq!(&parsed, &m);
        prop_assert_eq!(parsed.encode(), bytes);
    }

    #[test]
    fn manifest_parser_never_panics_on_garbage(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = Manifest::parse(&bytes, &Limits::DEFAULT);
    }

    #[test]
    fn mutated_manifests_never_panic_and_never_reencode_differently(
        m in manifest_strategy(), at in any::<prop::sample::Index>(), byte in any::<u8>()
    ) {
        let mut bytes = m.encode();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        // Anything the parser accepts must be canonical: re-encoding gives
        // back the exact bytes (one encoding per manifest).
        if let Ok(parsed) = Manifest::parse(&bytes, &Limits::DEFAULT) {
            prop_assert_eq!(parsed.encode(), bytes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Truncated, extended or corrupted packets give errors, never panics,
    /// and a corrupted one never verifies unless its digest changed.
    #[test]
    fn mutated_packets_never_panic(cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), byte in any::<u8>(), mode in 0u8..3) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        sample_small(&ws);
        let p = tmp.path().join("p.packet");
        let good = pack_lib(&opts(&ws, &p), &|_| {}).unwrap();
        let mut bytes = fs::read(&p).unwrap();
        match mode {
            0 => bytes.truncate(cut.index(bytes.len())),
            1 => { let i = flip.index(bytes.len()); bytes[i] ^= byte.max(1); }
            _ => bytes.extend(std::iter::repeat_n(byte, 1 + cut.index(1024))),
        }
        let bad = tmp.path().join("bad.packet");
        fs::write(&bad, &bytes).unwrap();
        if let Ok(packet) = Packet::open(&bad, &Limits::DEFAULT) {
            if verify(&packet, &|_| {}).is_ok() {
                prop_assert_ne!(packet.digest, good.digest, "a changed packet verified under the same digest");
            }
        }
    }
}

fn sample_small(root: &Path) {
    write(root, "a.txt", b"alpha\n");
    write(root, "d/b.txt", &[7u8; 1500]);
    std::os::unix::fs::symlink("a.txt", root.join("l")).unwrap();
    set_mtime(&root.join("a.txt"), 1_000_000_000_000_000_123);
}
