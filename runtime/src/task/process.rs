//! One supervised process: a container's init or an exec'd process.

use std::path::PathBuf;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::system::stdio::{ProcessIo, StdioConfig};

/// A process's status as containerd names task statuses (what `State`
/// reports; derived from a container's [`crate::task::ContainerState`] or
/// an exec's [`ExecState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Paused,
    Stopped,
}

/// Where an exec'd process is (its exit is in [`Process::exit_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecState {
    /// Registered by Exec, not started.
    Created,
    /// `runc exec` under way.
    Starting,
    Running,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, or 128 + signal.
    pub status: u32,
    pub at: SystemTime,
}

/// A supervised process.
pub struct Process {
    /// Exec id; empty for the container's init process.
    pub exec_id: String,
    /// 0 until the process exists.
    pub pid: i32,
    pub stdio: StdioConfig,
    pub io: ProcessIo,
    /// For an exec: its OCI process spec, written for `runc exec --process`.
    pub spec_file: Option<PathBuf>,
    exit: watch::Sender<Option<ExitInfo>>,
}

impl Process {
    pub fn new(exec_id: &str, stdio: StdioConfig) -> Self {
        Process { exec_id: exec_id.to_string(), pid: 0, stdio, io: ProcessIo::null(), spec_file: None, exit: watch::channel(None).0 }
    }

    pub fn exit_info(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// A receiver that sees the exit once it is recorded.
    pub fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.subscribe()
    }

    /// Records the exit (once; later calls are ignored).
    pub fn set_exited(&mut self, status: u32) -> ExitInfo {
        if let Some(e) = self.exit_info() {
            return e;
        }
        let info = ExitInfo { status, at: SystemTime::now() };
        self.io.close();
        self.exit.send_replace(Some(info));
        info
    }
}

/// Waits until the process behind `rx` has exited.
pub async fn wait_exit(mut rx: watch::Receiver<Option<ExitInfo>>) -> Option<ExitInfo> {
    rx.wait_for(|e| e.is_some()).await.ok().and_then(|e| *e)
}
