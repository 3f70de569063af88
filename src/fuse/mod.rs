//! The FUSE adapter: the only module that knows about `fuser`. It
//! translates requests into overlay calls (`fs.rs`), errors into errnos
//! (`errno.rs`), and runs the mount session with its signals and control
//! socket (`daemon.rs`, `control.rs`); `quiet.rs` keeps fuser's one
//! harmless error line out of the log.

pub(crate) mod control;
pub(crate) mod daemon;
pub mod errno;
pub(crate) mod fs;
pub(crate) mod quiet;
