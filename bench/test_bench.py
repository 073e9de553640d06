#!/usr/bin/env python3
"""Unit tests of bench.py's run loop and statistics, and of the entries
suspend_harness.measure() makes (with stand-in actors; no rig needed):

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import RunError, RunFailed, run_rounds  # noqa: E402
import suspend_harness  # noqa: E402


class RunRounds(unittest.TestCase):
    def test_alternates_the_order_and_stops_at_runs(self):
        order = []
        subjects = {k: (lambda i, k=k: order.append((i, k)) or i) for k in ("a", "b")}
        t = run_rounds("t", subjects, 3)
        self.assertEqual(order, [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")])
        self.assertEqual(t["a"].samples, [0, 1, 2])
        self.assertIsNone(t["a"].error)

    def test_fixed_order(self):
        order = []
        run_rounds("t", {k: (lambda i, k=k: order.append(k)) for k in ("a", "b")}, 2, alternate=False)
        self.assertEqual(order, ["a", "b", "a", "b"])

    def test_an_error_ends_only_that_subject(self):
        def bad(i):
            if i == 1:
                raise RunError("broken")
            return i

        t = run_rounds("t", {"bad": bad, "good": lambda i: i}, 4,
                       error_text=lambda k, i, e: f"{k} run {i + 1}: {e}")
        self.assertEqual(t["bad"].samples, [0])
        self.assertEqual(t["bad"].error, "bad run 2: broken")
        self.assertEqual(t["good"].samples, [0, 1, 2, 3])

    def test_failed_runs_are_tolerated_up_to_runs_and_keep_their_partial(self):
        def flaky(i):
            if i % 2:
                raise RunFailed(f"no answer {i}", partial={"resume": None, "i": i})
            return {"resume": 1.0, "i": i}

        t = run_rounds("t", {"x": flaky}, 3, tolerate=True, counted=lambda s: s["resume"] is not None)["x"]
        self.assertEqual([s["i"] for s in t.samples], [0, 1, 2, 3, 4])
        self.assertEqual(t.failures, ["no answer 1", "no answer 3"])
        self.assertIsNone(t.error)

        def always(_i):
            raise RunFailed("never")

        t = run_rounds("t", {"x": always}, 2, tolerate=True)["x"]
        self.assertEqual(len(t.failures), 3)
        self.assertEqual(t.error, "more than 2 failed runs")

    def test_a_failed_run_without_tolerate_is_an_error(self):
        def fails(_i):
            raise RunFailed("no answer")

        t = run_rounds("t", {"x": fails}, 2)["x"]
        self.assertEqual(t.error, "RunFailed: no answer")
        self.assertEqual(t.failures, [])

    def test_deadline_stops_the_rounds(self):
        t = run_rounds("t", {"x": lambda i: i}, 5, deadline=time.monotonic() - 1)["x"]
        self.assertEqual(t.samples, [])
        self.assertEqual(t.stopped, "stopped after 0 of 5 runs (time budget)")

        def slow(i):
            time.sleep(0.05)
            return i

        # at the pace of the first round, a second one would end after the deadline
        t = run_rounds("t", {"x": slow}, 5, deadline=time.monotonic() + 0.07, predict=True,
                       unit="repetitions")["x"]
        self.assertEqual(t.samples, [0])
        self.assertEqual(t.stopped, "stopped after 1 of 5 repetitions (time budget)")

    def test_rounds_and_earlier_tallies(self):
        tallies = {}
        run_rounds("t", {"x": lambda i: i}, 5, rounds=1, tallies=tallies)
        self.assertEqual(tallies["x"].samples, [0])
        run_rounds("t", {"x": lambda i: 10 + i}, 3, tallies=tallies)
        self.assertEqual(tallies["x"].samples, [0, 10, 11])


class Statistics(unittest.TestCase):
    def test_percentile_and_pct(self):
        self.assertEqual(bench.percentile([1, 2, 3, 4], 50), 2.5)
        self.assertEqual(bench.pct([1.04, 2.0], 0), 1.0)
        self.assertIsNone(bench.pct([], 50))

    def test_check_counter(self):
        bench.check_counter("4", 4)
        with self.assertRaises(RunFailed):
            bench.check_counter("3", 4)

    def test_size_name(self):
        self.assertEqual([bench.size_name(m) for m in (16, 256, 1024, 2048)], ["16mib", "256mib", "1gib", "2gib"])


class SuspendResumeEntries(unittest.TestCase):
    """suspend_harness.measure() as suspend_resume.py and resume_cold.py run it."""

    def measure(self, cold):
        seen = set()

        class Stand:
            right_after = cold = False

            def __init__(self, mib):
                self.mib, self.rss_mib = mib, 1.0

            def run(self):
                seen.add((self.key, self.mib, self.cold, self.right_after))
                return {"suspend": 900.0, "suspend_phases": {"s": 1.0}, "suspend_gone_polls": 0, "resume": 50.0,
                        "resume_phases": {"r": 2.0}, "resume_right_after": 60.0, "resume_right_after_phases": {}}

            def check_memory(self):
                pass

            def remove(self):
                pass

        saved = suspend_harness.TorporSuspendResume, suspend_harness.BaselineSuspendResume
        suspend_harness.TorporSuspendResume = type("T", (Stand,), {"key": bench.TORPOR})
        suspend_harness.BaselineSuspendResume = type("B", (Stand,), {"key": bench.BASELINE})
        try:
            entries = suspend_harness.measure(2, [256, 1024], 600, cold=cold)
        finally:
            suspend_harness.TorporSuspendResume, suspend_harness.BaselineSuspendResume = saved
        return [e["name"] for e in entries], seen

    def test_warm_and_cold(self):
        names, seen = self.measure(cold=False)
        self.assertEqual(names, ["resume_256mib_ms", "resume_1gib_ms", "suspend_1gib_ms",
                                 "resume_256mib_right_after_suspend_ms"])
        self.assertIn((bench.TORPOR, 256, False, True), seen)
        names, seen = self.measure(cold=True)
        self.assertEqual(names, ["resume_256mib_cold_ms", "resume_1gib_cold_ms"])
        self.assertEqual({(c, ra) for _k, _m, c, ra in seen}, {(True, False)})


if __name__ == "__main__":
    unittest.main()
