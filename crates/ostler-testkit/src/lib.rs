//! ostler-testkit: test support for ostler.
//!
//! - [`server::FakeModelServer`]: a loopback server speaking enough of the Anthropic
//!   Messages API for the real Claude Code CLI, driven by [`scenario::Scenario`] files;
//! - [`releases`]: the pinned CLI releases (`contracts/releases.toml`) and their npm
//!   installation into a cache ([`releases::installed`]: how every test finds a release);
//! - [`cli`]: running the real CLI hermetically;
//! - [`record`]: the scenario driver that writes the contract corpus
//!   (`contracts/claude-code/<release>/<scenario>.ndjson`);
//! - [`contract`]: wire-shape extraction and comparison for the live contract check;
//! - [`fake_claude`]: `ostler-fake-claude`, a fast fake of the CLI for tests and benchmarks.
//! - [`timeouts`]: every test timeout, derived from one scale factor
//!   (`OSTLER_TEST_TIMEOUT_SCALE`).
#![allow(clippy::disallowed_methods)] // test support: launches the real CLI and npm

use std::path::{Path, PathBuf};

pub mod cli;
pub mod contract;
pub mod corpus;
pub mod fake_bin;
pub mod fake_claude;
pub mod normalize;
pub mod record;
pub mod releases;
pub mod scenario;
pub mod server;
pub mod timeouts;

pub use record::{RecordOptions, Recording, record};
pub use scenario::Scenario;
pub use server::FakeModelServer;

/// Errors of the test kit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("scenario {name}: {message}")]
    Scenario { name: String, message: String },
    #[error("release {version}: {message}")]
    Release { version: String, message: String },
    #[error("fake model server: {0}")]
    Server(String),
    #[error("cli: {0}")]
    Cli(String),
    #[error("scenario {scenario} on {release}: {message}")]
    Driver {
        scenario: String,
        release: String,
        message: String,
    },
    #[error("recording: {0}")]
    Recording(String),
    #[error("contract mismatch for {what}:\n{diff}")]
    ContractMismatch { what: String, diff: String },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| here.to_path_buf())
}
