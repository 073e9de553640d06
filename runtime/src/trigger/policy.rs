//! Triggers that come from the actor itself: its own request, made from
//! inside the container, and the idle policy (`torpor.dev/idle-after`).
//!
//! **Request.** Every app container gets a bind mount of the host directory
//! `/run/torpor/actors/<shim id>/` at `/run/torpor` (added to its OCI spec at
//! create; a tmpfs of its own, 4 KiB and 8 inodes, see
//! [`crate::oci::bundle`]). The actor writes `suspend` to
//! `/run/torpor/request` when it is done; the shim takes the request
//! (removing the file) and suspends it. An inbound connection, `crictl
//! exec` or `torporctl resume` wakes it again.
//!
//! The file is written by the container, read by the shim as root: it is
//! opened without following a symlink and without blocking (a FIFO), taken
//! only when it is a regular file, read for at most [`REQUEST_MAX`] bytes,
//! removed whatever it was, and its contents are never logged (an unknown
//! request is reported by its size).
//!
//! **Idle.** With `torpor.dev/idle-after: D`, the shim suspends the actor
//! once its containers used no CPU (less than 1% of one core) and its pod
//! network saw no packets (other than loopback) for D.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::actor::Lifecycle;
use crate::lifecycle::Actor;
use crate::oci::bundle::{request_dir, REQUEST_MOUNT};
use crate::system::cgroup::cpu_ns;

const POLL: Duration = Duration::from_secs(1);
/// CPU below this share of one core counts as idle (runtimes tick).
const IDLE_CPU_SHARE: f64 = 0.01;

/// The longest request read from the file; a longer one is unknown.
const REQUEST_MAX: u64 = 16;

/// A request found in the request file.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Suspend,
    /// Anything else: only its size is told (never its contents).
    Unknown { bytes: u64 },
    /// A symlink, FIFO, directory or device: ignored.
    NotAFile,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Suspend => f.write_str("suspend"),
            Request::Unknown { bytes } => write!(f, "unknown request ({bytes} bytes) in {REQUEST_MOUNT}/request (only \"suspend\")"),
            Request::NotAFile => write!(f, "{REQUEST_MOUNT}/request is not a regular file: ignored and removed"),
        }
    }
}

/// Takes a pending request of shim `group`, if there is one.
fn take_request(group: &str) -> Option<Request> {
    take_request_in(&request_dir(group))
}

/// Takes (reads and removes) the request file in `dir`.
fn take_request_in(dir: &Path) -> Option<Request> {
    let file = dir.join("request");
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&file);
    let request = match opened {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        // ELOOP (a symlink), EACCES (a device on a nodev mount)...
        Err(_) => Request::NotAFile,
        Ok(f) => match f.metadata() {
            Ok(md) if md.is_file() => {
                let mut head = Vec::new();
                match (&f).take(REQUEST_MAX + 1).read_to_end(&mut head) {
                    Ok(n) if n as u64 <= REQUEST_MAX && head.trim_ascii() == b"suspend" => Request::Suspend,
                    _ => Request::Unknown { bytes: md.len() },
                }
            }
            _ => Request::NotAFile,
        },
    };
    // Whatever it was, it goes (a directory with what is in it).
    if std::fs::remove_file(&file).is_err() {
        let _ = std::fs::remove_dir_all(&file);
    }
    Some(request)
}

/// What the idle policy samples.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    cpu_ns: u64,
    packets: u64,
}

/// Packets through the pod's interfaces (all but loopback).
fn packets(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    let mut total = 0u64;
    for line in text.lines().skip(2) {
        let (name, rest) = line.split_once(':')?;
        if name.trim() == "lo" {
            continue;
        }
        let f: Vec<u64> = rest.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        // rx packets is field 1, tx packets field 9
        total += f.get(1).copied().unwrap_or(0) + f.get(9).copied().unwrap_or(0);
    }
    Some(total)
}

