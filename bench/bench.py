"""torpor benchmark helpers (Python 3 standard library only).

Everything a benchmark script needs to measure torpor (CRI runtime handler
``torpor``) against the baseline (``runc`` = containerd-shim-runc-v2) on the
test rig (test/rig/up.sh), and to record the outcome:

- ``crictl(...)``             crictl against the rig's CRI socket, with a timeout
- ``pod_config`` / ``container_config``   CRI configs as kubelet would send them
- ``BenchPod``                a pod sandbox (runp/create/start/stop/remove)
- ``cleanup_bench_pods()``    removes every pod a benchmark left behind
- ``Stopwatch``, ``percentile``, ``summarize``
- ``entry(...)``, ``merge_results([...])``   add/replace entries by name in
                              bench/results.json (then ``report.py`` renders
                              BENCHMARKS.md and bench/results.svg)

Adding a benchmark (e.g. suspend/resume latency): write bench/<thing>.py that
imports this module, measures with ``BenchPod`` for each runtime in
``RUNTIMES``, builds entries with ``entry()`` (``torpor=None, error=...`` when
torpor cannot do it yet) and calls ``merge_results()``; then call it from
bench/run.sh before the report step. See bench/README.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from typing import Iterable, Optional

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
RESULTS_PATH = os.environ.get("TORPOR_BENCH_RESULTS", os.path.join(BENCH_DIR, "results.json"))
ENVIRONMENT_PATH = os.path.join(BENCH_DIR, "environment.json")

# The two runtimes compared, as (key in results.json, CRI runtime handler, shim binary).
TORPOR = "torpor"
BASELINE = "baseline"
RUNTIMES = {
    TORPOR: {"handler": os.environ.get("TORPOR_BENCH_TORPOR_HANDLER", "torpor"),
             "shim": "containerd-shim-torpor-v1"},
    BASELINE: {"handler": os.environ.get("TORPOR_BENCH_BASELINE_HANDLER", "runc"),
               "shim": "containerd-shim-runc-v2"},
}

# Rig settings: test/rig/env.sh exports these; the defaults mirror it.
RIG_STATE = os.environ.get("TORPOR_RIG_STATE", "/run/torpor-test")
RIG_ADDRESS = os.environ.get("TORPOR_RIG_ADDRESS", os.path.join(RIG_STATE, "containerd.sock"))
CRICTL = os.environ.get("TORPOR_CRICTL") or shutil.which("crictl") or "/usr/local/bin/crictl"
PAUSE_IMAGE = os.environ.get("TORPOR_PAUSE_IMAGE", "localhost/torpor-test/pause:latest")
ACTOR_IMAGE = os.environ.get("TORPOR_ACTOR_IMAGE", "localhost/torpor-test/actor:latest")

# Pods of the benchmark: their own CRI namespace and label, and cgroups under
# the rig's cgroup parent so that test/rig/down.sh removes any leftovers.
POD_NAMESPACE = "torpor-bench"
BENCH_LABEL = "torpor-bench"
CGROUP_ROOT = "/" + os.environ.get("TORPOR_RIG_CGROUP", "torpor-test").strip("/")

# One crictl call longer than this is a failure (a hung shim must not hang the
# bench); overridable for slow machines.
CALL_TIMEOUT_S = float(os.environ.get("TORPOR_BENCH_CALL_TIMEOUT", "60"))
# How long a freshly started container may take to be reported Running.
RUNNING_TIMEOUT_S = float(os.environ.get("TORPOR_BENCH_RUNNING_TIMEOUT", "30"))


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- commands

class CommandError(RuntimeError):
    """A crictl (or other) command failed or timed out."""

    def __init__(self, argv, returncode, stdout, stderr, timed_out=False):
        self.argv, self.returncode = list(argv), returncode
        self.stdout, self.stderr, self.timed_out = stdout or "", stderr or "", timed_out
        what = "timed out" if timed_out else f"exit {returncode}"
        cmd = " ".join([os.path.basename(self.argv[0])] + _short_args(self.argv[1:]))
        super().__init__(f"{cmd}: {what}: {_essence(self.stderr or self.stdout)}")


def _essence(text: str) -> str:
    """The gist of a crictl error: the innermost gRPC `desc = ...` message."""
    text = (text or "").strip()
    descs = re.findall(r"desc = (.*?)(?:\"\s*$|\"\s+\w+=|$)", text, flags=re.M)
    if descs:
        msg = max(descs, key=len).replace('\\"', '"')
        return msg[:300]
    lines = [l for l in text.splitlines() if l.strip()]
    return " | ".join(lines[-2:])[:300]


def _short_args(args):
    # Drop the endpoint flags from error messages; they are always the same.
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--runtime-endpoint", "--image-endpoint", "--timeout"):
            skip = True
            continue
        out.append(os.path.basename(a) if a.startswith("/") else a)
    return out


def run(argv, timeout=CALL_TIMEOUT_S, check=True, stdin=None):
    """Runs argv, returns stdout (str). Raises CommandError on failure/timeout."""
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise CommandError(argv, None, _text(e.stdout), _text(e.stderr), timed_out=True) from None
    if check and p.returncode != 0:
        raise CommandError(argv, p.returncode, p.stdout, p.stderr)
    return p.stdout


def _text(b):
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def crictl(*args, timeout=CALL_TIMEOUT_S, check=True) -> str:
    """crictl against the rig's CRI endpoint."""
    endpoint = f"unix://{RIG_ADDRESS}"
    argv = [CRICTL, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
            "--timeout", f"{int(timeout)}s", *args]
    return run(argv, timeout=timeout + 5, check=check)


