//! End to end through kubectl: torpor under a real control plane and real
//! kubelets (test/cluster: node-a on rig node A's containerd, node-b on node
//! B's), as a user runs it: RuntimeClass, pods and StatefulSets, kubelet's
//! own probes, exec / logs / port-forward through the API server, moves by
//! cordon + delete and by drain, resources in cgroups, OOM, kubelet and
//! containerd restarts, a bad annotation.
//!
//! Suspends are driven with torporctl on the pod's node (as an operator or
//! the idle policy would); wakes come from what a user does (a request to
//! the pod IP, kubectl exec, kubectl port-forward).
//!
//! Run by test/rig/run-tests.sh after the other integration tests, with the
//! cluster up and one test at a time (a drain moves every pod of a node).
//! Each test works in its own namespace, deleted by a guard also on panic.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use torpor_tests::cluster::*;

const MIB: u64 = 1 << 20;

/// `kubectl apply -f RuntimeClass.yaml` (the repository's own file).
#[track_caller]
fn runtime_class() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../RuntimeClass.yaml");
    kubectl_ok(&["apply", "-f", path]);
    let handler = kubectl_ok(&["get", "runtimeclass", "torpor", "-o", "jsonpath={.handler}"]);
    assert_eq!(handler, "torpor", "RuntimeClass torpor's handler");
}

/// A pod spec of the actor image: `/actor ARGS`; `class` torpor or runc
/// (runc: no runtimeClassName, the nodes' default handler).
fn pod_spec(class: &str, args: &[&str], extra: Value) -> Value {
    let mut container = json!({
        "name": "actor",
        "image": ACTOR_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/actor"],
        "args": args,
    });
    if let Some(obj) = extra.get("container").and_then(Value::as_object) {
        for (k, v) in obj {
            container[k] = v.clone();
        }
    }
    let mut spec = json!({
        // no cluster DNS here
        "dnsPolicy": "Default",
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
    });
    if class == "torpor" {
        spec["runtimeClassName"] = json!("torpor");
    }
    if let Some(obj) = extra.get("spec").and_then(Value::as_object) {
        for (k, v) in obj {
            spec[k] = v.clone();
        }
    }
    spec
}

fn pod(name: &str, class: &str, args: &[&str], annotations: &BTreeMap<&str, &str>, extra: Value) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": pod_spec(class, args, extra),
    })
    .to_string()
}

fn no_annotations() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::new()
}

/// The node a pod runs on.
#[track_caller]
fn node_of(p: &Value) -> &'static KubeNode {
    let name = p["spec"]["nodeName"].as_str().unwrap_or_else(|| panic!("pod not scheduled: {p}"));
    cluster().node(name)
}

#[track_caller]
fn pod_ip(p: &Value) -> String {
    p["status"]["podIP"].as_str().unwrap_or_else(|| panic!("pod has no IP: {}", p["status"])).to_string()
}

fn container_id(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["containerID"].as_str().unwrap_or_default().trim_start_matches("containerd://").to_string()
}

/// The CRI runtime handler of pod NS/NAME's sandbox on `node`.
#[track_caller]
fn runtime_handler(node: &KubeNode, ns: &str, name: &str) -> String {
    let out = node.crictl(&["pods", "--namespace", ns, "--name", name, "-o", "json"]);
    let text = out.clone().ok();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("crictl pods: not JSON ({e}): {out}"));
    let items: Vec<&Value> =
        v["items"].as_array().into_iter().flatten().filter(|i| i["metadata"]["name"] == name && i["state"] == "SANDBOX_READY").collect();
    assert_eq!(items.len(), 1, "one ready sandbox of {ns}/{name} on {}: {v}", node.name);
    items[0]["runtimeHandler"].as_str().unwrap_or_default().to_string()
}

/// Probe counts of one container from kubelet's /metrics/probes (through
/// the API server's node proxy): (probe type, result) -> count.
#[track_caller]
fn probe_counts(node: &KubeNode, ns: &str, pod: &str) -> BTreeMap<(String, String), u64> {
    let path = format!("/api/v1/nodes/{}/proxy/metrics/probes", node.name);
    let text = kubectl_ok(&["get", "--raw", &path]);
    let mut m = BTreeMap::new();
    let want_ns = format!("namespace=\"{ns}\"");
    let want_pod = format!("pod=\"{pod}\"");
    for line in text.lines().filter(|l| l.starts_with("prober_probe_total{")) {
        if !line.contains(&want_ns) || !line.contains(&want_pod) {
            continue;
        }
        let label = |k: &str| {
            let key = format!("{k}=\"");
            line.split(&key).nth(1).and_then(|r| r.split('"').next()).unwrap_or_default().to_string()
        };
        let n: u64 = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64;
        *m.entry((label("probe_type"), label("result"))).or_insert(0) += n;
    }
    m
}

