//! The [`Store`] handle: opening, the write API (through the writer thread) and the read
//! API (through a small pool of read-only connections).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};
use tokio::sync::oneshot;

use crate::error::{Error, Result, is_corruption};
use crate::migrate::{self, SCHEMA_VERSION};
use crate::rows::{self, u64_from_sql, u64_to_sql};
use crate::types::*;
use crate::writer::{self, Command, Ctx, Slot, Writer, not_found_session};

pub(crate) fn seq_from_sql(v: i64) -> Result<u64> {
    u64_from_sql(v, "seq")
}

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
    tx: Option<Sender<Command>>,
    writer: Option<JoinHandle<()>>,
    checkpointer: Option<JoinHandle<()>>,
    readers: ReadPool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Idle readers go first, so that the writer's final checkpoint can empty the WAL.
        self.readers
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // Closing the channel lets the writer finish the queue and exit.
        drop(self.tx.take());
        if let Some(handle) = self.writer.take()
            && handle.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "store writer thread panicked");
        }
        // The writer held the checkpointer's channel: it has stopped too (or is stopping).
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
    rx: oneshot::Receiver<Result<T>>,
}

impl<T> Ticket<T> {
    fn ready(result: Result<T>) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(result);
        Self { rx }
    }

    /// Blocks the current thread until the write has committed.
    ///
    /// # Panics
    /// When called from within an asynchronous (tokio) execution context; await the ticket
    /// there instead.
    pub fn wait(self) -> Result<T> {
        self.rx.blocking_recv().unwrap_or(Err(Error::Closed))
    }
}

impl<T> Future for Ticket<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Closed)))
    }
}

fn open_flags_rw() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI
}

fn open_flags_ro() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI
}

