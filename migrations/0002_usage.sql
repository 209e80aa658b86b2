-- ostler store, schema version 2: usage accounting.
-- Per-turn usage rows plus running totals on the session row, kept in step by the store
-- (both are written in the same transaction). Existing sessions start at zero.

ALTER TABLE sessions ADD COLUMN turns                       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN input_tokens                INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN output_tokens               INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cache_read_input_tokens     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cost_usd                    REAL    NOT NULL DEFAULT 0;

CREATE TABLE turn_usage (
    session_pk                  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    turn                        INTEGER NOT NULL CHECK (turn >= 1),
    event_seq                   INTEGER,            -- the event (e.g. the result) it came from
    model                       TEXT,
    input_tokens                INTEGER NOT NULL,
    output_tokens               INTEGER NOT NULL,
    cache_creation_input_tokens INTEGER NOT NULL,
    cache_read_input_tokens     INTEGER NOT NULL,
    cost_usd                    REAL    NOT NULL,
    duration_ms                 INTEGER,
    ts_ms                       INTEGER NOT NULL,
    PRIMARY KEY (session_pk, turn)
) STRICT, WITHOUT ROWID;
