//! Progress on stderr, only when stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-count progress bar; silent unless stderr is a terminal.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for `total` bytes of work (0: unknown; a count and a rate are
    /// shown then), labelled `what`.
    pub fn bytes(what: &'static str, total: u64) -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            let (len, template) = if total == 0 {
                (None, "{msg} {spinner} {bytes} {bytes_per_sec}")
            } else {
                (
                    Some(total),
                    "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                )
            };
            let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
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
