-- ostler store, schema version 13: retention of the feed's deletion items.
--
-- A deletion item (`feed_deleted`, version 11) is removed once it is older than the daemon's
-- `feed.deleted_retention_secs` and every configured notifier has passed it (the writer's
-- `Store::prune_feed_deletions`). `feed_pruned` holds its one row: the highest cursor pruned
-- so far (0: none), so that a watcher asking for items after an older cursor is told it
-- could miss deletions instead of missing them silently. Cursors are never reused: the
-- feed's AUTOINCREMENT counter does not go back when rows are deleted.

CREATE TABLE feed_pruned (
    id     INTEGER PRIMARY KEY CHECK (id = 0),
    cursor INTEGER NOT NULL
) STRICT;

INSERT INTO feed_pruned (id, cursor) VALUES (0, 0);

CREATE INDEX feed_deleted_by_time ON feed_deleted (deleted_ms);
