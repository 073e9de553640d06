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

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;
use torpor_tests::serde_json::{self, Value};
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

/// The memory cgroup directory of a host pid (cgroup v1 memory hierarchy,
/// or the unified hierarchy), and the name of its usage file.
fn memory_cgroup(pid: u32) -> Option<(PathBuf, &'static str)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        if ctrls.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            return Some((dir, "memory.usage_in_bytes"));
        }
    }
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some((Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')), "memory.current"))
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
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

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "panic".into())
}

// -------------------------------------------------------------------- tests

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn suspend_resume_keeps_state() {
    torpor_only();
    let a = actor("susp-state", &["--alloc-mib", "64"]);
    assert_eq!(a.inc(), 1);
    assert_eq!(a.inc(), 2);
    let sum = a.cmd("sum");
    assert!(sum.len() == 8 && sum != "00000000", "checksum of the 64 MiB allocation: {sum:?}");

    let pid = init_pid(&a.container);
    let (cg, usage_file) = memory_cgroup(pid).unwrap_or_else(|| panic!("no memory cgroup for pid {pid} of {}", a.container));
    assert!(cg.to_string_lossy().contains(&a.container), "memory cgroup {} of pid {pid} is the container's", cg.display());
    let before = read_u64(&cg.join(usage_file)).unwrap_or_else(|| panic!("cannot read {}", cg.join(usage_file).display()));
    assert!(before >= 48 * MIB, "the counter's memory cgroup holds its 64 MiB allocation before the suspend: {before} bytes");

    // By the default actor id, <pod namespace>/<pod name>.
    let name = a.actor.clone();
    let st = Node::a().actor_status(&name, a.shim());
    assert_eq!(st["actor"].as_str(), Some(name.as_str()), "{st}");
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert!(
        st["containers"].as_array().is_some_and(|c| c.iter().any(|c| c == &a.container)),
        "the actor is made of the counter container: {st}"
    );

    let out = torporctl(&["--json", "suspend", &name]);
    assert!(out.success(), "suspend by actor id failed: {out}\n{}", a.diagnostics(&[]));
    let st = a.status();
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    assert!(st["generation"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert!(st["last_error"].is_null(), "{st}");

    // To CRI nothing happened.
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    assert_eq!(a.pod.state(), "SANDBOX_READY");

    // The process is gone (and reaped), and its memory is freed.
    let what = format!("pid {pid} of the suspended container to be gone");
    wait_for(&what, LIVENESS, || (!pid_alive_in(pid, &a.container)).then_some(()));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(!(status.contains("State:\tZ") && status.contains(&format!("Pid:\t{pid}\n"))), "pid {pid} is a zombie after the suspend");
    let usage = cg.join(usage_file);
    let freed = wait_for("the container's memory to be freed", LIVENESS, || match read_u64(&usage) {
        None if !cg.exists() => Some("cgroup removed".to_string()),
        Some(u) if u < 16 * MIB => Some(format!("{u} bytes charged")),
        _ => None,
    });
    eprintln!("after suspend: {freed} (was {before} bytes)");

    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(a.inc(), 3, "the counter came back with its value");
    assert_eq!(a.cmd("sum"), sum, "the 64 MiB came back intact");
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    assert_eq!(a.pod.ip(), a.ip, "same pod IP after the resume");

    // The restored process lives in the container's cgroup again, with its memory.
    let pids = container_processes(&a.container, "/actor counter");
    assert_eq!(pids.len(), 1, "one restored counter process in the container: {pids:?}");
    let (cg2, _) = memory_cgroup(pids[0]).expect("memory cgroup of the restored process");
    assert_eq!(cg2, cg, "the restored process is in the container's memory cgroup");
    let after = read_u64(&cg2.join(usage_file)).unwrap_or(0);
    assert!(after >= 48 * MIB, "the 64 MiB are charged to the container's memory cgroup again: {after} bytes");

    // The restored process gets the stop signal and its exit is reported.
    crictl_ok(&["stop", "-t", "60", &a.container]);
    let (code, reason) = wait_exited(&a.container);
    assert_eq!(code, 0, "the restored counter exits 0 on SIGTERM ({reason})");
    let log = std::fs::read_to_string(a.pod.log_dir.join("counter.log")).unwrap_or_default();
    assert!(log.contains("got terminated, exiting"), "container log:\n{log}");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn rootfs_changes_survive_suspend() {
    torpor_only();
    let a = actor("susp-rootfs", &[]);
    assert_eq!(a.inc(), 1);
    let token = unique_name("written-before-suspend");
    let out = crictl(&[
        "exec",
        "-s",
        &a.container,
        "/bin/sh",
        "-c",
        &format!("mkdir -p /data && echo {token} > /data/marker && cat /data/marker"),
    ]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), token);

    a.op("suspend");
    assert_eq!(a.state(), "SUSPENDED");
    a.op("resume");
    assert_eq!(a.state(), "RUNNING");

    let out = crictl(&["exec", "-s", &a.container, "/bin/cat", "/data/marker"]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), token, "the file written before the suspend");
    assert_eq!(a.inc(), 2);
}

/// The container's limits, as the cgroup v1 files of its init say.
fn cgroup_limits(pid: u32) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut out = Vec::new();
    for (ctrl, file) in [("memory", "memory.limit_in_bytes"), ("cpu", "cpu.shares"), ("cpu", "cpu.cfs_quota_us"), ("pids", "pids.max")] {
        let dir = text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls.split(',').any(|c| c == ctrl).then(|| path.to_string())
        });
        let Some(dir) = dir else { continue };
        let mount = if ctrl == "cpu" && Path::new("/sys/fs/cgroup/cpu,cpuacct").exists() { "cpu,cpuacct" } else { ctrl };
        let v = std::fs::read_to_string(format!("/sys/fs/cgroup/{mount}{dir}/{file}")).unwrap_or_default();
        out.push((file.to_string(), v.trim().to_string()));
    }
    out
}

