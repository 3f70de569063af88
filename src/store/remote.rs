//! Ranged reads of a remote object over HTTP(S): S3 requests signed with
//! SigV4 (presigned by rusty-s3, sent by ureq), or plain GETs of an URL.
//!
//! Every request asks for one byte range. Transient failures (5xx, 429,
//! S3's `SlowDown` and `RequestTimeout`, timeouts, reset connections and
//! bodies cut short) are retried with exponential backoff and jitter,
//! within a bound on the total time of one read ([`Settings::read_timeout`]);
//! anything else fails at once with an error naming the location.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::aws::{CredentialSource, S3Config};
use super::deadline::Deadline;
use super::error::{Error, Result};
use super::transport::{Method, Request, Response, Transport, TransportError, Ureq};
use super::{Location, ReadAt};

/// How remote reads behave.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The longest one read may take, retries included (default 60 s;
    /// `SESSIONFS_REMOTE_TIMEOUT`, in seconds).
    pub read_timeout: Duration,
    /// The longest one request may take (default 20 s, or the read's
    /// time left if less).
    pub request_timeout: Duration,
    /// Attempts per read, the first included (default 10).
    pub max_attempts: u32,
    /// The first wait between attempts; it doubles each time (default
    /// 100 ms).
    pub backoff: Duration,
    /// The longest wait between attempts (default 5 s).
    pub max_backoff: Duration,
}

/// The default of [`Settings::read_timeout`]: long enough to ride out a
/// short outage of an object store, short enough that a command (or, later,
/// a read on a mount) fails instead of hanging.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            read_timeout: DEFAULT_READ_TIMEOUT,
            request_timeout: Duration::from_secs(20),
            max_attempts: 10,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl Settings {
    /// The defaults, with `SESSIONFS_REMOTE_TIMEOUT` (seconds, decimals
    /// allowed) as the time bound of a read.
    pub fn from_env() -> std::result::Result<Settings, String> {
        let mut s = Settings::default();
        if let Ok(v) = std::env::var("SESSIONFS_REMOTE_TIMEOUT") {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                .ok_or_else(|| {
                    format!(
                        "SESSIONFS_REMOTE_TIMEOUT is `{v}`, not a number of seconds in (0, 86400]"
                    )
                })?;
            s.read_timeout = Duration::from_secs_f64(secs);
        }
        Ok(s)
    }
}

/// How long a presigned request stays valid: it is signed just before it
/// is sent, so this only has to outlast one request.
pub(crate) const PRESIGN_FOR: Duration = Duration::from_secs(15 * 60);

/// At most this much of an error response's body is read, to find its S3
/// error code.
const ERROR_BODY_MAX: u64 = 16 * 1024;

/// What is asked of the server.
#[derive(Clone)]
pub(crate) enum Target {
    S3 {
        bucket: rusty_s3::Bucket,
        key: String,
        credentials: Creds,
    },
    Http(url::Url),
}

/// The credentials requests are signed with, shared by the clones of a
/// client and replaced when they expire ([`Client::renew`]): each request
/// is signed with those of the moment.
#[derive(Clone)]
pub(crate) struct Creds(Arc<parking_lot::RwLock<rusty_s3::Credentials>>);

impl Creds {
    /// The credentials now.
    pub(crate) fn get(&self) -> rusty_s3::Credentials {
        self.0.read().clone()
    }
}

/// S3 error codes that mean the request's temporary credentials expired
/// (or were revoked by a newer token): worth new credentials from their
/// source and one more attempt.
const EXPIRED: &[&str] = &[
    "ExpiredToken",
    "ExpiredTokenException",
    "TokenRefreshRequired",
    "InvalidToken",
];

/// S3 error codes of HTTP 400 that a new attempt may cure: the request
/// arrived damaged or cut short (its body no longer matched the checksum
/// or the `Content-Length` it was sent with), or came too slowly.
const RETRY_400: &[&str] = &["BadDigest", "IncompleteBody", "RequestTimeout"];

