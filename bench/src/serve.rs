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
//! Also `download`: that peer (8 ranged GETs of 8 MiB at a time).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    requests: AtomicU64,
    bytes: AtomicU64,
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
        requests: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
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
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            // A request body (not expected) is read and dropped.
            if let Some(n) = header("content-length").and_then(|v| v.parse::<u64>().ok()) {
                std::io::copy(&mut (&mut reader).take(n), &mut std::io::sink())?;
            }
            let mut parts = line.split_whitespace();
            let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
            let path = target.split('?').next().unwrap_or("/");
            self.respond(&mut out, method, path, header("range"))?;
            if header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
                return Ok(());
            }
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
                    "{{\"requests\":{},\"bytes\":{}}}",
                    self.requests.load(Ordering::Relaxed),
                    self.bytes.load(Ordering::Relaxed)
                );
                return head(out, "200 OK", body.len() as u64, &[])
                    .and_then(|()| out.write_all(body.as_bytes()));
            }
            ("POST", "/__reset") => {
                self.requests.store(0, Ordering::Relaxed);
                self.bytes.store(0, Ordering::Relaxed);
                return head(out, "200 OK", 0, &[]);
            }
            _ => {}
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.shape.latency);
        let name = path.trim_start_matches('/');
        let file = (!name.contains("..") && !name.is_empty())
            .then(|| std::fs::File::open(self.root.join(name)).ok())
            .flatten();
        let Some(file) = file else {
            return head(out, "404 Not Found", 0, &[]);
        };
        let meta = file.metadata()?;
        let len = meta.len();
        let etag = format!(
            "\"{len}-{}\"",
            meta.modified().map_or(0, |t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            })
        );
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
        extra.push("Accept-Ranges: bytes".into());
        head(out, status, end - start, &extra)?;
        if method == "HEAD" {
            return Ok(());
        }
        let mut buf = vec![0u8; 64 << 10];
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], at)?;
            self.bucket.take(n);
            out.write_all(&buf[..n])?;
            self.bytes.fetch_add(n as u64, Ordering::Relaxed);
            at += n as u64;
        }
        Ok(())
    }
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
