//! A tiny MCP server speaking JSON-RPC 2.0 over stdio (one JSON message per line), for
//! tests: `initialize`, `ping`, `tools/list` with one tool, `tools/call`. The binary is
//! `ostler-test-mcp`; give it to a session as a stdio MCP server
//! (`{"type":"stdio","command":"<path>/ostler-test-mcp"}`), by `SetMcpServers` or
//! `--mcp-config`. Its tools:
//! - `echo_ticket` (`{"ticket": "..."}` -> the text `ticket <ticket> is open`), so a model
//!   can call `mcp__<name>__echo_ticket`;
//! - `confirm_ticket` (`{"ticket": "...", "url": "..."}`): asks the user through MCP
//!   elicitation (`elicitation/create`: a form asking for a `reason`, or with `url` a URL
//!   elicitation) and answers with the text `elicitation for <ticket>: <the ElicitResult
//!   as JSON>`, or an error result when the client offers no elicitation or answers with
//!   an error. A URL elicitation the client accepts is reported complete
//!   (`notifications/elicitation/complete` with its `elicitationId`, `<id>-url`) before the
//!   tool's result, as a server does once the user finished at the URL.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use serde_json::{Value, json};

/// The server's name in `initialize`.
pub const SERVER_NAME: &str = "ostler-test-mcp";
/// The tool that answers at once.
pub const TOOL: &str = "echo_ticket";
/// The tool that asks the user first (MCP elicitation).
pub const ELICITING_TOOL: &str = "confirm_ticket";

/// The server's state: whether the client offers elicitation, and the tool calls waiting
/// for the answer to one (by the elicitation's JSON-RPC id).
#[derive(Debug, Default)]
pub struct Server {
    elicits: bool,
    waiting: HashMap<String, Waiting>,
    next: u64,
}

/// A tool call waiting for the answer to its elicitation.
#[derive(Debug)]
struct Waiting {
    call_id: Value,
    ticket: String,
    /// The `elicitationId` of a URL elicitation.
    url_elicitation: Option<String>,
}

fn tool_result(id: Value, text: String, is_error: bool) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": {
        "content": [{ "type": "text", "text": text }], "isError": is_error,
    }})
}

impl Server {
    /// The messages to send for one JSON-RPC message received, in order.
    pub fn handle(&mut self, msg: &Value) -> Vec<Value> {
        let method = msg.get("method").and_then(Value::as_str);
        let id = msg.get("id");
        if method.is_none()
            && let Some(w) = id
                .and_then(Value::as_str)
                .and_then(|i| self.waiting.remove(i))
        {
            let Waiting {
                call_id,
                ticket,
                url_elicitation,
            } = w;
            return match (msg.get("result"), msg.get("error")) {
                (Some(r), _) => {
                    let mut out = Vec::new();
                    if let Some(eid) = url_elicitation
                        && r.get("action").and_then(Value::as_str) == Some("accept")
                    {
                        out.push(json!({
                            "jsonrpc": "2.0", "method": "notifications/elicitation/complete",
                            "params": { "elicitationId": eid },
                        }));
                    }
                    out.push(tool_result(
                        call_id,
                        format!("elicitation for {ticket}: {r}"),
                        false,
                    ));
                    out
                }
                (None, e) => vec![tool_result(
                    call_id,
                    format!(
                        "elicitation for {ticket} failed: {}",
                        e.unwrap_or(&Value::Null)
                    ),
                    true,
                )],
            };
        }
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        match method {
            Some("initialize") => {
                self.elicits = params.pointer("/capabilities/elicitation").is_some();
            }
            Some("tools/call")
                if params.get("name").and_then(Value::as_str) == Some(ELICITING_TOOL) =>
            {
                let Some(call_id) = id.cloned() else {
                    return Vec::new();
                };
                let ticket = params
                    .pointer("/arguments/ticket")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_owned();
                if !self.elicits {
                    return vec![tool_result(
                        call_id,
                        "the client offers no elicitation".into(),
                        true,
                    )];
                }
                self.next += 1;
                let eid = format!("elicit-{}", self.next);
                let url = params.pointer("/arguments/url").and_then(Value::as_str);
                let url_elicitation = url.map(|_| format!("{eid}-url"));
                let request = match (url, &url_elicitation) {
                    (Some(url), Some(id)) => json!({
                        "mode": "url", "url": url, "elicitationId": id,
                        "message": format!("Sign in to close ticket {ticket}"),
                    }),
                    _ => json!({
                        "message": format!("Close ticket {ticket}?"),
                        "requestedSchema": {
                            "type": "object",
                            "properties": { "reason": { "type": "string", "description": "Why" } },
                            "required": ["reason"],
                        },
                    }),
                };
                self.waiting.insert(
                    eid.clone(),
                    Waiting {
                        call_id,
                        ticket,
                        url_elicitation,
                    },
                );
                return vec![json!({
                    "jsonrpc": "2.0", "id": eid, "method": "elicitation/create", "params": request,
                })];
            }
            _ => {}
        }
        handle(msg).into_iter().collect()
    }
}

