//! `sessionfs seal`: the turn-end checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Output;
use super::args::{LimitArgs, file_mode_from_umask};
use super::error::CliError;
use crate::fuse::control::{self, Reply, Request, SealRequest};
use crate::overlay::seal::{RemoteSeal, SealOptions, SealOutcome};
use crate::overlay::{Options, Overlay};
use crate::packet::error::{ErrorClass, ErrorKind};
use crate::packet::format::Limits;
use crate::packet::path::Part;

/// Seal a mount's merged view (packet + changes) into a new packet.
///
/// With MOUNTPOINT, asks the mount's daemon, found through its control
/// socket: changes on the mount wait for the seal (readers do not), and the
/// packet is written to a temporary file, fsynced and renamed into place.
/// Unchanged files keep their hashes and their bytes are copied from the
/// old packet; only new and changed content is hashed. With --packet and
/// --upper, seals without a daemon (after a crash, or in a controller):
/// byte-identical to what the daemon would write. The same exclusions as
/// `pack` apply to what the agent created (an .env written on the mount is
/// left out and reported).
///
/// Examples:
///   sessionfs seal /workspace -o turn-2.packet --receipt turn-2.receipt.json
///   sessionfs seal /workspace --output turn-3.packet --rebase
///   sessionfs seal --packet turn-1.packet --upper /var/lib/s/upper -o turn-2.packet
///   sessionfs seal --packet s3://b/t1.packet --upper ./up -o t2.packet --cache /var/cache/s
///   sessionfs seal --packet s3://b/t1.packet --upper ./up -o t2.packet --cache-size 20GiB
///   sessionfs seal --packet s3://b/t1.packet --upper ./up -o t2.packet --max-memory 64MiB
///   sessionfs seal --packet s3://b/t1.packet --upper ./up -o t2.packet --block-size 4MiB
///   sessionfs seal --packet s3://b/t1.packet --upper ./up -o t2.packet --prefetch none
///   sessionfs seal /workspace -o turn-2.packet --file-sha256
///   sessionfs seal /workspace -o t.packet --exclude 'target' --keep '.env.test' --zero-mtimes
///   sessionfs seal /workspace -o t.packet --reject-external-symlinks
///   sessionfs seal /workspace -o t.packet --max-bytes 8GiB --max-entries 1000000 --max-path-bytes 8192
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The mountpoint of a running mount.
    #[arg(required_unless_present = "packet", conflicts_with = "packet")]
    mountpoint: Option<PathBuf>,
    /// Offline: the packet the upper directory belongs to (a file, or a
    /// remote location: docs/remote.md).
    #[arg(long, requires = "upper", value_name = "PACKET")]
    packet: Option<PathBuf>,
    /// Offline: the upper directory.
    #[arg(long, requires = "packet", value_name = "DIR")]
    upper: Option<PathBuf>,
    /// Where to write the new packet.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Also write the change receipt (every path added, modified, deleted or
    /// renamed, with old and new content hashes) to FILE.
    #[arg(long, value_name = "FILE")]
    receipt: Option<PathBuf>,
    /// After sealing, continue the mount on the new packet with an empty
    /// upper directory (mounts only).
    #[arg(long, conflicts_with = "packet")]
    rebase: bool,
    /// Record every mtime as 0 (as `pack --zero-mtimes`).
    #[arg(long)]
    zero_mtimes: bool,
    /// Refuse symlinks whose targets leave their part.
    #[arg(long)]
    reject_external_symlinks: bool,
    /// Leave out entries matching GLOB (as for `pack`).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Keep entries matching GLOB that a default rule would leave out.
    #[arg(long, value_name = "GLOB")]
    keep: Vec<String>,
    /// Also give the SHA-256 of the whole packet file (as `pack
    /// --file-sha256`).
    #[arg(long)]
    file_sha256: bool,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    remote: super::args::RemoteArgs,
}

#[derive(Serialize)]
struct Result<'a> {
    #[serde(flatten)]
    outcome: &'a SealOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt: Option<&'a Path>,
    /// The trace sidecar written beside the packet (absent if it could not
    /// be written: the log says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<PathBuf>,
    seconds: f64,
}

