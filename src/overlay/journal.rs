//! The upper directory's journal: one JSON object per line, one line per
//! namespace or metadata change, appended with a single `write` before the
//! change is acknowledged. Replaying the lines in order over the lower tree
//! rebuilds the merged view. See docs/upper-format.md.

use serde::{Deserialize, Serialize};

use super::ino::Ino;
use super::node::Kind;

/// Nanoseconds since the epoch.
pub type Nanos = i64;

/// One change. Field names are short: a busy build writes many of these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// A new inode, linked at `parent`/`name`: a file (with its data file),
    /// directory, symlink (with its target) or special file.
    Mknode {
        /// When (becomes the new inode's times and the parent's mtime/ctime).
        t: Nanos,
        /// Its inode number.
        ino: Ino,
        /// Its generation (distinguishes reuses of a number).
        generation: u64,
        /// Directory it is created in.
        parent: Ino,
        /// Its name there.
        name: String,
        /// What it is.
        kind: Kind,
        /// Permission bits (mode & 0o7777).
        perm: u16,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// Device number (character and block devices).
        #[serde(default, skip_serializing_if = "is_zero")]
        rdev: u64,
        /// Data file id (regular files).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<u64>,
        /// Target (symlinks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
    },
    /// A new name for an existing non-directory inode.
    Link {
        /// When.
        t: Nanos,
        /// The inode.
        ino: Ino,
        /// Directory of the new name.
        parent: Ino,
        /// The new name.
        name: String,
    },
    /// A name removed (a file, symlink, special file or empty directory).
    /// Removing a lower entry's name is a whiteout.
    Unlink {
        /// When.
        t: Nanos,
        /// The directory.
        parent: Ino,
        /// The name.
        name: String,
    },
    /// A name moved, replacing any existing target (or exchanged with it).
    Rename {
        /// When.
        t: Nanos,
        /// Source directory.
        parent: Ino,
        /// Source name.
        name: String,
        /// Target directory.
        newparent: Ino,
        /// Target name.
        newname: String,
        /// `RENAME_EXCHANGE`: swap the two names.
        #[serde(default, skip_serializing_if = "is_false")]
        exchange: bool,
    },
    /// Metadata of an inode changed.
    Setattr {
        /// When (becomes the ctime).
        t: Nanos,
        /// The inode.
        ino: Ino,
        /// New permission bits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        perm: Option<u16>,
        /// New owner.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<u32>,
        /// New group.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gid: Option<u32>,
        /// New access time (inodes without a data file).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        atime: Option<Nanos>,
        /// New modification time (inodes without a data file).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtime: Option<Nanos>,
    },
    /// A lower file's content now lives in data file `data`; with
    /// `chunks`, only the chunks later `hold` records name do, the others
    /// are still the lower entry's (copy-up by chunk).
    CopyUp {
        /// When.
        t: Nanos,
        /// The inode.
        ino: Ino,
        /// The data file.
        data: u64,
        /// Copied up by chunk: the data file holds no chunk yet.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        chunks: bool,
    },
    /// Chunks of a file copied up by chunk that its data file holds from
    /// now on (written, cut by a truncation, or past its end).
    Hold {
        /// When.
        t: Nanos,
        /// The inode.
        ino: Ino,
        /// The chunks, as `[first, end)` ranges of chunk numbers, in order.
        chunks: Vec<[u64; 2]>,
    },
    /// The mount continues on a new packet (a seal with `--rebase`): the
    /// records before this one are superseded. Always the first line of a
    /// compacted journal.
    Rebase {
        /// When.
        t: Nanos,
        /// Digest of the new packet.
        packet: String,
        /// Where it was written (to tell the user which packet to mount).
        output: String,
        /// Inode numbers that differ from those the new packet's paths give
        /// (entries renamed since they were numbered), kept so that paths
        /// keep their numbers across the rebase.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        inos: Vec<(String, Ino)>,
        /// The records that make again, over the new packet, what it
        /// leaves out of the merged view (credentials, special files,
        /// `--exclude`d entries), applied in order after it: in the same
        /// line, so that a crash never keeps the rebase without them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        kept: Vec<Record>,
    },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl Record {
    /// The line written to the journal (with its newline).
    pub fn to_line(&self) -> Vec<u8> {
        // Serializing a plain enum of numbers and strings cannot fail.
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// How a journal's bytes parse.
#[derive(Debug)]
pub struct Parsed {
    /// The complete records, in order.
    pub records: Vec<Record>,
    /// Length of the valid prefix: a final line cut short by a crash (no
    /// newline) is not part of it.
    pub valid_len: usize,
}

/// Parses journal bytes. A final line without its newline was cut short by
/// a crash and is dropped; any other line that does not parse means the
/// journal is damaged, and the error names the line.
pub fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut records = Vec::new();
    let mut pos = 0;
    let mut line_no = 0;
    while pos < bytes.len() {
        line_no += 1;
        let Some(nl) = bytes[pos..].iter().position(|&b| b == b'\n') else {
            break; // torn final write
        };
        let line = &bytes[pos..pos + nl];
        let rec: Record = serde_json::from_slice(line)
            .map_err(|e| format!("journal line {line_no} (byte {pos}) does not parse: {e}"))?;
        records.push(rec);
        pos += nl + 1;
    }
    Ok(Parsed {
        records,
        valid_len: pos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_torn_tails_are_dropped() {
        let recs = vec![
            Record::Mknode {
                t: 1,
                ino: 99,
                generation: 1,
                parent: 1,
                name: "a\nb\"c".into(),
                kind: Kind::File,
                perm: 0o644,
                uid: 0,
                gid: 0,
                rdev: 0,
                data: Some(7),
                target: None,
            },
            Record::Rename {
                t: 2,
                parent: 1,
                name: "x".into(),
                newparent: 5,
                newname: "y".into(),
                exchange: true,
            },
            Record::Unlink {
                t: 3,
                parent: 1,
                name: "y".into(),
            },
        ];
        let mut bytes: Vec<u8> = recs.iter().flat_map(|r| r.to_line()).collect();
        let full = bytes.len();
        bytes.extend_from_slice(b"{\"op\":\"unlink\",\"t\":4,\"par");
        let p = parse(&bytes).unwrap();
        assert_eq!(p.records, recs);
        assert_eq!(p.valid_len, full);
        // Damage in the middle is an error, naming the line.
        let mut bad = bytes.clone();
        bad[5] = b'#';
        assert!(parse(&bad).unwrap_err().contains("line 1"));
        // Unknown fields are damage too.
        let err = parse(b"{\"op\":\"unlink\",\"t\":1,\"parent\":1,\"name\":\"a\",\"x\":1}\n")
            .unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    /// A rebase carries the records that keep what its packet leaves out
    /// in its own line: cut anywhere, the whole rebase is a torn tail.
    #[test]
    fn a_rebase_and_what_it_keeps_are_one_line() {
        let keep = Record::Mknode {
            t: 5,
            ino: 42,
            generation: 3,
            parent: 1,
            name: ".env".into(),
            kind: Kind::File,
            perm: 0o600,
            uid: 0,
            gid: 0,
            rdev: 0,
            data: Some(9),
            target: None,
        };
        let rebase = Record::Rebase {
            t: 5,
            packet: "sha256:00".into(),
            output: "/o.packet".into(),
            inos: vec![("workspace/b".into(), 7)],
            kept: vec![keep.clone(), keep],
        };
        let line = rebase.to_line();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(parse(&line).unwrap().records, vec![rebase.clone()]);
        for cut in [line.len() / 3, line.len() - 2] {
            let p = parse(&line[..cut]).unwrap();
            assert!(p.records.is_empty() && p.valid_len == 0, "cut at {cut}");
        }
        // Journals written before `kept` existed still read.
        let old = b"{\"op\":\"rebase\",\"t\":1,\"packet\":\"sha256:00\",\"output\":\"o\"}\n";
        assert!(matches!(
            &parse(old).unwrap().records[..],
            [Record::Rebase { kept, .. }] if kept.is_empty()
        ));
    }
}
