//! One container of the shim: its bundle, runc handle, init process, execs,
//! and the one [`ContainerState`] that says where it is.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::oci::annotations::ActorSpec;
use crate::system::runc::Runc;
use crate::system::stdio::ProcessIo;
use crate::task::process::{ExecState, Process, Status};

/// What an update of a container's resources applies to
/// ([`ContainerState::update_target`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateTarget {
    /// runc's container (`runc update`).
    Live,
    /// What its restore starts from (no runc container, no cgroup).
    Checkpointed,
    /// A transition under way: after it.
    Busy,
    Stopped,
}

/// Where a container is. Every external command that changes a container
/// (runc create/start/pause/resume, a dump, a restore) first moves it into
/// a *transitional* state (`Creating`, `Starting`, `Pausing`, `Thawing`,
/// `Dumping`, `Restoring`) under the table's lock, runs outside the lock,
/// and then settles it. Readers (State, Pids, Stats) answer from the state
/// at any time; writers that must not overlap a transition wait for it to
/// settle ([`crate::task::Tasks::settled`]).
#[derive(Debug)]
pub enum ContainerState {
    /// `runc create` under way.
    Creating,
    /// Created (`runc create` done), waiting for Start.
    Created,
    /// Created from a checkpoint image (containerd's, or a snapshot kept for
    /// its identity): restored at Start instead of `runc start`.
    RestorePending {
        image: PathBuf,
    },
    /// `runc start` under way.
    Starting,
    Running,
    /// `runc pause` under way (from Running).
    Pausing,
    /// In the cgroup freezer (Pause, or the actor frozen).
    Paused,
    /// `runc resume` under way (from Paused).
    Thawing,
    /// A suspend's dump under way: CRIU has the processes. A failed dump
    /// goes back to `back` (Running or Paused).
    Dumping {
        back: Box<ContainerState>,
    },
    /// Checkpointed by a suspend: no process, but RUNNING to containerd;
    /// `io` keeps containerd's FIFOs open (no EOF, no exit).
    Suspended {
        io: ProcessIo,
    },
    /// A restore under way; a failed one goes back to `back` (Suspended or
    /// RestorePending).
    Restoring {
        back: Box<ContainerState>,
    },
    /// init exited.
    Stopped,
}

impl ContainerState {
    /// How containerd sees it.
    pub fn status(&self) -> Status {
        use ContainerState::*;
        match self {
            Creating | Created | RestorePending { .. } | Starting => Status::Created,
            Running | Pausing | Dumping { .. } | Suspended { .. } | Restoring { .. } => Status::Running,
            Paused | Thawing => Status::Paused,
            Stopped => Status::Stopped,
        }
    }

    /// An external command is changing the container right now.
    pub fn in_transition(&self) -> bool {
        use ContainerState::*;
        matches!(self, Creating | Starting | Pausing | Thawing | Dumping { .. } | Restoring { .. })
    }

    /// The container has no process of its own: a suspend dumped it (or is
    /// dumping it, or its restore is not done yet). Its init's exit is then
    /// not an exit, and stats are zero.
    pub fn checkpointed(&self) -> bool {
        matches!(self, ContainerState::Dumping { .. } | ContainerState::Suspended { .. } | ContainerState::Restoring { .. })
    }

    /// What an update of the container's resources applies to.
    pub fn update_target(&self) -> UpdateTarget {
        use ContainerState::*;
        match self {
            Created | Running | Paused => UpdateTarget::Live,
            Suspended { .. } | RestorePending { .. } => UpdateTarget::Checkpointed,
            Stopped => UpdateTarget::Stopped,
            Creating | Starting | Pausing | Thawing | Dumping { .. } | Restoring { .. } => UpdateTarget::Busy,
        }
    }

    /// A short name, for errors and logs.
    pub fn name(&self) -> &'static str {
        use ContainerState::*;
        match self {
            Creating => "creating",
            Created => "created",
            RestorePending { .. } => "created (to be restored)",
            Starting => "starting",
            Running => "running",
            Pausing => "pausing",
            Paused => "paused",
            Thawing => "thawing",
            Dumping { .. } => "being dumped",
            Suspended { .. } => "suspended",
            Restoring { .. } => "being restored",
            Stopped => "stopped",
        }
    }
}

/// An exec'd process of a container.
pub struct Exec {
    pub process: Process,
    pub state: ExecState,
}

impl Exec {
    pub fn status(&self) -> Status {
        if self.process.exit_info().is_some() {
            return Status::Stopped;
        }
        match self.state {
            ExecState::Created | ExecState::Starting => Status::Created,
            ExecState::Running => Status::Running,
        }
    }
}

