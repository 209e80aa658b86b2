//! Test timeouts, all derived from one scale factor.
//!
//! Every deadline a test waits under (a guard against a wedged test, a control request
//! timeout, a stop grace passed in options) is a base figure times [`scale()`]: the value of
//! `OSTLER_TEST_TIMEOUT_SCALE` (a positive number, e.g. `0.5`, `1`, `10`), else
//! [`DEFAULT_SCALE`]. The base figures hold on a quiet machine; the default scale makes them
//! hold on two cores kept busy by other work (a CI run once failed there with a real CLI's
//! `initialize` answer taking longer than 8 s). A guard that fires only fails a test that
//! would otherwise hang, so a generous scale costs nothing on a healthy run.
//!
//! Timeouts that a test expects to fire (a stall detector, a permission expiry) are behaviour
//! under test, not guards; scaling them is up to the test, and any bound it asserts on the
//! time they take scales with them.

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable holding the scale factor.
pub const SCALE_ENV: &str = "OSTLER_TEST_TIMEOUT_SCALE";

/// The scale when [`SCALE_ENV`] is not set.
pub const DEFAULT_SCALE: f64 = 3.0;

/// The base of [`guard()`]: the longest any single awaited step of a test may take on a
/// quiet machine.
pub const GUARD_BASE: Duration = Duration::from_secs(60);

/// Parses a scale factor: a finite number > 0 and at most 1000.
pub fn parse_scale(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{SCALE_ENV}={text:?} is not a number"))?;
    if v.is_finite() && v > 0.0 && v <= 1000.0 {
        Ok(v)
    } else {
        Err(format!(
            "{SCALE_ENV}={text:?} is out of range (a number > 0 and <= 1000)"
        ))
    }
}

/// The scale factor (read once per process). An unusable value of [`SCALE_ENV`] is
/// reported on stderr and [`DEFAULT_SCALE`] is used.
pub fn scale() -> f64 {
    static SCALE: OnceLock<f64> = OnceLock::new();
    *SCALE.get_or_init(|| match std::env::var(SCALE_ENV) {
        Ok(text) if !text.trim().is_empty() => parse_scale(&text).unwrap_or_else(|e| {
            eprintln!("ostler-testkit: {e}; using {DEFAULT_SCALE}");
            DEFAULT_SCALE
        }),
        _ => DEFAULT_SCALE,
    })
}

/// `base` times the scale factor.
pub fn scaled(base: Duration) -> Duration {
    base.mul_f64(scale())
}

/// `n` seconds, scaled.
pub fn secs(n: u64) -> Duration {
    scaled(Duration::from_secs(n))
}

/// `n` milliseconds, scaled.
pub fn millis(n: u64) -> Duration {
    scaled(Duration::from_millis(n))
}

/// The guard for one awaited step of a test ([`GUARD_BASE`], scaled); never used to wait
/// for something to happen, only to fail instead of hanging.
pub fn guard() -> Duration {
    scaled(GUARD_BASE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_values() {
        assert_eq!(parse_scale("1"), Ok(1.0));
        assert_eq!(parse_scale(" 2.5 "), Ok(2.5));
        for bad in ["0", "-1", "abc", "NaN", "inf", "1e9", ""] {
            assert!(parse_scale(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn scaled_durations_follow_the_scale() {
        let s = scale();
        assert!(s > 0.0);
        assert_eq!(secs(8), Duration::from_secs(8).mul_f64(s));
        assert_eq!(millis(500), Duration::from_millis(500).mul_f64(s));
        assert_eq!(guard(), GUARD_BASE.mul_f64(s));
    }
}
