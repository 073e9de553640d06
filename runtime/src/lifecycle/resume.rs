//! RUNNING again: a suspended actor restored from its snapshot (checked out
//! of the node's store: verified, fetched from the object tier if it was
//! evicted; or a view of the staging its suspend is still committing), or a
//! frozen one thawed. RESUMING is persisted before the restore; the held
//! connections are handed over once the processes run.

use std::path::Path;
use std::time::Instant;

use tracing::{info, warn};

use crate::actor::record::{self, Lifecycle, Record};
use crate::actor::report::{self, Op, Trigger};
use crate::actor::store_client::{Checkout, SnapshotRef};
use crate::error::{Error, Result, StoreErrorKind};
use crate::failpoint;
use crate::lifecycle::restore::PageSource;
use crate::lifecycle::timing::Timing;
use crate::lifecycle::{lock, name_of, Actor};
use crate::oci::annotations::OnRestoreFailure;
use crate::task::{ExitHold, Status};

impl Actor {
    /// RUNNING again (see the module doc), woken by `trigger`.
    pub async fn resume(&self, trigger: Trigger) -> Result<Record> {
        report::triggered(&self.store, Op::Resume, trigger, || self.record(), self.resume_unreported()).await
    }

    async fn resume_unreported(&self) -> Result<Record> {
        // The freeze tier's fast path: a thaw, no CRIU (lifecycle::freezer).
        if let Some(r) = self.thaw_freeze_tier().await? {
            return Ok(r);
        }
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

    /// Resumes the actor if `id` is one of its suspended or frozen
    /// containers (before an exec, for example).
    pub async fn ensure_running(&self, id: &str) -> Result<()> {
        let state = match self.record() {
            Some(rec) if rec.containers.iter().any(|c| c == id) => rec.state,
            _ => return Ok(()),
        };
        if matches!(state, Lifecycle::Suspended | Lifecycle::Frozen) {
            self.resume(Trigger::Exec).await?;
        }
        Ok(())
    }

    /// One attempt of [`Actor::resume`]; `None` when the suspend's staging
    /// was committed meanwhile (try again with the snapshot).
    async fn resume_once(&self, started: Instant) -> Result<Option<Record>> {
        let _gate = self.gate.lock().await;
        let mut t = Timing::start();
        let dir = self.dir().ok_or_else(super::no_actor)?;
        let rec = self.record().ok_or_else(super::no_actor)?;
        if matches!(rec.state, Lifecycle::Frozen | Lifecycle::Suspended) {
            // Only while this node still holds the actor's lease.
            if let Err(e) = self.confirm_lease(&rec.actor, &dir.key()).await {
                return Err(self.refused(&rec, "resume", None, e));
            }
            t.mark("confirm_lease");
        }
        match rec.state {
            Lifecycle::Frozen if rec.in_freeze_tier() => return self.thaw_tier_locked(&rec, started).await.map(Some),
            Lifecycle::Frozen => return self.thaw(&rec, started).await.map(Some),
            Lifecycle::Suspended => {}
            s => return Err(Error::WrongState(format!("actor {} is {s}, not SUSPENDED or FROZEN", rec.actor))),
        }
        let (snap, from) = restore_source(&rec)?;
        report::phase("prepare");
        let Some(co) = self.check_out(&rec, &snap, &from, &mut t).await? else { return Ok(None) };
        failpoint::hit(&dir.key(), failpoint::RESUME_AFTER_PERSIST);
        let armed = lock(&self.held).take();
        let handover = match armed {
            Some(a) => Some(a.begin_handover().await),
            None => None,
        };
        t.mark("handover_begin");
        let hold = co.page_server.is_some().then(ExitHold::default);
        let pages = co.page_server.as_deref().zip(hold.as_ref()).map(|(socket, hold)| PageSource { socket, lease: &co.lease, hold });
        let result = self.restore_or_cold_start(&dir, &rec, &co.path, pages, &mut t).await;
        if result.is_ok() {
            // Its processes run: not in a frozen cgroup, and on a lease
            // the fence's next pass does not find run out by the restore.
            self.thaw_if_frozen(&rec);
            self.refresh_lease(&rec.actor, &dir.key()).await;
            t.mark("after_restore");
        }
        match &result {
            // Never deaf: the ports are held again before the handover
            // ends (its held connections are closed; new ones wake the next
            // attempt, which the activation trigger backs off).
            Err(_) => self.rearm_held_ports(),
            Ok(ran_cold) => self.record_running(&dir, &rec, ran_cold.clone(), started, &mut t),
        }
        if let Some(h) = handover {
            h.finish().await;
            t.mark("handover");
        }
        report::phase("handover");
        if let Err(e) = result {
            self.store.release_logged(&co.lease).await;
            let _ = self.update(|r| r.leases.retain(|l| *l != co.lease));
            return Err(e);
        }
        self.release_when_served(co.lease.clone(), hold);
        // Kept in memory (status shows it), saved with the next change.
        let _ = self.update_if(|r| {
            r.last_resume_phases = t.phases();
            r.last_resume_cpu_us = t.cpu_us();
            None::<()>
        });
        let rec = self.record().ok_or_else(super::no_actor)?;
        info!(actor = rec.actor.as_str(), from = from.as_str(), ms = rec.last_resume_ms, cpu_us = rec.last_resume_cpu_us, phases = ?rec.last_resume_phases, "actor resumed");
        Ok(Some(rec))
    }

    /// The verified files of `snap` (described by `from`), and RESUMING
    /// recorded with the checkout's lease, in one save: the actor stays
    /// SUSPENDED until they are checked out, and nothing is started from
    /// bad data. `None` when the suspend's staging was committed meanwhile.
    async fn check_out(&self, rec: &Record, snap: &SnapshotRef, from: &str, t: &mut Timing) -> Result<Option<Checkout>> {
        let co = match &rec.staging {
            Some(st) if rec.snapshot.is_none() => match self.store.view_staging_as(&st.to_staging(), snap).await {
                Err(e) if e.is_store(StoreErrorKind::NotFound) => return Ok(None),
                r => r,
            },
            // Streamed when only the object tier has it (lazy pages only:
            // its memory is served while it arrives).
            _ if self.config.lazy_pages => self.store.checkout_streamed(snap).await,
            _ => self.store.checkout(snap).await,
        };
        t.mark(if rec.snapshot.is_none() { "view_staging" } else { "checkout" });
        report::phase("fetch");
        let co = co.map_err(|e| self.refused(rec, "resume", Some(from), e))?;
        // Nothing is restored from images that are not the sealed dump.
        if let Err(e) = super::verify_seal(&co.path, &rec.actor, from).await {
            self.store.release_logged(&co.lease).await;
            return Err(self.refused(rec, "resume", Some(from), e));
        }
        t.mark("verify_seal");
        let resuming = self.update(|r| {
            r.state = Lifecycle::Resuming;
            r.leases.push(co.lease.clone());
        });
        if let Err(e) = resuming {
            self.store.release_logged(&co.lease).await;
            let _ = self.update(|r| {
                r.leases.retain(|l| *l != co.lease);
                r.state = Lifecycle::Suspended;
            });
            return Err(e);
        }
        t.mark("record_resuming");
        Ok(Some(co))
    }

    /// Every suspended container restored from `images`; when that fails
    /// and the actor asked for it, started cold instead. What `last_error`
    /// says once RUNNING: nothing, or that the actor was started cold.
    async fn restore_or_cold_start(
        &self,
        dir: &record::Store,
        rec: &Record,
        images: &Path,
        pages: Option<PageSource<'_>>,
        t: &mut Timing,
    ) -> Result<Option<String>> {
        let restored = self.restore_all(dir, rec, images, pages, t).await;
        report::phase("criu_restore");
        let Err(e) = restored else { return Ok(None) };
        if !self.cold_start_wanted(rec) {
            return Err(e);
        }
        let ran_cold = format!("restore failed, started cold (torpor.dev/on-restore-failure: cold-start): {e}");
        let started = self.cold_start_all(rec, &e).await;
        t.mark("cold_start");
        started.map(|()| Some(ran_cold))
    }

    /// RUNNING, once the restored processes run: recorded before the held
    /// connections are let in (once the actor serves, its checkpoint is no
    /// longer its state).
    fn record_running(&self, dir: &record::Store, rec: &Record, last_error: Option<String>, started: Instant, t: &mut Timing) {
        // The restored sockets take their connections' packets again
        // (the rules go in the background, from now on).
        self.release_connections();
        failpoint::hit(&dir.key(), failpoint::RESUME_AFTER_RESTORE);
        let saved = self.update(|r| {
            r.state = Lifecycle::Running;
            r.last_error = last_error;
            r.last_resume_ms = Some(started.elapsed().as_millis() as u64);
            r.committed_at_ms = None;
        });
        if let Err(e) = saved {
            warn!(actor = rec.actor.as_str(), "resumed, but the record could not be saved: {e}");
        }
        t.mark("record_running");
    }

    /// Whether the actor's containers say `torpor.dev/on-restore-failure:
    /// cold-start`.
    fn cold_start_wanted(&self, rec: &Record) -> bool {
        rec.containers
            .iter()
            .filter_map(|id| self.tasks.app_info(id).ok())
            .any(|i| i.actor.on_restore_failure == OnRestoreFailure::ColdStart)
    }

    /// The restore failed (`why`) and the actor asked for a cold start: its
    /// suspended containers start afresh from their images; the snapshot
    /// stays in the store (the caller records RUNNING, with the reason).
    async fn cold_start_all(&self, rec: &Record, why: &Error) -> Result<()> {
        warn!(actor = rec.actor.as_str(), "restore failed, starting the actor cold (torpor.dev/on-restore-failure: cold-start): {why}");
        for id in &rec.containers {
            if self.tasks.is_suspended(id) {
                self.tasks.cold_start(id).await.map_err(|e| e.context(&format!("cold start of {id} after a failed restore ({why})")))?;
            }
        }
        Ok(())
    }

    /// A frozen actor: thawed (its lease confirmed again if the thaw was
    /// slow: [`Actor::refresh_lease`]).
    async fn thaw(&self, rec: &Record, started: Instant) -> Result<Record> {
        for id in &rec.containers {
            if self.tasks.status(id) == Some(Status::Paused) {
                self.tasks.resume(id).await?;
            }
        }
        if let Some(dir) = self.dir() {
            self.refresh_lease(&rec.actor, &dir.key()).await;
        }
        self.update(|r| {
            r.state = Lifecycle::Running;
            r.last_resume_ms = Some(started.elapsed().as_millis() as u64);
            if r.fenced.take().is_some() {
                r.last_error = None;
            }
            r.clone()
        })
    }

    /// Restores every suspended container of the actor. When one fails,
    /// those restored before it are suspended again (a pod is never half
    /// running under a SUSPENDED record) and the actor is SUSPENDED, with
    /// the reason.
    async fn restore_all(
        &self,
        dir: &record::Store,
        rec: &Record,
        images: &Path,
        pages: Option<PageSource<'_>>,
        t: &mut Timing,
    ) -> Result<()> {
        let mut restored: Vec<&str> = Vec::new();
        for id in &rec.containers {
            if !self.tasks.is_suspended(id) {
                continue;
            }
            failpoint::hit(&dir.key(), failpoint::RESUME_DURING_RESTORE);
            let name = name_of(rec, id);
            let image = images.join(name);
            let restored_one = if failpoint::fails(&dir.key(), failpoint::RESTORE_FAILS, name) {
                Err(Error::FailedPrecondition(format!("restore of container {name} failed (failpoint {})", failpoint::RESTORE_FAILS)))
            } else {
                self.restore_one(dir, rec.generation, id, &image, pages, t).await
            };
            if let Err(e) = restored_one {
                warn!(actor = rec.actor.as_str(), container = id.as_str(), "resume failed: {e}");
                // Their lazy-pages daemons end with the processes.
                for done in &restored {
                    if let Err(ue) = self.tasks.unrestore(done).await {
                        warn!(actor = rec.actor.as_str(), container = *done, "undo of the restore after a failed resume: {ue}");
                    }
                }
                self.wait_lazy_daemons().await;
                let e = e.context(&format!("resume of actor {}", rec.actor));
                self.update(|r| {
                    r.state = Lifecycle::Suspended;
                    r.last_error = Some(e.to_string());
                })?;
                return Err(e);
            }
            restored.push(id);
        }
        // Every process has its connection ends now (kept until here: an
        // undone restore must find them again).
        for id in &restored {
            self.links_restored(name_of(rec, id));
        }
        Ok(())
    }
}

/// The snapshot a SUSPENDED `rec` is restored from, and how the log names
/// it: its snapshot, or before the background commit is done, the dump
/// this shim just wrote (a view of its staging), which the commit goes on
/// turning into the snapshot.
fn restore_source(rec: &Record) -> Result<(SnapshotRef, String)> {
    match (&rec.snapshot, &rec.staging) {
        (Some(snap), _) => Ok((snap.clone(), format!("snapshot {snap}"))),
        (None, Some(st)) => Ok((
            SnapshotRef { actor: rec.actor.clone(), generation: rec.generation },
            format!("the dump of its suspend (staging {}, commit under way)", st.id),
        )),
        (None, None) => Err(Error::FailedPrecondition(format!(
            "actor {} is SUSPENDED but has neither a snapshot nor a staging{}",
            rec.actor,
            rec.last_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
        ))),
    }
}
