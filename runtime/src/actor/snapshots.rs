//! The actor's edge toward the node's snapshot store: what the lifecycle,
//! the identity lookup and the reports ask of it, as one trait
//! ([`Snapshots`]). [`SnapshotStore`] (the gRPC client of the store) is the
//! one implementation the shim runs; the lifecycle's unit tests run against
//! a stub.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use torpor_api::store as api;

use crate::actor::store_client::{Checkout, Grant, SnapshotRef, SnapshotStore, Staging, StreamDone};
use crate::error::Result;

/// The snapshot store, as the actor uses it (see [`SnapshotStore`] for
/// what each call does).
#[async_trait]
pub trait Snapshots: Send + Sync {
    /// Takes the actor's lease for shim `owner` (refused while another
    /// node holds it).
    async fn acquire(&self, actor: &str, owner: &str) -> Result<Grant>;
    /// Until when (unix ms) the lease still holds; `None` when the store
    /// keeps no lease.
    async fn confirm_lease(&self, actor: &str, owner: &str) -> Result<Option<u64>>;
    /// Gives the lease up (once the newest snapshot is durable); logged.
    async fn surrender_logged(&self, actor: &str, owner: &str);
    /// A staging directory to dump a new snapshot into.
    async fn begin_staging(&self, actor: &str) -> Result<Staging>;
    /// The staging committed as the actor's newest snapshot.
    async fn commit_staging(
        &self,
        actor: &str,
        staging: &Staging,
        labels: HashMap<String, String>,
        keep_local: Option<Duration>,
    ) -> Result<SnapshotRef>;
    /// The staging dropped; logged.
    async fn abort_logged(&self, staging: &Staging);
    /// A view of a staging not committed yet, as the checkout of `snap`.
    async fn view_staging_as(&self, staging: &Staging, snap: &SnapshotRef) -> Result<Checkout>;
    /// The actor's newest snapshot, if any.
    async fn latest(&self, actor: &str) -> Result<Option<SnapshotRef>>;
    /// The verified files of `snap`, pinned by a lease.
    async fn checkout(&self, snap: &SnapshotRef) -> Result<Checkout>;
    /// Like [`Snapshots::checkout`], streamed from the object tier when
    /// only it has the snapshot.
    async fn checkout_streamed(&self, snap: &SnapshotRef) -> Result<Checkout>;
    /// Waits until a streamed checkout is all local.
    async fn wait_stream(&self, lease: &str) -> Result<StreamDone>;
    /// A checkout lease released; logged.
    async fn release_logged(&self, lease: &str);
    /// Every snapshot of the actor removed; logged.
    async fn remove_all_logged(&self, actor: &str);
    /// A lifecycle report for the node's metrics.
    async fn report_lifecycle(&self, report: &api::LifecycleReport) -> Result<()>;
}

#[async_trait]
impl Snapshots for SnapshotStore {
    async fn acquire(&self, actor: &str, owner: &str) -> Result<Grant> {
        SnapshotStore::acquire(self, actor, owner).await
    }
    async fn confirm_lease(&self, actor: &str, owner: &str) -> Result<Option<u64>> {
        SnapshotStore::confirm_lease(self, actor, owner).await
    }
    async fn surrender_logged(&self, actor: &str, owner: &str) {
        SnapshotStore::surrender_logged(self, actor, owner).await
    }
    async fn begin_staging(&self, actor: &str) -> Result<Staging> {
        SnapshotStore::begin_staging(self, actor).await
    }
    async fn commit_staging(
        &self,
        actor: &str,
        staging: &Staging,
        labels: HashMap<String, String>,
        keep_local: Option<Duration>,
    ) -> Result<SnapshotRef> {
        SnapshotStore::commit_staging(self, actor, staging, labels, keep_local).await
    }
    async fn abort_logged(&self, staging: &Staging) {
        SnapshotStore::abort_logged(self, staging).await
    }
    async fn view_staging_as(&self, staging: &Staging, snap: &SnapshotRef) -> Result<Checkout> {
        SnapshotStore::view_staging_as(self, staging, snap).await
    }
    async fn latest(&self, actor: &str) -> Result<Option<SnapshotRef>> {
        SnapshotStore::latest(self, actor).await
    }
    async fn checkout(&self, snap: &SnapshotRef) -> Result<Checkout> {
        SnapshotStore::checkout(self, snap).await
    }
    async fn checkout_streamed(&self, snap: &SnapshotRef) -> Result<Checkout> {
        SnapshotStore::checkout_streamed(self, snap).await
    }
    async fn wait_stream(&self, lease: &str) -> Result<StreamDone> {
        SnapshotStore::wait_stream(self, lease).await
    }
    async fn release_logged(&self, lease: &str) {
        SnapshotStore::release_logged(self, lease).await
    }
    async fn remove_all_logged(&self, actor: &str) {
        SnapshotStore::remove_all_logged(self, actor).await
    }
    async fn report_lifecycle(&self, report: &api::LifecycleReport) -> Result<()> {
        SnapshotStore::report_lifecycle(self, report).await
    }
}
