//! The fake Anthropic Messages API server.
//!
//! `POST /v1/messages` (any query string) is answered from the scenario's rules, streaming
//! (SSE) or as JSON; every other request gets a fast 404 JSON error (or 200 for `HEAD`/`GET /`)
//! and is logged. Usage numbers are derived from the request's message count and the
//! answer's length, so costs are deterministic.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::SinkExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use crate::scenario::{Block, HttpError, Match, ModelRule, Scenario, ToolName};
use crate::{Error, Result};

/// One request the server received.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedRequest {
    pub seq: usize,
    pub method: String,
    /// Path and query, e.g. `/v1/messages?beta=true`.
    pub path: String,
    /// The JSON body, if it was JSON.
    pub body: Option<Value>,
    /// Index of the rule that answered (None: default answer or not a messages call).
    pub rule: Option<usize>,
    pub rule_name: Option<String>,
    pub status: u16,
    /// The `anthropic-beta` header, if sent (the betas the CLI asked for).
    pub anthropic_beta: Option<String>,
}

impl RecordedRequest {
    /// Whether this is a Messages API call matching `m`.
    pub fn matches(&self, m: &Match) -> bool {
        self.path.starts_with("/v1/messages")
            && !self.path.starts_with("/v1/messages/")
            && self.body.as_ref().is_some_and(|b| matches(m, b))
    }
}

struct Shared {
    scenario: Scenario,
    hits: Mutex<Vec<u32>>,
    log: Mutex<Vec<RecordedRequest>>,
    notify: Notify,
    signals: Mutex<std::collections::HashSet<String>>,
    signal_notify: Notify,
}

/// Longest time an answer is held by `hold_until` (before the timeout scale).
const HOLD_LIMIT: Duration = Duration::from_secs(60);

/// A running fake model server; shuts down when dropped.
pub struct FakeModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl FakeModelServer {
    /// Start on an ephemeral loopback port. Needs a tokio runtime.
    pub async fn start(scenario: Scenario) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| Error::Server(format!("bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(format!("local_addr: {e}")))?;
        let shared = Arc::new(Shared {
            hits: Mutex::new(vec![0; scenario.rules.len()]),
            scenario,
            log: Mutex::new(Vec::new()),
            notify: Notify::new(),
            signals: Mutex::new(std::collections::HashSet::new()),
            signal_notify: Notify::new(),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!("fake model server stopped: {e}");
            }
        });
        Ok(Self {
            addr,
            shared,
            shutdown: Some(tx),
        })
    }

    /// Base URL for `ANTHROPIC_BASE_URL`, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Release answers held with `hold_until = name` (now and in the future).
    pub fn signal(&self, name: &str) {
        lock(&self.shared.signals).insert(name.to_string());
        self.shared.signal_notify.notify_waiters();
    }

    /// Snapshot of the request log.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.log).clone()
    }

    /// Messages API calls matching `m`.
    pub fn count_matching(&self, m: &Match) -> usize {
        lock(&self.shared.log)
            .iter()
            .filter(|r| r.matches(m))
            .count()
    }

    /// Wait until at least `n` requests were logged (or the timeout passes); returns the
    /// number logged.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.notify.notified();
            let len = lock(&self.shared.log).len();
            if len >= n {
                return len;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return lock(&self.shared.log).len();
            }
        }
    }
}

