//! The single writer: a dedicated thread that owns the only write connection, drains a
//! channel of write commands and commits them in groups.
//!
//! Each command runs inside its own savepoint of the group's transaction, so a command that
//! fails (unknown session, constraint violation) is rolled back alone and reports its own
//! error, while the rest of the group commits. Results are handed to the callers only after
//! `COMMIT` returned; if the commit fails, every command of the group gets
//! [`Error::Commit`] and nothing of the group is stored.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension};

use crate::error::{Error, Result, not_found_session};
use crate::rows::seq_from_sql;

/// Completes one command once the fate of its transaction is known: `None` = committed.
pub(crate) type Completion = Box<dyn FnOnce(Option<&Arc<rusqlite::Error>>) + Send>;

/// A write request, executed on the writer thread inside the current group transaction.
pub(crate) struct Command {
    run: Box<dyn FnOnce(&mut Ctx<'_>) -> Completion + Send>,
}

/// Builds a command that runs `op` in a savepoint and sends its result to `reply` once the
/// group has committed.
pub(crate) fn command<T, F>(op: F, reply: tokio::sync::oneshot::Sender<Result<T>>) -> Command
where
    T: Send + 'static,
    F: FnOnce(&mut Ctx<'_>) -> Result<T> + Send + 'static,
{
    Command {
        run: Box::new(move |ctx: &mut Ctx<'_>| {
            let path = ctx.path.to_path_buf();
            let result = ctx.in_savepoint(op).map_err(|e| e.at(&path));
            Box::new(move |commit_error: Option<&Arc<rusqlite::Error>>| {
                let result = match commit_error {
                    None => result,
                    Some(e) => Err(Error::Commit(Arc::clone(e)).at(&path)),
                };
                // The caller may have stopped waiting; the write stands regardless.
                let _ = reply.send(result);
            })
        }),
    }
}

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
    /// Set when the transaction can no longer be committed.
    poisoned: Option<Arc<rusqlite::Error>>,
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
        let found = self
            .conn
            .prepare_cached(
                "SELECT pk, (SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_pk = sessions.pk)
                 FROM sessions WHERE id = ?1",
            )?
            .query_row([session_id], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)))
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

    fn in_savepoint<T>(&mut self, op: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if let Some(e) = &self.poisoned {
            return Err(Error::Commit(Arc::clone(e)));
        }
        if let Err(e) = exec(self.conn, "SAVEPOINT op") {
            return Err(self.poison(e));
        }
        self.staged.clear();
        match op(self) {
            Ok(v) => match exec(self.conn, "RELEASE op") {
                Ok(()) => {
                    for (id, slot) in self.staged.drain(..) {
                        self.overlay.insert(id, slot);
                    }
                    Ok(v)
                }
                Err(e) => Err(self.poison(e)),
            },
            Err(err) => {
                self.staged.clear();
                if let Err(e) =
                    exec(self.conn, "ROLLBACK TO op").and_then(|()| exec(self.conn, "RELEASE op"))
                {
                    self.poison(e);
                }
                Err(err)
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

/// WAL size (frames = pages) at which the checkpointer is asked to run; the same figure as
/// SQLite's default `wal_autocheckpoint`.
const CHECKPOINT_AFTER_FRAMES: u64 = 1000;

/// WAL size at which the writer tries to finish the checkpoint itself, between two groups,
/// if the checkpointer is not busy. Under continuous load the checkpointer never completes
/// (new frames keep arriving), and the WAL only restarts from its beginning once every frame
/// is back in the database; by then the checkpointer has copied nearly everything, so the
/// writer's checkpoint is short.
const WRITER_CHECKPOINT_AFTER_FRAMES: u64 = 2 * CHECKPOINT_AFTER_FRAMES;

/// WAL size at which the writer waits for a running checkpoint and then checkpoints itself:
/// when the disk cannot keep up, appends slow down instead of the WAL (and the time to
/// recover it after a crash) growing without bound. About 16 MiB with 4 KiB pages.
const WAL_HARD_LIMIT_FRAMES: u64 = 4 * CHECKPOINT_AFTER_FRAMES;

thread_local! {
    /// Frames in the WAL after the last commit of this thread's connection (set by the WAL
    /// hook, which SQLite calls on the committing thread: the writer thread).
    static WAL_FRAMES: Cell<u64> = const { Cell::new(0) };
}

fn record_wal_frames(_wal: &rusqlite::hooks::Wal, frames: c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(u64::try_from(frames).unwrap_or(0)));
    Ok(())
}

/// What the writer should do about checkpoints after a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckpointAction {
    None,
    /// Checkpoint now unless the checkpointer is busy.
    IfIdle,
    /// Wait for the checkpointer, then checkpoint.
    Wait,
}

/// Decides when checkpoints happen: mostly on the checkpointer thread, so that the
/// checkpoint (and its fsyncs) is not paid inside some unlucky append's commit; now and then
/// by the writer itself, so that the WAL restarts under continuous load and stays bounded
/// when the disk is slow.
pub(crate) struct CheckpointNudge {
    tx: SyncSender<()>,
    /// Held while a checkpoint runs (SQLite would only answer "busy" to a second one).
    lock: Arc<Mutex<()>>,
    last_frames: u64,
    nudged_at: u64,
    writer_threshold: u64,
}

impl CheckpointNudge {
    fn committed(&mut self, frames: u64) -> CheckpointAction {
        if frames < self.last_frames {
            // The WAL restarted from its beginning.
            self.nudged_at = 0;
            self.writer_threshold = WRITER_CHECKPOINT_AFTER_FRAMES;
        }
        self.last_frames = frames;
        if frames >= self.nudged_at + CHECKPOINT_AFTER_FRAMES {
            // A full channel means a checkpoint is already due: nudges coalesce.
            let _ = self.tx.try_send(());
            self.nudged_at = frames;
        }
        if frames < self.writer_threshold {
            CheckpointAction::None
        } else if frames >= WAL_HARD_LIMIT_FRAMES {
            CheckpointAction::Wait
        } else {
            CheckpointAction::IfIdle
        }
    }

    /// Runs the writer's checkpoint on `conn` as decided by [`Self::committed`].
    fn run(&mut self, conn: &Connection, path: &Path, action: CheckpointAction) {
        let guard = match action {
            CheckpointAction::None => return,
            CheckpointAction::IfIdle => match self.lock.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            },
            CheckpointAction::Wait => Some(self.lock.lock().unwrap_or_else(|p| p.into_inner())),
        };
        if guard.is_some() {
            match checkpoint(conn) {
                Ok(complete) => {
                    tracing::trace!(complete, frames = self.last_frames, "writer checkpoint")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "wal checkpoint failed")
                }
            }
        }
        // If the WAL does not restart (a reader still uses old frames, or the checkpointer
        // was busy), try again a little later.
        self.writer_threshold = self.last_frames + CHECKPOINT_AFTER_FRAMES;
    }
}

