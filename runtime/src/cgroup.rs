//! The container's cgroup: where the shim reads OOM kills.
//!
//! Works on cgroup v1 (the memory controller's `memory.oom_control`) and on
//! cgroup v2 (`memory.events`), whichever hierarchy runc put the container in.

use std::path::{Path, PathBuf};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_oom_kill_counters() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_counter(v1, "oom_kill"), Some(2));
        let v2 = "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_counter(v2, "oom_kill"), Some(1));
        assert_eq!(parse_counter("", "oom_kill"), None);
    }
}
