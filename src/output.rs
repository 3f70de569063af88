//! Writing packet files: positional writes into a pre-sized temporary file
//! beside the destination, then fsync, rename and directory fsync, so the
//! destination holds either nothing new or the complete packet.
//!
//! Because a packet's layout is known from the manifest's length alone
//! (hashes are fixed-width), writers size the file first and fill members in
//! parallel, in any order; the manifest, which needs every hash, goes last.
//! Padding and the end marker are the zeros of the freshly sized file.
//!
//! Writes are buffered. `O_DIRECT` was measured (docs/benchmarks.md): it
//! makes the writes themselves cheaper on the benchmark machine, but every
//! write then waits for the device, and the whole-file hash must read the
//! packet back from disk instead of the page cache; pack got slower.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::packet::digest::{Digest, Sha256};
use crate::packet::error::{Error, Result};
use crate::packet::format::BLOCK;
use crate::packet::layout::{Layout, MANIFEST_DATA_OFFSET, manifest_header};
use crate::packet::manifest::Manifest;

/// Size of the pieces read back when hashing the finished file.
const HASH_PIECE: usize = 4 << 20;

/// A packet being written: a temporary file in the destination's directory.
pub struct Output {
    tmp: tempfile::NamedTempFile,
    dest: PathBuf,
}

impl Output {
    /// Creates the temporary file (`.<name>.<random>.tmp`, mode 0600).
    pub fn create(dest: &Path) -> Result<Output> {
        let dir = parent_dir(dest);
        let name = dest
            .file_name()
            .ok_or_else(|| {
                Error::io(
                    format!("{}: not a file name", dest.display()),
                    io::Error::from(io::ErrorKind::InvalidInput),
                )
            })?
            .to_string_lossy();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(|e| {
                Error::io(
                    format!("cannot create a temporary file in {}", dir.display()),
                    e,
                )
            })?;
        Ok(Output {
            tmp,
            dest: dest.to_owned(),
        })
    }

    /// The temporary file (buffered handle).
    pub fn file(&self) -> &File {
        self.tmp.as_file()
    }

    /// `(dev, ino)` of the temporary file, so a walk can skip it.
    pub fn identity(&self) -> Result<(u64, u64)> {
        let m = self
            .file()
            .metadata()
            .map_err(|e| Error::io("cannot stat the temporary file", e))?;
        Ok((m.dev(), m.ino()))
    }

    /// Sizes the file for `layout` (zeros everywhere until written) and
    /// reserves its blocks, so a full disk fails here rather than midway.
    pub fn size_for(&self, layout: &Layout) -> Result<()> {
        let len = layout.total_len();
        self.file()
            .set_len(len)
            .map_err(|e| Error::io("cannot size the output file", e))?;
        crate::sys::reserve(self.file(), len)
            .map_err(|e| Error::io(format!("cannot reserve {len} bytes for the output"), e))
    }

    /// Writes whole blocks at a block-aligned `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        debug_assert!(offset % BLOCK == 0 && bytes.len() as u64 % BLOCK == 0);
        self.file()
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io(format!("cannot write the output at byte {offset}"), e))
    }

    /// Writes the manifest member (header and JSON) and returns the digest.
    /// `expected_len` is the length the layout was computed for.
    pub fn write_manifest(&self, manifest: &Manifest, expected_len: u64) -> Result<Digest> {
        let bytes = manifest.encode();
        if bytes.len() as u64 != expected_len {
            // A bug, not bad input: the layout would be wrong.
            return Err(Error::io(
                format!(
                    "manifest is {} bytes, the layout was computed for {expected_len}",
                    bytes.len()
                ),
                io::Error::other("internal error"),
            ));
        }
        let mut buf = Vec::with_capacity(MANIFEST_DATA_OFFSET as usize + bytes.len() + 512);
        buf.extend_from_slice(&manifest_header(expected_len));
        buf.extend_from_slice(&bytes);
        buf.resize(buf.len().next_multiple_of(BLOCK as usize), 0);
        self.write_at(&buf, 0)?;
        Ok(Digest::of_manifest(&bytes))
    }

    /// SHA-256 of the first `len` bytes as written, read back in order (a
    /// reader thread and the hashing thread overlap), and the data synced.
    pub fn hash_and_sync(&self, len: u64) -> Result<Sha256> {
        use sha2::Digest as _;
        let reader = self.file();
        let (full_tx, full_rx) = mpsc::sync_channel::<(Vec<u8>, usize)>(2);
        let (empty_tx, empty_rx) = mpsc::sync_channel::<Vec<u8>>(3);
        for _ in 0..3 {
            let _ = empty_tx.send(vec![0u8; HASH_PIECE]);
        }
        let (hash, read, synced) = std::thread::scope(|s| {
            let read = s.spawn(move || -> io::Result<()> {
                let mut pos = 0;
                while pos < len {
                    let Ok(mut buf) = empty_rx.recv() else { break };
                    let n = (len - pos).min(HASH_PIECE as u64) as usize;
                    reader.read_exact_at(&mut buf[..n], pos)?;
                    pos += n as u64;
                    if full_tx.send((buf, n)).is_err() {
                        break;
                    }
                }
                Ok(())
            });
            let sync = s.spawn(|| self.file().sync_data());
            let mut hasher = sha2::Sha256::new();
            while let Ok((buf, n)) = full_rx.recv() {
                hasher.update(&buf[..n]);
                let _ = empty_tx.send(buf);
            }
            let read = read
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("reader panicked")));
            let synced = sync
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("fsync panicked")));
            (Sha256(hasher.finalize().into()), read, synced)
        });
        read.map_err(|e| Error::io("cannot read the output back", e))?;
        synced.map_err(|e| Error::io("cannot fsync the output", e))?;
        Ok(hash)
    }

    /// Makes the packet durable and visible: mode, fsync, rename over the
    /// destination, fsync of the directory.
    pub fn commit(self, mode: u32) -> Result<()> {
        let file = self.file();
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("cannot set the output's mode", e))?;
        file.sync_all()
            .map_err(|e| Error::io("cannot fsync the output", e))?;
        let dest = self.dest.clone();
        self.tmp.persist(&dest).map_err(|e| {
            Error::io(
                format!("cannot rename the output into {}", dest.display()),
                e.error,
            )
        })?;
        let dir = parent_dir(&dest);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("cannot fsync {}", dir.display()), e))
    }
}

fn parent_dir(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}
