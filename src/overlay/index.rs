//! The lower layer as a tree: a compact index over the manifest, built once
//! at mount in time linear in the entries, without touching file content.
//!
//! Entries are sorted by path bytes, so a directory's children, taken in
//! entry order, come in name order: children lists are filled in one pass,
//! and a name is found by binary search.

use hashbrown::HashMap;
use rayon::prelude::*;

use crate::packet::manifest::{Entry, EntryKind, Manifest};
use crate::packet::path::file_name;

use super::ino::{Ino, InoAllocator};

/// Index of an entry in the manifest.
pub type Idx = u32;

/// No parent (a part root).
pub use crate::packet::manifest::NO_PARENT;

/// The lower tree.
pub struct LowerIndex {
    /// Parent of each entry.
    parent: Vec<Idx>,
    /// `children[child_start[i]..child_start[i + 1]]` are entry `i`'s
    /// children, in name order.
    child_start: Vec<u32>,
    children: Vec<Idx>,
    /// Number of subdirectories of each entry (for link counts).
    subdirs: Vec<u32>,
    /// Inode number of each entry.
    ino: Vec<Ino>,
    /// The reverse.
    by_ino: HashMap<Ino, Idx>,
    /// Index of `workspace` and `harness` (when present).
    roots: Vec<Idx>,
}

impl LowerIndex {
    /// Builds the index of a validated manifest, allocating inode numbers
    /// (in path order) from `inos`.
    #[cfg(test)]
    pub fn build(m: &Manifest, inos: &mut InoAllocator) -> LowerIndex {
        let parent = m.validate_tree(&crate::packet::format::Limits::DEFAULT);
        LowerIndex::build_with(m, parent.expect("a valid manifest"), inos, &HashMap::new())
    }

    /// Builds the index of a validated manifest from the parents its
    /// validation found, with the inode numbers of some paths given (a
    /// rebase keeps the numbers entries had before it).
    pub fn build_with(
        m: &Manifest,
        parent: Vec<Idx>,
        inos: &mut InoAllocator,
        given: &HashMap<String, Ino>,
    ) -> LowerIndex {
        let n = m.entries.len();
        assert_eq!(parent.len(), n, "one parent per entry");
        let mut counts = vec![0u32; n + 1];
        let mut subdirs = vec![0u32; n];
        let mut roots = Vec::new();
        for (i, e) in m.entries.iter().enumerate() {
            match parent[i] {
                NO_PARENT => roots.push(i as Idx),
                p => {
                    counts[p as usize] += 1;
                    if e.is_dir() {
                        subdirs[p as usize] += 1;
                    }
                }
            }
        }
        // Prefix sums, then fill in entry order (which is name order within
        // each directory).
        let mut child_start = vec![0u32; n + 1];
        let mut acc = 0u32;
        for i in 0..n {
            child_start[i] = acc;
            acc += counts[i];
        }
        child_start[n] = acc;
        let mut fill = child_start.clone();
        let mut children = vec![0 as Idx; acc as usize];
        for (i, &p) in parent.iter().enumerate() {
            if p != NO_PARENT {
                children[fill[p as usize] as usize] = i as Idx;
                fill[p as usize] += 1;
            }
        }
        // The hashes are independent: both cores compute them; numbers are
        // then claimed in path order, so collisions resolve the same way on
        // every mount.
        let first: Vec<Ino> = m
            .entries
            .par_iter()
            .map(|e| super::ino::candidate(&e.path, 0))
            .collect();
        let mut ino = Vec::with_capacity(n);
        let mut by_ino = HashMap::with_capacity(n);
        for &x in given.values() {
            inos.claim(x);
        }
        for (i, e) in m.entries.iter().enumerate() {
            // A number given to several paths (the names of a file hard-
            // linked before a rebase; separate files in the packet) stays
            // with the first: one number is one file.
            let x = match given.get(&*e.path) {
                Some(&x) if !by_ino.contains_key(&x) => x,
                _ => inos.allocate_from(&e.path, first[i]),
            };
            ino.push(x);
            by_ino.insert(x, i as Idx);
        }
        LowerIndex {
            parent,
            child_start,
            children,
            subdirs,
            ino,
            by_ino,
            roots,
        }
    }

