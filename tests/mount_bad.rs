//! Bad input at mount: refused before anything is mounted, with the strict
//! reader's error kind; tampered content fails exactly the reads that touch
//! it; a hostile upper directory cannot make the daemon follow a symlink.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;

const CHUNK: usize = 4 * 1024 * 1024;

fn setup() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let big: Vec<u8> = (0..(3 * CHUNK) as u32).map(|i| (i % 251) as u8).collect();
    write(&ws, "big.bin", &big);
    write(&ws, "small.txt", b"small\n");
    let p = packet_of(&ws, tmp.path(), "p", &[]);
    (tmp, p, big)
}

fn is_mounted(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .map(|_| sessionfs::api::is_fuse_path(p))
        .unwrap_or(true)
}

/// Offset of `name`'s content in the packet.
fn data_offset(packet: &[u8], name: &str) -> usize {
    let mut at = 0;
    loop {
        let h = tar::Header::from_byte_slice(&packet[at..at + 512]);
        let size = h.entry_size().unwrap() as usize;
        if h.path_bytes().as_ref() == name.as_bytes() {
            return at + 512;
        }
        at += 512 + size.next_multiple_of(512);
    }
}

/// Mounts (part workspace) a copy of packet `p` whose byte `at` of
/// big.bin's content is xored with `flip`.
fn mount_tampered(tmp: &Path, p: &Path, at: usize, flip: u8) -> Mounted {
    let mut bytes = fs::read(p).unwrap();
    let at = data_offset(&bytes, "workspace/big.bin") + at;
    bytes[at] ^= flip;
    let bad = tmp.join("tampered.packet");
    fs::write(&bad, &bytes).unwrap();
    mount_workspace(tmp, &bad)
}

/// Mounts part workspace of packet `p` at `tmp`/mnt with upper `tmp`/upper.
fn mount_workspace(tmp: &Path, p: &Path) -> Mounted {
    Mounted::new(
        p,
        &tmp.join("mnt"),
        &tmp.join("upper"),
        &["--part", "workspace"],
    )
}

/// Mounts the workspace, writes `new.txt` (its content in the one data
/// file) and unmounts: the packet, mountpoint, upper directory and that
/// data file.
fn upper_with_one_data_file() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf, PathBuf) {
    let (tmp, p, _) = setup();
    let m = mount_workspace(tmp.path(), &p);
    fs::write(m.path("new.txt"), b"mine").unwrap();
    let (mnt, upper) = (m.mnt.clone(), m.upper.clone());
    m.umount();
    let data = data_files(&upper).pop().unwrap();
    (tmp, p, mnt, upper, data)
}

