//! What the engine tells `ostler-metrics`: read off the events it has just committed, so
//! one call in the hub ([`committed`]) counts every appended event and every resolved
//! permission request or question, whoever resolved it (client, rule, expiry, CLI, engine).

use std::sync::Arc;

use crate::types::{EngineEvent, EventPayload};

/// `events` were persisted (those without a seq are live-only and were not stored).
pub(crate) fn committed(events: &[Arc<EngineEvent>]) {
    ostler_metrics::events_appended(events.iter().filter(|e| e.seq.is_some()).count());
    for e in events {
        if let EventPayload::InteractionResolved(r) = &e.payload {
            ostler_metrics::interaction_decided(
                r.kind.as_str(),
                &r.decided_by,
                r.resolution.as_str(),
            );
        }
    }
}
