//! Pods and their containers through CRI: the configs kubelet would send,
//! the [`Pod`] guard, and the containers' states.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::command::{write_json, Output, TempDir};
use crate::names::unique_name;
use crate::node::Node;
use crate::under_test::runtime_handler;
use crate::{ACTOR_IMAGE, POD_NAMESPACE};

// ------------------------------------------------------------ CRI configs

/// A CRI PodSandboxConfig as kubelet would send it (cgroupfs driver), for node A.
pub fn pod_config(name: &str, annotations: &BTreeMap<String, String>, log_dir: &Path) -> Value {
    pod_config_on(Node::a(), name, annotations, log_dir)
}

/// [`pod_config`] for a pod of `node` (its cgroup parent).
pub fn pod_config_on(node: &Node, name: &str, annotations: &BTreeMap<String, String>, log_dir: &Path) -> Value {
    let uid = format!("uid-{name}");
    json!({
        "metadata": {
            "name": name,
            "namespace": POD_NAMESPACE,
            "uid": uid,
            "attempt": 0
        },
        "hostname": name.chars().take(63).collect::<String>(),
        "log_directory": log_dir.to_string_lossy(),
        "labels": { "torpor-test": "true" },
        "annotations": annotations,
        "linux": {
            "cgroup_parent": node.rig.pod_cgroup_parent(name),
            "security_context": {
                "namespace_options": { "network": 0, "pid": 1, "ipc": 0 }
            }
        }
    })
}

/// A CRI ContainerConfig running `/actor <args...>` from the actor image.
pub fn container_config(name: &str, args: &[&str]) -> Value {
    json!({
        "metadata": { "name": name, "attempt": 0 },
        "image": { "image": ACTOR_IMAGE },
        "command": ["/actor"],
        "args": args,
        "log_path": format!("{name}.log"),
        "labels": { "torpor-test": "true" },
        "linux": { "resources": {} }
    })
}

// ------------------------------------------------------------------- pods

/// A pod sandbox owned by a test. Dropping it stops and removes the pod
/// (with its containers), even when the test panicked.
#[derive(Debug)]
pub struct Pod {
    pub id: String,
    pub name: String,
    /// The node it runs on (node A unless made with [`Pod::run_on`]...).
    pub node: &'static Node,
    /// The PodSandboxConfig file (needed by `crictl create`).
    pub config_path: String,
    pub log_dir: PathBuf,
    /// The pod's annotations (`torpor.dev/*`).
    pub annotations: BTreeMap<String, String>,
    /// Its Kubernetes namespace (CRI metadata): [`POD_NAMESPACE`] unless
    /// made with [`PodOptions::in_namespace`].
    pub namespace: String,
    dir: TempDir,
    removed: bool,
}

/// Options for a pod.
#[derive(Debug, Default, Clone)]
pub struct PodOptions {
    pub annotations: BTreeMap<String, String>,
    /// Runtime handler; None = the one under test.
    pub runtime: Option<String>,
    /// Kubernetes namespace (CRI metadata); None = [`POD_NAMESPACE`].
    pub namespace: Option<String>,
}

impl PodOptions {
    /// A pod of the runtime under test with these annotations.
    pub fn annotated(pairs: &[(&str, &str)]) -> PodOptions {
        PodOptions { annotations: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), runtime: None, namespace: None }
    }

    /// The pod in Kubernetes namespace `ns` instead of [`POD_NAMESPACE`]
    /// (another tenant).
    pub fn in_namespace(mut self, ns: &str) -> PodOptions {
        self.namespace = Some(ns.to_string());
        self
    }

    /// A pod of the actor `actor` (`torpor.dev/actor`).
    pub fn actor(actor: &str) -> PodOptions {
        PodOptions::annotated(&[("torpor.dev/actor", actor)])
    }
}

impl Pod {
    /// `crictl runp` of a fresh pod with the runtime under test; panics on failure.
    #[track_caller]
    pub fn run(prefix: &str) -> Pod {
        Self::run_with(prefix, PodOptions::default())
    }

