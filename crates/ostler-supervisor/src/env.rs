//! The environment of a session process.
//!
//! The child starts from an empty environment. Inherited variables pass only if they match
//! the allowlist and not the scrub list; per-session variables are then set as given.
//! Patterns are exact names or a prefix followed by `*` (`ANTHROPIC_*`).

use std::ffi::OsString;

/// What the CLI needs to authenticate and reach its API, find its tools and behave.
pub const DEFAULT_ENV_ALLOWLIST: &[&str] = &[
    "ANTHROPIC_*",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    "CLAUDE_CONFIG_DIR",
    "DISABLE_AUTOUPDATER",
    "DISABLE_TELEMETRY",
    "AWS_*",
    "CLOUD_ML_REGION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
];

/// Never inherited even when the allowlist matches: markers that make the CLI believe it
/// runs inside another Claude Code, and the daemon's own secrets.
pub const DEFAULT_SCRUB: &[&str] = &["CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "OSTLER_*"];

/// Whether `name` matches `pattern` (exact, or prefix + `*`).
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// The child's environment: `inherited` filtered by `allowlist` minus `scrub`, then
/// `session` on top (per-session variables win and are not scrubbed: they are explicit).
pub fn build_env<I>(
    inherited: I,
    allowlist: &[String],
    scrub: &[String],
    session: &[(String, String)],
) -> Vec<(OsString, OsString)>
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut out: Vec<(OsString, OsString)> = inherited
        .into_iter()
        .filter(|(k, _)| {
            let Some(k) = k.to_str() else { return false };
            allowlist.iter().any(|p| matches(p, k)) && !scrub.iter().any(|p| matches(p, k))
        })
        .collect();
    for (k, v) in session {
        out.retain(|(ok, _)| ok.to_str() != Some(k.as_str()));
        out.push((OsString::from(k), OsString::from(v)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn allowlist_scrub_and_session_vars() {
        let inherited = [
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:1"),
            ("ANTHROPIC_API_KEY", "k"),
            ("CLAUDECODE", "1"),
            ("CLAUDE_CODE_ENTRYPOINT", "cli"),
            ("OSTLER_AUTH_TOKEN", "secret"),
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("RANDOM_THING", "x"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let mut allow: Vec<String> = DEFAULT_ENV_ALLOWLIST
            .iter()
            .map(|x| x.to_string())
            .collect();
        allow.push("CLAUDE*".into()); // even a broad allowlist cannot pass scrubbed names
        let env = build_env(
            inherited,
            &allow,
            &DEFAULT_SCRUB
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>(),
            &[
                ("HOME".into(), "/tmp/session-home".into()),
                ("SESSION_VAR".into(), "1".into()),
            ],
        );
        let get = |k: &str| {
            env.iter()
                .find(|(ek, _)| ek == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(
            get("ANTHROPIC_BASE_URL").as_deref(),
            Some("http://127.0.0.1:1")
        );
        assert_eq!(get("ANTHROPIC_API_KEY").as_deref(), Some("k"));
        assert_eq!(get("PATH").as_deref(), Some("/bin"));
        assert_eq!(get("LC_ALL").as_deref(), Some("C"));
        assert_eq!(get("HOME").as_deref(), Some("/tmp/session-home"));
        assert_eq!(get("SESSION_VAR").as_deref(), Some("1"));
        for gone in [
            "CLAUDECODE",
            "CLAUDE_CODE_ENTRYPOINT",
            "OSTLER_AUTH_TOKEN",
            "RANDOM_THING",
        ] {
            assert_eq!(get(gone), None, "{gone} leaked");
        }
        assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
        let _ = s(&[]);
    }
}
