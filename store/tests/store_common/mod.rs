//! Shared fixtures of the store tests: configs, snapshot trees, and a
//! fault-injecting object store wrapper (unit-test mock of the object tier's
//! failures; the S3 tests use a real server).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as OPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult,
};
use torpor_store::{ActorName, Remote, Store, StoreConfig};

pub mod s3;

pub fn actor(s: &str) -> ActorName {
    ActorName::new(s).unwrap()
}

/// A config with background work off (tests drive it) and a file:// object tier.
pub fn config(root: &Path, objects: &Path) -> StoreConfig {
    let mut c = StoreConfig::new(root);
    c.remote_url = format!("file://{}", objects.display());
    c.background = false;
    c.default_keep_local = Duration::from_secs(3600);
    c.retry.initial = Duration::from_millis(50);
    c.retry.max = Duration::from_millis(200);
    c.scan_interval = Duration::from_millis(50);
    c
}

/// Deterministic pseudo-random bytes (incompressible).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        let x = rng.u64(..).to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

/// A small CRIU-like tree: two container dirs, a pages file, small images, an empty file.
pub fn write_tree(dir: &Path, seed: u64, pages_len: usize) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("ctr-a")).unwrap();
    std::fs::create_dir_all(dir.join("ctr-b/sub")).unwrap();
    std::fs::write(dir.join("ctr-a/pages-1.img"), random_bytes(seed, pages_len)).unwrap();
    std::fs::write(dir.join("ctr-a/core-1.img"), vec![b'c'; 5000]).unwrap();
    std::fs::write(dir.join("ctr-b/sub/inventory.img"), format!("seed {seed}")).unwrap();
    std::fs::write(dir.join("ctr-b/empty.img"), b"").unwrap();
    std::fs::set_permissions(dir.join("ctr-a/core-1.img"), std::fs::Permissions::from_mode(0o640)).unwrap();
}

/// Relative path → (mode, contents; None for a directory).
pub type Tree = BTreeMap<String, (u32, Option<Vec<u8>>)>;

/// Relative path → (mode, contents) of every file and directory under `dir`,
/// skipping the store's manifest.
pub fn read_tree(dir: &Path) -> Tree {
    use std::os::unix::fs::MetadataExt;
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, Option<Vec<u8>>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            if rel == "manifest.json" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                out.insert(rel, (meta.mode() & 0o7777, None));
                walk(root, &p, out);
            } else {
                out.insert(rel, (meta.mode() & 0o7777, Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `t` as the store keeps it on disk: every directory 0700, every file 0600
/// (snapshots are process memory; the manifest keeps the writer's modes).
pub fn stored(t: &Tree) -> Tree {
    t.iter().map(|(k, (_, c))| (k.clone(), (if c.is_none() { 0o700 } else { 0o600 }, c.clone()))).collect()
}

/// Poll `f` every 50 ms until it is true; panic with `what` after `limit`
/// (a guard against hanging forever, not a speed assertion).
pub async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Files under `dir` (recursively).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Wraps an object store: can fail every request (object tier unreachable),
/// or hang forever on the n-th chunk PUT/GET (to crash mid-transfer), and
/// counts the bytes of chunk PUTs.
#[derive(Debug)]
pub struct Faulty {
    pub inner: Arc<dyn ObjectStore>,
    pub fail: AtomicBool,
    /// Hang on chunk PUT number n (0-based) and after; -1 = never.
    pub hang_put_at: AtomicI64,
    pub hang_get_at: AtomicI64,
    pub puts: AtomicI64,
    pub gets: AtomicI64,
    pub hung: AtomicBool,
    pub chunk_put_bytes: AtomicU64,
    /// Written when a request hangs (for a parent process watching a child).
    pub marker: Option<PathBuf>,
    /// Manifest PUTs wait this long (ms) before reaching the store (a
    /// holder that stalls right before its commit point); 0 = not at all.
    pub stall_manifest_put_ms: AtomicU64,
    /// PUTs ignore their condition (an object store without If-None-Match
    /// / If-Match): every PUT overwrites.
    pub ignore_conditions: AtomicBool,
    /// Fail chunk PUTs only (uploads fail, everything else works).
    pub fail_chunk_puts: AtomicBool,
}

impl Faulty {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner,
            fail: AtomicBool::new(false),
            hang_put_at: AtomicI64::new(-1),
            hang_get_at: AtomicI64::new(-1),
            puts: AtomicI64::new(0),
            gets: AtomicI64::new(0),
            hung: AtomicBool::new(false),
            chunk_put_bytes: AtomicU64::new(0),
            marker: None,
            stall_manifest_put_ms: AtomicU64::new(0),
            ignore_conditions: AtomicBool::new(false),
            fail_chunk_puts: AtomicBool::new(false),
        })
    }

    pub fn with_marker(inner: Arc<dyn ObjectStore>, marker: PathBuf) -> Arc<Faulty> {
        let f = Faulty::new(inner);
        let mut f = Arc::try_unwrap(f).unwrap();
        f.marker = Some(marker);
        Arc::new(f)
    }

    fn check(&self) -> object_store::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic { store: "faulty", source: "injected: object tier unreachable".into() });
        }
        Ok(())
    }

    async fn maybe_hang(&self, counter: &AtomicI64, at: &AtomicI64) {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let at = at.load(Ordering::SeqCst);
        if at >= 0 && n >= at {
            self.hung.store(true, Ordering::SeqCst);
            if let Some(m) = &self.marker {
                std::fs::write(m, b"hung").unwrap();
            }
            futures::future::pending::<()>().await;
        }
    }

    pub fn remote(self: &Arc<Self>, url: &str) -> Remote {
        Remote::from_store(self.clone(), "", url).unwrap()
    }

    /// A Remote over a file:// directory wrapped by a Faulty; the Remote's url
    /// is the directory's (so a plain store can reopen the same root).
    pub fn over_dir(dir: &Path, marker: Option<PathBuf>) -> (Arc<Faulty>, Remote) {
        std::fs::create_dir_all(dir).unwrap();
        let fs: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap());
        let f = match marker {
            Some(m) => Faulty::with_marker(fs, m),
            None => Faulty::new(fs),
        };
        let r = f.remote(&format!("file://{}", dir.display()));
        (f, r)
    }
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

