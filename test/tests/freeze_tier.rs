//! The freeze tier (`torpor.dev/freeze-first`), against the rig: a suspend
//! freezes the actor in memory first; a request inside the window thaws it
//! (no CRIU); the window's end, a second suspend and memory pressure
//! checkpoint it; kubelet-style probes do not thaw it; a containerd restart
//! leaves it frozen and wakeable.
//!
//! The tests of this binary run one at a time (one of them restarts the
//! rig's containerd, which would disturb the others).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use torpor_tests::serde_json::Value;
use torpor_tests::*;

const FREEZE_FIRST: &str = "torpor.dev/freeze-first";
const MIB: u64 = 1024 * 1024;
const ALLOC_MIB: u32 = 64;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// A counter with `ALLOC_MIB` of live memory in a pod with
/// `torpor.dev/freeze-first: window`, answering 0.
#[track_caller]
fn actor(prefix: &str, window: &str) -> Counter {
    let pod = Pod::run_with(prefix, PodOptions::annotated(&[(FREEZE_FIRST, window)]));
    let a = CounterSpec::new().in_the_pods_pid_namespace().alloc_mib(ALLOC_MIB).start(pod);
    assert_eq!(a.cmd("get"), "0", "fresh counter");
    a
}

/// Memory charged to a host pid's memory cgroup, in bytes.
fn memory_usage(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let file: PathBuf = text.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls
            .split(',')
            .any(|c| c == "memory")
            .then(|| Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')).join("memory.usage_in_bytes"))
    })?;
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The one counter process of `a`.
#[track_caller]
fn the_process(a: &Counter) -> u32 {
    let p = a.processes();
    assert_eq!(p.len(), 1, "one counter process: {p:?}");
    p[0].0
}

/// `torporctl suspend` of an actor with freeze-first: FROZEN in the freeze
/// tier, the process frozen with its memory, no CRIU. Returns the pid.
#[track_caller]
fn suspend_to_freeze_tier(a: &Counter) -> u32 {
    let pid = the_process(a);
    let generation = a.status()["generation"].as_u64();
    let st = a.op("suspend");
    assert_eq!(st["state"], "FROZEN", "a suspend with freeze-first freezes first: {st}");
    assert!(st["freeze_tier"]["until_ms"].as_u64().is_some(), "the record says freeze tier: {st}");
    assert!(st["fenced"].is_null(), "{st}");
    assert_eq!(st["generation"].as_u64(), generation, "no checkpoint: {st}");
    assert!(st["staging"].is_null() && st["snapshot"].is_null(), "no CRIU images: {st}");
    assert_eq!(the_process(a), pid, "the same process");
    assert_eq!(freezer_state(pid).as_deref(), Some("FROZEN"), "in the cgroup freezer");
    let used = memory_usage(pid).unwrap_or(0);
    assert!(used >= u64::from(ALLOC_MIB) * MIB, "memory stays resident: {} MiB charged", used / MIB);
    // torporctl's table tells it apart from a fence-freeze.
    let table = torporctl(&["status", a.shim()]);
    assert!(table.success() && table.stdout.contains("FROZEN-TIER"), "{table}");
    pid
}

/// Waits until the actor is SUSPENDED (checkpointed, its process gone).
#[track_caller]
fn wait_checkpointed(a: &Counter, why: &str) -> Value {
    let st = wait_for(why, LIVENESS, || {
        let st = a.status();
        (st["state"] == "SUSPENDED").then_some(st)
    });
    assert!(st["freeze_tier"].is_null(), "{st}");
    wait_for("the frozen process to be gone after the checkpoint", LIVENESS, || a.processes().is_empty().then_some(()));
    st
}

/// An HTTP GET as kubelet's httpGet probe sends it; the status line.
fn http_probe(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(LIVENESS)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: pod\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("the probe's answer");
    line.trim().to_string()
}

