#!/usr/bin/env python3
"""wake_burst_100_p99_ms: 100 clients connecting at once to one suspended
actor (`/actor counter --alloc-mib 64`), each sending `inc`; the time from
the common t0 to each client's first byte of the answer. torpor: the shim
holds the actor's port while it sleeps, the first real connection wakes it,
every connection (held, or taken by the spare listener while it restores)
is handed over. Baseline: runc-v2's cold start of the same actor (`crictl
start` of the created container at t0, the 100 clients connecting from t0
on, retrying while refused), as a service scaled from zero that a burst of
traffic finds not running.

One round, per runtime:

1. untimed: torpor: the actor is suspended (`torporctl suspend`, its
   background commit done); then a single client wakes it (timed alone:
   the single-client wake the goal compares with) and it is suspended
   again. runc-v2: the container is created (`crictl create`), not started.
2. TIMED from one common t0: 100 connections to the pod IP opened at once
   by one thread (non-blocking sockets), each sends `inc` and waits for the
   first byte of the answer (runc-v2: a thread runs `crictl start` at t0).
   Every answer must be one of the counter's next 100 values, each once, or
   the round fails. torpor: the same burst again, untimed for the entry,
   against the actor now running: the floor (`torpor_running_*`), what the
   clients and the actor cost with no resume.
3. untimed: runc-v2: the container is stopped and removed.

The entry's `torpor` / `baseline` is the p50 of all clients' latencies over
all rounds, `torpor_p99` / `baseline_p99` their p99; `torpor_single_p50_ms`
the single-client wake's p50. Goal: torpor's p99 within 2x the single
client's wake (before the spare listener, 35 of 50 clients waited for a
SYN retransmit: about 1030 ms, against 40-55 ms for one client).

    bench/wake_burst.py [--clients N] [--rounds R] [--mib M]

Environment: TORPOR_BENCH_BURST_CLIENTS (100), TORPOR_BENCH_BURST_ROUNDS
(5), TORPOR_BENCH_BURST_MIB (64). TORPOR_BENCH_BURST_NO_SPARE=1 (a
diagnostic: the entry is logged, not merged into results.json): before each burst the shim's TPROXY pair is taken
out of the pod's namespace, so the SYNs of the restore window are dropped as
they were before the spare listener (the shim then fails to take out the
rest of the pair at the handover; the pod goes with the run).
"""

import argparse
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import (BASELINE, TORPOR, BenchPod, RunError, RunFailed, TorporActor, check_counter,  # noqa: E402
                   inc_first_byte, log, ms, now_ns, pct)

GOAL = "p99 of 100 clients at once <= 2x a single client's wake (p50)"
GOAL_RATIO = 2.0
NO_SPARE = os.environ.get("TORPOR_BENCH_BURST_NO_SPARE", "0") == "1"


