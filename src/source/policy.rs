//! What `pack` (and `seal`) leave out: credentials and macOS's Finder and
//! Spotlight litter by default, whatever the user excludes, minus what the
//! user keeps with intent.
//!
//! Precedence, highest first: `--exclude` (always excludes), `--keep` (lifts
//! a default), the defaults. A pattern with a `/` matches the packet path
//! (`workspace/build/**`); one without matches the file name at any depth.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Serialize;

use crate::packet::format::HarnessKind;
use crate::packet::path::Part;

/// Directories excluded by name in both parts.
pub const CREDENTIAL_DIRS: &[&str] = &[".ssh", ".aws", ".gnupg"];
/// Files excluded by name in both parts.
pub const CREDENTIAL_FILES: &[&str] = &[
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".pgpass",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
];
/// Extensions of key and certificate stores, excluded in both parts.
pub const CREDENTIAL_EXTENSIONS: &[&str] = &["pem", "key", "p12", "pfx"];
/// `.env.*` files with these suffixes are templates and are kept.
pub const ENV_TEMPLATE_SUFFIXES: &[&str] =
    &[".example", ".sample", ".template", ".dist", ".defaults"];
/// Directories macOS makes in folders and volumes it shows or indexes
/// (Spotlight's index, the FSEvents log, the Trash, temporary items),
/// excluded by name in both parts: machine state, not the session's, and
/// left out so that a packet packed on a Mac is the one a Linux pack of
/// the same tree gives.
pub const MACOS_DIRS: &[&str] = &[
    ".Spotlight-V100",
    ".fseventsd",
    ".Trashes",
    ".TemporaryItems",
];
/// Finder's per-folder view settings, excluded by name in both parts.
pub const MACOS_FILES: &[&str] = &[".DS_Store"];
/// AppleDouble files (`._name`): extended attributes and resource forks
/// that macOS writes beside a file on volumes without them (FAT, SMB, and
/// FUSE mounts without `noappledouble`), excluded in both parts.
pub const APPLEDOUBLE_PREFIX: &str = "._";

/// SQLite side files: they follow their database's fate.
pub const SQLITE_SIDE_SUFFIXES: &[&str] = &["-wal", "-shm", "-journal"];

/// Harness-specific credential names (matched by name anywhere in the
/// harness part): `(files, directories)`.
pub fn harness_credentials(
    kind: HarnessKind,
) -> (&'static [&'static str], &'static [&'static str]) {
    match kind {
        HarnessKind::Codex => (&["auth.json", ".credentials.json"], &["secrets"]),
        HarnessKind::Claude => (&[".credentials.json"], &[]),
        HarnessKind::Opencode => (&["auth.json", "mcp-auth.json"], &[]),
        HarnessKind::Generic => (&[], &[]),
    }
}

/// Harness files that belong to the machine a harness ran on, not to the
/// session (locks, an installation's id, scratch and telemetry queues),
/// matched by name anywhere in the harness part: `(files, directories)`.
/// Left out by default (another machine makes its own); `--keep` packs them.
pub fn harness_machine_state(
    kind: HarnessKind,
) -> (&'static [&'static str], &'static [&'static str]) {
    match kind {
        HarnessKind::Codex => (&["installation_id"], &["thread-writer-locks", ".tmp"]),
        HarnessKind::Claude => (&[], &["telemetry"]),
        HarnessKind::Opencode => (&[], &["locks"]),
        HarnessKind::Generic => (&[], &[]),
    }
}

/// OpenCode keeps provider credentials inside this database: packing it is
/// refused unless the user excludes it (or keeps it with intent).
pub const OPENCODE_DB: &str = "opencode.db";

