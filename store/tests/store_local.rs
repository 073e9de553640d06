//! Snapshot store against a local-directory object tier (and a fault-injecting
//! wrapper of it): round trips, dedup, eviction, pins, corruption, crash
//! recovery, retries, gc.

mod store_common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use store_common::*;
use tempfile::TempDir;
use torpor_store::{CommitOptions, Error, GcPolicy, LocalState, RemoteState, SnapshotId, Store, StoreConfig};

struct Env {
    _tmp: TempDir,
    root: std::path::PathBuf,
    objects: std::path::PathBuf,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let objects = tmp.path().join("objects");
    Env { root, objects, _tmp: tmp }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_checkout_upload_evict_fetch_round_trip() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let st = store.begin(&actor("default/web-0")).await.unwrap();
    assert!(st.path.starts_with(e.root.join("staging")));
    write_tree(&st.path, 1, 3 * 1024 * 1024 + 17);
    let original = stored(&read_tree(&st.path));
    let labels = [("torpor.dev/reason".to_string(), "idle".to_string())].into();
    let info = store.commit(&st.id, CommitOptions { labels, keep_local: None }).await.unwrap();
    assert_eq!(info.id.to_string(), "default/web-0@1");
    assert!(info.local && !info.durable && info.remote == RemoteState::Absent);
    assert_eq!(info.logical_bytes, 3 * 1024 * 1024 + 17 + 5000 + 6);
    assert_eq!(info.labels["torpor.dev/reason"], "idle");
    assert!(!st.path.exists(), "staging renamed into place");
    assert_eq!(info.path, e.root.join("snapshots/default/web-0/_gen/00000000000000000001"));
    // Committing the same staging again (an answer lost) answers the same snapshot.
    assert_eq!(store.commit(&st.id, CommitOptions::default()).await.unwrap().id, info.id);
    // An unknown staging fails clearly.
    assert!(matches!(store.commit("0123", CommitOptions::default()).await, Err(Error::StagingNotFound(_))));

