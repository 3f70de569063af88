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
            // rusty-s3 joins the key onto the bucket's URL (`Url::join`),
            // which would resolve these: `x/../../other/k` is a key of
            // another bucket, `/k` leaves the bucket, `//host/k` another
            // host. Anything else is sent as given, percent-encoded (`%`
            // included: `%2e` is three characters of the key).
            if let Some(seg) = key.split('/').find(|seg| matches!(*seg, "" | "." | "..")) {
                return Err(format!(
                    "`{s}`: the key holds {}; a key is taken literally, and sessionfs \
                     does not normalise it",
                    segment_named(seg)
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
        literal_url_path(s, &url)?;
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

/// Whether a segment of an URL path is one URL parsing resolves or one
/// that names nothing: empty, `.` or `..`, percent-encoded or not (the
/// URL standard reads `%2e` as `.`).
fn is_dot_or_empty(seg: &str) -> bool {
    let decoded = percent_encoding::percent_decode_str(seg).collect::<Vec<u8>>();
    matches!(&decoded[..], b"" | b"." | b"..")
}

/// A refused segment, as errors name it.
fn segment_named(seg: &str) -> String {
    if seg.is_empty() {
        "an empty segment (`//`, or a `/` at either end)".into()
    } else {
        format!("a `{seg}` segment")
    }
}

/// Refuses an URL (`raw`, parsed as `url`) whose path the parser changed
/// or would have to: `.`, `..` and empty segments, and anything the URL
/// standard rewrites (a `\` read as `/`, tabs and newlines dropped,
/// spaces trimmed). Percent-encoding what must be is not a change: the
/// path decodes to what was given.
fn literal_url_path(raw: &str, url: &url::Url) -> std::result::Result<(), String> {
    let shown = || shown_url_str(raw);
    let after_scheme = raw.split_once("://").map_or(raw, |(_, r)| r);
    // The authority ends at the first of these (`\` is `/` for http).
    let path_at = after_scheme
        .find(['/', '?', '#', '\\'])
        .unwrap_or(after_scheme.len());
    let rest = &after_scheme[path_at..];
    let path = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    let segments = path.strip_prefix('/').unwrap_or(path);
    if let Some(seg) = segments.split('/').find(|seg| is_dot_or_empty(seg)) {
        return Err(format!(
            "`{}`: the path holds {}; a path is taken literally, and sessionfs does \
             not normalise it",
            shown(),
            segment_named(seg)
        ));
    }
    let decoded = |p: &str| percent_encoding::percent_decode_str(p).collect::<Vec<u8>>();
    if decoded(path) != decoded(url.path()) {
        return Err(format!(
            "`{}`: the path would be read as `{}`, not as given (a `\\`, a control \
             character or a space at either end is rewritten by URL parsing): \
             percent-encode it",
            shown(),
            url.path()
        ));
    }
    Ok(())
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
            ("s3://my.bucket-1/a/b.c", s3("my.bucket-1", "a/b.c")),
            // Taken literally, whatever the characters.
            ("s3://b/...", s3("b", "...")),
            ("s3://b/.a/..b/c.", s3("b", ".a/..b/c.")),
            ("s3://b/%2e%2e/a%2Fb", s3("b", "%2e%2e/a%2Fb")),
            ("s3://b/a\\..\\b", s3("b", "a\\..\\b")),
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
        let u = |s: &str| Location::Http(url::Url::parse(s).unwrap());
        let ok: &[(&str, Location)] = &[
            ("https://h/k.packet?X=1", u("https://h/k.packet?X=1")),
            ("http://h:9/a/.b/c..", u("http://h:9/a/.b/c..")),
            // Encoded as it must be; still the same path.
            ("http://h/a b/ü", u("http://h/a%20b/%C3%BC")),
            ("http://h/a%2Fb", u("http://h/a%2Fb")),
        ];
        for (arg, want) in ok {
            assert_eq!(Location::parse(OsStr::new(arg)).as_ref(), Ok(want), "{arg}");
        }
    }

    /// `.`, `..` and empty segments are refused, never resolved: in a key
    /// `Url::join` would take them out of the bucket (finding 9 of issue
    /// 32: `s3://bkt2/x/../../bkt/k` wrote into `bkt`), in an URL the
    /// parser would drop them; nor is an URL's path rewritten otherwise.
    #[test]
    fn keys_and_url_paths_are_taken_literally() {
        for bad in [
            "s3://bkt2/x/../../bkt/dotdot.packet",
            "s3://b/./k",
            "s3://b/k/.",
            "s3://b/..",
            "s3://b//k",
            "s3://b/a//k",
            "s3://b/k/",
            "s3://b//evil.example/k",
            "http://h/x/../k",
            "http://h/./k",
            "http://h/a//k",
            "http://h/k/",
            "http://h/",
            "http://h",
            "https://h/x/%2e%2E/k",
            "https://h/x/.%2e/k?X-Amz-Signature=s",
            "https://h/%2e/k",
            "http://h/x\\..\\k",
            "http://h/a\\b",
            "http://h/a\tb",
            "http://h/a\nb",
            "http://h/k ",
        ] {
            let e = Location::parse(OsStr::new(bad)).unwrap_err();
            assert!(
                e.contains("literally") || e.contains("not as given"),
                "{bad}: {e}"
            );
            assert!(!e.contains("Signature"), "{e}");
        }
    }

    /// What the S3 requests are addressed to: rusty-s3 percent-encodes a
    /// key (`%` and `/`-less reserved characters included) and joins it
    /// onto the bucket's URL; for every key the parser takes, the path
    /// sent decodes to the bucket and exactly the key.
    #[test]
    fn s3_requests_address_the_key_given() {
        let keys = [
            "k.packet",
            "a%2Fb",
            "%2e%2e/k",
            "a b+c=d&e;f,g",
            "ü/日本/k",
            "a?b#c",
            "a\\b",
            ".a/..b/...",
            "a:b/@c",
            "~x/(y)!*'",
        ];
        let endpoint: url::Url = "http://s3.test:9000/".parse().unwrap();
        for style in [rusty_s3::UrlStyle::Path, rusty_s3::UrlStyle::VirtualHost] {
            let bucket =
                rusty_s3::Bucket::new(endpoint.clone(), style, "bkt", "us-east-1").unwrap();
            let prefix = match style {
                rusty_s3::UrlStyle::Path => "/bkt/",
                rusty_s3::UrlStyle::VirtualHost => "/",
            };
            for key in keys {
                let arg = format!("s3://bkt/{key}");
                let Ok(Location::S3 { key: parsed, .. }) = Location::parse(OsStr::new(&arg)) else {
                    panic!("{arg}");
                };
                assert_eq!(parsed, key);
                let url = bucket.object_url(&parsed).unwrap();
                let path = url.path();
                let sent = path
                    .strip_prefix(prefix)
                    .unwrap_or_else(|| panic!("{path}"));
                let decoded = percent_encoding::percent_decode_str(sent)
                    .decode_utf8()
                    .unwrap();
                assert_eq!(decoded, key, "{url}");
                assert_eq!(
                    url.host_str(),
                    Some(match style {
                        rusty_s3::UrlStyle::Path => "s3.test",
                        rusty_s3::UrlStyle::VirtualHost => "bkt.s3.test",
                    })
                );
                assert!(url.query().is_none() && url.fragment().is_none(), "{url}");
            }
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
