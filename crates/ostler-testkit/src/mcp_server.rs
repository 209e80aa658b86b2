//! A tiny MCP server speaking JSON-RPC 2.0 over stdio (one JSON message per line), for
//! tests: `initialize`, `ping`, `tools/list` with one tool, `tools/call`. The binary is
//! `ostler-test-mcp`; give it to a session as a stdio MCP server
//! (`{"type":"stdio","command":"<path>/ostler-test-mcp"}`), by `SetMcpServers` or
//! `--mcp-config`. Its tool is `echo_ticket` (`{"ticket": "..."}` -> the text
//! `ticket <ticket> is open`), so a model can call `mcp__<name>__echo_ticket`.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

/// The server's name in `initialize`.
pub const SERVER_NAME: &str = "ostler-test-mcp";
/// The one tool it offers.
pub const TOOL: &str = "echo_ticket";

/// The answer to one JSON-RPC message (`None` for notifications and responses).
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
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(answer) = handle(&msg) {
            writeln!(out, "{answer}")?;
            out.flush()?;
        }
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
}
