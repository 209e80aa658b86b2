//! Daemon configuration: defaults -> `config.toml` (in the platform config dir, or
//! `--config`) -> `OSTLER_*` environment (`OSTLER_LISTEN__ADDR=127.0.0.1:0`,
//! `OSTLER_AUTH__TOKEN_FILE=/path`, lists as `OSTLER_AUTH__TOKENS='["a","b"]'`: nested keys
//! separated by `__`) -> command-line flags. Validated once at start with messages that
//! name the key. Tokens are never logged (`AuthConfig`'s `Debug` redacts them); prefer
//! `auth.token_file` over putting tokens in the environment.
//!
//! ```toml
//! [listen]
//! addr = "127.0.0.1:7433"          # TCP; non-loopback requires auth
//! unix_socket = "/run/ostler.sock" # optional
//!
//! [auth]
//! tokens = ["..."]                 # and/or
//! token_file = "/etc/ostler/tokens" # one token per line, `#` comments
//!
//! [tls]
//! cert = "server.pem"
//! key = "server.key"
//! client_ca = "clients-ca.pem"     # optional: require client certificates
//!
//! [store]
//! path = "/var/lib/ostler/ostler.db" # default: <data dir>/ostler.db
//! synchronous = "normal"           # or "full"
//! write_retry_secs = 120           # how long writes wait out a full/read-only disk
//! busy_timeout_secs = 5            # how long to wait for a lock held by another process
//! max_unsynced_ms = 1000           # normal: commits reach the disk within this (0: by checkpoints)
//!
//! [sessions]
//! max_live = 256                  # live CLI processes at most (the LRU idle one is suspended)
//! idle_suspend_secs = 900          # suspend a session idle this long (0: never)
//! live_wait_secs = 30              # at max_live with every session busy: wait, then fail
//! queue_grace_secs = 30            # after a result, how long queued messages may take to start
//! control_timeout_secs = 30        # how long the CLI may take to answer a control request
//! guard_verdict_secs = 120         # how long a guarded cut waits for the CLI's verdict at boot
//! subscriber_buffer = 1024         # events a subscriber may fall behind the live stream
//! allowed_roots = ["/home/me/src"]  # empty: any existing directory
//! env_allow = ["MYCO_*", "EXTRA"] # more inherited variables passed to sessions
//! debug_log_max_bytes = 67108864  # a `debug` session's CLI debug log keeps at most this (0: no cap)
//!
//! [sessions.env]                  # set for every session (names case-sensitive)
//! GIT_AUTHOR_NAME = "ostler"      # also OSTLER_SESSIONS__ENV__GIT_AUTHOR_NAME=...
//!
//! [sessions.managed_settings]     # policy the CLI of every session enforces (--managed-settings)
//! permissions = { deny = ["Bash(rm:*)"] }
//!
//! [permissions]                   # evaluated before clients are asked; deny wins
//! allow = ["Read", "Bash(git status)", "Edit(src/**)"]
//! deny = ["Bash(rm)", "Edit(secrets/**)"]
//!
//! [claude]
//! path = "/usr/local/bin/claude"   # default: search PATH
//! probe_flags = true               # probe the binary's flags at start (--no-probe)
//! discovery_cache = true           # reuse the last start's measurements of an unchanged binary
//!
//! [feed]
//! deleted_retention_secs = 2592000 # keep session-deleted feed items 30 days (0: forever)
//!
//! [[notify]]                      # webhooks following the daemon-wide feed (repeatable)
//! url = "http://127.0.0.1:9000/ostler"
//! secret = "..."                  # HMAC-SHA256 signature header
//! kinds = ["permission_requested", "question_asked", "turn_completed"]
//!
//! [log]
//! format = "human"                 # or "json"
//! filter = "info"                  # tracing env-filter syntax; RUST_LOG wins
//!
//! [metrics]
//! listen = "127.0.0.1:9464"        # Prometheus /metrics over HTTP; default "" (off)
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use figment::Figment;
use figment::providers::{Env, Format as _, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// Top-level sections; only `OSTLER_<SECTION>__...` variables are read from the
/// environment (so unrelated `OSTLER_*` variables do not break start-up).
const SECTIONS: &[&str] = &[
    "listen",
    "auth",
    "tls",
    "store",
    "sessions",
    "permissions",
    "claude",
    "log",
    "metrics",
    "runtime",
    "feed",
];

pub const DEFAULT_ADDR: &str = "127.0.0.1:7433";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: ListenConfig,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    pub store: StoreConfig,
    pub sessions: SessionsConfig,
    pub permissions: PermissionsConfig,
    pub claude: ClaudeConfig,
    pub log: LogConfig,
    pub metrics: MetricsConfig,
    pub runtime: RuntimeConfig,
    pub feed: FeedConfig,
    /// `[[notify]]`: webhooks following the daemon-wide feed (config file only).
    pub notify: Vec<crate::notify::NotifyConfig>,
    /// Where each value came from (the layers [`load`] merged), to name it in errors.
    #[serde(skip)]
    pub origins: Origins,
}

/// The merged layers of a loaded configuration: which one set a key (for messages only;
/// equal for any two configurations).
#[derive(Clone, Default)]
pub struct Origins(Option<Figment>);

impl PartialEq for Origins {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Origins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Origins")
    }
}

impl Origins {
    /// Where `key` (`sessions.max_live`) was set, when not by default: "in FILE", "by the
    /// variable OSTLER_SESSIONS__MAX_LIVE", "by a command-line flag".
    fn of(&self, key: &str) -> Option<String> {
        let m = self.0.as_ref()?.find_metadata(key)?;
        if m.name.contains("environment") {
            let var = format!("OSTLER_{}", key.replace('.', "__").to_ascii_uppercase());
            return Some(format!("set by the variable {var}"));
        }
        if let Some(figment::Source::File(f)) = &m.source {
            return Some(format!("set in {}", f.display()));
        }
        // The flags are merged as one JSON value; the defaults are the `Config` type.
        m.name
            .contains("serde_json")
            .then(|| "set by a command-line flag".to_owned())
    }

    /// `e` with where the setting it names (its first word, `sessions.max_live`) was set.
    fn name_in(&self, e: anyhow::Error) -> anyhow::Error {
        let text = format!("{e:#}");
        let key: String = text
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '.')
            .collect();
        let key = key.trim_end_matches('.');
        match (key.contains('.'), self.of(key)) {
            (true, Some(origin)) => anyhow::anyhow!("{text} ({origin})"),
            _ => e,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// TCP address; port 0 picks a free port (see `--ready-file`). Empty string: no TCP.
    pub addr: String,
    pub unix_socket: Option<PathBuf>,
    /// gRPC connections served at once (TCP and Unix together); more are closed at once.
    pub max_connections: u64,
    /// HTTP/2 PING after this many seconds without a frame from a client; 0: never.
    pub keepalive_secs: u64,
    /// A PING not answered within this many seconds closes the connection.
    pub keepalive_timeout_secs: u64,
    /// A connection with no authenticated call in flight for this many seconds is asked
    /// to go away (HTTP/2 GOAWAY; the client reconnects for its next call).
    pub idle_timeout_secs: u64,
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            addr: DEFAULT_ADDR.to_owned(),
            unix_socket: None,
            max_connections: 1024,
            keepalive_secs: 60,
            keepalive_timeout_secs: 20,
            idle_timeout_secs: 300,
        }
    }
}

/// Most connections `listen.max_connections` may allow (each is a file descriptor).
pub const MAX_CONNECTIONS: u64 = 1 << 20;

/// The longest `listen.idle_timeout_secs` may be: a day. Longer, idle connections hold
/// their slots for so long that the rule no longer frees them in any useful time.
pub const MAX_IDLE_TIMEOUT_SECS: u64 = 24 * 3600;

