//! Upload: a local snapshot made durable in the object tier (its chunks
//! sent once, deduplicated against the index of durable chunks, under an
//! upload intent; its manifest written last, fenced by the actor lease:
//! the commit point), with failures recorded for the background retry.
//!
//! Why `impl Store` here: an upload reads the local copy under the
//! snapshot's shared file lock, holds the sweep lock shared against this
//! node's chunk sweep, and updates the record and the chunk index in the
//! metadata database that `Store` owns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use tracing::{error, info, warn};

use crate::chunk;
use crate::crypto::{self, Key};
use crate::db::{self, LocalState, RemoteState, Tx};
use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::local;
use crate::manifest::{EntryKind, MANIFEST_FILE};
use crate::remote::ChunkName;
use crate::snapshot::{Progress, SnapshotInfo};
use crate::state::Store;
use crate::sweep;
use crate::time::now_ms;
use crate::util::blocking;

/// What an upload sends: the first place of every distinct chunk (digest →
/// (file, offset, size)), their order, their object names, the key.
struct UploadPlan {
    first: HashMap<String, (PathBuf, u64, u32)>,
    order: Vec<String>,
    names: HashMap<String, ChunkName>,
    key: Option<Arc<Key>>,
}

impl Store {
    /// Upload a snapshot now (idempotent: a durable one returns at once). On
    /// failure the snapshot stays queued for the background uploader.
    pub async fn upload(&self, id: &SnapshotId, progress: Option<Progress>) -> Result<SnapshotInfo> {
        let rec = db::record(&self.db, id)?.filter(|r| !r.removing).ok_or_else(|| Error::NotFound(id.clone()))?;
        if rec.remote == RemoteState::Durable {
            return self.info(&rec);
        }
        if !rec.upload_now {
            let tx = Tx::begin(&self.db)?;
            if let Some(mut r) = tx.get(id)? {
                r.upload_now = true;
                tx.put(&r)?;
            }
            tx.commit()?;
        }
        match self.upload_once(id, progress).await {
            Ok(info) => Ok(info),
            Err(e) => {
                self.upload_failed(id, &e);
                Err(match e {
                    e @ (Error::Corrupt { .. } | Error::NotFound(_) | Error::Conflict { .. } | Error::NoLocalCopy { .. }) => e,
                    other => Error::UploadFailed { id: id.clone(), source: Box::new(other) },
                })
            }
        }
    }

    pub(crate) fn upload_failed(&self, id: &SnapshotId, e: &Error) {
        let res = (|| -> Result<()> {
            let tx = Tx::begin(&self.db)?;
            if let Some(mut r) = tx.get(id)? {
                r.upload_attempts = r.upload_attempts.saturating_add(1);
                r.next_attempt_ms = now_ms().saturating_add(crate::config::millis(self.cfg.retry.delay(r.upload_attempts)));
                r.last_error = Some(e.to_string());
                tx.put(&r)?;
            }
            tx.commit()
        })();
        if let Err(db_err) = res {
            error!(snapshot = %id, error = %db_err, "recording an upload failure");
        }
        warn!(snapshot = %id, error = %e, "upload failed");
        self.note_error(format!("upload {id}: {e}"));
    }

    pub(crate) async fn upload_once(&self, id: &SnapshotId, progress: Option<Progress>) -> Result<SnapshotInfo> {
        let kl = self.key_lock(id);
        let _one = kl.upload.lock().await;
        let _files = kl.files.read().await;
        let _sweep = self.sweep.read().await;
        let started = std::time::Instant::now();
        let rec = db::record(&self.db, id)?.filter(|r| !r.removing).ok_or_else(|| Error::NotFound(id.clone()))?;
        if rec.remote == RemoteState::Durable {
            return self.info(&rec);
        }
        if rec.local != LocalState::Present {
            return Err(Error::NoLocalCopy { id: id.clone(), op: "upload", state: format!("{:?}", rec.local) });
        }
        if rec.remote != RemoteState::Uploading {
            let tx = Tx::begin(&self.db)?;
            let mut r = rec.clone();
            r.remote = RemoteState::Uploading;
            tx.put(&r)?;
            tx.commit()?;
        }
        let dir = self.snapshot_dir(id);
        let mpath = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io("read manifest", &mpath, e))?;
        let m = self.check_manifest(id, &bytes, &rec.manifest_digest, "local")?;

