//! torpor-snapshotter: the node daemon that owns the containerd proxy
//! snapshotter (overlayfs, [`overlay`]) and, later, the tiered snapshot store
//! (local disk ahead of object storage).

pub mod config;
pub mod daemon;
pub mod error;
pub mod overlay;