#[derive(Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub tokens: Vec<String>,
    pub token_file: Option<PathBuf>,
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("tokens", &format_args!("<{} redacted>", self.tokens.len()))
            .field("token_file", &self.token_file)
            .finish()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub path: Option<PathBuf>,
    /// `normal` or `full`.
    pub synchronous: String,
    /// How long a write that meets a storage fault (disk full, read-only files) is retried
    /// before it fails and the affected sessions are stopped.
    pub write_retry_secs: u64,
    /// How long an access to the database waits for a lock that another process holds (a
    /// backup tool, the `sqlite3` shell in a write transaction) before it fails.
    pub busy_timeout_secs: u64,
    /// Under `synchronous = "normal"`: a commit is synced to disk within this many
    /// milliseconds (what a power failure can lose); 0 leaves it to checkpoints and the
    /// kernel.
    pub max_unsynced_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: None,
            synchronous: "normal".to_owned(),
            write_retry_secs: 120,
            busy_timeout_secs: 5,
            max_unsynced_ms: 1000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Live CLI processes at most; at the cap the least recently used idle session is
    /// suspended to make room.
    pub max_live: u64,
    /// Suspend (stop the CLI process of) a session idle this many seconds; 0: never.
    pub idle_suspend_secs: u64,
    /// At `max_live` with every live session busy, a call waits this many seconds for one
    /// to become idle, then fails with RESOURCE_EXHAUSTED.
    pub live_wait_secs: u64,
    /// After a result that leaves messages owed an answer, how many seconds the CLI has to
    /// show it took the next (an echo, a turn's output, its lifecycle `started`), not
    /// counting time it waits on a client (a hook); then they are taken as not queued and
    /// the session settles (`IDLE`), so it is not left running for good. 1 to 3,600.
    pub queue_grace_secs: u64,
    /// Events a subscriber may fall behind a session's live stream: one further behind
    /// continues from the store (stored events) and is told how many partial deltas it
    /// missed (the live-only buffer holds twice as many). More tolerates longer stalls of
    /// a client for more memory per session.
    pub subscriber_buffer: u64,
    pub allowed_roots: Vec<PathBuf>,
    /// Deny pending permission requests / questions, and answer pending elicitations
    /// `cancel` and dialogs `cancelled`, after this many seconds (0: never).
    pub permission_expiry_secs: u64,
    pub allow_free_text_answers: bool,
    /// Respawn sessions that were live at the last stop, instead of leaving them resumable.
    pub respawn_on_start: bool,
    pub stop_timeout_secs: u64,
    /// How long a control request ostler sends (SetModel, Interrupt, ...) may wait for the
    /// CLI's answer, not counting the wait for a client's answer to a hook the request makes
    /// the CLI call (a PreModelSwitch hook during SetModel). 1 to 600.
    pub control_timeout_secs: u64,
    /// How long a resume or fork with a guarded cut (`drops_turn_message_id`,
    /// `--resume-drops-turn`) waits for the CLI's verdict, given at boot (its `initialize`
    /// answer, or its refusal and exit); past it the cut counts as taken. 1 to 600.
    pub guard_verdict_secs: u64,
    /// Session cgroups (cgroup v2): `auto` (under the daemon's own cgroup when it may write
    /// there, e.g. systemd `Delegate=yes`; otherwise off), `off`, or a cgroup v2 directory.
    pub cgroup: String,
    /// More inherited variables passed to sessions (names or `PREFIX*`), on top of the
    /// supervisor's default allowlist (credentials, the CLI's documented variables, ...).
    pub env_allow: Vec<String>,
    /// Variables set for every session (they win over inherited ones).
    pub env: SessionEnv,
    /// A `debug` session's CLI debug log past this many bytes keeps its newest half (from a
    /// line's start), checked at every spawn and every turn's end; ReadDebugLog offsets
    /// stay logical. 0: no cap; otherwise at least 4,096. Default 64 MiB.
    pub debug_log_max_bytes: u64,
    /// Settings every session's CLI gets at its policy tier (`--managed-settings`), merged
    /// with the session's own `managed_settings` so that these hold: what a client asks
    /// (permission mode, `settings`, rules) cannot loosen them. Empty: none.
    pub managed_settings: serde_json::Map<String, serde_json::Value>,
}

/// `[sessions.env]`: values may be secrets, so `Debug` shows the names only.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(transparent)]
pub struct SessionEnv(pub BTreeMap<String, String>);

impl fmt::Debug for SessionEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, format_args!("<redacted>"))))
            .finish()
    }
}

/// Environment variables read as `[sessions.env]` entries, names kept as written:
/// `OSTLER_SESSIONS__ENV__GIT_AUTHOR_NAME=x` sets `GIT_AUTHOR_NAME=x` (figment's `Env`
/// provider would lowercase the name and parse the value).
const SESSION_ENV_PREFIX: &str = "OSTLER_SESSIONS__ENV__";

/// `sessions.managed_settings` from the environment: one variable holding a JSON object,
/// read as written (figment's `Env` provider would lowercase the keys of a nested name).
const MANAGED_SETTINGS_VAR: &str = "OSTLER_SESSIONS__MANAGED_SETTINGS";

/// Most bytes of `sessions.managed_settings` as JSON (one command-line argument of every
/// session, next to its own options).
const MAX_MANAGED_SETTINGS: usize = 64 * 1024;

/// `sessions.subscriber_buffer`: the range allowed (the default is 1,024). Below 256, one burst
/// of resolved commits (the engine's 4 batches in flight of up to 64 stored events) would
/// push a subscriber that keeps up out to the store; above 65,536 the ring slots alone
/// (~40 B per buffered event in every live session, ~110 B more with a partials
/// subscriber) outweigh a session.
const SUBSCRIBER_BUFFER: std::ops::RangeInclusive<u64> = 256..=65_536;

/// `sessions.queue_grace_secs`: the range allowed (the default is 30). 0 would forget every
/// queued message at the result before it; past an hour a session the CLI dropped a
/// message of stays `RUNNING` (never idle-suspended) for most of a working session.
const QUEUE_GRACE_SECS: std::ops::RangeInclusive<u64> = 1..=3_600;

/// `sessions.control_timeout_secs`: the range allowed (the default is 30). 0 would fail every
/// request; past 10 minutes a CLI that never answers holds an RPC for most of an hour.
const CONTROL_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=600;

/// `sessions.guard_verdict_secs`: the range allowed (the default is 120). 0 would take every
/// guarded cut unjudged; past 10 minutes a CLI that neither answers nor exits holds a
/// ResumeSession (and the session's lifecycle) for most of an hour.
const GUARD_VERDICT_SECS: std::ops::RangeInclusive<u64> = 1..=600;

/// `sessions.debug_log_max_bytes`: the least cap (0 aside). Below a page, the half kept
/// would hold a handful of the CLI's lines.
const MIN_DEBUG_LOG_MAX_BYTES: u64 = 4096;

/// Most variables in `[sessions.env]`.
const MAX_SESSION_ENV: usize = 256;
/// Most bytes of one `NAME=VALUE` (Linux refuses a longer string at exec: `MAX_ARG_STRLEN`).
const MAX_SESSION_ENV_ENTRY: usize = 128 * 1024 - 1;
/// Most bytes of `[sessions.env]` altogether (argv + environment share the kernel's limit).
const MAX_SESSION_ENV_TOTAL: usize = 256 * 1024;

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            max_live: 256,
            idle_suspend_secs: 900,
            live_wait_secs: 30,
            queue_grace_secs: 30,
            subscriber_buffer: 1024,
            allowed_roots: Vec::new(),
            permission_expiry_secs: 0,
            allow_free_text_answers: false,
            respawn_on_start: false,
            stop_timeout_secs: 5,
            control_timeout_secs: 30,
            guard_verdict_secs: 120,
            cgroup: "auto".into(),
            env_allow: Vec::new(),
            env: SessionEnv::default(),
            debug_log_max_bytes: ostler_engine::DEBUG_MAX_BYTES_DEFAULT,
            managed_settings: serde_json::Map::new(),
        }
    }
}

/// Permission rules for every session, in Claude's settings spelling: `Tool` or
/// `Tool(pattern)`, where the pattern is a Bash command prefix or a path glob (see
/// `ostler_engine::PermissionRule`). Deny wins over allow; no match asks the clients.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PermissionsConfig {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClaudeConfig {
    pub path: Option<PathBuf>,
    /// Probe the binary's flags at start (slower start, exact capabilities).
    pub probe_flags: bool,
    /// Remember what discovery measured on the binary (`claude --version`, the flag probe)
    /// in `claude-discovery.json` next to the store, and skip measuring at the next start
    /// while the binary is unchanged (same path, inode, size, mtime, ctime).
    pub discovery_cache: bool,
}

