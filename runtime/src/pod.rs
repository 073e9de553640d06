//! The facade the shim sees: [`Runtime`], all containers of one shim (one
//! pod) and their actor. Each containerd request is one method here that
//! composes the layers below — the task layer for the containers, the
//! lifecycle for the actor — so that neither of them calls the other
//! upward. The triggers are started here too.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::info;

use crate::actor::identity::Identity;
use crate::actor::record::Record;
use crate::actor::report::Trigger;
use crate::actor::store_client::SnapshotStore;
use crate::error::{Error, Result};
use crate::lifecycle::{self, adopt, Actor};
use crate::oci::annotations::{self, ActorSpec};
use crate::oci::bundle;
use crate::oci::spec::{check_image, read_spec, ContainerSpec};
use crate::system::runc::CheckpointOpts;
use crate::system::runc_options::RuncOptions;
use crate::system::stdio::StdioConfig;
use crate::task::{Event, ExitInfo, NewContainer, ProcessState, Status, Tasks};
use crate::trigger;

/// What `create` needs.
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub stdio: StdioConfig,
    /// Restore this checkpoint image directory at start.
    pub checkpoint: Option<PathBuf>,
    /// The upper directory of the rootfs overlay (its changes, which a
    /// suspend carries with the checkpoint: [`crate::system::rootfs`]).
    pub rootfs_upper: Option<PathBuf>,
    /// containerd's runtime options for the torpor runtime.
    pub runc_options: RuncOptions,
}

/// All containers of this shim, and their actor.
#[derive(Clone)]
pub struct Runtime {
    tasks: Tasks,
    actor: Actor,
    /// The node's snapshot store (its clone policy; the actor has its own
    /// handle, [`crate::actor::snapshots::Snapshots`]).
    store: SnapshotStore,
}

impl Runtime {
    /// Creates the runtime and starts its exit monitor and its activation
    /// trigger. `namespace` is the containerd namespace (runc state is kept
    /// per namespace).
    pub fn new(namespace: &str, events: mpsc::UnboundedSender<Event>) -> Self {
        let tasks = Tasks::new(namespace, events);
        let store = SnapshotStore::new();
        let (wake, wake_rx) = mpsc::unbounded_channel();
        let actor = Actor::new(Arc::new(tasks.clone()), Arc::new(store.clone()), lifecycle::Config::from_env(), wake);
        trigger::activation::start(&actor, wake_rx);
        Runtime { tasks, actor, store }
    }

    /// Starts the triggers of shim `group`'s actor: the in-container
    /// request and idle policy, and the lease fence.
    pub fn start_triggers(&self, group: &str) {
        trigger::policy::start(&self.actor, group.to_string());
        trigger::fence::start(&self.actor, group.to_string());
    }

    /// Create: validates the torpor annotations, joins the actor (its
    /// claim and lease at the first app container), finds a snapshot kept
    /// for its identity, then `runc create` (or a create to be restored at
    /// Start).
    pub async fn create(&self, req: CreateRequest) -> Result<i32> {
        let r = self.create_inner(req).await;
        if r.is_err() {
            // A failed create leaves no actor state behind.
            self.actor.forget_if_empty().await;
        }
        r
    }

    /// A restore source of another namespace than the pod's is a clone
    /// across tenants: refused unless the node's policy (the daemon's
    /// `[tenancy] clone_source_namespaces`) lists that namespace. Checked
    /// before any lookup, so the answer says nothing of what the other
    /// namespace holds.
    async fn check_clone_source(&self, actor: &ActorSpec) -> Result<()> {
        let Some(foreign) = actor.foreign_clone_source() else { return Ok(()) };
        let allowed = self.store.clone_source_namespaces().await.map_err(|e| e.context("the node's clone policy"))?;
        if allowed.iter().any(|n| n == foreign) {
            return Ok(());
        }
        let (ns, src) =
            (actor.namespace.as_deref().unwrap_or_default(), actor.restore_from.as_ref().map(ToString::to_string).unwrap_or_default());
        let listed = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
        Err(Error::InvalidAnnotation {
            key: annotations::RESTORE_FROM.into(),
            value: src,
            reason: format!(
                "a pod of namespace {ns} may clone actors of its own namespace, and of the namespaces this node allows ([tenancy] clone_source_namespaces of torpor-snapshotter: {listed})"
            ),
        })
    }

