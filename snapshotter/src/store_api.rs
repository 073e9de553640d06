//! The store API (`torpor.store.v1.Store`, ttrpc) over [`torpor_store::Store`]:
//! what the shim and torporctl call on `/run/torpor/store.sock`.
//!
//! Every store error keeps its message (it names the snapshot and the
//! problem) and is mapped onto the ttrpc code a caller can act on:
//! invalid input → INVALID_ARGUMENT, unknown snapshot/staging/lease →
//! NOT_FOUND, a refused eviction (not durable, pinned) or a lease held
//! elsewhere or lost → FAILED_PRECONDITION, corrupt data → DATA_LOSS, an
//! unreachable object tier → UNAVAILABLE; and the status's details carry
//! its kind (`torpor.store.v1.ErrorKind`: which lease error, which
//! precondition), so that no caller tells errors apart by their text or by
//! the call it made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use torpor_api::store as api;
use torpor_api::ttrpc::{self, r#async::TtrpcContext, Code};
use tracing::{info, warn};

use torpor_store::{self as store, ActorName, CommitOptions, GcPolicy, SnapshotId, Store};

/// A transfer in flight: its kind, its snapshot, its progress.
type Transfer = (String, SnapshotId, tokio::sync::watch::Receiver<(u64, u64)>);

/// The service: the store plus the transfers in flight (for `Status`).
///
/// Store operations run on the *data* runtime (commits, fetches, uploads,
/// queries); the service itself may be served on another one (the daemon
/// serves it on a runtime of its own), where `Confirm` is answered from
/// memory: a data runtime busy or wedged by heavy I/O never delays it.
pub struct StoreService {
    store: Arc<Store>,
    /// Snapshots kept per actor by `Gc` without an explicit `keep`.
    gc_keep: usize,
    transfers: Mutex<HashMap<u64, Transfer>>,
    next: std::sync::atomic::AtomicU64,
    data: tokio::runtime::Handle,
    /// Failed requests counted, shims' lifecycle reports taken (none: metrics off).
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The page server's socket (none: no streamed checkouts).
    page_server: Option<std::path::PathBuf>,
    /// The node's `[tenancy]` policy, served by `Policy`.
    tenancy: crate::config::TenancySection,
}

impl StoreService {
    /// Store operations on the current runtime.
    pub fn new(store: Arc<Store>, gc_keep: usize) -> Self {
        Self::with_data_runtime(store, gc_keep, tokio::runtime::Handle::current())
    }

    /// Store operations on runtime `data`.
    pub fn with_data_runtime(store: Arc<Store>, gc_keep: usize, data: tokio::runtime::Handle) -> Self {
        Self {
            store,
            gc_keep,
            transfers: Mutex::new(HashMap::new()),
            next: 0.into(),
            data,
            metrics: None,
            page_server: None,
            tenancy: Default::default(),
        }
    }

    /// The node's `[tenancy]` policy, answered by `Policy` (default: a pod
    /// clones only actors of its own namespace).
    pub fn with_tenancy(mut self, tenancy: crate::config::TenancySection) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// Streamed checkouts, their pages served by the page server on `socket`.
    pub fn with_page_server(mut self, socket: std::path::PathBuf) -> Self {
        self.page_server = Some(socket);
        self
    }

    /// Counts failed requests and takes the shims' lifecycle reports into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// A failed request `op`: counted, as a ttrpc status.
    fn err(&self, op: &str, e: store::Error) -> ttrpc::Error {
        if let Some(m) = &self.metrics {
            m.api_error(op, &e);
        }
        status(op, e)
    }

    /// `Confirm`: answered at once from memory while the lease is valid for
    /// long enough (no database, object tier, data runtime or other lease
    /// operation in the way); otherwise renewed first, on the runtime
    /// serving this call (not the data runtime).
    pub async fn confirm_lease(&self, actor: ActorName, owner: String) -> store::Result<(u64, u64)> {
        if let Some(answer) = self.store.confirm_now(&actor, &owner) {
            return answer;
        }
        let store = self.store.clone();
        tokio::spawn(async move { store.confirm(&actor, &owner).await })
            .await
            .map_err(|e| store::Error::Internal(format!("store task: {e}")))?
    }

    /// The ttrpc service map to register on a server.
    pub fn into_service(self) -> HashMap<String, ttrpc::r#async::Service> {
        api::create_store(Arc::new(self))
    }

    /// Runs `f` with a progress channel that `Status` reports as a transfer
    /// (see [`StoreService::detached`]).
    async fn tracked<T, F, Fut>(&self, kind: &str, id: &SnapshotId, f: F) -> store::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Store>, store::Progress) -> Fut,
        Fut: std::future::Future<Output = store::Result<T>> + Send + 'static,
    {
        struct Entry<'a>(&'a StoreService, u64);
        impl Drop for Entry<'_> {
            fn drop(&mut self) {
                lock(&self.0.transfers).remove(&self.1);
            }
        }
        let (tx, rx) = tokio::sync::watch::channel((0, 0));
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.transfers).insert(key, (kind.to_string(), id.clone(), rx));
        let _entry = Entry(self, key);
        self.detached(|store| f(store, tx)).await
    }

    /// Runs a store operation in a task of its own: a caller that goes away
    /// (its connection closed, its shim killed) does not cut the operation
    /// short half-way (a commit, a fetch, an upload run to their end).
    async fn detached<T, F, Fut>(&self, f: F) -> store::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Store>) -> Fut,
        Fut: std::future::Future<Output = store::Result<T>> + Send + 'static,
    {
        self.data.spawn(f(self.store.clone())).await.map_err(|e| store::Error::Internal(format!("store task: {e}")))?
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A store error as a ttrpc status: the message is the error's text, the
/// code and the kind (in the status's details, [`api::error_status`]) are
/// what a caller acts on.
fn status(op: &str, e: store::Error) -> ttrpc::Error {
    let (code, kind) = code_and_kind(&e);
    if code == Code::INTERNAL || code == Code::DATA_LOSS {
        warn!(op, error = %e, "store request failed");
    }
    ttrpc::Error::RpcStatus(api::error_status(code, e.to_string(), kind))
}

/// The ttrpc code and the store API's error kind of a store error.
fn code_and_kind(e: &store::Error) -> (Code, api::ErrorKind) {
    use api::ErrorKind as K;
    use store::Error as E;
    match e {
        E::InvalidId(_) | E::InvalidArgument(_) | E::UnsupportedFile { .. } => (Code::INVALID_ARGUMENT, K::INVALID_ARGUMENT),
        e if e.is_not_found() => (Code::NOT_FOUND, K::NOT_FOUND),
        E::LeaseHeld { .. } => (Code::FAILED_PRECONDITION, K::LEASE_HELD),
        E::LeaseUnproven { .. } => (Code::FAILED_PRECONDITION, K::LEASE_UNPROVEN),
        E::LeaseLost { .. } => (Code::FAILED_PRECONDITION, K::LEASE_LOST),
        E::NotDurable { .. } | E::Pinned { .. } | E::PinnedElsewhere { .. } | E::NoLocalCopy { .. } | E::UnknownKey { .. } => {
            (Code::FAILED_PRECONDITION, K::FAILED_PRECONDITION)
        }
        E::Conflict { .. } => (Code::ABORTED, K::CONFLICT),
        E::Corrupt { .. } => (Code::DATA_LOSS, K::CORRUPT),
        E::FetchFailed { source, .. } if matches!(**source, E::Corrupt { .. }) => (Code::DATA_LOSS, K::CORRUPT),
        E::StreamFailed { corrupt: true, .. } => (Code::DATA_LOSS, K::CORRUPT),
        e if e.is_remote_unavailable() => (Code::UNAVAILABLE, K::UNAVAILABLE),
        E::ShuttingDown | E::CommitInProgress { .. } => (Code::UNAVAILABLE, K::UNAVAILABLE),
        _ => (Code::INTERNAL, K::INTERNAL),
    }
}

fn invalid(msg: String) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(api::error_status(Code::INVALID_ARGUMENT, msg, api::ErrorKind::INVALID_ARGUMENT))
}

