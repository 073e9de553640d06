#!/usr/bin/env python3
"""checkpoint_<size>_ms / restore_<size>_ms: checkpoint and restore of a
stateful actor through containerd's standard path, torpor vs runc-v2, for
actors holding 16 MiB, 256 MiB and 1 GiB of live, distinct, non-zero memory.

What one run does (per runtime; the same runc and CRIU serve both shims):

1. untimed: `ctr run -d --runtime <runtime_type> --with-ns network:<pod netns>`
   of `/actor counter --port 8080 --alloc-mib N` in a pod of that runtime
   (`crictl runp`), wait until it answers at the pod IP, `inc` it three times
   and read the CRC of its memory (`sum`);
2. TIMED checkpoint: `ctr c checkpoint --rw --task <id> <ref>` (ctr pauses
   the task, the shim runs `runc checkpoint --leave-running` = CRIU dump,
   containerd tars the CRIU image and the rw layer into its content store and
   makes an image, ctr resumes the task); wall time of the ctr command;
3. untimed: SIGKILL, delete the task, remove the container;
4. TIMED restore: `ctr c restore --rw --live <id> <ref>` (new container from
   the checkpoint image, rw layer applied, containerd unpacks the CRIU image
   into a temporary dir, the shim creates the task and starts it with
   `runc restore` = CRIU restore); wall time of the ctr command, which returns
   once the task is started (the restored process runs);
5. untimed: checks the restored actor at the pod IP (counter still 3, memory
   CRC unchanged; a mismatch fails the run), then removes the task, the
   container and the checkpoint image (`ctr images rm --sync`, so the next run
   starts with the content store as before).

The restore reads the CRIU image right after containerd wrote it (page cache
warm), as a restore on the same node shortly after a checkpoint would.
containerd's own share (content store, tar, snapshot) is the same for both
runtimes. Runtimes alternate run by run (torpor first on even runs, runc-v2
on odd ones); each runtime gets one unmeasured warm-up run first. Value:
median of the runs (>= 10 per size and runtime); p99, min, max and all
samples are kept.

    bench/checkpoint_restore.py [--runs N] [--sizes 16,256,1024]

Environment: TORPOR_BENCH_CKPT_RUNS (default 10), TORPOR_BENCH_CKPT_SIZES_MIB
(default "16,256,1024"), TORPOR_CTR (ctr binary).
"""

import argparse
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import BASELINE, TORPOR, BenchPod, Stopwatch, log, size_name  # noqa: E402

NAMESPACE = "default"
RUNTIME_TYPES = {
    TORPOR: os.environ.get("TORPOR_BENCH_TORPOR_RUNTIME_TYPE", "io.containerd.torpor.v1"),
    BASELINE: os.environ.get("TORPOR_BENCH_BASELINE_RUNTIME_TYPE", "io.containerd.runc.v2"),
}
PORT = 8080
ID_PREFIX = "bench-ckpt-"
IMAGE_PREFIX = "localhost/torpor-bench/checkpoint/"
MIN_RUNS = 10
# generous limits: these are for liveness, not measurements
CTR_TIMEOUT_S = float(os.environ.get("TORPOR_BENCH_CKPT_CALL_TIMEOUT", "300"))
READY_TIMEOUT_S = 180.0


# ---------------------------------------------------------------- ctr / actor

def ctr(*args, timeout=CTR_TIMEOUT_S, check=True) -> str:
    return bench.ctr(NAMESPACE, *args, timeout=timeout, check=check)


def task_status(cid: str):
    return bench.task_status(NAMESPACE, cid)


def remove_container(cid: str) -> None:
    """Kill, delete and remove a container of the bench (best effort)."""
    ctr("task", "kill", "-a", "-s", "SIGKILL", cid, check=False, timeout=60)
    deadline = time.monotonic() + 60
    while task_status(cid) not in (None, "STOPPED") and time.monotonic() < deadline:
        time.sleep(0.02)
    for _ in range(50):
        if task_status(cid) is None:
            break
        ctr("task", "delete", "-f", cid, check=False, timeout=60)
        time.sleep(0.05)
    ctr("containers", "rm", cid, check=False, timeout=60)


