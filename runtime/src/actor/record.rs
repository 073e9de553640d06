//! The actor lifecycle: RUNNING, FROZEN, SUSPENDING, SUSPENDED, RESUMING.
//!
//! An actor is the set of app containers one shim serves (a pod's, under
//! CRI). Its state is written to disk atomically (temporary file, fsync,
//! rename, fsync of the directory) *before* the transition is acted on, so a
//! crash at any point leaves a record saying what was under way.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::actor::store_client::{SnapshotRef, Staging};
use crate::error::{Error, IoContext, Result};

/// Where torpor keeps node state (suspended images, actor records).
pub const STATE_ROOT: &str = "/var/lib/torpor";

/// The state root in use: `$TORPOR_STATE_ROOT` (the test rig's), else
/// [`STATE_ROOT`].
pub fn state_root() -> PathBuf {
    std::env::var_os("TORPOR_STATE_ROOT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(STATE_ROOT))
}

/// Lifecycle state of an actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Lifecycle {
    Running,
    Frozen,
    Suspending,
    Suspended,
    Resuming,
}

impl std::fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Lifecycle::Running => "RUNNING",
            Lifecycle::Frozen => "FROZEN",
            Lifecycle::Suspending => "SUSPENDING",
            Lifecycle::Suspended => "SUSPENDED",
            Lifecycle::Resuming => "RESUMING",
        };
        f.write_str(s)
    }
}

/// One phase of a lifecycle operation and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    /// Microseconds.
    pub us: u64,
}

/// The persisted record of one actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Actor id (`torpor.dev/actor`, or the pod, or the container).
    pub actor: String,
    pub state: Lifecycle,
    /// Bumped by every suspend: names the image directory.
    pub generation: u64,
    /// The containers (ids) the actor is made of.
    pub containers: Vec<String>,
    /// Why the last operation failed, if it did.
    pub last_error: Option<String>,
    /// Milliseconds the last suspend and resume took.
    pub last_suspend_ms: Option<u64>,
    pub last_resume_ms: Option<u64>,
    /// Where the last resume's time went, phase by phase, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_resume_phases: Vec<Phase>,
    /// The CPU time (µs) the last resume cost the shim and the runc and
    /// CRIU processes it waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resume_cpu_us: Option<u64>,
    /// Where the last suspend's time went, phase by phase, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_suspend_phases: Vec<Phase>,
    /// Container id -> container name (CRI `io.kubernetes.cri.container-name`,
    /// else the id): with `actor`, the identity a kept checkpoint is found by.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub names: BTreeMap<String, String>,
    /// Container id -> its cgroup (the OCI `cgroupsPath`): what is killed
    /// after the shim died.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cgroups: BTreeMap<String, String>,
    /// When the checkpoint of `generation` was committed (SUSPENDED), in
    /// milliseconds since the Unix epoch: the newest kept checkpoint wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_at_ms: Option<u64>,
    /// The shim serving this actor died and its processes were killed: the
    /// record and its checkpoint are kept for a restore by identity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub orphaned: bool,
    /// The snapshot (`actor@generation`) this actor was restored from by
    /// identity, when a new pod of the actor was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_from: Option<String>,
    /// The node that held the actor before this one: its lease came from
    /// there (the actor moved here, with `recovered_from` its state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// The Kubernetes pod the actor runs in (its uid, from CRI's sandbox
    /// metadata): what the node agent maps a pod to its actor by, never a
    /// pod's own annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The actor id was set explicitly (`torpor.dev/actor`), not defaulted
    /// to the pod: its snapshots outlive the removal of a running actor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explicit_actor: bool,
    /// The store's staging directory of a suspend under way (SUSPENDING),
    /// or of one whose dumps are complete but not yet committed (SUSPENDED
    /// with no `snapshot` yet: "committing").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<StagingRecord>,
    /// The snapshot in the node's store that holds the actor's state
    /// (SUSPENDED), or that it was last resumed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotRef>,
    /// A checkout lease of the store this shim holds (a resume whose lazy
    /// pages are still being served, or a restore by identity): released
    /// by the cleanup if the shim dies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<String>,
    /// `torpor.dev/keep-local` in seconds, passed to the store's commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_local_s: Option<u64>,
    /// The store was asked for a snapshot to restore this actor from (by
    /// the create of its first app container); later containers follow
    /// that answer (`restore_snapshot`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restore_checked: bool,
    /// The snapshot the pod's containers are restored from by identity
    /// (the same generation for all of them), until the next suspend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_snapshot: Option<SnapshotRef>,
    /// An app container of the actor was started by this shim (the actor
    /// ran: snapshots older than its state are stale).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ran: bool,
    /// The snapshot (`actor@generation`, another actor's) this actor was
    /// cloned from (`torpor.dev/restore-from`), when it had none of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloned_from: Option<String>,
    /// Why the lease fence froze the actor (FROZEN): this node could not
    /// confirm that it still holds the actor's lease. Thawed when it can
    /// again; kept frozen for good when another node took the actor over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
    /// Container names already restored from `restore_snapshot`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub restored_names: std::collections::BTreeSet<String>,
    /// The freeze tier (`torpor.dev/freeze-first`): FROZEN by a suspend,
    /// memory resident, checkpointed when the window ends (or earlier:
    /// another suspend request, memory pressure); a resume before then is
    /// a thaw. Never set together with `fenced` (a fence-freeze is not the
    /// actor's own and no freeze-tier trigger acts on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_tier: Option<FreezeTier>,
}

