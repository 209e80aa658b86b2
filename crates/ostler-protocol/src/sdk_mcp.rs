//! Client-hosted tools (issue 11): the daemon plays an SDK MCP server for the CLI.
//!
//! A session declares tool servers ([`ToolServerDecl`]); they reach the CLI as
//! `--mcp-config` entries `{"type":"sdk","name":...}` (measured: 1.0.108 through 2.1.330
//! take them, 1.0.59 refuses the entry), and the CLI then speaks MCP JSON-RPC to them
//! through `mcp_message` control requests (`{"server_name", "message"}`), answered with
//! `{"mcp_response": <JSON-RPC response>}`. Observed order: `initialize` (client protocol
//! versions `2025-06-18` on 1.0.x, `2025-11-25` on 2.x; our `2024-11-05` is accepted by
//! all), `notifications/initialized` (a control request too: it gets an empty answer),
//! `tools/list`, then `tools/call` with `{"name", "arguments", "_meta":
//! {"claudecode/toolUseId"}}` per model tool use. 2.0.77 runs the handshake twice.
//! A call the CLI gives up on (an interrupt, or its own `MCP_TOOL_TIMEOUT`) is withdrawn by
//! a `notifications/cancelled` `{"requestId": <the call's id>, "reason"}` in a further
//! `mcp_message`, not by a `control_cancel_request` (measured on 1.0.128, 2.0.77, 2.1.121
//! and 2.1.332); the CLI goes on without the answer.
//!
//! Pure logic, no I/O: [`handle`] answers everything from the declaration except
//! `tools/call` of a declared tool, which it hands back as a [`ToolCall`] for the owner to
//! get answered; [`call_result`] builds that answer.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The MCP protocol version the daemon's servers speak.
pub const PROTOCOL_VERSION: &str = "2024-11-05";

/// JSON-RPC: method not found.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: invalid params (also: an unknown tool).
pub const INVALID_PARAMS: i64 = -32602;

/// A tool server whose tools clients answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolServerDecl {
    pub name: String,
    pub tools: Vec<ToolDecl>,
    /// Seconds a call waits for a client's answer.
    pub timeout_secs: u32,
}

/// One declared tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDecl {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The input's JSON schema, JSON object text.
    pub input_schema: String,
}

/// A `tools/call` of a declared tool, to be answered by a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub server: String,
    pub tool: String,
    /// The call's arguments (a JSON object; `{}` when absent).
    pub arguments: Value,
    /// The JSON-RPC id to answer with.
    pub id: Value,
    /// The model's tool use id, when the CLI named it (`_meta.claudecode/toolUseId`).
    pub tool_use_id: Option<String>,
}

/// What to do with one `mcp_message`.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// Answer at once with this `mcp_response`.
    Respond(Value),
    /// A tool call for a client.
    Call(ToolCall),
    /// The CLI withdrew the call with JSON-RPC id `rpc_id` on `server`
    /// (`notifications/cancelled`): answer the notification with `answer`, and close the
    /// call without waiting for a client.
    Cancelled {
        answer: Value,
        server: String,
        rpc_id: Value,
        /// The CLI's reason, at most 200 characters (empty when it gave none).
        reason: String,
    },
}

/// One content block of a tool's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Content {
    Text {
        text: String,
    },
    Image {
        media_type: String,
        data_base64: String,
    },
    /// Any other MCP content block, passed through.
    Json {
        value: Value,
    },
}

impl Content {
    /// The MCP form of the block.
    pub fn to_mcp(&self) -> Value {
        match self {
            Content::Text { text } => json!({"type": "text", "text": text}),
            Content::Image {
                media_type,
                data_base64,
            } => json!({"type": "image", "data": data_base64, "mimeType": media_type}),
            Content::Json { value } => value.clone(),
        }
    }
}

