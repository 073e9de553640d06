//! The counter actor most torpor tests run: `/actor counter --port 8080`
//! (test/images/actor: a TCP line protocol `inc`, `get`, `sum`, `note ...`,
//! optionally `--alloc-mib N` of patterned, checked memory) as the app
//! container of a pod, reached at its pod IP; and what a test asks of it
//! and of its actor record through torporctl.
//!
//! ```text
//! let c = CounterSpec::new().alloc_mib(64).start(Pod::run("prefix"));
//! assert_eq!(c.inc(), 1);
//! let snapshot = c.suspend();
//! ```

use std::path::Path;

use serde_json::{json, Value};

use crate::{container_config, counter_cmd, files_below, Node, Pod};

/// The port the counter listens on.
pub const COUNTER_PORT: u16 = 8080;

/// How a counter container is made: its arguments and CRI settings.
#[derive(Debug, Clone)]
pub struct CounterSpec {
    alloc_mib: Option<u32>,
    seed: Option<String>,
    extra: Vec<String>,
    attempt: u32,
    own_pid_namespace: bool,
    /// Host directories bind-mounted: (host path, container path).
    mounts: Vec<(String, String)>,
    /// CRI `linux.resources` (limits), if any.
    resources: Option<Value>,
    /// CRI `linux.security_context.run_as_user`, if any.
    run_as_user: Option<u32>,
}

impl Default for CounterSpec {
    fn default() -> Self {
        CounterSpec::new()
    }
}

impl CounterSpec {
    /// `counter --port 8080` in a container named `counter`, attempt 0, in
    /// its own pid namespace, as kubelet sends it (no shareProcessNamespace;
    /// in a pod-shared one the restored pids must be free in the new pod's
    /// namespace: see docs/ARCHITECTURE.md).
    pub fn new() -> CounterSpec {
        CounterSpec {
            alloc_mib: None,
            seed: None,
            extra: Vec::new(),
            attempt: 0,
            own_pid_namespace: true,
            mounts: Vec::new(),
            resources: None,
            run_as_user: None,
        }
    }

    /// `--alloc-mib N`: N MiB of patterned memory, checked by `sum`.
    pub fn alloc_mib(mut self, mib: u32) -> CounterSpec {
        self.alloc_mib = Some(mib);
        self
    }

    /// `--seed S`: the memory pattern's seed.
    pub fn seed(mut self, seed: &str) -> CounterSpec {
        self.seed = Some(seed.to_string());
        self
    }