    #[track_caller]
    pub fn run_with(prefix: &str, opts: PodOptions) -> Pod {
        match Self::try_run(prefix, opts) {
            Ok(p) => p,
            Err(o) => panic!("crictl runp failed: {o}"),
        }
    }

    /// `crictl runp`, returning the failed command's output on error.
    pub fn try_run(prefix: &str, opts: PodOptions) -> Result<Pod, Output> {
        Self::try_run_exact(Node::a(), &unique_name(prefix), 0, opts)
    }

    /// [`Pod::run_with`] on `node`.
    #[track_caller]
    pub fn run_on(node: &'static Node, prefix: &str, opts: PodOptions) -> Pod {
        match Self::try_run_on(node, prefix, opts) {
            Ok(p) => p,
            Err(o) => panic!("crictl runp on node {} failed: {o}", node.letter),
        }
    }

    /// [`Pod::try_run`] on `node`.
    pub fn try_run_on(node: &'static Node, prefix: &str, opts: PodOptions) -> Result<Pod, Output> {
        Self::try_run_exact(node, &unique_name(prefix), 0, opts)
    }

    /// A pod named `name` on `node` (e.g. the same pod name as one that
    /// ran on the other node: the same default actor id).
    #[track_caller]
    pub fn run_named_on(node: &'static Node, name: &str, opts: PodOptions) -> Pod {
        match Self::try_run_exact(node, name, 0, opts) {
            Ok(p) => p,
            Err(o) => panic!("crictl runp of {name} on node {} failed: {o}", node.letter),
        }
    }

    /// `crictl runp` of the pod `name` (as made by [`Pod::run`]) once more,
    /// with sandbox attempt `attempt`: what kubelet does when a pod's sandbox
    /// died (the pod keeps its name, namespace and uid).
    #[track_caller]
    pub fn run_again(name: &str, attempt: u32, opts: PodOptions) -> Pod {
        match Self::try_run_exact(Node::a(), name, attempt, opts) {
            Ok(p) => p,
            Err(o) => panic!("crictl runp (attempt {attempt}) failed: {o}"),
        }
    }

    fn try_run_exact(node: &'static Node, name: &str, attempt: u32, opts: PodOptions) -> Result<Pod, Output> {
        node.require();
        let name = name.to_string();
        let dir = if attempt == 0 { TempDir::named(&name) } else { TempDir::named(&format!("{name}-attempt{attempt}")) };
        let log_dir = dir.path().join("logs");
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut cfg = pod_config_on(node, &name, &opts.annotations, &log_dir);
        cfg["metadata"]["attempt"] = json!(attempt);
        let namespace = opts.namespace.clone().unwrap_or_else(|| POD_NAMESPACE.to_string());
        cfg["metadata"]["namespace"] = json!(namespace);
        let config_path = write_json(dir.path(), "pod.json", &cfg);
        let runtime = opts.runtime.unwrap_or_else(|| runtime_handler().to_string());
        let out = node.crictl(&["runp", "--runtime", &runtime, &config_path]);
        if !out.success() {
            // runp may have left a NotReady sandbox behind on failure: clean it.
            node.remove_pods_named(&name);
            return Err(out);
        }
        let id = out.stdout.trim().to_string();
        Ok(Pod { id, name, node, config_path, log_dir, annotations: opts.annotations, namespace, dir, removed: false })
    }

    /// The id of the pod's actor: its `torpor.dev/actor` (within the pod's
    /// namespace: a bare name is `<namespace>/<name>`), else the default
    /// `<namespace>/<pod name>`.
    pub fn actor(&self) -> String {
        match self.annotations.get("torpor.dev/actor") {
            Some(a) if a.contains('/') => a.clone(),
            Some(a) => format!("{}/{a}", self.namespace),
            None => format!("{}/{}", self.namespace, self.name),
        }
    }

