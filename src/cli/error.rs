//! The one error type the CLI prints, and the exit codes.

use serde::Serialize;

use crate::packet::error::{ErrorClass, ErrorKind};

/// Documented exit codes (see `docs/CLI.md`). Stable: scripts rely on them.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// An internal error (a bug): please report it.
    pub const INTERNAL: u8 = 1;
    /// Bad usage: unknown flag, missing argument, bad value.
    pub const USAGE: u8 = 2;
    /// The packet is invalid, tampered with, or not the digest asked for.
    pub const INVALID: u8 = 3;
    /// The packet's schema version is not supported by this build.
    pub const UNSUPPORTED: u8 = 4;
    /// A configured limit was exceeded.
    pub const LIMIT: u8 = 5;
    /// The operating system refused an operation.
    pub const IO: u8 = 6;
    /// The input or destination was refused (names, collisions,
    /// credentials, external symlinks, a non-empty target).
    pub const REFUSED: u8 = 7;
    /// A mount could not be made or reached (FUSE unavailable, mountpoint
    /// unusable or busy, no daemon serving it).
    pub const MOUNT: u8 = 8;
    /// A remote packet could not be read: configuration or credentials
    /// missing, the object missing, replaced or denied, the store
    /// unavailable past the retries.
    pub const REMOTE: u8 = 9;
}

/// An error as printed: `sessionfs.error/1` on stdout, a line on stderr.
#[derive(Debug, Serialize)]
pub struct CliError {
    /// Stable kind (`content_mismatch`, `limit_exceeded`, ...).
    pub kind: ErrorKind,
    /// What went wrong, with the offending path or value.
    pub message: String,
    /// The path concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What to do about it.
    pub hint: std::borrow::Cow<'static, str>,
    /// The process exit code.
    pub exit_code: u8,
    /// An error object received whole (from a daemon), printed as is.
    #[serde(skip)]
    pub relayed: Option<Box<serde_json::Value>>,
}

/// Advice for a kind whose class's advice would mislead.
fn kind_hint(kind: ErrorKind) -> Option<&'static str> {
    Some(match kind {
        ErrorKind::NotMounted => {
            "no sessionfs daemon serves that path: check the mountpoint (`sessionfs status MOUNTPOINT`), or seal offline with --packet and --upper"
        }
        ErrorKind::Busy => {
            "close the files open on the mount and leave it (cd elsewhere), or use `sessionfs umount --lazy`"
        }
        ErrorKind::UmountFailed => {
            "see the daemon's log (named by `sessionfs mount`); `fusermount3 -uz MOUNTPOINT` detaches the mount by force"
        }
        ErrorKind::AlreadyMounted => {
            "unmount it first with `sessionfs umount MOUNTPOINT` (add --lazy while files are open there; it also detaches a mount whose daemon is gone), or mount on another directory"
        }
        ErrorKind::MountpointNotEmpty => {
            "mount on an empty directory: nothing under a mountpoint shows while it is mounted, so sessionfs will not hide it"
        }
        ErrorKind::MountpointUnusable => {
            "the mountpoint must be an existing directory you may use (the message says what it is): create it (`mkdir -p MOUNTPOINT`), fix the path, or detach what is mounted there (a FUSE mount whose daemon died answers `Transport endpoint is not connected` or `Software caused connection abort`: `fusermount3 -uz MOUNTPOINT`)"
        }
        ErrorKind::SymlinkBudget => {
            "the packet is valid but its symlinks are too costly to resolve in strict mode; unpack without --strict-symlinks to restore them as they are"
        }
        ErrorKind::SymlinkEscapes => {
            "the packet is valid but holds a symlink leading out of the tree; unpack without --strict-symlinks to restore it as it is"
        }
        ErrorKind::RebaseFailed => {
            "the message says what failed and what the mount serves: the previous packet with its changes (seal again to move), or the new packet (its upper directory is mounted over the new packet from now on)"
        }
        ErrorKind::RemoteChanged => {
            "the object was replaced while it was read: run the command again; name packets by their digest (…/sha256-<hex>.packet) so that a key never changes"
        }
        ErrorKind::InvalidLocation => {
            "give s3://BUCKET/KEY with the key exactly as stored, or an http(s) URL of the object itself: keys and URL paths are taken literally (no `.`, `..` or empty segments)"
        }
        ErrorKind::RemoteConfig => {
            "set the AWS configuration the message names (docs/remote.md lists what is read: AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_S3, …)"
        }
        ErrorKind::ChangedWhilePacking | ErrorKind::ChangedWhileSealing => {
            "something wrote to the tree while it was read: run the command again once nothing writes to it"
        }
        _ => return None,
    })
}