    // Local checkout: files in place, pinned; hashed at the commit and
    // unchanged since, so not hashed again.
    let co = store.checkout(&info.id, None).await.unwrap();
    assert!(!co.fetched);
    assert_eq!(co.path, info.path);
    assert_eq!(co.verified_bytes, 0);
    assert_eq!(read_tree(&co.path), original);
    assert_eq!(co.info.pins, 1);
    store.release(&co.lease).await.unwrap();
    // A file changed since (here only its mode): hashed whole again, once.
    std::fs::set_permissions(co.path.join("ctr-a/core-1.img"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let co = store.checkout(&info.id, None).await.unwrap();
    assert_eq!(co.verified_bytes, info.logical_bytes);
    store.release(&co.lease).await.unwrap();
    let co = store.checkout(&info.id, None).await.unwrap();
    assert_eq!(co.verified_bytes, 0);
    store.release(&co.lease).await.unwrap();
    assert!(matches!(store.release(&co.lease).await, Err(Error::LeaseNotFound(_))));

    // Evict refuses a snapshot that is not durable.
    let err = store.evict(&info.id).await.unwrap_err();
    assert!(matches!(err, Error::NotDurable { .. }), "{err}");
    assert!(err.to_string().contains("default/web-0@1"), "{err}");

    let (tx, rx) = tokio::sync::watch::channel((0, 0));
    let up = store.upload(&info.id, Some(tx)).await.unwrap();
    assert!(up.durable);
    let (done, total) = *rx.borrow();
    assert_eq!(done, total);
    assert!(total > 0);
    // Layout of the object tier.
    let manifest = e.objects.join("actors/default/web-0/_gen/00000000000000000001/manifest.json");
    assert!(manifest.is_file());
    let chunks = files_under(&e.objects.join("chunks/sha256"));
    assert_eq!(chunks.len() as u64, info.chunk_count, "one object per distinct chunk (the empty file has none)");
    // Idempotent.
    assert!(store.upload(&info.id, None).await.unwrap().durable);

    store.evict(&info.id).await.unwrap();
    assert!(!info.path.exists());
    let l = store.list(None).await.unwrap();
    assert_eq!(l.len(), 1);
    assert!(!l[0].local && l[0].durable);

    let (tx, rx) = tokio::sync::watch::channel((0, 0));
    let co = store.checkout(&info.id, Some(tx)).await.unwrap();
    assert!(co.fetched);
    assert_eq!(*rx.borrow(), (info.logical_bytes, info.logical_bytes));
    assert_eq!(read_tree(&co.path), original, "fetched tree is identical, with the store's modes");
    assert!(files_under(&e.root.join("staging")).is_empty());
    store.release(&co.lease).await.unwrap();

    let (i2, m) = store.inspect(&info.id).await.unwrap();
    assert_eq!(i2.manifest_digest, info.manifest_digest);
    assert_eq!(m.entries.iter().filter(|e| e.kind == torpor_store::EntryKind::File).count(), 4);
    assert_eq!(store.latest(&actor("default/web-0")).await.unwrap().unwrap().id, info.id);
    assert!(store.latest(&actor("default/other")).await.unwrap().is_none());
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_view_outlives_the_commit_and_is_released() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let st = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st.path, 3, 2 * 1024 * 1024);
    let original = stored(&read_tree(&st.path));
    // A reader pins the dump before the commit.
    let (view, lease) = store.view_staging(&st.id).await.unwrap();
    assert_eq!(read_tree(&view), original);
    let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    assert!(!st.path.exists(), "staging renamed into place");
    // The view is untouched by the commit (MANIFEST aside, same files).
    let mut seen = read_tree(&view);
    seen.retain(|k, _| original.contains_key(k));
    assert_eq!(seen, original);
    let co = store.checkout(&info.id, None).await.unwrap();
    store.release(&co.lease).await.unwrap();
    // Released: the view is gone, its lease with it.
    store.release(&lease).await.unwrap();
    assert!(!view.exists());
    assert!(matches!(store.release(&lease).await, Err(Error::LeaseNotFound(_))));
    // Two commits of one staging at once: one snapshot, both answered it.
    let st4 = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st4.path, 5, 1024 * 1024);
    let (a, b) = tokio::join!(store.commit(&st4.id, CommitOptions::default()), store.commit(&st4.id, CommitOptions::default()));
    assert_eq!(a.unwrap().id, b.unwrap().id);
    // A committed (or unknown) staging has no view.
    assert!(matches!(store.view_staging(&st.id).await, Err(Error::StagingNotFound(_))));
    // An aborted one neither.
    let st2 = store.begin(&actor("default/web-0")).await.unwrap();
    store.abort(&st2.id).await.unwrap();
    assert!(matches!(store.view_staging(&st2.id).await, Err(Error::StagingNotFound(_))));
    // A view left by a daemon that stopped is removed when the store reopens.
    let st3 = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st3.path, 4, 4096);
    let (view3, _) = store.view_staging(&st3.id).await.unwrap();
    store.shutdown().await;
    drop(store);
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    assert!(!view3.exists(), "stale view removed at open");
    assert!(st3.path.exists(), "the writer's staging is kept");
    store.abort(&st3.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuspend_after_one_percent_change_uploads_little() {
    let e = env();
    // Every checkout hashes the local copy whole (the speed measured below).
    let mut cfg = config(&e.root, &e.objects);
    cfg.trust_verified_local_for = std::time::Duration::ZERO;
    let (store, faulty) = open_faulty(cfg, &e.objects).await;
    const PAGES: usize = 64 * 1024 * 1024;
    let mut pages = random_bytes(42, PAGES);
    let a = actor("bench/resuspend");
    let st = store.begin(&a).await.unwrap();
    std::fs::write(st.path.join("pages-1.img"), &pages).unwrap();
    std::fs::write(st.path.join("core-1.img"), b"core").unwrap();
    let started = std::time::Instant::now();
    let g1 = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    let commit_s = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    store.upload(&g1.id, None).await.unwrap();
    let upload_s = started.elapsed().as_secs_f64();
    let full_raw = store.status().uploaded_raw_bytes;
    let full_put = faulty.chunk_put_bytes.load(Ordering::SeqCst);
    assert!(full_raw >= PAGES as u64);

    // The actor changes 1% of its memory (contiguous) and is suspended again.
    let change = PAGES / 100;
    let at = PAGES / 3;
    pages[at..at + change].copy_from_slice(&random_bytes(7, change));
    let st = store.begin(&a).await.unwrap();
    std::fs::write(st.path.join("pages-1.img"), &pages).unwrap();
    std::fs::write(st.path.join("core-1.img"), b"core2").unwrap();
    let g2 = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    assert_eq!(g2.id.generation, 2);
    store.upload(&g2.id, None).await.unwrap();
    let second_put = faulty.chunk_put_bytes.load(Ordering::SeqCst) - full_put;
    let fraction = second_put as f64 / full_put as f64;
    eprintln!(
        "resuspend_upload_fraction = {fraction:.4} ({second_put} of {full_put} bytes); 64 MiB commit {:.0} MiB/s, upload to a local-directory object tier {:.0} MiB/s",
        64.0 / commit_s,
        64.0 / upload_s
    );
    assert!(fraction <= 0.10, "re-suspend uploaded {fraction:.3} of a full snapshot");
    assert!(store.status().deduplicated_chunks > 0);

    // Checkout of the local copy verifies every byte against the manifest.
    let started = std::time::Instant::now();
    let co = store.checkout(&g2.id, None).await.unwrap();
    let verify_s = started.elapsed().as_secs_f64();
    assert_eq!(co.verified_bytes, g2.logical_bytes);
    store.release(&co.lease).await.unwrap();
    // And a fetch from the object tier.
    store.evict(&g2.id).await.unwrap();
    let started = std::time::Instant::now();
    let co = store.checkout(&g2.id, None).await.unwrap();
    let fetch_s = started.elapsed().as_secs_f64();
    store.release(&co.lease).await.unwrap();
    eprintln!(
        "64 MiB: local checkout verification {:.0} MiB/s, fetch from a local-directory object tier {:.0} MiB/s",
        64.0 / verify_s,
        64.0 / fetch_s
    );

    // Both generations restore exactly from the object tier.
    store.evict(&g1.id).await.unwrap();
    store.evict(&g2.id).await.unwrap();
    let co = store.checkout(&g2.id, None).await.unwrap();
    assert!(co.fetched);
    assert!(std::fs::read(co.path.join("pages-1.img")).unwrap() == pages);
    let co1 = store.checkout(&g1.id, None).await.unwrap();
    assert!(std::fs::read(co1.path.join("pages-1.img")).unwrap() == random_bytes(42, PAGES));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_is_lru_and_never_drops_undurable_snapshots() {
    let e = env();
    eviction_scenario(config(&e.root, &e.objects)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_block_eviction_and_removal() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let s = commit_tree(&store, "p/x", 9, 100_000).await;
    store.upload(&s.id, None).await.unwrap();
    let co1 = store.checkout(&s.id, None).await.unwrap();
    let co2 = store.checkout(&s.id, None).await.unwrap();
    assert_ne!(co1.lease, co2.lease);
    let err = store.evict(&s.id).await.unwrap_err();
    assert!(matches!(err, Error::Pinned { leases: 2, .. }), "{err}");
    assert!(matches!(store.remove(&s.id).await, Err(Error::Pinned { .. })));
    // Budget 0: the background pass must not evict a pinned snapshot.
    drop(store);
    let mut cfg = config(&e.root, &e.objects);
    cfg.local_budget_bytes = 0;
    let store = Store::open(cfg).await.unwrap();
    assert_eq!(store.list(None).await.unwrap()[0].pins, 2, "leases survive a restart");
    store.run_background_pass().await.unwrap();
    assert!(store.list(None).await.unwrap()[0].local);
    assert!(store.status().disk_pressure);
    store.release(&co1.lease).await.unwrap();
    store.release(&co2.lease).await.unwrap();
    store.run_background_pass().await.unwrap();
    assert!(!store.list(None).await.unwrap()[0].local);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_chunk_in_the_object_tier_is_refused() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let s = commit_tree(&store, "c/remote", 3, 2 * 1024 * 1024).await;
    store.upload(&s.id, None).await.unwrap();
    store.evict(&s.id).await.unwrap();
    // Flip one byte in the payload of the largest chunk object.
    let mut chunks = files_under(&e.objects.join("chunks"));
    chunks.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let victim = chunks.last().unwrap().clone();
    let digest = victim.file_name().unwrap().to_str().unwrap().to_string();
    let mut bytes = std::fs::read(&victim).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x55;
    std::fs::write(&victim, &bytes).unwrap();

    let err = store.checkout(&s.id, None).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
    assert!(msg.contains("c/remote@1") && msg.contains(&digest), "{msg}");
    let info = &store.list(None).await.unwrap()[0];
    assert_eq!(info.local_state, LocalState::Absent);
    assert!(!info.path.exists(), "nothing half-materialized");
    assert!(files_under(&e.root.join("staging")).is_empty());

    // A missing chunk, too.
    std::fs::remove_file(&victim).unwrap();
    let msg = store.checkout(&s.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("c/remote@1") && msg.contains("missing") && msg.contains(&digest), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_local_copy_is_refused_and_not_uploaded() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let s = commit_tree(&store, "c/local", 4, 1024 * 1024).await;
    let pages = s.path.join("ctr-a/pages-1.img");
    let mut bytes = std::fs::read(&pages).unwrap();
    bytes[700_000] ^= 1;
    std::fs::write(&pages, &bytes).unwrap();
    let err = store.checkout(&s.id, None).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt { .. }) && msg.contains("c/local@1") && msg.contains("ctr-a/pages-1.img"), "{msg}");
    assert_eq!(store.list(None).await.unwrap()[0].pins, 0, "a refused checkout pins nothing");
    let msg = store.upload(&s.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("c/local@1") && msg.contains("not uploading"), "{msg}");
    assert!(e.objects.join("actors").read_dir().map(|mut d| d.next().is_none()).unwrap_or(true), "no manifest uploaded");

    // A truncated local manifest.
    let m = s.path.join("manifest.json");
    let mb = std::fs::read(&m).unwrap();
    std::fs::write(&m, &mb[..mb.len() / 2]).unwrap();
    let msg = store.checkout(&s.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("c/local@1") && msg.contains("manifest"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_or_garbled_remote_manifest_is_refused() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let s = commit_tree(&store, "m/x", 5, 300_000).await;
    store.upload(&s.id, None).await.unwrap();
    store.evict(&s.id).await.unwrap();
    let mpath = e.objects.join("actors/m/x/_gen/00000000000000000001/manifest.json");
    let good = std::fs::read(&mpath).unwrap();
    std::fs::write(&mpath, &good[..good.len() - 40]).unwrap();
    let msg = store.checkout(&s.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("m/x@1") && msg.contains("truncated or garbled"), "{msg}");

    // Another node (no record of the digest) refuses it too: the manifest's own digest.
    let other = env();
    let store2 = Store::open(config(&other.root, &e.objects)).await.unwrap();
    let msg = store2.checkout(&s.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("m/x@1") && msg.contains("manifest"), "{msg}");
    // Garbled but still JSON: a changed size.
    let garbled = String::from_utf8(good.clone()).unwrap().replacen("\"size\":5000", "\"size\":5001", 1);
    assert_ne!(garbled.as_bytes(), &good[..]);
    std::fs::write(&mpath, garbled).unwrap();
    let msg = store2.checkout(&s.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("m/x@1") && msg.contains("garbled"), "{msg}");
    std::fs::write(&mpath, &good).unwrap();
    let co = store2.checkout(&s.id, None).await.unwrap();
    assert!(co.fetched);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_upload_resumes_after_reopen() {
    let e = env();
    let cfg = config(&e.root, &e.objects);
    let (store, faulty) = open_faulty(cfg.clone(), &e.objects).await;
    let s = commit_tree(&store, "k/up", 6, 6 * 1024 * 1024).await;
    let original = read_tree(&s.path);
    faulty.hang_put_at.store(3, Ordering::SeqCst);
    let st2 = store.clone();
    let id = s.id.clone();
    let task = tokio::spawn(async move { st2.upload(&id, None).await });
    wait_for("the upload to hang mid-way", Duration::from_secs(60), || faulty.hung.load(Ordering::SeqCst)).await;
    // "Crash": the upload is dropped mid-flight, the store closed without shutdown work.
    task.abort();
    let _ = task.await;
    drop(store);
    let store = Store::open(cfg).await.unwrap();
    let info = &store.list(None).await.unwrap()[0];
    assert_eq!(info.remote, RemoteState::Uploading, "the upload was recorded before it started");
    assert!(info.local);
    assert!(matches!(store.evict(&s.id).await, Err(Error::NotDurable { .. })));
    // The background pass resumes it regardless of keep-local.
    store.run_background_pass().await.unwrap();
    let info = &store.list(None).await.unwrap()[0];
    assert!(info.durable, "{info:?}");
    store.evict(&s.id).await.unwrap();
    let co = store.checkout(&s.id, None).await.unwrap();
    assert_eq!(read_tree(&co.path), original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_fetch_is_cleaned_and_refetched() {
    let e = env();
    let cfg = config(&e.root, &e.objects);
    let (store, faulty) = open_faulty(cfg.clone(), &e.objects).await;
    let s = commit_tree(&store, "k/fetch", 7, 6 * 1024 * 1024).await;
    let original = read_tree(&s.path);
    store.upload(&s.id, None).await.unwrap();
    store.evict(&s.id).await.unwrap();
    faulty.hang_get_at.store(4, Ordering::SeqCst);
    let st2 = store.clone();
    let id = s.id.clone();
    let task = tokio::spawn(async move { st2.checkout(&id, None).await });
    wait_for("the fetch to hang mid-way", Duration::from_secs(60), || faulty.hung.load(Ordering::SeqCst)).await;
    let info = &store.list(None).await.unwrap()[0];
    assert!(matches!(info.local_state, LocalState::Fetching { .. }));
    assert!(!files_under(&e.root.join("staging")).is_empty(), "partial fetch in staging");
    task.abort();
    let _ = task.await;
    drop(store);
    let store = Store::open(cfg).await.unwrap();
    let info = &store.list(None).await.unwrap()[0];
    assert_eq!(info.local_state, LocalState::Absent);
    assert!(files_under(&e.root.join("staging")).is_empty(), "interrupted fetch cleaned");
    assert!(!info.path.exists());
    let co = store.checkout(&s.id, None).await.unwrap();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), original);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_commit_and_eviction_are_repaired_at_open() {
    let e = env();
    let cfg = config(&e.root, &e.objects);
    let store = Store::open(cfg.clone()).await.unwrap();
    let s = commit_tree(&store, "k/evict", 8, 200_000).await;
    store.upload(&s.id, None).await.unwrap();
    // Leftovers of a crash: a writer's staging (dumped, not committed yet), a
    // fetch's staging (no actor sidecar), an orphaned snapshot dir (a commit
    // that crashed after the rename but before its record), trash.
    let st = store.begin(&actor("k/evict")).await.unwrap();
    write_tree(&st.path, 1, 10);
    let fetch_staging = e.root.join("staging/0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(&fetch_staging).unwrap();
    let orphan = e.root.join("snapshots/k/evict/_gen/00000000000000000009");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("x"), b"x").unwrap();
    std::fs::write(e.root.join("trash/leftover"), b"x").unwrap();
    drop(store);
    let store = Store::open(cfg).await.unwrap();
    assert!(!fetch_staging.exists() && !orphan.exists() && !e.root.join("trash/leftover").exists());
    // The writer's staging survived the restart and commits.
    assert!(st.path.exists());
    let s1 = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    assert_eq!(s1.id.generation, 2);
    assert!(!e.root.join(format!("staging/{}.actor", st.id)).exists(), "sidecar removed by the commit");
    let l = store.list(None).await.unwrap();
    assert_eq!(l.len(), 2);
    assert!(l[0].local && l[0].durable);
    // Generations are never reused, even after an interrupted commit.
    let s2 = commit_tree(&store, "k/evict", 8, 10).await;
    assert_eq!(s2.id.generation, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_retry_with_backoff_until_the_object_tier_returns() {
    let e = env();
    let mut cfg = config(&e.root, &e.objects);
    cfg.background = true;
    cfg.default_keep_local = Duration::ZERO;
    let (store, faulty) = open_faulty(cfg, &e.objects).await;
    faulty.fail.store(true, Ordering::SeqCst);
    let s = commit_tree(&store, "r/x", 10, 500_000).await;
    let id = s.id.clone();
    let st = store.clone();
    wait_for("two failed upload attempts", Duration::from_secs(60), || {
        futures::executor::block_on(st.list(None)).unwrap()[0].upload_attempts >= 2
    })
    .await;
    let info = &store.list(None).await.unwrap()[0];
    assert!(info.local && !info.durable);
    assert!(info.last_error.as_deref().unwrap_or("").contains("unreachable"), "{info:?}");
    assert!(store.status().last_errors.iter().any(|(_, m)| m.contains("r/x@1")));
    let err = store.upload(&id, None).await.unwrap_err();
    assert!(err.is_remote_unavailable() && err.to_string().contains("r/x@1"), "{err}");
    assert!(matches!(store.evict(&id).await, Err(Error::NotDurable { .. })));
    faulty.fail.store(false, Ordering::SeqCst);
    wait_for("the upload to complete", Duration::from_secs(60), || futures::executor::block_on(st.list(None)).unwrap()[0].durable).await;
    let info = &store.list(None).await.unwrap()[0];
    assert!(info.local, "kept local (no pressure)");
    assert_eq!(info.upload_attempts, 0);
    assert!(info.last_error.is_none());
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_newest_and_pinned_and_sweeps_unreferenced_chunks() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let mut ids = Vec::new();
    for g in 1..=4u64 {
        let s = commit_tree(&store, "g/a", 100 + g, 400_000).await;
        store.upload(&s.id, None).await.unwrap();
        ids.push(s.id);
    }
    let b = commit_tree(&store, "g/b", 200, 400_000).await;
    store.upload(&b.id, None).await.unwrap();
    let co = store.checkout(&ids[1], None).await.unwrap();
    assert!(store.gc(GcPolicy { keep_newest: 0, ..Default::default() }).await.is_err());
    let chunks_before = files_under(&e.objects.join("chunks")).len();
    let report = store.gc(GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::ZERO }).await.unwrap();
    assert_eq!(report.removed, vec![ids[2].clone(), ids[0].clone()]);
    assert_eq!(report.kept_pinned, vec![ids[1].clone()]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.chunks_deleted > 0);
    assert_eq!(files_under(&e.objects.join("chunks")).len(), chunks_before - report.chunks_deleted as usize);
    let left: Vec<SnapshotId> = store.list(None).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(left, vec![ids[1].clone(), ids[3].clone(), b.id.clone()]);
    assert!(!e.objects.join("actors/g/a/_gen/00000000000000000001/manifest.json").exists());
    // What is left still restores from the object tier alone.
    store.release(&co.lease).await.unwrap();
    for id in &left {
        store.evict(id).await.unwrap();
        let co = store.checkout(id, None).await.unwrap();
        assert!(co.fetched);
        store.release(&co.lease).await.unwrap();
    }
    // A chunk younger than the grace period survives a sweep.
    let c = commit_tree(&store, "g/c", 300, 100_000).await;
    store.upload(&c.id, None).await.unwrap();
    store.remove(&c.id).await.unwrap();
    let report =
        store.gc(GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::from_secs(3600) }).await.unwrap();
    assert!(report.chunks_kept_young > 0 && report.chunks_deleted == 0, "{report:?}");
    // The newest generation is kept and the next commit continues the count.
    assert_eq!(commit_tree(&store, "g/a", 1, 10).await.id.generation, 5);
}

/// `prune_keep`: a background pass removes the snapshots beyond an actor's
/// newest `prune_keep` that never left the node, and nothing else: not the
/// newest, not one in the object tier, not a pinned one, not another
/// actor's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_prunes_superseded_snapshots_that_never_left_the_node() {
    let e = env();
    let mut cfg = config(&e.root, &e.objects);
    cfg.prune_keep = Some(0);
    assert!(Store::open(cfg.clone()).await.is_err(), "prune_keep 0 is refused");
    cfg.prune_keep = Some(2);
    let store = Store::open(cfg).await.unwrap();
    let mut ids = Vec::new();
    for g in 1..=6u64 {
        ids.push(commit_tree(&store, "p/a", 10 + g, 50_000).await.id);
    }
    store.upload(&ids[0], None).await.unwrap();
    let co = store.checkout(&ids[2], None).await.unwrap();
    let other = commit_tree(&store, "p/b", 30, 50_000).await.id;
    store.run_background_pass().await.unwrap();
    let left: Vec<SnapshotId> = store.list(None).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(
        left,
        vec![ids[0].clone(), ids[2].clone(), ids[4].clone(), ids[5].clone(), other.clone()],
        "generations 2 and 4 were local-only, superseded and unpinned"
    );
    for g in [2u64, 4] {
        assert!(!e.root.join(format!("snapshots/p/a/_gen/{g:020}")).exists(), "generation {g}'s files are gone");
    }
    // Once released, the pinned one goes at the next pass; the durable one
    // stays for gc (which also removes it from the object tier).
    store.release(&co.lease).await.unwrap();
    store.run_background_pass().await.unwrap();
    let left: Vec<SnapshotId> = store.list(None).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(left, vec![ids[0].clone(), ids[4].clone(), ids[5].clone(), other]);
    // The generation count goes on.
    assert_eq!(commit_tree(&store, "p/a", 1, 10).await.id.generation, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_finds_and_continues_an_actor() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let s1 = commit_tree(&store, "n/x", 1, 300_000).await;
    let s2 = commit_tree(&store, "n/x", 2, 300_000).await;
    store.upload(&s1.id, None).await.unwrap();
    store.upload(&s2.id, None).await.unwrap();
    let original = read_tree(&s2.path);
    let node_b = env();
    let store_b = Store::open(config(&node_b.root, &e.objects)).await.unwrap();
    assert!(store_b.list(None).await.unwrap().is_empty());
    let latest = store_b.latest(&actor("n/x")).await.unwrap().unwrap();
    assert_eq!(latest.id, s2.id);
    assert!(!latest.local && latest.durable);
    let co = store_b.checkout(&latest.id, None).await.unwrap();
    assert_eq!(read_tree(&co.path), original);
    assert_eq!(store_b.refresh(None).await.unwrap(), 1, "gen 1 imported");
    assert_eq!(commit_tree(&store_b, "n/x", 3, 10).await.id.generation, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let st = store.begin(&actor("bad/x")).await.unwrap();
    std::os::unix::fs::symlink("/etc/passwd", st.path.join("link")).unwrap();
    let msg = store.commit(&st.id, CommitOptions::default()).await.unwrap_err().to_string();
    assert!(msg.contains("symbolic link") && msg.contains("link"), "{msg}");
    store.abort(&st.id).await.unwrap();
    assert!(!st.path.exists());
    assert!(matches!(store.abort(&st.id).await, Err(Error::StagingNotFound(_))));
    let missing = SnapshotId::new(actor("bad/x"), 4);
    let msg = store.checkout(&missing, None).await.unwrap_err().to_string();
    assert!(msg.contains("bad/x@4") && msg.contains("not found"), "{msg}");
    assert!(store.remove(&missing).await.unwrap_err().is_not_found());
    drop(store);
    // The local tier belongs to one object tier.
    let mut cfg = config(&e.root, &e.objects);
    cfg.remote_url = "memory://".into();
    let msg = Store::open(cfg).await.err().unwrap().to_string();
    assert!(msg.contains("belongs to object tier"), "{msg}");
    let mut cfg = StoreConfig::new(&e.root);
    cfg.remote_url = "nope://x".into();
    assert!(Store::open(cfg).await.err().unwrap().to_string().contains("remote_url"));
    let _ = Arc::new(());
}

/// A local-directory object tier has no conditional updates: the actor
/// lease falls back to a compare-and-write, and still refuses a second node
/// and hands over after a surrender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_lease_on_a_directory_object_tier() {
    let e = env();
    let mut ca = config(&e.root, &e.objects);
    ca.node_id = "node-a".into();
    let mut cb = config(&e.root.with_file_name("store-b"), &e.objects);
    cb.node_id = "node-b".into();
    let a = Store::open(ca).await.unwrap();
    let b = Store::open(cb).await.unwrap();
    let x = actor("ns/x");
    assert_eq!(a.acquire(&x, "s1").await.unwrap().epoch, 1);
    a.lease_pass().await; // a renewal through the fallback
    assert_eq!(a.actor_leases().unwrap()[0].doc.epoch, 1);
    let err = b.acquire(&x, "s2").await.unwrap_err();
    assert!(err.to_string().contains("node-a"), "{err}");
    a.surrender(&x, "s1").await.unwrap();
    assert_eq!(b.acquire(&x, "s2").await.unwrap().epoch, 2);
    assert!(matches!(a.acquire(&x, "s1").await, Err(Error::LeaseHeld { .. })));
    // Bad node ids are refused at open.
    let mut bad = config(&e.root.with_file_name("store-c"), &e.objects);
    bad.node_id = "two words".into();
    assert!(Store::open(bad).await.err().unwrap().to_string().contains("node_id"));
}

/// A restarted daemon renews the leases it finds in its database at once:
/// its predecessor renewed them up to `lease_ttl / 3` (plus the restart)
/// ago, and a shim's confirmation is answered from them (a CI run froze an
/// actor by the lease fence when the first renewal waited a full interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_store_renews_its_leases_at_once() {
    let e = env();
    let mut cfg = config(&e.root, &e.objects);
    cfg.lease_ttl = Duration::from_secs(300); // the renewal interval: 100 s
    let x = actor("ns/restarted");
    let before = {
        let a = Store::open(cfg.clone()).await.unwrap();
        a.acquire(&x, "s1").await.unwrap();
        let l = a.actor_leases().unwrap();
        a.shutdown().await;
        l[0].doc.expires_unix_ms
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let a = Store::open(cfg).await.unwrap();
    wait_for("the reopened store's first lease renewal", Duration::from_secs(60), || {
        a.actor_leases().unwrap().first().is_some_and(|l| l.doc.expires_unix_ms > before)
    })
    .await;
    assert_eq!(a.actor_leases().unwrap()[0].doc.epoch, 1, "renewed, not taken anew");
    a.shutdown().await;
}

/// Set a file's last-modified time (a local-directory object tier's
/// last-modified time of the object).
fn set_mtime(p: &std::path::Path, t: std::time::SystemTime) {
    std::fs::File::options().write(true).open(p).unwrap().set_modified(t).unwrap();
}

/// An upload in progress on one node (some chunks PUT, its manifest not
/// written yet) keeps its chunks through another node's sweep, even with no
/// grace period: its intent names them. Once its upload is dead and the
/// intent stale, the next sweep deletes the intent and the chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_keeps_the_chunks_of_an_upload_in_progress_on_another_node() {
    use torpor_store::INTENT_TTL;
    let grace0 = || GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::ZERO };
    let e = env();
    let (one, faulty) = open_faulty(config(&e.root, &e.objects), &e.objects).await;
    let node_b = env();
    let two = Store::open(config(&node_b.root, &e.objects)).await.unwrap();
    let s = commit_tree(&one, "u/busy", 7, 6 * 1024 * 1024).await;
    faulty.hang_put_at.store(3, Ordering::SeqCst);
    let (o, id) = (one.clone(), s.id.clone());
    let task = tokio::spawn(async move { o.upload(&id, None).await });
    let chunks = e.objects.join("chunks");
    wait_for("three chunk PUTs done, the fourth hung", Duration::from_secs(60), || {
        faulty.hung.load(Ordering::SeqCst) && files_under(&chunks).len() == 3
    })
    .await;
    let intents = files_under(&e.objects.join("intents"));
    assert_eq!(intents.len(), 1, "{intents:?}");

    let rep = two.gc(grace0()).await.unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!((rep.chunks_deleted, rep.chunks_kept_in_use), (0, 3), "{rep:?}");
    assert_eq!(files_under(&chunks).len(), 3);
    assert!(files_under(&e.objects.join("sweeps")).is_empty(), "the sweep's announcement is gone when it is done");

    // The upload dies with its node; its intent goes stale after INTENT_TTL
    // (here: its last-modified time set back).
    task.abort();
    let _ = task.await;
    set_mtime(&intents[0], std::time::SystemTime::now() - INTENT_TTL - Duration::from_secs(60));
    let rep = two.gc(grace0()).await.unwrap();
    assert_eq!(rep.chunks_deleted, 3, "{rep:?}");
    assert!(files_under(&e.objects.join("intents")).is_empty(), "the stale intent is deleted");
}

/// An upload whose intent a sweep elsewhere may not have seen waits until
/// that sweep's round is over (its announcement deleted, or past its
/// window) before it checks and sends chunks; a dead sweep's stale
/// announcement does not hold it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_waits_for_a_sweep_announced_by_another_node() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let sweeps = e.objects.join("sweeps");
    std::fs::create_dir_all(&sweeps).unwrap();
    let stale = sweeps.join("0123-1.json");
    std::fs::write(&stale, br#"{"format":1,"node":"node-x","live_ms":60000}"#).unwrap();
    set_mtime(&stale, std::time::SystemTime::now() - Duration::from_secs(3600));
    let s1 = commit_tree(&store, "w/a", 1, 1024 * 1024).await;
    assert!(store.upload(&s1.id, None).await.unwrap().durable);
    assert_eq!(store.status().sweep_waits, 0, "a stale announcement is not waited for");

    let live = sweeps.join("4567-1.json");
    std::fs::write(&live, br#"{"format":1,"node":"node-x","live_ms":600000}"#).unwrap();
    let s2 = commit_tree(&store, "w/a", 2, 1024 * 1024).await;
    let (st, id) = (store.clone(), s2.id.clone());
    let task = tokio::spawn(async move { st.upload(&id, None).await });
    wait_for("the upload to wait for the sweep", Duration::from_secs(60), || store.status().sweep_waits == 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished());
    assert!(!e.objects.join("actors/w/a/_gen/00000000000000000002/manifest.json").exists(), "no manifest while the sweep may delete");
    std::fs::remove_file(&live).unwrap();
    let info = task.await.unwrap().unwrap();
    assert!(info.durable);
    assert!(files_under(&e.objects.join("intents")).is_empty(), "the intent is deleted with the manifest written");
}

/// A fetch in progress keeps its chunks through another node's sweep even
/// when the snapshot's manifest goes meanwhile (a removal that checked for
/// pins just before this one was written): its pin names them. A pin whose
/// node stopped renewing it goes stale and is deleted; a daemon restarted
/// with a checkout still held renews its pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_in_progress_keeps_its_chunks_through_a_sweep_on_another_node() {
    use torpor_store::INTENT_TTL;
    let grace0 = || GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::ZERO };
    let e = env();
    let owner = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let s = commit_tree(&owner, "gold/x", 3, 6 * 1024 * 1024).await;
    owner.upload(&s.id, None).await.unwrap();
    let chunks = e.objects.join("chunks");
    let n = files_under(&chunks).len();
    assert!(n >= 8, "{n}");

    let b = env();
    let (fetcher, faulty) = open_faulty(config(&b.root, &e.objects), &e.objects).await;
    faulty.hang_get_at.store(2, Ordering::SeqCst);
    let (f, id) = (fetcher.clone(), s.id.clone());
    let task = tokio::spawn(async move { f.checkout(&id, None).await });
    wait_for("the fetch to hang mid-way", Duration::from_secs(60), || faulty.hung.load(Ordering::SeqCst)).await;
    let pins_dir = e.objects.join("actors/gold/x/_pins");
    let pins = files_under(&pins_dir);
    assert_eq!(pins.len(), 1);
    std::fs::remove_file(e.objects.join("actors/gold/x/_gen/00000000000000000001/manifest.json")).unwrap();
    owner.forget_chunk_index().await.unwrap();
    let rep = owner.gc(grace0()).await.unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!((rep.chunks_deleted, rep.chunks_kept_in_use as usize), (0, n), "{rep:?}");
    assert_eq!(files_under(&chunks).len(), n);

    // The fetching node dies; its pin is not renewed and goes stale.
    task.abort();
    let _ = task.await;
    set_mtime(&pins[0], std::time::SystemTime::now() - INTENT_TTL - Duration::from_secs(60));
    let rep = owner.gc(grace0()).await.unwrap();
    assert_eq!(rep.chunks_deleted as usize, n, "{rep:?}");
    assert!(files_under(&pins_dir).is_empty(), "the stale pin is deleted");

    // A checkout held across a restart of its daemon: the pin is renewed
    // (without the chunk list: the fetch is over), deleted at release.
    let s2 = commit_tree(&owner, "gold/y", 4, 1024 * 1024).await;
    owner.upload(&s2.id, None).await.unwrap();
    let c = env();
    let config_c = || {
        let mut cfg = config(&c.root, &e.objects);
        cfg.node_id = "node-c".into(); // the others: this machine's id
        cfg
    };
    let node_c = Store::open(config_c()).await.unwrap();
    let co = node_c.checkout(&s2.id, None).await.unwrap();
    assert!(co.fetched);
    node_c.shutdown().await;
    drop(node_c);
    let pins_dir = e.objects.join("actors/gold/y/_pins");
    let pin = files_under(&pins_dir).pop().unwrap();
    set_mtime(&pin, std::time::SystemTime::now() - Duration::from_secs(3600));
    let node_c = Store::open(config_c()).await.unwrap();
    node_c.lease_pass().await;
    let renewed: serde_json::Value = serde_json::from_slice(&std::fs::read(&pin).unwrap()).unwrap();
    assert_eq!(renewed["snapshot"].as_str(), Some("gold/y@1"));
    assert_eq!(renewed["chunks"].as_array().map(|a| a.len()), Some(0), "{renewed}");
    let age = std::fs::metadata(&pin).unwrap().modified().unwrap().elapsed().unwrap_or_default();
    assert!(age < INTENT_TTL, "rewritten: {age:?} old");
    assert!(matches!(owner.remove(&s2.id).await, Err(Error::PinnedElsewhere { .. })));
    node_c.release(&co.lease).await.unwrap();
    assert!(files_under(&pins_dir).is_empty());
    owner.remove(&s2.id).await.unwrap();
}

fn manifest_at(objects: &std::path::Path, actor: &str, generation: u64) -> std::path::PathBuf {
    objects.join(format!("actors/{actor}/_gen/{generation:020}/manifest.json"))
}

/// Issue 14, finding 7 (no keys: nothing in the object tier can be
/// authenticated): a generation or a lease epoch at u64::MAX is a clear
/// error, never a wrap or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_and_epoch_at_u64_max_are_clear_errors() {
    let e = env();
    let store = Store::open(config(&e.root, &e.objects)).await.unwrap();
    let x = actor("ns/max");
    let g1 = commit_tree(&store, "ns/max", 1, 100_000).await;
    store.upload(&g1.id, None).await.unwrap();
    let (_, mut m) = store.inspect(&g1.id).await.unwrap();
    m.generation = u64::MAX;
    let p = manifest_at(&e.objects, "ns/max", u64::MAX);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, m.to_bytes().unwrap().0).unwrap();
    assert_eq!(store.latest(&x).await.unwrap().unwrap().id.generation, u64::MAX);
    let st = store.begin(&x).await.unwrap();
    write_tree(&st.path, 2, 1000);
    let err = store.commit(&st.id, CommitOptions::default()).await.unwrap_err();
    assert!(err.to_string().contains("ns/max") && err.to_string().contains("the largest there is"), "{err}");
    store.abort(&st.id).await.unwrap();

    let lease = e.objects.join("actors/ns/max/lease.json");
    let doc = serde_json::json!({
        "format": 1, "actor": "ns/max", "node": "other", "owner": "x", "epoch": u64::MAX,
        "acquired_unix_ms": 0, "expires_unix_ms": 0, "released": true, "durable_generation": 1,
        "written_unix_ms": now_ms()
    });
    std::fs::write(&lease, serde_json::to_vec(&doc).unwrap()).unwrap();
    let err = store.acquire(&x, "s1").await.unwrap_err();
    assert!(err.to_string().contains("epoch 18446744073709551615"), "{err}");
}

/// Issue 14, finding 6: a holder that stalls right before its commit point
/// (the manifest write) cannot publish after another node took the actor
/// over. The fence renews the lease conditionally just before the write,
/// and the write must end while that renewal holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_cannot_publish_after_a_takeover() {
    let e = env();
    let mem: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let fa = Faulty::new(mem.clone());
    let mut ca = config(&e.root, &e.objects);
    ca.node_id = "node-a".into();
    ca.lease_ttl = Duration::from_secs(2);
    let a = Store::open_with_remote(ca, fa.remote("memory://shared")).await.unwrap();
    let mut cb = config(&e.root.with_file_name("store-b"), &e.objects);
    cb.node_id = "node-b".into();
    cb.lease_ttl = Duration::from_secs(2);
    let b = Store::open_with_remote(cb, torpor_store::Remote::from_store(mem.clone(), "", "memory://shared").unwrap()).await.unwrap();
    let x = actor("ns/x");
    assert_eq!(a.acquire(&x, "s1").await.unwrap().epoch, 1);
    let s = commit_tree(&a, "ns/x", 1, 200_000).await;
    // Node A stalls: no more renewals, and its manifest write hangs.
    a.shutdown().await;
    fa.stall_manifest_put_ms.store(8000, Ordering::SeqCst);
    let (a2, id) = (a.clone(), s.id.clone());
    let up = tokio::spawn(async move { a2.upload(&id, None).await });
    // Node B takes the actor over once A's lease lapses.
    let start = std::time::Instant::now();
    let grant = loop {
        match b.acquire(&x, "s2").await {
            Ok(g) => break g,
            Err(Error::LeaseHeld { .. }) => {
                assert!(start.elapsed() < Duration::from_secs(60), "node B never got the lease");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(grant.epoch, 2);
    let err = up.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("did not end while this node's lease was valid"), "{err}");
    let path = object_store::path::Path::from(format!("actors/ns/x/_gen/{:020}/manifest.json", s.id.generation));
    assert!(
        matches!(object_store::ObjectStoreExt::head(&mem, &path).await, Err(object_store::Error::NotFound { .. })),
        "node A published after the takeover"
    );
    // And a later attempt is refused outright: the lease is node B's.
    fa.stall_manifest_put_ms.store(0, Ordering::SeqCst);
    let err = a.upload(&s.id, None).await.unwrap_err();
    assert!(err.to_string().contains("node-b"), "{err}");
    assert!(matches!(object_store::ObjectStoreExt::head(&mem, &path).await, Err(object_store::Error::NotFound { .. })));
}

/// Issue 14, finding 6: the object tier's conditional writes are checked
/// (the daemon does it at start); what is missing is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_of_the_object_tier_are_checked() {
    use torpor_store::{ConditionalWrites, Honoured, Remote};
    let e = env();
    let mem: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let m = Store::open_with_remote(config(&e.root, &e.objects), Remote::from_store(mem.clone(), "", "memory://").unwrap()).await.unwrap();
    assert_eq!(m.check_conditional_writes().await.unwrap(), ConditionalWrites { create: Honoured::Yes, update: Honoured::Yes });
    use futures::StreamExt;
    assert_eq!(mem.list(None).count().await, 0, "the probe object is deleted");

    let f = Store::open(config(&e.root.with_file_name("store-f"), &e.objects)).await.unwrap();
    assert_eq!(f.check_conditional_writes().await.unwrap(), ConditionalWrites { create: Honoured::Yes, update: Honoured::NotImplemented });

    let faulty = Faulty::new(Arc::new(object_store::memory::InMemory::new()));
    faulty.ignore_conditions.store(true, Ordering::SeqCst);
    let i =
        Store::open_with_remote(config(&e.root.with_file_name("store-i"), &e.objects), faulty.remote("memory://ignoring")).await.unwrap();
    assert_eq!(i.check_conditional_writes().await.unwrap(), ConditionalWrites { create: Honoured::Ignored, update: Honoured::Ignored });
    let errs = i.status().last_errors;
    assert!(errs.iter().any(|(_, m)| m.contains("create-if-absent")) && errs.iter().any(|(_, m)| m.contains("If-Match")), "{errs:?}");

    faulty.fail.store(true, Ordering::SeqCst);
    assert!(i.check_conditional_writes().await.unwrap_err().is_remote_unavailable());
}

/// Issue 14, finding 6: a surrender whose snapshot never uploads does not
/// renew the lease forever: past `surrender_timeout` it lets go, reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surrender_whose_snapshot_never_uploads_lets_go_after_its_timeout() {
    let e = env();
    let mem: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let fa = Faulty::new(mem.clone());
    fa.fail_chunk_puts.store(true, Ordering::SeqCst);
    let mut ca = config(&e.root, &e.objects);
    ca.node_id = "node-a".into();
    ca.surrender_timeout = Duration::from_millis(500);
    let a = Store::open_with_remote(ca, fa.remote("memory://shared")).await.unwrap();
    let x = actor("ns/stuck");
    a.acquire(&x, "s1").await.unwrap();
    let s = commit_tree(&a, "ns/stuck", 1, 200_000).await;
    a.surrender(&x, "s1").await.unwrap();
    assert!(a.actor_leases().unwrap()[0].surrendering, "held while its snapshot uploads");
    let start = std::time::Instant::now();
    while !a.actor_leases().unwrap().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "the surrender never let go");
        a.run_background_pass().await.unwrap();
        a.lease_pass().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = a.list(Some(&x)).await.unwrap();
    assert!(info[0].upload_attempts > 0 && !info[0].durable, "it was tried, and failed");
    let errs = a.status().last_errors;
    assert!(
        errs.iter().any(|(_, m)| m.contains("surrender of actor ns/stuck") && m.contains(&s.id.to_string()) && m.contains("not durable")),
        "{errs:?}"
    );
    // Another node may take the actor now.
    let mut cb = config(&e.root.with_file_name("store-b"), &e.objects);
    cb.node_id = "node-b".into();
    let b = Store::open_with_remote(cb, torpor_store::Remote::from_store(mem, "", "memory://shared").unwrap()).await.unwrap();
    let g = b.acquire(&x, "s2").await.unwrap();
    assert!(g.previous.is_some_and(|p| p.released && p.node == "node-a"));
}

