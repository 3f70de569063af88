//! Multipart uploads to an S3-compatible store: the requests that write a
//! packet, signed like the reads (every header signed) and retried by the
//! same loop ([`Client::retrying`]).
//!
//! An upload is made of parts: bytes sent (`UploadPart`), or a range of
//! another object of the same store copied by the server
//! (`UploadPartCopy`, `x-amz-copy-source-range`, pinned to that object's
//! ETag with `x-amz-copy-source-if-match`, so the bytes copied are those of
//! the object the caller read). The object appears only when the upload is
//! completed, and only where nothing is at the key (`If-None-Match: *`):
//! an existing object is never replaced. An upload that is not completed
//! is aborted ([`Upload::abort`]); one that cannot be (the process killed)
//! is removed by the bucket's lifecycle rule `AbortIncompleteMultipartUpload`
//! (docs/remote.md).
//!
//! Every byte sent is proven by the store: the upload is created with the
//! SHA-256 checksum algorithm (`x-amz-checksum-algorithm: SHA256`), every
//! part carries the SHA-256 of its body (`x-amz-checksum-sha256`, with
//! `x-amz-sdk-checksum-algorithm`) and its MD5 (`Content-MD5`, which every
//! S3 implementation checks), which the store checks before it keeps
//! the part (a part damaged on the way is refused, `400 BadDigest`, and
//! sent again), and the completion lists every part's checksum. The object
//! then has a composite checksum (the SHA-256 of the parts' SHA-256s,
//! `-N`), which [`composite`] computes from our side: equal checksums are
//! equal bytes, without reading them back.

use std::ops::Range;
use std::time::Duration;

use sha2::Digest as _;

use super::deadline::Deadline;
use super::error::{Error, Result};
use super::remote::{Client, Failure};
use super::transport::{Method, Response};
use super::xml::Doc;
use super::{Location, Settings};

/// At most this much of a response body is read (an upload's id, a copy's
/// ETag, an error): they are a few hundred bytes.
const RESPONSE_MAX: u64 = 64 * 1024;

/// An abort tries for at most this long: it runs when something else
/// failed, or on a signal, and must not hold the exit up for a whole time
/// bound.
const ABORT_WITHIN: Duration = Duration::from_secs(10);

/// The checksum algorithm of every upload, as S3 names it.
const ALGORITHM: &str = "SHA256";

/// An object of the same store to copy parts from, pinned to its ETag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopySource {
    /// Its bucket.
    pub bucket: String,
    /// Its key.
    pub key: String,
    /// Its ETag as the store gave it (quotes included).
    pub etag: String,
    /// Its length: every range copied lies within it.
    pub len: u64,
}

/// A part the store holds: what the completion lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartDone {
    /// Its ETag.
    pub etag: String,
    /// The SHA-256 of its bytes, base64 as S3 writes it: ours for a part
    /// sent (and checked by the store), the store's for a part copied
    /// (where it gives one; S3 does, some emulators do not).
    pub sha256: Option<String>,
}

/// How a completion ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The object is in place, made by this upload: its ETag and checksum
    /// as the store answered them.
    Created {
        /// The object's ETag.
        etag: Option<String>,
        /// Its composite SHA-256 checksum (`BASE64-N`), if given.
        sha256: Option<String>,
    },
    /// Something is already at the key (`If-None-Match: *` failed), or the
    /// completion was retried after an answer got lost: the upload did not
    /// replace anything. The caller finds out what is there.
    Exists,
}

/// What is at a key ([`Key::head`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Its length.
    pub len: u64,
    /// Its ETag.
    pub etag: Option<String>,
    /// Its SHA-256 checksum as the store keeps it: whole (`BASE64`) or
    /// composite (`BASE64-N`), if it keeps one.
    pub sha256: Option<String>,
}

/// A multipart upload in progress to one key.
#[derive(Clone)]
pub struct Upload {
    client: Client,
    id: String,
}

/// The MD5 of `bytes`, base64, as `Content-MD5` takes it.
pub fn md5_b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    use md5::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(bytes))
}

/// The SHA-256 of `bytes`, base64, as `x-amz-checksum-sha256` takes it.
pub fn sha256_b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes))
}

