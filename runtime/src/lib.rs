//! torpor-runtime: the behaviour behind `containerd-shim-torpor-v1`,
//! independent of containerd's wire types.
//!
//! Layers, bottom up; a module imports only the layers below it:
//!
//! | layer | what it holds |
//! |---|---|
//! | [`system`] | drivers: runc, CRIU, cgroups, netns, stdio, rootfs, reaper, held ports |
//! | [`oci`] | the bundle's spec, `torpor.dev/*` annotations, what torpor adds to a bundle |
//! | [`task`] | containers, processes, exits: what containerd sees, one state enum per container |
//! | [`actor`] | what an actor is: record, identity, claim, the store client |
//! | [`lifecycle`] | what an actor does: freeze, suspend, resume, adopt, cleanup after a shim death |
//! | [`trigger`] | what moves it: activation, the request file and idle policy, the lease fence |
//! | [`pod`] | the facade the shim sees: [`Runtime`] |
//!
//! [`error`] and [`failpoint`] (test-only crash points) are used by all.

pub mod actor;
pub mod error;
pub mod failpoint;
pub mod lifecycle;
pub mod oci;
pub mod pod;
pub mod system;
pub mod task;
pub mod trigger;

pub use error::{Error, Result, StoreErrorKind};
pub use lifecycle::cleanup::{after_shim_death, container_gone};
pub use oci::spec::{group_of, read_spec};
pub use pod::{CreateRequest, Runtime};
pub use system::cgroup::Stats as CgroupStats;
pub use system::reaper::set_tag;
pub use system::rootfs::upper_dir;
pub use system::runc::{read_pid, CheckpointOpts};
pub use system::runc_options::RuncOptions;
pub use system::stdio::StdioConfig;
pub use task::{wait_exit, Event, ExitInfo, ProcessState, Status};
