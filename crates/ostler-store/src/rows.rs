//! Queries shared by the read path and the writer (which reads back what it wrote).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::codec;
use crate::error::{Error, Result};
use crate::types::{
    ExitFacts, ExitInfo, Interaction, SessionRecord, StoredEvent, StoredTurnUsage, TurnUsage,
    UsageTotals,
};

/// Converts a stored INTEGER that must be non-negative.
pub(crate) fn u64_from_sql(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::InvalidData(format!("negative {what}: {v}")))
}

/// Converts a stored seq.
pub(crate) fn seq_from_sql(v: i64) -> Result<u64> {
    u64_from_sql(v, "seq")
}

/// [`EVENT_SEQ_BITS`] as SQL text, for the queries' `<<` (fixed by migration 0009).
macro_rules! seq_bits {
    () => {
        "36"
    };
}

/// Bits of an event's row id that hold its seq; the session's pk is above them (migration
/// 0009: `events.id = session_pk << EVENT_SEQ_BITS | seq`).
pub(crate) const EVENT_SEQ_BITS: u32 = 36;

/// The greatest seq an event can have (2^36 - 1).
pub(crate) const MAX_EVENT_SEQ: u64 = (1 << EVENT_SEQ_BITS) - 1;

/// The greatest session pk whose events fit in a row id (2^27 - 1).
pub(crate) const MAX_EVENT_SESSION_PK: i64 = (1 << (63 - EVENT_SEQ_BITS)) - 1;

/// The row id of event `seq` of session `pk`, or why it has none.
pub(crate) fn event_id(pk: i64, seq: u64) -> Result<i64> {
    if !(0..=MAX_EVENT_SESSION_PK).contains(&pk) {
        return Err(Error::InvalidData(format!(
            "session row {pk} is beyond the {MAX_EVENT_SESSION_PK} sessions a store can hold events for"
        )));
    }
    if seq > MAX_EVENT_SEQ {
        return Err(Error::SessionFull { max: MAX_EVENT_SEQ });
    }
    Ok((pk << EVENT_SEQ_BITS) | seq as i64)
}

/// The seq of the event with row id `id`.
pub(crate) fn seq_of_event_id(id: i64) -> u64 {
    (id as u64) & MAX_EVENT_SEQ
}

/// Converts a caller's unsigned value into an SQLite INTEGER.
pub(crate) fn u64_to_sql(v: u64, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument(format!("{what} too large: {v}")))
}

fn opt_u64(row: &Row<'_>, idx: usize, what: &str) -> Result<Option<u64>> {
    row.get::<_, Option<i64>>(idx)?
        .map(|v| u64_from_sql(v, what))
        .transpose()
}

fn blob(row: &Row<'_>, idx: usize) -> Result<Bytes> {
    match row.get_ref(idx)? {
        ValueRef::Blob(b) => Ok(Bytes::copy_from_slice(b)),
        ValueRef::Text(t) => Ok(Bytes::copy_from_slice(t)),
        other => Err(Error::InvalidData(format!(
            "expected a blob in column {idx}, found {:?}",
            other.data_type()
        ))),
    }
}

fn opt_blob(row: &Row<'_>, idx: usize) -> Result<Option<Bytes>> {
    match row.get_ref(idx)? {
        ValueRef::Null => Ok(None),
        _ => blob(row, idx).map(Some),
    }
}

// ---------------------------------------------------------------- sessions

/// The last seq of the session row aliased `s` (0 if none).
macro_rules! last_seq_of_s {
    () => {
        // The greatest id of the session's id range (see `event_id`): one b-tree seek.
        concat!(
            "(SELECT COALESCE(MAX(e.id) - (s.pk << ",
            seq_bits!(),
            "), 0) FROM events e \
              WHERE e.id > (s.pk << ",
            seq_bits!(),
            ") AND e.id < ((s.pk + 1) << ",
            seq_bits!(),
            "))"
        )
    };
}

/// See [`last_seq_of_s!`].
pub(crate) const LAST_SEQ_OF_S: &str = last_seq_of_s!();

pub(crate) const SESSION_COLUMNS: &str = concat!(
    "s.pk, s.id, s.claude_session_id, s.cwd, s.model, \
    s.permission_mode, s.cli_release, s.state, s.created_ms, s.updated_ms, s.exit_code, \
    s.exit_signal, s.exit_reason, s.exited_ms, s.turns, s.input_tokens, s.output_tokens, \
    s.cache_creation_input_tokens, s.cache_read_input_tokens, s.cost_usd, ",
    last_seq_of_s!(),
    ", s.title, s.archived"
);

