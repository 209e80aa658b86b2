//! The [`Store`] handle: opening, the write API (operations in `ops.rs`, queued to the
//! writer thread in `writer.rs`) and the read API (the pool in `read.rs`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::codec::EncodedEvent;
use crate::connection::{open_error, open_flags_rw, open_write_connection};
use crate::error::{Error, Result};
use crate::health::{HealthCell, WriteHealth};
use crate::migrate::{self, SCHEMA_VERSION};
use crate::ops;
use crate::read::ReadPool;
use crate::types::*;
use crate::writer::{self, Ctx, Writer};

/// A cheap, cloneable handle on one open store. All clones share the writer thread and the
/// read pool; the writer stops (after finishing what was queued) when the last clone is
/// dropped.
///
/// Write methods return a [`Ticket`] at once: the request is queued when the method is
/// called (so two writes issued one after the other by the same caller are applied in that
/// order, even if neither is awaited yet), and the ticket resolves only after the
/// transaction containing the write has committed.
///
/// Read methods are synchronous and short; from async code call them inside
/// `tokio::task::spawn_blocking` (or accept the brief block for small reads).
///
/// Open one `Store` per database file: the writer keeps the last seq of each session in
/// memory and assumes it is the only writer.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The writer's queue and lock (closed on drop; `None` only while dropping).
    writes: Option<Arc<writer::Shared>>,
    writer: Option<JoinHandle<()>>,
    checkpointer: Option<JoinHandle<()>>,
    /// For [`Store::wait_checkpointed`]; dropped before the checkpointer thread is joined.
    checkpoint: Option<writer::Checkpointer>,
    readers: ReadPool,
    health: Arc<HealthCell>,
    feed: tokio::sync::watch::Receiver<u64>,
    /// The highest feed cursor pruned ([`Store::feed_pruned_to`]), published by the writer.
    feed_pruned: tokio::sync::watch::Receiver<u64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Idle readers go first, so that the writer's final checkpoint can empty the WAL.
        self.readers.close_idle();
        // Closing the queue lets the writer finish it and exit.
        if let Some(writes) = &self.writes {
            writes.close();
        }
        if let Some(handle) = self.writer.take()
            && handle.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "store writer thread panicked");
        }
        // The writer thread's share is gone with it: this closes the write connection and
        // drops the writer's handle on the checkpointer.
        drop(self.writes.take());
        // The writer held the checkpointer's channel, and so did this: with both gone the
        // checkpointer stops too (or is stopping).
        drop(self.checkpoint.take());
        if let Some(handle) = self.checkpointer.take()
            && handle.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "store checkpointer thread panicked");
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// Resolves to the result of a write once its transaction has committed (or failed).
///
/// Await it from async code, or call [`Ticket::wait`] from a plain thread. Dropping a
/// ticket does not cancel the write.
#[must_use = "a ticket resolves when the write is committed; dropping it does not cancel the write"]
#[derive(Debug)]
pub struct Ticket<T> {
    rx: oneshot::Receiver<writer::Reply<T>>,
}

impl<T> Ticket<T> {
    fn ready(result: Result<T>) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(writer::Reply {
            result,
            _leftover: None,
        });
        Self { rx }
    }

    /// The result if the write has already committed (or failed), without waiting. After
    /// `Some`, the ticket is spent: do not await it.
    pub fn try_take(&mut self) -> Option<Result<T>> {
        match self.rx.try_recv() {
            Ok(reply) => Some(reply.result),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(Error::Closed)),
        }
    }

    /// Blocks the current thread until the write has committed.
    ///
    /// # Panics
    /// When called from within an asynchronous (tokio) execution context; await the ticket
    /// there instead.
    pub fn wait(self) -> Result<T> {
        // The request's data (see `writer::Reply`) is freed here, on the caller's thread.
        self.rx
            .blocking_recv()
            .map_or(Err(Error::Closed), |reply| reply.result)
    }
}

impl<T> Future for Ticket<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        // The request's data (see `writer::Reply`) is freed here, on the caller's thread.
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.map_or(Err(Error::Closed), |reply| reply.result))
    }
}

