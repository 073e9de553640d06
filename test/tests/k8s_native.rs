//! torpor installed and driven through the Kubernetes API alone
//! (deploy/kubernetes, torpor-agent, kubectl-torpor), on the test cluster
//! whose containerds start plain: no torpor runtime, no torpor-snapshotter
//! (TORPOR_RIG_PLAIN=1, see test/rig/env.sh). The first test that runs
//! builds the node image and runs `kubectl apply -k` of deploy/kubernetes
//! (through the rig's overlay: per-node paths, two nodes on one machine).
//!
//! Run by test/rig/run-tests.sh in its own cluster bring-up, one test at a
//! time: `test/rig/run-tests.sh --test k8s_native`.

use serde_json::{json, Value};
use std::sync::OnceLock;
use torpor_tests::cluster::*;
use torpor_tests::workload;

const DESIRED: &str = "torpor.dev/desired-state";
const STATE: &str = "torpor.dev/state";
const CONDITION: &str = "torpor.dev/Suspended";
const AGENT_SA: &str = "torpor-agent";

/// What the nodes were before the install, and the overlay applied.
struct Install {
    /// (node, CRI runtime handlers) before `kubectl apply -k`.
    before: Vec<(String, Vec<String>)>,
    overlay: String,
    /// Pods running their own `containerd`, started before the install
    /// (see [`impostors`]); they live as long as the install (the
    /// cluster's teardown removes both).
    impostors: Impostors,
}

/// Installs torpor with kubectl (once per test binary), with a pod on each
/// node running an impostor containerd since before the install.
fn installed() -> &'static Install {
    static I: OnceLock<Install> = OnceLock::new();
    I.get_or_init(|| {
        require_cluster();
        let before = cluster().nodes.iter().map(|n| (n.name.clone(), n.runtime_handlers())).collect();
        let impostors = impostors();
        build_node_image("t1");
        // both nodes run torpor
        opt_in(&["node-a", "node-b"]);
        let overlay = write_overlay("t1");
        kubectl_ok(&["apply", "-k", &overlay]);
        wait_installed("t1");
        Install { before, overlay, impostors }
    })
}

/// A pod on each node (runc: torpor is not there yet) whose process is an
/// executable called `/usr/bin/containerd` (a copy of the actor) with the
/// node's real containerd's command line: what a tenant can run. Started
/// before the install, so its pid is below the real containerd's once the
/// install has restarted it: the process scan of the launcher before
/// issue 38 took it for containerd and ran the snapshotter in its mount
/// namespace.
struct Impostors {
    _ns: Namespace,
    /// (node, the impostor's host pid)
    pids: Vec<(String, u32)>,
}

/// The command line the impostor on `node` shows.
fn impostor_cmdline(node: &KubeNode) -> String {
    format!("/usr/local/bin/containerd --config {}/containerd.toml", node.state_dir())
}

fn impostors() -> Impostors {
    let ns = Namespace::new("native-impostor");
    let mut pids = Vec::new();
    for n in &cluster().nodes {
        let name = format!("containerd-{}", n.letter);
        let script = format!("cp /actor /usr/bin/containerd && exec -a '{}' /usr/bin/containerd sleep", impostor_cmdline(n));
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "nodeName": n.name, "dnsPolicy": "Default", "enableServiceLinks": false, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script]}],
        }});
        ns.apply(&pod.to_string());
        ns.wait_ready(&name);
        let marker = impostor_cmdline(n);
        let pid = wait_until(&format!("the impostor containerd of {}", n.name), LIVENESS, || {
            host_processes()
                .into_iter()
                .find(|(_, exe, cmd)| exe == "/usr/bin/containerd" && cmd.starts_with(&marker))
                .map(|(pid, _, _)| pid)
        });
        eprintln!("{}: an impostor containerd runs as pid {pid} (pod {}/{name})", n.name, ns.name);
        pids.push((n.name.clone(), pid));
    }
    Impostors { _ns: ns, pids }
}

/// The host's processes: (pid, exe as its mount namespace names it, command
/// line with spaces for NULs). Processes that ended meanwhile are left out.
fn host_processes() -> Vec<(u32, String, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap_or_else(|e| panic!("read /proc: {e}")).flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(exe) = std::fs::read_link(e.path().join("exe")) else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        v.push((pid, exe.to_string_lossy().into_owned(), cmd.trim_end().to_string()));
    }
    v
}

/// `/proc/<pid>/ns/mnt`.
#[track_caller]
fn mount_ns(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .unwrap_or_else(|e| panic!("readlink /proc/{pid}/ns/mnt: {e}"))
        .to_string_lossy()
        .into_owned()
}

/// A line of `/proc/<pid>/status` (`CapEff`), its value.
#[track_caller]
fn proc_status(pid: u32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    s.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// A counter pod of RuntimeClass torpor (or `class`) on `node`.
fn pod(name: &str, node: &str, class: &str, labels: Value) -> String {
    let mut spec = json!({
        "nodeName": node,
        "dnsPolicy": "Default",
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "actor", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/actor"], "args": ["counter"]}],
    });
    if class == "torpor" {
        spec["runtimeClassName"] = json!("torpor");
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}).to_string()
}

/// The pod's IP.
#[track_caller]
fn ip(p: &Value) -> String {
    p["status"]["podIP"].as_str().unwrap_or_else(|| panic!("no pod IP: {}", p["status"])).to_string()
}

#[track_caller]
fn annotate(ns: &Namespace, pod: &str, value: &str) {
    ns.kubectl_ok(&["annotate", "pod", pod, "--overwrite", &format!("{DESIRED}={value}")]);
}

/// Waits until the agent's label on the pod says `state`; the pod then.
#[track_caller]
fn wait_label(ns: &Namespace, pod: &str, state: &str) -> Value {
    wait_until(&format!("{}/{pod} labelled {STATE}={state}", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        (p["metadata"]["labels"][STATE] == state).then_some(p)
    })
}

/// The pod's torpor.dev/Suspended condition.
fn condition(p: &Value) -> Value {
    p["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == CONDITION).cloned().unwrap_or(Value::Null)
}

/// The Events of `reason` about pod `pod`.
#[track_caller]
fn events(ns: &Namespace, pod: &str, reason: &str) -> Vec<Value> {
    let sel = format!("involvedObject.name={pod},reason={reason}");
    kubectl_json(&["-n", &ns.name, "get", "events", "--field-selector", &sel])["items"].as_array().cloned().unwrap_or_default()
}

#[track_caller]
fn wait_event(ns: &Namespace, pod: &str, reason: &str) -> Value {
    wait_until(&format!("Event {reason} on {}/{pod}", ns.name), LIVENESS, || events(ns, pod, reason).pop())
}

/// `torporctl status` of the pod's actor on its node.
#[track_caller]
fn actor(ns: &Namespace, pod: &str, node: &str) -> Value {
    let v = cluster().node(node).torporctl_json(&["status", &ns.actor(pod)]);
    v[0]["actor"].clone()
}

/// Asks `suspended` by annotation and checks label, condition, Event and the actor.
#[track_caller]
fn suspend_by_annotation(ns: &Namespace, pod: &str, node: &str) {
    annotate(ns, pod, "suspended");
    let p = wait_label(ns, pod, "suspended");
    assert_eq!(actor(ns, pod, node)["state"], "SUSPENDED", "the label follows the actor");
    // the condition is a second patch (the status subresource)
    let c = wait_until(&format!("condition {CONDITION}=True on {}/{pod}", ns.name), LIVENESS, || {
        let c = condition(&ns.pod(pod));
        (c["status"] == "True").then_some(c)
    });
    assert_eq!(c["reason"], "Suspended", "{c}");
    let e = wait_event(ns, pod, "Suspended");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("took") && msg.contains(" ms") && msg.contains("suspended"), "the Event has the timings: {e}");
    assert_eq!(p["metadata"]["annotations"]["torpor.dev/applied-state"], "suspended");
    // the snapshot is named once the suspend's dumps are committed to the store
    let prefix = format!("{}@", ns.actor(pod));
    wait_until(&format!("{}/{pod} annotated with its snapshot", ns.name), LIVENESS, || {
        ns.pod(pod)["metadata"]["annotations"]["torpor.dev/snapshot"].as_str().filter(|s| s.starts_with(&prefix)).map(|_| ())
    });
}

