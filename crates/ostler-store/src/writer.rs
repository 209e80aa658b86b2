//! The single writer: a dedicated thread that owns the only write connection, drains a
//! channel of write commands and commits them in groups.
//!
//! A command that fails (unknown session, constraint violation) is rolled back alone and
//! reports its own error, while the rest of the group commits. A group runs first without
//! savepoints: commands rarely fail, and a savepoint makes SQLite copy every page the
//! command changes that existed before it into the sub-journal (16 sessions firehosing
//! together copied ~0.3 pages an event, spilled to a temporary file: about a third of the
//! writer thread's time; docs/performance.md, session 62). If a command of that pass
//! fails, the pass is rolled back whole and the group runs again with each command in its
//! own savepoint. A group of one command (every commit at low load) needs neither: the
//! transaction is rolled back instead of committed when the command fails. Results are
//! handed to the callers only after `COMMIT` (or that `ROLLBACK`) returned.
//!
//! Storage faults (disk full, read-only or vanished files, I/O errors, a lock held
//! elsewhere; [`is_storage_fault`]) are not the requests' fault: the whole group is rolled
//! back and run again, with backoff, until it commits; the callers keep waiting (their
//! tickets stay pending), so nothing accepted is lost. The store's [`WriteHealth`] says so
//! meanwhile. Once `write_retry_limit` has passed since the fault began, the group fails
//! with [`Error::Unwritable`], and later groups fail at their first faulty attempt, until a
//! write (or the writer's idle probe) commits again. Any other commit failure fails the
//! group at once with [`Error::Commit`]; nothing of it is stored.
//!
//! **Commits on the caller's thread.** The [`Writer`] sits behind a lock shared by the
//! writer thread and [`Shared::submit_now`]. A caller with nothing else to do until its write
//! commits (a session actor with one small batch and no other line waiting) runs the
//! commit itself when the writer is idle: nothing queued, nothing committing, the store
//! writable, `synchronous=NORMAL`. That saves the two thread hand-offs (to the writer and
//! back), about half of an event's latency at low load (docs/performance.md). Order is
//! kept: the writer thread takes commands from the queue only while holding the lock, so an
//! idle writer with an empty queue means every earlier write has committed. Whatever may
//! block (the retries of a storage fault, the checkpoint at the WAL's hard bound) is left
//! to the writer thread.
//! The writer thread tells callers their results after releasing the lock ([`Finished`]), so
//! a caller woken by its result finds the writer free rather than falling back to the queue.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};

use crate::error::{Error, Result, not_found_session};
use crate::health::{HealthCell, is_storage_fault};
use crate::rows::seq_from_sql;

/// One write request as the writer runs it: possibly several times (a group that met a
/// storage fault runs again), then finished once.
pub(crate) trait Op: Send {
    /// Runs the request in the current group transaction (see [`Ctx::in_savepoint`]),
    /// keeping its result until [`Op::finish`].
    fn run(&mut self, ctx: &mut Ctx<'_>);
    /// Hands the kept result to the caller (`failed = None`: the group committed), or the
    /// error `failed` makes.
    fn finish(self: Box<Self>, failed: Option<&dyn Fn() -> Error>);
}

/// A write request, executed on the writer thread inside the current group transaction.
pub(crate) struct Command(Box<dyn Op>);

struct Typed<T, F> {
    op: F,
    reply: tokio::sync::oneshot::Sender<Reply<T>>,
    result: Option<Result<T>>,
}

/// What the writer hands back for a request: its result, and the request's own data (the
/// op and what it owns: an append's events), so that they are freed by the caller's thread,
/// not the writer's. Freeing a batch's buffers, allocated by the caller, cost the writer
/// about a fifth of its time per event (measured: docs/performance.md).
pub(crate) struct Reply<T> {
    pub result: Result<T>,
    pub _leftover: Option<Box<dyn Send>>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("result", &self.result)
            .finish_non_exhaustive()
    }
}

