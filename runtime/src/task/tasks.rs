//! The containers of one shim (one pod) and the operations containerd asks
//! for, with no knowledge of actors.
//!
//! [`Tasks`] owns every container behind one `std::sync::Mutex`, held only
//! to read or change the table, never across an `.await` (the guard is not
//! `Send`: a spawned future holding it does not compile). Every external
//! command runs outside it; the container it changes is claimed by a
//! transitional [`ContainerState`] first (see there). A task turns reaped
//! exits into [`Event`]s after the process's output has drained, so a
//! `TaskExit` is never published before the last log line.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, Notify};
use tracing::{info, warn};

use crate::error::{Error, IoContext, Result};
use crate::oci::annotations::ActorSpec;
use crate::oci::bundle;
use crate::system::cgroup;
use crate::system::criu_restore;
use crate::system::reaper;
use crate::system::resources;
use crate::system::runc::{self, CheckpointOpts, RestoreFrom, Runc};
use crate::system::runc_options::RuncOptions;
use crate::system::stdio::{self, ProcessIo, StdioConfig};
use crate::system::sysv_ipc;
use crate::system::tmpfs;
use crate::task::container::{Container, ContainerState, Exec, UpdateTarget};
use crate::task::process::{ExecState, ExitInfo, Process, Status};

/// What the runtime reports to the shim, to be published to containerd.
#[derive(Debug, Clone)]
pub enum Event {
    /// A process exited (exec_id is empty for init).
    Exit { container_id: String, exec_id: String, pid: i32, exit: ExitInfo },
    /// The kernel OOM-killed a process of the container.
    Oom { container_id: String },
}

/// A container to create.
pub struct NewContainer {
    pub id: String,
    pub bundle: PathBuf,
    pub stdio: StdioConfig,
    pub actor: ActorSpec,
    pub own_pid_ns: bool,
    pub sandbox: bool,
    pub netns: Option<PathBuf>,
    /// The pod's IPC namespace (a path), if joined.
    pub ipcns: Option<PathBuf>,
    pub rootfs_upper: Option<PathBuf>,
    /// Restore this checkpoint image at Start, instead of `runc create`.
    pub restore_from: Option<PathBuf>,
    /// containerd's runtime options (runc binary, root, cgroup driver...).
    pub runc_options: RuncOptions,
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

/// What the lifecycle needs to know of an app container.
#[derive(Debug, Clone)]
pub struct AppInfo {
    pub pid: i32,
    pub netns: Option<PathBuf>,
    pub actor: ActorSpec,
    pub terminal: bool,
    pub rootfs_upper: Option<PathBuf>,
}

#[derive(Default)]
struct Table {
    containers: HashMap<String, Container>,
    /// Exits reaped before their pid was registered (a process that died
    /// right after runc started it). Bounded: runc's own exits land here too.
    early_exits: VecDeque<(i32, i32)>,
    /// Pids of processes a suspend checkpointed: their exit is not an exit.
    retired_pids: HashSet<i32>,
}

const EARLY_EXITS: usize = 512;

/// Held by whoever may still undo a restore ([`Tasks::unrestore`]) whose
/// memory streams in: a process whose memory source failed may die of it
/// before the undo. While the hold lives, the exit of an init it covers
/// ([`Tasks::hold_init_exit`]) waits; once it is dropped, the exit is
/// reported, unless the restore was undone meanwhile (then it was not an
/// exit).
#[derive(Default)]
pub struct ExitHold(tokio::sync::watch::Sender<()>);

/// All containers of this shim.
#[derive(Clone)]
pub struct Tasks {
    table: Arc<Mutex<Table>>,
    /// Notified whenever a container leaves a transitional state.
    settled: Arc<Notify>,
    namespace: String,
    events: mpsc::UnboundedSender<Event>,
}

impl Tasks {
    /// The table, and its exit monitor. `namespace` is the containerd
    /// namespace (runc state is kept per namespace).
    pub fn new(namespace: &str, events: mpsc::UnboundedSender<Event>) -> Self {
        let tasks = Tasks { table: Arc::default(), settled: Arc::default(), namespace: namespace.to_string(), events };
        let mut sub = reaper::subscribe();
        let me = tasks.clone();
        tokio::spawn(async move {
            while let Some(exit) = sub.next().await {
                me.on_exit(exit.pid, exit.status).await;
            }
        });
        tasks
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on container `id` under the table's lock.
    fn with<T>(&self, id: &str, f: impl FnOnce(&mut Container) -> Result<T>) -> Result<T> {
        let mut t = self.lock();
        f(container_mut(&mut t, id)?)
    }

    /// Settles container `id` into `state` and wakes whoever waits for it.
    fn settle(&self, id: &str, f: impl FnOnce(&mut Container)) {
        if let Some(c) = self.lock().containers.get_mut(id) {
            f(c);
        }
        self.settled.notify_waiters();
    }

    /// Waits until container `id` is in no transitional state.
    pub async fn settled(&self, id: &str) {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let busy = self.lock().containers.get(id).is_some_and(|c| c.state.in_transition());
            if !busy {
                return;
            }
            notified.await;
        }
    }

    async fn on_exit(&self, pid: i32, status: i32) {
        let found = {
            let mut t = self.lock();
            if t.retired_pids.remove(&pid) {
                return;
            }
            match find_pid(&t, pid) {
                Some(found) => Some(found),
                None => {
                    if t.early_exits.len() >= EARLY_EXITS {
                        t.early_exits.pop_front();
                    }
                    t.early_exits.push_back((pid, status));
                    None
                }
            }
        };
        if let Some((cid, exec_id)) = found {
            self.process_exited(&cid, &exec_id, pid, status).await;
        }
    }

    async fn process_exited(&self, cid: &str, exec_id: &str, pid: i32, status: i32) {
        if let Some(mut hold) = self.take_exit_hold(cid, exec_id, pid) {
            info!(container = cid, pid, status, "init exited while its restore may still be undone: the exit waits");
            let (me, cid, exec_id) = (self.clone(), cid.to_string(), exec_id.to_string());
            tokio::spawn(async move {
                while hold.changed().await.is_ok() {}
                me.record_exit(&cid, &exec_id, pid, status).await;
            });
            return;
        }
        self.record_exit(cid, exec_id, pid, status).await;
    }

    /// The pending [`ExitHold`] on the exit of init `pid` of container
    /// `cid`, taken (an exit is held once).
    fn take_exit_hold(&self, cid: &str, exec_id: &str, pid: i32) -> Option<tokio::sync::watch::Receiver<()>> {
        if !exec_id.is_empty() {
            return None;
        }
        let mut t = self.lock();
        let c = t.containers.get_mut(cid)?;
        if c.state.checkpointed() || c.init.pid != pid {
            return None;
        }
        c.exit_hold.take().filter(|h| h.has_changed().is_ok())
    }