/// Asks `running` by annotation; the actor answers with its count.
#[track_caller]
fn resume_by_annotation(ns: &Namespace, pod: &str, node: &str, count: &str) {
    annotate(ns, pod, "running");
    let p = wait_label(ns, pod, "running");
    assert_eq!(actor(ns, pod, node)["state"], "RUNNING");
    wait_until(&format!("condition {CONDITION}=False on {}/{pod}", ns.name), LIVENESS, || {
        (condition(&ns.pod(pod))["status"] == "False").then_some(())
    });
    let e = wait_event(ns, pod, "Resumed");
    assert!(e["message"].as_str().unwrap_or_default().contains("took"), "{e}");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "get"), count, "restored with its state");
}

#[test]
fn install_on_plain_containerd_then_suspend_and_resume_on_both_nodes() {
    let inst = installed();
    for (node, handlers) in &inst.before {
        assert!(!handlers.iter().any(|h| h == "torpor"), "{node} started plain, without torpor: {handlers:?}");
    }
    let ns = Namespace::new("native-install");
    for n in &cluster().nodes {
        let dropin = std::fs::read_to_string(format!("{}/conf.d/torpor.toml", n.state_dir())).unwrap_or_default();
        assert!(dropin.contains("runtime_path") && dropin.contains("torpor-node"), "{}: the installer's drop-in: {dropin}", n.name);
        assert!(n.runtime_handlers().iter().any(|h| h == "torpor"));
        let name = format!("actor-{}", n.letter);
        ns.apply(&pod(&name, &n.name, "torpor", json!({})));
        let p = ns.wait_ready(&name);
        assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
        // the label is there before anything is asked
        wait_label(&ns, &name, "running");
        suspend_by_annotation(&ns, &name, &n.name);
        resume_by_annotation(&ns, &name, &n.name, "1");
    }
    // another trigger: a request wakes a suspended actor; the label follows
    annotate(&ns, "actor-a", "suspended");
    let p = wait_label(&ns, "actor-a", "suspended");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "2", "a request woke it with its count");
    wait_label(&ns, "actor-a", "running");
    let woke = wait_until("Event of the wake by a request", LIVENESS, || {
        events(&ns, "actor-a", "Resumed").into_iter().find(|e| e["message"].as_str().unwrap_or_default().contains("another trigger"))
    });
    assert!(woke["message"].as_str().unwrap_or_default().contains(&ns.actor("actor-a")), "{woke}");
    // the agent does not undo it: the request was carried out once
    assert_eq!(ns.pod("actor-a")["metadata"]["annotations"][DESIRED], "suspended");
    assert_eq!(actor(&ns, "actor-a", "node-a")["state"], "RUNNING");
}

#[test]
fn an_invalid_desired_state_is_an_event_naming_it() {
    installed();
    let ns = Namespace::new("native-invalid");
    ns.apply(&pod("actor", "node-b", "torpor", json!({})));
    ns.wait_ready("actor");
    wait_label(&ns, "actor", "running");
    annotate(&ns, "actor", "asleep");
    let e = wait_event(&ns, "actor", "InvalidDesiredState");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("\"asleep\"") && msg.contains("running, suspended, frozen"), "{e}");
    assert_eq!(e["type"], "Warning");
    let p = ns.pod("actor");
    assert_eq!(p["metadata"]["labels"][STATE], "running", "nothing was done");
    assert_eq!(p["metadata"]["annotations"]["torpor.dev/applied-state"], "asleep", "recorded: reported once");
    assert_eq!(actor(&ns, "actor", "node-b")["state"], "RUNNING");
}

#[test]
fn an_agent_restart_resyncs_without_acting_twice() {
    installed();
    let ns = Namespace::new("native-restart");
    ns.apply(&pod("actor", "node-a", "torpor", json!({})));
    let p = ns.wait_ready("actor");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    wait_label(&ns, "actor", "running");
    suspend_by_annotation(&ns, "actor", "node-a");
    let generation = actor(&ns, "actor", "node-a")["generation"].clone();
    assert_eq!(events(&ns, "actor", "Suspended").len(), 1);

    let old = node_pod("node-a").unwrap_or_else(|| panic!("no torpor-node pod on node-a"));
    let old_name = old["metadata"]["name"].as_str().unwrap_or_default().to_string();
    kubectl_ok(&["-n", "torpor-system", "delete", "pod", &old_name, "--wait=true"]);
    let new = wait_until("a new torpor-node pod on node-a", LIVENESS, || {
        node_pod("node-a").filter(|p| p["metadata"]["name"] != old_name.as_str())
    });
    let new_name = new["metadata"]["name"].as_str().unwrap_or_default().to_string();
    // the new agent's first pass over the node's pods is done
    wait_until("the new agent's resync", LIVENESS, || {
        let out = kubectl(&["-n", "torpor-system", "logs", &new_name, "-c", "agent"]);
        out.stdout.contains("resynced this node's torpor pods").then_some(())
    });
    assert_eq!(events(&ns, "actor", "Suspended").len(), 1, "the request was not carried out again");
    let a = actor(&ns, "actor", "node-a");
    assert_eq!(a["state"], "SUSPENDED");
    assert_eq!(a["generation"], generation, "no second checkpoint");
    assert_eq!(ns.pod("actor")["metadata"]["labels"][STATE], "suspended");
    // and the new agent acts on a new request
    resume_by_annotation(&ns, "actor", "node-a", "1");
    // The new daemon renewed the lease at its start: the lease fence did
    // not freeze the resumed actor when the validity its predecessor last
    // promised (at most lease_ttl 6 s less 2 s) ran out.
    std::thread::sleep(std::time::Duration::from_secs(5));
    let node = cluster().node("node-a");
    assert_eq!(node.metric(r#"torpor_lifecycle_operations_total{op="fence_freeze",outcome="ok"}"#), 0.0, "the lease fence froze an actor");
    assert_eq!(actor(&ns, "actor", "node-a")["state"], "RUNNING");
}

#[test]
fn an_upgrade_leaves_suspended_actors_restorable() {
    installed();
    let ns = Namespace::new("native-upgrade");
    for n in &cluster().nodes {
        let name = format!("actor-{}", n.letter);
        ns.apply(&pod(&name, &n.name, "torpor", json!({})));
        let p = ns.wait_ready(&name);
        assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
        wait_label(&ns, &name, "running");
        suspend_by_annotation(&ns, &name, &n.name);
    }
    // a new image: kubectl apply -k again
    build_node_image("t2");
    let overlay = write_overlay("t2");
    let _back = BackToImage("t1");
    kubectl_ok(&["apply", "-k", &overlay]);
    wait_installed("t2");
    for n in &cluster().nodes {
        let name = format!("actor-{}", n.letter);
        assert_eq!(actor(&ns, &name, &n.name)["state"], "SUSPENDED", "{name} stayed suspended through the upgrade");
        resume_by_annotation(&ns, &name, &n.name, "1");
    }
    // back to the image the other tests expect
    kubectl_ok(&["apply", "-k", &write_overlay("t1")]);
    wait_installed("t1");
}

/// Puts back the image the other tests expect when a test that changed it
/// failed (they wait for it to be Ready).
struct BackToImage(&'static str);

impl Drop for BackToImage {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let out = kubectl(&["apply", "-k", &write_overlay(self.0)]);
            eprintln!("(back to torpor-node:{}: {out})", self.0);
        }
    }
}

/// A suspended actor whose pod is deleted on node A and made again on node
/// B continues there; node B's agent reports the move once: a `Moved`
/// Event naming node A and the annotation `torpor.dev/moved-from`.
#[test]
fn a_move_to_another_node_is_reported_once() {
    installed();
    let ns = Namespace::new("native-move");
    ns.apply(&pod("mover", "node-a", "torpor", json!({})));
    let p = ns.wait_ready("mover");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    wait_label(&ns, "mover", "running");
    suspend_by_annotation(&ns, "mover", "node-a");
    assert!(events(&ns, "mover", "Moved").is_empty(), "nothing moved yet");
    ns.kubectl_ok(&["delete", "pod", "mover", "--wait=true", "--timeout=300s"]);

    // the same actor (same namespace and pod name) on node B
    ns.apply(&pod("mover", "node-b", "torpor", json!({})));
    let q = ns.wait_ready("mover");
    assert_eq!(counter(&format!("{}:8080", ip(&q)), "inc"), "2", "it continued on node-b with its count");
    let a = actor(&ns, "mover", "node-b");
    assert_eq!(a["moved_from"], "node-a", "{a}");
    let e = wait_event(&ns, "mover", "Moved");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("node-a") && msg.contains(&format!("{}@", ns.actor("mover"))), "the Event names the node and the snapshot: {e}");
    let annotated = wait_until("the moved-from annotation", LIVENESS, || {
        ns.pod("mover")["metadata"]["annotations"]["torpor.dev/moved-from"].as_str().map(str::to_string)
    });
    assert_eq!(annotated, "node-a");
    // later passes of the agent (every 2 s here) do not report it again
    std::thread::sleep(std::time::Duration::from_secs(6));
    let moved = events(&ns, "mover", "Moved");
    assert_eq!(moved.len(), 1, "reported once: {moved:?}");
    assert!(moved[0]["count"].as_u64().unwrap_or(1) <= 1 && moved[0]["series"].is_null(), "not repeated into a series: {}", moved[0]);
    assert_eq!(ns.pod("mover")["status"]["containerStatuses"][0]["restartCount"], 0);
}