/// Maps a row selected with [`SESSION_COLUMNS`] (labels left empty) and returns its pk.
pub(crate) fn session_from_row(row: &Row<'_>) -> Result<(i64, SessionRecord)> {
    let exited_ms: Option<i64> = row.get(13)?;
    let exit = exited_ms.map(|at_ms| -> Result<ExitInfo> {
        Ok(ExitInfo {
            facts: ExitFacts {
                code: row.get(10)?,
                signal: row.get(11)?,
            },
            reason: row.get(12)?,
            at_ms,
        })
    });
    let record = SessionRecord {
        id: row.get(1)?,
        claude_session_id: row.get(2)?,
        cwd: row.get(3)?,
        model: row.get(4)?,
        permission_mode: row.get(5)?,
        cli_release: row.get(6)?,
        state: row.get_ref(7)?.as_str()?.parse()?,
        labels: BTreeMap::new(),
        created_ms: row.get(8)?,
        updated_ms: row.get(9)?,
        exit: exit.transpose()?,
        turns: u64_from_sql(row.get(14)?, "turn count")?,
        usage: UsageTotals {
            input_tokens: u64_from_sql(row.get(15)?, "input_tokens")?,
            output_tokens: u64_from_sql(row.get(16)?, "output_tokens")?,
            cache_creation_input_tokens: u64_from_sql(row.get(17)?, "cache_creation_input_tokens")?,
            cache_read_input_tokens: u64_from_sql(row.get(18)?, "cache_read_input_tokens")?,
            cost_usd: row.get(19)?,
        },
        last_seq: u64_from_sql(row.get(20)?, "seq")?,
        title: row.get(21)?,
        archived: row.get::<_, i64>(22)? != 0,
    };
    Ok((row.get(0)?, record))
}

pub(crate) fn labels(conn: &Connection, pk: i64) -> Result<BTreeMap<String, String>> {
    let mut stmt =
        conn.prepare_cached("SELECT key, value FROM session_labels WHERE session_pk = ?1")?;
    let mut rows = stmt.query([pk])?;
    let mut out = BTreeMap::new();
    while let Some(row) = rows.next()? {
        out.insert(row.get(0)?, row.get(1)?);
    }
    Ok(out)
}

pub(crate) fn session(conn: &Connection, id: &str) -> Result<Option<SessionRecord>> {
    let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([id])?;
    match rows.next()? {
        None => Ok(None),
        Some(row) => {
            let (pk, mut record) = session_from_row(row)?;
            record.labels = labels(conn, pk)?;
            Ok(Some(record))
        }
    }
}

pub(crate) fn session_pk(conn: &Connection, id: &str) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT pk FROM sessions WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?)
}

// ---------------------------------------------------------------- events

