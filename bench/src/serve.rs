//! A stand-in object store for the remote benchmark: an HTTP/1.1 server on
//! 127.0.0.1 that serves the files of a directory with range requests,
//! shaped like an object store in the same region (a latency before each
//! response's first byte, one bandwidth cap shared by every connection),
//! and counts what it serves (`GET /__stats`, `POST /__reset`), so the
//! benchmark measures requests and bytes outside the tool it measures.
//!
//! Why not moto (the tests' S3 server): it reads the whole object for
//! every ranged GET, which on a 1 GB packet measures moto. Why not S3
//! itself: the machine reaches no network. sessionfs reads `http://` URLs
//! with the same code as `s3://` objects (SigV4 signing aside), so the
//! ratios hold; the download peer fetches with ranged GETs in parallel, as
//! `aws s3 cp` does.
//!
//! Also the part of S3's API a seal uploads with (path-style
//! `/BUCKET/KEY`, the key percent-decoded once as S3 does; signatures not
//! checked; XML documents through instant-xml, the crate rusty-s3 reads
//! them with): `CreateMultipartUpload`,
//! `UploadPart`, `UploadPartCopy` with a range and
//! `x-amz-copy-source-if-match`, `CompleteMultipartUpload` with
//! `If-None-Match: *`, `AbortMultipartUpload`; request bodies are paced by
//! a second bandwidth cap (the uplink). Objects are files under the root
//! (`ROOT/BUCKET/KEY`), uploads in `ROOT/.uploads/`.
//!
//! And what the peers that mount the bucket ask before they read
//! (ratarmount through fsspec's s3fs, mountpoint-s3): `HeadObject` with
//! `Last-Modified`, and `ListObjectsV2` (prefix, delimiter, `max-keys`,
//! continuation, `encoding-type=url`).
//!
//! Also `download` and `upload`: the peers (8 ranged GETs, or parts, of
//! 8 MiB at a time, as `aws s3 cp`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use instant_xml::{FromXml, ToXml};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// How the store is shaped.
#[derive(Clone, Copy)]
pub struct Shape {
    /// Before the first byte of each response.
    pub latency: Duration,
    /// Bytes per second for all connections together; 0: unlimited.
    pub rate: u64,
}

/// A token bucket shared by every connection.
struct Bucket {
    rate: f64,
    state: Mutex<(Instant, f64)>,
}

/// Bytes the bucket may hold: a burst of this much goes at once.
const BURST: f64 = 256.0 * 1024.0;

impl Bucket {
    /// Waits until `n` bytes may be sent.
    fn take(&self, n: usize) {
        if self.rate <= 0.0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().unwrap();
            let now = Instant::now();
            let tokens = (s.1 + now.duration_since(s.0).as_secs_f64() * self.rate).min(BURST);
            let left = tokens - n as f64;
            *s = (now, left);
            if left >= 0.0 {
                return;
            }
            Duration::from_secs_f64(-left / self.rate)
        };
        std::thread::sleep(wait);
    }
}

struct Server {
    root: PathBuf,
    shape: Shape,
    bucket: Bucket,
    /// Request bodies (the uplink).
    up: Bucket,
    requests: AtomicU64,
    bytes: AtomicU64,
    /// Request body bytes received.
    received: AtomicU64,
    next_upload: AtomicU64,
}

/// One request, read.
struct Request {
    method: String,
    path: String,
    query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A query parameter (`uploads` has an empty value), as sent
    /// (percent-encoded).
    fn param(&self, name: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then_some(v)
        })
    }

    /// A query parameter, percent-decoded; empty when absent.
    fn text(&self, name: &str) -> String {
        self.param(name).map(percent_decode).unwrap_or_default()
    }
}

/// Serves `root` on 127.0.0.1 (port 0: any), writing the port to
/// `port_file`; runs until killed.
pub fn serve(root: &Path, shape: Shape, port: u16, port_file: &Path) -> std::io::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let port = listener.local_addr()?.port();
    std::fs::write(port_file, format!("{port}\n"))?;
    let server = Arc::new(Server {
        root: root.to_owned(),
        shape,
        bucket: Bucket {
            rate: shape.rate as f64,
            state: Mutex::new((Instant::now(), BURST)),
        },
        up: Bucket {
            rate: shape.rate as f64,
            state: Mutex::new((Instant::now(), BURST)),
        },
        requests: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        received: AtomicU64::new(0),
        next_upload: AtomicU64::new(1),
    });
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let server = server.clone();
        std::thread::spawn(move || {
            let _ = conn.set_nodelay(true);
            let _ = server.connection(conn);
        });
    }
    Ok(())
}

