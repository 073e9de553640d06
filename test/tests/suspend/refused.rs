//! Operations refused: a suspend while an exec session runs, and
//! torporctl's errors (unknown actor, invalid name, wrong state).

use std::thread;

use torpor_tests::*;

use crate::{actor, assert_suspend_refused, container_processes};

fn kill_pids(pids: &[u32]) {
    for p in pids {
        let _ = run("kill", ["-KILL", &p.to_string()]);
    }
}

/// Kills the test's long exec session on drop (also when the test panics),
/// so the crictl thread never outlives the test.
struct ExecSession {
    container: String,
    needle: String,
}

impl Drop for ExecSession {
    fn drop(&mut self) {
        kill_pids(&container_processes(&self.container, &self.needle));
    }
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn failed_suspend_leaves_actor_running() {
    torpor_only();
    let a = actor("susp-refused", &[]);
    assert_eq!(a.inc(), 1);

    // A long exec session: the suspend must be refused while it runs.
    let needle = "sleep 2999";
    let session = ExecSession { container: a.container.clone(), needle: needle.into() };
    let cid = a.container.clone();
    let exec = thread::spawn(move || crictl(&["exec", &cid, "/bin/sh", "-c", needle]));
    wait_for("the exec session to run", LIVENESS, || (!container_processes(&a.container, needle).is_empty()).then_some(()));

    assert_suspend_refused(&a, "an exec session is running", "exec", &[]);
    assert_eq!(a.inc(), 2, "the counter still answers");

    // End the session; then the suspend goes through.
    drop(session);
    let out = exec.join().expect("exec thread");
    eprintln!("exec session ended: code {}", out.code);
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    assert!(st["last_error"].is_null(), "a successful suspend clears last_error: {st}");
    assert_eq!(a.state(), "SUSPENDED");
    a.op("resume");
    assert_eq!(a.inc(), 3);
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn torporctl_errors() {
    torpor_only();
    // unknown actor
    let missing = format!("{POD_NAMESPACE}/{}", unique_name("no-such-actor"));
    for op in ["status", "suspend", "resume", "freeze"] {
        let out = torporctl(&[op, &missing]);
        assert!(!out.success(), "{op} of an unknown actor must fail: {out}");
        assert!(out.stderr.contains(&missing), "the error names the actor: {out}");
    }
    // invalid name
    let out = torporctl(&["suspend", "a;b"]);
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("a;b") && !out.stderr.contains("panicked"), "a clear error for an invalid name: {out}");

    let a = actor("susp-errors", &[]);
    assert_eq!(a.inc(), 1);
    // by a 12-character prefix of the container id, as crictl shows it
    let short = &a.container[..12];
    let out = torporctl(&["resume", short]);
    assert!(!out.success(), "resume of a RUNNING actor must fail: {out}");
    assert!(
        out.stderr.contains("RUNNING") && out.stderr.contains("not SUSPENDED"),
        "the error says the actor is RUNNING, not SUSPENDED: {out}"
    );
    assert_eq!(a.state(), "RUNNING");

    a.op("suspend");
    let out = torporctl(&["suspend", short]);
    assert!(!out.success(), "a second suspend must fail: {out}");
    assert!(out.stderr.contains("SUSPENDED"), "the error says the actor is already SUSPENDED: {out}");
    let st = a.status();
    assert_eq!(st["state"], "SUSPENDED", "the refused suspend changed nothing: {st}");
    assert_eq!(st["generation"], 1, "{st}");

    a.op("resume");
    assert_eq!(a.inc(), 2);
}
