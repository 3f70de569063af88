//! Operations on one file larger than a chunk, at chunk boundaries and one
//! byte either side: drawn at random, applied to a plain in-memory model,
//! to the in-process overlay (tests/chunks.rs) and to a real mount
//! (tests/mount_chunks.rs) alike.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// The chunk size (`packet::format::CHUNK_SIZE`).
pub const C: u64 = 4 * 1024 * 1024;

/// One operation on the file (offsets near chunk boundaries), or a
/// remount, a seal, or a `SIGKILL` of the daemon.
#[derive(Clone, Debug)]
pub enum Op {
    /// Writes `len` bytes of `noise(seed)` at `offset`.
    WriteAt(u64, u64, u64),
    /// Appends `len` bytes of `noise(seed)`.
    Append(u64, u64),
    Truncate(u64),
    /// `fallocate` punching a hole (keeps the size).
    Punch(u64, u64),
    Remount,
    /// A seal, with `--rebase` when true.
    Seal(bool),
    /// `SIGKILL` of the daemon, then a remount (in process: the overlay
    /// dropped, as a remount).
    Kill,
}

/// `n` bytes that differ from chunk to chunk and from `seed` to `seed`.
pub fn bytes(n: u64, seed: u64) -> Vec<u8> {
    super::noise(seed, n as usize)
}

/// The workspace both model tests start from, `dir/ws`: `big` (`size`
/// bytes of `bytes(size, 1)`, returned as the model) and `small.txt`,
/// packed with mtimes zeroed (and `extra`) to `dir/p.packet`.
pub fn packed_workspace(dir: &Path, size: u64, extra: &[&str]) -> (Vec<u8>, PathBuf) {
    let ws = dir.join("ws");
    let model = bytes(size, 1);
    super::write(&ws, "big", &model);
    super::write(&ws, "small.txt", b"small\n");
    let mut args = vec!["--zero-mtimes"];
    args.extend(extra);
    (model, super::packet_of(&ws, dir, "p", &args))
}

/// An offset at a chunk boundary, one byte either side of one, or anywhere.
pub fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..4, -1i64..=1).prop_map(|(k, d)| (k * C).saturating_add_signed(d)),
        0u64..4 * C,
    ]
}

/// An operation of every kind but `Kill`.
pub fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![Just(1u64), 1u64..5000, Just(C), Just(C + 1), Just(C - 1)];
    prop_oneof![
        4 => (offset(), len.clone(), any::<u64>()).prop_map(|(o, l, s)| Op::WriteAt(o, l, s)),
        2 => (len.clone(), any::<u64>()).prop_map(|(l, s)| Op::Append(l, s)),
        2 => offset().prop_map(Op::Truncate),
        1 => (offset(), len).prop_map(|(o, l)| Op::Punch(o, l)),
        1 => Just(Op::Remount),
        1 => any::<bool>().prop_map(Op::Seal),
    ]
}

/// An operation on a mount: [`op`]'s, or now and then `Kill`; no `Punch`
/// where a mount takes no `fallocate` ([`PUNCH_ON_MOUNTS`]).
pub fn mount_op() -> impl Strategy<Value = Op> {
    prop_oneof![10 => op(), 1 => Just(Op::Kill)].prop_filter("fallocate on a mount", on_mounts)
}

/// Whether a mount takes `fallocate` (FUSE on Linux does; macFUSE sends
/// no such request, docs/SEMANTICS.md).
pub const PUNCH_ON_MOUNTS: bool = cfg!(target_os = "linux");

/// Whether `op` can be applied to a file on a mount here.
pub fn on_mounts(op: &Op) -> bool {
    PUNCH_ON_MOUNTS || !matches!(op, Op::Punch(..))
}

/// Punches a hole of `len` bytes at `off` in `f`, keeping its size.
#[cfg(target_os = "linux")]
fn punch(f: &fs::File, off: u64, len: u64) -> std::io::Result<()> {
    use nix::fcntl::FallocateFlags as F;
    let mode = F::FALLOC_FL_PUNCH_HOLE | F::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(f, mode, off as i64, len as i64)?;
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn punch(_: &fs::File, _: u64, _: u64) -> std::io::Result<()> {
    Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

/// Applies a change of content (`WriteAt`, `Append`, `Truncate`, `Punch`)
/// to `model`; false for the others, which change no byte.
pub fn apply_to_model(model: &mut Vec<u8>, op: &Op) -> bool {
    match *op {
        Op::WriteAt(off, len, seed) => {
            let data = super::noise(seed, len as usize);
            let end = (off + len) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
        }
        Op::Append(len, seed) => model.extend(super::noise(seed, len as usize)),
        Op::Truncate(size) => model.resize(size as usize, 0),
        Op::Punch(off, len) => {
            let end = ((off + len) as usize).min(model.len());
            if (off as usize) < end {
                model[off as usize..end].fill(0);
            }
        }
        Op::Remount | Op::Seal(_) | Op::Kill => return false,
    }
    true
}

/// Applies a change of content to the file at `path` with the system
/// calls an application makes (`pwrite`, `O_APPEND` write, `ftruncate`,
/// `fallocate`); false for the other operations.
#[track_caller]
pub fn apply_to_file(path: &Path, op: &Op) -> bool {
    try_apply_to_file(path, op).unwrap_or_else(|e| panic!("{op:?}: {e}"))
}

/// [`apply_to_file`], returning what fails.
pub fn try_apply_to_file(path: &Path, op: &Op) -> std::io::Result<bool> {
    let open = || fs::OpenOptions::new().write(true).open(path);
    match *op {
        Op::WriteAt(off, len, seed) => {
            open()?.write_all_at(&super::noise(seed, len as usize), off)?
        }
        Op::Append(len, seed) => {
            let mut f = fs::OpenOptions::new().append(true).open(path)?;
            f.write_all(&super::noise(seed, len as usize))?;
        }
        Op::Truncate(size) => open()?.set_len(size)?,
        Op::Punch(off, len) => punch(&open()?, off, len)?,
        Op::Remount | Op::Seal(_) | Op::Kill => return Ok(false),
    }
    Ok(true)
}
