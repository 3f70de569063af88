//! A clean end on SIGINT, SIGTERM or SIGHUP for the commands that write
//! files (`pack`, `unpack`, a seal): what they have half-written (the
//! temporary output, the staging directory) is removed before the process
//! exits, instead of being left behind (and, for a temporary output inside
//! the tree, packed by the next run).
//!
//! [`arm`] blocks those signals in the calling thread, and so in every
//! thread it starts from then on, and waits for them in a thread of its
//! own; call it before any other thread starts. Writers register what to
//! remove with [`remove_on_interrupt`] for as long as it is half-written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::signal::{SigSet, Signal};
use parking_lot::Mutex;

/// What to remove if interrupted, by registration number.
static PENDING: Mutex<Vec<(u64, PathBuf)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A registration: dropping it (the file is committed or already removed)
/// takes the path off the list.
#[must_use = "the path is only removed on interrupt while this lives"]
pub struct Pending(u64);

impl Drop for Pending {
    fn drop(&mut self) {
        PENDING.lock().retain(|(k, _)| *k != self.0);
    }
}

/// Removes `path` (a file, or a directory and its contents) if the process
/// is interrupted while the returned registration lives. Without [`arm`],
/// it costs a lock and does nothing else.
pub fn remove_on_interrupt(path: &Path) -> Pending {
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    PENDING.lock().push((k, path.to_owned()));
    Pending(k)
}

/// Takes SIGINT, SIGTERM and SIGHUP for this process: on one, removes what
/// is registered, calls `report` with the signal (to print the error) and
/// exits with 128 + its number.
pub fn arm(report: fn(Signal)) -> std::io::Result<()> {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().map_err(std::io::Error::from)?;
    std::thread::Builder::new()
        .name("interrupt".into())
        .spawn(move || {
            let Ok(sig) = signals.wait() else { return };
            // Held to the exit: nothing registers or commits meanwhile.
            let pending = PENDING.lock();
            for (_, path) in pending.iter() {
                let removed = match std::fs::symlink_metadata(path) {
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
                    Ok(_) => std::fs::remove_file(path),
                    Err(e) => Err(e),
                };
                if let Err(e) = removed {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove after the interrupt");
                }
            }
            report(sig);
            std::process::exit(128 + sig as i32);
        })?;
    Ok(())
}
