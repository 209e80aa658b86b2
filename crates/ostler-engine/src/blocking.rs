//! The one way the engine runs synchronous work (SQLite reads, file system calls such as
//! `canonicalize`) from async code: on tokio's blocking pool, never on a runtime worker.

use crate::error::{Error, Result};

/// Work started on the blocking pool ([`start`]); [`Started::result`] awaits it.
pub(crate) struct Started<T>(tokio::task::JoinHandle<Result<T>>);

impl<T> Started<T> {
    /// The work's result, as an engine result.
    pub(crate) async fn result(self) -> Result<T> {
        self.0
            .await
            .map_err(|e| Error::internal(format!("blocking task: {e}")))?
    }
}

/// Starts `f` on the blocking pool now (not when first awaited), e.g. to read ahead.
pub(crate) fn start<T, E>(
    f: impl FnOnce() -> std::result::Result<T, E> + Send + 'static,
) -> Started<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    Started(tokio::task::spawn_blocking(move || f().map_err(Into::into)))
}

/// Runs `f` on the blocking pool and returns its result as an engine result.
pub(crate) async fn blocking<T, E>(
    f: impl FnOnce() -> std::result::Result<T, E> + Send + 'static,
) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    start(f).result().await
}
