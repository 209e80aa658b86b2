//! `SessionService.WatchSessions`: the daemon-wide feed ([`ostler_engine::Engine::watch`])
//! mapped to protobuf. Like `Subscribe`, the engine's watch is the response stream (no task,
//! no channel): tonic polls it only while the client's HTTP/2 window has room, so a slow
//! watcher slows only itself.

use std::pin::Pin;

use futures::StreamExt as _;
use ostler_engine as eng;
use ostler_proto::v1 as pb;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::convert;
use crate::error::ApiError;

/// `CreateSessionRequest.title`, in bytes (the store keeps at most 200 characters).
pub(crate) const TITLE_BYTES: usize = 1024;

/// The response stream of `WatchSessions`.
pub(crate) type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::FeedItem, Status>> + Send>>;

pub(crate) fn kind_to_pb(k: eng::FeedKind) -> pb::FeedKind {
    match k {
        eng::FeedKind::SessionCreated => pb::FeedKind::SessionCreated,
        eng::FeedKind::StateChanged => pb::FeedKind::StateChanged,
        eng::FeedKind::TurnCompleted => pb::FeedKind::TurnCompleted,
        eng::FeedKind::PermissionRequested => pb::FeedKind::PermissionRequested,
        eng::FeedKind::QuestionAsked => pb::FeedKind::QuestionAsked,
        eng::FeedKind::InteractionResolved => pb::FeedKind::Resolved,
        eng::FeedKind::ProcessExited => pb::FeedKind::ProcessExited,
        eng::FeedKind::HookPending => pb::FeedKind::HookPending,
        eng::FeedKind::ToolCallRequested => pb::FeedKind::ToolCallPending,
        eng::FeedKind::ElicitationRequested => pb::FeedKind::ElicitationPending,
        eng::FeedKind::DialogRequested => pb::FeedKind::DialogPending,
        eng::FeedKind::SessionDeleted => pb::FeedKind::SessionDeleted,
        eng::FeedKind::SessionUpdated => pb::FeedKind::SessionUpdated,
    }
}

/// The kinds a `kinds` filter entry selects (the reserved kinds select nothing yet).
fn kind_from_pb(field: &str, v: i32) -> Result<Option<eng::FeedKind>, Status> {
    let k = pb::FeedKind::try_from(v).map_err(|_| {
        Status::invalid_argument(format!("{field} is {v}, which is not a FeedKind"))
    })?;
    Ok(match k {
        pb::FeedKind::Unspecified => {
            return Err(Status::invalid_argument(format!(
                "{field} is FEED_KIND_UNSPECIFIED; name a kind or leave `kinds` empty"
            )));
        }
        pb::FeedKind::SessionCreated => Some(eng::FeedKind::SessionCreated),
        pb::FeedKind::StateChanged => Some(eng::FeedKind::StateChanged),
        pb::FeedKind::TurnCompleted => Some(eng::FeedKind::TurnCompleted),
        pb::FeedKind::PermissionRequested => Some(eng::FeedKind::PermissionRequested),
        pb::FeedKind::QuestionAsked => Some(eng::FeedKind::QuestionAsked),
        pb::FeedKind::Resolved => Some(eng::FeedKind::InteractionResolved),
        pb::FeedKind::ProcessExited => Some(eng::FeedKind::ProcessExited),
        pb::FeedKind::HookPending => Some(eng::FeedKind::HookPending),
        pb::FeedKind::ToolCallPending => Some(eng::FeedKind::ToolCallRequested),
        pb::FeedKind::ElicitationPending => Some(eng::FeedKind::ElicitationRequested),
        pb::FeedKind::DialogPending => Some(eng::FeedKind::DialogRequested),
        pb::FeedKind::SessionDeleted => Some(eng::FeedKind::SessionDeleted),
        pb::FeedKind::SessionUpdated => Some(eng::FeedKind::SessionUpdated),
    })
}

/// Validates a `WatchSessionsRequest`.
pub(crate) fn watch_request(r: pb::WatchSessionsRequest) -> Result<eng::WatchRequest, Status> {
    let states = convert::session_filters(&r.labels, &r.states)?;
    if r.kinds.len() > 32 {
        return Err(Status::invalid_argument(format!(
            "kinds has {} entries; at most 32 are allowed",
            r.kinds.len()
        )));
    }
    let mut kinds = Vec::new();
    for (i, k) in r.kinds.iter().enumerate() {
        if let Some(k) = kind_from_pb(&format!("kinds[{i}]"), *k)? {
            kinds.push(k);
        }
    }
    Ok(eng::WatchRequest {
        after_cursor: r.after_cursor,
        follow: r.follow,
        labels: r.labels.into_iter().collect(),
        states,
        // Only reserved kinds: `Some(empty)`, which matches nothing (yet).
        kinds: (!r.kinds.is_empty()).then_some(kinds),
    })
}

pub(crate) fn item_to_pb(i: &eng::FeedItem) -> Option<pb::FeedItem> {
    Some(pb::FeedItem {
        cursor: i.cursor,
        kind: kind_to_pb(i.kind) as i32,
        session_id: i.session_id.clone(),
        title: i.title.clone().unwrap_or_default(),
        cwd: i.cwd.clone(),
        labels: i
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        state: convert::state_to_pb(i.state) as i32,
        event: Some(convert::event_to_pb(&i.event)?),
    })
}

/// The `WatchSessions` response stream; shutdown ends it with UNAVAILABLE.
pub(crate) fn watch_sessions(
    engine: &eng::Engine,
    shutdown: &CancellationToken,
    r: pb::WatchSessionsRequest,
) -> Result<WatchStream, Status> {
    let req = watch_request(r)?;
    tracing::debug!(
        after_cursor = req.after_cursor,
        follow = req.follow,
        "watcher attached"
    );
    let items = Box::pin(
        engine
            .watch_checked(req)
            .map_err(|e| Status::from(ApiError::from(e)))?
            .into_stream(),
    );
    let state = Some((items, shutdown.clone()));
    let stream = futures::stream::unfold(state, |state| async move {
        let (mut items, shutdown) = state?;
        loop {
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    let e = Status::unavailable(
                        "the ostler daemon is shutting down; watch again with after_cursor \
                         set to the last cursor you received",
                    );
                    return Some((Err(e), None));
                }
                next = items.next() => next,
            };
            match next {
                None => return None,
                Some(Err(e)) => return Some((Err(Status::from(ApiError::from(e))), None)),
                Some(Ok(item)) => {
                    if let Some(p) = item_to_pb(&item) {
                        return Some((Ok(p), Some((items, shutdown))));
                    }
                }
            }
        }
    });
    Ok(Box::pin(stream))
}
