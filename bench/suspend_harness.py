"""The harness of the benchmarks that suspend and resume the counter actor
(Python 3 standard library only; built on bench.py, which has the rest:
``TorporActor``, the request trigger, ``run_rounds``, results). Measurement
scripts import bench and this module, never one another.

- ``BaselineActor``           runc-v2's side: `/actor counter` as a `ctr run`
                              container of runc-v2 in a runc pod's network
                              namespace; ``suspend()`` (checkpoint + delete
                              by ctr, untimed), ``check_memory()``, ``remove()``
- ``ctr()``, ``cleanup_leftovers()``   ctr in its namespace; the containers
                              and checkpoint images an interrupted run left
- ``drop_page_cache()``, ``memory_cgroups()``
- ``shim_phases()``, ``phases_p50()``, ``phases_pct()``   per-run phases
- the suspend/resume measurement (``TorporSuspendResume``,
  ``BaselineSuspendResume``, ``measure()``, ``main()``), which
  suspend_resume.py runs, and resume_cold.py with the page cache dropped
  before each trigger; suspend_resume.py's docstring describes it.
"""

import argparse
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import (BASELINE, BASELINE_RUNTIME_TYPE, CONNECT_TIMEOUT_S, MIN_RUNS, TORPOR,  # noqa: E402
                   TRIGGER_TIMEOUT_S, BenchPod, RunError, RunFailed, TorporActor, actor_pids,
                   check_counter, inc_first_byte, log, ms, netns_inode, now_ns, pct, remove_restore_dirs,
                   size_name, wait_gone)

NAMESPACE = "default"
ID_PREFIX = "bench-sr-"
IMAGE_PREFIX = "localhost/torpor-bench/suspend-resume/"
# liveness limits, not measurements
CALL_TIMEOUT_S = bench.LONG_CALL_TIMEOUT_S
GOALS = {  # name -> (p99 bound in ms, text)
    "resume_256mib_ms": (100.0, "p99 <= 100 ms (absolute)"),
    "resume_256mib_cold_ms": (200.0, "p99 <= 200 ms after dropping the page cache (absolute)"),
    "resume_1gib_ms": (150.0, "p99 <= 150 ms (absolute)"),
    "suspend_1gib_ms": (1000.0, "p99 <= 1 s (absolute)"),
}


# the size whose runs also time a resume triggered right after the suspend
RIGHT_AFTER_MIB = 256


def ctr(*args, timeout=CALL_TIMEOUT_S, check=True) -> str:
    return bench.ctr(NAMESPACE, *args, timeout=timeout, check=check)


# ------------------------------------------------------------- the page cache

def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def memory_cgroups():
    """The memory controller's cgroups, dying ones included (/proc/cgroups)."""
    with open("/proc/cgroups") as f:
        for line in f:
            cols = line.split()
            if cols and cols[0] == "memory":
                return int(cols[2])
    return None


# ---------------------------------------------------------- runc-v2's actor

