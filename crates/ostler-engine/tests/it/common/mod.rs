//! Test harness: the real CLI (a pinned release), the fake model server playing a scenario
//! from `contracts/scenarios/`, a real store in a temp dir, and an engine on top.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ostler_engine::*;
use ostler_store::{Store, StoreOptions};
use ostler_supervisor::Installation;
use ostler_testkit::{FakeModelServer, Scenario};

pub const NEW: &str = "2.1.332";
pub const OLD: &str = "1.0.128";

/// Failure guard for awaits (never used to synchronise): the test kit's scaled guard.
pub fn timeout() -> Duration {
    ostler_testkit::timeouts::guard()
}

/// Drops the engine's last handle as the daemon's death would and waits, under the guard,
/// until its actors have ended (`Engine::abandon`): a dead daemon writes nothing more, so a
/// new engine on the same store must not race the old one's last writes.
pub async fn abandon(engine: Engine) {
    tokio::time::timeout(timeout(), engine.abandon())
        .await
        .expect("the engine's actors end once its last handle is gone");
}

pub fn binary(version: &str) -> PathBuf {
    ostler_testkit::releases::installed(version).expect("CLI release")
}

pub fn installation(version: &str) -> Installation {
    Installation::assume(
        binary(version),
        semver::Version::parse(version).expect("version"),
        None,
    )
}

pub fn scenario(name: &str) -> Scenario {
    Scenario::load(&ostler_testkit::scenario::scenarios_dir(), name).expect("scenario")
}

/// Several scenario files served by one fake model (their rules concatenated).
pub fn scenarios(names: &[&str]) -> Scenario {
    let mut all = scenario(names[0]);
    for n in &names[1..] {
        all.rules.extend(scenario(n).rules);
    }
    all
}

pub struct Env {
    pub version: &'static str,
    pub server: FakeModelServer,
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    pub cwd: PathBuf,
    pub store: Store,
    pub engine: Engine,
    pub opts: EngineOptions,
}

impl Env {
    pub async fn new(version: &'static str, scenario: Scenario) -> Env {
        Self::with(version, scenario, |_| {}).await
    }

    pub async fn with(
        version: &'static str,
        scenario: Scenario,
        tweak: impl FnOnce(&mut EngineOptions),
    ) -> Env {
        let server = FakeModelServer::start(scenario).await.expect("fake server");
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().canonicalize().expect("canonical");
        let home = base.join("home");
        let cwd = base.join("work");
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&cwd).expect("cwd");
        let store = Store::open(base.join("ostler.db"), StoreOptions::default()).expect("store");
        let mut opts = EngineOptions {
            spawn_env: vec![
                ("HOME".into(), home.display().to_string()),
                ("ANTHROPIC_BASE_URL".into(), server.url()),
                ("ANTHROPIC_API_KEY".into(), "test".into()),
                (
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                    "1".into(),
                ),
            ],
            allowed_roots: vec![base.clone()],
            ..Default::default()
        };
        opts.supervisor.stop_grace = ostler_testkit::timeouts::secs(3);
        opts.supervisor.control_timeout =
            ostler_testkit::timeouts::scaled(opts.supervisor.control_timeout);
        // Outlasts the (scaled) `initialize` timeout, as by default.
        opts.guard_verdict = ostler_testkit::timeouts::scaled(opts.guard_verdict);
        tweak(&mut opts);
        let engine = Engine::start(opts.clone(), store.clone(), installation(version))
            .await
            .expect("engine");
        Env {
            version,
            server,
            dir,
            home,
            cwd,
            store,
            engine,
            opts,
        }
    }

    /// Drops every handle of the engine (without shutdown: as if the daemon died), waits
    /// until its actors have ended (`Engine::abandon`: a dead daemon writes nothing more),
    /// then starts a new engine on the same store.
    pub async fn restarted(self) -> Env {
        let Env {
            version,
            server,
            dir,
            home,
            cwd,
            store,
            engine,
            opts,
        } = self;
        abandon(engine).await;
        let engine = Engine::start(opts.clone(), store.clone(), installation(version))
            .await
            .expect("engine restart");
        Env {
            version,
            server,
            dir,
            home,
            cwd,
            store,
            engine,
            opts,
        }
    }

    pub fn create(&self, prompt: Option<&str>) -> CreateSession {
        CreateSession {
            cwd: self.cwd.clone(),
            first_prompt: prompt.map(|p| MessageContent::Text(p.into())),
            client: ClientRef::new("creator"),
            ..Default::default()
        }
    }

    pub async fn session(&self, prompt: Option<&str>) -> SessionInfo {
        self.engine
            .create_session(self.create(prompt))
            .await
            .expect("create session")
    }

    pub async fn send(&self, id: &str, text: &str) -> SendOutcome {
        self.engine
            .send_message(
                id,
                SendMessage {
                    content: MessageContent::Text(text.into()),
                    client_message_id: None,
                    client: ClientRef::new("tester"),
                    delivery: Default::default(),
                },
            )
            .await
            .expect("send")
    }

    pub async fn follow(&self, id: &str, after: u64) -> Subscription {
        self.engine
            .subscribe(SubscribeRequest {
                session_id: id.into(),
                after_seq: after,
                include_partials: false,
                follow: true,
            })
            .await
            .expect("subscribe")
    }

    /// Every stored event of a session, read without following.
    pub async fn history(&self, id: &str) -> Vec<Arc<EngineEvent>> {
        let mut sub = self
            .engine
            .subscribe(SubscribeRequest {
                session_id: id.into(),
                after_seq: 0,
                include_partials: false,
                follow: false,
            })
            .await
            .expect("subscribe");
        let mut out = Vec::new();
        while let Some(ev) = sub.next().await {
            out.push(ev.expect("history event"));
        }
        out
    }

    pub fn cwd_file(&self, name: &str) -> PathBuf {
        self.cwd.join(name)
    }
}

/// Reads events until one matches `pred` (returned with everything read before it).
pub async fn until(
    sub: &mut Subscription,
    mut pred: impl FnMut(&EngineEvent) -> bool,
) -> (Arc<EngineEvent>, Vec<Arc<EngineEvent>>) {
    let mut seen = Vec::new();
    let r = tokio::time::timeout(timeout(), async {
        loop {
            match sub.next().await {
                Some(Ok(ev)) => {
                    seen.push(ev.clone());
                    if pred(&ev) {
                        return ev;
                    }
                }
                Some(Err(e)) => panic!("subscription error: {e}"),
                None => panic!("subscription ended; saw {:?}", kinds(&seen)),
            }
        }
    })
    .await;
    match r {
        Ok(ev) => (ev, seen),
        Err(_) => panic!("timed out; saw {:?}", kinds(&seen)),
    }
}

pub fn kinds(evs: &[Arc<EngineEvent>]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            format!(
                "{}:{}",
                e.seq.map(|s| s.to_string()).unwrap_or("-".into()),
                e.payload.kind()
            )
        })
        .collect()
}

pub fn is_turn_end(e: &EngineEvent) -> bool {
    matches!(e.payload, EventPayload::TurnCompleted(_))
}

pub fn is_kind(kind: &'static str) -> impl Fn(&EngineEvent) -> bool {
    move |e| e.payload.kind() == kind
}

/// Asserts the events' seqs are exactly `from..=to`.
pub fn assert_seqs(evs: &[Arc<EngineEvent>], from: u64, to: u64) {
    let seqs: Vec<u64> = evs.iter().filter_map(|e| e.seq).collect();
    let want: Vec<u64> = (from..=to).collect();
    assert_eq!(seqs, want, "events: {:?}", kinds(evs));
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
