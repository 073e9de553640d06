//! Snapshot store against a real S3 server (versitygw, started per test).

mod store_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path as OPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use store_common::s3::VersityGw;
use store_common::*;
use torpor_store::{CommitOptions, Error, Store, StoreConfig};

fn s3_config(gw: &VersityGw, root: &std::path::Path, prefix: &str) -> StoreConfig {
    let mut c = StoreConfig::new(root);
    let (url, opts) = gw.remote(prefix);
    c.remote_url = url;
    c.remote_options = opts;
    c.background = false;
    c.default_keep_local = Duration::from_secs(3600);
    c.retry.initial = Duration::from_millis(200);
    c.retry.max = Duration::from_secs(1);
    c.remote_max_retries = 0;
    c.remote_retry_timeout = Duration::from_secs(5);
    c.scan_interval = Duration::from_millis(100);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_upload_evict_then_checkout_fetches_from_s3() {
    let gw = VersityGw::start("torpor-store-rt").await;
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(s3_config(&gw, tmp.path(), "node/objects")).await.unwrap();
    const PAGES: usize = 32 * 1024 * 1024;
    let st = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st.path, 11, PAGES);
    let original = stored(&read_tree(&st.path));
    let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    let t = Instant::now();
    store.upload(&info.id, None).await.unwrap();
    let up_s = t.elapsed().as_secs_f64();
    // The manifest is where the layout says, in the bucket.
    let s3 = gw.builder().build().unwrap();
    let m = s3.head(&OPath::from("node/objects/actors/default/web-0/_gen/00000000000000000001/manifest.json")).await.unwrap();
    assert!(m.size > 0);
    store.evict(&info.id).await.unwrap();
    assert!(!info.path.exists());
    let t = Instant::now();
    let co = store.checkout(&info.id, None).await.unwrap();
    let fetch_s = t.elapsed().as_secs_f64();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), original);
    let mib = info.logical_bytes as f64 / 1048576.0;
    eprintln!("versitygw loopback, debug build: upload {:.0} MiB/s, fetch {:.0} MiB/s ({mib:.0} MiB)", mib / up_s, mib / fetch_s);
    store.release(&co.lease).await.unwrap();

    // A corrupted chunk object on the server is refused, naming the snapshot and chunk.
    store.evict(&info.id).await.unwrap();
    let chunk_dir = gw.dir.path().join("data/torpor-store-rt/node/objects/chunks/sha256");
    let mut chunks = files_under(&chunk_dir);
    assert!(!chunks.is_empty(), "chunks stored by versitygw under {}", chunk_dir.display());
    chunks.sort();
    let victim = &chunks[0];
    let mut bytes = std::fs::read(victim).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x20;
    std::fs::write(victim, &bytes).unwrap();
    let msg = store.checkout(&info.id, None).await.unwrap_err().to_string();
    assert!(msg.contains("default/web-0@1") && msg.contains(victim.file_name().unwrap().to_str().unwrap()), "{msg}");
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_down_during_upload_commit_succeeds_upload_retries_until_back() {
    let mut gw = VersityGw::start("torpor-store-down").await;
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = s3_config(&gw, tmp.path(), "objects");
    cfg.upload_concurrency = 2;
    let store = Store::open(cfg.clone()).await.unwrap();

    // 1. The server is killed in the middle of an on-demand upload.
    let st = store.begin(&actor("ns/mid")).await.unwrap();
    write_tree(&st.path, 21, 24 * 1024 * 1024);
    let mid_tree = stored(&read_tree(&st.path));
    let mid = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    let (tx, mut rx) = tokio::sync::watch::channel((0u64, 0u64));
    let s2 = store.clone();
    let id = mid.id.clone();
    let upload = tokio::spawn(async move { s2.upload(&id, Some(tx)).await });
    let killed = Arc::new(AtomicBool::new(false));
    loop {
        if rx.changed().await.is_err() {
            break;
        }
        let (done, total) = *rx.borrow();
        if done > 0 && done < total {
            gw.down();
            killed.store(true, Ordering::SeqCst);
            break;
        }
    }
    assert!(killed.load(Ordering::SeqCst), "the server was killed mid-upload");
    let err = upload.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::UploadFailed { .. }) && err.is_remote_unavailable() && err.to_string().contains("ns/mid@1"), "{err}");

    // 2. With the server down, a suspend still commits locally.
    let st = store.begin(&actor("ns/down")).await.unwrap();
    write_tree(&st.path, 22, 2 * 1024 * 1024);
    let down_tree = stored(&read_tree(&st.path));
    let down = store.commit(&st.id, CommitOptions { keep_local: Some(Duration::ZERO), ..Default::default() }).await.unwrap();
    assert!(down.local && !down.durable);
    // The background uploader retries with backoff; the local copies stay.
    drop(store);
    let mut cfg_bg = cfg.clone();
    cfg_bg.background = true;
    let store = Store::open(cfg_bg).await.unwrap();
    let s2 = store.clone();
    wait_for("failed retries of both uploads", Duration::from_secs(120), || {
        futures::executor::block_on(s2.list(None)).unwrap().iter().all(|i| i.upload_attempts >= 2)
    })
    .await;
    for i in store.list(None).await.unwrap() {
        assert!(i.local && !i.durable, "{i:?}");
        assert!(i.last_error.is_some());
        assert!(matches!(store.evict(&i.id).await, Err(Error::NotDurable { .. })), "never evicted before durable");
    }
    assert_eq!(store.status().pending_uploads, 2);

    // 3. The server comes back: both uploads complete.
    gw.up();
    wait_for("both uploads to complete", Duration::from_secs(120), || {
        futures::executor::block_on(s2.list(None)).unwrap().iter().all(|i| i.durable)
    })
    .await;
    for (id, tree) in [(&mid.id, &mid_tree), (&down.id, &down_tree)] {
        store.evict(id).await.unwrap();
        let co = store.checkout(id, None).await.unwrap();
        assert!(co.fetched);
        assert_eq!(&read_tree(&co.path), tree);
        store.release(&co.lease).await.unwrap();
    }
    store.shutdown().await;
}

