//! The tiered snapshot store: local disk ahead of an object store.
//!
//! A snapshot is one actor's suspended state at a generation: a directory tree
//! of files plus labels. It is committed to the local tier (materialized files
//! that CRIU reads in place, plus `manifest.json`), uploaded to the object tier
//! as content-addressed, compressed chunks plus a manifest (written last: the
//! commit point), and evicted from the local tier (least recently used first,
//! never when not durable, never when pinned) when over the byte budget. See
//! `docs/STORE.md` for layouts, formats, states and crash-recovery rules.

pub mod actor_lease;
pub mod chunk;
pub mod config;
pub mod crypto;
mod db;
pub mod error;
pub mod id;
mod local;
pub mod manifest;
mod pin;
pub mod remote;
mod sweep;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use redb::Database;
use tokio::sync::{watch, Notify};
use tracing::{debug, error, info, warn};

pub use config::{ChunkingConfig, RetryConfig, StoreConfig};
pub use crypto::{Key, Keyring};
pub use db::{LocalState, RemoteState};
pub use error::{Error, Result};
pub use id::{ActorName, SnapshotId};
pub use manifest::{Entry, EntryKind, Manifest};
pub use remote::{ChunkName, Remote};
pub use sweep::{Namespace, UnreadableManifest, INTENT_TTL, SWEEP_DELETE_WINDOW};

use db::{LeaseRecord, Record, Tx};
use manifest::MANIFEST_FILE;

/// Progress of a long transfer: `(done_bytes, total_bytes)`, updated as chunks complete.
pub type Progress = watch::Sender<(u64, u64)>;

/// An empty directory on the local tier's filesystem to write a snapshot's files into.
#[derive(Clone, Debug)]
pub struct Staging {
    pub id: String,
    pub path: PathBuf,
    pub actor: ActorName,
}

#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    pub labels: BTreeMap<String, String>,
    /// Keep local-only this long before uploading (default: `StoreConfig::default_keep_local`).
    pub keep_local: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: SnapshotId,
    pub created: SystemTime,
    /// Sum of the snapshot's file sizes.
    pub logical_bytes: u64,
    pub chunk_count: u64,
    /// A complete local copy is at [`SnapshotInfo::path`].
    pub local: bool,
    pub local_state: LocalState,
    pub remote: RemoteState,
    /// The manifest is in the object tier (the local copy may be dropped).
    pub durable: bool,
    pub labels: BTreeMap<String, String>,
    pub last_used: SystemTime,
    pub keep_local_until: SystemTime,
    /// sha256 of `manifest.json`.
    pub manifest_digest: String,
    /// Leases currently pinning the local copy.
    pub pins: usize,
    pub upload_attempts: u32,
    pub last_error: Option<String>,
    /// Where the local copy is (or would be).
    pub path: PathBuf,
    /// The key the object tier's copy is sealed under (`None`: not uploaded
    /// yet, or uploaded unencrypted).
    pub key_id: Option<String>,
}

/// A verified local copy, pinned against eviction until [`Store::release`].
#[derive(Clone, Debug)]
pub struct Checkout {
    pub info: SnapshotInfo,
    pub path: PathBuf,
    pub lease: String,
    /// Fetched from the object tier by this checkout (every chunk verified).
    pub fetched: bool,
    /// Bytes of local files hashed to verify the copy (0 when fetched or verification is off).
    pub verified_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct GcPolicy {
    /// Keep this many newest snapshots per actor (≥ 1: the newest is never collected).
    pub keep_newest: usize,
    /// Only this actor (default: all).
    pub actor: Option<ActorName>,
    /// Then delete chunk objects no manifest references.
    pub sweep_chunks: bool,
    /// Unreferenced chunks younger than this (by last-modified) are kept: an
    /// upload elsewhere may be about to reference them.
    pub chunk_grace: Duration,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy { keep_newest: 2, actor: None, sweep_chunks: true, chunk_grace: Duration::from_secs(3600) }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed: Vec<SnapshotId>,
    /// Superseded but pinned: kept.
    pub kept_pinned: Vec<SnapshotId>,
    pub chunks_deleted: u64,
    pub chunk_bytes_deleted: u64,
    /// Unreferenced but younger than the grace period.
    pub chunks_kept_young: u64,
    /// Unreferenced when the sweep began, then named by an upload in
    /// progress (its intent) or a manifest written meanwhile.
    pub chunks_kept_in_use: u64,
    /// Unreferenced by what could be read, but where a manifest that cannot
    /// be read may name chunks (its key's, or all: [`UnreadableManifest::keeps`]).
    pub chunks_kept_unreadable: u64,
    /// Manifests in the object tier this node cannot read (a key it does
    /// not have, damage): kept, not collected, and their chunks kept. Also
    /// in `errors`.
    pub unreadable: Vec<UnreadableManifest>,
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct StoreStatus {
    pub local_budget_bytes: u64,
    pub local_bytes: u64,
    pub snapshots: usize,
    pub local_snapshots: usize,
    /// Snapshots with a local copy that are not durable yet.
    pub pending_uploads: usize,
    pub pinned_snapshots: usize,
    /// Over budget with nothing evictable: uploads run regardless of keep-local.
    pub disk_pressure: bool,
    /// Chunk object bytes PUT since open (after compression).
    pub uploaded_bytes: u64,
    /// Uncompressed bytes of the chunks PUT since open.
    pub uploaded_raw_bytes: u64,
    pub uploaded_chunks: u64,
    /// Chunks an upload skipped because they were known durable.
    pub deduplicated_chunks: u64,
    /// Chunks known durable that an upload checked with a HEAD before
    /// reusing them (no manifest of this node vouched for them any more).
    pub chunks_checked: u64,
    /// Of those, the ones found gone (swept by another node) and sent again.
    pub chunks_missing: u64,
    /// Uploads that waited for a chunk sweep of another node to finish.
    pub sweep_waits: u64,
    pub fetched_bytes: u64,
    /// Most recent errors of background work, newest last.
    pub last_errors: Vec<(SystemTime, String)>,
}

#[derive(Default)]
struct Stats {
    uploaded_bytes: u64,
    uploaded_raw_bytes: u64,
    uploaded_chunks: u64,
    deduplicated_chunks: u64,
    chunks_checked: u64,
    chunks_missing: u64,
    sweep_waits: u64,
    fetched_bytes: u64,
    disk_pressure: bool,
    last_errors: VecDeque<(SystemTime, String)>,
}

#[derive(Default)]
struct KeyLock {
    /// Shared: reading the local copy (checkout of a local copy, upload).
    /// Exclusive: creating or deleting it (fetch, evict, remove).
    files: tokio::sync::RwLock<()>,
    /// One upload of a snapshot at a time.
    upload: tokio::sync::Mutex<()>,
}

struct Paths {
    snapshots: PathBuf,
    staging: PathBuf,
    trash: PathBuf,
}

/// The tiered snapshot store. Open with [`Store::open`].
pub struct Store {
    cfg: StoreConfig,
    db: Database,
    remote: Remote,
    paths: Paths,
    locks: Mutex<HashMap<String, Arc<KeyLock>>>,
    /// Read: an upload (between deciding which chunks exist and writing its
    /// manifest). Write: a chunk sweep.
    sweep: tokio::sync::RwLock<()>,
    /// staging id → (actor, commit in progress)
    stagings: Mutex<HashMap<String, (ActorName, bool)>>,
    /// Held while a staging directory is renamed into place or linked into
    /// a view: a view sees the whole staging or none of it.
    placing: Arc<Mutex<()>>,
    /// Pins in the object tier of this node's checkouts that fetched (path → state).
    pins: Mutex<HashMap<String, pin::PinState>>,
    /// lease → view directory of a staging ([`Store::view_staging`]).
    views: Mutex<HashMap<String, PathBuf>>,
    /// Stagings committed since the daemon started → their snapshot (a
    /// second commit of one answers what the first made).
    committed: Mutex<HashMap<String, SnapshotId>>,
    /// Notified when a commit ends.
    commit_done: Notify,
    /// One actor-lease operation at a time on this node.
    lease_lock: tokio::sync::Mutex<()>,
    /// Serializes lease writes on object tiers without conditional updates.
    lease_fallback: tokio::sync::Mutex<()>,
    lease_worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    stats: Mutex<Stats>,
    wake: Arc<Notify>,
    shutdown: watch::Sender<bool>,
    worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn ms_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// What an upload sends: the first place of every distinct chunk (digest →
/// (file, offset, size)), their order, their object names, the key.
struct UploadPlan {
    first: HashMap<String, (PathBuf, u64, u32)>,
    order: Vec<String>,
    names: HashMap<String, ChunkName>,
    key: Option<Arc<Key>>,
}

/// A writer's staging untouched for this long is abandoned (gc drops it).
const STALE_STAGING: Duration = Duration::from_secs(24 * 3600);

fn remove_file_if_present(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", p, e)),
    }
}

fn random_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(format!("blocking task: {e}")))?
}

