//! SUSPENDED: every app container checkpointed with CRIU into a staging
//! directory of the node's snapshot store (the processes end, their memory
//! is freed), while containerd keeps seeing them RUNNING: no exit is
//! published and their stdio FIFOs stay open. The snapshot is committed in
//! the background; the suspend returns once the memory is freed.
//!
//! SUSPENDING is persisted before anything is touched; SUSPENDED once every
//! dump is complete. A suspend that fails part-way restores or thaws what
//! it already touched: the actor is RUNNING (or FROZEN) again, and the
//! reason is kept in its record.
//!
//! The dump steps a suspend and the freeze tier's end share: the
//! checkpoint of every app container, its rollback, and the background
//! commit of its snapshot. Called by [`super::suspend`], the trigger layer
//! (the freeze tier's end) and the actor's removal; calls down into
//! [`super::restore`] (the rollback), [`super::freezer`] and
//! [`super::held`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::actor::record::{self, FreezeTier, Lifecycle, Record, StagingRecord};
use crate::actor::report::{self, Op, Trigger};
use crate::actor::seal;
use crate::actor::store_client::{SnapshotRef, Staging};
use crate::error::{Error, IoContext, Result, StoreErrorKind};
use crate::failpoint;
use crate::lifecycle::state::CommitState;
use crate::lifecycle::timing::Timing;
use crate::lifecycle::{commit_labels, lock, name_of, Actor};
use crate::system::netns::{self, TcpConnection};
use crate::system::runc::CheckpointOpts;
use crate::system::tmpfs;
use crate::system::writeback::{self, EarlyWriteback};
use crate::task::Status;

/// How `last_error` starts while a suspend's commit fails.
const COMMIT_FAILED: &str = "commit of the suspend's snapshot failed";

impl Actor {
    /// SUSPENDED: checkpoint every app container and free its memory. With
    /// `only_in`, only while the actor is still in that freeze-tier window
    /// (its end, memory pressure); `WrongState` if it left it meanwhile.
    /// `trigger`: what asked for it.
    pub(crate) async fn checkpoint(&self, only_in: Option<FreezeTier>, trigger: Trigger) -> Result<Record> {
        report::triggered(&self.store, Op::Suspend, trigger, || self.record(), self.checkpoint_unreported(only_in)).await
    }

    async fn checkpoint_unreported(&self, only_in: Option<FreezeTier>) -> Result<Record> {
        let started = Instant::now();
        let _gate = self.gate_after_lazy_daemons().await;
        let mut t = Timing::start();
        let dir = self.dir().ok_or_else(super::no_actor)?;
        let rec = self.record().ok_or_else(super::no_actor)?;
        checkpointable(&rec, only_in)?;
        // The freeze tier's watch of the actor's own listeners ends before
        // the dump (a connection that came meanwhile thaws it instead).
        let tier = rec.in_freeze_tier();
        if tier {
            self.leave_freeze_tier(&rec).await?;
        }
        let ids = self.tasks.app_containers();
        if ids.is_empty() {
            return Err(Error::FailedPrecondition(format!("actor {} has no running container", rec.actor)));
        }
        let was = rec.state;
        let (netns, ports) = self.activation_target(&ids);
        let (staging, rec) = self.begin_suspending(&rec, &ids, tier, &mut t).await?;
        failpoint::hit(&dir.key(), failpoint::SUSPEND_AFTER_PERSIST);
        t.mark("record_suspending");
        report::phase("prepare");
        let connections = self.dump_into(&dir, &rec, &staging, netns.as_deref(), was, tier, &mut t).await?;
        report::phase("dump");
        seal_and_sync(&staging.path).await;
        report::phase("fsync");
        t.mark("seal_fsync");
        let rec = self.record_suspended(&dir, started, &t)?;
        failpoint::hit(&dir.key(), failpoint::SUSPEND_AFTER_DUMP);
        dir.remove_work();
        // The ports are held before CRIU's network lock goes: a connection
        // that arrives in between is never refused (the lock drops it, the
        // client retransmits to the held listener).
        if let (Some(netns), false) = (&netns, ports.is_empty()) {
            self.hold_ports(netns.clone(), ports);
        }
        t.mark("record_suspended");
        // Without a pod network namespace, the container's own went with
        // its processes.
        if let Some(ns) = &netns {
            // Its checkpointed connections are kept before the lock goes.
            self.keep_connections(ns, &connections).await;
            if let Err(e) = netns::unlock_criu_network(ns).await {
                warn!(actor = rec.actor.as_str(), "{e}");
            }
        }
        t.mark("hold_ports_unlock_network");
        // Kept in memory (status shows it), saved with the next change.
        let _ = self.update_if(|r| {
            r.last_suspend_phases = t.phases();
            None::<()>
        });
        if tier {
            self.freeze_changed.notify_one();
        }
        self.start_commit(&dir, &rec);
        info!(actor = rec.actor.as_str(), ms = rec.last_suspend_ms, "actor suspended");
        Ok(rec)
    }

