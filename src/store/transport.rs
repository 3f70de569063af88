//! The store's HTTP transport: one request out, a status, headers and a
//! body reader back, within a time bound. Everything above it (signing,
//! retries, status mapping, checksums) is ours and is tested in-process
//! against `mock::Scripted` (test builds only); the real one is [`Ureq`].
//!
//! A request always goes out with a `Content-Length`: a `PUT` or `POST`
//! without a body sends `Content-Length: 0`, never `Transfer-Encoding:
//! chunked` (S3 refuses a chunked upload that is not `aws-chunked`, and
//! ureq 3 chunks a body-less `PUT` unless given an empty body).

use std::io::Read;
use std::time::Duration;

/// An HTTP method the store uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`.
    Head,
    /// `PUT`.
    Put,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
}

impl Method {
    /// As it goes on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }

    /// Whether a request of this method carries a body (and so a
    /// `Content-Length`, 0 when it is empty).
    pub fn has_body(self) -> bool {
        matches!(self, Method::Put | Method::Post)
    }

    /// The same method for rusty-s3's signer.
    pub(crate) fn for_signing(self) -> rusty_s3::Method {
        match self {
            Method::Get => rusty_s3::Method::Get,
            Method::Head => rusty_s3::Method::Head,
            Method::Put => rusty_s3::Method::Put,
            Method::Post => rusty_s3::Method::Post,
            Method::Delete => rusty_s3::Method::Delete,
        }
    }
}

/// One request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The method.
    pub method: Method,
    /// The URL (for S3, presigned: the signature is in its query).
    pub url: &'a url::Url,
    /// Headers, names in lower case.
    pub headers: &'a [(&'a str, &'a str)],
    /// The body (empty for none).
    pub body: &'a [u8],
}

/// An answer: its status and headers, and a body still to read.
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The headers, names in lower case.
    headers: Vec<(String, String)>,
    /// The body, read on demand (the time bound of the request goes on
    /// while it is read).
    body: Box<dyn Read + Send>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// It is longer than the reader accepts: a server's answer never
    /// makes us allocate more than we chose to.
    TooLong(u64),
    /// It ended early, or the connection failed while it was read.
    Io(std::io::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLong(max) => write!(f, "the body is longer than {max} bytes"),
            BodyError::Io(e) => write!(f, "the body ended or failed: {e}"),
        }
    }
}

impl Response {
    /// An answer made of its parts (header names are lowered here).
    pub fn new(
        status: u16,
        headers: impl IntoIterator<Item = (String, String)>,
        body: Box<dyn Read + Send>,
    ) -> Response {
        Response {
            status,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect(),
            body,
        }
    }

    /// The first value of header `name` (lower case), if it is there.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The whole body, if it is at most `max` bytes; a longer one is
    /// refused after `max + 1` bytes are read (never allocated whole).
    pub fn read_limited(&mut self, max: u64) -> Result<Vec<u8>, BodyError> {
        let mut out = Vec::new();
        (&mut self.body)
            .take(max.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(BodyError::Io)?;
        if out.len() as u64 > max {
            return Err(BodyError::TooLong(max));
        }
        Ok(out)
    }

    /// Fills `buf` from the body: exactly `buf.len()` bytes, in place.
    pub fn read_exact_into(&mut self, buf: &mut [u8]) -> Result<(), BodyError> {
        self.body.read_exact(buf).map_err(BodyError::Io)
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The time bound ran out (connecting, sending, or waiting for the
    /// answer's head).
    Timeout(String),
    /// The connection failed or broke (refused, reset, closed early).
    Connection(String),
    /// The host name does not resolve.
    HostNotFound,
    /// The server broke HTTP.
    Protocol(String),
    /// The request could not be made as given (a header value that
    /// cannot be sent, an URL ureq does not take).
    Request(String),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Timeout(e) => write!(f, "timed out: {e}"),
            TransportError::Connection(e) => write!(f, "connection failed: {e}"),
            TransportError::HostNotFound => f.write_str("the host name does not resolve"),
            TransportError::Protocol(e) => write!(f, "the server broke HTTP: {e}"),
            TransportError::Request(e) => write!(f, "the request cannot be sent: {e}"),
        }
    }
}

/// Sends requests. `timeout` bounds the whole request: connecting,
/// sending, the answer's head, and reading its body.
pub trait Transport: Send + Sync {
    /// Sends `req`, within `timeout`.
    fn send(&self, req: &Request<'_>, timeout: Duration) -> Result<Response, TransportError>;
}

/// The real transport: ureq (blocking HTTP/1.1, rustls).
pub struct Ureq {
    agent: ureq::Agent,
}

/// The longest a connection may take to set up (TCP and TLS), within the
/// request's own bound: a black-holed endpoint fails after this, not after
/// the whole bound.
const CONNECT_MAX: Duration = Duration::from_secs(10);

impl Ureq {
    /// A transport with its own connection pool.
    pub fn new() -> Ureq {
        Ureq {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_connect(Some(CONNECT_MAX))
                .build()
                .into(),
        }
    }

