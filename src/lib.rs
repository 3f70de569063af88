//! sessionfs: deterministic, content-addressed session packets for AI coding
//! agents, served through FUSE with a copy-on-write upper directory.
//!
//! Layers depend one way: `packet` <- `output` <- `source` <- `overlay` <-
//! `fuse` <- `daemon` <- `cli` (`restore` beside `source`; `kind`, `sys`, `barrier` and
//! `interrupt` usable from any). See `docs/ARCHITECTURE.md`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub(crate) mod barrier;
pub mod cli;
pub(crate) mod daemon;
pub(crate) mod fuse;
pub(crate) mod harness;
pub(crate) mod interrupt;
pub(crate) mod kind;
pub(crate) mod output;
pub(crate) mod overlay;
pub(crate) mod packet;
pub(crate) mod restore;
pub(crate) mod source;
pub(crate) mod store;
pub(crate) mod sys;
pub(crate) mod tar_out;

/// The library's surface outside the crate: what the integration tests,
/// the fuzz targets and the benchmark driver use, and nothing else (the
/// modules are private to the crate). A test that needs more names it
/// here, so the surface stays small and listed (docs/ARCHITECTURE.md).
pub mod api {
    pub use crate::fuse::errno::errno;
    pub use crate::kind::ErrorKind;
    pub use crate::overlay::ino::{ROOT, candidate};
    pub use crate::overlay::seal::{SealOptions, SealOutcome};
    pub use crate::overlay::{Caller, Error, Kind, Options, Overlay, SetAttr, SetTime};
    pub use crate::packet::digest::{Sha256, chunk_list_hash};
    pub use crate::packet::format::{
        HarnessKind, Limits, MAX_FILE_SIZE, MAX_MTIME_NS, Version, chunk_count,
    };
    pub use crate::packet::layout::{Layout, manifest_header};
    pub use crate::packet::manifest::{Entry, EntryKind, FileMeta, Manifest};
    pub use crate::packet::path::{Part, collision_key};
    pub use crate::packet::reader::Packet;
    pub use crate::packet::verify::verify;
    pub use crate::restore::{UnpackOptions, unpack};
    pub use crate::source::pack::{Input, PackOptions, pack};
    pub use crate::source::tar::TarIn;
    pub use crate::sys::{FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, fallbacks_forced, is_fuse_path};
}
