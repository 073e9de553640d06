//! The lifecycle's operations against stubs of its two edges (the
//! containers, [`Containers`], and the snapshot store, [`Snapshots`]): no
//! root, no runc, no CRIU, no store daemon. The stubs keep what a real
//! edge would (which container is paused, dumped, restored; which stagings,
//! snapshots and leases exist) and fail a step on demand; each test drives
//! an operation and checks the record, the containers and the store after
//! it. The dumps are real directories (sealed and verified as a real
//! suspend's are).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use torpor_api::store as api;

use super::{lock, Actor, Config};
use crate::actor::identity::Identity;
use crate::actor::record::{Lifecycle, Record, StagingRecord, Store};
use crate::actor::report::Trigger;
use crate::actor::snapshots::Snapshots;
use crate::actor::store_client::{Checkout, Grant, SnapshotRef, Staging, StreamDone};
use crate::error::{Error, Result, StoreErrorKind};
use crate::oci::annotations::{ActorSpec, OnRestoreFailure};
use crate::system::runc::{CheckpointOpts, RestoreFrom};
use crate::task::{AppInfo, Containers, ExitHold, Status};

const ACTOR: &str = "ns/a";

/// One stub app container.
struct Stub {
    status: Status,
    suspended: bool,
    spec: ActorSpec,
}

/// The containers' edge: a table of [`Stub`]s, the calls made, and the
/// calls to fail (`"dump:c2"`: the dump of `c2`).
#[derive(Default)]
pub(crate) struct StubContainers {
    table: Mutex<BTreeMap<String, Stub>>,
    fail: Mutex<HashSet<String>>,
    calls: Mutex<Vec<String>>,
    /// The image directories restores read from.
    restored_from: Mutex<Vec<PathBuf>>,
    /// How long a restore or a thaw (runc resume) takes.
    takes: Mutex<Duration>,
}

impl StubContainers {
    fn with(ids: &[&str], spec: &ActorSpec) -> Arc<StubContainers> {
        let s = StubContainers::default();
        for id in ids {
            lock(&s.table).insert(id.to_string(), Stub { status: Status::Running, suspended: false, spec: spec.clone() });
        }
        Arc::new(s)
    }

    /// Records `op` on `id`, failing it when asked to.
    fn call(&self, op: &str, id: &str) -> Result<()> {
        let call = format!("{op}:{id}");
        lock(&self.calls).push(call.clone());
        if lock(&self.fail).contains(&call) {
            return Err(Error::FailedPrecondition(format!("stub: {call} fails")));
        }
        Ok(())
    }

    fn fail(&self, call: &str) {
        lock(&self.fail).insert(call.to_string());
    }

    fn calls(&self, op: &str) -> Vec<String> {
        lock(&self.calls).iter().filter(|c| c.starts_with(&format!("{op}:"))).cloned().collect()
    }

    fn set(&self, id: &str, f: impl FnOnce(&mut Stub)) {
        if let Some(s) = lock(&self.table).get_mut(id) {
            f(s);
        }
    }

    fn status_of(&self, id: &str) -> (Status, bool) {
        let t = lock(&self.table);
        let s = &t[id];
        (s.status, s.suspended)
    }
}