impl Args {
    /// Whether this seal runs here (on a packet and an upper directory),
    /// rather than in a mount's daemon.
    pub fn offline(&self) -> bool {
        self.packet.is_some()
    }
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let limits = a.limits.limits()?;
    let remote = super::location::output(&a.output, "seal -o")?.is_some();
    // Bad patterns are usage errors, as for pack, before any daemon is asked.
    crate::source::policy::Policy::new(None, &a.exclude, &a.keep)
        .map_err(|reason| CliError::from(crate::source::Error::Pattern(reason)))?;
    let req = SealRequest {
        output: if remote {
            a.output.clone()
        } else {
            crate::sys::absolute(&a.output)
        },
        receipt: a.receipt.as_deref().map(crate::sys::absolute),
        rebase: a.rebase,
        zero_mtimes: a.zero_mtimes,
        reject_external_symlinks: a.reject_external_symlinks,
        exclude: a.exclude,
        keep: a.keep,
        max_bytes: limits.max_bytes,
        max_entries: limits.max_entries,
        max_path_bytes: limits.max_path_bytes,
        mode: file_mode_from_umask(),
        file_sha256: a.file_sha256,
        progress: false,
    };
    if let (Some(packet), Some(upper)) = (&a.packet, &a.upper) {
        // An offline seal reads an upper directory a mount left; it never
        // makes one (a mistyped path would seal the packet unchanged).
        if std::fs::symlink_metadata(upper.join(crate::overlay::upper::HEADER)).is_err() {
            return Err(CliError::new(
                Some(ErrorClass::Refused),
                ErrorKind::UpperRefused,
                format!(
                    "{}: not the upper directory of a mount (no {} in it): nothing to seal; \
                     pass the --upper a mount of this packet used",
                    upper.display(),
                    crate::overlay::upper::HEADER
                ),
                Some(crate::packet::path::shown_path(upper)),
            ));
        }
        // Right after an unmount, the daemon that served it may still be
        // letting its lock go: waited for as a mount waits.
        super::mount::wait_for_upper(upper)?;
        let (packet, _) = super::location::open_lower(packet, &limits, &a.remote)?;
        // The journal names inodes relative to the root it was mounted with.
        let part = crate::overlay::recorded_part(upper)?;
        let overlay = Overlay::mount(
            packet,
            upper,
            Options {
                uid: 0,
                gid: 0,
                part,
            },
        )?;
        return handle(&overlay, &req, &load_roots(upper), None).map(Output::raw);
    }
    let mp = a.mountpoint.unwrap_or_default();
    for path in std::iter::once(&req.output)
        .filter(|_| !remote)
        .chain(&req.receipt)
    {
        refuse_on_mount(path, &mp)?;
    }
    let bar = super::progress::Progress::bytes("sealing", 0);
    let req = Request::Seal(SealRequest {
        progress: bar.visible(),
        ..req
    });
    let answer = super::umount::ask(&mp, &req, None, &mut |bytes| bar.set(bytes));
    drop(bar);
    match answer {
        Ok(r @ Reply::Sealed(_)) => Ok(Output::raw(r.into_value())),
        Ok(r) => Err(super::error::unexpected_reply(r)),
        Err(e) => Err(super::umount::unreachable(&mp, &e)),
    }
}