fn actor(s: &str) -> ttrpc::Result<ActorName> {
    ActorName::new(s).map_err(|e| status("parse", e.into()))
}

fn snapshot_id(id: Option<&api::SnapshotId>) -> ttrpc::Result<SnapshotId> {
    let id = id.ok_or_else(|| invalid("no snapshot id given".into()))?;
    if id.generation == 0 {
        return Err(invalid(format!("snapshot {}@0: generations start at 1", id.actor)));
    }
    Ok(SnapshotId::new(actor(&id.actor)?, id.generation))
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn to_api_id(id: &SnapshotId) -> api::SnapshotId {
    let mut a = api::SnapshotId::new();
    a.actor = id.actor.to_string();
    a.generation = id.generation;
    a
}

fn to_api_info(i: &store::SnapshotInfo) -> api::SnapshotInfo {
    let mut a = api::SnapshotInfo::new();
    a.id = protobuf::MessageField::some(to_api_id(&i.id));
    a.created_unix_ms = unix_ms(i.created);
    a.bytes = i.logical_bytes;
    a.local = i.local;
    a.remote = i.remote == store::RemoteState::Durable;
    a.durable = i.durable;
    a.labels = i.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    a.last_used_unix_ms = unix_ms(i.last_used);
    a.keep_local_until_unix_ms = unix_ms(i.keep_local_until);
    a.manifest_digest = format!("sha256:{}", i.manifest_digest);
    a.state = state_name(i);
    a.chunk_count = i.chunk_count;
    a.pins = i.pins as u32;
    a.upload_attempts = i.upload_attempts;
    a.last_error = i.last_error.clone().unwrap_or_default();
    a.key_id = i.key_id.clone().unwrap_or_default();
    a
}

/// One word for an operator: where the snapshot is and whether it is safe.
fn state_name(i: &store::SnapshotInfo) -> String {
    use store::{LocalState as L, RemoteState as R};
    match (&i.local_state, &i.remote) {
        (L::Committing { .. }, _) => "committing",
        (L::Fetching { .. }, _) => "fetching",
        (L::Evicting, _) => "evicting",
        (L::Present, R::Durable) => "durable",
        (L::Present, R::Uploading) => "uploading",
        (L::Present, R::Absent) => "local",
        (L::Absent, R::Durable) => "remote",
        (L::Absent, _) => "lost",
    }
    .to_string()
}

#[async_trait]
impl api::Store for StoreService {
    async fn begin(&self, _: &TtrpcContext, req: api::BeginRequest) -> ttrpc::Result<api::BeginResponse> {
        let a = actor(&req.actor)?;
        let st = self.detached(|s| async move { s.begin(&a).await }).await.map_err(|e| self.err("begin", e))?;
        let mut r = api::BeginResponse::new();
        r.staging_id = st.id;
        r.path = st.path.to_string_lossy().into_owned();
        Ok(r)
    }

    async fn commit(&self, _: &TtrpcContext, req: api::CommitRequest) -> ttrpc::Result<api::SnapshotInfo> {
        if let Some(s) = req.keep_local_seconds.filter(|s| *s > store::config::MAX_DURATION.as_secs()) {
            return Err(invalid(format!("keep_local_seconds {s} is longer than 3650 days")));
        }
        let opts = CommitOptions { labels: req.labels.into_iter().collect(), keep_local: req.keep_local_seconds.map(Duration::from_secs) };
        let info = self.detached(|s| async move { s.commit(&req.staging_id, opts).await }).await.map_err(|e| self.err("commit", e))?;
        info!(snapshot = %info.id, bytes = info.logical_bytes, "snapshot committed");
        Ok(to_api_info(&info))
    }

    async fn abort(&self, _: &TtrpcContext, req: api::AbortRequest) -> ttrpc::Result<api::Empty> {
        self.detached(|s| async move { s.abort(&req.staging_id).await }).await.map_err(|e| self.err("abort", e))?;
        Ok(api::Empty::new())
    }

    async fn latest(&self, _: &TtrpcContext, req: api::LatestRequest) -> ttrpc::Result<api::LatestResponse> {
        let a = actor(&req.actor)?;
        let info = self.detached(|s| async move { s.latest(&a).await }).await.map_err(|e| self.err("latest", e))?;
        let mut r = api::LatestResponse::new();
        r.info = info.as_ref().map(to_api_info).into();
        Ok(r)
    }

    async fn checkout(&self, _: &TtrpcContext, req: api::CheckoutRequest) -> ttrpc::Result<api::CheckoutResponse> {
        let id = snapshot_id(req.id.as_ref())?;
        let t0 = std::time::Instant::now();
        if let (true, Some(socket)) = (req.stream, &self.page_server) {
            let id2 = id.clone();
            let (co, stream) =
                self.detached(|s| async move { s.checkout_streamed(&id2).await }).await.map_err(|e| self.err("checkout", e))?;
            info!(snapshot = %co.info.id, streamed = stream.is_some(), ms = t0.elapsed().as_secs_f64() * 1e3, "snapshot checked out");
            let mut r = api::CheckoutResponse::new();
            r.info = protobuf::MessageField::some(to_api_info(&co.info));
            r.path = co.path.to_string_lossy().into_owned();
            r.lease = co.lease;
            if stream.is_some() {
                r.streamed = true;
                r.page_server = socket.to_string_lossy().into_owned();
            }
            return Ok(r);
        }
        let id2 = id.clone();
        let co = self
            .tracked("fetch", &id, |store, p| async move { store.checkout(&id2, Some(p)).await })
            .await
            .map_err(|e| self.err("checkout", e))?;
        info!(snapshot = %co.info.id, fetched = co.fetched, verified_bytes = co.verified_bytes, ms = t0.elapsed().as_secs_f64() * 1e3, "snapshot checked out");
        let mut r = api::CheckoutResponse::new();
        r.info = protobuf::MessageField::some(to_api_info(&co.info));
        r.path = co.path.to_string_lossy().into_owned();
        r.lease = co.lease;
        Ok(r)
    }

    async fn wait_stream(&self, _: &TtrpcContext, req: api::WaitStreamRequest) -> ttrpc::Result<api::WaitStreamResponse> {
        let lease = req.lease;
        let s = self.detached(|s| async move { s.wait_stream(&lease).await }).await.map_err(|e| self.err("wait stream", e))?;
        Ok(api::WaitStreamResponse {
            fetched_bytes: s.fetched_bytes,
            chunks: s.chunks,
            chunks_before_restore: s.chunks_before_restore,
            manifest_ms: s.manifest_ms,
            ready_ms: s.ready_ms,
            first_page_ms: s.first_page_ms.unwrap_or(0),
            done_ms: s.done_ms,
            pages_served: s.pages_served,
            pages_waited: s.pages_waited,
            working_set_chunks: s.working_set_chunks,
            working_set_recorded: s.working_set_recorded,
            ..Default::default()
        })
    }

    async fn view_staging(&self, _: &TtrpcContext, req: api::ViewStagingRequest) -> ttrpc::Result<api::ViewStagingResponse> {
        let (path, lease) =
            self.detached(|s| async move { s.view_staging(&req.staging_id).await }).await.map_err(|e| self.err("view staging", e))?;
        let mut r = api::ViewStagingResponse::new();
        r.path = path.to_string_lossy().into_owned();
        r.lease = lease;
        Ok(r)
    }

    async fn acquire(&self, _: &TtrpcContext, req: api::AcquireRequest) -> ttrpc::Result<api::AcquireResponse> {
        if req.owner.is_empty() {
            return Err(invalid("acquire: owner (the shim) must be set".into()));
        }
        let a = actor(&req.actor)?;
        let g = self.detached(|s| async move { s.acquire(&a, &req.owner).await }).await.map_err(|e| self.err("acquire", e))?;
        let mut r = api::AcquireResponse::new();
        r.epoch = g.epoch;
        r.durable_generation = g.durable_generation;
        if let Some(p) = g.previous {
            r.previous_node = p.node;
            r.previous_expired = !p.released;
        }
        Ok(r)
    }

    async fn confirm(&self, _: &TtrpcContext, req: api::ConfirmRequest) -> ttrpc::Result<api::ConfirmResponse> {
        let a = actor(&req.actor)?;
        let (epoch, until) = self.confirm_lease(a, req.owner).await.map_err(|e| self.err("confirm", e))?;
        let mut r = api::ConfirmResponse::new();
        r.epoch = epoch;
        r.valid_until_unix_ms = until;
        Ok(r)
    }

    async fn surrender(&self, _: &TtrpcContext, req: api::SurrenderRequest) -> ttrpc::Result<api::Empty> {
        let a = actor(&req.actor)?;
        let a2 = a.clone();
        self.detached(|s| async move { s.surrender(&a2, &req.owner).await }).await.map_err(|e| self.err("surrender", e))?;
        // The actor leaves this node (unless another shim here runs it now).
        let runs_here = self.store.actor_leases().is_ok_and(|l| l.iter().any(|h| h.doc.actor == a && !h.surrendering));
        if let (Some(m), false) = (&self.metrics, runs_here) {
            m.lifecycle().forget(a.as_str(), "");
        }
        Ok(api::Empty::new())
    }

    async fn release(&self, _: &TtrpcContext, req: api::ReleaseRequest) -> ttrpc::Result<api::Empty> {
        self.detached(|s| async move { s.release(&req.lease).await }).await.map_err(|e| self.err("release", e))?;
        Ok(api::Empty::new())
    }

    async fn list(&self, _: &TtrpcContext, req: api::ListRequest) -> ttrpc::Result<api::ListResponse> {
        let filter = if req.actor.is_empty() { None } else { Some(actor(&req.actor)?) };
        if req.refresh {
            let f = filter.clone();
            self.detached(|s| async move { s.refresh(f.as_ref()).await })
                .await
                .map_err(|e| self.err("list (refresh from the object tier)", e))?;
        }
        let list = self.detached(|s| async move { s.list(filter.as_ref()).await }).await.map_err(|e| self.err("list", e))?;
        let mut r = api::ListResponse::new();
        r.snapshots = list.iter().map(to_api_info).collect();
        Ok(r)
    }

    async fn inspect(&self, _: &TtrpcContext, req: api::SnapshotId) -> ttrpc::Result<api::InspectResponse> {
        let id = snapshot_id(Some(&req))?;
        let id2 = id.clone();
        let (info, manifest) = self.detached(|s| async move { s.inspect(&id2).await }).await.map_err(|e| self.err("inspect", e))?;
        let mut r = api::InspectResponse::new();
        r.info = protobuf::MessageField::some(to_api_info(&info));
        r.chunk_objects = self.store.chunk_objects(&info, &manifest).into_iter().collect();
        r.manifest_json = serde_json::to_string(&manifest).map_err(|e| {
            ttrpc::Error::RpcStatus(api::error_status(Code::INTERNAL, format!("serialize manifest: {e}"), api::ErrorKind::INTERNAL))
        })?;
        Ok(r)
    }

    async fn upload(&self, _: &TtrpcContext, req: api::SnapshotId) -> ttrpc::Result<api::SnapshotInfo> {
        let id = snapshot_id(Some(&req))?;
        let id2 = id.clone();
        let info = self
            .tracked("upload", &id, |store, p| async move { store.upload(&id2, Some(p)).await })
            .await
            .map_err(|e| self.err("upload", e))?;
        info!(snapshot = %info.id, "snapshot uploaded on demand");
        Ok(to_api_info(&info))
    }

    async fn evict(&self, _: &TtrpcContext, req: api::SnapshotId) -> ttrpc::Result<api::Empty> {
        let id = snapshot_id(Some(&req))?;
        let id2 = id.clone();
        self.detached(|s| async move { s.evict(&id2).await }).await.map_err(|e| self.err("evict", e))?;
        info!(snapshot = %id, "local copy evicted on demand");
        Ok(api::Empty::new())
    }

    async fn remove(&self, _: &TtrpcContext, req: api::SnapshotId) -> ttrpc::Result<api::Empty> {
        let id = snapshot_id(Some(&req))?;
        let id2 = id.clone();
        self.detached(|s| async move { s.remove(&id2).await }).await.map_err(|e| self.err("remove", e))?;
        info!(snapshot = %id, "snapshot removed");
        Ok(api::Empty::new())
    }

    async fn gc(&self, _: &TtrpcContext, req: api::GcRequest) -> ttrpc::Result<api::GcResponse> {
        let mut policy = GcPolicy { keep_newest: self.gc_keep, ..Default::default() };
        if req.keep > 0 {
            policy.keep_newest = req.keep as usize;
        }
        if !req.actor.is_empty() {
            policy.actor = Some(actor(&req.actor)?);
            policy.sweep_chunks = false;
        }
        let rep = self.detached(|s| async move { s.gc(policy).await }).await.map_err(|e| self.err("gc", e))?;
        info!(removed = rep.removed.len(), chunks = rep.chunks_deleted, "gc done");
        let mut r = api::GcResponse::new();
        r.removed = rep.removed.iter().map(to_api_id).collect();
        r.kept_pinned = rep.kept_pinned.iter().map(to_api_id).collect();
        r.chunks_removed = rep.chunks_deleted;
        r.bytes_freed = rep.chunk_bytes_deleted;
        r.chunks_kept_young = rep.chunks_kept_young;
        r.errors = rep.errors;
        Ok(r)
    }

    async fn report_lifecycle(&self, _: &TtrpcContext, req: api::LifecycleReport) -> ttrpc::Result<api::Empty> {
        if let Some(m) = &self.metrics {
            m.lifecycle().ingest(&crate::metrics::lifecycle::Report {
                actor: &req.actor,
                owner: &req.owner,
                seq: req.seq,
                op: &req.op,
                outcome: &req.outcome,
                reason: &req.reason,
                phases: req.phases.iter().map(|p| (p.name.as_str(), p.seconds)).collect(),
                state: &req.state,
                dropped: req.dropped,
                trigger: &req.trigger,
            });
        }
        Ok(api::Empty::new())
    }

    async fn policy(&self, _: &TtrpcContext, _: api::Empty) -> ttrpc::Result<api::PolicyResponse> {
        let mut r = api::PolicyResponse::new();
        r.clone_source_namespaces = self.tenancy.clone_source_namespaces.clone();
        Ok(r)
    }

    async fn status(&self, _: &TtrpcContext, _: api::Empty) -> ttrpc::Result<api::StatusResponse> {
        let st = self.store.status();
        let mut r = api::StatusResponse::new();
        r.local_budget_bytes = st.local_budget_bytes;
        r.local_bytes = st.local_bytes;
        r.pending_uploads = st.pending_uploads as u32;
        r.snapshots = st.snapshots as u32;
        r.local_snapshots = st.local_snapshots as u32;
        r.pinned_snapshots = st.pinned_snapshots as u32;
        r.disk_pressure = st.disk_pressure;
        r.uploaded_bytes = st.uploaded_bytes;
        r.uploaded_raw_bytes = st.uploaded_raw_bytes;
        r.uploaded_chunks = st.uploaded_chunks;
        r.deduplicated_chunks = st.deduplicated_chunks;
        r.fetched_bytes = st.fetched_bytes;
        r.remote_url = self.store.config().remote_url.clone();
        r.node_id = self.store.config().node_id.clone();
        r.actor_leases = self.store.lease_summary();
        r.errors = st.last_errors.iter().map(|(t, e)| format!("{} {e}", unix_ms(*t))).collect();
        r.transfers = lock(&self.transfers)
            .values()
            .map(|(kind, id, rx)| {
                let (done, total) = *rx.borrow();
                let mut t = api::Transfer::new();
                t.kind = kind.clone();
                t.id = protobuf::MessageField::some(to_api_id(id));
                t.done_bytes = done;
                t.total_bytes = total;
                t
            })
            .collect();
        for (id, done, total) in self.store.streams_under_way() {
            let mut t = api::Transfer::new();
            t.kind = "fetch".into();
            t.id = protobuf::MessageField::some(to_api_id(&id));
            t.done_bytes = done;
            t.total_bytes = total;
            r.transfers.push(t);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39: the kind of a store error crosses the wire in the status's
    /// details (a lease held elsewhere, unproven and lost are three kinds of
    /// one FAILED_PRECONDITION code), each with its code.
    #[test]
    fn every_error_status_carries_its_kind() {
        use api::ErrorKind as K;
        let actor = ActorName::new("ns/a").unwrap();
        let id = SnapshotId::new(actor.clone(), 3);
        let cases = [
            (store::Error::InvalidArgument("x".into()), Code::INVALID_ARGUMENT, K::INVALID_ARGUMENT),
            (store::Error::NotFound(id.clone()), Code::NOT_FOUND, K::NOT_FOUND),
            (store::Error::StagingNotFound("s".into()), Code::NOT_FOUND, K::NOT_FOUND),
            (
                store::Error::LeaseHeld { actor: actor.clone(), node: "b".into(), owner: "shim".into(), until: "later".into() },
                Code::FAILED_PRECONDITION,
                K::LEASE_HELD,
            ),
            (
                store::Error::LeaseUnproven { actor: actor.clone(), why: "w".into(), retry: "r".into() },
                Code::FAILED_PRECONDITION,
                K::LEASE_UNPROVEN,
            ),
            (store::Error::LeaseLost { actor: actor.clone(), detail: "d".into() }, Code::FAILED_PRECONDITION, K::LEASE_LOST),
            (store::Error::NotDurable { id: id.clone(), state: "local".into() }, Code::FAILED_PRECONDITION, K::FAILED_PRECONDITION),
            (store::Error::Pinned { id: id.clone(), leases: 1 }, Code::FAILED_PRECONDITION, K::FAILED_PRECONDITION),
            (store::Error::Conflict { id: id.clone(), detail: "d".into() }, Code::ABORTED, K::CONFLICT),
            (store::Error::Corrupt { id: id.clone(), what: "w".into() }, Code::DATA_LOSS, K::CORRUPT),
            (store::Error::StreamFailed { id: id.clone(), why: "w".into(), corrupt: false }, Code::UNAVAILABLE, K::UNAVAILABLE),
            (store::Error::ShuttingDown, Code::UNAVAILABLE, K::UNAVAILABLE),
            (store::Error::Internal("x".into()), Code::INTERNAL, K::INTERNAL),
        ];
        for (e, code, kind) in cases {
            let what = e.to_string();
            let ttrpc::Error::RpcStatus(s) = status("test", e) else { panic!("{what}: not a status") };
            assert_eq!((s.code(), api::error_kind(&s)), (code, Some(kind)), "{what}");
            assert_eq!(s.message, what);
        }
    }

    /// Issue 14, finding 6: Confirm is answered off the data path. The data
    /// runtime here is wedged (its only worker blocked, as by a commit's
    /// fsync or a busy disk under uploads); the service, served on another
    /// runtime, still answers Confirm from the lease it holds.
    #[test]
    fn confirm_is_answered_while_the_data_runtime_is_wedged() {
        let data = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let api_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let actor = ActorName::new("ns/busy").unwrap();
        let store = data.block_on(async {
            let mut cfg = store::StoreConfig::new(tmp.path().join("store"));
            cfg.background = false;
            let remote = store::Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
            let s = Store::open_with_remote(cfg, remote).await.unwrap();
            s.acquire(&actor, "shim-1").await.unwrap();
            s
        });
        let svc = StoreService::with_data_runtime(store, 2, data.handle().clone());
        let (release, wedged) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        data.spawn(async move {
            started_tx.send(()).unwrap();
            let _ = wedged.recv(); // blocks the data runtime's only worker
        });
        started.recv().unwrap();
        let answer = api_rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), svc.confirm_lease(actor.clone(), "shim-1".into())).await });
        release.send(()).unwrap();
        let (epoch, until) = answer.expect("Confirm waited for the wedged data runtime").unwrap();
        assert_eq!(epoch, 1);
        assert!(until > unix_ms(SystemTime::now()) as u64);
        // Another shim's confirmation is refused from memory too.
        let other = api_rt.block_on(svc.confirm_lease(actor, "shim-2".into()));
        assert!(matches!(other, Err(store::Error::LeaseLost { .. })));
        data.block_on(svc.store.shutdown());
    }
}
