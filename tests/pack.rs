//! `pack` against real trees: determinism, exclusions, symlinks, special
//! files, refusals, limits, and round trips through `unpack`.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

fn digest(v: &Value) -> String {
    v["digest"].as_str().unwrap().to_owned()
}

#[test]
fn same_tree_same_bytes_whatever_the_umask_owner_and_creation_order() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    sample_tree(&a);
    // Build the same tree again in reverse creation order, under another
    // umask, with other owners.
    let b = tmp.path().join("b");
    let script = format!(
        "umask 077 && mkdir -p {b} && cd {a} && find . -depth -print | sort -r | while read p; do \
           if [ -L \"$p\" ]; then cp -P \"$p\" {b}/\"$p\"; elif [ -d \"$p\" ]; then mkdir -p {b}/\"$p\"; \
           else mkdir -p {b}/$(dirname \"$p\") && cp -p \"$p\" {b}/\"$p\"; fi; done && chown -R 1234:5678 {b}",
        a = a.display(),
        b = b.display()
    );
    let st = Command::new("sh").arg("-c").arg(&script).status().unwrap();
    assert!(st.success());
    assert_eq!(snapshot(&a).len(), snapshot(&b).len());
    let pa = tmp.path().join("a.packet");
    let pb = tmp.path().join("b.packet");
    let ra = pack(&a, &pa, &["--file-sha256"]);
    let rb = pack(&b, &pb, &["--file-sha256"]);
    assert_eq!(digest(&ra), digest(&rb));
    assert_eq!(
        fs::read(&pa).unwrap(),
        fs::read(&pb).unwrap(),
        "byte-identical packets"
    );
    assert_eq!(ra["file_sha256"], rb["file_sha256"]);
}

#[test]
fn mtimes_are_recorded_unless_zeroed() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let p1 = tmp.path().join("1.packet");
    let d1 = digest(&pack(&ws, &p1, &[]));
    let z1 = digest(&pack(
        &ws,
        &tmp.path().join("z1.packet"),
        &["--zero-mtimes"],
    ));
    set_mtime(&ws.join("README.md"), 1_600_000_000_000_000_001);
    let d2 = digest(&pack(&ws, &tmp.path().join("2.packet"), &[]));
    let z2 = digest(&pack(
        &ws,
        &tmp.path().join("z2.packet"),
        &["--zero-mtimes"],
    ));
    assert_ne!(d1, d2, "an mtime change changes the digest");
    assert_eq!(z1, z2, "--zero-mtimes addresses content only");
    // The manifest records nanoseconds, the header whole seconds.
    let listing = Command::new("tar")
        .args(["--full-time", "-tvf"])
        .arg(&p1)
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    assert!(
        listing.contains("2023-11-14 22:13:20 workspace/README.md"),
        "{listing}"
    );
}

#[test]
fn round_trip_restores_bytes_modes_and_nanosecond_mtimes() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let p = tmp.path().join("p.packet");
    let r = pack(&ws, &p, &[]);
    let out = tmp.path().join("out");
    let u = run([
        "unpack".as_ref(),
        p.as_os_str(),
        "--into".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(u.ok()["digest"], r["digest"]);
    assert_eq!(snapshot(&ws), snapshot(&out.join("workspace")));
    for rel in ["README.md", "data/big.bin", "bin/run.sh"] {
        let a = fs::metadata(ws.join(rel)).unwrap();
        let b = fs::metadata(out.join("workspace").join(rel)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (a.mtime(), a.mtime_nsec()),
            (b.mtime(), b.mtime_nsec()),
            "{rel}"
        );
    }
    // pack -> unpack -> pack gives the same digest.
    let r2 = pack(&out.join("workspace"), &tmp.path().join("p2.packet"), &[]);
    assert_eq!(digest(&r), digest(&r2));
}

#[test]
fn credentials_are_excluded_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let secrets = [
        ".ssh/id_ed25519",
        ".aws/credentials",
        ".gnupg/pubring.kbx",
        ".netrc",
        "_netrc",
        ".npmrc",
        ".pypirc",
        ".git-credentials",
        ".pgpass",
        "keys/id_rsa",
        "id_dsa",
        "id_ecdsa",
        "id_ed25519",
        "tls/server.pem",
        "tls/server.key",
        "a.p12",
        "a.pfx",
        ".env",
        ".env.local",
        "app/.env.production",
    ];
    let kept = [
        ".env.example",
        ".env.sample",
        ".env.template",
        ".env.dist",
        ".env.defaults",
        "id_rsa.pub",
        "src/key.rs",
    ];
    for s in secrets.iter().chain(kept.iter()) {
        write(&ws, s, b"x");
    }
    let h = tmp.path().join("codex");
    for f in [
        "auth.json",
        ".credentials.json",
        "secrets/token",
        "cache/secrets",
        "sessions/rollout.jsonl",
        "history.jsonl",
    ] {
        write(&h, f, b"{}");
    }
    let out = tmp.path().join("p.packet");
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "--harness",
        h.to_str().unwrap(),
        "--harness-kind",
        "codex",
        "-o",
        out.to_str().unwrap(),
    ]);
    let v = r.ok();
    let excluded: Vec<&str> = excluded_paths(v);
    for want in [
        "workspace/.ssh",
        "workspace/.aws",
        "workspace/.gnupg",
        "workspace/.netrc",
        "workspace/keys/id_rsa",
        "workspace/tls/server.pem",
        "workspace/tls/server.key",
        "workspace/.env",
        "workspace/.env.local",
        "workspace/app/.env.production",
        "harness/auth.json",
        "harness/.credentials.json",
        "harness/secrets",
        "harness/cache/secrets",
    ] {
        assert!(
            excluded.contains(&want),
            "{want} not reported in {excluded:?}"
        );
    }
    // Nothing excluded is in the packet; everything kept is.
    let listing = tar_listing(&out);
    for s in secrets {
        assert!(
            !listing.lines().any(|l| l == format!("workspace/{s}")),
            "{s} leaked"
        );
    }
    assert!(!listing.contains("secrets/token") && !listing.contains("harness/auth.json"));
    for k in kept {
        assert!(
            listing.lines().any(|l| l == format!("workspace/{k}")),
            "{k} missing"
        );
    }
    assert!(
        listing
            .lines()
            .any(|l| l == "harness/sessions/rollout.jsonl")
    );
}

/// A file reached by a hard link under an innocent name, from the other
/// part or the same one, is left out with the credential it shares its
/// bytes with; other hard links are still packed, as independent files,
/// and so are the other names of a file the user left out by path.
#[test]
fn other_names_of_excluded_files_are_excluded() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let h = tmp.path().join("codex");
    write(&h, "auth.json", b"{\"token\":\"sk-secret\"}");
    write(&h, "history.jsonl", b"{}");
    write(&ws, ".env", b"API_KEY=secret");
    write(&ws, "notes.txt", b"notes");
    fs::create_dir_all(ws.join("copies")).unwrap();
    fs::hard_link(h.join("auth.json"), ws.join("copies/config.json")).unwrap();
    fs::hard_link(ws.join(".env"), ws.join("copies/settings")).unwrap();
    fs::hard_link(ws.join(".env"), ws.join("z-settings")).unwrap();
    fs::hard_link(ws.join("notes.txt"), ws.join("copies/notes.txt")).unwrap();
    // A key linked as a database: the database's side file goes with it.
    write(&ws, "tls/server.key", b"-----BEGIN PRIVATE KEY-----");
    fs::hard_link(ws.join("tls/server.key"), ws.join("copies/cache.db")).unwrap();
    write(&ws, "copies/cache.db-wal", b"pages");
    // A time the format cannot hold is not reported for a name left out.
    let before_1970 = nix::sys::time::TimeSpec::new(-5, 0);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &ws.join("tls/server.key"),
        &before_1970,
        &before_1970,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    // A name the user left out by path: its other names are still packed.
    write(&ws, "app1/lib.js", b"lib");
    fs::create_dir_all(ws.join("app2")).unwrap();
    fs::hard_link(ws.join("app1/lib.js"), ws.join("app2/lib.js")).unwrap();
    let out = tmp.path().join("p.packet");
    let args = |out: &Path| {
        let mut a: Vec<String> = ["pack", "--workspace"].map(String::from).to_vec();
        a.push(ws.display().to_string());
        a.extend(["--harness".into(), h.display().to_string()]);
        a.extend(["--harness-kind".into(), "codex".into()]);
        a.extend([
            "--exclude".into(),
            "workspace/app1/lib.js".into(),
            "-o".into(),
        ]);
        a.push(out.display().to_string());
        a
    };
    let r = run(args(&out));
    let v = r.ok();
    assert_eq!(
        exclusion(v, "workspace/copies/config.json"),
        Some(serde_json::json!({"rule": "hard_link", "of": "harness/auth.json"})),
        "{v}"
    );
    for linked in ["workspace/copies/settings", "workspace/z-settings"] {
        assert_eq!(
            exclusion(v, linked),
            Some(serde_json::json!({"rule": "hard_link", "of": "workspace/.env"})),
            "{v}"
        );
    }
    assert_eq!(
        exclusion(v, "workspace/copies/cache.db-wal"),
        Some(
            serde_json::json!({"rule": "sqlite_side_file", "database": "workspace/copies/cache.db"})
        ),
        "{v}"
    );
    assert_eq!(v["clamped_mtimes"], serde_json::json!([]), "{v}");
    assert_packed(
        &out,
        &[
            "config.json",
            "settings",
            "auth.json",
            ".env",
            "cache.db",
            "server.key",
        ],
        &[
            "workspace/notes.txt",
            "workspace/copies/notes.txt",
            "workspace/app2/lib.js",
        ],
    );
    // The result is in path order, whatever order the walk met them in.
    let paths = excluded_paths(v);
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted);
    // `--keep` of the excluded name keeps its other names too.
    let out2 = tmp.path().join("p2.packet");
    let mut a = args(&out2);
    a.extend(["--keep".into(), ".env".into()]);
    let v = run(a).ok().clone();
    assert!(exclusion(&v, "workspace/z-settings").is_none(), "{v}");
    assert!(
        tar_listing(&out2)
            .lines()
            .any(|l| l == "workspace/z-settings")
    );
}

