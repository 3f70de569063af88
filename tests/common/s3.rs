//! Real S3 for the tests: moto's server on 127.0.0.1, behind a proxy of
//! our own in its AWS-exact mode (it refuses what AWS S3 refuses and moto
//! takes: [`aws_refusal`], each rule with its source), and fault proxies
//! in front of that which count requests and inject faults.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Credentials moto accepts (it checks none); the secret is distinctive
/// so tests can look for it in output.
pub const KEY_ID: &str = "AKIDSESSIONFSTEST";
pub const SECRET: &str = "secret-MUST-NOT-LEAK-7f3a";
pub const TOKEN: &str = "token-MUST-NOT-LEAK-91c2";

/// A moto server, shared by the tests of one test binary. It reads its
/// stdin and exits when it closes, so it ends with the test process
/// however that ends (statics are never dropped).
pub struct Moto {
    /// Where sessionfs is pointed: the AWS-exact proxy in front of moto.
    pub port: u16,
    /// moto itself, for the tests' own set-up and checks.
    pub moto_port: u16,
    _child: Option<Mutex<Child>>,
}

/// Another S3 implementation on this port of 127.0.0.1 instead of moto
/// (`make test-radosgw` sets it): the keys are [`KEY_ID`] and [`SECRET`],
/// with no session token, and it is used as it is, without the AWS-exact
/// proxy (what it refuses is what is tested).
fn external() -> Option<u16> {
    std::env::var("SESSIONFS_TEST_S3_PORT")
        .ok()
        .map(|p| p.parse().expect("SESSIONFS_TEST_S3_PORT is a port"))
}

/// The moto version scripts/deps.sh pins into the project's .venv.
pub const MOTO_PINNED: &str = "5.2.1";

/// The newest moto, which scripts/deps.sh installs into
/// .venv-moto-newest (scripts/requirements-moto-newest.txt).
pub const MOTO_NEWEST: &str = "5.2.6";

/// The venv of the newest moto.
pub const MOTO_NEWEST_VENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv-moto-newest");

