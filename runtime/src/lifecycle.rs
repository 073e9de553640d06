//! Suspend, resume and freeze of the actor: all app containers of the shim
//! (the pod's, under CRI) as one unit.
//!
//! - **freeze**: every app container in the cgroup freezer (memory stays);
//! - **suspend**: freeze all, checkpoint each with CRIU (the processes end,
//!   their memory is freed), while containerd keeps seeing them RUNNING: no
//!   exit is published and their stdio FIFOs stay open;
//! - **resume**: `runc restore` of each into the same bundle, rootfs and pod
//!   network namespace.
//!
//! Each transition is persisted before it is acted on. A suspend that fails
//! part-way restores or thaws what it already touched: the actor is RUNNING
//! again, and the reason is kept in its record.

use std::time::Instant;

use log::{info, warn};

use crate::actor::{Lifecycle, Record, Store};
use crate::container::{container_mut, Runtime};
use crate::error::{Error, IoContext, Result};
use crate::failpoint;
use crate::process::Status;
use crate::runc::{CheckpointOpts, RestoreFrom};
use crate::stdio;

impl Runtime {
    /// Sets up the actor record when the first app container is created.
    pub(crate) async fn actor_init(&self, group: &str, actor_id: Option<String>) -> Result<()> {
        let mut slot = self.actor.lock().await;
        if slot.is_some() {
            return Ok(());
        }
        let store = Store::new(&self.state_root, group)?;
        let record = Record::new(actor_id.unwrap_or_else(|| group.to_string()));
        store.save(&record)?;
        *slot = Some((store, record));
        Ok(())
    }

