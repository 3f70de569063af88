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