/// A page of a session's events: its id range (see `event_id`) from just after `after_seq`.
const EVENTS_AFTER_SQL: &str = concat!(
    "SELECT id, kind, payload, raw, ts_ms, codec FROM events
     WHERE id > ((SELECT pk FROM sessions WHERE id = ?1) << ",
    seq_bits!(),
    ") + ?2
       AND id < (((SELECT pk FROM sessions WHERE id = ?1) + 1) << ",
    seq_bits!(),
    ")
     ORDER BY id LIMIT ?3"
);

/// A session's events of some kinds before `before_seq`, newest first.
const EVENTS_OF_KINDS_BEFORE_SQL: &str = concat!(
    "SELECT id, kind, payload, raw, ts_ms, codec FROM events
     WHERE id < ((SELECT pk FROM sessions WHERE id = ?1) << ",
    seq_bits!(),
    ") + ?2
       AND id > ((SELECT pk FROM sessions WHERE id = ?1) << ",
    seq_bits!(),
    ")
       AND kind IN (SELECT value FROM json_each(?3))
     ORDER BY id DESC LIMIT ?4"
);

pub(crate) fn events_after(
    conn: &Connection,
    session_id: &str,
    after_seq: u64,
    limit: usize,
    max_bytes: usize,
) -> Result<Vec<StoredEvent>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    // No seq is greater than MAX_EVENT_SEQ: after it, the range is empty.
    let after = u64_to_sql(after_seq.min(MAX_EVENT_SEQ), "after_seq")?;
    let mut stmt = conn.prepare_cached(EVENTS_AFTER_SQL)?;
    let rows = stmt.query(params![session_id, after, limit])?;
    stored_events(
        rows,
        session_id,
        usize::try_from(limit.min(4096)).unwrap_or(0),
        max_bytes,
    )
}

/// Up to `limit` events of the given kinds with `seq < before_seq`, newest first. Rows of
/// other kinds are skipped by SQLite without reading their payloads.
pub(crate) fn events_of_kinds_before(
    conn: &Connection,
    session_id: &str,
    kinds: &[&str],
    before_seq: u64,
    limit: usize,
) -> Result<Vec<StoredEvent>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let before = u64_to_sql(before_seq.min(MAX_EVENT_SEQ + 1), "before_seq")?;
    // Kinds are snake_case names: passed as one JSON array (no escaping needed).
    if let Some(bad) = kinds
        .iter()
        .find(|k| !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    {
        return Err(Error::InvalidData(format!("not an event kind: {bad:?}")));
    }
    let kinds = format!(
        "[{}]",
        kinds
            .iter()
            .map(|k| format!("\"{k}\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut stmt = conn.prepare_cached(EVENTS_OF_KINDS_BEFORE_SQL)?;
    let rows = stmt.query(params![session_id, before, kinds, limit])?;
    stored_events(rows, session_id, 16, usize::MAX)
}

/// The events of `rows`, ending early (after at least one) once their payloads and raw
/// lines come to `max_bytes`.
fn stored_events(
    mut rows: rusqlite::Rows<'_>,
    session_id: &str,
    capacity: usize,
    max_bytes: usize,
) -> Result<Vec<StoredEvent>> {
    let mut bytes = 0usize;
    let sid: Arc<str> = Arc::from(session_id);
    // Events of one session use a handful of kinds: share one allocation per kind.
    let mut kinds: Vec<Arc<str>> = Vec::new();
    let mut out = Vec::with_capacity(capacity);
    while let Some(row) = rows.next()? {
        let kind_text = row.get_ref(1)?.as_str()?;
        let kind = match kinds.iter().find(|k| ***k == *kind_text) {
            Some(k) => Arc::clone(k),
            None => {
                let k: Arc<str> = Arc::from(kind_text);
                kinds.push(Arc::clone(&k));
                k
            }
        };
        let stored_raw = match row.get_ref(3)? {
            ValueRef::Null => None,
            ValueRef::Blob(b) | ValueRef::Text(b) => Some(b),
            _ => return Err(Error::InvalidData("raw line is not a blob".into())),
        };
        let stored_payload = match row.get_ref(2)? {
            ValueRef::Blob(b) | ValueRef::Text(b) => b,
            _ => return Err(Error::InvalidData("payload is not a blob".into())),
        };
        let (payload, raw) =
            codec::decode_row(row.get_ref(5)?.as_i64()?, stored_payload, stored_raw)?;
        bytes = bytes.saturating_add(payload.len() + raw.as_ref().map_or(0, Bytes::len));
        out.push(StoredEvent {
            session_id: Arc::clone(&sid),
            seq: seq_of_event_id(row.get(0)?),
            kind,
            payload,
            raw,
            ts_ms: row.get(4)?,
        });
        if bytes >= max_bytes {
            break;
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- interactions

const INTERACTION_SELECT: &str = "SELECT s.id, i.request_id, i.kind, i.tool_name, i.input, \
    i.suggestions, i.event_seq, i.state, i.created_ms, i.decided_by, i.decided_ms, i.response \
    FROM interactions i JOIN sessions s ON s.pk = i.session_pk";

fn interaction_from_row(row: &Row<'_>) -> Result<Interaction> {
    Ok(Interaction {
        session_id: row.get(0)?,
        request_id: row.get(1)?,
        kind: row.get_ref(2)?.as_str()?.parse()?,
        tool_name: row.get(3)?,
        input: blob(row, 4)?,
        suggestions: opt_blob(row, 5)?,
        event_seq: opt_u64(row, 6, "event_seq")?,
        state: row.get_ref(7)?.as_str()?.parse()?,
        created_ms: row.get(8)?,
        decided_by: row.get(9)?,
        decided_ms: row.get(10)?,
        response: opt_blob(row, 11)?,
    })
}

pub(crate) fn interaction(
    conn: &Connection,
    session_pk: i64,
    request_id: &str,
) -> Result<Option<Interaction>> {
    let sql = format!("{INTERACTION_SELECT} WHERE i.session_pk = ?1 AND i.request_id = ?2");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![session_pk, request_id])?;
    rows.next()?.map(interaction_from_row).transpose()
}

pub(crate) fn interaction_by_id(
    conn: &Connection,
    session_id: &str,
    request_id: &str,
) -> Result<Option<Interaction>> {
    let sql = format!("{INTERACTION_SELECT} WHERE s.id = ?1 AND i.request_id = ?2");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![session_id, request_id])?;
    rows.next()?.map(interaction_from_row).transpose()
}

/// The smallest string greater than every string that starts with `prefix` (UTF-8 byte
/// order is code point order): `prefix` with its last char incremented (dropping trailing
/// `char::MAX`es). `None` when there is none (empty, or all `char::MAX`).
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Interactions whose request id starts with `prefix` (the exact id first, as it sorts
/// first), of one session (by pk) or of all sessions, by request id then session, at most
/// `limit`. A range scan over `interactions_by_request` (migration 0015).
pub(crate) fn interactions_by_request(
    conn: &Connection,
    session_pk: Option<i64>,
    prefix: &str,
    limit: usize,
) -> Result<Vec<Interaction>> {
    // Both bounds as plain comparisons (no `?2 IS NULL OR`), so SQLite scans only the range.
    let upper = prefix_upper_bound(prefix);
    let below = if upper.is_some() {
        "AND i.request_id < ?2"
    } else {
        "AND ?2 IS NULL"
    };
    let sql = format!(
        "{INTERACTION_SELECT} WHERE i.request_id >= ?1 {below}
         AND (?3 IS NULL OR i.session_pk = ?3)
         ORDER BY i.request_id, i.session_pk LIMIT ?4"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut rows = stmt.query(params![prefix, upper, session_pk, limit])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let i = interaction_from_row(row)?;
        // The bound is exact; this only guards against a collation surprise.
        if i.request_id.starts_with(prefix) {
            out.push(i);
        }
    }
    Ok(out)
}

/// Pending interactions of one session (by pk) or of all sessions, oldest first.
pub(crate) fn pending_interactions(
    conn: &Connection,
    session_pk: Option<i64>,
) -> Result<Vec<Interaction>> {
    let sql = format!(
        "{INTERACTION_SELECT} WHERE i.state = 'pending' AND (?1 IS NULL OR i.session_pk = ?1)
         ORDER BY i.created_ms, s.id, i.request_id"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([session_pk])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(interaction_from_row(row)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------- usage

pub(crate) fn turns(conn: &Connection, session_pk: i64) -> Result<Vec<StoredTurnUsage>> {
    let mut stmt = conn.prepare_cached(
        "SELECT turn, event_seq, model, input_tokens, output_tokens, cache_creation_input_tokens,
                cache_read_input_tokens, cost_usd, duration_ms, ts_ms
         FROM turn_usage WHERE session_pk = ?1 ORDER BY turn",
    )?;
    let mut rows = stmt.query([session_pk])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(StoredTurnUsage {
            turn: u64_from_sql(row.get(0)?, "turn")?,
            turn_usage: TurnUsage {
                event_seq: opt_u64(row, 1, "event_seq")?,
                model: row.get(2)?,
                usage: UsageTotals {
                    input_tokens: u64_from_sql(row.get(3)?, "input_tokens")?,
                    output_tokens: u64_from_sql(row.get(4)?, "output_tokens")?,
                    cache_creation_input_tokens: u64_from_sql(
                        row.get(5)?,
                        "cache_creation_input_tokens",
                    )?,
                    cache_read_input_tokens: u64_from_sql(row.get(6)?, "cache_read_input_tokens")?,
                    cost_usd: row.get(7)?,
                },
                duration_ms: opt_u64(row, 8, "duration_ms")?,
                ts_ms: row.get(9)?,
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQL's shift is the Rust one.
    #[test]
    fn the_sql_shift_is_event_seq_bits() {
        assert_eq!(seq_bits!(), EVENT_SEQ_BITS.to_string());
    }

    /// Every read of events seeks the session's id range in the table's own b-tree: none
    /// scans `events` (a scan would read every session's events for one page).
    #[test]
    fn event_reads_seek_the_session_id_range() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plan.db");
        drop(crate::Store::open(&path, crate::StoreOptions::default()).expect("open"));
        let conn = Connection::open(&path).expect("raw");
        let plan = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Vec<String> {
            let mut st = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("explain");
            st.query_map(args, |r| r.get::<_, String>(3))
                .expect("plan")
                .collect::<rusqlite::Result<_>>()
                .expect("rows")
        };
        let sessions = format!("SELECT s.pk, {LAST_SEQ_OF_S} FROM sessions s");
        let reads: [(&str, &[&dyn rusqlite::ToSql]); 3] = [
            (EVENTS_AFTER_SQL, params!["s", 0, 10]),
            (
                EVENTS_OF_KINDS_BEFORE_SQL,
                params!["s", 9, r#"["user"]"#, 10],
            ),
            (&sessions, params![]),
        ];
        for (sql, args) in reads {
            let steps = plan(sql, args);
            let on_events: Vec<&String> = steps
                .iter()
                .filter(|d| d.contains("events") || d.contains(" e "))
                .collect();
            assert!(!on_events.is_empty(), "{sql}: {steps:?}");
            for d in on_events {
                assert!(d.starts_with("SEARCH"), "{sql}: {d}");
                assert!(d.contains("INTEGER PRIMARY KEY"), "{sql}: {d}");
            }
        }
    }
}
