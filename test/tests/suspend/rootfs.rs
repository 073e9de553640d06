//! The container's writable layer and its own tmpfs mounts across a
//! suspend: changes kept, sparse files, the capture's byte cap.

use torpor_tests::*;

use crate::{actor, assert_suspend_refused, MIB};

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
    // a missing rig setting is a failure, never a pass (test/rig/up.sh always sets it)
    let cap =
        rig_capture_cap().unwrap_or_else(|| panic!("the rig's containerd has no TORPOR_ROOTFS_CAPTURE_MAX_BYTES (test/rig/up.sh sets it)"));
    assert!(cap <= 1 << 30, "the rig's cap is small enough to go past in a test: {cap}");
    let a = actor("susp-rootfs-cap", &[]);
    assert_eq!(a.inc(), 1);
    sh(&a.container, &format!("mkdir -p /var/big && head -c {} /dev/zero > /var/big/file", cap + MIB));
    let (out, _) = assert_suspend_refused(&a, "over the capture cap", "/var/big/file", &[]);
    assert!(out.stderr.contains(&format!("cap of {cap} bytes")), "the refusal names the file and the cap: {out}");
    assert_eq!(a.inc(), 2, "the counter still answers");
    assert_eq!(sh(&a.container, "stat -c %s /var/big/file"), (cap + MIB).to_string(), "its files are untouched");

    sh(&a.container, "rm /var/big/file");
    let st = a.op("suspend");
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    a.op("resume");
    assert_eq!(a.inc(), 3);
}
