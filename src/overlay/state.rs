//! The merged view in memory: the lower index plus the nodes that differ
//! from it, and the one function that changes it, [`State::apply`], used
//! both live (after the record is in the journal) and when replaying.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::{Error, Result};
use super::index::{Idx, LowerIndex};
use super::ino::{Ino, InoAllocator, ROOT};
use super::journal::{Nanos, Record};
use super::listing::{Listing, cookie};
use super::node::{Content, Count, Flag, Kind, Node};
use crate::packet::format::{MODE_DIR, MODE_EXEC, MODE_FILE, MODE_SYMLINK};
use crate::packet::manifest::{EntryKind, Manifest};
use crate::packet::path::file_name;
use crate::packet::reader::Packet;

/// What the mount's root is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// The packet root: a directory holding the parts, which cannot change.
    Packet,
    /// One part's root directory (its lower entry).
    Part(Idx),
}

/// The read-only lower layer, shared by every thread.
pub struct Lower {
    /// The packet.
    pub packet: Packet,
    /// Its tree.
    pub index: LowerIndex,
    /// The mount root.
    pub root: Root,
    /// Owner shown for lower entries.
    pub uid: u32,
    /// Group shown for lower entries.
    pub gid: u32,
    /// Time shown for lower directories and symlinks: the newest file mtime.
    pub dir_time: Nanos,
    /// Which chunks of the packet have been verified.
    pub verifier: super::content::Verifier,
    /// The children of recently listed directories in cookie order (see
    /// [`super::listing`]): a directory is listed a batch at a time, and
    /// each batch would otherwise hash every name in it again.
    pub order: parking_lot::Mutex<lru::LruCache<Idx, Ordered>>,
}

/// A lower directory's children in cookie order: `(cookie, entry)`.
pub type Ordered = Arc<[(u64, Idx)]>;

/// Directories whose children [`Lower::order`] keeps in cookie order.
pub const ORDERED_DIRS: usize = 64;

impl Lower {
    /// Whether `path` names the packet file this layer reads: the open
    /// file, by device and inode, not the path it was opened by (the
    /// daemon may have been started elsewhere); never a remote packet.
    pub fn serves(&self, path: &std::path::Path) -> bool {
        self.packet.backing().serves(path)
    }

    /// The children of lower directory `dir` after position `after`, in
    /// cookie order: `(cookie, entry)`, at most `max`.
    pub fn children_after(&self, dir: Idx, after: u64, max: usize) -> Vec<(u64, Idx)> {
        let cached = self.order.lock().get(&dir).cloned();
        let order = cached.unwrap_or_else(|| {
            let mut v: Vec<(u64, Idx)> = self
                .index
                .children(dir)
                .iter()
                .map(|&c| (cookie(self.name(c)), c))
                .collect();
            v.sort_unstable();
            let v: Ordered = v.into();
            self.order.lock().put(dir, v.clone());
            v
        });
        let from = order.partition_point(|&(c, _)| c <= after);
        order[from..].iter().take(max).copied().collect()
    }

    /// The name of lower entry `i` (its last path component).
    pub fn name(&self, i: Idx) -> &str {
        file_name(&self.manifest().entries[i as usize].path)
    }

    /// The names and inode numbers of lower entries `entries` (a
    /// directory's children, the packet's roots).
    pub fn named<'a>(&'a self, entries: &'a [Idx]) -> impl Iterator<Item = (Box<str>, Ino)> + 'a {
        entries.iter().map(|&c| (self.name(c).into(), self.ino(c)))
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.packet.manifest
    }

    /// Inode number of lower entry `i` in this mount (the mount root is 1).
    pub fn ino(&self, i: Idx) -> Ino {
        if self.root == Root::Part(i) {
            ROOT
        } else {
            self.index.ino(i)
        }
    }

    /// The lower entry an inode number names, ignoring changes.
    pub fn idx(&self, ino: Ino) -> Option<Idx> {
        match (ino, self.root) {
            (ROOT, Root::Part(i)) => Some(i),
            (ROOT, Root::Packet) => None,
            _ => self
                .index
                .by_ino(ino)
                .filter(|&i| self.root != Root::Part(i)),
        }
    }

