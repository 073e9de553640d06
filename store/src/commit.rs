//! Staging and commit: a writer's empty staging directory, a reader's view
//! of it before it is committed, its abort, and its commit into the actor's
//! next generation on the local tier (chunked, digested, fsynced, renamed
//! into place).
//!
//! Why `impl Store` here: a commit assigns the generation in the metadata
//! database, places the directory in the local tier that fetch, upload and
//! retention also use, and wakes the background worker; the staging table
//! (which stagings exist, which are being committed) is `Store`'s, because
//! recovery and gc read it too.

use std::path::PathBuf;

use tracing::{debug, info, warn};

use crate::db::{self, LocalState, Record, RemoteState, Tx};
use crate::error::{Error, Result};
use crate::id::ActorName;
use crate::local;
use crate::local::remove_file_if_present;
use crate::manifest::{self, Manifest, MANIFEST_FILE};
use crate::snapshot::{CommitOptions, SnapshotInfo, Staging};
use crate::state::Store;
use crate::time::now_ms;
use crate::util::{blocking, lock, random_id};

impl Store {
    /// An empty staging directory for a new snapshot of `actor`.
    pub async fn begin(&self, actor: &ActorName) -> Result<Staging> {
        let id = random_id();
        let path = self.paths.staging.join(&id);
        // 0700: what the writer (CRIU, the rootfs tar) dumps into it is
        // process memory, root's alone from the first byte.
        local::create_private_dir(&path).map_err(|e| Error::io("create staging directory", &path, e))?;
        // The sidecar names the actor: a staging survives a restart of the
        // daemon (a shim may have dumped an actor into it and not committed yet).
        local::write_atomic(&self.staging_sidecar(&id), actor.as_str().as_bytes())?;
        lock(&self.stagings).insert(id.clone(), (actor.clone(), false));
        debug!(actor = %actor, staging = %id, "staging begun");
        Ok(Staging { id, path, actor: actor.clone() })
    }

    /// Drop a staging directory that will not be committed.
    pub async fn abort(&self, staging_id: &str) -> Result<()> {
        {
            let mut st = lock(&self.stagings);
            match st.get(staging_id) {
                None => return Err(Error::StagingNotFound(staging_id.to_string())),
                Some((_, true)) => return Err(Error::InvalidArgument(format!("staging {staging_id:?} is being committed"))),
                Some(_) => {
                    st.remove(staging_id);
                }
            }
        }
        local::remove_tree(&self.paths.staging.join(staging_id), &self.paths.trash)?;
        remove_file_if_present(&self.staging_sidecar(staging_id))
    }

    /// A reader's view of a writer's staging that is not committed yet (the
    /// resume of an actor right after its suspend, while the commit hashes
    /// the dump): hard links to its files in a directory of their own, which
    /// the commit's rename does not move, released with [`Store::release`].
    /// The files are the dump the writer made on this node; the commit
    /// verifies nothing a reader could check sooner. `StagingNotFound` once
    /// the staging is committed (check the snapshot out instead) or aborted.
    pub async fn view_staging(&self, staging_id: &str) -> Result<(PathBuf, String)> {
        let lease = random_id();
        let view = self.paths.staging.join(format!("{lease}.view"));
        let src = self.paths.staging.join(staging_id);
        {
            let st = lock(&self.stagings);
            if !st.contains_key(staging_id) {
                return Err(Error::StagingNotFound(staging_id.to_string()));
            }
        }
        let (placing, v, id) = (self.placing.clone(), view.clone(), staging_id.to_string());
        let trash = self.paths.trash.clone();
        blocking(move || {
            let _placing = lock(&placing);
            if !src.is_dir() {
                return Err(Error::StagingNotFound(id));
            }
            // The dump is done: its files become the store's (0600), shared
            // by the view's hard links.
            local::make_tree_private(&src)?;
            local::link_tree(&src, &v).inspect_err(|_| {
                let _ = local::remove_tree(&v, &trash);
            })
        })
        .await?;
        lock(&self.views).insert(lease.clone(), view.clone());
        debug!(staging = staging_id, view = %view.display(), "staging viewed");
        Ok((view, lease))
    }

    /// `<root>/staging/<id>.actor`: the actor a writer's staging belongs to.
    pub(crate) fn staging_sidecar(&self, staging_id: &str) -> PathBuf {
        self.paths.staging.join(format!("{staging_id}.actor"))
    }

