//! `packet.json`: the manifest types, their one canonical JSON encoding, and
//! the strict parser. Pure: no I/O.
//!
//! The encoder and the parser are written here by hand, as mirror images, for
//! two reasons that a general JSON crate does not serve: the parser must
//! accept exactly one encoding of each manifest (key order, no whitespace, one
//! spelling of each escape and number), so that the digest of `packet.json`
//! names the packet; and a mount parses the whole manifest before it serves,
//! so the parser runs at memory speed without building a generic value tree.
//! `serde_json` is used only to recognize a foreign schema version.

use std::borrow::Cow;

use super::digest::{Sha256, chunk_list_hash};
use super::error::{Error, LimitKind, Result};
use super::format::{
    HarnessKind, Limits, MAX_FILE_SIZE, MAX_MTIME_NS, MAX_TARGET_BYTES, PART_HARNESS,
    PART_WORKSPACE, SUPPORTED_SCHEMAS, Version, chunk_count,
};
use super::path::{self, check_path, collision_key};

/// A parsed manifest. Entries are in canonical order (raw path bytes).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Manifest {
    /// The format version it is (to be) written in.
    pub version: Version,
    /// The harness kind; present exactly when the packet has a harness part.
    pub harness: Option<HarnessKind>,
    /// Every member after the manifest, in order.
    pub entries: Vec<Entry>,
}

/// One entry: a directory, a regular file or a symlink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path from the packet root, e.g. `workspace/src/main.rs`.
    pub path: Box<str>,
    /// What it is.
    pub kind: EntryKind,
}

/// The type-specific part of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory (no metadata: mode 0755, no mtime).
    Dir,
    /// A regular file.
    File(FileMeta),
    /// A symbolic link, with its target stored verbatim.
    Symlink(Box<str>),
}

/// What the manifest records of a regular file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FileMeta {
    /// Length in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch (0 with `--zero-mtimes`).
    pub mtime_ns: u64,
    /// Mode 0755 instead of 0644.
    pub executable: bool,
    /// What identifies the content: the SHA-256 of the whole content, or,
    /// for a file with chunks in a `/2` manifest, the [`chunk_list_hash`]
    /// of its chunks (written nowhere in the manifest: it follows from
    /// `chunks`).
    pub sha256: Sha256,
    /// SHA-256 of each 4 MiB chunk; empty unless the file exceeds one chunk.
    pub chunks: Box<[Sha256]>,
}

impl Entry {
    /// The file metadata, for a file.
    pub fn file(&self) -> Option<&FileMeta> {
        match &self.kind {
            EntryKind::File(f) => Some(f),
            _ => None,
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self.kind, EntryKind::Dir)
    }

    /// Content length (0 for directories and symlinks).
    pub fn size(&self) -> u64 {
        self.file().map_or(0, |f| f.size)
    }

    /// Its length in the manifest once hashed (see
    /// [`Manifest::encoded_len`]).
    fn encoded_len(&self, version: Version) -> u64 {
        let digits = |n: u64| n.checked_ilog10().unwrap_or(0) as u64 + 1;
        let hex = 2 + 64; // a quoted hash
        let mut n = b"{\"path\":".len() as u64 + string_len(&self.path);
        n += b",\"type\":\"\"".len() as u64 + self.type_name().len() as u64 + 1; // and `}`
        match &self.kind {
            EntryKind::Dir => {}
            EntryKind::File(f) => {
                n += b",\"size\":".len() as u64 + digits(f.size);
                n += b",\"mtime_ns\":".len() as u64 + digits(f.mtime_ns);
                if f.executable {
                    n += b",\"executable\":true".len() as u64;
                }
                if version.whole_file_hash(f.size) {
                    n += b",\"sha256\":".len() as u64 + hex;
                }
                let chunks = super::format::chunk_count(f.size);
                if chunks > 0 {
                    n += b",\"chunks\":[]".len() as u64 + chunks * (hex + 1) - 1;
                }
            }
            EntryKind::Symlink(t) => n += b",\"target\":".len() as u64 + string_len(t),
        }
        n
    }

    /// The manifest spelling of the type.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            EntryKind::Dir => "dir",
            EntryKind::File(_) => "file",
            EntryKind::Symlink(_) => "symlink",
        }
    }
}

/// Keys of the top-level object, in canonical order.
const TOP_KEYS: &[&str] = &["schema", "harness", "entries"];

/// The parent of a part root, in [`Manifest::validate_tree`]'s result.
pub const NO_PARENT: u32 = u32::MAX;

/// Marks a path that failed its checks in the parallel pass of validation.
const FAILED: u64 = u64::MAX;
/// Keys of an entry object, in canonical order (per type, a subsequence).
const ENTRY_KEYS: &[&str] = &[
    "path",
    "type",
    "size",
    "mtime_ns",
    "executable",
    "sha256",
    "chunks",
    "target",
];

// ---------------------------------------------------------------------------
// Encoding

impl Manifest {
    /// The canonical bytes of `packet.json`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.entries.len() * 160);
        out.extend_from_slice(b"{\"schema\":");
        write_string(&mut out, self.version.schema());
        if let Some(h) = self.harness {
            out.extend_from_slice(b",\"harness\":");
            write_string(&mut out, h.as_str());
        }
        out.extend_from_slice(b",\"entries\":[");
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            encode_entry(&mut out, e, self.version);
        }
        out.extend_from_slice(b"]}");
        out
    }

    /// The length [`Manifest::encode`] gives once every file is hashed
    /// (each file larger than a chunk then lists its chunks), computed
    /// without encoding: a writer checks it against the readers' bound
    /// before it hashes anything.
    pub fn encoded_len(&self) -> u64 {
        let mut n = b"{\"schema\":".len() as u64 + string_len(self.version.schema());
        if let Some(h) = self.harness {
            n += b",\"harness\":".len() as u64 + string_len(h.as_str());
        }
        n += b",\"entries\":[".len() as u64 + 2; // and `]}`
        n += self.entries.len().saturating_sub(1) as u64; // commas
        n + self
            .entries
            .iter()
            .map(|e| e.encoded_len(self.version))
            .sum::<u64>()
    }

    /// Refuses, as a limit, a manifest whose [encoded
    /// length](Manifest::encoded_len) readers under `limits` would refuse:
    /// a writer never writes what a reader refuses. (The readers' bound
    /// allows 2 KiB an entry on average; long paths and targets, written
    /// with escapes, can need more.)
    /// The error names the entry that takes the most bytes.
    pub fn check_encoded_len(&self, limits: &Limits) -> Result<()> {
        let len = self.encoded_len();
        if len > limits.max_manifest_bytes() {
            let largest = self
                .entries
                .iter()
                .max_by_key(|e| e.encoded_len(self.version));
            let path = largest.map(|e| &*e.path);
            return Err(LimitKind::ManifestBytes.exceeded(len, limits, path));
        }
        Ok(())
    }

    /// Total content bytes.
    pub fn content_bytes(&self) -> u64 {
        self.entries.iter().map(Entry::size).sum()
    }

    /// Whether the packet has a part.
    pub fn has_part(&self, part: path::Part) -> bool {
        let name = part.as_str();
        self.entries.iter().any(|e| &*e.path == name)
    }
}

