//! Faults in the middle (failpoints): a restore that fails half-way
//! through a pod, a full disk at the suspend's save, a dump altered before
//! its restore.

use std::path::PathBuf;
use std::time::Duration;

use torpor_tests::serde_json::Value;
use torpor_tests::*;

use crate::{actor, container_processes, MIB};

/// A pod of two app containers suspended; `torporctl resume` with the
/// restore of the *last* container failing (failpoint `restore-fails`).
/// Returns the actor, the other container and the name that fails.
#[track_caller]
fn two_containers_with_a_failing_restore(prefix: &str, opts: PodOptions) -> (Counter, String, Cleanup) {
    let a = CounterSpec::new().in_the_pods_pid_namespace().start(Pod::run_with(prefix, opts));
    let logs = a.pod.start_actor("logs", &["logs", "--lines", "0", "--interval-ms", "50"]);
    wait_container_state(&logs, "CONTAINER_RUNNING");
    assert_eq!(a.inc(), 1);
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    // The restore goes through the containers in the record's order: the
    // last one fails, after every other was restored.
    let order: Vec<String> = st["containers"].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect();
    assert_eq!(order.len(), 2, "{st}");
    let failing = if order[1] == logs { "logs" } else { "counter" };
    let armed = arm_failpoint(a.shim(), &format!("restore-fails:{failing}"));
    (a, logs, armed)
}

/// Issue 14 #9: a restore that fails half-way through a pod is undone (no
/// container of the pod runs under the SUSPENDED record), the error is in
/// the record, the ports are held again (the actor is not deaf), and the
/// next inbound connection, once the fault is gone, resumes it with its
/// state intact (`torpor.dev/on-restore-failure` unset: keep).
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn failed_restore_mid_pod_is_undone_and_stays_wakeable() {
    torpor_only();
    let (a, logs, armed) = two_containers_with_a_failing_restore("susp-undo", PodOptions::default());

    let out = torporctl(&["resume", a.shim()]);
    assert!(!out.success(), "the resume must fail while the failpoint is armed: {out}");
    assert!(out.stderr.contains("restore-fails"), "the error names the failed restore: {out}");
    let st = a.status();
    assert_eq!(st["state"], "SUSPENDED", "a failed restore leaves the actor SUSPENDED: {st}");
    assert!(st["last_error"].as_str().unwrap_or_default().contains("restore-fails"), "last_error says why: {st}");
    for c in [&a.container, &logs] {
        assert!(
            container_processes(c, "/actor").is_empty(),
            "no process of {c} runs after the failed restore (the restored one was undone)\n{}",
            a.diagnostics(&[&logs])
        );
    }
    // Not deaf: the port is held again, and a connection is a wake-up
    // (which fails too, backed off, while the fault lasts).
    let held = std::net::TcpStream::connect_timeout(&a.addr().parse().expect("counter address"), Duration::from_secs(5));
    assert!(held.is_ok(), "the actor's port is held again after the failed restore: {held:?}");
    drop(held);
    wait_for("the wake-up on the held port to fail and back off", LIVENESS, || (a.state() == "SUSPENDED").then_some(()));

    drop(armed);
    assert_eq!(a.inc(), 2, "the next connection resumes the actor with its state");
    assert_eq!(a.state(), "RUNNING");
    assert!(a.status()["last_error"].is_null(), "a successful resume clears last_error");
    wait_for("the logs container to run again", LIVENESS, || (!container_processes(&logs, "/actor").is_empty()).then_some(()));
}

/// Issue 14 #9: with `torpor.dev/on-restore-failure: cold-start`, a restore
/// that fails half-way starts the whole pod afresh from its images: RUNNING,
/// with the reason in the record, and a counter that starts again at 0.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn failed_restore_mid_pod_starts_cold_when_asked() {
    torpor_only();
    let opts = PodOptions::annotated(&[("torpor.dev/on-restore-failure", "cold-start")]);
    let (a, logs, armed) = two_containers_with_a_failing_restore("susp-cold", opts);

    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    let err = st["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("started cold") && err.contains("restore-fails"), "the record says it started cold, and why: {st}");
    drop(armed);
    assert_eq!(a.inc(), 1, "a cold start begins from the image, not the snapshot");
    for c in [&a.container, &logs] {
        assert_eq!(container_state(c), "CONTAINER_RUNNING", "{c}");
    }
    wait_for("both containers to run", LIVENESS, || {
        (!container_processes(&logs, "/actor").is_empty() && !container_processes(&a.container, "/actor").is_empty()).then_some(())
    });
}

