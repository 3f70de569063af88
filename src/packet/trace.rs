//! The trace sidecar: which content a turn read, in the order it first
//! read it, so that the next mount of the session (usually of the packet
//! that turn sealed, often on another machine) fetches that first.
//!
//! A seal writes it beside the packet it writes (`OUT.trace`; for
//! `s3://BUCKET/KEY`, the object `KEY.trace`), never inside the packet:
//! the packet stays the pure function of the tree that `pack` makes. It
//! is a hint, not an input: a mount that finds none, or one it cannot
//! read, or one naming paths its packet does not have, prefetches less,
//! and serves the same bytes, verified the same way.
//!
//! ```json
//! {"schema":"sessionfs.trace/1","read":[["workspace/src/main.rs",0],["workspace/data/big.bin",3]]}
//! ```
//!
//! Each item is a path of the packet the turn read (as the manifest spells
//! it) and a chunk of it (0 for a small file; `k` for bytes `k*4MiB ..`
//! of a larger one).

use serde::{Deserialize, Serialize};

/// A trace file is refused past this size (a trace holds at most
/// `overlay::content::TRACE_MAX` chunks, a few MiB).
pub const MAX_TRACE_BYTES: u64 = 32 << 20;

/// The schema a trace names.
pub const SCHEMA: &str = "sessionfs.trace/1";

/// A turn's trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// [`SCHEMA`].
    pub schema: String,
    /// The chunks read, in the order first read.
    pub read: Vec<(String, u32)>,
}

impl Trace {
    /// A trace of `read`.
    pub fn new(read: Vec<(String, u32)>) -> Trace {
        Trace {
            schema: SCHEMA.into(),
            read,
        }
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Parses a trace file; `None` (the trace is ignored) for anything
    /// else, another schema included.
    pub fn parse(bytes: &[u8]) -> Option<Trace> {
        let t: Trace = serde_json::from_slice(bytes).ok()?;
        (t.schema == SCHEMA).then_some(t)
    }

    /// The units of `units` (a packet's [`super::reader::Packet::units`])
    /// the trace names, in its order, each once: paths the packet does
    /// not have, chunks past a file's end and directories are skipped.
    pub fn units(
        &self,
        manifest: &super::manifest::Manifest,
        units: &[crate::store::spool::Unit],
    ) -> Vec<usize> {
        // The first unit of each entry (units are in entry order).
        let mut first = std::collections::HashMap::new();
        for (u, unit) in units.iter().enumerate() {
            first.entry(unit.group).or_insert(u);
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (path, k) in &self.read {
            let Ok(i) = manifest
                .entries
                .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
            else {
                continue;
            };
            let Some(&u0) = first.get(&(i as u32)) else {
                continue;
            };
            let u = u0 + *k as usize;
            if units.get(u).is_some_and(|x| x.group == i as u32) && seen.insert(u) {
                out.push(u);
            }
        }
        out
    }
}