impl<T, F> Op for Typed<T, F>
where
    T: Send + 'static,
    F: FnMut(&mut Ctx<'_>) -> Result<T> + Send + 'static,
{
    fn run(&mut self, ctx: &mut Ctx<'_>) {
        let path = ctx.path.to_path_buf();
        let op = &mut self.op;
        self.result = Some(ctx.in_savepoint(|c| op(c)).map_err(|e| e.at(&path)));
    }

    fn finish(self: Box<Self>, failed: Option<&dyn Fn() -> Error>) {
        let Typed { op, reply, result } = *self;
        let result = match failed {
            Some(make) => Err(make()),
            None => result.unwrap_or(Err(Error::Closed)),
        };
        // The caller may have stopped waiting; the write stands regardless.
        let _ = reply.send(Reply {
            result,
            _leftover: Some(Box::new(op)),
        });
    }
}

/// Builds a command that runs `op` (see [`Ctx::in_savepoint`]) and sends its result to
/// `reply` once the group has committed. `op` may run more than once (each time on a
/// rolled-back database).
pub(crate) fn command<T, F>(op: F, reply: tokio::sync::oneshot::Sender<Reply<T>>) -> Command
where
    T: Send + 'static,
    F: FnMut(&mut Ctx<'_>) -> Result<T> + Send + 'static,
{
    Command(Box::new(Typed {
        op,
        reply,
        result: None,
    }))
}

/// The commands of a group that ended (committed, or failed for good), not yet told.
///
/// Sent after the writer's lock is released, so that a caller woken by its result finds
/// the writer free (and may commit its next write on its own thread, [`Shared::submit_now`]).
pub(crate) struct Finished {
    cmds: Vec<Command>,
    failed: Option<Box<dyn Fn() -> Error + Send>>,
}

impl Finished {
    fn new(batch: &mut Vec<Command>, failed: Option<Box<dyn Fn() -> Error + Send>>) -> Self {
        Self {
            cmds: std::mem::take(batch),
            failed,
        }
    }

    /// Tells every caller its result.
    fn send(self) {
        let failed = self.failed.as_deref().map(|f| f as &dyn Fn() -> Error);
        for cmd in self.cmds {
            cmd.0.finish(failed);
        }
    }
}

/// First wait before a group that met a storage fault runs again; doubled per attempt.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between two attempts (and between two idle probes of a faulty store).
const RETRY_MAX: Duration = Duration::from_secs(1);

/// What the writer remembers about a session: its row key and the last assigned seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub pk: i64,
    pub last_seq: u64,
}

/// The writer's view while running one group transaction.
pub(crate) struct Ctx<'a> {
    pub conn: &'a Connection,
    pub path: &'a Path,
    /// Committed knowledge (from earlier groups).
    cache: &'a HashMap<String, Slot>,
    /// Changes made by earlier commands of this group (`None` = session deleted).
    overlay: HashMap<String, Option<Slot>>,
    /// Changes made by the running command; moved to `overlay` when it succeeds.
    staged: Vec<(String, Option<Slot>)>,
    /// Set when a command inserted a feed row (possibly rolled back since): the feed
    /// position is read again after the commit only then.
    pub feed_touched: bool,
    /// Set when the transaction can no longer be committed.
    poisoned: Option<Arc<rusqlite::Error>>,
    /// How a command's failure is undone.
    mode: Undo,
    /// Set when a command failed in [`Undo::Whole`] mode: the transaction is rolled back,
    /// not committed.
    undo: bool,
}

/// How a group undoes the changes of a command that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undo {
    /// The transaction is rolled back whole (no `SAVEPOINT` and `RELEASE` statements): for
    /// the group's only command, whose error is then its result, and for the first pass of
    /// a larger group, which then runs again with [`Undo::Savepoint`]. The commands after
    /// the failed one do not run.
    Whole,
    /// Each command in its own savepoint: a failure undoes only that command's changes.
    Savepoint,
}

impl Ctx<'_> {
    /// The session's slot, or [`Error::NotFound`].
    pub fn slot(&mut self, session_id: &str) -> Result<Slot> {
        if let Some((_, s)) = self.staged.iter().rev().find(|(id, _)| id == session_id) {
            return s.ok_or_else(|| not_found_session(session_id));
        }
        if let Some(s) = self.overlay.get(session_id) {
            return s.ok_or_else(|| not_found_session(session_id));
        }
        if let Some(s) = self.cache.get(session_id) {
            return Ok(*s);
        }
        let sql = format!(
            "SELECT s.pk, {} FROM sessions s WHERE s.id = ?1",
            crate::rows::LAST_SEQ_OF_S
        );
        let found = self
            .conn
            .prepare_cached(&sql)?
            .query_row([session_id], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
            })
            .optional()?;
        let (pk, last) = found.ok_or_else(|| not_found_session(session_id))?;
        let slot = Slot {
            pk,
            last_seq: seq_from_sql(last)?,
        };
        // Committed data: safe to remember beyond this command.
        self.overlay.insert(session_id.to_owned(), Some(slot));
        Ok(slot)
    }

    /// Records a change to the session's slot, effective if the running command succeeds.
    pub fn set_slot(&mut self, session_id: &str, slot: Option<Slot>) {
        self.staged.push((session_id.to_owned(), slot));
    }

    /// Runs `op` so that a failure undoes only its own changes: in a savepoint, or in the
    /// transaction itself ([`Undo::Whole`]: [`Ctx::undo`] then has the transaction rolled
    /// back instead of committed).
    fn in_savepoint<T>(&mut self, op: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if let Some(e) = &self.poisoned {
            return Err(Error::Commit(Arc::clone(e)));
        }
        if self.undo {
            // A command before this one failed in a pass without savepoints: this pass is
            // rolled back and the group runs again, so this command need not run now (the
            // error is never told: the next pass sets every result).
            return Err(Error::Closed);
        }
        let savepoint = self.mode == Undo::Savepoint;
        if savepoint && let Err(e) = exec(self.conn, "SAVEPOINT op") {
            return Err(self.poison(e));
        }
        self.staged.clear();
        match op(self) {
            Ok(v) => {
                if savepoint && let Err(e) = exec(self.conn, "RELEASE op") {
                    return Err(self.poison(e));
                }
                for (id, slot) in self.staged.drain(..) {
                    self.overlay.insert(id, slot);
                }
                Ok(v)
            }
            Err(err) => {
                self.staged.clear();
                if !savepoint {
                    self.undo = true;
                } else if let Err(e) =
                    exec(self.conn, "ROLLBACK TO op").and_then(|()| exec(self.conn, "RELEASE op"))
                {
                    self.poison(e);
                }
                match err {
                    // Not the request's fault: the whole group runs again later.
                    Error::Sqlite(e) if is_storage_fault(&e) => Err(self.poison(e)),
                    err => Err(err),
                }
            }
        }
    }

    fn poison(&mut self, e: rusqlite::Error) -> Error {
        let e = Arc::new(e);
        self.poisoned = Some(Arc::clone(&e));
        Error::Commit(e)
    }
}

