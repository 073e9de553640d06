//! Helpers for the end-to-end tests through kubectl (`tests/k8s.rs`) against
//! the test cluster of `test/cluster/up.sh`: a control plane and one kubelet
//! per rig node (node-a on node A's containerd, node-b on node B's).
//!
//! Self-contained on purpose (its own command runner and waits): it reads
//! only the cluster's and the rig's environment (`test/cluster/env.sh`,
//! with the defaults of both scripts as fall-backs).
//!
//! Same rules as the rest of the crate: a missing cluster or tool fails the
//! test; limits are for liveness only; everything a test makes lives in a
//! namespace owned by a [`Namespace`] guard whose `Drop` deletes it (and the
//! actors' snapshots), also when the test panics.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Liveness limit of one state change (a pod Ready, a node Ready, ...).
pub const LIVENESS: Duration = Duration::from_secs(180);
/// Upper bound of one kubectl/crictl/torporctl call before it counts as hung.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(300);
pub const ACTOR_IMAGE: &str = "localhost/torpor-test/actor:latest";

fn env_or(key: &str, default: &str) -> String {
    match std::env::var(key) {
        Ok(v) if !v.is_empty() => v,
        _ => default.to_string(),
    }
}

/// Where the cluster is.
#[derive(Debug)]
pub struct Cluster {
    pub kubectl: String,
    pub kubeconfig: String,
    pub state: String,
    /// `test/cluster` (its scripts).
    pub dir: String,
    /// `test/rig`.
    pub rig_dir: String,
    pub nodes: [KubeNode; 2],
}

/// One rig node as a Kubernetes Node.
#[derive(Debug)]
pub struct KubeNode {
    /// `a` or `b`.
    pub letter: char,
    /// The Node's name (`node-a`).
    pub name: String,
    /// The rig node's containerd socket.
    pub containerd: String,
    /// Its cgroup parent, kubelet's cgroupRoot (`torpor-test`, no slashes).
    pub cgroup: String,
    /// Its pod subnet's prefix (`10.240.`).
    pub subnet_prefix: String,
    pub kubelet_log: String,
    /// torporctl's environment on this node (store socket, shim sockets, state).
    pub torpor_env: Vec<(String, String)>,
}

/// The cluster's settings (read once).
pub fn cluster() -> &'static Cluster {
    static C: OnceLock<Cluster> = OnceLock::new();
    C.get_or_init(|| {
        let manifest = env!("CARGO_MANIFEST_DIR");
        let a_state = env_or("TORPOR_RIG_A_STATE", "/run/torpor-test");
        let a_root = env_or("TORPOR_RIG_A_ROOT", "/var/lib/torpor-test");
        let b_state = env_or("TORPOR_RIG_B_STATE", &format!("{a_state}-b"));
        let b_root = env_or("TORPOR_RIG_B_ROOT", &format!("{a_root}-b"));
        let a_cg = env_or("TORPOR_RIG_A_CGROUP", "torpor-test");
        let b_cg = env_or("TORPOR_RIG_B_CGROUP", &format!("{a_cg}-b"));
        let a_subnet = env_or("TORPOR_RIG_A_SUBNET", "10.240.0.0/16");
        let b_subnet = env_or("TORPOR_RIG_B_SUBNET", "10.241.0.0/16");
        let state = env_or("TORPOR_CLUSTER_STATE", &format!("{a_state}/cluster"));
        let prefix = |s: &str| {
            let mut parts = s.split('.');
            format!("{}.{}.", parts.next().unwrap_or_default(), parts.next().unwrap_or_default())
        };
        let node = |letter: char, st: &str, root: &str, cg: &str, subnet: &str| {
            let mut torpor_env = vec![("TORPOR_STORE_SOCKET".to_string(), format!("{st}/torpor/store.sock"))];
            if letter == 'b' {
                torpor_env.push(("TORPOR_SHIM_SOCKET_DIR".into(), format!("{st}/torpor/shims")));
                torpor_env.push(("TORPOR_STATE_ROOT".into(), format!("{root}/torpor")));
            } else {
                torpor_env.push(("TORPOR_SHIM_SOCKET_DIR".into(), "/run/torpor/shims".into()));
                torpor_env.push(("TORPOR_STATE_ROOT".into(), "/var/lib/torpor".into()));
            }
            KubeNode {
                letter,
                name: format!("node-{letter}"),
                containerd: format!("{st}/containerd.sock"),
                cgroup: cg.trim_matches('/').to_string(),
                subnet_prefix: prefix(subnet),
                kubelet_log: format!("{state}/kubelet-{letter}.log"),
                torpor_env,
            }
        };
        Cluster {
            kubectl: env_or("TORPOR_KUBECTL", "/usr/local/bin/kubectl"),
            kubeconfig: env_or("TORPOR_KUBECONFIG", &format!("{state}/admin.kubeconfig")),
            dir: format!("{manifest}/cluster"),
            rig_dir: format!("{manifest}/rig"),
            nodes: [node('a', &a_state, &a_root, &a_cg, &a_subnet), node('b', &b_state, &b_root, &b_cg, &b_subnet)],
            state,
        }
    })
}