/// The credentials the configuration gives now (web identity exchanged
/// through STS, within `deadline`), and where they came from (for logs: no
/// secret).
fn credentials_now(
    transport: &dyn Transport,
    shown: &str,
    deadline: Deadline,
) -> Result<(S3Config, rusty_s3::Credentials, String)> {
    let c = S3Config::from_env().map_err(|reason| Error::Config {
        location: shown.to_owned(),
        reason,
    })?;
    let creds = match &c.credentials {
        CredentialSource::Static(creds) => creds.clone(),
        CredentialSource::WebIdentity(w) => super::sts::assume_role(w, transport, shown, deadline)?,
    };
    let credentials = match &creds.session_token {
        Some(t) => rusty_s3::Credentials::new_with_token(
            creds.access_key_id.clone(),
            creds.secret_access_key.0.clone(),
            t.0.clone(),
        ),
        None => rusty_s3::Credentials::new(
            creds.access_key_id.clone(),
            creds.secret_access_key.0.clone(),
        ),
    };
    let source = creds.source.to_string();
    Ok((c, credentials, source))
}

/// The requests of one location: its target, signed or not, the
/// transport, the settings and the retry loop with its time bound. Shared
/// by ranged reads ([`Remote`]) and uploads ([`super::upload::Upload`]).
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) shown: String,
    pub(crate) target: Target,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) settings: Settings,
    /// Requests sent (attempts included), for logs and tests.
    requests: Arc<AtomicU64>,
}

/// A remote object opened for ranged reads, pinned to the length and ETag
/// of its first response.
pub struct Remote {
    client: Client,
    len: u64,
    etag: Option<String>,
    /// The first bytes of the object, from the request that opened it.
    head: Vec<u8>,
}

/// What one attempt ended with, short of success.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth another attempt: why this one failed.
    Retry(String),
    /// The credentials expired: worth renewing them, once.
    Expired {
        /// The HTTP status.
        status: u16,
        /// The S3 error code.
        code: String,
    },
    /// Final.
    Fatal(Error),
}

/// A successful ranged response.
struct Fetched {
    bytes: Vec<u8>,
    total: u64,
    etag: Option<String>,
}

/// Signs a request for `key` of `bucket` with `creds` (SigV4, presigned in
/// the query): `query` holds the subresources and parameters (an empty
/// value is sent bare, `?uploads`, as the AWS SDKs send it), and every one
/// of `headers` is signed, so an `x-amz-*` header never goes out unsigned.
pub(crate) fn presign(
    bucket: &rusty_s3::Bucket,
    key: &str,
    creds: &rusty_s3::Credentials,
    method: Method,
    query: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> std::result::Result<url::Url, String> {
    let url = bucket
        .object_url(key)
        .map_err(|e| format!("cannot make the object's URL: {e}"))?;
    // The signer merges these with its own, in order: both must be sorted.
    let mut query: Vec<(&str, &str)> = query.to_vec();
    query.sort_unstable();
    let lowered: Vec<(String, &str)> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim()))
        .collect();
    let mut headers: Vec<(&str, &str)> = lowered.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    headers.sort_unstable();
    let mut url = rusty_s3::signing::sign(
        &jiff::Timestamp::now(),
        method.for_signing(),
        url,
        creds.key(),
        creds.secret(),
        creds.token(),
        bucket.region(),
        PRESIGN_FOR.as_secs(),
        query.iter().copied(),
        headers.iter().copied(),
    );
    // `uploads=` and `uploads` sign alike (SigV4 gives a bare parameter an
    // empty value); the bare form is what S3 documents and SDKs send.
    let bare: Vec<&str> = query
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| *k)
        .collect();
    if !bare.is_empty()
        && let Some(q) = url.query()
    {
        let q = q
            .split('&')
            .map(|p| match p.strip_suffix('=') {
                Some(k) if bare.contains(&k) => k,
                _ => p,
            })
            .collect::<Vec<_>>()
            .join("&");
        url.set_query(Some(&q));
    }
    Ok(url)
}

impl Client {
    /// The client of `location` (which must be remote), over HTTP: the S3
    /// configuration read and credentials found (web identity exchanged
    /// through STS), no request sent to the location yet.
    pub(crate) fn new(location: &Location, settings: &Settings) -> Result<Client> {
        Client::with_transport(location, settings, Arc::new(Ureq::new()))
    }

