//! The merged view of a packet (lower, read-only, verified lazily) and an
//! upper directory (every change): the filesystem operations a mount needs,
//! with typed results and no FUSE in sight. `docs/SEMANTICS.md` is the
//! contract; `docs/upper-format.md` the on-disk format.
//!
//! Every change is a [`journal::Record`]: checked against the state,
//! appended to the journal with one `write`, then applied with
//! [`state::State::apply`], the same function that replays the journal at
//! mount. Data writes go straight to the upper data files.

pub mod content;
pub mod error;
pub mod index;
pub mod ino;
pub mod journal;
pub mod listing;
pub mod mount_info;
pub mod node;
pub mod seal;
pub mod secret;
pub mod split;
pub mod state;
pub mod upper;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

pub use error::{Error, Result};
use index::LowerIndex;
pub use ino::Ino;
use ino::{InoAllocator, ROOT};
use journal::{Nanos, Record};
pub use node::Kind;
use node::{Content, Node};
use state::{Lower, Ref, Root, State};
pub use upper::recorded_part;

use crate::packet::format::{MAX_COMPONENT_BYTES, MAX_FILE_SIZE};
use crate::packet::manifest::EntryKind;
use crate::packet::path::Part;
use crate::packet::reader::Packet;

/// Largest link count (as ext4).
pub const LINK_MAX: u32 = 65_000;

/// Attributes of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Generation.
    pub generation: u64,
    /// File type.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Access time (ns since the epoch).
    pub atime: Nanos,
    /// Modification time.
    pub mtime: Nanos,
    /// Change time.
    pub ctime: Nanos,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number.
    pub rdev: u64,
}

/// Who is asking: the credentials of the calling process.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// User.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// A time to set.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    /// The current time.
    Now,
    /// This time.
    At(Nanos),
}

/// A `setattr` request.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    /// New mode (permission bits are used).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
}

/// One directory entry.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Name.
    pub name: Box<str>,
    /// Inode.
    pub ino: Ino,
    /// Type.
    pub kind: Kind,
    /// Its position: `readdir` from it goes on after this entry (see
    /// [`listing`]).
    pub offset: u64,
}

/// Counters, for `status` and tests.
#[derive(Default)]
pub struct Stats {
    /// Name lookups (the kernel's `LOOKUP`), found or not.
    pub lookups: AtomicU64,
    /// Read requests.
    pub reads: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Write requests.
    pub writes: AtomicU64,
    /// Copy-ups.
    pub copy_ups: AtomicU64,
    /// Journal records appended.
    pub records: AtomicU64,
    /// Inodes whose content was read from their start (a `READ` at offset
    /// 0), in order (capped), for tests that check which files a tool read.
    /// A file read again from the kernel's page cache is not asked for.
    pub read_inodes: Mutex<Vec<Ino>>,
}

/// How many inodes [`Stats::read_inodes`] remembers.
const READ_LOG: usize = 1 << 16;

/// Options of [`Overlay::mount`].
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Owner shown for lower entries.
    pub uid: u32,
    /// Group shown for lower entries.
    pub gid: u32,
    /// Mount one part as the root.
    pub part: Option<Part>,
}

/// What the kernel may have cached that a rebase made stale.
#[derive(Clone, Copy, Debug)]
pub enum Stale<'a> {
    /// An inode's attributes.
    Attr(Ino),
    /// An inode's attributes and cached content (a symlink's target).
    Content(Ino),
    /// The name `.1` in directory `.0`: it now names another inode.
    Entry(Ino, &'a str),
}

/// Tells the kernel what it cached is stale.
pub type Invalidator = Box<dyn Fn(Stale<'_>) + Send + Sync>;

/// A mounted view: packet + upper directory.
pub struct Overlay {
    upper: upper::Upper,
    state: RwLock<State>,
    /// Held shared by every operation that changes the merged view (names,
    /// metadata, content), exclusively by a seal: a seal sees one state
    /// while readers keep going.
    mutations: RwLock<()>,
    /// Set when the mount is ending (its daemon was told to stop, and
    /// seals on the way out): every change is refused from then on, so
    /// none is acknowledged after the last seal took its view.
    ending: std::sync::atomic::AtomicBool,
    /// Held by the seal that runs: seals take turns here before they wait
    /// for changes to stop, so a seal waiting behind another can still be
    /// given up (see [`Overlay::seal`]).
    seal_turn: Mutex<()>,
    /// Writes the kernel may have cut in two, which a seal waits out.
    splits: split::Splits,
    /// The kernel's page size, where it cuts writes.
    page: u64,
    /// How the mount was made (kept for rebases).
    opts: Options,
    /// Tells the kernel an inode's attributes changed (see `set_invalidator`).
    invalidate: Mutex<Option<Invalidator>>,
    /// Nodes the kernel forgot while a seal held the state, to drop once
    /// it is done (see [`Overlay::forget`]).
    forgotten: Mutex<Vec<Ino>>,
    /// Files shown from the host (`mount --secret`), beside the state.
    secrets: secret::Secrets,
    /// Counters.
    pub stats: Stats,
}

/// Now, in nanoseconds since the epoch.
pub fn now() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(i64::MAX as u128) as Nanos)
}

fn name_str(name: &[u8]) -> Result<&str> {
    if name.len() > MAX_COMPONENT_BYTES {
        return Err(Error::NameTooLong);
    }
    std::str::from_utf8(name).map_err(|_| Error::NotUtf8)
}

