#!/usr/bin/env python3
"""pod_start_ms: time from `crictl runp` through `crictl create` + `crictl start`
until `crictl inspect` reports the container Running, one pod at a time.

The runtimes are interleaved (torpor, baseline, torpor, ...) so that drift on
the machine (page cache, other load) hits both alike; each runtime first gets
one unmeasured warm-up pod. Every pod is stopped and removed (untimed) before
the next one starts.

    bench/pod_start.py [--pods N]      (default 20, env TORPOR_BENCH_PODS)
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import BASELINE, TORPOR, BenchPod, Stopwatch, log  # noqa: E402


def one_pod(runtime_key: str) -> dict:
    """Starts one pod with one `/actor sleep` container; returns timings (ms)."""
    pod = BenchPod(runtime_key, prefix="start")
    try:
        t = {}
        t0 = time.perf_counter_ns()
        with Stopwatch() as sw:
            pod.run()
        t["runp"] = sw.ms
        with Stopwatch() as sw:
            cid = pod.create(bench.container_config("main", ["sleep"]))
        t["create"] = sw.ms
        with Stopwatch() as sw:
            pod.start(cid)
        t["start"] = sw.ms
        with Stopwatch() as sw:
            bench.wait_running(cid)
        t["running"] = sw.ms
        t["total"] = (time.perf_counter_ns() - t0) / 1e6
        return t
    finally:
        try:
            pod.remove()
        except bench.CommandError as e:
            log(f"removing {pod.name}: {e}")


def measure(n: int) -> list:
    samples = {TORPOR: [], BASELINE: []}
    errors = {}
    for key in (TORPOR, BASELINE):  # warm-up: first shim exec, image layers in cache
        try:
            one_pod(key)
        except Exception as e:  # noqa: BLE001 - reported in results.json
            errors[key] = f"warm-up pod failed: {e}"
            log(f"pod_start {key} ({bench.RUNTIMES[key]['handler']}): {errors[key]}")
    tallies = bench.run_rounds(
        "pod_start", {key: (lambda _i, key=key: one_pod(key)) for key in (TORPOR, BASELINE) if key not in errors},
        n, alternate=False, error_text=lambda _k, i, e: f"pod {i + 1}/{n} failed: {e}",
        on_round=lambda i: log(f"pod_start: {i}/{n} rounds") if i % 5 == 0 else None)
    for key, t in tallies.items():
        samples[key] = t.samples
        if t.error:
            errors[key] = t.error

    def stat(key, phase, p):
        vals = [s[phase] for s in samples[key]]
        return bench.rnd(bench.percentile(vals, p), 1) if vals and key not in errors else None

    extra = {}
    for key in (TORPOR, BASELINE):
        extra[f"{key}_p99"] = stat(key, "total", 99)
        extra[f"{key}_n"] = len(samples[key]) if key not in errors else None
        phases = {ph: stat(key, ph, 50) for ph in ("runp", "create", "start", "running")}
        extra[f"{key}_phases_p50_ms"] = phases if key not in errors else None
        extra[f"{key}_samples_ms"] = [bench.rnd(s["total"], 1) for s in samples[key]] or None

    return [bench.entry(
        "pod_start_ms", "ms",
        torpor=stat(TORPOR, "total", 50), baseline=stat(BASELINE, "total", 50),
        lower_is_better=True,
        goal="no slower than runc-v2 (ratio <= 1.0)", goal_max_ratio=1.0,
        error=errors.get(TORPOR), baseline_error=errors.get(BASELINE),
        statistic="p50 of %d sequential pods: crictl runp + create + start until Running" % n,
        **extra)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=int(os.environ.get("TORPOR_BENCH_PODS", "40")))
    args = ap.parse_args()
    with bench.bench_session():
        entries = measure(args.pods)
    bench.merge_results(entries)
    for e in entries:
        log(f"{e['name']}: torpor={e['torpor']} baseline={e['baseline']} {e['unit']}"
            + (f"  [torpor error: {e['error']}]" if e.get("error") else ""))


if __name__ == "__main__":
    main()
