//! Writing packet files: positional writes into a pre-sized temporary file
//! beside the destination, then fsync, rename and directory fsync, so the
//! destination holds either nothing new or the complete packet.
//!
//! Because the layout is known from the manifest's length alone (hashes are
//! fixed-width), writers size the file first and fill members in parallel,
//! in any order; the manifest, which needs every hash, is written last.
//! Padding and the end marker are the zeros of the freshly sized file.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::digest::Digest;
use super::error::{Error, Result};
use super::layout::{Layout, MANIFEST_DATA_OFFSET, manifest_header};
use super::manifest::Manifest;

/// A packet being written: a temporary file in the destination's directory.
pub struct Output {
    tmp: tempfile::NamedTempFile,
    dest: PathBuf,
}

impl Output {
    /// Creates the temporary file (`.<name>.<random>.tmp`, mode 0600).
    pub fn create(dest: &Path) -> Result<Output> {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
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

    /// The temporary file.
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

    /// Sizes the file for `layout` (zeros everywhere until written).
    pub fn size_for(&self, layout: &Layout) -> Result<()> {
        self.file()
            .set_len(layout.total_len())
            .map_err(|e| Error::io("cannot size the output file", e))
    }

    /// Writes `bytes` at `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        self.file()
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io(format!("cannot write the output at byte {offset}"), e))
    }

    /// Writes the manifest member (header and JSON) and returns the digest.
    /// `expected_len` is the length the layout was computed for.
    pub fn write_manifest(
        &self,
        manifest: &Manifest,
        expected_len: u64,
    ) -> Result<(Vec<u8>, Digest)> {
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
        self.write_at(&manifest_header(expected_len), 0)?;
        self.write_at(&bytes, MANIFEST_DATA_OFFSET)?;
        let digest = Digest::of_manifest(&bytes);
        Ok((bytes, digest))
    }

    /// Makes the packet durable and visible: fsync, mode, rename over the
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
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("cannot fsync {}", dir.display()), e))
    }
}