#[track_caller]
/// Mounting `packet` at `mnt` over `upper` fails with `code` and `kind`,
/// naming a path and mounting nothing; returns the error.
fn mount_fails(
    packet: &Path,
    mnt: &Path,
    upper: &Path,
    extra: &[&str],
    code: i32,
    kind: &str,
) -> serde_json::Value {
    // (Where a dead mount is, the directory cannot even be looked at.)
    let _ = fs::create_dir_all(mnt);
    let mut args = vec![
        "mount".to_string(),
        packet.display().to_string(),
        mnt.display().to_string(),
        "--upper".into(),
        upper.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let e = run(&args);
    // Every refusal but a bad command line names what is at fault: the
    // packet file, the mountpoint, the upper directory or an entry.
    let path = e.fails(code, kind)["path"].as_str().unwrap_or_default();
    assert!(code == 2 || !path.is_empty(), "{:#}", e.json);
    assert!(
        !is_mounted(mnt) || kind == "already_mounted",
        "{} was mounted although mount failed",
        mnt.display()
    );
    e.json
}

#[test]
fn refused_packets_are_never_mounted() {
    // "mounting a tampered, truncated, future-version or wrong-digest packet
    // fails before the mount appears, with the strict reader's error kind."
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let bytes = fs::read(&p).unwrap();
    let mnt = tmp.path().join("mnt");
    let upper = tmp.path().join("upper");
    let write_bad = |name: &str, b: &[u8]| {
        let q = tmp.path().join(name);
        fs::write(&q, b).unwrap();
        q
    };
    let truncated = write_bad("trunc.packet", &bytes[..bytes.len() - 512]);
    mount_fails(&truncated, &mnt, &upper, &[], 3, "truncated");
    let mut long = bytes.clone();
    long.extend([0u8; 512]);
    mount_fails(
        &write_bad("long.packet", &long),
        &mnt,
        &upper,
        &[],
        3,
        "trailing_bytes",
    );
    // A future version (manifest edited, header re-made).
    let size = tar::Header::from_byte_slice(&bytes[..512])
        .entry_size()
        .unwrap() as usize;
    let text = String::from_utf8(bytes[512..512 + size].to_vec())
        .unwrap()
        .replacen("packet/2", "packet/3", 1);
    let mut v2 = sessionfs::api::manifest_header(text.len() as u64).to_vec();
    v2.extend(text.as_bytes());
    v2.resize(v2.len().next_multiple_of(512), 0);
    v2.extend(&bytes[512 + size.next_multiple_of(512)..]);
    mount_fails(
        &write_bad("v2.packet", &v2),
        &mnt,
        &upper,
        &[],
        4,
        "unsupported_schema",
    );
    let mut bad_manifest = bytes.clone();
    bad_manifest[520] = b' ';
    mount_fails(
        &write_bad("manifest.packet", &bad_manifest),
        &mnt,
        &upper,
        &[],
        3,
        "manifest_syntax",
    );
    let wrong = format!("sha256:{}", "1".repeat(64));
    mount_fails(
        &p,
        &mnt,
        &upper,
        &["--digest", &wrong],
        3,
        "digest_mismatch",
    );
    mount_fails(
        &tmp.path().join("missing.packet"),
        &mnt,
        &upper,
        &[],
        6,
        "io",
    );
    assert!(
        !upper.exists()
            || fs::read_dir(&upper).unwrap().count() == 0
            || upper.join("sessionfs-upper.json").exists()
    );
}

#[test]
fn tampered_chunks_fail_exactly_the_reads_that_touch_them() {
    // "A tampered chunk makes exactly the reads that touch it fail with EIO";
    // "never returns unverified bytes to a reader".
    if !fuse_available() {
        return;
    }
    let (tmp, p, big) = setup();
    let m = mount_tampered(tmp.path(), &p, CHUNK + 12345, 0x55);
    let mut f = fs::File::open(m.path("big.bin")).unwrap();
    let read_at = |f: &mut fs::File, off: usize, len: usize| -> std::io::Result<Vec<u8>> {
        f.seek(SeekFrom::Start(off as u64))?;
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf)?;
        Ok(buf)
    };
    assert_eq!(read_at(&mut f, 100, 4096).unwrap(), &big[100..4196]);
    assert_eq!(
        read_at(&mut f, 2 * CHUNK + 7, 4096).unwrap(),
        &big[2 * CHUNK + 7..2 * CHUNK + 7 + 4096]
    );
    for _ in 0..2 {
        let e = read_at(&mut f, CHUNK + 4096, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }
    // A read ending just before the bad chunk still succeeds.
    assert_eq!(
        read_at(&mut f, CHUNK - 4096, 4096).unwrap(),
        &big[CHUNK - 4096..CHUNK]
    );
    assert_eq!(fs::read(m.path("small.txt")).unwrap(), b"small\n");
    // Copy-up verifies too: the first write (which copies the file up)
    // fails, and the upper directory gets no copy of bad bytes.
    let mut w = fs::OpenOptions::new()
        .append(true)
        .open(m.path("big.bin"))
        .unwrap();
    let e = w.write_all(b"more").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    drop(w);
    assert_eq!(data_files(&m.upper), Vec::<PathBuf>::new());
    drop(f);
    m.umount();
}

#[test]
fn a_random_4k_read_hashes_at_most_one_chunk() {
    // "A 4 KiB read from the middle of a 1 GiB file hashes at most one chunk."
    if !fuse_available() {
        return;
    }
    let (tmp, p, big) = setup();
    let m = mount_workspace(tmp.path(), &p);
    let mut f = fs::File::open(m.path("big.bin")).unwrap();
    f.seek(SeekFrom::Start((CHUNK + CHUNK / 2) as u64)).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, &big[CHUNK + CHUNK / 2..CHUNK + CHUNK / 2 + 4096]);
    let verified = m.status()["verified_bytes"].as_u64().unwrap();
    // Kernel readahead may pull in the next chunk; never the whole file.
    assert!(
        verified >= CHUNK as u64 && verified <= 2 * CHUNK as u64,
        "hashed {verified} bytes"
    );
    drop(f);
    m.umount();
}

