//! Real S3 for the tests: moto's server on 127.0.0.1, and a proxy of our
//! own between sessionfs and it that counts requests and injects faults.

use std::collections::VecDeque;
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
    pub port: u16,
    _child: Mutex<Child>,
}

/// The Python with moto: the project's .venv (scripts/deps.sh), else the
/// system's.
fn python() -> String {
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python3");
    let has_moto = |py: &str| {
        Command::new(py)
            .args(["-c", "import moto.server"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_moto(venv) {
        return venv.into();
    }
    assert!(
        has_moto("python3"),
        "moto's server is not installed: run scripts/deps.sh (pip install 'moto[server]')"
    );
    "python3".into()
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

/// The shared moto server, started on first use.
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| {
        let port = free_port();
        let script = "import os, sys, threading\n\
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()\n\
from moto.server import main\n\
main(['-H', '127.0.0.1', '-p', sys.argv[1]])\n";
        let child = Command::new(python())
            .args(["-c", script, &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        wait_listening(port, "moto");
        Moto {
            port,
            _child: Mutex::new(child),
        }
    })
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
        let b = bucket_at(self.port, name);
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
        let b = bucket_at(self.port, bucket);
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
        ("AWS_SESSION_TOKEN", TOKEN.into()),
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
    /// Forward it, and flip the bits of the answer's body byte at this
    /// index (a corrupted response).
    Corrupt(usize),
}

/// A proxy on 127.0.0.1 in front of `upstream`: one request per
/// connection (it answers `Connection: close`), each logged as
/// `METHOD PATH range=…`, with faults taken in order from a queue.
pub struct Proxy {
    pub port: u16,
    state: Arc<Mutex<(VecDeque<Fault>, Vec<String>)>>,
    /// Bytes per second each answer's body is sent at (0: as fast as it
    /// comes): a slow link.
    rate: Arc<std::sync::atomic::AtomicU64>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state: Arc<Mutex<(VecDeque<Fault>, Vec<String>)>> = Arc::default();
        let rate: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let (st, r) = (state.clone(), rate.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (st, r) = (st.clone(), r.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, &st, &r);
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
        self.state.lock().unwrap().0.extend(faults);
    }

    /// The requests seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().1.clone()
    }

    /// Drops the faults not yet used.
    pub fn calm(&self) {
        self.state.lock().unwrap().0.clear();
    }

    /// Forgets the requests seen so far.
    pub fn clear(&self) {
        self.state.lock().unwrap().1.clear();
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

/// The head without the headers named in `drop`, plus `Connection: close`.
fn rewrite(head: &str, drop: &[&str]) -> String {
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
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn serve(
    mut client: TcpStream,
    upstream: u16,
    state: &Mutex<(VecDeque<Fault>, Vec<String>)>,
    rate: &std::sync::atomic::AtomicU64,
) -> std::io::Result<()> {
    let (head, mut body) = read_head(&mut client)?;
    let len: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while body.len() < len {
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
    let fault = {
        let mut st = state.lock().unwrap();
        st.1.push(format!(
            "{method} {path} range={}",
            header(&head, "range").unwrap_or("-")
        ));
        st.0.pop_front().unwrap_or(Fault::Pass)
    };
    let mut drop_headers: &[&str] = &[];
    let mut truncate = None;
    let mut corrupt = None;
    match fault {
        Fault::Pass => {}
        Fault::Status(status, code) => {
            let body = format!(
                "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>injected</Message></Error>"
            );
            let resp = format!(
                "HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            return client.write_all(resp.as_bytes());
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
        Fault::IgnoreRange => drop_headers = &["range"],
        Fault::Delay(d) => std::thread::sleep(d),
        Fault::Before(f) => f(),
        Fault::Corrupt(i) => corrupt = Some(i),
    }
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.write_all(rewrite(&head, drop_headers).as_bytes())?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let (rhead, rbody) = resp.split_at(split);
    client.write_all(rewrite(&String::from_utf8_lossy(rhead), &[]).as_bytes())?;
    let keep = truncate.unwrap_or(rbody.len()).min(rbody.len());
    let mut rbody = rbody[..keep].to_vec();
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
        let b = bucket_at(self.port, bucket);
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
    /// (ListMultipartUploads; moto checks no signature).
    pub fn uploads(&self, bucket: &str) -> Vec<String> {
        let url = format!("http://127.0.0.1:{}/{bucket}?uploads", self.port);
        let body = ureq::get(&url)
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
