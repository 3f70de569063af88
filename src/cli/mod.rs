//! The command line: argument parsing, one file per subcommand, one JSON
//! object on stdout, logs and progress on stderr, documented exit codes.

mod args;
mod digest;
pub mod error;
mod inspect;
mod location;
mod logfile;
mod mount;
mod pack;
mod progress;
mod seal;
mod status;
mod umount;
mod unpack;
mod verify;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::{Map, Value};

use error::{CliError, exit};

const AFTER_HELP: &str = "\
Every command prints exactly one JSON object on stdout (`schema` names its \
version) and logs to stderr.

Exit codes (docs/CLI.md gives the error kinds of each):
  0              success
  1              internal error (a bug; please report it)
  2              bad usage: unknown flag, missing or bad argument, bad pattern
  3              invalid or tampered packet, or not the digest asked for
  4              the packet's schema version is not supported
  5              a limit was exceeded
  6              the operating system refused an operation (I/O)
  7              the input or destination was refused
  8              a mount could not be made or reached
  9              a remote packet (s3://, http(s)://) could not be read or written
  129, 130, 143  stopped by SIGHUP, SIGINT or SIGTERM (128 + the signal)

Examples:
  sessionfs pack --workspace ./repo -o session.packet
  sessionfs verify session.packet --digest sha256:…
  sessionfs unpack session.packet --into ./restored
  sessionfs mount session.packet /workspace --upper ./upper --part workspace && agent";

/// sessionfs: deterministic, verified session packets for AI coding agents.
#[derive(Parser, Debug)]
#[command(
    name = "sessionfs",
    version,
    about,
    after_help = AFTER_HELP,
    propagate_version = true,
    disable_help_flag = true
)]
pub struct Cli {
    /// Print help, with examples (`-h` and `--help` print the same).
    // One help: clap's short `-h` leaves out the long text, which holds
    // each command's examples.
    #[arg(short = 'h', long = "help", action = clap::ArgAction::HelpLong, global = true)]
    help: Option<bool>,
    /// More logging on stderr (-v info, -vv debug). SESSIONFS_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Pack(pack::Args),
    Verify(verify::Args),
    Inspect(inspect::Args),
    Digest(digest::Args),
    Unpack(unpack::Args),
    Mount(mount::Args),
    Umount(umount::Args),
    Status(status::Args),
    Seal(seal::Args),
    /// A mount's daemon, started by `mount` (internal).
    #[command(hide = true)]
    Daemon(mount::DaemonArgs),
}

/// What a subcommand returns: its one result object, or word that it has
/// already printed it (a foreground mount prints when ready, then serves).
pub struct Output(Option<Value>);

impl Output {
    /// A result of `schema` (e.g. `sessionfs.pack-result/1`) from a
    /// serializable struct whose fields become the object's fields.
    pub fn new(schema: &'static str, body: impl serde::Serialize) -> Output {
        let mut m = Map::new();
        m.insert("schema".into(), Value::String(schema.into()));
        if let Ok(Value::Object(fields)) = serde_json::to_value(body) {
            m.extend(fields);
        }
        Output(Some(Value::Object(m)))
    }

    /// A result object received whole (from a daemon).
    pub fn raw(v: Value) -> Output {
        Output(Some(v))
    }

    /// The result was printed already.
    pub fn printed() -> Output {
        Output(None)
    }

    /// The result object.
    pub fn into_value(self) -> Value {
        self.0.unwrap_or(Value::Null)
    }
}

/// Prints a result object now (for commands that keep running after it).
pub fn print_output(out: Output) -> std::io::Result<()> {
    match out.0 {
        Some(v) => print_json(&v),
        None => Ok(()),
    }
}

/// Says on stderr that the result could not be written to stdout, and
/// gives the exit code of that run: the caller would otherwise take a
/// success without its result (`digest > /dev/full`) for a success.
fn unprinted(e: &std::io::Error) -> u8 {
    tracing::error!(
        "cannot write the result to stdout: {e}; what the command did stands (a packet \
         written is in place), but its result is lost: is stdout a full disk or a closed pipe?"
    );
    exit::IO
}

