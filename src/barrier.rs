//! Test barriers: named points where `pack`, `unpack`, `seal` and a
//! mount's daemon pause, so that tests can change the world at an exact
//! moment (a file between two reads, a crash between two steps, a signal
//! after the commit). The points are the [`Point`]s.
//!
//! Compiled in only with the cargo feature `test-hooks`, which the tests
//! enable (the package is its own dev-dependency with that feature, so
//! `cargo test` builds the binary under test with it); a release build has
//! no barrier code and ignores `SESSIONFS_TEST_BARRIER`.
//!
//! Armed by `SESSIONFS_TEST_BARRIER=DIR`: at point `NAME` the process
//! creates `DIR/NAME.reached`, then waits (at most five minutes) until
//! `DIR/NAME.go` exists. A file in `DIR` named after no point (a misspelt
//! `.go`) makes the command fail at its start (see [`check_env`]). Unset, a
//! barrier costs nothing.

use std::path::{Path, PathBuf};

/// A point where a process may pause, in the order a run passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// Pack: the part roots are walked, before the deeper directories.
    WalkedRoots,
    /// Seal: holding the state, before its walk of the tree.
    Collecting,
    /// Seal: the merged view is collected.
    Collected,
    /// Pack and seal: new content is hashed, nothing written yet.
    Hashed,
    /// Seal: the output's length is known and reserved.
    Sized,
    /// Seal: the packet is written, not yet synced.
    Written,
    /// Seal: the packet is synced, not yet renamed into place.
    Synced,
    /// Unpack: the tree is built in its staging directory.
    Restored,
    /// Pack, unpack and seal: the output is in place.
    Committed,
    /// Seal with `--rebase`: the `rebase` record is appended.
    RebaseRecorded,
    /// Seal with `--rebase`: the journal is compacted.
    RebaseCompacted,
    /// Pack: the result is printed.
    Reported,
    /// Mount: a change to a file copied up by chunk is in its data file
    /// (a change of size shows already), its `hold` record not yet
    /// written (src/overlay/chunked.rs).
    ChunkHold,
    /// The signal thread has put off a signal that came after the commit.
    InterruptDeferred,
}

/// Pauses at `point` when `dir` (the barrier directory) is given and the
/// build has test hooks; else nothing.
#[inline]
pub fn wait(dir: Option<&Path>, point: Point) {
    #[cfg(feature = "test-hooks")]
    hooks::wait(dir, point);
    #[cfg(not(feature = "test-hooks"))]
    let _ = (dir, point);
}

/// The barrier directory from the environment, if armed (never without
/// test hooks).
pub fn from_env() -> Option<PathBuf> {
    #[cfg(feature = "test-hooks")]
    return hooks::dir();
    #[cfg(not(feature = "test-hooks"))]
    None
}

/// Refuses a barrier directory holding a file named after no point: a test
/// that misspelt one would otherwise not pause where it meant to. `Ok`
/// without test hooks.
pub fn check_env() -> Result<(), String> {
    #[cfg(feature = "test-hooks")]
    return hooks::check();
    #[cfg(not(feature = "test-hooks"))]
    Ok(())
}

#[cfg(feature = "test-hooks")]
mod hooks {
    use super::Point;
    use std::path::{Path, PathBuf};

    const ALL: [Point; 14] = [
        Point::WalkedRoots,
        Point::Collecting,
        Point::Collected,
        Point::Hashed,
        Point::Sized,
        Point::Written,
        Point::Synced,
        Point::Restored,
        Point::Committed,
        Point::RebaseRecorded,
        Point::RebaseCompacted,
        Point::Reported,
        Point::ChunkHold,
        Point::InterruptDeferred,
    ];
    // Every point is in ALL: the last is the last variant.
    const _: () = assert!(ALL.len() == Point::InterruptDeferred as usize + 1);

    impl Point {
        /// The point's name in the barrier directory's files.
        pub fn as_str(self) -> &'static str {
            match self {
                Point::WalkedRoots => "walked-roots",
                Point::Collecting => "collecting",
                Point::Collected => "collected",
                Point::Hashed => "hashed",
                Point::Sized => "sized",
                Point::Written => "written",
                Point::Synced => "synced",
                Point::Restored => "restored",
                Point::Committed => "committed",
                Point::RebaseRecorded => "rebase-recorded",
                Point::RebaseCompacted => "rebase-compacted",
                Point::Reported => "reported",
                Point::ChunkHold => "chunk-hold",
                Point::InterruptDeferred => "interrupt-deferred",
            }
        }
    }

    pub(super) fn dir() -> Option<PathBuf> {
        std::env::var_os("SESSIONFS_TEST_BARRIER").map(PathBuf::from)
    }

    pub(super) fn check() -> Result<(), String> {
        let Some(dir) = dir() else { return Ok(()) };
        let Ok(list) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for e in list.flatten() {
            let name = e.file_name();
            let known = name.to_str().is_some_and(|n| {
                let point = n.strip_suffix(".go").or_else(|| n.strip_suffix(".reached"));
                point.is_some_and(|p| ALL.iter().any(|k| k.as_str() == p))
            });
            if !known {
                let names: Vec<&str> = ALL.iter().map(|p| p.as_str()).collect();
                return Err(format!(
                    "{}: {} names no test barrier point (SESSIONFS_TEST_BARRIER); the points: {}",
                    dir.display(),
                    name.to_string_lossy(),
                    names.join(", ")
                ));
            }
        }
        Ok(())
    }

    pub(super) fn wait(dir: Option<&Path>, point: Point) {
        let Some(dir) = dir else { return };
        let name = point.as_str();
        if std::fs::write(dir.join(format!("{name}.reached")), b"").is_err() {
            return;
        }
        let go = dir.join(format!("{name}.go"));
        for _ in 0..60_000 {
            if go.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::ALL;

        #[test]
        fn every_point_has_a_name_of_its_own() {
            let mut names: Vec<&str> = ALL.iter().map(|p| p.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), ALL.len());
        }
    }
}