/// The Python of the project's .venv (scripts/deps.sh), with moto at the
/// pinned version: never a moto found elsewhere first, whose version
/// nobody chose. With `SESSIONFS_TEST_MOTO=newest` (`make
/// test-moto-newest`), the newest moto's instead: the remote suites
/// against it.
fn python() -> String {
    match std::env::var("SESSIONFS_TEST_MOTO").as_deref() {
        Ok("newest") => venv_python(MOTO_NEWEST_VENV, MOTO_NEWEST),
        Ok(other) => panic!("SESSIONFS_TEST_MOTO is `newest` or unset, not {other:?}"),
        Err(_) => venv_python(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv"), MOTO_PINNED),
    }
}

/// The Python of the venv at `venv`, checked to hold moto `version`.
pub fn venv_python(venv: &str, version: &str) -> String {
    let py = format!("{venv}/bin/python3");
    let found = Command::new(&py)
        .args(["-c", "import moto.server, moto; print(moto.__version__)"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    assert_eq!(
        found.as_deref(),
        Some(version),
        "{venv} must hold moto {version}: run scripts/deps.sh"
    );
    py
}

/// A free port on 127.0.0.1 (free when asked).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts connections on `port`.
fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The shared moto server (behind the AWS-exact proxy), started on first
/// use.
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| match external() {
        Some(port) => Moto {
            port,
            moto_port: port,
            _child: None,
        },
        None => start_moto(&python()),
    })
}

/// A moto server run by `python`, behind an AWS-exact proxy. It reads its
/// stdin and exits when it closes, so it ends with the test process
/// however that ends.
pub fn start_moto(python: &str) -> Moto {
    {
        let port = free_port();
        let script = "import os, sys, threading\n\
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()\n\
from moto.server import main\n\
main(['-H', '127.0.0.1', '-p', sys.argv[1]])\n";
        let child = Command::new(python)
            .args(["-c", script, &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        wait_listening(port, "moto");
        let exact = Proxy::aws_exact(port);
        let moto = Moto {
            port: exact.port,
            moto_port: port,
            _child: Some(Mutex::new(child)),
        };
        // The proxy's threads run for the process's life.
        std::mem::forget(exact);
        moto
    }
}

fn bucket_at(port: u16, name: &str) -> rusty_s3::Bucket {
    let endpoint = format!("http://127.0.0.1:{port}").parse().unwrap();
    rusty_s3::Bucket::new(
        endpoint,
        rusty_s3::UrlStyle::Path,
        name.to_owned(),
        "us-east-1",
    )
    .unwrap()
}

fn credentials() -> rusty_s3::Credentials {
    rusty_s3::Credentials::new(KEY_ID, SECRET)
}

impl Moto {
    /// Creates bucket `name`.
    pub fn create_bucket(&self, name: &str) {
        use rusty_s3::S3Action;
        let b = bucket_at(self.moto_port, name);
        let creds = credentials();
        let url = b.create_bucket(&creds).sign(Duration::from_secs(600));
        let r = ureq::put(url.as_str()).send_empty().unwrap();
        assert!(
            r.status().is_success(),
            "create bucket {name}: {}",
            r.status()
        );
    }

    /// Puts `bytes` at `bucket/key`.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        use rusty_s3::S3Action;
        let b = bucket_at(self.moto_port, bucket);
        let creds = credentials();
        let url = b
            .put_object(Some(&creds), key)
            .sign(Duration::from_secs(600));
        let r = ureq::put(url.as_str()).send(bytes).unwrap();
        assert!(r.status().is_success(), "put {key}: {}", r.status());
    }

    /// A presigned GET of `bucket/key` through `port` (a proxy's).
    pub fn presigned_get(port: u16, bucket: &str, key: &str) -> String {
        use rusty_s3::S3Action;
        let b = bucket_at(port, bucket);
        let creds = credentials();
        b.get_object(Some(&creds), key)
            .sign(Duration::from_secs(600))
            .to_string()
    }
}

/// The environment that points sessionfs at `port` with test credentials
/// and nothing from the machine's own configuration.
pub fn env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", KEY_ID.into()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
        (
            "AWS_SESSION_TOKEN",
            external().map_or(TOKEN.into(), |_| String::new()),
        ),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
    ]
}

/// What the proxy does to one request.
pub enum Fault {
    /// Forward it unchanged.
    Pass,
    /// Answer with this status and an S3 error body with this code.
    Status(u16, &'static str),
    /// Reset the connection (RST) without an answer.
    Reset,
    /// Forward it, and send only this many bytes of the answer's body
    /// (its Content-Length unchanged), then close.
    Truncate(usize),
    /// Forward it after removing its `Range` header (a server that
    /// ignores ranges).
    IgnoreRange,
    /// Wait this long, then forward it (a slow or hung server).
    Delay(Duration),
    /// Run this first, then forward it.
    Before(Box<dyn FnOnce() + Send>),
    /// Forward it, then run this before the answer goes back.
    After(Box<dyn FnOnce() + Send>),
    /// Forward it, and flip the bits of the answer's body byte at this
    /// index (a corrupted response).
    Corrupt(usize),
    /// Flip the bits of the request's body byte at this index (clamped
    /// to the body), then forward it: a body damaged on the way.
    CorruptRequest(usize),
}

/// A request as the proxy sees it.
pub struct Req<'a> {
    pub method: &'a str,
    /// The path, still percent-encoded.
    pub path: &'a str,
    /// The query's pairs, decoded; a bare `uploads` has an empty value.
    pub query: Vec<(String, String)>,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: &'a [u8],
}

impl Req<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the AWS-exact proxy knows of a multipart upload in progress.
#[derive(Clone, Debug, Default)]
pub struct UploadState {
    /// `x-amz-checksum-algorithm` of its creation, in lower case.
    pub algorithm: Option<String>,
    /// The length of each part stored, by number.
    pub parts: HashMap<u32, u64>,
}

