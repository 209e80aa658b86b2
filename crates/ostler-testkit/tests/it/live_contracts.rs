//! The live contract check: every pinned release (installed into the cache when missing)
//! × every scenario is run against the fake model server and its wire shape compared with
//! the committed recording (`contracts/claude-code/<release>/<scenario>.ndjson`).
//! Releases run in three parallel lanes (each release's scenarios one after the other).
#![allow(clippy::disallowed_methods)] // test support

use ostler_testkit::corpus::{self, Mode, Outcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_wire_shape_matches_recordings() {
    let (rels, scens) = corpus::select(&[], &[]).expect("releases and scenarios");
    assert!(rels.len() >= 4, "pinned releases: {rels:?}");
    // three lanes: much of a scenario's time is spent waiting (CLI start-up I/O, retry
    // back-off, slow streams), so three lanes finish sooner than two even on two cores
    const LANES: usize = 3;
    let lanes: Vec<Vec<String>> = (0..LANES)
        .map(|i| rels.iter().skip(i).step_by(LANES).cloned().collect())
        .collect();
    let mut tasks = Vec::new();
    for lane in lanes {
        let scens = scens.clone();
        tasks.push(tokio::spawn(async move {
            corpus::run(&lane, &scens, Mode::Check, |o| eprintln!("{o}")).await
        }));
    }
    let mut outcomes: Vec<Outcome> = Vec::new();
    for t in tasks {
        outcomes.extend(t.await.expect("join").expect("lane ran"));
    }
    // Every release × every scenario that applies to it (`releases = [...]` narrows one).
    let expected: usize = rels
        .iter()
        .map(|r| scens.iter().filter(|s| s.applies_to(r)).count())
        .sum();
    assert_eq!(outcomes.len(), expected);
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|o| {
            o.error
                .as_ref()
                .map(|e| format!("{}/{}: {e}", o.release, o.scenario))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} live contract checks failed:\n\n{}",
        failed.len(),
        outcomes.len(),
        failed.join("\n\n")
    );
}
