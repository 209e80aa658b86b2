-- ostler store, schema version 14: a session's archived mark (UpdateSession).
--
-- `archived` is 1 for a session a client archived (UpdateSession with archived = true;
-- the Agent SDK's archiveSession), 0 otherwise. Archiving does not stop the process or
-- change the log; a SendMessage to an archived session clears the mark. The change and
-- the `session_updated` notice recording it commit in one transaction
-- (crates/ostler-store/src/ops.rs `update_meta_op`). Independent of any other column.

ALTER TABLE sessions ADD COLUMN archived INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1));
