//! `cargo xtask fuzz`: the time-bounded property fuzzers of `ostler-fuzz` (stable Rust).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ostler_fuzz::{Budget, Seed};

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Total time: the targets run side by side, one per core, and share it evenly.
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
    /// Run only this target (framer, codec, permission, convert, interaction); repeatable.
    #[arg(long)]
    pub target: Vec<String>,
    /// Replay one batch with this seed (as printed by a failure) instead of fuzzing.
    #[arg(long)]
    pub seed: Option<String>,
}

pub fn fuzz(a: FuzzArgs) -> Result<()> {
    let targets: Vec<String> = if a.target.is_empty() {
        ostler_fuzz::TARGETS.iter().map(|t| t.to_string()).collect()
    } else {
        a.target
    };
    if let Some(bad) = targets
        .iter()
        .find(|t| !ostler_fuzz::TARGETS.contains(&t.as_str()))
    {
        bail!(
            "unknown fuzz target {bad:?} (targets: {})",
            ostler_fuzz::TARGETS.join(", ")
        );
    }
    let seed = match &a.seed {
        Some(s) => Some(Seed::parse(s)?),
        None => None,
    };
    // Failing cases are caught and shrunk by proptest; keep their many panic messages out
    // of the output (the failure report says what failed).
    std::panic::set_hook(Box::new(|_| {}));
    // The targets run side by side, one per core, so that the whole run takes `secs`:
    // each gets `secs / rounds`, a round being one target on every core (a target
    // overruns its share by at most the batch it is in at its deadline).
    let lanes = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(1, targets.len().max(1));
    let rounds = targets.len().div_ceil(lanes).max(1);
    let share = Duration::from_secs(a.secs) / u32::try_from(rounds)?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..lanes {
            s.spawn(|| {
                while let Some(name) =
                    targets.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    let started = Instant::now();
                    let budget = Budget {
                        deadline: started + share,
                        seed,
                    };
                    let failed = match ostler_fuzz::run(name, budget) {
                        Some(Ok(r)) => {
                            eprintln!(
                                "fuzz {:<10} ok: {} cases in {:.1}s ({} seeds)",
                                r.target,
                                r.cases,
                                started.elapsed().as_secs_f64(),
                                r.batches
                            );
                            false
                        }
                        Some(Err(f)) => {
                            eprintln!("fuzz {name:<10} FAILED\n{f}");
                            true
                        }
                        // checked above: every name is a target
                        None => {
                            eprintln!("fuzz {name:<10} FAILED: unknown target");
                            true
                        }
                    };
                    if failed {
                        failures
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(name.clone());
                    }
                }
            });
        }
    });
    let failures = failures
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = std::panic::take_hook();
    if !failures.is_empty() {
        bail!("fuzz targets failed: {}", failures.join(", "));
    }
    Ok(())
}
