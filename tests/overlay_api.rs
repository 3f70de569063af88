//! The overlay without the kernel: random operation sequences applied
//! through the `Overlay` API and to a plain directory give the same results
//! (errnos through the adapter's table) and the same tree; replaying the
//! journal into a fresh `Overlay` gives the same tree again.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::ops::{FIFO, NAMES, OUTSIDE, Op, apply, op, opened};
use common::*;
use proptest::prelude::*;
use sessionfs::api::Limits;
use sessionfs::api::Packet;
use sessionfs::api::Part;
use sessionfs::api::errno;
use sessionfs::api::{Caller, Error, Kind, Options, Overlay, ROOT, SetAttr};

const ME: Caller = Caller { uid: 0, gid: 0 };

fn open(packet: &Path, upper: &Path) -> Overlay {
    let p = Packet::open(packet, &Limits::DEFAULT).unwrap();
    Overlay::mount(
        p,
        upper,
        Options {
            uid: 0,
            gid: 0,
            part: Some(Part::Workspace),
        },
    )
    .unwrap()
}

/// Resolves `path` as the kernel's path walk would: symlinks are followed
/// in every component but the last, and in the last too when `follow`.
fn walk(o: &Overlay, path: &str, follow: bool, depth: u32) -> Result<u64, Error> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut dir = ROOT;
    let mut dir_path: Vec<String> = Vec::new();
    for (k, c) in comps.iter().enumerate() {
        let ino = o.lookup(dir, c.as_bytes())?.ino;
        let last = k + 1 == comps.len();
        if o.getattr(ino)?.kind == Kind::Symlink && (!last || follow) {
            if depth > 8 {
                return Err(eloop());
            }
            let t = String::from_utf8(o.readlink(ino)?).unwrap();
            let mut rest = dir_path.join("/");
            if !rest.is_empty() {
                rest.push('/');
            }
            rest.push_str(&t);
            for r in &comps[k + 1..] {
                rest.push('/');
                rest.push_str(r);
            }
            return walk(o, &rest, follow, depth + 1);
        }
        dir = ino;
        dir_path.push(c.to_string());
    }
    Ok(dir)
}

fn resolve(o: &Overlay, path: &str) -> Result<u64, Error> {
    walk(o, path, false, 0)
}

