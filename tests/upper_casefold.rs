//! The upper directory on a case-folding file system, as on a Mac (APFS
//! folds case by default): docs/upper-format.md says why the layout is
//! safe there. Made here as ext4 with `-O casefold` on a loop file and a
//! `chattr +F` directory; where this machine cannot make one (no root, no
//! loop device, mkfs.ext4 or a kernel without casefold support), the test
//! says why and is skipped.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A case-folding directory: `dir`, on an ext4 loop mount at `mnt`,
/// unmounted on drop.
struct CaseFolding {
    _mount: FsMount,
    dir: PathBuf,
}

impl CaseFolding {
    /// Makes one in `tmp`, or says why it cannot (`Err`).
    fn make(tmp: &Path) -> Result<CaseFolding, String> {
        let image = tmp.join("casefold.img");
        fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .map_err(|e| format!("cannot make an image file: {e}"))?;
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "casefold"])
            .arg(&image)
            .output()
            .map_err(|e| format!("cannot run mkfs.ext4: {e}"))?;
        if !mkfs.status.success() {
            return Err(format!(
                "mkfs.ext4 -O casefold failed: {}",
                String::from_utf8_lossy(&mkfs.stderr).trim()
            ));
        }
        let mnt = tmp.join("casefold");
        fs::create_dir(&mnt).unwrap();
        let mount = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !mount.status.success() {
            return Err(format!(
                "cannot mount an ext4 image with casefold through a loop device (the kernel \
                 needs CONFIG_UNICODE; root and /dev/loop-control too): {}",
                String::from_utf8_lossy(&mount.stderr).trim()
            ));
        }
        let mounted = FsMount::adopt(&mnt);
        let dir = mnt.join("folds");
        fs::create_dir(&dir).unwrap();
        let chattr = Command::new("chattr").arg("+F").arg(&dir).output();
        if !chattr.as_ref().is_ok_and(|o| o.status.success()) {
            return Err(format!("chattr +F failed: {chattr:?}"));
        }
        // It must really fold, or this test proves nothing.
        fs::write(dir.join("Probe"), b"x").unwrap();
        assert!(dir.join("PROBE").exists(), "chattr +F made no folding");
        fs::remove_file(dir.join("probe")).unwrap();
        Ok(CaseFolding {
            _mount: mounted,
            dir,
        })
    }
}

#[test]
fn an_upper_on_a_case_folding_directory_keeps_names_differing_in_case() {
    // upper-format.md: "The layout is safe on a case-insensitive file
    // system": names that differ only in case on the mount are two
    // entries, across a remount and a seal.
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let folds = match CaseFolding::make(tmp.path()) {
        Ok(f) => f,
        Err(why) => {
            eprintln!("SKIPPED: no case-folding directory on this machine: {why}");
            return;
        }
    };
    let ws = tmp.path().join("ws");
    write(&ws, "README.md", b"lower readme");
    write(&ws, "Notes.md", b"notes");
    let packet = packet_of(&ws, tmp.path(), "p", &[]);
    let upper = folds.dir.join("upper");
    let mnt = tmp.path().join("mnt");
    let m = Mounted::new(&packet, &mnt, &upper, &["--part", "workspace"]);
    // Beside a lower name, and both new: many files, so that data files
    // fill several shards.
    fs::write(m.path("readme.md"), b"upper readme").unwrap();
    for d in ["Dir", "dir"] {
        fs::create_dir(m.path(d)).unwrap();
        for i in 0..70 {
            fs::write(m.path(&format!("{d}/F{i}")), format!("{d} {i}")).unwrap();
            fs::write(m.path(&format!("{d}/f{i}")), format!("{d} small {i}")).unwrap();
        }
    }
    fs::rename(m.path("Notes.md"), m.path("NOTES.md")).unwrap();
    let check = |m: &Mounted| {
        assert_eq!(fs::read(m.path("README.md")).unwrap(), b"lower readme");
        assert_eq!(fs::read(m.path("readme.md")).unwrap(), b"upper readme");
        assert_eq!(fs::read(m.path("Dir/F69")).unwrap(), b"Dir 69");
        assert_eq!(fs::read(m.path("dir/f0")).unwrap(), b"dir small 0");
        assert_eq!(fs::read_dir(m.path("dir")).unwrap().count(), 140);
        assert!(!m.path("Notes.md").exists());
        assert_eq!(fs::read(m.path("NOTES.md")).unwrap(), b"notes");
    };
    check(&m);
    // The journal replayed over the upper's data files.
    let m = m.remount_workspace(&packet);
    check(&m);
    // A packet refuses names that collide when folded (packet-format.md),
    // so seal names one; with the collisions gone it seals.
    let out = tmp.path().join("s.packet");
    let o = out.to_str().unwrap();
    let mp = m.mnt.to_str().unwrap();
    run(["seal", mp, "-o", o]).fails(7, "path_collision");
    fs::remove_file(m.path("README.md")).unwrap();
    fs::remove_dir_all(m.path("Dir")).unwrap();
    for i in 0..70 {
        fs::remove_file(m.path(&format!("dir/F{i}"))).unwrap();
    }
    run(["seal", mp, "-o", o]).ok();
    m.umount();
    let into = tmp.path().join("into");
    unpack(&out, &into, &["--part", "workspace"]);
    assert_eq!(fs::read(into.join("readme.md")).unwrap(), b"upper readme");
    assert_eq!(fs::read(into.join("NOTES.md")).unwrap(), b"notes");
    assert_eq!(fs::read(into.join("dir/f5")).unwrap(), b"dir small 5");
    assert_eq!(fs::read_dir(into.join("dir")).unwrap().count(), 70);
}
