//! Opening SQLite connections: flags, the write connection's pragmas, and the mapping of
//! open errors (damaged file -> `Corrupt`).

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::error::{Error, Result, is_corruption};
use crate::types::StoreOptions;

pub(crate) fn open_flags_rw() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI
}

pub(crate) fn open_flags_ro() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI
}

/// Maps an error met while opening: damaged/not-a-database → `Corrupt`, else → `Open`.
pub(crate) fn open_error(path: &Path, e: rusqlite::Error) -> Error {
    if is_corruption(&e) {
        Error::Corrupt {
            path: path.to_path_buf(),
            source: e,
        }
    } else {
        Error::Open {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

/// Opens and configures the write connection (WAL, synchronous, busy timeout, foreign keys,
/// incremental auto-vacuum for new files). Does not migrate.
pub(crate) fn open_write_connection(path: &Path, opts: &StoreOptions) -> Result<Connection> {
    let oe = |e| open_error(path, e);
    let conn = Connection::open_with_flags(path, open_flags_rw()).map_err(oe)?;
    conn.busy_timeout(opts.busy_timeout).map_err(oe)?;
    // The writer reuses a couple of dozen statements; keep all of them prepared.
    conn.set_prepared_statement_cache_capacity(64);
    // The first read of the schema is where SQLite notices a file that is not a database.
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(oe)?;
    if tables == 0 {
        // Only possible before the first table exists: lets deletes give space back to the
        // file system with `PRAGMA incremental_vacuum`.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(oe)?;
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(oe)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Setup {
            path: path.to_path_buf(),
            reason: format!("WAL journal mode refused (journal_mode is {mode:?})"),
        });
    }
    conn.pragma_update(None, "synchronous", opts.synchronous.pragma_value())
        .map_err(oe)?;
    // After a checkpoint, truncate a WAL that grew large (e.g. while a long read pinned an
    // old snapshot) instead of keeping its high-water size forever.
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
        .map_err(oe)?;
    conn.pragma_update(None, "foreign_keys", true).map_err(oe)?;
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .map_err(oe)?;
    if !fk {
        return Err(Error::Setup {
            path: path.to_path_buf(),
            reason: "foreign keys cannot be enabled".into(),
        });
    }
    Ok(conn)
}
