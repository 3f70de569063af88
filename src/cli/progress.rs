//! Progress on stderr, only when stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-count progress bar; silent unless stderr is a terminal.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for `total` bytes of work, labelled `what`.
    pub fn bytes(what: &'static str, total: u64) -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_message(what);
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress { bar }
    }

    /// Counts `n` more bytes done. Cheap: callable from every worker.
    pub fn add(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Sets the count of bytes done (progress reported by another process).
    pub fn set(&self, n: u64) {
        self.bar.set_position(n);
    }

    /// Whether the bar is drawn (stderr is a terminal).
    pub fn visible(&self) -> bool {
        !self.bar.is_hidden()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
