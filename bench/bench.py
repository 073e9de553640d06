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

The other harness module, suspend_harness.py, has runc-v2's counter actor
(``BaselineActor``) and the suspend/resume measurement; measurement scripts
import these two, never one another.

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


def run(argv, timeout=CALL_TIMEOUT_S, check=True, stdin=None, env=None):
    """Runs argv (with `env` added to the environment), returns stdout (str).
    Raises CommandError on failure/timeout."""
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired as e:
        raise CommandError(argv, None, _text(e.stdout), _text(e.stderr), timed_out=True) from None
    if check and p.returncode != 0:
        raise CommandError(argv, p.returncode, p.stdout, p.stderr)
    return p.stdout


def _text(b):
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def crictl(*args, timeout=CALL_TIMEOUT_S, check=True, address=None) -> str:
    """crictl against the rig's CRI endpoint (or the containerd socket `address`)."""
    endpoint = f"unix://{address or RIG_ADDRESS}"
    argv = [CRICTL, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
            "--timeout", f"{int(timeout)}s", *args]
    return run(argv, timeout=timeout + 5, check=check)


def crictl_json(*args, timeout=CALL_TIMEOUT_S, address=None):
    return json.loads(crictl(*args, timeout=timeout, address=address))


def rig_ready(address=None, timeout=10) -> bool:
    try:
        info = crictl_json("info", timeout=timeout, address=address)
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


def bench_pod_ids(address=None) -> list:
    return crictl("pods", "--label", f"{BENCH_LABEL}=true", "-q", check=False, address=address).split()


def cleanup_bench_pods(address=None) -> int:
    """Removes every pod carrying the benchmark label (at `address`, default the rig's); returns how many."""
    ids = bench_pod_ids(address)
    for pid in ids:
        crictl("stopp", pid, check=False, address=address)
        crictl("rmp", "-f", pid, check=False, address=address)
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


def proc_cmdline(pid: int) -> list:
    """The non-empty arguments of /proc/<pid>/cmdline; [] if it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def shims_of(key: str, ids: set) -> tuple:
    """(pids of runtime `key`'s rig shims whose command line names one of
    `ids` (pod or container ids), all rig shims of that runtime)."""
    every = rig_shim_pids(RUNTIMES[key]["shim"])
    return [p for p in every if ids.intersection(proc_cmdline(p))], every


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


def size_name(mib: int) -> str:
    """An actor size as entry names spell it: 256 -> "256mib", 1024 -> "1gib"."""
    return f"{mib // 1024}gib" if mib % 1024 == 0 else f"{mib}mib"


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


def remove_container(namespace: str, cid: str) -> None:
    """Kill, delete and remove a ctr container of the bench (best effort)."""
    if task_status(namespace, cid) is not None:
        ctr(namespace, "tasks", "delete", "-f", cid, check=False, timeout=60)
    ctr(namespace, "containers", "rm", cid, check=False, timeout=60)


def containerd_tmpdir() -> str:
    """Where the rig's containerd makes temporary dirs ($XDG_RUNTIME_DIR, $TMPDIR, /tmp)."""
    try:
        with open(os.path.join(RIG_STATE, "containerd.pid")) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        for k in (b"XDG_RUNTIME_DIR", b"TMPDIR"):
            if env.get(k):
                return env[k].decode()
    except (OSError, ValueError):
        pass
    return "/tmp"


def remove_restore_dirs(marker: str) -> int:
    """containerd (2.4) unpacks a checkpoint image for a restore (task create
    from a checkpoint) into <tmpdir>/ctrd-checkpoint<random> and never removes
    it: a full copy of the CRIU image per restore. Removes those of this
    bench's containers (their CRIU cgroup image names the container id,
    `marker`). Returns how many."""
    base = containerd_tmpdir()
    n = 0
    try:
        names = [d for d in os.listdir(base) if d.startswith("ctrd-checkpoint")]
    except OSError:
        return 0
    for d in names:
        path = os.path.join(base, d)
        try:
            with open(os.path.join(path, "cgroup.img"), "rb") as f:
                if marker.encode() not in f.read():
                    continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        n += 1
    return n


