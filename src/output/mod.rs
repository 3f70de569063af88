//! Writing packet files: positional writes into a pre-sized temporary file
//! beside the destination, then fsync, rename and directory fsync, so the
//! destination holds either nothing new or the complete packet.
//!
//! `pack` and `seal` write the same way: new content is hashed first
//! ([`hash_new`]), so the manifest is complete before anything is written,
//! and then the file is written once, in order, and hashed as it goes for
//! `file_sha256` when asked ([`write_in_order`]; see [`in_order`]). Nothing is read
//! back. The end marker is the zeros of the freshly sized file.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::packet::digest::Sha256;
use crate::packet::error::{Error, Result};
use crate::packet::format::{BLOCK, MANIFEST_NAME};
use crate::packet::layout::Layout;

pub mod in_order;
pub mod parts;
pub mod remote;
pub use in_order::{Keep, WriteOptions, hash_new, write_in_order};
pub use remote::{RemoteOutput, Uploaded};

/// Where a packet is written: a file (through a temporary file beside
/// it), or an object of an S3-compatible store (a multipart upload).
#[derive(Clone, Copy)]
pub enum Dest<'a> {
    /// A file.
    File(&'a Output),
    /// An object.
    Remote(&'a RemoteOutput),
}

/// A packet being written: [`Dest`], owned.
pub enum Writing {
    /// To a file.
    File(Output),
    /// To an object.
    Remote(Box<RemoteOutput>),
}

impl Writing {
    /// Where the bytes go.
    pub fn dest(&self) -> Dest<'_> {
        match self {
            Writing::File(o) => Dest::File(o),
            Writing::Remote(r) => Dest::Remote(r),
        }
    }
}

