//! Multipart uploads to an S3-compatible store: the requests that write a
//! packet, signed like the reads (presigned by rusty-s3, every extra header
//! signed) and retried by the same loop ([`Client::retrying`]).
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
//! No per-part checksum is sent: `Content-MD5` needs an MD5 the tree does
//! not have, and `x-amz-checksum-*` on parts needs the checksums repeated
//! in the completion's body, which rusty-s3 0.10 does not write. The bytes
//! are protected in transit by TCP (and TLS), and every reader checks the
//! packet against its digest.

use std::io::Read;
use std::ops::Range;
use std::time::Duration;

use super::deadline::Deadline;
use super::error::{Error, Result};
use super::remote::{Client, Creds, Failure, PRESIGN_FOR, Target};
use super::{Location, Settings};

/// At most this much of a response body is read (an upload's id, a copy's
/// ETag, an error): they are a few hundred bytes.
const RESPONSE_MAX: u64 = 64 * 1024;

/// An abort tries for at most this long: it runs when something else
/// failed, or on a signal, and must not hold the exit up for a whole time
/// bound.
const ABORT_WITHIN: Duration = Duration::from_secs(10);

/// An object of the same store to copy parts from, pinned to its ETag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopySource {
    /// Its bucket.
    pub bucket: String,
    /// Its key.
    pub key: String,
    /// Its ETag as the store gave it (quotes included).
    pub etag: String,
}

/// How a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The object is in place, made by this upload.
    Created,
    /// Something is already at the key (`If-None-Match: *` failed), or the
    /// completion was retried after an answer got lost: the upload did not
    /// replace anything. The caller finds out what is there.
    Exists,
}

/// A multipart upload in progress to one key.
#[derive(Clone)]
pub struct Upload {
    client: Client,
    id: String,
}

/// The bucket, key and credentials of an S3 client.
fn s3_target(client: &Client) -> Result<(&rusty_s3::Bucket, &str, &Creds)> {
    match &client.target {
        Target::S3 {
            bucket,
            key,
            credentials,
        } => Ok((bucket, key, credentials)),
        Target::Http(_) => Err(Error::Config {
            location: client.shown.clone(),
            reason: "packets are written to s3://BUCKET/KEY locations, not to URLs".into(),
        }),
    }
}

impl Upload {
    /// Starts an upload to `location` (`s3://…`): `CreateMultipartUpload`.
    pub fn create(location: &Location, settings: &Settings) -> Result<Upload> {
        let client = Client::new(location, settings)?;
        let (bucket, key, creds) = s3_target(&client)?;
        use rusty_s3::S3Action;
        let id = client.retrying(
            Deadline::for_operation(settings),
            || "start the upload".into(),
            |timeout| {
                let url = bucket
                    .create_multipart_upload(Some(&creds.get()), key)
                    .sign(PRESIGN_FOR);
                let mut resp = client.send("POST", &url, &[], Some(&[]), timeout)?;
                let status = resp.status().as_u16();
                if status != 200 {
                    return Err(client.status_failure(status, &mut resp));
                }
                let body = body_text(&client, &mut resp)?;
                ok_body(&client, &body)?;
                rusty_s3::actions::CreateMultipartUpload::parse_response(&body)
                    .map(|r| r.upload_id().to_owned())
                    .map_err(|e| bad(&client, format!("an upload id that does not parse: {e}")))
            },
        )?;
        tracing::debug!(location = %client.shown, "upload started");
        Ok(Upload { client, id })
    }

    /// The location, as shown.
    pub fn shown(&self) -> &str {
        &self.client.shown
    }

