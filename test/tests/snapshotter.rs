//! torpor-snapshotter, the rig's proxy snapshotter `torpor`, through the real
//! containerd: `ctr snapshots --snapshotter torpor` (prepare/commit/view/remove
//! chains, mounts, usage, labels, ls/tree), image unpack, a pod of the torpor
//! runtime whose rootfs lives in it, and restarts of the daemon (SIGTERM and
//! SIGKILL) with every snapshot intact. Some checks also talk to the daemon's
//! socket directly (containerd's snapshots gRPC API) to see what containerd's
//! metadata layer would hide.
//!
//! The restart tests stop the rig's daemon: they take the write side of
//! `DAEMON`, every other test here the read side.

#![allow(clippy::result_large_err)] // tonic::Status, in test helpers

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use containerd_snapshots::api::snapshots::v1 as grpc;
use containerd_snapshots::api::snapshots::v1::snapshots_client::SnapshotsClient;
use containerd_snapshots::tonic;
use torpor_tests::*;

const NS: &str = "default";

static DAEMON: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    DAEMON.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    DAEMON.write().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------ the daemon

/// Where the rig's torpor-snapshotter lives (test/rig/env.sh).
struct Daemon {
    root: PathBuf,
    socket: PathBuf,
    pidfile: PathBuf,
    log: PathBuf,
    rig_dir: PathBuf,
}

fn env_path(key: &str, default: String) -> PathBuf {
    match std::env::var(key) {
        Ok(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(default),
    }
}

fn daemon() -> Daemon {
    let root = std::env::var("TORPOR_RIG_ROOT").unwrap_or_else(|_| "/var/lib/torpor-test".into());
    let state = &rig().state_dir;
    Daemon {
        root: env_path("TORPOR_RIG_SNAPSHOTTER_ROOT", format!("{root}/snapshotter")),
        socket: env_path("TORPOR_RIG_SNAPSHOTTER_SOCKET", format!("{state}/torpor/snapshotter.sock")),
        pidfile: env_path("TORPOR_RIG_SNAPSHOTTER_PIDFILE", format!("{state}/snapshotter.pid")),
        log: env_path("TORPOR_RIG_SNAPSHOTTER_LOG", format!("{state}/snapshotter.log")),
        rig_dir: env_path("TORPOR_RIG_DIR", concat!(env!("CARGO_MANIFEST_DIR"), "/rig").to_string()),
    }
}

impl Daemon {
    fn pid(&self) -> u32 {
        let s = std::fs::read_to_string(&self.pidfile).unwrap_or_else(|e| panic!("read {}: {e}", self.pidfile.display()));
        let pid: u32 = s.trim().parse().unwrap_or_else(|e| panic!("pid file {}: {s:?}: {e}", self.pidfile.display()));
        assert!(Path::new(&format!("/proc/{pid}")).exists(), "torpor-snapshotter (pid {pid}) is not running");
        pid
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

// ------------------------------------------------------ ctr snapshots

fn snap(ns: &str, args: &[&str]) -> Output {
    let mut a = vec!["snapshots", "--snapshotter", "torpor"];
    a.extend_from_slice(args);
    ctr(ns, &a)
}

#[track_caller]
fn snap_ok(args: &[&str]) -> String {
    snap(NS, args).ok()
}

/// Snapshots (namespace `default`) removed in reverse order of creation on drop.
struct Snapshots(Vec<String>);

impl Snapshots {
    fn new() -> Self {
        Snapshots(Vec::new())
    }

    fn key(&mut self, prefix: &str) -> String {
        let k = unique_name(prefix);
        self.0.push(k.clone());
        k
    }

    /// `prepare --mounts` (or `view --mounts`): the mounts as JSON.
    ///
    /// `ctr snapshots prepare` labels the snapshot `containerd.io/gc.root`,
    /// `ctr snapshots view` does not: containerd's garbage collector would
    /// take a fresh view (and leave its parent with a dangling child). So a
    /// view is referenced from its (rooted) parent before it is made.
    #[track_caller]
    fn create(&mut self, verb: &str, prefix: &str, parent: Option<&str>) -> (String, Vec<Mount>) {
        let key = self.key(prefix);
        if verb == "view" {
            let p = parent.expect("a view in these tests has a parent");
            snap_ok(&["label", p, &format!("containerd.io/gc.ref.snapshot.torpor/{key}={key}")]);
        }
        let mut a = vec![verb, "--mounts", key.as_str()];
        if let Some(p) = parent {
            a.push(p);
        }
        let out = snap_ok(&a);
        (key, parse_mounts(&out))
    }

    /// Commits `key` as a fresh name (registered instead of `key`).
    #[track_caller]
    fn commit(&mut self, key: &str, prefix: &str) -> String {
        let name = unique_name(prefix);
        snap_ok(&["commit", &name, key]);
        self.0.retain(|k| k != key);
        self.0.push(name.clone());
        name
    }
}

impl Drop for Snapshots {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            for k in self.0.iter().rev() {
                let _ = snap(NS, &["rm", k]);
            }
        });
    }
}