#[async_trait]
impl Containers for StubContainers {
    fn app_containers(&self) -> Vec<String> {
        lock(&self.table).keys().cloned().collect()
    }
    fn has_app_containers(&self) -> bool {
        !lock(&self.table).is_empty()
    }
    fn app_info(&self, id: &str) -> Result<AppInfo> {
        let t = lock(&self.table);
        let s = t.get(id).ok_or_else(|| Error::NotFound(format!("container {id}")))?;
        // This test process stands in for the container's init (its
        // /proc is what a dump reads).
        let pid = if s.suspended { 0 } else { std::process::id() as i32 };
        Ok(AppInfo { pid, netns: None, actor: s.spec.clone(), terminal: false, rootfs_upper: None })
    }
    fn app_pids(&self) -> Vec<i32> {
        Vec::new()
    }
    fn idle_after(&self) -> Option<Duration> {
        None
    }
    fn status(&self, id: &str) -> Option<Status> {
        lock(&self.table).get(id).map(|s| s.status)
    }
    fn is_suspended(&self, id: &str) -> bool {
        lock(&self.table).get(id).is_some_and(|s| s.suspended)
    }
    fn has_live_execs(&self, _id: &str) -> Result<bool> {
        Ok(false)
    }
    fn takes_criu_options(&self, _id: &str) -> bool {
        true
    }
    fn fresh_tmpfs_mounts(&self, _id: &str) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    fn suspends_on_stop(&self, id: &str) -> bool {
        lock(&self.table).get(id).is_some_and(|s| s.spec.suspend_on_stop)
    }
    fn hold_init_exit(&self, _id: &str, _hold: &ExitHold) -> Result<()> {
        Ok(())
    }
    async fn pause(&self, id: &str) -> Result<()> {
        self.call("pause", id)?;
        self.set(id, |s| s.status = Status::Paused);
        Ok(())
    }
    async fn resume(&self, id: &str) -> Result<()> {
        self.call("resume", id)?;
        let takes = *lock(&self.takes);
        tokio::time::sleep(takes).await;
        self.set(id, |s| s.status = Status::Running);
        Ok(())
    }
    async fn resume_by(&self, id: &str, thaw: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()> {
        thaw()?;
        self.resume(id).await
    }
    async fn dump(&self, id: &str, opts: &CheckpointOpts) -> Result<()> {
        self.call("dump", id)?;
        // What CRIU leaves: an image directory with its inventory.
        std::fs::write(opts.image_path.join("inventory.img"), id).map_err(|e| Error::Io { context: "stub dump".into(), source: e })?;
        // To containerd it stays RUNNING, its processes gone.
        self.set(id, |s| {
            s.status = Status::Running;
            s.suspended = true;
        });
        Ok(())
    }
    async fn restore(&self, id: &str, from: &RestoreFrom) -> Result<i32> {
        self.call("restore", id)?;
        let takes = *lock(&self.takes);
        tokio::time::sleep(takes).await;
        lock(&self.restored_from).push(from.image.clone());
        self.set(id, |s| {
            s.status = Status::Running;
            s.suspended = false;
        });
        Ok(std::process::id() as i32)
    }
    async fn unrestore(&self, id: &str) -> Result<()> {
        self.call("unrestore", id)?;
        self.set(id, |s| s.suspended = true);
        Ok(())
    }
    async fn cold_start(&self, id: &str) -> Result<i32> {
        self.call("cold_start", id)?;
        self.set(id, |s| {
            s.status = Status::Running;
            s.suspended = false;
        });
        Ok(std::process::id() as i32)
    }
}

/// What the stub store holds.
#[derive(Default)]
struct Held {
    stagings: HashMap<String, PathBuf>,
    snapshots: Vec<(SnapshotRef, PathBuf)>,
    leases: HashSet<String>,
    aborted: Vec<String>,
    surrendered: Vec<String>,
    next: u64,
}

/// The store's edge: stagings are directories under `root`; a commit
/// keeps the staging's directory as the snapshot's.
pub(crate) struct StubStore {
    root: PathBuf,
    held: Mutex<Held>,
    /// Calls to fail: `begin_staging`, `commit`, `confirm`, `checkout`.
    fail: Mutex<HashSet<&'static str>>,
    /// How long a lease confirmation says the lease holds (the daemon's
    /// answer from memory can promise as little as a sixth of the TTL).
    validity: Mutex<Duration>,
    /// Lease confirmations answered.
    confirms: Mutex<usize>,
    /// Lifecycle reports received: (op, outcome, trigger).
    reports: Mutex<Vec<(String, String, String)>>,
}

impl StubStore {
    fn new(root: &Path) -> Arc<StubStore> {
        Arc::new(StubStore {
            root: root.to_path_buf(),
            held: Mutex::default(),
            fail: Mutex::default(),
            validity: Mutex::new(Duration::from_secs(60)),
            confirms: Mutex::default(),
            reports: Mutex::default(),
        })
    }

    fn fails(&self, call: &str) -> bool {
        lock(&self.fail).contains(call)
    }

    fn fail(&self, call: &'static str) {
        lock(&self.fail).insert(call);
    }

    fn heal(&self, call: &'static str) {
        lock(&self.fail).remove(call);
    }

    fn lease(&self) -> String {
        let mut h = lock(&self.held);
        h.next += 1;
        let l = format!("lease-{}", h.next);
        h.leases.insert(l.clone());
        l
    }

    fn leases(&self) -> usize {
        lock(&self.held).leases.len()
    }