/// Runs the CLI and returns the exit code.
pub fn main() -> ExitCode {
    crate::sys::fit_malloc_to_address_space();
    if args_put_data_on_stdout() {
        stdout_is_data();
    }
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return clap_error(e),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return clap_error(e),
    };
    init_logging(cli.verbose);
    if let Err(message) = crate::barrier::check_env() {
        return report(CliError::usage(message));
    }
    // Commands that write files remove what they half-wrote if stopped.
    // (A seal asked of a mount's daemon goes on there, whatever happens to
    // the client: only an offline seal writes here.)
    let writes = match &cli.command {
        Command::Pack(_) | Command::Unpack(_) => true,
        Command::Seal(a) => a.offline(),
        _ => false,
    };
    if writes && let Err(e) = crate::interrupt::arm(report_interrupt) {
        tracing::warn!(error = %e, "cannot take SIGINT/SIGTERM: an interrupted run may leave a temporary file");
    }
    // The worker threads start here, where failing to is an error like any
    // other: started on first use, rayon would panic (a limit on processes,
    // `ulimit -u` or a container's pids.max, reached). Not for a mount: its
    // daemon blocks the signals it waits for before it starts any thread
    // (a thread started before would take them, see crate::fuse::daemon).
    let pooled = !matches!(
        cli.command,
        Command::Umount(_) | Command::Status(_) | Command::Mount(_) | Command::Daemon(_)
    );
    if pooled && let Err(e) = rayon::ThreadPoolBuilder::new().build_global() {
        return report(CliError::new(
            Some(crate::packet::error::ErrorClass::Io),
            crate::packet::error::ErrorKind::Io,
            format!(
                "cannot start the worker threads: {e}; raise the limit on processes \
                 (`ulimit -u`, or the container's pids.max) or on address space (`ulimit -v`)"
            ),
            None,
        ));
    }
    let pack = matches!(cli.command, Command::Pack(_));
    let result = match cli.command {
        Command::Pack(a) => pack::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Digest(a) => digest::run(a),
        Command::Unpack(a) => unpack::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Umount(a) => umount::run(a),
        Command::Status(a) => status::run(a),
        Command::Seal(a) => seal::run(a),
        Command::Daemon(a) => mount::run_daemon(a),
    };
    match result {
        Ok(out) => {
            let code = crate::interrupt::report(|| match print_output(out) {
                Ok(()) => exit::OK,
                Err(e) => unprinted(&e),
            });
            if pack {
                // Only pack's: every other command's tests would wait here.
                crate::barrier::wait(
                    crate::barrier::from_env().as_deref(),
                    crate::barrier::Point::Reported,
                );
            }
            ExitCode::from(code)
        }
        Err(e) => report(e),
    }
}

/// The error of a run ended by a signal (its exit code is 128 + the
/// signal).
fn report_interrupt(i: crate::interrupt::Interrupted) {
    let done = match (i.removed, i.left) {
        (0, 0) if i.committed => {
            "its output was complete and in place before the signal; only its report was cut short"
                .to_owned()
        }
        (0, 0) => "nothing was half-written".to_owned(),
        (1, 0) => "what it had half-written was removed (1 path)".to_owned(),
        (n, 0) => format!("what it had half-written was removed ({n} paths)"),
        (_, n) => format!("{n} half-written path(s) could not be removed (named above)"),
    };
    let mut e = CliError::usage(format!("interrupted by {}; {done}", i.signal));
    e.kind = crate::packet::error::ErrorKind::Interrupted;
    e.hint = if i.committed {
        "nothing to redo: the output is complete and in place".into()
    } else {
        "run the command again once it may run to the end".into()
    };
    e.exit_code = 128 + i.signal as u8;
    // stdout first: stderr may be the pipe nobody reads that kept the run
    // from ending (see crate::interrupt).
    let _ = print_json(&e.to_value());
    tracing::error!("{}", e.message);
}

/// The subcommand this process runs, when its first argument names one.
fn command_run() -> Option<String> {
    // args_os: `args` panics on an argument that is not UTF-8.
    let first = std::env::args_os().nth(1)?;
    Cli::command()
        .find_subcommand(first.to_str()?)
        .map(|c| c.get_name().to_owned())
}

