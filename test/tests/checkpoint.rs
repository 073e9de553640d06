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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
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

/// One JSON line from `/actor tree` (it writes first when the client is silent).
#[track_caller]
fn tree_info(addr: &str) -> Value {
    let mut s = connect_with_retry(addr);
    s.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap_or_else(|e| panic!("read from the tree actor at {addr}: {e}"));
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("tree actor at {addr} sent {text:?}: {e}"))
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

/// Replaces the CRIU image tar of a checkpoint image in the content store
/// with a modified copy (containerd does not re-verify a blob's digest when it
/// unpacks a checkpoint for a restore); the original is put back on drop.
struct CorruptedBlob {
    path: PathBuf,
    original: Vec<u8>,
}

impl CorruptedBlob {
    #[track_caller]
    fn new(path: &Path, mutate: impl FnOnce(&Path)) -> CorruptedBlob {
        let original = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let dir = TempDir::new("criu-image");
        run("tar", [OsStrArg::from("-C"), dir.path().into(), "-xf".into(), path.into()]).ok();
        mutate(dir.path());
        let tar = dir.path().with_extension("tar");
        run("tar", [OsStrArg::from("-C"), dir.path().into(), "-cf".into(), tar.clone().into(), ".".into()]).ok();
        let bytes = std::fs::read(&tar).unwrap();
        let _ = std::fs::remove_file(&tar);
        std::fs::write(path, bytes).unwrap_or_else(|e| panic!("rewrite {}: {e}", path.display()));
        CorruptedBlob { path: path.to_path_buf(), original }
    }
}

impl Drop for CorruptedBlob {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.original);
    }
}

/// runc state directories a container `id` of namespace `ns` may have.
fn runc_state_dirs(ns: &str, id: &str) -> Vec<PathBuf> {
    vec![Path::new("/run/torpor/runc").join(ns).join(id), Path::new("/run/containerd/runc").join(ns).join(id)]
}

