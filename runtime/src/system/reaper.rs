//! The SIGCHLD reaper.
//!
//! The shim is a child subreaper: runc's detached container processes are
//! re-parented to it, and it also runs runc itself. All of them are reaped in
//! one place, here, with `waitpid(-1)`; whoever waits for a pid subscribes
//! *before* the child can exit, so no exit is ever missed.
//!
//! **Deadlines.** Every short-lived command ([`output`], [`status`]) runs
//! with a deadline, in a process group of its own: when the deadline
//! passes, the whole group is SIGKILLed (runc *and* the CRIU it runs), and
//! the caller gets an I/O error of kind `TimedOut` naming the command and
//! the deadline ([`is_timeout`]). The deadline bounds the command only:
//! what it leaves running on success (the container process after `runc
//! create --detach`, in a session of its own) is never touched.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::error::{Error, IoContext, Result};

/// How long a command killed at its deadline may take to be reaped before
/// the caller gets its error anyway.
const KILL_GRACE: Duration = Duration::from_secs(5);

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
        // On a thread (and runtime) of its own, so that it outlives the
        // runtime that first asked for it (each unit test has its own). The
        // handler is installed here, synchronously, before the loop runs,
        // so a SIGCHLD that arrives meanwhile is recorded, not lost.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let sig = rt.as_ref().map_err(|e| e.to_string()).and_then(|rt| {
            let _in = rt.enter();
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).map_err(|e| e.to_string())
        });
        match (rt, sig) {
            (Ok(rt), Ok(mut sig)) => {
                let spawned = std::thread::Builder::new().name("reaper".into()).spawn(move || {
                    rt.block_on(async move {
                        loop {
                            reap_all(&subs);
                            if sig.recv().await.is_none() {
                                break;
                            }
                        }
                    })
                });
                if let Err(e) = spawned {
                    warn!("cannot start the reaper thread: {e}");
                }
            }
            (Err(e), _) => warn!("cannot start the reaper's runtime: {e}"),
            (_, Err(e)) => warn!("cannot install the SIGCHLD handler: {e}"),
        }
        Reaper { subscribers, next_id: Mutex::new(0) }
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

    /// Whether the exit of `pid` was already reaped (drops the others
    /// received so far).
    fn exited(&mut self, pid: i32) -> bool {
        while let Ok(e) = self.rx.try_recv() {
            if e.pid == pid {
                return true;
            }
        }
        false
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

/// Subscribes to all exits.
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
/// stderr. Use it for every short-lived child of the shim. Past `deadline`
/// its process group is killed and the error names the command.
pub async fn output(mut cmd: Command, deadline: Duration) -> Result<Output> {
    let mut sub = subscribe();
    prepare(&mut cmd);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let what = describe(&cmd);
    let child = cmd.spawn().io_context(|| format!("spawn {what}"))?;
    let pid = child.id() as i32;
    let run = async {
        let pipes = read_pipes(child).await;
        (pipes, sub.wait_for(pid).await)
    };
    match tokio::time::timeout(deadline, run).await {
        Ok((pipes, status)) => {
            let (stdout, stderr) = pipes?;
            Ok(Output { status: exit_status(status), stdout, stderr })
        }
        Err(_) => Err(timed_out(&mut sub, pid, &what, deadline).await),
    }
}

/// Runs a command whose stdio was already set by the caller (for example the
/// pipes of a container process) and waits for it through the reaper. Past
/// `deadline` its process group is killed and the error names the command.
pub async fn status(mut cmd: Command, deadline: Duration) -> Result<i32> {
    let mut sub = subscribe();
    prepare(&mut cmd);
    let what = describe(&cmd);
    let child = cmd.spawn().io_context(|| format!("spawn {what}"))?;
    let pid = child.id() as i32;
    drop(cmd); // close our copies of the child's stdio
    drop(child);
    match tokio::time::timeout(deadline, sub.wait_for(pid)).await {
        Ok(code) => Ok(code),
        Err(_) => Err(timed_out(&mut sub, pid, &what, deadline).await),
    }
}

/// The child `cmd` spawns gets the descriptors `fds` as numbers `first`,
/// `first + 1`, ... (inherited: not close-on-exec there); `fds` stay open
/// until the command is dropped, and the parent's own copies keep theirs.
/// At most [`MAX_PASSED_FDS`] (more fail the spawn with `EMFILE`).
pub fn pass_fds<F: AsRawFd + Send + Sync + 'static>(cmd: &mut Command, fds: Vec<F>, first: RawFd) {
    let targets = (first..).take(fds.len()).collect();
    pass_fds_at(cmd, fds, targets);
}

