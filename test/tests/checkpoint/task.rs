//! `ctr t checkpoint` of a paused and of a running task, with and without
//! `--exit`.

use torpor_tests::*;

use crate::{assert_refused, counter, criu_image_files, net_pod, run_in_pod, TaskCheckpointImages, NS};

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