# ------------------------------------------------------------- time, percentiles

#: The fewest measured runs a latency benchmark reports on.
MIN_RUNS = 30


def now_ns() -> int:
    return time.perf_counter_ns()


def ms(t0: int, t1: int) -> float:
    return (t1 - t0) / 1e6


def pct(vals, p):
    """The p-th percentile of `vals`, rounded to 0.1; None for no values."""
    return rnd(percentile(vals, p), 1) if vals else None


# ------------------------------------------------------------------ the run loop

class RunError(RuntimeError):
    """The measurement cannot go on for this subject (runtime, size)."""


class RunFailed(RuntimeError):
    """One run failed (no answer to the request, or a wrong counter); the
    actor was brought back and the measurement goes on. Counted and reported.
    `partial`: the timings of the part of the run that did complete."""

    def __init__(self, msg, partial=None):
        super().__init__(msg)
        self.partial = partial


class Tally:
    """What the run loop measured of one subject."""

    def __init__(self, samples=None):
        self.samples = list(samples or [])
        #: messages of the failed runs it tolerated (RunFailed)
        self.failures = []
        #: why this subject's measurement ended (any other exception, or too many failed runs)
        self.error = None
        #: "stopped after N of M runs (time budget)"
        self.stopped = None


def run_rounds(name, subjects: dict, runs: int, *, alternate=True, deadline=None, predict=False,
               tolerate=False, counted=None, rounds=None, tallies=None, unit="runs",
               error_text=None, failure_text=None, too_many_text=None,
               on_sample=None, on_round=None) -> dict:
    """The run loop of every benchmark. `subjects` maps a key (a runtime, in
    the order given) to `run(i)`, one run of round i, which returns a sample.
    Round by round each subject runs once (the order reversed on odd rounds
    if `alternate`, so that drift on the machine hits all alike) until each
    has `runs` samples that `counted(sample)` accepts, or `rounds` rounds.

    - A RunFailed is tolerated when `tolerate`: its message is kept in
      `failures` (its `partial` sample in `samples`); more than `runs` of
      them end the subject (`error`).
    - Any other exception ends the subject (`error`, from
      `error_text(key, i, e)`, default "<Type>: <message>").
    - `deadline` (time.monotonic()): no round starts after it, or, with
      `predict`, no round that at the average pace so far would end after
      it; the subjects not done get `stopped`.

    `tallies` (key -> Tally) continues an earlier loop (a warm-up's failures
    count). `on_sample(key, tally)` after each sample, `on_round(rounds_done)`
    after each round. Returns key -> Tally."""
    tallies = {} if tallies is None else tallies
    for k in subjects:
        tallies.setdefault(k, Tally())
    counted = counted or (lambda _s: True)

    def n(k):
        return sum(1 for x in tallies[k].samples if counted(x))

    t_loop = time.monotonic()
    i = 0
    while rounds is None or i < rounds:
        todo = [k for k in subjects if tallies[k].error is None and n(k) < runs]
        if not todo:
            break
        if deadline is not None:
            now = time.monotonic()
            over = (i >= 1 and now + (now - t_loop) / i > deadline) if predict else now > deadline
            if over:
                log(f"{name}: stopping after {i} rounds (time budget)")
                for k in todo:
                    tallies[k].stopped = f"stopped after {n(k)} of {runs} {unit} (time budget)"
                break
        for k in (todo[::-1] if alternate and i % 2 else todo):
            t = tallies[k]
            try:
                sample = subjects[k](i)
            except Exception as e:  # noqa: BLE001 - reported in results.json
                if tolerate and isinstance(e, RunFailed):
                    if e.partial:
                        t.samples.append(e.partial)
                    t.failures.append(failure_text(k, i, e) if failure_text else str(e))
                    log(f"{name} {k}: run {i + 1} FAILED: {e}")
                    if len(t.failures) > runs:
                        t.error = too_many_text(k) if too_many_text else f"more than {runs} failed runs"
                else:
                    t.error = error_text(k, i, e) if error_text else f"{type(e).__name__}: {e}"
                    log(f"{name} {k}: {t.error}")
                continue
            t.samples.append(sample)
            if on_sample:
                on_sample(k, t)
        i += 1
        if on_round:
            on_round(i)
    return tallies