/// A hard link from a packed name to a file inside a directory left out
/// for holding credentials (`.ssh`, `.aws`, codex's `secrets`) is left out
/// too, though the walk never entered that directory, and so are such
/// files seen again through bind mounts in the workspace; a mount inside
/// such a directory is not entered to look.
#[test]
fn other_names_of_files_in_excluded_directories_are_excluded() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let h = tmp.path().join("codex");
    write(
        &ws,
        ".ssh/id_ed25519",
        b"-----BEGIN OPENSSH PRIVATE KEY-----",
    );
    write(&ws, ".aws/sso/cache/token", b"aws-secret");
    write(&h, "secrets/api", b"sk-secret");
    write(&h, "history.jsonl", b"{}");
    write(&ws, "pub/readme", b"public");
    fs::hard_link(ws.join(".ssh/id_ed25519"), ws.join("key.txt")).unwrap();
    fs::create_dir_all(ws.join("deep")).unwrap();
    fs::hard_link(ws.join(".aws/sso/cache/token"), ws.join("deep/t")).unwrap();
    fs::hard_link(h.join("secrets/api"), ws.join("api.txt")).unwrap();
    // Public files with another name, seen again through a bind mount
    // inside `.ssh`: not entered, so not taken for credentials.
    fs::hard_link(ws.join("pub/readme"), ws.join("pub/readme2")).unwrap();
    fs::create_dir_all(ws.join(".ssh/mnt")).unwrap();
    let _bind = FsMount::bind(&ws.join("pub"), &ws.join(".ssh/mnt"));
    // The harness's `secrets` and `auth.json` bind-mounted into the
    // workspace, under names no workspace rule leaves out.
    write(&h, "auth.json", b"{\"token\":\"sk-secret\"}");
    write(&ws, "mounted/auth", b"");
    let _bind_file = FsMount::bind(&h.join("auth.json"), &ws.join("mounted/auth"));
    fs::create_dir_all(ws.join("mounted/s")).unwrap();
    let _bind_dir = FsMount::bind(&h.join("secrets"), &ws.join("mounted/s"));
    let pack = |extra: &[&str]| {
        let out = tmp.path().join("p.packet");
        let _ = fs::remove_file(&out);
        let mut a = vec!["pack", "--workspace", ws.to_str().unwrap()];
        a.extend(["--harness", h.to_str().unwrap(), "--harness-kind", "codex"]);
        a.extend(["-o", out.to_str().unwrap()]);
        a.extend(extra);
        (run(a), out)
    };
    let (r, out) = pack(&[]);
    let v = r.ok();
    assert_hard_links(
        v,
        &[
            ("workspace/key.txt", "workspace/.ssh/id_ed25519"),
            ("workspace/deep/t", "workspace/.aws/sso/cache/token"),
            ("workspace/api.txt", "harness/secrets/api"),
            ("workspace/mounted/auth", "harness/auth.json"),
            ("workspace/mounted/s/api", "harness/secrets/api"),
        ],
    );
    assert_packed(
        &out,
        &[
            "key.txt",
            "deep/t",
            "api",
            ".ssh",
            ".aws",
            "secrets",
            "mounted/auth",
        ],
        &[
            "workspace/pub/readme",
            "workspace/pub/readme2",
            "workspace/deep",
            "workspace/mounted/s",
        ],
    );
    // A credential left out by `--exclude` as well is a credential still.
    write(&ws, "tls/server.pem", b"-----BEGIN PRIVATE KEY-----");
    fs::hard_link(ws.join("tls/server.pem"), ws.join("cert.txt")).unwrap();
    let (r, _) = pack(&["--exclude", ".ssh", "--exclude", "*.pem"]);
    let v = r.ok();
    assert_hard_links(
        v,
        &[
            ("workspace/key.txt", "workspace/.ssh/id_ed25519"),
            ("workspace/cert.txt", "workspace/tls/server.pem"),
        ],
    );
    // A file bind-mounted inside `.ssh` is not stat'ed through (its
    // server may hang): the public file it shows stays packed.
    write(&ws, ".ssh/shown", b"");
    let _bind_in = FsMount::bind(&ws.join("pub/readme"), &ws.join(".ssh/shown"));
    let (r, out) = pack(&[]);
    assert!(exclusion(r.ok(), "workspace/pub/readme").is_none());
    assert!(
        tar_listing(&out)
            .lines()
            .any(|l| l == "workspace/pub/readme")
    );
    // Many subdirectories, read with few handles open.
    for i in 0..100 {
        fs::create_dir_all(ws.join(format!(".aws/d{i:03}"))).unwrap();
    }
    write(&ws, ".aws/d083/credentials", b"aws-secret");
    fs::hard_link(ws.join(".aws/d083/credentials"), ws.join("notes.txt")).unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -n 64 && exec \"$@\"")
        .arg("sh")
        .arg(bin());
    cmd.args(["pack", "--workspace", ws.to_str().unwrap(), "-o"])
        .arg(&out);
    let o = cmd.output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_hard_links(
        &v,
        &[("workspace/notes.txt", "workspace/.aws/d083/credentials")],
    );
    // The names looked at in all those directories count together against
    // the entry limit, and the refusal names the directory it was reached
    // in.
    for i in 0..20 {
        write(&ws, &format!(".ssh/known_hosts.{i}"), b"host");
    }
    let (r, out) = pack(&["--max-entries", "110"]);
    let e = r.fails(5, "limit_exceeded");
    let at = e["path"].as_str().unwrap();
    assert!(["workspace/.ssh", "workspace/.aws"].contains(&at), "{e}");
    assert!(!out.exists());
    // A credential directory that is a mount point of a local file system
    // (a container's `-v ~/.ssh:/workspace/.ssh`) is read: a key in it
    // mounted again under another name is left out.
    let ws3 = tmp.path().join("ws3");
    fs::create_dir_all(ws3.join(".ssh")).unwrap();
    let _ssh = FsMount::tmpfs(&ws3.join(".ssh"), "1m");
    write(
        &ws3,
        ".ssh/id_ed25519",
        b"-----BEGIN OPENSSH PRIVATE KEY-----",
    );
    write(&ws3, "deploy_key", b"");
    let _key = FsMount::bind(&ws3.join(".ssh/id_ed25519"), &ws3.join("deploy_key"));
    let out3 = tmp.path().join("p3.packet");
    let a = ["pack", "--workspace", ws3.to_str().unwrap(), "-o"];
    let v = run(a.into_iter().chain([out3.to_str().unwrap()]))
        .ok()
        .clone();
    assert_hard_links(&v, &[("workspace/deploy_key", "workspace/.ssh/id_ed25519")]);
    // The other part's root inside a credential directory is not read as
    // one of its files: a harness in `.aws` is packed.
    let ws2 = tmp.path().join("ws2");
    write(&ws2, ".aws/h/config.toml", b"model = 1");
    let out2 = tmp.path().join("p2.packet");
    let mut a = vec!["pack", "--workspace", ws2.to_str().unwrap()];
    let h2 = ws2.join(".aws/h");
    a.extend([
        "--harness",
        h2.to_str().unwrap(),
        "--harness-kind",
        "generic",
    ]);
    a.extend(["-o", out2.to_str().unwrap()]);
    let v = run(a).ok().clone();
    assert!(exclusion(&v, "harness/config.toml").is_none(), "{v}");
    assert!(
        tar_listing(&out2)
            .lines()
            .any(|l| l == "harness/config.toml")
    );
}

/// The packet `out` holds no member whose path contains one of `gone`,
/// and holds each of `kept`.
fn assert_packed(out: &Path, gone: &[&str], kept: &[&str]) {
    let listing = tar_listing(out);
    for gone in gone {
        assert!(!listing.contains(gone), "{gone} packed:\n{listing}");
    }
    for kept in kept {
        assert!(listing.lines().any(|l| l == *kept), "{kept} missing");
    }
}

/// `result` excludes each `(path, of)` as another name of `of`.
fn assert_hard_links(result: &Value, links: &[(&str, &str)]) {
    for (path, of) in links {
        assert_eq!(
            exclusion(result, path),
            Some(serde_json::json!({"rule": "hard_link", "of": of})),
            "{path}: {result}"
        );
    }
}

/// The memory pack holds small files in between its passes is bounded by
/// the address space it may use (`ulimit -v`) as by a cgroup's limit: a
/// budget of 256 MiB under `ulimit -v 800000` made the allocator abort
/// the run, with no result.
#[test]
fn the_hold_is_bounded_by_the_address_space() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    for i in 0..40 {
        write(&ws, &format!("f{i:02}"), &vec![i as u8; 1 << 20]);
    }
    let out = tmp.path().join("p.packet");
    let hold_max = |limit: &str| {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("{limit} exec \"$@\""))
            .arg("sh")
            .arg(bin())
            .args(["-vv", "pack", "--workspace", ws.to_str().unwrap(), "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{limit}: {o:?}");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        let at = stderr.find("hold_max=").expect("hold_max logged");
        stderr[at..].split_whitespace().next().unwrap().to_owned()
    };
    // 40 files of 1 MiB: held under the default budget, not under a
    // sixteenth of 469 MiB of address space.
    assert_eq!(hold_max(""), "hold_max=Some(1048576)");
    assert_eq!(hold_max("ulimit -v 480000 &&"), "hold_max=None");
}

/// Under an address-space limit (`ulimit -v`), glibc's malloc is kept to
/// two arenas (sessionfs starts itself again with `MALLOC_ARENA_MAX=2`):
/// with an arena of 64 MiB reserved for each thread that allocates, a pack
/// of 60 MB under `ulimit -v 300000` died in an allocation (exit 134, no
/// result).
#[test]
fn a_pack_under_an_address_space_limit_stays_within_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let mut seed = 1u64;
    for i in 0..3000 {
        let data: Vec<u8> = (0..20_000)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        write(&ws, &format!("d{}/f{i}", i % 30), &data);
    }
    let out = tmp.path().join("p.packet");
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 300000 && exec \"$@\"")
        .arg("sh")
        .arg(bin())
        .args(["pack", "--workspace", ws.to_str().unwrap(), "-o"])
        .arg(&out)
        .env_remove("MALLOC_ARENA_MAX")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "sessionfs.pack-result/2");
    assert_eq!(v["files"], 3000);
    run(["verify", out.to_str().unwrap()]).ok();
    // Run through the dynamic loader, this process's executable is the
    // loader: it is not started again (the loader would take `--version`
    // for the program to run).
    let loader = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"]
        .into_iter()
        .find(|l| Path::new(l).exists());
    let Some(loader) = loader else {
        eprintln!("no dynamic loader at a known path: its case is not tried");
        return;
    };
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 300000 && exec \"$@\"")
        .arg("sh")
        .arg(loader)
        .arg(bin())
        .arg("--version")
        .env_remove("MALLOC_ARENA_MAX")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("sessionfs "),
        "{o:?}"
    );
}

/// The reason `result` gives for excluding `path`, if it does.
fn exclusion(result: &Value, path: &str) -> Option<Value> {
    result["excluded"]
        .as_array()?
        .iter()
        .find(|e| e["path"] == path)
        .map(|e| e["reason"].clone())
}

#[test]
fn macos_finder_and_spotlight_litter_is_left_out_and_reported() {
    // CLI.md: "Finder and Spotlight litter ... excluded by default ...
    // `--keep` keeps one knowingly". A tree packed on a Mac gives the
    // packet a Linux pack of the same tree without the litter gives.
    let tmp = tempfile::tempdir().unwrap();
    let clean = tmp.path().join("clean");
    write(&clean, "notes.md", b"notes");
    write(&clean, "src/main.rs", b"fn main() {}");
    let mac = tmp.path().join("mac");
    write(&mac, "notes.md", b"notes");
    write(&mac, "src/main.rs", b"fn main() {}");
    write(&mac, ".DS_Store", b"\0\0\0\x01Bud1");
    write(&mac, "src/.DS_Store", b"Bud1");
    write(&mac, "._notes.md", b"\0\x05\x16\x07AppleDouble");
    write(&mac, ".Spotlight-V100/x", b"index");
    write(&mac, ".fseventsd/fseventsd-uuid", b"log");
    write(&mac, ".Trashes/501/old.txt", b"trash");
    write(&mac, ".TemporaryItems/t", b"tmp");
    for ws in [&clean, &mac] {
        // The same mtimes in both trees, so that the packets can be equal.
        for f in ["notes.md", "src/main.rs"] {
            set_mtime(&ws.join(f), 1_700_000_000_000_000_000);
        }
        for d in ["src", ""] {
            set_mtime(&ws.join(d), 1_700_000_000_000_000_000);
        }
    }
    let v = pack(&mac, &tmp.path().join("mac.packet"), &[]);
    assert_eq!(
        exclusion_reasons(&v, "what"),
        [
            ("workspace/.DS_Store", ".DS_Store"),
            ("workspace/.Spotlight-V100", ".Spotlight-V100 directory"),
            ("workspace/.TemporaryItems", ".TemporaryItems directory"),
            ("workspace/.Trashes", ".Trashes directory"),
            ("workspace/._notes.md", "AppleDouble ._* file"),
            ("workspace/.fseventsd", ".fseventsd directory"),
            ("workspace/src/.DS_Store", ".DS_Store"),
        ],
        "{v}"
    );
    assert!(
        exclusion_reasons(&v, "rule")
            .iter()
            .all(|(_, rule)| *rule == "macos_metadata"),
        "{v}"
    );
    let c = pack(&clean, &tmp.path().join("clean.packet"), &[]);
    assert_eq!(v["digest"], c["digest"], "the litter changed the packet");
    // `--keep .DS_Store` keeps it (at any depth), and only it.
    let kept = pack(
        &mac,
        &tmp.path().join("kept.packet"),
        &["--keep", ".DS_Store"],
    );
    let listing = tar_listing(&tmp.path().join("kept.packet"));
    assert!(listing.lines().any(|l| l == "workspace/.DS_Store"));
    assert!(listing.lines().any(|l| l == "workspace/src/.DS_Store"));
    assert!(!listing.contains("._notes.md") && !listing.contains("Spotlight"));
    assert_eq!(excluded_paths(&kept).len(), 5, "{kept}");
}