/// Maps an error met while opening: damaged/not-a-database → `Corrupt`, else → `Open`.
fn open_error(path: &Path, e: rusqlite::Error) -> Error {
    if is_corruption(&e) {
        Error::Corrupt {
            path: path.to_path_buf(),
            source: e,
        }
    } else {
        Error::Open {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

/// Opens and configures the write connection (WAL, synchronous, busy timeout, foreign keys,
/// incremental auto-vacuum for new files). Does not migrate.
pub(crate) fn open_write_connection(path: &Path, opts: &StoreOptions) -> Result<Connection> {
    let oe = |e| open_error(path, e);
    let conn = Connection::open_with_flags(path, open_flags_rw()).map_err(oe)?;
    conn.busy_timeout(opts.busy_timeout).map_err(oe)?;
    // The writer reuses a couple of dozen statements; keep all of them prepared.
    conn.set_prepared_statement_cache_capacity(64);
    // The first read of the schema is where SQLite notices a file that is not a database.
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(oe)?;
    if tables == 0 {
        // Only possible before the first table exists: lets deletes give space back to the
        // file system with `PRAGMA incremental_vacuum`.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(oe)?;
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(oe)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Setup {
            path: path.to_path_buf(),
            reason: format!("WAL journal mode refused (journal_mode is {mode:?})"),
        });
    }
    conn.pragma_update(None, "synchronous", opts.synchronous.pragma_value())
        .map_err(oe)?;
    // After a checkpoint, truncate a WAL that grew large (e.g. while a long read pinned an
    // old snapshot) instead of keeping its high-water size forever.
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
        .map_err(oe)?;
    conn.pragma_update(None, "foreign_keys", true).map_err(oe)?;
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .map_err(oe)?;
    if !fk {
        return Err(Error::Setup {
            path: path.to_path_buf(),
            reason: "foreign keys cannot be enabled".into(),
        });
    }
    Ok(conn)
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
    writer::spawn_checkpointer(conn, path.to_path_buf()).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl Store {
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

        let readers = ReadPool {
            path: path.clone(),
            idle: Mutex::new(Vec::new()),
            max_idle: opts.read_pool_size,
            busy_timeout: opts.busy_timeout,
        };
        // Open one reader now so that a store that cannot be read fails here.
        readers.with(|_| Ok(()))?;

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

        let (tx, rx) = std::sync::mpsc::channel();
        let writer = Writer::new(conn, path.clone(), opts.max_batch, checkpoint);
        let handle = std::thread::Builder::new()
            .name("ostler-store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        tracing::debug!(path = %path.display(), "store opened");
        Ok(Store {
            inner: Arc::new(Inner {
                path,
                tx: Some(tx),
                writer: Some(handle),
                checkpointer,
                readers,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn submit<T, F>(&self, op: F) -> Ticket<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ctx<'_>) -> Result<T> + Send + 'static,
    {
        let Some(tx) = &self.inner.tx else {
            return Ticket::ready(Err(Error::Closed));
        };
        let (reply, rx) = oneshot::channel();
        match tx.send(writer::command(op, reply)) {
            Ok(()) => Ticket { rx },
            Err(_) => Ticket::ready(Err(Error::Closed)),
        }
    }

    // ------------------------------------------------------------------ writes

    /// Appends events to a session's log. Resolves, once committed, to the seqs assigned
    /// (consecutive, continuing the session's log without gaps).
    pub fn append(&self, session_id: &str, events: Vec<NewEvent>) -> Ticket<Vec<u64>> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| append_op(ctx, &sid, &events))
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
        self.submit(move |ctx| create_session_op(ctx, &session))
    }

    /// Changes a session. [`Error::NotFound`] if there is no such session.
    pub fn update_session(&self, session_id: &str, patch: SessionPatch) -> Ticket<()> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| update_session_op(ctx, &sid, &patch))
    }

    /// Deletes a session with its events, interactions and usage, and gives the freed pages
    /// back to the file system (incremental vacuum; the file shrinks at the next WAL
    /// checkpoint). [`Error::NotFound`] if there is no such session.
    pub fn delete_session(&self, session_id: &str) -> Ticket<()> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| delete_session_op(ctx, &sid))
    }

    /// Records a permission request or question as pending. If it is already recorded and
    /// still pending, its details are refreshed; if it was already decided it is left as
    /// is. Resolves to the interaction as stored.
    pub fn upsert_interaction(&self, interaction: NewInteraction) -> Ticket<Interaction> {
        self.submit(move |ctx| upsert_interaction_op(ctx, &interaction))
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
        self.submit(move |ctx| decide_op(ctx, &sid, &rid, &decision))
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
        self.submit(move |ctx| append_with_op(ctx, &sid, &events, &with))
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
        self.submit(move |ctx| close_pending_op(ctx, sid.as_deref(), &decision))
    }

    /// Records one turn's usage and adds it to the session's totals (same transaction).
    /// Resolves to the turn number (1, 2, 3, ... per session).
    pub fn record_turn_usage(&self, session_id: &str, turn: TurnUsage) -> Ticket<u64> {
        let sid = session_id.to_owned();
        self.submit(move |ctx| record_turn_op(ctx, &sid, &turn))
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
        self.inner.readers.with(|conn| {
            let events = rows::events_after(conn, session_id, after_seq, limit)?;
            if events.is_empty() && rows::session_pk(conn, session_id)?.is_none() {
                return Err(not_found_session(session_id));
            }
            Ok(events)
        })
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
        self.inner.readers.with(|conn| {
            let v: Option<i64> = conn
                .prepare_cached(
                    "SELECT (SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_pk = s.pk)
                     FROM sessions s WHERE s.id = ?1",
                )?
                .query_row([session_id], |r| r.get(0))
                .map(Some)
                .or_else(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => Ok(None),
                    e => Err(e),
                })?;
            seq_from_sql(v.ok_or_else(|| not_found_session(session_id))?)
        })
    }

    /// One session. [`Error::NotFound`] if there is no such session.
    pub fn get_session(&self, session_id: &str) -> Result<SessionRecord> {
        self.inner.readers.with(|conn| {
            rows::session(conn, session_id)?.ok_or_else(|| not_found_session(session_id))
        })
    }

    /// Sessions matching `filter`, oldest first, `limit` per page (at least 1). Pass the
    /// previous page's `next_page_token` to continue.
    pub fn list_sessions(
        &self,
        filter: &SessionFilter,
        page_token: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage> {
        let after = page_token.map(parse_page_token).transpose()?;
        let limit = limit.max(1);
        self.inner
            .readers
            .with(|conn| list_sessions(conn, filter, after.as_ref(), limit))
    }

    /// Pending interactions of one session, or of all sessions with `None`, oldest first.
    pub fn pending_interactions(&self, session_id: Option<&str>) -> Result<Vec<Interaction>> {
        self.inner.readers.with(|conn| {
            let pk = match session_id {
                None => None,
                Some(id) => Some(rows::session_pk(conn, id)?.ok_or_else(|| not_found_session(id))?),
            };
            rows::pending_interactions(conn, pk)
        })
    }

    /// One interaction. [`Error::NotFound`] if there is no such interaction.
    pub fn interaction(&self, session_id: &str, request_id: &str) -> Result<Interaction> {
        self.inner.readers.with(|conn| {
            rows::interaction_by_id(conn, session_id, request_id)?.ok_or_else(|| {
                Error::not_found(format!(
                    "interaction {request_id:?} of session {session_id:?}"
                ))
            })
        })
    }

    /// A session's usage: totals and every turn.
    pub fn usage(&self, session_id: &str) -> Result<SessionUsage> {
        self.inner.readers.with(|conn| {
            // One read transaction, so totals and turns agree.
            conn.execute_batch("BEGIN")?;
            let result = (|| {
                let record = rows::session(conn, session_id)?
                    .ok_or_else(|| not_found_session(session_id))?;
                let pk = rows::session_pk(conn, session_id)?
                    .ok_or_else(|| not_found_session(session_id))?;
                Ok(SessionUsage {
                    totals: record.usage,
                    turns: rows::turns(conn, pk)?,
                })
            })();
            conn.execute_batch("COMMIT")?;
            result
        })
    }
}

// ---------------------------------------------------------------------- read pool

struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
    busy_timeout: Duration,
}

impl ReadPool {
    fn open(&self) -> Result<Connection> {
        let oe = |e| open_error(&self.path, e);
        let conn = Connection::open_with_flags(&self.path, open_flags_ro()).map_err(oe)?;
        conn.busy_timeout(self.busy_timeout).map_err(oe)?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }

    /// Runs `f` on an idle read connection (opening one if none is idle).
    fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match pooled {
            Some(c) => c,
            None => self.open()?,
        };
        let result = f(&conn).map_err(|e| e.at(&self.path));
        // A connection left inside a transaction (an error mid-read) is not reused.
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < self.max_idle {
                idle.push(conn);
            }
        }
        result
    }
}

