//! Snapshot metadata in an embedded transactional database (redb).
//!
//! The same model as containerd's `core/snapshots/storage` (bolt): every
//! snapshot has a key (its name), a numeric id (its directory name under
//! `snapshots/`), a kind, an optional committed parent, labels, timestamps and,
//! once committed, its usage. Child links are kept in their own table so that
//! "has children" is one range lookup.
//!
//! Tables:
//! - `snapshots`: key → JSON [`Record`]
//! - `children`: (parent id, child id) → child key
//! - `meta`: `schema_version`, `next_id`
//!
//! Every mutation runs in one write transaction; the caller may do file-system
//! work inside the transaction before [`WriteTx::commit`] (see
//! `overlay::OverlaySnapshotter::create_snapshot`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
const CHILDREN: TableDefinition<(u64, u64), &str> = TableDefinition::new("children");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const SCHEMA_VERSION_KEY: &str = "schema_version";
const NEXT_ID_KEY: &str = "next_id";
/// The on-disk schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 1;

/// A snapshot's kind (containerd `snapshots.Kind`, without `Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    View,
    Active,
    Committed,
}

impl Kind {
    /// The name containerd's filters use (`kind==active`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::View => "view",
            Kind::Active => "active",
            Kind::Committed => "committed",
        }
    }
}

/// One snapshot as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub created: SystemTime,
    pub updated: SystemTime,
    /// Usage recorded at commit (zero for active snapshots and views).
    #[serde(default)]
    pub inodes: i64,
    #[serde(default)]
    pub size: i64,
}

/// What the mounts of an active snapshot or view are built from
/// (containerd `storage.Snapshot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub id: u64,
    pub kind: Kind,
    /// Ids of the parent chain, nearest parent first.
    pub parent_ids: Vec<u64>,
}

/// The metadata database.
pub struct MetaStore {
    db: Database,
    path: PathBuf,
}

fn db_err(path: &Path) -> impl Fn(redb::Error) -> Error + '_ {
    move |e| Error::Db { path: path.to_path_buf(), msg: e.to_string() }
}

/// Shorthand: any redb error into `Error::Db` for `path`.
macro_rules! db {
    ($path:expr, $e:expr) => {
        ($e).map_err(|e| db_err($path)(redb::Error::from(e)))
    };
}

impl MetaStore {
    /// Opens (or creates) the database at `path` and checks its schema version.
    pub fn open(path: &Path) -> Result<Self> {
        let db = db!(path, Database::create(path))?;
        let store = MetaStore { db, path: path.to_path_buf() };
        let tx = db!(path, store.db.begin_write())?;
        {
            db!(path, tx.open_table(SNAPSHOTS))?;
            db!(path, tx.open_table(CHILDREN))?;
            let mut meta = db!(path, tx.open_table(META))?;
            let version = db!(path, meta.get(SCHEMA_VERSION_KEY))?.map(|g| g.value());
            match version {
                None => {
                    db!(path, meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION))?;
                }
                Some(SCHEMA_VERSION) => {}
                Some(v) => {
                    return Err(Error::Corrupt {
                        path: path.to_path_buf(),
                        msg: format!("schema version {v}, this torpor-snapshotter knows only {SCHEMA_VERSION}"),
                    })
                }
            }
        }
        db!(path, tx.commit())?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A read-only view of the committed state.
    pub fn read(&self) -> Result<ReadTx<'_>> {
        let tx = db!(&self.path, self.db.begin_read())?;
        Ok(ReadTx { tx, path: &self.path })
    }

    /// A write transaction (one at a time; others wait). Dropped without
    /// [`WriteTx::commit`], it changes nothing.
    pub fn write(&self) -> Result<WriteTx<'_>> {
        let tx = db!(&self.path, self.db.begin_write())?;
        Ok(WriteTx { tx, path: &self.path })
    }
}

fn decode(path: &Path, key: &str, bytes: &[u8]) -> Result<Record> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt { path: path.to_path_buf(), msg: format!("snapshot {key:?}: {e}") })
}

fn encode(record: &Record) -> Vec<u8> {
    // A Record has only strings, integers and timestamps: it always serializes.
    serde_json::to_vec(record).unwrap_or_default()
}

