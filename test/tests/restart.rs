//! containerd restarts under a running and under a suspended actor: the
//! shim keeps both, containerd reconnects (it must not reap the suspended
//! actor's shim as leaked), and the suspended actor still wakes on its first
//! inbound connection with its state.
//!
//! One test per binary: restarting the rig's containerd would disturb tests
//! running beside it.

use std::path::PathBuf;
use std::time::Duration;

use torpor_tests::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn restart_containerd() {
    let pidfile = format!("{}/containerd.pid", rig().state_dir);
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap_or_else(|e| panic!("read {pidfile}: {e}")).trim().parse().unwrap();
    assert!(run("kill", ["-TERM", &pid.to_string()]).success());
    wait_for("the rig's containerd to exit", LIVENESS, || (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(()));
    let up = run(&repo().join("test/rig/up.sh").to_string_lossy(), &[] as &[&str]);
    assert!(up.success(), "test/rig/up.sh after the restart: {up}");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn actors_survive_a_containerd_restart() {
    torpor_only();
    require_rig();
    let running = CounterSpec::new().in_the_pods_pid_namespace().start(Pod::run("restart-run"));
    let asleep = CounterSpec::new().in_the_pods_pid_namespace().alloc_mib(32).start(Pod::run("restart-sleep"));
    assert_eq!(running.inc(), 1);
    assert_eq!(asleep.inc(), 1);
    assert_eq!(asleep.inc(), 2);
    let out = torporctl(&["suspend", asleep.shim()]);
    assert!(out.success(), "suspend: {out}");
    assert_eq!(asleep.state(), "SUSPENDED");

    restart_containerd();

    for c in [&running.container, &asleep.container] {
        wait_container_state(c, "CONTAINER_RUNNING");
    }
    assert_eq!(asleep.state(), "SUSPENDED", "the restart did not wake the actor");
    assert_eq!(running.inc(), 2, "the running actor kept its state");
    assert_eq!(asleep.inc(), 3, "the suspended actor woke on a connection, with its state");
    wait_for("the actor to be RUNNING", Duration::from_secs(30), || (asleep.state() == "RUNNING").then_some(()));
    running.pod.remove();
    asleep.pod.remove();
}
