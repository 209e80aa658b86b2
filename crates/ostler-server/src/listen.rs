//! Accepting and serving connections: TCP (optionally TLS) and Unix sockets, each
//! connection an HTTP/2 connection of hyper's, until shutdown.
//!
//! We serve with hyper directly rather than through `tonic::transport::Server` for one
//! reason: the executor. hyper runs every call on a task of its own (`H2Stream`), and for
//! each DATA frame of a streaming response that task wakes itself from inside its own poll
//! (it registers for `RST_STREAM`, then reserves send capacity, and h2 assigning that
//! capacity wakes the registered waker). tokio answers a task that woke itself during its
//! poll by putting it back in the run queue *and waking a parked worker*: on an idle
//! 2-core machine that was ~0.5 futex wake-ups, and a spurious poll on the other core, per
//! event a subscriber received. [`Executor`] spawns hyper's tasks inside [`Absorb`], which
//! polls the task again at once when it woke only itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures::task::AtomicWaker;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use ostler_metrics::ConnectionClosed;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::auth::AuthLayer;
use crate::idle::Calls;
use crate::{Error, Listener, Result, TlsOptions};

/// The service every connection is served by, behind its connection's token check (the
/// routes behind the bad-request layer).
pub(crate) type Svc = tower::util::BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    std::convert::Infallible,
>;