impl CliError {
    /// Builds an error of `class`.
    pub fn new(
        class: Option<ErrorClass>,
        kind: ErrorKind,
        message: String,
        path: Option<String>,
    ) -> CliError {
        let (exit_code, hint) = match class {
            None => (
                exit::USAGE,
                "run `sessionfs --help` for the commands, and `sessionfs COMMAND --help` for one",
            ),
            Some(ErrorClass::Invalid) => (
                exit::INVALID,
                "the packet is damaged, was modified after it was written, or is not the one asked for; do not use it, fetch or re-create it",
            ),
            Some(ErrorClass::Unsupported) => (
                exit::UNSUPPORTED,
                "this packet was written by a newer sessionfs; upgrade to read it (`sessionfs inspect` still shows its metadata)",
            ),
            Some(ErrorClass::Limit) => (
                exit::LIMIT,
                "raise the limit with the flag or environment variable named in the message, or shrink the input",
            ),
            Some(ErrorClass::Io) => (
                exit::IO,
                "check that the path exists, is accessible, and the disk has room; nothing was changed, unless the message says what was",
            ),
            Some(ErrorClass::Refused) => (
                exit::REFUSED,
                "the input or destination holds something sessionfs will not take; the message says what and how to proceed",
            ),
            Some(ErrorClass::Remote) => (
                exit::REMOTE,
                "check the location, the AWS_* configuration (credentials, region, endpoint; see docs/remote.md) and that the store is reachable; nothing was changed",
            ),
            Some(ErrorClass::Mount) => (
                exit::MOUNT,
                "check that fuse3 is installed, /dev/fuse exists and you may mount (root, or fusermount3), and that the mountpoint is an empty directory not already mounted",
            ),
        };
        CliError {
            kind,
            message,
            path,
            hint: match (kind_hint(kind), class) {
                (Some(h), _) => h.into(),
                // Usage: the help of the command run, when there is one.
                (None, None) => match super::command_run() {
                    Some(cmd) => {
                        format!("run `sessionfs {cmd} --help` for usage and examples").into()
                    }
                    None => hint.into(),
                },
                (None, _) => hint.into(),
            },
            exit_code,
            relayed: None,
        }
    }

    /// The same error with advice of its own instead of its kind's.
    pub fn with_hint(mut self, hint: String) -> CliError {
        self.hint = hint.into();
        self
    }

    /// An error object from a daemon, to print unchanged.
    pub fn relayed(v: serde_json::Value) -> CliError {
        let exit_code = v["exit_code"]
            .as_u64()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(exit::INTERNAL);
        // A complete object from another sessionfs process is printed as
        // is; a daemon's short one gets its hint from the exit code.
        let class = match exit_code {
            exit::INVALID => Some(ErrorClass::Invalid),
            exit::UNSUPPORTED => Some(ErrorClass::Unsupported),
            exit::LIMIT => Some(ErrorClass::Limit),
            exit::IO => Some(ErrorClass::Io),
            exit::REFUSED => Some(ErrorClass::Refused),
            exit::MOUNT => Some(ErrorClass::Mount),
            exit::REMOTE => Some(ErrorClass::Remote),
            _ => None,
        };
        let mut e = CliError::new(
            class,
            // A kind this build does not know (a newer daemon's) is kept in
            // the object, printed as it came.
            v["kind"]
                .as_str()
                .and_then(ErrorKind::parse)
                .unwrap_or(ErrorKind::Internal),
            v["message"].as_str().unwrap_or("").to_owned(),
            v["path"].as_str().map(str::to_owned),
        );
        e.exit_code = exit_code;
        if v.get("hint").is_some() {
            e.relayed = Some(Box::new(v));
        }
        e
    }

