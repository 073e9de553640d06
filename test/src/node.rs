//! The two nodes of the rig (`test/rig/env.sh`): node A, the one every
//! single-node test uses ([`crate::rig`], [`crate::crictl`], [`crate::Pod::run`]
//! ...), and node B beside it: its own containerd, torpor-snapshotter (own
//! local tier), CNI network (own bridge and pod subnet), cgroup parent and
//! shim state, sharing node A's S3 server as the object tier.
//!
//! A test drives either one through its [`Node`]: `Node::b().crictl(..)`,
//! `Pod::run_on(Node::b(), ..)`, `Node::b().torporctl(..)`. [`Node::kill`]
//! makes a node "die" (every process of it SIGKILLed at once) and brings
//! it back when its guard is dropped.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::command::{run_env, run_with, wait_for, Output};
use crate::rig::{env_or, Rig};
use crate::{ACTOR_IMAGE, COMMAND_LIMIT, LIVENESS, PAUSE_IMAGE};

/// One node of the rig.
#[derive(Debug, Clone)]
pub struct Node {
    /// `a` or `b` (`TORPOR_RIG_NODE` of its scripts).
    pub letter: &'static str,
    /// The id its daemons know it by (`TORPOR_NODE_ID`): `node-a`, `node-b`.
    pub id: String,
    /// Its containerd, CRI endpoint, state dir and cgroup parent.
    pub rig: Rig,
    /// Its persistent root (containerd root, snapshotter root with the local tier).
    pub root: String,
    /// Its pod subnet (`10.x.0.0/16`).
    pub subnet: String,
    /// Its snapshot store's API socket (`TORPOR_STORE_SOCKET` of its shims).
    pub store_socket: String,
    /// Its shims' control sockets (`TORPOR_SHIM_SOCKET_DIR`).
    pub shim_socket_dir: String,
    /// Its shims' actor records (`TORPOR_STATE_ROOT`).
    pub state_root: String,
}

/// Whether this process's `TORPOR_RIG_*` are node B's (an environment made by
/// `TORPOR_RIG_NODE=b . test/rig/env.sh`); node A's are then in `TORPOR_RIG_A_*`.
fn env_is_node_b() -> bool {
    std::env::var("TORPOR_RIG_ENV_NODE").is_ok_and(|v| v == "b")
}

/// Node A's `TORPOR_RIG_<key>`.
fn a_var(key: &str, default: &str) -> String {
    if env_is_node_b() {
        env_or(&format!("TORPOR_RIG_A_{key}"), default)
    } else {
        env_or(&format!("TORPOR_RIG_{key}"), default)
    }
}

/// The /16 after `subnet` (`10.240.0.0/16` -> `10.241.0.0/16`), as env.sh derives it.
fn next_subnet(subnet: &str) -> String {
    let mut parts = subnet.split('.');
    let first = parts.next().unwrap_or("10");
    let second: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(240);
    format!("{first}.{}.0.0/16", second + 1)
}

