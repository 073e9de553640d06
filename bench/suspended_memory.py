#!/usr/bin/env python3
"""suspended_actor_mib: host memory per suspended actor, over N suspended
torpor actors (default 100; `/actor counter --alloc-mib 16` each, suspended
with `torporctl suspend`).

Per actor: the PSS of its shim (smaps_rollup: pages shared between the
shims split among them) plus what stays charged to its pod's memory cgroup
(`memory.usage_in_bytes` of the pod's cgroup, v1; it holds the pause
process and whatever page cache and kernel memory the pod still has). The
entry's value is the mean over the actors; the shim and pod parts are kept
apart in the details. The baseline is the same N pods with runc-v2, their
actors checkpointed and deleted by `ctr` (`ctr c checkpoint --rw --task` +
`ctr t delete -f`): what a stopped runc pod keeps (its shim and its pause
process). Goal: <= 2 MiB per suspended actor.

    bench/suspended_memory.py [--actors N]

Environment: TORPOR_BENCH_SUSPENDED_ACTORS (100).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import BASELINE, TORPOR, RunError, TorporActor, log, pct  # noqa: E402
import suspend_harness  # noqa: E402

GOAL = "<= 2 MiB per suspended actor (absolute)"
GOAL_MAX = 2.0
MIB = 16


def pod_cgroup_bytes(pod_name: str):
    """memory.usage_in_bytes of the pod's memory cgroup (v1), or
    memory.current (v2); None when neither is found."""
    rel = f"{bench.CGROUP_ROOT}/pod-{pod_name}".lstrip("/")
    for p in (f"/sys/fs/cgroup/memory/{rel}/memory.usage_in_bytes", f"/sys/fs/cgroup/{rel}/memory.current"):
        try:
            with open(p) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            continue
    return None


def shim_pss_kib(key: str, ids: set) -> float:
    mine, _ = bench.shims_of(key, ids)
    return sum(bench.proc_pss_kib(pid) or 0 for pid in mine)


def measure(key: str, n: int) -> dict:
    actors = []
    try:
        for i in range(n):
            a = TorporActor(MIB) if key == TORPOR else suspend_harness.BaselineActor(MIB)
            actors.append(a)
            if key == TORPOR:
                rec = a.ctl("suspend", a.pod.id)[0]["actor"]
                if str(rec.get("state")).lower() != "suspended":
                    raise RunError(f"after torporctl suspend the actor is {rec.get('state')!r}")
            else:
                a.suspend()
            if (i + 1) % 20 == 0:
                log(f"suspended_memory {key}: {i + 1} actors suspended")
        if key == TORPOR:
            for a in actors:
                a.wait_settled()
        ids = {a.pod.id for a in actors} | {c for a in actors for c in a.pod.containers}
        ids |= {a.cid for a in actors if getattr(a, "cid", None)}
        shims_mib = shim_pss_kib(key, ids) / 1024
        pods = [pod_cgroup_bytes(a.pod.name) for a in actors]
        missing = sum(1 for p in pods if p is None)
        if missing:
            raise RunError(f"{missing} of {n} pod memory cgroups not found below {bench.CGROUP_ROOT}")
        pods_mib = [p / (1 << 20) for p in pods]
        return {"per_actor_mib": (shims_mib + sum(pods_mib)) / n, "shim_pss_per_actor_mib": shims_mib / n,
                "pod_charged_p50_mib": pct(pods_mib, 50), "pod_charged_max_mib": max(pods_mib)}
    finally:
        for a in actors:
            try:
                a.remove()
            except Exception as e:  # noqa: BLE001
                log(f"suspended_memory: removing an actor: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int, default=int(os.environ.get("TORPOR_BENCH_SUSPENDED_ACTORS", "100")))
    args = ap.parse_args()
    res, errors = {}, {}
    with bench.bench_session():
        bench.ensure_torporctl()
        for key in (TORPOR, BASELINE):
            try:
                res[key] = measure(key, args.actors)
                log(f"suspended_memory {key}: {res[key]}")
            except Exception as e:  # noqa: BLE001 - reported in results.json
                errors[key] = f"{type(e).__name__}: {e}"
                log(f"suspended_memory {key}: {errors[key]}")
    extra = {}
    for key in (TORPOR, BASELINE):
        for k, v in res.get(key, {}).items():
            if k != "per_actor_mib":
                extra[f"{key}_{k}"] = bench.rnd(v, 2)
    t = res.get(TORPOR, {}).get("per_actor_mib")
    extra["goal_met"] = None if t is None else t <= GOAL_MAX
    e = bench.entry("suspended_actor_mib", "MiB",
                    torpor=bench.rnd(t, 2) if t is not None else None,
                    baseline=bench.rnd(res[BASELINE]["per_actor_mib"], 2) if BASELINE in res else None,
                    lower_is_better=True, goal=GOAL, error=errors.get(TORPOR), baseline_error=errors.get(BASELINE),
                    statistic=(f"mean over {args.actors} suspended actors of (shim PSS + pod memory cgroup usage); "
                               f"runc-v2: the same pods with their actor checkpointed and deleted by ctr"),
                    actors=args.actors, **extra)
    bench.merge_results([e])
    log(f"suspended_actor_mib: torpor={e['torpor']} baseline={e['baseline']} MiB")


if __name__ == "__main__":
    main()
