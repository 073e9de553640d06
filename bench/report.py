#!/usr/bin/env python3
"""Renders bench/results.json (+ bench/environment.json) into BENCHMARKS.md at
the repository root and the bar chart bench/results.svg. Idempotent: run it
after any script has merged new entries.

    bench/report.py [--results PATH] [--markdown PATH] [--svg PATH]
"""

import argparse
import html
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

TORPOR_COLOR = "#2b7bb9"
BASELINE_COLOR = "#9a9a9a"
GOAL_COLOR = "#d62728"


# ---------------------------------------------------------------- evaluation

def ratio(e):
    t, b = e.get("torpor"), e.get("baseline")
    if t is None or b is None or b == 0:
        return None
    return t / b


def goal_status(e):
    """'met', 'not met' or None (no goal or no numbers). An absolute goal
    (no baseline ratio) carries its verdict in `goal_met`."""
    if isinstance(e.get("goal_met"), bool) and e.get("goal_max_ratio") is None and e.get("goal_min_ratio") is None:
        return "met" if e["goal_met"] else "not met"
    r = ratio(e)
    if r is None:
        return None
    mx, mn = e.get("goal_max_ratio"), e.get("goal_min_ratio")
    if mx is None and mn is None:
        return None
    ok = (mx is None or r <= mx) and (mn is None or r >= mn)
    return "met" if ok else "not met"


def fmt(v, unit=""):
    if v is None:
        return "—"
    if isinstance(v, float):
        s = f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    else:
        s = str(v)
    return s


# ---------------------------------------------------------------------- SVG