fn count(m: &BTreeMap<(String, String), u64>, probe: &str, result: &str) -> u64 {
    m.get(&(probe.to_string(), result.to_string())).copied().unwrap_or(0)
}

/// Waits until kubelet has run at least `n` more successful readiness and
/// liveness probes of the pod than in `base`; returns the new counts.
#[track_caller]
fn wait_probes(node: &KubeNode, ns: &str, pod: &str, base: &BTreeMap<(String, String), u64>, n: u64) -> BTreeMap<(String, String), u64> {
    wait_until(&format!("{n} more successful probes of {ns}/{pod}"), LIVENESS, || {
        let m = probe_counts(node, ns, pod);
        let more = |t: &str| count(&m, t, "successful").saturating_sub(count(base, t, "successful"));
        (more("Readiness") >= n && more("Liveness") >= n).then_some(m)
    })
}

/// The probe counts once one probe of each kind has succeeded after now
/// (each kind runs one probe at a time, so any probe in flight now is over).
#[track_caller]
fn settled_probes(node: &KubeNode, ns: &str, pod: &str) -> BTreeMap<(String, String), u64> {
    let now = probe_counts(node, ns, pod);
    wait_probes(node, ns, pod, &now, 1)
}

/// kubelet's error lines (klog `E....`) about a pod or container since `mark`.
fn kubelet_errors(node: &KubeNode, mark: u64, needles: &[&str]) -> Vec<String> {
    node.kubelet_log_since(mark)
        .lines()
        .filter(|l| l.starts_with('E') && needles.iter().any(|n| !n.is_empty() && l.contains(n)))
        .map(str::to_string)
        .collect()
}

/// Warning events of one object in a namespace: (reason, message).
fn warnings(ns: &Namespace, object: &str) -> Vec<(String, String)> {
    ns.events()
        .iter()
        .filter(|e| e["type"] == "Warning" && e["involvedObject"]["name"] == object)
        .map(|e| (e["reason"].as_str().unwrap_or_default().to_string(), e["message"].as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The probes the probe tests use: HTTP readiness on /healthz and TCP
/// liveness, every second (kubelet's default failureThreshold, 3).
fn probes() -> Value {
    json!({"container": {
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 3, "timeoutSeconds": 5},
    }})
}

/// Failed (or unknown) probes of both kinds in a count map.
fn failures(m: &BTreeMap<(String, String), u64>) -> u64 {
    ["Readiness", "Liveness"].iter().map(|t| count(m, t, "failed") + count(m, t, "unknown")).sum()
}

// ---------------------------------------------------------------- the tests

#[test]
fn runtime_class_pods_and_statefulset_become_ready() {
    let ns = Namespace::new("ready");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["counter"], &no_annotations(), json!({})));
    ns.apply(&pod("plain", "runc", &["counter"], &no_annotations(), json!({})));
    // (no RuntimeClass: kubelet asks for the default handler, "", which is
    // the nodes' runc)
    for (name, handler) in [("actor", "torpor"), ("plain", "")] {
        let p = ns.wait_ready(name);
        let node = node_of(&p);
        assert_eq!(runtime_handler(node, &ns.name, name), handler, "{name}'s sandbox handler on {}", node.name);
        let ip = pod_ip(&p);
        assert!(ip.starts_with(&node.subnet_prefix), "{name}'s IP {ip} is in {}'s pod subnet", node.name);
        assert_eq!(counter(&format!("{ip}:8080"), "inc"), "1", "{name} answers at its pod IP");
        assert_eq!(restarts(&p), 0);
    }
    let a = ns.pod("actor");
    assert_eq!(node_of(&a).actor_state(&ns.actor("actor")), "RUNNING", "the torpor pod is an actor of its node's shim");

    // A StatefulSet of torpor actors.
    let sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "actors"},
        "spec": {
            "serviceName": "actors", "replicas": 2, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "actors"}},
            "template": {"metadata": {"labels": {"app": "actors"}}, "spec": pod_spec("torpor", &["counter"], json!({}))},
        },
    });
    let svc = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "actors"},
        "spec": {"clusterIP": "None", "selector": {"app": "actors"}, "ports": [{"port": 8080}]},
    });
    ns.apply(&svc.to_string());
    ns.apply(&sts.to_string());
    wait_until("StatefulSet actors: 2 ready replicas", LIVENESS, || {
        let s = kubectl_json(&["-n", &ns.name, "get", "statefulset", "actors"]);
        (s["status"]["readyReplicas"].as_u64() == Some(2)).then_some(())
    });
    for name in ["actors-0", "actors-1"] {
        let p = ns.wait_ready(name);
        let node = node_of(&p);
        assert_eq!(runtime_handler(node, &ns.name, name), "torpor");
        assert_eq!(node.actor_state(&ns.actor(name)), "RUNNING");
        assert_eq!(counter(&format!("{}:8080", pod_ip(&p)), "inc"), "1");
    }
}