/// A kubeconfig with a token of torpor-agent's ServiceAccount, bound to
/// `bound_pod` (as the agent's own projected token is) unless None.
fn agent_kubeconfig(bound_pod: Option<&Value>) -> String {
    let c = cluster();
    let mut args = vec!["-n", "torpor-system", "create", "token", AGENT_SA];
    let (name, uid);
    if let Some(p) = bound_pod {
        name = p["metadata"]["name"].as_str().unwrap_or_default().to_string();
        uid = p["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        args.extend_from_slice(&["--bound-object-kind", "Pod", "--bound-object-name", &name, "--bound-object-uid", &uid]);
    }
    let token = kubectl_ok(&args).trim().to_string();
    let path = format!("{}/agent-{}.kubeconfig", c.state, if bound_pod.is_some() { "bound" } else { "unbound" });
    let server = kubectl_ok(&["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"]);
    let ca = kubectl_ok(&["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.certificate-authority}"]);
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: agent\n  context:\n    cluster: c\n    user: agent\ncurrent-context: agent\n"
    );
    std::fs::write(&path, kc).unwrap_or_else(|e| panic!("write {path}: {e}"));
    path
}

/// A kubeconfig with a token of torpor-agent's ServiceAccount bound to no pod.
fn unbound_kc() -> String {
    agent_kubeconfig(None)
}

fn kubectl_as(kubeconfig: &str, args: &[&str]) -> Out {
    let c = cluster();
    let mut all = vec!["--kubeconfig", kubeconfig];
    all.extend_from_slice(args);
    run_cmd(&c.kubectl, &all, None, &[("KUBECACHEDIR".into(), format!("{}/kubectl-cache-agent", c.state))], COMMAND_LIMIT)
}

#[test]
fn the_agent_cannot_touch_another_nodes_pods() {
    installed();
    let ns = Namespace::new("native-rbac");
    ns.apply(&pod("on-a", "node-a", "runc", json!({})));
    ns.apply(&pod("on-b", "node-b", "runc", json!({})));
    ns.wait_ready("on-a");
    ns.wait_ready("on-b");
    let agent_a = node_pod("node-a").unwrap_or_else(|| panic!("no torpor-node pod on node-a"));
    let kc = agent_kubeconfig(Some(&agent_a));
    // the identity: torpor-agent, with node-a in its token
    let who: Value = serde_json::from_str(&kubectl_as(&kc, &["auth", "whoami", "-o", "json"]).ok()).unwrap_or(Value::Null);
    assert_eq!(who["status"]["userInfo"]["username"], format!("system:serviceaccount:torpor-system:{AGENT_SA}"), "{who}");
    assert_eq!(who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"], json!(["node-a"]), "{who}");

    let annotate_as = |kc: &str, pod: &str| kubectl_as(kc, &["-n", &ns.name, "annotate", "pod", pod, "--overwrite", "torpor.dev/probe=1"]);
    let status_as = |kc: &str, pod: &str| {
        let patch = json!({"status": {"conditions": [{"type": CONDITION, "status": "False", "reason": "Probe"}]}}).to_string();
        kubectl_as(kc, &["-n", &ns.name, "patch", "pod", pod, "--subresource=status", "--type=strategic", "-p", &patch])
    };
    let own = annotate_as(&kc, "on-a");
    assert!(own.success(), "the agent patches its own node's pods: {own}");
    let st = status_as(&kc, "on-a");
    assert!(st.success(), "and their status: {st}");
    for out in [annotate_as(&kc, "on-b"), status_as(&kc, "on-b")] {
        assert!(!out.success(), "refused on node-b's pod: {out}");
        assert!(out.stderr.contains("torpor-agent may only change pods of its own node (node-a), not of node node-b"), "{out}");
    }
    assert_eq!(ns.pod("on-b")["metadata"]["annotations"]["torpor.dev/probe"], Value::Null, "node-b's pod is untouched");
    // it may delete pods (RBAC: the torpor.dev/on-no-room: move policy),
    // its own node's alone
    let out = kubectl_as(&kc, &["-n", &ns.name, "delete", "pod", "on-b", "--wait=false"]);
    assert!(!out.success(), "refused on node-b's pod: {out}");
    assert!(out.stderr.contains("torpor-agent may only change pods of its own node (node-a), not of node node-b"), "{out}");
    assert!(ns.pod("on-b")["metadata"]["deletionTimestamp"].is_null(), "node-b's pod is not deleted");
    let out = kubectl_as(&unbound_kc(), &["-n", &ns.name, "delete", "pod", "on-a", "--wait=false"]);
    assert!(!out.success() && out.stderr.contains("its token names no node"), "{out}");
    // a token of the agent that names no node may change no pod
    let unbound = unbound_kc();
    let out = annotate_as(&unbound, "on-a");
    assert!(!out.success() && out.stderr.contains("its token names no node"), "{out}");
    // and RBAC gives it nothing else
    for (verb, res, sub) in [
        ("create", "pods", ""),
        ("get", "secrets", ""),
        ("patch", "nodes", "status"),
        ("create", "pods", "exec"),
        ("delete", "daemonsets", ""),
    ] {
        let subresource = format!("--subresource={sub}");
        let mut args = vec!["auth", "can-i", verb, res, "-A"];
        if !sub.is_empty() {
            args.push(&subresource);
        }
        let out = kubectl_as(&kc, &args);
        assert_eq!(out.stdout.trim(), "no", "torpor-agent may not {verb} {res} {sub}: {out}");
    }
    let out = kubectl_as(&kc, &["auth", "can-i", "patch", "pods", "-A"]);
    assert_eq!(out.stdout.trim(), "yes", "{out}");
    // it may patch nodes (RBAC), but only its own node's torpor.dev/ready label
    let own = kubectl_as(&kc, &["label", "node", "node-a", "--overwrite", &format!("{READY_LABEL}=true")]);
    assert!(own.success(), "the agent labels its own node: {own}");
    // (a change of node-b's label: kubectl sends nothing when the value is
    // the one it has, as when torpor is ready there too)
    let before = node_label("node-b", READY_LABEL);
    let change = if before.is_some() { format!("{READY_LABEL}-") } else { format!("{READY_LABEL}=true") };
    let other = kubectl_as(&kc, &["label", "node", "node-b", "--overwrite", &change]);
    assert!(!other.success() && other.stderr.contains("torpor-agent may only label its own node (node-a), not node-b"), "{other}");
    assert_eq!(node_label("node-b", READY_LABEL), before, "node-b's label is untouched");
    let label = kubectl_as(&kc, &["label", "node", "node-a", "--overwrite", "torpor.dev/probe=1"]);
    assert!(!label.success() && label.stderr.contains("only set or remove the label torpor.dev/ready"), "{label}");
    assert_eq!(node_label("node-a", "torpor.dev/probe"), None);
    let out = kubectl_as(&kc, &["-n", &ns.name, "delete", "pod", "on-a", "--wait=false"]);
    assert!(out.success(), "the agent deletes its own node's pods: {out}");
}

#[test]
fn the_kubectl_plugin_suspends_resumes_and_reports() {
    installed();
    let ns = Namespace::new("native-plugin");
    ns.apply(&pod("web", "node-b", "torpor", json!({"app": "plug"})));
    let p = ns.wait_ready("web");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    wait_label(&ns, "web", "running");

    let out = kubectl_torpor(&["suspend", "-n", &ns.name, "web", "--timeout", "180"]);
    let table = out.clone().ok();
    assert!(table.contains("web") && table.contains("suspended"), "{out}");
    assert_eq!(actor(&ns, "web", "node-b")["state"], "SUSPENDED");

    // (the snapshot is named once the suspend's dumps are committed)
    let v = wait_until("kubectl torpor status names the snapshot", LIVENESS, || {
        let v: Value = serde_json::from_str(&kubectl_torpor(&["status", "-n", &ns.name, "-o", "json"]).ok()).unwrap_or(Value::Null);
        v[0]["snapshot"].is_string().then_some(v)
    });
    assert_eq!(v[0]["name"], "web", "{v}");
    assert_eq!(v[0]["state"], "suspended", "{v}");
    assert_eq!(v[0]["node"], "node-b", "{v}");
    assert_eq!(v[0]["condition"]["status"], "True", "{v}");
    assert!(v[0]["snapshot"].as_str().is_some_and(|s| s.starts_with(&format!("{}/web@", ns.name))), "{v}");

    let all = kubectl_torpor(&["status", "-A", "-l", "app=plug"]).ok();
    assert!(all.lines().any(|l| l.starts_with(&ns.name) && l.contains("suspended")), "{all}");
    let snaps = kubectl_torpor(&["snapshots", "-n", &ns.name, "web"]).ok();
    assert!(snaps.contains(&format!("{}/web@", ns.name)), "{snaps}");

    // a second suspend request of a suspended pod is done at once
    let again = kubectl_torpor(&["suspend", "-n", &ns.name, "web", "-o", "json"]);
    let v: Value = serde_json::from_str(&again.clone().ok()).unwrap_or(Value::Null);
    assert!(v[0]["result"].as_str().unwrap_or_default().contains("already suspended"), "{again}");
    assert_eq!(events(&ns, "web", "Suspended").len(), 1, "not suspended twice");

    let out = kubectl_torpor(&["resume", "-n", &ns.name, "-l", "app=plug", "-o", "json"]);
    let v: Value = serde_json::from_str(&out.clone().ok()).unwrap_or(Value::Null);
    assert_eq!(v[0]["state"], "running", "{out}");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "get"), "1", "restored with its count");
    // usage errors are errors
    let none = kubectl_torpor(&["suspend", "-n", &ns.name]);
    assert!(!none.success() && none.stderr.contains("name the pods"), "{none}");
}

