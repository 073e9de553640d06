//! A cgroup v2 node (test/vm/node.sh's guest, under either cgroup driver):
//! what the v1 rig cannot show. A container's limits land in `memory.max`
//! and `cpu.max` and are there again after a resume; an actor suspended by
//! idle time wakes on an inbound connection with its state; an OOM kill is
//! counted in `memory.events` and reported as OOMKilled; a deleted pod
//! leaves no scope or cgroup of its containers. On a v1 host each test
//! prints `skipped: ...` and returns.

use std::path::{Path, PathBuf};

use serde_json::json;
use torpor_tests::*;

const MIB: u64 = 1024 * 1024;

/// Whether this host's cgroup tree is the unified hierarchy only.
fn unified() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(4) == Some("/sys/fs/cgroup") && l.contains(" - cgroup2 ")))
        .unwrap_or(false)
}

macro_rules! v2_only {
    () => {
        if !unified() {
            println!("skipped: /sys/fs/cgroup is not a cgroup2 mount (a v1 host; test/vm/node.sh runs this on v2)");
            return;
        }
    };
}

/// The cgroup v2 directory of host pid `pid`.
fn cgroup_dir(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_else(|e| panic!("/proc/{pid}/cgroup: {e}"));
    let rel = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or_else(|| panic!("no v2 line in /proc/{pid}/cgroup: {text}"));
    Path::new("/sys/fs/cgroup").join(rel.trim().trim_start_matches('/'))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())).trim().to_string()
}

fn init_pid(container: &str) -> u32 {
    let pid = inspect_container(container)["info"]["pid"].as_u64().unwrap_or(0) as u32;
    assert!(pid > 0, "crictl inspect {container} has no pid");
    pid
}

/// The container's cgroup is where the driver puts it: a
/// `cri-containerd-<id>.scope` in the pod's slice under systemd, `<id>` in
/// the pod's directory under cgroupfs.
fn assert_placed(dir: &Path, container: &str) {
    let s = dir.to_string_lossy();
    if rig().systemd_cgroup {
        assert!(s.ends_with(&format!("/cri-containerd-{container}.scope")), "systemd driver: {s}");
        assert!(s.contains(".slice/"), "systemd driver, in a slice: {s}");
    } else {
        assert!(s.ends_with(&format!("/{container}")) && s.contains(&format!("/{}/pod-", rig().cgroup)), "cgroupfs driver: {s}");
    }
}

fn units_mentioning(needle: &str) -> Vec<String> {
    if !rig().systemd_cgroup {
        return Vec::new();
    }
    let out = run("systemctl", ["list-units", "--all", "--plain", "--no-legend"]);
    assert!(out.success(), "{out}");
    out.stdout.lines().filter(|l| l.contains(needle)).map(str::to_string).collect()
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn limits_land_in_memory_max_and_cpu_max_and_hold_after_a_resume() {
    v2_only!();
    torpor_only();
    let limits = json!({"memory_limit_in_bytes": 256 * MIB, "cpu_period": 100000, "cpu_quota": 50000});
    let a = CounterSpec::new().in_the_pods_pid_namespace().resources(limits).start(Pod::run("v2-limits"));
    assert_eq!(a.inc(), 1);
    // By the counter's processes: after a restore `crictl inspect` may
    // still name the pid the container had before the suspend.
    let check = |when: &str| {
        let procs = wait_for("the counter's processes", LIVENESS, || {
            let p = a.processes();
            (!p.is_empty()).then_some(p)
        });
        let dir = Path::new("/sys/fs/cgroup").join(procs[0].1.trim_start_matches('/'));
        assert_placed(&dir, &a.container);
        assert_eq!(read(&dir.join("memory.max")), (256 * MIB).to_string(), "memory.max {when}");
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000", "cpu.max {when}");
        dir
    };
    let before = check("before the suspend");
    a.suspend();
    assert_eq!(a.state(), "SUSPENDED");
    a.op("resume");
    assert_eq!(a.state(), "RUNNING");
    let after = check("after the resume");
    assert_eq!(before, after, "the resumed container is in the same cgroup");
    assert_eq!(a.inc(), 2, "the state survived");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn idle_time_suspends_and_a_connection_wakes_with_the_state() {
    v2_only!();
    torpor_only();
    let pod = Pod::run_with("v2-idle", PodOptions::annotated(&[("torpor.dev/idle-after", "3s")]));
    let a = CounterSpec::new().in_the_pods_pid_namespace().start(pod);
    assert_eq!(a.inc(), 1);
    assert_eq!(a.inc(), 2);
    wait_for("the idle actor to be suspended", LIVENESS, || (a.state() == "SUSPENDED").then_some(()));
    assert_eq!(a.inc(), 3, "an inbound connection woke it with its state");
    assert_eq!(a.state(), "RUNNING");
}

#[test]
fn an_oom_kill_is_counted_in_memory_events_and_reported_as_oomkilled() {
    v2_only!();
    let pod = Pod::run("v2-oom");
    let mut cfg = container_config("hog", &["oom"]);
    cfg["linux"]["resources"] = json!({ "memory_limit_in_bytes": 64 * MIB });
    // A sibling that lives on: its pid gives the pod's cgroup.
    let keep = pod.start_actor("keep", &["counter", "--port", "8080"]);
    let pod_dir = cgroup_dir(init_pid(&keep)).parent().map(Path::to_path_buf).expect("the pod's cgroup");
    let id = pod.start_config(&cfg);
    let (code, reason) = wait_exited(&id);
    assert_eq!(reason, "OOMKilled", "exit code {code}: {}", inspect_container(&id)["status"]);
    assert_eq!(code, 137);
    let events = read(&pod_dir.join("memory.events"));
    let kills: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no oom_kill in {}: {events}", pod_dir.display()));
    assert!(kills >= 1, "the pod's memory.events counts the kill: {events}");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_deleted_pod_leaves_no_scope_and_no_cgroup() {
    v2_only!();
    torpor_only();
    let a = CounterSpec::new().in_the_pods_pid_namespace().start(Pod::run("v2-gone"));
    assert_eq!(a.inc(), 1);
    let dir = cgroup_dir(init_pid(&a.container));
    assert_placed(&dir, &a.container);
    let sandbox = a.shim().to_string();
    let container = a.container.clone();
    assert!(!units_mentioning(&container).is_empty() || !rig().systemd_cgroup, "the container's scope is a unit");
    a.suspend();
    let Counter { pod, .. } = a;
    pod.remove();
    assert!(!dir.exists(), "the container's cgroup {} is gone", dir.display());
    for id in [&sandbox, &container] {
        let left = units_mentioning(id);
        assert!(left.is_empty(), "units of {id} left: {left:?}");
        let procs = processes_in_cgroup(id);
        assert!(procs.is_empty(), "processes in cgroups of {id}: {procs:?}");
    }
    // The pod's slice or directory: empty (kubelet, not the runtime, removes it).
    let parent = dir.parent().expect("a parent");
    if parent.exists() {
        let kids: Vec<_> = std::fs::read_dir(parent).unwrap().flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name()).collect();
        assert!(kids.is_empty(), "cgroups left in {}: {kids:?}", parent.display());
        assert_eq!(read(&parent.join("cgroup.procs")), "", "no process in {}", parent.display());
    }
}
