//! A clean end on SIGINT, SIGTERM or SIGHUP for the commands that write
//! files (`pack`, `unpack`, an offline seal): what they have half-written
//! (the temporary output, the staging directory) is removed before the
//! process exits, instead of being left behind (and, for a temporary output
//! inside the tree, packed by the next run).
//!
//! [`arm`] blocks those signals in the calling thread, and so in every
//! thread it starts from then on, and waits for them in a thread of its
//! own; call it before any other thread starts. Writers register what to
//! remove with [`remove_on_interrupt_at`] for as long as it is half-written,
//! hold [`creating`] while they add to it (so that, once the signal thread
//! holds the gate, nothing new appears in what it removes), and hold it
//! across the commit that moves it into place and ends its registration
//! (so that a signal sees the work either not done or done). Once the work
//! is done ([`committed`]), a signal no longer stops the run: what is left
//! is to report it, and the run exits as it would have; a second signal
//! ends it at once.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use nix::sys::signal::{SigSet, Signal};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

/// What to remove if interrupted, by registration number.
static PENDING: Mutex<Vec<(u64, Target)>> = Mutex::new(Vec::new());

/// Something half-written.
enum Target {
    /// A file, or a directory and its contents (no mount inside is
    /// entered), by its name in a directory held open: found there
    /// wherever the directory has been moved; and its path when
    /// registered, for messages.
    At(OwnedFd, OsString, PathBuf),
    /// Something undone by running a function (a multipart upload
    /// aborted), named for messages.
    Undo(String, Undo),
}

/// What undoes a [`Target::Undo`].
pub type Undo = Box<dyn Fn() -> std::io::Result<()> + Send>;

impl Target {
    /// Removes it; what it is, for a message.
    fn remove(&self) -> (String, std::io::Result<()>) {
        match self {
            Target::At(dir, name, shown) => {
                let gone = crate::sys::remove_tree_at(dir.as_fd(), name);
                (crate::packet::path::shown_path(shown), gone)
            }
            Target::Undo(what, undo) => (what.clone(), undo()),
        }
    }
}
static NEXT: AtomicU64 = AtomicU64::new(0);
/// Set once the work is in place: a first signal then lets the run finish.
static COMMITTED: AtomicBool = AtomicBool::new(false);
/// The run's report: [`UNREPORTED`], [`PRINTING`], or, once printed, its
/// exit code, with which a signal then ends the process, printing nothing
/// more.
static REPORTED: AtomicI32 = AtomicI32::new(UNREPORTED);
const UNREPORTED: i32 = -1;
const PRINTING: i32 = -2;
/// Held shared by writers while they create entries or commit; taken
/// exclusively, for good, by the signal thread.
static GATE: RwLock<()> = RwLock::new(());

/// A registration: dropping it (the file is committed or already removed)
/// takes the path off the list.
#[must_use = "the path is only removed on interrupt while this lives"]
pub struct Pending(u64);

impl Drop for Pending {
    fn drop(&mut self) {
        PENDING.lock().retain(|(k, _)| *k != self.0);
    }
}

/// Removes the entry `name` (a file, or a directory and its contents) of
/// the directory `dir` (a handle of its own), `shown` in messages, if the
/// process is interrupted while the returned registration lives (found
/// there wherever the directory has been moved). Without [`arm`], it costs
/// a lock and does nothing else.
pub fn remove_on_interrupt_at(dir: OwnedFd, name: &OsStr, shown: &Path) -> Pending {
    register(Target::At(dir, name.to_owned(), shown.to_owned()))
}

/// Runs `undo` (which must end within seconds: it delays the exit) if
/// the process is interrupted while the returned registration lives;
/// `what` names it in messages. For work that is not a file: a multipart
/// upload, aborted.
pub fn undo_on_interrupt(what: String, undo: Undo) -> Pending {
    register(Target::Undo(what, undo))
}

fn register(target: Target) -> Pending {
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    PENDING.lock().push((k, target));
    Pending(k)
}

/// Held while creating entries in a registered directory, or across a
/// commit: an interrupt waits for it, and then no new one begins.
pub fn creating() -> RwLockReadGuard<'static, ()> {
    GATE.read()
}

