//! SIGKILL in the middle of an upload and of a fetch: the store process is a
//! child (this test binary re-run as `crash_child`), killed for real while a
//! chunk request hangs; the next `open` resumes/cleans and nothing is lost.

mod store_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::time::Duration;

use store_common::*;
use torpor_store::{CommitOptions, LocalState, RemoteState, SnapshotId, Store};

const CHILD_ENV: &str = "TORPOR_STORE_CRASH_CHILD";
const SEED: u64 = 77;
const PAGES: usize = 8 * 1024 * 1024;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(mode: &str, root: &Path, objects: &Path, marker: &Path) -> Killed {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env("CRASH_ROOT", root)
        .env("CRASH_OBJECTS", objects)
        .env("CRASH_MARKER", marker)
        .spawn()
        .unwrap();
    Killed(child)
}

async fn kill_when_hung(mut child: Killed, marker: &Path) {
    let start = std::time::Instant::now();
    while !marker.exists() {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("crash child exited ({status}) before hanging");
        }
        assert!(start.elapsed() < Duration::from_secs(120), "crash child never reached its hang point");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.0.kill().unwrap(); // SIGKILL
    let status = child.0.wait().unwrap();
    assert!(!status.success());
}

fn expected_tree() -> (tempfile::TempDir, Tree) {
    let t = tempfile::tempdir().unwrap();
    write_tree(t.path(), SEED, PAGES);
    let tree = stored(&read_tree(t.path()));
    (t, tree)
}

fn dirs(tmp: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (tmp.join("store"), tmp.join("objects"), tmp.join("hung"))
}

/// Not a test: the child process of the crash tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run only as the child process of the crash tests"]
async fn crash_child() {
    let mode = std::env::var(CHILD_ENV).expect("crash_child runs only as a child of the crash tests");
    let root = PathBuf::from(std::env::var("CRASH_ROOT").unwrap());
    let objects = PathBuf::from(std::env::var("CRASH_OBJECTS").unwrap());
    let marker = PathBuf::from(std::env::var("CRASH_MARKER").unwrap());
    let (faulty, remote) = Faulty::over_dir(&objects, Some(marker));
    let store = Store::open_with_remote(config(&root, &objects), remote).await.unwrap();
    match mode.as_str() {
        "upload" => {
            let st = store.begin(&actor("crash/up")).await.unwrap();
            write_tree(&st.path, SEED, PAGES);
            let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
            faulty.hang_put_at.store(5, Ordering::SeqCst);
            let _ = store.upload(&info.id, None).await;
        }
        "fetch" => {
            faulty.hang_get_at.store(5, Ordering::SeqCst);
            let _ = store.checkout(&SnapshotId::new(actor("crash/fetch"), 1), None).await;
        }
        other => panic!("unknown crash mode {other}"),
    }
    panic!("the child was not killed while hung");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_upload_then_reopen_resumes_the_upload() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, objects, marker) = dirs(tmp.path());
    kill_when_hung(spawn_child("upload", &root, &objects, &marker), &marker).await;

    let store = Store::open(config(&root, &objects)).await.unwrap();
    let l = store.list(None).await.unwrap();
    assert_eq!(l.len(), 1);
    assert!(l[0].local && l[0].remote == RemoteState::Uploading, "{:?}", l[0]);
    let manifest = objects.join("actors/crash/up/_gen/00000000000000000001/manifest.json");
    assert!(!manifest.exists(), "no manifest before all chunks");
    store.run_background_pass().await.unwrap();
    let l = store.list(None).await.unwrap();
    assert!(l[0].durable, "{:?}", l[0]);
    store.evict(&l[0].id).await.unwrap();
    let co = store.checkout(&l[0].id, None).await.unwrap();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), expected_tree().1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_fetch_then_reopen_cleans_and_refetches() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, objects, marker) = dirs(tmp.path());
    {
        let store = Store::open(config(&root, &objects)).await.unwrap();
        let st = store.begin(&actor("crash/fetch")).await.unwrap();
        write_tree(&st.path, SEED, PAGES);
        let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
        store.upload(&info.id, None).await.unwrap();
        store.evict(&info.id).await.unwrap();
        store.shutdown().await;
    }
    kill_when_hung(spawn_child("fetch", &root, &objects, &marker), &marker).await;
    assert!(!files_under(&root.join("staging")).is_empty(), "the killed fetch left a partial staging dir");

    let store = Store::open(config(&root, &objects)).await.unwrap();
    assert!(files_under(&root.join("staging")).is_empty());
    let info = &store.list(None).await.unwrap()[0];
    assert_eq!(info.local_state, LocalState::Absent);
    assert_eq!(info.pins, 0);
    let co = store.checkout(&info.id, None).await.unwrap();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), expected_tree().1);
}
