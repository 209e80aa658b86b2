//! ostler-metrics: the daemon's Prometheus metrics (OpenMetrics text, through
//! `prometheus-client`).
//!
//! - **Counters and histograms** are process-wide, like the process's log: the crate where a
//!   thing happens calls one function here, once per site ([`events_appended`],
//!   [`store_commit`], [`control_request`], [`cli_exited`], [`interaction_decided`],
//!   [`partial_deltas_missed`], [`connection_closed`]). They cost an atomic add (a histogram: a few) and never
//!   block.
//! - **Gauges** that are state owned elsewhere (sessions per state, live processes, pending
//!   interactions, subscribers) are never copied here: whoever serves `/metrics` reads them
//!   at scrape time and passes them to [`render`] as a [`Gauges`] snapshot, which is
//!   encoded by a collector.
//!
//! No I/O here; the daemon's HTTP endpoint is `crates/ostler/src/metrics.rs`. The metric
//! list is in docs/operations.md ("Metrics").

use std::future::Future;
use std::sync::LazyLock;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of [`to_prometheus_text`]'s text (Prometheus' classic format, for
/// a scraper that does not ask for OpenMetrics).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// [`render`]'s OpenMetrics text in Prometheus' classic text format (0.0.4): a counter's
/// `# HELP` / `# TYPE` name its sample (`ostler_x_total`), `unknown` is `untyped`, no
/// `# UNIT` and no `# EOF`. Samples are the same lines.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) {
                Some(format!("{p}{name}_total {tail}"))
            } else if *p == "# TYPE " && tail == "unknown" {
                Some(format!("{p}{name} untyped"))
            } else {
                None
            }
        });
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Every metric name starts with this (`ostler_events_appended_total`, ...).
pub const PREFIX: &str = "ostler";

type Labels<const N: usize> = [(&'static str, &'static str); N];

/// Store group commits: 100 us .. 10 s.
const COMMIT_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Control requests: 1 ms .. 60 s (the default timeout is 30 s).
const CONTROL_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

struct Metrics {
    registry: Registry,
    events_appended: Counter,
    partial_deltas_missed: Counter,
    store_commit: Histogram,
    control_latency: Histogram,
    control_timeouts: Counter,
    cli_exits: Family<Labels<1>, Counter>,
    decisions: Family<Labels<3>, Counter>,
    notifications: Family<Labels<1>, Counter>,
    connections_closed: Family<Labels<1>, Counter>,
    feed_pruned: Counter,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix(PREFIX);
    let events_appended = Counter::default();
    registry.register(
        "events_appended",
        "Session events committed to the store (live-only partial deltas are not stored)",
        events_appended.clone(),
    );
    let partial_deltas_missed = Counter::default();
    registry.register(
        "partial_deltas_missed",
        "Partial deltas that a subscriber with include_partial fell too far behind to receive, \
         summed over subscribers (each was told its count in a PartialsMissed event)",
        partial_deltas_missed.clone(),
    );
    let store_commit = Histogram::new(COMMIT_BUCKETS);
    registry.register_with_unit(
        "store_commit",
        "Time the store's writer spent on one group commit (BEGIN to COMMIT, results handed \
         out, and a WAL checkpoint when the writer runs one itself)",
        Unit::Seconds,
        store_commit.clone(),
    );
    let control_latency = Histogram::new(CONTROL_BUCKETS);
    registry.register_with_unit(
        "control_request",
        "Time from sending a control request to the CLI until it answered (or its process \
         went away); timeouts are counted in ostler_control_request_timeouts_total",
        Unit::Seconds,
        control_latency.clone(),
    );
    let control_timeouts = Counter::default();
    registry.register(
        "control_request_timeouts",
        "Control requests the CLI did not answer within the control timeout",
        control_timeouts.clone(),
    );
    let cli_exits = Family::default();
    registry.register(
        "cli_exits",
        "CLI session processes that ended, by cause: requested (ostler stopped it), success \
         (exit 0 on its own), error (non-zero exit code), signal (killed by a signal ostler \
         did not send), unknown",
        cli_exits.clone(),
    );
    let decisions = Family::default();
    registry.register(
        "interaction_decisions",
        "Permission requests and questions resolved, by kind (permission, question), source \
         (client, rule, expiry, cli, engine) and outcome (allowed, denied, answered, expired, \
         cancelled)",
        decisions.clone(),
    );
    let notifications = Family::default();
    registry.register(
        "notifications",
        "Webhook ([[notify]]) attempts and items over every notifier, by outcome: delivered \
         (acknowledged with 2xx), retried (an attempt failed, another follows), given_up \
         (every attempt failed), queue_full (a slow receiver paused the notifier's feed)",
        notifications.clone(),
    );
    let connections_closed = Family::default();
    registry.register(
        "connections_closed",
        "Client connections the daemon ended or refused itself, by reason: idle (no \
         authenticated call for listen.idle_timeout_secs; asked to go away), \
         never_authenticated (no authenticated call within listen.handshake_timeout_secs), \
         over_capacity (listen.max_connections in use; its calls answered UNAVAILABLE), \
         tls_handshake (failed or not done within listen.handshake_timeout_secs)",
        connections_closed.clone(),
    );
    let feed_pruned = Counter::default();
    registry.register(
        "feed_pruned",
        "Session-deleted items removed from the daemon-wide feed after \
         feed.deleted_retention_secs (once every configured notifier had passed them)",
        feed_pruned.clone(),
    );
    Metrics {
        registry,
        connections_closed,
        feed_pruned,
        notifications,
        events_appended,
        partial_deltas_missed,
        store_commit,
        control_latency,
        control_timeouts,
        cli_exits,
        decisions,
    }
});

