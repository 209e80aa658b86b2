-- ostler store, schema version 7: feed rows are written by the writer's append, in the same
-- savepoint as their event (crates/ostler-store/src/ops.rs `feed_kind`), instead of by the
-- row trigger of versions 4-6. A row trigger runs a sub-program for every inserted event,
-- also for the ~95 % of events whose kind never enters the feed: it cost more than the insert
-- of the event itself (measured: docs/performance.md, "feed trigger"). The mapping is the
-- same as version 6's trigger; existing feed rows stay as they are.
DROP TRIGGER feed_events;
