//! The lifecycle layer: what an actor does — freeze, suspend, resume, the
//! restore of a kept snapshot into a new pod (adopt), and the cleanup after
//! a shim's death. An actor is all app containers of one shim (the pod's,
//! under CRI), moved as one unit.
//!
//! ```text
//!             create/start (fresh, or adopt a stored snapshot)
//!                               │
//!    ┌────────── RUNNING ◄──────────────────────────┐
//!    │ freeze          │ suspend                    │ resume
//!    ▼                 ▼                            │
//!  FROZEN ──────► SUSPENDING ──► SUSPENDED ─────────┘ (RESUMING)
//! ```
//!
//! With `torpor.dev/freeze-first: D`, a suspend (other than on a stop)
//! goes to FROZEN in the *freeze tier* first ([`freeze`]): a resume within
//! D is a thaw, D's end (or another suspend, or memory pressure) goes on
//! to SUSPENDING.
//!
//! One file per operation: [`freeze`], [`suspend`], [`resume`], [`adopt`],
//! [`cleanup`]; this module holds the [`Actor`] they share and its record.
//!
//! **Locking.** The record is behind a `std::sync::Mutex`, held only to
//! read or change it (never across an `.await`); every change is persisted
//! ([`record::Store::save`]) before it is acted on. Lifecycle operations of
//! the actor run one at a time: each takes the actor's *gate* (a queue,
//! protecting no data), claims its transition in the record (SUSPENDING,
//! RESUMING...) and runs its commands outside any lock, so `torporctl
//! status`, the lease fence and containerd's State/Pids/Stats never wait
//! for a dump or a restore.
//!
//! Imports [`crate::task`], [`crate::actor`], [`crate::oci`] and
//! [`crate::system`]; nothing above.

pub mod adopt;
pub mod cleanup;
pub mod freeze;
mod links;
pub mod resume;
pub mod suspend;
mod timing;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::actor::claim::Claim;
use crate::actor::record::{self, Lifecycle, Record};
use crate::actor::seal;
use crate::actor::store_client::{self, SnapshotStore};
use crate::error::{Error, Result};
use crate::oci::annotations::ActorSpec;
use crate::system::cgroup;
use crate::system::held_ports;
use crate::system::netns::TcpConnection;
use crate::system::sleeping_connections;
use crate::task::Tasks;

pub use adopt::Adopted;
pub use suspend::CommitState;

/// The pod's network namespace and the addresses held there.
type HeldTarget = (PathBuf, Vec<SocketAddr>);

/// The pod netns whose rules keep a suspended actor's connections, and the
/// watch of their packets (stopped when dropped).
struct KeptConnections {
    netns: PathBuf,
    /// The xtables tools of the families that have rules.
    tools: Vec<&'static str>,
    _watch: sleeping_connections::Watch,
}

/// The actor of one shim, and what its operations share.
#[derive(Clone)]
pub struct Actor {
    pub(crate) tasks: Tasks,
    pub(crate) store: SnapshotStore,
    state_root: PathBuf,
    /// The record and its directory, once the first app container exists.
    slot: Arc<Mutex<Option<(record::Store, Record)>>>,
    /// Lifecycle operations one at a time (see the module doc).
    gate: Arc<tokio::sync::Mutex<()>>,
    /// Listeners held for the suspended actor.
    held: Arc<Mutex<Option<held_ports::Armed>>>,
    /// What they hold (the pod's netns and the ports), to hold it again
    /// after a failed resume.
    held_target: Arc<Mutex<Option<HeldTarget>>>,
    /// Where the held listeners report a real connection.
    wake: mpsc::UnboundedSender<()>,
    /// The suspended actor's TCP connections, kept in its pod's netns
    /// (their rules in, their packets watched: [`sleeping_connections`]).
    kept: Arc<Mutex<Option<KeptConnections>>>,
    /// Lazy-pages daemons still serving a restored actor's memory.
    lazy: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    /// Changed when the restored processes were stopped under their
    /// lazy-pages daemons (a failed stream): the daemons are stopped too.
    lazy_stop: Arc<tokio::sync::watch::Sender<u64>>,
    /// The node-local claim on the actor, held while the shim runs it.
    claim: Arc<Mutex<Option<Claim>>>,
    /// The background commit of the last suspend's snapshot.
    commit: Arc<Mutex<Option<tokio::sync::watch::Receiver<CommitState>>>>,
    /// Containers created to be restored from a kept snapshot, until Start.
    adoptions: Arc<Mutex<HashMap<String, Adopted>>>,
    /// The frozen actor's own listeners, watched while it is in the freeze
    /// tier ([`freeze`]).
    frozen_watch: Arc<Mutex<Option<freeze::FrozenWatch>>>,
    /// Told when the freeze tier begins or ends (the window timer waits on it).
    freeze_changed: Arc<tokio::sync::Notify>,
    /// Ends of the unix connections between the containers, held while
    /// their containers are checkpointed ([`links`]).
    links: Arc<Mutex<links::HeldEnds>>,
    /// Unix ms until which the actor's lease was last confirmed to hold (0:
    /// never): by a resume, a thaw or the lease fence, which judges a
    /// missing answer by it ([`crate::trigger::fence`]).
    lease_valid_until: Arc<AtomicU64>,
}

