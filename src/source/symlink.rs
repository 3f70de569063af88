//! Symlink targets at pack time: kept verbatim, rebased when an absolute
//! target points into the part being packed, or flagged as external.

use serde::Serialize;

/// What happened to a symlink's target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Relative and staying inside the part: stored verbatim.
    Internal,
    /// Absolute and inside the part: rebased to a relative target.
    Rebased,
    /// Absolute under the part's root, rebased, and then climbing out of
    /// the part all the same (`/ws/../x` becomes `../x`): both rebased and
    /// external.
    RebasedExternal,
    /// Absolute outside the part, or relative climbing out of it: stored
    /// verbatim, counted, refused under `--reject-external-symlinks`.
    External,
}

/// Decides the stored target of a symlink whose directory lies `depth`
/// components below the part root, given the absolute spellings of that
/// root (`roots`, without trailing `/`; `/` itself is the empty string).
///
/// Rebasing replaces only the root prefix and the whole run of separators
/// after it by the climb out of the link's directory; every later byte is
/// kept verbatim, `..` components and a trailing separator included.
pub fn rebase(target: &str, depth: usize, roots: &[String]) -> (String, LinkClass) {
    if !target.starts_with('/') {
        let class = if escapes_lexically(target, depth) {
            LinkClass::External
        } else {
            LinkClass::Internal
        };
        return (target.to_owned(), class);
    }
    for root in roots {
        if let Some(rebased) = target
            .strip_prefix(root.as_str())
            .and_then(|after| rebase_after(after, depth))
        {
            return rebased;
        }
    }
    (target.to_owned(), LinkClass::External)
}

/// Rebases a target whose root prefix was `after` cut off (see [`rebase`]);
/// `None` when `after` does not start at a component boundary (`/ws2` is
/// not under `/ws`).
pub fn rebase_after(after: &str, depth: usize) -> Option<(String, LinkClass)> {
    if !(after.is_empty() || after.starts_with('/')) {
        return None;
    }
    let rest = after.trim_start_matches('/');
    let mut out = "../".repeat(depth);
    if rest.is_empty() {
        // The root itself: the climb, or `.` at depth 0.
        if depth == 0 {
            out.push('.');
        } else {
            out.pop();
        }
        if !after.is_empty() {
            out.push('/');
        }
    } else {
        out.push_str(rest);
    }
    let class = if escapes_lexically(&out, depth) {
        LinkClass::RebasedExternal
    } else {
        LinkClass::Rebased
    };
    Some((out, class))
}

pub use crate::packet::resolve::escapes_lexically;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebasing_table() {
        let roots = vec!["/ws".to_string(), "/real/ws".to_string()];
        let cases: &[(&str, usize, &str, LinkClass)] = &[
            // The example: `..` after the root is kept verbatim.
            (
                "/ws/alias/../data.txt",
                0,
                "alias/../data.txt",
                LinkClass::Rebased,
            ),
            ("/ws/a/b", 0, "a/b", LinkClass::Rebased),
            ("/ws/a/b", 2, "../../a/b", LinkClass::Rebased),
            // The whole run of separators after the root goes.
            ("/ws//a", 1, "../a", LinkClass::Rebased),
            ("/ws///a//b", 0, "a//b", LinkClass::Rebased),
            // Trailing separators stay.
            ("/ws/dir/", 1, "../dir/", LinkClass::Rebased),
            ("/ws", 0, ".", LinkClass::Rebased),
            ("/ws", 2, "../..", LinkClass::Rebased),
            ("/ws/", 0, "./", LinkClass::Rebased),
            ("/ws//", 2, "../../", LinkClass::Rebased),
            // The second spelling of the root (its canonical path).
            ("/real/ws/x", 1, "../x", LinkClass::Rebased),
            // Rebased, then climbing out all the same: external too.
            ("/ws/../x", 0, "../x", LinkClass::RebasedExternal),
            (
                "/ws/a/../../x",
                1,
                "../a/../../x",
                LinkClass::RebasedExternal,
            ),
            ("/ws/a/..", 0, "a/..", LinkClass::Rebased),
            ("/ws/a/../..", 1, "../a/../..", LinkClass::RebasedExternal),
            // Component boundary.
            ("/ws2/a", 0, "/ws2/a", LinkClass::External),
            (
                "/usr/bin/python3",
                2,
                "/usr/bin/python3",
                LinkClass::External,
            ),
            // Relative targets.
            ("a/b", 0, "a/b", LinkClass::Internal),
            ("../x", 1, "../x", LinkClass::Internal),
            ("../x", 0, "../x", LinkClass::External),
            ("a/../../x", 0, "a/../../x", LinkClass::External),
            ("a/../../x", 1, "a/../../x", LinkClass::Internal),
        ];
        for (target, depth, want, class) in cases {
            let (got, got_class) = rebase(target, *depth, &roots);
            assert_eq!(
                (&*got, &got_class),
                (*want, class),
                "{target} at depth {depth}"
            );
        }
    }

    #[test]
    fn root_of_the_filesystem() {
        let roots = vec![String::new()];
        assert_eq!(
            rebase("/etc/x", 1, &roots),
            ("../etc/x".into(), LinkClass::Rebased)
        );
    }
}
