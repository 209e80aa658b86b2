//! Item d: partial deltas. One session runs `fake:partials N` with two subscribers with
//! partials: one that reads as fast as it can, and one on its own connection (small
//! HTTP/2 windows) that reads nothing until the turn is over. Each counts the deltas it
//! received and the deltas `PartialsMissed` told it it missed; received + missed must be
//! N for the one that keeps up, and every delta published while they followed for both
//! (never a silent loss). A miss is reported before the next delta received, so the
//! stalled one's count for the partials turn may include the warm-up turn's deltas.

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

/// (the subscriber that keeps up, the stalled one) after `n` deltas.
pub async fn partials(c: &mut Client, d: &Daemon, n: u64) -> Result<(Got, Got)> {
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
    if k.received + k.missed != n || k.missed != 0 || warm.missed != 0 {
        bail!(
            "the keeping up subscriber received {} and was told it missed {} of {n} deltas",
            k.received,
            k.missed
        );
    }
    // Every delta published while it followed: the warm-up turn's (the keeping-up one got
    // them all) and the partials turn's.
    let published = warm.received + n;
    let accounted = s_warm.received + s_warm.missed + s.received + s.missed;
    if accounted != published {
        bail!(
            "the stalled subscriber received {} and was told it missed {} of {published} deltas",
            s_warm.received + s.received,
            s_warm.missed + s.missed
        );
    }
    Ok((k, s))
}
