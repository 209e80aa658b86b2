//! The single writer: a dedicated thread that owns the only write connection, drains a
//! channel of write commands and commits them in groups.
//!
//! Each command runs inside its own savepoint of the group's transaction, so a command that
//! fails (unknown session, constraint violation) is rolled back alone and reports its own
//! error, while the rest of the group commits. Results are handed to the callers only after
//! `COMMIT` returned; if the commit fails, every command of the group gets
//! [`Error::Commit`] and nothing of the group is stored.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};

use rusqlite::{Connection, OptionalExtension};

use crate::error::{Error, Result};

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
            last_seq: crate::store::seq_from_sql(last)?,
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

pub(crate) fn not_found_session(id: &str) -> Error {
    Error::not_found(format!("session {id:?}"))
}

pub(crate) struct Writer {
    conn: Connection,
    path: PathBuf,
    max_batch: usize,
    cache: HashMap<String, Slot>,
}

impl Writer {
    pub(crate) fn new(conn: Connection, path: PathBuf, max_batch: usize) -> Self {
        Self {
            conn,
            path,
            max_batch: max_batch.max(1),
            cache: HashMap::new(),
        }
    }

    /// Runs until every sender is gone, then returns (closing the write connection).
    pub(crate) fn run(mut self, rx: Receiver<Command>) {
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
                for complete in completions {
                    complete(None);
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
