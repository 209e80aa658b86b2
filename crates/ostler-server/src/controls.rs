//! The session controls' requests and answers (issue 10): `GetSessionInfo` and the control
//! RPCs. The CLI's JSON answers are mapped to the typed fields that are stable across
//! releases, and always kept whole in `raw_json`; a field the CLI did not send stays empty.

use std::collections::HashMap;

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use serde_json::{Map, Value};
use tonic::Status;

use crate::convert::bounded;

/// At most this many servers in one `SetMcpServers`.
pub(crate) const MAX_MCP_SERVERS: usize = 64;
/// At most this many bytes of JSON per server config.
pub(crate) const MAX_MCP_CONFIG_BYTES: usize = 64 * 1024;

fn raw(v: Option<&Value>) -> String {
    v.map(Value::to_string).unwrap_or_default()
}

fn text(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn num(v: &Value, keys: &[&str]) -> u64 {
    keys.iter()
        .find_map(|k| v.get(*k).and_then(Value::as_u64))
        .unwrap_or_default()
}

/// The strings of the array `key` of an answer (non-strings skipped).
pub(crate) fn strings(answer: Option<&Value>, key: &str) -> Vec<String> {
    answer
        .and_then(|a| a.get(key))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One server of `mcp_status` / `system/init` (`{name, status, error?, tools?}`).
fn server(v: &Value) -> pb::McpServerStatus {
    pb::McpServerStatus {
        name: text(v, "name"),
        status: text(v, "status"),
        tools: v
            .get("tools")
            .and_then(Value::as_array)
            .map(|t| {
                t.iter()
                    .filter_map(|t| match t {
                        Value::String(s) => Some(s.clone()),
                        o => o.get("name").and_then(Value::as_str).map(str::to_owned),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        error: text(v, "error"),
    }
}

fn servers(list: Option<&Value>) -> Vec<pb::McpServerStatus> {
    list.and_then(Value::as_array)
        .map(|a| a.iter().map(server).collect())
        .unwrap_or_default()
}

pub(crate) fn session_info_to_pb(d: eng::SessionDetails) -> pb::GetSessionInfoResponse {
    let initialized = d.initialized.map(|i| pb::SessionInitialized {
        commands: i
            .commands
            .into_iter()
            .map(|c| pb::SlashCommand {
                name: c.name,
                description: c.description,
                argument_hint: c.argument_hint,
            })
            .collect(),
        models: i
            .models
            .into_iter()
            .map(|m| pb::ModelChoice {
                value: m.value,
                display_name: m.display_name,
                description: m.description,
            })
            .collect(),
        account: Some(pb::Account {
            email: i.account.email,
            organization: i.account.organization,
            subscription_type: i.account.subscription_type,
            api_key_source: i.account.api_key_source,
        }),
        output_style: i.output_style,
        available_output_styles: i.available_output_styles,
        agents: i.agents,
        raw_json: i.raw.to_string(),
    });
    let mut out = pb::GetSessionInfoResponse {
        session_id: d.session_id,
        cli_version: d.cli_version,
        live: d.live,
        initialized,
        initialize_error: d.initialize_error.unwrap_or_default(),
        capabilities: d.capabilities,
        ..Default::default()
    };
    if let Some(init) = d.init {
        out.init_seen = true;
        out.tools = init.tools;
        out.mcp_servers = servers(init.mcp_servers.and_then(|m| m.to_value().ok()).as_ref());
        out.model = init.model.unwrap_or_default();
        out.permission_mode = init.permission_mode.unwrap_or_default();
        out.reported_cli_version = init.cli_version.unwrap_or_default();
        out.slash_commands = init.slash_commands;
    }
    out
}

pub(crate) fn context_usage_to_pb(answer: Option<Value>) -> pb::GetContextUsageResponse {
    let a = answer.clone().unwrap_or(Value::Null);
    pb::GetContextUsageResponse {
        total_tokens: num(&a, &["totalTokens", "total_tokens"]),
        max_tokens: num(
            &a,
            &["maxTokens", "max_tokens", "rawMaxTokens", "contextWindow"],
        ),
        percentage: a
            .get("percentage")
            .and_then(Value::as_f64)
            .unwrap_or_default(),
        model: text(&a, "model"),
        raw_json: raw(answer.as_ref()),
    }
}

pub(crate) fn mcp_status_to_pb(mut answer: Option<Value>) -> pb::GetMcpStatusResponse {
    // Servers' `env` and `headers` values are not returned (as nowhere else).
    if let Some(a) = answer.as_mut() {
        ostler_engine::redact_env_and_headers(a);
    }
    pb::GetMcpStatusResponse {
        servers: servers(answer.as_ref().and_then(|a| a.get("mcpServers"))),
        raw_json: raw(answer.as_ref()),
    }
}

pub(crate) fn set_mcp_servers_to_pb(answer: Option<Value>) -> pb::SetMcpServersResponse {
    let errors = answer
        .as_ref()
        .and_then(|a| a.get("errors"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let msg = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), msg)
                })
                .collect()
        })
        .unwrap_or_default();
    pb::SetMcpServersResponse {
        added: strings(answer.as_ref(), "added"),
        removed: strings(answer.as_ref(), "removed"),
        errors,
        raw_json: raw(answer.as_ref()),
    }
}

pub(crate) fn rewind_to_pb(answer: Option<Value>) -> pb::RewindFilesResponse {
    let a = answer.clone().unwrap_or(Value::Null);
    pb::RewindFilesResponse {
        can_rewind: a.get("canRewind").and_then(Value::as_bool).unwrap_or(false),
        error: text(&a, "error"),
        files_changed: a
            .get("filesChanged")
            .map(|f| match f {
                Value::Array(l) => l.len() as u64,
                v => v.as_u64().unwrap_or_default(),
            })
            .unwrap_or_default(),
        insertions: num(&a, &["insertions"]),
        deletions: num(&a, &["deletions"]),
        raw_json: raw(answer.as_ref()),
    }
}

/// `SetMcpServersRequest.servers_json`: names and configs checked (count, sizes, each a
/// JSON object) before the engine is called.
pub(crate) fn mcp_servers(json: &HashMap<String, String>) -> Result<Map<String, Value>, Status> {
    if json.len() > MAX_MCP_SERVERS {
        return Err(Status::invalid_argument(format!(
            "servers_json has {} servers; at most {MAX_MCP_SERVERS} are allowed",
            json.len()
        )));
    }
    let mut out = Map::new();
    for (name, config) in json {
        crate::convert::required("servers_json (a server name)", name)?;
        bounded(
            &format!("servers_json[{}]", crate::error::shown(name)),
            config,
            MAX_MCP_CONFIG_BYTES,
        )?;
        let v: Value = serde_json::from_str(config).map_err(|e| {
            Status::invalid_argument(format!(
                "servers_json[{}] is not JSON: {e}",
                crate::error::shown(name)
            ))
        })?;
        if !v.is_object() {
            return Err(Status::invalid_argument(format!(
                "servers_json[{}] must be a JSON object such as {{\"type\":\"stdio\",\"command\":\"...\"}}",
                crate::error::shown(name)
            )));
        }
        out.insert(name.clone(), v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_map_to_typed_fields_and_keep_the_raw_json() {
        let s = mcp_status_to_pb(Some(json!({"mcpServers": [
            {"name": "tickets", "status": "connected", "tools": [{"name": "echo_ticket"}]},
            {"name": "gone", "status": "failed", "error": "spawn ENOENT"}
        ]})));
        assert_eq!(s.servers.len(), 2);
        assert_eq!(s.servers[0].tools, vec!["echo_ticket".to_string()]);
        assert_eq!(s.servers[1].error, "spawn ENOENT");
        assert!(s.raw_json.contains("tickets"));

        let r = rewind_to_pb(Some(
            json!({"canRewind": true, "filesChanged": ["a.txt"], "insertions": 0, "deletions": 3}),
        ));
        assert!(r.can_rewind);
        assert_eq!((r.files_changed, r.deletions), (1, 3));
        let none = rewind_to_pb(None);
        assert!(!none.can_rewind && none.raw_json.is_empty());
    }

    #[test]
    fn mcp_server_configs_are_checked_at_the_edge() {
        let ok: HashMap<String, String> = [(
            "t".to_string(),
            r#"{"type":"stdio","command":"x"}"#.to_string(),
        )]
        .into();
        assert_eq!(mcp_servers(&ok).unwrap()["t"]["command"], "x");
        for bad in ["[1]", "not json", "\"s\""] {
            let m: HashMap<String, String> = [("t".to_string(), bad.to_string())].into();
            let e = mcp_servers(&m).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(
                e.message().contains(r#"servers_json["t"]"#),
                "{}",
                e.message()
            );
        }
        let empty_name: HashMap<String, String> = [(" ".to_string(), "{}".to_string())].into();
        assert_eq!(
            mcp_servers(&empty_name).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let many: HashMap<String, String> = (0..=MAX_MCP_SERVERS)
            .map(|i| (format!("s{i}"), "{}".to_string()))
            .collect();
        assert!(mcp_servers(&many).is_err());
    }
}