/// Runs one statement without rows, prepared once per connection (the writer runs the same
/// few transaction-control statements for every request).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// WAL growth (frames = pages) after which the checkpointer is nudged; the same figure as
/// SQLite's default `wal_autocheckpoint`.
const CHECKPOINT_AFTER_FRAMES: u64 = 1000;

/// The checkpointer keeps going, pass after pass, while at least this many frames are left
/// to copy: under continuous load it follows the writer closely, so that whatever is left
/// when the WAL restarts is short.
const CHASE_MIN_FRAMES: u64 = 64;

/// The hard bound on the WAL: at this size the writer waits for a running checkpoint and then
/// checkpoints itself (copying only what the checkpointer has not copied yet), so that the
/// WAL restarts from its beginning. Below it the writer never checkpoints and never waits for
/// the checkpointer, and with `synchronous=NORMAL` the only commit that fsyncs is the one that
/// restarts the WAL: SQLite syncs the WAL's new header then (against reordered writes after a
/// restart; ~0.2-1 ms here, the checkpointer having synced the frames before). About 32 MiB
/// with 4 KiB pages. Under continuous load this is the only point where the WAL restarts (a
/// checkpoint only completes if no commit lands while it runs): at 1k one-event commits a
/// second, every ~3.3 s, costing the commit path the wait for a running pass plus the WAL
/// and database syncs (docs/performance.md, session 15). Under bursty load the checkpointer
/// catches up between bursts and the WAL restarts at the next commit (its header sync only).
pub(crate) const WAL_HARD_LIMIT_FRAMES: u64 = 8 * 1024;

thread_local! {
    /// Frames in the WAL after the last commit of this thread's connection (set by the WAL
    /// hook, which SQLite calls on the committing thread: the writer thread).
    static WAL_FRAMES: Cell<u64> = const { Cell::new(0) };
}

fn record_wal_frames(_wal: &rusqlite::hooks::Wal, frames: c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(u64::try_from(frames).unwrap_or(0)));
    Ok(())
}

/// What the checkpointer has done, shared with whoever waits for it.
#[derive(Debug, Default)]
struct Progress {
    /// Passes finished so far.
    passes: u64,
    /// Whether the last pass left every WAL frame in the database.
    complete: bool,
    /// Write-backs of the database file after a nudge's passes (see [`spawn_checkpointer`]).
    written_back: u64,
    /// Syncs of the WAL file for commits that waited `sync_within` (see [`spawn_checkpointer`]).
    wal_synced: u64,
}

/// Why the checkpointer is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// The WAL grew: run checkpoint passes.
    Nudge,
    /// A commit left the WAL unsynced: sync it within `sync_within`.
    Unsynced,
}

/// The checkpointer's shared state: its nudge channel, the lock held while a checkpoint runs
/// (SQLite would only answer "busy" to a second one) and its progress.
#[derive(Clone)]
pub(crate) struct Checkpointer {
    tx: SyncSender<Wake>,
    /// Set by a commit (under `synchronous=NORMAL` with a `sync_within`) and cleared by the
    /// checkpointer just before it syncs the WAL: whether a commit may be unsynced.
    unsynced: Arc<AtomicBool>,
    /// Whether commits are to be synced within a bound (the checkpointer's `sync_within`).
    sync_within: bool,
    lock: Arc<Mutex<()>>,
    /// Set while the writer waits for `lock` (at the hard bound): the checkpointer then
    /// starts no new pass, so that the writer is not starved by passes back to back.
    writer_waiting: Arc<AtomicBool>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
}

impl Checkpointer {
    /// Asks for a pass; a full channel means one is already due (nudges coalesce).
    fn nudge(&self) {
        let _ = self.tx.try_send(Wake::Nudge);
    }

    /// After a commit: the checkpointer is to sync the WAL within its `sync_within` (one
    /// wake-up per unsynced stretch; the flag, not the message, is what it goes by).
    fn unsynced(&self) {
        if self.sync_within
            && !self.unsynced.load(Ordering::Relaxed)
            && !self.unsynced.swap(true, Ordering::SeqCst)
        {
            let _ = self.tx.try_send(Wake::Unsynced);
        }
    }