#[test]
fn kubelet_probes_pass_while_suspended() {
    let ns = Namespace::new("probes");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["counter"], &no_annotations(), probes()));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    let since = ready_since(&p);
    let cid = container_id(&p);
    let mark = node.kubelet_log_len();
    // (a readiness probe may fail before the process listens: count from Ready on)
    let mut base = wait_probes(node, &ns.name, "actor", &BTreeMap::new(), 1);

    for cycle in 1..=3u64 {
        assert_eq!(counter(&addr, "inc"), cycle.to_string(), "cycle {cycle}: the count goes on");
        node.suspend(&actor);
        // kubelet probes the suspended actor: HTTP readiness and TCP
        // liveness keep succeeding, and they do not wake it.
        // (from the first probes that started after the suspend: each probe
        // kind runs one at a time, so one success of each means that a probe
        // begun during the suspend has ended; the transition itself is
        // probes_never_fail_across_suspend_and_resume's)
        let suspended = settled_probes(node, &ns.name, "actor");
        base = wait_probes(node, &ns.name, "actor", &suspended, 3);
        assert_eq!(node.actor_state(&actor), "SUSPENDED", "cycle {cycle}: probes did not wake the actor");
        assert_eq!(failures(&base), failures(&suspended), "cycle {cycle}: no probe failed while suspended: {base:?}");
        let now = ns.pod("actor");
        assert!(pod_is_ready(&now), "cycle {cycle}: Ready while suspended: {}", now["status"]);
        assert_eq!(restarts(&now), 0, "cycle {cycle}: no restart while suspended");
        // A real request wakes it (next cycle's inc, or the get below).
    }
    assert_eq!(counter(&addr, "get"), "3", "the last request woke the actor with its count");
    assert_eq!(node.actor_state(&actor), "RUNNING");
    wait_probes(node, &ns.name, "actor", &base, 2);

    let p = ns.pod("actor");
    assert!(pod_is_ready(&p), "Ready at the end: {}", p["status"]);
    assert_eq!(ready_since(&p), since, "Ready never went away (its lastTransitionTime is the first one)");
    assert_eq!(restarts(&p), 0, "restartCount 0 across the cycles");
    let w: Vec<_> = warnings(&ns, "actor").into_iter().filter(|(r, _)| r != "Unhealthy").collect();
    assert!(w.is_empty(), "no warning events for the pod (but probe failures, see the next test): {w:?}");
    let errors = kubelet_errors(node, mark, &[&cid, &format!("pod=\"{}/actor\"", ns.name)]);
    assert!(errors.is_empty(), "kubelet logged errors about the pod while it was suspended:\n{}", errors.join("\n"));
}

/// Stricter than the issue asks: the pod's port never refuses a connection
/// across suspends and resumes, not even while the actor is being suspended
/// or woken (a real client, or a probe, would see that refusal). A thread
/// connects to the pod IP again and again (connect and close, as kubelet's
/// TCP probe does) through three suspend / wake-by-request cycles.
#[test]
fn port_never_refuses_connections_across_suspend_and_resume() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let ns = Namespace::new("transitions");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["counter"], &no_annotations(), json!({})));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    let sa: std::net::SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
    assert_eq!(counter(&addr, "inc"), "1");
    let done = Arc::new(AtomicBool::new(false));
    let hammer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut tries, mut refused) = (0u64, Vec::new());
            while !done.load(Ordering::Relaxed) {
                tries += 1;
                match std::net::TcpStream::connect_timeout(&sa, std::time::Duration::from_secs(5)) {
                    Ok(c) => drop(c),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        refused.push(format!("{:?}", std::time::SystemTime::now()))
                    }
                    Err(_) => {}
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            (tries, refused)
        })
    };
    for cycle in 2..=4u64 {
        node.suspend(&actor);
        assert_eq!(counter(&addr, "inc"), cycle.to_string(), "cycle {cycle}: a request woke it with its count");
    }
    done.store(true, Ordering::Relaxed);
    let (tries, refused) = hammer.join().unwrap_or_else(|_| panic!("the connecting thread panicked"));
    assert!(tries > 0, "connections were tried");
    assert!(
        refused.is_empty(),
        "{} of {tries} connections to {addr} were refused across 3 suspends and resumes, at: {refused:?}",
        refused.len()
    );
}