def crictl_json(*args, timeout=CALL_TIMEOUT_S):
    return json.loads(crictl(*args, timeout=timeout))


def rig_ready() -> bool:
    try:
        info = crictl_json("info", timeout=10)
    except (CommandError, ValueError):
        return False
    conds = {c.get("type"): c.get("status") for c in info.get("status", {}).get("conditions", [])}
    return bool(conds.get("RuntimeReady")) and bool(conds.get("NetworkReady"))


# ---------------------------------------------------------------- CRI configs

def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def pod_config(name: str, log_dir: str, annotations: Optional[dict] = None,
               labels: Optional[dict] = None) -> dict:
    """A CRI PodSandboxConfig as kubelet would send it (cgroupfs driver)."""
    lbl = {BENCH_LABEL: "true"}
    lbl.update(labels or {})
    return {
        "metadata": {"name": name, "namespace": POD_NAMESPACE, "uid": f"uid-{name}", "attempt": 0},
        "hostname": name[:63],
        "log_directory": log_dir,
        "labels": lbl,
        "annotations": dict(annotations or {}),
        "linux": {
            "cgroup_parent": f"{CGROUP_ROOT}/pod-{name}",
            "security_context": {"namespace_options": {"network": 0, "pid": 1, "ipc": 0}},
        },
    }


def container_config(name: str, args: Iterable[str] = ("sleep",), image: str = ACTOR_IMAGE,
                     command: Iterable[str] = ("/actor",), annotations: Optional[dict] = None) -> dict:
    """A CRI ContainerConfig; by default `/actor sleep` from the actor image."""
    return {
        "metadata": {"name": name, "attempt": 0},
        "image": {"image": image},
        "command": list(command),
        "args": list(args),
        "log_path": f"{name}.log",
        "labels": {BENCH_LABEL: "true"},
        "annotations": dict(annotations or {}),
        "linux": {"resources": {}},
    }


# ----------------------------------------------------------------------- pods

_WORK_ROOT = None


def work_root() -> str:
    """Scratch dir for configs and container logs (under the rig's volatile state)."""
    global _WORK_ROOT
    if _WORK_ROOT is None:
        base = os.path.join(RIG_STATE, "bench") if os.path.isdir(RIG_STATE) else None
        if base:
            os.makedirs(base, exist_ok=True)
        _WORK_ROOT = tempfile.mkdtemp(prefix="run-", dir=base)
    return _WORK_ROOT


