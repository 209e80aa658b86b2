//! The daemon-wide feed: attention-worthy events of every session, in commit order.
//!
//! Rows of the `feed` table are written with their event by the writer's append (`ops.rs`
//! [`FeedKind::of_event`]; a trigger on `events` in schema versions 4-6), in the same write operation
//! as the event, so the feed never shows an event that is not stored and never misses one
//! that is. After each group commit the writer publishes the last feed
//! id on a `tokio::sync::watch` ([`Store::feed_watch`]); readers page through the table
//! with [`Store::feed_after`]. Also here: session titles and the notifiers' persisted
//! delivery cursors (both small writes of the same migration).

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::rows::{self, u64_from_sql, u64_to_sql};
use crate::store::{Store, Ticket};
use crate::types::{SessionState, StoredEvent};

/// The last committed feed id: the AUTOINCREMENT counter, which never goes back (not even
/// when the newest rows are deleted with their session).
fn last_feed_id(conn: &Connection) -> rusqlite::Result<u64> {
    let v: Option<i64> = conn
        .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'feed'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0))
}

/// The highest feed cursor pruned so far (table `feed_pruned`, migration 0013; 0 before
/// any pruning, and on a database older than that migration).
fn pruned_to(conn: &Connection) -> rusqlite::Result<u64> {
    let v: Option<i64> = match conn
        .prepare_cached("SELECT cursor FROM feed_pruned WHERE id = 0")
        .and_then(|mut s| s.query_row([], |r| r.get(0)).optional())
    {
        Ok(v) => v,
        Err(rusqlite::Error::SqliteFailure(_, Some(m))) if m.contains("no such table") => None,
        Err(e) => return Err(e),
    };
    Ok(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0))
}

/// Owned by the writer: publishes the last committed feed id and the highest pruned cursor
/// after each commit.
pub(crate) struct FeedPublisher {
    tx: watch::Sender<u64>,
    pruned: watch::Sender<u64>,
}

