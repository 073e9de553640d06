//! The way back into a new pod: when the first app container of a pod of
//! an actor is created, [`Actor::adopt`] asks the store for the actor's
//! newest snapshot (or, for a clone, the one `torpor.dev/restore-from`
//! names); each container whose name it holds is restored from it at
//! start (RESUMING persisted first) instead of starting cold, with the
//! rootfs changes the snapshot carries applied first, with lazy pages like
//! a resume (the checkout is kept until its daemons copied all the
//! memory; a container made from containerd's own checkpoint is restored
//! in full, as runc-v2 does). Once it runs, the dead shims' records of the
//! actor are removed ([`Actor::recovered`]); a restore that fails leaves
//! the snapshot in the store ([`Actor::give_back`]).

use std::path::Path;

use tracing::{info, warn};

use crate::actor::identity::{self, Identity};
use crate::actor::record::Lifecycle;
use crate::actor::report::{self, Op};
use crate::error::{Error, Result, StoreErrorKind};
use crate::lifecycle::restore::{image_name, PageSource};
use crate::lifecycle::state::Adopted;
use crate::lifecycle::timing::Timing;
use crate::lifecycle::{lock, Actor};
use crate::oci::annotations::{RestoreSource, RESTORE_FROM};
use crate::oci::bundle;
use crate::system::rootfs;
use crate::system::runc::RestoreFrom;
use crate::task::tasks::criu_work;
use crate::task::ExitHold;

impl Actor {
    /// A restore by identity that cannot use its snapshot (`e`): the next
    /// create asks the store again; nothing is started from bad data.
    /// Returns `e` to fail the create with, once the record says so.
    fn restore_refused(&self, e: Error) -> Result<Error> {
        self.update(|r| {
            r.restore_checked = false;
            r.restore_snapshot = None;
            r.cloned_from = None;
            r.last_error = Some(e.to_string());
        })?;
        Ok(e)
    }

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
    pub async fn adopt(&self, id: &str, identity: &Identity, clone_of: Option<&RestoreSource>) -> Result<Option<Adopted>> {
        let _gate = self.gate.lock().await;
        let Some(rec) = self.record() else { return Ok(None) };
        if rec.actor != identity.actor {
            return Ok(None);
        }
        let mut snap = rec.restore_snapshot.clone();
        if !rec.restore_checked {
            if rec.state != Lifecycle::Running || rec.generation > 0 {
                return Ok(None);
            }
            let found = identity::find_restorable(&*self.store, identity, clone_of).await.map_err(|e| match e {
                e @ Error::InvalidAnnotation { .. } => e, // a restore-from naming nothing
                e => e.context(&format!("create of {identity}: looking up its snapshot in the store")),
            })?;
            self.update(|r| {
                r.restore_checked = true;
                r.cloned_from = found.as_ref().filter(|s| s.actor != r.actor).map(|s| s.to_string());
                r.restore_snapshot = found.clone();
            })?;
            snap = found;
        }
        let Some(snap) = snap else { return Ok(None) };
        let rec = self.record().ok_or_else(super::no_actor)?;
        if rec.restored_names.contains(&identity.container) || !matches!(rec.state, Lifecycle::Running | Lifecycle::Resuming) {
            return Ok(None);
        }
        let cloning = rec.cloned_from.is_some();
        let co = if self.config.lazy_pages { self.store.checkout_streamed(&snap).await } else { self.store.checkout(&snap).await };
        let co = match co {
            Ok(co) => co,
            Err(e) => {
                // Asked again by the next create; never started from bad data.
                let e = match (e, clone_of) {
                    (e, Some(src)) if cloning && e.is_store(StoreErrorKind::NotFound) => Error::InvalidAnnotation {
                        key: RESTORE_FROM.into(),
                        value: src.to_string(),
                        reason: format!("the snapshot store has no snapshot {snap}: {e}"),
                    },
                    (e, _) => e.context(&format!("restore of {identity} from snapshot {snap}")),
                };
                return Err(self.restore_refused(e)?);
            }
        };
        if let Err(e) = super::verify_seal(&co.path, &rec.actor, &format!("snapshot {snap}")).await {
            self.store.release_logged(&co.lease).await;
            return Err(self.restore_refused(e.context(&format!("restore of {identity} from snapshot {snap}")))?);
        }
        let image = co.path.join(&identity.container);
        if !image.join("inventory.img").is_file() {
            self.store.release_logged(&co.lease).await;
            if let (true, Some(src)) = (cloning, clone_of) {
                // A clone is made of the same containers as its source: a
                // name it lacks is a mistake, not a sidecar to start cold.
                let held = identity::image_names(&co.path);
                return Err(Error::InvalidAnnotation {
                    key: RESTORE_FROM.into(),
                    value: src.to_string(),
                    reason: format!(
                        "snapshot {snap} holds no image of container {:?} (it holds {}): a clone's containers must have the names of its source's",
                        identity.container,
                        if held.is_empty() { "none".to_string() } else { held.join(", ") }
                    ),
                });
            }
            info!(actor = rec.actor.as_str(), container = id, snapshot = %snap, "the snapshot holds no image of {identity}: starting it cold");
            return Ok(None);
        }
        let saved = self.update(|r| {
            if r.state == Lifecycle::Running {
                r.state = Lifecycle::Resuming;
                r.recovered_from = Some(snap.to_string());
            }
            r.leases.push(co.lease.clone());
            if !r.containers.iter().any(|c| c == id) {
                r.containers.push(id.to_string());
            }
        });
        if let Err(e) = saved {
            // Back to what it was: nothing of this adoption is kept.
            let _ = self.update(|r| {
                *r = rec.clone();
            });
            self.store.release_logged(&co.lease).await;
            return Err(e);
        }
        if cloning {
            info!(actor = rec.actor.as_str(), container = id, snapshot = %snap, "cloning {identity} from snapshot {snap} (torpor.dev/restore-from)");
        } else {
            info!(actor = rec.actor.as_str(), container = id, snapshot = %snap, "restoring {identity} from its snapshot in the store");
        }
        Ok(Some(Adopted { identity: identity.clone(), snapshot: snap, checkout: co, image }))
    }

