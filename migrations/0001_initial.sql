-- ostler store, schema version 1: sessions, their labels, the per-session event log and
-- the interactions (permission requests and questions) raised by a session.
--
-- Conventions: all times are Unix epoch milliseconds (INTEGER). Tables are STRICT.
-- Sessions are referenced by an integer surrogate key (`pk`) so that the event log does
-- not repeat the textual ostler id on every row; every child row is removed with its
-- session (ON DELETE CASCADE, foreign keys are enabled on every connection).

CREATE TABLE sessions (
    pk                INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE,     -- ostler session id
    claude_session_id TEXT,                        -- the CLI's own session id, once known
    cwd               TEXT    NOT NULL,
    model             TEXT,
    permission_mode   TEXT,
    cli_release       TEXT,
    state             TEXT    NOT NULL,
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL,
    exit_code         INTEGER,
    exit_signal       INTEGER,
    exit_reason       TEXT,
    exited_ms         INTEGER
) STRICT;

CREATE INDEX sessions_by_created ON sessions (created_ms, id);
CREATE INDEX sessions_by_state ON sessions (state, created_ms, id);

CREATE TABLE session_labels (
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    key        TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    PRIMARY KEY (session_pk, key)
) STRICT, WITHOUT ROWID;

CREATE INDEX session_labels_by_kv ON session_labels (key, value);

-- The event log. `seq` is assigned by the store's single writer: 1, 2, 3, ... per session,
-- never reused, never skipped. `payload` is the engine's canonical encoding, `raw` the
-- CLI's original NDJSON line when there is one; both are stored as given and returned
-- as stored.
CREATE TABLE events (
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    kind       TEXT    NOT NULL,
    payload    BLOB    NOT NULL,
    raw        BLOB,
    ts_ms      INTEGER NOT NULL,
    PRIMARY KEY (session_pk, seq)
) STRICT;

-- Permission requests and questions. A row is created `pending`; exactly one decision moves
-- it to a final state (compare-and-set on state = 'pending').
CREATE TABLE interactions (
    session_pk  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    request_id  TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('permission', 'question')),
    tool_name   TEXT,
    input       BLOB    NOT NULL,                  -- JSON as received
    suggestions BLOB,                              -- JSON as received
    event_seq   INTEGER,                           -- the event that carried the request
    state       TEXT    NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'allowed', 'denied', 'answered', 'expired', 'cancelled')),
    created_ms  INTEGER NOT NULL,
    decided_by  TEXT,                              -- client id, or "rule:<name>"
    decided_ms  INTEGER,
    response    BLOB,                              -- what was sent back to the CLI
    PRIMARY KEY (session_pk, request_id)
) STRICT;

CREATE INDEX interactions_pending ON interactions (session_pk, created_ms) WHERE state = 'pending';