fn is_chunk(p: &OPath) -> bool {
    p.as_ref().contains("chunks/")
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(&self, location: &OPath, payload: PutPayload, mut opts: PutOptions) -> object_store::Result<PutResult> {
        self.check()?;
        if is_chunk(location) {
            if self.fail_chunk_puts.load(Ordering::SeqCst) {
                return Err(object_store::Error::Generic { store: "faulty", source: "injected: chunk PUT refused".into() });
            }
            self.maybe_hang(&self.puts, &self.hang_put_at).await;
            self.chunk_put_bytes.fetch_add(payload.content_length() as u64, Ordering::SeqCst);
        }
        let stall = self.stall_manifest_put_ms.load(Ordering::SeqCst);
        if stall > 0 && location.filename() == Some("manifest.json") {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
        if self.ignore_conditions.load(Ordering::SeqCst) {
            opts.mode = object_store::PutMode::Overwrite;
        }
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &OPath, opts: PutMultipartOptions) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &OPath, options: GetOptions) -> object_store::Result<GetResult> {
        self.check()?;
        if is_chunk(location) {
            self.maybe_hang(&self.gets, &self.hang_get_at).await;
        }
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(&self, locations: BoxStream<'static, object_store::Result<OPath>>) -> BoxStream<'static, object_store::Result<OPath>> {
        if self.fail.load(Ordering::SeqCst) {
            return futures::stream::once(async {
                Err(object_store::Error::Generic { store: "faulty", source: "injected: object tier unreachable".into() })
            })
            .boxed();
        }
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&OPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if self.fail.load(Ordering::SeqCst) {
            return futures::stream::once(async {
                Err(object_store::Error::Generic { store: "faulty", source: "injected: object tier unreachable".into() })
            })
            .boxed();
        }
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&OPath>) -> object_store::Result<ListResult> {
        self.check()?;
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &OPath, to: &OPath, options: CopyOptions) -> object_store::Result<()> {
        self.check()?;
        self.inner.copy_opts(from, to, options).await
    }
}

/// Open a store over a Faulty-wrapped file:// object tier.
pub async fn open_faulty(cfg: StoreConfig, objects: &Path) -> (Arc<Store>, Arc<Faulty>) {
    let (f, r) = Faulty::over_dir(objects, None);
    (Store::open_with_remote(cfg, r).await.unwrap(), f)
}

#[allow(dead_code)]
pub async fn commit_tree(store: &Store, a: &str, seed: u64, pages: usize) -> torpor_store::SnapshotInfo {
    let st = store.begin(&actor(a)).await.unwrap();
    write_tree(&st.path, seed, pages);
    store.commit(&st.id, torpor_store::CommitOptions::default()).await.unwrap()
}

/// Over the local budget: the least recently used *durable* snapshot is
/// evicted first; a snapshot not yet durable is never evicted (disk pressure
/// uploads it first). Run against each kind of object tier.
#[allow(dead_code)] // not every test binary that includes store_common uses it
pub async fn eviction_scenario(mut cfg: torpor_store::StoreConfig) {
    const MIB: usize = 1024 * 1024;
    // Each tree is 1 MiB of pages + 5006 bytes.
    cfg.local_budget_bytes = (2 * MIB + MIB / 2) as u64;
    let store = Store::open(cfg).await.unwrap();
    let a = commit_tree(&store, "t/a", 1, MIB).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b = commit_tree(&store, "t/b", 2, MIB).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let c = commit_tree(&store, "t/c", 3, MIB).await;
    store.upload(&a.id, None).await.unwrap();
    store.upload(&c.id, None).await.unwrap();
    // Touch a: c becomes the least recently used durable snapshot.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let co = store.checkout(&a.id, None).await.unwrap();
    store.release(&co.lease).await.unwrap();

    store.run_background_pass().await.unwrap();
    let local = |s: &Store| -> Vec<String> {
        futures::executor::block_on(s.list(None)).unwrap().into_iter().filter(|i| i.local).map(|i| i.id.actor.to_string()).collect()
    };
    assert_eq!(local(&store), ["t/a", "t/b"], "c (LRU durable) evicted, b (not durable, oldest) kept");
    assert!(!store.status().disk_pressure);

    let _d = commit_tree(&store, "t/d", 4, MIB).await;
    store.run_background_pass().await.unwrap();
    assert_eq!(local(&store), ["t/b", "t/d"], "a was the only durable local snapshot");

    // Now only undurable snapshots are local: over budget → pressure → they
    // are uploaded regardless of keep-local, then the LRU one is evicted.
    let _e = commit_tree(&store, "t/e", 5, MIB).await;
    let status = store.status();
    assert_eq!(status.pending_uploads, 3);
    store.run_background_pass().await.unwrap();
    let st = store.status();
    assert!(st.disk_pressure || st.local_bytes <= st.local_budget_bytes);
    assert_eq!(local(&store), ["t/d", "t/e"], "b (least recently used) evicted once durable");
    assert!(store.list(None).await.unwrap().iter().all(|i| i.durable));
    assert!(!store.status().disk_pressure);
    let _ = b;
}
