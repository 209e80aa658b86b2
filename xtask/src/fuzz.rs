//! `cargo xtask fuzz`: the time-bounded property fuzzers of `ostler-fuzz` (stable Rust).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ostler_fuzz::{Budget, Seed};

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Total time, split evenly across the targets run.
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
    let share = Duration::from_secs(a.secs) / u32::try_from(targets.len().max(1))?;
    let mut failures = Vec::new();
    for name in &targets {
        let started = Instant::now();
        let budget = Budget {
            deadline: started + share,
            seed,
        };
        match ostler_fuzz::run(name, budget) {
            Some(Ok(r)) => eprintln!(
                "fuzz {:<10} ok: {} cases in {:.1}s ({} seeds)",
                r.target,
                r.cases,
                started.elapsed().as_secs_f64(),
                r.batches
            ),
            Some(Err(f)) => {
                eprintln!("fuzz {name:<10} FAILED\n{f}");
                failures.push(name.clone());
            }
            None => bail!("unknown fuzz target {name:?}"),
        }
    }
    let _ = std::panic::take_hook();
    if !failures.is_empty() {
        bail!("fuzz targets failed: {}", failures.join(", "));
    }
    Ok(())
}