/// Prints an error: the JSON object on stdout, one line on stderr.
pub fn report(e: CliError) -> ExitCode {
    let code = e.exit_code;
    crate::interrupt::report(|| {
        tracing::error!("{}", e.message);
        if let Err(err) = print_json(&e.to_value()) {
            // The error's own code stands; its message is on stderr.
            tracing::error!("cannot write the error to stdout either: {err}");
        }
        code
    });
    ExitCode::from(code)
}

fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Help and version are for people: plain text, exit 0.
            let _ = e.print();
            ExitCode::from(exit::OK)
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // No command: the help for people on stderr, and on stdout the
            // one JSON object every run prints.
            let _ = writeln!(std::io::stderr(), "{}", e.render().to_string().trim_end());
            report(CliError::usage(
                "no command given: run `sessionfs --help` for the commands".to_owned(),
            ))
        }
        _ => {
            let rendered = e.render().to_string();
            let _ = writeln!(std::io::stderr(), "{}", rendered.trim_end());
            report(CliError::usage(usage_message(&rendered)))
        }
    }
}

/// The message of a rendered clap error, on one line: its text before the
/// usage line (so a missing argument is named), without the `error:`
/// prefix and the closing advice.
fn usage_message(rendered: &str) -> String {
    let parts: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let message = parts.join(" ");
    let message = message.trim_start_matches("error: ");
    if message.is_empty() {
        return "bad usage".into();
    }
    // A bad value clap read from the environment is named by its flag:
    // say where it came from when the flag was not given.
    let given: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let from_env = [
        ("--max-bytes", "SESSIONFS_MAX_BYTES"),
        ("--max-entries", "SESSIONFS_MAX_ENTRIES"),
        ("--max-path-bytes", "SESSIONFS_MAX_PATH_BYTES"),
        ("--hold-memory", "SESSIONFS_PACK_HOLD"),
    ]
    .into_iter()
    .find(|(flag, env)| {
        message.contains(&format!("'{flag} "))
            && !given
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
            && std::env::var_os(env).is_some()
    });
    match from_env {
        Some((_, env)) => format!("{message} (the value is {env}'s, from the environment)"),
        None => message.to_owned(),
    }
}

/// Whether stdout carries the command's data (`unpack --tar -`): its
/// result object, or its error, is then the last line on stderr.
static STDOUT_IS_DATA: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that stdout carries the command's data, from now on (see
/// [`STDOUT_IS_DATA`]).
pub fn stdout_is_data() {
    STDOUT_IS_DATA.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the arguments ask for the data on stdout (`--tar -`), known
/// before they are parsed: a usage error of such a run goes to stderr too.
fn args_put_data_on_stdout() -> bool {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    args.windows(2).any(|w| w[0] == "--tar" && w[1] == "-") || args.iter().any(|a| a == "--tar=-")
}

pub(crate) fn print_json(v: &Value) -> std::io::Result<()> {
    if STDOUT_IS_DATA.load(std::sync::atomic::Ordering::SeqCst) {
        let mut out = std::io::stderr().lock();
        serde_json::to_writer(&mut out, v)?;
        writeln!(out)?;
        return out.flush();
    }
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v)?;
    writeln!(out)?;
    out.flush()
}

/// `-v` as given: a mount passes it on to the daemon it starts.
static VERBOSE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The `-v` flags of this run, for a process it starts.
pub(crate) fn verbose_args() -> Vec<std::ffi::OsString> {
    let n = VERBOSE.load(std::sync::atomic::Ordering::Relaxed);
    (0..n).map(|_| "-v".into()).collect()
}

fn init_logging(verbose: u8) {
    VERBOSE.store(verbose, std::sync::atomic::Ordering::Relaxed);
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter =
        EnvFilter::try_from_env("SESSIONFS_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // ureq's debug and trace lines show request URLs, and a presigned
    // S3 URL holds the session token: never below info, whatever
    // SESSIONFS_LOG asks (the store logs each request without its URL).
    let no_urls = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::TRACE)
        .with_target("ureq", tracing::Level::INFO)
        .with_target("ureq_proto", tracing::Level::INFO);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(no_urls)
        .with(crate::fuse::quiet::Quiet)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(|| logfile::Stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .try_init();
}