    /// Keeps `adopted` for container `id` until its Start restores it.
    pub fn hold_adoption(&self, id: &str, adopted: Adopted) {
        lock(&self.adoptions).insert(id.to_string(), adopted);
    }

    /// Whether a container still waits to be restored from a kept snapshot.
    fn adoptions_pending(&self) -> bool {
        !lock(&self.adoptions).is_empty()
    }

    /// Start of container `id`, created to be restored from `image`: a
    /// restore (with the adoption's bookkeeping if it was restored by
    /// identity), instead of `runc start`.
    pub async fn start_restored(&self, id: &str, image: &Path, bundle_dir: &Path) -> Result<i32> {
        report::operation(&self.store, Op::Restore, || self.record(), self.start_restored_unreported(id, image, bundle_dir)).await
    }

    async fn start_restored_unreported(&self, id: &str, image: &Path, bundle_dir: &Path) -> Result<i32> {
        let adopted = lock(&self.adoptions).remove(id);
        let started = std::time::Instant::now();
        // From a streamed checkout: its memory is served while it arrives.
        let hold = adopted.as_ref().is_some_and(|a| a.checkout.page_server.is_some()).then(ExitHold::default);
        let streamed = adopted.as_ref().and_then(|a| {
            a.checkout.page_server.as_deref().zip(hold.as_ref()).map(|(socket, hold)| PageSource { socket, lease: &a.checkout.lease, hold })
        });
        let work = criu_work(bundle_dir);
        // The pid, and whether a lazy-pages daemon goes on reading the checkout.
        let restored = match self.link_fds_of_image(id, image) {
            Err(e) => Err(e),
            Ok(inherit) => match (streamed, &adopted) {
                (Some(pages), _) => self.restore_streamed(id, image, &work.join("lazy"), pages, inherit).await.map(|pid| (pid, false)),
                // A checkout of the store, pinned by its lease until the
                // daemon is done with it.
                (None, Some(_)) => self.restore_from_disk(id, image, &work.join("lazy"), &work, inherit, &mut Timing::start()).await,
                // containerd's checkpoint directory (`ctr c restore`): not
                // ours to keep, so read whole before the start returns, as
                // runc-v2 does.
                (None, None) => {
                    let from = RestoreFrom { image: image.to_path_buf(), work, lazy: false, lazy_daemon: None, inherit };
                    self.tasks.restore(id, &from).await.map(|pid| (pid, false))
                }
            },
        };
        let served_lazily = matches!(restored, Ok((_, true)));
        let restored = restored.map(|(pid, _)| pid);
        if let (Ok(_), Ok(name)) = (&restored, image_name(image)) {
            self.links_restored(name);
        }
        report::phase("criu_restore");
        if let Some(a) = adopted {
            if let Err(e) = bundle::recovery_criu_config(bundle_dir, false) {
                warn!(container = id, "CRIU configuration after the restore: {e}");
            }
            let pending = self.adoptions_pending();
            match &restored {
                Ok(_) => {
                    let ms = started.elapsed().as_millis() as u64;
                    if let Err(e) = self.recovered(id, &a, pending, ms, hold, served_lazily).await {
                        warn!(container = id, "restored from a kept checkpoint, but the record could not be saved: {e}");
                    }
                }
                Err(e) => self.give_back(id, &a, pending, e).await,
            }
        }
        if restored.is_ok() {
            self.ran(id);
        }
        restored
    }

