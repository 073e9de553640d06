//! The catalog: which snapshots exist (this node's records, and the object
//! tier's manifests imported on demand), their newest generation, and
//! their manifests read and checked.
//!
//! Why `impl Store` here: queries read the records every other concern
//! writes and import manifests into the same database.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tracing::{info, warn};

use crate::chunk;
use crate::crypto::{self, Key};
use crate::db::{self, LocalState, Record, RemoteState, Tx};
use crate::error::{Error, Result};
use crate::id::{ActorName, SnapshotId};
use crate::manifest::{Manifest, MANIFEST_FILE};
use crate::remote::ChunkName;
use crate::snapshot::SnapshotInfo;
use crate::state::Store;
use crate::time::now_ms;

impl Store {
    /// Snapshots this node's database knows (local ones, uploaded ones, and
    /// remote ones seen by `latest`, `checkout`, `refresh` or `gc`), by actor
    /// and generation. [`Store::refresh`] first to include every remote one.
    pub async fn list(&self, actor: Option<&ActorName>) -> Result<Vec<SnapshotInfo>> {
        let leases = db::leases(&self.db)?;
        let mut pins: HashMap<String, usize> = HashMap::new();
        for (_, l) in leases {
            *pins.entry(l.key).or_default() += 1;
        }
        Ok(db::records(&self.db, actor)?
            .into_iter()
            .filter(|r| !r.removing)
            .map(|r| {
                let p = pins.get(&r.id().db_key()).copied().unwrap_or(0);
                self.info_with_pins(&r, p)
            })
            .collect())
    }

