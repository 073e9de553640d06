//! Stateful actors checkpointed and restored through containerd's standard
//! paths (`ctr c checkpoint --rw --task` / `ctr c restore --rw --live`): a
//! CRI counter, rootfs changes with the memory, a process tree.

use std::io::Read;

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

use crate::{
    assert_refused, checkpoint_container, counter, criu_image_files, net_pod, remove_task_and_container, restore, run_in_pod, K8S_NS, NS,
};

/// One JSON line from `/actor tree` (it writes first when the client is silent).
#[track_caller]
fn tree_info(addr: &str) -> Value {
    let mut s = connect_with_retry(addr);
    s.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap_or_else(|e| panic!("read from the tree actor at {addr}: {e}"));
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("tree actor at {addr} sent {text:?}: {e}"))
}

/// A counter in a CRI pod: bumped over TCP at the pod IP, checkpointed with
/// `ctr -n k8s.io c checkpoint --rw --task`, removed through CRI, restored
/// with `ctr c restore --rw --live` into the same sandbox: it continues where
/// it was and answers at the pod IP.
#[test]
fn cri_counter_continues_at_the_pod_ip_after_restore() {
    let pod = Pod::run("ckpt-cri");
    let cid = pod.start_actor("counter", &["counter", "--port", "8080"]);
    wait_container_state(&cid, "CONTAINER_RUNNING");
    let addr = format!("{}:8080", pod.ip());
    assert_eq!(counter(&addr, &["inc", "inc", "inc"]), ["1", "2", "3"]);

    let image = checkpoint_container(K8S_NS, &cid);
    // without --exit the container keeps running, state intact
    assert_eq!(container_state(&cid), "CONTAINER_RUNNING");
    assert_eq!(counter(&addr, &["get"]), ["3"]);
    let files = criu_image_files(K8S_NS, &image.name);
    assert!(files.iter().any(|f| f == "inventory.img"), "CRIU image files: {files:?}");

    crictl_ok(&["stop", "--timeout", "10", &cid]);
    crictl_ok(&["rm", &cid]);
    assert_refused(&addr, "the counter container was removed");

    let rid = unique_name("ckpt-cri-restored");
    let _restored = CtrContainer::new(K8S_NS, &rid);
    let out = ctr(K8S_NS, &["containers", "restore", "--rw", "--live", &rid, &image.name]);
    assert!(out.success(), "{out}");
    wait_task_status(K8S_NS, &rid, "RUNNING");

    assert_eq!(counter(&addr, &["get", "inc"]), ["3", "4"], "the counter continues where it was");
    assert_eq!(pod.state(), "SANDBOX_READY");

    // restored into the existing sandbox: the pod's network namespace ...
    let info: Value = serde_json::from_str(&ctr_ok(K8S_NS, &["containers", "info", &rid])).unwrap();
    let netns = info["Spec"]["linux"]["namespaces"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["type"] == "network"))
        .and_then(|n| n["path"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("restored container has no network namespace path: {}", info["Spec"]));
    // (CRI names it /proc/<pause pid>/ns/net, the sandbox by its bind mount)
    let ns_id = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("stat {p}: {e}"));
        (m.dev(), m.ino())
    };
    let pod_netns = pod.netns_path().expect("pod network namespace path");
    assert_eq!(ns_id(&netns), ns_id(&pod_netns), "restored container's network namespace {netns} is not the pod's {pod_netns}");
    assert_eq!(info["Runtime"]["Name"], runtime_type().as_str(), "{}", info["Runtime"]);
    // ... and the pod's shim (one shim per pod: none was started for it)
    let shims: Vec<String> = processes_mentioning(&rid).into_iter().filter(|p| p.contains("containerd-shim")).collect();
    assert!(shims.is_empty(), "a shim of its own for the restored container: {shims:?}");
    // not even one that set itself up and left (its control socket)
    let dir = std::env::var("TORPOR_SHIM_SOCKET_DIR").unwrap_or_else(|_| "/run/torpor/shims".into());
    let sock = format!("{dir}/{rid}.sock");
    assert!(!std::path::Path::new(&sock).exists(), "a control socket for the restored container: {sock}");
}

