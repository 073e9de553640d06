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
//! | RUNNING, FROZEN                 | removed: the containers died (as with runc-v2) |
//! | SUSPENDING, every dump marked done | committed as SUSPENDED, kept          |
//! | SUSPENDING, a dump missing      | removed: nothing committed to restore    |
//! | SUSPENDED, RESUMING             | kept (its checkpoint is complete)        |
//!
//! A kept record is marked `orphaned`: it is restorable by identity.
//!
//! **The way back**: when an app container is created whose
//! [`Identity`] matches a kept checkpoint, [`Runtime::adopt_kept`] moves the
//! checkpoint into the new shim's store (RESUMING persisted first), and the
//! container's start restores it instead of starting cold. Only once it runs
//! are the dead shim's records of that identity removed
//! ([`Runtime::recovered`]); a restore that fails gives the checkpoint back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use log::{info, warn};

use crate::actor::{Lifecycle, Record, Store};
use crate::container::Runtime;
use crate::error::{Error, Result};
use crate::identity::{self, Identity, Kept};
use crate::runc::Runc;

/// A container being restored from a kept checkpoint (between its create
/// and its start).
#[derive(Debug, Clone)]
pub struct Adopted {
    pub identity: Identity,
    pub kept: Kept,
    /// Where the image is now (in this shim's store).
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
    settle(&store, rec);
}

/// Decides what is kept of a dead shim's actor (see the module doc).
fn settle(store: &Store, mut rec: Record) {
    let dir = store.dir();
    let members: Vec<String> = rec.containers.clone();
    let complete = !members.is_empty() && members.iter().all(|c| store.is_dumped(rec.generation, c));
    let keep = match rec.state {
        Lifecycle::Running | Lifecycle::Frozen => {
            info!(actor = rec.actor.as_str(), state:% = rec.state; "the shim died with the actor {}: its containers were killed, nothing to keep", rec.state);
            false
        }
        Lifecycle::Suspending if complete => {
            rec.state = Lifecycle::Suspended;
            rec.committed_at_ms = Some(crate::actor::now_ms());
            rec.last_error = Some("the shim died after the dump, before the suspend was recorded: committed by the cleanup".into());
            warn!(actor = rec.actor.as_str(), generation = rec.generation; "the shim died during a suspend, after every dump completed: the suspend is committed, the checkpoint kept in {dir:?}");
            true
        }
        Lifecycle::Suspending => {
            warn!(actor = rec.actor.as_str(), generation = rec.generation; "the shim died during a suspend, before every dump completed: no checkpoint to keep, the actor's containers were killed");
            false
        }
        Lifecycle::Suspended | Lifecycle::Resuming => {
            let images = !members.is_empty()
                && members.iter().all(|c| store.image_dir(rec.generation, c).join("inventory.img").is_file());
            if images {
                warn!(actor = rec.actor.as_str(), generation = rec.generation, state:% = rec.state; "the shim died with the actor {}: its checkpoint is kept in {dir:?}, restorable by its identity", rec.state);
            } else {
                warn!(actor = rec.actor.as_str(), generation = rec.generation, state:% = rec.state; "the shim died with the actor {}, but its checkpoint is incomplete: nothing to keep", rec.state);
            }
            images
        }
    };
    if !keep {
        if let Err(e) = store.remove() {
            warn!("remove actor state: {e}");
        }
        return;
    }
    rec.orphaned = true;
    if let Err(e) = store.save(&rec) {
        warn!(actor = rec.actor.as_str(); "cannot mark the kept checkpoint restorable: {e}");
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
    /// At the create of app container `id` of `identity`: takes the newest
    /// kept checkpoint of that identity, if there is one, for the start to
    /// restore. The actor goes RESUMING (persisted before the checkpoint is
    /// moved into its store).
    pub(crate) async fn adopt_kept(&self, id: &str, identity: &Identity) -> Result<Option<Adopted>> {
        let Some(kept) = identity::find_restorable(&self.state_root, identity)? else { return Ok(None) };
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return Ok(None) };
        let joining = rec.state == Lifecycle::Resuming && rec.recovered_from.is_some();
        if rec.state != Lifecycle::Running && !joining {
            warn!(actor = rec.actor.as_str(), container = id; "a kept checkpoint of {identity} exists, but the actor is {}: starting cold", rec.state);
            return Ok(None);
        }
        let before = rec.clone();
        if !joining {
            rec.generation += 1;
            rec.state = Lifecycle::Resuming;
            rec.recovered_from = Some(kept.source());
            rec.committed_at_ms = Some(kept.committed_at_ms);
        }
        if !rec.containers.iter().any(|c| c == id) {
            rec.containers.push(id.to_string());
        }
        store.save(rec)?;
        let image = store.image_dir(rec.generation, id);
        match identity::claim(&kept, &image) {
            Ok(true) => {
                info!(actor = rec.actor.as_str(), container = id, from = kept.source().as_str(); "restoring {identity} from the checkpoint its dead shim kept");
                Ok(Some(Adopted { identity: identity.clone(), kept, image }))
            }
            Ok(false) => {
                warn!(actor = rec.actor.as_str(), container = id; "the kept checkpoint of {identity} was taken by another container: starting cold");
                *rec = before;
                store.save(rec)?;
                Ok(None)
            }
            Err(e) => {
                *rec = before;
                let _ = store.save(rec);
                Err(e)
            }
        }
    }

    /// The container restored from a kept checkpoint runs: the checkpoint
    /// is consumed, the dead shims' records of the identity are superseded,
    /// and the actor is RUNNING once no other container waits for its
    /// restore.
    pub(crate) async fn recovered(&self, id: &str, adopted: &Adopted, pending: bool, ms: u64) -> Result<()> {
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return Ok(()) };
        if !pending {
            rec.state = Lifecycle::Running;
            rec.last_error = None;
            rec.last_resume_ms = Some(ms);
            store.save(rec)?;
        }
        let _ = std::fs::remove_dir_all(&adopted.image);
        if !pending {
            let _ = std::fs::remove_dir_all(store.generation_dir(rec.generation));
        }
        let gone = identity::supersede(&self.state_root, &adopted.identity);
        // The store it came from holds nothing else of this identity now.
        let src = &adopted.kept.store;
        if src.dir().exists() && !has_images(src) {
            let _ = src.remove();
        }
        info!(actor = rec.actor.as_str(), container = id, from = adopted.kept.source().as_str(), ms, superseded:? = gone; "{} recovered from the checkpoint its dead shim kept", adopted.identity);
        Ok(())
    }

    /// The restore from a kept checkpoint did not happen (it failed, or the
    /// container was deleted before its start): the checkpoint goes back to
    /// where it was kept, restorable again.
    pub(crate) async fn give_back(&self, id: &str, adopted: &Adopted, pending: bool, why: &Error) {
        match identity::release(&adopted.kept, &adopted.image) {
            Ok(true) => warn!(container = id, to = adopted.kept.source().as_str(); "{} not restored ({why}): the kept checkpoint is restorable again", adopted.identity),
            Ok(false) => warn!(container = id; "{} not restored ({why}), and its checkpoint is gone", adopted.identity),
            Err(e) => warn!(container = id; "{} not restored ({why}); giving its checkpoint back failed: {e}", adopted.identity),
        }
        let mut slot = self.actor.lock().await;
        let Some((store, rec)) = slot.as_mut() else { return };
        rec.containers.retain(|c| c != id);
        if !pending {
            let _ = std::fs::remove_dir_all(store.generation_dir(rec.generation));
            rec.state = Lifecycle::Running;
            rec.recovered_from = None;
            rec.committed_at_ms = None;
            rec.last_error = Some(format!("restore of {} from a kept checkpoint failed: {why}", adopted.identity));
        }
        if let Err(e) = store.save(rec) {
            warn!("save actor record: {e}");
        }
    }
}