    /// More arguments after the others.
    pub fn extra_args(mut self, args: &[&str]) -> CounterSpec {
        self.extra.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// The container's restart count (kubelet counts on in a pod run again:
    /// CRI reserves `<name>_<pod>_..._<attempt>`).
    pub fn attempt(mut self, attempt: u32) -> CounterSpec {
        self.attempt = attempt;
        self
    }

    /// The host directory `host` bind-mounted at `container`.
    pub fn mount(mut self, host: &str, container: &str) -> CounterSpec {
        self.mounts.push((host.to_string(), container.to_string()));
        self
    }

    /// CRI `linux.resources` (`memory_limit_in_bytes`, `cpu_shares`...).
    pub fn resources(mut self, resources: Value) -> CounterSpec {
        self.resources = Some(resources);
        self
    }

    /// CRI `linux.security_context.run_as_user`: the counter runs as `uid`
    /// (its primary gid is the image's for that uid, else 0).
    pub fn run_as_user(mut self, uid: u32) -> CounterSpec {
        self.run_as_user = Some(uid);
        self
    }

    /// No security context: CRI's default pid namespace (the pod's).
    pub fn in_the_pods_pid_namespace(mut self) -> CounterSpec {
        self.own_pid_namespace = false;
        self
    }

    /// The arguments of `/actor`.
    pub fn command_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["counter".into(), "--port".into(), COUNTER_PORT.to_string()];
        if let Some(mib) = self.alloc_mib {
            a.extend(["--alloc-mib".to_string(), mib.to_string()]);
        }
        if let Some(seed) = &self.seed {
            a.extend(["--seed".to_string(), seed.clone()]);
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    /// The CRI ContainerConfig.
    pub fn config(&self) -> Value {
        let args = self.command_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut config = container_config("counter", &args);
        config["metadata"]["attempt"] = self.attempt.into();
        if self.own_pid_namespace {
            config["linux"]["security_context"] = json!({"namespace_options": {"pid": 1}});
        }
        if let Some(uid) = self.run_as_user {
            config["linux"]["security_context"]["run_as_user"] = json!({"value": uid});
        }
        if let Some(r) = &self.resources {
            config["linux"]["resources"] = r.clone();
        }
        if !self.mounts.is_empty() {
            config["mounts"] = self.mounts.iter().map(|(h, c)| json!({"host_path": h, "container_path": c})).collect();
        }
        config
    }

    /// Creates and starts the counter in `pod` (on the pod's node), waits
    /// until it runs. A failed start (e.g. a restore) fails the test with
    /// the tail of CRIU's restore log.
    #[track_caller]
    pub fn start(&self, pod: Pod) -> Counter {
        let node = pod.node;
        let container = pod.create(&self.config());
        let out = node.crictl(&["start", &container]);
        if !out.success() {
            let log = format!("{}/io.containerd.runtime.v2.task/k8s.io/{container}/criu-restore.log", node.rig.containerd_state);
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            panic!(
                "crictl start {container} on node {} failed: {out}\n--- {log} (tail) ---\n{}",
                node.letter,
                lines[lines.len().saturating_sub(80)..].join("\n")
            );
        }
        node.wait_container_state(&container, "CONTAINER_RUNNING");
        Counter::attach(pod, container)
    }
}

/// A counter container in a pod; the pod (and with it the container) is
/// removed when it is dropped.
#[derive(Debug)]
pub struct Counter {
    pub pod: Pod,
    pub container: String,
    /// The pod's IP.
    pub ip: String,
    /// The actor id (`torpor.dev/actor`, else `<namespace>/<pod name>`).
    pub actor: String,
}

impl Counter {
    /// The counter running as `container` in `pod` (made by the test).
    #[track_caller]
    pub fn attach(pod: Pod, container: String) -> Counter {
        let ip = pod.ip();
        let actor = pod.actor();
        Counter { pod, container, ip, actor }
    }

    /// The node it runs on.
    pub fn node(&self) -> &'static Node {
        self.pod.node
    }

    /// The shim id (the pod sandbox id): the name torporctl knows it by.
    pub fn shim(&self) -> &str {
        &self.pod.id
    }

    /// `<pod IP>:8080`.
    pub fn addr(&self) -> String {
        format!("{}:{COUNTER_PORT}", self.ip)
    }

    /// One command of the line protocol on a fresh connection; the reply, trimmed.
    #[track_caller]
    pub fn cmd(&self, cmd: &str) -> String {
        counter_cmd(&self.addr(), cmd)
    }

    /// `inc`: the new value.
    #[track_caller]
    pub fn inc(&self) -> u64 {
        let r = self.cmd("inc");
        r.parse().unwrap_or_else(|e| panic!("inc answered {r:?}: {e}"))
    }

    /// `inc` `n` times, from `from`: the values must follow.
    #[track_caller]
    pub fn inc_from(&self, from: u64, n: u64) {
        for i in 1..=n {
            assert_eq!(self.cmd("inc"), (from + i).to_string(), "counter at {} (node {})", self.ip, self.node().letter);
        }
    }

    /// Counts from 0 to `n`; returns the memory checksum.
    #[track_caller]
    pub fn count_to(&self, n: u64) -> String {
        self.inc_from(0, n);
        self.cmd("sum")
    }

    /// The actor record (`torporctl --json status <shim>` on its node).
    #[track_caller]
    pub fn status(&self) -> Value {
        self.node().actor_status(self.shim(), self.shim())
    }

    /// The actor's state (RUNNING, SUSPENDED, FROZEN, ...).
    #[track_caller]
    pub fn state(&self) -> String {
        self.status()["state"].as_str().unwrap_or_default().to_string()
    }

    /// `torporctl --json <op> <shim>`, which must succeed; returns the record
    /// it printed (checked to be this shim's).
    #[track_caller]
    pub fn op(&self, op: &str) -> Value {
        let out = self.node().torporctl(&["--json", op, self.shim()]);
        if !out.success() {
            panic!("torporctl {op} {} on node {} failed: {out}\n{}", self.shim(), self.node().letter, self.diagnostics(&[]));
        }
        let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("torporctl --json {op} is not JSON ({e}):\n{out}"));
        assert_eq!(v[0]["shim"].as_str(), Some(self.shim()), "{out}");
        v[0]["actor"].clone()
    }