/// Runs a `PASSIVE` checkpoint; returns whether every WAL frame is now in the database.
fn checkpoint(conn: &Connection) -> rusqlite::Result<bool> {
    let (busy, log, done) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    Ok(busy == 0 && log == done)
}

/// Starts the checkpointer thread on its own connection `conn`: a `PASSIVE` checkpoint per
/// nudge, alongside the writer and the readers (blocking neither). It stops when the writer
/// (holding the returned nudge) is gone.
pub(crate) fn spawn_checkpointer(
    conn: Connection,
    path: PathBuf,
) -> std::io::Result<(CheckpointNudge, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    let lock = Arc::new(Mutex::new(()));
    let thread_lock = Arc::clone(&lock);
    let handle = std::thread::Builder::new()
        .name("ostler-store-checkpoint".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                let _guard = thread_lock.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = checkpoint(&conn) {
                    tracing::warn!(path = %path.display(), error = %e, "wal checkpoint failed");
                }
            }
        })?;
    let nudge = CheckpointNudge {
        tx,
        lock,
        last_frames: 0,
        nudged_at: 0,
        writer_threshold: WRITER_CHECKPOINT_AFTER_FRAMES,
    };
    Ok((nudge, handle))
}

pub(crate) struct Writer {
    conn: Connection,
    path: PathBuf,
    max_batch: usize,
    cache: HashMap<String, Slot>,
    checkpoint: Option<CheckpointNudge>,
    feed: crate::feed::FeedPublisher,
}

