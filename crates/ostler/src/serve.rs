//! `ostler serve`: the daemon.
//!
//! Start-up: configuration (see [`crate::config`]) -> logging -> the Claude Code version
//! check (exit 72 when no usable binary is found, 78 when the one found is unusable) ->
//! the store's lock -> listeners, served at once (health NOT_SERVING, other calls
//! UNAVAILABLE, metrics `ostler_ready 0`) -> store (schema migrations) -> engine -> ready.
//! Once ready, the addresses are logged and, with `--ready-file`, written to that file
//! (atomically, one `tcp://ADDR` / `unix://PATH` per line, and `http://ADDR/metrics` for
//! the metrics endpoint when `[metrics] listen` is set) so that scripts and tests can wait
//! for it instead of sleeping.
//!
//! Shutdown on SIGINT/SIGTERM: health turns NOT_SERVING, subscribers get `UNAVAILABLE`,
//! listeners stop accepting, the engine stops every session the supervisor's way, and the
//! store is flushed (its writer drains its queue when the last handle is dropped).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::config::{self, Overrides};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (default: config.toml in the platform config directory).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// TCP address to listen on (`127.0.0.1:0` picks a free port). Overrides `listen.addr`.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Also listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    unix_socket: Option<PathBuf>,
    /// Write the bound addresses to this file once the daemon is ready (serves calls).
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// Bearer tokens, one per line.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The SQLite file (default: ostler.db in the platform data directory).
    #[arg(long, value_name = "FILE")]
    store: Option<PathBuf>,
    /// The `claude` binary (default: search PATH).
    #[arg(long, value_name = "PATH")]
    claude: Option<PathBuf>,
    /// Most live CLI processes (`sessions.max_live`): at the cap the least recently used
    /// idle session is suspended to make room.
    #[arg(long, value_name = "N")]
    max_sessions: Option<u64>,
    /// A directory sessions may run in (repeatable). Default: any.
    #[arg(long = "allowed-root", value_name = "DIR")]
    allowed_roots: Vec<PathBuf>,
    /// `human` or `json`.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// tracing filter, e.g. `info,ostler_engine=debug` (RUST_LOG wins).
    #[arg(long, value_name = "FILTER")]
    log_filter: Option<String>,
    /// TLS certificate (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Skip probing the CLI's flags at start (faster; the compatibility matrix decides).
    #[arg(long)]
    no_probe: bool,
    /// Measure the CLI at start even when `claude-discovery.json` (next to the store) knows
    /// this binary. Overrides `claude.discovery_cache`.
    #[arg(long)]
    no_discovery_cache: bool,
    /// Set a variable for every session (repeatable; adds to `[sessions.env]`). Prefer the
    /// config file for secrets: command lines are visible to other users.
    #[arg(long = "session-env", value_name = "NAME=VALUE", value_parser = parse_session_env)]
    session_env: Vec<(String, String)>,
    /// Serve Prometheus metrics on this TCP address, path /metrics. Overrides `metrics.listen`.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
}

fn parse_session_env(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err("expected NAME=VALUE".to_owned()),
    }
}

impl ServeArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            unix_socket: self.unix_socket.clone(),
            token_file: self.token_file.clone(),
            store: self.store.clone(),
            claude: self.claude.clone(),
            max_live: self.max_sessions,
            allowed_roots: self.allowed_roots.clone(),
            log_format: self.log_format.clone(),
            log_filter: self.log_filter.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tls_client_ca: self.tls_client_ca.clone(),
            no_probe: self.no_probe,
            no_discovery_cache: self.no_discovery_cache,
            session_env: self.session_env.clone(),
            metrics_listen: self.metrics_listen.clone(),
        }
    }
}

/// Exit code for configuration errors (`EX_CONFIG`).
const EXIT_CONFIG: i32 = 78;