    /// The `sessionfs.error/1` object.
    pub fn to_value(&self) -> serde_json::Value {
        if let Some(raw) = &self.relayed {
            return (**raw).clone();
        }
        let mut m = serde_json::Map::new();
        m.insert("schema".into(), "sessionfs.error/1".into());
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) {
            m.extend(fields);
        }
        serde_json::Value::Object(m)
    }

    /// Names the packet file `file` as what is at fault when the error
    /// names nothing more precise: an error about a packet as a whole
    /// (not a packet, truncated, unreadable) is about that file.
    pub fn in_file(self, file: &std::path::Path) -> CliError {
        self.in_named(crate::packet::path::shown_path(file))
    }

    /// [`CliError::in_file`] for a packet named by `f`, as shown (a
    /// remote location).
    pub fn in_named(mut self, f: String) -> CliError {
        if self.path.is_none() && self.relayed.is_none() {
            // No path yet means the message names no file either (an I/O
            // error on a known file carries it as its path).
            self.message = format!("{f}: {}", self.message);
            self.path = Some(f);
        }
        self
    }

    /// A usage error.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(None, ErrorKind::Usage, message.into(), None)
    }
}

/// The error for a daemon's `reply` that does not answer the request
/// sent: its own refusal, relayed; or an internal error (a daemon of
/// another version, or a bug).
pub fn unexpected_reply(reply: crate::fuse::control::Reply) -> CliError {
    match reply {
        e @ crate::fuse::control::Reply::Error(_) => CliError::relayed(e.into_value()),
        other => CliError::new(
            Some(ErrorClass::Io),
            ErrorKind::Internal,
            format!(
                "the daemon answered with something else: {}",
                other.into_value()
            ),
            None,
        ),
    }
}

/// Maps an error met reading the packet file `file` ([`CliError::in_file`]).
pub fn at_packet<E: Into<CliError>>(file: &std::path::Path) -> impl Fn(E) -> CliError + '_ {
    move |e| e.into().in_file(file)
}

impl From<crate::packet::Error> for CliError {
    fn from(e: crate::packet::Error) -> CliError {
        CliError::new(
            Some(e.class()),
            e.kind(),
            chain(&e),
            e.path().map(str::to_owned),
        )
    }
}

impl From<crate::source::Error> for CliError {
    fn from(e: crate::source::Error) -> CliError {
        CliError::new(e.class(), e.kind(), chain(&e), e.path().map(str::to_owned))
    }
}

impl From<crate::overlay::Error> for CliError {
    fn from(e: crate::overlay::Error) -> CliError {
        let path = e.path().map(str::to_owned);
        CliError::new(Some(e.class()), e.kind(), chain(&e), path)
    }
}

impl From<crate::daemon::Error> for CliError {
    fn from(e: crate::daemon::Error) -> CliError {
        use crate::daemon::Error;
        match e {
            Error::Overlay(e) => e.into(),
            Error::Usage(message) => CliError::usage(message),
            Error::Failed {
                kind,
                class,
                message,
                path,
                hint,
            } => {
                let path = path.map(|p| crate::packet::path::shown_path(&p));
                let e = CliError::new(Some(class), kind, message, path);
                match hint {
                    Some(h) => e.with_hint(h),
                    None => e,
                }
            }
        }
    }
}

impl From<crate::restore::Error> for CliError {
    fn from(e: crate::restore::Error) -> CliError {
        CliError::new(
            Some(e.class()),
            e.kind(),
            chain(&e),
            e.path().map(str::to_owned),
        )
    }
}

/// The error and its sources, once each, joined by `: `.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::Error;

    #[test]
    fn an_error_about_a_whole_packet_names_the_file() {
        // A packet named like the start of its message still gets its name.
        let e = CliError::from(Error::Truncated {
            expected: 2048,
            actual: 1500,
        })
        .in_file(std::path::Path::new("truncated"));
        assert_eq!(e.path.as_deref(), Some("truncated"));
        assert!(
            e.message.starts_with("truncated: truncated"),
            "{}",
            e.message
        );
        // Named once only, and an entry's own path is kept.
        let io = Error::io_at(
            std::path::Path::new("p.packet"),
            "cannot open the packet",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        let e = CliError::from(io).in_file(std::path::Path::new("p.packet"));
        assert_eq!(e.message.matches("p.packet").count(), 1, "{}", e.message);
        let entry = Error::DuplicatePath {
            path: "workspace/a".into(),
        };
        let e = CliError::from(entry).in_file(std::path::Path::new("p.packet"));
        assert_eq!(e.path.as_deref(), Some("workspace/a"));
    }
}