def remove_work_root() -> None:
    global _WORK_ROOT
    if _WORK_ROOT:
        shutil.rmtree(_WORK_ROOT, ignore_errors=True)
        parent = os.path.dirname(_WORK_ROOT)
        if os.path.basename(parent) == "bench":
            try:
                os.rmdir(parent)
            except OSError:
                pass
        _WORK_ROOT = None


class BenchPod:
    """One pod sandbox of one runtime. Use as a context manager (removed on exit)
    or call remove(). Every step is a separate crictl call, as kubelet makes
    separate CRI calls."""

    def __init__(self, runtime_key: str, prefix: str = "bench", annotations: Optional[dict] = None):
        self.runtime_key = runtime_key
        self.handler = RUNTIMES[runtime_key]["handler"]
        self.name = unique_name(f"{prefix}-{runtime_key}")
        self.dir = os.path.join(work_root(), self.name)
        self.log_dir = os.path.join(self.dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.config_path = _write_json(self.dir, "pod.json", pod_config(self.name, self.log_dir, annotations))
        self.id: Optional[str] = None
        self.containers: list = []

    def run(self) -> str:
        """crictl runp; on failure removes whatever sandbox runp left behind."""
        try:
            self.id = crictl("runp", "--runtime", self.handler, self.config_path).strip()
        except CommandError:
            remove_pods_named(self.name)
            raise
        return self.id

    def create(self, config: dict) -> str:
        path = _write_json(self.dir, f"ctr-{config['metadata']['name']}.json", config)
        cid = crictl("create", "--no-pull", self.id, path, self.config_path).strip()
        self.containers.append(cid)
        return cid

    def start(self, cid: str) -> None:
        crictl("start", cid)

    def start_container(self, name: str = "main", args: Iterable[str] = ("sleep",)) -> str:
        cid = self.create(container_config(name, args))
        self.start(cid)
        wait_running(cid)
        return cid

    def remove(self) -> None:
        if self.id:
            crictl("stopp", self.id, check=False)
            crictl("rmp", "-f", self.id, check=False)
            self.id = None
        else:
            remove_pods_named(self.name)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.remove()
        except CommandError as e:
            log(f"removing pod {self.name}: {e}")
        return False


def _write_json(d: str, name: str, value) -> str:
    p = os.path.join(d, name)
    with open(p, "w") as f:
        json.dump(value, f, indent=1)
    return p


def container_state(cid: str) -> str:
    return crictl_json("inspect", "-o", "json", cid).get("status", {}).get("state", "")


def wait_running(cid: str, timeout: float = RUNNING_TIMEOUT_S) -> None:
    """Polls crictl inspect until the container is CONTAINER_RUNNING."""
    deadline = time.monotonic() + timeout
    state = ""
    while True:
        state = container_state(cid)
        if state == "CONTAINER_RUNNING":
            return
        if state == "CONTAINER_EXITED" or time.monotonic() > deadline:
            raise RuntimeError(f"container {cid[:12]} is {state or 'unknown'}, not CONTAINER_RUNNING")
        time.sleep(0.005)


def remove_pods_named(name: str) -> None:
    out = crictl("pods", "--name", f"^{re.escape(name)}$", "-q", check=False)
    for pid in out.split():
        crictl("stopp", pid, check=False)
        crictl("rmp", "-f", pid, check=False)


def bench_pod_ids() -> list:
    return crictl("pods", "--label", f"{BENCH_LABEL}=true", "-q", check=False).split()


def cleanup_bench_pods() -> int:
    """Removes every pod carrying the benchmark label; returns how many."""
    ids = bench_pod_ids()
    for pid in ids:
        crictl("stopp", pid, check=False)
        crictl("rmp", "-f", pid, check=False)
    return len(ids)


# ------------------------------------------------------------ shim processes

def rig_shim_pids(shim: str) -> list:
    """pids of `shim` processes that belong to the rig (their command line
    carries the rig's containerd address)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(f"/proc/{d}/exe"))
            if exe.endswith(" (deleted)"):
                exe = exe[: -len(" (deleted)")]
            if exe != shim:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(RIG_ADDRESS.encode() in a for a in argv):
            pids.append(int(d))
    return sorted(pids)


def proc_status_kib(pid: int, field: str) -> Optional[int]:
    """A `kB` field (VmRSS, RssAnon, ...) of /proc/<pid>/status."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_pss_kib(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# ------------------------------------------------------------------ statistics

class Stopwatch:
    """with Stopwatch() as sw: ...; sw.ms"""

    def __enter__(self):
        self._t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        self.ms = (time.perf_counter_ns() - self._t0) / 1e6
        return False


def percentile(values, p: float) -> Optional[float]:
    """Linear-interpolated percentile (p in 0..100), as numpy's default."""
    v = sorted(values)
    if not v:
        return None
    if len(v) == 1:
        return float(v[0])
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (k - lo))