    /// [`Client::new`] over `transport`.
    pub(crate) fn with_transport(
        location: &Location,
        settings: &Settings,
        transport: Arc<dyn Transport>,
    ) -> Result<Client> {
        let shown = location.shown();
        let config_error = |reason: String| Error::Config {
            location: shown.clone(),
            reason,
        };
        let target = match location {
            Location::Local(_) => {
                return Err(config_error("a local path is not a remote object".into()));
            }
            Location::S3 { bucket, key } => {
                let (c, credentials, source) =
                    credentials_now(&*transport, &shown, Deadline::for_operation(settings))?;
                let style = if c.path_style || bucket.contains('.') {
                    rusty_s3::UrlStyle::Path
                } else {
                    rusty_s3::UrlStyle::VirtualHost
                };
                let endpoint = super::shown_url(&c.endpoint);
                let b = rusty_s3::Bucket::new(
                    c.endpoint.clone(),
                    style,
                    bucket.clone(),
                    c.region.clone(),
                )
                .map_err(|e| {
                    config_error(format!(
                        "cannot address bucket `{bucket}` at {endpoint}: {e}"
                    ))
                })?;
                tracing::debug!(location = %shown, %endpoint, region = %c.region, path_style = c.path_style, credentials = %source, "s3 configuration");
                Target::S3 {
                    bucket: b,
                    key: key.clone(),
                    credentials: Creds(Arc::new(parking_lot::RwLock::new(credentials))),
                }
            }
            Location::Http(u) => Target::Http(u.clone()),
        };
        Ok(Client {
            shown,
            target,
            transport,
            settings: settings.clone(),
            requests: Arc::default(),
        })
    }