    /// `torporctl suspend`, then waits for the commit: the snapshot's name
    /// (`<actor>@<generation>`).
    #[track_caller]
    pub fn suspend(&self) -> String {
        self.op("suspend");
        let st = crate::wait_for("the suspend's snapshot to be committed", crate::LIVENESS, || {
            let st = self.status();
            st["snapshot"].is_object().then_some(st)
        });
        assert_eq!(st["state"], "SUSPENDED", "{st}");
        assert_eq!(st["snapshot"]["actor"], self.actor.as_str(), "{st}");
        format!("{}@{}", self.actor, st["snapshot"]["generation"])
    }

    /// The counter's live processes (not zombies) in the container's
    /// cgroups, each with its cgroup path. By comm, not cmdline: cmdline is
    /// read from the process's memory, which right after a lazy-pages
    /// restore may not be there yet.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()).is_none_or(|st| st == "Z" || st == "X");
            if cg.contains(&self.container) && comm.trim() == "actor" && !zombie {
                let path = cg.lines().find(|l| l.contains(&self.container)).and_then(|l| l.split(':').nth(2)).unwrap_or("").to_string();
                found.push((pid, path));
            }
        }
        found
    }

    /// What a failure report needs: torporctl status, the node's containerd
    /// log lines about the pod, the runc logs and CRIU logs of the counter
    /// and of `others` (more containers of the pod).
    pub fn diagnostics(&self, others: &[&str]) -> String {
        let node = self.node();
        let shim = self.shim();
        let containers: Vec<&str> = std::iter::once(self.container.as_str()).chain(others.iter().copied()).collect();
        let mut s = String::new();
        if let Ok(o) = std::panic::catch_unwind(|| node.torporctl(&["status", shim])) {
            s.push_str(&format!("--- torporctl status ---\n{}{}\n", o.stdout, o.stderr));
        }
        let mut ids = containers.clone();
        ids.push(shim);
        s.push_str(&node.log_about(&ids, 30));
        for c in &containers {
            let p = format!("{}/io.containerd.runtime.v2.task/k8s.io/{c}/log.json", node.rig.containerd_state);
            if let Ok(text) = std::fs::read_to_string(&p) {
                let lines: Vec<&str> = text.lines().collect();
                s.push_str(&format!("--- {p} ---\n"));
                for l in &lines[lines.len().saturating_sub(15)..] {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
        for p in files_below(&node.actor_dir(shim)).iter().filter(|p| p.extension().is_some_and(|e| e == "log")) {
            if let Ok(text) = std::fs::read_to_string(p) {
                let lines: Vec<&str> = text.lines().filter(|l| l.contains("Error") || l.contains("error") || l.contains("Warn")).collect();
                s.push_str(&format!("--- {} (errors) ---\n", Path::new(p).display()));
                for l in &lines[lines.len().saturating_sub(15)..] {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
        s
    }
}
