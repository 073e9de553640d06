//! Helpers for the torpor integration tests.
//!
//! The tests drive the private containerd of the test rig (`test/rig/up.sh`)
//! through `crictl` and `ctr`, the way kubelet and an operator would. The rig's
//! addresses come from the environment that `test/rig/env.sh` exports (and
//! `test/rig/run-tests.sh` sets), with the rig's defaults as fall-backs.
//!
//! Rules the tests follow:
//! * A missing dependency (no crictl, no rig, no image) is a test FAILURE, never a skip.
//! * A torpor-only test is `#[cfg_attr(not_torpor_runtime, ignore = "torpor-only:
//!   needs the torpor runtime")]` and starts with [`torpor_only()`]: under
//!   another runtime it is reported ignored (test/build.rs), never passed.
//! * Time limits are for liveness only ("did it ever get there"); nothing
//!   asserts on how fast something happened.
//! * Every pod/container a test makes is owned by a guard whose `Drop` removes
//!   it, also when the test panics; anything else a test changes is undone by
//!   a [`Cleanup`].
//!
//! The fixtures: [`CounterSpec`] / [`Counter`] (the counter actor in a pod),
//! [`torporctl`] / [`Node::torporctl`] (the one torporctl runner), [`ctr`] /
//! [`ctr_run`] / [`CtrContainer`], [`Cleanup`], [`Pod`], [`Node`].

use std::time::Duration;

pub use serde_json;

mod cleanup;
pub mod cluster;
mod command;
mod counter;
mod crictl;
mod ctr;
mod host;
pub mod metrics;
mod names;
mod node;
mod pod;
mod rig;
mod torporctl;
mod under_test;
pub mod workload;
pub use cleanup::{arm_failpoint, Cleanup};
pub use command::{run, run_env, run_with, wait_for, write_json, Output, TempDir};
pub use counter::{Counter, CounterSpec, COUNTER_PORT};
pub use crictl::{crictl, crictl_json, crictl_ok, crictl_stdin};
pub use ctr::{ctr, ctr_cgroup, ctr_ok, ctr_run, ctr_run_args, ctr_with, task_status, task_status_in, wait_task_status, CtrContainer};
pub use host::{connect_with_retry, counter_cmd, files_below, freezer_state, mounts_mentioning, processes_in_cgroup, processes_mentioning};
pub use names::{actor_name, unique_name};
pub use node::{DeadNode, HungDaemon, Node};
pub use pod::{
    container_config, container_state, inspect_container, netns_path_of, pod_config, pod_config_on, remove_pods_named,
    wait_container_state, wait_exited, Pod, PodOptions,
};
pub use rig::Rig;
pub use torporctl::{default_actor, store_snapshots, torporctl, torporctl_json, torporctl_path};
pub use under_test::{is_torpor, require_rig, rig, runtime_handler, runtime_type, torpor_only};

/// Generous liveness limit for one state change (pod ready, container running, ...).
pub const LIVENESS: Duration = Duration::from_secs(120);
/// Upper bound for any single crictl/ctr invocation before it is declared hung.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(300);

pub const ACTOR_IMAGE: &str = "localhost/torpor-test/actor:latest";
pub const PAUSE_IMAGE: &str = "localhost/torpor-test/pause:latest";
/// Kubernetes namespace of every test pod (the CRI metadata namespace).
pub const POD_NAMESPACE: &str = "torpor-test";

/// The runtime handler the test binaries were built for (test/build.rs).
pub const BUILT_FOR: &str = env!("TORPOR_TESTS_BUILT_FOR");
