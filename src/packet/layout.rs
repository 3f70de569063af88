//! The canonical tar layout: the one header encoding of each entry, and the
//! byte offset of every member, computed from the manifest alone.
//!
//! Headers are built with the `tar` crate's `Header` (its octal fields and
//! checksum); what it cannot express is done here: the fixed PAX header name
//! and field values, and the ustar name/prefix split rule the spec defines.

use tar::{EntryType, Header};

use super::error::Error;
use super::format::{
    BLOCK, END_BLOCKS, MANIFEST_NAME, MODE_DIR, MODE_EXEC, MODE_FILE, MODE_SYMLINK,
    PAX_HEADER_NAME, USTAR_LINKNAME_LEN, USTAR_NAME_LEN, USTAR_PREFIX_LEN, pad_to_block,
};
use super::manifest::{Entry, EntryKind, Manifest};

/// Offset of the manifest's bytes (right after its header).
pub const MANIFEST_DATA_OFFSET: u64 = BLOCK;

/// Byte offsets of every member of a packet, derived from its manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Length of `packet.json`.
    pub manifest_len: u64,
    /// `starts[i]`: offset of entry `i`'s first header block (its PAX header
    /// when it has one); the last element is the end-of-archive marker.
    starts: Vec<u64>,
}

impl Layout {
    /// Computes the layout of a packet whose manifest is `manifest_len` bytes.
    /// Sizes come from a validated manifest, so sums cannot overflow (content
    /// is bounded by the 1 TiB ceiling); saturating arithmetic keeps it total.
    pub fn compute(manifest: &Manifest, manifest_len: u64) -> Layout {
        let mut starts = Vec::with_capacity(manifest.entries.len() + 1);
        let mut at = BLOCK.saturating_add(pad_to_block(manifest_len));
        for e in &manifest.entries {
            starts.push(at);
            at = at
                .saturating_add(header_len(e))
                .saturating_add(pad_to_block(e.size()));
        }
        starts.push(at);
        Layout {
            manifest_len,
            starts,
        }
    }

    /// Offset of entry `i`'s first header block.
    pub fn member_start(&self, i: usize) -> u64 {
        self.starts[i]
    }

    /// Offset of entry `i`'s content (meaningful for files).
    pub fn data_offset(&self, i: usize, entry: &Entry) -> u64 {
        self.starts[i] + header_len(entry)
    }

    /// Offset just past entry `i`'s padded content: the next member's start.
    pub fn member_end(&self, i: usize) -> u64 {
        self.starts[i + 1]
    }