// ---------------------------------------------------------------------- list sessions

#[derive(Debug, Clone, PartialEq, Eq)]
struct PageKey {
    created_ms: i64,
    id: String,
}

fn parse_page_token(token: &str) -> Result<PageKey> {
    let bad = || Error::InvalidArgument(format!("invalid page token {token:?}"));
    let (ms, id) = token.split_once(':').ok_or_else(bad)?;
    Ok(PageKey {
        created_ms: ms.parse().map_err(|_| bad())?,
        id: id.to_owned(),
    })
}

fn page_token(r: &SessionRecord) -> String {
    format!("{}:{}", r.created_ms, r.id)
}

fn list_sessions(
    conn: &Connection,
    filter: &SessionFilter,
    after: Option<&PageKey>,
    limit: usize,
) -> Result<SessionPage> {
    use rusqlite::types::Value;
    let mut sql = format!(
        "SELECT {} FROM sessions s WHERE 1 = 1",
        rows::SESSION_COLUMNS
    );
    let mut args: Vec<Value> = Vec::new();
    if !filter.states.is_empty() {
        sql.push_str(" AND s.state IN (");
        for (i, state) in filter.states.iter().enumerate() {
            sql.push_str(if i == 0 { "?" } else { ", ?" });
            args.push(Value::Text(state.clone()));
        }
        sql.push(')');
    }
    for (key, value) in &filter.labels {
        sql.push_str(
            " AND EXISTS (SELECT 1 FROM session_labels l \
             WHERE l.session_pk = s.pk AND l.key = ? AND l.value = ?)",
        );
        args.push(Value::Text(key.clone()));
        args.push(Value::Text(value.clone()));
    }
    if let Some(from) = filter.created_from_ms {
        sql.push_str(" AND s.created_ms >= ?");
        args.push(Value::Integer(from));
    }
    if let Some(before) = filter.created_before_ms {
        sql.push_str(" AND s.created_ms < ?");
        args.push(Value::Integer(before));
    }
    if let Some(after) = after {
        sql.push_str(" AND (s.created_ms, s.id) > (?, ?)");
        args.push(Value::Integer(after.created_ms));
        args.push(Value::Text(after.id.clone()));
    }
    sql.push_str(" ORDER BY s.created_ms, s.id LIMIT ?");
    args.push(Value::Integer(
        i64::try_from(limit)
            .unwrap_or(i64::MAX - 1)
            .saturating_add(1),
    ));

    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let mut stmt = conn.prepare(&sql)?;
        let mut rows_ = stmt.query(rusqlite::params_from_iter(args.iter()))?;
        let mut sessions = Vec::new();
        let mut pks = Vec::new();
        while let Some(row) = rows_.next()? {
            let (pk, record) = rows::session_from_row(row)?;
            pks.push(pk);
            sessions.push(record);
        }
        let next_page_token = if sessions.len() > limit {
            sessions.truncate(limit);
            pks.truncate(limit);
            sessions.last().map(page_token)
        } else {
            None
        };
        for (record, pk) in sessions.iter_mut().zip(pks) {
            record.labels = rows::labels(conn, pk)?;
        }
        Ok(SessionPage {
            sessions,
            next_page_token,
        })
    })();
    conn.execute_batch("COMMIT")?;
    result
}