/// Why an entry is left out, as reported in results.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Reason {
    /// A default credential rule.
    Credential {
        /// Which rule, e.g. `.ssh directory` or `*.pem`.
        what: String,
    },
    /// A `--exclude` pattern.
    Excluded {
        /// The pattern.
        pattern: String,
        /// A credential rule would have left it out too (and no `--keep`
        /// keeps it): it is a credential all the same, whose other names
        /// are left out with it. Not reported.
        #[serde(skip)]
        credential: bool,
    },
    /// A harness file of the machine it ran on (see
    /// [`harness_machine_state`]).
    MachineState {
        /// Which rule, e.g. `codex installation_id`.
        what: String,
    },
    /// Finder or Spotlight litter (`.DS_Store`, `._*`, `.Spotlight-V100`,
    /// ...): what macOS writes into a tree, not part of the session.
    MacosMetadata {
        /// Which rule, e.g. `.DS_Store` or `AppleDouble ._* file`.
        what: String,
    },
    /// A SQLite side file whose database is excluded.
    SqliteSideFile {
        /// The database it belongs to.
        database: String,
    },
    /// The packet being written, found inside the tree.
    OutputFile,
    /// The root of the other part, found inside this one (`--harness`
    /// inside `--workspace`, or the reverse): packed once, as that part,
    /// under that part's rules.
    OtherPart {
        /// The part it is packed as.
        part: &'static str,
    },
    /// Another name of a file excluded by a rule (a hard link, or the file
    /// seen again through a bind mount): the same bytes under an innocent
    /// name.
    HardLink {
        /// The excluded name it shares its content with.
        of: String,
    },
}

impl Reason {
    /// Left out for holding credentials (a default or harness-kind rule,
    /// whether or not a `--exclude` pattern matched it first), rather than
    /// by the user's choice of paths.
    pub fn is_credential(&self) -> bool {
        matches!(
            self,
            Reason::Credential { .. }
                | Reason::Excluded {
                    credential: true,
                    ..
                }
        )
    }
}

/// The decision for one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Goes into the packet.
    Include,
    /// Left out, for this reason.
    Exclude(Reason),
    /// Packing must stop: the file holds credentials and no rule decides.
    Refuse(String),
}

/// A compiled exclusion policy.
pub struct Policy {
    harness: Option<HarnessKind>,
    exclude: Patterns,
    keep: Patterns,
    /// The `--keep` patterns ignoring case, for the default rules that do
    /// (keys and certificates: `--keep '*.pem'` keeps `CERT.PEM`).
    keep_any_case: Patterns,
}

/// User patterns, split by what they match against.
struct Patterns {
    sources: Vec<String>,
    by_name: GlobSet,
    name_index: Vec<usize>,
    by_path: GlobSet,
    path_index: Vec<usize>,
}

impl Patterns {
    fn new(patterns: &[String], any_case: bool) -> Result<Patterns, String> {
        let mut by_name = GlobSetBuilder::new();
        let mut by_path = GlobSetBuilder::new();
        let (mut name_index, mut path_index) = (Vec::new(), Vec::new());
        for (i, p) in patterns.iter().enumerate() {
            let (glob, whole_path) = compile(p, any_case)?;
            if whole_path {
                by_path.add(glob);
                path_index.push(i);
            } else {
                by_name.add(glob);
                name_index.push(i);
            }
        }
        let build = |b: GlobSetBuilder| b.build().map_err(|e| e.to_string());
        Ok(Patterns {
            sources: patterns.to_vec(),
            by_name: build(by_name)?,
            name_index,
            by_path: build(by_path)?,
            path_index,
        })
    }

    /// The first pattern matching, if any.
    fn find(&self, path: &str, name: &str) -> Option<&str> {
        let hit = self
            .by_path
            .matches(path)
            .first()
            .map(|&k| self.path_index[k])
            .or_else(|| {
                self.by_name
                    .matches(name)
                    .first()
                    .map(|&k| self.name_index[k])
            });
        hit.map(|i| self.sources[i].as_str())
    }
}