    fn path_of(&self, snap: &SnapshotRef) -> Option<PathBuf> {
        lock(&self.held).snapshots.iter().find(|(s, _)| s == snap).map(|(_, p)| p.clone())
    }
}

#[async_trait]
impl Snapshots for StubStore {
    async fn acquire(&self, _actor: &str, _owner: &str) -> Result<Grant> {
        Ok(Grant { epoch: 1, previous_node: None })
    }
    async fn confirm_lease(&self, _actor: &str, _owner: &str) -> Result<Option<u64>> {
        // An answer comes over a socket from the node's daemon: later than
        // a timer that is already due (the lease fence's past deadline).
        tokio::time::sleep(Duration::from_millis(50)).await;
        if self.fails("confirm") {
            return Err(Error::store(StoreErrorKind::LeaseLost, "stub: node-b holds the lease"));
        }
        *lock(&self.confirms) += 1;
        Ok(Some(crate::actor::record::now_ms() + lock(&self.validity).as_millis() as u64))
    }
    async fn surrender_logged(&self, actor: &str, _owner: &str) {
        lock(&self.held).surrendered.push(actor.to_string());
    }
    async fn begin_staging(&self, _actor: &str) -> Result<Staging> {
        if self.fails("begin_staging") {
            return Err(Error::store(StoreErrorKind::Unavailable, "stub: no store"));
        }
        let mut h = lock(&self.held);
        h.next += 1;
        let id = format!("st-{}", h.next);
        let path = self.root.join(&id);
        std::fs::create_dir_all(&path).map_err(|e| Error::Io { context: "stub staging".into(), source: e })?;
        h.stagings.insert(id.clone(), path.clone());
        Ok(Staging { id, path })
    }
    async fn commit_staging(
        &self,
        actor: &str,
        staging: &Staging,
        _labels: HashMap<String, String>,
        _keep_local: Option<Duration>,
    ) -> Result<SnapshotRef> {
        if self.fails("commit") {
            return Err(Error::store(StoreErrorKind::Unavailable, "stub: the commit fails"));
        }
        let mut h = lock(&self.held);
        let path = h.stagings.remove(&staging.id).ok_or_else(|| Error::store(StoreErrorKind::NotFound, "stub: no such staging"))?;
        h.next += 1;
        let snap = SnapshotRef { actor: actor.to_string(), generation: h.next };
        h.snapshots.push((snap.clone(), path));
        Ok(snap)
    }
    async fn abort_logged(&self, staging: &Staging) {
        let mut h = lock(&self.held);
        h.stagings.remove(&staging.id);
        h.aborted.push(staging.id.clone());
    }
    async fn view_staging_as(&self, staging: &Staging, snap: &SnapshotRef) -> Result<Checkout> {
        let path =
            lock(&self.held).stagings.get(&staging.id).cloned().ok_or_else(|| Error::store(StoreErrorKind::NotFound, "stub: committed"))?;
        Ok(Checkout { snapshot: snap.clone(), path, lease: self.lease(), page_server: None })
    }
    async fn latest(&self, actor: &str) -> Result<Option<SnapshotRef>> {
        Ok(lock(&self.held).snapshots.iter().rev().find(|(s, _)| s.actor == actor).map(|(s, _)| s.clone()))
    }
    async fn checkout(&self, snap: &SnapshotRef) -> Result<Checkout> {
        if self.fails("checkout") {
            return Err(Error::store(StoreErrorKind::Unavailable, "stub: the object tier is unreachable"));
        }
        let path = self.path_of(snap).ok_or_else(|| Error::store(StoreErrorKind::NotFound, format!("stub: no snapshot {snap}")))?;
        Ok(Checkout { snapshot: snap.clone(), path, lease: self.lease(), page_server: None })
    }
    async fn checkout_streamed(&self, snap: &SnapshotRef) -> Result<Checkout> {
        self.checkout(snap).await
    }
    async fn wait_stream(&self, _lease: &str) -> Result<StreamDone> {
        Ok(StreamDone::default())
    }
    async fn release_logged(&self, lease: &str) {
        lock(&self.held).leases.remove(lease);
    }
    async fn remove_all_logged(&self, actor: &str) {
        lock(&self.held).snapshots.retain(|(s, _)| s.actor != actor);
    }
    async fn report_lifecycle(&self, report: &api::LifecycleReport) -> Result<()> {
        if !report.op.is_empty() {
            lock(&self.reports).push((report.op.clone(), report.outcome.clone(), report.trigger.clone()));
        }
        Ok(())
    }
}

/// An actor of app containers `ids` (named after their id) over the stubs,
/// its record set up as the first create does.
pub(crate) struct Rig {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) tasks: Arc<StubContainers>,
    pub(crate) store: Arc<StubStore>,
    pub(crate) actor: Actor,
    _wake: mpsc::UnboundedReceiver<()>,
}

