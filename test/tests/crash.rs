//! Crash safety of suspend and resume: the shim is SIGKILLed at each crash
//! point of a suspend and of a resume (runtime/src/failpoint.rs; the rig's
//! shim is a `failpoints` build, armed through $TORPOR_FAILPOINTS_DIR), and
//! the actor must come out RUNNING or SUSPENDED-and-restorable: never lost
//! once committed, never running twice.
//!
//! Each test: a counter pod (64 MiB of checked memory) counts to 3; the
//! shim dies at the point; containerd cleans up (the test checks that no
//! process of the old containers, and no runc/CRIU child of the dead shim,
//! is left); then the pod is created again as kubelet would (same name,
//! next sandbox attempt) and the test checks what the counter says:
//! * a crash before the suspend's dumps all completed: nothing was
//!   committed, the containers died with the shim (as under runc-v2), the
//!   new pod starts cold (0);
//! * a crash after the dumps, or anywhere in a resume: the checkpoint is
//!   kept, and the new pod's container is restored from it (3, memory
//!   intact), once; the kept checkpoint is gone after.
//!
//! torpor-only: under TORPOR_TEST_RUNTIME=runc each test is reported ignored.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

/// Removes what a dead shim kept of an actor, if a test left it (a failed
/// test: a passing one sees it consumed).
fn kept_removed(shim: &str) -> Cleanup {
    let dir = Node::a().actor_dir(shim);
    Cleanup::new(format!("the kept record of {shim}"), move || {
        let _ = std::fs::remove_dir_all(&dir);
    })
}

/// The pid of the shim serving `shim` (its `-id`), if it runs.
fn shim_pid(shim: &str) -> Option<u32> {
    let needle = format!(" -id {shim} ");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        if cmd.contains("containerd-shim-torpor-v1") && cmd.contains(&needle) && !cmd.trim_end().ends_with(" delete") {
            return Some(pid);
        }
    }
    None
}

/// Children the dead shim `shim` started (runc, CRIU, lazy-pages): they
/// carry TORPOR_SHIM=<shim> in their environment.
fn children_of_shim(shim: &str) -> Vec<String> {
    let tag = format!("TORPOR_SHIM={shim}");
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return found };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == tag.as_bytes()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            found.push(format!("pid {pid} {}", comm.trim()));
        }
    }
    found
}

