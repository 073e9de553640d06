//! Background work: the worker that finishes removals, enforces the local
//! budget and uploads what is due (retrying with backoff), and the lease
//! worker that renews actor leases and checkout pins apart from it.
//!
//! Why `impl Store` here: a pass drives the other concerns (retention,
//! upload) over every record; the tasks themselves are the free functions
//! [`worker`] and [`lease_worker`], which hold only a `Weak<Store>`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tracing::error;

use crate::db::{self, LocalState, RemoteState};
use crate::error::Result;
use crate::state::Store;
use crate::time::now_ms;
use crate::util::lock;

impl Store {
    /// Wake the background worker now (it also runs every `scan_interval`).
    pub fn kick(&self) {
        self.wake.notify_one();
    }

    /// One pass of background work: finish removals, prune superseded
    /// snapshots that never left the node (`prune_keep`), enforce the
    /// budget, upload what is due (retrying with backoff), enforce the
    /// budget again.
    pub async fn run_background_pass(&self) -> Result<()> {
        for r in db::records(&self.db, None)?.into_iter().filter(|r| r.removing) {
            let id = r.id();
            if let Err(e) = self.finish_remove(&id).await {
                self.note_error(format!("remove {id}: {e}"));
            }
        }
        if let Some(keep) = self.cfg.prune_keep {
            self.prune_local_only(keep).await?;
        }
        let pressure = self.enforce_budget().await?;
        let now = now_ms();
        for r in db::records(&self.db, None)? {
            if *self.shutdown.borrow() {
                return Ok(());
            }
            let due = r.local == LocalState::Present
                && r.remote != RemoteState::Durable
                && !r.removing
                && now >= r.next_attempt_ms
                && (r.remote == RemoteState::Uploading || r.upload_now || pressure || now >= r.keep_local_until_ms);
            if due {
                let id = r.id();
                if let Err(e) = self.upload_once(&id, None).await {
                    self.upload_failed(&id, &e);
                }
            }
        }
        if pressure {
            self.enforce_budget().await?;
        }
        Ok(())
    }

    /// Run the lease worker (actor lease renewals, checkout pins) on `rt`
    /// from now on: the daemon keeps it off the data path, on the runtime
    /// that answers `Confirm`, so busy uploads and commits cannot delay a
    /// renewal into a lapse.
    pub fn run_leases_on(self: &Arc<Self>, rt: &tokio::runtime::Handle) {
        let weak = Arc::downgrade(self);
        let rx = self.shutdown.subscribe();
        let handle = rt.spawn(lease_worker(weak, self.cfg.lease_ttl / 3, rx));
        if let Some(old) = lock(&self.lease_worker).replace(handle) {
            old.abort();
        }
    }

    /// Stop background work (waits for the pass in progress to end).
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let handles = [lock(&self.worker).take(), lock(&self.lease_worker).take()];
        for h in handles.into_iter().flatten() {
            let _ = h.await;
        }
        // The database records of renewals under way (bounded: an acquire
        // retrying against an unreachable object tier holds its lock too,
        // and a record not written heals at the next renewal).
        let _ = tokio::time::timeout(Duration::from_secs(5), self.leases.settle()).await;
    }
}

pub(crate) async fn worker(store: Weak<Store>, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        // Hold the store only during a pass: dropping the last Arc<Store> ends the worker.
        let sleep = {
            let Some(s) = store.upgrade() else { return };
            if *shutdown.borrow() {
                return;
            }
            if let Err(e) = s.run_background_pass().await {
                error!(error = %e, "background pass");
                s.note_error(format!("background: {e}"));
            }
            // Wake early when a retry falls due.
            let next_retry = db::records(&s.db, None).ok().and_then(|recs| {
                recs.iter()
                    .filter(|r| r.local == LocalState::Present && r.remote != RemoteState::Durable && r.next_attempt_ms > 0)
                    .map(|r| r.next_attempt_ms)
                    .min()
            });
            let interval = s.cfg.scan_interval;
            next_retry.map(|t| Duration::from_millis(t.saturating_sub(now_ms()))).map_or(interval, |d| d.min(interval))
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = wake.notified() => {}
            _ = shutdown.changed() => { return; }
        }
    }
}

/// Renews the actor leases this node holds every `every` (a third of the
/// lease's TTL), apart from the uploader: a long upload must not let them
/// lapse. The first pass is at once: the leases a restarted daemon finds in
/// its database were last renewed by its predecessor, up to `every` (plus
/// the restart) ago.
pub(crate) async fn lease_worker(store: Weak<Store>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        // Passes start `every` apart, however long one takes: a lease's
        // validity counts from the start of its renewal, so a pass that
        // waited for a slow object tier must not push the next one later.
        let next = tokio::time::Instant::now() + every;
        {
            let Some(s) = store.upgrade() else { return };
            if *shutdown.borrow() {
                return;
            }
            s.lease_pass().await;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shutdown.changed() => { return; }
        }
    }
}