impl Server {
    /// Requests on one connection, kept alive until the client closes it.
    fn connection(&self, conn: TcpStream) -> std::io::Result<()> {
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut out = conn;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                }
            }
            let len = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(0);
            let chunked = headers
                .iter()
                .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
            let mut body = Vec::new();
            if chunked {
                // Chunks of `size (hex) CRLF data CRLF`, ended by a chunk of 0
                // and a blank line.
                loop {
                    let mut size = String::new();
                    reader.read_line(&mut size)?;
                    let hex = size.trim().split(';').next().unwrap_or("");
                    let n = usize::from_str_radix(hex, 16).map_err(std::io::Error::other)?;
                    let at = body.len();
                    body.resize(at + n, 0);
                    reader.read_exact(&mut body[at..])?;
                    self.up.take(n);
                    let mut crlf = String::new();
                    reader.read_line(&mut crlf)?;
                    if n == 0 {
                        break;
                    }
                }
            } else {
                body.resize(len, 0);
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(64 << 10);
                    reader.read_exact(&mut body[at..at + n])?;
                    self.up.take(n);
                    at += n;
                }
            }
            let len = body.len();
            self.received.fetch_add(len as u64, Ordering::Relaxed);
            let mut parts = line.split_whitespace();
            let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let req = Request {
                method: method.to_owned(),
                // The key, as S3 reads it: decoded once.
                path: percent_decode(path),
                query: query.to_owned(),
                headers,
                body,
            };
            self.handle(&mut out, &req)?;
            let header = |name: &str| req.header(name);
            if header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
                return Ok(());
            }
        }
    }

    /// Answers one request: the counters, the S3 upload calls, or a read.
    fn handle(&self, out: &mut TcpStream, req: &Request) -> std::io::Result<()> {
        let upload = req.param("uploadId");
        match (req.method.as_str(), upload) {
            ("POST", None) if req.param("uploads").is_some() => self.create(out, req),
            ("GET", None) if req.param("list-type") == Some("2") => self.list(out, req),
            ("PUT", Some(id)) => self.part(out, req, id),
            ("POST", Some(id)) => self.complete(out, req, id),
            ("DELETE", Some(id)) => {
                self.requests.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(self.shape.latency);
                let _ = std::fs::remove_dir_all(self.upload_dir(id));
                head(out, "204 No Content", 0, &[])
            }
            _ => self.respond(out, &req.method, &req.path, req.header("range")),
        }
    }

    fn respond(
        &self,
        out: &mut TcpStream,
        method: &str,
        path: &str,
        range: Option<&str>,
    ) -> std::io::Result<()> {
        match (method, path) {
            ("GET", "/__stats") => {
                let body = format!(
                    "{{\"requests\":{},\"bytes\":{},\"received\":{}}}",
                    self.requests.load(Ordering::Relaxed),
                    self.bytes.load(Ordering::Relaxed),
                    self.received.load(Ordering::Relaxed)
                );
                return head(out, "200 OK", body.len() as u64, &[])
                    .and_then(|()| out.write_all(body.as_bytes()));
            }
            ("POST", "/__reset") => {
                self.requests.store(0, Ordering::Relaxed);
                self.bytes.store(0, Ordering::Relaxed);
                self.received.store(0, Ordering::Relaxed);
                return head(out, "200 OK", 0, &[]);
            }
            _ => {}
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.shape.latency);
        let Some(object) = self.open_object(path) else {
            eprintln!("serve: 404 {method} {path}");
            return head(out, "404 Not Found", 0, &[]);
        };
        let (len, etag) = (object.len, object.etag.clone());
        let (status, start, end, extra) = match range.and_then(|r| parse_range(r, len)) {
            Some((s, e)) => (
                "206 Partial Content",
                s,
                e,
                vec![format!("Content-Range: bytes {s}-{}/{len}", e - 1)],
            ),
            None if range.is_some() => {
                return head(
                    out,
                    "416 Range Not Satisfiable",
                    0,
                    &[format!("Content-Range: bytes */{len}")],
                );
            }
            None => ("200 OK", 0, len, vec![]),
        };
        let mut extra = extra;
        extra.push(format!("ETag: {etag}"));
        extra.push(format!("Last-Modified: {}", http_date(object.modified)));
        extra.push("Accept-Ranges: bytes".into());
        head(out, status, end - start, &extra)?;
        if method == "HEAD" {
            return Ok(());
        }
        let mut buf = vec![0u8; 64 << 10];
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            object.read_at(&mut buf[..n], at)?;
            self.bucket.take(n);
            out.write_all(&buf[..n])?;
            self.bytes.fetch_add(n as u64, Ordering::Relaxed);
            at += n as u64;
        }
        Ok(())
    }
}

/// An object: a file, or (one uploaded here) a list of extents of files,
/// the parts sent and the ranges of other objects copied, as a store keeps
/// them: a copied part and a completion move no bytes here, as they move
/// none through the client at S3 (which would otherwise measure this
/// disk, not the tool).
struct Object {
    /// `(file, offset in it, length)`, in order.
    extents: Vec<(PathBuf, u64, u64)>,
    len: u64,
    etag: String,
    /// Seconds since the epoch.
    modified: u64,
}

