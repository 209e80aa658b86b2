//! The in-process server harness shared by this crate's gRPC tests.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;

use ostler_engine::{Engine, EngineOptions};
use ostler_server::{ClaudeCodeInfo, Compatibility, DaemonInfo, Listener, Server, ServerOptions};
use tokio_util::sync::CancellationToken;

/// A real engine on a temporary store behind the real tonic server on a loopback port.
pub struct Harness {
    pub addr: std::net::SocketAddr,
    pub shutdown: CancellationToken,
    pub server: tokio::task::JoinHandle<ostler_server::Result<()>>,
    pub dir: tempfile::TempDir,
}

/// A real engine on a store in `dir` and the daemon's info, as a starting daemon hands
/// them to its server.
pub async fn ready_in(
    dir: &std::path::Path,
    engine_opts: EngineOptions,
    claude: PathBuf,
) -> ostler_server::Ready {
    let store = ostler_store::Store::open(dir.join("ostler.db"), Default::default()).unwrap();
    let installation = ostler_supervisor::Installation::assume(
        claude.clone(),
        semver::Version::new(2, 1, 330),
        None,
    );
    let engine = Engine::start(engine_opts, store, installation)
        .await
        .unwrap();
    let info = DaemonInfo::new(
        "9.9.9",
        dir.join("ostler.db").display().to_string(),
        ClaudeCodeInfo {
            version: "2.1.330".into(),
            api_date: None,
            level: Compatibility::FullyCompatible,
            message: "Claude Code 2.1.330 (tested)".into(),
            binary_path: claude.display().to_string(),
            capabilities: vec![],
        },
    );
    ostler_server::Ready { engine, info }
}

/// Starts a server whose engine would run `claude` (a path that need not exist).
pub async fn start_with(
    opts: ServerOptions,
    engine_opts: EngineOptions,
    claude: PathBuf,
) -> Harness {
    start_in(tempfile::tempdir().unwrap(), opts, engine_opts, claude).await
}

/// The same, on the store in `dir` (which a test may have filled first).
pub async fn start_in(
    dir: tempfile::TempDir,
    opts: ServerOptions,
    engine_opts: EngineOptions,
    claude: PathBuf,
) -> Harness {
    let ready = ready_in(dir.path(), engine_opts, claude).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(Server::run(
        opts,
        ready.engine,
        ready.info,
        vec![Listener::Tcp(listener)],
        shutdown.clone(),
    ));
    Harness {
        addr,
        shutdown,
        server,
        dir,
    }
}
