//! Containers of one shim (one pod) and the operations containerd asks for.
//!
//! [`Runtime`] owns every container of the shim behind one lock, and a task
//! that turns reaped exits into [`Event`]s, after the process's output has
//! drained, so a `TaskExit` is never published before the last log line.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{info, warn};
use oci_spec::runtime::{LinuxNamespaceType, Spec};
use tokio::sync::{mpsc, Mutex};

use crate::actor;
use crate::cgroup;
use crate::error::{Error, IoContext, Result};
use crate::identity::Identity;
use crate::process::{ExitInfo, Process, Status};
use crate::reaper;
use crate::runc::{self, Runc};
use crate::spec::ActorSpec;
use crate::stdio::{self, StdioConfig};

/// What the runtime reports to the shim, to be published to containerd.
#[derive(Debug, Clone)]
pub enum Event {
    /// A process exited (exec_id is empty for init).
    Exit {
        container_id: String,
        exec_id: String,
        pid: i32,
        exit: ExitInfo,
    },
    /// The kernel OOM-killed a process of the container.
    Oom { container_id: String },
}

/// One container: its bundle, runc handle, init process and execs.
pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Runc,
    pub init: Process,
    pub execs: HashMap<String, Process>,
    pub actor: ActorSpec,
    /// Whether the container has its own pid namespace (if not, its
    /// processes are killed when init exits, as runc-v2 does).
    pub(crate) own_pid_ns: bool,
    pub(crate) memory_cgroup: Option<PathBuf>,
    /// A checkpoint image to restore at start, instead of `runc start`.
    pub(crate) restore_from: Option<PathBuf>,
    /// The CRI sandbox (pause) container: never part of the actor.
    pub sandbox: bool,
    /// Checkpointed by a suspend: no process, but RUNNING to containerd.
    pub(crate) suspended: bool,
    /// The stdio of the suspended process: keeps containerd's FIFOs open.
    pub(crate) suspended_io: Option<stdio::ProcessIo>,
    /// The pod's network namespace (a path: CRI's sandbox netns), if joined.
    pub(crate) netns: Option<PathBuf>,
    /// A checkpoint a dead shim kept for this container's identity, to be
    /// restored at start (then `restore_from` is its image).
    pub(crate) adopted: Option<crate::recovery::Adopted>,
    /// Its rootfs overlay's upper directory, captured at each suspend.
    pub(crate) rootfs_upper: Option<PathBuf>,
}

impl Container {
    fn process(&self, exec_id: &str) -> Result<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs
            .get(exec_id)
            .ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {}", self.id)))
    }

    pub(crate) fn process_mut(&mut self, exec_id: &str) -> Result<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        let id = self.id.clone();
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {id}")))
    }
}

/// What `create` needs.
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub stdio: StdioConfig,
    /// Restore this checkpoint image directory at start.
    pub checkpoint: Option<PathBuf>,
    /// The upper directory of the rootfs overlay (its changes, which a
    /// suspend carries with the checkpoint: [`crate::rootfs`]).
    pub rootfs_upper: Option<PathBuf>,
}

/// The state of a process, as `state` reports it.
#[derive(Debug, Clone)]
pub struct ProcessState {
    pub id: String,
    pub exec_id: String,
    pub pid: i32,
    pub bundle: PathBuf,
    pub status: Status,
    pub stdio: StdioConfig,
    pub exit: Option<ExitInfo>,
}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) containers: HashMap<String, Container>,
    /// Exits reaped before their pid was registered (a process that died
    /// right after runc started it). Bounded: runc's own exits land here too.
    early_exits: VecDeque<(i32, i32)>,
    /// Pids of processes a suspend checkpointed: their exit is not an exit.
    pub(crate) retired_pids: std::collections::HashSet<i32>,
}

const EARLY_EXITS: usize = 512;

