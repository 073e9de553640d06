//! Retention: eviction of local copies (on demand, and the byte budget of
//! the local tier), removal of snapshots everywhere, and gc of superseded
//! snapshots by policy (then the chunk sweep, `sweep`).
//!
//! Why `impl Store` here: retention deletes what the other concerns made
//! (local copies under their exclusive file lock, manifests, records) and
//! must see their pins (checkout leases here, pins of other nodes).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tracing::{info, warn};

use crate::db::{self, LocalState, Record, RemoteState, Tx};
use crate::error::{Error, Result};
use crate::gc::{GcPolicy, GcReport};
use crate::id::{ActorName, SnapshotId};
use crate::local;
use crate::state::Store;
use crate::util::lock;

/// A writer's staging untouched for this long is abandoned (gc drops it).
const STALE_STAGING: Duration = Duration::from_secs(24 * 3600);

impl Store {
    /// Drop the local copy of a durable, unpinned snapshot.
    pub async fn evict(&self, id: &SnapshotId) -> Result<()> {
        self.evict_inner(id, false).await.map(|_| ())
    }

    /// Ok(true) evicted, Ok(false) nothing to do / busy (try_lock).
    pub(crate) async fn evict_inner(&self, id: &SnapshotId, try_lock: bool) -> Result<bool> {
        let check = |r: &Record| -> Result<bool> {
            if r.removing {
                return Err(Error::NotFound(id.clone()));
            }
            if r.remote != RemoteState::Durable {
                return Err(Error::NotDurable { id: id.clone(), state: format!("object tier: {:?}", r.remote).to_lowercase() });
            }
            if r.local == LocalState::Absent {
                return Ok(false);
            }
            let pins = db::lease_count(&self.db, &id.db_key())?;
            if pins > 0 {
                return Err(Error::Pinned { id: id.clone(), leases: pins });
            }
            Ok(true)
        };
        let rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        if !check(&rec)? {
            return Ok(false);
        }
        let kl = self.key_lock(id);
        let _excl = if try_lock {
            match kl.files.try_write() {
                Ok(g) => g,
                Err(_) => return Ok(false),
            }
        } else {
            kl.files.write().await
        };
        let mut rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        if !check(&rec)? {
            return Ok(false);
        }
        rec.local = LocalState::Evicting;
        let tx = Tx::begin(&self.db)?;
        tx.put(&rec)?;
        tx.commit()?;
        local::remove_tree(&self.snapshot_dir(id), &self.paths.trash)?;
        rec.local = LocalState::Absent;
        let tx = Tx::begin(&self.db)?;
        tx.put(&rec)?;
        tx.commit()?;
        info!(snapshot = %id, bytes = rec.logical_bytes, "evicted local copy");
        Ok(true)
    }

    /// Delete a snapshot everywhere: its manifest in the object tier (its
    /// chunks go with the next sweep), its local copy, its record. Refused
    /// while pinned.
    pub async fn remove(&self, id: &SnapshotId) -> Result<()> {
        let rec = match db::record(&self.db, id)? {
            Some(r) => r,
            None => self.import_opened(id, false).await?,
        };
        let key = id.db_key();
        let pins = db::lease_count(&self.db, &key)?;
        if pins > 0 {
            return Err(Error::Pinned { id: id.clone(), leases: pins });
        }
        let kl = self.key_lock(id);
        let _excl = kl.files.write().await;
        let pins = db::lease_count(&self.db, &key)?;
        if pins > 0 {
            return Err(Error::Pinned { id: id.clone(), leases: pins });
        }
        if !rec.removing && rec.remote != RemoteState::Absent {
            // A checkout on another node that fetched it keeps it.
            self.check_not_pinned_elsewhere(id).await?;
        }
        if !rec.removing {
            let tx = Tx::begin(&self.db)?;
            let mut r = tx.get(id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
            r.removing = true;
            tx.put(&r)?;
            tx.commit()?;
        }
        self.finish_remove(id).await
    }

    pub(crate) async fn finish_remove(&self, id: &SnapshotId) -> Result<()> {
        let Some(rec) = db::record(&self.db, id)? else { return Ok(()) };
        if rec.remote != RemoteState::Absent {
            self.remote.delete_manifest(id).await?;
        }
        local::remove_tree(&self.snapshot_dir(id), &self.paths.trash)?;
        let tx = Tx::begin(&self.db)?;
        tx.delete(id)?;
        tx.remove_leases_of(&id.db_key())?;
        tx.commit()?;
        info!(snapshot = %id, "removed");
        Ok(())
    }

    /// Remove superseded snapshots by policy (never an actor's newest, never a
    /// pinned one), then optionally sweep unreferenced chunks.
    pub async fn gc(&self, policy: GcPolicy) -> Result<GcReport> {
        if policy.keep_newest == 0 {
            return Err(Error::InvalidArgument("gc keep_newest must be ≥ 1 (the newest snapshot is never collected)".into()));
        }
        let mut report = GcReport::default();
        // A manifest this node cannot read (a key it does not have) is
        // reported and kept; the rest of gc goes on.
        let mut unreadable = BTreeMap::new();
        self.refresh_for_gc(policy.actor.as_ref(), &mut unreadable).await?;
        // Stagings no writer committed or aborted within a day (its shim died
        // and its cleanup could not settle it) are dropped.
        let stale: Vec<String> = lock(&self.stagings)
            .iter()
            .filter(|(id, (actor, busy))| {
                !busy
                    && policy.actor.as_ref().is_none_or(|a| a == actor)
                    && std::fs::metadata(self.paths.staging.join(id))
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE_STAGING))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            warn!(staging = %id, "gc: dropping a staging nobody committed for a day");
            if let Err(e) = self.abort(&id).await {
                report.errors.push(format!("staging {id}: {e}"));
            }
        }
        for r in self.superseded(policy.actor.as_ref(), policy.keep_newest)? {
            let id = r.id();
            match self.remove(&id).await {
                Ok(()) => report.removed.push(id),
                Err(Error::Pinned { .. } | Error::PinnedElsewhere { .. }) => report.kept_pinned.push(id),
                Err(e) => report.errors.push(format!("{id}: {e}")),
            }
        }
        if policy.sweep_chunks {
            if let Err(e) = self.sweep_chunks(policy.chunk_grace, &mut report, &mut unreadable).await {
                warn!(error = %e, "chunk sweep stopped");
                report.errors.push(format!("chunk sweep stopped: {e}"));
            }
        }
        for u in unreadable.into_values() {
            warn!(snapshot = %u.id, key = u.key_id.as_deref().unwrap_or("-"), error = %u.error, keeps = %u.keeps, "gc: a manifest in the object tier cannot be read here: kept, and its chunks with it");
            report.errors.push(u.to_string());
            report.unreadable.push(u);
        }
        info!(
            removed = report.removed.len(),
            chunks_deleted = report.chunks_deleted,
            unreadable = report.unreadable.len(),
            errors = report.errors.len(),
            "gc done"
        );
        Ok(report)
    }

