#!/usr/bin/env python3
"""resume_256mib_cold_ms: bench/suspend_resume.py's resume with the page
cache dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, untimed) right
before each trigger, torpor and runc-v2 alike: the snapshot's pages, CRIU,
runc and the shims are read from disk. Goal: p99 <= 200 ms.

    bench/resume_cold.py [--runs N] [--sizes 256]

The same measurement as suspend_resume.py (suspend_harness.measure() with
`cold`) and the same environment (TORPOR_BENCH_SR_RUNS,
TORPOR_BENCH_SR_SIZES_MIB, default here "256", TORPOR_BENCH_SR_BUDGET_S, ...).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suspend_harness  # noqa: E402

if __name__ == "__main__":
    os.environ.setdefault("TORPOR_BENCH_SR_SIZES_MIB", "256")
    suspend_harness.main(__doc__, cold=True)