fn get_record(path: &Path, table: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<Option<Record>> {
    match db!(path, table.get(key))? {
        None => Ok(None),
        Some(v) => decode(path, key, v.value()).map(Some),
    }
}

fn require_record(path: &Path, table: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<Record> {
    get_record(path, table, key)?.ok_or_else(|| Error::NotFound(format!("snapshot {key:?} does not exist")))
}

/// Ids of `parent` and all its ancestors, nearest first.
fn parent_chain(path: &Path, table: &impl ReadableTable<&'static str, &'static [u8]>, parent: &str) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    let mut next = parent.to_string();
    while !next.is_empty() {
        let rec = get_record(path, table, &next)?.ok_or_else(|| Error::Corrupt {
            path: path.to_path_buf(),
            msg: format!("parent {next:?} in the chain of {parent:?} is missing"),
        })?;
        ids.push(rec.id);
        if ids.len() > 100_000 {
            return Err(Error::Corrupt { path: path.to_path_buf(), msg: format!("parent chain of {parent:?} loops") });
        }
        next = rec.parent;
    }
    Ok(ids)
}

fn snapshot_of(path: &Path, table: &impl ReadableTable<&'static str, &'static [u8]>, key: &str) -> Result<(Snapshot, Record)> {
    let rec = require_record(path, table, key)?;
    if rec.kind == Kind::Committed {
        return Err(Error::FailedPrecondition(format!("snapshot {key:?} is committed, not active or view")));
    }
    let parent_ids = parent_chain(path, table, &rec.parent)?;
    Ok((Snapshot { id: rec.id, kind: rec.kind, parent_ids }, rec))
}

fn all_records(path: &Path, table: &impl ReadableTable<&'static str, &'static [u8]>) -> Result<Vec<(String, Record)>> {
    let mut out = Vec::new();
    for entry in db!(path, table.iter())? {
        let (k, v) = db!(path, entry)?;
        let key = k.value().to_string();
        let rec = decode(path, &key, v.value())?;
        out.push((key, rec));
    }
    Ok(out)
}

/// A read transaction.
pub struct ReadTx<'a> {
    tx: redb::ReadTransaction,
    path: &'a Path,
}

impl ReadTx<'_> {
    /// The record of `key` (NotFound if there is none).
    pub fn info(&self, key: &str) -> Result<Record> {
        let t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        require_record(self.path, &t, key)
    }

    /// The active snapshot or view `key` with its parent chain.
    pub fn snapshot(&self, key: &str) -> Result<(Snapshot, Record)> {
        let t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        snapshot_of(self.path, &t, key)
    }

    /// Every snapshot, ordered by key.
    pub fn all(&self) -> Result<Vec<(String, Record)>> {
        let t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        all_records(self.path, &t)
    }
}

/// A write transaction.
pub struct WriteTx<'a> {
    tx: redb::WriteTransaction,
    path: &'a Path,
}