def render_svg(data: dict) -> str:
    entries = data.get("results", [])
    width, left, right = 760, 150, 120
    plot_w = width - left - right
    top = 58
    panel_h, bar_h = 92, 22
    height = top + panel_h * max(len(entries), 1) + 34
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="16" font-weight="bold">'
        f'torpor vs runc-v2 (containerd-shim-runc-v2)</text>',
        f'<text x="{width / 2}" y="40" text-anchor="middle" fill="#555">'
        f'{html.escape(data.get("date", ""))} — {html.escape(data.get("machine", ""))}</text>',
    ]
    for i, e in enumerate(entries):
        y0 = top + i * panel_h
        t, b = e.get("torpor"), e.get("baseline")
        tp99, bp99 = e.get("torpor_p99"), e.get("baseline_p99")
        goal_x = None
        if b is not None and e.get("goal_max_ratio") is not None:
            goal_x = b * e["goal_max_ratio"]
        elif b is not None and e.get("goal_min_ratio") is not None:
            goal_x = b * e["goal_min_ratio"]
        vmax = max([v for v in (t, b, tp99, bp99, goal_x) if isinstance(v, (int, float))] or [1]) * 1.08
        vmax = vmax or 1

        def xs(v):
            return left + plot_w * (v / vmax)

        better = "lower is better" if e.get("lower_is_better", True) else "higher is better"
        out.append(f'<text x="10" y="{y0 + 12}" font-weight="bold">{html.escape(e["name"])}'
                   f'<tspan dx="6" font-weight="normal" fill="#555">({html.escape(e.get("unit", ""))}, '
                   f'{better}{"; " + html.escape(e["goal"]) if e.get("goal") else ""})</tspan></text>')
        rows = ((f"torpor", t, tp99, TORPOR_COLOR, e.get("error")),
                (f"runc-v2", b, bp99, BASELINE_COLOR, e.get("baseline_error")))
        for j, (label, v, p99, color, err) in enumerate(rows):
            y = y0 + 20 + j * (bar_h + 6)
            out.append(f'<text x="{left - 8}" y="{y + bar_h / 2 + 4}" text-anchor="end">{label}</text>')
            if v is None:
                msg = (err or "no value")
                msg = msg if len(msg) <= 90 else msg[:87] + "..."
                out.append(f'<text x="{left + 4}" y="{y + bar_h / 2 + 4}" fill="{GOAL_COLOR}">'
                           f'error: {html.escape(msg)}</text>')
                continue
            w = max(xs(v) - left, 1)
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
            label_x = xs(v) + 6
            if isinstance(p99, (int, float)) and p99 > v:
                px = xs(p99)
                out.append(f'<line x1="{xs(v):.1f}" y1="{y + bar_h / 2}" x2="{px:.1f}" y2="{y + bar_h / 2}" '
                           f'stroke="#333" stroke-width="1"/>')
                out.append(f'<line x1="{px:.1f}" y1="{y + 5}" x2="{px:.1f}" y2="{y + bar_h - 5}" '
                           f'stroke="#333" stroke-width="1"/>')
                label_x = px + 6
                out.append(f'<text x="{label_x:.1f}" y="{y + bar_h / 2 + 4}">{fmt(v)} '
                           f'<tspan fill="#777">(p99 {fmt(p99)})</tspan></text>')
            else:
                out.append(f'<text x="{label_x:.1f}" y="{y + bar_h / 2 + 4}">{fmt(v)}</text>')
        if goal_x is not None:
            gx = xs(goal_x)
            out.append(f'<line x1="{gx:.1f}" y1="{y0 + 16}" x2="{gx:.1f}" y2="{y0 + 20 + 2 * bar_h + 10}" '
                       f'stroke="{GOAL_COLOR}" stroke-width="1.5" stroke-dasharray="4,3"/>')
            out.append(f'<text x="{gx:.1f}" y="{y0 + 20 + 2 * bar_h + 22}" text-anchor="middle" '
                       f'fill="{GOAL_COLOR}" font-size="10">goal</text>')
    ly = height - 14
    out.append(f'<rect x="{left}" y="{ly - 10}" width="12" height="12" fill="{TORPOR_COLOR}"/>'
               f'<text x="{left + 16}" y="{ly}">torpor (containerd-shim-torpor-v1)</text>')
    out.append(f'<rect x="{left + 250}" y="{ly - 10}" width="12" height="12" fill="{BASELINE_COLOR}"/>'
               f'<text x="{left + 266}" y="{ly}">baseline (containerd-shim-runc-v2)</text>')
    out.append(f'<line x1="{left + 500}" y1="{ly - 4}" x2="{left + 520}" y2="{ly - 4}" stroke="{GOAL_COLOR}" '
               f'stroke-dasharray="4,3" stroke-width="1.5"/><text x="{left + 524}" y="{ly}">goal</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------- markdown

def details(e) -> list:
    """Extra lines under the table for one entry."""
    lines = []
    if e.get("statistic"):
        lines.append(f"measured: {e['statistic']}")
    for key, who in (("torpor", "torpor"), ("baseline", "runc-v2")):
        bits = []
        if e.get(f"{key}_p99") is not None:
            bits.append(f"p99 {fmt(e[f'{key}_p99'])} {e['unit']}")
        if e.get(f"{key}_n") is not None:
            bits.append(f"n={e[f'{key}_n']}")
        ph = e.get(f"{key}_phases_p50_ms")
        if ph:
            bits.append("p50 per step: " + ", ".join(f"{k} {fmt(v)} ms" for k, v in ph.items()))
        if e.get(f"{key}_shim_processes") is not None:
            tot = e.get(f"{key}_total_rss_mib")
            bits.append(f"{e[f'{key}_shim_processes']} shim process(es)"
                        + (f", {fmt(tot)} MiB RSS in total" if tot is not None else ""))
        if e.get(f"{key}_pss_mib") is not None:
            bits.append(f"PSS {fmt(e[f'{key}_pss_mib'])} MiB per pod")
        if e.get(f"{key}_note"):
            bits.append(e[f"{key}_note"])
        if bits:
            lines.append(f"{who}: " + "; ".join(bits))
    sl = e.get("slowest_run")
    if sl:
        lines.append(f"slowest run: {fmt(sl['ms'])} {e['unit']}, of which the shim's resume "
                     f"{fmt(sl.get('last_resume_ms'))} ms; its phases: "
                     + ", ".join(f"{k} {fmt(v)} ms" for k, v in (sl.get("phases_ms") or {}).items()))
    if e.get("error"):
        lines.append(f"**torpor error:** `{e['error']}`")
    if e.get("rerun_failed"):
        lines.append(f"**a later run failed:** {e['rerun_failed']}")
    if e.get("baseline_error"):
        what = "baseline n/a" if e.get("baseline_na") else "**baseline error:**"
        lines.append(f"{what} `{e['baseline_error']}`")
    return lines


def render_markdown(data: dict, env: dict, svg_rel: str) -> str:
    entries = data.get("results", [])
    out = ["# torpor benchmarks", "",
           "torpor (`containerd-shim-torpor-v1`, CRI runtime handler `torpor`) measured side by side "
           "with the baseline `containerd-shim-runc-v2` (handler `runc`) in the same run, on the same "
           "private containerd, runc and CRIU (the test rig, `test/rig/`).", "",
           f"- date: {data.get('date', '?')}",
           f"- machine: {data.get('machine', '?')}"]
    for k in ("torpor_commit", "containerd", "containerd-shim-runc-v2", "runc", "criu", "crictl",
              "load_average_at_start"):
        if env.get(k):
            out.append(f"- {k.replace('_', ' ')}: `{env[k]}`")
    out += ["", "| name | unit | torpor | baseline (runc-v2) | ratio torpor/baseline | goal | goal met |",
            "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for e in entries:
        r = ratio(e)
        st = goal_status(e)
        t = fmt(e.get("torpor")) if e.get("torpor") is not None else ("**error**" if e.get("error") else "—")
        b = fmt(e.get("baseline")) if e.get("baseline") is not None else (
            "n/a" if e.get("baseline_na") else "**error**" if e.get("baseline_error") else "—")
        status = {"met": "yes", "not met": "**no**"}.get(st, "—")
        out.append(f"| {e['name']} | {e.get('unit', '')} | {t} | {b} | "
                   f"{'—' if r is None else f'{r:.2f}'} | {e.get('goal', '')} | {status} |")
    out += ["", f"![torpor vs runc-v2]({svg_rel})", ""]
    out += ["## Details", ""]
    for e in entries:
        lines = details(e)
        if not lines:
            continue
        out.append(f"**{e['name']}**" + (f" ({'lower' if e.get('lower_is_better', True) else 'higher'} is better)"))
        out.append("")
        out += [f"- {line}" for line in lines]
        out.append("")
    out += [
        "## How to reproduce", "",
        "As root, on a Linux host (installs containerd, runc, CRIU, crictl, CNI "
        "plugins and the test images first):", "",
        "```sh",
        "scripts/deps.sh",
        "make bench            # = bench/run.sh",
        "```", "",
        "`bench/run.sh` builds the shim (`cargo build --release -p torpor-shim`), brings up its own "
        "instance of the test rig (`test/rig/up.sh` with `TORPOR_RIG_STATE=/run/torpor-bench`, "
        "`TORPOR_RIG_ROOT=/var/lib/torpor-bench`, bridge `torpor-bench0`, cgroup `/torpor-bench`: a "
        "private containerd with the runtimes `runc` and `torpor`, a CNI bridge network and the local "
        "test images; containerd finds the shim in a directory holding only a copy of "
        "`target/release/containerd-shim-torpor-v1`), runs every benchmark script, writes "
        "`bench/results.json`, this file and `bench/results.svg`, removes its pods and tears its rig "
        "down again (`test/rig/down.sh`; the image content store under `/var/lib/torpor-bench` is "
        "kept for the next run). A developer's rig on `/run/torpor-test` is left alone "
        "(`TORPOR_BENCH_RIG=shared` measures on that one instead). A run takes about 70 s on 2 cores "
        "once the shim is built.", "",
        "Knobs (environment): `TORPOR_BENCH_PODS` (pods per runtime for pod_start_ms, default 40), "
        "`TORPOR_BENCH_RSS_PODS` (pods per runtime for shim_rss_mib, default 20), "
        "`TORPOR_BENCH_ONLY` (space-separated subset of benchmark scripts, e.g. `pod_start`), "
        "`TORPOR_BENCH_SKIP_BUILD=1`, `TORPOR_RIG_KEEP=1` (leave the rig up).", "",
        "## Method", "",
        "- **pod_start_ms**: for each runtime, one unmeasured warm-up pod, then N pods one after "
        "another, interleaving the runtimes; each is timed from the start of `crictl runp` through "
        "`crictl create` and `crictl start` until `crictl inspect` reports `CONTAINER_RUNNING` "
        "(container: `/actor sleep` from `localhost/torpor-test/actor:latest`). Every crictl call is "
        "a separate process, as each kubelet CRI call is a separate RPC; the crictl process start-up "
        "cost is the same for both runtimes. Pods are stopped and removed (untimed) between samples. "
        "Reported: p50 (p99 in the details).",
        "- **shim_rss_mib**: per runtime, N pods with one `/actor sleep` container each are started; "
        "after a few seconds the VmRSS (`/proc/<pid>/status`) of the runtime's shim processes serving "
        "those pods (matched by binary name, the rig's containerd address and the pod/container id "
        "on their command line) is summed and divided by N. PSS (`smaps_rollup`, shared pages "
        "divided among the processes sharing them) is given in the details.",
        "- ratio = torpor / baseline; a ratio goal is met when the ratio is within its bound; an "
        "absolute goal (e.g. a p99 bound) is judged by the script that measured it (`goal_met`).",
        "- Timings depend on whatever else runs on the machine (the load average at the start is "
        "listed above): compare the ratio, measured in one run with interleaved samples, rather "
        "than absolute times across runs.",
        "- **suspend_1gib_ms spreads from 0.75 to 3.7 s on this machine, in its dump phase**, for "
        "a reason outside torpor: writing new page cache is slow here once earlier writes are in "
        "it. A plain `dd` of 1 GiB into a new file on the same disk took 0.47-1.4 s for the first "
        "GiB and 2.7-3.1 s for each following one, 73% of its samples in the copy into the new "
        "page cache folios (`copy_folio_from_iter_atomic`); a slow dump spends 40% of its samples "
        "in the same copy (CRIU's `splice` into the image file). It did not change with the "
        "guest's free page reporting made coarser, nor with the store's background work at nice "
        "19; the mechanism (likely the VM host's own work for the virtual disk) was not found. "
        "The same dump into recycled memory takes 0.40-0.58 s. Since the dump's early writeback "
        "(`runtime::system::writeback`) the fsync after it takes 15 ms p50 (was 318).",
        "- **Where resume_256mib_ms goes** (sched tracepoints over probe resumes of the bench's "
        "actor, 2026-12-05): from the lazy-pages daemon's exec, runc is exec'd 5.6 ms later (the "
        "shim's restore set-up between the two spawns), asks CRIU's version through the launcher at "
        "11.8 ms (answered by 14.5), execs the real `criu swrk` at 18.4 ms (cgroups, mounts and the "
        "request in between), CRIU exits at 41.6 ms and runc at 43.5 ms. So runc costs about 15 ms "
        "of the restore besides CRIU's 23 ms. Inside CRIU (restore.log of 9 resumes, 13-30 ms): "
        "about 3.5 ms between its pre-resume notification and the tasks' resumption, 2-4 ms at its "
        "start in a fork-and-ptrace probe of the kernel (`kerndat_has_ptrace_get_rseq_conf`, run "
        "on every invocation; 0.45 ms on an idle machine), and 1 ms for runc's post-restore "
        "notification. The 2 CPUs are 96% busy during the resume's 64 ms: CRIU (restore and "
        "lazy-pages daemon) 48 ms, torpor-snapshotter 46 ms (digesting the chunks of the snapshot "
        "the suspend just wrote: the bench resumes right after the suspend), runc 12 ms, the shim "
        "6 ms. In paired runs (alternating in one rig, n=12-15 each), neither the lazy-pages daemon "
        "at SCHED_IDLE or nice 19 (52.0 and 54.4 ms p50 against 61.7; then 57.6 against 59.6) nor "
        "the snapshotter at nice 19 (62.9 against 58.4) made a difference beyond the noise.", "",
        "- **Restore without runc** (since a0ad8f7): the shim drives CRIU over its RPC itself "
        "(`runtime::system::criu_restore`), from a template its suspend takes (runc's state and the "
        "container's cgroup values), and writes runc's state as runc would; runc restores only "
        "where there is no template (a container's first restore on a node: after a move, a "
        "restore by identity, a clone). Measured side by side with the run before it (b6d99ea, "
        "load 1.11, against a0ad8f7, load 1.02): resume_256mib_ms p50 62.0 -> 46.3 ms and p99 "
        "130.8 -> 69.2 ms, the shim's restore phase (CRIU, and runc before) 45.2 -> 32.6 ms at "
        "p50, CPU per resume 24.0 -> 10.5 ms; resume_1gib_ms 61.4 / 173.4 -> 47.8 / 103.8 ms; "
        "resume_256mib_cold_ms 100.4 / 134.1 -> 84.3 / 119.0 ms; wakeups_per_s 21.3 -> 28.4. The "
        "phase is named `restore` from a0ad8f7 on (`runc_restore` before). The next run (2e9f25e, "
        "load 0.77; the runc-v2 baseline 7% slower than in the run before, 307.5 -> 330.4 ms) gave "
        "resume_256mib_ms 52.1 / 73.2 ms: the p50 goal of 50 ms is met in one run and missed by "
        "2 ms in the other.", "",
        "- **Where wakeups_per_s goes** (perf over one round of 40 wake-ups at 2e9f25e, "
        "2026-12-05): the 2 CPUs are 98% busy (idle 2-5 jiffies of 320), 80% of it in the "
        "kernel. `criu` (the restores and their lazy-pages daemons) has 62% of the samples, "
        "`_copy_from_user` alone 32% (UFFDIO_COPY of the pages into the restored processes), "
        "the daemons' reads of the page images 7% (`_copy_to_iter`), zeroing new pages 5%: the "
        "40 x 64 MiB (2.5 GiB) of memory is copied into memory new to the guest at about 2.3 "
        "GB/s. The shims have 11-13%, nsenter, iptables-restore and ip6tables-restore (taking "
        "the SYN-drop rules out after each handover) 6%. The lazy-pages daemons prefetch every "
        "page as soon as their restore ends, while other actors still wait for their first "
        "answer. A restore without lazy pages copies the pages "
        "before the process runs and is slower (TORPOR_LAZY_PAGES=0: 10.5 and 5.2 wake-ups/s). "
        "Until 2e9f25e the shims also ran a `runc events --stats` for each running container "
        "once a second (containerd's CRI stats collector): 40 idle running actors kept the "
        "node 15.9% busy; 4.0% since the shim reads the cgroup itself.", "",
        "- **The deferred prefetch** (since 7a47aa6 and 44c7014): a local restore's lazy-pages "
        "daemon copies the pages no fault asked for 1 s after the restore "
        "(`TORPOR_LAZY_PREFETCH_DELAY_MS`), or as soon as the process faulted in 1 MiB, its "
        "command line and environment first; torpor's CRIU patch "
        "(`scripts/criu-patches/0001-uffd-prefetch-delay.patch`). A woken actor answering one "
        "request faults in 20 to 60 pages. Measured on a new machine, about 1.5-2x slower than "
        "the one before (runc-v2's resume_256mib 476 ms p50 against 330; the CPU per torpor "
        "resume 23 ms against 12): with the delay through a wrapper, alternating in one rig, "
        "40 wake-ups at once gave 17.0, 13.3, 16.3, 11.4, 15.8, 16.9 and 13.4 wake-ups/s with "
        "1 s against 11.2, 13.6, 11.5, 13.8, 12.8, 14.3 and 13.2 without (median 15.8 against "
        "13.2), and 17.0 and 17.7 with the copy wholly after the storm (4 s): what is left is "
        "the restores themselves. In the bench run at 44c7014, wakeups_per_s is 20.1 against "
        "runc-v2's 5.2 (3.9x; 29.5 against 10.0, 2.95x, on the machine before). The cost: a "
        "suspend within the delay after a resume waits for it, and the bench's untimed "
        "settling between runs grows by it (resume_256mib_ms got 16 of its 30 runs in the "
        "420 s budget; suspend_resume has 1080 s since). In that run torpor's resume_1gib_ms "
        "stopped at its 5th run, the actor frozen by the lease fence (next item). "
        "clone_10_actors_ms is 2584 against 2101 ms (1.23; 1.15 before): 10 concurrent "
        "`crictl runp` take 1109 ms p50 here against 491, and the baseline creates no pods.", "",
        "- **The lease fence's false freezes** (fixed in 490bef9): in the 1 GiB loop the shim's "
        "lease fence froze the running actor 2 to 5 times per 22 runs, and a run failed when "
        "the freeze came before the request. The daemon's log showed why: each renewal waited "
        "for the object tier (versitygw on the same disk, up to 1.6 s) and then for a database "
        "commit (up to 2 s of fsync behind the dumps), on the runtime that answers the shims' "
        "confirmations; the renewal passes also started 2 s after the end of the last one, not "
        "of its start. Now a renewal is in memory once the object tier has it (the database "
        "record follows on a blocking thread), a confirmation asked during a renewal answers "
        "with the validity held, and the passes keep their period. The same 22-run loop, run again, froze nothing "
        "(daemon and shim logs). suspend_resume at 7710c02 measured 30 runs of each size with no failure: "
        "resume_256mib_ms 65.5 / 129.2 ms, resume_1gib_ms 69.5 / 277.6 ms (p50 / p99). The p99 "
        "of 30 runs is their worst, one run each (138.8 and 348.8 ms; the next 105.8 and 103.1). "
        "By the phases' p99, the 256 MiB one was in CRIU's restore (103 ms) and the 1 GiB one "
        "in the shim's fsync of the RUNNING record (140 ms) and the proxying (152 ms), most "
        "likely behind the commit of the snapshot before. suspend_1gib_ms is 2621 / "
        "3998 ms, the dump itself 2218 ms p50: CRIU writes the whole GiB while the previous "
        "snapshot's commit and writeback still use the disk.", "",
        "- **Deleting snapshots stalled resumes** (f8f30b8): the store now prunes, every "
        "background pass, an actor's generations beyond its newest `gc_keep` that never left "
        "the node (before, the 1 GiB loop filled the local tier past its 20 GiB budget, and "
        "each generation was then uploaded under disk pressure only to be collected). Measured "
        "with the prune alone, resume_1gib_ms got far worse: 89.2 / 919 ms, 10 of 30 runs at "
        "271-954 ms, the p99 of view_staging, handover_begin and record_running at 320-450 ms. "
        "Unlinking a 1 GiB file holds ext4's journal (mounted with `discard` here): the unlink "
        "took 660 ms and a small fsync beside it 240 ms. Removed trees are now deleted by a "
        "background thread that cuts big files down 16 MiB every 50 ms (the worst fsync beside "
        "it: 4 ms). suspend_resume at f8f30b8, 30 runs of each size, no failure: "
        "resume_256mib_ms 61.5 / 86.2 ms and resume_1gib_ms 63.9 / 97.6 ms (p50 / p99), both "
        "p99 goals met; suspend_1gib_ms 2462 / 3273 ms. The suspend is bound by the disk: "
        "`dd` writes a GiB with fsync in 2.26 s on this VM, and CRIU's incremental dumps "
        "(`--track-mem`) need soft-dirty tracking, which this kernel lacks "
        "(CONFIG_MEM_SOFT_DIRTY is not set; `criu check --feature mem_dirty_track` fails).", "",
        "- **Clones and restores by identity with lazy pages** (481487e): a restore from a "
        "local snapshot into a new pod (a clone, or an actor's pod made again on its node) now "
        "serves the memory on demand like a resume, instead of CRIU copying all of it first. "
        "One clone of a 512 MiB golden actor, 5 in a row: the first answer in 397 ms p50 "
        "against 671 ms restored in full (one rig per mode, TORPOR_LAZY_PAGES=1 then 0). "
        "clone_10_actors_ms at ee18f4d: 1842 against runc-v2's 1562 ms (ratio 1.18; 1.23 "
        "before). The 10 restores of 64 MiB are not what is left: the first torpor clone "
        "answers in 1358 ms p50, the first runc-v2 restore in 1357 ms; the last clone waits "
        "for the 10 pod sandboxes (`crictl runp` 891 ms p50 of the 10 made at once), which "
        "the baseline does not make. Made alone, 10 sandboxes at once take 569-622 ms p50 with "
        "torpor against 624-760 ms with runc-v2 (4 alternating rounds): torpor's sandbox is "
        "not the slower one. perf over one repetition of each: torpor's CPUs are 34% idle, "
        "crictl (4 processes per clone) has 17% of the samples, runc 10%, containerd 10%, "
        "CRIU 7%; runc-v2's are 57% idle, ctr (2 per clone) 11%, containerd 8%, CRIU 6%.", "",
        "- **The restore returns once CRIU's tasks run; the trigger once the suspend settled** "
        "(894f1d4). Where a 256 MiB resume's restore went, from the shim's log (one rig, 5 "
        "resumes): set-up 1.1 ms, CRIU's spawn 0.9, CRIU moved into the container's 11 cgroups "
        "3.0, CRIU's start up to its first notification 3.6 (of which 3.3 in its kernel probe's "
        "fork and ptrace of a child, every run), namespaces 3.1, the 21 mounts 9.4, the tasks, "
        "memory and files 8, up to `post-resume` 3.4; then CRIU's answer, its exit and the "
        "unmount of criu-root took 3 ms more on the resume's path: now in the background. "
        "CRIU's log level (4 against 2, 10 alternating pairs) changed nothing measurable (61.7 "
        "against 64.1 ms p50). Until 894f1d4 the bench's trigger came a few ms after torporctl "
        "returned, while the shim's background commit of the dump (0.7 s at 256 MiB) still "
        "wrote beside the restore: 10 alternating pairs in one rig gave 52.8 ms p50 right "
        "after the suspend against 43.3 after the commit (the restore phase 32.2 against 24.4). "
        "A wake-up seconds or minutes after a suspend finds it committed, so "
        "resume_<size>_ms now triggers after the commit (an untimed wait), and "
        "resume_256mib_right_after_suspend_ms times the other case in the same runs. At 894f1d4 "
        "(load 0.44; runc-v2's resume_256mib 474 ms here against 422 in the run before): "
        "resume_256mib_ms 54.9 / 96.1 ms, resume_1gib_ms 53.4 / 89.1 ms, right after the "
        "suspend 67.7 / 101.3 ms (p50 / p99); the p50 goal of 50 ms is still missed. The "
        "restore phase is 29.5 ms at p50 (39.9 before); the store's checkout is next at 12.4 "
        "ms (a lease committed to its database, the manifest read and checked, every file "
        "stat'ed), measured while the store deletes the superseded generation beside it "
        "(an fsync on the idle disk: 0.14 ms).", "",
        "- **The checkout, and the storm's iptables** (f4d8b93, d55d65e). The store's side of "
        "a checkout took 1.6-2.0 ms, yet the shim's checkout phase 9.7 ms p50: the lease's "
        "database commit (an fsync) took 4-11 ms when it came right after the suspend's commit, "
        "whose prune had just put the generation before into the trash, cut down 16 MiB every "
        "50 ms; on ext4 mounted with `discard`, the next fsync waits for the journal commit that "
        "frees those extents. Beside a 256 MiB file cut by 16 MiB every 50 ms, one small fsync "
        "in ten took 5 to 12 ms; cut by 4 MiB every 12.5 ms (the same pace), 1.3 to 4 ms. The "
        "trash now cuts 4 MiB at a time, and the lease's commit takes 0.5-1 ms there. RESUMING "
        "is saved with the checkout's lease in one save (two fsynced saves before). In a 40-actor "
        "wake-up storm, nsenter, iptables-restore and ip6tables-restore had 9% of the CPU samples "
        "(each handover took its SYN-drop pair out at once, in 4 processes): the tools now join "
        "the pod's network namespace between fork and exec (no nsenter), and the pair stays 5 s "
        "after a handover (a hold within that time takes it over); in the storm they have none. "
        "The storm is also slowed by dying memory cgroups: a deleted memcg lives on while page "
        "cache is charged to it, about 55 a round here; with about 1000 left by earlier runs, 40 "
        "wake-ups took 65, 88 and 112 ms of CPU each (31.8, 24.2, 20.8 wake-ups/s), and 58, 67 and "
        "64 ms (37.0, 30.9, 32.8) right after a drop of the page cache had freed them. "
        "wakeups_per_s now drops the page cache (untimed) before each runtime's actors are made, "
        "and wakes them once every suspend's commit is done. At d55d65e (load 0.25; runc-v2's "
        "resume_256mib 533 ms here against 474 in the run before): resume_256mib_ms 43.3 / 75.9 "
        "ms (p50 / p99; checkout 2.5 ms p50): both goals met; resume_1gib_ms 43.1 / 72.0; "
        "resume_256mib_cold_ms 67.7 / 81.2; right after the suspend 65.7 / 87.3; wakeups_per_s "
        "33.2 (rounds 34.5, 29.4, 33.2) against runc-v2's 6.4, the goal of 50 still missed; "
        "suspend_1gib_ms 2516 / 2738 ms.", "",
        "- **Clones from the object tier** (091542c). A checkout of a snapshot whose stream is "
        "under way now joins that stream (a lease of its own on the same partial copy and page "
        "server) instead of waiting for its last byte. New entry clone_10_actors_remote_ms: the "
        "10 clones made at once on node B, whose store has no copy of the golden snapshot: node "
        "B's store fetched 64.1 MiB per repetition for a 65.2 MiB snapshot (once, not 10 times; "
        "in one repetition logged, 6 of the 9 later checkouts joined the stream, 3 came after it "
        "ended), all 10 "
        "answered in 2254 ms p50 against 1665 ms from the local copy. Here the clones are "
        "CPU-bound (10 pods on 2 cores), so joining did not shorten the repetition (2298 ms p50 "
        "over 2 repetitions before it). clone_10_actors_ms is 1665 against runc-v2's 1478 ms "
        "(1.13); the first clone answers sooner than the first runc-v2 restore (1145 against "
        "1287 ms): what is left is the 10 pod sandboxes. resume_cross_node_256mib_ms is 453 / "
        "615 ms (p50 / p99) at e2b79a9 (515 / 823 in a run that did not wait for the stores' "
        "trash), against 321 / 480 at 1adfd24: every step is slower, those torpor does not touch "
        "too (crictl runp 96 against 70 ms, crictl inspectp 85 against 48), and the shim's "
        "restore 87 against 64 ms; the cause is not found (not the dying memory cgroups: the "
        "page cache is dropped first now; not the trash: waited for). resume_remote_256mib_ms "
        "122 / 237 ms.", "",
        "- **The stream's bulk waits for the first answer** (29f4511). The cross-node regression "
        "above was the machine: 1adfd24 built and measured here gives 391 / 672 ms (the 321 / "
        "480 were measured on the faster machine before ef9d30f). Node B's logs then showed "
        "what the time was: StartContainer returned 69 ms after the shim's restore was done "
        "(12 ms after a plain start), crictl inspectp took 69 ms (41 without a stream beside "
        "it): the stream's background fetch (16 GETs in flight, AEAD, zstd, writes of 256 MiB; "
        "versitygw serving them on the same 2 cores) began the moment the checkout answered, "
        "and the CRIU lazy-pages daemon of a streamed restore asked for every page at once, so "
        "the restore, containerd and the first answer ran on what CPU was left. Now the chunks "
        "no fault asked for wait `stream_background_delay` (300 ms, config) after the "
        "checkout's answer (the working set and faulted pages are fetched at once), and the "
        "daemon waits the prefetch delay as after a local restore. At 29f4511 (load 0.85): "
        "resume_cross_node_256mib_ms 299 / 341 ms (p50 / p99 of 30; goal p99 <= 500 met; 453 / "
        "615 before): crictl start 124 ms (198), the shim's restore 45 ms (76), crictl inspectp "
        "23 ms (69); resume_remote_256mib_ms 80 / 100 (122 / 237); clone_10_actors_remote_ms "
        "2029 (2254), 64.1 MiB fetched per 10 clones. clone_10_actors_ms (local copy, not "
        "touched by this) is 1813 against runc-v2's 1487 ms (1.22; 1.13 in the run before): "
        "10 concurrent crictl runp take 834 ms of it, pod sandboxes runc-v2's `ctr c restore` "
        "does not make; its first answer is 1277 against 1143 ms.", "",
        "- **A streamed copy's placement adds nothing to what its checkouts read; chunks are "
        "decoded on the blocking pool** (6866843, 85b0509). A run at 6866843 had "
        "clone_10_actors_remote_ms fail: a clone that joined the stream just before its end "
        "was refused by its seal check (\"not the dump that was sealed\"): the placement wrote "
        "`.manifest.json.tmp` into the directory the checkouts restore from. The manifest now "
        "goes into the local copy's hard-link tree only. A streamed chunk is now verified, "
        "decrypted, decompressed and written on the blocking pool, as a whole fetch's are. "
        "resume_remote_256mib_ms now keeps the shim's phases of its slowest run: in a run at "
        "85b0509 one resume of 30 took 771 ms (the other 29 <= 89 ms, every stream's first page "
        "<= 70 ms after its checkout began; nothing recorded where the rest went), not in a "
        "repeat of 30 nor in the run below. At 691c32b (load 0.50): resume_remote_256mib_ms "
        "80 / 121 ms (slowest 124 ms: checkout 60, restore 45); resume_cross_node_256mib_ms "
        "284 / 382 ms (p50 / p99 of 30; goal p99 <= 500 met); clone_10_actors_remote_ms 2083 "
        "ms, 64.1 MiB fetched per 10 clones; clone_10_actors_ms 1634 against runc-v2's 1381 ms "
        "(1.18): 10 concurrent crictl runp take 690 ms of it.", "",
        "## Adding a benchmark", "",
        "See `bench/README.md`: a script `bench/<name>.py` measures with the helpers in "
        "`bench/bench.py` and merges its entries by name into `bench/results.json`; "
        "`bench/report.py` renders this file.", "",
    ]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=bench.RESULTS_PATH)
    ap.add_argument("--markdown", default=os.path.join(bench.REPO_ROOT, "BENCHMARKS.md"))
    ap.add_argument("--svg", default=os.path.join(bench.BENCH_DIR, "results.svg"))
    args = ap.parse_args()
    data = bench.load_results(args.results)
    try:
        with open(bench.ENVIRONMENT_PATH) as f:
            env = json.load(f)
    except (OSError, ValueError):
        env = {}
    with open(args.svg, "w") as f:
        f.write(render_svg(data))
    svg_rel = os.path.relpath(args.svg, os.path.dirname(os.path.abspath(args.markdown)))
    with open(args.markdown, "w") as f:
        f.write(render_markdown(data, env, svg_rel))
    bench.log(f"wrote {args.markdown} and {args.svg}")


if __name__ == "__main__":
    main()
