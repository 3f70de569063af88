//! Remote packets (`s3://`, `http://`) against a real S3 implementation
//! (moto's server) on 127.0.0.1, through a counting, fault-injecting proxy
//! of our own. See docs/remote.md.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::s3::{self, Fault, Proxy, gets, remote, setup};
use common::{Run, run, run_env};

/// The sample tree, packed.
fn sample_packet(tmp: &Path) -> PathBuf {
    let ws = tmp.join("ws");
    common::sample_tree(&ws);
    let p = tmp.join("s.packet");
    common::pack(&ws, &p, &[]);
    p
}

/// A packet whose manifest is larger than the first request brings
/// (256 KiB).
fn big_manifest_packet(tmp: &Path) -> PathBuf {
    let ws = tmp.join("big");
    for i in 0..1500 {
        common::write(
            &ws,
            &format!(
                "dir-with-a-long-name-{:03}/file-with-a-long-name-{i:05}.txt",
                i % 50
            ),
            b"x",
        );
    }
    let p = tmp.join("big.packet");
    common::pack(&ws, &p, &[]);
    p
}

/// The local run failed, and the remote one failed the same way.
#[track_caller]
fn refused_alike(local: &Run, remote: &Run, what: &str) {
    assert_ne!(local.code, 0, "{what}: {}", local.json);
    let (r, l) = ((remote.code, remote.kind()), (local.code, local.kind()));
    assert_eq!(r, l, "{what}: {} vs {}", remote.json, local.json);
}

/// The error's message contains `what`.
#[track_caller]
fn says(e: &serde_json::Value, what: &str) {
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(what), "{what} not in {msg}");
}

/// The result without its `packet` field, which names the location.
fn without_packet(v: &serde_json::Value) -> serde_json::Value {
    let mut v = v.clone();
    v.as_object_mut().unwrap().remove("packet");
    v
}

#[test]
fn remote_inspect_and_digest_equal_local_in_at_most_two_ranged_gets() {
    let (tmp, moto, b) = setup();
    let proxy = Proxy::start(moto.port);
    for (name, packet, want_gets) in [
        ("small", sample_packet(tmp.path()), 1),
        ("big", big_manifest_packet(tmp.path()), 2),
    ] {
        let bytes = std::fs::read(&packet).unwrap();
        let key = format!("dir/{name}.packet");
        moto.put(&b, &key, &bytes);
        let loc = format!("s3://{b}/{key}");
        for cmd in ["inspect", "digest"] {
            let local = run([cmd, packet.to_str().unwrap()]);
            proxy.clear();
            let r = remote(proxy.port, &[cmd, &loc], &[]);
            assert_eq!(r.ok()["packet"], loc.as_str());
            assert_eq!(
                without_packet(&r.json),
                without_packet(local.ok()),
                "{name} {cmd}"
            );
            let reqs = proxy.requests();
            assert_eq!(gets(&proxy), want_gets, "{name} {cmd}: {reqs:?}");
            assert!(
                reqs.iter()
                    .all(|r| r.starts_with("GET ") && !r.ends_with("range=-")),
                "{reqs:?}"
            );
        }
        if name == "big" {
            let m = run(["inspect", packet.to_str().unwrap()]).json["manifest_bytes"]
                .as_u64()
                .unwrap();
            assert!(
                m > 256 * 1024,
                "the manifest must not fit the first request: {m}"
            );
        }
    }
}

#[test]
fn remote_reads_retry_through_503s_resets_and_short_bodies() {
    let (tmp, moto, b) = setup();
    let packet = big_manifest_packet(tmp.path());
    moto.put(&b, "p", &std::fs::read(&packet).unwrap());
    let want = run(["digest", packet.to_str().unwrap()]).json["digest"].clone();
    let proxy = Proxy::start(moto.port);
    // Each of the two reads meets failures before it is served.
    proxy.inject([
        Fault::Status(503, "SlowDown"),
        Fault::Reset,
        Fault::Truncate(1000),
        Fault::Pass,
        Fault::Status(500, "InternalError"),
        Fault::Truncate(0),
    ]);
    let r = remote(proxy.port, &["digest", &format!("s3://{b}/p")], &[]);
    assert_eq!(r.ok()["digest"], want);
    assert_eq!(gets(&proxy), 7, "{:?}", proxy.requests());
}

