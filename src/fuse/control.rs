//! The control socket of a running mount: how `sessionfs umount`, `status`
//! and `seal` reach the daemon from the mountpoint alone.
//!
//! Location: `$XDG_RUNTIME_DIR/sessionfs/` when set, else
//! `/run/user/<uid>/sessionfs/` when that exists, else `/tmp/sessionfs-<uid>/`;
//! the directory is created mode 0700 and must be owned by the user. In it,
//! `<h>.sock` is the socket of the mount whose canonical mountpoint path
//! hashes (SHA-256, first 16 hex digits) to `<h>`, and `<h>.log` its
//! daemon's log. Only the mounting user (and root) may connect: the daemon
//! checks the peer's credentials.
//!
//! Protocol: one JSON object per line in each direction: a [`Request`]
//! (tagged by `op`), answered by interim [`Progress`] lines (a seal's, when
//! asked) and one [`Reply`] (tagged by `schema`: a result object as the
//! CLI prints it, or a `sessionfs.error/1` object).

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::Digest as _;

use crate::packet::error::ErrorKind;

/// A request to a mount's daemon.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// What the mount serves, and its counters.
    Status,
    /// Unmount; `lazy` detaches a busy mount too.
    Unmount {
        /// Detach now even if busy.
        #[serde(default)]
        lazy: bool,
    },
    /// Seal the merged view into a new packet.
    Seal(SealRequest),
}

/// What to seal, and how: `sessionfs seal MOUNTPOINT`'s options, paths
/// absolute (the daemon's working directory is not the client's).
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct SealRequest {
    /// Where the new packet goes.
    pub output: PathBuf,
    /// Where the receipt goes, if anywhere.
    pub receipt: Option<PathBuf>,
    /// Continue the mount on the new packet.
    pub rebase: bool,
    /// Record every mtime as 0.
    pub zero_mtimes: bool,
    /// Refuse symlinks leaving their part.
    pub reject_external_symlinks: bool,
    /// `--exclude` patterns.
    pub exclude: Vec<String>,
    /// `--keep` patterns.
    pub keep: Vec<String>,
    /// Limits of the new packet.
    pub max_bytes: u64,
    /// Limits of the new packet.
    pub max_entries: u64,
    /// Limits of the new packet.
    pub max_path_bytes: u64,
    /// Mode of the packet file.
    pub mode: u32,
    /// Compute `file_sha256`.
    #[serde(default)]
    pub file_sha256: bool,
    /// Prove every byte the store copies from the parent before the
    /// upload completes (`--verify-copies`).
    #[serde(default)]
    pub verify_copies: bool,
    /// The format version to write (the current one when a client from
    /// before versions leaves it out).
    #[serde(default)]
    pub packet_version: crate::packet::format::Version,
    /// Send [`Progress`] lines before the reply (the client draws them).
    #[serde(default)]
    pub progress: bool,
}

/// The answer to a request: the last line the daemon sends.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "schema")]
pub enum Reply {
    /// To [`Request::Status`]: the `sessionfs status` result.
    #[serde(rename = "sessionfs.status-result/2")]
    Status(Status),
    /// To [`Request::Unmount`]: unmounted; the daemon exits once the
    /// reply is sent, letting the upper directory's lock go.
    #[serde(rename = "sessionfs.umount-result/1")]
    Unmounted {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Always true.
        unmounted: bool,
        /// The daemon's pid, to wait for.
        pid: u32,
        /// The upper directory, whose lock to wait for.
        upper: PathBuf,
    },
    /// To [`Request::Seal`]: the `sessionfs seal` result's fields.
    #[serde(rename = "sessionfs.seal-result/2")]
    Sealed(Map<String, Value>),
    /// A refusal: the `sessionfs.error/1` object's fields.
    #[serde(rename = "sessionfs.error/1")]
    Error(Map<String, Value>),
}

