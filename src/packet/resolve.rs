//! Symlink resolution inside a packet, for the strict mode that refuses
//! symlinks whose targets escape the restored tree.

use std::collections::HashMap;
use std::collections::VecDeque;

use super::error::{Error, Result};
use super::manifest::{EntryKind, Manifest};

/// Symlinks followed before giving up, as the kernel's `ELOOP` bound.
const MAX_HOPS: usize = 40;

/// Fails with [`Error::SymlinkEscapes`] for the first symlink whose target,
/// resolved through the packet's own symlinks, leaves the tree rooted at
/// `root` (`""` for the packet root, or a part name). Absolute targets
/// always escape. Paths that do not exist are resolved lexically (they may
/// be created later); a loop or a file in the middle stops resolution
/// without escaping.
pub fn check_no_escapes(manifest: &Manifest, root: &str) -> Result<()> {
    let kinds: HashMap<&str, &EntryKind> = manifest
        .entries
        .iter()
        .map(|e| (&*e.path, &e.kind))
        .collect();
    let root_depth = if root.is_empty() { 0 } else { 1 };
    for e in &manifest.entries {
        let EntryKind::Symlink(target) = &e.kind else {
            continue;
        };
        if !root.is_empty() && super::path::Part::of(&e.path).map(|p| p.as_str()) != Some(root) {
            continue;
        }
        if escapes(&kinds, &e.path, target, root_depth) {
            return Err(Error::SymlinkEscapes {
                path: e.path.to_string(),
                target: target.to_string(),
            });
        }
    }
    Ok(())
}

fn escapes(kinds: &HashMap<&str, &EntryKind>, link: &str, target: &str, root_depth: usize) -> bool {
    let mut stack: Vec<&str> = link.split('/').collect();
    stack.pop(); // the link's own name
    let mut queue: VecDeque<&str> = VecDeque::new();
    if target.starts_with('/') {
        return true;
    }
    queue.extend(target.split('/'));
    let mut hops = 0;
    let mut path = String::new();
    while let Some(c) = queue.pop_front() {
        match c {
            "" | "." => continue,
            ".." => {
                if stack.len() <= root_depth {
                    return true;
                }
                stack.pop();
                continue;
            }
            name => stack.push(name),
        }
        path.clear();
        for (i, s) in stack.iter().enumerate() {
            if i > 0 {
                path.push('/');
            }
            path.push_str(s);
        }
        match kinds.get(path.as_str()) {
            Some(EntryKind::Symlink(t)) => {
                hops += 1;
                if hops > MAX_HOPS {
                    return false;
                }
                if t.starts_with('/') {
                    return true;
                }
                stack.pop();
                for part in t.split('/').rev() {
                    queue.push_front(part);
                }
            }
            Some(EntryKind::File(_)) if !queue.iter().all(|c| c.is_empty() || *c == ".") => {
                return false; // ENOTDIR
            }
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::manifest::Entry;

    fn m(entries: &[(&str, Option<&str>)]) -> Manifest {
        Manifest {
            harness: None,
            entries: entries
                .iter()
                .map(|(p, t)| Entry {
                    path: (*p).into(),
                    kind: match t {
                        None => EntryKind::Dir,
                        Some(t) => EntryKind::Symlink((*t).into()),
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn escape_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("workspace/l", "a/b", false),
            ("workspace/l", "..", false),
            ("workspace/l", "../..", true),
            ("workspace/l", "/etc/passwd", true),
            ("workspace/d/l", "../../harness", false),
            ("workspace/d/l", "../../../x", true),
            ("workspace/l", "x/../../..", true),
        ];
        for (link, target, want) in cases {
            let man = m(&[
                ("workspace", None),
                ("workspace/d", None),
                (link, Some(target)),
            ]);
            let got = check_no_escapes(&man, "").is_err();
            assert_eq!(got, *want, "{link} -> {target}");
        }
    }

    #[test]
    fn resolution_follows_packet_symlinks() {
        // alias -> d/deep (two levels down), so alias/../../.. climbs from
        // workspace/d/deep: up to workspace/d, workspace, then the root.
        let man = m(&[
            ("workspace", None),
            ("workspace/alias", Some("d/deep")),
            ("workspace/d", None),
            ("workspace/d/deep", None),
            ("workspace/l", Some("alias/../../..")),
        ]);
        assert!(
            check_no_escapes(&man, "").is_ok(),
            "stays at the packet root"
        );
        assert!(
            check_no_escapes(&man, "workspace").is_err(),
            "leaves the workspace part"
        );
        // A loop does not escape (the kernel would say ELOOP).
        let man = m(&[
            ("workspace", None),
            ("workspace/a", Some("b")),
            ("workspace/b", Some("a/../../..")),
        ]);
        assert!(check_no_escapes(&man, "").is_ok());
        let man = m(&[
            ("workspace", None),
            ("workspace/a", Some("b")),
            ("workspace/b", Some("a")),
        ]);
        assert!(check_no_escapes(&man, "").is_ok());
    }
}
