//! Errors of the store layer: what went wrong fetching a packet's bytes.
//!
//! Every message starts with the location (`s3://bucket/key`, or an URL
//! without its query, which may hold a signature) and says what failed.
//! None holds a credential: secrets never reach this type (they are not in
//! locations, and server bodies are reduced to their S3 error code).

use std::time::Duration;

/// A store-layer error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot address the location: no credentials, a
    /// malformed endpoint, a profile that does not exist.
    #[error("{location}: {reason}")]
    Config {
        /// The location, as shown.
        location: String,
        /// What is missing or wrong, naming the variable or file to fix.
        reason: String,
    },

    /// The bucket or the object does not exist (HTTP 404).
    #[error("{location}: not found ({code}, HTTP 404)")]
    NotFound {
        /// The location, as shown.
        location: String,
        /// The S3 error code (`NoSuchKey`, `NoSuchBucket`) or `NotFound`.
        code: String,
    },

    /// The server refused the request's credentials or permissions (HTTP
    /// 401 or 403).
    #[error("{location}: access denied ({code}, HTTP {status})")]
    Denied {
        /// The location, as shown.
        location: String,
        /// The HTTP status.
        status: u16,
        /// The S3 error code (`AccessDenied`, `SignatureDoesNotMatch`,
        /// `InvalidAccessKeyId`, `ExpiredToken`).
        code: String,
    },

    /// The object changed since it was opened: a request pinned to the
    /// ETag first seen failed its precondition (HTTP 412), or the length
    /// the server reports differs.
    #[error("{location}: the object changed while it was read ({what})")]
    Changed {
        /// The location, as shown.
        location: String,
        /// What differs.
        what: String,
    },

    /// The server answered a way that does not serve ranged reads: it
    /// ignored the `Range` header, sent a body of the wrong length, or an
    /// unexpected status.
    #[error("{location}: {what}")]
    BadResponse {
        /// The location, as shown.
        location: String,
        /// What was wrong with the response.
        what: String,
    },

    /// Something else is already at the key a packet was to be written
    /// to (a conditional write refused it); it is left as it is.
    #[error("{location}: {what}")]
    Exists {
        /// The location, as shown.
        location: String,
        /// What is there, and what to do.
        what: String,
    },

    /// The object an upload completed was replaced at once by another
    /// write: the store does not honour `If-None-Match: *` (a conditional
    /// completion), so it cannot be trusted never to replace an object.
    #[error("{location}: {what}")]
    Overwritten {
        /// The location, as shown.
        location: String,
        /// What was seen.
        what: String,
    },

    /// Every attempt failed with a transient error (5xx, throttling,
    /// timeout, reset connection, a body cut short) until the attempts or
    /// the time per read ran out.
    #[error(
        "{location}: cannot {what}: gave up after {attempts} attempts in {elapsed:.1?} (last: {last})"
    )]
    Unavailable {
        /// The location, as shown.
        location: String,
        /// What was asked: `read bytes START..END`, `upload part N`, …
        what: String,
        /// How many requests were made.
        attempts: u32,
        /// How long they took together.
        elapsed: Duration,
        /// The last failure.
        last: String,
    },

    /// Content fetched for a range the manifest gives a hash for did not
    /// match it, on the first fetch and again on a second one (a
    /// truncated or corrupted response is caught and fetched once more).
    #[error("{location}: bytes {start}..{end} do not match the manifest's hash, fetched twice")]
    Corrupt {
        /// The location, as shown.
        location: String,
        /// The range.
        start: u64,
        /// Its end (exclusive).
        end: u64,
    },
}

impl Error {
    /// The stable machine-readable kind.
    pub fn kind(&self) -> crate::kind::ErrorKind {
        use crate::kind::ErrorKind;
        match self {
            Error::Config { .. } => ErrorKind::RemoteConfig,
            Error::NotFound { .. } => ErrorKind::RemoteNotFound,
            Error::Denied { .. } => ErrorKind::RemoteDenied,
            Error::Changed { .. } => ErrorKind::RemoteChanged,
            Error::BadResponse { .. } => ErrorKind::RemoteBadResponse,
            Error::Unavailable { .. } => ErrorKind::RemoteUnavailable,
            Error::Exists { .. } => ErrorKind::RemoteExists,
            Error::Overwritten { .. } => ErrorKind::RemoteOverwritten,
            Error::Corrupt { .. } => ErrorKind::ContentMismatch,
        }
    }

    /// The location the error is about, as shown.
    pub fn location(&self) -> &str {
        match self {
            Error::Config { location, .. }
            | Error::NotFound { location, .. }
            | Error::Denied { location, .. }
            | Error::Changed { location, .. }
            | Error::BadResponse { location, .. }
            | Error::Unavailable { location, .. }
            | Error::Exists { location, .. }
            | Error::Overwritten { location, .. }
            | Error::Corrupt { location, .. } => location,
        }
    }
}

/// Result alias of the store layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;
