//! The overlayfs proxy snapshotter: containerd's overlay snapshotter semantics
//! (`plugins/snapshots/overlay`) served over containerd's snapshots gRPC API.
//!
//! On disk, under the snapshotter root:
//! - `metadata.db`: the redb metadata database ([`meta`]);
//! - `snapshots/<id>/fs`: a snapshot's files (its overlay upper dir);
//! - `snapshots/<id>/work`: overlayfs' work dir (active snapshots only);
//! - `snapshots/new-*`: a snapshot being created (renamed to `<id>` inside the
//!   metadata transaction, before it commits).
//!
//! Crash consistency: a create renames its directory into place (and fsyncs
//! it) inside the write transaction and only then commits; a remove commits first and
//! deletes the directory afterwards. Either way a crash can only leave a
//! directory without a record, never a record without its directory, and
//! [`Overlay::cleanup`] (run at every start, and on containerd's `Cleanup`)
//! removes such orphans.

pub mod filters;
pub mod meta;
pub mod mounts;
pub mod usage;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use containerd_snapshots::api::types::Mount;
use containerd_snapshots::{Info, Snapshotter, Usage};
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use filters::{Fields, Filters};
use meta::{Kind, MetaStore, Record};

/// Label containerd's overlay snapshotter adds (when configured) with the
/// snapshot's upper dir.
pub const UPPERDIR_LABEL: &str = "containerd.io/snapshot/overlay.upperdir";
/// Labels asking for the snapshot's files to be owned by the mapped root
/// (user namespaces), as containerd's `snapshots.LabelSnapshotUIDMapping`.
pub const UIDMAP_LABEL: &str = "containerd.io/snapshot/uidmapping";
pub const GIDMAP_LABEL: &str = "containerd.io/snapshot/gidmapping";

/// Tunables of the overlay snapshotter (see docs/CONFIG.md, `[snapshotter]`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra overlay mount options (containerd adds `index=off` by itself).
    pub mount_options: Vec<String>,
    /// Report each snapshot's upper dir in the `containerd.io/snapshot/overlay.upperdir` label.
    pub upperdir_label: bool,
}

/// The snapshotter itself: synchronous, blocking file-system and database work.
pub struct Overlay {
    root: PathBuf,
    meta: MetaStore,
    overlay_options: Vec<String>,
    upperdir_label: bool,
    tmp_seq: AtomicU64,
}

/// Creates directory `path` with exactly `mode`, whatever the process's
/// umask (the daemon's is 077, for the store's files): a snapshot's `fs`
/// is the root of a container's rootfs and must be 0755, as containerd's
/// overlay snapshotter makes it, or a process of a non-root user cannot
/// even load its libraries. An existing directory is left as it is.
fn mkdir(path: &Path, mode: u32) -> Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("set the mode of directory", path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(Error::io("create directory", path, e)),
    }
}