#[test]
fn a_hard_link_into_a_credential_directory_is_left_out_or_warned_of() {
    // CLI.md: "On Linux 5.6 and later it can tell a mount without touching
    // it; elsewhere it reads nothing there and, when a packed file has
    // other names, warns on stderr." The second half is what macOS runs:
    // checked when the fallbacks are forced.
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(
        &ws,
        ".ssh/id_ed25519",
        b"-----BEGIN OPENSSH PRIVATE KEY-----",
    );
    fs::hard_link(ws.join(".ssh/id_ed25519"), ws.join("key.txt")).unwrap();
    let out = tmp.path().join("p.packet");
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let v = r.ok();
    if fallbacks_forced() {
        assert_eq!(exclusion(v, "workspace/key.txt"), None, "{v}");
        assert!(
            r.stderr
                .contains("cannot look in it for other names of its files"),
            "{}",
            r.stderr
        );
    } else {
        assert_hard_links(v, &[("workspace/key.txt", "workspace/.ssh/id_ed25519")]);
    }
}

#[test]
fn user_patterns_and_keep() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    for f in [
        "target/debug/x",
        "a.log",
        "sub/b.log",
        "cert.pem",
        "src/x.rs",
    ] {
        write(&ws, f, b"x");
    }
    let out = tmp.path().join("p.packet");
    let v = pack(
        &ws,
        &out,
        &[
            "--exclude",
            "workspace/target",
            "--exclude",
            "*.log",
            "--keep",
            "*.pem",
        ],
    );
    let ex: Vec<&str> = excluded_paths(&v);
    assert_eq!(
        ex,
        ["workspace/a.log", "workspace/sub/b.log", "workspace/target"]
    );
    assert_eq!(v["excluded"][0]["reason"]["rule"], "excluded");
    assert_eq!(v["excluded"][0]["reason"]["pattern"], "*.log");
    // Each excluded entry is named with its own type.
    std::os::unix::fs::symlink("a.log", ws.join("link.log")).unwrap();
    nix::unistd::mkfifo(&ws.join("pipe.log"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    fs::create_dir_all(ws.join("dir.log")).unwrap();
    let typed = pack(
        &ws,
        &tmp.path().join("typed.packet"),
        &["--exclude", "*.log"],
    );
    let types: Vec<(&str, &str)> = typed["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    for want in [
        ("workspace/a.log", "file"),
        ("workspace/dir.log", "dir"),
        ("workspace/link.log", "symlink"),
        ("workspace/pipe.log", "fifo"),
    ] {
        assert!(types.contains(&want), "{want:?} in {types:?}");
    }
    let listing = tar_listing(&out);
    assert!(
        listing.contains("workspace/cert.pem"),
        "--keep lifted the *.pem default"
    );
    let bad = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--exclude",
        "a[",
    ]);
    bad.fails(2, "bad_pattern");
    // A relative path pattern would match nothing: refused, with the
    // spelling that works.
    let bad = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--exclude",
        "keys/prod.json",
    ]);
    let e = bad.fails(2, "bad_pattern");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("workspace/keys/prod.json"),
        "{e}"
    );
    // So would a pattern for the harness part when there is none.
    for flag in ["--exclude", "--keep"] {
        let bad = run([
            "pack",
            "--workspace",
            ws.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            flag,
            "harness/sessions/**",
        ]);
        let e = bad.fails(2, "bad_pattern");
        assert!(e["message"].as_str().unwrap().contains("--harness"), "{e}");
    }
}

#[test]
fn sqlite_side_files_follow_their_database() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    for f in [
        "app.db",
        "app.db-wal",
        "app.db-shm",
        "secret.db",
        "secret.db-wal",
        "secret.db-journal",
        "orphan-wal",
    ] {
        write(&ws, f, b"x");
    }
    let out = tmp.path().join("p.packet");
    // Excluding the database takes its side files; excluding a side file
    // alone does not split a kept database from its WAL.
    let v = pack(&ws, &out, &["--exclude", "secret.db", "--exclude", "*-wal"]);
    let ex: Vec<(String, String)> = v["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["reason"]["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(ex.contains(&("workspace/secret.db".into(), "excluded".into())));
    assert!(ex.contains(&("workspace/secret.db-wal".into(), "sqlite_side_file".into())));
    assert!(ex.contains(&(
        "workspace/secret.db-journal".into(),
        "sqlite_side_file".into()
    )));
    assert!(ex.contains(&("workspace/orphan-wal".into(), "excluded".into())));
    let listing = tar_listing(&out);
    assert!(
        listing.contains("workspace/app.db-wal"),
        "a kept database keeps its WAL: {listing}"
    );
    assert!(listing.contains("workspace/app.db-shm"));
}

#[test]
fn opencode_database_is_refused_unless_excluded_or_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let h = tmp.path().join("oc");
    for f in [
        "opencode.db",
        "opencode.db-wal",
        "auth.json",
        "mcp-auth.json",
        "storage/session.json",
    ] {
        write(&h, f, b"x");
    }
    let out = tmp.path().join("p.packet");
    let base = [
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "--harness",
        h.to_str().unwrap(),
        "--harness-kind",
        "opencode",
        "-o",
        out.to_str().unwrap(),
    ];
    let r = run(base);
    let e = r.fails(7, "credential_store");
    assert_eq!(e["path"], "harness/opencode.db");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("--exclude opencode.db")
    );
    assert!(!out.exists(), "no packet written");
    let mut args = base.to_vec();
    args.extend(["--exclude", "opencode.db"]);
    let v = run(&args).ok().clone();
    let ex: Vec<&str> = excluded_paths(&v);
    assert!(
        ex.contains(&"harness/opencode.db-wal")
            && ex.contains(&"harness/auth.json")
            && ex.contains(&"harness/mcp-auth.json")
    );
}

#[test]
fn symlinks_are_never_followed_and_absolute_ones_into_the_root_are_rebased() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "data.txt", b"data");
    write(&ws, "sub/deep/x", b"x");
    let root = ws.display().to_string();
    let links: &[(&str, String, &str)] = &[
        ("alias", "sub/deep".into(), "sub/deep"),
        (
            "abs",
            format!("{root}/alias/../data.txt"),
            "alias/../data.txt",
        ),
        ("sub/up", format!("{root}//data.txt"), "../data.txt"),
        ("sub/deep/dir", format!("{root}/sub/"), "../../sub/"),
        ("rootlink", root.clone(), "."),
        // Rebased by the rule, and climbing out of the part all the same.
        (
            "climbs",
            format!("{root}/sub/../../other"),
            "sub/../../other",
        ),
        ("sibling", format!("{root}2/x"), "__same__"),
        ("venv-python", "/usr/bin/python3".into(), "/usr/bin/python3"),
        (
            "outside",
            format!("{}/etc", tmp.path().display()),
            "__same__",
        ),
    ];
    for (at, target, _) in links {
        symlink(target, ws.join(at)).unwrap();
    }
    // A symlinked directory's contents are not packed.
    symlink("/etc", ws.join("etc-link")).unwrap();
    let out = tmp.path().join("p.packet");
    let v = pack(&ws, &out, &[]);
    let restored = tmp.path().join("r");
    unpack(&out, &restored, &[]);
    for (at, target, want) in links {
        let got = fs::read_link(restored.join("workspace").join(at)).unwrap();
        let want = if *want == "__same__" {
            target.as_str()
        } else {
            want
        };
        assert_eq!(got.to_str().unwrap(), want, "{at}");
    }
    assert!(
        !restored.join("workspace/etc-link/passwd").exists()
            || fs::symlink_metadata(restored.join("workspace/etc-link"))
                .unwrap()
                .file_type()
                .is_symlink()
    );
    let ext: Vec<&str> = v["external_symlinks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        ext,
        [
            "workspace/climbs",
            "workspace/etc-link",
            "workspace/outside",
            "workspace/sibling",
            "workspace/venv-python"
        ]
    );
    assert_eq!(v["rebased_symlinks"].as_array().unwrap().len(), 5);
    // --reject-external-symlinks refuses instead, naming the link.
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        tmp.path().join("q").to_str().unwrap(),
        "--reject-external-symlinks",
    ]);
    let e = r.fails(7, "external_symlink");
    assert!(ext.contains(&e["path"].as_str().unwrap()), "{e}");
    // Staying by its text, leaving through another link (`alias -> ..`):
    // external as strict unpack resolves it, and refused under the flag.
    let via = tmp.path().join("via");
    write(&via, "sub/deep/f", b"f");
    symlink("..", via.join("sub/deep/alias")).unwrap();
    symlink("alias/../../x", via.join("sub/deep/l")).unwrap();
    let p = tmp.path().join("via.packet");
    let v = pack(&via, &p, &[]);
    assert_eq!(
        v["external_symlinks"],
        serde_json::json!([{"path": "workspace/sub/deep/l", "target": "alias/../../x"}])
    );
    let strict = tmp.path().join("via-strict");
    let r = run([
        "unpack",
        p.to_str().unwrap(),
        "--into",
        strict.to_str().unwrap(),
        "--part",
        "workspace",
        "--strict-symlinks",
    ]);
    assert_eq!(
        r.fails(3, "symlink_escapes")["path"],
        "workspace/sub/deep/l"
    );
    let r = run([
        "pack",
        "--workspace",
        via.to_str().unwrap(),
        "-o",
        tmp.path().join("q").to_str().unwrap(),
        "--reject-external-symlinks",
    ]);
    assert_eq!(
        r.fails(7, "external_symlink")["path"],
        "workspace/sub/deep/l"
    );
    // A rebased target that climbs out is refused on its own too.
    let only = tmp.path().join("only");
    write(&only, "f", b"f");
    let up = format!("{}/../x", only.display());
    symlink(&up, only.join("up")).unwrap();
    let r = run([
        "pack",
        "--workspace",
        only.to_str().unwrap(),
        "-o",
        tmp.path().join("q").to_str().unwrap(),
        "--reject-external-symlinks",
    ]);
    let e = r.fails(7, "external_symlink");
    assert_eq!(e["path"], "workspace/up");
    assert!(!tmp.path().join("q").exists());
}

#[test]
fn special_files_are_dropped_and_hard_links_become_files() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"shared");
    fs::hard_link(ws.join("a"), ws.join("b")).unwrap();
    nix::unistd::mkfifo(
        &ws.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    nix::sys::stat::mknod(
        &ws.join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        libc::makedev(1, 3),
    )
    .unwrap();
    let out = tmp.path().join("p.packet");
    let v = pack(&ws, &out, &[]);
    let dropped: Vec<(&str, &str)> = v["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        dropped,
        [
            ("workspace/fifo", "fifo"),
            ("workspace/null", "char_device"),
            ("workspace/sock", "socket")
        ]
    );
    let r = tmp.path().join("r");
    unpack(&out, &r, &[]);
    assert_eq!(fs::read(r.join("workspace/b")).unwrap(), b"shared");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        fs::metadata(r.join("workspace/a")).unwrap().ino(),
        fs::metadata(r.join("workspace/b")).unwrap().ino()
    );
}