    /// Nudges the checkpointer and waits until a pass that started after this call has left
    /// every WAL frame in the database (`true`), or `timeout` passed (`false`). While the
    /// writer keeps committing, such a pass may never happen.
    pub(crate) fn caught_up(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.progress;
        let mut p = lock.lock().unwrap_or_else(|p| p.into_inner());
        // A pass running now may have started before the caller's last write.
        let after = p.passes + 1;
        loop {
            self.nudge();
            if p.passes > after && p.complete {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            p = cv
                .wait_timeout(p, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Decides when checkpoints happen: on the checkpointer thread, off the commit path; by the
/// writer only at the WAL's hard bound.
pub(crate) struct CheckpointNudge {
    shared: Checkpointer,
    last_frames: u64,
    nudged_at: u64,
    writer_threshold: u64,
}

impl CheckpointNudge {
    /// A handle on the checkpointer for waiting on it (see [`Checkpointer::caught_up`]).
    pub(crate) fn handle(&self) -> Checkpointer {
        self.shared.clone()
    }

    /// After a commit that left `frames` in the WAL: nudges the checkpointer as the WAL grows;
    /// returns whether the writer must checkpoint itself (the hard bound).
    fn committed(&mut self, frames: u64) -> bool {
        if frames < self.last_frames {
            // The WAL restarted from its beginning.
            self.nudged_at = 0;
            self.writer_threshold = WAL_HARD_LIMIT_FRAMES;
        }
        self.last_frames = frames;
        self.shared.unsynced();
        if frames >= self.nudged_at + CHECKPOINT_AFTER_FRAMES {
            self.shared.nudge();
            self.nudged_at = frames;
        }
        frames >= self.writer_threshold
    }

    /// The writer's checkpoint at the hard bound: waits for a running pass, then copies the
    /// rest (the writer is not committing meanwhile, so this one completes unless a reader
    /// still uses old frames).
    fn at_hard_bound(&mut self, conn: &Connection, path: &Path) {
        self.shared.writer_waiting.store(true, Ordering::SeqCst);
        let _guard = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.writer_waiting.store(false, Ordering::SeqCst);
        match checkpoint(conn) {
            Ok(complete) => {
                tracing::debug!(
                    complete,
                    frames = self.last_frames,
                    "writer checkpoint at the WAL bound"
                )
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "wal checkpoint failed")
            }
        }
        // If the WAL does not restart (a reader still uses old frames), try again a little
        // later rather than after every commit.
        self.writer_threshold = self.last_frames + CHECKPOINT_AFTER_FRAMES;
    }
}

/// Runs a `PASSIVE` checkpoint; returns whether every WAL frame is now in the database.
fn checkpoint(conn: &Connection) -> rusqlite::Result<bool> {
    checkpoint_counts(conn).map(|(complete, _)| complete)
}

/// A `PASSIVE` checkpoint: (every frame copied?, frames left to copy).
fn checkpoint_counts(conn: &Connection) -> rusqlite::Result<(bool, u64)> {
    let (busy, log, done) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let left = u64::try_from(log.saturating_sub(done)).unwrap_or(0);
    Ok((busy == 0 && log == done, left))
}

/// Starts the checkpointer thread on its own connection `conn`: on each nudge, `PASSIVE`
/// checkpoints alongside the writer and the readers (blocking neither), pass after pass while
/// [`CHASE_MIN_FRAMES`] or more are left, then one more for the short rest (which completes,
/// and lets the WAL restart, if no commit lands meanwhile). It stops when every
/// [`Checkpointer`] handle (the writer's and the store's) is gone.
///
/// With `write_back`, after a nudge's passes it writes the database file back
/// (`fdatasync`). SQLite syncs the file at the end of a pass only if the pass reached the
/// WAL's current end; under continuous load a commit lands during every pass, so it never
/// does (while the pass still answers "all copied": it counts up to the end as the pass
/// began). Everything the passes copied since the WAL last restarted was then synced by
/// the writer's checkpoint at the hard bound, on the commit path: 1.7-3 ms every ~3.3 s
/// at 1k events/s. Written back here, off the commit path, that sync finds little left.
/// Only under `synchronous=NORMAL`: under `FULL`, where every commit waits for a WAL sync,
/// the write-backs delayed those syncs more than they saved (docs/performance.md,
/// session 23).
///
/// With `sync_within` (under `synchronous=NORMAL`, where commits do not sync the WAL), a
/// commit is synced to disk within that time: the first commit after a sync wakes the
/// checkpointer, which syncs the WAL file (`fdatasync`, its own handle) when the time is
/// up. That bounds what a power failure or an OS crash can lose to the commits of the
/// last `sync_within`, at light load too, where nudges (one per [`CHECKPOINT_AFTER_FRAMES`]
/// frames) may be minutes apart; the kernel's own write-back would take up to ~30 s.
/// Without commits it sleeps: no timer runs.
pub(crate) fn spawn_checkpointer(
    conn: Connection,
    path: PathBuf,
    write_back: bool,
    sync_within: Option<Duration>,
) -> std::io::Result<(CheckpointNudge, std::thread::JoinHandle<()>)> {
    // Room for a nudge and an unsynced wake-up at once (nudges coalesce).
    let (tx, rx) = std::sync::mpsc::sync_channel::<Wake>(2);
    // The WAL, for syncing it: the writer's connection made it when it opened the store in
    // WAL mode, and it stays (same file) until the last connection closes.
    let wal_path = {
        let mut p = path.clone().into_os_string();
        p.push("-wal");
        PathBuf::from(p)
    };
    let wal_file = sync_within
        .map(|_| std::fs::File::open(&wal_path))
        .transpose()
        .inspect_err(|e| {
            tracing::warn!(path = %wal_path.display(), error = %e, "the checkpointer cannot open the WAL to sync it; commits are synced by checkpoints and the kernel only");
        })
        .ok()
        .flatten();
    let sync_within = sync_within.filter(|_| wal_file.is_some());
    let unsynced = Arc::new(AtomicBool::new(false));
    let shared = Checkpointer {
        tx,
        unsynced: Arc::clone(&unsynced),
        sync_within: sync_within.is_some(),
        lock: Arc::new(Mutex::new(())),
        writer_waiting: Arc::new(AtomicBool::new(false)),
        progress: Arc::new((Mutex::new(Progress::default()), Condvar::new())),
    };
    let lock = Arc::clone(&shared.lock);
    let writer_waiting = Arc::clone(&shared.writer_waiting);
    let progress = Arc::clone(&shared.progress);
    // A read-only handle is enough for `fdatasync`.
    let db_file = write_back
        .then(|| std::fs::File::open(&path))
        .transpose()
        .inspect_err(|e| {
            tracing::warn!(path = %path.display(), error = %e, "the checkpointer cannot open the database file to write it back; the writer's checkpoints at the WAL's bound will sync it");
        })
        .ok()
        .flatten();
    let handle = std::thread::Builder::new()
        .name("ostler-store-checkpoint".into())
        .spawn(move || {
            // When the WAL is to be synced (a commit may be unsynced since then).
            let mut sync_at: Option<Instant> = None;
            loop {
                let wake = match sync_at {
                    None => match rx.recv() {
                        Ok(w) => Some(w),
                        Err(_) => break,
                    },
                    Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                        Ok(w) => Some(w),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                        // The store closes: its final checkpoint syncs what is left.
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    },
                };
                match wake {
                    Some(Wake::Nudge) => {}
                    Some(Wake::Unsynced) => {
                        if let (None, Some(within)) = (sync_at, sync_within)
                            && unsynced.load(Ordering::SeqCst)
                        {
                            sync_at = Some(Instant::now() + within);
                        }
                        continue;
                    }
                    None => {
                        sync_at = None;
                        // Cleared first: a commit from now on wakes us again. Already clear
                        // when a complete checkpoint pass synced the WAL meanwhile.
                        if let Some(wal) = &wal_file
                            && unsynced.swap(false, Ordering::SeqCst)
                        {
                            match wal.sync_data() {
                                Ok(()) => {
                                    let mut p =
                                        progress.0.lock().unwrap_or_else(|p| p.into_inner());
                                    p.wal_synced += 1;
                                }
                                Err(e) => {
                                    tracing::warn!(path = %wal_path.display(), error = %e, "WAL sync failed");
                                }
                            }
                            progress.1.notify_all();
                        }
                        if unsynced.load(Ordering::SeqCst) {
                            sync_at = sync_within.map(|w| Instant::now() + w);
                        }
                        continue;
                    }
                }
                let mut tail_pass_done = false;
                // Whether a pass ran (and may have copied frames the file has not synced).
                let mut ran = false;
                // A complete pass syncs every frame committed before it began (SQLite syncs
                // the WAL before copying): then no separate sync is owed for those.
                let was_unsynced = unsynced.swap(false, Ordering::SeqCst);
                let mut all_copied = false;
                // The writer checkpointing at the hard bound does this nudge's work.
                while !writer_waiting.load(Ordering::SeqCst) {
                    let result = {
                        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                        checkpoint_counts(&conn)
                    };
                    ran |= result.is_ok();
                    let (complete, left) = match result {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "wal checkpoint failed");
                            (false, 0)
                        }
                    };
                    let (m, cv) = &*progress;
                    {
                        let mut p = m.lock().unwrap_or_else(|p| p.into_inner());
                        p.passes += 1;
                        p.complete = complete;
                    }
                    cv.notify_all();
                    all_copied = complete;
                    if complete || left == 0 || (left < CHASE_MIN_FRAMES && tail_pass_done) {
                        break;
                    }
                    tail_pass_done = left < CHASE_MIN_FRAMES;
                }
                if was_unsynced && !all_copied {
                    unsynced.store(true, Ordering::SeqCst);
                }
                if ran && let Some(file) = &db_file {
                    match file.sync_data() {
                        Ok(()) => {
                            let mut p = progress.0.lock().unwrap_or_else(|p| p.into_inner());
                            p.written_back += 1;
                        }
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "database file write-back failed");
                        }
                    }
                }
                // Whoever waits in `caught_up` re-nudges if this nudge was left to the writer.
                progress.1.notify_all();
                // An unsynced wake-up may have been dropped while the channel was full.
                if sync_at.is_none() && unsynced.load(Ordering::SeqCst) {
                    sync_at = sync_within.map(|w| Instant::now() + w);
                }
            }
        })?;
    let nudge = CheckpointNudge {
        shared,
        last_frames: 0,
        nudged_at: 0,
        writer_threshold: WAL_HARD_LIMIT_FRAMES,
    };
    Ok((nudge, handle))
}

