//! What pack and seal leave out or change, reported in their results, and
//! the one exclusion step both take for every entry they find: pack in a
//! real tree ([`super::walk`]), seal in a mount's merged view. The promise
//! "seal writes the bytes pack writes" rests on both walking through
//! [`ScanReport::classify`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::error::Error;
use super::policy::{ChildType, Policy, Reason, SQLITE_SIDE_SUFFIXES, Verdict};
use super::symlink::{LinkClass, rebase};
use crate::packet::error::LimitKind;
use crate::packet::format::{Limits, MAX_FILE_SIZE, MAX_MTIME_NS};
use crate::packet::manifest::EntryKind;
use crate::packet::path::{Part, check_path};

/// The type of an entry found in a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryType {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else a system may have (a whiteout, a door).
    Unknown,
}

impl EntryType {
    /// The name results give it (`type` of an excluded or dropped entry).
    pub fn name(self) -> &'static str {
        match self {
            EntryType::Dir => "dir",
            EntryType::File => "file",
            EntryType::Symlink => "symlink",
            EntryType::Fifo => "fifo",
            EntryType::Socket => "socket",
            EntryType::CharDevice => "char_device",
            EntryType::BlockDevice => "block_device",
            EntryType::Unknown => "unknown",
        }
    }

    /// What the policy's rules look at.
    fn child_type(self) -> ChildType {
        match self {
            EntryType::Dir => ChildType::Dir,
            EntryType::File => ChildType::File,
            _ => ChildType::Other,
        }
    }
}

/// What becomes of an entry (see [`ScanReport::classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// It goes into the packet: a directory, regular file or symlink whose
    /// path the format takes.
    Take,
    /// It was left out and reported: excluded by a rule, or a special file
    /// (FIFO, socket, device), which a packet cannot hold.
    LeftOut,
    /// Left out as a credential file: its other names (hard links) are
    /// left out too ([`ScanReport::exclude_other_names`]).
    CredentialFile,
    /// Left out as a directory of credentials: the other names of the files
    /// under it are left out too.
    CredentialDir,
}

/// The policy's verdicts on the children of the directory at `dir` (a
/// packet path) of `part`, in their order.
pub fn judge(
    policy: &Policy,
    part: Part,
    dir: &str,
    children: &[(&str, EntryType)],
) -> Vec<Verdict> {
    let names: Vec<(&str, ChildType)> = children
        .iter()
        .map(|&(name, ty)| (name, ty.child_type()))
        .collect();
    policy.judge_dir(part, dir, &names)
}

/// The entries and content bytes a pack has taken so far, across threads
/// and parts (a directory walked and a tar stream read count together),
/// against the limits.
#[derive(Default)]
pub struct Tally {
    entries: AtomicU64,
    bytes: AtomicU64,
}

impl Tally {
    /// Counts one entry of `size` content bytes at `path`.
    pub fn count(&self, path: &str, size: u64, limits: &Limits) -> Result<(), Error> {
        let n = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        if n > limits.max_entries {
            return Err(LimitKind::Entries.exceeded(n, limits, Some(path)).into());
        }
        if size > 0 {
            let b = self
                .bytes
                .fetch_add(size, Ordering::Relaxed)
                .saturating_add(size);
            if b > limits.max_bytes {
                return Err(LimitKind::Bytes.exceeded(b, limits, Some(path)).into());
            }
        }
        Ok(())
    }
}

/// Refuses a file of `size` bytes at `path` that the format cannot hold.
pub fn check_file_size(path: &str, size: u64) -> Result<(), Error> {
    if size > MAX_FILE_SIZE {
        return Err(Error::Refused {
            path: path.into(),
            kind: crate::packet::error::ErrorKind::FormatLimit,
            reason: format!("file of {size} bytes; a packet file holds at most {MAX_FILE_SIZE}"),
        });
    }
    Ok(())
}

