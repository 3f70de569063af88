//! Filesystem operations for model tests: drawn at random, applied to a
//! mount and to a plain directory alike.
#![allow(dead_code)]

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use proptest::prelude::*;

use super::snapshot;

/// Names the operations draw from: existing lower entries and new ones, at
/// two depths, so operations collide often; and names the exclusion policy
/// acts on (credentials, a SQLite database and its side files), so that
/// seal and pack are compared on what they leave out too.
pub const NAMES: &[&str] = &[
    "README.md",
    "empty",
    "link",
    "src",
    "src/main.rs",
    "src/lib",
    "src/lib/mod.rs",
    "bin",
    "bin/run.sh",
    "emptydir",
    "a",
    "b",
    "src/a",
    "emptydir/b",
    "d",
    "d/e",
    "bin/a",
    ".env",
    ".ssh",
    ".ssh/id_ed25519",
    "src/key.pem",
    "app.db",
    "app.db-wal",
    "app.db-shm",
    "auth.json",
];

#[derive(Clone, Debug)]
pub enum Op {
    Write(usize, Vec<u8>),
    Append(usize, Vec<u8>),
    WriteAt(usize, u64, Vec<u8>),
    Truncate(usize, u64),
    Mkdir(usize),
    Rmdir(usize),
    Unlink(usize),
    Rename(usize, usize),
    Symlink(usize, usize),
    Link(usize, usize),
    Chmod(usize, u32),
    ReadDir(usize),
    Read(usize),
    /// A FIFO, which a packet cannot hold.
    Mkfifo(usize),
    /// A symlink whose target leaves the tree.
    SymlinkOut(usize),
}

pub fn op() -> impl Strategy<Value = Op> {
    let n = 0..NAMES.len();
    let bytes = prop::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        (n.clone(), bytes.clone()).prop_map(|(a, b)| Op::Write(a, b)),
        (n.clone(), bytes.clone()).prop_map(|(a, b)| Op::Append(a, b)),
        (n.clone(), 0u64..5000, bytes).prop_map(|(a, o, b)| Op::WriteAt(a, o, b)),
        (n.clone(), 0u64..5000).prop_map(|(a, l)| Op::Truncate(a, l)),
        n.clone().prop_map(Op::Mkdir),
        n.clone().prop_map(Op::Rmdir),
        n.clone().prop_map(Op::Unlink),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Symlink(a, b)),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Link(a, b)),
        (
            n.clone(),
            prop_oneof![Just(0o600u32), Just(0o644), Just(0o755), Just(0o700)]
        )
            .prop_map(|(a, m)| Op::Chmod(a, m)),
        n.clone().prop_map(Op::ReadDir),
        n.clone().prop_map(Op::Mkfifo),
        n.clone().prop_map(Op::SymlinkOut),
        n.prop_map(Op::Read),
    ]
}

/// What an operation that opens a FIFO (or a link to one) gives instead:
/// the open would wait for a peer, so no side opens it.
pub const FIFO: &str = "fifo: not opened";

/// The target of [`Op::SymlinkOut`]: out of the tree, through a directory
/// that no machine has, so that a write through the link fails alike
/// everywhere and never makes a file outside the test's directory.
pub const OUTSIDE: &str = "../../../../../../../../sessionfs-test-nowhere/outside";

/// The name an operation opens, if it opens one.
pub fn opened(op: &Op) -> Option<&usize> {
    match op {
        Op::Write(a, _)
        | Op::Append(a, _)
        | Op::WriteAt(a, _, _)
        | Op::Truncate(a, _)
        | Op::Read(a) => Some(a),
        _ => None,
    }
}

/// Applies `op` under `root`; returns what it produced, or the errno.
pub fn apply(root: &Path, op: &Op) -> Result<String, i32> {
    let p = |i: &usize| root.join(NAMES[*i]);
    let e = |r: std::io::Error| r.raw_os_error().unwrap_or(-1);
    if let Some(a) = opened(op) {
        use std::os::unix::fs::FileTypeExt;
        if fs::metadata(p(a)).is_ok_and(|m| m.file_type().is_fifo()) {
            return Ok(FIFO.into());
        }
    }
    match op {
        Op::Write(a, b) => fs::write(p(a), b).map(|_| String::new()).map_err(e),
        Op::Append(a, b) => fs::OpenOptions::new()
            .append(true)
            .open(p(a))
            .and_then(|mut f| f.write_all(b))
            .map(|_| String::new())
            .map_err(e),
        Op::WriteAt(a, off, b) => fs::OpenOptions::new()
            .write(true)
            .open(p(a))
            .and_then(|mut f| {
                f.seek(SeekFrom::Start(*off))?;
                f.write_all(b)
            })
            .map(|_| String::new())
            .map_err(e),
        Op::Truncate(a, l) => fs::OpenOptions::new()
            .write(true)
            .open(p(a))
            .and_then(|f| f.set_len(*l))
            .map(|_| String::new())
            .map_err(e),
        Op::Mkdir(a) => fs::create_dir(p(a)).map(|_| String::new()).map_err(e),
        Op::Rmdir(a) => fs::remove_dir(p(a)).map(|_| String::new()).map_err(e),
        Op::Unlink(a) => fs::remove_file(p(a)).map(|_| String::new()).map_err(e),
        Op::Rename(a, b) => fs::rename(p(a), p(b)).map(|_| String::new()).map_err(e),
        Op::Symlink(a, b) => std::os::unix::fs::symlink(NAMES[*a], p(b))
            .map(|_| String::new())
            .map_err(e),
        Op::Link(a, b) => fs::hard_link(p(a), p(b)).map(|_| String::new()).map_err(e),
        Op::Chmod(a, m) => fs::set_permissions(p(a), fs::Permissions::from_mode(*m))
            .map(|_| String::new())
            .map_err(e),
        Op::ReadDir(a) => fs::read_dir(p(a))
            .map(|it| {
                let mut v: Vec<String> = it
                    .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v.join(",")
            })
            .map_err(e),
        Op::Mkfifo(a) => {
            nix::unistd::mkfifo(&p(a), nix::sys::stat::Mode::from_bits_truncate(0o644))
                .map(|_| String::new())
                .map_err(|e| e as i32)
        }
        Op::SymlinkOut(a) => std::os::unix::fs::symlink(OUTSIDE, p(a))
            .map(|_| String::new())
            .map_err(e),
        Op::Read(a) => fs::read(p(a))
            .map(|d| format!("{} bytes {:?}", d.len(), &d[..d.len().min(16)]))
            .map_err(e),
    }
}

/// The tree with link counts, which `snapshot` leaves out.
pub fn tree(root: &Path) -> Vec<(String, String, u64)> {
    snapshot(root)
        .into_iter()
        .map(|(rel, desc)| {
            let nlink = fs::symlink_metadata(root.join(&rel)).unwrap().nlink();
            let is_dir = desc.starts_with("dir");
            (rel, desc, if is_dir { 0 } else { nlink })
        })
        .collect()
}
