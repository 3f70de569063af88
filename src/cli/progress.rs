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
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar
        } else {
            ProgressBar::hidden()
        };
        let p = Progress { bar };
        p.restart(what, total);
        p
    }

    /// Starts the bar over for the next stage of the work: `total` bytes
    /// (0: unknown), labelled `what`.
    pub fn restart(&self, what: &'static str, total: u64) {
        // In this order, every frame drawn in between names the new stage.
        self.bar.set_message(what);
        self.bar.reset();
        let template = if total == 0 {
            self.bar.unset_length();
            "{msg} {spinner} {bytes} {bytes_per_sec}"
        } else {
            self.bar.set_length(total);
            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}"
        };
        self.bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
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