class BaselineActor:
    """The actor as a `ctr run` container of runc-v2 in a runc pod's netns
    (the baseline of suspend_resume.py, resume_cold.py, freeze_tier.py,
    wakeups.py and suspended_memory.py)."""

    key = BASELINE

    def __init__(self, mib: int):
        self.mib = mib
        self.pod = BenchPod(BASELINE, prefix="sr")
        self.cid = f"{ID_PREFIX}{size_name(mib)}-{uuid.uuid4().hex[:8]}"
        self.refs = []
        try:
            self.pod.run()
            info = bench.crictl_json("inspectp", "-o", "json", self.pod.id)
            self.ip = info["status"]["network"]["ip"]
            nss = info["info"]["runtimeSpec"]["linux"]["namespaces"]
            netns = next(n["path"] for n in nss if n["type"] == "network")
            self.netns_ino = netns_inode(netns)
            ctr("run", "-d", "--runtime", BASELINE_RUNTIME_TYPE, "--with-ns", f"network:{netns}",
                "--cgroup", f"{bench.CGROUP_ROOT}/pod-{self.pod.name}/{self.cid}",
                bench.ACTOR_IMAGE, self.cid,
                "/actor", "counter", "--port", str(bench.ACTOR_PORT), "--alloc-mib", str(mib))
            bench.wait_actor(self.ip, error=RunError)
            self.counter = int(bench.actor_call(self.ip, ["get"], error=RunError)[0])
            self.crc = bench.actor_call(self.ip, ["sum"], error=RunError)[0]
            pids = actor_pids(self.netns_ino, mib)
            if len(pids) != 1:
                raise RunError(f"expected one actor process in the pod, found {pids}")
            self.rss_mib = (bench.proc_status_kib(pids[0], "VmRSS") or 0) / 1024
        except BaseException:
            self.remove()
            raise

    def suspend(self) -> None:
        """Untimed: checkpointed (`ctr c checkpoint --rw --task` into a new
        image, the last one's removed first) and deleted (`ctr t delete -f`,
        until no actor process is left, `ctr c rm`); `refs[-1]` restores it."""
        self.drop_images()
        ref = f"{IMAGE_PREFIX}{self.cid}:{uuid.uuid4().hex[:8]}"
        self.refs.append(ref)
        ctr("containers", "checkpoint", "--rw", "--task", self.cid, ref)
        ctr("tasks", "delete", "-f", self.cid)
        wait_gone(self.netns_ino, self.mib)
        ctr("containers", "rm", self.cid)

    def drop_images(self) -> None:
        for ref in list(self.refs):
            ctr("images", "rm", "--sync", ref, check=False, timeout=120)
            self.refs.remove(ref)
        remove_restore_dirs(self.cid)

    def check_memory(self) -> None:
        got = bench.actor_call(self.ip, ["sum"], error=RunError)[0]
        if got != self.crc:
            raise RunError(f"memory CRC after the last restore {got}, fresh actor {self.crc}")

    def remove(self) -> None:
        remove_container(self.cid)
        for ref in list(self.refs):
            ctr("images", "rm", "--sync", ref, check=False, timeout=120)
        remove_restore_dirs(self.cid)
        self.pod.remove()


def remove_container(cid: str) -> None:
    """Kill, delete and remove a container of the bench (best effort)."""
    bench.remove_container(NAMESPACE, cid)


def cleanup_leftovers() -> None:
    """Containers and checkpoint images of an interrupted earlier run."""
    for cid in ctr("containers", "ls", "-q", check=False).split():
        if cid.startswith(ID_PREFIX):
            remove_container(cid)
    for ref in ctr("images", "ls", "-q", check=False).split():
        if ref.startswith(IMAGE_PREFIX):
            ctr("images", "rm", "--sync", ref, check=False, timeout=120)
    n = remove_restore_dirs(ID_PREFIX)
    if n:
        log(f"suspend_resume: removed {n} restore dir(s) containerd left behind")


# ------------------------------------------------------------- per-run phases

def shim_phases(phases) -> dict:
    """The shim's own phases (`last_*_phases` of its record) as
    {"shim: <name>": ms}."""
    return {f"shim: {p['name']}": float(p.get("us") or 0) / 1000 for p in phases or []}


def phase_keys(runs, field):
    """Every phase name seen in any run, in first-seen order (a phase a run
    did not pass through counts 0 ms there)."""
    keys = []
    for r in runs:
        keys.extend(k for k in r[field] if k not in keys)
    return keys


def phases_pct(runs, field, q):
    if not runs:
        return None
    return {k: bench.rnd(bench.percentile([r[field].get(k, 0.0) for r in runs], q), 1) for k in phase_keys(runs, field)}


def phases_p50(runs, field):
    return phases_pct(runs, field, 50)


# ----------------------------------------------- the suspend/resume measurement

