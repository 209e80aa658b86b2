//! cgroup v2 containment of session process trees, when the daemon has a subtree it may
//! write to (systemd `Delegate=yes`, or a root daemon on a host with cgroup2 mounted).
//!
//! [`crate::proctree`] finds a session's processes by a mark in their environment, by
//! process group and by parent links. A tool that clears its environment *and* leaves the
//! group (`env -i setsid ...`) escapes all three once its parent has died. A cgroup cannot
//! be left: every descendant of a process is born in its cgroup and only a writer of the
//! cgroup tree can move it out. So, when cgroups are usable, each session process is
//! started in a cgroup of its own, `<daemon's cgroup>/ostler-<tag>/<mark>`:
//!
//! - the child moves itself into it between fork and exec (writing `0` to a
//!   `cgroup.procs` descriptor opened beforehand), so nothing it starts is ever outside;
//! - ending the session kills the cgroup (`cgroup.kill`, or SIGKILL to each member on
//!   kernels before 5.14) and removes it;
//! - a daemon restarted after `kill -9` kills every cgroup left under its `ostler-<tag>`
//!   directory before it serves. Membership is exact, so a reused pid is never hit.
//!
//! No controller is enabled: containment is all this is for (no limits), so the
//! "no internal processes" rule of cgroup v2 does not constrain where the daemon runs.
//! Failures to set it up are not fatal in `auto` mode: the other mechanisms still run.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where session cgroups go (`sessions.cgroup`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSetting {
    /// Not used.
    Off,
    /// Under the daemon's own cgroup v2 directory when it can be written; otherwise off.
    Auto,
    /// Under this cgroup v2 directory (an error if it cannot be used).
    At(PathBuf),
}

impl std::str::FromStr for CgroupSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            p if p.starts_with('/') => Ok(Self::At(PathBuf::from(p))),
            other => Err(format!(
                "`{}` is not `auto`, `off` or an absolute path of a cgroup v2 directory",
                other.chars().take(200).collect::<String>()
            )),
        }
    }
}

/// Why cgroups cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (no `cgroup2` entry in /proc/self/mountinfo)")]
    NotMounted,
    #[error("the daemon's cgroup v2 path is unknown (no `0::` line in /proc/self/cgroup)")]
    NoOwnCgroup,
    #[error("{} is not a cgroup v2 directory (it has no cgroup.procs)", .0.display())]
    NotCgroup(PathBuf),
    #[error("cannot create {}: {source} (is the subtree delegated to the daemon? systemd: Delegate=yes)", .path.display())]
    Create { path: PathBuf, source: io::Error },
}

/// The session cgroups of one daemon (one store): `<base>/ostler-<tag>/`.
#[derive(Debug)]
pub struct Cgroups {
    dir: PathBuf,
}

impl Cgroups {
    /// Sets up `ostler-<tag>` under the directory `setting` names. `Ok(None)`: off.
    pub fn setup(setting: &CgroupSetting, tag: &str) -> Result<Option<Cgroups>, CgroupError> {
        let base = match setting {
            CgroupSetting::Off => return Ok(None),
            CgroupSetting::Auto => own_cgroup_dir()?,
            CgroupSetting::At(p) => p.clone(),
        };
        if !base.join("cgroup.procs").is_file() {
            return Err(CgroupError::NotCgroup(base));
        }
        let dir = base.join(format!("ostler-{}", sanitize(tag)));
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CgroupError::Create { path: dir, source }),
        }
        // A directory we cannot create cgroups in is no use: find out now, not at spawn.
        let probe = dir.join(".probe");
        match fs::create_dir(&probe) {
            Ok(()) => {
                let _ = fs::remove_dir(&probe);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let _ = fs::remove_dir(&probe);
            }
            Err(source) => {
                return Err(CgroupError::Create {
                    path: probe,
                    source,
                });
            }
        }
        Ok(Some(Cgroups { dir }))
    }

    /// `ostler-<tag>`: every session cgroup of this daemon is directly under it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cgroup of the session process marked `mark`.
    pub fn dir_for(&self, mark: &str) -> PathBuf {
        self.dir.join(sanitize(mark))
    }

    /// Creates the cgroup for `mark` and opens its `cgroup.procs` for the child to write
    /// `0` into (moving itself) between fork and exec. Close-on-exec.
    pub(crate) fn prepare(&self, mark: &str) -> io::Result<OwnedFd> {
        let dir = self.dir_for(mark);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // std opens with O_CLOEXEC.
        let f = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))?;
        Ok(OwnedFd::from(f))
    }

    /// Kills every process in `mark`'s cgroup and removes it. Returns how many processes
    /// were in it.
    pub fn kill(&self, mark: &str) -> usize {
        kill_dir(&self.dir_for(mark))
    }

    /// Kills and removes every session cgroup of this daemon (the leftovers of a previous
    /// run on the same store). Returns how many processes were in them.
    pub fn kill_all(&self) -> usize {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return 0;
        };
        rd.flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| kill_dir(&e.path()))
            .sum()
    }
}

