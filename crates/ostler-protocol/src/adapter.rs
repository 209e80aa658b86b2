//! Versioned adapters selected by CLI release (semver ranges).
//!
//! # Selection
//!
//! [`select`] maps the release reported by `claude --version` to the adapter whose semver
//! `range` contains it (pre-release tags are ignored for matching, so `2.1.0-beta.1` is
//! served by the 2.1 adapter). A release newer than every range, or an unknown release
//! (`None`), gets the newest adapter in *tolerant* mode; a release older than every range
//! gets the oldest one, also tolerant. [`selection`] reports which case applied.
//!
//! # One tolerant core, per-range tables
//!
//! All adapters share one decoder (`decode.rs`), which follows the tolerant reader rules:
//! unknown fields are ignored, unknown types are kept whole as [`crate::Event::Unknown`],
//! missing optional fields default (and are named in the event's `absent` list), numbers
//! given as strings are accepted, and nothing depends on field or message order. What
//! differs between ranges is data, not code:
//!
//! - `known_types`: the `type` / `type/subtype` strings the adapter claims. They gate the
//!   dispatch: a `system/<subtype>` or auxiliary top-level type (`tool_progress`, ...) that
//!   is not listed decodes to `Unknown`, so a new message type in a new release is visible
//!   (and the contract tests fail) instead of being silently reinterpreted.
//! - `expected_absent`: fields the releases of the range are known not to send (1.0.x:
//!   `can_use_tool.tool_use_id`, `session_started.cli_version`; before 2.1.x:
//!   `session_started.capabilities`). The decoder never invents these values; the contract
//!   tests check that every field reported absent in a recording is expected by the adapter
//!   of its release.
//! - `stream_message_id`: 2.1.x tags every `stream_event` with `api_message_id`; older
//!   releases only carry the id in `message_start`, so the decoder tracks it per
//!   `parent_tool_use_id`. (The decoder reads `api_message_id` whenever present; the flag
//!   documents which releases are expected to send it.)

use semver::{Version, VersionReq};

/// A protocol adapter: which releases it serves and which message types it claims to know.
#[derive(Debug)]
pub struct AdapterInfo {
    /// e.g. `"v1_0"`, `"v2_0"`, `"v2_1"`.
    pub name: &'static str,
    /// semver requirement, e.g. `">=1.0.0, <2.0.0"`.
    pub range: &'static str,
    /// `type` or `type/subtype` strings this adapter understands; anything else decodes to
    /// `Unknown` (never fatal).
    pub known_types: &'static [&'static str],
    /// `event_kind.field` names the releases of this range do not send (reported in the
    /// events' `absent` lists, never invented).
    pub expected_absent: &'static [&'static str],
    /// Whether `stream_event` frames carry `api_message_id` in this range.
    pub stream_message_id: bool,
}

impl AdapterInfo {
    /// Whether `message_type` (`type` or `type/subtype`) is claimed by this adapter.
    pub fn knows(&self, message_type: &str) -> bool {
        self.known_types.contains(&message_type)
    }

    /// [`Self::knows`] for `ty/sub`, without building the string (a `system` line's
    /// subtype is looked up for every such line).
    pub fn knows_sub(&self, ty: &str, sub: &str) -> bool {
        self.known_types.iter().any(|t| {
            t.len() == ty.len() + 1 + sub.len()
                && t.starts_with(ty)
                && t.as_bytes()[ty.len()] == b'/'
                && t.ends_with(sub)
        })
    }

    /// Whether the releases of this range are known not to send `field`
    /// (`event_kind.field`, e.g. `can_use_tool.tool_use_id`).
    pub fn expects_absent(&self, field: &str) -> bool {
        self.expected_absent.contains(&field)
    }

    /// Whether `release` lies in this adapter's range (pre-release tags ignored).
    pub fn serves(&self, release: &Version) -> bool {
        let plain = Version::new(release.major, release.minor, release.patch);
        VersionReq::parse(self.range).is_ok_and(|req| req.matches(&plain))
    }
}

/// Types every adapter decodes with a dedicated decoder.
macro_rules! core_types {
    ($($extra:literal),* $(,)?) => {
        &[
            "system/init",
            "assistant",
            "user",
            "result",
            "stream_event",
            "control_request",
            "control_response",
            "control_cancel_request",
            "keep_alive",
            "system/compact_boundary",
            $($extra),*
        ]
    };
}

