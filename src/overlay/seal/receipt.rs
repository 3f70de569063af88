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
                if old.entries[o] != *e {
                    changes.push(Change::Modified {
                        path: e.path.to_string(),
                        old_sha256: sha(&old.entries[o]),
                        new_sha256: sha(e),
                    });
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
                    old_sha256: sha(&old.entries[o]),
                    new_sha256: sha(e),
                });
            }
            // Something new where a lower entry of the same path was.
            (_, Some(p)) => {
                if !accounted[p] && old.entries[p].type_name() == e.type_name() {
                    accounted[p] = true;
                    if old.entries[p] != *e {
                        changes.push(Change::Modified {
                            path: e.path.to_string(),
                            old_sha256: sha(&old.entries[p]),
                            new_sha256: sha(e),
                        });
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
            deleted.insert(&e.path, sha(e));
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
}
