//! Actor suspend / resume / freeze through `torporctl`, against the rig.
//!
//! torpor-only: under TORPOR_TEST_RUNTIME=runc there is no actor to suspend
//! (each test is reported ignored), under the default `torpor` they must run.
//!
//! The torporctl binary is `$TORPOR_CTL`, else `<repo>/target/release/torporctl`
//! (`cargo build --release -p torporctl`; test/rig/run-tests.sh builds it).
//! The shims' control sockets are shared by every rig on the node
//! (`/run/torpor/shims`), so every rig's actors show up in `torporctl status`:
//! the tests name actors by their pod sandbox id (the shim id) or another
//! unique name, and pick their own out of a full listing by sandbox id.
//!
//! Beyond the basic list: a checkpoint that CRIU refuses part-way must roll
//! back (a container holding a deleted 4 MiB file: "Can't dump ghost file"),
//! also from FROZEN; two app containers are one actor and their output
//! continues with no line lost; FROZEN -> SUSPENDED with a connection waiting
//! in the frozen actor's accept queue; two containers connected by a unix
//! socket or a named pipe, or sharing memory, suspend and resume as one.
//!
//! One test binary, its tests by subject: [`state`] (what a suspend and
//! resume keep, and how the restore is done), [`rootfs`] (the writable
//! layer and the container's tmpfs mounts), [`while_suspended`] (exec,
//! stop and connections to a suspended actor), [`freeze`], [`refused`]
//! (refused operations, torporctl's errors), [`scale`] (many cycles, many
//! actors), [`rollback`] (a checkpoint that fails part-way),
//! [`faults`] (restores and saves that fail, altered dumps) and
//! [`multi_container`] (pods of several containers as one actor).

mod faults;
mod freeze;
mod multi_container;
mod refused;
mod rollback;
mod rootfs;
mod scale;
mod state;
mod while_suspended;

use torpor_tests::serde_json::Value;
use torpor_tests::*;

const MIB: u64 = 1024 * 1024;

// ------------------------------------------------------------------ helpers

/// A fresh pod with `/actor counter --port 8080 <extra>` (in the pod's pid
/// namespace), running and answering 0.
#[track_caller]
fn actor(prefix: &str, extra: &[&str]) -> Counter {
    let a = CounterSpec::new().in_the_pods_pid_namespace().extra_args(extra).start(Pod::run(prefix));
    assert_eq!(a.cmd("get"), "0", "fresh counter");
    a
}

/// Host pid of the container's init (`crictl inspect` .info.pid).
#[track_caller]
fn init_pid(container: &str) -> u32 {
    let v = inspect_container(container);
    let pid = v["info"]["pid"].as_u64().unwrap_or(0) as u32;
    assert!(pid > 0, "crictl inspect {container} has no pid: {}", v["info"]["pid"]);
    pid
}

/// Whether host pid `pid` is (still) a process of `container` that has not
/// been reaped.
fn pid_alive_in(pid: u32, container: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map(|c| c.contains(container)).unwrap_or(false)
}

/// Host pids of the processes in `container`'s cgroups whose command line
/// contains `needle`.
fn container_processes(container: &str, needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        if cmdline.contains(needle) && pid_alive_in(pid, container) {
            found.push(pid);
        }
    }
    found
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "panic".into())
}

/// `torporctl suspend` of `a` (`what`: why it must fail) is refused with
/// an error that contains `why`, and the actor stays RUNNING: its record
/// says so, with `why` in `last_error`, and its container and `others` (the
/// other containers of its pod) run on to CRI. Returns the refusal and the
/// actor's status, for the checks of the case.
#[track_caller]
fn assert_suspend_refused(a: &Counter, what: &str, why: &str, others: &[&str]) -> (Output, Value) {
    let out = a.node().torporctl(&["suspend", a.shim()]);
    assert!(!out.success(), "the suspend must be refused ({what}): {out}");
    assert!(out.stderr.contains(why), "the error says why ({what}: {why:?}): {out}");
    eprintln!("refused as it should be: {}", out.stderr.trim());
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "a refused suspend leaves the actor running: {st}\n{}", a.diagnostics(others));
    assert!(st["last_error"].as_str().unwrap_or_default().contains(why), "last_error says why ({why:?}): {st}");
    for c in std::iter::once(a.container.as_str()).chain(others.iter().copied()) {
        assert_eq!(a.node().container_state(c), "CONTAINER_RUNNING", "container {c} after the refused suspend");
    }
    (out, st)
}