/// `n` session events were committed to the store.
pub fn events_appended(n: usize) {
    if n > 0 {
        METRICS
            .events_appended
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }
}

/// A subscriber was told it missed `n` partial deltas.
pub fn partial_deltas_missed(n: u64) {
    METRICS.partial_deltas_missed.inc_by(n);
}

/// Runs one group commit of the store's writer, observing how long it took.
pub fn store_commit<T>(commit: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = commit();
    METRICS.store_commit.observe(start.elapsed().as_secs_f64());
    out
}

/// Awaits a control request's answer under its timeout: an answer observes the latency,
/// `Elapsed` counts a timeout.
pub async fn control_request<F: Future>(
    answer: tokio::time::Timeout<F>,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let start = Instant::now();
    let out = answer.await;
    match &out {
        Ok(_) => METRICS
            .control_latency
            .observe(start.elapsed().as_secs_f64()),
        Err(_) => {
            METRICS.control_timeouts.inc();
        }
    }
    out
}

/// Why a CLI process ended, as counted by [`cli_exited`].
pub fn exit_cause(requested: bool, code: Option<i32>, signal: Option<i32>) -> &'static str {
    match (requested, code, signal) {
        (true, _, _) => "requested",
        (false, Some(0), None) => "success",
        (false, Some(_), _) => "error",
        (false, None, Some(_)) => "signal",
        (false, None, None) => "unknown",
    }
}

/// A CLI session process ended (see [`exit_cause`]).
pub fn cli_exited(requested: bool, code: Option<i32>, signal: Option<i32>) {
    METRICS
        .cli_exits
        .get_or_create(&[("cause", exit_cause(requested, code, signal))])
        .inc();
}

/// The `source` label of a decision recorded as `decided_by` (`client:<id> (<name>)`,
/// `rule:<rule>`, `expiry`, `cli`, `engine`): client ids and rule texts are not labels
/// (unbounded), only their kind.
pub fn decision_source(decided_by: &str) -> &'static str {
    match decided_by.split(':').next().unwrap_or_default() {
        "client" => "client",
        "rule" => "rule",
        "expiry" => "expiry",
        "cli" => "cli",
        "engine" => "engine",
        _ => "other",
    }
}