/// Runs the daemon; returns the process exit code.
pub fn run(args: ServeArgs) -> i32 {
    let cfg = match config::load(args.config.as_deref(), &args.overrides()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ostler serve: {e:#}");
            return EXIT_CONFIG;
        }
    };
    let valid = match cfg.validate() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ostler serve: invalid configuration: {e:#}");
            return EXIT_CONFIG;
        }
    };
    init_logging(&cfg.log.filter, valid.json_logs);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = valid.worker_threads {
        builder.worker_threads(n);
    }
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return 1;
        }
    };
    tracing::info!(
        workers = rt.metrics().num_workers(),
        "async runtime started"
    );
    match rt.block_on(daemon(args, cfg, valid)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "daemon failed");
            1
        }
    }
}

fn init_logging(filter: &str, json: bool) {
    use tracing_subscriber::EnvFilter;
    // RUST_LOG wins when it is set, not empty and valid; an invalid one is not silently
    // ignored: the daemon says so in its first lines (the configured filter is used).
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let mut ignored = None;
    let from_env = env.as_deref().and_then(|v| match EnvFilter::try_new(v) {
        Ok(f) => Some(f),
        Err(e) => {
            ignored = Some((crate::client::render::clip(v, 200), e.to_string()));
            None
        }
    });
    let filter = from_env
        .or_else(|| EnvFilter::try_new(filter).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    // Colour only on a terminal (never into files or the journal), and never with NO_COLOR.
    let ansi = {
        use std::io::IsTerminal as _;
        crate::client::render::colour_for(std::io::stderr().is_terminal())
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // Spans (session_id, method) are part of every line in both formats. `try_init` fails
    // only when a subscriber is already installed, which is then kept.
    let _ = if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init()
    } else {
        builder.try_init()
    };
    if let Some((value, error)) = ignored {
        tracing::warn!(
            rust_log = value,
            error,
            "RUST_LOG is not a valid tracing filter and is ignored; the configured log.filter is used"
        );
    }
}

async fn daemon(args: ServeArgs, cfg: config::Config, valid: config::Validated) -> Result<i32> {
    let version = env!("CARGO_PKG_VERSION");
    tracing::info!(version, "ostler daemon starting");
    // Signals from the start: a SIGTERM during the checks below ends the daemon as one
    // later does (nothing left behind), not by the default action.
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())?;

    // 1. The Claude Code version check (exit 72 / 78).
    let discover_opts = ostler_supervisor::DiscoverOptions {
        claude_path: cfg.claude.path.clone(),
        probe_flags: cfg.claude.probe_flags,
        // Next to the store, in the daemon user's data directory (made 0700 when missing),
        // written once the store has opened (below): a start that fails before leaves no
        // file, nor the directory.
        cache: cfg
            .claude
            .discovery_cache
            .then(|| discovery_cache_path(&valid.store_path)),
        ..Default::default()
    };
    let discovered = tokio::select! {
        r = ostler_supervisor::discover_deferring_cache(&discover_opts) => r,
        // Dropping the check kills its `claude --version` process group.
        () = shutdown.cancelled() => {
            tracing::info!("ostler daemon stopped before it started");
            return Ok(0);
        }
    };
    let (installation, discovery_cache) = match discovered {
        Ok(i) => i,
        Err(e) => {
            tracing::error!(error = %e, exit_code = e.exit_code(), "Claude Code check failed");
            return Ok(e.exit_code());
        }
    };
    if installation.level == ostler_supervisor::CompatLevel::FullyCompatible {
        tracing::info!(
            version = %installation.version,
            path = %installation.path.display(),
            "Claude Code {} detected (compatible)",
            installation.version
        );
    } else {
        tracing::warn!(
            version = %installation.version,
            level = installation.level.as_str(),
            "{}",
            installation.message
        );
    }
    if let Some(why) = unenforced_policy(valid.managed_settings.is_some(), &installation) {
        // The policy would not hold: start no session rather than sessions without it.
        eprintln!("ostler serve: invalid configuration: {why}");
        return Ok(EXIT_CONFIG);
    }
    let claude_info = claude_info(&installation);
    // TLS material that does not load is a configuration error (exit 78, which a service
    // manager does not restart on), found before anything is bound or created.
    let tls = match tls_options(valid.tls.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ostler serve: invalid configuration: {e:#}");
            return Ok(EXIT_CONFIG);
        }
    };

    // 2. The store's lock and the process trees.
    if let Some(dir) = valid.store_path.parent()
        && !dir.as_os_str().is_empty()
    {
        // The store's directory, when made here, is the daemon user's alone (0700): the
        // store holds every conversation. Missing parents too (made with the umask, another
        // user could replace the store's directory under them). An existing directory
        // keeps its mode.
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("store.path: cannot create {}", dir.display()))?;
    }
    // One daemon per database: a second `ostler serve` on the same file would assign
    // conflicting seqs. The OS releases the lock when this process ends, however it ends.
    let _store_lock = lock_store(&valid.store_path)?;
    // Process trees: the daemon adopts its sessions' orphans (child subreaper) and ends what
    // a previous life on this store left behind (kill -9 of the daemon: tools that had left
    // their CLI's process group survive it, reparented to init).
    let process_tag = ostler_supervisor::proctree::tag_for(&valid.store_path);
    let cgroups = session_cgroups(&valid.cgroup, &process_tag)?;
    // The daemon's cgroup directory goes when this function ends, however it ends (a
    // start that fails after this point must not leave it behind); it is made again at the
    // next start.
    let _cgroup_dir = RemoveDirOnDrop(cgroups.as_ref().map(|cg| cg.dir().to_path_buf()));
    take_charge_of_process_trees(&process_tag, cgroups.clone()).await?;
    // 3. Listeners, served from now on: while the store opens (a schema migration of a
    // large store can take minutes), health says NOT_SERVING and other calls get
    // UNAVAILABLE (the metrics endpoint answers `ostler_ready 0`), so probes, clients and
    // scrapers can tell a starting daemon from a dead one.
    let mut listeners = Vec::new();
    if let Some(addr) = valid.tcp {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listen.addr: cannot listen on {addr}"))?;
        listeners.push(ostler_server::Listener::Tcp(l));
    }
    // The (device, inode) of the socket file this daemon made: removed at exit only if it
    // is still that one.
    let mut own_socket = None;
    if let Some(path) = &valid.unix_socket {
        if path.exists() {
            // A stale socket from a previous run; refuse to remove anything else.
            let meta = std::fs::symlink_metadata(path)?;
            use std::os::unix::fs::FileTypeExt as _;
            if !meta.file_type().is_socket() {
                anyhow::bail!(
                    "listen.unix_socket: {} exists and is not a socket",
                    path.display()
                );
            }
            // Stale only when nobody listens on it: a socket that accepts is another
            // process's (another daemon's), and replacing it would cut its clients off.
            // Not blocking: a listener whose backlog is full would hold the start (and a
            // SIGTERM) for as long as it likes; not answering within a second is "in use".
            let probe = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::UnixStream::connect(path),
            )
            .await;
            match probe {
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Ok(Ok(_)) | Err(_) => anyhow::bail!(
                    "listen.unix_socket: {} is in use (a running process, another ostler \
                     daemon?, listens on it); stop it or choose another path",
                    path.display()
                ),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => anyhow::bail!(
                    "listen.unix_socket: {} is in use (a process listens on it and does not \
                     accept); stop it or choose another path",
                    path.display()
                ),
                Ok(Err(e)) => anyhow::bail!(
                    "listen.unix_socket: cannot tell whether {} is in use ({e}); remove it \
                     if it is stale, or choose another path",
                    path.display()
                ),
            }
            std::fs::remove_file(path)?;
        }
        let l = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("listen.unix_socket: cannot bind {}", path.display()))?;
        // Never open to every local user whatever the umask: the owner's and the group's
        // bits as the umask left them (a group of clients stays possible), none for others.
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(path)
                .with_context(|| format!("listen.unix_socket: {}", path.display()))?
                .permissions()
                .mode();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o770))
                .with_context(|| format!("listen.unix_socket: cannot chmod {}", path.display()))?;
        }
        own_socket = socket_identity(path);
        listeners.push(ostler_server::Listener::Unix {
            listener: l,
            path: path.clone(),
        });
    }
    let metrics_listener = match valid.metrics {
        Some(addr) => Some(crate::metrics::bind(addr).await?),
        None => None,
    };
    let mut described: Vec<String> = listeners.iter().map(|l| l.describe()).collect();
    if let Some(l) = listeners.iter().find_map(|l| l.local_addr())
        && !l.ip().is_loopback()
    {
        tracing::info!(addr = %l, tokens = valid.tokens.len(), "non-loopback listener: bearer tokens required");
    }

    let server_opts = ostler_server::ServerOptions {
        tokens: valid.tokens.clone(),
        tls,
        max_connections: valid.max_connections,
        keepalive_interval: valid.keepalive.map(|(every, _)| every),
        keepalive_timeout: valid.keepalive.map_or(
            ostler_server::ServerOptions::default().keepalive_timeout,
            |(_, t)| t,
        ),
        idle_timeout: valid.idle_timeout,
        ..Default::default()
    };
    let (starting, server) =
        ostler_server::Server::run_starting(server_opts, listeners, shutdown.clone());
    let server = tokio::spawn(server);
    let metrics = match metrics_listener {
        Some(l) => {
            // The ready file lists it as `http://ADDR/metrics` (readers of the gRPC
            // addresses look for `tcp://` and `unix://`).
            let addr = l
                .local_addr()
                .context("metrics.listen: the bound address")?;
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "the metrics endpoint has no authentication and is reachable beyond loopback");
            }
            described.push(format!("http://{addr}{}", crate::metrics::PATH));
            // Scrapes answer `ostler_ready 0` until the engine is handed over below.
            Some(crate::metrics::spawn(l, shutdown.clone()))
        }
        None => None,
    };
    tracing::info!(listeners = %described.join(" "), "listening while the store opens");

    // 4. Store and engine.
    let (engine, notify_store) =
        match open_store_and_engine(&cfg, &valid, installation, process_tag, cgroups).await {
            Ok(started) => started,
            Err(e) => {
                drop(starting);
                shutdown.cancel();
                let _ = server.await;
                remove_own_socket(valid.unix_socket.as_deref(), own_socket);
                return Err(e);
            }
        };
    // The start-up checks have passed: what discovery measured is remembered for the next
    // start.
    if let Some(update) = discovery_cache {
        update.write();
    }
    let info = ostler_server::DaemonInfo::new(
        version,
        valid.store_path.display().to_string(),
        claude_info,
    );

    if let Some(metrics) = &metrics {
        metrics.serve_engine(engine.clone());
    }
    // Session-deleted feed items past their retention: pruned before the daemon says it
    // is ready, then by a timer.
    let pruner = match crate::feed_prune::Retention::new(
        cfg.feed.deleted_retention_secs,
        valid.notifiers.iter().map(|n| n.name.clone()).collect(),
    ) {
        Some(r) => {
            r.prune_now(&notify_store).await;
            Some(r.spawn(notify_store.clone(), shutdown.clone()))
        }
        None => None,
    };
    let notifiers =
        crate::notify::spawn_all(valid.notifiers.clone(), &engine, &notify_store, &shutdown).await;
    starting
        .ready(ostler_server::Ready {
            engine: engine.clone(),
            info,
        })
        .await;
    // The file first: whoever waits for the log line may read it at once.
    if let Some(f) = &args.ready_file {
        write_ready_file(f, &described)
            .with_context(|| format!("--ready-file: cannot write {}", f.display()))?;
    }
    for l in &described {
        tracing::info!(listener = %l, "ostler daemon ready");
    }

    let served = server.await;
    shutdown.cancel();
    for n in notifiers {
        let _ = n.await;
    }
    if let Some(p) = pruner {
        let _ = p.await;
    }
    drop(notify_store);
    tracing::info!("stopping sessions");
    engine.shutdown().await;
    drop(engine);
    remove_own_socket(valid.unix_socket.as_deref(), own_socket);
    tracing::info!("ostler daemon stopped");
    match served {
        Ok(Ok(())) => Ok(0),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
    }
}

