//! Random trees for property tests (tests/properties.rs, tests/tar_in.rs):
//! names, files with content, modes and mtimes, symlinks, directories.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use proptest::prelude::*;

use super::{chmod, set_mtime};

#[derive(Debug, Clone)]
pub enum Node {
    File {
        content: Vec<u8>,
        exec: bool,
        mtime: i64,
    },
    Link(String),
    Dir(BTreeMap<String, Node>),
}

pub fn name() -> impl Strategy<Value = String> {
    "[a-z0-9é _.-]{1,12}".prop_filter("not . or .. or a name left out by default", |s| {
        s != "."
            && s != ".."
            // macOS litter: AppleDouble files, FSEvents' directory.
            && !s.starts_with("._")
            && s != ".fseventsd"
            && !s.starts_with(".env")
            && !s.ends_with(".key")
            && !s.ends_with(".pem")
            && !s.ends_with(".p12")
            && !s.ends_with(".pfx")
    })
}

pub fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        4 => (prop::collection::vec(any::<u8>(), 0..3000), any::<bool>(), 0i64..4_000_000_000_000_000_000)
            .prop_map(|(content, exec, mtime)| Node::File { content, exec, mtime }),
        1 => "[a-z./]{1,20}".prop_map(Node::Link),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop::collection::btree_map(name(), inner, 0..6).prop_map(Node::Dir)
    })
}

/// Children keyed by collision key, so no two names collide on APFS.
pub fn build(dir: &Path, children: &BTreeMap<String, Node>) {
    fs::create_dir_all(dir).unwrap();
    let mut seen = std::collections::HashSet::new();
    for (n, child) in children {
        if !seen.insert(sessionfs::api::collision_key(n).into_owned()) {
            continue;
        }
        let p = dir.join(n);
        match child {
            Node::File {
                content,
                exec,
                mtime,
            } => {
                fs::write(&p, content).unwrap();
                chmod(&p, if *exec { 0o755 } else { 0o644 });
                set_mtime(&p, *mtime);
            }
            Node::Link(t) => std::os::unix::fs::symlink(t, &p).unwrap(),
            Node::Dir(c) => build(&p, c),
        }
    }
}
