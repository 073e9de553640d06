//! No lock is held across an external command (docs/ARCHITECTURE.md, *The
//! runtime's layers*): while an actor is being dumped, containerd's State,
//! Pids and Stats of its container answer — under a kubelet they are polled
//! all the time, and a State that waits for a dump is a timed-out
//! ContainerStatus.
//!
//! The dump is held mid-way for as long as the test needs: the failpoint
//! `suspend-stall-during-dump` (runtime/src/failpoint.rs) stops CRIU with
//! SIGSTOP once it runs, until the point is disarmed. Every call below is
//! made, and must have answered, while the actor's record still says
//! SUSPENDING and the `torporctl suspend` has not returned.

use std::thread;

use torpor_tests::*;

const STALL: &str = "suspend-stall-during-dump";

/// Pids of stopped (`T`) processes named `criu`.
fn stopped_criu() -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(')')) else { continue };
        if name == "criu" && rest.split_whitespace().next() == Some("T") {
            found.push(pid);
        }
    }
    found
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn state_pids_and_stats_answer_while_the_actor_is_dumped() {
    torpor_only();
    let c = CounterSpec::new().alloc_mib(64).start(Pod::run("dumping"));
    assert_eq!(c.inc(), 1);
    let node = c.node();
    let shim = c.shim().to_string();
    let stall = arm_failpoint(&shim, STALL);

    let suspend = {
        let shim = shim.clone();
        thread::spawn(move || node.torporctl(&["--json", "suspend", &shim]))
    };
    let criu = wait_for("CRIU stopped in the middle of the dump", LIVENESS, || {
        let s = stopped_criu();
        (!s.is_empty()).then_some(s)
    });
    assert_eq!(c.state(), "SUSPENDING", "the actor is being dumped");

    // State (crictl inspect: CRI ContainerStatus → the shim's State).
    let st = node.crictl_json(&["inspect", &c.container]);
    assert_eq!(st["status"]["state"], "CONTAINER_RUNNING", "State while dumped: {st}");
    // Pids (ctr task ps → the shim's Pids): the checkpointed init.
    let ps = node.ctr("k8s.io", &["task", "ps", &c.container]);
    assert!(ps.success(), "Pids while dumped: {ps}");
    let pids: Vec<&str> = ps.stdout.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(pids.len(), 1, "one pid (the container's init) while dumped: {ps}");
    // Stats (crictl stats → the shim's Stats).
    let stats = node.crictl(&["stats", "-o", "json", &c.container]);
    assert!(stats.success(), "Stats while dumped: {stats}");
    assert!(stats.stdout.contains(&c.container), "stats name the container: {stats}");

    // All of it answered before the dump ended.
    assert_eq!(stopped_criu(), criu, "CRIU is still stopped");
    assert_eq!(c.state(), "SUSPENDING", "still being dumped");
    assert!(!suspend.is_finished(), "the suspend waits for the dump");

    stall.now();
    let out = suspend.join().unwrap_or_else(|_| panic!("torporctl suspend thread panicked"));
    assert!(out.success(), "the suspend completes once CRIU continues: {out}\n{}", c.diagnostics(&[]));
    assert_eq!(c.state(), "SUSPENDED");
    // And the actor comes back whole.
    assert_eq!(c.inc(), 2, "resumed by an inbound connection, state intact");
    assert_eq!(c.state(), "RUNNING");
}
