//! Target `convert`: gRPC request conversions on arbitrary requests.

use ostler_proto::v1 as pb;
use ostler_server::fuzzing as fz;
use proptest::prelude::*;
use proptest::sample::select;
use prost::Message;
use tonic::{Code, Status};

use crate::generate::{Blob, apply_edits, byte_edits};
use crate::{Budget, Failure, Report, drive};

/// Longest error message accepted (errors must not echo large input).
const MAX_MESSAGE: usize = 1024;

#[derive(Debug, Clone)]
enum Req {
    Create(pb::CreateSessionRequest),
    List(pb::ListSessionsRequest),
    Send(pb::SendMessageRequest),
    Respond(pb::RespondToPermissionRequest),
    Answer(pb::AnswerQuestionRequest),
}

#[derive(Debug, Clone)]
enum Case {
    /// A request built field by field.
    Built(Req),
    /// A built request, encoded, damaged, decoded as the `kind`-th request type.
    Damaged(Req, u8, Vec<(usize, u8, u8)>),
    /// Arbitrary bytes decoded as the `kind`-th request type.
    Bytes(u8, Blob),
}

fn s() -> BoxedStrategy<String> {
    prop_oneof![
        2 => Just(String::new()),
        1 => Just("  \t".to_owned()),
        4 => "\\PC{0,12}",
        2 => ".{0,12}",
        1 => "[\\x00-\\x20a]{0,4}",
        1 => (1000usize..70_000).prop_map(|n| "x".repeat(n)),
    ]
    .boxed()
}

fn int() -> impl Strategy<Value = i32> {
    prop_oneof![4 => -2i32..9, 1 => any::<i32>()]
}

fn strings() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(s(), 0..4)
}

fn labels() -> impl Strategy<Value = std::collections::HashMap<String, String>> {
    prop::collection::hash_map(s(), s(), 0..4)
}

fn rule() -> impl Strategy<Value = pb::PermissionRule> {
    (s(), s(), int()).prop_map(|(tool, pattern, action)| pb::PermissionRule {
        tool,
        pattern,
        action,
    })
}

fn content() -> impl Strategy<Value = Option<pb::MessageContent>> {
    use pb::input_block::Block;
    use pb::message_content::Content;
    let json = prop_oneof![
        select(
            &[
                "{\"type\":\"text\",\"text\":\"hi\"}",
                "{}",
                "[]",
                "{\"type\":1}",
                "nul",
                ""
            ][..]
        )
        .prop_map(str::to_owned),
        s(),
    ];
    let block = prop::option::of(prop_oneof![
        s().prop_map(Block::Text),
        (s(), s()).prop_map(|(media_type, data_base64)| Block::Image(pb::ImageBlock {
            media_type,
            data_base64
        })),
        json.prop_map(Block::Json),
    ])
    .prop_map(|block| pb::InputBlock { block });
    prop::option::of(
        prop::option::of(prop_oneof![
            s().prop_map(Content::Text),
            prop::collection::vec(block, 0..4)
                .prop_map(|blocks| Content::Blocks(pb::ContentBlocks { blocks })),
        ])
        .prop_map(|content| pb::MessageContent { content }),
    )
}

fn json_text() -> BoxedStrategy<String> {
    prop_oneof![
        select(
            &[
                "{}",
                "{\"a\":{\"description\":\"d\",\"prompt\":\"p\"}}",
                "{\"type\":\"object\"}",
                "[]",
                "null",
                "{",
                "/etc/hosts",
                "relative/path.json",
                ""
            ][..]
        )
        .prop_map(str::to_owned),
        s(),
    ]
    .boxed()
}

fn mcp_server() -> impl Strategy<Value = pb::McpServerSpec> {
    use pb::mcp_server_spec::Transport;
    let url = prop_oneof![
        select(
            &[
                "http://127.0.0.1:9/mcp",
                "https://x.test/sse",
                "ftp://x",
                "",
                "http://"
            ][..]
        )
        .prop_map(str::to_owned),
        s(),
    ];
    prop::option::of(prop_oneof![
        (s(), strings(), labels()).prop_map(|(command, args, env)| Transport::Stdio(
            pb::McpStdioServerSpec { command, args, env }
        )),
        (url.clone(), labels())
            .prop_map(|(url, headers)| Transport::Http(pb::McpRemoteServerSpec { url, headers })),
        (url, labels())
            .prop_map(|(url, headers)| Transport::Sse(pb::McpRemoteServerSpec { url, headers })),
    ])
    .prop_flat_map(|transport| {
        let policy = (
            s(),
            select(&["always_deny", "always_ask", "never", ""][..]),
            select(&["allow", "blocked", "x", ""][..]),
        )
            .prop_map(|(name, p, o)| pb::McpToolPolicy {
                name,
                permission_policy: p.to_owned(),
                org_max_permission: o.to_owned(),
            });
        (
            Just(transport),
            prop::option::of(prop_oneof![Just(0u64), Just(5_000), any::<u64>()]),
            prop::option::of(any::<bool>()),
            prop::collection::vec(policy, 0..3),
        )
    })
    .prop_map(
        |(transport, timeout_ms, always_load, tools)| pb::McpServerSpec {
            transport,
            timeout_ms,
            always_load,
            tools,
        },
    )
}

