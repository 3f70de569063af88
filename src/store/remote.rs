//! Ranged reads of a remote object over HTTP(S): S3 requests signed with
//! SigV4 (presigned by rusty-s3, sent by ureq), or plain GETs of an URL.
//!
//! Every request asks for one byte range. Transient failures (5xx, 429,
//! S3's `SlowDown` and `RequestTimeout`, timeouts, reset connections and
//! bodies cut short) are retried with exponential backoff and jitter,
//! within a bound on the total time of one read ([`Settings::read_timeout`]);
//! anything else fails at once with an error naming the location.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::aws::{CredentialSource, S3Config};
use super::deadline::Deadline;
use super::error::{Error, Result};
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

/// The credentials the configuration gives now (web identity exchanged
/// through STS), and where they came from (for logs: no secret).
fn credentials_now(
    agent: &ureq::Agent,
    shown: &str,
) -> Result<(S3Config, rusty_s3::Credentials, String)> {
    let c = S3Config::from_env().map_err(|reason| Error::Config {
        location: shown.to_owned(),
        reason,
    })?;
    let creds = match &c.credentials {
        CredentialSource::Static(creds) => creds.clone(),
        CredentialSource::WebIdentity(w) => super::sts::assume_role(w, agent, shown)?,
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

/// The requests of one location: its target, signed or not, the HTTP
/// agent, the settings and the retry loop with its time bound. Shared by
/// ranged reads ([`Remote`]) and uploads ([`super::upload::Upload`]).
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) shown: String,
    pub(crate) target: Target,
    pub(crate) agent: ureq::Agent,
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

/// Why a request was not answered.
enum Sent {
    /// It could not be built (a header value that cannot be sent).
    Build(ureq::http::Error),
    /// It failed on the way.
    Transport(ureq::Error),
}

/// A successful ranged response.
struct Fetched {
    bytes: Vec<u8>,
    total: u64,
    etag: Option<String>,
}

impl Client {
    /// The client of `location` (which must be remote): the S3
    /// configuration read and credentials found (web identity exchanged
    /// through STS), no request sent to the location yet.
    pub(crate) fn new(location: &Location, settings: &Settings) -> Result<Client> {
        let shown = location.shown();
        let config_error = |reason: String| Error::Config {
            location: shown.clone(),
            reason,
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(settings.request_timeout.min(Duration::from_secs(10))))
            .build()
            .into();
        let target = match location {
            Location::Local(_) => {
                return Err(config_error("a local path is not a remote object".into()));
            }
            Location::S3 { bucket, key } => {
                let (c, credentials, source) = credentials_now(&agent, &shown)?;
                let style = if c.path_style || bucket.contains('.') {
                    rusty_s3::UrlStyle::Path
                } else {
                    rusty_s3::UrlStyle::VirtualHost
                };
                let b = rusty_s3::Bucket::new(
                    c.endpoint.clone(),
                    style,
                    bucket.clone(),
                    c.region.clone(),
                )
                .map_err(|e| {
                    config_error(format!(
                        "cannot address bucket `{bucket}` at {}: {e}",
                        c.endpoint
                    ))
                })?;
                tracing::debug!(location = %shown, endpoint = %c.endpoint, region = %c.region, path_style = c.path_style, credentials = %source, "s3 configuration");
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
            agent,
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

    /// Sends one request: `method` to `url` with `headers` (those the
    /// signature covers among them) and `body`, within `timeout`. A
    /// transport failure comes back classified.
    pub(crate) fn send(
        &self,
        method: &str,
        url: &url::Url,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, Failure> {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(url.as_str());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let sent = match body {
            Some(b) => self.run(req.body(b), timeout),
            None => self.run(req.body(()), timeout),
        };
        sent.map_err(|e| match e {
            Sent::Build(e) => Failure::Fatal(Error::BadResponse {
                location: self.shown.clone(),
                what: format!("cannot build the {method} request: {e}"),
            }),
            Sent::Transport(e) => self.transport(e),
        })
    }

    /// [`Client::send`] for one kind of body.
    fn run<B: ureq::AsSendBody>(
        &self,
        req: std::result::Result<ureq::http::Request<B>, ureq::http::Error>,
        timeout: Duration,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, Sent> {
        let req = self
            .agent
            .configure_request(req.map_err(Sent::Build)?)
            .timeout_global(Some(timeout.max(Duration::from_millis(1))))
            .build();
        self.agent.run(req).map_err(Sent::Transport)
    }

    /// What a response of an unexpected `status` means, the same for
    /// every request: 404 and 401/403 are final, 5xx, 429 and S3's
    /// `RequestTimeout` worth another attempt, anything else a bad response.
    pub(crate) fn status_failure(
        &self,
        status: u16,
        resp: &mut ureq::http::Response<ureq::Body>,
    ) -> Failure {
        let code = error_code(resp);
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
            429 | 500..=599 => Failure::Retry(format!(
                "HTTP {status}{}",
                code.map_or(String::new(), |c| format!(" {c}"))
            )),
            _ if code.as_deref() == Some("RequestTimeout") => {
                Failure::Retry(format!("HTTP {status} RequestTimeout"))
            }
            _ => Failure::Fatal(Error::BadResponse {
                location: self.shown.clone(),
                what: format!(
                    "unexpected HTTP {status}{}",
                    code.map_or(String::new(), |c| format!(" ({c})"))
                ),
            }),
        }
    }

    /// Classifies a transport error: what a retry may cure, or not.
    fn transport(&self, e: ureq::Error) -> Failure {
        match e {
            ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::Protocol(_)
            | ureq::Error::BodyStalled => Failure::Retry(e.to_string()),
            ureq::Error::HostNotFound => Failure::Fatal(Error::Config {
                location: self.shown.clone(),
                reason: "cannot resolve the endpoint's host name".into(),
            }),
            other => Failure::Fatal(Error::BadResponse {
                location: self.shown.clone(),
                what: format!("the request failed: {other}"),
            }),
        }
    }

    /// Replaces the credentials, which the store said have expired
    /// (`code`), with those their source gives now: the environment and
    /// the profile files read again (a sidecar may have rewritten them),
    /// a web identity token (which the pod rotates) exchanged again.
    fn renew(&self, code: &str, _deadline: Deadline) -> Result<()> {
        let Target::S3 { credentials, .. } = &self.target else {
            return Ok(());
        };
        let (_, fresh, source) = credentials_now(&self.agent, &self.shown)?;
        *credentials.0.write() = fresh;
        tracing::info!(location = %self.shown, code, credentials = %source, "credentials expired; renewed from their source");
        Ok(())
    }

    /// Requests sent so far, attempts included.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Remote {
    /// Opens `location` (which must be remote) with one request for its
    /// first `first_bytes` bytes; see [`super::open_remote`].
    pub fn open(location: &Location, settings: &Settings, first_bytes: u64) -> Result<Remote> {
        let mut remote = Remote {
            client: Client::new(location, settings)?,
            len: 0,
            etag: None,
            head: Vec::new(),
        };
        let deadline = Deadline::for_operation(settings);
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
            |timeout| self.attempt(start, end, first, timeout),
        )
    }

    /// The URL of one request, signed now for S3.
    fn url(&self, if_match: Option<&str>) -> url::Url {
        match &self.client.target {
            Target::S3 {
                bucket,
                key,
                credentials,
            } => {
                use rusty_s3::S3Action;
                let credentials = credentials.get();
                let mut get = bucket.get_object(Some(&credentials), key);
                if let Some(tag) = if_match {
                    get.headers_mut().insert("if-match", tag.to_owned());
                }
                get.sign(PRESIGN_FOR)
            }
            Target::Http(u) => u.clone(),
        }
    }

    /// One request for bytes `start..end`.
    fn attempt(
        &self,
        start: u64,
        end: u64,
        first: bool,
        timeout: Duration,
    ) -> std::result::Result<Fetched, Failure> {
        let if_match = if first { None } else { self.etag.as_deref() };
        let url = self.url(if_match);
        let range = format!("bytes={start}-{}", end - 1);
        let mut headers = vec![("range", range.as_str())];
        if let Some(tag) = if_match {
            headers.push(("if-match", tag));
        }
        let mut resp = self.client.send("GET", &url, &headers, None, timeout)?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let etag = header("etag");
        let range = header("content-range");
        tracing::debug!(location = %self.client.shown, start, end, status, "ranged GET");
        let bad = |what: String| {
            Failure::Fatal(Error::BadResponse {
                location: self.client.shown.clone(),
                what,
            })
        };
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
                let bytes = self.read_body(&mut resp, e - s)?;
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
    fn read_body(
        &self,
        resp: &mut ureq::http::Response<ureq::Body>,
        n: u64,
    ) -> std::result::Result<Vec<u8>, Failure> {
        let len = usize::try_from(n).map_err(|_| {
            Failure::Fatal(Error::BadResponse {
                location: self.client.shown.clone(),
                what: format!("a range of {n} bytes does not fit in memory"),
            })
        })?;
        let mut bytes = vec![0u8; len];
        let mut reader = resp.body_mut().with_config().limit(n).reader();
        reader.read_exact(&mut bytes).map_err(|e| {
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
        let f = self.fetch(start, end, false, deadline)?;
        rest.copy_from_slice(&f.bytes);
        Ok(())
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

/// The `<Code>` of an S3 error body, if it has one (the message is left
/// out: some quote the request, and nothing of a request is shown).
pub(crate) fn error_code(resp: &mut ureq::http::Response<ureq::Body>) -> Option<String> {
    let mut body = Vec::new();
    resp.body_mut()
        .with_config()
        .limit(ERROR_BODY_MAX)
        .reader()
        .take(ERROR_BODY_MAX)
        .read_to_end(&mut body)
        .ok()?;
    let text = String::from_utf8_lossy(&body);
    let code = text.split_once("<Code>")?.1.split_once("</Code>")?.0;
    (!code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
    .then(|| code.to_owned())
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