    /// Kind of lower entry `i`.
    pub fn kind(&self, i: Idx) -> Kind {
        super::index::entry_kind(&self.manifest().entries[i as usize])
    }

    /// The mtime (also the atime) and ctime a lower entry shows: a file's
    /// mtime is its `mtime_ns`, a directory's and a symlink's the newest
    /// file mtime in the packet; the ctime of a file or symlink is the
    /// [`content_stamp`] of its content (its SHA-256, or its target's), of
    /// a directory its mtime.
    pub fn times(&self, i: Idx) -> (Nanos, Nanos) {
        match &self.manifest().entries[i as usize].kind {
            EntryKind::Dir => (self.dir_time, self.dir_time),
            EntryKind::File(f) => (f.mtime_ns as Nanos, content_stamp(&f.sha256)),
            EntryKind::Symlink(target) => (
                self.dir_time,
                content_stamp(&crate::packet::digest::Sha256::of(target.as_bytes())),
            ),
        }
    }

    /// A pristine node for lower entry `i` (not yet in the state).
    pub fn node(&self, i: Idx, parent: Ino) -> Node {
        let e = &self.manifest().entries[i as usize];
        let (kind, perm, content) = match &e.kind {
            EntryKind::Dir => (Kind::Dir, MODE_DIR, Content::None),
            EntryKind::File(f) => (
                Kind::File,
                if f.executable { MODE_EXEC } else { MODE_FILE },
                Content::Lower(i),
            ),
            EntryKind::Symlink(_) => (Kind::Symlink, MODE_SYMLINK, Content::None),
        };
        let (time, ctime) = self.times(i);
        Node {
            kind,
            generation: 1,
            lower: Some(i),
            content,
            target: None,
            rdev: 0,
            perm: perm as u16,
            uid: self.uid,
            gid: self.gid,
            atime: time,
            mtime: time,
            ctime,
            nlink: 1,
            children: None,
            subdirs: self.index.subdirs(i),
            parent,
            name: file_name(&e.path).into(),
            lookups: Default::default(),
            chunks: None,
            modified: Flag::new(true),
        }
    }

    /// The parent inode of lower entry `i` in the pristine tree.
    pub fn parent_ino(&self, i: Idx) -> Ino {
        match self.index.parent(i) {
            Some(p) => self.ino(p),
            None => ROOT,
        }
    }
}

/// Where a directory's listing is (see [`State::children_of`]).
enum Children<'a> {
    /// Its own, once it differs from the lower one (or it has none).
    Own(&'a Listing),
    /// Its lower entry's children.
    Lower(Idx),
    /// Neither: no entries.
    Empty,
}

/// A resolved inode: a node, or a pristine lower entry.
#[derive(Clone, Copy)]
pub enum Ref<'a> {
    /// In the state.
    Node(&'a Node),
    /// Pristine.
    Lower(Idx),
}

/// The mutable merged view.
pub struct State {
    /// The lower layer the nodes refer to (replaced whole by a rebase).
    pub lower: std::sync::Arc<Lower>,
    /// Inodes that differ from the lower layer.
    pub nodes: HashMap<Ino, Node>,
    /// Inode numbers in use.
    pub inos: InoAllocator,
    /// Last generation handed out per reused number. A rebase carries it
    /// over: the kernel keeps an inode it holds across the rebase, and a
    /// number it knows coming back with another generation makes it drop
    /// that inode as stale, failing every open descriptor of it with `EIO`.
    gens: HashMap<Ino, u64>,
    /// Next data file id.
    pub next_data: u64,
    /// Records applied since mount (replayed ones included).
    pub applied: u64,
    /// Kernel references of lower entries that have no node yet, by
    /// index. A node takes its entry's count when it is materialized, so
    /// that a file unlinked while the kernel still holds it (open, mapped:
    /// the kernel sends no `OPEN` or `RELEASE`, see `fuse::fs`) keeps its
    /// content until the kernel's `FORGET`.
    refs: Box<[Count]>,
}

