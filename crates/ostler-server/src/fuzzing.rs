//! The request conversions, reachable from outside for `ostler-fuzz` only (not a stable
//! API): each takes a whole request message and says whether it converts.

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use tonic::Status;

use crate::convert;

pub fn create_session(r: pb::CreateSessionRequest) -> Result<(), Status> {
    convert::create_session(r, eng::ClientRef::default()).map(drop)
}

pub fn list_sessions(r: pb::ListSessionsRequest) -> Result<(), Status> {
    convert::list_sessions(r).map(drop)
}

pub fn send_message(r: pb::SendMessageRequest) -> Result<(), Status> {
    convert::message_content("content", r.content)?;
    convert::delivery(r.priority, r.verbatim, r.context_only, r.pasted).map(drop)
}

pub fn respond_to_permission(r: pb::RespondToPermissionRequest) -> Result<(), Status> {
    convert::permission_response(r.decision).map(drop)
}

pub fn answer_question(r: pb::AnswerQuestionRequest) -> Result<(), Status> {
    convert::answers(r.answers).map(drop)
}

/// The outbound conversion of an engine event (`None`: not sent to clients).
pub fn event_to_pb(e: &eng::EngineEvent) -> Option<pb::SessionEvent> {
    convert::event_to_pb(e)
}
