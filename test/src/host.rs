//! What the tests look at on the host: processes, files and mounts, and
//! TCP connections to the pods.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::wait_for;
use crate::LIVENESS;

// ------------------------------------------------------------ host checks

/// The freezer state (THAWED / FROZEN / FREEZING) of a host pid's cgroup:
/// cgroup v1's freezer, else v2's cgroup.freeze ("FROZEN" / "THAWED").
pub fn freezer_state(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        if ctrls.split(',').any(|c| c == "freezer") {
            let p = Path::new("/sys/fs/cgroup/freezer").join(path.trim_start_matches('/')).join("freezer.state");
            return std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
        }
    }
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let v = std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')).join("cgroup.freeze")).ok()?;
    Some(if v.trim() == "1" { "FROZEN" } else { "THAWED" }.to_string())
}

/// Processes whose command line or working directory mentions `needle`
/// (shims are started with `-id <id>` and run in their bundle dir).
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == me {
            continue;
        }
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        // crictl/ctr clients of concurrently running tests are not leftovers
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if exe.ends_with("/crictl") || exe.ends_with("/ctr") {
            continue;
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if cmdline.contains(needle) || cwd.contains(needle) {
            found.push(format!("pid {pid} exe {exe} cwd {cwd}: {}", cmdline.trim()));
        }
    }
    found
}

/// Processes in a cgroup whose path contains `needle` (a container id, a
/// pod's cgroup), with their command lines.
pub fn processes_in_cgroup(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return found };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cg.contains(needle) {
            let cmd =
                std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
            found.push(format!("pid {pid}: {}", cmd.trim()));
        }
    }
    found
}

/// The files below `dir` (at most 5 levels deep).
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
        if depth > 4 {
            return;
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out, depth + 1);
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out, 0);
    out
}

/// Lines of /proc/self/mountinfo that mention `needle`.
pub fn mounts_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(|l| l.to_string())
        .collect()
}

/// One command of the actor counter's line protocol on a fresh connection
/// to `addr` (connect retried, liveness-limited); the reply line, trimmed.
#[track_caller]
pub fn counter_cmd(addr: &str, cmd: &str) -> String {
    use std::io::{BufRead, Write};
    let stream = connect_with_retry(addr);
    stream.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut w = stream.try_clone().unwrap();
    w.write_all(format!("{cmd}\n").as_bytes()).unwrap_or_else(|e| panic!("send {cmd:?} to {addr}: {e}"));
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line).unwrap_or_else(|e| panic!("reply to {cmd:?} from {addr}: {e}"));
    assert!(line.ends_with('\n'), "counter at {addr} closed the connection instead of answering {cmd:?} (got {line:?})");
    line.trim().to_string()
}

/// A TCP connect to `addr` with retries until it succeeds (liveness-limited).
#[track_caller]
pub fn connect_with_retry(addr: &str) -> std::net::TcpStream {
    let sa: std::net::SocketAddr = addr.parse().unwrap_or_else(|e| panic!("bad address {addr}: {e}"));
    let mut last_err = String::new();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("a TCP connection to {addr}"), LIVENESS, || {
            match std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(5)) {
                Ok(s) => Some(s),
                Err(e) => {
                    last_err = e.to_string();
                    None
                }
            }
        })
    }));
    match res {
        Ok(s) => s,
        Err(_) => panic!("cannot connect to {addr}: {last_err}"),
    }
}
