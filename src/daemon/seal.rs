//! The seal a daemon runs for its mount (`sessionfs seal MOUNTPOINT`, a
//! control request), and an offline seal (`seal --packet --upper`) runs
//! alike: the request checked, the overlay sealed, the receipt and the
//! trace written beside the packet, the result object built. Both paths
//! run this code, so they write the same bytes and answer the same
//! object.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::Error;
use crate::fuse::control::{self, SealRequest};
use crate::kind::ErrorKind;
use crate::overlay::Overlay;
use crate::overlay::seal::{RemoteSeal, SealOptions, SealOutcome};
use crate::packet::backing::RemoteReading;
use crate::packet::error::ErrorClass;
use crate::packet::format::Limits;
use crate::packet::path::Part;
use crate::store::{Location, Settings};

/// The result object's schema.
pub const SCHEMA: &str = "sessionfs.seal-result/2";

#[derive(Serialize)]
struct SealResult<'a> {
    schema: &'static str,
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

/// `output` as a location to upload to, with the settings of the
/// environment: `None` for a local path; an `http(s)://` URL cannot be
/// written to.
pub fn remote_output(output: &Path) -> Result<Option<(Location, Settings)>, Error> {
    match Location::parse(output.as_os_str()).map_err(Error::Usage)? {
        Location::Local(_) => Ok(None),
        s3 @ Location::S3 { .. } => {
            let settings = Settings::from_env().map_err(Error::Usage)?;
            Ok(Some((s3, settings)))
        }
        http @ Location::Http(_) => Err(Error::Usage(format!(
            "{}: seal -o writes a file or an s3://BUCKET/KEY object; an http(s) URL cannot be \
             written to (docs/remote.md)",
            http.shown()
        ))),
    }
}

/// Seals `overlay` per `req` and returns the result object: used by the
/// daemon for a mount's seal request, and offline. `roots` gives the
/// absolute spellings of each part's mounted root, for symlink rebasing;
/// `bytes` is told of the bytes written as they go (an offline seal's
/// progress bar), and a daemon's client, `notify`, of their count when it
/// asked for progress. `reading` gives how the mount reads remote packets,
/// asked for when the seal moves it onto an upload (`--rebase`).
pub fn handle(
    overlay: &Overlay,
    req: &SealRequest,
    roots: &HashMap<Part, Vec<String>>,
    reading: &dyn Fn() -> Result<RemoteReading, Error>,
    notify: Option<control::Notify>,
    bytes: &(dyn Fn(u64) + Sync),
) -> Result<Value, Error> {
    let started = std::time::Instant::now();
    tracing::info!(output = %req.output.display(), rebase = req.rebase, "seal requested");
    // A mount's daemon uploads with the AWS configuration it was started
    // with, and moves onto the upload (`--rebase`) as it reads a remote
    // packet: through its cache, with its fetch settings.
    let remote = match remote_output(&req.output)? {
        Some((location, settings)) => Some(RemoteSeal {
            location,
            settings,
            parent: parent_object(),
            verify_copies: req.verify_copies,
            reading: if req.rebase { Some(reading()?) } else { None },
        }),
        None => None,
    };
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
        version: req.packet_version,
        barrier: crate::barrier::from_env(),
        rebase: req.rebase,
        cancel: notify.map(|_| Default::default()),
        remote,
    };
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
        bytes(n);
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
    if let Some(path) = &req.receipt {
        write_receipt(path, &outcome).map_err(|e| {
            Error::failed(
                ErrorKind::Io,
                ErrorClass::Io,
                format!(
                    "{}: cannot write the receipt: {e}; the packet itself was written ({} at {}{})",
                    path.display(),
                    outcome.digest,
                    outcome.output.display(),
                    if req.rebase {
                        ", and the mount now serves it"
                    } else {
                        ""
                    }
                ),
                path,
            )
        })?;
    }
    let trace = write_trace(&outcome.output, &trace, req.mode);
    let result = SealResult {
        schema: SCHEMA,
        outcome: &outcome,
        receipt: req.receipt.as_deref(),
        trace,
        seconds: started.elapsed().as_secs_f64(),
    };
    serde_json::to_value(result).map_err(|e| Error::Failed {
        kind: ErrorKind::Internal,
        class: ErrorClass::Io,
        message: format!("cannot encode the seal's result: {e}"),
        path: None,
        hint: None,
    })
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
    if let Ok(Some((location, settings))) = remote_output(&path) {
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

/// Before anything is written: the receipt's directory exists, and the
/// output is not the packet being served unless the seal rebases onto it
/// (overwriting it would pull the packet from under the mount, and leave
/// the upper directory tied to a packet that no longer exists).
fn check_destinations(overlay: &Overlay, req: &SealRequest, remote: bool) -> Result<(), Error> {
    let refuse = |path: &Path, why: String| {
        Error::failed(
            ErrorKind::TargetUnusable,
            ErrorClass::Refused,
            format!("{}: {why}", path.display()),
            path,
        )
    };
    // (The command checks it first; a request may come from elsewhere.)
    if crate::output::digest_named(&req.output)
        && !remote
        && let Err(why) = crate::output::check_digest_template(&req.output)
    {
        return Err(refuse(&req.output, why));
    }
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
fn write_receipt(path: &Path, o: &SealOutcome) -> std::io::Result<()> {
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
    crate::sys::write_atomic(path, &bytes)
}