impl Overlay {
    /// Opens the merged view of `packet` and the upper directory at
    /// `upper_dir` (created if absent): checks the upper directory belongs
    /// to this packet, replays its journal, and removes data files the
    /// journal does not reference. Reads no file content.
    pub fn mount(packet: Packet, upper_dir: &Path, opts: Options) -> Result<Overlay> {
        let t = std::time::Instant::now();
        let opened = upper::Upper::open(upper_dir, &packet.digest, opts.part)?;
        let mut records = opened.records.as_slice();
        // A journal that starts with a rebase keeps the inode numbers the
        // entries had before it, and the entries its packet left out.
        let (given, kept, first): (hashbrown::HashMap<String, Ino>, &[Record], usize) =
            match records.first() {
                Some(Record::Rebase { inos, kept, .. }) => {
                    let g = inos.iter().cloned().collect();
                    records = &records[1..];
                    (g, kept, 2)
                }
                _ => (hashbrown::HashMap::new(), &[], 1),
            };
        let (lower, inos) = new_lower(packet, opts, &given, &[])?;
        tracing::debug!(elapsed = ?t.elapsed(), "lower index built");
        let lower = std::sync::Arc::new(lower);
        let mut state = State::new(lower.clone(), inos);
        let journal = crate::packet::path::shown_path(&upper_dir.join(upper::JOURNAL));
        // Numbered from 1, the rebase record first; the records it keeps
        // are part of it.
        let numbered = kept.iter().map(|r| (1, r));
        for (k, rec) in numbered.chain(records.iter().enumerate().map(|(k, r)| (k + first, r))) {
            state.apply_replayed(&lower, rec).map_err(|e| match e {
                Error::Replay { reason, .. } => Error::Replay {
                    journal: journal.clone(),
                    index: k,
                    reason,
                },
                Error::NotFound | Error::NotDir => Error::Replay {
                    journal: journal.clone(),
                    index: k,
                    reason: "it names an inode or directory that does not exist".into(),
                },
                other => other,
            })?;
        }
        let up = opened.upper;
        // Nodes no name links to: files unlinked while open (and removed
        // directories the kernel still held) when the last daemon stopped.
        // Nothing holds them now.
        let unlinked: Vec<Ino> = state
            .nodes
            .iter()
            .filter(|(_, n)| n.nlink == 0)
            .map(|(&ino, _)| ino)
            .collect();
        for ino in unlinked {
            state.drop_if_unused(ino);
        }
        // Data files no node references: those of the nodes just dropped,
        // and any left from an interrupted change.
        let referenced: std::collections::HashSet<u64> = state
            .nodes
            .values()
            .filter_map(|n| match n.content {
                Content::Upper(id) => Some(id),
                _ => None,
            })
            .collect();
        for id in up.list_data()? {
            if !referenced.contains(&id) {
                tracing::info!(id, "removing a data file no name references");
                up.remove_data(id);
            }
            state.next_data = state.next_data.max(id + 1);
        }
        tracing::info!(elapsed = ?t.elapsed(), records = records.len(), nodes = state.nodes.len(), "upper directory replayed");
        Ok(Overlay {
            upper: up,
            state: RwLock::new(state),
            mutations: RwLock::new(()),
            ending: std::sync::atomic::AtomicBool::new(false),
            seal_turn: Mutex::new(()),
            splits: split::Splits::default(),
            page: crate::sys::page_size(),
            stats: Stats::default(),
            opts,
            invalidate: Mutex::new(None),
            forgotten: Mutex::new(Vec::new()),
            secrets: secret::Secrets::default(),
        })
    }

    /// Shows the host file `host` at `path` in the view (relative to the
    /// mount's root, `harness/auth.json`), read-only, until the mount ends
    /// (see [`secret`]). The directory it goes in must exist in the view,
    /// and not be the packet root; `host` must be a regular file this
    /// process can read. Refusals are `secret_unusable`.
    pub fn add_secret(&mut self, path: &str, host: &Path) -> Result<()> {
        let refuse = |reason: &str| secret::refuse(path, reason);
        secret::check(&[(path.to_string(), host.to_path_buf())])?;
        if self.secrets.list().iter().any(|s| s.path == path) {
            return Err(refuse("given twice with --secret"));
        }
        let names = secret::components(path)?;
        let Some((name, dirs)) = names.split_last() else {
            return Err(refuse("an empty path"));
        };
        let st = self.state.read();
        let lower = st.lower.clone();
        let mut dir = ROOT;
        for d in dirs {
            dir = match st.child(&lower, dir, d) {
                Ok(Some(c)) if st.kind(&lower, c) == Some(Kind::Dir) => c,
                _ => {
                    return Err(refuse(&format!(
                        "its directory `{}` is not a directory in the view; a secret goes \
                         in a directory the packet (or the upper directory) has",
                        dirs.join("/")
                    )));
                }
            };
        }
        if dir == ROOT && lower.root == Root::Packet {
            return Err(refuse(
                "the packet root holds only `workspace` and `harness`; put the secret in one of them",
            ));
        }
        drop(st);
        self.secrets.add(path, dir, name, host);
        Ok(())
    }

    /// The files shown from the host (`mount --secret`).
    pub fn secrets(&self) -> &[secret::Secret] {
        self.secrets.list()
    }

    /// Whether `ino` is a secret: its attributes and content follow its
    /// host file, so the kernel must not cache them.
    pub fn is_secret(&self, ino: Ino) -> bool {
        self.secrets.get(ino).is_some()
    }

    /// Installs the function that tells the kernel an inode's attributes,
    /// or a name, changed behind its back (the FUSE session's notifier).
    pub fn set_invalidator(&self, f: Invalidator) {
        *self.invalidate.lock() = Some(f);
    }

    /// The lower layer (the packet served), as of now.
    pub fn lower(&self) -> std::sync::Arc<Lower> {
        self.state.read_recursive().lower.clone()
    }

