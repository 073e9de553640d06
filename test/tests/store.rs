//! Actors' checkpoints in the node's snapshot store (torpor-snapshotter's
//! tiered store, the rig's S3 server as its object tier): suspend puts a
//! snapshot in the store, resume checks it out (fetched from S3 when the
//! local copy was evicted), a new pod of the same identity is restored from
//! it; corrupt data is refused; S3 or the daemon going away loses nothing.
//!
//! The tests stop S3 and kill the daemon, so they run one at a time
//! (`SERIAL`). torpor-only: under TORPOR_TEST_RUNTIME=runc each test
//! returns early.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn torpor_only() -> bool {
    if !is_torpor() {
        eprintln!("runtime {} is not torpor: no actor to suspend", runtime_handler());
        return false;
    }
    true
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("${name} is not set: run the tests through test/rig/run-tests.sh"))
}

/// A counter pod (`alloc` MiB of checked memory) and its actor id.
struct Counter {
    pod: Pod,
    container: String,
    ip: String,
    actor: String,
}

impl Counter {
    #[track_caller]
    fn start(pod: Pod, actor: &str, alloc_mib: u32, attempt: u32) -> Counter {
        let alloc = alloc_mib.to_string();
        let mut config = container_config("counter", &["counter", "--port", "8080", "--alloc-mib", &alloc]);
        config["metadata"]["attempt"] = attempt.into();
        config["linux"]["security_context"] = serde_json::json!({"namespace_options": {"pid": 1}});
        let container = pod.create(&config);
        crictl_ok(&["start", &container]);
        wait_container_state(&container, "CONTAINER_RUNNING");
        let ip = pod.ip();
        Counter { pod, container, ip, actor: actor.to_string() }
    }

    #[track_caller]
    fn cmd(&self, cmd: &str) -> String {
        counter_cmd(&format!("{}:8080", self.ip), cmd)
    }

    fn shim(&self) -> &str {
        &self.pod.id
    }

    /// Counts to `n`; returns the memory checksum.
    #[track_caller]
    fn count_to(&self, n: u32) -> String {
        for i in 1..=n {
            assert_eq!(self.cmd("inc"), i.to_string());
        }
        self.cmd("sum")
    }

    /// The live actor record `torporctl --json status` shows.
    #[track_caller]
    fn status(&self) -> Value {
        let out = torporctl_run(&["--json", "status", self.shim()]);
        let v: Value = serde_json::from_str(&out.clone().ok()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
        v[0]["actor"].clone()
    }

    /// `torporctl suspend`, then waits for the commit: the snapshot's name.
    #[track_caller]
    fn suspend(&self) -> String {
        let out = torporctl_run(&["--json", "suspend", self.shim()]);
        assert!(out.success(), "suspend: {out}");
        let st = wait_for("the suspend's snapshot to be committed", LIVENESS, || {
            let st = self.status();
            st["snapshot"].is_object().then_some(st)
        });
        assert_eq!(st["state"], "SUSPENDED", "{st}");
        assert_eq!(st["snapshot"]["actor"], self.actor.as_str(), "{st}");
        format!("{}@{}", self.actor, st["snapshot"]["generation"])
    }

    /// Counter processes in the container's cgroup.
    fn processes(&self) -> Vec<String> {
        let mut found = Vec::new();
        let Ok(rd) = std::fs::read_dir("/proc") else { return found };
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            // comm, not cmdline: cmdline is read from the process's memory,
            // which right after a lazy-pages restore may not be there yet.
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if cg.contains(&self.container) && comm.trim() == "actor" {
                found.push(format!("pid {pid}: {}", comm.trim()));
            }
        }
        found
    }
}

fn snapshot(name: &str) -> Value {
    let actor = name.rsplit_once('@').map(|(a, _)| a).unwrap_or(name);
    let all = store_snapshots(actor);
    all.into_iter().find(|s| s["snapshot"] == name).unwrap_or_else(|| panic!("{name} is not in the store"))
}

#[track_caller]
fn snapshots_ok(args: &[&str]) -> String {
    let mut a = vec!["snapshots"];
    a.extend_from_slice(args);
    let out = torporctl_run(&a);
    assert!(out.success(), "torporctl {}: {out}", a.join(" "));
    out.stdout
}