/// A packet being written: a temporary file in the destination's directory.
///
/// The directory is held open from the start, and the temporary file is
/// named, renamed and removed relative to it, never by path: a directory
/// moved while the packet is written (or a parent of it) keeps no
/// temporary file behind, and the packet goes into place only if the
/// destination's directory is still the one the run began in.
pub struct Output {
    file: File,
    /// The destination's directory.
    dir: OwnedFd,
    /// The temporary file's name in `dir`.
    name: OsString,
    /// Its path when made, for messages.
    tmp_path: PathBuf,
    dest: PathBuf,
    /// Whether anything was at `dest` when the output was made: where
    /// nothing was, nothing is replaced.
    existed: bool,
    /// The temporary file is in place (renamed): nothing to remove.
    placed: bool,
    /// The temporary file is removed if the process is interrupted (until
    /// it is in place).
    pending: Option<crate::interrupt::Pending>,
    /// Why what is at `dest` may not be replaced, if it may not
    /// ([`refuse_replacing`] for a packet).
    replaceable: fn(&Path) -> Option<String>,
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.placed {
            let _ = nix::unistd::unlinkat(
                self.dir.as_fd(),
                self.name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// The output `dest` cannot be used, for `reason`.
fn unusable(dest: &Path, reason: impl Into<String>) -> Error {
    Error::TargetUnusable {
        path: crate::packet::path::shown_path(dest),
        reason: reason.into(),
    }
}

/// Why an output (or a target) in directory `dir` cannot be made there
/// when `dir` is not an existing directory.
pub fn missing_directory(dir: &Path) -> String {
    format!(
        "its directory {} does not exist; create it first",
        dir.display()
    )
}

/// The start of the name of the temporary file for an output named
/// `name`: `.<name>.`, the name cut short where the whole
/// (`.<name>.<6 random>.tmp`) would be longer than a name may be.
pub fn temp_prefix(name: &str) -> String {
    format!(
        ".{}.",
        crate::sys::name_part(name, crate::sys::NAME_MAX - 12)
    )
}

impl Output {
    /// Creates the temporary file (`.<name>.<random>.tmp`, mode 0600).
    pub fn create(dest: &Path) -> Result<Output> {
        Output::create_replacing(dest, refuse_replacing)
    }

    /// [`Output::create`] for a file that is not a packet: `replaceable`
    /// says why what is at `dest` may not be replaced (judged again at the
    /// commit), as [`refuse_replacing`] does for a packet.
    pub fn create_replacing(
        dest: &Path,
        replaceable: fn(&Path) -> Option<String>,
    ) -> Result<Output> {
        // Found now, not at the rename after all the work.
        if let Some(why) = names_a_directory(dest) {
            return Err(unusable(dest, why));
        }
        let dir = parent_dir(dest);
        let name = dest
            .file_name()
            .ok_or_else(|| {
                Error::io_at(
                    dest,
                    "not a file name",
                    io::Error::from(io::ErrorKind::InvalidInput),
                )
            })?
            .to_string_lossy();
        let cannot_create = |e: io::Error| {
            // tempfile adds the random name it tried; the directory is
            // what the user can act on.
            let text = e.to_string();
            let text = text.split(" at path ").next().unwrap_or_default();
            let e = io::Error::new(e.kind(), text.to_owned());
            Error::io_at(dir, "cannot create a temporary file here", e)
        };
        let dirfd = nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            // The destination, not the system, is at fault: as a seal
            // says before it starts.
            nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR => {
                unusable(dest, missing_directory(dir))
            }
            e => cannot_create(e.into()),
        })?;
        let registered = dirfd.try_clone().map_err(cannot_create)?;
        // Made and registered as one step (see crate::interrupt).
        let _creating = crate::interrupt::creating();
        // tempfile picks the names (and tries again where one is taken);
        // the file is made in the directory held open, not by path.
        let made = tempfile::Builder::new()
            .prefix(&temp_prefix(&name))
            .suffix(".tmp")
            .make_in(dir, |path| {
                let name = path.file_name().unwrap_or_default();
                let flags = OFlag::O_RDWR
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC;
                nix::fcntl::openat(dirfd.as_fd(), name, flags, Mode::from_bits_truncate(0o600))
                    .map(File::from)
                    .map_err(io::Error::from)
            })
            .map_err(cannot_create)?;
        let (file, tmp_path) = made.keep().map_err(|e| cannot_create(e.error))?;
        let name = tmp_path.file_name().unwrap_or_default().to_owned();
        Ok(Output {
            pending: Some(crate::interrupt::remove_on_interrupt_at(
                registered, &name, &tmp_path,
            )),
            file,
            dir: dirfd,
            name,
            tmp_path,
            dest: dest.to_owned(),
            existed: std::fs::symlink_metadata(dest).is_ok(),
            placed: false,
            replaceable,
        })
    }

    /// Names the destination `dest` instead, in the same directory (a
    /// digest-named output, once its digest is known).
    pub fn retarget(&mut self, dest: &Path) {
        debug_assert_eq!(parent_dir(dest), parent_dir(&self.dest));
        self.existed = std::fs::symlink_metadata(dest).is_ok();
        self.dest = dest.to_owned();
    }

    /// Where the packet goes once committed.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// The temporary file (buffered handle).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// `(dev, ino)` of the temporary file, so a walk can skip it.
    pub fn identity(&self) -> Result<(u64, u64)> {
        let m = self
            .file()
            .metadata()
            .map_err(|e| Error::io_at(&self.tmp_path, "cannot stat the temporary file", e))?;
        Ok((m.dev(), m.ino()))
    }

    /// Sizes the file for `layout` (zeros everywhere until written) and
    /// reserves its blocks, so a full disk fails here rather than midway.
    pub fn size_for(&self, layout: &Layout) -> Result<()> {
        let len = layout.total_len();
        self.file()
            .set_len(len)
            .map_err(|e| Error::io_at(&self.dest, "cannot size the output file", e))?;
        crate::sys::reserve(self.file(), len).map_err(|e| {
            let what = format!("cannot reserve {len} bytes for the output");
            Error::io_at(&self.dest, &what, e)
        })
    }

    /// Writes whole blocks at a block-aligned `offset`.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        debug_assert!(offset % BLOCK == 0 && bytes.len() as u64 % BLOCK == 0);
        self.file().write_all_at(bytes, offset).map_err(|e| {
            let what = format!("cannot write the output at byte {offset}");
            Error::io_at(&self.dest, &what, e)
        })
    }

