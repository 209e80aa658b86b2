//! The fake model server over real HTTP.
#![allow(clippy::disallowed_methods)] // test support

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ostler_testkit::{FakeModelServer, Scenario};
use serde_json::{Value, json};

async fn post(server: &FakeModelServer, path: &str, body: &Value) -> (u16, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = hyper::Request::post(format!("{}{path}", server.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = client.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, ctype, String::from_utf8_lossy(&bytes).into_owned())
}

async fn get(server: &FakeModelServer, path: &str) -> u16 {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = hyper::Request::get(format!("{}{path}", server.url()))
        .body(Full::new(Bytes::new()))
        .expect("request");
    client
        .request(req)
        .await
        .expect("response")
        .status()
        .as_u16()
}

/// (event name, data) pairs of an SSE body.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).expect("data is JSON");
                }
            }
            (name, data)
        })
        .collect()
}

fn request(text: &str, stream: bool) -> Value {
    json!({
        "model": "claude-test-1",
        "stream": stream,
        "max_tokens": 100,
        "system": [{"type": "text", "text": "You are a test."}],
        "tools": [{"name": "Task"}, {"name": "Bash"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
    })
}

const SCENARIO: &str = r#"
default_text = "Default answer."

[[model]]
name = "after tool"
when = { tool_result_for = "toolu_1" }
blocks = [{ type = "text", text = "Done." }]

[[model]]
name = "stream"
when = { last_user_text_contains = "stream please", stream = true }
chunks = 3
blocks = [
  { type = "thinking", thinking = "Let me think." },
  { type = "text", text = "Hello, streamed world!" },
  { type = "tool_use", id = "toolu_1", name = ["Agent", "Task"], input = { prompt = "do it", n = 2 } },
]

[[model]]
name = "flaky"
when = { last_user_text_contains = "flaky" }
fail_times = 2
blocks = [{ type = "text", text = "Finally." }]

[[model]]
name = "always 429"
when = { last_user_text_contains = "rate limit me" }
error = { status = 429, kind = "rate_limit_error", message = "slow down", retry_after = 1 }

[[model]]
name = "system match"
when = { system_contains = "special system" }
blocks = [{ type = "text", text = "System matched." }]
"#;

fn scenario() -> Scenario {
    Scenario::from_toml("server_test", SCENARIO).expect("scenario parses")
}

#[tokio::test]
async fn streams_all_block_kinds_as_sse() {
    let server = FakeModelServer::start(scenario()).await.expect("start");
    let (status, ctype, body) = post(
        &server,
        "/v1/messages?beta=true",
        &request("stream please", true),
    )
    .await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert_eq!(names[names.len() - 2], "message_delta");
    for (name, data) in &events {
        assert_eq!(
            data["type"].as_str(),
            Some(name.as_str()),
            "event name = data.type"
        );
    }
    // three blocks, each start/deltas/stop
    let starts: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| &d["content_block"])
        .collect();
    assert_eq!(starts.len(), 3);
    assert_eq!(starts[0]["type"], "thinking");
    assert_eq!(starts[1]["type"], "text");
    assert_eq!(starts[2]["type"], "tool_use");
    // the tool name is the first candidate the request offers ("Agent" is not offered)
    assert_eq!(starts[2]["name"], "Task");
    assert_eq!(starts[2]["id"], "toolu_1");
    let deltas = |index: u64, kind: &str, field: &str| -> Vec<String> {
        events
            .iter()
            .filter(|(n, d)| n == "content_block_delta" && d["index"] == index)
            .filter(|(_, d)| d["delta"]["type"] == kind)
            .map(|(_, d)| d["delta"][field].as_str().expect("delta text").to_string())
            .collect()
    };
    let thinking = deltas(0, "thinking_delta", "thinking");
    assert_eq!(thinking.len(), 3);
    assert_eq!(thinking.concat(), "Let me think.");
    assert_eq!(deltas(0, "signature_delta", "signature").len(), 1);
    let text = deltas(1, "text_delta", "text");
    assert_eq!(text.len(), 3);
    assert_eq!(text.concat(), "Hello, streamed world!");
    let json_parts = deltas(2, "input_json_delta", "partial_json");
    assert!(json_parts.len() > 1);
    let input: Value = serde_json::from_str(&json_parts.concat()).expect("input reassembles");
    assert_eq!(input, json!({"prompt": "do it", "n": 2}));
    let (_, message_delta) = &events[events.len() - 2];
    assert_eq!(message_delta["delta"]["stop_reason"], "tool_use");
    // usage is deterministic: same request, same numbers
    let (_, _, again) = post(
        &server,
        "/v1/messages?beta=true",
        &request("stream please", true),
    )
    .await;
    let usage = |b: &str| {
        let ev = sse_events(b);
        (
            ev[0].1["message"]["usage"].clone(),
            ev[ev.len() - 2].1["usage"].clone(),
        )
    };
    assert_eq!(usage(&body), usage(&again));
    let (start_usage, _) = usage(&body);
    assert_eq!(start_usage["input_tokens"], 110);
    // the message id is stable per rule and use
    assert_eq!(sse_events(&body)[0].1["message"]["id"], "msg_fake_01_000");
    assert_eq!(sse_events(&again)[0].1["message"]["id"], "msg_fake_01_001");
}

#[tokio::test]
async fn non_streaming_json_and_matchers() {
    let server = FakeModelServer::start(scenario()).await.expect("start");
    // a tool_result in the last user message wins over the text rules
    let mut req = request("stream please", false);
    req["messages"] = json!([
        {"role": "user", "content": "stream please"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Task", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
    ]);
    let (status, ctype, body) = post(&server, "/v1/messages", &req).await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("application/json"));
    let msg: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["content"][0]["text"], "Done.");
    assert_eq!(msg["stop_reason"], "end_turn");
    assert_eq!(msg["usage"]["input_tokens"], 130);

    // "stream please" without streaming does not match the streaming-only rule → default
    let (_, _, body) = post(&server, "/v1/messages", &request("stream please", false)).await;
    let msg: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(msg["content"][0]["text"], "Default answer.");

    let mut sys = request("anything", false);
    sys["system"] = json!("a special system prompt");
    let (_, _, body) = post(&server, "/v1/messages", &sys).await;
    let msg: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(msg["content"][0]["text"], "System matched.");

    let log = server.requests();
    assert_eq!(log.len(), 3);
    assert_eq!(log[0].rule_name.as_deref(), Some("after tool"));
    assert_eq!(log[1].rule, None);
    assert_eq!(log[2].rule_name.as_deref(), Some("system match"));
    assert!(log.iter().all(|r| r.status == 200));
}

