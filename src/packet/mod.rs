//! The session packet format, `sessionfs.packet/1` and `/2`: manifest, canonical
//! layout, strict reader, writer and digests. No FUSE, no raw syscalls.

pub mod backing;
pub mod digest;
pub mod error;
pub mod format;
pub mod layout;
pub mod manifest;
pub mod path;
pub mod reader;
pub mod resolve;
pub mod trace;
pub mod verify;

pub use error::{Error, Result};