async fn rig_with(ids: &[&str], spec: ActorSpec, store: Option<Arc<StubStore>>) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let tasks = StubContainers::with(ids, &spec);
    let store = store.unwrap_or_else(|| StubStore::new(&dir.path().join("store")));
    let config = Config { state_root: dir.path().join("state"), claim_dir: dir.path().join("claims"), lazy_pages: false };
    let (wake, wake_rx) = mpsc::unbounded_channel();
    let actor = Actor::new(tasks.clone(), store.clone(), config, wake);
    actor.init("shim-1", &spec, true).await.unwrap();
    for id in ids {
        actor.add_member(id, id, None).unwrap();
        actor.ran(id);
    }
    Rig { dir, tasks, store, actor, _wake: wake_rx }
}

pub(crate) async fn rig(ids: &[&str]) -> Rig {
    rig_with(ids, ActorSpec { actor: Some(ACTOR.into()), ..Default::default() }, None).await
}

impl Rig {
    pub(crate) fn rec(&self) -> Record {
        self.actor.record().unwrap()
    }

    /// Suspended, its snapshot committed; its next restore takes
    /// `restore_takes`, and the lease confirmations from now on say the
    /// lease holds for `validity`.
    pub(crate) async fn suspended_with(&self, restore_takes: Duration, validity: Duration) {
        self.actor.suspend(Trigger::Api).await.unwrap();
        self.actor.wait_commit().await.unwrap();
        *lock(&self.tasks.takes) = restore_takes;
        *lock(&self.store.validity) = validity;
    }

    pub(crate) fn confirms(&self) -> usize {
        *lock(&self.store.confirms)
    }

    /// The store answers every lease confirmation: lost.
    pub(crate) fn store_fails_confirm(&self) {
        self.store.fail("confirm");
    }
}

#[tokio::test]
async fn a_suspend_dumps_every_container_and_a_resume_restores_them() {
    let r = rig(&["c1", "c2"]).await;
    let rec = r.actor.suspend(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Suspended);
    assert_eq!(rec.generation, 1);
    assert_eq!(r.tasks.calls("dump"), ["dump:c1", "dump:c2"]);
    assert!(r.tasks.is_suspended("c1") && r.tasks.is_suspended("c2"));
    // The commit runs in the background; its outcome lands in the record.
    r.actor.wait_commit().await.unwrap();
    let rec = r.rec();
    assert!(rec.snapshot.is_some() && rec.staging.is_none(), "{rec:?}");

    let rec = r.actor.resume(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Running);
    assert_eq!(r.tasks.calls("restore"), ["restore:c1", "restore:c2"]);
    assert!(!r.tasks.is_suspended("c1") && !r.tasks.is_suspended("c2"));
    let snap_dir = r.store.path_of(rec.snapshot.as_ref().unwrap()).unwrap();
    assert_eq!(*lock(&r.tasks.restored_from), [snap_dir.join("c1"), snap_dir.join("c2")]);
    // The checkout is released once the restore no longer reads it.
    r.actor.wait_lazy_daemons().await;
    assert_eq!(r.store.leases(), 0);
    assert!(r.rec().leases.is_empty());
}

#[tokio::test]
async fn a_resume_before_the_commit_restores_from_the_staging() {
    let r = rig(&["c1"]).await;
    r.store.fail("commit");
    r.actor.suspend(Trigger::Api).await.unwrap();
    assert!(r.actor.wait_commit().await.is_err(), "the commit fails (and is retried)");
    let rec = r.actor.resume(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Running);
    let staging = lock(&r.store.held).stagings.values().next().cloned().unwrap();
    assert_eq!(*lock(&r.tasks.restored_from), [staging.join("c1")], "a view of the staging");
}

#[tokio::test]
async fn a_suspend_without_the_store_is_refused_and_touches_nothing() {
    let r = rig(&["c1"]).await;
    r.store.fail("begin_staging");
    let e = r.actor.suspend(Trigger::Api).await.unwrap_err();
    assert!(e.is_store(StoreErrorKind::Unavailable), "{e}");
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Running);
    assert_eq!(rec.generation, 0);
    assert!(rec.last_error.unwrap().contains("no store"));
    assert!(r.tasks.calls("pause").is_empty() && r.tasks.calls("dump").is_empty());
}