#[test]
fn refuses_names_that_would_not_restore_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["README", "readme"], "path_collision"),
        (&["caf\u{e9}", "cafe\u{301}"], "path_collision"),
        (&["dir/x", "DIR"], "path_collision"),
        (&["back\\slash"], "invalid_path"),
        (&["new\nline"], "invalid_path"),
    ];
    for (i, (names, kind)) in cases.iter().enumerate() {
        let ws = tmp.path().join(format!("ws{i}"));
        for n in *names {
            write(&ws, n, b"x");
        }
        let out = tmp.path().join(format!("{i}.packet"));
        let r = run([
            "pack",
            "--workspace",
            ws.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        let e = r.fails(7, kind);
        assert!(e["path"].as_str().unwrap().starts_with("workspace/"), "{e}");
        assert!(!out.exists());
    }
    // A name that is not UTF-8.
    let ws = tmp.path().join("latin1");
    fs::create_dir_all(&ws).unwrap();
    use std::os::unix::ffi::OsStrExt;
    fs::write(ws.join(std::ffi::OsStr::from_bytes(b"caf\xe9")), b"x").unwrap();
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        tmp.path().join("l.packet").to_str().unwrap(),
    ]);
    // Named so that it can be found: the byte escaped, not replaced.
    let e = r.fails(7, "non_utf8_name");
    assert_eq!(e["path"], "workspace/caf\\xe9", "{e}");
    // One an exclusion matches (by its spelling with U+FFFD for the bad
    // byte) is left out and reported, like any other, under its name as
    // shown; a directory of such names likewise.
    fs::create_dir_all(ws.join("d")).unwrap();
    fs::write(
        ws.join("d").join(std::ffi::OsStr::from_bytes(b"junk\xff")),
        b"x",
    )
    .unwrap();
    fs::write(ws.join("kept.txt"), b"kept").unwrap();
    for (patterns, excluded, entries) in [
        (
            &["caf*", "workspace/d/*"][..],
            &["workspace/caf\\xe9", "workspace/d/junk\\xff"][..],
            3, // workspace, workspace/d, workspace/kept.txt
        ),
        (
            &["workspace/c*", "d"][..],
            &["workspace/caf\\xe9", "workspace/d"][..],
            2,
        ),
    ] {
        let out = tmp.path().join("l.packet");
        let mut args = vec![
            "pack".to_string(),
            "--workspace".into(),
            ws.display().to_string(),
            "-o".into(),
            out.display().to_string(),
        ];
        for p in patterns {
            args.extend(["--exclude".into(), p.to_string()]);
        }
        let r = run(&args);
        let got: Vec<&str> = r.ok()["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(got, excluded, "{patterns:?}");
        let listed = run(["inspect", out.to_str().unwrap()]).ok().clone();
        assert_eq!(listed["entries"], entries, "{patterns:?}: {listed}");
    }
    // A symlink target that is not UTF-8 is shown the same way.
    let ws = tmp.path().join("latin1-link");
    fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(b"d\xe9j\xe0"), ws.join("l")).unwrap();
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        tmp.path().join("l.packet").to_str().unwrap(),
    ]);
    let e = r.fails(7, "non_utf8_target");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("`d\\xe9j\\xe0`"), "{e}");
    // A path given that is not UTF-8 is named the same way.
    let missing = tmp.path().join(std::ffi::OsStr::from_bytes(b"nop\xe9"));
    let r = run([
        std::ffi::OsStr::new("pack"),
        std::ffi::OsStr::new("--workspace"),
        missing.as_os_str(),
        std::ffi::OsStr::new("-o"),
        tmp.path().join("l.packet").as_os_str(),
    ]);
    let e = r.fails(6, "io");
    let want = format!("{}/nop\\xe9", tmp.path().display());
    assert_eq!(e["path"], want, "{e}");
}

#[test]
fn limits_by_flag_and_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a/b/c/d.txt", &[b'x'; 2000]);
    write(&ws, "e.txt", &[b'y'; 2000]);
    let out = tmp.path().join("p.packet");
    let o = out.to_str().unwrap();
    let w = ws.to_str().unwrap();
    let r = run(["pack", "--workspace", w, "-o", o, "--max-bytes", "3000"]);
    let e = r.fails(5, "limit_exceeded");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("SESSIONFS_MAX_BYTES")
    );
    run_env(
        ["pack", "--workspace", w, "-o", o],
        &[("SESSIONFS_MAX_ENTRIES", "4")],
    )
    .fails(5, "limit_exceeded");
    run_env(
        ["pack", "--workspace", w, "-o", o],
        &[("SESSIONFS_MAX_PATH_BYTES", "15")],
    )
    .fails(5, "limit_exceeded");
    run([
        "pack",
        "--workspace",
        w,
        "-o",
        o,
        "--max-entries",
        "99999999999",
    ])
    .fails(2, "usage");
    assert!(!out.exists());
    // Within limits it packs, and verify enforces the same limits.
    run(["pack", "--workspace", w, "-o", o]).ok();
    run(["verify", o, "--max-bytes", "3000"]).fails(5, "limit_exceeded");
    run_env(["verify", o], &[("SESSIONFS_MAX_ENTRIES", "3")]).fails(5, "limit_exceeded");
    run(["verify", o]).ok();
    // A bad value from the environment is named as such.
    let r = run_env(["verify", o], &[("SESSIONFS_MAX_BYTES", "lots")]);
    let m = r.fails(2, "usage")["message"].as_str().unwrap().to_owned();
    assert!(m.contains("SESSIONFS_MAX_BYTES"), "{m}");
}

/// A workspace whose own path is not UTF-8: absolute links into it are
/// rebased (what is stored is UTF-8), and a UTF-8 path that only looks like
/// its lossy spelling (U+FFFD for the bad byte) is not taken for it.
#[test]
fn links_into_a_root_whose_path_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join(std::ffi::OsStr::from_bytes(b"n\xffu"));
    let ws = root.join("ws");
    write(&ws, "data", b"d");
    let mut inside = ws.as_os_str().as_bytes().to_vec();
    inside.extend_from_slice(b"/data");
    symlink(std::ffi::OsStr::from_bytes(&inside), ws.join("abs")).unwrap();
    let lookalike = format!("{}/n\u{fffd}u/ws/data", tmp.path().display());
    symlink(&lookalike, ws.join("other")).unwrap();
    let out = tmp.path().join("p.packet");
    let v = pack(&ws, &out, &[]);
    assert_eq!(v["rebased_symlinks"][0]["to"], "data", "{v}");
    assert_eq!(
        v["external_symlinks"],
        serde_json::json!([{"path": "workspace/other", "target": lookalike}])
    );
    let restored = tmp.path().join("r");
    unpack(&out, &restored, &[]);
    assert_eq!(
        fs::read_link(restored.join("workspace/abs")).unwrap(),
        Path::new("data")
    );
    assert_eq!(fs::read(restored.join("workspace/abs")).unwrap(), b"d");
}

/// Paths longer than the OS takes in one call (PATH_MAX, 4096 on Linux)
/// are legal under a raised --max-path-bytes: pack and unpack open them a
/// component at a time, and the round trip gives the same bytes.
#[test]
fn paths_past_path_max_pack_and_unpack() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    // 18 levels of 250 bytes: 4,518 bytes, made a level at a time (the
    // whole path is too long for one call).
    let mut dir = fs::File::open(tmp.path()).unwrap();
    for name in std::iter::once("ws".to_string()).chain(std::iter::repeat_n("d".repeat(250), 18)) {
        let _ = nix::sys::stat::mkdirat(
            &dir,
            name.as_str(),
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        );
        dir = fs::File::from(
            nix::fcntl::openat(
                &dir,
                name.as_str(),
                nix::fcntl::OFlag::O_DIRECTORY,
                nix::sys::stat::Mode::empty(),
            )
            .unwrap(),
        );
    }
    let fd = nix::fcntl::openat(
        &dir,
        "f",
        nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    nix::unistd::write(&fd, b"deep").unwrap();
    nix::unistd::symlinkat("f", &dir, "l").unwrap();
    let (p, q) = (tmp.path().join("p.packet"), tmp.path().join("q.packet"));
    let limit = ["--max-path-bytes", "6000"];
    pack(&ws, &p, &limit);
    run(["verify", p.to_str().unwrap(), limit[0], limit[1]]).ok();
    let out = tmp.path().join("out");
    unpack(&p, &out, &limit);
    pack(&out.join("workspace"), &q, &limit);
    assert_eq!(fs::read(&p).unwrap(), fs::read(&q).unwrap());
    // Without the raised limit, the path is a limit error, not an I/O one.
    run(["verify", p.to_str().unwrap()]).fails(5, "limit_exceeded");
}

/// Readers bound the manifest at 2 KiB per entry allowed; long targets of
/// control characters (6 bytes each, escaped) take more. Pack refuses such
/// a tree before it hashes anything, rather than write a packet readers
/// refuse; with room, what it writes verifies under the same limits.
#[test]
fn pack_never_writes_a_manifest_readers_refuse() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "f", b"f");
    for i in 0..9 {
        symlink("\u{1}".repeat(4000), ws.join(format!("l{i}"))).unwrap();
    }
    let out = tmp.path().join("p.packet");
    let (w, o) = (ws.to_str().unwrap(), out.to_str().unwrap());
    let r = run(["pack", "--workspace", w, "-o", o, "--max-entries", "20"]);
    let e = r.fails(5, "limit_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("manifest bytes") && msg.contains("--max-entries"),
        "{e}"
    );
    assert!(
        e["path"].as_str().unwrap().starts_with("workspace/l"),
        "{e}"
    );
    assert!(!out.exists());
    run(["pack", "--workspace", w, "-o", o, "--max-entries", "200"]).ok();
    run(["verify", o, "--max-entries", "200"]).ok();
    run(["verify", o, "--max-entries", "20"]).fails(5, "limit_exceeded");
}

#[test]
fn output_inside_the_workspace_is_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let out = ws.join("self.packet");
    let v1 = pack(&ws, &out, &[]);
    // Packing again over the existing packet: neither it nor the temporary
    // file is taken in.
    let v2 = pack(&ws, &out, &[]);
    assert_eq!(v1["digest"], v2["digest"]);
    let reasons: Vec<&str> = v2["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"]["rule"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"output_file"), "{v2}");
    // The older packet is reported by its name; pack's own temporary file
    // (a random name) is not reported, so results repeat exactly.
    let v3 = pack(&ws, &out, &[]);
    assert_eq!(v2["excluded"], v3["excluded"]);
    assert_eq!(v3["excluded"].as_array().unwrap().len(), 1, "{v3}");
    assert_eq!(v3["excluded"][0]["path"], "workspace/self.packet");
    // Not even when a pattern names it.
    let v4 = pack(&ws, &out, &["--exclude", "*.tmp"]);
    assert_eq!(v3["excluded"], v4["excluded"]);
}

