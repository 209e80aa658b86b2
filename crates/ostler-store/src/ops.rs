//! The write operations, each run by the writer thread in the current group transaction,
//! undone alone when it fails (see `writer.rs`). `Store`'s write methods queue them.

use rusqlite::{Connection, params};

use crate::codec::EncodedEvent;
use crate::error::{Error, Result};
use crate::feed::FeedKind;
use crate::rows::{self, u64_from_sql, u64_to_sql};
use crate::types::*;
use crate::writer::{Ctx, Slot};

pub(crate) fn append_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    events: &[EncodedEvent],
) -> Result<Vec<u64>> {
    let slot = ctx.slot(session_id)?;
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let conn = ctx.conn;
    // The whole batch's ids are checked up front (one session's range; see `event_id`):
    // event `seq` is then `base + seq`.
    rows::event_id(slot.pk, slot.last_seq.saturating_add(events.len() as u64))?;
    let base = rows::event_id(slot.pk, 0)?;
    let mut seqs = Vec::with_capacity(events.len());
    let mut seq = slot.last_seq;
    // Full chunks of rows go in one statement: its start, reset and the call per row are
    // paid once per chunk (each row still seeks its place in the b-tree).
    let mut chunks = events.chunks_exact(INSERT_CHUNK);
    if events.len() >= INSERT_CHUNK {
        let mut stmt = conn.prepare_cached(&INSERT_EVENTS_CHUNK)?;
        for chunk in chunks.by_ref() {
            for (i, ev) in chunk.iter().enumerate() {
                let id = base + u64_to_sql(seq + 1 + i as u64, "seq")?;
                bind_event(&mut stmt, i * EVENT_COLUMNS, id, ev)?;
            }
            stmt.raw_execute()?;
            for ev in chunk {
                seq += 1;
                feed_row(ctx, slot.pk, seq, &ev.kind)?;
                seqs.push(seq);
            }
        }
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut stmt = conn.prepare_cached(&INSERT_EVENT)?;
        for ev in rest {
            seq += 1;
            bind_event(&mut stmt, 0, base + u64_to_sql(seq, "seq")?, ev)?;
            stmt.raw_execute()?;
            feed_row(ctx, slot.pk, seq, &ev.kind)?;
            seqs.push(seq);
        }
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

/// The columns of an `events` row as [`bind_event`] binds them.
const EVENT_COLUMNS: usize = 6;
/// Rows per statement of [`INSERT_EVENTS_CHUNK`] (a batch's rest goes row by row).
const INSERT_CHUNK: usize = 16;
/// The insert of one `events` row.
static INSERT_EVENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| insert_events(1));
/// The insert of [`INSERT_CHUNK`] rows.
static INSERT_EVENTS_CHUNK: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| insert_events(INSERT_CHUNK));

/// `INSERT OR FAIL INTO events ... VALUES` for `rows` rows, their parameters numbered in
/// order.
///
/// `OR FAIL`, not the default `ABORT`: a statement that may abort after writing some of its
/// rows makes SQLite copy every page it changes that existed before it into a statement
/// journal, to undo the statement alone. A failed insert fails its whole command, and the
/// writer undoes the command (its savepoint, or the transaction), so the statement needs no
/// undo of its own.
fn insert_events(rows: usize) -> String {
    let rows: Vec<String> = (0..rows)
        .map(|r| {
            let p: Vec<String> = (1..=EVENT_COLUMNS)
                .map(|c| format!("?{}", r * EVENT_COLUMNS + c))
                .collect();
            format!("({})", p.join(", "))
        })
        .collect();
    format!(
        "INSERT OR FAIL INTO events (id, kind, ts_ms, codec, payload, raw) VALUES {}",
        rows.join(", ")
    )
}