/// The TLS acceptor for TCP listeners, from PEM material.
pub(crate) fn tls_acceptor(t: &TlsOptions) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, e: &dyn std::fmt::Display| Error::Tls(format!("{what}: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_slice_iter(&t.cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("the server certificate is not valid PEM", &e))?;
    if certs.is_empty() {
        return Err(Error::Tls(
            "the server certificate file holds no certificate".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&t.key_pem)
        .map_err(|e| bad("the server key is not a valid PEM private key", &e))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS protocol versions", &e))?;
    let builder = match &t.client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                let c = c.map_err(|e| bad("the client CA is not valid PEM", &e))?;
                roots
                    .add(c)
                    .map_err(|e| bad("the client CA certificate", &e))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| bad("the client CA", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| bad("the server certificate and key", &e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// What every connection shares: the connection slots (over all listeners), the
/// refusals' slots and service, the token check, and the HTTP/2 settings.
#[derive(Clone)]
pub(crate) struct Conns {
    slots: Arc<tokio::sync::Semaphore>,
    max: usize,
    refusing: Arc<tokio::sync::Semaphore>,
    refuse: Svc,
    auth: AuthLayer,
    keepalive: Option<(Duration, Duration)>,
    /// [`crate::ServerOptions::handshake_timeout`].
    handshake: Duration,
    /// [`crate::ServerOptions::idle_timeout`].
    idle: Duration,
}

impl Conns {
    pub(crate) fn new(opts: &crate::ServerOptions) -> Self {
        let max = opts.max_connections.max(1);
        let message = format!(
            "the daemon serves {max} connections at once (listen.max_connections) and all \
             are in use; retry later"
        );
        let refuse = tower::service_fn(move |_req: http::Request<tonic::body::Body>| {
            let status = tonic::Status::unavailable(message.clone());
            std::future::ready(Ok::<_, std::convert::Infallible>(status.into_http()))
        });
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
            refusing: Arc::new(tokio::sync::Semaphore::new(REFUSING_MAX)),
            refuse: tower::util::BoxCloneService::new(refuse),
            auth: AuthLayer::new(opts.tokens.clone()),
            keepalive: opts
                .keepalive_interval
                .map(|every| (every, opts.keepalive_timeout)),
            handshake: opts.handshake_timeout,
            idle: opts.idle_timeout,
        }
    }
}

/// Connections over the cap answered (every call UNAVAILABLE) at once; more are closed
/// unanswered.
const REFUSING_MAX: usize = 64;

/// How long a refused connection is kept to answer its calls.
const REFUSING_FOR: Duration = Duration::from_secs(5);

/// How often a listener says that it refuses connections over the cap (at most).
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Accepts on `listener` until `shutdown`, serving each connection on a task of its own;
/// then stops accepting (the listening socket closes), asks every connection to finish
/// gracefully (HTTP/2 GOAWAY: calls in progress go on) and waits for them. Dropping the
/// returned future closes every connection at once.
pub(crate) async fn serve(
    listener: Listener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    svc: Svc,
    shared: Conns,
    shutdown: CancellationToken,
) -> Result<()> {
    let name = listener.describe();
    let mut conns = JoinSet::new();
    let mut refused = 0u64;
    let mut refused_logged: Option<tokio::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow with the daemon's age.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = accept(&listener) => a,
        };
        let accepted = match accepted {
            Ok(a) => a,
            Err(source) if broken(&source) => {
                return Err(Error::Io {
                    listener: name,
                    source,
                });
            }
            Err(e) => {
                // Out of descriptors, or a network error of a connection not yet
                // accepted (accept(2) passes those on): the listener itself is fine. Back
                // off a little so a full descriptor table is not a busy loop.
                tracing::warn!(listener = %name, error = %e, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over the cap: the connection is served only to answer every call UNAVAILABLE
        // (a message that names the cap), for a few seconds, so the client fails fast and
        // retries rather than waiting in the backlog. Past that many refusals at once, it
        // is closed unanswered.
        let (slot, served) = match shared.slots.clone().try_acquire_owned() {
            Ok(slot) => (slot, Served::Counted(svc.clone(), shared.auth.clone())),
            Err(_) => {
                ostler_metrics::connection_closed(ConnectionClosed::OverCapacity);
                refused += 1;
                if refused_logged.is_none_or(|t| t.elapsed() >= REFUSED_LOG_EVERY) {
                    tracing::warn!(
                        listener = %name,
                        max_connections = shared.max,
                        refused,
                        "too many connections; refusing new ones (listen.max_connections)"
                    );
                    refused_logged = Some(tokio::time::Instant::now());
                }
                match shared.refusing.clone().try_acquire_owned() {
                    Ok(slot) => (slot, Served::Refused(shared.refuse.clone())),
                    Err(_) => continue,
                }
            }
        };
        let conn_shutdown = shutdown.clone();
        let times = Times::of(&shared);
        // From here the client has `handshake` for its TLS handshake, and again for the
        // HTTP/2 preface.
        let handshake = shared.handshake;
        let lifetime = matches!(served, Served::Refused(_)).then_some(REFUSING_FOR);
        let served: Pin<Box<dyn Future<Output = ()> + Send>> = match accepted {
            Accepted::Tcp(s) => {
                // Without TCP_NODELAY, Nagle + delayed ACK add ~40 ms to responses of
                // several segments.
                if let Err(e) = s.set_nodelay(true) {
                    tracing::debug!(listener = %name, error = %e, "cannot set TCP_NODELAY");
                }
                match &tls {
                    None => Box::pin(served.on(Preface::new(s, handshake), times, conn_shutdown)),
                    Some(acceptor) => Box::pin(tls_connection(
                        acceptor.clone(),
                        s,
                        (served, times),
                        conn_shutdown,
                        name.clone(),
                    )),
                }
            }
            Accepted::Unix(s) => {
                Box::pin(served.on(Preface::new(s, handshake), times, conn_shutdown))
            }
        };
        conns.spawn(async move {
            let _slot = slot;
            match lifetime {
                None => served.await,
                Some(d) => {
                    let _ = tokio::time::timeout(d, served).await;
                }
            }
        });
    }
    // Stop accepting now: new clients are refused rather than left waiting.
    drop(listener);
    while conns.join_next().await.is_some() {}
    Ok(())
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(l: &Listener) -> std::io::Result<Accepted> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Accepted::Tcp(s)),
        Listener::Unix { listener, .. } => listener.accept().await.map(|(s, _)| Accepted::Unix(s)),
    }
}

/// Errors of `accept` that mean the listening socket itself is unusable.
fn broken(e: &std::io::Error) -> bool {
    // EBADF, EFAULT, EINVAL (not listening), ENOTSOCK (Linux numbers).
    matches!(e.raw_os_error(), Some(9 | 14 | 22 | 88))
}

/// Completes the TLS handshake (within `times.handshake`, given up at `shutdown`), then
/// serves the connection (whose preface is due within `times.handshake` again).
async fn tls_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    s: tokio::net::TcpStream,
    (served, times): (Served, Times),
    shutdown: CancellationToken,
    listener: String,
) {
    let handshake = tokio::time::timeout(times.handshake, acceptor.accept(s));
    let s = tokio::select! {
        () = shutdown.cancelled() => return,
        r = handshake => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%listener, error = %e, "TLS handshake failed");
                ostler_metrics::connection_closed(ConnectionClosed::TlsHandshake);
                return;
            }
            Err(_) => {
                tracing::debug!(%listener, "TLS handshake timed out");
                ostler_metrics::connection_closed(ConnectionClosed::TlsHandshake);
                return;
            }
        },
    };
    served
        .on(Preface::new(s, times.handshake), times, shutdown)
        .await;
}