/// The actor's pod left node A (a drain, a delete): its surrender marks the
/// lease `leaving` while the newest snapshot uploads, and node B's acquire
/// (the actor's next pod) waits for the handover instead of being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_waits_for_a_node_that_is_letting_go() {
    let e = env();
    let mut ca = config(&e.root, &e.objects);
    ca.node_id = "node-a".into();
    let mut cb = config(&e.root.with_file_name("store-b"), &e.objects);
    cb.node_id = "node-b".into();
    let a = Store::open(ca).await.unwrap();
    let b = Store::open(cb).await.unwrap();
    let x = actor("ns/mover");
    a.acquire(&x, "s1").await.unwrap();
    let s = commit_tree(&a, "ns/mover", 1, 200_000).await;
    let lease =
        || -> serde_json::Value { serde_json::from_slice(&std::fs::read(e.objects.join("actors/ns/mover/lease.json")).unwrap()).unwrap() };
    // Running there: refused at once, naming the node.
    let err = b.acquire(&x, "s2").await.unwrap_err();
    assert!(matches!(err, Error::LeaseHeld { .. }) && err.to_string().contains("node-a"), "{err}");
    assert!(lease()["leaving"].is_null(), "not written while the actor stays: {}", lease());

    a.surrender(&x, "s1").await.unwrap();
    assert_eq!(lease()["leaving"], true, "{}", lease());
    let (b2, x2) = (b.clone(), x.clone());
    let waiting = tokio::spawn(async move { b2.acquire(&x2, "s2").await });
    while !a.list(Some(&x)).await.unwrap()[0].durable {
        a.run_background_pass().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!waiting.is_finished(), "node B waits while node A still holds the lease");
    a.lease_pass().await; // A lets go: its newest snapshot is durable
    let g = waiting.await.unwrap().unwrap();
    assert_eq!((g.epoch, g.durable_generation), (2, 1));
    assert!(g.previous.as_ref().is_some_and(|p| p.released && p.node == "node-a"), "{:?}", g.previous);
    assert!(lease()["leaving"].is_null(), "{}", lease());
    assert_eq!(b.latest(&x).await.unwrap().unwrap().id, s.id, "node B restores what node A left");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Two nodes on one directory object tier, lease TTL `ttl`.