#[test]
fn suspended_memory_leaves_the_pod_cgroup_and_a_request_wakes_it() {
    let ns = Namespace::new("memory");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["counter", "--alloc-mib", "64"], &no_annotations(), json!({})));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    for i in 1..=3 {
        assert_eq!(counter(&addr, "inc"), i.to_string());
    }
    let sum = counter(&addr, "sum");
    let usage = format!("{}/memory.usage_in_bytes", node.pod_cgroup("memory", &p));
    let before = cgroup_u64(&usage);
    assert!(before >= 64 * MIB, "the pod cgroup holds the 64 MiB before the suspend: {before} bytes ({usage})");
    // kubelet's stats summary (node-pressure eviction, kubectl top, the
    // HPA) reads the torpor pod: its container's memory and the filesystem
    // of its writable layer (CRI finds it through the snapshotter's
    // exported root; without it the whole node's summary failed)
    let raw = kubectl_ok(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/stats/summary", node.name)]);
    let summary: Value = serde_json::from_str(&raw).unwrap_or_else(|e| panic!("stats summary: not JSON ({e}): {raw}"));
    let stats = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["podRef"]["name"] == "actor" && s["podRef"]["namespace"] == ns.name.as_str())
        .unwrap_or_else(|| panic!("no stats of the pod in {}'s summary", node.name));
    let c = &stats["containers"][0];
    assert!(c["memory"]["workingSetBytes"].as_u64().unwrap_or(0) >= 64 * MIB, "{c}");
    assert!(c["rootfs"]["capacityBytes"].as_u64().unwrap_or(0) > 0, "its writable layer's filesystem: {c}");

    node.suspend(&actor);
    let after = wait_until("the pod cgroup's memory to be freed", LIVENESS, || {
        let u = cgroup_u64(&usage);
        (u < 16 * MIB).then_some(u)
    });
    eprintln!("pod cgroup memory: {before} bytes running, {after} suspended");
    assert!(pod_is_ready(&ns.pod("actor")), "the pod stays Ready while suspended");

    // A request to the pod IP wakes it, with its state.
    assert_eq!(counter(&addr, "get"), "3", "the request woke the actor with its count");
    assert_eq!(counter(&addr, "sum"), sum, "its 64 MiB came back intact");
    assert_eq!(node.actor_state(&actor), "RUNNING");
    let back = cgroup_u64(&usage);
    assert!(back >= 48 * MIB, "the memory is charged to the pod cgroup again: {back} bytes");
    assert_eq!(restarts(&ns.pod("actor")), 0);
}

#[test]
fn kubectl_exec_and_port_forward_wake_a_suspended_actor() {
    let ns = Namespace::new("stream");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["counter"], &no_annotations(), json!({})));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    assert_eq!(counter(&addr, "inc"), "1");

    // exec
    node.suspend(&actor);
    let out = ns.kubectl(&["exec", "actor", "-c", "actor", "--", "sh", "-c", "echo exec-ok; exit 3"]);
    assert_eq!(out.code, Some(3), "kubectl exec runs in the woken container and reports its exit code: {out}");
    assert_eq!(out.stdout.trim(), "exec-ok", "{out}");
    assert_eq!(node.actor_state(&actor), "RUNNING", "kubectl exec woke the actor");
    assert_eq!(counter(&addr, "inc"), "2", "with its state");

    // port-forward
    node.suspend(&actor);
    let pf = PortForward::start(&ns.name, "actor", 8080);
    assert_eq!(node.actor_state(&actor), "SUSPENDED", "starting a port-forward alone does not wake it");
    assert_eq!(counter(&format!("127.0.0.1:{}", pf.local_port), "inc"), "3", "a connection through port-forward woke it with its state");
    assert_eq!(node.actor_state(&actor), "RUNNING");
    assert_eq!(counter(&format!("127.0.0.1:{}", pf.local_port), "get"), "3", "and the forward keeps working");
    drop(pf);
    assert_eq!(restarts(&ns.pod("actor")), 0);
}