/// Locks a std mutex, through a poisoned one (a panic elsewhere does not
/// make the state unreadable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Actor {
    /// `wake` receives one message per real inbound connection to a held
    /// port (see [`crate::trigger::activation`]).
    pub fn new(tasks: Tasks, store: SnapshotStore, state_root: PathBuf, wake: mpsc::UnboundedSender<()>) -> Actor {
        Actor {
            tasks,
            store,
            state_root,
            slot: Arc::default(),
            gate: Arc::default(),
            held: Arc::default(),
            held_target: Arc::default(),
            wake,
            kept: Arc::default(),
            lazy: Arc::default(),
            lazy_stop: Arc::new(tokio::sync::watch::channel(0).0),
            claim: Arc::default(),
            commit: Arc::default(),
            adoptions: Arc::default(),
            frozen_watch: Arc::default(),
            freeze_changed: Arc::default(),
            links: Arc::default(),
            lease_valid_until: Arc::default(),
        }
    }

    /// Confirms that this node still holds the actor's lease (for shim
    /// `owner`), remembering until when ([`Actor::lease_valid_until`]).
    pub(crate) async fn confirm_lease(&self, actor: &str, owner: &str) -> Result<Option<u64>> {
        let answer = self.store.confirm_lease(actor, owner).await;
        if let Ok(Some(until)) = answer {
            self.lease_valid_until.fetch_max(until, Ordering::Relaxed);
        }
        answer
    }

    /// Until when (unix ms) the lease was last confirmed to hold; `None`
    /// before any confirmation.
    pub(crate) fn lease_valid_until(&self) -> Option<u64> {
        Some(self.lease_valid_until.load(Ordering::Relaxed)).filter(|t| *t > 0)
    }

    /// The processes of app container `id`: its cgroup's, or its init's
    /// when the cgroup cannot be read.
    pub(crate) fn processes_of(&self, rec: Option<&Record>, id: &str) -> Vec<i32> {
        let in_cgroup = rec
            .and_then(|r| r.cgroups.get(id))
            .map(|cg| cgroup::Roots::host().of_path(cg).and_then(|cg| cg.procs()).unwrap_or_default())
            .unwrap_or_default();
        if in_cgroup.is_empty() {
            self.tasks.app_info(id).ok().map(|i| i.pid).filter(|p| *p > 0).into_iter().collect()
        } else {
            in_cgroup
        }
    }

    /// The record, changed by `f` and persisted; `FailedPrecondition`
    /// without an actor.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut Record) -> T) -> Result<T> {
        let mut slot = lock(&self.slot);
        let (store, rec) = slot.as_mut().ok_or_else(no_actor)?;
        let out = f(rec);
        store.save(rec)?;
        Ok(out)
    }

    /// Like [`Actor::update`], but only if `f` says there is something to
    /// save (`Some`); nothing (and `None`) without an actor.
    pub(crate) fn update_if<T>(&self, f: impl FnOnce(&mut Record) -> Option<T>) -> Result<Option<T>> {
        let mut slot = lock(&self.slot);
        let Some((store, rec)) = slot.as_mut() else { return Ok(None) };
        let Some(out) = f(rec) else { return Ok(None) };
        store.save(rec)?;
        Ok(Some(out))
    }

    /// A copy of the record, if the shim has an actor.
    pub(crate) fn record(&self) -> Option<Record> {
        lock(&self.slot).as_ref().map(|(_, r)| r.clone())
    }

    /// The record's directory (CRIU work dirs, the shim key).
    pub(crate) fn dir(&self) -> Option<record::Store> {
        lock(&self.slot).as_ref().map(|(s, _)| s.clone())
    }

    /// The actor's record, with its running containers, if the shim has
    /// app containers.
    pub fn status(&self) -> Option<Record> {
        let mut rec = self.record()?;
        rec.containers = self.tasks.app_containers();
        Some(rec)
    }

    /// Sets up the actor record when the first app container is created,
    /// after claiming the actor on this node (see [`crate::actor::claim`]):
    /// a second shim of the same actor is refused here.
    pub async fn init(&self, group: &str, spec: &ActorSpec, explicit: bool) -> Result<()> {
        let _gate = self.gate.lock().await;
        if lock(&self.slot).is_some() {
            return Ok(());
        }
        let store = record::Store::new(&self.state_root, group)?;
        let mut rec = Record::new(spec.actor.clone().unwrap_or_else(|| group.to_string()));
        rec.explicit_actor = explicit;
        rec.pod_uid = spec.pod_uid.clone();
        rec.keep_local_s = spec.keep_local.map(|d| d.as_secs().max(1));
        let claim = Claim::take(&rec.actor, group)?;
        // One node runs the actor: its lease in the object tier (refused,
        // naming the holder, while another node has it).
        let grant = self.store.acquire(&rec.actor, group).await.map_err(|e| e.context(&format!("actor {}", rec.actor)))?;
        info!(actor = rec.actor.as_str(), epoch = grant.epoch, from = ?grant.previous_node, "actor lease held by this node");
        rec.moved_from = grant.previous_node;
        if let Err(e) = store.save(&rec) {
            self.store.surrender_logged(&rec.actor, group).await;
            return Err(e);
        }
        *lock(&self.claim) = Some(claim);
        crate::actor::report::state(&self.store, &rec);
        *lock(&self.slot) = Some((store, rec));
        Ok(())
    }

    /// Records app container `id`'s name (its identity within the actor)
    /// and cgroup, before it runs.
    pub fn add_member(&self, id: &str, name: &str, cgroup: Option<String>) -> Result<()> {
        self.update_if(|rec| {
            rec.names.insert(id.to_string(), name.to_string());
            if let Some(cg) = cgroup {
                rec.cgroups.insert(id.to_string(), cg);
            }
            Some(())
        })
        .map(|_| ())
    }

    /// App container `id` started (cold or restored): the actor ran.
    pub fn ran(&self, id: &str) {
        let r = self.update_if(|rec| {
            if rec.ran || !rec.names.contains_key(id) {
                return None;
            }
            rec.ran = true;
            Some(())
        });
        if let Err(e) = r {
            warn!(container = id, "save the actor record: {e}");
        }
    }

    /// Drops the actor's record once no app container is left: retention
    /// of its snapshots, its leases, its claim.
    pub async fn forget_if_empty(&self) {
        if self.tasks.has_app_containers() {
            return;
        }
        // A suspend's commit under way lands in the store first.
        if let Err(e) = self.wait_commit().await {
            warn!("the actor is removed while its suspend's commit fails: {e}");
        }
        self.wait_lazy_daemons().await;
        let _gate = self.gate.lock().await;
        let Some((store, rec)) = lock(&self.slot).take() else { return };
        for lease in &rec.leases {
            self.store.release_logged(lease).await;
        }
        // Retention: a SUSPENDED actor's snapshots stay (restorable by
        // identity; the store's gc keeps the newest). A running actor has
        // moved past them: with the default id (its pod) they are stale; an
        // explicit actor id keeps them (resume anywhere).
        if matches!(rec.state, Lifecycle::Running | Lifecycle::Frozen) && rec.ran && !rec.explicit_actor {
            self.store.remove_all_logged(&rec.actor).await;
        }
        // Another node may take the actor now (once its newest snapshot is
        // durable: the store uploads it first).
        self.store.surrender_logged(&rec.actor, &store.key()).await;
        if let Err(e) = store.remove() {
            warn!("remove actor state: {e}");
        }
        if let Err(e) = crate::oci::bundle::remove_request_dir(&store.key()) {
            warn!("remove the request directory: {e}");
        }
        self.release_held_ports();
        lock(&self.frozen_watch).take();
        self.freeze_changed.notify_one();
        lock(&self.claim).take();
        lock(&self.commit).take();
    }

    /// Holds `ports` in `netns` for the suspended actor: a real connection
    /// wakes it ([`crate::trigger::activation`]).
    pub(crate) fn hold_ports(&self, netns: PathBuf, ports: Vec<SocketAddr>) {
        match held_ports::Armed::arm(&netns, ports.clone(), self.wake.clone()) {
            Ok(armed) => {
                *lock(&self.held) = Some(armed);
                *lock(&self.held_target) = Some((netns, ports));
            }
            Err(e) => warn!(netns = ?netns, "no activation on inbound connections: {e}"),
        }
    }

    /// Holds the ports of the last suspend again (after a failed resume).
    pub(crate) fn rearm_held_ports(&self) {
        let target = lock(&self.held_target).clone();
        if let Some((netns, ports)) = target {
            self.hold_ports(netns, ports);
        }
    }

    /// Waits until no lifecycle operation is under way (a kill must not
    /// land between a suspend's dump and its held ports).
    pub async fn settled(&self) {
        drop(self.gate.lock().await);
    }

    /// Nothing to wake any more (the suspended container was stopped):
    /// the held ports and the kept connections go.
    pub fn release_held_ports(&self) {
        let held = lock(&self.held).take();
        if let Some(armed) = held {
            armed.release();
        }
        lock(&self.held_target).take();
        self.release_connections();
    }

    /// Keeps the connections a suspend checkpointed (in `netns`), before
    /// the dump's network lock is lifted: their packets are dropped, not
    /// reset, and the first one wakes the actor. Without the watch of
    /// their packets they are not kept (a request would wait unanswered
    /// until the actor woke otherwise; a reset is the better answer).
    pub(crate) async fn keep_connections(&self, netns: &Path, conns: &[TcpConnection]) {
        if conns.is_empty() {
            return;
        }
        let watch = match sleeping_connections::Watch::start(netns, self.wake.clone()) {
            Ok(w) => w,
            Err(e) => {
                warn!(connections = conns.len(), "the suspended actor's connections are reset if their peers send: {e}");
                return;
            }
        };
        match sleeping_connections::keep(netns, conns).await {
            Ok(tools) => *lock(&self.kept) = Some(KeptConnections { netns: netns.to_path_buf(), tools, _watch: watch }),
            Err(e) => {
                warn!(connections = conns.len(), "the suspended actor's connections are reset if their peers send: {e}");
                if let Err(e) = sleeping_connections::release(netns, crate::system::netns::restore_tools()).await {
                    warn!("{e}");
                }
            }
        }
    }

    /// After a resume (or once nothing is to be woken): the kept
    /// connections' rules go, in the background (off the resume's path:
    /// a packet dropped meanwhile is retransmitted to the restored socket).
    pub(crate) fn release_connections(&self) {
        let Some(kept) = lock(&self.kept).take() else { return };
        let KeptConnections { netns, tools, _watch } = kept;
        drop(_watch);
        let release = move |ns: PathBuf| async move { sleeping_connections::release(&ns, &tools).await };
        crate::system::netns::remove_rules_later(netns, "release the resumed actor's connections", async {}, release);
    }
}

