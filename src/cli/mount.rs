//! `sessionfs mount`: serve a packet with a copy-on-write upper directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Output;
use super::args::{LimitArgs, RemoteArgs, parse_digest};
use super::error::CliError;
use crate::fuse::{control, daemon};
use crate::overlay::{Options, Overlay};
use crate::packet::digest::Digest;
use crate::packet::error::{ErrorClass, ErrorKind};
use crate::packet::path::Part;

/// Mount a packet read-only with a copy-on-write upper directory.
///
/// Checks the manifest (and --digest) in time proportional to the manifest,
/// replays the upper directory's journal, mounts, and returns once the
/// mount is ready, leaving a daemon serving it (so `sessionfs mount … &&
/// agent` works). File content is verified lazily, chunk by chunk, as it is
/// read. Every change goes to the upper directory; the packet is never
/// modified. Unmount with `sessionfs umount MOUNTPOINT` (or SIGTERM to the
/// daemon, or fusermount3 -u).
///
/// Examples:
///   sessionfs mount session.packet /workspace --upper /var/lib/s/upper --part workspace
///   sessionfs mount session.packet ./mnt --upper ./upper --digest sha256:… --foreground
///   sessionfs mount s.packet /workspace --upper /var/lib/s/upper --uid 1000 --gid 1000 --allow-other
///   sessionfs mount big.packet ./mnt --upper ./upper --threads 4
///   sessionfs mount big.packet ./mnt --upper ./upper --max-bytes 8GiB --max-entries 1000000
///   sessionfs mount deep.packet ./mnt --upper ./upper --max-path-bytes 8192
///   sessionfs mount s.packet /session --upper ./up --secret harness/auth.json=./auth.json
///   sessionfs mount s3://sessions/ab12.packet /workspace --upper ./up --part workspace
///   sessionfs mount s3://b/k.packet ./mnt --upper ./up --cache /var/cache/s --cache-size 20GiB
///   sessionfs mount https://h/k.packet ./mnt --upper ./up --max-memory 64MiB --block-size 4MiB
///   sessionfs mount s3://b/k.packet ./mnt --upper ./up --prefetch all
///   sessionfs mount s.packet /session --upper ./up --uid 1000 --gid 1000 --drop-privileges
///   sessionfs mount s.packet /dev/fd/3 --mounted-at /session --upper ./up
///   sessionfs mount s.packet /session --upper ./up --seal-on-term /var/lib/s/last.packet
//
// The options are one type: parsed here, handed to the daemon whole (on
// its standard input, never in its arguments: a presigned URL's query
// stays out of `ps`), and turned into the core's options there.
#[derive(clap::Args, Debug, Serialize, Deserialize)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The packet: a file, `s3://BUCKET/KEY`, or an `http(s)://` URL
    /// (docs/remote.md).
    packet: PathBuf,
    /// An empty directory to mount on; or `/dev/fd/N`, a FUSE connection
    /// another (privileged) process opened and mounted, to serve (with
    /// `--mounted-at`).
    mountpoint: PathBuf,
    /// With `/dev/fd/N`: where that connection is mounted (for the control
    /// socket, `status`, `umount` and symlink rebasing).
    #[arg(long, value_name = "DIR")]
    mounted_at: Option<PathBuf>,
    /// As root: open /dev/fuse and mount here, then serve from a daemon
    /// running as `--uid`/`--gid` with no capabilities and no_new_privs;
    /// this process stays, to unmount for it (docs/pods.md).
    #[arg(long, requires = "uid")]
    drop_privileges: bool,
    /// The upper directory (created if absent, in a directory that exists;
    /// must belong to this packet).
    #[arg(long, value_name = "DIR")]
    upper: PathBuf,
    /// Require this packet digest.
    #[arg(long, value_parser = parse_digest)]
    digest: Option<Digest>,
    /// Mount one part as the root (what a pod wants at /workspace).
    #[arg(long, value_enum)]
    part: Option<PartArg>,
    /// Owner shown for the packet's files, a user id (with `--gid`, as for
    /// `unpack`; default: the mounting user and group).
    #[arg(long, value_name = "N", requires = "gid")]
    uid: Option<u32>,
    /// Group shown for the packet's files, a group id (with `--uid`).
    #[arg(long, value_name = "N", requires = "uid")]
    gid: Option<u32>,
    /// Let other users use the mount (needs root, or user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    allow_other: bool,
    /// Serve in this process until unmounted, instead of returning once ready.
    #[arg(long)]
    foreground: bool,
    /// FUSE dispatch threads (1 to 256; each holds a /dev/fuse descriptor).
    #[arg(long, default_value_t = 2, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Show a host file read-only at this path of the view (a credential:
    /// never copied to the upper directory, never sealed); repeatable.
    #[arg(long = "secret", value_name = "VIEWPATH=HOSTFILE", value_parser = parse_secret)]
    secrets: Vec<(String, PathBuf)>,
    /// On SIGTERM (SIGINT, SIGHUP): refuse every change from then on (EROFS),
    /// seal the view to this file or s3:// object, then unmount once nothing
    /// holds the mount (docs/pods.md).
    #[arg(long, value_name = "FILE")]
    seal_on_term: Option<PathBuf>,
    /// The daemon's log (its stderr), set by the process that starts it.
    #[arg(skip)]
    #[serde(default)]
    log: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// `VIEWPATH=HOSTFILE`, split at the first `=`.