#[derive(Debug, Clone)]
struct Mount {
    kind: String,
    source: String,
    options: Vec<String>,
}

impl Mount {
    fn option(&self, key: &str) -> Option<&str> {
        self.options.iter().find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    }
}

#[track_caller]
fn parse_mounts(json: &str) -> Vec<Mount> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("mounts JSON {json:?}: {e}"));
    v.as_array()
        .unwrap_or_else(|| panic!("mounts JSON is not a list: {json}"))
        .iter()
        .map(|m| Mount {
            kind: m["Type"].as_str().unwrap_or_default().to_string(),
            source: m["Source"].as_str().unwrap_or_default().to_string(),
            options: m["Options"].as_array().map(|o| o.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default(),
        })
        .collect()
}

/// The upper dir (`…/snapshots/<id>/fs`) of a snapshot, from the label the
/// rig's daemon adds (`upperdir_label = true`).
#[track_caller]
fn upper_of(ns: &str, key: &str) -> PathBuf {
    let out = snap(ns, &["info", key]).ok();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = v["Labels"]["containerd.io/snapshot/overlay.upperdir"].as_str().unwrap_or_else(|| panic!("no upperdir label on {key}: {out}"));
    PathBuf::from(p)
}

/// A snapshot mounted (with the mount command `ctr snapshots mounts` prints)
/// on a temp dir; unmounted on drop.
struct Mounted {
    target: PathBuf,
    _dir: TempDir,
}

impl Mounted {
    #[track_caller]
    fn new(key: &str) -> Mounted {
        let dir = TempDir::new("snap-mnt");
        let target = dir.path().join("m");
        std::fs::create_dir(&target).unwrap();
        let cmd = snap_ok(&["mounts", target.to_str().unwrap(), key]);
        let argv: Vec<&str> = cmd.split_whitespace().collect();
        assert_eq!(argv.first(), Some(&"mount"), "ctr snapshots mounts printed {cmd:?}");
        run("mount", &argv[1..]).ok();
        Mounted { target, _dir: dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.target.join(rel)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            let _ = run("umount", [self.target.to_str().unwrap()]);
        });
    }
}

/// `ctr snapshots usage -b <key>`: (bytes, inodes).
#[track_caller]
fn usage(key: &str) -> (u64, u64) {
    let out = snap_ok(&["usage", "-b", key]);
    let line = out.lines().find(|l| l.split_whitespace().next() == Some(key)).unwrap_or_else(|| panic!("no usage line for {key}:\n{out}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[1].parse().unwrap(), f[2].parse().unwrap())
}

fn kind_in_ls(ls: &str, key: &str) -> Option<String> {
    ls.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&key)).then(|| f.last().unwrap_or(&"").to_string())
    })
}

