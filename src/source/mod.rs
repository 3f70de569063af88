//! Reading real directory trees into packets: the walk, the exclusion
//! policy, symlink rebasing, and `pack`.

pub mod error;
pub mod pack;
pub mod policy;
pub mod report;
pub mod symlink;
pub mod tar;
pub mod walk;

pub use error::Error;
