//! The claims of docs/SEMANTICS.md, checked on real FUSE mounts, one test
//! per claim (quoted in each test's comment).

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sessionfs::api::candidate;

/// A workspace with files, an executable, a big multi-chunk file, a mostly
/// empty file, nested directories, a symlink; packed; and a temp dir.
fn setup() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    write(&ws, "dir/sub/file.txt", b"in a subdirectory\n");
    let mut sparse = vec![0u8; 8 << 20];
    sparse[5] = 1;
    sparse[(8 << 20) - 1] = 2;
    write(&ws, "sparse.bin", &sparse);
    let p = packet_of(&ws, tmp.path(), "p", &[]);
    (tmp, p)
}

fn mount_ws(tmp: &Path, packet: &Path, extra: &[&str]) -> Mounted {
    let mut args = vec!["--part", "workspace"];
    args.extend_from_slice(extra);
    Mounted::new(packet, &tmp.join("mnt"), &tmp.join("upper"), &args)
}

/// The upper directory's data files with their lengths. A file the daemon
/// removes between the listing and the `stat` (it drops a data file once
/// the kernel forgets its inode) is left out, not an error.
fn data_files_of(m: &Mounted) -> Vec<(PathBuf, u64)> {
    data_files(&m.upper)
        .into_iter()
        .filter_map(|p| match fs::metadata(&p) {
            Ok(md) => Some((p, md.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("{}: {e}", p.display()),
        })
        .collect()
}

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

#[test]
fn lower_entries_show_manifest_metadata_and_nothing_is_read_at_mount() {
    // "The mount is then ready: no file content has been read yet."
    // "A lower file shows the manifest's mtime_ns as mtime and atime, and as
    // ctime a content stamp: whole seconds from the top 30 bits of the
    // first 8 bytes of its SHA-256, little-endian, nanoseconds from the
    // next 8 bytes modulo 10^9"; "the owner is the mounting user (or
    // --uid/--gid)."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &["--uid", "4321", "--gid", "8765"]);
    assert_eq!(m.status()["verified_bytes"], 0);
    let ws = tmp.path().join("ws");
    assert_eq!(snapshot(&ws), snapshot(&m.mnt));
    for rel in ["README.md", "bin/run.sh", "data/big.bin"] {
        let a = fs::metadata(ws.join(rel)).unwrap();
        let b = fs::metadata(m.path(rel)).unwrap();
        assert_eq!(
            (a.mtime(), a.mtime_nsec()),
            (b.mtime(), b.mtime_nsec()),
            "{rel}"
        );
        // The hash that identifies the content: a /2 file with chunks is
        // known by its chunk list.
        let content = fs::read(ws.join(rel)).unwrap();
        let sha = if content.len() > 4 << 20 {
            let mut list = Vec::new();
            for c in content.chunks(4 << 20) {
                list.extend(<sha2::Sha256 as sha2::Digest>::digest(c));
            }
            <sha2::Sha256 as sha2::Digest>::digest(&list)
        } else {
            <sha2::Sha256 as sha2::Digest>::digest(&content)
        };
        let word = |k: usize| u64::from_le_bytes(sha[k..k + 8].try_into().unwrap());
        assert_eq!(
            (b.ctime(), b.ctime_nsec()),
            ((word(0) >> 34) as i64, (word(8) % 1_000_000_000) as i64),
            "{rel}: the ctime is the content stamp"
        );
        assert_eq!((b.uid(), b.gid()), (4321, 8765));
        // "a path gets the same inode number in every mount of every packet"
        assert_eq!(b.ino(), candidate(&format!("workspace/{rel}"), 0), "{rel}");
    }
    assert_eq!(
        fs::metadata(m.path("bin/run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        fs::read_link(m.path("link")).unwrap().to_str(),
        Some("src/main.rs")
    );
    assert_eq!(fs::metadata(&m.mnt).unwrap().ino(), 1);
    m.umount();
}

#[test]
fn copy_up_on_first_write_keeps_the_inode_and_never_touches_the_packet() {
    // "The first write to a lower file copies it up into the upper
    // directory"; "the packet itself is never modified"; "Inode numbers are
    // stable for the life of the mount, across copy-up".
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let before = fs::read(&p).unwrap();
    let m = mount_ws(tmp.path(), &p, &[]);
    let ino = fs::metadata(m.path("README.md")).unwrap().ino();
    assert!(data_files_of(&m).is_empty());
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.path("README.md"))
        .unwrap();
    f.write_all(b"more\n").unwrap();
    drop(f);
    assert_eq!(fs::read(m.path("README.md")).unwrap(), b"# sample\nmore\n");
    assert_eq!(fs::metadata(m.path("README.md")).unwrap().ino(), ino);
    assert_eq!(data_files_of(&m).len(), 1);
    m.umount();
    assert_eq!(fs::read(&p).unwrap(), before, "the packet file changed");
}

#[test]
fn data_files_are_spread_over_shards_and_old_flat_uppers_are_moved() {
    // Data file `id` lives at data/<id % 64, two hex digits>/<id>; an upper
    // directory of the previous layout (sessionfs.upper/1, every data file
    // in data/) is moved to it when mounted, losing nothing.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    // A shard is made with its first data file, not at mount.
    let shards = |upper: &Path| {
        let mut v: Vec<String> = fs::read_dir(upper.join("data"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(shards(&m.upper), Vec::<String>::new());
    fs::write(m.path("new0.txt"), "file 0\n").unwrap();
    let first = data_files_of(&m);
    assert_eq!(first.len(), 1);
    let id = u64::from_str_radix(first[0].0.file_name().unwrap().to_str().unwrap(), 16).unwrap();
    assert_eq!(shards(&m.upper), vec![format!("{:02x}", id % 64)]);
    for k in 1..70 {
        fs::write(m.path(&format!("new{k}.txt")), format!("file {k}\n")).unwrap();
    }
    assert_eq!(shards(&m.upper).len(), 64);
    let mnt = m.mnt.clone();
    let upper = m.upper.clone();
    m.umount();
    let files = data_files(&upper);
    assert_eq!(files.len(), 70);
    let in_its_shard = |f: &Path| {
        let id = u64::from_str_radix(f.file_name().unwrap().to_str().unwrap(), 16).unwrap();
        f.parent().unwrap().file_name().unwrap().to_str().unwrap() == format!("{:02x}", id % 64)
    };
    assert!(files.iter().all(|f| in_its_shard(f)), "{files:?}");
    let header = upper.join("sessionfs-upper.json");
    assert!(
        fs::read_to_string(&header)
            .unwrap()
            .contains("\"sessionfs.upper/2\"")
    );

    // Back to the flat layout of sessionfs.upper/1.
    for f in &files {
        fs::rename(f, upper.join("data").join(f.file_name().unwrap())).unwrap();
    }
    for e in fs::read_dir(upper.join("data")).unwrap() {
        let e = e.unwrap().path();
        if e.is_dir() {
            fs::remove_dir(e).unwrap();
        }
    }
    let old = fs::read_to_string(&header).unwrap();
    fs::write(
        &header,
        old.replace("sessionfs.upper/2", "sessionfs.upper/1"),
    )
    .unwrap();

    let m = Mounted::new(&p, &mnt, &upper, &["--part", "workspace"]);
    for k in 0..70 {
        assert_eq!(
            fs::read_to_string(m.path(&format!("new{k}.txt"))).unwrap(),
            format!("file {k}\n")
        );
    }
    let moved = data_files(&upper);
    assert_eq!(moved.len(), 70);
    assert!(moved.iter().all(|f| in_its_shard(f)), "{moved:?}");
    assert!(
        fs::read_to_string(&header)
            .unwrap()
            .contains("\"sessionfs.upper/2\"")
    );
    m.umount();
}

#[test]
fn renaming_lower_entries_copies_no_data() {
    // "Renaming a lower file or directory is a metadata operation recorded
    // in the upper directory: it copies no file data and is O(1) in the
    // file's size"; inode numbers survive rename.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let big_ino = fs::metadata(m.path("data/big.bin")).unwrap().ino();
    let want = fs::read(tmp.path().join("ws/data/big.bin")).unwrap();
    fs::rename(m.path("data"), m.path("moved")).unwrap();
    fs::rename(m.path("moved/big.bin"), m.path("big-renamed.bin")).unwrap();
    assert!(
        data_files_of(&m).is_empty(),
        "a rename copied data: {:?}",
        data_files_of(&m)
    );
    assert_eq!(
        fs::metadata(m.path("big-renamed.bin")).unwrap().ino(),
        big_ino
    );
    assert_eq!(fs::read(m.path("big-renamed.bin")).unwrap(), want);
    assert!(!m.path("data").exists());
    // Replace-by-rename of a lower file is atomic and leaves no trace.
    fs::write(m.path("README.tmp"), b"new readme\n").unwrap();
    fs::rename(m.path("README.tmp"), m.path("README.md")).unwrap();
    assert_eq!(fs::read(m.path("README.md")).unwrap(), b"new readme\n");
    assert!(!m.path("README.tmp").exists());
    m.umount();
}

#[test]
fn hard_links_to_lower_files_work_without_exdev() {
    // "Hard links to lower files work too (no EXDEV)."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    fs::hard_link(m.path("README.md"), m.path("dir/readme-link")).unwrap();
    let a = fs::metadata(m.path("README.md")).unwrap();
    let b = fs::metadata(m.path("dir/readme-link")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert!(data_files_of(&m).is_empty(), "a link copied data");
    fs::OpenOptions::new()
        .append(true)
        .open(m.path("dir/readme-link"))
        .unwrap()
        .write_all(b"x")
        .unwrap();
    assert_eq!(fs::read(m.path("README.md")).unwrap(), b"# sample\nx");
    fs::remove_file(m.path("README.md")).unwrap();
    assert_eq!(fs::metadata(m.path("dir/readme-link")).unwrap().nlink(), 1);
    m.umount();
}

#[test]
fn whiteouts_opaque_directories_and_no_reserved_names() {
    // "Deleting or renaming away a lower entry leaves a whiteout; a
    // directory removed and recreated becomes opaque." "The encoding
    // reserves no names."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    fs::remove_file(m.path("dir/sub/file.txt")).unwrap();
    fs::remove_dir(m.path("dir/sub")).unwrap();
    assert!(!m.path("dir/sub").exists());
    fs::create_dir(m.path("dir/sub")).unwrap();
    assert_eq!(
        fs::read_dir(m.path("dir/sub")).unwrap().count(),
        0,
        "a recreated directory is opaque"
    );
    assert_eq!(errno_of(fs::remove_dir(m.path("src"))), libc::ENOTEMPTY);
    fs::write(m.path(".wh.README.md"), b"an ordinary name").unwrap();
    assert!(m.path("README.md").exists());
    nix::sys::stat::mknod(
        &m.path("char00"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        0,
    )
    .unwrap();
    assert!(
        fs::symlink_metadata(m.path("char00"))
            .unwrap()
            .file_type()
            .is_char_device_like()
    );
    m.umount();
}

trait CharDev {
    fn is_char_device_like(&self) -> bool;
}

impl CharDev for fs::FileType {
    fn is_char_device_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_char_device()
    }
}

#[test]
fn special_files_exist_on_the_mount() {
    // "FIFOs, sockets and character/block devices exist on the mount."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    use std::os::unix::fs::FileTypeExt;
    nix::unistd::mkfifo(
        &m.path("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert!(
        fs::symlink_metadata(m.path("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // A FIFO on the mount carries data between processes.
    let path = m.path("fifo");
    let writer = std::thread::spawn(move || fs::write(path, b"through the pipe").unwrap());
    assert_eq!(fs::read(m.path("fifo")).unwrap(), b"through the pipe");
    writer.join().unwrap();
    let sock = std::os::unix::net::UnixListener::bind(m.path("sock")).unwrap();
    assert!(
        fs::symlink_metadata(m.path("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    drop(sock);
    nix::sys::stat::mknod(
        &m.path("blk"),
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        libc::makedev(7, 3),
    )
    .unwrap();
    let md = fs::symlink_metadata(m.path("blk")).unwrap();
    assert!(md.file_type().is_block_device());
    #[allow(clippy::unnecessary_cast)] // dev_t is i32 on macOS
    let rdev = libc::makedev(7, 3) as u64;
    assert_eq!(md.rdev(), rdev);
    m.umount();
}

#[test]
fn files_replaced_by_rename_while_open_keep_their_content_until_closed() {
    // The daemon sees no opens: a file replaced by a rename lives on
    // through the kernel's reference to its inode alone, whether it was
    // a lower file (copied up while open) or a new one.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    use std::os::unix::fs::FileExt;
    let lower = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("README.md"))
        .unwrap();
    fs::write(m.path("new.txt"), b"first version\n").unwrap();
    let upper = fs::File::open(m.path("new.txt")).unwrap();
    fs::write(m.path("replacement"), b"replaced\n").unwrap();
    fs::rename(m.path("replacement"), m.path("README.md")).unwrap();
    fs::write(m.path("replacement"), b"replaced too\n").unwrap();
    fs::rename(m.path("replacement"), m.path("new.txt")).unwrap();
    assert_eq!(fs::read(m.path("README.md")).unwrap(), b"replaced\n");
    assert_eq!(fs::read(m.path("new.txt")).unwrap(), b"replaced too\n");
    assert_eq!(lower.metadata().unwrap().nlink(), 0);
    assert_eq!(upper.metadata().unwrap().nlink(), 0);
    // The replaced lower file, changed after it lost its name.
    lower.write_all_at(b"$", 0).unwrap();
    let mut got = vec![0u8; 9];
    lower.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, b"$ sample\n");
    let mut got = vec![0u8; 14];
    upper.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, b"first version\n");
    let live = data_files_of(&m).len();
    drop((lower, upper));
    // Their data files go once the kernel forgets the inodes; the two
    // files with names keep theirs.
    let mut left = data_files_of(&m).len();
    for _ in 0..50 {
        if left == live - 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = data_files_of(&m).len();
    }
    assert_eq!(left, live - 2, "{:?}", data_files_of(&m));
    m.umount();
}

#[test]
fn unlinked_open_files_stay_usable_with_nlink_zero() {
    // "an open file stays readable and writable until closed, with st_nlink 0"
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("tmpfile"))
        .unwrap();
    f.write_all(b"scratch").unwrap();
    fs::remove_file(m.path("tmpfile")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "scratch");
    drop(f);
    // The data file goes once the last handle closes.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(data_files_of(&m).is_empty(), "{:?}", data_files_of(&m));
    // A lower file too.
    let mut g = fs::File::open(m.path("README.md")).unwrap();
    fs::remove_file(m.path("README.md")).unwrap();
    assert_eq!(g.metadata().unwrap().nlink(), 0);
    let mut s = String::new();
    g.read_to_string(&mut s).unwrap();
    assert_eq!(s, "# sample\n");
    drop(g);
    // A lower file opened before anything changed it, changed (copied up)
    // and unlinked while open, then mapped after its last descriptor is
    // closed: the daemon sees no open or close (zero-message opens), only
    // the kernel's reference to the inode, which keeps the content alive.
    let script = r#"
import mmap, os, sys
p = sys.argv[1]
f = open(p, "r+b")
os.unlink(p)
f.write(b"XY")
f.flush()
mm = mmap.mmap(f.fileno(), 0)
f.close()
mm[2:4] = b"zw"
print(bytes(mm[0:12]).decode())
mm.close()
"#;
    assert_eq!(
        python(script, &[m.path("src/main.rs").as_os_str()]),
        "XYzwain() {"
    );
    assert!(!m.path("src/main.rs").exists());
    // Once the kernel forgets the inode, its data file goes.
    let mut left = data_files_of(&m);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = data_files_of(&m);
    }
    assert!(left.is_empty(), "{left:?}");
    m.umount();
}

#[test]
#[cfg(target_os = "linux")] // renameat2; macOS has renamex_np
fn rename_noreplace_and_exchange() {
    // "RENAME_NOREPLACE and RENAME_EXCHANGE are supported".
    if !fuse_available() {
        return;
    }
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let r = renameat2(
        AT_FDCWD,
        &m.path("README.md"),
        AT_FDCWD,
        &m.path("empty"),
        RenameFlags::RENAME_NOREPLACE,
    );
    assert_eq!(r, Err(nix::errno::Errno::EEXIST));
    renameat2(
        AT_FDCWD,
        &m.path("README.md"),
        AT_FDCWD,
        &m.path("src"),
        RenameFlags::RENAME_EXCHANGE,
    )
    .unwrap();
    assert!(m.path("README.md").is_dir());
    assert_eq!(fs::read(m.path("src")).unwrap(), b"# sample\n");
    assert_eq!(
        fs::read(m.path("README.md/main.rs")).unwrap(),
        b"fn main() { println!(\"hi\"); }\n"
    );
    // Moving a directory into itself.
    assert_eq!(
        errno_of(fs::rename(m.path("dir"), m.path("dir/sub/x"))),
        libc::EINVAL
    );
    // Onto a non-empty directory; a directory over a file and back.
    assert_eq!(
        errno_of(fs::rename(m.path("data"), m.path("dir"))),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno_of(fs::rename(m.path("data"), m.path("empty"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(fs::rename(m.path("empty"), m.path("emptydir"))),
        libc::EISDIR
    );
    m.umount();
}

#[test]
fn a_running_executable_refuses_truncation_and_keeps_its_content() {
    // pjdfstest's open::etxtbsy failed now and then under load: the daemon
    // truncated at OPEN (FUSE_ATOMIC_O_TRUNC), before the kernel's ETXTBSY
    // check, so O_RDONLY|O_TRUNC was refused but the running binary lost
    // its content and crashed. The kernel now checks first.
    if !fuse_available() {
        return;
    }
    use std::os::unix::fs::OpenOptionsExt;
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let exe = m.path("sleeper");
    fs::write(&exe, fs::read("/bin/sleep").unwrap()).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let len = fs::metadata(&exe).unwrap().len();
    let mut child = Command::new(&exe).arg("30").spawn().unwrap();
    let attempts: [(&str, fs::OpenOptions); 3] = [
        ("O_WRONLY", fs::OpenOptions::new().write(true).clone()),
        (
            "O_RDWR",
            fs::OpenOptions::new().read(true).write(true).clone(),
        ),
        (
            "O_RDONLY|O_TRUNC",
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_TRUNC)
                .clone(),
        ),
    ];
    for (label, opts) in attempts {
        assert_eq!(errno_of(opts.open(&exe)), libc::ETXTBSY, "{label}");
        assert_eq!(
            fs::metadata(&exe).unwrap().len(),
            len,
            "{label} was refused but emptied the running executable"
        );
    }
    assert!(child.try_wait().unwrap().is_none(), "the executable died");
    child.kill().unwrap();
    child.wait().unwrap();
    // Once nothing runs it, it can be truncated.
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&exe)
        .unwrap();
    assert_eq!(fs::metadata(&exe).unwrap().len(), 0);
}

/// `status` counts the chunks a file copied up by chunk took over:
/// appending to `data/big.bin` (4 MiB + 4097 bytes: a whole chunk and a
/// part) copies its partial last chunk; a write over the whole first
/// chunk takes it without copying.
#[test]
fn status_counts_the_chunks_held_by_a_copy_up_by_chunk() {
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let lower = fs::read(tmp.path().join("ws/data/big.bin")).unwrap();
    let before = m.status().clone();
    assert_eq!(before["chunks_held"], 0, "{before}");
    let f = fs::OpenOptions::new()
        .append(true)
        .open(m.path("data/big.bin"))
        .unwrap();
    (&f).write_all(b"x").unwrap();
    let after = m.status().clone();
    assert_eq!(after["chunks_held"], 1, "{after}");
    assert_eq!(
        after["copy_ups"],
        before["copy_ups"].as_u64().unwrap() + 1,
        "{after}"
    );
    let g = fs::OpenOptions::new()
        .write(true)
        .open(m.path("data/big.bin"))
        .unwrap();
    g.write_all_at(&vec![7u8; 4 << 20], 0).unwrap();
    let last = m.status().clone();
    assert_eq!(last["chunks_held"], 2, "{last}");
    assert_eq!(last["copy_ups"], after["copy_ups"], "{last}");
    let got = fs::read(m.path("data/big.bin")).unwrap();
    assert_eq!(got.len(), lower.len() + 1);
    assert!(got[..4 << 20].iter().all(|&b| b == 7));
    assert_eq!(got[4 << 20..lower.len()], lower[4 << 20..]);
    assert_eq!(got[lower.len()], b'x');
}

#[test]
fn open_flags_appends_truncation_and_holes() {
    // "O_EXCL honoured"; "O_TRUNC at open ... copies nothing"; "writes past
    // the end leave holes".
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let excl = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.path("README.md"));
    assert_eq!(errno_of(excl), libc::EEXIST);
    let mut a = fs::OpenOptions::new()
        .append(true)
        .open(m.path("src/main.rs"))
        .unwrap();
    a.write_all(b"// one\n").unwrap();
    a.write_all(b"// two\n").unwrap();
    drop(a);
    assert!(
        fs::read_to_string(m.path("src/main.rs"))
            .unwrap()
            .ends_with("// one\n// two\n")
    );
    // Opening a lower file for writing copies nothing until it changes;
    // O_TRUNC of the 4 MiB file copies nothing at all (no chunk of it is
    // even read): the upper copy starts empty.
    let before = m.status().clone();
    drop(
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.path("README.md"))
            .unwrap(),
    );
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("data/big.bin"))
        .unwrap()
        .write_all(b"small")
        .unwrap();
    let after = m.status().clone();
    assert_eq!(
        after["copy_ups"],
        before["copy_ups"].as_u64().unwrap() + 1,
        "{after}"
    );
    assert_eq!(after["verified_bytes"], before["verified_bytes"], "{after}");
    assert_eq!(fs::read(m.path("data/big.bin")).unwrap(), b"small");
    assert!(
        data_files_of(&m).iter().all(|(_, len)| *len < 1024),
        "{:?}",
        data_files_of(&m)
    );
    // A write 100 MiB past the end leaves a hole.
    let mut h = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("holey"))
        .unwrap();
    h.write_all(b"start").unwrap();
    h.seek(SeekFrom::Start(100 << 20)).unwrap();
    h.write_all(b"end").unwrap();
    drop(h);
    let md = fs::metadata(m.path("holey")).unwrap();
    assert_eq!(md.len(), (100 << 20) + 3);
    assert!(
        md.blocks() * 512 < (1 << 20),
        "{} blocks for a sparse file",
        md.blocks()
    );
    m.umount();
}

#[test]
fn copy_up_keeps_holes() {
    // "Copy-up keeps holes: a sparse or mostly-empty file does not become dense."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    fs::OpenOptions::new()
        .append(true)
        .open(m.path("sparse.bin"))
        .unwrap()
        .write_all(b"!")
        .unwrap();
    let (name, len) = data_files_of(&m).pop().unwrap();
    assert_eq!(len, (8 << 20) + 1);
    let blocks = fs::metadata(name).unwrap().blocks();
    assert!(
        blocks * 512 <= 64 * 1024,
        "copy-up wrote {} bytes of blocks for a mostly empty file",
        blocks * 512
    );
    let data = fs::read(m.path("sparse.bin")).unwrap();
    assert_eq!((data[5], data[(8 << 20) - 1], data[8 << 20]), (1, 2, b'!'));
    m.umount();
}

#[test]
fn metadata_changes_of_lower_files_copy_no_data() {
    // "Metadata-only changes (chmod, chown, utimens) of a lower file do not copy data".
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let before = fs::metadata(m.path("data/big.bin")).unwrap();
    fs::set_permissions(m.path("data/big.bin"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(m.path("data/big.bin"), Some(1234), Some(5678)).unwrap();
    set_mtime(&m.path("data/big.bin"), 1_000_000_000_000_000_042);
    let after = fs::metadata(m.path("data/big.bin")).unwrap();
    assert_eq!(after.permissions().mode() & 0o7777, 0o600);
    assert_eq!((after.uid(), after.gid()), (1234, 5678));
    assert_eq!((after.mtime(), after.mtime_nsec()), (1_000_000_000, 42));
    assert!(
        after.ctime() >= before.ctime()
            && (after.ctime(), after.ctime_nsec()) != (before.ctime(), before.ctime_nsec())
    );
    assert!(data_files_of(&m).is_empty(), "metadata changes copied data");
    m.umount();
}

#[test]
fn names_roots_xattrs_and_statfs() {
    // "ENAMETOOLONG for a name over 255 bytes"; "xattrs: getxattr and
    // listxattr report none; setxattr ... fail with ENOTSUP"; "statfs: the
    // upper directory's filesystem numbers; f_namemax 255"; the packet root
    // holds only the parts.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = Mounted::new(&p, &tmp.path().join("mnt"), &tmp.path().join("upper"), &[]);
    let long = "n".repeat(256);
    assert_eq!(
        errno_of(fs::write(m.path(&format!("workspace/{long}")), b"x")),
        libc::ENAMETOOLONG
    );
    fs::write(m.path(&format!("workspace/{}", "n".repeat(255))), b"x").unwrap();
    use std::os::unix::ffi::OsStrExt;
    let bad = m
        .path("workspace")
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    assert_eq!(errno_of(fs::write(bad, b"x")), libc::EILSEQ);
    assert_eq!(errno_of(fs::write(m.path("stray"), b"x")), libc::EPERM);
    assert_eq!(
        errno_of(fs::rename(m.path("workspace"), m.path("w2"))),
        libc::EPERM
    );
    let xs = Command::new("setfattr")
        .args(["-n", "user.k", "-v", "v"])
        .arg(m.path("workspace/README.md"))
        .output();
    if let Ok(out) = xs {
        assert!(!out.status.success(), "setxattr must fail");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not supported"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    let u = nix::sys::statvfs::statvfs(&m.upper).unwrap();
    assert!(s.blocks() > 0 && s.files() > 0);
    assert_eq!((s.blocks(), s.block_size()), (u.blocks(), u.block_size()));
    assert_eq!(s.name_max(), 255);
    m.umount();
}

#[test]
fn mmap_shared_and_private_mappings() {
    // "mmap: shared and private, read and write".
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let script = r#"
import mmap, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    mm = mmap.mmap(f.fileno(), 0)          # shared
    mm[0:8] = b"SHARED!!"
    mm.flush(); mm.close()
with open(p, "rb") as f:
    pm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)   # private
    pm[0:8] = b"private."
    assert pm[0:8] == b"private."
    pm.close()
print(open(p, "rb").read(12).decode())
"#;
    assert_eq!(
        python(script, &[m.path("README.md").as_os_str()]),
        "SHARED!!"
    );
    assert_eq!(&fs::read(m.path("README.md")).unwrap()[..8], b"SHARED!!");
    m.umount();
}

#[test]
fn flock_and_fcntl_locks_between_processes() {
    // "file locks (flock/fcntl) ... are handled by the kernel for this mount".
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let script = r#"
import fcntl, os, subprocess, sys
p = sys.argv[1]
f = open(p, "r+")
fcntl.flock(f, fcntl.LOCK_EX)
other = "import fcntl,sys\nf=open(sys.argv[1],'r+')\ntry:\n fcntl.flock(f, fcntl.LOCK_EX|fcntl.LOCK_NB); print('got')\nexcept BlockingIOError: print('busy')"
print(subprocess.run([sys.executable, "-c", other, p], capture_output=True, text=True).stdout.strip())
fcntl.flock(f, fcntl.LOCK_UN)
fcntl.lockf(f, fcntl.LOCK_EX)
other2 = other.replace("fcntl.flock(f, fcntl.LOCK_EX|fcntl.LOCK_NB)", "fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB)")
print(subprocess.run([sys.executable, "-c", other2, p], capture_output=True, text=True).stdout.strip())
"#;
    assert_eq!(
        python(script, &[m.path("README.md").as_os_str()]),
        "busy\nbusy"
    );
    m.umount();
}

#[test]
fn new_files_are_numbered_by_path_and_remounts_show_the_same_state() {
    // "a path gets the same inode number ... new files numbered the same
    // way"; "a re-mount of the same packet and upper shows exactly the state
    // the application saw".
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    fs::create_dir_all(m.path("new/deep")).unwrap();
    fs::write(m.path("new/deep/file"), b"new").unwrap();
    assert_eq!(
        fs::metadata(m.path("new/deep/file")).unwrap().ino(),
        candidate("workspace/new/deep/file", 0)
    );
    fs::rename(m.path("src"), m.path("source")).unwrap();
    fs::write(m.path("source/added.rs"), b"// added\n").unwrap();
    assert_eq!(
        fs::metadata(m.path("source/added.rs")).unwrap().ino(),
        candidate("workspace/source/added.rs", 0)
    );
    fs::remove_file(m.path("empty")).unwrap();
    std::os::unix::fs::symlink("source/added.rs", m.path("newlink")).unwrap();
    fs::set_permissions(m.path("README.md"), fs::Permissions::from_mode(0o640)).unwrap();
    let before = snapshot(&m.mnt);
    let inos: Vec<u64> = before
        .iter()
        .map(|(rel, _)| fs::symlink_metadata(m.path(rel)).unwrap().ino())
        .collect();
    let mnt = m.mnt.clone();
    m.umount();
    let m2 = Mounted::new(
        &p,
        &mnt,
        &tmp.path().join("upper"),
        &["--part", "workspace"],
    );
    assert_eq!(snapshot(&m2.mnt), before);
    let inos2: Vec<u64> = before
        .iter()
        .map(|(rel, _)| fs::symlink_metadata(m2.path(rel)).unwrap().ino())
        .collect();
    assert_eq!(inos, inos2, "inode numbers changed across a remount");
    m2.umount();
}

#[test]
fn absent_names_are_cached_as_absent_until_created_through_the_mount() {
    // "A name found absent is cached as absent for an hour, so repeated
    // probes for it cost one lookup" (docs/CLI.md, status); and every way
    // of making the name exist shows it at once.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let lookups = |m: &Mounted| m.status()["lookups"].as_u64().unwrap();
    let probe = |rel: &str| {
        fs::symlink_metadata(m.path(rel))
            .map(|_| ())
            .map_err(|e| e.raw_os_error())
    };
    assert_eq!(probe("dir/.gitignore"), Err(Some(libc::ENOENT)));
    let before = lookups(&m);
    for _ in 0..50 {
        assert_eq!(probe("dir/.gitignore"), Err(Some(libc::ENOENT)));
    }
    assert_eq!(lookups(&m), before, "an absent name was looked up again");
    // Each way a name can come to exist, after it was probed absent.
    type Make<'a> = &'a dyn Fn(&Path);
    let ways: [(&str, Make); 6] = [
        ("created", &|p| fs::write(p, b"x").unwrap()),
        ("mkdir", &|p| fs::create_dir(p).unwrap()),
        ("symlink", &|p| {
            std::os::unix::fs::symlink("target", p).unwrap()
        }),
        ("hard-linked", &|p| {
            fs::hard_link(m.path("README.md"), p).unwrap()
        }),
        ("renamed", &|p| {
            fs::rename(m.path("src/main.rs"), p).unwrap()
        }),
        ("mknod", &|p| {
            let st = Command::new("mkfifo").arg(p).status().unwrap();
            assert!(st.success());
        }),
    ];
    for (how, make) in ways {
        let rel = format!("dir/{how}.new");
        assert_eq!(probe(&rel), Err(Some(libc::ENOENT)), "{how}");
        make(&m.path(&rel));
        assert_eq!(probe(&rel), Ok(()), "{how}: not visible after it was made");
        let listed: Vec<String> = fs::read_dir(m.path("dir"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(listed.contains(&format!("{how}.new")), "{how}: {listed:?}");
    }
    // And gone again: removal makes it absent, and then present once more.
    fs::remove_file(m.path("dir/created.new")).unwrap();
    assert_eq!(probe("dir/created.new"), Err(Some(libc::ENOENT)));
    fs::write(m.path("dir/created.new"), b"again").unwrap();
    assert_eq!(fs::read(m.path("dir/created.new")).unwrap(), b"again");
    m.umount();
}

/// Whether `p` is the root of a FUSE mount.
fn is_fuse(p: &Path) -> bool {
    sessionfs::api::is_fuse_path(p)
}

/// Whether process `pid` runs (and is not a zombie).
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Sends SIGTERM to process `pid`, as a stopping pod's runtime does.
fn sigterm(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits up to 10 s for `cond`.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    (0..1000).any(|_| {
        cond() || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    })
}

#[test]
#[cfg(target_os = "linux")] // a tmpfs beneath, found by its magic number
fn unmounting_leaves_the_mount_beneath_the_mountpoint_alone() {
    // "`sessionfs umount MOUNTPOINT` asks the daemon to unmount": that
    // mount only. A pod's /workspace is often a volume: the daemon once
    // unmounted the path a second time as it exited, taking the volume.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let mnt = tmp.path().join("volume");
    fs::create_dir_all(&mnt).unwrap();
    let tmpfs = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(tmpfs.success(), "cannot mount a tmpfs to stack on");
    let m = Mounted::new(
        &p,
        &mnt,
        &tmp.path().join("upper"),
        &["--part", "workspace"],
    );
    let pid = m.pid();
    assert!(is_fuse(&mnt));
    m.umount();
    assert!(eventually(|| !alive(pid)), "the daemon did not exit");
    let tmpfs_there =
        || nix::sys::statfs::statfs(&mnt).is_ok_and(|s| s.filesystem_type().0 == 0x0102_1994);
    let first = tmpfs_there();
    // A pod's stop: a lazy unmount while a file is open, then SIGTERM to
    // the daemon still serving it. The signal must not unmount the path,
    // which is the volume's by then.
    let m = Mounted::new(
        &p,
        &mnt,
        &tmp.path().join("upper"),
        &["--part", "workspace"],
    );
    let pid = m.pid();
    let open = fs::File::open(m.path("README.md")).unwrap();
    run(["umount", mnt.to_str().unwrap(), "--lazy"]).ok();
    sigterm(pid);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let second = tmpfs_there();
    drop(open);
    assert!(eventually(|| !alive(pid)), "the daemon did not exit");
    std::mem::forget(m);
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(first, "the tmpfs beneath is gone after umount");
    assert!(
        second,
        "the tmpfs beneath is gone after a lazy umount and SIGTERM"
    );
}

#[test]
fn sigterm_unmounts_cleanly_and_keeps_the_upper() {
    // "The daemon unmounts on SIGTERM, SIGINT or SIGHUP": what Kubernetes
    // sends a pod. Every daemon thread must leave the signal to the one
    // that waits for it, or the process dies with the mount left behind.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    fs::write(m.path("new.txt"), b"kept\n").unwrap();
    let pid = m.pid();
    sigterm(pid);
    assert!(eventually(|| !alive(pid)), "the daemon did not exit");
    assert!(!is_fuse(&m.mnt), "the mount was left behind");
    assert!(
        fs::read_dir(&m.mnt).unwrap().next().is_none(),
        "the mountpoint is not empty"
    );
    // The upper directory holds the change: the next mount shows it.
    let again = Mounted::new(&p, &m.mnt, &m.upper, &["--part", "workspace"]);
    assert_eq!(fs::read(again.path("new.txt")).unwrap(), b"kept\n");
    again.umount();
    std::mem::forget(m);
}

#[test]
fn a_lazy_unmount_detaches_and_serves_open_files_until_closed() {
    // "`--lazy` detaches it now and lets the daemon exit once the last
    // file is closed."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let pid = m.pid();
    let mut open = fs::File::open(m.path("README.md")).unwrap();
    let mnt = m.mnt.to_str().unwrap().to_owned();
    let busy = run(["umount", &mnt]);
    let e = busy.fails(8, "busy");
    assert!(e["hint"].as_str().unwrap().contains("--lazy"), "{e}");
    assert_eq!(e["path"], mnt.as_str(), "{e}");
    assert!(is_fuse(&m.mnt));
    let r = run(["umount", &mnt, "--lazy"]);
    assert_eq!(r.ok()["unmounted"], true);
    assert!(!is_fuse(&m.mnt), "still mounted after --lazy");
    assert!(alive(pid), "the daemon left an open file unserved");
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert!(!s.is_empty());
    drop(open);
    assert!(
        eventually(|| !alive(pid)),
        "the daemon outlived the last file"
    );
    std::mem::forget(m);
}

#[test]
fn status_and_mount_give_absolute_paths_whatever_the_mount_was_given() {
    // "status shows what it serves": paths the asker can use from its own
    // working directory, though the mount was made with relative ones.
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    fs::create_dir_all(tmp.path().join("mnt")).unwrap();
    let out = succeed(
        Command::new(bin())
            .current_dir(tmp.path())
            .args(["mount", p.file_name().unwrap().to_str().unwrap(), "mnt"])
            .args(["--upper", "upper"]),
    );
    let mounted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mnt = tmp.path().join("mnt");
    let s = run(["status", mnt.to_str().unwrap()]);
    let v = s.ok().clone();
    run(["umount", mnt.to_str().unwrap()]).ok();
    // The mount's own result gives them so too.
    for key in ["mountpoint", "packet", "upper"] {
        assert_eq!(
            mounted[key], v[key],
            "{key}: mount-result and status differ"
        );
    }
    let real = |p: &Path| fs::canonicalize(p).unwrap();
    for (key, want) in [
        ("mountpoint", tmp.path().join("mnt")),
        ("packet", p.clone()),
        ("upper", tmp.path().join("upper")),
    ] {
        let got = Path::new(v[key].as_str().unwrap());
        assert!(got.is_absolute(), "{key}: {got:?}");
        if key != "mountpoint" {
            assert_eq!(real(got), real(&want), "{key}");
        } else {
            assert_eq!(got, want, "{key}");
        }
    }
}

/// The daemon's log is moved aside once it passes 1 MiB while the daemon
/// runs, not only when a daemon starts, so a mount serving for weeks keeps
/// about 2 MiB of logs; the lines after go to the new log.
#[test]
fn a_running_daemons_log_is_moved_aside_past_its_limit() {
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &["-vv"]);
    let log = PathBuf::from(m.result["log"].as_str().unwrap());
    let mut old = log.clone().into_os_string();
    old.push(".1");
    let old = PathBuf::from(old);
    let _ = fs::remove_file(&old);
    fs::create_dir(m.path("full")).unwrap();
    fs::write(m.path("full/f"), b"").unwrap();
    // Each refused `rmdir` reaches the daemon, which logs it (debug).
    let refused = |n: usize| {
        for _ in 0..n {
            let e = fs::remove_dir(m.path("full")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
        }
    };
    // Logged until `path` exists (at most 100,000 times).
    let until = |path: &Path| {
        let mut tries = 0;
        while !path.exists() {
            let at = path.display();
            assert!(tries < 100_000, "no {at} after {tries} logged rmdirs");
            refused(100);
            tries += 100;
        }
    };
    until(&old);
    let limit = 1u64 << 20;
    let old_len = fs::metadata(&old).unwrap().len();
    // The line that passed the limit is the old log's last.
    assert!(old_len > limit && old_len < limit + 4096, "{old_len}");
    assert!(fs::read_to_string(&old).unwrap().ends_with('\n'));
    let new_len = fs::metadata(&log).unwrap().len();
    refused(10);
    let grown = fs::metadata(&log).unwrap().len();
    assert!(
        grown > new_len,
        "nothing went to the new log: {new_len} -> {grown}"
    );
    assert!(grown < limit);
    assert_eq!(fs::metadata(&old).unwrap().len(), old_len);
    assert_eq!(fs::read(m.path("full/f")).unwrap(), b"");
    // A log removed under the daemon is begun again at its path.
    fs::remove_file(&old).unwrap();
    fs::remove_file(&log).unwrap();
    until(&log);
    refused(10);
    assert!(fs::metadata(&log).unwrap().len() > 0);
    m.umount();
    let _ = fs::remove_file(&old);
    let _ = fs::remove_file(&log);
}

/// `isatty` on a file of the mount (every Python `open` asks it) is
/// answered `ENOTTY`, and costs the daemon's log nothing.
#[test]
fn ioctls_are_not_a_tty_and_log_nothing() {
    use std::os::fd::AsRawFd;
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let m = mount_ws(tmp.path(), &p, &[]);
    let log = PathBuf::from(m.result["log"].as_str().unwrap());
    let before = fs::metadata(&log).map_or(0, |l| l.len());
    for _ in 0..50 {
        let f = fs::File::open(m.path("README.md")).unwrap();
        assert_eq!(unsafe { libc::isatty(f.as_raw_fd()) }, 0);
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTTY), "{e}");
    }
    let text = fs::read_to_string(&log).unwrap_or_default();
    let grown = text.len() as u64 - before.min(text.len() as u64);
    assert!(!text.contains("Not Implemented"), "{text}");
    assert!(grown < 1024, "the log grew by {grown} bytes");
    m.umount();
}

/// The names of `dir`'s files, `n` of them, long enough that a listing
/// takes many reads.
fn many_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("a-file-with-a-long-name-{i:05}.txt"))
        .collect()
}

/// The names `read_dir` gives for `dir`, calling `change` with each
/// entry's path and name as it is read.
fn read_while(dir: &Path, change: &mut dyn FnMut(&Path, &str)) -> Vec<String> {
    let mut seen = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        change(&e.path(), &name);
        seen.push(name);
    }
    seen
}

/// "A directory read while it changes lists every name that is there
/// throughout exactly once" (POSIX leaves only the names added or removed
/// meanwhile unspecified): `rm -rf` and every loop that unlinks, moves or
/// creates what it reads depend on it, on lower directories, directories
/// of the upper layer, and directories that became upper ones as they
/// were read.
#[test]
fn a_directory_changed_while_it_is_read_lists_every_other_name_once() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let names = many_names(1200);
    for dir in ["unlink", "move", "create", "remove_all"] {
        for n in &names {
            write(&ws, &format!("{dir}/{n}"), b"x");
        }
    }
    let p = packet_of(&ws, tmp.path(), "p", &[]);
    let m = mount_ws(tmp.path(), &p, &[]);
    // The same on a directory made on the mount.
    for n in &names {
        write(&m.mnt, &format!("made/{n}"), b"x");
    }
    fs::create_dir(m.mnt.join("elsewhere")).unwrap();
    for dir in ["unlink", "made"] {
        let seen = read_while(&m.mnt.join(dir), &mut |p, _| fs::remove_file(p).unwrap());
        assert_eq!(seen.len(), names.len(), "{dir}: unlinked as read");
        fs::remove_dir(m.mnt.join(dir)).unwrap();
    }
    let to = m.mnt.join("elsewhere");
    let seen = read_while(&m.mnt.join("move"), &mut |p, n| {
        fs::rename(p, to.join(n)).unwrap()
    });
    assert_eq!(seen.len(), names.len(), "moved out as read");
    assert_eq!(fs::read_dir(&to).unwrap().count(), names.len());
    let dir = m.mnt.join("create");
    let seen = read_while(&dir, &mut |_, n| {
        if n.starts_with('a') {
            fs::write(dir.join(format!("b-{n}")), b"y").unwrap();
        }
    });
    for n in &names {
        assert_eq!(
            seen.iter().filter(|s| *s == n).count(),
            1,
            "{n}: listed as often while names were added"
        );
    }
    fs::remove_dir_all(m.mnt.join("remove_all")).unwrap();
    assert!(!m.mnt.join("remove_all").exists());
}

#[test]
fn a_secret_is_served_read_only_from_the_host_and_never_reaches_the_upper_or_a_packet() {
    // "A secret is served from its host file at each request, read-only:
    // a write, truncate or metadata change fails with EROFS, its name
    // cannot be removed, renamed or replaced (EBUSY) or linked (EXDEV);
    // its bytes are never in the upper directory, a packet or a receipt."
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let t = tmp.path();
    const TOKEN: &[u8] = b"sk-test-7f3a9c-NEVER-IN-A-PACKET";
    let host = t.join("secrets/auth.json");
    write(t, "secrets/auth.json", TOKEN);
    let spec = format!("dir/auth.json={}", host.display());
    let m = mount_ws(t, &p, &["--secret", &spec]);
    let at = m.path("dir/auth.json");
    assert_eq!(fs::read(&at).unwrap(), TOKEN);
    let md = fs::metadata(&at).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o400);
    assert_eq!(md.len(), TOKEN.len() as u64);
    let names = names_in(&m.path("dir"), |_| true);
    assert!(names.contains(&"auth.json".to_string()), "{names:?}");
    assert!(names.contains(&"sub".to_string()), "{names:?}");

    // A token refresh written in place, or by truncation: EROFS.
    let w = fs::OpenOptions::new().append(true).open(&at);
    assert_eq!(errno_of(w.and_then(|mut f| f.write_all(b"x"))), libc::EROFS);
    assert_eq!(
        errno_of(fs::OpenOptions::new().write(true).truncate(true).open(&at)),
        libc::EROFS
    );
    assert_eq!(
        errno_of(fs::set_permissions(&at, fs::Permissions::from_mode(0o600))),
        libc::EROFS
    );
    // Written aside and renamed over it, removed, moved, linked: refused.
    write(&m.mnt, "dir/auth.json.tmp", b"{\"refreshed\":true}");
    assert_eq!(
        errno_of(fs::rename(m.path("dir/auth.json.tmp"), &at)),
        libc::EBUSY
    );
    assert_eq!(errno_of(fs::remove_file(&at)), libc::EBUSY);
    assert_eq!(errno_of(fs::rename(&at, m.path("stolen"))), libc::EBUSY);
    assert_eq!(errno_of(fs::hard_link(&at, m.path("stolen"))), libc::EXDEV);
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&at)
        ),
        libc::EEXIST
    );
    // Its directory, emptied of everything else, still holds it.
    for name in names_in(&m.path("dir"), |n| n != "auth.json") {
        let p = m.path("dir").join(name);
        if p.is_dir() {
            fs::remove_dir_all(&p).unwrap();
        } else {
            fs::remove_file(&p).unwrap();
        }
    }
    assert_eq!(names_in(&m.path("dir"), |_| true), ["auth.json"]);
    assert_eq!(errno_of(fs::remove_dir(m.path("dir"))), libc::ENOTEMPTY);
    write(&m.mnt, "dir/kept.txt", b"the agent's own file\n");

    // Rotated on the host: served as it is now.
    const ROTATED: &[u8] = b"sk-test-rotated-2-NEVER-IN-A-PACKET-EITHER";
    write(t, "secrets/auth.json", ROTATED);
    assert_eq!(fs::read(&at).unwrap(), ROTATED);

    let s = m.status();
    assert_eq!(s["secrets"][0]["path"], "dir/auth.json");
    assert_eq!(s["secrets"][0]["host"], host.to_str().unwrap());

    let out = t.join("sealed.packet");
    let receipt = t.join("sealed.receipt.json");
    run([
        "seal",
        m.mnt.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--receipt",
        receipt.to_str().unwrap(),
        "--rebase",
    ])
    .ok();
    // Still served after the rebase.
    assert_eq!(fs::read(&at).unwrap(), ROTATED);
    let upper = m.upper.clone();
    m.umount();
    let grep = |path: &Path| {
        let hay = fs::read(path).unwrap();
        for needle in [TOKEN, ROTATED] {
            assert!(
                !hay.windows(needle.len()).any(|w| w == needle),
                "{} holds the secret's bytes",
                path.display()
            );
        }
    };
    grep(&out);
    grep(&receipt);
    for f in files_under(&upper) {
        grep(&f);
    }
    let listing = tar_listing(&out);
    assert!(!listing.contains("auth.json\n"), "{listing}");
    assert!(listing.contains("workspace/dir/kept.txt"), "{listing}");
}

