//! Where log lines go: stderr, which for a mount's daemon is its log file,
//! kept to a bounded size while the daemon runs. A mount may serve for
//! weeks, and its log was moved aside only when a daemon started.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::fuse::control;

/// The daemon's log, when stderr is that file.
struct Rotating {
    path: PathBuf,
    /// Moved aside once it holds more than this many bytes.
    limit: u64,
    /// Bytes in it (as of the daemon's start, then counted).
    len: u64,
}

static ROTATING: OnceLock<Mutex<Rotating>> = OnceLock::new();

/// From now on, stderr is the log at `path`: once it holds more than
/// `limit` bytes, it is moved to `<path>.1` and a new one is begun there.
pub fn rotate_stderr(path: PathBuf, limit: u64) {
    let len = nix::sys::stat::fstat(io::stderr()).map_or(0, |s| s.st_size as u64);
    let _ = ROTATING.set(Mutex::new(Rotating { path, limit, len }));
}

impl Rotating {
    fn wrote(&mut self, n: u64) {
        self.len = self.len.saturating_add(n);
        if self.len <= self.limit {
            return;
        }
        // The line that passed the limit ends the old log. A failure (a
        // full disk, the runtime directory gone) is tried again after as
        // many bytes more; it is written to stderr, not logged: this runs
        // inside the logger.
        self.len = 0;
        if let Err(e) = control::start_log_afresh(&self.path)
            .and_then(|f| nix::unistd::dup2_stderr(&f).map_err(io::Error::from))
        {
            let _ = writeln!(
                io::stderr(),
                "cannot start the log {} afresh ({e}); it grows on until that works",
                self.path.display()
            );
        }
    }
}

/// The writer of every log line (see [`rotate_stderr`]).
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = io::stderr().write(buf)?;
        if let Some(r) = ROTATING.get() {
            r.lock().wrote(n as u64);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