    /// Runs `attempt` (given the time it may take) until it succeeds,
    /// fails for good, or the attempts or the operation's `deadline` run
    /// out; then fails as [`Error::Unavailable`], saying that it could
    /// not `what()` ("read bytes 0..512", "upload part 3"). Each attempt
    /// may take what is left of the deadline, at most
    /// [`Settings::request_timeout`]; a credential renewal comes out of
    /// the same deadline.
    pub(crate) fn retrying<T>(
        &self,
        deadline: Deadline,
        what: impl Fn() -> String,
        mut attempt: impl FnMut(Duration) -> std::result::Result<T, Failure>,
    ) -> Result<T> {
        let mut wait = self.settings.backoff;
        let mut attempts = 0;
        let mut renewed = false;
        let mut last = String::new();
        loop {
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(self.gave_up(&what, attempts, deadline, last));
            }
            attempts += 1;
            self.requests.fetch_add(1, Ordering::Relaxed);
            last = match attempt(left.min(self.settings.request_timeout)) {
                Ok(f) => return Ok(f),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(why)) => why,
                // Once per request: new credentials from their source, and
                // at once another attempt.
                Err(Failure::Expired { code, .. }) if !renewed => {
                    renewed = true;
                    self.renew(&code, deadline)?;
                    continue;
                }
                Err(Failure::Expired { status, code }) => {
                    return Err(Error::Denied {
                        location: self.shown.clone(),
                        status,
                        code,
                    });
                }
            };
            let pause = jitter(wait);
            if attempts >= self.settings.max_attempts || pause >= deadline.remaining() {
                return Err(self.gave_up(&what, attempts, deadline, last));
            }
            tracing::debug!(location = %self.shown, what = %what(), attempts, why = %last, ?pause, "retrying");
            std::thread::sleep(pause);
            wait = (wait * 2).min(self.settings.max_backoff);
        }
    }

    /// The error of an operation that ran out of attempts or time.
    fn gave_up(
        &self,
        what: &dyn Fn() -> String,
        attempts: u32,
        deadline: Deadline,
        last: String,
    ) -> Error {
        let last = if last.is_empty() {
            format!(
                "the operation's time bound of {:.1?} ran out before a request could be made",
                deadline.bound()
            )
        } else {
            last
        };
        Error::Unavailable {
            location: self.shown.clone(),
            what: what(),
            attempts,
            elapsed: deadline.elapsed(),
            last,
        }
    }

    /// Sends one request for the object: `method` with `query`
    /// (subresources, parameters: S3 only), `headers` (every one of them
    /// signed) and `body`, within `timeout`; signed now with the
    /// credentials of the moment. A transport failure comes back
    /// classified.
    pub(crate) fn send(
        &self,
        method: Method,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> std::result::Result<Response, Failure> {
        let url = match &self.target {
            Target::S3 {
                bucket,
                key,
                credentials,
            } => presign(bucket, key, &credentials.get(), method, query, headers)
                .map_err(|what| self.bad(what))?,
            Target::Http(u) => u.clone(),
        };
        let req = Request {
            method,
            url: &url,
            headers,
            body,
        };
        self.transport
            .send(&req, timeout)
            .map_err(|e| self.transport_failure(e, timeout))
    }

    /// A final bad-response failure.
    pub(crate) fn bad(&self, what: String) -> Failure {
        Failure::Fatal(Error::BadResponse {
            location: self.shown.clone(),
            what,
        })
    }

    /// What a response of an unexpected `status` means, the same for
    /// every request: 404 and 401/403 are final, 5xx, 429 and a request
    /// that arrived damaged (`BadDigest`) or cut short worth another
    /// attempt, anything else a bad response.
    pub(crate) fn status_failure(&self, status: u16, resp: &mut Response) -> Failure {
        let code = resp
            .read_limited(ERROR_BODY_MAX)
            .ok()
            .and_then(|b| super::xml::error_code(&b));
        match status {
            400 | 401 | 403 if code.as_deref().is_some_and(|c| EXPIRED.contains(&c)) => {
                Failure::Expired {
                    status,
                    code: code.unwrap_or_default(),
                }
            }
            404 => Failure::Fatal(Error::NotFound {
                location: self.shown.clone(),
                code: code.unwrap_or_else(|| "NotFound".into()),
            }),
            401 | 403 => Failure::Fatal(Error::Denied {
                location: self.shown.clone(),
                status,
                code: code.unwrap_or_else(|| "AccessDenied".into()),
            }),
            // 501: the store does not do what was asked (S3 answers it to
            // a chunked upload, `Transfer-Encoding`): no attempt cures it.
            429 | 500 | 502..=599 => Failure::Retry(format!(
                "HTTP {status}{}",
                code.map_or(String::new(), |c| format!(" {c}"))
            )),
            400 if code.as_deref().is_some_and(|c| RETRY_400.contains(&c)) => {
                Failure::Retry(format!("HTTP 400 {}", code.unwrap_or_default()))
            }
            _ => self.bad(format!(
                "unexpected HTTP {status}{}",
                code.map_or(String::new(), |c| format!(" ({c})"))
            )),
        }
    }

    /// Classifies a transport error: what a retry may cure, or not.
    fn transport_failure(&self, e: TransportError, timeout: Duration) -> Failure {
        match e {
            TransportError::Timeout(what) => Failure::Retry(format!(
                "no complete answer within {timeout:.1?} (timeout: {what})"
            )),
            TransportError::Connection(_) | TransportError::Protocol(_) => {
                Failure::Retry(e.to_string())
            }
            TransportError::HostNotFound => Failure::Fatal(Error::Config {
                location: self.shown.clone(),
                reason: "cannot resolve the endpoint's host name".into(),
            }),
            TransportError::Request(what) => self.bad(format!("the request failed: {what}")),
        }
    }

    /// Replaces the credentials, which the store said have expired
    /// (`code`), with those their source gives now: the environment and
    /// the profile files read again (a sidecar may have rewritten them),
    /// a web identity token (which the pod rotates) exchanged again, within
    /// the operation's `deadline`.
    fn renew(&self, code: &str, deadline: Deadline) -> Result<()> {
        let Target::S3 { credentials, .. } = &self.target else {
            return Ok(());
        };
        let (_, fresh, source) = credentials_now(&*self.transport, &self.shown, deadline)?;
        *credentials.0.write() = fresh;
        tracing::info!(location = %self.shown, code, credentials = %source, "credentials expired; renewed from their source");
        Ok(())
    }

    /// Requests sent so far, attempts included.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// A client of `s3://bkt/dir/k.packet` at a made-up endpoint, signed
    /// with made-up keys, over `transport`, with short waits: for table
    /// tests, which read no environment.
    #[cfg(test)]
    pub(crate) fn for_tests(transport: Arc<dyn Transport>, settings: Settings) -> Client {
        let bucket = rusty_s3::Bucket::new(
            "http://127.0.0.1:9".parse().unwrap(),
            rusty_s3::UrlStyle::Path,
            "bkt".to_owned(),
            "us-east-1".to_owned(),
        )
        .unwrap();
        Client {
            shown: "s3://bkt/dir/k.packet".into(),
            target: Target::S3 {
                bucket,
                key: "dir/k.packet".into(),
                credentials: Creds(Arc::new(parking_lot::RwLock::new(
                    rusty_s3::Credentials::new("AKIDTEST", "secret"),
                ))),
            },
            transport,
            settings,
            requests: Arc::default(),
        }
    }
}