// ---------------------------------------------------------------------- write ops

fn append_op(ctx: &mut Ctx<'_>, session_id: &str, events: &[NewEvent]) -> Result<Vec<u64>> {
    let slot = ctx.slot(session_id)?;
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let conn = ctx.conn;
    let mut stmt = conn.prepare_cached(
        "INSERT INTO events (session_pk, seq, kind, payload, raw, ts_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut seqs = Vec::with_capacity(events.len());
    let mut seq = slot.last_seq;
    for ev in events {
        seq += 1;
        stmt.execute(params![
            slot.pk,
            u64_to_sql(seq, "seq")?,
            &*ev.kind,
            &ev.payload[..],
            ev.raw.as_deref(),
            ev.ts_ms
        ])?;
        seqs.push(seq);
    }
    ctx.set_slot(
        session_id,
        Some(Slot {
            pk: slot.pk,
            last_seq: seq,
        }),
    );
    Ok(seqs)
}

fn insert_labels(
    conn: &Connection,
    pk: i64,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO session_labels (session_pk, key, value) VALUES (?1, ?2, ?3)",
    )?;
    for (k, v) in labels {
        stmt.execute(params![pk, k, v])?;
    }
    Ok(())
}

fn create_session_op(ctx: &mut Ctx<'_>, s: &NewSession) -> Result<()> {
    if s.id.is_empty() {
        return Err(Error::InvalidArgument(
            "session id must not be empty".into(),
        ));
    }
    match ctx.slot(&s.id) {
        Ok(_) => {
            return Err(Error::AlreadyExists {
                what: format!("session {:?}", s.id),
            });
        }
        Err(Error::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let conn = ctx.conn;
    conn.prepare_cached(
        "INSERT INTO sessions (id, claude_session_id, cwd, model, permission_mode, cli_release,
                               state, created_ms, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
    )?
    .execute(params![
        s.id,
        s.claude_session_id,
        s.cwd,
        s.model,
        s.permission_mode,
        s.cli_release,
        s.state,
        s.created_ms
    ])?;
    let pk = conn.last_insert_rowid();
    insert_labels(conn, pk, &s.labels)?;
    ctx.set_slot(&s.id, Some(Slot { pk, last_seq: 0 }));
    Ok(())
}

fn update_session_op(ctx: &mut Ctx<'_>, session_id: &str, p: &SessionPatch) -> Result<()> {
    let slot = ctx.slot(session_id)?;
    let conn = ctx.conn;
    conn.prepare_cached(
        "UPDATE sessions SET
            claude_session_id = COALESCE(?2, claude_session_id),
            model = COALESCE(?3, model),
            permission_mode = COALESCE(?4, permission_mode),
            cli_release = COALESCE(?5, cli_release),
            state = COALESCE(?6, state),
            updated_ms = ?7
         WHERE pk = ?1",
    )?
    .execute(params![
        slot.pk,
        p.claude_session_id,
        p.model,
        p.permission_mode,
        p.cli_release,
        p.state,
        p.updated_ms
    ])?;
    if let Some(exit) = &p.exit {
        conn.prepare_cached(
            "UPDATE sessions SET exit_code = ?2, exit_signal = ?3, exit_reason = ?4, exited_ms = ?5
             WHERE pk = ?1",
        )?
        .execute(params![
            slot.pk,
            exit.code,
            exit.signal,
            exit.reason,
            exit.at_ms
        ])?;
    }
    if let Some(labels) = &p.labels {
        conn.prepare_cached("DELETE FROM session_labels WHERE session_pk = ?1")?
            .execute([slot.pk])?;
        insert_labels(conn, slot.pk, labels)?;
    }
    Ok(())
}

fn delete_session_op(ctx: &mut Ctx<'_>, session_id: &str) -> Result<()> {
    let slot = ctx.slot(session_id)?;
    let conn = ctx.conn;
    // Events, labels, interactions and usage go with it (ON DELETE CASCADE).
    conn.prepare_cached("DELETE FROM sessions WHERE pk = ?1")?
        .execute([slot.pk])?;
    // Hand the freed pages back: with auto_vacuum=INCREMENTAL this moves pages and
    // truncates the database (in the WAL; the file shrinks at the next checkpoint).
    let mut vacuum = conn.prepare("PRAGMA incremental_vacuum")?;
    let mut rows = vacuum.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    ctx.set_slot(session_id, None);
    Ok(())
}

fn upsert_interaction_op(ctx: &mut Ctx<'_>, i: &NewInteraction) -> Result<Interaction> {
    let slot = ctx.slot(&i.session_id)?;
    let conn = ctx.conn;
    let event_seq = i
        .event_seq
        .map(|s| u64_to_sql(s, "event_seq"))
        .transpose()?;
    conn.prepare_cached(
        "INSERT INTO interactions (session_pk, request_id, kind, tool_name, input, suggestions,
                                   event_seq, state, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8)
         ON CONFLICT (session_pk, request_id) DO UPDATE SET
            kind = excluded.kind,
            tool_name = excluded.tool_name,
            input = excluded.input,
            suggestions = excluded.suggestions,
            event_seq = COALESCE(excluded.event_seq, event_seq)
         WHERE state = 'pending'",
    )?
    .execute(params![
        slot.pk,
        i.request_id,
        i.kind.as_str(),
        i.tool_name,
        &i.input[..],
        i.suggestions.as_deref(),
        event_seq,
        i.created_ms
    ])?;
    rows::interaction(conn, slot.pk, &i.request_id)?
        .ok_or_else(|| Error::InvalidData("interaction vanished after insert".into()))
}

fn decide_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    request_id: &str,
    d: &Decision,
) -> Result<DecideOutcome> {
    if !d.state.is_final() {
        return Err(Error::InvalidArgument(
            "a decision must be a final state".into(),
        ));
    }
    let slot = ctx.slot(session_id)?;
    let conn = ctx.conn;
    let changed = conn
        .prepare_cached(
            "UPDATE interactions SET state = ?3, decided_by = ?4, decided_ms = ?5, response = ?6
             WHERE session_pk = ?1 AND request_id = ?2 AND state = 'pending'",
        )?
        .execute(params![
            slot.pk,
            request_id,
            d.state.as_str(),
            d.decided_by,
            d.decided_ms,
            d.response.as_deref()
        ])?;
    let stored = rows::interaction(conn, slot.pk, request_id)?.ok_or_else(|| {
        Error::not_found(format!(
            "interaction {request_id:?} of session {session_id:?}"
        ))
    })?;
    Ok(if changed == 1 {
        DecideOutcome::Decided(stored)
    } else {
        DecideOutcome::AlreadyDecided(stored)
    })
}