impl Drop for FakeModelServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn log(shared: &Shared, mut rec: RecordedRequest) {
    {
        let mut l = lock(&shared.log);
        rec.seq = l.len();
        l.push(rec);
    }
    shared.notify.notify_waiters();
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| uri.path().to_string());
    let json_body: Option<Value> = serde_json::from_slice(&body).ok();
    let is_messages = method == Method::POST && uri.path() == "/v1/messages";
    let mut rec = RecordedRequest {
        seq: 0,
        method: method.to_string(),
        path: path.clone(),
        body: json_body.clone(),
        rule: None,
        rule_name: None,
        status: 200,
        anthropic_beta: headers
            .get("anthropic-beta")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    if !is_messages {
        let resp = if uri.path() == "/v1/messages/count_tokens" {
            let n = json_body.as_ref().map(input_tokens).unwrap_or(1);
            json_response(StatusCode::OK, json!({ "input_tokens": n }))
        } else if method == Method::HEAD || uri.path() == "/" {
            StatusCode::OK.into_response()
        } else {
            error_response(&HttpError {
                status: 404,
                kind: Some("not_found_error".into()),
                message: Some(format!("ostler fake model: no route for {method} {path}")),
                retry_after: None,
            })
        };
        rec.status = resp.status().as_u16();
        log(&shared, rec);
        return resp;
    }
    let Some(req) = json_body else {
        let resp = error_response(&HttpError {
            status: 400,
            kind: Some("invalid_request_error".into()),
            message: Some("body is not JSON".into()),
            retry_after: None,
        });
        rec.status = 400;
        log(&shared, rec);
        return resp;
    };
    // 2.0.x/2.1.0 send background "Warmup" requests for their sub-agents; whether they
    // finish before a turn's `result` is a race that would make `modelUsage` and costs
    // nondeterministic. They get an error (no usage is counted), unless a rule asks for
    // "Warmup" explicitly.
    if is_warmup(&req)
        && !shared.scenario.rules.iter().any(|r| {
            r.when
                .last_user_text_contains
                .as_deref()
                .is_some_and(|t| t.contains("Warmup"))
        })
    {
        rec.status = 400;
        rec.rule_name = Some("builtin:warmup".into());
        log(&shared, rec);
        return error_response(&HttpError {
            status: 400,
            kind: Some("invalid_request_error".into()),
            message: Some("ostler fake model: warmup requests are refused".into()),
            retry_after: None,
        });
    }
    // pick the rule and decide success / failure under one lock
    let picked = {
        let mut hits = lock(&shared.hits);
        let mut picked = None;
        for (i, rule) in shared.scenario.rules.iter().enumerate() {
            let used = hits.get(i).copied().unwrap_or(0);
            if rule.times.is_some_and(|t| used >= t) {
                continue;
            }
            if matches(&rule.when, &req) {
                if let Some(h) = hits.get_mut(i) {
                    *h += 1;
                }
                let fail = match (&rule.error, rule.fail_times) {
                    (_, Some(n)) => used < n,
                    (Some(_), None) => true,
                    (None, None) => false,
                };
                picked = Some((i, used, fail));
                break;
            }
        }
        picked
    };
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("claude-fake")
        .to_string();
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let default_rule;
    let (rule, msg_id) = match picked {
        Some((i, used, fail)) => {
            let rule = &shared.scenario.rules[i];
            rec.rule = Some(i);
            rec.rule_name = rule.name.clone();
            if fail {
                let err = rule.error.clone().unwrap_or_default();
                rec.status = err.status;
                log(&shared, rec);
                return error_response(&err);
            }
            (rule, format!("msg_fake_{i:02}_{used:03}"))
        }
        None => {
            let seq = lock(&shared.log).len();
            default_rule = ModelRule {
                blocks: vec![Block::Text {
                    text: shared
                        .scenario
                        .default_text
                        .clone()
                        .unwrap_or_else(|| "OK.".to_string()),
                    repeat: None,
                }],
                ..ModelRule::default()
            };
            (&default_rule, format!("msg_fake_default_{seq:03}"))
        }
    };
    let answer = Answer::build(rule, &req, &msg_id, &model);
    let hold = rule.hold_until.clone();
    let pause = rule.pause_after_deltas;
    log(&shared, rec);
    let mut gate = None;
    if let Some(name) = hold {
        match pause {
            Some(n) if stream => gate = Some((n, shared.clone(), name)),
            _ => wait_signal(&shared, &name).await,
        }
    }
    if stream {
        answer.sse(gate)
    } else {
        json_response(StatusCode::OK, answer.message_json())
    }
}

/// Wait until `name` was signalled (at most [`HOLD_LIMIT`], scaled).
async fn wait_signal(shared: &Shared, name: &str) {
    let deadline = tokio::time::Instant::now() + crate::timeouts::scaled(HOLD_LIMIT);
    loop {
        let notified = shared.signal_notify.notified();
        if lock(&shared.signals).contains(name) {
            return;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            tracing::warn!("fake model: answer held for {name:?} released by timeout");
            return;
        }
    }
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (
                header::HeaderName::from_static("request-id"),
                "req_fake_ostler",
            ),
        ],
        v.to_string(),
    )
        .into_response()
}

/// The error response shape of the Anthropic API.
pub fn error_body(err: &HttpError) -> Value {
    json!({
        "type": "error",
        "error": {
            "type": err.kind.clone().unwrap_or_else(|| "api_error".into()),
            "message": err.message.clone().unwrap_or_else(|| "error".into()),
        }
    })
}

fn error_response(err: &HttpError) -> Response {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, error_body(err));
    if let Some(s) = err.retry_after
        && let Ok(v) = header::HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

// ---------------------------------------------------------------------------------------
// matching

fn last_user(req: &Value) -> Option<&Value> {
    req.get("messages")?
        .as_array()?
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                if b.get("type").and_then(Value::as_str) == Some("text")
                    && let Some(t) = b.get("text").and_then(Value::as_str)
                {
                    out.push_str(t);
                    out.push('\n');
                }
            }
            out
        }
        _ => String::new(),
    }
}

