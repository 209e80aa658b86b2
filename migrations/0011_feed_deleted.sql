-- ostler store, schema version 11: a feed item for a deleted session (FEED_KIND_SESSION_DELETED).
--
-- `feed` rows reference their session (`session_pk`, ON DELETE CASCADE), so the item that
-- outlives the session is kept here, with what the session was when it was deleted: its
-- id, title, working directory, state and labels (so `labels` and `states` filters apply to
-- it), the seq its next event would have had (`seq`, in no log), and when it was deleted.
--
-- `id` is the item's feed cursor, taken from the feed's AUTOINCREMENT counter by the same
-- deletion (crates/ostler-store/src/ops.rs `delete_session_op`: a feed row is inserted for the
-- session and goes with it), so feed cursors stay one increasing sequence that is never
-- reused. The row is written in the deletion's transaction.

CREATE TABLE feed_deleted (
    id         INTEGER PRIMARY KEY,
    session_id TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    title      TEXT,
    cwd        TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    deleted_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE feed_deleted_labels (
    feed_id INTEGER NOT NULL REFERENCES feed_deleted (id) ON DELETE CASCADE,
    key     TEXT    NOT NULL,
    value   TEXT    NOT NULL,
    PRIMARY KEY (feed_id, key)
) STRICT, WITHOUT ROWID;