// ------------------------------------------- the daemon's socket, directly

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

async fn client(socket: &Path) -> SnapshotsClient<tonic::transport::Channel> {
    let socket = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| tokio::net::UnixStream::connect(socket.clone())))
        .await
        .expect("connect to torpor-snapshotter's socket");
    SnapshotsClient::new(channel)
}

/// Every snapshot the daemon has, as it reports them (backend keys:
/// containerd's metadata layer names them `<namespace>/<n>/<key>`).
fn backend_list(filters: &[&str]) -> Result<Vec<grpc::Info>, tonic::Status> {
    let d = daemon();
    block_on(async {
        let mut c = client(&d.socket).await;
        let mut stream = c
            .list(grpc::ListSnapshotsRequest { snapshotter: "torpor".into(), filters: filters.iter().map(|s| s.to_string()).collect() })
            .await?
            .into_inner();
        let mut all = Vec::new();
        while let Some(batch) = stream.message().await? {
            all.extend(batch.info);
        }
        Ok(all)
    })
}

/// The backend key of `key` in namespace `ns`.
#[track_caller]
fn backend_key(ns: &str, key: &str) -> String {
    let all = backend_list(&[]).expect("list");
    let prefix = format!("{ns}/");
    let suffix = format!("/{key}");
    all.into_iter()
        .map(|i| i.name)
        .find(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
        .unwrap_or_else(|| panic!("torpor-snapshotter has no snapshot for {ns}/{key}"))
}

fn backend_stat(key: &str) -> Result<grpc::Info, tonic::Status> {
    let d = daemon();
    block_on(async {
        let mut c = client(&d.socket).await;
        let r = c.stat(grpc::StatSnapshotRequest { snapshotter: "torpor".into(), key: key.into() }).await?;
        Ok(r.into_inner().info.unwrap_or_default())
    })
}

fn backend_remove(key: &str) -> Result<(), tonic::Status> {
    let d = daemon();
    block_on(async {
        let mut c = client(&d.socket).await;
        c.remove(grpc::RemoveSnapshotRequest { snapshotter: "torpor".into(), key: key.into() }).await?;
        Ok(())
    })
}

// ---------------------------------------------------------------- tests

#[test]
fn prepare_commit_view_chain_mounts_and_usage() {
    let _g = shared();
    require_rig();
    let d = daemon();
    let mut s = Snapshots::new();

    // a: no parent -> a read-write bind mount of its own fs, below the daemon's root
    let (a, m) = s.create("prepare", "snap-a", None);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0].kind, "bind", "{m:?}");
    assert!(m[0].options.contains(&"rw".to_string()), "{m:?}");
    let a_upper = PathBuf::from(&m[0].source);
    assert!(a_upper.starts_with(d.snapshots_dir()) && a_upper.ends_with("fs"), "{} is not <root>/snapshots/<id>/fs", a_upper.display());
    {
        let mnt = Mounted::new(&a);
        std::fs::write(mnt.path("a.txt"), "A").unwrap();
        std::fs::write(mnt.path("shared"), "from-a").unwrap();
        std::fs::write(mnt.path("gone"), "deleted in b").unwrap();
    }
    assert_eq!(std::fs::read_to_string(a_upper.join("a.txt")).unwrap(), "A");
    let ca = s.commit(&a, "snap-A");
    assert_eq!(upper_of(NS, &ca), a_upper, "commit keeps the snapshot's directory");

    // b on A: overlay, lower = A, upper/work = its own
    let (b, m) = s.create("prepare", "snap-b", Some(&ca));
    assert_eq!(m[0].kind, "overlay", "{m:?}");
    assert_eq!(m[0].option("lowerdir"), Some(a_upper.to_str().unwrap()), "{m:?}");
    let b_upper = PathBuf::from(m[0].option("upperdir").expect("upperdir"));
    assert!(b_upper.starts_with(d.snapshots_dir()), "{m:?}");
    let b_work = m[0].option("workdir").expect("workdir");
    assert_eq!(Path::new(b_work), b_upper.parent().unwrap().join("work"));
    let (bytes0, _) = usage(&b);
    {
        let mnt = Mounted::new(&b);
        assert_eq!(std::fs::read_to_string(mnt.path("a.txt")).unwrap(), "A");
        std::fs::write(mnt.path("b.txt"), "B").unwrap();
        std::fs::write(mnt.path("shared"), "from-b").unwrap();
        std::fs::remove_file(mnt.path("gone")).unwrap();
        std::fs::write(mnt.path("big"), vec![0x5au8; 1 << 20]).unwrap();
    }
    // usage of an active snapshot: walked in its upper dir
    let (bytes, inodes) = usage(&b);
    assert!(bytes >= bytes0 + (1 << 20), "usage after writing 1 MiB: {bytes} (before {bytes0})");
    // root, b.txt, shared, big, the whiteout of `gone`
    assert!(inodes >= 5, "inodes {inodes}");
    let cb = s.commit(&b, "snap-B");
    assert_eq!(usage(&cb), (bytes, inodes), "committed usage is the one measured at commit");

    // a view on B (two layers): read-only overlay, nearest layer first
    let (v, m) = s.create("view", "snap-v", Some(&cb));
    assert_eq!(m[0].kind, "overlay", "{m:?}");
    assert_eq!(m[0].option("lowerdir"), Some(format!("{}:{}", b_upper.display(), a_upper.display()).as_str()), "{m:?}");
    assert!(m[0].option("upperdir").is_none(), "{m:?}");
    {
        let mnt = Mounted::new(&v);
        assert_eq!(std::fs::read_to_string(mnt.path("shared")).unwrap(), "from-b");
        assert_eq!(std::fs::read_to_string(mnt.path("a.txt")).unwrap(), "A");
        assert!(!mnt.path("gone").exists(), "the whiteout in B hides A's file");
        assert!(std::fs::write(mnt.path("new"), "x").is_err(), "a view is read-only");
    }
    // a view on the single layer A: a read-only bind mount of A
    let (v1, m) = s.create("view", "snap-v1", Some(&ca));
    assert_eq!(m[0].kind, "bind", "{m:?}");
    assert_eq!(PathBuf::from(&m[0].source), a_upper);
    assert!(m[0].options.contains(&"ro".to_string()), "{m:?}");

    // ls / tree / info
    let ls = snap_ok(&["ls"]);
    assert_eq!(kind_in_ls(&ls, &ca).as_deref(), Some("Committed"), "{ls}");
    assert_eq!(kind_in_ls(&ls, &cb).as_deref(), Some("Committed"), "{ls}");
    assert_eq!(kind_in_ls(&ls, &v).as_deref(), Some("View"), "{ls}");
    let tree = snap_ok(&["tree"]);
    let pos = |k: &str| {
        tree.lines().position(|l| l.trim_start_matches([' ', '\\', '_']).trim() == k).unwrap_or_else(|| panic!("{k} not in tree:\n{tree}"))
    };
    assert!(pos(&ca) < pos(&cb) && pos(&cb) < pos(&v), "tree order:\n{tree}");
    let info: serde_json::Value = serde_json::from_str(&snap_ok(&["info", &cb])).unwrap();
    assert_eq!(info["Kind"], "Committed", "{info}");
    assert_eq!(info["Parent"], ca.as_str(), "{info}");
    let vinfo = backend_stat(&backend_key(NS, &v1)).unwrap();
    assert_eq!(vinfo.kind, grpc::Kind::View as i32, "{vinfo:?}");

    // refusals, as containerd's overlay snapshotter
    let again = snap(NS, &["prepare", &a_dup_key(&cb), &cb]);
    assert!(again.success(), "{again}");
    s.0.push(a_dup_key(&cb));
    let dup = snap(NS, &["prepare", &a_dup_key(&cb), &cb]);
    assert!(!dup.success() && dup.all_output().contains("already exists"), "{dup}");
    let bad = snap(NS, &["commit", &unique_name("snap-x"), &v]);
    assert!(!bad.success(), "a view cannot be committed: {bad}");
    let on_active = snap(NS, &["prepare", &unique_name("snap-y"), &a_dup_key(&cb)]);
    assert!(!on_active.success(), "the parent must be committed: {on_active}");

    drop(s);
    for p in [&a_upper, &b_upper] {
        wait_collected(p);
    }
}