/// Issue 10's session options, valid and not.
fn with_options() -> impl Strategy<Value = pb::CreateSessionRequest> {
    let budget = prop::option::of(prop_oneof![
        Just(0.5f64),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(2.0e6),
        any::<f64>(),
    ]);
    let sources = prop::collection::vec(
        prop_oneof![
            select(&["user", "project", "local", "User", ""][..]).prop_map(str::to_owned),
            s()
        ],
        0..4,
    );
    (
        (
            s(),
            prop::collection::hash_map(s(), mcp_server(), 0..3),
            any::<bool>(),
            strings(),
            budget,
            prop::option::of(prop_oneof![Just(0u32), any::<u32>()]),
        ),
        (
            s(),
            json_text(),
            sources,
            json_text(),
            json_text(),
            labels(),
        ),
        (s(), s(), s(), any::<bool>()),
    )
        .prop_map(
            |(
                (system_prompt, mcp_servers, strict, add_dirs, max_budget_usd, thinking),
                (fallback_model, settings, setting_sources, agents_json, json_schema, env),
                (session_id, adopt, fork, checkpointing),
            )| {
                pb::CreateSessionRequest {
                    system_prompt,
                    mcp_servers,
                    strict_mcp_config: strict,
                    add_dirs,
                    max_budget_usd,
                    max_thinking_tokens: thinking,
                    fallback_model,
                    settings,
                    setting_sources,
                    agents_json,
                    json_schema,
                    env,
                    session_id,
                    adopt_claude_session_id: adopt,
                    fork_from_session_id: fork,
                    enable_file_checkpointing: checkpointing,
                    ..Default::default()
                }
            },
        )
}

fn req() -> impl Strategy<Value = Req> {
    use pb::respond_to_permission_request::Decision;
    let create = (
        (s(), s(), int(), strings(), strings(), s()),
        (
            prop::option::of(prop_oneof![Just(0u32), any::<u32>()]),
            labels(),
            content(),
            prop::collection::vec(rule(), 0..3),
        ),
        prop::option::of(with_options()),
    )
        .prop_map(
            |(
                (cwd, model, permission_mode, allowed_tools, disallowed_tools, append),
                (max_turns, labels, first_prompt, rules),
                options,
            )| {
                let r = pb::CreateSessionRequest {
                    cwd,
                    model,
                    permission_mode,
                    allowed_tools,
                    disallowed_tools,
                    append_system_prompt: append,
                    max_turns,
                    labels,
                    first_prompt,
                    rules,
                    // Issue 10's options from `with_options` (half the cases); issue
                    // 11's and the title keep their defaults here.
                    ..Default::default()
                };
                Req::Create(match options {
                    Some(o) => pb::CreateSessionRequest {
                        cwd: r.cwd,
                        model: r.model,
                        permission_mode: r.permission_mode,
                        allowed_tools: r.allowed_tools,
                        disallowed_tools: r.disallowed_tools,
                        append_system_prompt: r.append_system_prompt,
                        max_turns: r.max_turns,
                        labels: r.labels,
                        first_prompt: r.first_prompt,
                        rules: r.rules,
                        ..o
                    },
                    None => r,
                })
            },
        );
    let list = (
        prop::collection::vec(int(), 0..4),
        labels(),
        any::<u32>(),
        s(),
    )
        .prop_map(|(states, labels, page_size, page_token)| {
            Req::List(pb::ListSessionsRequest {
                states,
                labels,
                page_size,
                page_token,
                archived: None,
            })
        });
    let send = (
        s(),
        content(),
        s(),
        -1..5i32,
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(s(), 0..3),
    )
        .prop_map(
            |(session_id, content, client_message_id, priority, verbatim, context_only, pasted)| {
                Req::Send(pb::SendMessageRequest {
                    session_id,
                    content,
                    client_message_id,
                    priority,
                    verbatim,
                    context_only,
                    pasted,
                })
            },
        );
    let decision = prop::option::of(prop_oneof![
        (
            prop_oneof![
                select(&["", "{}", "{\"a\":1}", "[1]", "{", "null"][..]).prop_map(str::to_owned),
                s()
            ],
            prop::collection::vec(rule(), 0..3),
            prop_oneof![
                select(
                    &[
                        "",
                        "[]",
                        "[{\"type\":\"setMode\",\"mode\":\"acceptEdits\"}]",
                        "[{}]",
                        "{",
                    ][..]
                )
                .prop_map(str::to_owned),
                s()
            ]
        )
            .prop_map(|(updated_input_json, remember, updated_permissions_json)| {
                Decision::Allow(pb::PermissionAllow {
                    updated_input_json,
                    remember,
                    updated_permissions_json,
                })
            }),
        (s(), any::<bool>()).prop_map(|(message, interrupt)| Decision::Deny(pb::PermissionDeny {
            message,
            interrupt
        })),
    ]);
    let respond = (s(), s(), decision).prop_map(|(session_id, request_id, decision)| {
        Req::Respond(pb::RespondToPermissionRequest {
            session_id,
            request_id,
            decision,
        })
    });
    let answer = (
        s(),
        s(),
        prop::collection::vec(
            (s(), strings(), s()).prop_map(|(question, selected, other_text)| pb::QuestionAnswer {
                question,
                selected,
                other_text,
            }),
            0..4,
        ),
    )
        .prop_map(|(session_id, request_id, answers)| {
            Req::Answer(pb::AnswerQuestionRequest {
                session_id,
                request_id,
                answers,
            })
        });
    prop_oneof![create, list, send, respond, answer]
}