    /// The state, shared, for an operation the kernel asked for that only
    /// looks (`lookup`, `getattr`, listings, reads). Fair, like
    /// [`Overlay::changing`]: a change waiting to write the state goes in
    /// before lookups asked after it; `read_recursive` let three threads
    /// looking names up without a pause hold a `create` off for 50 ms, six
    /// for seconds. Only where the thread holds the state in no other
    /// guard: everything nested takes it recursively. Except while a seal
    /// holds changes: it holds the state for long stretches (its walk of
    /// the tree), no change can be waiting, and a `forget` that began
    /// before the seal and waits to drop a node would hold every fair
    /// lookup behind it for the whole walk (a `forget` that sees the seal
    /// leaves the node for the seal's end instead); lookups then go in
    /// beside the seal.
    fn view(&self) -> parking_lot::RwLockReadGuard<'_, State> {
        // Only a seal holds the change gate exclusively.
        if self.mutations.is_locked_exclusive() {
            self.state.read_recursive()
        } else {
            self.state.read()
        }
    }

    /// The upper directory.
    pub fn upper_dir(&self) -> &Path {
        self.upper.root()
    }

    /// Bytes hashed so far verifying lower chunks.
    pub fn verified_bytes(&self) -> u64 {
        self.lower().verifier.hashed.load(Ordering::Relaxed)
    }

    /// The lower content read so far through this view of the packet (since
    /// the mount, or since its last rebase), in the order first read: the
    /// trace a seal leaves beside its packet (`crate::packet::trace`).
    pub fn trace(&self) -> crate::packet::trace::Trace {
        let lower = self.lower();
        let entries = &lower.packet.manifest.entries;
        crate::packet::trace::Trace::new(
            lower
                .verifier
                .touched()
                .into_iter()
                .filter_map(|(i, k)| Some((entries.get(i as usize)?.path.to_string(), k)))
                .collect(),
        )
    }

    /// Records applied (replayed and new).
    pub fn records(&self) -> u64 {
        self.state.read_recursive().applied
    }

    // -- attributes ----------------------------------------------------------

    fn attr_of(&self, st: &State, ino: Ino) -> Result<Attr> {
        if let Some(s) = self.secrets.get(ino) {
            return s.attr(self.opts.uid, self.opts.gid);
        }
        match st.get(&st.lower, ino).ok_or(Error::NotFound)? {
            Ref::Node(n) => self.node_attr(&st.lower, ino, n),
            Ref::Lower(i) => Ok(lower_attr(&st.lower, ino, i, st.lower_generation(ino))),
        }
    }

    fn node_attr(&self, lower: &Lower, ino: Ino, n: &Node) -> Result<Attr> {
        let nlink = match n.kind {
            Kind::Dir if n.nlink == 0 => 0,
            Kind::Dir => 2 + n.subdirs,
            _ => n.nlink,
        };
        let mut a = Attr {
            ino,
            generation: n.generation,
            kind: n.kind,
            size: 0,
            blocks: 0,
            atime: n.atime,
            mtime: n.mtime,
            ctime: n.ctime,
            perm: n.perm,
            nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: n.rdev,
        };
        match (n.kind, n.content) {
            (Kind::File, Content::Upper(id)) => match self.upper.stat_data(id) {
                Ok(st) => {
                    a.size = st.st_size as u64;
                    a.blocks = st.st_blocks as u64;
                    a.atime = stat_nanos(st.st_atime, st.st_atime_nsec);
                    a.mtime = stat_nanos(st.st_mtime, st.st_mtime_nsec);
                    a.ctime = a.ctime.max(stat_nanos(st.st_ctime, st.st_ctime_nsec));
                }
                // An unlinked file nothing has open any more: its data is gone.
                Err(_) if n.nlink == 0 => {}
                Err(e) => return Err(e),
            },
            (Kind::File, Content::Lower(i)) => {
                a.size = lower.manifest().entries[i as usize].size();
                a.blocks = a.size.div_ceil(512);
            }
            (Kind::Symlink, _) => a.size = target_of(lower, n).len() as u64,
            (Kind::Dir, _) => {
                a.size = 4096;
                a.blocks = 8;
            }
            _ => {}
        }
        Ok(a)
    }

    /// `getattr`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let st = self.view();
        self.attr_of(&st, ino)
    }

    /// Whether `ino` is a pristine lower entry (its attributes and content
    /// never change while it stays pristine).
    pub fn is_pristine(&self, ino: Ino) -> bool {
        let st = self.view();
        let lower = st.lower.clone();
        matches!(st.get(&lower, ino), Some(Ref::Lower(_)))
    }

    // -- namespace reads -----------------------------------------------------

    /// `lookup`: the child's attributes; counts a kernel reference.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.stats.lookups.fetch_add(1, Ordering::Relaxed);
        let name = name_str(name)?;
        if let Some(s) = self.secrets.at(parent, name) {
            return s.attr(self.opts.uid, self.opts.gid);
        }
        let st = self.view();
        let lower = st.lower.clone();
        let ino = st.child(&lower, parent, name)?.ok_or(Error::NotFound)?;
        let a = self.attr_of(&st, ino)?;
        st.add_ref(ino, 1);
        Ok(a)
    }

    /// `forget`: the kernel dropped `count` references.
    pub fn forget(&self, ino: Ino, count: u64) {
        if self.is_secret(ino) {
            return; // never counted
        }
        let drop_now = self.view().add_ref(ino, -(count as i64));
        if !drop_now {
            return;
        }
        // A seal holds the state for long stretches (its walk of the
        // tree): this thread would serve nothing while it waited to drop
        // one node. The node waits instead, and goes when the seal is done
        // (`drop_forgotten`), or here if the seal ended meanwhile.
        if self.mutations.is_locked_exclusive() {
            match self.state.try_write() {
                Some(st) => self.drop_unused(st, &[ino]),
                None => {
                    self.forgotten.lock().push(ino);
                    if !self.mutations.is_locked_exclusive() {
                        self.drop_forgotten();
                    }
                }
            }
        } else {
            self.drop_unused(self.state.write(), &[ino]);
        }
    }

    /// Drops the nodes the kernel forgot while a seal held the state.
    pub(crate) fn drop_forgotten(&self) {
        let inos = std::mem::take(&mut *self.forgotten.lock());
        if !inos.is_empty() {
            self.drop_unused(self.state.write(), &inos);
        }
    }

    /// Drops those of `inos` nothing uses any more (unlinked, and
    /// forgotten by the kernel), and their data files.
    fn drop_unused(&self, mut st: parking_lot::RwLockWriteGuard<'_, State>, inos: &[Ino]) {
        let data: Vec<u64> = inos
            .iter()
            .filter_map(|&ino| st.drop_if_unused(ino))
            .collect();
        drop(st);
        for id in data {
            self.upper.remove_data(id);
        }
    }

    /// `readlink`.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        if self.is_secret(ino) {
            return Err(Error::Invalid);
        }
        let st = self.view();
        let lower = st.lower.clone();
        match st.get(&lower, ino).ok_or(Error::NotFound)? {
            Ref::Node(n) if n.kind == Kind::Symlink => Ok(target_of(&lower, n).as_bytes().to_vec()),
            Ref::Lower(i) => match &lower.manifest().entries[i as usize].kind {
                EntryKind::Symlink(t) => Ok(t.as_bytes().to_vec()),
                _ => Err(Error::Invalid),
            },
            Ref::Node(_) => Err(Error::Invalid),
        }
    }

    /// Up to `max` entries of directory `ino` after position `offset`
    /// (0: from the start): `.` and `..` at 1 and 2, then the names in
    /// cookie order, each at its cookie, so a listing goes on where it was
    /// however the directory changed (see [`listing`]; there is no
    /// `opendir` snapshot: the kernel caches listings itself).
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        let st = self.view();
        let lower = st.lower.clone();
        let parent = match st.get(&lower, ino).ok_or(Error::NotFound)? {
            _ if ino == ROOT => ROOT,
            Ref::Node(n) if n.kind != Kind::Dir => return Err(Error::NotDir),
            Ref::Node(n) => n.parent,
            Ref::Lower(i) if lower.kind(i) != Kind::Dir => return Err(Error::NotDir),
            Ref::Lower(i) => lower.parent_ino(i),
        };
        let mut entries = Vec::with_capacity(max.min(1024));
        for (name, e_ino, at) in [(".", ino, listing::DOT), ("..", parent, listing::DOTDOT)] {
            if offset < at && entries.len() < max {
                entries.push(DirEntry {
                    name: name.into(),
                    ino: e_ino,
                    kind: Kind::Dir,
                    offset: at,
                });
            }
        }
        let after = offset.max(listing::DOTDOT);
        let room = max - entries.len();
        let listed = st.list_after(&lower, ino, after, room)?;
        // The underlying list may stop short of the directory's end only
        // when it is full: a secret beyond its last cookie comes later.
        let full_to = (listed.len() == room).then(|| listed.last().map_or(after, |l| l.0));
        for (at, name, child) in listed {
            if self.secrets.at(ino, &name).is_some() {
                continue; // shadowed by the secret
            }
            let kind = st.kind(&lower, child).unwrap_or(Kind::File);
            entries.push(DirEntry {
                name,
                ino: child,
                kind,
                offset: at,
            });
        }
        for s in self.secrets.list().iter().filter(|s| s.parent == ino) {
            let at = s.cookie();
            if at > after && full_to.is_none_or(|end| at < end) {
                entries.push(DirEntry {
                    name: s.name().into(),
                    ino: s.ino(),
                    kind: Kind::File,
                    offset: at,
                });
            }
        }
        entries.sort_by_key(|e| e.offset);
        entries.truncate(max);
        Ok(entries)
    }

    /// For `readdirplus`: an entry's attributes, counting a kernel
    /// reference (`.` and `..` are not counted by the kernel).
    pub fn entry_attr(&self, ino: Ino, count: bool) -> Result<Attr> {
        let st = self.view();
        let a = self.attr_of(&st, ino)?;
        if count {
            st.add_ref(ino, 1);
        }
        Ok(a)
    }

    // -- changes -------------------------------------------------------------

    /// Appends `rec` and applies it (with the state locked by the caller).
    fn commit(&self, st: &mut State, rec: Record) -> Result<state::Applied> {
        self.upper.append(&rec)?;
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        let lower = st.lower.clone();
        st.apply(&lower, &rec)
    }

    /// Drops inodes that lost their last reference, removing their data.
    fn reap(&self, st: &mut State, ino: Option<Ino>) {
        if let Some(id) = ino.and_then(|i| st.drop_if_unused(i)) {
            self.upper.remove_data(id);
        }
    }

    /// Refuses changes directly in the packet root (it holds the parts).
    fn check_mutable_dir(&self, st: &State, dir: Ino) -> Result<()> {
        if dir == ROOT && st.lower.root == Root::Packet {
            return Err(Error::NotPermitted);
        }
        match st.get(&st.lower, dir).ok_or(Error::NotFound)? {
            Ref::Node(n) if n.kind != Kind::Dir => Err(Error::NotDir),
            Ref::Node(n) if n.nlink == 0 => Err(Error::NotFound),
            Ref::Lower(i) if st.lower.kind(i) != Kind::Dir => Err(Error::NotDir),
            _ => Ok(()),
        }
    }

    /// Creates an inode of `kind` at `parent`/`name`.
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        mode: u32,
        rdev: u64,
        target: Option<&str>,
        caller: Caller,
    ) -> Result<Attr> {
        let name = name_str(name)?;
        let _m = self.changing()?;
        let mut st = self.state.write();
        let lower = st.lower.clone();
        self.check_mutable_dir(&st, parent)?;
        if self.secrets.at(parent, name).is_some() || st.child(&lower, parent, name)?.is_some() {
            return Err(Error::Exists);
        }
        let (pgid, psetgid) = {
            let pa = self.attr_of(&st, parent)?;
            (pa.gid, pa.perm & 0o2000 != 0)
        };
        let gid = if psetgid { pgid } else { caller.gid };
        let mut perm = (mode & 0o7777) as u16;
        if kind == Kind::Dir && psetgid {
            perm |= 0o2000;
        }
        let (ino, generation) = st.new_ino(&lower, parent, name);
        let data = if kind == Kind::File {
            let id = st.next_data;
            st.next_data += 1;
            self.upper.create_data(id)?;
            Some(id)
        } else {
            None
        };
        let rec = Record::Mknode {
            t: now(),
            ino,
            generation,
            parent,
            name: name.into(),
            kind,
            perm,
            uid: caller.uid,
            gid,
            rdev,
            data,
            target: target.map(Into::into),
        };
        if let Err(e) = self.commit(&mut st, rec) {
            st.inos.release(ino);
            if let Some(id) = data {
                self.upper.remove_data(id);
            }
            return Err(e);
        }
        let a = self.attr_of(&st, ino)?;
        st.add_ref(ino, 1);
        Ok(a)
    }

    /// `mknod` (regular files, FIFOs, sockets, devices).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u64,
        caller: Caller,
    ) -> Result<Attr> {
        let kind = match mode & 0o170000 {
            0 | 0o100000 => Kind::File,
            0o010000 => Kind::Fifo,
            0o140000 => Kind::Socket,
            0o020000 => Kind::CharDev,
            0o060000 => Kind::BlockDev,
            _ => return Err(Error::Invalid),
        };
        let rdev = if matches!(kind, Kind::CharDev | Kind::BlockDev) {
            rdev
        } else {
            0
        };
        self.make(parent, name, kind, mode, rdev, None, caller)
    }

    /// `mkdir`.
    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Attr> {
        self.make(parent, name, Kind::Dir, mode, 0, None, caller)
    }

    /// `symlink`.
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], caller: Caller) -> Result<Attr> {
        let target = std::str::from_utf8(target).map_err(|_| Error::NotUtf8)?;
        if target.is_empty() || target.contains('\0') {
            return Err(Error::Invalid);
        }
        self.make(parent, name, Kind::Symlink, 0o777, 0, Some(target), caller)
    }

    /// `create`: a new regular file (opened by the kernel, which tells the
    /// daemon nothing more about open files: see `fuse::fs`).
    pub fn create(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Attr> {
        self.make(parent, name, Kind::File, mode, 0, None, caller)
    }

    /// `unlink`.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let _m = self.changing()?;
        let name = name_str(name)?;
        let mut st = self.state.write();
        let lower = st.lower.clone();
        self.check_mutable_dir(&st, parent)?;
        if self.secrets.at(parent, name).is_some() {
            return Err(Error::Busy);
        }
        let ino = st.child(&lower, parent, name)?.ok_or(Error::NotFound)?;
        if st.kind(&lower, ino) == Some(Kind::Dir) {
            return Err(Error::IsDir);
        }
        let applied = self.commit(
            &mut st,
            Record::Unlink {
                t: now(),
                parent,
                name: name.into(),
            },
        )?;
        self.reap(&mut st, applied.unlinked);
        Ok(())
    }

    /// `rmdir`.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let _m = self.changing()?;
        let name = name_str(name)?;
        let mut st = self.state.write();
        let lower = st.lower.clone();
        self.check_mutable_dir(&st, parent)?;
        if self.secrets.at(parent, name).is_some() {
            return Err(Error::Busy);
        }
        let ino = st.child(&lower, parent, name)?.ok_or(Error::NotFound)?;
        if st.kind(&lower, ino) != Some(Kind::Dir) {
            return Err(Error::NotDir);
        }
        if self.secrets.holds(ino) || !st.is_empty_dir(&lower, ino)? {
            return Err(Error::NotEmpty);
        }
        let applied = self.commit(
            &mut st,
            Record::Unlink {
                t: now(),
                parent,
                name: name.into(),
            },
        )?;
        self.reap(&mut st, applied.unlinked);
        Ok(())
    }

    /// Whether directory `dir` is `ancestor` or below it.
    fn is_within(&self, st: &State, dir: Ino, ancestor: Ino) -> bool {
        let mut cur = dir;
        for _ in 0..=65_536 {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT {
                return false;
            }
            cur = match st.get(&st.lower, cur) {
                Some(Ref::Node(n)) => n.parent,
                Some(Ref::Lower(i)) => st.lower.parent_ino(i),
                None => return false,
            };
        }
        false
    }

    /// `rename`, with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        let _m = self.changing()?;
        let name = name_str(name)?;
        let newname = name_str(newname)?;
        if noreplace && exchange {
            return Err(Error::Invalid);
        }
        let mut st = self.state.write();
        let lower = st.lower.clone();
        self.check_mutable_dir(&st, parent)?;
        self.check_mutable_dir(&st, newparent)?;
        if self.secrets.at(parent, name).is_some() || self.secrets.at(newparent, newname).is_some()
        {
            return Err(Error::Busy);
        }
        let src = st.child(&lower, parent, name)?.ok_or(Error::NotFound)?;
        let dst = st.child(&lower, newparent, newname)?;
        let src_dir = st.kind(&lower, src) == Some(Kind::Dir);
        if src_dir && self.is_within(&st, newparent, src) {
            return Err(Error::Invalid);
        }
        match (dst, exchange) {
            (None, true) => return Err(Error::NotFound),
            (Some(d), true) => {
                if st.kind(&lower, d) == Some(Kind::Dir) && self.is_within(&st, parent, d) {
                    return Err(Error::Invalid);
                }
            }
            (Some(_), false) if noreplace => return Err(Error::Exists),
            (Some(d), false) => {
                if d == src {
                    return Ok(()); // the same file: nothing to do
                }
                let dst_dir = st.kind(&lower, d) == Some(Kind::Dir);
                // Onto an ancestor of the source: the kernel says ENOTEMPTY.
                if dst_dir && self.is_within(&st, parent, d) {
                    return Err(Error::NotEmpty);
                }
                match (src_dir, dst_dir) {
                    (true, false) => return Err(Error::NotDir),
                    (false, true) => return Err(Error::IsDir),
                    (true, true) if self.secrets.holds(d) || !st.is_empty_dir(&lower, d)? => {
                        return Err(Error::NotEmpty);
                    }
                    _ => {}
                }
            }
            (None, false) => {}
        }
        let applied = self.commit(
            &mut st,
            Record::Rename {
                t: now(),
                parent,
                name: name.into(),
                newparent,
                newname: newname.into(),
                exchange,
            },
        )?;
        self.reap(&mut st, applied.unlinked);
        Ok(())
    }

    /// `link`: a new name for a file (lower files too: no copy).
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        let _m = self.changing()?;
        let newname = name_str(newname)?;
        let mut st = self.state.write();
        let lower = st.lower.clone();
        self.check_mutable_dir(&st, newparent)?;
        // The order of the kernel's own checks: the new name first.
        if self.secrets.at(newparent, newname).is_some()
            || st.child(&lower, newparent, newname)?.is_some()
        {
            return Err(Error::Exists);
        }
        if self.is_secret(ino) {
            return Err(Error::CrossDevice);
        }
        let a = self.attr_of(&st, ino)?;
        if a.kind == Kind::Dir {
            return Err(Error::NotPermitted);
        }
        if a.nlink == 0 {
            return Err(Error::NotFound);
        }
        if a.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        self.commit(
            &mut st,
            Record::Link {
                t: now(),
                ino,
                parent: newparent,
                name: newname.into(),
            },
        )?;
        let a = self.attr_of(&st, ino)?;
        st.add_ref(ino, 1);
        Ok(a)
    }

    /// `setattr`: mode, owner, size (copying up a lower file), times.
    pub fn setattr(&self, ino: Ino, req: SetAttr) -> Result<Attr> {
        if self.is_secret(ino) {
            return Err(Error::ReadOnly);
        }
        let _m = self.changing()?;
        if let Some(size) = req.size {
            if size > MAX_FILE_SIZE {
                return Err(Error::TooBig);
            }
            match self.getattr(ino)?.kind {
                Kind::File => {}
                Kind::Dir => return Err(Error::IsDir),
                _ => return Err(Error::Invalid),
            }
            let id = self.copy_up(ino, Some(size))?;
            if let Some(n) = self.state.read_recursive().nodes.get(&ino) {
                n.modified.set(true);
            }
            self.upper
                .data(id)?
                .set_len(size)
                .map_err(Error::upper("truncate"))?;
        }
        let t = now();
        let resolve = |s: SetTime| match s {
            SetTime::Now => t,
            SetTime::At(v) => v,
        };
        let mut st = self.state.write();
        let lower = st.lower.clone();
        let upper_data = match st.get(&lower, ino).ok_or(Error::NotFound)? {
            Ref::Node(n) => match n.content {
                Content::Upper(id) => Some(id),
                _ => None,
            },
            Ref::Lower(_) => None,
        };
        let (mut atime, mut mtime) = (req.atime.map(resolve), req.mtime.map(resolve));
        if let Some(id) = upper_data {
            if atime.is_some() || mtime.is_some() {
                set_file_times(&*self.upper.data(id)?, atime, mtime)?;
            }
            atime = None;
            mtime = None;
        }
        let perm = req.mode.map(|m| (m & 0o7777) as u16);
        if perm.is_some()
            || req.uid.is_some()
            || req.gid.is_some()
            || atime.is_some()
            || mtime.is_some()
        {
            let rec = Record::Setattr {
                t,
                ino,
                perm,
                uid: req.uid,
                gid: req.gid,
                atime,
                mtime,
            };
            // A node no name links to (unlinked while open, or carried
            // across a rebase, which the journal does not hold) is gone
            // at a remount: its change is kept in memory only, since a
            // record of it could name a number the journal never made,
            // which would fail the remount.
            let unnamed = matches!(st.get(&st.lower, ino), Some(Ref::Node(n)) if n.nlink == 0);
            if unnamed {
                let lower = st.lower.clone();
                st.apply(&lower, &rec)?;
            } else {
                self.commit(&mut st, rec)?;
            }
        }
        self.attr_of(&st, ino)
    }

    /// Opens the change gate for one operation that changes the view
    /// (shared with other changes, exclusive with a seal). Fair: once a
    /// seal waits for the gate, changes asked after it wait for the seal.
    /// `read_recursive` here let a change in whenever another held the
    /// gate, so writers overlapping without a gap (a few threads writing
    /// flat out are enough) held a seal off for as long as they ran. Only
    /// for an operation's first hold: a thread taking it again, while a
    /// seal waits, would wait for that seal and the seal for it; nested
    /// steps ([`Overlay::copy_up`]) take it recursively.
    /// Refused with [`Error::Ending`] once [`Overlay::end_changes`] was
    /// called: checked with the gate held, so a change either went in
    /// before a seal that follows the call, or is refused.
    fn changing(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>> {
        let gate = self.mutations.read();
        if self.ending.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Ending);
        }
        Ok(gate)
    }

    /// Refuses every change from now on ([`Error::Ending`]): for a mount
    /// that ends with a seal (`mount --seal-on-term`), so that every change
    /// acknowledged is in that seal's packet. Changes in progress finish;
    /// a seal after this call waits for them.
    pub fn end_changes(&self) {
        self.ending.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Copies a lower file up (if it still is one) and returns its data
    /// file. `keep` limits the bytes copied (for truncation; 0 copies none).
    /// The copy runs without the state lock; if another thread copied the
    /// same file first, its copy wins and this one is discarded.
    fn copy_up(&self, ino: Ino, keep: Option<u64>) -> Result<u64> {
        // Recursive: every caller holds the gate already (see `changing`).
        let _m = self.mutations.read_recursive();
        self.copy_up_held(ino, keep)
    }

    /// [`Overlay::copy_up`] for a caller already holding the change gate.
    fn copy_up_held(&self, ino: Ino, keep: Option<u64>) -> Result<u64> {
        let (idx, id, mtime, atime, lower) = {
            let mut st = self.state.write();
            let lower = st.lower.clone();
            let (content, mtime, atime) = match st.get(&lower, ino).ok_or(Error::NotFound)? {
                Ref::Node(n) => (n.content, n.mtime, n.atime),
                Ref::Lower(i) => {
                    let a = lower_attr(&lower, ino, i, st.lower_generation(ino));
                    (Content::Lower(i), a.mtime, a.atime)
                }
            };
            match content {
                Content::Upper(id) => return Ok(id),
                Content::Lower(i) => {
                    let id = st.next_data;
                    st.next_data += 1;
                    (i, id, mtime, atime, lower)
                }
                Content::None => return Err(Error::IsDir),
            }
        };
        let size = lower.manifest().entries[idx as usize].size();
        let copy = keep.map_or(size, |k| k.min(size));
        let file = self.upper.create_data(id)?;
        let result = (|| -> Result<()> {
            let mut buf = Vec::with_capacity(crate::packet::format::CHUNK_SIZE as usize);
            let mut pos = 0;
            while pos < copy {
                buf.clear();
                let n = (copy - pos).min(crate::packet::format::CHUNK_SIZE);
                lower.verifier.read(&lower.packet, idx, pos, n, &mut buf)?;
                crate::sys::write_sparse(&file, &buf, pos).map_err(Error::upper("copy-up"))?;
                pos += n;
            }
            file.set_len(copy).map_err(Error::upper("copy-up"))?;
            set_file_times(&file, Some(atime), Some(mtime))
        })();
        if let Err(e) = result {
            self.upper.remove_data(id);
            return Err(e);
        }
        let mut st = self.state.write();
        let still_lower = match st.get(&lower, ino) {
            Some(Ref::Node(n)) => n.content == Content::Lower(idx),
            Some(Ref::Lower(_)) => true,
            None => false,
        };
        if !still_lower {
            drop(st);
            self.upper.remove_data(id);
            return match self.state.read_recursive().get(&lower, ino) {
                Some(Ref::Node(n)) => match n.content {
                    Content::Upper(other) => Ok(other),
                    _ => Err(Error::NotFound),
                },
                _ => Err(Error::NotFound),
            };
        }
        if let Err(e) = self.commit(
            &mut st,
            Record::CopyUp {
                t: now(),
                ino,
                data: id,
            },
        ) {
            drop(st);
            self.upper.remove_data(id);
            return Err(e);
        }
        if let Some(n) = st.nodes.get(&ino) {
            // A full copy holds the lower bytes; a truncating one does not.
            n.modified.set(copy < size);
        }
        self.stats.copy_ups.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// The data file that a content change of `ino` goes to (copying a
    /// lower file up first), marked modified.
    fn data_for_change(&self, ino: Ino) -> Result<u64> {
        let id = match self.content(ino)?.0 {
            Content::Upper(id) => id,
            Content::Lower(_) => self.copy_up(ino, None)?,
            Content::None => return Err(Error::IsDir),
        };
        if let Some(n) = self.state.read_recursive().nodes.get(&ino) {
            n.modified.set(true);
        }
        Ok(id)
    }

    // -- file I/O ------------------------------------------------------------

    /// Where `ino`'s bytes are, with the lower layer they refer to.
    fn content(&self, ino: Ino) -> Result<(Content, std::sync::Arc<Lower>)> {
        let st = self.view();
        let c = match st.get(&st.lower, ino).ok_or(Error::NotFound)? {
            Ref::Node(n) => n.content,
            Ref::Lower(i) => Content::Lower(i),
        };
        Ok((c, st.lower.clone()))
    }

    /// `read`: appends up to `size` bytes at `offset` to `out`.
    pub fn read(&self, ino: Ino, offset: u64, size: u32, out: &mut Vec<u8>) -> Result<()> {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        if offset == 0 {
            let mut log = self.stats.read_inodes.lock();
            if log.len() < READ_LOG {
                log.push(ino);
            }
        }
        if let Some(s) = self.secrets.get(ino) {
            return s.read(offset, size, out);
        }
        let (content, lower) = self.content(ino)?;
        match content {
            Content::Lower(i) => {
                let v = &lower.verifier;
                v.read(&lower.packet, i, offset, u64::from(size), out)?;
                for k in v.ahead(&lower.packet, i, offset, u64::from(size)) {
                    let lower = lower.clone();
                    rayon::spawn(move || lower.verifier.verify_ahead(&lower.packet, i, k));
                }
            }
            Content::Upper(id) => {
                let f = self.upper.data(id)?;
                let len = f.metadata().map_err(Error::upper("read"))?;
                let size = u64::from(size).min(len.len().saturating_sub(offset)) as u32;
                crate::sys::read_append_at(&f, offset, size, out).map_err(Error::upper("read"))?;
            }
            Content::None => return Err(Error::IsDir),
        }
        self.stats
            .read_bytes
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// `write`: to the upper data file.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32> {
        if self.is_secret(ino) {
            return Err(Error::ReadOnly);
        }
        let _m = self.changing()?;
        // As for a file size limit: a write that would cross it writes up
        // to it, one at it fails.
        let room = MAX_FILE_SIZE.saturating_sub(offset);
        if room == 0 && !data.is_empty() {
            return Err(Error::TooBig);
        }
        let data = &data[..data.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        // (A shared mapping of a file opened read-only copies up here.)
        let id = self.data_for_change(ino)?;
        let file = self.upper.data(id)?;
        // What was written is answered, short if the rest failed (a full
        // disk): the caller then learns of the failure from its next
        // write, and never of bytes it was told were not written but were.
        let mut done = 0;
        while done < data.len() {
            match file.write_at(&data[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if done == 0 => return Err(Error::upper("write")(e)),
                Err(_) => break,
            }
        }
        if done == 0 && !data.is_empty() {
            return Err(Error::upper("write")(std::io::Error::from(
                std::io::ErrorKind::WriteZero,
            )));
        }
        self.splits.wrote(ino, offset, done as u64, self.page);
        Ok(done as u32)
    }

    /// `fsync` / `fdatasync`: the file's data, its data file's name (once)
    /// and the journal.
    pub fn fsync(&self, ino: Ino, datasync: bool) -> Result<()> {
        if self.is_secret(ino) {
            return Ok(()); // nothing of it is here to sync
        }
        if let Content::Upper(id) = self.content(ino)?.0 {
            let f = self.upper.data(id)?;
            let r = if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            };
            r.map_err(Error::upper("fsync"))?;
            self.upper.sync_data_name(id)?;
        }
        self.upper.sync_journal()
    }

    /// `fsyncdir`: the journal.
    pub fn fsyncdir(&self) -> Result<()> {
        self.upper.sync_journal()
    }

    /// `fallocate` on an open file (modes 0, `KEEP_SIZE`, `PUNCH_HOLE`).
    pub fn fallocate(&self, ino: Ino, offset: u64, length: u64, mode: i32) -> Result<()> {
        if self.is_secret(ino) {
            return Err(Error::ReadOnly);
        }
        let _m = self.changing()?;
        if offset.saturating_add(length) > MAX_FILE_SIZE {
            return Err(Error::TooBig);
        }
        let id = self.data_for_change(ino)?;
        crate::sys::fallocate(&*self.upper.data(id)?, mode, offset, length).map_err(|e| {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                Error::NotSupported
            } else {
                Error::upper("fallocate")(e)
            }
        })
    }

    /// `statfs` of the upper directory's filesystem.
    pub fn statfs(&self) -> Result<nix::sys::statvfs::Statvfs> {
        self.upper.statfs()
    }
}

fn set_file_times(f: &File, atime: Option<Nanos>, mtime: Option<Nanos>) -> Result<()> {
    use nix::sys::stat::futimens;
    use nix::sys::time::TimeSpec;
    let ts = |v: Option<Nanos>| match v {
        Some(ns) => TimeSpec::new(ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000)),
        None => TimeSpec::UTIME_OMIT,
    };
    futimens(f, &ts(atime), &ts(mtime)).map_err(|e| Error::upper("set times")(e.into()))
}

