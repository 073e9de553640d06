//! The shim's client of the node's snapshot store (torpor-snapshotter's store
//! API, ttrpc on `/run/torpor/store.sock` or `$TORPOR_STORE_SOCKET`).
//!
//! A suspend writes its CRIU images into a staging directory the store hands
//! out ([`SnapshotStore::begin`]) and commits it ([`SnapshotStore::commit`]);
//! a resume checks a snapshot out ([`SnapshotStore::checkout`]: a verified
//! local copy, fetched from the object tier if it was evicted) and releases it
//! once the restored processes no longer read it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use torpor_api::store as api;
use torpor_api::ttrpc;

use crate::error::{Error, Result};

/// Calls that only touch the daemon's metadata.
const QUICK: Duration = Duration::from_secs(30);
/// A lease confirmation: short, the fence decides on a missing answer.
const CONFIRM: Duration = Duration::from_secs(3);
/// Commit hashes every file; checkout may fetch from the object tier.
const LONG: Duration = Duration::from_secs(900);

/// A snapshot's identity in the store.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct SnapshotRef {
    pub actor: String,
    pub generation: u64,
}

impl std::fmt::Display for SnapshotRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.actor, self.generation)
    }
}

/// Label of a committed snapshot: the staging id it was committed from
/// (finds the snapshot of a commit whose answer was lost).
pub const LABEL_STAGING: &str = "torpor.dev/staging";
/// Labels: the shim that suspended, the container names, the versions.
pub const LABEL_SHIM: &str = "torpor.dev/shim";
pub const LABEL_CONTAINERS: &str = "torpor.dev/containers";
pub const LABEL_RUNTIME: &str = "torpor.dev/runtime";

/// A staging directory to write a new snapshot into.
#[derive(Debug, Clone)]
pub struct Staging {
    pub id: String,
    pub path: PathBuf,
}

/// A checked-out snapshot: its files (read only) stay until [`SnapshotStore::release`].
#[derive(Debug, Clone)]
pub struct Checkout {
    pub snapshot: SnapshotRef,
    pub path: PathBuf,
    pub lease: String,
}

/// Client of the node's snapshot store.
#[derive(Clone)]
pub struct SnapshotStore {
    client: api::StoreClient,
    socket: PathBuf,
}

impl SnapshotStore {
    /// Connects to the store API socket (`$TORPOR_STORE_SOCKET` or `/run/torpor/store.sock`).
    pub async fn connect() -> Result<Self> {
        let socket = torpor_api::store_socket();
        if !socket.exists() {
            return Err(Error::Store(format!(
                "the snapshot store socket {} does not exist: is torpor-snapshotter running?",
                socket.display()
            )));
        }
        let c = ttrpc::asynchronous::Client::connect(&format!("unix://{}", socket.display()))
            .await
            .map_err(|e| Error::Store(format!("connect to the snapshot store at {}: {e}", socket.display())))?;
        Ok(Self { client: api::StoreClient::new(c), socket })
    }

    /// Maps the daemon's answer onto the runtime's error kinds, keeping its
    /// message (which names the snapshot and the problem).
    fn err(&self, op: &str, e: ttrpc::Error) -> Error {
        use ttrpc::Code;
        let (code, msg) = match e {
            ttrpc::Error::RpcStatus(s) => (s.code(), s.message),
            e => (Code::UNAVAILABLE, e.to_string()),
        };
        let msg = format!("snapshot store ({}) {op}: {msg}", self.socket.display());
        match code {
            Code::NOT_FOUND => Error::NotFound(msg),
            Code::INVALID_ARGUMENT => Error::InvalidArgument(msg),
            Code::FAILED_PRECONDITION => Error::FailedPrecondition(msg),
            Code::DATA_LOSS => Error::Corrupt(msg),
            Code::UNIMPLEMENTED => Error::Unimplemented(msg),
            _ => Error::Store(msg),
        }
    }

    pub async fn begin(&self, actor: &str) -> Result<Staging> {
        let mut req = api::BeginRequest::new();
        req.actor = actor.to_string();
        let r = self.client.begin(ctx(QUICK), &req).await.map_err(|e| self.err("begin", e))?;
        Ok(Staging { id: r.staging_id, path: PathBuf::from(r.path) })
    }

    pub async fn commit(
        &self,
        staging: &Staging,
        labels: HashMap<String, String>,
        keep_local: Option<Duration>,
    ) -> Result<SnapshotRef> {
        let mut req = api::CommitRequest::new();
        req.staging_id = staging.id.clone();
        req.labels = labels;
        req.keep_local_seconds = keep_local.map(|d| d.as_secs());
        let info = self.client.commit(ctx(LONG), &req).await.map_err(|e| self.err("commit", e))?;
        snapshot_ref(&info).ok_or_else(|| Error::Store("commit answered without a snapshot id".into()))
    }

