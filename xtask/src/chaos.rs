//! `cargo xtask chaos [--short]`: fault injection against the real daemon (`ostler serve`)
//! driving the test kit's fake CLI (`ostler-fake-claude`), checked from a tonic client:
//!
//! - **kill -9 of the daemon mid-turn** (rounds on one store): every event a client received
//!   before the kill is stored with the same seq and payload (read back after a restart),
//!   and every session's log is gap-free;
//! - **CLI kill**: SIGKILL of a session's CLI mid-turn ends the session `EXITED` with a
//!   `process_exited` event; what clients saw is what is stored;
//! - **reconnect storm**: many clients subscribing from random points during a firehose,
//!   reading a random number of events and hanging up: each run is contiguous from its
//!   `after_seq` and equal to the stored log;
//! - **stuck and slow subscribers**: one that stops reading, one that reads slowly, one that
//!   reads at full speed during a firehose: the fast one finishes, the others get every
//!   event, gap-free, when they read on;
//! - **storage faults** (needs root to mount a tmpfs; skipped otherwise): the store's disk
//!   fills up mid-turn: health NOT_SERVING, `SendMessage` UNAVAILABLE; once space is back
//!   the turn completes with every line the CLI wrote stored.
//!
//! - **SIGBUS** (the store's shared-memory file truncated under the daemon mid-turn, as a
//!   disk or filesystem fault would): SQLite's mapping of `ostler.db-shm` faults and the
//!   kernel ends the daemon with SIGBUS; after a restart every event a client received is
//!   stored with the same seq and payload, and the session can go on.
//!
//! Prints a summary (rounds, events compared, failures) and fails on any violation.
//! `--short` (about a minute) runs inside `cargo xtask test`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ostler_proto::v1 as pb;
use pb::daemon_service_client::DaemonServiceClient;
use pb::session_event::Payload as P;
use pb::session_service_client::SessionServiceClient;
use tonic::transport::Channel;

#[derive(clap::Args)]
pub struct ChaosArgs {
    /// The short version (fewer rounds and smaller turns; what `cargo xtask test` runs).
    #[arg(long)]
    pub short: bool,
    /// Seed of the random choices (kill points, reconnect points); printed in the summary.
    #[arg(long)]
    pub seed: Option<u64>,
    /// `Some`: build every test target too, as the test runner will (`cargo test --no-run`),
    /// with these lints, so that the daemon is built once with the feature set the tests
    /// use instead of twice (`cargo xtask test`; `cargo xtask chaos` builds the daemon and
    /// the fake CLI alone).
    #[arg(skip)]
    pub build_tests: Option<crate::features::Clippy>,
}

/// Sizes of one run.
struct Plan {
    kill_rounds: u32,
    firehose: u64,
    storm_clients: u32,
    storm_rounds: u32,
}

/// What the checks found.
#[derive(Default)]
struct Tally {
    scenarios: BTreeMap<&'static str, (u64, u64)>,
    failures: Vec<String>,
}

impl Tally {
    /// One scenario run: `events` compared.
    fn ran(&mut self, name: &'static str, events: u64) {
        let e = self.scenarios.entry(name).or_default();
        e.0 += 1;
        e.1 += events;
    }

    fn fail(&mut self, name: &str, what: impl std::fmt::Display) {
        let line = format!("{name}: {what}");
        eprintln!("  VIOLATION {line}");
        self.failures.push(line);
    }
}

