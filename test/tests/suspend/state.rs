//! What a suspend and a resume keep (the counter's state, its memory, its
//! cgroup, what runc and CRI say of it) and how the restore is done.

use std::path::{Path, PathBuf};

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

use crate::{actor, container_processes, init_pid, pid_alive_in, MIB};

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

/// The resume's CRIU finds the kernel cache that the node daemon warmed at
/// its start (`/run/criu.kdat`, made in a private `/run` where the host's
/// is not a tmpfs): the restore does not probe the kernel again.
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