impl Reply {
    /// A refusal of `kind` (exit code by kind: usage 2, busy 8, else 6),
    /// naming `path` when there is one.
    pub fn error(kind: ErrorKind, message: &str, path: Option<&Path>) -> Reply {
        let exit_code = match kind {
            ErrorKind::Usage => 2,
            ErrorKind::Busy => 8,
            _ => 6,
        };
        let mut e = Map::new();
        e.insert("kind".into(), kind.as_str().into());
        e.insert("message".into(), message.into());
        if let Some(path) = path {
            e.insert("path".into(), crate::packet::path::shown_path(path).into());
        }
        e.insert("exit_code".into(), exit_code.into());
        Reply::Error(e)
    }

    /// A result or error object as the CLI prints it (`schema` first), as
    /// a reply; an object of no schema the protocol knows is an error.
    pub fn from_value(v: Value) -> Reply {
        let shown = v.to_string();
        serde_json::from_value(v).unwrap_or_else(|e| {
            Reply::error(
                ErrorKind::Internal,
                &format!("not a reply of the control protocol ({e}): {shown}"),
                None,
            )
        })
    }

    /// The reply as the object the CLI prints.
    pub fn into_value(self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The `sessionfs status` result.
#[derive(Serialize, Deserialize, Debug)]
pub struct Status {
    /// The mountpoint.
    pub mountpoint: PathBuf,
    /// The packet served.
    pub packet: PathBuf,
    /// Its digest.
    pub digest: String,
    /// The upper directory.
    pub upper: PathBuf,
    /// The daemon's pid.
    pub pid: u32,
    /// Journal records replayed and appended.
    pub records: u64,
    /// Name lookups the kernel sent.
    pub lookups: u64,
    /// Reads.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes.
    pub writes: u64,
    /// Copy-ups.
    pub copy_ups: u64,
    /// Chunks of files copied up by chunk that their data files took over.
    #[serde(default)]
    pub chunks_held: u64,
    /// Lower bytes hashed so far.
    pub verified_bytes: u64,
    /// Inode numbers whose content was read from offset 0, in order.
    pub read_inodes: Vec<u64>,
    /// Files shown from the host (`mount --secret`).
    pub secrets: Vec<ShownSecret>,
    /// For a remote packet: what was fetched, and from where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<Box<crate::store::spool::SpoolReport>>,
}

/// A file a mount shows from the host (`mount --secret`).
#[derive(Serialize, Deserialize, Debug)]
pub struct ShownSecret {
    /// Its path in the view, relative to the mount's root.
    pub path: String,
    /// The host file.
    pub host: PathBuf,
}

/// An interim line before a seal's reply: bytes written so far.
#[derive(Serialize, Deserialize, Debug)]
pub struct Progress {
    /// The count.
    pub progress: ProgressBytes,
}

/// [`Progress`]'s count.
#[derive(Serialize, Deserialize, Debug)]
pub struct ProgressBytes {
    /// Bytes written so far.
    pub bytes: u64,
}

/// A line from the daemon: an interim one or the reply.
#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Reply(Box<Reply>),
    Progress(Progress),
}

/// The inode number of the initial user namespace (`PROC_USER_INIT_INO`,
/// fixed by the kernel): `/proc/self/ns/user` names another in a user
/// namespace (`unshare --user`, rootless containers).
const INIT_USER_NS: u64 = 0xEFFF_FFFD;

/// The user namespace this process is in, when it is not the initial one:
/// its inode number (from `/proc/self/ns/user`), and `uid` as the parent
/// namespace knows it (from `/proc/self/uid_map`; `uid` itself when the
/// map does not say).
fn user_namespace(uid: u32) -> Option<UserNamespace> {
    let link = std::fs::read_link("/proc/self/ns/user").ok()?;
    let ino: u64 = link
        .to_str()?
        .strip_prefix("user:[")?
        .strip_suffix(']')?
        .parse()
        .ok()?;
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    (ino != INIT_USER_NS).then(|| UserNamespace {
        ino,
        outer_uid: outer_uid(&map, uid).unwrap_or(uid),
    })
}

/// A user namespace other than the initial one.
#[derive(Clone, Copy, Debug)]
struct UserNamespace {
    /// Its inode number.
    ino: u64,
    /// This user's uid in the parent namespace.
    outer_uid: u32,
}

/// `uid` in the parent namespace, from a `uid_map` (lines of "inside
/// outside count").
fn outer_uid(map: &str, uid: u32) -> Option<u32> {
    map.lines().find_map(|line| {
        let mut f = line.split_whitespace().map(|x| x.parse::<u64>().ok());
        let (inside, outside, count) = (f.next()??, f.next()??, f.next()??);
        let uid = u64::from(uid);
        (uid >= inside && uid - inside < count)
            .then(|| u32::try_from(outside + (uid - inside)).ok())
            .flatten()
    })
}

/// The runtime directory of user `uid` when its environment names no
/// `XDG_RUNTIME_DIR`, in user namespace `userns` (`None`: the initial
/// one): `/run/user/<uid>/sessionfs` when `/run/user/<uid>` exists, else
/// `/tmp/sessionfs-<uid>`; in another user namespace always
/// `/tmp/sessionfs-<uid>.userns-<inode>.uid-<uid outside>`: uid 0 there is
/// not the root of the machine, and the directories of the machine's users
/// show there as the overflow user's, which this user may not take. The
/// uid outside is in the name because the kernel gives a namespace's inode
/// number to another once the first is gone: a directory left by another
/// user's namespace would otherwise stop this one.
fn default_runtime_dir(uid: u32, userns: Option<UserNamespace>, run_user_exists: bool) -> PathBuf {
    match userns {
        Some(ns) => PathBuf::from(format!(
            "/tmp/sessionfs-{uid}.userns-{}.uid-{}",
            ns.ino, ns.outer_uid
        )),
        None if run_user_exists => PathBuf::from(format!("/run/user/{uid}/sessionfs")),
        None => PathBuf::from(format!("/tmp/sessionfs-{uid}")),
    }
}

/// The directory holding control sockets and daemon logs for this user.
pub fn runtime_dir() -> io::Result<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("sessionfs"),
        None => default_runtime_dir(
            uid,
            user_namespace(uid),
            Path::new(&format!("/run/user/{uid}")).is_dir(),
        ),
    };
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Err(e) => return Err(e),
        Ok(m) => {
            if !m.is_dir() || m.uid() != uid {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is not a directory owned by uid {uid}; remove it",
                        dir.display()
                    ),
                ));
            }
            if m.mode() & 0o077 != 0 {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            }
        }
    }
    Ok(dir)
}

