#!/usr/bin/env python3
"""k8s_pod_start_ms: time from `kubectl apply` of a pod until `kubectl wait`
sees it Ready, on the test cluster (test/cluster), torpor (runtimeClassName:
torpor) against runc (the nodes' default handler, containerd-shim-runc-v2),
on the same node.

Pods are one `/actor counter` container (imagePullPolicy: Never, no probes),
pinned to node-a through nodeSelector (the scheduler still places them). The
runtimes are interleaved (torpor, runc, torpor, ...); each first gets one
unmeasured warm-up pod; every pod is deleted (untimed, waited for) before the
next one. The kubectl process starts are inside the timing, alike for both.

    bench/k8s_pod_start.py [--pods N] [--start-cluster]

N defaults to 20 (env TORPOR_BENCH_K8S_PODS). The cluster must be up
(test/cluster/up.sh; test/cluster/env.sh's variables, or the defaults);
--start-cluster brings it up first and tears cluster and rig down at the end.
Writes the entry into bench/results.json (TORPOR_BENCH_RESULTS), replacing
an older one of the same name. Self-contained (no bench.py import) so that it
can be folded into the bench's run loop later.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
RESULTS_PATH = os.environ.get("TORPOR_BENCH_RESULTS", os.path.join(BENCH_DIR, "results.json"))
STATE = os.environ.get("TORPOR_CLUSTER_STATE", "/run/torpor-test/cluster")
KUBECTL = os.environ.get("TORPOR_KUBECTL", "/usr/local/bin/kubectl")
KUBECONFIG = os.environ.get("TORPOR_KUBECONFIG", os.path.join(STATE, "admin.kubeconfig"))
IMAGE = os.environ.get("TORPOR_ACTOR_IMAGE", "localhost/torpor-test/actor:latest")
NAMESPACE = "torpor-bench"
NODE = "node-a"
CALL_TIMEOUT_S = 180
NAME = "k8s_pod_start_ms"


def log(msg):
    print(f"[k8s_pod_start] {msg}", file=sys.stderr, flush=True)


class CommandError(Exception):
    pass


def kubectl(*args, stdin=None, check=True, timeout=CALL_TIMEOUT_S):
    argv = [KUBECTL, "--kubeconfig", KUBECONFIG, *args]
    env = dict(os.environ, KUBECACHEDIR=os.path.join(STATE, "kubectl-cache"))
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise CommandError(f"{' '.join(args)}: still running after {timeout}s") from e
    if check and p.returncode != 0:
        raise CommandError(f"kubectl {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[:400]}")
    return p.stdout


def pod_manifest(name, runtime):
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "dnsPolicy": "Default",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "containers": [{
            "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
            "command": ["/actor"], "args": ["counter"],
        }],
    }
    if runtime == "torpor":
        spec["runtimeClassName"] = "torpor"
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "labels": {"app": "torpor-bench"}}, "spec": spec})


_seq = 0


def one_pod(runtime):
    """Applies one pod, waits until Ready; returns the milliseconds. Deletes it (untimed)."""
    global _seq
    _seq += 1
    name = f"start-{runtime}-{os.getpid()}-{_seq}"
    manifest = pod_manifest(name, runtime)
    try:
        t0 = time.perf_counter_ns()
        kubectl("-n", NAMESPACE, "apply", "-f", "-", stdin=manifest)
        kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", f"pod/{name}", f"--timeout={CALL_TIMEOUT_S - 10}s")
        return (time.perf_counter_ns() - t0) / 1e6
    finally:
        try:
            kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=true", "--timeout=120s", "--ignore-not-found")
        except CommandError as e:
            log(f"deleting {name}: {e}")


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def rnd(x, nd=1):
    return None if x is None else round(x, nd)


def measure(n):
    kubectl("apply", "-f", os.path.join(REPO_ROOT, "RuntimeClass.yaml"))
    if kubectl("get", "namespace", NAMESPACE, check=False, timeout=60).strip() == "":
        kubectl("create", "namespace", NAMESPACE)
    samples = {"torpor": [], "runc": []}
    errors = {}
    for rt in samples:  # warm-up
        try:
            one_pod(rt)
        except CommandError as e:
            errors[rt] = f"warm-up pod failed: {e}"
            log(f"{rt}: {errors[rt]}")
    for i in range(n):
        for rt in samples:
            if rt in errors:
                continue
            try:
                samples[rt].append(one_pod(rt))
            except CommandError as e:
                errors[rt] = f"pod {i + 1}/{n} failed: {e}"
                log(f"{rt}: {errors[rt]}")
        if (i + 1) % 5 == 0:
            log(f"{i + 1}/{n} rounds")

    def stat(rt, p):
        return rnd(percentile(samples[rt], p)) if rt not in errors else None

    t, b = stat("torpor", 50), stat("runc", 50)
    return {
        "name": NAME, "unit": "ms",
        "torpor": t, "baseline": b,
        "lower_is_better": True,
        "goal": "no slower than runc-v2 (ratio <= 1.0)", "goal_max_ratio": 1.0,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "statistic": f"p50 of {n} sequential pods on {NODE}: kubectl apply until kubectl wait sees Ready",
        "ratio": rnd(t / b, 3) if t and b else None,
        "error": errors.get("torpor"), "baseline_error": errors.get("runc"),
        "torpor_p99": stat("torpor", 99), "torpor_n": len(samples["torpor"]),
        "torpor_samples_ms": [rnd(x) for x in samples["torpor"]] or None,
        "baseline_p99": stat("runc", 99), "baseline_n": len(samples["runc"]),
        "baseline_samples_ms": [rnd(x) for x in samples["runc"]] or None,
    }


def merge(entry):
    try:
        with open(RESULTS_PATH) as f:
            doc = json.load(f)
    except FileNotFoundError:
        doc = {"results": []}
    doc["results"] = [r for r in doc.get("results", []) if r.get("name") != entry["name"]] + [entry]
    doc["date"] = entry["date"]
    tmp = RESULTS_PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, RESULTS_PATH)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=int(os.environ.get("TORPOR_BENCH_K8S_PODS", "20")))
    ap.add_argument("--start-cluster", action="store_true")
    args = ap.parse_args()
    if args.pods < 20:
        log(f"note: {args.pods} pods (the entry's statistic wants at least 20)")
    started = False
    try:
        if args.start_cluster:
            subprocess.run([os.path.join(REPO_ROOT, "test/cluster/up.sh")], check=True, timeout=1800)
            started = True
        entry = measure(args.pods)
    finally:
        try:
            kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=300s", "--ignore-not-found", check=False)
        except CommandError as e:
            log(f"deleting namespace {NAMESPACE}: {e}")
        if started:
            subprocess.run([os.path.join(REPO_ROOT, "test/cluster/down.sh"), "--rig"], timeout=1800)
    merge(entry)
    log(f"{NAME}: torpor={entry['torpor']} runc={entry['baseline']} ms (ratio {entry['ratio']})"
        + (f"  [torpor error: {entry['error']}]" if entry.get("error") else ""))


if __name__ == "__main__":
    main()
