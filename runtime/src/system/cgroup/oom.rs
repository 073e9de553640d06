//! A container's OOM kills, counted while its cgroup lives.
//!
//! Read once at the init's exit, a cgroup's OOM counter may be gone with
//! the cgroup: under runc's systemd driver the container is a transient
//! scope unit, and systemd removes its cgroup as soon as the last process
//! in it has exited, before the shim has reaped the init, killed what was
//! left and drained its output (test/vm/README.md: an OOM kill under the
//! systemd driver was reported as `Error`). So the counter is watched from
//! the container's start, as containerd-shim-runc-v2 does:
//!
//! - v2: `memory.events`, through inotify (the kernel notifies every
//!   change of the file: `oom_kill` is counted when the victim is chosen,
//!   before it dies);
//! - v1: `memory.oom_control`, through an eventfd registered in
//!   `cgroup.event_control` (signalled on an OOM and when the cgroup is
//!   removed).
//!
//! Each notification re-reads the counter (on v1 until the kill that
//! follows the notification is counted); the watch ends when the counter
//! can no longer be read (the cgroup is gone), keeping the last count.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tracing::debug;

use super::{files, Cgroup};
use crate::error::{Error, IoContext, Result};

/// The OOM kills of one cgroup seen so far (see the module doc); the watch
/// stops when this is dropped.
#[derive(Debug)]
pub struct OomWatch {
    kills: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl OomWatch {
    /// Watches `cg`'s OOM counter (read once when the watch is in place,
    /// so that no kill falls between the two). Needs the tokio runtime.
    pub fn start(cg: &Cgroup) -> Result<OomWatch> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| Error::FailedPrecondition(format!("watch the OOM kills of cgroup {cg}: no async runtime ({e})")))?;
        let (notify, keep) = match cg {
            Cgroup::V2(d) => (inotify_modify(&d.join("memory.events"))?, None),
            Cgroup::V1(_) => {
                let (efd, control) = oom_eventfd(cg.dir("memory")?)?;
                (efd, Some(control))
            }
        };
        let notify = {
            let _in = runtime.enter();
            // SAFETY: the OwnedFd owns its descriptor, which stays open and
            // the same until it is dropped with the AsyncFd.
            unsafe { AsyncFd::register_with_interest(notify, tokio::io::Interest::READABLE) }
                .map_err(|e| Error::Io { context: format!("watch the OOM kills of cgroup {cg}"), source: e.into_parts().1 })?
        };
        let kills = Arc::new(AtomicU64::new(cg.oom_kills()?));
        let task = runtime.spawn(watch(cg.clone(), notify, kills.clone(), keep));
        Ok(OomWatch { kills, task })
    }

    /// The highest count of OOM kills seen in the cgroup.
    pub fn kills(&self) -> u64 {
        self.kills.load(Ordering::Relaxed)
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Re-reads the counter at each notification until it cannot be read.
/// `_keep`: what must stay open while the notification is registered
/// (v1's `memory.oom_control`).
async fn watch(cg: Cgroup, notify: AsyncFd<OwnedFd>, kills: Arc<AtomicU64>, _keep: Option<OwnedFd>) {
    let mut buf = [0u8; 4096];
    loop {
        let mut ready = match notify.readable().await {
            Ok(r) => r,
            Err(e) => {
                debug!(cgroup = %cg, "OOM watch ends: {e}");
                return;
            }
        };
        // Drain what is queued (inotify events, or the eventfd's count).
        loop {
            // SAFETY: a read into a buffer that lives for the call, its length given.
            let n = unsafe { libc::read(notify.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                continue;
            }
            let e = std::io::Error::last_os_error();
            if n < 0 && e.kind() == std::io::ErrorKind::WouldBlock {
                ready.clear_ready();
                break;
            }
            if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            debug!(cgroup = %cg, "OOM watch ends: read: {}", if n == 0 { "end of file".to_string() } else { e.to_string() });
            return;
        }
        let before = kills.load(Ordering::Relaxed);
        let now = match cg {
            Cgroup::V2(_) => cg.oom_kills(),
            Cgroup::V1(_) => v1_kill_after_oom(&cg, before).await,
        };
        match now {
            Ok(n) => {
                if kills.fetch_max(n, Ordering::Relaxed) < n {
                    debug!(cgroup = %cg, kills = n, "OOM kill in the container's cgroup");
                }
            }
            Err(e) => {
                debug!(cgroup = %cg, "OOM watch ends (the cgroup is gone): {e}");
                return;
            }
        }
    }
}

/// How long v1's counter is waited for after an OOM notification.
const V1_KILL_WAIT: Duration = Duration::from_secs(2);

/// v1 signals the eventfd when the cgroup runs out of memory, before the
/// OOM killer has chosen (and counted) its victim: the counter is read
/// until it passes `before` (bounded: an OOM may end without a kill). A
/// cgroup that is gone by then had an OOM its last process died of: one
/// kill more than `before`. The signal of the cgroup's removal finds it
/// gone at once: an error (the watch ends).
async fn v1_kill_after_oom(cg: &Cgroup, before: u64) -> Result<u64> {
    let first = cg.oom_kills()?;
    let start = std::time::Instant::now();
    let mut n = first;
    while n <= before && start.elapsed() < V1_KILL_WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
        n = match cg.oom_kills() {
            Ok(n) => n,
            Err(_) => return Ok(before + 1),
        };
    }
    Ok(n)
}

/// An inotify descriptor (non-blocking) told of every change of `file`.
fn inotify_modify(file: &std::path::Path) -> Result<OwnedFd> {
    // SAFETY: inotify_init1 with flags only; the result is checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Io { context: "inotify_init1".into(), source: std::io::Error::last_os_error() });
    }
    // SAFETY: a descriptor just returned to us, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let path =
        std::ffi::CString::new(file.as_os_str().as_bytes()).map_err(|_| Error::InvalidArgument(format!("path {file:?} has a NUL byte")))?;
    // SAFETY: a watch on a NUL-terminated path that lives for the call.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), libc::IN_MODIFY) } < 0 {
        return Err(Error::Io { context: format!("inotify watch of {file:?}"), source: std::io::Error::last_os_error() });
    }
    Ok(fd)
}

/// v1: an eventfd (non-blocking) the kernel signals on each OOM of the
/// memory cgroup `dir` (and at its removal), registered through
/// `cgroup.event_control`; with the open `memory.oom_control` it names.
fn oom_eventfd(dir: &std::path::Path) -> Result<(OwnedFd, OwnedFd)> {
    let control_file = dir.join("memory.oom_control");
    let control = std::fs::File::open(&control_file).io_context(|| format!("open {control_file:?}"))?;
    // SAFETY: eventfd with flags only; the result is checked.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(Error::Io { context: "eventfd".into(), source: std::io::Error::last_os_error() });
    }
    // SAFETY: a descriptor just returned to us, owned from here on.
    let efd = unsafe { OwnedFd::from_raw_fd(efd) };
    let control = OwnedFd::from(control);
    files::write(&dir.join("cgroup.event_control"), &format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()))?;
    Ok((efd, control))
}