impl FeedPublisher {
    pub(crate) fn new(conn: &Connection) -> Self {
        let start = last_feed_id(conn).unwrap_or(0);
        Self {
            tx: watch::Sender::new(start),
            pruned: watch::Sender::new(pruned_to(conn).unwrap_or(0)),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    pub(crate) fn subscribe_pruned(&self) -> watch::Receiver<u64> {
        self.pruned.subscribe()
    }

    /// Called by the writer after a successful commit (outside any transaction).
    pub(crate) fn committed(&self, conn: &Connection) {
        // The pruned cursor first: a watcher woken by the feed position sees it.
        match pruned_to(conn) {
            Ok(p) => {
                self.pruned.send_if_modified(|v| {
                    let moved = p > *v;
                    *v = (*v).max(p);
                    moved
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the feed's pruned cursor"),
        }
        match last_feed_id(conn) {
            Ok(id) => {
                self.tx.send_if_modified(|v| {
                    let moved = id > *v;
                    *v = (*v).max(id);
                    moved
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the feed position; waking watchers");
                // Watchers re-read from their own cursor: waking them costs one read.
                self.tx.send_modify(|_| {});
            }
        }
    }
}

/// What a feed entry reports (the feed table's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FeedKind {
    /// The session was created (its first event, the `session_created` notice).
    SessionCreated,
    /// `state_changed`.
    StateChanged,
    /// `turn_completed`.
    TurnCompleted,
    /// `permission_requested`.
    PermissionRequested,
    /// `question_asked`.
    QuestionAsked,
    /// `interaction_resolved`.
    InteractionResolved,
    /// `process_exited`.
    ProcessExited,
    /// `hook_requested` (a pending hook call; its `hook_resolved` is `InteractionResolved`).
    HookPending,
    /// `tool_call_requested` (a client-hosted tool call waits; its resolution is
    /// `InteractionResolved`).
    ToolCallRequested,
    /// `elicitation_requested` (an MCP server waits for the user's input; its resolution
    /// is `InteractionResolved`).
    ElicitationRequested,
    /// `dialog_requested` (the CLI waits for a dialog's answer; its resolution is
    /// `InteractionResolved`).
    DialogRequested,
    /// The session was deleted (`Store::delete_session`). Its other entries went with it;
    /// this one is kept (table `feed_deleted`, migration 0011) with the session's title,
    /// cwd, state and labels as they were, and a `session_deleted` engine notice at the seq
    /// the session's next event would have had ([`SESSION_DELETED_NOTICE`]), which is in no
    /// log.
    SessionDeleted,
    /// A client changed the session's title, labels or archived mark (`Store::update_meta`):
    /// the entry's event is the `session_updated` notice that recorded it.
    SessionUpdated,
}

/// The stored payload of the `engine_notice` a [`FeedKind::SessionDeleted`] entry carries
/// (the engine's `EngineNotice` with code `session_deleted`).
pub const SESSION_DELETED_NOTICE: &[u8] =
    br#"{"code":"session_deleted","message":"session deleted"}"#;

impl FeedKind {
    /// The feed kind of a stored event of `kind` at `seq`; `None` for the events that do
    /// not enter the feed (most of them). The writer's append inserts the feed row with the
    /// event (schema versions 4-6 did this mapping in a row trigger on `events`).
    pub(crate) fn of_event(kind: &str, seq: u64) -> Option<FeedKind> {
        Some(match kind {
            "engine_notice" if seq == 1 => FeedKind::SessionCreated,
            "state_changed" => FeedKind::StateChanged,
            "turn_completed" => FeedKind::TurnCompleted,
            "permission_requested" => FeedKind::PermissionRequested,
            "question_asked" => FeedKind::QuestionAsked,
            "process_exited" => FeedKind::ProcessExited,
            "hook_requested" => FeedKind::HookPending,
            "tool_call_requested" => FeedKind::ToolCallRequested,
            "elicitation_requested" => FeedKind::ElicitationRequested,
            "dialog_requested" => FeedKind::DialogRequested,
            "interaction_resolved"
            | "hook_resolved"
            | "tool_call_resolved"
            | "elicitation_resolved"
            | "dialog_resolved" => FeedKind::InteractionResolved,
            _ => return None,
        })
    }

    /// Every kind, in declaration order.
    pub const ALL: [FeedKind; 13] = [
        FeedKind::SessionCreated,
        FeedKind::StateChanged,
        FeedKind::TurnCompleted,
        FeedKind::PermissionRequested,
        FeedKind::QuestionAsked,
        FeedKind::InteractionResolved,
        FeedKind::ProcessExited,
        FeedKind::HookPending,
        FeedKind::ToolCallRequested,
        FeedKind::ElicitationRequested,
        FeedKind::DialogRequested,
        FeedKind::SessionDeleted,
        FeedKind::SessionUpdated,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedKind::SessionCreated => "session_created",
            FeedKind::StateChanged => "state_changed",
            FeedKind::TurnCompleted => "turn_completed",
            FeedKind::PermissionRequested => "permission_requested",
            FeedKind::QuestionAsked => "question_asked",
            FeedKind::InteractionResolved => "interaction_resolved",
            FeedKind::ProcessExited => "process_exited",
            FeedKind::HookPending => "hook_pending",
            FeedKind::ToolCallRequested => "tool_call_requested",
            FeedKind::ElicitationRequested => "elicitation_requested",
            FeedKind::DialogRequested => "dialog_requested",
            FeedKind::SessionDeleted => "session_deleted",
            FeedKind::SessionUpdated => "session_updated",
        }
    }
}

impl std::str::FromStr for FeedKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        FeedKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| Error::InvalidData(format!("unknown feed kind {s:?}")))
    }
}

/// One feed row with its session and its event, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedEntry<E = StoredEvent> {
    /// The feed cursor: increasing, never reused.
    pub cursor: u64,
    /// What happened.
    pub kind: FeedKind,
    /// The session.
    pub session_id: String,
    /// The session's title, when it has one.
    pub title: Option<String>,
    /// The session's working directory.
    pub cwd: String,
    /// The session's stored state when the entry was read (for a
    /// [`FeedKind::SessionDeleted`] entry: its state when it was deleted).
    pub state: SessionState,
    /// The session's labels (for a [`FeedKind::SessionDeleted`] entry: as they were when it
    /// was deleted).
    pub labels: BTreeMap<String, String>,
    /// The event (the session's `seq`; for a [`FeedKind::SessionDeleted`] entry the
    /// `engine_notice` [`SESSION_DELETED_NOTICE`] at the session's last seq + 1, in no log).
    pub event: E,
}

impl<E> FeedEntry<E> {
    /// The same entry with its event turned into another form (e.g. decoded).
    pub fn map_event<F>(self, f: impl FnOnce(E) -> F) -> FeedEntry<F> {
        FeedEntry {
            cursor: self.cursor,
            kind: self.kind,
            session_id: self.session_id,
            title: self.title,
            cwd: self.cwd,
            state: self.state,
            labels: self.labels,
            event: f(self.event),
        }
    }
}

/// One page of [`Store::feed_after`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FeedPage {
    /// Entries with `id` greater than the cursor asked for, in id order.
    pub entries: Vec<FeedEntry>,
    /// The id of the last feed row this read covered (the next read continues after it);
    /// the cursor asked for when nothing newer exists.
    pub scanned_to: u64,
    /// The highest cursor pruned so far ([`Store::feed_pruned_to`]), in the same snapshot
    /// as the entries.
    pub pruned_to: u64,
}

