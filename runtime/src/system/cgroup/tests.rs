//! The cgroup code on recorded trees (`runtime/tests/data/cgroup/`, see its
//! README): cgroup v1 and v2, each under runc's cgroupfs and systemd
//! drivers. Reads run on the checked-in trees; writes on a copy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::*;
use crate::system::reaper;

const UID: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";
const CID: &str = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b";
/// The pid whose `/proc/<pid>/cgroup` each tree holds.
const PID: i32 = 4242;

/// One recorded layout and what it must read as.
struct Layout {
    name: &'static str,
    hierarchy: Hierarchy,
    systemd: bool,
    memory: (u64, Option<u64>, u64, u64),
    cpu: CpuStats,
}

fn layouts() -> [Layout; 4] {
    let v1_cpu = CpuStats { usage_ns: 1_636_450_123, periods: 35, throttled_periods: 31, throttled_ns: 1_481_783_000 };
    let v1_mem = (1_030_438_912, Some(268_435_456), 2_064_384, 807_055_360);
    [
        Layout { name: "v1-cgroupfs", hierarchy: Hierarchy::V1, systemd: false, memory: v1_mem, cpu: v1_cpu },
        Layout { name: "v1-systemd", hierarchy: Hierarchy::V1, systemd: true, memory: v1_mem, cpu: v1_cpu },
        Layout {
            name: "v2-cgroupfs",
            hierarchy: Hierarchy::V2,
            systemd: false,
            memory: (8_429_568, Some(268_435_456), 4096, 0),
            cpu: CpuStats { usage_ns: 1_636_450_000, periods: 35, throttled_periods: 31, throttled_ns: 1_481_783_000 },
        },
        Layout {
            name: "v2-systemd",
            hierarchy: Hierarchy::V2,
            systemd: true,
            memory: (8_437_760, Some(268_435_456), 12288, 0),
            cpu: CpuStats { usage_ns: 1_567_105_000, periods: 34, throttled_periods: 31, throttled_ns: 1_453_970_000 },
        },
    ]
}

impl Layout {
    fn tree(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cgroup").join(self.name)
    }

    fn roots_at(&self, tree: &Path) -> Roots {
        Roots::at(tree.join("sys/fs/cgroup"), tree.join("proc"))
    }

    /// The OCI cgroupsPath kubelet and containerd give runc for the container.
    fn cgroups_path(&self) -> String {
        if self.systemd {
            format!("kubepods-burstable-pod{UID}.slice:cri-containerd:{CID}")
        } else {
            format!("/kubepods/burstable/pod{UID}/{CID}")
        }
    }

    /// The container's directory relative to a hierarchy.
    fn rel(&self) -> String {
        if self.systemd {
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice/cri-containerd-{CID}.scope")
        } else {
            format!("kubepods/burstable/pod{UID}/{CID}")
        }
    }

