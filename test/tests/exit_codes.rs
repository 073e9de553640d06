//! Exits, crash loops and OOM kills are reported the way kubelet expects.

use serde_json::json;
use torpor_tests::*;

#[test]
fn exit_code_is_reported_and_crash_loop_restarts_report_it_again() {
    let pod = Pod::run("exit3");
    let first = pod.start_actor("crasher", &["exit", "3"]);
    let (code, reason) = wait_exited(&first);
    assert_eq!(code, 3, "crictl inspect shows the exit code (reason {reason})");
    assert_eq!(reason, "Error", "non-zero exit: reason Error");

    // kubelet's restart of a crash-looping container: attempt 1 in the same pod
    let mut cfg = container_config("crasher", &["exit", "3", "--after-ms", "200"]);
    cfg["metadata"]["attempt"] = json!(1);
    let second = pod.start_config(&cfg);
    assert_ne!(first, second);
    let (code, _) = wait_exited(&second);
    assert_eq!(code, 3);
    let v = inspect_container(&second);
    assert_eq!(v["status"]["metadata"]["attempt"], 1, "{}", v["status"]);

    // the first attempt still reports its own exit
    let (code, _) = wait_exited(&first);
    assert_eq!(code, 3);
    // and the pod itself is still fine
    assert_eq!(pod.state(), "SANDBOX_READY");
}

#[test]
fn clean_exit_is_completed() {
    let pod = Pod::run("exit0");
    let id = pod.start_actor("done", &["exit", "0"]);
    let (code, reason) = wait_exited(&id);
    assert_eq!(code, 0);
    assert_eq!(reason, "Completed");
}

#[test]
fn oom_kill_is_reported_as_oomkilled() {
    let pod = Pod::run("oom");
    let mut cfg = container_config("hog", &["oom"]);
    cfg["linux"]["resources"] = json!({ "memory_limit_in_bytes": 64 * 1024 * 1024 });
    let id = pod.start_config(&cfg);
    let (code, reason) = wait_exited(&id);
    assert_eq!(reason, "OOMKilled", "exit code {code}: {}", inspect_container(&id)["status"]);
    assert_eq!(code, 137, "killed by SIGKILL");
    assert_eq!(pod.state(), "SANDBOX_READY", "an OOM in one container leaves the pod up");
}