/// Sealed under a key in a real S3 bucket: nothing readable there, restores
/// on a node with the key; a tampered chunk object and a node without the
/// key are refused naming the snapshot (and the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_sealed_round_trip_tamper_and_unknown_key() {
    use torpor_store::{Key, Keyring};
    let gw = VersityGw::start("torpor-store-sealed").await;
    let tmp = tempfile::tempdir().unwrap();
    let k1 = || Keyring::new(vec![Key::new("k1", &[0x11; 32]).unwrap()], None, false).unwrap();
    let mut cfg = s3_config(&gw, &tmp.path().join("a"), "sealed");
    cfg.keyring = k1();
    let store = Store::open(cfg).await.unwrap();
    let st = store.begin(&actor("default/web-0")).await.unwrap();
    write_tree(&st.path, 31, 4 * 1024 * 1024);
    let original = stored(&read_tree(&st.path));
    let pages = std::fs::read(st.path.join("ctr-a/pages-1.img")).unwrap();
    let info = store.commit(&st.id, CommitOptions::default()).await.unwrap();
    assert_eq!(store.upload(&info.id, None).await.unwrap().key_id.as_deref(), Some("k1"));
    let bucket = gw.dir.path().join("data/torpor-store-sealed/sealed");
    assert!(files_under(&bucket.join("chunks/sha256")).is_empty());
    let mut chunks = files_under(&bucket.join("chunks/hmac-sha256/k1"));
    assert_eq!(chunks.len() as u64, info.chunk_count);
    for c in &chunks {
        assert!(!std::fs::read(c).unwrap().windows(64).any(|w| w == &pages[4096..4160]), "plaintext in {}", c.display());
    }
    let manifest = std::fs::read(bucket.join("actors/default/web-0/_gen/00000000000000000001/manifest.json")).unwrap();
    assert!(!String::from_utf8_lossy(&manifest).contains("pages-1.img"));
    store.evict(&info.id).await.unwrap();
    let co = store.checkout(&info.id, None).await.unwrap();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), original);
    store.release(&co.lease).await.unwrap();

    // A flipped byte in a chunk object on the server.
    store.evict(&info.id).await.unwrap();
    chunks.sort();
    let victim = &chunks[0];
    let good = std::fs::read(victim).unwrap();
    let mut bad = good.clone();
    let n = bad.len();
    bad[n / 2] ^= 0x20;
    std::fs::write(victim, &bad).unwrap();
    let err = store.checkout(&info.id, None).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
    assert!(msg.contains("default/web-0@1") && msg.contains(victim.file_name().unwrap().to_str().unwrap()), "{msg}");
    std::fs::write(victim, &good).unwrap();

    // Another node without the key, and one with it.
    let mut cfg_b = s3_config(&gw, &tmp.path().join("b"), "sealed");
    cfg_b.keyring = Keyring::new(vec![Key::new("k2", &[0x22; 32]).unwrap()], None, false).unwrap();
    let other = Store::open(cfg_b).await.unwrap();
    // Sealed under a key none of its keys is: not this store's for it
    // (skipped for latest, counted); asked for by id, refused naming the key.
    assert!(other.latest(&actor("default/web-0")).await.unwrap().is_none());
    assert_eq!(other.status().untrusted_entries, 1);
    let err = other.checkout(&info.id, None).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnknownKey { .. }) && msg.contains("default/web-0@1") && msg.contains("\"k1\""), "{msg}");
    let mut cfg_c = s3_config(&gw, &tmp.path().join("c"), "sealed");
    cfg_c.keyring = k1();
    let node_c = Store::open(cfg_c).await.unwrap();
    let latest = node_c.latest(&actor("default/web-0")).await.unwrap().unwrap();
    let co = node_c.checkout(&latest.id, None).await.unwrap();
    assert_eq!(read_tree(&co.path), original);
    store.shutdown().await;
    other.shutdown().await;
    node_c.shutdown().await;
}