/// The generation `gens` last handed out for `ino`, else 1.
fn generation_in(gens: &HashMap<Ino, u64>, ino: Ino) -> u64 {
    gens.get(&ino).copied().unwrap_or(1)
}

impl State {
    /// The initial state over `lower`, its inode numbers claimed.
    pub fn new(lower: std::sync::Arc<Lower>, inos: InoAllocator) -> State {
        let mut nodes = HashMap::new();
        if lower.root == Root::Packet {
            let children: Listing = lower.named(lower.index.roots()).collect();
            let subdirs = children.len() as u32;
            nodes.insert(
                ROOT,
                Node {
                    kind: Kind::Dir,
                    generation: 1,
                    lower: None,
                    content: Content::None,
                    target: None,
                    rdev: 0,
                    perm: MODE_DIR as u16,
                    uid: lower.uid,
                    gid: lower.gid,
                    atime: lower.dir_time,
                    mtime: lower.dir_time,
                    ctime: lower.dir_time,
                    nlink: 1,
                    children: Some(children),
                    subdirs,
                    parent: ROOT,
                    name: "".into(),
                    lookups: Default::default(),
                    chunks: None,
                    modified: Flag::new(true),
                },
            );
        }
        State {
            nodes,
            inos,
            gens: HashMap::new(),
            next_data: 1,
            applied: 0,
            refs: (0..lower.manifest().entries.len())
                .map(|_| Count::default())
                .collect(),
            lower,
        }
    }

    /// Adds `delta` to the kernel's references of `ino` (a lookup, a
    /// forget); returns whether `ino` has a node that may now be dropped.
    pub fn add_ref(&self, ino: Ino, delta: i64) -> bool {
        match self.nodes.get(&ino) {
            Some(n) => {
                n.lookups.add(delta);
                n.droppable()
            }
            None => {
                if let Some(c) = self.lower.idx(ino).and_then(|i| self.refs.get(i as usize)) {
                    c.add(delta);
                }
                false
            }
        }
    }

