//! Process trees: every process a session started ends with the session.
//!
//! A session's CLI runs in its own process group, but the tools it starts may leave it:
//! `setsid`, a daemonising double fork, a shell that puts a job in its own group. Such a
//! process survives `killpg` of the CLI's group and, when its parent dies, is reparented.
//! Three mechanisms together find them:
//!
//! - **A mark in the environment.** Every session process is spawned with
//!   [`MARK_VAR`]`=<tag>/<spawn id>`; children inherit the environment, so every descendant
//!   carries it unless it clears its environment on purpose. `/proc/<pid>/environ` shows it
//!   to a process of the same user. The tag names the daemon's store, so a daemon restarted
//!   after `kill -9` finds the leftovers of its previous life ([`kill_marked`] with the tag
//!   prefix) — and never a process that merely reuses a recorded pid: a reused pid does not
//!   carry the mark.
//! - **The group and the descendants** of the session's leader while it lives (ppid links
//!   read from `/proc/<pid>/stat`), for processes that cleared their environment.
//! - **The daemon as child subreaper** ([`become_subreaper`]): orphans of a session are
//!   reparented to the daemon instead of init, so they stay visible as the daemon's
//!   children, and [`reap_adopted`] collects those that exit so no zombie accumulates.
//!
//! What a scan reads: with the daemon as subreaper, the search for one session's processes
//! reads the daemon's own tree only ([`own_tree`]: the session's CLI and the orphans the
//! daemon adopted, not the other sessions' trees), and the reaper reads the daemon's own
//! children; with 100 sessions that is ~300 times less than reading every process
//! (docs/performance.md, session 24). The search by tag at start reads every process.
//!
//! Every kill re-reads the process's start time first: a pid that was reused between the
//! scan and the signal is left alone.
//!
//! Processes the supervisor spawns itself are registered ([`spawn_registered`]) while
//! tokio owns their exit status; [`reap_adopted`] never waits for those.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// The environment variable that marks every process of a session.
pub const MARK_VAR: &str = "OSTLER_PROCESS_TREE";

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub ppid: u32,
    pub pgid: u32,
    pub sid: u32,
    /// Process state letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Start time in clock ticks after boot: with the pid, the process's identity.
    pub start_ticks: u64,
    /// A kernel thread (`PF_KTHREAD` in the flags field): no memory map, no environment.
    pub kernel: bool,
    /// Where the environment lies in the process's memory (`env_start`, `env_end`);
    /// `(0, 0)` when not shown (another user's process, whose environment cannot be read
    /// either; a kernel thread; seen too in the middle of an exec). An exec moves it (the
    /// stack is placed at random), so two equal readings around a read of `environ` show
    /// that the read saw one whole environment.
    pub env_span: (u64, u64),
}

/// `PF_KTHREAD` (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

impl ProcStat {
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// Parse the text of `/proc/<pid>/stat`. The command name (field 2) is in parentheses and
/// may itself contain spaces and parentheses: fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let (head, rest) = text.rsplit_once(')')?;
    let pid: u32 = head.split_once('(')?.0.trim().parse().ok()?;
    // rest: " S ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
    //        stime cutime cstime priority nice num_threads itrealvalue starttime ...
    //        arg_start arg_end env_start env_end exit_code" (proc_pid_stat(5): f[i] is
    //        field i + 3)
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let state = f.first()?.chars().next()?;
    let num = |i: usize| -> Option<u64> { f.get(i)?.parse().ok() };
    Some(ProcStat {
        pid,
        state,
        ppid: u32::try_from(num(1)?).ok()?,
        pgid: u32::try_from(num(2)?).ok()?,
        sid: u32::try_from(num(3)?).ok()?,
        start_ticks: num(19)?,
        kernel: num(6)? & PF_KTHREAD != 0,
        env_span: (num(47).unwrap_or(0), num(48).unwrap_or(0)),
    })
}