fn append_with_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    events: &[NewEvent],
    with: &WithEvents,
) -> Result<AppendedWith> {
    let decided = match &with.decide {
        Some((request_id, d)) => match decide_op(ctx, session_id, request_id, d)? {
            lost @ DecideOutcome::AlreadyDecided(_) => {
                return Ok(AppendedWith {
                    seqs: Vec::new(),
                    decided: Some(lost),
                });
            }
            won => Some(won),
        },
        None => None,
    };
    let seqs = append_op(ctx, session_id, events)?;
    if let Some((interaction, index)) = &with.interaction {
        let mut i = interaction.clone();
        i.event_seq = seqs.get(*index).copied().or(i.event_seq);
        upsert_interaction_op(ctx, &i)?;
    }
    if let Some(patch) = &with.patch {
        update_session_op(ctx, session_id, patch)?;
    }
    Ok(AppendedWith { seqs, decided })
}

fn close_pending_op(
    ctx: &mut Ctx<'_>,
    session_id: Option<&str>,
    d: &Decision,
) -> Result<Vec<Interaction>> {
    if !matches!(
        d.state,
        InteractionState::Expired | InteractionState::Cancelled
    ) {
        return Err(Error::InvalidArgument(
            "pending interactions can only be closed as expired or cancelled".into(),
        ));
    }
    let pk = session_id
        .map(|id| ctx.slot(id).map(|s| s.pk))
        .transpose()?;
    let conn = ctx.conn;
    let pending = rows::pending_interactions(conn, pk)?;
    let mut stmt = conn.prepare_cached(
        "UPDATE interactions SET state = ?2, decided_by = ?3, decided_ms = ?4, response = ?5
         WHERE session_pk = (SELECT pk FROM sessions WHERE id = ?1) AND request_id = ?6
           AND state = 'pending'",
    )?;
    let mut closed = Vec::with_capacity(pending.len());
    for mut i in pending {
        stmt.execute(params![
            i.session_id,
            d.state.as_str(),
            d.decided_by,
            d.decided_ms,
            d.response.as_deref(),
            i.request_id
        ])?;
        i.state = d.state;
        i.decided_by = Some(d.decided_by.clone());
        i.decided_ms = Some(d.decided_ms);
        i.response = d.response.clone();
        closed.push(i);
    }
    Ok(closed)
}

