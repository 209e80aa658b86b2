//! The CLI's debug log of a session created with `debug` (the Agent SDKs' `debug` /
//! `debugFile`). The daemon chooses the file, `<debug_dir>/<session id>.log`
//! ([`EngineOptions::debug_dir`](crate::EngineOptions::debug_dir)), and passes it as
//! `--debug-file` at every spawn (create, resume, fork), so the CLI appends to the same
//! file; a client never names a path. `ReadDebugLog` reads it in bounded pieces, in any
//! state; `DeleteSession` removes it.
//!
//! Bounded by [`EngineOptions::debug_max_bytes`](crate::EngineOptions::debug_max_bytes):
//! at every spawn (before the CLI opens the file), at every turn's end, and during a turn
//! as the actor stores the CLI's output (at most once a second, off its task:
//! [`DebugLog::stored`]), a file past the cap keeps only its newest half, from a line's
//! start ([`trim`]). The CLI (2.1.332, by
//! strace) opens the file `O_APPEND` for every write and closes it after, so cutting the
//! file in place while it runs is safe: its next write lands at the new end. Offsets stay
//! logical: the bytes dropped so far are counted in `<id>.log.base` (written before the
//! file is cut, so offsets only ever grow), and a read before the first byte still kept
//! reads from it ([`DebugLogChunk::first_offset`]). The base is replaced whole, through
//! `<id>.log.base.tmp` renamed over it; a crash between leaves that file, never valid on
//! its own: the next trim or spawn removes it, as `DeleteSession` does.

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Engine;
use super::lifecycle::SessionSpec;
use crate::blocking::{blocking, start};
use crate::error::{Error, Result};

/// What `ReadDebugLog` reads when the caller names no bound.
pub const DEBUG_READ_DEFAULT: u32 = 64 * 1024;
/// The most one `ReadDebugLog` returns.
pub const DEBUG_READ_MAX: u32 = 1024 * 1024;

/// What [`EngineOptions::debug_max_bytes`](crate::EngineOptions::debug_max_bytes) is when
/// not configured: 64 MiB per session.
pub const DEBUG_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// Trims and reads of debug logs, one at a time: a read never sees a file half cut, nor a
/// base that does not match its file.
static DEBUG_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn debug_lock() -> std::sync::MutexGuard<'static, ()> {
    DEBUG_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One piece of a session's debug log. Offsets are logical: a byte keeps its offset when
/// older ones are dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugLogChunk {
    /// The bytes from `max(offset, first_offset)`.
    pub data: Vec<u8>,
    /// Where the data starts + `data.len()`.
    pub next_offset: u64,
    /// The log's logical size when read: bytes dropped + bytes kept (0 while the CLI has
    /// written nothing).
    pub size: u64,
    /// Whether the read reached the end of the log as it was.
    pub eof: bool,
    /// The first offset still kept (the bytes dropped by trims so far); a read from before
    /// it read from it.
    pub first_offset: u64,
}

impl Engine {
    /// The debug log file of a session (`None`: the daemon has no debug directory). The
    /// session id is a file name: ids are letters, digits, `-`, `_`, `.`, never starting
    /// with `.` (client-chosen ids are checked; generated ones are UUIDs).
    pub(crate) fn debug_log_path(&self, session_id: &str) -> Option<PathBuf> {
        self.shared
            .opts
            .debug_dir
            .as_ref()
            .map(|d| d.join(format!("{session_id}.log")))
    }

    /// Creates the debug directory (owner only) and returns the session's file, for a
    /// spawn with `debug`.
    pub(crate) async fn prepare_debug_log(&self, session_id: &str) -> Result<String> {
        let (Some(dir), Some(path)) = (
            self.shared.opts.debug_dir.clone(),
            self.debug_log_path(session_id),
        ) else {
            return Err(no_debug_dir());
        };
        let log = path.clone();
        blocking(move || {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(&dir).map_err(|e| {
                Error::internal(format!("debug log directory {}: {e}", dir.display()))
            })?;
            // Whatever the cap (none: no trim follows), a base a crash left half written.
            let _held = debug_lock();
            remove_stale_base_tmp(&log)
        })
        .await?;
        // Before the CLI opens it: what an earlier process left past the cap goes.
        trim_logged(session_id, path.clone(), self.shared.opts.debug_max_bytes).await;
        Ok(path.to_string_lossy().into_owned())
    }