/// Attributes of a pristine lower entry.
/// A stat time in nanoseconds since the epoch, clamped to an `i64` (a data
/// file dated past 2262 by hand reads as 2262, not as a wrapped time).
#[allow(clippy::unnecessary_cast)] // (`time_t` and the nanoseconds differ by platform)
pub(crate) fn stat_nanos(secs: libc::time_t, nanos: i64) -> Nanos {
    (secs as i64)
        .saturating_mul(1_000_000_000)
        .saturating_add(nanos as i64)
}

fn lower_attr(lower: &Lower, ino: Ino, i: index::Idx, generation: u64) -> Attr {
    let e = &lower.manifest().entries[i as usize];
    let (kind, size, perm, nlink) = match &e.kind {
        EntryKind::Dir => (Kind::Dir, 4096, 0o755, 2 + lower.index.subdirs(i)),
        EntryKind::File(f) => (
            Kind::File,
            f.size,
            if f.executable { 0o755 } else { 0o644 },
            1,
        ),
        EntryKind::Symlink(s) => (Kind::Symlink, s.len() as u64, 0o777, 1),
    };
    let (time, ctime) = lower.times(i);
    Attr {
        ino,
        generation,
        kind,
        size,
        blocks: size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime,
        perm,
        nlink,
        uid: lower.uid,
        gid: lower.gid,
        rdev: 0,
    }
}

