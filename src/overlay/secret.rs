//! Files shown in the merged view from outside it (`mount --secret`): a
//! harness's credentials, served read-only from a file of the host (a
//! Kubernetes Secret, the user's real `~/.codex/auth.json`) and never part
//! of the session.
//!
//! A secret lives beside the state, not in it: no journal record, no node,
//! no upper data file names it, so a seal (which walks the state) never
//! sees it, and its bytes never reach the upper directory. It behaves like
//! a read-only bind mount of the host file on its path: it shadows what
//! the view has there (a seal captures that, as if the secret were not
//! mounted), writes and metadata changes fail with `EROFS`, and its name
//! cannot be removed, renamed or replaced (`EBUSY`), linked elsewhere
//! (`EXDEV`) or created again (`EEXIST`); its directory cannot be removed
//! (`ENOTEMPTY`). Its content and size are the host file's at each request
//! (a rotated Secret is served as it is now).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::error::{Error, Result};
use super::ino::{Ino, candidate};
use super::node::Kind;
use super::{Attr, listing};

/// Permission bits of a secret: readable by the owner the mount shows
/// (`--uid`), nobody else, and read-only.
pub const SECRET_PERM: u16 = 0o400;

/// One file shown from the host.
#[derive(Debug)]
pub struct Secret {
    /// Its path in the view, relative to the mount's root.
    pub path: String,
    /// The host file, absolute.
    pub host: PathBuf,
    /// The directory it is in (its inode number, kept however the
    /// directory is renamed).
    pub(super) parent: Ino,
    /// Its name there.
    pub(super) name: Box<str>,
    /// Its inode number: from its path in a domain of its own, so it
    /// equals no entry's number (but by a 64-bit hash collision).
    pub(super) ino: Ino,
}

/// The secrets of a mount (a handful: looked up by scanning).
#[derive(Debug, Default)]
pub struct Secrets {
    list: Vec<Secret>,
}

impl Secrets {
    /// The secret named `name` in directory `parent`.
    pub fn at(&self, parent: Ino, name: &str) -> Option<&Secret> {
        self.list
            .iter()
            .find(|s| s.parent == parent && *s.name == *name)
    }

    /// The secret of inode `ino`.
    pub fn get(&self, ino: Ino) -> Option<&Secret> {
        self.list.iter().find(|s| s.ino == ino)
    }

    /// Whether directory `dir` holds a secret.
    pub fn holds(&self, dir: Ino) -> bool {
        self.list.iter().any(|s| s.parent == dir)
    }

    /// Every secret, in the order given.
    pub fn list(&self) -> &[Secret] {
        &self.list
    }

    /// Adds the secret at view path `path` (in directory `parent`, named
    /// `name`), served from `host`, once [`check`] has passed them.
    pub(super) fn add(&mut self, path: &str, parent: Ino, name: &str, host: &Path) {
        self.list.push(Secret {
            path: path.into(),
            host: crate::sys::absolute(host),
            parent,
            name: name.into(),
            ino: candidate(&format!("\0secret\0{path}"), 0),
        });
    }
}

/// A refusal of the secret at `path`.
pub(super) fn refuse(path: &str, reason: &str) -> Error {
    Error::Refused {
        path: path.into(),
        kind: crate::packet::error::ErrorKind::SecretUnusable,
        reason: reason.into(),
    }
}

/// The components of view path `path`, refused unless it is a relative
/// path inside the view (no empty, `.` or `..` component, none too long).
pub fn components(path: &str) -> Result<Vec<&str>> {
    let names: Vec<&str> = path.split('/').collect();
    if names.iter().any(|n| {
        n.is_empty()
            || *n == "."
            || *n == ".."
            || n.len() > crate::packet::format::MAX_COMPONENT_BYTES
    }) {
        return Err(refuse(
            path,
            "not a path inside the view: write it relative to the mountpoint, without \
             empty, `.` or `..` components (`harness/auth.json`)",
        ));
    }
    Ok(names)
}

/// Checks what can be checked of `mount --secret` values before anything
/// is mounted or the upper directory touched: each view path's form, no
/// path given twice, and each host file a regular file this process can
/// read (its directory in the view is checked by
/// [`super::Overlay::add_secret`]).
pub fn check(specs: &[(String, PathBuf)]) -> Result<()> {
    for (k, (path, host)) in specs.iter().enumerate() {
        components(path)?;
        if specs[..k].iter().any(|(p, _)| p == path) {
            return Err(refuse(path, "given twice with --secret"));
        }
        let shown = crate::packet::path::shown_path(host);
        let meta = File::open(host)
            .and_then(|f| f.metadata())
            .map_err(|e| refuse(path, &format!("cannot read {shown}: {e}")))?;
        if !meta.is_file() {
            return Err(refuse(
                path,
                &format!("{shown} is not a regular file; name the credential file itself"),
            ));
        }
    }
    Ok(())
}

impl Secret {
    fn host_error(&self, source: std::io::Error) -> Error {
        Error::Secret {
            path: self.path.clone(),
            host: crate::packet::path::shown_path(&self.host),
            source,
        }
    }

    /// Its attributes: the host file's size and times (followed through
    /// symlinks, as a Kubernetes Secret's `..data` link is), shown as a
    /// read-only file of the mount's owner.
    pub fn attr(&self, uid: u32, gid: u32) -> Result<Attr> {
        let m = std::fs::metadata(&self.host).map_err(|e| self.host_error(e))?;
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        Ok(Attr {
            ino: self.ino,
            generation: 0,
            kind: Kind::File,
            size: m.len(),
            blocks: m.len().div_ceil(512),
            atime: ns(m.atime(), m.atime_nsec()),
            mtime: ns(m.mtime(), m.mtime_nsec()),
            ctime: ns(m.ctime(), m.ctime_nsec()),
            perm: SECRET_PERM,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
        })
    }

    /// Appends up to `size` bytes at `offset` of the host file to `out`,
    /// read now (the file is opened for each read: it is small, and a
    /// rotated one is then served as it is).
    pub fn read(&self, offset: u64, size: u32, out: &mut Vec<u8>) -> Result<()> {
        let f = File::open(&self.host).map_err(|e| self.host_error(e))?;
        crate::sys::read_append_at(&f, offset, size, out).map_err(|e| self.host_error(e))
    }

    /// Its position in its directory's listing.
    pub fn cookie(&self) -> u64 {
        listing::cookie(&self.name)
    }

    /// Its name in its directory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its inode number.
    pub fn ino(&self) -> Ino {
        self.ino
    }
}
