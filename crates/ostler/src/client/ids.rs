//! Referring to sessions: a full id, a unique prefix of one, or `@last` / `--last` (the
//! newest session); and listing sessions newest first.

use anyhow::{Result, anyhow, bail};
use ostler_proto::v1 as pb;

use super::{Sessions, json, status_error};

/// The spelling of "the newest session" as an id.
pub const LAST: &str = "@last";

/// The session argument of a command: `ID`, `ID-PREFIX`, `@last`, or `--last`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionArg {
    /// Session id, a unique prefix of one, or @last (the newest session)
    #[arg(value_name = "ID", required_unless_present = "last")]
    pub id: Option<String>,
    /// The newest session (same as the id @last)
    #[arg(long, conflicts_with = "id")]
    pub last: bool,
}

impl SessionArg {
    /// What the user typed (`@last` for `--last`).
    pub fn raw(&self) -> &str {
        match &self.id {
            Some(id) if !self.last => id,
            _ => LAST,
        }
    }
}

/// Every session matching the filters, newest first (by creation time, then id).
pub async fn list_all(
    client: &mut Sessions,
    states: &[pb::SessionState],
    labels: &[(String, String)],
) -> Result<Vec<pb::Session>> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                states: states.iter().map(|s| *s as i32).collect(),
                labels: labels.iter().cloned().collect(),
                page_size: 500,
                page_token: token.clone(),
            })
            .await
            .map_err(|s| status_error("list sessions", s))?
            .into_inner();
        all.extend(page.sessions);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    sort_newest_first(&mut all);
    Ok(all)
}

/// Newest first: creation time descending, ties by id (a stable order).
pub fn sort_newest_first(v: &mut [pb::Session]) {
    v.sort_by(|a, b| {
        b.created_at_ms
            .cmp(&a.created_at_ms)
            .then_with(|| b.id.cmp(&a.id))
    });
}

/// The full id for `raw`: an exact id, `@last`, or a unique prefix.
pub async fn resolve(client: &mut Sessions, raw: &str) -> Result<String> {
    let raw = raw.trim();
    if raw.is_empty() {
        bail!("empty session id");
    }
    if raw != LAST {
        // An exact id needs one call.
        match client
            .get_session(pb::GetSessionRequest {
                session_id: raw.to_owned(),
            })
            .await
        {
            Ok(s) => return Ok(s.into_inner().id),
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::NotFound | tonic::Code::InvalidArgument
                ) => {}
            Err(s) => return Err(status_error("get session", s)),
        }
    }
    let all = list_all(client, &[], &[]).await?;
    pick(&all, raw).map(|s| s.id.clone())
}

/// The session `raw` names among `all` (newest first).
pub fn pick<'a>(all: &'a [pb::Session], raw: &str) -> Result<&'a pb::Session> {
    if raw == LAST {
        return all
            .first()
            .ok_or_else(|| anyhow!("no sessions yet, so there is no @last session"));
    }
    if let Some(s) = all.iter().find(|s| s.id == raw) {
        return Ok(s);
    }
    let matches: Vec<&pb::Session> = all.iter().filter(|s| s.id.starts_with(raw)).collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(anyhow!(
            "session {:?}: NOT_FOUND: no session has this id or id prefix (`ostler sessions` \
             lists them)",
            super::render::clip(raw, 80)
        )),
        many => {
            let shown: Vec<String> = many
                .iter()
                .take(10)
                .map(|s| {
                    format!(
                        "  {}  {}  {}",
                        s.id,
                        json::state_name(s.state),
                        super::render::clip(&s.cwd, 50)
                    )
                })
                .collect();
            let more = if many.len() > 10 {
                format!("\n  … and {} more", many.len() - 10)
            } else {
                String::new()
            };
            Err(anyhow!(
                "the id prefix {raw:?} is ambiguous: it matches {} sessions; type more of the \
                 id:\n{}{more}",
                many.len(),
                shown.join("\n")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: &str, created: i64) -> pb::Session {
        pb::Session {
            id: id.into(),
            created_at_ms: created,
            ..Default::default()
        }
    }

    #[test]
    fn prefixes_last_and_ambiguity() {
        let mut all = vec![s("abc-1", 1), s("abd-2", 3), s("xyz-3", 2)];
        sort_newest_first(&mut all);
        assert_eq!(
            all.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["abd-2", "xyz-3", "abc-1"]
        );
        assert_eq!(pick(&all, LAST).map(|s| s.id.as_str()).ok(), Some("abd-2"));
        assert_eq!(pick(&all, "x").map(|s| s.id.as_str()).ok(), Some("xyz-3"));
        assert_eq!(
            pick(&all, "abc-1").map(|s| s.id.as_str()).ok(),
            Some("abc-1")
        );
        let err = pick(&all, "ab").map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("ambiguous") && err.contains("abc-1") && err.contains("abd-2"),
            "{err}"
        );
        let err = pick(&all, "q").map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("no session"), "{err}");
        assert!(pick(&[], LAST).is_err());
    }
}