/// Everything a task `id` of namespace `ns` could leave behind on the host.
#[track_caller]
fn assert_nothing_left(ns: &str, id: &str) {
    let mut left = Vec::new();
    if let Some(s) = task_status(ns, id) {
        left.push(format!("task ({s})"));
    }
    for p in processes_mentioning(id) {
        left.push(format!("process: {p}"));
    }
    for m in mounts_mentioning(id) {
        left.push(format!("mount: {m}"));
    }
    let bundle = Path::new(&rig().containerd_state).join("io.containerd.runtime.v2.task").join(ns).join(id);
    if bundle.exists() {
        left.push(format!("bundle {}", bundle.display()));
    }
    for d in runc_state_dirs(ns, id) {
        if d.exists() {
            left.push(format!("runc state {}", d.display()));
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for h in rd.flatten() {
            for cg in [h.path().join(ns).join(id), h.path().join(id)] {
                if cg.is_dir() {
                    left.push(format!("cgroup {}", cg.display()));
                }
            }
        }
    }
    assert!(left.is_empty(), "left behind by {ns}/{id}:\n{}", left.join("\n"));
}

/// The bundle directory of a task.
fn bundle_dir(ns: &str, id: &str) -> PathBuf {
    Path::new(&rig().containerd_state).join("io.containerd.runtime.v2.task").join(ns).join(id)
}

fn find_tool(env_key: &str, name: &str) -> String {
    if let Ok(v) = std::env::var(env_key) {
        if !v.is_empty() {
            return v;
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').chain(["/usr/local/bin", "/usr/bin", "/usr/local/sbin", "/usr/sbin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    panic!("{name} not found in PATH or /usr/local/bin (set {env_key}); it is a dependency of these tests");
}

// -------------------------------------------------------- stateful actors

/// A counter in a CRI pod: bumped over TCP at the pod IP, checkpointed with
/// `ctr -n k8s.io c checkpoint --rw --task`, removed through CRI, restored
/// with `ctr c restore --rw --live` into the same sandbox: it continues where
/// it was and answers at the pod IP.
#[test]
fn cri_counter_continues_at_the_pod_ip_after_restore() {
    let pod = Pod::run("ckpt-cri");
    let cid = pod.start_actor("counter", &["counter", "--port", "8080"]);
    wait_container_state(&cid, "CONTAINER_RUNNING");
    let addr = format!("{}:8080", pod.ip());
    assert_eq!(counter(&addr, &["inc", "inc", "inc"]), ["1", "2", "3"]);

    let image = checkpoint_container(K8S_NS, &cid);
    // without --exit the container keeps running, state intact
    assert_eq!(container_state(&cid), "CONTAINER_RUNNING");
    assert_eq!(counter(&addr, &["get"]), ["3"]);
    let files = criu_image_files(K8S_NS, &image.name);
    assert!(files.iter().any(|f| f == "inventory.img"), "CRIU image files: {files:?}");

    crictl_ok(&["stop", "--timeout", "10", &cid]);
    crictl_ok(&["rm", &cid]);
    assert_refused(&addr, "the counter container was removed");

    let rid = unique_name("ckpt-cri-restored");
    let _restored = CtrContainer::new(K8S_NS, &rid);
    let out = ctr(K8S_NS, &["containers", "restore", "--rw", "--live", &rid, &image.name]);
    assert!(out.success(), "{out}");
    wait_task_status(K8S_NS, &rid, "RUNNING");

    assert_eq!(counter(&addr, &["get", "inc"]), ["3", "4"], "the counter continues where it was");
    assert_eq!(pod.state(), "SANDBOX_READY");

    // restored into the existing sandbox: the pod's network namespace ...
    let info: Value = serde_json::from_str(&ctr_ok(K8S_NS, &["containers", "info", &rid])).unwrap();
    let netns = info["Spec"]["linux"]["namespaces"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["type"] == "network"))
        .and_then(|n| n["path"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("restored container has no network namespace path: {}", info["Spec"]));
    // (CRI names it /proc/<pause pid>/ns/net, the sandbox by its bind mount)
    let ns_id = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("stat {p}: {e}"));
        (m.dev(), m.ino())
    };
    let pod_netns = pod.netns_path().expect("pod network namespace path");
    assert_eq!(ns_id(&netns), ns_id(&pod_netns), "restored container's network namespace {netns} is not the pod's {pod_netns}");
    assert_eq!(info["Runtime"]["Name"], runtime_type().as_str(), "{}", info["Runtime"]);
    // ... and the pod's shim (one shim per pod: none was started for it)
    let shims: Vec<String> = processes_mentioning(&rid).into_iter().filter(|p| p.contains("containerd-shim")).collect();
    assert!(shims.is_empty(), "a shim of its own for the restored container: {shims:?}");
    // not even one that set itself up and left (its control socket)
    let dir = std::env::var("TORPOR_SHIM_SOCKET_DIR").unwrap_or_else(|_| "/run/torpor/shims".into());
    let sock = format!("{dir}/{rid}.sock");
    assert!(!std::path::Path::new(&sock).exists(), "a control socket for the restored container: {sock}");
}

/// `ctr c checkpoint --rw --task` / `ctr c restore --rw --live`: files
/// written into the rootfs come back with the memory state.
#[test]
fn rootfs_changes_and_memory_survive_ctr_checkpoint_restore() {
    let pod = net_pod("ckpt-rootfs");
    let c = run_in_pod(&pod, "ckpt-rootfs", &["counter", "--port", "8080"]);
    let addr = pod.addr(8080);
    assert_eq!(counter(&addr, &["inc", "inc"]), ["1", "2"]);
    let token = unique_name("token");
    let script = format!("echo {token} > /written.txt && mkdir -p /var/lib/actor && echo nested > /var/lib/actor/state && rm /etc/group");
    let out = ctr(NS, &["task", "exec", "--exec-id", "write", &c.id, "/bin/sh", "-c", &script]);
    assert!(out.success(), "{out}");

    let image = checkpoint_container(NS, &c.id);
    assert_eq!(task_status(NS, &c.id).as_deref(), Some("RUNNING"), "running after a checkpoint without --exit");
    assert_eq!(counter(&addr, &["get"]), ["2"]);

    remove_task_and_container(NS, &c.id);
    assert_refused(&addr, "the task was deleted");
    let out = restore(NS, &c.id, &image);
    assert!(out.success(), "{out}");
    wait_task_status(NS, &c.id, "RUNNING");

    let out = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "read",
            &c.id,
            "/bin/sh",
            "-c",
            "cat /written.txt /var/lib/actor/state; test ! -e /etc/group && echo group-gone",
        ],
    );
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.lines().collect::<Vec<_>>(), [token.as_str(), "nested", "group-gone"], "{out}");
    assert_eq!(counter(&addr, &["get", "inc"]), ["2", "3"]);
}

