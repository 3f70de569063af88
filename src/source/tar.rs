//! `pack --workspace-tar` and `--harness-tar`: a tar stream read as a
//! part's tree, never extracted, through the same policy step a directory
//! takes ([`super::report`]: `judge`, `ScanReport::classify`, the symlink
//! step, the mtime step, the other names of credentials).
//!
//! Reading is strict, since the stream is another program's (or a peer's)
//! and every byte of it is untrusted: each header's checksum, a ustar or
//! GNU magic, PAX records well formed and bounded ([`MAX_EXTENDED_HEADER`]
//! a header, [`MAX_EXTENSIONS`] in a row), sizes and times in octal or
//! base-256, only the member types a tree has (files, directories,
//! symlinks, hard links to an earlier file, FIFOs and devices, which the
//! policy drops as it drops them from a tree); absolute names, `..`, a
//! name twice (but a directory), a member beneath a file or symlink, a
//! hard link to what is not an earlier file, a stream cut short (no
//! end-of-archive block), bytes after the end other than zeros, a
//! compressed stream: each refused as `bad_tar`, naming the member and the
//! byte offset. The members read count against twice `--max-entries`,
//! those taken against the limits as a tree's entries do.
//!
//! Content is never held in memory. A tar file (or a standard input that
//! is one) is read where it is: the passes read each file at its offset in
//! it (its changing meanwhile is caught by pack's second-pass fingerprints
//! as a file's is). A stream (a pipe, a FIFO) is copied as it is read into
//! a spool, an unlinked temporary file in `$TMPDIR`, file by file, but for
//! files the policy leaves out as credentials (their other names go too)
//! and everything beneath a directory it leaves out; what is spooled counts
//! against `--max-bytes` as it is copied. A hard link in a stream to a
//! file that was not spooled, yet is packed, is refused: give the tar as a
//! file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::Error;
use super::policy::{Policy, Verdict, sqlite_database_of};
use super::report::{
    EntryType, ScanReport, Step, Tally, check_file_size, judge, non_utf8_name, non_utf8_target,
};
use super::walk::{Found, FoundFile, FoundKind, Origin};
use crate::packet::error::{ErrorKind, LimitKind};
use crate::packet::format::{BLOCK, Limits};
use crate::packet::path::Part;

/// Where a tar stream is read from.
#[derive(Clone, Debug)]
pub enum TarIn {
    /// A file (a tar file, or a FIFO such as `<(…)`).
    File(PathBuf),
    /// Standard input.
    Stdin,
}

impl TarIn {
    /// `-` is standard input; anything else a file.
    pub fn from_arg(arg: &Path) -> TarIn {
        if arg.as_os_str() == "-" {
            TarIn::Stdin
        } else {
            TarIn::File(arg.to_owned())
        }
    }

    /// How messages name it.
    pub fn shown(&self) -> String {
        match self {
            TarIn::File(p) => crate::packet::path::shown_path(p),
            TarIn::Stdin => "-".to_owned(),
        }
    }
}

/// A PAX extended header or GNU long name is at most this long: paths and
/// targets are bounded far below (16 KiB at the ceiling of
/// `--max-path-bytes`); the rest (extended attributes a tool records) is
/// not read for anything, and a header of gigabytes would be an allocation
/// the stream chose.
pub const MAX_EXTENDED_HEADER: u64 = 1 << 20;

/// Extension headers (PAX, GNU long names) in a row before a member: real
/// writers use at most three (a GNU long name, a long link name, PAX).
pub const MAX_EXTENSIONS: usize = 8;

/// Zero bytes read after the end-of-archive block, at most: writers pad to
/// a record (10 KiB for GNU tar and bsdtar); more is not waited for.
pub const MAX_TRAILING_ZEROS: u64 = 1 << 20;

/// A tar stream read: its members as a tree, and where their content is.
pub struct TarInput {
    /// The part it is.
    pub part: Part,
    /// How messages name it (its path, or `-`).
    pub shown: String,
    /// The content of its files: the tar file itself, or the spool.
    pub content: File,
    /// For a stream that was not a file: the bytes copied to the spool.
    pub spooled: Option<u64>,
    members: Vec<Member>,
    /// Each member's index by its path.
    by_path: HashMap<Vec<u8>, usize>,
    /// Each directory's children, by index.
    children: HashMap<usize, Vec<usize>>,
}

/// A member of the stream, or a directory implied by one.
struct Member {
    /// Path beneath the part's root (`""` for the root), as bytes.
    path: Vec<u8>,
    kind: Kind,
    mode: u32,
    mtime_ns: i128,
    /// Byte offset of its header in the stream, for messages.
    at: u64,
}

enum Kind {
    Dir,
    File {
        size: u64,
        /// Where its content is in `TarInput::content`; `None` when it was
        /// not kept (a stream's credential, or beneath a directory left
        /// out).
        offset: Option<u64>,
    },
    /// Another name of the file member at this index.
    HardLink(usize),
    Symlink(Vec<u8>),
    Special(EntryType),
}

