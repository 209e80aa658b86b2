//! Item d: partial deltas. One session runs `fake:partials N` with two subscribers with
//! partials: one that reads as fast as it can, and one on its own connection (small
//! HTTP/2 windows) that reads nothing until the turn is over. Each counts the deltas it
//! received and the deltas `PartialsMissed` told it it missed; received + missed must be
//! N for the one that keeps up, and every delta published while they followed for both
//! (never a silent loss), or the run fails. The target is that the one that keeps up is
//! told it missed none: a miss (a stall of the client or the machine longer than the
//! live ring holds) is reported in its row, and the run goes on. A miss is reported before
//! the next delta received, which for the stalled one may still be in the warm-up turn:
//! its row counts both turns.

use anyhow::{Result, bail};
use ostler_proto::v1::session_event::Payload;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use tonic::transport::Endpoint;

use super::{Client, Daemon, create, send, subscribe, until_turn_end};

/// What one subscriber got.
#[derive(Debug, Default, Clone, Copy)]
pub struct Got {
    pub received: u64,
    pub missed: u64,
}

impl Got {
    fn add(&mut self, p: Option<&Payload>) {
        match p {
            Some(Payload::PartialDelta(_)) => self.received += 1,
            Some(Payload::PartialsMissed(m)) => self.missed += m.count,
            _ => {}
        }
    }
}

/// What the two subscribers got: the one that keeps up in the partials turn (`n` deltas),
/// the stalled one over both turns, and the deltas both turns published.
pub struct Partials {
    pub keep: Got,
    pub stalled: Got,
    pub published: u64,
}

/// Item d's run with `n` deltas.
pub async fn partials(c: &mut Client, d: &Daemon, n: u64) -> Result<Partials> {
    let sid = create(c, d).await?;
    let mut keep = subscribe(c, &sid, true, true).await?;
    let ch = Endpoint::from_shared(format!("http://{}", d.addr))?
        .initial_stream_window_size(Some(16 << 10))
        .initial_connection_window_size(Some(64 << 10))
        .connect()
        .await?;
    let mut slow = SessionServiceClient::new(ch).max_decoding_message_size(64 << 20);
    let mut stalled = subscribe(&mut slow, &sid, true, true).await?;
    send(c, &sid, "hello").await?;
    let mut warm = Got::default();
    until_turn_end(&mut keep, |ev| warm.add(ev.payload.as_ref())).await?;
    send(c, &sid, &format!("fake:partials {n}")).await?;
    let mut k = Got::default();
    until_turn_end(&mut keep, |ev| k.add(ev.payload.as_ref())).await?;
    // The stalled subscriber reads now: its warm-up turn, then the partials turn.
    let mut s_warm = Got::default();
    until_turn_end(&mut stalled, |ev| s_warm.add(ev.payload.as_ref())).await?;
    let mut s = Got::default();
    until_turn_end(&mut stalled, |ev| s.add(ev.payload.as_ref())).await?;
    // A delta neither received nor told missed is a silent loss: the run fails. One told
    // missed is the target not met in this run (the row shows it), not a failure of the
    // harness: the run goes on to the other items.
    if k.received + k.missed != n {
        bail!(
            "the keeping up subscriber received {} and was told it missed {} of {n} deltas: {} lost silently",
            k.received,
            k.missed,
            n.abs_diff(k.received + k.missed)
        );
    }
    // Every delta published while it followed: the warm-up turn's (all that the keeping-up
    // one received or was told it missed) and the partials turn's.
    let published = warm.received + warm.missed + n;
    let accounted = s_warm.received + s_warm.missed + s.received + s.missed;
    if accounted != published {
        bail!(
            "the stalled subscriber received {} and was told it missed {} of {published} deltas",
            s_warm.received + s.received,
            s_warm.missed + s.missed
        );
    }
    // Over both turns: where a miss is told depends on where the stalled one's stored
    // events stood when it fell out of the live ring, which may be the warm-up turn.
    let stalled = Got {
        received: s_warm.received + s.received,
        missed: s_warm.missed + s.missed,
    };
    Ok(Partials {
        keep: k,
        stalled,
        published,
    })
}
