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