/// What runc says of the container (`runc state`, the shim's runc root).
fn runc_state(container: &str) -> Value {
    let out = std::process::Command::new("runc")
        .args(["--root", "/run/torpor/runc/k8s.io", "state", container])
        .output()
        .expect("run runc state");
    assert!(out.status.success(), "runc state {container}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("runc state's JSON")
}

/// A resume is driven over CRIU's RPC by the shim, from the template its
/// suspend took (root's alone), and leaves what runc's restore would: runc's
/// own state names the restored init as running, the container's cgroup
/// limits are back, exec works, and the next cycle too. A garbled template
/// is not used: runc restores.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_restore_without_runc_leaves_runcs_state_and_the_limits() {
    use std::os::unix::fs::PermissionsExt;
    torpor_only();
    let limits = serde_json::json!({"memory_limit_in_bytes": 512 * MIB, "cpu_shares": 256, "cpu_period": 100000, "cpu_quota": 50000});
    let a = CounterSpec::new().in_the_pods_pid_namespace().resources(limits).start(Pod::run("susp-direct"));
    assert_eq!(a.inc(), 1);
    let before = cgroup_limits(init_pid(&a.container));
    assert!(before.contains(&("memory.limit_in_bytes".into(), (512 * MIB).to_string())), "{before:?}");
    let bundle = PathBuf::from(format!("{}/io.containerd.runtime.v2.task/k8s.io/{}", a.pod.node.rig.containerd_state, a.container));
    let template = bundle.join("torpor-restore-template.json");
    let restores = |by: &str| {
        a.pod
            .node
            .log_about(&[&a.container], 400)
            .lines()
            .filter(|l| l.contains("container restored") && l.contains(&format!("criu_driven_by=\"{by}\"")))
            .count()
    };

    a.op("suspend");
    assert_eq!(a.state(), "SUSPENDED");
    let mode = std::fs::metadata(&template).expect("the restore template").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "template mode {mode:o}");
    a.op("resume");
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(restores("shim"), 1, "{}", a.pod.node.log_about(&[&a.container], 40));
    assert_eq!(a.inc(), 2);
    // The restored init (containerd's info keeps the first pid).
    let counter = || {
        let pids = container_processes(&a.container, "counter --port");
        assert_eq!(pids.len(), 1, "one counter process in the container: {pids:?}");
        pids[0]
    };
    let st = runc_state(&a.container);
    assert_eq!(st["status"], "running", "{st}");
    assert_eq!(st["pid"].as_u64(), Some(u64::from(counter())), "{st}");
    assert_eq!(cgroup_limits(counter()), before);
    let out = crictl(&["exec", "-s", &a.container, "/bin/sh", "-c", "echo exec-ok"]);
    assert!(out.success() && out.stdout.trim() == "exec-ok", "{out}");

    a.op("suspend");
    std::fs::write(&template, "{garbled").expect("garble the template");
    a.op("resume");
    assert_eq!(a.state(), "RUNNING");
    assert_eq!(restores("runc"), 1, "{}", a.pod.node.log_about(&[&a.container], 40));
    assert_eq!(a.inc(), 3);
    assert_eq!(runc_state(&a.container)["pid"].as_u64(), Some(u64::from(counter())));
    assert_eq!(cgroup_limits(counter()), before);
}