    pub async fn abort(&self, staging: &Staging) -> Result<()> {
        let mut req = api::AbortRequest::new();
        req.staging_id = staging.id.clone();
        self.client.abort(ctx(QUICK), &req).await.map_err(|e| self.err("abort", e))?;
        Ok(())
    }

    /// The actor's newest snapshot in either tier, if any.
    pub async fn latest(&self, actor: &str) -> Result<Option<SnapshotRef>> {
        let mut req = api::LatestRequest::new();
        req.actor = actor.to_string();
        let r = self.client.latest(ctx(LONG), &req).await.map_err(|e| self.err("latest", e))?;
        Ok(r.info.into_option().as_ref().and_then(snapshot_ref))
    }

    pub async fn checkout(&self, snap: &SnapshotRef) -> Result<Checkout> {
        let mut req = api::CheckoutRequest::new();
        req.id = protobuf::MessageField::some(id(snap));
        let r = self.client.checkout(ctx(LONG), &req).await.map_err(|e| self.err(&format!("checkout {snap}"), e))?;
        Ok(Checkout { snapshot: snap.clone(), path: PathBuf::from(r.path), lease: r.lease })
    }

    /// The files of `staging` (committed in the background), pinned for a
    /// restore: `NotFound` once the commit is done (check the snapshot out).
    pub async fn view_staging(&self, staging: &Staging) -> Result<(PathBuf, String)> {
        let mut req = api::ViewStagingRequest::new();
        req.staging_id = staging.id.clone();
        let r = self.client.view_staging(ctx(QUICK), &req).await.map_err(|e| self.err("view staging", e))?;
        Ok((PathBuf::from(r.path), r.lease))
    }

    pub async fn release(&self, checkout: &Checkout) -> Result<()> {
        let mut req = api::ReleaseRequest::new();
        req.lease = checkout.lease.clone();
        self.client.release(ctx(QUICK), &req).await.map_err(|e| self.err("release", e))?;
        Ok(())
    }

    /// Takes `actor`'s lease in the object tier for this node (`owner`: the
    /// shim). `FailedPrecondition` naming the holder while another node has it.
    pub async fn acquire(&self, actor: &str, owner: &str) -> Result<u64> {
        let mut req = api::AcquireRequest::new();
        req.actor = actor.to_string();
        req.owner = owner.to_string();
        let r = self.client.acquire(ctx(QUICK), &req).await.map_err(|e| self.err("acquire of the actor lease", e))?;
        Ok(r.epoch)
    }

    /// `actor` may go on running here (shim `owner`): this node holds its
    /// lease. Returns the time (unix ms) until which that stays true without
    /// asking again. `FailedPrecondition` when the lease was lost; `Store`
    /// when the daemon could not tell (unreachable, the object tier down).
    pub async fn confirm(&self, actor: &str, owner: &str) -> Result<u64> {
        let mut req = api::ConfirmRequest::new();
        req.actor = actor.to_string();
        req.owner = owner.to_string();
        let r = self.client.confirm(ctx(CONFIRM), &req).await.map_err(|e| self.err("confirm of the actor lease", e))?;
        Ok(r.valid_until_unix_ms)
    }

    /// `actor` leaves this node: its lease goes once its newest snapshot is durable.
    pub async fn surrender(&self, actor: &str, owner: &str) -> Result<()> {
        let mut req = api::SurrenderRequest::new();
        req.actor = actor.to_string();
        req.owner = owner.to_string();
        self.client.surrender(ctx(QUICK), &req).await.map_err(|e| self.err("surrender of the actor lease", e))?;
        Ok(())
    }

    /// The snapshots of `actor` this node's store knows (with their labels).
    pub async fn list(&self, actor: &str) -> Result<Vec<(SnapshotRef, HashMap<String, String>)>> {
        let mut req = api::ListRequest::new();
        req.actor = actor.to_string();
        let r = self.client.list(ctx(QUICK), &req).await.map_err(|e| self.err("list", e))?;
        Ok(r.snapshots.iter().filter_map(|i| Some((snapshot_ref(i)?, i.labels.clone()))).collect())
    }

    /// Deletes a snapshot from both tiers.
    pub async fn remove(&self, snap: &SnapshotRef) -> Result<()> {
        self.client.remove(ctx(LONG), &id(snap)).await.map_err(|e| self.err(&format!("remove {snap}"), e))?;
        Ok(())
    }
}

fn ctx(timeout: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(timeout.as_nanos() as i64)
}

fn id(s: &SnapshotRef) -> api::SnapshotId {
    let mut id = api::SnapshotId::new();
    id.actor = s.actor.clone();
    id.generation = s.generation;
    id
}

fn snapshot_ref(info: &api::SnapshotInfo) -> Option<SnapshotRef> {
    info.id.as_ref().map(|i| SnapshotRef { actor: i.actor.clone(), generation: i.generation })
}
