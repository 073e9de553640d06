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

use crate::error::{Error, IoContext, Result};

/// Where torpor keeps node state (suspended images, actor records).
pub const STATE_ROOT: &str = "/var/lib/torpor";

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
    /// The kept checkpoint this actor was restored from after a shim died
    /// (`<old shim id>/gen-<n>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_from: Option<String>,
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
            names: BTreeMap::new(),
            cgroups: BTreeMap::new(),
            committed_at_ms: None,
            orphaned: false,
            recovered_from: None,
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
        Ok(Store {
            dir: root.join("actors").join(key),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The store's key (the shim id it was made for).
    pub fn key(&self) -> String {
        self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// Marks the dump of `container` in `generation` as complete, durably:
    /// a suspend interrupted after every container's marker was written can
    /// be committed by the recovery (see [`crate::recovery`]).
    pub fn mark_dumped(&self, generation: u64, container: &str) -> Result<()> {
        let dir = self.generation_dir(generation);
        let p = dir.join(format!("{container}.done"));
        let f = File::create(&p).io_context(|| format!("create {p:?}"))?;
        f.sync_all().io_context(|| format!("fsync {p:?}"))?;
        sync_dir(&dir)
    }

    /// Whether the dump of `container` in `generation` completed.
    pub fn is_dumped(&self, generation: u64, container: &str) -> bool {
        self.generation_dir(generation).join(format!("{container}.done")).is_file()
            && self.image_dir(generation, container).join("inventory.img").is_file()
    }

    /// Image directory of a generation's checkpoint of one container.
    pub fn image_dir(&self, generation: u64, container: &str) -> PathBuf {
        self.dir.join(format!("gen-{generation}")).join(container)
    }

    pub fn generation_dir(&self, generation: u64) -> PathBuf {
        self.dir.join(format!("gen-{generation}"))
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
        let json = serde_json::to_vec_pretty(rec).map_err(|source| Error::Json {
            context: "encode actor record".into(),
            source,
        })?;
        let mut f = File::create(&tmp).io_context(|| format!("create {tmp:?}"))?;
        f.write_all(&json).io_context(|| format!("write {tmp:?}"))?;
        f.sync_all().io_context(|| format!("fsync {tmp:?}"))?;
        fs::rename(&tmp, self.record_path()).io_context(|| format!("rename {tmp:?}"))?;
        sync_dir(&self.dir)
    }

    pub fn load(&self) -> Result<Option<Record>> {
        let p = self.record_path();
        match fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|source| Error::Json {
                context: format!("parse {p:?}"),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io {
                context: format!("read {p:?}"),
                source: e,
            }),
        }
    }

    /// Removes everything of the actor (record and images).
    pub fn remove(&self) -> Result<()> {
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io {
                context: format!("remove {:?}", self.dir),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

/// fsync of a directory (after a rename or a create in it).
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .io_context(|| format!("fsync {dir:?}"))
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
        assert!(s.image_dir(3, "c1").ends_with("actors/abc/gen-3/c1"));
        assert_eq!(s.key(), "abc");
        // Records written before the recovery fields existed still load.
        let old = r#"{"actor":"a","state":"SUSPENDED","generation":1,"containers":[],"last_error":null,"last_suspend_ms":null,"last_resume_ms":null}"#;
        std::fs::write(s.dir().join("actor.json"), old).unwrap();
        let r = s.load().unwrap().unwrap();
        assert!(!r.orphaned && r.names.is_empty() && r.committed_at_ms.is_none());
        // A dump counts as complete with its marker and its CRIU inventory.
        assert!(!s.is_dumped(3, "c1"));
        std::fs::create_dir_all(s.image_dir(3, "c1")).unwrap();
        s.mark_dumped(3, "c1").unwrap();
        assert!(!s.is_dumped(3, "c1"));
        std::fs::write(s.image_dir(3, "c1").join("inventory.img"), b"x").unwrap();
        assert!(s.is_dumped(3, "c1"));
        s.remove().unwrap();
        assert_eq!(s.load().unwrap(), None);
        for bad in ["", "..", "a/b", "."] {
            assert!(Store::new(root.path(), bad).is_err());
        }
    }
}