/// How an accepted connection is served.
enum Served {
    /// Within the cap: the routes behind the connection's token check, which records its
    /// authenticated calls for the idle rule.
    Counted(Svc, AuthLayer),
    /// Over the cap: every call answered `UNAVAILABLE`, for [`REFUSING_FOR`].
    Refused(Svc),
}

/// The times a connection is served by, from [`Conns`].
#[derive(Clone, Copy)]
struct Times {
    keepalive: Option<(Duration, Duration)>,
    handshake: Duration,
    idle: Duration,
}

impl Times {
    fn of(c: &Conns) -> Self {
        Self {
            keepalive: c.keepalive,
            handshake: c.handshake,
            idle: c.idle,
        }
    }
}

impl Served {
    async fn on<IO>(self, io: IO, times: Times, shutdown: CancellationToken)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match self {
            Served::Counted(svc, auth) => {
                // The idle rule's times run from here (past the TLS handshake).
                let calls = Calls::new();
                let svc = auth.connection(svc, Arc::clone(&calls));
                let idle = Idle {
                    calls,
                    first: times.handshake,
                    idle: times.idle,
                    grace: times.handshake,
                };
                connection(io, svc, times.keepalive, Some(idle), shutdown).await;
            }
            Served::Refused(svc) => connection(io, svc, times.keepalive, None, shutdown).await,
        }
    }
}

/// A connection's idle rule (see [`crate::idle`]).
struct Idle {
    calls: Arc<Calls>,
    /// How long a connection may go without its first authenticated call:
    /// [`crate::ServerOptions::handshake_timeout`] (at most `idle`).
    first: Duration,
    /// [`crate::ServerOptions::idle_timeout`].
    idle: Duration,
    /// How long a connection asked to go away may take to finish while no authenticated
    /// call is in flight: [`crate::ServerOptions::handshake_timeout`].
    grace: Duration,
}

/// The length of the HTTP/2 client preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_LEN: usize = 24;

