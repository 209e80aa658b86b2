//! `ostler-bench`: end-to-end benchmarks of the real daemon (`ostler serve` on a temporary
//! store, sessions running `ostler-fake-claude`) measured from a Rust tonic client on
//! loopback, each printed next to baselines measured in the same run. Run it through
//! `cargo xtask bench [--quick]`, which builds the binaries in release first; see
//! docs/performance.md for what each row means.
//!
//! Usage: `ostler-bench --ostler PATH --fake PATH [--quick] [--only a,c,scale,...] [--sync normal|full] [--rounds N] [--no-sdk]` (`--help` lists all)
//!
//! `--rounds N` runs items a, b, c and e N times (each round with its own daemon and its
//! own baselines) and ends with the median of each target's figure over the rounds: on a
//! small shared machine one round's figure can be twice the next one's.
//!
//! `--base-ostler PATH` measures a second daemon build (e.g. the main branch's) in the same
//! rounds, alternating with `--ostler`, and ends with this build's figures over the base
//! build's, round by round: a regression check in which both builds see the same phases of
//! the machine.
//!
//! `--callgrind` counts item a (or b) in instructions instead (the daemon under valgrind's
//! callgrind; see `callgrind.rs`): a figure that repeats within ~1 %.

#![allow(clippy::disallowed_methods)] // starts the daemon and the fake CLI

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use ostler_proto::v1::session_event::Payload;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_proto::v1::{
    CreateSessionRequest, MessageContent, SendMessageRequest, SessionEvent, SubscribeRequest,
    message_content,
};
use tonic::transport::Channel;

mod callgrind;
mod partials;
mod resume;
mod scale;
mod sdk;

type Client = SessionServiceClient<Channel>;
type Stream = tonic::Streaming<SessionEvent>;

/// A guard against hangs (not a measurement).
const GUARD: Duration = Duration::from_secs(600);

#[derive(Clone)]
struct Opts {
    ostler: PathBuf,
    fake: PathBuf,
    quick: bool,
    only: Option<Vec<String>>,
    sync: String,
    /// The client's tokio worker threads (0 = a current-thread runtime); tokio's default
    /// (one per core) when not given.
    client_threads: Option<usize>,
    /// Rounds of items a, b, c and e (at least 1).
    rounds: usize,
    /// `OSTLER_*` variables set for the daemon (its environment is cleared otherwise).
    daemon_env: Vec<(String, String)>,
    /// Where the Agent SDKs of items a's and c's in-process baselines are installed
    /// (`None`: `--no-sdk`, not measured).
    sdk_dir: Option<PathBuf>,
    /// A second daemon build measured in the same rounds of items a, b, c and e
    /// (`--base-ostler`), alternating with `ostler`.
    base: Option<PathBuf>,
    /// `--callgrind`: item a (or, with `--only b`, item b) counted in instructions, the
    /// daemon under callgrind.
    callgrind: bool,
}

impl Opts {
    fn wants(&self, item: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == item))
    }
}

/// The items `--only` may name.
const ITEMS: [&str; 9] = ["a", "b", "c", "d", "e", "f", "g", "resume", "scale"];

const USAGE: &str = "\
usage: ostler-bench --ostler PATH --fake PATH [options]
  (usually run through `cargo xtask bench`; docs/performance.md describes each item)

  --ostler PATH          the daemon binary to measure (`ostler serve` on a temporary store)
  --fake PATH            the test kit's fake CLI (`ostler-fake-claude`)
  --quick                20k-line firehoses, no 1M replay, a 10 s latency run
  --only a,b,...         items to run: a b c d e f g resume scale (default: all)
  --sync normal|full     the daemon's store.synchronous (default: normal)
  --client-threads N     the client's tokio workers (0: one current-thread runtime)
  --rounds N             run items a, b, c and e N times and print their medians
  --daemon-env K=V       set OSTLER_* variable K for the daemon, e.g.
                         OSTLER_RUNTIME__WORKER_THREADS=1 (repeatable; the daemon's
                         environment is otherwise cleared, so the caller's is not seen)
  --sdk-dir DIR          where the baselines of items a and c, the official Agent SDKs
                         (TypeScript with npm, Python in a virtual environment), are
                         installed on first use (default: agent-sdk next to the fake's
                         directory, i.e. target/agent-sdk)
  --no-sdk               leave the Agent SDK baselines out
  --base-ostler PATH     a second daemon build (e.g. the main branch's) measured in the
                         same rounds of items a, b, c and e, alternating with --ostler
                         (which one goes first alternates too); ends with this build's
                         figures over the base build's, round by round
  --callgrind            instead of the items: the daemon's instructions per event in
                         item a's firehose (with --only b: item b's 16 firehoses at
                         once, N/16 lines each), under valgrind's callgrind, next to a
                         serde_json Value loop's per line (and the base build's, with
                         --base-ostler); counts repeat within ~1 %, wall-clock rounds
                         do not
  -h, --help             this text";

fn parse_opts() -> Result<Opts> {
    let mut ostler = None;
    let mut fake = None;
    let mut quick = false;
    let mut only = None;
    let mut sync = "normal".to_string();
    let mut client_threads = None;
    let mut rounds = 1;
    let mut daemon_env = Vec::new();
    let mut sdk_dir = None;
    let mut no_sdk = false;
    let mut base = None;
    let mut callgrind = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ostler" => ostler = args.next().map(PathBuf::from),
            "--fake" => fake = args.next().map(PathBuf::from),
            "--quick" => quick = true,
            "--only" => {
                let items: Vec<String> = args
                    .next()
                    .context("--only needs a list of items, e.g. a,c")?
                    .split(',')
                    .map(str::to_string)
                    .collect();
                if let Some(bad) = items.iter().find(|i| !ITEMS.contains(&i.as_str())) {
                    bail!(
                        "--only: no item {bad:?}; the items are {}",
                        ITEMS.join(", ")
                    );
                }
                only = Some(items);
            }
            "--sync" => sync = args.next().context("--sync needs normal or full")?,
            "--client-threads" => {
                client_threads =
                    args.next().and_then(|n| n.parse().ok()).map(Some).context(
                        "--client-threads needs a number (0 = one current-thread runtime)",
                    )?
            }
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n >= 1)
                    .context("--rounds needs a number of at least 1")?
            }
            "--daemon-env" => {
                let kv = args.next().context("--daemon-env needs OSTLER_KEY=VALUE")?;
                match kv.split_once('=') {
                    Some((k, v)) if k.starts_with("OSTLER_") => {
                        daemon_env.push((k.to_string(), v.to_string()))
                    }
                    _ => bail!(
                        "--daemon-env: {kv:?} is not OSTLER_KEY=VALUE (e.g. OSTLER_RUNTIME__WORKER_THREADS=1)"
                    ),
                }
            }
            "--sdk-dir" => {
                sdk_dir = Some(PathBuf::from(
                    args.next().context("--sdk-dir needs a directory")?,
                ))
            }
            "--no-sdk" => no_sdk = true,
            "--base-ostler" => {
                base = Some(PathBuf::from(
                    args.next().context("--base-ostler needs a daemon binary")?,
                ))
            }
            "--callgrind" => callgrind = true,
            "--value-loop" => {
                // Internal: the Value loop that `--callgrind` counts, in a process of its own.
                let file = args.next().context("--value-loop needs a file of lines")?;
                callgrind::value_loop_main(Path::new(&file))?;
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    // Absolute: the fake runs in other working directories.
    let abs = |p: PathBuf, what: &str| {
        std::fs::canonicalize(&p).with_context(|| format!("{what} {}", p.display()))
    };
    let one_of_a_b = |o: &Option<Vec<String>>| {
        o.as_deref()
            .is_none_or(|items| items == ["a"] || items == ["b"])
    };
    if callgrind && (!one_of_a_b(&only) || rounds > 1 || client_threads.is_some()) {
        bail!(
            "--callgrind counts item a (or, with --only b, item b) once, in place of the other \
             items: other --only lists, --rounds and --client-threads do not apply to it (counts \
             repeat within ~1 %, so one run is enough)"
        );
    }
    let fake = abs(fake.context("--fake PATH is required")?, "--fake")?;
    let sdk_dir = match (no_sdk, sdk_dir) {
        (true, _) => None,
        (false, Some(d)) => Some(std::path::absolute(d)?),
        // target/release/ostler-fake-claude -> target/agent-sdk
        (false, None) => fake
            .parent()
            .and_then(Path::parent)
            .map(|t| t.join("agent-sdk")),
    };
    Ok(Opts {
        ostler: abs(ostler.context("--ostler PATH is required")?, "--ostler")?,
        fake,
        quick,
        only,
        sync,
        client_threads,
        rounds,
        daemon_env,
        sdk_dir,
        base: base.map(|b| abs(b, "--base-ostler")).transpose()?,
        callgrind,
    })
}