/// Waits until containerd's garbage collector has removed `upper` from the
/// snapshotter.
///
/// containerd removes a snapshot from its metadata at `rm` and from the
/// snapshotter in a later collection. Its scheduler drops the deletions it
/// hears of while a collection runs, and then skips the collections that
/// follow (plugins/gc/scheduler.go), so a test cannot wait for it to come by
/// itself. Deleting a lease with `--sync` runs a collection and waits for it.
#[track_caller]
fn wait_collected(upper: &Path) {
    wait_for(&format!("{} removed", upper.display()), LIVENESS, || {
        if !upper.exists() {
            return Some(());
        }
        let id = unique_name("snap-gc");
        ctr(NS, &["leases", "create", "--id", &id]).ok();
        ctr(NS, &["leases", "delete", "--sync", &id]).ok();
        (!upper.exists()).then_some(())
    });
}

/// A key derived from another (for the already-exists check).
fn a_dup_key(base: &str) -> String {
    format!("{base}-dup")
}

#[test]
fn labels_and_list_filters_reach_the_snapshotter() {
    let _g = shared();
    require_rig();
    let mut s = Snapshots::new();
    let (a, _) = s.create("prepare", "snap-label", None);
    let c = s.commit(&a, "snap-label-c");
    let bkey = backend_key(NS, &c);

    // containerd forwards containerd.io/snapshot/* labels to the snapshotter
    let label = "containerd.io/snapshot/torpor.test";
    snap_ok(&["label", &c, &format!("{label}=one"), "local-only=x"]);
    let info = backend_stat(&bkey).unwrap();
    assert_eq!(info.labels.get(label).map(String::as_str), Some("one"), "{info:?}");
    assert!(!info.labels.contains_key("local-only"), "{info:?}");
    snap_ok(&["label", &c, &format!("{label}=two")]);
    assert_eq!(backend_stat(&bkey).unwrap().labels.get(label).map(String::as_str), Some("two"));
    let shown: serde_json::Value = serde_json::from_str(&snap_ok(&["info", &c])).unwrap();
    assert_eq!(shown["Labels"][label], "two", "{shown}");

    // List with containerd's filter syntax, on the daemon's socket
    let names = |f: &[&str]| -> Vec<String> { backend_list(f).unwrap().into_iter().map(|i| i.name).collect() };
    let by_label = names(&[&format!("labels.\"{label}\"==two")]);
    assert_eq!(by_label, vec![bkey.clone()]);
    assert!(names(&["kind==committed"]).contains(&bkey));
    assert!(!names(&["kind==active"]).contains(&bkey));
    assert!(names(&["kind==active", &format!("name=={bkey}")]).contains(&bkey), "filters OR");
    // unique names are [a-z0-9-]: no regex metacharacters
    assert!(names(&[&format!("name~=/{c}$/")]).contains(&bkey));
    let e = backend_list(&["kind=="]).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    // removing the label
    snap_ok(&["label", &c, &format!("{label}=")]);
    let info = backend_stat(&bkey).unwrap();
    assert!(!info.labels.contains_key(label), "{info:?}");
}

