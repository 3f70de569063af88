//! [`State::apply`], record by record, over the golden packet's workspace
//! (no kernel, no upper directory: the records as a journal holds them).

use super::*;
use crate::overlay::journal;

/// The lower layer of `tests/golden/small.packet`, its workspace part as
/// the root, and the state over it before any record.
fn fresh() -> (Arc<Lower>, State) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/small.packet");
    let packet = Packet::open(
        std::path::Path::new(path),
        &crate::packet::format::Limits::DEFAULT,
    )
    .unwrap();
    let opts = crate::overlay::Options {
        uid: 0,
        gid: 0,
        part: Some(crate::packet::path::Part::Workspace),
    };
    let (lower, inos) = crate::overlay::new_lower(packet, opts, &Default::default(), &[]).unwrap();
    let lower = Arc::new(lower);
    let state = State::new(lower.clone(), inos);
    (lower, state)
}

/// The records of journal `lines` (one JSON object per line).
fn records(lines: &str) -> Vec<Record> {
    let lines = format!("{}\n", lines.trim_end());
    let parsed = journal::parse(lines.as_bytes()).unwrap();
    assert_eq!(parsed.valid_len, lines.len(), "a whole journal");
    parsed.records
}

/// The state after applying `lines`, or the first refusal's reason.
fn replayed(lines: &str) -> std::result::Result<(Arc<Lower>, State), String> {
    let (lower, mut st) = fresh();
    for rec in records(lines) {
        match st.apply_replayed(&lower, &rec) {
            Ok(_) => {}
            Err(Error::Replay { reason, .. }) => return Err(reason),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((lower, st))
}

/// The names listed in directory `dir`.
fn names(lower: &Lower, st: &State, dir: Ino) -> Vec<String> {
    let mut v: Vec<String> = st
        .list(lower, dir)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n.into())
        .collect();
    v.sort();
    v
}

fn child(lower: &Lower, st: &State, dir: Ino, name: &str) -> Option<Ino> {
    st.child(lower, dir, name).unwrap()
}

#[test]
fn mknode_links_a_new_file_with_its_data_file_and_a_new_directory() {
    let (lower, st) = replayed(
        r#"{"op":"mknode","t":5,"ino":900001,"generation":1,"parent":1,"name":"new.txt","kind":"file","perm":420,"uid":0,"gid":0,"data":7}
{"op":"mknode","t":6,"ino":900002,"generation":1,"parent":1,"name":"sub","kind":"dir","perm":493,"uid":0,"gid":0}
"#,
    )
    .unwrap();
    let file = child(&lower, &st, ROOT, "new.txt").unwrap();
    assert_eq!(file, 900001);
    assert!(matches!(st.nodes[&file].content, Content::Upper(7)));
    assert_eq!(
        st.next_data, 8,
        "the next data file comes after the ones used"
    );
    let root = &st.nodes[&ROOT];
    assert_eq!((root.mtime, root.ctime), (6, 6), "the last change's time");
    let sub = child(&lower, &st, ROOT, "sub").unwrap();
    assert_eq!(st.kind(&lower, sub), Some(Kind::Dir));
    assert!(st.is_empty_dir(&lower, sub).unwrap());
    assert_eq!(st.applied, 2);
}

#[test]
fn unlink_of_a_lower_name_is_a_whiteout() {
    let (lower, mut st) = fresh();
    let readme = child(&lower, &st, ROOT, "README.md").unwrap();
    let rec = &records(r#"{"op":"unlink","t":9,"parent":1,"name":"README.md"}"#)[0];
    let applied = st.apply(&lower, rec).unwrap();
    assert_eq!(applied.unlinked, Some(readme));
    assert_eq!(child(&lower, &st, ROOT, "README.md"), None);
    assert!(!names(&lower, &st, ROOT).contains(&"README.md".to_owned()));
}

#[test]
fn a_renamed_lower_directory_keeps_its_lower_children() {
    let (lower, st) = replayed(
        r#"{"op":"rename","t":3,"parent":1,"name":"bin","newparent":1,"newname":"tools"}"#,
    )
    .unwrap();
    assert_eq!(child(&lower, &st, ROOT, "bin"), None);
    let tools = child(&lower, &st, ROOT, "tools").unwrap();
    assert_eq!(names(&lower, &st, tools), ["tool"]);
}

#[test]
fn rename_exchange_swaps_two_names() {
    let (lower, before) = fresh();
    let (link, empty) = (
        child(&lower, &before, ROOT, "link").unwrap(),
        child(&lower, &before, ROOT, "empty").unwrap(),
    );
    let (lower, st) = replayed(
        r#"{"op":"rename","t":3,"parent":1,"name":"link","newparent":1,"newname":"empty","exchange":true}"#,
    )
    .unwrap();
    assert_eq!(child(&lower, &st, ROOT, "link"), Some(empty));
    assert_eq!(child(&lower, &st, ROOT, "empty"), Some(link));
}

#[test]
fn link_gives_a_lower_file_a_second_name() {
    let (lower, before) = fresh();
    let readme = child(&lower, &before, ROOT, "README.md").unwrap();
    let (lower, st) = replayed(&format!(
        r#"{{"op":"link","t":4,"ino":{readme},"parent":1,"name":"again.md"}}"#
    ))
    .unwrap();
    assert_eq!(child(&lower, &st, ROOT, "again.md"), Some(readme));
    assert_eq!(st.nodes[&readme].nlink, 2);
}

#[test]
fn setattr_and_copy_up_change_only_what_they_name() {
    let (lower, before) = fresh();
    let tool = child(&lower, &before, ROOT, "bin")
        .and_then(|bin| child(&lower, &before, bin, "tool"))
        .unwrap();
    let (_, st) = replayed(&format!(
        "{{\"op\":\"setattr\",\"t\":8,\"ino\":{tool},\"perm\":448,\"mtime\":77}}\n\
         {{\"op\":\"copy_up\",\"t\":9,\"ino\":{tool},\"data\":3}}\n"
    ))
    .unwrap();
    let n = &st.nodes[&tool];
    // A copy-up is no change the user sees: the ctime is the setattr's.
    assert_eq!((n.perm, n.mtime, n.ctime), (0o700, 77, 8));
    assert!(matches!(n.content, Content::Upper(3)));
    assert!(n.lower.is_some(), "still the lower entry's inode");
}

#[test]
fn records_that_do_not_apply_are_refused_with_their_reason() {
    let mk = |name: &str, ino: u64, data: &str| {
        format!(
            r#"{{"op":"mknode","t":1,"ino":{ino},"generation":1,"parent":1,"name":"{name}","kind":"file","perm":420,"uid":0,"gid":0{data}}}"#
        )
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "create over a lower name",
            mk("README.md", 900001, r#","data":1"#),
            "create over an existing name",
        ),
        (
            "a file without a data file",
            mk("x", 900001, ""),
            "file without a data file",
        ),
        (
            "a number used twice",
            format!(
                "{}\n{}",
                mk("a", 900001, r#","data":1"#),
                mk("b", 900001, r#","data":2"#)
            ),
            "a number another entry has",
        ),
        (
            "unlink of a name that is not there",
            r#"{"op":"unlink","t":1,"parent":1,"name":"nothing"}"#.into(),
            "unlink of a missing name",
        ),
        (
            "link over a name",
            format!(
                "{}\n{}",
                mk("a", 900001, r#","data":1"#),
                r#"{"op":"link","t":1,"ino":900001,"parent":1,"name":"empty"}"#
            ),
            "link over an existing name",
        ),
    ];
    for (what, lines, want) in cases {
        let got = replayed(&lines).err().unwrap_or_default();
        assert!(got.contains(want), "{what}: {got:?}, want {want:?}");
    }
}