/// The refusal of the entry at `path` whose name is not UTF-8.
pub fn non_utf8_name(path: String) -> Error {
    Error::Refused {
        path,
        kind: crate::packet::error::ErrorKind::NonUtf8Name,
        reason: "the name is not UTF-8; rename it, or leave it out with --exclude \
                 (packets hold UTF-8 names so they restore on every platform)"
            .into(),
    }
}

/// The refusal of the symlink at `path` whose target (`shown`) is not UTF-8.
pub fn non_utf8_target(path: &str, shown: &str) -> Error {
    Error::Refused {
        path: path.into(),
        kind: crate::packet::error::ErrorKind::NonUtf8Target,
        reason: format!("symlink target `{shown}` is not UTF-8; packets hold UTF-8 only"),
    }
}

/// What the walk left out or changed, reported in results.
#[derive(Default, Debug, Serialize)]
pub struct ScanReport {
    /// Entries excluded by policy (directories once, not their contents).
    pub excluded: Vec<Excluded>,
    /// Sockets, FIFOs and devices, which a packet cannot hold.
    pub dropped: Vec<Dropped>,
    /// Symlinks whose targets leave their part.
    pub external_symlinks: Vec<Link>,
    /// Absolute symlinks into their part, rewritten as relative.
    pub rebased_symlinks: Vec<Rebased>,
    /// Files whose mtime was outside the format's range, recorded clamped.
    pub clamped_mtimes: Vec<Clamped>,
}

/// An excluded entry.
#[derive(Debug, Serialize)]
pub struct Excluded {
    /// Packet path.
    pub path: String,
    /// Its [`EntryType::name`].
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Why.
    pub reason: Reason,
}

/// A dropped special file.
#[derive(Debug, Serialize)]
pub struct Dropped {
    /// Packet path.
    pub path: String,
    /// `fifo`, `socket`, `char_device`, `block_device`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A symlink and its target.
#[derive(Debug, Serialize)]
pub struct Link {
    /// Packet path.
    pub path: String,
    /// Target, as stored.
    pub target: String,
}

/// A rebased symlink.
#[derive(Debug, Serialize)]
pub struct Rebased {
    /// Packet path.
    pub path: String,
    /// Target on disk.
    pub from: String,
    /// Target stored.
    pub to: String,
}

/// A clamped mtime.
#[derive(Debug, Serialize)]
pub struct Clamped {
    /// Packet path.
    pub path: String,
    /// The mtime on disk, in nanoseconds (as a string: it may be negative
    /// or beyond 64 bits).
    pub mtime_ns: String,
    /// What was recorded.
    pub recorded_ns: u64,
}

impl ScanReport {
    /// Leaves out of `items` every file that is another name of a file
    /// left out as a credential: a hard link to `auth.json` from the
    /// workspace, say, whose bytes are the credentials the rule kept out.
    /// (Names left out by `--exclude` are the user's choice of paths, not
    /// of content: their other names stay.) `excluded` holds the identity
    /// and path of each such file; `file` gives an item's, for files. Each
    /// is reported as a `hard_link` of the first excluded name in path
    /// order, and its SQLite side files follow it; nothing else is
    /// reported of them.
    pub fn exclude_other_names<T, K: Eq + std::hash::Hash>(
        &mut self,
        items: &mut Vec<T>,
        mut excluded: Vec<(K, String)>,
        file: impl Fn(&T) -> Option<(K, &str)>,
    ) {
        if excluded.is_empty() {
            return;
        }
        excluded.sort_by(|a, b| a.1.cmp(&b.1));
        let mut of = HashMap::new();
        for (k, path) in excluded {
            of.entry(k).or_insert(path);
        }
        let mut gone: HashMap<String, Reason> = items
            .iter()
            .filter_map(|t| {
                let (k, path) = file(t)?;
                let of = of.get(&k)?.clone();
                Some((path.to_owned(), Reason::HardLink { of }))
            })
            .collect();
        let sides: HashMap<String, String> = gone
            .keys()
            .flat_map(|db| {
                SQLITE_SIDE_SUFFIXES
                    .iter()
                    .map(move |s| (format!("{db}{s}"), db.clone()))
            })
            .collect();
        for (_, path) in items.iter().filter_map(&file) {
            if let Some(database) = sides.get(path) {
                gone.entry(path.to_owned())
                    .or_insert(Reason::SqliteSideFile {
                        database: database.clone(),
                    });
            }
        }
        items.retain(|t| file(t).is_none_or(|(_, path)| !gone.contains_key(path)));
        self.clamped_mtimes.retain(|c| !gone.contains_key(&c.path));
        for (path, reason) in gone {
            tracing::debug!(%path, ?reason, "excluded: another name of a credential");
            self.excluded.push(Excluded {
                path,
                kind: "file",
                reason,
            });
        }
    }