/// Binds `ev`'s columns to the parameters after `at` (1-based: `at + 1` ..).
fn bind_event(
    stmt: &mut rusqlite::Statement<'_>,
    at: usize,
    id: i64,
    ev: &EncodedEvent,
) -> Result<()> {
    stmt.raw_bind_parameter(at + 1, id)?;
    stmt.raw_bind_parameter(at + 2, &*ev.kind)?;
    stmt.raw_bind_parameter(at + 3, ev.ts_ms)?;
    stmt.raw_bind_parameter(at + 4, ev.codec)?;
    stmt.raw_bind_parameter(at + 5, &ev.payload[..])?;
    stmt.raw_bind_parameter(at + 6, ev.raw.as_deref())?;
    Ok(())
}

/// The feed's row for event `seq` of kind `kind`, if the kind enters the feed.
fn feed_row(ctx: &mut Ctx<'_>, pk: i64, seq: u64, kind: &str) -> Result<()> {
    if let Some(kind) = FeedKind::of_event(kind, seq) {
        ctx.conn
            .prepare_cached("INSERT INTO feed (session_pk, seq, kind) VALUES (?1, ?2, ?3)")?
            .execute(params![pk, u64_to_sql(seq, "seq")?, kind.as_str()])?;
        ctx.feed_touched = true;
    }
    Ok(())
}

pub(crate) fn insert_labels(
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

pub(crate) fn create_session_op(ctx: &mut Ctx<'_>, s: &NewSession) -> Result<()> {
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
        s.state.as_str(),
        s.created_ms
    ])?;
    let pk = conn.last_insert_rowid();
    insert_labels(conn, pk, &s.labels)?;
    ctx.set_slot(&s.id, Some(Slot { pk, last_seq: 0 }));
    Ok(())
}

