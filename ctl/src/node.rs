//! `torporctl node ...`: plumbing of the node installer
//! (deploy/kubernetes/image/node.sh), hidden from `--help`.
//!
//! `node socket-peer PATH` names the process that serves a unix socket: the
//! pid its listener was created by (`SO_PEERCRED` of a connection to it,
//! translated into this PID namespace), which a pod cannot fake without the
//! host's socket path. With `--mount-ns-of 1` that process must also run in
//! PID 1's mount namespace (the host's, seen from a pod with `hostPID`).
//! The installer finds containerd this way, never by scanning processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;

/// A socket that takes longer than this to accept a connection counts as hung.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

#[derive(Subcommand)]
pub enum Cmd {
    /// Print the pid of the process serving the unix socket PATH (its
    /// SO_PEERCRED, in this PID namespace).
    SocketPeer {
        path: PathBuf,
        /// Refuse (exit 1) unless that process runs in the mount namespace
        /// of process PID (1: the host's).
        #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
        mount_ns_of: Option<i32>,
        /// Where procfs is (tests).
        #[arg(long, default_value = "/proc", hide = true)]
        proc_root: PathBuf,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("connect to {}: {source}", path.display())]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("connect to {}: no answer within {}s", path.display(), CONNECT_LIMIT.as_secs())]
    ConnectTimeout { path: PathBuf },
    #[error("SO_PEERCRED of a connection to {}: {source}", path.display())]
    PeerCred { path: PathBuf, source: std::io::Error },
    #[error("{} is served by a process outside this PID namespace (SO_PEERCRED pid {pid:?}): run with the host's PID namespace (hostPID)", path.display())]
    PidNotVisible { path: PathBuf, pid: Option<i32> },
    #[error("read {}: {source}", path.display())]
    ReadNs { path: PathBuf, source: std::io::Error },
    #[error(
        "{} is served by pid {pid}, whose mount namespace {theirs} is not the host's (pid {host_pid}'s, {host}): refusing it (the host's containerd runs in the host's mount namespace; a process in another one, e.g. in a pod, is not it)",
        socket.display()
    )]
    ForeignMountNs { socket: PathBuf, pid: i32, theirs: String, host_pid: i32, host: String },
}

pub fn run(cmd: &Cmd) -> Result<(), String> {
    match cmd {
        Cmd::SocketPeer { path, mount_ns_of, proc_root } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| NodeError::Runtime(e).to_string())?;
            let pid = rt.block_on(socket_peer(path)).map_err(|e| e.to_string())?;
            if let Some(host_pid) = mount_ns_of {
                check_mount_ns(proc_root, *host_pid, pid, path).map_err(|e| e.to_string())?;
            }
            println!("{pid}");
            Ok(())
        }
    }
}

/// The pid of the process that created the listener of the unix socket at
/// `path`, in this PID namespace.
pub async fn socket_peer(path: &Path) -> Result<i32, NodeError> {
    let stream = match tokio::time::timeout(CONNECT_LIMIT, tokio::net::UnixStream::connect(path)).await {
        Err(_) => return Err(NodeError::ConnectTimeout { path: path.to_path_buf() }),
        Ok(Err(source)) => return Err(NodeError::Connect { path: path.to_path_buf(), source }),
        Ok(Ok(s)) => s,
    };
    let cred = stream.peer_cred().map_err(|source| NodeError::PeerCred { path: path.to_path_buf(), source })?;
    // 0: the listener's process is not visible from this PID namespace
    match cred.pid() {
        Some(pid) if pid > 0 => Ok(pid),
        pid => Err(NodeError::PidNotVisible { path: path.to_path_buf(), pid }),
    }
}

/// The mount namespace of `pid` (`mnt:[4026531841]`), from `proc_root`.
fn mount_ns(proc_root: &Path, pid: i32) -> Result<String, NodeError> {
    let path = proc_root.join(pid.to_string()).join("ns/mnt");
    std::fs::read_link(&path)
        .map(|t| t.to_string_lossy().into_owned())
        .map_err(|source| NodeError::ReadNs { path, source })
}