fn parse_secret(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((view, host)) if !view.is_empty() && !host.is_empty() => {
            Ok((view.trim_end_matches('/').to_string(), PathBuf::from(host)))
        }
        _ => Err(format!(
            "`{s}`: write VIEWPATH=HOSTFILE, such as harness/auth.json=/var/run/secrets/codex/auth.json"
        )),
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize, Deserialize)]
enum PartArg {
    Workspace,
    Harness,
}

#[derive(Serialize)]
struct MountResult {
    mountpoint: PathBuf,
    packet: PathBuf,
    digest: Digest,
    upper: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<Part>,
    pid: u32,
    control_socket: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    log: Option<PathBuf>,
    uid: u32,
    gid: u32,
    entries: u64,
    replayed_records: u64,
    seconds: f64,
}

fn mount_error(kind: ErrorKind, message: String, path: &Path) -> CliError {
    CliError::new(
        Some(ErrorClass::Mount),
        kind,
        message,
        Some(crate::packet::path::shown_path(path)),
    )
}

/// Refuses a mountpoint that is not an empty directory, or already served.
/// A FUSE mount there is known from the mount table and not asked
/// anything: one nobody serves (its daemon dead while another process
/// holds its connection, or a connection never initialised) would make
/// any look at it wait forever.
fn check_mountpoint(mp: &Path) -> Result<(), CliError> {
    if let crate::sys::MountAt::Mount(m) = crate::sys::mount_at(mp)
        && let Some(name) = crate::sys::fuse_fsname(&m.fstype, &m.source)
    {
        if !name.starts_with(b"sessionfs:") {
            return Err(mount_error(
                ErrorKind::MountpointUnusable,
                format!(
                    "{}: another FUSE file system is mounted here (type {}, source {}); mount \
                     elsewhere, or unmount it",
                    mp.display(),
                    m.fstype,
                    String::from_utf8_lossy(&m.source)
                ),
                mp,
            ));
        }
        let served = control::socket_path(mp)
            .is_ok_and(|s| std::os::unix::net::UnixStream::connect(s).is_ok());
        let message = if served {
            format!(
                "{}: a sessionfs mount is already served here; unmount it first",
                mp.display()
            )
        } else {
            format!(
                "{}: a sessionfs mount whose daemon is gone (or that no daemon of this user \
                 serves) is still here; detach it first",
                mp.display()
            )
        };
        return Err(mount_error(ErrorKind::AlreadyMounted, message, mp));
    }
    let meta = std::fs::metadata(mp).map_err(|e| {
        // Absolute without touching the path: it answers nothing.
        let at = crate::sys::absolute(mp);
        // A FUSE mount whose daemon died answers ENOTCONN, or
        // ECONNABORTED once the kernel has aborted the connection.
        let dead = matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED));
        if dead && crate::sys::is_sessionfs_mount(&at) {
            mount_error(
                ErrorKind::AlreadyMounted,
                format!(
                    "{}: a sessionfs mount whose daemon is gone is still here ({e}); detach it first",
                    mp.display()
                ),
                mp,
            )
        } else {
            mount_error(ErrorKind::MountpointUnusable, format!("{}: {e}", mp.display()), mp)
        }
    })?;
    if !meta.is_dir() {
        return Err(mount_error(
            ErrorKind::MountpointUnusable,
            format!("{}: not a directory", mp.display()),
            mp,
        ));
    }
    if crate::sys::is_sessionfs_mount(mp) {
        return Err(mount_error(
            ErrorKind::AlreadyMounted,
            format!(
                "{}: a sessionfs mount is already served here; unmount it first",
                mp.display()
            ),
            mp,
        ));
    }
    let mut entries = std::fs::read_dir(mp).map_err(|e| {
        mount_error(
            ErrorKind::MountpointUnusable,
            format!("{}: {e}", mp.display()),
            mp,
        )
    })?;
    if entries.next().is_some() {
        return Err(mount_error(
            ErrorKind::MountpointNotEmpty,
            format!(
                "{}: not empty; mount on an empty directory (nothing under it would be visible)",
                mp.display()
            ),
            mp,
        ));
    }
    Ok(())
}

