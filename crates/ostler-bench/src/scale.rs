//! Item `scale` (issue 12's first target): many stored sessions, some live, on one daemon.
//!
//! 1. A daemon on a fresh store runs one template session through a turn (the fake CLI) and
//!    is stopped; its empty-store RSS and idle CPU are the baselines.
//! 2. The template's rows (session, title, labels, events with their raw lines, turn usage)
//!    are copied into `stored - live` new sessions through the store's own write API, on the
//!    stopped daemon's database, with creation times spread over 30 days.
//! 3. The daemon starts again on that store; `live` sessions are created and run one turn
//!    each (so `stored` in all, `live` of them with a CLI process).
//! 4. Measured: the daemon's RSS (`VmRSS`, `VmHWM` of `/proc/<pid>/status`), its CPU over an
//!    idle window (`utime + stime` of `/proc/<pid>/stat`), and `ListSessions` pages of 500
//!    (first page, a deep page by cursor, filtered by state and by label), each next to its
//!    target and a same-run baseline (the empty daemon; a bare SQLite SELECT of the same
//!    page on a read-only connection).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ostler_proto::v1::{ListSessionsRequest, SessionState as PbState, StopSessionRequest};
use ostler_store::{NewEvent, NewSession, SessionState, Store, StoreOptions, TurnUsage};

use super::{Client, Daemon, Opts, Row, create, row, send, subscribe, until_turn_end};

/// Sizes of one run.
struct Plan {
    /// Sessions in the store, live ones included.
    stored: usize,
    /// Sessions with a CLI process.
    live: usize,
    /// The idle window over which CPU is measured.
    idle: Duration,
    /// `ListSessions` calls per measured page.
    calls: usize,
}

/// Distinct values of the `team` label of the seeded sessions (a label page filter matches
/// one in this many).
const TEAMS: usize = 10;

/// The page size measured (the API's maximum).
const PAGE: u32 = 500;

pub(crate) async fn scale(o: &Opts) -> Result<Vec<Row>> {
    let plan = Plan {
        stored: 10_000,
        live: 100,
        idle: Duration::from_secs(if o.quick { 10 } else { 30 }),
        calls: 50,
    };
    let mut rows = Vec::new();

    // 1. The empty daemon (baselines) and the template session.
    let d = Daemon::start(o).await?;
    let mut c = d.client().await?;
    let empty_rss = proc_status(d.child.id())?;
    let empty_cpu = idle_cpu(d.child.id(), plan.idle).await?;
    let template = create(&mut c, &d).await?;
    let mut s = subscribe(&mut c, &template, false, true).await?;
    send(&mut c, &template, "hello").await?;
    until_turn_end(&mut s, |_| {}).await?;
    drop(s);
    c.stop_session(StopSessionRequest {
        session_id: template.clone(),
    })
    .await?;
    drop(c);
    let dir = d.stop()?.context("the daemon's directory")?;

    // 2. The stored sessions.
    let store_path = dir.path().join("ostler.db");
    let seeded = plan.stored - plan.live;
    let path = store_path.clone();
    let tpl = template.clone();
    let (seed_secs, seeded_events) =
        tokio::task::spawn_blocking(move || seed(&path, &tpl, seeded)).await??;
    rows.push(row(
        "scale",
        &format!("seed {seeded} stored sessions through the store API (template: one turn)"),
        format!("{seed_secs:.1} s"),
        format!("{seeded_events} events"),
        format!("{:.0} sessions/s", seeded as f64 / seed_secs),
    ));

    // 3. The daemon on that store, `live` sessions made live.
    let t = Instant::now();
    let d = Daemon::start_in(o, dir, "").await?;
    let start_secs = t.elapsed().as_secs_f64();
    let stored_rss = proc_status(d.child.id())?;
    let c = d.client().await?;
    make_live(&c, &d, plan.live).await?;
    let live_now = count_state(&c, PbState::Idle).await?;
    if live_now != plan.live {
        bail!(
            "{live_now} sessions are idle after making {} live",
            plan.live
        );
    }
    let clis = children(d.child.id());
    if clis != plan.live {
        bail!(
            "the daemon has {clis} child processes for {} live sessions",
            plan.live
        );
    }
    rows.push(row(
        "scale",
        &format!("daemon start to ready on {} stored sessions", seeded + 1),
        format!("{start_secs:.2} s"),
        String::new(),
        String::new(),
    ));

    // 4. Measurements.
    let full_cpu = idle_cpu(d.child.id(), plan.idle).await?;
    let full_rss = proc_status(d.child.id())?;
    let mb = |kb: u64| format!("{:.1} MB", kb as f64 / 1024.0);
    rows.push(row(
        "scale",
        &format!(
            "daemon RSS, {} stored / {} live (VmRSS; VmHWM = peak)",
            plan.stored, plan.live
        ),
        format!("{} (peak {})", mb(full_rss.rss_kb), mb(full_rss.hwm_kb)),
        format!(
            "empty store {}; {} stored, none live {}",
            mb(empty_rss.rss_kb),
            seeded + 1,
            mb(stored_rss.rss_kb)
        ),
        format!(
            "target 200 MB: {}",
            if full_rss.hwm_kb <= 200 * 1024 {
                "met"
            } else {
                "MISSED"
            }
        ),
    ));
    rows.push(row(
        "scale",
        &format!(
            "daemon CPU while idle for {} s, {} stored / {} live ({} threads)",
            plan.idle.as_secs(),
            plan.stored,
            plan.live,
            full_cpu.threads
        ),
        format!(
            "{:.2} % of a core ({} ticks)",
            full_cpu.percent, full_cpu.ticks
        ),
        format!(
            "empty store {:.2} % ({} ticks)",
            empty_cpu.percent, empty_cpu.ticks
        ),
        format!(
            "target ~0 (< 1 %): {}",
            if full_cpu.percent < 1.0 {
                "met"
            } else {
                "MISSED"
            }
        ),
    ));
    rows.extend(list_pages(&c, &store_path, &plan).await?);
    drop(c);
    d.stop()?;
    Ok(rows)
}