/// Refuses `pid` (the peer of `socket`) unless it runs in the mount
/// namespace of `host_pid` (the host's: PID 1's).
pub fn check_mount_ns(proc_root: &Path, host_pid: i32, pid: i32, socket: &Path) -> Result<(), NodeError> {
    let host = mount_ns(proc_root, host_pid)?;
    let theirs = mount_ns(proc_root, pid)?;
    if theirs == host {
        Ok(())
    } else {
        Err(NodeError::ForeignMountNs { socket: socket.to_path_buf(), pid, theirs, host_pid, host })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn the_peer_of_a_socket_is_its_listeners_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer.sock");
        // a listener that never accepts: the connection completes in the backlog
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let pid = rt().block_on(socket_peer(&path)).unwrap();
        assert_eq!(pid, std::process::id() as i32);
        // and its mount namespace is what the check compares
        let mine = mount_ns(Path::new("/proc"), pid).unwrap();
        assert!(mine.starts_with("mnt:["), "{mine}");
    }

    #[test]
    fn no_listener_is_an_error_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.sock");
        let e = rt().block_on(socket_peer(&absent)).unwrap_err();
        assert!(matches!(e, NodeError::Connect { .. }), "{e:?}");
        assert!(e.to_string().contains(&absent.display().to_string()), "{e}");
        // a socket file whose listener is gone: refused, not a stale pid
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let e = rt().block_on(socket_peer(&stale)).unwrap_err();
        assert!(e.to_string().contains("stale.sock") && e.to_string().contains("refused"), "{e}");
        // a regular file is no socket
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(rt().block_on(socket_peer(&file)).is_err());
    }

    /// A procfs stand-in: `<root>/<pid>/ns/mnt` links to `target`.
    fn fake_proc(root: &Path, pid: i32, target: &str) {
        let ns = root.join(pid.to_string()).join("ns");
        std::fs::create_dir_all(&ns).unwrap();
        std::os::unix::fs::symlink(target, ns.join("mnt")).unwrap();
    }

    #[test]
    fn only_a_process_in_pid_1s_mount_namespace_passes() {
        let proc_root = tempfile::tempdir().unwrap();
        let p = proc_root.path();
        fake_proc(p, 1, "mnt:[4026531841]");
        fake_proc(p, 4242, "mnt:[4026531841]");
        fake_proc(p, 777, "mnt:[4026532999]");
        let sock = Path::new("/run/containerd/containerd.sock");
        check_mount_ns(p, 1, 4242, sock).unwrap();
        let e = check_mount_ns(p, 1, 777, sock).unwrap_err();
        let msg = e.to_string();
        for part in ["/run/containerd/containerd.sock", "pid 777", "mnt:[4026532999]", "pid 1's, mnt:[4026531841]"] {
            assert!(msg.contains(part), "{part} missing: {msg}");
        }
        // another reference process: the same comparison
        check_mount_ns(p, 777, 777, sock).unwrap();
        assert!(check_mount_ns(p, 4242, 777, sock).is_err());
        // a pid that is gone: an error naming what could not be read
        let e = check_mount_ns(p, 1, 999, sock).unwrap_err();
        assert!(e.to_string().contains("999/ns/mnt"), "{e}");
    }

    #[test]
    fn the_real_procfs_tells_mount_namespaces_apart() {
        let proc_root = Path::new("/proc");
        let me = std::process::id() as i32;
        let sock = Path::new("x.sock");
        check_mount_ns(proc_root, me, me, sock).unwrap();
        // a child in a mount namespace of its own
        let mut child = std::process::Command::new("unshare").args(["--mount", "sleep", "60"]).spawn().unwrap();
        let pid = child.id() as i32;
        // unshare has made its namespace once its exe is sleep's
        let start = std::time::Instant::now();
        while std::fs::read_link(format!("/proc/{pid}/exe")).map(|e| !e.ends_with("sleep")).unwrap_or(true) {
            assert!(start.elapsed() < Duration::from_secs(30), "unshare did not exec sleep");
            std::thread::sleep(Duration::from_millis(10));
        }
        let refused = check_mount_ns(proc_root, me, pid, sock);
        child.kill().unwrap();
        child.wait().unwrap();
        let e = refused.unwrap_err();
        assert!(matches!(e, NodeError::ForeignMountNs { .. }), "{e}");
        assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
    }
}