#[test]
fn remove_is_refused_while_children_exist() {
    let _g = shared();
    require_rig();
    let d = daemon();
    let mut s = Snapshots::new();
    let (p, m) = s.create("prepare", "snap-parent", None);
    let p_upper = PathBuf::from(&m[0].source);
    let pc = s.commit(&p, "snap-parent-c");
    let (child, m) = s.create("prepare", "snap-child", Some(&pc));
    let child_upper = PathBuf::from(m[0].option("upperdir").unwrap());

    let out = snap(NS, &["rm", &pc]);
    assert!(!out.success(), "ctr rm of a parent must fail: {out}");
    // containerd's metadata layer refuses too; the daemon itself must as well
    let bparent = backend_key(NS, &pc);
    let e = backend_remove(&bparent).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("children"), "{e:?}");
    assert!(p_upper.is_dir(), "a refused remove leaves the files");
    let e = backend_stat("no/such/snapshot").unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // containerd removes from the snapshotter in its garbage collection
    snap_ok(&["rm", &child]);
    wait_collected(&child_upper);
    snap_ok(&["rm", &pc]);
    s.0.clear();
    wait_collected(&p_upper);
    let e = backend_stat(&bparent).unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(d.snapshots_dir().is_dir());
}

/// Removes a containerd namespace with its images (GC run synchronously).
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            let ns = self.0.clone();
            let imgs = ctr(&ns, &["images", "ls", "-q"]).stdout;
            for i in imgs.lines().filter(|l| !l.trim().is_empty()) {
                let _ = ctr(&ns, &["images", "rm", "--sync", i.trim()]);
            }
            for sn in ["torpor", "overlayfs"] {
                let ls = snap_like(&ns, sn, &["ls"]).stdout;
                let keys: Vec<String> = ls.lines().skip(1).filter_map(|l| l.split_whitespace().next().map(String::from)).collect();
                for k in keys.iter().rev() {
                    let _ = snap_like(&ns, sn, &["rm", k]);
                }
            }
            let _ = ctr("default", &["namespaces", "rm", &ns]);
        });
    }
}