/// Issue 6's lease relies on conditional writes: record that this S3 server
/// honours object_store's PutMode::Create and PutMode::Update (etag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_over_budget_evicts_lru_durable_never_undurable() {
    let gw = VersityGw::start("budget").await;
    let tmp = tempfile::tempdir().unwrap();
    eviction_scenario(s3_config(&gw, &tmp.path().join("store"), "budget")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server_honours_conditional_put() {
    let gw = VersityGw::start("torpor-store-cas").await;
    let s3 = gw.builder().build().unwrap();
    let p = OPath::from("actors/x/_lease");
    let put = |body: &'static str, mode: PutMode| {
        let (s3, p) = (&s3, &p);
        async move { s3.put_opts(p, PutPayload::from_static(body.as_bytes()), PutOptions { mode, ..Default::default() }).await }
    };
    let v1 = put("one", PutMode::Create).await.unwrap();
    assert!(v1.e_tag.is_some(), "the server returns an etag");
    let err = put("two", PutMode::Create).await.unwrap_err();
    assert!(matches!(err, object_store::Error::AlreadyExists { .. }), "Create on an existing key: {err:?}");
    let v1v = UpdateVersion { e_tag: v1.e_tag.clone(), version: v1.version.clone() };
    let v2 = put("three", PutMode::Update(v1v.clone())).await.unwrap();
    assert_ne!(v2.e_tag, v1.e_tag);
    let err = put("four", PutMode::Update(v1v)).await.unwrap_err();
    assert!(matches!(err, object_store::Error::Precondition { .. }), "Update with a stale etag: {err:?}");
    let body = s3.get(&p).await.unwrap().bytes().await.unwrap();
    assert_eq!(&body[..], b"three");
    // Update of a key that does not exist is refused too.
    let err = put("five", PutMode::Update(UpdateVersion { e_tag: Some("\"0123\"".into()), version: None })).await.map(|_| ()).unwrap_err();
    assert!(matches!(err, object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }), "{err:?}");
}

