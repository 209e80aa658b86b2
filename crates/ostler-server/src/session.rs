//! `ostler.v1.SessionService` on top of [`ostler_engine::Engine`].

use std::pin::Pin;

use futures::StreamExt as _;
use ostler_engine as eng;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_server::SessionService;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::convert::{self, required};
use crate::error::ApiError;

/// Metadata header naming the calling client (recorded as `client:<id>`).
pub const CLIENT_HEADER: &str = "x-ostler-client";

/// The session service.
#[derive(Clone, Debug)]
pub struct SessionSvc {
    engine: eng::Engine,
    shutdown: CancellationToken,
}

impl SessionSvc {
    pub fn new(engine: eng::Engine, shutdown: CancellationToken) -> Self {
        Self { engine, shutdown }
    }

    /// UNAVAILABLE while the store cannot write: new sessions and messages would only be
    /// accepted to wait for it (or be lost).
    fn store_writable(&self) -> Result<(), Status> {
        match self.engine.store_write_fault() {
            Some(reason) => Err(Status::unavailable(crate::error::clip_message(format!(
                "store not writable: {reason}"
            )))),
            None => Ok(()),
        }
    }
}

fn client_of<T>(req: &Request<T>) -> eng::ClientRef {
    let id = req
        .metadata()
        .get(CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().chars().take(128).collect::<String>())
        .unwrap_or_default();
    eng::ClientRef::new(id)
}

fn session_id(raw: &str) -> Result<&str, Status> {
    required("session_id", raw)
}

type Res<T> = Result<Response<T>, Status>;

fn ok<T>(v: T) -> Res<T> {
    Ok(Response::new(v))
}