impl Object {
    fn read_at(&self, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
        let mut base = 0;
        for (path, off, len) in &self.extents {
            if buf.is_empty() {
                break;
            }
            if at < base + len {
                let n = ((base + len - at) as usize).min(buf.len());
                std::fs::File::open(path)?.read_exact_at(&mut buf[..n], off + at - base)?;
                buf = &mut buf[n..];
                at += n as u64;
            }
            base += len;
        }
        if buf.is_empty() {
            Ok(())
        } else {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        }
    }

    /// The extents of bytes `a..b`.
    fn slice(&self, a: u64, b: u64) -> Vec<(PathBuf, u64, u64)> {
        let mut out = Vec::new();
        let mut base = 0;
        for (path, off, len) in &self.extents {
            let (lo, hi) = (a.max(base), b.min(base + len));
            if lo < hi {
                out.push((path.clone(), off + lo - base, hi - lo));
            }
            base += len;
        }
        out
    }
}

/// Extents as lines of `OFFSET LENGTH PATH`.
fn write_extents(path: &Path, extents: &[(PathBuf, u64, u64)]) -> std::io::Result<()> {
    let text: String = extents
        .iter()
        .map(|(p, o, l)| format!("{o} {l} {}\n", p.display()))
        .collect();
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

fn read_extents(path: &Path) -> std::io::Result<Vec<(PathBuf, u64, u64)>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let o = it.next()?.parse().ok()?;
            let n = it.next()?.parse().ok()?;
            Some((PathBuf::from(it.next()?), o, n))
        })
        .collect())
}

impl Server {
    /// The object at `/BUCKET/KEY` (or `/NAME`), if there is one.
    fn open_object(&self, path: &str) -> Option<Object> {
        let name = path.trim_start_matches('/');
        if name.contains("..") || name.is_empty() {
            return None;
        }
        // The ETag and the modification time.
        let stamp = |m: std::fs::Metadata| {
            let t = m.modified().map_or(Duration::ZERO, |t| {
                t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
            });
            (format!("\"{}-{}\"", m.len(), t.as_nanos()), t.as_secs())
        };
        let ext = self.root.join(".extents").join(name);
        if let Ok(extents) = read_extents(&ext) {
            let len = extents.iter().map(|e| e.2).sum();
            let (etag, modified) = stamp(std::fs::metadata(&ext).ok()?);
            return Some(Object {
                extents,
                len,
                etag,
                modified,
            });
        }
        let file = self.root.join(name);
        let m = std::fs::metadata(&file).ok().filter(|m| m.is_file())?;
        let len = m.len();
        let (etag, modified) = stamp(m);
        Some(Object {
            extents: vec![(file, 0, len)],
            len,
            etag,
            modified,
        })
    }

    fn upload_dir(&self, id: &str) -> PathBuf {
        self.root.join(".uploads").join(id.replace(['/', '.'], "_"))
    }