/// Issue 14 #10: the save of the SUSPENDED record fails (a full disk,
/// failpoint `record-save-fails:SUSPENDED`) after every container was
/// dumped. The processes are gone, so the dump is the actor: the suspend
/// still holds the ports, unlocks the network and commits the dump, and the
/// commit saves the record. The actor then wakes on a request with its
/// state.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn full_disk_at_the_suspended_save_still_commits_and_wakes() {
    torpor_only();
    let a = actor("susp-enospc", &[]);
    assert_eq!(a.inc(), 1);
    let armed = arm_failpoint(a.shim(), "record-save-fails:SUSPENDED");
    let st = a.op("suspend");
    drop(armed);
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    assert!(st["last_error"].as_str().unwrap_or_default().contains("could not be saved"), "the failed save is reported: {st}");
    assert!(container_processes(&a.container, "/actor").is_empty(), "the actor is dumped");
    let committed = wait_for("the dump to be committed despite the failed save", LIVENESS, || {
        let st = a.status();
        st["snapshot"].is_object().then_some(st)
    });
    assert_eq!(committed["state"], "SUSPENDED", "{committed}");
    let on_disk = a.node().actor_record(a.shim()).expect("the actor record on disk");
    assert_eq!(on_disk["state"], "SUSPENDED", "the commit saved the record again: {on_disk}");
    assert!(on_disk["snapshot"].is_object(), "{on_disk}");
    assert_eq!(a.inc(), 2, "a request wakes it with its state (its ports were held)");
}

/// Issue 14 #3: images are checked against the seal of their dump before a
/// restore uses them, a view of a staging that is not committed yet
/// included. The commit is held back (failpoint `commit-held`), the pages
/// image of the staging is cut short, and the resume is refused naming the
/// file; the actor stays SUSPENDED with the reason. The store then commits
/// what is there (its manifest is made from the altered file), and the seal,
/// which travels in the snapshot, refuses that too.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn an_altered_dump_is_refused_before_the_restore() {
    torpor_only();
    let a = CounterSpec::new().in_the_pods_pid_namespace().alloc_mib(8).start(Pod::run("susp-seal"));
    let _snapshots = Cleanup::snapshots(&a.actor);
    assert_eq!(a.inc(), 1);
    let held = arm_failpoint(a.shim(), "commit-held");
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    let rec = a.node().actor_record(a.shim()).expect("the actor record");
    assert!(rec["snapshot"].is_null(), "the commit is held back: {rec}");
    let staging = PathBuf::from(rec["staging"]["path"].as_str().unwrap_or_else(|| panic!("a staging: {rec}")));
    assert!(staging.join("torpor-seal.json").is_file(), "the dump is sealed: {:?}", files_below(&staging));
    let pages = files_below(&staging)
        .into_iter()
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("pages-") && n.ends_with(".img")))
        .unwrap_or_else(|| panic!("a pages image in {staging:?}"));
    let size = std::fs::metadata(&pages).map(|m| m.len()).unwrap_or(0);
    assert!(size > 8 * MIB, "{pages:?} holds the memory ({size} bytes)");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&pages)
        .and_then(|f| f.set_len(size / 2))
        .unwrap_or_else(|e| panic!("truncate {pages:?}: {e}"));
    let name = pages.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();

    let refused = |when: &str| {
        let out = torporctl(&["resume", a.shim()]);
        assert!(!out.success(), "{when}: the resume must be refused: {out}");
        assert!(out.stderr.contains(&name) && out.stderr.contains("seal"), "{when}: the error names the file: {out}");
        let st = a.status();
        assert_eq!(st["state"], "SUSPENDED", "{when}: {st}");
        assert!(st["last_error"].as_str().unwrap_or_default().contains(&name), "{when}: last_error names the file: {st}");
        assert!(container_processes(&a.container, "/actor").is_empty(), "{when}: nothing was restored");
    };
    refused("from the staging's view");
    drop(held);
    wait_for("the commit of the altered staging", LIVENESS, || {
        let st = a.status();
        st["snapshot"].is_object().then_some(())
    });
    refused("from the committed snapshot");
}