#[test]
fn z_delete_k_uninstalls_then_apply_k_installs_again() {
    // named to run last (one test thread runs them in name order); it
    // installs again at its end all the same
    let inst = installed();
    // kubectl torpor uninstall (each node's preStop removes torpor while
    // the API still answers it), then delete -k
    uninstall_kustomize(&inst.overlay);
    for n in &cluster().nodes {
        assert_eq!(node_label(&n.name, READY_LABEL), None, "{}: the ready label is removed", n.name);
        wait_until(&format!("runtime handler torpor gone from {}", n.name), LIVENESS, || {
            (!n.runtime_handlers().iter().any(|h| h == "torpor")).then_some(())
        });
        let st = n.state_dir();
        assert!(!std::path::Path::new(&format!("{st}/conf.d/torpor.toml")).exists(), "{}: the drop-in is removed", n.name);
        for b in ["bin/containerd-shim-torpor-v1", "bin/torporctl", "bin/torpor-snapshotter", "sbin/criu", "lib/torpor"] {
            assert!(!std::path::Path::new(&format!("{st}/torpor-node/{b}")).exists(), "{}: {b} removed", n.name);
        }
    }
    assert!(!kubectl(&["get", "runtimeclass", "torpor"]).success(), "the RuntimeClass is gone");
    kubectl_ok(&["apply", "-k", &inst.overlay]);
    wait_installed("t1");
}

/// Issue 38 #2: a pod running its own `containerd` (an executable of that
/// name with the real one's command line, older than the real one) does not
/// change what the launcher runs: the snapshotter runs in the host's mount
/// namespace (PID 1's; where that cannot be entered here,
/// TORPOR_HOST_PID's), and names the real containerd, the peer of its
/// socket; the impostor is left alone (not signalled by the install's
/// restart of containerd).
#[test]
fn a_pod_running_its_own_containerd_does_not_steer_the_launcher() {
    let inst = installed();
    let host_ns = mount_ns("self");
    if let Ok(pid1) = std::fs::read_link("/proc/1/ns/mnt") {
        assert_eq!(pid1.to_string_lossy(), host_ns, "the tests run in the host's mount namespace");
    } else {
        eprintln!("(PID 1's mount namespace cannot be read here: the host's is this test's, as the rig's containerds')");
    }
    let procs = host_processes();
    for n in &cluster().nodes {
        let impostor = inst
            .impostors
            .pids
            .iter()
            .find(|(name, _)| name == &n.name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no impostor on {}", n.name));
        let imp = procs
            .iter()
            .find(|(p, _, _)| *p == impostor)
            .unwrap_or_else(|| panic!("{}: the impostor (pid {impostor}) is gone: signalled?", n.name));
        assert!(imp.1.ends_with("/containerd") && imp.2.starts_with(&impostor_cmdline(n)), "{}: {imp:?}", n.name);
        let impostor_ns = mount_ns(&impostor.to_string());
        assert_ne!(impostor_ns, host_ns, "the impostor runs in its pod's mount namespace");
        let pidfile = format!("{}/containerd.pid", n.state_dir());
        let real: u32 = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("read {pidfile}: {e}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{pidfile}: {e}"));
        assert_eq!(mount_ns(&real.to_string()), host_ns, "{}: the rig's containerd runs in the host's mount namespace", n.name);
        // the impostor is older (the install restarted containerd): it is
        // what a process scan in pid order finds first
        eprintln!("{}: containerd pid {real}, impostor pid {impostor}", n.name);
        assert!(impostor < real, "{}: the impostor ({impostor}) started before the install's containerd ({real})", n.name);

        // the snapshotter: in the host's mount namespace, never the impostor's
        let bin = format!("{}/torpor-node/bin/torpor-snapshotter", n.state_dir());
        let snap: Vec<u32> = procs.iter().filter(|(_, exe, _)| exe == &bin).map(|(p, _, _)| *p).collect();
        assert_eq!(snap.len(), 1, "{}: one torpor-snapshotter ({bin}): {snap:?}", n.name);
        assert_eq!(mount_ns(&snap[0].to_string()), host_ns, "{}: the snapshotter runs in the host's mount namespace", n.name);
        // its log names the real containerd (the peer of its socket)
        let pod = node_pod(&n.name).unwrap_or_else(|| panic!("no torpor-node pod on {}", n.name));
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let log = kubectl_ok(&["-n", "torpor-system", "logs", &pod_name, "-c", "snapshotter"]);
        let line = log
            .lines()
            .find(|l| l.contains("starting") && l.contains("torpor-snapshotter"))
            .unwrap_or_else(|| panic!("{}: no start line in the snapshotter's log:\n{log}", n.name));
        let sock = format!("{}/containerd.sock", n.state_dir());
        assert!(line.contains(&format!("containerd's (pid {real}, the peer of {sock})")), "{}: {line}", n.name);
        assert!(!line.contains(&format!("pid {impostor}")), "{}: {line}", n.name);
    }
}