/// A webhook notification's outcome: `delivered`, `retried`, `given_up` or `queue_full`.
pub fn notification(outcome: &'static str) {
    METRICS
        .notifications
        .get_or_create(&[("outcome", outcome)])
        .inc();
}

/// Session-deleted items pruned from the daemon-wide feed.
pub fn feed_pruned(n: u64) {
    METRICS.feed_pruned.inc_by(n);
}

/// Why the daemon ended or refused a client connection, as counted by [`connection_closed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionClosed {
    /// No authenticated call for the idle time: asked to go away (GOAWAY).
    Idle,
    /// No authenticated call within the handshake time.
    NeverAuthenticated,
    /// Over `listen.max_connections`: refused (its calls answered UNAVAILABLE, or closed
    /// unanswered past the refusals' own cap).
    OverCapacity,
    /// The TLS handshake failed or was not done in time.
    TlsHandshake,
}

impl ConnectionClosed {
    /// The `reason` label.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::NeverAuthenticated => "never_authenticated",
            Self::OverCapacity => "over_capacity",
            Self::TlsHandshake => "tls_handshake",
        }
    }
}

/// The daemon ended or refused a client connection itself (see [`ConnectionClosed`]).
pub fn connection_closed(why: ConnectionClosed) {
    METRICS
        .connections_closed
        .get_or_create(&[("reason", why.label())])
        .inc();
}

/// A permission request or question was resolved: `kind` is `permission` or `question`,
/// `outcome` one of `allowed`, `denied`, `answered`, `expired`, `cancelled`.
pub fn interaction_decided(kind: &'static str, decided_by: &str, outcome: &'static str) {
    METRICS
        .decisions
        .get_or_create(&[
            ("kind", kind),
            ("source", decision_source(decided_by)),
            ("outcome", outcome),
        ])
        .inc();
}

/// State owned elsewhere, read at scrape time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Stored sessions per state (`idle`, `running`, ...), every state listed.
    pub sessions_by_state: Vec<(&'static str, u64)>,
    /// Sessions with a running CLI process.
    pub live_processes: u64,
    /// The configured maximum of live processes.
    pub max_live_processes: u64,
    /// Permission requests and questions waiting for an answer.
    pub pending_interactions: u64,
    /// Subscribe streams following live events.
    pub subscribers: u64,
    /// Whether the store answered a read.
    pub store_up: bool,
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let sessions = ConstGauge::new(0u64);
        let mut family = encoder.encode_descriptor(
            "sessions",
            "Stored sessions per state",
            None,
            sessions.metric_type(),
        )?;
        for (state, n) in &self.sessions_by_state {
            ConstGauge::new(*n).encode(family.encode_family(&[("state", *state)])?)?;
        }
        for (name, help, value) in [
            (
                "live_processes",
                "Sessions with a running CLI process",
                self.live_processes,
            ),
            (
                "live_processes_max",
                "The most sessions with a CLI process at once (sessions.max_live)",
                self.max_live_processes,
            ),
            (
                "pending_interactions",
                "Interactions waiting for a client: permission requests, questions, hook calls, tool calls, elicitations, dialogs",
                self.pending_interactions,
            ),
            (
                "subscribers",
                "Subscribe streams following live events",
                self.subscribers,
            ),
            (
                "store_up",
                "1 while the store answers reads, else 0",
                u64::from(self.store_up),
            ),
        ] {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

/// Where the daemon is at a scrape.
#[derive(Debug, Clone, Copy)]
pub enum Phase<'a> {
    /// Listening while it opens its store (a schema migration may run): no gauges yet.
    Starting,
    /// Serving, with the gauges read from its state (`None`: they could not be read).
    Ready(Option<&'a Gauges>),
}

/// `ostler_ready`: 0 while the daemon starts, 1 once it serves.
#[derive(Debug)]
struct ReadyGauge(bool);

impl Collector for ReadyGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let g = ConstGauge::new(u64::from(self.0));
        g.encode(encoder.encode_descriptor(
            "ready",
            "1 once the daemon serves, 0 while it opens its store",
            None,
            g.metric_type(),
        )?)
    }
}

