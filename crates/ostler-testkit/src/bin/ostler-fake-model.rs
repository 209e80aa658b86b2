//! `ostler-fake-model [SCENARIO.toml]`: run the fake Anthropic model server on an ephemeral
//! loopback port. The first stdout line is the base URL; each request is logged to stderr
//! as one JSON line (method, path, rule, status). Runs until Ctrl-C / SIGTERM.
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
    let mut logged = 0usize;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = server.wait_for_requests(logged + 1, Duration::from_secs(3600)) => {
                let reqs = server.requests();
                for r in reqs.iter().skip(logged) {
                    eprintln!("{}", serde_json::json!({
                        "seq": r.seq, "method": r.method, "path": r.path,
                        "rule": r.rule, "rule_name": r.rule_name, "status": r.status,
                        "model": r.body.as_ref().and_then(|b| b.get("model")).cloned(),
                    }));
                }
                logged = reqs.len();
            }
        }
    }
    Ok(())
}