    /// The temporary file opened again with `O_DIRECT` (Linux), or `None`
    /// where the file system refuses it.
    pub fn open_direct(&self) -> Option<File> {
        crate::sys::reopen_direct(self.file(), true)
    }

    /// Waits until the data written is on disk (`fdatasync`).
    pub fn sync_data(&self) -> Result<()> {
        self.file()
            .sync_data()
            .map_err(|e| Error::io_at(&self.dest, "cannot fsync the output", e))
    }

    /// Makes the packet durable and visible: mode (`mode`, or that of the
    /// file it replaces), fsync, rename over the destination, fsync of the
    /// directory. Returns the file as committed, for a reader reopening
    /// the destination to know it is this file, unmodified (a rebasing
    /// seal).
    pub fn commit(mut self, mode: u32) -> Result<Committed> {
        let dest = self.dest.clone();
        // The destination's directory is still the one held: one moved or
        // replaced meanwhile (a symlink put in its place, say) does not
        // get the packet, wherever it now leads.
        let dir = parent_dir(&dest);
        if !crate::sys::is_at(self.dir.as_fd(), dir) {
            return Err(unusable(
                &dest,
                "its directory was moved or replaced while the packet was written; nothing was \
                 written there: name the output again",
            ));
        }
        // A packet replaced keeps its permissions: one made private stays so.
        let mode = match std::fs::symlink_metadata(&dest) {
            Ok(m) if m.is_file() => m.permissions().mode() & 0o777,
            _ => mode,
        };
        let file = self.file();
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io_at(&dest, "cannot set the output's mode", e))?;
        file.sync_all()
            .map_err(|e| Error::io_at(&dest, "cannot fsync the output", e))?;
        // Size and mtime as written, before the rename (which moves the
        // ctime, not the mtime): a write after it shows as a new mtime.
        let written = file
            .metadata()
            .map_err(|e| Error::io_at(&dest, "cannot stat the output", e))?;
        let handle = file
            .try_clone()
            .map_err(|e| Error::io_at(&dest, "cannot hold the output", e))?;
        // Judged again at the last moment: something put at the output
        // while the packet was written is not replaced unless it may be
        // (nothing, an older packet, an empty file, a symlink).
        if let Some(reason) = (self.replaceable)(&dest) {
            return Err(unusable(
                &dest,
                format!("{reason} (put there while it was written)"),
            ));
        }
        let to = Path::new(dest.file_name().unwrap_or_default());
        let from = Path::new(&self.name);
        let placed = {
            // An interrupt sees the output either not replaced (and removes
            // the temporary file) or replaced (and leaves it be).
            let _commit = crate::interrupt::creating();
            let d = self.dir.as_fd();
            let renamed = if self.existed {
                nix::fcntl::renameat(d, from, d, to).map_err(io::Error::from)
            } else {
                crate::sys::rename_noreplace_at(d, from, d, to)
            };
            renamed.map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => unusable(
                    &dest,
                    "appeared while the packet was written; it is left as it is: remove it, \
                     or name another output",
                ),
                _ => Error::io_at(&dest, "cannot rename the output into place", e),
            })?;
            self.placed = true;
            self.pending = None;
            crate::interrupt::committed();
            // The ctime once in place, at once: a write since, its mtime
            // put back, shows as a new ctime.
            handle
                .metadata()
                .map_err(|e| Error::io_at(&dest, "cannot stat the output", e))?
        };
        nix::unistd::fsync(self.dir.as_fd())
            .map_err(|e| Error::io_at(dir, "cannot fsync the directory", e.into()))?;
        Ok(Committed {
            file: handle,
            written,
            placed,
        })
    }
}