async fn two_nodes(e: &Env, ttl: Duration) -> (Arc<Store>, Arc<Store>) {
    let mut ca = config(&e.root, &e.objects);
    ca.node_id = "node-a".into();
    ca.lease_ttl = ttl;
    let mut cb = config(&e.root.with_file_name("store-b"), &e.objects);
    cb.node_id = "node-b".into();
    cb.lease_ttl = ttl;
    (Store::open(ca).await.unwrap(), Store::open(cb).await.unwrap())
}

/// Issue 38 row 5: a lease object whose expiry is past year 9999 (anyone
/// who can write the bucket can plant one) panicked the daemon formatting
/// it, on every create of the actor (release builds abort). It is refused
/// at parse naming the object and the field: not a live holder's lease, so
/// the actor is taken once the object stayed so for one lease TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_expiring_past_year_9999_is_refused_at_parse_not_a_panic() {
    let e = env();
    let (a, _b) = two_nodes(&e, Duration::from_secs(1)).await;
    let x = actor("ns/y10k");
    let lease = e.objects.join("actors/ns/y10k/lease.json");
    std::fs::create_dir_all(lease.parent().unwrap()).unwrap();
    for expires in [253_402_300_800_000u64, u64::MAX] {
        let doc = serde_json::json!({
            "format": 1, "actor": "ns/y10k", "node": "other", "owner": "x", "epoch": 1,
            "acquired_unix_ms": 0, "expires_unix_ms": expires, "released": false, "durable_generation": 0,
            "written_unix_ms": now_ms()
        });
        std::fs::write(&lease, serde_json::to_vec(&doc).unwrap()).unwrap();
        let g = a.acquire(&x, "s1").await.unwrap();
        assert!(g.previous.is_none(), "nothing of the planted object is taken as a previous holder");
        assert!(a.lease_summary()[0].contains("ns/y10k"));
        let st = a.status();
        let want = format!("expires_unix_ms is {expires} ms after the Unix epoch, past the end of year 9999");
        assert!(
            st.last_errors.iter().any(|(_, m)| m.contains(&want) && m.contains("actors/ns/y10k/lease.json")),
            "{want}: {:?}",
            st.last_errors
        );
        a.surrender(&x, "s1").await.unwrap();
    }
    a.shutdown().await;
}

