-- ostler store, schema version 9: one b-tree per event. Until version 8 `events` was a rowid
-- table with PRIMARY KEY (session_pk, seq), i.e. the table's own b-tree plus a unique index
-- on (session_pk, seq): every append wrote two b-trees (and in the WAL, two page images per
-- commit where one would do), and checked the session in `sessions` (the foreign key).
--
-- Now the row id *is* the key: `id = session_pk * 2^36 + seq` (crates/ostler-store/src/rows.rs
-- `event_id`). A session's events are one contiguous id range in seq order, so appends,
-- replay pages (`id > lo AND id <= hi ORDER BY id`) and the last seq (the range's greatest
-- id) use the table's own b-tree. `session_pk` and `seq` stay readable as VIRTUAL generated
-- columns (computed when read, not stored). Bounds, checked by the writer before an insert:
-- seq < 2^36 (68.7 billion events per session), session pk < 2^27 (134 million sessions).
--
-- `id > 0`: a pk of 2^27 or more would overflow the shift into a negative id; the copy below
-- then fails (and the migration with it, leaving version 8 intact) instead of mixing sessions.
--
-- The foreign key's ON DELETE CASCADE becomes a trigger that deletes the session's id range.
-- Existing rows are copied as they are (same codec, payload and raw bytes), in id order.

CREATE TABLE events_v9 (
    id         INTEGER PRIMARY KEY CHECK (id > 0 AND (id & 68719476735) >= 1),
    kind       TEXT    NOT NULL,
    ts_ms      INTEGER NOT NULL,
    codec      INTEGER NOT NULL DEFAULT 0 CHECK (codec >= 0 AND codec <= 6 AND codec != 5),
    payload    BLOB    NOT NULL,
    raw        BLOB,
    session_pk INTEGER GENERATED ALWAYS AS (id >> 36) VIRTUAL,
    seq        INTEGER GENERATED ALWAYS AS (id & 68719476735) VIRTUAL
) STRICT;

INSERT INTO events_v9 (id, kind, ts_ms, codec, payload, raw)
SELECT (session_pk << 36) | seq, kind, ts_ms, codec, payload, raw FROM events
ORDER BY session_pk, seq;

DROP TABLE events;
ALTER TABLE events_v9 RENAME TO events;

CREATE TRIGGER events_of_deleted_session AFTER DELETE ON sessions
BEGIN
    DELETE FROM events WHERE id >= (old.pk << 36) AND id < ((old.pk + 1) << 36);
END;