/// A packet committed: its handle, held so that its inode cannot be
/// reused while a reader checks that the file at the destination is this
/// one, and its stats as written (before the rename) and once in place.
/// Against a writer with the user's own rights these prove nothing (it may
/// restore times); they catch another file put there, or a write to it.
pub struct Committed {
    /// The file.
    pub file: File,
    /// Its stat when written, before its rename.
    pub written: std::fs::Metadata,
    /// Its stat once renamed into place.
    pub placed: std::fs::Metadata,
}

impl Committed {
    /// Whether `m`, a stat of the file at the destination, is of this
    /// file, unmodified: the same device and inode, the size and mtime it
    /// was written with, and the ctime it had once in place.
    pub fn is(&self, m: &std::fs::Metadata) -> bool {
        let (w, p) = (&self.written, &self.placed);
        (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec())
            == (p.dev(), p.ino(), w.len(), w.mtime(), w.mtime_nsec())
            && (m.ctime(), m.ctime_nsec()) == (p.ctime(), p.ctime_nsec())
    }
}

/// What an output (`pack -o`, `seal -o`, a path or an `s3://` key) may
/// hold to be named by the packet's digest: each one is replaced with
/// `sha256-<64 hex>` (the digest with `-` for `:`, which object stores and
/// file systems take alike) once the digest is known, before anything is
/// written.
pub const DIGEST_PLACEHOLDER: &str = "{digest}";

/// Whether `dest` is named by the digest (holds [`DIGEST_PLACEHOLDER`]).
pub fn digest_named(dest: &Path) -> bool {
    dest.as_os_str()
        .as_bytes()
        .windows(DIGEST_PLACEHOLDER.len())
        .any(|w| w == DIGEST_PLACEHOLDER.as_bytes())
}

/// Why a digest-named local output cannot be, if it cannot: the
/// placeholder must be in the file's name, its directory being one that
/// exists.
pub fn check_digest_template(dest: &Path) -> std::result::Result<(), String> {
    let in_name = dest.file_name().is_some_and(|n| digest_named(Path::new(n)));
    let in_dir = dest.parent().is_some_and(digest_named);
    if in_dir || !in_name {
        return Err(format!(
            "{}: {DIGEST_PLACEHOLDER} may stand only in the file's name (`dir/{DIGEST_PLACEHOLDER}.packet`), \
             whose directory exists",
            dest.display()
        ));
    }
    Ok(())
}

/// `template` with every [`DIGEST_PLACEHOLDER`] replaced by `digest`
/// spelt `sha256-<hex>`.
pub fn digest_name(template: &Path, digest: &crate::packet::digest::Digest) -> PathBuf {
    let hex = digest.to_string().replacen(':', "-", 1);
    let bytes = template.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + hex.len());
    let mut rest = bytes;
    while let Some(k) = rest
        .windows(DIGEST_PLACEHOLDER.len())
        .position(|w| w == DIGEST_PLACEHOLDER.as_bytes())
    {
        out.extend_from_slice(&rest[..k]);
        out.extend_from_slice(hex.as_bytes());
        rest = &rest[k + DIGEST_PLACEHOLDER.len()..];
    }
    out.extend_from_slice(rest);
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// `location` with every [`DIGEST_PLACEHOLDER`] of its key (an
/// `s3://` object) or path replaced by `digest` spelt `sha256-<hex>`.
pub fn digest_location(
    location: &crate::store::Location,
    digest: &crate::packet::digest::Digest,
) -> crate::store::Location {
    use crate::store::Location;
    let named = |s: &str| {
        s.replace(
            DIGEST_PLACEHOLDER,
            &digest.to_string().replacen(':', "-", 1),
        )
    };
    match location {
        Location::S3 { bucket, key } => Location::S3 {
            bucket: bucket.clone(),
            key: named(key),
        },
        Location::Local(p) => Location::Local(digest_name(p, digest)),
        other => other.clone(),
    }
}

