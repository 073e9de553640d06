//! Crash safety: what happens when a shim dies (SIGKILL, OOM, a bug) in
//! the middle of anything, and how its actor comes back.
//!
//! **After the death** containerd runs `containerd-shim-torpor-v1 delete`
//! once per container of the dead shim ([`after_shim_death`]). It kills
//! everything the dead shim left running — its runc, CRIU and lazy-pages
//! children (found by [`crate::system::reaper::TAG_ENV`]), the containers (`runc
//! delete --force`) and whatever is left in their cgroups (a restore under
//! way) — and only then decides about the actor's record:
//!
//! | record                          | outcome                                  |
//! |---------------------------------|------------------------------------------|
//! | RUNNING, FROZEN                 | removed: the containers died (as with runc-v2); a default-id actor's snapshots are removed (stale) |
//! | SUSPENDING (dumps incomplete)   | removed, the staging aborted: nothing to restore |
//! | SUSPENDED, dumps done, not committed | the staging committed by the cleanup, kept |
//! | RESUMING from a staging not committed yet | the staging committed by the cleanup, kept |
//! | SUSPENDED, RESUMING             | kept (its snapshot is in the store)      |
//!
//! Checkout leases the dead shim held are released. A kept record is
//! marked `orphaned` (for an operator: `torporctl status`); the state
//! itself is in the node's snapshot store.
//!
//! **The way back** ([`crate::lifecycle::adopt`]): when the first app
//! container of a pod of the actor is created, [`crate::lifecycle::Actor::adopt`] asks the store for the actor's newest
//! snapshot; each container whose name it holds is restored from it at
//! start (RESUMING persisted first) instead of starting cold. Once it runs,
//! the dead shims' records of the actor are removed;
//! a restore that fails leaves the snapshot in the store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

use crate::actor::claim;
use crate::actor::snapshots::Snapshots;
use crate::actor::store_client::SnapshotStore;
use crate::actor::{state_root, Lifecycle, Record, Store};
use crate::error::Result;
use crate::lifecycle::commit_labels;
use crate::oci::bundle::remove_request_dir;
use crate::oci::spec::cgroup_of_bundle;
use crate::system::cgroup::kill_cgroup;
use crate::system::reaper::kill_tagged;
use crate::system::runc::Runc;
use crate::system::runc_options::RuncOptions;

/// Cleanup after the shim `shim` died, for its container `id` (bundle
/// `bundle`, containerd namespace `namespace`). `shim` is the id the dead
/// shim ran with (the pod's sandbox id under CRI). Never fails: everything
/// is logged.
pub async fn after_shim_death(namespace: &str, shim: &str, id: &str, bundle: &Path) {
    kill_tagged(shim).await;
    let runc = container_gone(namespace, id, bundle).await;

    // The actor's store is the dead shim's: every container's cleanup looks
    // at it (containerd runs them concurrently), one at a time; the first
    // settles it.
    let root = state_root();
    let Ok(store) = Store::new(&root, shim) else { return };
    let _lock = match CleanupLock::take(&root, shim) {
        Ok(l) => l,
        Err(e) => {
            warn!("after the shim died: {e}; the actor record is left for an operator");
            return;
        }
    };
    let rec = match store.load() {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            warn!("after the shim died: {e}; the actor record is left for an operator");
            return;
        }
    };
    if rec.orphaned {
        return; // a second cleanup of the same death
    }
    // Every container of the actor is dead before the record is judged:
    // containerd cleans the containers up concurrently, in any order.
    for c in rec.containers.iter().chain(rec.names.keys()) {
        kill_container(&runc, c, rec.cgroups.get(c).map(String::as_str)).await;
    }
    if let Err(e) = remove_request_dir(shim) {
        warn!("after the shim died: remove the request directory: {e}");
    }
    let actor = rec.actor.clone();
    settle(&SnapshotStore::new(), &store, rec).await;
    claim::remove_stale(&actor);
}