static ADAPTERS: [AdapterInfo; 3] = [
    AdapterInfo {
        name: "v1_0",
        range: ">=1.0.0, <2.0.0",
        known_types: core_types!(),
        expected_absent: &[
            "can_use_tool.tool_use_id",
            "session_started.cli_version",
            "session_started.capabilities",
        ],
        stream_message_id: false,
    },
    AdapterInfo {
        name: "v2_0",
        range: ">=2.0.0, <2.1.0",
        known_types: core_types!(
            "system/status",
            "system/hook_response",
            "tool_progress",
            "auth_status",
        ),
        expected_absent: &["session_started.capabilities"],
        stream_message_id: false,
    },
    AdapterInfo {
        name: "v2_1",
        range: ">=2.1.0, <2.2.0",
        known_types: core_types!(
            "system/status",
            "system/thinking_tokens",
            "system/task_notification",
            "system/task_started",
            "system/task_updated",
            "system/background_tasks_changed",
            "system/task_progress",
            "system/files_persisted",
            "system/hook_started",
            "system/hook_progress",
            "system/hook_response",
            "system/api_retry",
            "system/local_command_output",
            "system/elicitation_complete",
            "system/informational",
            "tool_progress",
            "tool_use_summary",
            "auth_status",
            "rate_limit_event",
            "prompt_suggestion",
            "streamlined_text",
            "streamlined_tool_use_summary",
            "command_lifecycle",
        ),
        // 2.1.0 does not announce capabilities yet (2.1.330 does).
        expected_absent: &["session_started.capabilities"],
        stream_message_id: true,
    },
];

/// All adapters, oldest first.
pub fn all() -> &'static [AdapterInfo] {
    &ADAPTERS
}

/// The adapter chosen for a release, and whether it serves it in tolerant mode (release
/// unknown or outside every range).
#[derive(Debug, Clone, Copy)]
pub struct Selection {
    pub adapter: &'static AdapterInfo,
    pub tolerant: bool,
}

/// Pick the adapter for a release, saying whether it is a tolerant fallback.
pub fn selection(release: Option<&Version>) -> Selection {
    let newest = &ADAPTERS[ADAPTERS.len() - 1];
    let Some(v) = release else {
        return Selection {
            adapter: newest,
            tolerant: true,
        };
    };
    if let Some(a) = ADAPTERS.iter().find(|a| a.serves(v)) {
        return Selection {
            adapter: a,
            tolerant: false,
        };
    }
    // Outside every range: older than the oldest, or newer than the newest (an open range
    // never misses a newer release, but keep the rule explicit).
    let oldest = &ADAPTERS[0];
    let plain = Version::new(v.major, v.minor, v.patch);
    let adapter = if plain < Version::new(1, 0, 0) {
        oldest
    } else {
        newest
    };
    Selection {
        adapter,
        tolerant: true,
    }
}

/// Pick the adapter for a release; the newest one for `None` or newer releases.
pub fn select(release: Option<&Version>) -> &'static AdapterInfo {
    selection(release).adapter
}

/// Parse a release string as printed by `claude --version` (`2.1.330 (Claude Code)`,
/// `claude v1.0.22 (anthropic-2024-12-01)`) or a plain version (`2.1.330`).
pub fn parse_release(text: &str) -> Option<Version> {
    crate::version::parse(text).ok().map(|v| v.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn selects_by_range() {
        assert_eq!(select(Some(&v("1.0.128"))).name, "v1_0");
        assert_eq!(select(Some(&v("2.0.77"))).name, "v2_0");
        assert_eq!(select(Some(&v("2.1.0"))).name, "v2_1");
        assert_eq!(select(Some(&v("2.1.330"))).name, "v2_1");
        assert_eq!(select(Some(&v("2.1.0-beta.2"))).name, "v2_1");
        assert!(!selection(Some(&v("2.1.330"))).tolerant);
    }

    #[test]
    fn newer_unknown_and_older_are_tolerant() {
        let s = selection(Some(&v("3.4.5")));
        assert_eq!(s.adapter.name, "v2_1");
        assert!(s.tolerant);
        let s = selection(None);
        assert_eq!(s.adapter.name, "v2_1");
        assert!(s.tolerant);
        let s = selection(Some(&v("0.2.9")));
        assert_eq!(s.adapter.name, "v1_0");
        assert!(s.tolerant);
    }

    #[test]
    fn a_subtype_is_known_exactly_when_its_joined_name_is() {
        let mut subs: Vec<&str> = all()
            .iter()
            .flat_map(|a| a.known_types.iter())
            .filter_map(|t| t.split_once('/').map(|(_, sub)| sub))
            .collect();
        subs.extend(["", "/", "ini", "initx", "status/", "a/b", "init/"]);
        for a in all() {
            for ty in ["system", "sys", "systemx", "stream_event", ""] {
                for sub in &subs {
                    assert_eq!(
                        a.knows_sub(ty, sub),
                        a.knows(&format!("{ty}/{sub}")),
                        "{} {ty}/{sub}",
                        a.name
                    );
                }
            }
        }
    }

    #[test]
    fn ranges_do_not_overlap() {
        for probe in [
            "1.0.0", "1.9.9", "2.0.0", "2.0.99", "2.1.0", "2.1.999", "9.0.0",
        ] {
            let n = all().iter().filter(|a| a.serves(&v(probe))).count();
            assert!(n <= 1, "{probe} served by {n} adapters");
        }
    }

    #[test]
    fn parses_version_output() {
        assert_eq!(parse_release("2.1.330 (Claude Code)"), Some(v("2.1.330")));
        assert_eq!(
            parse_release("claude v1.0.22 (anthropic-2024-12-01)"),
            Some(v("1.0.22"))
        );
        assert_eq!(parse_release("garbage"), None);
    }
}
