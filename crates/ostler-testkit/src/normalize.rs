//! Normalization of nondeterministic values in recorded lines, done on the text so that
//! the CLI's own key order and formatting stay as emitted.
//!
//! - temp paths: the hermetic HOME → `/TMP/home`, cwd → `/TMP/cwd`, their root → `/TMP`,
//!   also in the CLI's dash-encoded project directory names (`-TMP-cwd`);
//! - UUIDs (anywhere, also inside strings and paths) → `00000000-0000-4000-8000-00000000000N`,
//!   numbered by first appearance, so identity is kept;
//! - random ids of the CLI (values of [`ID_KEYS`] such as `request_id`, `task_id`,
//!   `agent_id`, except ids made by ostler) → `request-N`, `task-N`, `agent-N`, ... also
//!   where they reappear inside text (two passes: [`Normalizer::learn`] then
//!   [`Normalizer::line`]);
//! - `/tmp/claude-<uid>/` → `/TMP/claude-UID/`, `/tmp/cc-socks/<pid>.sock` →
//!   `/TMP/cc-socks/PID.sock`;
//! - ISO-8601 timestamps → `1970-01-01T00:00:00.000Z`;
//! - durations, timings and epoch times (see [`VOLATILE_NUMBER_KEYS`], and any key ending
//!   in `_ms`, `Ms`, `_seconds`, `_time`, `Time`, `_at` with a number) → `0`.

use std::collections::HashMap;
use std::path::Path;

/// Keys whose numeric values are timings.
pub const VOLATILE_NUMBER_KEYS: &[&str] = &[
    "duration_ms",
    "duration_api_ms",
    "ttft_ms",
    "elapsed_time_seconds",
    "elapsedTimeMs",
    "durationMs",
    "retry_delay_ms",
    "retry_in_ms",
    "delay_ms",
    "totalDurationMs",
    "api_duration_ms",
    "pid",
];

/// Keys whose string values are random ids made by the CLI (`request_id` values made by
/// ostler, see [`OSTLER_REQUEST_PREFIX`], are kept).
pub const ID_KEYS: &[&str] = &["request_id", "task_id", "run_id", "agent_id", "agentId"];

/// Prefix of request ids ostler itself generates (kept as they are).
pub const OSTLER_REQUEST_PREFIX: &str = "ostler-req-";

/// Stateful normalizer: one per recording (identity of uuids is kept across lines).
#[derive(Debug, Default)]
pub struct Normalizer {
    paths: Vec<(String, String)>,
    uuids: HashMap<String, String>,
    /// learned CLI ids → placeholder, longest first
    ids: Vec<(String, String)>,
}

/// Dash-encoded form the CLI uses for project directories.
fn dash_encode(p: &str) -> String {
    p.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

impl Normalizer {
    /// `root` contains `home` and `cwd` (as made by [`crate::cli::Hermetic`]).
    pub fn new(root: &Path, home: &Path, cwd: &Path) -> Self {
        let mut paths = Vec::new();
        let mut add = |from: &Path, to: &str| {
            let s = from.display().to_string();
            paths.push((dash_encode(&s), dash_encode(to)));
            paths.push((s.replace('/', "-"), to.replace('/', "-")));
            paths.push((s, to.to_string()));
            if let Ok(c) = from.canonicalize() {
                let c = c.display().to_string();
                paths.push((dash_encode(&c), dash_encode(to)));
                paths.push((c.clone(), to.to_string()));
            }
        };
        add(home, "/TMP/home");
        add(cwd, "/TMP/cwd");
        add(root, "/TMP");
        // longest first so that home/cwd win over root
        paths.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        paths.dedup();
        Self {
            paths,
            ..Self::default()
        }
    }

    /// Also replace `from` by `to` everywhere (e.g. the fake server's `127.0.0.1:PORT`).
    pub fn replace(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.paths.push((from.into(), to.into()));
        self.paths.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        self
    }

    /// A normalizer that only handles uuids, ids, times (no paths).
    pub fn without_paths() -> Self {
        Self::default()
    }

    /// Normalize one line of text.
    pub fn line(&mut self, s: &str) -> String {
        let mut out = s.to_string();
        for (from, to) in &self.paths {
            if !from.is_empty() && out.contains(from.as_str()) {
                out = out.replace(from.as_str(), to);
            }
        }
        out = self.ids_in(&out);
        out = self.uuids_in(&out);
        out = timestamps_in(&out);
        for key in VOLATILE_NUMBER_KEYS {
            out = zero_numbers(&out, key);
        }
        out = zero_timing_keys(&out);
        out = zero_text_timings(&out);
        out = socket_paths(&out);
        out = uid_temp_dirs(&out);
        out
    }

    fn uuids_in(&mut self, s: &str) -> String {
        let b = s.as_bytes();
        if b.len() < 36 {
            return s.to_string();
        }
        let mut out = String::with_capacity(s.len());
        let mut i = 0;
        let mut last = 0;
        while i + 36 <= b.len() {
            if is_uuid(&b[i..i + 36])
                && (i == 0 || !b[i - 1].is_ascii_hexdigit())
                && b.get(i + 36).is_none_or(|c| !c.is_ascii_hexdigit())
            {
                let found = &s[i..i + 36];
                let next = self.uuids.len() + 1;
                let rep = self
                    .uuids
                    .entry(found.to_ascii_lowercase())
                    .or_insert_with(|| format!("00000000-0000-4000-8000-{next:012}"))
                    .clone();
                out.push_str(&s[last..i]);
                out.push_str(&rep);
                i += 36;
                last = i;
            } else {
                i += 1;
            }
        }
        out.push_str(&s[last..]);
        out
    }

    /// Learn the random ids of a line (values of [`ID_KEYS`]) so that [`Self::line`]
    /// replaces them everywhere, also where they appear inside text. Call it for every
    /// line of a recording before normalizing any.
    pub fn learn(&mut self, s: &str) {
        for key in ID_KEYS {
            let pat = format!("\"{key}\":\"");
            let mut rest = s;
            while let Some(pos) = rest.find(&pat) {
                let tail = &rest[pos + pat.len()..];
                let end = tail.find('"').unwrap_or(tail.len());
                let id = &tail[..end];
                if id.len() >= 6
                    && !id.starts_with(OSTLER_REQUEST_PREFIX)
                    && !self.ids.iter().any(|(k, _)| k == id)
                {
                    let short = key.trim_end_matches("_id").trim_end_matches("Id");
                    let n = self
                        .ids
                        .iter()
                        .filter(|(_, v)| v.starts_with(&format!("{short}-")))
                        .count()
                        + 1;
                    self.ids.push((id.to_string(), format!("{short}-{n}")));
                }
                rest = &tail[end..];
            }
        }
        self.ids.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    }

    fn ids_in(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (from, to) in &self.ids {
            if out.contains(from.as_str()) {
                out = out.replace(from.as_str(), to);
            }
        }
        out
    }
}

fn is_uuid(w: &[u8]) -> bool {
    w.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    })
}