/// A freeze-tier window: FROZEN since `since_ms`, checkpointed at
/// `until_ms` (milliseconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeTier {
    pub since_ms: u64,
    pub until_ms: u64,
}

impl FreezeTier {
    /// A window of `window` starting at `now_ms`.
    pub fn starting(now_ms: u64, window: std::time::Duration) -> FreezeTier {
        let w = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        FreezeTier { since_ms: now_ms, until_ms: now_ms.saturating_add(w) }
    }

    /// How long until the window ends, seen at `now_ms` (zero once it has).
    pub fn left(&self, now_ms: u64) -> std::time::Duration {
        std::time::Duration::from_millis(self.until_ms.saturating_sub(now_ms))
    }
}

/// A staging directory of the snapshot store (see [`crate::actor::store_client`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagingRecord {
    pub id: String,
    pub path: PathBuf,
}

impl StagingRecord {
    pub fn to_staging(&self) -> Staging {
        Staging { id: self.id.clone(), path: self.path.clone() }
    }
}

impl Record {
    /// A fresh RUNNING record.
    pub fn new(actor: String) -> Record {
        Record {
            actor,
            state: Lifecycle::Running,
            generation: 0,
            containers: Vec::new(),
            last_error: None,
            last_suspend_ms: None,
            last_resume_ms: None,
            last_resume_phases: Vec::new(),
            last_resume_cpu_us: None,
            last_suspend_phases: Vec::new(),
            names: BTreeMap::new(),
            cgroups: BTreeMap::new(),
            committed_at_ms: None,
            orphaned: false,
            recovered_from: None,
            moved_from: None,
            pod_uid: None,
            explicit_actor: false,
            staging: None,
            snapshot: None,
            leases: Vec::new(),
            keep_local_s: None,
            restore_checked: false,
            restore_snapshot: None,
            cloned_from: None,
            ran: false,
            restored_names: Default::default(),
            fenced: None,
            freeze_tier: None,
        }
    }

    /// FROZEN by the freeze tier (not by the lease fence, not by a plain
    /// freeze): a resume is a thaw, the window's end a checkpoint.
    pub fn in_freeze_tier(&self) -> bool {
        self.state == Lifecycle::Frozen && self.freeze_tier.is_some() && self.fenced.is_none()
    }