impl Cluster {
    /// The node called `name` (`node-a`, `node-b`).
    #[track_caller]
    pub fn node(&self, name: &str) -> &KubeNode {
        self.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no rig node is called {name:?}"))
    }

    /// The node that is not `name`.
    #[track_caller]
    pub fn other_node(&self, name: &str) -> &KubeNode {
        self.nodes.iter().find(|n| n.name != name).unwrap_or_else(|| panic!("no node besides {name:?}"))
    }
}

// ----------------------------------------------------------------- commands

/// What a command did.
#[derive(Debug, Clone)]
pub struct Out {
    pub what: String,
    /// Exit code; None if it was killed (signal or the limit).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout; panics with everything if the command failed.
    #[track_caller]
    pub fn ok(self) -> String {
        assert!(self.success(), "{self}");
        self.stdout
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` exited {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.what, self.code, self.stdout, self.stderr)
    }
}

/// Runs `program args` with `stdin`, the extra `env`, killed after `limit`.
pub fn run_cmd(program: &str, args: &[&str], stdin: Option<&[u8]>, env: &[(String, String)], limit: Duration) -> Out {
    let what = format!("{program} {}", args.join(" "));
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Out { what, code: None, stdout: String::new(), stderr: format!("cannot start {program}: {e}") },
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let input = input.to_vec();
        thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let out_t = thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_end(&mut s);
        }
        s
    });
    let err_t = thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_end(&mut s);
        }
        s
    });
    let deadline = Instant::now() + limit;
    let code = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code(),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let mut stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    if code.is_none() && Instant::now() >= deadline {
        stderr.push_str(&format!("\n(killed: still running after {limit:?})"));
    }
    Out { what, code, stdout, stderr }
}

/// `kubectl <args>` against the cluster (not checked).
pub fn kubectl(args: &[&str]) -> Out {
    kubectl_stdin(args, None)
}

/// `kubectl <args>` with stdin (not checked).
pub fn kubectl_stdin(args: &[&str], stdin: Option<&[u8]>) -> Out {
    let c = cluster();
    let mut all = vec!["--kubeconfig", c.kubeconfig.as_str()];
    all.extend_from_slice(args);
    let env = vec![("KUBECACHEDIR".to_string(), format!("{}/kubectl-cache", c.state))];
    run_cmd(&c.kubectl, &all, stdin, &env, COMMAND_LIMIT)
}

/// `kubectl <args>`, which must succeed; its stdout.
#[track_caller]
pub fn kubectl_ok(args: &[&str]) -> String {
    kubectl(args).ok()
}

/// `kubectl <args> -o json`, checked and parsed.
#[track_caller]
pub fn kubectl_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    let out = kubectl(&all);
    let text = out.clone().ok();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `kubectl apply -f -` of `yaml`, which must succeed.
#[track_caller]
pub fn apply(yaml: &str) {
    kubectl_stdin(&["apply", "-f", "-"], Some(yaml.as_bytes())).ok();
}

/// Fails the test unless the cluster answers and both nodes are Ready.
#[track_caller]
pub fn require_cluster() {
    let c = cluster();
    assert!(Path::new(&c.kubectl).is_file(), "{} missing: scripts/deps.sh kubernetes builds it", c.kubectl);
    assert!(
        Path::new(&c.kubeconfig).is_file(),
        "no cluster: {} missing (test/cluster/up.sh; test/rig/run-tests.sh starts it for the k8s tests)",
        c.kubeconfig
    );
    for n in &c.nodes {
        wait_until(&format!("Node {} Ready", n.name), LIVENESS, || node_ready(&n.name).then_some(()));
    }
}

/// Whether Node `name` reports Ready=True.
pub fn node_ready(name: &str) -> bool {
    let out = kubectl(&["get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]);
    out.success() && out.stdout.trim() == "True"
}

/// Polls `f` until it returns Some, failing the test after `limit`
/// (liveness only).
#[track_caller]
pub fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for: {what}");
        thread::sleep(Duration::from_millis(300));
    }
}

/// A name unique in this test run: `<prefix>-<pid>-<n><time>` (lowercase, DNS-1123).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() % 100_000).unwrap_or(0);
    format!("{prefix}-{}{n}{t}", std::process::id() % 1000)
}

// ------------------------------------------------------------------- nodes

impl KubeNode {
    /// `torporctl <args>` on this node (not checked).
    pub fn torporctl(&self, args: &[&str]) -> Out {
        let bin = torporctl_path();
        run_cmd(&bin, args, None, &self.torpor_env, COMMAND_LIMIT)
    }

    /// `torporctl --json <args>`, checked, parsed.
    #[track_caller]
    pub fn torporctl_json(&self, args: &[&str]) -> Value {
        let bin = torporctl_path();
        assert!(Path::new(&bin).is_file(), "torporctl not found at {bin} (cargo build --release -p torporctl)");
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.torporctl(&all);
        let text = out.clone().ok();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("torporctl on {}: not JSON ({e}): {out}", self.name))
    }

    /// The state of `actor` (`torporctl --json status ACTOR`: RUNNING, SUSPENDED, ...).
    #[track_caller]
    pub fn actor_state(&self, actor: &str) -> String {
        let v = self.torporctl_json(&["status", actor]);
        let arr = v.as_array().unwrap_or_else(|| panic!("torporctl status {actor}: not an array: {v}"));
        assert_eq!(arr.len(), 1, "exactly one actor {actor} on {}: {v}", self.name);
        arr[0]["actor"]["state"].as_str().unwrap_or_default().to_string()
    }

    /// `torporctl suspend ACTOR`, which must succeed; then the actor is SUSPENDED.
    #[track_caller]
    pub fn suspend(&self, actor: &str) {
        let out = self.torporctl(&["suspend", actor]);
        assert!(out.success(), "suspend of {actor} on {}: {out}", self.name);
        assert_eq!(self.actor_state(actor), "SUSPENDED", "{actor} after torporctl suspend");
    }

    /// `torporctl resume ACTOR`, which must succeed.
    #[track_caller]
    pub fn resume(&self, actor: &str) {
        let out = self.torporctl(&["resume", actor]);
        assert!(out.success(), "resume of {actor} on {}: {out}", self.name);
        assert_eq!(self.actor_state(actor), "RUNNING", "{actor} after torporctl resume");
    }

    /// crictl against this node's containerd (not checked).
    pub fn crictl(&self, args: &[&str]) -> Out {
        let ep = format!("unix://{}", self.containerd);
        let mut all = vec!["--runtime-endpoint", ep.as_str(), "--image-endpoint", ep.as_str(), "--timeout", "120s"];
        all.extend_from_slice(args);
        let env = vec![("CRI_CONFIG_FILE".to_string(), format!("{}/crictl.yaml", cluster().rig_dir))];
        run_cmd(&crictl_path(), &all, None, &env, COMMAND_LIMIT)
    }

    /// How many bytes kubelet's log has now (a mark for [`KubeNode::kubelet_log_since`]).
    pub fn kubelet_log_len(&self) -> u64 {
        std::fs::metadata(&self.kubelet_log).map(|m| m.len()).unwrap_or(0)
    }

    /// kubelet's log from byte `mark` on.
    #[track_caller]
    pub fn kubelet_log_since(&self, mark: u64) -> String {
        let all = std::fs::read(&self.kubelet_log).unwrap_or_else(|e| panic!("cannot read {}: {e}", self.kubelet_log));
        let from = (mark as usize).min(all.len());
        String::from_utf8_lossy(&all[from..]).into_owned()
    }

    /// Restarts this node's kubelet (SIGTERM, then `test/cluster/up.sh
    /// kubelet-X`) and waits for the Node to be Ready again.
    #[track_caller]
    pub fn restart_kubelet(&self) {
        let c = cluster();
        let pidfile = format!("{}/kubelet-{}.pid", c.state, self.letter);
        let pid = std::fs::read_to_string(&pidfile).unwrap_or_else(|e| panic!("{pidfile}: {e}"));
        let pid = pid.trim().to_string();
        run_cmd("kill", &["-TERM", &pid], None, &[], COMMAND_LIMIT).ok();
        wait_until(&format!("kubelet {pid} of {} exits", self.name), LIVENESS, || {
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        });
        let up = format!("{}/up.sh", c.dir);
        let comp = format!("kubelet-{}", self.letter);
        run_cmd(&up, &[&comp], None, &[], COMMAND_LIMIT).ok();
        wait_until(&format!("{} Ready after the kubelet restart", self.name), LIVENESS, || node_ready(&self.name).then_some(()));
    }

    /// Restarts this node's containerd (SIGTERM, then the rig's up.sh of
    /// this node alone, which starts it again; its shims keep running).
    #[track_caller]
    pub fn restart_containerd(&self) {
        let c = cluster();
        let st = self.containerd.trim_end_matches("/containerd.sock");
        let pidfile = format!("{st}/containerd.pid");
        let pid = std::fs::read_to_string(&pidfile).unwrap_or_else(|e| panic!("{pidfile}: {e}"));
        let pid = pid.trim().to_string();
        run_cmd("kill", &["-TERM", &pid], None, &[], COMMAND_LIMIT).ok();
        wait_until(&format!("containerd {pid} of {} exits", self.name), LIVENESS, || {
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        });
        let up = format!("{}/up.sh", c.rig_dir);
        let env = vec![("TORPOR_RIG_NODE".to_string(), self.letter.to_string()), ("TORPOR_RIG_NODE_B".to_string(), "0".to_string())];
        run_cmd(&up, &[], None, &env, COMMAND_LIMIT).ok();
    }

    /// A cgroup v1 file of a pod: `<hierarchy>/<cgroupRoot>/kubepods/<qos>/pod<uid>/<rest>`.
    pub fn pod_cgroup(&self, hierarchy: &str, pod: &Value) -> String {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let qos = pod["status"]["qosClass"].as_str().unwrap_or_default();
        let qos_dir = match qos {
            "Guaranteed" => String::new(),
            "Burstable" => "burstable/".to_string(),
            _ => "besteffort/".to_string(),
        };
        format!("/sys/fs/cgroup/{hierarchy}/{}/kubepods/{qos_dir}pod{uid}", self.cgroup)
    }
}

/// The torporctl binary: `$TORPOR_CTL` or the build tree's.
pub fn torporctl_path() -> String {
    env_or("TORPOR_CTL", concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/torporctl"))
}

fn crictl_path() -> String {
    env_or("TORPOR_CRICTL", "/usr/local/bin/crictl")
}

/// Reads a cgroup file as a number.
#[track_caller]
pub fn cgroup_u64(path: &str) -> u64 {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    s.trim().parse().unwrap_or_else(|e| panic!("{path}: {s:?} is not a number: {e}"))
}

// --------------------------------------------------------------- namespaces

/// A namespace for one test; deleted (with everything in it, and the
/// snapshots of its actors on both nodes) on drop.
pub struct Namespace {
    pub name: String,
}

impl Namespace {
    #[track_caller]
    pub fn new(prefix: &str) -> Namespace {
        require_cluster();
        let name = unique(prefix);
        kubectl_ok(&["create", "namespace", &name]);
        let ns = Namespace { name };
        // Pods need the namespace's default ServiceAccount (the controller
        // manager's service account controller makes it).
        wait_until(&format!("ServiceAccount default in {}", ns.name), LIVENESS, || {
            kubectl(&["-n", &ns.name, "get", "serviceaccount", "default"]).success().then_some(())
        });
        ns
    }

    /// `kubectl -n NS <args>` (not checked).
    pub fn kubectl(&self, args: &[&str]) -> Out {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        kubectl(&all)
    }

    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl(args).ok()
    }

    #[track_caller]
    pub fn apply(&self, yaml: &str) {
        let out = kubectl_stdin(&["-n", &self.name, "apply", "-f", "-"], Some(yaml.as_bytes()));
        assert!(out.success(), "apply in {}:\n{yaml}\n{out}", self.name);
    }

    /// The pod as JSON.
    #[track_caller]
    pub fn pod(&self, name: &str) -> Value {
        kubectl_json(&["-n", &self.name, "get", "pod", name])
    }

    /// Waits for pod `name` to be Ready (and to exist); returns it.
    #[track_caller]
    pub fn wait_ready(&self, name: &str) -> Value {
        let start = Instant::now();
        loop {
            let out = self.kubectl(&["get", "pod", name, "-o", "json"]);
            if out.success() {
                if let Ok(p) = serde_json::from_str::<Value>(&out.stdout) {
                    if pod_is_ready(&p) {
                        return p;
                    }
                }
            }
            if start.elapsed() > LIVENESS {
                panic!("pod {}/{name} not Ready within {LIVENESS:?}\n{}", self.name, self.describe(name));
            }
            thread::sleep(Duration::from_millis(300));
        }
    }

    /// `kubectl describe pod` and the namespace's events, for failure messages.
    pub fn describe(&self, name: &str) -> String {
        let d = self.kubectl(&["describe", "pod", name]);
        let e = self.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
        format!("--- describe ---\n{}{}\n--- events ---\n{}", d.stdout, d.stderr, e.stdout)
    }

    /// The namespace's events as JSON items.
    #[track_caller]
    pub fn events(&self) -> Vec<Value> {
        kubectl_json(&["-n", &self.name, "get", "events"])["items"].as_array().cloned().unwrap_or_default()
    }

    /// The default actor id of pod `pod`: `<namespace>/<pod>`.
    pub fn actor(&self, pod: &str) -> String {
        format!("{}/{pod}", self.name)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "namespace", &self.name, "--wait=true", "--timeout=240s"]);
        // Suspended actors' snapshots (on-stop: suspend, pods removed while
        // suspended) stay in the stores by design: drop this test's.
        for n in &cluster().nodes {
            let out = n.torporctl(&["--json", "snapshots", "ls"]);
            let Ok(v) = serde_json::from_str::<Value>(&out.stdout) else { continue };
            let prefix = format!("{}/", self.name);
            for s in v.as_array().into_iter().flatten() {
                // "snapshot" is "<actor>@<generation>"
                if let Some(snap) = s["snapshot"].as_str().filter(|s| s.starts_with(&prefix)) {
                    let _ = n.torporctl(&["snapshots", "rm", snap]);
                }
            }
        }
    }
}

