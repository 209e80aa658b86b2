//! A small file that remembers what [`crate::discover()`] measured on a binary, so a
//! daemon restart does not run `claude --version` (about 1.8 s of CPU on the node-based
//! releases) and the flag probe again.
//!
//! The file (JSON, 0600, written atomically: temp file + rename) holds a header and a few
//! entries, one per binary. An entry is used only while its key still describes the binary:
//! canonical path (symlinks followed), device, inode, size, mtime and ctime (ns), so an
//! upgrade in place, a rewrite or a `touch` measures again. The header carries the file
//! format, ostler's version and the list of probed flags: a file written by another ostler
//! (which may probe other flags) is ignored whole. Nothing here is an error to the caller: a
//! missing, unreadable, corrupt or foreign file is logged and ignored, a file that cannot
//! be written is logged.
//!
//! What the key cannot see: a wrapper script whose target changes (a version manager's
//! shim), or a node-based release whose `node` is replaced. Operators with such set-ups
//! turn the cache off (`claude.discovery_cache = false`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::compat::{Flag, FlagProbe};
use ostler_protocol::version::ClaudeVersion;

/// The cache's file name in the daemon's data directory (next to the store).
pub const FILE_NAME: &str = "claude-discovery.json";

/// Bumped when the file's shape or meaning changes.
const FORMAT: u32 = 1;
/// Entries kept (most recent first): one per binary a daemon on this data dir ran with.
const MAX_ENTRIES: usize = 8;

/// What identifies one state of a binary on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BinaryKey {
    path: PathBuf,
    dev: u64,
    inode: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl BinaryKey {
    /// The key of the file `path` names now (symlinks followed); `None` when it cannot be
    /// read (the run that follows will say why).
    pub(crate) fn of(path: &Path) -> Option<BinaryKey> {
        use std::os::unix::fs::MetadataExt as _;
        let canonical = std::fs::canonicalize(path).ok()?;
        let m = std::fs::metadata(&canonical).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(BinaryKey {
            path: canonical,
            dev: m.dev(),
            inode: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

/// `claude --version` as parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CachedVersion {
    version: semver::Version,
    api_date: Option<String>,
    label: Option<String>,
}

/// What was measured on one binary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    key: BinaryKey,
    version: CachedVersion,
    /// `None`: not probed (probing was off, or the probe failed).
    probe: Option<FlagProbe>,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    format: u32,
    ostler: String,
    flags: Vec<Flag>,
    entries: Vec<Entry>,
}

impl File {
    fn new() -> File {
        File {
            format: FORMAT,
            ostler: env!("CARGO_PKG_VERSION").to_owned(),
            flags: Flag::ALL.to_vec(),
            entries: Vec::new(),
        }
    }

    fn is_current(&self) -> bool {
        let fresh = File::new();
        self.format == fresh.format && self.ostler == fresh.ostler && self.flags == fresh.flags
    }
}

/// What the cache knows of one binary.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hit {
    pub(crate) version: Option<ClaudeVersion>,
    pub(crate) probe: Option<FlagProbe>,
}

/// The entries of the file at `path`, when it is readable and current (else logged, empty).
fn read(path: &Path) -> Vec<Entry> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(cache = %path.display(), "no discovery cache yet");
            return Vec::new();
        }
        Err(e) => {
            tracing::warn!(cache = %path.display(), error = %e, "discovery cache unreadable; ignored");
            return Vec::new();
        }
    };
    match serde_json::from_str::<File>(&text) {
        Ok(f) if f.is_current() => f.entries,
        Ok(f) => {
            tracing::info!(
                cache = %path.display(),
                format = f.format,
                written_by = f.ostler,
                "discovery cache written by another ostler; ignored"
            );
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(cache = %path.display(), error = %e, "discovery cache corrupt; ignored");
            Vec::new()
        }
    }
}

/// What the cache at `path` holds for the binary `key` describes.
pub(crate) fn lookup(path: &Path, key: &BinaryKey) -> Hit {
    let entries = read(path);
    if let Some(stale) = entries
        .iter()
        .find(|e| e.key.path == key.path && &e.key != key)
    {
        tracing::debug!(cache = %path.display(), cached = ?stale.key, now = ?key, "the binary changed since it was cached");
    }
    match entries.into_iter().find(|e| &e.key == key) {
        Some(e) => Hit {
            version: Some(ClaudeVersion {
                version: e.version.version,
                api_date: e.version.api_date,
                label: e.version.label,
            }),
            probe: e.probe,
        },
        None => Hit::default(),
    }
}

/// Remember `version` and `probe` for `key` in the cache at `path` (failures logged). The
/// directory is made (0700) when missing: it is the daemon's data directory.
pub(crate) fn store(
    path: &Path,
    key: BinaryKey,
    version: &ClaudeVersion,
    probe: Option<FlagProbe>,
) {
    if let Err(e) = write(path, key, version, probe) {
        tracing::warn!(cache = %path.display(), error = %e, "cannot write the discovery cache");
    }
}

fn write(
    path: &Path,
    key: BinaryKey,
    version: &ClaudeVersion,
    probe: Option<FlagProbe>,
) -> std::io::Result<()> {
    let mut file = File::new();
    let others: Vec<Entry> = read(path)
        .into_iter()
        .filter(|e| e.key.path != key.path)
        .collect();
    file.entries.push(Entry {
        key,
        version: CachedVersion {
            version: version.version.clone(),
            api_date: version.api_date.clone(),
            label: version.label.clone(),
        },
        probe,
    });
    file.entries
        .extend(others.into_iter().take(MAX_ENTRIES - 1));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let text = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
    // A temp file in the same directory is 0600 and renamed over the old file: a reader
    // (another daemon starting) sees the old file or the new one, never half of one.
    let mut tmp = tempfile::Builder::new()
        .prefix(".discovery-")
        .tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, &text)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