/// The base name (without extension) for a mountpoint's socket and log:
/// its real path's, found without asking a mount there anything (see
/// `sys::real_path`).
pub fn key(mountpoint: &Path) -> io::Result<String> {
    let real = crate::sys::real_path(mountpoint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: cannot be resolved", mountpoint.display()),
        )
    })?;
    Ok(key_of_canonical(&real))
}

/// Socket path of the mount at `mountpoint`.
pub fn socket_path(mountpoint: &Path) -> io::Result<PathBuf> {
    Ok(runtime_dir()?.join(format!("{}.sock", key(mountpoint)?)))
}

/// Log path of the daemon of the mount at `mountpoint`.
pub fn log_path(mountpoint: &Path) -> io::Result<PathBuf> {
    Ok(runtime_dir()?.join(format!("{}.log", key(mountpoint)?)))
}

/// A daemon's log is moved aside to `<key>.log.1` (replacing the one there)
/// once it has grown past this: when a new daemon starts at that
/// mountpoint, and while a daemon runs (see `cli::logfile`). A mount's logs so
/// take about twice this at most.
pub const LOG_ROTATE_BYTES: u64 = 1 << 20;

/// Logs of no running daemon untouched for this long are removed when a
/// daemon starts: a runtime directory must not fill up with the logs of
/// every mountpoint ever used. (Sockets nobody listens on go at once.)
pub const LOG_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// Empty logs of no running daemon untouched for this long are removed
/// when a daemon starts (a daemon that unmounts removes its own empty log;
/// this is for one that was killed). Not at once: a daemon being started
/// has its log before its socket.
pub const EMPTY_LOG_KEEP: Duration = Duration::from_secs(3600);

