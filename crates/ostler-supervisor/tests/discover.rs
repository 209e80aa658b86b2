//! Discovery against fake `claude` binaries (shell scripts written at test time) and the
//! embedded matrix: version shapes, hangs, garbage, missing binaries, exit codes, levels.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ostler_supervisor::compat::{self, Flag};
use ostler_supervisor::{CompatLevel, DiscoverError, DiscoverOptions, discover};

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn opts(path: PathBuf) -> DiscoverOptions {
    DiscoverOptions {
        claude_path: Some(path),
        probe_flags: false,
        version_timeout: ostler_testkit::timeouts::secs(5),
        ..DiscoverOptions::default()
    }
}

/// A fake CLI that prints `version_line` for `--version` and otherwise behaves like the
/// option parser of a release that does not know `rejected` flags.
fn fake_cli(dir: &Path, name: &str, version_line: &str, rejected: &[&str]) -> PathBuf {
    let mut body = format!(
        "for a in \"$@\"; do\n  case \"$a\" in\n    --version) echo '{version_line}'; exit 0;;\n"
    );
    for r in rejected {
        body.push_str(&format!(
            "    {r}) echo \"error: unknown option '{r}'\" >&2; exit 1;;\n"
        ));
    }
    body.push_str("  esac\ndone\nexit 0");
    script(dir, name, &body)
}

#[tokio::test]
async fn old_version_shape_is_parsed_and_too_old_exits_78() {
    let d = tempfile::tempdir().unwrap();
    let p = fake_cli(
        d.path(),
        "claude",
        "claude v1.0.22 (anthropic-2024-12-01)",
        &[],
    );
    let e = discover(&opts(p)).await.unwrap_err();
    assert_eq!(e.exit_code(), 78);
    let inst = e
        .installation()
        .expect("incompatible carries the installation");
    assert_eq!(inst.version, semver::Version::new(1, 0, 22));
    assert_eq!(inst.api_date.as_deref(), Some("2024-12-01"));
    assert_eq!(inst.level, CompatLevel::Incompatible);
    assert!(e.to_string().contains(compat::matrix().minimum), "{e}");
}

#[tokio::test]
async fn old_shape_new_enough_runs() {
    let d = tempfile::tempdir().unwrap();
    let p = fake_cli(
        d.path(),
        "claude",
        "claude v1.0.125 (anthropic-2025-09-01)",
        &[],
    );
    let inst = discover(&opts(p)).await.unwrap();
    assert_eq!(inst.api_date.as_deref(), Some("2025-09-01"));
    // Not pinned but inside the tested range, past every boundary.
    assert_eq!(inst.level, CompatLevel::FullyCompatible, "{}", inst.message);
    assert_eq!(inst.adapter, "v1_0");
}