    /// `ListObjectsV2` of `/BUCKET`: the objects under `ROOT/BUCKET` and
    /// those uploaded here, a page of [`list_page`].
    fn list(&self, out: &mut TcpStream, req: &Request) -> std::io::Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.shape.latency);
        let bucket = req.path.trim_matches('/');
        let dir = self.root.join(bucket);
        // `.uploads` and `.extents` are the store's own.
        if bucket.is_empty() || bucket.contains('/') || bucket.starts_with('.') || !dir.is_dir() {
            return error(out, "404 Not Found", "NoSuchBucket");
        }
        let mut keys = std::collections::BTreeSet::new();
        keys_under(&dir, "", &mut keys)?;
        keys_under(&self.root.join(".extents").join(bucket), "", &mut keys)?;
        let (prefix, delimiter) = (req.text("prefix"), req.text("delimiter"));
        // A token is the last key a page covered (see `list_page`).
        let token = req.param("continuation-token").map(percent_decode);
        let after = token.clone().unwrap_or_else(|| req.text("start-after"));
        let max = req
            .param("max-keys")
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_KEYS)
            .min(MAX_KEYS);
        let page = list_page(&keys, &prefix, &delimiter, &after, max);
        // With `encoding-type=url` the names go percent-encoded, then (as
        // every text) XML-escaped.
        let url = req.param("encoding-type") == Some("url");
        let name = |s: &str| if url { percent_encode(s) } else { s.to_owned() };
        let contents = page
            .objects
            .iter()
            // A key listed but gone (an upload completing) is left out.
            .filter_map(|key| {
                let o = self.open_object(&format!("/{bucket}/{key}"))?;
                Some(Contents {
                    key: name(key),
                    last_modified: iso_date(o.modified),
                    etag: o.etag,
                    size: o.len,
                    storage_class: "STANDARD",
                })
            })
            .collect();
        let result = ListBucketResult {
            name: bucket,
            prefix: name(&prefix),
            key_count: page.objects.len() + page.prefixes.len(),
            max_keys: max,
            is_truncated: page.next.is_some(),
            delimiter: (!delimiter.is_empty()).then(|| name(&delimiter)),
            encoding_type: url.then_some("url"),
            continuation_token: token,
            next_continuation_token: page.next,
            contents,
            common_prefixes: page
                .prefixes
                .iter()
                .map(|p| CommonPrefixes { prefix: name(p) })
                .collect(),
        };
        xml_response(out, "200 OK", &result)
    }

    /// `CreateMultipartUpload`.
    fn create(&self, out: &mut TcpStream, req: &Request) -> std::io::Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.shape.latency);
        let id = format!("up{}", self.next_upload.fetch_add(1, Ordering::Relaxed));
        std::fs::create_dir_all(self.upload_dir(&id))?;
        let path = req.path.trim_start_matches('/');
        let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
        let result = InitiateMultipartUploadResult {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            upload_id: id,
        };
        xml_response(out, "200 OK", &result)
    }

    /// `UploadPart`, or `UploadPartCopy` with `x-amz-copy-source`.
    fn part(&self, out: &mut TcpStream, req: &Request, id: &str) -> std::io::Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.shape.latency);
        let n: u32 = req
            .param("partNumber")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let dir = self.upload_dir(id);
        if !dir.is_dir() {
            return error(out, "404 Not Found", "NoSuchUpload");
        }
        let part = dir.join(format!("{n:05}"));
        let Some(source) = req.header("x-amz-copy-source") else {
            std::fs::write(&part, &req.body)?;
            let len = req.body.len() as u64;
            write_extents(&part.with_extension("ext"), &[(part.clone(), 0, len)])?;
            let etag = format!("\"p{n}-{len}\"");
            return head(out, "200 OK", 0, &[format!("ETag: {etag}")]);
        };
        // `/BUCKET/KEY`, URL-encoded (a `?versionId=` would follow).
        let src = percent_decode(source.split('?').next().unwrap_or(""));
        let Some(object) = self.open_object(&src) else {
            return error(out, "404 Not Found", "NoSuchKey");
        };
        if req
            .header("x-amz-copy-source-if-match")
            .is_some_and(|want| want != object.etag)
        {
            return error(out, "412 Precondition Failed", "PreconditionFailed");
        }
        let Some((a, b)) = req
            .header("x-amz-copy-source-range")
            .and_then(|r| parse_range(r, object.len))
        else {
            return error(out, "400 Bad Request", "InvalidRange");
        };
        // A copy inside the store: a reference, no bytes moved.
        write_extents(&part.with_extension("ext"), &object.slice(a, b))?;
        let result = CopyPartResult {
            etag: format!("\"c{n}-{}\"", b - a),
            last_modified: iso_date(object.modified),
        };
        xml_response(out, "200 OK", &result)
    }

    /// `CompleteMultipartUpload`: the parts the body lists, in order,
    /// where nothing is yet with `If-None-Match: *`.
    fn complete(&self, out: &mut TcpStream, req: &Request, id: &str) -> std::io::Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.shape.latency);
        let dir = self.upload_dir(id);
        let name = req.path.trim_start_matches('/');
        if name.contains("..") || !name.contains('/') {
            return error(out, "400 Bad Request", "InvalidRequest");
        }
        if !dir.is_dir() {
            return error(out, "404 Not Found", "NoSuchUpload");
        }
        if req.header("if-none-match") == Some("*") && self.open_object(&req.path).is_some() {
            return error(out, "412 Precondition Failed", "PreconditionFailed");
        }
        let parts = std::str::from_utf8(&req.body)
            .ok()
            .and_then(|text| instant_xml::from_str::<CompleteMultipartUpload>(text).ok());
        let Some(parts) = parts else {
            return error(out, "400 Bad Request", "MalformedXML");
        };
        let mut extents = Vec::new();
        for p in parts.parts {
            extents.extend(read_extents(
                &dir.join(format!("{:05}.ext", p.part_number)),
            )?);
        }
        // The parts' files stay where they are: the object refers to them.
        write_extents(&self.root.join(".extents").join(name), &extents)?;
        // The ETag the object now has (a HEAD answers the same one: a
        // client checks that nothing replaced the object it completed).
        let etag = self.open_object(&req.path).map(|o| o.etag);
        let (bucket, key) = name.split_once('/').unwrap_or((name, ""));
        let result = CompleteMultipartUploadResult {
            bucket,
            key,
            etag: etag.as_deref().unwrap_or("\"done\""),
        };
        xml_response(out, "200 OK", &result)
    }
}

/// An S3 error response.
fn error(out: &mut TcpStream, status: &str, code: &str) -> std::io::Result<()> {
    eprintln!("serve: {status} {code}");
    xml_response(out, status, &ErrorBody { code })
}

/// The namespace of S3's XML documents (errors aside).
const S3_NS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