    async fn record_exit(&self, cid: &str, exec_id: &str, pid: i32, status: i32) {
        // Wait for the output outside the lock, then record the exit.
        let (drain, kill_all, runc) = {
            let mut guard = self.lock();
            let t = &mut *guard;
            let Some(c) = t.containers.get_mut(cid) else { return };
            if exec_id.is_empty() && c.state.checkpointed() {
                // The suspend's checkpoint ended the process, or its
                // restore was undone while the exit was held (the undo
                // retired the pid after it was reaped): not an exit.
                t.retired_pids.remove(&pid);
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
                    warn!(container = cid, "kill the rest of the container after init exited: {e}");
                }
            }
        }
        drain.wait().await;
        let (exit, oom) = {
            let mut t = self.lock();
            let Some(c) = t.containers.get_mut(cid) else { return };
            let oom = exec_id.is_empty() && c.oom_kills() > 0;
            let Ok(p) = c.process_mut(exec_id) else { return };
            if p.exit_info().is_some() || p.pid != pid {
                return;
            }
            let exit = p.set_exited(status as u32);
            if exec_id.is_empty() {
                c.state = ContainerState::Stopped;
            }
            (exit, oom)
        };
        self.settled.notify_waiters();
        info!(container = cid, exec = exec_id, pid, status, "process exited");
        if oom {
            let _ = self.events.send(Event::Oom { container_id: cid.to_string() });
        }
        let _ = self.events.send(Event::Exit { container_id: cid.to_string(), exec_id: exec_id.to_string(), pid, exit });
    }

    /// Registers a new pid; if it already exited, handles that exit now.
    fn claim_early_exit(&self, cid: &str, exec_id: &str, pid: i32) {
        let early = {
            let mut t = self.lock();
            let pos = t.early_exits.iter().position(|(p, _)| *p == pid);
            pos.and_then(|i| t.early_exits.remove(i))
        };
        if let Some((_, status)) = early {
            let me = self.clone();
            let (cid, exec_id) = (cid.to_string(), exec_id.to_string());
            tokio::spawn(async move { me.process_exited(&cid, &exec_id, pid, status).await });
        }
    }

    /// Until `hold` is dropped, the exit of container `id`'s init waits
    /// (see [`ExitHold`]).
    pub fn hold_init_exit(&self, id: &str, hold: &ExitHold) -> Result<()> {
        self.with(id, |c| {
            c.exit_hold = Some(hold.0.subscribe());
            Ok(())
        })
    }

    /// Whether container `id` exists.
    pub fn contains(&self, id: &str) -> bool {
        self.lock().containers.contains_key(id)
    }

    /// Create: `runc create`, or (with `restore_from`) a container restored at Start.
    pub async fn create(&self, new: NewContainer) -> Result<i32> {
        new.runc_options.validate()?;
        new.runc_options.save(&new.bundle)?;
        let runc = Runc::for_options(&self.namespace, &new.bundle, &new.runc_options);
        let c = Container {
            id: new.id.clone(),
            runc: runc.clone(),
            bundle: new.bundle.clone(),
            init: Process::new("", new.stdio.clone()),
            state: match &new.restore_from {
                Some(image) => ContainerState::RestorePending { image: image.clone() },
                None => ContainerState::Creating,
            },
            execs: HashMap::new(),
            actor: new.actor,
            own_pid_ns: new.own_pid_ns,
            cgroup: None,
            oom: None,
            sandbox: new.sandbox,
            netns: new.netns,
            ipcns: new.ipcns,
            rootfs_upper: new.rootfs_upper,
            exit_hold: None,
            resources: Arc::default(),
        };
        {
            let mut t = self.lock();
            if t.containers.contains_key(&new.id) {
                return Err(Error::AlreadyExists(format!("container {}", new.id)));
            }
            t.containers.insert(new.id.clone(), c);
        }
        if new.restore_from.is_some() {
            return Ok(0);
        }
        let pid_file = new.bundle.join("init.pid");
        let (id, bundle, pf) = (&new.id, &new.bundle, &pid_file);
        let launched = async {
            let io = stdio::launch(&new.stdio, |socket, stdio| async move { runc.create(id, bundle, pf, socket.as_deref(), stdio).await })
                .await?;
            Ok::<_, Error>((io, runc::read_pid(&pid_file)?))
        }
        .await;
        let (io, pid) = match launched {
            Ok(x) => x,
            Err(e) => {
                self.lock().containers.remove(&new.id);
                self.settled.notify_waiters();
                return Err(e);
            }
        };
        self.settle(&new.id, |c| {
            c.init.io = io;
            c.init.pid = pid;
            c.placed(pid);
            c.state = ContainerState::Created;
        });
        info!(container = new.id.as_str(), pid, "container created");
        self.claim_early_exit(&new.id, "", pid);
        Ok(pid)
    }

    /// The image container `id` is to be restored from at Start, if it was
    /// created from one.
    pub fn restore_pending(&self, id: &str) -> Result<Option<PathBuf>> {
        self.with(id, |c| {
            Ok(match &c.state {
                ContainerState::RestorePending { image } => Some(image.clone()),
                _ => None,
            })
        })
    }

