//! Checkpoint and restore through containerd's standard paths:
//!
//! * `ctr c checkpoint --rw --task` / `ctr c restore --rw --live` (memory,
//!   open listening sockets, rootfs changes, a process tree with threads);
//! * `ctr t checkpoint` of a running and of a paused task, with and without
//!   `--exit`, into containerd's image store or an `--image-path`;
//! * `crictl checkpoint --export` read back by `checkpointctl show/inspect`;
//! * failures: a stopped container, a missing, empty or corrupted checkpoint,
//!   CRIU failing to dump, CRIU missing or too old. Each gives an error that
//!   says what went wrong and leaves nothing behind (no task, shim, mount,
//!   runc state, cgroup or half-restored process), and the container that was
//!   being checkpointed keeps running.
//!
//! Stateful actors run in a pod of the runtime under test (`crictl runp`): a
//! CRI container, or a `ctr run` container that joins the pod's network
//! namespace (`--with-ns network:<netns of the pod>`), so that a restored
//! actor answers at the pod IP. containerd 2.4's CRI can checkpoint but has no
//! restore, so restores go through `ctr c restore` into the existing sandbox's
//! network namespace (and, for a CRI container, into the pod's shim).
//!
//! CRIU is found by runc through the PATH of the shim, which is containerd's
//! PATH: the CRIU-missing/too-old test starts a second, private containerd
//! (test/rig/up.sh with its own root, state, network and cgroup names) whose
//! PATH has no `criu`, then one with a stub `criu` of an old version.
//!
//! One test binary, its tests by subject: [`stateful`] (actors checkpointed
//! and restored), [`task`] (`ctr t checkpoint`), [`export`] (`crictl
//! checkpoint --export` and checkpointctl), [`failures`] and
//! [`criu_missing`] (CRIU missing or too old).

mod criu_missing;
mod export;
mod failures;
mod stateful;
mod task;

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

const NS: &str = "default";
const K8S_NS: &str = "k8s.io";
/// Media type of the CRIU image tar in a containerd checkpoint image.
const CRIU_TAR_MEDIA_TYPE: &str = "application/vnd.containerd.container.criu.checkpoint.criu.tar";

// ------------------------------------------------------------------ helpers

/// A pod of the runtime under test whose network namespace `ctr run`
/// containers join.
struct NetPod {
    /// Owns the sandbox (removed on drop, after the containers in it).
    _pod: Pod,
    netns: String,
    ip: String,
}

#[track_caller]
fn net_pod(prefix: &str) -> NetPod {
    let pod = Pod::run(prefix);
    let netns = pod.netns_path().unwrap_or_else(|| panic!("pod {} has no network namespace path: {}", pod.id, pod.inspect()));
    let ip = pod.ip();
    NetPod { _pod: pod, netns, ip }
}

impl NetPod {
    fn addr(&self, port: u16) -> String {
        format!("{}:{port}", self.ip)
    }
}

/// `ctr run -d` of `/actor <args>` (runtime under test) in the pod's network
/// namespace; the guard removes it again.
#[track_caller]
fn run_in_pod(pod: &NetPod, prefix: &str, args: &[&str]) -> CtrContainer {
    let id = unique_name(prefix);
    let c = CtrContainer::new(NS, &id);
    let with_ns = format!("network:{}", pod.netns);
    let mut command = vec!["/actor"];
    command.extend_from_slice(args);
    ctr_run(NS, &["-d", "--with-ns", &with_ns], &id, &command).ok();
    c.wait_status("RUNNING");
    c
}

/// Sends each command on one connection to the counter at `addr` (retrying
/// the connect until it is accepted) and returns the replies.
#[track_caller]
fn counter(addr: &str, cmds: &[&str]) -> Vec<String> {
    let stream = connect_with_retry(addr);
    counter_on(&stream, cmds)
}

#[track_caller]
fn counter_on(stream: &TcpStream, cmds: &[&str]) -> Vec<String> {
    stream.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut w = stream.try_clone().unwrap();
    cmds.iter()
        .map(|c| {
            w.write_all(format!("{c}\n").as_bytes()).unwrap_or_else(|e| panic!("send {c:?} to the counter: {e}"));
            let mut line = String::new();
            reader.read_line(&mut line).unwrap_or_else(|e| panic!("reply to {c:?} from the counter: {e}"));
            assert!(!line.is_empty(), "the counter closed the connection on {c:?}");
            line.trim().to_string()
        })
        .collect()
}

/// Asserts nothing accepts connections at `addr` (one attempt: the pod's
/// network namespace answers a closed port with a reset at once).
#[track_caller]
fn assert_refused(addr: &str, why: &str) {
    let sa: SocketAddr = addr.parse().unwrap();
    if let Ok(s) = TcpStream::connect_timeout(&sa, Duration::from_secs(10)) {
        let _ = s.shutdown(Shutdown::Both);
        panic!("{addr} accepts connections, but {why}");
    }
}

/// A checkpoint image in containerd's image store (namespace `ns`); removed
/// on drop.
struct CheckpointImage {
    ns: String,
    name: String,
}