/// The upper directory must lie apart from the mountpoint: inside it (or
/// it) the mount would hide it, and leave the mountpoint not empty for the
/// next mount; around it, the mount would cover part of it.
fn check_upper_apart(upper: &Path, mp: &Path) -> Result<(), CliError> {
    // The mountpoint is canonical already, and not asked again (a
    // connection handed over waits for this process).
    let (Some(upper_c), mp_c) = (crate::sys::resolved(upper), mp.to_path_buf()) else {
        return Ok(());
    };
    if upper_c.starts_with(&mp_c) || mp_c.starts_with(&upper_c) {
        return Err(CliError::new(
            Some(ErrorClass::Refused),
            ErrorKind::UpperRefused,
            format!(
                "{}: the upper directory must lie outside the mountpoint {} (and not contain \
                 it): the mount would hide it; pick a directory beside it",
                upper.display(),
                mp.display()
            ),
            Some(crate::packet::path::shown_path(upper)),
        ));
    }
    Ok(())
}

/// An upper directory that does not exist yet is created, but not its
/// parent: refuses one whose parent is missing (or no directory), naming
/// the directory to create, before anything is made or started.
fn check_upper_parent(upper: &Path) -> Result<(), CliError> {
    if std::fs::symlink_metadata(upper).is_ok() {
        return Ok(());
    }
    let parent = match upper.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    if std::fs::metadata(parent).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    Err(CliError::new(
        Some(ErrorClass::Refused),
        ErrorKind::TargetUnusable,
        format!(
            "{}: the directory to hold the upper directory, {}, does not exist (or is no \
             directory); only the upper directory itself is created",
            upper.display(),
            parent.display()
        ),
        Some(crate::packet::path::shown_path(parent)),
    )
    .with_hint(format!(
        "create it first (`mkdir -p {}`), or name an upper directory in an existing one",
        parent.display()
    )))
}

/// The hidden `sessionfs daemon` command: a mount's daemon (or its
/// privileged mounter), started by `sessionfs mount`, which hands it the
/// mount's [`Args`] as one JSON line on its standard input.
#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    /// Serve as the unprivileged daemon of a mounter, whose channel is
    /// standard input.
    #[arg(long)]
    mounter: bool,
    /// What `ps` shows: the packet's location without an URL's query, and
    /// the mountpoint. Not read.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    shown: Vec<std::ffi::OsString>,
}

/// What this process is to a mount.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    /// The user's `sessionfs mount`.
    Command,
    /// The daemon `mount` started: it mounts and serves.
    Daemon,
    /// The privileged mounter of an unprivileged daemon.
    Mounter,
    /// The unprivileged daemon of a mounter.
    Served,
}

/// `/dev/fd/N` (libfuse's convention for a connection another process
/// mounted): `N`.
fn fd_mountpoint(mp: &Path) -> Option<i32> {
    let n = mp.to_str()?.strip_prefix("/dev/fd/")?;
    n.parse().ok().filter(|n: &i32| *n > 2)
}

pub fn run(a: Args) -> Result<Output, CliError> {
    run_as(a, Role::Command)
}

/// `sessionfs daemon`: reads the mount's options from standard input and
/// runs as the daemon, or as the mounter of one.
pub fn run_daemon(d: DaemonArgs) -> Result<Output, CliError> {
    let line = crate::daemon::read_line(std::io::stdin().lock())
        .map_err(|e| CliError::usage(format!("cannot read the mount's options: {e}")))?
        .ok_or_else(|| CliError::usage("no mount options on standard input"))?;
    let a: Args = serde_json::from_str(&line)
        .map_err(|e| CliError::usage(format!("not a mount's options: {e}")))?;
    let role = if d.mounter {
        Role::Served
    } else if a.drop_privileges {
        Role::Mounter
    } else {
        Role::Daemon
    };
    run_as(a, role)
}