/// Removes an (empty) directory when dropped: the daemon's cgroup directory, once every
/// session's cgroup in it has gone with the engine.
struct RemoveDirOnDrop(Option<PathBuf>);

impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The TLS material of `tls.cert`, `tls.key` and `tls.client_ca`, read and checked.
fn tls_options(
    tls: Option<&(PathBuf, PathBuf, Option<PathBuf>)>,
) -> Result<Option<ostler_server::TlsOptions>> {
    let Some((cert, key, ca)) = tls else {
        return Ok(None);
    };
    let t = ostler_server::TlsOptions {
        cert_pem: std::fs::read(cert)
            .with_context(|| format!("tls.cert: cannot read {}", cert.display()))?,
        key_pem: std::fs::read(key)
            .with_context(|| format!("tls.key: cannot read {}", key.display()))?,
        client_ca_pem: match ca {
            Some(ca) => Some(
                std::fs::read(ca)
                    .with_context(|| format!("tls.client_ca: cannot read {}", ca.display()))?,
            ),
            None => None,
        },
    };
    t.check()
        .with_context(|| format!("tls.cert {} / tls.key {}", cert.display(), key.display()))?;
    Ok(Some(t))
}

/// Opens the store (applying any schema migration first) and starts the session engine;
/// also returns the store for the notifiers.
async fn open_store_and_engine(
    cfg: &config::Config,
    valid: &config::Validated,
    installation: ostler_supervisor::Installation,
    process_tag: String,
    cgroups: Option<std::sync::Arc<ostler_supervisor::cgroup::Cgroups>>,
) -> Result<(ostler_engine::Engine, ostler_store::Store)> {
    let store_opts = store_options(cfg);
    let store_path = valid.store_path.clone();
    let store =
        tokio::task::spawn_blocking(move || ostler_store::Store::open(&store_path, store_opts))
            .await
            .context("store open task")?
            .with_context(|| format!("store.path: cannot open {}", valid.store_path.display()))?;
    tracing::info!(path = %valid.store_path.display(), "store open");

    let engine_opts = engine_options(cfg, valid, process_tag, cgroups);
    let notify_store = store.clone();
    let engine = ostler_engine::Engine::start(engine_opts, store, installation)
        .await
        .context("starting the session engine")?;

    Ok((engine, notify_store))
}