    /// The pod's temp dir (configs, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `crictl create` of a container; returns the container id or the output.
    pub fn try_create(&self, config: &Value) -> Result<String, Output> {
        let cname = config["metadata"]["name"].as_str().unwrap_or("ctr").to_string();
        let path = write_json(self.dir.path(), &format!("ctr-{cname}.json"), config);
        let out = self.node.crictl(&["create", &self.id, &path, &self.config_path]);
        if out.success() {
            Ok(out.stdout.trim().to_string())
        } else {
            Err(out)
        }
    }

    /// `crictl create`; panics on failure.
    #[track_caller]
    pub fn create(&self, config: &Value) -> String {
        self.try_create(config).unwrap_or_else(|o| panic!("crictl create failed: {o}"))
    }

    /// create + start `/actor <args>` in a container named `name`; returns its id.
    #[track_caller]
    pub fn start_actor(&self, name: &str, args: &[&str]) -> String {
        self.start_config(&container_config(name, args))
    }

    /// create + start a container from a full config; returns its id.
    #[track_caller]
    pub fn start_config(&self, config: &Value) -> String {
        let id = self.create(config);
        self.node.crictl_ok(&["start", &id]);
        id
    }

    /// `crictl inspectp` as JSON.
    #[track_caller]
    pub fn inspect(&self) -> Value {
        self.node.crictl_json(&["inspectp", "-o", "json", &self.id])
    }

    /// SANDBOX_READY / SANDBOX_NOTREADY
    #[track_caller]
    pub fn state(&self) -> String {
        self.inspect()["status"]["state"].as_str().unwrap_or_default().to_string()
    }

    /// The pod's IPv4 address.
    #[track_caller]
    pub fn ip(&self) -> String {
        let v = self.inspect();
        let ip = v["status"]["network"]["ip"].as_str().unwrap_or_default().to_string();
        assert!(!ip.is_empty(), "pod {} has no IP: {}", self.id, v["status"]);
        ip
    }

    /// Path of the pod's network namespace (from the sandbox's OCI spec).
    #[track_caller]
    pub fn netns_path(&self) -> Option<String> {
        netns_path_of(&self.inspect())
    }

    /// Stop and remove now (checked); Drop then does nothing.
    #[track_caller]
    pub fn remove(mut self) {
        self.node.crictl_ok(&["stopp", &self.id]);
        self.node.crictl_ok(&["rmp", &self.id]);
        self.removed = true;
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        // Best effort, never panics (may run during unwinding).
        let _ = std::panic::catch_unwind(|| {
            let _ = self.node.crictl(&["stopp", &self.id]);
            let _ = self.node.crictl(&["rmp", "-f", &self.id]);
        });
    }
}

/// Removes every pod (any state) of node A whose metadata name is `name`.
pub fn remove_pods_named(name: &str) {
    Node::a().remove_pods_named(name)
}

/// The network namespace path in a `crictl inspectp` JSON.
pub fn netns_path_of(inspectp: &Value) -> Option<String> {
    let spec = &inspectp["info"]["runtimeSpec"];
    spec["linux"]["namespaces"].as_array()?.iter().find(|n| n["type"] == "network").and_then(|n| n["path"].as_str()).map(|s| s.to_string())
}

// ------------------------------------------------------------- containers

/// `crictl inspect` as JSON (node A).
#[track_caller]
pub fn inspect_container(id: &str) -> Value {
    Node::a().inspect_container(id)
}

/// The container's CRI state: CONTAINER_CREATED / RUNNING / EXITED / UNKNOWN.
#[track_caller]
pub fn container_state(id: &str) -> String {
    inspect_container(id)["status"]["state"].as_str().unwrap_or_default().to_string()
}

/// Waits until the container (of node A) is in `state`; returns the inspect JSON.
#[track_caller]
pub fn wait_container_state(id: &str, state: &str) -> Value {
    Node::a().wait_container_state(id, state)
}

/// Waits until the container has exited; returns (exitCode, reason).
#[track_caller]
pub fn wait_exited(id: &str) -> (i64, String) {
    let v = wait_container_state(id, "CONTAINER_EXITED");
    (v["status"]["exitCode"].as_i64().unwrap_or(-1), v["status"]["reason"].as_str().unwrap_or_default().to_string())
}