impl WriteTx<'_> {
    /// Makes every change of this transaction durable.
    pub fn commit(self) -> Result<()> {
        db!(self.path, self.tx.commit())
    }

    pub fn info(&self, key: &str) -> Result<Record> {
        let t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        require_record(self.path, &t, key)
    }

    /// Ids of every snapshot (for finding orphan directories).
    pub fn ids(&self) -> Result<HashSet<u64>> {
        let t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        Ok(all_records(self.path, &t)?.into_iter().map(|(_, r)| r.id).collect())
    }

    fn next_id(&self) -> Result<u64> {
        let mut meta = db!(self.path, self.tx.open_table(META))?;
        let id = db!(self.path, meta.get(NEXT_ID_KEY))?.map(|g| g.value()).unwrap_or(1);
        db!(self.path, meta.insert(NEXT_ID_KEY, id + 1))?;
        Ok(id)
    }

    /// Inserts an active snapshot or view `key` on `parent` (containerd
    /// `storage.CreateSnapshot`). The parent must be committed.
    pub fn create_snapshot(&self, kind: Kind, key: &str, parent: &str, labels: BTreeMap<String, String>) -> Result<Snapshot> {
        if kind == Kind::Committed {
            return Err(Error::InvalidArgument(format!("snapshot {key:?}: only active snapshots and views can be created")));
        }
        if key.is_empty() {
            return Err(Error::InvalidArgument("snapshot key must not be empty".into()));
        }
        let mut t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        let mut parent_ids = Vec::new();
        if !parent.is_empty() {
            let p = get_record(self.path, &t, parent)?
                .ok_or_else(|| Error::NotFound(format!("parent {parent:?} of snapshot {key:?} does not exist")))?;
            if p.kind != Kind::Committed {
                return Err(Error::InvalidArgument(format!("parent {parent:?} of snapshot {key:?} is not a committed snapshot")));
            }
            parent_ids = parent_chain(self.path, &t, parent)?;
        }
        if get_record(self.path, &t, key)?.is_some() {
            return Err(Error::AlreadyExists(format!("snapshot {key:?} already exists")));
        }
        let id = self.next_id()?;
        let now = SystemTime::now();
        let rec = Record { id, kind, parent: parent.to_string(), labels, created: now, updated: now, inodes: 0, size: 0 };
        db!(self.path, t.insert(key, encode(&rec).as_slice()))?;
        if let Some(&pid) = parent_ids.first() {
            let mut c = db!(self.path, self.tx.open_table(CHILDREN))?;
            db!(self.path, c.insert((pid, id), key))?;
        }
        Ok(Snapshot { id, kind, parent_ids })
    }

    /// Turns the active snapshot `key` into the committed snapshot `name`
    /// (containerd `storage.CommitActive`): same id, labels replaced, usage
    /// recorded, `key` gone. `expect_id` guards against `key` having been
    /// removed and re-created since the usage was measured.
    pub fn commit_active(&self, key: &str, name: &str, expect_id: u64, usage: (i64, i64), labels: BTreeMap<String, String>) -> Result<u64> {
        if name.is_empty() {
            return Err(Error::InvalidArgument("commit name must not be empty".into()));
        }
        let mut t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        if get_record(self.path, &t, name)?.is_some() {
            return Err(Error::AlreadyExists(format!("committed snapshot {name:?} already exists")));
        }
        let mut rec = get_record(self.path, &t, key)?.ok_or_else(|| Error::NotFound(format!("active snapshot {key:?} does not exist")))?;
        if rec.kind != Kind::Active {
            return Err(Error::FailedPrecondition(format!("snapshot {key:?} is {}, not active", rec.kind.as_str())));
        }
        if rec.id != expect_id {
            return Err(Error::NotFound(format!("active snapshot {key:?} was removed during the commit")));
        }
        if !rec.parent.is_empty() {
            let p = get_record(self.path, &t, &rec.parent)?.ok_or_else(|| Error::Corrupt {
                path: self.path.to_path_buf(),
                msg: format!("parent {:?} of {key:?} is missing", rec.parent),
            })?;
            if p.kind != Kind::Committed {
                return Err(Error::FailedPrecondition(format!("parent {:?} of {key:?} is not committed", rec.parent)));
            }
            let mut c = db!(self.path, self.tx.open_table(CHILDREN))?;
            db!(self.path, c.insert((p.id, rec.id), name))?;
        }
        let now = SystemTime::now();
        rec.kind = Kind::Committed;
        rec.created = now;
        rec.updated = now;
        rec.labels = labels;
        rec.inodes = usage.0;
        rec.size = usage.1;
        db!(self.path, t.remove(key))?;
        db!(self.path, t.insert(name, encode(&rec).as_slice()))?;
        Ok(rec.id)
    }

    /// Removes `key` (containerd `storage.Remove`); refused while it has children.
    pub fn remove(&self, key: &str) -> Result<Record> {
        let mut t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        let rec = require_record(self.path, &t, key)?;
        let mut c = db!(self.path, self.tx.open_table(CHILDREN))?;
        let child = {
            let mut r = db!(self.path, c.range((rec.id, 0)..=(rec.id, u64::MAX)))?;
            match r.next() {
                Some(e) => Some(db!(self.path, e)?.1.value().to_string()),
                None => None,
            }
        };
        if let Some(child) = child {
            return Err(Error::FailedPrecondition(format!("cannot remove snapshot {key:?}: it has children (e.g. {child:?})")));
        }
        if !rec.parent.is_empty() {
            if let Some(p) = get_record(self.path, &t, &rec.parent)? {
                db!(self.path, c.remove((p.id, rec.id)))?;
            }
        }
        db!(self.path, t.remove(key))?;
        Ok(rec)
    }

    /// Updates the mutable fields (labels) of `name` (containerd
    /// `storage.UpdateInfo`): with field paths only `labels` and
    /// `labels.<key>`, without them every label is replaced.
    pub fn update(&self, name: &str, labels: &HashMap<String, String>, fieldpaths: &[String]) -> Result<Record> {
        let mut t = db!(self.path, self.tx.open_table(SNAPSHOTS))?;
        let mut rec = require_record(self.path, &t, name)?;
        if fieldpaths.is_empty() {
            rec.labels = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        } else {
            for path in fieldpaths {
                if let Some(key) = path.strip_prefix("labels.") {
                    match labels.get(key) {
                        Some(v) => {
                            rec.labels.insert(key.to_string(), v.clone());
                        }
                        // containerd stores "" here, and an empty label is
                        // deleted when written: same result.
                        None => {
                            rec.labels.remove(key);
                        }
                    }
                } else if path == "labels" {
                    rec.labels = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                } else {
                    return Err(Error::InvalidArgument(format!(
                        "cannot update field {path:?} of snapshot {name:?}: only labels are mutable"
                    )));
                }
            }
        }
        rec.labels.retain(|_, v| !v.is_empty());
        rec.updated = SystemTime::now();
        db!(self.path, t.insert(name, encode(&rec).as_slice()))?;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, MetaStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = MetaStore::open(&dir.path().join("metadata.db")).unwrap();
        (dir, s)
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn prepare(s: &MetaStore, key: &str, parent: &str) -> Result<Snapshot> {
        let tx = s.write()?;
        let snap = tx.create_snapshot(Kind::Active, key, parent, BTreeMap::new())?;
        tx.commit()?;
        Ok(snap)
    }

    fn commit(s: &MetaStore, name: &str, key: &str) -> Result<u64> {
        let tx = s.write()?;
        let id = tx.info(key)?.id;
        let id = tx.commit_active(key, name, id, (3, 4096), labels(&[("l", "v")]))?;
        tx.commit()?;
        Ok(id)
    }

    #[test]
    fn chain_of_commits_has_nearest_parent_first() {
        let (_d, s) = store();
        let a = prepare(&s, "a-active", "").unwrap();
        assert!(a.parent_ids.is_empty());
        assert_eq!(commit(&s, "a", "a-active").unwrap(), a.id);
        let b = prepare(&s, "b-active", "a").unwrap();
        assert_eq!(b.parent_ids, vec![a.id]);
        commit(&s, "b", "b-active").unwrap();
        let c = prepare(&s, "c-active", "b").unwrap();
        assert_eq!(c.parent_ids, vec![b.id, a.id]);
        let r = s.read().unwrap();
        let (snap, rec) = r.snapshot("c-active").unwrap();
        assert_eq!(snap, c);
        assert_eq!(rec.parent, "b");
        let a_info = r.info("a").unwrap();
        assert_eq!(a_info.kind, Kind::Committed);
        assert_eq!((a_info.inodes, a_info.size), (3, 4096));
        assert_eq!(a_info.labels, labels(&[("l", "v")]));
        assert!(matches!(r.info("a-active"), Err(Error::NotFound(_))));
        assert!(matches!(r.snapshot("a"), Err(Error::FailedPrecondition(_))));
    }

    #[test]
    fn ids_are_never_reused() {
        let (_d, s) = store();
        let a = prepare(&s, "a", "").unwrap();
        let tx = s.write().unwrap();
        tx.remove("a").unwrap();
        tx.commit().unwrap();
        let b = prepare(&s, "a", "").unwrap();
        assert!(b.id > a.id);
        // an aborted transaction consumes nothing
        {
            let tx = s.write().unwrap();
            tx.create_snapshot(Kind::Active, "x", "", BTreeMap::new()).unwrap();
        }
        let c = prepare(&s, "c", "").unwrap();
        assert_eq!(c.id, b.id + 1);
        assert!(matches!(s.read().unwrap().info("x"), Err(Error::NotFound(_))));
    }

    #[test]
    fn errors_match_containerd() {
        let (_d, s) = store();
        prepare(&s, "a", "").unwrap();
        assert!(matches!(prepare(&s, "a", ""), Err(Error::AlreadyExists(_))));
        assert!(matches!(prepare(&s, "b", "nope"), Err(Error::NotFound(_))));
        // parent must be committed
        assert!(matches!(prepare(&s, "b", "a"), Err(Error::InvalidArgument(_))));
        commit(&s, "a1", "a").unwrap();
        // commit onto an existing name
        prepare(&s, "b", "a1").unwrap();
        assert!(matches!(commit(&s, "a1", "b"), Err(Error::AlreadyExists(_))));
        // a view cannot be committed
        let tx = s.write().unwrap();
        let v = tx.create_snapshot(Kind::View, "v", "a1", BTreeMap::new()).unwrap();
        assert!(matches!(tx.commit_active("v", "v1", v.id, (0, 0), BTreeMap::new()), Err(Error::FailedPrecondition(_))));
        tx.commit().unwrap();
        // remove refused with children (b and v are children of a1)
        let tx = s.write().unwrap();
        let e = tx.remove("a1").unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(e.to_string().contains("children"), "{e}");
        drop(tx);
        let tx = s.write().unwrap();
        tx.remove("b").unwrap();
        tx.remove("v").unwrap();
        tx.remove("a1").unwrap();
        tx.commit().unwrap();
        assert!(s.read().unwrap().all().unwrap().is_empty());
    }

    #[test]
    fn committed_child_keeps_the_parent_link() {
        let (_d, s) = store();
        prepare(&s, "a", "").unwrap();
        commit(&s, "a1", "a").unwrap();
        prepare(&s, "b", "a1").unwrap();
        commit(&s, "b1", "b").unwrap();
        let tx = s.write().unwrap();
        assert!(matches!(tx.remove("a1"), Err(Error::FailedPrecondition(_))));
        tx.remove("b1").unwrap();
        tx.remove("a1").unwrap();
        tx.commit().unwrap();
    }

    #[test]
    fn update_labels_like_containerd() {
        let (_d, s) = store();
        let tx = s.write().unwrap();
        tx.create_snapshot(Kind::Active, "a", "", labels(&[("x", "1"), ("y", "2")])).unwrap();
        tx.commit().unwrap();
        let new: HashMap<String, String> = [("y".to_string(), "3".to_string()), ("z".to_string(), "4".to_string())].into();
        let tx = s.write().unwrap();
        let r = tx.update("a", &new, &["labels.y".to_string()]).unwrap();
        assert_eq!(r.labels, labels(&[("x", "1"), ("y", "3")]));
        let r = tx.update("a", &new, &["labels.x".to_string()]).unwrap();
        assert_eq!(r.labels, labels(&[("y", "3")]));
        let r = tx.update("a", &new, &[]).unwrap();
        assert_eq!(r.labels, labels(&[("y", "3"), ("z", "4")]));
        assert!(matches!(tx.update("a", &new, &["parent".to_string()]), Err(Error::InvalidArgument(_))));
        assert!(matches!(tx.update("nope", &new, &[]), Err(Error::NotFound(_))));
        tx.commit().unwrap();
        assert_eq!(s.read().unwrap().info("a").unwrap().labels, labels(&[("y", "3"), ("z", "4")]));
    }

    #[test]
    fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.db");
        let (a, b) = {
            let s = MetaStore::open(&path).unwrap();
            let a = prepare(&s, "a", "").unwrap();
            commit(&s, "a1", "a").unwrap();
            let b = prepare(&s, "b", "a1").unwrap();
            (a, b)
        };
        let s = MetaStore::open(&path).unwrap();
        let all = s.read().unwrap().all().unwrap();
        let keys: Vec<_> = all.iter().map(|(k, r)| (k.as_str(), r.id, r.kind)).collect();
        assert_eq!(keys, vec![("a1", a.id, Kind::Committed), ("b", b.id, Kind::Active)]);
        assert_eq!(s.read().unwrap().snapshot("b").unwrap().0.parent_ids, vec![a.id]);
        let c = prepare(&s, "c", "").unwrap();
        assert!(c.id > b.id);
    }

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.db");
        {
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META).unwrap().insert(SCHEMA_VERSION_KEY, 99).unwrap();
            tx.commit().unwrap();
        }
        let e = MetaStore::open(&path).err().unwrap();
        assert!(e.to_string().contains("schema version 99"), "{e}");
    }
}