/// Runs `args` against `port` with a time bound of `secs` seconds: it
/// must fail with `remote_unavailable` well within 5 s; the error.
#[track_caller]
fn gives_up_in_time(port: u16, args: &[&str], secs: &str) -> serde_json::Value {
    let began = Instant::now();
    let r = remote(port, args, &[("SESSIONFS_REMOTE_TIMEOUT", secs)]);
    let took = began.elapsed();
    let e = r.fails(9, "remote_unavailable").clone();
    assert!(took < Duration::from_secs(5), "{took:?}");
    e
}

#[test]
fn a_store_that_stays_down_fails_within_the_time_bound() {
    let (_tmp, moto, b) = setup();
    moto.put(&b, "p", b"whatever");
    let loc = format!("s3://{b}/p");
    let proxy = Proxy::start(moto.port);
    proxy.inject((0..100).map(|_| Fault::Status(503, "SlowDown")));
    let e = gives_up_in_time(proxy.port, &["inspect", &loc], "1.5");
    let msg = e["message"].as_str().unwrap();
    // The last failure is named: SlowDown, or on a loaded machine the
    // time bound running out during a request.
    assert!(
        msg.starts_with(&format!("{loc}: ")) && msg.contains("gave up after"),
        "{msg}"
    );
    assert!(msg.contains("SlowDown") || msg.contains("imeout"), "{msg}");
    assert!(gets(&proxy) >= 1, "{:?}", proxy.requests());
    // A server that does not answer at all: the same bound, not a hang.
    let proxy = Proxy::start(moto.port);
    proxy.inject([Fault::Delay(Duration::from_secs(30))]);
    says(
        &gives_up_in_time(proxy.port, &["digest", &loc], "1"),
        "imeout",
    );
}

/// Hostile or damaged packets are refused remotely with the same kind
/// and exit code as locally.
#[test]
fn hostile_packets_are_refused_remotely_as_locally() {
    let (tmp, moto, b) = setup();
    let good = std::fs::read(sample_packet(tmp.path())).unwrap();
    let mut bad_manifest = good.clone();
    bad_manifest[512 + 2] ^= 0x20;
    let mut huge_size = good.clone();
    huge_size[124..136].copy_from_slice(b"77777777777\0");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("garbage", vec![0x5a; 3000]),
        ("zeros", vec![0; 4096]),
        ("cut-in-manifest", good[..700].to_vec()),
        ("bad-manifest", bad_manifest),
        ("huge-size", huge_size),
    ];
    for (name, bytes) in cases {
        let local = tmp.path().join(name);
        std::fs::write(&local, &bytes).unwrap();
        moto.put(&b, name, &bytes);
        let loc = format!("s3://{b}/{name}");
        for cmd in ["inspect", "digest"] {
            let l = run([cmd, local.to_str().unwrap()]);
            let r = remote(moto.port, &[cmd, &loc], &[]);
            refused_alike(&l, &r, &format!("{name} {cmd}"));
        }
        // A mount refuses it before it makes its upper directory.
        let (mnt, up) = (tmp.path().join("mnt"), tmp.path().join("up"));
        std::fs::create_dir_all(&mnt).unwrap();
        let (m, u) = (mnt.to_str().unwrap(), up.to_str().unwrap());
        let l = run(["mount", local.to_str().unwrap(), m, "--upper", u]);
        let r = remote(moto.port, &["mount", &loc, m, "--upper", u], &[]);
        refused_alike(&l, &r, &format!("{name} mount"));
        assert!(!up.exists(), "{name}: the mount made its upper directory");
    }
}