/// The highest `line N` in a log text, and how often `line 1 stdout` occurs.
fn log_lines(text: &str) -> (u64, usize) {
    let max = text
        .lines()
        .filter_map(|l| l.strip_prefix("line ").and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<u64>().ok()))
        .max()
        .unwrap_or(0);
    (max, text.lines().filter(|l| *l == "line 1 stdout").count())
}

#[test]
fn kubectl_logs_show_lines_from_before_and_after_a_suspend() {
    let ns = Namespace::new("logs");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["logs", "--lines", "0", "--interval-ms", "200"], &no_annotations(), json!({})));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    wait_until("5 log lines", LIVENESS, || (log_lines(&ns.kubectl_ok(&["logs", "actor"])).0 >= 5).then_some(()));

    node.suspend(&actor);
    let before = ns.kubectl_ok(&["logs", "actor"]);
    let (n_before, _) = log_lines(&before);
    node.resume(&actor);
    let after = wait_until("lines after the resume", LIVENESS, || {
        let t = ns.kubectl_ok(&["logs", "actor"]);
        (log_lines(&t).0 >= n_before + 3).then_some(t)
    });
    assert!(
        after.starts_with(before.trim_end()),
        "the lines from before the suspend are still there:\n--- before ---\n{before}\n--- after ---\n{after}"
    );
    let (n_after, starts) = log_lines(&after);
    assert_eq!(starts, 1, "the process went on counting (it did not start again at line 1):\n{after}");
    assert!(n_after > n_before, "new lines after the resume ({n_before} -> {n_after})");
    assert_eq!(restarts(&ns.pod("actor")), 0);
}

/// A StatefulSet `mover` of one torpor actor that suspends on stop.
fn mover(ns: &Namespace) {
    let mut spec = pod_spec("torpor", &["counter"], json!({"spec": {"terminationGracePeriodSeconds": 120}}));
    spec["terminationGracePeriodSeconds"] = json!(120);
    let sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "mover"},
        "spec": {
            "serviceName": "mover", "replicas": 1,
            "selector": {"matchLabels": {"app": "mover"}},
            "template": {
                "metadata": {"labels": {"app": "mover"}, "annotations": {"torpor.dev/on-stop": "suspend"}},
                "spec": spec,
            },
        },
    });
    let svc = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "mover"},
        "spec": {"clusterIP": "None", "selector": {"app": "mover"}, "ports": [{"port": 8080}]},
    });
    ns.apply(&svc.to_string());
    ns.apply(&sts.to_string());
}

/// Waits for a mover-0 other than the pod with uid `old_uid` to be Ready.
#[track_caller]
fn new_mover(ns: &Namespace, old_uid: &str) -> Value {
    wait_until("a new mover-0", LIVENESS, || {
        let out = ns.kubectl(&["get", "pod", "mover-0", "-o", "json"]);
        let p: Value = serde_json::from_str(&out.stdout).ok()?;
        (p["metadata"]["uid"] != old_uid).then_some(())
    });
    ns.wait_ready("mover-0")
}