/// A directory on the way to a name: always followed, and a directory (the
/// kernel's path walk fails with ENOTDIR before it asks the daemon, so a
/// rename from under a file fails so even when its target's parent is gone).
fn resolve_dir(o: &Overlay, path: &str) -> Result<u64, Error> {
    let ino = walk(o, path, true, 0)?;
    match o.getattr(ino)?.kind {
        Kind::Dir => Ok(ino),
        _ => Err(Error::NotDir),
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn resolve_follow(o: &Overlay, path: &str, _depth: u32) -> Result<u64, Error> {
    walk(o, path, true, 0)
}

/// Follows symlinks in the last component textually, as open(O_CREAT)
/// does: a dangling link names the file to create.
fn final_path(o: &Overlay, path: &str) -> Result<String, Error> {
    let mut p = path.to_string();
    for _ in 0..8 {
        let (dir, name) = split(&p);
        let d = resolve_dir(o, dir)?;
        match o.lookup(d, name.as_bytes()) {
            Ok(a) if a.kind == Kind::Symlink => {
                let t = String::from_utf8(o.readlink(a.ino)?).unwrap();
                p = if dir.is_empty() {
                    t
                } else {
                    format!("{dir}/{t}")
                };
            }
            _ => return Ok(p),
        }
    }
    Err(eloop())
}

/// The kernel resolves symlinks, not the overlay: the harness reports a
/// loop with the kernel's errno.
fn eloop() -> Error {
    Error::upper("symlink loop")(std::io::Error::from_raw_os_error(libc::ELOOP))
}

fn write_at(
    o: &Overlay,
    path: &str,
    off: Option<u64>,
    data: &[u8],
    truncate: bool,
    create: bool,
) -> Result<(), Error> {
    let path = final_path(o, path)?;
    let ino = match resolve(o, &path) {
        Ok(i) => Some(i),
        Err(Error::NotFound) if create => None,
        Err(e) => return Err(e),
    };
    if let Some(i) = ino {
        if o.getattr(i)?.kind == Kind::Dir {
            return Err(Error::IsDir);
        }
    }
    // As the kernel does it: no open request, and O_TRUNC as a SETATTR.
    let ino = match ino {
        Some(i) => {
            if truncate {
                o.setattr(
                    i,
                    SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    },
                )?;
            }
            i
        }
        None => {
            let (dir, name) = split(&path);
            let d = resolve_dir(o, dir)?;
            o.create(d, name.as_bytes(), 0o644, ME)?.ino
        }
    };
    let off = match off {
        Some(v) => v,
        None => o.getattr(resolve(o, &path)?)?.size,
    };
    o.write(ino, off, data).map(|_| ())
}

/// The same operation through the overlay API.
fn api(o: &Overlay, op: &Op) -> Result<String, i32> {
    let n = |i: &usize| NAMES[*i];
    let e = |x: Error| errno(&x).code();
    if let Some(a) = opened(op)
        && let Ok(ino) = resolve_follow(o, n(a), 0)
        && o.getattr(ino).is_ok_and(|a| a.kind == Kind::Fifo)
    {
        return Ok(FIFO.into());
    }
    let r: Result<String, Error> = (|| match op {
        Op::Write(a, b) => write_at(o, n(a), Some(0), b, true, true).map(|_| String::new()),
        Op::Append(a, b) => write_at(o, n(a), None, b, false, false).map(|_| String::new()),
        Op::WriteAt(a, off, b) => {
            write_at(o, n(a), Some(*off), b, false, false).map(|_| String::new())
        }
        Op::Truncate(a, l) => {
            let ino = resolve_follow(o, n(a), 0)?;
            if o.getattr(ino)?.kind == Kind::Dir {
                return Err(Error::IsDir);
            }
            o.setattr(
                ino,
                SetAttr {
                    size: Some(*l),
                    ..SetAttr::default()
                },
            )
            .map(|_| String::new())
        }
        Op::Mkdir(a) => {
            let (d, name) = split(n(a));
            o.mkdir(resolve_dir(o, d)?, name.as_bytes(), 0o755, ME)
                .map(|_| String::new())
        }
        Op::Rmdir(a) => {
            let (d, name) = split(n(a));
            o.rmdir(resolve_dir(o, d)?, name.as_bytes())
                .map(|_| String::new())
        }
        Op::Unlink(a) => {
            let (d, name) = split(n(a));
            o.unlink(resolve_dir(o, d)?, name.as_bytes())
                .map(|_| String::new())
        }
        Op::Rename(a, b) => {
            let ((d1, n1), (d2, n2)) = (split(n(a)), split(n(b)));
            let (p1, p2) = (resolve_dir(o, d1)?, resolve_dir(o, d2)?);
            o.rename(p1, n1.as_bytes(), p2, n2.as_bytes(), false, false)
                .map(|_| String::new())
        }
        Op::Symlink(a, b) => {
            let (d, name) = split(n(b));
            o.symlink(resolve_dir(o, d)?, name.as_bytes(), n(a).as_bytes(), ME)
                .map(|_| String::new())
        }
        Op::Link(a, b) => {
            let src = resolve(o, n(a))?;
            let (d, name) = split(n(b));
            o.link(src, resolve_dir(o, d)?, name.as_bytes())
                .map(|_| String::new())
        }
        Op::Chmod(a, m) => o
            .setattr(
                resolve_follow(o, n(a), 0)?,
                SetAttr {
                    mode: Some(*m),
                    ..SetAttr::default()
                },
            )
            .map(|_| String::new()),
        Op::ReadDir(a) => {
            let mut v: Vec<String> = o
                .readdir(resolve_follow(o, n(a), 0)?, 2, usize::MAX)?
                .iter()
                .map(|e| e.name.to_string())
                .collect();
            v.sort();
            Ok(v.join(","))
        }
        Op::Mkfifo(a) => {
            let (d, name) = split(n(a));
            o.mknod(resolve_dir(o, d)?, name.as_bytes(), 0o010644, 0, ME)
                .map(|_| String::new())
        }
        Op::SymlinkOut(a) => {
            let (d, name) = split(n(a));
            o.symlink(resolve_dir(o, d)?, name.as_bytes(), OUTSIDE.as_bytes(), ME)
                .map(|_| String::new())
        }
        Op::Read(a) => {
            let ino = resolve_follow(o, n(a), 0)?;
            let mut buf = Vec::new();
            o.read(ino, 0, 1 << 20, &mut buf)?;
            Ok(format!(
                "{} bytes {:?}",
                buf.len(),
                &buf[..buf.len().min(16)]
            ))
        }
    })();
    r.map_err(e)
}

/// The whole tree through the API: path -> (kind, perm, size, content or target).
fn api_tree(o: &Overlay) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(String::new(), ROOT)];
    while let Some((path, ino)) = stack.pop() {
        for e in o.readdir(ino, 2, usize::MAX).unwrap().iter() {
            let p = if path.is_empty() {
                e.name.to_string()
            } else {
                format!("{path}/{}", e.name)
            };
            let a = o.getattr(e.ino).unwrap();
            let desc = match a.kind {
                Kind::Dir => {
                    stack.push((p.clone(), e.ino));
                    format!("dir {:o}", a.perm)
                }
                Kind::Symlink => format!(
                    "symlink {}",
                    String::from_utf8(o.readlink(e.ino).unwrap()).unwrap()
                ),
                Kind::Fifo => format!("fifo {:o}", a.perm),
                _ => {
                    let mut buf = Vec::new();
                    o.read(e.ino, 0, u32::MAX, &mut buf).unwrap();
                    format!("file {:o} {}", a.perm, digest(&buf))
                }
            };
            out.insert(p, desc);
        }
    }
    out
}