class TorporSuspendResume(TorporActor):
    """The torpor actor (bench.TorporActor), suspended and resumed by a request."""

    # set by measure(): each run also times a resume triggered right after
    # the suspend returned (resume_256mib_right_after_suspend_ms)
    right_after = False
    # set by measure(): the page cache dropped before each trigger (resume_cold.py)
    cold = False

    def run(self) -> dict:
        """One suspend + resume of the torpor actor, the trigger once the
        suspend has settled; with `right_after` a second one, the trigger
        right after the suspend returned. Returns the timings."""
        out = self.cycle(settle=True)
        if self.right_after:
            again = self.cycle(settle=False)
            out["resume_right_after"] = again["resume"]
            out["resume_right_after_phases"] = again["resume_phases"]
        return out

    def cycle(self, settle: bool) -> dict:
        """One suspend + resume; with `settle` the trigger waits (untimed)
        for the suspend's background commit."""
        if len(actor_pids(self.netns_ino, self.mib)) != 1:
            raise RunError("the actor is not running before the suspend")
        # Untimed: the actor fully resumed (memory prefetched) before the
        # suspend, so that a suspend right after a resume does not include
        # the shim waiting for the background prefetch.
        self.wait_settled()
        # SUSPEND
        t0 = now_ns()
        reply = self.ctl("suspend", self.pod.id)
        t_ret = now_ns()
        polls = wait_gone(self.netns_ino, self.mib)
        t_gone = now_ns()
        rec = reply[0]["actor"]
        if str(rec.get("state")).lower() != "suspended":
            raise RunError(f"after torporctl suspend the actor is {rec.get('state')!r}")
        shim_suspend = shim_phases(self.status().get("last_suspend_phases"))
        out = {
            "suspend": ms(t0, t_gone),
            "suspend_phases": {"shim (last_suspend_ms)": float(rec.get("last_suspend_ms") or 0),
                               **shim_suspend,
                               "torporctl return": ms(t0, t_ret),
                               "after return until the process is gone": ms(t_ret, t_gone)},
            "suspend_gone_polls": polls,
            "resume": None,
        }
        if settle:
            out["commit_after_return"] = self.wait_committed()
        # RESUME: the trigger
        if self.cold:
            drop_page_cache()
        t1 = now_ns()
        try:
            _, t_first, got = inc_first_byte(self.ip, t1, retry_refused=False)
            check_counter(got, self.counter + 1)
        except (OSError, RunError, RunFailed) as e:
            raise RunFailed(f"request to the suspended actor: {e or type(e).__name__} "
                            f"({ms(t1, now_ns()):.0f} ms after the trigger); {self.recover()}",
                            partial=out) from None
        self.counter += 1
        # untimed: how long the background prefetch of lazy pages goes on after the answer
        lazy = bool(self.lazy_daemons())
        if lazy:
            self.wait_settled()
        t_settled = now_ns()
        st = self.status()
        if str(st.get("state")).lower() != "running":
            raise RunError(f"after the request the actor is {st.get('state')!r}: {st.get('last_error')}")
        shim_ms = float(st.get("last_resume_ms") or 0)
        return {
            **out,
            "lazy": lazy,
            "prefetch_after_answer": ms(t_first, t_settled) if lazy else None,
            "resume": ms(t1, t_first),
            "resume_cpu_ms": float(st.get("last_resume_cpu_us") or 0) / 1000,
            "resume_phases": {"shim restore incl. handover (last_resume_ms)": shim_ms,
                              **shim_phases(st.get("last_resume_phases")),
                              "rest: wake, proxy, reply (end-to-end - last_resume_ms)":
                                  ms(t1, t_first) - shim_ms},
        }


class BaselineSuspendResume(BaselineActor):
    """The runc-v2 actor (BaselineActor), checkpointed and restored by ctr."""

    # set by measure(): the page cache dropped before each trigger (resume_cold.py)
    cold = False

    def run(self) -> dict:
        if len(actor_pids(self.netns_ino, self.mib)) != 1:
            raise RunError("the actor is not running before the suspend")
        ref = f"{IMAGE_PREFIX}{self.cid}:{uuid.uuid4().hex[:8]}"
        self.refs.append(ref)
        try:
            # SUSPEND: checkpoint, then kill + delete the task
            t0 = now_ns()
            ctr("containers", "checkpoint", "--rw", "--task", self.cid, ref)
            t_ckpt = now_ns()
            ctr("tasks", "delete", "-f", self.cid)
            t_del = now_ns()
            polls = wait_gone(self.netns_ino, self.mib)
            t_gone = now_ns()
            ctr("containers", "rm", self.cid)  # untimed: so that the restore can use the id
            if self.cold:
                drop_page_cache()
            # RESUME: the trigger arrives, the restore has to come first
            t1 = now_ns()
            ctr("containers", "restore", "--rw", "--live", self.cid, ref)
            t_rest = now_ns()
            _, t_first, got = inc_first_byte(self.ip, t1, retry_refused=True)
            try:
                check_counter(got, self.counter + 1)
            except RunFailed as e:
                self.counter = int(bench.actor_call(self.ip, ["get"], error=RunError)[0])
                raise RunFailed(f"{e}; counter {self.counter} afterwards") from None
            self.counter += 1
        finally:
            ctr("images", "rm", "--sync", ref, check=False, timeout=120)
            self.refs.remove(ref)
            remove_restore_dirs(self.cid)
        return {
            "suspend": ms(t0, t_gone),
            "suspend_phases": {"ctr c checkpoint --rw --task": ms(t0, t_ckpt),
                               "ctr t delete -f": ms(t_ckpt, t_del),
                               "after return until the process is gone": ms(t_del, t_gone)},
            "suspend_gone_polls": polls,
            "resume": ms(t1, t_first),
            "resume_phases": {"ctr c restore --rw --live": ms(t1, t_rest),
                              "connect + inc + first byte": ms(t_rest, t_first)},
        }