/// A refusal as AWS S3 answers it: status, code, message.
pub type Refusal = (u16, &'static str, String);

/// S3's smallest part but the last, and most parts.
const MIN_PART: u64 = 5 << 20;
const MAX_PART_NUMBER: u32 = 10_000;

/// What AWS S3 refuses (and moto takes) about `req`, as AWS answers it;
/// `upload` is the state of the upload it belongs to, `source_len` the
/// length of a copy's source. Each rule names its source.
pub fn aws_refusal(
    req: &Req,
    upload: Option<&UploadState>,
    source_len: Option<u64>,
) -> Option<Refusal> {
    let refuse = |status, code, msg: String| Some((status, code, msg));
    let has_body = matches!(req.method, "PUT" | "POST");
    // A chunked body that is not `aws-chunked` (SigV4 streaming): 501
    // NotImplemented, "A header you provided implies functionality that is
    // not implemented" (Header: Transfer-Encoding). Source: S3 API
    // Reference, Error responses, "List of error codes" (NotImplemented),
    // https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html;
    // observed on AWS with ureq 3's body-less PUT (issue 32, finding 1).
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let aws_chunked = req
        .header("content-encoding")
        .is_some_and(|v| v.contains("aws-chunked"))
        || req
            .header("x-amz-content-sha256")
            .is_some_and(|v| v.starts_with("STREAMING-"));
    if chunked && !aws_chunked {
        return refuse(
            501,
            "NotImplemented",
            "A header you provided implies functionality that is not implemented (Transfer-Encoding)".into(),
        );
    }
    // A PUT or POST without Content-Length: 411 MissingContentLength,
    // "You must provide the Content-Length HTTP header". Source: the same
    // list of error codes (MissingContentLength).
    if has_body && !chunked && req.header("content-length").is_none() {
        return refuse(
            411,
            "MissingContentLength",
            "You must provide the Content-Length HTTP header.".into(),
        );
    }
    // Every x-amz-* header sent must be signed: 403 AccessDenied, "There
    // were headers present in the request which were not signed". Source:
    // S3 API Reference, "Authenticating Requests: Using Query Parameters"
    // (sigv4-query-string-auth: "any x-amz-* headers that you plan to add
    // to the request are also required to be signed") and "Signature
    // Calculations for the Authorization Header" (sigv4-header-based-auth).
    let signed: Option<Vec<String>> = req
        .param("X-Amz-SignedHeaders")
        .map(|v| v.split(';').map(str::to_owned).collect())
        .or_else(|| {
            let auth = req.header("authorization")?;
            let list = auth.split("SignedHeaders=").nth(1)?.split(',').next()?;
            Some(list.split(';').map(str::to_owned).collect())
        });
    if let Some(signed) = &signed
        && let Some((h, _)) = req
            .headers
            .iter()
            .find(|(h, _)| h.starts_with("x-amz-") && !signed.contains(h))
    {
        return refuse(
            403,
            "AccessDenied",
            format!("There were headers present in the request which were not signed: {h}"),
        );
    }
    let part_number = req
        .param("partNumber")
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let upload_id = req.param("uploadId");
    // UploadPart and UploadPartCopy: part numbers 1 to 10,000: 400
    // InvalidArgument, "Part number must be an integer between 1 and
    // 10000, inclusive". Source: S3 API Reference, UploadPart
    // ("Part numbers can be any number from 1 to 10,000, inclusive"),
    // https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPart.html,
    // and S3 User Guide, "Amazon S3 multipart upload limits"
    // (https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html).
    if req.method == "PUT"
        && upload_id.is_some()
        && let Some(n) = part_number
    {
        if !(1..=MAX_PART_NUMBER).contains(&n) {
            return refuse(
                400,
                "InvalidArgument",
                "Part number must be an integer between 1 and 10000, inclusive".into(),
            );
        }
        if let Some(source) = req.header("x-amz-copy-source") {
            // A copy range within the source: AWS answers 400
            // InvalidArgument "Range specified is not valid for source
            // object of size: N" (observed direct to S3, versity/versitygw
            // issue 610; the API reference, UploadPartCopy, says the range
            // is "bytes=first-last", zero-based, within the source).
            let range = req
                .header("x-amz-copy-source-range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
            let Some((first, last)) = range else {
                return refuse(
                    400,
                    "InvalidArgument",
                    "The x-amz-copy-source-range value must be of the form bytes=first-last".into(),
                );
            };
            if let Some(len) = source_len
                && (first > last || last >= len)
            {
                return refuse(
                    400,
                    "InvalidArgument",
                    format!(
                        "Range specified is not valid for source object of size: {len} ({source})"
                    ),
                );
            }
        } else {
            // A part's checksum must match its body: 400 BadDigest.
            // Source: S3 User Guide, "Checking object integrity" (the
            // checksum sent is checked on upload) and the list of error
            // codes (BadDigest: "The Content-MD5 or checksum value that
            // you specified did not match what the server received").
            // So must its Content-MD5: 400 BadDigest. Source: S3 API
            // Reference, UploadPart ("To ensure that data is not corrupted
            // when traversing the network, specify the Content-MD5 header
            // ... Amazon S3 checks the part data against the provided MD5
            // value"); the list of error codes (BadDigest).
            if let Some(md5) = req.header("content-md5")
                && md5 != md5_b64(req.body)
            {
                return refuse(
                    400,
                    "BadDigest",
                    "The Content-MD5 you specified did not match what we received.".into(),
                );
            }
            let want = req.header("x-amz-checksum-sha256");
            if let Some(want) = want
                && want != sha256_b64(req.body)
            {
                return refuse(
                    400,
                    "BadDigest",
                    "The SHA256 you specified did not match the calculated checksum.".into(),
                );
            }
            // The part's checksum type must be the upload's: 400
            // InvalidRequest, "Checksum Type mismatch occurred, expected
            // checksum Type: X, actual checksum Type: Y". Source: AWS's
            // answer quoted in apache/arrow-rs issue 6793 and
            // aws/aws-sdk-java issue 3173; S3 API Reference, UploadPart
            // (x-amz-checksum-algorithm "must be the same for all parts
            // and it match the checksum value supplied in the
            // CreateMultipartUpload request").
            let expected = upload.and_then(|u| u.algorithm.clone());
            let actual = want.map(|_| "sha256".to_owned());
            if upload.is_some() && expected != actual {
                return refuse(
                    400,
                    "InvalidRequest",
                    format!(
                        "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
                        expected.as_deref().unwrap_or("null"),
                        actual.as_deref().unwrap_or("null")
                    ),
                );
            }
        }
    }
    // CompleteMultipartUpload.
    if req.method == "POST"
        && upload_id.is_some()
        && let Some(upload) = upload
    {
        let body = String::from_utf8_lossy(req.body);
        let parts: Vec<(u32, bool)> = body
            .split("<Part>")
            .skip(1)
            .map(|p| {
                let n = p
                    .split_once("<PartNumber>")
                    .and_then(|(_, r)| r.split_once("</PartNumber>"))
                    .and_then(|(n, _)| n.trim().parse().ok())
                    .unwrap_or(0);
                (n, p.contains("<ChecksumSHA256>"))
            })
            .collect();
        // Every part but the last at least 5 MiB: 400 EntityTooSmall.
        // Source: S3 API Reference, CompleteMultipartUpload (Errors:
        // EntityTooSmall, "Your proposed upload is smaller than the
        // minimum allowed object size. Each part must be at least 5 MB in
        // size, except the last part"),
        // https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html.
        for (k, (n, _)) in parts.iter().enumerate() {
            let len = upload.parts.get(n).copied().unwrap_or(0);
            if k + 1 < parts.len() && len < MIN_PART {
                return refuse(
                    400,
                    "EntityTooSmall",
                    format!(
                        "Your proposed upload is smaller than the minimum allowed object size (part {n}: {len} bytes)."
                    ),
                );
            }
        }
        // An upload created with a checksum algorithm lists every part's
        // checksum: 400 InvalidRequest, "The upload was created using a
        // sha256 checksum. The complete request must include the checksum
        // for each part. It was missing for part N in the request."
        // Source: AWS's answer quoted in apache/opendal pull request 4580;
        // S3 API Reference, CompletedPart (ChecksumSHA256 "is present if
        // the multipart upload request was created with the SHA256
        // checksum algorithm").
        if upload.algorithm.as_deref() == Some("sha256")
            && let Some((n, _)) = parts.iter().find(|(_, has)| !has)
        {
            return refuse(
                400,
                "InvalidRequest",
                format!(
                    "The upload was created using a sha256 checksum. The complete request must include the checksum for each part. It was missing for part {n} in the request."
                ),
            );
        }
    }
    None
}

/// The MD5 of `bytes`, base64.
pub fn md5_b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    use md5::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(bytes))
}