/// The composite checksum S3 gives an object uploaded in `parts`: the
/// SHA-256 of the parts' SHA-256s, base64, then `-` and the number of
/// parts. `None` if a part's checksum is unknown or malformed.
pub fn composite(parts: &[PartDone]) -> Option<String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut h = sha2::Sha256::new();
    for p in parts {
        let raw = b64.decode(p.sha256.as_deref()?).ok()?;
        if raw.len() != 32 {
            return None;
        }
        h.update(&raw);
    }
    Some(format!("{}-{}", b64.encode(h.finalize()), parts.len()))
}

/// An S3 key a packet is written to: what is there ([`Key::head`]), and
/// uploads to it ([`Key::upload`]); one configuration (and one web
/// identity exchange) for both.
#[derive(Clone)]
pub struct Key {
    client: Client,
}

impl Key {
    /// The key `location` (`s3://…`).
    pub fn new(location: &Location, settings: &Settings) -> Result<Key> {
        let client = Client::new(location, settings)?;
        s3_only(&client)?;
        Ok(Key { client })
    }

    /// The location, as shown.
    pub fn shown(&self) -> &str {
        &self.client.shown
    }

    /// What is at the key now: `HeadObject`, asking for the object's
    /// checksum (`x-amz-checksum-mode: ENABLED`); `None` where nothing is.
    pub fn head(&self) -> Result<Option<Head>> {
        let client = &self.client;
        client.retrying(
            Deadline::for_operation(&client.settings),
            || "look at what is at the key".into(),
            |timeout| {
                let mut resp = client.send(
                    Method::Head,
                    &[],
                    &[("x-amz-checksum-mode", "ENABLED")],
                    &[],
                    timeout,
                )?;
                match resp.status {
                    200 => {
                        let len = resp
                            .header("content-length")
                            .and_then(|l| l.trim().parse().ok())
                            .ok_or_else(|| client.bad("HEAD answered without a length".into()))?;
                        Ok(Some(Head {
                            len,
                            etag: resp.header("etag").map(str::to_owned),
                            sha256: resp.header("x-amz-checksum-sha256").map(str::to_owned),
                        }))
                    }
                    // A HEAD's answer has no body, so no code: 404 is "no
                    // such key".
                    404 => Ok(None),
                    status => Err(client.status_failure(status, &mut resp)),
                }
            },
        )
    }

    /// Starts an upload to the key: `CreateMultipartUpload`, with the
    /// SHA-256 checksum algorithm.
    pub fn upload(&self) -> Result<Upload> {
        let client = self.client.clone();
        let id = client.retrying(
            Deadline::for_operation(&client.settings),
            || "start the upload".into(),
            |timeout| {
                let mut resp = client.send(
                    Method::Post,
                    &[("uploads", "")],
                    &[("x-amz-checksum-algorithm", ALGORITHM)],
                    &[],
                    timeout,
                )?;
                if resp.status != 200 {
                    return Err(client.status_failure(resp.status, &mut resp));
                }
                let body = body_text(&client, &mut resp)?;
                let doc = ok_doc(&client, &body)?;
                doc.text(&["UploadId"])
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| client.bad("the answer holds no upload id".into()))
            },
        )?;
        tracing::debug!(location = %client.shown, "upload started");
        Ok(Upload { client, id })
    }
}

/// Whether a store's checksum of an object (`theirs`, from a HEAD or a
/// completion) is the composite `ours` ([`composite`]): the same, or the
/// same without the `-N` part count (moto 5.2 leaves it off).
pub fn same_checksum(theirs: &str, ours: &str) -> bool {
    let base = ours.rsplit_once('-').map_or(ours, |(b, _)| b);
    theirs == ours || theirs == base
}

impl Upload {
    /// The location, as shown.
    pub fn shown(&self) -> &str {
        &self.client.shown
    }