/// Opens the log for a new daemon at `mountpoint`, appending to the last
/// one's (rotated past [`LOG_ROTATE_BYTES`]), after removing stale files
/// from the runtime directory (see [`prune`]).
pub fn open_log(mountpoint: &Path) -> io::Result<(std::fs::File, PathBuf)> {
    let path = log_path(mountpoint)?;
    if let Some(dir) = path.parent() {
        prune(dir, LOG_KEEP, std::time::SystemTime::now());
    }
    Ok((append_rotated(&path, LOG_ROTATE_BYTES)?, path))
}

/// Opens `path` for appending, first moving it to `<path>.1` if it holds
/// more than `limit` bytes.
fn append_rotated(path: &Path, limit: u64) -> io::Result<std::fs::File> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() > limit) {
        return start_log_afresh(path);
    }
    append_to(path)
}

/// Moves the log at `path` to `<path>.1` (replacing the one there) and
/// opens a new one there for appending (a log removed meanwhile is begun
/// again).
pub fn start_log_afresh(path: &Path) -> io::Result<std::fs::File> {
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    match std::fs::rename(path, old) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    append_to(path)
}

fn append_to(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Removes from `dir` what no running daemon uses: control sockets
/// (`<key>.sock`) nobody listens on (a killed daemon's), the records of
/// killed daemons (`<key>.json`) as their logs, empty daemon logs
/// (`<key>.log`, `<key>.log.1`) last modified more than [`EMPTY_LOG_KEEP`]
/// before `now`, and other logs more than `keep` before it; the logs of a
/// daemon that answers on its socket stay. Best effort: a file that cannot
/// be removed stays, and nothing else in `dir` is touched.
pub fn prune(dir: &Path, keep: Duration, now: std::time::SystemTime) {
    let Ok(list) = std::fs::read_dir(dir) else {
        return;
    };
    for e in list.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(key) = name
            .strip_suffix(".log")
            .or_else(|| name.strip_suffix(".log.1"))
            .or_else(|| name.strip_suffix(".json"))
            .or_else(|| name.strip_suffix(".sock"))
        else {
            continue;
        };
        if key.len() != 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let stale = e.metadata().is_ok_and(|m| {
            let keep = if m.len() == 0 { EMPTY_LOG_KEEP } else { keep };
            m.modified()
                .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > keep))
        });
        let socket = name.ends_with(".sock");
        if !(stale || socket) || UnixStream::connect(dir.join(format!("{key}.sock"))).is_ok() {
            continue;
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => tracing::debug!(path = %e.path().display(), "removed a stale file"),
            Err(err) => {
                tracing::debug!(path = %e.path().display(), %err, "cannot remove a stale file");
            }
        }
    }
}

/// The base name for a mountpoint already canonical: nothing is asked of
/// the path (a daemon's own mount, before it answers the kernel's
/// `FUSE_INIT`, would make it wait on itself).
pub fn key_of_canonical(mountpoint: &Path) -> String {
    let digest = sha2::Sha256::digest(mountpoint.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..8])
}

/// What a daemon leaves beside its socket (`<key>.json`) while it serves,
/// and after it if it is killed: what it serves, so that `status` can say
/// what became of a mount whose daemon is gone. A daemon that ends
/// cleanly removes it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Record {
    /// The mountpoint (canonical).
    pub mountpoint: PathBuf,
    /// The packet, as shown.
    pub packet: PathBuf,
    /// The upper directory.
    pub upper: PathBuf,
    /// The daemon's pid.
    pub pid: u32,
    /// When it mounted, in seconds since the epoch.
    pub started: u64,
}

impl Record {
    /// Writes the record for the socket at `socket` (`<key>.sock`).
    pub fn save(&self, socket: &Path) {
        let line = serde_json::to_vec(self).unwrap_or_default();
        if let Err(e) = crate::sys::write_atomic(&socket.with_extension("json"), &line) {
            tracing::warn!(error = %e, "cannot leave the mount's record in the runtime directory");
        }
    }