/// Compiles `pattern`, and says whether it matches whole packet paths (it
/// has a `/` before its end) rather than names. A trailing `/` is dropped,
/// as gitignore reads it: `secrets/` matches names at any depth, like
/// `secrets`.
fn compile(pattern: &str, any_case: bool) -> Result<(Glob, bool), String> {
    let trimmed = pattern.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(format!(
            "bad pattern `{pattern}`: it is empty; name files (`*.log`) or packet paths (`workspace/target`)"
        ));
    }
    // A pattern with `/` matches whole packet paths, which start with a
    // part's name: one that cannot start so would match nothing, and an
    // exclusion that silently matches nothing leaks what it meant to leave
    // out.
    let whole_path = trimmed.contains('/');
    if whole_path && !may_start_a_part(trimmed) {
        let mut rel = trimmed.trim_start_matches('/');
        while let Some(r) = rel.strip_prefix("./") {
            rel = r.trim_start_matches('/');
        }
        let spelling = if may_start_a_part(rel) {
            format!("write `{rel}`")
        } else {
            format!("write `workspace/{rel}`, or `**/{rel}` for any depth")
        };
        return Err(format!(
            "bad pattern `{pattern}`: a pattern with `/` matches whole packet paths, which start \
             with `workspace/` or `harness/`; {spelling}"
        ));
    }
    // Packet paths and names have no empty, `.` or `..` components: a
    // pattern with one would match nothing (as above).
    if trimmed.split('/').any(|c| matches!(c, "" | "." | "..")) {
        let mut kept: Vec<&str> = Vec::new();
        for c in trimmed.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    kept.pop();
                }
                c => kept.push(c),
            }
        }
        let spelling = match kept.join("/") {
            s if s.is_empty() => String::new(),
            s => format!("; write `{s}`"),
        };
        return Err(format!(
            "bad pattern `{pattern}`: packet paths and names have no empty, `.` or `..` \
             components, so it would match nothing{spelling}"
        ));
    }
    let glob = GlobBuilder::new(trimmed)
        .literal_separator(true)
        .backslash_escape(true)
        .case_insensitive(any_case)
        .build()
        .map_err(|e| format!("bad pattern `{pattern}`: {e}"))?;
    Ok((glob, whole_path))
}

/// Whether a path pattern may match a path starting `workspace/` or
/// `harness/`, judged by its literal start (each alternative of a leading
/// `{a,b}`). Anything it cannot read plainly (nested braces) may.
fn may_start_a_part(pattern: &str) -> bool {
    may_start_a_part_within(pattern, 8)
}

/// [`may_start_a_part`], reading at most `depth` leading braces in turn
/// (each alternative may start with another): past that, it may.
fn may_start_a_part_within(pattern: &str, depth: u8) -> bool {
    if let Some(rest) = pattern.strip_prefix('{') {
        if depth == 0 {
            return true;
        }
        let Some(close) = rest.find('}') else {
            return true;
        };
        let (alternatives, after) = (&rest[..close], &rest[close + 1..]);
        if alternatives.contains(['{', '\\']) {
            return true;
        }
        return alternatives
            .split(',')
            .any(|a| may_start_a_part_within(&format!("{a}{after}"), depth - 1));
    }
    let literal = &pattern[..pattern
        .find(['*', '?', '[', '{', '\\'])
        .unwrap_or(pattern.len())];
    ["workspace/", "harness/"]
        .iter()
        .any(|part| part.starts_with(literal) || literal.starts_with(part))
}

impl Policy {
    /// Compiles a policy. Errors name the bad pattern.
    pub fn new(
        harness: Option<HarnessKind>,
        exclude: &[String],
        keep: &[String],
    ) -> Result<Policy, String> {
        Ok(Policy {
            harness,
            exclude: Patterns::new(exclude, false)?,
            keep: Patterns::new(keep, false)?,
            keep_any_case: Patterns::new(keep, true)?,
        })
    }

    /// Whether a `--keep` pattern lifts default rule `rule` for the entry,
    /// matching as the rule does (in any case where the rule ignores it).
    fn kept(&self, rule: &DefaultRule, path: &str, name: &str) -> bool {
        let keep = match rule {
            DefaultRule::Exclude { any_case: true, .. } => &self.keep_any_case,
            _ => &self.keep,
        };
        keep.find(path, name).is_some()
    }

