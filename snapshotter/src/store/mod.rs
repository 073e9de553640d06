//! The tiered snapshot store: local disk ahead of an object store.
//!
//! A snapshot is one actor's suspended state at a generation: a directory tree
//! of files plus labels. It is committed to the local tier (materialized files
//! that CRIU reads in place, plus `manifest.json`), uploaded to the object tier
//! as content-addressed, compressed chunks plus a manifest (written last: the
//! commit point), and evicted from the local tier (least recently used first,
//! never when not durable, never when pinned) when over the byte budget. See
//! `docs/STORE.md` for layouts, formats, states and crash-recovery rules.

//!
//! One file per concern; `Store` (this file: its state, `open`, and what
//! every concern shares) composes them:
//!
//! - [`commit`]: stagings, views of them, commits into the local tier;
//! - [`catalog`]: which snapshots exist, the newest, manifests read and checked;
//! - [`fetch`]: checkouts, fetches from the object tier, release;
//! - [`upload`]: uploads into the object tier (the manifest last: the commit point);
//! - [`retention`]: eviction, the local budget, removal, gc by policy;
//! - [`sweep`]: the chunk sweep and the upload intents that keep it safe across nodes;
//! - [`actor_lease`], [`pin`]: actor leases (one writer per actor) and checkout pins;
//! - [`worker`]: the background tasks;
//! - [`recovery`]: what `open` repairs after a crash;
//! - [`stats`]: counters for `status`.

pub mod actor_lease;
mod catalog;
pub mod chunk;
mod commit;
pub mod config;
pub mod crypto;
mod db;
pub mod error;
mod fetch;
pub mod id;
mod local;
pub mod manifest;
mod pagemap;
mod pin;
mod recovery;
pub mod remote;
mod retention;
mod stats;
pub mod stream;
mod sweep;
mod trash;
mod upload;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::Database;
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

pub use config::{ChunkingConfig, RetryConfig, StoreConfig};
pub use crypto::{Key, Keyring};
pub use db::{LocalState, RemoteState};
pub use error::{Error, Result};
pub use id::{ActorName, SnapshotId};
pub(crate) use local::write_atomic;
pub use manifest::{Entry, EntryKind, Manifest};
pub use remote::{ChunkName, ConditionalWrites, Honoured, Remote};
pub use retention::{GcPolicy, GcReport};
pub use stats::{Observer, StoreStatus};
pub use sweep::{Namespace, UnreadableManifest, INTENT_TTL, SWEEP_DELETE_WINDOW};

use db::{Record, Tx};

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

#[derive(Default)]
struct KeyLock {
    /// Shared: reading the local copy (checkout of a local copy, upload).
    /// Exclusive: creating or deleting it (fetch, evict, remove).
    files: Arc<tokio::sync::RwLock<()>>,
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
    /// Shared with blocking tasks (an actor lease's renewal is recorded off
    /// the runtime that answers `Confirm`).
    db: Arc<Database>,
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
    /// lease → its streamed checkout ([`Store::checkout_streamed`]).
    streams: Mutex<HashMap<String, Arc<stream::Stream>>>,
    /// Bumped when a streamed checkout becomes ready: a checkout of the
    /// same snapshot waiting for it joins it.
    stream_ready: tokio::sync::watch::Sender<u64>,
    /// Stagings committed since the daemon started → their snapshot (a
    /// second commit of one answers what the first made).
    committed: Mutex<HashMap<String, SnapshotId>>,
    /// Notified when a commit ends.
    commit_done: Notify,
    /// Local copies whose every byte this daemon hashed: when, and how their
    /// files looked then (`cfg.trust_verified_local_for`).
    verified: Mutex<HashMap<SnapshotId, (std::time::Instant, local::Fingerprint)>>,
    /// The actor leases this node holds (in memory and in the database) and
    /// the per-actor locks of lease operations.
    leases: actor_lease::LeaseTable,
    lease_worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    stats: stats::Stats,
    wake: Arc<Notify>,
    shutdown: watch::Sender<bool>,
    worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn ms_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.min(MAX_UNIX_MS))
}

