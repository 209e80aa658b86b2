//! `ostler.v1.DaemonService` and the standard health service's status.

use std::time::{Duration, Instant};

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use ostler_proto::v1::daemon_service_server::DaemonService;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tonic_health::server::HealthReporter;

use crate::error::ApiError;

/// How compatible the Claude Code CLI is (mirrors the supervisor's `CompatLevel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compatibility {
    #[default]
    Unknown,
    FullyCompatible,
    LikelyCompatible,
    Degraded,
    Incompatible,
}

/// The start-up version check's result, as reported by `GetHealthDetails`.
#[derive(Debug, Clone, Default)]
pub struct ClaudeCodeInfo {
    pub version: String,
    pub api_date: Option<String>,
    pub level: Compatibility,
    pub message: String,
    pub binary_path: String,
    pub capabilities: Vec<String>,
}

/// Static facts about the running daemon.
#[derive(Debug, Clone)]
pub struct DaemonInfo {
    pub version: String,
    pub started: Instant,
    /// The SQLite file, for display.
    pub store_path: String,
    pub claude: ClaudeCodeInfo,
}

impl DaemonInfo {
    pub fn new(
        version: impl Into<String>,
        store_path: impl Into<String>,
        claude: ClaudeCodeInfo,
    ) -> Self {
        Self {
            version: version.into(),
            started: Instant::now(),
            store_path: store_path.into(),
            claude,
        }
    }
}

fn level_to_pb(l: Compatibility) -> pb::CompatibilityLevel {
    match l {
        Compatibility::Unknown => pb::CompatibilityLevel::Unspecified,
        Compatibility::FullyCompatible => pb::CompatibilityLevel::FullyCompatible,
        Compatibility::LikelyCompatible => pb::CompatibilityLevel::LikelyCompatible,
        Compatibility::Degraded => pb::CompatibilityLevel::Degraded,
        Compatibility::Incompatible => pb::CompatibilityLevel::Incompatible,
    }
}

/// The daemon service.
#[derive(Clone, Debug)]
pub struct DaemonSvc {
    engine: eng::Engine,
    info: DaemonInfo,
    shutdown: CancellationToken,
}

impl DaemonSvc {
    pub fn new(engine: eng::Engine, info: DaemonInfo, shutdown: CancellationToken) -> Self {
        Self {
            engine,
            info,
            shutdown,
        }
    }
}

pub(crate) fn health_details(
    info: &DaemonInfo,
    report: &eng::HealthReport,
    shutting_down: bool,
) -> pb::HealthDetailsResponse {
    let count = |s: eng::SessionState| report.sessions_by_state.get(&s).copied().unwrap_or(0);
    let c = &info.claude;
    pb::HealthDetailsResponse {
        daemon_version: info.version.clone(),
        uptime_ms: u64::try_from(info.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        store: Some(pb::StoreStatus {
            ok: report.store.is_ok(),
            path: info.store_path.clone(),
            message: report.store.as_ref().err().cloned().unwrap_or_default(),
        }),
        sessions: Some(pb::SessionCounts {
            total: report.sessions_by_state.values().sum(),
            starting: count(eng::SessionState::Starting),
            idle: count(eng::SessionState::Idle),
            running: count(eng::SessionState::Running),
            awaiting_permission: count(eng::SessionState::AwaitingPermission),
            stopped: count(eng::SessionState::Stopped),
            exited: count(eng::SessionState::Exited),
            resumable: count(eng::SessionState::Resumable),
            suspended: count(eng::SessionState::Suspended),
            live: report.live_sessions,
            max_live: report.max_live_sessions,
        }),
        pending_interactions: report.pending_interactions,
        shutting_down,
        claude_code: Some(pb::ClaudeCodeStatus {
            version: c.version.clone(),
            api_version: c.api_date.clone().unwrap_or_default(),
            level: level_to_pb(c.level) as i32,
            message: c.message.clone(),
            binary_path: c.binary_path.clone(),
            capabilities: c.capabilities.clone(),
        }),
    }
}

#[tonic::async_trait]
impl DaemonService for DaemonSvc {
    async fn get_health_details(
        &self,
        _req: Request<pb::GetHealthDetailsRequest>,
    ) -> Result<Response<pb::HealthDetailsResponse>, Status> {
        let report = self.engine.health().await.map_err(ApiError::from)?;
        Ok(Response::new(health_details(
            &self.info,
            &report,
            self.shutdown.is_cancelled(),
        )))
    }
}

/// Service names whose status the standard health service reports.
/// Per-service names first, the overall `""` last: a client that sees the overall status
/// change can rely on every per-service status having changed already.
const HEALTH_NAMES: [&str; 2] = ["ostler.v1.SessionService", ""];

/// Sets `status` for every name the health service reports (per-service names first).
pub(crate) async fn report(reporter: &HealthReporter, status: tonic_health::ServingStatus) {
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, status).await;
    }
}

/// Sets every health entry from the engine's current state (when it differs from `last`)
/// and returns the status now reported.
pub(crate) async fn update_health(
    engine: &eng::Engine,
    reporter: &HealthReporter,
    last: Option<tonic_health::ServingStatus>,
) -> tonic_health::ServingStatus {
    use tonic_health::ServingStatus;
    let status = match engine.health().await {
        Ok(r) if r.store.is_ok() => ServingStatus::Serving,
        Ok(r) => {
            if last != Some(ServingStatus::NotServing) {
                tracing::warn!(reason = ?r.store.err(), "store unusable: health NOT_SERVING");
            }
            ServingStatus::NotServing
        }
        Err(e) => {
            if last != Some(ServingStatus::NotServing) {
                tracing::warn!(error = %e, "engine health failed: health NOT_SERVING");
            }
            ServingStatus::NotServing
        }
    };
    if last != Some(status) {
        report(reporter, status).await;
    }
    status
}

/// Keeps `grpc.health.v1.Health` in line with reality: SERVING while the engine reports a
/// usable store (it answers reads and its last write committed), NOT_SERVING otherwise and from the moment shutdown begins. `last` is the
/// status already reported (see [`update_health`]).
pub(crate) async fn watch_health(
    engine: eng::Engine,
    reporter: HealthReporter,
    interval: Duration,
    shutdown: CancellationToken,
    mut last: tonic_health::ServingStatus,
) {
    use tonic_health::ServingStatus;
    // A storage fault (or its end) is reported at once, not at the next interval.
    let mut store = engine.watch_store_health();
    let mut store_open = true;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(interval) => {}
            changed = store.changed(), if store_open => store_open = changed.is_ok(),
        }
        last = update_health(&engine, &reporter, Some(last)).await;
    }
    report(&reporter, ServingStatus::NotServing).await;
}