    /// Judges the entry at packet path `path` (file name `name`).
    pub fn judge(&self, part: Part, path: &str, name: &str, is_dir: bool) -> Verdict {
        let default = self.default_rule(part, name, is_dir);
        if let Some(p) = self.exclude.find(path, name) {
            let credential = default
                .as_ref()
                .is_some_and(|rule| rule.is_credential() && !self.kept(rule, path, name));
            return Verdict::Exclude(Reason::Excluded {
                pattern: p.into(),
                credential,
            });
        }
        match default {
            Some(rule) if self.kept(&rule, path, name) => Verdict::Include,
            Some(DefaultRule::Exclude { what, .. }) => {
                Verdict::Exclude(Reason::Credential { what })
            }
            Some(DefaultRule::Macos(what)) => Verdict::Exclude(Reason::MacosMetadata { what }),
            Some(DefaultRule::Refuse(why)) => Verdict::Refuse(why),
            Some(DefaultRule::MachineState(what)) => {
                Verdict::Exclude(Reason::MachineState { what })
            }
            None => Verdict::Include,
        }
    }

    fn default_rule(&self, part: Part, name: &str, is_dir: bool) -> Option<DefaultRule> {
        let exclude = |what: String| {
            Some(DefaultRule::Exclude {
                what,
                any_case: false,
            })
        };
        if let Some(rule) = macos_rule(name, is_dir) {
            return Some(DefaultRule::Macos(rule));
        }
        if is_dir {
            if CREDENTIAL_DIRS.contains(&name) {
                return exclude(format!("{name} directory"));
            }
            if part == Part::Harness {
                if let Some(kind) = self.harness {
                    if harness_credentials(kind).1.contains(&name) {
                        return exclude(format!("{kind} {name}/ directory"));
                    }
                    if harness_machine_state(kind).1.contains(&name) {
                        return Some(DefaultRule::MachineState(format!(
                            "{kind} {name}/ directory"
                        )));
                    }
                }
            }
            return None;
        }
        if CREDENTIAL_FILES.contains(&name) {
            return exclude(name.to_string());
        }
        // A file with the name of a harness's credential directory
        // (`secrets`) is as much the harness's secret.
        if part == Part::Harness
            && let Some(kind) = self.harness
            && harness_credentials(kind).1.contains(&name)
        {
            return exclude(format!("{kind} {name} file"));
        }
        // As the glob `*.pem` matches: `.pem` too. In any case (`CERT.PEM`):
        // tools export keys with upper-case extensions.
        if let Some((_, ext)) = name.rsplit_once('.') {
            if let Some(rule) = CREDENTIAL_EXTENSIONS
                .iter()
                .find(|e| e.eq_ignore_ascii_case(ext))
            {
                return Some(DefaultRule::Exclude {
                    what: format!("*.{rule}"),
                    any_case: true,
                });
            }
        }
        if name == ".env"
            || (name.starts_with(".env.")
                && !ENV_TEMPLATE_SUFFIXES.iter().any(|s| name.ends_with(s)))
        {
            return exclude(".env file".into());
        }
        if part == Part::Harness {
            if let Some(kind) = self.harness {
                if harness_credentials(kind).0.contains(&name) {
                    return exclude(format!("{kind} {name}"));
                }
                if kind == HarnessKind::Opencode && name == OPENCODE_DB {
                    return Some(DefaultRule::Refuse(format!(
                        "{OPENCODE_DB} holds OpenCode's provider credentials; pass --exclude {OPENCODE_DB} \
                         to leave it out, or --keep {OPENCODE_DB} to pack it knowingly"
                    )));
                }
                if harness_machine_state(kind).0.contains(&name) {
                    return Some(DefaultRule::MachineState(format!("{kind} {name}")));
                }
            }
        }
        None
    }
}