/// `-o` naming a file that is not a packet is refused, and the file kept:
/// one of the tree (replacing it would lose what was to be packed), one
/// an exclusion leaves out, one outside the tree. An older packet, or an
/// empty file (made ready by `touch`), is replaced as asked.
#[test]
fn output_naming_a_file_that_is_not_a_packet_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let notes = b"my notes, not a packet\n".repeat(40);
    write(&ws, "notes.txt", &notes);
    write(tmp.path(), "report.txt", &notes);
    for (out, extra) in [
        (ws.join("notes.txt"), None),
        (ws.join("notes.txt"), Some("notes.txt")),
        (tmp.path().join("report.txt"), None),
    ] {
        let mut args = vec![
            "pack",
            "--workspace",
            ws.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        if let Some(pattern) = extra {
            args.extend(["--exclude", pattern]);
        }
        let r = run(args);
        let e = r.fails(7, "target_unusable");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("is not a sessionfs packet"),
            "{e}"
        );
        assert_eq!(e["path"], out.to_str().unwrap());
        assert_eq!(fs::read(&out).unwrap(), notes);
    }
    let names: Vec<_> = fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "something was left behind: {names:?}");
    // A device (`-o /dev/null`: made here, as /dev/null is, so that a
    // failure replaces nothing of the machine's) and a FIFO are not files.
    let null = tmp.path().join("null");
    let fifo = tmp.path().join("fifo");
    nix::sys::stat::mknod(
        &null,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        libc::makedev(1, 3),
    )
    .expect("mknod needs root, as CI runs");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A link to a descriptor, whatever the descriptor is (here a pipe; a
    // file when stdout is redirected): `-o /dev/stdout`.
    let stdout = tmp.path().join("stdout");
    symlink("/proc/self/fd/1", &stdout).unwrap();
    let sock = tmp.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let to_fifo = tmp.path().join("to-fifo");
    symlink(&fifo, &to_fifo).unwrap();
    // The same by other spellings: /dev/stdout's own name, a relative
    // climb, a chain of links.
    let dev_stdout = tmp.path().join("dev-stdout");
    symlink("/dev/stdout", &dev_stdout).unwrap();
    let climb = tmp.path().join("climb");
    symlink("../../../../../../../../proc/self/fd/1", &climb).unwrap();
    let chain = tmp.path().join("chain");
    symlink("stdout", &chain).unwrap();
    // Through a link to a directory.
    symlink("/proc", tmp.path().join("p")).unwrap();
    let via_dir = tmp.path().join("via-dir");
    symlink("p/self/fd/1", &via_dir).unwrap();
    for (out, what) in [
        (&null, "is a device"),
        (&fifo, "is a FIFO"),
        (&stdout, "is a symlink to a process's file descriptor"),
        (&sock, "is a socket"),
        (&to_fifo, "is a symlink to a FIFO"),
        (&dev_stdout, "is a symlink to a process's file descriptor"),
        (&climb, "is a symlink to a process's file descriptor"),
        (&chain, "is a symlink to a process's file descriptor"),
        (&via_dir, "is a symlink to a process's file descriptor"),
    ] {
        let e = run([
            "pack",
            "--workspace",
            ws.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        let e = e.fails(7, "target_unusable");
        assert!(e["message"].as_str().unwrap().contains(what), "{e}");
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(
        fs::symlink_metadata(&null)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(fs::symlink_metadata(&stdout).unwrap().is_symlink());
    // Given relative, from the directory holding it: the same; and a link
    // to an ordinary packet in a directory that happens to be called
    // `proc` is replaced as asked, not followed.
    let r = Command::new(bin())
        .args(["pack", "--workspace", ws.to_str().unwrap(), "-o", "climb"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(7), "{r:?}");
    fs::create_dir_all(tmp.path().join("build/proc")).unwrap();
    symlink("build/proc/out.packet", tmp.path().join("to-build")).unwrap();
    let r = Command::new(bin())
        .args([
            "pack",
            "--workspace",
            ws.to_str().unwrap(),
            "-o",
            "to-build",
        ])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(
        fs::symlink_metadata(tmp.path().join("to-build"))
            .unwrap()
            .is_file()
    );
    assert!(!tmp.path().join("build/proc/out.packet").exists());
    // An empty file is replaced, and the packet verifies; so is that
    // packet, by the next pack.
    let empty = ws.join("new.packet");
    fs::write(&empty, b"").unwrap();
    pack(&ws, &empty, &[]);
    run(["verify", empty.to_str().unwrap()]).ok();
    write(&ws, "b", b"b");
    pack(&ws, &empty, &[]);
    run(["verify", empty.to_str().unwrap()]).ok();
}

#[test]
fn missing_or_bad_inputs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p.packet");
    let r = run([
        "pack",
        "--workspace",
        "/nonexistent/ws",
        "-o",
        out.to_str().unwrap(),
    ]);
    let e = r.fails(6, "io");
    assert!(e["message"].as_str().unwrap().contains("/nonexistent/ws"));
    write(tmp.path(), "file", b"x");
    run([
        "pack",
        "--workspace",
        tmp.path().join("file").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ])
    .fails(6, "not_a_directory");
    // A usage error names what is missing; no command at all is one too.
    let e = run(["pack", "-o", out.to_str().unwrap()]);
    assert!(
        e.fails(2, "usage")["message"]
            .as_str()
            .unwrap()
            .contains("--workspace"),
        "{}",
        e.stderr
    );
    run(["frobnicate"]).fails(2, "usage");
    run::<[&str; 0], &str>([]).fails(2, "usage");
    // --harness without its kind: never guessed (the kind picks which
    // credentials stay out).
    let e = run([
        "pack",
        "--workspace",
        tmp.path().to_str().unwrap(),
        "--harness",
        tmp.path().to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        e.fails(2, "usage")["message"]
            .as_str()
            .unwrap()
            .contains("--harness-kind")
    );
    // Logs on a pipe carry no colour codes.
    assert!(!e.stderr.contains('\x1b'), "{}", e.stderr);
    let missing = tmp.path().join("missing.packet");
    let e = run(["verify", missing.to_str().unwrap()]);
    assert!(
        e.fails(6, "io")["message"]
            .as_str()
            .unwrap()
            .contains("missing.packet")
    );
    assert_eq!(e.json["path"], missing.to_str().unwrap());
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let e = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        "/nonexistent/dir/p.packet",
    ]);
    // A destination refused (as a seal refuses it), naming the directory
    // the user must make.
    let j = e.fails(7, "target_unusable");
    assert_eq!(j["path"], "/nonexistent/dir/p.packet");
    assert!(
        j["message"]
            .as_str()
            .unwrap()
            .ends_with("its directory /nonexistent/dir does not exist; create it first"),
        "{j}"
    );
    assert!(!j["message"].as_str().unwrap().contains(".tmp"), "{j}");
    // An existing directory as the output is refused before any work.
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "-o",
        tmp.path().to_str().unwrap(),
    ]);
    let m = r.fails(7, "target_unusable")["message"].as_str().unwrap();
    assert!(m.contains("is a directory"), "{m}");
    // So is a name ending in `/`, which can only name one.
    for end in ["/", "/."] {
        let slashed = format!("{}/p.packet{end}", tmp.path().display());
        let r = run(["pack", "--workspace", ws.to_str().unwrap(), "-o", &slashed]);
        let m = r.fails(7, "target_unusable")["message"].as_str().unwrap();
        assert!(
            m.starts_with(&slashed) && m.contains("ends with `/`"),
            "{m}"
        );
        assert!(!tmp.path().join("p.packet").exists());
    }
    // And so is every other spelling of a directory, whether it exists or
    // not: `.`, `..`, `/`, `…/..`.
    let gone = format!("{}/gone/..", tmp.path().display());
    for dir in [".", "..", "/", gone.as_str()] {
        let r = run(["pack", "--workspace", ws.to_str().unwrap(), "-o", dir]);
        let m = r.fails(7, "target_unusable")["message"].as_str().unwrap();
        assert!(m.contains("directory"), "{dir}: {m}");
    }
    // Every command that reads a packet names the file it could not read.
    for cmd in ["verify", "inspect", "digest"] {
        let e = run([cmd, tmp.path().to_str().unwrap()]);
        assert_eq!(e.fails(6, "io")["path"], tmp.path().to_str().unwrap());
        let m = e.json["message"].as_str().unwrap();
        assert!(m.starts_with(tmp.path().to_str().unwrap()), "{cmd}: {m}");
    }
}

#[test]
fn help_explains_every_command_with_examples() {
    let commands = [
        "pack", "verify", "inspect", "digest", "unpack", "mount", "umount", "status", "seal",
    ];
    for cmd in commands {
        let help = |flag: &str| {
            let out = Command::new(bin()).args([cmd, flag]).output().unwrap();
            assert!(out.status.success());
            String::from_utf8(out.stdout).unwrap()
        };
        let text = help("--help");
        // The examples, before the usage line: whole command lines (none
        // wrapped), which between them use every option of the command.
        let examples = text
            .split_once("\nExamples:\n")
            .and_then(|(_, rest)| rest.split_once("\nUsage:"))
            .unwrap_or_else(|| panic!("{cmd} --help has no examples:\n{text}"))
            .0;
        for line in examples.lines().filter(|l| !l.trim().is_empty()) {
            assert!(line.starts_with("  sessionfs "), "{cmd}: `{line}`");
        }
        // Option lines: `  -o, --output <FILE>` or `      --zero-mtimes`
        // (descriptions are indented further).
        let options = text.lines().filter_map(|l| {
            let l = l
                .strip_prefix("      --")
                .map(|r| &l[l.len() - r.len() - 2..])
                .or_else(|| l.strip_prefix("  -").map(|r| &l[l.len() - r.len() - 1..]))?;
            let (short, long) = match l.strip_prefix('-').and_then(|r| r.split_once(", ")) {
                Some((s, rest)) if s.len() == 1 => (Some(format!("-{s} ")), rest),
                _ => (None, l),
            };
            let long = long.strip_prefix("--")?;
            let name = long.split([' ', '.']).next()?;
            Some((short, format!("--{name}")))
        });
        for (short, long) in options {
            if ["--help", "--verbose", "--version"].contains(&long.as_str()) {
                continue;
            }
            let used = examples.contains(&format!("{long} "))
                || examples.contains(&format!("{long}\n"))
                || short.is_some_and(|s| examples.contains(&s));
            assert!(used, "{cmd}: no example uses {long}:\n{examples}");
        }
        // The short flag gives the same help, examples included.
        assert_eq!(help("-h"), text, "{cmd} -h");
        // A usage error points at this command's help.
        let r = run([cmd, "--no-such-flag"]);
        let hint = r.fails(2, "usage")["hint"].as_str().unwrap().to_owned();
        assert!(hint.contains(&format!("sessionfs {cmd} --help")), "{hint}");
    }
    let r = run(["no-such-command"]);
    let hint = r.fails(2, "usage")["hint"].as_str().unwrap().to_owned();
    assert!(hint.contains("sessionfs --help"), "{hint}");
    // An argument that is not UTF-8 does not stop the error being told.
    use std::os::unix::ffi::OsStrExt;
    let odd = std::ffi::OsStr::from_bytes(b"\xff");
    let r = run([
        std::ffi::OsStr::new("pack"),
        "--workspace".as_ref(),
        odd,
        "--no-such-flag".as_ref(),
    ]);
    r.fails(2, "usage");
}

/// A harness inside the workspace (`--workspace ~ --harness ~/.codex`) is
/// packed once, as the harness part under its kind's rules: the workspace
/// walk leaves it out and says so, so its credentials cannot come in
/// through the workspace. The reverse likewise; the same directory for
/// both is refused.
#[test]
fn a_part_inside_the_other_is_packed_once_as_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    write(&home, "src/a", b"a");
    write(&home, ".codex/history.jsonl", b"h");
    write(
        &home,
        ".codex/auth.json",
        b"{\"OPENAI_API_KEY\":\"sk-secret\"}",
    );
    let out = tmp.path().join("p.packet");
    pack_codex_home_once(&home, &home.join(".codex"), &out);
    let r = tmp.path().join("r");
    unpack(&out, &r, &[]);
    assert_eq!(fs::read(r.join("harness/history.jsonl")).unwrap(), b"h");
    assert!(!r.join("workspace/.codex").exists());
    // The workspace inside the harness.
    let v = pack(
        &home.join("src"),
        &tmp.path().join("q.packet"),
        &[
            "--harness",
            home.to_str().unwrap(),
            "--harness-kind",
            "generic",
        ],
    );
    assert!(
        v["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == "harness/src" && e["reason"]["part"] == "workspace"),
        "{v}"
    );
    // The same directory, however spelled.
    let same = format!("{}/./", home.display());
    refused_as_overlapping(&home, Path::new(&same), &tmp.path().join("s.packet"));
}

/// Asserts that packing `ws` with `harness` to `out` is refused as
/// `parts_overlap`, writing nothing.
fn refused_as_overlapping(ws: &Path, harness: &Path, out: &Path) {
    let r = run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "--harness",
        harness.to_str().unwrap(),
        "--harness-kind",
        "codex",
        "-o",
        out.to_str().unwrap(),
    ]);
    r.fails(7, "parts_overlap");
    assert!(!out.exists());
}

