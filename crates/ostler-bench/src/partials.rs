//! Item d: partial deltas. One session runs `fake:partials N` with two subscribers with
//! partials: one that reads as fast as it can, and one on its own connection (small
//! HTTP/2 windows) that reads nothing until the turn is over. Each counts the deltas it
//! received and the deltas `PartialsMissed` told it it missed; received + missed must be
//! N for both (never a silent loss).

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
    until_turn_end(&mut keep, |_| {}).await?;
    send(c, &sid, &format!("fake:partials {n}")).await?;
    let mut k = Got::default();
    until_turn_end(&mut keep, |ev| k.add(ev.payload.as_ref())).await?;
    // The stalled subscriber reads now: its warm-up turn, then the partials turn.
    until_turn_end(&mut stalled, |_| {}).await?;
    let mut s = Got::default();
    until_turn_end(&mut stalled, |ev| s.add(ev.payload.as_ref())).await?;
    for (who, g) in [("keeping up", k), ("stalled", s)] {
        if g.received + g.missed != n {
            bail!(
                "the {who} subscriber received {} and was told it missed {} of {n} deltas",
                g.received,
                g.missed
            );
        }
    }
    Ok((k, s))
}