/// Whether the remote tests run against another S3 implementation than
/// moto (`make test-radosgw`): tests of moto's own behaviour, or that
/// simulate a store by rewriting signed requests, say so and skip.
pub fn is_external() -> bool {
    external().is_some()
}

/// The SHA-256 of `bytes`, base64.
pub fn sha256_b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes))
}

/// What a proxy holds: faults to come, requests seen, and (AWS-exact)
/// the uploads in progress.
#[derive(Default)]
struct State {
    faults: VecDeque<Fault>,
    log: Vec<String>,
    uploads: HashMap<String, UploadState>,
    /// Headers removed from every request (a store that ignores them).
    dropped: Vec<&'static str>,
}

/// A proxy on 127.0.0.1 in front of `upstream`: one request per
/// connection (it answers `Connection: close`), each logged as
/// `METHOD PATH range=…`, with faults taken in order from a queue; in its
/// AWS-exact mode it answers as AWS S3 what AWS S3 refuses
/// ([`aws_refusal`]), and adds to a copy's answer the part's checksum AWS
/// gives and moto does not.
pub struct Proxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
    /// Bytes per second each answer's body is sent at (0: as fast as it
    /// comes): a slow link.
    rate: Arc<std::sync::atomic::AtomicU64>,
}

impl Proxy {
    /// A fault proxy.
    pub fn start(upstream: u16) -> Proxy {
        Proxy::spawn(upstream, false)
    }