/// `[store]` as the store's options.
fn store_options(cfg: &config::Config) -> ostler_store::StoreOptions {
    ostler_store::StoreOptions {
        synchronous: if cfg.store.synchronous == "full" {
            ostler_store::Synchronous::Full
        } else {
            ostler_store::Synchronous::Normal
        },
        write_retry_limit: Duration::from_secs(cfg.store.write_retry_secs),
        busy_timeout: Duration::from_secs(cfg.store.busy_timeout_secs),
        sync_within: (cfg.store.max_unsynced_ms > 0)
            .then(|| Duration::from_millis(cfg.store.max_unsynced_ms)),
        ..Default::default()
    }
}

/// `[sessions]` (and what validation made of it) as the engine's options: every key of
/// the section reaches the engine here (`tests::every_sessions_key_reaches_the_engine`).
fn engine_options(
    cfg: &config::Config,
    valid: &config::Validated,
    process_tag: String,
    cgroups: Option<std::sync::Arc<ostler_supervisor::cgroup::Cgroups>>,
) -> ostler_engine::EngineOptions {
    ostler_engine::EngineOptions {
        max_live_sessions: usize::try_from(cfg.sessions.max_live).unwrap_or(usize::MAX),
        allowed_roots: cfg.sessions.allowed_roots.clone(),
        rules: valid.rules.clone(),
        permission_expiry: (cfg.sessions.permission_expiry_secs > 0)
            .then(|| Duration::from_secs(cfg.sessions.permission_expiry_secs)),
        allow_free_text_answers: cfg.sessions.allow_free_text_answers,
        respawn_on_start: cfg.sessions.respawn_on_start,
        idle_suspend: (cfg.sessions.idle_suspend_secs > 0)
            .then(|| Duration::from_secs(cfg.sessions.idle_suspend_secs)),
        live_wait: Duration::from_secs(cfg.sessions.live_wait_secs),
        queue_grace: Duration::from_secs(cfg.sessions.queue_grace_secs),
        guard_verdict: Duration::from_secs(cfg.sessions.guard_verdict_secs),
        broadcast_capacity: usize::try_from(cfg.sessions.subscriber_buffer).unwrap_or(usize::MAX),
        supervisor: ostler_supervisor::SupervisorOptions {
            stop_grace: Duration::from_secs(cfg.sessions.stop_timeout_secs),
            control_timeout: Duration::from_secs(cfg.sessions.control_timeout_secs),
            process_tag,
            cgroups,
            env_allowlist: valid.env_allowlist.clone(),
            ..Default::default()
        },
        managed_settings: valid.managed_settings.clone(),
        spawn_env: valid
            .session_env
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        // The CLI's debug logs of sessions created with `debug`: next to the store (whose
        // directory is the daemon user's), one file per session.
        debug_dir: Some(debug_dir(&valid.store_path)),
        debug_max_bytes: cfg.sessions.debug_log_max_bytes,
        ..Default::default()
    }
}

