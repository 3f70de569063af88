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
