//! Packets are plain tar: GNU tar, bsdtar and Python's tarfile list and
//! extract them with the same paths and bytes as `sessionfs unpack`.
//! (`make test` installs bsdtar; a missing tool fails the test.)

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use common::*;

fn tree(root: &Path) {
    sample_tree(root);
    let long_dir = "d".repeat(150);
    write(
        root,
        &format!("{long_dir}/{}", "f".repeat(130)),
        b"long path\n",
    );
    write(
        root,
        &format!("{}/{}/x", "a".repeat(100), "b".repeat(50)),
        b"split\n",
    );
    write(root, "sp ace/quo\"te/\u{e9}\u{301}t\u{e9}", b"names\n");
    symlink("t".repeat(300), root.join("long-target")).unwrap();
    symlink("/usr/bin/python3", root.join("external")).unwrap();
}

fn listing(cmd: &mut Command) -> Vec<String> {
    let out = succeed(cmd);
    let mut names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim_end_matches('/').to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn gnu_tar_bsdtar_and_python_agree_with_unpack() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    tree(&ws);
    let p = tmp.path().join("p.packet");
    pack(&ws, &p, &[]);
    let ours = tmp.path().join("ours");
    unpack(&p, &ours, &[]);
    let want = snapshot(&ours.join("workspace"));
    assert!(want.len() > 15);

    let mut expected_names: Vec<String> = want
        .iter()
        .map(|(rel, _)| format!("workspace/{rel}"))
        .collect();
    expected_names.extend(["packet.json".to_owned(), "workspace".to_owned()]);
    expected_names.sort();

    let py_list =
        "import sys,tarfile\nfor m in tarfile.open(sys.argv[1]).getmembers(): print(m.name)";
    let py_extract =
        "import sys,tarfile\ntarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')";
    let tools: [(&str, Vec<&str>, Vec<&str>); 3] = [
        ("gnu-tar", vec!["tar", "-tf"], vec!["tar", "-xf"]),
        ("bsdtar", vec!["bsdtar", "-tf"], vec!["bsdtar", "-xf"]),
        (
            "python",
            vec!["python3", "-c", py_list],
            vec!["python3", "-c", py_extract],
        ),
    ];
    for (name, list, extract) in tools {
        let mut cmd = Command::new(list[0]);
        cmd.args(&list[1..]).arg(&p);
        assert_eq!(
            listing(&mut cmd),
            expected_names,
            "{name} lists other paths"
        );
        let dir = tmp.path().join(name);
        fs::create_dir(&dir).unwrap();
        let mut cmd = Command::new(extract[0]);
        cmd.args(&extract[1..]).arg(&p);
        if name == "python" {
            cmd.arg(&dir);
        } else {
            cmd.arg("-C").arg(&dir);
        }
        let st = cmd.status().unwrap();
        assert!(st.success(), "{name} failed to extract");
        assert_eq!(
            snapshot(&dir.join("workspace")),
            want,
            "{name} extracts other bytes"
        );
        // Tar tools restore whole seconds of the recorded mtime.
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(dir.join("workspace/README.md")).unwrap();
        assert_eq!(m.mtime(), 1_700_000_000, "{name}");
    }
}