/// `dddd-dd-ddTdd:dd:dd[.d+][Z|±hh:mm]` → fixed.
fn timestamps_in(s: &str) -> String {
    let b = s.as_bytes();
    let pat = b"dddd-dd-ddTdd:dd:dd";
    if b.len() < pat.len() {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut last = 0;
    while i + pat.len() <= b.len() {
        let ok = pat.iter().zip(&b[i..]).all(|(p, c)| match p {
            b'd' => c.is_ascii_digit(),
            other => other == c,
        });
        if ok {
            let mut j = i + pat.len();
            if b.get(j) == Some(&b'.') {
                j += 1;
                while b.get(j).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
            }
            if b.get(j) == Some(&b'Z') {
                j += 1;
            } else if matches!(b.get(j), Some(b'+') | Some(b'-'))
                && b.len() >= j + 6
                && b[j + 3] == b':'
            {
                j += 6;
            }
            out.push_str(&s[last..i]);
            out.push_str("1970-01-01T00:00:00.000Z");
            i = j;
            last = j;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[last..]);
    out
}

/// Any `"<x>_ms":<number>`, `"<x>Ms":<number>`, `"<x>_seconds":<number>` → 0 (timings).
fn zero_timing_keys(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    let mut i = 0;
    while let Some(off) = s[i..].find("\":") {
        let q = i + off; // index of the closing quote of a key
        let key_start = s[..q].rfind('"').map(|p| p + 1).unwrap_or(q);
        let key = &s[key_start..q];
        let mut j = q + 2;
        while b.get(j) == Some(&b' ') {
            j += 1;
        }
        let num_start = j;
        while b
            .get(j)
            .is_some_and(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'))
        {
            j += 1;
        }
        let timing = key.ends_with("_ms")
            || key.ends_with("Ms")
            || key.ends_with("_seconds")
            || key.ends_with("_time")
            || key.ends_with("Time")
            || key.ends_with("_at");
        if timing && j > num_start && !key.contains(['{', '}', ',', ':', '\\']) {
            out.push_str(&s[last..num_start]);
            out.push('0');
            last = j;
        }
        i = j.max(q + 2);
    }
    out.push_str(&s[last..]);
    out
}

/// `<x>_ms: <digits>` inside text (sub-agent usage summaries of 2.1.x) → `<x>_ms: 0`.
fn zero_text_timings(s: &str) -> String {
    const PAT: &str = "_ms: ";
    if !s.contains(PAT) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(PAT) {
        let start = pos + PAT.len();
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let n = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        if n > 0 {
            out.push('0');
        }
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

/// `/tmp/cc-socks/<pid>.sock` (2.1.330's `messaging_socket_path`) → `/TMP/cc-socks/PID.sock`.
fn socket_paths(s: &str) -> String {
    const PAT: &str = "/cc-socks/";
    if !s.contains(PAT) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(PAT) {
        // the directory before /cc-socks/ is the system temp dir
        let dir_start = rest[..pos].rfind('"').map(|p| p + 1).unwrap_or(pos);
        out.push_str(&rest[..dir_start]);
        out.push_str("/TMP/cc-socks/");
        let tail = &rest[pos + PAT.len()..];
        let n = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        out.push_str("PID");
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

/// `/tmp/claude-<uid>/` (2.1.x task output files) → `/TMP/claude-UID/`.
fn uid_temp_dirs(s: &str) -> String {
    const PAT: &str = "/tmp/claude-";
    if !s.contains(PAT) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(PAT) {
        let tail = &rest[pos + PAT.len()..];
        let n = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        out.push_str(&rest[..pos]);
        if n > 0 && tail[n..].starts_with('/') {
            out.push_str("/TMP/claude-UID");
            rest = &tail[n..];
        } else {
            out.push_str(PAT);
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// `"key":<number>` → `"key":0`.
fn zero_numbers(s: &str, key: &str) -> String {
    let pat = format!("\"{key}\":");
    if !s.contains(&pat) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(&pat) {
        let start = pos + pat.len();
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let ws = tail.len() - tail.trim_start().len();
        let t = &tail[ws..];
        let n = t
            .find(|c: char| !(c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E')))
            .unwrap_or(t.len());
        if n > 0 {
            out.push_str(&tail[..ws]);
            out.push('0');
            rest = &t[n..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_keep_identity() {
        let mut n = Normalizer::without_paths();
        let a = "6c4d07e2-a34e-4404-bc5c-35d432986ac9";
        let b = "9207E551-2519-4e57-a22e-b9562fcfcc19";
        let line = format!(r#"{{"uuid":"{a}","session_id":"{b}","p":"/x/{a}.jsonl"}}"#);
        let out = n.line(&line);
        assert_eq!(
            out,
            r#"{"uuid":"00000000-0000-4000-8000-000000000001","session_id":"00000000-0000-4000-8000-000000000002","p":"/x/00000000-0000-4000-8000-000000000001.jsonl"}"#
        );
        // the same uuid later in another line maps the same way
        assert_eq!(
            n.line(&format!("\"{b}\"")),
            "\"00000000-0000-4000-8000-000000000002\""
        );
    }

    #[test]
    fn times_and_durations() {
        let mut n = Normalizer::without_paths();
        let out = n.line(
            r#"{"duration_ms":1234,"duration_api_ms": 5.5,"timestamp":"2026-11-22T22:11:01.123Z","x":"at 2026-01-02T03:04:05+01:00"}"#,
        );
        assert_eq!(
            out,
            r#"{"duration_ms":0,"duration_api_ms": 0,"timestamp":"1970-01-01T00:00:00.000Z","x":"at 1970-01-01T00:00:00.000Z"}"#
        );
    }

    #[test]
    fn timing_keys_and_sockets() {
        let mut n = Normalizer::without_paths();
        let out = n.line(
            r#"{"ttft_stream_ms":162,"thinkingMs": 3,"a_seconds":1.5,"num_turns":2,"messaging_socket_path":"/tmp/cc-socks/16973.sock","text":"x_ms\":5","u":"tool_uses: 1\nduration_ms: 1175</usage>"}"#,
        );
        assert_eq!(
            out,
            r#"{"ttft_stream_ms":0,"thinkingMs": 0,"a_seconds":0,"num_turns":2,"messaging_socket_path":"/TMP/cc-socks/PID.sock","text":"x_ms\":5","u":"tool_uses: 1\nduration_ms: 0</usage>"}"#
        );
    }

    #[test]
    fn request_ids_and_paths() {
        let root = tempfile::tempdir().expect("tempdir");
        let home = root.path().join("home");
        let cwd = root.path().join("cwd");
        let mut n = Normalizer::new(root.path(), &home, &cwd);
        let line = format!(
            r#"{{"request_id":"abc1234","cwd":"{}","h":"{}/.claude/projects/{}/x","r":"{}/other","o":"ostler-req-1","f":"/tmp/claude-0/x"}}"#,
            cwd.display(),
            home.display(),
            cwd.display().to_string().replace(['/', '.'], "-"),
            root.path().display(),
        );
        let text = r#"{"text":"agentId: a68d6ed1924f5ab6e (use it)"}"#;
        n.learn(text);
        n.learn(&line);
        n.learn(r#"{"task_id":"a68d6ed1924f5ab6e","request_id":"ostler-req-2"}"#);
        let out = n.line(&line);
        assert_eq!(
            out,
            r#"{"request_id":"request-1","cwd":"/TMP/cwd","h":"/TMP/home/.claude/projects/-TMP-cwd/x","r":"/TMP/other","o":"ostler-req-1","f":"/TMP/claude-UID/x"}"#
        );
        assert_eq!(
            n.line(r#"{"request_id":"abc1234"}"#),
            r#"{"request_id":"request-1"}"#
        );
        assert_eq!(n.line(text), r#"{"text":"agentId: task-1 (use it)"}"#);
    }
}
