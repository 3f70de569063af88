//! The receipt: every difference between the old manifest and the new.

use super::*;
use std::collections::BTreeMap;

/// Every difference between the old manifest and the sealed one.
pub(super) fn receipt(old: &Manifest, items: &[Item], new: &Manifest) -> Vec<Change> {
    let old_by_path: HashMap<&str, usize> = old
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (&*e.path, i))
        .collect();
    let sha = |e: &Entry| e.file().map(|f| f.sha256);
    // An old file's id as the new packet's version gives it: a chunked
    // file of a `/1` parent is known by its chunk list in a `/2` packet,
    // and equal content has the new id whatever the parent's version.
    let old_sha = |o: &Entry, n: Option<&Entry>| {
        let f = o.file()?;
        match n.and_then(Entry::file) {
            Some(nf) if same_content(f, nf) => Some(nf.sha256),
            _ if !f.chunks.is_empty() && !new.version.whole_file_hash(f.size) => {
                Some(chunk_list_hash(&f.chunks))
            }
            _ => Some(f.sha256),
        }
    };
    let origin_of = |it: &Item| {
        match &it.kind {
            ItemKind::File(f) => f.origin,
            _ => it.origin,
        }
        .map(|i| i as usize)
    };
    // A lower entry still at its path is accounted for there, whatever
    // comes before it in path order: another name of it (a hard link made
    // on the mount) is new, not the entry renamed.
    let mut accounted = vec![false; old.entries.len()];
    for (it, e) in items.iter().zip(&new.entries) {
        if let Some(o) = origin_of(it)
            && old_by_path.get(&*e.path) == Some(&o)
        {
            accounted[o] = true;
        }
    }
    let mut changes = Vec::new();
    for (it, e) in items.iter().zip(&new.entries) {
        let origin = origin_of(it);
        let same_path = old_by_path.get(&*e.path).copied();
        match (origin, same_path) {
            // From the lower entry at the same path.
            (Some(o), Some(p)) if o == p => {
                accounted[o] = true;
                if !same_entry(&old.entries[o], e) {
                    changes.push(modified(
                        &old.entries[o],
                        e,
                        old_sha(&old.entries[o], Some(e)),
                    ));
                }
            }
            // A lower entry moved here (directories are not reported: their
            // contents are), unless it is accounted for at its own path or
            // by an earlier name.
            (Some(o), _) if !e.is_dir() && !accounted[o] => {
                accounted[o] = true;
                changes.push(Change::Renamed {
                    from: old.entries[o].path.to_string(),
                    to: e.path.to_string(),
                    old_sha256: old_sha(&old.entries[o], Some(e)),
                    new_sha256: sha(e),
                });
            }
            // Something new where a lower entry of the same path was.
            (_, Some(p)) => {
                if !accounted[p] && old.entries[p].type_name() == e.type_name() {
                    accounted[p] = true;
                    if !same_entry(&old.entries[p], e) {
                        changes.push(modified(
                            &old.entries[p],
                            e,
                            old_sha(&old.entries[p], Some(e)),
                        ));
                    }
                } else {
                    changes.push(Change::Added {
                        path: e.path.to_string(),
                        kind: e.type_name(),
                        sha256: sha(e),
                    });
                }
            }
            // New: a directory moved here (its old path, gone, is
            // deleted), or another name of a file accounted for.
            (_, None) => {
                changes.push(Change::Added {
                    path: e.path.to_string(),
                    kind: e.type_name(),
                    sha256: sha(e),
                });
            }
        }
    }
    // A lower entry that moved is reported as renamed, not also deleted.
    let mut deleted: BTreeMap<&str, Option<Sha256>> = BTreeMap::new();
    for (i, e) in old.entries.iter().enumerate() {
        if !accounted[i] && !new_has(new, &e.path) {
            deleted.insert(&e.path, old_sha(e, None));
        }
    }
    for (path, old_sha256) in deleted {
        changes.push(Change::Deleted {
            path: path.to_string(),
            old_sha256,
        });
    }
    // By path (a rename by its new one), as the receipt promises.
    changes.sort_by(|a, b| a.path().as_bytes().cmp(b.path().as_bytes()));
    changes
}

