//! The CLI's debug log of a session created with `debug` (the Agent SDKs' `debug` /
//! `debugFile`). The daemon chooses the file, `<debug_dir>/<session id>.log`
//! ([`EngineOptions::debug_dir`](crate::EngineOptions::debug_dir)), and passes it as
//! `--debug-file` at every spawn (create, resume, fork), so the CLI appends to the same
//! file; a client never names a path. `ReadDebugLog` reads it in bounded pieces, in any
//! state; `DeleteSession` removes it. The CLI writes it without bound.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;

use super::Engine;
use super::lifecycle::SessionSpec;
use crate::blocking::blocking;
use crate::error::{Error, Result};

/// What `ReadDebugLog` reads when the caller names no bound.
pub const DEBUG_READ_DEFAULT: u32 = 64 * 1024;
/// The most one `ReadDebugLog` returns.
pub const DEBUG_READ_MAX: u32 = 1024 * 1024;

/// One piece of a session's debug log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugLogChunk {
    /// The bytes from the requested offset.
    pub data: Vec<u8>,
    /// Offset + `data.len()`.
    pub next_offset: u64,
    /// The file's size when read (0 while the CLI has written nothing).
    pub size: u64,
    /// Whether the read reached the end of the file as it was.
    pub eof: bool,
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
        blocking(move || {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(&dir)
                .map_err(|e| Error::internal(format!("debug log directory {}: {e}", dir.display())))
        })
        .await?;
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
        let r = blocking(move || match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::internal(e)),
            _ => Ok(()),
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
        blocking(move || read_chunk(&path, offset, want)).await
    }
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

/// Reads `[offset, offset + want)` of `path`, bounded by its size now; a missing file is an
/// empty log (the CLI has not written yet).
fn read_chunk(path: &std::path::Path, offset: u64, want: u32) -> Result<DebugLogChunk> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if offset > 0 {
                return Err(past_end(offset, 0));
            }
            return Ok(DebugLogChunk {
                data: Vec::new(),
                next_offset: 0,
                size: 0,
                eof: true,
            });
        }
        Err(e) => return Err(Error::internal(format!("debug log: {e}"))),
    };
    let size = f
        .metadata()
        .map_err(|e| Error::internal(format!("debug log: {e}")))?
        .len();
    if offset > size {
        return Err(past_end(offset, size));
    }
    let n = u64::from(want).min(size - offset);
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::internal(format!("debug log: {e}")))?;
    let mut data = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    f.take(n)
        .read_to_end(&mut data)
        .map_err(|e| Error::internal(format!("debug log: {e}")))?;
    let next_offset = offset + data.len() as u64;
    Ok(DebugLogChunk {
        data,
        next_offset,
        size,
        eof: next_offset >= size,
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
}