    /// The record beside socket path `socket`, if there is a readable one.
    pub fn load(socket: &Path) -> Option<Record> {
        use std::io::Read;
        // A record is small; a runtime directory is this user's (or, for
        // root, another user's 0700 one), but read no more than that.
        let mut bytes = Vec::new();
        std::fs::File::open(socket.with_extension("json"))
            .ok()?
            .take(64 << 10)
            .read_to_end(&mut bytes)
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Removes the record beside socket path `socket`.
    pub fn remove(socket: &Path) {
        let _ = std::fs::remove_file(socket.with_extension("json"));
    }
}

/// Binds the socket for `mountpoint` (canonical), replacing a stale one (a
/// socket file nobody listens on), refusing if a daemon already answers
/// on it.
pub fn bind(mountpoint: &Path) -> io::Result<(UnixListener, PathBuf)> {
    let path = runtime_dir()?.join(format!("{}.sock", key_of_canonical(mountpoint)));
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "a sessionfs daemon already serves {} ({})",
                    mountpoint.display(),
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok((listener, path))
}

/// Requests being answered; the daemon waits for them before it exits, so
/// an `unmount` request gets its answer although the unmount ends the
/// session.
pub static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Waits (up to `limit`) until no request is being answered.
pub fn drain(limit: Duration) {
    let start = std::time::Instant::now();
    while IN_FLIGHT.load(Ordering::Acquire) > 0 && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// How often a daemon sends a line while it works on a request (a
/// [`Progress`] line with the count so far, 0 for any request but a seal),
/// so that a client can tell a long seal from a daemon that does not
/// answer: [`ANSWER_BOUND`] without a line is the latter.
pub const KEEPALIVE: Duration = Duration::from_secs(2);

/// How long a client waits for the next line of the daemon's answer
/// (docs/CLI.md, "The control socket"): a daemon that sends nothing for so
/// long (stopped, or stuck) is not answering, whatever the request.
pub const ANSWER_BOUND: Duration = Duration::from_secs(10);

/// The client of a request being answered.
pub struct Client<'a> {
    conn: &'a UnixStream,
    /// Writers from several threads (a seal's workers) take turns.
    out: parking_lot::Mutex<()>,
    /// The last count sent, which a keepalive line repeats.
    last: std::sync::atomic::AtomicU64,
}

impl Client<'_> {
    /// Sends an interim line before the reply: a seal's progress.
    pub fn progress(&self, bytes: u64) {
        self.last.store(bytes, Ordering::Relaxed);
        self.send(&Progress {
            progress: ProgressBytes { bytes },
        });
    }

    /// Sends one line: `msg` as JSON.
    fn send(&self, msg: &impl Serialize) {
        let _turn = self.out.lock();
        if let Ok(line) = serde_json::to_string(msg) {
            let _ = (&mut &*self.conn).write_all(format!("{line}\n").as_bytes());
        }
    }

    /// Waits until the client closes the connection (it was killed, or
    /// gave up waiting: nobody will read the answer), and returns true; or
    /// until the other end of `done` is closed, and returns false.
    pub fn gone_before(&self, done: &UnixStream) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        // A hang-up is reported whatever is asked for; a client that only
        // shut down its sending side is still there.
        let hung_up = |fd: &PollFd| {
            fd.revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
        };
        loop {
            let mut fds = [
                PollFd::new(self.conn.as_fd(), PollFlags::empty()),
                PollFd::new(done.as_fd(), PollFlags::empty()),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) if hung_up(&fds[1]) => return false,
                Ok(_) if hung_up(&fds[0]) => return true,
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
    }
}

/// The client of a request, as its handler sees it.
pub type Notify<'a> = &'a Client<'a>;

