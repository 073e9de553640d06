//! The SIGCHLD reaper.
//!
//! The shim is a child subreaper: runc's detached container processes are
//! re-parented to it, and it also runs runc itself. All of them are reaped in
//! one place, here, with `waitpid(-1)`; whoever waits for a pid subscribes
//! *before* the child can exit, so no exit is ever missed.

use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use tracing::{debug, warn};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use crate::error::{IoContext, Result};

/// One reaped child: its pid and its exit status in the shell convention
/// (the exit code, or 128 + the signal number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub pid: i32,
    pub status: i32,
}

type Subscribers = Arc<Mutex<Vec<(u64, mpsc::UnboundedSender<Exit>)>>>;

struct Reaper {
    subscribers: Subscribers,
    next_id: Mutex<u64>,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

/// The environment variable every child the shim starts carries, set to
/// the shim's id: after the shim died, its runc, CRIU and lazy-pages
/// processes are found (and killed) by it, see [`crate::lifecycle::cleanup`].
pub const TAG_ENV: &str = "TORPOR_SHIM";

static TAG: OnceLock<String> = OnceLock::new();

/// Sets the shim id the children are tagged with (once, at start).
pub fn set_tag(shim: &str) {
    let _ = TAG.set(shim.to_string());
}

/// Tags `cmd` with the shim id (for a child not started by this module).
pub fn tag(cmd: &mut Command) {
    if let Some(t) = TAG.get() {
        cmd.env(TAG_ENV, t);
    }
}

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| {
        let subscribers: Subscribers = Arc::default();
        let subs = subscribers.clone();
        // The handler is installed here, synchronously, before the task runs,
        // so a SIGCHLD that arrives meanwhile is recorded, not lost.
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
            Ok(mut sig) => {
                tokio::spawn(async move {
                    loop {
                        reap_all(&subs);
                        if sig.recv().await.is_none() {
                            break;
                        }
                    }
                });
            }
            Err(e) => warn!("cannot install the SIGCHLD handler: {e}"),
        }
        Reaper {
            subscribers,
            next_id: Mutex::new(0),
        }
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it;
    // the data (a list of channels) is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn reap_all(subs: &Subscribers) {
    loop {
        let exit = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => Exit { pid: pid.as_raw(), status: code },
            Ok(WaitStatus::Signaled(pid, sig, _)) => Exit { pid: pid.as_raw(), status: 128 + sig as i32 },
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                warn!("waitpid: {e}");
                return;
            }
        };
        debug!(pid = exit.pid, status = exit.status, "reaped child");
        lock(subs).retain(|(_, tx)| tx.send(exit).is_ok());
    }
}

/// A stream of every exit reaped from the moment of subscription.
pub struct Subscription {
    id: u64,
    rx: mpsc::UnboundedReceiver<Exit>,
}

impl Subscription {
    /// The next exit of any child.
    pub async fn next(&mut self) -> Option<Exit> {
        self.rx.recv().await
    }

    /// Waits for the exit of `pid`, dropping the others.
    pub async fn wait_for(&mut self, pid: i32) -> i32 {
        while let Some(e) = self.rx.recv().await {
            if e.pid == pid {
                return e.status;
            }
        }
        // The reaper never closes the channel while subscribed.
        -1
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(r) = REAPER.get() {
            lock(&r.subscribers).retain(|(id, _)| *id != self.id);
        }
    }
}

/// Subscribes to all exits. Must be called inside the tokio runtime.
pub fn subscribe() -> Subscription {
    let r = reaper();
    let (tx, rx) = mpsc::unbounded_channel();
    let id = {
        let mut n = lock(&r.next_id);
        *n += 1;
        *n
    };
    lock(&r.subscribers).push((id, tx));
    Subscription { id, rx }
}

/// Runs a command to completion through the reaper, capturing stdout and
/// stderr. Use it for every short-lived child of the shim.
pub async fn output(mut cmd: Command) -> Result<Output> {
    let mut sub = subscribe();
    tag(&mut cmd);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().io_context(|| format!("spawn {:?}", cmd.get_program()))?;
    let pid = child.id() as i32;
    let (stdout, stderr) = read_pipes(child).await?;
    let status = sub.wait_for(pid).await;
    Ok(Output {
        status: exit_status(status),
        stdout,
        stderr,
    })
}

/// Runs a command whose stdio was already set by the caller (for example the
/// pipes of a container process) and waits for it through the reaper.
pub async fn status(mut cmd: Command) -> Result<i32> {
    let mut sub = subscribe();
    tag(&mut cmd);
    let child = cmd.spawn().io_context(|| format!("spawn {:?}", cmd.get_program()))?;
    let pid = child.id() as i32;
    drop(cmd); // close our copies of the child's stdio
    drop(child);
    Ok(sub.wait_for(pid).await)
}

async fn read_pipes(mut child: Child) -> Result<(Vec<u8>, Vec<u8>)> {
    use std::io::Read;
    let out = child.stdout.take();
    let err = child.stderr.take();
    let read = |p: Option<Box<dyn Read + Send>>| {
        tokio::task::spawn_blocking(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = p {
                p.read_to_end(&mut buf).map(|_| buf)
            } else {
                Ok(buf)
            }
        })
    };
    let o = read(out.map(|p| Box::new(p) as Box<dyn Read + Send>));
    let e = read(err.map(|p| Box::new(p) as Box<dyn Read + Send>));
    let join = |r: std::result::Result<std::io::Result<Vec<u8>>, tokio::task::JoinError>| match r {
        Ok(r) => r,
        Err(e) => Err(std::io::Error::other(e)),
    };
    let stdout = join(o.await).io_context(|| "read child stdout".into())?;
    let stderr = join(e.await).io_context(|| "read child stderr".into())?;
    Ok((stdout, stderr))
}

fn exit_status(code: i32) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    if code > 128 {
        std::process::ExitStatus::from_raw(code - 128)
    } else {
        std::process::ExitStatus::from_raw((code & 0xff) << 8)
    }
}

/// SIGKILLs every process tagged with the dead shim's id (its runc, CRIU
/// and lazy-pages children, which outlive it).
pub fn kill_tagged(shim: &str) {
    let needle = format!("{}={shim}", TAG_ENV);
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else { return };
    for e in rd.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            warn!(pid = pid.as_str(), comm = comm.trim(), "cleanup: killing a process the dead shim left");
            if let Ok(p) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_and_status_through_the_reaper() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output(c).await.unwrap();
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");

        let mut c = Command::new("sh");
        c.args(["-c", "kill -9 $$"]);
        assert_eq!(status(c).await.unwrap(), 137);
    }
}
