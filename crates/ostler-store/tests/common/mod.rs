#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ostler_store::{NewEvent, NewSession, SessionState, Store, StoreOptions};

pub fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ostler.db")
}

pub fn open(path: &Path) -> Store {
    Store::open(path, StoreOptions::default()).expect("open store")
}

pub fn new_session(id: &str, created_ms: i64) -> NewSession {
    NewSession {
        id: id.to_owned(),
        claude_session_id: None,
        cwd: "/work/project".to_owned(),
        model: Some("claude-sonnet-4-5".to_owned()),
        permission_mode: Some("default".to_owned()),
        cli_release: Some("2.1.0".to_owned()),
        state: SessionState::Running,
        labels: BTreeMap::new(),
        created_ms,
    }
}

pub fn event(n: u64) -> NewEvent {
    NewEvent::new(
        "assistant_block",
        format!("{{\"n\":{n}}}").into_bytes(),
        n as i64,
    )
    .with_raw(format!("{{\"type\":\"assistant\",\"n\":{n}}}").into_bytes())
}
