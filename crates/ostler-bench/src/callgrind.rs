//! `--callgrind`: item a (or, with `--only b`, item b) counted in instructions instead of
//! seconds.
//!
//! The daemon runs under `valgrind --tool=callgrind` (its CLI child, the fake, does not:
//! valgrind does not follow `exec` unless told to). After the warm-up turn (item b: of each
//! of its 16 sessions) the harness zeroes the counters (`callgrind_control -z`), runs the
//! firehose (item b: 16 at once, N/16 lines each, so that both items count N events), and
//! when the client has the turns' end it dumps them (`callgrind_control -d`): the
//! instructions the daemon executed, in all its threads, to decode, store, publish and send
//! the firehoses' events. The same
//! run counts a bare `serde_json::Value` parse loop over the same lines (this binary's
//! hidden `--value-loop FILE`, under callgrind with collection only inside the loop), so the
//! figure is printed as a ratio, like item a's.
//!
//! An instruction count is not a time (valgrind runs the threads one at a time, and a cache
//! miss costs what a register move does), but it repeats within ~1 % from run to
//! run where wall-clock rounds on a small shared machine move by ±10 %: the regression check
//! for changes too small for item a's rounds to see (`--base-ostler` measures a second
//! build the same way).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{Daemon, Opts, Row, fake_output, firehose_body, firehoses, row, warm_sessions};

/// The sessions of item b's firehoses.
const B_SESSIONS: usize = 16;

/// Which item is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// One session's firehose.
    A,
    /// [`B_SESSIONS`] sessions' firehoses at once.
    B,
}

impl Item {
    /// The item `--only` names (item a without `--only`; `main` refuses anything else).
    fn of(only: Option<&[String]>) -> Item {
        match only {
            Some([b]) if b == "b" => Item::B,
            _ => Item::A,
        }
    }

    /// The sessions that firehose at once.
    fn sessions(self) -> usize {
        match self {
            Item::A => 1,
            Item::B => B_SESSIONS,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Item::A => "a",
            Item::B => "b",
        }
    }
}

/// The dump's file name in the daemon's temporary directory.
const OUT: &str = "callgrind.out";

/// valgrind's arguments for the daemon. Names uncompressed: a compressed dump names a
/// function once per process, not once per file, so a dump after the first would refer
/// to names only the first one has (and `callgrind_annotate` put everything under `clone`).
pub fn valgrind_args(dir: &Path) -> Vec<String> {
    vec![
        "--tool=callgrind".into(),
        "--compress-strings=no".into(),
        format!("--callgrind-out-file={}", dir.join(OUT).display()),
    ]
}

/// What one build's count gave.
struct Count {
    /// Instructions the daemon executed from the firehose's message to the turn's end.
    instructions: u64,
    events: u64,
    /// The dump, kept for `callgrind_annotate`.
    kept: PathBuf,
    /// Instructions per function in the dump.
    profile: Profile,
}

/// The stages of item a's event path, each the inclusive count of the function that runs
/// it (a stage whose function was renamed or inlined shows 0).
const STAGES: [(&str, &str); 5] = [
    (
        "decode of the CLI's lines",
        "ostler_protocol::decode::Decoder::decode",
    ),
    (
        "store codec (deltas against the line and the dictionary)",
        "ostler_store::codec::EncodedEvent::new",
    ),
    (
        "SQLite insert and commit (the writer thread)",
        "ostler_store::writer::Writer::commit_group",
    ),
    (
        "the stored payload's JSON",
        "ostler_engine::hub::encode_payload",
    ),
    (
        "gRPC connections (conversion, encoding, send)",
        "<ostler_server::listen::Absorb<F> as core::future::future::Future>::poll",
    ),
];

/// Instructions per function of a callgrind dump.
#[derive(Default)]
struct Profile {
    /// In the function itself.
    exclusive: HashMap<String, u64>,
    /// In the function and what it called (calls to itself not counted twice).
    inclusive: HashMap<String, u64>,
}

impl Profile {
    /// Reads a dump written with `--compress-strings=no` (names in full on every line).
    fn parse(text: &str) -> Profile {
        let mut p = Profile::default();
        let (mut func, mut callee) = ("", "");
        let mut call_cost_next = false;
        for line in text.lines() {
            if let Some(f) = line.strip_prefix("fn=") {
                func = f;
            } else if let Some(f) = line.strip_prefix("cfn=") {
                callee = f;
            } else if line.starts_with("calls=") {
                call_cost_next = true;
            } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                let Some(cost) = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse::<u64>().ok())
                else {
                    continue;
                };
                if std::mem::take(&mut call_cost_next) {
                    // The cost line after `calls=` is the call's inclusive cost.
                    if callee != func {
                        *p.inclusive.entry(func.to_string()).or_default() += cost;
                    }
                } else {
                    *p.exclusive.entry(func.to_string()).or_default() += cost;
                    *p.inclusive.entry(func.to_string()).or_default() += cost;
                }
            }
        }
        p
    }

    /// The exclusive count of every function whose name starts with one of `prefixes`.
    fn exclusive_of(&self, prefixes: &[&str]) -> u64 {
        self.exclusive
            .iter()
            .filter(|(f, _)| prefixes.iter().any(|p| f.starts_with(p)))
            .map(|(_, c)| c)
            .sum()
    }
}

