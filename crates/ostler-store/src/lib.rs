//! ostler-store: durable SQLite persistence for ostler.
//!
//! Keeps everything a client may ask for again: sessions, each session's full ordered event
//! log, pending and decided interactions (permission requests and questions), and usage.
//! See `README.md` in this crate for the design and the durability promise.

mod codec;
mod connection;
mod error;
mod feed;
mod health;
pub mod migrate;
mod ops;
mod read;
mod rows;
mod store;
mod types;
mod writer;

pub use connection::Inspection;
pub use error::{Error, Result};
pub use feed::{
    FeedEntry, FeedKind, FeedPage, FeedPruned, MAX_TITLE_CHARS, SESSION_DELETED_NOTICE,
    shorten_title,
};
pub use health::{WriteFault, WriteHealth};
pub use migrate::SCHEMA_VERSION;
pub use store::{Store, Ticket};
pub use types::*;

/// The payload codec's entry points, for the `codec` benchmark only (not an API).
#[doc(hidden)]
pub mod bench_support {
    /// Encodes an event with `payload` and `raw` as the store would (the payload against
    /// the line, the line against the dictionary): the stored bytes of both columns.
    pub fn encoded_len(payload: &[u8], raw: &[u8]) -> usize {
        let ev = crate::codec::EncodedEvent::new(crate::NewEvent {
            kind: std::borrow::Cow::Borrowed("bench"),
            ts_ms: 0,
            payload: bytes::Bytes::copy_from_slice(payload),
            raw: Some(bytes::Bytes::copy_from_slice(raw)),
        });
        ev.payload.len() + ev.raw.map_or(0, |r| r.len())
    }
}

/// The WAL's hard bound, in frames (pages): past it the writer checkpoints itself before
/// the next group, so the WAL restarts; below it checkpoints run on the checkpointer thread
/// only. See `README.md`, "Checkpoints".
pub const WAL_BOUND_FRAMES: u64 = writer::WAL_HARD_LIMIT_FRAMES;
