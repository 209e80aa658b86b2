//! The `ostler` client commands: `run`, `sessions`, `show`, `attach`, `send`, `interrupt`,
//! `stop`, `resume`, `delete`, `health`, `pending`, `approve`, `deny`, `answer`, `hook`,
//! `tool-result`, `elicitation`, `watch`,
//! `info`, `context`, `mcp`, `rewind`, `control`, `debug-log`.
//!
//! Sessions are named by id, a unique id prefix, or `@last` / `--last` (`ids.rs`).
//!
//! Every command talks to a daemon over the public gRPC API (`ostler.v1`) only, with the
//! generated clients of `ostler-proto`; nothing here reaches into the daemon's crates.
//!
//! Exit codes: 0 success; 1 an error (the daemon refused, could not connect, a turn that
//! ended in error); 2 bad usage; 3 a permission prompt or question that could not be
//! answered (no terminal and no flag decides it); 130 the turn was interrupted (Ctrl-C, or
//! an interrupt from any client) or the command detached with Ctrl-C.

/// `println!` for the client commands, through [`render::out`]: a reader that went away
/// (`ostler sessions | head -1`) ends the command quietly instead of a panic.
macro_rules! outln {
    () => {
        $crate::client::render::out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::client::render::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` through [`render::terminal_text`]: text from elsewhere shown harmlessly,
/// ostler's own colours kept.
macro_rules! errln {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::client::render::terminal_text(&format!($($arg)*)))
    };
}

/// `bail!` for a [`Usage`] error.
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::client::Usage(format!($($arg)*))))
    };
}

pub mod commands;
pub mod config;
pub mod controls;
pub mod debug_log;
pub mod dialogs;
pub mod elicitations;
pub mod follow;
pub mod hooks;
pub mod ids;
pub mod json;
pub mod meta;
pub mod pending;
pub mod prompt;
pub mod render;
pub mod run;
pub mod session_opts;
pub mod tool_calls;
pub mod watch;

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use hyper_util::rt::TokioIo;
use ostler_proto::v1::daemon_service_client::DaemonServiceClient;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint as TonicEndpoint, Identity,
};
use tonic_health::pb::health_client::HealthClient;

pub use config::ConnectArgs;

/// Exit code: a turn or request failed.
pub const EXIT_FAILED: i32 = 1;
/// Exit code: what was typed is wrong (clap's own errors exit with it too).
pub const EXIT_USAGE: i32 = 2;
/// Exit code: a prompt could not be answered without a terminal.
pub const EXIT_UNANSWERABLE: i32 = 3;
/// Exit code: interrupted / detached by Ctrl-C.
pub const EXIT_INTERRUPTED: i32 = 130;

/// A mistake in what the user typed that clap cannot see (an empty prompt, a bad
/// `--allow-tools` entry, an address without a port, a choice that is not an option): the
/// command exits with [`EXIT_USAGE`], as for clap's own errors, not with
/// [`EXIT_FAILED`], which says the daemon or the turn failed.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The exit code of a command that failed with `e`.
fn exit_code(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<Usage>().is_some() {
        EXIT_USAGE
    } else {
        EXIT_FAILED
    }
}

/// `run`, `send` and `attach --until-turn` with `--json` end with a `run_summary` line,
/// also when they fail before the turn (the daemon unreachable, the request refused):
/// `{"type": "run_summary", "outcome": "failed", "exit_code", "message", "session_id"}`.
fn summary_on_error(json: bool, session: Option<String>, r: Result<i32>) -> Result<i32> {
    if let (true, Err(e)) = (json, &r) {
        render::json_line(&serde_json::json!({
            "type": "run_summary",
            "outcome": "failed",
            "exit_code": exit_code(e),
            "message": format!("{e:#}"),
            "session_id": session,
        }));
    }
    r
}

/// The client subcommands (flattened into the binary's command enum).
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Create a session on the daemon, send PROMPT (or stdin) and stream the turn.
    Run(run::RunArgs),
    /// List sessions.
    Sessions(commands::SessionsArgs),
    /// Show one session (and, with --events, its event log).
    Show(commands::ShowArgs),
    /// Follow a session's events and answer its permission prompts and questions.
    Attach(commands::AttachArgs),
    /// Send a message to a session and stream the turn it starts.
    Send(commands::SendArgs),
    /// Interrupt a session's current turn.
    Interrupt(commands::InterruptArgs),
    /// Stop a session's CLI process (history is kept; `resume` continues it).
    Stop(commands::IdArgs),
    /// Respawn a stopped, exited or resumable session (with --fork, in a branch of its
    /// conversation).
    Resume(commands::ResumeArgs),
    /// Stop and delete a session and its history.
    Delete(commands::IdArgs),
    /// Give a session a new title (ostler's, not the CLI's).
    Rename(meta::RenameArgs),
    /// Set (KEY=VALUE) or remove (-k KEY) a session's labels.
    Label(meta::LabelArgs),
    /// Archive a session: `sessions` hides it (the process and its log are left alone; a
    /// message sent to it unarchives it).
    Archive(commands::IdArgs),
    /// Unarchive a session.
    Unarchive(commands::IdArgs),
    /// Check the daemon's health (standard gRPC health plus daemon details).
    Health(commands::HealthArgs),
    /// List every pending permission prompt, question, hook call, tool call, elicitation and
    /// dialog across sessions, oldest first.
    Pending(pending::PendingArgs),
    /// Allow a pending permission request (by request id or prefix, see `pending`).
    Approve(pending::ApproveArgs),
    /// Deny a pending permission request, telling the model why.
    Deny(pending::DenyArgs),
    /// Answer a pending question (by request id or prefix, see `pending`).
    Answer(pending::AnswerQuestionArgs),
    /// Answer a pending hook call (by request id or prefix, see `pending`).
    Hook(hooks::HookArgs),
    /// Answer a pending call of a client-hosted tool with its result (or `--error`)
    ToolResult(tool_calls::ToolResultArgs),
    /// Answer an MCP server's pending request for input (an elicitation): accept, decline or
    /// cancel
    Elicitation(elicitations::ElicitationArgs),
    /// Answer a dialog the CLI asks for (a kind declared with --dialog-kinds, e.g. whether to
    /// retry a refused prompt on the fallback model)
    Dialog(dialogs::DialogArgs),
    /// Follow every session at once: created, state changes, finished turns, prompts,
    /// answers, exits (resume with --since CURSOR).
    Watch(watch::WatchArgs),
    /// What a session runs with: CLI release, model, tools, MCP servers, slash commands,
    /// models, capabilities.
    Info(controls::InfoArgs),
    /// How much of the context window a session uses.
    Context(controls::ContextArgs),
    /// A session's MCP servers: status, toggle NAME on|off, reconnect NAME, set FILE.
    Mcp(controls::McpArgs),
    /// Switch a session's model for the following turns (or back to the default).
    Model(controls::ModelArgs),
    /// Set a session's permission mode: default, acceptEdits, plan or bypassPermissions.
    Mode(controls::ModeArgs),
    /// Set (or reset) the most tokens a session's model may think per turn.
    Thinking(controls::ThinkingArgs),
    /// Stop one of a session's background tasks.
    StopTask(controls::StopTaskArgs),
    /// Restore the files a session changed to their state at one of its messages (a
    /// session created with file checkpointing).
    Rewind(controls::RewindArgs),
    /// Show the CLI's debug log of a session created with --debug (--follow: as it grows).
    DebugLog(debug_log::DebugLogArgs),
    /// Send a control request ostler has no command for (get_settings, list_models,
    /// get_usage, rename_session, ...) and print the CLI's answer.
    Control(controls::ControlArgs),
}

/// Runs a client command and exits the process with its exit code.
pub fn main(cmd: ClientCommand) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(async move {
        match cmd {
            ClientCommand::Run(a) => {
                let json = a.json;
                summary_on_error(json, None, run::run(a).await)
            }
            ClientCommand::Sessions(a) => commands::sessions(a).await,
            ClientCommand::Show(a) => commands::show(a).await,
            ClientCommand::Attach(a) => {
                let (json, id) = (a.json && a.until_turn, a.session.id.clone());
                summary_on_error(json, id, commands::attach(a).await)
            }
            ClientCommand::Send(a) => {
                let (json, id) = (a.json, a.id.clone());
                summary_on_error(json, id, commands::send(a).await)
            }
            ClientCommand::Interrupt(a) => commands::interrupt(a).await,
            ClientCommand::Stop(a) => commands::stop(a).await,
            ClientCommand::Resume(a) => commands::resume(a).await,
            ClientCommand::Delete(a) => commands::delete(a).await,
            ClientCommand::Rename(a) => meta::rename(a).await,
            ClientCommand::Label(a) => meta::label(a).await,
            ClientCommand::Archive(a) => meta::archive(a, true).await,
            ClientCommand::Unarchive(a) => meta::archive(a, false).await,
            ClientCommand::Health(a) => commands::health(a).await,
            ClientCommand::Pending(a) => pending::pending(a).await,
            ClientCommand::Approve(a) => pending::approve(a).await,
            ClientCommand::Deny(a) => pending::deny(a).await,
            ClientCommand::Answer(a) => pending::answer(a).await,
            ClientCommand::Hook(a) => hooks::hook(a).await,
            ClientCommand::ToolResult(a) => tool_calls::tool_result(a).await,
            ClientCommand::Elicitation(a) => elicitations::elicitation(a).await,
            ClientCommand::Dialog(a) => dialogs::dialog(a).await,
            ClientCommand::Watch(a) => watch::watch(a).await,
            ClientCommand::Info(a) => controls::info(a).await,
            ClientCommand::Context(a) => controls::context(a).await,
            ClientCommand::Mcp(a) => controls::mcp(a).await,
            ClientCommand::Model(a) => controls::model(a).await,
            ClientCommand::Mode(a) => controls::mode(a).await,
            ClientCommand::Thinking(a) => controls::thinking(a).await,
            ClientCommand::StopTask(a) => controls::stop_task(a).await,
            ClientCommand::Rewind(a) => controls::rewind(a).await,
            ClientCommand::Control(a) => controls::control(a).await,
            ClientCommand::DebugLog(a) => debug_log::debug_log(a).await,
        }
    });
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            render::error_line(&format!("{e:#}"));
            exit_code(&e)
        }
    };
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // Blocking terminal reads may still be parked in the runtime's blocking pool; do not
    // wait for them.
    rt.shutdown_background();
    std::process::exit(code)
}

/// Adds the bearer token and the client name to every request.
#[derive(Clone)]
pub struct Auth {
    token: Option<AsciiMetadataValue>,
    client: Option<AsciiMetadataValue>,
}

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.token {
            req.metadata_mut().insert("authorization", t.clone());
        }
        if let Some(c) = &self.client {
            req.metadata_mut().insert("x-ostler-client", c.clone());
        }
        Ok(req)
    }
}

pub type Sessions = SessionServiceClient<InterceptedService<Channel, Auth>>;
pub type Daemon = DaemonServiceClient<InterceptedService<Channel, Auth>>;

/// A connection to the daemon.
#[derive(Clone)]
pub struct Conn {
    pub sessions: Sessions,
    pub daemon: Daemon,
    pub health: HealthClient<Channel>,
    /// The address, for messages.
    pub addr: String,
}

impl Conn {
    /// `GetSession`, with the client's error wording.
    pub async fn session(&mut self, id: &str) -> Result<ostler_proto::v1::Session> {
        Ok(self
            .sessions
            .get_session(ostler_proto::v1::GetSessionRequest {
                session_id: id.to_owned(),
            })
            .await
            .map_err(|s| status_error("get session", s))?
            .into_inner())
    }
}

/// Connect to the daemon the flags/config/env point at.
pub async fn connect(args: &ConnectArgs) -> Result<Conn> {
    let target = config::resolve(args)?;
    connect_to(&target).await
}

/// The client's HTTP/2 PING interval on TCP, and how long an answer may take.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// Connect to a resolved target.
pub async fn connect_to(target: &config::Target) -> Result<Conn> {
    let addr = target.endpoint.to_string();
    let channel = match &target.endpoint {
        config::Endpoint::Tcp { uri, tls } => {
            let mut ep = TonicEndpoint::from_shared(uri.clone())
                .with_context(|| format!("daemon address {uri}"))?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                // A connection that dies without a word (a laptop or phone changing
                // networks: no FIN, no RST) is noticed within KEEPALIVE * 2, and a
                // follower resubscribes over a new one instead of waiting forever.
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_timeout(KEEPALIVE)
                .keep_alive_while_idle(true)
                .tcp_keepalive(Some(KEEPALIVE * 3));
            if *tls || target.tls_ca.is_some() {
                let mut tls = ClientTlsConfig::new();
                if let Some(ca) = &target.tls_ca {
                    let pem = std::fs::read(ca)
                        .with_context(|| format!("reading CA certificate {}", ca.display()))?;
                    tls = tls.ca_certificate(Certificate::from_pem(pem));
                } else {
                    tls = tls.with_enabled_roots();
                }
                if let (Some(cert), Some(key)) = (&target.tls_cert, &target.tls_key) {
                    let cert = std::fs::read(cert).with_context(|| {
                        format!("reading client certificate {}", cert.display())
                    })?;
                    let key = std::fs::read(key)
                        .with_context(|| format!("reading client key {}", key.display()))?;
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                if let Some(d) = &target.tls_domain {
                    tls = tls.domain_name(d.clone());
                }
                ep = ep.tls_config(tls).context("TLS configuration")?;
            }
            ep.connect()
                .await
                .map_err(|e| unreachable(target, &source_chain(&e)))?
        }
        config::Endpoint::Unix(path) => {
            let path = path.clone();
            TonicEndpoint::from_static("http://localhost")
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: http_uri::Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(stream))
                    }
                }))
                .await
                .map_err(|e| unreachable(target, &source_chain(&e)))?
        }
    };
    let _ = TARGET.set((addr.clone(), target.addr_source.clone()));
    let token = match &target.token {
        Some(t) => Some(
            MetadataValue::try_from(format!("Bearer {t}"))
                .map_err(|_| anyhow!("the token contains characters not allowed in a header"))?,
        ),
        None => None,
    };
    let client = MetadataValue::try_from(target.client_name.as_str()).ok();
    let auth = Auth { token, client };
    Ok(Conn {
        sessions: SessionServiceClient::with_interceptor(channel.clone(), auth.clone())
            .max_decoding_message_size(64 * 1024 * 1024),
        daemon: DaemonServiceClient::with_interceptor(channel.clone(), auth),
        health: HealthClient::new(channel),
        addr,
    })
}

/// The address and its source, for error messages about calls (set once per process).
static TARGET: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();

/// "cannot reach": which address, from which setting, and what to do.
fn unreachable(target: &config::Target, why: &str) -> anyhow::Error {
    let addr = &target.endpoint;
    // It answered, with a certificate the client does not accept: not a daemon to start.
    if let Some(at) = why.find("invalid peer certificate") {
        let reason = why[at..].split("; detail").next().unwrap_or(&why[at..]);
        let hint = if reason.contains("CaUsedAsEndEntity") {
            "the certificate is marked as a CA (CA:TRUE, what `openssl req -x509` makes by \
             default): make the daemon's certificate with `-addext \
             basicConstraints=critical,CA:FALSE` (docs/operations.md, TLS), or sign it with a CA \
             and give that CA with --tls-ca"
        } else if reason.contains("not valid for name") {
            "connect by a name the certificate lists, or give that name with --tls-domain"
        } else {
            "give the CA that signed the daemon's certificate with --tls-ca (OSTLER_TLS_CA)"
        };
        return anyhow!(
            "the ostler daemon at {addr} answered, but its TLS certificate was not accepted \
             ({}): {hint}",
            clip_detail(reason)
        );
    }
    let what = if why.contains("No such file") || why.contains("os error 2") {
        "no socket there"
    } else if why.contains("refused") {
        "nothing listens there"
    } else if why.contains("timed out") || why.contains("elapsed") {
        "no answer within 5 s"
    } else if why.contains("InvalidContentType") || why.contains("corrupt message") {
        "it did not answer TLS: leave out https:// for a daemon without TLS"
    } else if is_not_grpc(why) {
        return not_grpc(&addr.to_string(), &target.addr_source);
    } else {
        why
    };
    anyhow!(
        "cannot reach the ostler daemon at {addr} ({what}; detail: {}). The address came from \
         {}. Start the daemon with `ostler serve`, or point the client at it with --addr / \
         OSTLER_ADDR (or --config for another daemon configuration)",
        clip_detail(why),
        target.addr_source
    )
}

/// Signs that the peer answered, but not with gRPC over HTTP/2.
fn is_not_grpc(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    [
        "h2 protocol error",
        "http2 error",
        "frame with invalid size",
        "invalid http version",
        "connection reset",
        "broken pipe",
        "invalid content-type",
        "content-type",
        "unexpected eof",
        "http/1",
        "invalid frame",
        // An HTTP/2 server that is not gRPC (tonic maps its HTTP status).
        "grpc-status header missing",
    ]
    .iter()
    .any(|p| m.contains(p))
}

fn not_grpc(addr: &str, source: &str) -> anyhow::Error {
    anyhow!(
        "the server at {addr} does not speak gRPC: it is not an ostler daemon (or a proxy in \
         front of it does not pass HTTP/2 through). The address came from {source}; check \
         --addr / OSTLER_ADDR, and use https:// when the daemon has TLS"
    )
}

/// Whether the server at `addr` (`http://host:port` or `unix:///path`) answers the HTTP/2
/// connection preface with HTTP/2; `None` when it cannot be told (TLS, unreachable, slow).
/// Only used to explain a failed call, so blocking with short timeouts is acceptable.
fn speaks_http2(addr: &str) -> Option<bool> {
    use std::time::Duration;
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    fn exchange(mut s: impl std::io::Read + std::io::Write) -> Option<bool> {
        s.write_all(PREFACE).ok()?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).unwrap_or(0);
        let got = buf.get(..n)?;
        // An HTTP/2 server starts with a SETTINGS frame (type 4 in the 4th byte).
        Some(got.len() >= 4 && got.get(3) == Some(&4) && !got.starts_with(b"HTTP/"))
    }
    let timeout = Some(Duration::from_secs(2));
    if let Some(hostport) = addr.strip_prefix("http://") {
        let sa = std::net::ToSocketAddrs::to_socket_addrs(hostport)
            .ok()?
            .next()?;
        let s = std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(timeout).ok()?;
        s.set_write_timeout(timeout).ok()?;
        exchange(s)
    } else if let Some(path) = addr.strip_prefix("unix://") {
        let s = std::os::unix::net::UnixStream::connect(path).ok()?;
        s.set_read_timeout(timeout).ok()?;
        s.set_write_timeout(timeout).ok()?;
        exchange(s)
    } else {
        None
    }
}

fn clip_detail(s: &str) -> String {
    render::clip(s, 200)
}

/// `tonic::transport::Error` hides the interesting part in its sources.
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// A readable error for a failed call: `<what>: <CODE>: <message>` plus a hint for the
/// codes a user can act on.
pub fn status_error(what: &str, s: tonic::Status) -> anyhow::Error {
    let code = code_name(s.code());
    let (addr, source) = TARGET
        .get()
        .cloned()
        .unwrap_or_else(|| ("the daemon address".into(), "the client's settings".into()));
    let content_type = s
        .metadata()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let transportish = matches!(
        s.code(),
        tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled
            | tonic::Code::Unavailable
            | tonic::Code::Unimplemented
    );
    if transportish
        && (is_not_grpc(s.message())
            || content_type
                .as_deref()
                .is_some_and(|c| !c.starts_with("application/grpc"))
            // No answer at all (the connection closed): ask the server what it speaks.
            || (content_type.is_none() && speaks_http2(&addr) == Some(false)))
    {
        return not_grpc(&addr, &source);
    }
    let hint = match s.code() {
        tonic::Code::Unauthenticated => {
            " (pass --token or --token-file, or set OSTLER_TOKEN; without them the client \
             uses the daemon configuration's auth.tokens / auth.token_file)"
                .to_owned()
        }
        // (Not the daemon's "all connections are in use", which says what to do itself.)
        tonic::Code::Unavailable
            if s.message().contains("connect") && !s.message().contains("connections") =>
        {
            format!(
                " (is `ostler serve` running at {addr}? the address came from {source}; see \
                 --addr)"
            )
        }
        _ => String::new(),
    };
    anyhow!("{what}: {code}: {}{hint}", s.message())
}

/// The canonical name of a gRPC code (`NOT_FOUND`, ...).
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

mod http_uri {
    pub use tonic::codegen::http::Uri;
}
