//! Pods of several containers are one actor: they suspend and resume as
//! one, with the unix connections, named pipes and shared memory between
//! them.

use std::collections::BTreeSet;

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

use crate::{actor, assert_suspend_refused, container_processes};

/// All app containers of the pod are one actor: both suspend and come back,
/// and the output of a container continues after the resume with no line lost.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn two_containers_suspend_as_one() {
    torpor_only();
    let a = actor("susp-two", &[]);
    let logs = a.pod.start_actor("logs", &["logs", "--lines", "0", "--interval-ms", "50"]);
    wait_container_state(&logs, "CONTAINER_RUNNING");
    let log_file = a.pod.log_dir.join("logs.log");
    let line_numbers = || -> Vec<u64> {
        let text = std::fs::read_to_string(&log_file).unwrap_or_default();
        text.lines().filter_map(|l| l.split(" line ").nth(1)).filter_map(|rest| rest.split_whitespace().next()?.parse().ok()).collect()
    };
    wait_for("the logs container to print", LIVENESS, || (line_numbers().len() >= 5).then_some(()));
    assert_eq!(a.inc(), 1);

    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    let members: BTreeSet<&str> = st["containers"].as_array().map(|c| c.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    assert_eq!(members, BTreeSet::from([a.container.as_str(), logs.as_str()]), "the actor is both app containers (not the sandbox): {st}");
    for c in [&a.container, &logs] {
        assert_eq!(container_state(c), "CONTAINER_RUNNING", "{c}");
        assert!(container_processes(c, "/actor").is_empty(), "no process of {c} while suspended");
    }
    let printed = line_numbers().len();

    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(a.inc(), 2, "counter intact");
    wait_for("the logs container to print again after the resume", LIVENESS, || (line_numbers().len() >= printed + 5).then_some(()));

    // Stop it (its output drains) and check no line went missing or twice.
    crictl_ok(&["stop", "-t", "60", &logs]);
    let (code, reason) = wait_exited(&logs);
    assert_eq!(code, 0, "the restored logs process exits 0 on SIGTERM ({reason})");
    let mut nums = line_numbers();
    nums.sort();
    let n = nums.len() as u64;
    let expected: Vec<u64> = (1..=n).collect();
    assert_eq!(nums, expected, "lines 1..{n} each exactly once in the container log across suspend/resume");
}

/// A pod of two containers sharing a host directory at `/shared`: a
/// sidecar `/actor <side_args>` (started first) and the app, a counter
/// with `<app_args>`, in the pod's pid namespace. The app and the sidecar's
/// container id.
#[track_caller]
fn app_and_sidecar(prefix: &str, side_args: &[&str], app_args: &[&str]) -> (Counter, String) {
    let pod = Pod::run(prefix);
    let shared = pod.dir().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let shared = shared.to_string_lossy().into_owned();
    let mut side = container_config("side", side_args);
    side["mounts"] = serde_json::json!([{ "host_path": shared, "container_path": "/shared" }]);
    let side = pod.start_config(&side);
    wait_container_state(&side, "CONTAINER_RUNNING");
    let a = CounterSpec::new().in_the_pods_pid_namespace().extra_args(app_args).mount(&shared, "/shared").start(pod);
    (a, side)
}

/// Suspend (no process of the app or its sidecar left) and resume of the
/// pod of `a`, the `cycle`th time.
#[track_caller]
fn suspend_and_resume_both(a: &Counter, side: &str, cycle: u64) {
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "cycle {cycle}: {st}");
    for c in [a.container.as_str(), side] {
        assert!(container_processes(c, "/actor").is_empty(), "cycle {cycle}: no process of {c} while suspended");
    }
    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "cycle {cycle}: {st}");
}