/// Packs `ws` with the Codex home `home` (holding `auth.json` with
/// `sk-secret`, and met inside `ws` at `.codex`) to `out`, and checks it
/// went in once, as the harness: its credential left out there, its root
/// left out of the workspace, the secret nowhere in the packet.
fn pack_codex_home_once(ws: &Path, home: &Path, out: &Path) {
    let v = pack(
        ws,
        out,
        &[
            "--harness",
            home.to_str().unwrap(),
            "--harness-kind",
            "codex",
        ],
    );
    assert_eq!(
        exclusion_reasons(&v, "rule"),
        [
            ("harness/auth.json", "credential"),
            ("workspace/.codex", "other_part")
        ]
    );
    let bytes = fs::read(out).unwrap();
    assert!(
        !bytes.windows(9).any(|w| w == b"sk-secret"),
        "the credential was packed"
    );
}

/// A harness home reached inside the workspace through a bind mount (a pod
/// that mounts the agent's home volume at `~/.codex` and also gives it as
/// `--harness`) is known by its identity, not its path: left out of the
/// workspace, so its credentials cannot come in there; the same directory
/// bound under another name for both parts is refused.
#[test]
fn a_harness_bind_mounted_inside_the_workspace_is_packed_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let home = tmp.path().join("codex-home");
    write(&ws, "src/a", b"a");
    fs::create_dir(ws.join(".codex")).unwrap();
    write(&home, "history.jsonl", b"h");
    write(&home, "auth.json", b"{\"OPENAI_API_KEY\":\"sk-secret\"}");
    let bound = FsMount::bind(&home, &ws.join(".codex"));
    let out = tmp.path().join("p.packet");
    pack_codex_home_once(&ws, &home, &out);
    // Both parts the same directory under two names.
    refused_as_overlapping(&ws.join(".codex"), &home, &tmp.path().join("s.packet"));
    drop(bound);
}

/// A packet replaced keeps its mode: one made private is not widened.
#[test]
fn a_replaced_packet_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let out = tmp.path().join("p.packet");
    pack(&ws, &out, &[]);
    fs::set_permissions(&out, fs::Permissions::from_mode(0o600)).unwrap();
    write(&ws, "b", b"b");
    pack(&ws, &out, &[]);
    assert_eq!(
        fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        fs::read(&out)
            .unwrap()
            .windows(13)
            .any(|w| w == b"workspace/b\0\0")
    );
}

/// Packs a harness-only tree to check that the harness part is optional
/// and that its kind is recorded.
#[test]
fn harness_part_and_kind_are_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let h = tmp.path().join("h");
    write(&h, "history.jsonl", b"{}\n");
    let out = tmp.path().join("p.packet");
    run([
        "pack",
        "--workspace",
        ws.to_str().unwrap(),
        "--harness",
        h.to_str().unwrap(),
        "--harness-kind",
        "claude",
        "-o",
        out.to_str().unwrap(),
    ])
    .ok();
    let i = run(["inspect", out.to_str().unwrap()]);
    let v = i.ok();
    assert_eq!(v["harness"], "claude");
    assert_eq!(v["parts"], serde_json::json!(["harness", "workspace"]));
    let only_ws = tmp.path().join("w.packet");
    pack(&ws, &only_ws, &[]);
    let v = run(["inspect", only_ws.to_str().unwrap()]).ok().clone();
    assert_eq!(v["parts"], serde_json::json!(["workspace"]));
    assert!(v.get("harness").is_none());
    let _ = Path::new("");
}

/// Runs `pack` paused at its `hashed` barrier (between the pass that hashes
/// every file and the pass that writes them), holding at most `hold` of
/// small files' content between them, lets `change` alter the tree there,
/// and returns the exit code and the result.
fn pack_changed_between_passes(
    ws: &Path,
    out: &Path,
    hold: &str,
    change: impl FnOnce(),
) -> (i32, Value) {
    pack_changed_at("hashed", ws, out, hold, change)
}

/// The points where pack pauses under a test barrier, in order.
const PACK_POINTS: [&str; 5] = [
    "walked-roots",
    "hashed",
    "committed",
    "interrupt-deferred",
    "reported",
];

/// Starts `pack --workspace ws -o out` with its test barrier in `bar`,
/// its output captured.
fn spawn_pack(ws: &Path, out: &Path, bar: &Path) -> std::process::Child {
    with_default_signals(&mut Command::new(bin()))
        .args(["pack", "--workspace", ws.to_str().unwrap(), "-o"])
        .arg(out)
        .env("SESSIONFS_TEST_BARRIER", bar)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A fresh barrier directory `bar` where pack stops at `point` only: every
/// other point finds its `.go` file already there.
fn barrier_at(bar: &Path, point: &str) -> PathBuf {
    let _ = fs::remove_dir_all(bar);
    fs::create_dir_all(bar).unwrap();
    for p in PACK_POINTS.iter().filter(|p| **p != point) {
        fs::write(bar.join(format!("{p}.go")), b"").unwrap();
    }
    bar.to_owned()
}

/// Runs `pack` paused at its barrier `point`, lets `change` alter the tree
/// there, and returns the exit code and the result.
fn pack_changed_at(
    point: &str,
    ws: &Path,
    out: &Path,
    hold: &str,
    change: impl FnOnce(),
) -> (i32, Value) {
    pack_with_changed_at(point, ws, &[], out, hold, change)
}

/// [`pack_changed_at`], with `extra` arguments.
fn pack_with_changed_at(
    point: &str,
    ws: &Path,
    extra: &[&str],
    out: &Path,
    hold: &str,
    change: impl FnOnce(),
) -> (i32, Value) {
    let bar = barrier_at(&out.with_extension("barrier"), point);
    let child = Command::new(bin())
        .args(["pack", "--workspace", ws.to_str().unwrap()])
        .args(extra)
        .arg("-o")
        .arg(out)
        .env("SESSIONFS_TEST_BARRIER", &bar)
        .env("SESSIONFS_PACK_HOLD", hold)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_reached(&bar, point);
    change();
    fs::write(bar.join(format!("{point}.go")), b"").unwrap();
    let o = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    (o.status.code().unwrap(), v)
}

/// A directory removed or replaced between the reading of its parent and
/// its own is a change to the tree, not an I/O error.
#[test]
fn a_directory_gone_during_the_walk_is_a_change() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "sub/deep/f", b"f");
    write(&ws, "other/g", b"g");
    let out = tmp.path().join("p.packet");
    let changed = |(code, v): (i32, Value), path: &str| {
        assert_eq!(
            (code, v["kind"].as_str()),
            (6, Some("changed_while_packing")),
            "{v}"
        );
        assert_eq!(v["path"], path);
        assert!(!out.exists());
    };
    changed(
        pack_changed_at("walked-roots", &ws, &out, "0", || {
            fs::remove_dir_all(ws.join("sub")).unwrap();
        }),
        "workspace/sub",
    );
    changed(
        pack_changed_at("walked-roots", &ws, &out, "0", || {
            fs::remove_dir_all(ws.join("other")).unwrap();
            symlink("/etc", ws.join("other")).unwrap();
        }),
        "workspace/other",
    );
    // With two parts, the directory opened must be the one judged when its
    // parent was read: the harness moved into its place is not packed
    // again as the workspace's, under the workspace's rules.
    write(&ws, "sub/deep/f", b"f");
    let home = tmp.path().join("codex-home");
    write(&home, "auth.json", b"sk-secret");
    let extra = [
        "--harness",
        home.to_str().unwrap(),
        "--harness-kind",
        "codex",
    ];
    changed(
        pack_with_changed_at("walked-roots", &ws, &extra, &out, "0", || {
            fs::rename(ws.join("sub"), tmp.path().join("sub-was")).unwrap();
            fs::rename(&home, ws.join("sub")).unwrap();
        }),
        "workspace/sub",
    );
}

/// A signal once the packet is in place does not turn a finished pack
/// into an error: the run reports the packet (exit 0), which verifies. A
/// second signal then ends it at once, and the packet stays.
#[test]
fn a_signal_after_the_commit_lets_the_pack_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    write(&ws, "sub/b", b"b");
    let out = tmp.path().join("p.packet");
    for second in [false, true] {
        let _ = fs::remove_file(&out);
        let bar = barrier_at(&tmp.path().join("bar"), "committed");
        if second {
            // The signal thread pauses once it has put off the first.
            fs::remove_file(bar.join("interrupt-deferred.go")).unwrap();
        }
        let child = spawn_pack(&ws, &out, &bar);
        wait_reached(&bar, "committed");
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        wait_reached(&bar, "interrupt-deferred");
        if second {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            fs::write(bar.join("interrupt-deferred.go"), b"").unwrap();
        } else {
            fs::write(bar.join("committed.go"), b"").unwrap();
        }
        let o = child.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        if second {
            assert_eq!(
                (o.status.code(), v["kind"].as_str()),
                (Some(143), Some("interrupted")),
                "{v}"
            );
        } else {
            assert_eq!(o.status.code(), Some(0), "{v}");
            assert_eq!(v["schema"], "sessionfs.pack-result/2");
            assert_eq!(v["entries"], 4);
        }
        run(["verify", out.to_str().unwrap()]).ok();
    }
    // Two signals once the result is printed: the run ends with the code
    // of what it printed, and prints nothing more.
    let _ = fs::remove_file(&out);
    let bar = barrier_at(&tmp.path().join("bar"), "reported");
    let child = spawn_pack(&ws, &out, &bar);
    wait_reached(&bar, "reported");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    wait_reached(&bar, "interrupt-deferred");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(v["schema"], "sessionfs.pack-result/2");
}

/// A run whose result nobody reads (larger than a pipe holds: thousands of
/// exclusions) still ends on signals: the first, after the commit, is put
/// off; the second ends it within seconds (exit 143), the packet in place.
#[test]
fn signals_end_a_run_whose_stdout_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = pipe_filling_tree(tmp.path());
    let out = tmp.path().join("p.packet");
    let bar = barrier_at(&tmp.path().join("bar"), "none");
    let mut child = KillOnDrop(spawn_pack(&ws, &out, &bar));
    let pid = child.0.id();
    // Blocked writing its result to the pipe this test does not read.
    wait_for("pack to block writing its result", || {
        blocked_writing_a_pipe(pid)
    });
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_reached(&bar, "interrupt-deferred");
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_for("pack to end", || child.0.try_wait().unwrap().is_some());
    assert_eq!(child.0.wait().unwrap().code(), Some(143));
    run(["verify", out.to_str().unwrap()]).ok();
}

/// A workspace under `root` of one file and 3000 `.env` files per 4 KiB of
/// the page size: its pack result (the exclusions, about 200 KB) and its
/// `-vv` log each exceed what a pipe holds (16 pages by default).
fn pipe_filling_tree(root: &Path) -> PathBuf {
    let ws = root.join("ws");
    write(&ws, "a", b"a");
    // SAFETY: sysconf only reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    for i in 0..3000 * (page / 4096) {
        write(&ws, &format!(".env.{i}"), b"SECRET=1");
    }
    ws
}

