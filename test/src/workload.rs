//! Helpers for the workload suite (`tests/workloads.rs`): ordinary servers
//! from Debian's packages (test/images/workloads) run as pods of
//! RuntimeClass torpor on the test cluster, suspended and resumed through
//! the Kubernetes API by torpor-agent (the `torpor.dev/desired-state`
//! annotation), their data checked with their own clients.
//!
//! The test cluster of test/cluster/up.sh has no torpor-agent (tests/k8s.rs
//! drives torporctl): [`Agents`] runs the release build's `torpor-agent`
//! on the host for each node, as the torpor-node DaemonSet runs it (node
//! name, the node's shim sockets, the cluster's kubeconfig), for as long as
//! a test holds it.

use crate::cluster::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub const POSTGRES_IMAGE: &str = "localhost/torpor-test/postgres:15";
pub const REDIS_IMAGE: &str = "localhost/torpor-test/redis:7";
pub const NGINX_IMAGE: &str = "localhost/torpor-test/nginx:1.22";
/// The images' non-root users (their /etc/passwd, test/images/workloads/build.sh).
pub const POSTGRES_UID: u32 = 101;
pub const REDIS_UID: u32 = 999;
pub const NGINX_UID: u32 = 101;

/// The agent's annotation a user writes, and the label it answers with.
pub const DESIRED: &str = "torpor.dev/desired-state";
pub const STATE_LABEL: &str = "torpor.dev/state";
pub const APPLIED_RESULT: &str = "torpor.dev/applied-result";
/// The desired state the agent last acted on.
pub const APPLIED_STATE: &str = "torpor.dev/applied-state";

fn agent_path() -> String {
    match std::env::var("TORPOR_AGENT") {
        Ok(v) if !v.is_empty() => v,
        _ => concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/torpor-agent").to_string(),
    }
}

/// One torpor-agent per cluster node, on the host; stopped (SIGTERM, then
/// SIGKILL) on drop. Their logs: `<cluster state>/agent-<node>.log`.
pub struct Agents {
    /// (log file, its length before this agent's lines, the agent)
    children: Vec<(String, usize, Child)>,
}

impl Agents {
    #[track_caller]
    pub fn start() -> Agents {
        let c = cluster();
        let bin = agent_path();
        assert!(std::path::Path::new(&bin).is_file(), "torpor-agent not found at {bin} (cargo build --release -p torpor-agent)");
        let mut agents = Agents { children: Vec::new() };
        for n in &c.nodes {
            let log_path = format!("{}/agent-{}.log", c.state, n.name);
            let before = std::fs::metadata(&log_path).map(|m| m.len() as usize).unwrap_or(0);
            let log =
                std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap_or_else(|e| panic!("open {log_path}: {e}"));
            let mut cmd = Command::new(&bin);
            cmd.env("NODE_NAME", &n.name)
                .env("KUBECONFIG", &c.kubeconfig)
                .env("TORPOR_AGENT_RESYNC_S", "2")
                .env("TORPOR_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log);
            for (k, v) in &n.torpor_env {
                cmd.env(k, v);
            }
            let child = cmd.spawn().unwrap_or_else(|e| panic!("start {bin} for {}: {e}", n.name));
            agents.children.push((log_path, before, child));
        }
        // each is watching once it has logged its first list
        for (log, before, child) in &mut agents.children {
            let log = log.clone();
            let ours = || String::from_utf8_lossy(std::fs::read(&log).unwrap_or_default().get(*before..).unwrap_or_default()).into_owned();
            wait_until(&format!("torpor-agent watching its node's pods ({log})"), LIVENESS, || {
                if let Ok(Some(st)) = child.try_wait() {
                    panic!("torpor-agent exited {st}: {}", ours());
                }
                ours().contains("resynced this node's torpor pods").then_some(())
            });
        }
        agents
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, _, child) in &mut self.children {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            }
        }
        for (_, _, child) in &mut self.children {
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(10) {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `kubectl apply -f RuntimeClass.yaml` (the repository's own file).
#[track_caller]
pub fn runtime_class() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../RuntimeClass.yaml");
    kubectl_ok(&["apply", "-f", path]);
}

/// Labels the namespace to enforce the `restricted` Pod Security Standard
/// (the API server's PodSecurity admission): only non-root pods with no
/// privilege escalation, every capability dropped and a seccomp profile.
#[track_caller]
pub fn enforce_restricted(ns: &Namespace) {
    kubectl_ok(&[
        "label",
        "namespace",
        &ns.name,
        "--overwrite",
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    ]);
}

/// The securityContexts of a non-root pod as the `restricted` standard
/// asks: (pod's, container's).
pub fn non_root(uid: u32) -> (Value, Value) {
    (
        json!({"runAsNonRoot": true, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid, "seccompProfile": {"type": "RuntimeDefault"}}),
        json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}),
    )
}

/// The node a pod runs on.
#[track_caller]
pub fn node_of(p: &Value) -> &'static KubeNode {
    let name = p["spec"]["nodeName"].as_str().unwrap_or_else(|| panic!("pod not scheduled: {p}"));
    cluster().node(name)
}