/// Whether any generation directory of `store` still holds a CRIU image.
fn has_images(store: &Store) -> bool {
    let Ok(gens) = std::fs::read_dir(store.dir()) else { return false };
    gens.flatten()
        .filter(|g| g.file_name().to_string_lossy().starts_with("gen-"))
        .any(|g| {
            std::fs::read_dir(g.path())
                .is_ok_and(|mut it| it.any(|e| e.is_ok_and(|e| e.path().join("inventory.img").is_file())))
        })
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

    fn image(store: &Store, gen: u64, c: &str) {
        std::fs::create_dir_all(store.image_dir(gen, c)).unwrap();
        std::fs::write(store.image_dir(gen, c).join("inventory.img"), b"x").unwrap();
    }

    #[test]
    fn what_is_kept_after_a_shim_died() {
        let root = tempfile::tempdir().unwrap();
        let s = Store::new(root.path(), "k").unwrap();

        for state in [Lifecycle::Running, Lifecycle::Frozen] {
            s.save(&record(state)).unwrap();
            settle(&s, record(state));
            assert!(!s.dir().exists(), "{state}: removed");
        }

        // A suspend cut before every dump completed: nothing is kept.
        let r = record(Lifecycle::Suspending);
        s.save(&r).unwrap();
        image(&s, 1, "c1");
        settle(&s, r);
        assert!(!s.dir().exists(), "partial suspend removed");

        // A suspend whose dumps all completed is committed.
        let r = record(Lifecycle::Suspending);
        s.save(&r).unwrap();
        image(&s, 1, "c1");
        s.mark_dumped(1, "c1").unwrap();
        settle(&s, r);
        let kept = s.load().unwrap().unwrap();
        assert_eq!(kept.state, Lifecycle::Suspended);
        assert!(kept.orphaned && kept.committed_at_ms.is_some());
        s.remove().unwrap();

        for state in [Lifecycle::Suspended, Lifecycle::Resuming] {
            let r = record(state);
            s.save(&r).unwrap();
            image(&s, 1, "c1");
            settle(&s, r);
            let kept = s.load().unwrap().unwrap();
            assert_eq!(kept.state, state);
            assert!(kept.orphaned, "{state}: kept");
            s.remove().unwrap();

            // ... but not without its image.
            let r = record(state);
            s.save(&r).unwrap();
            settle(&s, r);
            assert!(!s.dir().exists(), "{state} without an image: removed");
        }
    }

    #[test]
    fn cgroup_paths_stay_under_the_hierarchies() {
        assert!(cgroup_dirs("../etc").is_empty());
        assert!(cgroup_dirs("/a/../../etc").is_empty());
        assert!(cgroup_dirs("system.slice:cri:abc").is_empty());
    }
}
