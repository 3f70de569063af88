//! `unpack --tar`: a packet's part as a `.`-rooted tar stream, verified as
//! it is written (issue 35). Read back by GNU tar, bsdtar and Python's
//! `tarfile`; the Agents SDK's own extractor is run on it by python/tests.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

/// A tree with what a stream must carry: a file over two chunks, an
/// executable, nanosecond mtimes, a name and a target past ustar's 100
/// bytes, links, an empty directory.
fn tree(root: &Path) {
    sample_tree(root);
    let big: Vec<u8> = (0..(9 * 1024 * 1024 + 5) as u32)
        .map(|i| (i.wrapping_mul(2246822519) >> 20) as u8)
        .collect();
    write(root, "data/huge.bin", &big);
    set_mtime(&root.join("data/huge.bin"), 1_600_000_000_000_000_001);
    let long = format!("deep/{}/{}.txt", "d".repeat(120), "n".repeat(90));
    write(root, &long, b"long name\n");
    std::os::unix::fs::symlink(
        format!("../{}", "t".repeat(150)),
        root.join("deep/longlink"),
    )
    .unwrap();
    std::os::unix::fs::symlink("../README.md", root.join("src/up")).unwrap();
}

/// `sessionfs unpack ARGS…` with stdout to a file; (exit code, the JSON
/// object on stdout, or on stderr's last line with `--tar -`, the file).
fn unpack_tar(packet: &Path, out: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args: Vec<String> = vec!["unpack".into(), packet.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let stdout = fs::File::create(out).unwrap();
    let o = Command::new(bin())
        .args(&args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8(o.stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    let json: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("stderr's last line is not JSON ({e}): {stderr}"));
    (o.status.code().unwrap_or(-1), json)
}

/// The offset of the content of `member` in the packet.
fn content_offset(packet: &Path, member: &str) -> u64 {
    python(
        "import sys, tarfile\n\
         for m in tarfile.open(sys.argv[1]).getmembers():\n    \
         if m.name == sys.argv[2]: print(m.offset_data)",
        &[packet.as_os_str(), member.as_ref()],
    )
    .parse()
    .unwrap()
}

fn flip(packet: &Path, at: u64) -> PathBuf {
    use std::os::unix::fs::FileExt;
    let bad = packet.with_extension(format!("bad{at}"));
    fs::copy(packet, &bad).unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&bad)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    bad
}

/// How each reader takes `archive`: extracted into a fresh directory by
/// GNU tar, bsdtar, and Python's `tarfile` (`extractall`, which reads
/// every member); whether each succeeded.
fn readers(archive: &Path, tmp: &Path) -> [(&'static str, bool); 3] {
    let mut out = [
        ("gnu tar", false),
        ("bsdtar", false),
        ("python tarfile", false),
    ];
    for (k, (name, ok)) in out.iter_mut().enumerate() {
        let dir = tmp.join(format!(
            "x-{k}-{}",
            archive.file_name().unwrap().to_string_lossy()
        ));
        fs::create_dir_all(&dir).unwrap();
        let status = match *name {
            "gnu tar" => Command::new("tar")
                .arg("-xf")
                .arg(archive)
                .arg("-C")
                .arg(&dir)
                .stderr(Stdio::null())
                .status(),
            "bsdtar" => Command::new("bsdtar")
                .arg("-xf")
                .arg(archive)
                .arg("-C")
                .arg(&dir)
                .stderr(Stdio::null())
                .status(),
            _ => Command::new("python3")
                .arg("-c")
                .arg("import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])")
                .arg(archive)
                .arg(&dir)
                .stderr(Stdio::null())
                .status(),
        };
        *ok = status.unwrap().success();
    }
    out
}

#[test]
fn a_part_as_a_tar_stream_extracts_to_what_unpack_restores() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    tree(&ws);
    let packet = tmp.path().join("s.packet");
    let packed = pack(&ws, &packet, &[]);
    let into = tmp.path().join("into");
    unpack(&packet, &into, &["--part", "workspace"]);

    let file = tmp.path().join("ws.tar");
    let r = run([
        "unpack".as_ref(),
        packet.as_os_str(),
        "--part".as_ref(),
        "workspace".as_ref(),
        "--tar".as_ref(),
        file.as_os_str(),
    ]);
    let result = r.ok();
    assert_eq!(result["schema"], "sessionfs.unpack-result/1");
    assert_eq!(result["digest"], packed["digest"]);
    assert_eq!(result["tar_bytes"], fs::metadata(&file).unwrap().len());
    assert_eq!(result["files"], packed["files"]);
    // Every entry of the part, and the root `./` (the part's own entry).
    assert_eq!(result["entries"], packed["entries"]);

    // To stdout: the same bytes, the result on stderr's last line.
    let piped = tmp.path().join("piped.tar");
    let (code, json) = unpack_tar(&packet, &piped, &["--part", "workspace", "--tar", "-"]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["tar"], "-");
    assert_eq!(fs::read(&piped).unwrap(), fs::read(&file).unwrap());

    // `.`-rooted, parents first, directories with their `/`.
    let listing = python(
        "import sys, tarfile\n\
         print('\\n'.join(m.name + ('/' if m.isdir() else '') for m in tarfile.open(sys.argv[1])))",
        &[file.as_os_str()],
    );
    let names: Vec<&str> = listing.lines().collect();
    assert_eq!(names[0], "./", "{listing}");
    assert!(
        names[1..]
            .iter()
            .all(|n| n.starts_with("./") && n.len() > 2),
        "{listing}"
    );

    for (k, (reader, ok)) in readers(&file, tmp.path()).into_iter().enumerate() {
        assert!(ok, "{reader} refused the stream");
        let dir = tmp.path().join(format!("x-{k}-ws.tar"));
        assert_eq!(snapshot(&dir), snapshot(&into), "{reader}");
    }
    // GNU tar restores the mtimes to the nanosecond (PAX `mtime`).
    let x = tmp.path().join("x-0-ws.tar");
    for rel in ["README.md", "data/big.bin", "data/huge.bin", "bin/run.sh"] {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (
            fs::metadata(into.join(rel)).unwrap(),
            fs::metadata(x.join(rel)).unwrap(),
        );
        assert_eq!(
            (a.mtime(), a.mtime_nsec()),
            (b.mtime(), b.mtime_nsec()),
            "{rel}"
        );
    }
}

#[test]
fn the_whole_packet_streams_under_workspace_and_harness() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let home = tmp.path().join("home");
    model_tree(&ws);
    write(&home, "history.jsonl", b"{}\n");
    let packet = tmp.path().join("s.packet");
    run([
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "--harness".as_ref(),
        home.as_os_str(),
        "--harness-kind".as_ref(),
        "generic".as_ref(),
        "-o".as_ref(),
        packet.as_os_str(),
    ])
    .ok();
    let file = tmp.path().join("all.tar");
    run([
        "unpack".as_ref(),
        packet.as_os_str(),
        "--tar".as_ref(),
        file.as_os_str(),
    ])
    .ok();
    let into = tmp.path().join("into");
    unpack(&packet, &into, &[]);
    assert!(readers(&file, tmp.path())[0].1);
    assert_eq!(snapshot(&tmp.path().join("x-0-all.tar")), snapshot(&into));
    // A part the packet lacks is refused before anything is written.
    let bare = tmp.path().join("bare.packet");
    pack(&ws, &bare, &[]);
    let out = tmp.path().join("h.tar");
    run([
        "unpack".as_ref(),
        bare.as_os_str(),
        "--part".as_ref(),
        "harness".as_ref(),
        "--tar".as_ref(),
        out.as_os_str(),
    ])
    .fails(7, "part_missing");
    assert!(!out.exists());
}

