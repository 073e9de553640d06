//! What is done to a suspended actor from outside: an exec resumes it, a
//! stop and a removal end it, a kept connection wakes it.

use std::io::{BufRead, BufReader, Write};

use torpor_tests::*;

use crate::actor;

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn exec_into_suspended_resumes_first() {
    torpor_only();
    let a = actor("susp-exec", &[]);
    assert_eq!(a.inc(), 1);
    assert_eq!(a.inc(), 2);
    a.op("suspend");
    assert_eq!(a.state(), "SUSPENDED");

    let out = crictl(&["exec", &a.container, "/bin/sh", "-c", "echo hi"]);
    assert!(out.success(), "exec into a suspended container: {out}\n{}", a.diagnostics(&[]));
    assert_eq!(out.stdout.trim(), "hi", "{out}");
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "the exec resumed the actor: {st}");
    assert_eq!(a.inc(), 3, "counter intact");
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");

    // The same through ExecSync (`crictl exec -s`, what kubelet's exec probes use).
    a.op("suspend");
    assert_eq!(a.state(), "SUSPENDED");
    let out = crictl(&["exec", "-s", &a.container, "/bin/sh", "-c", "echo hi again"]);
    assert!(out.success(), "exec -s into a suspended container: {out}\n{}", a.diagnostics(&[]));
    assert_eq!(out.stdout.trim(), "hi again", "{out}");
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(a.inc(), 4, "counter intact");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn stop_and_remove_suspended() {
    torpor_only();
    let a = actor("susp-stop", &[]);
    assert_eq!(a.inc(), 1);
    a.op("suspend");
    assert_eq!(a.state(), "SUSPENDED");

    let sandbox = a.shim().to_string();
    let dir = Node::a().actor_dir(&sandbox);
    let sock = Node::a().control_socket(&sandbox);
    assert!(dir.join("actor.json").is_file(), "{} exists while the actor is suspended", dir.join("actor.json").display());
    assert!(sock.exists(), "{} exists while the pod runs", sock.display());

    let out = crictl(&["stop", "-t", "2", &a.container]);
    assert!(out.success(), "crictl stop of a suspended container: {out}\n{}", a.diagnostics(&[]));
    let (code, reason) = wait_exited(&a.container);
    assert!(code == 137 || code == 143, "exit code of a stopped suspended container: {code} ({reason})");
    crictl_ok(&["rm", &a.container]);
    let actor = default_actor(&a.pod.name);
    let _snapshots = Cleanup::snapshots(&actor);
    let Counter { pod, container, .. } = a;
    pod.remove();

    wait_for(&format!("{} to be removed", dir.display()), LIVENESS, || (!dir.exists()).then_some(()));
    // Retention: the removal of a SUSPENDED actor keeps its snapshot in
    // the store (restorable by identity later).
    let snaps = store_snapshots(&actor);
    assert_eq!(snaps.len(), 1, "the suspended actor's snapshot stays in the store: {snaps:?}");
    let mut shims = Vec::new();
    let gone = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the pod's shim to exit", LIVENESS, || {
            shims = processes_mentioning(&sandbox);
            shims.is_empty().then_some(())
        })
    }));
    assert!(gone.is_ok(), "processes left for pod {sandbox}:\n{}", shims.join("\n"));
    assert!(processes_mentioning(&container).is_empty(), "processes left for container {container}");
    wait_for(&format!("{} to be removed", sock.display()), LIVENESS, || (!sock.exists()).then_some(()));
}

/// An established TCP connection of an actor suspended and resumed in
/// place (same pod IP) survives: left idle across a suspend and a resume,
/// and used while the actor sleeps (the request wakes the actor and is
/// answered on the same connection, never reset). Once the actor runs, the
/// rules that kept the connection are gone from the pod's netns.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn established_connections_survive_suspend_and_wake_the_actor() {
    torpor_only();
    let a = actor("susp-conn", &[]);
    let s = connect_with_retry(&format!("{}:8080", a.ip));
    s.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut writer = s;
    let mut ask = |cmd: &str| -> String {
        writer.write_all(format!("{cmd}\n").as_bytes()).unwrap_or_else(|e| panic!("send {cmd} on the kept connection: {e}"));
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => panic!("the kept connection was closed (EOF) after {cmd}"),
            Ok(_) => line.trim().to_string(),
            Err(e) => panic!("the kept connection failed after {cmd}: {e}"),
        }
    };
    assert_eq!(ask("inc"), "1");

    // Idle across a suspend and a resume.
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(ask("inc"), "2", "the connection survived an idle suspend and resume");

    // Used while the actor sleeps: the request wakes it.
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.status()["state"], "SUSPENDED", "nothing woke the actor before the request");
    assert_eq!(ask("inc"), "3", "a request on the kept connection is answered by the woken actor");
    assert_eq!(a.status()["state"], "RUNNING");
    assert_eq!(a.pod.ip(), a.ip, "resumed in place");

    // The keeping rules are gone once it runs.
    let netns = a.pod.netns_path().expect("the pod's network namespace");
    let rules = || {
        let out = run("nsenter", [format!("--net={netns}"), "iptables".into(), "-w".into(), "-S".into()]);
        assert!(out.success(), "iptables -S in the pod's netns: {out}");
        out.stdout
    };
    wait_for("the kept connections' rules to go", LIVENESS, || (!rules().contains("TORPOR-SLEEPING")).then_some(()));
    assert_eq!(ask("get"), "3", "the connection still serves");

    // Suspended with the connection kept, then stopped: nothing of the
    // sleeping actor's stays in the pod's netns (kept connections, SYN drops).
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert!(rules().contains("TORPOR-SLEEPING"), "the connection is kept while suspended:\n{}", rules());
    crictl_ok(&["stop", "-t", "2", &a.container]);
    wait_exited(&a.container);
    wait_for("the sleeping actor's rules to go after its stop", LIVENESS, || {
        let r = rules();
        (!r.contains("TORPOR-SLEEPING") && !r.contains("TORPOR-WAKE") && !r.contains("--syn")).then_some(())
    });
}