/// Says, under the gate of the commit, that the work is in place: from
/// here on a signal lets the run finish and report it (a packet written, a
/// tree restored), rather than ending it with an error saying the work was
/// done anyway.
pub fn committed() {
    COMMITTED.store(true, Ordering::Release);
}

/// Prints the run's report (its one JSON object) with `print`, which gives
/// the run's exit code (returned), and records that code: a signal after
/// ends the process with that code instead
/// of printing a second object; one while it prints waits a little for it
/// (not for good: stdout may be a pipe nobody reads). Not for the signal
/// thread's own report.
pub fn report(print: impl FnOnce() -> u8) -> u8 {
    {
        // Under the gate: the signal thread, once it holds it, sees either
        // no report begun (and prints its own) or this one.
        let _gate = GATE.read();
        REPORTED.store(PRINTING, Ordering::Release);
    }
    let code = print();
    REPORTED.store(i32::from(code), Ordering::Release);
    code
}

/// What the signal thread did, for the error it reports.
#[derive(Clone, Copy, Debug)]
pub struct Interrupted {
    /// The signal.
    pub signal: Signal,
    /// Half-written paths removed.
    pub removed: usize,
    /// Half-written paths that could not be removed (named on stderr).
    pub left: usize,
    /// The work was in place before the signal (a second one ended the
    /// run as it reported it).
    pub committed: bool,
}

/// Takes SIGINT, SIGTERM and SIGHUP for this process, except those it was
/// started ignoring (`nohup`, a background job of a script): on one, waits
/// for the writers' creations and commits in flight, removes what is
/// registered, calls `report` and exits with 128 + the signal's number;
/// after [`committed`], only on a second signal.
pub fn arm(report: fn(Interrupted)) -> std::io::Result<()> {
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        if !crate::sys::platform::signal_ignored(s) {
            signals.add(s);
        }
    }
    signals.thread_block().map_err(std::io::Error::from)?;
    std::thread::Builder::new()
        .name("interrupt".into())
        .spawn(move || {
            let Ok(mut signal) = signals.wait() else { return };
            // Held to the exit: nothing is created or committed meanwhile.
            let mut gate = GATE.write();
            if COMMITTED.load(Ordering::Acquire) {
                drop(gate);
                briefly(move || {
                    tracing::warn!(%signal, "the work is done; finishing its report (a second signal ends the run now)");
                });
                crate::barrier::wait(crate::barrier::from_env().as_deref(), crate::barrier::Point::InterruptDeferred);
                let Ok(again) = signals.wait() else { return };
                (signal, gate) = (again, GATE.write());
            }
            let _gate = gate;
            let pending = PENDING.lock();
            let (mut removed, mut left) = (0, 0);
            let mut unremoved = Vec::new();
            for (_, target) in pending.iter() {
                match target.remove() {
                    (_, Ok(())) => removed += 1,
                    (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                    (path, Err(e)) => {
                        left += 1;
                        unremoved.push((path, e.to_string()));
                    }
                }
            }
            if !unremoved.is_empty() {
                briefly(move || {
                    for (path, error) in unremoved {
                        tracing::error!(%path, %error, "cannot remove it after the interrupt");
                    }
                });
            }
            // The run says how it ended: one report is all.
            for _ in 0..200 {
                if REPORTED.load(Ordering::Acquire) != PRINTING {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            match REPORTED.load(Ordering::Acquire) {
                UNREPORTED => {}
                // Still printing after 2 s: stdout is not being read.
                PRINTING => std::process::exit(128 + signal as i32),
                code => std::process::exit(code),
            }
            let i = Interrupted {
                signal,
                removed,
                left,
                committed: COMMITTED.load(Ordering::Acquire),
            };
            briefly(move || report(i));
            std::process::exit(128 + signal as i32);
        })?;
    Ok(())
}

/// Runs `f` (the signal thread's logging or report) on a thread of its own
/// and waits for it at most 2 s: stderr or stdout may be a pipe nobody
/// reads, and a write blocked there must not keep a signal from ending the
/// run. (Should no thread start, `f` is not run.)
fn briefly(f: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    let started = std::thread::Builder::new().spawn(move || {
        f();
        let _ = done.send(());
    });
    if started.is_ok() {
        let _ = finished.recv_timeout(std::time::Duration::from_secs(2));
    }
}