impl Node {
    /// Node A (the rig of the single-node tests).
    pub fn a() -> &'static Node {
        static A: OnceLock<Node> = OnceLock::new();
        A.get_or_init(|| {
            let state = a_var("STATE", "/run/torpor-test");
            let own = !env_is_node_b();
            let pick = |key: &str, default: String| if own { env_or(key, &default) } else { default };
            // Only the rig's own variables are read: an inherited CONTAINERD_ADDRESS
            // or CONTAINER_RUNTIME_ENDPOINT may point at the host's containerd.
            let address = pick("TORPOR_RIG_ADDRESS", format!("{state}/containerd.sock"));
            Node {
                letter: "a",
                id: "node-a".into(),
                root: a_var("ROOT", "/var/lib/torpor-test"),
                subnet: a_var("SUBNET", "10.240.0.0/16"),
                store_socket: pick("TORPOR_STORE_SOCKET", format!("{state}/torpor/store.sock")),
                shim_socket_dir: pick("TORPOR_SHIM_SOCKET_DIR", "/run/torpor/shims".into()),
                state_root: pick("TORPOR_STATE_ROOT", "/var/lib/torpor".into()),
                rig: Rig::for_node(state, address, a_var("CGROUP", "torpor-test")),
            }
        })
    }

    /// Node B (names derived from node A's unless `TORPOR_RIG_B_*` say otherwise).
    pub fn b() -> &'static Node {
        static B: OnceLock<Node> = OnceLock::new();
        B.get_or_init(|| {
            let a = Node::a();
            let state = env_or("TORPOR_RIG_B_STATE", &format!("{}-b", a.rig.state_dir));
            let root = env_or("TORPOR_RIG_B_ROOT", &format!("{}-b", a.root));
            Node {
                letter: "b",
                id: "node-b".into(),
                subnet: env_or("TORPOR_RIG_B_SUBNET", &next_subnet(&a.subnet)),
                store_socket: format!("{state}/torpor/store.sock"),
                shim_socket_dir: format!("{state}/torpor/shims"),
                state_root: format!("{root}/torpor"),
                rig: Rig::for_node(
                    state.clone(),
                    format!("{state}/containerd.sock"),
                    env_or("TORPOR_RIG_B_CGROUP", &format!("{}-b", a.rig.cgroup)),
                ),
                root,
            }
        })
    }

    /// Both nodes.
    pub fn both() -> [&'static Node; 2] {
        [Node::a(), Node::b()]
    }

    /// Fails the test unless the node's CRI answers and has the test images.
    #[track_caller]
    pub fn require(&self) {
        static CHECKED: [OnceLock<Result<(), String>>; 2] = [OnceLock::new(), OnceLock::new()];
        let slot = if self.letter == "a" { &CHECKED[0] } else { &CHECKED[1] };
        if let Err(e) = slot.get_or_init(|| check_node(self)) {
            panic!("test rig not usable: {e}");
        }
    }

    /// Whether `ip` (an IPv4 address) is in the node's pod subnet.
    pub fn owns_ip(&self, ip: &str) -> bool {
        let prefix = self.subnet.rsplitn(3, '.').nth(2).map(|p| format!("{p}.")).unwrap_or_default();
        !prefix.is_empty() && ip.starts_with(&prefix)
    }

    fn crictl_args(&self, args: &[&str]) -> Vec<String> {
        let r = &self.rig;
        let mut all: Vec<String> = vec![
            "--runtime-endpoint".into(),
            r.cri_endpoint.clone(),
            "--image-endpoint".into(),
            r.cri_endpoint.clone(),
            "--timeout".into(),
            r.crictl_timeout.clone(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        all
    }

    /// `crictl <args>` against the node's CRI.
    #[track_caller]
    pub fn crictl(&self, args: &[&str]) -> Output {
        run_with(&self.rig.crictl, self.crictl_args(args), None, COMMAND_LIMIT)
    }

    /// `crictl <args>` with `input` on stdin.
    #[track_caller]
    pub fn crictl_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        run_with(&self.rig.crictl, self.crictl_args(args), Some(input), COMMAND_LIMIT)
    }

    /// `crictl <args>`, panicking on failure; returns trimmed stdout.
    #[track_caller]
    pub fn crictl_ok(&self, args: &[&str]) -> String {
        self.crictl(args).ok().trim().to_string()
    }

    /// `crictl <args>` whose stdout is JSON.
    #[track_caller]
    pub fn crictl_json(&self, args: &[&str]) -> Value {
        let out = self.crictl(args);
        let text = out.clone().ok();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON from {}: {e}\n{text}", out.cmdline))
    }

    /// `ctr --address <node> -n <namespace> <args>`.
    #[track_caller]
    pub fn ctr(&self, namespace: &str, args: &[&str]) -> Output {
        self.ctr_with(namespace, args, None, COMMAND_LIMIT)
    }

    /// `ctr` with stdin and a custom limit.
    #[track_caller]
    pub fn ctr_with(&self, namespace: &str, args: &[&str], stdin: Option<&[u8]>, limit: Duration) -> Output {
        let mut all: Vec<String> = vec!["--address".into(), self.rig.address.clone(), "-n".into(), namespace.into()];
        all.extend(args.iter().map(|s| s.to_string()));
        run_with(&self.rig.ctr, all, stdin, limit)
    }

    /// The environment torporctl (and the node's shims) see.
    pub fn torpor_env(&self) -> Vec<(String, String)> {
        vec![
            ("TORPOR_STORE_SOCKET".into(), self.store_socket.clone()),
            ("TORPOR_SHIM_SOCKET_DIR".into(), self.shim_socket_dir.clone()),
            ("TORPOR_STATE_ROOT".into(), self.state_root.clone()),
        ]
    }

    /// `test/rig/<script> <args>` for this node (`TORPOR_RIG_NODE`; up.sh of
    /// node A alone, `TORPOR_RIG_NODE_B=0`).
    #[track_caller]
    pub fn rig_script(&self, script: &str, args: &[&str]) -> Output {
        let path = format!("{}/rig/{script}", env!("CARGO_MANIFEST_DIR"));
        let env = vec![("TORPOR_RIG_NODE".to_string(), self.letter.to_string()), ("TORPOR_RIG_NODE_B".to_string(), "0".to_string())];
        run_env(&path, args, None, COMMAND_LIMIT, &env)
    }

    /// `crictl inspect` as JSON.
    #[track_caller]
    pub fn inspect_container(&self, id: &str) -> Value {
        self.crictl_json(&["inspect", "-o", "json", id])
    }

    /// The container's CRI state.
    #[track_caller]
    pub fn container_state(&self, id: &str) -> String {
        self.inspect_container(id)["status"]["state"].as_str().unwrap_or_default().to_string()
    }

    /// Waits until the container is in `state`; returns the inspect JSON.
    #[track_caller]
    pub fn wait_container_state(&self, id: &str, state: &str) -> Value {
        wait_container_state_on(self, id, state)
    }

    /// The last `n` lines of the node's containerd log that mention one of
    /// `ids`, under a header (for failure messages).
    pub fn log_about(&self, ids: &[&str], n: usize) -> String {
        let log = format!("{}/containerd.log", self.rig.state_dir);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| ids.iter().any(|i| l.contains(i))).collect();
        let tail = &lines[lines.len().saturating_sub(n)..];
        let mut s = format!("--- {log} (last {} lines about {}) ---\n", tail.len(), ids.join(" "));
        for l in tail {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    /// Removes every pod (any state) whose metadata name is `name`.
    pub fn remove_pods_named(&self, name: &str) {
        let _ = std::panic::catch_unwind(|| {
            let out = self.crictl(&["pods", "--name", name, "-q"]);
            for id in out.stdout.split_whitespace() {
                let _ = self.crictl(&["stopp", id]);
                let _ = self.crictl(&["rmp", "-f", id]);
            }
        });
    }

    /// The pids of the node's containerd and torpor-snapshotter (from their pid files).
    fn daemon_pids(&self) -> Vec<i32> {
        ["containerd.pid", "snapshotter.pid"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(format!("{}/{f}", self.rig.state_dir)).ok())
            .filter_map(|t| t.trim().parse().ok())
            .filter(|p| Path::new(&format!("/proc/{p}")).exists())
            .collect()
    }

    /// Every process of the node: its containerd and torpor-snapshotter, its
    /// shims (started with its containerd address, or running in one of its
    /// bundles) and everything below them (runc, CRIU, lazy-pages daemons,
    /// container processes), and whatever runs in its pods' cgroups.
    pub fn processes(&self) -> BTreeSet<i32> {
        let mut pids: BTreeSet<i32> = self.daemon_pids().into_iter().filter(|p| is_alive(*p)).collect();
        let me = std::process::id() as i32;
        let mut parent_of = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            if pid == me || !is_alive(pid) {
                continue;
            }
            if let Some(ppid) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok()))
            {
                parent_of.push((pid, ppid));
            }
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let name = exe.rsplit('/').next().unwrap_or_default();
            if name.starts_with("containerd-shim-") {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                    .unwrap_or_default();
                let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
                if cmdline.contains(&format!(" {} ", self.rig.address))
                    || cmdline.ends_with(&format!(" {}", self.rig.address))
                    || cwd.starts_with(&format!("{}/", self.rig.state_dir))
                {
                    pids.insert(pid);
                }
            }
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if cg.lines().any(|l| l.split(':').nth(2).is_some_and(|p| p.starts_with(&format!("/{}/", self.rig.cgroup)))) {
                pids.insert(pid);
            }
        }
        // descendants (of the shims: re-parented container processes, CRIU)
        loop {
            let before = pids.len();
            for (pid, ppid) in &parent_of {
                if pids.contains(ppid) {
                    pids.insert(*pid);
                }
            }
            if pids.len() == before {
                break;
            }
        }
        pids
    }

    /// The node "dies": every process of it ([`Node::processes`]) is
    /// stopped, then SIGKILLed, at once — containerd, torpor-snapshotter,
    /// the shims, runc/CRIU and the containers' processes. Its disks (the
    /// local tier, containerd's root) and its network stay, as a dead
    /// machine's would until it reboots. The node comes back up (its
    /// `up.sh`) when the returned guard is dropped or [`DeadNode::revive`]d;
    /// containerd then cleans up after the dead shims.
    #[track_caller]
    pub fn kill(&'static self) -> DeadNode {
        let pids = self.processes();
        assert!(!pids.is_empty(), "node {} has no process to kill: is it up?", self.letter);
        // Stopped first, so that none of them reacts to the others' deaths.
        for sig in [Signal::SIGSTOP, Signal::SIGKILL] {
            for p in &pids {
                let _ = kill(Pid::from_raw(*p), sig);
            }
        }
        wait_for(&format!("node {}'s processes to die", self.letter), LIVENESS, || {
            let left: Vec<i32> = pids.iter().copied().filter(|p| is_alive(*p)).collect();
            for p in &left {
                let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
            }
            left.is_empty().then_some(())
        });
        // Processes started meanwhile (a restore under way): once more.
        for p in self.processes() {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        DeadNode { node: self, revived: false }
    }
}