/// Copies the template session into `n` new sessions; (seconds, events written).
fn seed(store: &Path, template: &str, n: usize) -> Result<(f64, u64)> {
    let st = Store::open(store, StoreOptions::default())?;
    let rec = st.get_session(template)?;
    let events = st.events_after(template, 0, 100_000)?;
    let turns = st.usage(template)?.turns;
    if events.is_empty() {
        bail!("the template session has no events");
    }
    let title = rec.title.clone().unwrap_or_else(|| "hello".into());
    let span_ms: i64 = 30 * 24 * 3600 * 1000;
    let first_ms = rec.created_ms - span_ms;
    let t = Instant::now();
    let mut written = 0u64;
    // Queued in chunks: the writer commits whatever is queued together (group commit).
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut tickets = Vec::new();
        let mut appends = Vec::new();
        let mut usage = Vec::new();
        for &i in chunk {
            let id = uuid::Uuid::now_v7().to_string();
            let created_ms = first_ms + span_ms * i as i64 / n as i64;
            let labels = BTreeMap::from([
                ("bench".to_string(), "scale".to_string()),
                ("team".to_string(), format!("t{}", i % TEAMS)),
            ]);
            tickets.push(st.create_session(NewSession {
                id: id.clone(),
                claude_session_id: Some(uuid::Uuid::new_v4().to_string()),
                cwd: rec.cwd.clone(),
                model: rec.model.clone(),
                permission_mode: rec.permission_mode.clone(),
                cli_release: rec.cli_release.clone(),
                state: if i % 7 == 0 {
                    SessionState::Exited
                } else {
                    SessionState::Stopped
                },
                labels,
                created_ms,
            }));
            tickets.push(st.set_title(&id, &title));
            let evs = events
                .iter()
                .map(|e| NewEvent {
                    kind: Cow::Owned(e.kind.to_string()),
                    payload: e.payload.clone(),
                    raw: e.raw.clone(),
                    ts_ms: created_ms + (e.ts_ms - rec.created_ms),
                })
                .collect::<Vec<_>>();
            written += evs.len() as u64;
            appends.push(st.append(&id, evs));
            for turn in &turns {
                let u = &turn.turn_usage;
                usage.push(st.record_turn_usage(
                    &id,
                    TurnUsage {
                        ts_ms: created_ms + (u.ts_ms - rec.created_ms),
                        ..u.clone()
                    },
                ));
            }
        }
        for tk in tickets {
            tk.wait()?;
        }
        for tk in appends {
            tk.wait()?;
        }
        for tk in usage {
            tk.wait()?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    drop(st);
    Ok((secs, written))
}

/// Creates `n` sessions and runs one turn in each, a few at a time; they stay live (idle).
async fn make_live(c: &Client, d: &Daemon, n: usize) -> Result<()> {
    let mut left = n;
    while left > 0 {
        let batch = left.min(10);
        left -= batch;
        let mut tasks = Vec::new();
        for _ in 0..batch {
            let mut c = c.clone();
            let sid = create(&mut c, d).await?;
            tasks.push(tokio::spawn(async move {
                let mut s = subscribe(&mut c, &sid, false, true).await?;
                send(&mut c, &sid, "hello").await?;
                until_turn_end(&mut s, |_| {}).await
            }));
        }
        for t in tasks {
            t.await??;
        }
    }
    Ok(())
}

/// How many sessions are in `state` (paging through `ListSessions`).
async fn count_state(c: &Client, state: PbState) -> Result<usize> {
    let mut c = c.clone();
    let mut n = 0;
    let mut token = String::new();
    loop {
        let page = c
            .list_sessions(ListSessionsRequest {
                states: vec![state as i32],
                page_size: PAGE,
                page_token: token,
                ..Default::default()
            })
            .await?
            .into_inner();
        n += page.sessions.len();
        if page.next_page_token.is_empty() {
            return Ok(n);
        }
        token = page.next_page_token;
    }
}

/// The `ListSessions` rows: first page, a deep page, a state-filtered and a label-filtered
/// page; each the median and p99 of `plan.calls` calls, next to a bare SQLite SELECT of the
/// same rows.
async fn list_pages(c: &Client, store: &Path, plan: &Plan) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    // The cursor of the page that starts at ~90 % of the sessions.
    let deep_at = plan.stored * 9 / 10 / PAGE as usize;
    let mut token = String::new();
    let mut c0 = c.clone();
    for _ in 0..deep_at {
        token = c0
            .list_sessions(ListSessionsRequest {
                page_size: PAGE,
                page_token: token,
                ..Default::default()
            })
            .await?
            .into_inner()
            .next_page_token;
        if token.is_empty() {
            bail!("fewer than {} pages of {PAGE}", deep_at + 1);
        }
    }
    let cursor = token
        .split_once(':')
        .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id.to_string())))
        .with_context(|| format!("unexpected page token {token:?}"))?;
    let cases: Vec<(String, ListSessionsRequest, Bare)> = vec![
        (
            "first page".into(),
            ListSessionsRequest {
                page_size: PAGE,
                ..Default::default()
            },
            Bare::First,
        ),
        (
            format!("page {} (cursor)", deep_at + 1),
            ListSessionsRequest {
                page_size: PAGE,
                page_token: token.clone(),
                ..Default::default()
            },
            Bare::After(cursor.0, cursor.1.clone()),
        ),
        (
            "states = [STOPPED], first page".into(),
            ListSessionsRequest {
                page_size: PAGE,
                states: vec![PbState::Stopped as i32],
                ..Default::default()
            },
            Bare::State("stopped"),
        ),
        (
            format!("label team = t3 (1 in {TEAMS}), first page"),
            ListSessionsRequest {
                page_size: PAGE,
                labels: [("team".to_string(), "t3".to_string())].into(),
                ..Default::default()
            },
            Bare::Label("team", "t3"),
        ),
    ];
    let conn =
        rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    for (what, req, bare) in cases {
        let mut times = Vec::new();
        let mut got = 0;
        let mut bytes = 0;
        for _ in 0..plan.calls {
            let mut c = c.clone();
            let t = Instant::now();
            let page = c.list_sessions(req.clone()).await?.into_inner();
            times.push(t.elapsed());
            got = page.sessions.len();
            bytes = prost::Message::encoded_len(&page);
        }
        let mut base = Vec::new();
        let mut base_rows = 0;
        for _ in 0..plan.calls {
            let t = Instant::now();
            base_rows = bare.run(&conn)?;
            base.push(t.elapsed());
        }
        if base_rows != got {
            bail!("{what}: ListSessions returned {got} sessions, the bare SELECT {base_rows}");
        }
        let (p50, p99) = percentiles(&mut times);
        let (b50, _) = percentiles(&mut base);
        rows.push(row(
            "scale",
            &format!(
                "ListSessions of {got} of {} sessions ({} KB), {what}: p50 / p99 of {}",
                plan.stored,
                bytes / 1024,
                plan.calls
            ),
            format!("{} / {}", ms(p50), ms(p99)),
            format!("bare SQLite SELECT of the same rows {}", ms(b50)),
            format!(
                "{:.1}x; target 50 ms: {}",
                p50.as_secs_f64() / b50.as_secs_f64().max(1e-9),
                if p99 <= Duration::from_millis(50) {
                    "met"
                } else {
                    "MISSED"
                }
            ),
        ));
    }
    Ok(rows)
}