/// The rows of one build's stages, per event.
fn stage_rows(item: Item, label: &str, c: &Count, rows: &mut Vec<Row>) {
    let per = |n: u64| n as f64 / c.events.max(1) as f64;
    let total = per(c.instructions);
    let mut add = |what: &str, n: f64| {
        rows.push(row(
            item.label(),
            &format!("callgrind: {label}{what}, instructions per event"),
            format!("{n:.0}"),
            format!("of {total:.0}"),
            format!("{:.1} %", 100.0 * n / total.max(1.0)),
        ))
    };
    for (what, func) in STAGES {
        add(
            what,
            per(c.profile.inclusive.get(func).copied().unwrap_or(0)),
        );
    }
    add(
        "all stages: in the allocator (mimalloc)",
        per(c.profile.exclusive_of(&["mi_", "_mi_"])),
    );
    add(
        "all stages: in memcpy / memmove",
        per(c.profile.exclusive_of(&["__memcpy", "__memmove"])),
    );
    let mut top: Vec<_> = c.profile.exclusive.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1));
    println!("{label}the functions with the most instructions of their own, per event:");
    for (f, n) in top.into_iter().take(15) {
        println!(
            "  {:>7.0}  {}",
            per(*n),
            f.chars().take(140).collect::<String>()
        );
    }
}

/// Runs the count for this build (and the base build, if any) and pushes the rows.
pub async fn run(o: &Opts, rows: &mut Vec<Row>) -> Result<()> {
    let n: u64 = if o.quick { 20_000 } else { 100_000 };
    let item = Item::of(o.only.as_deref());
    let it = item.label();
    which("valgrind")?;
    which("callgrind_control")?;
    let keep = tempfile::Builder::new()
        .prefix("ostler-bench-callgrind-")
        .tempdir()?
        .keep();
    let per_line = value_loop(o, n, &keep)?;
    rows.push(row(
        it,
        &format!("callgrind: serde_json Value loop, {n} lines"),
        format!("{per_line:.0} instructions per line"),
        "-".into(),
        "-".into(),
    ));
    let this = count(o, item, n, &keep.join("this.out")).await?;
    let per_event = |c: &Count| c.instructions as f64 / c.events.max(1) as f64;
    rows.push(row(
        it,
        &format!(
            "callgrind: daemon instructions per event, {} of {} events",
            match item {
                Item::A => "firehose".to_string(),
                Item::B => format!("{B_SESSIONS} firehoses at once"),
            },
            this.events
        ),
        format!("{:.0}", per_event(&this)),
        format!("Value loop {per_line:.0} per line"),
        format!("{:.2}x the loop", per_event(&this) / per_line),
    ));
    stage_rows(item, "", &this, rows);
    if let Some(b) = &o.base {
        let base_opts = Opts {
            ostler: b.clone(),
            ..o.clone()
        };
        let base = count(&base_opts, item, n, &keep.join("base.out")).await?;
        rows.push(row(
            it,
            &format!(
                "callgrind: base build ({}) instructions per event",
                b.display()
            ),
            format!("{:.0}", per_event(&base)),
            format!("Value loop {per_line:.0} per line"),
            format!("{:.2}x the loop", per_event(&base) / per_line),
        ));
        stage_rows(item, "base build: ", &base, rows);
        rows.push(row(
            it,
            "callgrind: this build vs the base build, instructions per event",
            format!("{:.0} / {:.0}", per_event(&this), per_event(&base)),
            format!("{:+.0} per event", per_event(&this) - per_event(&base)),
            format!("{:.3}x", per_event(&this) / per_event(&base)),
        ));
        println!("base build's dump: {}", base.kept.display());
    }
    println!(
        "this build's dump: {} (callgrind_annotate --inclusive=yes FILE)",
        this.kept.display()
    );
    Ok(())
}

/// One daemon under callgrind: a warm-up turn, the counters zeroed, a firehose of `n`
/// lines (item b: 16 sessions' firehoses of `n / 16` lines at once), the counters dumped
/// when the client has the turns' end; the dump is copied to `keep`.
async fn count(o: &Opts, item: Item, n: u64, keep: &Path) -> Result<Count> {
    let d = Daemon::start(o).await?;
    let mut c = d.client().await?;
    let pid = d.child.id();
    let subs = warm_sessions(&mut c, &d, item.sessions()).await?;
    control(pid, "-z")?;
    let events = firehoses(&c, subs, n / item.sessions() as u64).await?;
    control(pid, "-d")?;
    // The first dump callgrind writes on request is the out file with ".1" appended.
    let dump = d.path().join(format!("{OUT}.1"));
    let text = std::fs::read_to_string(&dump)
        .with_context(|| format!("callgrind's dump {}", dump.display()))?;
    let instructions = summary(&text).with_context(|| {
        format!(
            "no `summary:` or `totals:` line in callgrind's dump {}",
            dump.display()
        )
    })?;
    std::fs::copy(&dump, keep)?;
    drop(c);
    d.stop()?;
    Ok(Count {
        instructions,
        events,
        kept: keep.to_path_buf(),
        profile: Profile::parse(&text),
    })
}