/// Whether `node`'s CRI answers, is ready and has the test images.
fn check_node(node: &Node) -> Result<(), String> {
    let r = &node.rig;
    let info = std::panic::catch_unwind(|| node.crictl(&["info"]));
    let info = match info {
        Ok(o) if o.success() => o,
        Ok(o) => {
            return Err(format!(
                "the CRI of node {} at {} does not answer (start the rig with test/rig/up.sh):\n{o}",
                node.letter, r.cri_endpoint
            ))
        }
        Err(_) => return Err(format!("cannot run crictl ({})", r.crictl)),
    };
    let v: Value = serde_json::from_str(&info.stdout).map_err(|e| format!("crictl info: {e}"))?;
    let conds = v["status"]["conditions"].as_array().cloned().unwrap_or_default();
    for want in ["RuntimeReady", "NetworkReady"] {
        let ok = conds.iter().any(|c| c["type"] == want && c["status"] == true);
        if !ok {
            return Err(format!("node {}: CRI condition {want} is not true: {}", node.letter, v["status"]));
        }
    }
    let images = node.crictl(&["images", "-o", "json"]);
    if !images.success() {
        return Err(format!("crictl images failed: {images}"));
    }
    for img in [ACTOR_IMAGE, PAUSE_IMAGE] {
        if !images.stdout.contains(img) {
            return Err(format!("image {img} is not in node {} (namespace k8s.io); run test/rig/up.sh", node.letter));
        }
    }
    Ok(())
}