    /// Wait (at most `commit_wait`) until no commit of `actor` is in
    /// progress: its newest generation is the one being committed.
    pub(crate) async fn wait_for_commits(&self, actor: &ActorName) -> Result<()> {
        let started = tokio::time::Instant::now();
        let deadline = started.checked_add(self.cfg.commit_wait).unwrap_or(started);
        loop {
            // Created before the check: a commit that ends in between wakes it.
            let done = self.commit_done.notified();
            let busy = lock(&self.stagings).iter().find(|(_, (a, busy))| *busy && a == actor).map(|(id, _)| id.clone());
            let Some(staging) = busy else { return Ok(()) };
            debug!(actor = %actor, staging, "waiting for the commit in progress of the actor's newest generation");
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return Err(Error::CommitInProgress { actor: actor.clone(), staging, waited_s: started.elapsed().as_secs() });
            }
        }
    }

    /// Turn a staging directory into the actor's next generation: chunk and
    /// digest its files, fsync them, write the manifest, rename into the local
    /// tier. The snapshot is then local (not yet durable).
    ///
    /// Committing a staging again (a writer whose answer was lost, or the
    /// cleanup after a shim died during its commit) waits for a commit in
    /// progress and answers the snapshot it made.
    pub async fn commit(&self, staging_id: &str, opts: CommitOptions) -> Result<SnapshotInfo> {
        let actor = loop {
            let done = self.commit_done.notified();
            {
                let mut st = lock(&self.stagings);
                match st.get_mut(staging_id) {
                    None => {
                        let made = lock(&self.committed).get(staging_id).cloned();
                        return match made.map(|id| db::record(&self.db, &id)).transpose()?.flatten() {
                            Some(rec) if !rec.removing => self.info(&rec),
                            _ => Err(Error::StagingNotFound(staging_id.to_string())),
                        };
                    }
                    Some((actor, busy)) if !*busy => {
                        *busy = true;
                        break actor.clone();
                    }
                    Some(_) => {}
                }
            }
            debug!(staging = staging_id, "waiting for the commit of this staging in progress");
            done.await;
        };
        // A commit cut short (its future dropped) frees the staging for the next.
        struct Busy<'a>(&'a Store, &'a str, bool);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                if !self.2 {
                    if let Some((_, busy)) = lock(&self.0.stagings).get_mut(self.1) {
                        *busy = false;
                    }
                    self.0.commit_done.notify_waiters();
                }
            }
        }
        let mut guard = Busy(self, staging_id, false);
        let res = self.commit_inner(staging_id, &actor, opts).await;
        guard.2 = true;
        if res.is_ok() {
            if let Err(e) = remove_file_if_present(&self.staging_sidecar(staging_id)) {
                warn!(staging = staging_id, error = %e, "committed, but its staging sidecar stays");
            }
        }
        {
            let mut st = lock(&self.stagings);
            match &res {
                Ok(info) => {
                    st.remove(staging_id);
                    let mut made = lock(&self.committed);
                    if made.len() >= 4096 {
                        made.clear();
                    }
                    made.insert(staging_id.to_string(), info.id.clone());
                }
                Err(_) => {
                    if let Some((_, busy)) = st.get_mut(staging_id) {
                        *busy = false;
                    }
                }
            }
        }
        self.commit_done.notify_waiters();
        res
    }

    pub(crate) async fn commit_inner(&self, staging_id: &str, actor: &ActorName, opts: CommitOptions) -> Result<SnapshotInfo> {
        let started = std::time::Instant::now();
        let staging = self.paths.staging.join(staging_id);
        let chunking = self.cfg.chunking;
        let dir = staging.clone();
        // The manifest keeps the writer's modes; the committed copy is 0700/0600.
        let entries = blocking(move || {
            let entries = local::build_entries(&dir, &chunking)?;
            local::make_tree_private(&dir)?;
            Ok(entries)
        })
        .await?;
        let logical_bytes: u64 = entries.iter().map(|e| e.size).sum();
        let chunk_count: u64 = entries.iter().map(|e| e.chunks.len() as u64).sum();
        let now = now_ms();
        let keep_local = opts.keep_local.unwrap_or(self.cfg.default_keep_local);

        // Assign the generation and record the commit (Committing) before the rename.
        let tx = Tx::begin(&self.db)?;
        let generation = tx.generation(actor)?.checked_add(1).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "actor {actor}: its newest generation is {}, the largest there is: no further snapshot can be committed (a generation that large was planted in the object tier or its lease; remove it there)",
                u64::MAX
            ))
        })?;
        let manifest = Manifest {
            format: manifest::MANIFEST_FORMAT,
            actor: actor.clone(),
            generation,
            created_ms: now,
            labels: opts.labels.clone(),
            chunker: "fastcdc-2020".into(),
            chunking,
            hash: "sha256".into(),
            encryption: None,
            logical_bytes,
            entries,
        };
        let (bytes, digest) = manifest.to_bytes().map_err(Error::Internal)?;
        let rec = Record {
            actor: actor.clone(),
            generation,
            created_ms: now,
            logical_bytes,
            chunk_count,
            labels: opts.labels,
            last_used_ms: now,
            keep_local_until_ms: now.saturating_add(crate::config::millis(keep_local)),
            manifest_digest: digest,
            local: LocalState::Committing { staging: staging_id.to_string() },
            remote: RemoteState::Absent,
            removing: false,
            upload_now: false,
            upload_attempts: 0,
            next_attempt_ms: 0,
            last_error: None,
            key_id: None,
        };
        tx.see_generation(actor, generation)?;
        tx.put(&rec)?;
        tx.commit()?;

        let id = rec.id();
        let target = self.snapshot_dir(&id);
        let placed = {
            let staging = staging.clone();
            let target = target.clone();
            let placing = self.placing.clone();
            blocking(move || {
                let _placing = lock(&placing);
                local::write_atomic(&staging.join(MANIFEST_FILE), &bytes)?;
                let parent = target.parent().ok_or_else(|| Error::Internal("snapshot dir has no parent".into()))?;
                local::create_dir_all_durable(parent)?;
                std::fs::rename(&staging, &target).map_err(|e| Error::io("rename staging into place", &target, e))?;
                local::fsync_dir(parent)?;
                if let Some(p) = staging.parent() {
                    local::fsync_dir(p)?;
                }
                Ok(())
            })
            .await
        };
        if let Err(e) = placed {
            // Undo: the commit did not happen (the generation stays used).
            if target.exists() {
                let _ = std::fs::rename(&target, &staging);
            }
            let tx = Tx::begin(&self.db)?;
            tx.delete(&id)?;
            tx.commit()?;
            return Err(e);
        }
        let mut rec = rec;
        rec.local = LocalState::Present;
        let tx = Tx::begin(&self.db)?;
        tx.put(&rec)?;
        tx.commit()?;
        // Its every byte was hashed above, for the manifest (the mode
        // change after changed every ctime: no earlier fingerprint).
        self.mark_verified(&id, &target, &manifest, None);
        info!(snapshot = %id, bytes = logical_bytes, chunks = chunk_count, ms = started.elapsed().as_millis() as u64, "snapshot committed");
        self.wake.notify_one();
        Ok(self.info_with_pins(&rec, 0))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::util::lock;
    use crate::{ActorName, CommitOptions, Error, Remote, Store, StoreConfig};

    async fn store(commit_wait: Duration) -> (tempfile::TempDir, Arc<Store>) {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::new(tmp.path().join("store"));
        cfg.background = false;
        cfg.commit_wait = commit_wait;
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
        (tmp, Store::open_with_remote(cfg, remote).await.unwrap())
    }

    fn dump(dir: &std::path::Path, n: u8) {
        std::fs::write(dir.join("pages-1.img"), vec![n; 10_000]).unwrap();
    }

    /// Issue 14, finding 15: "the actor's newest snapshot" while its newest
    /// generation is being committed is that generation, not the previous.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn latest_waits_for_the_commit_in_progress_of_the_newest_generation() {
        let (_t, store) = store(Duration::from_secs(60)).await;
        let a = ActorName::new("ns/x").unwrap();
        let s1 = store.begin(&a).await.unwrap();
        dump(&s1.path, 1);
        let g1 = store.commit(&s1.id, CommitOptions::default()).await.unwrap();
        let s2 = store.begin(&a).await.unwrap();
        dump(&s2.path, 2);
        // Its commit is in progress (as while a large dump is hashed).
        lock(&store.stagings).get_mut(&s2.id).unwrap().1 = true;
        let (st, a2) = (store.clone(), a.clone());
        let latest = tokio::spawn(async move { st.latest(&a2).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!latest.is_finished(), "latest answered while the newest generation was being committed");
        lock(&store.stagings).get_mut(&s2.id).unwrap().1 = false;
        let g2 = store.commit(&s2.id, CommitOptions::default()).await.unwrap();
        assert_eq!(g2.id.generation, g1.id.generation + 1);
        assert_eq!(latest.await.unwrap().unwrap().unwrap().id, g2.id);
    }

    /// … and a commit that does not end within `commit_wait` is a clear error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn latest_says_so_when_the_commit_in_progress_does_not_end() {
        let (_t, store) = store(Duration::from_millis(300)).await;
        let a = ActorName::new("ns/y").unwrap();
        let s = store.begin(&a).await.unwrap();
        lock(&store.stagings).get_mut(&s.id).unwrap().1 = true;
        let err = store.latest(&a).await.unwrap_err();
        assert!(matches!(err, Error::CommitInProgress { .. }), "{err}");
        assert!(err.to_string().contains("ns/y") && err.to_string().contains(&s.id) && err.to_string().contains("try again"), "{err}");
        // Another actor's commit is not waited for.
        assert!(store.latest(&ActorName::new("ns/z").unwrap()).await.unwrap().is_none());
    }
}
