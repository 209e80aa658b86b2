//! Referring to sessions: a full id, a unique prefix or suffix of one, or `@last` /
//! `--last` (the newest session); and listing sessions newest first.
//!
//! ostler's own ids are UUIDv7: their first 12 hex digits are the creation time in
//! milliseconds, so sessions made within weeks of each other share a long prefix and their
//! last characters are what tells them apart. Both ends are accepted, ignoring case and
//! dashes; [`short_id`] is the end that tables show.

use anyhow::{Result, anyhow};
use ostler_proto::v1 as pb;

use super::{Sessions, json, status_error};

/// The spelling of "the newest session" as an id.
pub const LAST: &str = "@last";

/// The session argument of a command: `ID`, `ID-PREFIX`, `@last`, or `--last`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionArg {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
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
    archived: Option<bool>,
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
                archived,
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
        usage!("empty session id");
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
    let all = list_all(client, &[], &[], None).await?;
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
    // (A shortened id as tables show it, `…end`, is its end.)
    let typed = loose(raw.trim_start_matches('…'));
    let matches: Vec<&pb::Session> = all
        .iter()
        .filter(|s| {
            let id = loose(&s.id);
            !typed.is_empty() && (id.starts_with(&typed) || id.ends_with(&typed))
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(anyhow!(
            "session {:?}: NOT_FOUND: no session has this id, or an id that starts or ends \
             with it (`ostler sessions` lists them)",
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
                "the session id part {raw:?} is ambiguous: it matches {} sessions; type more \
                 of the id (its end tells ostler's ids apart):\n{}{more}",
                many.len(),
                shown.join("\n")
            ))
        }
    }
}

/// An id as matched against what a user typed: lower case, without dashes.
fn loose(id: &str) -> String {
    id.chars()
        .filter(|c| *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The part of a session id a table shows: the last 8 characters of a UUID (its random
/// end; see the module's notes), a client-chosen id of up to 16 characters whole, else
/// its last 12 after an ellipsis. Each is accepted wherever a session id is.
pub fn short_id(id: &str) -> String {
    let n = id.chars().count();
    let is_uuid = n == 36 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    let keep = if is_uuid {
        8
    } else if n <= 16 {
        return id.to_owned();
    } else {
        12
    };
    let tail: String = id.chars().skip(n - keep).collect();
    if is_uuid { tail } else { format!("…{tail}") }
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

    /// UUIDv7 ids made close together share their start: their end picks one, in any case
    /// and with or without dashes; what tables show is accepted back.
    #[test]
    fn uuid_ids_are_told_apart_by_their_end() {
        let a = "019ad3e1-7b2c-7f00-8a11-4f2a9c1e0b77";
        let b = "019ad3e1-7b2c-7f00-9c22-55d0e3aa1c08";
        let mut all = vec![s(a, 1), s(b, 2), s("build-42.retry_ok", 3)];
        sort_newest_first(&mut all);
        let id = |raw: &str| pick(&all, raw).map(|s| s.id.clone()).ok();
        assert_eq!(id("9c1e0b77").as_deref(), Some(a));
        assert_eq!(id("0B77").as_deref(), Some(a));
        assert_eq!(id("e3aa-1c08").as_deref(), Some(b));
        assert_eq!(id("019AD3E17B2C7F009C").as_deref(), Some(b));
        assert_eq!(id("retry_ok").as_deref(), Some("build-42.retry_ok"));
        assert!(
            pick(&all, "019ad3e1")
                .map(|_| ())
                .unwrap_err()
                .to_string()
                .contains("ambiguous")
        );
        assert!(pick(&all, "-").is_err(), "nothing typed matches nothing");
        for s in &all {
            assert_eq!(id(&short_id(&s.id)).as_deref(), Some(s.id.as_str()));
        }
        assert_eq!(short_id(a), "9c1e0b77");
        assert_eq!(short_id("build-42.retry_ok"), "…-42.retry_ok");
        assert_eq!(short_id("job-7"), "job-7");
    }
}
