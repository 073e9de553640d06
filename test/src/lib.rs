//! Helpers for the torpor integration tests.
//!
//! The tests drive the private containerd of the test rig (`test/rig/up.sh`)
//! through `crictl` and `ctr`, the way kubelet and an operator would. The rig's
//! addresses come from the environment that `test/rig/env.sh` exports (and
//! `test/rig/run-tests.sh` sets), with the rig's defaults as fall-backs.
//!
//! Rules the tests follow:
//! * A missing dependency (no crictl, no rig, no image) is a test FAILURE, never a skip.
//! * A torpor-only test is `#[cfg_attr(not_torpor_runtime, ignore = "torpor-only:
//!   needs the torpor runtime")]` and starts with [`torpor_only()`]: under
//!   another runtime it is reported ignored (test/build.rs), never passed.
//! * Time limits are for liveness only ("did it ever get there"); nothing
//!   asserts on how fast something happened.
//! * Every pod/container a test makes is owned by a guard whose `Drop` removes
//!   it, also when the test panics; anything else a test changes is undone by
//!   a [`Cleanup`].
//!
//! The fixtures: [`CounterSpec`] / [`Counter`] (the counter actor in a pod),
//! [`torporctl`] / [`Node::torporctl`] (the one torporctl runner), [`ctr`] /
//! [`ctr_run`] / [`CtrContainer`], [`Cleanup`], [`Pod`], [`Node`].

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use serde_json;

mod cleanup;
pub mod cluster;
mod counter;
mod ctr;
pub mod metrics;
mod node;
mod torporctl;
pub mod workload;
pub use cleanup::{arm_failpoint, Cleanup};
pub use counter::{Counter, CounterSpec, COUNTER_PORT};
pub use ctr::{ctr, ctr_cgroup, ctr_ok, ctr_run, ctr_run_args, ctr_with, task_status, task_status_in, wait_task_status, CtrContainer};
pub use node::{DeadNode, HungDaemon, Node};
pub use torporctl::{default_actor, store_snapshots, torporctl, torporctl_json, torporctl_path};

/// Generous liveness limit for one state change (pod ready, container running, ...).
pub const LIVENESS: Duration = Duration::from_secs(120);
/// Upper bound for any single crictl/ctr invocation before it is declared hung.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(300);

pub const ACTOR_IMAGE: &str = "localhost/torpor-test/actor:latest";
pub const PAUSE_IMAGE: &str = "localhost/torpor-test/pause:latest";
/// Kubernetes namespace of every test pod (the CRI metadata namespace).
pub const POD_NAMESPACE: &str = "torpor-test";

// ----------------------------------------------------------------- settings

/// Where the rig is and what is under test.
#[derive(Debug, Clone)]
pub struct Rig {
    /// containerd gRPC socket path.
    pub address: String,
    /// CRI endpoint for crictl (`unix://...`).
    pub cri_endpoint: String,
    pub crictl: String,
    pub ctr: String,
    /// The rig's volatile state dir (containerd state, sockets, netns).
    pub state_dir: String,
    /// The rig's containerd state dir.
    pub containerd_state: String,
    /// CRI runtime handler under test (`torpor` or `runc`).
    pub runtime: String,
    /// crictl's per-RPC timeout.
    pub crictl_timeout: String,
    /// Parent cgroup (cgroupfs driver, below each hierarchy's root) of the
    /// test pods; down.sh removes what is left of it.
    pub cgroup: String,
    /// The rig's CRI handlers drive cgroups through systemd
    /// (`TORPOR_RIG_SYSTEMD_CGROUP=1`, test/rig/up.sh): pods get a slice.
    pub systemd_cgroup: bool,
}