impl Remote {
    /// Opens `location` (which must be remote) with one request for its
    /// first `first_bytes` bytes; see [`super::open_remote`].
    pub fn open(location: &Location, settings: &Settings, first_bytes: u64) -> Result<Remote> {
        Remote::open_with(Client::new(location, settings)?, first_bytes)
    }

    /// [`Remote::open`] through `client`.
    fn open_with(client: Client, first_bytes: u64) -> Result<Remote> {
        let deadline = Deadline::for_operation(&client.settings);
        let mut remote = Remote {
            client,
            len: 0,
            etag: None,
            head: Vec::new(),
        };
        let first = remote.fetch(0, first_bytes.max(1), true, deadline)?;
        remote.len = first.total;
        // A weak ETag (`W/"…"`) never satisfies If-Match, which compares
        // strongly: such an object is pinned by its length only.
        remote.etag = first.etag.filter(|t| !t.starts_with("W/"));
        remote.head = first.bytes;
        tracing::debug!(location = %remote.client.shown, len = remote.len, etag = ?remote.etag, "remote object opened");
        Ok(remote)
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.client.requests()
    }

    /// Bytes `start..end` (clamped to the object on the first request),
    /// retried within `deadline`.
    fn fetch(&self, start: u64, end: u64, first: bool, deadline: Deadline) -> Result<Fetched> {
        self.client.retrying(
            deadline,
            || format!("read bytes {start}..{end}"),
            |timeout| self.attempt(start, end, first, timeout, None),
        )
    }

    /// Bytes `start..start + buf.len()` read straight into `buf` (no
    /// buffer of their own: a fetch holds its bytes once).
    fn fetch_into(&self, start: u64, buf: &mut [u8], deadline: Deadline) -> Result<()> {
        let end = start + buf.len() as u64;
        self.client.retrying(
            deadline,
            || format!("read bytes {start}..{end}"),
            |timeout| {
                self.attempt(start, end, false, timeout, Some(&mut *buf))
                    .map(|_| ())
            },
        )
    }