    /// Sends part `number` (1-based): `UploadPart`, with the SHA-256 and
    /// the MD5 of `bytes`, which the store checks (a part damaged on the
    /// way is refused and sent again). Both: S3 checks either, and stores
    /// that predate the SHA-256 checksums (Ceph's radosgw 16) check only
    /// `Content-MD5`.
    pub fn part(&self, number: u16, bytes: &[u8]) -> Result<PartDone> {
        let sha256 = sha256_b64(bytes);
        let md5 = md5_b64(bytes);
        let n = number.to_string();
        let query = [("partNumber", n.as_str()), ("uploadId", self.id.as_str())];
        let headers = [
            ("content-md5", md5.as_str()),
            ("x-amz-checksum-sha256", sha256.as_str()),
            ("x-amz-sdk-checksum-algorithm", ALGORITHM),
        ];
        self.client.retrying(
            Deadline::for_operation(&self.client.settings),
            || format!("upload part {number} ({} bytes)", bytes.len()),
            |timeout| {
                let mut resp = self
                    .client
                    .send(Method::Put, &query, &headers, bytes, timeout)?;
                if resp.status != 200 {
                    return Err(self.part_failure(resp.status, &mut resp));
                }
                // A store that answers with a checksum must answer ours.
                if let Some(theirs) = resp.header("x-amz-checksum-sha256")
                    && theirs != sha256
                {
                    return Err(Failure::Retry(format!(
                        "the store kept part {number} with the SHA-256 {theirs}, not {sha256}"
                    )));
                }
                let etag = resp.header("etag").map(str::to_owned).ok_or_else(|| {
                    self.client
                        .bad(format!("part {number} came back without an ETag"))
                })?;
                Ok(PartDone {
                    etag,
                    sha256: Some(sha256.clone()),
                })
            },
        )
    }

    /// Makes part `number` of bytes `range` of `from`, copied by the
    /// server: `UploadPartCopy`, pinned to `from`'s ETag. Returns the
    /// part's ETag and the store's checksum of it. A source that changed
    /// fails with [`Error::Changed`].
    pub fn copy_part(&self, number: u16, from: &CopySource, range: Range<u64>) -> Result<PartDone> {
        let source = format!("/{}/{}", from.bucket, encode_key(&from.key));
        let span = format!("bytes={}-{}", range.start, range.end.saturating_sub(1));
        let headers = [
            ("x-amz-copy-source", source.as_str()),
            ("x-amz-copy-source-if-match", from.etag.as_str()),
            ("x-amz-copy-source-range", span.as_str()),
        ];
        let n = number.to_string();
        let query = [("partNumber", n.as_str()), ("uploadId", self.id.as_str())];
        self.client.retrying(
            Deadline::for_operation(&self.client.settings),
            || {
                format!(
                    "copy part {number} from bytes {}..{} of s3://{}/{}",
                    range.start, range.end, from.bucket, from.key
                )
            },
            |timeout| {
                let mut resp = self
                    .client
                    .send(Method::Put, &query, &headers, &[], timeout)?;
                if resp.status == 412 {
                    return Err(Failure::Fatal(Error::Changed {
                        location: format!("s3://{}/{}", from.bucket, from.key),
                        what: format!(
                            "it no longer has the ETag {} the seal copies from",
                            from.etag
                        ),
                    }));
                }
                if resp.status != 200 {
                    return Err(self.part_failure(resp.status, &mut resp));
                }
                let body = body_text(&self.client, &mut resp)?;
                let doc = ok_doc(&self.client, &body)?;
                let etag = doc
                    .text(&["ETag"])
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        self.client
                            .bad(format!("copied part {number} came back without an ETag"))
                    })?;
                Ok(PartDone {
                    etag: etag.to_owned(),
                    sha256: doc
                        .text(&["ChecksumSHA256"])
                        .filter(|c| !c.is_empty())
                        .map(str::to_owned),
                })
            },
        )
    }

    /// Completes the upload with its parts in order, where nothing is at
    /// the key yet (`If-None-Match: *`).
    pub fn complete(&self, parts: &[PartDone]) -> Result<Completion> {
        let body = complete_body(parts);
        let query = [("uploadId", self.id.as_str())];
        let headers = [("if-none-match", "*")];
        let mut tried = false;
        self.client.retrying(
            Deadline::for_operation(&self.client.settings),
            || format!("complete the upload of {} parts", parts.len()),
            |timeout| {
                let retried = std::mem::replace(&mut tried, true);
                let mut resp =
                    self.client
                        .send(Method::Post, &query, &headers, body.as_bytes(), timeout)?;
                match resp.status {
                    200 => {
                        let header_sha = resp.header("x-amz-checksum-sha256").map(str::to_owned);
                        let text = body_text(&self.client, &mut resp)?;
                        let doc = ok_doc(&self.client, &text)?;
                        Ok(Completion::Created {
                            etag: doc.text(&["ETag"]).map(str::to_owned),
                            sha256: doc
                                .text(&["ChecksumSHA256"])
                                .map(str::to_owned)
                                .or(header_sha),
                        })
                    }
                    412 => Ok(Completion::Exists),
                    // Another write to the key in progress: S3 asks to retry.
                    409 => Err(Failure::Retry("HTTP 409 ConditionalRequestConflict".into())),
                    // The upload is gone after an earlier attempt whose
                    // answer was lost: that attempt completed it, or
                    // something else is there; the caller looks.
                    404 if retried => Ok(Completion::Exists),
                    status => Err(self.part_failure(status, &mut resp)),
                }
            },
        )
    }

    /// Aborts the upload, removing the parts sent so far: at most
    /// [`ABORT_WITHIN`], an upload already gone counting as aborted.
    pub fn abort(&self) -> Result<()> {
        let client = &self.client;
        let query = [("uploadId", self.id.as_str())];
        client.retrying(
            Deadline::for_operation(&client.settings).within(ABORT_WITHIN),
            || "abort the upload".into(),
            |timeout| {
                let mut resp = client.send(Method::Delete, &query, &[], &[], timeout)?;
                match resp.status {
                    200 | 204 | 404 => Ok(()),
                    status => Err(client.status_failure(status, &mut resp)),
                }
            },
        )?;
        tracing::debug!(location = %self.client.shown, "upload aborted");
        Ok(())
    }

    /// A part or completion refused: as any request, except that a 404
    /// means the upload is gone (aborted meanwhile, or expired).
    fn part_failure(&self, status: u16, resp: &mut Response) -> Failure {
        match self.client.status_failure(status, resp) {
            Failure::Fatal(Error::NotFound { code, .. }) if code == "NoSuchUpload" => {
                self.client.bad(
                    "the upload is gone (NoSuchUpload): it was aborted meanwhile, or expired"
                        .into(),
                )
            }
            f => f,
        }
    }
}