/// Where the CLI's debug logs go: `debug/` in the store's directory.
pub(crate) fn debug_dir(store: &std::path::Path) -> std::path::PathBuf {
    store
        .parent()
        .unwrap_or_else(|| std::path::Path::new("."))
        .join("debug")
}

/// The discovery cache: `claude-discovery.json` in the store's directory.
pub(crate) fn discovery_cache_path(store: &std::path::Path) -> std::path::PathBuf {
    store
        .parent()
        .unwrap_or_else(|| std::path::Path::new("."))
        .join(ostler_supervisor::discovery_cache::FILE_NAME)
}

/// Why the daemon must not start with a `sessions.managed_settings` policy on this release
/// (`None`: it may): the release lacks the flag, or is measured not to enforce it.
/// `ostler doctor` asks the same.
pub(crate) fn unenforced_policy(
    has_policy: bool,
    inst: &ostler_supervisor::Installation,
) -> Option<String> {
    let caps = &inst.capabilities;
    let unenforced = caps.accepts_option("--managed-settings") == Some(false)
        || caps.policies.get("managed_settings") == Some(&false);
    (has_policy && unenforced).then(|| {
        format!(
            "sessions.managed_settings: Claude Code {} does not enforce --managed-settings \
             (measured: see docs/compatibility.md, \"Policies\"), so the policy would not \
             hold; use a release that enforces it, or remove the key",
            inst.version
        )
    })
}

