//! Inodes of the merged view that differ from the pristine lower layer.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::index::Idx;
use super::ino::Ino;
use super::journal::Nanos;

/// File types on the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Directory.
    Dir,
    /// Regular file.
    File,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
}

impl Kind {
    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::Dir => 0o040000,
            Kind::File => 0o100000,
            Kind::Symlink => 0o120000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
            Kind::CharDev => 0o020000,
            Kind::BlockDev => 0o060000,
        }
    }
}

/// Where a regular file's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// Not a regular file.
    None,
    /// The lower entry's bytes in the packet.
    Lower(Idx),
    /// The upper data file with this id.
    Upper(u64),
}

/// An inode that is not a pristine lower entry: created on the mount, or a
/// lower entry that was renamed, linked, unlinked, copied up, or changed in
/// metadata, or a lower directory whose listing changed.
#[derive(Clone, Debug)]
pub struct Node {
    /// File type.
    pub kind: Kind,
    /// Generation, for reused inode numbers.
    pub generation: u64,
    /// The lower entry it comes from, if any.
    pub lower: Option<Idx>,
    /// Regular files: where the bytes are.
    pub content: Content,
    /// Symlinks created on the mount: the target (lower ones read the manifest).
    pub target: Option<Box<str>>,
    /// Device number.
    pub rdev: u64,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Access time (files with a data file take theirs from it).
    pub atime: Nanos,
    /// Modification time (likewise).
    pub mtime: Nanos,
    /// Change time (files with a data file show the later of this and theirs).
    pub ctime: Nanos,
    /// Names linking to it.
    pub nlink: u32,
    /// Directories: the listing, once it differs from the lower one (or the
    /// directory is new); `None` means "the lower entry's children".
    pub children: Option<super::listing::Listing>,
    /// Directories: number of subdirectories (for the link count).
    pub subdirs: u32,
    /// Directories: the parent (for paths of new inodes). Others: unused.
    pub parent: Ino,
    /// Directories: the current name in `parent`.
    pub name: Box<str>,
    /// Kernel references (lookups not yet forgotten); counted under the
    /// state's read lock, hence atomic.
    pub lookups: Count,
    /// Files copied up by chunk: which chunks of the lower entry it still
    /// reads from the packet (the data file holds the others). `None`: the
    /// data file holds the whole content.
    pub chunks: Option<std::sync::Arc<ChunkMap>>,
    /// Files with a data file: whether the content may differ from the
    /// lower entry it was copied from. False only after a copy-up in this
    /// daemon's life with no write since (a seal then reuses the packet's
    /// bytes and hashes); replay sets it, not knowing.
    pub modified: Flag,
}

impl Node {
    /// Whether it can be forgotten: no name and no kernel reference (an
    /// open or mapped file is one: the kernel holds its inode).
    pub fn droppable(&self) -> bool {
        self.nlink == 0 && self.lookups.get() == 0
    }
}

/// The chunk map of a file copied up by chunk (docs/upper-format.md,
/// "Copy-up by chunk"): its data file has the file's size, and chunk `k`
/// (bytes `k * CHUNK_SIZE ..`) is read from lower entry `lower` while its
/// bit is set, from the data file once it is clear (a hole there until
/// then). Bits are only ever cleared, each after the data file holds the
/// chunk's bytes and the `hold` record saying so is in the journal; a
/// reader that sees a bit set reads the lower chunk, one that sees it
/// clear the data file (Acquire/Release order those).
#[derive(Debug)]
pub struct ChunkMap {
    /// The lower entry whose chunks are read.
    pub lower: Idx,
    /// Its size: chunk `k` is `k * CHUNK_SIZE .. min((k + 1) * CHUNK_SIZE, lower_size)`.
    pub lower_size: u64,
    bits: Box<[AtomicU64]>,
}

