-- ostler store, schema version 3: one copy of each event.
--
-- `events` gains `codec`, which says how `payload` is kept: 0 = as given; 1 = as a delta
-- against `raw` (the CLI's line, kept verbatim), from which the store rebuilds the payload
-- byte for byte on read (crates/ostler-store/src/codec.rs). The table is rebuilt so that
-- existing rows are converted and stored compactly: `ostler_delta(payload, raw)` is a
-- function the store registers on its write connection (NULL when the delta would not be
-- smaller). Small columns come first and the large `raw` last, so reading `payload` and
-- the small columns of a row whose line spills to overflow pages does not walk them.
--
-- The layout is otherwise unchanged on purpose: rows in append order (rowid) plus the
-- (session_pk, seq) primary-key index. Keying the rows by session instead (one b-tree) was
-- measured: fewer WAL frames per event for one session, but up to 2x more when many
-- sessions append small groups (each session's tail is its own leaf page).

CREATE TABLE events_v3 (
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    kind       TEXT    NOT NULL,
    ts_ms      INTEGER NOT NULL,
    codec      INTEGER NOT NULL DEFAULT 0 CHECK (codec IN (0, 1)),
    payload    BLOB    NOT NULL,
    raw        BLOB,
    PRIMARY KEY (session_pk, seq)
) STRICT;

INSERT INTO events_v3 (session_pk, seq, kind, ts_ms, codec, payload, raw)
SELECT session_pk, seq, kind, ts_ms,
       CASE WHEN d IS NULL THEN 0 ELSE 1 END, COALESCE(d, payload), raw
FROM (SELECT session_pk, seq, kind, ts_ms, raw, payload, ostler_delta(payload, raw) AS d
      FROM events ORDER BY rowid);

DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