/// A header as read, before its member is placed.
struct Header {
    name: Vec<u8>,
    link: Vec<u8>,
    typeflag: u8,
    size: u64,
    mode: u32,
    mtime_ns: i128,
    at: u64,
}

/// The stream being read, with the byte offset reached.
struct Stream {
    inner: BufReader<File>,
    pos: u64,
    /// The input is a file: data not needed is seeked over, not read.
    seekable: bool,
    shown: String,
}

impl Stream {
    fn bad(&self, at: u64, what: impl std::fmt::Display) -> Error {
        bad_tar(&self.shown, at, what)
    }

    fn io(&self, e: io::Error) -> Error {
        Error::Io {
            path: self.shown.clone(),
            op: "cannot read the tar stream",
            source: e,
        }
    }

    /// The next block; `None` at the end of the input (at a block
    /// boundary: anywhere else the stream was cut short).
    fn block(&mut self) -> Result<Option<[u8; BLOCK as usize]>, Error> {
        let mut b = [0u8; BLOCK as usize];
        let mut got = 0;
        while got < b.len() {
            match self.inner.read(&mut b[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => {
                    if self.pos == 0 {
                        refuse_compressed(self, &b[..got])?;
                    }
                    return Err(self.bad(
                        self.pos + got as u64,
                        "the stream ends inside a header block: it was cut short",
                    ));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        self.pos += BLOCK;
        Ok(Some(b))
    }

    /// Exactly `n` bytes into `out` (which holds nothing yet).
    fn read_into(&mut self, n: u64, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = self.pos;
        let got = (&mut self.inner)
            .take(n)
            .read_to_end(out)
            .map_err(|e| self.io(e))?;
        self.pos += got as u64;
        if (got as u64) < n {
            return Err(self.bad(
                start,
                format!(
                    "the stream ends inside a member ({got} of its {n} bytes): it was cut short"
                ),
            ));
        }
        Ok(())
    }

    /// Passes over `n` bytes: seeked over in a file, read in a stream.
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        if n == 0 {
            return Ok(());
        }
        if self.seekable {
            let start = self.pos;
            let to = i64::try_from(n).map_err(|_| self.bad(start, "a member too large"))?;
            self.inner.seek_relative(to).map_err(|e| self.io(e))?;
            self.pos += n;
            // Past the end of a file is not an error for a seek: the next
            // read finds it.
            return Ok(());
        }
        self.copy(n, &mut io::sink())
    }

    /// Copies `n` bytes to `out`.
    fn copy(&mut self, n: u64, out: &mut dyn Write) -> Result<(), Error> {
        let start = self.pos;
        let got = io::copy(&mut (&mut self.inner).take(n), out).map_err(|e| match e.kind() {
            // Writing the spool failed: its disk, not the stream.
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Error::Io {
                path: std::env::temp_dir().display().to_string(),
                op: "cannot spool the tar stream ($TMPDIR)",
                source: e,
            },
            _ => self.io(e),
        })?;
        self.pos += got;
        if got < n {
            return Err(self.bad(
                start,
                format!(
                    "the stream ends inside a member ({got} of its {n} bytes): it was cut short"
                ),
            ));
        }
        Ok(())
    }
}

/// The refusal of a tar stream `shown` at byte `at`.
fn bad_tar(shown: &str, at: u64, what: impl std::fmt::Display) -> Error {
    Error::Refused {
        path: shown.to_owned(),
        kind: ErrorKind::BadTar,
        reason: format!("not a tar stream pack takes, at byte {at}: {what}"),
    }
}

/// Opens `from`: the file and whether it can be read where it is (a
/// regular file), and from which offset.
fn open(from: &TarIn) -> Result<(File, bool, u64), Error> {
    let shown = from.shown();
    let io_err = |op: &'static str| {
        let shown = shown.clone();
        move |source| Error::Io {
            path: shown.clone(),
            op,
            source,
        }
    };
    let file = match from {
        TarIn::File(p) => {
            use std::os::unix::fs::OpenOptionsExt;
            // O_NONBLOCK: a FIFO nobody writes to is not waited on (it then
            // reads as empty); reads block as usual once it is open.
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
                .open(p)
                .map_err(io_err("cannot open the tar stream"))?;
            nix::fcntl::fcntl(
                &f,
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
            )
            .map_err(|e| io_err("cannot open the tar stream")(e.into()))?;
            f
        }
        TarIn::Stdin => File::from(
            io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(io_err("cannot read standard input"))?,
        ),
    };
    let m = file
        .metadata()
        .map_err(io_err("cannot stat the tar stream"))?;
    if m.is_dir() {
        return Err(Error::Refused {
            path: shown,
            kind: ErrorKind::BadTar,
            reason: "is a directory, not a tar stream; pack a directory with --workspace \
                     (or --harness)"
                .into(),
        });
    }
    if m.is_file() {
        let mut f = file;
        // Standard input may have been read from already: the stream
        // starts where it stands.
        let start = f
            .stream_position()
            .map_err(io_err("cannot seek the tar stream"))?;
        return Ok((f, true, start));
    }
    Ok((file, false, 0))
}

/// Reads the tar stream `from` as the tree of `part`, judging by `policy`
/// what a stream's spool may leave out (see the module's doc).
pub fn read(part: Part, from: &TarIn, policy: &Policy, limits: &Limits) -> Result<TarInput, Error> {
    let shown = from.shown();
    let (file, seekable, start) = open(from)?;
    let content = if seekable {
        file.try_clone().map_err(|e| Error::Io {
            path: shown.clone(),
            op: "cannot read the tar stream",
            source: e,
        })?
    } else {
        tempfile::tempfile().map_err(|e| Error::Io {
            path: std::env::temp_dir().display().to_string(),
            op: "cannot make a spool for the tar stream ($TMPDIR)",
            source: e,
        })?
    };
    let mut stream = Stream {
        inner: BufReader::with_capacity(1 << 16, file),
        pos: 0,
        seekable,
        shown: shown.clone(),
    };
    let mut input = TarInput {
        part,
        shown,
        content,
        spooled: None,
        members: Vec::new(),
        by_path: HashMap::new(),
        children: HashMap::new(),
    };
    input.place_root();
    let spool_file = input.content.try_clone().map_err(|e| Error::Io {
        path: input.shown.clone(),
        op: "cannot read the tar stream",
        source: e,
    })?;
    let mut spool = io::BufWriter::with_capacity(1 << 20, spool_file);
    let mut spooled: u64 = 0;
    let mut left_out = LeftOut::default();
    let mut first = true;
    while let Some(h) = read_header(&mut stream, first)? {
        first = false;
        let data = h.size.next_multiple_of(BLOCK);
        let is_file = matches!(h.typeflag, b'0' | 0 | b'7');
        let at = h.at;
        let index = input.place(h, limits)?;
        if !is_file {
            stream.skip(data)?;
            continue;
        }
        let Kind::File { size, .. } = input.members[index].kind else {
            return Err(input.bad(at, "internal: a file member not placed as one"));
        };
        let keep = seekable || !left_out.is_left_out(policy, part, &input.members[index].path);
        let offset = if seekable {
            Some(start + stream.pos)
        } else if keep {
            spooled = spooled.saturating_add(size);
            if spooled > limits.max_bytes {
                return Err(LimitKind::Bytes
                    .exceeded(spooled, limits, Some(&input.shown))
                    .into());
            }
            Some(spooled - size)
        } else {
            None
        };
        if let Kind::File { offset: o, .. } = &mut input.members[index].kind {
            *o = offset;
        }
        if keep && !seekable {
            stream.copy(size, &mut spool)?;
            stream.skip(data - size)?;
        } else {
            stream.skip(data)?;
        }
    }
    spool.flush().map_err(|e| Error::Io {
        path: std::env::temp_dir().display().to_string(),
        op: "cannot spool the tar stream ($TMPDIR)",
        source: e,
    })?;
    drop(spool);
    if !seekable {
        input.spooled = Some(spooled);
    }
    read_end(&mut stream)?;
    input.check_parents()?;
    Ok(input)
}

/// What a stream's spool leaves out, decided as members come: files the
/// policy leaves out as credentials, and what is beneath a directory it
/// leaves out. Decided by name alone, which is the verdict the tree will
/// get (a directory's verdict never depends on its siblings; a SQLite side
/// file's does, and side files are always kept).
#[derive(Default)]
struct LeftOut {
    /// Directories judged, by path: left out or not.
    dirs: HashMap<Vec<u8>, bool>,
}

impl LeftOut {
    /// Whether the file at `path` (beneath the root of `part`) is left
    /// out: a credential by its own name, or beneath a directory left out.
    fn is_left_out(&mut self, policy: &Policy, part: Part, path: &[u8]) -> bool {
        let mut at = part.as_str().to_owned();
        let mut end = 0;
        let mut comps = path.split(|&b| b == b'/').peekable();
        while let Some(c) = comps.next() {
            let name = String::from_utf8_lossy(c);
            at.push('/');
            at.push_str(&name);
            end += c.len();
            if comps.peek().is_none() {
                return sqlite_database_of(&name).is_none()
                    && matches!(
                        policy.judge(part, &at, &name, false),
                        Verdict::Exclude(r) if r.is_credential()
                    );
            }
            let out = *self.dirs.entry(path[..end].to_vec()).or_insert_with(|| {
                !matches!(policy.judge(part, &at, &name, true), Verdict::Include)
            });
            if out {
                return true;
            }
            end += 1; // the `/`
        }
        false
    }
}

/// Reads the headers of the next member (its extension headers first);
/// `None` at the end-of-archive block.
fn read_header(s: &mut Stream, first: bool) -> Result<Option<Header>, Error> {
    let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut extensions = 0;
    loop {
        let at = s.pos;
        let Some(b) = s.block()? else {
            if first && extensions == 0 {
                return Err(s.bad(at, "the stream is empty"));
            }
            return Err(s.bad(
                at,
                "the stream ends without its end-of-archive block: it was cut short",
            ));
        };
        if b.iter().all(|&x| x == 0) {
            if extensions > 0 {
                return Err(s.bad(at, "an extension header with no member after it"));
            }
            return Ok(None);
        }
        if first && at == 0 {
            refuse_compressed(s, &b)?;
        }
        check_header(s, &b, at)?;
        let typeflag = b[156];
        let size = number(&b[124..136]).ok_or_else(|| s.bad(at, "a size that is not a number"))?;
        let size = u64::try_from(size).map_err(|_| s.bad(at, "a negative size"))?;
        match typeflag {
            b'x' | b'g' | b'L' | b'K' => {
                extensions += 1;
                if extensions > MAX_EXTENSIONS {
                    return Err(s.bad(
                        at,
                        format!("more than {MAX_EXTENSIONS} extension headers in a row"),
                    ));
                }
                if size > MAX_EXTENDED_HEADER {
                    return Err(s.bad(
                        at,
                        format!(
                            "an extension header of {size} bytes; more than {MAX_EXTENDED_HEADER} \
                             is not read"
                        ),
                    ));
                }
                let mut data = Vec::with_capacity(size as usize);
                s.read_into(size, &mut data)?;
                s.skip(size.next_multiple_of(BLOCK) - size)?;
                match typeflag {
                    b'x' => pax.extend(pax_records(&data).map_err(|e| s.bad(at, e))?),
                    b'g' => {
                        // Global records change every member after them; only
                        // those that change nothing pack reads are taken.
                        for (k, _) in pax_records(&data).map_err(|e| s.bad(at, e))? {
                            if matters(&k) {
                                return Err(s.bad(at, format!("a global PAX header setting `{k}` for every member after it, which pack does not apply")));
                            }
                        }
                    }
                    b'L' => long_name = Some(until_nul(&data).to_vec()),
                    _ => long_link = Some(until_nul(&data).to_vec()),
                }
                continue;
            }
            _ => {}
        }
        let mut name = match long_name.take() {
            Some(n) => n,
            None => {
                let name = until_nul(&b[0..100]);
                let prefix = if &b[257..263] == b"ustar\0" {
                    until_nul(&b[345..500])
                } else {
                    &[]
                };
                if prefix.is_empty() {
                    name.to_vec()
                } else {
                    [prefix, b"/", name].concat()
                }
            }
        };
        let mut link = long_link
            .take()
            .unwrap_or_else(|| until_nul(&b[157..257]).to_vec());
        let mut size = size;
        let mut mtime_ns = number(&b[136..148])
            .ok_or_else(|| s.bad(at, "an mtime that is not a number"))?
            .saturating_mul(1_000_000_000);
        for (k, v) in std::mem::take(&mut pax) {
            match k.as_str() {
                "path" => name = v,
                "linkpath" => link = v,
                "size" => {
                    size = std::str::from_utf8(&v)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| s.bad(at, "a PAX size that is not a number"))?;
                }
                "mtime" => {
                    mtime_ns =
                        pax_time(&v).ok_or_else(|| s.bad(at, "a PAX mtime that is not a time"))?;
                }
                k if k.starts_with("GNU.sparse") => {
                    return Err(s.bad(at, "a sparse file (GNU sparse format), which pack does not read: make the tar without --sparse"));
                }
                _ => {}
            }
        }
        let mode = number(&b[100..108]).ok_or_else(|| s.bad(at, "a mode that is not a number"))?;
        return Ok(Some(Header {
            name,
            link,
            typeflag,
            size,
            mode: u32::try_from(mode & 0o7777).unwrap_or(0),
            mtime_ns,
            at,
        }));
    }
}

/// Whether a global PAX record would change what pack reads of members.
fn matters(key: &str) -> bool {
    matches!(key, "path" | "linkpath" | "size" | "mtime") || key.starts_with("GNU.sparse")
}

/// A compressed stream is named as such, not as a bad header.
fn refuse_compressed(s: &Stream, b: &[u8]) -> Result<(), Error> {
    let what = if b.starts_with(&[0x1f, 0x8b]) {
        "gzip"
    } else if b.starts_with(b"BZh") {
        "bzip2"
    } else if b.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        "xz"
    } else if b.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "zstd"
    } else {
        return Ok(());
    };
    Err(s.bad(
        0,
        format!("a {what}-compressed stream; decompress it first (`{what} -dc` into `--workspace-tar -`)"),
    ))
}