# ------------------------------------------------------ a request to an actor

# A request not answered within this time is a failed run (the goals are
# 100-150 ms; the slowest answers seen on a loaded 2-core machine are ~4 s).
TRIGGER_TIMEOUT_S = float(os.environ.get("TORPOR_BENCH_SR_TRIGGER_TIMEOUT", "15"))
# The TCP handshake itself: the shim (torpor) or the restored process
# (runc-v2) holds the listening socket, so the kernel completes it at once; a
# connect that takes longer is not going to complete (SYN-ACKs dropped).
CONNECT_TIMEOUT_S = float(os.environ.get("TORPOR_BENCH_SR_CONNECT_TIMEOUT", "3"))


def inc_first_byte(ip: str, t0: int, retry_refused: bool, port: int = ACTOR_PORT) -> tuple:
    """The trigger: connect, send `inc`, first byte of the answer. Returns
    (t_connected_ns, t_first_byte_ns, reply). With retry_refused a refused
    connect is retried every 1 ms (nobody holds the port yet)."""
    import socket

    deadline = time.monotonic() + TRIGGER_TIMEOUT_S
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            try:
                s.connect((ip, port))
            except socket.timeout:
                raise RunError(f"TCP connect not completed within {CONNECT_TIMEOUT_S:.0f} s") from None
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            break
        except ConnectionRefusedError:
            s.close()
            if not retry_refused or time.monotonic() > deadline:
                raise
            time.sleep(0.001)
        except BaseException:
            s.close()
            raise
    with s:
        t_conn = now_ns()
        s.sendall(b"inc\n")
        first = s.recv(1)
        t1 = now_ns()
        if not first:
            raise RunError(f"{ip}:{port} closed the connection without an answer to inc "
                           f"({ms(t0, t1):.0f} ms after the trigger)")
        buf = first
        while not buf.endswith(b"\n"):
            more = s.recv(64)
            if not more:
                break
            buf += more
    return t_conn, t1, buf.decode(errors="replace").strip()


def check_counter(reply: str, expect: int) -> None:
    if reply != str(expect):
        raise RunFailed(f"inc answered {reply!r}, expected {expect}")


# -------------------------------------------------------------------- torporctl

TORPORCTL = os.environ.get("TORPOR_TORPORCTL") or os.path.join(REPO_ROOT, "target", "release", "torporctl")
SHIM_SOCKET_DIR = os.environ.get("TORPOR_SHIM_SOCKET_DIR", "/run/torpor/shims")
# One torporctl (or the latency benchmarks' ctr) call longer than this is a
# failure; a suspend of a large actor takes seconds.
LONG_CALL_TIMEOUT_S = float(os.environ.get("TORPOR_BENCH_SR_CALL_TIMEOUT", "300"))
#: The baseline's containerd runtime type, for `ctr run --runtime`.
BASELINE_RUNTIME_TYPE = os.environ.get("TORPOR_BENCH_BASELINE_RUNTIME_TYPE", "io.containerd.runc.v2")


def ensure_torporctl() -> None:
    """Builds torporctl (unless TORPOR_BENCH_SKIP_BUILD=1 or TORPOR_TORPORCTL
    names one); raises RuntimeError if there is none."""
    if os.environ.get("TORPOR_BENCH_SKIP_BUILD", "0") != "1" and not os.environ.get("TORPOR_TORPORCTL"):
        try:
            run(["cargo", "build", "--release", "-p", "torporctl"], timeout=900)
        except (CommandError, OSError) as e:
            log(f"WARNING: cargo build -p torporctl: {e}")
    if not os.access(TORPORCTL, os.X_OK):
        raise RuntimeError(f"{TORPORCTL} missing (cargo build --release -p torporctl)")


