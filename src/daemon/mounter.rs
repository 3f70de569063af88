//! The privileged mounter and the unprivileged daemon it serves
//! (`sessionfs mount --drop-privileges`, libfuse's `drop_privileges`
//! pattern): the mounter, root, starts the daemon as `--uid`/`--gid` with
//! no capabilities and `no_new_privs`, hands it its configuration on the
//! channel that is its standard input, and then does for it the two
//! things only a privileged process can: open `/dev/fuse` and mount it at
//! the mountpoint (the daemon asks once it has checked the packet and its
//! upper directory, so a refusal leaves nothing mounted, and gets the
//! descriptor back over the channel), and unmount that mount, only that
//! one, when the daemon asks. Everything else (reading the packet,
//! writing the upper directory, sealing) is the daemon's, without
//! privileges. The mounter ends when the daemon does.
//!
//! Protocol on the channel (a Unix socket pair): the mounter sends the
//! configuration, one line; then the daemon sends [`Ask`] lines, each
//! answered by one [`Answer`] line (a mount's with the descriptor,
//! `SCM_RIGHTS`).

use std::ffi::OsString;
use std::io::{self, BufRead, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{MAX_LINE, read_line};

/// What the daemon asks of its mounter.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Ask {
    /// Open `/dev/fuse` and mount it at the mountpoint as `fs_name`.
    Mount {
        /// The mount's source (`sessionfs:<digest>`).
        fs_name: String,
    },
    /// Unmount the mount made for this daemon (`lazy`: detach it).
    Unmount {
        /// Detach even if busy.
        lazy: bool,
    },
}

/// The mounter's answer: `errno` 0 when done.
#[derive(Serialize, Deserialize, Debug)]
pub struct Answer {
    /// 0, or the error number of the refusal.
    pub errno: i32,
    /// What was refused, and why.
    #[serde(default)]
    pub message: String,
}

/// What the mounter mounts, where, for whom.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The canonical mountpoint.
    pub mountpoint: PathBuf,
    /// The daemon's user.
    pub uid: u32,
    /// The daemon's group.
    pub gid: u32,
    /// Let other users in (`allow_other`).
    pub allow_other: bool,
}

/// The daemon's end of the channel to its mounter.
pub struct Link {
    sock: Mutex<UnixStream>,
}

impl Link {
    /// The channel that is this process's standard input (see the module
    /// doc), after the configuration line was read from it.
    pub fn stdin() -> io::Result<Link> {
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        Ok(Link {
            sock: Mutex::new(UnixStream::from(fd)),
        })
    }

    /// Asks for the mount; the descriptor of its connection.
    pub fn mount(&self, fs_name: &str) -> io::Result<std::os::fd::OwnedFd> {
        let (answer, fd) = self.ask(&Ask::Mount {
            fs_name: fs_name.to_owned(),
        })?;
        answer?;
        fd.ok_or_else(|| io::Error::other("the mounter mounted, but sent no descriptor"))
    }

    /// Asks for the unmount. An error is the system call's own (its
    /// number kept: `EBUSY` says the mount is busy).
    pub fn unmount(&self, lazy: bool) -> io::Result<()> {
        self.ask(&Ask::Unmount { lazy })?.0
    }

    fn ask(&self, ask: &Ask) -> io::Result<(io::Result<()>, Option<std::os::fd::OwnedFd>)> {
        let sock = self.sock.lock();
        let line = serde_json::to_string(ask).map_err(io::Error::other)? + "\n";
        (&*sock).write_all(line.as_bytes())?;
        // The answer is one short line, with the descriptor on its first
        // bytes: read until the newline.
        let mut got = Vec::new();
        let mut fd = None;
        let mut buf = [0u8; 4096];
        while !got.ends_with(b"\n") {
            let (n, f) = crate::sys::fd::recv_with_fd(&sock, &mut buf)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the mounter is gone (it ended, or was killed)",
                ));
            }
            got.extend_from_slice(&buf[..n]);
            fd = fd.or(f);
            if got.len() > MAX_LINE {
                return Err(io::Error::other("the mounter's answer is too long"));
            }
        }
        let answer: Answer = serde_json::from_slice(&got).map_err(io::Error::other)?;
        let result = match (answer.errno, ask) {
            (0, _) => Ok(()),
            // The unmount's caller tells a busy mount by its number.
            (n, Ask::Unmount { .. }) => {
                tracing::debug!(message = answer.message, "the mounter did not unmount");
                Err(io::Error::from_raw_os_error(n))
            }
            (n, Ask::Mount { .. }) => Err(io::Error::new(
                io::Error::from_raw_os_error(n).kind(),
                format!("{} ({})", answer.message, io::Error::from_raw_os_error(n)),
            )),
        };
        Ok((result, fd))
    }
}