    /// Start of init (`runc start`) or of an exec (`runc exec`). A
    /// container waiting for a restore is started by [`Tasks::restore`].
    pub async fn start(&self, id: &str, exec_id: &str) -> Result<i32> {
        if exec_id.is_empty() {
            let runc = self.with(id, |c| {
                if !matches!(c.state, ContainerState::Created) {
                    return Err(Error::FailedPrecondition(format!("process {id}/ is {:?}, not created", c.state.status())));
                }
                c.state = ContainerState::Starting;
                Ok(c.runc.clone())
            })?;
            let r = runc.start(id).await;
            let pid = self.lock().containers.get(id).map(|c| c.init.pid).unwrap_or(0);
            self.settle(id, |c| {
                if matches!(c.state, ContainerState::Starting) {
                    c.state = if r.is_ok() { ContainerState::Running } else { ContainerState::Created };
                }
            });
            return r.map(|_| pid);
        }
        let (runc, bundle, spec_file, stdio) = self.with(id, |c| {
            if c.state.status() != Status::Running {
                return Err(Error::FailedPrecondition(format!("container {id} is not running")));
            }
            let e = c.execs.get_mut(exec_id).ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {id}")))?;
            if e.state != ExecState::Created {
                return Err(Error::FailedPrecondition(format!("process {id}/{exec_id} is {:?}, not created", e.status())));
            }
            let spec = e.process.spec_file.clone().ok_or_else(|| Error::InvalidArgument(format!("exec {exec_id} has no process spec")))?;
            e.state = ExecState::Starting;
            Ok((c.runc.clone(), c.bundle.clone(), spec, e.process.stdio.clone()))
        })?;
        let pid_file = bundle.join(format!("{exec_id}.pid"));
        let (runc_ref, spec, pf) = (&runc, &spec_file, &pid_file);
        let launched = async {
            let io =
                stdio::launch(&stdio, |socket, stdio| async move { runc_ref.exec(id, spec, pf, socket.as_deref(), stdio).await }).await?;
            let pid = runc::read_pid(&pid_file)?;
            let _ = std::fs::remove_file(&pid_file);
            Ok::<_, Error>((io, pid))
        }
        .await;
        let mut result = Ok(0);
        self.settle(id, |c| {
            let Some(e) = c.execs.get_mut(exec_id) else { return };
            match launched {
                Ok((io, pid)) => {
                    e.process.io = io;
                    e.process.pid = pid;
                    e.state = ExecState::Running;
                    result = Ok(pid);
                }
                Err(err) => {
                    e.state = ExecState::Created;
                    result = Err(err);
                }
            }
        });
        let pid = result?;
        self.claim_early_exit(id, exec_id, pid);
        Ok(pid)
    }

    /// `runc restore` of container `id` (created from a checkpoint, or
    /// suspended) from `from`, into its bundle; RUNNING after.
    pub async fn restore(&self, id: &str, from: &RestoreFrom) -> Result<i32> {
        let started = std::time::Instant::now();
        let (runc, bundle, stdio, resources_lock) = self.with(id, |c| {
            let back = match std::mem::replace(&mut c.state, ContainerState::Stopped) {
                s @ (ContainerState::Suspended { .. } | ContainerState::RestorePending { .. }) => s,
                other => {
                    let e = Error::FailedPrecondition(format!("container {id} is {}: nothing to restore", other.name()));
                    c.state = other;
                    return Err(e);
                }
            };
            c.state = ContainerState::Restoring { back: Box::new(back) };
            Ok((c.runc.clone(), c.bundle.clone(), c.init.stdio.clone(), c.resources.clone()))
        })?;
        // an update under way ends first: the restore starts from it
        let _resources = resources_lock.lock().await;
        let work = &from.work;
        let pid_file = bundle.join("init.pid");
        let (runc_ref, b, pf) = (&runc, &bundle, &pid_file);
        // Who drove CRIU: the shim itself (criu_restore) or runc.
        let by_shim = std::sync::atomic::AtomicBool::new(false);
        let by_ref = &by_shim;
        let launched = async {
            std::fs::create_dir_all(work).io_context(|| format!("create {work:?}"))?;
            // The container's own tmpfs mounts, if the suspend carried them
            // (system::tmpfs): mounted here until CRIU has bound them.
            let mounts = tmpfs::prepare(&from.image, work)?;
            let mut options = from.criu_options();
            options.extend(mounts.external.iter().map(|e| format!("external {e}")));
            bundle::operation_criu_config(b, &options)?;
            // Driven over CRIU's RPC by the shim when the container's last
            // dump left a template (and no terminal): else by runc.
            let direct = if stdio.terminal || !runc_ref.plain() { None } else { criu_restore::template_for(id, b) };
            by_shim.store(direct.is_some(), std::sync::atomic::Ordering::Relaxed);
            let io = stdio::launch(&stdio, |socket, stdio| async move {
                let Some(t) = direct else {
                    return runc_ref.restore(id, b, from, pf, socket.as_deref(), stdio).await;
                };
                match criu_restore::restore(t, &runc_ref.state_dir(id), from, pf, stdio).await {
                    Ok(_) => Ok(()),
                    Err(criu_restore::Failure::Setup(e, stdio)) => {
                        warn!(container = id, "restore without runc could not be set up, runc restores: {e}");
                        by_ref.store(false, std::sync::atomic::Ordering::Relaxed);
                        runc_ref.restore(id, b, from, pf, socket.as_deref(), stdio).await
                    }
                    Err(criu_restore::Failure::Restore(e)) => Err(runc_ref.direct_restore_failed(e, &from.work)),
                }
            })
            .await;
            if io.is_ok() {
                // CRIU has bound them: detached off the resume's path (a
                // new restore of this container uses a new work directory).
                tokio::task::spawn_blocking(move || drop(mounts));
            } else {
                // A retry may use this work directory again.
                drop(mounts);
            }
            Ok::<_, Error>((io?, runc::read_pid(&pid_file)?))
        }
        .await;
        let result = self.settle_restoring(id, launched);
        if result.is_err() {
            // What a failed (or timed-out) restore left in runc's state and
            // in the container's cgroup goes, so the next attempt starts clean.
            if let Err(e) = runc.delete(id, true).await {
                if !runc::is_not_running(&e) {
                    warn!(container = id, "cleanup after a failed restore: {e}");
                }
            }
        }
        let pid = result?;
        info!(
            container = id,
            pid,
            lazy = from.lazy,
            criu_driven_by = if by_shim.into_inner() { "shim" } else { "runc" },
            ms = started.elapsed().as_millis() as u64,
            "container restored"
        );
        self.claim_early_exit(id, "", pid);
        Ok(pid)
    }