impl Default for ClaudeConfig {
    fn default() -> Self {
        Self {
            path: None,
            probe_flags: true,
            discovery_cache: true,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `human` or `json`.
    pub format: String,
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: "human".to_owned(),
            filter: "info".to_owned(),
        }
    }
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// TCP address of the HTTP endpoint serving `/metrics`; empty (the default): off.
    pub listen: String,
}

/// `[feed]`: the daemon-wide feed (`WatchSessions`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FeedConfig {
    /// How long a session-deleted item stays in the feed (its session's other items go
    /// with the deletion); 0: forever. Older ones are pruned at start and then periodically,
    /// never before every configured notifier has passed them.
    pub deleted_retention_secs: u64,
}

impl Default for FeedConfig {
    fn default() -> Self {
        Self {
            deleted_retention_secs: 30 * 24 * 3600,
        }
    }
}

/// `[runtime]`: the daemon's async runtime.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Async worker threads; 0 (the default): tokio's choice, one per core (or
    /// `TOKIO_WORKER_THREADS`). The store's writer, its checkpointer and blocking work run
    /// on threads of their own either way.
    pub worker_threads: u64,
}

/// Most async worker threads `runtime.worker_threads` may ask for.
pub const MAX_WORKER_THREADS: u64 = 256;

/// Command-line overrides (the last layer). `None` / empty: not given.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub unix_socket: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub store: Option<PathBuf>,
    pub claude: Option<PathBuf>,
    pub max_live: Option<u64>,
    pub allowed_roots: Vec<PathBuf>,
    pub log_format: Option<String>,
    pub log_filter: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub no_probe: bool,
    pub no_discovery_cache: bool,
    /// `--session-env NAME=VALUE` (repeatable): `[sessions.env]` entries.
    pub session_env: Vec<(String, String)>,
    pub metrics_listen: Option<String>,
}

impl Overrides {
    fn to_value(&self) -> serde_json::Value {
        use serde_json::{Map, Value, json};
        let mut root = Map::new();
        let mut put = |section: &str, key: &str, v: Value| {
            let s = root
                .entry(section.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = s {
                m.insert(key.to_owned(), v);
            }
        };
        let p = |p: &PathBuf| json!(p.display().to_string());
        if let Some(v) = &self.listen {
            put("listen", "addr", json!(v));
        }
        if let Some(v) = &self.unix_socket {
            put("listen", "unix_socket", p(v));
        }
        if let Some(v) = &self.token_file {
            put("auth", "token_file", p(v));
        }
        if let Some(v) = &self.store {
            put("store", "path", p(v));
        }
        if let Some(v) = &self.claude {
            put("claude", "path", p(v));
        }
        if let Some(v) = self.max_live {
            put("sessions", "max_live", json!(v));
        }
        if !self.allowed_roots.is_empty() {
            put(
                "sessions",
                "allowed_roots",
                Value::Array(self.allowed_roots.iter().map(p).collect()),
            );
        }
        if let Some(v) = &self.log_format {
            put("log", "format", json!(v));
        }
        if let Some(v) = &self.log_filter {
            put("log", "filter", json!(v));
        }
        if let Some(v) = &self.tls_cert {
            put("tls", "cert", p(v));
        }
        if let Some(v) = &self.tls_key {
            put("tls", "key", p(v));
        }
        if let Some(v) = &self.tls_client_ca {
            put("tls", "client_ca", p(v));
        }
        if self.no_probe {
            put("claude", "probe_flags", json!(false));
        }
        if self.no_discovery_cache {
            put("claude", "discovery_cache", json!(false));
        }
        if let Some(v) = &self.metrics_listen {
            put("metrics", "listen", json!(v));
        }
        Value::Object(root)
    }

    /// The `--session-env` entries, merged into `[sessions.env]` (not replacing it).
    fn session_env_value(&self) -> BTreeMap<String, String> {
        self.session_env.iter().cloned().collect()
    }
}

/// The platform directories (`~/.config/ostler`, `~/.local/share/ostler` on Linux).
fn project_dirs() -> Option<directories::ProjectDirs> {
    directories::ProjectDirs::from("", "", "ostler")
}

/// The default config file, when the platform has a config dir.
pub fn default_config_file() -> Option<PathBuf> {
    project_dirs().map(|d| d.config_dir().join("config.toml"))
}

/// Loads the configuration: defaults, then the file (an explicit `--config` must exist;
/// the default file is optional), then the environment, then `overrides`.
pub fn load(explicit_file: Option<&Path>, overrides: &Overrides) -> Result<Config> {
    let mut fig = Figment::from(Serialized::defaults(Config::default()));
    match explicit_file {
        Some(f) => {
            if f.is_dir() {
                bail!("config file {} is a directory (--config)", f.display());
            }
            if !f.is_file() {
                bail!("config file {} does not exist (--config)", f.display());
            }
            fig = fig.merge(Toml::file_exact(f));
        }
        None => {
            // A missing default file is fine: only an existing one is read.
            if let Some(f) = default_config_file().filter(|f| f.is_file()) {
                fig = fig.merge(Toml::file_exact(f));
            }
        }
    }
    // Each layer is read on its own terms before the next is merged over it: a value of the
    // wrong type in the file is an error even when a variable or a flag sets the key too
    // (else it would show up only the day that override goes).
    fig.extract::<Config>().map_err(config_error)?;
    fig = fig
        .merge(Env::prefixed("OSTLER_").split("__").filter(|k| {
            let k = k.as_str();
            let first = k.split('.').next().unwrap_or_default();
            SECTIONS.iter().any(|s| first.eq_ignore_ascii_case(s))
                && !k
                    .get(.."sessions.env.".len())
                    .is_some_and(|p| p.eq_ignore_ascii_case("sessions.env."))
                && !k
                    .get(.."sessions.managed_settings".len())
                    .is_some_and(|p| p.eq_ignore_ascii_case("sessions.managed_settings"))
        }))
        .merge(Serialized::default(
            "sessions.env",
            session_env_from(std::env::vars_os()),
        ));
    if let Some(v) = std::env::var_os(MANAGED_SETTINGS_VAR) {
        let text = v
            .into_string()
            .map_err(|_| anyhow::anyhow!("{MANAGED_SETTINGS_VAR}: not valid UTF-8"))?;
        let value = managed_settings_from_env(&text)?;
        // Merged over the file's table: where both set a key, the variable's value wins.
        fig = fig.merge(Serialized::default("sessions.managed_settings", value));
    }
    fig.extract::<Config>().map_err(config_error)?;
    fig = fig
        .merge(Serialized::defaults(overrides.to_value()))
        .merge(Serialized::default(
            "sessions.env",
            overrides.session_env_value(),
        ));
    let mut cfg = fig.extract::<Config>().map_err(config_error)?;
    cfg.origins = Origins(Some(fig));
    Ok(cfg)
}

/// A figment error as the user wrote the setting: `listen.adr in FILE`, or the variable
/// `OSTLER_SESSIONS__MAX_LIVE` (figment's own text names the profile, `default.listen.adr`,
/// and upper-cases variables into `SESSIONS.MAX_LIVE`).
fn config_error(e: figment::Error) -> anyhow::Error {
    let described: Vec<String> = e
        .into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let from = e.metadata.as_ref().map(|m| {
                if m.name.contains("environment") {
                    let var = format!("OSTLER_{}", e.path.join("__").to_ascii_uppercase());
                    format!("the variable {var}")
                } else if let Some(figment::Source::File(f)) = &m.source {
                    format!("{key} in {}", f.display())
                } else {
                    key.clone()
                }
            });
            let kind = shown_kind(&e.path, &e.kind);
            match from {
                Some(from) if !key.is_empty() => format!("{from}: {kind}"),
                _ if !key.is_empty() => format!("{key}: {kind}"),
                _ => kind,
            }
        })
        .collect();
    anyhow::anyhow!("invalid configuration: {}", described.join("; "))
}

/// Whether the setting at `path` may hold a secret: tokens, the sessions' environment, a
/// notifier's url and signing secret. Its value is never quoted in an error.
fn secret_setting(path: &[String]) -> bool {
    let at = |i: usize, k: &str| path.get(i).is_some_and(|p| p.eq_ignore_ascii_case(k));
    (at(0, "auth") && at(1, "tokens"))
        || (at(0, "sessions") && at(1, "env"))
        || (at(0, "notify")
            && path
                .last()
                .is_some_and(|l| l == "url" || l == "secret" || l == "notify"))
}

