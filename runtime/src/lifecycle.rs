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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::{info, warn};

use crate::actor::{Lifecycle, Record, StagingRecord, Store};
use crate::container::{container_mut, Runtime};
use crate::error::{Error, IoContext, Result};
use crate::failpoint;
use crate::process::Status;
use crate::runc::{CheckpointOpts, RestoreFrom};
use crate::snapshots::{self, SnapshotRef, SnapshotStore};
use crate::stdio;

impl Runtime {
    /// Sets up the actor record when the first app container is created,
    /// after claiming the actor on this node (see [`crate::claim`]): a
    /// second shim of the same actor is refused here.
    pub(crate) async fn actor_init(&self, group: &str, spec: &crate::spec::ActorSpec, explicit: bool) -> Result<()> {
        let mut slot = self.actor.lock().await;
        if slot.is_some() {
            return Ok(());
        }
        let store = Store::new(&self.state_root, group)?;
        let mut record = Record::new(spec.actor.clone().unwrap_or_else(|| group.to_string()));
        record.explicit_actor = explicit;
        record.keep_local_s = spec.keep_local.map(|d| d.as_secs().max(1));
        let claim = crate::claim::Claim::take(&record.actor, group)?;
        // One node runs the actor: its lease in the object tier (refused,
        // naming the holder, while another node has it).
        let epoch = async { SnapshotStore::connect().await?.acquire(&record.actor, group).await }
            .await
            .map_err(|e| with_context(e, &format!("actor {}", record.actor)))?;
        info!(actor = record.actor.as_str(), epoch; "actor lease held by this node");
        if let Err(e) = store.save(&record) {
            surrender_lease(&record.actor, group).await;
            return Err(e);
        }
        *self.claim.lock().unwrap_or_else(|p| p.into_inner()) = Some(claim);
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

    /// App container `id` started (cold or restored): the actor ran.
    pub(crate) async fn actor_ran(&self, id: &str) {
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return };
        if rec.ran || !rec.names.contains_key(id) {
            return;
        }
        rec.ran = true;
        if let Err(e) = store.save(rec) {
            warn!(actor = rec.actor.as_str(); "save the actor record: {e}");
        }
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
        self.freeze_as(None).await
    }