/// `ctr c checkpoint --rw --task` / `ctr c restore --rw --live`: files
/// written into the rootfs come back with the memory state.
#[test]
fn rootfs_changes_and_memory_survive_ctr_checkpoint_restore() {
    let pod = net_pod("ckpt-rootfs");
    let c = run_in_pod(&pod, "ckpt-rootfs", &["counter", "--port", "8080"]);
    let addr = pod.addr(8080);
    assert_eq!(counter(&addr, &["inc", "inc"]), ["1", "2"]);
    let token = unique_name("token");
    let script = format!("echo {token} > /written.txt && mkdir -p /var/lib/actor && echo nested > /var/lib/actor/state && rm /etc/group");
    let out = ctr(NS, &["task", "exec", "--exec-id", "write", &c.id, "/bin/sh", "-c", &script]);
    assert!(out.success(), "{out}");

    let image = checkpoint_container(NS, &c.id);
    assert_eq!(task_status(NS, &c.id).as_deref(), Some("RUNNING"), "running after a checkpoint without --exit");
    assert_eq!(counter(&addr, &["get"]), ["2"]);

    remove_task_and_container(NS, &c.id);
    assert_refused(&addr, "the task was deleted");
    let out = restore(NS, &c.id, &image);
    assert!(out.success(), "{out}");
    wait_task_status(NS, &c.id, "RUNNING");

    let out = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "read",
            &c.id,
            "/bin/sh",
            "-c",
            "cat /written.txt /var/lib/actor/state; test ! -e /etc/group && echo group-gone",
        ],
    );
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.lines().collect::<Vec<_>>(), [token.as_str(), "nested", "group-gone"], "{out}");
    assert_eq!(counter(&addr, &["get", "inc"]), ["2", "3"]);
}

/// `/actor tree`: a parent with two children and four counting threads keeps
/// its pids, children, threads, and its ticks keep growing after a restore.
#[test]
fn process_tree_survives_checkpoint_restore() {
    let pod = net_pod("ckpt-tree");
    let c = run_in_pod(&pod, "ckpt-tree", &["tree", "--port", "8081", "--children", "2", "--threads", "4"]);
    let addr = pod.addr(8081);
    let before = wait_for("the tree actor's children", LIVENESS, || {
        let v = tree_info(&addr);
        (v["children_alive"] == 2 && v["children"].as_array().map(Vec::len) == Some(2)).then_some(v)
    });
    let host_pids = |id: &str| -> usize { ctr_ok(NS, &["task", "ps", id]).lines().skip(1).filter(|l| !l.trim().is_empty()).count() };
    assert_eq!(host_pids(&c.id), 3, "parent and two children");

    let image = checkpoint_container(NS, &c.id);
    remove_task_and_container(NS, &c.id);

    let rid = unique_name("ckpt-tree-restored");
    let _restored = CtrContainer::new(NS, &rid);
    let out = restore(NS, &rid, &image);
    assert!(out.success(), "{out}");
    wait_task_status(NS, &rid, "RUNNING");

    let after = tree_info(&addr);
    assert_eq!(after["pid"], before["pid"], "same pid (in the container's pid namespace): {after}");
    assert_eq!(after["children"], before["children"], "same children: {after}");
    assert_eq!(after["children_alive"], 2, "{after}");
    assert_eq!(after["threads"], 4, "{after}");
    let os_threads = |v: &Value| v["os_threads"].as_u64().unwrap_or(0);
    assert!(
        os_threads(&after) >= os_threads(&before),
        "threads lost in the restore: {} before, {} after",
        os_threads(&before),
        os_threads(&after)
    );
    assert_eq!(host_pids(&rid), 3, "parent and two children after the restore");
    let ticks = |v: &Value| -> Vec<u64> {
        v["thread_ticks"].as_array().map(|a| a.iter().map(|t| t.as_u64().unwrap_or(0)).collect()).unwrap_or_default()
    };
    assert_eq!(ticks(&after).len(), 4, "{after}");
    assert!(after["ticks"].as_u64() >= before["ticks"].as_u64(), "ticks went back: {before} then {after}");
    // every counting thread runs on after the restore
    let first = ticks(&after);
    wait_for("every thread of the restored tree to tick", LIVENESS, || {
        let now = ticks(&tree_info(&addr));
        (now.len() == 4 && now.iter().zip(&first).all(|(n, f)| n > f)).then_some(())
    });
}