def torporctl(*args, socket_dir=None, env=None, timeout=LONG_CALL_TIMEOUT_S):
    """`torporctl [--socket-dir D] --json <args>` (the rig's store and shims,
    or `env`'s): its JSON output, None if it printed nothing."""
    argv = [TORPORCTL] + (["--socket-dir", socket_dir] if socket_dir else []) + ["--json", *args]
    out = run(argv, timeout=timeout, env=env)
    return json.loads(out) if out.strip() else None


# --------------------------------------------------- the actor in a torpor pod

GONE_TIMEOUT_S = 30.0


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def proc_argvs():
    """(pid, /proc/<pid>/cmdline split at the NULs) of every process whose command line can be read."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        yield int(d), argv


def actor_pids(netns_ino: int, mib: int, port: int = ACTOR_PORT) -> list:
    """Host pids of `/actor counter --port <port> --alloc-mib <mib> ...`
    processes in the network namespace with inode `netns_ino`."""
    want = [b"/actor", b"counter", b"--port", str(port).encode(), b"--alloc-mib", str(mib).encode()]
    pids = []
    for pid, argv in proc_argvs():
        if argv[:len(want)] != want:
            continue
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino != netns_ino:
                continue
        except OSError:
            continue
        pids.append(pid)
    return pids


def wait_gone(netns_ino: int, mib: int, timeout=GONE_TIMEOUT_S) -> int:
    """Polls until no actor process is left; returns how many polls found one."""
    deadline = time.monotonic() + timeout
    polls = 0
    while actor_pids(netns_ino, mib):
        polls += 1
        if time.monotonic() > deadline:
            raise RunError(f"the actor's process is still there {timeout:.0f}s after the suspend returned")
        time.sleep(0.001)
    return polls


class TorporActor:
    """A CRI pod of runtime torpor with `/actor counter --port 8080
    --alloc-mib <mib> --seed <seed>` as its app container, running and
    answering. torporctl is pointed (`--socket-dir`) at a private directory
    holding only a link to this pod's shim control socket, so that shims of
    other rigs on the machine do not enter the measurement."""

    key = TORPOR

    def __init__(self, mib: int, seed: int = 0, annotations: Optional[dict] = None, prefix: str = "sr"):
        self.mib = mib
        self.pod = BenchPod(TORPOR, prefix=prefix, annotations=annotations)
        self.ctl_dir = None
        try:
            self.pod.run()
            self.cid = self.pod.start_container(
                "actor", ["counter", "--port", str(ACTOR_PORT), "--alloc-mib", str(mib), "--seed", str(seed)])
            info = crictl_json("inspectp", "-o", "json", self.pod.id)
            self.ip = info["status"]["network"]["ip"]
            nss = info["info"]["runtimeSpec"]["linux"]["namespaces"]
            self.netns = next(n["path"] for n in nss if n["type"] == "network")
            self.netns_ino = netns_inode(self.netns)
            wait_actor(self.ip, error=RunError)
            self.counter = int(actor_call(self.ip, ["get"], error=RunError)[0])
            self.crc = actor_call(self.ip, ["sum"], error=RunError)[0]
            st = torporctl("status", self.pod.id, socket_dir=SHIM_SOCKET_DIR)
            shim = self.shim = st[0]["shim"]
            self.ctl_dir = os.path.join(self.pod.dir, "ctl")
            os.makedirs(self.ctl_dir, mode=0o700, exist_ok=True)
            # (a short name: a socket path is limited to 107 bytes)
            os.symlink(os.path.join(SHIM_SOCKET_DIR, f"{shim}.sock"), os.path.join(self.ctl_dir, "shim.sock"))
            pids = actor_pids(self.netns_ino, mib)
            if len(pids) != 1:
                raise RunError(f"expected one actor process in the pod, found {pids}")
            self.rss_mib = (proc_status_kib(pids[0], "VmRSS") or 0) / 1024
        except BaseException:
            self.remove()
            raise

    def ctl(self, *args, timeout=LONG_CALL_TIMEOUT_S):
        """torporctl --json against this pod's shim only."""
        return torporctl(*args, socket_dir=self.ctl_dir, timeout=timeout)

    def status(self) -> dict:
        return self.ctl("status", self.pod.id)[0]["actor"]

    def lazy_daemons(self) -> list:
        """pids of `criu lazy-pages` daemons serving this shim's actor (after
        a resume with lazy pages they prefetch the rest of the memory in the
        background; the shim waits for them before the next dump)."""
        return [pid for pid, argv in proc_argvs()
                if b"lazy-pages" in argv[:3] and any(self.shim.encode() in a for a in argv)]

    def wait_settled(self, timeout=120.0) -> None:
        """Until the last resume's lazy-pages daemons are gone."""
        deadline = time.monotonic() + timeout
        while self.lazy_daemons():
            if time.monotonic() > deadline:
                raise RunError(f"criu lazy-pages still running {timeout:.0f}s after the resume")
            time.sleep(0.005)

    def wait_committed(self, timeout=60.0) -> float:
        """Until the suspend's background commit is done (the record has
        `committed_at_ms` and no `staging`): ms waited."""
        t0 = now_ns()
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st.get("committed_at_ms") and not st.get("staging"):
                return ms(t0, now_ns())
            if time.monotonic() > deadline:
                raise RunError(f"the suspend's commit was not done {timeout:.0f}s after the suspend returned")
            time.sleep(0.005)

    def suspend(self) -> None:
        """Untimed: `torporctl suspend` once settled, until the process is gone and the
        background commit done, as an actor woken seconds or minutes after its suspend is."""
        self.wait_settled()
        rec = self.ctl("suspend", self.pod.id)[0]["actor"]
        if str(rec.get("state")).lower() != "suspended":
            raise RunError(f"after torporctl suspend the actor is {rec.get('state')!r}")
        wait_gone(self.netns_ino, self.mib)
        self.wait_committed()

    def recover(self) -> str:
        """After a failed request: resume explicitly, re-read the counter.
        Returns what was found (for the error message)."""
        try:
            st = self.status()
        except (CommandError, ValueError, KeyError, IndexError, TypeError) as e:
            raise RunError(f"torporctl status after a failed request: {e}") from None
        found = f"actor then {st.get('state')}, last_error {st.get('last_error')!r}"
        rules = self.netns_rules()
        if rules:
            # Left by the suspend/resume (e.g. CRIU's network lock not lifted):
            # shown in the failure, then removed so that the next run starts clean.
            found += f"; packet filter rules in the pod's netns: {' | '.join(rules)} (removed)"
            self.clear_rules()
        if str(st.get("state")).lower() == "suspended":
            try:
                self.ctl("resume", self.pod.id)
            except CommandError as e:
                raise RunError(f"{found}; torporctl resume: {e}") from None
            found += ", resumed with torporctl"
        try:
            got = int(actor_call(self.ip, ["get"], timeout=TRIGGER_TIMEOUT_S, error=RunError)[0])
        except (OSError, ValueError, RunError) as e:
            raise RunError(f"{found}; the actor does not answer: {e}") from None
        if got not in (self.counter, self.counter + 1):
            raise RunError(f"{found}; counter {got}, expected {self.counter} or {self.counter + 1}")
        self.counter = got
        return f"{found}; counter {got} afterwards"

    def netns_rules(self) -> list:
        """iptables/ip6tables rules (-S) in the pod's netns, other than the policies."""
        rules = []
        for tool in ("iptables", "ip6tables"):
            try:
                out = run(["nsenter", f"--net={self.netns}", tool, "-w", "-S"], timeout=30)
            except (CommandError, OSError):
                continue
            rules += [f"{tool} {r}" for r in out.splitlines() if r and not r.startswith("-P ")]
        return rules

    def clear_rules(self) -> None:
        for tool in ("iptables", "ip6tables"):
            for args in (["-F"], ["-X"]):
                run(["nsenter", f"--net={self.netns}", tool, "-w", *args], timeout=30, check=False)

    def check_memory(self) -> None:
        got = actor_call(self.ip, ["sum"], error=RunError)[0]
        if got != self.crc:
            raise RunError(f"memory CRC after the last resume {got}, fresh actor {self.crc}")

    def remove(self) -> None:
        self.pod.remove()


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