    /// Import the object tier's snapshots (of `actor`, or all) this database
    /// does not know. Returns how many were imported.
    pub async fn refresh(&self, actor: Option<&ActorName>) -> Result<usize> {
        let ids = match actor {
            Some(a) => self.remote.generations(a).await?.into_iter().map(|g| SnapshotId::new(a.clone(), g)).collect(),
            None => self.remote.all_snapshots().await?,
        };
        let mut n = 0;
        for id in ids {
            if db::record(&self.db, &id)?.is_none() {
                match self.import(&id).await {
                    Ok(_) => n += 1,
                    Err(e) if self.ignores_untrusted(&e) => self.untrusted(&format!("snapshot {id} in the object tier"), &e),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(n)
    }

    /// The newest snapshot of `actor` in either tier (asks the object tier).
    /// A commit of the actor in progress is waited for (at most
    /// `commit_wait`): the snapshot it makes is the newest. With keys
    /// configured, an entry of the object tier that does not authenticate
    /// (a `_gen/<n>/` without a manifest, a plaintext or garbled manifest,
    /// one that fails authentication) is ignored, reported and counted, and the next older one is tried: anyone who can write the
    /// bucket could have planted it.
    pub async fn latest(&self, actor: &ActorName) -> Result<Option<SnapshotInfo>> {
        self.wait_for_commits(actor).await?;
        let local_max = self.latest_local(actor).await?;
        let local_gen = local_max.as_ref().map(|l| l.id.generation);
        let mut found = None;
        for g in self.remote.generations(actor).await?.into_iter().rev() {
            if local_gen.is_some_and(|l| g <= l) {
                break;
            }
            let id = SnapshotId::new(actor.clone(), g);
            match self.record_or_import(&id).await {
                Ok(info) => {
                    found = Some(info);
                    break;
                }
                Err(e) if self.ignores_untrusted(&e) => self.untrusted(&format!("snapshot {id} in the object tier"), &e),
                Err(e) => return Err(e),
            }
        }
        let newest = found.or(local_max);
        self.check_lease_floor(actor, newest.as_ref().map(|i| i.id.generation))?;
        Ok(newest)
    }

    /// Is `e` (reading an entry of the object tier) one to ignore and report
    /// rather than fail on: keys are configured (the object tier is
    /// authenticated) and the entry did not authenticate. An unreachable
    /// object tier is never that. A manifest sealed under a key id this
    /// node does not have (or under its id with other key material) is:
    /// no configured key opens it, so it is not this store's (anyone who
    /// can write the bucket can plant an envelope naming any key id, and it
    /// blocked the actor on every node). It is skipped for `latest`, warned
    /// about and counted; a snapshot sealed under any key of the ring still
    /// opens (key rotation). Restoring the actor's past instead of a newer
    /// snapshot sealed under a key missing here cannot follow from it: the
    /// actor's lease, authenticated under the store key, names its newest
    /// durable generation ([`Store::check_lease_floor`]), and a lease
    /// authenticated under a key this node does not have is refused
    /// (`actor_lease`). Without keys nothing is ignored: a sealed snapshot
    /// stays an `UnknownKey` error naming its key (a node left without keys).
    pub(crate) fn ignores_untrusted(&self, e: &Error) -> bool {
        !self.cfg.keyring.is_empty() && !e.is_remote_unavailable() && !matches!(e, Error::Db { .. } | Error::Io { .. } | Error::Internal(_))
    }

    /// An entry of the object tier that does not authenticate under the
    /// ring: ignored, logged at warn, counted (`status().untrusted_entries`)
    /// and kept in the status's recent errors.
    pub(crate) fn untrusted(&self, what: &str, e: &Error) {
        self.stats.update(|s| s.untrusted_entries += 1);
        warn!(entry = what, error = %e, "ignored an entry of the object tier that does not authenticate (anyone who can write the bucket could have planted it)");
        self.note_error(format!("ignored {what} (it does not authenticate): {e}"));
    }

    /// The newest snapshot of `actor` this database knows, without asking the object tier.
    pub async fn latest_local(&self, actor: &ActorName) -> Result<Option<SnapshotInfo>> {
        let recs = db::records(&self.db, Some(actor))?;
        recs.iter()
            .rev()
            .find(|r| !r.removing && (r.local == LocalState::Present || r.remote == RemoteState::Durable))
            .map(|r| self.info(r))
            .transpose()
    }

    pub(crate) async fn record_or_import(&self, id: &SnapshotId) -> Result<SnapshotInfo> {
        let rec = match db::record(&self.db, id)? {
            Some(r) if !r.removing => r,
            Some(_) => return Err(Error::NotFound(id.clone())),
            None => self.import(id).await?,
        };
        self.info(&rec)
    }

    /// Record a snapshot found in the object tier (durable, not local). A
    /// plaintext manifest is refused when this store requires encryption
    /// (as for a restore: [`Store::open_for_restore`]).
    pub(crate) async fn import(&self, id: &SnapshotId) -> Result<Record> {
        self.import_opened(id, true).await
    }

    /// [`Store::import`]; `strict` false takes a plaintext manifest whatever
    /// the ring says (to remove it).
    pub(crate) async fn import_opened(&self, id: &SnapshotId, strict: bool) -> Result<Record> {
        let bytes = self.remote.get_manifest(id).await?.ok_or_else(|| Error::NotFound(id.clone()))?;
        let (plain, key) = if strict {
            self.open_for_restore(id, &bytes)?
        } else {
            let o = crypto::open_manifest(&self.cfg.keyring, id, &bytes)?;
            (o.plain, o.key)
        };
        let (bytes, key_id) = (plain, key.map(|k| k.id().to_string()));
        let m = Manifest::parse(&bytes, Some(id))
            .map_err(|what| Error::Corrupt { id: id.clone(), what: format!("manifest in the object tier: {what}") })?;
        let now = now_ms();
        let rec = Record {
            actor: id.actor.clone(),
            generation: id.generation,
            created_ms: m.created_ms,
            logical_bytes: m.logical_bytes,
            chunk_count: m.entries.iter().map(|e| e.chunks.len() as u64).sum(),
            labels: m.labels.clone(),
            last_used_ms: 0,
            keep_local_until_ms: now,
            manifest_digest: chunk::sha256_hex(&bytes),
            local: LocalState::Absent,
            remote: RemoteState::Durable,
            removing: false,
            upload_now: false,
            upload_attempts: 0,
            next_attempt_ms: 0,
            last_error: None,
            key_id,
        };
        let tx = Tx::begin(&self.db)?;
        if let Some(existing) = tx.get(id)? {
            return Ok(existing);
        }
        tx.see_generation(&id.actor, id.generation)?;
        tx.put(&rec)?;
        tx.commit()?;
        info!(snapshot = %id, "imported from the object tier");
        Ok(rec)
    }

    /// A snapshot's record and manifest (from the local copy when there is
    /// one, else from the object tier), checked against the recorded digest.
    pub async fn inspect(&self, id: &SnapshotId) -> Result<(SnapshotInfo, Manifest)> {
        let info = self.record_or_import(id).await?;
        let bytes = if info.local {
            let p = info.path.join(MANIFEST_FILE);
            std::fs::read(&p).map_err(|e| Error::io("read manifest", &p, e))?
        } else {
            let bytes = self.remote.get_manifest(id).await?.ok_or_else(|| Error::Corrupt {
                id: id.clone(),
                what: format!("manifest missing from the object tier at {}", self.remote.manifest_path(id)),
            })?;
            crypto::open_manifest(&self.cfg.keyring, id, &bytes)?.plain
        };
        let m = self.check_manifest(id, &bytes, &info.manifest_digest, if info.local { "local" } else { "object tier" })?;
        Ok((info, m))
    }

    /// Open a manifest read from the object tier to restore from it: a
    /// sealed one with the ring's key; a plaintext one only when this store
    /// has no keys or accepts unencrypted snapshots (otherwise anyone who can
    /// write the bucket could plant a snapshot).
    pub(crate) fn open_for_restore(&self, id: &SnapshotId, bytes: &[u8]) -> Result<(Vec<u8>, Option<Arc<Key>>)> {
        let ring = &self.cfg.keyring;
        let o = crypto::open_manifest(ring, id, bytes)?;
        if o.key.is_none() && !ring.is_empty() && !ring.accept_unencrypted {
            return Err(Error::Corrupt {
                id: id.clone(),
                what: format!(
                    "the manifest in the object tier ({}) is not encrypted and this node requires encryption: refused ([store.encryption] accept_unencrypted = true reads snapshots uploaded before encryption was turned on)",
                    self.remote.manifest_path(id)
                ),
            });
        }
        Ok((o.plain, o.key))
    }

    /// Where each chunk of a durable snapshot is in the object tier (digest
    /// → object key); empty when it is not durable or sealed under a key
    /// this node does not have.
    pub fn chunk_objects(&self, info: &SnapshotInfo, m: &Manifest) -> BTreeMap<String, String> {
        if !info.durable {
            return BTreeMap::new();
        }
        let key = match &info.key_id {
            None => None,
            Some(k) => match self.cfg.keyring.get(k) {
                Some(key) => Some(key.clone()),
                None => return BTreeMap::new(),
            },
        };
        m.unique_chunks()
            .into_iter()
            .map(|c| (c.digest.clone(), self.remote.chunk_path(&ChunkName::of(key.as_deref(), &c.digest)).to_string()))
            .collect()
    }

    pub(crate) fn check_manifest(&self, id: &SnapshotId, bytes: &[u8], digest: &str, tier: &str) -> Result<Manifest> {
        let actual = chunk::sha256_hex(bytes);
        if actual != digest {
            return Err(Error::Corrupt {
                id: id.clone(),
                what: format!(
                    "{tier} manifest ({} bytes) has sha256:{actual}, recorded sha256:{digest} (truncated or garbled)",
                    bytes.len()
                ),
            });
        }
        Manifest::parse(bytes, Some(id)).map_err(|what| Error::Corrupt { id: id.clone(), what: format!("{tier} manifest: {what}") })
    }
}
