//! `sessionfs umount`: unmount a sessionfs mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Output;
use super::error::CliError;
use crate::fuse::control;
use crate::packet::error::ErrorClass;

/// Unmount a sessionfs mount: asks its daemon (found from the mountpoint
/// through its control socket) to unmount cleanly, and waits until the
/// mount is gone. Without a daemon to ask, falls back to `fusermount3 -u`.
/// A mount with open files is busy (exit 8) unless `--lazy`.
///
/// Example: sessionfs umount /workspace
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The mountpoint.
    mountpoint: PathBuf,
    /// Detach now even if busy; the daemon exits once the last open file
    /// on the mount is closed.
    #[arg(long)]
    lazy: bool,
}

#[derive(Serialize)]
struct Result {
    mountpoint: PathBuf,
    unmounted: bool,
    via: &'static str,
}

/// Whether `p` is currently a FUSE mount (a dead one counts).
#[allow(clippy::unnecessary_cast)] // f_type's C type differs between platforms
pub fn is_fuse_mount(p: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    match nix::sys::statfs::statfs(p) {
        Ok(s) => s.filesystem_type().0 as i64 == FUSE_SUPER_MAGIC,
        Err(nix::errno::Errno::ENOTCONN) => true,
        Err(_) => false,
    }
}

fn wait_gone(p: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !is_fuse_mount(p) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !is_fuse_mount(p)
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let mp = &a.mountpoint;
    let fail = |kind: &str, message: String| {
        CliError::new(
            Some(ErrorClass::Mount),
            kind,
            message,
            Some(mp.display().to_string()),
        )
    };
    let via = match control::request(
        mp,
        &serde_json::json!({"op": "unmount"}),
        Some(Duration::from_secs(60)),
    ) {
        Ok(v) if v["schema"] == "sessionfs.error/1" => return Err(CliError::relayed(v)),
        Ok(_) => "daemon",
        Err(e) => {
            if !is_fuse_mount(mp) {
                return Err(fail(
                    "not_mounted",
                    format!("{}: no sessionfs mount here ({e})", mp.display()),
                ));
            }
            let st = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(mp)
                .status();
            match st {
                Ok(s) if s.success() => "fusermount3",
                _ => {
                    nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH).map_err(|e| {
                        fail(
                            "umount_failed",
                            format!("{}: cannot unmount: {e}", mp.display()),
                        )
                    })?;
                    "umount2"
                }
            }
        }
    };
    if !wait_gone(mp, Duration::from_secs(30)) {
        return Err(fail(
            "umount_failed",
            format!("{}: still mounted after the unmount request", mp.display()),
        ));
    }
    Ok(Output::new(
        "sessionfs.umount-result/1",
        Result {
            mountpoint: a.mountpoint.clone(),
            unmounted: true,
            via,
        },
    ))
}
