//! torpor-runtime: the behaviour behind `containerd-shim-torpor-v1`, independent
//! of containerd's wire types.
//!
//! - [`spec`]: `torpor.dev/*` annotations validated into an [`spec::ActorSpec`];
//! - [`reaper`]: the SIGCHLD reaper every child process of the shim goes through;
//! - [`runc`]: the runc (and, through it, CRIU) command driver;
//! - [`stdio`]: the plumbing between containerd's FIFOs and a process's stdio;
//! - [`process`] and [`container`]: supervised processes and containers;
//! - [`cgroup`]: OOM and resource statistics from the container's cgroup;
//! - [`actor`] and [`lifecycle`]: the persisted actor state and suspend/resume;
//! - [`snapshots`]: the client of the node's snapshot store (torpor-snapshotter);
//! - [`recovery`] and [`identity`]: what a shim's death leaves, and the
//!   restore of a kept checkpoint into a new container of the same identity;
//! - [`claim`]: an actor runs at most once on the node (a flock per actor);
//! - [`failpoint`]: test-only crash points (feature `failpoints`).

pub mod activation;
pub mod actor;
pub mod cgroup;
pub mod claim;
pub mod container;
pub mod criu;
pub mod error;
pub mod failpoint;
pub mod fence;
pub mod identity;
pub mod lifecycle;
pub mod policy;
pub mod process;
pub mod reaper;
pub mod rootfs;
pub mod recovery;
pub mod runc;
pub mod snapshots;
pub mod spec;
pub mod stdio;

pub use error::{Error, Result};