fn wait_durable(name: &str, limit: Duration) {
    wait_for(&format!("{name} to be durable in S3"), limit, || (snapshot(name)["durable"] == true).then_some(()));
}

/// The rig's S3 server: stopped by a test, always started again on drop.
struct S3Down;

impl S3Down {
    #[track_caller]
    fn stop() -> S3Down {
        let out = run(&s3_sh(), ["stop"]);
        assert!(out.success(), "s3.sh stop: {out}");
        S3Down
    }
}

impl Drop for S3Down {
    fn drop(&mut self) {
        let out = run(&s3_sh(), ["start"]);
        if !out.success() {
            eprintln!("s3.sh start: {out}");
        }
    }
}

fn s3_sh() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/rig/s3.sh").to_string()
}

/// Starts S3 on drop (a failed test must not leave it stopped).
struct S3Up;

impl Drop for S3Up {
    fn drop(&mut self) {
        let _ = run(&s3_sh(), ["start"]);
    }
}

/// SIGKILL of the rig's torpor-snapshotter, and its restart (up.sh reuses
/// everything else).
fn kill_daemon() {
    let pidfile = env("TORPOR_RIG_SNAPSHOTTER_PIDFILE");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("read {pidfile}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("pid in {pidfile}: {e}"));
    let out = run("kill", ["-KILL", &pid.to_string()]);
    assert!(out.success(), "kill -KILL {pid}: {out}");
    wait_for("the daemon to die", LIVENESS, || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()));
}

/// Restarts the daemon if it is not running (also on drop: a failed test
/// must not leave the rig without its snapshotter).
struct DaemonUp;

impl Drop for DaemonUp {
    fn drop(&mut self) {
        start_daemon();
    }
}

fn start_daemon() {
    let up = concat!(env!("CARGO_MANIFEST_DIR"), "/rig/up.sh");
    let out = run_with(up, Vec::<&str>::new(), None, COMMAND_LIMIT);
    if !out.success() {
        eprintln!("up.sh: {out}");
    }
}

/// Starts the daemon with the object tier's key under another id (a key
/// of its own, generated by up.sh): the rig's key is not in its ring.
#[track_caller]
fn start_daemon_with_key(key_id: &str) {
    let up = concat!(env!("CARGO_MANIFEST_DIR"), "/rig/up.sh");
    let var = format!("TORPOR_RIG_STORE_KEY_ID={key_id}");
    let out = run_with("env", [var.as_str(), up], None, COMMAND_LIMIT);
    assert!(out.success(), "up.sh with key {key_id}: {out}");
}

/// The daemon runs with the rig's key again when dropped (killed and
/// restarted if a test left it with another one).
struct RigKey(bool);

impl Drop for RigKey {
    fn drop(&mut self) {
        if self.0 {
            kill_daemon();
            start_daemon();
        }
    }
}