fn snap_like(ns: &str, snapshotter: &str, args: &[&str]) -> Output {
    let mut a = vec!["snapshots", "--snapshotter", snapshotter];
    a.extend_from_slice(args);
    ctr(ns, &a)
}

fn actor_image_tar() -> PathBuf {
    let dir = env_path("TORPOR_IMAGES_DIR", "/var/cache/torpor/images".into());
    let rd = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    rd.flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "tar") && p.file_name().unwrap().to_string_lossy().contains("actor"))
        .unwrap_or_else(|| panic!("no actor image tar in {}", dir.display()))
}

#[test]
fn image_unpacks_through_it_and_a_container_runs_on_it() {
    let _g = shared();
    require_rig();
    let d = daemon();
    let ns = Namespace(unique_name("snaptest"));
    let tar = actor_image_tar();
    ctr(&ns.0, &["images", "import", "--local", "--snapshotter", "torpor", tar.to_str().unwrap()]).ok();
    // the layer is a committed snapshot of the daemon, with the image's files
    let ls = snap(&ns.0, &["ls"]).ok();
    let committed: Vec<&str> =
        ls.lines().skip(1).filter(|l| l.trim_end().ends_with("Committed")).filter_map(|l| l.split_whitespace().next()).collect();
    assert!(!committed.is_empty(), "no committed snapshot after unpack:\n{ls}");
    let uppers: Vec<PathBuf> = committed.iter().map(|k| upper_of(&ns.0, k)).collect();
    for u in &uppers {
        assert!(u.starts_with(d.snapshots_dir()), "{}", u.display());
    }
    assert!(uppers.iter().any(|u| u.join("actor").is_file()), "/actor is in none of the unpacked layers {uppers:?}");
    let bk = backend_key(&ns.0, committed[0]);
    assert!(bk.starts_with(&format!("{}/", ns.0)), "{bk}");

    // and a container runs from it (ctr run --snapshotter torpor)
    let id = unique_name("snap-run");
    let c = CtrContainer::new(&ns.0, &id);
    let out = ctr_run(&ns.0, &["--snapshotter", "torpor"], &id, &["/bin/sh", "-c", "test -x /actor && echo rootfs-ok"]);
    assert!(out.stdout.contains("rootfs-ok"), "{out}");
    drop(c);
}

