//! Checkout and fetch: a verified local copy pinned against eviction, fetched
//! from the object tier (every chunk verified) when there is none, and its
//! release.
//!
//! Why `impl Store` here: a fetch creates the local copy under the
//! snapshot's exclusive file lock that upload and retention share, records
//! it in the metadata database and pins it in the object tier
//! (`pin`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use tracing::{debug, info, warn};

use crate::chunk;
use crate::crypto::Key;
use crate::db::{self, LeaseRecord, LocalState, Record, Tx};
use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::local;
use crate::manifest::{EntryKind, Manifest, MANIFEST_FILE};
use crate::remote::ChunkName;
use crate::snapshot::{Checkout, Progress};
use crate::state::Store;
use crate::time::now_ms;
use crate::util::{blocking, lock, random_id};

impl Store {
    /// A verified local copy of the snapshot, pinned until [`Store::release`]:
    /// fetched from the object tier when not local (chunks in parallel, each
    /// verified, into staging, then renamed into place); a local copy is
    /// verified against the manifest (unless `verify_local_on_checkout` is off).
    pub async fn checkout(&self, id: &SnapshotId, progress: Option<Progress>) -> Result<Checkout> {
        let (_excl, rec) = match self.pin_or_lock(id, progress.clone()).await? {
            Ok(co) => return Ok(co),
            Err(locked) => locked,
        };
        match rec.local {
            LocalState::Absent => self.fetch(rec, progress).await,
            ref other => Err(Error::Internal(format!("snapshot {id} is in local state {other:?} outside any operation"))),
        }
    }

    /// The local copy of `id`, pinned, if there is one; otherwise the
    /// snapshot's exclusive file lock and its record, to fetch it under.
    pub(crate) async fn pin_or_lock(
        &self,
        id: &SnapshotId,
        progress: Option<Progress>,
    ) -> Result<std::result::Result<Checkout, (tokio::sync::OwnedRwLockWriteGuard<()>, Record)>> {
        self.record_or_import(id).await?;
        let kl = self.key_lock(id);
        {
            let _shared = kl.files.read().await;
            let rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
            if rec.removing {
                return Err(Error::NotFound(id.clone()));
            }
            if rec.local == LocalState::Present {
                return self.pin_local(rec, progress).await.map(Ok);
            }
        }
        let excl = kl.files.clone().write_owned().await;
        let rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        if rec.removing {
            return Err(Error::NotFound(id.clone()));
        }
        if rec.local == LocalState::Present {
            return self.pin_local(rec, progress).await.map(Ok);
        }
        Ok(Err((excl, rec)))
    }

    pub(crate) async fn pin_local(&self, rec: Record, progress: Option<Progress>) -> Result<Checkout> {
        let id = rec.id();
        let dir = self.snapshot_dir(&id);
        let mpath = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io("read manifest", &mpath, e))?;
        let m = self.check_manifest(&id, &bytes, &rec.manifest_digest, "local")?;
        let mut verified_bytes = 0;
        if self.cfg.verify_local_on_checkout && self.recently_verified(&id, &dir, &m) {
            debug!(snapshot = %id, "local copy unchanged since this daemon hashed it: not hashed again");
        } else if self.cfg.verify_local_on_checkout {
            let before = local::fingerprint(&dir, &m).ok();
            let started = std::time::Instant::now();
            let d = dir.clone();
            let m2 = m.clone();
            blocking(move || Ok(local::verify_tree(&d, &m2)))
                .await?
                .map_err(|what| Error::Corrupt { id: id.clone(), what: format!("local copy at {}: {what}", dir.display()) })?;
            verified_bytes = m.logical_bytes;
            let secs = started.elapsed().as_secs_f64();
            debug!(snapshot = %id, bytes = verified_bytes, mib_per_s = (verified_bytes as f64 / 1048576.0 / secs.max(1e-9)) as u64, "local copy verified");
            self.mark_verified(&id, &dir, &m, before);
        }
        if let Some(p) = progress {
            let _ = p.send((m.logical_bytes, m.logical_bytes));
        }
        let lease = self.add_lease(&id, None, None)?;
        let rec = db::record(&self.db, &id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        Ok(Checkout { info: self.info(&rec)?, path: dir, lease, fetched: false, verified_bytes })
    }