fn error(id: &Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn ok(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The tool list of a server, as `tools/list` answers it.
pub fn tool_list(server: &ToolServerDecl) -> Value {
    let tools: Vec<Value> = server
        .tools
        .iter()
        .map(|t| {
            let schema = serde_json::from_str::<Value>(&t.input_schema)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({"name": t.name, "description": t.description, "inputSchema": schema})
        })
        .collect();
    json!({ "tools": tools })
}

/// Answers one `mcp_message` (the control request's `server_name` and `message`) from the
/// declared servers.
pub fn handle(servers: &[ToolServerDecl], server_name: &str, message: &Value) -> Handled {
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let Some(server) = servers.iter().find(|s| s.name == server_name) else {
        return Handled::Respond(error(
            &id,
            METHOD_NOT_FOUND,
            format!("no tool server {server_name:?} in this session"),
        ));
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    match method {
        "initialize" => Handled::Respond(ok(
            &id,
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": server.name, "version": env!("CARGO_PKG_VERSION")},
            }),
        )),
        "ping" => Handled::Respond(ok(&id, json!({}))),
        "tools/list" => Handled::Respond(ok(&id, tool_list(server))),
        "tools/call" => {
            let params = message.get("params");
            let name = params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !server.tools.iter().any(|t| t.name == name) {
                return Handled::Respond(error(
                    &id,
                    INVALID_PARAMS,
                    format!("unknown tool {:?} of server {:?}", clip(name), server.name),
                ));
            }
            let arguments = match params.and_then(|p| p.get("arguments")) {
                None | Some(Value::Null) => json!({}),
                Some(v) if v.is_object() => v.clone(),
                Some(_) => {
                    return Handled::Respond(error(
                        &id,
                        INVALID_PARAMS,
                        "tools/call arguments must be a JSON object".into(),
                    ));
                }
            };
            let tool_use_id = params
                .and_then(|p| p.get("_meta"))
                .and_then(|m| m.get("claudecode/toolUseId"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            Handled::Call(ToolCall {
                server: server.name.clone(),
                tool: name.to_owned(),
                arguments,
                id,
                tool_use_id,
            })
        }
        "notifications/cancelled" => {
            let params = message.get("params");
            match params.and_then(|p| p.get("requestId")) {
                Some(rpc_id) if !rpc_id.is_null() => Handled::Cancelled {
                    answer: ok(&id, json!({})),
                    server: server.name.clone(),
                    rpc_id: rpc_id.clone(),
                    reason: clip_to(
                        params
                            .and_then(|p| p.get("reason"))
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                        200,
                    )
                    .to_owned(),
                },
                _ => Handled::Respond(ok(&id, json!({}))),
            }
        }
        // Other notifications (`notifications/initialized`, ...) carry no id; the control
        // request still wants an answer.
        m if m.starts_with("notifications/") => Handled::Respond(ok(&id, json!({}))),
        other => Handled::Respond(error(
            &id,
            METHOD_NOT_FOUND,
            format!("method {:?} not served", clip(other)),
        )),
    }
}

/// The JSON-RPC answer to a [`ToolCall`].
pub fn call_result(id: &Value, content: &[Content], is_error: bool) -> Value {
    let content: Vec<Value> = content.iter().map(Content::to_mcp).collect();
    ok(id, json!({"content": content, "isError": is_error}))
}

/// The control response body for an `mcp_message`.
pub fn control_body(mcp_response: Value) -> Value {
    json!({ "mcp_response": mcp_response })
}

/// At most 100 characters of a name taken from the CLI, for messages.
fn clip(s: &str) -> &str {
    clip_to(s, 100)
}

/// At most `n` characters of `s`.
fn clip_to(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers() -> Vec<ToolServerDecl> {
        vec![ToolServerDecl {
            name: "tickets".into(),
            tools: vec![
                ToolDecl {
                    name: "lookup_ticket".into(),
                    description: "Look up a ticket".into(),
                    input_schema: r#"{"type":"object","properties":{"id":{"type":"string"}}}"#
                        .into(),
                },
                ToolDecl {
                    name: "bare".into(),
                    description: String::new(),
                    input_schema: String::new(),
                },
            ],
            timeout_secs: 120,
        }]
    }

    fn respond(h: Handled) -> Value {
        match h {
            Handled::Respond(v) => v,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[test]
    fn handshake_and_list_come_from_the_declaration() {
        let s = servers();
        let init = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}),
        ));
        assert_eq!(init["id"], 0);
        assert_eq!(init["result"]["protocolVersion"], PROTOCOL_VERSION);
        assert_eq!(init["result"]["serverInfo"]["name"], "tickets");
        assert!(init["result"]["capabilities"]["tools"].is_object());

        let note = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        ));
        assert!(note.get("error").is_none());

        let list = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
        ));
        assert_eq!(list["id"], 1);
        let tools = list["result"]["tools"].as_array().expect("tools");
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0]["name"], "lookup_ticket");
        assert_eq!(
            tools[0]["inputSchema"]["properties"]["id"]["type"],
            "string"
        );
        assert_eq!(tools[1]["inputSchema"], json!({"type":"object"}));
    }

    #[test]
    fn a_call_of_a_declared_tool_goes_to_the_owner() {
        let h = handle(
            &servers(),
            "tickets",
            &json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
                "name":"lookup_ticket","arguments":{"id":"T-7"},
                "_meta":{"claudecode/toolUseId":"toolu_1"}}}),
        );
        let Handled::Call(c) = h else {
            panic!("expected a call: {h:?}")
        };
        assert_eq!(c.tool, "lookup_ticket");
        assert_eq!(c.arguments, json!({"id":"T-7"}));
        assert_eq!(c.id, json!(2));
        assert_eq!(c.tool_use_id.as_deref(), Some("toolu_1"));
        let r = call_result(
            &c.id,
            &[Content::Text {
                text: "open".into(),
            }],
            false,
        );
        assert_eq!(
            r,
            json!({"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"open"}],"isError":false}})
        );
    }

    #[test]
    fn a_cancelled_notification_names_the_call_it_withdraws() {
        let s = servers();
        // As 2.1.332 writes it after its own MCP_TOOL_TIMEOUT.
        let h = handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","method":"notifications/cancelled",
                "params":{"requestId":2,"reason":"McpError: MCP error -32001: Request timed out"}}),
        );
        let Handled::Cancelled {
            answer,
            server,
            rpc_id,
            reason,
        } = h
        else {
            panic!("expected a cancellation: {h:?}")
        };
        assert_eq!(server, "tickets");
        assert_eq!(rpc_id, json!(2));
        assert_eq!(reason, "McpError: MCP error -32001: Request timed out");
        assert!(answer.get("error").is_none(), "{answer}");
        // A string id, a reason of any length (clipped), no reason.
        let long = "x".repeat(5000);
        let Handled::Cancelled { rpc_id, reason, .. } = handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","method":"notifications/cancelled",
                "params":{"requestId":"c-9","reason":long}}),
        ) else {
            panic!("expected a cancellation")
        };
        assert_eq!(rpc_id, json!("c-9"));
        assert_eq!(reason.len(), 200);
        let Handled::Cancelled { reason, .. } = handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}),
        ) else {
            panic!("expected a cancellation")
        };
        assert_eq!(reason, "");
        // Without a request id it names nothing: answered, nothing else.
        let note = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}),
        ));
        assert!(note.get("error").is_none());
    }

    #[test]
    fn unknown_things_get_json_rpc_errors() {
        let s = servers();
        let e = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope"}}),
        ));
        assert_eq!(e["error"]["code"], INVALID_PARAMS);
        assert_eq!(e["id"], 3);
        let e = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","id":4,"method":"resources/list"}),
        ));
        assert_eq!(e["error"]["code"], METHOD_NOT_FOUND);
        let e = respond(handle(
            &s,
            "other",
            &json!({"jsonrpc":"2.0","id":5,"method":"tools/list"}),
        ));
        assert_eq!(e["error"]["code"], METHOD_NOT_FOUND);
        let e = respond(handle(
            &s,
            "tickets",
            &json!({"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"bare","arguments":[1]}}),
        ));
        assert_eq!(e["error"]["code"], INVALID_PARAMS);
    }

    #[test]
    fn content_blocks_map_to_mcp() {
        let img = Content::Image {
            media_type: "image/png".into(),
            data_base64: "AAAA".into(),
        };
        assert_eq!(
            img.to_mcp(),
            json!({"type":"image","data":"AAAA","mimeType":"image/png"})
        );
        let raw = Content::Json {
            value: json!({"type":"resource_link","uri":"x:y"}),
        };
        assert_eq!(raw.to_mcp()["uri"], "x:y");
        assert_eq!(
            control_body(json!({"id":1}))["mcp_response"]["id"],
            json!(1)
        );
    }
}