/// What `list` still lists once it lists nothing, or [`LIVENESS`] has
/// passed.
fn still_listed(list: impl Fn() -> Vec<String>) -> Vec<String> {
    let deadline = std::time::Instant::now() + LIVENESS;
    loop {
        let left = list();
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The counter of these tests: 64 MiB of checked memory; `attempt`: the
/// container's restart count.
fn counter(attempt: u32) -> CounterSpec {
    CounterSpec::new().alloc_mib(64).attempt(attempt)
}

/// What a crash left, and the pod created after it.
struct AfterCrash {
    /// The dead shim's record after containerd's cleanup (None: removed).
    kept: Option<Value>,
    old_shim: String,
    new: Counter,
    sum: String,
    /// The actor id (its snapshots in the store).
    actor: String,
    _guard: Cleanup,
    _snapshots: Cleanup,
    /// The old pod (NotReady), removed last, as kubelet would.
    _old: Pod,
}

/// Counter to 3; `resume_op` first suspends (the crash is in the resume);
/// the shim dies at `point`; cleanup checked; the pod is run again.
#[track_caller]
fn crash_at(prefix: &str, point: &str, opts: PodOptions, again_name: Option<&str>) -> AfterCrash {
    crash_with(prefix, point, opts, again_name, false)
}

/// [`crash_at`]; `open_conn`: a client connection stays open (idle) across
/// the suspend, so the checkpoint holds an established TCP socket of the
/// old pod IP.
#[track_caller]
fn crash_with(prefix: &str, point: &str, opts: PodOptions, again_name: Option<&str>, open_conn: bool) -> AfterCrash {
    let a = counter(0).start(Pod::run_with(prefix, opts.clone()));
    let sum = a.count_to(3);
    let _conn = open_conn.then(|| {
        let s = connect_with_retry(&format!("{}:8080", a.ip));
        let mut w = s.try_clone().unwrap();
        w.write_all(b"get\n").unwrap();
        let mut line = String::new();
        BufReader::new(s.try_clone().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "3");
        s
    });
    let guard = kept_removed(a.shim());
    let actor = a.actor.clone();
    let snapshots = Cleanup::snapshots(&actor);
    let op = if point.starts_with("resume") { "resume" } else { "suspend" };
    if op == "resume" {
        let out = torporctl(&["--json", "suspend", a.shim()]);
        assert!(out.success(), "suspend before the resume crash: {out}\n{}", Node::a().log_about(&[a.shim()], 40));
        assert_eq!(a.status()["state"], "SUSPENDED");
    }
    let pid = shim_pid(a.shim()).unwrap_or_else(|| panic!("no shim process for {}", a.shim()));
    let armed = arm_failpoint(a.shim(), point);
    let out = torporctl(&["--json", op, a.shim()]);
    assert!(!out.success(), "the shim was to die at {point}, but the {op} succeeded: {out}");
    drop(armed);
    wait_for(&format!("the shim (pid {pid}) to die at {point}"), LIVENESS, || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()));

    // It died at that point, not elsewhere: the shim logged it.
    let shim = a.shim().to_string();
    let fired = if point.contains("-during-") { "failpoint: CRIU runs, killing the shim" } else { "failpoint: killing the shim" };
    let line = wait_for(&format!("the log line of the failpoint {point}"), LIVENESS, || {
        let log = std::fs::read_to_string(format!("{}/containerd.log", rig().state_dir)).unwrap_or_default();
        log.lines().find(|l| l.contains(&format!("shim=\"{shim}\"")) && l.contains(fired)).map(str::to_string)
    });
    eprintln!("{point}: {line}");

    // containerd notices, and cleans up after the dead shim.
    wait_container_state(&a.container, "CONTAINER_EXITED");
    let kept = wait_for("the dead shim's actor record to be settled", LIVENESS, || match Node::a().actor_record(&shim) {
        None => Some(None),
        Some(r) if r["orphaned"] == true => Some(Some(r)),
        Some(_) => None,
    });
    // A SIGKILLed process stays listed until its parent (containerd, the
    // subreaper of the dead shim's children) has reaped it: waited for.
    let left = still_listed(|| processes_in_cgroup(&a.container));
    assert!(left.is_empty(), "processes of the old container left after {point}: {left:?}");
    let left = still_listed(|| children_of_shim(&shim));
    assert!(left.is_empty(), "children of the dead shim left after {point}: {left:?}");
    eprintln!("{point}: the dead shim's record: {}", kept.as_ref().map(|k| k.to_string()).unwrap_or("removed".into()));
    // An operator sees a kept checkpoint (and only then) in torporctl status.
    let out = torporctl(&["--json", "status", &shim]);
    match &kept {
        Some(k) => {
            let v: Value = serde_json::from_str(&out.clone().ok()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
            assert_eq!(v[0]["kept"], true, "{out}");
            assert_eq!(v[0]["actor"]["state"], k["state"], "{out}");
            let out = torporctl(&["resume", &shim]);
            assert!(!out.success() && out.stderr.contains("checkpoint is kept"), "{out}");
        }
        None => assert!(!out.success() && out.stderr.contains("no actor named"), "{out}"),
    }

    // kubelet runs the pod again (same pod, next sandbox attempt), or a new
    // pod of the same actor id.
    let again = match again_name {
        None => Pod::run_again(&a.pod.name, 1, opts),
        Some(prefix) => Pod::run_with(prefix, opts),
    };
    let new = counter(1).start(again);
    let Counter { pod: old, .. } = a;
    AfterCrash { kept, old_shim: shim, new, sum, actor, _guard: guard, _snapshots: snapshots, _old: old }
}

/// Exactly one counter process runs for the pod `name` (old and new sandbox
/// share its cgroup parent).
#[track_caller]
fn one_counter(name: &str) {
    // `/<cgroup>/pod-<name>/…` (cgroupfs) or `…/<cgroup>-pod_<name>.slice/…` (systemd)
    let parent = Node::a().rig.pod_cgroup_parent(name);
    let all: Vec<String> =
        processes_in_cgroup(&format!("{}/", parent.trim_start_matches('/'))).into_iter().filter(|p| p.contains("/actor counter")).collect();
    assert_eq!(all.len(), 1, "one counter process of pod {name}: {all:?}");
}

/// The crash left nothing to restore: the pod starts cold.
#[track_caller]
fn assert_cold(c: &AfterCrash) {
    assert!(c.kept.is_none(), "nothing is kept of an uncommitted suspend: {:?}", c.kept);
    let snaps = store_snapshots(&c.actor);
    assert!(snaps.is_empty(), "nothing of the suspend reached the store (its staging was aborted): {snaps:?}");
    assert_eq!(c.new.cmd("get"), "0", "the new pod starts cold");
    let st = c.new.status();
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert!(st["recovered_from"].is_null(), "{st}");
    one_counter(&c.new.pod.name);
}

/// The crash kept the checkpoint: the new pod continues from it.
#[track_caller]
fn assert_restored(c: &AfterCrash, kept_state: &str) {
    let kept = c.kept.as_ref().unwrap_or_else(|| panic!("the checkpoint was not kept"));
    assert_eq!(kept["state"], kept_state, "{kept}");
    assert_eq!(kept["generation"], 1, "{kept}");
    // The state is in the node's snapshot store.
    let snap = format!("{}@{}", kept["snapshot"]["actor"].as_str().unwrap_or("?"), kept["snapshot"]["generation"]);
    assert_eq!(kept["snapshot"]["actor"], c.actor.as_str(), "{kept}");
    let snaps = store_snapshots(&c.actor);
    assert!(snaps.iter().any(|s| s["snapshot"] == snap.as_str()), "{snap} in the store: {snaps:?}");
    let got = c.new.cmd("get");
    assert_eq!(
        got,
        "3",
        "the new pod continues from the kept checkpoint\n{}",
        Node::a().log_about(&[&c.old_shim, c.new.shim(), &c.new.container], 40)
    );
    assert_eq!(c.new.cmd("sum"), c.sum, "the 64 MiB came back intact");
    assert_eq!(c.new.cmd("inc"), "4");
    let st = c.new.status();
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(st["recovered_from"], snap.as_str(), "{st}");
    assert!(!Node::a().actor_dir(&c.old_shim).exists(), "the kept checkpoint is consumed once the restored container runs");
    assert_eq!(container_state(&c.new.container), "CONTAINER_RUNNING");
    one_counter(&c.new.pod.name);
    // And it is a full actor again: it suspends and resumes.
    let out = torporctl(&["--json", "suspend", c.new.shim()]);
    assert!(out.success(), "suspend of the restored actor: {out}");
    let out = torporctl(&["--json", "resume", c.new.shim()]);
    assert!(out.success(), "resume of the restored actor: {out}");
    assert_eq!(c.new.cmd("inc"), "5");
}

// -------------------------------------------------------------- suspend

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_suspend_after_persist() {
    torpor_only();
    assert_cold(&crash_at("crash-sp", "suspend-after-persist", PodOptions::default(), None));
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_suspend_after_freeze() {
    torpor_only();
    assert_cold(&crash_at("crash-sf", "suspend-after-freeze", PodOptions::default(), None));
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_suspend_during_dump() {
    torpor_only();
    assert_cold(&crash_at("crash-sd", "suspend-during-dump", PodOptions::default(), None));
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_suspend_after_dump() {
    torpor_only();
    // Every dump completed and was marked: the cleanup commits the suspend.
    assert_restored(&crash_at("crash-sa", "suspend-after-dump", PodOptions::default(), None), "SUSPENDED");
}

// --------------------------------------------------------------- resume

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_resume_after_persist() {
    torpor_only();
    assert_restored(&crash_at("crash-rp", "resume-after-persist", PodOptions::default(), None), "RESUMING");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_resume_during_restore() {
    torpor_only();
    assert_restored(&crash_at("crash-rd", "resume-during-restore", PodOptions::default(), None), "RESUMING");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_resume_after_restore() {
    torpor_only();
    assert_restored(&crash_at("crash-ra", "resume-after-restore", PodOptions::default(), None), "RESUMING");
}

/// The checkpoint holds an established connection of the old pod's IP,
/// which does not exist in the new pod: it comes back closed.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn crash_resume_with_an_open_connection() {
    torpor_only();
    let c = crash_with("crash-rc", "resume-after-persist", PodOptions::default(), None, true);
    assert_restored(&c, "RESUMING");
}

// ------------------------------------------------------------- identity

/// By `torpor.dev/actor`, a pod of another name gets the checkpoint; a
/// second pod of the same actor created while the first runs is refused
/// (the actor's node-local claim): an actor never runs twice.
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn kept_checkpoint_is_restored_once_by_actor_id() {
    torpor_only();
    let actor = actor_name("crash-actor");
    let opts = PodOptions::actor(&actor);
    let c = crash_at("crash-id", "resume-after-persist", opts.clone(), Some("crash-id-new"));
    assert_restored(&c, "RESUMING");
    assert_eq!(c.new.status()["actor"], actor.as_str());

    let second = Pod::run_with("crash-id-second", opts);
    // (CRI creates the task, and the shim sees the container, at its start.)
    let created = second.try_create(&counter(0).in_the_pods_pid_namespace().config()).unwrap_or_else(|o| panic!("crictl create: {o}"));
    let out = crictl(&["start", &created]);
    assert!(!out.success(), "a second pod of a running actor must be refused: {out}");
    assert!(
        out.all_output().contains(&format!("actor {actor} already runs on this node")) && out.all_output().contains(c.new.shim()),
        "the refusal names the actor and the shim holding it: {out}"
    );
    assert_eq!(c.new.cmd("get"), "5", "the restored one keeps its state");
}

/// containerd also runs `containerd-shim-torpor-v1 delete` for one task of
/// a shim that lives on (containerd 2.x does when it closes its connection
/// for a task, e.g. one whose start failed): that container goes, as under
/// runc-v2, but the live shim's actor keeps its record, its lease and its
/// control socket (before, the cleanup took the shim for dead: it settled
/// the record, surrendered the lease and removed the socket).
#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_cleanup_of_one_task_leaves_the_live_shims_actor_alone() {
    let a = counter(0).start(Pod::run_with("cleanup-live", PodOptions::default()));
    a.count_to(3);
    let out = torporctl(&["--json", "suspend", a.shim()]);
    assert!(out.success(), "{out}");
    assert_eq!(a.status()["state"], "SUSPENDED");
    let pid = shim_pid(a.shim()).unwrap_or_else(|| panic!("no shim process for {}", a.shim()));
    let lease = |actor: &str| -> Option<Value> {
        let bucket = std::env::var("TORPOR_RIG_S3_BUCKET").unwrap_or_else(|_| "torpor".into());
        let text = std::fs::read_to_string(format!("{}/s3/{bucket}/objects/actors/{actor}/lease.json", Node::a().root)).ok()?;
        serde_json::from_str(&text).ok()
    };
    let before = lease(&a.actor).unwrap_or_else(|| panic!("the actor {} has a lease", a.actor));

    // what containerd runs when it lets go of one task of the shim
    let bundle = format!("{}/containerd/io.containerd.runtime.v2.task/k8s.io/{}", rig().state_dir, a.container);
    let bin = format!("{}/../target/release/containerd-shim-torpor-v1", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(&bin)
        .args(["-namespace", "k8s.io", "-address", &rig().address, "-id", &a.container, "-bundle", &bundle, "delete"])
        .current_dir(&bundle)
        .envs(Node::a().torpor_env())
        .output()
        .unwrap_or_else(|e| panic!("run {bin} delete: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the shim's delete: {stderr}");
    assert!(stderr.contains("still serves its pod"), "it saw the shim alive: {stderr}");

    assert!(Path::new(&format!("/proc/{pid}")).exists(), "the shim lives on");
    let rec = Node::a().actor_record(a.shim()).unwrap_or_else(|| panic!("the live shim's actor record is kept"));
    assert_ne!(rec["orphaned"], true, "not settled as a dead shim's: {rec}");
    // the control socket still answers: torporctl reaches the actor
    assert_eq!(a.status()["state"], "SUSPENDED");
    let after = lease(&a.actor).unwrap_or_else(|| panic!("the lease object is still there"));
    assert_eq!(after["node"], before["node"], "{after}");
    assert_eq!(after["epoch"], before["epoch"], "{after}");
    assert_ne!(after["released"], true, "the lease was not let go: {after}");
    assert_ne!(after["leaving"], true, "the lease is not being let go: {after}");
}
