//! Hostile locations, through the CLI against moto behind the fault
//! proxy: keys or URL paths with `.`, `..` or empty segments (finding 9
//! of issue 32). See docs/remote.md ("Locations").

mod common;

use common::s3::{self, Proxy, setup};
use common::write;

/// Finding 9 of issue 32: `.`, `..` and empty segments of a key or an URL
/// path are refused (`invalid_location`, exit 2) before any request, not
/// resolved into another bucket or object; a key of unusual characters is
/// written and read exactly as given.
#[test]
fn keys_and_url_paths_are_taken_literally() {
    let (tmp, moto, b) = setup();
    let t = tmp.path();
    let ws = t.join("ws");
    write(&ws, "a.txt", b"literal keys");
    let proxy = Proxy::start(moto.port);
    let run = |args: &[&str]| s3::remote(proxy.port, args, &[]);
    let ws_arg = ws.to_str().unwrap();
    let escape = format!("s3://other-{b}/x/../../{b}/dotdot.packet");
    for (args, says) in [
        (vec!["pack", "--workspace", ws_arg, "-o", &escape], "`..`"),
        (
            vec![
                "pack",
                "--workspace",
                ws_arg,
                "-o",
                &format!("s3://{b}//k.packet"),
            ],
            "empty segment",
        ),
        (vec!["inspect", &format!("s3://{b}/./k.packet")], "`.`"),
        (
            vec![
                "inspect",
                &format!("http://127.0.0.1:{}/{b}/x/../k.packet", proxy.port),
            ],
            "`..`",
        ),
        (
            vec![
                "digest",
                &format!("http://127.0.0.1:{}/{b}/x/%2e%2e/k.packet", proxy.port),
            ],
            "`%2e%2e`",
        ),
    ] {
        let r = run(&args);
        let e = r.fails(2, "invalid_location");
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(says) && msg.contains("literally"), "{msg}");
    }
    assert!(proxy.requests().is_empty(), "{:?}", proxy.requests());
    assert_eq!(moto.get(&b, "dotdot.packet"), None);
    // Unusual characters: stored at exactly that key, read back from it.
    let key = "dir/a%2Fb c+ü;=~.packet";
    let out = format!("s3://{b}/{key}");
    let r = run(&["pack", "--workspace", ws_arg, "-o", &out]);
    assert_eq!(r.ok()["output"], out.as_str());
    let listing = ureq::get(&format!("http://127.0.0.1:{}/{b}?list-type=2", moto.port))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let keys: Vec<&str> = listing
        .split("<Key>")
        .skip(1)
        .filter_map(|k| k.split_once("</Key>").map(|(k, _)| k))
        .collect();
    assert_eq!(keys, [key], "{listing}");
    let local = t.join("p.packet");
    common::pack(&ws, &local, &[]);
    assert_eq!(moto.get(&b, key).unwrap(), std::fs::read(&local).unwrap());
    let r = run(&["digest", &out]);
    assert_eq!(r.ok()["packet"], out.as_str());
}