fn encode_entry(out: &mut Vec<u8>, e: &Entry, version: Version) {
    out.extend_from_slice(b"{\"path\":");
    write_string(out, &e.path);
    out.extend_from_slice(b",\"type\":\"");
    out.extend_from_slice(e.type_name().as_bytes());
    out.push(b'"');
    match &e.kind {
        EntryKind::Dir => {}
        EntryKind::File(f) => {
            let mut num = itoa::Buffer::new();
            out.extend_from_slice(b",\"size\":");
            out.extend_from_slice(num.format(f.size).as_bytes());
            out.extend_from_slice(b",\"mtime_ns\":");
            out.extend_from_slice(num.format(f.mtime_ns).as_bytes());
            if f.executable {
                out.extend_from_slice(b",\"executable\":true");
            }
            if version.whole_file_hash(f.size) {
                out.extend_from_slice(b",\"sha256\":\"");
                f.sha256.write_hex(out);
                out.push(b'"');
            }
            if !f.chunks.is_empty() {
                out.extend_from_slice(b",\"chunks\":[");
                for (i, c) in f.chunks.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.push(b'"');
                    c.write_hex(out);
                    out.push(b'"');
                }
                out.push(b']');
            }
        }
        EntryKind::Symlink(target) => {
            out.extend_from_slice(b",\"target\":");
            write_string(out, target);
        }
    }
    out.push(b'}');
}

/// Whether key `want` comes later in the JSON object whose value starting
/// at `at` is being read: skips that value and each following member to
/// the object's end. Only classifies an error already found (missing, or
/// out of order): any surprise on the way (whitespace, escaped keys,
/// nesting past its bound, the end of the input) is `None`, and the error
/// stays what it was. Linear in the object.
fn key_follows(bytes: &[u8], mut at: usize, want: &str) -> Option<bool> {
    /// End of the JSON string starting at `at` (its closing quote + 1).
    fn string_end(b: &[u8], at: usize) -> Option<usize> {
        if b.get(at) != Some(&b'"') {
            return None;
        }
        let mut i = at + 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
        None
    }
    /// End of the value starting at `at`.
    fn value_end(b: &[u8], at: usize, depth: u8) -> Option<usize> {
        let (open, close) = match *b.get(at)? {
            b'"' => return string_end(b, at),
            b'[' => (b'[', b']'),
            b'{' => (b'{', b'}'),
            _ => {
                let n = b[at..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.'))
                    .count();
                return (n > 0).then_some(at + n);
            }
        };
        if depth == 0 {
            return None;
        }
        let mut i = at + 1;
        if b.get(i) == Some(&close) {
            return Some(i + 1);
        }
        loop {
            if open == b'{' {
                i = string_end(b, i).filter(|&e| b.get(e) == Some(&b':'))? + 1;
            }
            i = value_end(b, i, depth - 1)?;
            match *b.get(i)? {
                b',' => i += 1,
                c if c == close => return Some(i + 1),
                _ => return None,
            }
        }
    }
    loop {
        let end = value_end(bytes, at, 4)?;
        match *bytes.get(end)? {
            b'}' => return Some(false),
            b',' => {}
            _ => return None,
        }
        let key_end = string_end(bytes, end + 1)?;
        let key = &bytes[end + 2..key_end - 1];
        if key.contains(&b'\\') {
            return None;
        }
        if key == want.as_bytes() {
            return Some(true);
        }
        if bytes.get(key_end) != Some(&b':') {
            return None;
        }
        at = key_end + 1;
    }
}

/// The length [`write_string`] writes for `s`.
fn string_len(s: &str) -> u64 {
    let escapes: u64 = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    s.len() as u64 + 2 + escapes
}

/// Writes a JSON string with the canonical escapes: `\"`, `\\`, the five
/// short control escapes, `\u00xx` (lowercase) for other controls below
/// U+0020, and every other character as itself.
fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

// ---------------------------------------------------------------------------
// Parsing

impl Manifest {
    /// Parses and validates `packet.json` bytes: canonical encoding, schema,
    /// path rules, order, parents, collisions and `limits`.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Manifest> {
        Manifest::parse_tree(bytes, limits).map(|(m, _)| m)
    }

    /// [`Manifest::parse`], with the parent of each entry that validation
    /// finds (see [`Manifest::validate_tree`]).
    pub fn parse_tree(bytes: &[u8], limits: &Limits) -> Result<(Manifest, Vec<u32>)> {
        let text = utf8(bytes)?;
        let manifest = match parse_in_pieces(text, limits) {
            Some(m) => m,
            None => Parser::new(text).manifest(limits)?,
        };
        let parents = manifest.validate_tree(limits)?;
        Ok((manifest, parents))
    }

    /// The schema string of a manifest, read leniently (any JSON object with
    /// a string `schema` key). Used to report foreign versions.
    pub fn sniff_schema(bytes: &[u8]) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Sniff {
            schema: String,
        }
        serde_json::from_slice::<Sniff>(bytes)
            .ok()
            .map(|s| s.schema)
    }
}

/// The manifest's bytes as text, or where they stop being UTF-8.
fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|e| Error::ManifestSyntax {
        offset: e.valid_up_to(),
        reason: "invalid UTF-8".into(),
    })
}

/// The bytes that open every entry object. In a canonical manifest they
/// occur nowhere else: a `"` inside a string is always escaped.
const ENTRY_OPEN: &[u8] = b"{\"path\":\"";
/// What separates two entries.
const ENTRY_SEP: &[u8] = b"},{\"path\":\"";
/// The entries are parsed in about this many pieces, so that both cores
/// share them evenly while one of them also hashes the manifest.
const PARSE_PIECES: usize = 16;

/// Parses a manifest's entries on all cores: the entries array is cut just
/// before entry objects into pieces, each piece is parsed by the same code
/// as the sequential parser, into its own slots of the result. Any surprise
/// (an error, a cut in a wrong place, a limit) gives `None`, and the caller
/// parses sequentially, which reports the same first error it always did.
///
/// Why the result is the sequential parser's, by induction over the pieces:
/// the first starts where the sequential parser's first entry does; a piece
/// is accepted only when its entries, separated by `,`, end exactly at the
/// `,` before the next cut (or at the final `]}`), so the sequential parser,
/// in the same state there, would start its next entry at that cut. A cut
/// in a wrong place can only fail a piece. The limits the sequential parser
/// checks as it goes are monotone, so checking the totals afterwards is the
/// same check.
fn parse_in_pieces(text: &str, limits: &Limits) -> Option<Manifest> {
    use rayon::prelude::*;
    let mut head = Parser::new(text);
    let harness = head.header().ok()?;
    let version = head.version;
    let bytes = text.as_bytes();
    let start = head.pos;
    // The array ends with the last entry's `}`, then `]}` and nothing after.
    let end = bytes.len().checked_sub(2)?;
    if start >= end || &bytes[end..] != b"]}" || !bytes[start..].starts_with(ENTRY_OPEN) {
        return None;
    }
    let finder = memchr::memmem::Finder::new(ENTRY_SEP);
    let mut cuts = vec![start];
    for k in 1..PARSE_PIECES {
        let target = start + (end - start) * k / PARSE_PIECES;
        let from = target.max(*cuts.last()? + 1);
        if from >= end {
            break;
        }
        match finder.find(&bytes[from..end]) {
            // The piece starts at the `{` after `},`.
            Some(at) => cuts.push(from + at + 2),
            None => break,
        }
    }
    cuts.dedup();
    cuts.push(end);
    let open = memchr::memmem::Finder::new(ENTRY_OPEN);
    let counts: Vec<usize> = cuts
        .par_windows(2)
        .map(|w| open.find_iter(&bytes[w[0]..w[1]]).count())
        .collect();
    let total: usize = counts.iter().sum();
    if total as u64 > limits.max_entries {
        return None;
    }
    let placeholder = Entry {
        path: Box::default(),
        kind: EntryKind::Dir,
    };
    let mut entries = vec![placeholder; total];
    let mut slots = Vec::with_capacity(counts.len());
    let mut rest: &mut [Entry] = &mut entries;
    for (i, &n) in counts.iter().enumerate() {
        let (mine, others) = rest.split_at_mut(n);
        slots.push((mine, cuts[i], cuts[i + 1]));
        rest = others;
    }
    let ok = slots.into_par_iter().all(|(slots, from, to)| {
        let mut p = Parser {
            text,
            pos: from,
            version,
        };
        let n = slots.len();
        for (i, slot) in slots.iter_mut().enumerate() {
            let Ok(entry) = p.entry(limits) else {
                return false;
            };
            *slot = entry;
            if i + 1 < n && p.expect(b',').is_err() {
                return false;
            }
        }
        // Between pieces the `,` belongs to the earlier one.
        let sep = usize::from(to != end);
        n > 0 && p.pos + sep == to && (sep == 0 || bytes[p.pos] == b',')
    });
    if !ok {
        return None;
    }
    let mut total_bytes: u64 = 0;
    for e in &entries {
        total_bytes = total_bytes.saturating_add(e.size());
    }
    if total_bytes > limits.max_bytes {
        return None;
    }
    Some(Manifest {
        version,
        harness,
        entries,
    })
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// The version the header named (entries are read by its rules).
    version: Version,
}