    /// One request for bytes `start..end`, its body read into `into` when
    /// given (then `Fetched::bytes` is empty).
    fn attempt(
        &self,
        start: u64,
        end: u64,
        first: bool,
        timeout: Duration,
        into: Option<&mut [u8]>,
    ) -> std::result::Result<Fetched, Failure> {
        let if_match = if first { None } else { self.etag.as_deref() };
        let range = format!("bytes={start}-{}", end - 1);
        let mut headers = vec![("range", range.as_str())];
        if let Some(tag) = if_match {
            headers.push(("if-match", tag));
        }
        let mut resp = self.client.send(Method::Get, &[], &headers, &[], timeout)?;
        let status = resp.status;
        let etag = resp.header("etag").map(str::to_owned);
        let range = resp.header("content-range").map(str::to_owned);
        tracing::debug!(location = %self.client.shown, start, end, status, "ranged GET");
        let bad = |what: String| self.client.bad(what);
        match status {
            206 => {
                let (s, e, total) =
                    range
                        .as_deref()
                        .and_then(parse_content_range)
                        .ok_or_else(|| {
                            bad(format!(
                                "a partial response with a Content-Range of {range:?}"
                            ))
                        })?;
                let want_end = if first { end.min(total) } else { end };
                if !first && total != self.len {
                    return Err(
                        self.changed(format!("its length is now {total}, it was {}", self.len))
                    );
                }
                if s != start || e != want_end {
                    return Err(bad(format!(
                        "asked for bytes {start}..{want_end}, the server sent {s}..{e}"
                    )));
                }
                let bytes = match into {
                    Some(buf) => {
                        resp.read_exact_into(buf).map_err(|e| {
                            Failure::Retry(format!(
                                "the body ended or failed after fewer than {} bytes: {e}",
                                buf.len()
                            ))
                        })?;
                        Vec::new()
                    }
                    None => self.read_body(&mut resp, e - s)?,
                };
                Ok(Fetched { bytes, total, etag })
            }
            // No byte 0 to serve: the object is empty (a Content-Range,
            // when there is one, must agree).
            416 if first => match range.as_deref().map(|r| r.trim().strip_prefix("bytes */")) {
                None | Some(Some("0")) => Ok(Fetched {
                    bytes: Vec::new(),
                    total: 0,
                    etag,
                }),
                Some(_) => Err(bad(format!(
                    "the server refused the range bytes 0.. (HTTP 416, Content-Range {range:?})"
                ))),
            },
            200 => Err(bad(
                "the server ignored the Range header (HTTP 200): it must answer range requests"
                    .into(),
            )),
            412 => Err(self.changed(format!(
                "it no longer has the ETag {}",
                self.etag.as_deref().unwrap_or("first seen")
            ))),
            _ => Err(self.client.status_failure(status, &mut resp)),
        }
    }

    /// Reads exactly `n` bytes of body; a body cut short is transient.
    fn read_body(&self, resp: &mut Response, n: u64) -> std::result::Result<Vec<u8>, Failure> {
        let len = usize::try_from(n).map_err(|_| {
            self.client
                .bad(format!("a range of {n} bytes does not fit in memory"))
        })?;
        let mut bytes = vec![0u8; len];
        resp.read_exact_into(&mut bytes).map_err(|e| {
            Failure::Retry(format!(
                "the body ended or failed after fewer than {n} bytes: {e}"
            ))
        })?;
        Ok(bytes)
    }

    fn changed(&self, what: String) -> Failure {
        Failure::Fatal(Error::Changed {
            location: self.client.shown.clone(),
            what,
        })
    }
}

impl ReadAt for Remote {
    fn len(&self) -> u64 {
        self.len
    }

    fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    fn deadline(&self) -> Deadline {
        Deadline::for_operation(&self.client.settings)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64, deadline: Deadline) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| Error::BadResponse {
                location: self.client.shown.clone(),
                what: format!(
                    "bytes {offset}..+{} lie beyond the object's {} bytes",
                    buf.len(),
                    self.len
                ),
            })?;
        if buf.is_empty() {
            return Ok(());
        }
        // What the opening request brought is served from memory; only
        // the rest is asked for.
        let held = self.head.len() as u64;
        let from_head = held.saturating_sub(offset).min(buf.len() as u64) as usize;
        if from_head > 0 {
            let at = offset as usize;
            buf[..from_head].copy_from_slice(&self.head[at..at + from_head]);
        }
        let (start, rest) = (offset + from_head as u64, &mut buf[from_head..]);
        if rest.is_empty() {
            return Ok(());
        }
        debug_assert_eq!(start + rest.len() as u64, end);
        self.fetch_into(start, rest, deadline)
    }

    fn shown(&self) -> &str {
        &self.client.shown
    }
}

/// `bytes START-LAST/TOTAL` as `(START, LAST + 1, TOTAL)`.
fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (s, l) = span.split_once('-')?;
    let (s, l, total): (u64, u64, u64) = (s.parse().ok()?, l.parse().ok()?, total.parse().ok()?);
    (s <= l && l < total).then_some((s, l + 1, total))
}

