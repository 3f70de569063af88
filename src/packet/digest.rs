//! SHA-256 values: content hashes, chunk hashes and the packet digest.

use std::fmt;

use sha2::Digest as _;

use super::format::{CHUNK_SIZE, Version};

/// A SHA-256 value. Shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// Hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Sha256 {
        Sha256(sha2::Sha256::digest(bytes).into())
    }

    /// Lowercase hex, as written in manifests.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Writes the lowercase hex into `out` (64 bytes), without allocating.
    pub fn write_hex(&self, out: &mut Vec<u8>) {
        let mut buf = [0u8; 64];
        // Cannot fail: the buffer is exactly twice the input.
        if hex::encode_to_slice(self.0, &mut buf).is_ok() {
            out.extend_from_slice(&buf);
        }
    }

    /// Parses exactly 64 lowercase hex digits (the canonical spelling).
    /// Table-driven: a mount parses one of these per file.
    pub fn from_canonical_hex(s: &[u8]) -> Option<Sha256> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
            let (hi, lo) = (HEX_VALUE[pair[0] as usize], HEX_VALUE[pair[1] as usize]);
            if (hi | lo) & 0xf0 != 0 {
                return None;
            }
            *o = (hi << 4) | lo;
        }
        Some(Sha256(out))
    }
}

/// Value of each lowercase hex digit; 0xff for every other byte.
const HEX_VALUE: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A packet digest: `sha256:<hex>` of the exact bytes of `packet.json`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub Sha256);

/// The prefix of every digest string.
pub const DIGEST_PREFIX: &str = "sha256:";

impl Digest {
    /// Digest of manifest bytes.
    pub fn of_manifest(bytes: &[u8]) -> Digest {
        Digest(Sha256::of(bytes))
    }

    /// Parses `sha256:` followed by 64 hex digits. Hex case is accepted either
    /// way on input (users paste digests); output is always lowercase.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix(DIGEST_PREFIX)?;
        let lower = hex.to_ascii_lowercase();
        Sha256::from_canonical_hex(lower.as_bytes()).map(Digest)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{DIGEST_PREFIX}{}", self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Digest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Digest::parse(s).ok_or_else(|| {
            format!("`{s}` is not a packet digest: expected `sha256:` and 64 hex digits")
        })
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// FORMAT (`/2`): the value that identifies the content of a file with
/// chunks: SHA-256 of its chunk hashes, each as its 32 raw bytes, in order
/// (as S3's composite checksums are a hash of the parts' hashes). A writer
/// that keeps a file's unchanged chunks computes it from the chunk list
/// alone, without reading them; it is what receipts report as such a
/// file's `sha256`, and what its ctime stamp is made of on a mount.
pub fn chunk_list_hash(chunks: &[Sha256]) -> Sha256 {
    let mut h = sha2::Sha256::new();
    for c in chunks {
        h.update(c.0);
    }
    Sha256(h.finalize().into())
}

/// Hashes a file's content as it streams by: the per-chunk hashes a
/// manifest carries for files over one chunk, and the whole-file hash where
/// the version carries one ([`Version::whole_file_hash`]).
pub struct ContentHasher {
    /// The whole-file hash, when the version carries one for this size.
    whole: Option<sha2::Sha256>,
    chunk: sha2::Sha256,
    /// Bytes fed into `chunk` so far.
    chunk_fill: u64,
    /// Whether the file is large enough to carry chunk hashes.
    chunked: bool,
    chunks: Vec<Sha256>,
    total: u64,
}

impl ContentHasher {
    /// A hasher for a file of `size` bytes in a manifest of `version` (the
    /// size decides whether chunk hashes are kept, and with the version,
    /// whether the whole content is hashed; the hasher does not check it).
    pub fn new(size: u64, version: Version) -> ContentHasher {
        let chunked = size > CHUNK_SIZE;
        ContentHasher {
            whole: version.whole_file_hash(size).then(sha2::Sha256::new),
            chunk: sha2::Sha256::new(),
            chunk_fill: 0,
            chunked,
            chunks: Vec::new(),
            total: 0,
        }
    }

    /// Feeds the next bytes of the file.
    pub fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if let Some(whole) = &mut self.whole {
            whole.update(data);
        }
        if !self.chunked {
            return;
        }
        while !data.is_empty() {
            let room = (CHUNK_SIZE - self.chunk_fill) as usize;
            let take = room.min(data.len());
            let (head, tail) = data.split_at(take);
            self.chunk.update(head);
            self.chunk_fill += take as u64;
            data = tail;
            if self.chunk_fill == CHUNK_SIZE {
                self.chunks.push(Sha256(self.chunk.finalize_reset().into()));
                self.chunk_fill = 0;
            }
        }
    }

    /// The manifest's `sha256` for the file (the whole-file hash, or in
    /// `/2` the [`chunk_list_hash`] of a file with chunks) and the chunk
    /// hashes (empty for small files).
    pub fn finish(mut self) -> (Sha256, Vec<Sha256>) {
        if self.chunked && self.chunk_fill > 0 {
            self.chunks.push(Sha256(self.chunk.finalize_reset().into()));
        }
        let id = match self.whole {
            Some(whole) => Sha256(whole.finalize().into()),
            None => chunk_list_hash(&self.chunks),
        };
        (id, self.chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_round_trip_and_rejects() {
        let d = Digest::of_manifest(b"{}");
        let s = d.to_string();
        assert!(s.starts_with("sha256:"));
        assert_eq!(Digest::parse(&s), Some(d));
        assert_eq!(
            Digest::parse(&s.to_uppercase().replace("SHA256:", "sha256:")),
            Some(d)
        );
        for bad in [
            "",
            "sha256:",
            "sha256:00",
            "md5:00",
            &s[7..],
            &format!("{s}0"),
        ] {
            assert_eq!(Digest::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn chunked_hasher_matches_direct_hashes() {
        let size = CHUNK_SIZE * 2 + 17;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        // Feed in odd-sized pieces to cross chunk boundaries mid-piece.
        let expect: Vec<Sha256> = data.chunks(CHUNK_SIZE as usize).map(Sha256::of).collect();
        for (version, id) in [
            (Version::V1, Sha256::of(&data)),
            (Version::V2, chunk_list_hash(&expect)),
        ] {
            let mut h = ContentHasher::new(size, version);
            for piece in data.chunks(1_000_003) {
                h.update(piece);
            }
            let (got, chunks) = h.finish();
            assert_eq!(got, id, "{version:?}");
            assert_eq!(chunks, expect);
        }
    }

    #[test]
    fn small_files_have_no_chunks() {
        let data = vec![1u8; CHUNK_SIZE as usize];
        for version in Version::ALL {
            let mut h = ContentHasher::new(CHUNK_SIZE, version);
            h.update(&data);
            let (whole, chunks) = h.finish();
            assert!(chunks.is_empty());
            assert_eq!(whole, Sha256::of(&data), "{version:?}");
        }
    }

    #[test]
    fn the_chunk_list_hash_is_the_hash_of_the_raw_chunk_hashes() {
        let chunks = [Sha256([1; 32]), Sha256([2; 32])];
        let mut raw = vec![1u8; 32];
        raw.extend([2u8; 32]);
        assert_eq!(chunk_list_hash(&chunks), Sha256::of(&raw));
    }
}