/// The baseline query of one page: the same rows and columns as the store's listing,
/// selected without the per-row work (last seq, labels).
enum Bare {
    First,
    After(i64, String),
    State(&'static str),
    Label(&'static str, &'static str),
}

impl Bare {
    fn run(&self, conn: &rusqlite::Connection) -> Result<usize> {
        const COLS: &str = "s.pk, s.id, s.claude_session_id, s.cwd, s.model, s.permission_mode, \
            s.cli_release, s.state, s.created_ms, s.updated_ms, s.title";
        let limit = PAGE as i64;
        let (sql, args): (String, Vec<rusqlite::types::Value>) = match self {
            Bare::First => (
                format!("SELECT {COLS} FROM sessions s ORDER BY s.created_ms, s.id LIMIT ?1"),
                vec![limit.into()],
            ),
            Bare::After(ms, id) => (
                format!(
                    "SELECT {COLS} FROM sessions s WHERE (s.created_ms, s.id) > (?2, ?3) \
                     ORDER BY s.created_ms, s.id LIMIT ?1"
                ),
                vec![limit.into(), (*ms).into(), id.clone().into()],
            ),
            Bare::State(state) => (
                format!(
                    "SELECT {COLS} FROM sessions s WHERE s.state = ?2 \
                     ORDER BY s.created_ms, s.id LIMIT ?1"
                ),
                vec![limit.into(), state.to_string().into()],
            ),
            Bare::Label(k, v) => (
                format!(
                    "SELECT {COLS} FROM session_labels l JOIN sessions s ON s.pk = l.session_pk \
                     WHERE l.key = ?2 AND l.value = ?3 ORDER BY s.created_ms, s.id LIMIT ?1"
                ),
                vec![limit.into(), k.to_string().into(), v.to_string().into()],
            ),
        };
        let mut st = conn.prepare_cached(&sql)?;
        let mut rows = st.query(rusqlite::params_from_iter(args))?;
        let mut n = 0;
        let mut bytes = 0usize;
        while let Some(r) = rows.next()? {
            n += 1;
            for i in 0..11 {
                if let rusqlite::types::ValueRef::Text(t) = r.get_ref(i)? {
                    bytes += t.len();
                }
            }
        }
        std::hint::black_box(bytes);
        Ok(n)
    }
}

/// Median and p99 (sorts `v`).
fn percentiles(v: &mut [Duration]) -> (Duration, Duration) {
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.99))
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