#[test]
fn a_secret_is_refused_where_it_cannot_be_shown_and_nothing_is_mounted() {
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let t = tmp.path();
    write(t, "host/auth.json", b"token");
    fs::create_dir_all(t.join("mnt")).unwrap();
    let host = t.join("host/auth.json");
    let mount = |secret: &str| {
        run([
            "mount",
            p.to_str().unwrap(),
            t.join("mnt").to_str().unwrap(),
            "--upper",
            t.join("upper").to_str().unwrap(),
            "--part",
            "workspace",
            "--secret",
            secret,
        ])
    };
    // Refused before the upper directory is touched: its form, the host file.
    for (spec, why) in [
        (
            format!("../a={}", host.display()),
            "not a path inside the view",
        ),
        (
            format!("dir//a={}", host.display()),
            "not a path inside the view",
        ),
        (
            format!("dir/a={}", t.join("host/none").display()),
            "cannot read",
        ),
        (
            format!("dir/a={}", t.join("host").display()),
            "not a regular file",
        ),
    ] {
        let e = mount(&spec).fails(7, "secret_unusable").clone();
        assert!(e["message"].as_str().unwrap().contains(why), "{spec}: {e}");
        assert!(
            !t.join("upper").exists(),
            "{spec}: the upper directory was made"
        );
    }
    // Refused once the view is known: its directory must be one.
    for (spec, why) in [
        (format!("nodir/a={}", host.display()), "is not a directory"),
        (
            format!("README.md/a={}", host.display()),
            "is not a directory",
        ),
    ] {
        let r = mount(&spec);
        let e = r.fails(7, "secret_unusable");
        assert!(e["message"].as_str().unwrap().contains(why), "{spec}: {e}");
        // Nothing mounted: the mountpoint is the empty directory it was.
        assert_eq!(fs::read_dir(t.join("mnt")).unwrap().count(), 0, "{spec}");
    }
    mount("no-equals-sign").fails(2, "usage");
    // The same path given twice.
    let spec = format!("dir/auth.json={}", host.display());
    let r = run([
        "mount",
        p.to_str().unwrap(),
        t.join("mnt").to_str().unwrap(),
        "--upper",
        t.join("upper2").to_str().unwrap(),
        "--secret",
        &spec,
        "--secret",
        &spec,
    ]);
    let e = r.fails(7, "secret_unusable");
    assert!(e["message"].as_str().unwrap().contains("twice"), "{e}");
}