enum DefaultRule {
    /// A credential, left out as `what`; `any_case` when the rule ignores
    /// case in names.
    Exclude { what: String, any_case: bool },
    /// Finder or Spotlight litter: left out.
    Macos(String),
    /// A credential store no rule decides: packing stops.
    Refuse(String),
    /// A file of the machine, left out (not a credential: its other
    /// names are packed).
    MachineState(String),
}

impl DefaultRule {
    fn is_credential(&self) -> bool {
        matches!(self, DefaultRule::Exclude { .. } | DefaultRule::Refuse(_))
    }
}

/// The macOS litter rule that `name` falls under, if any: the directories
/// of [`MACOS_DIRS`], the files of [`MACOS_FILES`], and AppleDouble files
/// (`._` and at least one more byte; a file only: a directory so named is
/// a user's).
fn macos_rule(name: &str, is_dir: bool) -> Option<String> {
    if is_dir {
        return MACOS_DIRS
            .contains(&name)
            .then(|| format!("{name} directory"));
    }
    if MACOS_FILES.contains(&name) {
        return Some(name.to_string());
    }
    (name.len() > APPLEDOUBLE_PREFIX.len() && name.starts_with(APPLEDOUBLE_PREFIX))
        .then(|| "AppleDouble ._* file".to_string())
}

/// What a directory entry is, for [`Policy::judge_dir`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildType {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// Anything else.
    Other,
}

impl Policy {
    /// Judges every entry of the directory at packet path `ppath`; SQLite
    /// side files then follow their database, whatever their own verdict.
    pub fn judge_dir(
        &self,
        part: Part,
        ppath: &str,
        children: &[(&str, ChildType)],
    ) -> Vec<Verdict> {
        let mut verdicts: Vec<Verdict> = children
            .iter()
            .map(|(name, t)| {
                self.judge(part, &format!("{ppath}/{name}"), name, *t == ChildType::Dir)
            })
            .collect();
        let files: std::collections::HashMap<&str, usize> = children
            .iter()
            .enumerate()
            .filter(|(_, (_, t))| *t == ChildType::File)
            .map(|(i, (name, _))| (*name, i))
            .collect();
        for (i, (name, t)) in children.iter().enumerate() {
            if *t != ChildType::File {
                continue;
            }
            let Some(&db) = sqlite_database_of(name).and_then(|base| files.get(base)) else {
                continue;
            };
            verdicts[i] = match &verdicts[db] {
                Verdict::Include => Verdict::Include,
                Verdict::Exclude(_) | Verdict::Refuse(_) => {
                    Verdict::Exclude(Reason::SqliteSideFile {
                        database: format!("{ppath}/{}", children[db].0),
                    })
                }
            };
        }
        verdicts
    }
}