/// A connection whose reads fail (`TimedOut`, which ends it) when the client has not sent
/// the HTTP/2 preface's [`PREFACE_LEN`] bytes by a deadline; past them, the connection as
/// it is. hyper's keep-alive starts only after the preface, so without this a connection
/// opened and left silent would hold its slot forever.
struct Preface<IO> {
    io: IO,
    read: usize,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> Preface<IO> {
    fn new(io: IO, within: Duration) -> Self {
        Self {
            io,
            read: 0,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Preface<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(d) = &mut this.deadline
            && d.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no HTTP/2 preface in time",
            )));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.read += buf.filled().len() - before;
            if this.read >= PREFACE_LEN {
                this.deadline = None;
            }
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Preface<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Serves one connection until it ends; on `shutdown`, asks it to finish gracefully, and
/// so too once its `idle` rule says it has been idle too long (then closing it if it has
/// not finished within the rule's grace while no authenticated call is in flight).
/// `keepalive`: the PING interval and how long an answer may take.
async fn connection<IO, S, B>(
    io: IO,
    svc: S,
    keepalive: Option<(Duration, Duration)>,
    idle: Option<Idle>,
    shutdown: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let svc = TowerToHyperService::new(
        svc.map_request(|req: http::Request<hyper::body::Incoming>| {
            req.map(tonic::body::Body::new)
        }),
    );
    let mut builder = hyper::server::conn::http2::Builder::new(Executor);
    // As tonic's server did: no cap on concurrent calls per connection (hyper's default is
    // 200; one client may follow many sessions over one connection).
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(None);
    if let Some((every, timeout)) = keepalive {
        builder
            .keep_alive_interval(Some(every))
            .keep_alive_timeout(timeout);
    }
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let idle_for = async {
        match &idle {
            Some(i) => i.calls.idle(i.first, i.idle).await,
            None => std::future::pending().await,
        }
    };
    let r = tokio::select! {
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = idle_for => {
            // GOAWAY: calls in flight go on, a client opens a new connection for its next
            // call. A peer that keeps the connection past the grace with calls that do not
            // count (a health `Watch` without a token; not answering the GOAWAY's PING) is
            // closed.
            tracing::debug!("connection idle (listen.idle_timeout_secs); asking it to go away");
            if let Some(i) = &idle {
                ostler_metrics::connection_closed(if i.calls.ever_counted() {
                    ConnectionClosed::Idle
                } else {
                    ConnectionClosed::NeverAuthenticated
                });
            }
            conn.as_mut().graceful_shutdown();
            let quiet = async {
                match &idle {
                    Some(i) => i.calls.quiet_after(i.grace).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = conn.as_mut() => r,
                () = quiet => {
                    tracing::debug!("idle connection did not finish in time; closing it");
                    Ok(())
                }
            }
        }
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// hyper's executor: spawns each task inside [`Absorb`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Executor;

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Absorb::new(fut));
    }
}

/// How often [`Absorb`] polls again within one poll before it yields like any task.
const MAX_REPOLLS: usize = 8;

/// A future whose wake-ups of itself during its own poll make it poll again at once
/// (up to [`MAX_REPOLLS`] times), instead of going through the scheduler. A future out of
/// tokio's cooperative budget is not polled again: tokio defers the wake of a task out of
/// budget until its poll has returned, so that wake reaches the task.
///
/// The inner future gets a waker of ours. A wake while we poll only sets `woken`; any
/// other wake is passed to the task's waker. No wake is lost: every access is `SeqCst`,
/// so a wake either sets `woken` before we read it after the poll (and we poll again), or
/// it reads `polling` after we cleared it (and wakes the task).
pub(crate) struct Absorb<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    waker: Waker,
}

struct Flag {
    polling: AtomicBool,
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            self.task.wake();
        }
    }
}

impl<F> Absorb<F> {
    pub(crate) fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(flag.clone()),
            flag,
        }
    }
}

