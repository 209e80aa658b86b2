//! `ostler doctor [--claude PATH]`: what the daemon would find at start-up.
//!
//! Prints the detected binary, release, compatibility level, the protocol adapter chosen
//! and the capabilities, and the store (its schema version, whether it would be upgraded;
//! checked without writing to it), and exits with the daemon's start-up codes: 0 when the
//! daemon would start (any level but INCOMPATIBLE), 72 when no usable `claude` binary is
//! found, 78 when the binary is unusable or older than the minimum supported release (or
//! the configuration is refused), 1 when the store would be refused (or a running daemon
//! holds it).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use ostler_supervisor::{DiscoverError, DiscoverOptions, Installation, compat};

#[derive(clap::Args, Debug, Default)]
pub struct DoctorArgs {
    /// The `claude` binary to check (default: `claude.path` of the daemon's configuration,
    /// else the first `claude` on PATH).
    #[arg(long, value_name = "PATH")]
    pub claude: Option<PathBuf>,
    /// The daemon's configuration file (default: as `ostler serve`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Do not probe the binary's flags; use the embedded compatibility matrix alone.
    #[arg(long)]
    pub no_probe: bool,
    /// Timeout of `claude --version`, in seconds.
    #[arg(long, default_value_t = 30)]
    pub version_timeout: u64,
    /// Print the report as one JSON object (same exit codes).
    #[arg(long)]
    pub json: bool,
}

/// Run the check; returns the exit code.
pub fn run(args: DoctorArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return 70;
        }
    };
    let mut out = std::io::stdout();
    let code = rt.block_on(report(args, &mut out));
    let _ = out.flush();
    code
}

/// The check, writing the report to `out`; returns the exit code. A failing `out` (closed
/// pipe) does not change the exit code.
pub async fn report(args: DoctorArgs, out: &mut (dyn Write + Send)) -> i32 {
    // The same configuration layers as the daemon (file, environment, flags).
    let overrides = crate::config::Overrides {
        claude: args.claude.clone(),
        no_probe: args.no_probe,
        ..Default::default()
    };
    // Checked as `serve` checks it: what it refuses (exit 78), doctor reports.
    let loaded = crate::config::load(args.config.as_deref(), &overrides)
        .and_then(|c| c.validate().map(|v| (c, v.store_path)));
    let (cfg, store_path) = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            if args.json {
                let v = serde_json::json!({
                    "error": format!("{e:#}"), "exit_code": 78, "would_start": false,
                });
                let _ = writeln!(out, "{v}");
            } else {
                let _ = writeln!(out, "error:         {e:#}");
                let _ = writeln!(out, "daemon:        would refuse to start (exit 78)");
            }
            return 78;
        }
    };
    let opts = DiscoverOptions {
        claude_path: cfg.claude.path.clone(),
        probe_flags: cfg.claude.probe_flags,
        version_timeout: Duration::from_secs(args.version_timeout.max(1)),
        // Always measured: doctor is what an operator runs when in doubt, and it must not
        // repeat what a daemon cached (`claude.discovery_cache` is for `serve` alone).
        cache: None,
        ..DiscoverOptions::default()
    };
    let result = ostler_supervisor::discover(&opts).await;
    // A policy the release would not enforce stops the daemon too (exit 78).
    let policy = result.as_ref().ok().and_then(|i| {
        crate::serve::unenforced_policy(!cfg.sessions.managed_settings.is_empty(), i)
    });
    // The store as `serve` would open it (checked without writing to it): a store it
    // would refuse stops the daemon with exit 1.
    let store = ostler_store::Store::inspect(&store_path);
    // A daemon serving the store: another would be refused (exit 1).
    let in_use = crate::serve::store_in_use(&store_path);
    let code = match (&result, &policy, &store) {
        (Err(e), _, _) => e.exit_code(),
        (Ok(_), Some(_), _) => 78,
        (Ok(_), None, Err(_)) => 1,
        (Ok(_), None, Ok(_)) if in_use => 1,
        (Ok(_), None, Ok(_)) => 0,
    };
    if let Err(e) = &result {
        eprintln!("error: {e}");
    }
    if let Some(p) = &policy {
        eprintln!("error: {p}");
    }
    if let Err(e) = &store {
        eprintln!("error: store: {e}");
    }
    let store = StoreReport {
        path: store_path,
        found: store,
        in_use,
    };
    if args.json {
        let _ = writeln!(
            out,
            "{}",
            json_report(&result, policy.as_deref(), &store, code)
        );
    } else {
        let _ = write_report(out, &result, policy.as_deref(), &store, code);
    }
    code
}

