//! The path rules of a packet: what an entry path may be, and which paths
//! collide on case-insensitive or normalizing filesystems.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;

use super::error::{Error, LimitKind, Result};
use super::format::{Limits, MAX_COMPONENT_BYTES, PART_HARNESS, PART_WORKSPACE};

/// The part an entry belongs to.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// `harness/`: the agent harness's state.
    Harness,
    /// `workspace/`: the project tree.
    Workspace,
}

impl Part {
    /// The top-level directory name.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Harness => PART_HARNESS,
            Part::Workspace => PART_WORKSPACE,
        }
    }

    /// Parses a part name.
    pub fn parse(s: &str) -> Option<Part> {
        match s {
            PART_HARNESS => Some(Part::Harness),
            PART_WORKSPACE => Some(Part::Workspace),
            _ => None,
        }
    }

    /// The part a valid entry path belongs to.
    pub fn of(path: &str) -> Option<Part> {
        Part::parse(path.get(..slash(path).unwrap_or(path.len()))?)
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The parent of a path (`None` for a top-level name).
pub fn parent(path: &str) -> Option<&str> {
    last_slash(path).and_then(|i| path.get(..i))
}

/// The last component of a path.
pub fn file_name(path: &str) -> &str {
    last_slash(path).map_or(path, |i| path.get(i + 1..).unwrap_or(""))
}

// Byte searches for `/`, always a char boundary in UTF-8: `str::rfind`
// with a char pattern calls memcmp for every candidate, which was an
// eighth of a manifest's parse and validation.
fn slash(path: &str) -> Option<usize> {
    path.bytes().position(|b| b == b'/')
}

fn last_slash(path: &str) -> Option<usize> {
    path.bytes().rposition(|b| b == b'/')
}

/// `bytes` shown as text for a message or a result: UTF-8 as it is, but
/// each backslash doubled and each byte that is not UTF-8 as `\xHH`
/// (`bad\xffname`, which a shell takes back as `$'bad\xffname'`), so
/// that a user can find the name, where a lossy conversion would show a
/// U+FFFD that matches nothing on disk. Backslashes are doubled in every
/// name, so that the UTF-8 name `caf\xe9`, typed with a backslash, shows
/// as `caf\\xe9`, never as the name with the byte 0xe9.
pub fn shown(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return if s.contains('\\') {
            s.replace('\\', "\\\\")
        } else {
            s.to_owned()
        };
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A path of the machine shown as [`shown`] shows a name.
pub fn shown_path(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    shown(path.as_os_str().as_bytes())
}

/// Whether `c` is a control character (C0, DEL or C1): never allowed in a path.
pub fn is_control(c: char) -> bool {
    c.is_control()
}

/// Checks one entry path against the path rules; `limits` bounds its length.
pub fn check_path(path: &str, limits: &Limits) -> Result<()> {
    if plainly_valid(path, limits) {
        return Ok(());
    }
    check_path_slowly(path, limits)
}

/// Whether `path` is a printable-ASCII path that keeps every rule, found in
/// one pass over its bytes (a manifest checks every path at mount; three
/// passes were a seventh of parsing and validating one). `false` says only
/// that [`check_path_slowly`] must decide, and name the first error.
fn plainly_valid(path: &str, limits: &Limits) -> bool {
    let b = path.as_bytes();
    if b.is_empty() || b.len() as u64 > limits.max_path_bytes {
        return false;
    }
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        if c == b'/' {
            if !plain_component(&b[start..i]) {
                return false;
            }
            start = i + 1;
        } else if !(0x20..0x7f).contains(&c) || c == b'\\' {
            return false;
        }
    }
    plain_component(&b[start..]) && Part::of(path).is_some()
}

/// A component that is not empty, `.`, `..` or too long.
fn plain_component(c: &[u8]) -> bool {
    !matches!(c, b"" | b"." | b"..") && c.len() <= MAX_COMPONENT_BYTES
}

/// [`check_path`], in the order its errors are reported.
fn check_path_slowly(path: &str, limits: &Limits) -> Result<()> {
    let invalid = |reason: String| Error::InvalidPath {
        // Its backslashes doubled: the path may well have one.
        path: shown(path.as_bytes()),
        reason,
    };
    if path.is_empty() {
        return Err(invalid("empty path".into()));
    }
    if path.len() as u64 > limits.max_path_bytes {
        return Err(LimitKind::PathBytes.exceeded(path.len() as u64, limits, Some(path)));
    }
    if path.starts_with('/') {
        return Err(invalid("absolute path".into()));
    }
    // ASCII paths (nearly all) are checked byte by byte; others by char.
    let bad = if path.is_ascii() {
        path.bytes()
            .find(|&b| b == b'\\' || b < 0x20 || b == 0x7f)
            .map(char::from)
    } else {
        path.chars().find(|&c| c == '\\' || is_control(c))
    };
    if let Some(c) = bad {
        return Err(invalid(if c == '\\' {
            "backslash in path".into()
        } else {
            format!("control character U+{:04X} in path", c as u32)
        }));
    }
    for component in path.as_bytes().split(|&b| b == b'/') {
        match component {
            b"" => return Err(invalid("empty component (`//` or a trailing `/`)".into())),
            b"." => return Err(invalid("`.` component".into())),
            b".." => return Err(invalid("`..` component".into())),
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(invalid(format!(
                    "component of {} bytes; at most {MAX_COMPONENT_BYTES} are allowed",
                    c.len()
                )));
            }
            _ => {}
        }
    }
    if Part::of(path).is_none() {
        return Err(invalid(
            "outside the two parts: paths start with `workspace` or `harness`".into(),
        ));
    }
    Ok(())
}

