-- ostler store, schema version 15: interactions by request id across sessions.
--
-- GetInteraction looks an interaction up by its request id (or a prefix of one) without a
-- session id: a range scan `request_id >= prefix AND request_id < upper` over this index
-- (crates/ostler-store/src/rows.rs `interactions_by_request`). The primary key
-- (session_pk, request_id) serves lookups within one session only. Independent of any
-- other column; the table is not rebuilt.

CREATE INDEX interactions_by_request ON interactions (request_id, session_pk);