/// Issue 38 #8: the agent, which parses pods' annotations, runs without
/// privilege: no capability, no new privileges, seccomp, a read-only root,
/// and of the host only the shims' socket dirs, read-only (no host `/`).
#[test]
fn the_agent_container_is_unprivileged_and_has_no_host_root() {
    installed();
    for n in &cluster().nodes {
        let pod = node_pod(&n.name).unwrap_or_else(|| panic!("no torpor-node pod on {}", n.name));
        let spec = &pod["spec"];
        let agent = spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == "agent")
            .unwrap_or_else(|| panic!("no agent container: {spec}"));
        let sc = &agent["securityContext"];
        assert_ne!(sc["privileged"], true, "{sc}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{sc}");
        assert!(sc["capabilities"]["add"].is_null(), "{sc}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{sc}");
        for m in agent["volumeMounts"].as_array().into_iter().flatten() {
            let vol = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("no volume {m}"));
            if let Some(path) = vol["hostPath"]["path"].as_str() {
                assert_ne!(path.trim_end_matches('/'), "", "the agent mounts the host's /: {m}");
                assert!(path.contains("torpor") && path.ends_with("/shims"), "the agent mounts only shim socket dirs of the host: {vol}");
                assert_eq!(m["readOnly"], true, "{m}");
            }
        }
    }
    // and so it runs: every agent process (one per node) has no capability,
    // no new privileges, a seccomp filter, and no host file but the sockets
    let agents: Vec<(u32, String)> = host_processes()
        .into_iter()
        .filter(|(_, exe, cmd)| exe == "/torpor/bin/torpor-agent" && cmd.contains("--socket-dir"))
        .map(|(p, _, cmd)| (p, cmd))
        .collect();
    for n in &cluster().nodes {
        let dir = n.shim_socket_dir();
        let (pid, _) = agents
            .iter()
            .find(|(_, cmd)| cmd.ends_with(&format!("--socket-dir {dir}")))
            .unwrap_or_else(|| panic!("{}: no torpor-agent on {dir}: {agents:?}", n.name));
        assert_eq!(proc_status(*pid, "CapEff"), "0000000000000000", "{}: the agent's capabilities", n.name);
        assert_eq!(proc_status(*pid, "CapPrm"), "0000000000000000", "{}: the agent's capabilities", n.name);
        assert_eq!(proc_status(*pid, "NoNewPrivs"), "1", "{}", n.name);
        assert_eq!(proc_status(*pid, "Seccomp"), "2", "{}: a seccomp filter", n.name);
        let root = format!("/proc/{pid}/root");
        let st = n.state_dir();
        for host_file in [
            format!("{st}/containerd.sock"),
            format!("/host{st}/containerd.sock"),
            format!("{st}/torpor/store.sock"),
            format!("/host{st}/torpor/store.sock"),
        ] {
            assert!(!std::path::Path::new(&format!("{root}{host_file}")).exists(), "{}: the agent sees {host_file}", n.name);
        }
        assert!(std::path::Path::new(&format!("{root}{dir}")).is_dir(), "{}: the agent has its shims' dir {dir}", n.name);
    }
}

// ------------------------------------------------------------------ issue 42

const REQUESTS: &str = "torpor.dev/requests";
const RESTORED: &str = "torpor.dev/RequestsRestored";

/// A counter pod of RuntimeClass torpor on `node` with these resources.
fn pod_with_resources(name: &str, node: &str, resources: Value) -> String {
    let mut p: Value = serde_json::from_str(&pod(name, node, "torpor", json!({}))).unwrap_or_else(|e| panic!("{e}"));
    p["spec"]["containers"][0]["resources"] = resources;
    p.to_string()
}

/// The pod's condition `type_` (Null when it has none).
fn condition_of(p: &Value, type_: &str) -> Value {
    p["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == type_).cloned().unwrap_or(Value::Null)
}

/// Waits until the pod's spec asks `requests` for its container; the pod then.
#[track_caller]
fn wait_requests(ns: &Namespace, pod: &str, requests: &Value) -> Value {
    wait_until(&format!("{}/{pod} requesting {requests}", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        (p["spec"]["containers"][0]["resources"]["requests"] == *requests).then_some(p)
    })
}

/// Waits until kubelet reports the container running with `cpu` requested
/// (`status.containerStatuses[].resources`, what the runtime says it
/// applied: CRI's UpdateContainerResources went through the shim) and no
/// resize is pending or in progress.
#[track_caller]
fn wait_actuated(ns: &Namespace, pod: &str, cpu: &str) -> Value {
    wait_until(&format!("kubelet runs {}/{pod} with cpu request {cpu}", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        let busy = ["PodResizePending", "PodResizeInProgress"].iter().any(|t| condition_of(&p, t)["status"] == "True");
        (p["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == cpu && !busy).then_some(p)
    })
}

/// The container's id (without `containerd://`).
#[track_caller]
fn container_id(p: &Value) -> String {
    let id = p["status"]["containerStatuses"][0]["containerID"].as_str().unwrap_or_else(|| panic!("no container id: {}", p["status"]));
    id.rsplit("://").next().unwrap_or(id).to_string()
}

/// CPU millicores of a quantity (`2`, `1500m`).
fn millicores(q: &str) -> i64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or_else(|e| panic!("{q}: {e}")),
        None => (q.parse::<f64>().unwrap_or_else(|e| panic!("{q}: {e}")) * 1000.0) as i64,
    }
}

/// Issue 42 #1, #2: a suspended actor's pod gives its requests back to the
/// scheduler (read back from the API: lowered to the agent's floors, limits
/// as they were, the originals in the agent's annotation, kubelet applies
/// it to the suspended container through the shim's Update) and gets them
/// back when it wakes, with its state.
#[test]
fn requests_of_a_suspended_actor_shrink_and_come_back() {
    installed();
    let ns = Namespace::new("native-requests");
    let limits = json!({"cpu": "1", "memory": "256Mi"});
    let original = json!({"cpu": "200m", "memory": "64Mi"});
    ns.apply(&pod_with_resources("sleeper", "node-a", json!({"requests": original, "limits": limits})));
    let p = ns.wait_ready("sleeper");
    assert_eq!(p["status"]["qosClass"], "Burstable");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    wait_label(&ns, "sleeper", "running");
    assert!(condition_of(&p, RESTORED).is_null(), "nothing lowered yet");

    suspend_by_annotation(&ns, "sleeper", "node-a");
    let p = wait_requests(&ns, "sleeper", &json!({"cpu": "10m", "memory": "4Mi"}));
    assert_eq!(p["spec"]["containers"][0]["resources"]["limits"], limits, "limits are not touched");
    let kept: Value = serde_json::from_str(p["metadata"]["annotations"][REQUESTS].as_str().unwrap_or("null")).unwrap_or(Value::Null);
    assert_eq!(kept, json!({"actor": original}), "the originals, kept by the agent");
    let e = wait_event(&ns, "sleeper", "RequestsShrunk");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("cpu 200m -> 10m") && msg.contains("memory 64Mi -> 4Mi"), "{e}");
    assert!(msg.contains("without torpor.dev/on-stop: suspend, an eviction"), "no on-stop: suspend, said: {e}");
    let c = wait_until("condition RequestsRestored=False Shrunk", LIVENESS, || {
        let c = condition_of(&ns.pod("sleeper"), RESTORED);
        (c["reason"] == "Shrunk").then_some(c)
    });
    assert_eq!(c["status"], "False", "{c}");
    // kubelet resized the suspended container (CRI UpdateContainerResources -> the shim)
    let p = wait_actuated(&ns, "sleeper", "10m");
    assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0);
    assert!(pod_is_ready(&p), "Ready while asleep and resized");
    assert_eq!(actor(&ns, "sleeper", "node-a")["state"], "SUSPENDED", "the resize did not wake it");
    // the shim kept the new resources for the restore (config.json of its bundle)
    let node = cluster().node("node-a");
    let cid = container_id(&p);
    let bundle = format!("{}/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}/config.json", node.state_dir());
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&bundle).unwrap_or_else(|e| panic!("{bundle}: {e}"))).unwrap_or(Value::Null);
    assert_eq!(spec["linux"]["resources"]["cpu"]["shares"], 10, "{}", spec["linux"]["resources"]);

    resume_by_annotation(&ns, "sleeper", "node-a", "1");
    let p = wait_requests(&ns, "sleeper", &original);
    assert_eq!(p["spec"]["containers"][0]["resources"]["limits"], limits);
    wait_until("the agent's annotation removed", LIVENESS, || {
        ns.pod("sleeper")["metadata"]["annotations"][REQUESTS].is_null().then_some(())
    });
    let p = wait_actuated(&ns, "sleeper", "200m");
    let c = wait_until("condition RequestsRestored=True", LIVENESS, || {
        let c = condition_of(&ns.pod("sleeper"), RESTORED);
        (c["status"] == "True").then_some(c)
    });
    assert_eq!(c["reason"], "Restored", "{c}");
    wait_event(&ns, "sleeper", "RequestsRestored");
    // the running container's cgroup has its CPU share back (200m: 204 shares)
    let shares = format!("{}/{}/cpu.shares", node.pod_cgroup("cpu", &p), container_id(&p));
    wait_until(&format!("{shares} = 204"), LIVENESS, || (cgroup_u64(&shares) == 204).then_some(()));
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "2", "awake, with its state");
    assert_eq!(ns.pod("sleeper")["status"]["containerStatuses"][0]["restartCount"], 0);
}