    async fn create_inner(&self, req: CreateRequest) -> Result<i32> {
        let spec = ContainerSpec::of(&read_spec(&req.bundle)?);
        let actor = ActorSpec::from_annotations(&spec.annotations)?;
        if self.tasks.contains(&req.id) {
            return Err(Error::AlreadyExists(format!("container {}", req.id)));
        }
        let mut restore_from = None;
        let mut adopted = None;
        if !spec.sandbox {
            self.check_clone_source(&actor).await?;
            let group = spec.group(&req.id);
            let explicit = spec.annotations.contains_key(annotations::ACTOR);
            self.actor.init(&group, &actor, explicit).await?;
            bundle::adapt_spec(&req.bundle, &group)?;
            let identity = Identity::of(actor.actor.as_deref(), &spec.annotations, &req.id);
            let name = identity.as_ref().map(|i| i.container.clone()).unwrap_or_else(|| req.id.clone());
            self.actor.add_member(&req.id, &name, spec.cgroups_path.clone())?;
            if let (Some(identity), None) = (&identity, &req.checkpoint) {
                adopted = self.actor.adopt(&req.id, identity, actor.restore_from.as_ref()).await?;
            }
            if let Some(a) = &adopted {
                // The files it wrote, before its processes come back, and
                // the CRIU options of a restore into a new pod.
                let prepared = adopt::apply_rootfs_diff(&req.bundle, a).await.and_then(|_| bundle::recovery_criu_config(&req.bundle, true));
                if let Err(e) = prepared {
                    self.actor.give_back(&req.id, a, false, &e).await;
                    return Err(e);
                }
                restore_from = Some(a.image.clone());
            }
        }
        if let (None, Some(image)) = (&restore_from, &req.checkpoint) {
            // As runc-v2: a container created from a checkpoint is restored at Start.
            check_image(image)?;
            info!(container = req.id.as_str(), image = ?image, "container created from a checkpoint");
            restore_from = Some(image.clone());
        }
        let created = self
            .tasks
            .create(NewContainer {
                id: req.id.clone(),
                bundle: req.bundle,
                stdio: req.stdio,
                actor,
                own_pid_ns: spec.own_pid_ns,
                sandbox: spec.sandbox,
                netns: spec.netns,
                ipcns: spec.ipcns,
                rootfs_upper: req.rootfs_upper,
                restore_from,
                runc_options: req.runc_options,
            })
            .await;
        match (created, adopted) {
            (Ok(pid), Some(a)) => {
                self.actor.hold_adoption(&req.id, a);
                Ok(pid)
            }
            (Ok(pid), None) => Ok(pid),
            (Err(e), Some(a)) => {
                self.actor.give_back(&req.id, &a, false, &e).await;
                Err(e)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// Start of init (`runc start`, or the restore of a container created
    /// from a checkpoint) or of an exec.
    pub async fn start(&self, id: &str, exec_id: &str) -> Result<i32> {
        if exec_id.is_empty() {
            if let Some(image) = self.tasks.restore_pending(id)? {
                let bundle = self.tasks.state(id, "")?.bundle;
                return self.actor.start_restored(id, &image, &bundle).await;
            }
            let pid = self.tasks.start(id, "").await?;
            self.actor.ran(id);
            return Ok(pid);
        }
        self.tasks.start(id, exec_id).await
    }

    /// Checkpoint of a running or paused container into `opts.image_path`.
    pub async fn checkpoint(&self, id: &str, opts: CheckpointOpts) -> Result<()> {
        self.tasks.checkpoint(id, opts).await
    }

    /// Exec: registers the process; `start` runs it. An exec into a
    /// suspended or frozen actor wakes it first.
    pub async fn exec(&self, id: &str, exec_id: &str, process_json: &[u8], stdio: StdioConfig) -> Result<()> {
        self.actor.ensure_running(id).await?;
        self.tasks.exec(id, exec_id, process_json, stdio)
    }

    pub async fn state(&self, id: &str, exec_id: &str) -> Result<ProcessState> {
        let mut s = self.tasks.state(id, exec_id)?;
        // An actor frozen in the freeze tier is RUNNING to containerd, as a
        // suspended one is (CRI has no paused state: after a containerd
        // restart it took a PAUSED task for UNKNOWN).
        if exec_id.is_empty() && s.status == Status::Paused && self.actor.frozen_in_tier(id) {
            s.status = Status::Running;
        }
        Ok(s)
    }

    /// Kill: a signal to init (`all`: every process) or to an exec. A stop
    /// of an actor with `torpor.dev/on-stop: suspend` suspends it first; a
    /// suspended container has no process, its stop is recorded as an exit.
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        if exec_id.is_empty() && signal == libc::SIGTERM as u32 {
            self.actor.suspend_on_stop(id).await;
        }
        if exec_id.is_empty() {
            // A suspend (or resume) under way ends first: a stop that landed
            // between a dump and its held ports would leave the ports held
            // for a container that is gone (its restart could not bind them).
            self.actor.settled().await;
            if let Some(stopped) = self.tasks.kill_suspended(id, signal) {
                if stopped {
                    // Nothing to wake any more: release the held ports.
                    self.actor.release_held_ports();
                }
                return Ok(());
            }
        }
        self.tasks.kill(id, exec_id, signal, all).await
    }

    /// Delete: an exited exec, or the container (which must not be running).
    pub async fn delete(&self, id: &str, exec_id: &str) -> Result<(i32, ExitInfo)> {
        let deleted = self.tasks.delete(id, exec_id).await?;
        if exec_id.is_empty() {
            // Deleted before its start: the kept checkpoint was not used.
            self.actor.deleted(id).await;
            self.actor.forget_if_empty().await;
        }
        Ok(deleted)
    }

    pub async fn pause(&self, id: &str) -> Result<()> {
        self.tasks.pause(id).await
    }

    pub async fn resume(&self, id: &str) -> Result<()> {
        self.tasks.resume(id).await
    }

    /// Pids of the container, with the exec id of those that are execs.
    pub async fn pids(&self, id: &str) -> Result<Vec<(i32, Option<String>)>> {
        self.tasks.pids(id).await
    }

    pub async fn close_io(&self, id: &str, exec_id: &str) -> Result<()> {
        self.tasks.close_io(id, exec_id)
    }

    pub async fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        self.tasks.resize_pty(id, exec_id, width, height)
    }

    pub async fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        self.tasks.update(id, resources_json).await
    }

