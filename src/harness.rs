//! What a packet's harness part tells an orchestrator without mounting:
//! for Codex, its threads (`inspect`).
//!
//! Codex keeps each thread in a rollout, `sessions/YYYY/MM/DD/rollout-*.jsonl`
//! (`archived_sessions/` once archived) under `CODEX_HOME`: JSON lines whose
//! first is a `session_meta` record (`payload.id`, `payload.cwd`,
//! `payload.history_mode`, `payload.cli_version`). The threads are found
//! from the manifest; each rollout is read once, verified against the
//! manifest as it is read, for its first line and for provider-encrypted
//! reasoning (`"encrypted_content":"…"`), which only the provider that
//! wrote it (with the same credentials) can resume. Reads only. Parsing is
//! apart from the I/O, and tested with tables.

use serde::Serialize;
use serde_json::Value;

use crate::packet::manifest::{Entry, EntryKind, Manifest};
use crate::packet::reader::{Event, Packet};

/// The history modes Codex 0.169 writes in `session_meta`. Any other
/// value is reported as it is, marked unknown: a newer Codex may have
/// meant something this list cannot say, and guessing `legacy` would have
/// a resume treat a thread as what it is not.
pub const KNOWN_HISTORY_MODES: &[&str] = &["legacy", "paginated"];

/// The longest first line read from a rollout (Codex's `session_meta`
/// carries its base instructions: tens of KiB). A longer one is reported,
/// not read into memory.
pub const MAX_FIRST_LINE: usize = 4 << 20;

/// The byte string that marks provider-encrypted reasoning in a rollout
/// (Codex writes compact JSON; `"encrypted_content":null` is not it).
const ENCRYPTED: &[u8] = b"\"encrypted_content\":\"";

/// One Codex thread of a packet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Thread {
    /// The thread id (`session_meta.payload.id`; else the id at the end of
    /// the rollout's name), what `codex exec resume ID` takes.
    pub id: String,
    /// The rollout's packet path.
    pub rollout: String,
    /// Under `archived_sessions/`.
    pub archived: bool,
    /// The directory the thread was started in (`session_meta.payload.cwd`):
    /// a resume by `--last` looks for threads of the current directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `session_meta.payload.history_mode` as written, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_mode: Option<Value>,
    /// Whether `history_mode` is one of [`KNOWN_HISTORY_MODES`] (present
    /// with it only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_mode_known: Option<bool>,
    /// The Codex version that started the thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cli_version: Option<String>,
    /// The rollout's mtime (its last update), nanoseconds since the epoch.
    pub mtime_ns: u64,
    /// The rollout's size.
    pub rollout_bytes: u64,
    /// Whether it carries provider-encrypted reasoning.
    pub encrypted_content: bool,
    /// What kept the rollout from being read as one (no `session_meta`
    /// first line, a content mismatch), when something did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Whether `path` is a Codex rollout of the harness part.
pub fn is_rollout(path: &str) -> bool {
    let Some(rest) = path
        .strip_prefix("harness/sessions/")
        .or_else(|| path.strip_prefix("harness/archived_sessions/"))
    else {
        return false;
    };
    let name = rest.rsplit('/').next().unwrap_or(rest);
    name.starts_with("rollout-") && name.ends_with(".jsonl")
}

/// The thread id at the end of a rollout's name
/// (`rollout-2026-12-06T08-04-07-<uuid>.jsonl`): its last 36 characters.
fn id_from_name(path: &str) -> String {
    let stem = path.rsplit('/').next().unwrap_or(path);
    let stem = stem.strip_suffix(".jsonl").unwrap_or(stem);
    match stem.char_indices().rev().nth(35) {
        Some((at, _)) => stem[at..].to_string(),
        None => stem.to_string(),
    }
}

/// A thread as the manifest alone describes it.
fn from_entry(e: &Entry) -> Option<Thread> {
    let EntryKind::File(f) = &e.kind else {
        return None;
    };
    Some(Thread {
        id: id_from_name(&e.path),
        rollout: e.path.to_string(),
        archived: e.path.starts_with("harness/archived_sessions/"),
        cwd: None,
        history_mode: None,
        history_mode_known: None,
        cli_version: None,
        mtime_ns: f.mtime_ns,
        rollout_bytes: f.size,
        encrypted_content: false,
        problem: None,
    })
}