def measure(runs: int, sizes, budget_s: float, cold: bool = False) -> list:
    """The suspend/resume runs of both runtimes at each size (see
    suspend_resume.py). With `cold` (resume_cold.py) the page cache is
    dropped (untimed) right before each resume's trigger, so that the
    snapshot, CRIU, runc and the shim's pages are read from disk: entries
    resume_<size>_cold_ms, no suspend."""
    started = time.monotonic()
    results = {(k, mib): [] for k in (TORPOR, BASELINE) for mib in sizes}
    failed = {(k, mib): [] for k in (TORPOR, BASELINE) for mib in sizes}  # RunFailed messages
    errors = {}
    notes = {}

    def resumed(k):
        return sum(1 for r in results[k] if r["resume"] is not None)

    for si, mib in enumerate(sizes):
        actors = {}
        t_size = time.monotonic()
        size = size_name(mib)
        try:
            for key, cls in ((TORPOR, TorporSuspendResume), (BASELINE, BaselineSuspendResume)):
                try:
                    actors[key] = cls(mib)
                    actors[key].cold = cold
                    notes[(key, mib)] = f"actor VmRSS {actors[key].rss_mib:.0f} MiB"
                except Exception as e:  # noqa: BLE001 - reported in results.json
                    errors[(key, mib)] = f"{size}: setting up the actor: {e}"
                    log(f"suspend_resume {key}: {errors[(key, mib)]}")
            if TORPOR in actors:
                actors[TORPOR].right_after = mib == RIGHT_AFTER_MIB and not cold
            subjects = {key: (lambda _i, a=a: a.run()) for key, a in actors.items()}

            def texts(label):
                """How a run's failure and error read: a RunFailed is recorded
                and tolerated up to `runs` times; anything else ends this runtime+size."""
                return dict(failure_text=lambda _k, i, e: f"{label(i)}: {e}",
                            error_text=lambda _k, i, e: f"{size} {label(i)} failed: {e}",
                            too_many_text=lambda _k: f"{size}: more than {runs} failed runs")

            tallies = {}
            # warm-up (first size only: shim, CRIU, runc, ctr and the image in the
            # page cache): one unmeasured suspend + resume each
            if si == 0:
                bench.run_rounds(f"suspend_resume {size} warm-up", subjects, 1, rounds=1, tolerate=True,
                                 tallies=tallies, **texts(lambda _i: "warm-up run"))
                for t in tallies.values():
                    t.samples.clear()
            # this size's share of the time left, by its expected cost (a round
            # at 1 GiB takes ~3.5 times as long as one at 256 MiB)
            weight = (mib + 128) / sum(m + 128 for m in sizes[si:])
            size_deadline = t_size + (started + budget_s - t_size) * weight
            bench.run_rounds(f"suspend_resume {size}", subjects, runs, deadline=size_deadline, predict=True, tolerate=True, tallies=tallies,
                             counted=lambda r: r["resume"] is not None, **texts(lambda i: f"run {i + 1}"))
            for key, t in tallies.items():
                results[(key, mib)] = t.samples
                failed[(key, mib)] = t.failures
                if t.error:
                    errors[(key, mib)] = t.error
                if t.stopped:
                    notes[(key, mib)] = notes.get((key, mib), "") + f"; {t.stopped}"
            for key, a in actors.items():
                if (key, mib) in errors:
                    continue
                try:
                    a.check_memory()
                except Exception as e:  # noqa: BLE001
                    errors[(key, mib)] = f"{size}: {e}"
            log(f"suspend_resume: {size} done in {time.monotonic() - t_size:.0f}s: "
                + ", ".join(f"{k} {resumed((k, mib))} runs ({len(failed[(k, mib)])} failed)"
                            for k in (TORPOR, BASELINE)))
        finally:
            for a in actors.values():
                try:
                    a.remove()
                except Exception as e:  # noqa: BLE001
                    log(f"suspend_resume: removing the {a.key} actor: {e}")

    entries = []
    specs = [(f"resume_{size_name(m)}{'_cold' if cold else ''}_ms", m, "resume") for m in sizes]
    if 1024 in sizes and not cold:
        specs.append(("suspend_1gib_ms", 1024, "suspend"))
    if RIGHT_AFTER_MIB in sizes and not cold:
        specs.append((f"resume_{size_name(RIGHT_AFTER_MIB)}_right_after_suspend_ms", RIGHT_AFTER_MIB, "resume_right_after"))
    for name, mib, what in specs:
        extra = {}
        vals = {}
        for key in (TORPOR, BASELINE):
            # runc-v2's checkpoint is done when ctr returns: its resume is
            # the same whenever it is triggered
            field = "resume" if what == "resume_right_after" and key == BASELINE else what
            rs = [r for r in results[(key, mib)] if r.get(field) is not None]
            v = [r[field] for r in rs]
            ok = (key, mib) not in errors and len(v) > 0
            vals[key] = v if ok else []
            extra[f"{key}_p99"] = pct(v, 99) if ok else None
            extra[f"{key}_n"] = len(v) if ok else None
            extra[f"{key}_min"] = bench.rnd(min(v), 1) if ok else None
            extra[f"{key}_max"] = bench.rnd(max(v), 1) if ok else None
            extra[f"{key}_samples_ms"] = [bench.rnd(x, 1) for x in v] or None
            extra[f"{key}_phases_p50_ms"] = phases_p50(rs, f"{field}_phases") if ok else None
            extra[f"{key}_phases_p99_ms"] = phases_pct(rs, f"{field}_phases", 99) if ok else None
            if what == "suspend" and ok:
                extra[f"{key}_runs_process_outlived_return"] = sum(1 for r in rs if r["suspend_gone_polls"])
            if what == "resume" and ok and key == TORPOR:
                cpu = [r["resume_cpu_ms"] for r in rs if r.get("resume_cpu_ms")]
                extra["torpor_resume_cpu_ms_p50"] = pct(cpu, 50)
                extra["torpor_resume_cpu_ms_note"] = ("CPU time (user + system) per resume: the shim and the runc and CRIU "
                                                      "processes it waited for (not the restored process; the lazy-pages "
                                                      "daemon is counted when it exits)")
                commit = [r["commit_after_return"] for r in rs if r.get("commit_after_return") is not None]
                extra["torpor_commit_after_suspend_return_p50_ms"] = pct(commit, 50)
                lz = [r["prefetch_after_answer"] for r in rs if r.get("lazy")]
                extra["torpor_runs_lazy_pages_seen"] = len(lz)
                extra["torpor_lazy_prefetch_after_answer_p50_ms"] = pct(lz, 50)
            extra[f"{key}_failed_runs"] = len(failed[(key, mib)])
            if failed[(key, mib)]:
                extra[f"{key}_failures"] = failed[(key, mib)]
        fails = {k: failed[(k, mib)] for k in (TORPOR, BASELINE)}

        def failure_text(k):
            f = fails[k]
            if not f:
                return None
            n = len([r for r in results[(k, mib)] if r["resume"] is not None]) + len(f)
            return (f"{len(f)} of {n} runs failed (the request to the suspended actor got no answer: TCP "
                    f"connect not done within {CONNECT_TIMEOUT_S:.0f} s or no reply within "
                    f"{TRIGGER_TIMEOUT_S:.0f} s; or a wrong counter); first: {f[0]}")

        bound, goal_text = GOALS.get(name, (None, None))
        tp99 = extra.get("torpor_p99")
        met = None if tp99 is None or bound is None else tp99 <= bound
        if met and what == "resume" and fails[TORPOR]:
            met = False  # a request that was never answered misses any latency goal
        note = notes.get((TORPOR, mib), "")
        if met is not None:
            verdict = (f"goal {goal_text}: {'met' if met else 'NOT met'} (p99 {tp99:.0f} ms"
                       + ("" if tp99 <= bound else f", {tp99 - bound:.0f} ms over")
                       + (f"; {len(fails[TORPOR])} failed runs" if what == "resume" and fails[TORPOR] else "")
                       + ")")
            note = f"{verdict}; {note}" if note else verdict
        if what == "suspend" and fails[TORPOR]:
            note += (f"; includes the suspends of {len(fails[TORPOR])} runs whose request then failed "
                     f"(see resume_{size_name(mib)}_ms)")
        extra["torpor_note"] = note or None
        extra["baseline_note"] = notes.get((BASELINE, mib)) or None
        extra["goal_p99_max_ms"] = bound
        extra["goal_met"] = met
        n = extra.get("torpor_n") or extra.get("baseline_n") or runs
        if what == "resume_right_after":
            stat = (f"p50 of {n} runs (p99 in the details): as resume_{size_name(mib)}_ms, but torpor's trigger "
                    f"comes right after `torporctl suspend` returned, while the shim's background commit of the "
                    f"dump into the store is still under way (the resume restores from a view of the dump); "
                    f"measured in the same runs, each run's second suspend + resume. runc-v2: the samples of "
                    f"resume_{size_name(mib)}_ms (its checkpoint is complete when ctr returns)")
        elif what == "resume":
            stat = (f"p50 of {n} runs (p99 in the details): from the trigger (connect to POD_IP:8080 of the "
                    f"suspended actor and send `inc`, once the suspend has settled: its background commit "
                    f"into the store done, untimed) to the first byte of the answer, which must be the "
                    f"previous counter + 1 (a run without it fails, is counted and left out of the "
                    f"percentiles); actor `/actor counter --alloc-mib {mib}`. "
                    f"torpor: suspended by `torporctl suspend`, the shim holds the port, wakes on the "
                    f"request, restores (CRIU, lazy pages unless TORPOR_LAZY_PAGES=0) and proxies the "
                    f"connection. runc-v2: checkpointed by "
                    f"`ctr c checkpoint --rw --task` + `ctr t delete -f`; the time is "
                    f"`ctr c restore --rw --live` + connect + `inc` + first byte")
        else:
            stat = (f"p50 of {n} runs (p99 in the details): from the trigger until the memory is freed "
                    f"(command returned and no actor process left); actor `/actor counter --alloc-mib "
                    f"{mib}`. torpor: `torporctl suspend` (freeze, CRIU dump, process ends; pod stays "
                    f"Running). runc-v2: `ctr c checkpoint --rw --task` (CRIU dump with leave-running, "
                    f"image into the content store) + `ctr t delete -f` (SIGKILL, wait, delete)")
        err_t = errors.get((TORPOR, mib))
        if what == "resume" and failure_text(TORPOR):
            err_t = f"{err_t}; {failure_text(TORPOR)}" if err_t else failure_text(TORPOR)
        err_b = errors.get((BASELINE, mib))
        if what == "resume" and failure_text(BASELINE):
            err_b = f"{err_b}; {failure_text(BASELINE)}" if err_b else failure_text(BASELINE)
        entries.append(bench.entry(
            name, "ms",
            torpor=None if (TORPOR, mib) in errors or not vals[TORPOR] else pct(vals[TORPOR], 50),
            baseline=None if (BASELINE, mib) in errors or not vals[BASELINE] else pct(vals[BASELINE], 50),
            lower_is_better=True, goal=goal_text,
            error=err_t, baseline_error=err_b,
            statistic=stat, **extra))
    return entries