    /// SUSPENDED, dumps complete, the snapshot not yet committed.
    pub fn committing(&self) -> bool {
        self.state == Lifecycle::Suspended && self.staging.is_some() && self.snapshot.is_none()
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The on-disk home of one actor: `<root>/actors/<key>/`.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// `key` must be a single path component (the sandbox or container id,
    /// which containerd restricts to `[A-Za-z0-9_.-]`).
    pub fn new(root: &Path, key: &str) -> Result<Self> {
        if key.is_empty() || key.contains('/') || key == "." || key == ".." {
            return Err(Error::InvalidArgument(format!("actor key {key:?} is not a valid name")));
        }
        Ok(Store { dir: root.join("actors").join(key) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The store's key (the shim id it was made for).
    pub fn key(&self) -> String {
        self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// CRIU's work directory (logs, lazy-pages socket) for container
    /// `container` in `generation`: outside the snapshot's staging
    /// directory, so it is not part of the snapshot. `what`: dump, restore, lazy.
    pub fn work_dir(&self, generation: u64, container: &str, what: &str) -> PathBuf {
        self.dir.join("work").join(format!("gen-{generation}")).join(format!("{container}.{what}"))
    }

    /// All CRIU work directories of the actor.
    pub fn work_root(&self) -> PathBuf {
        self.dir.join("work")
    }

    fn record_path(&self) -> PathBuf {
        self.dir.join("actor.json")
    }

    /// Persists the record atomically and durably.
    pub fn save(&self, rec: &Record) -> Result<()> {
        fs::create_dir_all(&self.dir).io_context(|| format!("create {:?}", self.dir))?;
        // One temporary file per writer: two processes may save the same
        // record (the cleanups after a shim died), the last rename wins.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.dir.join(format!(".actor.json.{}.{seq}.tmp", std::process::id()));
        let json = serde_json::to_vec_pretty(rec).map_err(|source| Error::Json { context: "encode actor record".into(), source })?;
        let written = (|| {
            let mut f = File::create(&tmp).io_context(|| format!("create {tmp:?}"))?;
            f.write_all(&json).io_context(|| format!("write {tmp:?}"))?;
            f.sync_all().io_context(|| format!("fsync {tmp:?}"))?;
            fs::rename(&tmp, self.record_path()).io_context(|| format!("rename {tmp:?}"))
        })();
        if written.is_err() {
            // A full disk leaves no partial temporary behind.
            let _ = fs::remove_file(&tmp);
        }
        written?;
        sync_dir(&self.dir)
    }

    pub fn load(&self) -> Result<Option<Record>> {
        let p = self.record_path();
        match fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|source| Error::Json { context: format!("parse {p:?}"), source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io { context: format!("read {p:?}"), source: e }),
        }
    }

    /// Removes the actor's CRIU work directories, and what a killed CRIU
    /// left mounted in them.
    pub fn remove_work(&self) {
        let work = self.work_root();
        crate::system::mounts::detach_under(&work);
        let _ = fs::remove_dir_all(&work);
    }

    /// Removes everything of the actor (record and images), and what a
    /// killed CRIU left mounted in its work directories.
    pub fn remove(&self) -> Result<()> {
        crate::system::mounts::detach_under(&self.dir);
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io { context: format!("remove {:?}", self.dir), source: e }),
            _ => Ok(()),
        }
    }
}

/// fsync of a directory (after a rename or a create in it).
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).io_context(|| format!("fsync {dir:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_keys() {
        let root = tempfile::tempdir().unwrap();
        let s = Store::new(root.path(), "abc").unwrap();
        assert_eq!(s.load().unwrap(), None);
        let mut rec = Record::new("default/web".into());
        rec.state = Lifecycle::Suspended;
        rec.generation = 3;
        rec.containers = vec!["c1".into()];
        rec.last_suspend_ms = Some(12);
        rec.names.insert("c1".into(), "web".into());
        rec.orphaned = true;
        s.save(&rec).unwrap();
        assert_eq!(s.load().unwrap(), Some(rec));
        assert!(s.work_dir(3, "c1", "dump").ends_with("actors/abc/work/gen-3/c1.dump"));
        assert_eq!(s.key(), "abc");
        // Records written before the recovery and store fields existed still load.
        let old = r#"{"actor":"a","state":"SUSPENDED","generation":1,"containers":[],"last_error":null,"last_suspend_ms":null,"last_resume_ms":null}"#;
        std::fs::write(s.dir().join("actor.json"), old).unwrap();
        let r = s.load().unwrap().unwrap();
        assert!(!r.orphaned && r.names.is_empty() && r.committed_at_ms.is_none());
        assert!(r.staging.is_none() && r.snapshot.is_none() && !r.committing());
        let mut c = r.clone();
        c.staging = Some(StagingRecord { id: "x".into(), path: "/s/x".into() });
        assert!(c.committing());
        c.snapshot = Some(SnapshotRef { actor: "a".into(), generation: 1 });
        assert!(!c.committing());
        // The freeze tier round-trips and is told apart from a fence-freeze.
        let mut f = Record::new("ns/f".into());
        f.state = Lifecycle::Frozen;
        assert!(!f.in_freeze_tier(), "a plain freeze");
        f.freeze_tier = Some(FreezeTier::starting(1_000, std::time::Duration::from_millis(2_500)));
        assert!(f.in_freeze_tier());
        assert_eq!(f.freeze_tier.unwrap().until_ms, 3_500);
        assert_eq!(f.freeze_tier.unwrap().left(3_000), std::time::Duration::from_millis(500));
        assert_eq!(f.freeze_tier.unwrap().left(9_000), std::time::Duration::ZERO);
        s.save(&f).unwrap();
        assert_eq!(s.load().unwrap(), Some(f.clone()));
        f.fenced = Some("lease".into());
        assert!(!f.in_freeze_tier(), "a fence-freeze is never the freeze tier's");
        f.fenced = None;
        f.state = Lifecycle::Running;
        assert!(!f.in_freeze_tier());
        s.remove().unwrap();
        assert_eq!(s.load().unwrap(), None);
        for bad in ["", "..", "a/b", "."] {
            assert!(Store::new(root.path(), bad).is_err());
        }
    }
}