/// A response whose body is `doc` as XML, after the declaration S3 sends.
fn xml_response(out: &mut TcpStream, status: &str, doc: &impl ToXml) -> std::io::Result<()> {
    let body = xml_document(doc)?;
    head(out, status, body.len() as u64, &[])?;
    out.write_all(body.as_bytes())
}

fn xml_document(doc: &impl ToXml) -> std::io::Result<String> {
    let xml = instant_xml::to_string(doc).map_err(std::io::Error::other)?;
    Ok(format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>{xml}"))
}

// The documents, as AWS's API reference spells them (and in its
// namespace); texts are escaped by instant-xml.

/// `ListObjectsV2`'s answer.
#[derive(ToXml)]
#[xml(rename = "ListBucketResult", ns(S3_NS))]
struct ListBucketResult<'a> {
    #[xml(rename = "Name")]
    name: &'a str,
    #[xml(rename = "Prefix")]
    prefix: String,
    #[xml(rename = "KeyCount")]
    key_count: usize,
    #[xml(rename = "MaxKeys")]
    max_keys: usize,
    #[xml(rename = "IsTruncated")]
    is_truncated: bool,
    #[xml(rename = "Delimiter")]
    delimiter: Option<String>,
    #[xml(rename = "EncodingType")]
    encoding_type: Option<&'static str>,
    #[xml(rename = "ContinuationToken")]
    continuation_token: Option<String>,
    #[xml(rename = "NextContinuationToken")]
    next_continuation_token: Option<String>,
    contents: Vec<Contents>,
    common_prefixes: Vec<CommonPrefixes>,
}

#[derive(ToXml)]
#[xml(rename = "Contents", ns(S3_NS))]
struct Contents {
    #[xml(rename = "Key")]
    key: String,
    #[xml(rename = "LastModified")]
    last_modified: String,
    #[xml(rename = "ETag")]
    etag: String,
    #[xml(rename = "Size")]
    size: u64,
    #[xml(rename = "StorageClass")]
    storage_class: &'static str,
}

#[derive(ToXml)]
#[xml(rename = "CommonPrefixes", ns(S3_NS))]
struct CommonPrefixes {
    #[xml(rename = "Prefix")]
    prefix: String,
}

/// `CreateMultipartUpload`'s answer (read by [`upload`] too).
#[derive(ToXml, FromXml)]
#[xml(rename = "InitiateMultipartUploadResult", ns(S3_NS))]
struct InitiateMultipartUploadResult {
    #[xml(rename = "Bucket")]
    bucket: String,
    #[xml(rename = "Key")]
    key: String,
    #[xml(rename = "UploadId")]
    upload_id: String,
}

/// `UploadPartCopy`'s answer.
#[derive(ToXml)]
#[xml(rename = "CopyPartResult", ns(S3_NS))]
struct CopyPartResult {
    #[xml(rename = "ETag")]
    etag: String,
    #[xml(rename = "LastModified")]
    last_modified: String,
}

/// `CompleteMultipartUpload`'s request body (as rusty-s3 and [`upload`]
/// send it, without a namespace; the ETags are not checked).
#[derive(ToXml, FromXml)]
#[xml(rename = "CompleteMultipartUpload")]
struct CompleteMultipartUpload {
    parts: Vec<Part>,
}

#[derive(ToXml, FromXml)]
#[xml(rename = "Part")]
struct Part {
    #[xml(rename = "PartNumber")]
    part_number: u32,
    #[xml(rename = "ETag")]
    etag: Option<String>,
}

/// `CompleteMultipartUpload`'s answer.
#[derive(ToXml)]
#[xml(rename = "CompleteMultipartUploadResult", ns(S3_NS))]
struct CompleteMultipartUploadResult<'a> {
    #[xml(rename = "Bucket")]
    bucket: &'a str,
    #[xml(rename = "Key")]
    key: &'a str,
    #[xml(rename = "ETag")]
    etag: &'a str,
}

/// An error's body.
#[derive(ToXml)]
#[xml(rename = "Error")]
struct ErrorBody<'a> {
    #[xml(rename = "Code")]
    code: &'a str,
}

/// S3's most keys in one page of a listing (and its default).
const MAX_KEYS: usize = 1000;

/// The keys of the files under `dir` (following symbolic links to
/// files, not to directories), each `rel` + its path; none if `dir` is
/// not there.
fn keys_under(
    dir: &Path,
    rel: &str,
    keys: &mut std::collections::BTreeSet<String>,
) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r?,
    };
    for e in entries {
        let e = e?;
        let key = format!("{rel}{}", e.file_name().to_string_lossy());
        if e.file_type()?.is_dir() {
            keys_under(&e.path(), &format!("{key}/"), keys)?;
        } else if e.path().is_file() {
            keys.insert(key);
        }
    }
    Ok(())
}

/// One page of a listing.
#[derive(Debug, PartialEq)]
struct Page {
    /// Keys listed as objects.
    objects: Vec<String>,
    /// Common prefixes (each ends with the delimiter), in order.
    prefixes: Vec<String>,
    /// The continuation token when there is more: the last key this
    /// page covered (a common prefix covers all the keys under it).
    next: Option<String>,
}