/// `/actor tree`: a parent with two children and four counting threads keeps
/// its pids, children, threads, and its ticks keep growing after a restore.
#[test]
fn process_tree_survives_checkpoint_restore() {
    let pod = net_pod("ckpt-tree");
    let c = run_in_pod(&pod, "ckpt-tree", &["tree", "--port", "8081", "--children", "2", "--threads", "4"]);
    let addr = pod.addr(8081);
    let before = wait_for("the tree actor's children", LIVENESS, || {
        let v = tree_info(&addr);
        (v["children_alive"] == 2 && v["children"].as_array().map(Vec::len) == Some(2)).then_some(v)
    });
    let host_pids = |id: &str| -> usize { ctr_ok(NS, &["task", "ps", id]).lines().skip(1).filter(|l| !l.trim().is_empty()).count() };
    assert_eq!(host_pids(&c.id), 3, "parent and two children");

    let image = checkpoint_container(NS, &c.id);
    remove_task_and_container(NS, &c.id);

    let rid = unique_name("ckpt-tree-restored");
    let _restored = CtrContainer::new(NS, &rid);
    let out = restore(NS, &rid, &image);
    assert!(out.success(), "{out}");
    wait_task_status(NS, &rid, "RUNNING");

    let after = tree_info(&addr);
    assert_eq!(after["pid"], before["pid"], "same pid (in the container's pid namespace): {after}");
    assert_eq!(after["children"], before["children"], "same children: {after}");
    assert_eq!(after["children_alive"], 2, "{after}");
    assert_eq!(after["threads"], 4, "{after}");
    let os_threads = |v: &Value| v["os_threads"].as_u64().unwrap_or(0);
    assert!(
        os_threads(&after) >= os_threads(&before),
        "threads lost in the restore: {} before, {} after",
        os_threads(&before),
        os_threads(&after)
    );
    assert_eq!(host_pids(&rid), 3, "parent and two children after the restore");
    let ticks = |v: &Value| -> Vec<u64> {
        v["thread_ticks"].as_array().map(|a| a.iter().map(|t| t.as_u64().unwrap_or(0)).collect()).unwrap_or_default()
    };
    assert_eq!(ticks(&after).len(), 4, "{after}");
    assert!(after["ticks"].as_u64() >= before["ticks"].as_u64(), "ticks went back: {before} then {after}");
    // every counting thread runs on after the restore
    let first = ticks(&after);
    wait_for("every thread of the restored tree to tick", LIVENESS, || {
        let now = ticks(&tree_info(&addr));
        (now.len() == 4 && now.iter().zip(&first).all(|(n, f)| n > f)).then_some(())
    });
}

// ----------------------------------------------------- ctr task checkpoint

