//! Log lines that say nothing wrong, kept out of the log.
//!
//! fuser answers every `FUSE_INTERRUPT` with `ENOSYS` (it does not handle
//! interrupts). When the interrupted request was answered first (the usual
//! case: a process signalled while its request was being served), the
//! kernel has nothing left to match that answer to and refuses it with
//! `ENOENT`, and fuser logs `ERROR Failed to send FUSE reply: No such file
//! or directory`. Nothing is lost: the request was answered. A daemon's
//! log is read for its errors, so this one line is left out; any other
//! failure to send a reply (the connection gone, a malformed answer) is
//! still logged.

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The layer that leaves the lines above out.
pub struct Quiet;

impl<S: Subscriber> Layer<S> for Quiet {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        // Lines from the `log` crate (fuser's) come through tracing-log,
        // with their target and message as fields.
        if event.metadata().target() != "log" {
            return true;
        }
        let mut seen = Seen::default();
        event.record(&mut seen);
        !(seen.target && seen.late_reply)
    }
}

/// What [`Quiet`] looks for in an event's fields.
#[derive(Default)]
struct Seen {
    /// The line comes from fuser's replies.
    target: bool,
    /// It is the refused answer to a request already finished.
    late_reply: bool,
}

impl Visit for Seen {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.target = value == "fuser::reply";
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let text = format!("{value:?}");
            self.late_reply = text.starts_with("Failed to send FUSE reply:")
                && text.ends_with(&format!("(os error {})", libc::ENOENT));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Collects what the fmt layer writes.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs `message` as the `log` crate would from `target` (through
    /// tracing-log, as the daemon's logger receives it) and returns what
    /// reached the log.
    fn logged(target: &str, message: std::fmt::Arguments<'_>) -> String {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::registry().with(Quiet).with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || out.clone())
                .with_ansi(false),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing_log::format_trace(
                &log::Record::builder()
                    .args(message)
                    .level(log::Level::Error)
                    .target(target)
                    .build(),
            )
            .unwrap();
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn only_a_late_reply_to_an_interrupted_request_is_left_out() {
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        let enodev = std::io::Error::from_raw_os_error(libc::ENODEV);
        assert_eq!(
            logged(
                "fuser::reply",
                format_args!("Failed to send FUSE reply: {enoent}")
            ),
            ""
        );
        // Every other line stays: another failure to reply, the same words
        // from elsewhere, and other lines of fuser's.
        for (target, line) in [
            (
                "fuser::reply",
                format!("Failed to send FUSE reply: {enodev}"),
            ),
            (
                "other::crate",
                format!("Failed to send FUSE reply: {enoent}"),
            ),
            ("fuser::request", "Unexpected FUSE_INIT".to_owned()),
        ] {
            let out = logged(target, format_args!("{line}"));
            assert!(out.contains(&line), "{target}: {line:?} left out: {out:?}");
        }
    }
}