/// The container's own tmpfs mounts (runc's `/dev`, the cgroup v1
/// `/sys/fs/cgroup`), which the suspend carries instead of CRIU, come back
/// with their files, device nodes, options and the mounts below them; the
/// shim's copies are gone from the node once the restore is done.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn the_containers_tmpfs_mounts_come_back() {
    torpor_only();
    let a = actor("susp-tmpfs", &[]);
    assert_eq!(a.inc(), 1);
    let token = unique_name("in-dev");
    let mounts_of = |a: &Counter| {
        let out = crictl(&[
            "exec",
            "-s",
            &a.container,
            "/bin/sh",
            "-c",
            "grep -E ' /dev | /sys/fs/cgroup | /dev/pts ' /proc/self/mountinfo | cut -d' ' -f5,6,9-",
        ]);
        assert!(out.success(), "{out}");
        out.stdout
    };
    let before = mounts_of(&a);
    assert!(before.contains("/dev ") && before.contains(" tmpfs "), "{before}");
    let out = crictl(&["exec", "-s", &a.container, "/bin/sh", "-c", &format!("echo {token} > /dev/torpor-marker")]);
    assert!(out.success(), "{out}");

    a.op("suspend");
    assert_eq!(a.state(), "SUSPENDED");
    a.op("resume");
    assert_eq!(a.state(), "RUNNING");

    assert_eq!(mounts_of(&a), before, "the same mounts, flags and tmpfs options");
    let check = "cat /dev/torpor-marker && test -c /dev/null && echo x > /dev/null && test -c /dev/urandom \
        && test -L /dev/fd && test -d /dev/pts && ls /sys/fs/cgroup";
    let out = crictl(&["exec", "-s", &a.container, "/bin/sh", "-c", check]);
    assert!(out.success(), "{out}\n{}", a.diagnostics(&[]));
    assert_eq!(out.stdout.lines().next(), Some(token.as_str()), "{out}");
    assert!(out.stdout.lines().count() > 1, "/sys/fs/cgroup is not empty: {out}");
    // This container's (other tests' restores may hold theirs right now),
    // detached in the background once CRIU has bound them.
    let ours = |l: &&str| l.contains(&format!("{}.restore/tmpfs-", a.container)) || l.contains(&format!("{}.lazy/tmpfs-", a.container));
    wait_for("the tmpfs mounts handed to CRIU to be detached from the node", LIVENESS, || {
        let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        (!host.lines().any(|l| ours(&l))).then_some(())
    });
    assert_eq!(a.inc(), 2);
}

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

    let out = torporctl(&["suspend", a.shim()]);
    assert!(!out.success(), "suspend with an exec session running must fail: {out}");
    assert!(out.stderr.contains("exec"), "the error says why (an exec session is running): {out}");
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "{st}");
    let err = st["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("exec"), "last_error says why: {st}");
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
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

/// `sh -c <script>` in `container`, which must succeed; its stdout.
#[track_caller]
fn sh(container: &str, script: &str) -> String {
    let out = crictl(&["exec", "-s", container, "/bin/sh", "-c", script]);
    assert!(out.success(), "{script}: {out}");
    out.stdout.trim().to_string()
}

const TIB: u64 = 1 << 40;

/// `truncate -s 4T` in a container, then a suspend: the rootfs capture
/// archives the file's data only (before, it wrote its 4 TiB apparent
/// size: the node's disk filled and the suspend never ended). A new pod of
/// the actor gets the file back, same size, same data, still sparse.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_4tib_sparse_file_suspends_and_comes_back_sparse_in_a_new_pod() {
    torpor_only();
    let actor = format!("{POD_NAMESPACE}/{}", unique_name("sparse"));
    let _g = Cleanup::snapshots(&actor);
    let first = CounterSpec::new().start(Pod::run_with("susp-sparse-a", PodOptions::actor(&actor)));
    assert_eq!(first.inc(), 1);
    sh(&first.container, "printf head > /sparse && truncate -s 4398046511104 /sparse && printf tail >> /sparse");
    let size = 4 * TIB + 4;
    let name = first.suspend();
    let st = first.status();
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    let Counter { pod, .. } = first;
    pod.remove();

    // A new pod of the actor: restored from the snapshot, the diff applied.
    let second = CounterSpec::new().start(Pod::run_with("susp-sparse-b", PodOptions::actor(&actor)));
    assert_eq!(second.cmd("get"), "1", "the counter continues from the snapshot");
    assert_eq!(second.status()["recovered_from"], name.as_str());
    let stat = sh(&second.container, "stat -c '%s %b %B' /sparse");
    let f: Vec<u64> = stat.split(' ').map(|n| n.parse().unwrap_or_else(|e| panic!("stat: {stat:?}: {e}"))).collect();
    assert_eq!(f[0], size, "the apparent size came back: {stat}");
    assert!(f[1] * f[2] < 1 << 20, "the file came back sparse, not as 4 TiB of zeros: {stat}");
    assert_eq!(sh(&second.container, "head -c 4 /sparse; tail -c 4 /sparse"), "headtail");
    assert_eq!(second.inc(), 2);
}