/// A paused task can be checkpointed (`ctr t pause` then `ctr t checkpoint`);
/// it stays paused, resumes and continues.
#[test]
fn checkpoint_of_a_paused_task() {
    let pod = net_pod("ckpt-paused");
    let c = run_in_pod(&pod, "ckpt-paused", &["counter", "--port", "8080"]);
    let _images = TaskCheckpointImages::new(NS, &c.id);
    let addr = pod.addr(8080);
    assert_eq!(counter(&addr, &["inc", "inc"]), ["1", "2"]);

    ctr_ok(NS, &["task", "pause", &c.id]);
    wait_task_status(NS, &c.id, "PAUSED");

    // into containerd's image store
    let out = ctr_ok(NS, &["task", "checkpoint", &c.id]);
    let name = out.trim().to_string();
    assert!(name.starts_with(&format!("containerd.io/checkpoint/{}:", c.id)), "checkpoint name: {out}");
    let files = criu_image_files(NS, &name);
    assert!(files.iter().any(|f| f == "inventory.img"), "CRIU image files: {files:?}");
    assert!(files.iter().any(|f| f.starts_with("pages-")), "CRIU image files: {files:?}");
    assert_eq!(task_status(NS, &c.id).as_deref(), Some("PAUSED"), "still paused after the checkpoint");
    ctr_ok(NS, &["images", "rm", &name]);

    // into a directory (--image-path), CRIU's log kept in the given --work-path
    let dir = TempDir::new("ckpt-paused");
    let (img, work) = (dir.path().join("image"), dir.path().join("work"));
    ctr_ok(NS, &["task", "checkpoint", "--image-path", img.to_str().unwrap(), "--work-path", work.to_str().unwrap(), &c.id]);
    assert!(img.join("inventory.img").is_file(), "no inventory.img in {}", img.display());
    let pages: u64 = std::fs::read_dir(&img)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(pages > 0, "no memory pages in {}", img.display());
    assert!(work.join("dump.log").is_file(), "CRIU's dump.log not kept in the work path {}", work.display());
    assert_eq!(task_status(NS, &c.id).as_deref(), Some("PAUSED"));

    ctr_ok(NS, &["task", "resume", &c.id]);
    wait_task_status(NS, &c.id, "RUNNING");
    assert_eq!(counter(&addr, &["get", "inc"]), ["2", "3"]);
}

/// `ctr t checkpoint` (CheckpointOptions.exit = false) leaves the task
/// running; `ctr t checkpoint --exit` (exit = true) leaves it stopped.
#[test]
fn checkpoint_exit_option_stops_the_task() {
    let pod = net_pod("ckpt-exit");
    let c = run_in_pod(&pod, "ckpt-exit", &["counter", "--port", "8080"]);
    let images = TaskCheckpointImages::new(NS, &c.id);
    let addr = pod.addr(8080);
    assert_eq!(counter(&addr, &["inc", "inc"]), ["1", "2"]);

    let name = ctr_ok(NS, &["task", "checkpoint", &c.id]).trim().to_string();
    assert_eq!(images.list(), std::slice::from_ref(&name));
    assert_eq!(task_status(NS, &c.id).as_deref(), Some("RUNNING"), "without --exit the task keeps running");
    assert_eq!(counter(&addr, &["get"]), ["2"]);
    // (the image name has a one-second resolution: make room for the next one)
    ctr_ok(NS, &["images", "rm", &name]);

    let name = ctr_ok(NS, &["task", "checkpoint", "--exit", &c.id]).trim().to_string();
    wait_task_status(NS, &c.id, "STOPPED");
    assert_refused(&addr, "the task was checkpointed with --exit");
    let files = criu_image_files(NS, &name);
    assert!(files.iter().any(|f| f == "inventory.img"), "CRIU image files: {files:?}");
    let out = ctr(NS, &["task", "delete", &c.id]);
    assert!(out.success(), "{out}");
}

// ------------------------------------------------------------ crictl + checkpointctl

