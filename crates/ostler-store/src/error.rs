//! The store's typed errors.

use std::path::PathBuf;
use std::sync::Arc;

/// `Result` with the store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The named session, interaction, ... does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, e.g. `session "abc"`.
        what: String,
    },

    /// Something with this identity already exists (e.g. a session id).
    #[error("{what} already exists")]
    AlreadyExists {
        /// What was to be created.
        what: String,
    },

    /// The caller passed something the store cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The database was written by a newer ostler; this build will not guess at its layout.
    #[error(
        "database {path} has schema version {found}, but this ostler supports at most version \
         {supported}; it was written by a newer ostler (upgrade ostler, or use another database)"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// The version found in the file.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },

    /// The file is not an SQLite database, or SQLite found it damaged.
    #[error("database {path} is corrupt or is not an ostler database: {sqlite}")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What SQLite reported (in the message, so not a `source()` too: a chain printed
        /// whole would say it twice).
        sqlite: rusqlite::Error,
    },

    /// The database file could not be opened or configured (permissions, missing directory,
    /// a file system that cannot hold a WAL, ...).
    #[error("cannot open database {path}: {sqlite}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What SQLite reported (in the message only, as for `Corrupt`).
        sqlite: rusqlite::Error,
    },

    /// The database opened but cannot be set up as the store requires (e.g. the file
    /// system refuses WAL mode).
    #[error("cannot set up database {path}: {reason}")]
    Setup {
        /// The database file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// A file system operation on the database's path failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Any other SQLite error.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),

    /// The write itself succeeded but the transaction it was grouped into failed to commit,
    /// so nothing of it was stored. Every write of that group gets this error.
    #[error("the write transaction failed to commit; nothing of it was stored: {0}")]
    Commit(#[source] Arc<rusqlite::Error>),

    /// The storage refused writes (disk full, read-only or vanished files, I/O errors) for
    /// longer than `StoreOptions::write_retry_limit`; nothing of the write was stored. The
    /// store recovers by itself once writes work again (see [`crate::WriteHealth`]).
    #[error("store not writable: {reason} (database {path})")]
    Unwritable {
        /// The database file.
        path: PathBuf,
        /// What SQLite reported.
        reason: String,
    },

    /// The session holds the most events a session can (`max`, 2^36 - 1): nothing more can
    /// be appended to it. Nothing of the refused append was stored.
    #[error("the session holds the most events a session can ({max}); start a new session")]
    SessionFull {
        /// The greatest seq a session can have.
        max: u64,
    },

    /// A value read from the database is not one this build can represent (e.g. an unknown
    /// interaction state, a negative sequence number).
    #[error("invalid stored data: {0}")]
    InvalidData(String),

    /// The store's writer has stopped (the store was dropped, or the writer thread died).
    #[error("the store is closed")]
    Closed,
}

impl Error {
    pub(crate) fn not_found(what: impl Into<String>) -> Self {
        Error::NotFound { what: what.into() }
    }

    /// Turns an SQLite error into [`Error::Corrupt`] when SQLite says the file is damaged or
    /// not a database, and into [`Error::Sqlite`] otherwise.
    pub(crate) fn sqlite_at(path: &std::path::Path, e: rusqlite::Error) -> Self {
        if is_corruption(&e) {
            Error::Corrupt {
                path: path.to_path_buf(),
                sqlite: e,
            }
        } else {
            Error::Sqlite(e)
        }
    }

    /// Re-labels an error produced while reading or writing `path` (adds the path to
    /// corruption errors).
    pub(crate) fn at(self, path: &std::path::Path) -> Self {
        match self {
            Error::Sqlite(e) => Error::sqlite_at(path, e),
            other => other,
        }
    }
}

pub(crate) fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

impl From<rusqlite::types::FromSqlError> for Error {
    fn from(e: rusqlite::types::FromSqlError) -> Self {
        Error::InvalidData(e.to_string())
    }
}

/// The error for an unknown session id.
pub(crate) fn not_found_session(id: &str) -> Error {
    Error::not_found(format!("session {id:?}"))
}