/// The rootfs capture cap the rig gives the shims (test/rig/up.sh), from
/// the rig containerd's environment (which its shims inherit).
fn rig_capture_cap() -> Option<u64> {
    let pid = std::fs::read_to_string(std::env::var("TORPOR_RIG_PIDFILE").ok()?).ok()?;
    let environ = std::fs::read(format!("/proc/{}/environ", pid.trim())).ok()?;
    let v = environ.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(b"TORPOR_ROOTFS_CAPTURE_MAX_BYTES=".as_slice()))?;
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A file in the writable layer over the capture's byte cap: the suspend
/// is refused naming the file and the cap, the partial archive is gone,
/// and the actor runs on; without the file it suspends.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_rootfs_over_the_capture_cap_refuses_the_suspend_and_the_actor_runs_on() {
    torpor_only();
    let Some(cap) = rig_capture_cap() else {
        eprintln!("skipped: the rig's containerd has no TORPOR_ROOTFS_CAPTURE_MAX_BYTES (test/rig/up.sh sets it)");
        return;
    };
    assert!(cap <= 1 << 30, "the rig's cap is small enough to go past in a test: {cap}");
    let a = actor("susp-rootfs-cap", &[]);
    assert_eq!(a.inc(), 1);
    sh(&a.container, &format!("mkdir -p /var/big && head -c {} /dev/zero > /var/big/file", cap + MIB));
    let out = torporctl(&["suspend", a.shim()]);
    assert!(!out.success(), "a suspend over the capture cap must be refused: {out}");
    assert!(
        out.stderr.contains("/var/big/file") && out.stderr.contains(&format!("cap of {cap} bytes")),
        "the refusal names the file and the cap: {out}"
    );
    eprintln!("refused as it should be: {}", out.stderr.trim());
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "a refused suspend leaves the actor running: {st}");
    assert!(st["last_error"].as_str().unwrap_or_default().contains("/var/big/file"), "last_error says why: {st}");
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    assert_eq!(a.inc(), 2, "the counter still answers");
    assert_eq!(sh(&a.container, "stat -c %s /var/big/file"), (cap + MIB).to_string(), "its files are untouched");

    sh(&a.container, "rm /var/big/file");
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    a.op("resume");
    assert_eq!(a.inc(), 3);
}

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

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn soak_200_cycles() {
    torpor_only();
    const CYCLES: u64 = 200;
    let a = actor("susp-soak", &[]);
    let mut value = a.inc();
    assert_eq!(value, 1);
    for cycle in 1..=CYCLES {
        let st = a.op("suspend");
        assert_eq!(st["state"], "SUSPENDED", "cycle {cycle}: {st}");
        let st = a.op("resume");
        assert_eq!(st["state"], "RUNNING", "cycle {cycle}: {st}");
        let got = a.inc();
        assert_eq!(got, value + 1, "cycle {cycle}: counter after the resume");
        value = got;
        if cycle % 50 == 0 {
            eprintln!("soak: {cycle} cycles, last suspend {} ms, resume {} ms", st["last_suspend_ms"], st["last_resume_ms"]);
        }
    }
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    let Counter { pod, .. } = a;
    pod.remove();
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn twenty_actors_concurrently() {
    torpor_only();
    const N: usize = 20;
    require_rig();

    // Run them all at once; failures are collected so every guard cleans up.
    let started: Arc<Mutex<Vec<Result<Counter, String>>>> = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let started = Arc::clone(&started);
            thread::spawn(move || {
                let r = std::panic::catch_unwind(|| {
                    let a = actor(&format!("susp-many{i}"), &[]);
                    assert_eq!(a.inc(), 1);
                    a
                });
                started.lock().unwrap().push(r.map_err(panic_text));
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let mut actors = Vec::new();
    let mut errors = Vec::new();
    for r in std::mem::take(&mut *started.lock().unwrap()) {
        match r {
            Ok(a) => actors.push(Arc::new(a)),
            Err(e) => errors.push(e),
        }
    }
    assert!(errors.is_empty(), "{} of {N} actors did not start:\n{}", errors.len(), errors.join("\n---\n"));

    // Apply `op` to all at once; returns the failures.
    let all = |op: &'static str, want: &'static str| -> Vec<String> {
        let handles: Vec<_> = actors
            .iter()
            .map(|a| {
                let a = Arc::clone(a);
                thread::spawn(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let st = a.op(op);
                        assert_eq!(st["state"], want, "{op} {}: {st}", a.shim());
                    }))
                    .map_err(|e| format!("{}: {}", a.pod.name, panic_text(e)))
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().expect("thread").err()).collect()
    };

    let failed = all("suspend", "SUSPENDED");
    assert!(failed.is_empty(), "concurrent suspends failed:\n{}", failed.join("\n---\n"));

    // all SUSPENDED at the same time (one status of every actor on the node)
    let out = torporctl(&["--json", "status"]);
    let v: Value = serde_json::from_str(&out.clone().ok()).expect("status JSON");
    let ours: BTreeSet<&str> = actors.iter().map(|a| a.shim()).collect();
    let mut seen = BTreeSet::new();
    for r in v.as_array().expect("array") {
        let shim = r["shim"].as_str().unwrap_or_default();
        if ours.contains(shim) {
            assert_eq!(r["actor"]["state"], "SUSPENDED", "{r}");
            seen.insert(shim);
        }
    }
    assert_eq!(seen, ours, "every actor is listed by `torporctl status`");
    for a in &actors {
        assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    }

    let failed = all("resume", "RUNNING");
    assert!(failed.is_empty(), "concurrent resumes failed:\n{}", failed.join("\n---\n"));
    for a in &actors {
        assert_eq!(a.inc(), 2, "counter of {} after the resume", a.pod.name);
    }

    // remove all, concurrently
    let handles: Vec<_> = actors
        .into_iter()
        .map(|a| {
            thread::spawn(move || {
                let a = Arc::try_unwrap(a).unwrap_or_else(|_| panic!("actor still shared"));
                let name = a.pod.name.clone();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || a.pod.remove()))
                    .map_err(|e| format!("{name}: {}", panic_text(e)))
            })
        })
        .collect();
    let failed: Vec<String> = handles.into_iter().filter_map(|h| h.join().expect("thread").err()).collect();
    assert!(failed.is_empty(), "removal failed:\n{}", failed.join("\n---\n"));
}