    /// The kernel references of every inode that has any, for a rebase to
    /// carry over to the state that replaces this one.
    pub fn kernel_refs(&self) -> Vec<(Ino, u64)> {
        let lower = &self.lower;
        let mut out: Vec<(Ino, u64)> = self
            .refs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.get() > 0)
            .map(|(i, c)| (lower.ino(i as Idx), c.get()))
            .collect();
        out.extend(
            self.nodes
                .iter()
                .filter(|(_, n)| n.lookups.get() > 0)
                .map(|(&ino, n)| (ino, n.lookups.get())),
        );
        out
    }

    /// Resolves an inode number.
    pub fn get<'a>(&'a self, lower: &Lower, ino: Ino) -> Option<Ref<'a>> {
        if let Some(n) = self.nodes.get(&ino) {
            return Some(Ref::Node(n));
        }
        lower.idx(ino).map(Ref::Lower)
    }

    /// The kind of an inode.
    pub fn kind(&self, lower: &Lower, ino: Ino) -> Option<Kind> {
        match self.get(lower, ino)? {
            Ref::Node(n) => Some(n.kind),
            Ref::Lower(i) => Some(lower.kind(i)),
        }
    }

    /// Where the listing of directory `dir` is.
    fn children_of(&self, lower: &Lower, dir: Ino) -> Result<Children<'_>> {
        match self.get(lower, dir).ok_or(Error::NotFound)? {
            Ref::Node(n) if n.kind != Kind::Dir => Err(Error::NotDir),
            Ref::Node(n) => Ok(match (&n.children, n.lower) {
                (Some(listing), _) => Children::Own(listing),
                (None, Some(i)) => Children::Lower(i),
                (None, None) => Children::Empty,
            }),
            Ref::Lower(i) if lower.kind(i) != Kind::Dir => Err(Error::NotDir),
            Ref::Lower(i) => Ok(Children::Lower(i)),
        }
    }

    /// The child `name` of directory `dir`.
    pub fn child(&self, lower: &Lower, dir: Ino, name: &str) -> Result<Option<Ino>> {
        Ok(match self.children_of(lower, dir)? {
            Children::Own(listing) => listing.get(name).copied(),
            Children::Lower(i) => lower
                .index
                .child(lower.manifest(), i, name)
                .map(|c| lower.ino(c)),
            Children::Empty => None,
        })
    }

    /// The `(name, ino)` of directory `dir`, in name order.
    pub fn list(&self, lower: &Lower, dir: Ino) -> Result<Vec<(Box<str>, Ino)>> {
        Ok(match self.children_of(lower, dir)? {
            Children::Own(listing) => listing.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            Children::Lower(i) => lower.named(lower.index.children(i)).collect(),
            Children::Empty => Vec::new(),
        })
    }

    /// Up to `max` entries of directory `dir` after position `after`, in
    /// cookie order (see [`super::listing`]): `(cookie, name, inode)`.
    pub fn list_after(
        &self,
        lower: &Lower,
        dir: Ino,
        after: u64,
        max: usize,
    ) -> Result<Vec<(u64, Box<str>, Ino)>> {
        Ok(match self.children_of(lower, dir)? {
            Children::Own(listing) => listing
                .after(after)
                .take(max)
                .map(|(c, name, ino)| (c, name.into(), ino))
                .collect(),
            Children::Lower(i) => lower
                .children_after(i, after, max)
                .into_iter()
                .map(|(c, e)| (c, lower.name(e).into(), lower.ino(e)))
                .collect(),
            Children::Empty => Vec::new(),
        })
    }

    /// Whether directory `dir` has no entries.
    pub fn is_empty_dir(&self, lower: &Lower, dir: Ino) -> Result<bool> {
        Ok(match self.children_of(lower, dir)? {
            Children::Own(listing) => listing.is_empty(),
            Children::Lower(i) => lower.index.children(i).is_empty(),
            Children::Empty => true,
        })
    }

    /// The node of `ino`, materialized from the lower layer if pristine.
    pub fn node_mut(&mut self, lower: &Lower, ino: Ino) -> Result<&mut Node> {
        match self.nodes.entry(ino) {
            std::collections::hash_map::Entry::Occupied(o) => Ok(o.into_mut()),
            std::collections::hash_map::Entry::Vacant(v) => {
                let i = lower.idx(ino).ok_or(Error::NotFound)?;
                let mut n = lower.node(i, lower.parent_ino(i));
                n.generation = generation_in(&self.gens, ino);
                // (`lower` is always `self.lower`; `get` keeps a mix-up from
                // panicking.)
                if let Some(c) = self.refs.get(i as usize) {
                    n.lookups.add(c.take() as i64);
                }
                Ok(v.insert(n))
            }
        }
    }

    /// The listing of directory `dir`, materialized from the lower layer.
    fn listing_mut(&mut self, lower: &Lower, dir: Ino) -> Result<&mut Listing> {
        let n = self.node_mut(lower, dir)?;
        if n.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        if n.children.is_none() {
            let map = match n.lower {
                Some(i) => lower.named(lower.index.children(i)).collect(),
                None => Listing::default(),
            };
            n.children = Some(map);
        }
        n.children.as_mut().ok_or(Error::NotDir)
    }

    /// The packet path a directory has now, for numbering new inodes. Paths
    /// are those of the packet (`workspace/...`), whichever part is mounted.
    pub fn path_of_dir(&self, lower: &Lower, dir: Ino) -> String {
        let mut parts: Vec<String> = Vec::new();
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ROOT {
                if let Root::Part(i) = lower.root {
                    parts.push(lower.manifest().entries[i as usize].path.to_string());
                }
                break;
            }
            match self.get(lower, cur) {
                Some(Ref::Node(n)) => {
                    parts.push(n.name.to_string());
                    cur = n.parent;
                }
                Some(Ref::Lower(i)) => {
                    parts.push(lower.name(i).to_string());
                    cur = lower.parent_ino(i);
                }
                None => break,
            }
        }
        parts.reverse();
        parts.join("/")
    }

    /// The generation of lower entry `ino`: 1, unless the number was
    /// handed out on this mount before a rebase made it a lower entry.
    pub fn lower_generation(&self, ino: Ino) -> u64 {
        generation_in(&self.gens, ino)
    }

    /// Takes over the generations handed out in `from`, the state a rebase
    /// replaces (see `gens`); called while changes are held, so that none
    /// is handed out there after.
    pub fn carry_generations(&mut self, from: &State) {
        self.gens = from.gens.clone();
    }

    /// A number and generation for a new inode at `dir`/`name`.
    pub fn new_ino(&mut self, lower: &Lower, dir: Ino, name: &str) -> (Ino, u64) {
        let dp = self.path_of_dir(lower, dir);
        let path = if dp.is_empty() {
            name.to_string()
        } else {
            format!("{dp}/{name}")
        };
        let ino = self.inos.allocate(&path);
        let generation = self.gens.get(&ino).map_or(1, |g| g + 1);
        self.gens.insert(ino, generation);
        (ino, generation)
    }

    /// Forgets a node nothing refers to; returns its data file, if any, for
    /// the caller to remove.
    pub fn drop_if_unused(&mut self, ino: Ino) -> Option<u64> {
        let n = self.nodes.get(&ino)?;
        if !n.droppable() {
            return None;
        }
        let n = self.nodes.remove(&ino)?;
        self.inos.release(ino);
        match n.content {
            Content::Upper(id) => Some(id),
            _ => None,
        }
    }

    /// Applies one record of a journal being replayed: [`State::apply`],
    /// after the checks a live operation makes before it journals.
    pub fn apply_replayed(&mut self, lower: &Lower, rec: &Record) -> Result<Applied> {
        if let Record::Mknode { ino, .. } = rec {
            // A number is handed out again only once nothing uses it: here,
            // a node no name links to any more (which a replay keeps to the
            // end), never a lower entry or a node with a name.
            let in_use = match self.nodes.get(ino) {
                Some(n) => n.nlink > 0,
                None => self.inos.is_used(*ino),
            };
            if in_use {
                return Err(replay("a new node with a number another entry has"));
            }
        }
        self.apply(lower, rec)
    }

    /// Applies one record. Live operations check everything first, so a
    /// failure here means a journal that does not match its packet.
    pub fn apply(&mut self, lower: &Lower, rec: &Record) -> Result<Applied> {
        self.applied += 1;
        let mut out = Applied::default();
        match rec {
            Record::Mknode {
                t,
                ino,
                generation,
                parent,
                name,
                kind,
                perm,
                uid,
                gid,
                rdev,
                data,
                target,
            } => {
                let listing = self.listing_mut(lower, *parent)?;
                if listing.contains_key(name.as_str()) {
                    return Err(replay("create over an existing name"));
                }
                listing.insert(name.as_str().into(), *ino);
                let p = self.node_mut(lower, *parent)?;
                p.mtime = *t;
                p.ctime = *t;
                if *kind == Kind::Dir {
                    p.subdirs += 1;
                }
                let content = match (kind, data) {
                    (Kind::File, Some(id)) => {
                        self.next_data = self.next_data.max(id + 1);
                        Content::Upper(*id)
                    }
                    (Kind::File, None) => return Err(replay("file without a data file")),
                    _ => Content::None,
                };
                self.inos.claim(*ino);
                self.gens.insert(*ino, *generation);
                self.nodes.insert(
                    *ino,
                    Node {
                        kind: *kind,
                        generation: *generation,
                        lower: None,
                        content,
                        target: target.as_deref().map(Into::into),
                        rdev: *rdev,
                        perm: *perm & 0o7777,
                        uid: *uid,
                        gid: *gid,
                        atime: *t,
                        mtime: *t,
                        ctime: *t,
                        nlink: 1,
                        children: (*kind == Kind::Dir).then(Listing::default),
                        subdirs: 0,
                        parent: *parent,
                        name: name.as_str().into(),
                        lookups: Default::default(),
                        chunks: None,
                        modified: Flag::new(true),
                    },
                );
            }
            Record::Link {
                t,
                ino,
                parent,
                name,
            } => {
                let listing = self.listing_mut(lower, *parent)?;
                if listing.contains_key(name.as_str()) {
                    return Err(replay("link over an existing name"));
                }
                listing.insert(name.as_str().into(), *ino);
                let p = self.node_mut(lower, *parent)?;
                p.mtime = *t;
                p.ctime = *t;
                let n = self.node_mut(lower, *ino)?;
                n.nlink += 1;
                n.ctime = *t;
            }
            Record::Unlink { t, parent, name } => {
                let ino = self
                    .listing_mut(lower, *parent)?
                    .remove(name.as_str())
                    .ok_or_else(|| replay("unlink of a missing name"))?;
                let was_dir = self.unlink_inode(lower, ino, *t)?;
                let p = self.node_mut(lower, *parent)?;
                p.mtime = *t;
                p.ctime = *t;
                if was_dir {
                    p.subdirs = p.subdirs.saturating_sub(1);
                }
                out.unlinked = Some(ino);
            }
            Record::Rename {
                t,
                parent,
                name,
                newparent,
                newname,
                exchange,
            } => {
                let src = self
                    .listing_mut(lower, *parent)?
                    .get(name.as_str())
                    .copied()
                    .ok_or_else(|| replay("rename of a missing name"))?;
                let dst = self
                    .listing_mut(lower, *newparent)?
                    .get(newname.as_str())
                    .copied();
                let src_dir = self.kind(lower, src) == Some(Kind::Dir);
                if *exchange {
                    let dst = dst.ok_or_else(|| replay("exchange with a missing name"))?;
                    let dst_dir = self.kind(lower, dst) == Some(Kind::Dir);
                    self.listing_mut(lower, *parent)?
                        .insert(name.as_str().into(), dst);
                    self.listing_mut(lower, *newparent)?
                        .insert(newname.as_str().into(), src);
                    if src_dir != dst_dir && parent != newparent {
                        let (from, to) = if src_dir {
                            (*parent, *newparent)
                        } else {
                            (*newparent, *parent)
                        };
                        let f = self.node_mut(lower, from)?;
                        f.subdirs = f.subdirs.saturating_sub(1);
                        self.node_mut(lower, to)?.subdirs += 1;
                    }
                    for (ino, p, nm) in [(src, *newparent, newname), (dst, *parent, name)] {
                        let n = self.node_mut(lower, ino)?;
                        n.ctime = *t;
                        if n.kind == Kind::Dir {
                            n.parent = p;
                            n.name = nm.as_str().into();
                        }
                    }
                } else {
                    if let Some(d) = dst {
                        if d == src {
                            return Ok(out);
                        }
                        let was_dir = self.unlink_inode(lower, d, *t)?;
                        if was_dir {
                            let np = self.node_mut(lower, *newparent)?;
                            np.subdirs = np.subdirs.saturating_sub(1);
                        }
                        out.unlinked = Some(d);
                    }
                    self.listing_mut(lower, *parent)?.remove(name.as_str());
                    self.listing_mut(lower, *newparent)?
                        .insert(newname.as_str().into(), src);
                    if src_dir && parent != newparent {
                        let p = self.node_mut(lower, *parent)?;
                        p.subdirs = p.subdirs.saturating_sub(1);
                        self.node_mut(lower, *newparent)?.subdirs += 1;
                    }
                    let n = self.node_mut(lower, src)?;
                    n.ctime = *t;
                    if n.kind == Kind::Dir {
                        n.parent = *newparent;
                        n.name = newname.as_str().into();
                    }
                }
                for p in [*parent, *newparent] {
                    let pn = self.node_mut(lower, p)?;
                    pn.mtime = *t;
                    pn.ctime = *t;
                }
            }
            Record::Setattr {
                t,
                ino,
                perm,
                uid,
                gid,
                atime,
                mtime,
            } => {
                let n = self.node_mut(lower, *ino)?;
                if let Some(p) = perm {
                    n.perm = *p & 0o7777;
                }
                if let Some(u) = uid {
                    n.uid = *u;
                }
                if let Some(g) = gid {
                    n.gid = *g;
                }
                if let Some(a) = atime {
                    n.atime = *a;
                }
                if let Some(m) = mtime {
                    n.mtime = *m;
                }
                n.ctime = *t;
            }
            Record::Rebase { .. } => return Err(replay("a rebase in the middle of a journal")),
            Record::CopyUp {
                ino, data, chunks, ..
            } => {
                let n = self.node_mut(lower, *ino)?;
                let Content::Lower(i) = n.content else {
                    return Err(replay("copy-up of a file that is not lower"));
                };
                n.content = Content::Upper(*data);
                if *chunks {
                    let size = lower.manifest().entries[i as usize].size();
                    n.chunks = Some(std::sync::Arc::new(super::node::ChunkMap::all_lower(
                        i, size,
                    )));
                }
                self.next_data = self.next_data.max(data + 1);
            }
            Record::Hold { ino, chunks, .. } => {
                let n = self.node_mut(lower, *ino)?;
                let Some(map) = &n.chunks else {
                    return Err(replay("chunks held by a file not copied up by chunk"));
                };
                let count = super::node::ChunkMap::count(map.lower_size);
                for &[first, end] in chunks {
                    if first >= end || end > count {
                        return Err(replay("held chunks outside the file's lower chunks"));
                    }
                    (first..end).for_each(|k| map.hold(k));
                }
                if map.is_empty() {
                    // The data file holds it all: a plain upper file.
                    n.chunks = None;
                }
            }
        }
        Ok(out)
    }

    /// Drops one name of `ino`; returns whether it was a directory.
    fn unlink_inode(&mut self, lower: &Lower, ino: Ino, t: Nanos) -> Result<bool> {
        let n = self.node_mut(lower, ino)?;
        n.nlink = n.nlink.saturating_sub(1);
        n.ctime = t;
        let dir = n.kind == Kind::Dir;
        if dir {
            n.nlink = 0;
        }
        Ok(dir)
    }
}

