//! ostler-protocol: the Claude Code CLI's NDJSON dialects, translated into one canonical
//! event model. No I/O: bytes in, events out; commands in, bytes out.
//!
//! - [`argv`]: the stream-json command line ([`argv::StreamJsonArgs`]).
//! - [`version`]: `claude --version` parsing ([`version::parse`]).
//! - [`exit`]: how a CLI process ended ([`ExitFacts`]), the one shape the supervisor, the
//!   store and the engine nest.
//! - [`framing`]: bytes -> lines (byte-level `\n` split, `\r\n` tolerated, per-line cap).
//! - [`model`]: the canonical event model (the daemon's language).
//! - [`decode`]: a stateful per-session [`decode::Decoder`] using the versioned adapter
//!   chosen for the CLI release (see [`adapter`]).
//! - [`outbound`]: messages ostler writes to the CLI's stdin.
//! - [`hooks`]: remote hooks (issue 11): registrations, hook calls, answers.
//! - [`recording`]: reader for contract recordings (header + `cli`/`ostler` envelopes).
//! - [`transcript`]: whole-stream decoding (raw NDJSON or a recording) shared by
//!   `ostler decode`, `cargo xtask contracts bless` and the contract tests.
//! - [`contract`]: the contract checks applied to every recording.
//!
//! See `decode.rs` for the assistant-block de-duplication keying and `adapter.rs` for how
//! an adapter is selected from the CLI release.

pub mod adapter;
pub mod argv;
pub mod contract;
pub mod decode;
mod detail;
pub mod exit;
pub mod framing;
pub mod hooks;
pub mod junk;
pub mod model;
pub mod outbound;
mod rawjson;
pub mod recording;
mod scan;
pub mod sdk_mcp;
pub mod transcript;
pub mod version;
mod wire;

pub use decode::{DecodedLine, Decoder, is_interruption_marker};
pub use detail::{has_detail, notice_detail};
pub use exit::ExitFacts;
pub use framing::{DEFAULT_MAX_PAYLOAD_BYTES, Frame, FramerOptions, LineFramer};
pub use model::*;
pub use outbound::Outbound;
pub use rawjson::{MAX_READ_DEPTH, from_slice_any_depth, nesting_depth};
