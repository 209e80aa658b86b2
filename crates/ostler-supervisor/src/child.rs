//! Starting and signalling child processes: what discovery's short helper runs and the
//! session processes share.

use std::time::Duration;

use nix::sys::signal::Signal;

/// `cmd.spawn()`, retried a few times on `ETXTBSY`: exec fails while any process holds the
/// binary open for writing, which happens transiently when it is being installed or
/// replaced (npm update) or, for a freshly written script, while another thread's fork
/// still holds the writer's descriptor.
pub(crate) async fn spawn_retrying(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut attempt = 0u64;
    loop {
        match crate::proctree::spawn_registered(cmd) {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(10 * attempt)).await;
            }
            r => return r,
        }
    }
}

/// Send `sig` to the process group led by `pid`; a group that is already gone is fine.
pub(crate) fn signal_group(pid: u32, sig: Signal) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 {
        return;
    }
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), sig);
}
