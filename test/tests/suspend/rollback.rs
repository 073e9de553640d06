//! A checkpoint that CRIU refuses part-way (a container holding a deleted
//! 4 MiB file: "Can't dump ghost file") rolls back, also from FROZEN.

use std::io::{BufRead, BufReader, Write};
use std::thread;
use std::time::Duration;

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

use crate::{assert_suspend_refused, container_processes, init_pid, panic_text, pid_alive_in};

/// A container whose process holds an open, deleted 4 MiB file: CRIU refuses
/// to dump it ("Can't dump ghost file ... increase limit"), so a suspend of
/// its pod fails in the middle of the checkpoint.
fn ghost_config(name: &str) -> Value {
    let mut c = container_config(name, &[]);
    c["command"] = serde_json::json!([
        "/bin/sh",
        "-c",
        "dd if=/dev/urandom of=/tmp/big bs=1M count=4 2>/dev/null; exec 3</tmp/big; rm /tmp/big; echo holding; exec sleep 100000"
    ]);
    c["args"] = serde_json::json!([]);
    c
}

/// Whether the counter answers `get` within 1 s on a fresh connection
/// (a frozen process never answers; the kernel still accepts the connection).
/// Panics if nothing listens (connection refused for 10 s).
#[track_caller]
fn answers_within_1s(addr: &str) -> Option<String> {
    let sa: std::net::SocketAddr = addr.parse().expect("address");
    let mut last = String::new();
    let mut s = None;
    for _ in 0..50 {
        match std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(5)) {
            Ok(c) => {
                s = Some(c);
                break;
            }
            Err(e) => last = e.to_string(),
        }
        thread::sleep(Duration::from_millis(200));
    }
    let Some(mut s) = s else {
        panic!("nothing listens on {addr} any more: {last}");
    };
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(b"get\n").ok()?;
    let mut line = String::new();
    match BufReader::new(s).read_line(&mut line) {
        Ok(n) if n > 0 => Some(line.trim().to_string()),
        _ => None,
    }
}

/// A pod with a started counter (port 8080) and a started ghost container
/// whose id sorts after the counter's, so that a suspend dumps the counter
/// first and then fails on the ghost: the rollback must restore the counter
/// from its fresh image.
fn pod_with_counter_before_ghost(prefix: &str) -> (Pod, String, String) {
    let pod = Pod::run(prefix);
    let mut counters = Vec::new();
    let mut ghosts = Vec::new();
    let mut pair = None;
    for i in 0..16 {
        counters.push(pod.create(&container_config(&format!("counter{i}"), &["counter", "--port", "8080"])));
        ghosts.push(pod.create(&ghost_config(&format!("ghost{i}"))));
        pair = counters.iter().find_map(|c| ghosts.iter().find(|g| c < *g).map(|g| (c.clone(), g.clone())));
        if pair.is_some() {
            break;
        }
    }
    let (counter, ghost) = pair.expect("a counter id sorting before a ghost id in 16 tries");
    for id in counters.iter().chain(&ghosts) {
        if *id != counter && *id != ghost {
            crictl_ok(&["rm", id]);
        }
    }
    crictl_ok(&["start", &counter]);
    crictl_ok(&["start", &ghost]);
    wait_container_state(&counter, "CONTAINER_RUNNING");
    wait_container_state(&ghost, "CONTAINER_RUNNING");
    let log = pod.log_dir.join(format!("{}.log", inspect_container(&ghost)["status"]["metadata"]["name"].as_str().unwrap_or("ghost0")));
    wait_for("the ghost container to hold its deleted file", LIVENESS, || {
        std::fs::read_to_string(&log).ok().filter(|t| t.contains("holding")).map(|_| ())
    });
    (pod, counter, ghost)
}

