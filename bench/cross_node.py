#!/usr/bin/env python3
"""Two nodes (the rig's node A and node B: two containerds, two
torpor-snapshotters with separate local tiers, one S3 server, versitygw on
loopback): resume_cross_node_256mib_ms, clone_10_actors_ms and
clone_10_actors_remote_ms.

**resume_cross_node_256mib_ms** (p50, p99; >= 30 runs). One run:

1. untimed, node A: a torpor pod with `torpor.dev/actor: bench-xn-<random>`
   running `/actor counter --port 8080 --alloc-mib 256 --seed <random>` (a
   memory pattern no earlier run had: nothing deduplicates against an
   earlier run's chunks); `inc`; its memory CRC (`sum`); `torporctl
   suspend`; the snapshot committed (`snapshots ls`); `torporctl snapshots
   upload` (durable in S3); `torporctl snapshots evict` (node A's local
   copy dropped); the pod removed (a SUSPENDED actor's snapshots stay).
   The snapshot is now only in the object tier. Both stores' background
   deletion of what was removed (node A's evicted copy, the snapshots of
   the run before) is waited for: the rig's nodes share one disk.
2. TIMED, node B: from the start of `crictl runp` of a pod of the same
   actor, through `crictl create`, `crictl start` (the shim's create finds
   the actor's newest snapshot in S3, node B's store fetches and verifies
   it, CRIU restores it), `crictl inspectp` (the pod IP), until the first
   byte of the answer to `inc` sent to POD_IP:8080 (connect retried every
   1 ms while refused). The answer must be the counter + 1; afterwards
   (untimed) the memory CRC must be the one before the suspend.
3. untimed: the pod on node B removed, the actor's snapshots removed from
   both nodes' stores (and S3).

Before the runs (and before clone_10_actors_ms), the page cache is
dropped, untimed: it frees the memory cgroups of the pods removed before,
which live on, dying, while page cache is charged to them and slow every
pod made after.

One unmeasured run first. Phases (p50/p99 per step) are kept, with the
shim's `last_resume_ms` (checkout incl. the fetch, and the restore).

No baseline: containerd-shim-runc-v2 has no cross-node restore (its
checkpoints are images in one containerd's content store; moving one to
another node is a registry push/pull outside containerd).

**clone_10_actors_ms** (p50 over repetitions; the runtimes' repetitions
alternate, one unmeasured warm-up each). A golden actor (`/actor
counter --alloc-mib 64`, counted to 3) is suspended on node A; its snapshot
stays in node A's store (local). One repetition: from the start until all
10 clones answered — 10 threads at once, each `crictl runp` of a pod with
`torpor.dev/actor: <clone id>` and `torpor.dev/restore-from: <golden
actor>`, `crictl create`, `crictl start` (restored from the golden
snapshot), `crictl inspectp`, `inc` at POD_IP:8080 until the first byte of
the answer, which must be 4 (golden counter + 1). The clones' memory CRC
must be the golden one (untimed). Then the 10 pods are removed.

Baseline (runc-v2): one `ctr run` container of the same actor (its own
network namespace), counted to 3, `ctr c checkpoint --rw --task` into one
checkpoint image, the task deleted; one repetition: 10 threads at once,
each `ctr c restore --rw --live <clone id> <image>` (runc restore from
containerd's unpacked copy of the image), `ctr task ls` for the restored
pid, then, in a thread that entered the clone's network namespace (setns),
`lo` brought up (an ioctl: runc restores a container's own network
namespace with its loopback down) and `inc` at 127.0.0.1:8080 until the
first byte of the answer, which must be 4. No pods: containerd's CRI has no restore, and
`ctr c restore` keeps the checkpointed container's namespaces (so the
baseline has no pod to create and no pod IP to look up; it does less).

**clone_10_actors_remote_ms** (p50 over repetitions, one unmeasured
warm-up; after clone_10_actors_ms, with its golden actor). The golden
snapshot is uploaded from node A; node B has no copy of it. One
repetition: as one of clone_10_actors_ms, on node B: the first clone's
checkout fetches the snapshot from S3, the other 9 wait for it and share
the local copy. Kept: the bytes node B's store fetched during the
repetition (`torporctl snapshots status`: `fetched_bytes`), to be compared
with the snapshot's size (once, not 10 times). Untimed, before each
repetition: node B's copy evicted. No baseline (runc-v2 has no object
tier).

    bench/cross_node.py [--runs N] [--clone-reps R]

Environment: TORPOR_BENCH_XN_RUNS (default 30), TORPOR_BENCH_CLONE_REPS
(default 5), TORPOR_BENCH_XN_ONLY (`resume` or `clone`: one of the two),
TORPOR_RIG_B_STATE / TORPOR_RIG_B_ROOT / TORPOR_RIG_B_CGROUP (node B, from
test/rig/env.sh), TORPOR_TORPORCTL, TORPOR_CTR.
"""