/// The store's part of the report.
struct StoreReport {
    path: PathBuf,
    found: ostler_store::Result<ostler_store::Inspection>,
    /// A daemon holds the store's lock.
    in_use: bool,
}

impl StoreReport {
    /// `schema 10 (current)`, `schema 7: upgraded to 10 at start`, `none yet: created at
    /// start`, or the error; and whether a daemon serves it.
    fn describe(&self) -> String {
        let found = self.found_text();
        if self.in_use && self.found.is_ok() {
            format!(
                "{found}; in use by a running ostler daemon (it holds {}): another one \
                 would be refused",
                crate::serve::lock_path(&self.path).display()
            )
        } else {
            found
        }
    }

    fn found_text(&self) -> String {
        let now = ostler_store::SCHEMA_VERSION;
        match &self.found {
            Ok(ostler_store::Inspection { version: None }) => {
                "none yet: created at start".to_owned()
            }
            Ok(ostler_store::Inspection { version: Some(v) }) if *v == now => {
                format!("schema {v} (current)")
            }
            Ok(ostler_store::Inspection { version: Some(0) }) => {
                format!("empty: given schema {now} at start")
            }
            Ok(ostler_store::Inspection { version: Some(v) }) => {
                format!("schema {v}: upgraded to {now} at start (docs/operations.md, \"Upgrades\")")
            }
            Err(e) => format!("error: {e}"),
        }
    }
}

