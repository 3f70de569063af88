//! Web identity credentials: STS `AssumeRoleWithWebIdentity`, an unsigned
//! request that trades the token a pod is given for temporary keys.

use std::io::Read;

use super::aws::{Credentials, Secret, WebIdentity};
use super::error::{Error, Result};

/// The most of an STS response read (a real one is about 2 KiB).
const RESPONSE_MAX: u64 = 64 * 1024;

/// Reads the token file and asks STS for credentials. Errors name the
/// token file, the role and the STS endpoint, never the token.
pub fn assume_role(w: &WebIdentity, agent: &ureq::Agent, location: &str) -> Result<Credentials> {
    let fail = |reason: String| Error::Config {
        location: location.to_owned(),
        reason: format!(
            "web identity: cannot assume {} through STS at {}: {reason}",
            w.role_arn, w.sts_endpoint
        ),
    };
    let token = std::fs::read_to_string(&w.token_file)
        .map_err(|e| fail(format!("cannot read the token file {}: {e}", w.token_file)))?;
    let resp = agent
        .post(w.sts_endpoint.as_str())
        .header("accept", "application/xml")
        .send_form([
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", w.role_arn.as_str()),
            ("RoleSessionName", w.session_name.as_str()),
            ("WebIdentityToken", token.trim()),
        ])
        .map_err(|e| fail(e.to_string()))?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    resp.into_body()
        .into_with_config()
        .limit(RESPONSE_MAX)
        .reader()
        .take(RESPONSE_MAX)
        .read_to_end(&mut body)
        .map_err(|e| fail(format!("reading the answer: {e}")))?;
    let text = String::from_utf8_lossy(&body);
    if status != 200 {
        let code = tag(&text, "Code").filter(|c| c.bytes().all(|b| b.is_ascii_alphanumeric()));
        return Err(fail(format!(
            "HTTP {status} ({})",
            code.unwrap_or("no error code")
        )));
    }
    parse_credentials(&text).ok_or_else(|| fail("the answer holds no credentials".into()))
}

/// The credentials of an `AssumeRoleWithWebIdentityResponse`.
fn parse_credentials(xml: &str) -> Option<Credentials> {
    let creds = tag(xml, "Credentials")?;
    Some(Credentials {
        access_key_id: tag(creds, "AccessKeyId")?.to_owned(),
        secret_access_key: Secret(tag(creds, "SecretAccessKey")?.to_owned()),
        session_token: Some(Secret(tag(creds, "SessionToken")?.to_owned())),
        source: "web identity".into(),
    })
}

/// The text of the first element `<name>…</name>`.
fn tag<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{name}>"))? + name.len() + 2;
    let len = xml[start..].find(&format!("</{name}>"))?;
    Some(xml[start..start + len].trim())
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
            "<Credentials><AccessKeyId>A</AccessKeyId></Credentials>",
            "<Credentials><AccessKeyId>A</AccessKeyId><SecretAccessKey>s</SecretAccessKey>",
        ] {
            assert!(parse_credentials(bad).is_none(), "{bad}");
        }
    }
}