/// An app and its sidecar in one pod, connected by a unix stream socket on a
/// shared volume and held open for the pod's life: the pod suspends and
/// resumes as one unit, twice, and the connection works after each resume
/// with both sides' state. While bytes are in flight on it the suspend is
/// refused and the pod keeps running. After the resume the shim holds no
/// end any more: the sidecar's stop closes the app's connection.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_unix_connection_between_two_containers_survives_suspend() {
    torpor_only();
    let (a, side) = app_and_sidecar("susp-unix", &["peer", "--listen", "/shared/peer.sock"], &["--peer", "/shared/peer.sock"]);
    assert_eq!(a.cmd("peer"), "pong 1");
    assert_eq!(a.inc(), 1);

    for cycle in 1..=2u64 {
        suspend_and_resume_both(&a, &side, cycle);
        assert_eq!(a.cmd("peer"), format!("pong {}", cycle + 1), "cycle {cycle}: the same connection, the sidecar's count intact");
        assert_eq!(a.inc(), cycle + 1, "cycle {cycle}: the app's count intact");
    }

    // An answer left unread: the suspend is refused, nothing is lost.
    assert_eq!(a.cmd("peer send"), "sent, 7 bytes queued", "the answer (pong 4) waits unread");
    assert_suspend_refused(&a, "bytes in flight between the containers", "in flight on the unix connection", &[&side]);
    assert_eq!(a.cmd("peer read"), "pong 4", "the queued answer is still there");
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(a.cmd("peer"), "pong 5");

    // The sidecar goes: the app sees its connection end (no end left in the shim).
    crictl_ok(&["stop", "-t", "10", &side]);
    let answer = a.cmd("peer");
    assert!(
        answer.starts_with("ERR") && (answer.contains("EOF") || answer.contains("broken pipe")),
        "the app sees the sidecar's end close (not a timeout, as with an end still held): {answer}"
    );
}

/// Two containers of one pod share memory: a page of a file in the pod's
/// `/dev/shm` (the sandbox's, which CRI mounts into every container of the
/// pod), mapped `MAP_SHARED` by both. After each suspend and resume they
/// still share it, and what either wrote is kept.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn memory_two_containers_share_stays_shared() {
    torpor_only();
    const SHM: &str = "/dev/shm/torpor-test-shared";
    let pod = Pod::run("susp-shm");
    let side = pod.start_actor("side", &["counter", "--port", "8081", "--shared-mem", SHM]);
    wait_container_state(&side, "CONTAINER_RUNNING");
    let a = CounterSpec::new().in_the_pods_pid_namespace().extra_args(&["--shared-mem", SHM]).start(pod);
    let side_addr = format!("{}:8081", a.ip);
    assert_eq!(counter_cmd(&side_addr, "shared"), "1");
    assert_eq!(a.cmd("shared"), "2", "the app sees the sidecar's write");
    assert_eq!(a.inc(), 1);

    for cycle in 1..=2u64 {
        suspend_and_resume_both(&a, &side, cycle);
        assert_eq!(a.cmd("shared"), (2 * cycle + 1).to_string(), "cycle {cycle}: the shared value kept");
        assert_eq!(
            counter_cmd(&side_addr, "shared"),
            (2 * cycle + 2).to_string(),
            "cycle {cycle}: the sidecar maps the same memory as the app (not a copy of its own)"
        );
        assert_eq!(a.inc(), cycle + 1, "cycle {cycle}: the app's private count intact");
    }
}

/// Two containers of one pod connected by a named pipe on a volume they
/// share (a sidecar writes, the app reads), held open for their lives.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_fifo_between_two_containers_survives_suspend() {
    torpor_only();
    let (a, side) =
        app_and_sidecar("susp-fifo", &["counter", "--port", "8081", "--fifo-write", "/shared/pipe"], &["--fifo-read", "/shared/pipe"]);
    let side_addr = format!("{}:8081", a.ip);
    assert_eq!(counter_cmd(&side_addr, "fifo send"), "sent 1");
    assert_eq!(a.cmd("fifo read"), "msg 1");

    for cycle in 1..=2u64 {
        suspend_and_resume_both(&a, &side, cycle);
        assert_eq!(counter_cmd(&side_addr, "fifo send"), format!("sent {}", cycle + 1), "cycle {cycle}");
        assert_eq!(a.cmd("fifo read"), format!("msg {}", cycle + 1), "cycle {cycle}: the same pipe joins the two");
    }

    // A line left unread in the pipe comes back once, neither lost nor
    // written again by the writer's restore.
    assert_eq!(counter_cmd(&side_addr, "fifo send"), "sent 4");
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(a.cmd("fifo read"), "msg 4", "the line in the pipe at the suspend");
    let next = a.cmd("fifo read");
    assert!(next.starts_with("ERR") && next.contains("timeout"), "nothing more in the pipe: {next}");
    assert_eq!(counter_cmd(&side_addr, "fifo send"), "sent 5");
    assert_eq!(a.cmd("fifo read"), "msg 5");
}
