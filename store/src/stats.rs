//! Counters of the store's work since open and the most recent errors of
//! background work: what `Store::status` reports (with the counts of the
//! metadata database's records and leases).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use crate::util::lock;

#[derive(Clone, Debug, Default)]
pub struct StoreStatus {
    pub local_budget_bytes: u64,
    pub local_bytes: u64,
    pub snapshots: usize,
    pub local_snapshots: usize,
    /// Snapshots with a local copy that are not durable yet.
    pub pending_uploads: usize,
    pub pinned_snapshots: usize,
    /// Over budget with nothing evictable: uploads run regardless of keep-local.
    pub disk_pressure: bool,
    /// Chunk object bytes PUT since open (after compression).
    pub uploaded_bytes: u64,
    /// Uncompressed bytes of the chunks PUT since open.
    pub uploaded_raw_bytes: u64,
    pub uploaded_chunks: u64,
    /// Chunks an upload skipped because they were known durable.
    pub deduplicated_chunks: u64,
    /// Uncompressed bytes of those chunks (not sent again).
    pub deduplicated_bytes: u64,
    /// Chunks known durable that an upload checked with a HEAD before
    /// reusing them (no manifest of this node vouched for them any more).
    pub chunks_checked: u64,
    /// Of those, the ones found gone (swept by another node) and sent again.
    pub chunks_missing: u64,
    /// Uploads that waited for a chunk sweep of another node to finish.
    pub sweep_waits: u64,
    pub fetched_bytes: u64,
    /// Entries of the object tier ignored because they do not authenticate
    /// under the ring (keys configured): junk, plaintext or garbled
    /// manifests, a lease naming an unverifiable generation.
    pub untrusted_entries: u64,
    /// Actor lease renewals (or surrender passes) that failed.
    pub lease_renew_failures: u64,
    /// Errors of background work since open (the newest are `last_errors`).
    pub background_errors: u64,
    /// Most recent errors of background work, newest last.
    pub last_errors: Vec<(SystemTime, String)>,
}

/// Told of each upload and fetch that completed, with how long it took
/// (the daemon's metrics, torpor-snapshotter's `metrics`). Called on the store's tasks:
/// must not block.
pub trait Observer: Send + Sync {
    /// A snapshot became durable in the object tier (chunks and manifest sent).
    fn uploaded(&self, took: Duration);
    /// A snapshot was fetched from the object tier into the local tier.
    fn fetched(&self, took: Duration);
}

/// The counters (one lock; every update is a few additions).
#[derive(Default)]
pub(crate) struct Counters {
    pub uploaded_bytes: u64,
    pub uploaded_raw_bytes: u64,
    pub uploaded_chunks: u64,
    pub deduplicated_chunks: u64,
    pub deduplicated_bytes: u64,
    pub chunks_checked: u64,
    pub chunks_missing: u64,
    pub sweep_waits: u64,
    pub fetched_bytes: u64,
    pub untrusted_entries: u64,
    pub lease_renew_failures: u64,
    pub disk_pressure: bool,
    background_errors: u64,
    last_errors: VecDeque<(SystemTime, String)>,
}

/// The store's counters and recent errors, and who is told of timings.
#[derive(Default)]
pub(crate) struct Stats {
    counters: Mutex<Counters>,
    observer: OnceLock<Arc<dyn Observer>>,
}

impl Stats {
    /// Sets who is told of each completed upload and fetch (once: false
    /// when it was set already).
    pub fn set_observer(&self, o: Arc<dyn Observer>) -> bool {
        self.observer.set(o).is_ok()
    }

    /// Change the counters.
    pub fn update<T>(&self, f: impl FnOnce(&mut Counters) -> T) -> T {
        f(&mut lock(&self.counters))
    }

    /// An upload that completed (`Observer::uploaded`).
    pub fn uploaded(&self, took: Duration) {
        if let Some(o) = self.observer.get() {
            o.uploaded(took);
        }
    }

    /// A fetch that completed (`Observer::fetched`).
    pub fn fetched(&self, took: Duration) {
        if let Some(o) = self.observer.get() {
            o.fetched(took);
        }
    }

    /// Keep an error of background work for `status` (the newest 32).
    pub fn note_error(&self, msg: String) {
        let mut s = lock(&self.counters);
        s.background_errors += 1;
        s.last_errors.push_back((SystemTime::now(), msg));
        while s.last_errors.len() > 32 {
            s.last_errors.pop_front();
        }
    }

    pub(crate) fn fill(&self, st: &mut StoreStatus) {
        let s = lock(&self.counters);
        st.disk_pressure = s.disk_pressure;
        st.uploaded_bytes = s.uploaded_bytes;
        st.uploaded_raw_bytes = s.uploaded_raw_bytes;
        st.uploaded_chunks = s.uploaded_chunks;
        st.deduplicated_chunks = s.deduplicated_chunks;
        st.deduplicated_bytes = s.deduplicated_bytes;
        st.chunks_checked = s.chunks_checked;
        st.chunks_missing = s.chunks_missing;
        st.sweep_waits = s.sweep_waits;
        st.fetched_bytes = s.fetched_bytes;
        st.untrusted_entries = s.untrusted_entries;
        st.lease_renew_failures = s.lease_renew_failures;
        st.background_errors = s.background_errors;
        st.last_errors = s.last_errors.iter().cloned().collect();
    }
}