/// The transfers the store reports (`snapshots status --json`).
fn transfers(kind: &str, name: &str) -> Vec<Value> {
    let out = torporctl_run(&["--json", "snapshots", "status"]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    v["transfers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["kind"] == kind && t["snapshot"] == name)
        .cloned()
        .collect()
}

/// Flips one byte of `path` at `offset` (twice = repaired).
fn flip(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut b = [0u8];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

/// The manifest of a snapshot: (path, first chunk digest, size) of its largest file.
fn largest_file(name: &str) -> (String, String, u64) {
    let out = snapshots_ok(&["--json", "inspect", name]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("inspect is not JSON ({e}): {out}"));
    let m = &v["manifest"]["manifest"];
    let m = if m.is_object() { m } else { &v["manifest"] };
    let e = m["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "file")
        .max_by_key(|e| e["size"].as_u64().unwrap_or(0))
        .unwrap_or_else(|| panic!("no file in the manifest of {name}: {v}"))
        .clone();
    let digest = e["chunks"][0]["digest"].as_str().unwrap_or_else(|| panic!("no chunk: {e}")).to_string();
    (e["path"].as_str().unwrap().to_string(), digest, e["size"].as_u64().unwrap())
}

/// The file of chunk `digest`'s object in the rig's S3 data (sealed chunks
/// are named by a keyed hash of their digest: `inspect` says which).
fn chunk_object(name: &str, digest: &str) -> PathBuf {
    let out = snapshots_ok(&["--json", "inspect", name]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("inspect is not JSON ({e}): {out}"));
    let key = v["chunk_objects"][digest].as_str().unwrap_or_else(|| panic!("no object for chunk {digest} in: {}", v["chunk_objects"]));
    let file = PathBuf::from(env("TORPOR_RIG_S3_DIR")).join(env("TORPOR_RIG_S3_BUCKET")).join(key);
    assert!(file.is_file(), "chunk {digest}: {} is not a file", file.display());
    assert!(key.contains(&format!("chunks/hmac-sha256/{}/", env("TORPOR_RIG_STORE_KEY_ID"))), "the rig's object tier is sealed: {key}");
    file
}

fn pod_opts(actor: Option<&str>) -> PodOptions {
    PodOptions {
        annotations: actor.map(|a| BTreeMap::from([("torpor.dev/actor".to_string(), a.to_string())])).unwrap_or_default(),
        runtime: None,
    }
}

/// A counter in a new pod (default actor id) counted to 3.
#[track_caller]
fn counter(prefix: &str, alloc_mib: u32) -> (Counter, String, SnapshotsGuard) {
    let pod = Pod::run_with(prefix, pod_opts(None));
    let actor = default_actor(&pod.name);
    let guard = SnapshotsGuard(actor.clone());
    let c = Counter::start(pod, &actor, alloc_mib, 0);
    let sum = c.count_to(3);
    (c, sum, guard)
}

/// The counter continues where it was, with its memory intact.
#[track_caller]
fn assert_continues(c: &Counter, sum: &str) {
    assert_eq!(c.cmd("get"), "3", "the counter continues from the snapshot");
    assert_eq!(c.cmd("sum"), sum, "the memory came back intact");
    assert_eq!(c.cmd("inc"), "4");
    assert_eq!(c.processes().len(), 1, "one counter process: {:?}", c.processes());
}

// ------------------------------------------------------------------ tests

#[test]
fn resume_fetches_an_evicted_snapshot_from_s3() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let (c, sum, _g) = counter("store-evict", 64);
    let name = c.suspend();
    let st = c.status();
    assert!(st["staging"].is_null(), "committed: {st}");
    let s = snapshot(&name);
    assert_eq!(s["local"], true, "{s}");
    assert_eq!(s["labels"]["torpor.dev/containers"], "counter", "{s}");
    assert_eq!(s["labels"]["torpor.dev/shim"], c.shim(), "{s}");
    snapshots_ok(&["upload", &name]);
    assert_eq!(snapshot(&name)["durable"], true);
    snapshots_ok(&["evict", &name]);
    assert_eq!(snapshot(&name)["local"], false, "evicted");
    // An inbound request resumes it: fetched from S3.
    assert_continues(&c, &sum);
    assert_eq!(c.status()["state"], "RUNNING");
    assert_eq!(snapshot(&name)["local"], true, "fetched back");
}

#[test]
fn s3_down_suspend_succeeds_and_the_upload_retries() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let _daemon = DaemonUp;
    let (c, sum, _g) = counter("store-s3down", 64);
    let down = S3Down::stop();
    let name = c.suspend();
    assert_eq!(snapshot(&name)["local"], true);
    let out = torporctl_run(&["snapshots", "upload", &name]);
    assert!(!out.success(), "an upload with S3 down must fail: {out}");
    assert!(out.stderr.contains(&name), "the error names the snapshot: {out}");
    eprintln!("upload with S3 down: {}", out.stderr.trim());
    let out = torporctl_run(&["snapshots", "evict", &name]);
    assert!(!out.success(), "evict of a snapshot that is not durable must be refused: {out}");
    assert!(out.stderr.contains("durable"), "the refusal says why: {out}");
    assert_eq!(snapshot(&name)["local"], true, "the local copy stays");
    drop(down);
    // The background upload retries and completes.
    wait_durable(&name, LIVENESS);
    snapshots_ok(&["evict", &name]);
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(out.success(), "resume from S3: {out}");
    assert_continues(&c, &sum);
}

#[test]
fn corrupt_chunk_in_s3_refuses_the_resume() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let (c, sum, _g) = counter("store-badchunk", 64);
    let name = c.suspend();
    snapshots_ok(&["upload", &name]);
    snapshots_ok(&["evict", &name]);
    let (_, digest, _) = largest_file(&name);
    let chunk = chunk_object(&name, &digest);
    let len = std::fs::metadata(&chunk).unwrap().len();
    flip(&chunk, len / 2);
    assert_refused(&c, &name);
    // Repaired, the same snapshot resumes: nothing was lost.
    flip(&chunk, len / 2);
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(out.success(), "resume after the repair: {out}");
    assert_continues(&c, &sum);
}

#[test]
fn corrupt_local_copy_refuses_the_resume() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let (c, sum, _g) = counter("store-badlocal", 64);
    let name = c.suspend();
    let (path, _, size) = largest_file(&name);
    let generation: u64 = name.rsplit_once('@').unwrap().1.parse().unwrap();
    let file = PathBuf::from(env("TORPOR_RIG_SNAPSHOTTER_ROOT"))
        .join("store/snapshots")
        .join(&c.actor)
        .join("_gen")
        .join(format!("{generation:020}"))
        .join(&path);
    assert!(file.is_file(), "the local copy at {}", file.display());
    flip(&file, size / 2);
    assert_refused(&c, &name);
    flip(&file, size / 2);
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(out.success(), "resume after the repair: {out}");
    assert_continues(&c, &sum);
}