/// Side effects of applying a record, for the live caller.
#[derive(Default, Debug)]
pub struct Applied {
    /// An inode that lost a name (it may now be droppable).
    pub unlinked: Option<Ino>,
}

/// Bits of a [`content_stamp`]'s whole seconds: 2^30 s ends in January
/// 2004, so a stamp is never in the future and never reads as a recent
/// change.
const STAMP_SECOND_BITS: u32 = 30;

/// The ctime a lower file or symlink shows, a function of its content
/// alone: whole seconds below 2^30 from the first 8 bytes of its SHA-256,
/// nanoseconds from the next 8. Git (and Bazel, and backup tools) decide
/// that a file is unchanged when its stat data is what they recorded: with
/// the ctime a stamp of the content, a file whose content changed never
/// shows the stat data recorded for other content (but by a 2^-30 chance,
/// 2^-60 where nanoseconds count, and only when the mtime, inode number
/// and size also match), on this mount, after a rebase or on a fresh
/// mount of a later packet, whatever the mtimes (`--zero-mtimes`
/// included); and a file whose content did not change shows the same
/// ctime on every mount of every packet that holds it. Part of the mount's
/// contract (docs/SEMANTICS.md, "Times"): a change here makes git re-read
/// every file once.
pub fn content_stamp(sha256: &crate::packet::digest::Sha256) -> Nanos {
    let word = |k: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&sha256.0[k..k + 8]);
        u64::from_le_bytes(b)
    };
    let secs = (word(0) >> (64 - STAMP_SECOND_BITS)) as Nanos;
    let nanos = (word(8) % 1_000_000_000) as Nanos;
    secs * 1_000_000_000 + nanos
}

fn replay(reason: &str) -> Error {
    Error::Replay {
        journal: String::new(),
        index: 0,
        reason: reason.into(),
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