/// Issue 42 #1: a Guaranteed pod (requests equal to limits) keeps its
/// requests while its actor sleeps, and the agent says why in an Event.
#[test]
fn requests_of_a_guaranteed_pod_are_kept_with_an_event() {
    installed();
    let ns = Namespace::new("native-guaranteed");
    let fixed = json!({"cpu": "100m", "memory": "64Mi"});
    ns.apply(&pod_with_resources("fixed", "node-b", json!({"requests": fixed, "limits": fixed})));
    let p = ns.wait_ready("fixed");
    assert_eq!(p["status"]["qosClass"], "Guaranteed");
    wait_label(&ns, "fixed", "running");
    suspend_by_annotation(&ns, "fixed", "node-b");
    let e = wait_event(&ns, "fixed", "RequestsKept");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("Guaranteed") && msg.contains("QoS"), "{e}");
    // later passes (every 2 s) neither resize it nor say it again
    std::thread::sleep(std::time::Duration::from_secs(6));
    let p = ns.pod("fixed");
    assert_eq!(p["spec"]["containers"][0]["resources"]["requests"], fixed);
    assert!(p["metadata"]["annotations"][REQUESTS].is_null());
    assert!(condition_of(&p, RESTORED).is_null());
    assert!(events(&ns, "fixed", "RequestsShrunk").is_empty());
    assert_eq!(events(&ns, "fixed", "RequestsKept").len(), 1);
    resume_by_annotation(&ns, "fixed", "node-b", "0");
}

/// Issue 42 #3: when the node filled up while the actor slept, its requests
/// back are deferred by kubelet: the actor runs anyway, and the agent says
/// so (condition RequestsRestored False Deferred, a Warning Event); once
/// room is made, kubelet grants them and the condition turns True.
#[test]
fn requests_back_deferred_when_the_node_filled_up() {
    installed();
    let ns = Namespace::new("native-deferred");
    let original = json!({"cpu": "400m", "memory": "64Mi"});
    ns.apply(&pod_with_resources("late", "node-b", json!({"requests": original, "limits": {"cpu": "1", "memory": "256Mi"}})));
    let p = ns.wait_ready("late");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    wait_label(&ns, "late", "running");
    suspend_by_annotation(&ns, "late", "node-b");
    wait_requests(&ns, "late", &json!({"cpu": "10m", "memory": "4Mi"}));
    wait_actuated(&ns, "late", "10m");

    // fill the node's CPU up to 100m short of what it can allocate
    let node = kubectl_json(&["get", "node", "node-b"]);
    let allocatable = millicores(node["status"]["allocatable"]["cpu"].as_str().unwrap_or("0"));
    let pods =
        kubectl_json(&["get", "pods", "-A", "--field-selector", "spec.nodeName=node-b,status.phase!=Succeeded,status.phase!=Failed"]);
    let used: i64 = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["spec"]["containers"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["resources"]["requests"]["cpu"].as_str().map(millicores))
        .sum();
    let filler = allocatable - used - 100;
    assert!(filler > 0, "node-b: allocatable {allocatable}m, requested {used}m");
    let fill = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "filler"}, "spec": {
        "nodeName": "node-b", "dnsPolicy": "Default", "enableServiceLinks": false, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/actor"], "args": ["sleep"],
            "resources": {"requests": {"cpu": format!("{filler}m")}}}],
    }});
    ns.apply(&fill.to_string());
    ns.wait_ready("filler");

    // it wakes (a request), its requests back do not fit
    let p = ns.pod("late");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "2", "a request woke it: it runs on its lowered requests");
    let c = wait_until("condition RequestsRestored=False Deferred", LIVENESS, || {
        let c = condition_of(&ns.pod("late"), RESTORED);
        (c["reason"] == "Deferred").then_some(c)
    });
    assert_eq!(c["status"], "False", "{c}");
    let e = wait_event(&ns, "late", "ResizeDeferred");
    assert_eq!(e["type"], "Warning", "{e}");
    let p = ns.pod("late");
    assert_eq!(p["spec"]["containers"][0]["resources"]["requests"], original, "asked back");
    assert_eq!(condition_of(&p, "PodResizePending")["reason"], "Deferred");
    assert_eq!(actor(&ns, "late", "node-b")["state"], "RUNNING");

    // room again: kubelet grants them
    ns.kubectl_ok(&["delete", "pod", "filler", "--wait=true"]);
    wait_actuated(&ns, "late", "400m");
    let c = wait_until("condition RequestsRestored=True", LIVENESS, || {
        let c = condition_of(&ns.pod("late"), RESTORED);
        (c["status"] == "True").then_some(c)
    });
    assert_eq!(c["reason"], "Restored", "{c}");
    assert_eq!(counter(&format!("{}:8080", ip(&ns.pod("late"))), "inc"), "3");
}

/// Bytes of a memory quantity (`4Gi`, `512Mi`, `7Mi`, `1G`, `123456`).
fn bytes(q: &str) -> i64 {
    let units =
        [("Ki", 1i64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40), ("k", 1000), ("M", 1_000_000), ("G", 1_000_000_000)];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<i64>().unwrap_or_else(|e| panic!("{q}: {e}")) * mult;
        }
    }
    q.parse().unwrap_or_else(|e| panic!("{q}: {e}"))
}

/// Node `node`'s allocatable memory less what its pods request (their
/// containers' requests and the RuntimeClass overhead), in bytes: what the
/// scheduler can still place there.
fn free_memory(node: &str) -> i64 {
    let n = kubectl_json(&["get", "node", node]);
    let allocatable = bytes(n["status"]["allocatable"]["memory"].as_str().unwrap_or("0"));
    let sel = format!("spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed");
    let pods = kubectl_json(&["get", "pods", "-A", "--field-selector", &sel]);
    let used: i64 = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let containers: i64 = p["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["resources"]["requests"]["memory"].as_str().map(bytes))
                .sum();
            containers + p["spec"]["overhead"]["memory"].as_str().map(bytes).unwrap_or(0)
        })
        .sum();
    allocatable - used
}

/// A StatefulSet of `replicas` counter actors (all started at once:
/// `Parallel`), each asking `resources`, of RuntimeClass `class` (None:
/// the node's default, runc), with `annotations` on its pods and
/// `placement` (nodeSelector or affinity) merged into their spec.
fn stateful_set(name: &str, replicas: u32, class: Option<&str>, resources: Value, annotations: Value, placement: Value) -> String {
    let mut spec = json!({
        "dnsPolicy": "Default",
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 60,
        "containers": [{"name": "actor", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/actor"], "args": ["counter"], "resources": resources}],
    });
    if let Some(c) = class {
        spec["runtimeClassName"] = json!(c);
    }
    for (k, v) in placement.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}, "spec": {
        "replicas": replicas,
        "serviceName": name,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}, "annotations": annotations}, "spec": spec},
    }})
    .to_string()
}

/// The pods of StatefulSet `app` (label app=`app`).
fn pods_of(ns: &Namespace, app: &str) -> Vec<Value> {
    kubectl_json(&["-n", &ns.name, "get", "pods", "-l", &format!("app={app}")])["items"].as_array().cloned().unwrap_or_default()
}

/// Whether the scheduler found no room for the pod.
fn unschedulable(p: &Value) -> bool {
    p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
}

/// Deletes StatefulSet `app` and waits until its pods are gone.
fn delete_set(ns: &Namespace, app: &str) {
    ns.kubectl_ok(&["delete", "statefulset", app, "--wait=true", "--timeout=300s"]);
    wait_until(&format!("the pods of {}/{app} gone", ns.name), LIVENESS * 2, || pods_of(ns, app).is_empty().then_some(()));
}

/// How many actors the density test runs on the small node (env
/// TORPOR_DENSITY_ACTORS, default 32: four times what 4 GiB holds of pods
/// requesting 512Mi).
fn density_actors() -> u32 {
    std::env::var("TORPOR_DENSITY_ACTORS").ok().and_then(|v| v.parse().ok()).unwrap_or(32)
}