/// Polls the mount's `verified_bytes` until it reaches `want` (or 10 s
/// pass), then returns it.
fn verified_reaches(m: &Mounted, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let v = m.status()["verified_bytes"].as_u64().unwrap();
        if v >= want || std::time::Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_sequential_reader_gets_the_next_chunk_verified_ahead() {
    // A reader moving forward through a chunked file finds the next chunk
    // verified by another thread when it gets there; nothing further is
    // hashed, and no chunk is hashed twice.
    if !fuse_available() {
        return;
    }
    let (tmp, p, big) = setup();
    let m = mount_workspace(tmp.path(), &p);
    let mut f = fs::File::open(m.path("big.bin")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, &big[..1 << 20]);
    // Chunk 0 was read; chunk 1 gets verified without a read touching it.
    assert_eq!(verified_reaches(&m, 2 * CHUNK as u64), 2 * CHUNK as u64);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        m.status()["verified_bytes"].as_u64().unwrap(),
        2 * CHUNK as u64,
        "hashed past the chunk after the reader's"
    );
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, &big[1 << 20..]);
    assert_eq!(
        m.status()["verified_bytes"].as_u64().unwrap(),
        big.len() as u64,
        "a chunk was hashed twice"
    );
    drop(f);
    m.umount();
}

#[test]
fn a_tampered_chunk_verified_ahead_still_fails_the_reader_there() {
    // Verifying ahead of a reader never marks a bad chunk good: a
    // sequential reader gets every byte before the tampered chunk and EIO
    // at its first byte.
    if !fuse_available() {
        return;
    }
    let (tmp, p, big) = setup();
    let m = mount_tampered(tmp.path(), &p, CHUNK + 999, 0x01);
    let mut f = fs::File::open(m.path("big.bin")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = Vec::new();
    let err = loop {
        match f.read(&mut buf) {
            Ok(0) => panic!("read the whole tampered file"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(got.len(), CHUNK, "bytes returned before the tampered chunk");
    assert_eq!(got, &big[..CHUNK]);
    assert_eq!(
        m.status()["verified_bytes"].as_u64().unwrap() % CHUNK as u64,
        0
    );
    drop(f);
    m.umount();
}

#[test]
fn upper_directories_and_mountpoints_are_checked() {
    // "upper belonging to another packet"; "mountpoint not empty"; an upper
    // directory in use by another mount.
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let other_ws = tmp.path().join("other");
    write(&other_ws, "x", b"x");
    let other = packet_of(&other_ws, tmp.path(), "other", &[]);
    let upper = tmp.path().join("upper");
    let m = Mounted::new(&p, &tmp.path().join("mnt"), &upper, &[]);
    mount_fails(
        &p,
        &tmp.path().join("mnt2"),
        &upper,
        &[],
        7,
        "upper_refused",
    );
    m.umount();
    mount_fails(
        &other,
        &tmp.path().join("mnt3"),
        &upper,
        &[],
        7,
        "upper_mismatch",
    );
    let busy = tmp.path().join("busy");
    write(&busy, "file", b"x");
    fs::create_dir_all(&busy).unwrap();
    let r = run([
        "mount",
        p.to_str().unwrap(),
        busy.to_str().unwrap(),
        "--upper",
        tmp.path().join("u4").to_str().unwrap(),
    ]);
    let hint = |r: &Run| r.json["hint"].as_str().unwrap().to_owned();
    r.fails(8, "mountpoint_not_empty");
    // Each refusal of a mountpoint says what to do about that one, not
    // to install fuse3.
    assert!(hint(&r).contains("empty directory"), "{}", hint(&r));
    let notdir = tmp.path().join("busy/file");
    let r = run([
        "mount",
        p.to_str().unwrap(),
        notdir.to_str().unwrap(),
        "--upper",
        tmp.path().join("u5").to_str().unwrap(),
    ]);
    r.fails(8, "mountpoint_unusable");
    assert!(hint(&r).contains("existing directory"), "{}", hint(&r));
    if fuse_available() {
        let m = Mounted::new(
            &p,
            &tmp.path().join("mnt-busy"),
            &tmp.path().join("u-busy"),
            &[],
        );
        // Refused with the hint that fixes it, no upper directory made.
        let already_mounted = |mnt: &Path, upper: &str| {
            let u = tmp.path().join(upper);
            let r = mount_fails(&p, mnt, &u, &[], 8, "already_mounted");
            let hint = r["hint"].as_str().unwrap();
            assert!(hint.contains("sessionfs umount"), "{r}");
            assert!(!u.exists());
        };
        already_mounted(&m.mnt, "u-busy2");
        // The mount there goes on serving.
        let served = m.status();
        assert!(served["upper"].is_string());
        assert_eq!(served["upper"], m.result["upper"]);
        m.umount();
        // A mount whose daemon was killed (it answers ENOTCONN or
        // ECONNABORTED): already mounted too, and `sessionfs umount`
        // detaches it, as the hint says.
        let dead = Mounted::new(
            &p,
            &tmp.path().join("mnt-dead"),
            &tmp.path().join("u-dead"),
            &[],
        );
        let pid = nix::unistd::Pid::from_raw(dead.result["pid"].as_i64().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        // Not by a stat of the mount: one answered before the daemon died
        // would keep the root's attributes cached.
        wait_for("the daemon to die", || {
            fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
        });
        let e = fs::metadata(&dead.mnt).unwrap_err();
        let errno = e.raw_os_error().unwrap();
        assert!([libc::ENOTCONN, libc::ECONNABORTED].contains(&errno), "{e}");
        already_mounted(&dead.mnt, "u-dead2");
        run(["umount", dead.mnt.to_str().unwrap()]).ok();
        let again = Mounted::new(&p, &dead.mnt, &tmp.path().join("u-dead"), &[]);
        again.umount();
    }
    // Not an upper directory at all.
    let random = tmp.path().join("random");
    write(&random, "something", b"x");
    mount_fails(
        &p,
        &tmp.path().join("mnt6"),
        &random,
        &[],
        7,
        "upper_refused",
    );
    // The upper directory inside the mountpoint, the mountpoint itself, or
    // around it: the mount would hide it. Nothing is created.
    let mnt7 = tmp.path().join("mnt7");
    for upper in [
        mnt7.join("up"),
        mnt7.clone(),
        tmp.path().to_owned(),
        mnt7.join("missing/../up"),
    ] {
        mount_fails(&p, &mnt7, &upper, &[], 7, "upper_refused");
        assert!(fs::read_dir(&mnt7).unwrap().next().is_none());
    }
    // More threads than descriptors allow: refused up front, not a daemon
    // that dies after the mount reported success.
    let u8 = tmp.path().join("u8");
    mount_fails(&p, &mnt7, &u8, &["--threads", "100000"], 2, "usage");
    assert!(!u8.exists());
    // A part the packet lacks: refused before the upper directory is made.
    mount_fails(&p, &mnt7, &u8, &["--part", "harness"], 7, "part_missing");
    assert!(!u8.exists());
}

#[test]
fn the_daemon_never_follows_symlinks_in_the_upper_directory() {
    // "Nothing in the upper directory ever makes the daemon follow a symlink
    // outside it."
    if !fuse_available() {
        return;
    }
    let (_tmp, p, mnt, upper, data) = upper_with_one_data_file();
    fs::remove_file(&data).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &data).unwrap();
    let m = Mounted::new(&p, &mnt, &upper, &["--part", "workspace"]);
    let r = fs::read(m.path("new.txt"));
    assert!(
        r.is_err(),
        "read through a symlinked data file: {:?}",
        r.map(|d| String::from_utf8_lossy(&d).into_owned())
    );
    m.umount();
    // The data directory itself replaced by a symlink: refused at mount.
    fs::rename(upper.join("data"), upper.join("data.real")).unwrap();
    std::os::unix::fs::symlink("/etc", upper.join("data")).unwrap();
    mount_fails(&p, &mnt, &upper, &["--part", "workspace"], 6, "io");
}

#[test]
fn a_lost_data_file_reads_as_absent_whether_or_not_its_shard_is_left() {
    // The journal names a data file the upper directory lost (a power cut,
    // a careless cleanup): reading the file fails with ENOENT, the same
    // with its shard directory gone too, and the mount serves the rest.
    if !fuse_available() {
        return;
    }
    let (_tmp, p, mnt, upper, data) = upper_with_one_data_file();
    fs::remove_file(&data).unwrap();
    for round in ["file gone", "shard gone"] {
        let m = Mounted::new(&p, &mnt, &upper, &["--part", "workspace"]);
        let r = fs::read(m.path("new.txt"));
        assert_eq!(
            r.as_ref().map_err(|e| e.raw_os_error()).err(),
            Some(Some(libc::ENOENT)),
            "{round}: {r:?}"
        );
        assert_eq!(
            fs::read(m.path("small.txt")).unwrap(),
            b"small\n",
            "{round}"
        );
        m.umount();
        fs::remove_dir(data.parent().unwrap()).ok();
    }
}

#[test]
fn a_damaged_journal_is_refused_naming_the_line() {
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let upper = tmp.path().join("upper");
    let m = Mounted::new(
        &p,
        &tmp.path().join("mnt"),
        &upper,
        &["--part", "workspace"],
    );
    fs::write(m.path("a"), b"a").unwrap();
    fs::write(m.path("b"), b"b").unwrap();
    let mnt = m.mnt.clone();
    m.umount();
    let journal = upper.join("journal");
    let text = fs::read_to_string(&journal).unwrap();
    let damaged = text.replacen("\"op\"", "\"oops\"", 1);
    fs::write(&journal, damaged).unwrap();
    let mount_again = || {
        run([
            "mount",
            p.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "--upper",
            upper.to_str().unwrap(),
            "--part",
            "workspace",
        ])
    };
    let r = mount_again();
    let e = r.fails(7, "upper_refused");
    assert!(e["message"].as_str().unwrap().contains("line 1"), "{e}");
    // A torn last line (a crash mid-append) is dropped, not refused.
    fs::write(&journal, format!("{text}{{\"op\":\"unl")).unwrap();
    let m = Mounted::new(&p, &mnt, &upper, &["--part", "workspace"]);
    assert_eq!(fs::read(m.path("b")).unwrap(), b"b");
    m.umount();
    assert_eq!(fs::read_to_string(&journal).unwrap(), text);
    // A record that parses but does not apply names the journal and the
    // record.
    let mut lines: Vec<&str> = text.lines().collect();
    let unlink = r#"{"op":"unlink","t":1,"parent":1,"name":"nothing"}"#;
    lines.push(unlink);
    fs::write(&journal, lines.join("\n") + "\n").unwrap();
    let r = mount_again();
    let e = r.fails(7, "upper_damaged");
    assert_eq!(e["path"], journal.to_str().unwrap(), "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains(": record ") && message.ends_with("unlink of a missing name"),
        "{e}"
    );
    // A new node given a number an entry has would show one file under
    // the other's name.
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let again = lines[0].replace("\"name\":\"a\"", "\"name\":\"c\"");
    assert_ne!(again, lines[0]);
    lines.push(again);
    fs::write(&journal, lines.join("\n") + "\n").unwrap();
    let r = mount_again();
    let e = r.fails(7, "upper_damaged");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.ends_with("a new node with a number another entry has"),
        "{e}"
    );
}

/// Drops the kernel's cached pages of `path` (a file on a mount), so that
/// the next read of it reaches the daemon.
fn uncache(path: &Path) {
    drop_cached_pages(&fs::File::open(path).unwrap());
}

#[test]
fn a_packet_changed_while_mounted_is_hashed_on_every_read_after() {
    // "When those move, the bits are forgotten and never set again": a
    // store through a shared mapping of the packet moves its times only
    // at a page's first store, so a chunk hashed after that store may
    // change later with nothing to show it. It must not be trusted then.
    if !fuse_available() {
        return;
    }
    let (tmp, p, big) = setup();
    let m = mount_workspace(tmp.path(), &p);
    let at = data_offset(&fs::read(&p).unwrap(), "workspace/big.bin") + 2 * CHUNK + 4096 + 5;
    let script = r#"
import os, mmap, sys, time
packet, at, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(packet, os.O_RDWR)
m = mmap.mmap(fd, 0)
def read():
    g = os.open(path, os.O_RDONLY)
    os.posix_fadvise(g, 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        return os.pread(g, 16, int(sys.argv[4])).hex()
    except OSError as e:
        return "errno %d" % e.errno
    finally:
        os.close(g)
m[at] = m[at]
time.sleep(0.2)
print(read())
time.sleep(0.2)
print(read())
before = os.fstat(fd)
m[at:at + 16] = bytes(16)
after = os.fstat(fd)
print(read())
print((before.st_mtime_ns, before.st_ctime_ns) == (after.st_mtime_ns, after.st_ctime_ns))
m[at:at + 16] = bytes.fromhex(sys.argv[5])
"#;
    let file_at = 2 * CHUNK + 4096 + 5;
    let want: String = big[file_at..file_at + 16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (at, file_at_s) = (at.to_string(), file_at.to_string());
    let big_path = m.path("big.bin");
    let out = python(
        script,
        &[
            p.as_os_str(),
            at.as_ref(),
            big_path.as_os_str(),
            file_at_s.as_ref(),
            want.as_ref(),
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    // Served while the bytes are right, hashed each time; then the store
    // that moved no time is caught by the hash.
    assert_eq!(lines[0], want, "{lines:?}");
    assert_eq!(lines[1], want, "{lines:?}");
    assert_eq!(lines[2], "errno 5", "{lines:?}");
    eprintln!("the store moved no time: {}", lines[3]);
    m.umount();
}

#[test]
fn a_packet_renamed_linked_or_removed_while_mounted_goes_on_serving() {
    // "When those move, the bits are forgotten and never set again: from
    // then on every read hashes the chunks it serves": a chmod, a hard
    // link, a rename or an unlink of the packet (which the daemon holds
    // open) moves its ctime only, and the mount and its seals go on; a
    // write is caught by the hashes.
    if !fuse_available() {
        return;
    }
    let (tmp, p, big) = setup();
    let m = mount_workspace(tmp.path(), &p);
    let read_all = |step: &str| {
        for (name, want) in [("big.bin", &big[..]), ("small.txt", b"small\n")] {
            uncache(&m.path(name));
            assert_eq!(fs::read(m.path(name)).unwrap(), want, "{step}: {name}");
        }
    };
    let verified = || m.status()["verified_bytes"].as_u64().unwrap();
    read_all("mounted");
    let whole = (big.len() + 6) as u64;
    let first = verified();
    assert!(first >= whole, "{first}");
    // Verified chunks are read again without hashing while nothing moves.
    read_all("again");
    assert_eq!(verified(), first);
    let linked = tmp.path().join("linked.packet");
    let moved = tmp.path().join("moved.packet");
    let mut seen = first;
    for step in ["chmod", "link", "rename"] {
        match step {
            "chmod" => fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap(),
            "link" => fs::hard_link(&p, &linked).unwrap(),
            _ => fs::rename(&p, &moved).unwrap(),
        }
        read_all(step);
        let now = verified();
        assert!(
            now >= seen + whole,
            "{step}: hashed again, {seen} then {now}"
        );
        seen = now;
    }
    // A write into big.bin's second chunk, its mtime put back: only the
    // chunk's hash shows it. The other file is still served.
    let mtime = fs::metadata(&moved).unwrap().modified().unwrap();
    let at = data_offset(&fs::read(&moved).unwrap(), "workspace/big.bin") + CHUNK + 7;
    let flip = |path: &Path| {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at as u64).unwrap();
        f.write_all_at(&[b[0] ^ 0x20], at as u64).unwrap();
        f.set_modified(mtime).unwrap();
    };
    flip(&linked);
    uncache(&m.path("big.bin"));
    let e = fs::read(m.path("big.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    uncache(&m.path("small.txt"));
    assert_eq!(fs::read(m.path("small.txt")).unwrap(), b"small\n");
    let out = tmp.path().join("s.packet");
    let seal = |out: &Path| run(["seal", m.mnt.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let r = seal(&out);
    let e = r.fails(3, "content_mismatch");
    assert_eq!(e["path"], "workspace/big.bin", "{e}");
    assert!(!out.exists());
    // Put back, the content is served and sealed again; then every name
    // of the packet removed, the daemon still holds it.
    flip(&moved);
    read_all("put back");
    fs::remove_file(&moved).unwrap();
    fs::remove_file(&linked).unwrap();
    read_all("removed");
    seal(&out).ok();
    let v = run(["verify", out.to_str().unwrap()]);
    assert_eq!(v.ok()["valid"], true);
    m.umount();
    let u = tmp.path().join("unpacked");
    run([
        "unpack",
        out.to_str().unwrap(),
        "--into",
        u.to_str().unwrap(),
    ])
    .ok();
    assert_eq!(fs::read(u.join("workspace/big.bin")).unwrap(), big);
}

#[test]
fn commands_on_a_path_nothing_serves_say_so() {
    // "`not_mounted` when no daemon serves the mountpoint (exit 8)", with
    // the path named, whether it exists or not.
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let out = tmp.path().join("o.packet");
    for dir in [empty.clone(), tmp.path().join("missing")] {
        let d = dir.to_str().unwrap();
        for args in [
            vec!["status", d],
            vec!["umount", d],
            vec!["seal", d, "-o", out.to_str().unwrap()],
        ] {
            let r = run(&args);
            let e = r.fails(8, "not_mounted");
            assert!(e["message"].as_str().unwrap().contains(d), "{args:?}: {e}");
        }
    }
    assert!(!out.exists());
}

/// A directory inside a mount is not a mount: `umount` of it says so and
/// leaves the mount be, and another mount may be made on it. A mountpoint
/// named through a symlink is mounted, shown and unmounted where the link
/// leads.
#[test]
fn mounts_are_known_by_the_mount_table() {
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let outer = mount_workspace(tmp.path(), &p);
    let inner_dir = outer.path("inner");
    fs::create_dir(&inner_dir).unwrap();
    let r = run(["umount", inner_dir.to_str().unwrap()]);
    r.fails(8, "not_mounted");
    assert!(is_mounted(&outer.mnt));
    let inner = Mounted::new(&p, &inner_dir, &tmp.path().join("upper-inner"), &[]);
    // The parts recorded are the packet's (it has no harness).
    let info = fs::read(tmp.path().join("upper-inner/mount.json")).unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info).unwrap();
    assert!(info["roots"]["workspace"].is_array(), "{info}");
    assert!(info["roots"]["harness"].is_null(), "{info}");
    assert_eq!(
        fs::read(inner.path("workspace/small.txt")).unwrap(),
        fs::read(outer.path("small.txt")).unwrap()
    );
    inner.umount();
    assert!(is_mounted(&outer.mnt));
    // Asked by another user, whose runtime directory holds no socket for
    // it: not reached, but known to be there (from the mount table: the
    // mount itself refuses another user's statfs).
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin())
        .args(["status", outer.mnt.to_str().unwrap()])
        .output()
        .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    if fallbacks_forced() {
        // (No mount table: another user's mount is not known as one.)
        assert_eq!(e["kind"], "not_mounted", "{e}");
    } else {
        assert_eq!(e["kind"], "not_owner", "{e}");
        let me = nix::unistd::geteuid();
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(&format!("is uid {me}'s")), "{e}");
        assert!(
            !e["hint"].as_str().unwrap().contains("sessionfs status"),
            "the hint suggests the command that failed: {e}"
        );
    }
    outer.umount();
    // Through a symlink.
    let real = tmp.path().join("real-mp");
    fs::create_dir(&real).unwrap();
    let link = tmp.path().join("link-mp");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let upper = tmp.path().join("upper-link");
    let l = link.to_str().unwrap();
    let r = run([
        "mount",
        p.to_str().unwrap(),
        l,
        "--upper",
        upper.to_str().unwrap(),
    ]);
    assert_eq!(r.ok()["mountpoint"], real.to_str().unwrap());
    assert!(is_mounted(&real));
    assert_eq!(
        run(["status", l]).ok()["mountpoint"],
        real.to_str().unwrap()
    );
    assert_eq!(
        run(["umount", l]).ok()["mountpoint"],
        real.to_str().unwrap()
    );
    assert!(!is_mounted(&real));
}

/// An upper directory whose disk is full fails changes with `ENOSPC`, as
/// the disk does, whether the data or the journal runs out of room; the
/// mount keeps serving, and what was recorded survives a remount.
#[test]
fn a_full_upper_disk_is_enospc() {
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let disk = tmp.path().join("disk");
    fs::create_dir(&disk).unwrap();
    let _tmpfs = FsMount::tmpfs(&disk, "256k");
    let m = Mounted::new(
        &p,
        &tmp.path().join("mnt"),
        &disk.join("upper"),
        &["--part", "workspace"],
    );
    let e = fs::write(m.path("fill"), vec![7u8; 400 << 10]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let mut made = 0;
    let e = loop {
        match fs::create_dir(m.path(&format!("a-directory-with-a-long-name-{made:04}"))) {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100_000, "the disk never filled");
    };
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "after {made}: {e}");
    assert_eq!(fs::read(m.path("small.txt")).unwrap(), b"small\n");
    m.umount();
    let m = Mounted::new(
        &p,
        &tmp.path().join("mnt"),
        &disk.join("upper"),
        &["--part", "workspace"],
    );
    assert!(
        m.path(&format!("a-directory-with-a-long-name-{:04}", made - 1))
            .is_dir()
    );
    assert!(
        !m.path(&format!("a-directory-with-a-long-name-{made:04}"))
            .exists()
    );
    m.umount();
}

/// A write that runs out of room part way answers what it wrote (a short
/// write, as a disk gives), never a failure that left bytes behind: the
/// writer's count and the file agree, on the mount and after a remount.
#[test]
fn a_write_cut_short_by_a_full_disk_says_how_much_it_wrote() {
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let disk = tmp.path().join("disk");
    fs::create_dir(&disk).unwrap();
    let _tmpfs = FsMount::tmpfs(&disk, "4m");
    let mount = || {
        Mounted::new(
            &p,
            &tmp.path().join("mnt"),
            &disk.join("upper"),
            &["--part", "workspace"],
        )
    };
    let m = mount();
    let mut f = fs::File::create(m.path("fill")).unwrap();
    // Not a multiple of the page size, so the last write is cut mid-way.
    let chunk = vec![7u8; (1 << 20) + 1000];
    let mut told = 0u64;
    let mut short = false;
    let e = loop {
        match f.write(&chunk) {
            Ok(n) => {
                short |= n < chunk.len();
                told += n as u64;
            }
            Err(e) => break e,
        }
        assert!(told < 1 << 30, "the disk never filled");
    };
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(
        short,
        "no write was cut short: {told} bytes in whole writes"
    );
    assert_eq!(fs::metadata(m.path("fill")).unwrap().len(), told);
    drop(f);
    m.umount();
    let m = mount();
    assert_eq!(fs::metadata(m.path("fill")).unwrap().len(), told);
    m.umount();
}

/// A file can grow to the largest size a packet holds (8 GiB - 1): a write
/// that would cross it writes up to it and says so, one at it fails with
/// `EFBIG`, as at a file size limit.
#[test]
fn a_write_past_the_largest_file_a_packet_holds_stops_at_it() {
    use std::os::unix::fs::FileExt;
    if !fuse_available() {
        return;
    }
    let (tmp, p, _) = setup();
    let m = Mounted::new(
        &p,
        &tmp.path().join("mnt"),
        &tmp.path().join("upper"),
        &["--part", "workspace"],
    );
    let max = sessionfs::api::MAX_FILE_SIZE;
    let f = fs::File::create(m.path("huge")).unwrap();
    assert_eq!(f.write_at(&[1u8; 100], max - 10).unwrap(), 10);
    assert_eq!(fs::metadata(m.path("huge")).unwrap().len(), max);
    let e = f.write_at(&[1u8; 100], max).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    drop(f);
    fs::remove_file(m.path("huge")).unwrap();
    m.umount();
}