impl Store {
    /// Open (or create) the store: the metadata database, the object tier the
    /// URL names, recovery of interrupted work, and the background worker.
    pub async fn open(cfg: StoreConfig) -> Result<Arc<Store>> {
        cfg.validate()?;
        let remote = Remote::open(&cfg.remote_url, &cfg.remote_options, cfg.remote_max_retries, cfg.remote_retry_timeout)?;
        Self::open_with_remote(cfg, remote).await
    }

    /// Open with an already built object tier (embedding; tests inject failures
    /// through a wrapping `ObjectStore`). `remote.url` identifies the object
    /// tier in the database: a store refuses to open against a different one.
    pub async fn open_with_remote(cfg: StoreConfig, remote: Remote) -> Result<Arc<Store>> {
        cfg.validate()?;
        let root = cfg.root.clone();
        let paths = Paths { snapshots: root.join("snapshots"), staging: root.join("staging"), trash: root.join("trash") };
        for d in [&root, &paths.snapshots, &paths.staging, &paths.trash] {
            local::create_dir_all_durable(d)?;
        }
        let db_path = root.join("store.redb");
        let db = blocking(move || db::open(&db_path)).await?;
        let (shutdown, _) = watch::channel(false);
        let store = Arc::new(Store {
            cfg,
            db,
            remote,
            paths,
            locks: Mutex::new(HashMap::new()),
            sweep: tokio::sync::RwLock::new(()),
            stagings: Mutex::new(HashMap::new()),
            placing: Arc::new(Mutex::new(())),
            views: Mutex::new(HashMap::new()),
            pins: Mutex::new(HashMap::new()),
            committed: Mutex::new(HashMap::new()),
            commit_done: Notify::new(),
            lease_lock: tokio::sync::Mutex::new(()),
            lease_fallback: tokio::sync::Mutex::new(()),
            lease_worker: Mutex::new(None),
            stats: Mutex::new(Stats::default()),
            wake: Arc::new(Notify::new()),
            shutdown,
            worker: Mutex::new(None),
        });
        store.check_meta()?;
        store.recover()?;
        if store.cfg.background {
            let weak = Arc::downgrade(&store);
            let rx = store.shutdown.subscribe();
            let handle = tokio::spawn(worker(weak, store.wake.clone(), rx));
            *lock(&store.worker) = Some(handle);
        }
        {
            let weak = Arc::downgrade(&store);
            let rx = store.shutdown.subscribe();
            let handle = tokio::spawn(lease_worker(weak, store.cfg.lease_ttl / 3, rx));
            *lock(&store.lease_worker) = Some(handle);
        }
        info!(root = %store.cfg.root.display(), remote = %store.remote.url, "snapshot store open");
        let ring = &store.cfg.keyring;
        match ring.active() {
            Some(k) => info!(active = k.id(), keys = %ring.describe(), accept_unencrypted = ring.accept_unencrypted, "object tier encrypted: uploads are sealed under the active key"),
            None if store.remote.url.starts_with("file:") || store.remote.url.starts_with("memory:") => {
                info!(remote = %store.remote.url, "object tier not encrypted (a local directory; [store.encryption] seals it)")
            }
            None => warn!(remote = %store.remote.url, "object tier NOT encrypted: snapshots (process memory) are stored there in cleartext, unauthenticated; configure [store.encryption]"),
        }
        Ok(store)
    }

    fn check_meta(&self) -> Result<()> {
        let tx = Tx::begin(&self.db)?;
        match tx.meta("format")? {
            None => tx.set_meta("format", db::DB_FORMAT)?,
            Some(f) if f == db::DB_FORMAT => {}
            Some(f) => return Err(Error::InvalidConfig(format!("{}: unsupported store database format {f:?}", self.cfg.root.display()))),
        }
        match tx.meta("remote_url")? {
            None => tx.set_meta("remote_url", &self.remote.url)?,
            Some(u) if u == self.remote.url => {}
            Some(u) => {
                return Err(Error::InvalidConfig(format!(
                    "the store at {} belongs to object tier {u:?}, not {:?}: its records of durable snapshots and chunks are about that one (move or delete {} to start afresh)",
                    self.cfg.root.display(),
                    self.remote.url,
                    self.cfg.root.display()
                )))
            }
        }
        tx.commit()
    }

    /// Bring every record to a resting state after a crash: clean staging and
    /// trash, finish or undo commits, fetches and evictions, delete orphans.
    fn recover(&self) -> Result<()> {
        self.recover_stagings()?;
        local::clear_dir(&self.paths.trash)?;
        for rec in db::records(&self.db, None)? {
            let id = rec.id();
            let dir = self.snapshot_dir(&id);
            let local_ok = || -> bool {
                std::fs::read(dir.join(MANIFEST_FILE)).map(|b| chunk::sha256_hex(&b) == rec.manifest_digest).unwrap_or(false)
            };
            let mut fixed = rec.clone();
            match &rec.local {
                LocalState::Committing { .. } => {
                    if local_ok() {
                        fixed.local = LocalState::Present;
                    } else {
                        // The commit never returned: drop it (the generation stays used).
                        warn!(snapshot = %id, "recovery: dropping interrupted commit");
                        local::remove_tree(&dir, &self.paths.trash)?;
                        let tx = Tx::begin(&self.db)?;
                        tx.delete(&id)?;
                        tx.commit()?;
                        continue;
                    }
                }
                LocalState::Fetching { .. } => {
                    if local_ok() {
                        fixed.local = LocalState::Present;
                    } else {
                        info!(snapshot = %id, "recovery: interrupted fetch discarded");
                        local::remove_tree(&dir, &self.paths.trash)?;
                        fixed.local = LocalState::Absent;
                    }
                }
                LocalState::Evicting => {
                    info!(snapshot = %id, "recovery: finishing interrupted eviction");
                    local::remove_tree(&dir, &self.paths.trash)?;
                    fixed.local = LocalState::Absent;
                }
                LocalState::Present if !local_ok() => {
                    error!(snapshot = %id, dir = %dir.display(), "recovery: local copy missing or its manifest changed");
                    local::remove_tree(&dir, &self.paths.trash)?;
                    fixed.local = LocalState::Absent;
                    fixed.last_error = Some(format!("local copy at {} was missing or damaged at open", dir.display()));
                }
                LocalState::Present | LocalState::Absent => {}
            }
            if fixed.local != rec.local || fixed.last_error != rec.last_error {
                let tx = Tx::begin(&self.db)?;
                tx.put(&fixed)?;
                tx.commit()?;
            }
        }
        self.remove_orphans()
    }

