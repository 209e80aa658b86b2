//! ostler-server: the gRPC surface of the ostler daemon.
//!
//! - [`SessionSvc`] / [`DaemonSvc`]: `ostler.v1.SessionService` and `DaemonService` on top
//!   of an [`ostler_engine::Engine`]; request validation and the one engine-error ->
//!   `Status` mapping ([`error`]) live here.
//! - `grpc.health.v1.Health` (tonic-health), kept in line with the engine's store status,
//!   and server reflection (tonic-reflection, v1 and v1alpha).
//! - [`auth::AuthLayer`]: bearer tokens checked for every call of a connection (health
//!   exempt); the calls that pass are what keeps a connection from being idle (`idle`).
//! - [`error::BadRequestLayer`]: an undecodable request is INVALID_ARGUMENT, not INTERNAL.
//! - [`Server::run`]: serves on already-bound listeners (TCP, optionally TLS; Unix socket)
//!   until a [`CancellationToken`] fires; then health turns NOT_SERVING, every subscriber
//!   stream ends with `UNAVAILABLE`, and accepting stops. [`Server::run_starting`] serves
//!   them before the engine exists (health NOT_SERVING, other calls `UNAVAILABLE`) until
//!   [`Starting::ready`].

pub mod auth;
mod controls;
mod convert;
mod daemon;
mod dialogs;
mod elicitations;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod health;
mod hooks;
mod idle;
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
    #[error("server option {option}: {reason}")]
    Option {
        option: &'static str,
        reason: &'static str,
    },
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

impl TlsOptions {
    /// Whether the material makes a working TLS configuration (the certificate and key
    /// parse and match, the client CA parses), as the listeners will build it.
    pub fn check(&self) -> Result<()> {
        listen::tls_acceptor(self).map(|_| ())
    }
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
    /// How long a new connection may take to complete its TLS handshake (TLS listeners)
    /// and then to send the HTTP/2 preface; closed otherwise, so that connections opened
    /// and left silent cannot hold the [`Self::max_connections`] slots (keep-alive only
    /// begins after the preface).
    pub handshake_timeout: Duration,
    /// A connection with no authenticated call in flight for this long (since its last
    /// one ended) is asked to go away: HTTP/2 GOAWAY, calls in flight go on, and a client
    /// opens a new connection for its next call. Authenticated: with a valid token, or any
    /// call when [`Self::tokens`] is empty; calls refused `UNAUTHENTICATED` and health calls
    /// without a token do not count. A connection that has not made its first
    /// authenticated call within [`Self::handshake_timeout`] (from the end of its TLS
    /// handshake; at most this long) is asked likewise, so connections without a token
    /// cannot hold the [`Self::max_connections`] slots. A connection asked to go away that
    /// has not closed within [`Self::handshake_timeout`] while no authenticated call is in
    /// flight is closed. Not zero.
    pub idle_timeout: Duration,
}

impl ServerOptions {
    /// Refuses options the server cannot work with.
    fn check(&self) -> Result<()> {
        if self.idle_timeout.is_zero() {
            return Err(Error::Option {
                option: "idle_timeout",
                reason: "zero would close every connection at once",
            });
        }
        if self.handshake_timeout.is_zero() {
            return Err(Error::Option {
                option: "handshake_timeout",
                reason: "zero would close every connection at once",
            });
        }
        Ok(())
    }
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
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
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

/// What the full service needs: given to [`Server::run_starting`] once the daemon has
/// opened its store and started its engine.
#[derive(Debug)]
pub struct Ready {
    pub engine: Engine,
    pub info: DaemonInfo,
}

type Ack = tokio::sync::oneshot::Sender<()>;

/// Whether the engine is there when the server starts.
enum EngineAtStart {
    Now(Ready),
    Later(tokio::sync::oneshot::Receiver<(Ready, Ack)>),
}

/// The handle of a server started by [`Server::run_starting`].
#[derive(Debug)]
pub struct Starting {
    tx: tokio::sync::oneshot::Sender<(Ready, Ack)>,
}

impl Starting {
    /// Switches the server to the full service. Returns once every listener serves it and
    /// health reports the engine's status (SERVING with a usable store), so that whoever
    /// is told next that the daemon is ready finds it so; at once if the server has ended.
    pub async fn ready(self, ready: Ready) {
        let (ack, done) = tokio::sync::oneshot::channel();
        if self.tx.send((ready, ack)).is_ok() {
            let _ = done.await;
        }
    }
}

/// What a call other than health and reflection is answered while the daemon starts.
const STARTING_MESSAGE: &str = "the ostler daemon is starting (opening its store, which applies any \
     schema migration first; that can take minutes on a large store); retry shortly";

/// Paths served while the daemon starts: the standard health service and reflection.
fn served_while_starting(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
}

impl Server {
    /// Serves every listener until `shutdown` is cancelled, then drains.
    pub async fn run(
        opts: ServerOptions,
        engine: Engine,
        info: DaemonInfo,
        listeners: Vec<Listener>,
        shutdown: CancellationToken,
    ) -> Result<()> {
        Self::serve(
            opts,
            listeners,
            EngineAtStart::Now(Ready { engine, info }),
            shutdown,
        )
        .await
    }