/// A figment error's kind as shown: figment quotes the value it found, which is left out
/// for a [`secret_setting`] (its type is said instead).
fn shown_kind(path: &[String], kind: &figment::error::Kind) -> String {
    use figment::error::{Actual, Kind};
    if !secret_setting(path) {
        return kind.to_string();
    }
    let what = |a: &Actual| match a {
        Actual::Str(_) => "a string (not shown: it may be a secret)".to_owned(),
        Actual::Char(_) => "a character".to_owned(),
        Actual::Bytes(_) => "bytes".to_owned(),
        Actual::Unsigned(_) | Actual::Signed(_) | Actual::Float(_) => "a number".to_owned(),
        Actual::Other(_) => "a value (not shown: it may be a secret)".to_owned(),
        a => a.to_string(),
    };
    match kind {
        Kind::InvalidType(a, expected) => {
            format!("invalid type: found {}, expected {expected}", what(a))
        }
        Kind::InvalidValue(a, expected) => {
            format!("invalid value: {}, expected {expected}", what(a))
        }
        Kind::Message(_) => "invalid value (not shown: it may be a secret)".to_owned(),
        k => k.to_string(),
    }
}

/// `OSTLER_SESSIONS__MANAGED_SETTINGS`: a JSON object.
fn managed_settings_from_env(text: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => bail!(
            "{MANAGED_SETTINGS_VAR}: must be a JSON object, like {{\"permissions\": {{\"deny\": [\"Bash(rm:*)\"]}}}}"
        ),
        Err(e) => bail!("{MANAGED_SETTINGS_VAR}: not valid JSON: {e}"),
    }
}

/// `[sessions.env]` entries from `OSTLER_SESSIONS__ENV__NAME=VALUE` variables (prefix
/// matched case-insensitively, the name kept as written; not valid UTF-8: skipped here and
/// never passed).
fn session_env_from(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter_map(|(k, v)| {
            let (k, v) = (k.into_string().ok()?, v.into_string().ok()?);
            let name = k
                .get(..SESSION_ENV_PREFIX.len())
                .filter(|p| p.eq_ignore_ascii_case(SESSION_ENV_PREFIX))
                .map(|_| k[SESSION_ENV_PREFIX.len()..].to_owned())?;
            Some((name, v))
        })
        .collect()
}

/// A validated configuration, ready to use.
#[derive(Debug, Clone)]
pub struct Validated {
    pub tcp: Option<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
    /// Tokens from `auth.tokens` and `auth.token_file` (never logged).
    pub tokens: Vec<ostler_server::Token>,
    pub tls: Option<(PathBuf, PathBuf, Option<PathBuf>)>,
    pub store_path: PathBuf,
    pub json_logs: bool,
    /// `permissions.allow` and `permissions.deny`, parsed.
    pub rules: Vec<ostler_engine::PermissionRule>,
    /// The supervisor's default allowlist plus `sessions.env_allow`.
    pub env_allowlist: Vec<String>,
    /// `[sessions.env]`, checked (values never logged).
    pub session_env: SessionEnv,
    /// `sessions.managed_settings` (`None`: empty).
    pub managed_settings: Option<serde_json::Map<String, serde_json::Value>>,
    /// `metrics.listen`: where to serve `/metrics` (`None`: off).
    pub metrics: Option<SocketAddr>,
    /// `[[notify]]`, checked.
    pub notifiers: Vec<crate::notify::Notifier>,
    /// `sessions.cgroup`, parsed.
    pub cgroup: ostler_supervisor::cgroup::CgroupSetting,
    /// `runtime.worker_threads` (`None`: tokio's default).
    pub worker_threads: Option<usize>,
    /// `listen.max_connections`.
    pub max_connections: usize,
    /// `listen.keepalive_secs` and `listen.keepalive_timeout_secs` (`None`: off).
    pub keepalive: Option<(std::time::Duration, std::time::Duration)>,
    /// `listen.idle_timeout_secs`.
    pub idle_timeout: std::time::Duration,
}

impl Config {
    /// Checks every key; errors name the key and say what to do.
    pub fn validate(&self) -> Result<Validated> {
        self.validate_values().map_err(|e| self.origins.name_in(e))
    }