/// Issue 38 row 7: deleting `lease.json` let a second node take the actor
/// at once while the first still ran it until its next renewal. A node that
/// finds no lease object for an actor with durable snapshots watches for
/// one lease TTL first; the holder's renewal finds the object gone and
/// loses the lease (its shims' fence stops the actor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_is_not_taken_while_its_holder_may_still_run_the_actor() {
    let e = env();
    let ttl = Duration::from_secs(2);
    let (a, b) = two_nodes(&e, ttl).await;
    let x = actor("ns/del");
    a.acquire(&x, "s1").await.unwrap();
    let g1 = commit_tree(&a, "ns/del", 1, 100_000).await;
    a.upload(&g1.id, None).await.unwrap();
    std::fs::remove_file(e.objects.join("actors/ns/del/lease.json")).unwrap();

    let started = std::time::Instant::now();
    let taking = tokio::spawn({
        let (b, x) = (b.clone(), x.clone());
        async move { b.acquire(&x, "s2").await }
    });
    tokio::time::sleep(ttl / 2).await;
    assert!(!taking.is_finished(), "node B took the actor while node A may still run it");
    // Node A's renewal finds the object gone: lost, and no confirmation.
    a.lease_pass().await;
    assert!(a.actor_leases().unwrap().is_empty(), "node A let go of the lease it lost");
    let err = a.confirm(&x, "s1").await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    let g = taking.await.unwrap().unwrap();
    assert!(started.elapsed() >= ttl, "taken after one lease TTL ({:?})", started.elapsed());
    assert!(g.previous.is_none());
    assert_eq!(b.actor_leases().unwrap()[0].doc.node, "node-b");
    assert_eq!(b.latest(&x).await.unwrap().unwrap().id, g1.id, "node B restores the newest durable snapshot");
    // Node A cannot take it back while B holds it.
    assert!(matches!(a.acquire(&x, "s1").await, Err(Error::LeaseHeld { .. })));
    a.shutdown().await;
    b.shutdown().await;
}
