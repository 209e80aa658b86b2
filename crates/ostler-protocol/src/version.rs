//! Parsing `claude --version` output (the one parser: the supervisor's discovery, the test
//! kit's release installer and [`crate::adapter::parse_release`] all use it).
//!
//! Two shapes are known:
//! - `2.1.330 (Claude Code)` (every release from 1.0.x to 2.1.x seen here);
//! - `claude v1.0.22 (anthropic-2024-12-01)` (older write-ups), whose parenthesised part
//!   carries the Anthropic API date.
//!
//! Other lines (warnings, banners) may come before the version line; the first line that
//! has the shape wins.

use thiserror::Error;

/// A parsed `claude --version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudeVersion {
    pub version: semver::Version,
    /// The API date from `(anthropic-YYYY-MM-DD)`, as `YYYY-MM-DD`.
    pub api_date: Option<String>,
    /// The text in parentheses, verbatim (`Claude Code`, `anthropic-2024-12-01`).
    pub label: Option<String>,
}

#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("unrecognised `claude --version` output: {excerpt:?}")]
pub struct VersionParseError {
    /// The beginning of the output (at most 200 characters).
    pub excerpt: String,
}

/// Parse the output of `claude --version`.
pub fn parse(output: &str) -> Result<ClaudeVersion, VersionParseError> {
    output
        .lines()
        .find_map(parse_line)
        .ok_or_else(|| VersionParseError {
            excerpt: output.trim().chars().take(200).collect(),
        })
}

fn parse_line(line: &str) -> Option<ClaudeVersion> {
    let mut rest = line.trim();
    // Optional program name: `claude`, `Claude Code`.
    for prefix in ["claude code", "claude"] {
        if rest.len() >= prefix.len() && rest[..prefix.len()].eq_ignore_ascii_case(prefix) {
            let after = &rest[prefix.len()..];
            if after.starts_with(char::is_whitespace) {
                rest = after.trim_start();
                break;
            }
        }
    }
    let (token, tail) = match rest.find(char::is_whitespace) {
        Some(i) => (&rest[..i], rest[i..].trim()),
        None => (rest, ""),
    };
    let token = token.strip_prefix(['v', 'V']).unwrap_or(token);
    let version = semver::Version::parse(token).ok()?;
    let label = if tail.is_empty() {
        None
    } else {
        let inner = tail.strip_prefix('(')?.strip_suffix(')')?.trim();
        Some(inner.to_string())
    };
    let api_date = label
        .as_deref()
        .and_then(|l| l.strip_prefix("anthropic-"))
        .filter(|d| is_date(d))
        .map(str::to_string);
    Some(ClaudeVersion {
        version,
        api_date,
        label,
    })
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_shape() {
        let v = parse("2.1.330 (Claude Code)\n").unwrap();
        assert_eq!(v.version, semver::Version::new(2, 1, 330));
        assert_eq!(v.api_date, None);
        assert_eq!(v.label.as_deref(), Some("Claude Code"));
    }

    #[test]
    fn old_shape_keeps_api_date() {
        let v = parse("claude v1.0.22 (anthropic-2024-12-01)").unwrap();
        assert_eq!(v.version, semver::Version::new(1, 0, 22));
        assert_eq!(v.api_date.as_deref(), Some("2024-12-01"));
    }

    #[test]
    fn banner_lines_before_version_are_skipped() {
        let v = parse("Warning: something\n\n1.0.128 (Claude Code)\n").unwrap();
        assert_eq!(v.version, semver::Version::new(1, 0, 128));
    }

    #[test]
    fn bare_version_and_prerelease() {
        let v = parse("2.2.0-beta.1").unwrap();
        assert_eq!(v.version, semver::Version::parse("2.2.0-beta.1").unwrap());
    }

    #[test]
    fn garbage_is_an_error() {
        for s in [
            "",
            "hello world",
            "Segmentation fault",
            "1.2 (Claude Code)",
            "claude 1.0.0 Claude Code",
            "vv1.0.0",
        ] {
            let e = parse(s).unwrap_err();
            assert!(s.starts_with(&e.excerpt), "{s:?} -> {e:?}");
        }
    }

    #[test]
    fn malformed_date_is_not_an_api_date() {
        let v = parse("claude v1.0.22 (anthropic-2024-1-01)").unwrap();
        assert_eq!(v.api_date, None);
    }
}
