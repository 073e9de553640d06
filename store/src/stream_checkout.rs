//! The store's side of streamed checkouts (`stream` describes them): start
//! a stream of a snapshot only in the object tier, or join one under way;
//! fetch its chunks (those the page server asks for first, the working set,
//! then the rest after `stream_background_delay`); finish it like a fetch
//! and place the copy; the working sets recorded for the next resume.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::crypto::Key;
use crate::db::{self, LocalState, Tx};
use crate::error::{Error, Result};
use crate::fetch::{open_fetched, write_at_places};
use crate::id::{ActorName, SnapshotId};
use crate::local;
use crate::manifest::{EntryKind, Manifest, MANIFEST_FILE};
use crate::pagemap::{Pagemap, PAGE_SIZE};
use crate::remote::ChunkName;
use crate::snapshot::Checkout;
use crate::state::Store;
use crate::stream::{ChunkSlot, Outcome, RootState, Slot, Stream, StreamSummary, WsPage};
use crate::util::{blocking, lock, random_id};

/// Test-only (`failpoints` builds): while `$TORPOR_FAILPOINTS_DIR/snapshotter`
/// says `stream-hold`, a stream's background part waits (pages asked for
/// are still fetched): a stream that is still under way when a test
/// breaks the object tier.
#[cfg(feature = "failpoints")]
async fn background_held() {
    let Some(dir) = std::env::var_os("TORPOR_FAILPOINTS_DIR") else { return };
    let armed = Path::new(&dir).join("snapshotter");
    while std::fs::read_to_string(&armed).is_ok_and(|s| s.trim() == "stream-hold") {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[cfg(not(feature = "failpoints"))]
async fn background_held() {}

/// `<dir>/pagemap-<pid>.img` (a task's page map, not a shared-memory one).
fn task_pagemap(path: &str) -> Option<(String, u32)> {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let pid = name.strip_prefix("pagemap-")?.strip_suffix(".img")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((dir.to_string(), pid.parse().ok()?))
}

fn is_pages_file(path: &str) -> bool {
    let name = path.rsplit_once('/').map_or(path, |(_, n)| n);
    name.starts_with("pages-") && name.ends_with(".img")
}

impl Store {
    /// A checkout of `id` that may answer before the snapshot is local:
    /// like [`Store::checkout`] when there is a local copy; otherwise
    /// fetched as a [`Stream`] (see the module doc), which is returned too.
    pub async fn checkout_streamed(self: &Arc<Self>, id: &SnapshotId) -> Result<(Checkout, Option<Arc<Stream>>)> {
        // A stream of `id` under way holds its lock to the end: a checkout
        // waiting for that lock joins the stream once it is ready instead.
        let mut ready = self.stream_ready.subscribe();
        let (excl, rec) = loop {
            if let Some((co, s)) = self.join_stream(id)? {
                return Ok((co, Some(s)));
            }
            tokio::select! {
                r = self.pin_or_lock(id, None) => match r? {
                    Ok(co) => return Ok((co, None)),
                    Err(locked) => break locked,
                },
                _ = ready.changed() => {}
            }
        };
        match rec.local {
            LocalState::Absent => {
                let staging_id = random_id();
                let staging = self.paths.staging.join(&staging_id);
                {
                    let tx = Tx::begin(&self.db)?;
                    let mut r = rec.clone();
                    r.local = LocalState::Fetching { staging: staging_id };
                    tx.put(&r)?;
                    tx.commit()?;
                }
                match self.start_stream(&rec.id(), rec.key_id.as_deref(), &rec.manifest_digest, &staging).await {
                    Ok((stream, pin)) => {
                        let lease = stream.lease().to_string();
                        lock(&self.streams).insert(lease.clone(), stream.clone());
                        self.stream_ready.send_modify(|n| *n += 1);
                        let info = self.info(&db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?)?;
                        let store = self.clone();
                        let s = stream.clone();
                        tokio::spawn(async move {
                            let _excl = excl;
                            store.finish_stream(&s, &pin).await;
                        });
                        Ok((Checkout { info, path: staging, lease, fetched: true, verified_bytes: 0 }, Some(stream)))
                    }
                    Err((e, pin)) => {
                        if let Some(pin) = pin {
                            self.drop_pin(&pin).await;
                        }
                        self.stream_discarded(id, &staging);
                        warn!(snapshot = %id, error = %e, "streamed fetch failed before the restore");
                        Err(match e {
                            e @ (Error::Corrupt { .. } | Error::NotFound(_) | Error::UnknownKey { .. }) => e,
                            other => Error::FetchFailed { id: id.clone(), source: Box::new(other) },
                        })
                    }
                }
            }
            ref other => Err(Error::Internal(format!("snapshot {id} is in local state {other:?} outside any operation"))),
        }
    }

    /// A checkout of `id` on its stream under way, if there is one it can
    /// still join: its own lease (with the stream's pin), the same partial
    /// copy.
    fn join_stream(&self, id: &SnapshotId) -> Result<Option<(Checkout, Arc<Stream>)>> {
        // (A stream is in `streams` once ready: its pin is set.)
        let found = lock(&self.streams).values().find(|s| &s.id == id && s.progress().is_some()).cloned();
        let Some(s) = found.filter(|s| s.join()) else { return Ok(None) };
        let leased = self.add_lease(id, None, s.pin.get().cloned()).and_then(|lease| {
            let rec = db::record(&self.db, id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
            Ok((lease, self.info(&rec)?))
        });
        let (lease, info) = match leased {
            Ok(l) => l,
            Err(e) => {
                if s.leave() {
                    self.remove_stream_root(&s);
                }
                return Err(e);
            }
        };
        lock(&self.streams).insert(lease.clone(), s.clone());
        info!(snapshot = %id, lease = lease.as_str(), first = s.lease(), "checkout joined the stream under way");
        Ok(Some((Checkout { info, path: s.root.clone(), lease, fetched: true, verified_bytes: 0 }, s)))
    }

    /// Streams under way: (snapshot, bytes written, bytes in all), each
    /// once however many checkouts share it.
    pub fn streams_under_way(&self) -> Vec<(SnapshotId, u64, u64)> {
        let streams = lock(&self.streams);
        let mut seen: Vec<&Arc<Stream>> = Vec::new();
        let mut out = Vec::new();
        for s in streams.values() {
            if seen.iter().any(|o| Arc::ptr_eq(o, s)) {
                continue;
            }
            seen.push(s);
            if let Some((d, t)) = s.progress() {
                out.push((s.id.clone(), d, t));
            }
        }
        out
    }

    /// The stream of checkout `lease`, while it is known.
    pub fn stream(&self, lease: &str) -> Option<Arc<Stream>> {
        lock(&self.streams).get(lease).cloned()
    }

    /// Waits until the stream of checkout `lease` ended: what it did, or
    /// why it failed (the snapshot is then still in the object tier).
    pub async fn wait_stream(&self, lease: &str) -> Result<StreamSummary> {
        let s = self.stream(lease).ok_or_else(|| Error::LeaseNotFound(lease.to_string()))?;
        s.wait().await
    }

    /// The working set recorded for `actor` (empty if none).
    pub fn working_set(&self, actor: &ActorName) -> Result<Vec<WsPage>> {
        db::working_set(&self.db, actor)
    }

    /// Up to the point where the restore can start: the manifest and its
    /// pin, then the metadata images and the eager page runs, all in and
    /// verified. Returns the pin with the error once it was written.
    async fn start_stream(
        self: &Arc<Self>,
        id: &SnapshotId,
        key_id: Option<&str>,
        digest: &str,
        staging: &Path,
    ) -> std::result::Result<(Arc<Stream>, String), (Error, Option<String>)> {
        let started = Instant::now();
        let mpath = self.remote.manifest_path(id);
        let bytes = match self.remote.get_manifest(id).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err((Error::Corrupt { id: id.clone(), what: format!("manifest missing from the object tier at {mpath}") }, None))
            }
            Err(e) => return Err((e, None)),
        };
        let (bytes, key) = self.open_for_restore(id, &bytes).map_err(|e| (e, None))?;
        if let Some(was) = key_id {
            if key.as_ref().map(|k| k.id()) != Some(was) {
                return Err((
                    Error::Corrupt {
                        id: id.clone(),
                        what: format!("uploaded sealed under key {was:?}, the object tier's manifest ({mpath}) is not"),
                    },
                    None,
                ));
            }
        }
        let m = self.check_manifest(id, &bytes, digest, "object tier").map_err(|e| (e, None))?;
        let manifest_ms = started.elapsed().as_millis() as u64;
        let names: Vec<ChunkName> = m.unique_chunks().into_iter().map(|c| ChunkName::of(key.as_deref(), &c.digest)).collect();
        let pin = self.write_pin(id, key.as_ref(), &names).await.map_err(|e| (e, None))?;
        let with_pin = |e: Error| (e, Some(pin.clone()));
        match self.remote.manifest_exists(id).await {
            Ok(true) => {}
            Ok(false) => return Err(with_pin(Error::NotFound(id.clone()))),
            Err(e) => return Err(with_pin(e)),
        }
        let stream = self.open_stream(id, staging, &m, key, started).await.map_err(with_pin)?;
        lock(&stream.stats).manifest_ms = manifest_ms;
        // 1. Everything but the page images (CRIU's metadata, the seal).
        let meta: Vec<usize> = m
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EntryKind::File && !is_pages_file(&e.path))
            .flat_map(|(i, _)| stream.layout[i].iter().map(|(_, _, c)| *c))
            .collect();
        self.stream_chunks(&stream, meta).await.map_err(with_pin)?;
        // 2. The page maps, then the page runs the restore reads itself
        //    (not lazy), and the page images no task map names (shared
        //    memory): whole.
        self.read_pagemaps(&stream, &m).map_err(with_pin)?;
        let mut eager = Vec::new();
        let mut named = std::collections::HashSet::new();
        for ((dir, _), pm) in stream.pagemaps() {
            let path = format!("{dir}/pages-{}.img", pm.pages_id);
            let Some(&entry) = stream.entries.get(&path) else { continue };
            named.insert(entry);
            for (start, end) in pm.eager_ranges() {
                eager.extend(stream.chunks_under(entry, start, end - start));
            }
        }
        for (i, e) in m.entries.iter().enumerate() {
            if e.kind == EntryKind::File && is_pages_file(&e.path) && !named.contains(&i) {
                eager.extend(stream.layout[i].iter().map(|(_, _, c)| *c));
            }
        }
        self.stream_chunks(&stream, eager).await.map_err(with_pin)?;
        let lease = self.add_lease(id, None, Some(pin.clone())).map_err(with_pin)?;
        let _ = stream.lease.set(lease);
        let _ = stream.pin.set(pin.clone());
        {
            let mut st = lock(&stream.stats);
            st.chunks_before_restore = st.chunks;
            st.ready_ms = started.elapsed().as_millis() as u64;
        }
        info!(snapshot = %id, ms = started.elapsed().as_millis() as u64, chunks = lock(&stream.stats).chunks, of = stream.chunks.len(), "streamed checkout ready: the restore can start");
        Ok((stream, pin))
    }

    /// The stream's tables and its skeleton of sparse files.
    async fn open_stream(
        self: &Arc<Self>,
        id: &SnapshotId,
        staging: &Path,
        m: &Manifest,
        key: Option<Arc<Key>>,
        started: Instant,
    ) -> Result<Arc<Stream>> {
        local::create_private_dir(staging).map_err(|e| Error::io("create fetch staging", staging, e))?;
        let (root, m2) = (staging.to_path_buf(), m.clone());
        let paths = blocking(move || local::materialize_skeleton(&root, &m2)).await?;
        let mut files = Vec::with_capacity(paths.len());
        let mut layout = Vec::with_capacity(paths.len());
        let mut entries = HashMap::new();
        let mut chunks: Vec<ChunkSlot> = Vec::new();
        let mut by_digest: HashMap<String, usize> = HashMap::new();
        for (i, e) in m.entries.iter().enumerate() {
            entries.insert(e.path.clone(), i);
            let mut l = Vec::new();
            if e.kind == EntryKind::File {
                let f =
                    std::fs::OpenOptions::new().read(true).write(true).open(&paths[i]).map_err(|err| Error::io("open", &paths[i], err))?;
                files.push(Some(Arc::new(f)));
                let mut off = 0u64;
                for c in &e.chunks {
                    let n = *by_digest.entry(c.digest.clone()).or_insert_with(|| {
                        chunks.push(ChunkSlot { digest: c.digest.clone(), size: c.size, places: Vec::new() });
                        chunks.len() - 1
                    });
                    chunks[n].places.push((i, off));
                    l.push((off, c.size, n));
                    off += c.size as u64;
                }
            } else {
                files.push(None);
            }
            layout.push(l);
        }
        let n = chunks.len();
        Ok(Arc::new(Stream {
            lease: std::sync::OnceLock::new(),
            pin: std::sync::OnceLock::new(),
            id: id.clone(),
            root: staging.to_path_buf(),
            key,
            entries,
            files,
            layout,
            chunks,
            slots: Mutex::new(vec![Slot::Absent; n]),
            changed: watch::channel(0).0,
            outcome: Mutex::new(Outcome::Running),
            pagemaps: std::sync::OnceLock::new(),
            started,
            written: 0.into(),
            total: m.logical_bytes,
            stats: Mutex::new(StreamSummary::default()),
            first_fault: Mutex::new(None),
            working_set: Mutex::new(Vec::new()),
            fetch_chunk: {
                let store = Arc::downgrade(self);
                Arc::new(move |s: Arc<Stream>, c: usize| {
                    let Some(store) = store.upgrade() else { return };
                    tokio::spawn(async move {
                        if let Err(e) = store.stream_chunk(&s, c).await {
                            s.fail_with(&e);
                        }
                    });
                })
            },
            root_state: Mutex::new(RootState { checkouts: 1, placed: false }),
        }))
    }

    /// Reads and checks every task's page map (already in).
    fn read_pagemaps(&self, s: &Stream, m: &Manifest) -> Result<()> {
        let corrupt = |what: String| Error::Corrupt { id: s.id.clone(), what };
        let mut maps = HashMap::new();
        for e in &m.entries {
            let Some((dir, pid)) = task_pagemap(&e.path) else { continue };
            let p = s.root.join(&e.path);
            let img = std::fs::read(&p).map_err(|err| Error::io("read page map", &p, err))?;
            // The pages file's size bounds the map's runs; a map naming a
            // pages file the snapshot does not have is refused.
            let probe = Pagemap::parse(&img, u64::MAX).map_err(|what| corrupt(format!("{}: {what}", e.path)))?;
            let pages = format!("{dir}/pages-{}.img", probe.pages_id);
            let size = m
                .entries
                .iter()
                .find(|x| x.path == pages)
                .map(|x| x.size)
                .ok_or_else(|| corrupt(format!("{} names {pages}, which the snapshot does not have", e.path)))?;
            let pm = Pagemap::parse(&img, size).map_err(|what| corrupt(format!("{}: {what}", e.path)))?;
            maps.insert((dir, pid), pm);
        }
        let _ = s.pagemaps.set(maps);
        Ok(())
    }

    /// Fetches `wanted` (those nobody fetches yet), `fetch_concurrency` at
    /// a time, and waits for all of them.
    async fn stream_chunks(self: &Arc<Self>, s: &Arc<Stream>, wanted: Vec<usize>) -> Result<()> {
        let claimed: Vec<usize> = wanted.iter().copied().filter(|c| s.claim(*c)).collect();
        let mut fetches =
            futures::stream::iter(claimed.into_iter().map(|c| self.stream_chunk(s, c))).buffer_unordered(self.cfg.fetch_concurrency);
        while let Some(r) = fetches.next().await {
            if let Err(e) = r {
                s.fail_with(&e);
                return Err(e);
            }
        }
        drop(fetches);
        s.wait_for(&wanted).await.map_err(|why| Error::StreamFailed { id: s.id.clone(), why, corrupt: false })
    }

    /// GETs chunk `c` (bounded by `stream_stall_timeout`), verifies it and
    /// writes it into its places (on the blocking pool, as a whole fetch
    /// does: AEAD and zstd would hold up the page server's replies); the
    /// chunk object's size.
    async fn stream_chunk(&self, s: &Arc<Stream>, c: usize) -> Result<u64> {
        let slot = &s.chunks[c];
        let name = ChunkName::of(s.key.as_deref(), &slot.digest);
        let path = self.remote.chunk_path(&name);
        let after = self.cfg.stream_stall_timeout;
        let object = match tokio::time::timeout(after, self.get_listed_chunk(&s.id, &name, &slot.digest, slot.size)).await {
            Err(_) => return Err(Error::Stalled { op: "get chunk", path: path.to_string(), after }),
            Ok(r) => r?,
        };
        let fetched = object.len() as u64;
        let st = s.clone();
        blocking(move || {
            let slot = &st.chunks[c];
            let data = open_fetched(&st.id, &object, &name, &path, &slot.digest, slot.size, st.key.as_deref())?;
            write_at_places(&data, &slot.places, &st.files, &st.root)
        })
        .await?;
        self.stats.update(|st| st.fetched_bytes += fetched);
        s.done(c, fetched);
        Ok(fetched)
    }

    /// Fetches the chunks of `order` nobody fetches yet, in that order,
    /// `fetch_concurrency` at a time, renewing the pin as it goes; false
    /// once the stream failed.
    async fn fetch_in_background(self: &Arc<Self>, s: &Arc<Stream>, pin: &str, order: Vec<usize>) -> bool {
        let claimed = order.into_iter().filter(|c| s.claim(*c));
        let mut fetches = futures::stream::iter(claimed.map(|c| self.stream_chunk(s, c))).buffer_unordered(self.cfg.fetch_concurrency);
        while let Some(r) = fetches.next().await {
            if let Err(e) = r {
                s.fail_with(&e);
                return false;
            }
            if let Err(e) = self.renew_pin_if_due(pin, &s.id).await {
                s.fail_with(&e);
                return false;
            }
            if s.failure().is_some() {
                return false;
            }
        }
        true
    }

    /// The background part: the working set first, then the rest; then
    /// the copy is finished and renamed into place, or removed on failure.
    async fn finish_stream(self: &Arc<Self>, s: &Arc<Stream>, pin: &str) {
        background_held().await;
        let mut order: Vec<usize> = Vec::new();
        let ws = self.working_set(&s.id.actor).unwrap_or_else(|e| {
            warn!(actor = %s.id.actor, error = %e, "working set unreadable: streamed in file order");
            Vec::new()
        });
        for p in &ws {
            if let Ok(span) = s.locate(&p.dir, p.pid, p.vaddr, 1) {
                order.extend(s.chunks_under(span.entry, span.offset, PAGE_SIZE));
            }
        }
        let mut seen = std::collections::HashSet::new();
        order.retain(|c| seen.insert(*c));
        {
            let mut st = lock(&s.stats);
            st.working_set_pages = ws.len() as u64;
            st.working_set_chunks = order.len() as u64;
        }
        // The rest once the restore had the CPU to itself for a while;
        // page faults meanwhile fetch their chunks on demand.
        if self.fetch_in_background(s, pin, order).await {
            tokio::time::sleep(self.cfg.stream_background_delay).await;
            if s.failure().is_none() {
                self.fetch_in_background(s, pin, (0..s.chunks.len()).collect()).await;
            }
        }
        let all: Vec<usize> = (0..s.chunks.len()).collect();
        let res = match s.wait_for(&all).await {
            Err(why) => Err(why),
            Ok(()) => self.place_streamed(s).await.map_err(|e| e.to_string()),
        };
        match res {
            Ok(()) => {
                let summary = {
                    let mut st = lock(&s.stats);
                    st.done_ms = s.started.elapsed().as_millis() as u64;
                    st.working_set_recorded = lock(&s.working_set).len() as u64;
                    st.clone()
                };
                let mut recorded = std::mem::take(&mut *lock(&s.working_set));
                // Clones restored from one stream fault on the same pages.
                let mut seen = std::collections::HashSet::new();
                recorded.retain(|p| seen.insert(p.clone()));
                if !recorded.is_empty() {
                    if let Err(e) = db::put_working_set(&self.db, &s.id.actor, &recorded) {
                        warn!(actor = %s.id.actor, error = %e, "working set not saved");
                    }
                }
                self.stats.fetched(s.started.elapsed());
                self.wake.notify_one();
                info!(snapshot = %s.id, ms = summary.done_ms, ready_ms = summary.ready_ms, first_page_ms = summary.first_page_ms, bytes = summary.fetched_bytes, pages_served = summary.pages_served, pages_waited = summary.pages_waited, working_set_pages = summary.working_set_pages, working_set_chunks = summary.working_set_chunks, working_set_recorded = summary.working_set_recorded, "streamed from the object tier");
                *lock(&s.outcome) = Outcome::Done(summary);
                s.changed.send_modify(|n| *n += 1);
            }
            Err(why) => {
                s.fail(why);
                self.stream_discarded(&s.id, &s.root);
            }
        }
    }

    /// All chunks in: finished like a fetch and renamed into place.
    async fn place_streamed(&self, s: &Stream) -> Result<()> {
        let id = s.id.clone();
        let bytes = self.remote.get_manifest(&id).await?.ok_or_else(|| Error::NotFound(id.clone()))?;
        let (bytes, _) = self.open_for_restore(&id, &bytes)?;
        let rec = db::record(&self.db, &id)?.ok_or_else(|| Error::NotFound(id.clone()))?;
        let m = self.check_manifest(&id, &bytes, &rec.manifest_digest, "object tier")?;
        let (root, target) = (s.root.clone(), self.snapshot_dir(&id));
        let links = self.paths.staging.join(random_id());
        blocking(move || {
            local::finish_tree(&root, &m)?;
            // The checkouts still read `root` by path: the local copy is
            // its hard links, with the manifest beside them, renamed into
            // place. Nothing is added to `root`: a restore checking its
            // images against their seal refuses any file the dump did not
            // write (once `.manifest.json.tmp`, when a clone joined just
            // before the end).
            local::link_tree(&root, &links)?;
            local::write_atomic(&links.join(MANIFEST_FILE), &bytes)?;
            let parent = target.parent().ok_or_else(|| Error::Internal("snapshot dir has no parent".into()))?;
            local::create_dir_all_durable(parent)?;
            std::fs::rename(&links, &target).map_err(|e| Error::io("rename fetched snapshot into place", &target, e))?;
            local::fsync_dir(parent)
        })
        .await?;
        let tx = Tx::begin(&self.db)?;
        if let Some(mut r) = tx.get(&id)? {
            r.local = LocalState::Present;
            tx.put(&r)?;
        }
        tx.commit()?;
        let gone = {
            let mut st = lock(&s.root_state);
            st.placed = true;
            st.gone()
        };
        if gone {
            self.remove_stream_root(s);
        }
        Ok(())
    }

    /// A checkout of stream `s` was released: its directory goes once the
    /// local copy is placed and no other checkout holds it.
    pub(crate) fn stream_released(&self, s: &Stream) {
        if s.leave() {
            self.remove_stream_root(s);
        }
    }

    fn remove_stream_root(&self, s: &Stream) {
        if let Err(e) = local::remove_tree(&s.root, &self.paths.trash) {
            warn!(snapshot = %s.id, error = %e, "streamed checkout's directory not removed (recovery removes it)");
        }
    }

    /// A stream that did not finish: its partial copy removed, the
    /// snapshot recorded as not local (it is whole in the object tier).
    fn stream_discarded(&self, id: &SnapshotId, staging: &Path) {
        if let Err(e) = local::remove_tree(staging, &self.paths.trash) {
            warn!(snapshot = %id, error = %e, "partial streamed copy not removed (recovery removes it)");
        }
        let r = Tx::begin(&self.db).and_then(|tx| {
            if let Some(mut r) = tx.get(id)? {
                r.local = LocalState::Absent;
                tx.put(&r)?;
            }
            tx.commit()
        });
        if let Err(e) = r {
            warn!(snapshot = %id, error = %e, "snapshot not recorded as absent after a failed stream (recovery does it)");
        }
        debug!(snapshot = %id, "partial streamed copy discarded");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{CommitOptions, Remote, StoreConfig};

    /// A snapshot of `actor` only in the (in-memory) object tier.
    async fn only_remote(actor: &str) -> (tempfile::TempDir, Arc<Store>, SnapshotId) {
        only_remote_with(
            actor,
            |_| {},
            |dir| {
                std::fs::write(dir.join("inventory.img"), b"inventory").unwrap();
                std::fs::write(dir.join("pages-1.img"), (0..3_000_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
            },
        )
        .await
    }

    /// A snapshot of `actor` only in the object tier whose task's pages
    /// are all lazy (served to the restored process as it faults).
    async fn lazy_only_remote(actor: &str, config: impl FnOnce(&mut StoreConfig)) -> (tempfile::TempDir, Arc<Store>, SnapshotId) {
        use crate::pagemap::{tests::image, PE_LAZY, PE_PRESENT};
        only_remote_with(actor, config, |root| {
            let dir = root.join("app");
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("inventory.img"), b"inventory").unwrap();
            let pages = 733u64;
            std::fs::write(dir.join("pagemap-1.img"), image(1, &[(0x10_0000, pages, PE_PRESENT | PE_LAZY)])).unwrap();
            std::fs::write(dir.join("pages-1.img"), (0..pages * PAGE_SIZE).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
        })
        .await
    }

    /// A snapshot of `actor` made of the files `write` puts in its
    /// directory, uploaded to an in-memory object tier and evicted.
    async fn only_remote_with(
        actor: &str,
        config: impl FnOnce(&mut StoreConfig),
        write: impl FnOnce(&Path),
    ) -> (tempfile::TempDir, Arc<Store>, SnapshotId) {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::new(tmp.path().join("store"));
        cfg.background = false;
        config(&mut cfg);
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
        let store = Store::open_with_remote(cfg, remote).await.unwrap();
        let s = store.begin(&ActorName::new(actor).unwrap()).await.unwrap();
        write(&s.path);
        let id = store.commit(&s.id, CommitOptions::default()).await.unwrap().id;
        store.upload(&id, None).await.unwrap();
        store.evict(&id).await.unwrap();
        (tmp, store, id)
    }

    /// A second checkout while the first one's stream is under way joins
    /// it: same partial copy, its own lease, one fetch; the copy is placed
    /// once, and its directory and pin go with the last checkout.
    #[tokio::test]
    async fn a_checkout_during_a_stream_joins_it() {
        let (_t, store, id) = only_remote("ns/golden").await;
        let (first, s1) = store.checkout_streamed(&id).await.unwrap();
        // (current-thread runtime: the stream's background has not run yet)
        let (second, s2) = store.checkout_streamed(&id).await.unwrap();
        let (s1, s2) = (s1.expect("streamed"), s2.expect("joined"));
        assert!(Arc::ptr_eq(&s1, &s2), "one stream");
        assert_eq!(first.path, second.path, "one partial copy");
        assert_ne!(first.lease, second.lease, "a lease each");
        assert_eq!(store.streams_under_way().len(), 1, "reported once");
        let a = store.wait_stream(&first.lease).await.unwrap();
        assert_eq!(store.wait_stream(&second.lease).await.unwrap(), a);
        assert_eq!(store.status().fetched_bytes, a.fetched_bytes, "fetched once");
        let pin = s1.pin.get().cloned().unwrap();
        assert!(db::record(&store.db, &id).unwrap().unwrap().local == LocalState::Present, "placed");
        // What the checkouts read is the dump alone, before and after the
        // placement (a restore's seal check refuses anything else); the
        // local copy has its manifest.
        let m = Manifest::parse(&std::fs::read(store.snapshot_dir(&id).join(MANIFEST_FILE)).unwrap(), Some(&id)).unwrap();
        let mut want: Vec<String> = m.entries.iter().map(|e| e.path.clone()).collect();
        want.sort();
        let got: Vec<String> = local::scan_tree(&first.path).unwrap().into_iter().map(|(path, ..)| path).collect();
        assert_eq!(got, want, "nothing added to the directory the checkouts read");
        store.release(&first.lease).await.unwrap();
        assert!(first.path.exists(), "the second checkout still reads the partial copy by path");
        assert!(lock(&store.pins).contains_key(&pin), "the pin stays while a checkout holds it");
        store.release(&second.lease).await.unwrap();
        assert!(!first.path.exists(), "gone with the last checkout");
        assert!(!lock(&store.pins).contains_key(&pin), "dropped with the last checkout");
        // A checkout now pins the local copy.
        let (third, s3) = store.checkout_streamed(&id).await.unwrap();
        assert!(s3.is_none() && third.path == store.snapshot_dir(&id));
    }

    /// A checkout after the stream ended does not join it.
    #[tokio::test]
    async fn an_ended_stream_is_not_joined() {
        let (_t, store, id) = only_remote("ns/golden2").await;
        let (first, s1) = store.checkout_streamed(&id).await.unwrap();
        store.wait_stream(&first.lease).await.unwrap();
        assert!(!s1.unwrap().join(), "ended");
        let (second, s2) = store.checkout_streamed(&id).await.unwrap();
        assert!(s2.is_none(), "the local copy, pinned");
        assert_ne!(second.path, first.path);
    }

    /// The chunks nobody asked for wait for `stream_background_delay`; one
    /// a page fault wants meanwhile is fetched at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_rest_of_a_stream_waits_for_the_background_delay() {
        let (_t, store, id) = lazy_only_remote("ns/later", |c| c.stream_background_delay = Duration::from_secs(60)).await;
        let (co, s) = store.checkout_streamed(&id).await.unwrap();
        let s = s.expect("streamed");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (ready, total) = s.progress().unwrap();
        assert!(ready < total, "only what the restore reads first: {ready} of {total} bytes");
        let last = s.chunks.len() - 1;
        assert!(s.want(&[last]), "the last chunk is not in yet");
        s.wait_for(&[last]).await.unwrap();
        let (now, _) = s.progress().expect("still under way");
        assert_eq!(now, ready + s.chunks[last].size as u64 * s.chunks[last].places.len() as u64, "the wanted chunk alone");
        store.release(&co.lease).await.unwrap();
    }

    #[test]
    fn names_of_page_images() {
        assert_eq!(task_pagemap("web/pagemap-12.img"), Some(("web".to_string(), 12)));
        assert_eq!(task_pagemap("pagemap-1.img"), Some((String::new(), 1)));
        assert_eq!(task_pagemap("web/pagemap-shmem-4.img"), None);
        assert_eq!(task_pagemap("web/pagemap-.img"), None);
        assert!(is_pages_file("web/pages-3.img"));
        assert!(!is_pages_file("web/pagemap-3.img"));
        assert!(!is_pages_file("web/mm-3.img"));
    }
}
