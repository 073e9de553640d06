//! torpor installed with its Helm chart (deploy/helm/torpor) on one node
//! of the test cluster that opted in (node-a, labelled torpor.dev/enabled)
//! and not on the other (node-b), on the plain containerds of
//! TORPOR_RIG_PLAIN=1: the object tier's credentials and the store key
//! from Secrets, the node's cgroup driver in the drop-in, metrics scraped;
//! an actor scheduled by the RuntimeClass's nodeSelector, suspended; a
//! `helm uninstall` refused while it sleeps, a `helm upgrade` (a new image
//! tag) under it, then its resume; and the uninstall. README's "Using it on
//! a cluster" walks through the same steps.
//!
//! Run by test/rig/run-tests.sh on the cluster of tests/k8s_native.rs
//! (it leaves no torpor installed, and uninstalls theirs if it runs after them): `test/rig/run-tests.sh --test k8s_install`.

use serde_json::{json, Value};
use torpor_tests::cluster::*;

const NS: &str = "torpor-system";
const RELEASE: &str = "torpor";

fn helm_path() -> String {
    std::env::var("TORPOR_HELM").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/usr/local/bin/helm".into())
}

/// `helm ARGS` against the cluster (not checked).
fn helm(args: &[&str]) -> Out {
    let c = cluster();
    let mut all = vec!["--kubeconfig", c.kubeconfig.as_str()];
    all.extend_from_slice(args);
    let home = format!("{}/helm", c.state);
    let env = vec![
        ("HELM_CACHE_HOME".to_string(), format!("{home}/cache")),
        ("HELM_CONFIG_HOME".to_string(), format!("{home}/config")),
        ("HELM_DATA_HOME".to_string(), format!("{home}/data")),
    ];
    run_cmd(&helm_path(), &all, None, &env, COMMAND_LIMIT)
}

/// Leaves the cluster without torpor when the test fails midway, and
/// without its namespace and Secrets in any case (the next test binary
/// installs with kustomize).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = kubectl_torpor(&["uninstall", "--force", "--timeout", "300"]);
            let out = helm(&["uninstall", RELEASE, "-n", NS, "--no-hooks", "--wait", "--timeout", "300s"]);
            eprintln!("(cleanup: {out})");
        }
        let _ = kubectl(&["label", "node", "node-a", &format!("{ENABLED_LABEL}-")]);
        // with the Secrets, which a later install would mount
        let _ = kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=240s"]);
    }
}

/// The chart's values for the rig: node-a's paths, the Secrets, metrics on
/// the rig's address, the API server where the rig's nodes reach it.
fn values(tag: &str) -> String {
    let c = cluster();
    let a = c.node("node-a");
    // node-a's installer settings, without the rig's AWS_* exports: the
    // credentials come from the Secret
    let env: String = a.node_env().lines().filter(|l| !l.starts_with("export AWS_")).map(|l| format!("{l}\n")).collect();
    let env = format!("{env}TORPOR_DATA_DIRS={}\n", data_dir(a));
    let metrics = torpor_tests::metrics::address_in(&format!("{}/snapshotter.toml", a.state_dir()));
    let port = std::env::var("TORPOR_CLUSTER_APISERVER_PORT").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "16443".into());
    json!({
        "image": {"tag": tag},
        "nodeEnv": {"default.env": "# every node: the defaults\n", "node-a.env": env},
        "objectStore": {"credentialsSecret": "torpor-object-store"},
        "storeKey": {"secret": "torpor-store-key"},
        "metrics": {"address": metrics},
        "agent": {"resyncSeconds": 2},
        "uninstall": {"timeoutSeconds": 300},
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}],
    })
    .to_string()
}

/// What an uninstall leaves on node `n` (TORPOR_DATA_DIRS): a dir of the rig's.
fn data_dir(n: &KubeNode) -> String {
    format!("{}/torpor-node-data", n.state_dir())
}

fn write_values(tag: &str) -> String {
    let path = format!("{}/helm-values-{tag}.json", cluster().state);
    std::fs::write(&path, values(tag)).unwrap_or_else(|e| panic!("write {path}: {e}"));
    path
}

fn chart() -> String {
    format!("{}/deploy/helm/torpor", repo_root())
}

/// A host process's environment (NUL-separated `K=V`).
fn environ(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_else(|e| panic!("read /proc/{pid}/environ: {e}"));
    raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

/// The pid of node `n`'s torpor-snapshotter (the installed binary).
fn snapshotter_pid(n: &KubeNode) -> u32 {
    let bin = format!("{}/torpor-node/bin/torpor-snapshotter", n.state_dir());
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap_or_else(|e| panic!("read /proc: {e}")).flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if std::fs::read_link(e.path().join("exe")).is_ok_and(|x| x.to_string_lossy() == bin) {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "one {bin}: {found:?}");
    found[0]
}

fn counter_pod(name: &str) -> String {
    // no nodeName: the scheduler places it, by the RuntimeClass's nodeSelector
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "runtimeClassName": "torpor", "dnsPolicy": "Default", "enableServiceLinks": false, "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "actor", "image": ACTOR_IMAGE, "imagePullPolicy": "Never", "command": ["/actor"], "args": ["counter"]}],
    }})
    .to_string()
}