/// What is at a digest-named destination.
pub enum AtDigestName {
    /// Nothing: the packet is written there.
    Nothing,
    /// The packet itself, every byte verified (a valid packet with this
    /// digest has exactly these bytes): nothing is written. Its length
    /// and `file_sha256`.
    Same {
        /// Its length.
        len: u64,
        /// SHA-256 of the whole file.
        file_sha256: Sha256,
    },
}

/// What is at `dest`, named by `digest`: nothing, or that packet (read
/// and verified whole under `limits`); anything else there (another file,
/// a damaged copy, a directory) is refused, left as it is: a name that
/// promises a packet is written once.
pub fn at_digest_name(
    dest: &Path,
    digest: &crate::packet::digest::Digest,
    limits: &crate::packet::format::Limits,
) -> Result<AtDigestName> {
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(AtDigestName::Nothing),
        Err(e) => return Err(Error::io_at(dest, "cannot stat the output", e)),
        Ok(m) if !m.is_file() => {
            return Err(unusable(
                dest,
                "is named by this packet's digest but is not a regular file; it is left as it \
                 is: remove it, or name another output",
            ));
        }
        Ok(_) => {}
    }
    let checked = crate::packet::reader::Packet::open(dest, limits).and_then(|p| {
        p.check_digest(Some(digest))?;
        crate::packet::verify::verify(&p, &|_| {}).map(|r| (p.len(), r.file_sha256))
    });
    match checked {
        Ok((len, file_sha256)) => Ok(AtDigestName::Same { len, file_sha256 }),
        Err(e) => Err(unusable(
            dest,
            format!(
                "is named by this packet's digest but does not hold it ({e}); it is left as \
                 it is: remove it (it is damaged, or another file), then write again"
            ),
        )),
    }
}

/// Why `dest` cannot name a file to write, if it cannot: it ends with `/`
/// or `/.`, or a directory is there.
pub fn names_a_directory(dest: &Path) -> Option<&'static str> {
    let raw = dest.as_os_str().as_encoded_bytes();
    if raw.ends_with(b"/") || raw.ends_with(b"/.") || raw.ends_with(b"/..") {
        Some("ends with `/`, `/.` or `/..`, which name a directory; name the file to write")
    } else if raw == b"." || raw == b".." {
        Some("names a directory; name the file to write")
    } else if std::fs::metadata(dest).is_ok_and(|m| m.is_dir()) {
        Some("is a directory; name the file to write")
    } else {
        None
    }
}

/// Why a packet may not replace what is at `dest`, if it may not: a
/// non-empty regular file that is not a packet (`-o notes.txt` by
/// mistake, or a file of the tree being packed) is refused, and so is a
/// device, FIFO or socket, or a symlink to one or to a process's
/// descriptor (`/dev/stdout`), so that a slip of `-o` loses nothing. An
/// older packet (whatever its state past its first header), an empty
/// file, another symlink (replaced, not followed) or nothing at all may be
/// replaced; so may a file that cannot be read, as before this check.
pub fn refuse_replacing(dest: &Path) -> Option<String> {
    // Every packet begins with the manifest's ustar header.
    let packet = |head: &[u8]| {
        head.len() == BLOCK as usize && {
            let h = tar::Header::from_byte_slice(head);
            h.as_ustar().is_some() && h.path_bytes().as_ref() == MANIFEST_NAME.as_bytes()
        }
    };
    refuse_replacing_unless(dest, packet, "packet")
}

/// [`refuse_replacing`] for `unpack --tar FILE`: what it may replace is
/// an older tar (ustar or GNU magic in its first header), not a notes file.
pub fn refuse_replacing_tar(dest: &Path) -> Option<String> {
    let tar = |head: &[u8]| head.len() == BLOCK as usize && head[257..262] == *b"ustar";
    refuse_replacing_unless(dest, tar, "tar stream")
}