    /// The actor's gate, once the lazy-pages daemons of the last resume are
    /// done (a process with pages still missing cannot be dumped) and its
    /// CRIU is gone from the container's cgroups. Waited for outside the
    /// gate: no resume can start new ones once we hold it.
    async fn gate_after_lazy_daemons(&self) -> tokio::sync::MutexGuard<'_, ()> {
        loop {
            self.wait_lazy_daemons().await;
            let gate = self.gate.lock().await;
            if lock(&self.lazy).is_empty() && !crate::system::criu_restore::ending() {
                return gate;
            }
        }
    }

    /// Where the checkpoint goes (a staging of the store), and SUSPENDING
    /// recorded with it: the record saved, and the staging. Without the
    /// store there is nowhere to put it, and the actor keeps running (an
    /// actor in the freeze `tier` thawed).
    async fn begin_suspending(&self, rec: &Record, ids: &[String], tier: bool, t: &mut Timing) -> Result<(Staging, Record)> {
        let staging = match self.store.begin_staging(&rec.actor).await {
            Ok(s) => s,
            Err(e) => {
                warn!(actor = rec.actor.as_str(), "suspend refused, actor keeps running: {e}");
                if tier {
                    self.thaw_after_failed_checkpoint(rec, &e).await;
                } else {
                    self.update(|r| r.last_error = Some(e.to_string()))?;
                }
                return Err(e);
            }
        };
        t.mark("begin_staging");
        let persisted = self.update(|r| {
            r.generation = r
                .generation
                .checked_add(1)
                .ok_or_else(|| Error::FailedPrecondition(format!("actor {}: generation {} cannot grow", r.actor, r.generation)))?;
            r.state = Lifecycle::Suspending;
            r.containers = ids.to_vec();
            r.staging = Some(StagingRecord { id: staging.id.clone(), path: staging.path.clone() });
            Ok::<_, Error>(r.clone())
        });
        match persisted {
            Ok(Ok(suspending)) => Ok((staging, suspending)),
            Ok(Err(e)) | Err(e) => {
                self.store.abort_logged(&staging).await;
                if tier {
                    self.thaw_after_failed_checkpoint(rec, &e).await;
                }
                Err(e)
            }
        }
    }

    /// Every app container of the SUSPENDING `rec` dumped into `staging`
    /// (see [`Actor::checkpoint_all`]), the disk writing the dump while CRIU
    /// makes it; the connections kept. On a failure the staging goes and
    /// the actor is `was` again (an actor of the freeze `tier` thawed and
    /// RUNNING), with the reason.
    #[allow(clippy::too_many_arguments)]
    async fn dump_into(
        &self,
        dir: &record::Store,
        rec: &Record,
        staging: &Staging,
        netns: Option<&Path>,
        was: Lifecycle,
        tier: bool,
        t: &mut Timing,
    ) -> Result<Vec<TcpConnection>> {
        let images: Vec<(String, PathBuf)> = rec.containers.iter().map(|id| (id.clone(), staging.path.join(name_of(rec, id)))).collect();
        // The fsync after the dump then waits for its last part only.
        let writeback = EarlyWriteback::start(&staging.path, writeback::EVERY);
        // A freeze-tier actor whose checkpoint fails runs again (thawed),
        // any other frozen one goes back to frozen.
        let checkpointed = self.checkpoint_all(dir, rec, netns, &images, was == Lifecycle::Frozen && !tier, t).await;
        writeback.stop().await;
        let e = match checkpointed {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        warn!(actor = rec.actor.as_str(), "suspend failed, actor keeps running: {e}");
        self.store.abort_logged(staging).await;
        dir.remove_work();
        self.update(|r| {
            r.state = was;
            r.last_error = Some(e.to_string());
            r.generation -= 1;
            r.staging = None;
        })?;
        if tier {
            self.thaw_after_failed_checkpoint(rec, &e).await;
        }
        Err(e)
    }

    /// SUSPENDED: every dump is complete. Recorded before anything else, so
    /// that a shim death from here on commits the staging. A record that
    /// cannot be saved (a full disk) does not stop the rest: the network is
    /// unlocked, the ports held and the commit started, and the commit
    /// saves the record again.
    fn record_suspended(&self, dir: &record::Store, started: Instant, t: &Timing) -> Result<Record> {
        let suspended = |r: &mut Record| {
            r.state = Lifecycle::Suspended;
            r.freeze_tier = None;
            r.snapshot = None;
            r.last_error = None;
            r.restore_snapshot = None;
            r.restored_names.clear();
            r.committed_at_ms = Some(record::now_ms());
            r.last_suspend_ms = Some(started.elapsed().as_millis() as u64);
            r.last_suspend_phases = t.phases();
            r.clone()
        };
        let saved = if failpoint::fails(&dir.key(), failpoint::RECORD_SAVE_FAILS, "SUSPENDED") {
            // The test's full disk: the record changes in memory, the save fails.
            self.update_if(|r| {
                suspended(r);
                None::<()>
            })?;
            Err(Error::Io { context: "save the actor record (failpoint)".into(), source: std::io::Error::from_raw_os_error(libc::ENOSPC) })
        } else {
            self.update(suspended)
        };
        match saved {
            Ok(rec) => Ok(rec),
            Err(e) => {
                warn!("the suspend's record could not be saved (the commit saves it again): {e}");
                self.update_if(|r| {
                    r.last_error = Some(format!("the suspend's record could not be saved: {e}"));
                    None::<()>
                })?;
                self.record().ok_or_else(super::no_actor)
            }
        }
    }

    /// Commits the suspend's staging directory in the background, retrying
    /// until it is committed (the processes are gone: the staging is the
    /// actor). A failure is kept in `last_error` (`torporctl status`).
    fn start_commit(&self, dir: &record::Store, rec: &Record) {
        let Some(staging) = rec.staging.as_ref().map(StagingRecord::to_staging) else { return };
        let (tx, rx) = tokio::sync::watch::channel(CommitState::Running);
        *lock(&self.commit) = Some(rx);
        let labels = commit_labels(&dir.key(), rec);
        let keep_local = rec.keep_local_s.map(Duration::from_secs);
        let actor = rec.actor.clone();
        let me = self.clone();
        let key = dir.key();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            let held_until = Instant::now() + Duration::from_secs(600);
            while failpoint::armed(&key, failpoint::COMMIT_HELD) && Instant::now() < held_until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            loop {
                let _ = tx.send(CommitState::Running);
                let t = Instant::now();
                match me.store.commit_staging(&actor, &staging, labels.clone(), keep_local).await {
                    Ok(snap) => {
                        info!(actor = actor.as_str(), snapshot = %snap, ms = t.elapsed().as_millis() as u64, "suspend committed to the snapshot store");
                        report::background_phase(&me.store, &actor, Op::Suspend, "commit", t.elapsed());
                        me.commit_settled(&staging, Ok(snap));
                        let _ = tx.send(CommitState::Done);
                        return;
                    }
                    Err(e) => {
                        let lost = e.is_store(StoreErrorKind::NotFound);
                        warn!(
                            actor = actor.as_str(),
                            staging = staging.id.as_str(),
                            "commit of the suspend failed{}: {e}",
                            if lost { "" } else { " (retrying)" }
                        );
                        me.commit_settled(&staging, Err(&e));
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
    fn commit_settled(&self, staging: &Staging, r: std::result::Result<SnapshotRef, &Error>) {
        let saved = self.update_if(|rec| {
            if rec.staging.as_ref().map(|s| s.id.as_str()) != Some(staging.id.as_str()) {
                return None;
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
            Some(())
        });
        if let Err(e) = saved {
            warn!(staging = staging.id.as_str(), "save the actor record after a commit: {e}");
        }
        // What the suspend and its commit allocated is garbage now, and the
        // shim may sleep with its actor for long: give it back.
        crate::system::heap::release_free();
    }

    /// Waits for the attempt of a background commit under way; an error if
    /// it failed (it is retried; the actor stays SUSPENDED meanwhile).
    pub(crate) async fn wait_commit(&self) -> Result<()> {
        let rx = lock(&self.commit).clone();
        let Some(mut rx) = rx else { return Ok(()) };
        let state = match rx.wait_for(|s| *s != CommitState::Running).await {
            Ok(s) => s.clone(),
            Err(_) => return Ok(()), // the task ended
        };
        match state {
            CommitState::Failed(e) => Err(Error::store(StoreErrorKind::Other, format!("the suspend's snapshot is not committed: {e}"))),
            _ => Ok(()),
        }
    }

    /// Freeze all, dump each into its image directory (with the unix
    /// connections between them, found in the pod's `netns`); on a failure,
    /// bring back what was touched, to the state it had (`was_frozen`: paused).
    /// The TCP connections of the pod's netns the dumps kept.
    async fn checkpoint_all(
        &self,
        dir: &record::Store,
        rec: &Record,
        netns: Option<&Path>,
        images: &[(String, PathBuf)],
        was_frozen: bool,
        t: &mut Timing,
    ) -> Result<Vec<TcpConnection>> {
        let generation = rec.generation;
        for (id, _) in images {
            if self.tasks.has_live_execs(id)? {
                return Err(Error::FailedPrecondition(format!("container {id} has exec sessions running")));
            }
        }
        let mut frozen = Vec::new();
        let mut dumped: Vec<(String, PathBuf)> = Vec::new();
        let mut failure = None;
        for (id, _) in images {
            if self.tasks.status(id) == Some(Status::Running) {
                if let Err(e) = self.tasks.pause(id).await {
                    failure = Some(e);
                    break;
                }
                // Only what this suspend paused is thawed by a rollback.
                frozen.push(id.clone());
            }
        }
        t.mark("freeze");
        // The connections between the containers, while they are frozen.
        let mut externals = std::collections::HashMap::new();
        if failure.is_none() {
            match self.take_links(rec, netns, images).await {
                Ok(x) => externals = x,
                Err(e) => failure = Some(e),
            }
        }
        // The pod's network is locked once, by the shim, for every dump
        // ([`netns::lock_network`]); CRIU locks it itself where it cannot
        // be told to skip (a container with the user's own CRIU
        // configuration).
        let locked = match netns {
            Some(ns) if failure.is_none() && images.iter().all(|(id, _)| self.tasks.takes_criu_options(id)) => {
                match netns::lock_network(ns).await {
                    Ok(()) => Some(ns),
                    Err(e) => {
                        failure = Some(e);
                        // A part of it may be in place.
                        self.unlock_after_rollback(rec, ns).await;
                        None
                    }
                }
            }
            _ => None,
        };
        t.mark("lock_network");
        // The connections the dumps keep, read while nothing changes them.
        let connections = match netns {
            Some(_) if failure.is_none() => images
                .iter()
                .find_map(|(id, _)| self.tasks.app_info(id).ok().map(|i| i.pid).filter(|p| *p > 0))
                .map(netns::open_connections)
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if failure.is_none() {
            failpoint::hit(&dir.key(), failpoint::SUSPEND_AFTER_FREEZE);
            report::phase("freeze");
            for (id, image) in images {
                let external = externals.remove(id).unwrap_or_default();
                let dumped_one = self.dump_one(dir, generation, id, image, external, locked.is_some()).await;
                t.mark("dump");
                if let Err(e) = dumped_one {
                    failure = Some(e);
                    break;
                }
                dumped.push((id.clone(), image.clone()));
                // Its files, while no process changes them.
                if let Some(upper) = self.tasks.app_info(id).ok().and_then(|i| i.rootfs_upper) {
                    let captured = match crate::system::rootfs::CaptureLimits::from_env() {
                        Ok(limits) => capture_rootfs(id, &upper, image, limits).await,
                        Err(e) => Err(e),
                    };
                    t.mark("rootfs_capture");
                    if let Err(e) = captured {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let Some(e) = failure else { return Ok(connections) };
        // Roll back: restore what was dumped, thaw what was only frozen.
        for (id, image) in &dumped {
            match self.restore_one(dir, generation, id, image, None, &mut Timing::start()).await {
                Ok(_) => self.links_restored(super::name_of(rec, id)),
                Err(re) => warn!(container = id.as_str(), "rollback restore after a failed suspend: {re}"),
            }
        }
        if was_frozen {
            // A frozen actor goes back to frozen: re-pause what was restored.
            for (id, _) in &dumped {
                if self.tasks.status(id) == Some(Status::Running) {
                    let _ = self.tasks.pause(id).await;
                }
            }
        }
        for id in frozen.iter().filter(|id| !dumped.iter().any(|(d, _)| d == *id)) {
            if let Err(re) = self.tasks.resume(id).await {
                warn!(container = id.as_str(), "rollback thaw after a failed suspend: {re}");
            }
        }
        // Every process has its connection ends again (the staging goes):
        // an end the shim kept would hide a process's exit from its peer.
        self.forget_links();
        if let Some(ns) = locked {
            self.unlock_after_rollback(rec, ns).await;
        }
        Err(e)
    }

    /// Lifts the suspend's network lock after it failed: the actor runs on.
    async fn unlock_after_rollback(&self, rec: &Record, netns: &Path) {
        if let Err(e) = netns::unlock_criu_network(netns).await {
            warn!(actor = rec.actor.as_str(), "after a failed suspend: {e}");
        }
    }

    /// The dump of one app container into `image`; CRIU's work dir (logs)
    /// stays outside the snapshot.
    /// `external`: its ends of the pod's unix connections ([`super::links`]).
    /// `network_locked`: the shim holds the pod's network lock.
    /// The container's own tmpfs mounts are archived by torpor, not CRIU
    /// ([`crate::system::tmpfs`]).
    async fn dump_one(
        &self,
        dir: &record::Store,
        generation: u64,
        id: &str,
        image: &Path,
        mut external: Vec<String>,
        network_locked: bool,
    ) -> Result<()> {
        let work = dir.work_dir(generation, id, "dump");
        std::fs::create_dir_all(image).and_then(|_| std::fs::create_dir_all(&work)).io_context(|| format!("create {image:?}"))?;
        let info = self.tasks.app_info(id)?;
        let (pid, img, fresh) = (info.pid, image.to_path_buf(), self.tasks.fresh_tmpfs_mounts(id)?);
        let mounts = tokio::task::spawn_blocking(move || tmpfs::capture(pid, &img, &fresh))
            .await
            .map_err(|e| Error::Io { context: format!("archive the tmpfs mounts of {id}"), source: std::io::Error::other(e) })??;
        external.extend(mounts);
        let opts = CheckpointOpts {
            exit: true,
            open_tcp: true,
            external_unix_sockets: true,
            file_locks: true,
            terminal: info.terminal,
            image_path: image.to_path_buf(),
            work_path: work,
            external,
            network_locked,
            ..Default::default()
        };
        failpoint::hit(&dir.key(), failpoint::SUSPEND_DURING_DUMP);
        self.tasks.dump(id, &opts).await
    }
}

/// Whether `rec` can be checkpointed: RUNNING or FROZEN; with `only_in`,
/// only while still in that freeze-tier window.
fn checkpointable(rec: &Record, only_in: Option<FreezeTier>) -> Result<()> {
    if !matches!(rec.state, Lifecycle::Running | Lifecycle::Frozen) {
        return Err(Error::WrongState(format!("actor {} is {}: only a RUNNING or FROZEN actor can be suspended", rec.actor, rec.state)));
    }
    if only_in.is_some() && (!rec.in_freeze_tier() || rec.freeze_tier != only_in) {
        return Err(Error::WrongState(format!("actor {} left the freeze window (it is {})", rec.actor, rec.state)));
    }
    Ok(())
}

/// The dump at `path` sealed (what a restore checks first), and on disk
/// before the record says it is complete: a power loss never commits a
/// torn dump. A failure is logged: the processes are gone, the staging is
/// the actor; the commit (which fsyncs what it stores) is its durability
/// then.
async fn seal_and_sync(path: &Path) {
    let path = path.to_path_buf();
    let synced = tokio::task::spawn_blocking(move || {
        if let Err(e) = seal::write(&path) {
            // Still the actor: restored unsealed (checked by the store's manifest).
            warn!("the dump's seal could not be written: {e}");
        }
        sync_tree(&path)
    })
    .await
    .map_err(|e| Error::Io { context: "fsync the dump".into(), source: std::io::Error::other(e) })
    .and_then(|r| r);
    if let Err(e) = synced {
        warn!("fsync of the dump: {e}");
    }
}

/// fsync of every file and directory under `dir` (a staging directory).
fn sync_tree(dir: &Path) -> Result<()> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).io_context(|| format!("read {d:?}"))? {
            let e = e.io_context(|| format!("read {d:?}"))?;
            let t = e.file_type().io_context(|| format!("stat {:?}", e.path()))?;
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let p = e.path();
                std::fs::File::open(&p).and_then(|f| f.sync_all()).io_context(|| format!("fsync {p:?}"))?;
            }
        }
        record::sync_dir(&d)?;
    }
    Ok(())
}

/// Writes container `id`'s rootfs changes (its overlay upper directory
/// `upper`) into its image directory, within `limits`: a restore in a new
/// container applies them ([`crate::system::rootfs`]). Past a limit the
/// capture is refused (a failed precondition naming the file), and the
/// suspend rolls back like any failed one.
async fn capture_rootfs(id: &str, upper: &Path, image: &Path, limits: crate::system::rootfs::CaptureLimits) -> Result<()> {
    let started = Instant::now();
    let (upper, out) = (upper.to_path_buf(), image.join(crate::system::rootfs::DIFF_FILE));
    let stats = tokio::task::spawn_blocking(move || crate::system::rootfs::capture(&upper, &out, &limits))
        .await
        .map_err(|e| Error::Io { context: format!("capture the rootfs changes of {id}"), source: std::io::Error::other(e) })?
        .map_err(|e| Error::from(e).context(&format!("capture the rootfs changes of container {id}")))?;
    info!(
        container = id,
        entries = stats.entries,
        bytes = stats.bytes,
        deletions = stats.deletions,
        ms = started.elapsed().as_millis() as u64,
        "rootfs changes captured"
    );
    Ok(())
}