    /// Checks at create and resume that a `debug` session has somewhere to log.
    pub(crate) fn check_debug(&self, debug: bool) -> Result<()> {
        if debug && self.shared.opts.debug_dir.is_none() {
            return Err(no_debug_dir());
        }
        Ok(())
    }

    /// Removes a session's debug log (DeleteSession); a missing file is no error.
    pub(crate) async fn remove_debug_log(&self, session_id: &str) {
        let Some(path) = self.debug_log_path(session_id) else {
            return;
        };
        let shown = path.display().to_string();
        let r = blocking(move || {
            let _held = debug_lock();
            for p in [base_tmp_path(&path), base_path(&path), path] {
                match std::fs::remove_file(&p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(Error::internal(e));
                    }
                    _ => {}
                }
            }
            Ok(())
        })
        .await;
        if let Err(e) = r {
            tracing::warn!(session = %session_id, file = %shown, error = %e, "could not remove the session's debug log");
        }
    }

    /// The options a session was created with (its `session_created` notice, its first
    /// event). `None` while a create is still recording it.
    async fn recorded_spec(&self, session_id: &str) -> Result<Option<SessionSpec>> {
        Ok(self
            .created_notice_data(session_id)
            .await?
            .and_then(|d| serde_json::from_value::<SessionSpec>(d).ok()))
    }

    /// `ReadDebugLog`: at most `max_bytes` (0: [`DEBUG_READ_DEFAULT`]; capped at
    /// [`DEBUG_READ_MAX`]) of the session's debug log from `offset`. Any state.
    pub async fn read_debug_log(
        &self,
        session_id: &str,
        offset: u64,
        max_bytes: u32,
    ) -> Result<DebugLogChunk> {
        self.record(session_id).await?;
        let debug = self
            .recorded_spec(session_id)
            .await?
            .is_some_and(|s| s.options.debug);
        if !debug {
            return Err(Error::precondition(format!(
                "session {session_id:?} was not created with debug, so it has no debug log"
            )));
        }
        let path = self.debug_log_path(session_id).ok_or_else(no_debug_dir)?;
        let want = bound(max_bytes);
        let read = blocking(move || {
            let _held = debug_lock();
            read_chunk(&path, offset, want)
        })
        .await;
        if read.is_err() {
            // Deleted since the check above (the record goes before the files): say that,
            // not that the offset is past the end of a file no longer there.
            self.record(session_id).await?;
        }
        read
    }
}

/// [`trim`] on the blocking pool, under the lock; a failure is logged (the log is only
/// longer than it should be), never the caller's error. Cap 0: nothing is done.
pub(crate) async fn trim_logged(session_id: &str, path: PathBuf, cap: u64) {
    if cap == 0 {
        return;
    }
    let sid = session_id.to_owned();
    // `trim_locked` logs its own failure; this only fails if the blocking task did.
    let _ = blocking(move || {
        trim_locked(&sid, &path, cap);
        Ok::<(), Error>(())
    })
    .await;
}

/// [`trim`] under the lock, its outcome logged (blocking: for the blocking pool).
fn trim_locked(session_id: &str, path: &Path, cap: u64) {
    let r = {
        let _held = debug_lock();
        trim(path, cap)
    };
    match r {
        Ok(0) => {}
        Ok(dropped) => {
            tracing::debug!(session = %session_id, file = %path.display(), dropped, cap, "debug log trimmed to its cap");
        }
        Err(e) => {
            tracing::warn!(session = %session_id, file = %path.display(), error = %e, "could not trim the session's debug log");
        }
    }
}

/// The least time between two checks of a session's debug log during a turn.
pub(crate) const DEBUG_CHECK_EVERY_MS: i64 = 1000;

/// A live session's debug log as its actor keeps it: besides the trims at every spawn and
/// every turn's end, the actor calls [`DebugLog::stored`] with the timestamp of each batch
/// of CLI output it stores, so a long turn (hours of tool calls) is held near the cap
/// too. A check (a [`trim`]) starts on the blocking pool, not awaited, at most once per
/// [`DEBUG_CHECK_EVERY_MS`] of batch time and never while the last one still runs; a
/// session without `debug` has no `DebugLog` (the actor's cost: one `Option` test per
/// batch).
pub(crate) struct DebugLog {
    path: PathBuf,
    /// [`EngineOptions::debug_max_bytes`](crate::EngineOptions::debug_max_bytes) (0: no cap,
    /// no checks).
    cap: u64,
    session_id: Arc<str>,
    /// The batch time (ms) the last check started at; none yet: `i64::MIN`.
    last_ms: i64,
    /// A check is under way (it clears this when done, whatever happened).
    busy: Arc<AtomicBool>,
}

