//! The trigger layer: what makes the lifecycle move besides an explicit
//! request (containerd, `torporctl`):
//!
//! - [`activation`]: an inbound connection to a held port resumes the actor;
//! - [`policy`]: the actor's own request (`/run/torpor/request`) and the
//!   idle policy (`torpor.dev/idle-after`) suspend it;
//! - [`fence`]: the lease fence freezes it when this node cannot show it
//!   still holds the actor's lease, and thaws it when it can again.
//!
//! Each is a task over a [`crate::lifecycle::Actor`]; nothing here is
//! imported below.

pub mod activation;
pub mod fence;
pub mod policy;
