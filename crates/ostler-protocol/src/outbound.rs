//! Messages ostler writes to the CLI's stdin. Each encodes to one JSON line (with `\n`).

use serde_json::{Map, Value, json};

use crate::model::{CanUseTool, Question, QuestionOption};

/// Content of a user message.
#[derive(Debug, Clone, PartialEq)]
pub enum UserContent {
    Text(String),
    /// Anthropic content blocks (text, image, ...), passed through.
    Blocks(Vec<Value>),
}

/// Our answer to a `control_request` from the CLI.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseBody {
    /// `{"behavior":"allow","updatedInput":...}`; `updated_input` is always sent (the
    /// original input when not edited).
    Allow {
        updated_input: Value,
        updated_permissions: Option<Value>,
    },
    /// `{"behavior":"deny","message":...}`; the message is always present.
    Deny { message: String, interrupt: bool },
    /// A generic success payload (e.g. a hook callback answer).
    Success(Value),
    /// `subtype: error`.
    Error { message: String },
}

/// Control requests we send.
#[derive(Debug, Clone, PartialEq)]
pub enum OutRequest {
    /// Fields passed through (hooks, systemPrompt, ...).
    Initialize(serde_json::Map<String, Value>),
    Interrupt,
    /// `None` resets to the default model.
    SetModel(Option<String>),
    SetPermissionMode(String),
    SetMaxThinkingTokens(Option<u32>),
    McpStatus,
    /// Any other subtype, with its fields.
    Other {
        subtype: String,
        fields: serde_json::Map<String, Value>,
    },
}

/// One message to the CLI.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    User {
        content: UserContent,
        parent_tool_use_id: Option<String>,
        session_id: String,
    },
    ControlResponse {
        request_id: String,
        body: ResponseBody,
    },
    ControlRequest {
        request_id: String,
        request: OutRequest,
    },
    ControlCancel {
        request_id: String,
    },
    KeepAlive,
}

impl Outbound {
    /// The NDJSON line, terminated by `\n`.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = self.to_value().to_string().into_bytes();
        line.push(b'\n');
        line
    }

    /// The message as a JSON value (what [`Outbound::to_line`] serializes).
    pub fn to_value(&self) -> Value {
        match self {
            Outbound::User {
                content,
                parent_tool_use_id,
                session_id,
            } => {
                let content = match content {
                    UserContent::Text(t) => Value::String(t.clone()),
                    UserContent::Blocks(b) => Value::Array(b.clone()),
                };
                json!({
                    "type": "user",
                    "message": {"role": "user", "content": content},
                    "parent_tool_use_id": parent_tool_use_id,
                    "session_id": session_id,
                })
            }
            Outbound::ControlResponse { request_id, body } => {
                let response = match body {
                    ResponseBody::Allow {
                        updated_input,
                        updated_permissions,
                    } => {
                        let mut r = Map::new();
                        r.insert("behavior".into(), "allow".into());
                        r.insert("updatedInput".into(), updated_input.clone());
                        if let Some(p) = updated_permissions {
                            r.insert("updatedPermissions".into(), p.clone());
                        }
                        success(request_id, Value::Object(r))
                    }
                    ResponseBody::Deny { message, interrupt } => {
                        let mut r = Map::new();
                        r.insert("behavior".into(), "deny".into());
                        r.insert("message".into(), message.clone().into());
                        if *interrupt {
                            r.insert("interrupt".into(), true.into());
                        }
                        success(request_id, Value::Object(r))
                    }
                    ResponseBody::Success(v) => success(request_id, v.clone()),
                    ResponseBody::Error { message } => json!({
                        "subtype": "error",
                        "request_id": request_id,
                        "error": message,
                    }),
                };
                json!({"type": "control_response", "response": response})
            }
            Outbound::ControlRequest {
                request_id,
                request,
            } => {
                let mut r = Map::new();
                match request {
                    OutRequest::Initialize(fields) => {
                        r.insert("subtype".into(), "initialize".into());
                        extend(&mut r, fields);
                    }
                    OutRequest::Interrupt => {
                        r.insert("subtype".into(), "interrupt".into());
                    }
                    OutRequest::SetModel(model) => {
                        r.insert("subtype".into(), "set_model".into());
                        let model = model.clone().unwrap_or_else(|| "default".to_string());
                        r.insert("model".into(), model.into());
                    }
                    OutRequest::SetPermissionMode(mode) => {
                        r.insert("subtype".into(), "set_permission_mode".into());
                        r.insert("mode".into(), mode.clone().into());
                    }
                    OutRequest::SetMaxThinkingTokens(n) => {
                        r.insert("subtype".into(), "set_max_thinking_tokens".into());
                        r.insert("max_thinking_tokens".into(), json!(n));
                    }
                    OutRequest::McpStatus => {
                        r.insert("subtype".into(), "mcp_status".into());
                    }
                    OutRequest::Other { subtype, fields } => {
                        r.insert("subtype".into(), subtype.clone().into());
                        extend(&mut r, fields);
                    }
                }
                json!({"type": "control_request", "request_id": request_id, "request": r})
            }
            Outbound::ControlCancel { request_id } => {
                json!({"type": "control_cancel_request", "request_id": request_id})
            }
            Outbound::KeepAlive => json!({"type": "keep_alive"}),
        }
    }

    /// A plain-text user message (a new turn) for the main session.
    pub fn user_text(text: impl Into<String>, session_id: impl Into<String>) -> Self {
        Outbound::User {
            content: UserContent::Text(text.into()),
            parent_tool_use_id: None,
            session_id: session_id.into(),
        }
    }

    /// Allow a `can_use_tool` request, passing its input through unchanged.
    pub fn allow(request_id: impl Into<String>, request: &CanUseTool) -> Self {
        Outbound::ControlResponse {
            request_id: request_id.into(),
            body: ResponseBody::Allow {
                updated_input: request.input.clone(),
                updated_permissions: None,
            },
        }
    }

    /// Deny a `can_use_tool` request (the message is always sent; an empty one is replaced
    /// by a generic text because recent releases reject a deny without message).
    pub fn deny(
        request_id: impl Into<String>,
        message: impl Into<String>,
        interrupt: bool,
    ) -> Self {
        let mut message = message.into();
        if message.trim().is_empty() {
            message = "Permission denied.".to_string();
        }
        Outbound::ControlResponse {
            request_id: request_id.into(),
            body: ResponseBody::Deny { message, interrupt },
        }
    }

    /// Answer an AskUserQuestion `can_use_tool` request with the chosen labels.
    pub fn answer(
        request_id: impl Into<String>,
        request: &CanUseTool,
        answers: &[(String, Vec<String>)],
    ) -> Self {
        Outbound::ControlResponse {
            request_id: request_id.into(),
            body: ResponseBody::Allow {
                updated_input: answer_questions(request, answers),
                updated_permissions: None,
            },
        }
    }
}