fn has_tool_result(content: &Value, id: &str) -> bool {
    content.as_array().is_some_and(|blocks| {
        blocks.iter().any(|b| {
            b.get("type").and_then(Value::as_str) == Some("tool_result")
                && b.get("tool_use_id").and_then(Value::as_str) == Some(id)
        })
    })
}

/// Whether a Messages API request body matches.
pub fn matches(m: &Match, req: &Value) -> bool {
    let last = last_user(req);
    if let Some(needle) = &m.last_user_text_contains {
        let text = last
            .and_then(|u| u.get("content"))
            .map(text_of)
            .unwrap_or_default();
        if !text.contains(needle.as_str()) {
            return false;
        }
    }
    if let Some(id) = &m.tool_result_for
        && !last
            .and_then(|u| u.get("content"))
            .is_some_and(|c| has_tool_result(c, id))
    {
        return false;
    }
    if let Some(id) = &m.has_tool_result_for {
        let any = req
            .get("messages")
            .and_then(Value::as_array)
            .is_some_and(|ms| {
                ms.iter()
                    .filter_map(|m| m.get("content"))
                    .any(|c| has_tool_result(c, id))
            });
        if !any {
            return false;
        }
    }
    if let Some(needle) = &m.system_contains {
        let sys = match req.get("system") {
            Some(Value::String(s)) => s.clone(),
            Some(v @ Value::Array(_)) => text_of(v),
            _ => String::new(),
        };
        if !sys.contains(needle.as_str()) {
            return false;
        }
    }
    if m.messages_contain.is_some() || m.messages_lack.is_some() {
        let all = req
            .get("messages")
            .map(|v| v.to_string())
            .unwrap_or_default();
        if let Some(n) = &m.messages_contain
            && !all.contains(n.as_str())
        {
            return false;
        }
        if let Some(n) = &m.messages_lack
            && all.contains(n.as_str())
        {
            return false;
        }
    }
    if let Some(n) = &m.model_contains
        && !req
            .get("model")
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains(n.as_str()))
    {
        return false;
    }
    if let Some(s) = m.stream
        && req.get("stream").and_then(Value::as_bool).unwrap_or(false) != s
    {
        return false;
    }
    true
}

/// A sub-agent cache warmup request: one user message whose text is `Warmup`.
pub fn is_warmup(req: &Value) -> bool {
    let msgs = req.get("messages").and_then(Value::as_array);
    msgs.is_some_and(|m| m.len() == 1)
        && last_user(req)
            .and_then(|u| u.get("content"))
            .map(text_of)
            .is_some_and(|t| t.trim() == "Warmup")
}

fn input_tokens(req: &Value) -> u64 {
    let n = req
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0) as u64;
    100 + 10 * n
}

// ---------------------------------------------------------------------------------------
// answers