fn run_as(mut a: Args, role: Role) -> Result<Output, CliError> {
    let started = std::time::Instant::now();
    let limits = a.limits.limits()?;
    let fd = fd_mountpoint(&a.mountpoint);
    if role == Role::Command {
        match (fd, &a.mounted_at) {
            (Some(_), None) => {
                return Err(CliError::usage(format!(
                    "{}: a connection given as /dev/fd/N needs --mounted-at, the directory it is \
                     mounted on",
                    a.mountpoint.display()
                )));
            }
            (Some(_), Some(_)) if a.drop_privileges => {
                return Err(CliError::usage(
                    "--drop-privileges mounts itself; a connection given as /dev/fd/N was \
                     mounted already",
                ));
            }
            (None, Some(_)) => {
                return Err(CliError::usage(
                    "--mounted-at goes with a connection given as /dev/fd/N",
                ));
            }
            _ => {}
        }
        if a.drop_privileges {
            check_drop(&a)?;
        }
        // A mountpoint named through a symlink is mounted where the link
        // leads, and known by that path (to unmount it, in status and
        // mount.json), as the kernel and the mount table know it.
        // A connection handed over is resolved through its parent: the
        // mount on it waits for this process to answer the kernel.
        if let Some(at) = a.mounted_at.as_mut() {
            *at = crate::sys::real_path_beside(at).ok_or_else(|| {
                mount_error(
                    ErrorKind::MountpointUnusable,
                    format!("{}: its directory cannot be resolved", at.display()),
                    at,
                )
            })?;
        } else if let Some(real) = crate::sys::real_path(&a.mountpoint) {
            // Not asked when a mount is there (see check_mountpoint).
            a.mountpoint = real;
        }
        if fd.is_none() {
            check_mountpoint(&a.mountpoint)?;
        }
        let at = a.mounted_at.as_deref().unwrap_or(&a.mountpoint);
        check_upper_apart(&a.upper, at)?;
        check_upper_parent(&a.upper)?;
        if let Some(dest) = a.seal_on_term.as_mut() {
            check_seal_dest(dest)?;
        }
        // A connection handed over is served here: its descriptor is this
        // process's.
        if !a.foreground && fd.is_none() {
            return spawn_daemon(a);
        }
    }
    if a.drop_privileges && matches!(role, Role::Command | Role::Mounter) {
        return run_mounter(a);
    }
    // Where the mount is: the mountpoint, or where the connection handed
    // over is mounted.
    let mountpoint = a.mounted_at.clone().unwrap_or_else(|| a.mountpoint.clone());
    // A daemon without privileges stays so: nothing it runs (fusermount3
    // included) gains any.
    #[cfg(target_os = "linux")]
    if role == Role::Served {
        nix::sys::prctl::set_no_new_privs().map_err(|e| {
            mount_error(
                ErrorKind::MountFailed,
                format!("cannot set no_new_privs: {e}"),
                &mountpoint,
            )
        })?;
    }
    // Before the setup below starts any thread (see daemon::block_signals).
    daemon::block_signals().map_err(|e| {
        mount_error(
            ErrorKind::MountFailed,
            format!("cannot block signals: {e}"),
            &mountpoint,
        )
    })?;
    let (packet, shown) = super::location::open_lower(&a.packet, &limits, &a.remote)?;
    packet
        .check_digest(a.digest.as_ref())
        .map_err(super::location::at_shown(&shown))?;
    let digest = packet.digest;
    let entries = packet.manifest.entries.len() as u64;
    let part = a.part.map(|p| match p {
        PartArg::Workspace => Part::Workspace,
        PartArg::Harness => Part::Harness,
    });
    // Before the upper directory is touched.
    crate::overlay::secret::check(&a.secrets)?;
    if let Some(p) = part.filter(|p| !packet.manifest.has_part(*p)) {
        return Err(CliError::new(
            Some(ErrorClass::Refused),
            ErrorKind::PartMissing,
            format!(
                "{shown}: the packet has no {p} part to mount; mount without --part, or with the part it has"
            ),
            Some(shown.clone()),
        ));
    }
    crate::daemon::wait_for_upper(&a.upper)?;
    let uid = a.uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    let gid = a.gid.unwrap_or_else(|| nix::unistd::getegid().as_raw());
    // An upper directory this mount makes is removed if the mount fails:
    // nothing was served, so nothing is in it but what the mount wrote.
    let made_upper = std::fs::symlink_metadata(&a.upper).is_err();
    let unmake_upper = || {
        if made_upper {
            let _ = std::fs::remove_dir_all(&a.upper);
        }
    };
    let mut overlay = Overlay::mount(packet, &a.upper, Options { uid, gid, part })
        .inspect_err(|_| unmake_upper())?;
    for (view, host) in &a.secrets {
        overlay
            .add_secret(view, host)
            .inspect_err(|_| unmake_upper())?;
    }
    let overlay = Arc::new(overlay);
    raise_fd_limit();
    let replayed = overlay.records();
    let (connection, unmounter) =
        connection(role, fd, &mountpoint, a.allow_other).inspect_err(|_| unmake_upper())?;
    // Stderr is the log the starter opened (see spawn_daemon), moved
    // aside as it grows; a daemon without privileges cannot move it in
    // root's runtime directory, and leaves it be.
    let log = a.log.clone().filter(|_| role != Role::Command);
    if let Some(path) = log.as_ref().filter(|_| role == Role::Daemon) {
        super::logfile::rotate_stderr(path.clone(), control::LOG_ROTATE_BYTES);
    }
    // Where each part is mounted, for rebasing absolute symlinks at seal.
    // Not resolved again when the mount is there already (a connection
    // handed over): it waits for this process to answer the kernel.
    let spellings = |p: &Path| match fd {
        Some(_) => p.to_str().map(str::to_owned).into_iter().collect(),
        None => crate::source::walk::root_spellings(p),
    };
    let roots: std::collections::HashMap<Part, Vec<String>> = match part {
        Some(p) => [(p, spellings(&mountpoint))].into(),
        None => [Part::Workspace, Part::Harness]
            .into_iter()
            .filter(|p| overlay.lower().packet.manifest.has_part(*p))
            .map(|p| (p, spellings(&mountpoint.join(p.as_str()))))
            .collect(),
    };
    // Recorded in the upper directory too, so an offline seal rebases the same links.
    // And which daemon holds it at which mountpoint, for a mount of the
    // same directory to name them (see wait_for_upper).
    crate::overlay::mount_info::MountInfo {
        roots: roots.clone(),
        mountpoint: Some(mountpoint.clone()),
        pid: Some(std::process::id()),
    }
    .save(&a.upper);
    let on_term = a
        .seal_on_term
        .as_ref()
        .map(|dest| seal_on_term(&overlay, dest, &limits, &roots));
    let opts = daemon::ServeOptions {
        mountpoint: mountpoint.clone(),
        allow_other: a.allow_other,
        threads: usize::from(a.threads),
        connection,
        unmounter,
        on_term,
    };
    let result = std::cell::RefCell::new(None);
    let served = daemon::serve(
        overlay,
        opts,
        |ready| {
            let out = Output::new(
                "sessionfs.mount-result/1",
                MountResult {
                    mountpoint: mountpoint.clone(),
                    // Absolute, as `status` gives them: the result is read
                    // where the relative paths may not lead.
                    packet: super::location::absolute(&a.packet),
                    digest,
                    upper: crate::sys::resolved(&a.upper)
                        .unwrap_or_else(|| crate::sys::absolute(&a.upper)),
                    part,
                    pid: std::process::id(),
                    control_socket: ready.socket.clone(),
                    log: log.clone(),
                    uid,
                    gid,
                    entries,
                    replayed_records: replayed,
                    seconds: started.elapsed().as_secs_f64(),
                },
            );
            // The result goes out now: with --foreground the process keeps
            // serving after it, and a daemon's parent is waiting for it.
            if let Err(e) = super::print_output(out) {
                tracing::error!(error = %e, "cannot write the result to stdout");
            }
            *result.borrow_mut() = Some(());
        },
        // A mount's seal: the same code as an offline one.
        move |overlay, req, notify| {
            control::Reply::from_value(
                crate::daemon::seal::handle(
                    overlay,
                    req,
                    &roots,
                    &|| a.remote.reading(),
                    Some(notify),
                    &|_| {},
                )
                .unwrap_or_else(|e| CliError::from(e).to_value()),
            )
        },
    );
    match served {
        Ok(()) => {
            // Unmounted: a log with nothing in it (nothing went wrong at
            // the default level) is of no use to anyone.
            if let Some(path) = &log
                && std::fs::metadata(path).is_ok_and(|m| m.len() == 0)
            {
                let _ = std::fs::remove_file(path);
            }
            Ok(Output::printed())
        }
        Err(e) if result.borrow().is_none() => {
            unmake_upper();
            Err(mount_failed(&e, &mountpoint))
        }
        Err(e) => {
            tracing::error!(error = %e, "the FUSE session ended with an error");
            Ok(Output::printed())
        }
    }
}