impl<F: Future> Future for Absorb<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.flag.task.register(cx.waker());
        for _ in 0..MAX_REPOLLS {
            this.flag.woken.store(false, SeqCst);
            this.flag.polling.store(true, SeqCst);
            let r = this
                .inner
                .as_mut()
                .poll(&mut Context::from_waker(&this.waker));
            this.flag.polling.store(false, SeqCst);
            if r.is_ready() {
                return r;
            }
            if !this.flag.woken.swap(false, SeqCst) {
                return Poll::Pending;
            }
        }
        // Still waking itself: let other tasks run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts how often it is polled; wakes itself during its first `selfish` polls, and
    /// is ready once `ready` is set.
    struct Probe {
        polls: Arc<AtomicUsize>,
        selfish: usize,
        ready: Arc<AtomicBool>,
        waker: Slot,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let n = self.polls.fetch_add(1, SeqCst);
            if self.ready.load(SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if n < self.selfish {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
    }

    struct Counter(AtomicUsize);
    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    /// Where a probe keeps the waker of its last poll.
    type Slot = Arc<std::sync::Mutex<Option<Waker>>>;

    fn probe(selfish: usize) -> (Probe, Arc<AtomicUsize>, Arc<AtomicBool>, Slot) {
        let polls = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let waker = Arc::new(std::sync::Mutex::new(None));
        (
            Probe {
                polls: polls.clone(),
                selfish,
                ready: ready.clone(),
                waker: waker.clone(),
            },
            polls,
            ready,
            waker,
        )
    }

    #[test]
    fn only_a_broken_listening_socket_ends_the_accept_loop() {
        let err = |n| std::io::Error::from_raw_os_error(n);
        // EMFILE, ENFILE, ECONNABORTED, EPROTO, EPERM (a firewall), ENOBUFS: retried.
        for n in [24, 23, 103, 71, 1, 105] {
            assert!(!broken(&err(n)), "errno {n} is retried");
        }
        // EBADF, EINVAL: the listener is gone.
        for n in [9, 22] {
            assert!(broken(&err(n)), "errno {n} ends the listener");
        }
    }

    #[test]
    fn a_wake_of_itself_polls_again_without_waking_the_task() {
        let (p, polls, _, _) = probe(2);
        let task = Arc::new(Counter(AtomicUsize::new(0)));
        let tw = Waker::from(task.clone());
        let mut f = Box::pin(Absorb::new(p));
        assert!(f.as_mut().poll(&mut Context::from_waker(&tw)).is_pending());
        assert_eq!(polls.load(SeqCst), 3, "two self-wakes, three polls");
        assert_eq!(task.0.load(SeqCst), 0, "the task itself was not woken");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_after_a_bound() {
        let (p, polls, _, _) = probe(usize::MAX);
        let task = Arc::new(Counter(AtomicUsize::new(0)));
        let tw = Waker::from(task.clone());
        let mut f = Box::pin(Absorb::new(p));
        assert!(f.as_mut().poll(&mut Context::from_waker(&tw)).is_pending());
        assert_eq!(polls.load(SeqCst), MAX_REPOLLS);
        assert_eq!(task.0.load(SeqCst), 1, "woken once, to run again later");
    }

    #[tokio::test]
    async fn a_future_out_of_budget_is_not_polled_again_at_once() {
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        // Spends tokio's budget until it runs out; then it is pending, and tokio wakes the
        // task once its poll has returned.
        let mut spender = Box::pin(async {
            loop {
                tokio::task::coop::consume_budget().await;
            }
        });
        let inner = std::future::poll_fn(move |cx| {
            counted.fetch_add(1, SeqCst);
            spender.as_mut().poll(cx)
        });
        let mut f = Box::pin(Absorb::new(inner));
        std::future::poll_fn(|cx| {
            assert!(f.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        assert_eq!(polls.load(SeqCst), 1, "no re-poll without budget");
    }

    #[test]
    fn a_wake_from_outside_the_poll_wakes_the_task_and_the_future_completes() {
        let (p, polls, ready, inner_waker) = probe(0);
        let task = Arc::new(Counter(AtomicUsize::new(0)));
        let tw = Waker::from(task.clone());
        let mut f = Box::pin(Absorb::new(p));
        assert!(f.as_mut().poll(&mut Context::from_waker(&tw)).is_pending());
        assert_eq!(task.0.load(SeqCst), 0);
        ready.store(true, SeqCst);
        let w = inner_waker.lock().unwrap().clone().unwrap();
        std::thread::spawn(move || w.wake()).join().unwrap();
        assert_eq!(
            task.0.load(SeqCst),
            1,
            "a wake from elsewhere reaches the task"
        );
        assert!(f.as_mut().poll(&mut Context::from_waker(&tw)).is_ready());
        assert_eq!(polls.load(SeqCst), 2);
    }

    /// Wakes racing with polls from another thread are never lost: each round, a thread
    /// makes the future ready and wakes it while the task may be polling; the task must
    /// be woken (or the poll see it ready) every time.
    #[test]
    fn wakes_racing_with_polls_are_not_lost() {
        for _ in 0..2_000 {
            let (p, _, ready, inner_waker) = probe(0);
            let task = Arc::new(Counter(AtomicUsize::new(0)));
            let tw = Waker::from(task.clone());
            let mut f = Box::pin(Absorb::new(p));
            assert!(f.as_mut().poll(&mut Context::from_waker(&tw)).is_pending());
            let w = inner_waker.lock().unwrap().clone().unwrap();
            let ready2 = ready.clone();
            let t = std::thread::spawn(move || {
                ready2.store(true, SeqCst);
                w.wake();
            });
            let done = f.as_mut().poll(&mut Context::from_waker(&tw)).is_ready();
            t.join().unwrap();
            if !done {
                assert!(task.0.load(SeqCst) >= 1, "the wake was lost");
                assert!(f.as_mut().poll(&mut Context::from_waker(&tw)).is_ready());
            }
        }
    }
}