#[test]
fn an_object_replaced_under_a_reader_is_noticed() {
    let (tmp, moto, b) = setup();
    let packet = std::fs::read(big_manifest_packet(tmp.path())).unwrap();
    moto.put(&b, "p", &packet);
    let proxy = Proxy::start(moto.port);
    let (bucket2, other) = (b.clone(), packet.clone());
    // Between the first request and the second, the key gets other bytes
    // (the same length: only the ETag can tell).
    proxy.inject([
        Fault::Pass,
        Fault::Before(Box::new(move || {
            let mut other = other;
            let last = other.len() - 1;
            other[last] = 1;
            s3::moto().put(&bucket2, "p", &other);
        })),
    ]);
    let r = remote(proxy.port, &["digest", &format!("s3://{b}/p")], &[]);
    let e = r.fails(9, "remote_changed");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("s3://{b}/p: ")),
        "{e}"
    );
    let reqs = proxy.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
}

#[test]
fn missing_credentials_bucket_and_key_are_clear_errors() {
    let (_tmp, moto, b) = setup();
    let r = remote(moto.port, &["inspect", &format!("s3://{b}/nothing")], &[]);
    let e = r.fails(9, "remote_not_found");
    says(e, "NoSuchKey");
    let r = remote(moto.port, &["digest", "s3://no-such-bucket-here/k"], &[]);
    let e = r.fails(9, "remote_not_found");
    says(e, "NoSuchBucket");
    // No credentials anywhere.
    let r = run_env(
        ["inspect", &format!("s3://{b}/k")],
        &[
            ("AWS_ACCESS_KEY_ID", ""),
            ("AWS_SECRET_ACCESS_KEY", ""),
            ("AWS_PROFILE", ""),
            ("AWS_CONFIG_FILE", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ],
    );
    let e = r.fails(9, "remote_config");
    says(e, "no credentials");
    // Refused credentials.
    let proxy = Proxy::start(moto.port);
    proxy.inject([Fault::Status(403, "SignatureDoesNotMatch")]);
    let r = remote(proxy.port, &["inspect", &format!("s3://{b}/k")], &[]);
    let e = r.fails(9, "remote_denied");
    says(e, "SignatureDoesNotMatch");
    // A malformed location is a usage error of its own kind.
    run(["inspect", "s3://bucket-only"]).fails(2, "invalid_location");
}

/// A presigned URL reads like the object it signs; its query (the
/// signature, the key id) is never shown, and a server that ignores
/// `Range` is refused rather than downloaded from.
#[test]
fn presigned_urls_read_like_s3_and_need_ranges() {
    let (tmp, moto, b) = setup();
    let packet = sample_packet(tmp.path());
    moto.put(&b, "k.packet", &std::fs::read(&packet).unwrap());
    let proxy = Proxy::start(moto.port);
    let url = s3::Moto::presigned_get(proxy.port, &b, "k.packet");
    let r = run(["digest", &url]);
    let local = run(["digest", packet.to_str().unwrap()]);
    assert_eq!(r.ok()["digest"], local.json["digest"]);
    let shown = r.json["packet"].as_str().unwrap();
    assert_eq!(
        shown,
        format!("http://127.0.0.1:{}/{b}/k.packet?…", proxy.port)
    );
    proxy.inject([Fault::IgnoreRange]);
    let r = run(["inspect", &url]);
    let e = r.fails(9, "remote_bad_response");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("Range") && !msg.contains(s3::KEY_ID), "{msg}");
}

/// Credentials appear nowhere: not in results, errors or debug logs.
#[test]
fn credentials_are_never_printed() {
    let (tmp, moto, b) = setup();
    moto.put(&b, "k", &std::fs::read(sample_packet(tmp.path())).unwrap());
    let proxy = Proxy::start(moto.port);
    proxy.inject([
        Fault::Status(503, "SlowDown"),
        Fault::Pass,
        Fault::Status(403, "AccessDenied"),
    ]);
    for args in [
        ["inspect", &format!("s3://{b}/k")],
        ["digest", &format!("s3://{b}/k")],
    ] {
        let r = remote(proxy.port, &args, &[("SESSIONFS_LOG", "trace")]);
        let all = format!("{}{}", r.json, r.stderr);
        for secret in [s3::SECRET, s3::TOKEN, s3::KEY_ID] {
            assert!(!all.contains(secret), "{secret} shown: {all}");
        }
        assert!(
            r.stderr.contains("ranged GET"),
            "the log is on: {}",
            r.stderr
        );
    }
}