    /// Undoes the restore of container `id` (another container of its
    /// actor could not be restored): SUSPENDED again, its stdio held, and
    /// the restored process killed and deleted (`runc delete --force`); its
    /// end is not an exit. The snapshot it came from is restored again by
    /// the next resume.
    pub async fn unrestore(&self, id: &str) -> Result<()> {
        let runc = {
            let mut t = self.lock();
            let c = container_mut(&mut t, id)?;
            if !matches!(c.state, ContainerState::Running | ContainerState::Paused) {
                return Err(Error::FailedPrecondition(format!("container {id} is {}: no restore to undo", c.state.name())));
            }
            let io = std::mem::replace(&mut c.init.io, ProcessIo::null());
            c.state = ContainerState::Suspended { io };
            let (pid, runc) = (c.init.pid, c.runc.clone());
            t.retired_pids.insert(pid);
            runc
        };
        self.settled.notify_waiters();
        match runc.delete(id, true).await {
            Err(e) if !runc::is_not_running(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Starts suspended container `id` afresh from its bundle (`runc
    /// create`, then `runc start`): its checkpoint is given up
    /// (`torpor.dev/on-restore-failure: cold-start`). To containerd it was
    /// RUNNING all along; it goes on RUNNING with a new init.
    pub async fn cold_start(&self, id: &str) -> Result<i32> {
        let (runc, bundle, stdio, resources_lock) = self.with(id, |c| {
            let back = match std::mem::replace(&mut c.state, ContainerState::Stopped) {
                s @ ContainerState::Suspended { .. } => s,
                other => {
                    let e = Error::FailedPrecondition(format!("container {id} is {}: not suspended", other.name()));
                    c.state = other;
                    return Err(e);
                }
            };
            c.state = ContainerState::Restoring { back: Box::new(back) };
            Ok((c.runc.clone(), c.bundle.clone(), c.init.stdio.clone(), c.resources.clone()))
        })?;
        let _resources = resources_lock.lock().await;
        let pid_file = bundle.join("init.pid");
        let (runc_ref, b, pf) = (&runc, &bundle, &pid_file);
        let launched = async {
            // What a failed restore left of the container in runc's state.
            if let Err(e) = runc_ref.delete(id, true).await {
                if !runc::is_not_running(&e) {
                    return Err(e);
                }
            }
            let io =
                stdio::launch(&stdio, |socket, stdio| async move { runc_ref.create(id, b, pf, socket.as_deref(), stdio).await }).await?;
            let pid = runc::read_pid(&pid_file)?;
            runc_ref.start(id).await?;
            Ok::<_, Error>((io, pid))
        }
        .await;
        let result = self.settle_restoring(id, launched);
        let pid = result?;
        info!(container = id, pid, "container started cold (its checkpoint was given up)");
        self.claim_early_exit(id, "", pid);
        Ok(pid)
    }

    /// Settles container `id` out of `Restoring`: RUNNING with the new
    /// init (its stdio holds containerd's FIFOs before the suspended one
    /// lets go of them: no EOF in between), or back where it was.
    fn settle_restoring(&self, id: &str, launched: Result<(ProcessIo, i32)>) -> Result<i32> {
        let mut result = Ok(0);
        self.settle(id, |c| {
            let back = match std::mem::replace(&mut c.state, ContainerState::Stopped) {
                ContainerState::Restoring { back } => *back,
                other => other,
            };
            match launched {
                Ok((io, pid)) => {
                    c.init.io = io;
                    c.init.pid = pid;
                    c.state = ContainerState::Running;
                    c.placed(pid);
                    drop(back);
                    result = Ok(pid);
                }
                Err(e) => {
                    c.state = back;
                    result = Err(e);
                }
            }
        });
        result
    }

    /// containerd's Checkpoint of a running or paused container into
    /// `opts.image_path` (with `exit`, the process ends: a real exit).
    pub async fn checkpoint(&self, id: &str, opts: CheckpointOpts) -> Result<()> {
        let runc = self.with(id, |c| {
            if !matches!(c.state, ContainerState::Running | ContainerState::Paused) || c.init.exit_info().is_some() {
                return Err(Error::FailedPrecondition(format!(
                    "container {id} is {:?}: only a running or paused container can be checkpointed",
                    c.state.status()
                )));
            }
            Ok(c.runc.clone())
        })?;
        std::fs::create_dir_all(&opts.image_path).io_context(|| format!("create {:?}", opts.image_path))?;
        std::fs::create_dir_all(&opts.work_path).io_context(|| format!("create {:?}", opts.work_path))?;
        runc.checkpoint(id, &opts).await
    }

    /// A suspend's dump of container `id` (running or paused): its process
    /// ends as the dump completes, which is not an exit; it is SUSPENDED
    /// after (RUNNING to containerd, its stdio held).
    pub async fn dump(&self, id: &str, opts: &CheckpointOpts) -> Result<()> {
        let (runc, bundle, ipcns, resources_lock) = self.with(id, |c| {
            if c.has_live_execs() {
                return Err(Error::FailedPrecondition(format!("container {id} has exec sessions running")));
            }
            let back = match std::mem::replace(&mut c.state, ContainerState::Stopped) {
                s @ (ContainerState::Running | ContainerState::Paused) => s,
                other => {
                    let e = Error::FailedPrecondition(format!(
                        "container {id} is {}: only a running or paused container can be dumped",
                        other.name()
                    ));
                    c.state = other;
                    return Err(e);
                }
            };
            c.state = ContainerState::Dumping { back: Box::new(back) };
            Ok((c.runc.clone(), c.bundle.clone(), c.ipcns.clone(), c.resources.clone()))
        })?;
        // an update under way ends first: its values are in the template
        let _resources = resources_lock.lock().await;
        if runc.plain() {
            criu_restore::save_template(&runc.state_dir(id), &bundle);
        }
        let r = match bundle::operation_criu_config(&bundle, &opts.criu_options()) {
            Ok(()) => runc.checkpoint(id, opts).await,
            Err(e) => Err(e.context(&format!("checkpoint of {id}"))),
        };
        if let (Ok(()), true, Some(ns)) = (&r, opts.exit, ipcns) {
            remove_dumped_ipc_objects(id, ns).await;
        }
        let mut t = self.lock();
        if let Some(c) = t.containers.get_mut(id) {
            let back = match std::mem::replace(&mut c.state, ContainerState::Stopped) {
                ContainerState::Dumping { back } => *back,
                other => other,
            };
            match &r {
                Ok(()) => {
                    let io = std::mem::replace(&mut c.init.io, ProcessIo::null());
                    c.state = ContainerState::Suspended { io };
                    // Its cgroup went with its processes.
                    c.oom = None;
                    let old = c.init.pid;
                    t.retired_pids.insert(old);
                }
                Err(_) => c.state = back,
            }
        }
        drop(t);
        self.settled.notify_waiters();
        r
    }

    /// Pause: the container goes into the cgroup freezer.
    pub async fn pause(&self, id: &str) -> Result<()> {
        let runc = self.with(id, |c| {
            if !matches!(c.state, ContainerState::Running) {
                return Err(Error::FailedPrecondition(format!("container {id} is {:?}, not running", c.state.status())));
            }
            c.state = ContainerState::Pausing;
            Ok(c.runc.clone())
        })?;
        let r = runc.pause(id).await;
        self.settle(id, |c| {
            if matches!(c.state, ContainerState::Pausing) {
                c.state = if r.is_ok() { ContainerState::Paused } else { ContainerState::Running };
            }
        });
        r
    }

    /// Resume (thaw) of a paused container.
    pub async fn resume(&self, id: &str) -> Result<()> {
        let runc = self.with(id, |c| {
            if !matches!(c.state, ContainerState::Paused) {
                return Err(Error::FailedPrecondition(format!("container {id} is {:?}, not paused", c.state.status())));
            }
            c.state = ContainerState::Thawing;
            Ok(c.runc.clone())
        })?;
        let r = runc.resume(id).await;
        self.settle(id, |c| {
            if matches!(c.state, ContainerState::Thawing) {
                c.state = if r.is_ok() { ContainerState::Running } else { ContainerState::Paused };
            }
        });
        r
    }

    /// Resume (thaw) of a paused container by `thaw` instead of `runc
    /// resume`: the freeze tier writes the cgroup freezer itself, without
    /// runc's start-up (see [`crate::lifecycle::freezer`]).
    pub async fn resume_by(&self, id: &str, thaw: impl FnOnce() -> Result<()>) -> Result<()> {
        self.with(id, |c| {
            if !matches!(c.state, ContainerState::Paused) {
                return Err(Error::FailedPrecondition(format!("container {id} is {:?}, not paused", c.state.status())));
            }
            c.state = ContainerState::Thawing;
            Ok(())
        })?;
        let r = thaw();
        self.settle(id, |c| {
            if matches!(c.state, ContainerState::Thawing) {
                c.state = if r.is_ok() { ContainerState::Running } else { ContainerState::Paused };
            }
        });
        r
    }

    /// Exec: registers the process; `start` runs it.
    pub fn exec(&self, id: &str, exec_id: &str, process_json: &[u8], stdio: StdioConfig) -> Result<()> {
        if exec_id.is_empty() || exec_id.contains('/') || exec_id.contains("..") {
            return Err(Error::InvalidArgument(format!("exec id {exec_id:?} is not a valid name")));
        }
        self.with(id, |c| {
            if c.execs.contains_key(exec_id) {
                return Err(Error::AlreadyExists(format!("exec {exec_id} in container {id}")));
            }
            if !matches!(c.state, ContainerState::Running) {
                return Err(Error::FailedPrecondition(format!("container {id} is not running")));
            }
            let file = c.bundle.join(format!("exec-{exec_id}.json"));
            std::fs::write(&file, process_json).io_context(|| format!("write {file:?}"))?;
            let mut p = Process::new(exec_id, stdio);
            p.spec_file = Some(file);
            c.execs.insert(exec_id.to_string(), Exec { process: p, state: ExecState::Created });
            Ok(())
        })
    }

    pub fn state(&self, id: &str, exec_id: &str) -> Result<ProcessState> {
        self.with(id, |c| {
            let p = c.process(exec_id)?;
            Ok(ProcessState {
                id: id.to_string(),
                exec_id: exec_id.to_string(),
                pid: p.pid,
                bundle: c.bundle.clone(),
                status: c.status_of(exec_id)?,
                stdio: p.stdio.clone(),
                exit: p.exit_info(),
            })
        })
    }

    /// Kill of a suspended container: there is no process to signal, so
    /// the exit (128 + signal) is recorded and published here. `None` when
    /// `id` is not suspended; `Some(false)` for a signal that does not stop
    /// (it waits for the resume-less stop).
    pub fn kill_suspended(&self, id: &str, signal: u32) -> Option<bool> {
        let (pid, exit) = {
            let mut t = self.lock();
            let c = t.containers.get_mut(id)?;
            if !matches!(c.state, ContainerState::Suspended { .. }) {
                return None;
            }
            if signal != libc::SIGKILL as u32 && signal != libc::SIGTERM as u32 {
                return Some(false);
            }
            if let ContainerState::Suspended { mut io } = std::mem::replace(&mut c.state, ContainerState::Stopped) {
                io.close();
            }
            (c.init.pid, c.init.set_exited(128 + signal))
        };
        self.settled.notify_waiters();
        info!(container = id, signal, "suspended container stopped");
        let _ = self.events.send(Event::Exit { container_id: id.to_string(), exec_id: String::new(), pid, exit });
        Some(true)
    }

    /// Kill: a signal to init (`all`: every process) or to an exec. Waits
    /// for a dump or restore under way to settle first.
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        self.settled(id).await;
        let (runc, pid) = self.with(id, |c| {
            let p = c.process(exec_id)?;
            let never_started = !exec_id.is_empty() && c.status_of(exec_id)? == Status::Created;
            if p.exit_info().is_some() || never_started {
                return Err(Error::NotFound(format!("process {id}/{exec_id} already finished")));
            }
            Ok((c.runc.clone(), p.pid))
        })?;
        if exec_id.is_empty() {
            return runc.kill(id, signal, all).await.map_err(|e| {
                if runc::is_not_running(&e) {
                    Error::NotFound(format!("process {id} already finished"))
                } else {
                    e
                }
            });
        }
        let sig = nix::sys::signal::Signal::try_from(signal as i32).map_err(|_| Error::InvalidArgument(format!("signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).map_err(|e| match e {
            nix::errno::Errno::ESRCH => Error::NotFound(format!("process {id}/{exec_id} already finished")),
            e => Error::Sys { context: format!("kill {pid}"), source: e },
        })
    }

    /// Delete: an exited exec, or the container (which must not be
    /// running). Returns the pid, the exit, and whether the container was
    /// deleted before it was started (RestorePending).
    pub async fn delete(&self, id: &str, exec_id: &str) -> Result<(i32, ExitInfo)> {
        if !exec_id.is_empty() {
            return self.with(id, |c| {
                let e = c.execs.get(exec_id).ok_or_else(|| Error::NotFound(format!("process {exec_id} of container {id}")))?;
                let exit = match (e.process.exit_info(), e.state) {
                    (Some(x), _) => x,
                    (None, ExecState::Created) => ExitInfo { status: 0, at: std::time::SystemTime::now() },
                    _ => return Err(Error::FailedPrecondition(format!("exec {exec_id} is still running"))),
                };
                let e = c.execs.remove(exec_id).ok_or_else(|| Error::NotFound(exec_id.to_string()))?;
                if let Some(f) = e.process.spec_file {
                    let _ = std::fs::remove_file(f);
                }
                Ok((e.process.pid, exit))
            });
        }
        self.settled(id).await;
        // Out of the table while runc deletes it; back in if that fails.
        let mut c = {
            let mut t = self.lock();
            let c = container(&t, id)?;
            if matches!(c.state.status(), Status::Running | Status::Paused) && c.init.exit_info().is_none() {
                return Err(Error::FailedPrecondition(format!("container {id} is still running")));
            }
            t.containers.remove(id).ok_or_else(|| Error::NotFound(id.to_string()))?
        };
        if let Err(e) = c.runc.delete(id, true).await {
            if !runc::is_not_running(&e) {
                self.lock().containers.insert(id.to_string(), c);
                return Err(e);
            }
        }
        let exit = c.init.exit_info().unwrap_or(ExitInfo { status: 137, at: std::time::SystemTime::now() });
        c.init.io.close();
        self.settled.notify_waiters();
        Ok((c.init.pid, exit))
    }

    /// Pids of the container, with the exec id of those that are execs.
    pub async fn pids(&self, id: &str) -> Result<Vec<(i32, Option<String>)>> {
        let (runc, checkpointed, init) = self.with(id, |c| Ok((c.runc.clone(), c.state.checkpointed(), c.init.pid)))?;
        if checkpointed {
            // The checkpointed init stands for the container: containerd
            // treats a shim without pids as leaked when it restarts.
            return Ok(vec![(init, None)]);
        }
        let pids = runc.ps(id).await?;
        self.with(id, |c| {
            Ok(pids
                .into_iter()
                .map(|pid| {
                    let exec = c.execs.values().find(|e| e.process.pid == pid).map(|e| e.process.exec_id.clone());
                    (pid, exec)
                })
                .collect())
        })
    }

    pub fn close_io(&self, id: &str, exec_id: &str) -> Result<()> {
        self.with(id, |c| {
            c.process(exec_id)?.io.close_stdin();
            Ok(())
        })
    }

    pub fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        self.with(id, |c| c.process(exec_id)?.io.resize(width, height))
    }

    /// containerd's Update (kubelet's in-place resize through CRI's
    /// UpdateContainerResources): as runc-v2, `runc update` of a created,
    /// running or paused container; a suspended one (or one created from a
    /// checkpoint, not started yet) has no runc container to update, so
    /// the update is kept for its restore ([`resources`]): in its
    /// `config.json` and in its restore template. A running container's
    /// update is written into `config.json` as well, for a later restore
    /// by runc. A stopped container is refused, as runc-v2 does.
    pub async fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        let update = resources::RuncUpdate::parse(resources_json)?;
        loop {
            self.settled(id).await;
            let lock = self.with(id, |c| Ok(c.resources.clone()))?;
            let _held = lock.lock().await;
            let (runc, bundle, state) = self.with(id, |c| Ok((c.runc.clone(), c.bundle.clone(), c.state.update_target())))?;
            match state {
                // a pause, thaw, create or start under way: after it
                UpdateTarget::Busy => continue,
                UpdateTarget::Stopped => {
                    return Err(Error::FailedPrecondition(format!("container {id} is stopped: its resources cannot be updated")))
                }
                UpdateTarget::Live => {
                    runc.update(id, resources_json, &bundle).await?;
                    if let Err(e) = keep_update(&bundle, &update) {
                        // Applied; only a later restore by runc would miss it.
                        warn!(container = id, "resources updated, but not written into config.json for a restore by runc: {e}");
                    }
                    return Ok(());
                }
                UpdateTarget::Checkpointed => {
                    keep_update(&bundle, &update)?;
                    let carried = criu_restore::update_template(&bundle, &update)?;
                    info!(container = id, template = carried, "resources of the suspended container updated: kept for its restore");
                    return Ok(());
                }
            }
        }
    }

    /// The container's cgroup stats, read in this process (no runc).
    pub fn stats(&self, id: &str) -> Result<cgroup::Stats> {
        let (cg, checkpointed) = self.with(id, |c| Ok((c.cgroup.clone(), c.state.checkpointed())))?;
        if checkpointed {
            // No process, no memory: all counters are zero.
            return Ok(cgroup::Stats::default());
        }
        cg.ok_or_else(|| Error::NotFound(format!("the cgroup of container {id} (its process was gone when it was looked up)")))?.stats()
    }

    /// A receiver that sees the exit of the process.
    pub fn exit_watch(&self, id: &str, exec_id: &str) -> Result<tokio::sync::watch::Receiver<Option<ExitInfo>>> {
        self.with(id, |c| Ok(c.process(exec_id)?.exit_watch()))
    }

    /// Pid of a container's init, for Connect.
    pub fn init_pid(&self, id: &str) -> Result<i32> {
        self.with(id, |c| Ok(c.init.pid))
    }

    pub fn is_empty(&self) -> bool {
        self.lock().containers.is_empty()
    }

    /// Whether any app (non-sandbox) container is left.
    pub fn has_app_containers(&self) -> bool {
        self.lock().containers.values().any(|c| !c.sandbox)
    }

    /// The app containers that run, or ran and are checkpointed (sorted ids).
    pub fn app_containers(&self) -> Vec<String> {
        let t = self.lock();
        let mut ids: Vec<String> = t.containers.values().filter(|c| c.is_live_app()).map(|c| c.id.clone()).collect();
        ids.sort();
        ids
    }

    /// The mount points where container `id`'s spec has runc make a fresh
    /// tmpfs ([`crate::oci::spec::fresh_tmpfs_mounts`]), for
    /// [`crate::system::tmpfs`].
    pub fn fresh_tmpfs_mounts(&self, id: &str) -> Result<Vec<String>> {
        let bundle = self.with(id, |c| Ok(c.bundle.clone()))?;
        Ok(crate::oci::spec::fresh_tmpfs_mounts(&crate::oci::spec::read_spec(&bundle)?))
    }

    /// What the lifecycle needs of app container `id`.
    pub fn app_info(&self, id: &str) -> Result<AppInfo> {
        self.with(id, |c| {
            Ok(AppInfo {
                pid: c.init.pid,
                netns: c.netns.clone(),
                actor: c.actor.clone(),
                terminal: c.init.stdio.terminal,
                rootfs_upper: c.rootfs_upper.clone(),
            })
        })
    }

    /// Whether container `id`'s CRIU configuration is torpor's, which takes
    /// the options of each dump and restore (not the user's own
    /// `org.criu.config`).
    pub fn takes_criu_options(&self, id: &str) -> bool {
        self.with(id, |c| Ok(c.bundle.join(bundle::OWN_CRIU_CONFIG).exists())).unwrap_or(false)
    }

    /// Whether container `id` has exec sessions running.
    pub fn has_live_execs(&self, id: &str) -> Result<bool> {
        self.with(id, |c| Ok(c.has_live_execs()))
    }

    /// Whether container `id` was checkpointed by a suspend.
    pub fn is_suspended(&self, id: &str) -> bool {
        self.lock().containers.get(id).is_some_and(|c| matches!(c.state, ContainerState::Suspended { .. }))
    }

    /// The containerd status of container `id`'s init.
    pub fn status(&self, id: &str) -> Option<Status> {
        self.lock().containers.get(id).map(|c| c.state.status())
    }

    /// The shortest `torpor.dev/idle-after` of the app containers.
    pub fn idle_after(&self) -> Option<std::time::Duration> {
        self.lock().containers.values().filter(|c| !c.sandbox).filter_map(|c| c.actor.idle_after).min()
    }

    /// The init pids of the app containers that have one.
    pub fn app_pids(&self) -> Vec<i32> {
        self.lock().containers.values().filter(|c| !c.sandbox && c.init.pid > 0).map(|c| c.init.pid).collect()
    }

    /// Whether app container `id` stops into a suspend
    /// (`torpor.dev/on-stop: suspend`) and is not suspended already.
    pub fn suspends_on_stop(&self, id: &str) -> bool {
        self.lock()
            .containers
            .get(id)
            .is_some_and(|c| !c.sandbox && !matches!(c.state, ContainerState::Suspended { .. }) && c.actor.suspend_on_stop)
    }
}

fn find_pid(t: &Table, pid: i32) -> Option<(String, String)> {
    for c in t.containers.values() {
        if c.init.pid == pid {
            return Some((c.id.clone(), String::new()));
        }
        if let Some(e) = c.execs.values().find(|e| e.process.pid == pid) {
            return Some((c.id.clone(), e.process.exec_id.clone()));
        }
    }
    None
}

fn container<'a>(t: &'a Table, id: &str) -> Result<&'a Container> {
    t.containers.get(id).ok_or_else(|| Error::NotFound(format!("container {id}")))
}