import argparse
import ctypes
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import RunError, check_counter, inc_first_byte, log, ms, now_ns, pct  # noqa: E402
import suspend_harness  # noqa: E402

MIB = 256
CLONES = 10
CLONE_MIB = 64
PORT = 8080
COMMIT_TIMEOUT_S = 300.0
NS = "default"
CLONE_ID_PREFIX = "bench-clone-"
CLONE_IMAGE_PREFIX = "localhost/torpor-bench/clone/"
CLONE_GOLDEN_COUNT = 3


# ------------------------------------------------------------------- nodes

class Node:
    """One node of the rig: its CRI endpoint, cgroup parent, store and shims."""

    def __init__(self, letter: str, state: str, root: str, cgroup: str):
        self.letter = letter
        self.state = state
        self.address = os.path.join(state, "containerd.sock")
        self.cgroup_root = "/" + cgroup.strip("/")
        # torpor-snapshotter's trash (test/rig/env.sh's snapshotter root)
        self.trash = os.path.join(root, "snapshotter", "store", "trash")
        if letter == "a":
            self.env = {}  # env.sh's (node A's) TORPOR_STORE_SOCKET etc.
        else:
            self.env = {"TORPOR_STORE_SOCKET": os.path.join(state, "torpor", "store.sock"),
                        "TORPOR_SHIM_SOCKET_DIR": os.path.join(state, "torpor", "shims"),
                        "TORPOR_STATE_ROOT": os.path.join(root, "torpor")}

    def crictl(self, *args, timeout=bench.CALL_TIMEOUT_S, check=True) -> str:
        return bench.crictl(*args, timeout=timeout, check=check, address=self.address)

    def crictl_json(self, *args):
        return bench.crictl_json(*args, address=self.address)

    def torporctl(self, *args, timeout=bench.LONG_CALL_TIMEOUT_S):
        """torporctl --json against the node's store and shims."""
        return bench.torporctl(*args, env=self.env, timeout=timeout)

    def wait_trash_emptied(self, limit_s: float = 60.0) -> None:
        """Until the store's background thread deleted what was removed
        (untimed): the rig's two nodes share one disk, which the deletion
        of a 256 MiB copy (cut down 4 MiB at a time) keeps busy for about a
        second; two real nodes do not share it."""
        deadline = time.monotonic() + limit_s
        while os.path.isdir(self.trash) and os.listdir(self.trash):
            if time.monotonic() > deadline:
                log(f"node {self.letter}: the store's trash is not empty after {limit_s:.0f} s")
                return
            time.sleep(0.05)

    def ready(self) -> bool:
        return bench.rig_ready(self.address, timeout=bench.CALL_TIMEOUT_S)

    def cleanup_pods(self) -> int:
        return bench.cleanup_bench_pods(self.address)

    def remove_snapshots(self, actor: str) -> None:
        try:
            snaps = self.torporctl("snapshots", "ls", actor) or []
        except (bench.CommandError, ValueError):
            return
        for s in snaps:
            try:
                self.torporctl("snapshots", "rm", s["snapshot"])
            except (bench.CommandError, ValueError) as e:
                log(f"cross_node: node {self.letter}: snapshots rm {s['snapshot']}: {e}")