/// The host id that container id 0 maps to in a containerd id-map label
/// (`<container id>:<host id>:<size>[,...]`).
fn mapped_root(label: &str, value: &str) -> Result<u32> {
    for entry in value.split(',') {
        let parts: Vec<&str> = entry.trim().split(':').collect();
        let nums: Option<Vec<u32>> = if parts.len() == 3 { parts.iter().map(|p| p.parse::<u32>().ok()).collect() } else { None };
        let Some(nums) = nums else {
            return Err(Error::InvalidArgument(format!("label {label}={value:?}: expected <container id>:<host id>:<size>[,...]")));
        };
        if nums[0] == 0 && nums[2] > 0 {
            return Ok(nums[1]);
        }
    }
    Err(Error::InvalidArgument(format!("label {label}={value:?} maps no host id to container root (0)")))
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(|e| Error::io("fsync directory", dir, e))
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).ok().and_then(|o| u8::from_str_radix(o, 8).ok());
            if let Some(v) = oct {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes a snapshot directory. Mounts below it are detached first, so that
/// the removal never reaches into a file system mounted there (containerd's
/// `removeCleanupDir` only detaches after a busy error, when `RemoveAll` has
/// already deleted through the mount).
fn remove_snapshot_dir(dir: &Path) -> Result<()> {
    for m in mounts_under(dir) {
        warn!(path = %m.display(), "detaching a mount left below a removed snapshot");
        if let Err(errno) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            return Err(Error::nix("detach mount", &m, errno));
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove directory", dir, e)),
    }
}

impl Fields for (&str, &Record) {
    fn field(&self, path: &[String]) -> Option<String> {
        let (name, rec) = self;
        match path.first().map(String::as_str) {
            Some("kind") => Some(rec.kind.as_str().to_string()),
            Some("name") => Some(name.to_string()),
            Some("parent") => Some(rec.parent.clone()),
            Some("labels") if path.len() > 1 => rec.labels.get(&path[1..].join(".")).cloned(),
            _ => None,
        }
    }
}

impl Overlay {
    /// Opens the snapshotter under `root` (created 0700 if missing) and removes
    /// whatever a crash left behind.
    pub fn open(root: &Path, opts: Options) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(|e| Error::io("create directory", root, e))?;
        mkdir(&root.join("snapshots"), 0o700)?;
        let meta = MetaStore::open(&root.join("metadata.db"))?;
        let o = Overlay {
            root: root.to_path_buf(),
            meta,
            overlay_options: mounts::default_overlay_options(&opts.mount_options),
            upperdir_label: opts.upperdir_label,
            tmp_seq: AtomicU64::new(0),
        };
        let removed = o.cleanup()?;
        let count = o.meta.read()?.all()?.len();
        info!(root = %root.display(), snapshots = count, orphans_removed = removed, overlay_options = ?o.overlay_options, "overlay snapshotter ready");
        Ok(o)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    fn to_info(&self, name: &str, rec: Record) -> Info {
        let mut labels: HashMap<String, String> = rec.labels.into_iter().collect();
        if self.upperdir_label {
            labels.insert(UPPERDIR_LABEL.to_string(), mounts::upper_path(&self.root, rec.id).display().to_string());
        }
        Info {
            kind: match rec.kind {
                Kind::View => containerd_snapshots::Kind::View,
                Kind::Active => containerd_snapshots::Kind::Active,
                Kind::Committed => containerd_snapshots::Kind::Committed,
            },
            name: name.to_string(),
            parent: rec.parent,
            labels,
            created_at: rec.created,
            updated_at: rec.updated,
        }
    }

    pub fn stat(&self, key: &str) -> Result<Info> {
        let rec = self.meta.read()?.info(key)?;
        Ok(self.to_info(key, rec))
    }

    pub fn update(&self, info: Info, fieldpaths: &[String]) -> Result<Info> {
        let tx = self.meta.write()?;
        let rec = tx.update(&info.name, &info.labels, fieldpaths)?;
        tx.commit()?;
        debug!(key = %info.name, ?fieldpaths, "updated");
        Ok(self.to_info(&info.name, rec))
    }

    pub fn usage(&self, key: &str) -> Result<Usage> {
        let rec = self.meta.read()?.info(key)?;
        if rec.kind == Kind::Active {
            let (inodes, size) = usage::disk_usage(&mounts::upper_path(&self.root, rec.id))?;
            return Ok(Usage { inodes, size });
        }
        Ok(Usage { inodes: rec.inodes, size: rec.size })
    }

    pub fn mounts(&self, key: &str) -> Result<Vec<Mount>> {
        let (snap, _) = self.meta.read()?.snapshot(key)?;
        Ok(mounts::mounts(&self.root, &snap, &self.overlay_options))
    }

    pub fn prepare(&self, key: &str, parent: &str, labels: HashMap<String, String>) -> Result<Vec<Mount>> {
        self.create_snapshot(Kind::Active, key, parent, labels)
    }

    pub fn view(&self, key: &str, parent: &str, labels: HashMap<String, String>) -> Result<Vec<Mount>> {
        self.create_snapshot(Kind::View, key, parent, labels)
    }

    fn create_snapshot(&self, kind: Kind, key: &str, parent: &str, labels: HashMap<String, String>) -> Result<Vec<Mount>> {
        let labels: BTreeMap<String, String> = labels.into_iter().collect();
        // Holding the write transaction from here on keeps `cleanup` from
        // seeing the temporary directory.
        let tx = self.meta.write()?;
        let td = self.snapshots_dir().join(format!("new-{}-{}", std::process::id(), self.tmp_seq.fetch_add(1, Ordering::Relaxed)));
        let result = (|| -> Result<(meta::Snapshot, PathBuf)> {
            mkdir(&td, 0o700)?;
            mkdir(&td.join("fs"), 0o755)?;
            if kind == Kind::Active {
                mkdir(&td.join("work"), 0o711)?;
            }
            let mut owner: Option<(u32, u32)> = None;
            if let Some(v) = labels.get(UIDMAP_LABEL) {
                let uid = mapped_root(UIDMAP_LABEL, v)?;
                let gid = match labels.get(GIDMAP_LABEL) {
                    Some(g) => mapped_root(GIDMAP_LABEL, g)?,
                    None => return Err(Error::InvalidArgument(format!("label {UIDMAP_LABEL} needs {GIDMAP_LABEL} too"))),
                };
                owner = Some((uid, gid));
            } else if labels.contains_key(GIDMAP_LABEL) {
                return Err(Error::InvalidArgument(format!("label {GIDMAP_LABEL} needs {UIDMAP_LABEL} too")));
            }
            let snap = tx.create_snapshot(kind, key, parent, labels.clone())?;
            if owner.is_none() {
                if let Some(&pid) = snap.parent_ids.first() {
                    let p = mounts::upper_path(&self.root, pid);
                    let md = std::fs::metadata(&p).map_err(|e| Error::io("stat parent", &p, e))?;
                    owner = Some((md.uid(), md.gid()));
                }
            }
            if let Some((uid, gid)) = owner {
                let fs = td.join("fs");
                std::os::unix::fs::lchown(&fs, Some(uid), Some(gid)).map_err(|e| Error::io("chown", &fs, e))?;
            }
            let path = self.snapshots_dir().join(snap.id.to_string());
            if path.exists() {
                // an id that was never committed: a leftover of a crash
                warn!(path = %path.display(), "removing leftover directory of an uncommitted snapshot id");
                remove_snapshot_dir(&path)?;
            }
            // Durable before the record is: the new directory's entries, then
            // its name in snapshots/ (a power loss must not keep a record
            // whose directory vanished).
            fsync_dir(&td)?;
            std::fs::rename(&td, &path).map_err(|e| Error::io("rename into place", &td, e))?;
            fsync_dir(&self.snapshots_dir())?;
            Ok((snap, path))
        })();
        let (snap, path) = match result {
            Ok(v) => v,
            Err(e) => {
                drop(tx);
                if let Err(e2) = remove_snapshot_dir(&td) {
                    warn!(error = %e2, "could not remove temporary snapshot directory");
                }
                return Err(e);
            }
        };
        if let Err(e) = tx.commit() {
            if let Err(e2) = remove_snapshot_dir(&path) {
                warn!(error = %e2, "could not remove directory of a snapshot whose record was not committed");
            }
            return Err(e);
        }
        debug!(key, parent, kind = kind.as_str(), id = snap.id, "created");
        Ok(mounts::mounts(&self.root, &snap, &self.overlay_options))
    }

    pub fn commit(&self, name: &str, key: &str, labels: HashMap<String, String>) -> Result<()> {
        let rec = self.meta.read()?.info(key)?;
        if rec.kind != Kind::Active {
            return Err(Error::FailedPrecondition(format!("snapshot {key:?} is {}, not active", rec.kind.as_str())));
        }
        let usage = usage::disk_usage(&mounts::upper_path(&self.root, rec.id))?;
        let tx = self.meta.write()?;
        tx.commit_active(key, name, rec.id, usage, labels.into_iter().collect())?;
        tx.commit()?;
        debug!(key, name, id = rec.id, inodes = usage.0, size = usage.1, "committed");
        Ok(())
    }

    pub fn remove(&self, key: &str) -> Result<()> {
        let tx = self.meta.write()?;
        let rec = tx.remove(key)?;
        tx.commit()?;
        // The record is gone for good: a directory that cannot be removed now
        // is an orphan for the next cleanup, not an error of this call.
        let dir = self.snapshots_dir().join(rec.id.to_string());
        if let Err(e) = remove_snapshot_dir(&dir) {
            warn!(key, error = %e, "snapshot removed, its directory is left for cleanup");
        }
        debug!(key, id = rec.id, "removed");
        Ok(())
    }

    /// Every snapshot that matches `filters` (containerd's filter syntax).
    pub fn list(&self, filters: &[String]) -> Result<Vec<Info>> {
        let f = Filters::parse(filters)?;
        let all = self.meta.read()?.all()?;
        Ok(all.into_iter().filter(|(k, r)| f.matches(&(k.as_str(), r))).map(|(k, r)| self.to_info(&k, r)).collect())
    }

    /// Removes directories under `snapshots/` that no record owns (crash
    /// leftovers, failed removals). Returns how many were removed.
    pub fn cleanup(&self) -> Result<usize> {
        let dir = self.snapshots_dir();
        let orphans = {
            // scan under the write lock: no create is half-way meanwhile
            let tx = self.meta.write()?;
            let ids = tx.ids()?;
            let mut orphans = Vec::new();
            let rd = std::fs::read_dir(&dir).map_err(|e| Error::io("read directory", &dir, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| Error::io("read directory", &dir, e))?;
                let name = entry.file_name();
                let owned = name.to_str().and_then(|n| n.parse::<u64>().ok()).is_some_and(|id| ids.contains(&id));
                if !owned {
                    orphans.push(entry.path());
                }
            }
            orphans
        };
        let mut removed = 0;
        for o in orphans {
            match remove_snapshot_dir(&o) {
                Ok(()) => {
                    info!(path = %o.display(), "removed orphan snapshot directory");
                    removed += 1;
                }
                Err(e) => warn!(error = %e, "could not remove orphan snapshot directory"),
            }
        }
        Ok(removed)
    }
}

/// The gRPC-facing snapshotter: runs each call of [`Overlay`] on tokio's
/// blocking pool.
#[derive(Clone)]
pub struct OverlaySnapshotter(Arc<Overlay>);

impl OverlaySnapshotter {
    pub fn new(o: Overlay) -> Self {
        OverlaySnapshotter(Arc::new(o))
    }

    pub fn overlay(&self) -> &Arc<Overlay> {
        &self.0
    }

    async fn run<T: Send + 'static>(&self, f: impl FnOnce(&Overlay) -> Result<T> + Send + 'static) -> Result<T> {
        let o = self.0.clone();
        tokio::task::spawn_blocking(move || f(&o)).await.map_err(|e| Error::Daemon(format!("snapshotter task failed: {e}")))?
    }
}