pub fn chaos(a: ChaosArgs) -> Result<()> {
    let root = ostler_testkit::workspace_root();
    eprintln!("==> build the daemon and the fake CLI");
    if let Some(clippy) = &a.build_tests {
        crate::features::build_tests(clippy)?;
    } else {
        let st = crate::bench::cargo()
            .args([
                "build",
                "-p",
                "ostler",
                "--bin",
                "ostler",
                "-p",
                "ostler-testkit",
                "--bin",
                "ostler-fake-claude",
            ])
            .status()
            .context("cannot start cargo")?;
        if !st.success() {
            bail!("building the daemon and the fake CLI failed ({st})");
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("debug");
    let bins = Bins {
        ostler: target.join("ostler"),
        fake: target.join("ostler-fake-claude"),
    };
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1
    });
    let plan = if a.short {
        Plan {
            kill_rounds: 3,
            firehose: 3000,
            storm_clients: 16,
            storm_rounds: 3,
        }
    } else {
        Plan {
            kill_rounds: 20,
            firehose: 20_000,
            storm_clients: 64,
            storm_rounds: 10,
        }
    };
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let mut tally = Tally::default();
    let mut rng = Rng(seed);
    rt.block_on(async {
        let steps: [(&'static str, Scenario); 6] = [
            ("kill -9 daemon", kill9),
            ("CLI kill", cli_kill),
            ("reconnect storm", storm),
            ("stuck and slow subscribers", stuck_and_slow),
            ("storage fault", storage_fault),
            ("SIGBUS", sigbus),
        ];
        for (name, step) in steps {
            eprintln!("==> chaos: {name}");
            let t = Instant::now();
            if let Err(e) = step(&bins, &plan, &mut rng, &mut tally).await {
                tally.fail(name, format!("{e:#}"));
            }
            eprintln!("    {name}: {:.1}s", t.elapsed().as_secs_f64());
        }
    });
    eprintln!(
        "chaos summary (seed {seed:#x}, {:.0}s):",
        started.elapsed().as_secs_f64()
    );
    for (name, (runs, events)) in &tally.scenarios {
        eprintln!("  {name}: {runs} run(s), {events} events checked");
    }
    if tally.failures.is_empty() {
        eprintln!("  no violations");
        Ok(())
    } else {
        for f in &tally.failures {
            eprintln!("  FAILED {f}");
        }
        bail!(
            "{} chaos violation(s) (replay with --seed {seed:#x})",
            tally.failures.len()
        )
    }
}

/// One scenario's run (boxed: the scenarios are listed as plain function pointers).
type Run<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + 'a>>;

type Scenario = for<'a> fn(&'a Bins, &'a Plan, &'a mut Rng, &'a mut Tally) -> Run<'a>;

struct Bins {
    ostler: PathBuf,
    fake: PathBuf,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Generous bound on any single wait (busy machines).
fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

/// Directories that outlive one daemon process.
struct World {
    dir: tempfile::TempDir,
    store: PathBuf,
    work: PathBuf,
}

impl World {
    fn new() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("ostler-chaos-").tempdir()?;
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work)?;
        std::fs::create_dir_all(dir.path().join("data"))?;
        let store = dir.path().join("data").join("ostler.db");
        std::fs::write(dir.path().join("config.toml"), "# chaos\n")?;
        Ok(Self { dir, store, work })
    }
}

struct Daemon {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Daemon {
    async fn start(bins: &Bins, w: &World) -> Result<Daemon> {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let ready = w.dir.path().join(format!("ready-{n}"));
        let log = w.dir.path().join(format!("daemon-{n}.log"));
        let child = Command::new(&bins.ostler)
            .arg("serve")
            .arg("--config")
            .arg(w.dir.path().join("config.toml"))
            .args(["--listen", "127.0.0.1:0"])
            .arg("--store")
            .arg(&w.store)
            .arg("--claude")
            .arg(&bins.fake)
            .arg("--allowed-root")
            .arg(&w.work)
            .arg("--ready-file")
            .arg(&ready)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", w.dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("cannot start {}", bins.ostler.display()))?;
        let mut d = Daemon {
            child,
            addr: String::new(),
            log,
        };
        let t = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready)
                && let Some(a) = text.lines().find_map(|l| l.strip_prefix("tcp://"))
            {
                d.addr = a.to_owned();
                return Ok(d);
            }
            if let Some(st) = d.child.try_wait()? {
                bail!("the daemon exited ({st}) before it was ready:\n{}", d.log());
            }
            if t.elapsed() > guard() {
                bail!("the daemon did not become ready:\n{}", d.log());
            }
            // A file another process writes once: nothing to await across processes.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn channel(&self) -> Result<Channel> {
        Ok(Channel::from_shared(format!("http://{}", self.addr))?
            .connect()
            .await?)
    }

