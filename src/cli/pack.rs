//! `sessionfs pack`: a workspace (and a harness home) into a packet.

use std::path::PathBuf;

use serde::Serialize;

use super::Output;
use super::args::{LimitArgs, file_mode_from_umask, parse_size};
use super::error::CliError;
use super::progress::Progress;
use crate::packet::format::HarnessKind;
use crate::source::pack::{Input, PackOptions, PackOutcome, PackProgress, pack};
use crate::source::tar::TarIn;

/// Pack a workspace, and optionally an agent harness's home, into one
/// deterministic packet.
///
/// Never follows symlinks; rebases absolute symlinks that point into their
/// part; drops sockets, FIFOs and devices; leaves credentials out by default
/// (see docs/CLI.md for the list). Everything left out is reported in the
/// result. The output is written to a temporary file and renamed into place.
///
/// Examples:
///   sessionfs pack --workspace ./repo -o session.packet
///   sessionfs pack --workspace ./repo --harness ~/.codex --harness-kind codex --output s.packet
///   sessionfs pack --workspace ./repo --exclude 'target' --exclude '*.log' -o s.packet
///   sessionfs pack --workspace ./repo --keep '.env.test' -o s.packet   # pack it on purpose
///   sessionfs pack --workspace ./repo --zero-mtimes -o s.packet   # digest of content alone
///   sessionfs pack --workspace ./repo --reject-external-symlinks -o s.packet
///   sessionfs pack --workspace ./repo --hold-memory 64MiB -o s.packet   # a tight pod
///   sessionfs pack --workspace ./repo --file-sha256 -o s.packet   # for a whole-file checksum
///   sessionfs pack --workspace ./repo --packet-version 1 -o s.packet   # for older readers
///   sessionfs pack --workspace ./repo -o s3://bucket/sessions/s.packet   # upload as it writes
///   sessionfs pack --workspace ./repo -o 'packets/{digest}.packet'   # named by its digest
///   sessionfs pack --workspace ./repo -o 's3://bucket/s/{digest}.packet'   # one pack, one upload
///   sessionfs pack --workspace ./big -o s.packet --max-bytes 8GiB --max-entries 1000000
///   sessionfs pack --workspace ./deep -o s.packet --max-path-bytes 8192
///   sessionfs pack --workspace-tar ws.tar -o s.packet   # a tar, never extracted
///   sessionfs pack --workspace-tar - -o s.packet < ws.tar   # or from a pipe (spooled)
///   sessionfs pack --workspace ./repo --harness-tar home.tar --harness-kind codex -o s.packet
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The workspace directory (becomes `workspace/`).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "workspace_tar",
        conflicts_with = "workspace_tar"
    )]
    workspace: Option<PathBuf>,
    /// The workspace as a tar stream (a file, or `-` for standard input),
    /// read as the tree without extracting it, under the rules a directory
    /// gets; a stream from a pipe is spooled to a temporary file in
    /// $TMPDIR (see docs/CLI.md).
    #[arg(long, value_name = "IN")]
    workspace_tar: Option<PathBuf>,
    /// The harness's home directory (becomes `harness/`). Needs
    /// `--harness-kind`: the kind decides which credential files are left
    /// out, so it is never guessed.
    #[arg(
        long,
        value_name = "DIR",
        requires = "harness_kind",
        conflicts_with = "harness_tar"
    )]
    harness: Option<PathBuf>,
    /// The harness's home as a tar stream (a file, or `-`), as
    /// `--workspace-tar` reads one. Needs `--harness-kind`.
    #[arg(long, value_name = "IN", requires = "harness_kind")]
    harness_tar: Option<PathBuf>,
    /// What kind of harness `--harness` (or `--harness-tar`) is; selects
    /// its credential exclusions (`generic`: the workspace's rules only).
    #[arg(long, value_name = "KIND", value_enum)]
    harness_kind: Option<KindArg>,
    /// Where to write the packet: a file, or `s3://BUCKET/KEY` to upload
    /// it as it is written (multipart; nothing is replaced there: see
    /// docs/remote.md). `{digest}` in the file's name (or anywhere in the
    /// key) is replaced with `sha256-<hex>`; a packet already there is
    /// verified, not written again (`already_there`).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Record every mtime as 0 (content-only addressing: the digest then
    /// depends on content and modes alone).
    #[arg(long)]
    zero_mtimes: bool,
    /// Refuse symlinks whose targets leave their part, instead of counting them.
    #[arg(long)]
    reject_external_symlinks: bool,
    /// Leave out entries matching GLOB (repeatable). A pattern with `/`
    /// matches the packet path (`workspace/target`), one without matches
    /// names at any depth (`*.log`, `secrets/`).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Keep entries matching GLOB that a default rule would leave out
    /// (repeatable). Does not override --exclude.
    #[arg(long, value_name = "GLOB")]
    keep: Vec<String>,
    /// Memory for the content of small files, read once and kept from the
    /// hashing pass to the writing pass instead of read again (suffixes
    /// KiB, MiB, GiB). Default: 256 MiB, or a sixteenth of the memory this
    /// process may use (its cgroup's limit, its `ulimit -v`) where that is
    /// less; never more
    /// than half of it. 0 reads every file twice.
    #[arg(long, value_name = "SIZE", env = "SESSIONFS_PACK_HOLD", value_parser = parse_size)]
    hold_memory: Option<u64>,
    /// Also give the SHA-256 of the whole packet file (`file_sha256`): one
    /// more pass over every byte written. The digest already attests every
    /// byte; this is for transports that check whole files.
    #[arg(long)]
    file_sha256: bool,
    #[command(flatten)]
    write: super::args::WriteArgs,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum KindArg {
    Codex,
    Claude,
    Opencode,
    Generic,
}