    /// Whether this daemon hashed every byte of the local copy of `id` (in
    /// `dir`) less than `trust_verified_local_for` ago, and its files `stat`
    /// the same now as then.
    fn recently_verified(&self, id: &SnapshotId, dir: &Path, m: &Manifest) -> bool {
        let ttl = self.cfg.trust_verified_local_for;
        let Some((at, then)) = lock(&self.verified).get(id).cloned() else { return false };
        at.elapsed() < ttl && local::fingerprint(dir, m).is_ok_and(|now| now == then)
    }

    /// Records that every byte of the local copy of `id` (in `dir`) was
    /// just hashed against `m` ([`Store::recently_verified`]). `before`:
    /// the fingerprint taken before the hashing began; a copy that changed
    /// while it was hashed is not recorded.
    pub(crate) fn mark_verified(&self, id: &SnapshotId, dir: &Path, m: &Manifest, before: Option<local::Fingerprint>) {
        let ttl = self.cfg.trust_verified_local_for;
        if ttl.is_zero() {
            return;
        }
        match local::fingerprint(dir, m) {
            Ok(fp) if before.as_ref().is_some_and(|b| *b != fp) => {
                debug!(snapshot = %id, "the local copy changed while it was hashed: hashed again at its next checkout");
            }
            Ok(fp) => {
                let mut v = lock(&self.verified);
                v.retain(|_, (at, _)| at.elapsed() < ttl);
                v.insert(id.clone(), (std::time::Instant::now(), fp));
            }
            Err(e) => debug!(snapshot = %id, "no fingerprint of the local copy (it is hashed at its next checkout): {e}"),
        }
    }