def burst(ip: str, clients: int, retry_refused: bool, start=None) -> tuple:
    """`clients` connections opened at once to ip, each sending `inc`; `start()`
    (if any) run at t0 in a thread. One thread drives every client with
    non-blocking sockets (a selector): the clients' own cost is a few
    microseconds each, where 100 Python threads contending for the GIL on
    2 cores added tens of milliseconds to the tail whatever the server.
    Returns (latencies in ms from t0 to each client's first byte, replies)."""
    import errno
    import selectors
    import socket

    sel = selectors.DefaultSelector()
    first = [None] * clients
    bufs = [b""] * clients
    done = [None] * clients
    started = {}

    def open_one(i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        rc = s.connect_ex((ip, bench.ACTOR_PORT))
        if rc not in (0, errno.EINPROGRESS):
            s.close()
            raise RunError(f"client {i}: connect: {os.strerror(rc)}")
        sel.register(s, selectors.EVENT_WRITE, (i, "connect"))

    def starter():
        try:
            start()
        except Exception as e:  # noqa: BLE001
            started["error"] = e

    t0 = now_ns()
    if start:
        threading.Thread(target=starter, daemon=True).start()
    for i in range(clients):
        open_one(i)
    retry = []  # (when_ns, i): refused connects to open again (runc-v2: nobody listens yet)
    deadline = t0 + int(bench.TRIGGER_TIMEOUT_S * 1e9)
    pending = clients
    try:
        while pending:
            now = now_ns()
            if now > deadline:
                raise RunFailed(f"{pending} of {clients} clients not answered within {bench.TRIGGER_TIMEOUT_S:.0f} s")
            for when, i in [r for r in retry if r[0] <= now]:
                retry.remove((when, i))
                open_one(i)
            timeout = 0.001 if retry else 0.1
            for key, _ in sel.select(timeout):
                s, (i, phase) = key.fileobj, key.data
                if phase == "connect":
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        sel.unregister(s)
                        s.close()
                        if err == errno.ECONNREFUSED and retry_refused:
                            retry.append((now_ns() + 1_000_000, i))
                            continue
                        raise RunFailed(f"client {i}: connect: {os.strerror(err)}")
                    s.sendall(b"inc\n")
                    sel.modify(s, selectors.EVENT_READ, (i, "read"))
                    continue
                data = s.recv(64)
                if first[i] is None and data:
                    first[i] = now_ns()
                bufs[i] += data
                if not data or bufs[i].endswith(b"\n"):
                    sel.unregister(s)
                    s.close()
                    if first[i] is None:
                        raise RunFailed(f"client {i}: the connection closed without an answer to inc")
                    done[i] = (ms(t0, first[i]), bufs[i].decode(errors="replace").strip())
                    pending -= 1
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()
    if "error" in started:
        raise RunError(f"start: {started['error']}")
    return [d[0] for d in done], [d[1] for d in done]


def syn_counters(netns: str) -> dict:
    """What became of the SYNs to the pod's held ports, from its network
    namespace: `window`: SYNs that came while no socket listened on the port
    and went to the shim's spare listener (the TPROXY rule's packets);
    `dropped`: SYNs dropped by the SYN-drop rule (before the spare listener,
    every SYN of the window); `overflows` / `listen_drops`: the kernel's
    ListenOverflows / ListenDrops (a full accept queue, or a SYN a listener
    could not take). IPv4 only (the clients are)."""
    def rule_packets(table, chain, target):
        out = bench.run(["nsenter", f"--net={netns}", "iptables", "-w", "-t", table, "-L", chain, "-v", "-n", "-x"], check=False)
        text = out if isinstance(out, str) else ""
        return sum(int(line.split()[0]) for line in text.splitlines()
                   if len(line.split()) > 2 and line.split()[2] == target and line.split()[0].isdigit())
    stats = {}
    text = bench.run(["nsenter", f"--net={netns}", "cat", "/proc/net/netstat"], check=False)
    lines = text.splitlines() if isinstance(text, str) else []
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            stats = dict(zip(names.split()[1:], (int(v) for v in values.split()[1:])))
    return {"window": rule_packets("mangle", "PREROUTING", "TPROXY"), "dropped": rule_packets("filter", "INPUT", "DROP"),
            "overflows": stats.get("ListenOverflows", 0), "listen_drops": stats.get("ListenDrops", 0)}


def check_replies(replies, first: int) -> None:
    want = [str(first + i) for i in range(len(replies))]
    if sorted(replies, key=lambda r: (len(r), r)) != want:
        raise RunFailed(f"the answers are not the counter's next {len(replies)} values from {first}: {sorted(replies)[:5]}...")


class TorporSubject:
    def __init__(self, mib: int, clients: int):
        self.a = TorporActor(mib, prefix="burst")
        self.clients = clients
        self.single = []
        #: the same burst against the actor while it runs (right after the
        #: wake): what the clients and the actor cost without any resume
        self.running = []
        #: per round: what became of the burst's SYNs (syn_counters deltas)
        self.syns = []

    def take_out_spare(self) -> None:
        """TORPOR_BENCH_BURST_NO_SPARE: the TPROXY pair of the pod's mangle
        table deleted (the SYN-drop pair alone stays, as before the spare)."""
        ns = ["nsenter", f"--net={self.a.netns}", "iptables", "-w", "-t", "mangle"]
        for rule in bench.run(ns + ["-S", "PREROUTING"], check=False).splitlines():
            # (-S prints --syn as --tcp-flags FIN,SYN,RST,ACK SYN)
            if rule.startswith("-A PREROUTING") and ("TPROXY" in rule or "-m socket" in rule):
                bench.run(ns + ["-D"] + rule.split()[1:], check=False)

    def run(self, _i) -> list:
        a = self.a
        # Untimed: one client's wake, the goal's yardstick.
        a.suspend()
        t0 = now_ns()
        _, t1, reply = inc_first_byte(a.ip, t0, retry_refused=False)
        check_counter(reply, a.counter + 1)
        a.counter += 1
        self.single.append(ms(t0, t1))
        a.suspend()
        if NO_SPARE:
            self.take_out_spare()
        before = syn_counters(a.netns)
        lat, replies = burst(a.ip, self.clients, retry_refused=False)
        after = syn_counters(a.netns)  # within KEEP_RULES (5 s): the rules are still in
        self.syns.append({k: after[k] - before[k] for k in after})
        log(f"wake_burst torpor: SYNs of the burst: {self.syns[-1]}")
        check_replies(replies, a.counter + 1)
        a.counter += self.clients
        # Untimed for the entry: the floor, the same burst while it runs.
        floor, replies = burst(a.ip, self.clients, retry_refused=False)
        check_replies(replies, a.counter + 1)
        a.counter += self.clients
        self.running.extend(floor)
        return lat

    def remove(self) -> None:
        self.a.remove()


class BaselineSubject:
    """runc-v2's cold start: the counter created in a runc pod, started at t0."""

    def __init__(self, mib: int, clients: int):
        self.mib = mib
        self.clients = clients
        self.pod = BenchPod(BASELINE, prefix="burst")
        self.pod.run()
        info = bench.crictl_json("inspectp", "-o", "json", self.pod.id)
        self.ip = info["status"]["network"]["ip"]

    def run(self, i) -> list:
        cfg = bench.container_config(f"actor{i}", ["counter", "--port", str(bench.ACTOR_PORT), "--alloc-mib", str(self.mib)])
        cid = self.pod.create(cfg)
        try:
            lat, replies = burst(self.ip, self.clients, retry_refused=True, start=lambda: bench.crictl("start", cid))
            check_replies(replies, 1)
            return lat
        finally:
            bench.crictl("stop", "-t", "0", cid, check=False)
            bench.crictl("rm", "-f", cid, check=False)

    def remove(self) -> None:
        self.pod.remove()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=int(os.environ.get("TORPOR_BENCH_BURST_CLIENTS", "100")))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("TORPOR_BENCH_BURST_ROUNDS", "5")))
    ap.add_argument("--mib", type=int, default=int(os.environ.get("TORPOR_BENCH_BURST_MIB", "64")))
    args = ap.parse_args()
    subjects, errors = {}, {}
    with bench.bench_session():
        bench.ensure_torporctl()
        for key, make in ((TORPOR, TorporSubject), (BASELINE, BaselineSubject)):
            try:
                subjects[key] = make(args.mib, args.clients)
            except Exception as e:  # noqa: BLE001 - reported in results.json
                errors[key] = f"{type(e).__name__}: {e}"
                log(f"wake_burst {key}: {errors[key]}")
        try:
            tallies = bench.run_rounds("wake_burst", {k: s.run for k, s in subjects.items()}, args.rounds,
                                       tolerate=True, unit="rounds")
        finally:
            for s in subjects.values():
                try:
                    s.remove()
                except Exception as e:  # noqa: BLE001
                    log(f"wake_burst: removing: {e}")
    extra, value = {}, {}
    for key in (TORPOR, BASELINE):
        t = tallies.get(key) if key in subjects else None
        if t is not None and t.error:
            errors[key] = t.error
        lat = [x for r in (t.samples if t else []) for x in r]
        value[key] = pct(lat, 50) if lat and key not in errors else None
        extra[f"{key}_p99"] = pct(lat, 99) if lat and key not in errors else None
        extra[f"{key}_max_ms"] = bench.rnd(max(lat), 1) if lat else None
        extra[f"{key}_n"] = len(lat)
        if t and t.failures:
            extra[f"{key}_failed_rounds"] = t.failures
    single = subjects[TORPOR].single if TORPOR in subjects else []
    extra["torpor_single_p50_ms"] = pct(single, 50) if single else None
    running = subjects[TORPOR].running if TORPOR in subjects else []
    extra["torpor_running_p50_ms"] = pct(running, 50) if running else None
    extra["torpor_running_p99_ms"] = pct(running, 99) if running else None
    if TORPOR in subjects and subjects[TORPOR].syns:
        syns = subjects[TORPOR].syns
        extra["torpor_burst_syns"] = {k: sum(r[k] for r in syns) for k in syns[0]}
    met = None
    if extra["torpor_p99"] is not None and extra["torpor_single_p50_ms"]:
        met = extra["torpor_p99"] <= GOAL_RATIO * extra["torpor_single_p50_ms"]
        extra["torpor_note"] = (f"goal {GOAL}: {'met' if met else 'NOT met'} (p99 {extra['torpor_p99']} ms, "
                                f"single client {extra['torpor_single_p50_ms']} ms)")
    extra["goal_met"] = met
    e = bench.entry("wake_burst_100_p99_ms", "ms", torpor=value[TORPOR], baseline=value[BASELINE], goal=GOAL,
                    error=errors.get(TORPOR), baseline_error=errors.get(BASELINE),
                    statistic=(f"{args.clients} clients released together against one actor of {args.mib} MiB, "
                               f"connect + `inc` to the first byte of the answer from the common t0 (every answer "
                               f"checked); p50 over all clients of {args.rounds} rounds (p99 in *_p99). torpor: the "
                               f"actor suspended (commit done), woken by the burst; torpor_single_p50_ms: one "
                               f"client's wake, measured in each round before the burst; torpor_running_*: the same burst "
                               f"against the running actor right after each wake (the floor). runc-v2: cold start "
                               f"(`crictl start` of the created container at t0, clients retrying while refused)"),
                    **extra)
    if NO_SPARE:
        log(f"wake_burst (TORPOR_BENCH_BURST_NO_SPARE, not merged): {json.dumps(e)}")
    else:
        bench.merge_results([e])
    log(f"wake_burst_100_p99_ms: torpor p50 {e['torpor']} p99 {extra.get('torpor_p99')} "
        f"(single {extra.get('torpor_single_p50_ms')}) baseline p50 {e['baseline']} p99 {extra.get('baseline_p99')} ms")


if __name__ == "__main__":
    main()