/// [`pass_fds`] onto any numbers: `fds[i]` becomes `targets[i]` in the
/// child. One set per command: a second would move descriptors after this
/// one placed its own, and could overwrite one.
pub fn pass_fds_at<F: AsRawFd + Send + Sync + 'static>(cmd: &mut Command, fds: Vec<F>, targets: Vec<RawFd>) {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let above = targets.iter().copied().max().unwrap_or(0).saturating_add(1);
    // SAFETY: between fork and exec only fcntl and dup2 (async-signal-safe)
    // on descriptors the child inherited, and no allocation: `raw` and
    // `targets` were built before the fork, `fds` is only kept alive.
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &fds;
            if raw.len() > MAX_PASSED_FDS || raw.len() != targets.len() {
                return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
            }
            // First above every target (a source may be one of them),
            // close-on-exec, then onto the targets.
            let mut moved = [0 as RawFd; MAX_PASSED_FDS];
            for (i, fd) in raw.iter().enumerate() {
                let high = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, above);
                if high < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                moved[i] = high;
            }
            for (i, n) in targets.iter().enumerate() {
                if libc::dup2(moved[i], *n) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// How many descriptors [`pass_fds`] hands to one child at most.
pub const MAX_PASSED_FDS: usize = 64;

/// Whether `e` is a command that did not finish within its deadline.
pub fn is_timeout(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut)
}

/// Tags the child and puts it in a process group of its own (its pid), so
/// that a deadline reaches everything it started that stayed in the group.
fn prepare(cmd: &mut Command) {
    tag(cmd);
    cmd.process_group(0);
}

/// The command line, for errors: the program and its arguments, shortened.
fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    if s.len() > 300 {
        let mut end = 300;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    format!("`{s}`")
}

/// The deadline of child `pid` passed: its process group is killed (unless
/// it exited meanwhile), and it is reaped (bounded by [`KILL_GRACE`]).
async fn timed_out(sub: &mut Subscription, pid: i32, what: &str, deadline: Duration) -> Error {
    // The pid (and so the group id) cannot be reused before it is reaped,
    // which this subscription would have seen.
    if !sub.exited(pid) {
        warn!(pid, command = what, ?deadline, "command past its deadline: killing its process group");
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        if tokio::time::timeout(KILL_GRACE, sub.wait_for(pid)).await.is_err() {
            warn!(pid, command = what, "killed command not reaped within {KILL_GRACE:?}");
        }
    }
    Error::Io {
        context: format!("{what} did not finish within its deadline of {deadline:?}; its process group was killed"),
        source: std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline exceeded"),
    }
}

/// A deadline from environment variable `var` (whole seconds, at least 1),
/// else `default`. A value that is not one is an error naming it.
pub fn deadline_from_env(var: &str, default: Duration) -> Result<Duration> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Ok(v) => parse_seconds(&v)
            .ok_or_else(|| Error::InvalidArgument(format!("${var}={v:?}: expected a whole number of seconds from 1 to 86400"))),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::InvalidArgument(format!("${var}={v:?}: expected a whole number of seconds from 1 to 86400")))
        }
    }
}

fn parse_seconds(v: &str) -> Option<Duration> {
    whole_number_in(v, 1..=86_400).map(Duration::from_secs)
}

/// `v` as a whole number within `range`: ASCII digits only (no sign, no
/// spaces, no unit).
pub(crate) fn whole_number_in(v: &str, range: std::ops::RangeInclusive<u64>) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = v.parse().ok()?;
    range.contains(&n).then_some(n)
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

/// How often [`kill_tagged`] scans at most, and the pause between scans.
const KILL_SCANS: usize = 100;
const KILL_SCAN_PAUSE: Duration = Duration::from_millis(10);

/// SIGKILLs every process tagged with the dead shim's id (its runc, CRIU
/// and lazy-pages children, which outlive it), until none is left: a
/// tagged process may fork between a scan and its kill (CRIU forking the
/// restored tree, runc starting CRIU), and its child inherits the tag, so
/// the scan is repeated until one finds no live tagged process (a zombie
/// has no environment, so it does not count), at most [`KILL_SCANS`] times.
pub async fn kill_tagged(shim: &str) {
    for _ in 0..KILL_SCANS {
        if kill_tagged_once(shim) == 0 {
            return;
        }
        tokio::time::sleep(KILL_SCAN_PAUSE).await;
    }
    warn!(shim, "cleanup: processes the dead shim left were still alive after {KILL_SCANS} rounds of SIGKILL");
}