    pub async fn stats(&self, id: &str) -> Result<crate::system::cgroup::Stats> {
        self.tasks.stats(id)
    }

    /// A receiver that sees the exit of the process.
    pub async fn exit_watch(&self, id: &str, exec_id: &str) -> Result<tokio::sync::watch::Receiver<Option<ExitInfo>>> {
        self.tasks.exit_watch(id, exec_id)
    }

    /// Pid of a container's init, for Connect.
    pub async fn init_pid(&self, id: &str) -> Result<i32> {
        self.tasks.init_pid(id)
    }

    pub async fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    // ------------------------------------------------ the actor (torporctl)

    /// The actor's record, if the shim has app containers.
    pub async fn actor_status(&self) -> Option<Record> {
        self.actor.status()
    }

    /// SUSPENDED (see [`crate::lifecycle::suspend`]).
    pub async fn suspend(&self) -> Result<Record> {
        self.actor.suspend(Trigger::Api).await
    }

    /// RUNNING again (see [`crate::lifecycle::resume`]).
    pub async fn resume_actor(&self) -> Result<Record> {
        self.actor.resume(Trigger::Api).await
    }

    /// FROZEN (see [`crate::lifecycle::freeze`]).
    pub async fn freeze(&self) -> Result<Record> {
        self.actor.freeze().await
    }
}
