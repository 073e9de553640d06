//! The tiered store's metrics, read at each scrape: its counters since the
//! daemon started ([`torpor_store::StoreStatus`]: bytes uploaded and
//! fetched, dedup savings, background errors), the local tier against its
//! budget, and the actor leases this node holds.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use torpor_store::{Error, Store};

/// Reads the store at each scrape.
pub struct StoreCollector {
    store: Arc<Store>,
}

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCollector").finish_non_exhaustive()
    }
}

impl StoreCollector {
    pub fn new(store: Arc<Store>) -> Self {
        StoreCollector { store }
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, unit, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: i64) -> Result<(), std::fmt::Error> {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for StoreCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let st = self.store.status();
        let b = Some(&Unit::Bytes);
        counter(
            &mut e,
            "torpor_store_uploaded",
            "Bytes of chunk objects written to the object tier (compressed, sealed)",
            b,
            st.uploaded_bytes,
        )?;
        counter(
            &mut e,
            "torpor_store_uploaded_raw",
            "Uncompressed bytes of the chunks written to the object tier",
            b,
            st.uploaded_raw_bytes,
        )?;
        counter(&mut e, "torpor_store_uploaded_chunks", "Chunks written to the object tier", None, st.uploaded_chunks)?;
        counter(
            &mut e,
            "torpor_store_deduplicated",
            "Uncompressed bytes of chunks not uploaded because the object tier had them already (dedup savings)",
            b,
            st.deduplicated_bytes,
        )?;
        counter(
            &mut e,
            "torpor_store_deduplicated_chunks",
            "Chunks not uploaded because the object tier had them already",
            None,
            st.deduplicated_chunks,
        )?;
        counter(&mut e, "torpor_store_fetched", "Bytes fetched from the object tier", b, st.fetched_bytes)?;
        counter(
            &mut e,
            "torpor_store_untrusted_entries",
            "Object tier entries ignored because they do not authenticate under the keyring",
            None,
            st.untrusted_entries,
        )?;
        counter(
            &mut e,
            "torpor_store_background_errors",
            "Errors of the store's background work (uploads, evictions, leases, gc)",
            None,
            st.background_errors,
        )?;
        counter(
            &mut e,
            "torpor_store_lease_renew_failures",
            "Actor lease renewals that failed (the object tier unreachable, or the lease lost)",
            None,
            st.lease_renew_failures,
        )?;
        gauge(&mut e, "torpor_store_local", "Bytes of snapshots on the local tier", b, int(st.local_bytes))?;
        gauge(&mut e, "torpor_store_local_budget", "Byte budget of the local tier (store.local_budget)", b, int(st.local_budget_bytes))?;
        gauge(
            &mut e,
            "torpor_store_disk_pressure",
            "1 while the local tier is over its budget with nothing evictable (uploads then ignore keep-local)",
            None,
            i64::from(st.disk_pressure),
        )?;
        gauge(&mut e, "torpor_store_snapshots", "Snapshots the store knows (either tier)", None, st.snapshots as i64)?;
        gauge(&mut e, "torpor_store_local_snapshots", "Snapshots with a local copy", None, st.local_snapshots as i64)?;
        gauge(
            &mut e,
            "torpor_store_pending_uploads",
            "Local snapshots not yet durable in the object tier",
            None,
            st.pending_uploads as i64,
        )?;
        gauge(&mut e, "torpor_store_pinned_snapshots", "Snapshots pinned by a checkout", None, st.pinned_snapshots as i64)?;
        let (held, surrendering) = match self.store.actor_leases() {
            Ok(l) => (l.len() as i64, l.iter().filter(|h| h.surrendering).count() as i64),
            Err(_) => (0, 0), // counted as a background error by status above, if the database fails
        };
        gauge(&mut e, "torpor_store_actor_leases", "Actor leases this node holds", None, held)?;
        gauge(
            &mut e,
            "torpor_store_actor_leases_surrendering",
            "Of those, leases being let go (waiting for the actor's newest snapshot to be durable)",
            None,
            surrendering,
        )?;
        Ok(())
    }
}

/// One word for the kind of a store error (the `kind` label).
pub fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidId(_) | Error::InvalidArgument(_) | Error::UnsupportedFile { .. } => "invalid",
        Error::InvalidConfig(_) => "config",
        Error::LeaseHeld { .. } | Error::LeaseUnproven { .. } => "lease_held",
        Error::LeaseLost { .. } => "lease_lost",
        Error::NotFound(_) | Error::StagingNotFound(_) | Error::LeaseNotFound(_) => "not_found",
        Error::NotDurable { .. } => "not_durable",
        Error::Pinned { .. } | Error::PinnedElsewhere { .. } => "pinned",
        Error::NoLocalCopy { .. } => "no_local_copy",
        Error::Corrupt { .. } => "corrupt",
        Error::UnknownKey { .. } => "unknown_key",
        Error::Conflict { .. } => "conflict",
        Error::Io { .. } => "io",
        Error::Db { .. } | Error::DbRecord { .. } => "db",
        e @ Error::Remote { .. } if e.is_remote_unavailable() => "remote_unavailable",
        Error::Remote { .. } | Error::Inconsistent { .. } => "remote",
        Error::Stalled { .. } => "remote_unavailable",
        Error::StreamFailed { corrupt: true, .. } => "corrupt",
        Error::StreamFailed { .. } => "remote_unavailable",
        Error::SweepIncomplete(_) => "sweep",
        Error::FetchFailed { source, .. } | Error::UploadFailed { source, .. } => match error_kind(source) {
            k @ ("corrupt" | "remote_unavailable" | "lease_lost" | "unknown_key") => k,
            _ if matches!(e, Error::FetchFailed { .. }) => "fetch",
            _ => "upload",
        },
        Error::ShuttingDown => "shutting_down",
        Error::CommitInProgress { .. } => "commit_in_progress",
        Error::Internal(_) => "internal",
    }
}

/// Every value [`error_kind`] returns (docs/METRICS.md lists them).
pub const ERROR_KINDS: &[&str] = &[
    "invalid",
    "config",
    "lease_held",
    "lease_lost",
    "not_found",
    "not_durable",
    "pinned",
    "no_local_copy",
    "corrupt",
    "unknown_key",
    "conflict",
    "io",
    "db",
    "remote_unavailable",
    "remote",
    "sweep",
    "fetch",
    "upload",
    "shutting_down",
    "commit_in_progress",
    "internal",
];