impl DebugLog {
    pub(crate) fn new(session_id: &str, path: PathBuf, cap: u64) -> Self {
        Self {
            path,
            cap,
            session_id: Arc::from(session_id),
            last_ms: i64::MIN,
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The actor stored a batch of CLI output at `now_ms` (the batch's own timestamp, no
    /// clock read here): starts a check if one is due and none runs. Returns whether it
    /// started one.
    pub(crate) fn stored(&mut self, now_ms: i64) -> bool {
        // A wall clock set back: due at once (then counted from the new time).
        let due =
            now_ms < self.last_ms || now_ms.saturating_sub(self.last_ms) >= DEBUG_CHECK_EVERY_MS;
        if self.cap == 0 || !due || self.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.last_ms = now_ms;
        let busy = Busy(self.busy.clone());
        let (sid, path, cap) = (self.session_id.clone(), self.path.clone(), self.cap);
        // Not awaited: the actor reads on; the handle is dropped, the task runs to its end.
        drop(start(move || {
            let _busy = busy;
            trim_locked(&sid, &path, cap);
            Ok::<(), Error>(())
        }));
        true
    }
}

/// Clears a [`DebugLog`]'s busy flag when the check ends (even by a panic).
struct Busy(Arc<AtomicBool>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// `<id>.log.base`: how many bytes of `<id>.log` trims dropped (decimal); none: 0.
fn base_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".base");
    PathBuf::from(p)
}

fn read_base(path: &Path) -> Result<u64> {
    let bp = base_path(path);
    match std::fs::read_to_string(&bp) {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .map_err(|e| Error::internal(format!("debug log base {}: {e}: {s:?}", bp.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(Error::internal(format!(
            "debug log base {}: {e}",
            bp.display()
        ))),
    }
}

/// `<id>.log.base.tmp`: the next base while [`write_base`] writes it.
fn base_tmp_path(path: &Path) -> PathBuf {
    let mut p = base_path(path).into_os_string();
    p.push(".tmp");
    PathBuf::from(p)
}

/// Removes a `<id>.log.base.tmp` a crash left between writing it and renaming it (never
/// valid on its own: the base it would have been is written again by the next trim that
/// drops bytes). Called under the lock, so no [`write_base`] is under way.
fn remove_stale_base_tmp(path: &Path) -> Result<()> {
    let tmp = base_tmp_path(path);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {
            tracing::debug!(file = %tmp.display(), "removed a debug log base left half written");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::internal(format!(
            "debug log base {}: {e}",
            tmp.display()
        ))),
    }
}

/// Replaces the base file whole (a new file renamed over it).
fn write_base(path: &Path, base: u64) -> Result<()> {
    let bp = base_path(path);
    let tmp = base_tmp_path(path);
    let io = |e: std::io::Error| Error::internal(format!("debug log base {}: {e}", bp.display()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(format!("{base}\n").as_bytes()).map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &bp).map_err(io)
}

/// If `path` holds more than `cap` bytes (0: no cap), drops its oldest bytes in place,
/// keeping at most `cap / 2` from the start of a line (or, with no line break among them,
/// exactly the newest `cap / 2`); returns how many were dropped. The base grows first, so
/// a crash in between leaves offsets too high (some bytes read again at new offsets),
/// never too low. Bytes the CLI appends meanwhile are carried along; only one it appends
/// between the last look at the size and the cut would be lost. A stale
/// `<id>.log.base.tmp` goes first ([`remove_stale_base_tmp`]).
pub(crate) fn trim(path: &Path, cap: u64) -> Result<u64> {
    let io = |e: std::io::Error| Error::internal(format!("debug log {}: {e}", path.display()));
    remove_stale_base_tmp(path)?;
    if cap == 0 {
        return Ok(0);
    }
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(e)),
    };
    let size = f.metadata().map_err(io)?.len();
    if size <= cap {
        return Ok(0);
    }
    let from = size - cap / 2;
    let mut kept = read_range(&f, from, size).map_err(io)?;
    let skip = match kept.iter().position(|b| *b == b'\n') {
        Some(i) => i + 1,
        None => 0,
    };
    kept.drain(..skip);
    let cut = from + skip as u64;
    write_base(path, read_base(path)? + cut)?;
    f.write_all_at(&kept, 0).map_err(io)?;
    let (mut src, mut dst) = (size, kept.len() as u64);
    loop {
        let now = f.metadata().map_err(io)?.len();
        if now <= src {
            break;
        }
        let more = read_range(&f, src, now).map_err(io)?;
        f.write_all_at(&more, dst).map_err(io)?;
        dst += more.len() as u64;
        src = now;
    }
    f.set_len(dst).map_err(io)?;
    Ok(cut)
}

fn read_range(f: &std::fs::File, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; usize::try_from(to - from).unwrap_or(0)];
    f.read_exact_at(&mut buf, from)?;
    Ok(buf)
}

/// How much one read returns at most.
fn bound(max_bytes: u32) -> u32 {
    match max_bytes {
        0 => DEBUG_READ_DEFAULT,
        n => n.min(DEBUG_READ_MAX),
    }
}

fn no_debug_dir() -> Error {
    Error::precondition(
        "this daemon keeps no debug logs (its engine has no debug directory), so the \
         session option `debug` cannot be served",
    )
}

/// Reads `[offset, offset + want)` of the log at `path` in logical offsets (from its
/// first kept byte when `offset` is before it), bounded by its size now; a missing file is
/// an empty log (the CLI has not written yet).
fn read_chunk(path: &Path, offset: u64, want: u32) -> Result<DebugLogChunk> {
    let io = |e: std::io::Error| Error::internal(format!("debug log: {e}"));
    let base = read_base(path)?;
    let (mut f, kept) = match std::fs::File::open(path) {
        Ok(f) => {
            let len = f.metadata().map_err(io)?.len();
            (Some(f), len)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, 0),
        Err(e) => return Err(io(e)),
    };
    let size = base + kept;
    if offset > size {
        return Err(past_end(offset, size));
    }
    let start = offset.max(base);
    let n = u64::from(want).min(size - start);
    let mut data = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    if let Some(f) = f.as_mut() {
        f.seek(SeekFrom::Start(start - base)).map_err(io)?;
        f.take(n).read_to_end(&mut data).map_err(io)?;
    }
    let next_offset = start + data.len() as u64;
    Ok(DebugLogChunk {
        data,
        next_offset,
        size,
        eof: next_offset >= size,
        first_offset: base,
    })
}

fn past_end(offset: u64, size: u64) -> Error {
    Error::invalid(
        "offset",
        format!("{offset} is past the end of the debug log ({size} bytes)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn checks_during_a_turn_are_at_most_one_a_second_and_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        std::fs::write(&path, "x\n".repeat(100)).unwrap();
        // No cap: never a check.
        let mut off = DebugLog::new("s", path.clone(), 0);
        assert!(!off.stored(10_000));
        let mut log = DebugLog::new("s", path.clone(), 100);
        {
            // The check started first waits for this lock, so it is still under way below.
            let _held = debug_lock();
            assert!(log.stored(10_000), "the first stored batch checks");
            assert!(log.busy.load(Ordering::Acquire));
            assert!(!log.stored(10_999), "within a second of the last check");
            assert!(!log.stored(11_000), "due, but the last check still runs");
            assert!(!log.stored(9_000), "a clock set back is due, but one runs");
            assert_eq!(log.last_ms, 10_000);
        }
        // Once it ended (its trim done), the next due batch checks again.
        let started = std::time::Instant::now();
        while log.busy.load(Ordering::Acquire) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "the check never ended"
            );
            tokio::task::yield_now().await;
        }
        // 200 bytes, cap 100: the newest 50 from a line's start.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 48);
        assert_eq!(read_base(&path).unwrap(), 152);
        assert!(!log.stored(10_500));
        assert!(log.stored(9_000), "a clock set back: due at once");
        assert_eq!(log.last_ms, 9_000);
    }

    #[test]
    fn reads_are_bounded_and_page_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        // Not written yet: an empty log, at its end; anything further is past it.
        let none = read_chunk(&path, 0, 10).unwrap();
        assert_eq!((none.size, none.next_offset, none.eof), (0, 0, true));
        assert!(matches!(
            read_chunk(&path, 1, 10),
            Err(Error::InvalidArgument { .. })
        ));
        let big: Vec<u8> = (0..(DEBUG_READ_MAX as usize + 300))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &big).unwrap();
        assert_eq!(bound(0), DEBUG_READ_DEFAULT);
        assert_eq!(bound(u32::MAX), DEBUG_READ_MAX);
        assert_eq!(bound(7), 7);
        let first = read_chunk(&path, 0, bound(u32::MAX)).unwrap();
        assert_eq!(first.data.len(), DEBUG_READ_MAX as usize);
        assert_eq!(first.size, big.len() as u64);
        assert!(!first.eof);
        let rest = read_chunk(&path, first.next_offset, bound(u32::MAX)).unwrap();
        assert_eq!(rest.data, big[DEBUG_READ_MAX as usize..]);
        assert!(rest.eof && rest.next_offset == rest.size);
        let at_end = read_chunk(&path, rest.next_offset, 10).unwrap();
        assert!(at_end.data.is_empty() && at_end.eof);
        assert!(matches!(
            read_chunk(&path, rest.size + 1, 10),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn trims_keep_the_newest_half_from_a_line_start_and_offsets_stay_logical() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        // Not there, or within the cap, or no cap: nothing happens.
        assert_eq!(trim(&path, 100).unwrap(), 0);
        let lines: String = (0..20)
            .map(|i| format!("line {i:02} .........\n"))
            .collect();
        assert_eq!(lines.len(), 20 * 18);
        std::fs::write(&path, &lines).unwrap();
        assert_eq!(trim(&path, 360).unwrap(), 0);
        assert_eq!(trim(&path, 0).unwrap(), 0);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), lines);
        assert!(!base_path(&path).exists());
        // A base a crash left half written (`.base.tmp`, never renamed) is removed by the
        // next trim, whether it cuts or not, with or without a cap; the real base is kept.
        let stale = base_tmp_path(&path);
        assert_eq!(
            stale.file_name().unwrap().to_str().unwrap(),
            "s.log.base.tmp"
        );
        for cap in [360, 0] {
            std::fs::write(&stale, "12").unwrap();
            assert_eq!(trim(&path, cap).unwrap(), 0);
            assert!(!stale.exists(), "cap {cap}: {} left", stale.display());
        }
        std::fs::write(&stale, "99999").unwrap();

