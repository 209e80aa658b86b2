//! Reading `/proc` for what the tests assert about killed process groups (shared by
//! `common` and `session_fake.rs`, which does not use the rest of `common`).

/// Whether a process in the process group `pgid` lives on unkilled: scans `/proc`. A
/// zombie does not count (signal 0 to the group is not enough: it also "reaches" zombies
/// that were killed and wait for init to reap them), nor does a process that is exiting or
/// has SIGKILL pending. `killpg(SIGKILL)` leaves every member of the group in one of those
/// states when it returns, but a member reaches the zombie state only once it is scheduled:
/// on a busy machine that can come after the leader's exit was seen (it failed a run so).
pub fn group_alive(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp session tty_nr tpgid flags ...; comm may contain
        // spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return false;
        };
        let mut f = after.split_whitespace();
        let state = f.next();
        let pgrp = f.nth(1).and_then(|p| p.parse::<u32>().ok());
        let flags = f.nth(3).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0);
        const PF_EXITING: u64 = 0x4;
        pgrp == Some(pgid)
            && state != Some("Z")
            && flags & PF_EXITING == 0
            && !sigkill_pending(&e.path())
    })
}

/// Whether SIGKILL is pending for the process (`SigPnd`/`ShdPnd` in its status: bit 8).
fn sigkill_pending(proc_dir: &std::path::Path) -> bool {
    let Ok(status) = std::fs::read_to_string(proc_dir.join("status")) else {
        return true; // gone between the two reads
    };
    status.lines().any(|l| {
        (l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
            && l.split(':')
                .nth(1)
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                .is_some_and(|m| m & (1 << 8) != 0)
    })
}
