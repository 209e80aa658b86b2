//! ostler-server: the gRPC surface of the ostler daemon.
//!
//! - [`SessionSvc`] / [`DaemonSvc`]: `ostler.v1.SessionService` and `DaemonService` on top
//!   of an [`ostler_engine::Engine`]; request validation and the one engine-error ->
//!   `Status` mapping ([`error`]) live here.
//! - `grpc.health.v1.Health` (tonic-health), kept in line with the engine's store status,
//!   and server reflection (tonic-reflection, v1 and v1alpha).
//! - [`auth::AuthLayer`]: bearer tokens checked in a tower layer (health exempt).
//! - [`error::BadRequestLayer`]: an undecodable request is INVALID_ARGUMENT, not INTERNAL.
//! - [`Server::run`]: serves on already-bound listeners (TCP, optionally TLS; Unix socket)
//!   until a [`CancellationToken`] fires; then health turns NOT_SERVING, every subscriber
//!   stream ends with `UNAVAILABLE`, and accepting stops.

pub mod auth;
mod controls;
mod convert;
mod daemon;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod hooks;
mod listen;
mod notices;
mod session;
mod tools;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ostler_engine::Engine;
use ostler_proto::v1::daemon_service_server::DaemonServiceServer;
use ostler_proto::v1::session_service_server::SessionServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

pub use auth::{AuthLayer, Token};
pub use daemon::{ClaudeCodeInfo, Compatibility, DaemonInfo, DaemonSvc};
pub use session::{CLIENT_HEADER, SessionSvc};

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("I/O on {listener}: {source}")]
    Io {
        listener: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// TLS material (PEM).
#[derive(Clone)]
pub struct TlsOptions {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("client_auth", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

/// Server configuration.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Bearer tokens; empty disables authentication.
    pub tokens: Vec<Token>,
    /// TLS for TCP listeners (Unix sockets are always plain).
    pub tls: Option<TlsOptions>,
    /// How often the health service re-checks the engine's store.
    pub health_interval: Duration,
    /// How long to wait for open calls after shutdown began before giving up on them.
    pub drain_timeout: Duration,
    /// Connections served at once, over every listener. One more is closed as soon as it
    /// is accepted: its client sees `UNAVAILABLE` and can retry later. At least 1.
    pub max_connections: usize,
    /// HTTP/2 keep-alive: a PING after this long without a frame from the client, and the
    /// connection closed if the PING is not answered within [`Self::keepalive_timeout`]. A
    /// client gone without closing its connection (a phone off the network) then stops
    /// holding its calls and subscriptions. `None`: never.
    pub keepalive_interval: Option<Duration>,
    /// See [`Self::keepalive_interval`].
    pub keepalive_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            tls: None,
            health_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(5),
            max_connections: 1024,
            keepalive_interval: Some(Duration::from_secs(60)),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
}

impl Listener {
    /// `tcp://addr` or `unix://path`.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp://{a}"),
                Err(_) => "tcp://?".to_owned(),
            },
            Listener::Unix { path, .. } => format!("unix://{}", path.display()),
        }
    }

    /// The TCP address, for TCP listeners.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix { .. } => None,
        }
    }
}

/// The gRPC server.
#[derive(Debug)]
pub struct Server;

impl Server {
    /// Serves every listener until `shutdown` is cancelled, then drains.
    pub async fn run(
        opts: ServerOptions,
        engine: Engine,
        info: DaemonInfo,
        listeners: Vec<Listener>,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let (reporter, health_svc) = tonic_health::server::health_reporter();
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ostler_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ostler_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;

        let session = SessionSvc::new(engine.clone(), shutdown.clone());
        let daemon = DaemonSvc::new(engine.clone(), info, shutdown.clone());
        let routes = Routes::new(health_svc)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(SessionServiceServer::new(session))
            .add_service(DaemonServiceServer::new(daemon))
            .prepare();

        // The first health check happens before any listener accepts, so a client that
        // connects once the daemon is ready never sees an unset status.
        let first = daemon::update_health(&engine, &reporter, None).await;
        let health_task = {
            let engine = engine.clone();
            let shutdown = shutdown.clone();
            let interval = opts.health_interval;
            tokio::spawn(daemon::watch_health(
                engine, reporter, interval, shutdown, first,
            ))
        };

        let tls = opts.tls.as_ref().map(listen::tls_acceptor).transpose()?;
        let svc: listen::Svc = tower::util::BoxCloneService::new(
            tower::ServiceBuilder::new()
                .layer(AuthLayer::new(opts.tokens.clone()))
                .layer(error::BadRequestLayer)
                .service(routes),
        );

        let conns = listen::Conns::new(&opts);
        let mut tasks = tokio::task::JoinSet::new();
        for l in listeners {
            let name = l.describe();
            // TLS is for TCP listeners; Unix sockets are always plain.
            let tls = match &l {
                Listener::Tcp(_) => tls.clone(),
                Listener::Unix { .. } => None,
            };
            let fut = listen::serve(l, tls, svc.clone(), conns.clone(), shutdown.clone());
            tasks.spawn(finish(name, fut));
        }

        let mut first_err = None;
        // Serve until shutdown (or until a listener fails).
        tokio::select! {
            () = shutdown.cancelled() => {}
            Some(res) = tasks.join_next() => {
                if let Ok(Err(e)) = res {
                    tracing::error!(error = %e, "listener failed; shutting down");
                    first_err = Some(e);
                }
                shutdown.cancel();
            }
        }
        tracing::info!("gRPC server: shutting down, no longer accepting");
        let drain = async {
            while let Some(res) = tasks.join_next().await {
                if let Ok(Err(e)) = res {
                    tracing::warn!(error = %e, "listener ended with an error during shutdown");
                    first_err.get_or_insert(e);
                }
            }
        };
        if tokio::time::timeout(opts.drain_timeout, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?opts.drain_timeout,
                "open calls did not finish in time; closing them"
            );
            tasks.abort_all();
        }
        let _ = health_task.await;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

async fn finish(listener: String, fut: impl Future<Output = Result<()>>) -> Result<()> {
    tracing::info!(%listener, "gRPC server listening");
    fut.await
}
