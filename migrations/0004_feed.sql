-- ostler store, schema version 4: the daemon-wide feed and session titles.
--
-- `feed` lists the attention-worthy events of every session in commit order. Rows are
-- written by a trigger on `events`, so each is committed in the same transaction as its
-- event (a watcher never sees an event that is not stored, and never misses one that is).
-- `id` is AUTOINCREMENT: never reused, even after the newest rows are deleted with their
-- session, so a watcher's cursor stays meaningful across deletes and restarts.

CREATE TABLE feed (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    kind       TEXT    NOT NULL
) STRICT;

CREATE INDEX feed_by_session ON feed (session_pk);

-- The first event of a session is the engine's `session_created` notice.
CREATE TRIGGER feed_events AFTER INSERT ON events
WHEN NEW.kind IN ('state_changed', 'turn_completed', 'permission_requested', 'question_asked',
                  'interaction_resolved', 'process_exited')
     OR (NEW.kind = 'engine_notice' AND NEW.seq = 1)
BEGIN
    INSERT INTO feed (session_pk, seq, kind)
    VALUES (NEW.session_pk, NEW.seq,
            CASE WHEN NEW.kind = 'engine_notice' THEN 'session_created' ELSE NEW.kind END);
END;

-- A short name for people: `--name`, else the first prompt shortened.
ALTER TABLE sessions ADD COLUMN title TEXT;

-- Delivery cursors of the configured notifiers (webhooks), by notifier name.
CREATE TABLE notify_cursors (
    name   TEXT    PRIMARY KEY,
    cursor INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