/// Writes `bytes` (a small object: a trace sidecar) to `location` where
/// nothing is yet, as an upload of one part; aborted unless it completes.
pub fn put_new(location: &Location, settings: &Settings, bytes: &[u8]) -> Result<Completion> {
    let upload = Key::new(location, settings)?.upload()?;
    let done = upload
        .part(1, bytes)
        .and_then(|part| upload.complete(&[part]));
    if !matches!(done, Ok(Completion::Created { .. })) {
        let _ = upload.abort();
    }
    done
}

/// Uploads are written to `s3://` locations only.
fn s3_only(client: &Client) -> Result<()> {
    match &client.target {
        super::remote::Target::S3 { .. } => Ok(()),
        super::remote::Target::Http(_) => Err(Error::Config {
            location: client.shown.clone(),
            reason: "packets are written to s3://BUCKET/KEY locations, not to URLs".into(),
        }),
    }
}

/// The body of a `CompleteMultipartUpload`: every part's number, ETag
/// and checksum.
fn complete_body(parts: &[PartDone]) -> String {
    use instant_xml::ToXml;

    #[derive(ToXml)]
    #[xml(rename = "CompleteMultipartUpload")]
    struct Body<'a> {
        parts: Vec<Part<'a>>,
    }

    #[derive(ToXml)]
    #[xml(rename = "Part")]
    struct Part<'a> {
        #[xml(rename = "ChecksumSHA256")]
        sha256: Option<&'a str>,
        #[xml(rename = "ETag")]
        etag: &'a str,
        #[xml(rename = "PartNumber")]
        number: usize,
    }

    let body = Body {
        parts: parts
            .iter()
            .enumerate()
            .map(|(i, p)| Part {
                sha256: p.sha256.as_deref(),
                etag: &p.etag,
                number: i + 1,
            })
            .collect(),
    };
    // Strings and numbers always serialize.
    instant_xml::to_string(&body).unwrap_or_default()
}

/// The body of a successful response, as text; one cut short is worth
/// another attempt, one too long is a bad response.
fn body_text(client: &Client, resp: &mut Response) -> std::result::Result<String, Failure> {
    let body = resp.read_limited(RESPONSE_MAX).map_err(|e| match e {
        super::transport::BodyError::TooLong(_) => client.bad(format!("an answer of which {e}")),
        super::transport::BodyError::Io(_) => Failure::Retry(format!("the answer's {e}")),
    })?;
    String::from_utf8(body).map_err(|_| client.bad("an answer that is not UTF-8".into()))
}