/// The whole exposition: the process-wide counters and histograms, `ostler_ready`, the
/// gauges of a daemon that is ready (when it could read them), then `# EOF`.
pub fn render(phase: Phase<'_>) -> Result<String, std::fmt::Error> {
    let mut out = String::with_capacity(8 * 1024);
    text::encode_registry(&mut out, &METRICS.registry)?;
    let mut scrape = Registry::with_prefix(PREFIX);
    let (ready, gauges) = match phase {
        Phase::Starting => (false, None),
        Phase::Ready(g) => (true, g),
    };
    scrape.register_collector(Box::new(ReadyGauge(ready)));
    if let Some(g) = gauges {
        scrape.register_collector(Box::new(g.clone()));
    }
    text::encode_registry(&mut out, &scrape)?;
    text::encode_eof(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_parse::{Scrape, Value};

    /// The classic format names counters by their samples and carries the same values.
    #[test]
    fn the_classic_text_format_names_counters_by_their_samples() {
        events_appended(3);
        let om = render(Phase::Ready(Some(&Gauges::default()))).expect("render");
        let text = to_prometheus_text(&om);
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE ostler_events_appended_total counter\n")
                && text.contains("# HELP ostler_events_appended_total "),
            "{text}"
        );
        assert!(
            !text.contains("# TYPE ostler_events_appended counter"),
            "{text}"
        );
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let s = Scrape::parse(lines).expect("parse");
        let c = s
            .samples
            .iter()
            .find(|x| x.metric == "ostler_events_appended_total")
            .expect("the counter");
        assert!(
            matches!(c.value, Value::Counter(v) if v >= 3.0),
            "{:?}",
            c.value
        );
        // Every sample line of the OpenMetrics text is there, unchanged.
        for l in om.lines().filter(|l| !l.starts_with('#')) {
            assert!(text.lines().any(|t| t == l), "{l}");
        }
    }

    fn scrape(g: Option<&Gauges>) -> Scrape {
        scrape_in(Phase::Ready(g))
    }

    fn scrape_in(phase: Phase<'_>) -> Scrape {
        let text = render(phase).expect("render");
        assert!(text.ends_with("# EOF\n"), "{text}");
        Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parse")
    }

    fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        s.samples
            .iter()
            .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
            .map(|x| match &x.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
                Value::Histogram(h) => h.last().map(|b| b.count).unwrap_or(0.0),
                Value::Summary(_) => f64::NAN,
            })
    }

    #[test]
    fn counters_move_and_parse() {
        let before = scrape(None);
        let appended = |s: &Scrape| value(s, "ostler_events_appended_total", &[]).unwrap_or(0.0);
        events_appended(3);
        events_appended(0);
        interaction_decided("permission", "client:abc (laptop)", "allowed");
        interaction_decided("permission", "rule:allow Bash(git status)", "allowed");
        cli_exited(false, Some(1), None);
        let after = scrape(None);
        assert!(appended(&after) >= appended(&before) + 3.0);
        let labels = [
            ("kind", "permission"),
            ("source", "client"),
            ("outcome", "allowed"),
        ];
        assert!(value(&after, "ostler_interaction_decisions_total", &labels).unwrap_or(0.0) >= 1.0);
        assert!(
            value(
                &after,
                "ostler_interaction_decisions_total",
                &[("source", "rule")]
            )
            .is_some()
        );
        assert!(value(&after, "ostler_cli_exits_total", &[("cause", "error")]).is_some());
    }

    #[test]
    fn store_commit_is_a_histogram_in_seconds() {
        let n = store_commit(|| 7);
        assert_eq!(n, 7);
        let s = scrape(None);
        let h = s
            .samples
            .iter()
            .find(|x| x.metric == "ostler_store_commit_seconds")
            .expect("the histogram");
        let Value::Histogram(buckets) = &h.value else {
            panic!("not a histogram: {h:?}");
        };
        assert_eq!(buckets.len(), COMMIT_BUCKETS.len() + 1, "+Inf included");
        assert!(buckets.last().is_some_and(|b| b.count >= 1.0));
    }

    #[tokio::test]
    async fn control_requests_observe_answers_and_count_timeouts() {
        let timeouts =
            |s: &Scrape| value(s, "ostler_control_request_timeouts_total", &[]).unwrap_or(0.0);
        let before = scrape(None);
        // The request timeouts under test (not guards): an answer that is ready at once never
        // times out; one that never comes times out after 1 ms.
        let answered =
            control_request(tokio::time::timeout(std::time::Duration::MAX, async { 5 })).await;
        assert_eq!(answered.ok(), Some(5));
        let never = control_request(tokio::time::timeout(
            std::time::Duration::from_millis(1),
            std::future::pending::<()>(),
        ))
        .await;
        assert!(never.is_err());
        let after = scrape(None);
        assert!(timeouts(&after) >= timeouts(&before) + 1.0);
    }

    #[test]
    fn gauges_are_rendered_from_the_snapshot() {
        let g = Gauges {
            sessions_by_state: vec![("idle", 2), ("running", 1), ("exited", 0)],
            live_processes: 3,
            max_live_processes: 256,
            pending_interactions: 4,
            subscribers: 5,
            store_up: true,
        };
        let s = scrape(Some(&g));
        assert_eq!(
            value(&s, "ostler_sessions", &[("state", "idle")]),
            Some(2.0)
        );
        assert_eq!(
            value(&s, "ostler_sessions", &[("state", "exited")]),
            Some(0.0)
        );
        assert_eq!(value(&s, "ostler_live_processes", &[]), Some(3.0));
        assert_eq!(value(&s, "ostler_live_processes_max", &[]), Some(256.0));
        assert_eq!(value(&s, "ostler_pending_interactions", &[]), Some(4.0));
        assert_eq!(value(&s, "ostler_subscribers", &[]), Some(5.0));
        assert_eq!(value(&s, "ostler_store_up", &[]), Some(1.0));
        assert_eq!(value(&s, "ostler_ready", &[]), Some(1.0));
        assert_eq!(
            value(&scrape(None), "ostler_subscribers", &[]),
            None,
            "no snapshot, no gauges"
        );
        assert_eq!(value(&scrape(None), "ostler_ready", &[]), Some(1.0));
    }

    #[test]
    fn a_starting_daemon_reports_not_ready_its_counters_and_no_gauges() {
        let s = scrape_in(Phase::Starting);
        assert_eq!(value(&s, "ostler_ready", &[]), Some(0.0));
        assert_eq!(value(&s, "ostler_store_up", &[]), None);
        assert_eq!(value(&s, "ostler_sessions", &[("state", "idle")]), None);
        assert!(
            value(&s, "ostler_events_appended_total", &[]).is_some(),
            "the process-wide counters are there from the start"
        );
    }

    #[test]
    fn exit_causes_and_sources() {
        assert_eq!(exit_cause(true, Some(1), None), "requested");
        assert_eq!(exit_cause(false, Some(0), None), "success");
        assert_eq!(exit_cause(false, Some(2), None), "error");
        assert_eq!(exit_cause(false, None, Some(9)), "signal");
        assert_eq!(exit_cause(false, None, None), "unknown");
        assert_eq!(decision_source("client:x"), "client");
        assert_eq!(decision_source("rule:deny Bash(rm)"), "rule");
        assert_eq!(decision_source("expiry"), "expiry");
        assert_eq!(decision_source("something else"), "other");
    }
}