/// One line of the result table.
struct Row {
    item: &'static str,
    what: String,
    value: String,
    baseline: String,
    ratio: String,
}

fn row(item: &'static str, what: &str, value: String, baseline: String, ratio: String) -> Row {
    println!("[{item}] {what}: {value} | {baseline} | {ratio}");
    Row {
        item,
        what: what.to_string(),
        value,
        baseline,
        ratio,
    }
}

fn main() -> Result<()> {
    let opts = parse_opts()?;
    let rt = match opts.client_threads {
        Some(0) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
    };
    let rows = if opts.callgrind {
        rt.block_on(async {
            let mut rows = Vec::new();
            callgrind::run(&opts, &mut rows).await.map(|()| rows)
        })?
    } else {
        rt.block_on(run(&opts))?
    };
    println!();
    println!(
        "ostler-bench ({}, synchronous={}); ratios are within this one run",
        if opts.quick { "quick" } else { "full" },
        opts.sync
    );
    println!("| item | measurement | ostler | baseline (same run) | ratio |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.item, r.what, r.value, r.baseline, r.ratio
        );
    }
    Ok(())
}

/// The targets' figures of each round (`--rounds`).
#[derive(Default)]
struct Tally {
    /// Item a: events/s over the same round's `Value` loop.
    a: Vec<f64>,
    /// Item a: events/s.
    a_rate: Vec<f64>,
    /// Item b: 16 sessions' total events/s.
    b_rate: Vec<f64>,
    /// Item a: events/s over the same round's in-process TypeScript Agent SDK.
    a_sdk: Vec<f64>,
    /// Item b: 16 sessions' total over one session's.
    b: Vec<f64>,
    /// Item c: p50, p99 and max (ns).
    c: Vec<(u64, u64, u64)>,
    /// Item c: p50 minus the same round's in-process TypeScript Agent SDK's p50 (ns).
    c_sdk: Vec<f64>,
    /// Item e: database bytes per stored event over the CLI line.
    e: Vec<f64>,
}

/// The median of `v` (the upper one of an even count).
fn median<T: Copy + PartialOrd>(v: &[T]) -> Option<T> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied()
}

/// The summary rows of `--rounds`: each target's median over the rounds, with every round's
/// figure.
fn medians(t: &Tally, rounds: usize, rows: &mut Vec<Row>) {
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // One row for a target that is a ratio per round.
    let ratio =
        |rows: &mut Vec<Row>, item: &'static str, values: &[f64], what: &str, target: &str| {
            if let Some(m) = median(values) {
                rows.push(row(
                    item,
                    &format!("median of {rounds} rounds: {what}"),
                    format!("{m:.2}x"),
                    format!("rounds {}", list(values)),
                    format!("target {target}"),
                ));
            }
        };
    ratio(rows, "a", &t.a, "firehose / Value loop", ">= 0.55x");
    ratio(
        rows,
        "a",
        &t.a_sdk,
        "firehose / TypeScript Agent SDK in process",
        "> 1x (ahead of the SDKs, durably)",
    );
    ratio(rows, "b", &t.b, "16 sessions / 1 session", ">= 1.6x");
    let pick = |f: fn(&(u64, u64, u64)) -> u64| t.c.iter().map(f).collect::<Vec<u64>>();
    if let (Some(p50), Some(p99), Some(max)) = (
        median(&pick(|x| x.0)),
        median(&pick(|x| x.1)),
        median(&pick(|x| x.2)),
    ) {
        rows.push(row(
            "c",
            &format!("median of {rounds} rounds: latency p50 / p99 / max"),
            format!("{} / {} / {}", fmt_us(p50), fmt_us(p99), fmt_us(max)),
            format!(
                "rounds p50 {}",
                pick(|x| x.0)
                    .iter()
                    .map(|&x| fmt_us(x))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "targets 150 µs / 2 ms / 10 ms".into(),
        ));
    }
    if let Some(m) = median(&t.c_sdk) {
        let list = t
            .c_sdk
            .iter()
            .map(|x| format!("{:+.0}", x / 1e3))
            .collect::<Vec<_>>()
            .join(", ");
        rows.push(row(
            "c",
            &format!(
                "median of {rounds} rounds: latency p50 minus the TypeScript Agent SDK's in process"
            ),
            format!("{:+.0} µs", m / 1e3),
            format!("rounds {list} µs"),
            "(what the durable, remote path adds)".into(),
        ));
    }
    ratio(
        rows,
        "e",
        &t.e,
        "database bytes per event / CLI line",
        "<= 1.2x",
    );
}

async fn run(o: &Opts) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut tally = Tally::default();
    let mut base_tally = Tally::default();
    // The base build runs without the Agent SDK baselines: they do not depend on the daemon.
    let base_opts = o.base.as_ref().map(|b| Opts {
        ostler: b.clone(),
        sdk_dir: None,
        ..o.clone()
    });
    for round in 1..=o.rounds {
        if o.rounds > 1 {
            println!("-- round {round} of {}", o.rounds);
        }
        // With a base build, which build goes first alternates from round to round.
        let base_first = round % 2 == 0;
        if let (Some(b), true) = (&base_opts, base_first) {
            round_items(b, &mut rows, &mut base_tally, true).await?;
        }
        round_items(o, &mut rows, &mut tally, false).await?;
        if let (Some(b), false) = (&base_opts, base_first) {
            round_items(b, &mut rows, &mut base_tally, true).await?;
        }
    }
    if o.rounds > 1 {
        println!("-- medians");
        medians(&tally, o.rounds, &mut rows);
        if base_opts.is_some() {
            let start = rows.len();
            medians(&base_tally, o.rounds, &mut rows);
            mark_base(&mut rows[start..]);
        }
    }
    if let Some(b) = &o.base {
        println!(
            "-- this build ({}) / the base build ({})",
            o.ostler.display(),
            b.display()
        );
        versus(&tally, &base_tally, &mut rows);
    }
    other_items(o, &mut rows).await?;
    Ok(rows)
}