/// kubelet's tcpSocket probe: connect, close.
fn tcp_probe(addr: &str) {
    drop(TcpStream::connect(addr).expect("connect"));
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_request_inside_the_window_thaws_and_probes_do_not() {
    torpor_only();
    let _one = serial();
    let a = actor("ft-thaw", "10m");
    assert_eq!(a.inc(), 1);
    let pid = suspend_to_freeze_tier(&a);

    // Probes are answered without thawing it.
    for _ in 0..3 {
        let status = http_probe(&a.addr());
        assert!(status.starts_with("HTTP/1.1 200"), "kube-probe answered: {status:?}");
        tcp_probe(&a.addr());
    }
    // The shim answered them while the process stayed frozen.
    assert_eq!(freezer_state(pid).as_deref(), Some("FROZEN"), "probes did not thaw it");
    let st = a.status();
    assert_eq!(st["state"], "FROZEN", "{st}");
    assert!(st["freeze_tier"].is_object(), "{st}");

    // A real request thaws it: the same process, its state intact.
    assert_eq!(a.inc(), 2, "answered by the thawed actor, value intact");
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert!(st["freeze_tier"].is_null() && st["snapshot"].is_null() && st["staging"].is_null(), "thawed, not restored: {st}");
    assert!(st["last_resume_ms"].as_u64().is_some(), "{st}");
    assert_eq!(the_process(&a), pid, "no CRIU: the process that was frozen");
    assert_eq!(freezer_state(pid).as_deref(), Some("THAWED"));
    // From now on the actor accepts its connections itself.
    for n in 3..=5 {
        assert_eq!(a.inc(), n);
    }
    // And a thawed actor goes to the freeze tier again on the next suspend.
    suspend_to_freeze_tier(&a);
    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "torporctl resume thaws it: {st}");
    assert_eq!(a.inc(), 6);
    a.pod.remove();
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn the_window_end_checkpoints() {
    torpor_only();
    let _one = serial();
    let a = actor("ft-window", "3s");
    assert_eq!(a.inc(), 1);
    let sum = a.cmd("sum");
    suspend_to_freeze_tier(&a);
    let st = wait_checkpointed(&a, "the checkpoint at the end of the freeze window");
    assert_eq!(st["generation"].as_u64(), Some(1), "{st}");
    // Suspended as usual: a request restores it, with its memory.
    assert_eq!(a.inc(), 2, "restored with its state");
    assert_eq!(a.cmd("sum"), sum, "memory intact");
    assert_eq!(a.state(), "RUNNING");
    a.pod.remove();
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_suspend_while_frozen_checkpoints_at_once() {
    torpor_only();
    let _one = serial();
    let a = actor("ft-again", "10m");
    assert_eq!(a.inc(), 1);
    suspend_to_freeze_tier(&a);
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "the second suspend checkpoints: {st}");
    assert!(st["freeze_tier"].is_null(), "{st}");
    wait_for("the process to be gone", LIVENESS, || a.processes().is_empty().then_some(()));
    assert_eq!(a.inc(), 2, "restored with its state");
    a.pod.remove();
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn memory_pressure_checkpoints_early() {
    torpor_only();
    let _one = serial();
    let a = actor("ft-pressure", "10m");
    assert_eq!(a.inc(), 1);
    suspend_to_freeze_tier(&a);
    // The test hook: the shim's MemAvailable threshold is unbounded.
    let armed = arm_failpoint(a.shim(), "freeze-pressure");
    let st = wait_checkpointed(&a, "the checkpoint under memory pressure, long before the window ends");
    drop(armed);
    assert_eq!(st["generation"].as_u64(), Some(1), "{st}");
    assert_eq!(a.inc(), 2, "restored with its state");
    a.pod.remove();
}

/// A stop of an actor in the freeze tier ends it (the frozen process gets
/// its signal).
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_frozen_actor_stops() {
    torpor_only();
    let _one = serial();
    let a = actor("ft-stop", "10m");
    suspend_to_freeze_tier(&a);
    let out = crictl(&["stop", "--timeout", "30", &a.container]);
    assert!(out.success(), "crictl stop of an actor in the freeze tier: {out}");
    wait_exited(&a.container);
    a.pod.remove();
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn restart_containerd() {
    let pidfile = format!("{}/containerd.pid", rig().state_dir);
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap_or_else(|e| panic!("read {pidfile}: {e}")).trim().parse().unwrap();
    assert!(run("kill", ["-TERM", &pid.to_string()]).success());
    wait_for("the rig's containerd to exit", LIVENESS, || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()));
    let up = run(&repo().join("test/rig/up.sh").to_string_lossy(), &[] as &[&str]);
    assert!(up.success(), "test/rig/up.sh after the restart: {up}");
}

/// A containerd restart leaves the actor frozen, in its window, and a
/// request still thaws it.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_containerd_restart_leaves_it_frozen_and_wakeable() {
    torpor_only();
    require_rig();
    let _one = serial();
    let a = actor("ft-restart", "10m");
    assert_eq!(a.inc(), 1);
    let pid = suspend_to_freeze_tier(&a);
    restart_containerd();
    wait_container_state(&a.container, "CONTAINER_RUNNING");
    let st = a.status();
    assert_eq!(st["state"], "FROZEN", "{st}");
    assert!(st["freeze_tier"].is_object(), "{st}");
    assert_eq!(freezer_state(pid).as_deref(), Some("FROZEN"));
    let mut s = TcpStream::connect(a.addr()).expect("connect");
    s.set_read_timeout(Some(LIVENESS)).unwrap();
    s.write_all(b"inc\n").unwrap();
    let mut reply = String::new();
    BufReader::new(s.try_clone().unwrap()).read_line(&mut reply).expect("answer");
    assert_eq!(reply.trim(), "2", "thawed by a request after the restart, value intact");
    drop(s);
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(the_process(&a), pid, "thawed, not restored");
    a.pod.remove();
}