/// `verify` and `unpack` read a remote packet's members by ranged GETs and
/// report exactly what they report for the same packet on disk; a packet
/// whose content was damaged is refused remotely as locally.
#[test]
fn remote_verify_and_unpack_equal_local() {
    let (tmp, moto, b) = setup();
    let packet = sample_packet(tmp.path());
    let bytes = std::fs::read(&packet).unwrap();
    moto.put(&b, "k", &bytes);
    let loc = format!("s3://{b}/k");
    let proxy = Proxy::start(moto.port);
    let strip = |v: &serde_json::Value| {
        let mut v = without_packet(v);
        let o = v.as_object_mut().unwrap();
        o.remove("seconds");
        o.remove("into");
        v
    };
    let local = run(["verify", packet.to_str().unwrap()]);
    // A fault on the way costs a retry, not the result.
    proxy.inject([Fault::Pass, Fault::Status(503, "SlowDown")]);
    let r = remote(proxy.port, &["verify", &loc], &[]);
    assert_eq!(r.ok()["packet"], loc.as_str());
    assert_eq!(strip(&r.json), strip(local.ok()));
    assert!(gets(&proxy) >= 3, "{:?}", proxy.requests());
    let (a, c) = (tmp.path().join("local"), tmp.path().join("remote"));
    let l = run([
        "unpack",
        packet.to_str().unwrap(),
        "--into",
        a.to_str().unwrap(),
    ]);
    let r = remote(
        proxy.port,
        &["unpack", &loc, "--into", c.to_str().unwrap()],
        &[],
    );
    assert_eq!(strip(&r.ok().clone()), strip(l.ok()));
    assert_eq!(common::snapshot(&a), common::snapshot(&c));
    // One byte of content changed: the same refusal, and nothing unpacked.
    let local_json = run(["inspect", packet.to_str().unwrap()]).json;
    let content_at =
        512 + (local_json["manifest_bytes"].as_u64().unwrap() as usize).div_ceil(512) * 512 + 512;
    let mut bad = bytes.clone();
    bad[content_at] ^= 1;
    let badp = tmp.path().join("bad.packet");
    std::fs::write(&badp, &bad).unwrap();
    moto.put(&b, "bad", &bad);
    for cmd in [vec!["verify"], vec!["unpack", "--into"]] {
        let mut largs: Vec<String> = vec![cmd[0].into(), badp.to_str().unwrap().into()];
        let mut rargs: Vec<String> = vec![cmd[0].into(), format!("s3://{b}/bad")];
        if cmd.len() > 1 {
            largs.extend([
                "--into".into(),
                tmp.path().join("bl").to_str().unwrap().into(),
            ]);
            rargs.extend([
                "--into".into(),
                tmp.path().join("br").to_str().unwrap().into(),
            ]);
        }
        let l = run(&largs);
        let r = remote(
            moto.port,
            &rargs.iter().map(String::as_str).collect::<Vec<_>>(),
            &[],
        );
        assert_eq!(l.code, 3, "{}", l.json);
        refused_alike(&l, &r, cmd[0]);
    }
    assert!(!tmp.path().join("br").exists());
}