    /// The mtime to record for the file at `path` whose mtime is `seen`
    /// (nanoseconds, any sign and size): 0 with `zero`, else clamped to
    /// the format's range, a clamped one reported.
    pub fn record_mtime(&mut self, path: &str, seen: i128, zero: bool) -> u64 {
        if zero {
            return 0;
        }
        let clamped = seen.clamp(0, i128::from(MAX_MTIME_NS));
        if clamped != seen {
            self.clamped_mtimes.push(Clamped {
                path: path.into(),
                mtime_ns: seen.to_string(),
                recorded_ns: clamped as u64,
            });
        }
        clamped as u64
    }

    /// Puts every list in path order, so that results are deterministic
    /// too.
    pub fn sort(&mut self) {
        self.excluded.sort_by(|a, b| a.path.cmp(&b.path));
        self.dropped.sort_by(|a, b| a.path.cmp(&b.path));
        self.external_symlinks.sort_by(|a, b| a.path.cmp(&b.path));
        self.rebased_symlinks.sort_by(|a, b| a.path.cmp(&b.path));
        self.clamped_mtimes.sort_by(|a, b| a.path.cmp(&b.path));
    }

    pub(crate) fn merge(&mut self, o: ScanReport) {
        self.excluded.extend(o.excluded);
        self.dropped.extend(o.dropped);
        self.external_symlinks.extend(o.external_symlinks);
        self.rebased_symlinks.extend(o.rebased_symlinks);
        self.clamped_mtimes.extend(o.clamped_mtimes);
    }
}

impl ScanReport {
    /// The one exclusion step of pack and seal: what becomes of the entry
    /// at packet path `path`, of type `ty`, given the policy's `verdict`
    /// on it. An excluded entry is reported (by its type's name), a refused
    /// one (a credential store) is an error, an included special file is
    /// dropped and reported, and what is taken must be a path the format
    /// holds within `limits`.
    pub fn classify(
        &mut self,
        path: &str,
        ty: EntryType,
        verdict: Verdict,
        limits: &Limits,
    ) -> Result<Step, Error> {
        match verdict {
            Verdict::Include => {}
            Verdict::Exclude(reason) => {
                tracing::debug!(%path, ?reason, "excluded");
                let step = match ty {
                    EntryType::File if reason.is_credential() => Step::CredentialFile,
                    EntryType::Dir if reason.is_credential() => Step::CredentialDir,
                    _ => Step::LeftOut,
                };
                self.excluded.push(Excluded {
                    path: path.to_owned(),
                    kind: ty.name(),
                    reason,
                });
                return Ok(step);
            }
            Verdict::Refuse(reason) => {
                return Err(Error::Refused {
                    path: path.to_owned(),
                    kind: crate::packet::error::ErrorKind::CredentialStore,
                    reason,
                });
            }
        }
        check_path(path, limits).map_err(Error::from_validation)?;
        match ty {
            EntryType::Dir | EntryType::File | EntryType::Symlink => Ok(Step::Take),
            special => {
                tracing::debug!(%path, kind = special.name(), "dropped special file");
                self.dropped.push(Dropped {
                    path: path.to_owned(),
                    kind: special.name(),
                });
                Ok(Step::LeftOut)
            }
        }
    }
}

impl ScanReport {
    /// Checks the manifest a tree gives before anything is hashed, for pack
    /// and seal alike: the packet rules ([`Manifest::validate`]), the length
    /// readers allow it, and symlinks that leave their part through others
    /// ([`ScanReport::resolved_escapes`]).
    ///
    /// [`Manifest::validate`]: crate::packet::manifest::Manifest::validate
    pub fn check_manifest(
        &mut self,
        manifest: &crate::packet::manifest::Manifest,
        limits: &Limits,
        reject_external: bool,
    ) -> Result<(), Error> {
        manifest.validate(limits).map_err(Error::from_validation)?;
        manifest.check_encoded_len(limits)?;
        self.resolved_escapes(manifest, reject_external)
            .map_err(|(path, reason)| Error::Refused {
                path,
                kind: crate::packet::error::ErrorKind::ExternalSymlink,
                reason,
            })
    }