    /// Container `id` was deleted before its start: a kept checkpoint it
    /// was to be restored from goes back.
    pub async fn deleted(&self, id: &str) {
        let adopted = lock(&self.adoptions).remove(id);
        if let Some(a) = adopted {
            let pending = self.adoptions_pending();
            let why = Error::FailedPrecondition(format!("container {id} was deleted before its start"));
            self.give_back(id, &a, pending, &why).await;
        }
    }

    /// The container restored by identity runs: its checkout is released,
    /// the dead shims' records of the actor are superseded, and the actor
    /// is RUNNING once no other container waits for its restore.
    /// `hold` is the streamed restore's (see [`PageSource::hold`]);
    /// `served_lazily`: a lazy-pages daemon still reads the checkout, which
    /// is released once it is done.
    pub(crate) async fn recovered(
        &self,
        id: &str,
        adopted: &Adopted,
        pending: bool,
        ms: u64,
        hold: Option<ExitHold>,
        served_lazily: bool,
    ) -> Result<()> {
        let streamed = hold.is_some();
        let release_now = !streamed && !served_lazily;
        if release_now {
            self.store.release_logged(&adopted.checkout.lease).await;
        }
        let Some(actor) = self.update_if(|rec| {
            rec.restored_names.insert(adopted.identity.container.clone());
            if release_now {
                rec.leases.retain(|l| *l != adopted.checkout.lease);
            }
            if !pending {
                rec.state = Lifecycle::Running;
                rec.last_error = None;
                rec.last_resume_ms = Some(ms);
            }
            Some(rec.actor.clone())
        })?
        else {
            return Ok(());
        };
        if !release_now {
            // Released once its memory is all here (or its stream failed).
            self.release_when_served(adopted.checkout.lease.clone(), hold);
        }
        let gone = identity::supersede(&self.config.state_root, &actor);
        info!(actor = actor.as_str(), container = id, from = %adopted.snapshot, ms, superseded = ?gone, "{} restored from its snapshot", adopted.identity);
        Ok(())
    }

    /// The restore by identity did not happen (it failed, or the container
    /// was deleted before its start): the checkout is released; the
    /// snapshot stays in the store, and the next create of that name tries
    /// again.
    pub async fn give_back(&self, id: &str, adopted: &Adopted, pending: bool, why: &Error) {
        warn!(container = id, snapshot = %adopted.snapshot, "{} not restored: {why}", adopted.identity);
        self.store.release_logged(&adopted.checkout.lease).await;
        let r = self.update_if(|rec| {
            rec.containers.retain(|c| c != id);
            rec.leases.retain(|l| *l != adopted.checkout.lease);
            if !pending && rec.state == Lifecycle::Resuming {
                rec.state = Lifecycle::Running;
                rec.recovered_from = None;
                rec.committed_at_ms = None;
            }
            rec.last_error = Some(format!("restore of {} from snapshot {} failed: {why}", adopted.identity, adopted.snapshot));
            Some(())
        });
        if let Err(e) = r {
            warn!("save actor record: {e}");
        }
    }
}

/// Applies the rootfs changes a kept checkpoint carries (snapshots written
/// before torpor carried them have none) to the new container's mounted
/// rootfs, before its processes are restored.
pub async fn apply_rootfs_diff(bundle: &Path, a: &Adopted) -> Result<()> {
    let diff = a.image.join(rootfs::DIFF_FILE);
    if !diff.is_file() {
        info!(snapshot = %a.snapshot, container = a.identity.container.as_str(), "the snapshot carries no rootfs changes");
        return Ok(());
    }
    let root = bundle.join("rootfs");
    let started = std::time::Instant::now();
    let applied = tokio::task::spawn_blocking(move || rootfs::apply(&diff, &root))
        .await
        .map_err(|e| Error::Io { context: "apply a rootfs diff".into(), source: std::io::Error::other(e) })?
        .map_err(|e| e.context(&format!("restore of {} from snapshot {}: its rootfs changes", a.identity, a.snapshot)))?;
    info!(snapshot = %a.snapshot, container = a.identity.container.as_str(), entries = applied.entries,
        bytes = applied.bytes, deletions = applied.deletions, ms = started.elapsed().as_millis() as u64, "rootfs changes applied");
    Ok(())
}