    /// Snapshot directories no record accounts for (a commit that crashed
    /// before its record, a record removed before its files).
    fn remove_orphans(&self) -> Result<()> {
        fn walk(store: &Store, dir: &Path, rel: &str) -> Result<()> {
            let rd = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| Error::io("list", dir, e))?;
                let p = entry.path();
                let name = entry.file_name().to_string_lossy().to_string();
                if !p.is_dir() {
                    continue;
                }
                if name == "_gen" {
                    let actor = ActorName::new(rel).ok();
                    let rd = std::fs::read_dir(&p).map_err(|e| Error::io("list", &p, e))?;
                    for g in rd {
                        let g = g.map_err(|e| Error::io("list", &p, e))?;
                        let generation = g.file_name().to_string_lossy().parse::<u64>().ok();
                        let keep = match (&actor, generation) {
                            (Some(a), Some(n)) => db::record(&store.db, &SnapshotId::new(a.clone(), n))?
                                .is_some_and(|r| r.local != LocalState::Absent),
                            _ => false,
                        };
                        if !keep {
                            warn!(path = %g.path().display(), "recovery: removing orphaned snapshot directory");
                            local::remove_tree(&g.path(), &store.paths.trash)?;
                        }
                    }
                } else {
                    let rel = if rel.is_empty() { name } else { format!("{rel}/{name}") };
                    walk(store, &p, &rel)?;
                }
            }
            Ok(())
        }
        walk(self, &self.paths.snapshots, "")
    }

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

    fn key_lock(&self, id: &SnapshotId) -> Arc<KeyLock> {
        lock(&self.locks).entry(id.db_key()).or_default().clone()
    }

    fn info(&self, r: &Record) -> Result<SnapshotInfo> {
        let pins = db::lease_count(&self.db, &r.id().db_key())?;
        Ok(self.info_with_pins(r, pins))
    }

    fn info_with_pins(&self, r: &Record, pins: usize) -> SnapshotInfo {
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

    fn note_error(&self, msg: String) {
        let mut s = lock(&self.stats);
        s.last_errors.push_back((SystemTime::now(), msg));
        while s.last_errors.len() > 32 {
            s.last_errors.pop_front();
        }
    }

    // ----- staging and commit -----

    /// An empty staging directory for a new snapshot of `actor`.
    pub async fn begin(&self, actor: &ActorName) -> Result<Staging> {
        let id = random_id();
        let path = self.paths.staging.join(&id);
        std::fs::create_dir(&path).map_err(|e| Error::io("create staging directory", &path, e))?;
        // The sidecar names the actor: a staging survives a restart of the
        // daemon (a shim may have dumped an actor into it and not committed yet).
        local::write_atomic(&self.staging_sidecar(&id), actor.as_str().as_bytes())?;
        lock(&self.stagings).insert(id.clone(), (actor.clone(), false));
        debug!(actor = %actor, staging = %id, "staging begun");
        Ok(Staging { id, path, actor: actor.clone() })
    }

    /// Drop a staging directory that will not be committed.
    pub async fn abort(&self, staging_id: &str) -> Result<()> {
        {
            let mut st = lock(&self.stagings);
            match st.get(staging_id) {
                None => return Err(Error::StagingNotFound(staging_id.to_string())),
                Some((_, true)) => return Err(Error::InvalidArgument(format!("staging {staging_id:?} is being committed"))),
                Some(_) => {
                    st.remove(staging_id);
                }
            }
        }
        local::remove_tree(&self.paths.staging.join(staging_id), &self.paths.trash)?;
        remove_file_if_present(&self.staging_sidecar(staging_id))
    }

    /// A reader's view of a writer's staging that is not committed yet (the
    /// resume of an actor right after its suspend, while the commit hashes
    /// the dump): hard links to its files in a directory of their own, which
    /// the commit's rename does not move, released with [`Store::release`].
    /// The files are the dump the writer made on this node; the commit
    /// verifies nothing a reader could check sooner. `StagingNotFound` once
    /// the staging is committed (check the snapshot out instead) or aborted.
    pub async fn view_staging(&self, staging_id: &str) -> Result<(PathBuf, String)> {
        let lease = random_id();
        let view = self.paths.staging.join(format!("{lease}.view"));
        let src = self.paths.staging.join(staging_id);
        {
            let st = lock(&self.stagings);
            if !st.contains_key(staging_id) {
                return Err(Error::StagingNotFound(staging_id.to_string()));
            }
        }
        let (placing, v, id) = (self.placing.clone(), view.clone(), staging_id.to_string());
        let trash = self.paths.trash.clone();
        blocking(move || {
            let _placing = lock(&placing);
            if !src.is_dir() {
                return Err(Error::StagingNotFound(id));
            }
            local::link_tree(&src, &v).inspect_err(|_| {
                let _ = local::remove_tree(&v, &trash);
            })
        })
        .await?;
        lock(&self.views).insert(lease.clone(), view.clone());
        debug!(staging = staging_id, view = %view.display(), "staging viewed");
        Ok((view, lease))
    }

    /// `<root>/staging/<id>.actor`: the actor a writer's staging belongs to.
    fn staging_sidecar(&self, staging_id: &str) -> PathBuf {
        self.paths.staging.join(format!("{staging_id}.actor"))
    }

    /// After a restart: writers' stagings (those with an actor sidecar) are
    /// kept and can still be committed or aborted; anything else there (a
    /// fetch or commit cut short) is removed.
    fn recover_stagings(&self) -> Result<()> {
        let dir = &self.paths.staging;
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
        let mut kept = HashMap::new();
        let mut remove = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                let actor = std::fs::read_to_string(self.staging_sidecar(&name)).ok().and_then(|a| ActorName::new(a).ok());
                match actor {
                    Some(a) => {
                        kept.insert(name, (a, false));
                    }
                    None => remove.push(p),
                }
            } else if !(name.ends_with(".actor") && self.paths.staging.join(name.trim_end_matches(".actor")).is_dir()) {
                remove.push(p);
            }
        }
        for p in remove {
            if p.is_dir() {
                local::remove_tree(&p, &self.paths.trash)?;
            } else {
                remove_file_if_present(&p)?;
            }
        }
        if !kept.is_empty() {
            info!(stagings = kept.len(), "recovery: kept writers' stagings (not committed yet)");
        }
        *lock(&self.stagings) = kept;
        Ok(())
    }

    /// Turn a staging directory into the actor's next generation: chunk and
    /// digest its files, fsync them, write the manifest, rename into the local
    /// tier. The snapshot is then local (not yet durable).
    ///
    /// Committing a staging again (a writer whose answer was lost, or the
    /// cleanup after a shim died during its commit) waits for a commit in
    /// progress and answers the snapshot it made.
    pub async fn commit(&self, staging_id: &str, opts: CommitOptions) -> Result<SnapshotInfo> {
        let actor = loop {
            let done = self.commit_done.notified();
            {
                let mut st = lock(&self.stagings);
                match st.get_mut(staging_id) {
                    None => {
                        let made = lock(&self.committed).get(staging_id).cloned();
                        return match made.map(|id| db::record(&self.db, &id)).transpose()?.flatten() {
                            Some(rec) if !rec.removing => self.info(&rec),
                            _ => Err(Error::StagingNotFound(staging_id.to_string())),
                        };
                    }
                    Some((actor, busy)) if !*busy => {
                        *busy = true;
                        break actor.clone();
                    }
                    Some(_) => {}
                }
            }
            debug!(staging = staging_id, "waiting for the commit of this staging in progress");
            done.await;
        };
        // A commit cut short (its future dropped) frees the staging for the next.
        struct Busy<'a>(&'a Store, &'a str, bool);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    if let Some((_, busy)) = lock(&self.0.stagings).get_mut(self.1) {
                        *busy = false;
                    }
                    self.0.commit_done.notify_waiters();
                }
            }
        }
        let mut guard = Busy(self, staging_id, false);
        let res = self.commit_inner(staging_id, &actor, opts).await;
        guard.2 = true;
        if res.is_ok() {
            if let Err(e) = remove_file_if_present(&self.staging_sidecar(staging_id)) {
                warn!(staging = staging_id, error = %e, "committed, but its staging sidecar stays");
            }
        }
        {
            let mut st = lock(&self.stagings);
            match &res {
                Ok(info) => {
                    st.remove(staging_id);
                    let mut made = lock(&self.committed);
                    if made.len() >= 4096 {
                        made.clear();
                    }
                    made.insert(staging_id.to_string(), info.id.clone());
                }
                Err(_) => {
                    if let Some((_, busy)) = st.get_mut(staging_id) {
                        *busy = false;
                    }
                }
            }
        }
        self.commit_done.notify_waiters();
        res
    }

    async fn commit_inner(&self, staging_id: &str, actor: &ActorName, opts: CommitOptions) -> Result<SnapshotInfo> {
        let started = std::time::Instant::now();
        let staging = self.paths.staging.join(staging_id);
        let chunking = self.cfg.chunking;
        let dir = staging.clone();
        let entries = blocking(move || local::build_entries(&dir, &chunking)).await?;
        let logical_bytes: u64 = entries.iter().map(|e| e.size).sum();
        let chunk_count: u64 = entries.iter().map(|e| e.chunks.len() as u64).sum();
        let now = now_ms();
        let keep_local = opts.keep_local.unwrap_or(self.cfg.default_keep_local);

        // Assign the generation and record the commit (Committing) before the rename.
        let tx = Tx::begin(&self.db)?;
        let generation = tx.generation(actor)? + 1;
        let manifest = Manifest {
            format: manifest::MANIFEST_FORMAT,
            actor: actor.clone(),
            generation,
            created_ms: now,
            labels: opts.labels.clone(),
            chunker: "fastcdc-2020".into(),
            chunking,
            hash: "sha256".into(),
            encryption: None,
            logical_bytes,
            entries,
        };
        let (bytes, digest) = manifest.to_bytes().map_err(Error::Internal)?;
        let rec = Record {
            actor: actor.clone(),
            generation,
            created_ms: now,
            logical_bytes,
            chunk_count,
            labels: opts.labels,
            last_used_ms: now,
            keep_local_until_ms: now.saturating_add(keep_local.as_millis() as u64),
            manifest_digest: digest,
            local: LocalState::Committing { staging: staging_id.to_string() },
            remote: RemoteState::Absent,
            removing: false,
            upload_now: false,
            upload_attempts: 0,
            next_attempt_ms: 0,
            last_error: None,
            key_id: None,
        };
        tx.see_generation(actor, generation)?;
        tx.put(&rec)?;
        tx.commit()?;

        let id = rec.id();
        let target = self.snapshot_dir(&id);
        let placed = {
            let staging = staging.clone();
            let target = target.clone();
            let placing = self.placing.clone();
            blocking(move || {
                let _placing = lock(&placing);
                local::write_atomic(&staging.join(MANIFEST_FILE), &bytes)?;
                let parent = target.parent().ok_or_else(|| Error::Internal("snapshot dir has no parent".into()))?;
                local::create_dir_all_durable(parent)?;
                std::fs::rename(&staging, &target).map_err(|e| Error::io("rename staging into place", &target, e))?;
                local::fsync_dir(parent)?;
                if let Some(p) = staging.parent() {
                    local::fsync_dir(p)?;
                }
                Ok(())
            })
            .await
        };
        if let Err(e) = placed {
            // Undo: the commit did not happen (the generation stays used).
            if target.exists() {
                let _ = std::fs::rename(&target, &staging);
            }
            let tx = Tx::begin(&self.db)?;
            tx.delete(&id)?;
            tx.commit()?;
            return Err(e);
        }
        let mut rec = rec;
        rec.local = LocalState::Present;
        let tx = Tx::begin(&self.db)?;
        tx.put(&rec)?;
        tx.commit()?;
        info!(snapshot = %id, bytes = logical_bytes, chunks = chunk_count, ms = started.elapsed().as_millis() as u64, "snapshot committed");
        self.wake.notify_one();
        Ok(self.info_with_pins(&rec, 0))
    }

    // ----- queries -----

    /// Snapshots this node's database knows (local ones, uploaded ones, and
    /// remote ones seen by `latest`, `checkout`, `refresh` or `gc`), by actor
    /// and generation. [`Store::refresh`] first to include every remote one.
    pub async fn list(&self, actor: Option<&ActorName>) -> Result<Vec<SnapshotInfo>> {
        let leases = db::leases(&self.db)?;
        let mut pins: HashMap<String, usize> = HashMap::new();
        for (_, l) in leases {
            *pins.entry(l.key).or_default() += 1;
        }
        Ok(db::records(&self.db, actor)?
            .into_iter()
            .filter(|r| !r.removing)
            .map(|r| {
                let p = pins.get(&r.id().db_key()).copied().unwrap_or(0);
                self.info_with_pins(&r, p)
            })
            .collect())
    }

    /// Import the object tier's snapshots (of `actor`, or all) this database
    /// does not know. Returns how many were imported.
    pub async fn refresh(&self, actor: Option<&ActorName>) -> Result<usize> {
        let ids = match actor {
            Some(a) => self.remote.generations(a).await?.into_iter().map(|g| SnapshotId::new(a.clone(), g)).collect(),
            None => self.remote.all_snapshots().await?,
        };
        let mut n = 0;
        for id in ids {
            if db::record(&self.db, &id)?.is_none() {
                self.import(&id).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The newest snapshot of `actor` in either tier (asks the object tier).
    pub async fn latest(&self, actor: &ActorName) -> Result<Option<SnapshotInfo>> {
        let local_max = self.latest_local(actor).await?;
        let remote_max = self.remote.generations(actor).await?.last().copied();
        self.check_lease_floor(actor, local_max.as_ref().map(|l| l.id.generation).max(remote_max))?;
        match (local_max, remote_max) {
            (Some(l), Some(r)) if r > l.id.generation => Ok(Some(self.record_or_import(&SnapshotId::new(actor.clone(), r)).await?)),
            (None, Some(r)) => Ok(Some(self.record_or_import(&SnapshotId::new(actor.clone(), r)).await?)),
            (l, _) => Ok(l),
        }
    }

    /// The newest snapshot of `actor` this database knows, without asking the object tier.
    pub async fn latest_local(&self, actor: &ActorName) -> Result<Option<SnapshotInfo>> {
        let recs = db::records(&self.db, Some(actor))?;
        recs.iter()
            .rev()
            .find(|r| !r.removing && (r.local == LocalState::Present || r.remote == RemoteState::Durable))
            .map(|r| self.info(r))
            .transpose()
    }

    async fn record_or_import(&self, id: &SnapshotId) -> Result<SnapshotInfo> {
        let rec = match db::record(&self.db, id)? {
            Some(r) if !r.removing => r,
            Some(_) => return Err(Error::NotFound(id.clone())),
            None => self.import(id).await?,
        };
        self.info(&rec)
    }

    /// Record a snapshot found in the object tier (durable, not local).
    async fn import(&self, id: &SnapshotId) -> Result<Record> {
        let bytes = self.remote.get_manifest(id).await?.ok_or_else(|| Error::NotFound(id.clone()))?;
        let opened = crypto::open_manifest(&self.cfg.keyring, id, &bytes)?;
        let (bytes, key_id) = (opened.plain, opened.key.map(|k| k.id().to_string()));
        let m = Manifest::parse(&bytes, Some(id)).map_err(|what| Error::Corrupt { id: id.clone(), what: format!("manifest in the object tier: {what}") })?;
        let now = now_ms();
        let rec = Record {
            actor: id.actor.clone(),
            generation: id.generation,
            created_ms: m.created_ms,
            logical_bytes: m.logical_bytes,
            chunk_count: m.entries.iter().map(|e| e.chunks.len() as u64).sum(),
            labels: m.labels.clone(),
            last_used_ms: 0,
            keep_local_until_ms: now,
            manifest_digest: chunk::sha256_hex(&bytes),
            local: LocalState::Absent,
            remote: RemoteState::Durable,
            removing: false,
            upload_now: false,
            upload_attempts: 0,
            next_attempt_ms: 0,
            last_error: None,
            key_id,
        };
        let tx = Tx::begin(&self.db)?;
        if let Some(existing) = tx.get(id)? {
            return Ok(existing);
        }
        tx.see_generation(&id.actor, id.generation)?;
        tx.put(&rec)?;
        tx.commit()?;
        info!(snapshot = %id, "imported from the object tier");
        Ok(rec)
    }

    /// A snapshot's record and manifest (from the local copy when there is
    /// one, else from the object tier), checked against the recorded digest.
    pub async fn inspect(&self, id: &SnapshotId) -> Result<(SnapshotInfo, Manifest)> {
        let info = self.record_or_import(id).await?;
        let bytes = if info.local {
            let p = info.path.join(MANIFEST_FILE);
            std::fs::read(&p).map_err(|e| Error::io("read manifest", &p, e))?
        } else {
            let bytes = self.remote.get_manifest(id).await?.ok_or_else(|| Error::Corrupt { id: id.clone(), what: format!("manifest missing from the object tier at {}", self.remote.manifest_path(id)) })?;
            crypto::open_manifest(&self.cfg.keyring, id, &bytes)?.plain
        };
        let m = self.check_manifest(id, &bytes, &info.manifest_digest, if info.local { "local" } else { "object tier" })?;
        Ok((info, m))
    }

    /// Open a manifest read from the object tier to restore from it: a
    /// sealed one with the ring's key; a plaintext one only when this store
    /// has no keys or accepts unencrypted snapshots (otherwise anyone who can
    /// write the bucket could plant a snapshot).
    fn open_for_restore(&self, id: &SnapshotId, bytes: &[u8]) -> Result<(Vec<u8>, Option<Arc<Key>>)> {
        let ring = &self.cfg.keyring;
        let o = crypto::open_manifest(ring, id, bytes)?;
        if o.key.is_none() && !ring.is_empty() && !ring.accept_unencrypted {
            return Err(Error::Corrupt {
                id: id.clone(),
                what: format!(
                    "the manifest in the object tier ({}) is not encrypted and this node requires encryption: refused ([store.encryption] accept_unencrypted = true reads snapshots uploaded before encryption was turned on)",
                    self.remote.manifest_path(id)
                ),
            });
        }
        Ok((o.plain, o.key))
    }

    /// Where each chunk of a durable snapshot is in the object tier (digest
    /// → object key); empty when it is not durable or sealed under a key
    /// this node does not have.
    pub fn chunk_objects(&self, info: &SnapshotInfo, m: &Manifest) -> BTreeMap<String, String> {
        if !info.durable {
            return BTreeMap::new();
        }
        let key = match &info.key_id {
            None => None,
            Some(k) => match self.cfg.keyring.get(k) {
                Some(key) => Some(key.clone()),
                None => return BTreeMap::new(),
            },
        };
        m.unique_chunks().into_iter().map(|c| (c.digest.clone(), self.remote.chunk_path(&ChunkName::of(key.as_deref(), &c.digest)).to_string())).collect()
    }

    fn check_manifest(&self, id: &SnapshotId, bytes: &[u8], digest: &str, tier: &str) -> Result<Manifest> {
        let actual = chunk::sha256_hex(bytes);
        if actual != digest {
            return Err(Error::Corrupt {
                id: id.clone(),
                what: format!("{tier} manifest ({} bytes) has sha256:{actual}, recorded sha256:{digest} (truncated or garbled)", bytes.len()),
            });
        }
        Manifest::parse(bytes, Some(id)).map_err(|what| Error::Corrupt { id: id.clone(), what: format!("{tier} manifest: {what}") })
    }

    // ----- checkout -----

    /// A verified local copy of the snapshot, pinned until [`Store::release`]:
    /// fetched from the object tier when not local (chunks in parallel, each
    /// verified, into staging, then renamed into place); a local copy is
    /// verified against the manifest (unless `verify_local_on_checkout` is off).
    pub async fn checkout(&self, id: &SnapshotId, progress: Option<Progress>) -> Result<Checkout> {
        self.record_or_import(id).await?;
        let kl = self.key_lock(id);
        {
            let _shared = kl.files.read().await;
            let rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
            if rec.removing {
                return Err(Error::NotFound(id.clone()));
            }
            if rec.local == LocalState::Present {
                return self.pin_local(rec, progress).await;
            }
        }
        let _excl = kl.files.write().await;
        let rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        if rec.removing {
            return Err(Error::NotFound(id.clone()));
        }
        match rec.local {
            LocalState::Present => self.pin_local(rec, progress).await,
            LocalState::Absent => self.fetch(rec, progress).await,
            ref other => Err(Error::Internal(format!("snapshot {id} is in local state {other:?} outside any operation"))),
        }
    }

    async fn pin_local(&self, rec: Record, progress: Option<Progress>) -> Result<Checkout> {
        let id = rec.id();
        let dir = self.snapshot_dir(&id);
        let mpath = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io("read manifest", &mpath, e))?;
        let m = self.check_manifest(&id, &bytes, &rec.manifest_digest, "local")?;
        let mut verified_bytes = 0;
        if self.cfg.verify_local_on_checkout {
            let started = std::time::Instant::now();
            let d = dir.clone();
            let m2 = m.clone();
            blocking(move || Ok(local::verify_tree(&d, &m2)))
                .await?
                .map_err(|what| Error::Corrupt { id: id.clone(), what: format!("local copy at {}: {what}", dir.display()) })?;
            verified_bytes = m.logical_bytes;
            let secs = started.elapsed().as_secs_f64();
            debug!(snapshot = %id, bytes = verified_bytes, mib_per_s = (verified_bytes as f64 / 1048576.0 / secs.max(1e-9)) as u64, "local copy verified");
        }
        if let Some(p) = progress {
            let _ = p.send((m.logical_bytes, m.logical_bytes));
        }
        let lease = self.add_lease(&id, None, None)?;
        let rec = db::record(&self.db, &id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        Ok(Checkout { info: self.info(&rec)?, path: dir, lease, fetched: false, verified_bytes })
    }

    fn add_lease(&self, id: &SnapshotId, new_local: Option<LocalState>, remote_pin: Option<String>) -> Result<String> {
        let lease = random_id();
        let tx = Tx::begin(&self.db)?;
        let mut rec = tx.get(id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        rec.last_used_ms = now_ms();
        if let Some(l) = new_local {
            rec.local = l;
        }
        tx.put(&rec)?;
        tx.put_lease(&lease, &LeaseRecord { key: id.db_key(), created_ms: now_ms(), remote_pin })?;
        tx.commit()?;
        Ok(lease)
    }

    async fn fetch(&self, rec: Record, progress: Option<Progress>) -> Result<Checkout> {
        let id = rec.id();
        let started = std::time::Instant::now();
        let staging_id = random_id();
        let staging = self.paths.staging.join(&staging_id);
        {
            let tx = Tx::begin(&self.db)?;
            let mut r = rec.clone();
            r.local = LocalState::Fetching { staging: staging_id.clone() };
            tx.put(&r)?;
            tx.commit()?;
        }
        let res = self.fetch_into(&rec, &staging, progress).await;
        match res {
            Ok(pin) => {
                let lease = match self.add_lease(&id, Some(LocalState::Present), Some(pin.clone())) {
                    Ok(l) => l,
                    Err(e) => {
                        self.drop_pin(&pin).await;
                        return Err(e);
                    }
                };
                let rec = db::record(&self.db, &id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
                info!(snapshot = %id, bytes = rec.logical_bytes, ms = started.elapsed().as_millis() as u64, "fetched from the object tier");
                self.wake.notify_one();
                Ok(Checkout { info: self.info(&rec)?, path: self.snapshot_dir(&id), lease, fetched: true, verified_bytes: 0 })
            }
            Err(e) => {
                let _ = local::remove_tree(&staging, &self.paths.trash);
                let tx = Tx::begin(&self.db)?;
                if let Some(mut r) = tx.get(&id)? {
                    r.local = LocalState::Absent;
                    tx.put(&r)?;
                }
                tx.commit()?;
                warn!(snapshot = %id, error = %e, "fetch failed");
                Err(match e {
                    e @ (Error::Corrupt { .. } | Error::NotFound(_) | Error::UnknownKey { .. }) => e,
                    other => Error::FetchFailed { id: id.clone(), source: Box::new(other) },
                })
            }
        }
    }

    /// Fetch into `staging` and rename into place; returns the checkout pin
    /// written in the object tier (`store::pin`).
    async fn fetch_into(&self, rec: &Record, staging: &Path, progress: Option<Progress>) -> Result<String> {
        let id = rec.id();
        let mpath = self.remote.manifest_path(&id);
        let bytes = self
            .remote
            .get_manifest(&id)
            .await?
            .ok_or_else(|| Error::Corrupt { id: id.clone(), what: format!("manifest missing from the object tier at {mpath}") })?;
        let (bytes, key) = self.open_for_restore(&id, &bytes)?;
        if let Some(was) = &rec.key_id {
            if key.as_ref().map(|k| k.id()) != Some(was.as_str()) {
                return Err(Error::Corrupt {
                    id: id.clone(),
                    what: format!("uploaded sealed under key {was:?}, the object tier's manifest ({mpath}) is {}", key.map_or("not encrypted".to_string(), |k| format!("sealed under key {:?}", k.id()))),
                });
            }
        }
        let m = self.check_manifest(&id, &bytes, &rec.manifest_digest, "object tier")?;
        // Pinned in the object tier before any chunk is fetched; the
        // manifest still there after that: a removal from now on finds the
        // pin, a sweep that has not seen the pin saw the manifest.
        let names: Vec<ChunkName> = m.unique_chunks().into_iter().map(|c| ChunkName::of(key.as_deref(), &c.digest)).collect();
        let pin = self.write_pin(&id, key.as_ref(), &names).await?;
        let res = match self.remote.manifest_exists(&id).await {
            Ok(true) => self.fetch_chunks_into(&id, staging, m, bytes, key, progress, &pin).await,
            Ok(false) => {
                warn!(snapshot = %id, "the snapshot was removed from the object tier as its fetch began");
                Err(Error::NotFound(id.clone()))
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => Ok(pin),
            Err(e) => {
                self.drop_pin(&pin).await;
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn fetch_chunks_into(
        &self,
        id: &SnapshotId,
        staging: &Path,
        m: Manifest,
        bytes: Vec<u8>,
        key: Option<Arc<Key>>,
        progress: Option<Progress>,
        pin: &str,
    ) -> Result<()> {
        let id = id.clone();
        std::fs::create_dir(staging).map_err(|e| Error::io("create fetch staging", staging, e))?;
        let (root, m2) = (staging.to_path_buf(), m.clone());
        let paths = blocking(move || local::materialize_skeleton(&root, &m2)).await?;
        // digest → (size, [(file, offset)])
        let mut files: Vec<Option<Arc<std::fs::File>>> = Vec::with_capacity(paths.len());
        let mut wanted: HashMap<String, (u32, Vec<(usize, u64)>)> = HashMap::new();
        let mut order = Vec::new();
        for (i, e) in m.entries.iter().enumerate() {
            if e.kind != EntryKind::File {
                files.push(None);
                continue;
            }
            let f = std::fs::OpenOptions::new().write(true).open(&paths[i]).map_err(|err| Error::io("open", &paths[i], err))?;
            files.push(Some(Arc::new(f)));
            let mut off = 0u64;
            for c in &e.chunks {
                let slot = wanted.entry(c.digest.clone()).or_insert_with(|| {
                    order.push(c.digest.clone());
                    (c.size, Vec::new())
                });
                slot.1.push((i, off));
                off += c.size as u64;
            }
        }
        let total = m.logical_bytes;
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        if let Some(p) = &progress {
            let _ = p.send((0, total));
        }
        let files = Arc::new(files);
        let wanted = Arc::new(wanted);
        let stream = futures::stream::iter(order.into_iter().map(|digest| {
            let (files, wanted, done, progress, id, key) = (files.clone(), wanted.clone(), done.clone(), progress.clone(), id.clone(), key.clone());
            async move {
                let name = ChunkName::of(key.as_deref(), &digest);
                let path = self.remote.chunk_path(&name);
                let object = match self.remote.get_chunk(&name).await {
                    Ok(o) => o,
                    Err(Error::Remote { source, .. }) if matches!(*source, object_store::Error::NotFound { .. }) => {
                        return Err(Error::Corrupt { id, what: format!("chunk sha256:{digest} is missing from the object tier ({path})") })
                    }
                    Err(e) => return Err(e),
                };
                let fetched = object.len() as u64;
                let written = blocking(move || {
                    let (size, places) = wanted.get(&digest).ok_or_else(|| Error::Internal("unknown chunk".into()))?;
                    let data = match &key {
                        None => chunk::decode(&object, &digest, *size),
                        Some(k) => chunk::decode_sealed(&object, &digest, *size, k, name.hex()),
                    }
                    .map_err(|what| Error::Corrupt { id: id.clone(), what: format!("chunk sha256:{digest} in the object tier ({path}): {what}") })?;
                    let mut n = 0u64;
                    for (fi, off) in places {
                        use std::os::unix::fs::FileExt;
                        let f = files[*fi].as_ref().ok_or_else(|| Error::Internal("chunk of a directory".into()))?;
                        f.write_all_at(&data, *off).map_err(|e| Error::io("write fetched chunk", format!("file #{fi}"), e))?;
                        n += data.len() as u64;
                    }
                    Ok(n)
                })
                .await?;
                let d = done.fetch_add(written, std::sync::atomic::Ordering::Relaxed) + written;
                if let Some(p) = &progress {
                    let _ = p.send((d, total));
                }
                Ok::<u64, Error>(fetched)
            }
        }))
        .buffer_unordered(self.cfg.fetch_concurrency);
        let mut stream = Box::pin(stream);
        while let Some(fetched) = stream.next().await {
            lock(&self.stats).fetched_bytes += fetched?;
            self.renew_pin_if_due(pin, &id).await?;
        }
        drop(stream);
        drop(files);
        let (root, target) = (staging.to_path_buf(), self.snapshot_dir(&id));
        blocking(move || {
            local::finish_tree(&root, &m)?;
            local::write_atomic(&root.join(MANIFEST_FILE), &bytes)?;
            let parent = target.parent().ok_or_else(|| Error::Internal("snapshot dir has no parent".into()))?;
            local::create_dir_all_durable(parent)?;
            std::fs::rename(&root, &target).map_err(|e| Error::io("rename fetched snapshot into place", &target, e))?;
            local::fsync_dir(parent)
        })
        .await
    }

    /// Drop a pin taken by [`Store::checkout`].
    pub async fn release(&self, lease: &str) -> Result<()> {
        let view = lock(&self.views).remove(lease);
        if let Some(view) = view {
            let trash = self.paths.trash.clone();
            return blocking(move || local::remove_tree(&view, &trash)).await;
        }
        let tx = Tx::begin(&self.db)?;
        let l = tx.remove_lease(lease)?.ok_or_else(|| Error::LeaseNotFound(lease.to_string()))?;
        if let Some(id) = SnapshotId::from_db_key(&l.key) {
            if let Some(mut r) = tx.get(&id)? {
                r.last_used_ms = now_ms();
                tx.put(&r)?;
            }
        }
        tx.commit()?;
        if let Some(pin) = &l.remote_pin {
            self.drop_pin(pin).await;
        }
        self.wake.notify_one();
        Ok(())
    }

    // ----- upload -----

    /// Upload a snapshot now (idempotent: a durable one returns at once). On
    /// failure the snapshot stays queued for the background uploader.
    pub async fn upload(&self, id: &SnapshotId, progress: Option<Progress>) -> Result<SnapshotInfo> {
        let rec = db::record(&self.db, id)?.filter(|r| !r.removing).ok_or_else(|| Error::NotFound(id.clone()))?;
        if rec.remote == RemoteState::Durable {
            return self.info(&rec);
        }
        if !rec.upload_now {
            let tx = Tx::begin(&self.db)?;
            if let Some(mut r) = tx.get(id)? {
                r.upload_now = true;
                tx.put(&r)?;
            }
            tx.commit()?;
        }
        match self.upload_once(id, progress).await {
            Ok(info) => Ok(info),
            Err(e) => {
                self.upload_failed(id, &e);
                Err(match e {
                    e @ (Error::Corrupt { .. } | Error::NotFound(_) | Error::Conflict { .. } | Error::NoLocalCopy { .. }) => e,
                    other => Error::UploadFailed { id: id.clone(), source: Box::new(other) },
                })
            }
        }
    }

    fn upload_failed(&self, id: &SnapshotId, e: &Error) {
        let res = (|| -> Result<()> {
            let tx = Tx::begin(&self.db)?;
            if let Some(mut r) = tx.get(id)? {
                r.upload_attempts = r.upload_attempts.saturating_add(1);
                r.next_attempt_ms = now_ms() + self.cfg.retry.delay(r.upload_attempts).as_millis() as u64;
                r.last_error = Some(e.to_string());
                tx.put(&r)?;
            }
            tx.commit()
        })();
        if let Err(db_err) = res {
            error!(snapshot = %id, error = %db_err, "recording an upload failure");
        }
        warn!(snapshot = %id, error = %e, "upload failed");
        self.note_error(format!("upload {id}: {e}"));
    }

    async fn upload_once(&self, id: &SnapshotId, progress: Option<Progress>) -> Result<SnapshotInfo> {
        let kl = self.key_lock(id);
        let _one = kl.upload.lock().await;
        let _files = kl.files.read().await;
        let _sweep = self.sweep.read().await;
        let started = std::time::Instant::now();
        let rec = db::record(&self.db, id)?.filter(|r| !r.removing).ok_or_else(|| Error::NotFound(id.clone()))?;
        if rec.remote == RemoteState::Durable {
            return self.info(&rec);
        }
        if rec.local != LocalState::Present {
            return Err(Error::NoLocalCopy { id: id.clone(), op: "upload", state: format!("{:?}", rec.local) });
        }
        if rec.remote != RemoteState::Uploading {
            let tx = Tx::begin(&self.db)?;
            let mut r = rec.clone();
            r.remote = RemoteState::Uploading;
            tx.put(&r)?;
            tx.commit()?;
        }
        let dir = self.snapshot_dir(id);
        let mpath = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io("read manifest", &mpath, e))?;
        let m = self.check_manifest(id, &bytes, &rec.manifest_digest, "local")?;

        // First occurrence of every distinct chunk.
        let mut first: HashMap<String, (PathBuf, u64, u32)> = HashMap::new();
        let mut order = Vec::new();
        for e in m.entries.iter().filter(|e| e.kind == EntryKind::File) {
            let mut off = 0u64;
            for c in &e.chunks {
                if !first.contains_key(&c.digest) {
                    first.insert(c.digest.clone(), (dir.join(&e.path), off, c.size));
                    order.push(c.digest.clone());
                }
                off += c.size as u64;
            }
        }
        // Sealed under the active key (if any): chunk names and the index of
        // durable chunks depend on it.
        let key = self.cfg.keyring.active().cloned();
        let names: HashMap<String, ChunkName> = order.iter().map(|d| (d.clone(), ChunkName::of(key.as_deref(), d))).collect();
        // The intent first: from now on a sweep on another node either sees
        // it or has finished deleting before the chunks are checked and sent
        // (docs/STORE.md, "Chunks shared across nodes").
        let mut intent = if order.is_empty() {
            None
        } else {
            let all: Vec<ChunkName> = order.iter().filter_map(|d| names.get(d).cloned()).collect();
            Some(self.write_intent(id, key.as_ref(), &all).await?)
        };
        let res = self.upload_under_intent(id, &bytes, UploadPlan { first, order, names, key }, intent.as_mut(), progress, started).await;
        if let Some(it) = intent {
            self.drop_intent(it).await;
        }
        res
    }

    async fn upload_under_intent(
        &self,
        id: &SnapshotId,
        bytes: &[u8],
        plan: UploadPlan,
        mut intent: Option<&mut sweep::Intent>,
        progress: Option<Progress>,
        started: std::time::Instant,
    ) -> Result<SnapshotInfo> {
        let UploadPlan { first, order, names, key } = plan;
        if let Some(it) = intent.as_deref_mut() {
            self.wait_for_sweeps(id, it).await?;
        }
        let index_keys: Vec<String> = order.iter().map(|d| names[d].index_key()).collect();
        let known = db::known_chunks(&self.db, &index_keys)?;
        // Chunks the index calls durable may have been swept by another node
        // since: checked (HEAD) unless a manifest this node wrote naming them
        // is still there; missing ones are sent again.
        let missing = self.missing_reused(&known).await?;
        let todo: Vec<String> = order
            .iter()
            .filter(|d| {
                let k = names[*d].index_key();
                !known.contains_key(&k) || missing.contains(&k)
            })
            .cloned()
            .collect();
        let total: u64 = todo.iter().map(|d| first[d].2 as u64).sum();
        lock(&self.stats).deduplicated_chunks += (known.len() - missing.len()) as u64;
        if let Some(p) = &progress {
            let _ = p.send((0, total));
        }
        let first = Arc::new(first);
        let names = Arc::new(names);
        let level = self.cfg.zstd_level;
        let mut done_raw = 0u64;
        let mut pending: Vec<(String, u64)> = Vec::new();
        let mut stream = futures::stream::iter(todo.into_iter().map(|digest| {
            let (first, id, key, names) = (first.clone(), id.clone(), key.clone(), names.clone());
            async move {
                let d = digest.clone();
                let name = names.get(&digest).cloned().ok_or_else(|| Error::Internal("unnamed chunk".into()))?;
                let n = name.clone();
                let object = blocking(move || {
                    let (path, off, size) = first.get(&d).ok_or_else(|| Error::Internal("unknown chunk".into()))?;
                    let data = local::read_range(path, *off, *size)?;
                    if chunk::sha256_hex(&data) != d {
                        return Err(Error::Corrupt {
                            id,
                            what: format!("local file {} bytes {}..{} do not match chunk sha256:{d}; not uploading", path.display(), off, off + *size as u64),
                        });
                    }
                    match &key {
                        None => chunk::encode(&data, level),
                        Some(k) => chunk::encode_sealed(&data, level, k, n.hex()),
                    }
                })
                .await?;
                let stored = object.len() as u64;
                self.remote.put_chunk(&name, object).await?;
                Ok::<_, Error>((digest, stored))
            }
        }))
        .buffer_unordered(self.cfg.upload_concurrency);
        let mut failure = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok((digest, stored)) => {
                    let raw = first[&digest].2 as u64;
                    done_raw += raw;
                    {
                        let mut s = lock(&self.stats);
                        s.uploaded_bytes += stored;
                        s.uploaded_raw_bytes += raw;
                        s.uploaded_chunks += 1;
                    }
                    if let Some(p) = &progress {
                        let _ = p.send((done_raw, total));
                    }
                    pending.push((names[&digest].index_key(), stored));
                    if pending.len() >= 256 {
                        let tx = Tx::begin(&self.db)?;
                        tx.add_chunks(pending.iter().map(|(d, s)| (d.as_str(), *s)))?;
                        tx.commit()?;
                        pending.clear();
                    }
                    if let Some(it) = intent.as_deref_mut() {
                        if let Err(e) = self.renew_intent_if_due(it).await {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        drop(stream);
        if !pending.is_empty() {
            let tx = Tx::begin(&self.db)?;
            tx.add_chunks(pending.iter().map(|(d, s)| (d.as_str(), *s)))?;
            tx.commit()?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if let Some(it) = intent {
            self.renew_intent_if_due(it).await?;
        }
        // The commit point: the manifest (sealed under the key), written
        // last, then read back. One there already that opens to the same
        // manifest is this upload's, from an attempt whose answer was lost
        // (sealed under the key active then).
        let object = match &key {
            None => bytes.to_vec(),
            Some(k) => crypto::seal_manifest(k, id, bytes)?,
        };
        let ring = &self.cfg.keyring;
        self.fence(&id.actor).await?;
        self.remote.put_manifest(id, object, |existing| crypto::open_manifest(ring, id, existing).is_ok_and(|o| o.plain == bytes)).await?;
        let back = self.remote.get_manifest(id).await?;
        let opened = back.as_deref().map(|b| crypto::open_manifest(ring, id, b)).transpose()?;
        let Some(opened) = opened.filter(|o| o.plain == bytes) else {
            return Err(Error::Corrupt { id: id.clone(), what: format!("manifest read back from the object tier ({}) differs from the one written", self.remote.manifest_path(id)) });
        };
        let tx = Tx::begin(&self.db)?;
        // While this manifest is there, it vouches for its chunks (the next
        // upload reusing them checks it instead of each chunk).
        if opened.key.as_ref().map(|k| k.id()) == key.as_ref().map(|k| k.id()) {
            tx.set_chunk_refs(index_keys.iter().map(|k| k.as_str()), &id.db_key())?;
        }
        let mut r = tx.get(id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        r.remote = RemoteState::Durable;
        r.upload_now = false;
        r.upload_attempts = 0;
        r.next_attempt_ms = 0;
        r.last_error = None;
        r.key_id = opened.key.map(|k| k.id().to_string());
        tx.put(&r)?;
        tx.commit()?;
        info!(snapshot = %id, uploaded_raw = done_raw, logical = r.logical_bytes, key = r.key_id.as_deref().unwrap_or("none (unencrypted)"), ms = started.elapsed().as_millis() as u64, "snapshot durable in the object tier");
        self.wake.notify_one();
        self.info(&r)
    }

    // ----- evict, remove, gc -----

    /// Drop the local copy of a durable, unpinned snapshot.
    pub async fn evict(&self, id: &SnapshotId) -> Result<()> {
        self.evict_inner(id, false).await.map(|_| ())
    }

    /// Ok(true) evicted, Ok(false) nothing to do / busy (try_lock).
    async fn evict_inner(&self, id: &SnapshotId, try_lock: bool) -> Result<bool> {
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
            None => self.import(id).await?,
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

    async fn finish_remove(&self, id: &SnapshotId) -> Result<()> {
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
        let mut by_actor: BTreeMap<ActorName, Vec<Record>> = BTreeMap::new();
        for r in db::records(&self.db, policy.actor.as_ref())? {
            if !r.removing {
                by_actor.entry(r.actor.clone()).or_default().push(r);
            }
        }
        for (_, mut recs) in by_actor {
            recs.sort_by_key(|r| std::cmp::Reverse(r.generation));
            for r in recs.into_iter().skip(policy.keep_newest) {
                let id = r.id();
                match self.remove(&id).await {
                    Ok(()) => report.removed.push(id),
                    Err(Error::Pinned { .. } | Error::PinnedElsewhere { .. }) => report.kept_pinned.push(id),
                    Err(e) => report.errors.push(format!("{id}: {e}")),
                }
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

    /// Forget every chunk known durable (the next uploads check by PUTting
    /// again). For an object tier that lost data behind the store's back.
    pub async fn forget_chunk_index(&self) -> Result<()> {
        let _w = self.sweep.write().await;
        let tx = Tx::begin(&self.db)?;
        tx.clear_chunks()?;
        tx.commit()
    }

    // ----- status and background work -----

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
        let s = lock(&self.stats);
        st.disk_pressure = s.disk_pressure;
        st.uploaded_bytes = s.uploaded_bytes;
        st.uploaded_raw_bytes = s.uploaded_raw_bytes;
        st.uploaded_chunks = s.uploaded_chunks;
        st.deduplicated_chunks = s.deduplicated_chunks;
        st.chunks_checked = s.chunks_checked;
        st.chunks_missing = s.chunks_missing;
        st.sweep_waits = s.sweep_waits;
        st.fetched_bytes = s.fetched_bytes;
        st.last_errors = s.last_errors.iter().cloned().collect();
        st
    }

    /// Wake the background worker now (it also runs every `scan_interval`).
    pub fn kick(&self) {
        self.wake.notify_one();
    }

    /// One pass of background work: finish removals, enforce the budget,
    /// upload what is due (retrying with backoff), enforce the budget again.
    pub async fn run_background_pass(&self) -> Result<()> {
        for r in db::records(&self.db, None)?.into_iter().filter(|r| r.removing) {
            let id = r.id();
            if let Err(e) = self.finish_remove(&id).await {
                self.note_error(format!("remove {id}: {e}"));
            }
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

    /// Evict least recently used durable, unpinned snapshots while over
    /// budget. Returns whether the store is still over budget (disk pressure).
    async fn enforce_budget(&self) -> Result<bool> {
        let recs = db::records(&self.db, None)?;
        let mut used: u64 = recs.iter().map(|r| r.local_bytes()).sum();
        if used > self.cfg.local_budget_bytes {
            let pinned: HashSet<String> = db::leases(&self.db)?.into_iter().map(|(_, l)| l.key).collect();
            let mut candidates: Vec<&Record> = recs
                .iter()
                .filter(|r| r.local == LocalState::Present && r.remote == RemoteState::Durable && !r.removing && !pinned.contains(&r.id().db_key()))
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
        let was = std::mem::replace(&mut lock(&self.stats).disk_pressure, pressure);
        if pressure && !was {
            warn!(used, budget = self.cfg.local_budget_bytes, "local tier over budget with nothing evictable: uploading regardless of keep-local");
        }
        Ok(pressure)
    }

    /// Stop background work (waits for the pass in progress to end).
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let handles = [lock(&self.worker).take(), lock(&self.lease_worker).take()];
        for h in handles.into_iter().flatten() {
            let _ = h.await;
        }
    }
}

async fn worker(store: Weak<Store>, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
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
/// lease's TTL), apart from the uploader: a long upload must not let them lapse.
async fn lease_worker(store: Weak<Store>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => { return; }
        }
        let Some(s) = store.upgrade() else { return };
        if *shutdown.borrow() {
            return;
        }
        s.lease_pass().await;
    }
}