/// One round of items a, b, e and c; the rows of the base build (`base`) are marked as such.
async fn round_items(o: &Opts, rows: &mut Vec<Row>, tally: &mut Tally, base: bool) -> Result<()> {
    if base {
        println!("-- base build: {}", o.ostler.display());
    } else if o.base.is_some() {
        println!("-- this build: {}", o.ostler.display());
    }
    let start = rows.len();
    firehose_items(o, rows, tally).await?;
    if o.wants("c") {
        latency_item(o, rows, tally).await?;
    }
    if base {
        mark_base(&mut rows[start..]);
    }
    Ok(())
}

fn mark_base(rows: &mut [Row]) {
    for r in rows {
        r.what = format!("base build: {}", r.what);
    }
}

/// The rows of `--base-ostler`: this build's figure over the base build's in each round
/// (both builds ran in that round, one after the other), and the median over the rounds.
fn versus(this: &Tally, base: &Tally, rows: &mut Vec<Row>) {
    let per_round = |rows: &mut Vec<Row>,
                     item: &'static str,
                     what: &str,
                     pairs: Vec<f64>,
                     fmt: &dyn Fn(f64) -> String| {
        if let Some(m) = median(&pairs) {
            rows.push(row(
                item,
                &format!("this build vs the base build: {what}"),
                fmt(m),
                format!(
                    "rounds {}",
                    pairs.iter().map(|&x| fmt(x)).collect::<Vec<_>>().join(", ")
                ),
                format!("median of {}", pairs.len()),
            ));
        }
    };
    let ratios = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>();
    let times = |x: f64| format!("{x:.2}x");
    per_round(
        rows,
        "a",
        "firehose events/s, this / base",
        ratios(&this.a_rate, &base.a_rate),
        &times,
    );
    per_round(
        rows,
        "b",
        "16 sessions' events/s, this / base",
        ratios(&this.b_rate, &base.b_rate),
        &times,
    );
    let diffs = |f: fn(&(u64, u64, u64)) -> u64| {
        this.c
            .iter()
            .zip(&base.c)
            .map(|(x, y)| f(x) as f64 - f(y) as f64)
            .collect::<Vec<_>>()
    };
    let us = |ns: f64| format!("{:+.0} µs", ns / 1e3);
    per_round(rows, "c", "latency p50, this - base", diffs(|x| x.0), &us);
    per_round(rows, "c", "latency p99, this - base", diffs(|x| x.1), &us);
    per_round(
        rows,
        "e",
        "database bytes per event, this / base",
        ratios(&this.e, &base.e),
        &times,
    );
}

/// Items a, b and e: the firehoses on one daemon, then the store's size.
async fn firehose_items(o: &Opts, rows: &mut Vec<Row>, tally: &mut Tally) -> Result<()> {
    let n: u64 = if o.quick { 20_000 } else { 100_000 };
    if o.wants("a") || o.wants("b") || o.wants("e") {
        let base = baselines(o, n)?;
        // The SDKs run before the daemon starts, on an otherwise idle machine, as the
        // loops above do.
        let mut sdks = Vec::new();
        if o.wants("a")
            && let Some(dir) = &o.sdk_dir
        {
            for s in sdk::Sdk::ALL {
                sdks.push((s, sdk::firehose(s, dir, &o.fake, n).await));
            }
        }
        let d = Daemon::start(o).await?;
        let mut c = d.client().await?;
        let io_before = d.write_bytes();
        let (events, secs, cpu) = firehose(&mut c, &d, n).await?;
        let io_after = d.write_bytes();
        let rate = events as f64 / secs;
        if o.wants("a") {
            rows.push(row(
                "a",
                &format!("firehose 1 session, {n} lines, events/s to the client"),
                fmt_rate(rate),
                format!("serde_json Value loop {}", fmt_rate(base.parse_rate)),
                format!("{:.2}x", rate / base.parse_rate),
            ));
            tally.a.push(rate / base.parse_rate);
            tally.a_rate.push(rate);
            rows.push(row(
                "a",
                "same vs a pipe read of the fake's output",
                fmt_rate(rate),
                format!("pipe {}", fmt_rate(base.pipe_rate)),
                format!("{:.2}x", rate / base.pipe_rate),
            ));
            rows.push(row(
                "a",
                "same vs a bare SQLite insert loop (256 rows/txn, WAL, NORMAL)",
                fmt_rate(rate),
                format!("insert {}", fmt_rate(base.insert_rate)),
                format!("{:.2}x", rate / base.insert_rate),
            ));
            for (s, r) in sdks {
                let what = format!(
                    "same vs the {} in process (the same fake CLI; nothing stored, no client)",
                    s.label()
                );
                match r {
                    Ok(m) => {
                        rows.push(row(
                            "a",
                            &what,
                            fmt_rate(rate),
                            format!(
                                "SDK {}, its CPU {:.1} µs per message",
                                fmt_rate(m.rate),
                                m.cpu_per_message * 1e6
                            ),
                            format!("{:.2}x", rate / m.rate),
                        ));
                        if s == sdk::Sdk::TypeScript {
                            tally.a_sdk.push(rate / m.rate);
                        }
                    }
                    Err(e) => rows.push(row(
                        "a",
                        &what,
                        fmt_rate(rate),
                        format!("not measured: {e:#}"),
                        "-".into(),
                    )),
                }
            }
            if let Some(cpu) = cpu {
                rows.push(cpu_row("a", &cpu, events, secs));
            }
        }
        if o.wants("b") {
            let per = n / 4;
            let (total, secs, cpu16) = concurrent_firehose(&mut c, &d, 16, per).await?;
            let rate16 = total as f64 / secs;
            rows.push(row(
                "b",
                &format!("16 sessions x {per} lines, total events/s"),
                fmt_rate(rate16),
                format!("1 session {}", fmt_rate(rate)),
                format!("{:.2}x", rate16 / rate),
            ));
            tally.b.push(rate16 / rate);
            tally.b_rate.push(rate16);
            if let Some(cpu) = cpu16 {
                rows.push(cpu_row("b", &cpu, total, secs));
            }
        }
        drop(c);
        let store = d.store.clone();
        let _dir = d.stop()?;
        if o.wants("e") {
            let s = store_sizes(&store)?;
            let line = base.line_bytes as f64;
            rows.push(row(
                "e",
                "database bytes per stored event (file after shutdown / events)",
                format!("{:.0} B", s.file_bytes as f64 / s.events as f64),
                format!("CLI line {line:.0} B"),
                format!("{:.2}x", s.file_bytes as f64 / s.events as f64 / line),
            ));
            tally.e.push(s.file_bytes as f64 / s.events as f64 / line);
            rows.push(row(
                "e",
                "column bytes per stored event (sum of all columns)",
                format!("{:.0} B", s.column_bytes as f64 / s.events as f64),
                format!("CLI line {line:.0} B"),
                format!("{:.2}x", s.column_bytes as f64 / s.events as f64 / line),
            ));
            if let (Some(b), Some(a)) = (io_before, io_after)
                && a > b
            {
                let per = (a - b) as f64 / events as f64;
                rows.push(row(
                    "e",
                    "daemon write_bytes per event during the firehose (WAL + checkpoints)",
                    format!("{per:.0} B"),
                    format!("CLI line {line:.0} B"),
                    format!("{:.2}x", per / line),
                ));
            }
        }
    }
    Ok(())
}