/// A key just read, with the offset where it starts.
struct Key<'a> {
    offset: usize,
    name: Cow<'a, str>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser {
            text,
            pos: 0,
            version: Version::CURRENT,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    /// A syntax error at the current position, or a canonical-form error
    /// when the byte there is whitespace (valid JSON, but not canonical).
    fn syntax(&self, reason: impl Into<String>) -> Error {
        if self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            return self.not_canonical(self.pos, "whitespace is not allowed");
        }
        Error::ManifestSyntax {
            offset: self.pos,
            reason: reason.into(),
        }
    }

    /// A raw control character (TAB, LF and CR included) inside a string
    /// at the current position: not JSON at all (RFC 8259 wants them
    /// escaped), not merely whitespace out of place.
    fn raw_control(&self) -> Error {
        Error::ManifestSyntax {
            offset: self.pos,
            reason: "raw control character in a string".into(),
        }
    }

    fn not_canonical(&self, offset: usize, reason: impl Into<String>) -> Error {
        Error::ManifestNotCanonical {
            offset,
            reason: reason.into(),
        }
    }

    /// Consumes `b`, or explains what was found instead.
    fn expect(&mut self, b: u8) -> Result<()> {
        match self.peek() {
            Some(found) if found == b => {
                self.pos += 1;
                Ok(())
            }
            Some(found) if found.is_ascii_whitespace() => {
                Err(self.not_canonical(self.pos, "whitespace is not allowed"))
            }
            Some(found) => Err(self.syntax(format!(
                "expected `{}`, found `{}`",
                b as char,
                found.escape_ascii()
            ))),
            None => Err(self.syntax(format!("expected `{}`, found the end", b as char))),
        }
    }

    fn manifest(mut self, limits: &Limits) -> Result<Manifest> {
        let harness = self.header()?;
        let mut entries = Vec::new();
        let mut total_bytes: u64 = 0;
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                if entries.len() as u64 >= limits.max_entries {
                    return Err(LimitKind::Entries.exceeded(
                        entries.len() as u64 + 1,
                        limits,
                        None,
                    ));
                }
                let entry = self.entry(limits)?;
                total_bytes = total_bytes.saturating_add(entry.size());
                if total_bytes > limits.max_bytes {
                    return Err(LimitKind::Bytes.exceeded(total_bytes, limits, Some(&entry.path)));
                }
                entries.push(entry);
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.syntax("expected `,` or `]` after an entry")),
                }
            }
        }
        if let Some(k) = self.next_key()? {
            return Err(self.unexpected_key(&k, TOP_KEYS, "the end of the manifest"));
        }
        if self.pos != self.text.len() {
            return Err(self.not_canonical(self.pos, "bytes after the closing `}`"));
        }
        Ok(Manifest {
            version: self.version,
            harness,
            entries,
        })
    }

    /// Everything before the first entry: `{`, the schema (its version
    /// kept in `self.version`), the harness kind (returned), and
    /// `"entries":[`.
    fn header(&mut self) -> Result<Option<HarnessKind>> {
        self.expect(b'{')?;
        let key = self.key()?;
        if key.name != "schema" {
            // A future version may order its keys differently: report its
            // schema if it has one, rather than a key-order complaint.
            if let Some(found) = Manifest::sniff_schema(self.bytes()) {
                if Version::from_schema(&found).is_none() {
                    return Err(unsupported(found));
                }
            }
            return Err(self.unexpected_key(&key, TOP_KEYS, "schema"));
        }
        self.no_null(&key)?;
        let schema = self.string()?;
        self.version = match Version::from_schema(&schema) {
            Some(v) => v,
            None => return Err(unsupported(schema.into_owned())),
        };
        let mut key = self.next_key()?;
        let mut harness = None;
        if let Some(k) = key.as_ref().filter(|k| k.name == "harness") {
            self.no_null(k)?;
            let at = self.pos;
            let kind = self.string()?;
            harness = Some(HarnessKind::parse(&kind).ok_or_else(|| Error::ManifestBadValue {
                offset: at,
                field: "harness".into(),
                reason: format!(
                    "unknown harness kind `{kind}`; expected one of codex, claude, opencode, generic"
                ),
            })?);
            key = self.next_key()?;
        }
        let key = self.require(key, TOP_KEYS, "entries")?;
        self.no_null(&key)?;
        self.expect(b'[')?;
        Ok(harness)
    }

    fn entry(&mut self, limits: &Limits) -> Result<Entry> {
        self.expect(b'{')?;
        let key = self.key()?;
        let key = self.require(Some(key), ENTRY_KEYS, "path")?;
        self.no_null(&key)?;
        let entry_path = self.string()?;
        if entry_path.len() as u64 > limits.max_path_bytes {
            return Err(LimitKind::PathBytes.exceeded(
                entry_path.len() as u64,
                limits,
                Some(&entry_path),
            ));
        }
        let key = self.next_key()?;
        let key = self.require(key, ENTRY_KEYS, "type")?;
        self.no_null(&key)?;
        let type_at = self.pos;
        let type_name = self.string()?;
        let kind = match &*type_name {
            "dir" => {
                let key = self.next_key()?;
                self.end_of_entry(key)?;
                EntryKind::Dir
            }
            "file" => self.file_fields(&entry_path)?,
            "symlink" => {
                let key = self.next_key()?;
                let key = self.require(key, ENTRY_KEYS, "target")?;
                self.no_null(&key)?;
                let target = self.string()?;
                if target.len() as u64 > limits.max_path_bytes {
                    return Err(LimitKind::PathBytes.exceeded(
                        target.len() as u64,
                        limits,
                        Some(&entry_path),
                    ));
                }
                let key = self.next_key()?;
                self.end_of_entry(key)?;
                EntryKind::Symlink(target.into())
            }
            other => {
                return Err(Error::ManifestBadValue {
                    offset: type_at,
                    field: "type".into(),
                    reason: format!("`{other}` is not one of dir, file, symlink"),
                });
            }
        };
        Ok(Entry {
            path: entry_path.into(),
            kind,
        })
    }

    fn file_fields(&mut self, entry_path: &str) -> Result<EntryKind> {
        let key = self.next_key()?;
        let key = self.require(key, ENTRY_KEYS, "size")?;
        self.no_null(&key)?;
        let size = self.number("size")?;
        if size > MAX_FILE_SIZE {
            return Err(Error::FormatLimit {
                path: entry_path.to_owned(),
                reason: format!(
                    "file of {size} bytes; a packet file holds at most {MAX_FILE_SIZE}"
                ),
            });
        }
        let key = self.next_key()?;
        let key = self.require(key, ENTRY_KEYS, "mtime_ns")?;
        self.no_null(&key)?;
        let mtime_ns = self.number("mtime_ns")?;
        if mtime_ns > MAX_MTIME_NS {
            return Err(Error::FormatLimit {
                path: entry_path.to_owned(),
                reason: format!("mtime_ns {mtime_ns} is past the largest allowed, {MAX_MTIME_NS}"),
            });
        }
        let mut key = self.next_key()?;
        let mut executable = false;
        if let Some(k) = key.as_ref().filter(|k| k.name == "executable") {
            self.no_null(k)?;
            let at = self.pos;
            if self.bytes()[self.pos..].starts_with(b"true") {
                self.pos += 4;
                executable = true;
            } else if self.bytes()[self.pos..].starts_with(b"false") {
                return Err(self.not_canonical(at, "`executable` is written only when true"));
            } else {
                return Err(Error::ManifestBadValue {
                    offset: at,
                    field: "executable".into(),
                    reason: "expected `true`".into(),
                });
            }
            key = self.next_key()?;
        }
        let mut sha256 = None;
        if self.version.whole_file_hash(size) {
            let k = self.require(key, ENTRY_KEYS, "sha256")?;
            self.no_null(&k)?;
            sha256 = Some(self.hash("sha256")?);
            key = self.next_key()?;
        }
        let want = chunk_count(size);
        let (key, chunks) = if want > 0 {
            let key = self.require(key, ENTRY_KEYS, "chunks")?;
            self.no_null(&key)?;
            let chunks = self.chunk_list(want)?;
            (self.next_key()?, chunks)
        } else {
            (key, Box::default())
        };
        self.end_of_entry(key)?;
        // `/2`: a file with chunks is known by them.
        let sha256 = sha256.unwrap_or_else(|| chunk_list_hash(&chunks));
        Ok(EntryKind::File(FileMeta {
            size,
            mtime_ns,
            executable,
            sha256,
            chunks,
        }))
    }

    fn chunk_list(&mut self, want: u64) -> Result<Box<[Sha256]>> {
        let at = self.pos;
        self.expect(b'[')?;
        // `want` derives from a checked size, so it is at most 2048.
        let mut chunks = Vec::with_capacity(want as usize);
        loop {
            if self.peek() == Some(b']') && chunks.is_empty() {
                break;
            }
            if chunks.len() as u64 == want {
                return Err(Error::ManifestBadValue {
                    offset: at,
                    field: "chunks".into(),
                    reason: format!("more than the {want} chunk hashes the size implies"),
                });
            }
            chunks.push(self.hash("chunks")?);
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => break,
                _ => return Err(self.syntax("expected `,` or `]` in `chunks`")),
            }
        }
        self.pos += 1;
        if chunks.len() as u64 != want {
            return Err(Error::ManifestBadValue {
                offset: at,
                field: "chunks".into(),
                reason: format!("{} chunk hashes, but the size implies {want}", chunks.len()),
            });
        }
        Ok(chunks.into_boxed_slice())
    }

    fn end_of_entry(&mut self, key: Option<Key<'a>>) -> Result<()> {
        match key {
            None => Ok(()),
            Some(k) => Err(self.unexpected_key(&k, ENTRY_KEYS, "the end of the entry")),
        }
    }

    /// Reads a key and its `:`, at the start of an object (after `{`).
    fn key(&mut self) -> Result<Key<'a>> {
        let offset = self.pos;
        if self.peek() != Some(b'"') {
            if self.peek() == Some(b'}') {
                return Err(Error::ManifestMissingField {
                    offset,
                    field: "a field".into(),
                });
            }
            return Err(self.syntax("expected a key"));
        }
        let name = self.string()?;
        self.expect(b':')?;
        Ok(Key { offset, name })
    }

    /// After a value: `,` and the next key, or `}` (then `None`).
    fn next_key(&mut self) -> Result<Option<Key<'a>>> {
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                self.key().map(Some)
            }
            Some(b'}') => {
                self.pos += 1;
                Ok(None)
            }
            Some(b) if b.is_ascii_whitespace() => {
                Err(self.not_canonical(self.pos, "whitespace is not allowed"))
            }
            _ => Err(self.syntax("expected `,` or `}`")),
        }
    }

    /// Demands that `key` is `want`.
    fn require(&self, key: Option<Key<'a>>, known: &[&str], want: &str) -> Result<Key<'a>> {
        match key {
            None => Err(Error::ManifestMissingField {
                offset: self.pos.saturating_sub(1),
                field: want.into(),
            }),
            Some(k) if k.name == want => Ok(k),
            // A known key where `want` belongs, and no `want` later in
            // this object: `want` is missing (not merely out of order).
            Some(k)
                if known.contains(&&*k.name)
                    && !self.bytes()[self.pos..].starts_with(b"null")
                    && key_follows(self.bytes(), self.pos, want) == Some(false) =>
            {
                Err(Error::ManifestMissingField {
                    offset: k.offset,
                    field: want.into(),
                })
            }
            Some(k) => Err(self.unexpected_key(&k, known, &format!("`{want}`"))),
        }
    }

    /// Classifies a key found where another belongs.
    fn unexpected_key(&self, key: &Key<'a>, known: &[&str], expected: &str) -> Error {
        if !known.contains(&&*key.name) {
            return Error::ManifestUnknownField {
                offset: key.offset,
                field: key.name.to_string(),
            };
        }
        if self.bytes()[self.pos..].starts_with(b"null") {
            return Error::ManifestNullField {
                offset: key.offset,
                field: key.name.to_string(),
            };
        }
        self.not_canonical(
            key.offset,
            format!(
                "field `{}` where {expected} belongs (fields appear once, in the documented order, only where they apply)",
                key.name
            ),
        )
    }

    fn no_null(&self, key: &Key<'a>) -> Result<()> {
        if self.bytes()[self.pos..].starts_with(b"null") {
            return Err(Error::ManifestNullField {
                offset: key.offset,
                field: key.name.to_string(),
            });
        }
        Ok(())
    }

    fn number(&mut self, field: &str) -> Result<u64> {
        let start = self.pos;
        let bad = |reason: &str| Error::ManifestBadValue {
            offset: start,
            field: field.into(),
            reason: reason.into(),
        };
        let digits = self.bytes()[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return Err(bad(match self.peek() {
                Some(b'-') => "negative numbers are not allowed",
                _ => "expected a non-negative integer",
            }));
        }
        let text = &self.text[start..start + digits];
        self.pos += digits;
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return Err(bad("expected an integer, without fraction or exponent"));
        }
        if digits > 1 && text.starts_with('0') {
            return Err(self.not_canonical(start, format!("`{field}` has leading zeros")));
        }
        text.parse::<u64>()
            .map_err(|_| bad("too large for a 64-bit unsigned integer"))
    }

    fn hash(&mut self, field: &str) -> Result<Sha256> {
        let start = self.pos;
        let s = self.string()?;
        Sha256::from_canonical_hex(s.as_bytes()).ok_or_else(|| {
            if Sha256::from_canonical_hex(s.to_ascii_lowercase().as_bytes()).is_some() {
                self.not_canonical(start, format!("`{field}` must be lowercase hex"))
            } else {
                Error::ManifestBadValue {
                    offset: start,
                    field: field.into(),
                    reason: "expected 64 lowercase hex digits".into(),
                }
            }
        })
    }

    /// Reads a string, accepting only the canonical escapes.
    fn string(&mut self) -> Result<Cow<'a, str>> {
        self.expect(b'"')?;
        let start = self.pos;
        let bytes = self.bytes();
        let mut i = start;
        while let Some(&b) = bytes.get(i) {
            match b {
                b'"' => {
                    self.pos = i + 1;
                    return Ok(Cow::Borrowed(&self.text[start..i]));
                }
                b'\\' => break,
                0..=0x1f => {
                    self.pos = i;
                    return Err(self.raw_control());
                }
                _ => i += 1,
            }
        }
        // Slow path: escapes present.
        let mut owned = String::from(&self.text[start..i]);
        loop {
            let Some(&b) = bytes.get(i) else {
                self.pos = i;
                return Err(self.syntax("unterminated string"));
            };
            match b {
                b'"' => {
                    self.pos = i + 1;
                    return Ok(Cow::Owned(owned));
                }
                b'\\' => {
                    let esc_at = i;
                    let next = bytes.get(i + 1).copied();
                    let (ch, len) = match next {
                        Some(b'"') => ('"', 2),
                        Some(b'\\') => ('\\', 2),
                        Some(b'b') => ('\u{8}', 2),
                        Some(b'f') => ('\u{c}', 2),
                        Some(b'n') => ('\n', 2),
                        Some(b'r') => ('\r', 2),
                        Some(b't') => ('\t', 2),
                        Some(b'u') => {
                            let hex = bytes.get(i + 2..i + 6).unwrap_or(b"");
                            // Exactly four hex digits: from_str_radix alone
                            // would also take a sign (`\u+00f`, found by
                            // cargo-fuzz), which does not re-encode the same.
                            let value = std::str::from_utf8(hex)
                                .ok()
                                .filter(|h| {
                                    h.len() == 4 && h.bytes().all(|b| b.is_ascii_hexdigit())
                                })
                                .and_then(|h| u32::from_str_radix(h, 16).ok());
                            let Some(value) = value else {
                                self.pos = esc_at;
                                return Err(self.syntax("bad \\u escape"));
                            };
                            let canonical = value < 0x20
                                && !matches!(value, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d)
                                && hex.iter().all(|h| !h.is_ascii_uppercase());
                            if !canonical {
                                return Err(self.not_canonical(
                                    esc_at,
                                    "`\\u` escapes are only for control characters without a short escape, in lowercase hex",
                                ));
                            }
                            // value < 0x20, so always a valid char.
                            (char::from_u32(value).unwrap_or('\0'), 6)
                        }
                        Some(b'/') => {
                            return Err(
                                self.not_canonical(esc_at, "`\\/` is not canonical; write `/`")
                            );
                        }
                        _ => {
                            self.pos = esc_at;
                            return Err(self.syntax("unknown escape"));
                        }
                    };
                    owned.push(ch);
                    i += len;
                }
                0..=0x1f => {
                    self.pos = i;
                    return Err(self.raw_control());
                }
                _ => {
                    // Copy the run up to the next special byte.
                    let run = bytes[i..]
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                        .unwrap_or(bytes.len() - i);
                    owned.push_str(&self.text[i..i + run]);
                    i += run;
                }
            }
        }
    }
}

