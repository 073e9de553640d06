#!/usr/bin/env python3
"""wakeups_per_s: N suspended actors (default 40, `/actor counter
--alloc-mib 64` each) woken all at once, each by one request; torpor vs
runc-v2 (N concurrent `ctr c restore`), same containerd, runc and CRIU.

One round, per runtime:

1. untimed: every actor is suspended (torpor: `torporctl suspend`, the shim
   holds the port, and its background commit is done; runc-v2: `ctr c
   checkpoint --rw --task` + `ctr t delete -f` + `ctr c rm`), and every
   lazy-pages daemon of the last round is gone.
2. TIMED from one common t0: N threads, released together, each send `inc`
   to one actor's pod IP and wait for the first byte of the answer (runc-v2:
   each thread first runs `ctr c restore --rw --live`, then connects,
   retrying while refused). Every answer must be that actor's previous
   counter + 1, or the round fails.

Before each runtime's actors are made, the page cache is dropped (untimed):
a deleted memory cgroup lives on, dying, while page cache is still charged
to it, and each round leaves about 55 of them (the restored containers'
cgroups, deleted at their suspend). Measured in one rig, 40 wake-ups took
65, 88 and 112 ms of CPU each (31.8, 24.2 and 20.8 wake-ups/s) with about
1000 dying memory cgroups left by earlier runs, and 58, 67 and 64 ms (37.0,
30.9 and 32.8 wake-ups/s) right after a drop had freed them.

Per round: throughput = N / (time from t0 to the last answer), and every
actor's latency (t0 to its answer). The entry's `torpor` / `baseline` is the
median throughput over the rounds (higher is better; goal >= 50 wakeups/s
on 2 cores), `torpor_p99` the lowest round's throughput (the 1st percentile
of a higher-is-better figure: the worst case), and the latency percentiles
over all actors of all rounds are `*_latency_p50_ms` / `*_latency_p99_ms`.
The CPU time per torpor resume (the shims' `last_resume_cpu_us`) is kept.

    bench/wakeups.py [--actors N] [--rounds R] [--mib M]

Environment: TORPOR_BENCH_WAKE_ACTORS (40), TORPOR_BENCH_WAKE_ROUNDS (3),
TORPOR_BENCH_WAKE_MIB (64).
"""

import argparse
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import (BASELINE, TORPOR, RunError, TorporActor, check_counter, inc_first_byte,  # noqa: E402
                   log, ms, now_ns, pct)
import suspend_harness  # noqa: E402

GOAL = ">= 50 wakeups/s (absolute, 40 actors of 64 MiB on 2 cores)"
GOAL_MIN = 50.0


class TorporSleeper(TorporActor):
    """The torpor actor; suspend() (TorporActor's) waits for the background
    commit, as an actor woken seconds or minutes after its suspend finds it."""

    def wake(self, t0: int) -> int:
        _, t_first, got = inc_first_byte(self.ip, t0, retry_refused=False)
        check_counter(got, self.counter + 1)
        self.counter += 1
        return t_first

    def cpu_ms(self):
        us = self.status().get("last_resume_cpu_us")
        return None if us is None else float(us) / 1000


class BaselineSleeper(suspend_harness.BaselineActor):
    """The runc-v2 actor (a `ctr run` container in a runc pod's netns),
    checkpointed and restored in two steps: suspend() (BaselineActor's),
    then wake()."""

    def wake(self, t0: int) -> int:
        suspend_harness.ctr("containers", "restore", "--rw", "--live", self.cid, self.refs[-1])
        _, t_first, got = inc_first_byte(self.ip, t0, retry_refused=True)
        check_counter(got, self.counter + 1)
        self.counter += 1
        return t_first

    def cpu_ms(self):
        return None