    fn run<B: ureq::AsSendBody>(
        &self,
        req: ureq::http::request::Builder,
        body: B,
        timeout: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, TransportError> {
        let req = req
            .body(body)
            .map_err(|e| TransportError::Request(e.to_string()))?;
        let req = self
            .agent
            .configure_request(req)
            .timeout_global(Some(timeout.max(Duration::from_millis(1))))
            .build();
        self.agent.run(req).map_err(|e| match e {
            ureq::Error::Timeout(t) => TransportError::Timeout(t.to_string()),
            ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::BodyStalled => {
                TransportError::Connection(e.to_string())
            }
            ureq::Error::HostNotFound => TransportError::HostNotFound,
            ureq::Error::Protocol(_) => TransportError::Protocol(e.to_string()),
            other => TransportError::Request(other.to_string()),
        })
    }
}

impl Default for Ureq {
    fn default() -> Ureq {
        Ureq::new()
    }
}

impl Transport for Ureq {
    fn send(&self, req: &Request<'_>, timeout: Duration) -> Result<Response, TransportError> {
        let mut b = ureq::http::Request::builder()
            .method(req.method.as_str())
            .uri(req.url.as_str());
        for (k, v) in req.headers {
            b = b.header(*k, *v);
        }
        // A body, even an empty one, for the methods that carry one: ureq
        // then sends `Content-Length` (0 for an empty body), not chunks.
        let resp = if req.method.has_body() {
            self.run(b, req.body, timeout)?
        } else {
            self.run(b, (), timeout)?
        };
        let (parts, body) = resp.into_parts();
        let headers = parts
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())));
        Ok(Response::new(
            parts.status.as_u16(),
            headers,
            Box::new(body.into_with_config().reader()),
        ))
    }
}

/// In-process transports for table tests (STYLE habit 13): a script of
/// answers and faults, and a record of what was sent.
#[cfg(test)]
pub(crate) mod mock {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// What the next request gets.
    pub enum Answer {
        /// This status, these headers, this body.
        Reply(u16, Vec<(&'static str, String)>, Vec<u8>),
        /// An S3 error document with this code.
        Error(u16, &'static str),
        /// No answer: the request's whole time bound passes (slept, at
        /// most `cap`), then it times out.
        Hang(Duration),
        /// The connection breaks.
        Reset,
        /// A head, then a body that breaks after `n` of its bytes.
        Cut(u16, Vec<(&'static str, String)>, Vec<u8>, usize),
    }

    /// A request as it was sent.
    #[derive(Clone, Debug)]
    pub struct Sent {
        pub method: Method,
        pub url: url::Url,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
        pub timeout: Duration,
    }

    impl Sent {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// Answers from a script, in order; `404 NoSuchKey` once it is
    /// used up.
    #[derive(Default)]
    pub struct Scripted {
        pub answers: Mutex<VecDeque<Answer>>,
        pub sent: Mutex<Vec<Sent>>,
    }

    impl Scripted {
        pub fn new(answers: impl IntoIterator<Item = Answer>) -> Scripted {
            Scripted {
                answers: Mutex::new(answers.into_iter().collect()),
                sent: Mutex::default(),
            }
        }

        pub fn sent(&self) -> Vec<Sent> {
            self.sent.lock().unwrap().clone()
        }
    }

    /// A body that yields `bytes`, then fails.
    struct Broken(std::io::Cursor<Vec<u8>>);

    impl Read for Broken {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.read(buf)? {
                0 if !buf.is_empty() => Err(std::io::ErrorKind::ConnectionReset.into()),
                n => Ok(n),
            }
        }
    }

    fn response(
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Box<dyn Read + Send>,
    ) -> Response {
        Response::new(
            status,
            headers.into_iter().map(|(k, v)| (k.to_owned(), v)),
            body,
        )
    }

    impl Transport for Scripted {
        fn send(&self, req: &Request<'_>, timeout: Duration) -> Result<Response, TransportError> {
            self.sent.lock().unwrap().push(Sent {
                method: req.method,
                url: req.url.clone(),
                headers: req
                    .headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                body: req.body.to_vec(),
                timeout,
            });
            let next = self.answers.lock().unwrap().pop_front();
            match next.unwrap_or(Answer::Error(404, "NoSuchKey")) {
                Answer::Reply(status, headers, body) => Ok(response(
                    status,
                    headers,
                    Box::new(std::io::Cursor::new(body)),
                )),
                Answer::Error(status, code) => {
                    let body = format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>scripted</Message></Error>"
                    );
                    Ok(response(
                        status,
                        vec![("content-type", "application/xml".into())],
                        Box::new(std::io::Cursor::new(body.into_bytes())),
                    ))
                }
                Answer::Hang(cap) => {
                    std::thread::sleep(timeout.min(cap));
                    Err(TransportError::Timeout("scripted hang".into()))
                }
                Answer::Reset => Err(TransportError::Connection("scripted reset".into())),
                Answer::Cut(status, headers, mut body, n) => {
                    body.truncate(n);
                    Ok(response(
                        status,
                        headers,
                        Box::new(Broken(std::io::Cursor::new(body))),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_within_their_limit() {
        let body = |b: &'static [u8]| Response::new(200, [], Box::new(b));
        assert_eq!(body(b"abcd").read_limited(4).unwrap(), b"abcd");
        assert!(matches!(
            body(b"abcde").read_limited(4),
            Err(BodyError::TooLong(4))
        ));
        let mut buf = [0u8; 3];
        body(b"abcd").read_exact_into(&mut buf).unwrap();
        assert_eq!(&buf, b"abc");
        assert!(body(b"ab").read_exact_into(&mut buf).is_err());
        let r = Response::new(200, [("ETag".into(), "\"x\"".into())], Box::new(&b""[..]));
        assert_eq!(r.header("etag"), Some("\"x\""));
        assert_eq!(r.header("ETag"), None, "names are looked up in lower case");
    }
}