impl Writer {
    /// `checkpoint`: when given, [`Writer::run`] installs a WAL hook on the connection (which
    /// turns SQLite's automatic checkpoints off) and schedules checkpoints itself.
    pub(crate) fn new(
        conn: Connection,
        path: PathBuf,
        max_batch: usize,
        checkpoint: Option<CheckpointNudge>,
    ) -> Self {
        Self {
            feed: crate::feed::FeedPublisher::new(&conn),
            conn,
            path,
            max_batch: max_batch.max(1),
            cache: HashMap::new(),
            checkpoint,
        }
    }

    /// The last committed feed id, published after each commit.
    pub(crate) fn feed_watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.feed.subscribe()
    }

    /// Runs until every sender is gone, then returns (closing the write connection).
    pub(crate) fn run(mut self, rx: Receiver<Command>) {
        if self.checkpoint.is_some() {
            // Replaces SQLite's automatic checkpoints (the same hook slot) on this connection.
            self.conn.wal_hook(Some(record_wal_frames));
        }
        let mut batch = Vec::with_capacity(self.max_batch.min(4096));
        while let Ok(first) = rx.recv() {
            batch.push(first);
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            self.run_batch(&mut batch);
        }
        // Closing: move everything into the database file and empty the WAL, so that a
        // closed store is one self-contained file.
        if let Err(e) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        {
            tracing::warn!(path = %self.path.display(), error = %e, "final checkpoint failed");
        }
        tracing::debug!(path = %self.path.display(), "store writer stopped");
    }

    fn run_batch(&mut self, batch: &mut Vec<Command>) {
        // If the transaction cannot begin, the context starts poisoned: every command then
        // completes with the error without touching the connection.
        let poisoned = match exec(&self.conn, "BEGIN IMMEDIATE") {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot begin write transaction");
                Some(Arc::new(e))
            }
        };
        let mut ctx = Ctx {
            conn: &self.conn,
            path: &self.path,
            cache: &self.cache,
            overlay: HashMap::new(),
            staged: Vec::new(),
            poisoned,
        };
        let completions: Vec<Completion> = batch.drain(..).map(|cmd| (cmd.run)(&mut ctx)).collect();
        let Ctx {
            overlay, poisoned, ..
        } = ctx;
        let outcome = match poisoned {
            Some(e) => Err(e),
            None => exec(&self.conn, "COMMIT").map_err(Arc::new),
        };
        match outcome {
            Ok(()) => {
                for (id, slot) in overlay {
                    match slot {
                        Some(slot) => self.cache.insert(id, slot),
                        None => self.cache.remove(&id),
                    };
                }
                // Before the callers hear of the commit: a resolved ticket implies the
                // feed position is published.
                self.feed.committed(&self.conn);
                for complete in completions {
                    complete(None);
                }
                if let Some(nudge) = &mut self.checkpoint {
                    // Between groups, outside any transaction, after the callers have their
                    // results.
                    let action = nudge.committed(WAL_FRAMES.with(Cell::get));
                    nudge.run(&self.conn, &self.path, action);
                }
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "write transaction failed");
                if !self.conn.is_autocommit()
                    && let Err(re) = self.conn.execute_batch("ROLLBACK")
                {
                    tracing::error!(error = %re, "rollback failed");
                }
                // The group's changes were not merged into the cache; still, after a failed
                // commit reload everything from the database rather than trust memory.
                self.cache.clear();
                for complete in completions {
                    complete(Some(&e));
                }
            }
        }
    }
}