fn logged<T>(op: &'static str, key: &str, r: Result<T>) -> Result<T> {
    if let Err(e) = &r {
        match e {
            Error::NotFound(_) | Error::AlreadyExists(_) | Error::FailedPrecondition(_) | Error::InvalidArgument(_) => {
                debug!(op, key, error = %e, "refused")
            }
            _ => warn!(op, key, error = %e, "failed"),
        }
    }
    r
}

#[containerd_snapshots::tonic::async_trait]
impl Snapshotter for OverlaySnapshotter {
    type Error = Error;

    async fn stat(&self, key: String) -> Result<Info> {
        let k = key.clone();
        logged("stat", &k, self.run(move |o| o.stat(&key)).await)
    }

    async fn update(&self, info: Info, fieldpaths: Option<Vec<String>>) -> Result<Info> {
        let k = info.name.clone();
        let r = self.run(move |o| o.update(info, &fieldpaths.unwrap_or_default())).await;
        logged("update", &k, r)
    }

    async fn usage(&self, key: String) -> Result<Usage> {
        let k = key.clone();
        logged("usage", &k, self.run(move |o| o.usage(&key)).await)
    }

    async fn mounts(&self, key: String) -> Result<Vec<Mount>> {
        let k = key.clone();
        logged("mounts", &k, self.run(move |o| o.mounts(&key)).await)
    }

