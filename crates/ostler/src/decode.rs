//! `ostler decode [--release V] FILE|-`: canonical events of an NDJSON stream as JSON
//! lines on stdout, a summary line on stderr. Events are named like the client's `--json`
//! output: `{"type": "<event>", ...}`, the turn's end as `turn_completed` (the protocol
//! crate's own serialization says `kind` / `turn_result`). Accepts raw CLI stdout and contract
//! recordings (detected by their header line). Exits 0 on any readable bytes: what cannot be
//! decoded shows up as `diagnostic` / `unknown` / `truncated` events.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use ostler_protocol::framing::{DEFAULT_MAX_PAYLOAD_BYTES, FramerOptions};
use ostler_protocol::transcript::{Output, TranscriptDecoder};

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// CLI release whose adapter to use (`2.1.330`, or `claude --version` output). Defaults
    /// to the recording header's release, else the newest adapter in tolerant mode.
    #[arg(long, value_parser = parse_release)]
    pub release: Option<semver::Version>,
    /// Per-line cap; longer lines come out as `truncated` events.
    #[arg(long, default_value_t = DEFAULT_MAX_PAYLOAD_BYTES)]
    pub max_payload_bytes: usize,
    /// Do not show the lines ostler wrote (recordings only).
    #[arg(long)]
    pub hide_outbound: bool,
    /// Input file, or `-` for stdin.
    pub input: PathBuf,
}

fn parse_release(s: &str) -> Result<semver::Version, String> {
    ostler_protocol::adapter::parse_release(s)
        .ok_or_else(|| format!("not a release version: {s:?} (expected e.g. 2.1.330)"))
}

pub fn run(args: DecodeArgs) -> Result<()> {
    let mut input: Box<dyn Read> = if args.input.as_os_str() == "-" {
        Box::new(io::stdin().lock())
    } else {
        Box::new(
            File::open(&args.input)
                .with_context(|| format!("cannot open {}", args.input.display()))?,
        )
    };
    let opts = FramerOptions {
        max_payload_bytes: args.max_payload_bytes.max(1),
    };
    let mut dec = TranscriptDecoder::new(args.release, opts);
    let stdout = io::stdout();
    let mut w = BufWriter::new(stdout.lock());
    let mut out: Vec<Output> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut stdout_open = true;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading input"),
        };
        dec.push(buf.get(..n).unwrap_or_default(), &mut out);
        stdout_open = emit(&mut w, &mut out, args.hide_outbound, stdout_open);
    }
    dec.finish(&mut out);
    stdout_open = emit(&mut w, &mut out, args.hide_outbound, stdout_open);
    if stdout_open {
        // A closed stdout (e.g. piped into `head`) is not an error of the input.
        let _ = w.flush();
    }
    let summary = serde_json::json!({ "summary": dec.summary() });
    eprintln!("{summary}");
    Ok(())
}

/// `{"kind":"turn_result",...` -> `{"type":"turn_completed",...`: the tag is the first key
/// of every output line, so a prefix rewrite suffices (no re-serialization).
fn client_naming(line: String) -> String {
    let Some(rest) = line.strip_prefix("{\"kind\":\"") else {
        return line;
    };
    let rest = match rest.strip_prefix("turn_result\"") {
        Some(r) => format!("turn_completed\"{r}"),
        None => rest.to_owned(),
    };
    format!("{{\"type\":\"{rest}")
}

/// Write pending outputs; returns whether stdout is still open.
fn emit(w: &mut impl Write, out: &mut Vec<Output>, hide_outbound: bool, open: bool) -> bool {
    let mut open = open;
    for o in out.drain(..) {
        if !open || (hide_outbound && matches!(o, Output::Outbound(_))) {
            continue;
        }
        let line = client_naming(o.to_json());
        if w.write_all(line.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .is_err()
        {
            open = false;
        }
    }
    open
}

#[cfg(test)]
mod naming_tests {
    #[test]
    fn decode_names_events_like_the_client() {
        assert_eq!(
            super::client_naming(r#"{"kind":"turn_result","subtype":"success"}"#.into()),
            r#"{"type":"turn_completed","subtype":"success"}"#
        );
        assert_eq!(
            super::client_naming(r#"{"kind":"session_started","model":"m"}"#.into()),
            r#"{"type":"session_started","model":"m"}"#
        );
        assert_eq!(super::client_naming("{}".into()), "{}");
    }
}