/// The report as one JSON object (`ostler doctor --json`).
fn json_report(
    result: &Result<Installation, DiscoverError>,
    policy: Option<&str>,
    store: &StoreReport,
    code: i32,
) -> serde_json::Value {
    use serde_json::json;
    let inst = match result {
        Ok(i) => Some(i),
        Err(e) => e.installation(),
    };
    let m = compat::matrix();
    let installation = inst.map(|i| {
        json!({
            "binary": i.path.display().to_string(),
            "release": i.version.to_string(),
            "version_output": i.version_output,
            "api_date": i.api_date,
            "level": i.level.to_string(),
            "status": i.message,
            "adapter": i.adapter,
            "capabilities": i.capabilities.summary().to_string(),
            "announced": i.capabilities.announced,
            "flag_probe": i.probe.as_ref().map(|p| p
                .accepted
                .iter()
                .map(|(f, ok)| (f.as_arg().to_string(), json!(ok)))
                .collect::<serde_json::Map<_, _>>()),
            "degraded": i.degraded.iter().map(|d| json!({
                "capability": d.capability.to_string(), "workaround": d.workaround.to_string(),
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "installation": installation,
        "error": result
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .or(policy.map(str::to_owned))
            .or(store.found.as_ref().err().map(|e| format!("store: {e}"))),
        "store": {
            "path": store.path.display().to_string(),
            "schema_version": store.found.as_ref().ok().and_then(|i| i.version),
            "supported_version": ostler_store::SCHEMA_VERSION,
            "status": store.describe(),
            "ok": store.found.is_ok(),
            "in_use": store.in_use,
        },
        "minimum_supported": m.minimum.to_string(),
        "newest_tested": m.newest_tested().map(|v| v.to_string()),
        "would_start": code == 0,
        "exit_code": code,
    })
}

fn write_report(
    out: &mut (dyn Write + Send),
    result: &Result<Installation, DiscoverError>,
    policy: Option<&str>,
    store: &StoreReport,
    code: i32,
) -> std::io::Result<()> {
    match result {
        Ok(inst) => {
            print_installation(out, inst)?;
            if let Some(p) = policy {
                writeln!(out, "error:         {p}")?;
            }
        }
        Err(e) => {
            if let Some(inst) = e.installation() {
                print_installation(out, inst)?;
            }
            writeln!(out, "error:         {e}")?;
            if let DiscoverError::NotFound { .. } = e {
                writeln!(
                    out,
                    "install:       npm install -g @anthropic-ai/claude-code  (or pass --claude PATH)"
                )?;
            }
        }
    }
    let m = compat::matrix();
    let newest = m
        .newest_tested()
        .map(|v| v.to_string())
        .unwrap_or_else(|| "-".into());
    writeln!(
        out,
        "supported:     {} or newer (tested up to {newest})",
        m.minimum
    )?;
    writeln!(
        out,
        "store:         {}: {}",
        store.path.display(),
        store.describe()
    )?;
    if code == 0 {
        writeln!(out, "daemon:        would start (exit 0)")
    } else {
        writeln!(out, "daemon:        would refuse to start (exit {code})")
    }
}

fn print_installation(out: &mut (dyn Write + Send), i: &Installation) -> std::io::Result<()> {
    writeln!(out, "binary:        {}", i.path.display())?;
    writeln!(out, "release:       {}", i.version)?;
    writeln!(out, "--version:     {}", i.version_output)?;
    if let Some(d) = &i.api_date {
        writeln!(out, "api date:      {d}")?;
    }
    writeln!(out, "level:         {}", i.level)?;
    writeln!(out, "status:        {}", i.message)?;
    writeln!(out, "adapter:       {}", i.adapter)?;
    let source = match i.capabilities.source {
        compat::CapabilitySource::Matrix => "pinned release (compatibility matrix)",
        compat::CapabilitySource::Probed => "probed on this binary",
        compat::CapabilitySource::Inferred => "inferred from the measured boundaries",
    };
    writeln!(
        out,
        "capabilities:  {} [{source}]",
        i.capabilities.summary()
    )?;
    if let Some(p) = &i.probe {
        let flags: Vec<String> = p
            .accepted
            .iter()
            .map(|(f, ok)| {
                format!(
                    "{}={}",
                    f.as_arg(),
                    if *ok { "accepted" } else { "refused" }
                )
            })
            .collect();
        writeln!(out, "flag probe:    {}", flags.join(" "))?;
    }
    if i.capabilities.announced.is_empty() {
        writeln!(
            out,
            "announced:     none (this release announces no capabilities in system/init)"
        )?;
    } else {
        writeln!(
            out,
            "announced:     {} capabilities: {}",
            i.capabilities.announced.len(),
            i.capabilities.announced.join(", ")
        )?;
    }
    for d in &i.degraded {
        writeln!(out, "degraded:      {} -> {}", d.capability, d.workaround)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn doctor(claude: PathBuf, no_probe: bool) -> (i32, String) {
        doctor_with(claude, no_probe, None).await
    }

    async fn doctor_with(
        claude: PathBuf,
        no_probe: bool,
        config: Option<PathBuf>,
    ) -> (i32, String) {
        let mut out = Vec::new();
        let code = report(
            DoctorArgs {
                claude: Some(claude),
                config,
                no_probe,
                version_timeout: 30,
                json: false,
            },
            &mut out,
        )
        .await;
        (code, String::from_utf8_lossy(&out).into_owned())
    }

    fn release(v: &str) -> PathBuf {
        ostler_testkit::releases::ensure(v, &ostler_testkit::releases::default_cache_dir())
            .expect("install release")
    }

    /// Every pinned release: the level the matrix promises and the daemon's exit code.
    /// The releases are checked concurrently (each `--version` of a 1.0.x release is a node
    /// start-up of about 2 s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn doctor_on_every_pinned_release() {
        let pinned = ostler_testkit::releases::pinned().expect("pinned releases");
        let minimum = semver::Version::parse(compat::matrix().minimum).expect("minimum");
        // Two at a time: the machine has few cores and node start-up is CPU-bound.
        let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(2));
        let mut tasks = Vec::new();
        for r in pinned {
            let limit = limit.clone();
            tasks.push(tokio::spawn(async move {
                let _permit = limit.acquire_owned().await.expect("semaphore");
                let path = tokio::task::spawn_blocking({
                    let v = r.version.clone();
                    move || release(&v)
                })
                .await
                .expect("install task");
                let (code, out) = doctor(path.clone(), true).await;
                (r.version, path, code, out)
            }));
        }
        for t in tasks {
            let (version, path, code, out) = t.await.expect("doctor task");
            let v = semver::Version::parse(&version).expect("version");
            assert!(
                out.contains(&format!("binary:        {}", path.display())),
                "{out}"
            );
            assert!(out.contains(&format!("release:       {v}")), "{out}");
            assert!(out.contains("adapter:       v"), "{out}");
            assert!(out.contains("capabilities:  "), "{out}");
            if v < minimum {
                assert_eq!(code, 78, "{version}: {out}");
                assert!(out.contains("level:         INCOMPATIBLE"), "{out}");
                assert!(out.contains(&minimum.to_string()), "{out}");
            } else {
                assert_eq!(code, 0, "{version}: {out}");
                assert!(out.contains("daemon:        would start"), "{out}");
            }
        }
    }

    /// The store as `serve` would open it, checked without writing: none yet, the current
    /// schema, one serve would refuse (exit 1).
    #[tokio::test]
    async fn doctor_reports_the_store_as_serve_would_open_it() {
        let dir = tempfile::tempdir().unwrap();
        let claude = tokio::task::spawn_blocking(|| release("2.1.332"))
            .await
            .unwrap();
        let with_store = |name: &str| {
            let config = dir.path().join(format!("{name}.toml"));
            let store = dir.path().join(name);
            std::fs::write(
                &config,
                format!("[store]\npath = {:?}\n", store.display().to_string()),
            )
            .unwrap();
            (config, store)
        };
        // None yet: created at start.
        let (config, store) = with_store("new.db");
        let (code, out) = doctor_with(claude.clone(), true, Some(config)).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("none yet: created at start"), "{out}");
        assert!(!store.exists(), "the doctor created the store");
        // The current schema.
        let (config, store) = with_store("current.db");
        drop(ostler_store::Store::open(&store, Default::default()).unwrap());
        let (code, out) = doctor_with(claude.clone(), true, Some(config.clone())).await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(&format!(
                "schema {} (current)",
                ostler_store::SCHEMA_VERSION
            )),
            "{out}"
        );
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("current.db") && !n.ends_with(".toml"))
            .collect();
        files.sort();
        assert_eq!(files, ["current.db"], "the doctor wrote beside the store");
        // A daemon serving it (holding its lock as `serve` does): another would be refused.
        let lock = crate::serve::lock_store(&store).unwrap();
        let (code, out) = doctor_with(claude.clone(), true, Some(config.clone())).await;
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains("in use by a running ostler daemon")
                && out.contains("would refuse to start (exit 1)"),
            "{out}"
        );
        drop(lock);
        let (code, out) = doctor_with(claude.clone(), true, Some(config)).await;
        assert_eq!(code, 0, "the lock released: {out}");
        // A store serve would refuse: exit 1, said.
        let (config, store) = with_store("a-dir.db");
        std::fs::create_dir(&store).unwrap();
        let (code, out) = doctor_with(claude, true, Some(config)).await;
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains("is a directory") && out.contains("would refuse to start (exit 1)"),
            "{out}"
        );
    }

    /// With `sessions.managed_settings`, the doctor says what the daemon would do: 2.1.121
    /// accepts the flag and does not enforce it (78, the key named), 2.1.332 enforces it.
    #[tokio::test]
    async fn doctor_refuses_a_policy_the_release_would_not_enforce() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "[sessions.managed_settings]\npermissions = { deny = [\"Bash\"] }\n",
        )
        .unwrap();
        let old = tokio::task::spawn_blocking(|| release("2.1.121"))
            .await
            .unwrap();
        let (code, out) = doctor_with(old, true, Some(config.clone())).await;
        assert_eq!(code, 78, "{out}");
        assert!(
            out.contains("error:         sessions.managed_settings: Claude Code 2.1.121")
                && out.contains("would refuse to start (exit 78)"),
            "{out}"
        );
        let new = tokio::task::spawn_blocking(|| release("2.1.332"))
            .await
            .unwrap();
        let (code, out) = doctor_with(new, true, Some(config)).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("would start (exit 0)"), "{out}");
    }

    /// The full check, flag probe included, on the oldest and newest pinned sides.
    #[tokio::test]
    async fn doctor_probes_flags() {
        let p = tokio::task::spawn_blocking(|| release("2.1.330"))
            .await
            .expect("install task");
        let (code, out) = doctor(p, false).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("level:         FULLY_COMPATIBLE"), "{out}");
        assert!(out.contains("--include-partial-messages=accepted"), "{out}");
        assert!(out.contains("interrupt_receipt_v1"), "{out}");
    }

    #[tokio::test]
    async fn doctor_missing_binary_exits_72() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (code, out) = doctor(dir.path().join("no-claude-here"), true).await;
        assert_eq!(code, 72, "{out}");
        assert!(out.contains("no-claude-here"), "{out}");
        assert!(out.contains("npm install"), "{out}");
    }
}