def summarize(values) -> dict:
    if not values:
        return {}
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "min": float(min(values)), "max": float(max(values)),
            "mean": sum(values) / len(values)}


def rnd(x, nd=2):
    return None if x is None else round(float(x), nd)


# -------------------------------------------------------------------- results

def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def machine() -> str:
    cores = os.cpu_count() or 0
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    except OSError:
        pass
    return f"{cores} cores, {mem_kib / 1024 / 1024:.1f} GiB RAM, Linux {platform.release()}"


def entry(name: str, unit: str, torpor, baseline, lower_is_better: bool = True,
          goal: Optional[str] = None, goal_max_ratio: Optional[float] = None,
          goal_min_ratio: Optional[float] = None, error: Optional[str] = None,
          baseline_error: Optional[str] = None, **extra) -> dict:
    """One results.json entry. `goal_max_ratio`/`goal_min_ratio` bound
    torpor/baseline for the goal check in BENCHMARKS.md. `error` explains a
    null torpor value, `baseline_error` a null baseline value."""
    e = {"name": name, "unit": unit, "torpor": torpor, "baseline": baseline,
         "lower_is_better": lower_is_better}
    if goal:
        e["goal"] = goal
    if goal_max_ratio is not None:
        e["goal_max_ratio"] = goal_max_ratio
    if goal_min_ratio is not None:
        e["goal_min_ratio"] = goal_min_ratio
    if error:
        e["error"] = error
    if baseline_error:
        e["baseline_error"] = baseline_error
    e["date"] = now_iso()
    e.update({k: v for k, v in extra.items() if v is not None})
    return e


def load_results(path: str = RESULTS_PATH) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            return data
    except (OSError, ValueError):
        pass
    return {"date": now_iso(), "machine": machine(), "results": []}


def merge_results(entries: Iterable[dict], path: str = RESULTS_PATH) -> dict:
    """Adds or replaces (by name) entries in results.json, keeping the others
    and their order; new names are appended. Updates date and machine."""
    data = load_results(path)
    by_name = {e["name"]: i for i, e in enumerate(data["results"])}
    for e in entries:
        if e["name"] in by_name:
            data["results"][by_name[e["name"]]] = e
        else:
            by_name[e["name"]] = len(data["results"])
            data["results"].append(e)
    data = {"date": now_iso(), "machine": machine(), "results": data["results"]}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return data


# ---------------------------------------------------------------- environment

