-- ostler store, schema version 6: interactions of kind `tool_call` (issue 11, client-hosted
-- tools). SQLite cannot change a CHECK constraint in place, so the table is rebuilt with
-- the same columns, rows and index.

CREATE TABLE interactions_new (
    session_pk  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    request_id  TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('permission', 'question', 'hook', 'tool_call')),
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

-- The feed also lists pending tool calls (`tool_call_requested`) and their resolutions
-- (as `interaction_resolved`, like every other settlement), next to version 5's hook calls.
DROP TRIGGER feed_events;
CREATE TRIGGER feed_events AFTER INSERT ON events
WHEN NEW.kind IN ('state_changed', 'turn_completed', 'permission_requested', 'question_asked',
                  'interaction_resolved', 'process_exited', 'hook_requested', 'hook_resolved',
                  'tool_call_requested', 'tool_call_resolved')
     OR (NEW.kind = 'engine_notice' AND NEW.seq = 1)
BEGIN
    INSERT INTO feed (session_pk, seq, kind)
    VALUES (NEW.session_pk, NEW.seq,
            CASE NEW.kind
                WHEN 'engine_notice' THEN 'session_created'
                WHEN 'hook_requested' THEN 'hook_pending'
                WHEN 'hook_resolved' THEN 'interaction_resolved'
                WHEN 'tool_call_resolved' THEN 'interaction_resolved'
                ELSE NEW.kind
            END);
END;