/// A symlink node's target (its own, or its lower entry's).
pub(crate) fn target_of<'a>(lower: &'a Lower, n: &'a Node) -> &'a str {
    if let Some(t) = &n.target {
        return t;
    }
    match n.lower.map(|i| &lower.manifest().entries[i as usize].kind) {
        Some(EntryKind::Symlink(t)) => t,
        _ => "",
    }
}

/// The lower layer of `packet` for a mount made with `opts`, and the inode
/// numbers in use; `given` fixes the numbers of some paths.
fn new_lower(
    mut packet: Packet,
    opts: Options,
    given: &hashbrown::HashMap<String, Ino>,
    reserved: &[Ino],
) -> Result<(Lower, InoAllocator)> {
    let mut inos = InoAllocator::with_capacity(packet.manifest.entries.len());
    for &ino in reserved {
        inos.claim(ino);
    }
    let parents = std::mem::take(&mut packet.parents);
    let index = LowerIndex::build_with(&packet.manifest, parents, &mut inos, given);
    let root = match opts.part {
        None => Root::Packet,
        Some(part) => {
            let i = index
                .roots()
                .iter()
                .copied()
                .find(|&i| &*packet.manifest.entries[i as usize].path == part.as_str())
                .ok_or_else(|| Error::UpperRefused {
                    path: crate::packet::path::shown_path(packet.path()),
                    reason: format!("the packet has no {part} part to mount"),
                })?;
            Root::Part(i)
        }
    };
    let dir_time = packet
        .manifest
        .entries
        .iter()
        .filter_map(|e| e.file().map(|f| f.mtime_ns as Nanos))
        .max()
        .unwrap_or(0);
    let verifier = content::Verifier::new(&packet).map_err(|e| Error::packet_io(&packet, e))?;
    Ok((
        Lower {
            packet,
            index,
            root,
            uid: opts.uid,
            gid: opts.gid,
            dir_time,
            verifier,
            order: parking_lot::Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(state::ORDERED_DIRS)
                    .unwrap_or(std::num::NonZeroUsize::MIN),
            )),
        },
        inos,
    ))
}