enum Built {
    Text(String),
    Thinking(String, String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

struct Answer {
    id: String,
    model: String,
    blocks: Vec<Built>,
    stop_reason: String,
    stop_details: Option<Value>,
    input_tokens: u64,
    output_tokens: u64,
    chunks: usize,
    delay: Option<Duration>,
}

fn offered_tools(req: &Value) -> Vec<String> {
    req.get("tools")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

impl Answer {
    fn build(rule: &ModelRule, req: &Value, id: &str, model: &str) -> Self {
        let offered = offered_tools(req);
        let mut out_chars = 0usize;
        let blocks: Vec<Built> = rule
            .blocks
            .iter()
            .map(|b| match b {
                Block::Text { text, repeat } => {
                    let t = match repeat {
                        Some(n) => text.repeat(*n),
                        None => text.clone(),
                    };
                    out_chars += t.len();
                    Built::Text(t)
                }
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    out_chars += thinking.len();
                    Built::Thinking(
                        thinking.clone(),
                        signature
                            .clone()
                            .unwrap_or_else(|| "ostler-fake-signature".into()),
                    )
                }
                Block::ToolUse { id, name, input } => {
                    let name = match name {
                        ToolName::One(n) => n.clone(),
                        ToolName::AnyOf(ns) => ns
                            .iter()
                            .find(|n| offered.contains(n))
                            .or(ns.first())
                            .cloned()
                            .unwrap_or_default(),
                    };
                    out_chars += input.to_string().len();
                    Built::ToolUse {
                        id: id.clone(),
                        name,
                        input: input.clone(),
                    }
                }
            })
            .collect();
        let stop_reason = rule.stop_reason.clone().unwrap_or_else(|| {
            if blocks.iter().any(|b| matches!(b, Built::ToolUse { .. })) {
                "tool_use".into()
            } else {
                "end_turn".into()
            }
        });
        Self {
            id: id.to_string(),
            model: model.to_string(),
            blocks,
            stop_reason,
            stop_details: rule.stop_details.clone(),
            input_tokens: input_tokens(req),
            output_tokens: (out_chars as u64) / 4 + 1,
            chunks: rule.chunks.unwrap_or(1).max(1),
            delay: rule.delay_ms.map(Duration::from_millis),
        }
    }

    fn usage(&self) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": self.output_tokens,
        })
    }

    fn message_json(&self) -> Value {
        let content: Vec<Value> = self
            .blocks
            .iter()
            .map(|b| match b {
                Built::Text(t) => json!({"type": "text", "text": t}),
                Built::Thinking(t, s) => json!({"type": "thinking", "thinking": t, "signature": s}),
                Built::ToolUse { id, name, input } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
            })
            .collect();
        let mut m = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": null,
            "usage": self.usage(),
        });
        if let Some(d) = &self.stop_details {
            m["stop_details"] = d.clone();
        }
        m
    }

    /// The SSE events: (event data, whether a delay precedes it).
    fn events(&self) -> Vec<(Value, bool)> {
        let mut ev = Vec::new();
        let mut start_usage = self.usage();
        start_usage["output_tokens"] = json!(1);
        ev.push((
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage,
            }}),
            false,
        ));
        ev.push((json!({"type": "ping"}), false));
        for (index, b) in self.blocks.iter().enumerate() {
            let (start, deltas): (Value, Vec<Value>) = match b {
                Built::Text(t) => (
                    json!({"type": "text", "text": ""}),
                    split(t, self.chunks)
                        .into_iter()
                        .map(|c| json!({"type": "text_delta", "text": c}))
                        .collect(),
                ),
                Built::Thinking(t, sig) => {
                    let mut d: Vec<Value> = split(t, self.chunks)
                        .into_iter()
                        .map(|c| json!({"type": "thinking_delta", "thinking": c}))
                        .collect();
                    d.push(json!({"type": "signature_delta", "signature": sig}));
                    (
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        d,
                    )
                }
                Built::ToolUse { id, name, input } => (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    split(&input.to_string(), self.chunks)
                        .into_iter()
                        .map(|c| json!({"type": "input_json_delta", "partial_json": c}))
                        .collect(),
                ),
            };
            ev.push((
                json!({"type": "content_block_start", "index": index, "content_block": start}),
                false,
            ));
            for d in deltas {
                ev.push((
                    json!({"type": "content_block_delta", "index": index, "delta": d}),
                    true,
                ));
            }
            ev.push((json!({"type": "content_block_stop", "index": index}), false));
        }
        let mut delta = json!({"stop_reason": self.stop_reason, "stop_sequence": null});
        if let Some(d) = &self.stop_details {
            delta["stop_details"] = d.clone();
        }
        ev.push((
            json!({"type": "message_delta", "delta": delta,
                "usage": {"output_tokens": self.output_tokens}}),
            false,
        ));
        ev.push((json!({"type": "message_stop"}), false));
        ev
    }

    /// `gate`: after that many deltas, wait for the signal before sending the rest.
    fn sse(self, gate: Option<(usize, Arc<Shared>, String)>) -> Response {
        let events = self.events();
        let delay = self.delay;
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        tokio::spawn(async move {
            let mut deltas = 0usize;
            for (data, delayed) in events {
                if delayed {
                    if let Some((n, shared, name)) = &gate
                        && deltas == *n
                    {
                        // make sure the client has everything sent so far, then hold
                        let _ = tx.flush().await;
                        wait_signal(shared, name).await;
                    }
                    deltas += 1;
                }
                if delayed && let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                let kind = data
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string();
                let frame = format!("event: {kind}\ndata: {data}\n\n");
                if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                    return; // client went away (e.g. interrupt)
                }
            }
        });
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .header("request-id", "req_fake_ostler")
            .body(Body::from_stream(rx))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    }
}

/// Split into `n` nearly equal parts at char boundaries (fewer if the text is short).
fn split(s: &str, n: usize) -> Vec<String> {
    if n <= 1 || s.is_empty() {
        return vec![s.to_string()];
    }
    let chars: Vec<char> = s.chars().collect();
    let per = chars.len().div_ceil(n).max(1);
    chars.chunks(per).map(|c| c.iter().collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_text() {
        let parts = split("héllo wörld", 4);
        assert_eq!(parts.concat(), "héllo wörld");
        assert_eq!(parts.len(), 4);
        assert_eq!(split("ab", 5).len(), 2);
    }
}
