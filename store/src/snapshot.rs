//! What the store hands out and takes: stagings to write a snapshot into,
//! commit options, a snapshot's description ([`SnapshotInfo`]), checkouts,
//! and the progress of a long transfer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::db::{LocalState, RemoteState};
use crate::id::{ActorName, SnapshotId};

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