// ------------------------------------------- beyond the basic list: rollback

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

/// The cgroup-v1 freezer state (THAWED / FROZEN / FREEZING) of a host pid's
/// cgroup, or on cgroup v2 "FROZEN"/"THAWED" from cgroup.freeze.
fn freezer_state(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        if ctrls.split(',').any(|c| c == "freezer") {
            let p = Path::new("/sys/fs/cgroup/freezer").join(path.trim_start_matches('/')).join("freezer.state");
            return std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
        }
    }
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let p = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')).join("cgroup.freeze");
    let v = std::fs::read_to_string(p).ok()?;
    Some(if v.trim() == "1" { "FROZEN" } else { "THAWED" }.to_string())
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

    let out = torporctl(&["suspend", a.shim()]);
    assert!(!out.success(), "the suspend must fail (CRIU cannot dump the ghost file): {out}");
    assert!(out.stderr.contains("ghost file"), "the error quotes CRIU's reason: {out}");
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "{st}\n{}", a.diagnostics(&[&ghost]));
    assert_eq!(st["generation"], 0, "a failed suspend does not count: {st}");
    assert!(st["last_error"].as_str().is_some_and(|e| e.contains("ghost file")), "last_error says why: {st}");
    for c in [&counter, &ghost] {
        assert_eq!(container_state(c), "CONTAINER_RUNNING", "{c}");
    }
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
    // see suspend_of_frozen_actor_with_pending_connection)
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