/// A header block must be ustar (POSIX or GNU) with a checksum that holds.
fn check_header(s: &Stream, b: &[u8; BLOCK as usize], at: u64) -> Result<(), Error> {
    let magic = &b[257..263];
    if magic != b"ustar\0" && magic != b"ustar " {
        return Err(s.bad(
            at,
            "a header that is not ustar or GNU tar (no `ustar` magic)",
        ));
    }
    let stored =
        number(&b[148..156]).ok_or_else(|| s.bad(at, "a header checksum that is not a number"))?;
    // The sum with the checksum field as spaces; old writers summed
    // signed bytes, and readers take either.
    let (mut unsigned, mut signed) = (0i128, 0i128);
    for (k, &x) in b.iter().enumerate() {
        let x = if (148..156).contains(&k) { b' ' } else { x };
        unsigned += i128::from(x);
        signed += i128::from(x as i8);
    }
    if stored != unsigned && stored != signed {
        return Err(s.bad(
            at,
            "a header whose checksum is wrong: the stream is damaged",
        ));
    }
    Ok(())
}

/// A numeric field: octal digits (spaces and NULs around them), or
/// base-256 (the first byte's high bit set; GNU and star for values octal
/// cannot hold, negative times included).
fn number(field: &[u8]) -> Option<i128> {
    if let Some(&first) = field.first()
        && first & 0x80 != 0
    {
        // Two's complement over the field, bit 6 of the first byte the sign.
        if field.len() > 12 {
            return None;
        }
        let negative = first & 0x40 != 0;
        let mut v: i128 = i128::from(first & 0x3f) - if negative { 0x40 } else { 0 };
        for &x in &field[1..] {
            v = v.checked_mul(256)?.checked_add(i128::from(x))?;
        }
        return Some(v);
    }
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c| c == ' ' || c == '\0');
    if text.is_empty() {
        return Some(0);
    }
    if !text.bytes().all(|c| (b'0'..=b'7').contains(&c)) || text.len() > 22 {
        return None;
    }
    i128::from_str_radix(text, 8).ok()
}