def main(description: str, cold: bool = False) -> None:
    """suspend_resume.py's (`cold`: resume_cold.py's) command line; `description`
    is the script's docstring (its --help)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("TORPOR_BENCH_SR_RUNS", str(MIN_RUNS))))
    ap.add_argument("--sizes", default=os.environ.get("TORPOR_BENCH_SR_SIZES_MIB", "256,1024"),
                    help="actor memory sizes in MiB, comma-separated")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    budget = float(os.environ.get("TORPOR_BENCH_SR_BUDGET_S")
                   or float(os.environ.get("TORPOR_BENCH_SCRIPT_TIMEOUT", "420")) - 60)
    if args.runs < MIN_RUNS:
        log(f"suspend_resume: WARNING: {args.runs} runs per size is below the required {MIN_RUNS}")
    with bench.bench_session():
        try:
            bench.ensure_torporctl()
        except RuntimeError as e:
            log(f"suspend_resume: {e}")
        cleanup_leftovers()
        try:
            entries = measure(args.runs, sizes, budget, cold)
        finally:
            cleanup_leftovers()
    bench.merge_results(entries)
    for e in entries:
        log(f"{e['name']}: torpor={e['torpor']} (p99 {e.get('torpor_p99')}) "
            f"baseline={e['baseline']} (p99 {e.get('baseline_p99')}) {e['unit']}"
            + (f"  [torpor error: {e['error']}]" if e.get("error") else "")
            + (f"  [baseline error: {e['baseline_error']}]" if e.get("baseline_error") else ""))