    /// Remove the snapshots beyond each actor's newest `keep` that exist on
    /// this node alone: a local copy, never uploaded (nor being uploaded,
    /// nor asked to be), no pin (`StoreConfig::prune_keep`). The newest `keep` count
    /// every generation the database knows, in either tier, as gc does.
    /// Each removal is logged; one that fails is noted and the rest go on.
    pub(crate) async fn prune_local_only(&self, keep: usize) -> Result<()> {
        for r in self.superseded(None, keep.max(1))? {
            // An upload asked for (`upload`, retried in the background) is honoured.
            if r.local != LocalState::Present || r.remote != RemoteState::Absent || r.upload_now {
                continue;
            }
            let id = r.id();
            match self.remove(&id).await {
                Ok(()) => info!(snapshot = %id, bytes = r.logical_bytes, keep, "pruned a superseded snapshot that never left this node"),
                // A pin keeps it (`remove` checks before it touches anything).
                Err(Error::Pinned { .. }) => {}
                Err(e) => self.note_error(format!("prune {id}: {e}")),
            }
        }
        Ok(())
    }

    /// The records beyond each actor's newest `keep` generations (of
    /// `actor`, or of all), by actor and newest first; those being removed
    /// are not counted.
    fn superseded(&self, actor: Option<&ActorName>, keep: usize) -> Result<Vec<Record>> {
        let mut by_actor: BTreeMap<ActorName, Vec<Record>> = BTreeMap::new();
        for r in db::records(&self.db, actor)? {
            if !r.removing {
                by_actor.entry(r.actor.clone()).or_default().push(r);
            }
        }
        Ok(by_actor
            .into_values()
            .flat_map(|mut recs| {
                recs.sort_by_key(|r| std::cmp::Reverse(r.generation));
                recs.into_iter().skip(keep)
            })
            .collect())
    }

    /// Forget every chunk known durable (the next uploads check by PUTting
    /// again). For an object tier that lost data behind the store's back.
    pub async fn forget_chunk_index(&self) -> Result<()> {
        let _w = self.sweep.write().await;
        let tx = Tx::begin(&self.db)?;
        tx.clear_chunks()?;
        tx.commit()
    }

    /// Evict least recently used durable, unpinned snapshots while over
    /// budget. Returns whether the store is still over budget (disk pressure).
    pub(crate) async fn enforce_budget(&self) -> Result<bool> {
        let recs = db::records(&self.db, None)?;
        let mut used: u64 = recs.iter().map(|r| r.local_bytes()).sum();
        if used > self.cfg.local_budget_bytes {
            let pinned: HashSet<String> = db::leases(&self.db)?.into_iter().map(|(_, l)| l.key).collect();
            let mut candidates: Vec<&Record> = recs
                .iter()
                .filter(|r| {
                    r.local == LocalState::Present && r.remote == RemoteState::Durable && !r.removing && !pinned.contains(&r.id().db_key())
                })
                .collect();
            candidates.sort_by_key(|r| (r.last_used_ms, r.created_ms, r.generation));
            for r in candidates {
                if used <= self.cfg.local_budget_bytes {
                    break;
                }
                let id = r.id();
                match self.evict_inner(&id, true).await {
                    Ok(true) => used = used.saturating_sub(r.logical_bytes),
                    Ok(false) => {}
                    Err(e) => self.note_error(format!("evict {id}: {e}")),
                }
            }
        }
        let pressure = used > self.cfg.local_budget_bytes;
        let was = self.stats.update(|s| std::mem::replace(&mut s.disk_pressure, pressure));
        if pressure && !was {
            warn!(
                used,
                budget = self.cfg.local_budget_bytes,
                "local tier over budget with nothing evictable: uploading regardless of keep-local"
            );
        }
        Ok(pressure)
    }
}