    fn validate_values(&self) -> Result<Validated> {
        let tcp =
            if self.listen.addr.trim().is_empty() {
                None
            } else {
                Some(self.listen.addr.trim().parse::<SocketAddr>().with_context(|| {
                format!(
                    "listen.addr: {:?} is not an address like {DEFAULT_ADDR} or [::1]:0",
                    self.listen.addr
                )
            })?)
            };
        if tcp.is_none() && self.listen.unix_socket.is_none() {
            bail!("listen.addr is empty and listen.unix_socket is not set: nothing to listen on");
        }
        let mut tokens = Vec::new();
        for (i, t) in self.auth.tokens.iter().enumerate() {
            match ostler_server::Token::new(t) {
                Some(t) => tokens.push(t),
                None => bail!("auth.tokens[{i}] is empty"),
            }
        }
        if let Some(f) = &self.auth.token_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("auth.token_file: cannot read {}", f.display()))?;
            let before = tokens.len();
            tokens.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .filter_map(ostler_server::Token::new),
            );
            if tokens.len() == before {
                bail!("auth.token_file: {} contains no token", f.display());
            }
        }
        if let Some(addr) = tcp
            && !addr.ip().is_loopback()
            && tokens.is_empty()
        {
            bail!(
                "listen.addr: {addr} is not a loopback address, so authentication is required: \
                 set auth.tokens or auth.token_file (or listen on 127.0.0.1)"
            );
        }
        let tls = match (&self.tls.cert, &self.tls.key) {
            (None, None) => {
                if self.tls.client_ca.is_some() {
                    bail!("tls.client_ca is set but tls.cert and tls.key are not");
                }
                None
            }
            (Some(_), None) => bail!("tls.cert is set but tls.key is not"),
            (None, Some(_)) => bail!("tls.key is set but tls.cert is not"),
            (Some(c), Some(k)) => {
                for (key, p) in [("tls.cert", c), ("tls.key", k)] {
                    if !p.is_file() {
                        bail!("{key}: {} does not exist", p.display());
                    }
                }
                if let Some(ca) = &self.tls.client_ca
                    && !ca.is_file()
                {
                    bail!("tls.client_ca: {} does not exist", ca.display());
                }
                Some((c.clone(), k.clone(), self.tls.client_ca.clone()))
            }
        };
        let store_path = match &self.store.path {
            Some(p) => p.clone(),
            None => project_dirs()
                .map(|d| d.data_dir().join("ostler.db"))
                .context("store.path: no platform data directory (is HOME set?); set store.path")?,
        };
        if !matches!(self.store.synchronous.as_str(), "normal" | "full") {
            bail!(
                "store.synchronous: {:?} is not \"normal\" or \"full\"",
                self.store.synchronous
            );
        }
        if self.store.write_retry_secs == 0 {
            bail!("store.write_retry_secs must be at least 1");
        }
        if self.store.busy_timeout_secs == 0 {
            // The daemon's own connections (writer, readers, checkpointer) wait on each
            // other's locks for moments; without any wait they would fail instead.
            bail!("store.busy_timeout_secs must be at least 1");
        }
        if self.store.max_unsynced_ms > MAX_UNSYNCED_MS {
            bail!(
                "store.max_unsynced_ms is {}; it must be at most {MAX_UNSYNCED_MS} (0: commits \
                 are synced by checkpoints and the kernel's write-back only)",
                self.store.max_unsynced_ms
            );
        }
        if self.sessions.max_live == 0 {
            bail!("sessions.max_live must be at least 1");
        }
        self.validate_bounds()?;
        if !QUEUE_GRACE_SECS.contains(&self.sessions.queue_grace_secs) {
            bail!(
                "sessions.queue_grace_secs is {}; it must be from {} to {} seconds",
                self.sessions.queue_grace_secs,
                QUEUE_GRACE_SECS.start(),
                QUEUE_GRACE_SECS.end()
            );
        }
        let cap = self.sessions.debug_log_max_bytes;
        if cap != 0 && cap < MIN_DEBUG_LOG_MAX_BYTES {
            bail!(
                "sessions.debug_log_max_bytes is {cap}; it must be 0 (no cap) or at least \
                 {MIN_DEBUG_LOG_MAX_BYTES} bytes"
            );
        }
        if !CONTROL_TIMEOUT_SECS.contains(&self.sessions.control_timeout_secs) {
            bail!(
                "sessions.control_timeout_secs is {}; it must be from {} to {} seconds",
                self.sessions.control_timeout_secs,
                CONTROL_TIMEOUT_SECS.start(),
                CONTROL_TIMEOUT_SECS.end()
            );
        }
        if !GUARD_VERDICT_SECS.contains(&self.sessions.guard_verdict_secs) {
            bail!(
                "sessions.guard_verdict_secs is {}; it must be from {} to {} seconds",
                self.sessions.guard_verdict_secs,
                GUARD_VERDICT_SECS.start(),
                GUARD_VERDICT_SECS.end()
            );
        }
        let range = &SUBSCRIBER_BUFFER;
        if !range.contains(&self.sessions.subscriber_buffer) {
            bail!(
                "sessions.subscriber_buffer is {}; it must be from {} to {} events",
                self.sessions.subscriber_buffer,
                range.start(),
                range.end()
            );
        }
        for (i, r) in self.sessions.allowed_roots.iter().enumerate() {
            if !r.is_dir() {
                bail!(
                    "sessions.allowed_roots[{i}]: {} is not an existing directory",
                    r.display()
                );
            }
        }
        let json_logs = match self.log.format.as_str() {
            "human" => false,
            "json" => true,
            other => bail!("log.format: {other:?} is not \"human\" or \"json\""),
        };
        tracing_subscriber::EnvFilter::try_new(&self.log.filter)
            .with_context(|| format!("log.filter: {:?} is not a valid filter", self.log.filter))?;
        let mut rules = Vec::new();
        for (key, action, specs) in [
            (
                "permissions.allow",
                ostler_engine::RuleAction::Allow,
                &self.permissions.allow,
            ),
            (
                "permissions.deny",
                ostler_engine::RuleAction::Deny,
                &self.permissions.deny,
            ),
        ] {
            for (i, spec) in specs.iter().enumerate() {
                let rule = ostler_engine::PermissionRule::parse(action, spec).map_err(|e| {
                    anyhow::anyhow!(
                        "{key}[{i}]: {e} (write `Tool` or `Tool(pattern)`, e.g. \"Bash(git status)\")"
                    )
                })?;
                rules.push(rule);
            }
        }
        let env_allowlist = self.validate_env_allow()?;
        self.validate_session_env()?;
        let managed_settings = self.validate_managed_settings()?;
        let metrics = self.validate_metrics()?;
        let worker_threads = self.validate_worker_threads()?;
        let Connections {
            max_connections,
            keepalive,
            idle_timeout,
        } = self.validate_connections()?;
        let cgroup = self
            .sessions
            .cgroup
            .parse()
            .map_err(|e| anyhow::anyhow!("sessions.cgroup: {e}"))?;
        let notifiers = self
            .notify
            .iter()
            .enumerate()
            .map(|(i, n)| n.validate(i))
            .collect::<Result<Vec<_>>>()?;
        // Each notifier saves its own position under its name (else its URL): two with one
        // name would share it, and one would skip what the other had sent.
        for (i, n) in notifiers.iter().enumerate() {
            if let Some(j) = notifiers[..i].iter().position(|m| m.name == n.name) {
                anyhow::bail!(
                    "notify[{i}] has the same name as notify[{j}] ({}; a name defaults to \
                     the url): each notifier keeps its own position under its name, so give \
                     each a distinct `name`",
                    n.shown
                );
            }
        }
        Ok(Validated {
            worker_threads,
            max_connections,
            keepalive,
            idle_timeout,
            cgroup,
            metrics,
            notifiers,
            env_allowlist,
            session_env: self.sessions.env.clone(),
            managed_settings,
            tcp,
            unix_socket: self.listen.unix_socket.clone(),
            tokens,
            tls,
            store_path,
            json_logs,
            rules,
        })
    }
}

/// The `[listen]` connection settings, validated.
struct Connections {
    max_connections: usize,
    /// (interval, timeout).
    keepalive: Option<(std::time::Duration, std::time::Duration)>,
    idle_timeout: std::time::Duration,
}

/// The longest any `*_secs` setting may be: a year. Longer is a mistake, and a time that
/// far ahead overflows the clock's arithmetic.
const MAX_SECS: u64 = 365 * 24 * 3600;
/// `store.max_unsynced_ms` at most: a minute (the kernel's own write-back is ~30 s).
const MAX_UNSYNCED_MS: u64 = 60_000;

/// `store.busy_timeout_secs` at most (SQLite takes it in milliseconds as a C `int`).
const MAX_BUSY_TIMEOUT_SECS: u64 = 3600;
/// `sessions.max_live` at most (each is a process).
const MAX_LIVE: u64 = 100_000;

impl Config {
    /// Upper bounds of the numbers that have no range of their own: a value past them is
    /// a mistake, and would otherwise panic or overflow after start.
    fn validate_bounds(&self) -> Result<()> {
        let (l, st, s) = (&self.listen, &self.store, &self.sessions);
        for (key, v, max) in [
            ("listen.keepalive_secs", l.keepalive_secs, MAX_SECS),
            (
                "listen.keepalive_timeout_secs",
                l.keepalive_timeout_secs,
                MAX_SECS,
            ),
            ("store.write_retry_secs", st.write_retry_secs, MAX_SECS),
            (
                "store.busy_timeout_secs",
                st.busy_timeout_secs,
                MAX_BUSY_TIMEOUT_SECS,
            ),
            ("sessions.idle_suspend_secs", s.idle_suspend_secs, MAX_SECS),
            ("sessions.live_wait_secs", s.live_wait_secs, MAX_SECS),
            (
                "sessions.permission_expiry_secs",
                s.permission_expiry_secs,
                MAX_SECS,
            ),
            ("sessions.stop_timeout_secs", s.stop_timeout_secs, MAX_SECS),
            ("sessions.max_live", s.max_live, MAX_LIVE),
            (
                "feed.deleted_retention_secs",
                self.feed.deleted_retention_secs,
                MAX_SECS,
            ),
        ] {
            if v > max {
                bail!("{key} is {v}; at most {max} is allowed");
            }
        }
        Ok(())
    }

    fn validate_connections(&self) -> Result<Connections> {
        let l = &self.listen;
        if l.max_connections == 0 || l.max_connections > MAX_CONNECTIONS {
            bail!(
                "listen.max_connections: {} is out of range; 1 to {MAX_CONNECTIONS} (each \
                 connection is a file descriptor: keep it under the daemon's `ulimit -n`)",
                l.max_connections
            );
        }
        let keepalive = match (l.keepalive_secs, l.keepalive_timeout_secs) {
            (0, _) => None,
            (_, 0) => bail!(
                "listen.keepalive_timeout_secs: 0 would close every connection at its first \
                 PING; give the client at least 1 second (or set listen.keepalive_secs = 0 \
                 to send no PINGs)"
            ),
            (every, timeout) => Some((
                std::time::Duration::from_secs(every),
                std::time::Duration::from_secs(timeout),
            )),
        };
        if l.idle_timeout_secs == 0 || l.idle_timeout_secs > MAX_IDLE_TIMEOUT_SECS {
            bail!(
                "listen.idle_timeout_secs: {} is out of range; 1 to {MAX_IDLE_TIMEOUT_SECS} \
                 (a connection with no authenticated call in flight for this long is asked \
                 to go away; its client reconnects for its next call)",
                l.idle_timeout_secs
            );
        }
        Ok(Connections {
            max_connections: usize::try_from(l.max_connections)?,
            keepalive,
            idle_timeout: std::time::Duration::from_secs(l.idle_timeout_secs),
        })
    }

    fn validate_managed_settings(
        &self,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let m = &self.sessions.managed_settings;
        if m.is_empty() {
            return Ok(None);
        }
        let len = serde_json::Value::Object(m.clone()).to_string().len();
        if len > MAX_MANAGED_SETTINGS {
            bail!(
                "sessions.managed_settings: {len} bytes as JSON, more than {MAX_MANAGED_SETTINGS} \
                 (it is passed on every session's command line)"
            );
        }
        Ok(Some(m.clone()))
    }