/// The mountinfo line of a container's rootfs (`<bundle>/rootfs`).
fn rootfs_mount(container_id: &str) -> Option<String> {
    mounts_mentioning(&format!("/{container_id}/rootfs")).into_iter().find(|l| l.contains(" - overlay "))
}

#[test]
fn pod_rootfs_lives_in_the_snapshotter() {
    let _g = shared();
    let d = daemon();
    let pod = Pod::run("snap-pod");
    let cid = pod.start_actor("c", &["sleep"]);
    wait_container_state(&cid, "CONTAINER_RUNNING");
    let line = rootfs_mount(&cid).unwrap_or_else(|| panic!("no overlay rootfs mount for {cid}:\n{}", mounts_mentioning(&cid).join("\n")));
    let upper =
        line.split([',', ' ']).find_map(|o| o.strip_prefix("upperdir=")).unwrap_or_else(|| panic!("no upperdir in {line}")).to_string();
    let upper = PathBuf::from(upper);
    if is_torpor() {
        assert!(
            upper.starts_with(d.snapshots_dir()),
            "runtime torpor's rootfs upper {} is not below torpor-snapshotter's root {}",
            upper.display(),
            d.root.display()
        );
    } else {
        assert!(
            upper.to_string_lossy().contains("io.containerd.snapshotter.v1.overlayfs"),
            "runtime {}'s rootfs should be on overlayfs: {line}",
            runtime_handler()
        );
    }
    // what the container writes lands in that upper dir
    crictl_ok(&["exec", &cid, "/bin/sh", "-c", "echo marker > /torpor-marker"]);
    assert_eq!(std::fs::read_to_string(upper.join("torpor-marker")).unwrap_or_default(), "marker\n");
    pod.remove();
    // containerd removes the container's snapshot (through the daemon)
    wait_collected(&upper);
}

// ------------------------------------------------------------ restarts

/// What the daemon reports of one snapshot: kind, parent, labels, creation time (ns).
type SnapshotInfo = (i32, String, BTreeMap<String, String>, Option<i64>);

/// What the daemon reports, comparable across restarts.
fn backend_state() -> BTreeMap<String, SnapshotInfo> {
    backend_list(&[])
        .expect("list")
        .into_iter()
        .map(|i| {
            (i.name, (i.kind, i.parent, i.labels.into_iter().collect(), i.created_at.map(|t| t.seconds * 1_000_000_000 + t.nanos as i64)))
        })
        .collect()
}

fn wait_gone(pid: u32) {
    wait_for(&format!("torpor-snapshotter (pid {pid}) to exit"), LIVENESS, || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()));
}

/// Starts the daemon again the way the rig does (test/rig/up.sh, which
/// reuses the running containerd).
#[track_caller]
fn start_daemon(d: &Daemon) {
    let up = d.rig_dir.join("up.sh");
    run_with(up.to_str().unwrap(), Vec::<String>::new(), None, COMMAND_LIMIT).ok();
    d.pid();
}