/// Seals `overlay` per `req` and returns the result object: used by the
/// daemon for a mount's seal request, and offline. `roots` gives the
/// absolute spellings of each part's mounted root, for symlink rebasing.
pub fn handle(
    overlay: &Overlay,
    req: &SealRequest,
    roots: &HashMap<Part, Vec<String>>,
    notify: Option<control::Notify>,
) -> std::result::Result<Value, CliError> {
    let started = std::time::Instant::now();
    tracing::info!(output = %req.output.display(), rebase = req.rebase, "seal requested");
    // A mount's daemon uploads with the AWS configuration it was started
    // with.
    let remote =
        super::location::output(&req.output, "seal -o")?.map(|(location, settings)| RemoteSeal {
            location,
            settings,
            parent: parent_object(),
        });
    check_destinations(overlay, req, remote.is_some())?;
    // What the turn read, before a rebase moves the view onto the new
    // packet (and starts the next turn's trace).
    let trace = overlay.trace();
    let opts = SealOptions {
        output: req.output.clone(),
        mode: req.mode,
        zero_mtimes: req.zero_mtimes,
        reject_external_symlinks: req.reject_external_symlinks,
        exclude: req.exclude.clone(),
        keep: req.keep.clone(),
        limits: Limits {
            max_bytes: req.max_bytes,
            max_entries: req.max_entries,
            max_path_bytes: req.max_path_bytes,
        },
        roots: roots.clone(),
        file_sha256: req.file_sha256,
        barrier: crate::barrier::from_env(),
        rebase: req.rebase,
        cancel: notify.map(|_| Default::default()),
        remote,
    };
    let progress = super::progress::Progress::bytes("sealing", 0);
    // A client that asked for progress gets the count at once, then at most
    // every 100 ms.
    let done = std::sync::atomic::AtomicU64::new(0);
    let last = parking_lot::Mutex::new(None::<std::time::Instant>);
    let report = |n: u64| {
        if n == 0 {
            // Members without content (directories, empty files) report 0:
            // nothing to tell the client, and a first count of 0 says nothing.
            return;
        }
        progress.add(n);
        let total = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
        if let Some(notify) = notify.filter(|_| req.progress)
            && let Some(mut last) = last.try_lock()
            && last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_millis(100))
        {
            *last = Some(std::time::Instant::now());
            notify.progress(total);
        }
    };
    // A daemon's seal is given up when its client goes away before the
    // packet is placed (killed, or given up by an orchestrator's timeout):
    // nobody would learn that it was written, or that the mount moved.
    let sealed = std::thread::scope(|s| {
        // Closed when the seal is done, which ends the watch at once.
        let mut sealing = None;
        if let (Some(client), Some(cancel)) = (notify, &opts.cancel)
            && let Ok((end, done)) = std::os::unix::net::UnixStream::pair()
        {
            let watch = std::thread::Builder::new()
                .name("seal-client".into())
                .spawn_scoped(s, move || {
                    if client.gone_before(&done) {
                        tracing::warn!(
                            output = %req.output.display(),
                            "the seal's client went away: giving the seal up unless its packet is placed"
                        );
                        cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            // Without a thread (a limit on them) the seal is not watched.
            if watch.is_ok() {
                sealing = Some(end);
            }
        }
        let sealed = overlay.seal(&opts, &report);
        drop(sealing);
        sealed
    });
    if opts
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    {
        // Nobody reads the answer: the log says what became of the seal.
        match &sealed {
            Ok(o) => tracing::warn!(
                output = %req.output.display(),
                digest = %o.digest,
                rebase = req.rebase,
                "the seal ran to its end: its packet was placed before it could be given up"
            ),
            Err(e) => tracing::warn!(
                output = %req.output.display(),
                kind = e.kind().as_str(),
                "the seal ended without its client: {e}"
            ),
        }
    }
    let outcome = sealed?;
    drop(progress);
    if let Some(path) = &req.receipt {
        write_receipt(path, &outcome).map_err(|mut e| {
            e.message = format!(
                "{}; the packet itself was written ({} at {}{})",
                e.message,
                outcome.digest,
                outcome.output.display(),
                if req.rebase {
                    ", and the mount now serves it"
                } else {
                    ""
                }
            );
            e
        })?;
    }
    let trace = write_trace(&outcome.output, &trace, req.mode);
    let out = Output::new(
        "sessionfs.seal-result/2",
        Result {
            outcome: &outcome,
            receipt: req.receipt.as_deref(),
            trace,
            seconds: started.elapsed().as_secs_f64(),
        },
    );
    Ok(out.into_value())
}

/// Writes `trace` beside the packet at `output` (`OUTPUT.trace`, see
/// `crate::packet::trace`), atomically; returns its path. A trace is a
/// hint for the next mount: one that cannot be written is logged, and the
/// seal (its packet placed) succeeds.
fn write_trace(output: &Path, trace: &crate::packet::trace::Trace, mode: u32) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut name = output.as_os_str().to_owned();
    name.push(".trace");
    let path = PathBuf::from(name);
    if let Ok(Some((location, settings))) = super::location::output(&path, "seal -o") {
        return upload_trace(&location, &settings, trace).then_some(path);
    }
    let written = crate::sys::write_atomic(&path, &trace.encode()).and_then(|()| {
        // The packet's own mode (from the umask), not the temporary file's.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o666))
    });
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the trace beside the packet");
            None
        }
    }
}

