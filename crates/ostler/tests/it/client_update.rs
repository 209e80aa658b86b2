//! `ostler rename`, `ostler label`, `ostler archive` / `unarchive` end to end against a live
//! daemon (UpdateSession), and `ostler sessions` hiding archived sessions unless
//! `--archived` (only those) or `--all`.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary (daemon and clients)

use crate::common;

use common::client::{Served, describe, scenario_text};

fn ids(d: &Served, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = d
        .ok_json(args)
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn rename_label_archive_and_sessions_hides_archived() {
    let d = Served::start(&scenario_text());
    let a = d.ok_json(&["run", "--json", "--name", "alpha", "Say hello"])[0]["session"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let b = d.ok_json(&["run", "--json", "--name", "beta", "Say hello"])[0]["session"]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    // rename, by prefix.
    let s = d.ok_json(&["rename", &a[..13], "the new name", "--json"]);
    assert_eq!(s[0]["id"], a.as_str());
    assert_eq!(s[0]["title"], "the new name");
    let out = d.client(&["rename", &a, "again"], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"again\""),
        "{}",
        describe(&out)
    );

    // label: set two, then remove one.
    let s = d.ok_json(&["label", &a, "stage=review", "owner=ann", "--json"]);
    assert_eq!(s[0]["labels"]["stage"], "review");
    assert_eq!(s[0]["labels"]["owner"], "ann");
    let s = d.ok_json(&["label", &a, "-k", "owner", "--json"]);
    assert_eq!(s[0]["labels"], serde_json::json!({"stage": "review"}));
    let out = d.client(&["label", &a], None);
    assert_eq!(
        out.status.code(),
        Some(2),
        "nothing to do is a usage error: {}",
        describe(&out)
    );
    assert_eq!(
        ids(&d, &["sessions", "--json", "--label", "stage=review"]),
        vec![a.clone()]
    );

    // archive: `sessions` hides it; --archived lists only it; --all both.
    let s = d.ok_json(&["archive", &a, "--json"]);
    assert_eq!(s[0]["archived"], true);
    assert_eq!(ids(&d, &["sessions", "--json"]), vec![b.clone()]);
    assert_eq!(
        ids(&d, &["sessions", "--json", "--archived"]),
        vec![a.clone()]
    );
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(ids(&d, &["sessions", "--json", "--all"]), both);
    let out = d.client(&["sessions"], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("beta") && !table.contains("again"),
        "{table}"
    );

    // The feed shows the updates.
    let feed = d.ok_json(&[
        "watch",
        "--all",
        "--no-follow",
        "--json",
        "--kind",
        "updated",
    ]);
    assert_eq!(feed.len(), 5, "{feed:?}");
    assert!(
        feed.iter().all(|i| i["session_id"] == a.as_str()),
        "{feed:?}"
    );

    // unarchive.
    let out = d.client(&["unarchive", &a], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("not archived"),
        "{}",
        describe(&out)
    );
    assert_eq!(ids(&d, &["sessions", "--json"]), both);
}
