//! ostler-supervisor: turns a `claude` binary into a well-behaved, observable session
//! process.
//!
//! - [`discover()`]: find the binary, read `claude --version`, probe its flags and assess
//!   it against the embedded [`compat::matrix`] ([`CompatLevel`], [`Capabilities`]);
//!   [`DiscoverError::exit_code`] gives the daemon's exit codes (72 not found,
//!   78 unusable/incompatible); [`discovery_cache`] remembers what it measured on an
//!   unchanged binary across daemon starts.
//! - [`SessionProcess`]: one CLI process per session (stream-json over stdio), with an
//!   ordered writer, a framed/decoded reader, control requests in both directions, stop,
//!   crash and stall reporting.
//!
//! This is the only crate of the workspace that starts processes.
#![allow(clippy::disallowed_methods)] // the one crate allowed to spawn processes

pub mod cgroup;
mod child;
pub mod compat;
pub mod discover;
pub mod discovery_cache;
pub mod env;
mod installation;
pub mod options;
pub mod proctree;
pub mod session;

pub use compat::{
    Assessment, Capabilities, CapabilitySource, CompatLevel, Degradation, Flag, FlagProbe, SdkUrl,
};
pub use discover::{
    CacheUpdate, DiscoverError, DiscoverOptions, discover, discover_deferring_cache,
};
pub use installation::Installation;
pub use options::{
    CliOptions, InvalidOption, McpServer, McpToolPolicy, McpTuning, ToolDecl, ToolServerDecl,
};
pub use ostler_protocol::version::{
    ClaudeVersion, VersionParseError, parse as parse_version_output,
};
pub use session::{
    ControlError, Error, ExitInfo, InitializeAnswer, Line, NO_DECISION, ProcessEvent, Responder,
    Result, SessionProcess, SpawnOptions, SupervisorOptions, WriteAck,
};
