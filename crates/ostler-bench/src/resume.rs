//! Item `resume` (issue 12's second target): time from SendMessage to the turn's first
//! answer on a suspended session (resumed on demand: `--resume` spawn, then the message),
//! next to the same on a live idle session, in one daemon with `idle_suspend_secs = 1`.
//!
//! Each round: a message on the live session (right after the previous turn, well inside
//! the idle timeout), then the session is left idle until its subscriber sees
//! `state_changed -> SUSPENDED`, then a message on the suspended session. The time is taken
//! when the client receives the turn's first `AssistantBlock`; SendMessage runs in its own
//! task so a call that returns late does not delay reading the stream.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ostler_proto::v1::SessionState as PbState;
use ostler_proto::v1::session_event::Payload;

use super::{Client, Daemon, GUARD, Opts, Row, Stream, create, fmt_us, row, send, subscribe};

pub(crate) async fn resume(o: &Opts) -> Result<Vec<Row>> {
    let reps = if o.quick { 5 } else { 15 };
    let dir = tempfile::Builder::new().prefix("ostler-bench-").tempdir()?;
    let d = Daemon::start_in(o, dir, "[sessions]\nidle_suspend_secs = 1\n").await?;
    let mut c = d.client().await?;
    let sid = create(&mut c, &d).await?;
    let mut s = subscribe(&mut c, &sid, false, true).await?;
    let mut live = Vec::new();
    let mut suspended = Vec::new();
    turn(&c, &sid, &mut s, false).await?;
    for _ in 0..reps {
        live.push(turn(&c, &sid, &mut s, false).await?);
        wait_suspended(&mut s).await?;
        suspended.push(turn(&c, &sid, &mut s, true).await?);
    }
    drop(s);
    drop(c);
    d.stop()?;
    let med = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (l50, s50) = (med(&mut live), med(&mut suspended));
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let lmax = live.iter().max().copied().unwrap_or_default();
    let smax = suspended.iter().max().copied().unwrap_or_default();
    Ok(vec![row(
        "resume",
        &format!("SendMessage -> first AssistantBlock, suspended session (p50 / max of {reps})"),
        format!("{} / {}", fmt_us(ns(s50)), fmt_us(ns(smax))),
        format!(
            "live idle session {} / {}",
            fmt_us(ns(l50)),
            fmt_us(ns(lmax))
        ),
        format!("{:.1}x", s50.as_secs_f64() / l50.as_secs_f64().max(1e-9)),
    )])
}

/// One turn: SendMessage (in a task), the time to the first `AssistantBlock`, then the rest
/// of the turn. With `resumed`, the turn must have started by leaving SUSPENDED.
async fn turn(c: &Client, sid: &str, s: &mut Stream, resumed: bool) -> Result<Duration> {
    let mut c = c.clone();
    let id = sid.to_string();
    let t = Instant::now();
    let sent = tokio::spawn(async move { send(&mut c, &id, "hello").await });
    let mut first = None;
    let mut left_suspended = false;
    loop {
        let ev = tokio::time::timeout(GUARD, s.message())
            .await
            .context("no event for 10 minutes")??
            .context("the stream ended before the turn did")?;
        match &ev.payload {
            Some(Payload::StateChanged(c)) if c.from() == PbState::Suspended => {
                left_suspended = true;
            }
            Some(Payload::AssistantBlock(_)) => {
                first.get_or_insert(t.elapsed());
            }
            Some(Payload::ProcessExited(p)) if !resumed => bail!("the CLI exited: {p:?}"),
            Some(Payload::TurnCompleted(_)) => break,
            _ => {}
        }
    }
    sent.await??;
    if resumed && !left_suspended {
        bail!("the session was not suspended when the message was sent");
    }
    first.context("a turn without an AssistantBlock")
}

/// Reads until the session's `state_changed -> SUSPENDED`.
async fn wait_suspended(s: &mut Stream) -> Result<()> {
    loop {
        let ev = tokio::time::timeout(GUARD, s.message())
            .await
            .context("not suspended within 10 minutes")??
            .context("the stream ended before the session suspended")?;
        if let Some(Payload::StateChanged(c)) = &ev.payload
            && c.to() == PbState::Suspended
        {
            return Ok(());
        }
    }
}
