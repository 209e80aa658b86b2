//! `cargo run -p ostler-testkit --example dump_requests -- RELEASE SCENARIO`: record a
//! scenario without writing it and print the model requests the CLI made (debugging aid).
#![allow(clippy::disallowed_methods)] // test support

use ostler_testkit::{RecordOptions, Scenario, record, releases, scenario};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rel = args.next().ok_or("RELEASE")?;
    let name = args.next().ok_or("SCENARIO")?;
    let s = if name.ends_with(".toml") {
        Scenario::from_toml("adhoc", &std::fs::read_to_string(&name)?)?
    } else {
        Scenario::load(&scenario::scenarios_dir(), &name)?
    };
    let bin = releases::installed(&rel)?;
    let rec = record(&s, &RecordOptions::new(rel, bin)).await?;
    for r in &rec.requests {
        let b = r.body.as_ref();
        let last = b
            .and_then(|b| b.get("messages"))
            .and_then(|m| m.as_array())
            .and_then(|m| m.last())
            .map(|m| m.to_string())
            .unwrap_or_default();
        let sys = b
            .and_then(|b| b.get("system"))
            .map(|s| s.to_string())
            .unwrap_or_default();
        println!(
            "#{} {} {} rule={:?} status={} model={} stream={} nmsg={} max_tokens={}\n   sys: {}\n   last: {}",
            r.seq,
            r.method,
            r.path,
            r.rule_name,
            r.status,
            b.and_then(|b| b.get("model"))
                .map(|m| m.to_string())
                .unwrap_or_default(),
            b.and_then(|b| b.get("stream"))
                .map(|m| m.to_string())
                .unwrap_or_default(),
            b.and_then(|b| b.get("messages"))
                .and_then(|m| m.as_array())
                .map(|m| m.len())
                .unwrap_or(0),
            b.and_then(|b| b.get("max_tokens"))
                .map(|m| m.to_string())
                .unwrap_or_default(),
            sys.chars().take(300).collect::<String>(),
            last.chars().take(400).collect::<String>(),
        );
    }
    if std::env::var_os("SHOW_STDERR").is_some() {
        eprintln!("{}", rec.stderr);
    }
    if std::env::var_os("SHOW_TEXT").is_some() {
        println!("{}", rec.text);
    }
    Ok(())
}
