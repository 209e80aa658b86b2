//! The one way the engine runs synchronous work (SQLite reads, file system calls such as
//! `canonicalize`) from async code: on tokio's blocking pool, never on a runtime worker.

use crate::error::{Error, Result};

/// Runs `f` on the blocking pool and returns its result as an engine result.
pub(crate) async fn blocking<T, E>(
    f: impl FnOnce() -> std::result::Result<T, E> + Send + 'static,
) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("blocking task: {e}")))?
        .map_err(Into::into)
}
