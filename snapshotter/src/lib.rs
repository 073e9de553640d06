//! torpor-snapshotter: the node daemon that owns the containerd proxy
//! snapshotter (overlayfs, [`overlay`]) and the tiered snapshot store (local
//! disk ahead of object storage, [`store`]) with its API for the shim and
//! torporctl ([`store_api`]), and its Prometheus metrics ([`metrics`]).

pub mod config;
pub mod criu_cache;
pub mod daemon;
pub mod error;
pub mod fuzzing;
pub mod metrics;
pub mod overlay;
pub mod page_server;
pub mod rcu;
pub mod resident;
pub mod store_api;