#[tokio::test]
async fn a_failed_dump_rolls_the_suspend_back() {
    let r = rig(&["c1", "c2"]).await;
    r.tasks.fail("dump:c2");
    let e = r.actor.suspend(Trigger::Api).await.unwrap_err();
    assert!(e.to_string().contains("dump:c2"), "{e}");
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Running);
    assert_eq!(rec.generation, 0, "the generation goes back");
    assert!(rec.staging.is_none());
    assert!(rec.last_error.unwrap().contains("dump:c2"));
    // c1 was dumped: restored; c2 only frozen: thawed.
    assert_eq!(r.tasks.calls("restore"), ["restore:c1"]);
    assert_eq!(r.tasks.calls("resume"), ["resume:c2"]);
    assert_eq!(r.tasks.status_of("c1"), (Status::Running, false));
    assert_eq!(r.tasks.status_of("c2"), (Status::Running, false));
    assert_eq!(lock(&r.store.held).aborted.len(), 1, "the staging is aborted");
}

#[tokio::test]
async fn a_frozen_actor_whose_dump_fails_is_frozen_again() {
    let r = rig(&["c1"]).await;
    r.actor.freeze().await.unwrap();
    r.tasks.fail("dump:c1");
    r.actor.suspend(Trigger::Api).await.unwrap_err();
    assert_eq!(r.rec().state, Lifecycle::Frozen);
    assert_eq!(r.tasks.status_of("c1"), (Status::Paused, false));
}

#[tokio::test]
async fn a_resume_without_the_lease_is_refused_and_the_actor_stays_suspended() {
    let r = rig(&["c1"]).await;
    r.actor.suspend(Trigger::Api).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    r.store.fail("confirm");
    let e = r.actor.resume(Trigger::Api).await.unwrap_err();
    assert!(e.is_store(StoreErrorKind::LeaseLost), "{e}");
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Suspended);
    assert!(rec.last_error.unwrap().contains("resume of actor ns/a: "));
    assert!(r.tasks.calls("restore").is_empty());
    // Once the lease is confirmed again, the resume goes through.
    r.store.heal("confirm");
    assert_eq!(r.actor.resume(Trigger::Api).await.unwrap().state, Lifecycle::Running);
}

#[tokio::test]
async fn a_resume_from_an_unreachable_snapshot_is_refused() {
    let r = rig(&["c1"]).await;
    r.actor.suspend(Trigger::Api).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    r.store.fail("checkout");
    let e = r.actor.resume(Trigger::Api).await.unwrap_err();
    assert!(e.to_string().contains("from snapshot ns/a@"), "{e}");
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Suspended);
    assert!(rec.last_error.unwrap().contains("object tier is unreachable"));
    assert!(r.tasks.calls("restore").is_empty());
}

#[tokio::test]
async fn images_that_do_not_match_their_seal_are_never_restored() {
    let r = rig(&["c1"]).await;
    let rec = r.actor.suspend(Trigger::Api).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    let snap_dir = r.store.path_of(r.rec().snapshot.as_ref().unwrap()).unwrap();
    std::fs::write(snap_dir.join("c1").join("inventory.img"), "tampered").unwrap();
    let e = r.actor.resume(Trigger::Api).await.unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)) || e.to_string().contains("seal"), "{e}");
    let after = r.rec();
    assert_eq!(after.state, Lifecycle::Suspended);
    assert_eq!(after.generation, rec.generation);
    assert!(r.tasks.calls("restore").is_empty());
    assert_eq!(r.store.leases(), 0, "the checkout is released");
}

#[tokio::test]
async fn a_failed_restore_suspends_the_restored_containers_again() {
    let r = rig(&["c1", "c2"]).await;
    r.actor.suspend(Trigger::Api).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    r.tasks.fail("restore:c2");
    r.actor.resume(Trigger::Api).await.unwrap_err();
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Suspended);
    assert!(rec.last_error.unwrap().contains("restore:c2"));
    assert_eq!(r.tasks.calls("unrestore"), ["unrestore:c1"]);
    assert!(r.tasks.is_suspended("c1") && r.tasks.is_suspended("c2"));
    assert_eq!(r.store.leases(), 0);
    assert!(rec.leases.is_empty());
}

#[tokio::test]
async fn a_failed_restore_starts_cold_when_the_actor_asks() {
    let spec = ActorSpec { actor: Some(ACTOR.into()), on_restore_failure: OnRestoreFailure::ColdStart, ..Default::default() };
    let r = rig_with(&["c1"], spec, None).await;
    r.actor.suspend(Trigger::Api).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    r.tasks.fail("restore:c1");
    let rec = r.actor.resume(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Running);
    assert!(rec.last_error.unwrap().starts_with("restore failed, started cold"));
    assert_eq!(r.tasks.calls("cold_start"), ["cold_start:c1"]);
}