def _first_line(argv) -> Optional[str]:
    """First line of a command's output; when that ends in ':' (a header, as
    with `containerd-shim-runc-v2 -v`), the next non-empty line is added."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = [l.strip() for l in (p.stdout or p.stderr).strip().splitlines() if l.strip()]
    if not out or p.returncode != 0:
        return None
    if out[0].endswith(":") and len(out) > 1:
        return f"{out[0]} {out[1]}"
    return out[0]


def _loadavg() -> Optional[str]:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def record_environment(path: str = ENVIRONMENT_PATH) -> dict:
    """Versions of what was measured (rendered into BENCHMARKS.md)."""
    env = {
        "date": now_iso(),
        "machine": machine(),
        "torpor_commit": _first_line(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"]),
        "containerd": _first_line([os.environ.get("TORPOR_CONTAINERD", "containerd"), "--version"]),
        "containerd-shim-runc-v2": _first_line(["containerd-shim-runc-v2", "-v"]),
        "runc": _first_line(["runc", "--version"]),
        "criu": _first_line(["criu", "--version"]),
        "crictl": _first_line([CRICTL, "--version"]),
        "load_average_at_start": _loadavg(),
    }
    dirty = _first_line(["sh", "-c", f"git -C '{REPO_ROOT}' status --porcelain | head -1"])
    if env["torpor_commit"] and dirty:
        env["torpor_commit"] += " (+ uncommitted changes)"
    with open(path + ".tmp", "w") as f:
        json.dump(env, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return env


@contextmanager
def bench_session():
    """Wraps a benchmark script: checks the rig, always removes its pods and
    scratch files at the end."""
    if not rig_ready():
        raise SystemExit(f"bench: the rig is not up at {RIG_ADDRESS} (test/rig/up.sh)")
    # run.sh's `timeout` sends SIGTERM: unwind so that the cleanup below runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        n = cleanup_bench_pods()
        if n:
            log(f"removed {n} leftover benchmark pod(s)")
        remove_work_root()


# ------------------------------------------------------------------------ CLI

def _main(argv) -> int:
    """bench/bench.py cleanup | environment"""
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "cleanup":
        if rig_ready():
            n = cleanup_bench_pods()
            if n:
                log(f"removed {n} leftover benchmark pod(s)")
        return 0
    if cmd == "environment":
        record_environment()
        return 0
    print(f"usage: {argv[0]} cleanup|environment", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))


# ----------------------------------------------------------- the test actor

#: Port of `/actor counter` in the benchmarks' actors.
ACTOR_PORT = 8080


def actor_call(ip: str, cmds, timeout: float = 30.0, port: int = ACTOR_PORT, error=RuntimeError) -> list:
    """Line protocol of `/actor counter`: one reply line per command."""
    import socket

    with socket.create_connection((ip, port), timeout=timeout) as s:
        s.settimeout(timeout)
        f = s.makefile("rw", newline="\n")
        replies = []
        for c in cmds:
            f.write(c + "\n")
            f.flush()
            line = f.readline()
            if not line:
                raise error(f"actor at {ip}:{port} closed the connection on {c!r}")
            replies.append(line.strip())
        return replies


def wait_actor(ip: str, timeout: float = 180.0, port: int = ACTOR_PORT, error=RuntimeError) -> None:
    """Waits until the actor at ip answers `get`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            actor_call(ip, ["get"], timeout=5, port=port, error=error)
            return
        except OSError as e:
            last = e
            time.sleep(0.02)
    raise error(f"actor at {ip}:{port} not answering after {timeout:.0f}s: {last}")


# ------------------------------------------------------------------- ctr

#: ctr, as the rig's scripts find it.
CTR = os.environ.get("TORPOR_CTR") or shutil.which("ctr") or "/usr/local/bin/ctr"


def ctr(namespace: str, *args, timeout=CALL_TIMEOUT_S, check=True) -> str:
    """ctr against the rig's containerd, in `namespace`."""
    return run([CTR, "--address", RIG_ADDRESS, "-n", namespace, *args], timeout=timeout, check=check)


def task_status(namespace: str, cid: str):
    """Status of task `cid` as `ctr task ls` shows it, or None."""
    out = ctr(namespace, "task", "ls", check=False)
    for line in out.splitlines()[1:]:
        f = line.split()
        if f and f[0] == cid:
            return f[-1]
    return None

