//! Whether the store can write: set by the writer thread when a write transaction fails for
//! a reason outside the request (disk full, read-only or vanished files, I/O errors, a lock
//! held elsewhere) and cleared by the next commit that succeeds. Readers of the state (health
//! checks, the API's front door) never touch the database.

use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The store's ability to write, as last seen by its writer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WriteHealth {
    /// The last write transaction committed (or none was tried yet).
    #[default]
    Writable,
    /// The last write transaction failed for a storage reason; the writer retries it (with
    /// backoff) until it commits or `StoreOptions::write_retry_limit` has passed since the
    /// fault began, and probes the database while idle until a write works again.
    Unwritable(WriteFault),
}

impl WriteHealth {
    /// `true` while writes work.
    pub fn is_writable(&self) -> bool {
        matches!(self, WriteHealth::Writable)
    }

    /// The fault, while there is one.
    pub fn fault(&self) -> Option<&WriteFault> {
        match self {
            WriteHealth::Writable => None,
            WriteHealth::Unwritable(f) => Some(f),
        }
    }
}

/// A storage fault seen by the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFault {
    /// What SQLite reported, e.g. `database or disk is full`.
    pub reason: String,
    /// When the fault began (the first failed attempt).
    pub since: Instant,
    /// `true` once the retry limit has passed: queued writes now fail with
    /// [`crate::Error::Unwritable`] instead of waiting.
    pub given_up: bool,
}

/// The writer's side: the one owner of the state.
pub(crate) struct HealthCell {
    tx: watch::Sender<WriteHealth>,
    /// The store is closing: a fault is given up at once instead of retried until the
    /// limit (nothing will come back for those writes, and the daemon has to exit).
    closing: std::sync::atomic::AtomicBool,
}

impl HealthCell {
    pub(crate) fn new() -> Self {
        Self {
            tx: watch::Sender::new(WriteHealth::Writable),
            closing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The store is closing: from now on a write fault is given up at once.
    pub(crate) fn closing(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<WriteHealth> {
        self.tx.subscribe()
    }

    pub(crate) fn current(&self) -> WriteHealth {
        self.tx.borrow().clone()
    }

    /// A write attempt failed with `reason`; returns the fault (its start is kept when the
    /// store was already faulty).
    pub(crate) fn failed(&self, reason: String, limit: Duration) -> WriteFault {
        let now = Instant::now();
        let closing = self.closing.load(std::sync::atomic::Ordering::SeqCst);
        let mut out = None;
        self.tx.send_if_modified(|h| {
            let (since, was_given_up) = match h {
                WriteHealth::Unwritable(f) => (f.since, f.given_up),
                WriteHealth::Writable => (now, false),
            };
            let fault = WriteFault {
                reason,
                since,
                given_up: was_given_up || closing || now.duration_since(since) >= limit,
            };
            let changed = h.fault() != Some(&fault);
            if changed {
                if h.is_writable() {
                    tracing::error!(reason = %fault.reason, "store not writable: retrying writes");
                } else if fault.given_up && !was_given_up {
                    tracing::error!(reason = %fault.reason, limit = ?limit, closing, "store still not writable: failing queued writes");
                }
                *h = WriteHealth::Unwritable(fault.clone());
            }
            out = Some(fault);
            changed
        });
        // `send_if_modified` always runs the closure.
        out.unwrap_or_else(|| WriteFault {
            reason: String::new(),
            since: now,
            given_up: false,
        })
    }

    /// A write transaction committed.
    pub(crate) fn committed(&self) {
        self.tx.send_if_modified(|h| {
            if let WriteHealth::Unwritable(f) = h {
                tracing::info!(down_for = ?f.since.elapsed(), "store writable again");
                *h = WriteHealth::Writable;
                true
            } else {
                false
            }
        });
    }
}

/// Whether an SQLite error is a fault of the storage (worth retrying the same transaction
/// later) rather than of the request.
pub(crate) fn is_storage_fault(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    matches!(
        e.sqlite_error_code(),
        Some(
            C::DiskFull
                | C::SystemIoFailure
                | C::ReadOnly
                | C::CannotOpen
                | C::DatabaseBusy
                | C::DatabaseLocked
                | C::PermissionDenied
                | C::FileLockingProtocolFailed
        )
    )
}
