//! Messages ostler writes to the CLI's stdin. Each encodes to one JSON line (with `\n`).

use serde_json::Value;

use crate::model::{CanUseTool, Question};

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
        unimplemented!("outbound")
    }
}

/// The `updatedInput` answering an AskUserQuestion call: the original input plus an
/// `answers` map (question text -> chosen label(s), multi-select joined as the CLI expects).
pub fn answer_questions(_request: &CanUseTool, _answers: &[(String, Vec<String>)]) -> Value {
    unimplemented!("outbound")
}

pub(crate) fn parse_questions(_req: &CanUseTool) -> Option<Vec<Question>> {
    unimplemented!("outbound")
}