/// [`refuse_replacing`] for a seal's receipt: what it may replace is an
/// older receipt (a JSON object whose first key is its schema), not a
/// notes file, nor a mount's journal.
pub fn refuse_replacing_receipt(dest: &Path) -> Option<String> {
    let receipt = |head: &[u8]| {
        let packed: Vec<u8> = head
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        packed.starts_with(br#"{"schema":"sessionfs.receipt/"#)
    };
    refuse_replacing_unless(dest, receipt, "receipt")
}

/// Why a `what` (packet, receipt) may not replace what is at `dest`, if it
/// may not: as [`refuse_replacing`] says, a non-empty file being one only
/// if `ours` takes its first block.
fn refuse_replacing_unless(
    dest: &Path,
    ours: impl Fn(&[u8]) -> bool,
    what_is_written: &str,
) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let m = std::fs::symlink_metadata(dest).ok()?;
    let special = |t: std::fs::FileType| {
        if t.is_char_device() || t.is_block_device() {
            Some("a device")
        } else if t.is_fifo() {
            Some("a FIFO")
        } else if t.is_socket() {
            Some("a socket")
        } else {
            None
        }
    };
    // `-o /dev/null` would replace the device itself (as root, for
    // everyone), `-o /dev/stdout` the link to it.
    let what = match special(m.file_type()) {
        Some(what) => Some(what.to_owned()),
        // A link to a process's descriptor (`/dev/stdout`) means whatever
        // that descriptor is in the process resolving it: refused whatever
        // it is now.
        None if m.file_type().is_symlink() && leads_to_a_descriptor(dest) => {
            Some("a symlink to a process's file descriptor".to_owned())
        }
        None if m.file_type().is_symlink() => std::fs::metadata(dest)
            .ok()
            .and_then(|t| special(t.file_type()))
            .map(|what| format!("a symlink to {what}")),
        None => None,
    };
    if let Some(what) = what {
        return Some(format!(
            "is {what}, not a file: the {what_is_written} would replace it; name a regular \
             file (to learn a tree's digest only, pack to a temporary file)"
        ));
    }
    if !m.is_file() || m.len() == 0 {
        return None;
    }
    let mut head = Vec::with_capacity(BLOCK as usize);
    File::open(dest)
        .and_then(|f| f.take(BLOCK).read_to_end(&mut head))
        .ok()?;
    (!ours(&head)).then(|| {
        format!(
            "exists and is not a sessionfs {what_is_written}: writing the {what_is_written} \
             would replace it; name another file, or remove that one first if it is to go"
        )
    })
}

/// Whether `link`, or a step of the chain of symlinks from it (followed at
/// most 40 deep), lies under `/proc` or is `/dev/fd/…`, `/dev/stdin`,
/// `/dev/stdout` or `/dev/stderr`: a process's descriptors. Each step's
/// directory is taken as the kernel resolves it (links to directories
/// included), or, where it does not exist, with `..` folded. A procfs
/// mounted elsewhere, and `/proc/self/cwd` or `/proc/self/root`, which
/// resolve to ordinary paths, are not caught: replacing such a link harms
/// nothing but the link.
fn leads_to_a_descriptor(link: &Path) -> bool {
    use std::path::Component;
    let fold = |p: &Path| {
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::CurDir => {}
                c => out.push(c),
            }
        }
        out
    };
    let resolved = |p: &Path| {
        let dir = p.parent().unwrap_or(Path::new("/"));
        match (std::fs::canonicalize(dir), p.file_name()) {
            (Ok(dir), Some(name)) => dir.join(name),
            _ => fold(p),
        }
    };
    let is_descriptor = |p: &Path| {
        let mut parts = p.components().skip(1).map(|c| c.as_os_str().as_bytes());
        match (parts.next(), parts.next()) {
            (Some(b"proc"), _) => true,
            (Some(b"dev"), Some(n)) => matches!(n, b"fd" | b"stdin" | b"stdout" | b"stderr"),
            _ => false,
        }
    };
    let Ok(mut at) = std::path::absolute(link) else {
        return false;
    };
    if is_descriptor(&resolved(&at)) {
        return true;
    }
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&at) else {
            return false;
        };
        let next = resolved(&at.parent().unwrap_or(Path::new("/")).join(target));
        if is_descriptor(&next) {
            return true;
        }
        at = next;
    }
    false
}

