//! The harness half of a session, end to end with the real harness CLIs
//! (pinned in scripts/harness/versions, installed into .harness/ by
//! scripts/harness/install.sh, which `make test` runs) against a mock model
//! API of our own on 127.0.0.1 (scripts/harness/mock_llm.py).
//!
//! Each test follows docs/harnesses.md: a first turn on a "laptop" (plain
//! directories at the session's fixed path), `pack`, then a mount of the
//! whole packet at that same path with the harness's credentials shown by
//! `--secret`, resumes by thread id, `seal --rebase`, and a fresh mount of
//! the sealed packet with a new upper directory (another machine), resumed
//! again. The model must receive every earlier turn each time.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

/// A harness CLI installed by scripts/harness/install.sh, or `None` (with
/// the reason printed) where it is not. Under `SESSIONFS_REQUIRE_HARNESS`
/// (set by `make test`, which installs them) a missing one fails the test.
fn tool(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".harness/node_modules/.bin")
        .join(name);
    if p.exists() {
        return Some(p);
    }
    let why = format!(
        "{} is not installed: run scripts/harness/install.sh (npm, the versions in scripts/harness/versions)",
        p.display()
    );
    if std::env::var_os("SESSIONFS_REQUIRE_HARNESS").is_some() {
        panic!("{why}; SESSIONFS_REQUIRE_HARNESS is set");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// The mock model API, stopped on drop.
struct Mock {
    _child: KillOnDrop,
    port: u16,
    log: PathBuf,
}

impl Mock {
    fn start(dir: &Path) -> Mock {
        let log = dir.join("requests.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/harness/mock_llm.py");
        let mut child = KillOnDrop(
            Command::new("python3")
                .arg(script)
                .arg(&log)
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3"),
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the mock prints its port");
        Mock {
            _child: child,
            port,
            log,
        }
    }

    /// The requests to `api` so far, in order.
    fn requests(&self, api: &str) -> Vec<Value> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["path"] == api)
            .collect()
    }
}

/// What the model has been sent so far, turn by turn.
struct History<'a> {
    mock: &'a Mock,
    api: &'static str,
    seen: usize,
    items: Vec<u64>,
    prompts: Vec<String>,
}

impl<'a> History<'a> {
    fn new(mock: &'a Mock, api: &'static str) -> History<'a> {
        History {
            mock,
            api,
            seen: 0,
            items: Vec::new(),
            prompts: Vec::new(),
        }
    }

    /// Checks the turn just run with `prompt`: its largest request (a
    /// harness may also ask for a title) carried more input items than
    /// the last turn's, every earlier prompt and this one, and the
    /// credential `auth` (as the mock saw it).
    #[track_caller]
    fn turn(&mut self, prompt: &str, auth: &str) {
        let all = self.mock.requests(self.api);
        let new = &all[self.seen..];
        self.seen = all.len();
        let r = new
            .iter()
            .max_by_key(|r| r["items"].as_u64())
            .unwrap_or_else(|| panic!("no request to {} for {prompt:?}", self.api));
        let items = r["items"].as_u64().unwrap();
        if let Some(&last) = self.items.last() {
            assert!(
                items > last,
                "{prompt:?}: {items} input items after {:?}: the earlier turns were not sent",
                self.items
            );
        }
        let body = r["body"].to_string();
        self.prompts.push(prompt.to_string());
        for p in &self.prompts {
            assert!(body.contains(p.as_str()), "{prompt:?}: {p:?} was not sent");
        }
        assert!(
            r["auth"].as_str().is_some_and(|a| a.contains(auth)),
            "{prompt:?}: credential {} is not {auth}",
            r["auth"]
        );
        self.items.push(items);
        eprintln!("{}: {prompt:?}: {items} input items", self.api);
    }
}