fn digest(data: &[u8]) -> String {
    sessionfs::api::Sha256::of(data).to_hex()
}

fn disk_tree(root: &Path) -> BTreeMap<String, String> {
    snapshot(root)
        .into_iter()
        .map(|(rel, _)| {
            let p = root.join(&rel);
            let m = fs::symlink_metadata(&p).unwrap();
            let desc = if m.file_type().is_symlink() {
                format!("symlink {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                format!("dir {:o}", m.permissions().mode() & 0o7777)
            } else if !m.is_file() {
                format!("fifo {:o}", m.permissions().mode() & 0o7777)
            } else {
                format!(
                    "file {:o} {}",
                    m.permissions().mode() & 0o7777,
                    digest(&fs::read(&p).unwrap())
                )
            };
            (rel, desc)
        })
        .collect()
}

/// Applies `ops` through the API and to an unpacked copy, comparing every
/// result and tree, then replays the journal.
fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let (packet, model) = model_packet(tmp.path());
    let upper = tmp.path().join("upper");
    let o = open(&packet, &upper);
    prop_assert_eq!(api_tree(&o), disk_tree(&model));
    for (k, op) in ops.iter().enumerate() {
        let got = api(&o, op);
        let want = apply(&model, op);
        prop_assert_eq!(&got, &want, "step {} {:?}", k, op);
        prop_assert_eq!(
            api_tree(&o),
            disk_tree(&model),
            "tree after step {} {:?}",
            k,
            op
        );
    }
    drop(o);
    let again = open(&packet, &upper);
    prop_assert_eq!(
        api_tree(&again),
        disk_tree(&model),
        "after replaying the journal"
    );
    Ok(())
}

#[test]
fn renaming_from_under_a_file_to_a_missing_parent_is_enotdir() {
    // Found by the property test: "d" a hard link to a file, "emptydir"
    // removed; rename("d/e", "emptydir/b") fails on the source's parent
    // first, as the kernel's walk does.
    check(&[Op::Link(0, 14), Op::Rmdir(9), Op::Rename(15, 13)]).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn overlay_api_matches_a_plain_directory_and_replays(ops in prop::collection::vec(op(), 1..50)) {
        check(&ops)?;
    }
}

/// Applies `ops` through the API and to an unpacked copy, then seals the
/// overlay in process (mtimes zeroed): the packet is, byte for byte, the
/// one `pack --zero-mtimes` makes of the copy ("seal gives the bytes pack
/// gives", without a kernel).
fn check_seal(ops: &[Op]) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let (packet, model) = model_packet(tmp.path());
    let o = open(&packet, &tmp.path().join("upper"));
    for op in ops {
        let _ = api(&o, op);
        let _ = apply(&model, op);
    }
    let sealed = tmp.path().join("sealed.packet");
    let mut opts = seal_options(sealed.clone(), None);
    opts.zero_mtimes = true;
    o.seal(&opts, &|_| {}).unwrap();
    let packed = tmp.path().join("packed.packet");
    pack(&model, &packed, &["--zero-mtimes"]);
    prop_assert!(
        fs::read(&sealed).unwrap() == fs::read(&packed).unwrap(),
        "the seal differs from pack of the same tree"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn an_in_process_seal_is_pack_of_the_same_tree(ops in prop::collection::vec(op(), 1..30)) {
        check_seal(&ops)?;
    }
}

/// An overlay of a packet holding one file, `a` (one byte), in `tmp`.
fn overlay_of_one_file(tmp: &Path) -> Overlay {
    let ws = tmp.join("ws");
    fs::create_dir_all(&ws).unwrap();
    fs::write(ws.join("a"), b"a").unwrap();
    let packet = packet_of(&ws, tmp, "p", &[]);
    open(&packet, &tmp.join("upper"))
}

