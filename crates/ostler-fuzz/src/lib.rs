//! Time-bounded property fuzzing on stable Rust (`cargo xtask fuzz`).
//!
//! Each target is a proptest strategy plus a property, run in batches with fresh random
//! seeds until a deadline. A failing case is shrunk by proptest; the [`Failure`] carries
//! the minimal input and the batch seed, which replays the failure deterministically
//! (`cargo xtask fuzz --target <name> --seed <hex>`). Targets:
//! - [`framer`]: `LineFramer` over arbitrary chunkings of arbitrary bytes and of mutated
//!   contract recordings equals a reference split, keeps its caps; every adapter's
//!   `Decoder` reads every frame without panicking.
//! - [`codec`]: events decoded from arbitrary and mutated CLI lines survive the stored-event
//!   encoding (`EventPayload::encode_stored` -> `decode_stored`) unchanged; damaged stored
//!   payloads never panic; the outbound gRPC conversion accepts every event.
//! - [`permission`]: the rule parser never panics, `parse -> text -> parse` is stable,
//!   rule evaluation keeps "deny wins" and "an allow rule never matches a compound Bash
//!   command".
//! - [`convert`]: gRPC request conversions on arbitrary messages (built, or decoded from
//!   arbitrary / mutated bytes) give a value or a short `INVALID_ARGUMENT`.
//! - [`interaction`]: `GetInteraction` (handler, engine, a real store) and the store's
//!   lookup on arbitrary request / session ids agree with a reference model (exact id, else
//!   a unique prefix; LIKE wildcards and the last code points never widen a match); errors
//!   are a short `NOT_FOUND` / `INVALID_ARGUMENT` naming what is wrong.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

mod codec;
mod convert;
pub mod corpus;
mod framer;
mod generate;
mod interaction;
mod permission;

pub use codec::codec;
pub use convert::convert;
pub use framer::framer;
pub use interaction::interaction;
pub use permission::permission;

/// Cases per batch (one seed each); the deadline is checked between batches.
const BATCH: u32 = 32;

/// A batch seed (ChaCha, 32 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub [u8; 32]);

impl Seed {
    /// A fresh seed from the process's hash keys and the clock.
    pub fn random() -> Self {
        let mut out = [0u8; 32];
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            h.write_u128(nanos);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        Seed(out)
    }

    /// Parses 64 hex digits.
    pub fn parse(hex: &str) -> Result<Self, SeedError> {
        let hex = hex.trim();
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(SeedError);
        }
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).ok_or(SeedError)?;
            *b = u8::from_str_radix(pair, 16).map_err(|_| SeedError)?;
        }
        Ok(Seed(out))
    }
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("a seed is 64 hex digits")]
pub struct SeedError;

/// When to stop, and whether to replay one seed instead of generating new ones.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub deadline: Instant,
    /// `Some`: run exactly one batch with this seed (reproduces a reported failure).
    pub seed: Option<Seed>,
}

impl Budget {
    /// Run for `d` from now with random seeds.
    pub fn for_duration(d: Duration) -> Self {
        Self {
            deadline: Instant::now() + d,
            seed: None,
        }
    }
}

/// What a target run did.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: &'static str,
    /// Generated cases that held (all of them, when the run passed).
    pub cases: u64,
    /// Batches run (one seed each).
    pub batches: u64,
}

/// A property that failed: the minimal (shrunk) input and the seed that finds it again.
#[derive(Debug, thiserror::Error)]
#[error(
    "fuzz target `{target}` failed: {reason}\nminimal input: {input}\nreproduce with: \
     cargo xtask fuzz --target {target} --seed {seed}"
)]
pub struct Failure {
    pub target: &'static str,
    pub seed: Seed,
    pub reason: String,
    /// `Debug` of the shrunk input (cut to a few KiB).
    pub input: String,
}

/// The targets, by name.
pub const TARGETS: &[&str] = &["framer", "codec", "permission", "convert", "interaction"];

/// Runs the target called `name` (one of [`TARGETS`]); `None` for an unknown name.
pub fn run(name: &str, budget: Budget) -> Option<Result<Report, Failure>> {
    Some(match name {
        "framer" => framer(budget),
        "codec" => codec(budget),
        "permission" => permission(budget),
        "convert" => convert(budget),
        "interaction" => interaction(budget),
        _ => return None,
    })
}

/// Cut for printing.
pub(crate) fn clip(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &s[..end], s.len())
}

/// The batch loop shared by the targets.
pub(crate) fn drive<S>(
    target: &'static str,
    budget: Budget,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<Report, Failure>
where
    S: Strategy,
    S::Value: fmt::Debug,
{
    let mut report = Report {
        target,
        cases: 0,
        batches: 0,
    };
    loop {
        let seed = budget.seed.unwrap_or_else(Seed::random);
        let config = Config {
            cases: BATCH,
            failure_persistence: None,
            max_shrink_iters: 20_000,
            max_shrink_time: 60_000,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed.0);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&strategy, &test);
        report.batches += 1;
        match result {
            Ok(()) => report.cases += u64::from(BATCH),
            Err(TestError::Fail(reason, value)) => {
                return Err(Failure {
                    target,
                    seed,
                    reason: clip(reason.to_string(), 4096),
                    input: clip(format!("{value:?}"), 8192),
                });
            }
            Err(TestError::Abort(reason)) => {
                return Err(Failure {
                    target,
                    seed,
                    reason: format!("aborted: {reason}"),
                    input: String::new(),
                });
            }
        }
        if budget.seed.is_some() || Instant::now() >= budget.deadline {
            return Ok(report);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prop_assert;

    fn below_500(x: u32) -> Result<(), TestCaseError> {
        prop_assert!(x < 500, "{x} is not below 500");
        Ok(())
    }

    #[test]
    fn a_failure_is_shrunk_and_its_seed_replays_it() {
        let budget = Budget::for_duration(Duration::from_secs(30));
        let Err(f) = drive("demo", budget, 0u32..100_000, below_500) else {
            panic!("the property cannot hold for 30 s of random u32s");
        };
        assert_eq!(f.input, "500", "not shrunk to the minimum: {f}");
        assert!(f.to_string().contains(&format!("--seed {}", f.seed)));
        let replay = Budget {
            deadline: Instant::now(),
            seed: Some(f.seed),
        };
        let Err(again) = drive("demo", replay, 0u32..100_000, below_500) else {
            panic!("seed {} did not reproduce the failure", f.seed);
        };
        assert_eq!(again.input, "500");
    }
}