fn unsupported(found: String) -> Error {
    Error::UnsupportedSchema {
        found,
        supported: SUPPORTED_SCHEMAS,
    }
}

// ---------------------------------------------------------------------------
// Validation

impl Manifest {
    /// Checks everything the format demands of a manifest beyond its encoding:
    /// path rules, order, uniqueness, parents, collisions, file fields,
    /// symlink targets, the harness key, and `limits`. Writers call this
    /// before writing, so they never produce what a reader refuses.
    pub fn validate(&self, limits: &Limits) -> Result<()> {
        self.validate_tree(limits).map(drop)
    }

    /// [`Manifest::validate`], returning what it learns on the way: the
    /// index of each entry's parent directory, [`NO_PARENT`] for the part
    /// roots.
    pub fn validate_tree(&self, limits: &Limits) -> Result<Vec<u32>> {
        use hashbrown::HashTable;
        use rayon::prelude::*;
        use std::hash::BuildHasher;
        let n = self.entries.len();
        if n as u64 > limits.max_entries {
            return Err(LimitKind::Entries.exceeded(n as u64, limits, None));
        }
        // The per-path work (the path rules; the collision key and its hash;
        // the hash of the parent's path) runs on all cores first. The loop
        // below then goes through the entries in order, probing two tables
        // of entry numbers with the hashes, and reports the first error a
        // sequential pass would, computing again (for its message) any
        // check that failed. A table of strings probed in order spent most
        // of a mount's validation waiting for memory.
        let hasher = hashbrown::DefaultHashBuilder::default();
        let hashes = |p: &str| {
            [
                hasher.hash_one(&*collision_key(p)),
                path::parent(p).map_or(0, |d| hasher.hash_one(d)),
            ]
        };
        let pre: Vec<[u64; 2]> = self
            .entries
            .par_iter()
            .map(|e| match check_path(&e.path, limits) {
                Ok(()) => hashes(&e.path),
                Err(_) => [FAILED; 2],
            })
            .collect();
        // Directories by path, and every entry by collision key.
        let mut dirs: HashTable<u32> = HashTable::new();
        let mut keys: HashTable<u32> = HashTable::with_capacity(n);
        let mut parents = Vec::with_capacity(n);
        let path_of = |i: u32| &*self.entries[i as usize].path;
        let mut total: u64 = 0;
        for (at, e) in self.entries.iter().enumerate() {
            let p: &str = &e.path;
            let [key_hash, parent_hash] = match pre[at] {
                [FAILED, FAILED] => {
                    check_path(p, limits)?;
                    // A real pair of hashes equal to the marker.
                    hashes(p)
                }
                pair => pair,
            };
            if let Some(prev) = at.checked_sub(1).map(|i| &*self.entries[i].path) {
                match prev.as_bytes().cmp(p.as_bytes()) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => {
                        return Err(Error::DuplicatePath { path: p.into() });
                    }
                    std::cmp::Ordering::Greater => {
                        return Err(Error::NotSorted {
                            path: p.into(),
                            previous: prev.into(),
                        });
                    }
                }
            }
            match path::parent(p) {
                None if !e.is_dir() => {
                    return Err(Error::BadParent {
                        path: p.into(),
                        reason: "a part's root must be a directory".into(),
                    });
                }
                None => parents.push(NO_PARENT),
                Some(parent) => match dirs.find(parent_hash, |&d| path_of(d) == parent) {
                    Some(&d) => parents.push(d),
                    None => {
                        // Entries so far are sorted: the parent, if any, is
                        // found by bisection.
                        let earlier = &self.entries[..at];
                        let reason = match earlier
                            .binary_search_by(|x| x.path.as_bytes().cmp(parent.as_bytes()))
                        {
                            Ok(_) => format!("its parent `{parent}` is not a directory"),
                            Err(_) => format!("its parent directory `{parent}` has no entry"),
                        };
                        return Err(Error::BadParent {
                            path: p.into(),
                            reason,
                        });
                    }
                },
            }
            if e.is_dir() {
                dirs.insert_unique(hasher.hash_one(p), at as u32, |&d| {
                    hasher.hash_one(path_of(d))
                });
            }
            // Keys are computed again only when their hashes meet.
            let same_key = |&j: &u32| {
                pre[j as usize][0] == key_hash && collision_key(path_of(j)) == collision_key(p)
            };
            if let Some(&other) = keys.find(key_hash, same_key) {
                return Err(Error::PathCollision {
                    path: p.into(),
                    other: path_of(other).into(),
                });
            }
            keys.insert_unique(key_hash, at as u32, |&j| pre[j as usize][0]);
            match &e.kind {
                EntryKind::Dir => {}
                EntryKind::File(f) => {
                    if f.size > MAX_FILE_SIZE {
                        return Err(Error::FormatLimit {
                            path: p.into(),
                            reason: format!(
                                "file of {} bytes; a packet file holds at most {MAX_FILE_SIZE}",
                                f.size
                            ),
                        });
                    }
                    if f.mtime_ns > MAX_MTIME_NS {
                        return Err(Error::FormatLimit {
                            path: p.into(),
                            reason: format!("mtime_ns {} is out of range", f.mtime_ns),
                        });
                    }
                    if f.chunks.len() as u64 != chunk_count(f.size) {
                        return Err(Error::ManifestBadValue {
                            offset: 0,
                            field: "chunks".into(),
                            reason: format!("{p}: chunk count does not match the size"),
                        });
                    }
                    total = total.saturating_add(f.size);
                    if total > limits.max_bytes {
                        return Err(LimitKind::Bytes.exceeded(total, limits, Some(p)));
                    }
                }
                EntryKind::Symlink(target) => check_target(p, target, limits)?,
            }
        }
        let root = |name: &str| {
            dirs.find(hasher.hash_one(name), |&d| path_of(d) == name)
                .is_some()
        };
        if !root(PART_WORKSPACE) {
            return Err(Error::BadParent {
                path: PART_WORKSPACE.into(),
                reason: "the packet has no `workspace` directory entry".into(),
            });
        }
        match (root(PART_HARNESS), self.harness) {
            (true, None) => Err(Error::HarnessMismatch {
                reason: "the packet has a harness part but the manifest names no harness kind"
                    .into(),
            }),
            (false, Some(k)) => Err(Error::HarnessMismatch {
                reason: format!(
                    "the manifest names harness kind `{k}` but the packet has no harness part"
                ),
            }),
            _ => Ok(parents),
        }
    }
}