/// Whether a pod object has condition Ready=True.
pub fn pod_is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The Ready condition's lastTransitionTime.
pub fn ready_since(p: &Value) -> String {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Sum of restartCount over a pod's containers.
pub fn restarts(p: &Value) -> u64 {
    p["status"]["containerStatuses"].as_array().into_iter().flatten().map(|c| c["restartCount"].as_u64().unwrap_or(0)).sum()
}

/// Cordons node `name` until dropped (then uncordons it).
pub struct Cordon(pub String);

impl Cordon {
    #[track_caller]
    pub fn new(name: &str) -> Cordon {
        kubectl_ok(&["cordon", name]);
        Cordon(name.to_string())
    }
}

impl Drop for Cordon {
    fn drop(&mut self) {
        let _ = kubectl(&["uncordon", &self.0]);
    }
}

// ----------------------------------------------------------------- network

/// One line-protocol command to the actor's counter at `addr` on a fresh
/// connection (connect retried until LIVENESS); the reply, trimmed.
#[track_caller]
pub fn counter(addr: &str, cmd: &str) -> String {
    let start = Instant::now();
    loop {
        match try_counter(addr, cmd) {
            Ok(r) => return r,
            Err(e) if start.elapsed() < LIVENESS => {
                let _ = e;
                thread::sleep(Duration::from_millis(300));
            }
            Err(e) => panic!("counter {cmd:?} at {addr}: {e}"),
        }
    }
}

fn try_counter(addr: &str, cmd: &str) -> std::io::Result<String> {
    let sa: std::net::SocketAddr =
        addr.parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(10))?;
    s.set_read_timeout(Some(COMMAND_LIMIT))?;
    s.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed without a reply"));
    }
    Ok(line.trim().to_string())
}