#[test]
fn a_mountpoint_can_be_mounted_again_while_a_copy_of_its_last_mount_lives_on_elsewhere() {
    // "A mount copied into another mount namespace (a sandbox a harness
    // started: bwrap) is served until that namespace ends; the mountpoint
    // can be mounted again meanwhile." Before, the old daemon kept its
    // control socket and the new mount failed: `a sessionfs daemon
    // already serves` (Codex's sandbox made the harness test flaky).
    if !fuse_available() {
        return;
    }
    let (tmp, p) = setup();
    let t = tmp.path();
    let old = mount_ws(t, &p, &[]);
    let old_pid = old.pid();
    let mut sandbox = KillOnDrop(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sleep", "60"])
            .spawn()
            .expect("unshare (util-linux)"),
    );
    let sandbox_pid = sandbox.0.id();
    let mnt = old.mnt.clone();
    wait_for("the sandbox's copy of the mount", || {
        fs::read_to_string(format!("/proc/{sandbox_pid}/mountinfo"))
            .is_ok_and(|m| m.contains(mnt.to_str().unwrap()))
    });
    run(["umount", mnt.to_str().unwrap(), "--lazy"]).ok();
    std::mem::forget(old); // unmounted here; its daemon serves the sandbox
    assert!(
        Path::new(&format!("/proc/{old_pid}")).exists(),
        "the old daemon serves the sandbox's copy"
    );
    let new = Mounted::new(&p, &mnt, &t.join("upper-2"), &["--part", "workspace"]);
    assert_eq!(new.status()["pid"], new.pid());
    // The old daemon ends with the sandbox, leaving the new one's socket.
    let _ = sandbox.0.kill();
    let _ = sandbox.0.wait();
    wait_for("the old daemon to exit", || {
        fs::read_to_string(format!("/proc/{old_pid}/stat")).map_or(true, |s| {
            s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
        })
    });
    assert_eq!(new.status()["pid"], new.pid());
    new.umount();
}
