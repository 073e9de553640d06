#!/usr/bin/env python3
"""shim_rss_mib: resident memory of the shims per pod.

For each runtime in turn: start N pods (one `/actor sleep` container each),
let them settle, then sum VmRSS (/proc/<pid>/status) over the shim processes
of those pods (containerd-shim-torpor-v1 resp. containerd-shim-runc-v2 whose
command line carries the rig's containerd address and one of the pods' ids),
and divide by N. PSS (smaps_rollup, shared pages split between the sharers)
is kept as an extra field. The pods are removed before the next runtime.

    bench/shim_rss.py [--pods N] [--settle SECONDS]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import BASELINE, TORPOR, BenchPod, log  # noqa: E402


def measure_one(key: str, n: int, settle: float) -> dict:
    pods = []
    try:
        for i in range(n):
            pod = BenchPod(key, prefix="rss")
            pods.append(pod)
            pod.run()
            pod.start_container("main", ["sleep"])
        time.sleep(settle)
        ids = {p.id for p in pods} | {c for p in pods for c in p.containers}
        pids, every = bench.shims_of(key, ids)
        note = None
        if not pids:
            # A shim that does not carry the pod/container id on its command
            # line: count every rig shim of this binary (the bench's pods are
            # normally the only ones on the rig).
            pids, note = every, "shims matched by binary and rig address only"
        if not pids:
            raise RuntimeError(f"no {bench.RUNTIMES[key]['shim']} process of the rig found "
                               f"with {n} pods running")
        rss = [bench.proc_status_kib(p, "VmRSS") or 0 for p in pids]
        pss = [bench.proc_pss_kib(p) or 0 for p in pids]
        return {
            "per_pod_mib": sum(rss) / 1024 / n,
            "pss_per_pod_mib": sum(pss) / 1024 / n,
            "shim_processes": len(pids),
            "total_rss_mib": sum(rss) / 1024,
            "note": note,
        }
    finally:
        for pod in pods:
            try:
                pod.remove()
            except bench.CommandError as e:
                log(f"removing {pod.name}: {e}")


def measure(n: int, settle: float) -> list:
    res, errors = {}, {}
    for key in (BASELINE, TORPOR):
        try:
            res[key] = measure_one(key, n, settle)
            log(f"shim_rss {key}: {res[key]['shim_processes']} shim process(es), "
                f"{res[key]['total_rss_mib']:.1f} MiB RSS for {n} pods")
        except Exception as e:  # noqa: BLE001 - reported in results.json
            errors[key] = f"{type(e).__name__}: {e}"
            log(f"shim_rss {key} ({bench.RUNTIMES[key]['handler']}): {errors[key]}")

    def get(key, field, nd=2):
        return bench.rnd(res[key][field], nd) if key in res else None

    extra = {}
    for key in (TORPOR, BASELINE):
        extra[f"{key}_pss_mib"] = get(key, "pss_per_pod_mib")
        extra[f"{key}_shim_processes"] = res[key]["shim_processes"] if key in res else None
        extra[f"{key}_total_rss_mib"] = get(key, "total_rss_mib", 1)
        if key in res and res[key]["note"]:
            extra[f"{key}_note"] = res[key]["note"]
    return [bench.entry(
        "shim_rss_mib", "MiB",
        torpor=get(TORPOR, "per_pod_mib"), baseline=get(BASELINE, "per_pod_mib"),
        lower_is_better=True,
        goal="at most half of runc-v2's (ratio <= 0.5)", goal_max_ratio=0.5,
        error=errors.get(TORPOR), baseline_error=errors.get(BASELINE),
        statistic=f"sum of shim VmRSS / {n} pods (one /actor sleep container each)",
        pods=n, **extra)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=int(os.environ.get("TORPOR_BENCH_RSS_PODS", "20")))
    ap.add_argument("--settle", type=float, default=float(os.environ.get("TORPOR_BENCH_SETTLE", "3")))
    args = ap.parse_args()
    with bench.bench_session():
        entries = measure(args.pods, args.settle)
    bench.merge_results(entries)
    for e in entries:
        log(f"{e['name']}: torpor={e['torpor']} baseline={e['baseline']} {e['unit']}"
            + (f"  [torpor error: {e['error']}]" if e.get("error") else ""))


if __name__ == "__main__":
    main()