/// Cleanup of container `id` alone (bundle `bundle`) when containerd lets
/// go of it while its shim still serves the pod (a task whose start failed,
/// a connection containerd closed): the container and what is left in its
/// cgroup are killed and deleted, as runc-v2's cleanup does; the actor, its
/// record and its lease stay the live shim's. Returns the runc it used.
pub async fn container_gone(namespace: &str, id: &str, bundle: &Path) -> Runc {
    // The runc the shim drove (containerd's runtime options, kept in the
    // bundle at create).
    let options = RuncOptions::load(bundle).unwrap_or_else(|e| {
        warn!("cleanup of container {id}: {e}; using the default runc");
        RuncOptions::default()
    });
    let runc = Runc::for_options(namespace, bundle, &options);
    kill_container(&runc, id, cgroup_of_bundle(bundle).as_deref()).await;
    runc
}

/// Decides what is kept of a dead shim's actor (see the module doc).
pub(super) async fn settle(snaps: &dyn Snapshots, store: &Store, mut rec: Record) {
    let dir = store.dir().to_path_buf();
    // Checkouts the dead shim held pin snapshots against eviction.
    for lease in std::mem::take(&mut rec.leases) {
        snaps.release_logged(&lease).await;
    }
    let keep = match rec.state {
        Lifecycle::Running | Lifecycle::Frozen => {
            info!(actor = rec.actor.as_str(), state = %rec.state, "the shim died with the actor {}: its containers were killed, nothing to keep", rec.state);
            // Retention as for a removal: a running actor with the default
            // id has moved past its snapshots.
            if rec.ran && !rec.explicit_actor {
                snaps.remove_all_logged(&rec.actor).await;
            }
            false
        }
        Lifecycle::Suspending => {
            warn!(
                actor = rec.actor.as_str(),
                generation = rec.generation,
                "the shim died during a suspend, before every dump completed: nothing to commit, the actor's containers were killed"
            );
            if let Some(st) = &rec.staging {
                snaps.abort_logged(&st.to_staging()).await;
            }
            false
        }
        Lifecycle::Suspended | Lifecycle::Resuming if rec.snapshot.is_none() => match rec.staging.clone() {
            Some(st) => {
                // Every dump had completed: commit them now.
                let labels = commit_labels(&store.key(), &rec);
                let keep_local = rec.keep_local_s.map(Duration::from_secs);
                match snaps.commit_staging(&rec.actor, &st.to_staging(), labels, keep_local).await {
                    Ok(snap) => {
                        warn!(actor = rec.actor.as_str(), snapshot = %snap, "the shim died after its suspend's dumps, before the commit: committed by the cleanup, restorable by identity");
                        rec.snapshot = Some(snap);
                        rec.staging = None;
                        rec.last_error = Some("the shim died before its suspend was committed: committed by the cleanup".into());
                    }
                    Err(e) => {
                        warn!(
                            actor = rec.actor.as_str(),
                            staging = st.id.as_str(),
                            "the shim died before its suspend was committed, and the commit by the cleanup failed: {e}"
                        );
                        rec.last_error =
                            Some(format!("the shim died before its suspend was committed; the commit by the cleanup failed: {e}"));
                    }
                }
                true
            }
            None => false,
        },
        Lifecycle::Suspended | Lifecycle::Resuming => {
            let snap = rec.snapshot.as_ref().map(|s| s.to_string()).unwrap_or_default();
            warn!(actor = rec.actor.as_str(), snapshot = snap.as_str(), state = %rec.state, "the shim died with the actor {}: its snapshot stays in the store, restorable by identity", rec.state);
            rec.snapshot.is_some()
        }
    };
    // The dead shim's actor leaves this node: a kept snapshot is uploaded
    // before the lease goes, so any node can restore it.
    snaps.surrender_logged(&rec.actor, &store.key()).await;
    if !keep {
        if let Err(e) = store.remove() {
            warn!("remove actor state: {e}");
        }
        return;
    }
    // The record stays (marked orphaned) for an operator to see, until a
    // container of the actor is restored; the state is in the store.
    store.remove_work();
    rec.orphaned = true;
    if let Err(e) = store.save(&rec) {
        warn!(actor = rec.actor.as_str(), "cannot mark the kept record in {dir:?}: {e}");
    }
}

