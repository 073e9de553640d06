//! The plumbing between containerd's stdio FIFOs and a container process.
//!
//! Without a terminal, the process gets pipes; the shim copies them to and
//! from the FIFOs containerd created (so the process never blocks on a FIFO
//! nobody reads, and containerd can reattach). With a terminal, runc sends
//! the pty master over a console socket and the shim copies the master.
//! An empty FIFO path means /dev/null for that stream.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::fcntl::OFlag;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::error::{Error, IoContext, Result};
use crate::system::runc::ProcessStdio;

/// How long to wait, after a process exited, for its output to drain. A
/// grandchild that kept the pipe open must not hold up the exit forever.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The stdio containerd asked for.
#[derive(Debug, Clone, Default)]
pub struct StdioConfig {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// Sets up stdio for a process, runs the runc command that starts it
/// (`run` gets the console socket, if any, and the stdio to hand to runc),
/// then wires the process's IO to containerd's FIFOs.
pub async fn launch<F, Fut>(config: &StdioConfig, run: F) -> Result<ProcessIo>
where
    F: FnOnce(Option<PathBuf>, ProcessStdio) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let (mut prepared, runc_stdio) = prepare(config)?;
    let socket = prepared.console_socket();
    // Aborted (the listener closed, its file removed) however this ends.
    let mut console = AbortOnDrop(prepared.accept_console());
    if let Err(e) = run(socket, runc_stdio).await {
        // runc failed before (or without) sending the pty master: nothing
        // will connect; stop accepting now, not never.
        if let Some(h) = console.0.take() {
            h.abort();
            let _ = h.await;
        }
        return Err(e);
    }
    let master = match console.0.take() {
        Some(h) => {
            // runc sent the master before it returned: it is there, or never.
            let abort = h.abort_handle();
            match tokio::time::timeout(CONSOLE_DEADLINE, h).await {
                Ok(r) => Some(r.map_err(|e| Error::InvalidArgument(format!("console: {e}")))??),
                Err(_) => {
                    abort.abort();
                    return Err(Error::InvalidArgument(format!(
                        "runc returned but sent no pty master on the console socket within {CONSOLE_DEADLINE:?}"
                    )));
                }
            }
        }
        None => None,
    };
    prepared.start(master)
}

/// How long, after runc returned, the pty master may take to arrive.
const CONSOLE_DEADLINE: Duration = Duration::from_secs(10);

/// A task aborted when dropped.
struct AbortOnDrop<T>(Option<tokio::task::JoinHandle<T>>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

/// Stdio being set up: what runc is handed, and what the shim keeps.
pub struct Prepared {
    config: StdioConfig,
    stdin_writer: Option<OwnedFd>,
    stdout_reader: Option<OwnedFd>,
    stderr_reader: Option<OwnedFd>,
    console: Option<ConsoleSocket>,
}

/// A live process's stdio, owned by the shim.
pub struct ProcessIo {
    /// The shim's own write end of the stdin FIFO: while it is open the copy
    /// never sees a premature EOF; CloseIO drops it, and the copy then drains
    /// what containerd wrote and closes the process's stdin.
    stdin_keepalive: Mutex<Option<File>>,
    /// The shim's own handles on the stdout/stderr FIFOs: containerd sees EOF
    /// only when the process really ended, not when a suspend stopped it.
    out_keepalive: Vec<File>,
    console: Option<File>,
    done: Vec<oneshot::Receiver<()>>,
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).io_context(|| "create pipe".into())
}

/// Sets up pipes (or the console socket) for a process.
fn prepare(config: &StdioConfig) -> Result<(Prepared, ProcessStdio)> {
    let mut p = Prepared { config: config.clone(), stdin_writer: None, stdout_reader: None, stderr_reader: None, console: None };
    if config.terminal {
        p.console = Some(ConsoleSocket::new()?);
        let stdio = ProcessStdio { stdin: Stdio::null(), stdout: Stdio::null(), stderr: Stdio::null() };
        return Ok((p, stdio));
    }
    let stdin = if config.stdin.is_empty() {
        Stdio::null()
    } else {
        let (r, w) = pipe()?;
        p.stdin_writer = Some(w);
        Stdio::from(r)
    };
    let out = |path: &str, slot: &mut Option<OwnedFd>| -> Result<Stdio> {
        if path.is_empty() {
            return Ok(Stdio::null());
        }
        let (r, w) = pipe()?;
        *slot = Some(r);
        Ok(Stdio::from(w))
    };
    let stdout = out(&config.stdout, &mut p.stdout_reader)?;
    let stderr = out(&config.stderr, &mut p.stderr_reader)?;
    Ok((p, ProcessStdio { stdin, stdout, stderr }))
}

impl Prepared {
    /// The console socket to pass to runc, for a terminal process.
    fn console_socket(&self) -> Option<PathBuf> {
        self.console.as_ref().map(|c| c.path.clone())
    }

