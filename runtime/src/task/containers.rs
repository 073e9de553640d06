//! The actor's edge toward its containers: what the lifecycle and its
//! triggers ask of the task layer, as one trait ([`Containers`]). [`Tasks`]
//! (runc, CRIU, the exits containerd sees) is the one implementation the
//! shim runs; the lifecycle's unit tests run against a stub.

use async_trait::async_trait;

use crate::error::Result;
use crate::system::runc::{CheckpointOpts, RestoreFrom};
use crate::task::{AppInfo, ExitHold, Status, Tasks};

/// The app containers of one shim, as the actor drives them (see [`Tasks`]
/// for what each call does).
#[async_trait]
pub trait Containers: Send + Sync {
    /// The app containers (not the sandbox), in creation order.
    fn app_containers(&self) -> Vec<String>;
    /// Whether any app container exists.
    fn has_app_containers(&self) -> bool;
    /// What the actor needs to know of app container `id`.
    fn app_info(&self, id: &str) -> Result<AppInfo>;
    /// The pids of the app containers' inits.
    fn app_pids(&self) -> Vec<i32>;
    /// `torpor.dev/idle-after` of the app containers.
    fn idle_after(&self) -> Option<std::time::Duration>;
    /// Its status as containerd sees it.
    fn status(&self, id: &str) -> Option<Status>;
    /// Whether it is checkpointed (its processes gone).
    fn is_suspended(&self, id: &str) -> bool;
    /// Whether an exec session runs in it.
    fn has_live_execs(&self, id: &str) -> Result<bool>;
    /// Whether its dump takes torpor's CRIU options (none of the user's own).
    fn takes_criu_options(&self, id: &str) -> bool;
    /// Its tmpfs mounts made fresh at create (not archived by a suspend).
    fn fresh_tmpfs_mounts(&self, id: &str) -> Result<Vec<String>>;
    /// Whether it says `torpor.dev/on-stop: suspend`.
    fn suspends_on_stop(&self, id: &str) -> bool;
    /// Until `hold` is dropped, the exit of its init waits.
    fn hold_init_exit(&self, id: &str, hold: &ExitHold) -> Result<()>;
    /// Paused in the cgroup freezer.
    async fn pause(&self, id: &str) -> Result<()>;
    /// Thawed (`runc resume`).
    async fn resume(&self, id: &str) -> Result<()>;
    /// Thawed by `thaw` instead of `runc resume`.
    async fn resume_by(&self, id: &str, thaw: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()>;
    /// Checkpointed with CRIU (its processes end; SUSPENDED after).
    async fn dump(&self, id: &str, opts: &CheckpointOpts) -> Result<()>;
    /// Restored from `from`: the new init's pid.
    async fn restore(&self, id: &str, from: &RestoreFrom) -> Result<i32>;
    /// Its restore undone: SUSPENDED again.
    async fn unrestore(&self, id: &str) -> Result<()>;
    /// Started afresh from its bundle, its checkpoint given up.
    async fn cold_start(&self, id: &str) -> Result<i32>;
}

#[async_trait]
impl Containers for Tasks {
    fn app_containers(&self) -> Vec<String> {
        Tasks::app_containers(self)
    }
    fn has_app_containers(&self) -> bool {
        Tasks::has_app_containers(self)
    }
    fn app_info(&self, id: &str) -> Result<AppInfo> {
        Tasks::app_info(self, id)
    }
    fn app_pids(&self) -> Vec<i32> {
        Tasks::app_pids(self)
    }
    fn idle_after(&self) -> Option<std::time::Duration> {
        Tasks::idle_after(self)
    }
    fn status(&self, id: &str) -> Option<Status> {
        Tasks::status(self, id)
    }
    fn is_suspended(&self, id: &str) -> bool {
        Tasks::is_suspended(self, id)
    }
    fn has_live_execs(&self, id: &str) -> Result<bool> {
        Tasks::has_live_execs(self, id)
    }
    fn takes_criu_options(&self, id: &str) -> bool {
        Tasks::takes_criu_options(self, id)
    }
    fn fresh_tmpfs_mounts(&self, id: &str) -> Result<Vec<String>> {
        Tasks::fresh_tmpfs_mounts(self, id)
    }
    fn suspends_on_stop(&self, id: &str) -> bool {
        Tasks::suspends_on_stop(self, id)
    }
    fn hold_init_exit(&self, id: &str, hold: &ExitHold) -> Result<()> {
        Tasks::hold_init_exit(self, id, hold)
    }
    async fn pause(&self, id: &str) -> Result<()> {
        Tasks::pause(self, id).await
    }
    async fn resume(&self, id: &str) -> Result<()> {
        Tasks::resume(self, id).await
    }
    async fn resume_by(&self, id: &str, thaw: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()> {
        Tasks::resume_by(self, id, thaw).await
    }
    async fn dump(&self, id: &str, opts: &CheckpointOpts) -> Result<()> {
        Tasks::dump(self, id, opts).await
    }
    async fn restore(&self, id: &str, from: &RestoreFrom) -> Result<i32> {
        Tasks::restore(self, id, from).await
    }
    async fn unrestore(&self, id: &str) -> Result<()> {
        Tasks::unrestore(self, id).await
    }
    async fn cold_start(&self, id: &str) -> Result<i32> {
        Tasks::cold_start(self, id).await
    }
}