/// Polls the request file and the idle policy of shim `group`'s actor.
pub fn start(actor: &Actor, group: String) {
        let rt = actor.clone();
        tokio::spawn(async move {
            let mut last: Option<Sample> = None;
            let mut quiet_since = Instant::now();
            loop {
                tokio::time::sleep(POLL).await;
                let Some(rec) = rt.status() else { continue };
                if let Some(req) = take_request(&group) {
                    match req {
                        Request::Suspend => match rt.suspend().await {
                            Ok(_) => info!(actor = rec.actor.as_str(), "suspended at the actor's request"),
                            Err(e) => warn!(actor = rec.actor.as_str(), "the actor's suspend request failed: {e}"),
                        },
                        other => warn!(actor = rec.actor.as_str(), "{other}"),
                    }
                    continue;
                }
                let Some(idle_after) = rt.tasks.idle_after() else { continue };
                if rec.state != Lifecycle::Running {
                    last = None;
                    continue;
                }
                let Some(now) = sample(&rt) else { continue };
                let busy = match last {
                    Some(prev) => {
                        let cpu = now.cpu_ns.saturating_sub(prev.cpu_ns) as f64 / POLL.as_nanos() as f64;
                        cpu > IDLE_CPU_SHARE || now.packets != prev.packets
                    }
                    None => true,
                };
                last = Some(now);
                if busy {
                    quiet_since = Instant::now();
                } else if quiet_since.elapsed() >= idle_after {
                    match rt.suspend().await {
                        Ok(_) => info!(actor = rec.actor.as_str(), idle_after = ?idle_after, "suspended: idle"),
                        Err(e) => warn!(actor = rec.actor.as_str(), "idle suspend failed: {e}"),
                    }
                    last = None;
                    quiet_since = Instant::now();
                }
            }
        });
}

/// CPU and packets of the actor's containers, now.
fn sample(actor: &Actor) -> Option<Sample> {
    let mut s = Sample { cpu_ns: 0, packets: 0 };
    let mut any = false;
    for pid in actor.tasks.app_pids() {
        s.cpu_ns += cpu_ns(pid)?;
        s.packets = s.packets.max(packets(pid)?);
        any = true;
    }
    any.then_some(s)
}


#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_suspend_request_is_taken_once() {
        let d = dir();
        std::fs::write(d.path().join("request"), "suspend\n").unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::Suspend));
        assert!(!d.path().join("request").exists());
        assert_eq!(take_request_in(d.path()), None);
    }

    /// A symlink to a host file: not followed, its contents never read or
    /// told, the link removed and the file left alone.
    #[test]
    fn a_symlink_is_not_followed() {
        let d = dir();
        let secret = d.path().join("secret.env");
        std::fs::write(&secret, "TORPOR_STORE_KEY=00112233").unwrap();
        symlink(&secret, d.path().join("request")).unwrap();
        let r = take_request_in(d.path()).unwrap();
        assert_eq!(r, Request::NotAFile);
        assert!(!r.to_string().contains("TORPOR_STORE_KEY"));
        assert!(std::fs::symlink_metadata(d.path().join("request")).is_err());
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "TORPOR_STORE_KEY=00112233");
        // A symlink to /dev/zero is not read either (once: memory exhausted).
        symlink("/dev/zero", d.path().join("request")).unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::NotAFile));
    }

    /// A FIFO nobody writes: once a blocking read wedged the policy loop.
    #[test]
    fn a_fifo_does_not_block() {
        let d = dir();
        nix::unistd::mkfifo(&d.path().join("request"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = d.path().to_path_buf();
        std::thread::spawn(move || tx.send(take_request_in(&path)).unwrap());
        // Liveness bound only.
        let r = rx.recv_timeout(Duration::from_secs(60)).expect("reading the request FIFO blocked");
        assert_eq!(r, Some(Request::NotAFile));
        assert!(!d.path().join("request").exists());
    }

    /// An unknown request is told by its size, never its contents, and
    /// only the first bytes of a large file are read.
    #[test]
    fn an_unknown_request_is_told_by_size_only() {
        let d = dir();
        std::fs::write(d.path().join("request"), "password=hunter2").unwrap();
        let r = take_request_in(d.path()).unwrap();
        assert_eq!(r, Request::Unknown { bytes: 16 });
        let msg = r.to_string();
        assert!(msg.contains("16 bytes") && !msg.contains("hunter2"), "{msg}");
        // "suspend" followed by more than the bound is not a request.
        std::fs::write(d.path().join("request"), format!("suspend{}", " ".repeat(1 << 20))).unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::Unknown { bytes: 7 + (1 << 20) }));
        std::fs::create_dir_all(d.path().join("request/sub")).unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::NotAFile));
        assert!(!d.path().join("request").exists());
    }
}