/// Whether two files hold the same content, whatever the versions of
/// their manifests: the same chunk list, or the same whole-content hash.
fn same_content(a: &FileMeta, b: &FileMeta) -> bool {
    a.size == b.size
        && if a.chunks.is_empty() {
            a.sha256 == b.sha256
        } else {
            a.chunks == b.chunks
        }
}

/// Whether an entry is unchanged: path, type, and for a file its
/// content, mtime and executable bit, for a symlink its target.
fn same_entry(a: &Entry, b: &Entry) -> bool {
    a.path == b.path
        && match (&a.kind, &b.kind) {
            (EntryKind::Dir, EntryKind::Dir) => true,
            (EntryKind::Symlink(x), EntryKind::Symlink(y)) => x == y,
            (EntryKind::File(x), EntryKind::File(y)) => {
                x.mtime_ns == y.mtime_ns && x.executable == y.executable && same_content(x, y)
            }
            _ => false,
        }
}

/// `old` modified into `new`, with how many chunks changed when both have
/// chunks (a partly written large file: an append, a page of a database).
fn modified(old: &Entry, new: &Entry, old_sha256: Option<Sha256>) -> Change {
    let chunks_changed = match (old.file(), new.file()) {
        (Some(a), Some(b)) if !b.chunks.is_empty() => Some(
            b.chunks
                .iter()
                .enumerate()
                .filter(|(k, c)| a.chunks.get(*k) != Some(c))
                .count() as u64,
        ),
        _ => None,
    };
    Change::Modified {
        path: new.path.to_string(),
        old_sha256,
        new_sha256: new.file().map(|f| f.sha256),
        chunks_changed,
    }
}

impl Change {
    /// The path a change is listed by: a rename's new one.
    fn path(&self) -> &str {
        match self {
            Change::Added { path, .. }
            | Change::Modified { path, .. }
            | Change::Deleted { path, .. } => path,
            Change::Renamed { to, .. } => to,
        }
    }
}

