//! Crash safety: what happens when a shim dies (SIGKILL, OOM, a bug) in
//! the middle of anything, and how its actor comes back.
//!
//! **After the death** containerd runs `containerd-shim-torpor-v1 delete`
//! once per container of the dead shim ([`after_shim_death`]). It kills
//! everything the dead shim left running — its runc, CRIU and lazy-pages
//! children (found by [`crate::reaper::TAG_ENV`]), the containers (`runc
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
//! **The way back**: when the first app container of a pod of the actor is
//! created, [`Runtime::adopt_kept`] asks the store for the actor's newest
//! snapshot; each container whose name it holds is restored from it at
//! start (RESUMING persisted first) instead of starting cold. Once it runs,
//! the dead shims' records of the actor are removed ([`Runtime::recovered`]);
//! a restore that fails leaves the snapshot in the store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use log::{info, warn};

use crate::actor::{Lifecycle, Record, Store};
use crate::container::Runtime;
use crate::error::{Error, Result};
use crate::identity::{self, Identity};
use crate::lifecycle::{checkout, release_checkout, with_context};
use crate::runc::Runc;
use crate::snapshots::{Checkout, SnapshotRef, SnapshotStore};
use crate::spec::RestoreSource;

/// A container being restored by identity from a snapshot of the store
/// (between its create and its start).
#[derive(Debug, Clone)]
pub struct Adopted {
    pub identity: Identity,
    pub snapshot: SnapshotRef,
    /// The snapshot's verified files, pinned until the restore is done.
    pub checkout: Checkout,
    /// `<checkout>/<container name>`: the CRIU image.
    pub image: PathBuf,
}

/// Cleanup after the shim `shim` died, for its container `id` (bundle
/// `bundle`, containerd namespace `namespace`). `shim` is the id the dead
/// shim ran with (the pod's sandbox id under CRI). Never fails: everything
/// is logged.
pub async fn after_shim_death(namespace: &str, shim: &str, id: &str, bundle: &Path) {
    kill_tagged(shim);
    let runc = Runc::for_namespace(namespace, bundle);
    kill_container(&runc, id, cgroup_of_bundle(bundle).as_deref()).await;

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
    let _ = std::fs::remove_dir_all(crate::policy::request_dir(shim));
    settle(&store, rec).await;
}

