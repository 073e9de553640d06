//! torpor's Kubernetes side: the node agent (`torpor-agent`, one per node,
//! in the torpor DaemonSet) and the kubectl plugin (`kubectl-torpor`).
//!
//! The agent watches its own node's pods of RuntimeClass `torpor`, acts on
//! their [`state::DESIRED`] annotation through each shim's control API
//! (torpor.control.v1, [`torporctl::control`]) and reports the actor's state
//! as a label, a pod condition, annotations and Events. The plugin only
//! talks to the API server: it patches the annotation and reads what the
//! agent reported.

pub mod agent;
pub mod error;
pub mod install;
pub mod metrics;
pub mod moves;
pub mod node;
pub mod plugin;
pub mod report;
pub mod resize;
pub mod state;

pub use error::Error;
