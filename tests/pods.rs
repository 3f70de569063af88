//! Runtime pods without privileges for the agent (docs/pods.md): a
//! privileged mounter and an unprivileged daemon, a connection handed
//! over as `/dev/fd/N`, termination, dead daemons, and commands that
//! never hang on a mount nobody serves.

mod common;

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{KillOnDrop, fuse_available, run, wait_for, write};

/// The agent's user and group in these tests: no such user needs to
/// exist (the kernel knows numbers only).
const AGENT: u32 = 4242;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether this test can run: FUSE, and root (to mount for another user).
fn privileged(test: &str) -> bool {
    if !fuse_available() {
        return false;
    }
    if !is_root() {
        eprintln!("SKIPPED {test}: it mounts as root for another user");
        return false;
    }
    true
}

/// A directory the agent's user may enter (a tempdir is root's, 0700).
fn open_tmp() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    tmp
}

/// A small workspace packed at `tmp/p.packet`.
fn packet(tmp: &Path) -> PathBuf {
    let ws = tmp.join("ws");
    write(&ws, "README.md", b"hello\n");
    write(&ws, "src/lib.rs", b"pub fn f() {}\n");
    let p = tmp.join("p.packet");
    common::pack(&ws, &p, &[]);
    p
}

/// The fields of `/proc/PID/status` named `name`.
fn status_field(pid: i32, name: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether something is mounted at `mnt`, from the mount table (the
/// mount itself is not asked).
fn is_mounted(mnt: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

/// Runs `script` with `sh` as the agent (no groups, no capabilities).
fn as_agent(dir: &Path, script: &str) -> std::process::Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={AGENT}"),
            &format!("--regid={AGENT}"),
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .current_dir(dir)
        .output()
        .expect("setpriv (util-linux)")
}

/// docs/SEMANTICS.md, "A daemon without privileges": `mount
/// --drop-privileges`, as root, mounts and then serves from a daemon
/// running as `--uid`/`--gid` with no capabilities and no_new_privs, and
/// the mount reads, writes, seals and unmounts.
#[test]
fn a_root_mount_drops_privileges_and_its_daemon_serves_as_the_agent() {
    if !privileged("a_root_mount_drops_privileges_and_its_daemon_serves_as_the_agent") {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let mnt = t.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let id = AGENT.to_string();
    let r = run([
        "mount",
        p.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "--upper",
        t.join("up").to_str().unwrap(),
        "--uid",
        &id,
        "--gid",
        &id,
        "--drop-privileges",
        "--allow-other",
    ]);
    let result = r.ok().clone();
    let pid = result["pid"].as_i64().unwrap() as i32;
    assert_eq!(result["uid"], AGENT);
    // The serving daemon: the agent's user, nothing more.
    let ids = format!("{AGENT} {AGENT} {AGENT} {AGENT}");
    assert_eq!(status_field(pid, "Uid"), ids);
    assert_eq!(status_field(pid, "Gid"), ids);
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Groups"), "");
    // The mount, as the kernel has it.
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(&format!(" {} ", mnt.display())))
        .unwrap();
    assert!(line.contains(" - fuse.sessionfs sessionfs:"), "{line}");
    assert!(line.contains(&format!("user_id={AGENT}")), "{line}");
    // Read and write, as the agent.
    let out = as_agent(
        &mnt,
        "cat workspace/README.md && echo turn >> workspace/README.md && echo new > workspace/new.txt",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    // Seal, as root asking the agent's daemon, into a directory the
    // daemon's user may write (the daemon writes the packet).
    let out_dir = t.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    nix::unistd::chown(
        &out_dir,
        Some(nix::unistd::Uid::from_raw(AGENT)),
        Some(nix::unistd::Gid::from_raw(AGENT)),
    )
    .unwrap();
    let sealed = out_dir.join("s.packet");
    let r = run([
        "seal",
        mnt.to_str().unwrap(),
        "-o",
        sealed.to_str().unwrap(),
    ]);
    assert_eq!(r.ok()["added"], 1);
    let back = t.join("back");
    common::unpack(&sealed, &back, &[]);
    assert_eq!(
        std::fs::read(back.join("workspace/README.md")).unwrap(),
        b"hello\nturn\n"
    );
    assert_eq!(
        std::fs::read(back.join("workspace/new.txt")).unwrap(),
        b"new\n"
    );
    // Unmount: the daemon asks its mounter, and both end.
    let r = run(["umount", mnt.to_str().unwrap()]);
    assert_eq!(r.ok()["unmounted"], true);
    assert!(!is_mounted(&mnt));
    wait_for("the daemon to end", || {
        !Path::new(&format!("/proc/{pid}")).exists() || status_field(pid, "State").starts_with('Z')
    });
}

/// A FUSE connection another process opened and mounted (libfuse's
/// `/dev/fd/N`) is served: here a shell opens /dev/fuse, mount(8) mounts
/// it, and sessionfs serves the descriptor it inherits.
#[test]
fn a_connection_handed_over_as_dev_fd_is_served() {
    if !privileged("a_connection_handed_over_as_dev_fd_is_served") {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let mnt = t.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let digest = run(["digest", p.to_str().unwrap()]).ok()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let script = format!(
        "exec 3<>/dev/fuse && \
         mount -i -t fuse.sessionfs -o fd=3,rootmode=40000,user_id=0,group_id=0,default_permissions \
         sessionfs:{} {mnt} && \
         exec {bin} mount {p} /dev/fd/3 --mounted-at {mnt} --upper {up} --part workspace --foreground",
        &digest[7..19],
        mnt = mnt.display(),
        bin = common::bin().display(),
        p = p.display(),
        up = t.join("up").display(),
    );
    let mut child = KillOnDrop(
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["schema"], "sessionfs.mount-result/1", "{v}");
    assert_eq!(v["mountpoint"], mnt.to_str().unwrap());
    assert_eq!(std::fs::read(mnt.join("README.md")).unwrap(), b"hello\n");
    std::fs::write(mnt.join("x"), b"y").unwrap();
    let st = run(["status", mnt.to_str().unwrap()]);
    assert_eq!(st.ok()["writes"], 1);
    let r = run(["umount", mnt.to_str().unwrap()]);
    assert_eq!(r.ok()["unmounted"], true);
    assert!(child.0.wait().unwrap().success());
}

/// An agent at work on the mount: appends numbered lines to `log` (a path
/// inside the mount, written by its absolute path each time, as a shell
/// does) as fast as it can, working in the mount and holding `held` open
/// (so the mount is busy), and records each line whose write succeeded
/// in `acks` (outside the mount), its errors in `errs`.
fn agent(mnt: &Path, log: &Path, held: &Path, acks: &Path, errs: &Path) -> KillOnDrop {
    let script = format!(
        "exec 3< '{held}'; i=0; while :; do i=$((i+1)); \
         if echo \"line $i\" >> '{log}' 2>>'{errs}'; then echo $i >> '{acks}'; fi; done",
        held = held.display(),
        log = log.display(),
        acks = acks.display(),
        errs = errs.display(),
    );
    KillOnDrop(
        Command::new("bash")
            .args(["-c", &script])
            .current_dir(mnt)
            .spawn()
            .unwrap(),
    )
}

/// The numbers in `acks`, one a line (a last line cut by the kill is
/// dropped).
fn acked(acks: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(acks).unwrap_or_default();
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop(); // after the last newline: empty, or cut short
    lines.iter().map(|l| l.parse().unwrap()).collect()
}

/// The lines of `log`: `line 1`, `line 2`, … with none missing; how many.
fn contiguous_lines(log: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(log);
    let mut n = 0;
    for l in text.lines() {
        n += 1;
        assert_eq!(l, format!("line {n}"), "a line missing or out of place");
    }
    n
}

/// Whether process `pid` is gone (or a zombie).
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        .unwrap_or(true)
}

fn parent_of(pid: i32) -> i32 {
    status_field(pid, "PPid").parse().unwrap()
}

/// docs/SEMANTICS.md, "Termination": SIGTERM to the daemon while the agent
/// works on the mount (files open, its working directory there) never
/// detaches the mount: the agent's writes by path keep landing in the
/// session (the upper directory) until it is killed, nothing lands beneath
/// the mountpoint, and the daemon unmounts and ends once the agent is
/// gone. Before, the daemon detached the mount lazily at once: with
/// `--part workspace` the agent's later writes by path went into the
/// directory beneath the mountpoint (lines outside the session, and the
/// next mount refused as `mountpoint_not_empty`).
#[test]
fn sigterm_mid_turn_never_sends_a_write_outside_the_session() {
    if !fuse_available() {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let mnt = t.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let up = t.join("up");
    let m = common::Mounted::new(&p, &mnt, &up, &["--part", "workspace"]);
    let pid = m.pid();
    let (acks, errs) = (t.join("acks"), t.join("errs"));
    let mut a = agent(
        &mnt,
        &mnt.join("log.txt"),
        &mnt.join("README.md"),
        &acks,
        &errs,
    );
    wait_for("the agent's first 200 lines", || acked(&acks).len() >= 200);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGTERM).unwrap();
    let before = acked(&acks).len();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Still mounted, still taking the agent's writes.
    assert!(is_mounted(&mnt), "the mount was taken away under the agent");
    assert!(acked(&acks).len() > before, "the agent's writes stopped");
    assert!(!ended(pid));
    // The pod's SIGKILL takes the agent; the daemon unmounts and ends.
    let _ = a.0.kill();
    let _ = a.0.wait();
    wait_for("the daemon to end", || ended(pid));
    m.unmounted_elsewhere();
    assert!(!is_mounted(&mnt));
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        0,
        "something was written beneath the mountpoint"
    );
    // Every acknowledged line is in the session.
    let out = t.join("after.packet");
    common::seal_offline(&p, &up, &out, &[]).ok();
    let back = t.join("back");
    common::unpack(&out, &back, &[]);
    let n = contiguous_lines(&std::fs::read(back.join("workspace/log.txt")).unwrap());
    let acked = acked(&acks);
    assert!(
        acked.iter().all(|&i| i <= n),
        "an acknowledged line is missing"
    );
    assert!(n >= acked.len() as u64);
    assert_eq!(std::fs::read_to_string(&errs).unwrap(), "");
}

/// The pod's shape (docs/pods.md): a mounter (root) and an unprivileged
/// daemon with `--seal-on-term`; SIGTERM to the mounter (the sidecar's
/// first process) mid-turn: changes are refused from then on (`EROFS`),
/// the view is sealed, and once the agent is killed the daemon unmounts
/// and both end. Every write the agent saw succeed is in the sealed
/// packet, and nothing is beneath the mountpoint.
#[test]
fn a_pod_stopped_mid_turn_seals_every_acknowledged_write() {
    if !privileged("a_pod_stopped_mid_turn_seals_every_acknowledged_write") {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let mnt = t.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let state = t.join("state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(
        &state,
        Some(nix::unistd::Uid::from_raw(AGENT)),
        Some(nix::unistd::Gid::from_raw(AGENT)),
    )
    .unwrap();
    let dest = state.join("last.packet");
    let id = AGENT.to_string();
    let m = common::Mounted::new(
        &p,
        &mnt,
        &state.join("up"),
        &[
            "--uid",
            &id,
            "--gid",
            &id,
            "--drop-privileges",
            "--allow-other",
            "--seal-on-term",
            dest.to_str().unwrap(),
        ],
    );
    let daemon = m.pid();
    let mounter = parent_of(daemon);
    let (acks, errs) = (t.join("acks"), t.join("errs"));
    let ws = mnt.join("workspace");
    let mut a = agent(
        &ws,
        &ws.join("log.txt"),
        &ws.join("README.md"),
        &acks,
        &errs,
    );
    wait_for("the agent's first 200 lines", || acked(&acks).len() >= 200);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(mounter),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    wait_for("the seal on the way out", || dest.exists());
    // Refused from the seal on, as on a read-only file system.
    wait_for("the agent to be refused", || {
        std::fs::read_to_string(&errs).is_ok_and(|e| e.contains("Read-only file system"))
    });
    assert!(is_mounted(&mnt));
    let _ = a.0.kill();
    let _ = a.0.wait();
    wait_for("the daemon and the mounter to end", || {
        ended(daemon) && ended(mounter)
    });
    m.unmounted_elsewhere();
    assert!(!is_mounted(&mnt));
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    let back = t.join("back");
    common::unpack(&dest, &back, &[]);
    let n = contiguous_lines(&std::fs::read(back.join("workspace/log.txt")).unwrap());
    let acked = acked(&acks);
    assert!(!acked.is_empty());
    assert!(
        acked.iter().all(|&i| i <= n),
        "a line the agent saw written is not in the sealed packet ({n} lines)"
    );
}

/// Runs `sessionfs args…`, which must end within `bound` (it is killed
/// and the test fails otherwise); its exit code, its JSON object, and how
/// long it took.
fn run_within(args: &[&str], bound: std::time::Duration) -> (i32, serde_json::Value, f64) {
    let start = std::time::Instant::now();
    let mut child = KillOnDrop(
        Command::new(common::bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            let mut out = String::new();
            std::io::Read::read_to_string(&mut child.0.stdout.take().unwrap(), &mut out).unwrap();
            let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            return (st.code().unwrap_or(-1), v, start.elapsed().as_secs_f64());
        }
        assert!(
            start.elapsed() < bound,
            "`sessionfs {}` still runs after {bound:?}",
            args.join(" ")
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Asserts that `r` is an error of `kind`, exit 8.
#[track_caller]
fn refused(r: &(i32, serde_json::Value, f64), kind: &str) {
    assert_eq!(
        (r.0, r.1["kind"].as_str().unwrap_or("")),
        (8, kind),
        "{}",
        r.1
    );
}

const SOON: std::time::Duration = std::time::Duration::from_secs(5);
/// The control socket's bound (10 s, docs/CLI.md) and some room.
const ANSWER: std::time::Duration = std::time::Duration::from_secs(20);

/// docs/pods.md, "A dead daemon": SIGKILL of the daemon is an event:
/// `status` (and `seal`) say the daemon died, when it started and when it
/// last recorded a change, and where its upper directory is; after
/// `umount --lazy`, a mount over the same upper directory takes over at
/// once, with everything the dead daemon acknowledged.
#[test]
fn a_dead_daemon_is_an_event_and_a_new_mount_takes_over_at_once() {
    if !fuse_available() {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let (mnt, up) = (t.join("mnt"), t.join("up"));
    std::fs::create_dir(&mnt).unwrap();
    let m = common::Mounted::new(&p, &mnt, &up, &[]);
    std::fs::write(mnt.join("workspace/kept.txt"), b"acknowledged\n").unwrap();
    let pid = m.pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    wait_for("the daemon to die", || ended(pid));
    m.unmounted_elsewhere();
    let mp = mnt.to_str().unwrap();
    let st = run_within(&["status", mp], SOON);
    refused(&st, "daemon_died");
    let msg = st.1["message"].as_str().unwrap();
    assert!(msg.contains(&format!("pid {pid}")), "{msg}");
    assert!(msg.contains("started 20"), "{msg}");
    assert!(msg.contains("last change recorded at 20"), "{msg}");
    assert!(msg.contains(up.to_str().unwrap()), "{msg}");
    let out = t.join("s.packet");
    refused(
        &run_within(&["seal", mp, "-o", out.to_str().unwrap()], SOON),
        "daemon_died",
    );
    refused(
        &run_within(
            &[
                "mount",
                p.to_str().unwrap(),
                mp,
                "--upper",
                up.to_str().unwrap(),
            ],
            SOON,
        ),
        "already_mounted",
    );
    // The takeover: detach the dead mount, mount again over the upper.
    let start = std::time::Instant::now();
    let (code, v, _) = run_within(&["umount", mp, "--lazy"], SOON);
    assert_eq!(code, 0, "{v}");
    let again = common::Mounted::new(&p, &mnt, &up, &[]);
    let took = start.elapsed();
    eprintln!("takeover after a dead daemon (umount --lazy, mount): {took:?}");
    assert!(took < SOON, "{took:?}");
    assert_eq!(
        std::fs::read(mnt.join("workspace/kept.txt")).unwrap(),
        b"acknowledged\n"
    );
    again.umount();
}

/// A mount whose connection nobody serves: made by another process that
/// never answers the kernel (here a shell's /dev/fuse held by `sleep`),
/// or a sessionfs daemon killed while another process holds its
/// connection open. Any look at the mountpoint would wait forever;
/// `mount`, `status`, `seal` and `umount` answer within their bound,
/// from the mount table and the daemon's record, without asking it.
#[test]
fn nothing_hangs_on_a_mount_nobody_serves() {
    if !privileged("nothing_hangs_on_a_mount_nobody_serves") {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let digest = run(["digest", p.to_str().unwrap()]).ok()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let fs = format!("sessionfs:{}", &digest[7..19]);
    let opts = "fd=3,rootmode=40000,user_id=0,group_id=0,default_permissions";
    for served in [false, true] {
        let mnt = t.join(format!("mnt-{served}"));
        let up = t.join(format!("up-{served}"));
        std::fs::create_dir(&mnt).unwrap();
        let mp = mnt.to_str().unwrap();
        // Detached whatever happens, before the directory goes (a look at
        // a mount nobody serves would wait for good).
        let _detach = common::FsMount::adopt(&mnt);
        // Served: a daemon serves the connection, and `sleep` holds a copy
        // of it (its pid in `held`); the daemon is then killed. Not served:
        // nobody ever reads it.
        let held = t.join(format!("held-{served}"));
        let script = if served {
            format!(
                "exec 3<>/dev/fuse && mount -i -t fuse.sessionfs -o {opts} {fs} {mp} && \
                 {{ sleep 600 3<&3 & echo $! > {held}; }} && exec {bin} mount {p} /dev/fd/3 \
                 --mounted-at {mp} --upper {up} --foreground",
                held = held.display(),
                bin = common::bin().display(),
                p = p.display(),
                up = up.display(),
            )
        } else {
            format!(
                "exec 3<>/dev/fuse && mount -i -t fuse.sessionfs -o {opts} {fs} {mp} && \
                 echo '{{}}' && exec sleep 600"
            )
        };
        let mut holder = KillOnDrop(
            Command::new("sh")
                .args(["-c", &script])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        std::io::BufReader::new(holder.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with('{'), "{line}");
        if served {
            std::fs::write(mnt.join("workspace/kept"), b"x").unwrap();
            let pid = holder.0.id() as i32;
            let _ = holder.0.kill();
            let _ = holder.0.wait();
            wait_for("the daemon to die", || ended(pid));
        }
        let up_s = up.to_str().unwrap();
        refused(
            &run_within(&["mount", p.to_str().unwrap(), mp, "--upper", up_s], SOON),
            "already_mounted",
        );
        let gone = if served { "daemon_died" } else { "not_mounted" };
        refused(&run_within(&["status", mp], SOON), gone);
        let out = t.join("out.packet");
        refused(
            &run_within(&["seal", mp, "-o", out.to_str().unwrap()], SOON),
            gone,
        );
        let (code, v, _) = run_within(&["umount", mp], SOON);
        assert_eq!(code, 0, "{v}");
        assert!(!is_mounted(&mnt));
        // The holder of the connection copy, by its pid.
        if let Ok(pid) = std::fs::read_to_string(&held) {
            let pid = nix::unistd::Pid::from_raw(pid.trim().parse().unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL);
        }
    }
}

/// A daemon that does not answer its control socket (stopped): `status`
/// and `seal` fail with `daemon_not_answering` within the control socket's
/// bound, `mount` at once; `umount` unmounts without it, and says the
/// daemon still runs.
#[test]
fn nothing_hangs_on_a_daemon_that_does_not_answer() {
    if !fuse_available() {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let (mnt, up) = (t.join("mnt"), t.join("up"));
    std::fs::create_dir(&mnt).unwrap();
    let m = common::Mounted::new(&p, &mnt, &up, &[]);
    let pid = nix::unistd::Pid::from_raw(m.pid());
    nix::sys::signal::kill(pid, nix::sys::signal::SIGSTOP).unwrap();
    let mp = mnt.to_str().unwrap().to_owned();
    let out = t.join("s.packet");
    let (status, seal) = std::thread::scope(|s| {
        let status = s.spawn(|| run_within(&["status", &mp], ANSWER));
        let seal = s.spawn(|| run_within(&["seal", &mp, "-o", out.to_str().unwrap()], ANSWER));
        (status.join().unwrap(), seal.join().unwrap())
    });
    refused(&status, "daemon_not_answering");
    refused(&seal, "daemon_not_answering");
    eprintln!(
        "a stopped daemon: status answered in {:.1} s, seal in {:.1} s",
        status.2, seal.2
    );
    refused(
        &run_within(
            &[
                "mount",
                p.to_str().unwrap(),
                &mp,
                "--upper",
                t.join("up2").to_str().unwrap(),
            ],
            SOON,
        ),
        "already_mounted",
    );
    let umount = run_within(&["umount", &mp], ANSWER);
    refused(&umount, "umount_failed");
    assert!(
        umount.1["message"]
            .as_str()
            .unwrap()
            .contains(&format!("(pid {pid})")),
        "{}",
        umount.1
    );
    assert!(!is_mounted(&mnt));
    nix::sys::signal::kill(pid, nix::sys::signal::SIGCONT).unwrap();
    wait_for("the daemon to end", || ended(pid.as_raw()));
    m.unmounted_elsewhere();
}

/// Every mount has the type `fuse.sessionfs`, as root too (fuser's own
/// mount as root gave `fuse`).
#[test]
fn a_mount_as_root_has_the_type_fuse_sessionfs() {
    if !privileged("a_mount_as_root_has_the_type_fuse_sessionfs") {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let mnt = t.join("mnt");
    let m = common::Mounted::new(&p, &mnt, &t.join("up"), &[]);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
        .unwrap();
    assert!(line.contains(" - fuse.sessionfs sessionfs:"), "{line}");
    assert!(
        line.contains("user_id=0,group_id=0,default_permissions"),
        "{line}"
    );
    m.umount();
}

/// Root inside a user namespace (`unshare --user --map-root-user`, here
/// of an unprivileged user) without `XDG_RUNTIME_DIR` gets a runtime
/// directory of its own: uid 0 there is not the machine's root, whose
/// `/tmp/sessionfs-0` it may not take. Before, the mount failed with
/// "/tmp/sessionfs-0 is not a directory owned by uid 0". Two users in
/// turn: the kernel gives the second namespace the inode number the first
/// had, and a directory named by that number alone was the first user's
/// ("… is not a directory owned by uid 0"). The device is open to all, as
/// fuse3 makes it (0666): where the machine's is root's alone, the test
/// gives its namespaces a node of their own over it.
#[test]
fn root_in_a_user_namespace_mounts_without_xdg_runtime_dir() {
    if !privileged("root_in_a_user_namespace_mounts_without_xdg_runtime_dir") {
        return;
    }
    // The machine's root's runtime directory, as any root run leaves it.
    let _ = std::fs::create_dir("/tmp/sessionfs-0");
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    let dev = t.join("dev");
    std::fs::create_dir(&dev).unwrap();
    for who in [AGENT + 1, AGENT] {
        let home = t.join(format!("home-{who}"));
        let mnt = home.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        for d in [&mnt, &home] {
            nix::unistd::chown(d, Some(nix::unistd::Uid::from_raw(who)), None).unwrap();
        }
        let script = format!(
            "{bin} mount {p} {mnt} --upper {up} && cat {mnt}/workspace/README.md && \
             grep -F ' {mnt} ' /proc/self/mounts && {bin} umount {mnt}",
            bin = common::bin().display(),
            p = p.display(),
            mnt = mnt.display(),
            up = home.join("up").display(),
        );
        // In a mount namespace of the test's own: /dev/fuse as fuse3
        // leaves it (a node on a tmpfs, bound over the machine's), then
        // the user, then its user namespace.
        let outer = format!(
            "mount -t tmpfs -o mode=755 none {dev} && mknod -m 666 {dev}/fuse c 10 229 && \
             mount --bind {dev}/fuse /dev/fuse && \
             exec setpriv --reuid={who} --regid={who} --clear-groups \
             unshare --user --map-root-user --mount sh -c \"$SCRIPT\"",
            dev = dev.display(),
        );
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &outer])
            .env("SCRIPT", &script)
            .env_remove("XDG_RUNTIME_DIR")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "uid {who}: {stdout}\n{stderr}");
        let mut lines = stdout.lines();
        let mounted: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(mounted["uid"], 0, "{mounted}");
        let socket = mounted["control_socket"].as_str().unwrap();
        assert!(
            socket.starts_with("/tmp/sessionfs-0.userns-")
                && socket.contains(&format!(".uid-{who}/")),
            "{mounted}"
        );
        assert_eq!(lines.next(), Some("hello"), "{stdout}");
        let line = lines.next().unwrap();
        assert!(line.contains(" fuse.sessionfs "), "{line}");
        let gone: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(gone["unmounted"], true, "{gone}");
    }
}

/// Paths in results are absolute and normalised (no `..`), however given.
#[test]
fn paths_in_results_are_normalised() {
    if !fuse_available() {
        return;
    }
    let tmp = open_tmp();
    let t = tmp.path();
    let p = packet(t);
    std::fs::create_dir(t.join("a")).unwrap();
    let via = |name: &str| t.join("a/..").join(name);
    let m = common::Mounted::new(&via("p.packet"), &t.join("mnt"), &via("up"), &[]);
    assert_eq!(m.result["packet"], p.to_str().unwrap());
    assert_eq!(m.result["upper"], t.join("up").to_str().unwrap());
    let st = m.status();
    assert_eq!(st["packet"], p.to_str().unwrap());
    assert_eq!(st["upper"], t.join("up").to_str().unwrap());
    let sealed = m.seal(&via("s.packet"), &[]);
    assert_eq!(sealed["output"], t.join("s.packet").to_str().unwrap());
    m.umount();
}
