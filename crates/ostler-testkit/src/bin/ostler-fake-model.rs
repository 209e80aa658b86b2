//! `ostler-fake-model [SCENARIO.toml]`: run the fake Anthropic model server on an ephemeral
//! loopback port. The first stdout line is the base URL; each request is logged to stderr
//! as one JSON line (method, path, rule, status; with `OSTLER_FAKE_MODEL_BODIES=1` also
//! the request's last message, cut to 600 bytes, and its `thinking`, for writing rules by
//! hand; with `OSTLER_FAKE_MODEL_BODIES=full` also the whole body). Runs until Ctrl-C / SIGTERM.
#![allow(clippy::disallowed_methods)] // test support binary

use std::time::Duration;

use ostler_testkit::{FakeModelServer, Scenario};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let scenario = match std::env::args().nth(1) {
        Some(p) => {
            let path = std::path::PathBuf::from(&p);
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("scenario")
                .to_string();
            Scenario::from_toml(&name, &std::fs::read_to_string(&path)?)?
        }
        None => Scenario::default(),
    };
    let server = FakeModelServer::start(scenario).await?;
    println!("{}", server.url());
    let bodies_env = std::env::var_os("OSTLER_FAKE_MODEL_BODIES");
    let full = bodies_env.as_ref().is_some_and(|v| v == "full");
    let bodies = full || bodies_env.is_some_and(|v| v == "1");
    let mut logged = 0usize;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = server.wait_for_requests(logged + 1, Duration::from_secs(3600)) => {
                let reqs = server.requests();
                for r in reqs.iter().skip(logged) {
                    let mut line = serde_json::json!({
                        "seq": r.seq, "method": r.method, "path": r.path,
                        "rule": r.rule, "rule_name": r.rule_name, "status": r.status,
                        "model": r.body.as_ref().and_then(|b| b.get("model")).cloned(),
                    });
                    if bodies {
                        let last = r
                            .body
                            .as_ref()
                            .and_then(|b| b["messages"].as_array()?.last().cloned())
                            .map(|m| m.to_string())
                            .unwrap_or_default();
                        let cut = (0..=last.len().min(600))
                            .rev()
                            .find(|&i| last.is_char_boundary(i))
                            .unwrap_or(0);
                        line["last_message"] = last[..cut].into();
                        line["thinking"] =
                            r.body.as_ref().map(|b| b["thinking"].clone()).unwrap_or_default();
                    }
                    if full {
                        line["body"] = r.body.clone().unwrap_or_default();
                    }
                    eprintln!("{line}");
                }
                logged = reqs.len();
            }
        }
    }
    Ok(())
}
