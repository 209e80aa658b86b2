//! Client-hosted tools (issue 11): `CreateSessionRequest.tool_servers` and
//! `RespondToToolCall` checked and mapped, `ToolCallRequested` / `ToolCallResolved` mapped
//! to `ostler.v1`.

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use ostler_protocol::sdk_mcp::Content;
use tonic::Status;

/// Tool servers of a session (as the supervisor's `limits::TOOL_SERVERS`; bounded here
/// before anything is copied).
pub const MAX_SERVERS: usize = 16;
/// Content blocks of one answer, at most.
pub const MAX_BLOCKS: usize = 256;
/// One answer's content together (the CLI's 10 MiB line cap leaves room for the rest).
pub const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;
/// Default seconds a tool call waits for a client (`ToolServer.timeout_secs` = 0).
pub const DEFAULT_TIMEOUT_SECS: u32 = 120;

/// `CreateSessionRequest.tool_servers` -> the session's declaration (the engine's
/// `CliOptions::validate` checks names, counts, schemas and limits).
pub fn tool_servers_from_pb(
    servers: Vec<pb::ToolServer>,
) -> Result<Vec<eng::ToolServerDecl>, Status> {
    if servers.len() > MAX_SERVERS {
        return Err(Status::invalid_argument(format!(
            "tool_servers: {} servers; at most {MAX_SERVERS} are allowed",
            servers.len(),
        )));
    }
    Ok(servers
        .into_iter()
        .map(|s| eng::ToolServerDecl {
            name: s.name,
            timeout_secs: if s.timeout_secs == 0 {
                DEFAULT_TIMEOUT_SECS
            } else {
                s.timeout_secs
            },
            tools: s
                .tools
                .into_iter()
                .map(|t| eng::ToolDecl {
                    name: t.name,
                    description: t.description,
                    input_schema: t.input_schema_json,
                })
                .collect(),
        })
        .collect())
}

/// `RespondToToolCallRequest.content` -> content blocks.
pub fn content_from_pb(
    content: Vec<pb::ToolContent>,
    is_error: bool,
) -> Result<Vec<Content>, Status> {
    use pb::tool_content::Block;
    if content.is_empty() && !is_error {
        return Err(Status::invalid_argument(
            "content: a tool result needs at least one block (or set is_error)",
        ));
    }
    if content.len() > MAX_BLOCKS {
        return Err(Status::invalid_argument(format!(
            "content: {} blocks; at most {MAX_BLOCKS} are allowed",
            content.len()
        )));
    }
    let mut total = 0usize;
    let mut out = Vec::with_capacity(content.len());
    for (i, c) in content.into_iter().enumerate() {
        let f = format!("content[{i}]");
        let block = match c.block {
            None => return Err(Status::invalid_argument(format!("{f}: no block is set"))),
            Some(Block::Text(text)) => {
                total += text.len();
                Content::Text { text }
            }
            Some(Block::Image(img)) => {
                crate::convert::check_image(&f, &img.media_type, &img.data_base64)?;
                total += img.data_base64.len();
                Content::Image {
                    media_type: img.media_type,
                    data_base64: img.data_base64,
                }
            }
            Some(Block::Json(j)) => {
                total += j.len();
                match serde_json::from_str::<serde_json::Value>(&j) {
                    Ok(v) if v.get("type").is_some_and(serde_json::Value::is_string) => {
                        Content::Json { value: v }
                    }
                    Ok(_) => {
                        return Err(Status::invalid_argument(format!(
                            "{f}.json: an MCP content block is a JSON object with a `type`"
                        )));
                    }
                    Err(e) => {
                        return Err(Status::invalid_argument(format!(
                            "{f}.json: not valid JSON: {e}"
                        )));
                    }
                }
            }
        };
        if total > MAX_RESULT_BYTES {
            return Err(Status::invalid_argument(format!(
                "content: more than {MAX_RESULT_BYTES} bytes together"
            )));
        }
        out.push(block);
    }
    Ok(out)
}

fn content_to_pb(c: &Content) -> pb::ToolContent {
    use pb::tool_content::Block;
    pb::ToolContent {
        block: Some(match c {
            Content::Text { text } => Block::Text(text.clone()),
            Content::Image {
                media_type,
                data_base64,
            } => Block::Image(pb::ToolImage {
                media_type: media_type.clone(),
                data_base64: data_base64.clone(),
            }),
            Content::Json { value } => Block::Json(value.to_string()),
        }),
    }
}

pub fn requested_to_pb(t: &eng::ToolCallRequested) -> pb::ToolCallRequested {
    pb::ToolCallRequested {
        request_id: t.request_id.clone(),
        server_name: t.server_name.clone(),
        tool_name: t.tool_name.clone(),
        arguments_json: t.arguments.to_string(),
        expires_at_ms: t.expires_at_ms,
    }
}

pub fn resolved_to_pb(t: &eng::ToolCallResolved) -> pb::ToolCallResolved {
    let resolution = match t.outcome {
        eng::ToolCallOutcome::Answered => pb::Resolution::Answered,
        eng::ToolCallOutcome::Expired => pb::Resolution::Expired,
        eng::ToolCallOutcome::Cancelled => pb::Resolution::Cancelled,
    };
    pb::ToolCallResolved {
        request_id: t.request_id.clone(),
        resolution: resolution as i32,
        content: t.content.iter().map(content_to_pb).collect(),
        is_error: t.is_error,
        resolved_by: t.resolved_by.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::tool_content::Block;

    fn text(s: &str) -> pb::ToolContent {
        pb::ToolContent {
            block: Some(Block::Text(s.into())),
        }
    }

    #[test]
    fn answers_are_checked() {
        assert_eq!(
            content_from_pb(vec![text("ok")], false).expect("ok"),
            vec![Content::Text { text: "ok".into() }]
        );
        assert!(
            content_from_pb(vec![], true)
                .expect("error result")
                .is_empty()
        );
        let e = content_from_pb(vec![], false).expect_err("empty");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = content_from_pb(vec![pb::ToolContent { block: None }], false).expect_err("none");
        assert!(e.message().contains("content[0]"), "{}", e.message());
        let bad_json = pb::ToolContent {
            block: Some(Block::Json("[1]".into())),
        };
        let e = content_from_pb(vec![bad_json], false).expect_err("json");
        assert!(e.message().contains("content[0].json"), "{}", e.message());
        let bad_img = pb::ToolContent {
            block: Some(Block::Image(pb::ToolImage {
                media_type: "text/plain".into(),
                data_base64: "AAAA".into(),
            })),
        };
        let e = content_from_pb(vec![bad_img], false).expect_err("image");
        assert!(e.message().contains("media_type"), "{}", e.message());
    }

    #[test]
    fn servers_get_the_default_timeout() {
        let s = tool_servers_from_pb(vec![pb::ToolServer {
            name: "tickets".into(),
            tools: vec![pb::ToolDefinition {
                name: "lookup_ticket".into(),
                description: "d".into(),
                input_schema_json: String::new(),
            }],
            timeout_secs: 0,
        }])
        .expect("servers");
        assert_eq!(s[0].timeout_secs, DEFAULT_TIMEOUT_SECS);
        assert_eq!(s[0].tools[0].name, "lookup_ticket");
    }
}