/// `/proc/<pid>/stat` of a process, `None` when it is gone or unreadable.
pub fn stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Which marks to look for.
#[derive(Debug, Clone, Copy)]
pub enum Mark<'a> {
    /// Exactly this mark (one spawn of one session).
    Exact(&'a str),
    /// Every mark under this tag (`<tag>/...`): all sessions of one daemon's store.
    Tag(&'a str),
}

/// Whether the NUL-separated environment block `environ` carries the mark. Only
/// NUL-terminated entries count: a read that stopped short may end in the middle of one
/// (`tag/s1` cut from `tag/s17`).
pub fn environ_has_mark(environ: &[u8], mark: Mark<'_>) -> bool {
    let prefix = MARK_VAR.len() + 1;
    let Some(end) = environ.iter().rposition(|b| *b == 0) else {
        return false;
    };
    environ[..end].split(|b| *b == 0).any(|entry| {
        if entry.len() <= prefix
            || !entry.starts_with(MARK_VAR.as_bytes())
            || entry[MARK_VAR.len()] != b'='
        {
            return false;
        }
        let value = &entry[prefix..];
        match mark {
            Mark::Exact(m) => value == m.as_bytes(),
            Mark::Tag(t) => {
                value.len() > t.len() && value.starts_with(t.as_bytes()) && value[t.len()] == b'/'
            }
        }
    })
}

/// What `/proc/<pid>/environ` says about a process's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MarkRead {
    Marked,
    Unmarked,
    /// The process was caught in the middle of an `execve`, so the read proves nothing.
    /// From the moment the new memory map is in place until the kernel has written the
    /// arguments and environment into it, `environ` reads empty; a read of the old map as
    /// it is torn down stops short. A process spawned with `vfork` semantics
    /// (`posix_spawn`) lets its parent go on in exactly that window. Ask again.
    Unsure,
}

/// Read the mark of `p` (live, no kernel thread; `p` read from `/proc/<pid>/stat` just
/// before). The read counts only if the environment's place is the same before and after
/// it and the bytes read fill it; an empty environment counts as unsure too (the moment
/// inside an exec cannot be told apart from a process that cleared its environment:
/// [`settle`] tells them apart by asking again).
fn read_mark(p: &ProcStat, mark: Mark<'_>) -> MarkRead {
    let Ok(env) = std::fs::read(format!("/proc/{}/environ", p.pid)) else {
        return MarkRead::Unmarked; // gone, or not ours to read
    };
    if env.is_empty() {
        return MarkRead::Unsure;
    }
    if environ_has_mark(&env, mark) {
        return MarkRead::Marked; // the mark was in this process's memory: it is ours
    }
    let (start, end) = p.env_span;
    // A span of (0, 0) next to a readable environment: caught as the memory map changed.
    let whole = start != 0
        && end.checked_sub(start) == Some(env.len() as u64)
        && stat(p.pid)
            .is_some_and(|now| now.start_ticks == p.start_ticks && now.env_span == p.env_span);
    if whole {
        MarkRead::Unmarked
    } else {
        MarkRead::Unsure
    }
}

/// Every process on the system (`/proc` snapshot; vanished ones are skipped).
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir(Path::new("/proc")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let pid: u32 = name.to_str()?.parse().ok()?;
        stat(pid)
    })
    .collect()
}

/// The pids that `/proc/<pid>/task/<tid>/children` lists for the threads of `pid` (a child
/// is listed under the thread that is its parent), or `None` when no thread's list can be
/// read: the process is gone, or the kernel was built without `CONFIG_PROC_CHILDREN`.
fn children_of(pid: u32) -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut read = false;
    for task in tasks.flatten() {
        // A thread that ended since the directory was read has no list: skipped.
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            read = true;
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    read.then_some(out)
}

/// The processes a scan for one session's members has to look at, when this process is
/// the child subreaper ([`become_subreaper`]): then every process a session started is a
/// descendant of this process, since an orphan is reparented to its nearest living
/// subreaper ancestor. Of that tree, only the subtrees of `leader` and of the children this
/// process did not spawn itself (adopted orphans) can hold the session's processes; the
/// other registered children are other sessions' CLIs, whose descendants are theirs. So a
/// session's end reads the processes of its own tree and of the orphans, not those of the
/// whole system or of the other sessions.
///
/// The walk reads parents before children. A process reparented to this process in the
/// middle of the walk (its parent read just after it left, this process's list just before
/// it arrived) is caught by reading this process's children again until no new one
/// appears, at most [`OWN_TREE_PASSES`] times (orphans that keep coming, a fork loop,
/// are left to the next scan, as a scan of every process leaves the processes started
/// while it reads). `None` (scan everything instead) when this process is no subreaper or
/// the kernel lists no children.
pub fn own_tree(leader: Option<u32>) -> Option<Vec<ProcStat>> {
    if !ADOPTING.load(std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    let me = std::process::id();
    let mut seen: HashSet<u32> = HashSet::new();
    let mut out = Vec::new();
    for _ in 0..OWN_TREE_PASSES {
        let kids = children_of(me)?;
        let mut stack: Vec<u32> = {
            let reg = registry();
            kids.into_iter()
                .filter(|k| !seen.contains(k) && (Some(*k) == leader || !reg.contains(k)))
                .collect()
        };
        if stack.is_empty() {
            return Some(out);
        }
        while let Some(pid) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            let Some(p) = stat(pid) else { continue };
            out.push(p);
            if !p.is_zombie() {
                stack.extend(children_of(pid).unwrap_or_default());
            }
        }
    }
    Some(out)
}

