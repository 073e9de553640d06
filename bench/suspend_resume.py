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

The measurement is in suspend_harness.py (measure(), shared with
resume_cold.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suspend_harness  # noqa: E402


def main():
    suspend_harness.main(__doc__)


if __name__ == "__main__":
    main()