/// Serves requests until the process exits; `handle` answers each one, and
/// may send [`Progress`] lines first through the [`Client`] it is given, or
/// ask it whether the client is still there.
pub fn serve(
    listener: UnixListener,
    handle: impl Fn(Request, Notify) -> Reply + Send + Sync + 'static,
) {
    let handle = std::sync::Arc::new(handle);
    let me = nix::unistd::geteuid().as_raw();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let allowed = crate::sys::platform::peer_uid(&conn).is_ok_and(|u| u == me || u == 0);
        if !allowed {
            tracing::warn!("control connection from another user refused");
            continue;
        }
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        let handle = handle.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(&conn);
            let mut line = String::new();
            if reader.read_line(&mut line).is_ok() {
                let client = Client {
                    conn: &conn,
                    out: parking_lot::Mutex::new(()),
                    last: std::sync::atomic::AtomicU64::new(0),
                };
                let reply = std::thread::scope(|s| {
                    // A line every KEEPALIVE until the answer is ready.
                    let (done, ended) = std::sync::mpsc::channel::<()>();
                    let keepalive = std::thread::Builder::new()
                        .name("keepalive".into())
                        .spawn_scoped(s, {
                            let client = &client;
                            move || {
                                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                                    ended.recv_timeout(KEEPALIVE)
                                {
                                    client.progress(client.last.load(Ordering::Relaxed));
                                }
                            }
                        });
                    if let Err(e) = keepalive {
                        tracing::warn!(error = %e, "no thread to keep the client informed");
                    }
                    let reply = match serde_json::from_str::<Request>(&line) {
                        Ok(req) => handle(req, &client),
                        Err(e) => Reply::error(
                            ErrorKind::Usage,
                            &format!("bad control request: {e}"),
                            None,
                        ),
                    };
                    drop(done);
                    reply
                });
                client.send(&reply);
            }
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Sends one request to the daemon of `mountpoint` and returns its reply,
/// handing the byte count of each [`Progress`] line to `progress`.
/// `timeout` bounds the wait for each line of the answer (the daemon sends
/// one every [`KEEPALIVE`] while it works, so a long seal is not cut
/// short): a daemon silent for so long fails the request with
/// `io::ErrorKind::TimedOut`.
pub fn request_with_progress(
    mountpoint: &Path,
    req: &Request,
    timeout: Option<Duration>,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Reply> {
    let path = socket_path(mountpoint).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{}: no sessionfs mount here: {e}", mountpoint.display()),
        )
    })?;
    request_at(&path, mountpoint, req, timeout, progress)
}

/// Where the daemon of a mount at `mountpoint` made by user `uid` has its
/// control socket, when that user's environment named no
/// `XDG_RUNTIME_DIR` (see [`runtime_dir`]): what root tries to reach
/// another user's mount.
pub fn socket_paths_of(uid: u32, mountpoint: &Path) -> io::Result<Vec<PathBuf>> {
    let name = format!("{}.sock", key(mountpoint)?);
    let ns = user_namespace(uid);
    Ok([true, false]
        .into_iter()
        .map(|run| default_runtime_dir(uid, ns, run).join(&name))
        .collect())
}

