//! The same basic flows through containerd's own client, `ctr` (namespace
//! `default`), with `--runtime` set to the runtime_type under test.

use torpor_tests::*;

const NS: &str = "default";

#[track_caller]
fn ctr_ok(args: &[&str]) -> String {
    ctr(NS, args).ok()
}

fn wait_task_status(c: &CtrContainer, want: &str) {
    let mut last = None;
    let what = format!("ctr task {} to be {want}", c.id);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, LIVENESS, || {
            last = c.task_status();
            (last.as_deref() == Some(want)).then_some(())
        })
    }));
    if res.is_err() {
        panic!("timed out waiting for {what}; last status {last:?}");
    }
}

/// `ctr run -d` of `/actor <args>`; the guard removes it again.
#[track_caller]
fn run_detached(prefix: &str, args: &[&str]) -> CtrContainer {
    require_rig();
    let id = unique_name(prefix);
    let c = CtrContainer::new(NS, &id);
    let rt = runtime_type();
    let mut a = vec![
        "run",
        "-d",
        "--runtime",
        rt.as_str(),
        ACTOR_IMAGE,
        id.as_str(),
        "/actor",
    ];
    a.extend_from_slice(args);
    ctr_ok(&a);
    c
}

#[test]
fn run_detached_ls_ps_exec_kill_delete_rm() {
    let c = run_detached("ctr-basic", &["sleep"]);
    wait_task_status(&c, "RUNNING");

    let ls = ctr_ok(&["containers", "ls", "-q"]);
    assert!(
        ls.lines().any(|l| l.trim() == c.id),
        "ctr c ls lists it:\n{ls}"
    );
    let info = ctr_ok(&["containers", "info", &c.id]);
    assert!(
        info.contains(&runtime_type()),
        "container runs under {}:\n{info}",
        runtime_type()
    );

    let ps = ctr_ok(&["task", "ps", &c.id]);
    let pids: Vec<u32> = ps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        !pids.is_empty(),
        "ctr task ps lists the actor's process:\n{ps}"
    );

    // exec: stdout and the exit code come back
    let out = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "x1",
            &c.id,
            "/bin/sh",
            "-c",
            "echo hi; exit 4",
        ],
    );
    assert_eq!(out.code, 4, "{out}");
    assert_eq!(out.stdout.trim(), "hi", "{out}");
    // the exec id can be reused once the exec is gone
    let out = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "x1",
            &c.id,
            "/bin/sh",
            "-c",
            "exit 0",
        ],
    );
    assert!(out.success(), "{out}");

    // kill (SIGTERM): the actor exits, the task is STOPPED
    ctr_ok(&["task", "kill", &c.id]);
    wait_task_status(&c, "STOPPED");
    ctr_ok(&["task", "delete", &c.id]);
    assert_eq!(c.task_status(), None, "task gone after delete");
    ctr_ok(&["containers", "rm", &c.id]);
    let ls = ctr_ok(&["containers", "ls", "-q"]);
    assert!(
        !ls.lines().any(|l| l.trim() == c.id),
        "container gone after rm:\n{ls}"
    );
}

#[test]
fn run_rm_returns_the_exit_code() {
    require_rig();
    let id = unique_name("ctr-exit");
    let _c = CtrContainer::new(NS, &id);
    let rt = runtime_type();
    let out = ctr_with(
        NS,
        &[
            "run",
            "--rm",
            "--runtime",
            &rt,
            ACTOR_IMAGE,
            &id,
            "/actor",
            "exit",
            "7",
        ],
        None,
        COMMAND_LIMIT,
    );
    assert_eq!(out.code, 7, "{out}");
    let ls = ctr_ok(&["containers", "ls", "-q"]);
    assert!(
        !ls.lines().any(|l| l.trim() == id),
        "--rm removed the container:\n{ls}"
    );
}

#[test]
fn run_foreground_forwards_output() {
    require_rig();
    let id = unique_name("ctr-out");
    let _c = CtrContainer::new(NS, &id);
    let rt = runtime_type();
    let out = ctr(
        NS,
        &[
            "run",
            "--rm",
            "--runtime",
            &rt,
            ACTOR_IMAGE,
            &id,
            "/bin/sh",
            "-c",
            "echo to-out; echo to-err >&2",
        ],
    );
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("to-out"), "{out}");
    assert!(out.stderr.contains("to-err"), "{out}");
}

#[test]
fn pause_and_resume() {
    let c = run_detached("ctr-pause", &["sleep"]);
    wait_task_status(&c, "RUNNING");

    ctr_ok(&["task", "pause", &c.id]);
    wait_task_status(&c, "PAUSED");
    ctr_ok(&["task", "resume", &c.id]);
    wait_task_status(&c, "RUNNING");

    // it really runs again
    let out = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "after-resume",
            &c.id,
            "/bin/sh",
            "-c",
            "echo alive",
        ],
    );
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "alive");
}

#[test]
fn kill_of_a_term_ignoring_task_needs_sigkill() {
    let c = run_detached("ctr-kill", &["sleep", "--ignore-term"]);
    wait_task_status(&c, "RUNNING");
    // make sure the actor is up (its handlers installed) before signalling
    wait_for("exec into the task", LIVENESS, || {
        ctr(
            NS,
            &["task", "exec", "--exec-id", "ready", &c.id, "/bin/true"],
        )
        .success()
        .then_some(())
    });
    ctr_ok(&["task", "kill", "-s", "SIGKILL", &c.id]);
    wait_task_status(&c, "STOPPED");
    let out = ctr(NS, &["task", "delete", &c.id]);
    assert!(out.success(), "{out}");
    // ctr reports the task's exit status on delete: "exit with non-zero exit code 137"
    assert!(out.stderr.contains("exit code 137"), "{out}");
}
