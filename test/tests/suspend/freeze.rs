//! FROZEN: freeze and thaw, and a suspend from FROZEN.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::time::Duration;

use torpor_tests::*;

use crate::actor;

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn freeze_and_thaw() {
    torpor_only();
    let a = actor("susp-freeze", &[]);
    assert_eq!(a.inc(), 1);

    let st = a.op("freeze");
    assert_eq!(st["state"], "FROZEN", "{st}");
    assert_eq!(a.state(), "FROZEN");
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");

    // The kernel completes the handshake (listen backlog), but nobody answers.
    let mut held = connect_with_retry(&a.addr());
    held.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    held.write_all(b"get\n").unwrap();
    let mut reader = BufReader::new(held.try_clone().unwrap());
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a frozen counter answered: {other:?} {line:?}"),
    }

    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(a.state(), "RUNNING");
    // The request sent while frozen is answered after the thaw.
    held.set_read_timeout(Some(LIVENESS)).unwrap();
    line.clear();
    reader.read_line(&mut line).expect("the held request is answered after the thaw");
    assert_eq!(line.trim(), "1", "reply to the request sent while frozen");
    assert_eq!(a.inc(), 2, "value intact");

    // An exec into a frozen actor thaws it first.
    a.op("freeze");
    assert_eq!(a.state(), "FROZEN");
    let out = crictl(&["exec", "-s", &a.container, "/bin/sh", "-c", "echo thawed"]);
    assert!(out.success(), "exec into a frozen container: {out}");
    assert_eq!(out.stdout.trim(), "thawed", "{out}");
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(a.inc(), 3, "value intact");
}

/// FROZEN -> SUSPENDED (the freeze-first path of the design) while a client
/// has connected to the frozen actor: the connection sits in the listening
/// socket's accept queue. The suspend must still succeed.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn suspend_of_frozen_actor_with_pending_connection() {
    torpor_only();
    let a = actor("susp-pending", &[]);
    assert_eq!(a.inc(), 1);
    a.op("freeze");
    assert_eq!(a.state(), "FROZEN");
    // The kernel completes the handshake; the frozen process never accepts it.
    let held = connect_with_retry(&a.addr());

    let out = torporctl(&["suspend", a.shim()]);
    assert!(out.success(), "suspend of a FROZEN actor with a connection in its accept queue failed: {out}\n{}", a.diagnostics(&[]));
    assert_eq!(a.state(), "SUSPENDED");
    a.op("resume");
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(a.inc(), 2, "counter intact");
    held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = String::new();
    let fate = BufReader::new(held).read_line(&mut buf);
    eprintln!("the connection made while frozen, after the resume: {fate:?} {buf:?}");
}
