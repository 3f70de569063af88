//! The mount table as `/proc/self/mountinfo` gives it (Linux): read, not
//! asked of any mount, so a mount whose daemon is busy cannot hang the
//! reader. Elsewhere (and with the fallbacks forced) [`mounts`] is `None`
//! and callers take their portable paths; [`mount_at`] asks `statfs` on
//! macOS (see `sys::platform`).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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

/// Whether the topmost mount at `p` is a sessionfs mount (a dead one
/// counts): from the mount table, by its type (`fuse`, or `fuse.sessionfs`
/// through fusermount3) and its source (`sessionfs:<digest>`), so that
/// another FUSE file system (fuse-overlayfs, sshfs) mounted there, or a
/// directory inside a mount, is not taken for one. On macOS from
/// `statfs` (`macfuse`, or FUSE-T's NFS mounts). Where neither can say,
/// any FUSE mount point counts.
pub fn is_sessionfs_mount(p: &Path) -> bool {
    let Some(real) = real_path(p) else {
        return super::is_fuse_path(p);
    };
    match mount_at(&real) {
        // Without a mount table (macOS, the forced fallbacks), the mount
        // itself is asked.
        MountAt::Unknown => asked_is_fuse_mount(&real),
        MountAt::Nothing => false,
        MountAt::Mount(m) => is_sessionfs(&m),
    }
}

/// Whether the mount table's entry `m` is a sessionfs mount (its type and
/// source, see [`is_sessionfs_mount`]).
fn is_sessionfs(m: &Mount) -> bool {
    super::fuse_fsname(&m.fstype, &m.source).is_some_and(|name| name.starts_with(b"sessionfs:"))
}

/// Whether `real` is a FUSE mount point, asking the mount itself: for
/// where no mount table says.
fn asked_is_fuse_mount(real: &Path) -> bool {
    super::is_fuse_path(real) && super::is_mount_point(real)
}

/// The device of the sessionfs mount at `real` (a real path), as the
/// mount table writes it (`major:minor`, or the number itself where it
/// comes from `stat`); `None` when no sessionfs mount is there. From the
/// mount table, without asking the mount (one nobody serves would make
/// that wait forever); where there is none (the forced fallbacks), the
/// mount is asked, as [`is_sessionfs_mount`] does.
pub fn sessionfs_mount_device(real: &Path) -> Option<String> {
    match mount_at(real) {
        MountAt::Mount(m) if is_sessionfs(&m) => Some(m.dev),
        MountAt::Mount(_) | MountAt::Nothing => None,
        MountAt::Unknown if asked_is_fuse_mount(real) => std::fs::symlink_metadata(real)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m).to_string()),
        MountAt::Unknown => None,
    }
}

/// The real path of `p`, as the mount table has it, without asking a
/// mount at `p` anything: a FUSE mount whose daemon is dead fails a stat,
/// and one nobody serves (its connection held open elsewhere, or not yet
/// initialised) makes it wait forever. Resolved through its parent first;
/// when the mount table shows a mount there, that is the answer; else
/// resolved whole (a symlink as the last component followed).
pub fn real_path(p: &Path) -> Option<PathBuf> {
    let beside = real_path_beside(p);
    if let Some(b) = &beside
        && matches!(mount_at(b), MountAt::Mount(_))
    {
        return beside;
    }
    std::fs::canonicalize(p).ok().or(beside)
}

/// The real path of `p` through its parent alone: `p` itself is not asked
/// (a mount there may be one whose daemon does not answer yet), so a
/// symlink as its last component is not followed.
pub fn real_path_beside(p: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(p).ok()?;
    let Some(parent) = abs.parent() else {
        return Some(abs); // `/`
    };
    let name = abs.file_name()?;
    Some(std::fs::canonicalize(parent).ok()?.join(name))
}

/// The user a FUSE mount at `real` (a real path) belongs to: its
/// `user_id=` in `/proc/self/mountinfo` (the topmost mount there).
pub fn mount_owner(real: &Path) -> Option<u32> {
    // Mountinfo writes a space, tab, newline and backslash in a path as
    // an octal escape: the path is escaped the same way to compare.
    let mut point = String::new();
    for &b in real.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => point.push_str(&format!("\\{b:03o}")),
            _ => point.push(char::from(b)),
        }
    }
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    owner_in(&String::from_utf8_lossy(&info), &point)
}

/// [`mount_owner`] in `info`, the text of a mountinfo, for the escaped
/// mount point `point` (compared as bytes; a path that is not UTF-8
/// matches nothing, and has no owner named).
fn owner_in(info: &str, point: &str) -> Option<u32> {
    info.lines().rev().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        if fields.split(' ').nth(4)? != point {
            return None;
        }
        let options = rest.split(' ').nth(2)?;
        options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    })
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

    #[test]
    fn the_owner_of_a_fuse_mount_is_its_user_id_in_mountinfo() {
        let info = "36 25 0:32 / /mnt/a\\040b rw,nosuid - fuse.sessionfs sessionfs:ab rw,user_id=1000,group_id=1000\n\
                    37 25 0:33 / /mnt/c rw - fuse sessionfs:cd rw,user_id=0,group_id=0\n\
                    38 25 0:34 / /mnt/c rw - fuse sessionfs:ef rw,user_id=7,group_id=7\n";
        assert_eq!(owner_in(info, "/mnt/a\\040b"), Some(1000));
        assert_eq!(owner_in(info, "/mnt/c"), Some(7), "the topmost mount");
        assert_eq!(owner_in(info, "/mnt"), None);
    }
}
