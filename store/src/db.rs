//! The metadata database (redb): snapshot records, generation counters, the
//! index of chunks known durable in the object tier, leases, and store meta.
//! Every state change is a committed transaction before the store acts on it.

use std::collections::BTreeMap;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::{ActorName, SnapshotId};

/// `<actor>|<generation:020>` → JSON [`Record`].
pub const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// actor → highest generation ever assigned or seen (never decreases).
pub const GENERATIONS: TableDefinition<&str, u64> = TableDefinition::new("generations");
/// chunk digest → stored object size: chunks known durable in the object tier.
pub const CHUNKS: TableDefinition<&str, u64> = TableDefinition::new("chunks");
/// chunk index key → db key (`<actor>|<generation:020>`) of the snapshot
/// whose manifest this node last wrote naming the chunk: while that manifest
/// is in the object tier, the chunk is (docs/STORE.md, "Chunks shared across
/// nodes"). Absent: not known (the chunk is checked with a HEAD before reuse).
pub const CHUNK_REFS: TableDefinition<&str, &str> = TableDefinition::new("chunk_refs");
/// lease id → JSON [`LeaseRecord`].
pub const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
/// actor → JSON of a lease this node holds in the object tier (the lease
/// module's record of it): actor leases this node holds
/// in the object tier (renewed by the daemon, also after a restart).
pub const ACTOR_LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("actor_leases");
/// actor → JSON list of the pages (the stream module's record of each) its last
/// streamed resume faulted on first (fetched first by the next one).
pub const WORKING_SETS: TableDefinition<&str, &[u8]> = TableDefinition::new("working_sets");
/// store-wide facts: "format", "remote_url".
pub const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

pub const DB_FORMAT: &str = "1";

/// Where the local copy of a snapshot is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LocalState {
    /// Generation assigned; the staging dir is being renamed into place.
    Committing { staging: String },
    /// Complete and verified at `<root>/snapshots/<actor>/_gen/<gen>`.
    Present,
    /// Being fetched from the object tier into `<root>/staging/<staging>`.
    Fetching { staging: String },
    /// Being deleted (durable in the object tier).
    Evicting,
    /// No local copy.
    Absent,
}

/// The snapshot in the object tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteState {
    /// Not uploaded.
    Absent,
    /// An upload was started (chunks may be there; the manifest is not known to be).
    Uploading,
    /// The manifest is in the object tier and was read back: durable.
    Durable,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub actor: ActorName,
    pub generation: u64,
    pub created_ms: u64,
    pub logical_bytes: u64,
    pub chunk_count: u64,
    pub labels: BTreeMap<String, String>,
    pub last_used_ms: u64,
    pub keep_local_until_ms: u64,
    pub manifest_digest: String,
    pub local: LocalState,
    pub remote: RemoteState,
    /// `remove` started: delete the remote manifest, then the local copy, then this record.
    pub removing: bool,
    /// Upload requested now (on demand or disk pressure), regardless of keep-local.
    pub upload_now: bool,
    pub upload_attempts: u32,
    pub next_attempt_ms: u64,
    pub last_error: Option<String>,
    /// The key the object tier's copy is sealed under (`None`: not uploaded,
    /// or uploaded unencrypted). Records written before encryption existed have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

