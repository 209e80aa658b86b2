//! Schema migrations: `migrations/NNNN_name.sql` at the repository root, embedded at build
//! time and applied in order when a database is opened. The applied version is the
//! database's `PRAGMA user_version`, updated in the same transaction as each migration, so a
//! crash mid-migration leaves the previous version intact.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{Error, Result};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The version the database has once this migration is applied (1, 2, 3, ...).
    pub version: u32,
    /// The file name, e.g. `0001_initial.sql`.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../migrations/", $name)),
        }
    };
}

/// Every migration, in order. Version `i + 1` is at index `i`.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_initial.sql"),
    migration!(2, "0002_usage.sql"),
];

/// The schema version this build writes (the last migration's version).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Reads the database's schema version.
pub(crate) fn current_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.pragma_query_value(None, "user_version", |row| row.get::<_, u32>(0))
}

/// Brings the database at `path` (open on `conn`) up to `target`, one transaction per
/// migration. Refuses databases newer than this build.
pub(crate) fn migrate_to(conn: &mut Connection, path: &Path, target: u32) -> Result<()> {
    let at = |e: rusqlite::Error| Error::sqlite_at(path, e);
    let found = current_version(conn).map_err(at)?;
    if found > SCHEMA_VERSION {
        return Err(Error::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version > found && m.version <= target)
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(at)?;
        // Another process may have migrated while we waited for the write lock.
        if current_version(&tx).map_err(at)? >= m.version {
            continue;
        }
        tx.execute_batch(m.sql).map_err(|e| {
            tracing::error!(migration = m.name, error = %e, "migration failed");
            at(e)
        })?;
        tx.pragma_update(None, "user_version", m.version)
            .map_err(at)?;
        tx.commit().map_err(at)?;
        tracing::info!(path = %path.display(), migration = m.name, "applied schema migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `migrations/*.sql` file is embedded, in order, with contiguous versions that
    /// match the file name prefix.
    #[test]
    fn every_migration_file_is_embedded_in_order() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("migrations dir")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
        assert_eq!(files, embedded);
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
            let prefix: u32 = m.name[..4].parse().expect("NNNN_ prefix");
            assert_eq!(prefix, m.version, "{}", m.name);
            assert_eq!(&m.name[4..5], "_", "{}", m.name);
        }
    }
}