/// `--seal-on-term`'s destination, checked now rather than when the pod
/// stops: a local file's directory must exist (the path is made absolute:
/// the daemon's working directory is not this one's), an object's
/// location must parse as one that can be written.
fn check_seal_dest(dest: &mut PathBuf) -> Result<(), CliError> {
    if super::location::output(dest, "mount --seal-on-term")?.is_some() {
        return Ok(());
    }
    *dest = crate::sys::absolute(dest);
    let dir = dest.parent().unwrap_or(Path::new("/"));
    if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(CliError::new(
            Some(ErrorClass::Refused),
            ErrorKind::TargetUnusable,
            format!(
                "{}: --seal-on-term: {}",
                dest.display(),
                crate::output::missing_directory(dir)
            ),
            Some(crate::packet::path::shown_path(dest)),
        ));
    }
    Ok(())
}

/// What the daemon does on SIGTERM before it unmounts, with
/// `--seal-on-term DEST`: refuse every change from then on, and seal the
/// view to `dest` (waiting for changes in progress), so that every write
/// the agent saw succeed is in that packet. The result (or the error) goes
/// to the log, as a warning so that it is kept at the default level.
fn seal_on_term(
    overlay: &Arc<Overlay>,
    dest: &Path,
    limits: &crate::packet::format::Limits,
    roots: &std::collections::HashMap<Part, Vec<String>>,
) -> Box<dyn FnOnce() + Send> {
    let (overlay, roots) = (overlay.clone(), roots.clone());
    let req = control::SealRequest {
        output: dest.to_owned(),
        max_bytes: limits.max_bytes,
        max_entries: limits.max_entries,
        max_path_bytes: limits.max_path_bytes,
        mode: super::args::file_mode_from_umask(),
        ..Default::default()
    };
    Box::new(move || {
        overlay.end_changes();
        // No rebase: how remote packets are read is never asked.
        let reading = || {
            Err(crate::daemon::Error::Usage(
                "no rebase on the way out".into(),
            ))
        };
        match crate::daemon::seal::handle(&overlay, &req, &roots, &reading, None, &|_| {}) {
            Ok(v) => tracing::warn!(result = %v, "sealed on the way out"),
            Err(e) => {
                let e = CliError::from(e);
                tracing::error!(kind = %e.kind, "the seal on the way out failed: {}", e.message);
            }
        }
    })
}