fn container_mut<'a>(t: &'a mut Table, id: &str) -> Result<&'a mut Container> {
    t.containers.get_mut(id).ok_or_else(|| Error::NotFound(format!("container {id}")))
}

/// The bundle's CRIU work directory for a restore at Start.
pub fn criu_work(bundle: &Path) -> PathBuf {
    bundle.join("criu-work")
}

/// After the dump of container `id`: the SysV IPC objects CRIU took into
/// its images are removed from the pod's IPC namespace, which the
/// container joined and which outlives it ([`sysv_ipc`]); else its restore
/// fails on them. A failure is logged: the dump stands, and a restore
/// would name the object in its error.
async fn remove_dumped_ipc_objects(id: &str, ns: PathBuf) {
    match tokio::task::spawn_blocking(move || sysv_ipc::remove_dumped(&ns)).await {
        Ok(Ok(r)) if r.attached.is_empty() => {
            if r.shm + r.sem + r.msg > 0 {
                info!(
                    container = id,
                    shm = r.shm,
                    sem = r.sem,
                    msg = r.msg,
                    "SysV IPC objects of the dump removed from the pod's namespace"
                );
            }
        }
        Ok(Ok(r)) => warn!(
            container = id,
            attached = ?r.attached,
            "shared memory segments of the pod's IPC namespace are still attached after the dump: a restore of the container fails on them"
        ),
        Ok(Err(e)) => warn!(container = id, "the SysV IPC objects of the pod stay after the dump: {e}"),
        Err(e) => warn!(container = id, "the SysV IPC objects of the pod stay after the dump: {e}"),
    }
}

