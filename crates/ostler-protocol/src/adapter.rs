//! Versioned adapters selected by CLI release (semver ranges).

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
}

/// All adapters, oldest first.
pub fn all() -> &'static [AdapterInfo] {
    unimplemented!("adapters")
}

/// Pick the adapter for a release; the newest one for `None` or newer releases.
pub fn select(_release: Option<&semver::Version>) -> &'static AdapterInfo {
    unimplemented!("adapters")
}
