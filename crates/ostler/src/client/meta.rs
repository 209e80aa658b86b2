//! `ostler rename`, `ostler label`, `ostler archive` / `ostler unarchive`: a session's title,
//! labels and archived mark after create (UpdateSession). They change ostler's record only:
//! nothing reaches the CLI, and they work in every state.

use std::collections::HashMap;

use anyhow::Result;
use ostler_proto::v1 as pb;

use super::commands::{IdArgs, connect_to_session};
use super::ids::SessionArg;
use super::render::json_line;
use super::run::parse_label;
use super::{ConnectArgs, json, status_error};

#[derive(Debug, Clone, clap::Args)]
pub struct RenameArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID")]
    pub id: String,
    /// The new title (at most 200 characters; ostler's title, not the CLI's)
    #[arg(value_name = "TITLE")]
    pub title: String,
    /// Print the session as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct LabelArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Labels to set (KEY=VALUE, repeatable)
    #[arg(value_name = "KEY=VALUE", value_parser = parse_label)]
    pub set: Vec<(String, String)>,
    /// A label to remove (repeatable)
    #[arg(long = "remove", short = 'k', value_name = "KEY")]
    pub remove: Vec<String>,
    /// Print the session as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Sends the update and prints the session (`what` says what was done).
async fn update(
    connect: &ConnectArgs,
    raw: &str,
    as_json: bool,
    mut req: pb::UpdateSessionRequest,
    what: impl FnOnce(&pb::Session) -> String,
) -> Result<i32> {
    let (mut conn, id) = connect_to_session(connect, raw).await?;
    req.session_id = id;
    let s = conn
        .sessions
        .update_session(req)
        .await
        .map_err(|st| status_error("update session", st))?
        .into_inner();
    if as_json {
        json_line(&json::session(&s));
    } else {
        outln!("{}", what(&s));
    }
    Ok(0)
}

/// `ostler rename ID TITLE`.
pub async fn rename(a: RenameArgs) -> Result<i32> {
    let req = pb::UpdateSessionRequest {
        title: Some(a.title),
        ..Default::default()
    };
    update(&a.connect, &a.id, a.json, req, |s| {
        format!("{} is now titled {:?}", s.id, s.title)
    })
    .await
}

/// `ostler label ID KEY=VALUE... [-k KEY]...`.
pub async fn label(a: LabelArgs) -> Result<i32> {
    if a.set.is_empty() && a.remove.is_empty() {
        return Err(
            super::Usage("give labels to set (KEY=VALUE) or to remove (-k KEY)".into()).into(),
        );
    }
    let req = pb::UpdateSessionRequest {
        set_labels: a.set.into_iter().collect::<HashMap<_, _>>(),
        remove_labels: a.remove,
        ..Default::default()
    };
    update(&a.connect, a.session.raw(), a.json, req, |s| {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        if labels.is_empty() {
            format!("{} has no labels", s.id)
        } else {
            format!("{} labels: {}", s.id, labels.join(" "))
        }
    })
    .await
}

/// `ostler archive ID` (`archived` true) / `ostler unarchive ID` (false).
pub async fn archive(a: IdArgs, archived: bool) -> Result<i32> {
    let req = pb::UpdateSessionRequest {
        archived: Some(archived),
        ..Default::default()
    };
    update(&a.connect, a.session.raw(), a.json, req, |s| {
        format!(
            "{} is {}",
            s.id,
            if s.archived {
                "archived"
            } else {
                "not archived"
            }
        )
    })
    .await
}
