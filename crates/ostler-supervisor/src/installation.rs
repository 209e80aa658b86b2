//! A checked `claude` binary: what [`crate::discover()`] finds, and what sessions are
//! started from.

use std::path::PathBuf;

use crate::compat::{self, Capabilities, CompatLevel, Degradation, FlagProbe};

/// A checked `claude` binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installation {
    pub path: PathBuf,
    pub version: semver::Version,
    /// API date from the old `claude vX (anthropic-YYYY-MM-DD)` shape.
    pub api_date: Option<String>,
    pub level: CompatLevel,
    pub capabilities: Capabilities,
    /// Name of the `ostler-protocol` adapter chosen for this release.
    pub adapter: &'static str,
    /// Human summary for logs, health and `doctor`.
    pub message: String,
    /// Missing capabilities and their workarounds (non-empty when `Degraded`).
    pub degraded: Vec<Degradation>,
    /// `claude --version` output, trimmed.
    pub version_output: String,
    /// Flags as measured on the binary, when probed.
    pub probe: Option<FlagProbe>,
}

impl Installation {
    /// Build an installation from a known version without running anything (tests, or
    /// when the caller already knows the release).
    pub fn assume(path: PathBuf, version: semver::Version, probe: Option<FlagProbe>) -> Self {
        let a = compat::assess(&version, probe.as_ref());
        Self {
            adapter: ostler_protocol::adapter::select(Some(&version)).name,
            path,
            api_date: None,
            level: a.level,
            capabilities: a.capabilities,
            message: a.message,
            degraded: a.degraded,
            version_output: version.to_string(),
            version,
            probe,
        }
    }
}