#[tokio::test]
async fn fails_n_times_then_succeeds_and_errors_have_the_api_shape() {
    let server = FakeModelServer::start(scenario()).await.expect("start");
    for _ in 0..2 {
        let (status, _, body) = post(&server, "/v1/messages", &request("flaky", false)).await;
        assert_eq!(status, 529);
        let err: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(
            err,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        );
    }
    let (status, _, body) = post(&server, "/v1/messages", &request("flaky", false)).await;
    assert_eq!(status, 200);
    assert!(body.contains("Finally."));

    let (status, _, body) = post(&server, "/v1/messages", &request("rate limit me", true)).await;
    assert_eq!(status, 429);
    assert!(body.contains("rate_limit_error"));
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![529, 529, 200, 429]);
}

#[tokio::test]
async fn other_endpoints_answer_fast_and_are_logged() {
    let server = FakeModelServer::start(scenario()).await.expect("start");
    assert_eq!(get(&server, "/v1/models").await, 404);
    assert_eq!(get(&server, "/").await, 200);
    let (status, _, body) = post(
        &server,
        "/v1/messages/count_tokens",
        &request("count me", false),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("json")["input_tokens"],
        110
    );
    let (status, _, _) = post(&server, "/api/event_logging/batch", &json!({})).await;
    assert_eq!(status, 404);
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        vec![
            "/v1/models",
            "/",
            "/v1/messages/count_tokens",
            "/api/event_logging/batch"
        ]
    );
}

#[tokio::test]
async fn warmup_requests_are_refused_without_usage() {
    let server = FakeModelServer::start(scenario()).await.expect("start");
    let (status, _, body) = post(&server, "/v1/messages", &request("Warmup", true)).await;
    assert_eq!(status, 400);
    assert!(body.contains("invalid_request_error"));
    assert_eq!(
        server.requests()[0].rule_name.as_deref(),
        Some("builtin:warmup")
    );
}

#[tokio::test]
async fn every_committed_scenario_parses() {
    let all = Scenario::load_all(&ostler_testkit::scenario::scenarios_dir()).expect("scenarios");
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    for required in [
        "plain_text",
        "tool_allowed",
        "tool_denied",
        "ask_user_question",
        "interrupt",
        "two_turns",
        "control",
        "resume",
        "subagent",
        "api_error",
        "large_answer",
    ] {
        assert!(names.contains(&required), "scenario {required} missing");
    }
    for s in &all {
        assert!(!s.steps.is_empty(), "{} has no steps", s.name);
        assert!(!s.rules.is_empty(), "{} has no model rules", s.name);
    }
}

const HELD: &str = r#"
[[model]]
name = "held"
when = { last_user_text_contains = "hold me" }
hold_until = "go"
blocks = [{ type = "text", text = "Released." }]

[[model]]
name = "paused"
when = { last_user_text_contains = "pause me", stream = true }
chunks = 4
pause_after_deltas = 2
hold_until = "go on"
blocks = [{ type = "text", text = "abcdefgh" }]
"#;

#[tokio::test]
async fn held_answers_wait_for_the_signal() {
    let server = std::sync::Arc::new(
        FakeModelServer::start(Scenario::from_toml("held", HELD).expect("scenario"))
            .await
            .expect("start"),
    );
    let s = server.clone();
    let held =
        tokio::spawn(async move { post(&s, "/v1/messages", &request("hold me", false)).await });
    // the request is logged before the answer is held: the answer cannot have come yet
    server
        .wait_for_requests(1, ostler_testkit::timeouts::secs(30))
        .await;
    assert!(!held.is_finished(), "answered before the signal");
    server.signal("go");
    let (status, _, body) = held.await.expect("join");
    assert_eq!(status, 200);
    assert!(body.contains("Released."));

    let s = server.clone();
    let paused =
        tokio::spawn(async move { post(&s, "/v1/messages", &request("pause me", true)).await });
    server
        .wait_for_requests(2, ostler_testkit::timeouts::secs(30))
        .await;
    assert!(
        !paused.is_finished(),
        "the paused stream ended before the signal"
    );
    server.signal("go on");
    let (status, _, body) = paused.await.expect("join");
    assert_eq!(status, 200);
    let text: String = sse_events(&body)
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(text, "abcdefgh");
}