/// The store's daemon lock: `<store>.lock`.
pub(crate) fn lock_path(store: &std::path::Path) -> std::path::PathBuf {
    store.with_extension("lock")
}

/// Whether a daemon holds the store's lock (`ostler doctor`). Tested by taking the lock
/// shared for a moment (a lock is not visible otherwise), only when its file exists.
pub(crate) fn store_in_use(store: &std::path::Path) -> bool {
    match std::fs::File::open(lock_path(store)) {
        Ok(file) => matches!(
            file.try_lock_shared(),
            Err(std::fs::TryLockError::WouldBlock)
        ),
        Err(_) => false,
    }
}

/// Take the store's daemon lock (`<store>.lock`), or say who holds it.
pub(crate) fn lock_store(store: &std::path::Path) -> Result<std::fs::File> {
    let path = lock_path(store);
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("store.path: cannot create the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "store.path: {} is in use by another ostler daemon (it holds {}); stop it or \
             configure another store.path",
            store.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("store.path: cannot lock {}", path.display()))
        }
    }
}

fn claude_info(i: &ostler_supervisor::Installation) -> ostler_server::ClaudeCodeInfo {
    use ostler_server::Compatibility as C;
    use ostler_supervisor::CompatLevel as L;
    ostler_server::ClaudeCodeInfo {
        version: i.version.to_string(),
        api_date: i.api_date.clone(),
        level: match i.level {
            L::FullyCompatible => C::FullyCompatible,
            L::LikelyCompatible => C::LikelyCompatible,
            L::Degraded => C::Degraded,
            L::Incompatible => C::Incompatible,
        },
        message: i.message.clone(),
        binary_path: i.path.display().to_string(),
        capabilities: i.capabilities.names(),
    }
}