impl Drop for CheckpointImage {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            let _ = ctr(&self.ns, &["images", "rm", &self.name]);
        });
    }
}

/// The images `ctr t checkpoint <id>` creates (`containerd.io/checkpoint/<id>:<date>`);
/// every one of them is removed on drop.
struct TaskCheckpointImages {
    ns: String,
    id: String,
}

impl TaskCheckpointImages {
    fn new(ns: &str, id: &str) -> Self {
        TaskCheckpointImages { ns: ns.into(), id: id.into() }
    }

    #[track_caller]
    fn list(&self) -> Vec<String> {
        let prefix = format!("containerd.io/checkpoint/{}:", self.id);
        ctr_ok(&self.ns, &["images", "ls", "-q"]).lines().map(str::trim).filter(|l| l.starts_with(&prefix)).map(str::to_string).collect()
    }
}

impl Drop for TaskCheckpointImages {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            let prefix = format!("containerd.io/checkpoint/{}:", self.id);
            let out = ctr(&self.ns, &["images", "ls", "-q"]);
            for name in out.stdout.lines().map(str::trim).filter(|l| l.starts_with(&prefix)) {
                let _ = ctr(&self.ns, &["images", "rm", name]);
            }
        });
    }
}

/// `ctr c checkpoint --rw --task <id> <ref>` (ctr pauses the task around the
/// dump and resumes it); the returned guard removes the image.
#[track_caller]
fn checkpoint_container(ns: &str, id: &str) -> CheckpointImage {
    let image = CheckpointImage { ns: ns.into(), name: format!("localhost/torpor-test/checkpoint/{id}:1") };
    ctr_ok(ns, &["containers", "checkpoint", "--rw", "--task", id, &image.name]);
    image
}

/// SIGKILL, wait, delete the task and remove the container (keeping its
/// guard for the restored container of the same id, if any).
#[track_caller]
fn remove_task_and_container(ns: &str, id: &str) {
    let _ = ctr(ns, &["task", "kill", "-a", "-s", "SIGKILL", id]);
    wait_for(&format!("task {id} to stop"), LIVENESS, || matches!(task_status(ns, id).as_deref(), None | Some("STOPPED")).then_some(()));
    if task_status(ns, id).is_some() {
        ctr_ok(ns, &["task", "delete", id]);
    }
    ctr_ok(ns, &["containers", "rm", id]);
}

/// `ctr c restore --rw --live <id> <image>`.
#[track_caller]
fn restore(ns: &str, id: &str, image: &CheckpointImage) -> Output {
    ctr(ns, &["containers", "restore", "--rw", "--live", id, &image.name])
}

/// The rig's containerd root (from the config test/rig/up.sh wrote).
fn containerd_root() -> PathBuf {
    let cfg = format!("{}/containerd.toml", rig().state_dir);
    let text = std::fs::read_to_string(&cfg).unwrap_or_else(|e| panic!("read the rig's config {cfg}: {e}"));
    text.lines()
        .find_map(|l| {
            let l = l.trim();
            let v = l.strip_prefix("root")?.trim_start().strip_prefix('=')?.trim();
            Some(PathBuf::from(v.trim_matches(|c| c == '\'' || c == '"')))
        })
        .unwrap_or_else(|| panic!("no `root = ...` in {cfg}"))
}

/// The content-store file of the CRIU image tar of checkpoint image `name`.
#[track_caller]
fn criu_blob(ns: &str, name: &str) -> PathBuf {
    let ls = ctr_ok(ns, &["images", "ls"]);
    let digest = ls
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&name)).then(|| f.get(2).unwrap_or(&"").to_string())
        })
        .unwrap_or_else(|| panic!("image {name} not in `ctr images ls`:\n{ls}"));
    let index: Value = serde_json::from_str(&ctr_ok(ns, &["content", "get", &digest]))
        .unwrap_or_else(|e| panic!("index {digest} of {name} is not JSON: {e}"));
    let blob = index["manifests"]
        .as_array()
        .and_then(|m| m.iter().find(|d| d["mediaType"] == CRIU_TAR_MEDIA_TYPE))
        .unwrap_or_else(|| panic!("checkpoint image {name} has no CRIU image ({CRIU_TAR_MEDIA_TYPE}): {index}"));
    assert!(blob["size"].as_i64().unwrap_or(0) > 0, "empty CRIU image in {name}: {index}");
    let d = blob["digest"].as_str().unwrap();
    let (algo, hex) = d.split_once(':').unwrap_or_else(|| panic!("bad digest {d}"));
    let path = containerd_root().join("io.containerd.content.v1.content/blobs").join(algo).join(hex);
    assert!(path.is_file(), "content blob {} of {name} missing", path.display());
    path
}

/// Names of the files in the CRIU image of checkpoint image `name`.
#[track_caller]
fn criu_image_files(ns: &str, name: &str) -> Vec<String> {
    let blob = criu_blob(ns, name);
    let out = run("tar", [OsStrArg::from("-tf"), OsStrArg::from(blob.as_os_str())]).ok();
    out.lines().map(|l| l.trim_start_matches("./").to_string()).filter(|l| !l.is_empty()).collect()
}

type OsStrArg = std::ffi::OsString;