/// With no keys, a web identity token is exchanged through STS
/// (`AssumeRoleWithWebIdentity`, moto's) for temporary credentials, and
/// the token is shown nowhere.
#[test]
fn web_identity_credentials_come_from_sts() {
    let (tmp, moto, b) = setup();
    moto.put(&b, "k", &std::fs::read(sample_packet(tmp.path())).unwrap());
    let token = tmp.path().join("token");
    std::fs::write(&token, "webid-token-MUST-NOT-LEAK\n").unwrap();
    let proxy = Proxy::start(moto.port);
    let with_token = |file: &str, log: &str| {
        let args = ["digest", &format!("s3://{b}/k")];
        let env = [
            ("AWS_ACCESS_KEY_ID", ""),
            ("AWS_SECRET_ACCESS_KEY", ""),
            ("AWS_SESSION_TOKEN", ""),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", file),
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/sessionfs"),
            ("SESSIONFS_LOG", log),
        ];
        remote(proxy.port, &args, &env)
    };
    let r = with_token(token.to_str().unwrap(), "trace");
    r.ok();
    assert!(
        r.stderr.contains("credentials=web identity"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("MUST-NOT-LEAK") && !r.json.to_string().contains("MUST-NOT-LEAK"));
    let reqs = proxy.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(
        reqs[0].starts_with("POST / ") && reqs[1].starts_with("GET "),
        "{reqs:?}"
    );
    // A token file that cannot be read is a configuration error naming it.
    let r = with_token("/nonexistent/token", "warn");
    says(r.fails(9, "remote_config"), "/nonexistent/token");
}

/// Against a server that checks SigV4 (s3s-fs, when installed): the
/// presigned requests, `If-Match` signed among their headers, are
/// accepted, and a wrong secret is refused as `remote_denied`.
#[test]
fn signatures_are_accepted_by_a_strict_server() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("bkt")).unwrap();
    let big = big_manifest_packet(tmp.path());
    std::fs::copy(&big, root.join("bkt/big.packet")).unwrap();
    let Some((port, _server)) = s3::s3s_fs(&root) else {
        return;
    };
    let loc = "s3://bkt/big.packet";
    let no_token = [("AWS_SESSION_TOKEN", "")];
    for cmd in ["digest", "verify"] {
        let local = run([cmd, big.to_str().unwrap()]);
        let r = remote(port, &[cmd, loc], &no_token);
        assert_eq!(r.ok()["digest"], local.ok()["digest"], "{cmd}");
    }
    let wrong = [
        ("AWS_SESSION_TOKEN", ""),
        ("AWS_SECRET_ACCESS_KEY", "wrong"),
    ];
    says(
        remote(port, &["digest", loc], &wrong).fails(9, "remote_denied"),
        "SignatureDoesNotMatch",
    );
}

/// A server that accepts connections and never answers.
fn silent_server() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming() {
            held.push(c);
        }
    });
    port
}

/// The environment of web identity credentials exchanged at STS `sts`
/// (a port), the token in `token`.
fn web_identity(token: &Path, sts: u16) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", String::new()),
        ("AWS_SECRET_ACCESS_KEY", String::new()),
        ("AWS_SESSION_TOKEN", String::new()),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            token.to_str().unwrap().into(),
        ),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/sessionfs".into(),
        ),
        ("AWS_ENDPOINT_URL_STS", format!("http://127.0.0.1:{sts}")),
        ("SESSIONFS_REMOTE_TIMEOUT", "3".into()),
    ]
}

