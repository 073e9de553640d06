//! The container's cgroup: where the shim reads OOM kills and CPU use, and
//! how it kills whatever is left in it.
//!
//! Works on cgroup v1 (the memory controller's `memory.oom_control`) and on
//! cgroup v2 (`memory.events`), whichever hierarchy runc put the container in.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

const ROOT: &str = "/sys/fs/cgroup";

/// The memory cgroup directory of a live process, if it can be found.
pub fn memory_cgroup_of(pid: i32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = Path::new(ROOT).join("memory");
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") && v1.is_dir() {
            return Some(v1.join(rel));
        }
        if controllers.is_empty() && !v1.is_dir() {
            return Some(Path::new(ROOT).join(rel));
        }
    }
    None
}

/// How many processes the kernel's OOM killer killed in this cgroup.
pub fn oom_kills(dir: &Path) -> u64 {
    for (file, key) in [("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")] {
        if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
            if let Some(n) = parse_counter(&text, key) {
                return n;
            }
        }
    }
    0
}

fn parse_counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

/// CPU time (ns) used so far by the cgroup of process `pid` (cpuacct on
/// v1, `cpu.stat` on v2).
pub fn cpu_ns(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if ctrl.split(',').any(|c| c == "cpuacct") {
            let f = Path::new("/sys/fs/cgroup/cpuacct").join(rel).join("cpuacct.usage");
            if let Ok(v) = std::fs::read_to_string(&f) {
                return v.trim().parse().ok();
            }
            let f = Path::new("/sys/fs/cgroup/cpu,cpuacct").join(rel).join("cpuacct.usage");
            return std::fs::read_to_string(f).ok()?.trim().parse().ok();
        }
        if ctrl.is_empty() {
            let stat = std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(rel).join("cpu.stat")).ok();
            if let Some(us) = stat.as_deref().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec ").and_then(|v| v.trim().parse::<u64>().ok()))
            }) {
                return Some(us * 1000);
            }
        }
    }
    None
}

/// The cgroup directories of `path` in every mounted hierarchy (v1: one per
/// controller; v2: the unified one). A systemd-style `slice:prefix:name`
/// path is not resolved (runc's delete covers that case).
pub fn cgroup_dirs(path: &str) -> Vec<PathBuf> {
    if !path.starts_with('/') || path.contains("..") {
        return Vec::new();
    }
    let rel = path.trim_start_matches('/');
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.join(rel)];
    }
    let Ok(hier) = std::fs::read_dir(base) else { return Vec::new() };
    hier.flatten().map(|h| h.path().join(rel)).filter(|d| d.join("cgroup.procs").is_file()).collect()
}

/// SIGKILLs every process in cgroup `path` (thawing a frozen one so that
/// the kill lands), until it is empty or 2 s passed (containerd gives a
/// cleanup 5 s).
pub async fn kill_cgroup(path: &str) {
    let dirs = cgroup_dirs(path);
    if dirs.is_empty() {
        return;
    }
    for round in 0..100 {
        let mut pids = Vec::new();
        for d in &dirs {
            if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return;
        }
        if round == 0 {
            info!(cgroup = path, pids = ?pids, "cleanup: killing what is left in the cgroup");
        }
        for p in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::Signal::SIGKILL);
        }
        for d in &dirs {
            let _ = std::fs::write(d.join("freezer.state"), "THAWED");
            let _ = std::fs::write(d.join("cgroup.freeze"), "0");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    warn!(cgroup = path, "cleanup: processes are still left in the cgroup");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_stay_under_the_hierarchies() {
        assert!(cgroup_dirs("../etc").is_empty());
        assert!(cgroup_dirs("/a/../../etc").is_empty());
        assert!(cgroup_dirs("system.slice:cri:abc").is_empty());
    }

    #[test]
    fn reads_oom_kill_counters() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_counter(v1, "oom_kill"), Some(2));
        let v2 = "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_counter(v2, "oom_kill"), Some(1));
        assert_eq!(parse_counter("", "oom_kill"), None);
    }
}
