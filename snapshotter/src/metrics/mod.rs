//! The daemon's Prometheus metrics (`prometheus-client`), served on
//! `metrics_address` ([`http`]). Every metric is listed in docs/METRICS.md.
//!
//! Where the numbers come from:
//! - [`lifecycle`]: what the shims report after each suspend, resume,
//!   restore and state change of their actor (the `ReportLifecycle` call of
//!   the store API): phase durations, outcomes, failure classes, the actors
//!   by state;
//! - [`store`]: the tiered store, read at each scrape (its counters, the
//!   local tier against its budget, the leases this node holds), plus the
//!   durations of its uploads and fetches ([`torpor_store::Observer`]);
//! - the store API's failed requests, by operation and store error kind
//!   ([`Metrics::api_error`]).
//!
//! Labels are low-cardinality by construction: every label value is one of
//! a fixed set named here (an unknown one from a shim becomes `other`);
//! never an actor id, a pod or a snapshot.

pub mod http;
pub mod lifecycle;
pub mod store;

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use torpor_store::Store;

pub use lifecycle::Lifecycle;

/// The exposition formats a scrape may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text; version=1.0.0` (what Prometheus asks for first).
    OpenMetrics,
    /// `text/plain; version=0.0.4` (the classic text format; the default).
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names it,
    /// else the classic text format.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.split(',').any(|p| p.trim().starts_with("application/openmetrics-text")) => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    op: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// The registry and the metrics the daemon updates.
pub struct Metrics {
    registry: Registry,
    lifecycle: Arc<Lifecycle>,
    api_errors: Family<ApiErrorLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The store API operations, as the `op` label of `torpor_store_api_errors_total`.
pub const API_OPS: &[&str] = &[
    "begin",
    "commit",
    "abort",
    "latest",
    "checkout",
    "view_staging",
    "release",
    "list",
    "inspect",
    "upload",
    "evict",
    "remove",
    "gc",
    "acquire",
    "confirm",
    "surrender",
    "parse",
];

impl Metrics {
    /// Every metric, registered; `store` (when given) is read at each scrape
    /// and told to report its upload and fetch durations here.
    pub fn new(store: Option<&Arc<Store>>) -> Arc<Metrics> {
        let mut registry = Registry::default();
        let build = Family::<BuildLabels, Gauge>::default();
        build.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION") }).set(1);
        registry.register("torpor_build_info", "The daemon's version (always 1)", build);
        let lifecycle = Arc::new(Lifecycle::new(&mut registry));
        let api_errors = Family::<ApiErrorLabels, Counter>::default();
        registry.register(
            "torpor_store_api_errors",
            "Store API requests that failed, by operation and store error kind",
            api_errors.clone(),
        );
        if let Some(store) = store {
            let collector = store::StoreCollector::new(store.clone());
            store.set_observer(lifecycle.clone());
            registry.register_collector(Box::new(collector));
        }
        Arc::new(Metrics { registry, lifecycle, api_errors })
    }

    /// What the shims report.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// A store API request `op` failed with `e`.
    pub fn api_error(&self, op: &str, e: &torpor_store::Error) {
        // "view staging" -> view_staging, "list (refresh ...)" -> list
        let op = op.split(" (").next().unwrap_or(op).replace(' ', "_");
        let op = API_OPS.iter().copied().find(|o| *o == op).unwrap_or("other");
        self.api_errors.get_or_create(&ApiErrorLabels { op, kind: store::error_kind(e) }).inc();
    }

    /// The exposition of every metric in `format`. Reads the store's
    /// database (blocking): call it off the async threads.
    pub fn encode(&self, format: Format) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        match format {
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &self.registry)?,
            Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?,
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