    /// A proxy in AWS-exact mode (faults too).
    pub fn aws_exact(upstream: u16) -> Proxy {
        Proxy::spawn(upstream, true)
    }

    fn spawn(upstream: u16, exact: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state: Arc<Mutex<State>> = Arc::default();
        let rate: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let (st, r) = (state.clone(), rate.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (st, r) = (st.clone(), r.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, &st, &r, exact);
                });
            }
        });
        Proxy { port, state, rate }
    }

    /// Caps each answer's body at `bytes_per_second` (0: no cap).
    pub fn cap(&self, bytes_per_second: u64) {
        self.rate
            .store(bytes_per_second, std::sync::atomic::Ordering::Relaxed);
    }

    /// Queues faults for the next requests.
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().faults.extend(faults);
    }

    /// Removes header `name` from every request from now on (a store
    /// that ignores it, as one that ignores `If-None-Match`).
    pub fn drop_header(&self, name: &'static str) {
        self.state.lock().unwrap().dropped.push(name);
    }

    /// The requests seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    /// Drops the faults not yet used.
    pub fn calm(&self) {
        self.state.lock().unwrap().faults.clear();
    }

    /// Forgets the requests seen so far.
    pub fn clear(&self) {
        self.state.lock().unwrap().log.clear();
    }
}