/// Issue 32, finding 5: STS is bounded like every request. An STS
/// endpoint that accepts and never answers fails the command within the
/// time bound (it waited for good before); and a read answered
/// `400 ExpiredToken` whose renewal hangs fails within the read's bound.
#[test]
fn credential_exchanges_and_renewals_are_bounded() {
    let (tmp, moto, b) = setup();
    moto.put(&b, "k", &std::fs::read(sample_packet(tmp.path())).unwrap());
    let token = tmp.path().join("token");
    std::fs::write(&token, "webid-token\n").unwrap();
    let loc = format!("s3://{b}/k");
    let timed = |port: u16, env: &[(&'static str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let t0 = Instant::now();
        let r = remote(port, &["inspect", &loc], &env);
        (r, t0.elapsed())
    };
    let (r, took) = timed(moto.port, &web_identity(&token, silent_server()));
    says(r.fails(9, "remote_config"), "STS");
    assert!(took < Duration::from_secs(6), "{took:?}");
    // STS answers the first exchange, and never the renewal.
    let sts = Proxy::start(moto.port);
    sts.inject([Fault::Pass, Fault::Delay(Duration::from_secs(120))]);
    let s3 = Proxy::start(moto.port);
    s3.inject([Fault::Status(400, "ExpiredToken")]);
    let (r, took) = timed(s3.port, &web_identity(&token, sts.port));
    says(r.fails(9, "remote_config"), "no answer within");
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert_eq!(sts.requests().len(), 2, "{:?}", sts.requests());
}

/// Issue 32, finding 8 (its logs half): an endpoint's user information is
/// never printed, debug logs included.
#[test]
fn endpoint_user_information_is_never_logged() {
    let (tmp, moto, b) = setup();
    moto.put(&b, "k", &std::fs::read(sample_packet(tmp.path())).unwrap());
    let endpoint = format!("http://someone:pw-MUST-NOT-LEAK@127.0.0.1:{}", moto.port);
    let r = remote(
        moto.port,
        &["inspect", &format!("s3://{b}/k")],
        &[("AWS_ENDPOINT_URL", &endpoint), ("SESSIONFS_LOG", "trace")],
    );
    r.ok();
    assert!(r.stderr.contains("s3 configuration"), "{}", r.stderr);
    assert!(!r.stderr.contains("MUST-NOT-LEAK"), "{}", r.stderr);
    assert!(!r.json.to_string().contains("MUST-NOT-LEAK"));
    // Nor in an error about it.
    let r = remote(
        moto.port,
        &["inspect", &format!("s3://{b}/nothing-here")],
        &[("AWS_ENDPOINT_URL", &endpoint), ("SESSIONFS_LOG", "trace")],
    );
    r.fails(9, "remote_not_found");
    assert!(!r.stderr.contains("MUST-NOT-LEAK"), "{}", r.stderr);
}

/// The AWS-exact proxy's rules, one table: what AWS S3 refuses, it
/// refuses the same way; what AWS takes, it takes.
#[test]
fn the_aws_exact_proxy_refuses_what_aws_refuses() {
    use s3::{Req, UploadState, aws_refusal};
    let sha = s3::sha256_b64(b"body");
    let md5 = s3::md5_b64(b"body");
    let signed = "host;x-amz-checksum-sha256;x-amz-sdk-checksum-algorithm";
    let with_sha = UploadState {
        algorithm: Some("sha256".into()),
        parts: [(1, 5 << 20), (2, 5 << 20), (3, 10)].into(),
    };
    let small = UploadState {
        algorithm: Some("sha256".into()),
        parts: [(1, 5 << 20), (2, 100), (3, 10)].into(),
    };
    let plain = UploadState::default();
    let complete = |parts: &[(u32, bool)]| {
        let mut b = String::from("<CompleteMultipartUpload>");
        for (n, c) in parts {
            b.push_str("<Part>");
            if *c {
                b.push_str("<ChecksumSHA256>x</ChecksumSHA256>");
            }
            b.push_str(&format!(
                "<ETag>e</ETag><PartNumber>{n}</PartNumber></Part>"
            ));
        }
        b + "</CompleteMultipartUpload>"
    };
    let all = complete(&[(1, true), (2, true), (3, true)]);
    let one_missing = complete(&[(1, true), (2, false), (3, true)]);
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        &'a [u8],
        Option<&'a UploadState>,
        Option<u64>,
        Option<&'a str>,
    );
    let part_q = format!("partNumber=1&uploadId=u&X-Amz-SignedHeaders={signed}");
    let sent_part = || {
        vec![
            ("content-length", "4"),
            ("x-amz-checksum-sha256", sha.as_str()),
            ("x-amz-sdk-checksum-algorithm", "SHA256"),
        ]
    };
    let cases: Vec<Case> = vec![
        (
            "a part as sent",
            "PUT",
            &part_q,
            sent_part(),
            b"body",
            Some(&with_sha),
            None,
            None,
        ),
        (
            "a damaged part",
            "PUT",
            &part_q,
            sent_part(),
            b"bodz",
            Some(&with_sha),
            None,
            Some("BadDigest"),
        ),
        (
            "a part whose MD5 does not match",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host;content-md5",
            vec![("content-length", "4"), ("content-md5", &md5)],
            b"bodz",
            Some(&plain),
            None,
            Some("BadDigest"),
        ),
        (
            "a part whose MD5 matches",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host;content-md5",
            vec![("content-length", "4"), ("content-md5", &md5)],
            b"body",
            Some(&plain),
            None,
            None,
        ),
        (
            "a part without the upload's checksum",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "4")],
            b"body",
            Some(&with_sha),
            None,
            Some("InvalidRequest"),
        ),
        (
            "a checksum the upload did not ask for",
            "PUT",
            &part_q,
            sent_part(),
            b"body",
            Some(&plain),
            None,
            Some("InvalidRequest"),
        ),
        (
            "an unsigned x-amz header",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "4"), ("x-amz-checksum-sha256", &sha)],
            b"body",
            Some(&with_sha),
            None,
            Some("AccessDenied"),
        ),
        (
            "a chunked PUT",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host",
            vec![("transfer-encoding", "chunked")],
            b"",
            Some(&plain),
            None,
            Some("NotImplemented"),
        ),
        (
            "an aws-chunked PUT",
            "PUT",
            "X-Amz-SignedHeaders=host;content-encoding;x-amz-content-sha256",
            vec![
                ("transfer-encoding", "chunked"),
                ("content-encoding", "aws-chunked"),
                ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            ],
            b"",
            None,
            None,
            None,
        ),
        (
            "a PUT without a length",
            "PUT",
            "X-Amz-SignedHeaders=host",
            vec![],
            b"",
            None,
            None,
            Some("MissingContentLength"),
        ),
        (
            "a POST without a length",
            "POST",
            "uploads=&X-Amz-SignedHeaders=host",
            vec![],
            b"",
            None,
            None,
            Some("MissingContentLength"),
        ),
        (
            "a GET without a length",
            "GET",
            "X-Amz-SignedHeaders=host",
            vec![],
            b"",
            None,
            None,
            None,
        ),
        (
            "part 10,001",
            "PUT",
            "partNumber=10001&uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "0")],
            b"",
            Some(&plain),
            None,
            Some("InvalidArgument"),
        ),
        (
            "part 0",
            "PUT",
            "partNumber=0&uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "0")],
            b"",
            Some(&plain),
            None,
            Some("InvalidArgument"),
        ),
        (
            "a copy within the source",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host;x-amz-copy-source;x-amz-copy-source-range",
            vec![
                ("content-length", "0"),
                ("x-amz-copy-source", "/b/k"),
                ("x-amz-copy-source-range", "bytes=0-99"),
            ],
            b"",
            Some(&plain),
            Some(100),
            None,
        ),
        (
            "a copy beyond the source",
            "PUT",
            "partNumber=1&uploadId=u&X-Amz-SignedHeaders=host;x-amz-copy-source;x-amz-copy-source-range",
            vec![
                ("content-length", "0"),
                ("x-amz-copy-source", "/b/k"),
                ("x-amz-copy-source-range", "bytes=0-100"),
            ],
            b"",
            Some(&plain),
            Some(100),
            Some("InvalidArgument"),
        ),
        (
            "a complete with every checksum",
            "POST",
            "uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "1")],
            all.as_bytes(),
            Some(&with_sha),
            None,
            None,
        ),
        (
            "a complete missing a part's checksum",
            "POST",
            "uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "1")],
            one_missing.as_bytes(),
            Some(&with_sha),
            None,
            Some("InvalidRequest"),
        ),
        (
            "a complete with a small part inside",
            "POST",
            "uploadId=u&X-Amz-SignedHeaders=host",
            vec![("content-length", "1")],
            all.as_bytes(),
            Some(&small),
            None,
            Some("EntityTooSmall"),
        ),
        (
            "a header-signed request",
            "PUT",
            "",
            vec![
                ("content-length", "0"),
                (
                    "authorization",
                    "AWS4-HMAC-SHA256 Credential=a/b, SignedHeaders=host;x-amz-date, Signature=s",
                ),
                ("x-amz-date", "d"),
                ("x-amz-meta-x", "y"),
            ],
            b"",
            None,
            None,
            Some("AccessDenied"),
        ),
    ];
    for (what, method, query, headers, body, upload, source, want) in cases {
        let req = Req {
            method,
            path: "/b/k",
            query: url::form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body,
        };
        let got = aws_refusal(&req, upload, source);
        assert_eq!(got.as_ref().map(|r| r.1), want, "{what}: {got:?}");
    }
}

