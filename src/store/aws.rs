//! The AWS configuration chain, as the AWS CLI and SDKs read it: the
//! environment first, then the shared files of a profile.
//!
//! - Credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+
//!   `AWS_SESSION_TOKEN`); else the profile (`AWS_PROFILE`, or `default`)
//!   in `AWS_SHARED_CREDENTIALS_FILE` (`~/.aws/credentials`), then in
//!   `AWS_CONFIG_FILE` (`~/.aws/config`).
//! - Region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`,
//!   else `us-east-1`.
//! - Endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
//!   `endpoint_url`, else AWS's regional endpoint.
//! - Addressing: `SESSIONFS_S3_ADDRESSING_STYLE` (`path` or `virtual`),
//!   the profile's `s3 = addressing_style = …`; else path-style for a
//!   custom endpoint (MinIO, Ceph, R2 and test servers expect it) and
//!   virtual-hosted for AWS (path-style for a bucket with a dot, which
//!   a TLS certificate for `*.s3…` does not cover).
//!
//! - Web identity, for pods: when neither the environment nor the profile
//!   holds keys, `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` (or the
//!   profile's `web_identity_token_file` + `role_arn`), with
//!   `AWS_ROLE_SESSION_NAME` (default `sessionfs`), exchanged for
//!   temporary credentials through STS `AssumeRoleWithWebIdentity` at
//!   `AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`, else
//!   `https://sts.REGION.amazonaws.com` (see [`super::sts`]).
//!
//! Secrets live in [`Secret`], whose `Debug` prints nothing of them.

use std::collections::HashMap;

/// A secret string: its `Debug` is redacted, and it is never displayed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// Static credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id (not secret, but not shown either).
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: Secret,
    /// The session token of temporary credentials.
    pub session_token: Option<Secret>,
    /// Where they came from, for messages (`environment`, a file and profile).
    pub source: String,
}

/// Where the credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    /// Keys given as they are.
    Static(Credentials),
    /// A web identity token to exchange through STS.
    WebIdentity(WebIdentity),
}

/// What `AssumeRoleWithWebIdentity` needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebIdentity {
    /// The file holding the token (read when the credentials are asked
    /// for: a pod's token is rotated in place).
    pub token_file: String,
    /// The role to assume.
    pub role_arn: String,
    /// The session name.
    pub session_name: String,
    /// The STS endpoint.
    pub sts_endpoint: url::Url,
}

/// Everything needed to address and sign S3 requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    /// The endpoint, without bucket.
    pub endpoint: url::Url,
    /// The signing region.
    pub region: String,
    /// Path-style (`endpoint/bucket/key`) rather than virtual-hosted.
    pub path_style: bool,
    /// The credentials, or how to get them.
    pub credentials: CredentialSource,
}

/// The AWS SDKs' region when none is configured.
const DEFAULT_REGION: &str = "us-east-1";

