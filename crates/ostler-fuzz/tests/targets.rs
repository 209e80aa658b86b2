//! Every target runs briefly and holds; a seed replays deterministically.

use std::time::Duration;

use ostler_fuzz::{Budget, Seed, TARGETS};

#[test]
fn every_target_runs_and_holds() {
    for name in TARGETS {
        let report = ostler_fuzz::run(name, Budget::for_duration(Duration::from_secs(2)))
            .expect("known target")
            .unwrap_or_else(|f| panic!("{f}"));
        assert!(report.cases >= 32, "{name}: only {} cases", report.cases);
        assert_eq!(report.cases, 32 * report.batches);
    }
}

#[test]
fn a_given_seed_runs_exactly_one_batch() {
    let seed = Seed::parse(&"ab".repeat(32)).expect("valid seed");
    assert_eq!(seed.to_string(), "ab".repeat(32));
    assert!(Seed::parse("xyz").is_err());
    let budget = Budget {
        deadline: std::time::Instant::now() + Duration::from_secs(3600),
        seed: Some(seed),
    };
    let report = ostler_fuzz::run("permission", budget)
        .expect("known target")
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.batches, 1);
    assert!(ostler_fuzz::run("nope", budget).is_none());
}

#[test]
fn the_corpus_is_loaded_and_covers_every_adapter() {
    let recs = ostler_fuzz::corpus::recordings();
    assert!(recs.len() > 100, "only {} recordings", recs.len());
    let adapters = ostler_protocol::adapter::all().len();
    // One release per adapter, plus the tolerant fallbacks.
    assert!(ostler_fuzz::corpus::adapter_releases().len() > adapters);
}