/// Become the child subreaper of every session's processes, reap the orphans that exit, and
/// end the leftovers of a previous daemon on the same store.
/// The session cgroups `sessions.cgroup` asks for: `auto` falls back to none (with a log
/// line saying why), an explicit directory that cannot be used is an error.
fn session_cgroups(
    setting: &ostler_supervisor::cgroup::CgroupSetting,
    tag: &str,
) -> Result<Option<std::sync::Arc<ostler_supervisor::cgroup::Cgroups>>> {
    use ostler_supervisor::cgroup::{CgroupSetting, Cgroups};
    match Cgroups::setup(setting, tag) {
        Ok(Some(cg)) => {
            tracing::info!(dir = %cg.dir().display(), "each session runs in a cgroup of its own");
            Ok(Some(std::sync::Arc::new(cg)))
        }
        Ok(None) => Ok(None),
        Err(e) if *setting == CgroupSetting::Auto => {
            tracing::info!(reason = %e, "session cgroups not used");
            Ok(None)
        }
        Err(e) => Err(anyhow::anyhow!("sessions.cgroup: {e}")),
    }
}

async fn take_charge_of_process_trees(
    tag: &str,
    cgroups: Option<std::sync::Arc<ostler_supervisor::cgroup::Cgroups>>,
) -> Result<()> {
    use ostler_supervisor::proctree;
    match proctree::become_subreaper() {
        Ok(()) => {
            proctree::spawn_reaper().context("installing the SIGCHLD handler")?;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot become child subreaper: orphaned tool processes go to init (they are still ended by their session's mark)");
        }
    }
    let tag = tag.to_owned();
    let killed = tokio::task::spawn_blocking(move || {
        proctree::kill_marked(&tag) + cgroups.map_or(0, |cg| cg.kill_all())
    })
    .await
    .context("process cleanup task")?;
    if killed > 0 {
        tracing::warn!(
            killed,
            "ended processes left behind by a previous run of the daemon on this store"
        );
    }
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP (the terminal of a foreground daemon closed; there is no
/// configuration reload) shut the daemon down gracefully: sessions are stopped and come
/// back resumable, instead of the default action killing it on the spot.
fn spawn_signal_handler(shutdown: CancellationToken) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = hup.recv() => tracing::info!("SIGHUP: shutting down"),
            () = shutdown.cancelled() => return,
        }
        shutdown.cancel();
    });
    Ok(())
}