/// The keys of `keys` (sorted) that start with `prefix` and sort after
/// `after`, those with `delimiter` after the prefix rolled up into one
/// common prefix each, `max` entries at most.
fn list_page(
    keys: &std::collections::BTreeSet<String>,
    prefix: &str,
    delimiter: &str,
    after: &str,
    max: usize,
) -> Page {
    let mut page = Page {
        objects: Vec::new(),
        prefixes: Vec::new(),
        next: None,
    };
    let mut last = None;
    let from = std::ops::Bound::Excluded(after.to_owned());
    for key in keys.range((from, std::ops::Bound::Unbounded)) {
        let Some(rest) = key.strip_prefix(prefix) else {
            if key.as_str() > prefix {
                break;
            }
            continue;
        };
        let rolled = (!delimiter.is_empty())
            .then(|| rest.find(delimiter))
            .flatten()
            .map(|i| format!("{prefix}{}", &rest[..i + delimiter.len()]));
        if rolled.is_some() && rolled.as_ref() == page.prefixes.last() {
            last = Some(key);
            continue;
        }
        if page.objects.len() + page.prefixes.len() == max {
            page.next = last.filter(|_| max > 0).cloned();
            break;
        }
        match rolled {
            Some(p) => page.prefixes.push(p),
            None => page.objects.push(key.clone()),
        }
        last = Some(key);
    }
    page
}

/// `%XX` escapes decoded (as UTF-8, lossily); a `%` not followed by two
/// hex digits stays as it is.
fn percent_decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// What S3's `encoding-type=url` leaves as it is: the unreserved
/// characters of RFC 3986 and `/`.
const URL_KEEPS: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Every byte but the unreserved ones and `/` as `%XX` (S3's
/// `encoding-type=url`).
fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, URL_KEEPS).to_string()
}

/// Seconds since the epoch as a timestamp (the epoch itself for one past
/// what jiff holds, the year 9999).
fn timestamp(secs: u64) -> jiff::Timestamp {
    i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// An HTTP date (RFC 9110, `Last-Modified`): `Sun, 06 Dec 2026 14:11:45 GMT`.
fn http_date(secs: u64) -> String {
    jiff::fmt::rfc2822::DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&timestamp(secs))
        .unwrap_or_default()
}

/// An ISO 8601 time in UTC (a listing's `LastModified`):
/// `2026-12-06T14:11:45.000Z`.
fn iso_date(secs: u64) -> String {
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S.000Z", timestamp(secs)).unwrap_or_default()
}

fn head(out: &mut TcpStream, status: &str, len: u64, extra: &[String]) -> std::io::Result<()> {
    let mut h = format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\n");
    for e in extra {
        h.push_str(e);
        h.push_str("\r\n");
    }
    h.push_str("\r\n");
    out.write_all(h.as_bytes())
}

/// `bytes=a-b` (inclusive) or `bytes=a-`, within `len`: `(start, end)`
/// exclusive.
fn parse_range(r: &str, len: u64) -> Option<(u64, u64)> {
    let spec = r.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.parse().ok()?;
    let end = if b.is_empty() {
        len
    } else {
        b.parse::<u64>().ok()?.saturating_add(1).min(len)
    };
    (start < end).then_some((start, end))
}

/// The download peer: the whole object at `url` (`http://127.0.0.1:P/NAME`)
/// into `out`, by `threads` ranged GETs of `part` bytes at a time (as
/// `aws s3 cp` fetches a large object).
pub fn download(url: &str, out: &Path, threads: usize, part: u64) -> std::io::Result<u64> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("http:// URLs only"))?;
    let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = format!("/{path}");
    let len = {
        let mut c = TcpStream::connect(addr)?;
        write!(
            c,
            "HEAD {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut s = String::new();
        c.read_to_string(&mut s)?;
        s.lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| std::io::Error::other(format!("no length for {url}")))?
    };
    let file = std::fs::File::create(out)?;
    file.set_len(len)?;
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (next, file, path) = (&next, &file, &path);
                s.spawn(move || -> std::io::Result<()> {
                    let conn = TcpStream::connect(addr)?;
                    let mut reader = BufReader::new(conn.try_clone()?);
                    let mut conn = conn;
                    let mut buf = Vec::new();
                    loop {
                        let at = next.fetch_add(part, Ordering::Relaxed);
                        if at >= len {
                            return Ok(());
                        }
                        let end = (at + part).min(len);
                        write!(
                            conn,
                            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nRange: bytes={at}-{}\r\n\r\n",
                            end - 1
                        )?;
                        let mut n = None;
                        loop {
                            let mut h = String::new();
                            reader.read_line(&mut h)?;
                            if h.trim().is_empty() {
                                break;
                            }
                            if let Some(v) = h.strip_prefix("Content-Length: ") {
                                n = v.trim().parse::<usize>().ok();
                            }
                        }
                        let n = n.ok_or_else(|| std::io::Error::other("no Content-Length"))?;
                        buf.resize(n, 0);
                        reader.read_exact(&mut buf)?;
                        file.write_all_at(&buf, at)?;
                    }
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("panic")))
        })
    })?;
    Ok(len)
}