impl S3Config {
    /// Reads the configuration from the process environment and the
    /// shared files.
    pub fn from_env() -> Result<S3Config, String> {
        S3Config::resolve(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()), &|p| {
            std::fs::read_to_string(p).ok()
        })
    }

    /// The chain, over an environment lookup and a file reader (so tests
    /// can give both). Errors name the variable or file to fix.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        read: &dyn Fn(&str) -> Option<String>,
    ) -> Result<S3Config, String> {
        let home = env("HOME").unwrap_or_default();
        let cred_file = env("AWS_SHARED_CREDENTIALS_FILE")
            .unwrap_or_else(|| format!("{home}/.aws/credentials"));
        let conf_file = env("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config"));
        let explicit_profile = env("AWS_PROFILE");
        let profile = explicit_profile.clone().unwrap_or_else(|| "default".into());
        let creds_ini = read(&cred_file).map(|t| parse_ini(&t)).unwrap_or_default();
        let conf_ini = read(&conf_file).map(|t| parse_ini(&t)).unwrap_or_default();
        let in_creds = creds_ini.get(&profile);
        let conf_section = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let in_conf = conf_ini.get(&conf_section);
        if explicit_profile.is_some() && in_creds.is_none() && in_conf.is_none() {
            return Err(format!(
                "AWS_PROFILE names profile `{profile}`, which is in neither {cred_file} nor {conf_file}"
            ));
        }
        let from_profile = |k: &str| {
            in_creds
                .and_then(|s| s.get(k))
                .or_else(|| in_conf.and_then(|s| s.get(k)))
                .cloned()
        };
        let conf = |k: &str| in_conf.and_then(|s| s.get(k)).cloned();

        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| conf("region"))
            .unwrap_or_else(|| DEFAULT_REGION.into());
        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => Credentials {
                access_key_id: id,
                secret_access_key: Secret(secret),
                session_token: env("AWS_SESSION_TOKEN").map(Secret),
                source: "environment".into(),
            },
            (Some(_), None) => {
                return Err("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into());
            }
            (None, Some(_)) => {
                return Err("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into());
            }
            (None, None) => match (
                from_profile("aws_access_key_id"),
                from_profile("aws_secret_access_key"),
            ) {
                (Some(id), Some(secret)) => Credentials {
                    access_key_id: id,
                    secret_access_key: Secret(secret),
                    session_token: from_profile("aws_session_token").map(Secret),
                    source: format!("profile `{profile}`"),
                },
                _ if env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some()
                    || from_profile("web_identity_token_file").is_some() =>
                {
                    let token_file = env("AWS_WEB_IDENTITY_TOKEN_FILE")
                        .or_else(|| from_profile("web_identity_token_file"))
                        .unwrap_or_default();
                    let role_arn = env("AWS_ROLE_ARN")
                        .or_else(|| from_profile("role_arn"))
                        .ok_or("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not")?;
                    let sts = env("AWS_ENDPOINT_URL_STS")
                        .map(|e| ("AWS_ENDPOINT_URL_STS", e))
                        .or_else(|| env("AWS_ENDPOINT_URL").map(|e| ("AWS_ENDPOINT_URL", e)))
                        .unwrap_or(("the region", format!("https://sts.{region}.amazonaws.com")));
                    return S3Config::finish(
                        env,
                        &conf,
                        &conf_file,
                        region,
                        CredentialSource::WebIdentity(WebIdentity {
                            token_file,
                            role_arn,
                            session_name: env("AWS_ROLE_SESSION_NAME")
                                .unwrap_or_else(|| "sessionfs".into()),
                            sts_endpoint: http_url(sts.0, &sts.1)?,
                        }),
                    );
                }
                _ => {
                    return Err(format!(
                        "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE to a profile with aws_access_key_id and aws_secret_access_key in {cred_file}"
                    ));
                }
            },
        };
        S3Config::finish(
            env,
            &conf,
            &conf_file,
            region,
            CredentialSource::Static(credentials),
        )
    }

    /// The endpoint and addressing, once the credentials are known.
    fn finish(
        env: &dyn Fn(&str) -> Option<String>,
        conf: &dyn Fn(&str) -> Option<String>,
        conf_file: &str,
        region: String,
        credentials: CredentialSource,
    ) -> Result<S3Config, String> {
        let custom = env("AWS_ENDPOINT_URL_S3")
            .map(|e| ("AWS_ENDPOINT_URL_S3", e))
            .or_else(|| env("AWS_ENDPOINT_URL").map(|e| ("AWS_ENDPOINT_URL", e)))
            .or_else(|| conf("endpoint_url").map(|e| ("endpoint_url", e)));
        let endpoint = match &custom {
            Some((from, e)) => http_url(from, e)?,
            None => url::Url::parse(&format!("https://s3.{region}.amazonaws.com"))
                .map_err(|err| format!("the region `{region}` makes no endpoint ({err})"))?,
        };
        let style = env("SESSIONFS_S3_ADDRESSING_STYLE").or_else(|| conf("s3.addressing_style"));
        let path_style = match style.as_deref() {
            Some("path") => true,
            Some("virtual") => false,
            None | Some("auto") => custom.is_some(),
            Some(other) => {
                return Err(format!(
                    "addressing style `{other}` is neither `path` nor `virtual` (SESSIONFS_S3_ADDRESSING_STYLE, or s3.addressing_style in {conf_file})"
                ));
            }
        };
        Ok(S3Config {
            endpoint,
            region,
            path_style,
            credentials,
        })
    }
}

