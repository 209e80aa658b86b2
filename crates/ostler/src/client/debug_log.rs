//! `ostler debug-log ID [--follow]`: the CLI's debug log of a session created with
//! `--debug` (ReadDebugLog), read in bounded pieces. `--follow` goes on reading as the
//! session's events arrive (Subscribe): no polling; lines the CLI writes after the
//! session's last event show with its next one (a turn, a state change, its exit).
//! Bytes the daemon dropped at its cap before they were read are reported on stderr
//! ("N bytes dropped") and reading goes on from the first byte still kept.

use anyhow::Result;
use futures::StreamExt as _;
use ostler_proto::v1 as pb;
use serde_json::json;

use super::ids::{self, SessionArg};
use super::render::json_line;
use super::{ConnectArgs, connect, status_error};

#[derive(Debug, Clone, clap::Args)]
pub struct DebugLogArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Start at this byte offset (a previous `next_offset`)
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    /// Go on showing what the CLI logs, as the session's events arrive, until the session
    /// is deleted or Ctrl-C
    #[arg(short, long)]
    pub follow: bool,
    /// One JSON object per piece read: offset, data (text), next_offset, size, eof,
    /// first_offset, dropped (bytes before first_offset not read)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Bytes of a piece not yet shown because they end inside a UTF-8 character.
#[derive(Default)]
struct Text {
    carry: Vec<u8>,
}

impl Text {
    /// The complete characters of `carry + data` (invalid bytes replaced), keeping an
    /// incomplete last character for the next piece.
    fn take(&mut self, data: &[u8]) -> String {
        self.carry.extend_from_slice(data);
        let keep = match std::str::from_utf8(&self.carry) {
            Ok(_) => 0,
            Err(e) if e.error_len().is_none() => self.carry.len() - e.valid_up_to(),
            Err(_) => 0,
        };
        let rest = self.carry.split_off(self.carry.len() - keep);
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry = rest;
        text
    }
}

/// Reads from `offset` to the log's end now; returns the next offset.
async fn drain(
    sessions: &mut super::Sessions,
    id: &str,
    mut offset: u64,
    json: bool,
    text: &mut Text,
) -> Result<u64, tonic::Status> {
    loop {
        let r = sessions
            .read_debug_log(pb::ReadDebugLogRequest {
                session_id: id.to_owned(),
                offset,
                max_bytes: 0,
            })
            .await?
            .into_inner();
        // Dropped at the daemon's cap before we read them: the data starts later.
        let dropped = r.first_offset.saturating_sub(offset);
        if json {
            json_line(&json!({
                "offset": offset,
                "data": String::from_utf8_lossy(&r.data),
                "next_offset": r.next_offset,
                "size": r.size,
                "eof": r.eof,
                "first_offset": r.first_offset,
                "dropped": dropped,
            }));
        } else if dropped > 0 {
            errln!(
                "ostler: {dropped} bytes dropped (the daemon's debug log cap); going on at offset {}",
                r.first_offset
            );
            *text = Text::default();
        }
        if !json && !r.data.is_empty() {
            outln!("{}", text.take(&r.data).trim_end_matches('\n'));
        }
        offset = r.next_offset;
        if r.eof || r.data.is_empty() {
            return Ok(offset);
        }
    }
}

/// `ostler debug-log ID`.
pub async fn debug_log(a: DebugLogArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let id = ids::resolve(&mut conn.sessions, a.session.raw()).await?;
    let mut text = Text::default();
    let failed = |s| status_error("read the debug log", s);
    if !a.follow {
        drain(&mut conn.sessions, &id, a.offset, a.json, &mut text)
            .await
            .map_err(failed)?;
        return Ok(0);
    }
    // Subscribed before the first read, so nothing logged in between is missed.
    let last_seq = conn
        .sessions
        .get_session(pb::GetSessionRequest {
            session_id: id.clone(),
        })
        .await
        .map_err(|s| status_error("get session", s))?
        .into_inner()
        .last_seq;
    let mut events = conn
        .sessions
        .subscribe(pb::SubscribeRequest {
            session_id: id.clone(),
            after_seq: last_seq,
            include_partial: false,
            follow: true,
        })
        .await
        .map_err(|s| status_error("subscribe", s))?
        .into_inner();
    let mut offset = drain(&mut conn.sessions, &id, a.offset, a.json, &mut text)
        .await
        .map_err(failed)?;
    // Ctrl-C ends the process (the default signal action).
    while let Some(ev) = events.next().await {
        ev.map_err(|s| status_error("subscribe", s))?;
        match drain(&mut conn.sessions, &id, offset, a.json, &mut text).await {
            Ok(next) => offset = next,
            // Deleted while followed: its stream is ending too.
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(0),
            Err(s) => return Err(failed(s)),
        }
    }
    Ok(0)
}