/// A PAX time, `[-]SECONDS[.FRACTION]`, in nanoseconds (digits past the
/// ninth dropped, toward zero as POSIX says times are truncated).
fn pax_time(v: &[u8]) -> Option<i128> {
    let t = std::str::from_utf8(v).ok()?;
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let (secs, frac) = t.split_once('.').unwrap_or((t, ""));
    if secs.is_empty() || secs.len() > 20 || !secs.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let secs: i128 = secs.parse().ok()?;
    let mut nanos: i128 = 0;
    for (k, c) in frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .enumerate()
    {
        let _ = k;
        nanos = nanos * 10 + i128::from(c - b'0');
    }
    let v = secs * 1_000_000_000 + nanos;
    Some(if neg { -v } else { v })
}

/// The records of a PAX header, `"<len> <key>=<value>\n"` each.
fn pax_records(mut data: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    // A header's records may be followed by NUL padding some writers leave.
    while !data.is_empty() && data[0] != 0 {
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a PAX record without its length")?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .filter(|l| !l.is_empty() && l.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|l| l.parse().ok())
            .ok_or("a PAX record whose length is not a number")?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err("a PAX record whose length is wrong".into());
        }
        let record = &data[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a PAX record without `=`")?;
        let key = std::str::from_utf8(&record[..eq])
            .map_err(|_| "a PAX key that is not UTF-8")?
            .to_owned();
        out.push((key, record[eq + 1..].to_vec()));
        data = &data[len..];
    }
    Ok(out)
}

