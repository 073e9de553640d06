//! torpor-store: the tiered snapshot store, local disk ahead of an object
//! store (served by torpor-snapshotter).
//!
//! A snapshot is one actor's suspended state at a generation: a directory tree
//! of files plus labels. It is committed to the local tier (materialized files
//! that CRIU reads in place, plus `manifest.json`), uploaded to the object tier
//! as content-addressed, compressed chunks plus a manifest (written last: the
//! commit point), and evicted from the local tier (least recently used first,
//! never when not durable, never when pinned) when over the byte budget. See
//! `docs/STORE.md` for layouts, formats, states and crash-recovery rules.
//!
//! The crate in three layers, each file importing only from layers below
//! it:
//!
//! - shared types and the tiers: [`id`], [`error`], [`config`], `time`,
//!   `util`, [`manifest`], [`chunk`], [`crypto`], `pagemap`, `db` (the
//!   metadata database), [`remote`] (the object tier), `local` and `trash`
//!   (the local tier), `snapshot` (what the store hands out), `gc`;
//! - the tables the store keeps in memory, each in its own file:
//!   [`leases`] (actor leases held, with [`lease_object`], the lease's
//!   format in the object tier), `pins` (checkout pins), `stats`
//!   (counters), [`stream`] (streamed checkouts); and `state`, the
//!   [`Store`] that holds them all;
//! - the operations, one file per concern, each adding methods to
//!   [`Store`]: `commit` (stagings, views, commits into the local tier),
//!   `catalog` (which snapshots exist, the newest, manifests read and
//!   checked), `fetch` (checkouts, fetches, release), `stream_checkout`
//!   (streamed checkouts), `upload` (the manifest last: the commit point),
//!   `retention` (eviction, the local budget, removal, gc by policy),
//!   `sweep` (the chunk sweep and the upload intents that keep it safe
//!   across nodes), `actor_lease` and `lease_renewal` (one writer per
//!   actor), `pin` (checkout pins across nodes), `recovery` (what `open`
//!   repairs after a crash), `worker` (the background tasks);
//!
//! and on top this file: [`Store::open`], and the crate's public names.

// Shared types and the tiers.
pub mod chunk;
pub mod config;
pub mod crypto;
mod db;
pub mod error;
mod gc;
pub mod id;
mod local;
pub mod manifest;
mod pagemap;
pub mod remote;
mod snapshot;
mod time;
mod trash;
mod util;

// The tables, and the state that holds them.
pub mod lease_object;
pub mod leases;
mod pins;
mod state;
mod stats;
pub mod stream;

// The operations.
mod actor_lease;
mod catalog;
mod commit;
mod fetch;
mod lease_renewal;
mod pin;
mod recovery;
mod retention;
mod stream_checkout;
mod sweep;
mod upload;
mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};
use tracing::{info, warn};

pub use config::{ChunkingConfig, RetryConfig, StoreConfig};
pub use crypto::{Key, Keyring};
pub use db::{LocalState, RemoteState};
pub use error::{Error, Result};
pub use gc::{GcPolicy, GcReport, Namespace, UnreadableManifest};
pub use id::{ActorName, SnapshotId};
pub use leases::{Grant, Held};
pub use local::write_atomic;
pub use manifest::{Entry, EntryKind, Manifest};
pub use remote::{ChunkName, ConditionalWrites, Honoured, Remote};
pub use snapshot::{Checkout, CommitOptions, Progress, SnapshotInfo, Staging};
pub use state::Store;
pub use stats::{Observer, StoreStatus};
pub use sweep::{INTENT_TTL, SWEEP_DELETE_WINDOW};
pub use time::{unix_ms_text, MAX_UNIX_MS};

use db::Tx;
use leases::LeaseTable;
use state::Paths;
use util::{blocking, lock};

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
            std::fs::set_permissions(&db_path, std::fs::Permissions::from_mode(local::FILE_MODE))
                .map_err(|e| Error::io("chmod 0600", &db_path, e))?;
        }
        let leases = LeaseTable::load(&db)?;
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
            Some(k) => {
                info!(active = k.id(), keys = %ring.describe(), accept_unencrypted = ring.accept_unencrypted, "object tier encrypted: uploads are sealed under the active key")
            }
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
}