    pub(crate) fn add_lease(&self, id: &SnapshotId, new_local: Option<LocalState>, remote_pin: Option<String>) -> Result<String> {
        let lease = random_id();
        let tx = Tx::begin(&self.db)?;
        let mut rec = tx.get(id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        rec.last_used_ms = now_ms();
        if let Some(l) = new_local {
            rec.local = l;
        }
        tx.put(&rec)?;
        tx.put_lease(&lease, &LeaseRecord { key: id.db_key(), created_ms: now_ms(), remote_pin })?;
        tx.commit()?;
        Ok(lease)
    }

    pub(crate) async fn fetch(&self, rec: Record, progress: Option<Progress>) -> Result<Checkout> {
        let id = rec.id();
        let started = std::time::Instant::now();
        let staging_id = random_id();
        let staging = self.paths.staging.join(&staging_id);
        {
            let tx = Tx::begin(&self.db)?;
            let mut r = rec.clone();
            r.local = LocalState::Fetching { staging: staging_id.clone() };
            tx.put(&r)?;
            tx.commit()?;
        }
        let res = self.fetch_into(&rec, &staging, progress).await;
        match res {
            Ok(pin) => {
                let lease = match self.add_lease(&id, Some(LocalState::Present), Some(pin.clone())) {
                    Ok(l) => l,
                    Err(e) => {
                        self.drop_pin(&pin).await;
                        return Err(e);
                    }
                };
                let rec = db::record(&self.db, &id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
                self.stats.fetched(started.elapsed());
                info!(snapshot = %id, bytes = rec.logical_bytes, ms = started.elapsed().as_millis() as u64, "fetched from the object tier");
                self.wake.notify_one();
                Ok(Checkout { info: self.info(&rec)?, path: self.snapshot_dir(&id), lease, fetched: true, verified_bytes: 0 })
            }
            Err(e) => {
                let _ = local::remove_tree(&staging, &self.paths.trash);
                let tx = Tx::begin(&self.db)?;
                if let Some(mut r) = tx.get(&id)? {
                    r.local = LocalState::Absent;
                    tx.put(&r)?;
                }
                tx.commit()?;
                warn!(snapshot = %id, error = %e, "fetch failed");
                Err(match e {
                    e @ (Error::Corrupt { .. } | Error::NotFound(_) | Error::UnknownKey { .. }) => e,
                    other => Error::FetchFailed { id: id.clone(), source: Box::new(other) },
                })
            }
        }
    }

    /// Fetch into `staging` and rename into place; returns the checkout pin
    /// written in the object tier (`store::pin`).
    pub(crate) async fn fetch_into(&self, rec: &Record, staging: &Path, progress: Option<Progress>) -> Result<String> {
        let id = rec.id();
        let mpath = self.remote.manifest_path(&id);
        let bytes = self
            .remote
            .get_manifest(&id)
            .await?
            .ok_or_else(|| Error::Corrupt { id: id.clone(), what: format!("manifest missing from the object tier at {mpath}") })?;
        let (bytes, key) = self.open_for_restore(&id, &bytes)?;
        if let Some(was) = &rec.key_id {
            if key.as_ref().map(|k| k.id()) != Some(was.as_str()) {
                return Err(Error::Corrupt {
                    id: id.clone(),
                    what: format!(
                        "uploaded sealed under key {was:?}, the object tier's manifest ({mpath}) is {}",
                        key.map_or("not encrypted".to_string(), |k| format!("sealed under key {:?}", k.id()))
                    ),
                });
            }
        }
        let m = self.check_manifest(&id, &bytes, &rec.manifest_digest, "object tier")?;
        // Pinned in the object tier before any chunk is fetched; the
        // manifest still there after that: a removal from now on finds the
        // pin, a sweep that has not seen the pin saw the manifest.
        let names: Vec<ChunkName> = m.unique_chunks().into_iter().map(|c| ChunkName::of(key.as_deref(), &c.digest)).collect();
        let pin = self.write_pin(&id, key.as_ref(), &names).await?;
        let res = match self.remote.manifest_exists(&id).await {
            Ok(true) => self.fetch_chunks_into(&id, staging, m, bytes, key, progress, &pin).await,
            Ok(false) => {
                warn!(snapshot = %id, "the snapshot was removed from the object tier as its fetch began");
                Err(Error::NotFound(id.clone()))
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => Ok(pin),
            Err(e) => {
                self.drop_pin(&pin).await;
                Err(e)
            }
        }
    }

    /// GETs a chunk the manifest of snapshot `id` lists; one the object
    /// tier does not have is `Corrupt` (the snapshot is not whole there),
    /// naming it; so is one larger than a chunk of `size` bytes is stored as.
    pub(crate) async fn get_listed_chunk(&self, id: &SnapshotId, name: &ChunkName, digest: &str, size: u32) -> Result<bytes::Bytes> {
        match self.remote.get_chunk(name, size).await {
            Err(Error::Remote { source, .. }) if matches!(*source, object_store::Error::NotFound { .. }) => Err(Error::Corrupt {
                id: id.clone(),
                what: format!("chunk sha256:{digest} is missing from the object tier ({})", self.remote.chunk_path(name)),
            }),
            Err(e @ Error::Inconsistent { .. }) => Err(Error::Corrupt { id: id.clone(), what: format!("chunk sha256:{digest}: {e}") }),
            r => r,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fetch_chunks_into(
        &self,
        id: &SnapshotId,
        staging: &Path,
        m: Manifest,
        bytes: Vec<u8>,
        key: Option<Arc<Key>>,
        progress: Option<Progress>,
        pin: &str,
    ) -> Result<()> {
        let id = id.clone();
        local::create_private_dir(staging).map_err(|e| Error::io("create fetch staging", staging, e))?;
        let (root, m2) = (staging.to_path_buf(), m.clone());
        let paths = blocking(move || local::materialize_skeleton(&root, &m2)).await?;
        // digest → (size, [(file, offset)])
        let mut files: Vec<Option<Arc<std::fs::File>>> = Vec::with_capacity(paths.len());
        let mut wanted: HashMap<String, (u32, Vec<(usize, u64)>)> = HashMap::new();
        let mut order = Vec::new();
        for (i, e) in m.entries.iter().enumerate() {
            if e.kind != EntryKind::File {
                files.push(None);
                continue;
            }
            let f = std::fs::OpenOptions::new().write(true).open(&paths[i]).map_err(|err| Error::io("open", &paths[i], err))?;
            files.push(Some(Arc::new(f)));
            let mut off = 0u64;
            for c in &e.chunks {
                let slot = wanted.entry(c.digest.clone()).or_insert_with(|| {
                    order.push(c.digest.clone());
                    (c.size, Vec::new())
                });
                slot.1.push((i, off));
                off += c.size as u64;
            }
        }
        let total = m.logical_bytes;
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        if let Some(p) = &progress {
            let _ = p.send((0, total));
        }
        let files = Arc::new(files);
        let wanted = Arc::new(wanted);
        let stream = futures::stream::iter(order.into_iter().map(|digest| {
            let (files, wanted, done, progress, id, key) =
                (files.clone(), wanted.clone(), done.clone(), progress.clone(), id.clone(), key.clone());
            let root = staging.to_path_buf();
            async move {
                let name = ChunkName::of(key.as_deref(), &digest);
                let path = self.remote.chunk_path(&name);
                let size = wanted.get(&digest).map_or(0, |(size, _)| *size);
                let object = self.get_listed_chunk(&id, &name, &digest, size).await?;
                let fetched = object.len() as u64;
                let written = blocking(move || {
                    let (size, places) = wanted.get(&digest).ok_or_else(|| Error::Internal("unknown chunk".into()))?;
                    let data = open_fetched(&id, &object, &name, &path, &digest, *size, key.as_deref())?;
                    write_at_places(&data, places, &files, &root)
                })
                .await?;
                let d = done.fetch_add(written, std::sync::atomic::Ordering::Relaxed) + written;
                if let Some(p) = &progress {
                    let _ = p.send((d, total));
                }
                Ok::<u64, Error>(fetched)
            }
        }))
        .buffer_unordered(self.cfg.fetch_concurrency);
        let mut stream = Box::pin(stream);
        while let Some(fetched) = stream.next().await {
            let fetched = fetched?;
            self.stats.update(|s| s.fetched_bytes += fetched);
            self.renew_pin_if_due(pin, &id).await?;
        }
        drop(stream);
        drop(files);
        let (root, target) = (staging.to_path_buf(), self.snapshot_dir(&id));
        blocking(move || {
            local::finish_tree(&root, &m)?;
            local::write_atomic(&root.join(MANIFEST_FILE), &bytes)?;
            let parent = target.parent().ok_or_else(|| Error::Internal("snapshot dir has no parent".into()))?;
            local::create_dir_all_durable(parent)?;
            std::fs::rename(&root, &target).map_err(|e| Error::io("rename fetched snapshot into place", &target, e))?;
            local::fsync_dir(parent)
        })
        .await
    }

    /// Drop a pin taken by [`Store::checkout`].
    pub async fn release(&self, lease: &str) -> Result<()> {
        let stream = lock(&self.streams).remove(lease);
        if let Some(s) = stream {
            self.stream_released(&s);
        }
        let view = lock(&self.views).remove(lease);
        if let Some(view) = view {
            let trash = self.paths.trash.clone();
            return blocking(move || local::remove_tree(&view, &trash)).await;
        }
        let tx = Tx::begin(&self.db)?;
        let l = tx.remove_lease(lease)?.ok_or_else(|| Error::LeaseNotFound(lease.to_string()))?;
        if let Some(id) = SnapshotId::from_db_key(&l.key) {
            if let Some(mut r) = tx.get(&id)? {
                r.last_used_ms = now_ms();
                tx.put(&r)?;
            }
        }
        tx.commit()?;
        if let Some(pin) = &l.remote_pin {
            // Checkouts that joined one stream share its pin: the last goes.
            let shared = db::leases(&self.db)?.iter().any(|(_, o)| o.remote_pin.as_deref() == Some(pin.as_str()));
            if !shared {
                self.drop_pin(pin).await;
            }
        }
        self.wake.notify_one();
        Ok(())
    }
}

/// A chunk object fetched from the object tier (at `path`), verified
/// against its `digest` and plain `size`, opened with `key` if sealed: its
/// plain bytes, or `Corrupt` naming the chunk. Blocking (AEAD, zstd).
pub(crate) fn open_fetched(
    id: &SnapshotId,
    object: &[u8],
    name: &ChunkName,
    path: &object_store::path::Path,
    digest: &str,
    size: u32,
    key: Option<&Key>,
) -> Result<Vec<u8>> {
    match key {
        None => chunk::decode(object, digest, size),
        Some(k) => chunk::decode_sealed(object, digest, size, k, name.hex()),
    }
    .map_err(|what| Error::Corrupt { id: id.clone(), what: format!("chunk sha256:{digest} in the object tier ({path}): {what}") })
}

/// Writes a chunk's plain `data` at each of its places (entry number in
/// `files`, the open files of the tree at `root`; offset); the bytes
/// written. Blocking.
pub(crate) fn write_at_places(data: &[u8], places: &[(usize, u64)], files: &[Option<Arc<std::fs::File>>], root: &Path) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut n = 0u64;
    for (entry, off) in places {
        let f = files[*entry].as_ref().ok_or_else(|| Error::Internal("chunk of a directory".into()))?;
        f.write_all_at(data, *off).map_err(|e| Error::io("write fetched chunk", root.join(format!("#{entry}")), e))?;
        n += data.len() as u64;
    }
    Ok(n)
}