    /// Starts accepting the pty master; await the result after runc
    /// returned, or abort it (which closes the socket) if runc failed.
    fn accept_console(&mut self) -> Option<tokio::task::JoinHandle<Result<OwnedFd>>> {
        let console = self.console.take()?;
        Some(tokio::spawn(console.receive()))
    }

    /// Starts the copies. `master` is the pty master for a terminal process.
    fn start(self, master: Option<OwnedFd>) -> Result<ProcessIo> {
        let mut io = ProcessIo::null();
        let cfg = self.config;
        for fifo in [&cfg.stdout, &cfg.stderr] {
            if !fifo.is_empty() {
                let f = OpenOptions::new().read(true).write(true).open(fifo).io_context(|| format!("open stdio fifo {fifo}"))?;
                io.out_keepalive.push(f);
            }
        }
        if let Some(master) = master {
            let master = File::from(master);
            let reader = master.try_clone().io_context(|| "dup pty master".into())?;
            let writer = master.try_clone().io_context(|| "dup pty master".into())?;
            io.console = Some(master);
            if !cfg.stdout.is_empty() {
                io.done.push(copy_thread(reader, cfg.stdout.clone()));
            }
            if !cfg.stdin.is_empty() {
                io.stdin_keepalive = Mutex::new(Some(stdin_thread(&cfg.stdin, writer)?));
            }
            return Ok(io);
        }
        if let Some(w) = self.stdin_writer {
            io.stdin_keepalive = Mutex::new(Some(stdin_thread(&cfg.stdin, File::from(w))?));
        }
        if let Some(r) = self.stdout_reader {
            io.done.push(copy_task(r, cfg.stdout.clone())?);
        }
        if let Some(r) = self.stderr_reader {
            io.done.push(copy_task(r, cfg.stderr.clone())?);
        }
        Ok(io)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies a pipe to a FIFO on the tokio runtime.
fn copy_task(reader: OwnedFd, fifo: String) -> Result<oneshot::Receiver<()>> {
    let mut src = tokio::net::unix::pipe::Receiver::from_owned_fd(reader).io_context(|| "register output pipe".into())?;
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        // read_write keeps the open from failing (ENXIO) when containerd has
        // not opened its end yet; containerd still sees EOF when we close.
        match tokio::net::unix::pipe::OpenOptions::new().read_write(true).open_sender(&fifo) {
            Ok(mut dst) => {
                if let Err(e) = tokio::io::copy(&mut src, &mut dst).await {
                    debug!("copy to {fifo}: {e}");
                }
                let _ = dst.flush().await;
            }
            Err(e) => warn!("open stdio fifo {fifo}: {e}"),
        }
        let _ = tx.send(());
    });
    Ok(rx)
}

/// Copies a pty master to a FIFO on a thread (a pty is not a pipe tokio takes).
fn copy_thread(mut src: File, fifo: String) -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        match OpenOptions::new().read(true).write(true).open(&fifo) {
            Ok(mut dst) => {
                let mut buf = [0u8; 32 * 1024];
                loop {
                    match src.read(&mut buf) {
                        Ok(0) | Err(_) => break, // EIO once the pty's last user is gone
                        Ok(n) => {
                            if dst.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => warn!("open stdio fifo {fifo}: {e}"),
        }
        let _ = tx.send(());
    });
    rx
}

/// Copies the stdin FIFO into the process until every writer (containerd
/// and the returned keep-alive) has closed it; then the process sees EOF
/// (on a terminal: the VEOF character, ^D, as a user would type it).
fn stdin_thread(fifo: &str, mut dst: File) -> Result<File> {
    // Open the read side without blocking, then our own write side, then
    // make reads blocking: the FIFO reports EOF only once both are closed.
    let src = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(fifo).io_context(|| format!("open stdin fifo {fifo}"))?;
    let keepalive = OpenOptions::new().write(true).open(fifo).io_context(|| format!("open stdin fifo {fifo} for writing"))?;
    let flags = nix::fcntl::fcntl(&src, nix::fcntl::FcntlArg::F_GETFL).io_context(|| "fcntl F_GETFL".into())?;
    let mut flags = OFlag::from_bits_truncate(flags);
    flags.remove(OFlag::O_NONBLOCK);
    nix::fcntl::fcntl(&src, nix::fcntl::FcntlArg::F_SETFL(flags)).io_context(|| "fcntl F_SETFL".into())?;
    let mut src = src;
    std::thread::spawn(move || {
        let mut buf = [0u8; 32 * 1024];
        loop {
            match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if dst.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
        if is_tty(&dst) {
            let _ = dst.write_all(&[4]);
        }
    });
    Ok(keepalive)
}

fn is_tty(f: &File) -> bool {
    nix::unistd::isatty(f).unwrap_or(false)
}

impl std::fmt::Debug for ProcessIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessIo").field("terminal", &self.console.is_some()).finish_non_exhaustive()
    }
}

impl ProcessIo {
    /// A process with no stdio at all.
    pub fn null() -> Self {
        ProcessIo { stdin_keepalive: Mutex::new(None), out_keepalive: Vec::new(), console: None, done: Vec::new() }
    }