    /// Sends part `number` (1-based): `UploadPart`. Returns its ETag.
    pub fn part(&self, number: u16, bytes: &[u8]) -> Result<String> {
        let (bucket, key, creds) = s3_target(&self.client)?;
        use rusty_s3::S3Action;
        self.client.retrying(
            Deadline::for_operation(&self.client.settings),
            || format!("upload part {number} ({} bytes)", bytes.len()),
            |timeout| {
                let url = bucket
                    .upload_part(Some(&creds.get()), key, number, &self.id)
                    .sign(PRESIGN_FOR);
                let mut resp = self.client.send("PUT", &url, &[], Some(bytes), timeout)?;
                let status = resp.status().as_u16();
                if status != 200 {
                    return Err(self.part_failure(status, &mut resp));
                }
                resp.headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        bad(
                            &self.client,
                            format!("part {number} came back without an ETag"),
                        )
                    })
            },
        )
    }

    /// Makes part `number` of bytes `range` of `from`, copied by the
    /// server: `UploadPartCopy`, pinned to `from`'s ETag. Returns the
    /// part's ETag. A source that changed fails with [`Error::Changed`].
    pub fn copy_part(&self, number: u16, from: &CopySource, range: Range<u64>) -> Result<String> {
        let (bucket, key, creds) = s3_target(&self.client)?;
        let source = format!("/{}/{}", from.bucket, encode_key(&from.key));
        let span = format!("bytes={}-{}", range.start, range.end.saturating_sub(1));
        let headers = [
            ("x-amz-copy-source", source.as_str()),
            ("x-amz-copy-source-range", span.as_str()),
            ("x-amz-copy-source-if-match", from.etag.as_str()),
        ];
        use rusty_s3::S3Action;
        self.client.retrying(
            Deadline::for_operation(&self.client.settings),
            || {
                format!(
                    "copy part {number} from bytes {}..{} of s3://{}/{}",
                    range.start, range.end, from.bucket, from.key
                )
            },
            |timeout| {
                let creds = creds.get();
                let mut action = bucket.upload_part(Some(&creds), key, number, &self.id);
                for (k, v) in headers {
                    action.headers_mut().insert(k, v.to_owned());
                }
                let url = action.sign(PRESIGN_FOR);
                let mut resp = self.client.send("PUT", &url, &headers, None, timeout)?;
                let status = resp.status().as_u16();
                if status == 412 {
                    return Err(Failure::Fatal(Error::Changed {
                        location: format!("s3://{}/{}", from.bucket, from.key),
                        what: format!(
                            "it no longer has the ETag {} the seal copies from",
                            from.etag
                        ),
                    }));
                }
                if status != 200 {
                    return Err(self.part_failure(status, &mut resp));
                }
                let body = body_text(&self.client, &mut resp)?;
                ok_body(&self.client, &body)?;
                xml_text(&body, "ETag")
                    .map(|t| t.replace("&quot;", "\"").replace("&#34;", "\""))
                    .ok_or_else(|| {
                        bad(
                            &self.client,
                            format!("copied part {number} came back without an ETag"),
                        )
                    })
            },
        )
    }

    /// Completes the upload with the parts' ETags in order, where nothing
    /// is at the key yet (`If-None-Match: *`).
    pub fn complete(&self, etags: &[String]) -> Result<Completion> {
        let (bucket, key, creds) = s3_target(&self.client)?;
        use rusty_s3::S3Action;
        let mut tried = false;
        self.client.retrying(
            Deadline::for_operation(&self.client.settings),
            || format!("complete the upload of {} parts", etags.len()),
            |timeout| {
                let retried = std::mem::replace(&mut tried, true);
                let creds = creds.get();
                let mut action = rusty_s3::actions::CompleteMultipartUpload::new(
                    bucket,
                    Some(&creds),
                    key,
                    &self.id,
                    etags.iter().map(String::as_str),
                );
                action.headers_mut().insert("if-none-match", "*");
                let url = action.sign(PRESIGN_FOR);
                let body = action.body();
                let headers = [("if-none-match", "*")];
                let mut resp =
                    self.client
                        .send("POST", &url, &headers, Some(body.as_bytes()), timeout)?;
                let status = resp.status().as_u16();
                match status {
                    200 => {
                        let text = body_text(&self.client, &mut resp)?;
                        ok_body(&self.client, &text)?;
                        Ok(Completion::Created)
                    }
                    412 => Ok(Completion::Exists),
                    // Another write to the key in progress: S3 asks to retry.
                    409 => Err(Failure::Retry("HTTP 409 ConditionalRequestConflict".into())),
                    // The upload is gone after an earlier attempt whose
                    // answer was lost: that attempt completed it, or
                    // something else is there; the caller looks.
                    404 if retried => Ok(Completion::Exists),
                    _ => Err(self.part_failure(status, &mut resp)),
                }
            },
        )
    }

    /// Aborts the upload, removing the parts sent so far: at most
    /// [`ABORT_WITHIN`], an upload already gone counting as aborted.
    pub fn abort(&self) -> Result<()> {
        let (bucket, key, creds) = s3_target(&self.client)?;
        let client = &self.client;
        use rusty_s3::S3Action;
        client.retrying(
            Deadline::for_operation(&client.settings).within(ABORT_WITHIN),
            || "abort the upload".into(),
            |timeout| {
                let url = bucket
                    .abort_multipart_upload(Some(&creds.get()), key, &self.id)
                    .sign(PRESIGN_FOR);
                let mut resp = client.send("DELETE", &url, &[], None, timeout)?;
                match resp.status().as_u16() {
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
    fn part_failure(&self, status: u16, resp: &mut ureq::http::Response<ureq::Body>) -> Failure {
        match self.client.status_failure(status, resp) {
            Failure::Fatal(Error::NotFound { code, .. }) if code == "NoSuchUpload" => bad(
                &self.client,
                "the upload is gone (NoSuchUpload): it was aborted meanwhile, or expired".into(),
            ),
            f => f,
        }
    }
}

/// Writes `bytes` (a small object: a trace sidecar) to `location` where
/// nothing is yet, as an upload of one part; aborted unless it completes.
pub fn put_new(location: &Location, settings: &Settings, bytes: &[u8]) -> Result<Completion> {
    let upload = Upload::create(location, settings)?;
    let done = upload
        .part(1, bytes)
        .and_then(|etag| upload.complete(&[etag]));
    if !matches!(done, Ok(Completion::Created)) {
        let _ = upload.abort();
    }
    done
}

/// A final bad-response failure.
fn bad(client: &Client, what: String) -> Failure {
    Failure::Fatal(Error::BadResponse {
        location: client.shown.clone(),
        what,
    })
}

/// The body of a successful response, as text; one cut short is worth
/// another attempt.
fn body_text(
    client: &Client,
    resp: &mut ureq::http::Response<ureq::Body>,
) -> std::result::Result<String, Failure> {
    let mut body = Vec::new();
    resp.body_mut()
        .with_config()
        .limit(RESPONSE_MAX)
        .reader()
        .take(RESPONSE_MAX)
        .read_to_end(&mut body)
        .map_err(|e| Failure::Retry(format!("the answer's body failed: {e}")))?;
    String::from_utf8(body).map_err(|_| bad(client, "an answer that is not UTF-8".into()))
}

/// S3 may answer a copy or a completion `200 OK` and still fail, with an
/// error document in the body: retried when the error is transient.
fn ok_body(client: &Client, body: &str) -> std::result::Result<(), Failure> {
    if !body.contains("<Error>") {
        return Ok(());
    }
    let code = xml_text(body, "Code").unwrap_or("unknown");
    match code {
        "InternalError" | "SlowDown" | "ServiceUnavailable" | "RequestTimeout" => {
            Err(Failure::Retry(format!("HTTP 200 with error {code}")))
        }
        _ => Err(bad(client, format!("the store answered with error {code}"))),
    }
}

/// The text of the first `<tag>` element of `xml`.
fn xml_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let rest = xml.split_once(open.as_str())?.1;
    Some(rest.split_once(close.as_str())?.0)
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
    fn xml_elements_are_found_by_tag() {
        let body = "<CopyPartResult><LastModified>x</LastModified><ETag>&quot;ab&quot;</ETag></CopyPartResult>";
        assert_eq!(xml_text(body, "ETag"), Some("&quot;ab&quot;"));
        assert_eq!(xml_text(body, "Code"), None);
        assert_eq!(
            xml_text("<Error><Code>SlowDown</Code></Error>", "Code"),
            Some("SlowDown")
        );
    }
}