/// Writes an update of the resources into the bundle's `config.json`,
/// what a restore by runc (or a cold start) creates the container from.
fn keep_update(bundle: &Path, update: &resources::RuncUpdate) -> Result<()> {
    if update.is_empty() {
        return Ok(());
    }
    let mut spec = crate::oci::spec::read_spec_json(bundle)?;
    resources::merge_into_spec(&mut spec, update).map_err(|e| e.context(&format!("config.json of bundle {}", bundle.display())))?;
    crate::oci::spec::write_spec_json(bundle, &spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with one running app container whose init is `pid` (in its
    /// own pid namespace: no `runc kill` at its exit).
    fn table_with(pid: i32) -> (Tasks, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let tasks = Tasks::new("test", tx);
        let bundle = PathBuf::from("/nonexistent/bundle");
        let mut init = Process::new("", StdioConfig::default());
        init.pid = pid;
        let c = Container {
            id: "app".into(),
            runc: Runc::new("/nonexistent/runc", "/nonexistent/root", &bundle),
            bundle,
            init,
            state: ContainerState::Running,
            execs: HashMap::new(),
            actor: ActorSpec::default(),
            own_pid_ns: true,
            cgroup: None,
            oom: None,
            sandbox: false,
            netns: None,
            ipcns: None,
            rootfs_upper: None,
            exit_hold: None,
            resources: Arc::default(),
        };
        tasks.lock().containers.insert("app".into(), c);
        (tasks, rx)
    }

    /// A table with one app container in `state`, its bundle `bundle`
    /// (a `config.json` with resources in it) and runc `runc`.
    fn table_in(bundle: &Path, runc: &Path, state: ContainerState) -> Tasks {
        let (tx, _rx) = mpsc::unbounded_channel();
        let tasks = Tasks::new("test", tx);
        std::fs::write(
            bundle.join("config.json"),
            br#"{"ociVersion":"1.2.0","linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}],"cpu":{"shares":512,"quota":50000,"period":100000},"memory":{"limit":134217728}}}}"#,
        )
        .unwrap();
        let mut init = Process::new("", StdioConfig::default());
        init.pid = 4545;
        let c = Container {
            id: "app".into(),
            runc: Runc::new(runc, bundle.join("runc-root"), bundle),
            bundle: bundle.to_path_buf(),
            init,
            state,
            execs: HashMap::new(),
            actor: ActorSpec::default(),
            own_pid_ns: true,
            cgroup: None,
            sandbox: false,
            netns: None,
            ipcns: None,
            rootfs_upper: None,
            exit_hold: None,
            resources: Arc::default(),
            oom: None,
        };
        tasks.lock().containers.insert("app".into(), c);
        tasks
    }

    const RESIZE: &[u8] = br#"{"cpu":{"shares":10,"quota":50000,"period":100000},"memory":{"limit":134217728},"devices":[]}"#;

    fn spec_resources(bundle: &Path) -> serde_json::Value {
        crate::oci::spec::read_spec_json(bundle).unwrap()["linux"]["resources"].clone()
    }

    /// A suspended container has no runc container: the update goes into
    /// its config.json and its restore template, runc is not run (it does
    /// not exist here), and the update succeeds. Without the fix, `runc
    /// update` of the checkpointed container failed.
    #[tokio::test]
    async fn an_update_of_a_suspended_container_is_kept_for_its_restore() {
        let b = tempfile::tempdir().unwrap();
        let tasks = table_in(b.path(), Path::new("/nonexistent/runc"), ContainerState::Suspended { io: ProcessIo::null() });
        tasks.update("app", RESIZE).await.unwrap();
        let r = spec_resources(b.path());
        assert_eq!(r["cpu"]["shares"], 10);
        assert_eq!(r["memory"]["limit"], 134217728);
        assert_eq!(r["devices"].as_array().map(Vec::len), Some(1), "the device rules are not the update's");
        assert_eq!(tasks.status("app"), Some(Status::Running), "still RUNNING to containerd");
        // with a template: carried into it
        std::fs::write(
            b.path().join("torpor-restore-template.json"),
            br#"{"state":{"id":"app","config":{"cgroups":{"cpu_shares":512}}},"cgroup":{"cpu":{"cpu.shares":"512\n"}},"oom_kill_disable":false}"#,
        )
        .unwrap();
        tasks.update("app", br#"{"cpu":{"shares":20}}"#).await.unwrap();
        let t: serde_json::Value = serde_json::from_slice(&std::fs::read(b.path().join("torpor-restore-template.json")).unwrap()).unwrap();
        assert_eq!(t["cgroup"]["cpu"]["cpu.shares"], "20");
        assert_eq!(t["state"]["config"]["cgroups"]["cpu_shares"], 20);
        assert_eq!(spec_resources(b.path())["cpu"]["shares"], 20);
        let e = tasks.update("app", b"{not json").await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }

    /// A running container is updated by `runc update` (as runc-v2 does),
    /// and its config.json keeps the update for a later restore by runc.
    #[tokio::test]
    async fn an_update_of_a_running_container_is_runcs_and_kept() {
        let b = tempfile::tempdir().unwrap();
        let fake = b.path().join("runc");
        let log = b.path().join("runc-args");
        std::fs::write(&fake, format!("#!/bin/sh\necho \"$@\" >> {}\nexit 0\n", log.display())).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let tasks = table_in(b.path(), &fake, ContainerState::Running);
        tasks.update("app", RESIZE).await.unwrap();
        let args = std::fs::read_to_string(&log).unwrap();
        assert!(args.contains(" update --resources ") && args.trim_end().ends_with(" app"), "{args}");
        assert_eq!(spec_resources(b.path())["cpu"]["shares"], 10);
        // a failing runc update fails the update
        std::fs::write(&fake, "#!/bin/sh\necho '{\"level\":\"error\",\"msg\":\"no such container\"}' >&2\nexit 1\n").unwrap();
        assert!(tasks.update("app", br#"{"cpu":{"shares":30}}"#).await.is_err());
        assert_eq!(spec_resources(b.path())["cpu"]["shares"], 10, "not kept when not applied");
    }

    #[tokio::test]
    async fn a_stopped_container_is_not_updated() {
        let b = tempfile::tempdir().unwrap();
        let tasks = table_in(b.path(), Path::new("/nonexistent/runc"), ContainerState::Stopped);
        let e = tasks.update("app", RESIZE).await.unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(tasks.update("nope", RESIZE).await.is_err());
    }

    /// An update that comes while a dump runs waits for it and then goes
    /// where the container is: here, suspended.
    #[tokio::test]
    async fn an_update_during_a_dump_waits_for_it() {
        let b = tempfile::tempdir().unwrap();
        let tasks = table_in(b.path(), Path::new("/nonexistent/runc"), ContainerState::Dumping { back: Box::new(ContainerState::Running) });
        let t2 = tasks.clone();
        let update = tokio::spawn(async move { t2.update("app", RESIZE).await });
        settle_tasks().await;
        assert!(!update.is_finished(), "it waits for the dump");
        assert_eq!(spec_resources(b.path())["cpu"]["shares"], 512);
        tasks.settle("app", |c| c.state = ContainerState::Suspended { io: ProcessIo::null() });
        update.await.unwrap().unwrap();
        assert_eq!(spec_resources(b.path())["cpu"]["shares"], 10);
    }

    /// Lets every spawned task run as far as it can.
    async fn settle_tasks() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// The init `pid` of [`table_with`] exits (`status`) under a hold.
    async fn exited_under_a_hold(pid: i32, status: i32) -> (Tasks, mpsc::UnboundedReceiver<Event>, ExitHold) {
        let (tasks, events) = table_with(pid);
        let hold = ExitHold::default();
        tasks.hold_init_exit("app", &hold).unwrap();
        tasks.process_exited("app", "", pid, status).await;
        settle_tasks().await;
        (tasks, events, hold)
    }

    #[tokio::test]
    async fn a_held_exit_is_reported_once_the_hold_is_dropped() {
        let (tasks, mut events, hold) = exited_under_a_hold(4242, 9).await;
        assert!(events.try_recv().is_err(), "no exit while the hold lives");
        assert_eq!(tasks.status("app"), Some(Status::Running));
        drop(hold);
        match events.recv().await {
            Some(Event::Exit { container_id, exec_id, pid, exit }) => {
                assert_eq!((container_id.as_str(), exec_id.as_str(), pid, exit.status), ("app", "", 4242, 9));
            }
            other => panic!("expected the held exit, got {other:?}"),
        }
        assert_eq!(tasks.status("app"), Some(Status::Stopped));
    }

    #[tokio::test]
    async fn a_held_exit_of_an_undone_restore_is_no_exit() {
        let (tasks, mut events, hold) = exited_under_a_hold(4343, 9).await;
        // What `unrestore` does before its `runc delete`.
        {
            let mut t = tasks.lock();
            let c = t.containers.get_mut("app").unwrap();
            c.state = ContainerState::Suspended { io: ProcessIo::null() };
            t.retired_pids.insert(4343);
        }
        drop(hold);
        settle_tasks().await;
        assert!(events.try_recv().is_err(), "an undone restore's init did not exit");
        assert_eq!(tasks.status("app"), Some(Status::Running), "to containerd it still runs");
        assert!(tasks.lock().retired_pids.is_empty(), "the retired pid is not kept for a later process");
    }

    #[tokio::test]
    async fn an_exit_without_a_hold_or_after_it_is_reported_at_once() {
        let (tasks, mut events) = table_with(4444);
        {
            let hold = ExitHold::default();
            tasks.hold_init_exit("app", &hold).unwrap();
        }
        tasks.process_exited("app", "", 4444, 0).await;
        assert!(matches!(events.try_recv(), Ok(Event::Exit { pid: 4444, .. })), "a dropped hold holds nothing");
    }
}