    /// Offset of the end-of-archive marker.
    pub fn end_offset(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    /// Length of the whole packet file.
    pub fn total_len(&self) -> u64 {
        self.end_offset() + END_BLOCKS * BLOCK
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Splits the entries into runs of contiguous members of about
    /// `max_bytes` each (a larger member is a run of its own), the unit of
    /// parallel work for writers and checkers.
    pub fn batches(&self, max_bytes: u64) -> Vec<std::ops::Range<usize>> {
        let n = self.len();
        let mut out = Vec::new();
        let mut start = 0;
        while start < n {
            let base = self.starts[start];
            let mut end = start + 1;
            while end < n && self.starts[end + 1] - base <= max_bytes {
                end += 1;
            }
            out.push(start..end);
            start = end;
        }
        out
    }
}

/// Bytes of headers before an entry's content: one block, plus a PAX header
/// block and its padded records when the path or target needs them.
pub fn header_len(e: &Entry) -> u64 {
    match pax_records_len(e) {
        0 => BLOCK,
        n => 2 * BLOCK + pad_to_block(n),
    }
}

/// The canonical header of the manifest member for `len` bytes of JSON.
pub fn manifest_header(len: u64) -> [u8; 512] {
    let mut h = base_header(EntryType::Regular, MODE_FILE, len, 0);
    set_name(&mut h, MANIFEST_NAME.as_bytes(), b"");
    h.set_cksum();
    *h.as_bytes()
}

/// Appends the canonical header blocks of `e` (PAX header, its records,
/// ustar header) to `out`: exactly [`header_len`] bytes.
pub fn write_entry_headers(e: &Entry, out: &mut Vec<u8>) {
    let path = e.path.as_bytes();
    let split = ustar_split(path);
    let long_target = match &e.kind {
        EntryKind::Symlink(t) if t.len() > USTAR_LINKNAME_LEN => Some(t.as_bytes()),
        _ => None,
    };
    if split.is_none() || long_target.is_some() {
        let mut records = Vec::new();
        if split.is_none() {
            push_record(&mut records, "path", path);
        }
        if let Some(t) = long_target {
            push_record(&mut records, "linkpath", t);
        }
        let mut pax = base_header(EntryType::XHeader, MODE_FILE, records.len() as u64, 0);
        set_name(&mut pax, PAX_HEADER_NAME.as_bytes(), b"");
        pax.set_cksum();
        out.extend_from_slice(pax.as_bytes());
        let padded = pad_to_block(records.len() as u64) as usize;
        records.resize(padded, 0);
        out.extend_from_slice(&records);
    }
    let (ty, mode, size, mtime) = match &e.kind {
        EntryKind::Dir => (EntryType::Directory, MODE_DIR, 0, 0),
        EntryKind::File(f) => (
            EntryType::Regular,
            if f.executable { MODE_EXEC } else { MODE_FILE },
            f.size,
            f.mtime_ns / 1_000_000_000,
        ),
        EntryKind::Symlink(_) => (EntryType::Symlink, MODE_SYMLINK, 0, 0),
    };
    let mut h = base_header(ty, mode, size, mtime);
    match split {
        Some((prefix, name)) => set_name(&mut h, name, prefix),
        None => set_name(&mut h, truncate_utf8(path, USTAR_NAME_LEN), b""),
    }
    if let EntryKind::Symlink(t) = &e.kind {
        let t = truncate_utf8(t.as_bytes(), USTAR_LINKNAME_LEN);
        if let Some(u) = h.as_ustar_mut() {
            u.linkname[..t.len()].copy_from_slice(t);
        }
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
}

/// A header with every normalized field set: ownership 0, no user or group
/// names, device numbers 0, ustar magic.
pub fn base_header(ty: EntryType, mode: u32, size: u64, mtime: u64) -> Header {
    let mut h = Header::new_ustar();
    h.set_entry_type(ty);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(size);
    h.set_mtime(mtime);
    // Explicit zeros rather than empty fields: some readers reject empty
    // numeric fields. Cannot fail for a ustar header.
    let _ = h.set_device_major(0);
    let _ = h.set_device_minor(0);
    h
}

pub fn set_name(h: &mut Header, name: &[u8], prefix: &[u8]) {
    if let Some(u) = h.as_ustar_mut() {
        u.name[..name.len()].copy_from_slice(name);
        u.prefix[..prefix.len()].copy_from_slice(prefix);
    }
}

/// The ustar encoding of a path: `(prefix, name)`, or `None` when the path
/// needs a PAX `path` record. A path of at most 100 bytes goes whole into
/// `name`; a longer one is split at the `/` that gives the longest `prefix`
/// of at most 155 bytes, and fits only if the rest is at most 100 bytes.
pub fn ustar_split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.len() <= USTAR_NAME_LEN {
        return Some((b"", path));
    }
    let window = &path[..path.len().min(USTAR_PREFIX_LEN + 1)];
    let slash = window.iter().rposition(|&b| b == b'/')?;
    let (prefix, name) = (&path[..slash], &path[slash + 1..]);
    (!name.is_empty() && name.len() <= USTAR_NAME_LEN).then_some((prefix, name))
}

/// The first `max` bytes of `s`, cut back to a UTF-8 character boundary.
pub fn truncate_utf8(s: &[u8], max: usize) -> &[u8] {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    // Continuation bytes are 0b10xx_xxxx.
    while end > 0 && (s[end] & 0xc0) == 0x80 {
        end -= 1;
    }
    &s[..end]
}

/// Appends one PAX record, `"<len> <key>=<value>\n"`, where `<len>` counts
/// the whole record including its own digits.
pub fn push_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let rest = key.len() + value.len() + 3; // space, '=', newline
    let mut digits = 1;
    while rest + digits >= 10usize.pow(digits as u32) {
        digits += 1;
    }
    let mut num = itoa::Buffer::new();
    out.extend_from_slice(num.format(rest + digits).as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// Length of the PAX records `e` needs (0 when it needs none).
fn pax_records_len(e: &Entry) -> u64 {
    let mut n = 0;
    let record = |key: &str, value_len: usize| {
        let rest = key.len() + value_len + 3;
        let mut digits = 1;
        while rest + digits >= 10usize.pow(digits as u32) {
            digits += 1;
        }
        (rest + digits) as u64
    };
    if ustar_split(e.path.as_bytes()).is_none() {
        n += record("path", e.path.len());
    }
    if let EntryKind::Symlink(t) = &e.kind {
        if t.len() > USTAR_LINKNAME_LEN {
            n += record("linkpath", t.len());
        }
    }
    n
}

// ---------------------------------------------------------------------------
// Diagnosis of headers that differ from the canonical bytes

/// Byte ranges of the ustar header fields, for naming the first difference.
const FIELDS: &[(&str, usize, usize)] = &[
    ("name", 0, 100),
    ("mode", 100, 108),
    ("uid", 108, 116),
    ("gid", 116, 124),
    ("size", 124, 136),
    ("mtime", 136, 148),
    ("chksum", 148, 156),
    ("typeflag", 156, 157),
    ("linkname", 157, 257),
    ("magic", 257, 263),
    ("version", 263, 265),
    ("uname", 265, 297),
    ("gname", 297, 329),
    ("devmajor", 329, 337),
    ("devminor", 337, 345),
    ("prefix", 345, 500),
    ("padding", 500, 512),
];

/// Explains why the header block `actual` at `offset` is not the canonical
/// `expected` block for `member`. Called only when they differ.
pub fn diagnose(actual: &[u8], expected: &[u8], offset: u64, member: &str) -> Error {
    let member = member.to_owned();
    if actual.len() < BLOCK as usize {
        return Error::NotAPacket {
            reason: format!("header at byte {offset} is cut short"),
        };
    }
    if actual.iter().all(|&b| b == 0) {
        return Error::MemberMismatch {
            offset,
            member,
            found: "the end-of-archive marker".into(),
        };
    }
    let h = Header::from_byte_slice(&actual[..BLOCK as usize]);
    let stored = h.cksum().ok();
    let computed: u32 = actual[..BLOCK as usize]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                u32::from(b' ')
            } else {
                u32::from(b)
            }
        })
        .sum();
    if stored != Some(computed) {
        return Error::BadChecksum { offset, member };
    }
    let flag = actual[156];
    let type_name = match flag {
        b'0' | b'\0' => None,
        b'2' | b'5' | b'x' => None,
        b'1' => Some("hard link"),
        b'3' => Some("character device"),
        b'4' => Some("block device"),
        b'6' => Some("FIFO"),
        b'7' => Some("contiguous file"),
        b'g' => Some("global PAX header"),
        b'L' | b'K' => Some("GNU long name"),
        b'S' => Some("GNU sparse file"),
        _ => Some("unknown"),
    };
    if let Some(name) = type_name {
        return Error::UnsupportedMember {
            offset,
            member,
            typeflag: format!("`{}` ({name})", flag.escape_ascii()),
        };
    }
    let want = Header::from_byte_slice(expected);
    // Another path is another member; the same path spelled otherwise (a
    // different prefix/name split, bytes after the name's NUL) is an
    // encoding the format does not allow, named by its field below.
    let names_differ = actual[..100] != expected[..100] || actual[345..500] != expected[345..500];
    if names_differ && h.path_bytes() != want.path_bytes() {
        let found = super::path::shown(&h.path_bytes());
        return Error::MemberMismatch {
            offset,
            member,
            found,
        };
    }
    // A PAX header's size is that of its records: other records, not
    // another member.
    if flag == b'x' && actual[124..136] != expected[124..136] {
        return Error::NonCanonicalHeader {
            offset,
            member,
            field: "pax records",
        };
    }
    // Likewise another size, against the same size written otherwise
    // (base-256, other padding).
    if actual[124..136] != expected[124..136] {
        let manifest_size = want.entry_size().unwrap_or(0);
        if let Some(header_size) = h.entry_size().ok().filter(|&n| n != manifest_size) {
            return Error::SizeMismatch {
                member,
                manifest_size,
                header_size,
            };
        }
    }
    // The checksum differs whenever another field does (it sums them): it
    // is named only when nothing else is.
    let differs = |(_, a, b): &&(&str, usize, usize)| actual[*a..*b] != expected[*a..*b];
    let field = FIELDS
        .iter()
        .filter(|f| f.0 != "chksum")
        .find(differs)
        .or_else(|| FIELDS.iter().find(differs))
        .map_or("header", |f| f.0);
    Error::NonCanonicalHeader {
        offset,
        member,
        field,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::digest::Sha256;
    use crate::packet::manifest::FileMeta;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            kind,
        }
    }

    #[test]
    fn split_rule_table() {
        let a100 = "a".repeat(100);
        let long_name = format!("workspace/{}", "n".repeat(101));
        let p1 = format!("workspace/{}/{}", "d".repeat(140), "f".repeat(90));
        let (pre, name) = ustar_split(p1.as_bytes()).unwrap();
        assert_eq!(pre.len(), 150);
        assert_eq!(name.len(), 90);
        assert_eq!(
            ustar_split(a100.as_bytes()),
            Some((&b""[..], a100.as_bytes()))
        );
        assert_eq!(
            ustar_split(long_name.as_bytes()),
            None,
            "a 101-byte name needs PAX"
        );
        // The longest prefix that fits wins.
        let p2 = format!("{}/{}/{}", "a".repeat(60), "b".repeat(60), "c".repeat(60));
        let (pre, name) = ustar_split(p2.as_bytes()).unwrap();
        assert_eq!(pre.len(), 121);
        assert_eq!(name.len(), 60);
        // A prefix longer than 155 with no earlier slash cannot split.
        let p3 = format!("{}/{}", "a".repeat(200), "b".repeat(10));
        assert_eq!(ustar_split(p3.as_bytes()), None);
    }

    #[test]
    fn pax_record_lengths_count_themselves() {
        for len in [1usize, 90, 91, 92, 993, 994, 995, 996, 9990, 9991, 9992] {
            let value = vec![b'x'; len];
            let mut out = Vec::new();
            push_record(&mut out, "path", &value);
            let text = String::from_utf8(out.clone()).unwrap();
            let n: usize = text.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(n, out.len(), "value length {len}");
            let e = entry(
                &format!("workspace/{}", "x".repeat(len.min(200))),
                EntryKind::Dir,
            );
            let _ = header_len(&e);
        }
    }

    #[test]
    fn header_lengths_match_written_bytes() {
        let long = format!("workspace/{}", "é".repeat(200));
        let cases = [
            entry("workspace", EntryKind::Dir),
            entry(&long, EntryKind::Dir),
            entry("workspace/l", EntryKind::Symlink("t".repeat(101).into())),
            entry(&long, EntryKind::Symlink("t".repeat(3000).into())),
            entry(
                "workspace/f",
                EntryKind::File(FileMeta {
                    size: 5,
                    mtime_ns: 1_500_000_000_999_999_999,
                    executable: true,
                    sha256: Sha256::default(),
                    chunks: Box::default(),
                }),
            ),
        ];
        for e in cases {
            let mut out = Vec::new();
            write_entry_headers(&e, &mut out);
            assert_eq!(out.len() as u64, header_len(&e), "{}", e.path);
            assert_eq!(out.len() % 512, 0);
            // The tar crate reads back the same path, type and link target.
            let mut archive_bytes = out.clone();
            if let EntryKind::File(f) = &e.kind {
                archive_bytes.extend(std::iter::repeat_n(b'z', f.size as usize));
                archive_bytes.resize(archive_bytes.len().next_multiple_of(512), 0);
            }
            archive_bytes.extend([0u8; 1024]);
            let mut archive = tar::Archive::new(&archive_bytes[..]);
            let got = archive.entries().unwrap().next().unwrap().unwrap();
            assert_eq!(&*got.path_bytes(), e.path.as_bytes());
            if let EntryKind::Symlink(t) = &e.kind {
                assert_eq!(&*got.link_name_bytes().unwrap(), t.as_bytes());
            }
            if let EntryKind::File(f) = &e.kind {
                assert_eq!(got.header().mtime().unwrap(), f.mtime_ns / 1_000_000_000);
                assert_eq!(got.header().mode().unwrap(), 0o755);
            }
        }
    }

    #[test]
    fn diagnosis_names_the_problem() {
        let e = entry("workspace/x", EntryKind::Dir);
        let mut good = Vec::new();
        write_entry_headers(&e, &mut good);
        let check = |edit: &dyn Fn(&mut Vec<u8>), kind: &str| {
            let mut bad = good.clone();
            edit(&mut bad);
            // Re-seal the checksum unless the test is about the checksum.
            if kind != "bad_header_checksum" {
                Header::from_byte_slice(&bad[..512]);
                let mut h = Header::new_old();
                h.as_mut_bytes().copy_from_slice(&bad[..512]);
                h.set_cksum();
                bad[..512].copy_from_slice(h.as_bytes());
            }
            assert_eq!(diagnose(&bad, &good, 0, "workspace/x").kind(), kind);
        };
        check(&|b| b[0] = b'W', "bad_header_checksum");
        check(&|b| b[156] = b'6', "unsupported_member_type");
        check(&|b| b[156] = b'1', "unsupported_member_type");
        check(&|b| b[10] = b'y', "member_mismatch");
        check(
            &|b| b[108..116].copy_from_slice(b"0000001\0"),
            "non_canonical_header",
        );
        check(
            &|b| b[124..136].copy_from_slice(b"00000000001\0"),
            "size_mismatch",
        );
    }
}