/// Runs a harness command (bounded: a harness waiting on something that
/// never comes fails the test instead of hanging it); its stdout.
#[track_caller]
fn harness(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null());
    let out = succeed(cmd);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `timeout 180 bin` in `dir`, with `HOME` at `home` (so that nothing of
/// the user's own home is read or written).
fn command(bin: &Path, dir: &Path, home: &Path) -> Command {
    fs::create_dir_all(home).unwrap();
    let mut c = Command::new("timeout");
    c.arg("180").arg(bin).current_dir(dir).env("HOME", home);
    c
}

/// Runs `PRAGMA integrity_check` on every SQLite database under `dir`
/// (each copied with its `-wal` and `-shm` first, so that nothing is
/// written where it lies); the number checked.
#[track_caller]
fn sqlite_ok(dir: &Path, scratch: &Path) -> usize {
    let out = python(
        r#"
import os, shutil, sqlite3, sys
root, scratch = sys.argv[1], sys.argv[2]
n = 0
for d, _, files in os.walk(root):
    for f in files:
        if not (f.endswith(".sqlite") or f.endswith(".db")):
            continue
        tmp = os.path.join(scratch, str(n)); os.makedirs(tmp)
        for side in ("", "-wal", "-shm"):
            if os.path.exists(os.path.join(d, f + side)):
                shutil.copyfile(os.path.join(d, f + side), os.path.join(tmp, f + side))
        r = sqlite3.connect(os.path.join(tmp, f)).execute("PRAGMA integrity_check").fetchall()
        assert r == [("ok",)], (os.path.join(d, f), r)
        n += 1
print(n)
"#,
        &[dir.as_os_str(), scratch.as_os_str()],
    );
    out.parse().unwrap()
}

/// Asserts that no file under `paths` (files or directories) holds any of
/// `needles`.
#[track_caller]
fn holds_none(paths: &[&Path], needles: &[&str]) {
    for p in paths {
        let files = if p.is_dir() {
            files_under(p)
        } else {
            vec![p.to_path_buf()]
        };
        for f in files {
            let hay = fs::read(&f).unwrap();
            for n in needles {
                assert!(
                    !hay.windows(n.len()).any(|w| w == n.as_bytes()),
                    "{} holds the credential {n}",
                    f.display()
                );
            }
        }
    }
}

/// `seal MNT -o OUT --receipt OUT.receipt.json [extra]`; the receipt's
/// path (the result in [`seal_result`]).
#[track_caller]
fn seal(mnt: &Path, out: &Path, extra: &[&str]) -> PathBuf {
    seal_result(mnt, out, extra).0
}

/// [`seal`], with the seal's result.
#[track_caller]
fn seal_result(mnt: &Path, out: &Path, extra: &[&str]) -> (PathBuf, Value) {
    let receipt = out.with_extension("receipt.json");
    let mut args = vec![
        "seal".to_string(),
        mnt.display().to_string(),
        "-o".into(),
        out.display().to_string(),
        "--receipt".into(),
        receipt.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    (receipt, run(&args).ok().clone())
}

/// The unpacked tree of `packet`, at `into`.
fn unpacked(packet: &Path, into: &Path) -> PathBuf {
    unpack(packet, into, &[]);
    into.to_path_buf()
}

/// `pack --workspace ws --harness h --harness-kind kind -o out [extra]`.
#[track_caller]
fn pack_harness(ws: &Path, h: &Path, kind: &str, out: &Path, extra: &[&str]) -> Value {
    let h = h.to_str().unwrap();
    let mut args = vec!["--harness", h, "--harness-kind", kind];
    args.extend_from_slice(extra);
    pack(ws, out, &args)
}

/// Fresh bytes for a credential nobody else has.
fn key(what: &str) -> String {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(what);
    format!("sk-{what}-{r:016x}")
}

/// A test's session: a temporary directory with the mock model API, and
/// the fixed path every placement uses (docs/harnesses.md: `/session`)
/// with its workspace (a README) and harness directory.
struct Session {
    _tmp: tempfile::TempDir,
    /// The temporary directory.
    t: PathBuf,
    mock: Mock,
    /// The fixed path.
    s: PathBuf,
    ws: PathBuf,
    h: PathBuf,
    /// `HOME` for the harness: empty, so nothing of the user's is used.
    home: PathBuf,
}

impl Session {
    fn new() -> Session {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path().to_path_buf();
        let mock = Mock::start(&t);
        let s = t.join("session");
        let (ws, h) = (s.join("workspace"), s.join("harness"));
        write(&ws, "README.md", b"# a project\n");
        fs::create_dir_all(&h).unwrap();
        Session {
            _tmp: tmp,
            home: t.join("home"),
            t,
            mock,
            s,
            ws,
            h,
        }
    }

    /// The laptop's turn is done: its directories go aside, leaving the
    /// fixed path an empty directory to mount on.
    fn leave_laptop(&self) {
        fs::rename(&self.s, self.t.join("laptop")).unwrap();
        fs::create_dir(&self.s).unwrap();
    }

    /// A pod and then another machine: `p1` mounted at the fixed path,
    /// `turn("prompt two")`, `seal --rebase` (with `seal_extra`), unmounted;
    /// the sealed packet mounted there with a new upper directory,
    /// `turn("prompt three")`. Returns the sealed packet and the mount.
    fn resume_twice(
        &self,
        p1: &Path,
        seal_extra: &[&str],
        mut turn: impl FnMut(&str),
    ) -> (PathBuf, Mounted) {
        let m = Mounted::new(p1, &self.s, &self.t.join("upper-1"), &[]);
        turn("prompt two");
        let p2 = self.t.join("turn-2.packet");
        let mut extra = vec!["--rebase"];
        extra.extend_from_slice(seal_extra);
        seal(&self.s, &p2, &extra);
        m.umount();
        let m = Mounted::new(&p2, &self.s, &self.t.join("upper-2"), &[]);
        turn("prompt three");
        (p2, m)
    }
}

#[test]
fn codex_resumes_by_thread_id_across_laptop_pod_and_another_machine_with_fresh_credentials() {
    if !fuse_available() {
        return;
    }
    let Some(codex) = tool("codex") else { return };
    let ses = Session::new();
    let mock = &ses.mock;
    let (t, s) = (ses.t.clone(), ses.s.clone());
    let (ws, h, home) = (ses.ws.clone(), ses.h.clone(), ses.home.clone());
    let config = format!(
        "model = \"mock-model\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\n\
         name = \"mock\"\nbase_url = \"http://127.0.0.1:{}/v1\"\nwire_api = \"responses\"\n\
         requires_openai_auth = true\n",
        mock.port
    );
    write(&h, "config.toml", config.as_bytes());
    let auth = |k: &str| format!("{{\"OPENAI_API_KEY\":\"{k}\"}}");
    let (laptop_key, pod_key, other_key) = (key("laptop"), key("pod"), key("other"));
    write(&h, "auth.json", auth(&laptop_key).as_bytes());
    let codex_exec = |args: &[&str]| {
        let mut c = command(&codex, &ws, &home);
        c.env("CODEX_HOME", &h)
            .args(["exec", "--skip-git-repo-check"])
            .args(args);
        harness(&mut c)
    };
    let mut hist = History::new(mock, "/v1/responses");

    // The laptop: a plain CODEX_HOME, the user's own auth.json.
    codex_exec(&["prompt one"]);
    hist.turn("prompt one", &laptop_key);
    let p1 = t.join("turn-1.packet");
    let packed = pack_harness(&ws, &h, "codex", &p1, &[]);
    let excluded = excluded_paths(&packed);
    assert!(excluded.contains(&"harness/auth.json"), "{excluded:?}");
    // Codex's files of this machine stay here (docs/harnesses.md).
    for machine in ["harness/installation_id", "harness/thread-writer-locks"] {
        assert!(excluded.contains(&machine), "{excluded:?}");
    }
    assert!(
        packed["excluded"]
            .to_string()
            .contains(r#""reason":{"rule":"machine_state","what":"codex installation_id"}"#),
        "{packed}"
    );
    let v = run(["inspect", p1.to_str().unwrap()]).ok().clone();
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{v}");
    let thread = &threads[0];
    let id = thread["id"].as_str().unwrap().to_string();
    assert_eq!(thread["cwd"], ws.to_str().unwrap());
    assert_eq!(thread["history_mode_known"], true, "{thread}");
    assert_eq!(thread["encrypted_content"], false);
    let rollout = thread["rollout"].as_str().unwrap().to_string();
    let laptop_rollout = fs::read(s.join(&rollout)).unwrap();
    assert_eq!(thread["rollout_bytes"], laptop_rollout.len() as u64);
    ses.leave_laptop();

    // A pod: the whole packet at the same path, the credential a Secret.
    write(&t, "pod-secret/auth.json", auth(&pod_key).as_bytes());
    let secret = format!(
        "harness/auth.json={}",
        t.join("pod-secret/auth.json").display()
    );
    let pod_upper = t.join("pod-upper");
    let m = Mounted::new(&p1, &s, &pod_upper, &["--secret", &secret]);
    assert_eq!(m.status()["secrets"][0]["path"], "harness/auth.json");
    codex_exec(&["resume", &id, "prompt two"]);
    hist.turn("prompt two", &pod_key);
    codex_exec(&["resume", &id, "prompt three"]);
    hist.turn("prompt three", &pod_key);
    // A credential the agent writes itself (a login made in the session)
    // is left out by every seal, and stays on the mount.
    let agent_key = key("agent");
    let own = h.join(".credentials.json");
    fs::write(&own, auth(&agent_key)).unwrap();
    let p2 = t.join("turn-3.packet");
    let (r2, sealed) = seal_result(&s, &p2, &["--rebase"]);
    assert!(
        sealed["excluded"].to_string().contains(
            r#"{"path":"harness/.credentials.json","type":"file","reason":{"rule":"credential""#
        ),
        "{sealed}"
    );
    assert_eq!(fs::read_to_string(&own).unwrap(), auth(&agent_key));
    codex_exec(&["resume", &id, "prompt four"]);
    hist.turn("prompt four", &pod_key);
    let p3 = t.join("turn-4.packet");
    let r3 = seal(&s, &p3, &["--rebase"]);
    m.umount();

    // Another machine: the sealed packet at the same path, a new upper
    // directory, its own credential.
    write(&t, "other-secret/auth.json", auth(&other_key).as_bytes());
    let secret = format!(
        "harness/auth.json={}",
        t.join("other-secret/auth.json").display()
    );
    let other_upper = t.join("other-upper");
    let m = Mounted::new(&p3, &s, &other_upper, &["--secret", &secret]);
    codex_exec(&["resume", &id, "prompt five"]);
    hist.turn("prompt five", &other_key);
    let written = fs::read(s.join(&rollout)).unwrap();
    assert!(written.len() > laptop_rollout.len());
    let dbs = sqlite_ok(&h, &t.join("scratch-view"));
    assert!(
        dbs >= 2,
        "Codex 0.169 keeps state_5 and thread_history_1: {dbs} found"
    );
    let p4 = t.join("turn-5.packet");
    let r4 = seal(&s, &p4, &[]);
    m.umount();

    // What Codex wrote is in the packets byte for byte, and sound.
    let first = unpacked(&p1, &t.join("unpacked-1"));
    assert_eq!(fs::read(first.join(&rollout)).unwrap(), laptop_rollout);
    let last = unpacked(&p4, &t.join("unpacked-5"));
    assert_eq!(fs::read(last.join(&rollout)).unwrap(), written);
    assert_eq!(sqlite_ok(&last.join("harness"), &t.join("scratch-5")), dbs);
    // No credential, in any packet, receipt or upper directory.
    for p in [&p1, &p2, &p3, &p4] {
        assert!(!tar_listing(p).contains("auth.json"), "{}", p.display());
    }
    holds_none(
        &[&p1, &p2, &p3, &p4, &r2, &r3, &r4, &pod_upper, &other_upper],
        &[&laptop_key, &pod_key, &other_key],
    );
    // The agent's own credential: in no packet or receipt, and (as it wrote
    // it there) in the pod's upper directory only.
    holds_none(
        &[&p1, &p2, &p3, &p4, &r2, &r3, &r4, &other_upper],
        &[&agent_key],
    );
    let in_upper = files_under(&pod_upper).iter().any(|f| {
        fs::read(f)
            .unwrap()
            .windows(agent_key.len())
            .any(|w| w == agent_key.as_bytes())
    });
    assert!(in_upper, "the agent's own credential stays on the mount");
}

#[test]
fn claude_code_resumes_by_session_id_across_mounts() {
    if !fuse_available() {
        return;
    }
    let Some(claude) = tool("claude") else { return };
    let ses = Session::new();
    let (t, s, ws, h) = (&ses.t, &ses.s, &ses.ws, &ses.h);
    let api_key = key("ant");
    let turn = |args: &[&str]| -> Value {
        let mut c = command(&claude, ws, &ses.home);
        c.env("CLAUDE_CONFIG_DIR", h)
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{}", ses.mock.port),
            )
            .env("ANTHROPIC_API_KEY", &api_key)
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .args(["-p", "--output-format", "json"])
            .args(args);
        serde_json::from_str(&harness(&mut c)).unwrap()
    };
    let mut hist = History::new(&ses.mock, "/v1/messages");
    let first = turn(&["prompt one"]);
    hist.turn("prompt one", &api_key);
    let id = first["session_id"].as_str().unwrap().to_string();
    let p1 = t.join("turn-1.packet");
    pack_harness(ws, h, "claude", &p1, &[]);
    ses.leave_laptop();

    let (p2, m) = ses.resume_twice(&p1, &[], |prompt| {
        let r = turn(&["--resume", &id, prompt]);
        assert_eq!(r["session_id"], id.as_str());
        hist.turn(prompt, &api_key);
    });
    // Claude Code keeps the transcript under projects/, by working
    // directory: the same path on every placement finds it.
    let transcripts: Vec<PathBuf> = files_under(&h.join("projects"))
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(&format!("{id}.jsonl")))
        .collect();
    assert_eq!(transcripts.len(), 1, "{transcripts:?}");
    let written = fs::read(&transcripts[0]).unwrap();
    let rel = transcripts[0].strip_prefix(s).unwrap().to_path_buf();
    let p3 = t.join("turn-3.packet");
    seal(s, &p3, &[]);
    m.umount();
    let last = unpacked(&p3, &t.join("unpacked"));
    assert_eq!(fs::read(last.join(rel)).unwrap(), written);
    holds_none(&[&p1, &p2, &p3], &[&api_key]);
}

#[test]
fn opencode_resumes_by_session_id_across_mounts() {
    if !fuse_available() {
        return;
    }
    let Some(opencode) = tool("opencode") else {
        return;
    };
    let ses = Session::new();
    let (t, s, ws, h) = (&ses.t, &ses.s, &ses.ws, &ses.h);
    let config = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "model": "mock/mock-model",
        "provider": {"mock": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "mock",
            "options": {"baseURL": format!("http://127.0.0.1:{}/v1", ses.mock.port),
                        "apiKey": "{env:MOCK_API_KEY}"},
            "models": {"mock-model": {"name": "mock model"}}
        }}
    });
    write(
        h,
        "config/opencode/opencode.json",
        config.to_string().as_bytes(),
    );
    let api_key = key("opencode");
    let turn = |args: &[&str]| -> String {
        let mut c = command(&opencode, ws, &ses.home);
        c.env("XDG_CONFIG_HOME", h.join("config"))
            .env("XDG_DATA_HOME", h.join("data"))
            .env("XDG_STATE_HOME", h.join("state"))
            .env("XDG_CACHE_HOME", t.join("cache"))
            .env("MOCK_API_KEY", &api_key)
            .args(["run", "--format", "json"])
            .args(args);
        let out = harness(&mut c);
        let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        first["sessionID"].as_str().unwrap().to_string()
    };
    let mut hist = History::new(&ses.mock, "/v1/chat/completions");
    let id = turn(&["prompt one"]);
    hist.turn("prompt one", &api_key);
    let p1 = t.join("turn-1.packet");
    // opencode.db holds the sessions: packed knowingly (see harnesses.md).
    pack_harness(ws, h, "opencode", &p1, &["--keep", "opencode.db"]);
    ses.leave_laptop();

    let (p2, m) = ses.resume_twice(&p1, &["--keep", "opencode.db"], |prompt| {
        assert_eq!(turn(&["--session", &id, prompt]), id);
        hist.turn(prompt, &api_key);
    });
    let p3 = t.join("turn-3.packet");
    seal(s, &p3, &["--keep", "opencode.db"]);
    m.umount();
    let last = unpacked(&p3, &t.join("unpacked"));
    assert!(sqlite_ok(&last.join("harness"), &t.join("scratch")) >= 1);
    holds_none(&[&p1, &p2, &p3], &[&api_key]);
    // What `--keep opencode.db` packs knowingly: its credential tables,
    // empty with a provider whose key comes from the environment.
    let db = last.join("harness/data/opencode/opencode.db");
    let counts = python(
        "import sqlite3, sys\n\
         c = sqlite3.connect(sys.argv[1])\n\
         print([c.execute(f'select count(*) from {t}').fetchone()[0] \
                for t in ('account', 'control_account', 'credential', 'session')])",
        &[db.as_os_str()],
    );
    assert_eq!(
        counts, "[0, 0, 0, 1]",
        "account, control_account, credential, session"
    );
}