fn new_has(new: &Manifest, path: &str) -> bool {
    new.entries
        .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest entry: a directory (`dir`), or a file with `content`.
    fn entry(path: &str, content: Option<&str>) -> Entry {
        Entry {
            path: path.into(),
            kind: match content {
                None => EntryKind::Dir,
                Some(c) => EntryKind::File(FileMeta {
                    size: c.len() as u64,
                    mtime_ns: 0,
                    executable: false,
                    sha256: Sha256::of(c.as_bytes()),
                    chunks: Box::new([]),
                }),
            },
        }
    }

    /// The item a seal collects for `e`, from old entry `origin`.
    fn item(e: &Entry, origin: Option<Idx>) -> Item {
        Item {
            path: e.path.to_string(),
            ino: 0,
            kind: match &e.kind {
                EntryKind::File(f) => ItemKind::File(FileItem {
                    from: Source::Upper(0),
                    reuse: None,
                    origin,
                    size: f.size,
                    mtime_ns: 0,
                    executable: false,
                }),
                _ => ItemKind::Dir,
            },
            origin,
        }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest {
            version: Default::default(),
            harness: None,
            entries,
        }
    }

    /// `(op, path)` of each change.
    fn ops(changes: &[Change]) -> Vec<(&'static str, String)> {
        changes
            .iter()
            .map(|c| match c {
                Change::Added { path, .. } => ("added", path.clone()),
                Change::Modified { path, .. } => ("modified", path.clone()),
                Change::Deleted { path, .. } => ("deleted", path.clone()),
                Change::Renamed { from, to, .. } => ("renamed", format!("{from} -> {to}")),
            })
            .collect()
    }

    #[test]
    fn receipts_name_each_change_once_in_path_order() {
        let old = manifest(vec![
            entry("workspace", None),
            entry("workspace/a.txt", Some("a")),
            entry("workspace/gone.txt", Some("g")),
            entry("workspace/old", None),
            entry("workspace/old/f.txt", Some("f")),
            entry("workspace/same.txt", Some("s")),
        ]);
        // (new entry, the old entry it comes from)
        let new: Vec<(Entry, Option<Idx>)> = vec![
            (entry("workspace", None), Some(0)),
            // Changed in place.
            (entry("workspace/a.txt", Some("A")), Some(1)),
            // Another name of a.txt made on the mount: new, not a rename.
            (entry("workspace/a2.txt", Some("a")), Some(1)),
            // New.
            (entry("workspace/b.txt", Some("b")), None),
            // The directory moved: its path is new, its file renamed.
            (entry("workspace/new", None), Some(3)),
            (entry("workspace/new/f.txt", Some("f")), Some(4)),
            // Untouched.
            (entry("workspace/same.txt", Some("s")), Some(5)),
        ];
        let items: Vec<Item> = new.iter().map(|(e, o)| item(e, *o)).collect();
        let new = manifest(new.into_iter().map(|(e, _)| e).collect());
        let got = receipt(&old, &items, &new);
        let want: Vec<(&str, String)> = vec![
            ("modified", "workspace/a.txt".into()),
            ("added", "workspace/a2.txt".into()),
            ("added", "workspace/b.txt".into()),
            ("deleted", "workspace/gone.txt".into()),
            ("added", "workspace/new".into()),
            (
                "renamed",
                "workspace/old/f.txt -> workspace/new/f.txt".into(),
            ),
            ("deleted", "workspace/old".into()),
        ];
        // (By path, a rename by its new one.)
        assert_eq!(ops(&got), want);
        // A modification carries both hashes; a deletion the old one.
        let modified = got
            .iter()
            .find(|c| matches!(c, Change::Modified { .. }))
            .unwrap();
        assert_eq!(
            modified,
            &Change::Modified {
                path: "workspace/a.txt".into(),
                old_sha256: Some(Sha256::of(b"a")),
                new_sha256: Some(Sha256::of(b"A")),
                chunks_changed: None,
            }
        );
        // Nothing changed: nothing to report.
        let items: Vec<Item> = old
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| item(e, Some(i as Idx)))
            .collect();
        assert_eq!(receipt(&old, &items, &old), vec![]);
    }

    /// A file of `chunks` (one 4 MiB chunk per hash, the last of 1 byte),
    /// identified as `version` identifies it.
    fn chunked(path: &str, chunks: &[u8], version: Version) -> Entry {
        let list: Vec<Sha256> = chunks.iter().map(|&c| Sha256([c; 32])).collect();
        Entry {
            path: path.into(),
            kind: EntryKind::File(FileMeta {
                size: (chunks.len() as u64 - 1) * crate::packet::format::CHUNK_SIZE + 1,
                mtime_ns: 0,
                executable: false,
                sha256: if version == Version::V1 {
                    Sha256([0xee; 32])
                } else {
                    chunk_list_hash(&list)
                },
                chunks: list.into(),
            }),
        }
    }

    #[test]
    fn a_partly_written_file_is_modified_with_its_changed_chunks_whatever_the_versions() {
        let v = |version, entries| Manifest {
            version,
            harness: None,
            entries,
        };
        let root = entry("workspace", None);
        for parent in Version::ALL {
            let old = v(
                parent,
                vec![
                    root.clone(),
                    chunked("workspace/db", &[1, 2, 3], parent),
                    chunked("workspace/same", &[7, 8], parent),
                ],
            );
            let new = v(
                Version::V2,
                vec![
                    root.clone(),
                    chunked("workspace/db", &[1, 2, 4, 5], Version::V2),
                    chunked("workspace/same", &[7, 8], Version::V2),
                ],
            );
            let items: Vec<Item> = new
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| item(e, Some(i as Idx)))
                .collect();
            // The untouched file is not modified by the change of version,
            // and the old id is given in the new packet's terms.
            assert_eq!(
                receipt(&old, &items, &new),
                vec![Change::Modified {
                    path: "workspace/db".into(),
                    old_sha256: Some(chunk_list_hash(&[
                        Sha256([1; 32]),
                        Sha256([2; 32]),
                        Sha256([3; 32])
                    ])),
                    new_sha256: new.entries[1].file().map(|f| f.sha256),
                    chunks_changed: Some(2),
                }],
                "parent {parent:?}"
            );
        }
    }
}