    fn validate_worker_threads(&self) -> Result<Option<usize>> {
        match self.runtime.worker_threads {
            0 => Ok(None),
            n if n > MAX_WORKER_THREADS => bail!(
                "runtime.worker_threads: {n} is too many; at most {MAX_WORKER_THREADS} (0: one \
                 per core)"
            ),
            n => Ok(Some(usize::try_from(n)?)),
        }
    }

    fn validate_metrics(&self) -> Result<Option<SocketAddr>> {
        let listen = self.metrics.listen.trim();
        if listen.is_empty() {
            return Ok(None);
        }
        let shown: String = listen.chars().take(100).collect();
        listen.parse::<SocketAddr>().map(Some).map_err(|_| {
            anyhow::anyhow!(
                "metrics.listen: {shown:?} is not an address like 127.0.0.1:9464 (empty: no \
                 metrics endpoint)"
            )
        })
    }

    fn validate_env_allow(&self) -> Result<Vec<String>> {
        let mut list: Vec<String> = ostler_supervisor::env::DEFAULT_ENV_ALLOWLIST
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        for (i, p) in self.sessions.env_allow.iter().enumerate() {
            ostler_supervisor::env::validate_pattern(p).map_err(|e| {
                anyhow::anyhow!(
                    "sessions.env_allow[{i}]: {e} (write a name like \"EXTRA_VAR\" or a \
                     prefix like \"MYCO_*\")"
                )
            })?;
            if !list.contains(p) {
                list.push(p.clone());
            }
        }
        Ok(list)
    }

    fn validate_session_env(&self) -> Result<()> {
        let env = &self.sessions.env.0;
        if env.len() > MAX_SESSION_ENV {
            bail!(
                "sessions.env: {} variables; at most {MAX_SESSION_ENV} are allowed",
                env.len()
            );
        }
        let mut total = 0usize;
        for (name, value) in env {
            let shown: String = name.chars().take(64).collect();
            ostler_supervisor::env::validate_name(name)
                .map_err(|e| anyhow::anyhow!("sessions.env.{shown}: the name {e}"))?;
            if value.contains('\0') {
                bail!("sessions.env.{shown}: the value contains a NUL byte");
            }
            let entry = name.len() + 1 + value.len();
            if entry > MAX_SESSION_ENV_ENTRY {
                bail!(
                    "sessions.env.{shown}: {entry} bytes; one variable may have at most \
                     {MAX_SESSION_ENV_ENTRY} bytes (the kernel refuses longer ones)"
                );
            }
            total += entry + 1;
        }
        if total > MAX_SESSION_ENV_TOTAL {
            bail!(
                "sessions.env: {total} bytes in all; at most {MAX_SESSION_ENV_TOTAL} are allowed"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn layers_file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "c.toml",
            "[listen]\naddr = \"127.0.0.1:9000\"\n[sessions]\nmax_live = 3\n",
        );
        let c = load(Some(&f), &Overrides::default()).unwrap();
        assert_eq!(c.listen.addr, "127.0.0.1:9000");
        assert_eq!(c.sessions.max_live, 3);
        assert_eq!(c.log.format, "human", "defaults fill the rest");

        let o = Overrides {
            listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        };
        let c = load(Some(&f), &o).unwrap();
        assert_eq!(c.listen.addr, "127.0.0.1:0", "flags win over the file");
        assert_eq!(c.sessions.max_live, 3);
    }

    /// `feed.deleted_retention_secs`: 30 days unless set, 0 allowed (forever), more than
    /// a year refused naming the key.
    #[test]
    fn feed_deleted_retention_defaults_to_30_days_and_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let none = write(dir.path(), "none.toml", "");
        let c = load(Some(&none), &Overrides::default()).unwrap();
        assert_eq!(c.feed.deleted_retention_secs, 2_592_000);
        for (v, ok) in [
            (0u64, true),
            (3600, true),
            (MAX_SECS, true),
            (MAX_SECS + 1, false),
        ] {
            let f = write(
                dir.path(),
                "feed.toml",
                &format!("[feed]\ndeleted_retention_secs = {v}\n"),
            );
            let c = load(Some(&f), &Overrides::default()).unwrap();
            assert_eq!(c.feed.deleted_retention_secs, v);
            match c.validate_bounds() {
                Ok(()) => assert!(ok, "{v} accepted"),
                Err(e) => {
                    assert!(!ok, "{v}: {e:#}");
                    assert!(
                        format!("{e:#}").contains("feed.deleted_retention_secs"),
                        "{e:#}"
                    );
                }
            }
        }
    }