    /// FROZEN, by the lease fence when `fenced` gives the reason.
    pub(crate) async fn freeze_as(&self, fenced: Option<String>) -> Result<Record> {
        let mut slot = self.actor.lock().await;
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        if rec.state != Lifecycle::Running {
            return Err(Error::FailedPrecondition(format!("actor {} is {}, not RUNNING", rec.actor, rec.state)));
        }
        let ids = self.app_containers().await;
        rec.state = Lifecycle::Frozen;
        rec.containers = ids.clone();
        if let Some(why) = &fenced {
            rec.last_error = Some(why.clone());
        }
        rec.fenced = fenced;
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

    /// SUSPENDED: checkpoint every app container into a staging directory
    /// of the node's snapshot store and free its memory; the snapshot is
    /// committed in the background (the suspend returns once the memory is
    /// freed).
    pub async fn suspend(&self) -> Result<Record> {
        let started = Instant::now();
        // The lazy-pages daemons of the last resume must be done (a process
        // with pages still missing cannot be dumped). Waited for without the
        // actor lock: the task releasing their checkout takes it.
        let mut slot = loop {
            self.wait_lazy_daemons().await;
            let slot = self.actor.lock().await;
            if self.lazy.lock().await.is_empty() {
                break slot;
            }
        };
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        if !matches!(rec.state, Lifecycle::Running | Lifecycle::Frozen) {
            return Err(Error::FailedPrecondition(format!("actor {} is {}: only a RUNNING or FROZEN actor can be suspended", rec.actor, rec.state)));
        }
        let ids = self.app_containers().await;
        if ids.is_empty() {
            return Err(Error::FailedPrecondition(format!("actor {} has no running container", rec.actor)));
        }
        let was = rec.state;
        let (netns, ports) = self.activation_target(&ids).await;
        // Where the checkpoint goes: without the store there is nowhere to
        // put it, and the actor keeps running.
        let staging = match begin_staging(&rec.actor).await {
            Ok(s) => s,
            Err(e) => {
                warn!(actor = rec.actor.as_str(); "suspend refused, actor keeps running: {e}");
                rec.last_error = Some(e.to_string());
                store.save(rec)?;
                return Err(e);
            }
        };
        rec.generation += 1;
        rec.state = Lifecycle::Suspending;
        rec.containers = ids.clone();
        rec.staging = Some(StagingRecord { id: staging.id.clone(), path: staging.path.clone() });
        if let Err(e) = store.save(rec) {
            abort_staging(&staging).await;
            return Err(e);
        }
        let generation = rec.generation;
        failpoint::hit(&store.key(), failpoint::SUSPEND_AFTER_PERSIST);

        let images: Vec<(String, PathBuf)> = ids.iter().map(|id| (id.clone(), staging.path.join(name_of(rec, id)))).collect();
        let result = self.checkpoint_all(store, generation, &images, was == Lifecycle::Frozen).await;
        match result {
            Ok(()) => {
                // Every dump is complete: recorded before anything else, so
                // that a shim death from here on commits the staging.
                rec.state = Lifecycle::Suspended;
                rec.snapshot = None;
                rec.last_error = None;
                rec.restore_snapshot = None;
                rec.restored_names.clear();
                rec.committed_at_ms = Some(crate::actor::now_ms());
                rec.last_suspend_ms = Some(started.elapsed().as_millis() as u64);
                store.save(rec)?;
                failpoint::hit(&store.key(), failpoint::SUSPEND_AFTER_DUMP);
                let _ = std::fs::remove_dir_all(store.work_root());
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
                self.start_commit(store, rec);
                info!(actor = rec.actor.as_str(), ms = rec.last_suspend_ms; "actor suspended");
                Ok(rec.clone())
            }
            Err(e) => {
                warn!(actor = rec.actor.as_str(); "suspend failed, actor keeps running: {e}");
                abort_staging(&staging).await;
                rec.state = if was == Lifecycle::Frozen { Lifecycle::Frozen } else { Lifecycle::Running };
                rec.last_error = Some(e.to_string());
                rec.generation -= 1;
                rec.staging = None;
                let _ = std::fs::remove_dir_all(store.work_root());
                store.save(rec)?;
                Err(e)
            }
        }
    }

    /// Commits the suspend's staging directory in the background, retrying
    /// until it is committed (the processes are gone: the staging is the
    /// actor). A failure is kept in `last_error` (`torporctl status`).
    fn start_commit(&self, store: &Store, rec: &Record) {
        let Some(staging) = rec.staging.as_ref().map(StagingRecord::to_staging) else { return };
        let (tx, rx) = tokio::sync::watch::channel(CommitState::Running);
        *self.commit.lock().unwrap_or_else(|p| p.into_inner()) = Some(rx);
        let labels = commit_labels(&store.key(), rec);
        let keep_local = rec.keep_local_s.map(Duration::from_secs);
        let actor = rec.actor.clone();
        let me = self.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            loop {
                let _ = tx.send(CommitState::Running);
                let t = Instant::now();
                match commit_staging(&actor, &staging, labels.clone(), keep_local).await {
                    Ok(snap) => {
                        info!(actor = actor.as_str(), snapshot:% = snap, ms = t.elapsed().as_millis() as u64; "suspend committed to the snapshot store");
                        me.commit_settled(&staging, Ok(snap)).await;
                        let _ = tx.send(CommitState::Done);
                        return;
                    }
                    Err(e) => {
                        let lost = matches!(e, Error::NotFound(_));
                        warn!(actor = actor.as_str(), staging = staging.id.as_str(); "commit of the suspend failed{}: {e}", if lost { "" } else { " (retrying)" });
                        me.commit_settled(&staging, Err(&e)).await;
                        let _ = tx.send(CommitState::Failed(e.to_string()));
                        if lost {
                            return;
                        }
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(30));
                    }
                }
            }
        });
    }

    /// Records the outcome of a commit attempt.
    async fn commit_settled(&self, staging: &crate::snapshots::Staging, r: std::result::Result<SnapshotRef, &Error>) {
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return };
        if rec.staging.as_ref().map(|s| s.id.as_str()) != Some(staging.id.as_str()) {
            return;
        }
        match r {
            Ok(snap) => {
                rec.snapshot = Some(snap);
                rec.staging = None;
                if rec.last_error.as_deref().is_some_and(|e| e.starts_with(COMMIT_FAILED)) {
                    rec.last_error = None;
                }
            }
            Err(e) => rec.last_error = Some(format!("{COMMIT_FAILED} (retrying): {e}")),
        }
        if let Err(e) = store.save(rec) {
            warn!(actor = rec.actor.as_str(); "save the actor record after a commit: {e}");
        }
    }

    /// Waits for the attempt of a background commit under way; an error if
    /// it failed (it is retried; the actor stays SUSPENDED meanwhile).
    pub(crate) async fn wait_commit(&self) -> Result<()> {
        let rx = self.commit.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(mut rx) = rx else { return Ok(()) };
        let state = match rx.wait_for(|s| *s != CommitState::Running).await {
            Ok(s) => s.clone(),
            Err(_) => return Ok(()), // the task ended
        };
        match state {
            CommitState::Failed(e) => Err(Error::Store(format!("the suspend's snapshot is not committed: {e}"))),
            _ => Ok(()),
        }
    }

    /// Freeze all, dump each into its image directory; on a failure, bring
    /// back what was touched, to the state it had (`was_frozen`: paused).
    async fn checkpoint_all(&self, store: &Store, generation: u64, images: &[(String, PathBuf)], was_frozen: bool) -> Result<()> {
        let mut inner = self.inner.lock().await;
        for (id, _) in images {
            let c = container_mut(&mut inner, id)?;
            if !c.execs.values().all(|p| p.exit_info().is_some() || p.status == Status::Created) {
                return Err(Error::FailedPrecondition(format!("container {id} has exec sessions running")));
            }
        }
        let mut frozen = Vec::new();
        let mut dumped: Vec<(String, PathBuf)> = Vec::new();
        let mut failure = None;
        for (id, _) in images {
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
            for (id, image) in images {
                let c = container_mut(&mut inner, id)?;
                // CRIU's work dir (logs) stays outside the snapshot.
                let work = store.work_dir(generation, id, "dump");
                let mkdirs = std::fs::create_dir_all(image)
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
                    image_path: image.clone(),
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
                        dumped.push((id.clone(), image.clone()));
                        // Its files, while no process changes them.
                        if let Some(upper) = c.rootfs_upper.clone() {
                            if let Err(e) = capture_rootfs(id, &upper, image).await {
                                failure = Some(e);
                                break;
                            }
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
        for (id, image) in &dumped {
            if let Err(re) = self.restore_one(store, generation, id, image).await {
                warn!(container = id.as_str(); "rollback restore after a failed suspend: {re}");
            }
        }
        let mut inner = self.inner.lock().await;
        if was_frozen {
            // A frozen actor goes back to frozen: re-pause what was restored.
            for (id, _) in &dumped {
                if let Ok(c) = container_mut(&mut inner, id) {
                    if c.init.status == Status::Running && c.runc.pause(id).await.is_ok() {
                        c.init.status = Status::Paused;
                    }
                }
            }
        }
        for id in frozen.iter().filter(|id| !dumped.iter().any(|(d, _)| d == *id)) {
            if let Ok(c) = container_mut(&mut inner, id) {
                if let Err(re) = c.runc.resume(id).await {
                    warn!(container = id.as_str(); "rollback thaw after a failed suspend: {re}");
                }
                c.init.status = Status::Running;
            }
        }
        Err(e)
    }

    /// `runc restore` of one suspended container from `image`: with lazy
    /// pages (memory served on demand over userfaultfd by a `criu
    /// lazy-pages` daemon, the rest prefetched in the background), falling
    /// back to a full restore when that cannot be used. CRIU's work
    /// directories are the shim's, outside the (read-only) snapshot.
    async fn restore_one(&self, store: &Store, generation: u64, id: &str, image: &Path) -> Result<i32> {
        let image = image.to_path_buf();
        if lazy_pages_enabled() {
            let work = store.work_dir(generation, id, "lazy");
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
        let work = store.work_dir(generation, id, "restore");
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

    /// RUNNING again: restore a suspended actor from its snapshot (checked
    /// out of the node's store: verified, fetched from the object tier if
    /// it was evicted), or thaw a frozen one.
    pub async fn resume_actor(&self) -> Result<Record> {
        let started = Instant::now();
        loop {
            if let Some(r) = self.resume_once(started).await? {
                return Ok(r);
            }
            // The commit finished between the suspend's record and the
            // view of its staging: its outcome is recorded once we let go.
            self.wait_commit().await?;
        }
    }

    /// One attempt of [`Runtime::resume_actor`]; `None` when the suspend's
    /// staging was committed meanwhile (try again with the snapshot).
    async fn resume_once(&self, started: Instant) -> Result<Option<Record>> {
        let mut slot = self.actor.lock().await;
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        if matches!(rec.state, Lifecycle::Frozen | Lifecycle::Suspended) {
            // Only while this node still holds the actor's lease.
            if let Err(e) = confirm_lease(&rec.actor, &store.key()).await {
                let e = with_context(e, &format!("resume of actor {}", rec.actor));
                warn!(actor = rec.actor.as_str(); "resume refused, the actor stays {}: {e}", rec.state);
                rec.last_error = Some(e.to_string());
                store.save(rec)?;
                return Err(e);
            }
        }
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
                if rec.fenced.take().is_some() {
                    rec.last_error = None;
                }
                store.save(rec)?;
                return Ok(Some(rec.clone()));
            }
            Lifecycle::Suspended => {}
            s => return Err(Error::FailedPrecondition(format!("actor {} is {s}, not SUSPENDED or FROZEN", rec.actor))),
        }
        let snap = match (&rec.snapshot, &rec.staging) {
            (Some(snap), _) => snap.clone(),
            // Resumed before the background commit is done: restored from
            // the dump this shim just wrote (a view of its staging), which
            // the commit goes on turning into the snapshot.
            (None, Some(_)) => SnapshotRef { actor: rec.actor.clone(), generation: rec.generation },
            (None, None) => {
                return Err(Error::FailedPrecondition(format!(
                    "actor {} is SUSPENDED but has neither a snapshot nor a staging{}",
                    rec.actor,
                    rec.last_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
                )))
            }
        };
        let from = match (&rec.snapshot, &rec.staging) {
            (None, Some(st)) => format!("the dump of its suspend (staging {}, commit under way)", st.id),
            _ => format!("snapshot {snap}"),
        };
        rec.state = Lifecycle::Resuming;
        store.save(rec)?;
        failpoint::hit(&store.key(), failpoint::RESUME_AFTER_PERSIST);
        // The snapshot's verified files; nothing is started from bad data.
        let co = match &rec.staging {
            Some(st) if rec.snapshot.is_none() => match view_staging(&st.to_staging(), &snap).await {
                Ok(co) => Ok(co),
                Err(Error::NotFound(_)) => {
                    rec.state = Lifecycle::Suspended;
                    store.save(rec)?;
                    return Ok(None);
                }
                Err(e) => Err(e),
            },
            _ => checkout(&snap).await,
        };
        let co = match co {
            Ok(co) => co,
            Err(e) => {
                let e = with_context(e, &format!("resume of actor {} from {from}", rec.actor));
                warn!(actor = rec.actor.as_str(), from = from.as_str(); "resume refused, the actor stays SUSPENDED: {e}");
                rec.state = Lifecycle::Suspended;
                rec.last_error = Some(e.to_string());
                store.save(rec)?;
                return Err(e);
            }
        };
        rec.leases.push(co.lease.clone());
        if let Err(e) = store.save(rec) {
            release_checkout(&co).await;
            rec.leases.retain(|l| *l != co.lease);
            rec.state = Lifecycle::Suspended;
            return Err(e);
        }
        let armed = self.activation.lock().await.take();
        let handover = match armed {
            Some(a) => Some(a.begin_handover().await),
            None => None,
        };
        let result = self.restore_all(store, rec, &co.path).await;
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
        if let Err(e) = result {
            self.wait_lazy_daemons().await;
            release_checkout(&co).await;
            rec.leases.retain(|l| *l != co.lease);
            let _ = store.save(rec);
            return Err(e);
        }
        // The checkout is released once the lazy-pages daemons are done
        // with it; the store's gc and retention remove the snapshot.
        let pending: Vec<_> = std::mem::take(&mut *self.lazy.lock().await);
        let me = self.clone();
        self.lazy.lock().await.push(tokio::spawn(async move {
            for h in pending {
                let _ = h.await;
            }
            release_checkout(&co).await;
            me.forget_lease(&co.lease).await;
        }));
        info!(actor = rec.actor.as_str(), from = from.as_str(), ms = rec.last_resume_ms; "actor resumed");
        Ok(Some(rec.clone()))
    }

    /// A checkout lease was released: drop it from the record.
    pub(crate) async fn forget_lease(&self, lease: &str) {
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return };
        if rec.leases.iter().any(|l| l == lease) {
            rec.leases.retain(|l| l != lease);
            let _ = store.save(rec);
        }
    }

    async fn restore_all(&self, store: &Store, rec: &mut Record, images: &Path) -> Result<()> {
        for id in rec.containers.clone() {
            let suspended = {
                let inner = self.inner.lock().await;
                inner.containers.get(&id).is_some_and(|c| c.suspended)
            };
            if !suspended {
                continue;
            }
            failpoint::hit(&store.key(), failpoint::RESUME_DURING_RESTORE);
            let image = images.join(name_of(rec, &id));
            if let Err(e) = self.restore_one(store, rec.generation, &id, &image).await {
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

    /// The stop of app container `id` (SIGTERM) of an actor with
    /// `torpor.dev/on-stop: suspend`: the actor is suspended first (all its
    /// app containers), so that its containers then stop as suspended ones
    /// and its newest state is the snapshot the next pod restores — on this
    /// node or, once the lease is surrendered at the pod's removal (after
    /// the upload), on any other. A suspend that fails is logged and the
    /// stop goes on as a plain stop.
    pub(crate) async fn suspend_on_stop(&self, id: &str) {
        let wanted = {
            let inner = self.inner.lock().await;
            inner.containers.get(id).is_some_and(|c| !c.sandbox && !c.suspended && c.actor.suspend_on_stop)
        };
        if !wanted {
            return;
        }
        // Not when the lease fence froze it: its state is no longer its own.
        let state = self.actor.lock().await.as_ref().filter(|(_, rec)| rec.fenced.is_none()).map(|(_, rec)| rec.state);
        if !matches!(state, Some(Lifecycle::Running | Lifecycle::Frozen)) {
            return;
        }
        match self.suspend().await {
            Ok(rec) => info!(actor = rec.actor.as_str(), container = id, generation = rec.generation; "suspended on stop (torpor.dev/on-stop: suspend)"),
            Err(e) => warn!(container = id; "suspend on stop failed, the container stops without it: {e}"),
        }
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
        // A suspend's commit under way lands in the store first.
        if let Err(e) = self.wait_commit().await {
            warn!("the actor is removed while its suspend's commit fails: {e}");
        }
        self.wait_lazy_daemons().await;
        let mut slot = self.actor.lock().await;
        if let Some((store, rec)) = slot.take() {
            for lease in &rec.leases {
                release_lease(lease).await;
            }
            // Retention: a SUSPENDED actor's snapshots stay (restorable by
            // identity; the store's gc keeps the newest). A running actor
            // has moved past them: with the default id (its pod) they are
            // stale; an explicit actor id keeps them (resume anywhere).
            if matches!(rec.state, Lifecycle::Running | Lifecycle::Frozen) && rec.ran && !rec.explicit_actor {
                remove_snapshots(&rec.actor).await;
            }
            // Another node may take the actor now (once its newest
            // snapshot is durable: the store uploads it first).
            surrender_lease(&rec.actor, &store.key()).await;
            if let Err(e) = store.remove() {
                warn!("remove actor state: {e}");
            }
            if let Some(key) = store.dir().file_name() {
                let _ = std::fs::remove_dir_all(crate::policy::request_dir(&key.to_string_lossy()));
            }
        }
        self.claim.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.commit.lock().unwrap_or_else(|p| p.into_inner()).take();
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


/// The state of a background commit (see [`Runtime::wait_commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommitState {
    Running,
    Failed(String),
    Done,
}

/// How `last_error` starts while a suspend's commit fails.
const COMMIT_FAILED: &str = "commit of the suspend's snapshot failed";

/// The container's name in the actor (its image directory in a snapshot).
pub(crate) fn name_of<'a>(rec: &'a Record, id: &'a str) -> &'a str {
    rec.names.get(id).map(String::as_str).unwrap_or(id)
}

/// The labels a suspend's snapshot is committed with.
pub(crate) fn commit_labels(shim: &str, rec: &Record) -> HashMap<String, String> {
    let mut names: Vec<&str> = rec.containers.iter().map(|id| name_of(rec, id)).collect();
    names.sort_unstable();
    let mut l = HashMap::new();
    l.insert(snapshots::LABEL_SHIM.to_string(), shim.to_string());
    l.insert(snapshots::LABEL_CONTAINERS.to_string(), names.join(","));
    l.insert(snapshots::LABEL_RUNTIME.to_string(), format!("torpor-runtime {}", env!("CARGO_PKG_VERSION")));
    if let Some(s) = &rec.staging {
        l.insert(snapshots::LABEL_STAGING.to_string(), s.id.clone());
    }
    l
}

/// An error with what was being done in front of its message.
pub(crate) fn with_context(e: Error, what: &str) -> Error {
    match e {
        Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
        Error::Store(m) => Error::Store(format!("{what}: {m}")),
        Error::NotFound(m) => Error::NotFound(format!("{what}: {m}")),
        Error::FailedPrecondition(m) => Error::FailedPrecondition(format!("{what}: {m}")),
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        e => Error::Store(format!("{what}: {e}")),
    }
}

/// Writes container `id`'s rootfs changes (its overlay upper directory
/// `upper`) into its image directory: a restore in a new container applies
/// them ([`crate::rootfs`]).
async fn capture_rootfs(id: &str, upper: &Path, image: &Path) -> Result<()> {
    let started = Instant::now();
    let (upper, out) = (upper.to_path_buf(), image.join(crate::rootfs::DIFF_FILE));
    let stats = tokio::task::spawn_blocking(move || crate::rootfs::capture(&upper, &out))
        .await
        .map_err(|e| Error::Io { context: format!("capture the rootfs changes of {id}"), source: std::io::Error::other(e) })??;
    info!(container = id, entries = stats.entries, bytes = stats.bytes, deletions = stats.deletions,
        ms = started.elapsed().as_millis() as u64; "rootfs changes captured");
    Ok(())
}

/// A staging directory for a new snapshot of `actor`.
async fn begin_staging(actor: &str) -> Result<crate::snapshots::Staging> {
    let r = async { SnapshotStore::connect().await?.begin(actor).await }.await;
    r.map_err(|e| with_context(e, &format!("suspend of actor {actor}: no staging directory in the snapshot store")))
}

/// This node still holds `actor`'s lease (for shim `owner`): until when.
/// A torpor-snapshotter older than lease confirmation (a node halfway
/// through an upgrade) cannot tell: `None`, logged once per shim; the
/// actor is then guarded by its lease's acquisition only.
pub(crate) async fn confirm_lease(actor: &str, owner: &str) -> Result<Option<u64>> {
    match SnapshotStore::connect().await?.confirm(actor, owner).await {
        Ok(until) => Ok(Some(until)),
        Err(Error::Unimplemented(m)) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| warn!(actor; "the node's torpor-snapshotter cannot confirm actor leases (upgrade it): no lease fence for this shim's actor ({m})"));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The actor leaves this node (pod removed, shim dead): its lease goes once
/// its newest snapshot is durable. Logged, never fails.
pub(crate) async fn surrender_lease(actor: &str, owner: &str) {
    let r = async { SnapshotStore::connect().await?.surrender(actor, owner).await }.await;
    if let Err(e) = r {
        warn!(actor; "surrender of the actor lease: {e} (it expires unless renewed)");
    }
}

/// Drops a staging directory (a failed suspend); logged, never fails.
pub(crate) async fn abort_staging(staging: &crate::snapshots::Staging) {
    let r = async { SnapshotStore::connect().await?.abort(staging).await }.await;
    match r {
        Ok(()) | Err(Error::NotFound(_)) => {}
        Err(e) => warn!(staging = staging.id.as_str(); "abort of the staging directory {:?}: {e}", staging.path),
    }
}

/// Commits a suspend's staging directory. A staging the store no longer
/// has was either committed by an attempt whose answer was lost (found by
/// its label) or is gone: `NotFound`, the checkpoint is lost.
pub(crate) async fn commit_staging(
    actor: &str,
    staging: &crate::snapshots::Staging,
    labels: HashMap<String, String>,
    keep_local: Option<Duration>,
) -> Result<SnapshotRef> {
    let snaps = SnapshotStore::connect().await?;
    match snaps.commit(staging, labels, keep_local).await {
        Ok(s) => Ok(s),
        Err(Error::NotFound(msg)) => {
            let found = snaps.list(actor).await?.into_iter().find(|(_, l)| l.get(snapshots::LABEL_STAGING) == Some(&staging.id));
            match found {
                Some((s, _)) => Ok(s),
                None => Err(Error::NotFound(format!(
                    "the staging directory {} ({}) of actor {actor}'s suspend is gone from the snapshot store ({msg}): the checkpoint is lost",
                    staging.id,
                    staging.path.display()
                ))),
            }
        }
        Err(e) => Err(e),
    }
}

/// A verified local copy of `snap`, pinned until [`release_checkout`].
pub(crate) async fn checkout(snap: &SnapshotRef) -> Result<crate::snapshots::Checkout> {
    SnapshotStore::connect().await?.checkout(snap).await
}

/// Releases a checkout; logged, never fails.
/// A view of a suspend's staging (not committed yet), as a checkout of the
/// snapshot it becomes.
pub(crate) async fn view_staging(staging: &crate::snapshots::Staging, snap: &SnapshotRef) -> Result<crate::snapshots::Checkout> {
    // `snap` names the actor's generation in this shim's record; the store
    // numbers the snapshot when the commit completes.
    let (path, lease) = SnapshotStore::connect().await?.view_staging(staging).await?;
    Ok(crate::snapshots::Checkout { snapshot: snap.clone(), path, lease })
}

pub(crate) async fn release_checkout(co: &crate::snapshots::Checkout) {
    release_lease(&co.lease).await
}

pub(crate) async fn release_lease(lease: &str) {
    let co = crate::snapshots::Checkout {
        snapshot: SnapshotRef { actor: String::new(), generation: 0 },
        path: PathBuf::new(),
        lease: lease.to_string(),
    };
    let r = async { SnapshotStore::connect().await?.release(&co).await }.await;
    match r {
        Ok(()) | Err(Error::NotFound(_)) => {}
        Err(e) => warn!(lease; "release of a snapshot checkout: {e}"),
    }
}

/// Removes every snapshot of `actor` from the store (a default-id actor
/// removed while RUNNING: they are stale). Logged, never fails.
pub(crate) async fn remove_snapshots(actor: &str) {
    let r = async {
        let snaps = SnapshotStore::connect().await?;
        let mut gone = Vec::new();
        for (s, _) in snaps.list(actor).await? {
            snaps.remove(&s).await?;
            gone.push(s.to_string());
        }
        Ok::<_, Error>(gone)
    }
    .await;
    match r {
        Ok(gone) if gone.is_empty() => {}
        Ok(gone) => info!(actor, removed:? = gone; "stale snapshots of the actor removed"),
        Err(e) => warn!(actor; "removal of the actor's stale snapshots: {e}"),
    }
}