/// What one [`Store::prune_feed_deletions`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeedPruned {
    /// Deletion entries removed.
    pub pruned: u64,
    /// Deletion entries old enough but kept because a notifier has not passed them yet.
    pub held_back: u64,
    /// The highest cursor pruned so far (this time or before; 0: none).
    pub pruned_to: u64,
    /// The slowest of the notifiers named (its saved cursor), when any has one.
    pub notifier_floor: Option<u64>,
}

/// The longest stored title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// A title from free text: the first line with whitespace collapsed, cut to `max_chars`
/// characters on a character boundary (with `…` when cut). `None` when nothing is left.
pub fn shorten_title(text: &str, max_chars: usize) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let joined = words.join(" ");
    if joined.chars().count() <= max_chars {
        return Some(joined);
    }
    let mut cut: String = joined.chars().take(max_chars.saturating_sub(1)).collect();
    let trimmed = cut.trim_end().len();
    cut.truncate(trimmed);
    cut.push('…');
    Some(cut)
}

/// One row of a page: a feed row joined with its session (`pk` set), or a deletion's
/// entry (`pk` `None`: title, cwd, state and labels are the deleted session's).
struct RawRow {
    id: u64,
    seq: u64,
    kind: String,
    pk: Option<i64>,
    session_id: String,
    title: Option<String>,
    cwd: String,
    state: String,
    deleted_ms: i64,
}

fn read_page(conn: &Connection, after: u64, limit: usize) -> Result<FeedPage> {
    let limit_sql = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
    // One snapshot for the rows and the events they name.
    let tx = conn.unchecked_transaction()?;
    let mut stmt = tx.prepare_cached(
        // Each side is cut to the page first (both are read in id order), so a page costs
        // at most two pages of rows whatever the cursor.
        "SELECT * FROM (
             SELECT f.id, f.seq, f.kind, s.pk, s.id, s.title, s.cwd, s.state, 0
             FROM feed f JOIN sessions s ON s.pk = f.session_pk
             WHERE f.id > ?1 ORDER BY f.id LIMIT ?2)
         UNION ALL
         SELECT * FROM (
             SELECT d.id, d.seq, 'session_deleted', NULL, d.session_id, d.title, d.cwd,
                    d.state, d.deleted_ms
             FROM feed_deleted d
             WHERE d.id > ?1 ORDER BY d.id LIMIT ?2)
         ORDER BY 1 LIMIT ?2",
    )?;
    let mut rows_iter = stmt.query(params![u64_to_sql(after, "cursor")?, limit_sql])?;
    let mut raw = Vec::new();
    while let Some(row) = rows_iter.next()? {
        raw.push(RawRow {
            id: u64_from_sql(row.get(0)?, "feed id")?,
            seq: u64_from_sql(row.get(1)?, "seq")?,
            kind: row.get(2)?,
            pk: row.get(3)?,
            session_id: row.get(4)?,
            title: row.get(5)?,
            cwd: row.get(6)?,
            state: row.get(7)?,
            deleted_ms: row.get(8)?,
        });
    }
    drop(rows_iter);
    drop(stmt);
    let mut page = FeedPage {
        entries: Vec::with_capacity(raw.len()),
        scanned_to: raw.last().map_or(after, |r| r.id),
        pruned_to: pruned_to(&tx)?,
    };
    for r in raw {
        let (event, labels) = match r.pk {
            Some(pk) => {
                let Some(event) =
                    rows::events_after(&tx, &r.session_id, r.seq.saturating_sub(1), 1, usize::MAX)?
                        .into_iter()
                        .find(|e| e.seq == r.seq)
                else {
                    // The event is gone (cannot happen while feed rows cascade with their
                    // session).
                    continue;
                };
                (event, rows::labels(&tx, pk)?)
            }
            None => (
                StoredEvent {
                    session_id: r.session_id.as_str().into(),
                    seq: r.seq,
                    kind: "engine_notice".into(),
                    payload: bytes::Bytes::from_static(SESSION_DELETED_NOTICE),
                    raw: None,
                    ts_ms: r.deleted_ms,
                },
                deleted_labels(&tx, r.id)?,
            ),
        };
        page.entries.push(FeedEntry {
            cursor: r.id,
            kind: r.kind.parse()?,
            title: r.title,
            cwd: r.cwd,
            state: r.state.parse()?,
            labels,
            session_id: r.session_id,
            event,
        });
    }
    tx.finish()?;
    Ok(page)
}

