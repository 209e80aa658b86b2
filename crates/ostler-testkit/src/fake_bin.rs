//! Where a test finds the `ostler-fake-claude` binary: next to the test's own binary
//! (`target/<profile>/`), built by any workspace build; built here when a run of one crate's
//! tests left it out.

use std::path::{Path, PathBuf};

/// The `ostler-fake-claude` binary of the running test's target directory, built with
/// `cargo build -p ostler-testkit --bin ostler-fake-claude` when missing (blocking; call it
/// through `spawn_blocking` from async code that must not block).
pub fn fake_claude_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/ostler-fake-claude
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} has no target directory", exe.display()))?;
    let path = dir.join("ostler-fake-claude");
    if path.is_file() {
        return Ok(path);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "-p",
            "ostler-testkit",
            "--bin",
            "ostler-fake-claude",
        ])
        .current_dir(crate::workspace_root())
        .status()
        .map_err(|e| format!("running cargo build: {e}"))?;
    if !status.success() || !path.is_file() {
        return Err(format!(
            "cargo build -p ostler-testkit --bin ostler-fake-claude did not produce {}",
            path.display()
        ));
    }
    Ok(path)
}