/// The pids in a cgroup (empty when it is gone).
pub fn members(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(s) => s
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["populated", "1"]),
        Err(_) => false,
    }
}

fn kill_dir(dir: &Path) -> usize {
    let n = members(dir).len();
    if n > 0 && fs::write(dir.join("cgroup.kill"), "1").is_err() {
        // Before Linux 5.14: one by one, until none is left (a member may fork meanwhile).
        for _ in 0..100 {
            let pids = members(dir);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if let Ok(raw) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(raw),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
    // Killed processes leave the cgroup as they exit (a zombie is no member); wait for
    // that briefly, then remove it. A cgroup that cannot be removed yet is removed by the
    // next `kill_all` (the next start).
    let deadline = Instant::now() + Duration::from_secs(2);
    while populated(dir) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = fs::remove_dir(dir);
    n
}

/// `<cgroup2 mount>/<the daemon's cgroup>`.
fn own_cgroup_dir() -> Result<PathBuf, CgroupError> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount = cgroup2_mount(&mountinfo).ok_or(CgroupError::NotMounted)?;
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let rel = own_cgroup(&own).ok_or(CgroupError::NoOwnCgroup)?;
    Ok(mount.join(rel.trim_start_matches('/')))
}

/// The mount point of the cgroup2 hierarchy in `/proc/self/mountinfo` text.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        if fstype != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The cgroup v2 path (`0::<path>`) in `/proc/self/cgroup` text.
fn own_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// A cgroup directory name from a process mark or tag: `/` and anything unusual become `_`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_and_own_path() {
        let mi = "24 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n\
                  25 24 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(mi),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/vda rw\n"), None);
        let cg = "4:memory:/x\n0::/system.slice/ostler.service\n";
        assert_eq!(own_cgroup(cg), Some("/system.slice/ostler.service"));
        assert_eq!(own_cgroup("4:memory:/x\n"), None);
    }

    #[test]
    fn names_are_single_path_components() {
        assert_eq!(sanitize("store-00ff/abc-1/3"), "store-00ff_abc-1_3");
        assert_eq!(sanitize("../x"), ".._x");
        assert!(!sanitize("a/../../b").contains('/'));
    }

    #[test]
    fn settings_parse() {
        assert_eq!("off".parse(), Ok(CgroupSetting::Off));
        assert_eq!("auto".parse(), Ok(CgroupSetting::Auto));
        assert_eq!(
            "/sys/fs/cgroup/x".parse(),
            Ok(CgroupSetting::At(PathBuf::from("/sys/fs/cgroup/x")))
        );
        assert!("yes".parse::<CgroupSetting>().is_err());
    }

    /// Where this machine lets us (root with cgroup2 mounted), a process started in a
    /// session cgroup, and what it forks with a cleared environment in a new session, end
    /// with `kill`; the cgroup is removed. Elsewhere: says so and checks nothing more.
    #[test]
    fn kill_ends_every_member_and_removes_the_cgroup() {
        let tag = format!("unit-{}", std::process::id());
        let cg = match Cgroups::setup(&CgroupSetting::Auto, &tag) {
            Ok(Some(cg)) => cg,
            other => {
                eprintln!("SKIPPED: no writable cgroup v2 here ({other:?})");
                return;
            }
        };
        let mark = format!("{tag}/s/1");
        let fd = cg.prepare(&mark).unwrap();
        let procs = fs::File::from(fd);
        // The shell forks the escaping sleeper only once it has been moved (a line on stdin).
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "read go; env -i /usr/bin/setsid /bin/sleep 300 </dev/null >/dev/null 2>&1 & exec /bin/sleep 300",
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Moved from outside here (the daemon's child moves itself, before exec).
        use std::io::Write;
        (&procs)
            .write_all(child.id().to_string().as_bytes())
            .unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let dir = cg.dir_for(&mark);
        let deadline = Instant::now() + Duration::from_secs(10);
        while members(&dir).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(members(&dir).len(), 2, "sh and its escaped sleeper");
        assert_eq!(cg.kill(&mark), 2);
        child.wait().unwrap();
        assert!(!dir.exists(), "the session cgroup is removed");
        assert_eq!(cg.kill_all(), 0);
        let _ = fs::remove_dir(cg.dir());
    }
}