#[tokio::test]
async fn hanging_binary_times_out_with_78_and_is_killed() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("pid");
    // The script and its child both hang; the whole group must go.
    let p = script(
        d.path(),
        "claude",
        &format!("sleep 300 &\necho $! > {}\nwait", marker.display()),
    );
    let mut o = opts(p);
    o.version_timeout = ostler_testkit::timeouts::millis(500);
    let t = Instant::now();
    let e = discover(&o).await.unwrap_err();
    assert!(
        t.elapsed() < ostler_testkit::timeouts::secs(5),
        "{:?}",
        t.elapsed()
    );
    assert!(matches!(e, DiscoverError::Timeout { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 78);
    let pid: i32 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The grandchild `sleep` was killed with the group (it may linger as a zombie of the
    // reaped shell for a moment, then init reaps it): wait for it to go.
    let deadline = Instant::now() + ostler_testkit::timeouts::secs(5);
    loop {
        let gone = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.split_whitespace().nth(2) == Some("Z"),
        };
        if gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sleep {pid} survived the timeout"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn garbage_output_exits_78() {
    let d = tempfile::tempdir().unwrap();
    let p = script(
        d.path(),
        "claude",
        "echo 'Welcome to something else entirely'",
    );
    let e = discover(&opts(p)).await.unwrap_err();
    assert!(matches!(e, DiscoverError::BadVersion { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 78);
    assert!(e.to_string().contains("Welcome"), "{e}");
}

#[tokio::test]
async fn failing_version_exits_78() {
    let d = tempfile::tempdir().unwrap();
    let p = script(d.path(), "claude", "echo 'node: bad option' >&2; exit 9");
    let e = discover(&opts(p)).await.unwrap_err();
    assert!(matches!(e, DiscoverError::Failed { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 78);
    assert!(e.to_string().contains("bad option"), "{e}");
}

#[tokio::test]
async fn missing_binary_exits_72_and_says_where_it_looked() {
    let d = tempfile::tempdir().unwrap();
    let configured = d.path().join("nope").join("claude");
    let e = discover(&opts(configured.clone())).await.unwrap_err();
    assert_eq!(e.exit_code(), 72);
    let msg = e.to_string();
    assert!(msg.contains(&configured.display().to_string()), "{msg}");
    assert!(
        msg.contains("npm install -g @anthropic-ai/claude-code"),
        "{msg}"
    );

    // Not executable.
    let plain = d.path().join("claude");
    std::fs::write(&plain, "not a program").unwrap();
    let e = discover(&opts(plain)).await.unwrap_err();
    assert_eq!(e.exit_code(), 72);

    // PATH search: two empty directories, both named in the message.
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let o = DiscoverOptions {
        search_path: Some(std::env::join_paths([a.path(), b.path()]).unwrap()),
        probe_flags: false,
        ..DiscoverOptions::default()
    };
    let e = discover(&o).await.unwrap_err();
    assert_eq!(e.exit_code(), 72);
    let msg = e.to_string();
    assert!(msg.contains(&a.path().display().to_string()), "{msg}");
    assert!(msg.contains(&b.path().display().to_string()), "{msg}");
}

#[tokio::test]
async fn path_search_finds_the_first_claude() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let p = fake_cli(b.path(), "claude", "2.1.330 (Claude Code)", &[]);
    let o = DiscoverOptions {
        search_path: Some(std::env::join_paths([a.path(), b.path()]).unwrap()),
        probe_flags: false,
        ..DiscoverOptions::default()
    };
    let inst = discover(&o).await.unwrap();
    assert_eq!(inst.path, p);
    assert_eq!(inst.level, CompatLevel::FullyCompatible);
}

#[tokio::test]
async fn newer_than_tested_is_likely_compatible() {
    let d = tempfile::tempdir().unwrap();
    let p = fake_cli(d.path(), "claude", "3.7.1 (Claude Code)", &[]);
    let inst = discover(&opts(p)).await.unwrap();
    assert_eq!(inst.level, CompatLevel::LikelyCompatible);
    assert!(
        inst.message.contains("newer than every tested release"),
        "{}",
        inst.message
    );
    assert!(inst.capabilities.stdio_permission_prompt);
}

/// An unpinned release: the probe, not the version number, decides. This fake claims a
/// version past every boundary but its option parser refuses `--include-partial-messages`.
#[tokio::test]
async fn probe_beats_version_numbers() {
    let d = tempfile::tempdir().unwrap();
    let p = fake_cli(
        d.path(),
        "claude",
        "2.0.50 (Claude Code)",
        &["--include-partial-messages", "--sdk-url"],
    );
    let mut o = opts(p);
    o.probe_flags = true;
    let inst = discover(&o).await.unwrap();
    let probe = inst.probe.as_ref().expect("probed");
    assert_eq!(
        probe.accepted.get(&Flag::IncludePartialMessages),
        Some(&false)
    );
    assert_eq!(probe.accepted.get(&Flag::ForkSession), Some(&true));
    assert_eq!(probe.sdk_url, compat::SdkUrl::Absent);
    assert!(!inst.capabilities.include_partial_messages);
    assert_eq!(inst.level, CompatLevel::Degraded);
    assert!(
        inst.degraded
            .iter()
            .any(|g| g.capability == "--include-partial-messages" && !g.workaround.is_empty())
    );
}

/// A release that accepts the flag but has no stdio permission prompts (the pre-1.0.59
/// answer) is incompatible even with a new-looking version.
#[tokio::test]
async fn probe_detects_missing_stdio_permission_tool() {
    let d = tempfile::tempdir().unwrap();
    let p = script(
        d.path(),
        "claude",
        "case \"$*\" in *--version*) echo '2.0.60 (Claude Code)'; exit 0;; esac\n\
         case \"$*\" in *--permission-prompt-tool*) echo 'Error: MCP tool stdio (passed via --permission-prompt-tool) not found. Available MCP tools: none' >&2; exit 1;; esac\n\
         exit 0",
    );
    let mut o = opts(p);
    o.probe_flags = true;
    let e = discover(&o).await.unwrap_err();
    assert_eq!(e.exit_code(), 78);
    assert_eq!(e.installation().unwrap().level, CompatLevel::Incompatible);
}

#[test]
fn matrix_levels_of_pinned_and_unpinned_releases() {
    let v = |s: &str| semver::Version::parse(s).unwrap();
    let level = |s: &str| compat::assess(&v(s), None).level;
    // Measured boundaries (contracts/compat): minimum 1.0.59.
    assert_eq!(level("1.0.58"), CompatLevel::Incompatible);
    assert_eq!(level("1.0.30"), CompatLevel::Incompatible);
    assert_eq!(level("0.2.126"), CompatLevel::Incompatible);
    assert_eq!(level("1.0.59"), CompatLevel::Degraded);
    assert_eq!(level("1.0.100"), CompatLevel::Degraded); // unpinned: no partial messages
    assert_eq!(level("1.0.112"), CompatLevel::Degraded); // unpinned: no fork
    assert_eq!(level("1.0.119"), CompatLevel::FullyCompatible);
    assert_eq!(level("1.0.128"), CompatLevel::FullyCompatible);
    assert_eq!(level("2.0.10"), CompatLevel::FullyCompatible); // unpinned, in range
    assert_eq!(level("2.1.330"), CompatLevel::FullyCompatible);
    assert_eq!(level("2.1.331"), CompatLevel::FullyCompatible); // unpinned, in range
    assert_eq!(level("2.1.332"), CompatLevel::FullyCompatible); // newest pinned
    assert_eq!(level("2.1.333"), CompatLevel::LikelyCompatible);
    assert_eq!(level("3.0.0"), CompatLevel::LikelyCompatible);

    let a = compat::assess(&v("1.0.100"), None);
    assert!(!a.capabilities.include_partial_messages);
    assert!(!a.capabilities.fork_session);
    assert_eq!(a.degraded.len(), 2, "{:?}", a.degraded);
    let a = compat::assess(&v("1.0.112"), None);
    assert!(a.capabilities.include_partial_messages);
    assert!(!a.capabilities.fork_session);
    // Recent releases announce capabilities; the matrix keeps them for pinned releases.
    assert!(
        compat::assess(&v("2.1.330"), None)
            .capabilities
            .announces("interrupt_receipt_v1")
    );
    // ... each release its own: 2.1.332 added `mcp_call_soft_error_result_v1`.
    let announces = |s: &str| {
        compat::assess(&v(s), None)
            .capabilities
            .announces("mcp_call_soft_error_result_v1")
    };
    assert!(announces("2.1.332"));
    assert!(!announces("2.1.330"));
    assert!(
        compat::assess(&v("1.0.128"), None)
            .capabilities
            .announced
            .is_empty()
    );
    // --sdk-url, from its two measured boundaries, on releases nobody pinned.
    let sdk = |s: &str| compat::assess(&v(s), None).capabilities.sdk_url;
    assert_eq!(sdk("1.0.110"), compat::SdkUrl::Absent);
    assert_eq!(sdk("2.0.10"), compat::SdkUrl::Loopback);
    assert_eq!(sdk("2.1.200"), compat::SdkUrl::AnthropicOnly);
}

#[test]
fn matrix_minimum_and_boundaries_are_consistent() {
    let m = compat::matrix();
    let min = m.minimum_version();
    for t in m.tested {
        let tv = semver::Version::parse(t.version).unwrap();
        assert_eq!(t.stdio_permission_prompt, tv >= min, "{}", t.version);
    }
    for b in m.boundaries {
        assert!(
            semver::Version::parse(b.last_without).unwrap()
                < semver::Version::parse(b.first_with).unwrap()
        );
        // Both sides are pinned.
        assert!(
            m.tested.iter().any(|t| t.version == b.last_without),
            "{b:?}"
        );
        assert!(m.tested.iter().any(|t| t.version == b.first_with), "{b:?}");
    }
    let p = m.boundary("--permission-prompt-tool").unwrap();
    assert_eq!(p.first_with, m.minimum);
}

/// A fake CLI (version `version_line`, every flag accepted) that appends its arguments to
/// `runs` each time it is started.
fn counting_cli(dir: &Path, runs: &Path, version_line: &str) -> PathBuf {
    script(
        dir,
        "claude",
        &format!(
            "echo \"$*\" >> '{}'\n\
             case \"$*\" in *--version*) echo '{version_line}'; exit 0;; esac\n\
             exit 0",
            runs.display()
        ),
    )
}

/// (runs of `--version`, probe runs) recorded in `runs` so far.
fn runs_of(runs: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(runs).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let version = lines.iter().filter(|l| l.contains("--version")).count();
    (version, lines.len() - version)
}

/// The discovery cache: a second discovery of an unchanged binary runs it zero times and
/// returns the same installation; a probe is measured when a cache without one is asked for
/// it (and then reused), and dropped from the result when probing is off; a rewritten or
/// touched binary is measured again; a corrupt or foreign cache file is ignored (and
/// replaced). The file is 0600 in a directory made 0700.
#[tokio::test]
async fn discovery_cache_skips_measuring_an_unchanged_binary() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    let p = counting_cli(d.path(), &runs, "2.0.50 (Claude Code)");
    let cache = d.path().join("data").join("claude-discovery.json");
    let mut o = opts(p.clone());
    o.cache = Some(cache.clone());

    let first = discover(&o).await.unwrap();
    assert_eq!(runs_of(&runs), (1, 0));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o600);
    assert_eq!(mode(cache.parent().unwrap()), 0o700);
    let again = discover(&o).await.unwrap();
    assert_eq!(runs_of(&runs), (1, 0), "an unchanged binary is not run");
    assert_eq!(again, first);

    // Probing on, with a cache written without it: the probe runs (not --version) ...
    o.probe_flags = true;
    let probed = discover(&o).await.unwrap();
    let (v, probes) = runs_of(&runs);
    assert_eq!(v, 1);
    assert!(probes >= 2, "the probe ran ({probes} runs)");
    let probe = probed.probe.clone().expect("probed");
    assert_eq!(probe.accepted.get(&Flag::ForkSession), Some(&true));
    assert_eq!(probed.version, first.version);
    // ... and is then reused; probing off again leaves it out of the result.
    assert_eq!(discover(&o).await.unwrap(), probed);
    o.probe_flags = false;
    assert_eq!(discover(&o).await.unwrap(), first);
    assert_eq!(runs_of(&runs), (1, probes), "nothing ran again");

    // Rewritten (another size): measured again.
    let p = counting_cli(d.path(), &runs, "2.1.332 (Claude Code)");
    let upgraded = discover(&o).await.unwrap();
    assert_eq!(upgraded.version, semver::Version::new(2, 1, 332));
    assert_eq!(runs_of(&runs), (2, probes));
    // Touched (same content, new mtime): measured again.
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (3, probes));
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (3, probes));

    // A file written by another ostler (other probed flags, say) is ignored.
    let mut foreign: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    foreign["ostler"] = "0.0.0-another".into();
    std::fs::write(&cache, foreign.to_string()).unwrap();
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (4, probes));
    // A corrupt file is ignored and replaced by a good one.
    std::fs::write(&cache, "{\"format\": 1, \"entr").unwrap();
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (5, probes));
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (5, probes));
    // An unreadable one (a directory in its place) is no error either.
    std::fs::remove_file(&cache).unwrap();
    std::fs::create_dir(&cache).unwrap();
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (6, probes));
    // Without a cache every discovery measures.
    o.cache = None;
    assert_eq!(discover(&o).await.unwrap(), upgraded);
    assert_eq!(runs_of(&runs), (7, probes));
}