/// A resume from bad data is refused, naming the snapshot; nothing starts.
#[track_caller]
fn assert_refused(c: &Counter, name: &str) {
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(!out.success(), "a resume from corrupt data must be refused: {out}");
    assert!(out.stderr.contains(name), "the error names the snapshot {name}: {out}");
    assert!(out.stderr.to_lowercase().contains("corrupt") || out.stderr.contains("mismatch") || out.stderr.contains("digest"), "the error says the data is bad: {out}");
    eprintln!("refused: {}", out.stderr.trim());
    let st = c.status();
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    assert!(st["last_error"].as_str().is_some_and(|e| e.contains(name)), "torporctl status has the error: {st}");
    assert!(c.processes().is_empty(), "nothing started from bad data: {:?}", c.processes());
    assert_eq!(container_state(&c.container), "CONTAINER_RUNNING", "to CRI it still runs");
}

#[test]
fn restore_by_identity_through_the_store() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let actor = format!("store-test/{}", unique_name("id"));
    let _g = SnapshotsGuard(actor.clone());
    let first = Counter::start(Pod::run_with("store-id-a", pod_opts(Some(&actor))), &actor, 64, 0);
    let sum = first.count_to(3);
    let name = first.suspend();
    // The pod goes away: the suspended actor's snapshot stays in the store.
    let Counter { pod, .. } = first;
    pod.remove();
    assert_eq!(snapshot(&name)["local"], true);

    // A new pod (new sandbox, new container ids) of the same actor.
    let second = Counter::start(Pod::run_with("store-id-b", pod_opts(Some(&actor))), &actor, 64, 0);
    assert_continues(&second, &sum);
    let st = second.status();
    assert_eq!(st["state"], "RUNNING", "{st}");
    assert_eq!(st["recovered_from"], name.as_str(), "{st}");

    // A third pod of the actor while the second runs: refused.
    let third = Pod::run_with("store-id-c", pod_opts(Some(&actor)));
    // (CRI creates the task, and the shim sees the container, at its start.)
    let created = third.try_create(&container_config("counter", &["counter", "--port", "8080"])).unwrap_or_else(|o| panic!("crictl create: {o}"));
    let out = crictl(&["start", &created]);
    assert!(!out.success(), "a second pod of a running actor must be refused: {out}");
    let text = out.all_output();
    assert!(text.contains(&format!("actor {actor} already runs on this node")) && text.contains(second.shim()), "the refusal names the actor and its holder: {out}");
    assert_eq!(second.cmd("get"), "4", "the running one is untouched");
}