/// How often [`own_tree`] reads this process's children for orphans adopted while it
/// walked.
const OWN_TREE_PASSES: usize = 8;

/// The processes that belong to a session: those carrying `mark`, the members of the
/// process group led by `leader`, and every descendant of either (by ppid). The calling
/// process is never included. A process caught in the middle of an exec is asked again
/// until its mark can be read ([`settle`]). For one session ([`Mark::Exact`]) only this
/// process's own tree is read when it can be ([`own_tree`]); otherwise every process.
pub fn members(mark: Mark<'_>, leader: Option<u32>) -> Vec<ProcStat> {
    const RESCANS: usize = 8;
    let (mut found, mut unsure) = scan(mark, leader);
    for _ in 0..RESCANS {
        if !settle(&unsure, mark) {
            break;
        }
        (found, unsure) = scan(mark, leader);
    }
    found
}

/// [`members`], and the processes that were caught mid-exec ([`MarkRead::Unsure`]).
fn scan(mark: Mark<'_>, leader: Option<u32>) -> (Vec<ProcStat>, Vec<ProcStat>) {
    let me = std::process::id();
    let all = match mark {
        Mark::Exact(_) => own_tree(leader).unwrap_or_else(all_processes),
        Mark::Tag(_) => all_processes(),
    };
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, p) in all.iter().enumerate() {
        children.entry(p.ppid).or_default().push(i);
    }
    let mut picked: HashSet<usize> = HashSet::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut unsure = Vec::new();
    for (i, p) in all.iter().enumerate() {
        if p.pid == me {
            continue;
        }
        let in_group = leader.is_some_and(|l| p.pgid == l || p.pid == l);
        let marked = !in_group
            && !p.is_zombie()
            && !p.kernel
            && match read_mark(p, mark) {
                MarkRead::Marked => true,
                MarkRead::Unmarked => false,
                MarkRead::Unsure => {
                    unsure.push(*p);
                    false
                }
            };
        if in_group || marked {
            stack.push(i);
        }
    }
    while let Some(i) = stack.pop() {
        if !picked.insert(i) {
            continue;
        }
        if let Some(kids) = children.get(&all[i].pid) {
            stack.extend(kids.iter().copied().filter(|k| all[*k].pid != me));
        }
    }
    let mut out: Vec<ProcStat> = picked.into_iter().map(|i| all[i]).collect();
    out.sort_by_key(|p| p.pid);
    (out, unsure)
}

/// SIGKILL `p` if the pid still names the same process (same start time).
fn kill_if_same(p: &ProcStat) -> bool {
    let Ok(raw) = i32::try_from(p.pid) else {
        return false;
    };
    if raw <= 1 {
        return false;
    }
    match stat(p.pid) {
        Some(now) if now.start_ticks == p.start_ticks && !now.is_zombie() => {
            kill(Pid::from_raw(raw), Signal::SIGKILL).is_ok()
        }
        _ => false,
    }
}

/// End every process of a session ([`members`]), repeating while new ones appear (a
/// process may fork while its siblings are being killed). Returns how many were
/// signalled.
/// `leader` itself is signalled too but never reaped here (its parent, tokio, reaps it).
pub fn kill_tree(mark: Mark<'_>, leader: Option<u32>) -> usize {
    const ROUNDS: usize = 8;
    let mut killed = 0;
    for _ in 0..ROUNDS {
        let live: Vec<ProcStat> = members(mark, leader)
            .into_iter()
            .filter(|p| !p.is_zombie())
            .collect();
        if live.is_empty() {
            break;
        }
        for p in &live {
            if kill_if_same(p) {
                killed += 1;
            }
        }
    }
    if killed > 0 {
        reap_adopted();
    }
    killed
}