pub(crate) struct Writer {
    conn: Connection,
    path: PathBuf,
    max_batch: usize,
    cache: HashMap<String, Slot>,
    checkpoint: Option<CheckpointNudge>,
    health: Arc<HealthCell>,
    retry_limit: Duration,
    feed: crate::feed::FeedPublisher,
}

impl Writer {
    /// `checkpoint`: when given, [`Writer::run`] installs a WAL hook on the connection (which
    /// turns SQLite's automatic checkpoints off) and schedules checkpoints itself.
    /// `health`: where the writer reports storage faults; `retry_limit`: how long a group
    /// that meets one is retried (see the module documentation).
    pub(crate) fn new(
        conn: Connection,
        path: PathBuf,
        max_batch: usize,
        checkpoint: Option<CheckpointNudge>,
        health: Arc<HealthCell>,
        retry_limit: Duration,
    ) -> Self {
        Self {
            feed: crate::feed::FeedPublisher::new(&conn),
            conn,
            path,
            max_batch: max_batch.max(1),
            cache: HashMap::new(),
            checkpoint,
            health,
            retry_limit,
        }
    }

    /// The last committed feed id, published after each commit.
    pub(crate) fn feed_watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.feed.subscribe()
    }

    /// The highest pruned feed cursor, published after each commit that touched the feed.
    pub(crate) fn feed_pruned_watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.feed.subscribe_pruned()
    }

    /// Commits a group and returns its commands with their outcome, to be finished once
    /// the writer's lock is released ([`Finished::send`]); or hands the group back (`Err`,
    /// left in `batch`) after a storage fault when `retry` is false.
    fn commit_group(
        &mut self,
        batch: &mut Vec<Command>,
        retry: bool,
    ) -> std::result::Result<Finished, ()> {
        let mut backoff = RETRY_FIRST;
        loop {
            let e = match self.attempt(batch) {
                Ok(feed_touched) => {
                    self.health.committed();
                    // Before the callers hear of the commit: a resolved ticket implies the
                    // feed position is published.
                    if feed_touched {
                        self.feed.committed(&self.conn);
                    }
                    return Ok(Finished::new(batch, None));
                }
                Err(e) => e,
            };
            self.rollback();
            // The group's changes were not merged into the cache; still, after a failed
            // commit reload everything from the database rather than trust memory.
            self.cache.clear();
            if !is_storage_fault(&e) {
                tracing::error!(path = %self.path.display(), error = %e, "write transaction failed");
                let path = self.path.clone();
                let make = move || Error::Commit(Arc::clone(&e)).at(&path);
                return Ok(Finished::new(batch, Some(Box::new(make))));
            }
            if !retry {
                return Err(());
            }
            let fault = self.health.failed(e.to_string(), self.retry_limit);
            if fault.given_up {
                let path = self.path.clone();
                let reason = fault.reason;
                let make = move || Error::Unwritable {
                    path: path.clone(),
                    reason: reason.clone(),
                };
                return Ok(Finished::new(batch, Some(Box::new(make))));
            }
            // Wait (never past the limit, so that giving up happens on time), then run the
            // same group again on the rolled-back database.
            let left = (fault.since + self.retry_limit).saturating_duration_since(Instant::now());
            std::thread::sleep(backoff.min(left).max(Duration::from_millis(1)));
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Whether the last commit (on this thread) brought the WAL to its hard bound.
    fn at_wal_bound(&mut self) -> bool {
        self.checkpoint
            .as_mut()
            .is_some_and(|nudge| nudge.committed(WAL_FRAMES.with(Cell::get)))
    }

    /// The writer's checkpoint at the WAL's hard bound.
    fn checkpoint_at_bound(&mut self) {
        if let Some(nudge) = &mut self.checkpoint {
            nudge.at_hard_bound(&self.conn, &self.path);
        }
    }

    /// A write transaction that changes nothing but still writes a page (the header's
    /// application id, set to its own value): commits only when the storage takes writes.
    fn probe(&mut self) {
        let attempt = (|| {
            exec(&self.conn, "BEGIN IMMEDIATE")?;
            let id: i64 = self
                .conn
                .query_row("PRAGMA application_id", [], |r| r.get(0))?;
            self.conn
                .execute_batch(&format!("PRAGMA application_id = {id}"))?;
            exec(&self.conn, "COMMIT")
        })();
        match attempt {
            Ok(()) => self.health.committed(),
            Err(e) => {
                self.rollback();
                if is_storage_fault(&e) {
                    self.health.failed(e.to_string(), self.retry_limit);
                } else {
                    tracing::warn!(path = %self.path.display(), error = %e, "store probe failed");
                }
            }
        }
    }

    fn rollback(&self) {
        if !self.conn.is_autocommit()
            && let Err(re) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %re, "rollback failed");
        }
    }

    /// Runs every command of the group in one transaction and commits it; `Ok(feed_touched)`
    /// once committed, with the group's slot changes merged into the cache. A group of more
    /// than one command runs without savepoints first, and again with them if one of its
    /// commands failed (see the module documentation).
    fn attempt(
        &mut self,
        batch: &mut [Command],
    ) -> std::result::Result<bool, Arc<rusqlite::Error>> {
        let passed = match self.pass(batch, Undo::Whole)? {
            Passed::Undone if batch.len() > 1 => self.pass(batch, Undo::Savepoint)?,
            // Committed, or the only command failed: nothing of it stays (its error is its
            // result).
            passed => passed,
        };
        Ok(matches!(passed, Passed::Committed { feed_touched: true }))
    }

    /// Runs every command of the group in one transaction, undoing a failed command's
    /// changes as `mode` says, and commits it (or rolls it back: [`Passed::Undone`]).
    fn pass(
        &mut self,
        batch: &mut [Command],
        mode: Undo,
    ) -> std::result::Result<Passed, Arc<rusqlite::Error>> {
        // If the transaction cannot begin, the context starts poisoned: every command then
        // completes with the error without touching the connection.
        let poisoned = match exec(&self.conn, "BEGIN IMMEDIATE") {
            Ok(()) => None,
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "cannot begin write transaction");
                Some(Arc::new(e))
            }
        };
        let mut ctx = Ctx {
            conn: &self.conn,
            path: &self.path,
            cache: &self.cache,
            overlay: HashMap::new(),
            staged: Vec::new(),
            feed_touched: false,
            poisoned,
            mode,
            undo: false,
        };
        for cmd in batch.iter_mut() {
            cmd.0.run(&mut ctx);
        }
        let Ctx {
            overlay,
            poisoned,
            feed_touched,
            undo,
            ..
        } = ctx;
        if let Some(e) = poisoned {
            return Err(e);
        }
        if undo {
            // Nothing of this pass stays, the slots of the commands that succeeded in it
            // included (the overlay is not merged).
            if !self.conn.is_autocommit() {
                exec(&self.conn, "ROLLBACK").map_err(Arc::new)?;
            }
            return Ok(Passed::Undone);
        }
        exec(&self.conn, "COMMIT").map_err(Arc::new)?;
        for (id, slot) in overlay {
            match slot {
                Some(slot) => self.cache.insert(id, slot),
                None => self.cache.remove(&id),
            };
        }
        Ok(Passed::Committed { feed_touched })
    }
}

