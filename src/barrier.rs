//! Test barriers: named points where `pack`, `unpack` and `seal` pause, so
//! that tests can change the world at an exact moment (a file between two
//! reads, a crash between two steps, a signal after the commit). The
//! points: pack's `walked-roots`, `hashed`, `committed`, `reported`;
//! unpack's `restored`, `committed`; seal's `collecting` (holding the
//! state, before its walk of the tree), `collected`, `hashed`, `sized`,
//! `written`, `synced`, `committed`, `rebase-recorded`,
//! `rebase-compacted`; and `interrupt-deferred`, where the signal thread
//! has put off a signal that came after the commit.
//!
//! Armed by `SESSIONFS_TEST_BARRIER=DIR`: at point `NAME` the process
//! creates `DIR/NAME.reached`, then waits (at most five minutes) until
//! `DIR/NAME.go` exists. Unset, a barrier costs nothing.

use std::path::Path;

/// The barrier directory from the environment, if armed.
pub fn from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("SESSIONFS_TEST_BARRIER").map(std::path::PathBuf::from)
}

/// Pauses at point `name` when `dir` is armed.
pub fn wait(dir: Option<&Path>, name: &str) {
    let Some(dir) = dir else { return };
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
