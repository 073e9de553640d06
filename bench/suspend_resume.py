#!/usr/bin/env python3
"""resume_<size>_ms and suspend_1gib_ms: how long an inbound request to a
suspended actor waits for its answer, and how long a suspend takes until the
actor's memory is freed; torpor vs runc-v2 driven by containerd's standard
checkpoint/restore (`ctr`), same containerd, runc and CRIU.

The actor is `/actor counter --port 8080 --alloc-mib N` (N MiB of live,
distinct, non-zero memory); N = 256 and 1024.

torpor (a CRI pod, `crictl runp --runtime torpor`, the actor created and
started in it with `crictl create/start`), one run:

1. SUSPEND, TIMED, once the actor has settled (no `criu lazy-pages` daemon
   of the previous resume still prefetching its memory, which the shim would
   wait for first; untimed): `torporctl --json suspend <pod sandbox id>` (the
   shim freezes the container and dumps it with CRIU, the process ends), from
   the start of the torporctl process until it has returned AND no process of
   the actor is left (the pod's network namespace holds no `/actor counter`
   process; polled right after the return, normally already true). The
   shim's own `last_suspend_ms` from the reply is kept as a phase.
2. Untimed: until the suspend has settled, its background commit of the
   dump into the node's store done (`torporctl status`: `committed_at_ms`
   set, no `staging`; polled every 5 ms; the p50 of that wait is kept as
   `torpor_commit_after_suspend_return_p50_ms`). A wake-up seconds or
   minutes after a suspend finds it so.
3. RESUME, TIMED (the trigger): connect to POD_IP:8080 (the shim holds the
   port while the actor is suspended), send `inc\\n`, until the first byte of
   the answer arrives. In between the shim classifies the connection as real
   traffic, restores the actor with CRIU (`runc restore`; by default with
   lazy pages: memory served on demand by a `criu lazy-pages` daemon that
   prefetches the rest in the background) and proxies the held connection to
   it. The answer must be the previous counter value + 1, or the run fails.
   Afterwards (untimed) `torporctl --json status` gives the shim's
   `last_resume_ms` (restore incl. the handover), kept as a phase, and the
   time from the answer until the lazy-pages daemon is gone (polled every
   5 ms) is kept as `torpor_lazy_prefetch_after_answer_p50_ms`.

At 256 MiB each run then suspends and resumes the actor once more, the
trigger right after torporctl returned, during the commit (the shim restores
from a view of the dump the commit is still placing, and the commit's disk
writes go on beside the restore): resume_256mib_right_after_suspend_ms, no
goal; its runc-v2 column is resume_256mib_ms's, whose checkpoint is complete
when ctr returns.

torporctl is pointed (`--socket-dir`) at a private directory holding only a
link to this pod's shim control socket, so that shims of other rigs on the
machine (whose status torporctl would otherwise query first) do not enter
the measurement.

runc-v2 (the baseline; the same procedure checkpoint_restore.py uses): the
actor runs as a `ctr run -d --runtime io.containerd.runc.v2 --with-ns
network:<netns>` container joining the network namespace of a runc pod
(`crictl runp --runtime runc`), so it answers at the pod IP. One run:

1. SUSPEND, TIMED: `ctr c checkpoint --rw --task <id> <ref>` (pause, CRIU
   dump with --leave-running, the image into containerd's content store,
   resume) followed by `ctr t delete -f <id>` (SIGKILL, wait for the exit,
   delete the task), until no process of the actor is left. Untimed:
   `ctr c rm <id>` (so the restore can recreate the container under its id).
2. RESUME, TIMED (the trigger arrives at t0; nothing holds the port while the
   actor is down, so the restore has to come first): `ctr c restore --rw
   --live <id> <ref>` (container from the checkpoint image, CRIU restore),
   then connect to POD_IP:8080 (retried every 1 ms while refused), send
   `inc\\n`, until the first byte of the answer. The counter is checked as
   for torpor. Untimed: `ctr images rm --sync <ref>`, and the copy of the
   CRIU image containerd unpacked for the restore and leaves behind
   (<tmpdir>/ctrd-checkpoint*, see remove_restore_dirs).

A failed run: the request gets no answer (TCP connect not completed within
3 s, or no answer within 15 s) or a wrong counter. It is counted, kept in
`<runtime>_failures` and left out of the percentiles; for torpor the packet
filter rules then found in the pod's netns are recorded and removed, the
actor is resumed with `torporctl resume` and its counter re-read, and the
measurement goes on until 30 runs have succeeded (at most 30 may fail). A
resume entry with failed runs carries them in `error` and misses its goal.

Runtimes alternate run by run (torpor first on even runs); each runtime gets
one unmeasured suspend+resume first (at the first size). After the last run
of a size the actor's memory CRC (`sum`) is compared with the fresh actor's.
The check that no actor process is left (a scan of /proc, ~1 ms) is inside
the suspend time of both runtimes. Values:
p50 (p99 = linear-interpolated 99th percentile, with 30 runs between the two
largest samples); all samples are kept. suspend_1gib_ms comes from the
suspends of the 1 GiB resume runs.

Goals (absolute, not relative to the baseline; report.py's "goal met" column
only knows ratios, so the verdict is in `goal_met` and `torpor_note`):
resume p99 <= 100 ms at 256 MiB and <= 150 ms at 1 GiB; suspend of 1 GiB
<= 1 s (p99).

    bench/suspend_resume.py [--runs N] [--sizes 256,1024]

Environment: TORPOR_BENCH_SR_RUNS (default 30), TORPOR_BENCH_SR_SIZES_MIB
(default "256,1024"), TORPOR_BENCH_SR_BUDGET_S (stop measuring a size early
after this many seconds in total, default: TORPOR_BENCH_SCRIPT_TIMEOUT - 60),
TORPOR_TORPORCTL (torporctl binary; default target/release/torporctl, built
with cargo unless TORPOR_BENCH_SKIP_BUILD=1), TORPOR_CTR.
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
                   wait_gone)

NAMESPACE = "default"
PORT = bench.ACTOR_PORT
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

# bench/resume_cold.py sets this: the page cache is dropped (untimed) right
# before each resume's trigger, so that the snapshot, CRIU, runc and the
# shim's pages are read from disk: entries resume_<size>_cold_ms, no suspend.
COLD = False


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def size_name(mib: int) -> str:
    return f"{mib // 1024}gib" if mib % 1024 == 0 else f"{mib}mib"


def ctr(*args, timeout=CALL_TIMEOUT_S, check=True) -> str:
    return bench.ctr(NAMESPACE, *args, timeout=timeout, check=check)


def actor_call(ip: str, cmds, timeout=30.0) -> list:
    """Line protocol of `/actor counter`: one reply line per command."""
    return bench.actor_call(ip, cmds, timeout=timeout, port=PORT, error=RunError)


def wait_actor(ip: str) -> None:
    bench.wait_actor(ip, port=PORT, error=RunError)


# -------------------------------------------------------------------- actors

class TorporSuspendResume(TorporActor):
    """The torpor actor (bench.TorporActor), suspended and resumed by a request."""

    # set by measure(): each run also times a resume triggered right after
    # the suspend returned (resume_256mib_right_after_suspend_ms)
    right_after = False

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
        if COLD:
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


class BaselineActor:
    """The actor as a `ctr run` container of runc-v2 in a runc pod's netns."""

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
                "/actor", "counter", "--port", str(PORT), "--alloc-mib", str(mib))
            wait_actor(self.ip)
            self.counter = int(actor_call(self.ip, ["get"])[0])
            self.crc = actor_call(self.ip, ["sum"])[0]
            pids = actor_pids(self.netns_ino, mib)
            if len(pids) != 1:
                raise RunError(f"expected one actor process in the pod, found {pids}")
            self.rss_mib = (bench.proc_status_kib(pids[0], "VmRSS") or 0) / 1024
        except BaseException:
            self.remove()
            raise

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
            if COLD:
                drop_page_cache()
            # RESUME: the trigger arrives, the restore has to come first
            t1 = now_ns()
            ctr("containers", "restore", "--rw", "--live", self.cid, ref)
            t_rest = now_ns()
            _, t_first, got = inc_first_byte(self.ip, t1, retry_refused=True)
            try:
                check_counter(got, self.counter + 1)
            except RunFailed as e:
                self.counter = int(actor_call(self.ip, ["get"])[0])
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

    def check_memory(self) -> None:
        got = actor_call(self.ip, ["sum"])[0]
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


