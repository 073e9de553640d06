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

use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::error::{Error, Result, StoreErrorKind};

/// Calls that only touch the daemon's metadata.
const QUICK: Duration = Duration::from_secs(30);
/// An acquire of an actor's lease: the daemon waits up to a minute for
/// another node that is letting go of it (its pod was just removed there).
const ACQUIRE: Duration = Duration::from_secs(90);
/// A lease confirmation: short, the fence decides on a missing answer.
const CONFIRM: Duration = Duration::from_secs(3);
/// A lifecycle report (fire-and-forget: dropped when late).
const REPORT: Duration = Duration::from_secs(2);
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

/// An actor's lease, taken by this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Bumped at every change of hands.
    pub epoch: u64,
    /// The node that held the actor before this one (it moved here), when
    /// the lease came from another node.
    pub previous_node: Option<String>,
}

/// A checked-out snapshot: its files (read only) stay until [`SnapshotStore::release`].
#[derive(Debug, Clone)]
pub struct Checkout {
    pub snapshot: SnapshotRef,
    pub path: PathBuf,
    pub lease: String,
    /// A streamed checkout: its memory is served by this page server
    /// until [`SnapshotStore::wait_stream`] says it is all local.
    pub page_server: Option<PathBuf>,
}

/// What a streamed checkout did (milliseconds from its start).
#[derive(Debug, Clone, Default)]
pub struct StreamDone {
    pub fetched_bytes: u64,
    pub chunks: u64,
    pub ready_ms: u64,
    pub first_page_ms: u64,
    pub done_ms: u64,
    pub pages_served: u64,
    pub pages_waited: u64,
    pub working_set_chunks: u64,
}

/// Client of the node's snapshot store: one per shim, long-lived. It
/// connects on first use and again after the connection failed (a
/// restarted torpor-snapshotter); a call that finds its connection broken
/// is retried once on a new one. Answers keep their kind
/// ([`StoreErrorKind`]) up to the caller.
#[derive(Clone)]
pub struct SnapshotStore {
    socket: PathBuf,
    client: Arc<Mutex<Option<api::StoreClient>>>,
}

impl Default for SnapshotStore {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotStore {
    /// The client of the store API socket (`$TORPOR_STORE_SOCKET` or
    /// `/run/torpor/store.sock`); nothing is connected yet.
    pub fn new() -> Self {
        Self::at(torpor_api::store_socket())
    }

    /// The client of the store API socket `socket`.
    pub fn at(socket: PathBuf) -> Self {
        SnapshotStore { socket, client: Arc::default() }
    }

    fn cached(&self) -> Option<api::StoreClient> {
        self.client.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn connect(&self) -> Result<api::StoreClient> {
        let socket = &self.socket;
        if !socket.exists() {
            return Err(Error::store(
                StoreErrorKind::Unavailable,
                format!("the snapshot store socket {} does not exist: is torpor-snapshotter running?", socket.display()),
            ));
        }
        let c = ttrpc::asynchronous::Client::connect(&format!("unix://{}", socket.display())).await.map_err(|e| {
            Error::store(StoreErrorKind::Unavailable, format!("connect to the snapshot store at {}: {e}", socket.display()))
        })?;
        let client = api::StoreClient::new(c);
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client.clone());
        Ok(client)
    }