fn parent_dir(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Alignment of buffers, offsets and lengths for direct I/O: the logical
/// block size of the disks we use (512 bytes; a disk with larger blocks
/// refuses the first direct read or write, and the caller falls back).
pub const DIRECT_ALIGN: usize = 4096;

/// A reusable buffer whose bytes start at an address aligned for direct
/// I/O.
#[derive(Default)]
pub struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// The buffer resized to `len` bytes (old bytes may remain: the caller
    /// overwrites them all).
    pub fn window(&mut self, len: usize) -> &mut [u8] {
        if self.mem.len() < len + DIRECT_ALIGN {
            self.mem.resize(len + DIRECT_ALIGN, 0);
        }
        self.start = self
            .mem
            .as_ptr()
            .align_offset(DIRECT_ALIGN)
            .min(DIRECT_ALIGN);
        self.len = len;
        &mut self.mem[self.start..self.start + len]
    }

    /// The bytes of the last window.
    pub fn bytes(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }
}

// ---------------------------------------------------------------------------
// Writing members from content sources (pack and seal)

/// What the writer does with a file's bytes as they go by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// New content: hash it; the manifest takes the result.
    Compute,
    /// Content the manifest already describes: hash it and compare, failing
    /// on a mismatch.
    Verify,
    /// Content [`hash_new`] hashed, read again: compare its fingerprint
    /// with the one taken then ([`Contents::fingerprint`]), failing on a
    /// mismatch. This proves the bytes did not change in between, without
    /// a second SHA-256 (see [`fingerprint`]).
    Unchanged,
    /// Content known to match the manifest (verified before): copy it.
    Trust,
}