fn until_nul(b: &[u8]) -> &[u8] {
    b.iter().position(|&x| x == 0).map_or(b, |n| &b[..n])
}

/// After the first end-of-archive block: zeros, up to
/// [`MAX_TRAILING_ZEROS`], then the end of the input.
fn read_end(s: &mut Stream) -> Result<(), Error> {
    let at = s.pos;
    let mut rest = Vec::new();
    (&mut s.inner)
        .take(MAX_TRAILING_ZEROS + 1)
        .read_to_end(&mut rest)
        .map_err(|e| s.io(e))?;
    if let Some(k) = rest.iter().position(|&b| b != 0) {
        return Err(s.bad(
            at + k as u64,
            "bytes after the end of the archive (two archives in one stream?)",
        ));
    }
    if rest.len() as u64 > MAX_TRAILING_ZEROS {
        return Err(s.bad(
            at,
            format!("more than {MAX_TRAILING_ZEROS} zero bytes after the end of the archive"),
        ));
    }
    // Nothing more is waited for.
    let _ = s.inner.fill_buf();
    Ok(())
}

/// A member's name as a path beneath the root: `.` and empty components
/// dropped (`./a`, `a/`, `a//b`), `""` for the root; `None` for an
/// absolute name or one with `..`.
fn normalize(name: &[u8]) -> Option<Vec<u8>> {
    if name.first() == Some(&b'/') {
        return None;
    }
    let mut out: Vec<u8> = Vec::with_capacity(name.len());
    for c in name.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            c => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    Some(out)
}

impl TarInput {
    fn place_root(&mut self) {
        self.members.push(Member {
            path: Vec::new(),
            kind: Kind::Dir,
            mode: 0o755,
            mtime_ns: 0,
            at: 0,
        });
        self.by_path.insert(Vec::new(), 0);
    }

    fn bad(&self, at: u64, what: impl std::fmt::Display) -> Error {
        bad_tar(&self.shown, at, what)
    }