fn record_turn_op(ctx: &mut Ctx<'_>, session_id: &str, t: &TurnUsage) -> Result<u64> {
    let slot = ctx.slot(session_id)?;
    let conn = ctx.conn;
    let turns: i64 = conn
        .prepare_cached("SELECT turns FROM sessions WHERE pk = ?1")?
        .query_row([slot.pk], |r| r.get(0))?;
    let turn = u64_from_sql(turns, "turn count")? + 1;
    let u = &t.usage;
    let input = u64_to_sql(u.input_tokens, "input_tokens")?;
    let output = u64_to_sql(u.output_tokens, "output_tokens")?;
    let cache_creation = u64_to_sql(u.cache_creation_input_tokens, "cache_creation_input_tokens")?;
    let cache_read = u64_to_sql(u.cache_read_input_tokens, "cache_read_input_tokens")?;
    if !u.cost_usd.is_finite() {
        return Err(Error::InvalidArgument(format!(
            "cost_usd is not finite: {}",
            u.cost_usd
        )));
    }
    conn.prepare_cached(
        "INSERT INTO turn_usage (session_pk, turn, event_seq, model, input_tokens, output_tokens,
                                 cache_creation_input_tokens, cache_read_input_tokens, cost_usd,
                                 duration_ms, ts_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        slot.pk,
        u64_to_sql(turn, "turn")?,
        t.event_seq
            .map(|s| u64_to_sql(s, "event_seq"))
            .transpose()?,
        t.model,
        input,
        output,
        cache_creation,
        cache_read,
        u.cost_usd,
        t.duration_ms
            .map(|d| u64_to_sql(d, "duration_ms"))
            .transpose()?,
        t.ts_ms
    ])?;
    conn.prepare_cached(
        "UPDATE sessions SET turns = turns + 1,
            input_tokens = input_tokens + ?2,
            output_tokens = output_tokens + ?3,
            cache_creation_input_tokens = cache_creation_input_tokens + ?4,
            cache_read_input_tokens = cache_read_input_tokens + ?5,
            cost_usd = cost_usd + ?6
         WHERE pk = ?1",
    )?
    .execute(params![
        slot.pk,
        input,
        output,
        cache_creation,
        cache_read,
        u.cost_usd
    ])?;
    Ok(turn)
}
