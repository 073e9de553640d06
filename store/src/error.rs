//! The store's typed error.

use std::path::PathBuf;

use crate::id::{ActorName, InvalidId, SnapshotId};

/// Result of store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the snapshot store. Every variant names what
/// it is about (the snapshot, the path, the object, the staging id) so that a
/// message reaching an operator is actionable on its own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An actor name or snapshot id that does not parse.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),

    #[error("actor {actor} is held by node {node} (shim {owner}) until {until}: it runs or is resuming there; refused to run it here too")]
    LeaseHeld { actor: ActorName, node: String, owner: String, until: String },
    /// The actor's lease object is not proven free (missing while the actor
    /// has durable snapshots, not authenticated, a stale copy...): this
    /// node takes it only once it has watched it unchanged for one lease
    /// TTL, or never (authenticated under a key this node does not have).
    #[error("actor {actor}: {why}; a node that may still run the actor is waited out (one lease TTL unchanged) before this node takes it: retry {retry}")]
    LeaseUnproven { actor: ActorName, why: String, retry: String },
    #[error("actor {actor}: this node no longer holds its lease ({detail})")]
    LeaseLost { actor: ActorName, detail: String },
    #[error("invalid store configuration: {0}")]
    InvalidConfig(String),

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("snapshot {0} not found")]
    NotFound(SnapshotId),

    #[error("staging {0:?} not found (never begun, already committed or aborted, or lost in a restart)")]
    StagingNotFound(String),

    #[error("lease {0:?} not found")]
    LeaseNotFound(String),

    #[error("snapshot {id} is not durable in the object tier ({state}); refusing to drop its only copy")]
    NotDurable { id: SnapshotId, state: String },

    #[error("snapshot {id} is pinned by {leases} lease(s); release them first")]
    Pinned { id: SnapshotId, leases: usize },

    /// A checkout on another node fetched (or is fetching) the snapshot and
    /// pins it in the object tier until it releases it.
    #[error("snapshot {id} is checked out on node {node} (pinned in the object tier: {pin}); it is kept until that node releases it (or stops renewing the pin)")]
    PinnedElsewhere { id: SnapshotId, node: String, pin: String },

    #[error("snapshot {id} has no local copy to {op} (it is {state})")]
    NoLocalCopy { id: SnapshotId, op: &'static str, state: String },

    #[error("snapshot {id} is corrupt: {what}")]
    Corrupt { id: SnapshotId, what: String },

    /// The snapshot is sealed under a key this node does not have (or has
    /// under that id with other key material).
    #[error("snapshot {id} is encrypted under key {key_id:?}, {detail}")]
    UnknownKey { id: SnapshotId, key_id: String, detail: String },

    #[error("snapshot {id}: the object tier already holds a different manifest for this generation ({detail})")]
    Conflict { id: SnapshotId, detail: String },

    #[error("unsupported file in snapshot staging {path}: {kind} (only regular files and directories are stored)")]
    UnsupportedFile { path: PathBuf, kind: String },

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("metadata database ({op}): {source}")]
    Db {
        op: &'static str,
        #[source]
        source: Box<redb::Error>,
    },

    #[error("metadata database ({op}): corrupt record {key:?}: {detail}")]
    DbRecord { op: &'static str, key: String, detail: String },

    #[error("object tier {op} {path}: {source}")]
    Remote {
        op: &'static str,
        path: String,
        #[source]
        source: Box<object_store::Error>,
    },

    /// The object tier answered something that contradicts what the store
    /// just did (an object written and then not found).
    #[error("object tier {path}: {detail}")]
    Inconsistent { path: String, detail: String },

    /// A chunk sweep could not finish (what is left waits for the next one).
    #[error("chunk sweep incomplete: {0}")]
    SweepIncomplete(String),

    /// An object tier request that got no answer in time (a stalled server).
    #[error("object tier {op} {path}: no answer within {after:?}")]
    Stalled { op: &'static str, path: String, after: std::time::Duration },

    #[error("fetch of snapshot {id} from the object tier failed: {source}")]
    FetchFailed {
        id: SnapshotId,
        #[source]
        source: Box<Error>,
    },

    /// A streamed checkout could not get all its chunks (the snapshot is
    /// intact in the object tier). `corrupt`: a chunk failed verification;
    /// otherwise the object tier was unreachable, stalled or failing.
    #[error("streamed fetch of snapshot {id} from the object tier failed: {why}")]
    StreamFailed { id: SnapshotId, why: String, corrupt: bool },

    #[error("upload of snapshot {id} failed (it stays local and queued): {source}")]
    UploadFailed {
        id: SnapshotId,
        #[source]
        source: Box<Error>,
    },

    #[error("the store is shutting down")]
    ShuttingDown,

    /// The actor's newest generation is still being committed (its staging
    /// is hashed and placed): its newest snapshot is not known yet.
    #[error("a commit of actor {actor} is in progress (staging {staging}) and did not end within {waited_s} s: its newest snapshot is the one being committed; try again")]
    CommitInProgress { actor: ActorName, staging: String, waited_s: u64 },

    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }

    pub(crate) fn db(op: &'static str, source: impl Into<redb::Error>) -> Self {
        Error::Db { op, source: Box::new(source.into()) }
    }

    pub(crate) fn remote(op: &'static str, path: impl std::fmt::Display, source: object_store::Error) -> Self {
        Error::Remote { op, path: path.to_string(), source: Box::new(source) }
    }

    /// The object tier could not be reached or answered with a transient failure
    /// (as opposed to a definite answer such as "not found").
    pub fn is_remote_unavailable(&self) -> bool {
        match self {
            Error::Remote { source, .. } => !matches!(
                **source,
                object_store::Error::NotFound { .. }
                    | object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
                    | object_store::Error::InvalidPath { .. }
                    | object_store::Error::NotSupported { .. }
            ),
            Error::Stalled { .. } => true,
            Error::StreamFailed { corrupt, .. } => !corrupt,
            Error::FetchFailed { source, .. } | Error::UploadFailed { source, .. } => source.is_remote_unavailable(),
            _ => false,
        }
    }

    /// The requested snapshot, staging or lease does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound(_) | Error::StagingNotFound(_) | Error::LeaseNotFound(_))
    }
}