    fn forget(&self) {
        self.client.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// One RPC: on the cached connection, or a new one; a transport
    /// failure on a cached connection is retried once on a new one.
    async fn call<T, F, Fut>(&self, op: &str, f: F) -> Result<T>
    where
        F: Fn(api::StoreClient) -> Fut,
        Fut: std::future::Future<Output = ttrpc::Result<T>>,
    {
        let mut client = self.cached();
        loop {
            let fresh = client.is_none();
            let c = match client.take() {
                Some(c) => c,
                None => self.connect().await?,
            };
            match f(c).await {
                Ok(v) => return Ok(v),
                Err(ttrpc::Error::RpcStatus(s)) => return Err(self.status_error(op, s)),
                Err(e) => {
                    self.forget();
                    if fresh {
                        return Err(Error::store(
                            StoreErrorKind::Unavailable,
                            format!("snapshot store ({}) {op}: {e}", self.socket.display()),
                        ));
                    }
                }
            }
        }
    }

    /// Maps the daemon's answer onto a typed store error, keeping its
    /// message (which names the snapshot and the problem).
    fn status_error(&self, op: &str, s: ttrpc::proto::Status) -> Error {
        Error::store(error_kind(&s), format!("snapshot store ({}) {op}: {}", self.socket.display(), s.message))
    }

    /// The node's policy for actors (`[tenancy]` of the daemon's config):
    /// the namespaces whose actors any pod may clone.
    pub async fn clone_source_namespaces(&self) -> Result<Vec<String>> {
        let r = self.call("policy", |c| async move { c.policy(ctx(QUICK), &api::Empty::new()).await }).await?;
        Ok(r.clone_source_namespaces)
    }

    pub async fn begin(&self, actor: &str) -> Result<Staging> {
        let mut req = api::BeginRequest::new();
        req.actor = actor.to_string();
        let req = &req;
        let r = self.call("begin", |c| async move { c.begin(ctx(QUICK), req).await }).await?;
        Ok(Staging { id: r.staging_id, path: PathBuf::from(r.path) })
    }

    pub async fn commit(&self, staging: &Staging, labels: HashMap<String, String>, keep_local: Option<Duration>) -> Result<SnapshotRef> {
        let mut req = api::CommitRequest::new();
        req.staging_id = staging.id.clone();
        req.labels = labels;
        req.keep_local_seconds = keep_local.map(|d| d.as_secs());
        let req = &req;
        let info = self.call("commit", |c| async move { c.commit(ctx(LONG), req).await }).await?;
        snapshot_ref(&info).ok_or_else(|| Error::store(StoreErrorKind::Other, "commit answered without a snapshot id"))
    }

    pub async fn abort(&self, staging: &Staging) -> Result<()> {
        let mut req = api::AbortRequest::new();
        req.staging_id = staging.id.clone();
        let req = &req;
        self.call("abort", |c| async move { c.abort(ctx(QUICK), req).await }).await?;
        Ok(())
    }

    /// The actor's newest snapshot in either tier, if any.
    pub async fn latest(&self, actor: &str) -> Result<Option<SnapshotRef>> {
        let mut req = api::LatestRequest::new();
        req.actor = actor.to_string();
        let req = &req;
        let r = self.call("latest", |c| async move { c.latest(ctx(LONG), req).await }).await?;
        Ok(r.info.into_option().as_ref().and_then(snapshot_ref))
    }

    pub async fn checkout(&self, snap: &SnapshotRef) -> Result<Checkout> {
        self.checkout_as(snap, false).await
    }

    /// A checkout that may be streamed: when the snapshot is only in the
    /// object tier, it answers once all but the lazily restored memory is
    /// local (see [`Checkout::page_server`]).
    pub async fn checkout_streamed(&self, snap: &SnapshotRef) -> Result<Checkout> {
        self.checkout_as(snap, true).await
    }

    async fn checkout_as(&self, snap: &SnapshotRef, stream: bool) -> Result<Checkout> {
        let mut req = api::CheckoutRequest::new();
        req.id = protobuf::MessageField::some(id(snap));
        req.stream = stream;
        let op = format!("checkout {snap}");
        let req = &req;
        let r = self.call(&op, |c| async move { c.checkout(ctx(LONG), req).await }).await?;
        let page_server = (r.streamed && !r.page_server.is_empty()).then(|| PathBuf::from(&r.page_server));
        Ok(Checkout { snapshot: snap.clone(), path: PathBuf::from(r.path), lease: r.lease, page_server })
    }

    /// Waits until the streamed checkout `lease` is all local; the store's
    /// reason when it failed (the snapshot is intact in the object tier).
    pub async fn wait_stream(&self, lease: &str) -> Result<StreamDone> {
        let mut req = api::WaitStreamRequest::new();
        req.lease = lease.to_string();
        let req = &req;
        let r = self.call("wait for the streamed checkout", |c| async move { c.wait_stream(ctx(LONG), req).await }).await?;
        Ok(StreamDone {
            fetched_bytes: r.fetched_bytes,
            chunks: r.chunks,
            ready_ms: r.ready_ms,
            first_page_ms: r.first_page_ms,
            done_ms: r.done_ms,
            pages_served: r.pages_served,
            pages_waited: r.pages_waited,
            working_set_chunks: r.working_set_chunks,
        })
    }

    /// The files of `staging` (committed in the background), pinned for a
    /// restore: `NotFound` once the commit is done (check the snapshot out).
    pub async fn view_staging(&self, staging: &Staging) -> Result<(PathBuf, String)> {
        let mut req = api::ViewStagingRequest::new();
        req.staging_id = staging.id.clone();
        let req = &req;
        let r = self.call("view staging", |c| async move { c.view_staging(ctx(QUICK), req).await }).await?;
        Ok((PathBuf::from(r.path), r.lease))
    }

    pub async fn release(&self, checkout: &Checkout) -> Result<()> {
        let mut req = api::ReleaseRequest::new();
        req.lease = checkout.lease.clone();
        let req = &req;
        self.call("release", |c| async move { c.release(ctx(QUICK), req).await }).await?;
        Ok(())
    }

    /// Takes `actor`'s lease in the object tier for this node (`owner`: the
    /// shim). `FailedPrecondition` naming the holder while another node has
    /// it; waited for (up to a minute, by the daemon) while that node is
    /// letting go of it.
    pub async fn acquire(&self, actor: &str, owner: &str) -> Result<Grant> {
        let mut req = api::AcquireRequest::new();
        req.actor = actor.to_string();
        req.owner = owner.to_string();
        let req = &req;
        let r = self.call("acquire of the actor lease", |c| async move { c.acquire(ctx(ACQUIRE), req).await }).await?;
        Ok(Grant { epoch: r.epoch, previous_node: (!r.previous_node.is_empty()).then(|| r.previous_node.clone()) })
    }

    /// `actor` may go on running here (shim `owner`): this node holds its
    /// lease. Returns the time (unix ms) until which that stays true without
    /// asking again. `FailedPrecondition` when the lease was lost; `Store`
    /// when the daemon could not tell (unreachable, the object tier down).
    pub async fn confirm(&self, actor: &str, owner: &str) -> Result<u64> {
        let mut req = api::ConfirmRequest::new();
        req.actor = actor.to_string();
        req.owner = owner.to_string();
        let req = &req;
        let r = self.call("confirm of the actor lease", |c| async move { c.confirm(ctx(CONFIRM), req).await }).await?;
        Ok(r.valid_until_unix_ms)
    }

    /// `actor` leaves this node: its lease goes once its newest snapshot is durable.
    pub async fn surrender(&self, actor: &str, owner: &str) -> Result<()> {
        let mut req = api::SurrenderRequest::new();
        req.actor = actor.to_string();
        req.owner = owner.to_string();
        let req = &req;
        self.call("surrender of the actor lease", |c| async move { c.surrender(ctx(QUICK), req).await }).await?;
        Ok(())
    }

    /// The snapshots of `actor` this node's store knows (with their labels).
    pub async fn list(&self, actor: &str) -> Result<Vec<(SnapshotRef, HashMap<String, String>)>> {
        let mut req = api::ListRequest::new();
        req.actor = actor.to_string();
        let req = &req;
        let r = self.call("list", |c| async move { c.list(ctx(QUICK), req).await }).await?;
        Ok(r.snapshots.iter().filter_map(|i| Some((snapshot_ref(i)?, i.labels.clone()))).collect())
    }

    /// A lifecycle report for the daemon's metrics ([`crate::actor::report`]).
    pub async fn report_lifecycle(&self, req: &api::LifecycleReport) -> Result<()> {
        self.call("lifecycle report", |c| async move { c.report_lifecycle(ctx(REPORT), req).await }).await?;
        Ok(())
    }

    /// Deletes a snapshot from both tiers.
    pub async fn remove(&self, snap: &SnapshotRef) -> Result<()> {
        let (op, req) = (format!("remove {snap}"), id(snap));
        let req = &req;
        self.call(&op, |c| async move { c.remove(ctx(LONG), req).await }).await?;
        Ok(())
    }
}

/// What the actor's lifecycle asks of the store, with what it was doing
/// in front of the store's message.
impl SnapshotStore {
    /// A staging directory for a new snapshot of `actor`.
    pub async fn begin_staging(&self, actor: &str) -> Result<Staging> {
        self.begin(actor).await.map_err(|e| e.context(&format!("suspend of actor {actor}: no staging directory in the snapshot store")))
    }