    async fn client(&self) -> Result<SessionServiceClient<Channel>> {
        Ok(SessionServiceClient::new(self.channel().await?).max_decoding_message_size(64 << 20))
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

type Client = SessionServiceClient<Channel>;
type Events = tonic::Streaming<pb::SessionEvent>;

async fn create(c: &mut Client, w: &World) -> Result<String> {
    Ok(c.create_session(pb::CreateSessionRequest {
        cwd: w.work.display().to_string(),
        ..Default::default()
    })
    .await?
    .into_inner()
    .id)
}

async fn send(c: &mut Client, id: &str, text: &str) -> Result<u64> {
    Ok(c.send_message(pb::SendMessageRequest {
        session_id: id.to_owned(),
        content: Some(pb::MessageContent {
            content: Some(pb::message_content::Content::Text(text.to_owned())),
        }),
        client_message_id: String::new(),
        ..Default::default()
    })
    .await?
    .into_inner()
    .seq)
}

async fn subscribe(c: &mut Client, id: &str, after: u64, follow: bool) -> Result<Events> {
    Ok(c.subscribe(pb::SubscribeRequest {
        session_id: id.to_owned(),
        after_seq: after,
        include_partial: false,
        follow,
    })
    .await?
    .into_inner())
}

/// The whole stored log of a session.
async fn history(c: &mut Client, id: &str) -> Result<Vec<pb::SessionEvent>> {
    let mut s = subscribe(c, id, 0, false).await?;
    let mut out = Vec::new();
    while let Some(e) = tokio::time::timeout(guard(), s.message())
        .await
        .map_err(|_| anyhow!("replay stalled"))??
    {
        out.push(e);
    }
    Ok(out)
}

/// Reads until `stop` holds (included) or the stream ends.
async fn read_until(
    s: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
    mut stop: impl FnMut(&pb::SessionEvent) -> bool,
) -> Result<()> {
    loop {
        let e = tokio::time::timeout(guard(), s.message())
            .await
            .map_err(|_| anyhow!("no event within {:?}", guard()))??
            .ok_or_else(|| anyhow!("the stream ended"))?;
        let done = stop(&e);
        seen.push(e);
        if done {
            return Ok(());
        }
    }
}

fn is_turn_end(e: &pb::SessionEvent) -> bool {
    matches!(e.payload, Some(P::TurnCompleted(_)))
}

/// Checks that `log` is gap-free from 1 and that every stored event in `seen` is in it,
/// unchanged; returns the number of events compared.
fn check_against(
    tally: &mut Tally,
    name: &str,
    seen: &[pb::SessionEvent],
    log: &[pb::SessionEvent],
) -> u64 {
    for (i, e) in log.iter().enumerate() {
        if e.seq != i as u64 + 1 {
            tally.fail(name, format!("stored log has a gap: #{} at {i}", e.seq));
            return 0;
        }
    }
    let mut n = 0;
    for e in seen.iter().filter(|e| e.seq != 0 && !e.redelivered) {
        n += 1;
        match log.get((e.seq - 1) as usize) {
            Some(s) if s == e => {}
            Some(_) => {
                tally.fail(
                    name,
                    format!("event #{} differs from its stored form", e.seq),
                );
                return n;
            }
            None => {
                tally.fail(
                    name,
                    format!(
                        "event #{} was received but is not stored ({} stored)",
                        e.seq,
                        log.len()
                    ),
                );
                return n;
            }
        }
    }
    n
}

fn kill9<'a>(bins: &'a Bins, plan: &'a Plan, rng: &'a mut Rng, tally: &'a mut Tally) -> Run<'a> {
    Box::pin(async move {
        let w = World::new()?;
        let mut received: Vec<(String, Vec<pb::SessionEvent>)> = Vec::new();
        for _ in 0..plan.kill_rounds {
            let mut d = Daemon::start(bins, &w).await?;
            let mut c = d.client().await?;
            let id = create(&mut c, &w).await?;
            let mut s = subscribe(&mut c, &id, 0, true).await?;
            send(&mut c, &id, &format!("fake:firehose {}", plan.firehose)).await?;
            let kill_after = 20 + rng.below(plan.firehose);
            let mut seen = Vec::new();
            let mut n = 0;
            read_until(&mut s, &mut seen, |e| {
                n += 1;
                n >= kill_after || is_turn_end(e)
            })
            .await?;
            d.kill9();
            received.push((id, seen));
        }
        // One more life: every session's log against what its client saw.
        let d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        for (id, seen) in &received {
            let log = history(&mut c, id).await?;
            let n = check_against(tally, "kill -9 daemon", seen, &log);
            tally.ran("kill -9 daemon", n);
        }
        Ok(())
    })
}

/// The pid of the daemon's child running the fake CLI.
fn cli_pid(daemon: u32) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(daemon) && head.contains("ostler-fake") {
            return Some(pid);
        }
    }
    None
}