/// Ask the processes caught mid-exec again until each answer is sure or the process is
/// gone; true if one of them turns out marked (then scan again: its descendants count
/// too). They are asked in turns, so a process that really has no environment (it reads
/// empty every time) keeps none of the others from being asked.
///
/// The end of an exec is no event this process can wait for, so between turns it sleeps
/// a little (from 100 µs, doubling up to 5 ms), which leaves the core to the exec'ing
/// process (spinning with `yield` starved it when two scans ran at once on two cores). An
/// exec takes about a millisecond; after [`SETTLE_FOR`] in all, what still reads empty has
/// no environment, so no mark.
fn settle(unsure: &[ProcStat], mark: Mark<'_>) -> bool {
    let deadline = std::time::Instant::now() + SETTLE_FOR;
    let mut pause = std::time::Duration::from_micros(100);
    let mut pending: Vec<ProcStat> = unsure.to_vec();
    while !pending.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(5));
        let mut marked = false;
        pending.retain(|p| {
            let now = match stat(p.pid) {
                Some(now) if now.start_ticks == p.start_ticks && !now.is_zombie() => now,
                _ => return false, // gone, or the pid names another process now
            };
            match read_mark(&now, mark) {
                MarkRead::Marked => {
                    marked = true;
                    false
                }
                MarkRead::Unmarked => false,
                MarkRead::Unsure => true,
            }
        });
        if marked {
            return true;
        }
    }
    false
}

/// How long [`settle`] asks in all: far longer than an exec, even on a busy machine, and
/// short enough that a process without any environment (rare: `env -i`) delays a
/// session's cleanup little.
const SETTLE_FOR: std::time::Duration = std::time::Duration::from_millis(200);

/// End the processes of every session under `tag` (the leftovers of a previous life of the
/// daemon that owns `tag`). Returns how many were signalled.
pub fn kill_marked(tag: &str) -> usize {
    kill_tree(Mark::Tag(tag), None)
}

/// Make this process the child subreaper of its descendants (Linux `PR_SET_CHILD_SUBREAPER`):
/// orphaned descendants are reparented to it instead of init.
/// From then on [`reap_adopted`] reaps: a process that is no subreaper has no adopted
/// children, and its other children (spawned by code other than the supervisor) are not ours
/// to reap.
pub fn become_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
    ADOPTING.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// Set by [`become_subreaper`].
static ADOPTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn registry() -> MutexGuard<'static, HashSet<u32>> {
    static SPAWNED: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    SPAWNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Spawn `cmd` and register the child as one whose exit status tokio collects, so that
/// [`reap_adopted`] leaves it alone. The registry lock is held across the `fork` so the
/// reaper can never see the child unregistered.
pub(crate) fn spawn_registered(
    cmd: &mut tokio::process::Command,
) -> io::Result<tokio::process::Child> {
    let mut reg = registry();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        reg.insert(pid);
    }
    Ok(child)
}

/// The child `pid` was waited for by its owner: forget it.
pub(crate) fn unregister(pid: u32) {
    registry().remove(&pid);
}

/// Reap the exited children of this process that the supervisor did not spawn itself:
/// orphans reparented to the daemon (as child subreaper). Returns how many were reaped.
/// Does nothing unless [`become_subreaper`] succeeded.
pub fn reap_adopted() -> usize {
    if !ADOPTING.load(std::sync::atomic::Ordering::SeqCst) {
        return 0;
    }
    let me = std::process::id();
    let reg = registry();
    // This process's children as the kernel lists them, those the supervisor spawned left
    // out before reading anything of them; or (without that list) every process.
    let children: Vec<ProcStat> = match children_of(me) {
        Some(pids) => pids
            .into_iter()
            .filter(|pid| !reg.contains(pid))
            .filter_map(stat)
            .collect(),
        None => all_processes(),
    };
    let mut reaped = 0;
    for p in children {
        if p.ppid != me || !p.is_zombie() || reg.contains(&p.pid) {
            continue;
        }
        let Ok(raw) = i32::try_from(p.pid) else {
            continue;
        };
        if let Ok(status) = waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG))
            && status.pid().is_some()
        {
            reaped += 1;
        }
    }
    reaped
}