/// Whether a thread of process `pid` is blocked writing to a pipe.
fn blocked_writing_a_pipe(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| {
            fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w.ends_with("pipe_write"))
        })
}

/// A run logging (`-vv`) to a stderr nobody reads, blocked there, still
/// ends on a signal: its temporary file removed, the interrupted error on
/// stdout, exit 143.
#[test]
fn a_signal_ends_a_run_whose_stderr_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = pipe_filling_tree(tmp.path());
    let out = tmp.path().join("p.packet");
    let mut child = KillOnDrop(
        Command::new(bin())
            .args(["-vv", "pack", "--workspace", ws.to_str().unwrap(), "-o"])
            .arg(&out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    wait_for("pack to block logging", || blocked_writing_a_pipe(pid));
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_for("pack to end", || child.0.try_wait().unwrap().is_some());
    let (code, v) = child.finished();
    assert_eq!(code, Some(143));
    assert_eq!(v["kind"], "interrupted", "{v}");
    let left = names_in(tmp.path(), |n| n.ends_with(".tmp"));
    assert!(left.is_empty(), "{left:?}");
    assert!(!out.exists());
}

/// A run whose result cannot be written to stdout (a full disk, a closed
/// pipe) is not a success: exit 6 and the reason on stderr; what it did
/// stands. One that failed keeps its own code.
#[test]
fn a_result_that_cannot_be_written_is_not_a_success() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let out = tmp.path().join("p.packet");
    let to_full = |args: &[&std::ffi::OsStr], stdout: std::process::Stdio| {
        let o = Command::new(bin())
            .args(args)
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let full = || std::process::Stdio::from(fs::File::create("/dev/full").unwrap());
    let pack_args = [
        "pack".as_ref(),
        "--workspace".as_ref(),
        ws.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    let (code, stderr) = to_full(&pack_args, full());
    assert_eq!(code, Some(6), "{stderr}");
    assert!(
        stderr.contains("cannot write the result to stdout"),
        "{stderr}"
    );
    run(["verify", out.to_str().unwrap()]).ok();
    for cmd in ["verify", "digest", "inspect"] {
        let (code, stderr) = to_full(&[cmd.as_ref(), out.as_os_str()], full());
        assert_eq!(code, Some(6), "{cmd}: {stderr}");
    }
    // A closed pipe.
    let (code, _) = to_full(
        &["digest".as_ref(), out.as_os_str()],
        std::process::Stdio::null(),
    );
    assert_eq!(code, Some(0), "a readable stdout is a success");
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    drop(read_end);
    let (code, stderr) = to_full(&["digest".as_ref(), out.as_os_str()], write_end.into());
    assert_eq!(code, Some(6), "{stderr}");
    // A failure keeps its code.
    let missing = tmp.path().join("missing.packet");
    let (code, _) = to_full(&["verify".as_ref(), missing.as_os_str()], full());
    assert_eq!(code, Some(6));
    fs::write(&missing, b"not a packet").unwrap();
    let (code, _) = to_full(&["verify".as_ref(), missing.as_os_str()], full());
    assert_eq!(code, Some(3));
}

/// Under a limit on processes (`ulimit -u`, a container's pids.max) too
/// low for its threads, a command fails as any other: one JSON error
/// naming the limit, exit 6, no panic, nothing half-written left.
#[test]
fn a_process_limit_is_an_error_not_a_panic() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let ws = tmp.path().join("ws");
    for i in 0..50 {
        write(&ws, &format!("f{i}"), b"x");
    }
    let packet = tmp.path().join("p.packet");
    pack(&ws, &packet, &[]);
    for p in [&ws, &packet] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    // `nobody`: the limit does not bind root.
    let as_nobody = |nproc: u32, args: &[&str]| {
        let o = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "prlimit",
            ])
            .arg(format!("--nproc={nproc}"))
            .arg(bin())
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            !stderr.contains("panicked"),
            "{args:?} at {nproc}: {stderr}"
        );
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?} at {nproc}: not JSON ({e}): {stderr}"));
        (o.status.code(), v)
    };
    let out = tmp.path().join("out.packet");
    let (ws_s, p_s, out_s) = (
        ws.to_str().unwrap(),
        packet.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    for args in [
        &["verify", p_s][..],
        &["inspect", p_s],
        &["pack", "--workspace", ws_s, "-o", out_s],
    ] {
        let mut failed = 0;
        for nproc in 1..=8 {
            let (code, v) = as_nobody(nproc, args);
            if code == Some(0) {
                continue;
            }
            failed += 1;
            assert_eq!((code, &v["kind"]), (Some(6), &Value::from("io")), "{v}");
            assert!(v["message"].as_str().unwrap().contains("ulimit -u"), "{v}");
            let left = names_in(tmp.path(), |n| n.ends_with(".tmp"));
            assert!(left.is_empty(), "{left:?}");
            assert!(!out.exists());
        }
        assert!(failed > 0, "{args:?} never hit the limit");
    }
}

/// What is put at the output while the packet is written, where nothing
/// was, is not replaced: the pack is refused (`target_unusable`, exit 7),
/// leaving it as it is and no temporary file.
#[test]
fn an_output_made_during_the_pack_is_not_replaced() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    for (k, what) in ["notes", "empty", "fifo", "symlink", "packet then notes"]
        .into_iter()
        .enumerate()
    {
        let out = tmp.path().join(format!("p{k}.packet"));
        if what == "packet then notes" {
            // An older packet at the start, which may be replaced; a notes
            // file by the end, which may not.
            pack(&ws, &out, &[]);
        }
        let bar = barrier_at(&tmp.path().join("bar"), "hashed");
        let mut child = KillOnDrop(spawn_pack(&ws, &out, &bar));
        wait_reached(&bar, "hashed");
        match what {
            "notes" => fs::write(&out, b"my notes").unwrap(),
            "packet then notes" => {
                fs::write(tmp.path().join("notes"), b"my notes").unwrap();
                fs::rename(tmp.path().join("notes"), &out).unwrap();
            }
            "empty" => fs::write(&out, b"").unwrap(),
            "fifo" => {
                nix::unistd::mkfifo(&out, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            _ => std::os::unix::fs::symlink("elsewhere", &out).unwrap(),
        }
        let before = fs::symlink_metadata(&out).unwrap();
        fs::write(bar.join("hashed.go"), b"").unwrap();
        let (code, v) = child.finished();
        assert_eq!(
            (code, v["kind"].as_str()),
            (Some(7), Some("target_unusable")),
            "{what}: {v}"
        );
        assert_eq!(v["path"], out.to_str().unwrap(), "{what}: {v}");
        let after = fs::symlink_metadata(&out).unwrap();
        assert_eq!(
            (after.ino(), after.len()),
            (before.ino(), before.len()),
            "{what}"
        );
        let left = names_in(tmp.path(), |n| n.ends_with(".tmp"));
        assert!(left.is_empty(), "{what}: {left:?}");
    }
}

/// The output's directory moved, or replaced by a symlink, while the
/// packet is written: the packet is placed nowhere, and no temporary file
/// is left in the directory, wherever it went, even after a signal.
#[test]
fn an_output_whose_directory_moves_is_placed_nowhere() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let bar = tmp.path().join("bar");
    for what in ["moved", "symlink", "signal"] {
        let dir = tmp.path().join(format!("out-{what}"));
        let moved = tmp.path().join(format!("moved-{what}"));
        let elsewhere = tmp.path().join(format!("elsewhere-{what}"));
        fs::create_dir_all(&dir).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        let out = dir.join("p.packet");
        barrier_at(&bar, "hashed");
        let mut child = KillOnDrop(spawn_pack(&ws, &out, &bar));
        wait_reached(&bar, "hashed");
        fs::rename(&dir, &moved).unwrap();
        match what {
            "symlink" => std::os::unix::fs::symlink(&elsewhere, &dir).unwrap(),
            "signal" => {
                unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
                // The signal ends the run while it waits at the barrier
                // (it holds nothing then); released at once, the run could
                // find its directory moved before the signal thread acts,
                // and end with that error instead (seen under load).
                let start = std::time::Instant::now();
                while child.0.try_wait().unwrap().is_none() {
                    assert!(
                        start.elapsed() < std::time::Duration::from_secs(60),
                        "the signal did not end the run waiting at the barrier"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            _ => {}
        }
        fs::write(bar.join("hashed.go"), b"").unwrap();
        let (code, v) = child.finished();
        let (want_code, want_kind) = match what {
            "signal" => (143, "interrupted"),
            _ => (7, "target_unusable"),
        };
        assert_eq!(
            (code, v["kind"].as_str()),
            (Some(want_code), Some(want_kind)),
            "{what}: {v}"
        );
        if what == "signal" {
            let message = v["message"].as_str().unwrap();
            assert!(message.ends_with("removed (1 path)"), "{v}");
        } else {
            assert_eq!(v["path"], out.to_str().unwrap(), "{what}: {v}");
        }
        for d in [&moved, &elsewhere] {
            let left = names_in(d, |_| true);
            assert!(left.is_empty(), "{what}: {} holds {left:?}", d.display());
        }
    }
}

/// An output or target whose name is as long as a name may be (255 bytes)
/// works: the temporary file and the staging directory beside it are named
/// from a shortened name, cut at a character boundary.
#[test]
fn names_of_the_longest_length_work() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let long = format!("{}x", "é".repeat(127));
    assert_eq!(long.len(), 255);
    let out = tmp.path().join(&long);
    pack(&ws, &out, &[]);
    run(["verify", out.to_str().unwrap()]).ok();
    // Again, over the packet now there.
    pack(&ws, &out, &[]);
    let into = tmp.path().join("d").join(&long);
    fs::create_dir(tmp.path().join("d")).unwrap();
    unpack(&out, &into, &[]);
    assert_eq!(fs::read(into.join("workspace/a")).unwrap(), b"a");
    let names: Vec<_> = fs::read_dir(tmp.path().join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

/// A pack stopped by a signal removes its temporary file and says so
/// (exit 128 + the signal); one killed outright leaves it, and the next
/// pack to that output leaves it out of the tree, as an older output.
#[test]
fn an_interrupted_pack_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "a", b"a");
    let out = ws.join("p.packet");
    let bar = barrier_at(&tmp.path().join("bar"), "hashed");
    let temporaries = || names_in(&ws, |n| n.ends_with(".tmp")).len();
    for (signal, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        barrier_at(&bar, "hashed");
        let child = spawn_pack(&ws, &out, &bar);
        wait_reached(&bar, "hashed");
        assert_eq!(temporaries(), 1);
        unsafe { libc::kill(child.id() as i32, signal) };
        let o = child.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (o.status.code(), v["kind"].as_str()),
            (Some(code), Some("interrupted")),
            "{v}"
        );
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .ends_with("what it had half-written was removed (1 path)"),
            "{v}"
        );
        assert_eq!(temporaries(), 0, "the temporary file is left");
        assert!(!out.exists());
    }
    // A signal it was started ignoring (SIGHUP under nohup) stays ignored.
    barrier_at(&bar, "hashed");
    let child = Command::new("nohup")
        .arg(bin())
        .args(["pack", "--workspace", ws.to_str().unwrap(), "-o"])
        .arg(&out)
        .env("SESSIONFS_TEST_BARRIER", &bar)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_reached(&bar, "hashed");
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    fs::write(bar.join("hashed.go"), b"").unwrap();
    let o = child.wait_with_output().unwrap();
    if fallbacks_forced() {
        // Where the ignored signals cannot be read (macOS): taken as not
        // ignored (SEMANTICS.md "Portability").
        assert_eq!(o.status.code(), Some(128 + libc::SIGHUP), "{o:?}");
        assert!(!out.exists());
    } else {
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        assert!(out.exists());
        fs::remove_file(&out).unwrap();
    }
    // Killed outright: its temporary file stays, and is not packed; a
    // file of a name pack would not make is.
    fs::write(ws.join(".p.packet.x1y2z3.tmp"), b"half a packet").unwrap();
    fs::write(ws.join(".p.packet.notes.tmp"), b"mine").unwrap();
    let v = pack(&ws, &out, &[]);
    assert_eq!(
        v["excluded"][0]["path"], "workspace/.p.packet.x1y2z3.tmp",
        "{v}"
    );
    assert_eq!(v["excluded"][0]["reason"]["rule"], "output_file");
    assert_eq!(v["excluded"].as_array().unwrap().len(), 1);
    assert_eq!(v["entries"], 3);
}