/// An exclusive lock on the cleanup of one dead shim's actor
/// (`<state root>/locks/<shim>.lock`, removed when released).
struct CleanupLock {
    path: PathBuf,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl CleanupLock {
    fn take(root: &Path, shim: &str) -> Result<CleanupLock> {
        use crate::error::IoContext;
        let dir = root.join("locks");
        std::fs::create_dir_all(&dir).io_context(|| format!("create {dir:?}"))?;
        let path = dir.join(format!("{shim}.lock"));
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).io_context(|| format!("open {path:?}"))?;
        let lock =
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).io_context(|| format!("lock {path:?}"))?;
        Ok(CleanupLock { path, _lock: lock })
    }
}

impl Drop for CleanupLock {
    fn drop(&mut self) {
        // A cleanup still waiting holds the old file and finds the record
        // settled; one coming later locks a new file and finds the same.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `runc delete --force`, then SIGKILL to whatever is still in the
/// container's cgroup (a restore that runc had not recorded yet), and what
/// a restore without runc left.
async fn kill_container(runc: &Runc, id: &str, cgroup: Option<&str>) {
    if let Err(e) = runc.delete(id, true).await {
        if !crate::system::runc::is_not_running(&e) {
            tracing::debug!(container = id, "cleanup: runc delete: {e}");
        }
    }
    if let Some(cg) = cgroup {
        kill_cgroup(cg).await;
    }
    // A restore the dead shim drove itself (no runc to take it down).
    crate::system::criu_restore::remove_leftovers(&runc.state_dir(id));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::store_client::SnapshotRef;

    fn record(state: Lifecycle) -> Record {
        let mut r = Record::new("ns/pod".into());
        r.state = state;
        r.generation = 1;
        r.containers = vec!["c1".into()];
        r.names.insert("c1".into(), "web".into());
        r
    }

    #[tokio::test]
    async fn what_is_kept_after_a_shim_died() {
        let root = tempfile::tempdir().unwrap();
        // No snapshot store answers in a unit test.
        let snaps = SnapshotStore::at(root.path().join("no-store.sock"));
        let s = Store::new(root.path(), "k").unwrap();
        let staging = crate::actor::StagingRecord { id: "st".into(), path: root.path().join("st") };
        let snap = SnapshotRef { actor: "ns/pod".into(), generation: 4 };

        for state in [Lifecycle::Running, Lifecycle::Frozen] {
            s.save(&record(state)).unwrap();
            settle(&snaps, &s, record(state)).await;
            assert!(!s.dir().exists(), "{state}: removed");
        }

        // A suspend cut before every dump completed: nothing is kept.
        let mut r = record(Lifecycle::Suspending);
        r.staging = Some(staging.clone());
        s.save(&r).unwrap();
        settle(&snaps, &s, r).await;
        assert!(!s.dir().exists(), "partial suspend removed");

        // Dumps complete, commit not done, and the store unreachable: the
        // record stays, saying so.
        let mut r = record(Lifecycle::Suspended);
        r.staging = Some(staging.clone());
        r.leases = vec!["l1".into()];
        s.save(&r).unwrap();
        settle(&snaps, &s, r).await;
        let kept = s.load().unwrap().unwrap();
        assert!(kept.orphaned && kept.snapshot.is_none() && kept.leases.is_empty());
        assert!(kept.last_error.unwrap().contains("commit by the cleanup failed"));
        s.remove().unwrap();

        for state in [Lifecycle::Suspended, Lifecycle::Resuming] {
            let mut r = record(state);
            r.snapshot = Some(snap.clone());
            s.save(&r).unwrap();
            settle(&snaps, &s, r).await;
            let kept = s.load().unwrap().unwrap();
            assert_eq!(kept.state, state);
            assert!(kept.orphaned, "{state}: kept");
            assert_eq!(kept.snapshot.as_ref(), Some(&snap));
            s.remove().unwrap();

            // ... but not without a snapshot.
            let r = record(state);
            s.save(&r).unwrap();
            settle(&snaps, &s, r).await;
            assert!(!s.dir().exists(), "{state} without a snapshot: removed");
        }
    }
}
