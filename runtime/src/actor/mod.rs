//! The actor layer: what an actor *is*, below what it does.
//!
//! - [`record`]: the persisted lifecycle record (`actor.json`, written
//!   atomically before each transition is acted on) and its directory;
//! - [`identity`]: who an app container is across pods and shims, and the
//!   lookup of the snapshot kept for it;
//! - [`claim`]: an actor runs at most once on the node (a flock per actor);
//! - [`seal`]: what a suspend dumped, checked before a restore uses it;
//! - [`snapshots`]: the edge toward the node's snapshot store (a trait), and
//!   [`store_client`], the shim's one client of it that implements it;
//! - [`report`]: lifecycle reports to the node daemon's metrics, through it.
//!
//! Imports [`crate::system`], [`crate::oci`] and [`crate::error`] only.

pub mod claim;
pub mod identity;
pub mod record;
pub mod report;
pub mod seal;
pub mod snapshots;
pub mod store_client;

pub use record::{now_ms, state_root, sync_dir, FreezeTier, Lifecycle, Record, StagingRecord, Store, STATE_ROOT};
