-- ostler store, schema version 12: interactions of kind `dialog` (a dialog the CLI asks the
-- host for, its `request_user_dialog` control request, of a kind the session declared in
-- `dialog_kinds`). SQLite cannot change a CHECK constraint in place, so the table is rebuilt
-- with the same columns, rows and index (as in versions 6 and 10). The feed needs nothing:
-- its rows are written by the writer (version 7), and `kind` is not constrained there.

CREATE TABLE interactions_new (
    session_pk  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    request_id  TEXT    NOT NULL,
    kind        TEXT    NOT NULL
                CHECK (kind IN ('permission', 'question', 'hook', 'tool_call', 'elicitation', 'dialog')),
    tool_name   TEXT,
    input       BLOB    NOT NULL,
    suggestions BLOB,
    event_seq   INTEGER,
    state       TEXT    NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'allowed', 'denied', 'answered', 'expired', 'cancelled')),
    created_ms  INTEGER NOT NULL,
    decided_by  TEXT,
    decided_ms  INTEGER,
    response    BLOB,
    PRIMARY KEY (session_pk, request_id)
) STRICT;

INSERT INTO interactions_new SELECT session_pk, request_id, kind, tool_name, input, suggestions,
    event_seq, state, created_ms, decided_by, decided_ms, response FROM interactions;
DROP TABLE interactions;
ALTER TABLE interactions_new RENAME TO interactions;
CREATE INDEX interactions_pending ON interactions (session_pk, created_ms) WHERE state = 'pending';