/// How the daemon in `role` has its FUSE connection (descriptor `fd`
/// when the mountpoint named one), and who unmounts it: this process
/// mounts and unmounts; or a connection handed over is served, unmounted
/// by whoever mounted it; or a mounter is asked for both.
fn connection(
    role: Role,
    fd: Option<i32>,
    mountpoint: &Path,
    allow_other: bool,
) -> Result<(daemon::Connection, Option<daemon::Unmounter>), CliError> {
    let refused = |e: std::io::Error| mount_failed(&e, mountpoint);
    #[cfg(target_os = "linux")]
    {
        if let Some(n) = fd {
            let fd = crate::sys::fd::inherited(n).map_err(|e| {
                mount_error(
                    ErrorKind::MountpointUnusable,
                    format!("/dev/fd/{n}: not a FUSE connection handed to this process: {e}"),
                    mountpoint,
                )
            })?;
            return Ok((daemon::Connection::Fd(fd), None));
        }
        if role == Role::Served {
            let link = Arc::new(crate::daemon::mounter::Link::stdin().map_err(refused)?);
            let asker = link.clone();
            let ask: daemon::Connection =
                daemon::Connection::Ask(Box::new(move |fs_name| asker.mount(fs_name)));
            let unmount: daemon::Unmounter = Box::new(move |lazy| link.unmount(lazy));
            return Ok((ask, Some(unmount)));
        }
    }
    // Root mounts itself, as the mounter does (fuser's own mount gives
    // the type `fuse`, not `fuse.sessionfs`); a user mounts through
    // fusermount3 (fuser), which gives `fuse.sessionfs`.
    #[cfg(target_os = "linux")]
    if nix::unistd::geteuid().is_root() {
        let plan = crate::daemon::mounter::Plan {
            mountpoint: mountpoint.to_owned(),
            uid: 0,
            gid: nix::unistd::getegid().as_raw(),
            allow_other,
        };
        let ask: daemon::Asker =
            Box::new(move |fs_name| crate::daemon::mounter::mount(&plan, fs_name));
        return Ok((daemon::Connection::Ask(ask), None));
    }
    let _ = (role, fd, refused, allow_other);
    Ok((daemon::Connection::Mount, None))
}

