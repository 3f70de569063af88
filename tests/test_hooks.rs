//! The test barriers (src/barrier.rs): compiled into the binary under test
//! only (cargo feature `test-hooks`, which the tests enable), and strict
//! about the points they are given.

mod common;

use common::*;

#[test]
fn a_barrier_directory_naming_an_unknown_point_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let bar = tmp.path().join("bar");
    std::fs::create_dir(&bar).unwrap();
    // "colected": misspelt, it would never pause anything.
    std::fs::write(bar.join("colected.go"), b"").unwrap();
    let out = tmp.path().join("p.packet");
    let r = run_env(
        [
            "pack".as_ref(),
            "--workspace".as_ref(),
            ws.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
        &[("SESSIONFS_TEST_BARRIER", bar.to_str().unwrap())],
    );
    let e = r.fails(2, "usage");
    assert!(
        e["message"].as_str().unwrap().contains("colected.go"),
        "{e}"
    );
    assert!(!out.exists());
}

#[test]
fn a_barrier_directory_of_known_points_pauses_there() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    sample_tree(&ws);
    let bar = tmp.path().join("bar");
    std::fs::create_dir(&bar).unwrap();
    for p in [
        "walked-roots",
        "committed",
        "reported",
        "interrupt-deferred",
    ] {
        std::fs::write(bar.join(format!("{p}.go")), b"").unwrap();
    }
    let out = tmp.path().join("p.packet");
    let mut child = KillOnDrop(
        std::process::Command::new(bin())
            .arg("pack")
            .arg("--workspace")
            .arg(&ws)
            .arg("-o")
            .arg(&out)
            .env("SESSIONFS_TEST_BARRIER", &bar)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_reached(&bar, "hashed");
    assert!(!out.exists(), "pack went on past its barrier");
    std::fs::write(bar.join("hashed.go"), b"").unwrap();
    let (code, result) = child.finished();
    assert_eq!(code, Some(0), "{result}");
    assert!(out.exists());
}