/// All app containers of the pod are one actor: both suspend and come back,
/// and the output of a container continues after the resume with no line lost.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn two_containers_suspend_as_one() {
    torpor_only();
    let a = actor("susp-two", &[]);
    let logs = a.pod.start_actor("logs", &["logs", "--lines", "0", "--interval-ms", "50"]);
    wait_container_state(&logs, "CONTAINER_RUNNING");
    let log_file = a.pod.log_dir.join("logs.log");
    let line_numbers = || -> Vec<u64> {
        let text = std::fs::read_to_string(&log_file).unwrap_or_default();
        text.lines().filter_map(|l| l.split(" line ").nth(1)).filter_map(|rest| rest.split_whitespace().next()?.parse().ok()).collect()
    };
    wait_for("the logs container to print", LIVENESS, || (line_numbers().len() >= 5).then_some(()));
    assert_eq!(a.inc(), 1);

    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    let members: BTreeSet<&str> = st["containers"].as_array().map(|c| c.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    assert_eq!(members, BTreeSet::from([a.container.as_str(), logs.as_str()]), "the actor is both app containers (not the sandbox): {st}");
    for c in [&a.container, &logs] {
        assert_eq!(container_state(c), "CONTAINER_RUNNING", "{c}");
        assert!(container_processes(c, "/actor").is_empty(), "no process of {c} while suspended");
    }
    let printed = line_numbers().len();

    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(a.inc(), 2, "counter intact");
    wait_for("the logs container to print again after the resume", LIVENESS, || (line_numbers().len() >= printed + 5).then_some(()));

    // Stop it (its output drains) and check no line went missing or twice.
    crictl_ok(&["stop", "-t", "60", &logs]);
    let (code, reason) = wait_exited(&logs);
    assert_eq!(code, 0, "the restored logs process exits 0 on SIGTERM ({reason})");
    let mut nums = line_numbers();
    nums.sort();
    let n = nums.len() as u64;
    let expected: Vec<u64> = (1..=n).collect();
    assert_eq!(nums, expected, "lines 1..{n} each exactly once in the container log across suspend/resume");
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

/// A pod of two containers sharing a host directory at `/shared`: a
/// sidecar `/actor <side_args>` (started first) and the app, a counter
/// with `<app_args>`, in the pod's pid namespace. The app and the sidecar's
/// container id.
#[track_caller]
fn app_and_sidecar(prefix: &str, side_args: &[&str], app_args: &[&str]) -> (Counter, String) {
    let pod = Pod::run(prefix);
    let shared = pod.dir().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let shared = shared.to_string_lossy().into_owned();
    let mut side = container_config("side", side_args);
    side["mounts"] = serde_json::json!([{ "host_path": shared, "container_path": "/shared" }]);
    let side = pod.start_config(&side);
    wait_container_state(&side, "CONTAINER_RUNNING");
    let a = CounterSpec::new().in_the_pods_pid_namespace().extra_args(app_args).mount(&shared, "/shared").start(pod);
    (a, side)
}

/// Suspend (no process of the app or its sidecar left) and resume of the
/// pod of `a`, the `cycle`th time.
#[track_caller]
fn suspend_and_resume_both(a: &Counter, side: &str, cycle: u64) {
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "cycle {cycle}: {st}");
    for c in [a.container.as_str(), side] {
        assert!(container_processes(c, "/actor").is_empty(), "cycle {cycle}: no process of {c} while suspended");
    }
    let st = a.op("resume");
    assert_eq!(st["state"], "RUNNING", "cycle {cycle}: {st}");
}

/// An app and its sidecar in one pod, connected by a unix stream socket on a
/// shared volume and held open for the pod's life: the pod suspends and
/// resumes as one unit, twice, and the connection works after each resume
/// with both sides' state. While bytes are in flight on it the suspend is
/// refused and the pod keeps running. After the resume the shim holds no
/// end any more: the sidecar's stop closes the app's connection.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_unix_connection_between_two_containers_survives_suspend() {
    torpor_only();
    let (a, side) = app_and_sidecar("susp-unix", &["peer", "--listen", "/shared/peer.sock"], &["--peer", "/shared/peer.sock"]);
    assert_eq!(a.cmd("peer"), "pong 1");
    assert_eq!(a.inc(), 1);

    for cycle in 1..=2u64 {
        suspend_and_resume_both(&a, &side, cycle);
        assert_eq!(a.cmd("peer"), format!("pong {}", cycle + 1), "cycle {cycle}: the same connection, the sidecar's count intact");
        assert_eq!(a.inc(), cycle + 1, "cycle {cycle}: the app's count intact");
    }

    // An answer left unread: the suspend is refused, nothing is lost.
    assert_eq!(a.cmd("peer send"), "sent, 7 bytes queued", "the answer (pong 4) waits unread");
    let out = a.node().torporctl(&["--json", "suspend", a.shim()]);
    assert!(!out.success() && out.to_string().contains("in flight on the unix connection"), "{out}");
    let st = a.status();
    assert_eq!(st["state"], "RUNNING", "a refused suspend leaves the pod running: {st}");
    assert_eq!(a.cmd("peer read"), "pong 4", "the queued answer is still there");
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(a.cmd("peer"), "pong 5");

    // The sidecar goes: the app sees its connection end (no end left in the shim).
    crictl_ok(&["stop", "-t", "10", &side]);
    let answer = a.cmd("peer");
    assert!(
        answer.starts_with("ERR") && (answer.contains("EOF") || answer.contains("broken pipe")),
        "the app sees the sidecar's end close (not a timeout, as with an end still held): {answer}"
    );
}