fn case() -> impl Strategy<Value = Case> {
    prop_oneof![
        4 => req().prop_map(Case::Built),
        2 => (req(), 0u8..5, byte_edits()).prop_map(|(r, k, e)| Case::Damaged(r, k, e)),
        1 => (0u8..5, prop::collection::vec(any::<u8>(), 0..256))
            .prop_map(|(k, b)| Case::Bytes(k, Blob(b))),
    ]
}

fn encode(r: &Req) -> Vec<u8> {
    match r {
        Req::Create(m) => m.encode_to_vec(),
        Req::List(m) => m.encode_to_vec(),
        Req::Send(m) => m.encode_to_vec(),
        Req::Respond(m) => m.encode_to_vec(),
        Req::Answer(m) => m.encode_to_vec(),
    }
}

/// Decodes `bytes` as the `kind`-th request type; `None` when protobuf rejects them (the
/// transport's concern, not the conversions').
fn decode(kind: u8, bytes: &[u8]) -> Option<Req> {
    match kind {
        0 => pb::CreateSessionRequest::decode(bytes)
            .ok()
            .map(Req::Create),
        1 => pb::ListSessionsRequest::decode(bytes).ok().map(Req::List),
        2 => pb::SendMessageRequest::decode(bytes).ok().map(Req::Send),
        3 => pb::RespondToPermissionRequest::decode(bytes)
            .ok()
            .map(Req::Respond),
        _ => pb::AnswerQuestionRequest::decode(bytes)
            .ok()
            .map(Req::Answer),
    }
}

fn convert_one(r: Req) -> Result<(), Status> {
    match r {
        Req::Create(m) => fz::create_session(m),
        Req::List(m) => fz::list_sessions(m),
        Req::Send(m) => fz::send_message(m),
        Req::Respond(m) => fz::respond_to_permission(m),
        Req::Answer(m) => fz::answer_question(m),
    }
}

fn check_one(r: Req) -> Result<(), TestCaseError> {
    if let Err(status) = convert_one(r) {
        prop_assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "a bad request must be INVALID_ARGUMENT: {}",
            crate::clip(status.message().to_owned(), 300)
        );
        prop_assert!(
            status.message().len() <= MAX_MESSAGE,
            "error message of {} bytes (input echoed?): {}",
            status.message().len(),
            crate::clip(status.message().to_owned(), 300)
        );
        prop_assert!(!status.message().trim().is_empty(), "empty error message");
    }
    Ok(())
}

fn check(c: Case) -> Result<(), TestCaseError> {
    match c {
        Case::Built(r) => check_one(r),
        Case::Damaged(r, kind, edits) => {
            let mut bytes = encode(&r);
            apply_edits(&mut bytes, &edits);
            match decode(kind, &bytes) {
                Some(r) => check_one(r),
                None => Ok(()),
            }
        }
        Case::Bytes(kind, b) => match decode(kind, &b.0) {
            Some(r) => check_one(r),
            None => Ok(()),
        },
    }
}

/// Runs the convert target until the budget's deadline.
pub fn convert(budget: Budget) -> Result<Report, Failure> {
    drive("convert", budget, case(), check)
}