    /// Places member `h` in the tree; its index.
    fn place(&mut self, h: Header, limits: &Limits) -> Result<usize, Error> {
        let at = h.at;
        let shown = crate::packet::path::shown(&h.name);
        let path = normalize(&h.name).ok_or_else(|| {
            self.bad(at, format!("member `{shown}`: an absolute name, or one with `..`, which would land outside the tree"))
        })?;
        if path.len() > limits.max_path_bytes as usize + 256 {
            // Checked exactly (with the part's name) by the policy step;
            // this only bounds what is kept of a name nobody could pack.
            return Err(LimitKind::PathBytes
                .exceeded(
                    path.len() as u64,
                    limits,
                    Some(&format!("{}/{shown}", self.part.as_str())),
                )
                .into());
        }
        let kind = match h.typeflag {
            b'0' | 0 | b'7' => Kind::File {
                size: h.size,
                offset: None,
            },
            b'5' => Kind::Dir,
            b'2' => Kind::Symlink(h.link),
            b'1' => {
                let target = normalize(&h.link).ok_or_else(|| {
                    self.bad(
                        at,
                        format!(
                            "member `{shown}`: a hard link to `{}`, outside the tree",
                            crate::packet::path::shown(&h.link)
                        ),
                    )
                })?;
                let data = match self
                    .by_path
                    .get(&target)
                    .map(|&i| (i, &self.members[i].kind))
                {
                    Some((i, Kind::File { .. })) => i,
                    Some((_, Kind::HardLink(i))) => *i,
                    _ => {
                        return Err(self.bad(at, format!(
                            "member `{shown}`: a hard link to `{}`, which is not a file before it in the stream",
                            crate::packet::path::shown(&h.link)
                        )));
                    }
                };
                Kind::HardLink(data)
            }
            b'3' => Kind::Special(EntryType::CharDevice),
            b'4' => Kind::Special(EntryType::BlockDevice),
            b'6' => Kind::Special(EntryType::Fifo),
            t => {
                let what = match t {
                    b'S' => "a GNU sparse file",
                    b'D' => "a GNU dump directory",
                    b'M' | b'N' => "a GNU multi-volume member",
                    b'V' => "a volume label",
                    _ => "a member of an unknown type",
                };
                return Err(self.bad(
                    at,
                    format!(
                        "member `{shown}`: {what} (type `{}`), which pack does not read",
                        t.escape_ascii()
                    ),
                ));
            }
        };
        // Sizes that mean nothing for what is not a file's content are
        // skipped over all the same; a file's is bounded by the format.
        if let Kind::File { size, .. } = kind {
            check_file_size(&format!("{}/{shown}", self.part.as_str()), size)?;
        }
        if let Some(&i) = self.by_path.get(&path) {
            let same_dir = matches!(kind, Kind::Dir) && matches!(self.members[i].kind, Kind::Dir);
            if !same_dir {
                return Err(self.bad(at, format!("member `{shown}` comes twice (a later one would replace the earlier): the stream is ambiguous")));
            }
            // A directory named again (or named after what it holds): one.
            self.members[i].at = self.members[i].at.min(at);
            return Ok(i);
        }
        // Directories implied by the name, where not named.
        let mut parent = 0;
        let mut k = 0;
        while let Some(slash) = path[k..].iter().position(|&b| b == b'/') {
            let dir = &path[..k + slash];
            parent = match self.by_path.get(dir) {
                Some(&i) => i,
                None => {
                    let i = self.members.len();
                    self.check_count(limits)?;
                    self.members.push(Member {
                        path: dir.to_vec(),
                        kind: Kind::Dir,
                        mode: 0o755,
                        mtime_ns: 0,
                        at,
                    });
                    self.by_path.insert(dir.to_vec(), i);
                    self.children.entry(parent).or_default().push(i);
                    i
                }
            };
            k += slash + 1;
        }
        let i = self.members.len();
        self.check_count(limits)?;
        self.members.push(Member {
            path: path.clone(),
            kind,
            mode: h.mode,
            mtime_ns: h.mtime_ns,
            at,
        });
        self.by_path.insert(path, i);
        if i != 0 {
            self.children.entry(parent).or_default().push(i);
        }
        Ok(i)
    }

    /// The members kept (those read, and the directories they imply) are
    /// bounded by twice `--max-entries`: those taken count against the
    /// limit itself in [`TarInput::walk`], the rest (left out) may be as
    /// many again, as a walk reads the names of credential directories.
    fn check_count(&self, limits: &Limits) -> Result<(), Error> {
        let n = self.members.len() as u64 + 1;
        if n > limits.max_entries.saturating_mul(2) {
            return Err(LimitKind::Entries
                .exceeded(n, limits, Some(&self.shown))
                .into());
        }
        Ok(())
    }