/// CRI annotations: which container is the sandbox, and which pod it is in.
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// All containers of this shim.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Mutex<Inner>>,
    /// The actor's record; its lock also serializes lifecycle operations.
    pub(crate) actor: Arc<Mutex<Option<(actor::Store, actor::Record)>>>,
    pub(crate) state_root: PathBuf,
    /// Listeners held for the suspended actor.
    pub(crate) activation: Arc<Mutex<Option<crate::activation::Armed>>>,
    /// Activation's wake-up calls.
    pub(crate) wake: mpsc::UnboundedSender<()>,
    /// Lazy-pages daemons still serving a restored actor's memory.
    pub(crate) lazy: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    namespace: String,
    pub(crate) events: mpsc::UnboundedSender<Event>,
    /// The node-local claim on the actor, held while the shim runs it.
    pub(crate) claim: Arc<std::sync::Mutex<Option<crate::claim::Claim>>>,
    /// The background commit of the last suspend's snapshot.
    pub(crate) commit: Arc<std::sync::Mutex<Option<tokio::sync::watch::Receiver<crate::lifecycle::CommitState>>>>,
}

impl Runtime {
    /// Creates the runtime and starts its exit monitor. `namespace` is the
    /// containerd namespace (runc state is kept per namespace).
    pub fn new(namespace: &str, events: mpsc::UnboundedSender<Event>) -> Self {
        let (wake, mut wake_rx) = mpsc::unbounded_channel();
        let rt = Runtime {
            activation: Arc::default(),
            wake,
            lazy: Arc::default(),
            inner: Arc::default(),
            actor: Arc::default(),
            state_root: std::env::var_os("TORPOR_STATE_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(actor::STATE_ROOT)),
            namespace: namespace.to_string(),
            events,
            claim: Arc::default(),
            commit: Arc::default(),
        };
        let me = rt.clone();
        tokio::spawn(async move {
            while wake_rx.recv().await.is_some() {
                match me.resume_actor().await {
                    Ok(_) => info!("actor resumed by an inbound connection"),
                    Err(Error::FailedPrecondition(_)) => {} // already resumed
                    Err(e) => warn!("resume on an inbound connection failed: {e}"),
                }
            }
        });
        let mut sub = reaper::subscribe();
        let me = rt.clone();
        tokio::spawn(async move {
            while let Some(exit) = sub.next().await {
                me.on_exit(exit.pid, exit.status).await;
            }
        });
        rt
    }

    fn runc_for(&self, bundle: &Path) -> Runc {
        Runc::for_namespace(&self.namespace, bundle)
    }

    async fn on_exit(&self, pid: i32, status: i32) {
        let mut inner = self.inner.lock().await;
        if inner.retired_pids.remove(&pid) {
            return;
        }
        let Some((cid, exec_id)) = find_pid(&inner, pid) else {
            if inner.early_exits.len() >= EARLY_EXITS {
                inner.early_exits.pop_front();
            }
            inner.early_exits.push_back((pid, status));
            return;
        };
        drop(inner);
        self.process_exited(&cid, &exec_id, pid, status).await;
    }

    async fn process_exited(&self, cid: &str, exec_id: &str, pid: i32, status: i32) {
        // Wait for the output outside the lock, then record the exit.
        let (drain, kill_all, runc) = {
            let mut inner = self.inner.lock().await;
            let Some(c) = inner.containers.get_mut(cid) else { return };
            if c.suspended && exec_id.is_empty() {
                // The suspend's checkpoint ended the process: not an exit.
                return;
            }
            if c.process(exec_id).map(|p| p.pid).ok() != Some(pid) {
                return; // an earlier incarnation (restored since)
            }
            let kill_all = exec_id.is_empty() && !c.own_pid_ns;
            let runc = c.runc.clone();
            let Ok(p) = c.process_mut(exec_id) else { return };
            (p.io.take_drain(), kill_all, runc)
        };
        if kill_all {
            if let Err(e) = runc.kill(cid, libc::SIGKILL as u32, true).await {
                if !runc::is_not_running(&e) {
                    warn!(container = cid; "kill the rest of the container after init exited: {e}");
                }
            }
        }
        drain.wait().await;
        let mut inner = self.inner.lock().await;
        let Some(c) = inner.containers.get_mut(cid) else { return };
        let oom = exec_id.is_empty()
            && c.memory_cgroup.as_deref().map(cgroup::oom_kills).unwrap_or(0) > 0;
        let Ok(p) = c.process_mut(exec_id) else { return };
        if p.exit_info().is_some() || p.pid != pid {
            return;
        }
        let exit = p.set_exited(status as u32);
        info!(container = cid, exec = exec_id, pid, status; "process exited");
        if oom {
            let _ = self.events.send(Event::Oom {
                container_id: cid.to_string(),
            });
        }
        let _ = self.events.send(Event::Exit {
            container_id: cid.to_string(),
            exec_id: exec_id.to_string(),
            pid,
            exit,
        });
    }

    /// Registers a new pid; if it already exited, handles that exit now.
    pub(crate) async fn claim_early_exit(&self, cid: &str, exec_id: &str, pid: i32) {
        let early = {
            let mut inner = self.inner.lock().await;
            let pos = inner.early_exits.iter().position(|(p, _)| *p == pid);
            pos.and_then(|i| inner.early_exits.remove(i))
        };
        if let Some((_, status)) = early {
            let me = self.clone();
            let (cid, exec_id) = (cid.to_string(), exec_id.to_string());
            tokio::spawn(async move { me.process_exited(&cid, &exec_id, pid, status).await });
        }
    }

    /// Create: validates the torpor annotations, then `runc create`.
    pub async fn create(&self, req: CreateRequest) -> Result<i32> {
        let r = self.create_inner(req).await;
        if r.is_err() {
            // A failed create leaves no actor state behind.
            self.actor_forget_if_empty().await;
        }
        r
    }

    async fn create_inner(&self, req: CreateRequest) -> Result<i32> {
        let spec = read_spec(&req.bundle)?;
        let actor = ActorSpec::from_annotations(&spec.annotations().clone().unwrap_or_default())?;
        let own_pid_ns = spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_none()));
        let netns = spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .and_then(|ns| ns.iter().find(|n| n.typ() == LinuxNamespaceType::Network))
            .and_then(|n| n.path().clone());
        let annotations = spec.annotations().clone().unwrap_or_default();
        let sandbox = annotations.get(CRI_CONTAINER_TYPE).is_some_and(|t| t == "sandbox");
        if self.inner.lock().await.containers.contains_key(&req.id) {
            return Err(Error::AlreadyExists(format!("container {}", req.id)));
        }
        let mut adopted = None;
        if !sandbox {
            let group = annotations.get(CRI_SANDBOX_ID).cloned().unwrap_or_else(|| req.id.clone());
            let explicit = annotations.contains_key(crate::spec::ACTOR);
            self.actor_init(&group, &actor, explicit).await?;
            crate::policy::adapt_spec(&req.bundle, &group)?;
            let identity = Identity::of(actor.actor.as_deref(), &annotations, &req.id);
            let name = identity.as_ref().map(|i| i.container.clone()).unwrap_or_else(|| req.id.clone());
            let cgroup = spec
                .linux()
                .as_ref()
                .and_then(|l| l.cgroups_path().as_ref())
                .map(|p| p.to_string_lossy().into_owned());
            self.actor_add_member(&req.id, &name, cgroup).await?;
            if let (Some(identity), None) = (&identity, &req.checkpoint) {
                adopted = self.adopt_kept(&req.id, identity, actor.restore_from.as_ref()).await?;
            }
            if let Some(a) = &adopted {
                // The files it wrote, before its processes come back.
                if let Err(e) = apply_rootfs_diff(&req.bundle, a).await {
                    self.give_back(&req.id, a, false, &e).await;
                    return Err(e);
                }
            }
        }
        let mut inner = self.inner.lock().await;
        if inner.containers.contains_key(&req.id) {
            drop(inner);
            let e = Error::AlreadyExists(format!("container {}", req.id));
            if let Some(a) = &adopted {
                self.give_back(&req.id, a, false, &e).await;
            }
            return Err(e);
        }
        let mut c = Container {
            id: req.id.clone(),
            runc: self.runc_for(&req.bundle),
            bundle: req.bundle,
            init: Process::new("", req.stdio.clone()),
            execs: HashMap::new(),
            actor,
            own_pid_ns,
            memory_cgroup: None,
            restore_from: None,
            sandbox,
            suspended: false,
            suspended_io: None,
            netns,
            adopted: None,
            rootfs_upper: req.rootfs_upper,
        };
        if let Some(a) = adopted {
            // Restored at Start, as a container created from a checkpoint.
            if let Err(e) = crate::policy::recovery_criu_config(&c.bundle, true) {
                drop(inner);
                self.give_back(&req.id, &a, false, &e).await;
                return Err(e);
            }
            c.restore_from = Some(a.image.clone());
            c.adopted = Some(a);
            inner.containers.insert(req.id, c);
            return Ok(0);
        }
        if let Some(image) = req.checkpoint {
            // As runc-v2: a container created from a checkpoint is restored at Start.
            check_image(&image)?;
            info!(container = req.id.as_str(), image:? = image; "container created from a checkpoint");
            c.restore_from = Some(image);
            inner.containers.insert(req.id, c);
            return Ok(0);
        }
        let pid_file = c.bundle.join("init.pid");
        let (runc, bundle, id, pf) = (&c.runc, &c.bundle, &req.id, &pid_file);
        c.init.io = stdio::launch(&req.stdio, |socket, stdio| async move {
            runc.create(id, bundle, pf, socket.as_deref(), stdio).await
        })
        .await?;
        c.init.pid = runc::read_pid(&pid_file)?;
        let pid = c.init.pid;
        c.memory_cgroup = cgroup::memory_cgroup_of(pid);
        info!(container = req.id.as_str(), pid; "container created");
        inner.containers.insert(req.id.clone(), c);
        drop(inner);
        self.claim_early_exit(&req.id, "", pid).await;
        Ok(pid)
    }

    /// Start of init (`runc start`) or of an exec (`runc exec`).
    pub async fn start(&self, id: &str, exec_id: &str) -> Result<i32> {
        let mut inner = self.inner.lock().await;
        let c = container_mut(&mut inner, id)?;
        let p = c.process(exec_id)?;
        if p.status != Status::Created {
            return Err(Error::FailedPrecondition(format!(
                "process {id}/{exec_id} is {:?}, not created",
                p.status
            )));
        }
        if exec_id.is_empty() {
            if let Some(image) = c.restore_from.clone() {
                let adopted = c.adopted.take();
                drop(inner);
                let started = std::time::Instant::now();
                let restored = self.restore(id, &image).await;
                if let Some(a) = adopted {
                    let bundle = self.state(id, "").await.map(|s| s.bundle);
                    if let Err(e) = bundle.and_then(|b| crate::policy::recovery_criu_config(&b, false)) {
                        warn!(container = id; "CRIU configuration after the restore: {e}");
                    }
                    let pending = self.adoptions_pending().await;
                    match &restored {
                        Ok(_) => {
                            let ms = started.elapsed().as_millis() as u64;
                            if let Err(e) = self.recovered(id, &a, pending, ms).await {
                                warn!(container = id; "restored from a kept checkpoint, but the record could not be saved: {e}");
                            }
                        }
                        Err(e) => self.give_back(id, &a, pending, e).await,
                    }
                }
                if restored.is_ok() {
                    self.actor_ran(id).await;
                }
                return restored;
            }
            c.runc.start(id).await?;
            c.init.status = Status::Running;
            let pid = c.init.pid;
            drop(inner);
            self.actor_ran(id).await;
            return Ok(pid);
        }
        if c.init.status != Status::Running {
            return Err(Error::FailedPrecondition(format!("container {id} is not running")));
        }
        let runc = c.runc.clone();
        let bundle = c.bundle.clone();
        let p = c.process_mut(exec_id)?;
        let spec_file = p
            .spec_file
            .clone()
            .ok_or_else(|| Error::InvalidArgument(format!("exec {exec_id} has no process spec")))?;
        let pid_file = bundle.join(format!("{exec_id}.pid"));
        let (runc, spec, pf) = (&runc, &spec_file, &pid_file);
        p.io = stdio::launch(&p.stdio, |socket, stdio| async move {
            runc.exec(id, spec, pf, socket.as_deref(), stdio).await
        })
        .await?;
        p.pid = runc::read_pid(&pid_file)?;
        let _ = std::fs::remove_file(&pid_file);
        p.status = Status::Running;
        let pid = p.pid;
        drop(inner);
        self.claim_early_exit(id, exec_id, pid).await;
        Ok(pid)
    }

    /// Start of a container created from a checkpoint: `runc restore`.
    async fn restore(&self, id: &str, image: &Path) -> Result<i32> {
        let work = {
            let inner = self.inner.lock().await;
            container(&inner, id)?.bundle.join("criu-work")
        };
        let from = runc::RestoreFrom {
            image: image.to_path_buf(),
            work,
            lazy: false,
        };
        self.restore_container(id, &from).await
    }

    /// `runc restore` of container `id` from `image` (a checkpoint, or a
    /// suspended actor's image), into its bundle; the process is RUNNING after.
    pub(crate) async fn restore_container(&self, id: &str, from: &runc::RestoreFrom) -> Result<i32> {
        let started = std::time::Instant::now();
        let mut inner = self.inner.lock().await;
        let c = container_mut(&mut inner, id)?;
        let work = &from.work;
        std::fs::create_dir_all(work).io_context(|| format!("create {work:?}"))?;
        let pid_file = c.bundle.join("init.pid");
        let (runc, bundle, pf) = (&c.runc, &c.bundle, &pid_file);
        c.init.io = stdio::launch(&c.init.stdio, |socket, stdio| async move {
            runc.restore(id, bundle, from, pf, socket.as_deref(), stdio).await
        })
        .await?;
        c.init.pid = runc::read_pid(&pid_file)?;
        c.init.status = Status::Running;
        c.restore_from = None;
        c.suspended = false;
        c.suspended_io = None;
        c.memory_cgroup = cgroup::memory_cgroup_of(c.init.pid);
        let pid = c.init.pid;
        info!(container = id, pid, lazy = from.lazy, ms = started.elapsed().as_millis() as u64; "container restored");
        drop(inner);
        self.claim_early_exit(id, "", pid).await;
        Ok(pid)
    }

    /// Checkpoint of a running or paused container into `opts.image_path`.
    pub async fn checkpoint(&self, id: &str, opts: runc::CheckpointOpts) -> Result<()> {
        let inner = self.inner.lock().await;
        let c = container(&inner, id)?;
        if !matches!(c.init.status, Status::Running | Status::Paused) || c.init.exit_info().is_some() {
            return Err(Error::FailedPrecondition(format!(
                "container {id} is {:?}: only a running or paused container can be checkpointed",
                c.init.status
            )));
        }
        std::fs::create_dir_all(&opts.image_path).io_context(|| format!("create {:?}", opts.image_path))?;
        std::fs::create_dir_all(&opts.work_path).io_context(|| format!("create {:?}", opts.work_path))?;
        c.runc.checkpoint(id, &opts).await
    }

    /// Exec: registers the process; `start` runs it.
    pub async fn exec(&self, id: &str, exec_id: &str, process_json: &[u8], stdio: StdioConfig) -> Result<()> {
        if exec_id.is_empty() || exec_id.contains('/') || exec_id.contains("..") {
            return Err(Error::InvalidArgument(format!("exec id {exec_id:?} is not a valid name")));
        }
        let mut inner = self.inner.lock().await;
        let c = container_mut(&mut inner, id)?;
        if c.execs.contains_key(exec_id) {
            return Err(Error::AlreadyExists(format!("exec {exec_id} in container {id}")));
        }
        if c.init.status != Status::Running {
            return Err(Error::FailedPrecondition(format!("container {id} is not running")));
        }
        let file = c.bundle.join(format!("exec-{exec_id}.json"));
        std::fs::write(&file, process_json).io_context(|| format!("write {file:?}"))?;
        let mut p = Process::new(exec_id, stdio);
        p.spec_file = Some(file);
        c.execs.insert(exec_id.to_string(), p);
        Ok(())
    }

    pub async fn state(&self, id: &str, exec_id: &str) -> Result<ProcessState> {
        let inner = self.inner.lock().await;
        let c = container(&inner, id)?;
        let p = c.process(exec_id)?;
        Ok(ProcessState {
            id: id.to_string(),
            exec_id: exec_id.to_string(),
            pid: p.pid,
            bundle: c.bundle.clone(),
            status: p.status,
            stdio: p.stdio.clone(),
            exit: p.exit_info(),
        })
    }

    /// Kill: a signal to init (`all`: every process) or to an exec.
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        if exec_id.is_empty() && signal == libc::SIGTERM as u32 {
            self.suspend_on_stop(id).await;
        }
        if exec_id.is_empty() && self.kill_suspended(id, signal).await? {
            return Ok(());
        }
        let inner = self.inner.lock().await;
        let c = container(&inner, id)?;
        let p = c.process(exec_id)?;
        if p.exit_info().is_some() || (p.status == Status::Created && !exec_id.is_empty()) {
            return Err(Error::NotFound(format!("process {id}/{exec_id} already finished")));
        }
        if exec_id.is_empty() {
            return c.runc.kill(id, signal, all).await.map_err(|e| {
                if runc::is_not_running(&e) {
                    Error::NotFound(format!("process {id} already finished"))
                } else {
                    e
                }
            });
        }
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| Error::InvalidArgument(format!("signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), sig).map_err(|e| match e {
            nix::errno::Errno::ESRCH => Error::NotFound(format!("process {id}/{exec_id} already finished")),
            e => Error::Sys {
                context: format!("kill {}", p.pid),
                source: e,
            },
        })
    }

    /// Delete: an exited exec, or the container (which must not be running).
    pub async fn delete(&self, id: &str, exec_id: &str) -> Result<(i32, ExitInfo)> {
        let mut inner = self.inner.lock().await;
        let c = container_mut(&mut inner, id)?;
        if !exec_id.is_empty() {
            let p = c.process(exec_id)?;
            let exit = match (p.exit_info(), p.status) {
                (Some(e), _) => e,
                (None, Status::Created) => ExitInfo {
                    status: 0,
                    at: std::time::SystemTime::now(),
                },
                _ => return Err(Error::FailedPrecondition(format!("exec {exec_id} is still running"))),
            };
            let p = c.execs.remove(exec_id).ok_or_else(|| Error::NotFound(exec_id.to_string()))?;
            if let Some(f) = p.spec_file {
                let _ = std::fs::remove_file(f);
            }
            return Ok((p.pid, exit));
        }
        if matches!(c.init.status, Status::Running | Status::Paused) && c.init.exit_info().is_none() {
            return Err(Error::FailedPrecondition(format!("container {id} is still running")));
        }
        c.runc.delete(id, true).await.or_else(|e| {
            if runc::is_not_running(&e) {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        let mut c = inner.containers.remove(id).ok_or_else(|| Error::NotFound(id.to_string()))?;
        let exit = c.init.exit_info().unwrap_or(ExitInfo {
            status: 137,
            at: std::time::SystemTime::now(),
        });
        c.init.io.close();
        drop(inner);
        if let Some(a) = c.adopted.take() {
            // Deleted before its start: the kept checkpoint was not used.
            let pending = self.adoptions_pending().await;
            let why = Error::FailedPrecondition(format!("container {id} was deleted before its start"));
            self.give_back(id, &a, pending, &why).await;
        }
        self.actor_forget_if_empty().await;
        Ok((c.init.pid, exit))
    }

    pub async fn pause(&self, id: &str) -> Result<()> {
        let mut inner = self.inner.lock().await;
        let c = container_mut(&mut inner, id)?;
        if c.init.status != Status::Running {
            return Err(Error::FailedPrecondition(format!("container {id} is {:?}, not running", c.init.status)));
        }
        c.runc.pause(id).await?;
        c.init.status = Status::Paused;
        Ok(())
    }

    pub async fn resume(&self, id: &str) -> Result<()> {
        let mut inner = self.inner.lock().await;
        let c = container_mut(&mut inner, id)?;
        if c.init.status != Status::Paused {
            return Err(Error::FailedPrecondition(format!("container {id} is {:?}, not paused", c.init.status)));
        }
        c.runc.resume(id).await?;
        c.init.status = Status::Running;
        Ok(())
    }

    /// Pids of the container, with the exec id of those that are execs.
    pub async fn pids(&self, id: &str) -> Result<Vec<(i32, Option<String>)>> {
        let inner = self.inner.lock().await;
        let c = container(&inner, id)?;
        if c.suspended {
            // The checkpointed init stands for the container: containerd
            // treats a shim without pids as leaked when it restarts.
            return Ok(vec![(c.init.pid, None)]);
        }
        let pids = c.runc.ps(id).await?;
        Ok(pids
            .into_iter()
            .map(|pid| {
                let exec = c.execs.values().find(|p| p.pid == pid).map(|p| p.exec_id.clone());
                (pid, exec)
            })
            .collect())
    }

    pub async fn close_io(&self, id: &str, exec_id: &str) -> Result<()> {
        let inner = self.inner.lock().await;
        container(&inner, id)?.process(exec_id)?.io.close_stdin();
        Ok(())
    }

    pub async fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        let inner = self.inner.lock().await;
        container(&inner, id)?.process(exec_id)?.io.resize(width, height)
    }

    pub async fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        let inner = self.inner.lock().await;
        let c = container(&inner, id)?;
        c.runc.update(id, resources_json, &c.bundle).await
    }

    pub async fn stats(&self, id: &str) -> Result<serde_json::Value> {
        let inner = self.inner.lock().await;
        let c = container(&inner, id)?;
        if c.suspended {
            // No process, no memory: all counters are zero.
            return Ok(serde_json::json!({"type": "stats", "id": id, "data": {}}));
        }
        c.runc.stats(id).await
    }

    /// A receiver that sees the exit of the process.
    pub async fn exit_watch(&self, id: &str, exec_id: &str) -> Result<tokio::sync::watch::Receiver<Option<ExitInfo>>> {
        let inner = self.inner.lock().await;
        Ok(container(&inner, id)?.process(exec_id)?.exit_watch())
    }

    /// Pid of a container's init, for Connect.
    pub async fn init_pid(&self, id: &str) -> Result<i32> {
        let inner = self.inner.lock().await;
        Ok(container(&inner, id)?.init.pid)
    }

    /// Whether a container still waits to be restored from a kept checkpoint.
    pub(crate) async fn adoptions_pending(&self) -> bool {
        self.inner.lock().await.containers.values().any(|c| c.adopted.is_some())
    }

    pub async fn is_empty(&self) -> bool {
        self.inner.lock().await.containers.is_empty()
    }
}