/// Opens `/dev/fuse` and mounts it at `plan.mountpoint` as `fs_name`, type
/// `fuse.sessionfs`, with the options fuser would give; the connection's
/// descriptor. Refuses a mountpoint that is no longer an empty directory,
/// or where a FUSE file system is mounted (from the mount table: it is not
/// asked).
pub fn mount(plan: &Plan, fs_name: &str) -> io::Result<std::os::fd::OwnedFd> {
    use nix::mount::MsFlags;
    use std::os::fd::AsRawFd;
    if !fs_name.starts_with("sessionfs:") || fs_name.contains([',', ' ', '\n']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{fs_name:?} is not the name of a sessionfs mount"),
        ));
    }
    let fuse_there = matches!(
        crate::sys::mount_at(&plan.mountpoint),
        crate::sys::MountAt::Mount(m) if crate::sys::fuse_fsname(&m.fstype, &m.source).is_some()
    );
    if fuse_there || std::fs::read_dir(&plan.mountpoint)?.next().is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{}: no longer an empty directory without a FUSE mount on it",
                plan.mountpoint.display()
            ),
        ));
    }
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let options =
        crate::fuse::daemon::kernel_options(dev.as_raw_fd(), plan.uid, plan.gid, plan.allow_other);
    nix::mount::mount(
        Some(fs_name),
        &plan.mountpoint,
        Some("fuse.sessionfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
        Some(options.as_str()),
    )?;
    Ok(dev.into())
}

/// Unmounts the mount at `plan.mountpoint` if it is still the one made as
/// `fs_name` (the topmost mount there, from the mount table); one that is
/// gone is not an error, and a mount of anything else is left alone.
fn unmount(plan: &Plan, fs_name: &str, lazy: bool) -> io::Result<()> {
    let crate::sys::MountAt::Mount(top) = crate::sys::mount_at(&plan.mountpoint) else {
        return Ok(());
    };
    if crate::sys::fuse_fsname(&top.fstype, &top.source) != Some(fs_name.as_bytes()) {
        return Ok(());
    }
    crate::sys::platform::unmount(&plan.mountpoint, lazy).map_err(io::Error::from)
}

/// Runs the mounter: starts this executable with arguments `args` (the
/// daemon's command line, which every user may read) as the plan's user
/// and group, sends it
/// `config` (one line), hands the daemon's first line of output (the
/// mount's result, or its error) to `relay`, and serves its asks until it
/// exits (forwarding SIGTERM, SIGINT and SIGHUP to it). The daemon's exit
/// status.
pub fn run(
    plan: &Plan,
    config: &str,
    args: &[OsString],
    relay: impl FnOnce(String) + Send + 'static,
) -> io::Result<std::process::ExitStatus> {
    let signals = crate::fuse::daemon::block_signals()?;
    let exe = std::env::current_exe()?;
    let (mine, theirs) = UnixStream::pair()?;
    use std::os::unix::process::CommandExt;
    let mut child: Child = Command::new(exe)
        .args(args)
        .uid(plan.uid)
        .gid(plan.gid)
        // The daemon's runtime directory is its own user's, where root
        // looks for another user's socket (`/run/user/UID`, else
        // `/tmp/sessionfs-UID`): not the one root's environment names.
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .spawn()?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            while let Ok(sig) = signals.wait() {
                tracing::info!(?sig, "passing the signal to the daemon");
                let _ = nix::sys::signal::kill(pid, sig);
            }
        })?;
    (&mine).write_all(format!("{config}\n").as_bytes())?;
    // The first line comes once the daemon has mounted, which it asks of
    // this thread: read on another.
    let out = child.stdout.take();
    std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            let mut first = String::new();
            if let Some(out) = out {
                let _ = io::BufReader::new(out).read_line(&mut first);
            }
            relay(first);
        })?;
    let mut made: Option<String> = None;
    loop {
        let line = match read_line(&mine) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "the daemon's channel failed; waiting for it to end");
                break;
            }
        };
        let ask: Ask = match serde_json::from_str(&line) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "not an ask of the mounter's protocol; ignored");
                answer(&mine, Err(io::Error::from_raw_os_error(libc::EINVAL)), None)?;
                continue;
            }
        };
        tracing::info!(?ask, mountpoint = %plan.mountpoint.display(), "the daemon asks");
        match ask {
            Ask::Mount { fs_name } if made.is_none() => match mount(plan, &fs_name) {
                Ok(fd) => {
                    made = Some(fs_name);
                    answer(&mine, Ok(()), Some(fd.as_fd()))?;
                }
                Err(e) => answer(&mine, Err(e), None)?,
            },
            Ask::Mount { .. } => answer(
                &mine,
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "this mounter mounts once",
                )),
                None,
            )?,
            Ask::Unmount { lazy } => {
                let done = match &made {
                    Some(name) => unmount(plan, name, lazy),
                    None => Ok(()),
                };
                answer(&mine, done, None)?;
            }
        }
    }
    child.wait()
}

/// Sends the answer to an ask: done, or the error (its number and text),
/// with descriptor `fd` when there is one.
fn answer(
    sock: &UnixStream,
    result: io::Result<()>,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<()> {
    let a = match &result {
        Ok(()) => Answer {
            errno: 0,
            message: String::new(),
        },
        Err(e) => Answer {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            message: e.to_string(),
        },
    };
    let line = serde_json::to_string(&a).map_err(io::Error::other)? + "\n";
    match fd {
        Some(fd) => crate::sys::fd::send_with_fd(sock, line.as_bytes(), fd),
        None => (&*sock).write_all(line.as_bytes()),
    }
}

/// Makes upper directory `upper` for the daemon's user, if it is not
/// there: the daemon, without privileges, could not make it in a
/// directory of root's. Whether it was made (then removed if the mount
/// fails).
pub fn make_upper_for(upper: &Path, uid: u32, gid: u32) -> io::Result<bool> {
    if std::fs::symlink_metadata(upper).is_ok() {
        return Ok(false);
    }
    std::fs::create_dir(upper)?;
    nix::unistd::chown(
        upper,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )?;
    Ok(true)
}