struct Mem {
    rss_kb: u64,
    hwm_kb: u64,
}

/// `VmRSS` and `VmHWM` of a process.
fn proc_status(pid: u32) -> Result<Mem> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok(Mem {
        rss_kb: field("VmRSS:")?,
        hwm_kb: field("VmHWM:")?,
    })
}

struct Cpu {
    ticks: u64,
    percent: f64,
    threads: u64,
}

/// `utime + stime` and the thread count of a process (`/proc/<pid>/stat`).
fn proc_stat(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    super::ticks_and_threads(&text).with_context(|| format!("unreadable /proc/{pid}/stat"))
}

/// The CPU a process uses over `window` (which the caller keeps idle).
async fn idle_cpu(pid: u32, window: Duration) -> Result<Cpu> {
    let hz = clock_ticks();
    let (before, _) = proc_stat(pid)?;
    let t = Instant::now();
    // The measurement window itself: nothing to wait for, the point is that nothing happens.
    tokio::time::sleep(window).await;
    let (after, threads) = proc_stat(pid)?;
    let secs = t.elapsed().as_secs_f64();
    let ticks = after.saturating_sub(before);
    Ok(Cpu {
        ticks,
        percent: ticks as f64 / hz as f64 / secs * 100.0,
        threads,
    })
}

/// `CLK_TCK` (the unit of `utime`/`stime`); 100 on every Linux this runs on, read anyway.
fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// Processes whose parent is `pid` (the daemon's CLI processes).
fn children(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok())
                == Some(pid)
        })
        .count()
}
