//! Tenants stay apart, through kubectl (issue 38, rows 1 and 3;
//! docs/SECURITY.md, "Pod authors"): a pod in one namespace can neither
//! take over, restore, clone nor act on (through torpor-agent's
//! `torpor.dev/desired-state`) another namespace's actor.
//!
//! Run by test/rig/run-tests.sh with the cluster up, one test at a time.
//! Each namespace is deleted by a guard, also on panic.

use serde_json::{json, Value};
use torpor_tests::cluster::*;
use torpor_tests::workload::{annotate, resume_by_annotation, runtime_class, suspend_by_annotation, Agents};

/// A pod of RuntimeClass torpor on node-a running the counter (port 8080),
/// with `annotations`.
fn counter_pod(name: &str, annotations: Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "runtimeClassName": "torpor",
            "nodeName": "node-a",
            "dnsPolicy": "Default",
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "actor", "image": ACTOR_IMAGE, "imagePullPolicy": "Never",
                            "command": ["/actor"], "args": ["counter"]}],
        },
    })
    .to_string()
}

/// The namespace's event messages about pod `pod`.
fn event_messages(ns: &Namespace, pod: &str) -> Vec<String> {
    ns.events().iter().filter(|e| e["involvedObject"]["name"] == pod).filter_map(|e| e["message"].as_str().map(str::to_string)).collect()
}

/// Waits until an event of pod `pod` contains `what`; all its messages.
#[track_caller]
fn wait_event_with(ns: &Namespace, pod: &str, what: &str) -> String {
    wait_until(&format!("an event of {}/{pod} saying {what:?}", ns.name), LIVENESS, || {
        let m = event_messages(ns, pod);
        m.iter().any(|m| m.contains(what)).then(|| m.join("\n"))
    })
}

#[test]
fn a_pod_can_neither_take_clone_nor_act_on_another_namespaces_actor() {
    require_cluster();
    runtime_class();
    let _agents = Agents::start();
    let a = Namespace::new("tenant-a");
    let b = Namespace::new("tenant-b");
    let node = cluster().node("node-a");

    // Tenant A's actor, counted to 3.
    a.apply(&counter_pod("web", json!({})));
    let p = a.wait_ready("web");
    let addr = format!("{}:8080", p["status"]["podIP"].as_str().unwrap_or_default());
    for i in 1..=3 {
        assert_eq!(counter(&addr, "inc"), i.to_string());
    }
    let victim = a.actor("web");

    // B acts on A's actor through the agent: a pod annotated with A's
    // actor id asks for a suspend. Its own sandbox is refused (the id is
    // not of its namespace), and the agent, which maps pods to actors by
    // the pod uid the shim recorded, does nothing for it.
    b.apply(&counter_pod("act", json!({"torpor.dev/actor": victim, "torpor.dev/desired-state": "suspended"})));
    let refused = wait_event_with(&b, "act", "belongs to the pod's namespace");
    eprintln!("tenant B's pod naming A's actor: {refused}");
    assert!(!refused.contains("RUNNING"), "says nothing of A's actor: {refused}");
    // A pass of the agent over node-a's pods after B's request: A's own
    // (no-op) request is applied, B's is not.
    annotate(&a, "web", "running");
    wait_until("the agent's pass over tenant A's pod", LIVENESS, || {
        (a.pod("web")["metadata"]["annotations"]["torpor.dev/applied-state"] == "running").then_some(())
    });
    let act: Value = b.pod("act");
    assert!(act["metadata"]["annotations"]["torpor.dev/applied-state"].is_null(), "the agent acted for B's pod: {act}");
    assert_eq!(node.actor_state(&victim), "RUNNING", "A's actor was not suspended by B's pod");
    assert_eq!(counter(&addr, "get"), "3");

    // A suspends its own actor through the agent (still works).
    suspend_by_annotation(&a, "web");

    // B clones A's suspended actor: refused at container creation, naming
    // the annotation and the node's clone policy, nothing of A.
    b.apply(&counter_pod("clone", json!({"torpor.dev/restore-from": victim})));
    let refused = wait_event_with(&b, "clone", "clone_source_namespaces");
    eprintln!("tenant B's clone of A's actor: {refused}");
    assert!(refused.contains("torpor.dev/restore-from"), "{refused}");
    assert!(!refused.contains("no snapshot") && !refused.contains("SUSPENDED"), "says nothing of what A holds: {refused}");

    // A's actor resumes with its state.
    resume_by_annotation(&a, "web");
    assert_eq!(counter(&addr, "inc"), "4");
}