    /// A writable copy of the tree.
    fn copy(&self) -> (tempfile::TempDir, Roots) {
        let tmp = tempfile::tempdir().unwrap();
        copy_tree(&self.tree(), tmp.path());
        let roots = self.roots_at(tmp.path());
        (tmp, roots)
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ty = e.file_type().unwrap();
        if ty.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if ty.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

/// A child to kill that is surely ours (a recorded tree's pids are not),
/// and the reaper's stream its exit comes on (the crate's reaper reaps
/// every child with `waitpid(-1)`, so a test never waits for one itself).
#[allow(clippy::zombie_processes)] // the reaper waits for it
fn child() -> (i32, reaper::Subscription) {
    spawn(Command::new("sleep").arg("1000"))
}

#[allow(clippy::zombie_processes)] // the reaper waits for it
fn spawn(cmd: &mut Command) -> (i32, reaper::Subscription) {
    let sub = reaper::subscribe();
    let c = cmd.spawn().unwrap();
    (c.id() as i32, sub)
}

/// Puts `pid` as the only process in each of the cgroup's directories.
fn only(cg: &Cgroup, pid: i32) {
    for d in cg.dirs() {
        std::fs::write(d.join("cgroup.procs"), format!("{pid}\n")).unwrap();
    }
}

/// Whether `pid` died of SIGKILL.
async fn killed(pid: i32, sub: &mut reaper::Subscription) -> bool {
    sub.wait_for(pid).await == 128 + libc::SIGKILL
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn sigkill(pid: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
}

#[test]
fn each_layout_locates_the_container_from_its_pid_and_its_cgroups_path() {
    for l in layouts() {
        let roots = l.roots_at(&l.tree());
        assert_eq!(roots.hierarchy(), l.hierarchy, "{}", l.name);
        let by_pid = roots.of_pid(PID).unwrap_or_else(|e| panic!("{}: {e}", l.name));
        let by_path = roots.of_path(&l.cgroups_path()).unwrap_or_else(|e| panic!("{}: {e}", l.name));
        let root = &roots.cgroup;
        match (&by_pid, l.hierarchy) {
            (Cgroup::V2(d), Hierarchy::V2) => assert_eq!(d, &root.join(l.rel()), "{}", l.name),
            (Cgroup::V1(dirs), Hierarchy::V1) => {
                assert_eq!(dirs["memory"], root.join("memory").join(l.rel()), "{}", l.name);
                assert_eq!(dirs["freezer"], root.join("freezer").join(l.rel()), "{}", l.name);
                assert_eq!(dirs["name=systemd"], root.join("systemd").join(l.rel()), "{}", l.name);
                // cpu and cpuacct: two hierarchies here, one `cpu,cpuacct` on a systemd host.
                let cpuacct = if l.systemd { "cpu,cpuacct" } else { "cpuacct" };
                assert_eq!(dirs["cpuacct"], root.join(cpuacct).join(l.rel()), "{}", l.name);
                assert!(!dirs.contains_key(""), "{}: the hybrid 0:: line is not a v1 controller", l.name);
            }
            (cg, h) => panic!("{}: {cg:?} on {h:?}", l.name),
        }
        // Both ways give the same directories (by path: those that exist).
        assert_eq!(by_pid.dirs(), by_path.dirs(), "{}", l.name);
    }
}

#[test]
fn a_cgroup_that_is_not_there_or_leaves_the_tree_is_an_error() {
    for l in layouts() {
        let roots = l.roots_at(&l.tree());
        let gone = if l.systemd { "kubepods-besteffort-podx.slice:cri-containerd:gone" } else { "/kubepods/besteffort/podx/gone" };
        assert!(matches!(roots.of_path(gone), Err(Error::NotFound(_))), "{}", l.name);
        assert!(matches!(roots.of_path("/../../etc"), Err(Error::InvalidArgument(_))), "{}", l.name);
        assert!(matches!(roots.of_pid(1), Err(Error::Io { .. })), "{}: no /proc/1 in the tree", l.name);
    }
    let (tmp, roots) = layouts()[2].copy();
    std::fs::write(tmp.path().join("proc/4242/cgroup"), "0::/../../../etc\n").unwrap();
    let e = roots.of_pid(PID).unwrap_err();
    assert!(e.to_string().contains("leaves its hierarchy"), "{e}");
}

#[test]
fn memory_and_cpu_stats_read_in_each_layout() {
    for l in layouts() {
        let cg = l.roots_at(&l.tree()).of_path(&l.cgroups_path()).unwrap();
        let m = cg.memory().unwrap_or_else(|e| panic!("{}: {e}", l.name));
        assert_eq!((m.usage, m.limit, m.anon, m.inactive_file), l.memory, "{}", l.name);
        assert_eq!(m.working_set(), l.memory.0 - l.memory.3, "{}", l.name);
        let shmem = if l.hierarchy == Hierarchy::V2 { "shmem" } else { "total_shmem" };
        assert!(m.stat.contains_key(shmem), "{}: memory.stat keeps every counter", l.name);
        assert_eq!(cg.cpu().unwrap_or_else(|e| panic!("{}: {e}", l.name)), l.cpu, "{}", l.name);
    }
}

#[test]
fn full_stats_read_in_each_layout() {
    for l in layouts() {
        let cg = l.roots_at(&l.tree()).of_path(&l.cgroups_path()).unwrap();
        let s = cg.stats().unwrap_or_else(|e| panic!("{}: {e}", l.name));
        assert_eq!(s.cpu, l.cpu, "{}", l.name);
        assert_eq!((s.memory.usage, s.memory.limit, s.memory.anon, s.memory.inactive_file), l.memory, "{}", l.name);
        assert_eq!(s.pids, Pids { current: 1, limit: None }, "{}: no pids.max recorded", l.name);
        if l.hierarchy == Hierarchy::V1 {
            // cpuacct.stat's clock ticks (USER_HZ 100 on Linux) in ns.
            assert_eq!((s.cpu_user_ns, s.cpu_kernel_ns), (1_050_000_000, 580_000_000), "{}", l.name);
            assert_eq!((s.memory_max, s.memory_failcnt), (1_730_621_440, 0), "{}", l.name);
        } else {
            assert!(s.cpu_user_ns > 0 && s.cpu_kernel_ns > 0, "{}: {s:?}", l.name);
            assert_eq!(s.memory_failcnt, 35, "{}: memory.events max", l.name);
        }
        // Counters the recordings' kernels did not keep read as zeros.
        assert_eq!((s.swap, s.kernel, s.kernel_tcp), (Counter::default(), Counter::default(), Counter::default()), "{}", l.name);
    }
}

#[test]
fn optional_counters_are_read_where_the_kernel_keeps_them() {
    let l = &layouts()[0];
    let (_tmp, roots) = l.copy();
    let cg = roots.of_path(&l.cgroups_path()).unwrap();
    let mem = cg.dir("memory").unwrap();
    for (f, v) in [("usage_in_bytes", "4096"), ("max_usage_in_bytes", "8192"), ("limit_in_bytes", "9223372036854771712"), ("failcnt", "2")]
    {
        std::fs::write(mem.join(format!("memory.memsw.{f}")), v).unwrap();
    }
    std::fs::write(cg.dir("cpuacct").unwrap().join("cpuacct.usage_percpu"), "600 400 \n").unwrap();
    std::fs::write(cg.dir("pids").unwrap().join("pids.max"), "max\n").unwrap();
    let s = cg.stats().unwrap();
    assert_eq!(s.swap, Counter { usage: 4096, max: 8192, limit: None, failcnt: 2 });
    assert_eq!(s.per_cpu_ns, vec![600, 400]);
    assert_eq!(s.pids.limit, None);
    std::fs::write(cg.dir("pids").unwrap().join("pids.max"), "100\n").unwrap();
    assert_eq!(cg.stats().unwrap().pids.limit, Some(100));
    // A garbled file is an error naming it, not a zero.
    std::fs::write(cg.dir("cpuacct").unwrap().join("cpuacct.usage_percpu"), "600 x\n").unwrap();
    let e = cg.stats().unwrap_err();
    assert!(e.to_string().contains("cpuacct.usage_percpu"), "{e}");
}

#[test]
fn unlimited_memory_and_a_cpu_controller_off_still_read() {
    // The pod-level cgroup of the v2 recording: memory.max is "max".
    let l = &layouts()[2];
    let pod = Cgroup::V2(l.tree().join(format!("sys/fs/cgroup/kubepods/burstable/pod{UID}")));
    assert_eq!(pod.memory().unwrap().limit, None);
    // v2 without the cpu controller: cpu.stat has only the usage lines.
    let (_tmp, roots) = l.copy();
    let cg = roots.of_path(&l.cgroups_path()).unwrap();
    std::fs::write(cg.dir("cpu").unwrap().join("cpu.stat"), "usage_usec 7\nuser_usec 5\nsystem_usec 2\n").unwrap();
    assert_eq!(cg.cpu().unwrap(), CpuStats { usage_ns: 7000, ..Default::default() });
}

#[test]
fn oom_kills_count_in_each_layout() {
    for l in layouts() {
        let cg = l.roots_at(&l.tree()).of_pid(PID).unwrap();
        assert_eq!(cg.oom_kills().unwrap_or_else(|e| panic!("{}: {e}", l.name)), 1, "{}", l.name);
        assert_eq!(oom_kills(&cg), 1, "{}", l.name);
    }
    // Gone (runc deleted it): 0, logged.
    assert_eq!(oom_kills(&Cgroup::V2(PathBuf::from("/nonexistent/cgroup"))), 0);
}

/// Whether `f` holds within 5 s.
async fn within_5s(f: impl Fn() -> bool) -> bool {
    for _ in 0..500 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Waits (bounded) until `f` holds.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    assert!(within_5s(f).await, "{what}: not within 5 s");
}

/// The systemd driver's scope is removed as soon as its last process
/// exited: an OOM kill read at the init's exit was lost with it. The
/// watch saw it while the cgroup lived (v2: an inotify on
/// `memory.events`, changed here as the kernel changes it).
#[tokio::test]
async fn an_oom_kill_seen_while_the_cgroup_lived_outlives_it() {
    for l in layouts().iter().filter(|l| l.hierarchy == Hierarchy::V2) {
        let (_tmp, roots) = l.copy();
        let cg = roots.of_path(&l.cgroups_path()).unwrap();
        let events = cg.dir("memory").unwrap().join("memory.events");
        let recorded = read(&events);
        assert!(recorded.contains("oom_kill 1\n"), "{}: {recorded}", l.name);
        std::fs::write(&events, recorded.replace("oom_kill 1\n", "oom_kill 0\n")).unwrap();
        let watch = OomWatch::start(&cg).unwrap();
        assert_eq!(watch.kills(), 0, "{}", l.name);
        std::fs::write(&events, &recorded).unwrap();
        eventually(&format!("{}: the watch to count the kill", l.name), || watch.kills() == 1).await;
        std::fs::remove_dir_all(cg.dir("memory").unwrap()).unwrap();
        assert_eq!(oom_kills(&cg), 0, "{}: read after the cgroup's removal, the kill is lost", l.name);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(watch.kills(), 1, "{}: the watch keeps it", l.name);
    }
    // v1: registered through cgroup.event_control (a plain file here: the
    // eventfd never fires), the count read when the watch starts is kept.
    for l in layouts().iter().filter(|l| l.hierarchy == Hierarchy::V1) {
        let (_tmp, roots) = l.copy();
        let cg = roots.of_path(&l.cgroups_path()).unwrap();
        let dir = cg.dir("memory").unwrap().to_path_buf();
        std::fs::write(dir.join("cgroup.event_control"), "").unwrap();
        let watch = OomWatch::start(&cg).unwrap();
        let registered = read(&dir.join("cgroup.event_control"));
        assert_eq!(registered.split(' ').count(), 2, "{}: <eventfd> <memory.oom_control fd>: {registered:?}", l.name);
        assert_eq!(watch.kills(), 1, "{}", l.name);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(watch.kills(), 1, "{}", l.name);
    }
    // Without its counter there is nothing to watch.
    assert!(OomWatch::start(&Cgroup::V2(PathBuf::from("/nonexistent/cgroup"))).is_err());
}

#[test]
fn the_idle_policy_reads_cpu_of_the_pids_cgroup() {
    for l in layouts() {
        let roots = l.roots_at(&l.tree());
        assert_eq!(cpu_ns_in(&roots, PID), Some(l.cpu.usage_ns), "{}", l.name);
        assert_eq!(cpu_ns_in(&roots, 1), None, "{}", l.name);
    }
}

#[tokio::test]
async fn freeze_and_thaw_write_the_freezer_of_each_hierarchy() {
    for l in layouts() {
        let (_tmp, roots) = l.copy();
        let cg = roots.of_pid(PID).unwrap();
        let (control, events) = match &cg {
            Cgroup::V2(d) => (d.join("cgroup.freeze"), Some(d.join("cgroup.events"))),
            Cgroup::V1(_) => (cg.dir("freezer").unwrap().join("freezer.state"), None),
        };
        cg.thaw().unwrap();
        assert_eq!(read(&control), if events.is_some() { "0" } else { "THAWED" }, "{}", l.name);
        if let Some(ev) = &events {
            // The v2 recording was taken frozen; the kernel updates cgroup.events.
            std::fs::write(ev, "populated 1\nfrozen 0\n").unwrap();
        }
        assert_eq!(cg.freezer_state().unwrap(), FreezerState::Thawed, "{}", l.name);
        cg.request_freeze().unwrap();
        assert_eq!(read(&control), if events.is_some() { "1" } else { "FROZEN" }, "{}", l.name);
        match &events {
            Some(ev) => {
                assert_eq!(cg.freezer_state().unwrap(), FreezerState::Freezing, "{}", l.name);
                // Not frozen by the deadline: thawed again, an error.
                let e = cg.freeze(Duration::from_millis(30)).await.unwrap_err();
                assert!(matches!(e, Error::FailedPrecondition(_)), "{}: {e}", l.name);
                assert_eq!(read(&control), "0", "{}", l.name);
                std::fs::write(ev, "populated 1\nfrozen 1\n").unwrap();
            }
            None => std::fs::write(&control, "FREEZING\n").unwrap(),
        }
        if events.is_none() {
            assert_eq!(cg.freezer_state().unwrap(), FreezerState::Freezing, "{}", l.name);
        }
        // The kernel reports frozen: freeze() returns.
        cg.freeze(Duration::from_secs(60)).await.unwrap_or_else(|e| panic!("{}: {e}", l.name));
        assert_eq!(cg.freezer_state().unwrap(), FreezerState::Frozen, "{}", l.name);
        if events.is_none() {
            std::fs::write(&control, "BOGUS\n").unwrap();
            assert!(matches!(cg.freezer_state(), Err(Error::Io { .. })), "{}", l.name);
        }
    }
}

#[tokio::test]
async fn kill_uses_cgroup_kill_on_v2_and_each_pid_on_v1() {
    for l in layouts() {
        let (_tmp, roots) = l.copy();
        let cg = roots.of_path(&l.cgroups_path()).unwrap();
        let (pid, mut sub) = child();
        only(&cg, pid);
        match &cg {
            Cgroup::V2(d) => {
                std::fs::write(d.join("cgroup.freeze"), "1").unwrap();
                assert_eq!(cg.kill_once().unwrap(), vec![pid], "{}", l.name);
                // The kernel kills the subtree; no signal from us.
                assert_eq!(read(&d.join("cgroup.kill")), "1", "{}", l.name);
                assert_eq!(read(&d.join("cgroup.freeze")), "0", "{}: thawed", l.name);
                assert!(alive(pid), "{}: signalled a pid itself", l.name);
                sigkill(pid);
                assert!(killed(pid, &mut sub).await);
                // A kernel before 5.14 has no cgroup.kill: each pid then.
                std::fs::remove_file(d.join("cgroup.kill")).unwrap();
                let (pid, mut sub) = child();
                only(&cg, pid);
                cg.kill_once().unwrap();
                assert!(killed(pid, &mut sub).await, "{}", l.name);
            }
            Cgroup::V1(_) => {
                let state = cg.dir("freezer").unwrap().join("freezer.state");
                std::fs::write(&state, "FROZEN\n").unwrap();
                assert_eq!(cg.kill_once().unwrap(), vec![pid], "{}", l.name);
                assert!(killed(pid, &mut sub).await, "{}", l.name);
                assert_eq!(read(&state), "THAWED", "{}: thawed so that the kill lands", l.name);
            }
        }
    }
}

#[tokio::test]
async fn kill_cgroup_kills_until_the_cgroup_is_empty() {
    // v2, nothing populated: nothing written, nothing signalled.
    let l = &layouts()[3];
    let (_tmp, roots) = l.copy();
    let cg = roots.of_path(&l.cgroups_path()).unwrap();
    let d = cg.dir("memory").unwrap().to_path_buf();
    std::fs::write(d.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    kill_cgroup_in(&roots, &l.cgroups_path()).await;
    assert_eq!(read(&d.join("cgroup.kill")), "", "an empty cgroup is not killed");
    // v1: the leftover pid is killed; once it is gone the cgroup is empty
    // (done here as the kernel would), and the loop ends.
    let l = &layouts()[0];
    let (_tmp, roots) = l.copy();
    let cg = roots.of_path(&l.cgroups_path()).unwrap();
    let (pid, mut sub) = child();
    only(&cg, pid);
    let kernel = {
        let cg = cg.clone();
        tokio::spawn(async move {
            let dead = killed(pid, &mut sub).await;
            for d in cg.dirs() {
                std::fs::write(d.join("cgroup.procs"), "").unwrap();
            }
            dead
        })
    };
    kill_cgroup_in(&roots, &l.cgroups_path()).await;
    assert!(kernel.await.unwrap(), "killed by SIGKILL");
    assert!(cg.procs().unwrap().is_empty());
    // Gone: returns at once.
    kill_cgroup_in(&roots, "/kubepods/gone").await;
}

/// On a real cgroup v2 hierarchy (the guest of test/vm/run.sh, which runs
/// it with `--ignored`): makes a cgroup, runs a process in it, then reads,
/// freezes, thaws and kills it through this module. Refuses to write to a
/// v1 host's tree: it fails there, before it writes anything.
#[tokio::test]
#[ignore = "needs a cgroup v2 root it may write to: test/vm/run.sh"]
async fn live_cgroup_v2() {
    let roots = Roots::host();
    assert_eq!(roots.hierarchy(), Hierarchy::V2, "not a cgroup v2 host: refusing to write to its cgroup tree");
    let r = &roots.cgroup;
    std::fs::write(r.join("cgroup.subtree_control"), "+cpu +memory +pids").unwrap();
    let parents = ["torpor.slice", "torpor.slice/torpor-live.slice"];
    for p in parents {
        std::fs::create_dir_all(r.join(p)).unwrap();
        std::fs::write(r.join(p).join("cgroup.subtree_control"), "+cpu +memory +pids").unwrap();
    }
    let dir = r.join("torpor.slice/torpor-live.slice/test-c1.scope");
    std::fs::create_dir_all(&dir).unwrap();
    // It joins before it execs, so that what it maps is charged to the
    // cgroup (v2 does not move charges with a process).
    let procs = dir.join("cgroup.procs");
    let (pid, mut sub) = spawn(Command::new("sh").arg("-c").arg(format!("echo $$ > {}; exec sleep 1000", procs.display())));
    while !read(&procs).split_whitespace().any(|p| p == pid.to_string()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cg = roots.of_pid(pid).unwrap();
    assert_eq!(cg, Cgroup::V2(dir.clone()));
    assert_eq!(roots.of_path("torpor-live.slice:test:c1").unwrap(), cg);
    assert!(cg.memory().unwrap().usage > 0);
    cg.cpu().unwrap();
    assert_eq!(cg.oom_kills().unwrap(), 0);
    assert!(cg.populated().unwrap());
    cg.freeze(Duration::from_secs(60)).await.unwrap();
    assert_eq!(cg.freezer_state().unwrap(), FreezerState::Frozen);
    cg.thaw().unwrap();
    assert_eq!(cg.freezer_state().unwrap(), FreezerState::Thawed);
    cg.request_freeze().unwrap();
    // Frozen or not, the kill lands.
    kill_cgroup_in(&roots, "torpor-live.slice:test:c1").await;
    assert!(!cg.populated().unwrap());
    assert!(killed(pid, &mut sub).await);
    std::fs::remove_dir(&dir).unwrap();
    // An OOM kill is counted by the watch, and kept once the cgroup is
    // removed (as systemd removes a scope when its last process exited).
    let oom_dir = r.join("torpor.slice/torpor-live.slice/test-oom.scope");
    std::fs::create_dir_all(&oom_dir).unwrap();
    std::fs::write(oom_dir.join("memory.max"), "16777216").unwrap();
    let _ = std::fs::write(oom_dir.join("memory.swap.max"), "0");
    let oom_cg = roots.of_path("torpor-live.slice:test:oom").unwrap();
    let watch = OomWatch::start(&oom_cg).unwrap();
    assert_eq!(watch.kills(), 0);
    let procs = oom_dir.join("cgroup.procs");
    let (hog, mut hog_sub) =
        spawn(Command::new("sh").arg("-c").arg(format!("echo $$ > {}; exec dd if=/dev/zero of=/dev/null bs=64M count=1", procs.display())));
    assert!(killed(hog, &mut hog_sub).await, "the 64 MiB dd under a 16 MiB memory.max is OOM-killed");
    eventually("the watch to count the OOM kill", || watch.kills() >= 1).await;
    while oom_cg.populated().unwrap() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::remove_dir(&oom_dir).unwrap();
    assert_eq!(oom_kills(&oom_cg), 0, "gone with the cgroup");
    assert!(watch.kills() >= 1, "kept by the watch");
    for p in parents.iter().rev() {
        std::fs::remove_dir(r.join(p)).unwrap();
    }
}

/// On a cgroup v1 host (run by hand as root with `--ignored`; this
/// machine's tree is v1): an OOM kill in a memory cgroup of its own
/// reaches the watch through the eventfd of `cgroup.event_control`, and
/// is kept once the cgroup is removed. Refuses a v2 host.
#[tokio::test]
#[ignore = "writes to a cgroup v1 host's memory hierarchy: run as root with --ignored"]
async fn live_cgroup_v1_oom_watch() {
    let roots = Roots::host();
    assert_eq!(roots.hierarchy(), Hierarchy::V1, "not a cgroup v1 host");
    let dir = roots.cgroup.join("memory").join(format!("torpor-live-oom-{}", std::process::id()));
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("memory.limit_in_bytes"), "16777216").unwrap();
    let cg = Cgroup::V1([("memory".to_string(), dir.clone())].into());
    let watch = OomWatch::start(&cg).unwrap();
    assert_eq!(watch.kills(), 0);
    let procs = dir.join("cgroup.procs");
    let (hog, mut sub) =
        spawn(Command::new("sh").arg("-c").arg(format!("echo $$ > {}; exec dd if=/dev/zero of=/dev/null bs=64M count=1", procs.display())));
    let oom_killed = killed(hog, &mut sub).await;
    let counted = within_5s(|| watch.kills() >= 1).await;
    while !read(&procs).trim().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::remove_dir(&dir).unwrap();
    assert!(oom_killed, "the 64 MiB dd under a 16 MiB limit is OOM-killed");
    assert!(counted, "the watch counted the kill");
    assert_eq!(oom_kills(&cg), 0, "gone with the cgroup");
    assert!(watch.kills() >= 1, "kept by the watch");
}

/// This host's own tree, read only: the test process's cgroup is found
/// and its CPU use reads, whichever hierarchy the host has.
#[test]
fn this_hosts_own_cgroup_reads() {
    let roots = Roots::host();
    let cg = roots.of_pid(std::process::id() as i32).unwrap();
    assert_eq!(matches!(cg, Cgroup::V2(_)), roots.hierarchy() == Hierarchy::V2);
    assert!(cg.procs().unwrap().contains(&(std::process::id() as i32)));
    cg.cpu().unwrap();
}

/// v1: runc removes a container's directory hierarchy by hierarchy; one
/// already gone holds no processes, the others are still read.
#[test]
fn a_v1_hierarchy_removed_first_holds_no_processes() {
    let l = &layouts()[1];
    let (_tmp, roots) = l.copy();
    let cg = roots.of_path(&l.cgroups_path()).unwrap();
    std::fs::remove_dir_all(cg.dir("freezer").unwrap()).unwrap();
    assert_eq!(cg.procs().unwrap(), vec![PID]);
    for d in cg.dirs() {
        let _ = std::fs::remove_dir_all(d);
    }
    assert_eq!(cg.procs().unwrap(), Vec::<i32>::new());
    assert!(!cg.populated().unwrap());
}

#[test]
fn controllers_of_gives_one_entry_per_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("cgroup");
    std::fs::write(&f, "9:name=systemd:/a\n1:cpu,cpuacct:/b/c\n0::/d\n").unwrap();
    let c = controllers_of(&f).unwrap();
    let want: Vec<(String, PathBuf)> =
        vec![("name=systemd".into(), "a".into()), ("cpu".into(), "b/c".into()), ("cpuacct".into(), "b/c".into()), ("".into(), "d".into())];
    assert_eq!(c, want);
}
