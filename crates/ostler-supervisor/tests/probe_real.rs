//! The flag probe on real releases agrees with the measured matrix, on both sides of each
//! boundary: detection that works without knowing the version.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use ostler_supervisor::compat::{self, Flag, SdkUrl};
use ostler_supervisor::discover::probe_flags;

async fn check(version: &'static str) {
    let path = common::release(version).await;
    let probe = probe_flags(&path, ostler_testkit::timeouts::secs(60))
        .await
        .unwrap();
    let row = compat::matrix()
        .tested
        .iter()
        .find(|t| t.version == version)
        .unwrap();
    let got = |f: Flag| probe.accepted.get(&f).copied();
    assert_eq!(
        got(Flag::PermissionPromptTool),
        Some(row.stdio_permission_prompt),
        "{version}"
    );
    assert_eq!(
        got(Flag::IncludePartialMessages),
        Some(row.include_partial_messages),
        "{version}"
    );
    assert_eq!(got(Flag::ForkSession), Some(row.fork_session), "{version}");
    assert_eq!(got(Flag::MaxTurns), Some(row.max_turns), "{version}");
    assert_eq!(probe.sdk_url, row.sdk_url, "{version}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_matches_matrix_across_boundaries() {
    // 1.0.58: `--permission-prompt-tool` accepted but no stdio, no partial messages, no
    // fork; 1.0.117: partial messages but no fork. (The other sides of the boundaries are
    // probed by `ostler doctor`'s test on 2.1.330, which accepts everything.)
    tokio::join!(check("1.0.58"), check("1.0.117"));
}

#[tokio::test]
async fn sdk_url_is_refused_for_loopback_on_recent_releases() {
    let path = common::release("2.1.330").await;
    let probe = probe_flags(&path, ostler_testkit::timeouts::secs(60))
        .await
        .unwrap();
    assert_eq!(probe.sdk_url, SdkUrl::AnthropicOnly);
    assert!(probe.accepted.values().all(|ok| *ok), "{probe:?}");
}