/// `crictl checkpoint --export` writes an archive that checkpointctl reads;
/// the container keeps running.
#[test]
fn crictl_checkpoint_export_is_readable_by_checkpointctl() {
    let checkpointctl = find_tool("TORPOR_CHECKPOINTCTL", "checkpointctl");
    let pod = Pod::run("ckpt-export");
    let cid = pod.start_actor("counter", &["counter", "--port", "8080"]);
    wait_container_state(&cid, "CONTAINER_RUNNING");
    let addr = format!("{}:8080", pod.ip());
    assert_eq!(counter(&addr, &["inc", "inc"]), ["1", "2"]);

    let archive = pod.dir().join("checkpoint.tar");
    let archive_s = archive.to_string_lossy().into_owned();
    let out = crictl(&["checkpoint", &format!("--export={archive_s}"), &cid]);
    assert!(out.success(), "{out}");
    assert_eq!(container_state(&cid), "CONTAINER_RUNNING", "crictl checkpoint leaves the container running");
    assert_eq!(counter(&addr, &["get", "inc"]), ["2", "3"]);

    let listing = run("tar", ["-tf", archive_s.as_str()]).ok();
    for want in ["checkpoint/inventory.img", "config.dump", "spec.dump"] {
        assert!(listing.lines().any(|l| l.trim_start_matches("./") == want), "{want} not in the archive:\n{listing}");
    }

    let show = run(&checkpointctl, ["show", archive_s.as_str()]);
    assert!(show.success(), "{show}");
    assert!(show.stdout.contains("counter"), "{show}");
    assert!(show.stdout.contains(&runtime_type()), "{show}");

    let plain = run(&checkpointctl, ["inspect", archive_s.as_str()]);
    assert!(plain.success(), "{plain}");

    let out = run(&checkpointctl, ["inspect", "--format", "json", "--ps-tree", "--files", "--sockets", "--mounts", archive_s.as_str()]);
    assert!(out.success(), "{out}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("checkpointctl inspect JSON: {e}\n{out}"));
    let c = &v[0];
    assert_eq!(c["container_name"], "counter", "{c}");
    assert_eq!(c["runtime"], runtime_type().as_str(), "{c}");
    assert_eq!(c["engine"], "containerd", "{c}");
    assert_eq!(c["process_tree"]["command"], "actor", "{c}");
    assert!(c["checkpoint_size"]["memory_pages_size"].as_u64().unwrap_or(0) > 0, "{c}");
    let listening = c["sockets"].as_array().into_iter().flatten().any(|p| {
        p["open_sockets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["protocol"] == "TCP" && s["data"]["state"] == "LISTEN" && s["data"]["src_port"] == 8080)
    });
    assert!(listening, "the counter's listening socket is in the checkpoint: {c}");
}

// ------------------------------------------------------------------ failures

/// A stopped container cannot be checkpointed: a clear error, no image.
#[test]
fn checkpoint_of_a_stopped_container_fails_clearly() {
    require_rig();
    let id = unique_name("ckpt-stopped");
    let _c = CtrContainer::new(NS, &id);
    let images = TaskCheckpointImages::new(NS, &id);
    ctr_run(NS, &["-d"], &id, &["/actor", "exit", "0"]).ok();
    wait_task_status(NS, &id, "STOPPED");

    let out = ctr(NS, &["task", "checkpoint", &id]);
    assert!(!out.success(), "{out}");
    assert!(out.stderr.to_lowercase().contains("stopped"), "error does not say the task is stopped: {out}");
    let name = format!("localhost/torpor-test/checkpoint/{id}:1");
    let _image = CheckpointImage { ns: NS.into(), name: name.clone() };
    let out = ctr(NS, &["containers", "checkpoint", "--rw", "--task", &id, &name]);
    assert!(!out.success(), "{out}");
    assert!(out.stderr.to_lowercase().contains("stopped"), "error does not say the task is stopped: {out}");
    let ls = ctr_ok(NS, &["images", "ls", "-q"]);
    assert!(!ls.lines().any(|l| l.trim() == name), "checkpoint image created anyway:\n{ls}");
    assert!(images.list().is_empty(), "checkpoint image created anyway: {:?}", images.list());
    assert_eq!(task_status(NS, &id).as_deref(), Some("STOPPED"));
    let out = ctr(NS, &["task", "delete", &id]);
    assert!(out.success(), "{out}");

    // CRI: only running containers can be checkpointed
    let pod = Pod::run("ckpt-stopped");
    let cid = pod.start_actor("exits", &["exit", "0"]);
    wait_exited(&cid);
    let archive = pod.dir().join("checkpoint.tar");
    let out = crictl(&["checkpoint", &format!("--export={}", archive.display()), &cid]);
    assert!(!out.success(), "{out}");
    assert!(out.all_output().to_lowercase().contains("exited"), "error does not say the container exited: {out}");
    assert!(!archive.exists(), "archive written for a failed checkpoint");
}

/// A CRIU dump failure (an established TCP connection, and no
/// CheckpointOptions.open_tcp) is reported, quoting CRIU's log; the container
/// keeps running and the connection keeps working.
#[test]
fn failed_dump_reports_criu_error_and_keeps_the_container_running() {
    let pod = net_pod("ckpt-dumpfail");
    let c = run_in_pod(&pod, "ckpt-dumpfail", &["counter", "--port", "8080"]);
    let addr = pod.addr(8080);
    let held = connect_with_retry(&addr);
    assert_eq!(counter_on(&held, &["inc", "inc"]), ["1", "2"]);

    let name = format!("localhost/torpor-test/checkpoint/{}:1", c.id);
    let _image = CheckpointImage { ns: NS.into(), name: name.clone() };
    let out = ctr(NS, &["containers", "checkpoint", "--rw", "--task", &c.id, &name]);
    assert!(!out.success(), "checkpoint with an established TCP connection succeeded: {out}");
    assert!(out.stderr.to_lowercase().contains("criu"), "error does not name CRIU: {out}");
    if is_torpor() {
        // torpor quotes CRIU's error lines and keeps the whole log beside the bundle
        assert!(out.stderr.contains("Connected TCP socket"), "CRIU's reason is not quoted: {out}");
        let log = bundle_dir(NS, &c.id).join("criu-dump.log");
        assert!(out.stderr.contains(&log.to_string_lossy().into_owned()), "error does not name {}: {out}", log.display());
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert!(text.contains("Dumping FAILED"), "{} holds:\n{text}", log.display());
    }
    let ls = ctr_ok(NS, &["images", "ls", "-q"]);
    assert!(!ls.lines().any(|l| l.trim() == name), "checkpoint image created for a failed dump:\n{ls}");

    assert_eq!(task_status(NS, &c.id).as_deref(), Some("RUNNING"), "the container keeps running");
    assert_eq!(counter_on(&held, &["inc"]), ["3"], "the held connection still works");
    assert_eq!(counter(&addr, &["get"]), ["3"]);
}

/// Restoring from a checkpoint that does not exist, or whose CRIU image is
/// empty, missing pages or corrupted, fails with a clear error and leaves
/// nothing behind; the intact checkpoint still restores afterwards.
#[test]
fn restore_from_missing_or_corrupted_checkpoint_fails_clearly() {
    let pod = net_pod("ckpt-corrupt");
    let c = run_in_pod(&pod, "ckpt-corrupt", &["counter", "--port", "8080"]);
    let addr = pod.addr(8080);
    assert_eq!(counter(&addr, &["inc", "inc", "inc"]), ["1", "2", "3"]);
    let image = checkpoint_container(NS, &c.id);
    remove_task_and_container(NS, &c.id);
    assert_refused(&addr, "the task was deleted");

    // an image that does not exist (nowhere to fetch it from)
    {
        let rid = unique_name("ckpt-missing");
        let _r = CtrContainer::new(NS, &rid);
        let out = ctr(NS, &["containers", "restore", "--rw", "--live", &rid, "localhost:1/torpor-test/no-such-checkpoint:1"]);
        assert!(!out.success(), "{out}");
        assert!(out.stderr.contains("no-such-checkpoint"), "error does not name the checkpoint: {out}");
        let ls = ctr_ok(NS, &["containers", "ls", "-q"]);
        assert!(!ls.lines().any(|l| l.trim() == rid), "container created from a missing checkpoint:\n{ls}");
        assert_nothing_left(NS, &rid);
    }

    let blob = criu_blob(NS, &image.name);
    type Mutation = (&'static str, fn(&Path), &'static [&'static str]);
    let cases: [Mutation; 3] = [
        // (what, mutation of the CRIU image dir, what torpor's error must quote)
        (
            "empty CRIU image",
            |dir| {
                for e in std::fs::read_dir(dir).unwrap().flatten() {
                    std::fs::remove_file(e.path()).unwrap();
                }
            },
            &["inventory.img"],
        ),
        (
            "garbage inventory.img",
            |dir| std::fs::write(dir.join("inventory.img"), b"this is not a CRIU image, just some garbage bytes\n").unwrap(),
            &["inventory.img", "criu-restore.log"],
        ),
        (
            "pages missing",
            |dir| {
                for e in std::fs::read_dir(dir).unwrap().flatten() {
                    if e.file_name().to_string_lossy().starts_with("pages-") {
                        std::fs::remove_file(e.path()).unwrap();
                    }
                }
            },
            &["pages", "criu-restore.log"],
        ),
    ];
    for (what, mutate, torpor_quotes) in cases {
        let _bad = CorruptedBlob::new(&blob, mutate);
        let rid = unique_name("ckpt-bad");
        let _r = CtrContainer::new(NS, &rid);
        let out = restore(NS, &rid, &image);
        assert!(!out.success(), "restore from a checkpoint with {what} succeeded: {out}");
        let err = out.stderr.to_lowercase();
        assert!(err.contains("restore") || err.contains("criu") || err.contains("checkpoint"), "{what}: unclear error: {out}");
        if is_torpor() {
            for q in torpor_quotes {
                assert!(out.stderr.contains(q), "{what}: error does not mention {q:?}: {out}");
            }
        }
        // no half-restored process; the task (if ctr left one) is only created
        let status = task_status(NS, &rid);
        assert!(matches!(status.as_deref(), None | Some("CREATED")), "{what}: task is {status:?}");
        assert_refused(&addr, &format!("the restore from a checkpoint with {what} failed"));
        if status.is_some() {
            let out = ctr(NS, &["task", "delete", &rid]);
            assert!(out.success(), "{what}: {out}");
        }
        ctr_ok(NS, &["containers", "rm", &rid]);
        wait_for(&format!("the shim of {rid} to exit"), LIVENESS, || processes_mentioning(&rid).is_empty().then_some(()));
        assert_nothing_left(NS, &rid);
    }

    // the intact checkpoint still restores, into the same sandbox
    let out = restore(NS, &c.id, &image);
    assert!(out.success(), "{out}");
    wait_task_status(NS, &c.id, "RUNNING");
    assert_eq!(counter(&addr, &["get", "inc"]), ["3", "4"]);
}

// ------------------------------------------------------- CRIU missing / old

/// A second, private containerd (test/rig/up.sh with its own names) whose
/// PATH, and so its shims' PATH, has no `criu`. Torn down (down.sh --purge)
/// on drop.
struct CriulessRig {
    env: Vec<(String, String)>,
    address: String,
    bin: PathBuf,
    /// Its cgroup parent (`TORPOR_RIG_CGROUP`): its down.sh removes it.
    cgroup: String,
}

impl CriulessRig {
    #[track_caller]
    fn up() -> CriulessRig {
        require_rig();
        let rig_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/rig");
        let state = format!("{}-nocriu", rig().state_dir);
        let root = format!("{}-nocriu", std::env::var("TORPOR_RIG_ROOT").unwrap_or_else(|_| "/var/lib/torpor-test".into()));
        let tag = state.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
        // PATH without any directory holding criu (runc must stay reachable)
        let path = std::env::var("PATH").unwrap_or_default();
        let kept: Vec<&str> = path
            .split(':')
            .chain(["/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
            .filter(|d| !d.is_empty() && !Path::new(d).join("criu").exists())
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        let kept: Vec<&str> = kept.into_iter().filter(|d| seen.insert(*d)).collect();
        assert!(
            kept.iter().any(|d| Path::new(d).join("runc").is_file()),
            "cannot hide criu from a containerd: runc is only in a directory that also holds criu (PATH {path})"
        );
        let bin = PathBuf::from(&state).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let shim_dir = std::env::var("TORPOR_SHIM_DIR")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release").to_string());
        let shim = Path::new(&shim_dir).join("containerd-shim-torpor-v1");
        if shim.is_file() {
            std::fs::copy(&shim, bin.join("containerd-shim-torpor-v1")).unwrap();
        } else if is_torpor() {
            panic!("{} not built (cargo build --release -p torpor-shim)", shim.display());
        }
        let cni_net = format!("{}-nocriu", std::env::var("TORPOR_RIG_CNI_NETWORK").unwrap_or_else(|_| "torpor-test".into()));
        let cgroup = format!("{}-nocriu", rig().cgroup);
        let env = vec![
            ("PATH".to_string(), kept.join(":")),
            ("TORPOR_RIG_STATE".into(), state.clone()),
            ("TORPOR_RIG_ROOT".into(), root),
            ("TORPOR_RIG_CNI_NETWORK".into(), cni_net),
            ("TORPOR_RIG_BRIDGE".into(), format!("tpc{:08x}", tag)),
            ("TORPOR_RIG_SUBNET".into(), format!("10.{}.0.0/16", 250 + tag % 5)),
            ("TORPOR_RIG_CGROUP".into(), cgroup.clone()),
            ("TORPOR_SHIM_DIR".into(), bin.to_string_lossy().into_owned()),
            // one node is enough here
            ("TORPOR_RIG_NODE_B".into(), "0".into()),
        ];
        let me = CriulessRig { env, address: format!("{state}/containerd.sock"), bin, cgroup };
        let out = me.script(&format!("{rig_dir}/up.sh"), &[]);
        if !out.success() {
            // up.sh may trip over its own image check on a loaded machine; it is idempotent
            let again = me.script(&format!("{rig_dir}/up.sh"), &[]);
            assert!(again.success(), "second containerd did not come up:\n{out}\n{again}");
        }
        me
    }

    fn script(&self, script: &str, args: &[&str]) -> Output {
        let mut a: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        a.push("bash".into());
        a.push(script.into());
        a.extend(args.iter().map(|s| s.to_string()));
        run_with("env", a, None, COMMAND_LIMIT)
    }

    #[track_caller]
    fn ctr(&self, args: &[&str]) -> Output {
        let mut a = vec!["--address", self.address.as_str(), "-n", NS];
        a.extend_from_slice(args);
        run(&rig().ctr, a)
    }

    #[track_caller]
    fn task_status(&self, id: &str) -> Option<String> {
        task_status_in(&self.ctr(&["task", "ls"]).ok(), id)
    }
}

impl Drop for CriulessRig {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let out = self.script(concat!(env!("CARGO_MANIFEST_DIR"), "/rig/down.sh"), &["--purge"]);
            if !out.success() {
                eprintln!("tearing down the CRIU-less containerd: {out}");
            }
        }));
    }
}

/// With no `criu` in the shim's PATH, and with a `criu` too old to speak
/// runc's protocol, a checkpoint fails with an error that names CRIU, the
/// container keeps running, no checkpoint is left.
#[test]
fn checkpoint_without_usable_criu_fails_clearly() {
    let side = CriulessRig::up();
    let id = unique_name("ckpt-nocriu");
    let run = ctr_run_args(&side.cgroup, NS, &["-d"], &id, &["/actor", "counter"]);
    let out = side.ctr(&run.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.success(), "{out}");
    wait_for("the task to run", LIVENESS, || (side.task_status(&id).as_deref() == Some("RUNNING")).then_some(()));

    let checkpoints = || -> Vec<String> {
        let prefix = format!("containerd.io/checkpoint/{id}:");
        side.ctr(&["images", "ls", "-q"]).ok().lines().filter(|l| l.starts_with(&prefix)).map(str::to_string).collect()
    };

    // no criu at all
    let out = side.ctr(&["task", "checkpoint", &id]);
    assert!(!out.success(), "checkpoint without criu succeeded: {out}");
    let err = out.stderr.to_lowercase();
    assert!(err.contains("criu") && err.contains("not found"), "error does not say criu is missing: {out}");
    assert_eq!(side.task_status(&id).as_deref(), Some("RUNNING"), "the container keeps running");
    assert!(checkpoints().is_empty(), "{:?}", checkpoints());

    // a criu that is too old: reports its version, speaks no RPC
    let stub = side.bin.join("criu");
    std::fs::write(&stub, "#!/bin/sh\ncase \"$1\" in --version|-V) echo 'Version: 3.17.1'; exit 0;; esac\nexit 1\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = side.ctr(&["task", "checkpoint", &id]);
    assert!(!out.success(), "checkpoint with an old criu succeeded: {out}");
    assert!(out.stderr.to_lowercase().contains("criu"), "error does not name CRIU: {out}");
    if is_torpor() {
        assert!(out.stderr.contains("3.17.1"), "error does not say which CRIU version was found (too old): {out}");
    }
    assert_eq!(side.task_status(&id).as_deref(), Some("RUNNING"), "the container keeps running");
    assert!(checkpoints().is_empty(), "{:?}", checkpoints());

    let _ = side.ctr(&["task", "kill", "-s", "SIGKILL", &id]);
    wait_for("the task to stop", LIVENESS, || matches!(side.task_status(&id).as_deref(), None | Some("STOPPED")).then_some(()));
    let out = side.ctr(&["task", "delete", &id]);
    assert!(out.success(), "{out}");
    let out = side.ctr(&["containers", "rm", &id]);
    assert!(out.success(), "{out}");
}