fn success(request_id: &str, response: Value) -> Value {
    json!({"subtype": "success", "request_id": request_id, "response": response})
}

fn extend(r: &mut Map<String, Value>, fields: &Map<String, Value>) {
    for (k, v) in fields {
        if k != "subtype" {
            r.insert(k.clone(), v.clone());
        }
    }
}

/// Separator for the labels of a multi-select answer.
pub const MULTI_SELECT_SEPARATOR: &str = ", ";

/// The `updatedInput` answering an AskUserQuestion call: the original input plus an
/// `answers` map (question text -> chosen label(s), multi-select joined as the CLI expects).
pub fn answer_questions(request: &CanUseTool, answers: &[(String, Vec<String>)]) -> Value {
    let mut input = match &request.input {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let mut map = match input.remove("answers") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    for (question, labels) in answers {
        map.insert(
            question.clone(),
            Value::String(labels.join(MULTI_SELECT_SEPARATOR)),
        );
    }
    input.insert("answers".into(), Value::Object(map));
    Value::Object(input)
}

pub(crate) fn parse_questions(req: &CanUseTool) -> Option<Vec<Question>> {
    if req.tool_name != "AskUserQuestion" {
        return None;
    }
    let items = req.input.get("questions")?.as_array()?;
    Some(
        items
            .iter()
            .filter_map(|q| {
                let question = q.get("question")?.as_str()?.to_string();
                let header = q.get("header").and_then(Value::as_str).map(str::to_string);
                let multi_select = q
                    .get("multiSelect")
                    .or_else(|| q.get("multi_select"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let options = q
                    .get("options")
                    .and_then(Value::as_array)
                    .map(|opts| {
                        opts.iter()
                            .filter_map(|o| match o {
                                Value::String(s) => Some(QuestionOption {
                                    label: s.clone(),
                                    description: None,
                                }),
                                Value::Object(m) => Some(QuestionOption {
                                    label: m.get("label")?.as_str()?.to_string(),
                                    description: m
                                        .get("description")
                                        .and_then(Value::as_str)
                                        .map(str::to_string),
                                }),
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Some(Question {
                    question,
                    header,
                    options,
                    multi_select,
                })
            })
            .collect(),
    )
}