/// One scan of [`kill_tagged`]: how many tagged processes it found alive
/// and SIGKILLed.
fn kill_tagged_once(shim: &str) -> usize {
    let needle = format!("{}={shim}", TAG_ENV);
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else { return 0 };
    let mut killed = 0;
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
                killed += 1;
            }
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(600);

    /// Descriptors land on numbers apart from each other, each its own
    /// file, whatever numbers they have in the parent.
    #[tokio::test]
    async fn descriptors_reach_numbers_apart() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fds = vec![std::os::fd::OwnedFd::from(a), std::os::fd::OwnedFd::from(b)];
        let ours: Vec<String> = fds
            .iter()
            .map(|f| std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap().to_string_lossy().into_owned())
            .collect();
        let mut cmd = Command::new("readlink");
        cmd.args(["/proc/self/fd/3", "/proc/self/fd/100"]);
        pass_fds_at(&mut cmd, fds, vec![3, 100]);
        let out = output(cmd, LONG).await.unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), ours);
    }

    /// A tagged process that keeps forking tagged children (CRIU forking
    /// a restored tree) leaves none alive: the scan is repeated until one
    /// finds nothing.
    #[tokio::test]
    async fn kill_tagged_leaves_no_tagged_process_even_one_forked_meanwhile() {
        let shim = format!("kill-tagged-test-{}", std::process::id());
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "while :; do sleep 100 & done"]).env(TAG_ENV, &shim);
        // The reaper runs: the killed ones do not stay zombies.
        let _exits = subscribe();
        drop(cmd.spawn().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(kill_tagged_once(&shim) > 1, "the forking shell and some children were found");
        kill_tagged(&shim).await;
        assert_eq!(kill_tagged_once(&shim), 0, "a tagged process is still alive");
    }

    /// A descriptor passed as 3 (the lazy-pages daemon's page-server
    /// socket) is the same open file in the child. (Like every child in
    /// this crate's tests, it is waited for through the reaper: a std
    /// `wait` races the reaper's `waitpid(-1)` and can get ECHILD.)
    #[tokio::test]
    async fn a_passed_descriptor_is_the_childs_fd_3() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ours = std::fs::read_link(format!("/proc/self/fd/{}", a.as_raw_fd())).unwrap();
        let mut cmd = Command::new("readlink");
        cmd.arg("/proc/self/fd/3");
        pass_fds(&mut cmd, vec![std::os::fd::OwnedFd::from(a)], 3);
        let out = output(cmd, LONG).await.unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), ours.to_string_lossy());
    }

    fn alive(pid: i32) -> bool {
        // A zombie counts as gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn output_and_status_through_the_reaper() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output(c, LONG).await.unwrap();
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");

        let mut c = Command::new("sh");
        c.args(["-c", "kill -9 $$"]);
        assert_eq!(status(c, LONG).await.unwrap(), 137);
    }

    /// A command that hangs is killed at its deadline with everything in
    /// its process group (a child it started, as runc starts CRIU), and
    /// the error names it.
    #[tokio::test]
    async fn a_hung_command_is_killed_with_its_group_at_the_deadline() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("grandchild");
        let script = format!("sleep 1000 & echo $! > {}; wait", pidfile.display());
        let mut c = Command::new("sh");
        c.args(["-c", &script]);
        let e = output(c, Duration::from_millis(300)).await.unwrap_err();
        assert!(is_timeout(&e), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("sleep 1000") && msg.contains("300ms"), "{msg}");
        let grandchild: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // SIGKILL is delivered at once; the reaper reaps it (we are the
        // subreaper only in the shim, so poll until it is no more running).
        let mut tries = 0;
        while alive(grandchild) && tries < 1000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            tries += 1;
        }
        assert!(!alive(grandchild), "the grandchild {grandchild} survived the deadline");

        let mut c = Command::new("sleep");
        c.arg("1000");
        let e = status(c, Duration::from_millis(100)).await.unwrap_err();
        assert!(is_timeout(&e) && e.to_string().contains("sleep 1000"), "{e}");
    }

    /// The deadline bounds the command only: what it left running in a
    /// session of its own (runc's container process) is not killed.
    #[tokio::test]
    async fn a_detached_process_outlives_its_command() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("detached");
        let script = format!("setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {}", pidfile.display());
        let mut c = Command::new("sh");
        c.args(["-c", &script]);
        assert_eq!(status(c, LONG).await.unwrap(), 0);
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(alive(pid));
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }

    #[test]
    fn deadlines_from_the_environment() {
        assert_eq!(parse_seconds("30"), Some(Duration::from_secs(30)));
        for bad in ["", "0", "-1", "+5", "1.5", "86401", "99999999999999999999", "5s"] {
            assert_eq!(parse_seconds(bad), None, "{bad}");
        }
        let unset = "TORPOR_TEST_DEADLINE_NEVER_SET";
        assert_eq!(deadline_from_env(unset, Duration::from_secs(7)).unwrap(), Duration::from_secs(7));
    }
}
