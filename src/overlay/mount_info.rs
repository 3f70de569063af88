//! What an upper directory says of the mount that holds it: `mount.json`
//! (where each part was mounted, for rebasing symlinks at an offline seal
//! as the daemon would, and which daemon holds it at which mountpoint)
//! and its lock (the `flock` a mount or an offline seal holds on the
//! directory). See docs/upper-format.md.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::packet::path::Part;

/// Name of the file in the upper directory that records where the parts
/// were last mounted (see docs/upper-format.md).
const MOUNT_INFO: &str = "mount.json";

/// What `mount.json` records: where each part is mounted, for an offline
/// seal to rebase the same symlinks as the daemon would, and which daemon
/// holds the directory at which mountpoint, for a mount refused by its lock
/// to name them (see docs/upper-format.md).
#[derive(Serialize, Deserialize)]
pub struct MountInfo {
    /// Where each part is mounted.
    pub roots: HashMap<Part, Vec<String>>,
    /// The mountpoint of the daemon that wrote it (absent before 2026-12-06).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mountpoint: Option<PathBuf>,
    /// That daemon's process id (absent before 2026-12-06).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

impl MountInfo {
    /// Records `self` in upper directory `upper`. Best effort: without it
    /// an offline seal stores absolute targets into the mount verbatim,
    /// and a mount refused by the lock cannot name the mount holding it.
    pub fn save(&self, upper: &Path) {
        #[derive(Serialize)]
        struct Versioned<'a> {
            schema: &'static str,
            #[serde(flatten)]
            info: &'a MountInfo,
        }
        let v = Versioned {
            schema: "sessionfs.mount-info/1",
            info: self,
        };
        let line = serde_json::to_string(&v).unwrap_or_default() + "\n";
        if let Err(e) = crate::sys::write_atomic(&upper.join(MOUNT_INFO), line.as_bytes()) {
            tracing::warn!(error = %e, "cannot record the mount in the upper directory");
        }
    }

    /// What upper directory `upper` records, if anything readable.
    pub fn load(upper: &Path) -> Option<MountInfo> {
        let bytes = std::fs::read(upper.join(MOUNT_INFO)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The mounted roots `upper` records (none if it records nothing).
    pub fn roots_of(upper: &Path) -> HashMap<Part, Vec<String>> {
        MountInfo::load(upper).map(|i| i.roots).unwrap_or_default()
    }
}

/// Whether nothing holds the lock on upper directory `dir` (taken and
/// released at once to find out; a directory that cannot be opened, or is
/// absent, holds none).
pub fn lock_free(dir: &Path) -> bool {
    let Ok(d) = std::fs::File::open(dir) else {
        return true;
    };
    nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
}

/// The process holding the `flock` on directory `dir`, from
/// `/proc/locks` (`None` where it cannot be read or names none).
pub fn lock_holder(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let (major, minor) = crate::sys::platform::device_numbers(m.dev());
    holder_in(&locks, major, minor, m.ino())
}

/// The pid of the granted `FLOCK` on inode `ino` of device `major:minor`
/// in `locks`, the text of `/proc/locks`: lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF` (device numbers in
/// hex; a waiter's line has `->` after the number).
fn holder_in(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [_, "FLOCK", _, _, pid, id, ..] if *id == want => pid.parse().ok(),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::holder_in;

    #[test]
    fn the_lock_holder_is_read_from_the_granted_flock_on_that_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 08:01:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 99 00:2d:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 5 00:2d:12345 0 EOF\n";
        assert_eq!(holder_in(locks, 0, 0x2d, 1234), Some(4242));
        assert_eq!(holder_in(locks, 0, 0x2d, 12345), Some(5));
        assert_eq!(holder_in(locks, 8, 1, 77), None, "a POSIX lock is not ours");
        assert_eq!(holder_in(locks, 0, 0x2e, 1234), None);
        assert_eq!(holder_in("", 0, 0x2d, 1234), None);
    }
}