fn restart_keeps_every_snapshot(sig: &str) {
    let _g = exclusive();
    require_rig();
    let d = daemon();
    let mut s = Snapshots::new();

    // a chain, an active snapshot with a file, a view
    let (a, _) = s.create("prepare", "rs-a", None);
    {
        let mnt = Mounted::new(&a);
        std::fs::write(mnt.path("kept"), "before restart").unwrap();
    }
    let ca = s.commit(&a, "rs-A");
    let (b, m) = s.create("prepare", "rs-b", Some(&ca));
    let b_upper = PathBuf::from(m[0].option("upperdir").unwrap());
    {
        let mnt = Mounted::new(&b);
        std::fs::write(mnt.path("active"), "in b").unwrap();
    }
    let (v, _) = s.create("view", "rs-v", Some(&ca));
    let b_usage = usage(&b);
    // a pod running across the restart
    let pod = Pod::run("snap-restart");
    let cid = pod.start_actor("c", &["sleep"]);
    wait_container_state(&cid, "CONTAINER_RUNNING");

    // What must survive: this test's snapshots, the pod's, the image layers.
    // (Other snapshots may be removed meanwhile by containerd's GC of earlier tests.)
    let ours = [ca.clone(), b.clone(), v.clone(), cid.clone(), pod.id.clone()];
    let stable = |all: &BTreeMap<String, _>| -> BTreeMap<String, _> {
        all.iter()
            .filter(|(k, _)| k.contains("/sha256:") || ours.iter().any(|o| k.ends_with(&format!("/{o}"))))
            .map(|(k, v): (&String, &SnapshotInfo)| (k.clone(), v.clone()))
            .collect()
    };
    let before = stable(&backend_state());
    assert!(before.len() > ours.len(), "expected this test's snapshots and image layers in {before:?}");
    let pid = d.pid();
    run("kill", [format!("-{sig}"), pid.to_string()]).ok();
    wait_gone(pid);
    let orphans = [d.snapshots_dir().join("new-1-999"), d.snapshots_dir().join("987654321")];
    if sig == "TERM" {
        assert!(!d.socket.exists(), "a clean shutdown removes {}", d.socket.display());
        let log = d.log_text();
        let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        assert!(tail.contains("torpor-snapshotter stopped"), "log tail:\n{tail}");
    } else {
        assert!(d.socket.exists(), "SIGKILL leaves the socket behind");
        // what a crash mid-create leaves: directories without a record
        for o in &orphans {
            std::fs::create_dir_all(o.join("fs")).unwrap();
        }
    }

    start_daemon(&d);
    let after = stable(&backend_state());
    assert_eq!(before, after, "snapshots changed across the restart");
    for o in &orphans {
        assert!(!o.exists(), "orphan {} not removed at start", o.display());
    }
    if sig == "KILL" {
        assert!(d.log_text().contains("replacing stale socket"), "stale socket not replaced");
    }

    // containerd uses it again: mounts, files, usage, commit, new children
    assert_eq!(usage(&b), b_usage);
    assert_eq!(std::fs::read_to_string(b_upper.join("active")).unwrap(), "in b");
    {
        let mnt = Mounted::new(&b);
        assert_eq!(std::fs::read_to_string(mnt.path("kept")).unwrap(), "before restart");
        assert_eq!(std::fs::read_to_string(mnt.path("active")).unwrap(), "in b");
    }
    {
        let mnt = Mounted::new(&v);
        assert_eq!(std::fs::read_to_string(mnt.path("kept")).unwrap(), "before restart");
    }
    let cb = s.commit(&b, "rs-B");
    let (c2, _) = s.create("prepare", "rs-c", Some(&cb));
    {
        let mnt = Mounted::new(&c2);
        assert_eq!(std::fs::read_to_string(mnt.path("active")).unwrap(), "in b");
    }
    // the pod kept running; exec works and a new pod starts on the daemon
    crictl_ok(&["exec", &cid, "/bin/sh", "-c", "echo alive > /after-restart"]);
    let pod2 = Pod::run("snap-restart2");
    let cid2 = pod2.start_actor("c", &["sleep"]);
    wait_container_state(&cid2, "CONTAINER_RUNNING");
    pod2.remove();
    pod.remove();
    drop(s);
    wait_collected(&b_upper);
}

#[test]
fn restart_after_sigterm_keeps_every_snapshot() {
    restart_keeps_every_snapshot("TERM");
}

#[test]
fn restart_after_sigkill_keeps_every_snapshot() {
    restart_keeps_every_snapshot("KILL");
}
