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
//! Two floors, and calls run only down:
//!
//! - **operations**, one file each: [`freeze`], [`suspend`], [`resume`],
//!   [`adopt`], [`cleanup`], and [`members`] (the record's setup at the
//!   first create, its removal after the last container). None calls
//!   another.
//! - **steps** they share: [`dump`] (the checkpoint, its rollback, the
//!   background commit), [`restore`] (one container from disk or
//!   streamed, the lazy-pages daemons, the leases they pin), [`freezer`]
//!   (pause, thaw, the freeze tier's watch of the actor's listeners),
//!   [`held`] (held ports, kept connections, the activation target),
//!   [`links`] (the unix connections between containers) and [`timing`].
//!   `dump` calls `restore` (its rollback), `freezer` and `held`;
//!   `restore` and `freezer` call `held`; none calls an operation.
//!
//! This module holds the [`Actor`] they share, its record, and the refusal
//! of an operation ([`Actor::refused`]). The freeze tier's end (its
//! window, memory pressure) is decided by [`crate::trigger::policy`],
//! which calls the checkpoint.
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
mod dump;
pub mod freeze;
mod freezer;
mod held;
mod links;
mod members;
mod restore;
pub mod resume;
mod state;
pub mod suspend;
mod timing;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::actor::claim::Claim;
use crate::actor::record::{self, Record};
use crate::actor::seal;
use crate::actor::snapshots::Snapshots;
use crate::actor::store_client;
use crate::error::{Error, Result};
use crate::system::cgroup;
use crate::system::held_ports;
use crate::task::Containers;

pub use state::{Adopted, CommitState};

/// Where an actor keeps its state, and how it restores.
#[derive(Debug, Clone)]
pub struct Config {
    /// The records of the node's actors ([`crate::actor::record::state_root`]).
    pub state_root: PathBuf,
    /// The node's claims on actors ([`crate::actor::claim`]).
    pub claim_dir: PathBuf,
    /// Restores with lazy pages (memory served on demand; a checkout
    /// streamed when only the object tier has the snapshot).
    pub lazy_pages: bool,
}

impl Config {
    /// The node's: its state root and claim directory, lazy pages unless
    /// `TORPOR_LAZY_PAGES=0`.
    pub fn from_env() -> Config {
        Config {
            state_root: crate::actor::record::state_root(),
            claim_dir: crate::actor::claim::claim_dir(),
            lazy_pages: std::env::var("TORPOR_LAZY_PAGES").map(|v| v != "0").unwrap_or(true),
        }
    }
}

/// The actor of one shim, and what its operations share.
#[derive(Clone)]
pub struct Actor {
    pub(crate) tasks: Arc<dyn Containers>,
    pub(crate) store: Arc<dyn Snapshots>,
    config: Config,
    /// The record and its directory, once the first app container exists.
    slot: Arc<Mutex<Option<(record::Store, Record)>>>,
    /// Lifecycle operations one at a time (see the module doc).
    gate: Arc<tokio::sync::Mutex<()>>,
    /// Listeners held for the suspended actor.
    held: Arc<Mutex<Option<held_ports::Armed>>>,
    /// What they hold (the pod's netns and the ports), to hold it again
    /// after a failed resume.
    held_target: Arc<Mutex<Option<state::HeldTarget>>>,
    /// Where the held listeners report a real connection.
    wake: mpsc::UnboundedSender<()>,
    /// The suspended actor's TCP connections, kept in its pod's netns
    /// (their rules in, their packets watched: [`sleeping_connections`]).
    kept: Arc<Mutex<Option<state::KeptConnections>>>,
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
    frozen_watch: Arc<Mutex<Option<state::FrozenWatch>>>,
    /// Told when the freeze tier begins or ends (the window timer waits on it).
    freeze_changed: Arc<tokio::sync::Notify>,
    /// Ends of the unix connections between the containers, held while
    /// their containers are checkpointed ([`links`]).
    links: Arc<Mutex<state::HeldEnds>>,
    /// Unix ms until which the actor's lease was last confirmed to hold (0:
    /// never): by a resume, a thaw or the lease fence, which judges a
    /// missing answer by it ([`crate::trigger::fence`]).
    lease_valid_until: Arc<AtomicU64>,
    /// Unix ms at which the confirmation that gave `lease_valid_until` was
    /// asked for ([`Actor::refresh_lease`]).
    lease_asked_at: Arc<AtomicU64>,
}