#[test]
fn a_file_changed_between_hashing_and_writing_is_refused() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "small.txt", b"hello, world\n");
    let big: Vec<u8> = (0..9u32 << 20).map(|i| (i % 251) as u8).collect();
    write(&ws, "big.bin", &big);
    write(&ws, "grows.txt", b"short\n");
    let out = tmp.path().join("p.packet");
    // Same size, same mtime, other bytes: only the content can tell.
    let overwrite_keeping_mtime = |rel: &str, at: u64| {
        let p = ws.join(rel);
        let m = fs::metadata(&p).unwrap();
        let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"X", at).unwrap();
        drop(f);
        set_mtime(&p, m.mtime() * 1_000_000_000 + m.mtime_nsec());
        assert_eq!(fs::metadata(&p).unwrap().len(), m.len());
    };
    let grow = || {
        let f = fs::OpenOptions::new()
            .append(true)
            .open(ws.join("grows.txt"))
            .unwrap();
        f.write_all_at(b"er\n", 6).unwrap();
    };
    // Replaced by a directory (whose read fails) or a socket (whose open
    // fails), put back after each case.
    let replace = |rel: &'static str, by: &'static str| -> Box<dyn Fn()> {
        let p = ws.join(rel);
        Box::new(move || {
            fs::rename(&p, p.with_extension("away")).unwrap();
            if by == "dir" {
                fs::create_dir(&p).unwrap();
            } else {
                std::mem::forget(std::os::unix::net::UnixListener::bind(&p).unwrap());
            }
        })
    };
    let put_back = |rel: &str| {
        let p = ws.join(rel);
        if p.with_extension("away").exists() {
            let _ = fs::remove_dir(&p).or_else(|_| fs::remove_file(&p));
            fs::rename(p.with_extension("away"), &p).unwrap();
        }
    };
    type Change<'a> = Box<dyn Fn() + 'a>;
    let cases: [(&str, &str, Change); 5] = [
        (
            "small.txt",
            "was modified",
            Box::new(|| overwrite_keeping_mtime("small.txt", 0)),
        ),
        (
            "big.bin",
            "was modified",
            Box::new(|| overwrite_keeping_mtime("big.bin", 5 << 20)),
        ),
        ("grows.txt", "changed size", Box::new(grow)),
        ("small.txt", "was replaced", replace("small.txt", "dir")),
        (
            "small.txt",
            "was replaced or removed",
            replace("small.txt", "socket"),
        ),
    ];
    // Nothing held: every file is read again, and compared.
    for (rel, what, change) in cases {
        let (code, v) = pack_changed_between_passes(&ws, &out, "0", change);
        assert_eq!(code, 6, "{rel}: {v}");
        assert_eq!(v["kind"], "changed_while_packing", "{rel}: {v}");
        assert_eq!(v["path"], format!("workspace/{rel}"), "{v}");
        assert_eq!(
            v["message"],
            format!(
                "workspace/{rel}: {what} while it was being packed; pack again once the tree is quiet"
            ),
            "{v}"
        );
        assert!(!out.exists(), "{rel}: a refused pack left its output");
        let left = names_in(tmp.path(), |n| n.ends_with(".tmp"));
        assert!(left.is_empty(), "temporary files left: {left:?}");
        put_back(rel);
    }
    // Untouched between the passes, the same tree packs and verifies.
    let (code, v) = pack_changed_between_passes(&ws, &out, "0", || {});
    assert_eq!(code, 0, "{v}");
    run(["verify", out.to_str().unwrap()]).ok();

    // Small files held from the first pass are written as they were
    // hashed, whatever happens to them after; a file too large to hold is
    // still read again and compared.
    let before = fs::read(ws.join("small.txt")).unwrap();
    let grows_before = fs::read(ws.join("grows.txt")).unwrap();
    let (code, v) = pack_changed_between_passes(&ws, &out, "1KiB", || {
        overwrite_keeping_mtime("small.txt", 1);
        grow();
    });
    assert_eq!(code, 0, "{v}");
    run(["verify", out.to_str().unwrap()]).ok();
    let back = tmp.path().join("back");
    unpack(&out, &back, &[]);
    assert_eq!(fs::read(back.join("workspace/small.txt")).unwrap(), before);
    assert_ne!(fs::read(ws.join("small.txt")).unwrap(), before);
    assert_eq!(
        fs::read(back.join("workspace/grows.txt")).unwrap(),
        grows_before
    );
    let (code, v) = pack_changed_between_passes(&ws, &out, "1KiB", || {
        overwrite_keeping_mtime("big.bin", 1 << 20)
    });
    assert_eq!(
        (code, v["kind"].as_str()),
        (6, Some("changed_while_packing")),
        "{v}"
    );
    assert_eq!(v["path"], "workspace/big.bin", "{v}");
}

#[test]
fn pack_shows_progress_on_a_terminal_while_it_hashes() {
    // "long work shows progress on stderr when it is a terminal": the
    // first pass, which hashes every file before anything is written,
    // too, as a stage of its own. `script` runs pack on a pseudo-terminal and records what it
    // draws; pack waits at its barrier after that pass.
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    write(&ws, "data.bin", &vec![7u8; 3 << 20]);
    let out = tmp.path().join("p.packet");
    let bar = barrier_at(&tmp.path().join("barrier"), "hashed");
    let transcript = tmp.path().join("transcript");
    let cmd = format!(
        "{} pack --workspace {} -o {}",
        bin().display(),
        ws.display(),
        out.display()
    );
    let mut child = Command::new("script")
        .args(["-q", "-f", "-e", "-c", &cmd])
        .arg(&transcript)
        .env("SESSIONFS_TEST_BARRIER", &bar)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("script (util-linux) runs");
    wait_reached(&bar, "hashed");
    // The bar redraws every 200 ms.
    std::thread::sleep(std::time::Duration::from_millis(800));
    let drawn = String::from_utf8_lossy(&fs::read(&transcript).unwrap()).into_owned();
    fs::write(bar.join("hashed.go"), b"").unwrap();
    assert!(child.wait().unwrap().success());
    // The first pass has a bar of its own, with the content's size as
    // its total.
    assert!(
        drawn.contains("hashing") && drawn.contains("3.00 MiB/3.00 MiB"),
        "no bar for the hashing pass: {drawn:?}"
    );
    run(["verify", out.to_str().unwrap()]).ok();
}

#[test]
fn inspect_of_a_codex_packet_names_its_threads_and_flags_encrypted_ones() {
    // What an orchestrator needs to resume without mounting: each thread's
    // id, cwd, history mode (unknown ones as such), last update and size,
    // read from the manifest and the rollouts, which are verified as read.
    let tmp = tempfile::tempdir().unwrap();
    let (ws, h) = (tmp.path().join("ws"), tmp.path().join("h"));
    write(&ws, "a.txt", b"a\n");
    let meta = |id: &str, mode: &str| {
        format!(
            "{{\"timestamp\":\"t\",\"type\":\"session_meta\",\"payload\":{{\"id\":\"{id}\",\"cwd\":\"/session/workspace\",\"cli_version\":\"0.169.0\"{mode}}}}}\n"
        )
    };
    let plain = "00000000-0000-0000-0000-00000000000a";
    let secret = "00000000-0000-0000-0000-00000000000b";
    let future = "00000000-0000-0000-0000-00000000000c";
    let r1 = format!("sessions/2026/12/06/rollout-2026-12-06T08-00-00-{plain}.jsonl");
    let r2 = format!("sessions/2026/12/06/rollout-2026-12-06T09-00-00-{secret}.jsonl");
    let r3 = format!("archived_sessions/rollout-2026-12-05T09-00-00-{future}.jsonl");
    write(
        &h,
        &r1,
        meta(plain, ",\"history_mode\":\"paginated\"").as_bytes(),
    );
    let enc = meta(secret, "")
        + "{\"type\":\"response_item\",\"payload\":{\"type\":\"reasoning\",\"encrypted_content\":\"gAAAAB\"}}\n";
    write(&h, &r2, enc.as_bytes());
    write(
        &h,
        &r3,
        meta(future, ",\"history_mode\":\"chaptered\"").as_bytes(),
    );
    write(&h, "auth.json", b"{\"OPENAI_API_KEY\":\"sk-x\"}");
    let out = tmp.path().join("p.packet");
    let packed = pack(
        &ws,
        &out,
        &["--harness", h.to_str().unwrap(), "--harness-kind", "codex"],
    );
    assert_eq!(excluded_paths(&packed), ["harness/auth.json"]);
    let v = run(["inspect", out.to_str().unwrap()]).ok().clone();
    assert_eq!(v["schema"], "sessionfs.inspect-result/2");
    let threads = v["threads"].as_array().unwrap();
    let by_id = |id: &str| threads.iter().find(|t| t["id"] == id).unwrap().clone();
    assert_eq!(threads.len(), 3, "{v}");
    let t = by_id(plain);
    assert_eq!(t["rollout"], format!("harness/{r1}"));
    assert_eq!(t["cwd"], "/session/workspace");
    assert_eq!(t["history_mode"], "paginated");
    assert_eq!(t["history_mode_known"], true);
    assert_eq!(t["encrypted_content"], false);
    assert_eq!(t["archived"], false);
    assert_eq!(t["rollout_bytes"], fs::metadata(h.join(&r1)).unwrap().len());
    assert!(t["mtime_ns"].as_u64().unwrap() > 0);
    let t = by_id(secret);
    assert_eq!(t["encrypted_content"], true);
    assert!(t.get("history_mode").is_none(), "absent, not guessed: {t}");
    let t = by_id(future);
    assert_eq!(t["history_mode"], "chaptered");
    assert_eq!(t["history_mode_known"], false);
    assert_eq!(t["archived"], true);
    assert!(threads.iter().all(|t| t.get("problem").is_none()), "{v}");

    // A rollout whose bytes were changed is reported, not trusted.
    let mut bytes = fs::read(&out).unwrap();
    let at = bytes.windows(9).position(|w| w == b"chaptered").unwrap();
    bytes[at] = b'C';
    let bad = tmp.path().join("bad.packet");
    fs::write(&bad, &bytes).unwrap();
    let v = run(["inspect", bad.to_str().unwrap()]).ok().clone();
    let t = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["rollout"] == format!("harness/{r3}"))
        .unwrap()
        .clone();
    assert!(
        t["problem"].as_str().unwrap().contains("does not match"),
        "{t}"
    );
    assert!(t.get("history_mode").is_none(), "{t}");
    // Cut short: the manifest still names the threads.
    fs::write(&bad, &fs::read(&out).unwrap()[..2048]).unwrap();
    let v = run(["inspect", bad.to_str().unwrap()]).ok().clone();
    assert_eq!(v["length_matches"], false);
    assert_eq!(v["threads"].as_array().unwrap().len(), 3);
    assert!(
        v["threads"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("not read"),
        "{v}"
    );
    // Other harness kinds have no threads.
    let c = tmp.path().join("c.packet");
    let hs = h.to_str().unwrap();
    pack(&ws, &c, &["--harness", hs, "--harness-kind", "generic"]);
    assert!(
        run(["inspect", c.to_str().unwrap()])
            .ok()
            .get("threads")
            .is_none()
    );
}