fn open_checkpointer(
    path: &Path,
    opts: &StoreOptions,
) -> Result<(writer::CheckpointNudge, JoinHandle<()>)> {
    let oe = |e| open_error(path, e);
    let conn = Connection::open_with_flags(path, open_flags_rw()).map_err(oe)?;
    conn.busy_timeout(opts.busy_timeout).map_err(oe)?;
    conn.pragma_update(None, "synchronous", opts.synchronous.pragma_value())
        .map_err(oe)?;
    let write_back = opts.synchronous == Synchronous::Normal;
    let sync_within = opts.sync_within.filter(|_| write_back);
    writer::spawn_checkpointer(conn, path.to_path_buf(), write_back, sync_within).map_err(
        |source| Error::Io {
            path: path.to_path_buf(),
            source,
        },
    )
}

impl Store {
    /// What opening the store at `path` would find, without opening it for writing or
    /// changing anything (`ostler doctor`): the errors [`Store::open`] would give for the
    /// files, a database that is not ostler's, newer than this build or not writable, and
    /// otherwise its schema version (`None`: no store yet).
    pub fn inspect(path: impl AsRef<Path>) -> Result<crate::Inspection> {
        crate::connection::inspect(path.as_ref())
    }

    /// Opens (creating if needed) the store at `path`, applies pending migrations and starts
    /// the writer thread.
    ///
    /// Errors: [`Error::NewerSchema`] for a database written by a newer ostler,
    /// [`Error::Corrupt`] for a file that is not (or no longer) a database, [`Error::Open`]
    /// when the file cannot be opened at all; each names the path.
    pub fn open(path: impl AsRef<Path>, opts: StoreOptions) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        if opts.max_batch == 0 {
            return Err(Error::InvalidArgument(
                "max_batch must be at least 1".into(),
            ));
        }
        let mut conn = open_write_connection(&path, &opts)?;
        migrate::migrate_to(&mut conn, &path, SCHEMA_VERSION)?;