/// An http:// or https:// URL with a host, from setting `from`.
fn http_url(from: &str, e: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(e).map_err(|err| format!("{from} is not an URL ({err})"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(format!(
            "{from} must be an http:// or https:// URL with a host"
        ));
    }
    Ok(u)
}

/// Parses the shared files' INI dialect: `[section]`, `key = value`,
/// comments from `#` or `;` at a line's start, and one level of nested
/// keys (`s3 =` followed by indented `addressing_style = path`, stored as
/// `s3.addressing_style`). Keys are lowercase; a later value wins.
pub fn parse_ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section: Option<String> = None;
    let mut parent: Option<String> = None;
    for line in text.lines() {
        let indented = line.starts_with([' ', '\t']);
        let t = line.trim();
        if t.is_empty() || t.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            section = Some(name.split_whitespace().collect::<Vec<_>>().join(" "));
            parent = None;
            continue;
        }
        let (Some(sec), Some((k, v))) = (&section, t.split_once('=')) else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        let key = match (&parent, indented) {
            (Some(p), true) => format!("{p}.{k}"),
            _ => {
                parent = v.is_empty().then(|| k.clone());
                k
            }
        };
        out.entry(sec.clone()).or_default().insert(key, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(env: &[(&str, &str)], files: &[(&str, &str)]) -> Result<S3Config, String> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let files: HashMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        S3Config::resolve(&|k| env.get(k).cloned(), &|p| files.get(p).cloned())
    }

    fn keys(c: &S3Config) -> &Credentials {
        match &c.credentials {
            CredentialSource::Static(k) => k,
            other => panic!("{other:?}"),
        }
    }

    /// Web identity comes after keys, from the environment or a profile,
    /// with STS at the endpoint override or the region's.
    #[test]
    fn web_identity_is_used_when_no_keys_are_given() {
        let web = |env: &[(&str, &str)], files: &[(&str, &str)]| match resolve(env, files)
            .unwrap()
            .credentials
        {
            CredentialSource::WebIdentity(w) => w,
            other => panic!("{other:?}"),
        };
        let w = web(
            &[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
                ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
                ("AWS_REGION", "eu-north-1"),
            ],
            &[],
        );
        assert_eq!(
            (
                w.token_file.as_str(),
                w.role_arn.as_str(),
                w.session_name.as_str(),
                w.sts_endpoint.as_str()
            ),
            (
                "/var/run/token",
                "arn:aws:iam::1:role/r",
                "sessionfs",
                "https://sts.eu-north-1.amazonaws.com/"
            )
        );
        let w = web(
            &[
                ("HOME", "/h"),
                ("AWS_PROFILE", "pod"),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:5"),
                ("AWS_ROLE_SESSION_NAME", "s1"),
            ],
            &[(
                "/h/.aws/config",
                "[profile pod]\nweb_identity_token_file = /t\nrole_arn = arn:r\n",
            )],
        );
        assert_eq!(
            (
                w.token_file.as_str(),
                w.session_name.as_str(),
                w.sts_endpoint.as_str()
            ),
            ("/t", "s1", "http://127.0.0.1:5/")
        );
        // Keys in the environment win.
        let c = resolve(
            &[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
                ("AWS_ROLE_ARN", "r"),
                ("AWS_ACCESS_KEY_ID", "a"),
                ("AWS_SECRET_ACCESS_KEY", "s"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(keys(&c).access_key_id, "a");
    }

    const CREDS: &str = "[default]\naws_access_key_id = AKDEF\naws_secret_access_key = sdef\n\n[dev]\naws_access_key_id=AKDEV\naws_secret_access_key=sdev\naws_session_token = tdev\n";
    const CONF: &str = "[default]\nregion = eu-west-1\n# comment\n[profile dev]\nregion = ap-south-1\nendpoint_url = http://127.0.0.1:9000\ns3 =\n  addressing_style = virtual\n";

    /// The chain's precedence, one row per rule of the module's doc.
    #[test]
    fn configuration_follows_the_aws_chain() {
        let files = [("/h/.aws/credentials", CREDS), ("/h/.aws/config", CONF)];
        let key = |c: &S3Config| keys(c).access_key_id.clone();
        // Profile default from the files.
        let c = resolve(&[("HOME", "/h")], &files).unwrap();
        assert_eq!(
            (
                key(&c),
                c.region.as_str(),
                c.endpoint.as_str(),
                c.path_style
            ),
            (
                "AKDEF".into(),
                "eu-west-1",
                "https://s3.eu-west-1.amazonaws.com/",
                false
            )
        );
        // A named profile: its token, region, endpoint and nested style.
        let c = resolve(&[("HOME", "/h"), ("AWS_PROFILE", "dev")], &files).unwrap();
        assert_eq!(key(&c), "AKDEV");
        assert_eq!(keys(&c).session_token, Some(Secret("tdev".into())));
        assert_eq!(
            (c.region.as_str(), c.endpoint.as_str(), c.path_style),
            ("ap-south-1", "http://127.0.0.1:9000/", false)
        );
        // The environment wins over every file.
        let c = resolve(
            &[
                ("HOME", "/h"),
                ("AWS_PROFILE", "dev"),
                ("AWS_ACCESS_KEY_ID", "AKENV"),
                ("AWS_SECRET_ACCESS_KEY", "senv"),
                ("AWS_DEFAULT_REGION", "us-west-2"),
                ("AWS_ENDPOINT_URL", "http://other:1"),
                ("AWS_ENDPOINT_URL_S3", "http://s3only:2"),
            ],
            &files,
        )
        .unwrap();
        assert_eq!(
            (key(&c), c.region.as_str(), c.endpoint.as_str()),
            ("AKENV".into(), "us-west-2", "http://s3only:2/")
        );
        assert_eq!(keys(&c).source, "environment");
        // A custom endpoint is path-style unless told otherwise.
        let c = resolve(
            &[("HOME", "/h"), ("AWS_ENDPOINT_URL", "http://m:9")],
            &files,
        )
        .unwrap();
        assert!(c.path_style);
        let c = resolve(
            &[
                ("HOME", "/h"),
                ("AWS_REGION", "r1"),
                ("SESSIONFS_S3_ADDRESSING_STYLE", "path"),
            ],
            &files,
        )
        .unwrap();
        assert!(c.path_style);
        assert_eq!(c.region, "r1");
    }

    #[test]
    fn configuration_errors_name_what_to_fix() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("HOME", "/none")], "no credentials"),
            (
                &[("AWS_ACCESS_KEY_ID", "a")],
                "AWS_SECRET_ACCESS_KEY is not",
            ),
            (
                &[("AWS_PROFILE", "ghost"), ("HOME", "/h")],
                "profile `ghost`",
            ),
            (
                &[("AWS_WEB_IDENTITY_TOKEN_FILE", "/t")],
                "AWS_ROLE_ARN is not",
            ),
            (
                &[
                    ("AWS_ACCESS_KEY_ID", "a"),
                    ("AWS_SECRET_ACCESS_KEY", "VERYSECRET"),
                    ("AWS_ENDPOINT_URL", "ftp://x"),
                ],
                "http:// or https://",
            ),
            (
                &[
                    ("AWS_ACCESS_KEY_ID", "a"),
                    ("AWS_SECRET_ACCESS_KEY", "VERYSECRET"),
                    ("SESSIONFS_S3_ADDRESSING_STYLE", "odd"),
                ],
                "neither `path`",
            ),
        ];
        for (env, want) in cases {
            let e = resolve(env, &[]).unwrap_err();
            assert!(e.contains(want), "{env:?}: {e}");
            assert!(!e.contains("VERYSECRET"), "{e}");
        }
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        let c = resolve(
            &[
                ("AWS_ACCESS_KEY_ID", "a"),
                ("AWS_SECRET_ACCESS_KEY", "VERYSECRET"),
                ("AWS_SESSION_TOKEN", "TOKENSECRET"),
            ],
            &[],
        )
        .unwrap();
        let shown = format!("{:?}", keys(&c));
        assert!(
            !shown.contains("VERYSECRET") && !shown.contains("TOKENSECRET"),
            "{shown}"
        );
    }
}
