//! Control requests in both directions: the CLI's (`can_use_tool`, `hook_callback`, ...)
//! answered through a [`Responder`], and ours (`interrupt`, `set_model`, ...) resolved by
//! `request_id` when the reader sees their `control_response`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ostler_protocol::Outbound;
use ostler_protocol::model::{
    CliRequest, ControlCancel, ControlOutcome, ControlRequest, ControlResponse, RawJson,
};
use ostler_protocol::outbound::{OutRequest, ResponseBody};
use tokio::sync::oneshot;

use super::error::{ControlError, Error, Result};
use super::shared::{Shared, WriteAck, lock};

/// The message of the answer given for an owner who dropped a [`Responder`].
pub const NO_DECISION: &str = "ostler: no decision was made for this request";

/// The answer to one control request from the CLI. Consumed by [`Responder::respond`];
/// dropped unanswered, it answers [`NO_DECISION`] (see the module docs of
/// [`crate::session`]).
#[derive(Debug)]
pub struct Responder {
    request_id: String,
    can_use_tool: bool,
    shared: Arc<Shared>,
    done: bool,
}

impl Responder {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Write the answer (queued behind anything already sent).
    pub fn respond(mut self, body: ResponseBody) -> Result<()> {
        self.done = true;
        answer(&self.shared, &self.request_id, body)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let body = if self.can_use_tool {
            ResponseBody::Deny {
                message: NO_DECISION.to_string(),
                interrupt: false,
            }
        } else {
            ResponseBody::Error {
                message: NO_DECISION.to_string(),
            }
        };
        if answer(&self.shared, &self.request_id, body).is_ok() {
            tracing::warn!(session = %self.shared.log_id, request_id = %self.request_id, "control request dropped unanswered; answered with no decision");
        }
    }
}

/// Writes the answer to the CLI's open request `request_id` (at most once).
fn answer(shared: &Shared, request_id: &str, body: ResponseBody) -> Result<()> {
    if !lock(&shared.open_requests).remove(request_id) {
        return Err(Error::NotPending(request_id.to_string()));
    }
    shared.touch();
    let line = Outbound::ControlResponse {
        request_id: request_id.to_string(),
        body,
    }
    .to_line();
    shared.queue_unacked(line)
}

/// The CLI sent `req`: it is open until answered or withdrawn; its responder.
pub(super) fn opened(shared: &Arc<Shared>, req: &ControlRequest) -> Responder {
    lock(&shared.open_requests).insert(req.request_id.clone());
    Responder {
        request_id: req.request_id.clone(),
        can_use_tool: matches!(req.request, CliRequest::CanUseTool(_)),
        shared: shared.clone(),
        done: false,
    }
}

/// The CLI withdrew a request; `true` when it was still open (answering it now writes
/// nothing and returns [`Error::NotPending`]).
pub(super) fn withdrawn(shared: &Shared, c: &ControlCancel) -> bool {
    lock(&shared.open_requests).remove(&c.request_id)
}

/// The CLI answered one of our requests: resolve its waiter.
pub(super) fn resolved(shared: &Shared, r: &ControlResponse) {
    if let Some(tx) = lock(&shared.pending).remove(&r.request_id) {
        let _ = tx.send(r.outcome.clone());
    }
}

/// The process is gone: our requests resolve to [`ControlError::ProcessGone`], the CLI's
/// can no longer be answered.
pub(super) fn clear(shared: &Shared) {
    lock(&shared.pending).clear();
    lock(&shared.open_requests).clear();
}

/// Sends a control request and awaits its `control_response` (see
/// [`super::SessionProcess::request`]).
pub(super) async fn request(
    shared: &Shared,
    request: OutRequest,
    extra: Duration,
) -> Result<Option<RawJson>, ControlError> {
    let sent = send(shared, request)?;
    wait(shared, sent, extra).await
}

/// A control request queued for stdin whose answer is awaited with [`wait`].
pub(super) struct Sent {
    request_id: String,
    rx: oneshot::Receiver<ControlOutcome>,
    ack: WriteAck,
}

impl Sent {
    /// The id the request went out with (its `control_response` carries it).
    pub(super) fn request_id(&self) -> &str {
        &self.request_id
    }
}

/// Queues a control request for stdin at once (ordered with every write queued before and
/// after this call) and registers its waiter. Used directly for `initialize` at spawn, which
/// must reach the CLI before the first user message.
pub(super) fn send(shared: &Shared, request: OutRequest) -> Result<Sent, ControlError> {
    if shared.exited() {
        return Err(ControlError::ProcessGone);
    }
    let n = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let request_id = format!("ostler-{}-{n}", shared.pid);
    let (tx, rx) = oneshot::channel();
    lock(&shared.pending).insert(request_id.clone(), tx);
    let line = Outbound::ControlRequest {
        request_id: request_id.clone(),
        request,
    }
    .to_line();
    shared.touch();
    match shared.queue(line) {
        Ok(ack) => Ok(Sent {
            request_id,
            rx,
            ack,
        }),
        Err(_) => {
            lock(&shared.pending).remove(&request_id);
            Err(ControlError::ProcessGone)
        }
    }
}

/// Awaits the answer to a request [`send`] queued, at most the control timeout plus `extra`.
pub(super) async fn wait(
    shared: &Shared,
    sent: Sent,
    extra: Duration,
) -> Result<Option<RawJson>, ControlError> {
    let Sent {
        request_id,
        rx,
        ack,
    } = sent;
    if ack.written().await.is_err() {
        lock(&shared.pending).remove(&request_id);
        return Err(ControlError::ProcessGone);
    }
    let timeout = shared.opts.control_timeout.saturating_add(extra);
    match ostler_metrics::control_request(tokio::time::timeout(timeout, rx)).await {
        Ok(Ok(outcome)) => outcome_result(outcome),
        Ok(Err(_)) => Err(ControlError::ProcessGone),
        Err(_) => {
            lock(&shared.pending).remove(&request_id);
            Err(ControlError::Timeout(timeout))
        }
    }
}

fn outcome_result(outcome: ControlOutcome) -> Result<Option<RawJson>, ControlError> {
    match outcome {
        ControlOutcome::Success { response } => Ok(response),
        ControlOutcome::Error { error, error_code } => {
            if error_code.as_deref() == Some("unsupported_request")
                || error.starts_with("Unsupported control request")
            {
                Err(ControlError::Unsupported { message: error })
            } else {
                Err(ControlError::Failed {
                    message: error,
                    code: error_code,
                })
            }
        }
    }
}
