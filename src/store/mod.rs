//! Where packet bytes live: a local file, an S3 object, an HTTP URL.
//!
//! The bottom layer. The packet layer above reads through [`ReadAt`] and
//! does not care where the bytes come from; this layer knows the network
//! (ureq, rusty-s3), the AWS configuration chain, retries and their time
//! bound, and nothing of the packet format. No fuser, no overlay.
//!
//! A remote object is pinned at open: its length and ETag are those of the
//! first response, and every later range is asked for with `If-Match` on
//! that ETag, so an object replaced under a reader fails with
//! [`Error::Changed`] instead of mixing bytes of two objects.

pub mod aws;
pub mod cache;
pub mod deadline;
pub mod error;
pub mod remote;
pub mod spool;
pub mod sts;
pub mod transport;
pub mod upload;
mod xml;

use std::ffi::OsStr;
use std::path::PathBuf;

pub use deadline::Deadline;
pub use error::{Error, Result};
pub use remote::{Remote, Settings};
pub use upload::{Completion, CopySource, Head, Key, PartDone, Upload};

/// The first request for a remote packet asks for this many bytes: the
/// manifest's header and, for packets of up to a few thousand entries,
/// the whole manifest, so that `inspect` and `digest` cost one request
/// (a larger manifest costs a second one for the rest). A little over
/// what one round trip carries at no extra latency in region.
pub const FIRST_FETCH: u64 = 256 * 1024;

/// Where a packet is: the argument of `inspect`, `digest` and the like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A path on this machine, used exactly as before remote packets.
    Local(PathBuf),
    /// An object in an S3-compatible store, `s3://BUCKET/KEY`.
    S3 {
        /// The bucket.
        bucket: String,
        /// The object key (may hold `/`).
        key: String,
    },
    /// An `http://` or `https://` URL of a server that answers range
    /// requests (a presigned S3 GET, a web server).
    Http(url::Url),
}

impl Location {
    /// Parses a command-line argument: `s3://…`, `http://…` and
    /// `https://…` are remote, anything else is a local path, unchanged
    /// (a file named `s3:` stays reachable as `./s3://…`).
    pub fn parse(arg: &OsStr) -> std::result::Result<Location, String> {
        let bytes = arg.as_encoded_bytes();
        let has_scheme =
            |s: &str| bytes.len() >= s.len() && bytes[..s.len()].eq_ignore_ascii_case(s.as_bytes());
        if !(has_scheme("s3://") || has_scheme("http://") || has_scheme("https://")) {
            return Ok(Location::Local(PathBuf::from(arg)));
        }
        let Some(s) = arg.to_str() else {
            return Err("a remote location must be UTF-8".into());
        };
        if has_scheme("s3://") {
            let rest = &s["s3://".len()..];
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() || key.is_empty() {
                return Err(format!(
                    "`{s}` is not an S3 location: expected s3://BUCKET/KEY"
                ));
            }
            if !bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
            {
                return Err(format!(
                    "`{bucket}` is not a bucket name: letters, digits, `.`, `-` and `_` only"
                ));
            }
            return Ok(Location::S3 {
                bucket: bucket.into(),
                key: key.into(),
            });
        }
        let url =
            url::Url::parse(s).map_err(|e| format!("`{}` is not a URL: {e}", shown_url_str(s)))?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("`{}` names no host", shown_url(&url)));
        }
        Ok(Location::Http(url))
    }

    /// Whether the bytes are fetched over the network.
    pub fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }

    /// The location as results and errors show it: an S3 location as
    /// given, an URL without its user information and query (a presigned
    /// URL's query holds its signature and the access key's id). A path is
    /// shown lossily here; the layers above show paths their own way.
    pub fn shown(&self) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            Location::S3 { bucket, key } => format!("s3://{bucket}/{key}"),
            Location::Http(u) => shown_url(u),
        }
    }
}

/// An URL without user information, query and fragment: how an URL
/// (a location, an endpoint) is shown in messages and logs.
pub(crate) fn shown_url(u: &url::Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    let had_query = u.query().is_some();
    u.set_query(None);
    u.set_fragment(None);
    let mut s = u.to_string();
    if had_query {
        s.push_str("?…");
    }
    s
}

/// [`shown_url`] for a string that did not parse as an URL.
fn shown_url_str(s: &str) -> String {
    let s = s.split(['?', '#']).next().unwrap_or("");
    match s.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
            format!("{scheme}://{rest}")
        }
        None => s.into(),
    }
}

/// Bytes of an object, read by offset: what the packet layer reads a
/// remote packet through.
pub trait ReadAt: Send + Sync {
    /// The object's length, as first seen.
    fn len(&self) -> u64;

    /// Whether the object is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ETag first seen, if the server gives one; later reads are
    /// pinned to it.
    fn etag(&self) -> Option<&str>;

    /// A deadline for a new operation on this object, as its settings
    /// bound one ([`Deadline::for_operation`]): for a caller whose read is
    /// an operation of its own.
    fn deadline(&self) -> Deadline {
        Deadline::for_operation(&Settings::default())
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`, which
    /// must lie within [`ReadAt::len`]. Retries transient failures until
    /// `deadline`: the caller's, which may cover more than this read (a
    /// read of a mount that fetches and refetches several ranges).
    fn read_exact_at(&self, buf: &mut [u8], offset: u64, deadline: Deadline) -> Result<()>;

    /// The location, as shown in errors and results.
    fn shown(&self) -> &str;
}

/// Opens a remote location for reading (a local one is opened by the
/// packet layer as a file). One request: the first `first_bytes` of the
/// object come with its length and ETag, and are kept, so a packet whose
/// manifest fits there costs one request to inspect.
pub fn open_remote(location: &Location, settings: &Settings, first_bytes: u64) -> Result<Remote> {
    Remote::open(location, settings, first_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_as_documented() {
        let s3 = |b: &str, k: &str| Location::S3 {
            bucket: b.into(),
            key: k.into(),
        };
        let ok: &[(&str, Location)] = &[
            ("p.packet", Location::Local("p.packet".into())),
            ("./s3://b/k", Location::Local("./s3://b/k".into())),
            ("s3://b/k", s3("b", "k")),
            ("S3://b/dir/k.packet", s3("b", "dir/k.packet")),
            ("s3://my.bucket-1/a/b/", s3("my.bucket-1", "a/b/")),
        ];
        for (arg, want) in ok {
            assert_eq!(Location::parse(OsStr::new(arg)).as_ref(), Ok(want), "{arg}");
        }
        for bad in [
            "s3://",
            "s3://b",
            "s3://b/",
            "s3:///k",
            "s3://b c/k",
            "http://",
            "https://[::1/x",
        ] {
            assert!(Location::parse(OsStr::new(bad)).is_err(), "{bad}");
        }
        let u = Location::parse(OsStr::new("https://h:9/p/k?X-Amz-Signature=s")).unwrap();
        assert!(u.is_remote());
        assert_eq!(u.shown(), "https://h:9/p/k?…");
    }

    /// Neither user information nor a query (a presigned URL's signature
    /// and key id) is ever shown, parsed or not.
    #[test]
    fn shown_urls_hold_no_secret() {
        let u = Location::parse(OsStr::new("http://user:pw@h/k?X-Amz-Credential=AKIA#f")).unwrap();
        assert_eq!(u.shown(), "http://h/k?…");
        let e =
            Location::parse(OsStr::new("http://user:pw@[zz/k?X-Amz-Credential=AKIA")).unwrap_err();
        assert!(!e.contains("pw") && !e.contains("AKIA"), "{e}");
    }
}
