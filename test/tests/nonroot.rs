//! An actor whose processes run as a non-root uid is suspended and resumed
//! like a root one.
//!
//! CRIU reads each dumped task's resource limits with prlimit(), which for
//! a task of another uid needs CAP_SYS_RESOURCE. A host whose root lacks it
//! (its capability bounding set without bit 24, as on this rig's machine)
//! made `criu dump` fail with "Can't get rlimit 0: Operation not permitted";
//! torpor's CRIU (scripts/criu-patches/0002-*.patch) then reads them from
//! /proc/<pid>/limits. On a host whose root has the capability the test runs
//! the same, through prlimit().
//!
//! torpor-only: under TORPOR_TEST_RUNTIME=runc there is no actor to suspend
//! (the test is reported ignored).

use torpor_tests::*;

/// The uid the counter runs as (not in the actor image's /etc/passwd:
/// CRI then runs it with gid 0, as kubelet does for a bare runAsUser).
const UID: u32 = 1000;

/// The `Uid:` line of /proc/<pid>/status: real, effective, saved, fs uid.
#[track_caller]
fn uids(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap_or_else(|| panic!("/proc/{pid}/status has no Uid line:\n{status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// /proc/<pid>/limits as it reads.
#[track_caller]
fn limits(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_else(|e| panic!("read /proc/{pid}/limits: {e}"))
}

/// The counter's one process (host pid), checked to run as `UID`.
#[track_caller]
fn the_process(c: &Counter, when: &str) -> u32 {
    let procs = wait_for(&format!("the counter's process {when}"), LIVENESS, || {
        let p = c.processes();
        (!p.is_empty()).then_some(p)
    });
    assert_eq!(procs.len(), 1, "one counter process {when}: {procs:?}");
    let pid = procs[0].0;
    let want = format!("{UID} {UID} {UID} {UID}");
    assert_eq!(uids(pid), want, "the counter (pid {pid}) runs as uid {UID} {when}");
    pid
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_non_root_counter_is_suspended_and_resumed_as_its_uid() {
    torpor_only();
    let c = CounterSpec::new().run_as_user(UID).start(Pod::run("nonroot"));
    assert_eq!(c.cmd("get"), "0", "fresh counter");
    let pid = the_process(&c, "before the suspend");
    let limits_before = limits(pid);
    c.inc_from(0, 5);

    // Suspended by torporctl, woken by a request.
    let snapshot = c.suspend();
    eprintln!("suspended: {snapshot}");
    wait_for(&format!("pid {pid} to be gone after the suspend"), LIVENESS, || {
        (!c.processes().iter().any(|(p, _)| *p == pid)).then_some(())
    });
    assert_eq!(c.inc(), 6, "a request wakes it with its count");
    assert_eq!(c.state(), "RUNNING");
    let pid = the_process(&c, "after the resume by a request");
    assert_eq!(limits(pid), limits_before, "the restored process's resource limits are the dumped ones");

    // Suspended again, resumed by torporctl.
    c.suspend();
    let st = c.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    let pid = the_process(&c, "after torporctl resume");
    assert_eq!(c.inc(), 7, "the count after the second resume");
    assert_eq!(limits(pid), limits_before, "the resource limits after the second resume");
    assert_eq!(container_state(&c.container), "CONTAINER_RUNNING");
}