#[tokio::test]
async fn a_freeze_pauses_and_a_resume_thaws() {
    let r = rig(&["c1", "c2"]).await;
    let rec = r.actor.freeze().await.unwrap();
    assert_eq!(rec.state, Lifecycle::Frozen);
    assert_eq!(r.tasks.status_of("c1").0, Status::Paused);
    let e = r.actor.freeze().await.unwrap_err();
    assert!(matches!(e, Error::WrongState(_)), "a frozen actor is not frozen again: {e}");
    let rec = r.actor.resume(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Running);
    assert_eq!(r.tasks.status_of("c2").0, Status::Running);
    assert!(r.tasks.calls("restore").is_empty(), "a thaw, no restore");
}

#[tokio::test]
async fn a_freeze_that_cannot_pause_every_container_thaws_the_others() {
    let r = rig(&["c1", "c2"]).await;
    r.tasks.fail("pause:c2");
    r.actor.freeze().await.unwrap_err();
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Running);
    assert!(rec.last_error.unwrap().starts_with("freeze failed"));
    assert_eq!(r.tasks.status_of("c1").0, Status::Running);
}

#[tokio::test]
async fn the_freeze_tier_thaws_on_a_resume_and_checkpoints_on_a_second_suspend() {
    let spec = ActorSpec { actor: Some(ACTOR.into()), freeze_first: Some(Duration::from_secs(30)), ..Default::default() };
    let r = rig_with(&["c1"], spec, None).await;
    let rec = r.actor.suspend(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Frozen);
    let tier = r.actor.freeze_tier().expect("in the freeze tier");
    assert!(r.actor.frozen_in_tier("c1"));
    assert!(r.tasks.calls("dump").is_empty());
    // A resume within the window is a thaw.
    assert_eq!(r.actor.resume(Trigger::Api).await.unwrap().state, Lifecycle::Running);
    assert!(r.actor.freeze_tier().is_none());
    // The window that ended is no longer the actor's: its checkpoint is refused.
    let e = r.actor.checkpoint(Some(tier), Trigger::FreezeWindow).await.unwrap_err();
    assert!(matches!(e, Error::WrongState(_)), "{e}");
    // Frozen again; a second suspend checkpoints at once.
    r.actor.suspend(Trigger::Api).await.unwrap();
    let rec = r.actor.suspend(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Suspended);
    assert!(rec.freeze_tier.is_none());
    assert_eq!(r.tasks.calls("dump"), ["dump:c1"]);
}

#[tokio::test]
async fn a_failed_checkpoint_of_the_freeze_tier_leaves_the_actor_thawed_and_running() {
    let spec = ActorSpec { actor: Some(ACTOR.into()), freeze_first: Some(Duration::from_secs(30)), ..Default::default() };
    let r = rig_with(&["c1"], spec, None).await;
    r.actor.suspend(Trigger::Api).await.unwrap();
    let tier = r.actor.freeze_tier().unwrap();
    r.store.fail("begin_staging");
    r.actor.checkpoint(Some(tier), Trigger::FreezeWindow).await.unwrap_err();
    let rec = r.rec();
    assert_eq!(rec.state, Lifecycle::Running);
    assert!(rec.freeze_tier.is_none());
    assert!(rec.last_error.unwrap().starts_with("checkpoint of the freeze tier failed"));
    assert_eq!(r.tasks.status_of("c1").0, Status::Running);
}

#[tokio::test]
async fn a_stop_suspends_an_actor_that_asks_for_it() {
    let spec =
        ActorSpec { actor: Some(ACTOR.into()), suspend_on_stop: true, freeze_first: Some(Duration::from_secs(30)), ..Default::default() };
    let r = rig_with(&["c1"], spec, None).await;
    r.actor.suspend_on_stop("c1").await;
    // A checkpoint, never the freeze tier: the pod is going away.
    assert_eq!(r.rec().state, Lifecycle::Suspended);
}

#[tokio::test]
async fn a_stop_thaws_the_freeze_tier_of_an_actor_that_does_not_suspend_on_stop() {
    let spec = ActorSpec { actor: Some(ACTOR.into()), freeze_first: Some(Duration::from_secs(30)), ..Default::default() };
    let r = rig_with(&["c1"], spec, None).await;
    r.actor.suspend(Trigger::Api).await.unwrap();
    r.actor.suspend_on_stop("c1").await;
    assert_eq!(r.rec().state, Lifecycle::Running);
    assert_eq!(r.tasks.status_of("c1").0, Status::Running, "a frozen process would not take the signal");
}