/// Locks a std mutex, through a poisoned one (a panic elsewhere does not
/// make the state unreadable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Actor {
    /// `wake` receives one message per real inbound connection to a held
    /// port (see [`crate::trigger::activation`]).
    pub fn new(tasks: Arc<dyn Containers>, store: Arc<dyn Snapshots>, config: Config, wake: mpsc::UnboundedSender<()>) -> Actor {
        Actor {
            tasks,
            store,
            config,
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
            lease_asked_at: Arc::default(),
        }
    }

    /// Confirms that this node still holds the actor's lease (for shim
    /// `owner`), remembering until when ([`Actor::lease_valid_until`]).
    pub(crate) async fn confirm_lease(&self, actor: &str, owner: &str) -> Result<Option<u64>> {
        let asked = record::now_ms();
        let answer = self.store.confirm_lease(actor, owner).await;
        if let Ok(Some(until)) = answer {
            if self.lease_valid_until.fetch_max(until, Ordering::Relaxed) < until {
                self.lease_asked_at.store(asked, Ordering::Relaxed);
            }
        }
        answer
    }

    /// Confirms the lease again once the actor's processes run again after
    /// a resume (a restore, a thaw), when that took more than half of the
    /// validity the confirmation at its start gave
    /// ([`lease_half_spent`]): the lease fence judges a RUNNING actor by
    /// that validity and waits for no answer past it, so a resume slower
    /// than the validity (a restore of seconds: a large actor, a slow or
    /// emulated machine, runc's systemd driver) was frozen by the fence's
    /// first pass after it. A failed confirmation is left to the fence
    /// (logged): it freezes the actor if the lease is lost, or lapses
    /// without an answer.
    pub(crate) async fn refresh_lease(&self, actor: &str, owner: &str) {
        let asked = self.lease_asked_at.load(Ordering::Relaxed);
        if !lease_half_spent(asked, self.lease_valid_until(), record::now_ms()) {
            return;
        }
        match self.confirm_lease(actor, owner).await {
            Ok(_) => debug!(actor, valid_until = self.lease_valid_until().unwrap_or(0), "lease confirmed again after a slow resume"),
            Err(e) => warn!(actor, "the lease could not be confirmed again after the resume (the lease fence acts on it): {e}"),
        }
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

    /// An operation `op` of `rec`'s actor (from `from`) refused before it
    /// changed anything: `e`, with that context, is logged, kept in the
    /// record's `last_error`, and returned to fail with (or the error of
    /// that save).
    pub(crate) fn refused(&self, rec: &Record, op: &str, from: Option<&str>, e: Error) -> Error {
        let e = match from {
            Some(from) => e.context(&format!("{op} of actor {} from {from}", rec.actor)),
            None => e.context(&format!("{op} of actor {}", rec.actor)),
        };
        warn!(actor = rec.actor.as_str(), "{op} refused, the actor stays {}: {e}", rec.state);
        match self.update(|r| r.last_error = Some(e.to_string())) {
            Ok(()) => e,
            Err(saved) => saved,
        }
    }

    /// Waits until no lifecycle operation is under way (a kill must not
    /// land between a suspend's dump and its held ports).
    pub async fn settled(&self) {
        drop(self.gate.lock().await);
    }
}

/// Whether a lease confirmation asked for at `asked` (unix ms), valid
/// until `valid_until`, has less than half of that validity left at `now`
/// (or none: never confirmed, or run out).
pub(crate) fn lease_half_spent(asked: u64, valid_until: Option<u64>, now: u64) -> bool {
    match valid_until {
        None => true,
        Some(v) if v <= now => true,
        Some(v) => (v - now).saturating_mul(2) < v.saturating_sub(asked),
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