#[track_caller]
pub fn pod_ip(p: &Value) -> String {
    p["status"]["podIP"].as_str().unwrap_or_else(|| panic!("pod has no IP: {}", p["status"])).to_string()
}

/// The first container's id (without `containerd://`).
pub fn container_id(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["containerID"].as_str().unwrap_or_default().trim_start_matches("containerd://").to_string()
}

/// `kubectl exec POD -- ARGS`, which must succeed; its stdout.
#[track_caller]
pub fn exec(ns: &Namespace, pod: &str, args: &[&str]) -> String {
    let mut all = vec!["exec", pod, "--"];
    all.extend_from_slice(args);
    let out = ns.kubectl(&all);
    assert!(out.success(), "exec in {}/{pod}: {out}", ns.name);
    out.stdout
}

/// The container's processes as `kubectl exec POD -- ps` lists them
/// (busybox: PID, USER, command), without the `ps` itself: (pid, user, command).
#[track_caller]
pub fn processes(ns: &Namespace, pod: &str) -> Vec<(u32, String, String)> {
    exec(ns, pod, &["ps"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let pid = f.next()?.parse().ok()?;
            let user = f.next()?.to_string();
            let cmd = f.collect::<Vec<_>>().join(" ");
            (cmd != "ps").then_some((pid, user, cmd))
        })
        .collect()
}

/// Asks `value` of the agent by annotation (`kubectl annotate`).
#[track_caller]
pub fn annotate(ns: &Namespace, pod: &str, value: &str) {
    ns.kubectl_ok(&["annotate", "pod", pod, "--overwrite", &format!("{DESIRED}={value}")]);
}

/// Waits until the agent's label on the pod says `state`; the pod then.
#[track_caller]
pub fn wait_label(ns: &Namespace, pod: &str, state: &str) -> Value {
    wait_until(&format!("{}/{pod} labelled {STATE_LABEL}={state}", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        (p["metadata"]["labels"][STATE_LABEL] == state).then_some(p)
    })
}

/// What the agent reported of its last operation on the pod (`ok: ...`).
#[track_caller]
fn applied_result(ns: &Namespace, pod: &str, op: &str) -> String {
    wait_until(&format!("{}/{pod}: the agent's result of its {op}", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        p["metadata"]["annotations"][APPLIED_RESULT].as_str().filter(|r| r.contains(op)).map(str::to_string)
    })
}

/// Suspends the pod's actor through the API: the annotation, then the
/// agent's label, the actor SUSPENDED on its node and the agent's result.
#[track_caller]
pub fn suspend_by_annotation(ns: &Namespace, pod: &str) {
    annotate(ns, pod, "suspended");
    // the label, or the agent's failure at once (not a wait for the limit)
    let p = wait_until(&format!("{}/{pod} labelled {STATE_LABEL}=suspended", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        let result = p["metadata"]["annotations"][APPLIED_RESULT].as_str().unwrap_or_default();
        assert!(!result.starts_with("failed"), "{}/{pod}: the agent's suspend failed: {result}", ns.name);
        (p["metadata"]["labels"][STATE_LABEL] == "suspended").then_some(p)
    });
    let node = node_of(&p);
    assert_eq!(node.actor_state(&ns.actor(pod)), "SUSPENDED", "{}/{pod}: the label follows the actor", ns.name);
    let r = applied_result(ns, pod, "suspend");
    assert!(r.starts_with("ok"), "{}/{pod}: the agent's suspend: {r}", ns.name);
    eprintln!("{}/{pod}: {r}", ns.name);
}

/// Resumes the pod's actor through the API (as [`suspend_by_annotation`]).
#[track_caller]
pub fn resume_by_annotation(ns: &Namespace, pod: &str) {
    annotate(ns, pod, "running");
    // the label, or the agent's failure at once (not a wait for the limit)
    let p = wait_until(&format!("{}/{pod} labelled {STATE_LABEL}=running", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        let a = &p["metadata"]["annotations"];
        let result = a[APPLIED_RESULT].as_str().unwrap_or_default();
        if a[APPLIED_STATE] == "running" {
            assert!(!result.starts_with("failed"), "{}/{pod}: the agent's resume failed: {result}", ns.name);
        }
        (p["metadata"]["labels"][STATE_LABEL] == "running").then_some(p)
    });
    let node = node_of(&p);
    assert_eq!(node.actor_state(&ns.actor(pod)), "RUNNING", "{}/{pod}: the label follows the actor", ns.name);
    let r = applied_result(ns, pod, "resume");
    assert!(r.starts_with("ok"), "{}/{pod}: the agent's resume: {r}", ns.name);
    eprintln!("{}/{pod}: {r}", ns.name);
}

