//! `sessionfs seal`: the turn-end checkpoint.

use std::path::{Path, PathBuf};

use super::Output;
use super::args::{LimitArgs, file_mode_from_umask};
use super::error::CliError;
use crate::daemon::client::{ask, unreachable};
use crate::fuse::control::{Reply, Request, SealRequest};
use crate::overlay::mount_info::MountInfo;
use crate::overlay::{Options, Overlay};
use crate::packet::error::{ErrorClass, ErrorKind};

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
///   sessionfs seal /workspace -o s3://b/turn-2.packet --verify-copies
///   sessionfs seal /workspace -o turn-2.packet --packet-version 1   # for older readers
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
    /// Where to write the new packet: a file, or `s3://BUCKET/KEY`.
    /// `{digest}` in the file's name (or anywhere in the key) is replaced
    /// with `sha256-<hex>`; a packet already there is not written again
    /// (`already_there`, but with `--rebase`).
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
    /// With -o s3://…: before the upload completes, fetch and check every
    /// byte the store copies from the parent that this seal (or its mount)
    /// has not seen in the parent's object; a parent whose bytes are not
    /// its manifest's fails the seal, and nothing is left at the key.
    /// Without it, they are checked only when they are 16 MiB or less, and
    /// counted in `unverified_copied_bytes`.
    #[arg(long)]
    verify_copies: bool,
    #[command(flatten)]
    write: super::args::WriteArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    remote: super::args::RemoteArgs,
}

impl Args {
    /// Whether this seal runs here (on a packet and an upper directory),
    /// rather than in a mount's daemon.
    pub fn offline(&self) -> bool {
        self.packet.is_some()
    }
}

/// `p` absolute and normalised, as results give paths.
fn resolved(p: &Path) -> PathBuf {
    crate::sys::resolved(p).unwrap_or_else(|| crate::sys::absolute(p))
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let limits = a.limits.limits()?;
    let remote = super::location::output(&a.output, "seal -o")?.is_some();
    super::location::check_digest_named(&a.output, remote)?;
    // Bad patterns are usage errors, as for pack, before any daemon is asked.
    crate::source::policy::Policy::new(None, &a.exclude, &a.keep)
        .map_err(|reason| CliError::from(crate::source::Error::Pattern(reason)))?;
    let req = SealRequest {
        output: if remote {
            a.output.clone()
        } else {
            resolved(&a.output)
        },
        receipt: a.receipt.as_deref().map(resolved),
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
        verify_copies: a.verify_copies,
        packet_version: a.write.packet_version,
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
        crate::daemon::wait_for_upper(upper)?;
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
        let bar = super::progress::Progress::bytes("sealing", 0);
        let roots = MountInfo::roots_of(upper);
        let sealed = crate::daemon::seal::handle(
            &overlay,
            &req,
            &roots,
            &|| a.remote.reading(),
            None,
            &|n| bar.add(n),
        );
        drop(bar);
        return Ok(Output::raw(sealed?));
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
    // Bounded per line: the daemon sends one every few seconds while it
    // seals, however long the seal.
    let answer = ask(
        &mp,
        &req,
        Some(crate::fuse::control::ANSWER_BOUND),
        &mut |bytes| bar.set(bytes),
    );
    drop(bar);
    match answer {
        Ok(r @ Reply::Sealed(_)) => Ok(Output::raw(r.into_value())),
        Ok(r) => Err(super::error::unexpected_reply(r)),
        Err(e) => Err(unreachable(&mp, &e).into()),
    }
}

/// Refuses a destination on the mount being sealed: the seal holds the
/// mount's changes while it writes, so writing into the mount would wait on
/// itself for good.
fn refuse_on_mount(path: &Path, mountpoint: &Path) -> std::result::Result<(), CliError> {
    use std::os::unix::fs::MetadataExt;
    // The mount's device: from the mount table where there is one, so
    // that a mount nobody serves is not asked (sys::sessionfs_mount_device).
    let Some(mount_dev) = crate::sys::real_path(mountpoint)
        .and_then(|real| crate::sys::sessionfs_mount_device(&real))
    else {
        return Ok(());
    };
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    let on_it = |dev: u64| {
        let (major, minor) = crate::sys::platform::device_numbers(dev);
        mount_dev == format!("{major}:{minor}") || mount_dev == dev.to_string()
    };
    match std::fs::metadata(dir) {
        Ok(d) if on_it(d.dev()) => Err(CliError::new(
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