impl Record {
    pub fn id(&self) -> SnapshotId {
        SnapshotId::new(self.actor.clone(), self.generation)
    }
    /// Bytes this snapshot holds (or is about to hold) on the local tier.
    pub fn local_bytes(&self) -> u64 {
        match self.local {
            LocalState::Absent => 0,
            _ => self.logical_bytes,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub key: String,
    pub created_ms: u64,
    /// The checkout fetched the snapshot: its pin in the object tier
    /// (`<prefix>/actors/<actor>/_pins/<id>.json`), deleted at release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_pin: Option<String>,
}

pub fn open(path: &Path) -> Result<Database> {
    let db = Database::create(path).map_err(|e| Error::db("open", e))?;
    // Create the tables so read transactions find them.
    let tx = db.begin_write().map_err(|e| Error::db("begin", e))?;
    {
        tx.open_table(SNAPSHOTS).map_err(|e| Error::db("open table", e))?;
        tx.open_table(GENERATIONS).map_err(|e| Error::db("open table", e))?;
        tx.open_table(CHUNKS).map_err(|e| Error::db("open table", e))?;
        tx.open_table(CHUNK_REFS).map_err(|e| Error::db("open table", e))?;
        tx.open_table(LEASES).map_err(|e| Error::db("open table", e))?;
        tx.open_table(META).map_err(|e| Error::db("open table", e))?;
        tx.open_table(ACTOR_LEASES).map_err(|e| Error::db("open table", e))?;
        tx.open_table(WORKING_SETS).map_err(|e| Error::db("open table", e))?;
    }
    tx.commit().map_err(|e| Error::db("commit", e))?;
    Ok(db)
}

fn decode<T: for<'a> Deserialize<'a>>(op: &'static str, key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::DbRecord { op, key: key.to_string(), detail: e.to_string() })
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::Internal(format!("encode record: {e}")))
}

/// A write transaction with typed helpers. Commit with [`Tx::commit`]; dropping aborts.
pub struct Tx(redb::WriteTransaction);

impl Tx {
    pub fn begin(db: &Database) -> Result<Tx> {
        db.begin_write().map(Tx).map_err(|e| Error::db("begin", e))
    }
    pub fn commit(self) -> Result<()> {
        self.0.commit().map_err(|e| Error::db("commit", e))
    }
    pub fn get(&self, id: &SnapshotId) -> Result<Option<Record>> {
        let key = id.db_key();
        let t = self.0.open_table(SNAPSHOTS).map_err(|e| Error::db("open table", e))?;
        let v = t.get(key.as_str()).map_err(|e| Error::db("get", e))?;
        v.map(|v| decode("get snapshot", &key, v.value())).transpose()
    }
    pub fn put(&self, r: &Record) -> Result<()> {
        let key = r.id().db_key();
        let bytes = encode(r)?;
        let mut t = self.0.open_table(SNAPSHOTS).map_err(|e| Error::db("open table", e))?;
        t.insert(key.as_str(), bytes.as_slice()).map_err(|e| Error::db("insert", e))?;
        Ok(())
    }
    pub fn delete(&self, id: &SnapshotId) -> Result<()> {
        let key = id.db_key();
        let mut t = self.0.open_table(SNAPSHOTS).map_err(|e| Error::db("open table", e))?;
        t.remove(key.as_str()).map_err(|e| Error::db("remove", e))?;
        Ok(())
    }
    /// The actor's generation counter.
    pub fn generation(&self, actor: &ActorName) -> Result<u64> {
        let t = self.0.open_table(GENERATIONS).map_err(|e| Error::db("open table", e))?;
        let v = t.get(actor.as_str()).map_err(|e| Error::db("get", e))?;
        Ok(v.map(|v| v.value()).unwrap_or(0))
    }
    /// Raise the actor's generation counter to at least `generation`.
    pub fn see_generation(&self, actor: &ActorName, generation: u64) -> Result<()> {
        if self.generation(actor)? < generation {
            let mut t = self.0.open_table(GENERATIONS).map_err(|e| Error::db("open table", e))?;
            t.insert(actor.as_str(), generation).map_err(|e| Error::db("insert", e))?;
        }
        Ok(())
    }
    pub fn add_chunks<'a>(&self, chunks: impl IntoIterator<Item = (&'a str, u64)>) -> Result<()> {
        let mut t = self.0.open_table(CHUNKS).map_err(|e| Error::db("open table", e))?;
        for (d, size) in chunks {
            t.insert(d, size).map_err(|e| Error::db("insert", e))?;
        }
        Ok(())
    }
    /// Record that the manifest of snapshot `manifest` (db key) names these chunks.
    pub fn set_chunk_refs<'a>(&self, chunks: impl IntoIterator<Item = &'a str>, manifest: &str) -> Result<()> {
        let mut t = self.0.open_table(CHUNK_REFS).map_err(|e| Error::db("open table", e))?;
        for d in chunks {
            t.insert(d, manifest).map_err(|e| Error::db("insert chunk ref", e))?;
        }
        Ok(())
    }
    pub fn remove_chunks<'a>(&self, chunks: impl IntoIterator<Item = &'a str>) -> Result<()> {
        let mut t = self.0.open_table(CHUNKS).map_err(|e| Error::db("open table", e))?;
        let mut r = self.0.open_table(CHUNK_REFS).map_err(|e| Error::db("open table", e))?;
        for d in chunks {
            t.remove(d).map_err(|e| Error::db("remove", e))?;
            r.remove(d).map_err(|e| Error::db("remove chunk ref", e))?;
        }
        Ok(())
    }
    pub fn clear_chunks(&self) -> Result<()> {
        self.0.delete_table(CHUNKS).map_err(|e| Error::db("delete table", e))?;
        self.0.open_table(CHUNKS).map_err(|e| Error::db("open table", e))?;
        self.0.delete_table(CHUNK_REFS).map_err(|e| Error::db("delete table", e))?;
        self.0.open_table(CHUNK_REFS).map_err(|e| Error::db("open table", e))?;
        Ok(())
    }
    pub fn put_lease(&self, lease: &str, rec: &LeaseRecord) -> Result<()> {
        let bytes = encode(rec)?;
        let mut t = self.0.open_table(LEASES).map_err(|e| Error::db("open table", e))?;
        t.insert(lease, bytes.as_slice()).map_err(|e| Error::db("insert", e))?;
        Ok(())
    }
    pub fn remove_lease(&self, lease: &str) -> Result<Option<LeaseRecord>> {
        let mut t = self.0.open_table(LEASES).map_err(|e| Error::db("open table", e))?;
        let v = t.remove(lease).map_err(|e| Error::db("remove", e))?;
        v.map(|v| decode("remove lease", lease, v.value())).transpose()
    }
    pub fn remove_leases_of(&self, key: &str) -> Result<()> {
        let mut t = self.0.open_table(LEASES).map_err(|e| Error::db("open table", e))?;
        t.retain(|_, v| serde_json::from_slice::<LeaseRecord>(v).map(|l| l.key != key).unwrap_or(true))
            .map_err(|e| Error::db("retain", e))?;
        Ok(())
    }
    pub fn put_actor_lease<T: Serialize>(&self, actor: &ActorName, held: &T) -> Result<()> {
        let mut t = self.0.open_table(ACTOR_LEASES).map_err(|e| Error::db("open table", e))?;
        t.insert(actor.as_str(), encode(held)?.as_slice()).map_err(|e| Error::db("insert actor lease", e))?;
        Ok(())
    }
    pub fn remove_actor_lease(&self, actor: &ActorName) -> Result<()> {
        let mut t = self.0.open_table(ACTOR_LEASES).map_err(|e| Error::db("open table", e))?;
        t.remove(actor.as_str()).map_err(|e| Error::db("remove actor lease", e))?;
        Ok(())
    }
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        let t = self.0.open_table(META).map_err(|e| Error::db("open table", e))?;
        let v = t.get(key).map_err(|e| Error::db("get", e))?;
        Ok(v.map(|v| v.value().to_string()))
    }
    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        let mut t = self.0.open_table(META).map_err(|e| Error::db("open table", e))?;
        t.insert(key, value).map_err(|e| Error::db("insert", e))?;
        Ok(())
    }
}

