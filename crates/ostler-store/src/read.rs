//! The read side: a small pool of read-only connections and the read operations run on
//! it. Each read is one SQLite snapshot (WAL), so it sees a consistent prefix of the
//! writer's commits and never blocks the writer.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::Connection;

use crate::connection::{open_error, open_flags_ro};
use crate::error::{Error, Result, not_found_session};
use crate::rows::{self, seq_from_sql};
use crate::types::*;

/// How many candidates an ambiguous interaction lookup reports.
const LOOKUP_CANDIDATES: usize = 5;

pub(crate) struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
    busy_timeout: Duration,
}

impl ReadPool {
    /// A pool keeping at most `opts.read_pool_size` idle connections; opens none yet.
    pub(crate) fn new(path: PathBuf, opts: &StoreOptions) -> Self {
        Self {
            path,
            idle: Mutex::new(Vec::new()),
            max_idle: opts.read_pool_size,
            busy_timeout: opts.busy_timeout,
        }
    }

    /// Closes the idle connections (those in use close when their read ends).
    pub(crate) fn close_idle(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn open(&self) -> Result<Connection> {
        let oe = |e| open_error(&self.path, e);
        let conn = Connection::open_with_flags(&self.path, open_flags_ro()).map_err(oe)?;
        conn.busy_timeout(self.busy_timeout).map_err(oe)?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }

    /// Runs `f` on an idle read connection (opening one if none is idle).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
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

impl ReadPool {
    /// Up to `limit` events of a session with `seq > after_seq`, in seq order. Each call is
    /// one consistent snapshot: it returns a gap-free run starting at `after_seq + 1` (or
    /// nothing if there is nothing newer). [`Error::NotFound`] if there is no such session.
    pub(crate) fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredEvent>> {
        self.with(|conn| {
            let events = rows::events_after(conn, session_id, after_seq, limit, max_bytes)?;
            if events.is_empty() && rows::session_pk(conn, session_id)?.is_none() {
                return Err(not_found_session(session_id));
            }
            Ok(events)
        })
    }

    pub(crate) fn events_of_kinds_before(
        &self,
        session_id: &str,
        kinds: &[&str],
        before_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        self.with(|conn| {
            let events = rows::events_of_kinds_before(conn, session_id, kinds, before_seq, limit)?;
            if events.is_empty() && rows::session_pk(conn, session_id)?.is_none() {
                return Err(not_found_session(session_id));
            }
            Ok(events)
        })
    }

    /// The seq of a session's last committed event (0 if none).
    pub(crate) fn last_seq(&self, session_id: &str) -> Result<u64> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {} FROM sessions s WHERE s.id = ?1",
                rows::LAST_SEQ_OF_S
            );
            let v: Option<i64> = conn
                .prepare_cached(&sql)?
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
    pub(crate) fn get_session(&self, session_id: &str) -> Result<SessionRecord> {
        self.with(|conn| {
            rows::session(conn, session_id)?.ok_or_else(|| not_found_session(session_id))
        })
    }

    /// Sessions matching `filter`, oldest first, `limit` per page (at least 1). Pass the
    /// previous page's `next_page_token` to continue.
    pub(crate) fn list_sessions(
        &self,
        filter: &SessionFilter,
        page_token: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage> {
        let after = page_token.map(parse_page_token).transpose()?;
        let limit = limit.max(1);
        self.with(|conn| query_sessions(conn, filter, after.as_ref(), limit))
    }

    /// Pending interactions of one session, or of all sessions with `None`, oldest first.
    pub(crate) fn pending_interactions(
        &self,
        session_id: Option<&str>,
    ) -> Result<Vec<Interaction>> {
        self.with(|conn| {
            let pk = match session_id {
                None => None,
                Some(id) => Some(rows::session_pk(conn, id)?.ok_or_else(|| not_found_session(id))?),
            };
            rows::pending_interactions(conn, pk)
        })
    }

    /// What `request_id` (exact, else a prefix) names, in one session or in any.
    /// [`Error::NotFound`] for an unknown session; [`Error::InvalidArgument`] for an empty id.
    pub(crate) fn lookup_interaction(
        &self,
        session_id: Option<&str>,
        request_id: &str,
    ) -> Result<InteractionLookup> {
        if request_id.is_empty() {
            return Err(Error::InvalidArgument("request_id is empty".into()));
        }
        self.with(|conn| {
            let pk = match session_id {
                None => None,
                Some(id) => Some(rows::session_pk(conn, id)?.ok_or_else(|| not_found_session(id))?),
            };
            let found = rows::interactions_by_request(conn, pk, request_id, LOOKUP_CANDIDATES + 1)?;
            let exact: Vec<Interaction> = found
                .iter()
                .filter(|i| i.request_id == request_id)
                .cloned()
                .collect();
            let lookup = match (exact.len(), found.len()) {
                (1, _) => InteractionLookup::Found(exact.into_iter().next().expect("one")),
                (0, 0) => InteractionLookup::NotFound,
                (0, 1) => InteractionLookup::Found(found.into_iter().next().expect("one")),
                (0, n) => InteractionLookup::Ambiguous {
                    more: n > LOOKUP_CANDIDATES,
                    candidates: found.into_iter().take(LOOKUP_CANDIDATES).collect(),
                },
                _ => InteractionLookup::InSessions(
                    exact.into_iter().take(LOOKUP_CANDIDATES).collect(),
                ),
            };
            Ok(lookup)
        })
    }

    /// One interaction. [`Error::NotFound`] if there is no such interaction.
    pub(crate) fn interaction(&self, session_id: &str, request_id: &str) -> Result<Interaction> {
        self.with(|conn| {
            rows::interaction_by_id(conn, session_id, request_id)?.ok_or_else(|| {
                Error::not_found(format!(
                    "interaction {request_id:?} of session {session_id:?}"
                ))
            })
        })
    }

    /// A session's usage: totals and every turn.
    pub(crate) fn usage(&self, session_id: &str) -> Result<SessionUsage> {
        self.with(|conn| {
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

// ---------------------------------------------------------------------- list sessions

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PageKey {
    created_ms: i64,
    id: String,
}

pub(crate) fn parse_page_token(token: &str) -> Result<PageKey> {
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

fn query_sessions(
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
            args.push(Value::Text(state.as_str().to_owned()));
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
    if let Some(archived) = filter.archived {
        sql.push_str(" AND s.archived = ?");
        args.push(Value::Integer(i64::from(archived)));
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