impl From<KindArg> for HarnessKind {
    fn from(k: KindArg) -> HarnessKind {
        match k {
            KindArg::Codex => HarnessKind::Codex,
            KindArg::Claude => HarnessKind::Claude,
            KindArg::Opencode => HarnessKind::Opencode,
            KindArg::Generic => HarnessKind::Generic,
        }
    }
}

#[derive(Serialize)]
struct Result {
    output: String,
    #[serde(flatten)]
    outcome: PackOutcome,
    seconds: f64,
}

pub fn run(a: Args) -> std::result::Result<Output, CliError> {
    let started = std::time::Instant::now();
    let limits = a.limits.limits()?;
    let remote = super::location::output(&a.output, "pack -o")?;
    super::location::check_digest_named(&a.output, remote.is_some())?;
    let kind = a
        .harness_kind
        .map_or(HarnessKind::Generic, HarnessKind::from);
    if a.harness_kind.is_some() && a.harness.is_none() && a.harness_tar.is_none() {
        return Err(CliError::usage(
            "--harness-kind names the kind of --harness (or --harness-tar), which is not given",
        ));
    }
    let stdin = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if stdin(&a.workspace_tar) && stdin(&a.harness_tar) {
        return Err(CliError::usage(
            "--workspace-tar - and --harness-tar - cannot both read standard input; give one \
             of them as a file",
        ));
    }
    let workspace = match (a.workspace, a.workspace_tar) {
        (Some(dir), _) => Input::Dir(dir),
        (None, Some(tar)) => Input::Tar(TarIn::from_arg(&tar)),
        (None, None) => return Err(CliError::usage("--workspace or --workspace-tar is needed")),
    };
    let harness = match (a.harness, a.harness_tar) {
        (Some(dir), _) => Some(Input::Dir(dir)),
        (None, Some(tar)) => Some(Input::Tar(TarIn::from_arg(&tar))),
        (None, None) => None,
    };
    let opts = PackOptions {
        workspace,
        harness: harness.map(|h| (h, kind)),
        output: a.output.clone(),
        remote,
        zero_mtimes: a.zero_mtimes,
        reject_external_symlinks: a.reject_external_symlinks,
        exclude: a.exclude,
        keep: a.keep,
        limits,
        mode: file_mode_from_umask(),
        hold_memory: a.hold_memory,
        file_sha256: a.file_sha256,
        version: a.write.packet_version,
        barrier: crate::barrier::from_env(),
    };
    let progress = Progress::bytes("packing", 0);
    let outcome = pack(&opts, &|p| match p {
        PackProgress::Pass(what, total) => progress.restart(what, total),
        PackProgress::Bytes(n) => progress.add(n),
    })?;
    drop(progress);
    tracing::info!(digest = %outcome.digest, entries = outcome.entries, "packed");
    // (An object's location is shown as it was made, `s3://BUCKET/KEY`.)
    let output = match outcome.upload {
        Some(_) => outcome.output.display().to_string(),
        None => crate::packet::path::shown_path(&outcome.output),
    };
    Ok(Output::new(
        "sessionfs.pack-result/2",
        Result {
            output,
            outcome,
            seconds: started.elapsed().as_secs_f64(),
        },
    ))
}