/// One container.
pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Runc,
    pub init: Process,
    pub state: ContainerState,
    pub execs: HashMap<String, Exec>,
    /// The actor configuration its annotations gave (app containers).
    pub actor: ActorSpec,
    /// Whether the container has its own pid namespace (if not, its
    /// processes are killed when init exits, as runc-v2 does).
    pub own_pid_ns: bool,
    /// Its cgroup (found at create and restore): its stats, and its OOM
    /// kills at exit.
    pub cgroup: Option<crate::system::cgroup::Cgroup>,
    /// The OOM kills in that cgroup, watched while it lives (under runc's
    /// systemd driver the cgroup is gone by the time the init's exit is
    /// handled).
    pub oom: Option<crate::system::cgroup::OomWatch>,
    /// The CRI sandbox (pause) container: never part of the actor.
    pub sandbox: bool,
    /// The pod's network namespace (a path: CRI's sandbox netns), if joined.
    pub netns: Option<PathBuf>,
    /// The pod's IPC namespace (a path), if joined: the SysV objects a dump
    /// took are removed from it.
    pub ipcns: Option<PathBuf>,
    /// Its rootfs overlay's upper directory, captured at each suspend.
    pub rootfs_upper: Option<PathBuf>,
    /// Set while a restore of it may still be undone (its memory streams
    /// in): its init's exit waits until the sender is dropped (see
    /// [`crate::task::ExitHold`]).
    pub exit_hold: Option<tokio::sync::watch::Receiver<()>>,
    /// Held by an update of its resources, and by a dump or a restore
    /// from before it takes or reads the restore template until it is
    /// settled: an update is applied either to the running container or
    /// to what its restore starts from, never lost in between.
    pub resources: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl Container {
    /// Its init now runs as `pid`: its cgroup is found, and its OOM kills
    /// watched from now on (a watch that cannot be set up is logged; the
    /// exit then reads the counter, where the cgroup is still there).
    pub fn placed(&mut self, pid: i32) {
        use crate::system::cgroup;
        self.cgroup = cgroup::cgroup_of(pid);
        self.oom = self.cgroup.as_ref().and_then(|cg| {
            cgroup::OomWatch::start(cg).map_err(|e| tracing::debug!(container = self.id.as_str(), "no watch of OOM kills: {e}")).ok()
        });
    }

    /// How many processes the OOM killer killed in its cgroup: the most
    /// its watch saw, or the counter read now.
    pub fn oom_kills(&self) -> u64 {
        let watched = self.oom.as_ref().map_or(0, crate::system::cgroup::OomWatch::kills);
        let now = self.cgroup.as_ref().map_or(0, crate::system::cgroup::oom_kills);
        watched.max(now)
    }

    /// The process `exec_id` (empty: init).
    pub fn process(&self, exec_id: &str) -> Result<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs.get(exec_id).map(|e| &e.process).ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {}", self.id)))
    }

    pub fn process_mut(&mut self, exec_id: &str) -> Result<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        let id = &self.id;
        self.execs.get_mut(exec_id).map(|e| &mut e.process).ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {id}")))
    }

    /// The containerd status of process `exec_id`.
    pub fn status_of(&self, exec_id: &str) -> Result<Status> {
        if exec_id.is_empty() {
            return Ok(self.state.status());
        }
        self.execs.get(exec_id).map(Exec::status).ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {}", self.id)))
    }

    /// An exec session is running (a suspend cannot dump it).
    pub fn has_live_execs(&self) -> bool {
        self.execs.values().any(|e| e.process.exit_info().is_none() && e.state != ExecState::Created)
    }

    /// An app container that runs (or ran and is checkpointed): a member of
    /// the actor's lifecycle.
    pub fn is_live_app(&self) -> bool {
        !self.sandbox
            && self.init.exit_info().is_none()
            && !matches!(
                self.state,
                ContainerState::Creating | ContainerState::Created | ContainerState::RestorePending { .. } | ContainerState::Starting
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_containerd_sees_of_each_state() {
        use ContainerState::*;
        let cases: Vec<(ContainerState, Status, bool, bool)> = vec![
            (Creating, Status::Created, true, false),
            (Created, Status::Created, false, false),
            (RestorePending { image: "/i".into() }, Status::Created, false, false),
            (Starting, Status::Created, true, false),
            (Running, Status::Running, false, false),
            (Pausing, Status::Running, true, false),
            (Paused, Status::Paused, false, false),
            (Thawing, Status::Paused, true, false),
            (Dumping { back: Box::new(Paused) }, Status::Running, true, true),
            (Suspended { io: ProcessIo::null() }, Status::Running, false, true),
            (Restoring { back: Box::new(Suspended { io: ProcessIo::null() }) }, Status::Running, true, true),
            (Stopped, Status::Stopped, false, false),
        ];
        for (state, status, transition, checkpointed) in cases {
            assert_eq!(state.status(), status, "{}", state.name());
            assert_eq!(state.in_transition(), transition, "{}", state.name());
            assert_eq!(state.checkpointed(), checkpointed, "{}", state.name());
        }
    }
}