/// A server on 127.0.0.1 that answers every ranged GET of its one object
/// from `bytes_at` (the object `len` bytes long), one request per
/// connection; its port.
fn serve_object(len: u64, bytes_at: fn(u64, &mut [u8])) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut range = None;
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    let l = line.to_ascii_lowercase();
                    if let Some(r) = l.strip_prefix("range: bytes=") {
                        let (a, b) = r.trim().split_once('-').unwrap();
                        range = Some((a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()));
                    }
                    line.clear();
                }
                let Some((a, b)) = range else { return };
                let b = b.min(len - 1);
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len}\r\n\
                     Content-Length: {}\r\nETag: \"e\"\r\nConnection: close\r\n\r\n",
                    b + 1 - a
                );
                if conn.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut piece = vec![0u8; 1 << 20];
                let mut at = a;
                while at <= b {
                    let n = (b + 1 - at).min(piece.len() as u64) as usize;
                    bytes_at(at, &mut piece[..n]);
                    if conn.write_all(&piece[..n]).is_err() {
                        return;
                    }
                    at += n as u64;
                }
            });
        }
    });
    port
}

/// Runs `sessionfs ARGS` and returns its result and its peak RSS in KiB
/// (`wait4`'s `ru_maxrss` of that process alone).
// `wait4` reaps the child (std's `wait` cannot give its rusage).
#[allow(clippy::zombie_processes)]
fn run_measured(args: &[&str]) -> (serde_json::Value, u64) {
    let mut child = std::process::Command::new(common::bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid, and wait4 fills it for the
    // child this test spawned and has not waited for.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointers are to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid);
    (serde_json::from_str(&out).unwrap(), usage.ru_maxrss as u64)
}

/// Issue 32, finding 11: a server that claims an object of 210 MiB whose
/// manifest header claims 200 MiB (zeros, then not JSON). `inspect` holds
/// the manifest's bytes once, allocated as they arrive: the old reader
/// allocated the whole claimed length first and the client copied every
/// response body once more, so the same read took twice the manifest
/// (a 400 MB claim took `inspect` to 788 MB).
#[test]
fn a_claimed_manifest_is_held_once_and_as_it_arrives() {
    const CLAIMED: u64 = 200 << 20;
    fn bytes_at(at: u64, out: &mut [u8]) {
        out.fill(0);
        let header = sessionfs::api::manifest_header(CLAIMED);
        for (k, b) in out.iter_mut().enumerate() {
            match header.get((at as usize).wrapping_add(k)) {
                Some(h) if at < 512 => *b = *h,
                _ => break,
            }
        }
    }
    let port = serve_object(CLAIMED + (10 << 20), bytes_at);
    let url = format!("http://127.0.0.1:{port}/claims.packet");
    let (v, peak_kib) = run_measured(&["inspect", &url]);
    assert_eq!(v["schema"], "sessionfs.error/1", "{v}");
    assert!(v["kind"].as_str().unwrap().starts_with("manifest_"), "{v}");
    let peak = peak_kib << 10;
    assert!(
        peak < CLAIMED + (64 << 20),
        "inspect peaked at {} MiB for a manifest of {} MiB",
        peak >> 20,
        CLAIMED >> 20
    );
}