/// If `name` is a SQLite side file (`X-wal`, `X-shm`, `X-journal`), the
/// database name `X`.
pub fn sqlite_database_of(name: &str) -> Option<&str> {
    SQLITE_SIDE_SUFFIXES
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|base| !base.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(p: &Policy, path: &str, is_dir: bool) -> Verdict {
        let part = Part::of(path).unwrap();
        let name = crate::packet::path::file_name(path);
        p.judge(part, path, name, is_dir)
    }

    #[test]
    fn default_exclusions_table() {
        let p = Policy::new(Some(HarnessKind::Codex), &[], &[]).unwrap();
        let excluded = [
            ("workspace/.ssh", true),
            ("workspace/a/.aws", true),
            ("workspace/.gnupg", true),
            ("workspace/.netrc", false),
            ("workspace/_netrc", false),
            ("workspace/.npmrc", false),
            ("workspace/.pypirc", false),
            ("workspace/.git-credentials", false),
            ("workspace/.pgpass", false),
            ("workspace/id_rsa", false),
            ("workspace/id_dsa", false),
            ("workspace/id_ecdsa", false),
            ("workspace/k/id_ed25519", false),
            ("workspace/cert.pem", false),
            ("workspace/server.key", false),
            ("workspace/a.p12", false),
            ("workspace/a.pfx", false),
            ("workspace/.pem", false),
            ("workspace/.key", false),
            ("workspace/CERT.PEM", false),
            ("workspace/tls.Key", false),
            ("workspace/.env", false),
            ("workspace/.env.local", false),
            ("workspace/.env.production", false),
            ("harness/auth.json", false),
            ("harness/.credentials.json", false),
            ("harness/secrets", true),
        ];
        for (path, is_dir) in excluded {
            assert!(
                matches!(judge(&p, path, is_dir), Verdict::Exclude(_)),
                "{path} should be excluded"
            );
        }
        let kept = [
            ("workspace/.env.example", false),
            ("workspace/.env.sample", false),
            ("workspace/.env.template", false),
            ("workspace/.env.dist", false),
            ("workspace/.env.defaults", false),
            ("workspace/id_rsa.pub", false),
            ("workspace/key", false),
            ("workspace/pem", false),
            ("workspace/a.pem.txt", false),
            ("workspace/auth.json", false),
            ("workspace/secrets", true),
            ("workspace/.ssh", false),
            ("harness/history.jsonl", false),
        ];
        for (path, is_dir) in kept {
            assert_eq!(
                judge(&p, path, is_dir),
                Verdict::Include,
                "{path} should be kept"
            );
        }
    }

    #[test]
    fn macos_litter_is_left_out_and_kept_on_request() {
        let p = Policy::new(None, &[], &[]).unwrap();
        let table = [
            ("workspace/.DS_Store", false, Some(".DS_Store")),
            ("workspace/src/.DS_Store", false, Some(".DS_Store")),
            ("workspace/._notes.md", false, Some("AppleDouble ._* file")),
            (
                "workspace/a/._.DS_Store",
                false,
                Some("AppleDouble ._* file"),
            ),
            (
                "workspace/.Spotlight-V100",
                true,
                Some(".Spotlight-V100 directory"),
            ),
            ("workspace/.fseventsd", true, Some(".fseventsd directory")),
            ("workspace/.Trashes", true, Some(".Trashes directory")),
            (
                "workspace/.TemporaryItems",
                true,
                Some(".TemporaryItems directory"),
            ),
            // Not litter: the bare prefix, a directory named like an
            // AppleDouble file, a file named like a litter directory.
            ("workspace/._", false, None),
            ("workspace/._build", true, None),
            ("workspace/.Trashes", false, None),
            ("workspace/.DS_Store", true, None),
            ("workspace/DS_Store", false, None),
        ];
        for (path, is_dir, what) in table {
            let want = match what {
                Some(w) => Verdict::Exclude(Reason::MacosMetadata { what: w.into() }),
                None => Verdict::Include,
            };
            assert_eq!(judge(&p, path, is_dir), want, "{path}");
        }
        // `--keep` keeps one knowingly; an `--exclude` of one is the
        // user's, not a credential.
        let p = Policy::new(None, &[".Trashes".into()], &[".DS_Store".into()]).unwrap();
        assert_eq!(judge(&p, "workspace/.DS_Store", false), Verdict::Include);
        assert!(matches!(
            judge(&p, "workspace/._x", false),
            Verdict::Exclude(Reason::MacosMetadata { .. })
        ));
        let Verdict::Exclude(r) = judge(&p, "workspace/.Trashes", true) else {
            panic!("not excluded")
        };
        assert!(!r.is_credential());
    }

    #[test]
    fn harness_kinds_differ() {
        let claude = Policy::new(Some(HarnessKind::Claude), &[], &[]).unwrap();
        assert!(matches!(
            judge(&claude, "harness/.credentials.json", false),
            Verdict::Exclude(_)
        ));
        assert_eq!(judge(&claude, "harness/auth.json", false), Verdict::Include);
        let oc = Policy::new(Some(HarnessKind::Opencode), &[], &[]).unwrap();
        assert!(matches!(
            judge(&oc, "harness/mcp-auth.json", false),
            Verdict::Exclude(_)
        ));
        assert!(matches!(
            judge(&oc, "harness/opencode.db", false),
            Verdict::Refuse(_)
        ));
        let oc_ex = Policy::new(Some(HarnessKind::Opencode), &["opencode.db".into()], &[]).unwrap();
        assert!(matches!(
            judge(&oc_ex, "harness/opencode.db", false),
            Verdict::Exclude(_)
        ));
        let oc_keep =
            Policy::new(Some(HarnessKind::Opencode), &[], &["opencode.db".into()]).unwrap();
        assert_eq!(
            judge(&oc_keep, "harness/opencode.db", false),
            Verdict::Include
        );
    }

    #[test]
    fn machine_state_of_each_harness_is_left_out_as_such_and_kept_on_request() {
        let table: &[(HarnessKind, &str, bool, &str)] = &[
            (
                HarnessKind::Codex,
                "harness/installation_id",
                false,
                "codex installation_id",
            ),
            (
                HarnessKind::Codex,
                "harness/thread-writer-locks",
                true,
                "codex thread-writer-locks/ directory",
            ),
            (
                HarnessKind::Codex,
                "harness/.tmp",
                true,
                "codex .tmp/ directory",
            ),
            (
                HarnessKind::Claude,
                "harness/telemetry",
                true,
                "claude telemetry/ directory",
            ),
            (
                HarnessKind::Opencode,
                "harness/state/opencode/locks",
                true,
                "opencode locks/ directory",
            ),
        ];
        for &(kind, path, dir, what) in table {
            let p = Policy::new(Some(kind), &[], &[]).unwrap();
            let want = Verdict::Exclude(Reason::MachineState { what: what.into() });
            assert_eq!(judge(&p, path, dir), want, "{path}");
            assert!(!Reason::MachineState { what: what.into() }.is_credential());
            // Only in the harness part, only for its kind.
            let ws = path.replacen("harness/", "workspace/", 1);
            assert_eq!(judge(&p, &ws, dir), Verdict::Include, "{ws}");
            let generic = Policy::new(Some(HarnessKind::Generic), &[], &[]).unwrap();
            assert_eq!(judge(&generic, path, dir), Verdict::Include, "{path}");
            let name = crate::packet::path::file_name(path).to_string();
            let keep = Policy::new(Some(kind), &[], std::slice::from_ref(&name)).unwrap();
            assert_eq!(judge(&keep, path, dir), Verdict::Include, "{path}");
            // An --exclude of it is the user's choice of path, not a credential.
            let ex = Policy::new(Some(kind), &[name], &[]).unwrap();
            match judge(&ex, path, dir) {
                Verdict::Exclude(r) => assert!(!r.is_credential(), "{path}"),
                v => panic!("{path}: {v:?}"),
            }
        }
        // Codex's sessions, config and databases stay.
        let codex = Policy::new(Some(HarnessKind::Codex), &[], &[]).unwrap();
        for path in [
            "harness/sessions",
            "harness/state_5.sqlite",
            "harness/config.toml",
        ] {
            assert_eq!(
                judge(&codex, path, path == "harness/sessions"),
                Verdict::Include
            );
        }
    }

    #[test]
    fn user_patterns_and_precedence() {
        let p = Policy::new(
            None,
            &[
                "*.log".into(),
                "workspace/build".into(),
                "workspace/cert.pem".into(),
            ],
            &["*.pem".into(), "workspace/.env".into()],
        )
        .unwrap();
        assert!(matches!(
            judge(&p, "workspace/a/b.log", false),
            Verdict::Exclude(Reason::Excluded { .. })
        ));
        assert!(matches!(
            judge(&p, "workspace/build", true),
            Verdict::Exclude(_)
        ));
        assert_eq!(
            judge(&p, "workspace/x/build", true),
            Verdict::Include,
            "path patterns anchor at the root"
        );
        // --keep lifts a default...
        assert_eq!(judge(&p, "workspace/other.pem", false), Verdict::Include);
        // ...matching as the rule does: in any case for keys and
        // certificates, whose rule ignores case...
        assert_eq!(judge(&p, "workspace/CERT.PEM", false), Verdict::Include);
        // ...and exactly where the rule is exact (`.ENV` is no `.env`).
        let env = Policy::new(None, &[], &[".ENV".into(), "ID_RSA".into()]).unwrap();
        assert!(matches!(
            judge(&env, "workspace/id_rsa", false),
            Verdict::Exclude(Reason::Credential { .. })
        ));
        assert_eq!(judge(&p, "workspace/.env", false), Verdict::Include);
        assert!(matches!(
            judge(&p, "workspace/sub/.env", false),
            Verdict::Exclude(_)
        ));
        // ...but never an explicit --exclude.
        assert!(matches!(
            judge(&p, "workspace/cert.pem", false),
            Verdict::Exclude(Reason::Excluded { .. })
        ));
    }

    #[test]
    fn sqlite_side_files() {
        assert_eq!(sqlite_database_of("app.db-wal"), Some("app.db"));
        assert_eq!(sqlite_database_of("app.db-shm"), Some("app.db"));
        assert_eq!(sqlite_database_of("app.db-journal"), Some("app.db"));
        assert_eq!(sqlite_database_of("-wal"), None);
        assert_eq!(sqlite_database_of("app.db"), None);
    }

    #[test]
    fn bad_patterns_are_reported() {
        let err = Policy::new(None, &["a[".into()], &[]).err().unwrap();
        assert!(err.contains("a["), "{err}");
        // Patterns that could match nothing are refused, not ignored, with
        // the spelling that works, itself accepted.
        for (bad, works) in [
            ("", None),
            ("/", None),
            ("src/gen", Some("workspace/src/gen")),
            ("/workspace/target", Some("workspace/target")),
            ("./workspace/x", Some("workspace/x")),
            ("harnessx/y", Some("workspace/harnessx/y")),
            ("{src,lib}/x", Some("workspace/{src,lib}/x")),
            // Packet paths have no empty, `.` or `..` components.
            ("workspace//secrets", Some("workspace/secrets")),
            ("workspace/./secrets", Some("workspace/secrets")),
            ("workspace/secrets/.", Some("workspace/secrets")),
            ("workspace/x/../secrets", Some("workspace/secrets")),
            ("workspace/**/../.env", Some("workspace/.env")),
            (".", None),
            ("..", None),
        ] {
            let err = Policy::new(None, &[bad.into()], &[]).err();
            assert!(err.is_some(), "`{bad}` accepted");
            let err = Policy::new(None, &[], &[bad.into()]).err().unwrap();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
            if let Some(works) = works {
                assert!(err.contains(&format!("`{works}`")), "{err}");
                Policy::new(None, &[works.into()], &[]).unwrap();
            }
        }
        for good in [
            "workspace/target",
            "harness/sessions/*.jsonl",
            "**/node_modules",
            "*/target",
            "w*/x",
            "[wh]*/x",
            "{workspace,harness}/.cache",
            "{src,workspace}/x",
            "work*",
            "target",
            "secrets/",
        ] {
            Policy::new(None, &[good.into()], &[]).unwrap();
        }
        // Leading braces that each may start with another are read a few
        // deep, not in exponential time.
        let nested = format!("{}/x", "{,}".repeat(40));
        let t = std::time::Instant::now();
        let _ = Policy::new(None, &[nested], &[]);
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        // A trailing `/` matches names at any depth, as gitignore reads it.
        let p = Policy::new(None, &["secrets/".into(), "cache//".into()], &[]).unwrap();
        for path in [
            "workspace/secrets",
            "workspace/a/secrets",
            "workspace/cache",
        ] {
            assert!(
                matches!(judge(&p, path, true), Verdict::Exclude(_)),
                "{path}"
            );
        }
        assert_eq!(judge(&p, "workspace/secretsx", true), Verdict::Include);
    }
}