        let readers = ReadPool::new(path.clone(), &opts);
        // Open one reader now so that a store that cannot be read fails here.
        readers.with(|_| Ok(()))?;
        // Open: the last close checkpoints again (see `open_write_connection`).
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            false,
        )
        .map_err(|e| Error::sqlite_at(&path, e))?;

        // Checkpoints run on their own thread and connection, off the commit path. If that
        // cannot be set up, SQLite's automatic checkpoints (inside commits) stay on.
        let (checkpoint, checkpointer) = match open_checkpointer(&path, &opts) {
            // The writer installs a WAL hook, which turns SQLite's own checkpoints off.
            Ok((nudge, handle)) => (Some(nudge), Some(handle)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "no checkpointer thread; checkpoints run inside commits");
                (None, None)
            }
        };

        let checkpoint_handle = checkpoint.as_ref().map(writer::CheckpointNudge::handle);
        let health = Arc::new(HealthCell::new());
        let writer = Writer::new(
            conn,
            path.clone(),
            opts.max_batch,
            checkpoint,
            Arc::clone(&health),
            opts.write_retry_limit,
        );
        let feed = writer.feed_watch();
        let feed_pruned = writer.feed_pruned_watch();
        // Commits on a caller's thread only where a commit does not fsync (but the one that
        // restarts the WAL, which syncs its new header: a small write, see `writer`).
        let writes = writer::Shared::new(
            writer,
            opts.synchronous == Synchronous::Normal,
            opts.busy_timeout,
        );
        let thread_writes = Arc::clone(&writes);
        let handle = std::thread::Builder::new()
            .name("ostler-store-writer".into())
            .spawn(move || thread_writes.run())
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        tracing::debug!(path = %path.display(), "store opened");
        Ok(Store {
            inner: Arc::new(Inner {
                path,
                writes: Some(writes),
                writer: Some(handle),
                checkpointer,
                checkpoint: checkpoint_handle,
                readers,
                health,
                feed,
                feed_pruned,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether writes work, as last seen by the writer (no I/O).
    pub fn write_health(&self) -> WriteHealth {
        self.inner.health.current()
    }

    /// [`Store::write_health`] as a watch: changes the moment the writer sees a storage
    /// fault, and again when a write commits.
    pub fn watch_write_health(&self) -> tokio::sync::watch::Receiver<WriteHealth> {
        self.inner.health.subscribe()
    }

    pub(crate) fn readers(&self) -> &ReadPool {
        &self.inner.readers
    }

    pub(crate) fn feed_receiver(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.feed.clone()
    }

    pub(crate) fn feed_pruned_receiver(&self) -> &tokio::sync::watch::Receiver<u64> {
        &self.inner.feed_pruned
    }

    /// `op` may run more than once: a group that meets a storage fault is rolled back and
    /// run again.
    pub(crate) fn submit<T, F>(&self, op: F) -> Ticket<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_>) -> Result<T> + Send + 'static,
    {
        self.submit_with(op, false)
    }

    /// [`Store::submit`]; `now`: commit on this thread if the writer is idle (see
    /// `writer.rs`).
    fn submit_with<T, F>(&self, op: F, now: bool) -> Ticket<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Ctx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let cmd = writer::command(op, reply);
        let queued = match &self.inner.writes {
            Some(writes) if now => writes.submit_now(cmd),
            Some(writes) => writes.submit(cmd),
            None => Err(cmd),
        };
        match queued {
            Ok(()) => Ticket { rx },
            Err(_) => Ticket::ready(Err(Error::Closed)),
        }
    }

    // ------------------------------------------------------------------ writes

    /// Appends events to a session's log. Resolves, once committed, to the seqs assigned
    /// (consecutive, continuing the session's log without gaps).
    pub fn append(&self, session_id: &str, events: Vec<NewEvent>) -> Ticket<Vec<u64>> {
        self.append_events(session_id, events, false)
    }

    fn append_events(
        &self,
        session_id: &str,
        events: Vec<NewEvent>,
        now: bool,
    ) -> Ticket<Vec<u64>> {
        let sid = session_id.to_owned();
        let events: Vec<EncodedEvent> = events.into_iter().map(EncodedEvent::new).collect();
        self.submit_with(move |ctx| ops::append_op(ctx, &sid, &events), now)
    }

    /// [`Store::append`] for a caller with nothing else to do until the commit: when the
    /// writer is idle (nothing queued or committing, the store writable,
    /// [`Synchronous::Normal`]) the commit runs on the calling thread, and the ticket is
    /// resolved on return; otherwise the append is queued as by [`Store::append`]. It saves
    /// the hand-offs to the writer thread and back, and blocks the caller for one commit
    /// (tens of microseconds for a few events): do not use it for large batches. Order
    /// with the caller's earlier writes is kept either way.
    pub fn append_now(&self, session_id: &str, events: Vec<NewEvent>) -> Ticket<Vec<u64>> {
        self.append_events(session_id, events, true)
    }

    /// [`Store::append`] for plain threads: blocks until committed.
    ///
    /// # Panics
    /// When called from within a tokio execution context (await [`Store::append`] there).
    pub fn append_blocking(&self, session_id: &str, events: Vec<NewEvent>) -> Result<Vec<u64>> {
        self.append(session_id, events).wait()
    }

    /// Creates a session. [`Error::AlreadyExists`] if the id is taken.
    pub fn create_session(&self, session: NewSession) -> Ticket<()> {
        self.submit(move |ctx| ops::create_session_op(ctx, &session))
    }

    /// Changes a session. [`Error::NotFound`] if there is no such session.
    pub fn update_session(&self, session_id: &str, patch: SessionPatch) -> Ticket<()> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| ops::update_session_op(ctx, &sid, &patch))
    }

    /// Deletes a session with its events, interactions and usage, and gives the freed pages
    /// back to the file system (incremental vacuum; the file shrinks at the next WAL
    /// checkpoint). [`Error::NotFound`] if there is no such session.
    ///
    /// Its feed rows go too; in their place the feed gets one [`FeedKind::SessionDeleted`]
    /// entry (with the session's title, cwd, state and labels as they were), committed with
    /// the deletion.
    ///
    /// [`FeedKind::SessionDeleted`]: crate::FeedKind::SessionDeleted
    pub fn delete_session(&self, session_id: &str) -> Ticket<()> {
        let deleted_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.delete_session_at(session_id, deleted_ms)
    }

    /// [`Store::delete_session`] with the deletion's time given (milliseconds since the Unix
    /// epoch): the age [`Store::prune_feed_deletions`] measures its feed entry by.
    pub fn delete_session_at(&self, session_id: &str, deleted_ms: i64) -> Ticket<()> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| ops::delete_session_op(ctx, &sid, deleted_ms))
    }

    /// Changes a session's title, labels and archived mark (a client's UpdateSession) and
    /// records what changed: the event `notice` builds from the [`MetaChange`] is appended
    /// to the session's log, with a [`FeedKind::SessionUpdated`] feed entry, in the same
    /// transaction. When nothing would change (same title, labels already so, the mark
    /// already set) nothing is written and the result's `seq` is `None`.
    /// [`Error::NotFound`] if there is no such session.
    ///
    /// [`FeedKind::SessionUpdated`]: crate::FeedKind::SessionUpdated
    /// [`Error::NotFound`]: crate::Error::NotFound
    pub fn update_meta(
        &self,
        session_id: &str,
        patch: MetaPatch,
        notice: MetaNotice,
    ) -> Ticket<MetaUpdated> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| ops::update_meta_op(ctx, &sid, &patch, &notice))
    }

    /// Whether a session is archived. [`Error::NotFound`] if there is no such session.
    ///
    /// [`Error::NotFound`]: crate::Error::NotFound
    pub fn archived(&self, session_id: &str) -> Result<bool> {
        self.readers().with(|conn| {
            use rusqlite::OptionalExtension as _;
            conn.prepare_cached("SELECT archived FROM sessions WHERE id = ?1")?
                .query_row([session_id], |r| r.get::<_, i64>(0))
                .optional()?
                .map(|a| a != 0)
                .ok_or_else(|| crate::error::not_found_session(session_id))
        })
    }

    /// Records a permission request or question as pending. If it is already recorded and
    /// still pending, its details are refreshed; if it was already decided it is left as
    /// is. Resolves to the interaction as stored.
    pub fn upsert_interaction(&self, interaction: NewInteraction) -> Ticket<Interaction> {
        self.submit(move |ctx| ops::upsert_interaction_op(ctx, &interaction))
    }

    /// Decides a pending interaction, atomically: only the first decision wins. Resolves to
    /// [`DecideOutcome::Decided`] for the winner and [`DecideOutcome::AlreadyDecided`]
    /// (naming who decided, and how) for everyone after.
    pub fn decide_interaction(
        &self,
        session_id: &str,
        request_id: &str,
        decision: Decision,
    ) -> Ticket<DecideOutcome> {
        let sid = session_id.to_owned();
        let rid = request_id.to_owned();
        self.submit(move |ctx| ops::decide_op(ctx, &sid, &rid, &decision))
    }

    /// Appends events to a session's log together with the writes that belong to them (a
    /// decision and its resolution event, a request event and its pending interaction, a
    /// state event and the session's state): one transaction, so a crash never leaves one
    /// without the other. A decision that lost (already decided) writes nothing.
    pub fn append_with(
        &self,
        session_id: &str,
        events: Vec<NewEvent>,
        with: WithEvents,
    ) -> Ticket<AppendedWith> {
        let sid = session_id.to_owned();
        let events: Vec<EncodedEvent> = events.into_iter().map(EncodedEvent::new).collect();
        self.submit(move |ctx| ops::append_with_op(ctx, &sid, &events, &with))
    }

    /// Closes every pending interaction of one session (or of all sessions, with `None`) as
    /// `Expired` or `Cancelled`, e.g. when a session ends or at daemon start. Resolves to
    /// the interactions closed.
    pub fn close_pending_interactions(
        &self,
        session_id: Option<&str>,
        decision: Decision,
    ) -> Ticket<Vec<Interaction>> {
        let sid = session_id.map(str::to_owned);
        self.submit(move |ctx| ops::close_pending_op(ctx, sid.as_deref(), &decision))
    }

    /// Records one turn's usage and adds it to the session's totals (same transaction).
    /// Resolves to the turn number (1, 2, 3, ... per session).
    pub fn record_turn_usage(&self, session_id: &str, turn: TurnUsage) -> Ticket<u64> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| ops::record_turn_op(ctx, &sid, &turn))
    }

    // ------------------------------------------------------------------ reads

    /// Runs synchronous store calls (reads, or `Ticket::wait`) on tokio's blocking pool, for
    /// async callers: `store.blocking(move |s| s.events_after(&id, 0, 1000)).await`.
    /// Must be called from within a tokio runtime.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|_| Error::Closed)?
    }

    /// Up to `limit` events of a session with `seq > after_seq`, in seq order. Each call is
    /// one consistent snapshot: it returns a gap-free run starting at `after_seq + 1` (or
    /// nothing if there is nothing newer). [`Error::NotFound`] if there is no such session.
    pub fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        self.events_after_within(session_id, after_seq, limit, usize::MAX)
    }

    /// The owner is shutting down: from now on a write that meets a storage fault fails at
    /// once instead of being retried for `write_retry_secs` (healthy writes go on as
    /// before). Dropping the last handle does the same.
    pub fn closing(&self) {
        self.inner.health.closing();
    }

    /// [`Store::events_after`] that also ends (after at least one event) once the events'
    /// payloads and raw lines come to `max_bytes`: a page of a reader that holds it in
    /// memory, whatever the size of the events.
    pub fn events_after_within(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredEvent>> {
        self.inner
            .readers
            .events_after(session_id, after_seq, limit, max_bytes)
    }

    /// Up to `limit` events of a session whose kind is one of `kinds` and whose
    /// `seq < before_seq`, newest first (`u64::MAX`: from the end). Only those rows are
    /// read: a reader that needs a few kinds of a long log pays for those, not for the
    /// log. [`Error::NotFound`] if there is no such session.
    pub fn events_of_kinds_before(
        &self,
        session_id: &str,
        kinds: &[&str],
        before_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        self.inner
            .readers
            .events_of_kinds_before(session_id, kinds, before_seq, limit)
    }

    /// Asks the checkpointer thread to copy the WAL into the database file and waits (this
    /// thread) until a pass that started after this call has left every WAL frame in the
    /// database: `true`; `false` if that did not happen within `timeout` (appends kept
    /// arriving, or a long read pins old frames) or there is no checkpointer thread. The WAL
    /// then restarts from its beginning at the next commit. For tests, tools and shutdown
    /// paths; the store checkpoints on its own.
    pub fn wait_checkpointed(&self, timeout: std::time::Duration) -> bool {
        self.inner
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.caught_up(timeout))
    }

    /// A cheap read that shows whether the store answers (for health checks).
    pub fn probe(&self) -> Result<()> {
        self.inner.readers.with(|conn| {
            let mut stmt = conn.prepare_cached("SELECT 1 FROM sessions LIMIT 1")?;
            let mut rows = stmt.query([])?;
            rows.next()?;
            Ok(())
        })
    }

    /// The seq of a session's last committed event (0 if none).
    pub fn last_seq(&self, session_id: &str) -> Result<u64> {
        self.inner.readers.last_seq(session_id)
    }

    /// One session. [`Error::NotFound`] if there is no such session.
    pub fn get_session(&self, session_id: &str) -> Result<SessionRecord> {
        self.inner.readers.get_session(session_id)
    }

    /// Sessions matching `filter`, oldest first, `limit` per page (at least 1). Pass the
    /// previous page's `next_page_token` to continue.
    pub fn list_sessions(
        &self,
        filter: &SessionFilter,
        page_token: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage> {
        self.inner.readers.list_sessions(filter, page_token, limit)
    }

    /// Pending interactions of one session, or of all sessions with `None`, oldest first.
    pub fn pending_interactions(&self, session_id: Option<&str>) -> Result<Vec<Interaction>> {
        self.inner.readers.pending_interactions(session_id)
    }

    /// What `request_id` names, in one session (`Some`) or in any: the exact id, else the
    /// one id it is a prefix of (a range scan over an index, however many interactions the
    /// store holds). [`Error::NotFound`] for an unknown session; [`Error::InvalidArgument`]
    /// for an empty id.
    pub fn lookup_interaction(
        &self,
        session_id: Option<&str>,
        request_id: &str,
    ) -> Result<InteractionLookup> {
        self.inner
            .readers
            .lookup_interaction(session_id, request_id)
    }

    /// One interaction. [`Error::NotFound`] if there is no such interaction.
    pub fn interaction(&self, session_id: &str, request_id: &str) -> Result<Interaction> {
        self.inner.readers.interaction(session_id, request_id)
    }

    /// A session's usage: totals and every turn.
    pub fn usage(&self, session_id: &str) -> Result<SessionUsage> {
        self.inner.readers.usage(session_id)
    }
}