/// Issue 42 #4: on a small node (node-b: 4 GiB allocatable), pods
/// requesting 512Mi each: with runc, the scheduler places what fits and
/// leaves the rest Pending; with torpor every actor goes idle, is
/// suspended, gives its requests back, and the next ones are placed, until
/// all of them run there, and each answers a request (woken one after
/// another). The counts go to $TORPOR_DENSITY_RESULTS (JSON) when set
/// (bench/density.py: `actors_per_node`).
#[test]
fn density_sleeping_actors_fit_many_times_what_runc_fits() {
    installed();
    let node = "node-b";
    let n = density_actors();
    let ns = Namespace::new("native-density");
    let allocatable = bytes(kubectl_json(&["get", "node", node])["status"]["allocatable"]["memory"].as_str().unwrap_or("0"));
    assert!(allocatable <= (4 << 30) + (1 << 20), "{node} is the small node (test/cluster/up.sh): allocatable memory {allocatable}");
    let free = free_memory(node);
    let on_b = json!({"nodeSelector": {"kubernetes.io/hostname": node}});
    let resources = json!({"requests": {"cpu": "10m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}});

    // runc: what fits, the rest Pending for lack of memory
    ns.apply(&stateful_set("runc", n, None, resources.clone(), json!({}), on_b.clone()));
    let runc = wait_until(&format!("the scheduler placed what fits of {n} runc pods"), LIVENESS, || {
        let pods = pods_of(&ns, "runc");
        let placed: Vec<_> = pods.iter().filter(|p| p["spec"]["nodeName"] == node).collect();
        let pending = pods.iter().filter(|p| unschedulable(p)).count();
        (pods.len() == n as usize && placed.len() + pending == n as usize && placed.iter().all(|p| pod_is_ready(p))).then_some(placed.len())
    });
    let pending = pods_of(&ns, "runc").into_iter().find(unschedulable).unwrap_or(Value::Null);
    let why = pending["status"]["conditions"].to_string();
    assert!(runc < n as usize && why.contains("Insufficient memory"), "runc: {runc} of {n} placed; a pending pod: {why}");
    assert_eq!(runc as i64, free / (512 << 20), "runc: as many as {free} bytes hold");
    delete_set(&ns, "runc");

    // torpor: all of them, each suspended when idle and shrunk
    let t0 = std::time::Instant::now();
    ns.apply(&stateful_set("actors", n, Some("torpor"), resources, json!({"torpor.dev/idle-after": "3s"}), on_b));
    let all = wait_until(&format!("all {n} torpor actors placed on {node} and Ready"), LIVENESS * 5, || {
        let pods = pods_of(&ns, "actors");
        (pods.len() == n as usize && pods.iter().all(|p| p["spec"]["nodeName"] == node && pod_is_ready(p))).then_some(pods)
    });
    let placed_s = t0.elapsed().as_secs_f64();
    let shrunk = all.iter().filter(|p| p["spec"]["containers"][0]["resources"]["requests"]["memory"] == "4Mi").count();
    assert!(shrunk >= n as usize - runc, "{shrunk} of {n} pods' requests lowered: the scheduler placed the others in what they gave back");
    // each answers, woken one after another, with its own state
    for i in 0..n {
        let p = ns.pod(&format!("actors-{i}"));
        assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1", "actors-{i} answers");
    }
    let restarts: u64 =
        pods_of(&ns, "actors").iter().map(|p| p["status"]["containerStatuses"][0]["restartCount"].as_u64().unwrap_or(0)).sum();
    assert_eq!(restarts, 0);
    eprintln!(
        "density on {node} ({allocatable} bytes allocatable, {free} free): runc {runc} pods of 512Mi, torpor all {n} in {placed_s:.1} s"
    );
    if let Ok(path) = std::env::var("TORPOR_DENSITY_RESULTS") {
        let r = json!({"node": node, "allocatable_memory_bytes": allocatable, "free_memory_bytes": free, "request": "512Mi",
            "runc": runc, "torpor": n, "torpor_all_placed": true, "torpor_placed_s": placed_s});
        std::fs::write(&path, r.to_string()).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    assert!(n as usize >= 4 * runc, "torpor {n} >= 4 x runc {runc}");
}

/// Issue 42 #3, #4: an actor (`torpor.dev/on-no-room: move`) sleeps on
/// the small node, which fills up meanwhile; woken, its requests back are
/// deferred, so the agent suspends it and deletes its pod; its
/// StatefulSet creates it again, the scheduler places it on the other
/// node, and it continues there with its state.
#[test]
fn density_an_actor_with_no_room_moves_with_its_state() {
    installed();
    let ns = Namespace::new("native-nomove");
    let prefer_b = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}]}}]}}});
    let resources = json!({"requests": {"cpu": "10m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}});
    ns.apply(&stateful_set(
        "mover",
        1,
        Some("torpor"),
        resources,
        json!({"torpor.dev/on-no-room": "move", "torpor.dev/on-stop": "suspend"}),
        prefer_b,
    ));
    let p = ns.wait_ready("mover-0");
    assert_eq!(p["spec"]["nodeName"], "node-b", "placed on the node it prefers");
    let uid = p["metadata"]["uid"].clone();
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "2");
    wait_label(&ns, "mover-0", "running");
    suspend_by_annotation(&ns, "mover-0", "node-b");
    wait_requests(&ns, "mover-0", &json!({"cpu": "10m", "memory": "4Mi"}));
    wait_until("kubelet applied the lowered requests", LIVENESS, || {
        (ns.pod("mover-0")["status"]["containerStatuses"][0]["resources"]["requests"]["memory"] == "4Mi").then_some(())
    });

    // the node fills up while it sleeps: 100Mi left
    let filler = free_memory("node-b") - (100 << 20);
    assert!(filler > 0);
    let fill = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "filler"}, "spec": {
        "nodeName": "node-b", "dnsPolicy": "Default", "enableServiceLinks": false, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/actor"], "args": ["sleep"],
            "resources": {"requests": {"memory": filler.to_string()}}}],
    }});
    ns.apply(&fill.to_string());
    ns.wait_ready("filler");
    // and a PodDisruptionBudget allows no disruption of it
    ns.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "mover"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "mover"}}}})
        .to_string(),
    );
    wait_until("the disruption controller computed the budget", LIVENESS, || {
        let b: Value = serde_json::from_str(&ns.kubectl(&["get", "pdb", "mover", "-o", "json"]).stdout).ok()?;
        (b["status"]["observedGeneration"] == b["metadata"]["generation"] && b["status"]["disruptionsAllowed"] == 0).then_some(())
    });

    // woken by a request: it answers at once, on its lowered requests
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "3");
    // the budget keeps it here, said once, until it allows a disruption
    let kept = wait_event(&ns, "mover-0", "NotMoved");
    let msg = kept["message"].as_str().unwrap_or_default();
    assert!(msg.contains("PodDisruptionBudget mover allows no disruption"), "{kept}");
    assert!(events(&ns, "mover-0", "Moving").is_empty(), "moved despite its budget");
    assert_eq!(ns.pod("mover-0")["metadata"]["uid"], uid);
    ns.kubectl_ok(&["delete", "pdb", "mover"]);
    let e = wait_event(&ns, "mover-0", "Moving");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("node-b has no room") && msg.contains("StatefulSet/mover"), "{e}");
    // its StatefulSet makes it again, where it fits
    let q = wait_until("mover-0 made again and Ready", LIVENESS * 2, || {
        let q = ns.kubectl(&["get", "pod", "mover-0", "-o", "json"]);
        let q: Value = serde_json::from_str(&q.stdout).ok()?;
        (q["metadata"]["uid"] != uid && pod_is_ready(&q)).then_some(q)
    });
    assert_eq!(q["spec"]["nodeName"], "node-a", "node-b is full: the scheduler placed it on node-a");
    assert_eq!(q["spec"]["containers"][0]["resources"]["requests"]["memory"], "1Gi", "with its own requests");
    assert_eq!(counter(&format!("{}:8080", ip(&q)), "inc"), "4", "it continued on node-a with its state");
    let moved = wait_event(&ns, "mover-0", "Moved");
    assert!(moved["message"].as_str().unwrap_or_default().contains("node-b"), "{moved}");
    assert!(events(&ns, "mover-0", "MoveFailed").is_empty());
}