/// The key under which two paths collide on a case-insensitive, normalizing
/// filesystem: canonical decomposition, then full Unicode case folding
/// (CaseFolding.txt of Unicode 16.0, statuses C and F: `ß` and `ss`, `ſ`
/// and `s`, final `ς` and `σ` fold alike, whatever surrounds them), then
/// decomposition again (folding can compose). ASCII paths take a fast path (ASCII folds
/// to its lowercase).
pub fn collision_key(path: &str) -> Cow<'_, str> {
    if path.is_ascii() {
        if path.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(path.to_ascii_lowercase())
        } else {
            Cow::Borrowed(path)
        }
    } else {
        // The folding tables come from a pinned crate, not from the
        // compiler's standard library: every build folds alike.
        let folded = caseless::default_case_fold_str(&path.nfd().collect::<String>());
        Cow::Owned(folded.nfd().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_not_utf8_are_shown_with_escapes() {
        assert_eq!(shown("é/ü".as_bytes()), "é/ü");
        assert_eq!(shown(b"caf\xe9"), "caf\\xe9");
        // A cut sequence, a stray continuation byte, and UTF-8 after them.
        assert_eq!(shown(b"a\xe2\x82/\x80\xc3\xa9"), "a\\xe2\\x82/\\x80\u{e9}");
        // A backslash is doubled in every name: a UTF-8 name typed with
        // `\xe9` in it never shows as the name with the byte.
        assert_eq!(shown(b"a\\x41"), "a\\\\x41");
        assert_eq!(shown(b"a\\x41\xff"), "a\\\\x41\\xff");
        assert_ne!(shown(b"caf\\xe9"), shown(b"caf\xe9"));
    }

    #[test]
    fn parents_names_and_parts_split_at_slashes_only() {
        assert_eq!(parent("workspace/é/ü.txt"), Some("workspace/é"));
        assert_eq!(file_name("workspace/é/ü.txt"), "ü.txt");
        assert_eq!(parent("workspace"), None);
        assert_eq!(file_name("workspace"), "workspace");
        assert_eq!(parent("workspace/a"), Some("workspace"));
        assert_eq!(Part::of("workspace/a/b"), Some(Part::Workspace));
        assert_eq!(Part::of("harness"), Some(Part::Harness));
        assert_eq!(Part::of("workspaces/a"), None);
        assert_eq!(Part::of("é/workspace"), None);
    }

    #[test]
    fn path_rules_table() {
        let limits = Limits::DEFAULT;
        let long = format!("workspace/{}", "a".repeat(256));
        let ok = [
            "workspace",
            "harness",
            "workspace/a b/c",
            "workspace/é",
            "workspace/.hidden",
            "workspace/..x",
            "workspace/quote\"d",
        ];
        for p in ok {
            assert!(check_path(p, &limits).is_ok(), "{p} should be valid");
        }
        let bad: &[(&str, &str)] = &[
            ("", "empty path"),
            ("/workspace", "absolute"),
            ("workspace//a", "empty component"),
            ("workspace/", "empty component"),
            ("workspace/./a", "`.`"),
            ("workspace/../x", "`..`"),
            ("workspace/a\\b", "backslash"),
            ("workspace/a\nb", "control character U+000A"),
            ("workspace/a\u{7f}", "U+007F"),
            ("workspace/a\u{85}", "U+0085"),
            ("other/a", "outside the two parts"),
            ("workspaces/a", "outside the two parts"),
            (&long, "component of 256 bytes"),
        ];
        for (p, why) in bad {
            let err = check_path(p, &limits).expect_err(p).to_string();
            assert!(err.contains(why), "{p:?}: {err}");
        }
    }

    #[test]
    fn path_limit_is_a_limit_error() {
        let limits = Limits {
            max_path_bytes: 12,
            ..Limits::DEFAULT
        };
        let err = check_path("workspace/abc", &limits).unwrap_err();
        assert_eq!(err.kind(), "limit_exceeded");
    }

    #[test]
    fn collisions_by_case_and_normalization() {
        assert_eq!(
            collision_key("workspace/README"),
            collision_key("workspace/readme")
        );
        // U+00E9 (precomposed) and e + U+0301 (decomposed).
        assert_eq!(
            collision_key("workspace/caf\u{e9}"),
            collision_key("workspace/cafe\u{301}")
        );
        assert_eq!(
            collision_key("workspace/CAF\u{c9}"),
            collision_key("workspace/cafe\u{301}")
        );
        assert_ne!(collision_key("workspace/a"), collision_key("workspace/b"));
        // Full case folding, free of context: pairs that lowercasing keeps
        // apart (final sigma after a letter, sharp s, long s, micro sign)
        // collide on a folding filesystem.
        for (a, b) in [
            ("workspace/x\u{3c2}", "workspace/x\u{3c3}"),
            ("workspace/x\u{3a3}", "workspace/x\u{3c3}"),
            ("workspace/stra\u{df}e", "workspace/STRASSE"),
            ("workspace/\u{17f}", "workspace/s"),
            ("workspace/\u{b5}", "workspace/\u{3bc}"),
            ("workspace/\u{212a}", "workspace/k"),
        ] {
            assert_eq!(collision_key(a), collision_key(b), "{a} {b}");
        }
    }

    #[test]
    fn folding_is_that_of_the_spec_and_keeps_lowercase_collisions() {
        // docs/packet-format.md names the tables' version: a new one must
        // change the spec (and is a format change).
        assert_eq!(caseless::UNICODE_VERSION, (16, 0, 0));
        assert_eq!(unicode_normalization::UNICODE_VERSION, (16, 0, 0));
        // U+1AE0 is unassigned in 16.0 (combining class 0), so it does not
        // reorder with U+0316: two names. Tables of 17.0 or later give it a
        // class and make them collide.
        assert_ne!(
            collision_key("workspace/a\u{1ae0}\u{316}"),
            collision_key("workspace/a\u{316}\u{1ae0}")
        );
        // Every character the folding tables know folds as its lowercase
        // does, so names that collided under the earlier rule (NFD,
        // lowercase, NFD) still collide. (Characters newer than the tables,
        // which neither fold nor have a lowercase that folds, are left out.)
        let folds = |s: &str| caseless::default_case_fold_str(s) != s;
        let known = |c: &char| {
            let (c, lower) = (c.to_string(), c.to_lowercase().to_string());
            c != lower && (folds(&c) || folds(&lower))
        };
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32).filter(known) {
            let s = format!("workspace/{c}");
            let lower = format!("workspace/{}", c.to_lowercase());
            assert_eq!(
                collision_key(&s),
                collision_key(&lower),
                "U+{:04X}",
                c as u32
            );
        }
    }

    proptest::proptest! {
        /// The one-pass check accepts only what the full check accepts,
        /// and every printable-ASCII path the full check accepts.
        #[test]
        fn the_fast_path_check_agrees_with_the_full_one(
            path in proptest::prop_oneof![
                // Mostly refused: every kind of byte the rules look at.
                "(workspace|harness|works|\\.\\.)?(/|\\.|\\.\\.|a|Z|\\\\|\u{1}|\u{7f}|\u{85}|\u{e9}| ){0,12}",
                // Mostly accepted: several components, now and then one at
                // or over the component limit (255 bytes).
                "(workspace|harness)(/([a-zA-Z .~-]{1,4}|x{250,260})){0,5}",
            ],
            max in proptest::prop_oneof![8u64..40, 200u64..1400],
        ) {
            let limits = Limits { max_path_bytes: max, ..Limits::DEFAULT };
            let full = check_path_slowly(&path, &limits);
            if plainly_valid(&path, &limits) {
                proptest::prop_assert!(full.is_ok(), "{path:?}: {full:?}");
            } else if path.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                proptest::prop_assert!(full.is_err(), "{path:?}");
            }
            proptest::prop_assert_eq!(
                check_path(&path, &limits).map_err(|e| e.to_string()),
                full.map_err(|e| e.to_string())
            );
        }
    }
}