def one_round(actors) -> dict:
    """Suspends every actor (untimed), then wakes them all at once."""
    for a in actors:
        a.suspend()
    barrier = threading.Barrier(len(actors) + 1)
    t0_box = {}
    done = [None] * len(actors)

    def wake(i, a):
        barrier.wait()
        try:
            done[i] = a.wake(t0_box["t0"])
        except Exception as e:  # noqa: BLE001 - the round fails below
            done[i] = e

    threads = [threading.Thread(target=wake, args=(i, a), daemon=True) for i, a in enumerate(actors)]
    for t in threads:
        t.start()
    t0_box["t0"] = now_ns()
    barrier.wait()
    for t in threads:
        t.join(timeout=bench.LONG_CALL_TIMEOUT_S)
    t0 = t0_box["t0"]
    errors = [d for d in done if not isinstance(d, int)]
    if errors:
        raise RunError(f"{len(errors)} of {len(actors)} wake-ups failed; first: {errors[0]}")
    lat = [ms(t0, t) for t in done]
    cpu = [c for c in (a.cpu_ms() for a in actors) if c is not None]
    return {"throughput": len(actors) / (max(lat) / 1000.0), "latencies": lat, "cpu_ms": cpu}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int, default=int(os.environ.get("TORPOR_BENCH_WAKE_ACTORS", "40")))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("TORPOR_BENCH_WAKE_ROUNDS", "3")))
    ap.add_argument("--mib", type=int, default=int(os.environ.get("TORPOR_BENCH_WAKE_MIB", "64")))
    args = ap.parse_args()
    results = {TORPOR: [], BASELINE: []}
    errors = {}
    with bench.bench_session():
        bench.ensure_torporctl()
        for key, make in ((TORPOR, lambda: TorporSleeper(args.mib, seed=0)), (BASELINE, lambda: BaselineSleeper(args.mib))):
            actors = []
            try:
                # Untimed: the memory cgroups earlier runs left dying go
                # with the page cache (see the module doc).
                before = suspend_harness.memory_cgroups()
                suspend_harness.drop_page_cache()
                log(f"wakeups {key}: page cache dropped: memory cgroups {before} -> {suspend_harness.memory_cgroups()}")
                for _ in range(args.actors):
                    actors.append(make())
                log(f"wakeups {key}: {len(actors)} actors of {args.mib} MiB up")
                for r in range(args.rounds):
                    res = one_round(actors)
                    results[key].append(res)
                    log(f"wakeups {key}: round {r + 1}: {res['throughput']:.1f} wakeups/s, "
                        f"latency p50 {pct(res['latencies'], 50):.0f} ms, max {max(res['latencies']):.0f} ms")
            except Exception as e:  # noqa: BLE001 - reported in results.json
                errors[key] = f"{type(e).__name__}: {e}"
                log(f"wakeups {key}: {errors[key]}")
            finally:
                for a in actors:
                    try:
                        a.remove()
                    except Exception as e:  # noqa: BLE001
                        log(f"wakeups: removing an actor: {e}")
    extra = {}
    value = {}
    for key in (TORPOR, BASELINE):
        rs = results[key] if key not in errors else []
        thr = [r["throughput"] for r in rs]
        lat = [x for r in rs for x in r["latencies"]]
        value[key] = pct(thr, 50) if thr else None
        extra[f"{key}_p99"] = bench.rnd(min(thr), 2) if thr else None
        extra[f"{key}_rounds_per_s"] = [bench.rnd(t, 2) for t in thr] or None
        extra[f"{key}_latency_p50_ms"] = pct(lat, 50) if lat else None
        extra[f"{key}_latency_p99_ms"] = pct(lat, 99) if lat else None
        cpu = [x for r in rs for x in r["cpu_ms"]]
        if cpu:
            extra[f"{key}_resume_cpu_ms_p50"] = pct(cpu, 50)
    met = None if value[TORPOR] is None else extra[f"{TORPOR}_p99"] >= GOAL_MIN
    extra["goal_met"] = met
    extra["torpor_note"] = (f"goal {GOAL}: {'met' if met else 'NOT met'} (worst round "
                            f"{extra[f'{TORPOR}_p99']} wakeups/s)") if met is not None else None
    e = bench.entry("wakeups_per_s", "wakeups/s", torpor=value[TORPOR], baseline=value[BASELINE],
                    lower_is_better=False, goal=GOAL, error=errors.get(TORPOR), baseline_error=errors.get(BASELINE),
                    statistic=(f"median over {args.rounds} rounds of N/(t0 to the last answer), N = {args.actors} "
                               f"suspended actors of {args.mib} MiB woken at once by one request each (every "
                               f"answer checked); torpor_p99/baseline_p99: the worst round; latencies over all "
                               f"actors of all rounds. runc-v2: N concurrent `ctr c restore --rw --live` + request. "
                               f"Untimed before each runtime: the page cache dropped (dying memory cgroups of "
                               f"earlier runs freed); torpor: each suspend's background commit done before the storm"),
                    **extra)
    bench.merge_results([e])
    log(f"wakeups_per_s: torpor={e['torpor']} baseline={e['baseline']} wakeups/s")


if __name__ == "__main__":
    main()