fn cli_kill<'a>(
    bins: &'a Bins,
    _plan: &'a Plan,
    rng: &'a mut Rng,
    tally: &'a mut Tally,
) -> Run<'a> {
    Box::pin(async move {
        let w = World::new()?;
        let d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        for _ in 0..2 {
            let id = create(&mut c, &w).await?;
            let mut s = subscribe(&mut c, &id, 0, true).await?;
            send(&mut c, &id, "fake:paced 200 100000").await?;
            let mut seen = Vec::new();
            let want = 5 + rng.below(50);
            let mut blocks = 0;
            read_until(&mut s, &mut seen, |e| {
                if matches!(e.payload, Some(P::AssistantBlock(_))) {
                    blocks += 1;
                }
                blocks >= want
            })
            .await?;
            let pid = cli_pid(d.child.id()).ok_or_else(|| anyhow!("no CLI process found"))?;
            let st = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()?;
            if !st.success() {
                bail!("kill -KILL {pid} failed");
            }
            read_until(&mut s, &mut seen, |e| {
                matches!(e.payload, Some(P::StateChanged(ref sc)) if sc.to() == pb::SessionState::Exited)
            })
            .await?;
            if !seen
                .iter()
                .any(|e| matches!(e.payload, Some(P::ProcessExited(_))))
            {
                tally.fail("CLI kill", "no process_exited event");
            }
            let info = c
                .get_session(pb::GetSessionRequest {
                    session_id: id.clone(),
                })
                .await?
                .into_inner();
            if info.state() != pb::SessionState::Exited {
                tally.fail(
                    "CLI kill",
                    format!("session is {:?}, not EXITED", info.state()),
                );
            }
            let log = history(&mut c, &id).await?;
            let n = check_against(tally, "CLI kill", &seen, &log);
            tally.ran("CLI kill", n);
        }
        Ok(())
    })
}

fn storm<'a>(bins: &'a Bins, plan: &'a Plan, rng: &'a mut Rng, tally: &'a mut Tally) -> Run<'a> {
    Box::pin(async move {
        let w = World::new()?;
        let d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        let id = create(&mut c, &w).await?;
        let mut s = subscribe(&mut c, &id, 0, true).await?;
        send(&mut c, &id, &format!("fake:firehose {}", plan.firehose * 2)).await?;
        // Clients come and go while the turn runs: each round subscribes from a random
        // point at or below what has been stored, reads a random number of events, hangs up.
        let mut tasks = Vec::new();
        for _ in 0..plan.storm_clients {
            let mut c = d.client().await?;
            let id = id.clone();
            let picks: Vec<(u64, u64)> = (0..plan.storm_rounds)
                .map(|_| (rng.next(), 1 + rng.below(2000)))
                .collect();
            tasks.push(tokio::spawn(async move {
                let mut runs = Vec::new();
                for (pick, count) in picks {
                    // A point at or below what is stored now (beyond is INVALID_ARGUMENT).
                    let last = c
                        .get_session(pb::GetSessionRequest {
                            session_id: id.clone(),
                        })
                        .await?
                        .into_inner()
                        .last_seq;
                    let after = pick % (last + 1);
                    let mut s = subscribe(&mut c, &id, after, true).await?;
                    let mut got = Vec::new();
                    while (got.len() as u64) < count {
                        match tokio::time::timeout(guard(), s.message()).await {
                            Ok(Ok(Some(e))) => {
                                let end = is_turn_end(&e);
                                got.push(e);
                                if end {
                                    break;
                                }
                            }
                            Ok(Ok(None)) => break,
                            Ok(Err(e)) => return Err(anyhow!("stream failed: {e}")),
                            Err(_) => return Err(anyhow!("a reconnecting client stalled")),
                        }
                    }
                    runs.push((after, got));
                }
                Ok::<_, anyhow::Error>(runs)
            }));
        }
        let mut seen = Vec::new();
        read_until(&mut s, &mut seen, is_turn_end).await?;
        let log = history(&mut c, &id).await?;
        let mut n = check_against(tally, "reconnect storm", &seen, &log);
        for t in tasks {
            for (after, got) in t.await?? {
                let stored: Vec<_> = got
                    .iter()
                    .filter(|e| e.seq != 0 && !e.redelivered)
                    .collect();
                for (i, e) in stored.iter().enumerate() {
                    if e.seq != after + 1 + i as u64 {
                        tally.fail(
                            "reconnect storm",
                            format!("from after_seq {after}: event {i} is #{}", e.seq),
                        );
                        break;
                    }
                }
                n += check_against(tally, "reconnect storm", &got, &log);
            }
        }
        tally.ran("reconnect storm", n);
        Ok(())
    })
}