/// `callgrind_control FLAG PID` (zero: `-z`, dump: `-d`), which reaches the process through
/// valgrind's gdbserver even while it waits in a system call.
fn control(pid: u32, flag: &str) -> Result<()> {
    let out = Command::new("callgrind_control")
        .arg(flag)
        .arg(pid.to_string())
        .output()
        .context("cannot start callgrind_control")?;
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !said.contains("OK") {
        bail!(
            "callgrind_control {flag} {pid} failed ({}): {}{}",
            out.status,
            said.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The event count of a callgrind dump: its `summary:` line (older versions write
/// `totals:` only); its first figure is instructions (`Ir`, the only event collected).
fn summary(text: &str) -> Option<u64> {
    let pick = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    pick("summary:").or_else(|| pick("totals:"))
}

/// The `Value` loop's instructions per line: this binary's `--value-loop FILE` over the
/// fake's firehose lines, under callgrind, counting only inside [`parse_lines`].
fn value_loop(o: &Opts, n: u64, dir: &Path) -> Result<f64> {
    let home = tempfile::Builder::new()
        .prefix("ostler-bench-lines-")
        .tempdir()?;
    let (bytes, _) = fake_output(o, home.path(), n)?;
    let file = home.path().join("lines.ndjson");
    std::fs::write(&file, firehose_body(&bytes, n)?.join(&b'\n'))?;
    let out = dir.join("value-loop.out");
    let st = Command::new("valgrind")
        .args(["--tool=callgrind", "--toggle-collect=*parse_lines*"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(std::env::current_exe()?)
        .arg("--value-loop")
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("cannot start valgrind")?;
    if !st.success() {
        bail!("the Value loop under callgrind failed ({st})");
    }
    let text = std::fs::read_to_string(&out)?;
    let instructions = summary(&text).context("no summary in the Value loop's dump")?;
    if instructions == 0 {
        bail!("callgrind counted nothing in the Value loop (was `parse_lines` inlined?)");
    }
    Ok(instructions as f64 / n as f64)
}

/// `ostler-bench --value-loop FILE`: parses every line of FILE into a `serde_json::Value`
/// (what [`value_loop`] counts under callgrind); prints how many had a `type`.
pub fn value_loop_main(file: &Path) -> Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("{}", file.display()))?;
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    println!("{}", parse_lines(&lines)?);
    Ok(())
}

/// The `Value` loop: item a's baseline, timed there and counted here (not inlined, so that
/// callgrind can collect inside it alone).
#[inline(never)]
pub fn parse_lines(lines: &[&[u8]]) -> Result<u64> {
    let mut count = 0u64;
    for l in lines {
        let v: serde_json::Value = serde_json::from_slice(l)?;
        if v.get("type").is_some() {
            count += 1;
        }
    }
    Ok(count)
}

/// Where `prog` is on `PATH`, or an error that says how to install it.
fn which(prog: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false);
    if !found {
        bail!("--callgrind needs {prog} on PATH (Debian: apt-get install valgrind)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Item, Profile, summary};

    #[test]
    fn item_b_is_counted_only_when_named_alone() {
        let only = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Item::of(None), Item::A);
        assert_eq!(Item::of(Some(&only(&["a"]))), Item::A);
        assert_eq!(Item::of(Some(&only(&["b"]))), Item::B);
        assert_eq!(Item::of(Some(&only(&["a", "b"]))), Item::A);
    }

    #[test]
    fn a_functions_count_includes_its_calls_but_not_calls_to_itself() {
        let dump = "events: Ir\nfl=a.rs\nfn=main\n1 10\ncfl=a.rs\ncfn=work\ncalls=2 5\n3 100\n\
            fn=work\n5 60\n+1 40\ncfn=work\ncalls=1 5\n5 30\ncfn=__memcpy_avx_unaligned_erms\ncalls=1 0\n6 7\n\
            fn=__memcpy_avx_unaligned_erms\n0 7\n";
        let p = Profile::parse(dump);
        assert_eq!(p.exclusive["main"], 10);
        assert_eq!(p.inclusive["main"], 110);
        assert_eq!(p.exclusive["work"], 100);
        assert_eq!(
            p.inclusive["work"], 107,
            "the recursive call is in its own count"
        );
        assert_eq!(p.exclusive_of(&["__memcpy", "__memmove"]), 7);
    }

    #[test]
    fn the_count_is_read_from_the_summary_or_totals_line() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 4292113001\n\nfn=(1) main\n0 5\ntotals: 4292113001\n";
        assert_eq!(summary(dump), Some(4_292_113_001));
        assert_eq!(summary("events: Ir\ntotals: 17 3\n"), Some(17));
        assert_eq!(summary("events: Ir\nfn=main\n0 5\n"), None);
    }
}
