//! Checkpoints and restores that fail: a stopped container, CRIU failing
//! to dump, a missing, empty or corrupted checkpoint. Each gives a clear
//! error and leaves nothing behind.

use std::path::{Path, PathBuf};

use torpor_tests::*;

use crate::{
    assert_refused, checkpoint_container, counter, counter_on, criu_blob, net_pod, remove_task_and_container, restore, run_in_pod,
    CheckpointImage, OsStrArg, TaskCheckpointImages, NS,
};

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