/// Item c: 1k events/s over 100 sessions, and the bare relay of the same lines.
async fn latency_item(o: &Opts, rows: &mut Vec<Row>, tally: &mut Tally) -> Result<()> {
    {
        let per_session: u64 = if o.quick { 100 } else { 300 };
        let d = Daemon::start(o).await?;
        let c = d.client().await?;
        let l = latency(&c, &d, 100, 10, per_session).await?;
        d.stop()?;
        tally.c.push((l.p50, l.p99, l.max));
        let relay = {
            let o = o.clone();
            tokio::task::spawn_blocking(move || relay_latency(&o, 1000, 100 * per_session))
                .await??
        };
        rows.push(row(
            "c",
            &format!(
                "latency CLI write -> client, 1k events/s over 100 sessions, {} events",
                l.samples
            ),
            format!(
                "p50 {} p99 {} max {}",
                fmt_us(l.p50),
                fmt_us(l.p99),
                fmt_us(l.max)
            ),
            "targets p50 150 µs, p99 2 ms, max 10 ms".to_string(),
            format!(
                "{} spikes > 5 ms in {} bursts, median burst interval {}",
                l.spikes,
                l.bursts,
                l.burst_interval_ms
                    .map(|m| format!("{m:.0} ms"))
                    .unwrap_or_else(|| "-".into())
            ),
        ));
        rows.push(row(
            "c",
            "same vs a bare relay of the fake's paced lines (pipe -> thread -> TCP loopback -> thread, nothing stored)",
            format!("p50 {} p99 {}", fmt_us(l.p50), fmt_us(l.p99)),
            format!("relay p50 {} p99 {}", fmt_us(relay.0), fmt_us(relay.1)),
            format!(
                "+{} at p50",
                fmt_us(l.p50.saturating_sub(relay.0))
            ),
        ));
        if let Some((cpu, secs)) = &l.cpu {
            // At low load the fixed cost of each wake-up dominates: compare with item a's.
            rows.push(cpu_row("c", cpu, l.samples as u64, *secs));
        }
        // The same sessions and pacing in one process of each Agent SDK (after the daemon
        // has stopped, so that the machine is as idle as for the daemon's run).
        if let Some(dir) = &o.sdk_dir {
            for s in sdk::Sdk::ALL {
                let what = format!(
                    "same vs the {} in process (100 sessions, the same fake CLIs and pacing; nothing stored, no client)",
                    s.label()
                );
                match sdk::latency(s, dir, &o.fake, 100, 10, per_session).await {
                    Ok(m) => {
                        let sp50 = percentile(&m.sorted_ns, 0.5);
                        let sp99 = percentile(&m.sorted_ns, 0.99);
                        let smax = m.sorted_ns.last().copied().unwrap_or(0);
                        if s == sdk::Sdk::TypeScript {
                            tally.c_sdk.push(l.p50 as f64 - sp50 as f64);
                        }
                        rows.push(row(
                            "c",
                            &what,
                            format!(
                                "p50 {} p99 {} max {}",
                                fmt_us(l.p50),
                                fmt_us(l.p99),
                                fmt_us(l.max)
                            ),
                            format!(
                                "SDK p50 {} p99 {} max {}, its CPU {:.0} µs per line",
                                fmt_us(sp50),
                                fmt_us(sp99),
                                fmt_us(smax),
                                m.cpu_per_line * 1e6
                            ),
                            format!("{:+.0} µs at p50", (l.p50 as f64 - sp50 as f64) / 1e3),
                        ));
                    }
                    Err(e) => rows.push(row(
                        "c",
                        &what,
                        format!("p50 {}", fmt_us(l.p50)),
                        format!("not measured: {e:#}"),
                        "-".into(),
                    )),
                }
            }
        }
    }
    Ok(())
}

/// Items d, f, g and the others: once, whatever `--rounds` says.
async fn other_items(o: &Opts, rows: &mut Vec<Row>) -> Result<()> {
    if o.wants("d") {
        let np: u64 = if o.quick { 20_000 } else { 100_000 };
        let d = Daemon::start(o).await?;
        let mut c = d.client().await?;
        let partials::Partials {
            keep,
            stalled,
            published,
        } = partials::partials(&mut c, &d, np).await?;
        rows.push(row(
            "d",
            &format!("partial deltas delivered to a client that keeps up, {np} sent"),
            format!("{} (told missed {})", keep.received, keep.missed),
            format!("{np} sent"),
            format!("{:.2}", keep.received as f64 / np as f64),
        ));
        rows.push(row(
            "d",
            "a client that reads only after both turns (warm-up and partials): received / told missed",
            format!("{} / {}", stalled.received, stalled.missed),
            format!("{published} sent"),
            format!(
                "{:.2} accounted for",
                (stalled.received + stalled.missed) as f64 / published as f64
            ),
        ));
        d.stop()?;
    }
    if o.wants("f") {
        let d = Daemon::start(o).await?;
        let mut c = d.client().await?;
        let sid = create(&mut c, &d).await?;
        let mut total = 0u64;
        let mut last_seq = 0u64;
        let sizes: &[u64] = if o.quick {
            &[100_000]
        } else {
            &[100_000, 1_000_000]
        };
        for &size in sizes {
            // From the log's end: the first size's turn must not count as the second's.
            let mut s = subscribe_after(&mut c, &sid, last_seq, false, true).await?;
            send(&mut c, &sid, &format!("fake:firehose {}", size - total)).await?;
            until_turn_end(&mut s, |_| {}).await?;
            drop(s);
            total = size;
            let t = Instant::now();
            let (replayed, last) = replay(&mut c, &sid).await?;
            last_seq = last;
            let secs = t.elapsed().as_secs_f64();
            let (rows_read, base) = sqlite_read_loop(&d.store)?;
            rows.push(row(
                "f",
                &format!("replay of {replayed} stored events through Subscribe"),
                format!("{secs:.3} s"),
                format!("bare SQLite read of {rows_read} rows {base:.3} s"),
                format!("{:.2}x the time", secs / base),
            ));
        }
        let store = d.store.clone();
        let _dir = d.stop()?;
        // The same events through the store's own read path (`events_after` pages, payloads
        // rebuilt from their one stored copy), on the stopped daemon's store.
        let st = ostler_store::Store::open(&store, ostler_store::StoreOptions::default())?;
        let (rows_read, base) = sqlite_read_loop(&store)?;
        for &size in sizes {
            let t = Instant::now();
            let read = store_read(&st, &sid, size)?;
            let secs = t.elapsed().as_secs_f64();
            rows.push(row(
                "f",
                &format!(
                    "replay of {read} stored events through the store (events_after, pages of 512)"
                ),
                format!("{secs:.3} s"),
                format!("bare SQLite read of {rows_read} rows {base:.3} s"),
                format!("{:.2}x the time", secs / base),
            ));
        }
    }
    if o.wants("g") {
        let d = Daemon::start(o).await?;
        let mut c = d.client().await?;
        let g = first_event(&mut c, &d, if o.quick { 10 } else { 30 }).await?;
        rows.push(row(
            "g",
            "SendMessage -> first CLI event, live idle session (p50 / max)",
            format!("{} / {}", fmt_us(g.live_p50), fmt_us(g.live_max)),
            format!("-> its UserMessage event {}", fmt_us(g.user_p50)),
            "baseline for suspend/resume".into(),
        ));
        rows.push(row(
            "g",
            "CreateSession with first prompt -> first CLI event (process start included, p50)",
            fmt_us(g.spawn_p50),
            format!("live session {}", fmt_us(g.live_p50)),
            format!("{:.1}x", g.spawn_p50 as f64 / g.live_p50.max(1) as f64),
        ));
        d.stop()?;
    }
    if o.wants("scale") {
        rows.extend(scale::scale(o).await?);
    }
    if o.wants("resume") {
        rows.extend(resume::resume(o).await?);
    }
    Ok(())
}

fn fmt_rate(r: f64) -> String {
    if r >= 10_000.0 {
        format!("{:.1}k/s", r / 1000.0)
    } else {
        format!("{r:.0}/s")
    }
}