pub(crate) fn no_actor() -> Error {
    Error::FailedPrecondition("this shim has no actor (no app container)".into())
}

/// The container's name in the actor (its image directory in a snapshot).
pub(crate) fn name_of<'a>(rec: &'a Record, id: &'a str) -> &'a str {
    rec.names.get(id).map(String::as_str).unwrap_or(id)
}

/// Checks the images at `path` (a checkout or a view of a staging of
/// `actor`, described by `from`) against the seal of their dump
/// ([`crate::actor::seal`]) before anything is restored from them.
pub(crate) async fn verify_seal(path: &std::path::Path, actor: &str, from: &str) -> Result<()> {
    let p = path.to_path_buf();
    let verified = tokio::task::spawn_blocking(move || seal::verify(&p))
        .await
        .map_err(|e| Error::Io { context: "verify the dump's seal".into(), source: std::io::Error::other(e) })??;
    match verified {
        seal::Verified::Sealed { files } => debug!(actor, from, files, "the images match their dump's seal"),
        seal::Verified::Unsealed => {
            warn!(actor, from, "the images have no seal (dumped by a torpor before seals): checked by the store's manifest only")
        }
    }
    Ok(())
}

/// The labels a suspend's snapshot is committed with.
pub(crate) fn commit_labels(shim: &str, rec: &Record) -> HashMap<String, String> {
    let mut names: Vec<&str> = rec.containers.iter().map(|id| name_of(rec, id)).collect();
    names.sort_unstable();
    let mut l = HashMap::new();
    l.insert(store_client::LABEL_SHIM.to_string(), shim.to_string());
    l.insert(store_client::LABEL_CONTAINERS.to_string(), names.join(","));
    l.insert(store_client::LABEL_RUNTIME.to_string(), format!("torpor-runtime {}", env!("CARGO_PKG_VERSION")));
    if let Some(s) = &rec.staging {
        l.insert(store_client::LABEL_STAGING.to_string(), s.id.clone());
    }
    l
}
