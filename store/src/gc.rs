//! What a gc is asked ([`GcPolicy`]) and what it answers ([`GcReport`]),
//! with the manifests it could not read and the chunk objects it keeps for
//! them (`retention` and `sweep` do the work).

use std::time::Duration;

use crate::id::{ActorName, SnapshotId};

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

/// A manifest in the object tier that this node cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableManifest {
    pub id: SnapshotId,
    /// The key its envelope names (`None`: not sealed, or no readable envelope).
    pub key_id: Option<String>,
    /// Why it cannot be read.
    pub error: String,
    /// The chunk objects a sweep keeps whole for it (the part it may name).
    pub keeps: Namespace,
}

/// A part of the chunk objects.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Namespace {
    /// `chunks/sha256/`
    Plain,
    /// `chunks/hmac-sha256/<key id>/`
    Key(String),
    /// Every chunk object.
    All,
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Namespace::Plain => write!(f, "plaintext chunk objects (chunks/sha256/)"),
            Namespace::Key(k) => write!(f, "chunk objects under key {k:?} (chunks/hmac-sha256/{k}/)"),
            Namespace::All => write!(f, "every chunk object (the manifest's key is unknown)"),
        }
    }
}

impl std::fmt::Display for UnreadableManifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unreadable manifest of snapshot {}", self.id)?;
        if let Some(k) = &self.key_id {
            write!(f, " (sealed under key {k:?})")?;
        }
        write!(f, ": {}; it is kept, and the chunk sweep keeps {}", self.error, self.keeps)
    }
}