/// kubelet's view of the memory node `node`'s pods use: the working set of
/// its pods' cgroup (the summary API's system container `pods`), bytes.
fn pods_working_set(node: &str) -> i64 {
    let s: Value =
        serde_json::from_str(&kubectl_ok(&["get", "--raw", &format!("/api/v1/nodes/{node}/proxy/stats/summary")])).unwrap_or(Value::Null);
    let pods = s["node"]["systemContainers"].as_array().into_iter().flatten().find(|c| c["name"] == "pods").cloned().unwrap_or(Value::Null);
    pods["memory"]["workingSetBytes"].as_i64().unwrap_or_else(|| panic!("no working set of {node}'s pods in its summary: {}", s["node"]))
}

/// Whether node `node` reports MemoryPressure.
fn memory_pressure(node: &str) -> bool {
    let n = kubectl_json(&["get", "node", node]);
    n["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "MemoryPressure" && c["status"] == "True")
}

/// Issue 42 #3: an actor woken on a node that filled up while it slept runs
/// above its lowered requests; when the node's pods then use more memory
/// than it can allocate, kubelet evicts it first (it exceeds its requests
/// most). With `torpor.dev/on-stop: suspend`, kubelet's stop suspends it
/// before its container exits: its StatefulSet creates it again on a node
/// with room and it continues with its state. Nothing lost.
#[test]
fn density_an_evicted_actor_is_suspended_first() {
    installed();
    let node = "node-b";
    let ns = Namespace::new("native-evict");
    let prefer_b = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}}]}}});
    let alloc_mib = 600;
    let resources = json!({"requests": {"cpu": "10m", "memory": "700Mi"}, "limits": {"memory": "1Gi"}});
    let mut set: Value =
        serde_json::from_str(&stateful_set("evictee", 1, Some("torpor"), resources, json!({"torpor.dev/on-stop": "suspend"}), prefer_b))
            .unwrap_or_else(|e| panic!("{e}"));
    set["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["counter", "--alloc-mib", alloc_mib.to_string()]);
    ns.apply(&set.to_string());
    let p = ns.wait_ready("evictee-0");
    assert_eq!(p["spec"]["nodeName"], node, "placed on the node it prefers");
    let uid = p["metadata"]["uid"].clone();
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "1");
    suspend_by_annotation(&ns, "evictee-0", node);
    let shrunk = wait_event(&ns, "evictee-0", "RequestsShrunk");
    assert!(!shrunk["message"].as_str().unwrap_or_default().contains("without torpor.dev/on-stop"), "{shrunk}");
    wait_until("kubelet applied the lowered requests", LIVENESS, || {
        (ns.pod("evictee-0")["status"]["containerStatuses"][0]["resources"]["requests"]["memory"] == "4Mi").then_some(())
    });

    // While it sleeps, a Guaranteed pod takes the node's free requests
    // (50Mi left: its requests back are deferred) and uses memory up to
    // what puts the woken actor's pages over kubelet's eviction threshold:
    // kubelet evicts when the pods' working set comes within evictionHard's
    // memory.available (300Mi on node-b) of their cgroup's limit,
    // allocatable + 300Mi, i.e. above allocatable. Aimed at the middle:
    // allocatable + 150Mi, 150Mi short of the limit, where the kernel's OOM
    // killer would act. The pods' working set also holds page cache left
    // by earlier pods, which the hog's pages push out: so the hog is aimed
    // in steps, each from the working set measured after the last.
    let allocatable = bytes(kubectl_json(&["get", "node", node])["status"]["allocatable"]["memory"].as_str().unwrap_or("0"));
    let aim = allocatable + (150 << 20);
    let actor_pages = (alloc_mib + 16) << 20;
    let hog_request = free_memory(node) - (50 << 20);
    let used_before = pods_working_set(node);
    let hog = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog"}, "spec": {
        "nodeName": node, "dnsPolicy": "Default", "enableServiceLinks": false, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/actor"],
            "args": ["sleep"],
            "resources": {"requests": {"cpu": "100m", "memory": hog_request.to_string()}, "limits": {"cpu": "100m", "memory": hog_request.to_string()}}}],
    }});
    ns.apply(&hog.to_string());
    ns.wait_ready("hog");
    // what the hog may still take: its limit less what it holds and 64Mi for its runtime
    let mut hog_room = hog_request - (64 << 20);
    // one more allocator in the hog's container, left running (sh returns at
    // once) and logging to /tmp/alloc-<n>: how many MiB it takes
    let mut allocators = 0;
    let mut grow_hog = |hog_room: &mut i64, want: i64| -> (i64, String) {
        let mib = want.min(*hog_room) >> 20;
        let mib = mib - mib % 16;
        if mib <= 0 {
            return (0, String::new());
        }
        allocators += 1;
        let log = format!("/tmp/alloc-{allocators}");
        let cmd = format!("/actor oom --step-mib 16 --max-mib {mib} >{log} 2>&1 &");
        workload::exec(&ns, "hog", &["sh", "-c", &cmd]);
        *hog_room -= mib << 20;
        (mib, log)
    };
    let mut settled = used_before;
    for round in 0..4 {
        let want = aim - actor_pages - settled;
        if want < (32 << 20) {
            break;
        }
        let (mib, log) = grow_hog(&mut hog_room, want);
        assert!(
            mib > 0 || round > 0,
            "node {node}: allocatable {allocatable}, pods use {settled}, hog may take {hog_room} of {hog_request}"
        );
        if mib == 0 {
            break;
        }
        wait_until(&format!("the hog's allocator {log} took {mib} MiB"), LIVENESS, || {
            workload::exec(&ns, "hog", &["cat", &log]).contains("reached --max-mib").then_some(())
        });
        // kubelet's stats catch up (cAdvisor's housekeeping: 10 s)
        std::thread::sleep(std::time::Duration::from_secs(15));
        settled = pods_working_set(node);
    }
    assert!(!memory_pressure(node), "no pressure before the actor wakes: pods use {}", pods_working_set(node));
    eprintln!("{node}: allocatable {allocatable}, pods used {used_before} before the hog, {settled} now");

    // it wakes (a request): its pages come back, the node is short of memory
    assert_eq!(counter(&format!("{}:8080", ip(&p)), "inc"), "2");
    // if the pods' working set stays under the threshold (more cache pushed
    // out), the hog grows again, one step per 20 s (kubelet's stats lag)
    let mut polls = 0u32;
    let evicted = wait_until(&format!("kubelet evicts evictee-0 from {node}"), LIVENESS, || {
        polls += 1;
        if polls.is_multiple_of(60) {
            let ws = pods_working_set(node);
            eprintln!("{node}: pods use {ws} of {allocatable} bytes, MemoryPressure {}", memory_pressure(node));
            if ws < allocatable + (32 << 20) && !memory_pressure(node) {
                eprintln!("{node}: the hog grows by {} MiB", grow_hog(&mut hog_room, aim - ws).0);
            }
        }
        events(&ns, "evictee-0", "Evicted").into_iter().find(|e| e["involvedObject"]["uid"] == uid)
    });
    assert!(evicted["message"].as_str().unwrap_or_default().contains("memory"), "{evicted}");
    // kubelet's stop suspended it: its StatefulSet makes it again, where it fits
    let q = wait_until("evictee-0 made again and Ready", LIVENESS * 2, || {
        let q: Value = serde_json::from_str(&ns.kubectl(&["get", "pod", "evictee-0", "-o", "json"]).stdout).ok()?;
        (q["metadata"]["uid"] != uid && pod_is_ready(&q)).then_some(q)
    });
    assert_eq!(q["spec"]["nodeName"], "node-a", "{node} is full: placed on node-a");
    assert_eq!(counter(&format!("{}:8080", ip(&q)), "inc"), "3", "it continued with its state: the eviction suspended it first");
    assert_eq!(ns.pod("hog")["status"]["phase"], "Running", "the hog (within its requests) was not evicted");
    // hand the node on without pressure
    ns.kubectl_ok(&["delete", "pod", "hog", "--wait=true"]);
    wait_until(&format!("{node} without MemoryPressure"), LIVENESS, || (!memory_pressure(node)).then_some(()));
}