        // Cap 100: at most 50 bytes kept, from a line's start: the last 2 lines (36).
        assert_eq!(trim(&path, 100).unwrap(), 324);
        let kept = std::fs::read_to_string(&path).unwrap();
        assert_eq!(kept, lines[324..]);
        assert!(kept.starts_with("line 18"), "{kept}");
        assert_eq!(read_base(&path).unwrap(), 324);
        assert!(!stale.exists(), "{} left", stale.display());
        // Reads are logical: from before the first kept byte, from it; the size counts
        // what was dropped; an offset past the end is still refused.
        let r = read_chunk(&path, 0, 1000).unwrap();
        assert_eq!(r.first_offset, 324);
        assert_eq!(r.data, &lines.as_bytes()[324..]);
        assert_eq!((r.next_offset, r.size, r.eof), (360, 360, true));
        let r = read_chunk(&path, 342, 5).unwrap();
        assert_eq!(r.data, b"line ");
        assert_eq!((r.next_offset, r.first_offset, r.eof), (347, 324, false));
        assert!(matches!(
            read_chunk(&path, 361, 10),
            Err(Error::InvalidArgument { .. })
        ));

        // The CLI appends (O_APPEND) and the next trim adds to the base: offsets only grow.
        let more: String = (20..30)
            .map(|i| format!("line {i:02} .........\n"))
            .collect();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(more.as_bytes())
            .unwrap();
        let all = format!("{lines}{more}");
        assert_eq!(trim(&path, 100).unwrap(), 36 + 180 - 36);
        assert_eq!(read_base(&path).unwrap(), 324 + 180);
        let r = read_chunk(&path, 360, 1000).unwrap();
        assert_eq!(r.first_offset, 504);
        assert_eq!(r.data, &all.as_bytes()[504..]);
        assert_eq!(r.size, all.len() as u64);
        // Appended after a trim: at the file's new end, at the next logical offsets.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"tail\n")
            .unwrap();
        let r = read_chunk(&path, all.len() as u64, 1000).unwrap();
        assert_eq!(r.data, b"tail\n");
        assert_eq!(r.next_offset, all.len() as u64 + 5);

        // One line longer than half the cap: the newest half of it, mid-line.
        std::fs::write(&path, "x".repeat(300)).unwrap();
        std::fs::remove_file(base_path(&path)).unwrap();
        assert_eq!(trim(&path, 100).unwrap(), 250);
        assert_eq!(std::fs::read(&path).unwrap().len(), 50);
    }
}
