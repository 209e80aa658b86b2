//! Coalescing of non-JSON output: a CLI (or something it runs) that writes junk to stdout
//! must not turn each junk line into a stored event (1M two-byte lines would be 1M rows).
//!
//! Pure: no clock and no I/O; the caller passes the time. Junk lines are counted per
//! window. The first [`JunkOptions::pass_per_window`] lines of a window pass through
//! unchanged (occasional junk looks as before); the rest are counted, with a sample kept,
//! and reported as one summary [`Diagnostic`] when the window closes: after
//! [`JunkOptions::window`] (checked whenever the caller gives the time, junk or not), after
//! [`JunkOptions::max_lines`] junk lines, or at [`JunkCoalescer::finish`].
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use ostler_protocol::junk::{JunkCoalescer, JunkOptions};
//! # use ostler_protocol::{Diagnostic, DiagnosticCode};
//! let mut c = JunkCoalescer::new(JunkOptions::default());
//! let t0 = Instant::now();
//! let d = |s: &str| Diagnostic {
//!     code: DiagnosticCode::NotJson,
//!     message: "not JSON".into(),
//!     excerpt: s.into(),
//!     line_len: s.len() as u64,
//! };
//! let mut stored = 0;
//! for _ in 0..1_000_000 {
//!     stored += c.junk(d("x"), t0).into_events().count();
//! }
//! stored += c.finish().is_some() as usize;
//! assert!(stored < 1_200, "{stored}");
//! ```

use std::time::{Duration, Instant};

use crate::model::{Diagnostic, DiagnosticCode};

/// How junk is coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JunkOptions {
    /// Longest window, from its first junk line.
    pub window: Duration,
    /// Junk lines after which a window closes even before `window` has passed.
    pub max_lines: u64,
    /// Junk lines per window passed through one by one.
    pub pass_per_window: u64,
}

impl Default for JunkOptions {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            max_lines: 10_000,
            pass_per_window: 10,
        }
    }
}

/// What to emit for one junk line, in this order: the summary of a window that closed
/// (by time, before this line; or by count, with it), then the line itself if it passes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    pub summary: Option<Diagnostic>,
    pub line: Option<Diagnostic>,
}

impl Verdict {
    /// The diagnostics to emit, in order.
    pub fn into_events(self) -> impl Iterator<Item = Diagnostic> {
        self.summary.into_iter().chain(self.line)
    }
}

#[derive(Debug)]
struct Window {
    started: Instant,
    lines: u64,
    counted: u64,
    counted_bytes: u64,
    sample: Option<String>,
}

/// Per-session junk coalescer (see the module docs).
#[derive(Debug)]
pub struct JunkCoalescer {
    opts: JunkOptions,
    window: Option<Window>,
    /// Junk lines seen in all (passed and counted).
    total: u64,
}

impl JunkCoalescer {
    pub fn new(opts: JunkOptions) -> Self {
        Self {
            opts: JunkOptions {
                max_lines: opts.max_lines.max(1),
                ..opts
            },
            window: None,
            total: 0,
        }
    }

    /// Junk lines seen so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// One junk line (a `not_json` diagnostic from the decoder) at `now`.
    pub fn junk(&mut self, line: Diagnostic, now: Instant) -> Verdict {
        self.total += 1;
        let mut summary = self.poll(now);
        let w = self.window.get_or_insert(Window {
            started: now,
            lines: 0,
            counted: 0,
            counted_bytes: 0,
            sample: None,
        });
        w.lines += 1;
        let line = if w.lines <= self.opts.pass_per_window {
            Some(line)
        } else {
            w.counted += 1;
            w.counted_bytes += line.line_len;
            if w.sample.is_none() {
                w.sample = Some(line.excerpt);
            }
            None
        };
        if w.lines >= self.opts.max_lines {
            // Only one of the two can be set: a window due by time was closed above, and
            // the new one has counted lines only if it went past `pass_per_window`.
            summary = summary.or(self.close());
        }
        Verdict { summary, line }
    }

    /// Closes the window if its time has passed; returns its summary if lines were counted.
    /// Call it with the time of every line (JSON or not) so a window ends on time.
    pub fn poll(&mut self, now: Instant) -> Option<Diagnostic> {
        let due = self
            .window
            .as_ref()
            .is_some_and(|w| now.saturating_duration_since(w.started) >= self.opts.window);
        if due { self.close() } else { None }
    }