/// A `kubectl port-forward` child, killed on drop.
pub struct PortForward {
    child: Child,
    pub local_port: u16,
}

impl PortForward {
    /// `kubectl -n NS port-forward pod/POD :REMOTE`; waits for its local port.
    #[track_caller]
    pub fn start(ns: &str, pod: &str, remote: u16) -> PortForward {
        let c = cluster();
        let target = format!("pod/{pod}");
        let ports = format!(":{remote}");
        let mut child = Command::new(&c.kubectl)
            .args(["--kubeconfig", &c.kubeconfig, "-n", ns, "port-forward", &target, &ports, "--address", "127.0.0.1"])
            .env("KUBECACHEDIR", format!("{}/kubectl-cache", c.state))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start kubectl port-forward: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("port-forward has no stdout"));
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // "Forwarding from 127.0.0.1:43121 -> 8080"
                if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                    if let Some(port) = rest.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()) {
                        let _ = tx.send(port);
                    }
                }
            }
        });
        let mut pf = PortForward { child, local_port: 0 };
        match rx.recv_timeout(LIVENESS) {
            Ok(port) => pf.local_port = port,
            Err(_) => panic!("kubectl port-forward to {ns}/{pod} printed no local port"),
        }
        pf
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------- torpor installed by kubectl
// tests/k8s_native.rs: the cluster's containerds start plain
// (TORPOR_RIG_PLAIN=1) and torpor is installed with `kubectl apply -k`
// of deploy/kubernetes, through an overlay that gives the rig's per-node
// paths (two nodes on one machine).