/// [`request_with_progress`] through the socket at `path`.
pub fn request_at(
    path: &Path,
    mountpoint: &Path,
    req: &Request,
    timeout: Option<Duration>,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Reply> {
    let conn = UnixStream::connect(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "no sessionfs daemon answers for {} (control socket {}): {e}",
                mountpoint.display(),
                path.display()
            ),
        )
    })?;
    conn.set_read_timeout(timeout)?;
    conn.set_write_timeout(timeout)?;
    let line = serde_json::to_string(req).map_err(io::Error::other)?;
    (&conn)
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                io::Error::new(io::ErrorKind::TimedOut, e.to_string())
            }
            _ => e,
        })?;
    let mut reader = BufReader::new(&conn);
    let silent = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the sessionfs daemon of {} (control socket {}) sent nothing for {} s: it is \
                 stopped, or stuck",
                mountpoint.display(),
                path.display(),
                timeout.unwrap_or_default().as_secs()
            ),
        ),
        _ => e,
    };
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).map_err(silent)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the control connection without an answer",
            ));
        }
        match serde_json::from_str::<Line>(&line) {
            Ok(Line::Progress(p)) => progress(p.progress.bytes),
            Ok(Line::Reply(r)) => return Ok(*r),
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not a line of the control protocol: {}", line.trim_end()),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn prune_removes_only_stale_files_of_dead_daemons() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let now = SystemTime::now();
        let touch = |name: &str, age: Duration| {
            let mut f = std::fs::File::create(d.join(name)).unwrap();
            f.write_all(b"a line\n").unwrap();
            f.set_modified(now - age).unwrap();
        };
        let empty = |name: &str, age: Duration| {
            let f = std::fs::File::create(d.join(name)).unwrap();
            f.set_modified(now - age).unwrap();
        };
        touch("00000000000000aa.log", 8 * DAY); // stale, no daemon
        touch("00000000000000aa.log.1", 9 * DAY);
        empty("00000000000000aa.sock", 8 * DAY); // a socket file nobody serves
        touch("00000000000000bb.log", DAY); // recent
        empty("00000000000000dd.sock", Duration::ZERO); // a killed daemon's: at once
        empty("00000000000000ee.log", 2 * EMPTY_LOG_KEEP); // empty, of no daemon
        empty("00000000000000ff.log", Duration::from_secs(60)); // a daemon starting
        touch("notes.log", 30 * DAY); // not ours
        touch("00000000000000cc.log", 30 * DAY); // stale, but its daemon lives
        empty("00000000000000c1.log", 2 * EMPTY_LOG_KEEP); // empty, but its daemon lives
        let live = UnixListener::bind(d.join("00000000000000cc.sock")).unwrap();
        let live1 = UnixListener::bind(d.join("00000000000000c1.sock")).unwrap();

        prune(d, LOG_KEEP, now);

        let mut left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "00000000000000bb.log",
                "00000000000000c1.log",
                "00000000000000c1.sock",
                "00000000000000cc.log",
                "00000000000000cc.sock",
                "00000000000000ff.log",
                "notes.log"
            ]
        );
        drop((live, live1));
    }

    #[test]
    fn a_user_namespace_has_a_runtime_directory_of_its_own() {
        let ns = |outer_uid| {
            Some(UserNamespace {
                ino: 4026532001,
                outer_uid,
            })
        };
        let table = [
            (0, None, false, "/tmp/sessionfs-0"),
            (1000, None, true, "/run/user/1000/sessionfs"),
            (
                0,
                ns(1000),
                true,
                "/tmp/sessionfs-0.userns-4026532001.uid-1000",
            ),
            (
                0,
                ns(1000),
                false,
                "/tmp/sessionfs-0.userns-4026532001.uid-1000",
            ),
            // The same namespace number, another user's: another directory.
            (
                0,
                ns(1001),
                false,
                "/tmp/sessionfs-0.userns-4026532001.uid-1001",
            ),
        ];
        for (uid, ns, run, want) in table {
            assert_eq!(default_runtime_dir(uid, ns, run), Path::new(want));
        }
    }

    #[test]
    fn the_uid_outside_comes_from_the_uid_map() {
        let table = [
            ("         0       1000          1\n", 0, Some(1000)),
            ("         0     100000      65536\n", 33, Some(100_033)),
            ("         0     100000      65536\n", 65536, None),
            ("         0          0 4294967295\n", 7, Some(7)),
            ("0 1000 1\n1 100000 65535\n", 5, Some(100_004)),
            ("garbage\n", 0, None),
            ("", 0, None),
        ];
        for (map, uid, want) in table {
            assert_eq!(outer_uid(map, uid), want, "{map:?} {uid}");
        }
    }

    #[test]
    fn a_log_past_the_limit_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("00000000000000aa.log");
        let old = dir.path().join("00000000000000aa.log.1");
        let append = |bytes: &[u8]| append_rotated(&log, 8).unwrap().write_all(bytes).unwrap();
        append(b"first\n"); // 6 bytes: kept
        append(b"second\n"); // appended: 13 bytes, past the limit
        assert_eq!(std::fs::read(&log).unwrap(), b"first\nsecond\n");
        assert!(!old.exists());
        append(b"third\n");
        assert_eq!(std::fs::read(&old).unwrap(), b"first\nsecond\n");
        assert_eq!(std::fs::read(&log).unwrap(), b"third\n");
    }
}