/// A new pod of the actor (its own shim) over the same store.
async fn new_pod(store: &Arc<StubStore>) -> Rig {
    let spec = ActorSpec { actor: Some(ACTOR.into()), ..Default::default() };
    let dir = tempfile::tempdir().unwrap();
    let tasks = StubContainers::with(&["n1"], &spec);
    let config = Config { state_root: dir.path().join("state"), claim_dir: dir.path().join("claims"), lazy_pages: false };
    let (wake, wake_rx) = mpsc::unbounded_channel();
    let actor = Actor::new(tasks.clone(), store.clone(), config, wake);
    actor.init("shim-2", &spec, true).await.unwrap();
    Rig { dir, tasks, store: store.clone(), actor, _wake: wake_rx }
}

#[tokio::test]
async fn a_new_pod_adopts_the_actors_snapshot() {
    let old = rig(&["c1"]).await;
    old.actor.suspend(Trigger::Api).await.unwrap();
    old.actor.wait_commit().await.unwrap();
    let snap = old.rec().snapshot.unwrap();

    let new = new_pod(&old.store).await;
    let identity = Identity { actor: ACTOR.into(), container: "c1".into() };
    let adopted = new.actor.adopt("n1", &identity, None).await.unwrap().expect("restored from its snapshot");
    assert_eq!(adopted.snapshot, snap);
    let rec = new.rec();
    assert_eq!(rec.state, Lifecycle::Resuming);
    assert_eq!(rec.leases.len(), 1, "the checkout is pinned until the start");
    new.actor.hold_adoption("n1", adopted.clone());
    new.tasks.set("n1", |s| s.suspended = true);
    let bundle = new.dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    new.actor.start_restored("n1", &adopted.image, &bundle).await.unwrap();
    let rec = new.rec();
    assert_eq!(rec.state, Lifecycle::Running);
    assert!(rec.leases.is_empty());
    assert_eq!(*lock(&new.tasks.restored_from), std::slice::from_ref(&adopted.image));
    assert_eq!(old.store.leases(), 0);
    // A name the snapshot does not hold starts cold.
    let sidecar = Identity { actor: ACTOR.into(), container: "sidecar".into() };
    assert!(new.actor.adopt("n2", &sidecar, None).await.unwrap().is_none());
}

#[tokio::test]
async fn an_adoption_whose_snapshot_cannot_be_checked_out_fails_the_create_and_asks_again() {
    let old = rig(&["c1"]).await;
    old.actor.suspend(Trigger::Api).await.unwrap();
    old.actor.wait_commit().await.unwrap();
    let new = new_pod(&old.store).await;
    let identity = Identity { actor: ACTOR.into(), container: "c1".into() };
    new.store.fail("checkout");
    new.actor.adopt("n1", &identity, None).await.unwrap_err();
    let rec = new.rec();
    assert_eq!(rec.state, Lifecycle::Running);
    assert!(!rec.restore_checked, "the next create asks the store again");
    assert!(rec.last_error.unwrap().contains("object tier is unreachable"));
    new.store.heal("checkout");
    assert!(new.actor.adopt("n1", &identity, None).await.unwrap().is_some());
}

#[tokio::test]
async fn what_a_dead_shims_cleanup_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let store = StubStore::new(&dir.path().join("store"));
    let records = Store::new(dir.path(), "dead-shim").unwrap();
    let record = |state: Lifecycle| {
        let mut r = Record::new(ACTOR.into());
        r.state = state;
        r.generation = 1;
        r.containers = vec!["c1".into()];
        r
    };

    // Dumps complete, the commit not done: the cleanup commits them.
    let staging = store.begin_staging(ACTOR).await.unwrap();
    let mut r = record(Lifecycle::Suspended);
    r.staging = Some(StagingRecord { id: staging.id.clone(), path: staging.path.clone() });
    r.leases = vec![store.lease()];
    records.save(&r).unwrap();
    super::cleanup::settle(&*store, &records, r).await;
    let kept = records.load().unwrap().unwrap();
    assert!(kept.orphaned && kept.staging.is_none());
    assert_eq!(kept.snapshot, store.latest(ACTOR).await.unwrap(), "committed by the cleanup");
    assert_eq!(store.leases(), 0, "the dead shim's checkouts are released");
    assert_eq!(lock(&store.held).surrendered, [ACTOR], "the lease goes (any node may restore it)");
    records.remove().unwrap();

    // A suspend cut before every dump completed: its staging is aborted.
    let staging = store.begin_staging(ACTOR).await.unwrap();
    let mut r = record(Lifecycle::Suspending);
    r.staging = Some(StagingRecord { id: staging.id.clone(), path: staging.path.clone() });
    records.save(&r).unwrap();
    super::cleanup::settle(&*store, &records, r).await;
    assert!(!records.dir().exists());
    assert_eq!(lock(&store.held).aborted, [staging.id]);

    // A running actor with the default id has moved past its snapshots.
    let mut r = record(Lifecycle::Running);
    r.ran = true;
    records.save(&r).unwrap();
    super::cleanup::settle(&*store, &records, r).await;
    assert!(!records.dir().exists());
    assert_eq!(store.latest(ACTOR).await.unwrap(), None, "its snapshots are removed");
}