        // First occurrence of every distinct chunk.
        let mut first: HashMap<String, (PathBuf, u64, u32)> = HashMap::new();
        let mut order = Vec::new();
        for e in m.entries.iter().filter(|e| e.kind == EntryKind::File) {
            let mut off = 0u64;
            for c in &e.chunks {
                if !first.contains_key(&c.digest) {
                    first.insert(c.digest.clone(), (dir.join(&e.path), off, c.size));
                    order.push(c.digest.clone());
                }
                off += c.size as u64;
            }
        }
        // Sealed under the active key (if any): chunk names and the index of
        // durable chunks depend on it.
        let key = self.cfg.keyring.active().cloned();
        let names: HashMap<String, ChunkName> = order.iter().map(|d| (d.clone(), ChunkName::of(key.as_deref(), d))).collect();
        // The intent first: from now on a sweep on another node either sees
        // it or has finished deleting before the chunks are checked and sent
        // (docs/STORE.md, "Chunks shared across nodes").
        let mut intent = if order.is_empty() {
            None
        } else {
            let all: Vec<ChunkName> = order.iter().filter_map(|d| names.get(d).cloned()).collect();
            Some(self.write_intent(id, key.as_ref(), &all).await?)
        };
        let res = self.upload_under_intent(id, &bytes, UploadPlan { first, order, names, key }, intent.as_mut(), progress, started).await;
        if let Some(it) = intent {
            self.drop_intent(it).await;
        }
        res
    }

    async fn upload_under_intent(
        &self,
        id: &SnapshotId,
        bytes: &[u8],
        plan: UploadPlan,
        mut intent: Option<&mut sweep::Intent>,
        progress: Option<Progress>,
        started: std::time::Instant,
    ) -> Result<SnapshotInfo> {
        let UploadPlan { first, order, names, key } = plan;
        if let Some(it) = intent.as_deref_mut() {
            self.wait_for_sweeps(id, it).await?;
        }
        let index_keys: Vec<String> = order.iter().map(|d| names[d].index_key()).collect();
        let known = db::known_chunks(&self.db, &index_keys)?;
        // Chunks the index calls durable may have been swept by another node
        // since: checked (HEAD) unless a manifest this node wrote naming them
        // is still there; missing ones are sent again.
        let missing = self.missing_reused(&known).await?;
        let todo: Vec<String> = order
            .iter()
            .filter(|d| {
                let k = names[*d].index_key();
                !known.contains_key(&k) || missing.contains(&k)
            })
            .cloned()
            .collect();
        let total: u64 = todo.iter().map(|d| first[d].2 as u64).sum();
        let deduplicated = (known.len() - missing.len()) as u64;
        let deduplicated_bytes = order.iter().map(|d| first[d].2 as u64).sum::<u64>().saturating_sub(total);
        self.stats.update(|s| {
            s.deduplicated_chunks += deduplicated;
            s.deduplicated_bytes += deduplicated_bytes;
        });
        if let Some(p) = &progress {
            let _ = p.send((0, total));
        }
        let first = Arc::new(first);
        let names = Arc::new(names);
        let level = self.cfg.zstd_level;
        let mut done_raw = 0u64;
        let mut pending: Vec<(String, u64)> = Vec::new();
        let mut stream = futures::stream::iter(todo.into_iter().map(|digest| {
            let (first, id, key, names) = (first.clone(), id.clone(), key.clone(), names.clone());
            async move {
                let d = digest.clone();
                let name = names.get(&digest).cloned().ok_or_else(|| Error::Internal("unnamed chunk".into()))?;
                let n = name.clone();
                let object = blocking(move || {
                    let (path, off, size) = first.get(&d).ok_or_else(|| Error::Internal("unknown chunk".into()))?;
                    let data = local::read_range(path, *off, *size)?;
                    if chunk::sha256_hex(&data) != d {
                        return Err(Error::Corrupt {
                            id,
                            what: format!(
                                "local file {} bytes {}..{} do not match chunk sha256:{d}; not uploading",
                                path.display(),
                                off,
                                off + *size as u64
                            ),
                        });
                    }
                    match &key {
                        None => chunk::encode(&data, level),
                        Some(k) => chunk::encode_sealed(&data, level, k, n.hex()),
                    }
                })
                .await?;
                let stored = object.len() as u64;
                self.remote.put_chunk(&name, object).await?;
                Ok::<_, Error>((digest, stored))
            }
        }))
        .buffer_unordered(self.cfg.upload_concurrency);
        let mut failure = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok((digest, stored)) => {
                    let raw = first[&digest].2 as u64;
                    done_raw += raw;
                    self.stats.update(|s| {
                        s.uploaded_bytes += stored;
                        s.uploaded_raw_bytes += raw;
                        s.uploaded_chunks += 1;
                    });
                    if let Some(p) = &progress {
                        let _ = p.send((done_raw, total));
                    }
                    pending.push((names[&digest].index_key(), stored));
                    if pending.len() >= 256 {
                        let tx = Tx::begin(&self.db)?;
                        tx.add_chunks(pending.iter().map(|(d, s)| (d.as_str(), *s)))?;
                        tx.commit()?;
                        pending.clear();
                    }
                    if let Some(it) = intent.as_deref_mut() {
                        if let Err(e) = self.renew_intent_if_due(it).await {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        drop(stream);
        if !pending.is_empty() {
            let tx = Tx::begin(&self.db)?;
            tx.add_chunks(pending.iter().map(|(d, s)| (d.as_str(), *s)))?;
            tx.commit()?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if let Some(it) = intent {
            self.renew_intent_if_due(it).await?;
        }
        // The commit point: the manifest (sealed under the key), written
        // last, then read back. One there already that opens to the same
        // manifest is this upload's, from an attempt whose answer was lost
        // (sealed under the key active then).
        let object = match &key {
            None => bytes.to_vec(),
            Some(k) => crypto::seal_manifest(k, id, bytes)?,
        };
        let ring = &self.cfg.keyring;
        // The lease is renewed (conditionally) right before, and the write
        // must end while it stays this node's (`fence`).
        let valid_until = self.fence(&id.actor).await?;
        let put =
            self.remote.put_manifest(id, object, |existing| crypto::open_manifest(ring, id, existing).is_ok_and(|o| o.plain == bytes));
        match valid_until {
            None => put.await?,
            Some(deadline) => tokio::time::timeout_at(deadline, put).await.map_err(|_| Error::LeaseLost {
                actor: id.actor.clone(),
                detail: format!(
                    "the manifest write of {id} did not end while this node's lease was valid: abandoned (if it still lands, it is this node's, under the epoch that was valid when it was sent; the upload is retried)"
                ),
            })??,
        };
        let back = self.remote.get_manifest(id).await?;
        let opened = back.as_deref().map(|b| crypto::open_manifest(ring, id, b)).transpose()?;
        let Some(opened) = opened.filter(|o| o.plain == bytes) else {
            return Err(Error::Corrupt {
                id: id.clone(),
                what: format!("manifest read back from the object tier ({}) differs from the one written", self.remote.manifest_path(id)),
            });
        };
        let tx = Tx::begin(&self.db)?;
        // While this manifest is there, it vouches for its chunks (the next
        // upload reusing them checks it instead of each chunk).
        if opened.key.as_ref().map(|k| k.id()) == key.as_ref().map(|k| k.id()) {
            tx.set_chunk_refs(index_keys.iter().map(|k| k.as_str()), &id.db_key())?;
        }
        let mut r = tx.get(id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        r.remote = RemoteState::Durable;
        r.upload_now = false;
        r.upload_attempts = 0;
        r.next_attempt_ms = 0;
        r.last_error = None;
        r.key_id = opened.key.map(|k| k.id().to_string());
        tx.put(&r)?;
        tx.commit()?;
        self.stats.uploaded(started.elapsed());
        info!(snapshot = %id, uploaded_raw = done_raw, logical = r.logical_bytes, key = r.key_id.as_deref().unwrap_or("none (unencrypted)"), ms = started.elapsed().as_millis() as u64, "snapshot durable in the object tier");
        self.wake.notify_one();
        self.info(&r)
    }
}