/// A checkpoint that fails part-way (CRIU refuses one container) rolls back:
/// the container already dumped is restored with its state, the others are
/// thawed, the actor is RUNNING and says why, no half image is left.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn failed_checkpoint_rolls_back() {
    torpor_only();
    let (pod, counter, ghost) = pod_with_counter_before_ghost("susp-rollback");
    let a = Counter::attach(pod, counter.clone());
    assert_eq!(a.inc(), 1);
    assert_eq!(a.inc(), 2);
    let counter_pid = init_pid(&counter);
    let ghost_pid = init_pid(&ghost);

    let (_, st) = assert_suspend_refused(&a, "CRIU cannot dump the ghost file", "ghost file", &[&ghost]);
    assert_eq!(st["generation"], 0, "a failed suspend does not count: {st}");
    // The counter was dumped (its process ended) and restored with its state.
    wait_for("the dumped counter's old process to be gone", LIVENESS, || (!pid_alive_in(counter_pid, &counter)).then_some(()));
    assert_eq!(a.inc(), 3, "the counter came back with its value");
    let pids = container_processes(&counter, "/actor counter");
    assert_eq!(pids.len(), 1, "one restored counter process: {pids:?}");
    assert_eq!(freezer_state(pids[0]).as_deref(), Some("THAWED"), "restored counter");
    // The ghost container was never stopped, and it is thawed.
    assert!(pid_alive_in(ghost_pid, &ghost), "the ghost container's process survives");
    assert_eq!(freezer_state(ghost_pid).as_deref(), Some("THAWED"), "ghost container");
    // Nothing of the failed suspend reached the snapshot store (its
    // staging was aborted), and no CRIU work files are left.
    let snaps = store_snapshots(&default_actor(&a.pod.name));
    assert!(snaps.is_empty(), "snapshots of a failed suspend: {snaps:?}");
    let files = files_below(&Node::a().actor_dir(a.shim()).join("work"));
    assert!(files.is_empty(), "CRIU work files of the failed suspend left: {files:?}");

    // The restored counter is a proper container process: stop reports its exit.
    crictl_ok(&["stop", "-t", "60", &counter]);
    let (code, reason) = wait_exited(&counter);
    assert_eq!(code, 0, "the restored counter exits 0 on SIGTERM ({reason})");
}

/// A suspend of a FROZEN actor that fails part-way must leave a record that
/// tells the truth: FROZEN with the processes frozen, or RUNNING with them
/// running (not FROZEN while they run).
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn failed_suspend_of_frozen_actor_is_consistent() {
    torpor_only();
    let (pod, counter, ghost) = pod_with_counter_before_ghost("susp-frozen-rollback");
    let a = Counter::attach(pod, counter.clone());
    assert_eq!(a.inc(), 1);
    let ghost_pid = init_pid(&ghost);

    a.op("freeze");
    assert_eq!(a.state(), "FROZEN");
    // (checked on the cgroup, not with a connection: a connection left in the
    // frozen counter's accept queue makes CRIU fail on the counter instead,
    // see freeze::suspend_of_frozen_actor_with_pending_connection)
    let counter_pid = init_pid(&counter);
    assert_eq!(freezer_state(counter_pid).as_deref(), Some("FROZEN"), "counter");
    assert_eq!(freezer_state(ghost_pid).as_deref(), Some("FROZEN"), "ghost");

    let out = torporctl(&["suspend", a.shim()]);
    assert!(!out.success(), "the suspend must fail (CRIU cannot dump the ghost file): {out}");
    assert!(out.stderr.contains("ghost file"), "it fails on the ghost container: {out}");
    // Whatever the record says, the rollback must not lose a container.
    for c in [&counter, &ghost] {
        let v = inspect_container(c);
        assert_eq!(
            v["status"]["state"],
            "CONTAINER_RUNNING",
            "container {c} after the rolled-back suspend: {}\n{}",
            v["status"],
            a.diagnostics(&[&ghost])
        );
    }
    let st = a.status();
    let state = st["state"].as_str().unwrap_or_default().to_string();
    let counter_pids = container_processes(&counter, "/actor counter");
    let freezer: Vec<(String, Option<String>)> = counter_pids
        .iter()
        .map(|p| (format!("counter pid {p}"), freezer_state(*p)))
        .chain([(format!("ghost pid {ghost_pid}"), freezer_state(ghost_pid))])
        .collect();
    let answer = std::panic::catch_unwind(|| answers_within_1s(&a.addr())).unwrap_or_else(|e| {
        panic!(
            "{}; after the rolled-back suspend of the FROZEN actor: record {st}; counter {}; ghost {}\n{}",
            panic_text(e),
            inspect_container(&counter)["status"],
            inspect_container(&ghost)["status"],
            a.diagnostics(&[&ghost])
        )
    });
    match state.as_str() {
        "FROZEN" => {
            assert_eq!(
                answer, None,
                "the record says FROZEN after the failed suspend, but the counter answers; freezer: {freezer:?}; {st}"
            );
            assert!(
                freezer.iter().all(|(_, f)| f.as_deref() == Some("FROZEN")),
                "the record says FROZEN, the cgroups say {freezer:?}; {st}"
            );
        }
        "RUNNING" => {
            assert_eq!(answer.as_deref(), Some("1"), "RUNNING, so the counter answers; {st}");
        }
        other => panic!("state {other} after a failed suspend of a FROZEN actor: {st}"),
    }

    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(a.inc(), 2, "value intact");
}