/// Two nodes sharing the bucket: one holds an actor's lease, the other is
/// refused naming it; a surrender lets the other take it (epoch bumped); the
/// node that lost it cannot publish a manifest (fenced); a lease that is not
/// renewed expires and can be taken over; a restore never goes below the
/// lease's durable generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_actor_lease_fences_two_nodes() {
    let gw = VersityGw::start("torpor-store-lease").await;
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = |tmp: &std::path::Path, id: &str| {
        let mut c = s3_config(&gw, tmp, "cluster/objects");
        c.node_id = id.to_string();
        c.lease_ttl = Duration::from_secs(2);
        c
    };
    let a = Store::open(node(ta.path(), "node-a")).await.unwrap();
    let b = Store::open(node(tb.path(), "node-b")).await.unwrap();
    let x = actor("default/x");

    let g = a.acquire(&x, "shim-a1").await.unwrap();
    assert_eq!(g.epoch, 1);
    assert!(g.previous.is_none());
    // The same node again (another shim of it: the node-local claim decides).
    assert_eq!(a.acquire(&x, "shim-a2").await.unwrap().epoch, 1);
    let err = b.acquire(&x, "shim-b1").await.unwrap_err();
    assert!(matches!(err, Error::LeaseHeld { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("default/x") && msg.contains("node-a") && msg.contains("shim-a2"), "{msg}");

    // A commits and uploads generation 1, then the actor leaves A.
    let st = a.begin(&x).await.unwrap();
    write_tree(&st.path, 21, 1024 * 1024);
    let one = a.commit(&st.id, CommitOptions::default()).await.unwrap();
    a.upload(&one.id, None).await.unwrap();
    a.surrender(&x, "shim-a2").await.unwrap();
    assert!(a.actor_leases().unwrap().is_empty(), "released once the newest snapshot is durable");

    // B takes it: epoch 2, and generation 1 as the floor.
    let g = b.acquire(&x, "shim-b1").await.unwrap();
    assert_eq!((g.epoch, g.durable_generation), (2, 1));
    assert_eq!(g.previous.as_ref().map(|p| (p.node.as_str(), p.released)), Some(("node-a", true)));
    assert_eq!(b.latest(&x).await.unwrap().unwrap().id.generation, 1);

    // A, which no longer holds it, cannot publish a newer generation.
    let st = a.begin(&x).await.unwrap();
    write_tree(&st.path, 22, 1024 * 1024);
    let stale = a.commit(&st.id, CommitOptions::default()).await.unwrap();
    let err = a.upload(&stale.id, None).await.unwrap_err();
    assert!(err.to_string().contains("node-b"), "fenced, naming the holder: {err}");
    assert!(b.remote().get_manifest(&stale.id).await.unwrap().is_none(), "no manifest published by the fenced node");

    // B renews (its lease worker) while it lives; stopped, its lease expires
    // and A may take the actor back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let err = a.acquire(&x, "shim-a3").await.unwrap_err();
    assert!(matches!(err, Error::LeaseHeld { .. }), "renewed by node-b's lease worker: {err}");
    b.shutdown().await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let g = a.acquire(&x, "shim-a3").await.unwrap();
    assert_eq!(g.epoch, 3);
    assert_eq!(g.previous.as_ref().map(|p| (p.node.as_str(), p.released)), Some(("node-b", false)), "taken over after expiry");

    // A drops its stale generation and lets go; node C takes the actor with
    // generation 1 as its floor: a listing without it is refused.
    a.remove(&stale.id).await.unwrap();
    a.surrender(&x, "shim-a3").await.unwrap();
    assert!(a.actor_leases().unwrap().is_empty());
    let tc = tempfile::tempdir().unwrap();
    let c = Store::open(node(tc.path(), "node-c")).await.unwrap();
    let g = c.acquire(&x, "shim-c1").await.unwrap();
    assert_eq!((g.epoch, g.durable_generation), (4, 1));
    gw.builder()
        .build()
        .unwrap()
        .delete(&OPath::from("cluster/objects/actors/default/x/_gen/00000000000000000001/manifest.json"))
        .await
        .unwrap();
    let err = c.latest(&x).await.unwrap_err();
    assert!(err.to_string().contains("generation 1"), "{err}");
    c.shutdown().await;
    a.shutdown().await;
}

/// Two nodes share a bucket. Node 1's chunk index trusts the chunks it
/// uploaded; once no manifest references them any more, node 2's sweep
/// deletes them. Node 1's next upload of the same content must not take the
/// index's word for it: it checks them (HEAD), finds them gone and sends them
/// again, so its manifest never names a missing chunk — a third node fetches
/// and verifies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_chunks_swept_by_another_node_are_sent_again() {
    use torpor_store::GcPolicy;
    let gw = VersityGw::start("torpor-store-sweep-race").await;
    let tmp = tempfile::tempdir().unwrap();
    let node = |dir: &str, id: &str| {
        let mut c = s3_config(&gw, &tmp.path().join(dir), "shared");
        c.node_id = id.to_string();
        c
    };
    let one = Store::open(node("one", "node-1")).await.unwrap();
    let two = Store::open(node("two", "node-2")).await.unwrap();
    let x = actor("default/x");
    let chunk_dir = gw.dir.path().join("data/torpor-store-sweep-race/shared/chunks");

    // Node 1: generation 1 uploaded, then removed: its chunks are unreferenced.
    let st = one.begin(&x).await.unwrap();
    write_tree(&st.path, 41, 3 * 1024 * 1024);
    let tree = stored(&read_tree(&st.path));
    let g1 = one.commit(&st.id, CommitOptions::default()).await.unwrap();
    one.upload(&g1.id, None).await.unwrap();
    one.remove(&g1.id).await.unwrap();
    let uploaded = files_under(&chunk_dir).len();
    assert!(uploaded >= 4 && uploaded as u64 == g1.chunk_count, "{uploaded} chunk objects for {} chunks", g1.chunk_count);

    // Node 2 sweeps them (no grace).
    let rep = two.gc(GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::ZERO }).await.unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!(rep.chunks_deleted as usize, uploaded);
    assert!(files_under(&chunk_dir).is_empty());

    // Node 1: the same content again, as generation 2.
    let st = one.begin(&x).await.unwrap();
    write_tree(&st.path, 41, 3 * 1024 * 1024);
    let g2 = one.commit(&st.id, CommitOptions::default()).await.unwrap();
    one.upload(&g2.id, None).await.unwrap();

    // A third node restores it from the bucket alone, every chunk verified.
    let three = Store::open(node("three", "node-3")).await.unwrap();
    let latest = three.latest(&x).await.unwrap().unwrap();
    assert_eq!(latest.id, g2.id);
    let co = three.checkout(&latest.id, None).await.unwrap();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), tree);
    three.release(&co.lease).await.unwrap();
    let status = one.status();
    assert_eq!((status.chunks_checked, status.chunks_missing), (uploaded as u64, uploaded as u64), "{status:?}");
    assert_eq!(files_under(&chunk_dir).len(), uploaded, "every chunk sent again");

    // Generation 3, same content again: generation 2's manifest vouches for
    // its chunks (no HEAD per chunk, nothing sent).
    let sent = one.status().uploaded_chunks;
    let st = one.begin(&x).await.unwrap();
    write_tree(&st.path, 41, 3 * 1024 * 1024);
    let g3 = one.commit(&st.id, CommitOptions::default()).await.unwrap();
    one.upload(&g3.id, None).await.unwrap();
    let status = one.status();
    assert_eq!((status.chunks_checked, status.uploaded_chunks), (uploaded as u64, sent), "{status:?}");
    for s in [&one, &two, &three] {
        s.shutdown().await;
    }
}