/// Wait until the process `pid` has terminated (exited or killed; it may still be an
/// unreaped zombie), as an event: a pidfd becomes readable when its process terminates.
/// Returns at once when there is no such process.
pub async fn wait_terminated(pid: u32) -> io::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let raw = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    #[allow(unsafe_code)]
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new file descriptor or -1;
    // it touches no memory of ours. A non-negative result is a descriptor we now own
    // exclusively, so wrapping it in `OwnedFd` (closed on drop) is sound.
    let fd = unsafe {
        let r = libc::syscall(libc::SYS_pidfd_open, raw, 0);
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ESRCH) {
                Ok(())
            } else {
                Err(e)
            };
        }
        OwnedFd::from_raw_fd(i32::try_from(r).map_err(|_| io::Error::other("pidfd out of range"))?)
    };
    #[allow(unsafe_code)]
    // SAFETY: `fd` is an `OwnedFd` moved into the `AsyncFd`, which neither replaces nor
    // closes it while registered (it is closed when the `AsyncFd` drops).
    let afd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)?
    };
    let _ready = afd.readable().await?;
    Ok(())
}

/// The tag of a daemon's sessions, derived from its store's path (a daemon restarted on the
/// same store gets the same tag; two daemons on two stores never share one). FNV-1a, so it
/// stays the same across builds of ostler.
pub fn tag_for(store: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in store.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("store-{h:016x}")
}

/// Reap adopted orphans whenever a child exits (`SIGCHLD`), for as long as the runtime runs.
/// Use with [`become_subreaper`].
pub fn spawn_reaper() -> io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigchld = signal(SignalKind::child())?;
    Ok(tokio::spawn(async move {
        while sigchld.recv().await.is_some() {
            let n = tokio::task::spawn_blocking(reap_adopted).await.unwrap_or(0);
            if n > 0 {
                tracing::debug!(reaped = n, "reaped adopted processes");
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parentheses_and_spaces_in_the_name() {
        let text = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100 18446744073709551615";
        let s = parse_stat(text).expect("parses");
        assert_eq!(s.pid, 4242);
        assert_eq!(s.state, 'S');
        assert_eq!((s.ppid, s.pgid, s.sid), (1, 4242, 4242));
        assert_eq!(s.start_ticks, 987654);
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("12 (x) S 1 2").is_none());
    }

    #[test]
    fn tags_are_stable_and_distinct() {
        let a = tag_for(Path::new("/var/lib/ostler/ostler.sqlite"));
        assert_eq!(a, tag_for(Path::new("/var/lib/ostler/ostler.sqlite")));
        assert_ne!(a, tag_for(Path::new("/var/lib/ostler/other.sqlite")));
        assert!(a.starts_with("store-") && !a.contains('/'));
    }

    #[test]
    fn own_stat_is_readable() {
        let s = stat(std::process::id()).expect("own stat");
        assert_eq!(s.pid, std::process::id());
        assert!(!s.is_zombie());
        assert!(!s.kernel);
        // The environment's place fits what `environ` reads.
        let env = std::fs::read("/proc/self/environ").expect("own environ");
        assert_eq!(s.env_span.1 - s.env_span.0, env.len() as u64);
    }

    #[test]
    fn marks_match_exactly_or_by_tag() {
        let env = b"PATH=/bin\0OSTLER_PROCESS_TREE=store1/s7\0HOME=/h\0";
        assert!(environ_has_mark(env, Mark::Exact("store1/s7")));
        assert!(!environ_has_mark(env, Mark::Exact("store1/s")));
        assert!(environ_has_mark(env, Mark::Tag("store1")));
        assert!(!environ_has_mark(env, Mark::Tag("store")));
        assert!(!environ_has_mark(
            b"OSTLER_PROCESS_TREEX=store1/s7\0",
            Mark::Tag("store1")
        ));
        assert!(!environ_has_mark(
            b"X=OSTLER_PROCESS_TREE=store1/s7\0",
            Mark::Tag("store1")
        ));
        assert!(!environ_has_mark(b"", Mark::Tag("store1")));
        // An entry cut short by the read's end is no mark.
        assert!(!environ_has_mark(
            b"PATH=/bin\0OSTLER_PROCESS_TREE=store1/s7",
            Mark::Exact("store1/s7")
        ));
    }
}