fn write_ready_file(path: &std::path::Path, lines: &[String]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The (device, inode) of the file at `path`.
fn socket_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes the daemon's Unix socket file at exit, unless something else replaced it.
fn remove_own_socket(path: Option<&std::path::Path>, own: Option<(u64, u64)>) {
    if let Some(path) = path
        && own.is_some()
        && socket_identity(path) == own
    {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(toml: &str) -> (ostler_store::StoreOptions, ostler_engine::EngineOptions) {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ostler.toml");
        std::fs::write(&f, toml).unwrap();
        let cfg = config::load(Some(&f), &Overrides::default()).unwrap();
        let valid = cfg.validate().unwrap();
        (
            store_options(&cfg),
            engine_options(&cfg, &valid, "tag".into(), None),
        )
    }

    /// Each key of `[sessions]` and `[store]` set to a value other than its default must
    /// arrive in the options the engine and the store are started with: a key that is
    /// parsed and validated but never handed on would otherwise do nothing, silently.
    #[test]
    fn every_sessions_key_reaches_the_engine() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let (store, e) = options(&format!(
            r#"
[store]
path = "/tmp/x.db"
synchronous = "full"
write_retry_secs = 7
busy_timeout_secs = 9
max_unsynced_ms = 250
[sessions]
max_live = 3
idle_suspend_secs = 11
live_wait_secs = 13
queue_grace_secs = 23
guard_verdict_secs = 29
subscriber_buffer = 4096
allowed_roots = ["{}"]
permission_expiry_secs = 17
allow_free_text_answers = true
respawn_on_start = true
stop_timeout_secs = 19
cgroup = "off"
env_allow = ["MYCO_*"]
[sessions.env]
MYCO_REGION = "eu"
[sessions.managed_settings]
permissions = {{ deny = ["Read(./secret/**)"], disableBypassPermissionsMode = "disable" }}
cleanupPeriodDays = 3
[permissions]
allow = ["Read"]
deny = ["Bash(rm)"]
"#,
            root.display()
        ));
        let secs = Duration::from_secs;
        assert_eq!(store.synchronous, ostler_store::Synchronous::Full);
        assert_eq!(store.write_retry_limit, secs(7));
        assert_eq!(store.busy_timeout, secs(9));
        assert_eq!(store.sync_within, Some(Duration::from_millis(250)));
        let (store, _) = options("[store]\nmax_unsynced_ms = 0\n");
        assert_eq!(store.sync_within, None, "0: off");
        assert_eq!(e.max_live_sessions, 3);
        assert_eq!(e.idle_suspend, Some(secs(11)));
        assert_eq!(e.live_wait, secs(13));
        assert_eq!(e.queue_grace, secs(23));
        assert_eq!(e.guard_verdict, secs(29));
        assert_eq!(e.broadcast_capacity, 4096, "sessions.subscriber_buffer");
        assert_eq!(e.allowed_roots, vec![root]);
        assert_eq!(e.permission_expiry, Some(secs(17)));
        assert!(e.allow_free_text_answers);
        assert!(e.respawn_on_start);
        assert_eq!(e.supervisor.stop_grace, secs(19));
        assert!(e.supervisor.env_allowlist.iter().any(|p| p == "MYCO_*"));
        assert_eq!(e.spawn_env, vec![("MYCO_REGION".into(), "eu".into())]);
        assert_eq!(
            e.rules.len(),
            2,
            "permissions.allow and .deny: {:?}",
            e.rules
        );
        assert_eq!(e.supervisor.process_tag, "tag");
        assert_eq!(
            e.managed_settings.map(serde_json::Value::Object),
            Some(serde_json::json!({
                "permissions": {
                    "deny": ["Read(./secret/**)"],
                    "disableBypassPermissionsMode": "disable"
                },
                "cleanupPeriodDays": 3
            })),
            "sessions.managed_settings, keys as written"
        );
    }

    /// The defaults: 0 means off for the optional durations, and the config's defaults are
    /// the engine's and the store's own where both have one.
    #[test]
    fn the_default_config_gives_the_engines_defaults() {
        let (store, e) = options("[store]\npath = \"/tmp/x.db\"\n");
        let (store_default, engine_default) = (
            ostler_store::StoreOptions::default(),
            ostler_engine::EngineOptions::default(),
        );
        assert_eq!(store.synchronous, store_default.synchronous);
        assert_eq!(e.broadcast_capacity, engine_default.broadcast_capacity);
        assert_eq!(e.max_live_sessions, engine_default.max_live_sessions);
        assert_eq!(
            e.permission_expiry, None,
            "permission_expiry_secs = 0: never"
        );
        assert!(e.allowed_roots.is_empty() && e.rules.is_empty() && e.spawn_env.is_empty());
        assert_eq!(e.managed_settings, None);
        let (_, e) = options("[store]\npath = \"/tmp/x.db\"\n[sessions]\nidle_suspend_secs = 0\n");
        assert_eq!(e.idle_suspend, None, "idle_suspend_secs = 0: never");
    }
}
