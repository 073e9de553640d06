#!/usr/bin/env python3
"""actors_per_node: how many actors requesting 512Mi each the scheduler
places on a small node (the test cluster's node-b: 4 GiB allocatable
memory), torpor against runc, on the same node allocatable.

It runs the cluster test that measures it (tests/k8s_native.rs
`density_sleeping_actors_fit_many_times_what_runc_fits`, on a plain rig and
cluster of its own with torpor installed by `kubectl apply -k`, through
test/rig/run-tests.sh) and reads the counts the test writes:

- runc: a StatefulSet of N pods (`Parallel`), each requesting 512Mi; the
  scheduler places what fits on node-b and leaves the rest Pending
  (`Insufficient memory`): the count placed;
- torpor: the same StatefulSet with `runtimeClassName: torpor` and
  `torpor.dev/idle-after: 3s`; each actor placed goes idle, is suspended,
  its requests are lowered by torpor-agent (pods/resize), and the scheduler
  places the next ones, until all N run there; each then answers a request
  (woken one after another). The count is N (all of them): a lower bound
  of what the node holds.

    bench/density.py [--actors N]

N defaults to 32 (env TORPOR_DENSITY_ACTORS). The rig must be down (the
test brings up its own). Writes the entry into bench/results.json
(TORPOR_BENCH_RESULTS), replacing an older one of the same name.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import bench

NAME = "actors_per_node"
TEST = "density_sleeping_actors_fit_many_times_what_runc_fits"
# the whole plain rig and cluster bring-up, the install and the test
RUN_TIMEOUT_S = 3600


def log(msg):
    print(f"[density] {msg}", file=sys.stderr, flush=True)


def measure(actors):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "density.json")
        env = dict(os.environ, TORPOR_DENSITY_RESULTS=out, TORPOR_DENSITY_ACTORS=str(actors))
        argv = ["flock", "/tmp/torpor-itest.lock", os.path.join(bench.REPO_ROOT, "test/rig/run-tests.sh"),
                "--test", "k8s_native", "--", TEST, "--exact"]
        log(" ".join(argv))
        try:
            p = subprocess.run(argv, env=env, timeout=RUN_TIMEOUT_S)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = f"still running after {RUN_TIMEOUT_S}s"
        r = None
        if os.path.exists(out):
            with open(out) as f:
                r = json.load(f)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    entry = {
        "name": NAME, "unit": "actors",
        "torpor": None, "baseline": None,
        "lower_is_better": False,
        "goal": ">= 4x runc's on the same node allocatable (ratio >= 4.0)", "goal_min_ratio": 4.0,
        "date": now,
        "statistic": (f"pods requesting 512Mi (cpu 10m) placed by the scheduler on node-b of the test cluster "
                      f"(4 GiB allocatable memory): runc, what fits of {actors}; torpor, {actors} actors "
                      "(idle-after 3s, requests lowered by torpor-agent while suspended), all placed and each "
                      "answering a request after: a lower bound"),
    }
    if r is None or rc != 0:
        entry["error"] = f"the test {TEST} failed (exit {rc}): see its output"
        return entry
    entry.update({
        "torpor": r["torpor"], "baseline": r["runc"],
        "ratio": round(r["torpor"] / r["runc"], 2) if r["runc"] else None,
        "node_allocatable_memory_bytes": r["allocatable_memory_bytes"],
        "node_free_memory_bytes": r["free_memory_bytes"],
        "torpor_all_placed_s": round(r["torpor_placed_s"], 1),
    })
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int, default=int(os.environ.get("TORPOR_DENSITY_ACTORS", "32")))
    args = ap.parse_args()
    entry = measure(args.actors)
    bench.merge_results([entry])
    log(f"{NAME}: torpor={entry['torpor']} runc={entry['baseline']}"
        + (f"  [error: {entry['error']}]" if entry.get("error") else ""))
    return 1 if entry.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