/// SIGKILLs the main process of the pod's (first) container from its node,
/// as an OOM kill or a crash would end it: the process of the container's
/// cgroup that is pid 1 of its pid namespace. (Not crictl's pid: CRI records
/// the pid of the task's start, and a resume restores the process under a
/// new host pid.)
#[track_caller]
pub fn kill_main_process(p: &Value) {
    let node = node_of(p);
    let cid = container_id(p);
    let procs = format!("{}/{cid}/cgroup.procs", node.pod_cgroup("memory", p));
    let list = std::fs::read_to_string(&procs).unwrap_or_else(|e| panic!("{procs}: {e}"));
    let init = list
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| s.lines().find(|l| l.starts_with("NSpid:")).map(|l| l.split_whitespace().last() == Some("1")))
                .unwrap_or(false)
        })
        .unwrap_or_else(|| panic!("container {cid}: no pid 1 of its namespace among {procs}: {list:?}"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init), nix::sys::signal::Signal::SIGKILL)
        .unwrap_or_else(|e| panic!("kill -KILL {init} (container {cid}): {e}"));
}

/// Waits until the pod's containers have restarted `n` times in all and it
/// is Ready again; the pod then.
#[track_caller]
pub fn wait_restarted(ns: &Namespace, pod: &str, n: u64) -> Value {
    wait_until(&format!("{}/{pod}: restartCount {n} and Ready", ns.name), LIVENESS, || {
        let p = ns.pod(pod);
        (restarts(&p) >= n && pod_is_ready(&p)).then_some(p)
    })
}

// -------------------------------------------------------------------- HTTP

/// `GET path` at `addr` (HTTP/1.0, one request): (status, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let sa: std::net::SocketAddr =
        addr.parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(10))?;
    s.set_read_timeout(Some(COMMAND_LIMIT))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: torpor-tests\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an HTTP reply: {text:?}")))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

// ------------------------------------------------------------------- Redis

/// A reply of Redis' protocol (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<Resp>>),
}

/// One client connection to a Redis server, kept as long as the value.
pub struct Redis {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    pub addr: String,
}

impl Redis {
    /// Connects to `addr` (retried until LIVENESS).
    #[track_caller]
    pub fn connect(addr: &str) -> Redis {
        let sa: std::net::SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
        let stream = wait_until(&format!("a connection to redis at {addr}"), LIVENESS, || {
            TcpStream::connect_timeout(&sa, Duration::from_secs(10)).ok()
        });
        stream.set_read_timeout(Some(COMMAND_LIMIT)).unwrap_or_else(|e| panic!("{addr}: {e}"));
        let reader = BufReader::new(stream.try_clone().unwrap_or_else(|e| panic!("{addr}: {e}")));
        Redis { stream, reader, addr: addr.to_string() }
    }

    /// Sends one command (as a RESP array of bulk strings).
    #[track_caller]
    pub fn send(&mut self, args: &[&str]) {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a.as_bytes());
            b.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&b).unwrap_or_else(|e| panic!("redis {}: send {args:?}: {e}", self.addr));
    }

    /// Reads one reply.
    #[track_caller]
    pub fn read(&mut self) -> Resp {
        let addr = self.addr.clone();
        read_resp(&mut self.reader).unwrap_or_else(|e| panic!("redis {addr}: read a reply: {e}"))
    }

    /// Sends a command and reads its reply.
    #[track_caller]
    pub fn cmd(&mut self, args: &[&str]) -> Resp {
        self.send(args);
        self.read()
    }
}

fn read_resp(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(line.len().min(1));
    let num = || rest.parse::<i64>().map_err(|e| bad(format!("bad number in {line:?}: {e}")));
    Ok(match kind {
        "+" => Resp::Simple(rest.to_string()),
        "-" => Resp::Error(rest.to_string()),
        ":" => Resp::Int(num()?),
        "$" => {
            let n = num()?;
            if n < 0 {
                Resp::Bulk(None)
            } else {
                let mut b = vec![0u8; usize::try_from(n).map_err(|e| bad(e.to_string()))? + 2];
                r.read_exact(&mut b)?;
                b.truncate(b.len() - 2);
                Resp::Bulk(Some(String::from_utf8_lossy(&b).into_owned()))
            }
        }
        "*" => {
            let n = num()?;
            if n < 0 {
                Resp::Array(None)
            } else {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(read_resp(r)?);
                }
                Resp::Array(Some(v))
            }
        }
        _ => return Err(bad(format!("not a RESP reply: {line:?}"))),
    })
}

/// A bulk string reply.
pub fn bulk(s: &str) -> Resp {
    Resp::Bulk(Some(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_replies_parse() {
        let mut r =
            std::io::Cursor::new(b"+OK\r\n-ERR x\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n".to_vec());
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Simple("OK".into()));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Error("ERR x".into()));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Int(42));
        assert_eq!(read_resp(&mut r).unwrap(), bulk("abc"));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Bulk(None));
        assert_eq!(read_resp(&mut r).unwrap(), Resp::Array(Some(vec![bulk("message"), bulk("news"), bulk("hi")])));
        assert!(read_resp(&mut r).is_err(), "end of input");
        assert!(read_resp(&mut std::io::Cursor::new(b"?x\r\n".to_vec())).is_err());
    }
}
