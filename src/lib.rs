//! sessionfs: deterministic, content-addressed session packets for AI coding
//! agents, served through FUSE with a copy-on-write upper directory.
//!
//! Layers depend one way: `packet` <- `output` <- `source` <- `overlay` <-
//! `fuse` <- `cli` (`restore` beside `source`; `kind`, `sys`, `barrier` and
//! `interrupt` usable from any). See `docs/ARCHITECTURE.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub(crate) mod barrier;
pub mod cli;
pub mod fuse;
pub mod harness;
pub(crate) mod interrupt;
pub mod kind;
pub(crate) mod output;
pub mod overlay;
pub mod packet;
pub mod restore;
pub mod source;
pub mod store;
pub mod sys;
