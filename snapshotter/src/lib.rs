//! torpor-snapshotter: the node daemon that will own the tiered snapshot store
//! (local disk ahead of object storage) and the containerd proxy snapshotter.
//! Not implemented yet: see issue "The companion snapshotter".

pub mod store;
pub mod store_api;