#[test]
fn a_lease_confirmation_is_half_spent_past_the_middle_of_its_validity() {
    use super::lease_half_spent;
    // Asked at 1000, valid until 5000: half spent after 3000.
    assert!(!lease_half_spent(1_000, Some(5_000), 1_000));
    assert!(!lease_half_spent(1_000, Some(5_000), 2_999));
    assert!(lease_half_spent(1_000, Some(5_000), 3_001));
    assert!(lease_half_spent(1_000, Some(5_000), 5_000), "run out");
    assert!(lease_half_spent(1_000, Some(5_000), 9_000));
    assert!(lease_half_spent(0, None, 1), "never confirmed");
}

#[tokio::test]
async fn a_restore_slower_than_the_leases_validity_confirms_it_again() {
    let r = rig(&["c1"]).await;
    r.suspended_with(Duration::from_millis(400), Duration::from_millis(300)).await;
    let before = r.confirms();
    let rec = r.actor.resume(Trigger::Api).await.unwrap();
    assert_eq!(rec.state, Lifecycle::Running);
    assert_eq!(r.confirms() - before, 2, "confirmed at the start and again after the slow restore");
    let left = r.actor.lease_valid_until().unwrap().saturating_sub(crate::actor::record::now_ms());
    assert!(left > 100, "the RUNNING actor's lease has its validity ahead ({left} ms)");
    // A fast resume asks once.
    r.suspended_with(Duration::ZERO, Duration::from_secs(60)).await;
    let before = r.confirms();
    r.actor.resume(Trigger::Api).await.unwrap();
    assert_eq!(r.confirms() - before, 1);
}

#[tokio::test]
async fn a_thaw_slower_than_the_leases_validity_confirms_it_again() {
    let r = rig(&["c1"]).await;
    r.actor.freeze().await.unwrap();
    *lock(&r.tasks.takes) = Duration::from_millis(400);
    *lock(&r.store.validity) = Duration::from_millis(300);
    let before = r.confirms();
    assert_eq!(r.actor.resume(Trigger::Api).await.unwrap().state, Lifecycle::Running);
    assert_eq!(r.confirms() - before, 2);
}

/// Each suspend and resume tells the daemon what started it (the
/// `trigger` label of its metrics): the caller's, whichever path it took.
#[tokio::test]
async fn suspends_and_resumes_report_their_trigger() {
    let r = rig(&["c1"]).await;
    r.actor.suspend(Trigger::Idle).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    r.actor.resume(Trigger::Connection).await.unwrap();
    r.actor.suspend(Trigger::Request).await.unwrap();
    r.actor.wait_commit().await.unwrap();
    // An exec into a suspended actor wakes it.
    r.actor.ensure_running("c1").await.unwrap();
    assert_eq!(r.rec().state, Lifecycle::Running);
    let want = [("suspend", "idle"), ("resume", "connection"), ("suspend", "request"), ("resume", "exec")];
    // The reports travel from tasks of their own.
    let mut got = Vec::new();
    for _ in 0..200 {
        got = lock(&r.store.reports).iter().filter(|(op, outcome, _)| outcome == "ok" && op != "commit").cloned().collect::<Vec<_>>();
        if got.len() >= want.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    got.sort();
    let mut want: Vec<(String, String, String)> = want.iter().map(|(op, t)| (op.to_string(), "ok".to_string(), t.to_string())).collect();
    want.sort();
    assert_eq!(got, want);
    // Every trigger has a name of its own.
    let names: HashSet<&str> = Trigger::ALL.iter().map(|t| t.name()).collect();
    assert_eq!(names.len(), Trigger::ALL.len());
}
