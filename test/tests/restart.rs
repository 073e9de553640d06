//! containerd restarts under a running and under a suspended actor: the
//! shim keeps both, containerd reconnects (it must not reap the suspended
//! actor's shim as leaked), and the suspended actor still wakes on its first
//! inbound connection with its state.
//!
//! One test per binary: restarting the rig's containerd would disturb tests
//! running beside it.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use torpor_tests::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn torporctl(args: &[&str]) -> Output {
    let bin = std::env::var("TORPOR_CTL")
        .unwrap_or_else(|_| repo().join("target/release/torporctl").to_string_lossy().into_owned());
    run(&bin, args)
}

fn actor_state(pod: &Pod) -> String {
    let out = torporctl(&["--json", "status", &pod.id]);
    assert!(out.success(), "torporctl status: {out}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    v[0]["actor"]["state"].as_str().unwrap_or_default().to_string()
}

fn inc(ip: &str) -> u64 {
    let mut s = connect_with_retry(&format!("{ip}:8080"));
    s.set_read_timeout(Some(LIVENESS)).unwrap();
    s.write_all(b"inc\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    line.trim().parse().unwrap_or_else(|e| panic!("counter said {line:?}: {e}"))
}

fn restart_containerd() {
    let pidfile = format!("{}/containerd.pid", rig().state_dir);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("read {pidfile}: {e}"))
        .trim()
        .parse()
        .unwrap();
    assert!(run("kill", &["-TERM", &pid.to_string()]).success());
    wait_for("the rig's containerd to exit", LIVENESS, || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
    let up = run(&repo().join("test/rig/up.sh").to_string_lossy(), &[] as &[&str]);
    assert!(up.success(), "test/rig/up.sh after the restart: {up}");
}

#[test]
fn actors_survive_a_containerd_restart() {
    if !is_torpor() {
        eprintln!("runtime {} is not torpor: no actors to suspend", runtime_handler());
        return;
    }
    require_rig();
    let running = Pod::run("restart-run");
    let c1 = running.start_actor("counter", &["counter", "--port", "8080"]);
    let asleep = Pod::run("restart-sleep");
    let c2 = asleep.start_actor("counter", &["counter", "--port", "8080", "--alloc-mib", "32"]);
    let (ip1, ip2) = (running.ip(), asleep.ip());
    assert_eq!(inc(&ip1), 1);
    assert_eq!(inc(&ip2), 1);
    assert_eq!(inc(&ip2), 2);
    let out = torporctl(&["suspend", &asleep.id]);
    assert!(out.success(), "suspend: {out}");
    assert_eq!(actor_state(&asleep), "SUSPENDED");

    restart_containerd();

    for c in [&c1, &c2] {
        wait_container_state(c, "CONTAINER_RUNNING");
    }
    assert_eq!(actor_state(&asleep), "SUSPENDED", "the restart did not wake the actor");
    assert_eq!(inc(&ip1), 2, "the running actor kept its state");
    assert_eq!(inc(&ip2), 3, "the suspended actor woke on a connection, with its state");
    wait_for("the actor to be RUNNING", Duration::from_secs(30), || {
        (actor_state(&asleep) == "RUNNING").then_some(())
    });
    running.remove();
    asleep.remove();
}