    /// Entry `i`'s parent, or `None` for a part root.
    pub fn parent(&self, i: Idx) -> Option<Idx> {
        let p = self.parent[i as usize];
        (p != NO_PARENT).then_some(p)
    }

    /// Entry `i`'s children, in name order.
    pub fn children(&self, i: Idx) -> &[Idx] {
        let (a, b) = (
            self.child_start[i as usize],
            self.child_start[i as usize + 1],
        );
        &self.children[a as usize..b as usize]
    }

    /// Number of subdirectories of entry `i`.
    pub fn subdirs(&self, i: Idx) -> u32 {
        self.subdirs[i as usize]
    }

    /// The child of directory `dir` named `name`.
    pub fn child(&self, m: &Manifest, dir: Idx, name: &str) -> Option<Idx> {
        let kids = self.children(dir);
        kids.binary_search_by(|&c| {
            file_name(&m.entries[c as usize].path)
                .as_bytes()
                .cmp(name.as_bytes())
        })
        .ok()
        .map(|k| kids[k])
    }

    /// The part roots (`harness` before `workspace`).
    pub fn roots(&self) -> &[Idx] {
        &self.roots
    }

    /// Inode number of entry `i`.
    pub fn ino(&self, i: Idx) -> Ino {
        self.ino[i as usize]
    }

    /// The entry with inode number `ino`.
    pub fn by_ino(&self, ino: Ino) -> Option<Idx> {
        self.by_ino.get(&ino).copied()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }
}

/// The file type of an entry.
pub fn entry_kind(e: &Entry) -> super::node::Kind {
    match e.kind {
        EntryKind::Dir => super::node::Kind::Dir,
        EntryKind::File(_) => super::node::Kind::File,
        EntryKind::Symlink(_) => super::node::Kind::Symlink,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::manifest::FileMeta;

    fn m(paths: &[(&str, bool)]) -> Manifest {
        let mut entries: Vec<Entry> = paths
            .iter()
            .map(|(p, dir)| Entry {
                path: (*p).into(),
                kind: if *dir {
                    EntryKind::Dir
                } else {
                    EntryKind::File(FileMeta::default())
                },
            })
            .collect();
        entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        Manifest {
            version: Default::default(),
            harness: None,
            entries,
        }
    }

    #[test]
    fn children_are_found_across_interleaved_descendants() {
        // Byte order interleaves: a, a-b, a/b, a/b/x, a/c, a.txt.
        let man = m(&[
            ("workspace", true),
            ("workspace/a", true),
            ("workspace/a-b", false),
            ("workspace/a/b", true),
            ("workspace/a/b/x", false),
            ("workspace/a/c", false),
            ("workspace/a.txt", false),
        ]);
        let mut inos = InoAllocator::default();
        let ix = LowerIndex::build(&man, &mut inos);
        let find = |p: &str| man.entries.iter().position(|e| &*e.path == p).unwrap() as Idx;
        let names = |i: Idx| -> Vec<String> {
            ix.children(i)
                .iter()
                .map(|&c| file_name(&man.entries[c as usize].path).to_owned())
                .collect()
        };
        assert_eq!(names(find("workspace")), ["a", "a-b", "a.txt"]);
        assert_eq!(names(find("workspace/a")), ["b", "c"]);
        assert_eq!(names(find("workspace/a/b")), ["x"]);
        assert_eq!(
            ix.child(&man, find("workspace"), "a.txt"),
            Some(find("workspace/a.txt"))
        );
        assert_eq!(ix.child(&man, find("workspace"), "zz"), None);
        assert_eq!(
            ix.parent(find("workspace/a/b/x")),
            Some(find("workspace/a/b"))
        );
        assert_eq!(ix.subdirs(find("workspace")), 1);
        assert_eq!(ix.roots(), &[find("workspace")]);
        for i in 0..man.entries.len() as Idx {
            assert_eq!(ix.by_ino(ix.ino(i)), Some(i));
        }
    }
}