/// `--drop-privileges` is for root, toward another user.
fn check_drop(a: &Args) -> Result<(), CliError> {
    if !cfg!(target_os = "linux") {
        return Err(CliError::usage(
            "--drop-privileges is for Linux (a mount made with a descriptor)",
        ));
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(CliError::usage(
            "--drop-privileges is for root: it mounts, then serves as --uid/--gid",
        ));
    }
    if a.uid == Some(0) {
        return Err(CliError::usage(
            "--drop-privileges serves as --uid, which must not be root (0)",
        ));
    }
    Ok(())
}

/// The privileged mounter of `a`'s mount (`--drop-privileges`): starts the
/// daemon as `--uid`/`--gid` and prints its result, then mounts and
/// unmounts for it until it ends (see `daemon::mounter`).
#[cfg(target_os = "linux")]
fn run_mounter(a: Args) -> Result<Output, CliError> {
    use crate::daemon::mounter;
    let (uid, gid) = (a.uid.unwrap_or(0), a.gid.unwrap_or(0));
    let plan = mounter::Plan {
        mountpoint: a.mountpoint.clone(),
        uid,
        gid,
        allow_other: a.allow_other,
    };
    let made = mounter::make_upper_for(&a.upper, uid, gid).map_err(|e| {
        CliError::new(
            Some(ErrorClass::Refused),
            ErrorKind::UpperRefused,
            format!(
                "{}: cannot make the upper directory: {e}",
                a.upper.display()
            ),
            Some(crate::packet::path::shown_path(&a.upper)),
        )
    })?;
    let config = serde_json::to_string(&a)
        .map_err(|e| CliError::usage(format!("the mount's options cannot be handed over: {e}")))?;
    let first = Arc::new(parking_lot::Mutex::new(None::<serde_json::Value>));
    let relayed = first.clone();
    let mut args = super::verbose_args();
    args.extend(["daemon".into(), "--mounter".into(), "--".into()]);
    args.extend(shown_args(&a));
    let status = mounter::run(&plan, &config, &args, move |line| {
        let v = serde_json::from_str::<serde_json::Value>(&line).ok();
        if let Some(v) = v.as_ref().filter(|v| v["schema"] != "sessionfs.error/1")
            && let Err(e) = super::print_json(v)
        {
            tracing::error!(error = %e, "cannot write the result to stdout");
        }
        *relayed.lock() = v;
    })
    .map_err(|e| mount_failed(&e, &a.mountpoint))?;
    let first = first.lock().take();
    match first {
        Some(v) if v["schema"] != "sessionfs.error/1" => Ok(Output::printed()),
        other => {
            if made {
                let _ = std::fs::remove_dir_all(&a.upper);
            }
            match other {
                Some(v) => Err(CliError::relayed(v)),
                None => Err(mount_error(
                    ErrorKind::MountFailed,
                    format!("the daemon exited before the mount was ready ({status})"),
                    &a.mountpoint,
                )),
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn run_mounter(_: Args) -> Result<Output, CliError> {
    Err(CliError::usage("--drop-privileges is for Linux"))
}

/// What `ps` shows of a daemon: the packet's location without an URL's
/// query (a presigned URL's signature and token stay out of
/// `/proc/PID/cmdline`, which every user may read) and the mountpoint.
fn shown_args(a: &Args) -> Vec<std::ffi::OsString> {
    let packet = match super::location::parse(&a.packet) {
        Ok(crate::store::Location::Local(p)) => p.into_os_string(),
        Ok(remote) => remote.shown().into(),
        Err(_) => "?".into(),
    };
    vec![packet, a.mountpoint.clone().into_os_string()]
}

/// The error of a mount the kernel (or fusermount3) refused with `e`,
/// saying what is wrong where it can be told: `/dev/fuse` missing, or
/// not open to this user.
fn mount_failed(e: &std::io::Error, mp: &Path) -> CliError {
    use nix::unistd::{AccessFlags, access};
    use std::os::unix::fs::MetadataExt;
    const DEV: &str = "/dev/fuse";
    let (what, hint) = match std::fs::metadata(DEV) {
        Err(_) => (
            format!("{DEV} does not exist"),
            "load the fuse module (`modprobe fuse`), or in a container pass the device \
             (`docker run --device /dev/fuse`, with the capability to mount or fusermount3)"
                .to_owned(),
        ),
        Ok(m) if access(DEV, AccessFlags::R_OK | AccessFlags::W_OK).is_err() => (
            format!(
                "{DEV} (mode {:04o}, owner uid {} gid {}) cannot be opened for reading and \
                 writing by this user (uid {})",
                m.mode() & 0o7777,
                m.uid(),
                m.gid(),
                nix::unistd::geteuid()
            ),
            format!(
                "as root, `chmod 0666 {DEV}` (the mode fuse3 gives it; a udev rule \
                 `KERNEL==\"fuse\", MODE=\"0666\"` keeps it), or add this user to group {} if \
                 the device is group-writable, or mount as root",
                m.gid()
            ),
        ),
        Ok(_) => (
            "is fuse3 installed (fusermount3), and may this user mount?".to_owned(),
            "check that fuse3 is installed, /dev/fuse exists and you may mount (root, or \
             fusermount3), and that the mountpoint is an empty directory not already mounted"
                .to_owned(),
        ),
    };
    mount_error(
        ErrorKind::MountFailed,
        format!("cannot mount on {}: {e}: {what}", mp.display()),
        mp,
    )
    .with_hint(hint)
}

/// Starts `sessionfs daemon` (new process group, stderr to the log) with
/// the mount's options on its standard input, and relays its first line:
/// the mount result or the error.
fn spawn_daemon(mut a: Args) -> Result<Output, CliError> {
    let mountpoint = a.mountpoint.clone();
    let mountpoint = mountpoint.as_path();
    let exe = std::env::current_exe().map_err(|e| {
        mount_error(
            ErrorKind::MountFailed,
            format!("cannot find this executable: {e}"),
            mountpoint,
        )
    })?;
    // A log this mount begins is removed if the daemon refuses the mount:
    // its error object says all the log would.
    let new_log = control::log_path(mountpoint).is_ok_and(|p| !p.exists());
    let (log, log_path) = control::open_log(mountpoint).map_err(|e| {
        mount_error(
            ErrorKind::MountFailed,
            format!("cannot open the daemon's log in the runtime directory: {e}"),
            mountpoint,
        )
    })?;
    a.log = Some(log_path.clone());
    let config = serde_json::to_string(&a)
        .map_err(|e| CliError::usage(format!("the mount's options cannot be handed over: {e}")))?;
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(exe)
        .args(super::verbose_args())
        .arg("daemon")
        .arg("--")
        .args(shown_args(&a))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| {
            mount_error(
                ErrorKind::MountFailed,
                format!("cannot start the daemon: {e}"),
                mountpoint,
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        // A daemon that cannot read it says so on its stdout.
        let _ = stdin.write_all(format!("{config}\n").as_bytes());
    }
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let v: serde_json::Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(_) => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(mount_error(
                ErrorKind::MountFailed,
                format!(
                    "the daemon exited before the mount was ready ({status}); see {}",
                    log_path.display()
                ),
                mountpoint,
            ));
        }
    };
    if v["schema"] == "sessionfs.error/1" {
        let _ = child.wait();
        if new_log {
            let _ = std::fs::remove_file(&log_path);
        }
        return Err(CliError::relayed(v));
    }
    Ok(Output::raw(v))
}

/// Lifts the open-file soft limit to the hard limit: the daemon keeps a
/// bounded cache of data files, but many files may be open at once.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}