/// Tampered anywhere (a small file, the first, a middle or the last chunk
/// of a large one, a header, the end marker), the stream never ends as a
/// complete archive: every reader refuses what was written, the exit code
/// is the refusal's, and `--tar FILE` leaves nothing at FILE. (Without the
/// mark that ends a stream cut between members, GNU tar and Python's
/// `tarfile` take such a stream for complete: the test fails then, at the
/// small file.)
#[test]
fn a_tampered_packet_never_gives_a_complete_looking_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    tree(&ws);
    let packet = tmp.path().join("s.packet");
    pack(&ws, &packet, &[]);
    let readme = content_offset(&packet, "workspace/README.md");
    let huge = content_offset(&packet, "workspace/data/huge.bin");
    let len = fs::metadata(&packet).unwrap().len();
    let chunk = 4 * 1024 * 1024;
    let cases = [
        ("a small file", readme, "content_mismatch"),
        ("the first chunk", huge + 10, "content_mismatch"),
        ("a middle chunk", huge + chunk + 10, "content_mismatch"),
        ("the last chunk", huge + 2 * chunk + 2, "content_mismatch"),
        ("a header", readme - 512 + 1, "bad_header_checksum"),
        ("the end marker", len - 10, "bad_end_marker"),
    ];
    for (what, at, kind) in cases {
        let bad = flip(&packet, at);
        let streamed = tmp.path().join(format!("streamed-{at}.tar"));
        let (code, json) = unpack_tar(&bad, &streamed, &["--part", "workspace", "--tar", "-"]);
        assert_eq!(
            (code, json["kind"].as_str()),
            (3, Some(kind)),
            "{what}: {json}"
        );
        for (reader, ok) in readers(&streamed, tmp.path()) {
            assert!(!ok, "{what}: {reader} took the stream for complete");
        }
        let file = tmp.path().join(format!("file-{at}.tar"));
        run([
            "unpack".as_ref(),
            bad.as_os_str(),
            "--part".as_ref(),
            "workspace".as_ref(),
            "--tar".as_ref(),
            file.as_os_str(),
        ])
        .fails(3, kind);
        assert!(!file.exists(), "{what}");
        assert_eq!(
            names_in(tmp.path(), |n| n.ends_with(".tmp")),
            Vec::<String>::new()
        );
    }
}