/// Checks a symlink target: non-empty, within the path limit, no NUL.
pub fn check_target(path: &str, target: &str, limits: &Limits) -> Result<()> {
    let invalid = |reason: &str| Error::InvalidTarget {
        path: path.into(),
        reason: reason.into(),
    };
    if target.is_empty() {
        return Err(invalid("empty target"));
    }
    if target.as_bytes().contains(&0) {
        return Err(invalid("NUL byte in target"));
    }
    if target.len() > MAX_TARGET_BYTES {
        return Err(Error::FormatLimit {
            path: path.into(),
            reason: format!(
                "symlink target of {} bytes; a symlink holds at most {MAX_TARGET_BYTES} \
                 (symlink(2) refuses longer targets)",
                target.len()
            ),
        });
    }
    if target.len() as u64 > limits.max_path_bytes {
        return Err(LimitKind::PathBytes.exceeded(target.len() as u64, limits, Some(path)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File(FileMeta {
                size,
                mtime_ns: 1_700_000_000_123_456_789,
                executable: false,
                // A file with chunks gets the id `/2` derives, which `/1`
                // takes as any other whole-file hash: valid in both.
                sha256: if chunk_count(size) > 0 {
                    chunk_list_hash(&vec![Sha256([9; 32]); chunk_count(size) as usize])
                } else {
                    Sha256([7; 32])
                },
                chunks: vec![Sha256([9; 32]); chunk_count(size) as usize].into(),
            }),
        }
    }

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::Dir,
        }
    }

    fn sample() -> Manifest {
        let mut exe = file("workspace/run.sh", 10);
        if let EntryKind::File(f) = &mut exe.kind {
            f.executable = true;
        }
        Manifest {
            version: Default::default(),
            harness: Some(HarnessKind::Codex),
            entries: vec![
                dir("harness"),
                file("harness/history.jsonl", 3),
                dir("workspace"),
                file("workspace/big", 9 * 1024 * 1024),
                exe,
                Entry {
                    path: "workspace/z".into(),
                    kind: EntryKind::Symlink("run.sh\n\u{1}\"\\".into()),
                },
            ],
        }
    }

    #[test]
    fn encode_parse_round_trip() {
        for version in Version::ALL {
            let m = Manifest {
                version,
                ..sample()
            };
            let bytes = m.encode();
            let text = std::str::from_utf8(&bytes).unwrap();
            let schema = version.schema();
            assert!(text.starts_with(&format!(r#"{{"schema":"{schema}","harness":"codex","entries":[{{"path":"harness","type":"dir"}}"#)));
            assert!(text.contains(r#""target":"run.sh\n\u0001\"\\""#), "{text}");
            assert!(text.contains(r#""executable":true"#));
            // The file with chunks: its whole-file hash in `/1` only.
            let big = r#"{"path":"workspace/big","type":"file","size":9437184,"mtime_ns":1700000000123456789,"#;
            let at = text.find(big).unwrap() + big.len();
            assert_eq!(
                text[at..].starts_with(r#""sha256":"#),
                version == Version::V1,
                "{text}"
            );
            let parsed = Manifest::parse(&bytes, &Limits::DEFAULT).unwrap();
            assert_eq!(parsed, m);
            assert_eq!(parsed.encode(), bytes);
        }
    }

    #[test]
    fn a_file_with_chunks_is_known_by_them_in_2_only() {
        let v2 = String::from_utf8(sample().encode()).unwrap();
        let chunk = format!("\"{}\"", "09".repeat(32));
        let chunks = format!("\"chunks\":[{chunk},{chunk},{chunk}]");
        let id = format!("\"sha256\":\"{}\",", chunk_list_hash(&[Sha256([9; 32]); 3]));
        // `/2` with a whole-file hash beside the chunks: not where it
        // applies.
        let with_hash = v2.replacen(&chunks, &format!("{id}{chunks}"), 1);
        let err = Manifest::parse(with_hash.as_bytes(), &Limits::DEFAULT).unwrap_err();
        assert_eq!(err.kind(), "manifest_not_canonical", "{err}");
        // `/1` without one: missing.
        let v1 = String::from_utf8(
            Manifest {
                version: Version::V1,
                ..sample()
            }
            .encode(),
        )
        .unwrap();
        let without = v1.replacen(&id, "", 1);
        let err = Manifest::parse(without.as_bytes(), &Limits::DEFAULT).unwrap_err();
        assert_eq!(err.kind(), "manifest_missing_field", "{err}");
    }

    #[test]
    fn encoded_len_is_the_length_encode_gives_once_hashed() {
        let mut odd = sample();
        odd.harness = None;
        let controls: String = (0u8..0x20).map(char::from).collect();
        odd.entries.push(Entry {
            path: "workspace/zz".into(),
            kind: EntryKind::Symlink(format!("{controls}\"\\é\u{7f}").into()),
        });
        use crate::packet::format::CHUNK_SIZE;
        for (k, size) in [0, 1, 9, 10, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE]
            .into_iter()
            .enumerate()
        {
            let mut f = file(&format!("workspace/zzz{k}"), size);
            if let EntryKind::File(m) = &mut f.kind {
                m.mtime_ns = [0, 9, 10, u64::MAX][k % 4];
            }
            odd.entries.push(f);
        }
        for m in [sample(), many(), odd] {
            assert_eq!(m.encoded_len(), m.encode().len() as u64);
            // Before hashing (no chunk hashes yet), the length to come.
            let mut unhashed = m.clone();
            for e in &mut unhashed.entries {
                if let EntryKind::File(f) = &mut e.kind {
                    f.chunks = Vec::new().into();
                }
            }
            assert_eq!(unhashed.encoded_len(), m.encoded_len());
        }
        // Over the readers' bound: a limit error, as a reader gives.
        let mut long = many();
        let target = "\u{1}".repeat(4000);
        for e in long
            .entries
            .iter_mut()
            .filter(|e| e.file().is_some())
            .take(600)
        {
            e.kind = EntryKind::Symlink(target.as_str().into());
        }
        let limits = Limits {
            max_entries: 1100,
            ..Limits::DEFAULT
        };
        long.validate(&limits).unwrap();
        let err = long.check_encoded_len(&limits).unwrap_err();
        assert_eq!(err.kind(), "limit_exceeded");
        assert!(err.path().is_some_and(|p| {
            long.entries
                .iter()
                .any(|e| &*e.path == p && matches!(e.kind, EntryKind::Symlink(_)))
        }));
        // Valid in every other way: only the readers' bound refuses it.
        let bytes = long.encode();
        assert!(bytes.len() as u64 > limits.max_manifest_bytes());
        Manifest::parse(&bytes, &limits).unwrap();
        many().check_encoded_len(&limits).unwrap();
    }

    /// A manifest big enough to be parsed in all its pieces, with paths
    /// that hold what an entry separator looks like, escaped.
    fn many() -> Manifest {
        let mut entries = vec![dir("workspace")];
        for d in 0..40 {
            entries.push(dir(&format!("workspace/d{d:02}")));
            for f in 0..25 {
                let name = match f % 5 {
                    0 => format!("workspace/d{d:02}/f{f:02}}},{{\"path\":\"x"),
                    1 => format!("workspace/d{d:02}/f{f:02}é"),
                    _ => format!("workspace/d{d:02}/f{f:02}"),
                };
                let size = if f == 3 { 5 << 20 } else { f * 1000 };
                entries.push(file(&name, size));
            }
        }
        entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        Manifest {
            version: Default::default(),
            harness: None,
            entries,
        }
    }

    /// What the sequential parser alone makes of `bytes`.
    fn sequential(bytes: &[u8], limits: &Limits) -> Result<Manifest> {
        let text = utf8(bytes)?;
        let m = Parser::new(text).manifest(limits)?;
        m.validate(limits)?;
        Ok(m)
    }

    #[test]
    fn pieces_parse_to_what_the_sequential_parser_gives() {
        let m = many();
        let bytes = m.encode();
        let text = std::str::from_utf8(&bytes).unwrap();
        let pieces = parse_in_pieces(text, &Limits::DEFAULT).expect("parsed in pieces");
        assert_eq!(pieces, m);
        assert_eq!(Manifest::parse(&bytes, &Limits::DEFAULT).unwrap(), m);
        // Limits the totals break send the parse back to the sequential
        // parser, which names the first entry over the limit.
        let small = Limits {
            max_entries: 500,
            max_bytes: 1 << 30,
            ..Limits::DEFAULT
        };
        assert!(parse_in_pieces(text, &small).is_none());
        let err = |b: &[u8], l: &Limits| Manifest::parse(b, l).unwrap_err().to_string();
        assert_eq!(
            err(&bytes, &small),
            sequential(&bytes, &small).unwrap_err().to_string()
        );
    }

    #[test]
    fn a_damaged_manifest_gets_the_sequential_parsers_first_error() {
        let bytes = many().encode();
        // Every byte position in a sample spread over all pieces, each
        // changed to bytes that break syntax, order, keys and values.
        for at in (0..bytes.len()).step_by(bytes.len() / 100) {
            for with in [b'}', b'"', b',', b'0', b'a', b'/', b'\\', b' '] {
                let mut b = bytes.clone();
                b[at] = with;
                let ours = Manifest::parse(&b, &Limits::DEFAULT);
                let theirs = sequential(&b, &Limits::DEFAULT);
                match (&ours, &theirs) {
                    (Ok(x), Ok(y)) => assert_eq!(x, y, "byte {at} -> {with}"),
                    (Err(x), Err(y)) => {
                        assert_eq!(x.to_string(), y.to_string(), "byte {at} -> {with}")
                    }
                    _ => panic!("byte {at} -> {with}: {ours:?} vs {theirs:?}"),
                }
            }
        }
    }

    /// Applies `edit` to the canonical encoding and expects `kind`.
    fn refused(edit: impl Fn(String) -> String, kind: &str) {
        let text = String::from_utf8(sample().encode()).unwrap();
        let edited = edit(text.clone());
        assert_ne!(edited, text, "edit for {kind} changed nothing");
        let err = Manifest::parse(edited.as_bytes(), &Limits::DEFAULT)
            .expect_err(&format!("{kind}: {edited}"));
        assert_eq!(err.kind(), kind, "{err}");
    }

    type Edit = Box<dyn Fn(String) -> String>;

    #[test]
    fn refusals_table() {
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|t| t.replacen("{\"schema\"", "{ \"schema\"", 1)),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen(",\"harness\"", ", \"harness\"", 1)),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen("packet/2", "packet/3", 1)),
                "unsupported_schema",
            ),
            // Raw control characters inside a string are not JSON, whether
            // or not they are whitespace.
            (
                Box::new(|t| t.replacen("\"workspace\"", "\"work\tspace\"", 1)),
                "manifest_syntax",
            ),
            (
                Box::new(|t| t.replacen("\"workspace\"", "\"work\nspace\"", 1)),
                "manifest_syntax",
            ),
            (
                Box::new(|t| t.replacen("\"workspace\"", "\"work\u{1}space\"", 1)),
                "manifest_syntax",
            ),
            (
                Box::new(|t| {
                    t.replacen(
                        "{\"schema\":\"sessionfs.packet/2\",",
                        "{\"entries\":[],\"schema\":\"sessionfs.packet/9\",",
                        1,
                    )
                }),
                "unsupported_schema",
            ),
            (
                Box::new(|t| t.replacen("\"type\":\"dir\"}", "\"type\":\"dir\",\"owner\":1}", 1)),
                "manifest_unknown_field",
            ),
            (
                Box::new(|t| t.replacen("\"harness\":\"codex\"", "\"harness\":null", 1)),
                "manifest_null_field",
            ),
            (
                Box::new(|t| {
                    t.replacen("\"type\":\"dir\"}", "\"type\":\"dir\",\"target\":null}", 1)
                }),
                "manifest_null_field",
            ),
            // A key where another belongs: missing when the other does
            // not follow, out of order when it does.
            (
                Box::new(|t| t.replacen(",\"size\":3", "", 1)),
                "manifest_missing_field",
            ),
            (
                Box::new(|t| t.replacen(",\"mtime_ns\":1700000000123456789", "", 1)),
                "manifest_missing_field",
            ),
            (
                Box::new(|t| {
                    t.replacen(
                        "\"size\":3,\"mtime_ns\":1700000000123456789",
                        "\"mtime_ns\":1700000000123456789,\"size\":3",
                        1,
                    )
                }),
                "manifest_not_canonical",
            ),
            // The lookahead gives up on surprises: the error stays.
            (
                Box::new(|t| {
                    t.replacen(
                        "\"size\":3,\"mtime_ns\":1700000000123456789",
                        "\"mtime_ns\": 1700000000123456789,\"size\":3",
                        1,
                    )
                }),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| {
                    t.replacen(
                        "\"size\":3,\"mtime_ns\":1700000000123456789",
                        "\"mtime_ns\":1700000000123456789,\"\\u0073ize\":3",
                        1,
                    )
                }),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| {
                    let hash = format!("\"sha256\":\"{}\"", "07".repeat(32));
                    t.replacen(
                        &format!("\"mtime_ns\":1700000000123456789,{hash}"),
                        &format!("{hash},\"mtime_ns\":1700000000123456789"),
                        1,
                    )
                }),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen("\"type\":\"dir\"", "\"type\":\"fifo\"", 1)),
                "manifest_bad_value",
            ),
            (
                Box::new(|t| t.replacen("\"size\":3", "\"size\":03", 1)),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen("\"size\":3", "\"size\":-3", 1)),
                "manifest_bad_value",
            ),
            (
                Box::new(|t| t.replacen("\"size\":3", "\"size\":3.0", 1)),
                "manifest_bad_value",
            ),
            (
                Box::new(|t| t.replacen("\"size\":3", "\"size\":\"3\"", 1)),
                "manifest_bad_value",
            ),
            (
                Box::new(|t| t.replacen("\"executable\":true", "\"executable\":false", 1)),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen("0707070707", "0707070G07", 1)),
                "manifest_bad_value",
            ),
            (
                Box::new(|t| t.replacen("0707070707", "07070707A7", 1)),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen("run.sh\\n", "run.sh\\u000a", 1)),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| {
                    t.replacen("\"path\":\"workspace\"", "\"path\":\"workspac\\u0065\"", 1)
                }),
                "manifest_not_canonical",
            ),
            (
                Box::new(|t| t.replacen("\"path\":\"harness\"", "\"path\":\"harness\\/\"", 1)),
                "manifest_not_canonical",
            ),
            (Box::new(|t| format!("{t} ")), "manifest_not_canonical"),
            (
                Box::new(|t| t[..t.len() - 3].to_string()),
                "manifest_syntax",
            ),
            (
                Box::new(|t| t.replacen("harness/history.jsonl", "harness/../history.jsonl", 1)),
                "invalid_path",
            ),
            (
                Box::new(|t| t.replacen("harness/history.jsonl", "/harness/history.jsonl", 1)),
                "invalid_path",
            ),
            (
                Box::new(|t| t.replacen("harness/history.jsonl", "harness/a\\\\b", 1)),
                "invalid_path",
            ),
            (
                Box::new(|t| t.replacen("harness/history.jsonl", "harness/a\\tb", 1)),
                "invalid_path",
            ),
            (
                Box::new(|t| t.replacen("harness/history.jsonl", "etc/passwd", 1)),
                "invalid_path",
            ),
            (
                Box::new(|t| t.replacen("workspace/run.sh", "workspace/a", 1)),
                "not_sorted",
            ),
            (
                Box::new(|t| t.replacen("workspace/run.sh", "workspace/z", 1)),
                "duplicate_path",
            ),
            (
                Box::new(|t| {
                    t.replacen("workspace/run.sh", "workspace/Big", 1).replacen(
                        "\"workspace/big\"",
                        "\"workspace/BIG\"",
                        1,
                    )
                }),
                "path_collision",
            ),
            (
                Box::new(|t| t.replacen("harness/history.jsonl", "harness/x/history.jsonl", 1)),
                "bad_parent",
            ),
            (
                Box::new(|t| t.replacen("\"harness\":\"codex\",", "", 1)),
                "harness_mismatch",
            ),
            (
                Box::new(|t| t.replacen("\"harness\":\"codex\"", "\"harness\":\"vim\"", 1)),
                "manifest_bad_value",
            ),
            (
                Box::new(|t| t.replacen("\"target\":\"run.sh", "\"target\":\"\\u0000run.sh", 1)),
                "invalid_symlink_target",
            ),
        ];
        for (edit, kind) in cases {
            refused(edit, kind);
        }
    }

    #[test]
    fn path_under_a_file_or_symlink_is_refused() {
        for parent_kind in ["file", "symlink"] {
            let mut m = sample();
            let p = if parent_kind == "file" {
                "workspace/run.sh/x"
            } else {
                "workspace/z/x"
            };
            m.entries.push(dir(p));
            m.entries
                .sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
            let err = Manifest::parse(&m.encode(), &Limits::DEFAULT).unwrap_err();
            assert_eq!(err.kind(), "bad_parent", "{parent_kind}: {err}");
        }
    }

    #[test]
    fn limits_are_enforced_while_parsing() {
        let bytes = sample().encode();
        let tight = |l: Limits| Manifest::parse(&bytes, &l).unwrap_err().kind();
        assert_eq!(
            tight(Limits {
                max_entries: 3,
                ..Limits::DEFAULT
            }),
            "limit_exceeded"
        );
        assert_eq!(
            tight(Limits {
                max_bytes: 1024,
                ..Limits::DEFAULT
            }),
            "limit_exceeded"
        );
        assert_eq!(
            tight(Limits {
                max_path_bytes: 12,
                ..Limits::DEFAULT
            }),
            "limit_exceeded"
        );
    }

    #[test]
    fn symlink_targets_longer_than_a_symlink_holds_are_refused_whatever_the_limit() {
        // Linux's symlink(2) refuses a target of PATH_MAX (4096) bytes: a
        // packet holding one could be verified but never restored.
        let wide = Limits {
            max_path_bytes: Limits::CEILING.max_path_bytes,
            ..Limits::DEFAULT
        };
        for (len, ok) in [(4095, true), (4096, false), (16_384, false)] {
            let mut m = Manifest {
                version: Default::default(),
                harness: None,
                entries: vec![
                    Entry {
                        path: "workspace".into(),
                        kind: EntryKind::Dir,
                    },
                    Entry {
                        path: "workspace/l".into(),
                        kind: EntryKind::Symlink("x".repeat(len).into()),
                    },
                ],
            };
            let bytes = m.encode();
            let parsed = Manifest::parse(&bytes, &wide).and_then(|p| {
                m = p;
                m.validate(&wide)
            });
            match parsed {
                Ok(_) => assert!(ok, "{len} bytes accepted"),
                Err(e) => {
                    assert!(!ok, "{len} bytes: {e}");
                    assert_eq!(e.kind(), "format_limit", "{len}: {e}");
                    assert!(e.to_string().starts_with("workspace/l: "), "{e}");
                }
            }
        }
    }

    #[test]
    fn wrong_chunk_counts_are_refused() {
        let text = String::from_utf8(sample().encode()).unwrap();
        let one_chunk = format!("\"{}\"", "09".repeat(32));
        let fewer = text.replacen(&format!("{one_chunk},"), "", 1);
        let err = Manifest::parse(fewer.as_bytes(), &Limits::DEFAULT).unwrap_err();
        assert_eq!(err.kind(), "manifest_bad_value", "{err}");
        let more = text.replacen(&one_chunk, &format!("{one_chunk},{one_chunk}"), 1);
        let err = Manifest::parse(more.as_bytes(), &Limits::DEFAULT).unwrap_err();
        assert_eq!(err.kind(), "manifest_bad_value", "{err}");
    }
}