    /// Commits a suspend's staging directory. A staging the store no
    /// longer has was either committed by an attempt whose answer was lost
    /// (found by its label) or is gone: `NotFound`, the checkpoint is lost.
    pub async fn commit_staging(
        &self,
        actor: &str,
        staging: &Staging,
        labels: HashMap<String, String>,
        keep_local: Option<Duration>,
    ) -> Result<SnapshotRef> {
        match self.commit(staging, labels, keep_local).await {
            Ok(s) => Ok(s),
            Err(e) if e.is_store(StoreErrorKind::NotFound) => {
                let found = self.list(actor).await?.into_iter().find(|(_, l)| l.get(LABEL_STAGING) == Some(&staging.id));
                match found {
                    Some((s, _)) => Ok(s),
                    None => Err(Error::store(
                        StoreErrorKind::NotFound,
                        format!(
                            "the staging directory {} ({}) of actor {actor}'s suspend is gone from the snapshot store ({e}): the checkpoint is lost",
                            staging.id,
                            staging.path.display()
                        ),
                    )),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// A view of a suspend's staging (not committed yet), as a checkout of
    /// the snapshot it becomes (`snap` names the actor's generation in the
    /// shim's record; the store numbers the snapshot when the commit
    /// completes). `NotFound` once the commit is done.
    pub async fn view_staging_as(&self, staging: &Staging, snap: &SnapshotRef) -> Result<Checkout> {
        let (path, lease) = self.view_staging(staging).await?;
        Ok(Checkout { snapshot: snap.clone(), path, lease, page_server: None })
    }

    /// This node still holds `actor`'s lease (for shim `owner`): until
    /// when. A torpor-snapshotter older than lease confirmation (a node
    /// halfway through an upgrade) cannot tell: `None`, logged once per
    /// shim; the actor is then guarded by its lease's acquisition only.
    pub async fn confirm_lease(&self, actor: &str, owner: &str) -> Result<Option<u64>> {
        match self.confirm(actor, owner).await {
            Ok(until) => Ok(Some(until)),
            Err(e) if e.is_store(StoreErrorKind::Unimplemented) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| warn!(actor, "the node's torpor-snapshotter cannot confirm actor leases (upgrade it): no lease fence for this shim's actor ({e})"));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The actor leaves this node (pod removed, shim dead): its lease goes
    /// once its newest snapshot is durable. Logged, never fails.
    pub async fn surrender_logged(&self, actor: &str, owner: &str) {
        if let Err(e) = self.surrender(actor, owner).await {
            warn!(actor, "surrender of the actor lease: {e} (it expires unless renewed)");
        }
    }

    /// Drops a staging directory (a failed suspend); logged, never fails.
    pub async fn abort_logged(&self, staging: &Staging) {
        match self.abort(staging).await {
            Ok(()) => {}
            Err(e) if e.is_store(StoreErrorKind::NotFound) => {}
            Err(e) => warn!(staging = staging.id.as_str(), "abort of the staging directory {:?}: {e}", staging.path),
        }
    }

    /// Releases a checkout lease; logged, never fails.
    pub async fn release_logged(&self, lease: &str) {
        let co = Checkout {
            snapshot: SnapshotRef { actor: String::new(), generation: 0 },
            path: PathBuf::new(),
            page_server: None,
            lease: lease.to_string(),
        };
        match self.release(&co).await {
            Ok(()) => {}
            Err(e) if e.is_store(StoreErrorKind::NotFound) => {}
            Err(e) => warn!(lease, "release of a snapshot checkout: {e}"),
        }
    }

    /// Removes every snapshot of `actor` from the store (a default-id
    /// actor removed while RUNNING: they are stale). Logged, never fails.
    pub async fn remove_all_logged(&self, actor: &str) {
        let r = async {
            let mut gone = Vec::new();
            for (s, _) in self.list(actor).await? {
                self.remove(&s).await?;
                gone.push(s.to_string());
            }
            Ok::<_, Error>(gone)
        }
        .await;
        match r {
            Ok(gone) if gone.is_empty() => {}
            Ok(gone) => info!(actor, removed = ?gone, "stale snapshots of the actor removed"),
            Err(e) => warn!(actor, "removal of the actor's stale snapshots: {e}"),
        }
    }
}

/// The kind of the daemon's error: the one its status carries
/// ([`api::error_kind`]); without one (a daemon from before it, an error of
/// ttrpc itself), the status code's.
fn error_kind(s: &ttrpc::proto::Status) -> StoreErrorKind {
    use api::ErrorKind as K;
    use ttrpc::Code;
    match api::error_kind(s) {
        Some(K::INVALID_ARGUMENT) => StoreErrorKind::InvalidArgument,
        Some(K::NOT_FOUND) => StoreErrorKind::NotFound,
        // Not proven free: another node may hold it.
        Some(K::LEASE_HELD | K::LEASE_UNPROVEN) => StoreErrorKind::LeaseHeld,
        Some(K::LEASE_LOST) => StoreErrorKind::LeaseLost,
        Some(K::FAILED_PRECONDITION) => StoreErrorKind::FailedPrecondition,
        Some(K::CORRUPT) => StoreErrorKind::Corrupt,
        Some(K::UNAVAILABLE) => StoreErrorKind::Unavailable,
        Some(K::CONFLICT | K::INTERNAL | K::ERROR_KIND_UNSPECIFIED) => StoreErrorKind::Other,
        None => match s.code() {
            Code::NOT_FOUND => StoreErrorKind::NotFound,
            Code::INVALID_ARGUMENT => StoreErrorKind::InvalidArgument,
            Code::FAILED_PRECONDITION => StoreErrorKind::FailedPrecondition,
            Code::DATA_LOSS => StoreErrorKind::Corrupt,
            Code::UNIMPLEMENTED => StoreErrorKind::Unimplemented,
            Code::UNAVAILABLE | Code::DEADLINE_EXCEEDED => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Other,
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use api::ErrorKind as K;

    /// The kind of an error status the daemon sent with `kind`.
    fn kind_of(code: ttrpc::Code, kind: K) -> StoreErrorKind {
        error_kind(&api::error_status(code, "refused", kind))
    }

    // One kind per test: the kind on the wire decides, whatever the call
    // (the client no longer guesses it from the call it made).
    #[test]
    fn lease_held_is_lease_held() {
        assert_eq!(kind_of(ttrpc::Code::FAILED_PRECONDITION, K::LEASE_HELD), StoreErrorKind::LeaseHeld);
    }

    #[test]
    fn a_lease_not_proven_free_is_held() {
        assert_eq!(kind_of(ttrpc::Code::FAILED_PRECONDITION, K::LEASE_UNPROVEN), StoreErrorKind::LeaseHeld);
    }

    #[test]
    fn lease_lost_is_lease_lost() {
        assert_eq!(kind_of(ttrpc::Code::FAILED_PRECONDITION, K::LEASE_LOST), StoreErrorKind::LeaseLost);
    }

    #[test]
    fn another_precondition_is_a_failed_precondition() {
        assert_eq!(kind_of(ttrpc::Code::FAILED_PRECONDITION, K::FAILED_PRECONDITION), StoreErrorKind::FailedPrecondition);
    }

    #[test]
    fn not_found_is_not_found() {
        assert_eq!(kind_of(ttrpc::Code::NOT_FOUND, K::NOT_FOUND), StoreErrorKind::NotFound);
    }

    #[test]
    fn invalid_argument_is_invalid_argument() {
        assert_eq!(kind_of(ttrpc::Code::INVALID_ARGUMENT, K::INVALID_ARGUMENT), StoreErrorKind::InvalidArgument);
    }

    #[test]
    fn corrupt_is_corrupt() {
        assert_eq!(kind_of(ttrpc::Code::DATA_LOSS, K::CORRUPT), StoreErrorKind::Corrupt);
    }

    #[test]
    fn unavailable_is_unavailable() {
        assert_eq!(kind_of(ttrpc::Code::UNAVAILABLE, K::UNAVAILABLE), StoreErrorKind::Unavailable);
    }

    #[test]
    fn a_conflict_and_an_internal_error_are_other() {
        assert_eq!(kind_of(ttrpc::Code::ABORTED, K::CONFLICT), StoreErrorKind::Other);
        assert_eq!(kind_of(ttrpc::Code::INTERNAL, K::INTERNAL), StoreErrorKind::Other);
    }

    #[test]
    fn the_kind_wins_over_the_code() {
        // A lease lost at any call is lost, not the call's guess.
        assert_eq!(kind_of(ttrpc::Code::FAILED_PRECONDITION, K::LEASE_LOST), StoreErrorKind::LeaseLost);
        assert_eq!(kind_of(ttrpc::Code::UNKNOWN, K::NOT_FOUND), StoreErrorKind::NotFound);
    }

    #[test]
    fn without_a_kind_the_code_tells() {
        let code = |c| error_kind(&ttrpc::get_status(c, "an older daemon"));
        assert_eq!(code(ttrpc::Code::FAILED_PRECONDITION), StoreErrorKind::FailedPrecondition);
        assert_eq!(code(ttrpc::Code::NOT_FOUND), StoreErrorKind::NotFound);
        assert_eq!(code(ttrpc::Code::UNIMPLEMENTED), StoreErrorKind::Unimplemented);
        assert_eq!(code(ttrpc::Code::DEADLINE_EXCEEDED), StoreErrorKind::Unavailable);
        assert_eq!(code(ttrpc::Code::INTERNAL), StoreErrorKind::Other);
    }
}
