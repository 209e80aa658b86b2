//! Re-recording a scenario with the same release is byte-identical, and matches the shape of
//! the committed recording. Installs the release into the cache if missing.
#![allow(clippy::disallowed_methods)] // test support

use ostler_testkit::{RecordOptions, Scenario, contract, record, releases, scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_twice_is_byte_identical() {
    // the newest pinned release: the one with the most volatile fields
    let release = releases::session_releases()
        .expect("pinned releases")
        .into_iter()
        .filter_map(|r| semver::Version::parse(&r.version).ok())
        .max()
        .expect("at least one pinned release")
        .to_string();
    let r = release.clone();
    let binary = tokio::task::spawn_blocking(move || releases::installed(&r))
        .await
        .expect("join")
        .expect("install release");
    let s = Scenario::load(&scenario::scenarios_dir(), "plain_text").expect("scenario");
    let opts = RecordOptions::new(release.clone(), binary);
    let first = record(&s, &opts).await.expect("first recording");
    let second = record(&s, &opts).await.expect("second recording");
    assert!(first.text.lines().count() > 5, "{}", first.text);
    if first.text != second.text {
        let diff = similar::TextDiff::from_lines(&first.text, &second.text)
            .unified_diff()
            .header("first", "second")
            .to_string();
        panic!("re-recording differs:\n{diff}");
    }
    // nothing of the hermetic temp dirs leaks into the recording
    assert!(
        !first.text.contains("ostler-cc-"),
        "temp path left in recording"
    );
    let path = ostler_testkit::record::recording_path(&release, "plain_text");
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("committed recording {}: {e}", path.display()));
    contract::compare("plain_text", &committed, &first.text).expect("same shape as committed");
}
