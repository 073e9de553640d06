//! The same basic flows through containerd's own client, `ctr` (namespace
//! `default`), with `--runtime` set to the runtime_type under test.

use torpor_tests::*;

const NS: &str = "default";

/// `ctr run -d` of `/actor <args>`; the guard removes it again.
#[track_caller]
fn run_detached(prefix: &str, args: &[&str]) -> CtrContainer {
    require_rig();
    let id = unique_name(prefix);
    let c = CtrContainer::new(NS, &id);
    let mut command = vec!["/actor"];
    command.extend_from_slice(args);
    ctr_run(NS, &["-d"], &id, &command).ok();
    c
}

#[test]
fn run_detached_ls_ps_exec_kill_delete_rm() {
    let c = run_detached("ctr-basic", &["sleep"]);
    c.wait_status("RUNNING");

    let ls = ctr_ok(NS, &["containers", "ls", "-q"]);
    assert!(ls.lines().any(|l| l.trim() == c.id), "ctr c ls lists it:\n{ls}");
    let info = ctr_ok(NS, &["containers", "info", &c.id]);
    assert!(info.contains(&runtime_type()), "container runs under {}:\n{info}", runtime_type());

    let ps = ctr_ok(NS, &["task", "ps", &c.id]);
    let pids: Vec<u32> = ps.lines().skip(1).filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    assert!(!pids.is_empty(), "ctr task ps lists the actor's process:\n{ps}");

    // exec: stdout and the exit code come back
    let out = ctr(NS, &["task", "exec", "--exec-id", "x1", &c.id, "/bin/sh", "-c", "echo hi; exit 4"]);
    assert_eq!(out.code, 4, "{out}");
    assert_eq!(out.stdout.trim(), "hi", "{out}");
    // the exec id can be reused once the exec is gone
    let out = ctr(NS, &["task", "exec", "--exec-id", "x1", &c.id, "/bin/sh", "-c", "exit 0"]);
    assert!(out.success(), "{out}");

    // kill (SIGTERM): the actor exits, the task is STOPPED
    ctr_ok(NS, &["task", "kill", &c.id]);
    c.wait_status("STOPPED");
    ctr_ok(NS, &["task", "delete", &c.id]);
    assert_eq!(c.task_status(), None, "task gone after delete");
    ctr_ok(NS, &["containers", "rm", &c.id]);
    let ls = ctr_ok(NS, &["containers", "ls", "-q"]);
    assert!(!ls.lines().any(|l| l.trim() == c.id), "container gone after rm:\n{ls}");
}

#[test]
fn run_rm_returns_the_exit_code() {
    require_rig();
    let id = unique_name("ctr-exit");
    let _c = CtrContainer::new(NS, &id);
    let out = ctr_run(NS, &["--rm"], &id, &["/actor", "exit", "7"]);
    assert_eq!(out.code, 7, "{out}");
    let ls = ctr_ok(NS, &["containers", "ls", "-q"]);
    assert!(!ls.lines().any(|l| l.trim() == id), "--rm removed the container:\n{ls}");
}

#[test]
fn run_foreground_forwards_output() {
    require_rig();
    let id = unique_name("ctr-out");
    let _c = CtrContainer::new(NS, &id);
    let out = ctr_run(NS, &["--rm"], &id, &["/bin/sh", "-c", "echo to-out; echo to-err >&2"]);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("to-out"), "{out}");
    assert!(out.stderr.contains("to-err"), "{out}");
}

#[test]
fn pause_and_resume() {
    let c = run_detached("ctr-pause", &["sleep"]);
    c.wait_status("RUNNING");

    ctr_ok(NS, &["task", "pause", &c.id]);
    c.wait_status("PAUSED");
    ctr_ok(NS, &["task", "resume", &c.id]);
    c.wait_status("RUNNING");

    // it really runs again
    let out = ctr(NS, &["task", "exec", "--exec-id", "after-resume", &c.id, "/bin/sh", "-c", "echo alive"]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "alive");
}

#[test]
fn kill_of_a_term_ignoring_task_needs_sigkill() {
    let c = run_detached("ctr-kill", &["sleep", "--ignore-term"]);
    c.wait_status("RUNNING");
    // make sure the actor is up (its handlers installed) before signalling
    wait_for("exec into the task", LIVENESS, || {
        ctr(NS, &["task", "exec", "--exec-id", "ready", &c.id, "/bin/true"]).success().then_some(())
    });
    ctr_ok(NS, &["task", "kill", "-s", "SIGKILL", &c.id]);
    c.wait_status("STOPPED");
    let out = ctr(NS, &["task", "delete", &c.id]);
    assert!(out.success(), "{out}");
    // ctr reports the task's exit status on delete: "exit with non-zero exit code 137"
    assert!(out.stderr.contains("exit code 137"), "{out}");
}