    /// CloseIO: once containerd's writer is closed too, the process sees
    /// EOF on stdin, after everything written before it.
    pub fn close_stdin(&self) {
        *lock(&self.stdin_keepalive) = None;
    }

    /// ResizePty.
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        let Some(c) = &self.console else {
            return Err(Error::FailedPrecondition("the process has no terminal".into()));
        };
        let ws = libc::winsize {
            ws_row: height.min(u16::MAX as u32) as u16,
            ws_col: width.min(u16::MAX as u32) as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize struct that lives for the call.
        let rc = unsafe { libc::ioctl(c.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc < 0 {
            return Err(Error::Io { context: "resize pty".into(), source: std::io::Error::last_os_error() });
        }
        Ok(())
    }

    /// Takes what [`Drain::wait`] waits for, so the caller can wait without
    /// holding a lock on the process.
    pub fn take_drain(&mut self) -> Drain {
        Drain { done: std::mem::take(&mut self.done) }
    }

    /// After the process exited: nothing more goes to its stdin, and its
    /// output FIFOs close once the copies end.
    pub fn close(&mut self) {
        *lock(&self.stdin_keepalive) = None;
        self.out_keepalive.clear();
    }
}

/// The end of a process's output copies.
pub struct Drain {
    done: Vec<oneshot::Receiver<()>>,
}

impl Drain {
    /// Waits until the output is drained (bounded by [`DRAIN_TIMEOUT`]).
    pub async fn wait(self) {
        let all = async {
            for r in self.done {
                let _ = r.await;
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, all).await.is_err() {
            debug!("stdio still open {DRAIN_TIMEOUT:?} after exit; not waiting longer");
        }
    }
}

/// A unix socket on which runc sends a terminal's pty master.
struct ConsoleSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

static CONSOLE_SEQ: AtomicU64 = AtomicU64::new(0);

impl ConsoleSocket {
    fn new() -> Result<Self> {
        let n = CONSOLE_SEQ.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("torpor-pty-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener =
            UnixListener::bind(&path).and_then(|l| l.set_nonblocking(true).map(|()| l)).and_then(tokio::net::UnixListener::from_std);
        match listener {
            // Dropped with this (an aborted accept): the file goes too.
            Ok(listener) => Ok(ConsoleSocket { listener, path }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e).io_context(|| format!("bind console socket {path:?}"))
            }
        }
    }

    /// Accepts runc's connection (cancellable: dropping the future closes
    /// the socket), then receives the master it sends.
    async fn receive(self) -> Result<OwnedFd> {
        let (stream, _) = self.listener.accept().await.io_context(|| "accept console socket".into())?;
        let stream = stream.into_std().io_context(|| "console stream".into())?;
        stream.set_nonblocking(false).io_context(|| "console stream blocking".into())?;
        // runc sends the master right after it connects, or closes.
        let r = tokio::task::spawn_blocking(move || receive_master(&stream))
            .await
            .map_err(|e| Error::InvalidArgument(format!("console: {e}")))?;
        drop(self);
        r
    }
}

fn receive_master(stream: &std::os::unix::net::UnixStream) -> Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    let mut buf = [0u8; 4096];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
    let msg = recvmsg::<UnixAddr>(stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .io_context(|| "receive pty master".into())?;
    let mut master = None;
    for cmsg in msg.cmsgs().io_context(|| "read control message".into())? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: the kernel just installed these fds for us; each
                // is owned once (the first kept, any other closed).
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                master.get_or_insert(fd);
            }
        }
    }
    master.ok_or_else(|| Error::InvalidArgument("runc sent no pty master on the console socket".into()))
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Once the accept thread blocked forever when runc failed before it
    /// connected, holding the socket (and its file) open.
    #[tokio::test]
    async fn a_runc_failing_early_leaves_no_console_socket() {
        let cfg = StdioConfig { terminal: true, ..Default::default() };
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        let r = launch(&cfg, move |socket, _stdio| {
            *lock(&s) = socket;
            async { Err(Error::InvalidArgument("runc create failed early".into())) }
        })
        .await;
        assert!(r.is_err());
        let path = lock(&seen).clone().expect("a console socket was given to runc");
        assert!(!path.exists(), "{path:?} left behind");
        assert!(std::os::unix::net::UnixStream::connect(&path).is_err(), "{path:?} still accepts");
    }

    /// A runc that sends the pty master: the process gets its terminal.
    #[tokio::test]
    async fn the_pty_master_sent_by_runc_is_received() {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
        let cfg = StdioConfig { terminal: true, ..Default::default() };
        let io = launch(&cfg, |socket, _stdio| async move {
            let socket = socket.expect("a console socket");
            let pty = nix::pty::openpty(None, None).unwrap();
            let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            let fds = [pty.master.as_raw_fd()];
            sendmsg::<UnixAddr>(
                s.as_raw_fd(),
                &[std::io::IoSlice::new(b"pty")],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            )
            .unwrap();
            Ok(())
        })
        .await
        .unwrap();
        io.resize(80, 24).unwrap();
    }
}