fn find_pid(inner: &Inner, pid: i32) -> Option<(String, String)> {
    for c in inner.containers.values() {
        if c.init.pid == pid {
            return Some((c.id.clone(), String::new()));
        }
        if let Some(p) = c.execs.values().find(|p| p.pid == pid) {
            return Some((c.id.clone(), p.exec_id.clone()));
        }
    }
    None
}

pub(crate) fn container<'a>(inner: &'a Inner, id: &str) -> Result<&'a Container> {
    inner
        .containers
        .get(id)
        .ok_or_else(|| Error::NotFound(format!("container {id}")))
}

pub(crate) fn container_mut<'a>(inner: &'a mut Inner, id: &str) -> Result<&'a mut Container> {
    inner
        .containers
        .get_mut(id)
        .ok_or_else(|| Error::NotFound(format!("container {id}")))
}

/// Applies the rootfs changes a kept checkpoint carries (snapshots written
/// before torpor carried them have none) to the new container's
/// mounted rootfs, before its processes are restored.
async fn apply_rootfs_diff(bundle: &Path, a: &crate::recovery::Adopted) -> Result<()> {
    let diff = a.image.join(crate::rootfs::DIFF_FILE);
    if !diff.is_file() {
        info!(snapshot:% = a.snapshot, container = a.identity.container.as_str(); "the snapshot carries no rootfs changes");
        return Ok(());
    }
    let rootfs = bundle.join("rootfs");
    let started = std::time::Instant::now();
    let applied = tokio::task::spawn_blocking(move || crate::rootfs::apply(&diff, &rootfs))
        .await
        .map_err(|e| Error::Io { context: "apply a rootfs diff".into(), source: std::io::Error::other(e) })?
        .map_err(|e| {
            let what = format!("restore of {} from snapshot {}: its rootfs changes", a.identity, a.snapshot);
            match e {
                Error::Io { context, source } => Error::Io { context: format!("{what}: {context}"), source },
                Error::Sys { context, source } => Error::Sys { context: format!("{what}: {context}"), source },
                e => crate::lifecycle::with_context(e, &what),
            }
        })?;
    info!(snapshot:% = a.snapshot, container = a.identity.container.as_str(), entries = applied.entries,
        bytes = applied.bytes, deletions = applied.deletions, ms = started.elapsed().as_millis() as u64; "rootfs changes applied");
    Ok(())
}

/// Refuses a checkpoint image directory that is missing or holds no CRIU image.
fn check_image(image: &Path) -> Result<()> {
    if !image.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "checkpoint image directory {image:?} does not exist"
        )));
    }
    if !image.join("inventory.img").is_file() {
        return Err(Error::InvalidArgument(format!(
            "checkpoint image directory {image:?} holds no CRIU image (no inventory.img)"
        )));
    }
    Ok(())
}

/// Reads the bundle's OCI spec.
pub fn read_spec(bundle: &Path) -> Result<Spec> {
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).io_context(|| format!("read {path:?}"))?;
    serde_json::from_slice(&text).map_err(|source| Error::Json {
        context: format!("parse {path:?}"),
        source,
    })
}