/// Two containers of one pod share memory: a page of a file in the pod's
/// `/dev/shm` (the sandbox's, which CRI mounts into every container of the
/// pod), mapped `MAP_SHARED` by both. After each suspend and resume they
/// still share it, and what either wrote is kept.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn memory_two_containers_share_stays_shared() {
    torpor_only();
    const SHM: &str = "/dev/shm/torpor-test-shared";
    let pod = Pod::run("susp-shm");
    let side = pod.start_actor("side", &["counter", "--port", "8081", "--shared-mem", SHM]);
    wait_container_state(&side, "CONTAINER_RUNNING");
    let a = CounterSpec::new().in_the_pods_pid_namespace().extra_args(&["--shared-mem", SHM]).start(pod);
    let side_addr = format!("{}:8081", a.ip);
    assert_eq!(counter_cmd(&side_addr, "shared"), "1");
    assert_eq!(a.cmd("shared"), "2", "the app sees the sidecar's write");
    assert_eq!(a.inc(), 1);

    for cycle in 1..=2u64 {
        suspend_and_resume_both(&a, &side, cycle);
        assert_eq!(a.cmd("shared"), (2 * cycle + 1).to_string(), "cycle {cycle}: the shared value kept");
        assert_eq!(
            counter_cmd(&side_addr, "shared"),
            (2 * cycle + 2).to_string(),
            "cycle {cycle}: the sidecar maps the same memory as the app (not a copy of its own)"
        );
        assert_eq!(a.inc(), cycle + 1, "cycle {cycle}: the app's private count intact");
    }
}

/// Two containers of one pod connected by a named pipe on a volume they
/// share (a sidecar writes, the app reads), held open for their lives.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_fifo_between_two_containers_survives_suspend() {
    torpor_only();
    let (a, side) =
        app_and_sidecar("susp-fifo", &["counter", "--port", "8081", "--fifo-write", "/shared/pipe"], &["--fifo-read", "/shared/pipe"]);
    let side_addr = format!("{}:8081", a.ip);
    assert_eq!(counter_cmd(&side_addr, "fifo send"), "sent 1");
    assert_eq!(a.cmd("fifo read"), "msg 1");

    for cycle in 1..=2u64 {
        suspend_and_resume_both(&a, &side, cycle);
        assert_eq!(counter_cmd(&side_addr, "fifo send"), format!("sent {}", cycle + 1), "cycle {cycle}");
        assert_eq!(a.cmd("fifo read"), format!("msg {}", cycle + 1), "cycle {cycle}: the same pipe joins the two");
    }

    // A line left unread in the pipe comes back once, neither lost nor
    // written again by the writer's restore.
    assert_eq!(counter_cmd(&side_addr, "fifo send"), "sent 4");
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(a.cmd("fifo read"), "msg 4", "the line in the pipe at the suspend");
    let next = a.cmd("fifo read");
    assert!(next.starts_with("ERR") && next.contains("timeout"), "nothing more in the pipe: {next}");
    assert_eq!(counter_cmd(&side_addr, "fifo send"), "sent 5");
    assert_eq!(a.cmd("fifo read"), "msg 5");
}

/// The resume's CRIU finds the kernel cache that the node daemon warmed at
/// its start (`/run/criu.kdat`, made in a private `/run` where the host's
/// is not a tmpfs): the restore does not probe the kernel again.
/// One number of `crictl stats -o json` (proto JSON writes uint64 as a string).
fn stat_number(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_else(|| panic!("not a number: {v}"))
}

/// CRI's stats of the container (`crictl stats`: its working set, CPU time).
fn cri_stats(container: &str) -> (u64, u64) {
    let v = crictl_json(&["stats", "-o", "json", container]);
    let s = &v["stats"][0];
    assert_eq!(s["attributes"]["id"], container, "{v}");
    (stat_number(&s["memory"]["workingSetBytes"]["value"]), stat_number(&s["cpu"]["usageCoreNanoSeconds"]["value"]))
}