/// Decides what is kept of a dead shim's actor (see the module doc).
async fn settle(store: &Store, mut rec: Record) {
    let dir = store.dir().to_path_buf();
    // Checkouts the dead shim held pin snapshots against eviction.
    for lease in std::mem::take(&mut rec.leases) {
        crate::lifecycle::release_lease(&lease).await;
    }
    let keep = match rec.state {
        Lifecycle::Running | Lifecycle::Frozen => {
            info!(actor = rec.actor.as_str(), state:% = rec.state; "the shim died with the actor {}: its containers were killed, nothing to keep", rec.state);
            // Retention as for a removal: a running actor with the default
            // id has moved past its snapshots.
            if rec.ran && !rec.explicit_actor {
                crate::lifecycle::remove_snapshots(&rec.actor).await;
            }
            false
        }
        Lifecycle::Suspending => {
            warn!(actor = rec.actor.as_str(), generation = rec.generation; "the shim died during a suspend, before every dump completed: nothing to commit, the actor's containers were killed");
            if let Some(st) = &rec.staging {
                crate::lifecycle::abort_staging(&st.to_staging()).await;
            }
            false
        }
        Lifecycle::Suspended | Lifecycle::Resuming if rec.snapshot.is_none() => match rec.staging.clone() {
            Some(st) => {
                // Every dump had completed: commit them now.
                let labels = crate::lifecycle::commit_labels(&store.key(), &rec);
                let keep_local = rec.keep_local_s.map(Duration::from_secs);
                match crate::lifecycle::commit_staging(&rec.actor, &st.to_staging(), labels, keep_local).await {
                    Ok(snap) => {
                        warn!(actor = rec.actor.as_str(), snapshot:% = snap; "the shim died after its suspend's dumps, before the commit: committed by the cleanup, restorable by identity");
                        rec.snapshot = Some(snap);
                        rec.staging = None;
                        rec.last_error = Some("the shim died before its suspend was committed: committed by the cleanup".into());
                    }
                    Err(e) => {
                        warn!(actor = rec.actor.as_str(), staging = st.id.as_str(); "the shim died before its suspend was committed, and the commit by the cleanup failed: {e}");
                        rec.last_error = Some(format!("the shim died before its suspend was committed; the commit by the cleanup failed: {e}"));
                    }
                }
                true
            }
            None => false,
        },
        Lifecycle::Suspended | Lifecycle::Resuming => {
            let snap = rec.snapshot.as_ref().map(|s| s.to_string()).unwrap_or_default();
            warn!(actor = rec.actor.as_str(), snapshot = snap.as_str(), state:% = rec.state; "the shim died with the actor {}: its snapshot stays in the store, restorable by identity", rec.state);
            rec.snapshot.is_some()
        }
    };
    // The dead shim's actor leaves this node: a kept snapshot is uploaded
    // before the lease goes, so any node can restore it.
    crate::lifecycle::surrender_lease(&rec.actor, &store.key()).await;
    if !keep {
        if let Err(e) = store.remove() {
            warn!("remove actor state: {e}");
        }
        return;
    }
    // The record stays (marked orphaned) for an operator to see, until a
    // container of the actor is restored; the state is in the store.
    let _ = std::fs::remove_dir_all(store.work_root());
    rec.orphaned = true;
    if let Err(e) = store.save(&rec) {
        warn!(actor = rec.actor.as_str(); "cannot mark the kept record in {dir:?}: {e}");
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
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .io_context(|| format!("open {path:?}"))?;
        let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .io_context(|| format!("lock {path:?}"))?;
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

fn state_root() -> PathBuf {
    std::env::var_os("TORPOR_STATE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::actor::STATE_ROOT.into())
}

/// `runc delete --force`, then SIGKILL to whatever is still in the
/// container's cgroup (a restore that runc had not recorded yet).
async fn kill_container(runc: &Runc, id: &str, cgroup: Option<&str>) {
    if let Err(e) = runc.delete(id, true).await {
        if !crate::runc::is_not_running(&e) {
            log::debug!(container = id; "cleanup: runc delete: {e}");
        }
    }
    if let Some(cg) = cgroup {
        kill_cgroup(cg).await;
    }
}

/// The cgroup (OCI `cgroupsPath`) of the container of `bundle`.
fn cgroup_of_bundle(bundle: &Path) -> Option<String> {
    let spec = crate::container::read_spec(bundle).ok()?;
    spec.linux().as_ref()?.cgroups_path().as_ref().map(|p| p.to_string_lossy().into_owned())
}

/// The cgroup directories of `path` in every mounted hierarchy (v1: one per
/// controller; v2: the unified one). A systemd-style `slice:prefix:name`
/// path is not resolved (runc's delete covers that case).
fn cgroup_dirs(path: &str) -> Vec<PathBuf> {
    if !path.starts_with('/') || path.contains("..") {
        return Vec::new();
    }
    let rel = path.trim_start_matches('/');
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.join(rel)];
    }
    let Ok(hier) = std::fs::read_dir(base) else { return Vec::new() };
    hier.flatten().map(|h| h.path().join(rel)).filter(|d| d.join("cgroup.procs").is_file()).collect()
}

/// SIGKILLs every process in cgroup `path` (thawing a frozen one so that
/// the kill lands), until it is empty or 2 s passed (containerd gives a
/// cleanup 5 s).
async fn kill_cgroup(path: &str) {
    let dirs = cgroup_dirs(path);
    if dirs.is_empty() {
        return;
    }
    for round in 0..100 {
        let mut pids = Vec::new();
        for d in &dirs {
            if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return;
        }
        if round == 0 {
            info!(cgroup = path, pids:? = pids; "cleanup: killing what is left in the cgroup");
        }
        for p in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::Signal::SIGKILL);
        }
        for d in &dirs {
            let _ = std::fs::write(d.join("freezer.state"), "THAWED");
            let _ = std::fs::write(d.join("cgroup.freeze"), "0");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    warn!(cgroup = path; "cleanup: processes are still left in the cgroup");
}

/// SIGKILLs every process tagged with the dead shim's id (its runc, CRIU
/// and lazy-pages children, which outlive it).
pub fn kill_tagged(shim: &str) {
    let needle = format!("{}={shim}", crate::reaper::TAG_ENV);
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else { return };
    for e in rd.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            warn!(pid = pid.as_str(), comm = comm.trim(); "cleanup: killing a process the dead shim left");
            if let Ok(p) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

impl Runtime {
    /// At the create of app container `id` of `identity`: the snapshot to
    /// restore it from, if the store has one. The first app container's
    /// create asks the store ([`identity::find_restorable`]) and records the
    /// answer; every container of the pod is restored from that same
    /// snapshot, each name once. The actor goes RESUMING (persisted, with
    /// the checkout lease) before the container is created.
    ///
    /// `clone_of` (`torpor.dev/restore-from`): when the actor has no
    /// snapshot of its own, it is restored from that one instead (a clone:
    /// from then on its own actor); its own snapshot wins when it has one.
    /// A source that does not exist fails the create, naming the annotation.
    pub(crate) async fn adopt_kept(&self, id: &str, identity: &Identity, clone_of: Option<&RestoreSource>) -> Result<Option<Adopted>> {
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return Ok(None) };
        if rec.actor != identity.actor {
            return Ok(None);
        }
        if !rec.restore_checked {
            if rec.state != Lifecycle::Running || rec.generation > 0 {
                return Ok(None);
            }
            let found = async {
                let snaps = SnapshotStore::connect().await?;
                identity::find_restorable(&snaps, identity, clone_of).await
            }
            .await
            .map_err(|e| match e {
                e @ Error::InvalidAnnotation { .. } => e, // a restore-from naming nothing
                e => with_context(e, &format!("create of {identity}: looking up its snapshot in the store")),
            })?;
            rec.restore_checked = true;
            rec.cloned_from = found.as_ref().filter(|s| s.actor != rec.actor).map(|s| s.to_string());
            rec.restore_snapshot = found;
            store.save(rec)?;
        }
        let Some(snap) = rec.restore_snapshot.clone() else { return Ok(None) };
        if rec.restored_names.contains(&identity.container) || !matches!(rec.state, Lifecycle::Running | Lifecycle::Resuming) {
            return Ok(None);
        }
        let cloning = rec.cloned_from.is_some();
        let co = match checkout(&snap).await {
            Ok(co) => co,
            Err(e) => {
                // Asked again by the next create; never started from bad data.
                rec.restore_checked = false;
                rec.restore_snapshot = None;
                rec.cloned_from = None;
                let e = match (e, clone_of) {
                    (Error::NotFound(m), Some(src)) if cloning => Error::InvalidAnnotation {
                        key: crate::spec::RESTORE_FROM.into(),
                        value: src.to_string(),
                        reason: format!("the snapshot store has no snapshot {snap}: {m}"),
                    },
                    (e, _) => with_context(e, &format!("restore of {identity} from snapshot {snap}")),
                };
                rec.last_error = Some(e.to_string());
                store.save(rec)?;
                return Err(e);
            }
        };
        let image = co.path.join(&identity.container);
        if !image.join("inventory.img").is_file() {
            release_checkout(&co).await;
            if let (true, Some(src)) = (cloning, clone_of) {
                // A clone is made of the same containers as its source: a
                // name it lacks is a mistake, not a sidecar to start cold.
                let held = identity::image_names(&co.path);
                return Err(Error::InvalidAnnotation {
                    key: crate::spec::RESTORE_FROM.into(),
                    value: src.to_string(),
                    reason: format!(
                        "snapshot {snap} holds no image of container {:?} (it holds {}): a clone's containers must have the names of its source's",
                        identity.container,
                        if held.is_empty() { "none".to_string() } else { held.join(", ") }
                    ),
                });
            }
            info!(actor = rec.actor.as_str(), container = id, snapshot:% = snap; "the snapshot holds no image of {identity}: starting it cold");
            return Ok(None);
        }
        let before = rec.clone();
        if rec.state == Lifecycle::Running {
            rec.state = Lifecycle::Resuming;
            rec.recovered_from = Some(snap.to_string());
        }
        rec.leases.push(co.lease.clone());
        if !rec.containers.iter().any(|c| c == id) {
            rec.containers.push(id.to_string());
        }
        if let Err(e) = store.save(rec) {
            *rec = before;
            release_checkout(&co).await;
            return Err(e);
        }
        if cloning {
            info!(actor = rec.actor.as_str(), container = id, snapshot:% = snap; "cloning {identity} from snapshot {snap} (torpor.dev/restore-from)");
        } else {
            info!(actor = rec.actor.as_str(), container = id, snapshot:% = snap; "restoring {identity} from its snapshot in the store");
        }
        Ok(Some(Adopted { identity: identity.clone(), snapshot: snap, checkout: co, image }))
    }

    /// The container restored by identity runs: its checkout is released,
    /// the dead shims' records of the actor are superseded, and the actor
    /// is RUNNING once no other container waits for its restore.
    pub(crate) async fn recovered(&self, id: &str, adopted: &Adopted, pending: bool, ms: u64) -> Result<()> {
        release_checkout(&adopted.checkout).await;
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return Ok(()) };
        rec.restored_names.insert(adopted.identity.container.clone());
        rec.leases.retain(|l| *l != adopted.checkout.lease);
        if !pending {
            rec.state = Lifecycle::Running;
            rec.last_error = None;
            rec.last_resume_ms = Some(ms);
        }
        store.save(rec)?;
        let gone = identity::supersede(&self.state_root, &rec.actor);
        info!(actor = rec.actor.as_str(), container = id, from:% = adopted.snapshot, ms, superseded:? = gone; "{} restored from its snapshot", adopted.identity);
        Ok(())
    }

    /// The restore by identity did not happen (it failed, or the container
    /// was deleted before its start): the checkout is released; the
    /// snapshot stays in the store, and the next create of that name tries
    /// again.
    pub(crate) async fn give_back(&self, id: &str, adopted: &Adopted, pending: bool, why: &Error) {
        warn!(container = id, snapshot:% = adopted.snapshot; "{} not restored: {why}", adopted.identity);
        release_checkout(&adopted.checkout).await;
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return };
        rec.containers.retain(|c| c != id);
        rec.leases.retain(|l| *l != adopted.checkout.lease);
        if !pending && rec.state == Lifecycle::Resuming {
            rec.state = Lifecycle::Running;
            rec.recovered_from = None;
            rec.committed_at_ms = None;
        }
        rec.last_error = Some(format!("restore of {} from snapshot {} failed: {why}", adopted.identity, adopted.snapshot));
        if let Err(e) = store.save(rec) {
            warn!("save actor record: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        std::env::set_var(torpor_api::STORE_SOCKET_ENV, root.path().join("no-store.sock"));
        let s = Store::new(root.path(), "k").unwrap();
        let staging = crate::actor::StagingRecord { id: "st".into(), path: root.path().join("st") };
        let snap = SnapshotRef { actor: "ns/pod".into(), generation: 4 };

        for state in [Lifecycle::Running, Lifecycle::Frozen] {
            s.save(&record(state)).unwrap();
            settle(&s, record(state)).await;
            assert!(!s.dir().exists(), "{state}: removed");
        }

        // A suspend cut before every dump completed: nothing is kept.
        let mut r = record(Lifecycle::Suspending);
        r.staging = Some(staging.clone());
        s.save(&r).unwrap();
        settle(&s, r).await;
        assert!(!s.dir().exists(), "partial suspend removed");

        // Dumps complete, commit not done, and the store unreachable: the
        // record stays, saying so.
        let mut r = record(Lifecycle::Suspended);
        r.staging = Some(staging.clone());
        r.leases = vec!["l1".into()];
        s.save(&r).unwrap();
        settle(&s, r).await;
        let kept = s.load().unwrap().unwrap();
        assert!(kept.orphaned && kept.snapshot.is_none() && kept.leases.is_empty());
        assert!(kept.last_error.unwrap().contains("commit by the cleanup failed"));
        s.remove().unwrap();

        for state in [Lifecycle::Suspended, Lifecycle::Resuming] {
            let mut r = record(state);
            r.snapshot = Some(snap.clone());
            s.save(&r).unwrap();
            settle(&s, r).await;
            let kept = s.load().unwrap().unwrap();
            assert_eq!(kept.state, state);
            assert!(kept.orphaned, "{state}: kept");
            assert_eq!(kept.snapshot.as_ref(), Some(&snap));
            s.remove().unwrap();

            // ... but not without a snapshot.
            let r = record(state);
            s.save(&r).unwrap();
            settle(&s, r).await;
            assert!(!s.dir().exists(), "{state} without a snapshot: removed");
        }
    }

    #[test]
    fn cgroup_paths_stay_under_the_hierarchies() {
        assert!(cgroup_dirs("../etc").is_empty());
        assert!(cgroup_dirs("/a/../../etc").is_empty());
        assert!(cgroup_dirs("system.slice:cri:abc").is_empty());
    }
}