/// The node image's name without its tag.
pub const NODE_IMAGE: &str = "localhost/torpor/node";

/// The repository's root.
pub fn repo_root() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/..").to_string()
}

/// The shims' control socket dir deploy/kubernetes mounts into the agent's container.
pub const DEFAULT_SHIM_SOCKET_DIR: &str = "/run/torpor/shims";

/// Each node's shim socket dir (TORPOR_SHIM_SOCKET_DIR), without repeats.
pub fn shim_socket_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    for n in &cluster().nodes {
        let d = n.shim_socket_dir();
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

impl KubeNode {
    /// Its shims' control socket dir (TORPOR_SHIM_SOCKET_DIR).
    pub fn shim_socket_dir(&self) -> String {
        self.torpor_env
            .iter()
            .find(|(k, _)| k == "TORPOR_SHIM_SOCKET_DIR")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| DEFAULT_SHIM_SOCKET_DIR.into())
    }

    /// The rig node's state dir (`/run/torpor-test`, `/run/torpor-test-b`).
    pub fn state_dir(&self) -> String {
        self.containerd.trim_end_matches("/containerd.sock").to_string()
    }

    /// A sample of the node's torpor-snapshotter metrics, e.g.
    /// `torpor_lifecycle_operations_total{op="fence_freeze",outcome="ok"}`;
    /// 0 when not exposed (a counter not moved yet).
    #[track_caller]
    pub fn metric(&self, sample: &str) -> f64 {
        let addr = crate::metrics::address_in(&format!("{}/snapshotter.toml", self.state_dir()));
        crate::metrics::value(&crate::metrics::scrape(&addr), sample)
    }

    /// The CRI runtime handlers the node's containerd has now (`crictl info`).
    #[track_caller]
    pub fn runtime_handlers(&self) -> Vec<String> {
        let out = self.crictl(&["info"]);
        let text = out.clone().ok();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("crictl info on {}: not JSON ({e}): {out}", self.name));
        // CRI's runtime handlers, and containerd's CRI config (its runtimes)
        let mut names: Vec<String> = v["runtimeHandlers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["name"].as_str().map(str::to_string))
            .filter(|n| !n.is_empty())
            .collect();
        if let Some(rts) = v["config"]["containerd"]["runtimes"].as_object() {
            names.extend(rts.keys().filter(|k| !names.contains(k)).cloned().collect::<Vec<_>>());
        }
        names
    }

    /// TORPOR_HOST_PID for this node: none (PID 1, the default) when PID 1's
    /// mount namespace can be entered from here; else (a sandbox whose init
    /// is out of reach, as this rig's can be) the pid of the rig containerd's
    /// supervisor, a process of the host's mount namespace that outlives
    /// containerd's restarts.
    pub fn host_pid_setting(&self) -> String {
        if std::fs::read_link("/proc/1/ns/mnt").is_ok() {
            return String::new();
        }
        let file = format!("{}/containerd-supervisor.pid", self.state_dir());
        let pid = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {file} (the rig's containerd supervisor, TORPOR_RIG_PLAIN=1): {e}"));
        let pid = pid.trim();
        assert!(!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()), "{file}: not a pid: {pid:?}");
        eprintln!("{}: PID 1's mount namespace cannot be entered here: TORPOR_HOST_PID={pid} (containerd's supervisor)", self.name);
        format!("TORPOR_HOST_PID={pid}\n")
    }

    /// The installer's settings for this node (deploy/kubernetes/node-env.yaml):
    /// the rig node's paths, its kubelet's config (the cgroup driver), and
    /// its metrics ports: the rig's nodes share the host's network, so the
    /// install's defaults (127.0.0.1:9464 and :9465) would collide.
    pub fn node_env(&self) -> String {
        let st = self.state_dir();
        let shims = self.shim_socket_dir();
        let metrics = crate::metrics::address_in(&format!("{st}/snapshotter.toml"));
        let agent_metrics = match metrics.rsplit_once(':').and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?))) {
            Some((host, port)) => format!("{host}:{}", port + 100),
            None => panic!("{st}/snapshotter.toml: metrics_address {metrics:?} is not host:port"),
        };
        format!(
            "{}TORPOR_PREFIX={st}/torpor-node\n\
             TORPOR_CONTAINERD_DROPIN={st}/conf.d/torpor.toml\n\
             TORPOR_CONTAINERD_SOCKET={st}/containerd.sock\n\
             TORPOR_SNAPSHOTTER_SOCKET={st}/torpor/snapshotter.sock\n\
             TORPOR_SNAPSHOTTER_CONFIG={st}/snapshotter.toml\n\
             TORPOR_STORE_SOCKET={st}/torpor/store.sock\n\
             TORPOR_SHIM_SOCKET_DIR={shims}\n\
             TORPOR_KUBELET_CONFIG={}/kubelet-{}.yaml\n\
             TORPOR_METRICS_ADDRESS={metrics}\n\
             TORPOR_AGENT_METRICS_ADDRESS={agent_metrics}\n\
             export AWS_ACCESS_KEY_ID={}\n\
             export AWS_SECRET_ACCESS_KEY={}\n",
            self.host_pid_setting(),
            cluster().state,
            self.letter,
            env_or("TORPOR_RIG_S3_ACCESS_KEY", "torpor-rig"),
            env_or("TORPOR_RIG_S3_SECRET_KEY", "torpor-rig-secret-key"),
        )
    }
}