/// Where the members' file content comes from.
pub trait Contents: Sync {
    /// Errors of the source; packet errors (a failed verification) convert.
    type Error: From<Error> + Send;
    /// A file opened for reading from its start.
    type Reader<'a>: ContentReader<Error = Self::Error>
    where
        Self: 'a;
    /// How entry `i`'s bytes are checked.
    fn check(&self, i: usize) -> Check;
    /// Opens entry `i` (a regular file) for reading.
    fn open(&self, i: usize) -> Result<Self::Reader<'_>, Self::Error>;
    /// The fingerprint [`hash_new`] took of entry `i` (of its chunk `k`
    /// when it has chunks), for [`Check::Unchanged`].
    fn fingerprint(&self, _i: usize, _k: Option<u64>) -> Option<u128> {
        None
    }
    /// Whether entry `i` (a file with chunks) must also have its
    /// whole-file SHA-256 checked as it is written: reused content whose
    /// chunks are verified one by one (or trusted) while nothing has
    /// checked the whole against the manifest yet. [`write_in_order`]
    /// hashes such a file in order and refuses it on a mismatch.
    fn check_whole(&self, _i: usize) -> bool {
        false
    }
    /// A hint that `entries` (only bytes `window` of them, when given: a
    /// large file's chunk) will be read soon: a source on disk can start
    /// reading them in now.
    fn prefetch(&self, _entries: std::ops::Range<usize>, _window: Option<(u64, u64)>) {}
    /// Whether reading costs round trips (a remote parent): the writer then
    /// runs more workers than cores, each waiting on its piece's fetch
    /// ([`Contents::ready`]), so that several are in flight, in order.
    fn round_trips(&self) -> bool {
        false
    }
    /// Makes `entries` (bytes `window` of them) ready to be read now, in as
    /// few requests as they allow: a remote source fetches them in runs
    /// (reading them file by file would cost a request each). Called
    /// before a piece is assembled; nothing to do for a source on disk.
    fn ready(
        &self,
        _entries: std::ops::Range<usize>,
        _window: Option<(u64, u64)>,
    ) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// A file's content being read from its start.
pub trait ContentReader {
    /// Errors.
    type Error;
    /// Fills `buf` with the next bytes; a short file is an error.
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Self::Error>;
    /// Skips the next `n` bytes (by reading them, unless the source can
    /// seek).
    fn skip(&mut self, mut n: u64) -> Result<(), Self::Error> {
        let mut scratch = vec![0u8; n.min(1 << 20) as usize];
        while n > 0 {
            let k = n.min(scratch.len() as u64) as usize;
            self.read_exact(&mut scratch[..k])?;
            n -= k as u64;
        }
        Ok(())
    }
    /// Called after the last byte: a source can check it did not change.
    fn finish(self) -> Result<(), Self::Error>;
}

/// What [`hash_new`] computed for one [`Check::Compute`] entry.
pub struct Hashed {
    /// The entry.
    pub entry: usize,
    /// SHA-256 of the whole content.
    pub sha256: Sha256,
    /// SHA-256 of each chunk (a file over one chunk).
    pub chunks: Vec<Sha256>,
    /// The [`fingerprint`] of the whole content (a file of at most one
    /// chunk), or of each chunk; none unless [`hash_new`] was asked.
    pub fingerprints: Vec<u128>,
    /// The content itself, when [`hash_new`] was asked to hold it.
    pub held: Option<Box<[u8]>>,
}

/// Hashes computed for [`Check::Compute`] entries.
pub type Computed = Vec<Hashed>;

/// A fingerprint of bytes read once, to tell whether the same bytes read
/// again are the same: XXH3-128 with a seed drawn at random for each
/// process, some 20 times faster than SHA-256.
///
/// It is not a cryptographic hash, and need not be. The manifest's hashes
/// come from the first read, so bytes changed to collide with it would
/// only give a packet whose content does not match its manifest: `pack`
/// would succeed, and every reader (`verify`, `unpack`, a mount) would
/// refuse the packet. Nothing false gets past a reader, and whoever can
/// write the tree being packed can change it more simply before the first
/// read. The random seed keeps such a collision from being prepared ahead.
pub fn fingerprint(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128_with_seed(bytes, fingerprint_seed())
}

/// The seed of this process's [`fingerprint`]s: random, from the standard
/// library's own source of hash keys (the operating system's random
/// numbers), drawn once.
fn fingerprint_seed() -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64))
}

/// Byte counts of a [`hash_new`] and [`write_in_order`] run.
#[derive(Default, Debug)]
pub struct WriteStats {
    /// Bytes hashed to compute new manifest hashes.
    pub hashed: AtomicU64,
    /// Bytes hashed to verify content against the manifest.
    pub verified: AtomicU64,
    /// Bytes copied whose hashes the manifest already had (verified or trusted).
    pub copied: AtomicU64,
}

impl WriteStats {
    /// Counts `n` bytes handled per `check`: hashed for new content,
    /// verified and copied for reused content checked on the way, copied
    /// for trusted content and for content checked by fingerprint.
    pub fn count(&self, check: Check, n: u64) {
        let counters: &[&AtomicU64] = match check {
            Check::Compute => &[&self.hashed],
            Check::Verify => &[&self.verified, &self.copied],
            Check::Unchanged => &[&self.copied],
            Check::Trust => &[&self.copied],
        };
        for c in counters {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The error (and log line) for content read again that does not match
/// (the manifest's hash, or the first read's fingerprint), bytes
/// `start..end` of the file at `path`.
pub(crate) fn content_mismatch(path: &str, start: u64, end: u64) -> Error {
    tracing::error!(
        path,
        start,
        end,
        "content does not match its manifest hash or its first read"
    );
    Error::ContentMismatch {
        path: path.to_string(),
        start,
        end,
    }
}