# ------------------------------------------------------------------ measure

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


def measure(runs: int, sizes, budget_s: float) -> list:
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
            for key, cls in ((TORPOR, TorporSuspendResume), (BASELINE, BaselineActor)):
                try:
                    actors[key] = cls(mib)
                    notes[(key, mib)] = f"actor VmRSS {actors[key].rss_mib:.0f} MiB"
                except Exception as e:  # noqa: BLE001 - reported in results.json
                    errors[(key, mib)] = f"{size}: setting up the actor: {e}"
                    log(f"suspend_resume {key}: {errors[(key, mib)]}")
            if TORPOR in actors:
                actors[TORPOR].right_after = mib == RIGHT_AFTER_MIB and not COLD
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
    specs = [(f"resume_{size_name(m)}{'_cold' if COLD else ''}_ms", m, "resume") for m in sizes]
    if 1024 in sizes and not COLD:
        specs.append(("suspend_1gib_ms", 1024, "suspend"))
    if RIGHT_AFTER_MIB in sizes and not COLD:
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
            entries = measure(args.runs, sizes, budget)
        finally:
            cleanup_leftovers()
    bench.merge_results(entries)
    for e in entries:
        log(f"{e['name']}: torpor={e['torpor']} (p99 {e.get('torpor_p99')}) "
            f"baseline={e['baseline']} (p99 {e.get('baseline_p99')}) {e['unit']}"
            + (f"  [torpor error: {e['error']}]" if e.get("error") else "")
            + (f"  [baseline error: {e['baseline_error']}]" if e.get("baseline_error") else ""))


if __name__ == "__main__":
    main()