/// Builds the node image `NODE_IMAGE:tag` (deploy/kubernetes/image/build.sh)
/// and imports it into both nodes' containerds.
#[track_caller]
pub fn build_node_image(tag: &str) {
    let c = cluster();
    let script = format!("{}/deploy/kubernetes/image/build.sh", repo_root());
    let out_tar = format!("{}/torpor-node-{tag}.tar", c.state);
    let mut args = vec!["--tag", tag, "--out", out_tar.as_str()];
    for n in &c.nodes {
        args.extend_from_slice(&["--import", n.containerd.as_str()]);
    }
    run_cmd(&script, &args, None, &[], COMMAND_LIMIT).ok();
}

/// Writes the rig's overlay of deploy/kubernetes (image tag, per-node
/// settings) into the cluster's state dir; its path, for `kubectl apply -k`.
pub fn write_overlay(tag: &str) -> String {
    let c = cluster();
    let dir = format!("{}/torpor-overlay", c.state);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
    let mut data = serde_json::Map::new();
    for n in &c.nodes {
        data.insert(format!("{}.env", n.name), Value::String(n.node_env()));
    }
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "torpor-node-env", "namespace": "torpor-system"},
        "data": data,
    });
    std::fs::write(format!("{dir}/node-env.json"), patch.to_string()).unwrap_or_else(|e| panic!("write the overlay: {e}"));
    // a rig node has no other torpor on its host: the resync is quick so that
    // the tests see other triggers' changes soon
    // and the API server is where the cluster's nodes reach it (no
    // kube-proxy here: the kubernetes Service's ClusterIP routes nowhere)
    let port = env_or("TORPOR_CLUSTER_APISERVER_PORT", "16443");
    // (containers 1 and 2: agent and lifecycle, whose preStop asks the API
    // server whether the DaemonSet is gone)
    let mut agent_patch = vec![serde_json::json!(
        {"op": "add", "path": "/spec/template/spec/containers/1/env/-", "value": {"name": "TORPOR_AGENT_RESYNC_S", "value": "2"}})];
    for c in [1, 2] {
        agent_patch.push(serde_json::json!(
            {"op": "add", "path": format!("/spec/template/spec/containers/{c}/env/-"), "value": {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}}));
        agent_patch.push(serde_json::json!(
            {"op": "add", "path": format!("/spec/template/spec/containers/{c}/env/-"), "value": {"name": "KUBERNETES_SERVICE_PORT", "value": port}}));
    }
    // the agent's container has the host's shim socket dir at its path
    // (deploy/kubernetes mounts the default one): a node whose dir
    // differs gets its own mount, as daemonset.yaml says (both pods get
    // every node's: one DaemonSet)
    for (i, shims) in shim_socket_dirs().into_iter().filter(|d| d != DEFAULT_SHIM_SOCKET_DIR).enumerate() {
        let name = format!("shims-{i}");
        agent_patch.push(serde_json::json!(
            {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": name, "hostPath": {"path": shims, "type": "DirectoryOrCreate"}}}));
        agent_patch.push(serde_json::json!(
            {"op": "add", "path": "/spec/template/spec/containers/1/volumeMounts/-", "value": {"name": name, "mountPath": shims, "readOnly": true}}));
    }
    let agent_patch = Value::Array(agent_patch);
    std::fs::write(format!("{dir}/agent-resync.json"), agent_patch.to_string()).unwrap_or_else(|e| panic!("write the overlay: {e}"));
    // kustomize takes a base by a relative path only
    let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|e| panic!("canonicalize {p}: {e}")).to_string_lossy().into_owned();
    let root = canon(&repo_root());
    let depth = Path::new(&canon(&dir)).components().count() - 1;
    let base = format!("{}{}/deploy/kubernetes", "../".repeat(depth), root.trim_start_matches('/'));
    let k = format!(
        "# Generated by torpor-tests (tests/k8s_native.rs): deploy/kubernetes for the rig.\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\n\
         kind: Kustomization\n\
         resources:\n  - {base}\n\
         images:\n  - name: {NODE_IMAGE}\n    newTag: {tag}\n\
         patches:\n  - path: node-env.json\n\
         \x20 - path: agent-resync.json\n    target: {{kind: DaemonSet, name: torpor-node}}\n"
    );
    std::fs::write(format!("{dir}/kustomization.yaml"), k).unwrap_or_else(|e| panic!("write the overlay: {e}"));
    dir
}

/// The torpor-node pod on `node` (Running and Ready), as JSON.
pub fn node_pod(node: &str) -> Option<Value> {
    let v = kubectl_json(&[
        "-n",
        "torpor-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=torpor-node",
        "--field-selector",
        &format!("spec.nodeName={node}"),
    ]);
    v["items"].as_array()?.iter().find(|p| pod_is_ready(p) && p["metadata"]["deletionTimestamp"].is_null()).cloned()
}

/// The label of a node that opts in to torpor (the DaemonSet's nodeSelector).
pub const ENABLED_LABEL: &str = "torpor.dev/enabled";
/// The label torpor-node sets on a node where torpor works (the RuntimeClass's nodeSelector).
pub const READY_LABEL: &str = "torpor.dev/ready";

/// Labels the nodes `names` to run torpor ([`ENABLED_LABEL`]) and the
/// others not to.
#[track_caller]
pub fn opt_in(names: &[&str]) {
    for n in &cluster().nodes {
        if names.contains(&n.name.as_str()) {
            kubectl_ok(&["label", "node", &n.name, "--overwrite", &format!("{ENABLED_LABEL}=true")]);
        } else {
            kubectl_ok(&["label", "node", &n.name, &format!("{ENABLED_LABEL}-")]);
        }
    }
}

/// The value of label `key` on node `name` (None: not there).
#[track_caller]
pub fn node_label(name: &str, key: &str) -> Option<String> {
    kubectl_json(&["get", "node", name])["metadata"]["labels"][key].as_str().map(str::to_string)
}

/// `kubectl torpor ARGS` (the plugin of target/release, found in PATH as
/// kubectl finds plugins; the kubeconfig from KUBECONFIG).
pub fn kubectl_torpor(args: &[&str]) -> Out {
    let c = cluster();
    let mut all = vec!["torpor"];
    all.extend_from_slice(args);
    let path = format!("{}/target/release:{}", repo_root(), std::env::var("PATH").unwrap_or_default());
    let env = vec![
        ("PATH".to_string(), path),
        ("KUBECONFIG".to_string(), c.kubeconfig.clone()),
        ("KUBECACHEDIR".to_string(), format!("{}/kubectl-cache", c.state)),
    ];
    run_cmd(&c.kubectl, &all, None, &env, COMMAND_LIMIT)
}

/// Whether pods of RuntimeClass torpor exist (in any namespace).
pub fn torpor_pods_exist() -> bool {
    let v = kubectl_json(&["get", "pods", "-A"]);
    v["items"].as_array().into_iter().flatten().any(|p| p["spec"]["runtimeClassName"] == "torpor")
}

/// Uninstalls a kustomize install (`kubectl torpor uninstall`, then
/// `kubectl delete -k overlay`) once no torpor pod is left.
#[track_caller]
pub fn uninstall_kustomize(overlay: &str) {
    wait_until("no pod of RuntimeClass torpor left", LIVENESS, || (!torpor_pods_exist()).then_some(()));
    let out = kubectl_torpor(&["uninstall", "--timeout", "300"]);
    assert!(out.success(), "kubectl torpor uninstall: {out}");
    kubectl_ok(&["delete", "-k", overlay, "--wait=true", "--timeout=300s"]);
}

/// Waits until torpor-node runs the image `tag` and is Ready on both nodes,
/// both containerds have the torpor runtime handler and both nodes are
/// labelled ready.
#[track_caller]
pub fn wait_installed(tag: &str) {
    for n in &cluster().nodes {
        wait_installed_on(n, tag);
    }
}

/// [`wait_installed`] for one node.
#[track_caller]
pub fn wait_installed_on(n: &KubeNode, tag: &str) {
    let image = format!("{NODE_IMAGE}:{tag}");
    {
        let start = Instant::now();
        while node_pod(&n.name).filter(|p| p["spec"]["containers"][0]["image"] == image.as_str()).is_none() {
            if start.elapsed() > LIVENESS {
                let ns = ["-n", "torpor-system"];
                let pods = kubectl(&[&ns[..], &["get", "pods", "-o", "wide"]].concat());
                let desc = kubectl(&[&ns[..], &["describe", "pods"]].concat());
                let mut logs = String::new();
                for c in ["install", "snapshotter", "agent", "lifecycle"] {
                    let l = kubectl(
                        &[&ns[..], &["logs", "-l", "app.kubernetes.io/name=torpor-node", "-c", c, "--tail=40", "--prefix"]].concat(),
                    );
                    logs.push_str(&format!("--- {c} ---\n{}{}\n", l.stdout, l.stderr));
                }
                panic!("torpor-node {image} not Ready on {} within {LIVENESS:?}\n{pods}\n{}\n{logs}", n.name, desc.stdout);
            }
            thread::sleep(Duration::from_millis(500));
        }
        wait_until(&format!("runtime handler torpor on {}", n.name), LIVENESS, || {
            n.runtime_handlers().iter().any(|h| h == "torpor").then_some(())
        });
        wait_until(&format!("{} labelled {READY_LABEL}=true", n.name), LIVENESS, || {
            (node_label(&n.name, READY_LABEL).as_deref() == Some("true")).then_some(())
        });
    }
}
