//! `ctr` against the rig: the one runner ([`ctr`], [`ctr_ok`], [`ctr_with`],
//! [`Node::ctr`]), `ctr run` of the actor image ([`ctr_run`],
//! [`ctr_run_args`]), task states ([`task_status`], [`wait_task_status`])
//! and [`CtrContainer`], the guard of a container made through ctr.
//!
//! Cgroups: a container `ctr run` makes without `--cgroup` gets containerd's
//! default cgroup `/<namespace>/<id>` at the root of every hierarchy; runc
//! removes `<id>` but leaves `/<namespace>` behind (`/default`, `/k8s.io`,
//! `/snaptest-*` at the root of each v1 hierarchy). Every `ctr run` of the
//! tests therefore goes below the node's cgroup parent
//! (`/<rig cgroup>/ctr-<namespace>/<id>`), which test/rig/down.sh removes.

use std::thread;
use std::time::Duration;

use crate::{runtime_type, wait_for, Node, Output, ACTOR_IMAGE, LIVENESS};

/// `ctr --address <node A> -n <namespace> <args>`.
#[track_caller]
pub fn ctr(namespace: &str, args: &[&str]) -> Output {
    Node::a().ctr(namespace, args)
}

/// [`ctr`], panicking on failure; returns stdout.
#[track_caller]
pub fn ctr_ok(namespace: &str, args: &[&str]) -> String {
    ctr(namespace, args).ok()
}

/// `ctr` with stdin and a custom limit (for `ctr run` of a process that runs a while).
#[track_caller]
pub fn ctr_with(namespace: &str, args: &[&str], stdin: Option<&[u8]>, limit: Duration) -> Output {
    Node::a().ctr_with(namespace, args, stdin, limit)
}

/// The cgroup (OCI `cgroupsPath`) of a ctr container `id` of `namespace`
/// below the cgroup parent `parent` (a rig's `TORPOR_RIG_CGROUP`).
pub fn ctr_cgroup(parent: &str, namespace: &str, id: &str) -> String {
    format!("/{parent}/ctr-{namespace}/{id}")
}

/// The arguments of `ctr run` of `command` in a container `id` of the actor
/// image with the runtime under test: `run --runtime <runtime_type> --cgroup
/// <ctr_cgroup> <flags> <ACTOR_IMAGE> <id> <command>`.
pub fn ctr_run_args(parent: &str, namespace: &str, flags: &[&str], id: &str, command: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["run".into(), "--runtime".into(), runtime_type(), "--cgroup".into(), ctr_cgroup(parent, namespace, id)];
    a.extend(flags.iter().map(|s| s.to_string()));
    a.push(ACTOR_IMAGE.into());
    a.push(id.into());
    a.extend(command.iter().map(|s| s.to_string()));
    a
}

/// `ctr -n <namespace> run` on node A ([`ctr_run_args`] below node A's
/// cgroup parent); not checked.
#[track_caller]
pub fn ctr_run(namespace: &str, flags: &[&str], id: &str, command: &[&str]) -> Output {
    let node = Node::a();
    let args = ctr_run_args(&node.rig.cgroup, namespace, flags, id, command);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.ctr(namespace, &args)
}

/// The status of task `id` in a `ctr task ls` listing (RUNNING, PAUSED, STOPPED, ...).
pub fn task_status_in(listing: &str, id: &str) -> Option<String> {
    listing.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&id)).then(|| f.last().unwrap_or(&"").to_string())
    })
}

/// `ctr task ls` status of task `id` in `namespace` (node A), if the task exists.
#[track_caller]
pub fn task_status(namespace: &str, id: &str) -> Option<String> {
    task_status_in(&ctr_ok(namespace, &["task", "ls"]), id)
}

/// Waits until task `id` of `namespace` (node A) is `want`.
#[track_caller]
pub fn wait_task_status(namespace: &str, id: &str, want: &str) {
    let mut last = None;
    let what = format!("ctr task {id} to be {want}");
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, LIVENESS, || {
            last = task_status(namespace, id);
            (last.as_deref() == Some(want)).then_some(())
        })
    }));
    if res.is_err() {
        panic!("timed out waiting for {what}; last status {last:?}");
    }
}

/// A container created through `ctr` on node A. Dropping it kills and
/// deletes its task and removes the container.
#[derive(Debug)]
pub struct CtrContainer {
    pub namespace: String,
    pub id: String,
}

impl CtrContainer {
    /// Only registers the id for cleanup; the caller creates it (`ctr run ...`).
    pub fn new(namespace: &str, id: &str) -> CtrContainer {
        CtrContainer { namespace: namespace.into(), id: id.into() }
    }

    /// `ctr task ls` status of this task (RUNNING, PAUSED, STOPPED, ...), if any.
    #[track_caller]
    pub fn task_status(&self) -> Option<String> {
        task_status(&self.namespace, &self.id)
    }

    /// Waits until this task is `want`.
    #[track_caller]
    pub fn wait_status(&self, want: &str) {
        wait_task_status(&self.namespace, &self.id, want)
    }
}

impl Drop for CtrContainer {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            let ns = self.namespace.clone();
            let _ = ctr(&ns, &["task", "kill", "-a", "-s", "SIGKILL", &self.id]);
            for _ in 0..100 {
                let out = ctr(&ns, &["task", "delete", "-f", &self.id]);
                if out.success() || out.stderr.contains("not found") {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            let _ = ctr(&ns, &["containers", "rm", &self.id]);
            let _ = ctr(&ns, &["snapshots", "rm", &self.id]);
        });
    }
}