/// A seal gets the change gate while writers keep it busy. Changes took it
/// recursively, letting one in whenever another held it, so a few threads
/// writing with no pause between them held a seal off for as long as they
/// ran (it never finished here while six did).
#[test]
fn a_seal_is_not_held_off_by_writers_that_never_pause() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let o = overlay_of_one_file(tmp.path());
    let inos: Vec<u64> = (0..6)
        .map(|k| {
            o.create(ROOT, format!("f{k}").as_bytes(), 0o644, ME)
                .unwrap()
                .ino
        })
        .collect();
    let out = tmp.path().join("sealed.packet");
    let opts = seal_options(out.clone(), None);
    let stop = AtomicBool::new(false);
    let (done, sealed) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        for &ino in &inos {
            let (o, stop) = (&o, &stop);
            s.spawn(move || {
                // Within the first page and never ending on its boundary,
                // so no write looks like the first half of a split one
                // (which a seal would wait out; see `split`).
                let mut off = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    o.write(ino, off % 4000, &[7u8; 8]).unwrap();
                    off += 8;
                }
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        let (o, opts) = (&o, &opts);
        s.spawn(move || done.send(o.seal(opts, &|_| {}).map(|r| r.entries)).unwrap());
        let in_time = sealed.recv_timeout(Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        let entries = in_time
            .expect("the seal did not get in within 20 s while the writers ran")
            .unwrap();
        // The root, `a` and the six files.
        assert_eq!(entries, 8);
    });
    run(["verify", out.to_str().unwrap()]).ok();
}

/// A change gets the state while lookups keep it busy: they took it
/// recursively, letting one in whenever another held it, so threads looking
/// names up without a pause held a `create` off (for seconds with six,
/// where a daemon runs with `--threads 8`).
#[test]
fn a_change_is_not_held_off_by_lookups_that_never_pause() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let o = overlay_of_one_file(tmp.path());
    let stop = AtomicBool::new(false);
    let (done, made) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (o, stop) = (&o, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let a = o.lookup(ROOT, b"a").unwrap();
                    o.getattr(a.ino).unwrap();
                    o.forget(a.ino, 1);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        let o = &o;
        s.spawn(move || {
            for k in 0..50 {
                o.create(ROOT, format!("n{k}").as_bytes(), 0o644, ME)
                    .unwrap();
            }
            done.send(()).unwrap();
        });
        let in_time = made.recv_timeout(Duration::from_secs(10));
        stop.store(true, Ordering::Relaxed);
        in_time.expect("50 creates did not get in within 10 s while the lookups ran");
    });
    assert_eq!(o.readdir(ROOT, 0, 100).unwrap().len(), 2 + 1 + 50);
}

/// Lookups go on while a seal walks the tree, and so does a `forget` that
/// drops a node: it waited for the seal's walk to drop it, its dispatch
/// thread serving nothing meanwhile, and with lookups taking the state
/// fairly they queued behind it, so the whole mount stopped answering for
/// as long as the walk took. The node goes once the seal is done.
#[test]
fn lookups_and_forgets_go_on_while_a_seal_walks_the_tree() {
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let o = overlay_of_one_file(tmp.path());
    // Unlinked while the kernel holds it: its `forget` drops the node.
    let x = o.create(ROOT, b"x", 0o644, ME).unwrap().ino;
    o.unlink(ROOT, b"x").unwrap();
    let bar = tmp.path().join("barrier");
    arm_barrier(&bar, "collecting");
    let opts = seal_options(tmp.path().join("sealed.packet"), Some(bar.clone()));
    let (answered, answers) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let (o, opts) = (&o, &opts);
        let sealer = s.spawn(move || o.seal(opts, &|_| {}).map(|r| r.entries));
        wait_reached(&bar, "collecting");
        // The forget does not wait for the walk either: the node goes
        // once the seal is done.
        let (forgot, forgotten) = std::sync::mpsc::channel();
        s.spawn(move || {
            o.forget(x, 1);
            forgot.send(()).unwrap();
        });
        let forgot_in_time = forgotten.recv_timeout(Duration::from_secs(10));
        s.spawn(move || {
            let a = o.lookup(ROOT, b"a").map(|a| a.ino);
            answered.send(a.and_then(|ino| o.getattr(ino))).unwrap();
        });
        let in_time = answers.recv_timeout(Duration::from_secs(10));
        fs::write(bar.join("collecting.go"), b"").unwrap();
        let attr = in_time
            .expect("no lookup answered within 10 s while the seal walked the tree")
            .unwrap();
        assert_eq!(attr.size, 1);
        // The root and `a`: `x` is gone.
        assert_eq!(sealer.join().unwrap().unwrap(), 2);
        forgot_in_time.expect("a forget waited for the seal's walk");
        assert!(matches!(o.getattr(x), Err(Error::NotFound)));
    });
}
