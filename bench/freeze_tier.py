#!/usr/bin/env python3
"""resume_frozen_ms: how long an inbound request to an actor in the freeze
tier (`torpor.dev/freeze-first`) waits for its answer; torpor vs runc-v2's
own freeze (`ctr task pause` / `ctr task resume`), same containerd and runc.

The actor is `/actor counter --port 8080 --alloc-mib 256`, as for
resume_256mib_ms (bench/suspend_resume.py).

torpor (a CRI pod with `torpor.dev/freeze-first: 10m`, so that the window
never ends during a run), one run:

1. SUSPEND (untimed): `torporctl --json suspend <pod sandbox id>`; the reply
   must say FROZEN with a freeze tier window (the shim froze the container
   in the cgroup freezer; memory resident, no CRIU).
2. RESUME, TIMED (the trigger): connect to POD_IP:8080, send `inc\\n`, until
   the first byte of the answer. The connection lands in the frozen actor's
   own listening socket, which the shim watches: it classifies the
   connection as real traffic, thaws the cgroup (no CRIU), and proxies that
   one connection to the actor. The answer must be the previous counter
   value + 1, or the run fails. Afterwards (untimed) the actor must be
   RUNNING and `last_resume_ms` (the shim's thaw) is kept as a phase.

runc-v2 (the baseline): the actor runs as a `ctr run -d --runtime
io.containerd.runc.v2` container in a runc pod's network namespace. One run:
`ctr task pause` (untimed), then, TIMED: `ctr task resume` + connect +
`inc` + first byte.

Values: p50 in `torpor` (p99 in `torpor_p99`), of TORPOR_BENCH_FT_RUNS runs
(default 30), runtimes alternating. A failed run is counted, kept in
`<runtime>_failures` and left out of the percentiles. Goal: p99 <= 5 ms
(absolute).

    bench/freeze_tier.py [--runs N]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import (BASELINE, MIN_RUNS, TORPOR, RunError, RunFailed, TorporActor,  # noqa: E402
                   check_counter, inc_first_byte, log, ms, now_ns, pct)
import suspend_harness  # noqa: E402

NAME = "resume_frozen_ms"
MIB = 256
WINDOW = "10m"
GOAL_P99_MS = 5.0
GOAL_TEXT = "p99 <= 5 ms (absolute)"


class TorporFrozen(TorporActor):
    """The torpor actor with freeze-first, frozen by a suspend and thawed by a request."""

    def __init__(self):
        super().__init__(MIB, annotations={"torpor.dev/freeze-first": WINDOW}, prefix="ft")

    def run(self) -> dict:
        rec = self.ctl("suspend", self.pod.id)[0]["actor"]
        if rec.get("state") != "FROZEN" or not isinstance(rec.get("freeze_tier"), dict):
            raise RunError(f"after torporctl suspend the actor is {rec.get('state')!r} "
                           f"(freeze_tier {rec.get('freeze_tier')!r}), not in the freeze tier")
        t1 = now_ns()
        try:
            _, t_first, got = inc_first_byte(self.ip, t1, retry_refused=False)
            check_counter(got, self.counter + 1)
        except (OSError, RunError, RunFailed) as e:
            raise RunFailed(f"request to the frozen actor: {e or type(e).__name__} "
                            f"({ms(t1, now_ns()):.0f} ms after the trigger); {self.recover()}") from None
        self.counter += 1
        st = self.status()
        if st.get("state") != "RUNNING":
            raise RunError(f"after the request the actor is {st.get('state')!r}: {st.get('last_error')}")
        if st.get("snapshot") or st.get("staging"):
            raise RunError(f"the actor was checkpointed, not thawed: {st}")
        thaw = float(st.get("last_resume_ms") or 0)
        return {"resume": ms(t1, t_first),
                "resume_phases": {"shim thaw (last_resume_ms)": thaw,
                                  "rest: wake, classify, proxy, reply": ms(t1, t_first) - thaw}}


class BaselineFrozen(suspend_harness.BaselineActor):
    """runc-v2: `ctr task pause`, then `ctr task resume` on the request."""

    def __init__(self):
        super().__init__(MIB)

    def run(self) -> dict:
        suspend_harness.ctr("tasks", "pause", self.cid)
        t1 = now_ns()
        suspend_harness.ctr("tasks", "resume", self.cid)
        t_res = now_ns()
        _, t_first, got = inc_first_byte(self.ip, t1, retry_refused=False)
        check_counter(got, self.counter + 1)
        self.counter += 1
        return {"resume": ms(t1, t_first),
                "resume_phases": {"ctr task resume": ms(t1, t_res), "connect + inc + first byte": ms(t_res, t_first)}}


def measure(runs: int) -> dict:
    actors = {}
    errors = {}
    tallies = {}
    try:
        for key, cls in ((TORPOR, TorporFrozen), (BASELINE, BaselineFrozen)):
            try:
                actors[key] = cls()
            except Exception as e:  # noqa: BLE001 - reported in results.json
                errors[key] = f"setting up the actor: {e}"
                log(f"freeze_tier {key}: {errors[key]}")
        subjects = {key: (lambda _i, a=a: a.run()) for key, a in actors.items()}
        # one unmeasured run each (warm caches), then the measured ones
        bench.run_rounds("freeze_tier warm-up", subjects, 1, rounds=1, tolerate=True, tallies=tallies)
        for t in tallies.values():
            t.samples.clear()
        bench.run_rounds("freeze_tier", subjects, runs, tolerate=True, tallies=tallies)
        for key, a in actors.items():
            try:
                a.check_memory()
            except Exception as e:  # noqa: BLE001
                errors[key] = str(e)
    finally:
        for a in actors.values():
            try:
                a.remove()
            except Exception as e:  # noqa: BLE001
                log(f"freeze_tier: removing the {a.key} actor: {e}")
    extra = {}
    vals = {}
    for key in (TORPOR, BASELINE):
        t = tallies.get(key)
        if t and t.error:
            errors[key] = t.error
        rs = [r for r in (t.samples if t else []) if r.get("resume") is not None]
        v = [r["resume"] for r in rs]
        ok = key not in errors and bool(v)
        vals[key] = v if ok else []
        extra[f"{key}_p99"] = pct(v, 99) if ok else None
        extra[f"{key}_n"] = len(v) if ok else None
        extra[f"{key}_samples_ms"] = [bench.rnd(x, 2) for x in v] or None
        extra[f"{key}_phases_p50_ms"] = suspend_harness.phases_p50(rs, "resume_phases") if ok else None
        extra[f"{key}_failed_runs"] = len(t.failures) if t else None
        if t and t.failures:
            extra[f"{key}_failures"] = t.failures
    tp99 = extra.get("torpor_p99")
    met = None if tp99 is None else (tp99 <= GOAL_P99_MS and not (tallies.get(TORPOR) and tallies[TORPOR].failures))
    if met is not None:
        extra["torpor_note"] = f"goal {GOAL_TEXT}: {'met' if met else 'NOT met'} (p99 {tp99:.2f} ms)"
    extra["goal_p99_max_ms"] = GOAL_P99_MS
    extra["goal_met"] = met
    extra["load_average"] = bench._loadavg()
    stat = (f"p50 of {extra.get('torpor_n') or runs} runs (p99 in the details): from the trigger (connect to "
            f"POD_IP:8080 of the frozen actor and send `inc`) to the first byte of the answer, which must be the "
            f"previous counter + 1; actor `/actor counter --alloc-mib {MIB}`. torpor: `torpor.dev/freeze-first: "
            f"{WINDOW}`, frozen by `torporctl suspend` (cgroup freezer, memory resident); the shim watches the "
            f"actor's own listener, thaws the cgroup on the request and proxies that connection. runc-v2: "
            f"`ctr task pause`; the time is `ctr task resume` + connect + `inc` + first byte")
    return bench.entry(
        NAME, "ms",
        torpor=None if TORPOR in errors or not vals[TORPOR] else pct(vals[TORPOR], 50),
        baseline=None if BASELINE in errors or not vals[BASELINE] else pct(vals[BASELINE], 50),
        lower_is_better=True, goal=GOAL_TEXT,
        error=errors.get(TORPOR), baseline_error=errors.get(BASELINE),
        statistic=stat, **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("TORPOR_BENCH_FT_RUNS", str(MIN_RUNS))))
    args = ap.parse_args()
    with bench.bench_session():
        try:
            bench.ensure_torporctl()
        except RuntimeError as e:
            log(f"freeze_tier: {e}")
        started = time.monotonic()
        e = measure(args.runs)
        bench.merge_results([e])
        log(f"freeze_tier: {NAME} torpor p50 {e.get('torpor')} p99 {e.get('torpor_p99')}, "
            f"runc-v2 p50 {e.get('baseline')} ms ({time.monotonic() - started:.0f}s, load {e.get('load_average')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
