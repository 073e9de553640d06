//! The store's state: what every part of it shares (the configuration, the
//! metadata database, the object tier, the local tier's paths, the per-
//! snapshot locks) and the tables each part keeps in memory (actor leases,
//! checkout pins, streamed checkouts, counters). The parts (commit, catalog,
//! fetch, upload, retention, sweep, actor leases, pins, streamed checkouts,
//! recovery, the workers) add their operations to [`Store`] in files of
//! their own, above this one; the crate root opens it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use redb::Database;
use tokio::sync::{watch, Notify};

use crate::config::StoreConfig;
use crate::db::{self, LocalState, Record, RemoteState};
use crate::error::Result;
use crate::id::{ActorName, SnapshotId};
use crate::leases::LeaseTable;
use crate::local;
use crate::pins::PinState;
use crate::remote::Remote;
use crate::snapshot::SnapshotInfo;
use crate::stats::{Observer, Stats, StoreStatus};
use crate::stream::Stream;
use crate::time::ms_to_time;
use crate::util::lock;

#[derive(Default)]
pub(crate) struct KeyLock {
    /// Shared: reading the local copy (checkout of a local copy, upload).
    /// Exclusive: creating or deleting it (fetch, evict, remove).
    pub(crate) files: Arc<tokio::sync::RwLock<()>>,
    /// One upload of a snapshot at a time.
    pub(crate) upload: tokio::sync::Mutex<()>,
}

pub(crate) struct Paths {
    pub(crate) snapshots: PathBuf,
    pub(crate) staging: PathBuf,
    pub(crate) trash: PathBuf,
}

/// The tiered snapshot store. Open with [`Store::open`].
pub struct Store {
    pub(crate) cfg: StoreConfig,
    /// Shared with blocking tasks (an actor lease's renewal is recorded off
    /// the runtime that answers `Confirm`).
    pub(crate) db: Arc<Database>,
    pub(crate) remote: Remote,
    pub(crate) paths: Paths,
    pub(crate) locks: Mutex<HashMap<String, Arc<KeyLock>>>,
    /// Read: an upload (between deciding which chunks exist and writing its
    /// manifest). Write: a chunk sweep.
    pub(crate) sweep: tokio::sync::RwLock<()>,
    /// staging id → (actor, commit in progress)
    pub(crate) stagings: Mutex<HashMap<String, (ActorName, bool)>>,
    /// Held while a staging directory is renamed into place or linked into
    /// a view: a view sees the whole staging or none of it.
    pub(crate) placing: Arc<Mutex<()>>,
    /// Pins in the object tier of this node's checkouts that fetched (path → state).
    pub(crate) pins: Mutex<HashMap<String, PinState>>,
    /// lease → view directory of a staging ([`Store::view_staging`]).
    pub(crate) views: Mutex<HashMap<String, PathBuf>>,
    /// lease → its streamed checkout ([`Store::checkout_streamed`]).
    pub(crate) streams: Mutex<HashMap<String, Arc<Stream>>>,
    /// Bumped when a streamed checkout becomes ready: a checkout of the
    /// same snapshot waiting for it joins it.
    pub(crate) stream_ready: tokio::sync::watch::Sender<u64>,
    /// Stagings committed since the daemon started → their snapshot (a
    /// second commit of one answers what the first made).
    pub(crate) committed: Mutex<HashMap<String, SnapshotId>>,
    /// Notified when a commit ends.
    pub(crate) commit_done: Notify,
    /// Local copies whose every byte this daemon hashed: when, and how their
    /// files looked then (`cfg.trust_verified_local_for`).
    pub(crate) verified: Mutex<HashMap<SnapshotId, (std::time::Instant, local::Fingerprint)>>,
    /// The actor leases this node holds (in memory and in the database) and
    /// the per-actor locks of lease operations.
    pub(crate) leases: LeaseTable,
    pub(crate) lease_worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) stats: Stats,
    pub(crate) wake: Arc<Notify>,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Store {
    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// The object tier.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Where a snapshot's local copy lives: `<root>/snapshots/<actor>/_gen/<generation:020>`.
    pub fn snapshot_dir(&self, id: &SnapshotId) -> PathBuf {
        let mut p = self.paths.snapshots.clone();
        for s in id.actor.segments() {
            p.push(s);
        }
        p.push("_gen");
        p.push(format!("{:020}", id.generation));
        p
    }

    pub(crate) fn key_lock(&self, id: &SnapshotId) -> Arc<KeyLock> {
        lock(&self.locks).entry(id.db_key()).or_default().clone()
    }

    pub(crate) fn info(&self, r: &Record) -> Result<SnapshotInfo> {
        let pins = db::lease_count(&self.db, &r.id().db_key())?;
        Ok(self.info_with_pins(r, pins))
    }

    pub(crate) fn info_with_pins(&self, r: &Record, pins: usize) -> SnapshotInfo {
        let id = r.id();
        SnapshotInfo {
            path: self.snapshot_dir(&id),
            id,
            created: ms_to_time(r.created_ms),
            logical_bytes: r.logical_bytes,
            chunk_count: r.chunk_count,
            local: r.local == LocalState::Present,
            local_state: r.local.clone(),
            remote: r.remote,
            durable: r.remote == RemoteState::Durable,
            labels: r.labels.clone(),
            last_used: ms_to_time(r.last_used_ms),
            keep_local_until: ms_to_time(r.keep_local_until_ms),
            manifest_digest: r.manifest_digest.clone(),
            pins,
            upload_attempts: r.upload_attempts,
            last_error: r.last_error.clone(),
            key_id: r.key_id.clone(),
        }
    }

    pub(crate) fn note_error(&self, msg: String) {
        self.stats.note_error(msg);
    }
}

/// What the store tells of itself.
impl Store {
    /// Who is told of each completed upload and fetch (set once; a second
    /// call is ignored and returns false).
    pub fn set_observer(&self, o: Arc<dyn Observer>) -> bool {
        self.stats.set_observer(o)
    }

    pub fn status(&self) -> StoreStatus {
        let mut st = StoreStatus { local_budget_bytes: self.cfg.local_budget_bytes, ..Default::default() };
        match (db::records(&self.db, None), db::leases(&self.db)) {
            (Ok(recs), Ok(leases)) => {
                let pinned: HashSet<String> = leases.into_iter().map(|(_, l)| l.key).collect();
                for r in recs.iter().filter(|r| !r.removing) {
                    st.snapshots += 1;
                    st.local_bytes += r.local_bytes();
                    if r.local == LocalState::Present {
                        st.local_snapshots += 1;
                        if r.remote != RemoteState::Durable {
                            st.pending_uploads += 1;
                        }
                    }
                    if pinned.contains(&r.id().db_key()) {
                        st.pinned_snapshots += 1;
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => self.note_error(format!("status: {e}")),
        }
        self.stats.fill(&mut st);
        st
    }
}