    async fn prepare(&self, key: String, parent: String, labels: HashMap<String, String>) -> Result<Vec<Mount>> {
        let k = key.clone();
        let r = self.run(move |o| o.prepare(&key, &parent, labels)).await;
        logged("prepare", &k, r)
    }

    async fn view(&self, key: String, parent: String, labels: HashMap<String, String>) -> Result<Vec<Mount>> {
        let k = key.clone();
        let r = self.run(move |o| o.view(&key, &parent, labels)).await;
        logged("view", &k, r)
    }

    async fn commit(&self, name: String, key: String, labels: HashMap<String, String>) -> Result<()> {
        let k = key.clone();
        let r = self.run(move |o| o.commit(&name, &key, labels)).await;
        logged("commit", &k, r)
    }

    async fn remove(&self, key: String) -> Result<()> {
        let k = key.clone();
        logged("remove", &k, self.run(move |o| o.remove(&key)).await)
    }

    async fn clear(&self) -> Result<()> {
        logged("cleanup", "", self.run(|o| o.cleanup().map(|_| ())).await)
    }

    type InfoStream = futures::stream::Iter<std::vec::IntoIter<Result<Info>>>;

    async fn list(&self, _snapshotter: String, filters: Vec<String>) -> Result<Self::InfoStream> {
        let infos = logged("list", "", self.run(move |o| o.list(&filters)).await)?;
        Ok(futures::stream::iter(infos.into_iter().map(Ok).collect::<Vec<_>>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_map_root() {
        assert_eq!(mapped_root("l", "0:100000:65536").unwrap(), 100000);
        assert_eq!(mapped_root("l", "1:5:10,0:200:1").unwrap(), 200);
        assert!(mapped_root("l", "1:5:10").is_err());
        assert!(mapped_root("l", "x").unwrap_err().to_string().contains("label l="));
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/end\"), r"/end\");
    }
}