    /// Adds to `external_symlinks` the symlinks of `manifest` that stay in
    /// their part by their text but leave it through the packet's own
    /// symlinks (`sub/alias/../../x` with `alias -> ..`), resolved as
    /// `unpack --strict-symlinks` resolves them, so that a packet made with
    /// `--reject-external-symlinks` passes that check. With
    /// `reject_external`, the first such link is refused instead: `Err`
    /// with its path and the reason.
    pub fn resolved_escapes(
        &mut self,
        manifest: &crate::packet::manifest::Manifest,
        reject_external: bool,
    ) -> Result<(), (String, String)> {
        use crate::packet::resolve::{Escape, escaping};
        let known: std::collections::HashSet<String> = self
            .external_symlinks
            .iter()
            .map(|l| l.path.clone())
            .collect();
        let before = self.external_symlinks.len();
        for (i, escape) in escaping(manifest, None, false) {
            let e = &manifest.entries[i];
            let (EntryKind::Symlink(target), Some(part)) = (&e.kind, Part::of(&e.path)) else {
                continue;
            };
            if known.contains(&*e.path) {
                continue;
            }
            if reject_external {
                let how = match escape {
                    Escape::Leaves => "through the symlinks it passes",
                    Escape::Budget => "as far as resolving it within its step budget shows",
                };
                return Err((
                    e.path.to_string(),
                    format!(
                        "symlink target `{target}` leaves the {part} part {how} \
                         (--reject-external-symlinks)"
                    ),
                ));
            }
            self.external_symlinks.push(Link {
                path: e.path.to_string(),
                target: target.to_string(),
            });
        }
        if self.external_symlinks.len() > before {
            self.external_symlinks.sort_by(|a, b| a.path.cmp(&b.path));
        }
        Ok(())
    }

    /// The target to store for the symlink at `path`, `depth` below the
    /// root of `part` (spelled `roots`), reporting it when rebased or
    /// external; `Err` with the reason when it is external and
    /// `reject_external` refuses it. Shared by pack and seal.
    pub fn symlink(
        &mut self,
        path: &str,
        target: &str,
        depth: usize,
        roots: &[String],
        part: Part,
        reject_external: bool,
    ) -> Result<String, String> {
        self.note_symlink(
            path,
            target,
            rebase(target, depth, roots),
            part,
            reject_external,
        )
    }

    /// Reports the symlink at `path` whose target `target` was decided to be
    /// stored as `stored`, of class `class` (see [`ScanReport::symlink`]).
    pub(crate) fn note_symlink(
        &mut self,
        path: &str,
        target: &str,
        (stored, class): (String, LinkClass),
        part: Part,
        reject_external: bool,
    ) -> Result<String, String> {
        if matches!(class, LinkClass::External | LinkClass::RebasedExternal) {
            if reject_external {
                return Err(format!(
                    "symlink target `{target}` leaves the {part} part (--reject-external-symlinks)"
                ));
            }
            self.external_symlinks.push(Link {
                path: path.into(),
                target: stored.clone(),
            });
        }
        if matches!(class, LinkClass::Rebased | LinkClass::RebasedExternal) {
            self.rebased_symlinks.push(Rebased {
                path: path.into(),
                from: target.into(),
                to: stored.clone(),
            });
        }
        Ok(stored)
    }
}