/// Fills `t` from a rollout's first line (without its newline).
pub fn read_first_line(t: &mut Thread, line: &[u8]) {
    let meta: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            t.problem = Some(format!("the first line is not JSON: {e}"));
            return;
        }
    };
    if meta["type"] != "session_meta" {
        t.problem = Some("the first line is not a session_meta record".into());
        return;
    }
    let p = &meta["payload"];
    if let Some(id) = p["id"].as_str() {
        t.id = id.to_string();
    }
    t.cwd = p["cwd"].as_str().map(Into::into);
    t.cli_version = p["cli_version"].as_str().map(Into::into);
    if let Some(mode) = p.get("history_mode").filter(|m| !m.is_null()) {
        let known = mode
            .as_str()
            .is_some_and(|m| KNOWN_HISTORY_MODES.contains(&m));
        t.history_mode = Some(mode.clone());
        t.history_mode_known = Some(known);
    }
}

/// Reads a rollout's content as it streams by: its first line (bounded)
/// and whether provider-encrypted reasoning (`"encrypted_content":"`)
/// occurs, across piece boundaries too.
#[derive(Default)]
pub struct Scan {
    first: Vec<u8>,
    first_done: bool,
    first_too_long: bool,
    tail: Vec<u8>,
    encrypted: bool,
}

impl Scan {
    /// Takes the next piece of content.
    pub fn feed(&mut self, piece: &[u8]) {
        if !self.first_done {
            let end = piece.iter().position(|&b| b == b'\n');
            let take = &piece[..end.unwrap_or(piece.len())];
            if self.first.len() + take.len() > MAX_FIRST_LINE {
                self.first_too_long = true;
                self.first_done = true;
            } else {
                self.first.extend_from_slice(take);
                self.first_done = end.is_some();
            }
        }
        if !self.encrypted {
            self.tail.extend_from_slice(piece);
            self.encrypted = self.tail.windows(ENCRYPTED.len()).any(|w| w == ENCRYPTED);
            let keep = ENCRYPTED.len() - 1;
            if self.tail.len() > keep {
                self.tail.drain(..self.tail.len() - keep);
            }
        }
    }

    /// Fills `t` from what was read.
    pub fn finish(self, t: &mut Thread) {
        t.encrypted_content = self.encrypted;
        if self.first_too_long {
            t.problem = Some(format!(
                "the first line is longer than {MAX_FIRST_LINE} bytes; not read"
            ));
        } else {
            read_first_line(t, &self.first);
        }
    }
}

/// The Codex threads `manifest` names, from the manifest alone, each
/// with `problem` saying why its rollout was not read (the packet cannot
/// be opened for reading: cut short, say).
pub fn codex_threads_unread(manifest: &Manifest, problem: &str) -> Vec<Thread> {
    manifest
        .entries
        .iter()
        .filter(|e| is_rollout(&e.path))
        .filter_map(from_entry)
        .map(|mut t| {
            t.problem = Some(format!("the rollout was not read: {problem}"));
            t
        })
        .collect()
}