    /// `sessions.managed_settings`: a TOML table in the file (keys as written), one JSON
    /// object in the environment; anything else, or too big, stops the start naming it.
    #[test]
    fn managed_settings_are_an_object_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "m.toml",
            "[sessions.managed_settings]\npermissions = { deny = [\"Read\"] }\n",
        );
        let v = load(Some(&f), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(
            v.managed_settings.map(serde_json::Value::Object),
            Some(serde_json::json!({"permissions": {"deny": ["Read"]}}))
        );
        let m = managed_settings_from_env(r#"{"allowManagedHooksOnly": true}"#).unwrap();
        assert_eq!(m["allowManagedHooksOnly"], true);
        for bad in ["[1]", "{", "\"deny\""] {
            let e = managed_settings_from_env(bad).unwrap_err().to_string();
            assert!(e.starts_with(MANAGED_SETTINGS_VAR), "{e}");
        }
        let mut c = Config::default();
        c.sessions.managed_settings.insert(
            "x".into(),
            serde_json::Value::String("y".repeat(MAX_MANAGED_SETTINGS)),
        );
        let e = c.validate_managed_settings().unwrap_err().to_string();
        assert!(e.starts_with("sessions.managed_settings: "), "{e}");
        assert_eq!(Config::default().validate_managed_settings().unwrap(), None);
    }

    #[test]
    fn worker_threads_layer() {
        let dir = tempfile::tempdir().unwrap();
        let c = load(
            Some(&write(
                dir.path(),
                "a.toml",
                "[store]\npath = \"/tmp/x.db\"\n",
            )),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.runtime.worker_threads, 0);
        assert_eq!(
            c.validate().unwrap().worker_threads,
            None,
            "0: tokio's choice"
        );
        let f = write(
            dir.path(),
            "b.toml",
            "[store]\npath = \"/tmp/x.db\"\n[runtime]\nworker_threads = 1\n",
        );
        let c = load(Some(&f), &Overrides::default()).unwrap();
        assert_eq!(c.validate().unwrap().worker_threads, Some(1));
        // Too many: see `bad_values_name_their_key`.
    }

    #[test]
    fn connection_keys_default_and_layer() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "a.toml", "[store]\npath = \"/tmp/x.db\"\n");
        let v = load(Some(&f), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(v.max_connections, 1024);
        let secs = std::time::Duration::from_secs;
        assert_eq!(v.keepalive, Some((secs(60), secs(20))));
        assert_eq!(v.idle_timeout, secs(300));
        let f = write(
            dir.path(),
            "b.toml",
            "[store]\npath = \"/tmp/x.db\"\n[listen]\nmax_connections = 8\n\
             keepalive_secs = 0\nkeepalive_timeout_secs = 0\nidle_timeout_secs = 30\n",
        );
        let v = load(Some(&f), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(v.max_connections, 8);
        assert_eq!(v.idle_timeout, secs(30));
        assert_eq!(
            v.keepalive, None,
            "0: no PINGs (the timeout is then unused)"
        );
        // Out of range: see `bad_values_name_their_key`.
    }

    #[test]
    fn suspension_keys_default_and_layer() {
        let c = load(
            Some(&write(
                tempfile::tempdir().unwrap().path(),
                "c.toml",
                "[listen]\naddr = \"127.0.0.1:9000\"\n",
            )),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.sessions.idle_suspend_secs, 900);
        assert_eq!(c.sessions.live_wait_secs, 30);
        assert_eq!(c.sessions.subscriber_buffer, 1024);
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "c.toml",
            "[sessions]\nidle_suspend_secs = 0\nlive_wait_secs = 5\nmax_live = 10\nsubscriber_buffer = 8192\n",
        );
        let c = load(Some(&f), &Overrides::default()).unwrap();
        assert_eq!(c.sessions.idle_suspend_secs, 0, "0 = never");
        assert_eq!(c.sessions.live_wait_secs, 5);
        assert_eq!(c.sessions.subscriber_buffer, 8192);
        c.validate().unwrap();
        let o = Overrides {
            max_live: Some(4),
            ..Default::default()
        };
        assert_eq!(
            load(Some(&f), &o).unwrap().sessions.max_live,
            4,
            "--max-sessions wins"
        );
    }

    #[test]
    fn permission_rules_are_parsed_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "c.toml",
            "[store]\npath = \"/tmp/x.db\"\n[permissions]\nallow = [\"Read\", \"Bash(git status)\"]\ndeny = [\"Edit(secrets/**)\"]\n",
        );
        let v = load(Some(&f), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap();
        let texts: Vec<String> = v.rules.iter().map(|r| r.text()).collect();
        assert_eq!(
            texts,
            [
                "allow Read",
                "allow Bash(git status)",
                "deny Edit(secrets/**)"
            ]
        );

        let bad = write(
            dir.path(),
            "bad.toml",
            "[store]\npath = \"/tmp/x.db\"\n[permissions]\ndeny = [\"Read\", \"Bash(rm\"]\n",
        );
        let err = load(Some(&bad), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("permissions.deny[1]"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "c.toml", "[listen]\nadress = \"x\"\n");
        let err = load(Some(&f), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("adress"), "{err}");
        // Named as written: the key and the file, without figment's profile.
        let f = write(dir.path(), "d.toml", "[sessions]\nmax_live = \"many\"\n");
        let err = load(Some(&f), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("sessions.max_live in {}", f.display()))
                && !err.contains("default."),
            "{err}"
        );
        let err = load(Some(dir.path()), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a directory"), "{err}");
    }

    #[test]
    fn missing_explicit_file_is_an_error() {
        let err = load(
            Some(Path::new("/nonexistent/ostler.toml")),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/ostler.toml"), "{err}");
    }

    #[test]
    fn non_loopback_requires_tokens() {
        let mut c = Config::default();
        c.store.path = Some("/tmp/x.db".into());
        c.listen.addr = "0.0.0.0:7433".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("listen.addr") && err.contains("auth.tokens"),
            "{err}"
        );
        c.auth.tokens = vec!["secret-token".into()];
        let v = c.validate().unwrap();
        assert_eq!(v.tokens.len(), 1);
        assert!(
            !format!("{c:?}").contains("secret-token"),
            "tokens never in Debug"
        );
    }

    /// A setting that may hold a secret, of the wrong type, is named but its value never
    /// quoted (the error goes to the journal and to `ostler doctor`'s output).
    #[test]
    fn a_secret_of_the_wrong_type_is_not_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("x.db").display().to_string();
        for (body, key) in [
            (
                "[auth]\ntokens = \"TOKEN-SHOULD-NOT-SHOW\"\n",
                "auth.tokens",
            ),
            (
                "[sessions]\nenv = \"K=TOKEN-SHOULD-NOT-SHOW\"\n",
                "sessions.env",
            ),
            (
                "[sessions.env]\nK = [\"TOKEN-SHOULD-NOT-SHOW\"]\n",
                "sessions.env.K",
            ),
        ] {
            let f = write(
                dir.path(),
                "secret.toml",
                &format!("[store]\npath = {store:?}\n{body}"),
            );
            let err = format!("{:#}", load(Some(&f), &Overrides::default()).unwrap_err());
            assert!(
                err.contains(key) && !err.contains("TOKEN-SHOULD-NOT-SHOW"),
                "{err}"
            );
        }
        // Other values are quoted: they help and are not secret.
        let f = write(
            dir.path(),
            "plain.toml",
            &format!("[store]\npath = {store:?}\n[sessions]\nmax_live = \"many\"\n"),
        );
        let err = format!("{:#}", load(Some(&f), &Overrides::default()).unwrap_err());
        assert!(err.contains("\"many\""), "{err}");
    }

    #[test]
    fn the_debug_log_cap_is_configured_and_zero_is_no_cap() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("x.db").display().to_string();
        assert_eq!(
            Config::default().sessions.debug_log_max_bytes,
            64 * 1024 * 1024
        );
        for (cap, ok) in [(0, true), (4096, true), (4095, false), (1, false)] {
            let f = write(
                dir.path(),
                "cap.toml",
                &format!("[store]\npath = {store:?}\n[sessions]\ndebug_log_max_bytes = {cap}\n"),
            );
            let c = load(Some(&f), &Overrides::default()).unwrap();
            assert_eq!(c.sessions.debug_log_max_bytes, cap);
            let v = c.validate();
            assert_eq!(v.is_ok(), ok, "{cap}");
            if let Err(e) = v {
                assert!(
                    format!("{e:#}").contains("sessions.debug_log_max_bytes"),
                    "{e:#}"
                );
            }
        }
    }

    #[test]
    fn every_layer_is_type_checked_and_errors_name_where_a_value_was_set() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("x.db").display().to_string();
        // A wrong type in the file is an error though a flag sets the same key.
        let bad = write(
            dir.path(),
            "bad.toml",
            &format!("[store]\npath = {store:?}\n[sessions]\nmax_live = \"abc\"\n"),
        );
        let flags = Overrides {
            max_live: Some(9),
            ..Default::default()
        };
        let err = format!("{:#}", load(Some(&bad), &flags).unwrap_err());
        assert!(
            err.contains("sessions.max_live in") && err.contains("bad.toml"),
            "{err}"
        );
        // Out of range: the message says which layer set it.
        let zero = write(
            dir.path(),
            "zero.toml",
            &format!("[store]\npath = {store:?}\n[sessions]\nmax_live = 0\n"),
        );
        let err = format!(
            "{:#}",
            load(Some(&zero), &Overrides::default())
                .unwrap()
                .validate()
                .unwrap_err()
        );
        assert!(
            err.contains("sessions.max_live")
                && err.contains("(set in ")
                && err.contains("zero.toml"),
            "{err}"
        );
        let ok = write(
            dir.path(),
            "ok.toml",
            &format!("[store]\npath = {store:?}\n"),
        );
        let flags = Overrides {
            max_live: Some(0),
            ..Default::default()
        };
        let err = format!(
            "{:#}",
            load(Some(&ok), &flags).unwrap().validate().unwrap_err()
        );
        assert!(err.contains("(set by a command-line flag)"), "{err}");
        // A default is not "set" anywhere.
        assert_eq!(
            load(Some(&ok), &Overrides::default())
                .unwrap()
                .origins
                .of("sessions.max_live"),
            None
        );
    }

    #[test]
    fn two_notifiers_with_one_name_are_refused() {
        let mut c = Config::default();
        c.store.path = Some("/tmp/x.db".into());
        let hook = |name: &str, team: &str| crate::notify::NotifyConfig {
            name: name.into(),
            url: "http://me:pw@127.0.0.1:9/hook".into(),
            labels: [("team".to_owned(), team.to_owned())].into(),
            ..Default::default()
        };
        c.notify = vec![hook("", "a"), hook("", "b")];
        let err = format!("{:#}", c.validate().unwrap_err());
        assert!(
            err.contains("notify[1] has the same name as notify[0]")
                && err.contains("distinct `name`"),
            "{err}"
        );
        assert!(!err.contains("pw@"), "{err}");
        c.notify = vec![hook("team-a", "a"), hook("team-b", "b")];
        assert_eq!(c.validate().unwrap().notifiers.len(), 2);
    }

    #[test]
    fn token_file_is_read_and_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Config::default();
        c.store.path = Some(dir.path().join("x.db"));
        c.auth.token_file = Some(write(dir.path(), "t", "# comment\n\n"));
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("auth.token_file"), "{err}");
        c.auth.token_file = Some(write(dir.path(), "t2", "# c\nabc\n def \n"));
        assert_eq!(c.validate().unwrap().tokens.len(), 2);
    }

    #[test]
    fn bad_values_name_their_key() {
        let base = || {
            let mut c = Config::default();
            c.store.path = Some("/tmp/x.db".into());
            c
        };
        type Edit = Box<dyn Fn(&mut Config)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|c| c.listen.addr = "localhost".into()),
                "listen.addr",
            ),
            (Box::new(|c| c.log.format = "xml".into()), "log.format"),
            (Box::new(|c| c.log.filter = "[[[".into()), "log.filter"),
            (
                Box::new(|c| c.store.synchronous = "sometimes".into()),
                "store.synchronous",
            ),
            (
                Box::new(|c| c.store.busy_timeout_secs = 0),
                "store.busy_timeout_secs",
            ),
            (
                Box::new(|c| c.store.max_unsynced_ms = 60_001),
                "store.max_unsynced_ms",
            ),
            (Box::new(|c| c.sessions.max_live = 0), "sessions.max_live"),
            (
                Box::new(|c| c.sessions.queue_grace_secs = 0),
                "sessions.queue_grace_secs",
            ),
            (
                Box::new(|c| c.sessions.queue_grace_secs = 86_400),
                "sessions.queue_grace_secs",
            ),
            (
                Box::new(|c| c.sessions.guard_verdict_secs = 0),
                "sessions.guard_verdict_secs",
            ),
            (
                Box::new(|c| c.sessions.debug_log_max_bytes = 4095),
                "sessions.debug_log_max_bytes",
            ),
            (
                Box::new(|c| c.sessions.subscriber_buffer = 100),
                "sessions.subscriber_buffer",
            ),
            (
                Box::new(|c| c.sessions.control_timeout_secs = 0),
                "sessions.control_timeout_secs",
            ),
            (
                Box::new(|c| c.sessions.subscriber_buffer = 1 << 20),
                "sessions.subscriber_buffer",
            ),
            (
                Box::new(|c| c.runtime.worker_threads = 100_000),
                "runtime.worker_threads",
            ),
            (
                Box::new(|c| c.listen.max_connections = 0),
                "listen.max_connections",
            ),
            (
                Box::new(|c| c.listen.keepalive_timeout_secs = 0),
                "listen.keepalive_timeout_secs",
            ),
            (
                Box::new(|c| c.listen.idle_timeout_secs = 0),
                "listen.idle_timeout_secs",
            ),
            (
                Box::new(|c| c.listen.idle_timeout_secs = MAX_IDLE_TIMEOUT_SECS + 1),
                "listen.idle_timeout_secs",
            ),
            (
                Box::new(|c| c.sessions.allowed_roots = vec!["/nonexistent/root".into()]),
                "sessions.allowed_roots[0]",
            ),
            (
                Box::new(|c| c.tls.cert = Some("/nonexistent.pem".into())),
                "tls.key",
            ),
            (
                Box::new(|c| {
                    c.listen.addr = String::new();
                }),
                "listen.unix_socket",
            ),
            // Numbers past their bounds would panic or overflow after start.
            (
                Box::new(|c| c.store.busy_timeout_secs = 2_147_484),
                "store.busy_timeout_secs",
            ),
            (
                Box::new(|c| c.sessions.idle_suspend_secs = i64::MAX as u64),
                "sessions.idle_suspend_secs",
            ),
            (
                Box::new(|c| c.listen.keepalive_secs = u64::MAX),
                "listen.keepalive_secs",
            ),
            (
                Box::new(|c| c.sessions.permission_expiry_secs = u64::MAX),
                "sessions.permission_expiry_secs",
            ),
            (
                Box::new(|c| c.sessions.live_wait_secs = u64::MAX),
                "sessions.live_wait_secs",
            ),
            (
                Box::new(|c| c.sessions.max_live = u64::MAX),
                "sessions.max_live",
            ),
        ];
        for (f, key) in cases {
            let mut c = base();
            f(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(key), "expected {key} in {err}");
        }
    }

    #[test]
    fn session_env_layers_and_allowlist() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "c.toml",
            "[store]\npath = \"/tmp/x.db\"\n[sessions]\nenv_allow = [\"MYCO_*\"]\n\
             [sessions.env]\nGIT_AUTHOR_NAME = \"toml\"\nMixed_Case = \"toml\"\n",
        );
        let o = Overrides {
            session_env: vec![("GIT_AUTHOR_NAME".into(), "flag".into())],
            ..Default::default()
        };
        let c = load(Some(&f), &o).unwrap();
        let v = c.validate().unwrap();
        assert_eq!(
            v.session_env.0.get("GIT_AUTHOR_NAME").map(String::as_str),
            Some("flag"),
            "flags win over the file"
        );
        assert_eq!(
            v.session_env.0.get("Mixed_Case").map(String::as_str),
            Some("toml"),
            "names keep their case"
        );
        assert!(v.env_allowlist.iter().any(|p| p == "MYCO_*"));
        assert!(
            v.env_allowlist
                .iter()
                .any(|p| p == "CLAUDE_CODE_OAUTH_TOKEN"),
            "the defaults stay"
        );
        let dbg = format!("{c:?} {v:?}");
        assert!(
            !dbg.contains("toml\"") && !dbg.contains("\"flag"),
            "values are redacted in Debug: {dbg}"
        );

        let from_env = session_env_from(
            [
                ("OSTLER_SESSIONS__ENV__GIT_EMAIL", "a@b"),
                ("ostler_sessions__env__Lower", "x"),
                ("OSTLER_LISTEN__ADDR", "127.0.0.1:1"),
                ("GIT_EMAIL", "not ours"),
            ]
            .map(|(k, v)| (k.into(), v.into())),
        );
        assert_eq!(from_env.len(), 2, "{from_env:?}");
        assert_eq!(from_env["GIT_EMAIL"], "a@b");
        assert_eq!(from_env["Lower"], "x");
    }

    #[test]
    fn metrics_are_off_by_default_and_layered() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "c.toml", "[store]\npath = \"/tmp/x.db\"\n");
        let v = load(Some(&f), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(v.metrics, None, "off by default");

        let f = write(
            dir.path(),
            "m.toml",
            "[store]\npath = \"/tmp/x.db\"\n[metrics]\nlisten = \"127.0.0.1:9464\"\n",
        );
        let v = load(Some(&f), &Overrides::default())
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(v.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        let o = Overrides {
            metrics_listen: Some("[::1]:0".into()),
            ..Default::default()
        };
        let v = load(Some(&f), &o).unwrap().validate().unwrap();
        assert_eq!(
            v.metrics,
            Some("[::1]:0".parse().unwrap()),
            "the flag wins over the file"
        );

        let mut c = Config::default();
        c.store.path = Some("/tmp/x.db".into());
        c.metrics.listen = "localhost:9464".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("metrics.listen"), "{err}");
        c.metrics.listen = "x".repeat(10_000);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.len() < 400, "the message stays short: {err}");
    }

    #[test]
    fn session_env_bad_entries_name_their_key() {
        let base = || {
            let mut c = Config::default();
            c.store.path = Some("/tmp/x.db".into());
            c
        };
        type Edit = Box<dyn Fn(&mut Config)>;
        let set = |k: &str, v: &str| -> Edit {
            let (k, v) = (k.to_owned(), v.to_owned());
            Box::new(move |c: &mut Config| {
                c.sessions.env.0.insert(k.clone(), v.clone());
            })
        };
        let cases: Vec<(Edit, &str)> = vec![
            (
                set("OSTLER_AUTH__TOKENS", "x"),
                "sessions.env.OSTLER_AUTH__TOKENS",
            ),
            (set("BAD-NAME", "x"), "sessions.env.BAD-NAME"),
            (set("1X", "x"), "sessions.env.1X"),
            (set("CLAUDECODE", "1"), "sessions.env.CLAUDECODE"),
            (set("NUL", "a\0b"), "NUL byte"),
            (set("BIG", &"x".repeat(200 * 1024)), "sessions.env.BIG"),
            (
                Box::new(|c| {
                    for i in 0..300 {
                        c.sessions.env.0.insert(format!("V{i}"), "1".into());
                    }
                }),
                "at most 256",
            ),
            (
                Box::new(|c| c.sessions.env_allow = vec!["OSTLER_*".into()]),
                "sessions.env_allow[0]",
            ),
            (
                Box::new(|c| c.sessions.env_allow = vec!["*".into()]),
                "sessions.env_allow[0]",
            ),
        ];
        for (f, key) in cases {
            let mut c = base();
            f(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(key), "expected {key} in {err}");
            assert!(err.len() < 400, "the message stays short: {err}");
        }
    }
}