#[test]
fn statefulset_actor_continues_after_delete_on_cordoned_node_and_after_drain() {
    let ns = Namespace::new("moves");
    runtime_class();
    mover(&ns);
    let p = ns.wait_ready("mover-0");
    let first = node_of(&p);
    for i in 1..=3 {
        assert_eq!(counter(&format!("{}:8080", pod_ip(&p)), "inc"), i.to_string());
    }

    // 1. cordon its node, delete the pod: the replacement goes to the other node.
    {
        let _cordon = Cordon::new(&first.name);
        ns.kubectl_ok(&["delete", "pod", "mover-0", "--wait=true", "--timeout=300s"]);
        let q = new_mover(&ns, p["metadata"]["uid"].as_str().unwrap_or_default());
        let second = node_of(&q);
        assert_ne!(second.name, first.name, "the scheduler placed the replacement on the other node");
        let ip = pod_ip(&q);
        assert!(ip.starts_with(&second.subnet_prefix), "new IP {ip} in {}'s subnet", second.name);
        assert_eq!(counter(&format!("{ip}:8080"), "get"), "3", "the actor continued on {} with its count", second.name);
        assert_eq!(counter(&format!("{ip}:8080"), "inc"), "4");
        assert_eq!(restarts(&q), 0, "{}", q["status"]);
    }

    // 2. drain the node it is on now: back to the first node.
    let q = ns.pod("mover-0");
    let second = node_of(&q);
    let _cordon = Cordon(second.name.clone()); // drain cordons; uncordon at the end
    let out = kubectl(&["drain", &second.name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"]);
    assert!(out.success(), "kubectl drain {}: {out}", second.name);
    let r = new_mover(&ns, q["metadata"]["uid"].as_str().unwrap_or_default());
    let third = node_of(&r);
    assert_eq!(third.name, first.name, "after the drain of {} the actor runs on {}", second.name, first.name);
    let ip = pod_ip(&r);
    assert_eq!(counter(&format!("{ip}:8080"), "get"), "4", "the actor continued after the drain with its count");
    // The new pod's start waited for the old node to let go of the actor's
    // lease; it was not refused (a refused start is a restart to kubelet).
    assert_eq!(restarts(&r), 0, "{}", r["status"]);
}

#[test]
fn resource_limits_land_in_cgroups_and_hold_after_resume() {
    let ns = Namespace::new("limits");
    runtime_class();
    let res = json!({"container": {"resources": {
        "requests": {"cpu": "500m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    }}});
    ns.apply(&pod("actor", "torpor", &["counter", "--alloc-mib", "32"], &no_annotations(), res));
    let p = ns.wait_ready("actor");
    assert_eq!(p["status"]["qosClass"], "Guaranteed");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    let cid = container_id(&p);
    let check = |when: &str| {
        let mem_pod = node.pod_cgroup("memory", &p);
        let cpu_pod = node.pod_cgroup("cpu", &p);
        for (dir, what) in [(mem_pod.clone(), "pod"), (format!("{mem_pod}/{cid}"), "container")] {
            let limit = cgroup_u64(&format!("{dir}/memory.limit_in_bytes"));
            assert_eq!(limit, 128 * MIB, "{when}: the {what} cgroup's memory limit ({dir})");
        }
        for (dir, what) in [(cpu_pod.clone(), "pod"), (format!("{cpu_pod}/{cid}"), "container")] {
            let period = cgroup_u64(&format!("{dir}/cpu.cfs_period_us"));
            let quota = cgroup_u64(&format!("{dir}/cpu.cfs_quota_us"));
            assert_eq!(quota * 1000 / period, 500, "{when}: the {what} cgroup's CPU quota is 500m ({dir}: {quota}/{period})");
        }
        let procs = std::fs::read_to_string(format!("{mem_pod}/{cid}/cgroup.procs")).unwrap_or_default();
        assert!(!procs.trim().is_empty(), "{when}: the container's processes are in its cgroup");
    };
    check("running");
    assert_eq!(counter(&addr, "inc"), "1");
    node.suspend(&actor);
    assert_eq!(counter(&addr, "inc"), "2", "a request woke it");
    check("after the resume");
    // Charged as it comes back: the lazy pages the request did not touch
    // arrive in the background after the answer.
    let usage_file = format!("{}/{cid}/memory.usage_in_bytes", node.pod_cgroup("memory", &p));
    let usage = wait_until("the restored memory charged to the container's cgroup", LIVENESS, || {
        let u = cgroup_u64(&usage_file);
        (u >= 24 * MIB).then_some(u)
    });
    assert!(usage <= 128 * MIB, "under the limit: {usage}");
}

#[test]
fn oom_killed_container_shows_oomkilled() {
    let ns = Namespace::new("oom");
    runtime_class();
    for class in ["torpor", "runc"] {
        let name = format!("oom-{class}");
        let extra = json!({
            "spec": {"restartPolicy": "Never"},
            "container": {"resources": {"limits": {"memory": "64Mi"}}},
        });
        ns.apply(&pod(&name, class, &["oom"], &no_annotations(), extra));
        let st = wait_until(&format!("{name} terminated"), LIVENESS, || {
            let p = ns.pod(&name);
            let t = p["status"]["containerStatuses"][0]["state"]["terminated"].clone();
            (!t.is_null()).then_some(t)
        });
        assert_eq!(st["reason"], "OOMKilled", "{class}: {st}\n{}", ns.describe(&name));
        assert_eq!(st["exitCode"], 137, "{class}: {st}");
    }
}

#[test]
fn kubelet_and_containerd_restarts_leave_suspended_actors_alone() {
    let ns = Namespace::new("restarts");
    runtime_class();
    ns.apply(&pod("actor", "torpor", &["counter"], &no_annotations(), probes()));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    // a runc pod with the same probes on the same node: what kubelet does to
    // any pod across its own restart
    let pin = json!({"spec": {"nodeName": node.name}});
    let mut extra = probes();
    extra["spec"] = pin["spec"].clone();
    ns.apply(&pod("plain", "runc", &["counter"], &no_annotations(), extra));
    let plain = ns.wait_ready("plain");
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    let (since, plain_since) = (ready_since(&p), ready_since(&plain));
    assert_eq!(counter(&addr, "inc"), "1");

    // kubelet restart, the actor suspended
    node.suspend(&actor);
    node.restart_kubelet();
    let base = wait_probes(node, &ns.name, "actor", &BTreeMap::new(), 3);
    wait_probes(node, &ns.name, "plain", &BTreeMap::new(), 3);
    assert_eq!(failures(&base), 0, "no probe of the suspended actor failed since kubelet came back: {base:?}");
    let q = wait_until("actor Ready after the kubelet restart", LIVENESS, || {
        let q = ns.pod("actor");
        pod_is_ready(&q).then_some(q)
    });
    assert_eq!(restarts(&q), 0, "nothing restarted");
    assert_eq!(node.actor_state(&actor), "SUSPENDED", "the kubelet restart did not wake it");
    // A restarted kubelet starts every probed container as not ready until
    // its first readiness probe passes: the torpor pod's Ready may only go
    // away if the runc pod's did too.
    let plain = ns.wait_ready("plain");
    if ready_since(&q) != since {
        assert_ne!(
            ready_since(&plain),
            plain_since,
            "the torpor pod's Ready went away across the kubelet restart ({since} -> {}), the runc pod's did not",
            ready_since(&q)
        );
    }
    assert_eq!(counter(&addr, "inc"), "2", "a request wakes it with its state");

    // containerd restart, the actor suspended
    let since = ready_since(&ns.pod("actor"));
    node.suspend(&actor);
    let before = settled_probes(node, &ns.name, "actor");
    node.restart_containerd();
    // kubelet probes the actor again, and its runtime status comes from the new containerd
    let after = wait_probes(node, &ns.name, "actor", &before, 3);
    let q = ns.pod("actor");
    assert!(pod_is_ready(&q), "Ready after the containerd restart: {}", q["status"]);
    assert_eq!(restarts(&q), 0, "nothing restarted");
    assert_eq!(ready_since(&q), since, "Ready never went away across the containerd restart");
    assert_eq!(failures(&after), failures(&before), "no probe failed across the containerd restart: {after:?}");
    assert_eq!(node.actor_state(&actor), "SUSPENDED", "the containerd restart did not wake it");
    assert_eq!(counter(&addr, "inc"), "3", "a request wakes it with its state");
    assert_eq!(restarts(&ns.pod("actor")), 0);
}

#[test]
fn bad_torpor_annotation_shows_in_events_naming_it() {
    let ns = Namespace::new("annotation");
    runtime_class();
    let mut ann = BTreeMap::new();
    ann.insert("torpor.dev/idle-after", "banana");
    ns.apply(&pod("actor", "torpor", &["counter"], &ann, json!({})));
    let msg = wait_until("an event or status naming torpor.dev/idle-after", LIVENESS, || {
        let p = ns.pod("actor");
        let waiting = p["status"]["containerStatuses"][0]["state"]["waiting"]["message"].as_str().unwrap_or_default().to_string();
        if waiting.contains("torpor.dev/idle-after") {
            return Some(format!("container status: {waiting}"));
        }
        warnings(&ns, "actor").into_iter().find(|(_, m)| m.contains("torpor.dev/idle-after")).map(|(r, m)| format!("event {r}: {m}"))
    });
    eprintln!("{msg}");
    assert!(msg.contains("banana"), "the message names the bad value too: {msg}");
    let p = ns.pod("actor");
    assert!(!pod_is_ready(&p), "a pod with a bad annotation does not become Ready");
}

/// Issue 37, item 2: kubelet's probes do not keep an actor awake, a real
/// client on the node does. A torpor pod with `torpor.dev/idle-after: 6s`,
/// a TCP readiness probe and an HTTP liveness probe every 2 s (both
/// shorter than idle-after): a client on the node (this process, in the
/// host's netns: the address kubelet probes from) asking the pod every
/// 2 s keeps it RUNNING, never suspended, for more than 3x idle-after;
/// once the client stops, the actor suspends by itself while its probes
/// keep passing (Ready throughout, no restart, no probe failure, and the
/// probes do not wake it); a request wakes it, and it suspends by itself
/// again (the rules held across the suspend and resume).
#[test]
fn idle_actor_with_probes_suspends_by_itself_but_not_while_a_node_client_asks() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const IDLE_AFTER: Duration = Duration::from_secs(6);
    let ns = Namespace::new("idleprobes");
    runtime_class();
    let mut ann = BTreeMap::new();
    ann.insert("torpor.dev/idle-after", "6s");
    let probes = json!({"container": {
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2, "failureThreshold": 3, "timeoutSeconds": 5},
    }});
    ns.apply(&pod("actor", "torpor", &["counter"], &ann, probes));
    let p = ns.wait_ready("actor");
    let node = node_of(&p);
    let actor = ns.actor("actor");
    let addr = format!("{}:8080", pod_ip(&p));
    let since = ready_since(&p);
    let record = |what: &str| -> Value {
        let v = node.torporctl_json(&["status", &actor]);
        let rec = v[0]["actor"].clone();
        assert!(rec["state"].is_string() && rec["generation"].is_u64(), "{what}: torporctl status {actor}: {v}");
        rec
    };

    // A client on the node asks every 2 s (`get`: the line protocol).
    let stop = Arc::new(AtomicBool::new(false));
    let asked = Arc::new(AtomicU64::new(0));
    let client = {
        let (stop, asked, addr) = (stop.clone(), asked.clone(), addr.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                counter(&addr, "get");
                asked.fetch_add(1, Ordering::AcqRel);
                std::thread::sleep(Duration::from_secs(2));
            }
        })
    };
    // (the first answer may come from an actor woken by it, if it slept
    // before the client started: the window starts once it runs)
    wait_until("the node client's first answer", LIVENESS, || (asked.load(Ordering::Acquire) > 0).then_some(()));
    let start = record("the window's start");
    assert_eq!(start["state"], "RUNNING", "the node client's request woke the actor or kept it running: {start}");
    let window = IDLE_AFTER * 3 + Duration::from_secs(6);
    let t0 = Instant::now();
    let mut checks = 0;
    while t0.elapsed() < window {
        let now = record("in the window");
        assert_eq!(
            now["state"],
            "RUNNING",
            "a client on the node asking every 2 s keeps the actor awake ({:?} into the window): {now}",
            t0.elapsed()
        );
        assert_eq!(now["generation"], start["generation"], "no suspend in between ({:?} into the window): {now}", t0.elapsed());
        checks += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Release);
    client.join().expect("the node client");
    let answered = asked.load(Ordering::Acquire);
    assert!(answered >= 10, "the node client asked every 2 s through the {window:?} window: {answered} answers");
    eprintln!("RUNNING through {checks} checks over {window:?}, {answered} answers to the node client");

    // Alone with its probes, it suspends by itself, and stays so.
    for cycle in 1..=2u64 {
        let t = Instant::now();
        wait_until(&format!("cycle {cycle}: the idle actor suspended by itself, its probes every 2 s"), LIVENESS, || {
            (node.actor_state(&actor) == "SUSPENDED").then_some(())
        });
        eprintln!("cycle {cycle}: suspended by itself {:?} after the last client request", t.elapsed());
        let suspended = settled_probes(node, &ns.name, "actor");
        let later = wait_probes(node, &ns.name, "actor", &suspended, 3);
        assert_eq!(node.actor_state(&actor), "SUSPENDED", "cycle {cycle}: kubelet's probes did not wake it");
        assert_eq!(failures(&later), failures(&suspended), "cycle {cycle}: no probe failed while it slept: {later:?}");
        let now = ns.pod("actor");
        assert!(pod_is_ready(&now), "cycle {cycle}: Ready while suspended: {}", now["status"]);
        assert_eq!(restarts(&now), 0, "cycle {cycle}: no restart");
        // A request wakes it, with its state.
        assert_eq!(counter(&addr, "inc"), cycle.to_string(), "cycle {cycle}: a request wakes the actor with its count");
    }
    let p = ns.pod("actor");
    assert!(pod_is_ready(&p), "Ready at the end: {}", p["status"]);
    assert_eq!(ready_since(&p), since, "Ready never went away");
    assert_eq!(restarts(&p), 0, "restartCount 0");
}