    /// Records app container `id`'s name (its identity within the actor) and
    /// cgroup, before it runs.
    pub(crate) async fn actor_add_member(&self, id: &str, name: &str, cgroup: Option<String>) -> Result<()> {
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return Ok(()) };
        rec.names.insert(id.to_string(), name.to_string());
        if let Some(cg) = cgroup {
            rec.cgroups.insert(id.to_string(), cg);
        }
        store.save(rec)
    }

    /// The actor's record, if the shim has app containers.
    pub async fn actor_status(&self) -> Option<Record> {
        let slot = self.actor.lock().await;
        let (_, rec) = slot.as_ref()?;
        let mut rec = rec.clone();
        rec.containers = self.app_containers().await;
        Some(rec)
    }

    async fn app_containers(&self) -> Vec<String> {
        let inner = self.inner.lock().await;
        let mut ids: Vec<String> = inner
            .containers
            .values()
            .filter(|c| !c.sandbox && c.init.exit_info().is_none() && c.init.status != Status::Created)
            .map(|c| c.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// FROZEN: all app containers in the cgroup freezer.
    pub async fn freeze(&self) -> Result<Record> {
        let mut slot = self.actor.lock().await;
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        if rec.state != Lifecycle::Running {
            return Err(Error::FailedPrecondition(format!("actor {} is {}, not RUNNING", rec.actor, rec.state)));
        }
        let ids = self.app_containers().await;
        rec.state = Lifecycle::Frozen;
        rec.containers = ids.clone();
        store.save(rec)?;
        let mut inner = self.inner.lock().await;
        for id in &ids {
            let c = container_mut(&mut inner, id)?;
            if c.init.status == Status::Running {
                c.runc.pause(id).await?;
                c.init.status = Status::Paused;
            }
        }
        info!(actor = rec.actor.as_str(); "actor frozen");
        Ok(rec.clone())
    }

    /// SUSPENDED: checkpoint every app container and free its memory.
    pub async fn suspend(&self) -> Result<Record> {
        let started = Instant::now();
        let mut slot = self.actor.lock().await;
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        if !matches!(rec.state, Lifecycle::Running | Lifecycle::Frozen) {
            return Err(Error::FailedPrecondition(format!("actor {} is {}: only a RUNNING or FROZEN actor can be suspended", rec.actor, rec.state)));
        }
        let ids = self.app_containers().await;
        if ids.is_empty() {
            return Err(Error::FailedPrecondition(format!("actor {} has no running container", rec.actor)));
        }
        let was = rec.state;
        self.wait_lazy_daemons().await;
        let (netns, ports) = self.activation_target(&ids).await;
        rec.generation += 1;
        rec.state = Lifecycle::Suspending;
        rec.containers = ids.clone();
        store.save(rec)?;
        let generation = rec.generation;
        failpoint::hit(&store.key(), failpoint::SUSPEND_AFTER_PERSIST);

        let result = self.checkpoint_all(store, generation, &ids, was == Lifecycle::Frozen).await;
        match result {
            Ok(()) => {
                failpoint::hit(&store.key(), failpoint::SUSPEND_AFTER_DUMP);
                rec.state = Lifecycle::Suspended;
                rec.last_error = None;
                rec.committed_at_ms = Some(crate::actor::now_ms());
                rec.last_suspend_ms = Some(started.elapsed().as_millis() as u64);
                store.save(rec)?;
                // An older generation is superseded only once this one is complete.
                remove_other_generations(store, generation);
                if let Some(ns) = &netns {
                    if let Err(e) = crate::activation::unlock_criu_network(ns).await {
                        warn!(actor = rec.actor.as_str(); "{e}");
                    }
                }
                if let (Some(netns), false) = (netns, ports.is_empty()) {
                    match crate::activation::Armed::arm(&netns, ports, self.wake.clone()) {
                        Ok(armed) => *self.activation.lock().await = Some(armed),
                        Err(e) => warn!(actor = rec.actor.as_str(); "no activation on inbound connections: {e}"),
                    }
                }
                info!(actor = rec.actor.as_str(), ms = rec.last_suspend_ms; "actor suspended");
                Ok(rec.clone())
            }
            Err(e) => {
                warn!(actor = rec.actor.as_str(); "suspend failed, actor keeps running: {e}");
                rec.state = if was == Lifecycle::Frozen { Lifecycle::Frozen } else { Lifecycle::Running };
                rec.last_error = Some(e.to_string());
                rec.generation -= 1;
                let _ = std::fs::remove_dir_all(store.generation_dir(generation));
                store.save(rec)?;
                Err(e)
            }
        }
    }

    /// Freeze all, dump each; on a failure, bring back what was touched, to
    /// the state it had (`was_frozen`: paused).
    async fn checkpoint_all(&self, store: &Store, generation: u64, ids: &[String], was_frozen: bool) -> Result<()> {
        let mut inner = self.inner.lock().await;
        for id in ids {
            let c = container_mut(&mut inner, id)?;
            if !c.execs.values().all(|p| p.exit_info().is_some() || p.status == Status::Created) {
                return Err(Error::FailedPrecondition(format!("container {id} has exec sessions running")));
            }
        }
        let mut frozen = Vec::new();
        let mut dumped = Vec::new();
        let mut failure = None;
        for id in ids {
            let c = container_mut(&mut inner, id)?;
            if c.init.status == Status::Running {
                if let Err(e) = c.runc.pause(id).await {
                    failure = Some(e);
                    break;
                }
                // Only what this suspend paused is thawed by a rollback.
                frozen.push(id.clone());
            }
        }
        if failure.is_none() {
            failpoint::hit(&store.key(), failpoint::SUSPEND_AFTER_FREEZE);
            for id in ids {
                let c = container_mut(&mut inner, id)?;
                let image = store.image_dir(generation, id);
                let work = store.generation_dir(generation).join(format!("{id}.work"));
                let mkdirs = std::fs::create_dir_all(&image)
                    .and_then(|_| std::fs::create_dir_all(&work))
                    .io_context(|| format!("create {image:?}"));
                if let Err(e) = mkdirs {
                    failure = Some(e);
                    break;
                }
                let opts = CheckpointOpts {
                    exit: true,
                    open_tcp: true,
                    external_unix_sockets: true,
                    file_locks: true,
                    terminal: c.init.stdio.terminal,
                    image_path: image,
                    work_path: work,
                    ..Default::default()
                };
                // From here the process ends as the dump completes: it is not an exit.
                c.suspended = true;
                failpoint::hit(&store.key(), failpoint::SUSPEND_DURING_DUMP);
                match c.runc.checkpoint(id, &opts).await {
                    Ok(()) => {
                        let old = c.init.pid;
                        c.suspended_io = Some(std::mem::replace(&mut c.init.io, stdio::ProcessIo::null()));
                        inner.retired_pids.insert(old);
                        let c = container_mut(&mut inner, id)?;
                        // To containerd the container is still running.
                        c.init.status = Status::Running;
                        dumped.push(id.clone());
                        // Durably complete: a shim death from here on keeps this dump.
                        if let Err(e) = store.mark_dumped(generation, id) {
                            failure = Some(e);
                            break;
                        }
                    }
                    Err(e) => {
                        c.suspended = false;
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let Some(e) = failure else { return Ok(()) };
        // Roll back: restore what was dumped, thaw what was only frozen.
        drop(inner);
        for id in &dumped {
            if let Err(re) = self.restore_one(store, generation, id).await {
                warn!(container = id.as_str(); "rollback restore after a failed suspend: {re}");
            }
        }
        let mut inner = self.inner.lock().await;
        if was_frozen {
            // A frozen actor goes back to frozen: re-pause what was restored.
            for id in &dumped {
                if let Ok(c) = container_mut(&mut inner, id) {
                    if c.init.status == Status::Running && c.runc.pause(id).await.is_ok() {
                        c.init.status = Status::Paused;
                    }
                }
            }
        }
        for id in frozen.iter().filter(|id| !dumped.contains(id)) {
            if let Ok(c) = container_mut(&mut inner, id) {
                if let Err(re) = c.runc.resume(id).await {
                    warn!(container = id.as_str(); "rollback thaw after a failed suspend: {re}");
                }
                c.init.status = Status::Running;
            }
        }
        Err(e)
    }

    /// `runc restore` of one suspended container from generation `generation`:
    /// with lazy pages (memory served on demand over userfaultfd by a `criu
    /// lazy-pages` daemon, the rest prefetched in the background), falling
    /// back to a full restore when that cannot be used.
    async fn restore_one(&self, store: &Store, generation: u64, id: &str) -> Result<i32> {
        let image = store.image_dir(generation, id);
        let gen_dir = store.generation_dir(generation);
        if lazy_pages_enabled() {
            let work = gen_dir.join(format!("{id}.lazy-work"));
            match LazyDaemon::start(&image, &work).await {
                Ok(daemon) => {
                    let from = RestoreFrom { image: image.clone(), work, lazy: true };
                    match self.restore_container(id, &from).await {
                        Ok(pid) => {
                            self.lazy.lock().await.push(daemon.finish());
                            return Ok(pid);
                        }
                        Err(e) => {
                            warn!(container = id; "lazy-pages restore failed, restoring in full: {e}");
                            daemon.kill();
                        }
                    }
                }
                Err(e) => warn!(container = id; "no lazy pages ({e}): restoring in full"),
            }
        }
        let work = gen_dir.join(format!("{id}.restore-work"));
        self.restore_container(id, &RestoreFrom { image, work, lazy: false }).await
    }

    /// Waits until every lazy-pages daemon has served all its pages (a
    /// process with pages still missing cannot be dumped again).
    async fn wait_lazy_daemons(&self) {
        let pending: Vec<_> = std::mem::take(&mut *self.lazy.lock().await);
        for h in pending {
            let _ = h.await;
        }
    }

    /// RUNNING again: restore a suspended actor, or thaw a frozen one.
    pub async fn resume_actor(&self) -> Result<Record> {
        let started = Instant::now();
        let mut slot = self.actor.lock().await;
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        match rec.state {
            Lifecycle::Frozen => {
                let mut inner = self.inner.lock().await;
                for id in &rec.containers {
                    if let Ok(c) = container_mut(&mut inner, id) {
                        if c.init.status == Status::Paused {
                            c.runc.resume(id).await?;
                            c.init.status = Status::Running;
                        }
                    }
                }
                rec.state = Lifecycle::Running;
                rec.last_resume_ms = Some(started.elapsed().as_millis() as u64);
                store.save(rec)?;
                return Ok(rec.clone());
            }
            Lifecycle::Suspended => {}
            s => return Err(Error::FailedPrecondition(format!("actor {} is {s}, not SUSPENDED or FROZEN", rec.actor))),
        }
        rec.state = Lifecycle::Resuming;
        store.save(rec)?;
        failpoint::hit(&store.key(), failpoint::RESUME_AFTER_PERSIST);
        let armed = self.activation.lock().await.take();
        let handover = match armed {
            Some(a) => Some(a.begin_handover().await),
            None => None,
        };
        let result = self.restore_all(store, rec).await;
        if result.is_ok() {
            failpoint::hit(&store.key(), failpoint::RESUME_AFTER_RESTORE);
            // RUNNING is recorded before the held connections are let in:
            // once the actor serves, its checkpoint is no longer its state.
            rec.state = Lifecycle::Running;
            rec.last_error = None;
            rec.last_resume_ms = Some(started.elapsed().as_millis() as u64);
            rec.committed_at_ms = None;
            if let Err(e) = store.save(rec) {
                warn!(actor = rec.actor.as_str(); "resumed, but the record could not be saved: {e}");
            }
        }
        if let Some(h) = handover {
            h.finish().await;
        }
        result?;
        // The images go once the lazy-pages daemons are done with them.
        let gen_dir = store.generation_dir(rec.generation);
        let pending: Vec<_> = std::mem::take(&mut *self.lazy.lock().await);
        self.lazy.lock().await.push(tokio::spawn(async move {
            for h in pending {
                let _ = h.await;
            }
            let _ = std::fs::remove_dir_all(gen_dir);
        }));
        info!(actor = rec.actor.as_str(), ms = rec.last_resume_ms; "actor resumed");
        Ok(rec.clone())
    }

    async fn restore_all(&self, store: &Store, rec: &mut Record) -> Result<()> {
        for id in rec.containers.clone() {
            let suspended = {
                let inner = self.inner.lock().await;
                inner.containers.get(&id).is_some_and(|c| c.suspended)
            };
            if !suspended {
                continue;
            }
            failpoint::hit(&store.key(), failpoint::RESUME_DURING_RESTORE);
            if let Err(e) = self.restore_one(store, rec.generation, &id).await {
                warn!(actor = rec.actor.as_str(), container = id.as_str(); "resume failed: {e}");
                rec.state = Lifecycle::Suspended;
                rec.last_error = Some(e.to_string());
                store.save(rec)?;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The pod network namespace and the TCP ports to hold while suspended:
    /// `torpor.dev/activate-on`, or what the actor listens on now.
    async fn activation_target(&self, ids: &[String]) -> (Option<std::path::PathBuf>, Vec<u16>) {
        let inner = self.inner.lock().await;
        let mut netns = None;
        let mut ports = Vec::new();
        for c in ids.iter().filter_map(|id| inner.containers.get(id)) {
            netns = netns.or_else(|| c.netns.clone());
            match &c.actor.activate_on {
                Some(p) => ports.extend(p.iter().copied()),
                None if c.init.pid > 0 => ports.extend(crate::activation::listening_ports(c.init.pid)),
                None => {}
            }
        }
        ports.sort_unstable();
        ports.dedup();
        (netns, ports)
    }

    /// Resumes the actor if `id` is one of its suspended or frozen containers
    /// (before an exec, for example).
    pub async fn ensure_running(&self, id: &str) -> Result<()> {
        let state = {
            let slot = self.actor.lock().await;
            match slot.as_ref() {
                Some((_, rec)) if rec.containers.iter().any(|c| c == id) => rec.state,
                _ => return Ok(()),
            }
        };
        if matches!(state, Lifecycle::Suspended | Lifecycle::Frozen) {
            self.resume_actor().await?;
        }
        Ok(())
    }

    /// Kill of a suspended container: there is no process to signal, so the
    /// exit is recorded (128 + signal) and published here.
    pub(crate) async fn kill_suspended(&self, id: &str, signal: u32) -> Result<bool> {
        let mut inner = self.inner.lock().await;
        let Some(c) = inner.containers.get_mut(id) else { return Ok(false) };
        if !c.suspended {
            return Ok(false);
        }
        let is_stop = signal == libc::SIGKILL as u32 || signal == libc::SIGTERM as u32;
        if !is_stop {
            return Ok(true); // other signals wait for the resume-less stop
        }
        c.suspended = false;
        let pid = c.init.pid;
        let mut io = c.suspended_io.take().unwrap_or_else(stdio::ProcessIo::null);
        io.close();
        let exit = c.init.set_exited(128 + signal);
        info!(container = id, signal; "suspended container stopped");
        drop(inner);
        // Nothing to wake any more: release the held ports.
        self.activation.lock().await.take();
        let _ = self.events.send(crate::container::Event::Exit {
            container_id: id.to_string(),
            exec_id: String::new(),
            pid,
            exit,
        });
        Ok(true)
    }

    /// Drops the actor's record and images once no app container is left.
    pub(crate) async fn actor_forget_if_empty(&self) {
        let empty = {
            let inner = self.inner.lock().await;
            !inner.containers.values().any(|c| !c.sandbox)
        };
        if !empty {
            return;
        }
        let mut slot = self.actor.lock().await;
        if let Some((store, _)) = slot.take() {
            if let Err(e) = store.remove() {
                warn!("remove actor state: {e}");
            }
            if let Some(key) = store.dir().file_name() {
                let _ = std::fs::remove_dir_all(crate::policy::request_dir(&key.to_string_lossy()));
            }
        }
    }
}

/// Lazy-pages restore is on unless `TORPOR_LAZY_PAGES=0`.
fn lazy_pages_enabled() -> bool {
    std::env::var("TORPOR_LAZY_PAGES").map(|v| v != "0").unwrap_or(true)
}

/// A `criu lazy-pages` daemon serving one container's memory.
struct LazyDaemon {
    pid: i32,
    exit: crate::reaper::Subscription,
}

impl LazyDaemon {
    /// Starts the daemon and waits until it listens in `work`.
    async fn start(image: &std::path::Path, work: &std::path::Path) -> Result<LazyDaemon> {
        std::fs::create_dir_all(work).io_context(|| format!("create {work:?}"))?;
        let exit = crate::reaper::subscribe();
        let mut cmd = std::process::Command::new("criu");
        cmd.arg("lazy-pages")
            .arg("--images-dir")
            .arg(image)
            .arg("--work-dir")
            .arg(work)
            .args(["--log-file", "lazy-pages.log"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        crate::reaper::tag(&mut cmd);
        let child = cmd.spawn().io_context(|| "spawn criu lazy-pages".into())?;
        let pid = child.id() as i32;
        drop(child); // reaped by the reaper
        let socket = work.join("lazy-pages.socket");
        let mut daemon = LazyDaemon { pid, exit };
        for _ in 0..400 {
            if socket.exists() {
                return Ok(daemon);
            }
            if let Ok(Some(e)) = tokio::time::timeout(std::time::Duration::from_millis(5), daemon.exit.next()).await {
                if e.pid == pid {
                    return Err(Error::InvalidArgument(format!(
                        "criu lazy-pages exited with {} (see {:?})",
                        e.status,
                        work.join("lazy-pages.log")
                    )));
                }
            }
        }
        daemon.kill();
        Err(Error::InvalidArgument("criu lazy-pages did not start listening".into()))
    }

    /// A task that ends when the daemon has served every page and exited.
    fn finish(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let pid = self.pid;
            let _ = self.exit.wait_for(pid).await;
        })
    }

    fn kill(&self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGKILL);
    }
}

fn no_actor() -> Error {
    Error::FailedPrecondition("this shim has no actor (no app container)".into())
}

fn remove_other_generations(store: &Store, keep: u64) {
    let Ok(entries) = std::fs::read_dir(store.dir()) else { return };
    let keep = format!("gen-{keep}");
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("gen-") && name != keep {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