def all_at_once(one, errors: list) -> int:
    """Runs one(i, t0) for the CLONES clones in threads started together;
    t0 (ns) is their common start. Raises if any of them recorded an error."""
    t0 = now_ns()
    threads = [threading.Thread(target=one, args=(i, t0)) for i in range(CLONES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RunError("; ".join(errors))
    return t0

def nodes():
    env_b = os.environ.get("TORPOR_RIG_ENV_NODE") == "b"
    a_state = os.environ.get("TORPOR_RIG_A_STATE" if env_b else "TORPOR_RIG_STATE", "/run/torpor-test")
    a_root = os.environ.get("TORPOR_RIG_A_ROOT" if env_b else "TORPOR_RIG_ROOT", "/var/lib/torpor-test")
    a_cg = os.environ.get("TORPOR_RIG_A_CGROUP" if env_b else "TORPOR_RIG_CGROUP", "torpor-test")
    a = Node("a", a_state, a_root, a_cg)
    b = Node("b", os.environ.get("TORPOR_RIG_B_STATE", a_state + "-b"),
             os.environ.get("TORPOR_RIG_B_ROOT", a_root + "-b"),
             os.environ.get("TORPOR_RIG_B_CGROUP", a_cg + "-b"))
    return a, b


class NodePod:
    """A torpor pod on a node (BenchPod's steps, bound to the node)."""

    def __init__(self, node: Node, prefix: str, annotations=None, name=None):
        self.node = node
        self.name = name or bench.unique_name(prefix)
        self.dir = os.path.join(bench.work_root(), f"{self.name}-{node.letter}")
        self.log_dir = os.path.join(self.dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        cfg = bench.pod_config(self.name, self.log_dir, annotations)
        cfg["linux"]["cgroup_parent"] = f"{node.cgroup_root}/pod-{self.name}"
        self.config_path = bench._write_json(self.dir, "pod.json", cfg)
        self.id = None

    def run(self) -> str:
        self.id = self.node.crictl("runp", "--runtime", bench.RUNTIMES[bench.TORPOR]["handler"], self.config_path).strip()
        return self.id

    def create_counter(self, mib: int, seed: int) -> str:
        cfg = bench.container_config("actor", ["counter", "--port", str(PORT), "--alloc-mib", str(mib), "--seed", str(seed)])
        cfg["linux"]["security_context"] = {"namespace_options": {"pid": 1}}
        path = bench._write_json(self.dir, "ctr.json", cfg)
        return self.node.crictl("create", "--no-pull", self.id, path, self.config_path).strip()

    def ip(self) -> str:
        return self.node.crictl_json("inspectp", "-o", "json", self.id)["status"]["network"]["ip"]

    def status(self) -> dict:
        return self.node.torporctl("status", self.id)[0]["actor"]

    def remove(self) -> None:
        if self.id:
            self.node.crictl("stopp", self.id, check=False)
            self.node.crictl("rmp", "-f", self.id, check=False)
            self.id = None
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_committed(node: Node, actor: str) -> dict:
    """The actor's newest snapshot once it is committed and local."""
    deadline = time.monotonic() + COMMIT_TIMEOUT_S
    while True:
        snaps = node.torporctl("snapshots", "ls", actor) or []
        if snaps:
            newest = max(snaps, key=lambda s: int(s["snapshot"].rsplit("@", 1)[1]))
            if newest["local"]:
                return newest
        if time.monotonic() > deadline:
            raise RunError(f"no committed snapshot of {actor} {COMMIT_TIMEOUT_S:.0f}s after the suspend")
        time.sleep(0.02)


def random_seed() -> int:
    return int.from_bytes(os.urandom(7), "little")


def start_counter(node: Node, prefix: str, mib: int, annotations) -> tuple:
    """An actor pod on `node`, running and answering: (pod, ip, counter, crc)."""
    pod = NodePod(node, prefix, annotations)
    try:
        pod.run()
        cid = pod.create_counter(mib, random_seed())
        node.crictl("start", cid)
        ip = pod.ip()
        bench.wait_actor(ip, error=RunError)
        counter = int(bench.actor_call(ip, ["get"], error=RunError)[0])
        crc = bench.actor_call(ip, ["sum"], error=RunError)[0]
        return pod, ip, counter, crc
    except BaseException:
        pod.remove()
        raise


def suspend_on(node: Node, pod: NodePod, actor: str) -> str:
    """torporctl suspend; the snapshot committed: its name."""
    reply = node.torporctl("suspend", pod.id)
    if str(reply[0]["actor"].get("state")).lower() != "suspended":
        raise RunError(f"after torporctl suspend the actor is {reply[0]['actor'].get('state')!r}")
    return wait_committed(node, actor)["snapshot"]


# ------------------------------------------------- resume_cross_node_256mib_ms

def cross_node_run(a: Node, b: Node) -> dict:
    actor = f"{bench.POD_NAMESPACE}/bench-xn-{uuid.uuid4().hex[:12]}"  # an actor of its pod's namespace
    ann = {"torpor.dev/actor": actor}
    pod_b = None
    try:
        pod_a, ip_a, _, _ = start_counter(a, "xn", MIB, ann)
        try:
            counter = int(bench.actor_call(ip_a, ["inc"], error=RunError)[0])
            crc = bench.actor_call(ip_a, ["sum"], error=RunError)[0]
            snap = suspend_on(a, pod_a, actor)
            a.torporctl("snapshots", "upload", snap, timeout=1800)
            a.torporctl("snapshots", "evict", snap)
        finally:
            pod_a.remove()
        left = [s for s in (a.torporctl("snapshots", "ls", actor) or []) if s["local"]]
        if left:
            raise RunError(f"node A still has a local copy: {left}")
        a.wait_trash_emptied()
        b.wait_trash_emptied()
        # TIMED, node B
        pod_b = NodePod(b, "xn", ann)
        t0 = now_ns()
        pod_b.run()
        t_runp = now_ns()
        cid = pod_b.create_counter(MIB, 1)  # the seed is not used: the memory is the snapshot's
        t_create = now_ns()
        b.crictl("start", cid)
        t_start = now_ns()
        ip = pod_b.ip()
        t_ip = now_ns()
        _, t1, got = inc_first_byte(ip, t0, retry_refused=True)
        check_counter(got, counter + 1)
        # untimed checks
        if bench.actor_call(ip, ["sum"], error=RunError)[0] != crc:
            raise RunError("the memory CRC on node B differs from the one before the suspend")
        st = pod_b.status()
        if st.get("recovered_from") != snap:
            raise RunError(f"node B's actor was not restored from {snap}: {st}")
        return {
            "ms": ms(t0, t1),
            "phases": {"crictl runp": ms(t0, t_runp), "crictl create": ms(t_runp, t_create),
                       "crictl start (fetch from S3 + restore)": ms(t_create, t_start),
                       "crictl inspectp": ms(t_start, t_ip),
                       "connect + inc + first byte": ms(t_ip, t1)},
            "shim_resume_ms": float(st.get("last_resume_ms") or 0),
        }
    finally:
        if pod_b is not None:
            pod_b.remove()
        b.remove_snapshots(actor)
        a.remove_snapshots(actor)


def measure_cross_node(a: Node, b: Node, runs: int, budget_s: float) -> dict:
    started = time.monotonic()
    samples, failures, err = [], [], None
    try:
        cross_node_run(a, b)  # warm-up, not kept
        tally = bench.run_rounds(
            "cross_node", {bench.TORPOR: lambda _i: cross_node_run(a, b)}, runs,
            deadline=started + budget_s, tolerate=True,
            on_sample=lambda _k, t: log(f"cross_node: run {len(t.samples)}: {t.samples[-1]['ms']:.0f} ms"),
        )[bench.TORPOR]
        samples, failures = tally.samples, tally.failures
        err = tally.error or tally.stopped
    except Exception as e:  # noqa: BLE001 - reported in results.json
        err = f"{type(e).__name__}: {e}"
        log(f"cross_node: {err}")
    vals = [s["ms"] for s in samples]
    phases = {k: pct([s["phases"][k] for s in samples], 50) for k in samples[0]["phases"]} if samples else None
    phases_p99 = {k: pct([s["phases"][k] for s in samples], 99) for k in samples[0]["phases"]} if samples else None
    if samples:
        phases["of which the shim's restore (last_resume_ms)"] = pct([s["shim_resume_ms"] for s in samples], 50)
    p99 = pct(vals, 99)
    return bench.entry(
        "resume_cross_node_256mib_ms", "ms", pct(vals, 50), None,
        goal="p99 <= 500 ms (absolute)", goal_met=(p99 is not None and p99 <= 500 and not failures),
        torpor_p99=p99, torpor_n=len(vals) or None,
        torpor_samples=[bench.rnd(x, 1) for x in vals] or None,
        torpor_phases_p50_ms=phases, torpor_phases_p99_ms=phases_p99,
        torpor_failures=failures or None,
        torpor_note=(f"{MIB} MiB actor suspended on node A, uploaded, evicted there, pod removed; "
                     f"a pod of the actor created on node B (crictl runp) until the first byte of "
                     f"the answer to a request at its pod IP; the snapshot is fetched from S3 "
                     f"(versitygw on loopback) by node B's store"),
        error=err if (err or failures or not vals) else None,
        baseline_na=True,
        baseline_error="containerd-shim-runc-v2 has no cross-node restore (its checkpoints are images "
                       "in one containerd's content store; moving one is a registry push/pull outside containerd)")


# ---------------------------------------------------------- clone_10_actors_ms

def clone_rep(a: Node, golden_actor: str, golden_crc: str) -> dict:
    """One repetition: CLONES clones of `golden_actor` on node `a`, at once."""
    pods = [NodePod(a, "clone", {"torpor.dev/actor": f"{bench.POD_NAMESPACE}/{CLONE_ID_PREFIX}{uuid.uuid4().hex[:12]}",
                                  "torpor.dev/restore-from": golden_actor}) for _ in range(CLONES)]
    done, errors, ips, phases = [None] * CLONES, [], [None] * CLONES, [None] * CLONES

    def one(i, t0):
        try:
            p = pods[i]
            p.run()
            t_runp = now_ns()
            cid = p.create_counter(CLONE_MIB, 1)
            t_create = now_ns()
            a.crictl("start", cid)
            t_start = now_ns()
            ips[i] = p.ip()
            t_ip = now_ns()
            _, t1, got = inc_first_byte(ips[i], t0, retry_refused=True)
            check_counter(got, CLONE_GOLDEN_COUNT + 1)
            done[i] = t1
            phases[i] = {"crictl runp": ms(t0, t_runp), "crictl create": ms(t_runp, t_create),
                         "crictl start (checkout + restore)": ms(t_create, t_start),
                         "crictl inspectp": ms(t_start, t_ip), "connect + inc + first byte": ms(t_ip, t1)}
        except BaseException as e:  # noqa: BLE001
            errors.append(f"clone {i}: {type(e).__name__}: {e}")

    try:
        t0 = all_at_once(one, errors)
        for i, ip in enumerate(ips):
            if bench.actor_call(ip, ["sum"], error=RunError)[0] != golden_crc:
                raise RunError(f"clone {i}: memory CRC differs from the golden actor's")
        return {"all": ms(t0, max(done)), "first": ms(t0, min(done)), "phases": phases}
    finally:
        for p in pods:
            p.remove()


class TorporClones:
    """The golden actor suspended on node A; `rep()` clones it 10 times."""

    def __init__(self, a: Node):
        self.a = a
        self.golden_actor = f"{bench.POD_NAMESPACE}/bench-golden-{uuid.uuid4().hex[:12]}"
        try:
            pod, ip, _, _ = start_counter(a, "golden", CLONE_MIB, {"torpor.dev/actor": self.golden_actor})
            try:
                for _ in range(CLONE_GOLDEN_COUNT):
                    bench.actor_call(ip, ["inc"], error=RunError)
                self.crc = bench.actor_call(ip, ["sum"], error=RunError)[0]
                self.snap = suspend_on(a, pod, self.golden_actor)
            finally:
                pod.remove()
        except BaseException:
            self.close()
            raise

    def rep(self) -> dict:
        return clone_rep(self.a, self.golden_actor, self.crc)

    def close(self) -> None:
        self.a.remove_snapshots(self.golden_actor)


class RemoteClones:
    """The golden actor of `golden` uploaded to S3; `rep()` clones it 10
    times on node B, whose store has no copy of it: the first clone's
    checkout fetches it, the others share that local copy. The bytes node
    B's store fetched during the repetition are kept; its copy is evicted
    after each (untimed)."""

    def __init__(self, golden: TorporClones, b: Node):
        self.golden, self.b = golden, b
        golden.a.torporctl("snapshots", "upload", golden.snap, timeout=1800)
        info = [s for s in golden.a.torporctl("snapshots", "ls", golden.golden_actor) or []
                if s["snapshot"] == golden.snap]
        if not info or not info[0].get("bytes"):
            raise RunError(f"{golden.snap} is not in node A's store after its upload: {info}")
        self.snapshot_bytes = int(info[0]["bytes"])
        self.evict()

    def fetched_bytes(self) -> int:
        return int(self.b.torporctl("snapshots", "status")["fetched_bytes"])

    def evict(self) -> None:
        """Node B's local copy of the golden snapshot dropped, if it has one
        (retried while the removed clones' leases are still let go)."""
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while True:
            local = [s for s in self.b.torporctl("snapshots", "ls", self.golden.golden_actor) or [] if s["local"]]
            if not local:
                return
            try:
                for s in local:
                    self.b.torporctl("snapshots", "evict", s["snapshot"])
            except bench.CommandError as e:
                if time.monotonic() > deadline:
                    raise RunError(f"node B cannot evict its copy of {self.golden.snap}: {e}") from e
                time.sleep(0.1)

    def rep(self) -> dict:
        self.evict()
        before = self.fetched_bytes()
        r = clone_rep(self.b, self.golden.golden_actor, self.golden.crc)
        r["fetched_bytes"] = self.fetched_bytes() - before
        return r

    def close(self) -> None:
        self.b.remove_snapshots(self.golden.golden_actor)


# the baseline: ctr c restore of one runc checkpoint, 10 at once

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000


def loopback_up() -> None:
    """`ip link set lo up` in the calling thread's network namespace (an
    ioctl; runc restores a container's own network namespace with lo down)."""
    import fcntl
    import socket
    import struct
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, siocgifflags, struct.pack("16sH14s", b"lo", 0, b""))
        flags = struct.unpack("16sH", ifr[:18])[1]
        if not flags & iff_up:
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


def in_netns(pid: int, fn):
    """fn() in a new thread that enters the network namespace of `pid`
    first: what it returns (or raises)."""
    out = {}

    def body():
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            out["r"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["e"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["r"]


def inc_in_netns(pid: int, t0: int) -> tuple:
    """In a new thread that enters the network namespace of `pid`: bring lo
    up, connect to 127.0.0.1:8080 (retried while refused), inc, first byte."""
    def inc():
        loopback_up()
        return inc_first_byte("127.0.0.1", t0, retry_refused=True)

    return in_netns(pid, inc)


def call_in_netns(pid: int, cmds) -> list:
    def call():
        bench.wait_actor("127.0.0.1", error=RunError)
        return bench.actor_call("127.0.0.1", cmds, error=RunError)

    return in_netns(pid, call)


def remove_container(cid: str) -> None:
    bench.remove_container(NS, cid)


def task_pid(cid: str) -> int:
    out = bench.ctr(NS, "task", "ls", check=True)
    for line in out.splitlines()[1:]:
        f = line.split()
        if f and f[0] == cid:
            return int(f[1])
    raise RunError(f"no task {cid} after the restore")


class BaselineClones:
    """One runc checkpoint of the actor; `rep()` restores it 10 times at once."""

    def __init__(self):
        self.golden = f"{CLONE_ID_PREFIX}golden-{uuid.uuid4().hex[:8]}"
        self.ref = f"{CLONE_IMAGE_PREFIX}{self.golden}:ckpt"
        self.made = []
        try:
            bench.ctr(NS, "run", "-d", "--runtime", bench.BASELINE_RUNTIME_TYPE,
                      "--cgroup", f"{bench.CGROUP_ROOT}/{self.golden}", bench.ACTOR_IMAGE, self.golden,
                      "/actor", "counter", "--port", str(PORT), "--alloc-mib", str(CLONE_MIB),
                      "--seed", str(random_seed()), timeout=120)
            self.made.append(self.golden)
            pid = task_pid(self.golden)
            call_in_netns(pid, ["inc"] * CLONE_GOLDEN_COUNT)
            self.crc = call_in_netns(pid, ["sum"])[0]
            bench.ctr(NS, "containers", "checkpoint", "--rw", "--task", self.golden, self.ref, timeout=300)
            remove_container(self.golden)
            self.made.remove(self.golden)
        except BaseException:
            self.close()
            raise

    def rep(self) -> dict:
        ids = [f"{CLONE_ID_PREFIX}{uuid.uuid4().hex[:12]}" for _ in range(CLONES)]
        done, errors, pids, phases = [None] * CLONES, [], [None] * CLONES, [None] * CLONES

        def one(i, t0):
            try:
                bench.ctr(NS, "containers", "restore", "--rw", "--live", ids[i], self.ref, timeout=300)
                t_rest = now_ns()
                self.made.append(ids[i])
                pids[i] = task_pid(ids[i])
                t_pid = now_ns()
                _, t1, got = inc_in_netns(pids[i], t0)
                check_counter(got, CLONE_GOLDEN_COUNT + 1)
                done[i] = t1
                phases[i] = {"ctr c restore --rw --live": ms(t0, t_rest), "ctr task ls": ms(t_rest, t_pid),
                             "setns + lo up + connect + inc + first byte": ms(t_pid, t1)}
            except BaseException as e:  # noqa: BLE001
                errors.append(f"clone {i}: {type(e).__name__}: {e}")

        try:
            t0 = all_at_once(one, errors)
            for i, p in enumerate(pids):
                if call_in_netns(p, ["sum"])[0] != self.crc:
                    raise RunError(f"clone {i}: memory CRC differs from the checkpointed actor's")
            return {"all": ms(t0, max(done)), "first": ms(t0, min(done)), "phases": phases}
        finally:
            for cid in ids:
                if cid in self.made:
                    remove_container(cid)
                    self.made.remove(cid)
            # containerd's unpacked copies of the image (their cgroup image names the golden id)
            bench.remove_restore_dirs(self.golden)

    def close(self) -> None:
        for cid in list(self.made):
            remove_container(cid)
        bench.ctr(NS, "images", "rm", "--sync", self.ref, check=False, timeout=120)
        bench.remove_restore_dirs(CLONE_ID_PREFIX)


def measure_clone(a: Node, b: Node, reps: int, budget_s: float) -> list:
    """Both runtimes, repetitions alternating (torpor first on even ones),
    one unmeasured warm-up repetition each; then torpor's clones on node B
    from the object tier (one warm-up). Two entries."""
    started = time.monotonic()
    samples = {bench.TORPOR: [], bench.BASELINE: []}
    errs = {bench.TORPOR: None, bench.BASELINE: None}
    subjects = {}
    for key, make in ((bench.TORPOR, lambda: TorporClones(a)), (bench.BASELINE, BaselineClones)):
        try:
            subjects[key] = make()
            subjects[key].rep()  # warm-up
        except Exception as e:  # noqa: BLE001 - reported in results.json
            errs[key] = f"{type(e).__name__}: {e}"
            log(f"clone: {key}: {errs[key]}")
            if key in subjects:
                subjects.pop(key).close()
    remote_samples, remote_err, remote = [], None, None
    try:
        tallies = bench.run_rounds(
            "clone", {key: (lambda _i, sub=sub: sub.rep()) for key, sub in subjects.items()}, reps,
            deadline=started + budget_s * 2 / 3, unit="repetitions",
            on_sample=lambda key, t: log(f"clone: {key} repetition {len(t.samples)}: "
                                         f"all 10 in {t.samples[-1]['all']:.0f} ms"))
        for key, t in tallies.items():
            samples[key] = t.samples
            errs[key] = errs[key] or t.error or t.stopped
        if bench.TORPOR not in subjects:
            raise RunError(f"no golden actor: {errs[bench.TORPOR]}")
        remote = RemoteClones(subjects[bench.TORPOR], b)
        remote.rep()  # warm-up
        t = bench.run_rounds(
            "clone_remote", {bench.TORPOR: lambda _i: remote.rep()}, reps,
            deadline=started + budget_s, unit="repetitions",
            on_sample=lambda _k, t: log(f"clone_remote: repetition {len(t.samples)}: all 10 in "
                                        f"{t.samples[-1]['all']:.0f} ms, "
                                        f"{t.samples[-1]['fetched_bytes'] / 2**20:.1f} MiB fetched"))[bench.TORPOR]
        remote_samples, remote_err = t.samples, t.error or t.stopped
    except Exception as e:  # noqa: BLE001 - reported in results.json
        remote_err = f"{type(e).__name__}: {e}"
        log(f"clone_remote: {remote_err}")
    finally:
        if remote is not None:
            remote.close()
        for sub in subjects.values():
            sub.close()
    return [clone_entry(samples[bench.TORPOR], errs[bench.TORPOR], samples[bench.BASELINE], errs[bench.BASELINE]),
            remote_clone_entry(remote_samples, remote_err, remote.snapshot_bytes if remote else None)]


def clone_phases(samples) -> dict:
    """p50 per step over every clone of every repetition."""
    per = [p for s in samples for p in s["phases"]]
    return {k: pct([p[k] for p in per], 50) for k in per[0]} if per else None


def clone_entry(t_samples, t_err, b_samples, b_err) -> dict:
    t = [s["all"] for s in t_samples]
    b = [s["all"] for s in b_samples]
    return bench.entry(
        "clone_10_actors_ms", "ms", pct(t, 50), pct(b, 50),
        goal="no slower than runc-v2 (ratio <= 1.0)", goal_max_ratio=1.0,
        torpor_p99=pct(t, 99), torpor_n=len(t) or None,
        torpor_samples=[bench.rnd(x, 1) for x in t] or None,
        torpor_first_answer_p50_ms=pct([s["first"] for s in t_samples], 50),
        torpor_phases_p50_ms=clone_phases(t_samples),
        torpor_note=(f"10 pods created at once (crictl runp/create/start/inspectp), each a new actor with "
                     f"torpor.dev/restore-from a golden {CLONE_MIB} MiB actor's snapshot in node A's store, "
                     f"until all 10 answered a request at their pod IPs"),
        baseline_p99=pct(b, 99), baseline_n=len(b) or None,
        baseline_samples=[bench.rnd(x, 1) for x in b] or None,
        baseline_first_answer_p50_ms=pct([s["first"] for s in b_samples], 50),
        baseline_phases_p50_ms=clone_phases(b_samples),
        baseline_note=("10 x ctr c restore --rw --live of one runc checkpoint at once, until all 10 answered "
                       "in their network namespaces (lo brought up by the bench; no pods: containerd's CRI "
                       "has no restore)"),
        error=t_err if (t_err or not t) else None,
        baseline_error=b_err if (b_err or not b) else None)


def remote_clone_entry(samples, err, snapshot_bytes) -> dict:
    t = [s["all"] for s in samples]
    fetched = [s["fetched_bytes"] for s in samples]
    mib = lambda n: bench.rnd(n / 2**20, 1)  # noqa: E731
    fetched_note = (f"node B's store fetched {mib(pct(fetched, 50))} MiB per repetition (p50; max "
                    f"{mib(max(fetched))}) for 10 clones of a {mib(snapshot_bytes)} MiB snapshot"
                    if fetched and snapshot_bytes else "")
    return bench.entry(
        "clone_10_actors_remote_ms", "ms", pct(t, 50), None,
        torpor_p99=pct(t, 99), torpor_n=len(t) or None,
        torpor_samples=[bench.rnd(x, 1) for x in t] or None,
        torpor_first_answer_p50_ms=pct([s["first"] for s in samples], 50),
        torpor_phases_p50_ms=clone_phases(samples),
        torpor_fetched_bytes=fetched or None, snapshot_bytes=snapshot_bytes,
        torpor_note=(f"{fetched_note}; as clone_10_actors_ms, on node B, the golden snapshot uploaded from node "
                     f"A and not on node B (evicted after each repetition): the first checkout fetches it "
                     f"from S3, the other 9 share its local copy"),
        error=err if (err or not t) else None,
        baseline_na=True,
        baseline_error="containerd-shim-runc-v2 has no object tier")


def settle_memory_cgroups() -> None:
    """Drops the page cache (untimed), which frees the memory cgroups of
    the pods removed before: each lives on, dying, while page cache is
    charged to it, and hundreds of them (the clones leave about 15 per
    repetition) slow every pod and container made after."""
    before = suspend_harness.memory_cgroups()
    suspend_harness.drop_page_cache()
    log(f"page cache dropped: memory cgroups {before} -> {suspend_harness.memory_cgroups()} (dying ones included)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("TORPOR_BENCH_XN_RUNS", str(bench.MIN_RUNS))))
    ap.add_argument("--clone-reps", type=int, default=int(os.environ.get("TORPOR_BENCH_CLONE_REPS", "5")))
    args = ap.parse_args()
    only = os.environ.get("TORPOR_BENCH_XN_ONLY", "")
    budget = float(os.environ.get("TORPOR_BENCH_SCRIPT_TIMEOUT", "420")) - 60
    a, b = nodes()
    entries = []
    with bench.bench_session():
        try:
            if not b.ready():
                raise SystemExit(f"bench: node B is not up at {b.address} (test/rig/up.sh brings up both nodes)")
            bench.ensure_torporctl()
            if only in ("", "clone"):
                settle_memory_cgroups()
                entries += measure_clone(a, b, args.clone_reps, budget / 3 if only == "" else budget)
                bench.merge_results(entries[-2:])
            if only in ("", "resume"):
                settle_memory_cgroups()
                left = budget - (time.monotonic() - START)
                entries.append(measure_cross_node(a, b, args.runs, left))
                bench.merge_results(entries[-1:])
        finally:
            n = b.cleanup_pods()
            if n:
                log(f"removed {n} leftover benchmark pod(s) on node B")
    for e in entries:
        log(f"{e['name']}: torpor={e['torpor']} (p99 {e.get('torpor_p99')}) baseline={e['baseline']} {e['unit']}"
            + (f"  [error: {e['error']}]" if e.get("error") else "")
            + (f"  [baseline: {e['baseline_error']}]" if e.get("baseline_error") else ""))
    return 0


START = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