/// The last millisecond of year 9999 (UTC): the latest time RFC 3339 can
/// write. Every time read from the object tier (a lease's, a manifest's) is
/// refused past it when it is parsed.
pub const MAX_UNIX_MS: u64 = 253_402_300_799_999;

/// Is `ms` (unix ms, read from the object tier) a time the store takes:
/// `Err` names the field and the bound.
pub(crate) fn check_unix_ms(field: &str, ms: u64) -> std::result::Result<(), String> {
    if ms > MAX_UNIX_MS {
        return Err(format!("{field} is {ms} ms after the Unix epoch, past the end of year 9999 ({MAX_UNIX_MS})"));
    }
    Ok(())
}

/// A unix-ms time as RFC 3339 (milliseconds), for messages. Never panics:
/// a time past year 9999 is written as a number.
pub fn unix_ms_text(ms: u64) -> String {
    if ms > MAX_UNIX_MS {
        return format!("{ms} ms after the Unix epoch (past year 9999)");
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}


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
        // Root's alone (0700), tightened when they exist with other modes:
        // snapshots are process memory.
        for d in [&root, &paths.snapshots, &paths.staging, &paths.trash] {
            local::private_root(d)?;
        }
        let db_path = root.join("store.redb");
        let db = {
            let p = db_path.clone();
            blocking(move || db::open(&p)).await?
        };
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&db_path, std::fs::Permissions::from_mode(local::FILE_MODE)).map_err(|e| Error::io("chmod 0600", &db_path, e))?;
        }
        let leases = actor_lease::LeaseTable::load(&db)?;
        let (shutdown, _) = watch::channel(false);
        let store = Arc::new(Store {
            cfg,
            db: Arc::new(db),
            remote,
            paths,
            locks: Mutex::new(HashMap::new()),
            sweep: tokio::sync::RwLock::new(()),
            stagings: Mutex::new(HashMap::new()),
            placing: Arc::new(Mutex::new(())),
            views: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            stream_ready: tokio::sync::watch::channel(0).0,
            pins: Mutex::new(HashMap::new()),
            committed: Mutex::new(HashMap::new()),
            commit_done: Notify::new(),
            verified: Mutex::new(HashMap::new()),
            leases,
            lease_worker: Mutex::new(None),
            stats: stats::Stats::default(),
            wake: Arc::new(Notify::new()),
            shutdown,
            worker: Mutex::new(None),
        });
        store.check_meta()?;
        store.recover()?;
        if store.cfg.background {
            let weak = Arc::downgrade(&store);
            let rx = store.shutdown.subscribe();
            let handle = tokio::spawn(worker::worker(weak, store.wake.clone(), rx));
            *lock(&store.worker) = Some(handle);
        }
        {
            let weak = Arc::downgrade(&store);
            let rx = store.shutdown.subscribe();
            let handle = tokio::spawn(worker::lease_worker(weak, store.cfg.lease_ttl / 3, rx));
            *lock(&store.lease_worker) = Some(handle);
        }
        info!(root = %store.cfg.root.display(), remote = %store.remote.url, "snapshot store open");
        let ring = &store.cfg.keyring;
        match ring.active() {
            Some(k) => info!(active = k.id(), keys = %ring.describe(), accept_unencrypted = ring.accept_unencrypted, "object tier encrypted: uploads are sealed under the active key"),
            None if store.remote.url.starts_with("memory:") => info!(remote = %store.remote.url, "object tier not encrypted (in memory)"),
            None => warn!(
                remote = %store.remote.url,
                "object tier NOT encrypted: snapshots hold process memory (tokens, keys, user data) and are stored there in cleartext, unauthenticated (anyone who can write it can plant a snapshot); configure [store.encryption]"
            ),
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
        self.stats.note_error(msg);
    }
}