/// All snapshot records, optionally of one actor, ordered by (actor, generation).
pub fn records(db: &Database, actor: Option<&ActorName>) -> Result<Vec<Record>> {
    let tx = db.begin_read().map_err(|e| Error::db("begin read", e))?;
    let t = tx.open_table(SNAPSHOTS).map_err(|e| Error::db("open table", e))?;
    let mut out = Vec::new();
    let mut push = |k: &str, v: &[u8]| -> Result<()> {
        out.push(decode("list snapshots", k, v)?);
        Ok(())
    };
    match actor {
        Some(a) => {
            let (lo, hi) = (format!("{a}|"), format!("{a}}}"));
            for item in t.range(lo.as_str()..hi.as_str()).map_err(|e| Error::db("range", e))? {
                let (k, v) = item.map_err(|e| Error::db("range", e))?;
                push(k.value(), v.value())?;
            }
        }
        None => {
            for item in t.iter().map_err(|e| Error::db("iter", e))? {
                let (k, v) = item.map_err(|e| Error::db("iter", e))?;
                push(k.value(), v.value())?;
            }
        }
    }
    Ok(out)
}

pub fn record(db: &Database, id: &SnapshotId) -> Result<Option<Record>> {
    let tx = db.begin_read().map_err(|e| Error::db("begin read", e))?;
    let t = tx.open_table(SNAPSHOTS).map_err(|e| Error::db("open table", e))?;
    let key = id.db_key();
    let v = t.get(key.as_str()).map_err(|e| Error::db("get", e))?;
    v.map(|v| decode("get snapshot", &key, v.value())).transpose()
}

