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
            sqlite: e,
        }
    } else {
        Error::Open {
            path: path.to_path_buf(),
            sqlite: e,
        }
    }
}

/// The number of tables in the database open on `conn`; `Setup` when they are another
/// program's (tables and no ostler schema version), which ostler must neither change (not
/// even its journal mode) nor mistake for its own.
fn ostler_tables(conn: &Connection, path: &Path) -> Result<i64> {
    let oe = |e| open_error(path, e);
    // The first read of the schema is where SQLite notices a file that is not a database.
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(oe)?;
    if tables > 0 && crate::migrate::current_version(conn).map_err(oe)? == 0 {
        // Version 0 with tables: another program's database, which ostler must neither
        // change (not even its journal mode) nor mistake for its own.
        let names: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name LIMIT 6")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<_>>()
            })
            .map_err(oe)?;
        let shown = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = if names.len() > 5 { ", ..." } else { "" };
        return Err(Error::Setup {
            path: path.to_path_buf(),
            reason: format!(
                "it is not an ostler store: it holds tables ({shown}{more}) and no ostler \
                 schema version; give ostler a file of its own (store.path)"
            ),
        });
    }
    Ok(tables)
}

/// Where SQLite keeps a database's `-wal` or `-shm` file.
fn companion(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// Why a database file that can be read but not written is refused.
const READ_ONLY_FILE: &str = "the database file can be read but not written (its \
    permissions, an immutable attribute or a read-only mount); ostler writes every event to it";

/// What SQLite would handle badly or say unclearly about the store's files, said first:
/// a directory where the database should be; an empty (or missing) database beside a WAL
/// that holds data (SQLite would take the database for a new one and delete the WAL, with
/// every event in it: the database file was truncated or lost, the WAL was not); a
/// directory SQLite cannot create the `-wal` and `-shm` files in. A WAL that ends in a
/// partial frame (a copy or a disk cut short: its last transactions are lost) is logged.
fn check_files(path: &Path) -> Result<()> {
    let setup = |reason: String| Error::Setup {
        path: path.to_path_buf(),
        reason,
    };
    if path.is_dir() {
        return Err(setup(
            "it is a directory; store.path names the database file (e.g. \
             .../ostler.db)"
                .to_owned(),
        ));
    }
    let wal = companion(path, "-wal");
    let db_len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    if db_len == 0 && wal_len > 0 {
        return Err(setup(format!(
            "the database file is {} but its WAL {} holds {wal_len} bytes: opening would \
             start an empty store and delete that WAL, with every event in it. Restore the \
             database file from a backup (or copy), or move the WAL away to start empty",
            if path.exists() { "empty" } else { "missing" },
            wal.display()
        )));
    }
    let mut header = [0u8; 32];
    if wal_len > 32
        && std::fs::File::open(&wal)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header))
            .is_ok()
    {
        let page = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as u64;
        if page >= 512 && !(wal_len - 32).is_multiple_of(page + 24) {
            tracing::warn!(
                path = %wal.display(),
                bytes = wal_len,
                "the store's WAL ends in a partial frame: it was cut short (a crash while \
                 writing, a copy or a disk that ran out); transactions in its last frames \
                 are lost"
            );
        }
    }
    // A database file cut short or overwritten beside a WAL with data: opening would
    // checkpoint the WAL into it at the first close and delete the WAL, whatever else fails.
    if wal_len > 0 && db_len > 0 {
        let mut db_header = [0u8; 100];
        let read = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut db_header));
        let page = match u16::from_be_bytes([db_header[16], db_header[17]]) {
            1 => 65536,
            p => u64::from(p),
        };
        let sound = read.is_ok()
            && db_header.starts_with(b"SQLite format 3\0")
            && (512..=65536).contains(&page)
            && page.is_power_of_two()
            && db_len.is_multiple_of(page);
        if !sound {
            return Err(setup(format!(
                "the database file is damaged ({db_len} bytes, {}) and its WAL {} holds \
                 {wal_len} bytes: opening would merge that WAL into the damaged file and \
                 delete it. Restore the database file from a backup (or copy) and keep the \
                 WAL beside it, or move both away to start empty",
                if db_header.starts_with(b"SQLite format 3\0") {
                    "not a whole number of pages"
                } else {
                    "no SQLite header"
                },
                wal.display()
            )));
        }
    }
    if wal_len == 0
        && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_err()
        && path.exists()
    {
        return Err(setup(format!(
            "its directory {} cannot be written: SQLite creates the store's -wal and -shm \
             files beside it (permissions or a read-only mount)",
            dir.display()
        )));
    }
    Ok(())
}

/// What [`crate::Store::inspect`] found: the schema version of an existing store (`None`:
/// no file yet, the daemon will create it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    pub version: Option<u32>,
}