/// Uploads `trace` to `location` (`KEY.trace` beside a packet uploaded to
/// `KEY`) where nothing is yet: a trace already there (of the same packet,
/// uploaded before) is kept. Whether the trace is there now.
fn upload_trace(
    location: &crate::store::Location,
    settings: &crate::store::Settings,
    trace: &crate::packet::trace::Trace,
) -> bool {
    match crate::store::upload::put_new(location, settings, &trace.encode()) {
        Ok(crate::store::Completion::Created { .. }) => true,
        Ok(crate::store::Completion::Exists) => {
            tracing::info!(
                trace = location.shown(),
                "a trace is already there; it is kept"
            );
            true
        }
        Err(e) => {
            tracing::warn!(trace = location.shown(), error = %e, "cannot upload the trace beside the packet");
            false
        }
    }
}

/// Name of the file in the upper directory that records where the parts
/// were last mounted (see docs/upper-format.md).
const MOUNT_INFO: &str = "mount.json";

/// What `mount.json` records: where each part is mounted, for an offline
/// seal to rebase the same symlinks as the daemon would, and which daemon
/// holds the directory at which mountpoint, for a mount refused by its lock
/// to name them (see docs/upper-format.md).
#[derive(Serialize, Deserialize)]
pub struct MountInfo {
    /// Where each part is mounted.
    pub roots: HashMap<Part, Vec<String>>,
    /// The mountpoint of the daemon that wrote it (absent before 2026-12-06).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mountpoint: Option<PathBuf>,
    /// That daemon's process id (absent before 2026-12-06).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

impl MountInfo {
    /// Records `self` in upper directory `upper`. Best effort: without it
    /// an offline seal stores absolute targets into the mount verbatim,
    /// and a mount refused by the lock cannot name the mount holding it.
    pub fn save(&self, upper: &Path) {
        #[derive(Serialize)]
        struct Versioned<'a> {
            schema: &'static str,
            #[serde(flatten)]
            info: &'a MountInfo,
        }
        let v = Versioned {
            schema: "sessionfs.mount-info/1",
            info: self,
        };
        let line = serde_json::to_string(&v).unwrap_or_default() + "\n";
        if let Err(e) = crate::sys::write_atomic(&upper.join(MOUNT_INFO), line.as_bytes()) {
            tracing::warn!(error = %e, "cannot record the mount in the upper directory");
        }
    }

