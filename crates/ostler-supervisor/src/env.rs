//! The environment of a session process.
//!
//! The child starts from an empty environment. Inherited variables pass only if they match
//! the allowlist and not the scrub list; per-session variables are then set as given.
//! Patterns are exact names or a prefix followed by `*` (`ANTHROPIC_*`).

use std::ffi::OsString;

/// What the CLI needs to authenticate and reach its API, find its tools and behave: its
/// credentials (API key, `CLAUDE_CODE_OAUTH_TOKEN` of subscription users, Bedrock / Vertex
/// credentials), its documented configuration variables, proxies and certificates, and the
/// basics of a process environment. Extend it with `sessions.env_allow` in the daemon's
/// configuration; set variables for every session with `[sessions.env]`.
pub const DEFAULT_ENV_ALLOWLIST: &[&str] = &[
    // Authentication and API endpoints.
    "ANTHROPIC_*",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_SKIP_BEDROCK_AUTH",
    "CLAUDE_CODE_SKIP_VERTEX_AUTH",
    "CLAUDE_CODE_API_KEY_HELPER_TTL_MS",
    "CLAUDE_CODE_CLIENT_CERT",
    "CLAUDE_CODE_CLIENT_KEY",
    "CLAUDE_CODE_CLIENT_KEY_PASSPHRASE",
    "AWS_*",
    "CLOUD_ML_REGION",
    "VERTEX_REGION_*",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    // The CLI's documented configuration variables.
    "CLAUDE_CONFIG_DIR",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE",
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
    "CLAUDE_CODE_SUBAGENT_MODEL",
    "CLAUDE_CODE_SHELL_PREFIX",
    "CLAUDE_BASH_MAINTAIN_PROJECT_WORKING_DIR",
    "DISABLE_*",
    "MAX_THINKING_TOKENS",
    "MAX_MCP_OUTPUT_TOKENS",
    "MCP_TIMEOUT",
    "MCP_TOOL_TIMEOUT",
    "BASH_DEFAULT_TIMEOUT_MS",
    "BASH_MAX_TIMEOUT_MS",
    "BASH_MAX_OUTPUT_LENGTH",
    "SLASH_COMMAND_TOOL_CHAR_BUDGET",
    "USE_BUILTIN_RIPGREP",
    // Node.js: where Node >= 22.1 keeps the code it compiled; a node-based release (up to
    // 2.1.0) starts on about a third less CPU with it (an operator's choice).
    "NODE_COMPILE_CACHE",
    // Network.
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
    // The process basics.
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

/// Longest variable name accepted in configuration.
pub const MAX_NAME_LEN: usize = 256;

/// Why a variable name or pattern from configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvNameError {
    #[error("is empty")]
    Empty,
    #[error("is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    #[error("{0:?} is not a variable name (letters, digits and `_`, not starting with a digit)")]
    Invalid(String),
    #[error("{0:?}: OSTLER_* variables are the daemon's own and never reach a session")]
    Reserved(String),
    #[error(
        "{0:?} is always removed: it would make the CLI believe it runs inside another Claude Code"
    )]
    Scrubbed(String),
}

/// Checks a variable name given in configuration (`[sessions.env]`): `[A-Za-z_][A-Za-z0-9_]*`,
/// not an `OSTLER_*` name, not a name the scrub list always removes.
pub fn validate_name(name: &str) -> Result<(), EnvNameError> {
    check_chars(name)?;
    if name
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("OSTLER_"))
    {
        return Err(EnvNameError::Reserved(name.to_owned()));
    }
    if DEFAULT_SCRUB
        .iter()
        .any(|p| *p != "OSTLER_*" && matches(p, name))
    {
        return Err(EnvNameError::Scrubbed(name.to_owned()));
    }
    Ok(())
}

/// Checks an allowlist entry from configuration: a name, or a prefix followed by `*`
/// (`MYCO_*`). `OSTLER_*` is refused (those variables are always scrubbed).
pub fn validate_pattern(pattern: &str) -> Result<(), EnvNameError> {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    if name.is_empty() {
        // A lone `*` would pass the daemon's whole environment, secrets included.
        return Err(EnvNameError::Invalid(pattern.to_owned()));
    }
    check_chars(name).map_err(|e| match e {
        EnvNameError::Invalid(_) => EnvNameError::Invalid(pattern.to_owned()),
        other => other,
    })?;
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("OSTLER_") {
        return Err(EnvNameError::Reserved(pattern.to_owned()));
    }
    Ok(())
}

fn check_chars(name: &str) -> Result<(), EnvNameError> {
    if name.is_empty() {
        return Err(EnvNameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(EnvNameError::TooLong);
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(EnvNameError::Invalid(name.to_owned()));
    }
    Ok(())
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
            ("CLAUDE_CODE_OAUTH_TOKEN", "oauth"),
            ("MAX_THINKING_TOKENS", "1024"),
            ("DISABLE_TELEMETRY", "1"),
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
        assert_eq!(get("CLAUDE_CODE_OAUTH_TOKEN").as_deref(), Some("oauth"));
        assert_eq!(get("MAX_THINKING_TOKENS").as_deref(), Some("1024"));
        assert_eq!(get("DISABLE_TELEMETRY").as_deref(), Some("1"));
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

    #[test]
    fn names_and_patterns_from_configuration() {
        for ok in ["FOO", "_x1", "MY_VAR_2", "CLAUDE_CODE_OAUTH_TOKEN"] {
            assert_eq!(validate_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(validate_name(""), Err(EnvNameError::Empty));
        assert_eq!(
            validate_name(&"A".repeat(MAX_NAME_LEN + 1)),
            Err(EnvNameError::TooLong)
        );
        for bad in ["1ABC", "A-B", "A=B", "A B", "A\0B", "É"] {
            assert!(
                matches!(validate_name(bad), Err(EnvNameError::Invalid(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            validate_name("OSTLER_AUTH__TOKENS"),
            Err(EnvNameError::Reserved(_))
        ));
        assert!(matches!(
            validate_name("ostler_x"),
            Err(EnvNameError::Reserved(_))
        ));
        assert!(matches!(
            validate_name("CLAUDECODE"),
            Err(EnvNameError::Scrubbed(_))
        ));

        for ok in ["MYCO_*", "FOO", "F*"] {
            assert_eq!(validate_pattern(ok), Ok(()), "{ok}");
        }
        for bad in ["*", "A-*", "**"] {
            assert!(
                matches!(validate_pattern(bad), Err(EnvNameError::Invalid(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            validate_pattern("OSTLER_*"),
            Err(EnvNameError::Reserved(_))
        ));
        let msg = validate_name("OSTLER_X").unwrap_err().to_string();
        assert!(msg.contains("OSTLER_X") && msg.contains("daemon"), "{msg}");
    }
}