/// One request on a new connection to `addr`; the answer's status line
/// and body.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(String, Vec<u8>)> {
    let mut c = TcpStream::connect(addr)?;
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    c.write_all(body)?;
    let mut resp = Vec::new();
    c.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let status = String::from_utf8_lossy(&resp[..split])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    Ok((status, resp[split..].to_vec()))
}

/// The upload peer: `file` to `url` (`http://127.0.0.1:P/BUCKET/KEY` of
/// `serve`) as a multipart upload of `part`-byte parts, `threads` at a
/// time (as `aws s3 cp` uploads a large file).
pub fn upload(file: &Path, url: &str, threads: usize, part: u64) -> std::io::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("http:// URLs only"))?;
    let (addr, key) = rest.split_once('/').unwrap_or((rest, ""));
    let path = format!("/{key}");
    let (status, body) = request(addr, "POST", &format!("{path}?uploads"), b"")?;
    let id = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| instant_xml::from_str::<InitiateMultipartUploadResult>(text).ok())
        .ok_or_else(|| std::io::Error::other(format!("no upload id: {status}")))?
        .upload_id;
    let f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    let count = len.div_ceil(part).max(1);
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (next, f, path, id) = (&next, &f, &path, &id);
                s.spawn(move || -> std::io::Result<()> {
                    let mut buf = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= count {
                            return Ok(());
                        }
                        let at = k * part;
                        buf.resize((part.min(len - at)) as usize, 0);
                        f.read_exact_at(&mut buf, at)?;
                        let q = format!("{path}?partNumber={}&uploadId={id}", k + 1);
                        let (status, _) = request(addr, "PUT", &q, &buf)?;
                        if !status.contains(" 200 ") {
                            return Err(std::io::Error::other(format!("part {k}: {status}")));
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("panic")))
        })
    })?;
    let parts = (1..=count)
        .map(|n| Part {
            part_number: n as u32,
            etag: Some("\"x\"".into()),
        })
        .collect();
    let xml = instant_xml::to_string(&CompleteMultipartUpload { parts })
        .map_err(std::io::Error::other)?;
    let (status, _) = request(
        addr,
        "POST",
        &format!("{path}?uploadId={id}"),
        xml.as_bytes(),
    )?;
    if !status.contains(" 200 ") {
        return Err(std::io::Error::other(format!("complete: {status}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_in_both_formats() {
        for (secs, http, iso) in [
            (
                0,
                "Thu, 01 Jan 1970 00:00:00 GMT",
                "1970-01-01T00:00:00.000Z",
            ),
            (
                951_782_400,
                "Tue, 29 Feb 2000 00:00:00 GMT",
                "2000-02-29T00:00:00.000Z",
            ),
            (
                1_796_566_268,
                "Sun, 06 Dec 2026 14:11:08 GMT",
                "2026-12-06T14:11:08.000Z",
            ),
            // 2100 is not a leap year.
            (
                4_107_542_400,
                "Mon, 01 Mar 2100 00:00:00 GMT",
                "2100-03-01T00:00:00.000Z",
            ),
            (
                4_133_980_799,
                "Fri, 31 Dec 2100 23:59:59 GMT",
                "2100-12-31T23:59:59.000Z",
            ),
        ] {
            assert_eq!(
                (http_date(secs).as_str(), iso_date(secs).as_str()),
                (http, iso),
                "{secs}"
            );
        }
    }

    /// The documents read as S3's do, by the client sessionfs uses: a
    /// listing (names escaped, or percent-encoded with
    /// `encoding-type=url`), an upload's id; a completion as rusty-s3 and
    /// the upload peer send it is read.
    #[test]
    fn xml_documents_read_as_s3s() {
        let odd = ["a&b<c>\"d'.packet", "dir/ü x+y%2F.packet"];
        for url in [false, true] {
            let name = |s: &str| if url { percent_encode(s) } else { s.to_owned() };
            let doc = ListBucketResult {
                name: "bkt",
                prefix: name(""),
                key_count: 3,
                max_keys: 1000,
                is_truncated: true,
                delimiter: Some(name("/")),
                encoding_type: url.then_some("url"),
                continuation_token: None,
                next_continuation_token: Some("a&b".into()),
                contents: odd
                    .iter()
                    .map(|k| Contents {
                        key: name(k),
                        last_modified: iso_date(0),
                        etag: "\"e1\"".into(),
                        size: 7,
                        storage_class: "STANDARD",
                    })
                    .collect(),
                common_prefixes: vec![CommonPrefixes {
                    prefix: name("p&q/"),
                }],
            };
            let xml = xml_document(&doc).unwrap();
            assert_eq!(xml.matches("xmlns=").count(), 1, "{xml}");
            let parsed = rusty_s3::actions::ListObjectsV2::parse_response(&xml).unwrap();
            let keys: Vec<&str> = parsed.contents.iter().map(|c| c.key.as_str()).collect();
            assert_eq!(keys, odd, "{xml}");
            assert_eq!(parsed.contents[0].etag, "\"e1\"");
            assert_eq!(parsed.contents[0].last_modified, "1970-01-01T00:00:00.000Z");
            assert_eq!(parsed.common_prefixes[0].prefix, "p&q/");
            assert_eq!(parsed.next_continuation_token.as_deref(), Some("a&b"));
        }
        let xml = xml_document(&InitiateMultipartUploadResult {
            bucket: "bkt".into(),
            key: "a&b".into(),
            upload_id: "up7".into(),
        })
        .unwrap();
        let parsed = rusty_s3::actions::CreateMultipartUpload::parse_response(&xml).unwrap();
        assert_eq!(parsed.upload_id(), "up7");
        // rusty-s3's body (its own test's), and the upload peer's.
        let sent = "<CompleteMultipartUpload><Part><ETag>123456789</ETag><PartNumber>1</PartNumber></Part><Part><ETag>abcdef</ETag><PartNumber>2</PartNumber></Part></CompleteMultipartUpload>";
        let ours = instant_xml::to_string(&CompleteMultipartUpload {
            parts: (1..=3)
                .map(|n| Part {
                    part_number: n,
                    etag: Some("\"x\"".into()),
                })
                .collect(),
        })
        .unwrap();
        for (body, want) in [(sent, vec![1, 2]), (&ours, vec![1, 2, 3])] {
            let got: CompleteMultipartUpload = instant_xml::from_str(body).unwrap();
            let numbers: Vec<u32> = got.parts.iter().map(|p| p.part_number).collect();
            assert_eq!(numbers, want, "{body}");
        }
        // A copy's ETag, quoted and escaped as AWS sends it.
        let xml = xml_document(&CopyPartResult {
            etag: "\"c1-5\"".into(),
            last_modified: iso_date(0),
        })
        .unwrap();
        assert!(xml.contains("<ETag>&quot;c1-5&quot;</ETag>"), "{xml}");
    }

    #[test]
    fn percent_coding_round_trips_and_keeps_slashes() {
        assert_eq!(percent_encode("a b/ü&x.y~"), "a%20b/%C3%BC%26x.y~");
        assert_eq!(percent_decode("a%20b/%C3%BC%26x.y~"), "a b/ü&x.y~");
        assert_eq!(percent_decode("S.packet%2F"), "S.packet/");
        // A lone or short `%` stays as it is.
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4"), "%4");
    }

    #[test]
    fn list_page_rolls_up_at_the_delimiter_and_continues_after_the_token() {
        let keys: std::collections::BTreeSet<String> = [
            "S.packet",
            "S.packet.trace",
            "a.b",
            "a/x",
            "a/y/z",
            "b",
            "c/d",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let s = |v: &[&str]| v.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let page = |prefix, delimiter, after, max| list_page(&keys, prefix, delimiter, after, max);
        // The whole bucket, one level.
        assert_eq!(
            page("", "/", "", 1000),
            Page {
                objects: s(&["S.packet", "S.packet.trace", "a.b", "b"]),
                prefixes: s(&["a/", "c/"]),
                next: None
            }
        );
        // Pages of three, then two: the token is the last key covered, so the common
        // prefix `a/` is not listed twice.
        let first = page("", "/", "", 3);
        assert_eq!(
            (first.objects, first.prefixes),
            (s(&["S.packet", "S.packet.trace", "a.b"]), s(&[]))
        );
        assert_eq!(first.next.as_deref(), Some("a.b"));
        let second = page("", "/", "a.b", 2);
        assert_eq!((second.objects, second.prefixes), (s(&["b"]), s(&["a/"])));
        assert_eq!(second.next.as_deref(), Some("b"));
        let third = page("", "/", "b", 2);
        assert_eq!(
            (third.objects, third.prefixes, third.next),
            (s(&[]), s(&["c/"]), None)
        );
        // A prefix; no delimiter lists every key under it.
        assert_eq!(page("a/", "", "", 1000).objects, s(&["a/x", "a/y/z"]));
        assert_eq!(page("a/", "/", "", 1000).prefixes, s(&["a/y/"]));
        // What s3fs asks to tell a file from a directory: nothing.
        assert_eq!(
            page("S.packet/", "/", "", 1000),
            Page {
                objects: vec![],
                prefixes: vec![],
                next: None
            }
        );
        // max-keys=0 lists nothing and is not truncated.
        assert_eq!(page("", "/", "", 0).next, None);
    }
}
