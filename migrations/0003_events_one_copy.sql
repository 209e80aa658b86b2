-- ostler store, schema version 3: one copy of each event, one b-tree for the event log.
--
-- `events` is rebuilt:
-- - The row key is `id = (session_pk << 32) + seq` (INTEGER PRIMARY KEY): a session's log is
--   one contiguous range of the table's own b-tree, so appending writes no second index and
--   replay is a range scan (no index lookup per row). `session_pk` and `seq` remain readable
--   as virtual columns (they take no space). A session holds at most 2^32 - 1 events and
--   session keys stay below 2^31 (the store refuses more, with an error).
-- - `codec` says how `payload` is kept: 0 = as given; 1 = as a delta against `raw` (the
--   CLI's line, kept verbatim), from which the store rebuilds the payload byte for byte on
--   read. Existing rows are converted with `ostler_delta(payload, raw)`, a function the store
--   registers on its write connection (NULL when the delta would not be smaller).
-- - No foreign key: deleting a session deletes its range of events explicitly (a cascade
--   would need an index on session_pk, i.e. a second b-tree written on every append).

CREATE TABLE events_v3 (
    id         INTEGER PRIMARY KEY,
    kind       TEXT    NOT NULL,
    ts_ms      INTEGER NOT NULL,
    codec      INTEGER NOT NULL DEFAULT 0 CHECK (codec IN (0, 1)),
    payload    BLOB    NOT NULL,
    raw        BLOB,
    session_pk INTEGER GENERATED ALWAYS AS (id >> 32) VIRTUAL,
    seq        INTEGER GENERATED ALWAYS AS (id & 4294967295) VIRTUAL
) STRICT;

INSERT INTO events_v3 (id, kind, ts_ms, codec, payload, raw)
SELECT (session_pk << 32) + seq, kind, ts_ms,
       CASE WHEN d IS NULL THEN 0 ELSE 1 END, COALESCE(d, payload), raw
FROM (SELECT session_pk, seq, kind, ts_ms, raw, payload, ostler_delta(payload, raw) AS d
      FROM events)
ORDER BY session_pk, seq;

DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