fn fmt_us(ns: u64) -> String {
    if ns >= 10_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{} µs", ns / 1000)
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The daemon under test, on a temporary store.
struct Daemon {
    child: Child,
    addr: String,
    store: PathBuf,
    /// Handed back by [`Daemon::stop`] so that the store can be read afterwards.
    dir: Option<tempfile::TempDir>,
}

impl Daemon {
    async fn start(o: &Opts) -> Result<Daemon> {
        let dir = tempfile::Builder::new().prefix("ostler-bench-").tempdir()?;
        Self::start_in(o, dir, "").await
    }

    /// Starts the daemon on the store `ostler.db` in `dir` (a new one, or the one a previous
    /// daemon left there); `config` is appended to its config file.
    async fn start_in(o: &Opts, dir: tempfile::TempDir, config: &str) -> Result<Daemon> {
        let text = format!("[store]\nsynchronous = \"{}\"\n{config}", o.sync);
        let config = dir.path().join("config.toml");
        std::fs::write(&config, text)?;
        let store = dir.path().join("ostler.db");
        let ready = dir.path().join("ready");
        // A previous daemon's ready file would be read as this one's.
        let _ = std::fs::remove_file(&ready);
        let log = std::fs::File::create(dir.path().join("daemon.log"))?;
        let mut cmd = if o.callgrind {
            let mut c = Command::new("valgrind");
            c.args(callgrind::valgrind_args(dir.path())).arg(&o.ostler);
            c
        } else {
            Command::new(&o.ostler)
        };
        let child = cmd
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .arg("--store")
            .arg(&store)
            .arg("--claude")
            .arg(&o.fake)
            .arg("--ready-file")
            .arg(&ready)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .env("RUST_LOG", "warn")
            .envs(o.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", o.ostler.display()))?;
        let mut d = Daemon {
            child,
            addr: String::new(),
            store,
            dir: Some(dir),
        };
        let t = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready)
                && let Some(a) = text.lines().find_map(|l| l.strip_prefix("tcp://"))
            {
                d.addr = a.to_string();
                return Ok(d);
            }
            if let Some(status) = d.child.try_wait()? {
                bail!(
                    "the daemon exited ({status}) before it was ready:\n{}",
                    d.log()
                );
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("the daemon did not become ready:\n{}", d.log());
            }
            // Polling a file the daemon writes once: no event to wait on across processes.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn path(&self) -> &Path {
        self.store.parent().unwrap_or(Path::new("/"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("daemon.log")).unwrap_or_default()
    }

    async fn client(&self) -> Result<Client> {
        let ch = Channel::from_shared(format!("http://{}", self.addr))?
            .connect()
            .await?;
        Ok(SessionServiceClient::new(ch)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20))
    }

    /// `write_bytes` of the daemon process (bytes it caused to be sent to storage).
    fn write_bytes(&self) -> Option<u64> {
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.child.id())).ok()?;
        io.lines()
            .find_map(|l| l.strip_prefix("write_bytes: "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// SIGTERM (graceful: final checkpoint), then wait; returns the directory of the store.
    fn stop(mut self) -> Result<Option<tempfile::TempDir>> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t = Instant::now();
        while self.child.try_wait()?.is_none() {
            if t.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the daemon did not stop on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(self.dir.take())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn create(c: &mut Client, d: &Daemon) -> Result<String> {
    let s = c
        .create_session(CreateSessionRequest {
            cwd: d.path().to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(s.id)
}

async fn subscribe(c: &mut Client, sid: &str, partial: bool, follow: bool) -> Result<Stream> {
    subscribe_after(c, sid, 0, partial, follow).await
}

/// Subscribes after `after_seq`: [`until_turn_end`] starts at the first user message it
/// sees, so a session with earlier turns must be followed from its end, not from 0.
async fn subscribe_after(
    c: &mut Client,
    sid: &str,
    after_seq: u64,
    partial: bool,
    follow: bool,
) -> Result<Stream> {
    Ok(c.subscribe(SubscribeRequest {
        session_id: sid.to_string(),
        after_seq,
        include_partial: partial,
        follow,
    })
    .await?
    .into_inner())
}

async fn send(c: &mut Client, sid: &str, text: &str) -> Result<()> {
    c.send_message(SendMessageRequest {
        session_id: sid.to_string(),
        content: Some(MessageContent {
            content: Some(message_content::Content::Text(text.to_string())),
        }),
        client_message_id: String::new(),
        ..Default::default()
    })
    .await?;
    Ok(())
}

/// Reads until the next `TurnCompleted`, calling `f` on every event; returns the count of
/// events seen after the `UserMessage` that started the turn.
async fn until_turn_end(s: &mut Stream, mut f: impl FnMut(&SessionEvent)) -> Result<u64> {
    let mut n = 0u64;
    let mut started = false;
    loop {
        let ev = tokio::time::timeout(GUARD, s.message())
            .await
            .context("no event for 10 minutes")??
            .context("the stream ended before the turn did")?;
        match &ev.payload {
            Some(Payload::UserMessage(_)) if !started => {
                started = true;
                continue;
            }
            Some(Payload::ProcessExited(p)) => bail!("the CLI exited: {p:?}"),
            _ => {}
        }
        if !started {
            continue;
        }
        n += 1;
        f(&ev);
        if matches!(ev.payload, Some(Payload::TurnCompleted(_))) {
            return Ok(n);
        }
    }
}

/// One session, `n` firehose lines: (events received, seconds from SendMessage to the
/// turn's end, the CPU the three processes spent meanwhile where /proc tells).
async fn firehose(c: &mut Client, d: &Daemon, n: u64) -> Result<(u64, f64, Option<Cpu>)> {
    let sid = create(c, d).await?;
    let mut s = subscribe(c, &sid, false, true).await?;
    // Warm-up turn: the process is up and the subscription live.
    send(c, &sid, "hello").await?;
    until_turn_end(&mut s, |_| {}).await?;
    let before = Cpu::read(d.child.id());
    let t = Instant::now();
    send(c, &sid, &format!("fake:firehose {n}")).await?;
    let events = until_turn_end(&mut s, |_| {}).await?;
    let secs = t.elapsed().as_secs_f64();
    Ok((events, secs, Cpu::since(before, d.child.id())))
}

/// The row of a firehose's CPU per event: daemon / fake CLI / client, next to the wall time
/// per event, how many cores the three kept busy, and how much of the machine's CPU time the
/// host took meanwhile (a virtual machine's steal time: rounds where it is high ran on a
/// host busy with others, and their rates say more about the host than about the daemon).
fn cpu_row(item: &'static str, cpu: &Cpu, events: u64, secs: f64) -> Row {
    let per = |ticks: u64| {
        format!(
            "{:.1} µs",
            (ticks * TICK_NS) as f64 / 1e3 / events.max(1) as f64
        )
    };
    row(
        item,
        "same: CPU per event (daemon / fake CLI / this client)",
        format!(
            "{} / {} / {}",
            per(cpu.daemon),
            per(cpu.cli),
            per(cpu.client)
        ),
        format!("wall {:.1} µs", secs * 1e6 / events.max(1) as f64),
        format!(
            "{:.2} cores{}",
            (cpu.daemon + cpu.cli + cpu.client) as f64 * TICK_NS as f64 / (secs * 1e9),
            match cpu.cpus {
                0 => String::new(),
                n => format!(
                    "; host steal {:.0} % of {n} CPUs",
                    cpu.steal as f64 * TICK_NS as f64 * 100.0 / (secs * 1e9 * f64::from(n))
                ),
            }
        ),
    )
}

/// `utime + stime` (in clock ticks) and the thread count, from the text of a process's
/// `/proc/<pid>/stat`.
fn ticks_and_threads(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) may hold spaces and parentheses; the fields after its last
    // `)` are plain. They start at field 3 (state): utime is field 14, stime 15,
    // num_threads 20.
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i - 3)?.parse::<u64>().ok();
    Some((num(14)? + num(15)?, num(20)?))
}

/// The machine's steal time in ticks (all CPUs together) and the number of CPUs, from the
/// text of `/proc/stat` (`cpu  user nice system idle iowait irq softirq steal ...`, then a
/// `cpuN` line per CPU).
fn steal_of(proc_stat: &str) -> Option<(u64, u32)> {
    let mut lines = proc_stat.lines();
    let total = lines.next()?.strip_prefix("cpu ")?;
    let steal = total.split_whitespace().nth(7)?.parse().ok()?;
    let cpus = lines
        .take_while(|l| l.starts_with("cpu"))
        .filter(|l| l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    Some((steal, u32::try_from(cpus).ok()?))
}

/// Nanoseconds per clock tick of /proc's CPU times (`USER_HZ`, 100 on Linux).
const TICK_NS: u64 = 10_000_000;

/// CPU time (user + system, in ticks) of the daemon, its CLI child and this process.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    daemon: u64,
    cli: u64,
    client: u64,
    /// The machine's steal time, and its CPUs (both 0 where /proc/stat does not say).
    steal: u64,
    cpus: u32,
}

impl Cpu {
    fn read(daemon: u32) -> Option<Cpu> {
        let ticks = |pid: &str| -> Option<u64> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            ticks_and_threads(&stat).map(|(ticks, _)| ticks)
        };
        // A child is listed under the thread that spawned it.
        let mut cli = 0;
        for task in std::fs::read_dir(format!("/proc/{daemon}/task")).ok()? {
            let path = task.ok()?.path().join("children");
            let children = std::fs::read_to_string(path).unwrap_or_default();
            for pid in children.split_whitespace() {
                cli += ticks(pid).unwrap_or(0);
            }
        }
        let (steal, cpus) = std::fs::read_to_string("/proc/stat")
            .ok()
            .as_deref()
            .and_then(steal_of)
            .unwrap_or((0, 0));
        Some(Cpu {
            daemon: ticks(&daemon.to_string())?,
            cli,
            client: ticks("self")?,
            steal,
            cpus,
        })
    }

    /// What was spent since `before` (read with [`Cpu::read`]), if both readings exist.
    fn since(before: Option<Cpu>, daemon: u32) -> Option<Cpu> {
        let (b, a) = (before?, Cpu::read(daemon)?);
        Some(Cpu {
            daemon: a.daemon.saturating_sub(b.daemon),
            cli: a.cli.saturating_sub(b.cli),
            client: a.client.saturating_sub(b.client),
            steal: a.steal.saturating_sub(b.steal),
            cpus: a.cpus,
        })
    }
}

async fn concurrent_firehose(
    c: &mut Client,
    d: &Daemon,
    sessions: usize,
    per: u64,
) -> Result<(u64, f64, Option<Cpu>)> {
    let subs = warm_sessions(c, d, sessions).await?;
    let before = Cpu::read(d.child.id());
    let t = Instant::now();
    let total = firehoses(c, subs, per).await?;
    let secs = t.elapsed().as_secs_f64();
    Ok((total, secs, Cpu::since(before, d.child.id())))
}

/// `sessions` new sessions, each subscribed (stored events only) after a first turn.
async fn warm_sessions(
    c: &mut Client,
    d: &Daemon,
    sessions: usize,
) -> Result<Vec<(String, Stream)>> {
    let mut subs = Vec::new();
    for _ in 0..sessions {
        let sid = create(c, d).await?;
        let mut s = subscribe(c, &sid, false, true).await?;
        send(c, &sid, "hello").await?;
        until_turn_end(&mut s, |_| {}).await?;
        subs.push((sid, s));
    }
    Ok(subs)
}

/// A firehose of `per` lines in every session of `subs` at once; the events received in
/// all, once every session's turn has ended.
async fn firehoses(c: &Client, subs: Vec<(String, Stream)>, per: u64) -> Result<u64> {
    let mut tasks = Vec::new();
    for (sid, mut s) in subs {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            send(&mut c, &sid, &format!("fake:firehose {per}")).await?;
            until_turn_end(&mut s, |_| {}).await
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total)
}

struct Latency {
    samples: usize,
    p50: u64,
    p99: u64,
    max: u64,
    spikes: usize,
    bursts: usize,
    burst_interval_ms: Option<f64>,
    /// CPU spent while the paced lines flowed, and for how long (where /proc tells).
    cpu: Option<(Cpu, f64)>,
}

/// `sessions` sessions, each `fake:paced rate lines`, started evenly over one period.
async fn latency(
    c: &Client,
    d: &Daemon,
    sessions: usize,
    rate: u64,
    lines: u64,
) -> Result<Latency> {
    let mut c0 = c.clone();
    let mut subs = Vec::new();
    for _ in 0..sessions {
        let sid = create(&mut c0, d).await?;
        let mut s = subscribe(&mut c0, &sid, false, true).await?;
        send(&mut c0, &sid, "hello").await?;
        until_turn_end(&mut s, |_| {}).await?;
        subs.push((sid, s));
    }
    let before = Cpu::read(d.child.id());
    let start = Instant::now();
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let mut tasks = Vec::new();
    for (i, (sid, mut s)) in subs.into_iter().enumerate() {
        let mut c = c.clone();
        let at =
            start + period * u32::try_from(i).unwrap_or(0) / u32::try_from(sessions).unwrap_or(1);
        tasks.push(tokio::spawn(async move {
            // Spread the sessions' lines evenly over the period (pacing, not synchronisation).
            tokio::time::sleep_until(at.into()).await;
            send(&mut c, &sid, &format!("fake:paced {rate} {lines}")).await?;
            let mut got: Vec<(u64, u64)> = Vec::new();
            until_turn_end(&mut s, |ev| {
                let now = now_ns();
                if let Some(Payload::AssistantBlock(b)) = &ev.payload
                    && let Some(ostler_proto::v1::assistant_block::Block::Text(t)) = &b.block
                    && let Some(sent) = sent_ns_of(&t.text)
                {
                    got.push((now, now.saturating_sub(sent)));
                }
            })
            .await?;
            anyhow::Ok(got)
        }));
    }
    let mut all: Vec<(u64, u64)> = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let cpu = Cpu::since(before, d.child.id()).map(|c| (c, start.elapsed().as_secs_f64()));
    if all.is_empty() {
        bail!("no paced events received");
    }
    let mut lat: Vec<u64> = all.iter().map(|x| x.1).collect();
    lat.sort_unstable();
    let pct = |p: f64| percentile(&lat, p);
    // Bursts: latencies over 5 ms, grouped when less than 100 ms apart.
    let mut spikes: Vec<u64> = all
        .iter()
        .filter(|x| x.1 > 5_000_000)
        .map(|x| x.0)
        .collect();
    spikes.sort_unstable();
    let mut bursts: Vec<u64> = Vec::new();
    for t in &spikes {
        if bursts.last().is_none_or(|b| t - b > 100_000_000) {
            bursts.push(*t);
        }
    }
    let mut gaps: Vec<f64> = bursts
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 / 1e6)
        .collect();
    gaps.sort_by(f64::total_cmp);
    Ok(Latency {
        samples: lat.len(),
        p50: pct(0.50),
        p99: pct(0.99),
        max: *lat.last().unwrap_or(&0),
        spikes: spikes.len(),
        bursts: bursts.len(),
        burst_interval_ms: gaps.get(gaps.len() / 2).copied(),
        cpu,
    })
}

/// The write time (ns since the epoch) a paced line of the fake carries after `sent_ns=`.
fn sent_ns_of(text: &str) -> Option<u64> {
    let digits = text.split("sent_ns=").nth(1)?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// The value at fraction `p` (0..=1) of the non-empty, sorted `sorted`.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The floor of item c on this machine: the fake's paced lines (`rate` per second, `lines` of
/// them) read from its stdout by one thread, written to a TCP loopback socket, read by another
/// thread, which takes the time as the client does. The same hops as the daemon's path
/// (pipe wake-up, TCP wake-up, one process in between) with nothing decoded, stored or
/// published. Returns (p50, p99) in ns.
fn relay_latency(o: &Opts, rate: u64, lines: u64) -> Result<(u64, u64)> {
    use std::io::{BufRead, BufReader};
    let home = tempfile::Builder::new()
        .prefix("ostler-bench-relay-")
        .tempdir()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> Result<Vec<u64>> {
        let (sock, _) = listener.accept()?;
        sock.set_nodelay(true)?;
        let mut lat = Vec::new();
        for line in BufReader::new(sock).lines() {
            let line = line?;
            let now = now_ns();
            if let Some(sent) = sent_ns_of(&line) {
                lat.push(now.saturating_sub(sent));
            }
        }
        Ok(lat)
    });
    let (mut child, stdin) = bare_fake(o, home.path(), &format!("fake:paced {rate} {lines}"))?;
    let mut sock = std::net::TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    let mut out = BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = Vec::new();
    loop {
        line.clear();
        if out.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let paced = line.windows(8).any(|w| w == b"sent_ns=");
        if !paced
            && serde_json::from_slice::<serde_json::Value>(&line)
                .is_ok_and(|v| v["type"] == "result")
        {
            break;
        }
        sock.write_all(&line)?;
    }
    drop(stdin);
    drop(sock);
    let _ = child.kill();
    child.wait()?;
    let mut lat = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the relay's receiver panicked"))??;
    if lat.is_empty() {
        bail!("no paced lines relayed");
    }
    lat.sort_unstable();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

/// Replays the whole stored log: (events, the last seq).
async fn replay(c: &mut Client, sid: &str) -> Result<(u64, u64)> {
    let mut s = subscribe(c, sid, false, false).await?;
    let (mut n, mut last) = (0, 0);
    while let Some(ev) = tokio::time::timeout(GUARD, s.message())
        .await
        .context("replay stalled")??
    {
        n += 1;
        last = ev.seq;
    }
    Ok((n, last))
}

struct FirstEvent {
    live_p50: u64,
    live_max: u64,
    user_p50: u64,
    spawn_p50: u64,
}

async fn first_event(c: &mut Client, d: &Daemon, reps: usize) -> Result<FirstEvent> {
    let sid = create(c, d).await?;
    let mut s = subscribe(c, &sid, false, true).await?;
    send(c, &sid, "hello").await?;
    until_turn_end(&mut s, |_| {}).await?;
    let mut live = Vec::new();
    let mut user = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        send(c, &sid, "hello").await?;
        let mut first_user = None;
        let mut first_cli = None;
        loop {
            let ev = s.message().await?.context("stream ended")?;
            match ev.payload {
                Some(Payload::UserMessage(_)) => {
                    first_user.get_or_insert(t.elapsed());
                }
                Some(Payload::TurnCompleted(_)) => break,
                Some(_) if first_user.is_some() => {
                    first_cli.get_or_insert(t.elapsed());
                }
                _ => {}
            }
        }
        user.push(first_user.context("no UserMessage")?.as_nanos() as u64);
        live.push(first_cli.context("no CLI event")?.as_nanos() as u64);
    }
    let mut spawn = Vec::new();
    for _ in 0..reps.min(10) {
        let t = Instant::now();
        let sess = c
            .create_session(CreateSessionRequest {
                cwd: d.path().to_string_lossy().into_owned(),
                first_prompt: Some(MessageContent {
                    content: Some(message_content::Content::Text("hello".into())),
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut s = subscribe(c, &sess.id, false, true).await?;
        let mut seen_user = false;
        loop {
            let ev = s.message().await?.context("stream ended")?;
            match ev.payload {
                Some(Payload::UserMessage(_)) => seen_user = true,
                Some(Payload::SessionStarted(_)) | Some(Payload::AssistantBlock(_))
                    if seen_user =>
                {
                    spawn.push(t.elapsed().as_nanos() as u64);
                    break;
                }
                _ => {}
            }
        }
    }
    let med = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    Ok(FirstEvent {
        live_p50: med(&mut live),
        live_max: *live.iter().max().unwrap_or(&0),
        user_p50: med(&mut user),
        spawn_p50: med(&mut spawn),
    })
}

/// Same-run baselines over the fake's own firehose output.
struct Baselines {
    pipe_rate: f64,
    parse_rate: f64,
    insert_rate: f64,
    /// Average size of one firehose line (with its newline).
    line_bytes: u64,
}

fn baselines(o: &Opts, n: u64) -> Result<Baselines> {
    let home = tempfile::Builder::new()
        .prefix("ostler-bench-pipe-")
        .tempdir()?;
    let (bytes, pipe_secs) = fake_output(o, home.path(), n)?;
    let body = firehose_body(&bytes, n)?;
    let body = &body[..];
    let body_bytes: u64 = body.iter().map(|l| l.len() as u64 + 1).sum();
    let t = Instant::now();
    let count = callgrind::parse_lines(body)?;
    let parse_secs = t.elapsed().as_secs_f64();
    debug_assert_eq!(count, n);
    let insert_rate = insert_loop(home.path(), body)?;
    Ok(Baselines {
        pipe_rate: n as f64 / pipe_secs,
        parse_rate: n as f64 / parse_secs,
        insert_rate,
        line_bytes: body_bytes / n.max(1),
    })
}

/// The fake CLI's whole output for `fake:firehose n`, run directly in `home`, and the
/// seconds from its message written (the process already started) to the last line read.
fn fake_output(o: &Opts, home: &Path, n: u64) -> Result<(Vec<u8>, f64)> {
    let (mut child, stdin) = bare_fake(o, home, &format!("fake:firehose {n}"))?;
    let t = Instant::now();
    drop(stdin);
    let mut bytes = Vec::new();
    child
        .stdout
        .take()
        .context("the fake's stdout")?
        .read_to_end(&mut bytes)?;
    let secs = t.elapsed().as_secs_f64();
    child.wait()?;
    Ok((bytes, secs))
}

/// The lines of [`fake_output`] that item a stores as events (the output is init, status,
/// these, result).
fn firehose_body(bytes: &[u8], n: u64) -> Result<Vec<&[u8]>> {
    let mut lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() as u64 != n + 3 {
        bail!("the fake wrote {} lines for {n}", lines.len());
    }
    lines.pop();
    lines.drain(..2);
    Ok(lines)
}

/// The fake CLI run directly (no daemon) in `home`, its first user message `prompt` written;
/// its stdin is handed back open (dropping it ends the conversation).
fn bare_fake(o: &Opts, home: &Path, prompt: &str) -> Result<(Child, std::process::ChildStdin)> {
    let mut child = Command::new(&o.fake)
        .args(ostler_protocol::argv::StreamJsonArgs::session().into_args())
        .current_dir(home)
        .env_clear()
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the fake CLI")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let msg = serde_json::json!({"type": "user", "message": {"role": "user",
        "content": prompt}, "parent_tool_use_id": null, "session_id": ""});
    writeln!(stdin, "{msg}")?;
    Ok((child, stdin))
}

/// A bare SQLite insert loop: the lines as BLOBs, 256 rows per transaction.
fn insert_loop(dir: &Path, lines: &[&[u8]]) -> Result<f64> {
    let conn = rusqlite::Connection::open(dir.join("insert.db"))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(
        "CREATE TABLE e (s INTEGER NOT NULL, seq INTEGER NOT NULL, line BLOB NOT NULL, PRIMARY KEY (s, seq)) WITHOUT ROWID;",
    )?;
    let t = Instant::now();
    for (chunk_no, chunk) in lines.chunks(256).enumerate() {
        let tx = conn.unchecked_transaction()?;
        {
            let mut st = tx.prepare_cached("INSERT INTO e (s, seq, line) VALUES (1, ?1, ?2)")?;
            for (i, l) in chunk.iter().enumerate() {
                st.execute(rusqlite::params![(chunk_no * 256 + i) as i64, l])?;
            }
        }
        tx.commit()?;
    }
    Ok(lines.len() as f64 / t.elapsed().as_secs_f64())
}

struct Sizes {
    events: u64,
    file_bytes: u64,
    column_bytes: u64,
}

/// Sizes of a store after the daemon stopped (its WAL checkpointed).
fn store_sizes(store: &Path) -> Result<Sizes> {
    let file_bytes = std::fs::metadata(store)?.len()
        + std::fs::metadata(store.with_extension("db-wal"))
            .map(|m| m.len())
            .unwrap_or(0);
    let conn =
        rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let events: u64 = conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?;
    let (_, column_bytes) = read_all_events(&conn)?;
    Ok(Sizes {
        events: events.max(1),
        file_bytes,
        column_bytes,
    })
}

/// Reads every stored column of every row of `events` (whatever the schema; virtual
/// generated columns, which take no space, are left out); (rows, bytes).
fn read_all_events(conn: &rusqlite::Connection) -> Result<(u64, u64)> {
    let mut cols = Vec::new();
    {
        let mut info = conn.prepare("PRAGMA table_xinfo(events)")?;
        let mut rows = info.query([])?;
        while let Some(r) = rows.next()? {
            // hidden: 0 = ordinary, 2 = virtual generated, 3 = stored generated.
            if r.get::<_, i64>(6)? != 2 {
                cols.push(format!("\"{}\"", r.get::<_, String>(1)?));
            }
        }
    }
    let mut st = conn.prepare(&format!("SELECT {} FROM events", cols.join(", ")))?;
    let cols = st.column_count();
    let mut rows = st.query([])?;
    let (mut n, mut bytes) = (0u64, 0u64);
    while let Some(r) = rows.next()? {
        n += 1;
        for i in 0..cols {
            bytes += match r.get_ref(i)? {
                rusqlite::types::ValueRef::Blob(b) => b.len() as u64,
                rusqlite::types::ValueRef::Text(t) => t.len() as u64,
                rusqlite::types::ValueRef::Null => 0,
                _ => 8,
            };
        }
    }
    Ok((n, bytes))
}

/// Reads the first `n` events of a session through `Store::events_after`; returns how many.
fn store_read(store: &ostler_store::Store, sid: &str, n: u64) -> Result<u64> {
    let mut after = 0u64;
    let mut bytes = 0usize;
    while after < n {
        let page = store.events_after(sid, after, 512)?;
        let Some(last) = page.last() else { break };
        after = last.seq.min(n);
        bytes += page.iter().map(|e| e.payload.len()).sum::<usize>();
    }
    std::hint::black_box(bytes);
    Ok(after)
}

/// The baseline of item f: a bare read loop over all stored events (a second connection
/// while the daemon runs, as a client of the file).
fn sqlite_read_loop(store: &Path) -> Result<(u64, f64)> {
    let conn =
        rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let t = Instant::now();
    let (n, _) = read_all_events(&conn)?;
    Ok((n, t.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::{Tally, median, steal_of, ticks_and_threads, versus};

    #[test]
    fn versus_compares_the_two_builds_round_by_round() {
        let this = Tally {
            a_rate: vec![200e3, 150e3, 300e3],
            b_rate: vec![100e3, 100e3, 100e3],
            c: vec![
                (150_000, 900_000, 1),
                (120_000, 700_000, 1),
                (130_000, 800_000, 1),
            ],
            e: vec![0.6, 0.6, 0.6],
            ..Tally::default()
        };
        let base = Tally {
            // Round 2 is slow for both builds: the ratio, not the rate, is compared.
            a_rate: vec![100e3, 75e3, 300e3],
            b_rate: vec![50e3, 200e3, 100e3],
            c: vec![
                (100_000, 1_000_000, 1),
                (125_000, 700_000, 1),
                (100_000, 600_000, 1),
            ],
            e: vec![0.5, 0.6, 0.75],
            ..Tally::default()
        };
        let mut rows = Vec::new();
        versus(&this, &base, &mut rows);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.item, r.value.as_str(), r.baseline.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "2.00x", "rounds 2.00x, 2.00x, 1.00x"),
                ("b", "1.00x", "rounds 2.00x, 0.50x, 1.00x"),
                ("c", "+30 µs", "rounds +50 µs, -5 µs, +30 µs"),
                ("c", "+0 µs", "rounds -100 µs, +0 µs, +200 µs"),
                ("e", "1.00x", "rounds 1.20x, 1.00x, 0.80x"),
            ]
        );
        // Without a base build's rounds there is nothing to compare.
        let mut rows = Vec::new();
        versus(&this, &Tally::default(), &mut rows);
        assert!(rows.is_empty());
    }

    #[test]
    fn median_is_the_middle_figure_or_the_upper_of_two() {
        assert_eq!(median::<u64>(&[]), None);
        assert_eq!(median(&[7u64]), Some(7));
        assert_eq!(median(&[0.9, 0.2, 0.5]), Some(0.5));
        assert_eq!(median(&[40u64, 10, 30, 20]), Some(30));
    }

    #[test]
    fn a_process_stat_gives_its_cpu_ticks_and_threads_whatever_its_name() {
        // Fields 14 and 15 (utime 250, stime 40) and 20 (7 threads), after a command name
        // with a space and a parenthesis of its own.
        let stat = "4242 (tokio (rt) w) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 40 0 0 20 0 7 0 \
                    123 456 789";
        assert_eq!(ticks_and_threads(stat), Some((290, 7)));
        assert_eq!(ticks_and_threads("4242 (x) S 1 2 3"), None);
        assert_eq!(ticks_and_threads("no parenthesis"), None);
    }

    #[test]
    fn steal_is_the_eighth_figure_of_the_cpu_line_and_the_cpus_are_counted() {
        let stat = "cpu  5744467 0 842732 3592325 30271 0 17908 46823 0 0\n\
                    cpu0 2872233 0 421366 1796162 15135 0 8954 23411 0 0\n\
                    cpu1 2872234 0 421366 1796163 15136 0 8954 23412 0 0\n\
                    intr 1 2 3\n\
                    ctxt 99\n";
        assert_eq!(steal_of(stat), Some((46823, 2)));
        // A kernel too old to count steal, or no cpu line: nothing said.
        assert_eq!(steal_of("cpu  1 2 3 4\n"), None);
        assert_eq!(steal_of("intr 1\n"), None);
    }
}