/// How a group's pass ended.
enum Passed {
    Committed {
        feed_touched: bool,
    },
    /// A command failed in a pass without savepoints: the transaction was rolled back.
    Undone,
}

/// The writer's queue, the writer itself behind its lock, and what decides whether a caller
/// may commit on its own thread (see the module documentation). Lock order: `writer`, then
/// `queue`.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a command is queued, a checkpoint is due or the store closes.
    wake: Condvar,
    writer: Mutex<Writer>,
    health: Arc<HealthCell>,
    max_batch: usize,
    /// Commits on the caller's thread are allowed (`synchronous=NORMAL`: no fsync per commit).
    inline: bool,
    /// The write connection's busy timeout, which a commit on a caller's thread does not
    /// wait out: a lock held elsewhere hands the write to the writer thread at once.
    busy_timeout: Duration,
}

#[derive(Default)]
struct Queue {
    cmds: VecDeque<Command>,
    /// The store handle is gone: the writer finishes the queue and stops.
    closed: bool,
    /// A commit on a caller's thread brought the WAL to its hard bound.
    bound_due: bool,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// `inline`: whether [`Shared::submit_now`] may commit on the caller's thread;
    /// `busy_timeout`: the write connection's.
    pub(crate) fn new(writer: Writer, inline: bool, busy_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            health: Arc::clone(&writer.health),
            max_batch: writer.max_batch,
            writer: Mutex::new(writer),
            inline,
            busy_timeout,
        })
    }

    /// Queues a command for the writer thread; `Err` (the command back) once closed.
    pub(crate) fn submit(&self, cmd: Command) -> std::result::Result<(), Command> {
        let mut q = locked(&self.queue);
        if q.closed {
            return Err(cmd);
        }
        q.cmds.push_back(cmd);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// Commits `cmd` on this thread if the writer is idle (see the module documentation),
    /// else queues it like [`Shared::submit`].
    pub(crate) fn submit_now(&self, cmd: Command) -> std::result::Result<(), Command> {
        if !self.inline || !self.health.current().is_writable() {
            return self.submit(cmd);
        }
        let mut w = match self.writer.try_lock() {
            Ok(w) => w,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return self.submit(cmd),
        };
        {
            let q = locked(&self.queue);
            if q.closed || !q.cmds.is_empty() || q.bound_due {
                drop(q);
                drop(w);
                return self.submit(cmd);
            }
        }
        let mut batch = vec![cmd];
        // Never wait on a lock held elsewhere on the caller's thread (an async worker).
        let no_wait = w.conn.busy_timeout(Duration::ZERO);
        let committed = ostler_metrics::store_commit(|| w.commit_group(&mut batch, false));
        if no_wait.is_ok()
            && let Err(e) = w.conn.busy_timeout(self.busy_timeout)
        {
            tracing::warn!(path = %w.path.display(), error = %e, "cannot restore the busy timeout");
        }
        let bound = committed.is_ok() && w.at_wal_bound();
        if committed.is_err() || bound {
            // The retries of a storage fault, or the checkpoint at the bound: the writer
            // thread's (still holding the lock, so nothing overtakes the handed-back group).
            let mut q = locked(&self.queue);
            q.cmds.extend(batch);
            q.bound_due |= bound;
            drop(q);
            self.wake.notify_one();
        }
        drop(w);
        if let Ok(done) = committed {
            done.send();
        }
        Ok(())
    }

    /// The store handle is gone: the writer thread finishes the queue and stops.
    pub(crate) fn close(&self) {
        // A write that meets a storage fault from now on fails at once: retrying it until
        // `write_retry_secs` would keep the closing daemon alive that long.
        self.health.closing();
        locked(&self.queue).closed = true;
        self.wake.notify_one();
    }

    /// The writer thread: runs until the store closes and the queue is empty, then
    /// checkpoints the WAL away (closing the write connection).
    pub(crate) fn run(&self) {
        {
            let w = locked(&self.writer);
            if w.checkpoint.is_some() {
                // Replaces SQLite's automatic checkpoints (the same hook slot) on this
                // connection.
                w.conn.wal_hook(Some(record_wal_frames));
            }
        }
        let mut batch = Vec::with_capacity(self.max_batch.min(4096));
        loop {
            // While the store is faulty and nothing is queued, probe it now and then so that
            // health recovers without waiting for a write.
            let mut probe = false;
            {
                let mut q = locked(&self.queue);
                while q.cmds.is_empty() && !q.bound_due {
                    if q.closed {
                        drop(q);
                        self.finish();
                        return;
                    }
                    if self.health.current().is_writable() {
                        q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
                    } else {
                        let (g, waited) = self
                            .wake
                            .wait_timeout(q, RETRY_MAX)
                            .unwrap_or_else(PoisonError::into_inner);
                        q = g;
                        if waited.timed_out() && q.cmds.is_empty() {
                            probe = true;
                            break;
                        }
                    }
                }
            }
            let mut w = locked(&self.writer);
            if probe {
                w.probe();
                continue;
            }
            // Taken only while holding the writer: see the module documentation.
            let bound_due = {
                let mut q = locked(&self.queue);
                let n = q.cmds.len().min(self.max_batch);
                batch.extend(q.cmds.drain(..n));
                std::mem::take(&mut q.bound_due)
            };
            if bound_due {
                w.checkpoint_at_bound();
            }
            if batch.is_empty() {
                continue;
            }
            // The writer thread retries storage faults itself, so the group always ends here.
            let done = ostler_metrics::store_commit(|| w.commit_group(&mut batch, true));
            if w.at_wal_bound() {
                // Between groups, outside any transaction, after the callers have their
                // results; only at the WAL's hard bound.
                if let Ok(done) = done {
                    done.send();
                }
                w.checkpoint_at_bound();
            } else {
                // The lock first: a caller woken by its result finds the writer free.
                drop(w);
                if let Ok(done) = done {
                    done.send();
                }
            }
        }
    }

    /// Closing: moves everything into the database file and empties the WAL, so that a
    /// closed store is one self-contained file.
    fn finish(&self) {
        let w = locked(&self.writer);
        if let Err(e) = w
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        {
            tracing::warn!(path = %w.path.display(), error = %e, "final checkpoint failed");
        }
        tracing::debug!(path = %w.path.display(), "store writer stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nudge's passes end with a write-back of the database file (SQLite's own sync at
    /// the end of a pass does not happen under continuous load; see `spawn_checkpointer`).
    #[test]
    fn a_nudge_ends_with_a_write_back_of_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let open = || wal_connection(&path);
        let conn = open();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        for _ in 0..50 {
            conn.execute("INSERT INTO t VALUES (zeroblob(10000))", [])
                .unwrap();
        }
        let (nudge, handle) = spawn_checkpointer(open(), path.clone(), true, None).unwrap();
        let checkpointer = nudge.handle();
        let wait = ostler_testkit::timeouts::secs(30);
        assert!(checkpointer.caught_up(wait), "no pass copied the WAL");
        // The write-back follows the nudge's last pass.
        let p = progress_until(&checkpointer, "a write-back", |p| p.written_back > 0);
        assert!(p.written_back <= p.passes, "{p:?}");
        assert_eq!(p.wal_synced, 0, "no sync_within, no WAL sync");
        drop(p);
        drop((nudge, checkpointer));
        handle.join().unwrap();
    }

    /// With `sync_within`, a commit wakes the checkpointer, which syncs the WAL file that
    /// long after, without running checkpoint passes; the next commit after that sync wakes
    /// it again. Without `sync_within` a commit wakes nothing.
    #[test]
    fn a_commit_is_synced_within_sync_within() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let open = || wal_connection(&path);
        let conn = open();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        let within = Some(Duration::from_millis(20));
        let (mut nudge, handle) = spawn_checkpointer(open(), path.clone(), true, within).unwrap();
        let checkpointer = nudge.handle();
        for round in 1..=3 {
            conn.execute("INSERT INTO t VALUES (zeroblob(100))", [])
                .unwrap();
            // What the writer's WAL hook reports after a commit: far below a nudge.
            nudge.committed(round);
            let p = progress_until(&checkpointer, "the WAL synced", |p| p.wal_synced >= round);
            assert_eq!(p.passes, 0, "a commit ran checkpoint passes: {p:?}");
        }
        drop((nudge, checkpointer));
        handle.join().unwrap();

        let (mut nudge, handle) = spawn_checkpointer(open(), path.clone(), true, None).unwrap();
        nudge.committed(4);
        assert!(!nudge.shared.unsynced.load(Ordering::SeqCst));
        drop(nudge);
        handle.join().unwrap();
    }

    /// A connection to `path` in WAL mode.
    fn wal_connection(path: &Path) -> Connection {
        let c = Connection::open(path).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c
    }

    /// Waits (on the checkpointer's condition variable) until `done` holds for its progress.
    fn progress_until<'a>(
        checkpointer: &'a Checkpointer,
        what: &str,
        done: impl Fn(&Progress) -> bool,
    ) -> MutexGuard<'a, Progress> {
        let deadline = Instant::now() + ostler_testkit::timeouts::secs(30);
        let (lock, cv) = &*checkpointer.progress;
        let mut p = lock.lock().unwrap();
        while !done(&p) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "waited in vain for {what}: {p:?}");
            p = cv.wait_timeout(p, left).unwrap().0;
        }
        p
    }
}