    /// What upper directory `upper` records, if anything readable.
    pub fn load(upper: &Path) -> Option<MountInfo> {
        let bytes = std::fs::read(upper.join(MOUNT_INFO)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

fn load_roots(upper: &Path) -> HashMap<Part, Vec<String>> {
    MountInfo::load(upper).map(|i| i.roots).unwrap_or_default()
}

/// Refuses a destination on the mount being sealed: the seal holds the
/// mount's changes while it writes, so writing into the mount would wait on
/// itself for good.
fn refuse_on_mount(path: &Path, mountpoint: &Path) -> std::result::Result<(), CliError> {
    use std::os::unix::fs::MetadataExt;
    // Only a served mount has a device of its own to compare with.
    if !super::umount::is_sessionfs_mount(mountpoint) {
        return Ok(());
    }
    let (Some(dir), Ok(mount)) = (path.parent(), std::fs::metadata(mountpoint)) else {
        return Ok(());
    };
    match std::fs::metadata(dir) {
        Ok(d) if d.dev() == mount.dev() => Err(CliError::new(
            Some(ErrorClass::Refused),
            ErrorKind::TargetUnusable,
            format!(
                "{}: is on the mount being sealed ({}); a seal cannot write into the tree \
                 it seals: write it outside the mount",
                path.display(),
                mountpoint.display()
            ),
            Some(crate::packet::path::shown_path(path)),
        )),
        _ => Ok(()),
    }
}

/// Before anything is written: the receipt's directory exists, and the
/// output is not the packet being served unless the seal rebases onto it
/// (overwriting it would pull the packet from under the mount, and leave
/// the upper directory tied to a packet that no longer exists).
fn check_destinations(
    overlay: &Overlay,
    req: &SealRequest,
    remote: bool,
) -> std::result::Result<(), CliError> {
    let refuse = |path: &Path, why: String| {
        CliError::new(
            Some(ErrorClass::Refused),
            ErrorKind::TargetUnusable,
            format!("{}: {why}", path.display()),
            Some(crate::packet::path::shown_path(path)),
        )
    };
    let local_output = std::iter::once(&req.output).filter(|_| !remote);
    for path in local_output.clone().chain(&req.receipt) {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
            return Err(refuse(path, crate::output::missing_directory(dir)));
        }
        if let Some(why) = crate::output::names_a_directory(path) {
            return Err(refuse(path, why.into()));
        }
        // The upper directory holds the session's changes, and nothing
        // else: a file written there could replace its journal or a
        // file's data, or be taken for one.
        if let (Ok(dir), Ok(upper)) = (
            std::fs::canonicalize(dir),
            std::fs::canonicalize(overlay.upper_dir()),
        ) && dir.starts_with(&upper)
        {
            return Err(refuse(
                path,
                format!(
                    "is in the mount's upper directory ({}), which holds the session's \
                     changes and nothing else: write it elsewhere",
                    upper.display()
                ),
            ));
        }
    }
    if let Some(why) = local_output
        .clone()
        .find_map(|o| crate::output::refuse_replacing(o))
    {
        return Err(refuse(&req.output, why));
    }
    if let Some(receipt) = &req.receipt
        && let Some(why) = crate::output::refuse_replacing_receipt(receipt)
    {
        return Err(refuse(receipt, why));
    }
    if let Some(receipt) = &req.receipt
        && !remote
        && (receipt == &req.output || same_file(receipt, &req.output))
    {
        return Err(refuse(
            receipt,
            "is also the output: name the receipt another file".into(),
        ));
    }
    let lower = overlay.lower();
    let is_served = |p: &Path| lower.serves(p);
    if !remote && is_served(&req.output) && !req.rebase {
        return Err(refuse(
            &req.output,
            "is the packet this mount serves: overwriting it would take it from under the \
             mount; write another file, or pass --rebase to serve the new packet"
                .into(),
        ));
    }
    if let Some(receipt) = req.receipt.as_deref().filter(|r| is_served(r)) {
        return Err(refuse(
            receipt,
            "is the packet this mount serves: name the receipt another file".into(),
        ));
    }
    Ok(())
}

/// The parent packet's object in the store, for a seal to copy unchanged
/// runs from: `SESSIONFS_SEAL_COPY_FROM` (`s3://BUCKET/KEY`), a hook for
/// tests and for an offline seal of a downloaded copy of that object. The
/// seal checks that it is the parent before it copies anything. (A mount
/// of a remote packet will give its own.)
fn parent_object() -> Option<crate::store::Location> {
    let v = std::env::var_os("SESSIONFS_SEAL_COPY_FROM")?;
    match crate::store::Location::parse(&v) {
        Ok(l @ crate::store::Location::S3 { .. }) => Some(l),
        _ => {
            tracing::warn!(value = ?v, "SESSIONFS_SEAL_COPY_FROM is not an s3:// location; ignored");
            None
        }
    }
}

/// Whether `a` and `b` both exist and are the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// The receipt: every change, with the digests it goes between.
fn write_receipt(path: &Path, o: &SealOutcome) -> std::result::Result<(), CliError> {
    let receipt = serde_json::json!({
        "schema": "sessionfs.receipt/1",
        "parent": o.parent,
        "digest": o.digest,
        "output": o.output,
        "changes": o.changes,
        "excluded": o.report.excluded,
        "dropped": o.report.dropped,
    });
    let mut bytes = serde_json::to_vec_pretty(&receipt).unwrap_or_default();
    bytes.push(b'\n');
    crate::sys::write_atomic(path, &bytes).map_err(|e| {
        CliError::new(
            Some(ErrorClass::Io),
            ErrorKind::Io,
            format!("{}: cannot write the receipt: {e}", path.display()),
            Some(crate::packet::path::shown_path(path)),
        )
    })
}