    /// Closes the current window (end of output): its summary, if lines were counted.
    pub fn finish(&mut self) -> Option<Diagnostic> {
        self.close()
    }

    fn close(&mut self) -> Option<Diagnostic> {
        let w = self.window.take()?;
        (w.counted > 0).then(|| Diagnostic {
            code: DiagnosticCode::NotJson,
            message: format!(
                "{} more non-JSON lines ({} bytes) were counted, not stored one by one \
                 (the sample is the first of them)",
                w.counted, w.counted_bytes
            ),
            excerpt: w.sample.unwrap_or_default(),
            line_len: w.counted_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Diagnostic {
        Diagnostic {
            code: DiagnosticCode::NotJson,
            message: "not JSON".into(),
            excerpt: s.into(),
            line_len: s.len() as u64,
        }
    }

    /// Everything emitted for `lines` junk lines at the given times, then `finish`.
    fn run(
        c: &mut JunkCoalescer,
        lines: impl IntoIterator<Item = (Instant, String)>,
    ) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        for (t, s) in lines {
            out.extend(c.junk(d(&s), t).into_events());
        }
        out.extend(c.finish());
        out
    }

    #[test]
    fn a_few_junk_lines_pass_unchanged() {
        let mut c = JunkCoalescer::new(JunkOptions::default());
        let t = Instant::now();
        let out = run(&mut c, (0..3).map(|i| (t, format!("line {i}"))));
        assert_eq!(out, vec![d("line 0"), d("line 1"), d("line 2")]);
    }

    #[test]
    fn a_flood_becomes_one_summary_per_window_by_count() {
        let opts = JunkOptions {
            window: Duration::from_secs(3600),
            max_lines: 1000,
            pass_per_window: 2,
        };
        let mut c = JunkCoalescer::new(opts);
        let t = Instant::now();
        let out = run(&mut c, (0..1_000_000).map(|_| (t, "ab".to_string())));
        // 1000 windows: 2 passed + 1 summary each.
        assert_eq!(out.len(), 3000, "{}", out.len());
        assert_eq!(c.total(), 1_000_000);
        let summaries: Vec<&Diagnostic> = out.iter().filter(|x| x.line_len == 998 * 2).collect();
        assert_eq!(summaries.len(), 1000);
        assert!(summaries[0].message.contains("998 more non-JSON lines"));
        assert_eq!(summaries[0].excerpt, "ab");
        let counted: u64 = summaries.iter().map(|s| s.line_len / 2).sum();
        let passed = out.len() as u64 - summaries.len() as u64;
        assert_eq!(counted + passed, 1_000_000, "every line is accounted for");
    }

    #[test]
    fn windows_close_by_time_given_by_the_caller() {
        let opts = JunkOptions {
            window: Duration::from_secs(10),
            max_lines: 1_000_000,
            pass_per_window: 1,
        };
        let mut c = JunkCoalescer::new(opts);
        let t0 = Instant::now();
        let pass = |x: &str| Verdict {
            summary: None,
            line: Some(d(x)),
        };
        assert_eq!(c.junk(d("first"), t0), pass("first"));
        let counted = Verdict::default();
        assert_eq!(c.junk(d("second"), t0 + Duration::from_secs(1)), counted);
        assert_eq!(c.junk(d("third"), t0 + Duration::from_secs(2)), counted);
        // Not due yet; then due on a poll without junk (e.g. a JSON line).
        assert_eq!(c.poll(t0 + Duration::from_secs(9)), None);
        let s = c
            .poll(t0 + Duration::from_secs(10))
            .expect("summary when due");
        assert!(
            s.message.starts_with("2 more non-JSON lines (11 bytes)"),
            "{}",
            s.message
        );
        assert_eq!(s.excerpt, "second");
        assert_eq!(c.poll(t0 + Duration::from_secs(30)), None, "nothing open");
        // A new window: its first line passes again.
        assert_eq!(
            c.junk(d("later"), t0 + Duration::from_secs(31)),
            pass("later")
        );
        assert_eq!(c.junk(d("x"), t0 + Duration::from_secs(32)), counted);
        // Due when the next junk line arrives: summary first, then the line opens a window.
        let v = c.junk(d("next"), t0 + Duration::from_secs(45));
        let s = v.summary.expect("the due window's summary");
        assert!(s.message.starts_with("1 more"), "{}", s.message);
        assert_eq!(v.line, Some(d("next")));
        assert_eq!(c.finish(), None, "the new window counted nothing yet");
    }
}
