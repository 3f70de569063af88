//! docs/pods.md's pod, shape (a), with real containers: a privileged
//! mounter (CAP_SYS_ADMIN, /dev/fuse) that mounts into a shared directory
//! with Bidirectional propagation (`rshared`), and an agent with no
//! capabilities, no /dev/fuse, as uid 1000, that takes it with
//! HostToContainer (`rslave`). Docker (Debian's docker.io, started here
//! with a data root of its own; one image, `docker import`ed from a
//! busybox-static root built here, the binary under test bound in
//! read-only) when it can run; else the same shape with namespaces
//! (`unshare`, `setpriv`). The test says which ran.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{FsMount, KillOnDrop, fuse_available, write};

/// The agent's user and group (docs/pods.md's manifests).
const AGENT: u32 = 1000;

/// Where the test's Docker keeps its state (images, containers), so that
/// its image is built once per run, not per test.
const DOCKER_ROOT: &str = "/var/tmp/sessionfs-test-docker";

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A Docker daemon this test started, on a socket of its own.
struct Docker {
    sock: PathBuf,
    client: PathBuf,
    daemon: Option<KillOnDrop>,
    containers: Vec<String>,
}

impl Docker {
    /// Starts dockerd (no network: `--bridge=none`, no iptables), waits up
    /// to 30 s for it to answer, and imports the image; why not, if not.
    fn start() -> Result<Docker, String> {
        let dockerd = ["/usr/sbin/dockerd", "/usr/bin/dockerd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("no dockerd (Debian's docker.io is not installed)")?;
        // Debian's client matches its daemon; another on the PATH may not.
        let client = ["/usr/bin/docker", "/usr/local/bin/docker"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or("no docker client")?;
        let root = Path::new(DOCKER_ROOT);
        std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
        let sock = root.join("docker.sock");
        let log = std::fs::File::create(root.join("dockerd.log")).map_err(|e| e.to_string())?;
        let child = Command::new(dockerd)
            .arg("--data-root")
            .arg(root.join("data"))
            .arg("--exec-root")
            .arg(root.join("exec"))
            .arg("--pidfile")
            .arg(root.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", sock.display()))
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start dockerd: {e}"))?;
        let mut d = Docker {
            sock,
            client,
            daemon: Some(KillOnDrop(child)),
            containers: Vec::new(),
        };
        let start = Instant::now();
        while !d.cmd(&["version"]).status.success() {
            if start.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(root.join("dockerd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(format!(
                    "dockerd did not answer in 30 s: {}",
                    tail.join(" | ")
                ));
            }
            if let Some(st) = d
                .daemon
                .as_mut()
                .and_then(|c| c.0.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(root.join("dockerd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(format!("dockerd ended ({st}): {}", tail.join(" | ")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        d.image()?;
        Ok(d)
    }

    fn cmd(&self, args: &[&str]) -> Output {
        Command::new(&self.client)
            .arg("-H")
            .arg(format!("unix://{}", self.sock.display()))
            .args(args)
            .output()
            .expect("docker client")
    }

    /// Runs `docker args…`, which must succeed; its stdout.
    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args);
        assert!(o.status.success(), "docker {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The image, `sessionfs-pods:test`: busybox-static and the C
    /// libraries the binary under test links (the binary itself is bound
    /// in when a container runs). Imported once per data root.
    fn image(&self) -> Result<(), String> {
        if self.cmd(&["image", "inspect", IMAGE]).status.success() {
            return Ok(());
        }
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        let r = root.path();
        for d in [
            "bin", "tmp", "proc", "sys", "dev", "etc", "session", "state", "packets",
        ] {
            std::fs::create_dir_all(r.join(d)).map_err(|e| e.to_string())?;
        }
        std::fs::set_permissions(r.join("tmp"), std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| e.to_string())?;
        std::fs::copy("/bin/busybox", r.join("bin/busybox"))
            .map_err(|e| format!("/bin/busybox (busybox-static): {e}"))?;
        for applet in [
            "sh", "cat", "echo", "ls", "sleep", "mkdir", "grep", "test", "id", "touch", "stat",
        ] {
            std::os::unix::fs::symlink("busybox", r.join("bin").join(applet))
                .map_err(|e| e.to_string())?;
        }
        let ldd = Command::new("ldd")
            .arg(common::bin())
            .output()
            .map_err(|e| e.to_string())?;
        for lib in String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let to = r.join(lib.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).map_err(|e| e.to_string())?;
            std::fs::copy(lib, &to).map_err(|e| format!("{lib}: {e}"))?;
        }
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(r)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let import = Command::new(&self.client)
            .arg("-H")
            .arg(format!("unix://{}", self.sock.display()))
            .args(["import", "-", IMAGE])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .map_err(|e| e.to_string())?;
        let _ = tar.wait();
        if !import.status.success() {
            return Err(format!("docker import: {}", text(&import)));
        }
        Ok(())
    }

    /// Starts a container `name` with `args` (before the image) running
    /// `script` with sh; removed when the test ends.
    fn start_container(&mut self, name: &str, args: &[&str], script: &str) {
        let mut all = vec!["run", "-d", "--name", name, "--network", "none"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[IMAGE, "sh", "-c", script]);
        self.ok(&all);
        self.containers.push(name.to_owned());
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = self.cmd(&["rm", "-f", c]);
        }
        // Stopped by its pid: SIGTERM, and it stops what it runs.
        if let Some(mut d) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(d.0.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM);
            let start = Instant::now();
            while d.0.try_wait().ok().flatten().is_none()
                && start.elapsed() < Duration::from_secs(20)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

const IMAGE: &str = "sessionfs-pods:test";

/// The mount at `mnt` as the mount table has it (its line), if any.
fn mount_line(mnt: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    info.lines()
        .rev()
        .find(|l| l.split(' ').nth(4) == Some(want))
        .map(str::to_owned)
}

#[track_caller]
fn wait_until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < bound,
            "waited {bound:?} in vain for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pod's directories: the packets, the state (the agent's uid's),
/// and the shared directory, made a shared mount point (what an emptyDir
/// with Bidirectional propagation is to the kubelet).
struct Pod {
    // Dropped in this order: the shared mount point, then the directory.
    _shared: FsMount,
    dir: PathBuf,
    session: PathBuf,
    mnt: PathBuf,
    state: PathBuf,
    packet: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Pod {
    fn new() -> Pod {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = dir.join("ws");
        write(&ws, "README.md", b"hello\n");
        write(&ws, "src/lib.rs", b"pub fn f() {}\n");
        let packets = dir.join("packets");
        std::fs::create_dir(&packets).unwrap();
        let packet = packets.join("turn-1.packet");
        common::pack(&ws, &packet, &[]);
        let state = dir.join("state");
        std::fs::create_dir(&state).unwrap();
        nix::unistd::chown(
            &state,
            Some(nix::unistd::Uid::from_raw(AGENT)),
            Some(nix::unistd::Gid::from_raw(AGENT)),
        )
        .unwrap();
        let session = dir.join("session");
        std::fs::create_dir(&session).unwrap();
        let shared = FsMount::bind(&session, &session);
        assert!(
            Command::new("mount")
                .arg("--make-shared")
                .arg(&session)
                .status()
                .unwrap()
                .success()
        );
        let mnt = session.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        Pod {
            _tmp: tmp,
            dir,
            session,
            mnt,
            state,
            packet,
            _shared: shared,
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        // A mount left by a failed test, before the directories go.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
    }
}

/// The mounter's command (docs/pods.md): mount `packet` (a path inside
/// the container or namespace) at `mnt` over `upper`, for the agent, as a
/// daemon without privileges, sealing to `state/last.packet` on SIGTERM.
/// Like the recipe, it names the packet's digest (`packet_on_host` is
/// the same file as the host sees it).
fn mounter_script(
    bin: &str,
    packet: &str,
    packet_on_host: &Path,
    mnt: &str,
    upper: &str,
    last: &str,
) -> String {
    let digest = common::run(["digest".as_ref(), packet_on_host.as_os_str()]).ok()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    format!(
        "exec {bin} mount {packet} {mnt} --digest {digest} --upper {upper} \
         --uid {AGENT} --gid {AGENT} --drop-privileges --allow-other \
         --seal-on-term {last} --foreground"
    )
}

/// What the agent checks first, as itself: its identity, no capability,
/// no /dev/fuse; then it reads and writes the mount.
const AGENT_TURN: &str = "id -u; grep CapEff /proc/self/status; test -e /dev/fuse && echo fuse; \
     cat /session/mnt/workspace/README.md && echo turn >> /session/mnt/workspace/README.md && \
     echo new > /session/mnt/workspace/new.txt && echo wrote";

/// Checks the agent's first turn's output.
#[track_caller]
fn agent_turn_ok(out: &str) {
    let want = format!("{AGENT}\nCapEff:\t0000000000000000\nhello\nwrote\n");
    assert_eq!(out, want, "the agent's first turn");
}

/// The sealed packet `p` holds the agent's first turn.
#[track_caller]
fn sealed_turn(p: &Path, into: &Path) {
    common::unpack(p, into, &[]);
    assert_eq!(
        std::fs::read(into.join("workspace/README.md")).unwrap(),
        b"hello\nturn\n"
    );
    assert_eq!(
        std::fs::read(into.join("workspace/new.txt")).unwrap(),
        b"new\n"
    );
}

#[test]
fn the_pod_recipe_runs_with_an_agent_without_privileges() {
    if !fuse_available() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED the_pod_recipe_runs_with_an_agent_without_privileges: needs root");
        return;
    }
    // SESSIONFS_TEST_NAMESPACES=1 runs the namespace form where Docker could.
    let docker = match std::env::var_os("SESSIONFS_TEST_NAMESPACES") {
        Some(_) => Err("SESSIONFS_TEST_NAMESPACES is set".to_owned()),
        None => Docker::start(),
    };
    match docker {
        Ok(d) => {
            eprintln!("RAN with Docker (containers)");
            with_docker(d);
        }
        Err(why) => {
            if std::env::var_os("SESSIONFS_REQUIRE_DOCKER").is_some() {
                panic!("Docker cannot run here, but SESSIONFS_REQUIRE_DOCKER is set: {why}");
            }
            eprintln!("RAN with namespaces (unshare, setpriv): Docker cannot run here: {why}");
            with_namespaces();
        }
    }
}

fn with_docker(mut d: Docker) {
    let pod = Pod::new();
    let tag = std::process::id().to_string();
    let bin = format!("{}:/bin/sessionfs:ro", common::bin().display());
    let session_b = format!("{}:/session:rshared", pod.session.display());
    let state = format!("{}:/state", pod.state.display());
    let packets = format!("{}:/packets:ro", pod.packet.parent().unwrap().display());
    let mounter = |d: &mut Docker, name: &str, packet: &str, on_host: &Path, upper: &str| {
        d.start_container(
            name,
            &[
                "--cap-add",
                "SYS_ADMIN",
                "--device",
                "/dev/fuse",
                "--security-opt",
                "apparmor=unconfined",
                "-v",
                &bin,
                "-v",
                &session_b,
                "-v",
                &state,
                "-v",
                &packets,
            ],
            &mounter_script(
                "sessionfs",
                packet,
                on_host,
                "/session/mnt",
                upper,
                "/state/last.packet",
            ),
        );
    };
    let ready = |pod: &Pod| {
        wait_until("the mount", Duration::from_secs(30), || {
            mount_line(&pod.mnt).is_some_and(|l| l.contains(" - fuse.sessionfs "))
        })
    };
    let m1 = format!("mounter-1-{tag}");
    mounter(
        &mut d,
        &m1,
        "/packets/turn-1.packet",
        &pod.packet,
        "/state/upper",
    );
    ready(&pod);
    // The agent: uid 1000, no capability, no device, HostToContainer.
    let agent = |prop: &str| {
        vec![
            "--user".to_owned(),
            format!("{AGENT}:{AGENT}"),
            "--cap-drop".into(),
            "ALL".into(),
            "--security-opt".into(),
            "no-new-privileges".into(),
            "-v".into(),
            format!("{}:/session:{prop}", pod.session.display()),
        ]
    };
    let mut run_args: Vec<String> = vec![
        "run".into(),
        "--rm".into(),
        "--network".into(),
        "none".into(),
    ];
    run_args.extend(agent("rslave"));
    run_args.extend([IMAGE.into(), "sh".into(), "-c".into(), AGENT_TURN.into()]);
    let run_args: Vec<&str> = run_args.iter().map(String::as_str).collect();
    agent_turn_ok(&d.ok(&run_args));
    // Agents that stay: one as the recipe says (rslave), one with
    // Docker's default for a bind (rprivate).
    let (slave, private) = (format!("agent-slave-{tag}"), format!("agent-private-{tag}"));
    for (name, prop) in [(&slave, "rslave"), (&private, "rprivate")] {
        let args = agent(prop);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        d.start_container(name, &args, "exec sleep 600");
    }
    // The pod stops: SIGTERM to the mounter, which seals on the way out
    // and unmounts; then the SIGKILL after the grace period (the daemon
    // still serves the rprivate agent's copy of its mount).
    d.ok(&["kill", "--signal", "TERM", &m1]);
    let last = pod.state.join("last.packet");
    wait_until("the seal and the unmount", Duration::from_secs(30), || {
        last.exists() && mount_line(&pod.mnt).is_none()
    });
    d.ok(&["kill", &m1]);
    sealed_turn(&last, &pod.dir.join("back"));
    // A remount (the next turn's mounter, on the sealed packet).
    std::fs::rename(
        pod.state.join("last.packet"),
        pod.state.join("turn-2.packet"),
    )
    .unwrap();
    let m2 = format!("mounter-2-{tag}");
    let turn2 = pod.state.join("turn-2.packet");
    mounter(
        &mut d,
        &m2,
        "/state/turn-2.packet",
        &turn2,
        "/state/upper-2",
    );
    ready(&pod);
    let seen = d.ok(&["exec", &slave, "cat", "/session/mnt/workspace/new.txt"]);
    assert_eq!(seen, "new\n", "the rslave agent sees the remount");
    let dead = d.cmd(&["exec", &private, "cat", "/session/mnt/workspace/README.md"]);
    let dead = text(&dead);
    assert!(
        dead.contains("not connected") || dead.contains("No such file"),
        "the rprivate agent keeps what it had: {dead}"
    );
    eprintln!("rprivate agent after the remount: {}", dead.trim());
    d.ok(&["stop", "-t", "30", &m2]);
    assert!(mount_line(&pod.mnt).is_none());
    // The next turn's packet: the mounter sealed again on its way out.
    assert!(last.exists());
}

/// The same shape with namespaces: the mounter in this mount namespace
/// (where the shared directory is), each agent in a mount namespace of its
/// own whose mounts are slaves (HostToContainer) or private copies, as
/// uid 1000 with no capabilities and no_new_privs (no /dev/fuse is
/// hidden from it here: it cannot open it as uid 1000 when the device is
/// root's 0600, and needs not).
fn with_namespaces() {
    let pod = Pod::new();
    let bin = common::bin();
    let bin = bin.to_str().unwrap();
    let mnt = pod.mnt.to_str().unwrap().to_owned();
    let last = pod.state.join("last.packet");
    let start_mounter = |packet: &Path, upper: &Path| {
        let script = mounter_script(
            bin,
            packet.to_str().unwrap(),
            packet,
            &mnt,
            upper.to_str().unwrap(),
            last.to_str().unwrap(),
        );
        let child = KillOnDrop(
            Command::new("sh")
                .args(["-c", &script])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_until("the mount", Duration::from_secs(30), || {
            mount_line(&pod.mnt).is_some_and(|l| l.contains(" - fuse.sessionfs "))
        });
        child
    };
    let setpriv = format!(
        "setpriv --reuid={AGENT} --regid={AGENT} --clear-groups --inh-caps=-all \
         --bounding-set=-all --no-new-privs"
    );
    let mut m1 = start_mounter(&pod.packet, &pod.state.join("upper"));
    let turn = Command::new("sh")
        .args([
            "-c",
            &format!(
                "unshare --mount --propagation slave {setpriv} sh -c '{}'",
                AGENT_TURN
                    .replace("/session/mnt", &mnt)
                    .replace("test -e /dev/fuse && echo fuse", "true")
            ),
        ])
        .output()
        .unwrap();
    agent_turn_ok(&String::from_utf8_lossy(&turn.stdout));
    // Agents that stay, in namespaces of their own.
    let stay = |prop: &str| {
        KillOnDrop(
            Command::new("unshare")
                .args(["--mount", "--propagation", prop, "sleep", "600"])
                .spawn()
                .unwrap(),
        )
    };
    let (slave, private) = (stay("slave"), stay("private"));
    std::thread::sleep(Duration::from_millis(200));
    let in_ns = |who: &KillOnDrop, path: &str| {
        Command::new("nsenter")
            .arg("-t")
            .arg(who.0.id().to_string())
            .arg("-m")
            .args(setpriv.split(' '))
            .args(["cat", path])
            .output()
            .unwrap()
    };
    // The pod stops: SIGTERM to the mounter, which seals and unmounts;
    // then the SIGKILL (the daemon still serves the private agent's copy
    // of its mount, as it would until that namespace ends).
    let mounter = m1.0.id() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(mounter),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    wait_until("the seal and the unmount", Duration::from_secs(30), || {
        last.exists() && mount_line(&pod.mnt).is_none()
    });
    let children = std::fs::read_to_string(format!("/proc/{mounter}/task/{mounter}/children"))
        .unwrap_or_default();
    for pid in children.split_whitespace() {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL);
    }
    let _ = m1.0.wait();
    sealed_turn(&last, &pod.dir.join("back"));
    let turn2 = pod.state.join("turn-2.packet");
    std::fs::rename(&last, &turn2).unwrap();
    let mut m2 = start_mounter(&turn2, &pod.state.join("upper-2"));
    let seen = in_ns(&slave, &format!("{mnt}/workspace/new.txt"));
    assert_eq!(text(&seen), "new\n", "the slave agent sees the remount");
    let dead = text(&in_ns(&private, &format!("{mnt}/workspace/README.md")));
    assert!(
        dead.contains("not connected") || dead.contains("No such file"),
        "the private agent keeps a dead copy, never the new mount: {dead}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m2.0.id() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    let _ = m2.0.wait();
    drop((slave, private));
    wait_until("the mount to go", Duration::from_secs(30), || {
        mount_line(&pod.mnt).is_none()
    });
}