#[test]
fn helm_installs_on_the_labelled_node_only_and_upgrades_and_uninstalls_around_a_sleeping_actor() {
    require_cluster();
    assert!(std::path::Path::new(&helm_path()).is_file(), "{} missing: scripts/deps.sh helm builds it", helm_path());
    let (a, b) = (cluster().node("node-a"), cluster().node("node-b"));
    // a cluster without torpor: a kustomize install of tests/k8s_native.rs is uninstalled first
    let ds = kubectl(&["-n", NS, "get", "daemonset", "torpor-node", "-o", "json"]);
    if ds.success() {
        let v: Value = serde_json::from_str(&ds.stdout).unwrap_or(Value::Null);
        assert_ne!(v["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm", "a Helm release of torpor is installed already");
        eprintln!("(torpor is installed with kustomize: uninstalling it first)");
        uninstall_kustomize(&format!("{}/torpor-overlay", cluster().state));
    }
    let _cleanup = Cleanup;

    // 1. the namespace (its pods may be privileged), the Secrets, node-a opts in
    if !kubectl(&["get", "namespace", NS]).success() {
        kubectl_ok(&["create", "namespace", NS]);
    }
    kubectl_ok(&["label", "namespace", NS, "--overwrite", "pod-security.kubernetes.io/enforce=privileged"]);
    let key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let access = std::env::var("TORPOR_RIG_S3_ACCESS_KEY").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "torpor-rig".into());
    let secret = std::env::var("TORPOR_RIG_S3_SECRET_KEY").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "torpor-rig-secret-key".into());
    for (name, data) in [
        ("torpor-object-store", json!({"aws_access_key_id": access, "aws_secret_access_key": secret})),
        ("torpor-store-key", json!({"k1": key})),
    ] {
        apply(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "stringData": data}).to_string());
    }
    opt_in(&["node-a"]);
    std::fs::create_dir_all(data_dir(a)).unwrap_or_else(|e| panic!("mkdir {}: {e}", data_dir(a)));

    // 2. helm install
    build_node_image("h1");
    let out = helm(&["install", RELEASE, &chart(), "-n", NS, "-f", &write_values("h1")]);
    assert!(out.success(), "{out}");
    wait_installed_on(a, "h1");
    let pods = kubectl_json(&["-n", NS, "get", "pods", "-l", "app.kubernetes.io/name=torpor-node"]);
    let nodes: Vec<&str> = pods["items"].as_array().into_iter().flatten().filter_map(|p| p["spec"]["nodeName"].as_str()).collect();
    assert_eq!(nodes, ["node-a"], "torpor-node runs on the labelled node only");
    assert_eq!(node_label("node-b", READY_LABEL), None);
    assert!(!b.runtime_handlers().iter().any(|h| h == "torpor"), "node-b's containerd is untouched");
    assert!(!std::path::Path::new(&format!("{}/conf.d/torpor.toml", b.state_dir())).exists());
    // the drop-in has the node's cgroup driver (the rig's runc: SystemdCgroup = false)
    let dropin = std::fs::read_to_string(format!("{}/conf.d/torpor.toml", a.state_dir())).unwrap_or_default();
    assert!(dropin.contains("SystemdCgroup = false"), "{dropin}");
    let pod_a = node_pod("node-a").unwrap_or_else(|| panic!("no torpor-node pod on node-a"));
    let pod_name = pod_a["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let install_log = kubectl_ok(&["-n", NS, "logs", &pod_name, "-c", "install"]);
    assert!(install_log.contains("cgroup driver: cgroupfs") && install_log.contains("containerd 2."), "{install_log}");
    // the daemon: credentials and key not in its environment; node id = the node's name
    let env = environ(snapshotter_pid(a));
    assert!(!env.iter().any(|e| e.starts_with("AWS_") || e.contains(&secret) || e.contains(key)), "{env:?}");
    assert!(env.contains(&"TORPOR_NODE_ID=node-a".to_string()) && env.contains(&"TORPOR_STORE_KEY_ID=k1".to_string()), "{env:?}");
    let snap_log = kubectl_ok(&["-n", NS, "logs", &pod_name, "-c", "snapshotter"]);
    assert!(!snap_log.contains(&secret) && !snap_log.contains(key), "secrets in the log");
    assert!(!snap_log.contains("WARNING: the object tier is a local directory"), "the rig's tier is S3");

    // 3. an actor, placed by the RuntimeClass's nodeSelector, suspended
    let ns = Namespace::new("install-helm");
    ns.apply(&counter_pod("web"));
    let p = ns.wait_ready("web");
    assert_eq!(p["spec"]["nodeName"], "node-a", "scheduled where torpor is ready");
    assert_eq!(p["spec"]["overhead"]["memory"], "7Mi", "the RuntimeClass's overhead");
    let addr = format!("{}:8080", p["status"]["podIP"].as_str().unwrap_or_default());
    assert_eq!(counter(&addr, "inc"), "1");
    wait_until("the agent's label on web", LIVENESS, || {
        (ns.pod("web")["metadata"]["labels"]["torpor.dev/state"] == "running").then_some(())
    });
    let out = kubectl_torpor(&["suspend", "-n", &ns.name, "web", "-o", "json"]);
    let v: Value = serde_json::from_str(&out.clone().ok()).unwrap_or(Value::Null);
    assert_eq!(v[0]["state"], "suspended", "{out}");
    assert_eq!(a.actor_state(&ns.actor("web")), "SUSPENDED");
    // metrics: scraped on the address the chart set
    assert!(a.metric(r#"torpor_lifecycle_operations_total{op="suspend",outcome="ok"}"#) >= 1.0, "the suspend is counted");

    // 4. uninstall while it sleeps: refused, nothing deleted
    let refused = kubectl_torpor(&["uninstall"]);
    assert_eq!(refused.code, Some(4), "{refused}");
    assert!(refused.stderr.contains(&format!("{}/web (node-a)", ns.name)), "{refused}");
    let out = helm(&["uninstall", RELEASE, "-n", NS, "--timeout", "300s"]);
    assert!(!out.success(), "helm uninstall refused while a torpor pod exists: {out}");
    assert!(kubectl(&["-n", NS, "get", "daemonset", "torpor-node"]).success(), "nothing deleted");
    assert_eq!(node_label("node-a", READY_LABEL).as_deref(), Some("true"));
    assert_eq!(a.actor_state(&ns.actor("web")), "SUSPENDED");
    // Helm records the release as `uninstalling` before it runs the
    // pre-delete hook, and keeps it so when the hook refuses; an upgrade
    // then finds "no deployed releases". A rollback to the installed
    // revision makes it deployed again (README, the cluster section).
    let status = helm(&["status", RELEASE, "-n", NS, "-o", "json"]);
    let v: Value = serde_json::from_str(&status.clone().ok()).unwrap_or(Value::Null);
    assert_eq!(v["info"]["status"], "uninstalling", "{status}");
    let revision = v["version"].as_u64().unwrap_or_else(|| panic!("no revision in helm status: {v}")).to_string();
    let out = helm(&["rollback", RELEASE, &revision, "-n", NS, "--wait", "--timeout", "300s"]);
    assert!(out.success(), "{out}");
    let v: Value = serde_json::from_str(&helm(&["status", RELEASE, "-n", NS, "-o", "json"]).ok()).unwrap_or(Value::Null);
    assert_eq!(v["info"]["status"], "deployed", "{v}");
    assert_eq!(a.actor_state(&ns.actor("web")), "SUSPENDED");

    // 5. upgrade while it sleeps: a new tag rolls node-a's pod
    build_node_image("h2");
    let out = helm(&["upgrade", RELEASE, &chart(), "-n", NS, "-f", &write_values("h2")]);
    assert!(out.success(), "{out}");
    wait_installed_on(a, "h2");
    assert_eq!(a.actor_state(&ns.actor("web")), "SUSPENDED", "it slept through the upgrade");
    let out = kubectl_torpor(&["resume", "-n", &ns.name, "web", "-o", "yaml"]);
    assert!(out.clone().ok().contains("\"state\": \"running\""), "{out}");
    assert_eq!(counter(&addr, "get"), "1", "restored with its count");

    // 6. uninstall: the pod gone, helm's hook removes torpor from node-a
    drop(ns);
    wait_until("no pod of RuntimeClass torpor left", LIVENESS, || (!torpor_pods_exist()).then_some(()));
    let out = helm(&["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "300s"]);
    assert!(out.success(), "{out}");
    assert!(!a.runtime_handlers().iter().any(|h| h == "torpor"), "node-a's containerd lost the handler");
    assert_eq!(node_label("node-a", READY_LABEL), None);
    let st = a.state_dir();
    assert!(!std::path::Path::new(&format!("{st}/conf.d/torpor.toml")).exists(), "the drop-in is removed");
    for f in ["bin/containerd-shim-torpor-v1", "bin/torpor-snapshotter", "sbin/criu", "lib/torpor"] {
        assert!(!std::path::Path::new(&format!("{st}/torpor-node/{f}")).exists(), "{f} removed");
    }
    let left = std::fs::read_to_string(format!("{}/TORPOR-UNINSTALLED.txt", data_dir(a))).unwrap_or_default();
    assert!(left.contains("left on disk") && left.contains("--wipe"), "the uninstall says what it left: {left:?}");
    assert!(!kubectl(&["get", "runtimeclass", "torpor"]).success(), "the RuntimeClass is gone");
    let _ = std::fs::remove_dir_all(data_dir(a));
}