/// A checkout on one node that fetched a snapshot pins it in the bucket:
/// the retention of another node (gc, remove) keeps it until the checkout
/// is released (the clone of a golden snapshot whose actor lives elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_checkout_on_another_node_pins_its_snapshot() {
    use torpor_store::GcPolicy;
    let gw = VersityGw::start("torpor-store-pins").await;
    let tmp = tempfile::tempdir().unwrap();
    let node = |dir: &str, id: &str| {
        let mut c = s3_config(&gw, &tmp.path().join(dir), "shared");
        c.node_id = id.to_string();
        c
    };
    let owner = Store::open(node("a", "node-a")).await.unwrap();
    let cloner = Store::open(node("b", "node-b")).await.unwrap();
    let golden = actor("golden/base");
    let mut gens = Vec::new();
    for seed in [51, 52] {
        let st = owner.begin(&golden).await.unwrap();
        write_tree(&st.path, seed, 2 * 1024 * 1024);
        let s = owner.commit(&st.id, CommitOptions::default()).await.unwrap();
        owner.upload(&s.id, None).await.unwrap();
        gens.push(s);
    }
    let source = gens[0].id.clone();
    let tree = read_tree(&gens[0].path);

    let co = cloner.checkout(&source, None).await.unwrap();
    assert!(co.fetched);
    assert_eq!(read_tree(&co.path), tree);
    let pins_dir = gw.dir.path().join("data/torpor-store-pins/shared/actors/golden/base/_pins");
    let pins = files_under(&pins_dir);
    assert_eq!(pins.len(), 1, "one pin while the checkout holds it");
    let pin: serde_json::Value = serde_json::from_slice(&std::fs::read(&pins[0]).unwrap()).unwrap();
    assert_eq!((pin["node"].as_str(), pin["snapshot"].as_str()), (Some("node-b"), Some("golden/base@1")), "{pin}");

    // The owner's retention keeps it; a removal is refused naming the node.
    let rep = owner.gc(GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::ZERO }).await.unwrap();
    assert_eq!((rep.removed.len(), rep.kept_pinned.clone()), (0, vec![source.clone()]), "{rep:?}");
    assert!(owner.remote().get_manifest(&source).await.unwrap().is_some());
    let err = owner.remove(&source).await.unwrap_err();
    assert!(matches!(err, Error::PinnedElsewhere { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("golden/base@1") && msg.contains("node-b"), "{msg}");

    // Released: the pin goes, and so does the superseded generation.
    cloner.release(&co.lease).await.unwrap();
    assert!(files_under(&pins_dir).is_empty(), "the pin is deleted at release");
    let rep = owner.gc(GcPolicy { keep_newest: 1, actor: None, sweep_chunks: true, chunk_grace: Duration::ZERO }).await.unwrap();
    assert_eq!(rep.removed, vec![source.clone()], "{rep:?}");
    owner.shutdown().await;
    cloner.shutdown().await;
}
