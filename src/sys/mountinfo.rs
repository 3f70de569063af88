//! The mount table as `/proc/self/mountinfo` gives it (Linux): read, not
//! asked of any mount, so a mount whose daemon is busy cannot hang the
//! reader. Elsewhere (and with the fallbacks forced) [`mounts`] is `None`
//! and callers take their portable paths; [`mount_at`] asks `statfs` on
//! macOS (see `sys::platform`).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// File system types (as mountinfo names them) kept on this machine's
/// own storage or memory: an operation on them does not wait on a server
/// (FUSE, NFS, SMB, 9p and virtiofs may).
pub const LOCAL_FILE_SYSTEMS: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay", "squashfs",
    "erofs", "vfat", "exfat",
];

/// A mount, as `/proc/self/mountinfo` shows it.
#[derive(Debug)]
pub struct Mount {
    /// Its device, `major:minor`.
    pub dev: String,
    /// Where it is mounted.
    pub point: Vec<u8>,
    /// Its file system type (`ext4`, `fuse.sessionfs`).
    pub fstype: String,
    /// Its source (`/dev/sda1`, `sessionfs:<digest>`).
    pub source: Vec<u8>,
}

/// Every mount this process sees, in mount order (a later one at the same
/// point is on top); `None` where `/proc/self/mountinfo` cannot be read
/// (not Linux), or with the fallbacks forced. Read from there, so no mount
/// is touched (a FUSE request to a mount whose daemon is busy could wait).
pub fn mounts() -> Option<Vec<Mount>> {
    if super::fallbacks_forced() {
        return None;
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mounts = info.lines().filter_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        let f: Vec<&str> = fields.split(' ').collect();
        let mut rest = rest.split(' ');
        Some(Mount {
            dev: f.get(2)?.to_string(),
            point: unescape_mountinfo(f.get(4)?),
            fstype: rest.next()?.to_owned(),
            source: rest.next().map(unescape_mountinfo).unwrap_or_default(),
        })
    });
    Some(mounts.collect())
}

/// What is known of the topmost mount at a point.
#[derive(Debug)]
pub enum MountAt {
    /// Nothing can say here: no mount table, no `statfs` that names it.
    Unknown,
    /// The point is not a mount point.
    Nothing,
    /// The topmost mount there.
    Mount(Mount),
}

/// The topmost mount at `point`, a real path: from the mount table
/// (Linux, without touching the mount), else from `statfs` (macOS, which
/// asks the mount itself, so a FUSE mount whose daemon is busy may make
/// it wait).
pub fn mount_at(point: &Path) -> MountAt {
    if let Some(mounts) = mounts() {
        return match mounts
            .into_iter()
            .rev()
            .find(|m| m.point == point.as_os_str().as_bytes())
        {
            Some(m) => MountAt::Mount(m),
            None => MountAt::Nothing,
        };
    }
    match super::platform::statfs_mount_at(point) {
        Ok(Some(m)) => MountAt::Mount(m),
        Ok(None) => MountAt::Nothing,
        Err(()) => MountAt::Unknown,
    }
}

/// A mountinfo path field: spaces, tabs, newlines and backslashes are
/// written as octal escapes (`\040`).
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/a\\040b\\011c\\134d"), b"/a b\tc\\d");
        assert_eq!(unescape_mountinfo("/plain"), b"/plain");
        // Not an escape: kept as it is.
        assert_eq!(unescape_mountinfo("/x\\09"), b"/x\\09");
    }
}