/// The labels a deleted session had (its `feed_deleted` entry `id`).
fn deleted_labels(conn: &Connection, id: u64) -> Result<BTreeMap<String, String>> {
    let mut stmt =
        conn.prepare_cached("SELECT key, value FROM feed_deleted_labels WHERE feed_id = ?1")?;
    let mut rows = stmt.query([u64_to_sql(id, "feed id")?])?;
    let mut out = BTreeMap::new();
    while let Some(row) = rows.next()? {
        out.insert(row.get(0)?, row.get(1)?);
    }
    Ok(out)
}

impl Store {
    /// The last committed feed id, published after every commit: wait for it to move past
    /// your cursor, then read with [`Store::feed_after`].
    pub fn feed_watch(&self) -> watch::Receiver<u64> {
        self.feed_receiver()
    }

    /// The highest feed cursor pruned by [`Store::prune_feed_deletions`] so far (0: none),
    /// as of the last commit (no I/O). A watcher from a non-zero cursor below it could have
    /// missed a deletion entry.
    pub fn feed_pruned_to(&self) -> u64 {
        *self.feed_pruned_receiver().borrow()
    }

    /// Removes the [`FeedKind::SessionDeleted`] entries deleted at least `keep_ms`
    /// milliseconds before `now_ms` (Unix epoch milliseconds) that every notifier in
    /// `notifiers` has passed (its saved cursor, [`Store::set_notify_cursor`], is at or
    /// after the entry; a notifier without one holds nothing back), and records the highest
    /// cursor removed durably ([`Store::feed_pruned_to`]). Nothing else leaves the feed.
    pub fn prune_feed_deletions(
        &self,
        now_ms: i64,
        keep_ms: u64,
        notifiers: Vec<String>,
    ) -> Ticket<FeedPruned> {
        let cutoff = now_ms.saturating_sub(i64::try_from(keep_ms).unwrap_or(i64::MAX));
        self.submit(move |ctx| {
            let conn = ctx.conn;
            let mut floor: Option<u64> = None;
            {
                let mut stmt =
                    conn.prepare_cached("SELECT cursor FROM notify_cursors WHERE name = ?1")?;
                for name in &notifiers {
                    if let Some(c) = stmt.query_row([name], |r| r.get::<_, i64>(0)).optional()? {
                        let c = u64_from_sql(c, "notify cursor")?;
                        floor = Some(floor.map_or(c, |f| f.min(c)));
                    }
                }
            }
            let limit = match floor {
                Some(f) => u64_to_sql(f, "notify cursor")?,
                None => i64::MAX,
            };
            let (top, held): (Option<i64>, i64) = conn
                .prepare_cached(
                    "SELECT max(id) FILTER (WHERE id <= ?2), count(*) FILTER (WHERE id > ?2)
                     FROM feed_deleted WHERE deleted_ms <= ?1",
                )?
                .query_row(params![cutoff, limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let pruned = conn
                .prepare_cached("DELETE FROM feed_deleted WHERE deleted_ms <= ?1 AND id <= ?2")?
                .execute(params![cutoff, limit])?;
            if let Some(top) = top {
                conn.prepare_cached(
                    "UPDATE feed_pruned SET cursor = max(cursor, ?1) WHERE id = 0",
                )?
                .execute([top])?;
                // The publisher reads the pruned cursor again after the commit.
                ctx.feed_touched = true;
            }
            Ok(FeedPruned {
                pruned: pruned as u64,
                held_back: u64::try_from(held).unwrap_or(0),
                pruned_to: pruned_to(conn)?,
                notifier_floor: floor,
            })
        })
    }

    /// Up to `limit` feed entries after `cursor` (0 = from the beginning), in id order, with
    /// their sessions and events; one consistent snapshot.
    pub fn feed_after(&self, cursor: u64, limit: usize) -> Result<FeedPage> {
        self.readers().with(|conn| read_page(conn, cursor, limit))
    }

    /// Sets a session's title ([`MAX_TITLE_CHARS`] at most: longer text is shortened).
    /// [`Error::NotFound`] if there is no such session.
    pub fn set_title(&self, session_id: &str, title: &str) -> Ticket<()> {
        let sid = session_id.to_owned();
        let title = shorten_title(title, MAX_TITLE_CHARS);
        self.submit(move |ctx| {
            let slot = ctx.slot(&sid)?;
            ctx.conn
                .prepare_cached("UPDATE sessions SET title = ?2 WHERE pk = ?1")?
                .execute(params![slot.pk, title])?;
            Ok(())
        })
    }

    /// A session's title (`None` when it has none). [`Error::NotFound`] if there is no such
    /// session.
    pub fn title(&self, session_id: &str) -> Result<Option<String>> {
        self.readers().with(|conn| {
            conn.prepare_cached("SELECT title FROM sessions WHERE id = ?1")?
                .query_row([session_id], |r| r.get::<_, Option<String>>(0))
                .optional()?
                .ok_or_else(|| crate::error::not_found_session(session_id))
        })
    }

    /// Titles of many sessions at once (sessions without one are left out).
    pub fn titles(&self, session_ids: &[String]) -> Result<BTreeMap<String, String>> {
        self.readers().with(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT title FROM sessions WHERE id = ?1 AND title IS NOT NULL")?;
            let mut out = BTreeMap::new();
            for id in session_ids {
                if let Some(t) = stmt.query_row([id], |r| r.get::<_, String>(0)).optional()? {
                    out.insert(id.clone(), t);
                }
            }
            Ok(out)
        })
    }

    /// The persisted delivery cursor of the notifier `name` (`None` before its first save).
    pub fn notify_cursor(&self, name: &str) -> Result<Option<u64>> {
        self.readers().with(|conn| {
            conn.prepare_cached("SELECT cursor FROM notify_cursors WHERE name = ?1")?
                .query_row([name], |r| r.get::<_, i64>(0))
                .optional()?
                .map(|v| u64_from_sql(v, "notify cursor"))
                .transpose()
        })
    }

    /// Saves the delivery cursor of the notifier `name`.
    pub fn set_notify_cursor(&self, name: &str, cursor: u64) -> Ticket<()> {
        let name = name.to_owned();
        self.submit(move |ctx| {
            ctx.conn
                .prepare_cached(
                    "INSERT INTO notify_cursors (name, cursor) VALUES (?1, ?2)
                     ON CONFLICT (name) DO UPDATE SET cursor = excluded.cursor",
                )?
                .execute(params![name, u64_to_sql(cursor, "cursor")?])?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::shorten_title;

    #[test]
    fn titles_are_shortened_on_char_boundaries() {
        assert_eq!(
            shorten_title("  \n  fix the   bug \nmore", 60).as_deref(),
            Some("fix the bug")
        );
        assert_eq!(shorten_title(" \n ", 60), None);
        let long = "é".repeat(100);
        let t = shorten_title(&long, 60).unwrap();
        assert_eq!(t.chars().count(), 60);
        assert!(t.ends_with('…'));
        assert_eq!(shorten_title("abc def", 5).as_deref(), Some("abc…"));
    }
}