/// The shim reads a container's stats from its cgroup (no `runc events`
/// per request: containerd's CRI asks for every running container's stats
/// once a second): what CRI reports is the cgroup's working set and CPU
/// time; a suspended actor's container reports zero; a resumed one its
/// cgroup's again.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn stats_are_the_containers_cgroup_and_zero_while_suspended() {
    torpor_only();
    let c = CounterSpec::new().alloc_mib(64).start(Pod::run("susp-stats"));
    assert_eq!(c.inc(), 1);
    let check_running = |what: &str| {
        let pid = c.processes().first().map(|(pid, _)| *pid).unwrap_or_else(|| panic!("{what}: no counter process"));
        let (dir, usage_file) = memory_cgroup(pid).unwrap_or_else(|| panic!("{what}: no memory cgroup of pid {pid}"));
        let (ws, cpu) = wait_for(&format!("CRI stats {what} to hold the 64 MiB"), LIVENESS, || {
            let (ws, cpu) = cri_stats(&c.container);
            (ws >= 64 * MIB).then_some((ws, cpu))
        });
        let usage = read_u64(&dir.join(usage_file)).expect("the cgroup's memory usage");
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let inactive = stat.lines().find_map(|l| l.strip_prefix("total_inactive_file ")).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        let cgroup_ws = usage.saturating_sub(inactive);
        assert!(ws.abs_diff(cgroup_ws) < 16 * MIB, "{what}: CRI's working set {ws} is the cgroup's ({usage} - {inactive})");
        assert!(cpu > 0, "{what}: CPU time {cpu}");
    };
    check_running("while it runs");

    c.suspend();
    let (ws, cpu) = wait_for("CRI stats of the suspended container to be zero", LIVENESS, || {
        let (ws, cpu) = cri_stats(&c.container);
        (ws == 0).then_some((ws, cpu))
    });
    assert_eq!((ws, cpu), (0, 0), "nothing runs, nothing is held");

    assert_eq!(c.inc(), 2, "resumed by a request");
    check_running("after the resume");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_resume_uses_the_warm_criu_kernel_cache() {
    torpor_only();
    let a = actor("susp-kdat", &[]);
    assert_eq!(a.inc(), 1);
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(a.inc(), 2);
    // The resume's CRIU logs stay in the work directory until the next suspend.
    let logs: Vec<PathBuf> = files_below(&Node::a().actor_dir(a.shim()).join("work"))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "restore.log"))
        .collect();
    assert!(!logs.is_empty(), "no CRIU restore log of the resume");
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let head: Vec<&str> = text.lines().take(12).collect();
        assert!(
            text.contains("Loaded kdat cache from /run/criu.kdat"),
            "{log:?}: CRIU probed the kernel instead of loading the warm cache:\n{}",
            head.join("\n")
        );
    }
}

/// A resume from the local tier answers while its lazy-pages daemon waits
/// (TORPOR_LAZY_PREFETCH_DELAY_MS, CRIU with torpor's patch) before copying
/// the memory no fault asked for (its command line first); that copy then
/// brings every page: the memory is charged to the container again, and
/// intact, without the process touching it.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn the_deferred_prefetch_brings_every_page() {
    torpor_only();
    let a = actor("susp-prefetch", &["--alloc-mib", "64"]);
    assert_eq!(a.inc(), 1);
    let sum = a.cmd("sum");
    assert_eq!(a.op("suspend")["state"], "SUSPENDED");
    assert_eq!(a.op("resume")["state"], "RUNNING");
    assert_eq!(a.inc(), 2, "answered by the resumed actor");
    // Its command line reads from outside it at once (the daemon copies
    // those pages first).
    assert_eq!(container_processes(&a.container, "/actor counter").len(), 1, "the resumed counter by its command line");

    let work = Node::a().actor_dir(a.shim()).join("work");
    let daemons = || processes_mentioning(&work.to_string_lossy()).into_iter().filter(|p| p.contains("lazy-pages")).count();
    wait_for("the lazy-pages daemon to finish", LIVENESS, || (daemons() == 0).then_some(()));
    let logs: Vec<PathBuf> = files_below(&work).into_iter().filter(|p| p.file_name().is_some_and(|n| n == "lazy-pages.log")).collect();
    assert_eq!(logs.len(), 1, "one lazy-pages log of the resume: {logs:?}");
    let log = std::fs::read_to_string(&logs[0]).unwrap_or_default();
    let delayed = log
        .lines()
        .find(|l| l.contains("Background transfer in "))
        .unwrap_or_else(|| panic!("{:?}: the daemon did not delay its background transfer:\n{log}", logs[0]));
    assert!(delayed.contains("Background transfer in 1000 ms"), "the shim's default delay: {delayed}");
    let (started, ended) = (log.find("Background transfer starts"), log.rfind("Background transfer starts"));
    assert!(started.is_some() && started == ended, "{:?}: the background transfer starts once:\n{log}", logs[0]);

    // The copy brought the 64 MiB in without the process touching them.
    let pids = container_processes(&a.container, "/actor counter");
    assert_eq!(pids.len(), 1, "one restored counter process: {pids:?}");
    let (cg, usage_file) = memory_cgroup(pids[0]).expect("memory cgroup of the restored process");
    let charged = read_u64(&cg.join(usage_file)).unwrap_or(0);
    assert!(charged >= 48 * MIB, "the prefetch charged the 64 MiB to the container again: {charged} bytes");
    assert_eq!(a.cmd("sum"), sum, "the 64 MiB came back intact");
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