pub(crate) fn update_session_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    p: &SessionPatch,
) -> Result<()> {
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
        p.state.map(SessionState::as_str),
        p.updated_ms
    ])?;
    if let Some(exit) = &p.exit {
        conn.prepare_cached(
            "UPDATE sessions SET exit_code = ?2, exit_signal = ?3, exit_reason = ?4, exited_ms = ?5
             WHERE pk = ?1",
        )?
        .execute(params![
            slot.pk,
            exit.facts.code,
            exit.facts.signal,
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

pub(crate) fn delete_session_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    deleted_ms: i64,
) -> Result<()> {
    let slot = ctx.slot(session_id)?;
    let conn = ctx.conn;
    // The feed item of the deletion (migration 0011), in this transaction. Its cursor is the
    // feed's next id: a feed row is inserted for the session (the AUTOINCREMENT counter
    // moves past it) and goes with the session below, so no reader ever sees it.
    let next_seq = u64_to_sql(slot.last_seq.saturating_add(1), "seq")?;
    conn.prepare_cached("INSERT INTO feed (session_pk, seq, kind) VALUES (?1, ?2, ?3)")?
        .execute(params![
            slot.pk,
            next_seq,
            FeedKind::SessionDeleted.as_str()
        ])?;
    let cursor = conn.last_insert_rowid();
    conn.prepare_cached(
        "INSERT INTO feed_deleted (id, session_id, seq, title, cwd, state, deleted_ms)
         SELECT ?2, id, ?3, title, cwd, state, ?4 FROM sessions WHERE pk = ?1",
    )?
    .execute(params![slot.pk, cursor, next_seq, deleted_ms])?;
    conn.prepare_cached(
        "INSERT INTO feed_deleted_labels (feed_id, key, value)
         SELECT ?2, key, value FROM session_labels WHERE session_pk = ?1",
    )?
    .execute(params![slot.pk, cursor])?;
    ctx.feed_touched = true;
    // Labels, interactions, usage and feed rows go with it (ON DELETE CASCADE), events by the trigger
    // `events_of_deleted_session` (migration 0009).
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

pub(crate) fn upsert_interaction_op(ctx: &mut Ctx<'_>, i: &NewInteraction) -> Result<Interaction> {
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

pub(crate) fn decide_op(
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

/// Events plus the writes that belong to them, in one transaction (see
/// [`crate::Store::append_with`]).
pub(crate) fn append_with_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    events: &[EncodedEvent],
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

pub(crate) fn close_pending_op(
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

pub(crate) fn record_turn_op(ctx: &mut Ctx<'_>, session_id: &str, t: &TurnUsage) -> Result<u64> {
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

/// A client's change of title, labels and archived mark, with the event recording it (built
/// by `notice` from what actually changed) and its `session_updated` feed row, in this one
/// operation. Nothing is written when nothing would change.
pub(crate) fn update_meta_op(
    ctx: &mut Ctx<'_>,
    session_id: &str,
    p: &MetaPatch,
    notice: &MetaNotice,
) -> Result<MetaUpdated> {
    let slot = ctx.slot(session_id)?;
    let conn = ctx.conn;
    let (title, archived): (Option<String>, i64) = conn
        .prepare_cached("SELECT title, archived FROM sessions WHERE pk = ?1")?
        .query_row([slot.pk], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let labels = rows::labels(conn, slot.pk)?;
    let mut change = MetaChange::default();
    if let Some(t) = &p.title {
        let new = crate::feed::shorten_title(t, crate::feed::MAX_TITLE_CHARS)
            .ok_or_else(|| Error::InvalidArgument("the title is empty".into()))?;
        if title.as_deref() != Some(new.as_str()) {
            change.title = Some((title, new));
        }
    }
    for (k, v) in &p.set_labels {
        if labels.get(k) != Some(v) {
            change.labels_set.insert(k.clone(), v.clone());
        }
    }
    for k in &p.remove_labels {
        if labels.contains_key(k) && !change.labels_removed.contains(k) {
            change.labels_removed.push(k.clone());
        }
    }
    if let Some(a) = p.archived
        && a != (archived != 0)
    {
        change.archived = Some(a);
    }
    if change.is_empty() {
        return Ok(MetaUpdated { change, seq: None });
    }
    let after = labels.len()
        + change
            .labels_set
            .keys()
            .filter(|k| !labels.contains_key(*k))
            .count()
        - change.labels_removed.len();
    if p.max_labels > 0 && after > p.max_labels {
        return Err(Error::InvalidArgument(format!(
            "the session would carry {after} labels, more than {}",
            p.max_labels
        )));
    }
    conn.prepare_cached(
        "UPDATE sessions SET title = COALESCE(?2, title), archived = COALESCE(?3, archived),
                             updated_ms = ?4
         WHERE pk = ?1",
    )?
    .execute(params![
        slot.pk,
        change.title.as_ref().map(|(_, new)| new),
        change.archived.map(i64::from),
        p.updated_ms
    ])?;
    let mut set = conn.prepare_cached(
        "INSERT INTO session_labels (session_pk, key, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (session_pk, key) DO UPDATE SET value = excluded.value",
    )?;
    for (k, v) in &change.labels_set {
        set.execute(params![slot.pk, k, v])?;
    }
    let mut remove =
        conn.prepare_cached("DELETE FROM session_labels WHERE session_pk = ?1 AND key = ?2")?;
    for k in &change.labels_removed {
        remove.execute(params![slot.pk, k])?;
    }
    let event = crate::codec::EncodedEvent::new(notice(&change)?);
    let seq = append_op(ctx, session_id, std::slice::from_ref(&event))?
        .first()
        .copied()
        .ok_or_else(|| Error::InvalidData("the update's notice got no seq".into()))?;
    ctx.conn
        .prepare_cached("INSERT INTO feed (session_pk, seq, kind) VALUES (?1, ?2, ?3)")?
        .execute(params![
            slot.pk,
            u64_to_sql(seq, "seq")?,
            FeedKind::SessionUpdated.as_str()
        ])?;
    ctx.feed_touched = true;
    Ok(MetaUpdated {
        change,
        seq: Some(seq),
    })
}