/// Which of `digests` (chunk index keys) are known durable, each with the
/// db key of the snapshot whose manifest this node last wrote naming it
/// (`None`: not recorded).
pub fn known_chunks(db: &Database, digests: &[String]) -> Result<std::collections::HashMap<String, Option<String>>> {
    let tx = db.begin_read().map_err(|e| Error::db("begin read", e))?;
    let t = tx.open_table(CHUNKS).map_err(|e| Error::db("open table", e))?;
    let r = tx.open_table(CHUNK_REFS).map_err(|e| Error::db("open table", e))?;
    let mut out = std::collections::HashMap::new();
    for d in digests {
        if t.get(d.as_str()).map_err(|e| Error::db("get", e))?.is_some() {
            let by = r.get(d.as_str()).map_err(|e| Error::db("get chunk ref", e))?.map(|v| v.value().to_string());
            out.insert(d.clone(), by);
        }
    }
    Ok(out)
}

/// Lease id → record.
pub fn leases(db: &Database) -> Result<Vec<(String, LeaseRecord)>> {
    let tx = db.begin_read().map_err(|e| Error::db("begin read", e))?;
    let t = tx.open_table(LEASES).map_err(|e| Error::db("open table", e))?;
    let mut out = Vec::new();
    for item in t.iter().map_err(|e| Error::db("iter", e))? {
        let (k, v) = item.map_err(|e| Error::db("iter", e))?;
        out.push((k.value().to_string(), decode("list leases", k.value(), v.value())?));
    }
    Ok(out)
}

pub fn lease_count(db: &Database, key: &str) -> Result<usize> {
    Ok(leases(db)?.into_iter().filter(|(_, l)| l.key == key).count())
}

/// Actor leases this node holds.
pub fn actor_leases<T: DeserializeOwned>(db: &Database) -> Result<Vec<T>> {
    let tx = db.begin_read().map_err(|e| Error::db("begin read", e))?;
    let t = tx.open_table(ACTOR_LEASES).map_err(|e| Error::db("open table", e))?;
    let mut out = Vec::new();
    for item in t.iter().map_err(|e| Error::db("iter", e))? {
        let (k, v) = item.map_err(|e| Error::db("iter", e))?;
        out.push(decode("list actor leases", k.value(), v.value())?);
    }
    Ok(out)
}

/// The working set recorded for `actor` (empty if none).
pub fn working_set<T: DeserializeOwned>(db: &Database, actor: &ActorName) -> Result<Vec<T>> {
    let tx = db.begin_read().map_err(|e| Error::db("begin read", e))?;
    let t = tx.open_table(WORKING_SETS).map_err(|e| Error::db("open table", e))?;
    match t.get(actor.as_str()).map_err(|e| Error::db("get working set", e))? {
        Some(v) => decode("read working set", actor.as_str(), v.value()),
        None => Ok(Vec::new()),
    }
}

/// Records `actor`'s working set (replacing the one before).
pub fn put_working_set<T: Serialize>(db: &Database, actor: &ActorName, pages: &[T]) -> Result<()> {
    let tx = Tx::begin(db)?;
    {
        let mut t = tx.0.open_table(WORKING_SETS).map_err(|e| Error::db("open table", e))?;
        t.insert(actor.as_str(), encode(&pages)?.as_slice()).map_err(|e| Error::db("insert working set", e))?;
    }
    tx.commit()
}