/// Runs a handler body in a span carrying the session id, mapping engine errors.
async fn in_session<T, F>(method: &'static str, session_id: &str, f: F) -> Res<T>
where
    F: std::future::Future<Output = Result<T, ApiError>>,
{
    let span = tracing::info_span!("rpc", method, session_id = %session_id);
    match f.instrument(span.clone()).await {
        Ok(v) => ok(v),
        Err(ApiError(status)) => {
            span.in_scope(
                || tracing::debug!(code = ?status.code(), message = status.message(), "rpc failed"),
            );
            Err(status)
        }
    }
}

#[tonic::async_trait]
impl SessionService for SessionSvc {
    async fn create_session(&self, req: Request<pb::CreateSessionRequest>) -> Res<pb::Session> {
        let client = client_of(&req);
        let create = convert::create_session(req.into_inner(), client)?;
        self.store_writable()?;
        let info = self
            .engine
            .create_session(create)
            .await
            .map_err(ApiError::from)?;
        tracing::info!(session_id = %info.id, cwd = %info.cwd, "session created");
        ok(convert::session_to_pb(&info))
    }

    async fn get_session(&self, req: Request<pb::GetSessionRequest>) -> Res<pb::Session> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("GetSession", id, async {
            Ok(convert::session_to_pb(&self.engine.get_session(id).await?))
        })
        .await
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Res<pb::ListSessionsResponse> {
        let list = convert::list_sessions(req.into_inner())?;
        let page = self
            .engine
            .list_sessions(list)
            .await
            .map_err(ApiError::from)?;
        ok(pb::ListSessionsResponse {
            sessions: page.sessions.iter().map(convert::session_to_pb).collect(),
            next_page_token: page.next_page_token.unwrap_or_default(),
        })
    }

    async fn send_message(
        &self,
        req: Request<pb::SendMessageRequest>,
    ) -> Res<pb::SendMessageResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let content = convert::message_content("content", r.content)?;
        let delivery = convert::delivery(r.priority, r.verbatim, r.context_only, r.pasted)?;
        convert::bounded(
            "client_message_id",
            &r.client_message_id,
            convert::limits::ID_BYTES,
        )?;
        let client_message_id =
            (!r.client_message_id.trim().is_empty()).then(|| r.client_message_id.trim().to_owned());
        self.store_writable()?;
        in_session("SendMessage", id, async {
            let out = self
                .engine
                .send_message(
                    id,
                    eng::SendMessage {
                        content,
                        client_message_id,
                        client,
                        delivery,
                    },
                )
                .await?;
            Ok(pb::SendMessageResponse {
                seq: out.seq,
                duplicate: out.duplicate,
                message_id: out.message_id.unwrap_or_default(),
            })
        })
        .await
    }

    type SubscribeStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Res<Self::SubscribeStream> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?.to_owned();
        let span = tracing::info_span!("subscribe", session_id = %id, after_seq = r.after_seq);
        let sub = self
            .engine
            .subscribe(eng::SubscribeRequest {
                session_id: id.clone(),
                after_seq: r.after_seq,
                include_partials: r.include_partial,
                follow: r.follow,
            })
            .instrument(span.clone())
            .await
            .map_err(ApiError::from)?;
        // The subscription itself is the stream: tonic polls it only while this client's
        // HTTP/2 window has room, so a slow client slows only itself (its subscription lags
        // behind the live buffer and continues from the store). Shutdown ends it with
        // UNAVAILABLE.
        tracing::debug!(parent: &span, "subscriber attached");
        let state = Some((Box::pin(sub.into_stream()), self.shutdown.clone()));
        let stream = futures::stream::unfold(state, |state| async move {
            let (mut events, shutdown) = state?;
            loop {
                let next = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        let e = Status::unavailable(
                            "the ostler daemon is shutting down; resubscribe with after_seq \
                             set to the last seq you received",
                        );
                        return Some((Err(e), None));
                    }
                    next = events.next() => next,
                };
                match next {
                    None => return None,
                    Some(Err(e)) => return Some((Err(Status::from(ApiError::from(e))), None)),
                    Some(Ok(ev)) => {
                        if let Some(p) = convert::event_to_pb(&ev) {
                            return Some((Ok(p), Some((events, shutdown))));
                        }
                    }
                }
            }
        });
        ok(Box::pin(stream))
    }

    async fn respond_to_permission(
        &self,
        req: Request<pb::RespondToPermissionRequest>,
    ) -> Res<pb::RespondToPermissionResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let request_id = required("request_id", &r.request_id)?;
        let response = convert::permission_response(r.decision)?;
        in_session("RespondToPermission", id, async {
            let res = self
                .engine
                .respond_permission(id, request_id, response, client)
                .await?;
            Ok(pb::RespondToPermissionResponse {
                resolved: Some(convert::permission_resolved(&res.resolved)),
                seq: res.seq,
            })
        })
        .await
    }

    async fn answer_question(
        &self,
        req: Request<pb::AnswerQuestionRequest>,
    ) -> Res<pb::AnswerQuestionResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let request_id = required("request_id", &r.request_id)?;
        let answers = convert::answers(r.answers)?;
        in_session("AnswerQuestion", id, async {
            let res = self
                .engine
                .answer_question(id, request_id, answers, client)
                .await?;
            Ok(pb::AnswerQuestionResponse {
                answered: Some(convert::question_answered(&res.resolved)),
                seq: res.seq,
            })
        })
        .await
    }

    async fn interrupt(&self, req: Request<pb::InterruptRequest>) -> Res<pb::InterruptResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("Interrupt", id, async {
            let answer = if r.cancel_queued {
                self.engine.interrupt_cancel_queued(id).await?
            } else {
                self.engine.interrupt(id).await?
            };
            Ok(pb::InterruptResponse {
                cancelled: crate::controls::strings(answer.as_ref(), "cancelled"),
                still_queued: crate::controls::strings(answer.as_ref(), "still_queued"),
            })
        })
        .await
    }

    async fn set_model(&self, req: Request<pb::SetModelRequest>) -> Res<pb::SetModelResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        convert::bounded("model", &r.model, convert::limits::MODEL_BYTES)?;
        let model = (!r.model.trim().is_empty()).then(|| r.model.trim().to_owned());
        in_session("SetModel", id, async {
            self.engine.set_model(id, model).await?;
            Ok(pb::SetModelResponse {})
        })
        .await
    }

    async fn set_permission_mode(
        &self,
        req: Request<pb::SetPermissionModeRequest>,
    ) -> Res<pb::SetPermissionModeResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let mode = convert::mode_field("mode", r.mode, false)?
            .ok_or_else(|| Status::invalid_argument("mode is required"))?;
        in_session("SetPermissionMode", id, async {
            let now = self.engine.set_permission_mode(id, mode.to_owned()).await?;
            Ok(pb::SetPermissionModeResponse {
                mode: convert::mode_from_cli(&now) as i32,
                cli_mode: now,
            })
        })
        .await
    }

    async fn stop_session(&self, req: Request<pb::StopSessionRequest>) -> Res<pb::Session> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("StopSession", id, async {
            Ok(convert::session_to_pb(&self.engine.stop_session(id).await?))
        })
        .await
    }

    async fn resume_session(&self, req: Request<pb::ResumeSessionRequest>) -> Res<pb::Session> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("ResumeSession", id, async {
            Ok(convert::session_to_pb(
                &self
                    .engine
                    .resume_session(
                        id,
                        eng::ResumeOptions {
                            fork: r.fork,
                            fresh_if_missing: r.fresh_conversation_if_missing,
                            at_message_id: (!r.at_message_id.is_empty()).then_some(r.at_message_id),
                            drops_turn_message_id: (!r.drops_turn_message_id.is_empty())
                                .then_some(r.drops_turn_message_id),
                        },
                    )
                    .await?,
            ))
        })
        .await
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Res<pb::DeleteSessionResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("DeleteSession", id, async {
            self.engine.delete_session(id).await?;
            Ok(pb::DeleteSessionResponse {})
        })
        .await
    }

    async fn update_session(&self, req: Request<pb::UpdateSessionRequest>) -> Res<pb::Session> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?.to_owned();
        let update = convert::update_session(r)?;
        in_session("UpdateSession", &id, async {
            Ok(convert::session_to_pb(
                &self.engine.update_session(&id, update).await?,
            ))
        })
        .await
    }

    async fn read_debug_log(
        &self,
        req: Request<pb::ReadDebugLogRequest>,
    ) -> Res<pb::ReadDebugLogResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("ReadDebugLog", id, async {
            let c = self
                .engine
                .read_debug_log(id, r.offset, r.max_bytes)
                .await?;
            Ok(pb::ReadDebugLogResponse {
                data: c.data,
                next_offset: c.next_offset,
                first_offset: c.first_offset,
                size: c.size,
                eof: c.eof,
            })
        })
        .await
    }

    async fn list_pending_interactions(
        &self,
        req: Request<pb::ListPendingInteractionsRequest>,
    ) -> Res<pb::ListPendingInteractionsResponse> {
        let r = req.into_inner();
        // The label filters of ListSessions, with its limits.
        convert::session_filters(&r.labels, &[])?;
        let mut labels: Vec<(String, String)> = r.labels.into_iter().collect();
        labels.sort();
        // Sessions with something pending (every page), then their pending interactions.
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .engine
                .list_sessions(eng::ListSessions {
                    states: vec![],
                    labels: labels.clone(),
                    page_size: 1000,
                    page_token: token.take(),
                    // Archived sessions' questions wait too.
                    archived: None,
                })
                .await
                .map_err(ApiError::from)?;
            for s in page.sessions.iter().filter(|s| s.pending_interactions > 0) {
                let pending = match self.engine.pending_interactions(&s.id).await {
                    Ok(p) => p,
                    Err(e) => {
                        let status = Status::from(ApiError::from(e));
                        // Deleted or ended since it was listed: nothing pending any more.
                        if matches!(
                            status.code(),
                            tonic::Code::NotFound | tonic::Code::FailedPrecondition
                        ) {
                            continue;
                        }
                        return Err(status);
                    }
                };
                for p in pending {
                    if let Some(event) = convert::event_to_pb(&p.event) {
                        out.push(pb::PendingInteraction {
                            session_id: p.session_id,
                            cwd: s.cwd.clone(),
                            request_id: p.request_id,
                            event: Some(event),
                        });
                    }
                }
            }
            match page.next_page_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        out.sort_by(|a, b| {
            let key = |p: &pb::PendingInteraction| {
                p.event
                    .as_ref()
                    .map(|e| (e.ts_ms, e.seq))
                    .unwrap_or_default()
            };
            key(a)
                .cmp(&key(b))
                .then_with(|| a.session_id.cmp(&b.session_id))
        });
        ok(pb::ListPendingInteractionsResponse { interactions: out })
    }

    async fn get_interaction(
        &self,
        req: Request<pb::GetInteractionRequest>,
    ) -> Res<pb::GetInteractionResponse> {
        let r = req.into_inner();
        let request_id = required("request_id", &r.request_id)?;
        // Optional: empty means any session.
        let session = match r.session_id.trim() {
            "" => None,
            _ => Some(session_id(&r.session_id)?),
        };
        in_session("GetInteraction", session.unwrap_or(""), async {
            let record = self.engine.get_interaction(session, request_id).await?;
            Ok(convert::interaction_to_pb(record))
        })
        .await
    }

    type WatchSessionsStream = crate::watch::WatchStream;

    async fn get_session_info(
        &self,
        req: Request<pb::GetSessionInfoRequest>,
    ) -> Res<pb::GetSessionInfoResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("GetSessionInfo", id, async {
            let d = self.engine.session_details(id).await?;
            Ok(crate::controls::session_info_to_pb(d))
        })
        .await
    }

    async fn set_max_thinking_tokens(
        &self,
        req: Request<pb::SetMaxThinkingTokensRequest>,
    ) -> Res<pb::SetMaxThinkingTokensResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("SetMaxThinkingTokens", id, async {
            self.engine
                .set_max_thinking_tokens(id, r.max_thinking_tokens)
                .await?;
            Ok(pb::SetMaxThinkingTokensResponse {})
        })
        .await
    }

    async fn get_context_usage(
        &self,
        req: Request<pb::GetContextUsageRequest>,
    ) -> Res<pb::GetContextUsageResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("GetContextUsage", id, async {
            let answer = self.engine.context_usage(id, r.summary).await?;
            Ok(crate::controls::context_usage_to_pb(answer))
        })
        .await
    }

    async fn get_mcp_status(
        &self,
        req: Request<pb::GetMcpStatusRequest>,
    ) -> Res<pb::GetMcpStatusResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        in_session("GetMcpStatus", id, async {
            let answer = self.engine.mcp_status(id).await?;
            Ok(crate::controls::mcp_status_to_pb(answer))
        })
        .await
    }

    async fn set_mcp_servers(
        &self,
        req: Request<pb::SetMcpServersRequest>,
    ) -> Res<pb::SetMcpServersResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let servers = crate::controls::mcp_servers(&r.servers_json)?;
        in_session("SetMcpServers", id, async {
            let answer = self.engine.set_mcp_servers(id, servers).await?;
            Ok(crate::controls::set_mcp_servers_to_pb(answer))
        })
        .await
    }

    async fn toggle_mcp_server(
        &self,
        req: Request<pb::ToggleMcpServerRequest>,
    ) -> Res<pb::ToggleMcpServerResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let name = required("server_name", &r.server_name)?;
        in_session("ToggleMcpServer", id, async {
            self.engine.toggle_mcp_server(id, name, r.enabled).await?;
            Ok(pb::ToggleMcpServerResponse {})
        })
        .await
    }

    async fn reconnect_mcp_server(
        &self,
        req: Request<pb::ReconnectMcpServerRequest>,
    ) -> Res<pb::ReconnectMcpServerResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let name = required("server_name", &r.server_name)?;
        in_session("ReconnectMcpServer", id, async {
            self.engine.reconnect_mcp_server(id, name).await?;
            Ok(pb::ReconnectMcpServerResponse {})
        })
        .await
    }

    async fn rewind_files(
        &self,
        req: Request<pb::RewindFilesRequest>,
    ) -> Res<pb::RewindFilesResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let message_id = required("message_id", &r.message_id)?;
        in_session("RewindFiles", id, async {
            let answer = self.engine.rewind_files(id, message_id, r.dry_run).await?;
            Ok(crate::controls::rewind_to_pb(answer))
        })
        .await
    }

    async fn stop_task(&self, req: Request<pb::StopTaskRequest>) -> Res<pb::StopTaskResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let task_id = required("task_id", &r.task_id)?;
        in_session("StopTask", id, async {
            self.engine.stop_task(id, task_id).await?;
            Ok(pb::StopTaskResponse {})
        })
        .await
    }

    async fn send_control_request(
        &self,
        req: Request<pb::SendControlRequestRequest>,
    ) -> Res<pb::SendControlRequestResponse> {
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let subtype = r.subtype.as_str();
        let subtype_ok = (1..=64).contains(&subtype.len())
            && subtype
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !subtype_ok {
            let head: String = subtype.chars().take(64).collect();
            return Err(Status::invalid_argument(format!(
                "subtype: {head:?}{} is not a control request subtype (1-64 of a-z 0-9 _)",
                if head.len() < subtype.len() {
                    "..."
                } else {
                    ""
                }
            )));
        }
        let fields =
            convert::json_object("request_json", &r.request_json, 1024 * 1024)?.unwrap_or_default();
        if fields.contains_key("subtype") {
            return Err(Status::invalid_argument(
                "request_json: sets `subtype`; give it in the subtype field",
            ));
        }
        in_session("SendControlRequest", id, async {
            let mut answer = self.engine.send_control(id, subtype, fields).await?;
            // As in the recorded control_response: `env` and `headers` values (settings,
            // MCP servers) and url credentials are not returned.
            if let Some(a) = answer.as_mut() {
                ostler_engine::redact_env_and_headers(a);
            }
            Ok(pb::SendControlRequestResponse {
                response_json: answer.map(|v| v.to_string()).unwrap_or_default(),
            })
        })
        .await
    }

    async fn respond_to_hook(
        &self,
        req: Request<pb::RespondToHookRequest>,
    ) -> Res<pb::RespondToHookResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let request_id = required("request_id", &r.request_id)?;
        let answer = crate::hooks::answer(&r)?;
        in_session("RespondToHook", id, async {
            let res = self
                .engine
                .respond_hook(id, request_id, answer, client)
                .await?;
            Ok(pb::RespondToHookResponse {
                resolved: Some(crate::hooks::resolved_to_pb(&res.resolved)),
                seq: res.seq,
            })
        })
        .await
    }

    async fn respond_to_tool_call(
        &self,
        req: Request<pb::RespondToToolCallRequest>,
    ) -> Res<pb::RespondToToolCallResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let request_id = required("request_id", &r.request_id)?;
        let content = crate::tools::content_from_pb(r.content, r.is_error)?;
        in_session("RespondToToolCall", id, async {
            let res = self
                .engine
                .respond_tool_call(id, request_id, content, r.is_error, client)
                .await?;
            Ok(pb::RespondToToolCallResponse {
                resolved: Some(crate::tools::resolved_to_pb(&res.resolved)),
                seq: res.seq,
            })
        })
        .await
    }

    async fn respond_to_elicitation(
        &self,
        req: Request<pb::RespondToElicitationRequest>,
    ) -> Res<pb::RespondToElicitationResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let request_id = required("request_id", &r.request_id)?;
        let (action, content) = crate::elicitations::answer_from_pb(r.action, &r.content_json)?;
        in_session("RespondToElicitation", id, async {
            let res = self
                .engine
                .respond_elicitation(id, request_id, action, content, client)
                .await?;
            Ok(pb::RespondToElicitationResponse {
                resolved: Some(crate::elicitations::resolved_to_pb(&res.resolved)),
                seq: res.seq,
            })
        })
        .await
    }

    async fn respond_to_dialog(
        &self,
        req: Request<pb::RespondToDialogRequest>,
    ) -> Res<pb::RespondToDialogResponse> {
        let client = client_of(&req);
        let r = req.into_inner();
        let id = session_id(&r.session_id)?;
        let request_id = required("request_id", &r.request_id)?;
        let (behavior, result) = crate::dialogs::answer_from_pb(r.behavior, &r.result_json)?;
        in_session("RespondToDialog", id, async {
            let res = self
                .engine
                .respond_dialog(id, request_id, behavior, result, client)
                .await?;
            Ok(pb::RespondToDialogResponse {
                resolved: Some(crate::dialogs::resolved_to_pb(&res.resolved)),
                seq: res.seq,
            })
        })
        .await
    }

    async fn watch_sessions(
        &self,
        req: Request<pb::WatchSessionsRequest>,
    ) -> Res<Self::WatchSessionsStream> {
        ok(crate::watch::watch_sessions(
            &self.engine,
            &self.shutdown,
            req.into_inner(),
        )?)
    }
}