/// The answer to one JSON-RPC message (`None` for notifications and responses), for the
/// requests that need no state.
pub fn handle(msg: &Value) -> Option<Value> {
    let id = msg.get("id")?.clone();
    let method = msg.get("method").and_then(Value::as_str)?;
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => json!({
            "protocolVersion": params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("2024-11-05"),
            "capabilities": { "tools": {} },
            "serverInfo": { "name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION") },
        }),
        "ping" => json!({}),
        "tools/list" => json!({ "tools": [{
            "name": TOOL,
            "description": "Looks up a support ticket and says whether it is open.",
            "inputSchema": {
                "type": "object",
                "properties": { "ticket": { "type": "string", "description": "Ticket id" } },
                "required": ["ticket"],
            },
        }, {
            "name": ELICITING_TOOL,
            "description": "Closes a support ticket after asking the user why.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "ticket": { "type": "string", "description": "Ticket id" },
                    "url": { "type": "string", "description": "Sign-in page, if needed" },
                },
                "required": ["ticket"],
            },
        }]}),
        "tools/call" if params.get("name").and_then(Value::as_str) == Some(TOOL) => {
            let ticket = params
                .pointer("/arguments/ticket")
                .and_then(Value::as_str)
                .unwrap_or("?");
            json!({ "content": [{ "type": "text", "text": format!("ticket {ticket} is open") }] })
        }
        "tools/call" => {
            return Some(json!({
                "jsonrpc": "2.0", "id": id,
                "error": { "code": -32602, "message": "unknown tool" },
            }));
        }
        _ => {
            return Some(json!({
                "jsonrpc": "2.0", "id": id,
                "error": { "code": -32601, "message": format!("method {method:?} not found") },
            }));
        }
    };
    Some(json!({ "jsonrpc": "2.0", "id": id, "result": result }))
}

/// Serves stdin to stdout until stdin closes. Lines that are not JSON are skipped.
pub fn run() -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut server = Server::default();
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        for answer in server.handle(&msg) {
            writeln!(out, "{answer}")?;
        }
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_the_mcp_handshake_and_its_tool() {
        let init = handle(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}})).expect("answer");
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(init["result"]["serverInfo"]["name"], SERVER_NAME);
        assert!(handle(&json!({"jsonrpc":"2.0","method":"notifications/initialized"})).is_none());
        let list = handle(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})).expect("list");
        assert_eq!(list["result"]["tools"][0]["name"], TOOL);
        let call = handle(&json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":TOOL,"arguments":{"ticket":"T-42"}}})).expect("call");
        assert_eq!(call["id"], 2);
        assert_eq!(call["result"]["content"][0]["text"], "ticket T-42 is open");
        let other =
            handle(&json!({"jsonrpc":"2.0","id":3,"method":"resources/list"})).expect("error");
        assert_eq!(other["error"]["code"], -32601);
    }

    #[test]
    fn the_eliciting_tool_asks_the_client_and_answers_with_its_result() {
        let call = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":ELICITING_TOOL,"arguments":{"ticket":"T-1"}}});
        let mut plain = Server::default();
        plain.handle(
            &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"capabilities":{}}}),
        );
        let refused = one(plain.handle(&call));
        assert_eq!(refused["result"]["isError"], true);

        let mut s = Server::default();
        s.handle(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"capabilities":{"elicitation":{}}}}));
        let ask = one(s.handle(&call));
        assert_eq!(ask["method"], "elicitation/create");
        assert_eq!(
            ask["params"]["requestedSchema"]["required"],
            json!(["reason"])
        );
        let answer = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept","content":{"reason":"fixed"}}});
        let done = one(s.handle(&answer));
        assert_eq!(done["id"], 7);
        assert_eq!(
            done["result"]["content"][0]["text"],
            r#"elicitation for T-1: {"action":"accept","content":{"reason":"fixed"}}"#
        );
        assert!(s.handle(&answer).is_empty(), "answered once");
        let url = json!({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":ELICITING_TOOL,"arguments":{"ticket":"T-2","url":"https://example.test/a"}}});
        let ask = one(s.handle(&url));
        assert_eq!(
            (
                ask["params"]["mode"].as_str(),
                ask["params"]["url"].as_str()
            ),
            (Some("url"), Some("https://example.test/a"))
        );
        let failed = one(
            s.handle(&json!({"jsonrpc":"2.0","id":ask["id"],"error":{"code":-1,"message":"no"}}))
        );
        assert_eq!(failed["result"]["isError"], true);
        // An accepted URL elicitation is reported complete, then the tool answers.
        let url = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":ELICITING_TOOL,"arguments":{"ticket":"T-3","url":"https://example.test/b"}}});
        let ask = one(s.handle(&url));
        let accepted = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept"}});
        let [complete, done] = <[Value; 2]>::try_from(s.handle(&accepted)).expect("two messages");
        assert_eq!(complete["method"], "notifications/elicitation/complete");
        assert_eq!(
            complete["params"]["elicitationId"],
            ask["params"]["elicitationId"]
        );
        assert_eq!(done["id"], 9);
        // A declined one is not.
        let ask = one(s.handle(&url));
        let declined = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"decline"}});
        assert_eq!(one(s.handle(&declined))["id"], 9);
    }

    /// The one message of `v`.
    fn one(v: Vec<Value>) -> Value {
        let [m] = <[Value; 1]>::try_from(v).expect("one message");
        m
    }
}
