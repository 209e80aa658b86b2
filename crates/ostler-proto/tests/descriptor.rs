//! The embedded descriptor set must describe the public API under its agreed names.

use prost::Message;

#[test]
fn descriptor_set_names_the_public_services() {
    let fds = prost_types::FileDescriptorSet::decode(ostler_proto::FILE_DESCRIPTOR_SET)
        .expect("descriptor set decodes");
    let services: Vec<String> = fds
        .file
        .iter()
        .filter(|f| f.package() == "ostler.v1")
        .flat_map(|f| f.service.iter().map(|s| s.name().to_owned()))
        .collect();
    assert!(
        services.contains(&"SessionService".to_owned()),
        "{services:?}"
    );
    assert!(
        services.contains(&"DaemonService".to_owned()),
        "{services:?}"
    );
    let session = fds
        .file
        .iter()
        .flat_map(|f| f.service.iter())
        .find(|s| s.name() == "SessionService")
        .expect("SessionService");
    let methods: Vec<&str> = session.method.iter().map(|m| m.name()).collect();
    for m in [
        "CreateSession",
        "GetSession",
        "ListSessions",
        "SendMessage",
        "Subscribe",
        "RespondToPermission",
        "AnswerQuestion",
        "Interrupt",
        "SetModel",
        "SetPermissionMode",
        "StopSession",
        "ResumeSession",
        "DeleteSession",
        "GetSessionInfo",
        "SetMaxThinkingTokens",
        "GetContextUsage",
        "GetMcpStatus",
        "SetMcpServers",
        "ToggleMcpServer",
        "ReconnectMcpServer",
        "RewindFiles",
        "StopTask",
        "SendControlRequest",
    ] {
        assert!(methods.contains(&m), "missing {m}: {methods:?}");
    }
    let subscribe = session
        .method
        .iter()
        .find(|m| m.name() == "Subscribe")
        .expect("Subscribe");
    assert!(subscribe.server_streaming(), "Subscribe streams");
}

#[test]
fn generated_enums_round_trip() {
    use ostler_proto::v1::{CompatibilityLevel, SessionState};
    assert_eq!(
        SessionState::from_str_name("SESSION_STATE_AWAITING_PERMISSION"),
        Some(SessionState::AwaitingPermission)
    );
    assert_eq!(
        CompatibilityLevel::try_from(4).ok(),
        Some(CompatibilityLevel::Incompatible)
    );
    assert!(SessionState::try_from(99).is_err());
}