    /// Every member's directory is a directory: nothing beneath a file or
    /// a symlink (an extractor would write through the link).
    fn check_parents(&self) -> Result<(), Error> {
        for (&dir, kids) in &self.children {
            let d = &self.members[dir];
            if !matches!(d.kind, Kind::Dir) {
                let child = &self.members[kids[0]];
                let what = match d.kind {
                    Kind::Symlink(_) => "a symlink",
                    _ => "not a directory",
                };
                return Err(self.bad(
                    child.at,
                    format!(
                        "member `{}` lies beneath `{}`, which is {what}: an extractor would \
                         write through it",
                        crate::packet::path::shown(&child.path),
                        crate::packet::path::shown(&d.path),
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The packet path of member `i`.
    fn packet_path(&self, i: usize) -> String {
        let p = &self.members[i].path;
        if p.is_empty() {
            self.part.as_str().to_owned()
        } else {
            format!("{}/{}", self.part.as_str(), crate::packet::path::shown(p))
        }
    }

    /// The tree through the policy step, as [`super::walk::scan`] takes a
    /// directory: the entries taken, and what was left out or changed.
    /// `input` is this input's index among the tar inputs.
    pub fn walk(
        &self,
        input: usize,
        policy: &Policy,
        zero_mtimes: bool,
        reject_external: bool,
        limits: &Limits,
        tally: &Tally,
    ) -> Result<(Vec<Found>, ScanReport), Error> {
        let mut report = ScanReport::default();
        let mut found = Vec::new();
        let part = self.part;
        tally.count(part.as_str(), 0, limits)?;
        found.push(Found {
            path: part.as_str().to_owned(),
            kind: FoundKind::Dir,
        });
        let mut linked_out: Vec<(usize, String)> = Vec::new();
        let mut unkept: Vec<(String, usize)> = Vec::new();
        let mut credential_dirs = Vec::new();
        let mut todo = vec![(0usize, 0usize)];
        let no_children = Vec::new();
        while let Some((dir, depth)) = todo.pop() {
            let ppath = self.packet_path(dir);
            let kids = self.children.get(&dir).unwrap_or(&no_children);
            let names: Vec<(String, Option<Vec<u8>>, EntryType)> = kids
                .iter()
                .map(|&i| {
                    let m = &self.members[i];
                    let raw = m.path.rsplit(|&b| b == b'/').next().unwrap_or_default();
                    let (name, not_utf8) = match std::str::from_utf8(raw) {
                        Ok(n) => (n.to_owned(), None),
                        Err(_) => (
                            String::from_utf8_lossy(raw).into_owned(),
                            Some(raw.to_vec()),
                        ),
                    };
                    (name, not_utf8, self.entry_type(i))
                })
                .collect();
            let typed: Vec<(&str, EntryType)> =
                names.iter().map(|(n, _, t)| (n.as_str(), *t)).collect();
            let verdicts = judge(policy, part, &ppath, &typed);
            for ((&i, (_, raw, ty)), verdict) in kids.iter().zip(&names).zip(verdicts) {
                let cpath = self.packet_path(i);
                if matches!(verdict, Verdict::Include) && raw.is_some() {
                    return Err(non_utf8_name(cpath));
                }
                match report.classify(&cpath, *ty, verdict, limits)? {
                    Step::Take => {}
                    Step::LeftOut => continue,
                    Step::CredentialFile => {
                        linked_out.push((self.data_of(i), cpath));
                        continue;
                    }
                    Step::CredentialDir => {
                        credential_dirs.push(i);
                        continue;
                    }
                }
                let m = &self.members[i];
                match &m.kind {
                    Kind::Dir => {
                        tally.count(&cpath, 0, limits)?;
                        found.push(Found {
                            path: cpath,
                            kind: FoundKind::Dir,
                        });
                        todo.push((i, depth + 1));
                    }
                    Kind::File { .. } | Kind::HardLink(_) => {
                        let d = self.data_of(i);
                        let data = &self.members[d];
                        let Kind::File { size, offset } = data.kind else {
                            continue;
                        };
                        // Content not kept: fine if this name goes too (another
                        // name of a credential), refused below if it stays.
                        let offset = offset.unwrap_or_else(|| {
                            unkept.push((cpath.clone(), d));
                            0
                        });
                        tally.count(&cpath, size, limits)?;
                        found.push(Found {
                            kind: FoundKind::File(FoundFile {
                                size,
                                mtime_ns: report.record_mtime(&cpath, data.mtime_ns, zero_mtimes),
                                executable: data.mode & 0o111 != 0,
                                origin: Origin::Tar {
                                    input,
                                    offset,
                                    id: d as u64,
                                },
                            }),
                            path: cpath,
                        });
                    }
                    Kind::Symlink(target) => {
                        let shown = crate::packet::path::shown(target);
                        let Ok(target) = std::str::from_utf8(target) else {
                            return Err(non_utf8_target(&cpath, &shown));
                        };
                        let stored = report
                            .symlink(&cpath, target, depth, &[], part, reject_external)
                            .map_err(|reason| Error::Refused {
                                path: cpath.clone(),
                                kind: ErrorKind::ExternalSymlink,
                                reason,
                            })?;
                        tally.count(&cpath, 0, limits)?;
                        found.push(Found {
                            path: cpath,
                            kind: FoundKind::Symlink(stored),
                        });
                    }
                    // (Special files: dropped and reported by `classify`.)
                    Kind::Special(_) => {}
                }
            }
        }
        // The files beneath directories left out as credentials, whose
        // other names go too; their names count against the limit, as a
        // walk's reading of such directories does.
        let mut seen = 0u64;
        while let Some(dir) = credential_dirs.pop() {
            for &i in self.children.get(&dir).unwrap_or(&no_children) {
                seen += 1;
                if seen > limits.max_entries {
                    return Err(LimitKind::Entries
                        .exceeded(seen, limits, Some(&self.packet_path(dir)))
                        .into());
                }
                match self.members[i].kind {
                    Kind::Dir => credential_dirs.push(i),
                    Kind::File { .. } | Kind::HardLink(_) => {
                        linked_out.push((self.data_of(i), self.packet_path(i)));
                    }
                    _ => {}
                }
            }
        }
        report.exclude_other_names(&mut found, linked_out, |f| match &f.kind {
            FoundKind::File(FoundFile {
                origin: Origin::Tar { id, .. },
                ..
            }) => Some((*id as usize, f.path.as_str())),
            _ => None,
        });
        if let Some((path, d)) = unkept
            .into_iter()
            .find(|(p, _)| found.iter().any(|f| f.path == *p))
        {
            return Err(Error::Refused {
                path,
                kind: ErrorKind::BadTar,
                reason: format!(
                    "is a hard link to `{}`, whose content was not kept as the stream was read \
                     (that name is left out, and a stream is read once); give the tar as a \
                     file instead of a pipe",
                    self.packet_path(d)
                ),
            });
        }
        report.sort();
        Ok((found, report))
    }

    /// The member holding member `i`'s content (itself, but for a hard link).
    fn data_of(&self, i: usize) -> usize {
        match self.members[i].kind {
            Kind::HardLink(d) => d,
            _ => i,
        }
    }

    fn entry_type(&self, i: usize) -> EntryType {
        match self.members[i].kind {
            Kind::Dir => EntryType::Dir,
            Kind::File { .. } | Kind::HardLink(_) => EntryType::File,
            Kind::Symlink(_) => EntryType::Symlink,
            Kind::Special(t) => t,
        }
    }

    /// Reads `buf.len()` bytes of content at `offset`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.content.read_exact_at(buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_octal_and_base_256() {
        let table: &[(&[u8], Option<i128>)] = &[
            (b"0000644\0", Some(0o644)),
            (b"  644 \0", Some(0o644)),
            (b"\0\0\0\0\0\0\0\0", Some(0)),
            (b"00000000017\0", Some(0o17)),
            (b"0009\0", None),
            (b"12a\0", None),
            (&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0], Some(256)),
            (
                &[
                    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ],
                Some(-1),
            ),
        ];
        for (field, want) in table {
            assert_eq!(number(field), *want, "{}", field.escape_ascii());
        }
    }

    #[test]
    fn pax_times_to_the_nanosecond() {
        let table: &[(&str, Option<i128>)] = &[
            ("1700000000", Some(1_700_000_000_000_000_000)),
            ("1700000000.5", Some(1_700_000_000_500_000_000)),
            ("1700000000.123456789", Some(1_700_000_000_123_456_789)),
            ("1700000000.1234567891", Some(1_700_000_000_123_456_789)),
            ("-1.25", Some(-1_250_000_000)),
            ("", None),
            ("1e9", None),
            ("1.2.3", None),
            (".5", None),
        ];
        for (v, want) in table {
            assert_eq!(pax_time(v.as_bytes()), *want, "{v}");
        }
    }

    #[test]
    fn pax_records_are_read_strictly() {
        assert_eq!(
            pax_records(b"16 path=abcdefg\n13 mtime=1.5\n").unwrap(),
            vec![
                ("path".into(), b"abcdefg".to_vec()),
                ("mtime".into(), b"1.5".to_vec())
            ]
        );
        assert_eq!(pax_records(b"16 path=abcdefg\n\0\0\0").unwrap().len(), 1);
        for bad in [
            &b"15 path=abcdefg\n"[..],
            b"99 path=x\n",
            b"x path=y\n",
            b"8 pathx\n",
        ] {
            assert!(pax_records(bad).is_err(), "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn names_normalize_or_are_refused() {
        let table: &[(&str, Option<&str>)] = &[
            (".", Some("")),
            ("./", Some("")),
            ("./a/b", Some("a/b")),
            ("a//b/", Some("a/b")),
            ("a/./b", Some("a/b")),
            ("/etc/passwd", None),
            ("a/../../b", None),
            ("..", None),
        ];
        for (name, want) in table {
            assert_eq!(
                normalize(name.as_bytes()).map(|v| String::from_utf8(v).unwrap()),
                want.map(str::to_owned),
                "{name}"
            );
        }
    }
}