    /// Serves every listener at once, while the daemon is still starting: until
    /// [`Starting::ready`] gives the engine, `grpc.health.v1.Health` says NOT_SERVING,
    /// reflection answers, and every other call gets `UNAVAILABLE` (retry later), so a
    /// probe or a client can tell a daemon that is migrating its store from one that is
    /// down. Then as [`Self::run`]. If the [`Starting`] handle is dropped (the start
    /// failed), the listeners close and the future ends.
    pub fn run_starting(
        opts: ServerOptions,
        listeners: Vec<Listener>,
        shutdown: CancellationToken,
    ) -> (Starting, impl Future<Output = Result<()>> + Send + 'static) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (
            Starting { tx },
            Self::serve(opts, listeners, EngineAtStart::Later(rx), shutdown),
        )
    }

    /// With the engine there already, nothing is accepted before the full service and its
    /// first health status are in place.
    async fn serve(
        opts: ServerOptions,
        listeners: Vec<Listener>,
        engine: EngineAtStart,
        shutdown: CancellationToken,
    ) -> Result<()> {
        use tower::ServiceExt as _;
        opts.check()?;
        let (reporter, health_svc) = tonic_health::server::health_reporter();
        // Health streams end once shutdown has set NOT_SERVING (see below).
        let health_ended = CancellationToken::new();
        let health_svc = health::Ending::new(health_svc, health_ended.clone());
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ostler_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ostler_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        let starting = Routes::new(health_svc.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
            .prepare();

        // The full routes, once the engine is there; until then the starting ones.
        let full = std::sync::Arc::new(std::sync::OnceLock::<Routes>::new());
        let routes = {
            let full = std::sync::Arc::clone(&full);
            tower::service_fn(move |req: http::Request<tonic::body::Body>| {
                let (full, starting) = (full.get().cloned(), starting.clone());
                async move {
                    match full {
                        Some(routes) => routes.oneshot(req).await,
                        None if served_while_starting(req.uri().path()) => {
                            starting.oneshot(req).await
                        }
                        None => Ok(tonic::Status::unavailable(STARTING_MESSAGE).into_http()),
                    }
                }
            })
        };
        let become_ready = |ready: Ready| {
            let session = SessionSvc::new(ready.engine.clone(), shutdown.clone());
            let daemon = DaemonSvc::new(ready.engine.clone(), ready.info, shutdown.clone());
            let routes = Routes::new(health_svc.clone())
                .add_service(reflection_v1.clone())
                .add_service(reflection_v1alpha.clone())
                .add_service(SessionServiceServer::new(session))
                .add_service(DaemonServiceServer::new(daemon))
                .prepare();
            // Set once, here: the routes first, then the health status that announces them.
            let _ = full.set(routes);
            ready.engine
        };
        let tls = opts.tls.as_ref().map(listen::tls_acceptor).transpose()?;
        // The token check is added per connection (`listen`): it records the connection's
        // authenticated calls.
        let svc: listen::Svc = tower::util::BoxCloneService::new(
            tower::ServiceBuilder::new()
                .layer(error::BadRequestLayer)
                .service(routes),
        );

        let (ready, mut health_task) = match engine {
            // The first health check happens before any listener accepts, so a client that
            // connects once the daemon is ready never sees an unset status.
            EngineAtStart::Now(now) => {
                let engine = become_ready(now);
                (
                    None,
                    Some(
                        start_health(
                            engine,
                            reporter.clone(),
                            opts.health_interval,
                            shutdown.clone(),
                        )
                        .await,
                    ),
                )
            }
            EngineAtStart::Later(later) => {
                daemon::report(&reporter, tonic_health::ServingStatus::NotServing).await;
                (Some(later), None)
            }
        };

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
        let mut listener_ended = |res: std::result::Result<Result<()>, _>| {
            if let Ok(Err(e)) = res {
                tracing::error!(error = %e, "listener failed; shutting down");
                first_err = Some(e);
            }
        };
        if let Some(ready) = ready {
            tokio::select! {
                () = shutdown.cancelled() => {}
                Some(res) = tasks.join_next() => {
                    listener_ended(res);
                    shutdown.cancel();
                }
                r = ready => match r {
                    Ok((r, ack)) => {
                        let engine = become_ready(r);
                        let (every, stop) = (opts.health_interval, shutdown.clone());
                        let watcher = start_health(engine, reporter.clone(), every, stop).await;
                        health_task = Some(watcher);
                        let _ = ack.send(());
                    }
                    // The start failed: nothing more to serve.
                    Err(_) => shutdown.cancel(),
                },
            }
        }
        // Serve until shutdown (or until a listener fails).
        if !shutdown.is_cancelled() {
            tokio::select! {
                () = shutdown.cancelled() => {}
                Some(res) = tasks.join_next() => {
                    listener_ended(res);
                    shutdown.cancel();
                }
            }
        }
        tracing::info!("gRPC server: shutting down, no longer accepting");
        // NOT_SERVING for every name (the watcher does so too, racing with this), then the
        // health streams end: a watcher has seen the status and does not hold the drain.
        daemon::report(&reporter, tonic_health::ServingStatus::NotServing).await;
        health_ended.cancel();
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
        if let Some(t) = health_task {
            let _ = t.await;
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The first health check from the engine's state, then the task that keeps it current.
async fn start_health(
    engine: Engine,
    reporter: tonic_health::server::HealthReporter,
    interval: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let first = daemon::update_health(&engine, &reporter, None).await;
    tokio::spawn(daemon::watch_health(
        engine, reporter, interval, shutdown, first,
    ))
}

async fn finish(listener: String, fut: impl Future<Output = Result<()>>) -> Result<()> {
    tracing::info!(%listener, "gRPC server listening");
    fut.await
}