fn stuck_and_slow<'a>(
    bins: &'a Bins,
    plan: &'a Plan,
    _rng: &'a mut Rng,
    tally: &'a mut Tally,
) -> Run<'a> {
    Box::pin(async move {
        let w = World::new()?;
        let d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        let id = create(&mut c, &w).await?;
        let mut fast = subscribe(&mut c, &id, 0, true).await?;
        // Own connections: a stuck stream fills only its own HTTP/2 window.
        let mut stuck = subscribe(&mut d.client().await?, &id, 0, true).await?;
        let mut slow = subscribe(&mut d.client().await?, &id, 0, true).await?;
        let mut stuck_seen = Vec::new();
        read_until(&mut stuck, &mut stuck_seen, |_| true).await?;
        send(&mut c, &id, &format!("fake:firehose {}", plan.firehose * 2)).await?;
        let slow_task = tokio::spawn(async move {
            let mut seen = Vec::new();
            // A reader that takes a break every 100 events (the slowness under test).
            loop {
                let mut n = 0u32;
                read_until(&mut slow, &mut seen, |e| {
                    n += 1;
                    is_turn_end(e) || n == 100
                })
                .await?;
                if seen.last().is_some_and(is_turn_end) {
                    return Ok::<_, anyhow::Error>(seen);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let t = Instant::now();
        let mut fast_seen = Vec::new();
        read_until(&mut fast, &mut fast_seen, is_turn_end).await?;
        let fast_took = t.elapsed();
        // The stuck one reads on only now.
        read_until(&mut stuck, &mut stuck_seen, is_turn_end).await?;
        let slow_seen = slow_task.await??;
        let log = history(&mut c, &id).await?;
        let mut n = 0;
        // Every subscriber read up to the turn's end.
        let end = log
            .iter()
            .find(|e| is_turn_end(e))
            .map_or(0, |e| e.seq as usize);
        for (who, seen) in [
            ("fast", &fast_seen),
            ("stuck", &stuck_seen),
            ("slow", &slow_seen),
        ] {
            let got = check_against(tally, "stuck and slow subscribers", seen, &log);
            let stored = seen.iter().filter(|e| e.seq != 0 && !e.redelivered).count();
            if stored != end {
                tally.fail(
                    "stuck and slow subscribers",
                    format!("the {who} subscriber got {stored} of the turn's {end} events"),
                );
            }
            n += got;
        }
        eprintln!(
            "    fast subscriber finished in {:.1}s",
            fast_took.as_secs_f64()
        );
        tally.ran("stuck and slow subscribers", n);
        Ok(())
    })
}

/// A tmpfs on the store's directory (root only).
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(dir: &Path) -> Option<Self> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "ostler-chaos-store"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self {
            dir: dir.to_owned(),
        })
    }

    fn fill(&self) -> Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.dir.join("filler"))?;
        for chunk in [64 << 10, 4 << 10, 1] {
            let buf = vec![0u8; chunk];
            while f.write_all(&buf).is_ok() {}
        }
        Ok(())
    }

    fn free(&self) -> Result<()> {
        Ok(std::fs::remove_file(self.dir.join("filler"))?)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

async fn store_ok(d: &Daemon) -> Result<(bool, String)> {
    let s = DaemonServiceClient::new(d.channel().await?)
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await?
        .into_inner()
        .store
        .ok_or_else(|| anyhow!("no store status"))?;
    Ok((s.ok, s.message))
}

/// Polls the daemon's health until the store's `ok` is `want`.
async fn store_becomes(d: &Daemon, want: bool) -> Result<String> {
    let t = Instant::now();
    loop {
        let (ok, msg) = store_ok(d).await?;
        if ok == want {
            return Ok(msg);
        }
        if t.elapsed() > guard() {
            bail!("store.ok never became {want}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn storage_fault<'a>(
    bins: &'a Bins,
    _plan: &'a Plan,
    _rng: &'a mut Rng,
    tally: &'a mut Tally,
) -> Run<'a> {
    Box::pin(async move {
        let w = World::new()?;
        let Some(disk) = SmallDisk::mount(&w.dir.path().join("data")) else {
            eprintln!("    skipped: mounting a tmpfs needs root");
            return Ok(());
        };
        let d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        let id = create(&mut c, &w).await?;
        let mut s = subscribe(&mut c, &id, 0, true).await?;
        let frames = 300;
        send(&mut c, &id, &format!("fake:paced 100 {frames}")).await?;
        let mut seen = Vec::new();
        read_until(&mut s, &mut seen, |e| {
            matches!(e.payload, Some(P::AssistantBlock(_)))
        })
        .await?;
        disk.fill()?;
        let t = Instant::now();
        let why = store_becomes(&d, false).await?;
        eprintln!(
            "    health NOT_SERVING after {:.2}s: {why}",
            t.elapsed().as_secs_f64()
        );
        match send(&mut c, &id, "fake:echo").await {
            Err(e) if e.to_string().contains("store not writable") => {}
            other => tally.fail(
                "storage fault",
                format!("SendMessage while full: {other:?}"),
            ),
        }
        disk.free()?;
        store_becomes(&d, true).await?;
        read_until(&mut s, &mut seen, is_turn_end).await?;
        let log = history(&mut c, &id).await?;
        let n = check_against(tally, "storage fault", &seen, &log);
        let blocks = log
            .iter()
            .filter(|e| matches!(e.payload, Some(P::AssistantBlock(_))))
            .count();
        if blocks != frames {
            tally.fail(
                "storage fault",
                format!("{blocks} of the CLI's {frames} lines are stored"),
            );
        }
        if d.log().contains("cannot record CLI output") {
            tally.fail("storage fault", "CLI output was dropped");
        }
        tally.ran("storage fault", n);
        Ok(())
    })
}

/// Truncates the store's `-shm` file while the daemon writes: its next access to the mapped
/// page faults (SIGBUS, as with an immutable or vanished `-shm`). The daemon dies like kill -9;
/// the check is that this loses nothing a client saw, and that the store opens again.
fn sigbus<'a>(bins: &'a Bins, plan: &'a Plan, _rng: &'a mut Rng, tally: &'a mut Tally) -> Run<'a> {
    Box::pin(async move {
        use std::os::unix::process::ExitStatusExt as _;
        let w = World::new()?;
        let mut d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        let id = create(&mut c, &w).await?;
        let mut s = subscribe(&mut c, &id, 0, true).await?;
        send(&mut c, &id, &format!("fake:firehose {}", plan.firehose)).await?;
        let mut seen = Vec::new();
        read_until(&mut s, &mut seen, |e| {
            matches!(e.payload, Some(P::AssistantBlock(_)))
        })
        .await?;
        let shm = PathBuf::from(format!("{}-shm", w.store.display()));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&shm)
            .with_context(|| format!("cannot open {}", shm.display()))?
            .set_len(0)?;
        // The stream ends when the daemon dies; if it survives (the fault landed between
        // transactions and SQLite rebuilt its index), the turn ends normally.
        let status = match read_until(&mut s, &mut seen, is_turn_end).await {
            Ok(()) => d.child.try_wait()?,
            Err(e) if e.to_string().starts_with("no event within") => {
                bail!("the daemon neither died nor went on after the fault: {e}")
            }
            // The stream broke: the daemon is dying (its sockets close before it is reaped).
            Err(_) => Some(d.child.wait()?),
        };
        match status {
            Some(st) if st.signal() == Some(7) => {
                eprintln!("    the daemon died of SIGBUS after {} events", seen.len())
            }
            Some(st) => tally.fail("SIGBUS", format!("the daemon ended with {st}")),
            None => eprintln!("    the daemon survived the truncated -shm"),
        }
        d.kill9();
        let d = Daemon::start(bins, &w).await?;
        let mut c = d.client().await?;
        let log = history(&mut c, &id).await?;
        let n = check_against(tally, "SIGBUS", &seen, &log);
        // The store takes writes again: the session resumes and answers.
        c.resume_session(pb::ResumeSessionRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await?;
        let mut s = subscribe(&mut c, &id, log.len() as u64, true).await?;
        send(&mut c, &id, "fake:echo").await?;
        let mut after = Vec::new();
        read_until(&mut s, &mut after, is_turn_end).await?;
        tally.ran("SIGBUS", n);
        Ok(())
    })
}
