//! The actor lifecycle: RUNNING, FROZEN, SUSPENDING, SUSPENDED, RESUMING.
//!
//! An actor is the set of app containers one shim serves (a pod's, under
//! CRI). Its state is written to disk atomically (temporary file, fsync,
//! rename, fsync of the directory) *before* the transition is acted on, so a
//! crash at any point leaves a record saying what was under way.

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
        let tmp = self.dir.join(".actor.json.tmp");
        let json = serde_json::to_vec_pretty(rec).map_err(|source| Error::Json {
            context: "encode actor record".into(),
            source,
        })?;
        let mut f = File::create(&tmp).io_context(|| format!("create {tmp:?}"))?;
        f.write_all(&json).io_context(|| format!("write {tmp:?}"))?;
        f.sync_all().io_context(|| format!("fsync {tmp:?}"))?;
        fs::rename(&tmp, self.record_path()).io_context(|| format!("rename {tmp:?}"))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .io_context(|| format!("fsync {:?}", self.dir))?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_keys() {
        let root = tempfile::tempdir().unwrap();
        let s = Store::new(root.path(), "abc").unwrap();
        assert_eq!(s.load().unwrap(), None);
        let rec = Record {
            actor: "default/web".into(),
            state: Lifecycle::Suspended,
            generation: 3,
            containers: vec!["c1".into()],
            last_error: None,
            last_suspend_ms: Some(12),
            last_resume_ms: None,
        };
        s.save(&rec).unwrap();
        assert_eq!(s.load().unwrap(), Some(rec));
        assert!(s.image_dir(3, "c1").ends_with("actors/abc/gen-3/c1"));
        s.remove().unwrap();
        assert_eq!(s.load().unwrap(), None);
        for bad in ["", "..", "a/b", "."] {
            assert!(Store::new(root.path(), bad).is_err());
        }
    }
}