/// Reads an HTTP head (to the blank line) and returns it with any bytes
/// read past it.
fn read_head(s: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 || buf.len() > 1 << 20 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The head without the headers named in `drop`, plus `Connection: close`
/// and the `extra` headers.
fn rewrite(head: &str, drop: &[&str], extra: &str) -> String {
    let mut out = String::new();
    for (i, l) in head.trim_end().lines().enumerate() {
        let name = l.split(':').next().unwrap_or("").trim();
        if i > 0
            && (name.eq_ignore_ascii_case("connection")
                || drop.iter().any(|d| name.eq_ignore_ascii_case(d)))
        {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str(extra);
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// An S3 error answer.
fn error_answer(status: u16, code: &str, message: &str) -> String {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    format!(
        "HTTP/1.1 {status} Refused\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The parts of a request head as [`aws_refusal`] takes them.
fn parse_req<'a>(head: &'a str, body: &'a [u8]) -> Req<'a> {
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect();
    Req {
        method,
        path,
        query,
        headers,
        body,
    }
}

/// The length of the object at `source` (`/bucket/key`, encoded), asked of
/// moto at `upstream` (HEAD, signed with the test keys).
fn source_len(upstream: u16, source: &str) -> Option<u64> {
    use rusty_s3::S3Action;
    let decoded = url::Url::parse(&format!("http://h{source}")).ok()?;
    let path = percent_decode(decoded.path());
    let (bucket, key) = path.trim_start_matches('/').split_once('/')?;
    let b = bucket_at(upstream, bucket);
    let url = b
        .head_object(Some(&credentials()), key)
        .sign(Duration::from_secs(600));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let r = agent.head(url.as_str()).call().ok()?;
    r.headers()
        .get("content-length")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Bytes `range` (`bytes=a-b`) of `source`, asked of moto at `upstream`.
fn source_bytes(upstream: u16, source: &str, range: &str) -> Option<Vec<u8>> {
    use rusty_s3::S3Action;
    let path = percent_decode(source);
    let (bucket, key) = path.trim_start_matches('/').split_once('/')?;
    let b = bucket_at(upstream, bucket);
    let url = b
        .get_object(Some(&credentials()), key)
        .sign(Duration::from_secs(600));
    let mut r = ureq::get(url.as_str()).header("range", range).call().ok()?;
    r.body_mut().with_config().limit(6 << 30).read_to_vec().ok()
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

fn serve(
    mut client: TcpStream,
    upstream: u16,
    state: &Mutex<State>,
    rate: &std::sync::atomic::AtomicU64,
    exact: bool,
) -> std::io::Result<()> {
    let (head, mut body) = read_head(&mut client)?;
    let chunked = header(&head, "transfer-encoding").is_some();
    let len: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while !chunked && body.len() < len {
        let mut chunk = vec![0u8; len - body.len()];
        let n = client.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (fault, dropped) = {
        let mut st = state.lock().unwrap();
        st.log.push(format!(
            "{method} {path} range={}",
            header(&head, "range").unwrap_or("-")
        ));
        (
            st.faults.pop_front().unwrap_or(Fault::Pass),
            st.dropped.clone(),
        )
    };
    let mut drop_headers: Vec<&str> = dropped;
    let mut truncate = None;
    let mut corrupt = None;
    let mut after = None;
    match fault {
        Fault::Pass => {}
        Fault::Status(status, code) => {
            return client.write_all(error_answer(status, code, "injected").as_bytes());
        }
        Fault::Reset => {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            nix::sys::socket::setsockopt(&client, nix::sys::socket::sockopt::Linger, &linger)?;
            return Ok(());
        }
        Fault::Truncate(n) => truncate = Some(n),
        Fault::IgnoreRange => drop_headers.push("range"),
        Fault::Delay(d) => std::thread::sleep(d),
        Fault::Before(f) => f(),
        Fault::After(f) => after = Some(f),
        Fault::Corrupt(i) => corrupt = Some(i),
        Fault::CorruptRequest(i) => {
            if let Some(b) = body
                .len()
                .checked_sub(1)
                .and_then(|last| body.get_mut(i.min(last)))
            {
                *b ^= 0xff;
            }
        }
    }
    let req = parse_req(&head, &body);
    let upload_id = req.param("uploadId").map(str::to_owned);
    let copy_source = req.header("x-amz-copy-source").map(str::to_owned);
    let copy_range = req.header("x-amz-copy-source-range").map(str::to_owned);
    let part_number: Option<u32> = req.param("partNumber").and_then(|n| n.parse().ok());
    let creating = req.method == "POST" && req.param("uploads").is_some();
    let algorithm = req
        .header("x-amz-checksum-algorithm")
        .map(str::to_ascii_lowercase);
    let upload = upload_id
        .as_ref()
        .and_then(|id| state.lock().unwrap().uploads.get(id).cloned());
    if exact {
        let src_len = copy_source.as_deref().and_then(|s| source_len(upstream, s));
        if let Some((status, code, message)) = aws_refusal(&req, upload.as_ref(), src_len) {
            state
                .lock()
                .unwrap()
                .log
                .push(format!("refused {status} {code}: {message}"));
            return client.write_all(error_answer(status, code, &message).as_bytes());
        }
    }
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.write_all(rewrite(&head, &drop_headers, "").as_bytes())?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let (rhead, rbody) = resp.split_at(split);
    let rhead = String::from_utf8_lossy(rhead).into_owned();
    let mut rbody = rbody.to_vec();
    let ok = rhead.split(' ').nth(1) == Some("200");
    if exact && ok {
        let mut st = state.lock().unwrap();
        if creating {
            let text = String::from_utf8_lossy(&rbody);
            if let Some(id) = text
                .split_once("<UploadId>")
                .and_then(|(_, r)| r.split_once("</UploadId>"))
                .map(|(id, _)| id.to_owned())
            {
                st.uploads.insert(
                    id,
                    UploadState {
                        algorithm: algorithm.clone(),
                        parts: HashMap::new(),
                    },
                );
            }
        }
        if let (Some(id), Some(n)) = (&upload_id, part_number)
            && let Some(u) = st.uploads.get_mut(id)
        {
            let len = match &copy_range {
                Some(r) => r
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, b)| Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?))
                    .unwrap_or(0),
                None => body.len() as u64,
            };
            u.parts.insert(n, len);
        }
    }
    let mut rhead_out = rewrite(&rhead, &[], "");
    // A copy into an upload with a checksum algorithm: AWS answers the
    // part's checksum in CopyPartResult (S3 API Reference, CopyPartResult,
    // ChecksumSHA256); moto does not, so it is added here.
    if exact
        && ok
        && let (Some(source), Some(range)) = (&copy_source, &copy_range)
        && upload.as_ref().and_then(|u| u.algorithm.as_deref()) == Some("sha256")
    {
        let text = String::from_utf8_lossy(&rbody).into_owned();
        if !text.contains("ChecksumSHA256")
            && let Some(bytes) = source_bytes(upstream, source, range)
        {
            let with = text.replacen(
                "</ETag>",
                &format!(
                    "</ETag><ChecksumSHA256>{}</ChecksumSHA256>",
                    sha256_b64(&bytes)
                ),
                1,
            );
            rbody = with.into_bytes();
            rhead_out = rewrite(
                &rhead,
                &["content-length"],
                &format!("Content-Length: {}\r\n", rbody.len()),
            );
        }
    }
    if let Some(f) = after {
        f();
    }
    client.write_all(rhead_out.as_bytes())?;
    let keep = truncate.unwrap_or(rbody.len()).min(rbody.len());
    rbody.truncate(keep);
    if let Some(b) = corrupt.and_then(|i| rbody.get_mut(i)) {
        *b ^= 0xff;
    }
    // At the link's pace: 16 KiB at a time, each after its share of a second.
    let began = Instant::now();
    let mut sent = 0u64;
    for piece in rbody.chunks(16 << 10) {
        let r = rate.load(std::sync::atomic::Ordering::Relaxed);
        if r > 0 {
            let due = Duration::from_secs_f64(sent as f64 / r as f64);
            if let Some(wait) = due.checked_sub(began.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        client.write_all(piece)?;
        sent += piece.len() as u64;
    }
    Ok(())
}

/// The stricter server: `s3s-fs` (crates.io, `cargo install s3s-fs
/// --features binary`), which checks SigV4 signatures. Not installed by
/// scripts/deps.sh (its clean build costs about 4 minutes of CPU); found as
/// `SESSIONFS_S3S_FS` or on PATH, else `None` with the reason printed.
/// Objects are files: `root/BUCKET/KEY`.
pub fn s3s_fs(root: &std::path::Path) -> Option<(u16, super::KillOnDrop)> {
    let bin = std::env::var("SESSIONFS_S3S_FS").unwrap_or_else(|_| "s3s-fs".into());
    let found = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!(
            "skipped: no s3s-fs (set SESSIONFS_S3S_FS, or cargo install s3s-fs --features binary)"
        );
        return None;
    }
    let port = free_port();
    let child = Command::new(&bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", KEY_ID, "--secret-key", SECRET])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start s3s-fs");
    let guard = super::KillOnDrop(child);
    wait_listening(port, "s3s-fs");
    Some((port, guard))
}

/// A bucket of its own for each test.
pub fn bucket() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "t{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    moto().create_bucket(&name);
    name
}

/// A temporary directory, the shared moto server, a fresh bucket.
pub fn setup() -> (tempfile::TempDir, &'static Moto, String) {
    (tempfile::tempdir().unwrap(), moto(), bucket())
}

/// Runs sessionfs against `port` (moto's, or a proxy's), with `extra`
/// environment.
pub fn remote(port: u16, args: &[&str], extra: &[(&str, &str)]) -> super::Run {
    let env = env(port);
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(extra);
    super::run_env(args, &all)
}

/// GET requests the proxy saw.
pub fn gets(proxy: &Proxy) -> usize {
    proxy
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET "))
        .count()
}

impl Moto {
    /// The object at `bucket/key`, or `None` where there is none.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        use rusty_s3::S3Action;
        let b = bucket_at(self.moto_port, bucket);
        let creds = credentials();
        let url = b
            .get_object(Some(&creds), key)
            .sign(Duration::from_secs(600));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent.get(url.as_str()).call().unwrap();
        match r.status().as_u16() {
            200 => Some(
                r.body_mut()
                    .with_config()
                    .limit(1 << 30)
                    .read_to_vec()
                    .unwrap(),
            ),
            404 => None,
            s => panic!("get {key}: HTTP {s}"),
        }
    }

    /// The keys of the multipart uploads in progress in `bucket`
    /// (ListMultipartUploads, signed).
    pub fn uploads(&self, bucket: &str) -> Vec<String> {
        let b = bucket_at(self.moto_port, bucket);
        let url = rusty_s3::signing::sign(
            &jiff::Timestamp::now(),
            rusty_s3::Method::Get,
            b.base_url().clone(),
            KEY_ID,
            SECRET,
            None,
            "us-east-1",
            600,
            [("uploads", "")].into_iter(),
            std::iter::empty(),
        );
        let body = ureq::get(url.as_str())
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        body.split("<Upload>")
            .skip(1)
            .filter_map(|u| Some(u.split_once("<Key>")?.1.split_once("</Key>")?.0.to_owned()))
            .collect()
    }

    /// Asserts that no multipart upload is in progress in `bucket`.
    #[track_caller]
    pub fn assert_no_uploads(&self, bucket: &str) {
        let left = self.uploads(bucket);
        assert!(left.is_empty(), "uploads left in {bucket}: {left:?}");
    }
}