/// The Codex threads of `packet`'s harness part, in path order, each
/// rollout verified as it is read (one that fails is reported with the
/// reason in `problem`, and what the manifest says of it).
pub fn codex_threads<B: crate::packet::reader::Source>(packet: &Packet<B>) -> Vec<Thread> {
    let mut buf = Vec::new();
    let entries = &packet.manifest.entries;
    (0..entries.len())
        .filter(|&i| is_rollout(&entries[i].path))
        .filter_map(|i| {
            let mut t = from_entry(&entries[i])?;
            let mut scan = Scan::default();
            let read = packet.check_batch(i..i + 1, &mut buf, &mut |ev| {
                if let Event::Data(_, piece) = ev {
                    scan.feed(piece);
                }
                Ok(())
            });
            match read {
                Ok(()) => scan.finish(&mut t),
                Err(e) => t.problem = Some(e.to_string()),
            }
            Some(t)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread() -> Thread {
        Thread {
            id: "from-name".into(),
            rollout: "harness/sessions/r.jsonl".into(),
            archived: false,
            cwd: None,
            history_mode: None,
            history_mode_known: None,
            cli_version: None,
            mtime_ns: 0,
            rollout_bytes: 0,
            encrypted_content: false,
            problem: None,
        }
    }

    #[test]
    fn history_modes_are_reported_as_written_and_unknown_ones_never_as_legacy() {
        let meta = |mode: &str| {
            format!(
                r#"{{"type":"session_meta","payload":{{"id":"t1","cwd":"/session/workspace"{mode}}}}}"#
            )
        };
        let table: &[(&str, Option<Value>, Option<bool>)] = &[
            (
                r#","history_mode":"paginated""#,
                Some("paginated".into()),
                Some(true),
            ),
            (
                r#","history_mode":"legacy""#,
                Some("legacy".into()),
                Some(true),
            ),
            (
                r#","history_mode":"chaptered""#,
                Some("chaptered".into()),
                Some(false),
            ),
            (
                r#","history_mode":{"v":3}"#,
                Some(serde_json::json!({"v":3})),
                Some(false),
            ),
            (r#","history_mode":null"#, None, None),
            ("", None, None),
        ];
        for (mode, want, known) in table {
            let mut t = thread();
            read_first_line(&mut t, meta(mode).as_bytes());
            assert_eq!(t.problem, None, "{mode}");
            assert_eq!(t.id, "t1");
            assert_eq!(t.cwd.as_deref(), Some("/session/workspace"));
            assert_eq!(&t.history_mode, want, "{mode}");
            assert_eq!(&t.history_mode_known, known, "{mode}");
        }
    }

    #[test]
    fn a_first_line_that_is_not_session_meta_is_a_problem_not_a_guess() {
        for (line, why) in [
            (&b"not json"[..], "not JSON"),
            (
                br#"{"type":"response_item","payload":{}}"#,
                "not a session_meta",
            ),
        ] {
            let mut t = thread();
            read_first_line(&mut t, line);
            assert!(t.problem.as_deref().unwrap().contains(why), "{t:?}");
            assert_eq!(t.id, "from-name");
            assert_eq!(t.history_mode, None);
        }
    }

    #[test]
    fn the_scan_finds_encrypted_content_across_pieces_and_only_with_a_string_value() {
        let rollout = b"{\"type\":\"session_meta\",\"payload\":{\"id\":\"x\"}}\n\
            {\"type\":\"response_item\",\"payload\":{\"type\":\"reasoning\",\"encrypted_content\":\"gAAAA\"}}\n";
        for cut in 0..rollout.len() {
            let mut s = Scan::default();
            s.feed(&rollout[..cut]);
            s.feed(&rollout[cut..]);
            let mut t = thread();
            s.finish(&mut t);
            assert!(t.encrypted_content, "cut at {cut}");
            assert_eq!(t.id, "x", "cut at {cut}");
        }
        let mut s = Scan::default();
        s.feed(b"{\"type\":\"session_meta\",\"payload\":{}}\n{\"encrypted_content\":null}\n");
        let mut t = thread();
        s.finish(&mut t);
        assert!(!t.encrypted_content);
    }

    #[test]
    fn rollouts_are_found_by_path_and_ids_by_name() {
        assert!(is_rollout(
            "harness/sessions/2026/12/06/rollout-2026-12-06T08-04-07-01a24a61-b548-7652-bb2e-086918fc46f6.jsonl"
        ));
        assert!(is_rollout("harness/archived_sessions/rollout-x.jsonl"));
        assert!(!is_rollout("workspace/sessions/rollout-x.jsonl"));
        assert!(!is_rollout("harness/sessions/2026/notes.jsonl"));
        assert!(!is_rollout("harness/history.jsonl"));
        assert_eq!(
            id_from_name(
                "harness/sessions/rollout-2026-12-06T08-04-07-01a24a61-b548-7652-bb2e-086918fc46f6.jsonl"
            ),
            "01a24a61-b548-7652-bb2e-086918fc46f6"
        );
        assert_eq!(
            id_from_name("harness/sessions/rollout-x.jsonl"),
            "rollout-x"
        );
    }
}
