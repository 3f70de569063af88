//! The time bound of one operation: a read (all its requests, retries and
//! refetches), an upload's part, a credential renewal.
//!
//! A [`Deadline`] is made once, when the operation starts, and handed down
//! to every request made on its behalf: each request may take at most
//! what is [`Deadline::remaining`], so retries, renewals and refetches
//! never add up to more than the bound (a bound per attempt would let a
//! read that keeps failing run for attempts x bound).

use std::time::{Duration, Instant};

use super::remote::Settings;

/// When an operation must be over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// When it began.
    began: Instant,
    /// The whole bound, as given (for messages).
    bound: Duration,
}

impl Deadline {
    /// An operation that starts now and may take `bound`.
    pub fn after(bound: Duration) -> Deadline {
        Deadline {
            began: Instant::now(),
            bound,
        }
    }

    /// An operation that starts now, bounded as the settings say
    /// ([`Settings::read_timeout`], `SESSIONFS_REMOTE_TIMEOUT`).
    pub fn for_operation(settings: &Settings) -> Deadline {
        Deadline::after(settings.read_timeout)
    }

    /// The time left (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.bound.saturating_sub(self.began.elapsed())
    }

    /// Whether the time is up.
    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The time since the operation began.
    pub fn elapsed(&self) -> Duration {
        self.began.elapsed()
    }

    /// The whole bound the operation was given.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// This deadline, or an earlier one ending `bound` from now: a part of
    /// an operation (a renewal, an abort) with a shorter bound of its own.
    pub fn within(self, bound: Duration) -> Deadline {
        if bound < self.remaining() {
            Deadline::after(bound)
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_counts_down_and_never_grows() {
        let d = Deadline::after(Duration::from_secs(60));
        assert!(!d.expired());
        assert!(d.remaining() <= Duration::from_secs(60));
        assert!(d.remaining() > Duration::from_secs(59));
        assert_eq!(d.bound(), Duration::from_secs(60));
        // A shorter part of it ends sooner; a longer one does not extend it.
        assert!(d.within(Duration::from_secs(1)).remaining() <= Duration::from_secs(1));
        assert_eq!(d.within(Duration::from_secs(600)), d);
        let gone = Deadline::after(Duration::ZERO);
        assert!(gone.expired());
        assert_eq!(gone.remaining(), Duration::ZERO);
        let s = Settings {
            read_timeout: Duration::from_secs(5),
            ..Settings::default()
        };
        assert_eq!(Deadline::for_operation(&s).bound(), Duration::from_secs(5));
    }
}
