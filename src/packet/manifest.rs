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
use std::collections::HashSet;

use hashbrown::HashMap;

use super::digest::Sha256;
use super::error::{Error, LimitKind, Result};
use super::format::{
    HarnessKind, Limits, MAX_FILE_SIZE, MAX_MTIME_NS, PART_HARNESS, PART_WORKSPACE, SCHEMA,
    chunk_count,
};
use super::path::{self, check_path, collision_key};

/// A parsed manifest. Entries are in canonical order (raw path bytes).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Manifest {
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
    /// SHA-256 of the whole content.
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

/// Entries whose path checks [`Manifest::validate`] runs in parallel at once.
const CHECK_BLOCK: usize = 16 * 1024;
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
        write_string(&mut out, SCHEMA);
        if let Some(h) = self.harness {
            out.extend_from_slice(b",\"harness\":");
            write_string(&mut out, h.as_str());
        }
        out.extend_from_slice(b",\"entries\":[");
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            encode_entry(&mut out, e);
        }
        out.extend_from_slice(b"]}");
        out
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

fn encode_entry(out: &mut Vec<u8>, e: &Entry) {
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
            out.extend_from_slice(b",\"sha256\":\"");
            f.sha256.write_hex(out);
            out.push(b'"');
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
        let text = std::str::from_utf8(bytes).map_err(|e| Error::ManifestSyntax {
            offset: e.valid_up_to(),
            reason: "invalid UTF-8".into(),
        })?;
        let manifest = Parser { text, pos: 0 }.manifest(limits)?;
        manifest.validate(limits)?;
        Ok(manifest)
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

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

/// A key just read, with the offset where it starts.
struct Key<'a> {
    offset: usize,
    name: Cow<'a, str>,
}

impl<'a> Parser<'a> {
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
        self.expect(b'{')?;
        let key = self.key()?;
        if key.name != "schema" {
            // A future version may order its keys differently: report its
            // schema if it has one, rather than a key-order complaint.
            if let Some(found) = Manifest::sniff_schema(self.bytes()) {
                if found != SCHEMA {
                    return Err(unsupported(found));
                }
            }
            return Err(self.unexpected_key(&key, TOP_KEYS, "schema"));
        }
        self.no_null(&key)?;
        let schema = self.string()?;
        if schema != SCHEMA {
            return Err(unsupported(schema.into_owned()));
        }
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
        Ok(Manifest { harness, entries })
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
        let key = self.require(key, ENTRY_KEYS, "sha256")?;
        self.no_null(&key)?;
        let sha256 = self.hash("sha256")?;
        let key = self.next_key()?;
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
                    return Err(self.syntax("raw control character in a string"));
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
                    return Err(self.syntax("raw control character in a string"));
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
        supported: SCHEMA,
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
        let n = self.entries.len() as u64;
        if n > limits.max_entries {
            return Err(LimitKind::Entries.exceeded(n, limits, None));
        }
        // Path -> is_dir, for the parent rule.
        let mut kinds: HashMap<&str, bool> = HashMap::with_capacity(self.entries.len());
        let mut keys: HashMap<Cow<'_, str>, &str> = HashMap::with_capacity(self.entries.len());
        let mut total: u64 = 0;
        let mut previous: Option<&str> = None;
        // The per-path checks (the costly part: the path rules, and the
        // normalized key for collisions) run on all cores, a block of
        // entries at a time; the loop below consults them in order, so the
        // first error is the one a sequential pass would report. A failed
        // check is kept as `None` and run again for its error: a whole
        // manifest's worth of results with errors inline cost the mount of
        // S 10 MiB of peak memory.
        let mut checked: Vec<Option<Cow<'_, str>>> = Vec::new();
        for (at, e) in self.entries.iter().enumerate() {
            if at % CHECK_BLOCK == 0 {
                use rayon::prelude::*;
                let end = (at + CHECK_BLOCK).min(self.entries.len());
                self.entries[at..end]
                    .par_iter()
                    .map(|e| {
                        check_path(&e.path, limits)
                            .ok()
                            .map(|()| collision_key(&e.path))
                    })
                    .collect_into_vec(&mut checked);
                checked.reverse();
            }
            let p: &str = &e.path;
            let key = match checked.pop().flatten() {
                Some(key) => key,
                None => {
                    check_path(p, limits)?;
                    collision_key(p)
                }
            };
            if let Some(prev) = previous {
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
            previous = Some(p);
            match path::parent(p) {
                None if !e.is_dir() => {
                    return Err(Error::BadParent {
                        path: p.into(),
                        reason: "a part's root must be a directory".into(),
                    });
                }
                None => {}
                Some(parent) => match kinds.get(parent) {
                    Some(true) => {}
                    Some(false) => {
                        return Err(Error::BadParent {
                            path: p.into(),
                            reason: format!("its parent `{parent}` is not a directory"),
                        });
                    }
                    None => {
                        return Err(Error::BadParent {
                            path: p.into(),
                            reason: format!("its parent directory `{parent}` has no entry"),
                        });
                    }
                },
            }
            kinds.insert(p, e.is_dir());
            if let Some(other) = keys.insert(key, p) {
                return Err(Error::PathCollision {
                    path: p.into(),
                    other: other.into(),
                });
            }
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
        if kinds.get(PART_WORKSPACE) != Some(&true) {
            return Err(Error::BadParent {
                path: PART_WORKSPACE.into(),
                reason: "the packet has no `workspace` directory entry".into(),
            });
        }
        let has_harness = kinds.contains_key(PART_HARNESS);
        match (has_harness, self.harness) {
            (true, None) => Err(Error::HarnessMismatch {
                reason: "the packet has a harness part but the manifest names no harness kind"
                    .into(),
            }),
            (false, Some(k)) => Err(Error::HarnessMismatch {
                reason: format!(
                    "the manifest names harness kind `{k}` but the packet has no harness part"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Paths of every directory entry, for callers that need the set.
    pub fn dir_paths(&self) -> HashSet<&str> {
        self.entries
            .iter()
            .filter(|e| e.is_dir())
            .map(|e| &*e.path)
            .collect()
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
                sha256: Sha256([7; 32]),
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
        let m = sample();
        let bytes = m.encode();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with(r#"{"schema":"sessionfs.packet/1","harness":"codex","entries":[{"path":"harness","type":"dir"}"#));
        assert!(text.contains(r#""target":"run.sh\n\u0001\"\\""#), "{text}");
        assert!(text.contains(r#""executable":true"#));
        let parsed = Manifest::parse(&bytes, &Limits::DEFAULT).unwrap();
        assert_eq!(parsed, m);
        assert_eq!(parsed.encode(), bytes);
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
                Box::new(|t| t.replacen("packet/1", "packet/2", 1)),
                "unsupported_schema",
            ),
            (
                Box::new(|t| {
                    t.replacen(
                        "{\"schema\":\"sessionfs.packet/1\",",
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
            (
                Box::new(|t| t.replacen(",\"size\":3", "", 1)),
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