impl Rig {
    /// The CRI cgroup parent of pod `name`: `/<cgroup>/pod-<name>` (cgroupfs),
    /// or under systemd the slice `<cgroup>-pod_<name>.slice` (nested in
    /// `<cgroup>.slice`, as kubelet's `kubepods-besteffort-pod<uid>.slice`;
    /// `-` nests in slice names, so the words use `_`).
    pub fn pod_cgroup_parent(&self, name: &str) -> String {
        if self.systemd_cgroup {
            format!("{}-pod_{}.slice", self.cgroup.replace('-', "_"), name.replace('-', "_"))
        } else {
            format!("/{}/pod-{name}", self.cgroup)
        }
    }
}

fn env_or(key: &str, default: &str) -> String {
    match std::env::var(key) {
        Ok(v) if !v.is_empty() => v,
        _ => default.to_string(),
    }
}

fn find_binary(env_key: &str, name: &str) -> String {
    if let Ok(v) = std::env::var(env_key) {
        if !v.is_empty() {
            return v;
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').chain(["/usr/local/bin", "/usr/bin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    // Let the spawn fail with a clear message.
    name.to_string()
}

/// The rig settings of node A, the node every single-node test uses (read
/// once from the environment). [`Node::b`] is the second node.
pub fn rig() -> &'static Rig {
    &Node::a().rig
}

impl Rig {
    /// The settings of a node whose state dir is `state_dir`.
    fn for_node(state_dir: String, address: String, cgroup: String) -> Rig {
        let cri_endpoint = format!("unix://{address}");
        Rig {
            containerd_state: format!("{state_dir}/containerd"),
            crictl: find_binary("TORPOR_CRICTL", "crictl"),
            ctr: find_binary("TORPOR_CTR", "ctr"),
            runtime: env_or("TORPOR_TEST_RUNTIME", "torpor"),
            crictl_timeout: env_or("TORPOR_CRICTL_TIMEOUT", "120s"),
            cgroup,
            systemd_cgroup: env_or("TORPOR_RIG_SYSTEMD_CGROUP", "0") == "1",
            address,
            cri_endpoint,
            state_dir,
        }
    }
}

/// CRI runtime handler under test (`TORPOR_TEST_RUNTIME`, default `torpor`).
pub fn runtime_handler() -> &'static str {
    &rig().runtime
}

/// Whether the runtime under test is torpor (torpor-only tests run then).
pub fn is_torpor() -> bool {
    runtime_handler() == "torpor"
}

/// The runtime handler the test binaries were built for (test/build.rs).
pub const BUILT_FOR: &str = env!("TORPOR_TESTS_BUILT_FOR");

/// The guard of a torpor-only test: its first line. Such a test is also
/// marked `#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the
/// torpor runtime")]`, so that under another runtime the run reports it
/// ignored (test/build.rs). If it runs anyway (`--ignored`, or a binary
/// built for torpor run under another `TORPOR_TEST_RUNTIME`) it fails here:
/// a torpor-only test never passes without having run.
#[track_caller]
pub fn torpor_only() {
    let handler = runtime_handler();
    assert!(
        handler == "torpor",
        "a torpor-only test cannot run under runtime {handler} (the binary was built for {BUILT_FOR}); \
         build the tests with TORPOR_TEST_RUNTIME={handler} so that it is reported ignored"
    );
}

/// containerd runtime_type (`ctr run --runtime`) of the handler under test.
pub fn runtime_type() -> String {
    if let Ok(v) = std::env::var("TORPOR_TEST_RUNTIME_TYPE") {
        if !v.is_empty() {
            return v;
        }
    }
    match runtime_handler() {
        "torpor" => "io.containerd.torpor.v1".into(),
        "runc" => "io.containerd.runc.v2".into(),
        other => panic!("don't know the runtime_type of TORPOR_TEST_RUNTIME={other}; set TORPOR_TEST_RUNTIME_TYPE"),
    }
}

// ------------------------------------------------------------------- names

/// A name unique across tests, threads and test processes: `prefix-<pid>-<n>-<rand>`.
/// Lower-case, DNS-label safe, at most 63 characters.
/// A unique actor id in the test pods' namespace ([`POD_NAMESPACE`]):
/// an actor belongs to its pod's namespace.
pub fn actor_name(prefix: &str) -> String {
    format!("{POD_NAMESPACE}/{}", unique_name(prefix))
}

pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let prefix: String = prefix.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(40).collect();
    format!("{prefix}-{}-{n}-{:x}", std::process::id(), nanos & 0xfffff)
}

// ---------------------------------------------------------------- commands

/// Result of one command.
#[derive(Debug, Clone)]
pub struct Output {
    /// What was run (for messages).
    pub cmdline: String,
    /// Exit code; 128+N when killed by signal N.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// Panics with the full output unless the command succeeded; returns stdout.
    #[track_caller]
    pub fn ok(self) -> String {
        if self.code != 0 {
            panic!("command failed: {self}");
        }
        self.stdout
    }

    /// Both streams, for error-message assertions.
    pub fn all_output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmdline,
            self.code,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// Runs a program to completion with an optional stdin, capturing both
/// streams. Panics if it cannot be started (missing dependency = failure) or
/// if it is still running after `limit` (it is killed first).
#[track_caller]
pub fn run_with<I, S>(program: &str, args: I, stdin: Option<&[u8]>, limit: Duration) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_env(program, args, stdin, limit, &[])
}

/// [`run_with`] with extra environment variables for the program.
#[track_caller]
pub fn run_env<I, S>(program: &str, args: I, stdin: Option<&[u8]>, limit: Duration, env: &[(String, String)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let cmdline =
        std::iter::once(program.to_string()).chain(args.iter().map(|a| a.to_string_lossy().into_owned())).collect::<Vec<_>>().join(" ");
    let mut command = Command::new(program);
    // crictl: use the rig's config file, never the host's /etc/crictl.yaml
    // (and no warning about it missing on every call).
    let crictl_cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/rig/crictl.yaml");
    if Path::new(crictl_cfg).is_file() {
        command.env("CRI_CONFIG_FILE", crictl_cfg);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = command
        .args(&args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{cmdline}`: {e} (is the rig installed? see test/rig/up.sh)"));
    let stdin_thread = stdin.map(|data| {
        let data = data.to_vec();
        let mut pipe = child.stdin.take().expect("stdin pipe");
        thread::spawn(move || {
            let _ = pipe.write_all(&data);
            // dropping the pipe closes it: EOF for the reader
        })
    });
    let mut out_pipe = child.stdout.take().expect("stdout pipe");
    let mut err_pipe = child.stderr.take().expect("stderr pipe");
    let out_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                let stdout = String::from_utf8_lossy(&out_thread.join().unwrap_or_default()).into_owned();
                let stderr = String::from_utf8_lossy(&err_thread.join().unwrap_or_default()).into_owned();
                panic!("`{cmdline}` still running after {limit:?} (hung), killed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for `{cmdline}`: {e}"),
        }
    };
    if let Some(t) = stdin_thread {
        let _ = t.join();
    }
    let stdout = String::from_utf8_lossy(&out_thread.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_thread.join().unwrap_or_default()).into_owned();
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Output { cmdline, code, stdout, stderr }
}

/// Runs a program with no stdin and the default command limit.
#[track_caller]
pub fn run<I, S>(program: &str, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_with(program, args, None, COMMAND_LIMIT)
}

/// `crictl <args>` against the rig (node A).
#[track_caller]
pub fn crictl(args: &[&str]) -> Output {
    Node::a().crictl(args)
}

/// `crictl <args>` with `input` on stdin.
#[track_caller]
pub fn crictl_stdin(args: &[&str], input: &[u8]) -> Output {
    Node::a().crictl_stdin(args, input)
}

/// `crictl <args>`, panicking on failure; returns trimmed stdout.
#[track_caller]
pub fn crictl_ok(args: &[&str]) -> String {
    Node::a().crictl_ok(args)
}

/// `crictl <args>` whose stdout is JSON.
#[track_caller]
pub fn crictl_json(args: &[&str]) -> Value {
    Node::a().crictl_json(args)
}

/// Fails the test unless the rig (node A) answers and has the test images.
/// Call at the start of each test: a clear message beats a cascade of crictl
/// errors.
#[track_caller]
pub fn require_rig() {
    Node::a().require()
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

/// Polls `f` until it returns `Some`, failing the test after `limit`
/// (a liveness limit: never used to judge speed).
#[track_caller]
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    let mut delay = Duration::from_millis(50);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

// ------------------------------------------------------------- temp files

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A fresh directory named `<prefix>-<unique>` under $TMPDIR/torpor-tests.
    pub fn new(prefix: &str) -> TempDir {
        Self::named(&unique_name(prefix))
    }

    /// $TMPDIR/torpor-tests/<name> (name must already be unique).
    pub fn named(name: &str) -> TempDir {
        let path = std::env::temp_dir().join("torpor-tests").join(name);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Writes `value` as JSON to `dir/name` and returns the path as a String.
pub fn write_json(dir: &Path, name: &str, value: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(value).unwrap()).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p.to_string_lossy().into_owned()
}

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

/// Waits until the container has exited; returns (exitCode, reason).
#[track_caller]
pub fn wait_exited(id: &str) -> (i64, String) {
    let v = wait_container_state(id, "CONTAINER_EXITED");
    (v["status"]["exitCode"].as_i64().unwrap_or(-1), v["status"]["reason"].as_str().unwrap_or_default().to_string())
}

// ------------------------------------------------------------ host checks

/// Processes whose command line or working directory mentions `needle`
/// (shims are started with `-id <id>` and run in their bundle dir).
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in rd.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == me {
            continue;
        }
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        // crictl/ctr clients of concurrently running tests are not leftovers
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if exe.ends_with("/crictl") || exe.ends_with("/ctr") {
            continue;
        }
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if cmdline.contains(needle) || cwd.contains(needle) {
            found.push(format!("pid {pid} exe {exe} cwd {cwd}: {}", cmdline.trim()));
        }
    }
    found
}

/// Processes in a cgroup whose path contains `needle` (a container id, a
/// pod's cgroup), with their command lines.
pub fn processes_in_cgroup(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return found };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cg.contains(needle) {
            let cmd =
                std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
            found.push(format!("pid {pid}: {}", cmd.trim()));
        }
    }
    found
}

/// The files below `dir` (at most 5 levels deep).
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
        if depth > 4 {
            return;
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out, depth + 1);
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out, 0);
    out
}

/// Lines of /proc/self/mountinfo that mention `needle`.
pub fn mounts_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(|l| l.to_string())
        .collect()
}

/// One command of the actor counter's line protocol on a fresh connection
/// to `addr` (connect retried, liveness-limited); the reply line, trimmed.
#[track_caller]
pub fn counter_cmd(addr: &str, cmd: &str) -> String {
    use std::io::{BufRead, Write};
    let stream = connect_with_retry(addr);
    stream.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut w = stream.try_clone().unwrap();
    w.write_all(format!("{cmd}\n").as_bytes()).unwrap_or_else(|e| panic!("send {cmd:?} to {addr}: {e}"));
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line).unwrap_or_else(|e| panic!("reply to {cmd:?} from {addr}: {e}"));
    assert!(line.ends_with('\n'), "counter at {addr} closed the connection instead of answering {cmd:?} (got {line:?})");
    line.trim().to_string()
}

/// A TCP connect to `addr` with retries until it succeeds (liveness-limited).
#[track_caller]
pub fn connect_with_retry(addr: &str) -> std::net::TcpStream {
    let sa: std::net::SocketAddr = addr.parse().unwrap_or_else(|e| panic!("bad address {addr}: {e}"));
    let mut last_err = String::new();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("a TCP connection to {addr}"), LIVENESS, || {
            match std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(5)) {
                Ok(s) => Some(s),
                Err(e) => {
                    last_err = e.to_string();
                    None
                }
            }
        })
    }));
    match res {
        Ok(s) => s,
        Err(_) => panic!("cannot connect to {addr}: {last_err}"),
    }
}