/// `wait` scaled by a random factor in [0.5, 1): retries of many readers
/// spread out instead of arriving together.
fn jitter(wait: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let frac = 0.5 + (r % 1000) as f64 / 2000.0;
    wait.mul_f64(frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_strictly() {
        type Span = Option<(u64, u64, u64)>;
        let cases: &[(&str, Span)] = &[
            ("bytes 0-511/4096", Some((0, 512, 4096))),
            ("bytes 4095-4095/4096", Some((4095, 4096, 4096))),
            ("bytes 0-4096/4096", None),
            ("bytes 5-4/10", None),
            ("bytes 0-9/*", None),
            ("bytes */10", None),
            ("items 0-1/2", None),
            ("bytes -1-2/3", None),
        ];
        for (v, want) in cases {
            assert_eq!(parse_content_range(v), *want, "{v}");
        }
    }

    use crate::store::transport::mock::{Answer, Scripted};
    use std::time::Instant;

    /// Settings with short waits, so the tables run fast.
    fn quick() -> Settings {
        Settings {
            read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            max_attempts: 6,
            backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        }
    }

    fn client(answers: Vec<Answer>, settings: Settings) -> (Client, Arc<Scripted>) {
        let t = Arc::new(Scripted::new(answers));
        (Client::for_tests(t.clone(), settings), t)
    }

    /// A `206` of `body` as bytes `start..` of an object of `total`.
    fn partial(body: &[u8], start: u64, total: u64, etag: &str) -> Answer {
        let end = start + body.len() as u64 - 1;
        Answer::Reply(
            206,
            vec![
                ("content-range", format!("bytes {start}-{end}/{total}")),
                ("etag", etag.into()),
            ],
            body.to_vec(),
        )
    }

    /// What each status (and S3 error code) means to the retry loop, in
    /// one table: final (and as which error kind), worth another attempt,
    /// or expired credentials.
    #[test]
    fn statuses_map_to_retry_renew_or_a_final_kind() {
        use crate::kind::ErrorKind as K;
        enum Want {
            Retry,
            Expired,
            Fatal(K),
        }
        let cases: &[(u16, &str, Want)] = &[
            (500, "InternalError", Want::Retry),
            (503, "SlowDown", Want::Retry),
            (429, "TooManyRequests", Want::Retry),
            (400, "RequestTimeout", Want::Retry),
            (400, "BadDigest", Want::Retry),
            (400, "IncompleteBody", Want::Retry),
            (400, "ExpiredToken", Want::Expired),
            (403, "InvalidToken", Want::Expired),
            (404, "NoSuchKey", Want::Fatal(K::RemoteNotFound)),
            (403, "AccessDenied", Want::Fatal(K::RemoteDenied)),
            (403, "SignatureDoesNotMatch", Want::Fatal(K::RemoteDenied)),
            (400, "InvalidRequest", Want::Fatal(K::RemoteBadResponse)),
            (501, "NotImplemented", Want::Fatal(K::RemoteBadResponse)),
            (
                411,
                "MissingContentLength",
                Want::Fatal(K::RemoteBadResponse),
            ),
            (400, "InvalidDigest", Want::Fatal(K::RemoteBadResponse)),
        ];
        for (status, code, want) in cases {
            let (c, _) = client(vec![Answer::Error(*status, code)], quick());
            let mut resp = c
                .send(Method::Get, &[], &[], &[], Duration::from_secs(1))
                .unwrap();
            let got = c.status_failure(resp.status, &mut resp);
            let ok = match (&got, want) {
                (Failure::Retry(why), Want::Retry) => why.contains(code),
                (Failure::Expired { code: c, .. }, Want::Expired) => c == code,
                (Failure::Fatal(e), Want::Fatal(k)) => e.kind() == *k,
                _ => false,
            };
            assert!(ok, "HTTP {status} {code}: {got:?}");
        }
    }

    /// Transient failures are retried, each kind once here, and the read
    /// then succeeds; the requests are counted.
    #[test]
    fn reads_retry_through_errors_resets_and_short_bodies() {
        let answers = vec![
            partial(b"0123", 0, 10, "\"e\""),
            Answer::Error(503, "SlowDown"),
            Answer::Reset,
            Answer::Cut(
                206,
                vec![("content-range", "bytes 4-7/10".into())],
                b"4567".to_vec(),
                2,
            ),
            Answer::Hang(Duration::from_millis(10)),
            partial(b"4567", 4, 10, "\"e\""),
        ];
        let (c, t) = client(answers, quick());
        let r = Remote::open_with(c, 4).unwrap();
        assert_eq!((r.len(), r.etag()), (10, Some("\"e\"")));
        let mut buf = [0u8; 4];
        r.read_exact_at(&mut buf, 4, r.deadline()).unwrap();
        assert_eq!(&buf, b"4567");
        assert_eq!(r.requests(), 6);
        // Every read after the first is pinned to the first ETag.
        let sent = t.sent();
        assert_eq!(sent[0].header("if-match"), None);
        assert!(
            sent[1..]
                .iter()
                .all(|s| s.header("if-match") == Some("\"e\""))
        );
        assert!(
            sent.iter()
                .all(|s| s.method == Method::Get && s.body.is_empty())
        );
    }

    /// A read of a store that never answers takes the operation's bound,
    /// not attempts x bound: every request gets only what is left.
    #[test]
    fn a_hung_store_fails_within_the_operation_deadline() {
        let mut s = quick();
        s.request_timeout = Duration::from_millis(400);
        s.max_attempts = 100;
        let (c, t) = client(
            (0..100)
                .map(|_| Answer::Hang(Duration::from_secs(60)))
                .collect(),
            s,
        );
        let t0 = Instant::now();
        let deadline = Deadline::after(Duration::from_millis(1000));
        let e = c
            .retrying(
                deadline,
                || "read".into(),
                |timeout| c.send(Method::Get, &[], &[], &[], timeout).map(|_| ()),
            )
            .unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.kind(), crate::kind::ErrorKind::RemoteUnavailable, "{e}");
        assert!(took < Duration::from_millis(1500), "{took:?}");
        let asked: Duration = t.sent().iter().map(|s| s.timeout).sum();
        assert!(asked <= Duration::from_millis(1000), "{asked:?}");
        assert!(
            t.sent()
                .iter()
                .all(|s| s.timeout <= Duration::from_millis(400))
        );
        // An expired deadline sends nothing.
        let before = t.sent().len();
        let e = c
            .retrying(
                Deadline::after(Duration::ZERO),
                || "read".into(),
                |timeout| c.send(Method::Get, &[], &[], &[], timeout).map(|_| ()),
            )
            .unwrap_err();
        assert!(e.to_string().contains("ran out before a request"), "{e}");
        assert_eq!(t.sent().len(), before);
    }

    /// A presigned request signs every header it sends and sends a bare
    /// subresource bare (`?uploads`, as the AWS SDKs do).
    #[test]
    fn presigned_requests_sign_every_header_and_keep_subresources_bare() {
        let bucket = rusty_s3::Bucket::new(
            "http://127.0.0.1:9".parse().unwrap(),
            rusty_s3::UrlStyle::Path,
            "bkt".to_owned(),
            "us-east-1".to_owned(),
        )
        .unwrap();
        let creds = rusty_s3::Credentials::new_with_token("AKID", "secret", "tok");
        let url = presign(
            &bucket,
            "a b/k",
            &creds,
            Method::Post,
            &[("uploads", "")],
            &[
                ("X-Amz-Checksum-Algorithm", "SHA256"),
                ("if-none-match", "*"),
            ],
        )
        .unwrap();
        let q = url.query().unwrap();
        assert!(q.split('&').any(|p| p == "uploads"), "{q}");
        assert!(!q.contains("uploads="), "{q}");
        let signed = url
            .query_pairs()
            .find(|(k, _)| k == "X-Amz-SignedHeaders")
            .unwrap()
            .1
            .into_owned();
        assert_eq!(signed, "host;if-none-match;x-amz-checksum-algorithm");
        assert_eq!(url.path(), "/bkt/a%20b/k");
    }

    #[test]
    fn jitter_stays_within_half_and_whole() {
        for _ in 0..100 {
            let j = jitter(Duration::from_millis(1000));
            assert!(
                j >= Duration::from_millis(500) && j < Duration::from_millis(1000),
                "{j:?}"
            );
        }
    }
}
