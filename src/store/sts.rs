//! Web identity credentials: STS `AssumeRoleWithWebIdentity`, an unsigned
//! request that trades the token a pod is given for temporary keys.

use super::aws::{Credentials, Secret, WebIdentity};
use super::deadline::Deadline;
use super::error::{Error, Result};
use super::transport::{Method, Request, Transport};
use super::xml::Doc;

/// The most of an STS response read (a real one is about 2 KiB).
const RESPONSE_MAX: u64 = 64 * 1024;

/// One STS request takes at most this long (within the operation's
/// deadline): STS answers in well under a second, and a renewal holds up
/// the read that needed it.
const STS_REQUEST_MAX: std::time::Duration = std::time::Duration::from_secs(20);

/// Reads the token file and asks STS for credentials, one request within
/// `deadline` (connecting, sending, the answer and its body). Errors name
/// the token file, the role and the STS endpoint (without user
/// information), never the token.
pub fn assume_role(
    w: &WebIdentity,
    transport: &dyn Transport,
    location: &str,
    deadline: Deadline,
) -> Result<Credentials> {
    let fail = |reason: String| Error::Config {
        location: location.to_owned(),
        reason: format!(
            "web identity: cannot assume {} through STS at {}: {reason}",
            w.role_arn,
            super::shown_url(&w.sts_endpoint)
        ),
    };
    let token = std::fs::read_to_string(&w.token_file)
        .map_err(|e| fail(format!("cannot read the token file {}: {e}", w.token_file)))?;
    let form = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("Action", "AssumeRoleWithWebIdentity")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", &w.role_arn)
        .append_pair("RoleSessionName", &w.session_name)
        .append_pair("WebIdentityToken", token.trim())
        .finish();
    let headers = [
        ("accept", "application/xml"),
        ("content-type", "application/x-www-form-urlencoded"),
    ];
    let req = Request {
        method: Method::Post,
        url: &w.sts_endpoint,
        headers: &headers,
        body: form.as_bytes(),
    };
    let timeout = deadline.remaining().min(STS_REQUEST_MAX);
    if timeout.is_zero() {
        return Err(fail(format!(
            "no time left in the operation's bound of {:.1?}",
            deadline.bound()
        )));
    }
    let mut resp = transport
        .send(&req, timeout)
        .map_err(|e| fail(format!("no answer within {timeout:.1?}: {e}")))?;
    let body = resp
        .read_limited(RESPONSE_MAX)
        .map_err(|e| fail(format!("reading the answer: {e}")))?;
    if resp.status != 200 {
        let code = super::xml::error_code(&body);
        return Err(fail(format!(
            "HTTP {} ({})",
            resp.status,
            code.as_deref().unwrap_or("no error code")
        )));
    }
    let text = String::from_utf8_lossy(&body);
    parse_credentials(&text).ok_or_else(|| fail("the answer holds no credentials".into()))
}

/// The credentials of an `AssumeRoleWithWebIdentityResponse`.
fn parse_credentials(xml: &str) -> Option<Credentials> {
    let doc = Doc::parse(xml).ok()?;
    if doc.root() != "AssumeRoleWithWebIdentityResponse" {
        return None;
    }
    let path = |name| {
        doc.text(&["AssumeRoleWithWebIdentityResult", "Credentials", name])
            .filter(|v| !v.is_empty())
    };
    Some(Credentials {
        access_key_id: path("AccessKeyId")?.to_owned(),
        secret_access_key: Secret(path("SecretAccessKey")?.to_owned()),
        session_token: Some(Secret(path("SessionToken")?.to_owned())),
        source: "web identity".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sts_answers_parse() {
        let ok = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIA1</AccessKeyId><SecretAccessKey>s+/1</SecretAccessKey><SessionToken>tok=</SessionToken><Expiration>2026-12-06T10:07:41Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
        let c = parse_credentials(ok).unwrap();
        assert_eq!(c.access_key_id, "ASIA1");
        assert_eq!(c.secret_access_key, Secret("s+/1".into()));
        assert_eq!(c.session_token, Some(Secret("tok=".into())));
        for bad in [
            "",
            "<Credentials><AccessKeyId>A</AccessKeyId><SecretAccessKey>s</SecretAccessKey><SessionToken>t</SessionToken></Credentials>",
            "<Credentials><AccessKeyId>A</AccessKeyId></Credentials>",
            "<Credentials><AccessKeyId>A</AccessKeyId><SecretAccessKey>s</SecretAccessKey>",
        ] {
            assert!(parse_credentials(bad).is_none(), "{bad}");
        }
    }
}