/// The checks of [`open_write_connection`] that need no write: the files
/// ([`check_files`]), a database that can be read, is ostler's (or empty), is not newer
/// than this build, and can be written. Opens the file read-only (a stopped store as
/// immutable) and creates nothing.
pub(crate) fn inspect(path: &Path) -> Result<Inspection> {
    check_files(path)?;
    if !path.exists() {
        return Ok(Inspection { version: None });
    }
    let setup = |reason: &str| Error::Setup {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    if nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_err() {
        return Err(setup(READ_ONLY_FILE));
    }
    let oe = |e| open_error(path, e);
    // Without a WAL beside it (no daemon on it, a clean stop), read as immutable: a plain
    // read-only open of a WAL-mode file would create its `-wal` and `-shm`.
    let conn = if companion(path, "-wal").exists() {
        Connection::open_with_flags(path, open_flags_ro())
    } else {
        let mut uri = String::from("file:");
        for c in path.to_string_lossy().chars() {
            match c {
                '%' => uri.push_str("%25"),
                '?' => uri.push_str("%3f"),
                '#' => uri.push_str("%23"),
                c => uri.push(c),
            }
        }
        uri.push_str("?immutable=1");
        Connection::open_with_flags(uri, open_flags_ro())
    }
    .map_err(oe)?;
    ostler_tables(&conn, path)?;
    let version = crate::migrate::current_version(&conn).map_err(oe)?;
    if version > crate::SCHEMA_VERSION {
        return Err(Error::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: crate::SCHEMA_VERSION,
        });
    }
    Ok(Inspection {
        version: Some(version),
    })
}

/// Creates the database file, when there is none, readable and writable by its owner
/// only (0600, whatever the umask): it holds every conversation and the secrets sessions
/// are resumed with (MCP headers and env, session env). SQLite gives the `-wal` and
/// `-shm` files it creates the database file's permissions.
fn create_private(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Already there (kept as it is), or not ours to create (a directory missing, no
    // permission): SQLite's open says so better.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
}

/// Opens and configures the write connection (WAL, synchronous, busy timeout, foreign keys,
/// incremental auto-vacuum for new files). Does not migrate.
pub(crate) fn open_write_connection(path: &Path, opts: &StoreOptions) -> Result<Connection> {
    let oe = |e| open_error(path, e);
    check_files(path)?;
    // The WAL and its index left by the last run must be writable too: SQLite would open
    // the store and fail at the first write (or at the first read of a frame).
    for suffix in ["-wal", "-shm"] {
        let companion = companion(path, suffix);
        if companion.exists()
            && let Err(e) = std::fs::OpenOptions::new().write(true).open(&companion)
        {
            return Err(Error::Setup {
                path: path.to_path_buf(),
                reason: format!(
                    "its {suffix} file {} cannot be written ({e}): its permissions, an \
                     immutable attribute or a read-only mount; ostler writes every event \
                     through it",
                    companion.display()
                ),
            });
        }
    }
    create_private(path);
    let conn = Connection::open_with_flags(path, open_flags_rw()).map_err(oe)?;
    // Until the store is open (`Store::open` turns it back on), closing this connection
    // does not checkpoint: a store refused below keeps its WAL as it found it.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .map_err(oe)?;
    // SQLite opens a file it may not write read-only without a word; every write would then
    // fail (and be retried as a passing fault). Said at once instead.
    if conn.is_readonly(rusqlite::MAIN_DB).map_err(oe)? {
        return Err(Error::Setup {
            path: path.to_path_buf(),
            reason: READ_ONLY_FILE.to_owned(),
        });
    }
    conn.busy_timeout(opts.busy_timeout).map_err(oe)?;
    // The writer reuses a couple of dozen statements; keep all of them prepared.
    conn.set_prepared_statement_cache_capacity(64);
    register_delta_function(&conn).map_err(oe)?;
    let tables = ostler_tables(&conn, path)?;
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
    // When the WAL restarts, truncate it to its hard bound if it grew past (e.g. while a long
    // read pinned an old snapshot) instead of keeping its high-water size forever.
    let page_size: i64 = conn
        .pragma_query_value(None, "page_size", |r| r.get(0))
        .map_err(oe)?;
    conn.pragma_update(None, "journal_size_limit", wal_bound_bytes(page_size))
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

/// `ostler_delta(payload, raw)`: the payload as a delta against the raw line (see
/// `codec.rs`), or NULL when that would not be smaller; used by migration 0003.
fn register_delta_function(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    use rusqlite::types::{Value, ValueRef};
    conn.create_scalar_function(
        "ostler_delta",
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            fn bytes(v: ValueRef<'_>) -> Option<&[u8]> {
                match v {
                    ValueRef::Blob(b) | ValueRef::Text(b) => Some(b),
                    _ => None,
                }
            }
            let delta = bytes(ctx.get_raw(0))
                .and_then(|payload| crate::codec::encode(payload, bytes(ctx.get_raw(1))).1);
            Ok(delta.map_or(Value::Null, Value::Blob))
        },
    )
}

/// The WAL file's size at the writer's hard bound (`WAL_HARD_LIMIT_FRAMES` frames of
/// `page_size` bytes plus their 24-byte headers, and the 32-byte file header).
pub(crate) fn wal_bound_bytes(page_size: i64) -> i64 {
    let frames = i64::try_from(crate::writer::WAL_HARD_LIMIT_FRAMES).unwrap_or(i64::MAX);
    frames
        .saturating_mul(page_size.saturating_add(24))
        .saturating_add(32)
}