def remove_image(ref: str) -> None:
    ctr("images", "rm", "--sync", ref, check=False, timeout=120)


def cleanup_leftovers() -> None:
    """Containers and checkpoint images of an interrupted earlier run."""
    for cid in ctr("containers", "ls", "-q", check=False).split():
        if cid.startswith(ID_PREFIX):
            remove_container(cid)
    for ref in ctr("images", "ls", "-q", check=False).split():
        if ref.startswith(IMAGE_PREFIX) or ref.startswith(f"containerd.io/checkpoint/{ID_PREFIX}"):
            remove_image(ref)


def actor_call(ip: str, cmds, timeout=30.0) -> list:
    """Line protocol of `/actor counter`: one reply line per command."""
    return bench.actor_call(ip, cmds, timeout=timeout, port=PORT, error=RuntimeError)


def wait_actor(ip: str, timeout=READY_TIMEOUT_S) -> None:
    bench.wait_actor(ip, timeout=timeout, port=PORT, error=RuntimeError)


class NetPod:
    """A pod of one runtime whose network namespace the bench's `ctr run`
    containers join, so a restored actor answers at the pod IP."""

    def __init__(self, key: str):
        self.pod = BenchPod(key, prefix="ckpt")
        self.pod.run()
        info = bench.crictl_json("inspectp", "-o", "json", self.pod.id)
        self.ip = info["status"]["network"]["ip"]
        nss = info["info"]["runtimeSpec"]["linux"]["namespaces"]
        self.netns = next(n["path"] for n in nss if n["type"] == "network")

    def remove(self):
        self.pod.remove()


def one_run(key: str, pod: NetPod, mib: int) -> tuple:
    """One checkpoint + restore of an actor holding `mib` MiB; returns (ckpt_ms, restore_ms)."""
    cid = f"{ID_PREFIX}{key}-{size_name(mib)}-{uuid.uuid4().hex[:8]}"
    ref = f"{IMAGE_PREFIX}{cid}:1"
    try:
        # (a cgroup below the pod's, which the rig's down.sh removes, not
        # containerd's default /<namespace>/<id> at the hierarchies' roots)
        ctr("run", "-d", "--runtime", RUNTIME_TYPES[key], "--with-ns", f"network:{pod.netns}",
            "--cgroup", f"{bench.CGROUP_ROOT}/pod-{pod.pod.name}/{cid}",
            bench.ACTOR_IMAGE, cid, "/actor", "counter", "--port", str(PORT), "--alloc-mib", str(mib))
        wait_actor(pod.ip)
        replies = actor_call(pod.ip, ["inc", "inc", "inc", "sum"])
        if replies[:3] != ["1", "2", "3"]:
            raise RuntimeError(f"fresh actor answered {replies}")
        crc = replies[3]

        with Stopwatch() as sw:
            ctr("containers", "checkpoint", "--rw", "--task", cid, ref)
        ckpt_ms = sw.ms

        remove_container(cid)

        with Stopwatch() as sw:
            ctr("containers", "restore", "--rw", "--live", cid, ref)
        restore_ms = sw.ms

        got = actor_call(pod.ip, ["get", "sum"])
        if got != ["3", crc]:
            raise RuntimeError(f"restored actor answered get/sum {got}, expected ['3', {crc!r}]")
        return ckpt_ms, restore_ms
    finally:
        remove_container(cid)
        remove_image(ref)


# ------------------------------------------------------------------ measure

