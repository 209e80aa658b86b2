//! The tasks that own the child's pipes: the stdin writer, the stdout reader (framer ->
//! decoder -> junk coalescer -> one [`ProcessEvent::Line`] per line) and the stderr tail.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use ostler_protocol::junk::{JunkCoalescer, JunkOptions};
use ostler_protocol::{
    DecodedLine, Decoder, Diagnostic, DiagnosticCode, Event, Frame, FramerOptions, LineFramer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::control;
use super::events::{Line, ProcessEvent};
use super::shared::{Shared, WriteCmd, lock};

/// Sole owner of the child's stdin: writes the queue in order; dropping stdin (after
/// [`WriteCmd::Close`]) closes it.
pub(super) async fn writer_task(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<WriteCmd>,
    log_id: String,
) {
    let mut broken: Option<String> = None;
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriteCmd::Line(line, ack) => {
                let r = match &broken {
                    Some(e) => Err(e.clone()),
                    None => {
                        let r = async {
                            stdin.write_all(&line).await?;
                            stdin.flush().await
                        }
                        .await;
                        r.map_err(|e| {
                            tracing::debug!(session = %log_id, error = %e, "stdin write failed");
                            let s = e.to_string();
                            broken = Some(s.clone());
                            s
                        })
                    }
                };
                if let Some(ack) = ack {
                    let _ = ack.send(r);
                }
            }
            WriteCmd::Close => break,
        }
    }
    // Dropping `stdin` closes it. Messages queued after Close are refused (channel closed).
}

/// The end of a byte stream, bounded.
pub(super) struct Tail {
    buf: std::collections::VecDeque<u8>,
    cap: usize,
}

impl Tail {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            buf: std::collections::VecDeque::new(),
            cap,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.cap == 0 {
            return;
        }
        let bytes = if bytes.len() > self.cap {
            &bytes[bytes.len() - self.cap..]
        } else {
            bytes
        };
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.buf.extend(bytes);
    }

    pub(super) fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }
}

/// Reads stderr into the bounded `tail` and logs it line by line.
pub(super) async fn stderr_task(
    mut stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<Tail>>,
    log_id: String,
) {
    const MAX_LOG_LINE: usize = 4096;
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lock(&tail).push(&buf[..n]);
        for &b in &buf[..n] {
            if b == b'\n' {
                log_stderr(&log_id, &line);
                line.clear();
            } else if line.len() < MAX_LOG_LINE {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        log_stderr(&log_id, &line);
    }
}

fn log_stderr(log_id: &str, line: &[u8]) {
    let s = String::from_utf8_lossy(line);
    let s = s.trim_end();
    if !s.is_empty() {
        tracing::info!(session = %log_id, stderr = %s, "claude stderr");
    }
}

/// Reads stdout until EOF (or shortly after the exit), sends one event per line, then
/// [`ProcessEvent::Exited`] last.
pub(super) async fn reader_task(
    mut stdout: tokio::process::ChildStdout,
    shared: Arc<Shared>,
    events: mpsc::Sender<ProcessEvent>,
    mut decoder: Decoder,
    watchdog: Option<tokio::task::JoinHandle<()>>,
) {
    let mut framer = LineFramer::new(FramerOptions {
        max_payload_bytes: shared.opts.max_payload_bytes,
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut frames: Vec<Frame> = Vec::new();
    let mut junk = JunkCoalescer::new(JunkOptions::default());
    let mut exit_rx = shared.exit_rx.clone();
    let mut owner_gone = false;
    // After the process exits, keep reading what is buffered for at most this long (an
    // escaped grandchild could hold the pipe open forever).
    let drain_deadline = async {
        let _ = exit_rx.wait_for(|e| e.is_some()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    tokio::pin!(drain_deadline);
    loop {
        let n = tokio::select! {
            r = stdout.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            () = &mut drain_deadline => break,
        };
        shared.touch();
        framer.push(&buf[..n], &mut frames);
        if !owner_gone && !deliver(&shared, &events, &mut decoder, &mut junk, &mut frames).await {
            owner_gone = true;
            tracing::warn!(session = %shared.log_id, "event receiver dropped: killing the session process");
            shared.set_requested();
            shared.kill_group(Signal::SIGKILL);
        }
        frames.clear();
    }
    framer.finish(&mut frames);
    if !owner_gone {
        deliver(&shared, &events, &mut decoder, &mut junk, &mut frames).await;
        if let Some(summary) = junk.finish() {
            send_junk_summary(&events, summary).await;
        }
    }
    let mut exit_rx = shared.exit_rx.clone();
    let info = match exit_rx.wait_for(|e| e.is_some()).await {
        Ok(e) => e.clone(),
        Err(_) => None,
    };
    if let Some(w) = watchdog {
        w.abort();
        let _ = w.await;
    }
    control::clear(&shared);
    shared.turn_running.store(false, Ordering::SeqCst);
    if let Some(info) = info {
        let _ = events.send(ProcessEvent::Exited(info)).await;
    }
}

/// Decode and send the frames, one event per line; `false` when the receiver is gone.
async fn deliver(
    shared: &Arc<Shared>,
    events: &mpsc::Sender<ProcessEvent>,
    decoder: &mut Decoder,
    junk: &mut JunkCoalescer,
    frames: &mut Vec<Frame>,
) -> bool {
    // The frames of one read arrived together: one clock read for all of them.
    let now = Instant::now();
    for frame in frames.drain(..) {
        let mut line = decoder.decode(frame);
        // Non-JSON output is coalesced: a few lines per window pass, the rest become one
        // summary diagnostic (a CLI must not fill the store with junk).
        let is_junk = matches!(
            line.events.as_slice(),
            [Event::Diagnostic(d)] if d.code == DiagnosticCode::NotJson
        );
        let (summary, pass) = if is_junk {
            let Some(Event::Diagnostic(d)) = line.events.pop() else {
                unreachable!("matched above")
            };
            let v = junk.junk(d, now);
            (v.summary, v.line)
        } else {
            (junk.poll(now), None)
        };
        if let Some(summary) = summary
            && !send_junk_summary(events, summary).await
        {
            return false;
        }
        if is_junk {
            match pass {
                Some(d) => line.events.push(Event::Diagnostic(d)),
                None => continue,
            }
        }
        let mut line = Line::plain(line);
        for ev in &line.decoded.events {
            match ev {
                Event::SessionStarted(s) => {
                    *lock(&shared.session_id) = Some(s.session_id.clone());
                    *lock(&shared.announced) = Some(s.capabilities.clone());
                }
                Event::ControlResponse(r) => control::resolved(shared, r),
                Event::TurnResult(_) => {
                    shared.turn_running.store(false, Ordering::SeqCst);
                }
                Event::ControlRequest(req) => line.responders.push(control::opened(shared, req)),
                // `withdrawn` closes the request; only one that was open is listed.
                Event::ControlCancel(c) if control::withdrawn(shared, c) => {
                    line.cancelled.push(c.request_id.clone());
                }
                _ => {}
            }
        }
        if events.send(ProcessEvent::Line(line)).await.is_err() {
            return false;
        }
    }
    true
}

/// A coalesced-junk summary as a line of its own (no raw bytes: it stands for many lines).
async fn send_junk_summary(events: &mpsc::Sender<ProcessEvent>, d: Diagnostic) -> bool {
    let line = DecodedLine {
        raw: bytes::Bytes::new(),
        events: vec![Event::Diagnostic(d)],
    };
    events
        .send(ProcessEvent::Line(Line::plain(line)))
        .await
        .is_ok()
}