#[test]
fn strict_symlinks_refuse_a_target_whose_text_climbs_out() {
    // `s -> a/b`: `l -> s/../..` resolves to the root, but its text climbs
    // above it, which tar extractors that check links refuse.
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir_all(ws.join("a/b")).unwrap();
    std::os::unix::fs::symlink("a/b", ws.join("s")).unwrap();
    std::os::unix::fs::symlink("s/../..", ws.join("l")).unwrap();
    let packet = tmp.path().join("s.packet");
    let packed = pack(&ws, &packet, &[]);
    assert_eq!(packed["external_symlinks"][0]["path"], "workspace/l");
    let out = tmp.path().join("ws.tar");
    let r = run([
        "unpack".as_ref(),
        packet.as_os_str(),
        "--part".as_ref(),
        "workspace".as_ref(),
        "--strict-symlinks".as_ref(),
        "--tar".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(r.fails(3, "symlink_escapes")["path"], "workspace/l");
    assert!(!out.exists());
    // As for a tree.
    run([
        "unpack".as_ref(),
        packet.as_os_str(),
        "--part".as_ref(),
        "workspace".as_ref(),
        "--strict-symlinks".as_ref(),
        "--into".as_ref(),
        tmp.path().join("into").as_os_str(),
    ])
    .fails(3, "symlink_escapes");
}

#[test]
fn the_output_file_is_checked_before_and_replaced_only_when_it_may_be() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    model_tree(&ws);
    let packet = tmp.path().join("s.packet");
    pack(&ws, &packet, &[]);
    let tar_to = |out: &Path| {
        run([
            "unpack".as_ref(),
            packet.as_os_str(),
            "--part".as_ref(),
            "workspace".as_ref(),
            "--tar".as_ref(),
            out.as_os_str(),
        ])
    };
    let notes = tmp.path().join("notes.txt");
    fs::write(&notes, "keep me").unwrap();
    tar_to(&notes).fails(7, "target_unusable");
    assert_eq!(fs::read_to_string(&notes).unwrap(), "keep me");
    tar_to(tmp.path()).fails(7, "target_unusable");
    tar_to(&tmp.path().join("nowhere/x.tar")).fails(7, "target_unusable");
    // An older tar is replaced.
    let old = tmp.path().join("old.tar");
    sh(tmp.path(), "tar -cf old.tar ws");
    tar_to(&old).ok();
    assert!(tar_listing(&old).contains("./README.md"));
    // `--tar` with `--into`, or with `--uid`: usage errors.
    let r = run([
        "unpack".as_ref(),
        packet.as_os_str(),
        "--into".as_ref(),
        tmp.path().join("i").as_os_str(),
        "--tar".as_ref(),
        old.as_os_str(),
    ]);
    r.fails(2, "usage");
    // A usage error of a run asked for `--tar -` goes to stderr too.
    let (code, json) = unpack_tar(
        &packet,
        &tmp.path().join("u"),
        &["--tar", "-", "--uid", "1"],
    );
    assert_eq!((code, json["kind"].as_str()), (2, Some("usage")), "{json}");
    assert_eq!(fs::metadata(tmp.path().join("u")).unwrap().len(), 0);
}

/// A reader that goes away ends the run with an `io` error (exit 6),
/// never a success or a hang.
#[test]
fn a_reader_that_closes_the_pipe_ends_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    tree(&ws);
    let packet = tmp.path().join("s.packet");
    pack(&ws, &packet, &[]);
    let mut child = Command::new(bin())
        .args([
            "unpack".as_ref(),
            packet.as_os_str(),
            "--tar".as_ref(),
            "-".as_ref(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = [0u8; 1024];
    std::io::Read::read_exact(&mut stdout, &mut head).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let json: Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(
        (out.status.code(), json["kind"].as_str()),
        (Some(6), Some("io")),
        "{stderr}"
    );
    assert_eq!(json["path"], "-");
}