def measure(runs: int, sizes) -> list:
    samples = {(key, mib): {"checkpoint": [], "restore": []} for key in (TORPOR, BASELINE) for mib in sizes}
    errors = {}  # (key, mib) -> message; a runtime that failed a size is not run again for it
    pods = {}
    setup_errors = {}
    try:
        for key in (TORPOR, BASELINE):
            try:
                pods[key] = NetPod(key)
            except Exception as e:  # noqa: BLE001 - reported in results.json
                setup_errors[key] = f"pod for the actor: {e}"
                log(f"checkpoint_restore {key}: {setup_errors[key]}")
        # warm-up: first shim start, image layers and CRIU in the page cache
        for key in pods:
            try:
                one_run(key, pods[key], min(sizes))
            except Exception as e:  # noqa: BLE001
                log(f"checkpoint_restore {key}: warm-up run failed: {e}")
        for mib in sizes:
            t0 = time.monotonic()
            subjects = {key: (lambda _i, key=key: one_run(key, pods[key], mib))
                        for key in (TORPOR, BASELINE) if key in pods and key not in setup_errors}
            tallies = bench.run_rounds(
                f"checkpoint_restore {size_name(mib)}", subjects, runs,
                error_text=lambda _k, i, e: f"{size_name(mib)} run {i + 1}/{runs} failed: {e}")
            for key, t in tallies.items():
                if t.error:
                    errors[(key, mib)] = t.error
                samples[(key, mib)]["checkpoint"] = [c for c, _ in t.samples]
                samples[(key, mib)]["restore"] = [r for _, r in t.samples]
            log(f"checkpoint_restore: {size_name(mib)} done, {runs} runs per runtime "
                f"in {time.monotonic() - t0:.0f}s")
    finally:
        for p in pods.values():
            try:
                p.remove()
            except Exception as e:  # noqa: BLE001
                log(f"removing pod: {e}")

    entries = []
    for mib in sizes:
        for phase in ("checkpoint", "restore"):
            def err(key):
                return setup_errors.get(key) or errors.get((key, mib))

            def val(key, p):
                vals = samples[(key, mib)][phase]
                return None if err(key) or not vals else bench.rnd(bench.percentile(vals, p), 1)

            extra = {}
            for key in (TORPOR, BASELINE):
                vals = samples[(key, mib)][phase]
                ok = not err(key) and vals
                extra[f"{key}_p99"] = val(key, 99)
                extra[f"{key}_n"] = len(vals) if ok else None
                extra[f"{key}_min"] = bench.rnd(min(vals), 1) if ok else None
                extra[f"{key}_max"] = bench.rnd(max(vals), 1) if ok else None
                extra[f"{key}_samples_ms"] = [bench.rnd(v, 1) for v in vals] or None
            what = ("`ctr c checkpoint --rw --task` (pause, CRIU dump, image into the content store, resume)"
                    if phase == "checkpoint" else
                    "`ctr c restore --rw --live` until the task is started (container from the image, "
                    "CRIU restore)")
            entries.append(bench.entry(
                f"{phase}_{size_name(mib)}_ms", "ms",
                torpor=val(TORPOR, 50), baseline=val(BASELINE, 50),
                lower_is_better=True,
                goal="parity with runc-v2, same runc + CRIU (ratio <= 1.10)", goal_max_ratio=1.10,
                error=err(TORPOR), baseline_error=err(BASELINE),
                statistic=f"median of {runs} runs: wall time of {what}; actor `/actor counter "
                          f"--alloc-mib {mib}` in a pod's network namespace",
                **extra))
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("TORPOR_BENCH_CKPT_RUNS", str(MIN_RUNS))))
    ap.add_argument("--sizes", default=os.environ.get("TORPOR_BENCH_CKPT_SIZES_MIB", "16,256,1024"),
                    help="actor memory sizes in MiB, comma-separated")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.runs < MIN_RUNS:
        log(f"checkpoint_restore: WARNING: {args.runs} runs per size is below the required {MIN_RUNS}")
    with bench.bench_session():
        cleanup_leftovers()
        try:
            entries = measure(args.runs, sizes)
        finally:
            cleanup_leftovers()
    bench.merge_results(entries)
    for e in entries:
        log(f"{e['name']}: torpor={e['torpor']} baseline={e['baseline']} {e['unit']}"
            + (f"  [torpor error: {e['error']}]" if e.get("error") else "")
            + (f"  [baseline error: {e['baseline_error']}]" if e.get("baseline_error") else ""))


if __name__ == "__main__":
    main()
