//! sessionfs: deterministic, content-addressed session packets for AI coding
//! agents, served through FUSE with a copy-on-write upper directory.
//!
//! Layers depend one way: `packet` <- `overlay` <- `fuse` <- `cli`, with
//! `source` (pack), `restore` (unpack) and `output` beside `overlay`.
//! See `docs/ARCHITECTURE.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod barrier;
pub mod cli;
pub mod fuse;
pub mod interrupt;
pub mod kind;
pub mod output;
pub mod overlay;
pub mod packet;
pub mod restore;
pub mod source;
pub mod sys;