impl ChunkMap {
    /// Every chunk of lower entry `lower`, of `lower_size` bytes, still
    /// read from the packet.
    pub fn all_lower(lower: Idx, lower_size: u64) -> ChunkMap {
        let n = Self::count(lower_size);
        let bits = (0..n.div_ceil(64))
            .map(|w| {
                let left = n - w * 64;
                AtomicU64::new(if left >= 64 {
                    u64::MAX
                } else {
                    (1u64 << left) - 1
                })
            })
            .collect();
        ChunkMap {
            lower,
            lower_size,
            bits,
        }
    }

    /// Chunks of a file of `size` bytes (a file of 0 bytes has none).
    pub fn count(size: u64) -> u64 {
        size.div_ceil(crate::packet::format::CHUNK_SIZE)
    }

    /// Whether chunk `k` is still read from the lower entry.
    pub fn is_lower(&self, k: u64) -> bool {
        let Some(w) = self.bits.get((k / 64) as usize) else {
            return false;
        };
        w.load(Ordering::Acquire) & (1 << (k % 64)) != 0
    }

    /// Chunk `k` is held by the data file from now on.
    pub fn hold(&self, k: u64) {
        if let Some(w) = self.bits.get((k / 64) as usize) {
            w.fetch_and(!(1 << (k % 64)), Ordering::Release);
        }
    }

    /// The chunks still read from the lower entry, in order.
    pub fn lower_chunks(&self) -> impl Iterator<Item = u64> + '_ {
        (0..Self::count(self.lower_size)).filter(|&k| self.is_lower(k))
    }

    /// Whether no chunk is read from the lower entry any more (the data
    /// file holds everything: a plain upper file).
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| w.load(Ordering::Acquire) == 0)
    }

    /// Bytes chunk `k` has in the lower entry.
    pub fn lower_len(&self, k: u64) -> u64 {
        let c = crate::packet::format::CHUNK_SIZE;
        self.lower_size.saturating_sub(k * c).min(c)
    }

    /// Bytes still read from the lower entry (for `st_blocks`).
    pub fn lower_bytes(&self) -> u64 {
        self.lower_chunks().map(|k| self.lower_len(k)).sum()
    }

    /// The chunks still read from the lower entry that a file of `size`
    /// bytes cannot read from it: those whose bytes within `size` are not
    /// the lower chunk's (past the end, cut short, or longer than the
    /// lower chunk). A change of size holds them first.
    pub fn invalid_at(&self, size: u64) -> Vec<u64> {
        let c = crate::packet::format::CHUNK_SIZE;
        self.lower_chunks()
            .filter(|&k| {
                k * c >= size || ((k + 1) * c).min(size) != ((k + 1) * c).min(self.lower_size)
            })
            .collect()
    }
}

/// A flag that can be set under a shared borrow.
#[derive(Debug, Default)]
pub struct Flag(std::sync::atomic::AtomicBool);

impl Clone for Flag {
    fn clone(&self) -> Self {
        Flag(std::sync::atomic::AtomicBool::new(self.get()))
    }
}

impl Flag {
    /// A flag with this value.
    pub fn new(v: bool) -> Flag {
        Flag(std::sync::atomic::AtomicBool::new(v))
    }

    /// The value.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Sets the value.
    pub fn set(&self, v: bool) {
        self.0.store(v, Ordering::Release);
    }
}

/// A counter that can change under a shared borrow.
#[derive(Debug, Default)]
pub struct Count(AtomicU64);

impl Clone for Count {
    fn clone(&self) -> Self {
        Count(AtomicU64::new(self.get()))
    }
}

impl Count {
    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Takes the value, leaving 0.
    pub fn take(&self) -> u64 {
        self.0.swap(0, Ordering::AcqRel)
    }

    /// Adds `delta`, saturating at 0.
    pub fn add(&self, delta: i64) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(if delta >= 0 {
                    v.saturating_add(delta as u64)
                } else {
                    v.saturating_sub(delta.unsigned_abs())
                })
            });
    }
}