// --------------------------------------------------------------- polling

fn wait_container_state_on(node: &Node, id: &str, state: &str) -> Value {
    let mut last = Value::Null;
    let what = format!("container {id} (node {}) to be {state}", node.letter);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&what, LIVENESS, || {
            let v = node.inspect_container(id);
            let ok = v["status"]["state"] == state;
            last = v.clone();
            ok.then_some(v)
        })
    }));
    match res {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}; last status: {}", last["status"]),
    }
}

impl Node {
    /// The node's torpor-snapshotter hangs (SIGSTOP), as a daemon cut off
    /// from the object tier would: it renews no lease and answers no shim.
    /// It goes on (SIGCONT) when the returned guard is dropped.
    #[track_caller]
    pub fn hang_snapshotter(&'static self) -> HungDaemon {
        let pid = std::fs::read_to_string(format!("{}/snapshotter.pid", self.rig.state_dir))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|p| is_alive(*p))
            .unwrap_or_else(|| panic!("node {} has no torpor-snapshotter running", self.letter));
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP torpor-snapshotter {pid}: {e}"));
        HungDaemon { pid }
    }
}

/// A daemon stopped by [`Node::hang_snapshotter`]: continued on drop.
#[derive(Debug)]
pub struct HungDaemon {
    pid: i32,
}

impl Drop for HungDaemon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGCONT);
    }
}

/// Whether `pid` is alive (a zombie is dead).
fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()).is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// A node killed by [`Node::kill`]: brought back up (its `up.sh`) on drop.
#[derive(Debug)]
pub struct DeadNode {
    pub node: &'static Node,
    revived: bool,
}

impl DeadNode {
    /// Brings the node back up now (checked).
    #[track_caller]
    pub fn revive(mut self) {
        self.revived = true;
        let out = self.node.rig_script("up.sh", &[]);
        assert!(out.success(), "node {} did not come back up: {out}", self.node.letter);
    }
}

impl Drop for DeadNode {
    fn drop(&mut self) {
        if self.revived {
            return;
        }
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let out = self.node.rig_script("up.sh", &[]);
            if !out.success() {
                eprintln!("node {} did not come back up: {out}", self.node.letter);
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        assert_eq!(next_subnet("10.245.0.0/16"), "10.246.0.0/16");
        let mut n = Node::a().clone();
        n.subnet = "10.246.0.0/16".into();
        assert!(n.owns_ip("10.246.0.7"));
        assert!(!n.owns_ip("10.245.0.7"));
    }
}
