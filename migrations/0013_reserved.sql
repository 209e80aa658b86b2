-- ostler store, schema version 13: reserved (no change).
--
-- Placeholder for the 0013 migration written on a parallel branch; this branch's own change
-- is 0014_session_archived.sql. Delete this file (and its line in
-- crates/ostler-store/src/migrate.rs) when the real 0013 is merged.
SELECT 1;