#[test]
fn daemon_killed_mid_upload_and_mid_fetch() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let _daemon = DaemonUp;
    let (c, sum, _g) = counter("store-kill", 256);
    let _s3 = S3Up;
    let name = c.suspend();

    // Mid-upload. The actors' memory is the same pseudo-random pattern in
    // every test (test/images/actor), so on a rig that uploaded it before
    // every chunk is deduplicated and an upload is over in milliseconds:
    // the upload is held in flight by a stopped S3 instead (persisted
    // `Uploading`, chunk PUTs failing and retried) when the daemon dies.
    let down = S3Down::stop();
    let out = torporctl_run(&["snapshots", "upload", &name]);
    assert!(!out.success(), "an upload with S3 down must fail: {out}");
    let s = snapshot(&name);
    assert_eq!(s["durable"], false, "{s}");
    assert_eq!(s["state"], "uploading", "the upload is pending: {s}");
    kill_daemon();
    drop(down);
    start_daemon();
    // The interrupted upload resumes by itself after the restart.
    wait_durable(&name, LIVENESS);
    snapshots_ok(&["evict", &name]);

    // Mid-fetch: the resume fails with the daemon gone; the actor stays
    // SUSPENDED, and a resume after the restart works.
    let shim = c.shim().to_string();
    let resume = std::thread::spawn(move || torporctl_run(&["--json", "resume", &shim]));
    wait_for("the fetch to be under way", LIVENESS, || {
        transfers("fetch", &name).iter().any(|t| t["done_bytes"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    kill_daemon();
    let out = resume.join().expect("resume thread");
    assert!(!out.success(), "the resume cannot succeed without the daemon: {out}");
    eprintln!("resume with the daemon killed: {}", out.stderr.trim());
    assert_eq!(c.status()["state"], "SUSPENDED");
    assert!(c.processes().is_empty(), "nothing started: {:?}", c.processes());
    start_daemon();
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(out.success(), "resume after the daemon's restart: {out}");
    assert_continues(&c, &sum);
}

#[test]
fn snapshot_under_an_unknown_key_is_refused_until_the_key_is_back() {
    if !torpor_only() {
        return;
    }
    let _serial = serial();
    let _daemon = DaemonUp;
    let rig_key = env("TORPOR_RIG_STORE_KEY_ID");
    let (c, sum, _g) = counter("store-key", 64);
    let name = c.suspend();
    snapshots_ok(&["upload", &name]);
    let s = snapshot(&name);
    assert_eq!(s["key_id"], rig_key.as_str(), "sealed under the rig's key: {s}");
    let listing = snapshots_ok(&["ls", &c.actor]);
    assert!(listing.contains("KEY") && listing.contains(&rig_key), "ls shows the key: {listing}");
    snapshots_ok(&["evict", &name]);

    // The daemon restarted with another key: the evicted snapshot cannot be
    // opened; the resume is refused naming the snapshot and the key id.
    let mut back = RigKey(true);
    kill_daemon();
    start_daemon_with_key("rig-other");
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(!out.success(), "a resume from a snapshot under an unknown key must be refused: {out}");
    assert!(out.stderr.contains(&name) && out.stderr.contains(&format!("key \"{rig_key}\"")), "the error names the snapshot and the key id: {out}");
    assert!(out.stderr.contains("does not have"), "the error says why: {out}");
    eprintln!("refused: {}", out.stderr.trim());
    let st = c.status();
    assert_eq!(st["state"], "SUSPENDED", "{st}");
    assert!(st["last_error"].as_str().is_some_and(|e| e.contains(&rig_key)), "torporctl status has the error: {st}");
    assert!(c.processes().is_empty(), "nothing started: {:?}", c.processes());
    assert_eq!(container_state(&c.container), "CONTAINER_RUNNING", "to CRI it still runs");
    assert_eq!(snapshot(&name)["local"], false, "nothing fetched");

    // The right key back: the resume works, the state is intact.
    kill_daemon();
    start_daemon();
    back.0 = false;
    let out = torporctl_run(&["--json", "resume", c.shim()]);
    assert!(out.success(), "resume with the key back: {out}");
    assert_continues(&c, &sum);
    assert_eq!(c.status()["state"], "RUNNING");
}
