//! ostler-engine: the session engine.
//!
//! - [`Engine`]: a cheap, cloneable handle on the registry of sessions. One actor task per
//!   live session owns the CLI process (through ostler-supervisor), its decoder output and
//!   its permission state.
//! - Every event is appended to the store (ostler-store) and committed **before** it is
//!   published to subscribers ("persist before publish"); seqs are the store's, gap-free
//!   from 1 per session.
//! - [`Engine::subscribe`] replays from the store and then follows the live broadcast,
//!   de-duplicating by seq; a subscriber that lags behind the live buffer continues from
//!   the store (never dropped, never slowing anyone).
//! - [`permission`]: the pure permission engine (rules, deny wins) and answer validation.
//!
//! Errors map one-to-one onto gRPC codes through [`Error::code_kind`].

pub mod error;
pub mod permission;
pub mod settled;
pub mod types;

mod actor;
mod blocking;
mod capability;
mod counts;
mod engine;
mod feed;
mod handle;
mod hub;
mod metrics;
mod runtime;
mod shared;
mod subscribe;

pub use capability::{CONTEXT_LOST, ResumeOptions};
pub use engine::{
    DEBUG_MAX_BYTES_DEFAULT, DEBUG_READ_DEFAULT, DEBUG_READ_MAX, DebugLogChunk, Engine,
    EngineOptions, FIRST_PROMPT_ID, RESERVED_MESSAGE_ID_PREFIX, Subscription,
};
pub use error::{CodeKind, Error, Result};
pub use feed::{FeedItem, FeedWatch, WatchRequest};
pub use ostler_protocol::outbound::{Delivery, Priority};
pub use permission::{PermissionRule, RuleAction};
pub use runtime::{
    Account, INITIALIZE_FAILED, Initialized, ModelChoice, SESSION_INITIALIZED, SessionDetails,
    SlashCommand,
};
pub use types::*;