/// The document of a `200 OK` answer (whatever its root is named:
/// moto 5.2 answers a completion with a `CompleteMultipartUploadResponse`
/// where S3 documents `CompleteMultipartUploadResult`). S3 may answer a copy or a
/// completion `200 OK` and still fail, with an error document in the
/// body: retried when the error is transient.
fn ok_doc<'a>(client: &Client, body: &'a str) -> std::result::Result<Doc<'a>, Failure> {
    let doc = Doc::parse(body).map_err(|e| client.bad(format!("an answer that is {e}")))?;
    if doc.root() != "Error" {
        return Ok(doc);
    }
    let code = doc.text(&["Code"]).unwrap_or("unknown");
    match code {
        "InternalError" | "SlowDown" | "ServiceUnavailable" | "RequestTimeout" => {
            Err(Failure::Retry(format!("HTTP 200 with error {code}")))
        }
        _ => Err(client.bad(format!("the store answered with error {code}"))),
    }
}

/// A key as `x-amz-copy-source` takes it: URL-encoded, `/` kept.
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::transport::mock::{Answer, Scripted, Sent};
    use std::sync::Arc;

    fn key(answers: Vec<Answer>) -> (Key, Arc<Scripted>) {
        let t = Arc::new(Scripted::new(answers));
        let settings = Settings {
            read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            max_attempts: 4,
            backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        };
        let client = Client::for_tests(t.clone(), settings);
        (Key { client }, t)
    }

    fn ok(body: &str) -> Answer {
        Answer::Reply(200, vec![], body.as_bytes().to_vec())
    }

    const CREATED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>bkt</Bucket><Key>dir/k.packet</Key><UploadId>up-1</UploadId></InitiateMultipartUploadResult>";

    /// The names `X-Amz-SignedHeaders` lists in a request's URL.
    fn signed(s: &Sent) -> Vec<String> {
        s.url
            .query_pairs()
            .find(|(k, _)| k == "X-Amz-SignedHeaders")
            .map(|(_, v)| v.split(';').map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// A whole upload as the store sees it: `?uploads` bare, the checksum
    /// algorithm asked for, every part with its SHA-256, a copy with an
    /// empty body, every `x-amz-*` header signed, the completion listing
    /// every part's checksum, conditional.
    #[test]
    fn uploads_are_sent_as_aws_takes_them() {
        let part = vec![7u8; 1000];
        let copy = "<CopyPartResult><ETag>&quot;c2&quot;</ETag><ChecksumSHA256>Y2hlY2tzdW0tb2YtdGhlLWNvcGllZC1yYW5nZS0zMiE=</ChecksumSHA256></CopyPartResult>";
        let done = "<CompleteMultipartUploadResult><ETag>&quot;all-2&quot;</ETag><ChecksumSHA256>abc-2</ChecksumSHA256></CompleteMultipartUploadResult>";
        let (k, t) = key(vec![
            ok(CREATED),
            Answer::Reply(200, vec![("etag", "\"p1\"".into())], vec![]),
            ok(copy),
            ok(done),
        ]);
        let up = k.upload().unwrap();
        let p1 = up.part(1, &part).unwrap();
        assert_eq!(p1.sha256.as_deref(), Some(sha256_b64(&part).as_str()));
        let src = CopySource {
            bucket: "bkt".into(),
            key: "parent.packet".into(),
            etag: "\"pe\"".into(),
            len: 100 << 20,
        };
        let p2 = up.copy_part(2, &src, 0..(5 << 20)).unwrap();
        assert_eq!(p2.etag, "\"c2\"");
        let c = up.complete(&[p1, p2]).unwrap();
        assert_eq!(
            c,
            Completion::Created {
                etag: Some("\"all-2\"".into()),
                sha256: Some("abc-2".into())
            }
        );
        let sent = t.sent();
        let q = |i: usize| sent[i].url.query().unwrap_or("").to_owned();
        assert_eq!(sent[0].method, Method::Post);
        assert!(q(0).split('&').any(|p| p == "uploads"), "{}", q(0));
        assert_eq!(sent[0].header("x-amz-checksum-algorithm"), Some("SHA256"));
        assert_eq!(sent[1].method, Method::Put);
        assert_eq!(sent[1].body, part);
        assert_eq!(
            sent[1].header("x-amz-checksum-sha256"),
            Some(sha256_b64(&part).as_str())
        );
        assert_eq!(
            sent[1].header("x-amz-sdk-checksum-algorithm"),
            Some("SHA256")
        );
        assert!(q(1).contains("partNumber=1") && q(1).contains("uploadId=up-1"));
        assert_eq!(sent[2].method, Method::Put);
        assert!(
            sent[2].body.is_empty(),
            "a copy has no body: Content-Length: 0"
        );
        assert_eq!(
            sent[2].header("x-amz-copy-source"),
            Some("/bkt/parent.packet")
        );
        assert_eq!(
            sent[2].header("x-amz-copy-source-range"),
            Some("bytes=0-5242879")
        );
        assert_eq!(sent[2].header("x-amz-copy-source-if-match"), Some("\"pe\""));
        assert_eq!(sent[3].header("if-none-match"), Some("*"));
        let body = String::from_utf8(sent[3].body.clone()).unwrap();
        assert!(
            body.contains(&format!(
                "<ChecksumSHA256>{}</ChecksumSHA256>",
                sha256_b64(&part)
            )),
            "{body}"
        );
        assert!(
            body.contains(
                "<ChecksumSHA256>Y2hlY2tzdW0tb2YtdGhlLWNvcGllZC1yYW5nZS0zMiE=</ChecksumSHA256>"
            ),
            "{body}"
        );
        for s in &sent {
            let names = signed(s);
            for (h, _) in &s.headers {
                assert!(
                    !h.starts_with("x-amz-") && h != "if-none-match" || names.contains(h),
                    "{:?} {h} is sent unsigned ({names:?})",
                    s.method
                );
            }
        }
    }

    /// A part the store refuses as damaged (`BadDigest`), or keeps with
    /// another checksum, is sent again; one that fails for good fails.
    #[test]
    fn damaged_parts_are_sent_again() {
        let part = b"hello".to_vec();
        let (k, t) = key(vec![
            ok(CREATED),
            Answer::Error(400, "BadDigest"),
            Answer::Reply(
                200,
                vec![
                    ("etag", "\"p\"".into()),
                    ("x-amz-checksum-sha256", sha256_b64(b"hellp")),
                ],
                vec![],
            ),
            Answer::Reply(
                200,
                vec![
                    ("etag", "\"p\"".into()),
                    ("x-amz-checksum-sha256", sha256_b64(b"hello")),
                ],
                vec![],
            ),
        ]);
        let up = k.upload().unwrap();
        assert_eq!(up.part(1, &part).unwrap().etag, "\"p\"");
        assert_eq!(t.sent().len(), 4);
        let (k, _) = key(vec![ok(CREATED), Answer::Error(400, "InvalidDigest")]);
        let e = k.upload().unwrap().part(1, &part).unwrap_err();
        assert_eq!(e.kind(), crate::kind::ErrorKind::RemoteBadResponse, "{e}");
    }

    /// How completions end, answer by answer.
    #[test]
    fn completions_end_as_the_store_answers() {
        let done = "<CompleteMultipartUploadResult><ETag>&quot;x&quot;</ETag></CompleteMultipartUploadResult>";
        let part = PartDone {
            etag: "\"p\"".into(),
            sha256: None,
        };
        let cases: Vec<(
            &str,
            Vec<Answer>,
            Result<Completion, crate::kind::ErrorKind>,
        )> = vec![
            (
                "created",
                vec![ok(done)],
                Ok(Completion::Created {
                    etag: Some("\"x\"".into()),
                    sha256: None,
                }),
            ),
            (
                "something there",
                vec![Answer::Error(412, "PreconditionFailed")],
                Ok(Completion::Exists),
            ),
            (
                "a 200 with a transient error, then done",
                vec![ok("<Error><Code>InternalError</Code></Error>"), ok(done)],
                Ok(Completion::Created {
                    etag: Some("\"x\"".into()),
                    sha256: None,
                }),
            ),
            (
                "an answer lost, then the upload gone",
                vec![Answer::Reset, Answer::Error(404, "NoSuchUpload")],
                Ok(Completion::Exists),
            ),
            (
                "the upload gone at once",
                vec![Answer::Error(404, "NoSuchUpload")],
                Err(crate::kind::ErrorKind::RemoteBadResponse),
            ),
            (
                "a part too small",
                vec![Answer::Error(400, "EntityTooSmall")],
                Err(crate::kind::ErrorKind::RemoteBadResponse),
            ),
            (
                "an answer far too long",
                vec![ok(&format!(
                    "<CompleteMultipartUploadResult>{}</CompleteMultipartUploadResult>",
                    "x".repeat(1 << 20)
                ))],
                Err(crate::kind::ErrorKind::RemoteBadResponse),
            ),
            (
                "a 200 with a final error",
                vec![ok("<Error><Code>InvalidPart</Code></Error>")],
                Err(crate::kind::ErrorKind::RemoteBadResponse),
            ),
        ];
        for (what, answers, want) in cases {
            let mut all = vec![ok(CREATED)];
            all.extend(answers);
            let (k, _) = key(all);
            let got = k
                .upload()
                .unwrap()
                .complete(std::slice::from_ref(&part))
                .map_err(|e| e.kind());
            assert_eq!(got, want, "{what}");
        }
    }

    /// What a HEAD of the key finds.
    #[test]
    fn heads_find_the_length_etag_and_checksum() {
        let (k, t) = key(vec![
            Answer::Reply(
                200,
                vec![
                    ("content-length", "42".into()),
                    ("etag", "\"e\"".into()),
                    ("x-amz-checksum-sha256", "abc-3".into()),
                ],
                vec![],
            ),
            Answer::Reply(404, vec![], vec![]),
            Answer::Reply(403, vec![], vec![]),
        ]);
        assert_eq!(
            k.head().unwrap(),
            Some(Head {
                len: 42,
                etag: Some("\"e\"".into()),
                sha256: Some("abc-3".into())
            })
        );
        assert_eq!(t.sent()[0].header("x-amz-checksum-mode"), Some("ENABLED"));
        assert_eq!(k.head().unwrap(), None);
        assert_eq!(
            k.head().unwrap_err().kind(),
            crate::kind::ErrorKind::RemoteDenied
        );
    }

    #[test]
    fn copy_source_keys_are_encoded_with_slashes_kept() {
        let cases = [
            ("a/b.packet", "a/b.packet"),
            ("sha256-0f.packet", "sha256-0f.packet"),
            ("with space/ü+x", "with%20space/%C3%BC%2Bx"),
        ];
        for (key, want) in cases {
            assert_eq!(encode_key(key), want, "{key}");
        }
    }

    #[test]
    fn completions_list_every_part_with_its_checksum() {
        let parts = [
            PartDone {
                etag: "\"a\"".into(),
                sha256: Some("x+/=".into()),
            },
            PartDone {
                etag: "\"b\"".into(),
                sha256: None,
            },
        ];
        assert_eq!(
            complete_body(&parts),
            "<CompleteMultipartUpload><Part><ChecksumSHA256>x+/=</ChecksumSHA256><ETag>&quot;a&quot;</ETag><PartNumber>1</PartNumber></Part><Part><ETag>&quot;b&quot;</ETag><PartNumber>2</PartNumber></Part></CompleteMultipartUpload>"
        );
    }

    /// The composite checksum as S3 documents it (the value computed
    /// independently with Python's hashlib, and the one moto 5.2.1 gives
    /// such an object, without its `-2`).
    #[test]
    fn composite_checksums_are_the_hash_of_the_parts_hashes() {
        let a = vec![b'a'; 5 << 20];
        let parts = [
            PartDone {
                etag: "\"1\"".into(),
                sha256: Some(sha256_b64(&a)),
            },
            PartDone {
                etag: "\"2\"".into(),
                sha256: Some(sha256_b64(b"b")),
            },
        ];
        assert_eq!(
            composite(&parts).unwrap(),
            "tfmzeY9XeH2OXmxrtS4iDWlNIKUTAFv0/csHs2lsoD8=-2"
        );
        assert_eq!(
            sha256_b64(b""),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
        let c = composite(&parts).unwrap();
        assert!(same_checksum(&c, &c));
        assert!(same_checksum(
            "tfmzeY9XeH2OXmxrtS4iDWlNIKUTAFv0/csHs2lsoD8=",
            &c
        ));
        assert!(!same_checksum(
            "tfmzeY9XeH2OXmxrtS4iDWlNIKUTAFv0/csHs2lsoD8=-3",
            &c
        ));
        assert!(!same_checksum(&sha256_b64(b"a"), &c));
        let mut missing = parts.clone();
        missing[1].sha256 = None;
        assert_eq!(composite(&missing), None);
        missing[1].sha256 = Some("not base64!".into());
        assert_eq!(composite(&missing), None);
    }
}
