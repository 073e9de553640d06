//! Streamed checkouts: a snapshot that is only in the object tier is
//! restored before its last byte arrives.
//!
//! `Store::checkout_streamed` (`stream_checkout`) fetches what the restore reads itself:
//! every file but the tasks' page images, then the runs of those page
//! images that are not lazy (`pagemap`). It then returns a
//! checkout whose page images are still partly holes, and the rest keeps
//! coming in the background: the actor's recorded *working set* at once
//! (the pages its last streamed resume touched in its first moments), the
//! other chunks `stream_background_delay` later, so that the restore and
//! the process's first answer do not share the CPU with the bulk of the
//! fetch (its GETs, decryption, decompression and writes).
//! CRIU's lazy-pages daemon asks the node daemon's page server
//! (`crate::page_server`) for the pages the restored process faults on;
//! the page server asks [`Stream::want`] for the chunks that hold them,
//! which jump the queue. Every chunk is verified (digest and, sealed,
//! AEAD) before a byte of it is written, so nothing unverified reaches a
//! process.
//!
//! A checkout of a snapshot whose stream is under way (clones of one
//! golden snapshot made at once) joins that stream: its own lease on the
//! same partial copy and page server, so every chunk is fetched once and
//! no restore waits for the last byte of another's.
//!
//! When all chunks are in, the copy is finished like a fetch (modes,
//! fsync, manifest) and renamed into place: the snapshot is local. A chunk
//! that cannot be had (the object tier down, stalled past
//! `stream_stall_timeout`, or answering corrupt data) fails the stream:
//! `Store::wait_stream` says why, the partial copy is removed and the
//! snapshot stays in the object tier, intact. The shim then stops the
//! restored processes and the actor is SUSPENDED again.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::warn;

use crate::crypto::Key;
use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::pagemap::{Pagemap, PAGE_SIZE};
use crate::util::lock;

/// Starts fetching chunk `c` of a stream (`stream_checkout` makes it: a
/// task on the store, which fails the stream when the chunk cannot be had).
pub(crate) type FetchChunk = Arc<dyn Fn(Arc<Stream>, usize) + Send + Sync>;

/// Pages faulted on within this long after the first one form the working
/// set the next streamed resume fetches first.
pub const WORKING_SET_WINDOW: Duration = Duration::from_secs(1);

/// At most this many working-set pages are kept per actor.
pub const MAX_WORKING_SET: usize = 16_384;

/// A page of an actor's working set: `pid`'s page at `vaddr` in the
/// images of container directory `dir`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WsPage {
    pub dir: String,
    pub pid: u32,
    pub vaddr: u64,
}

/// What a stream did, once it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamSummary {
    /// Bytes of chunk objects fetched (compressed, sealed).
    pub fetched_bytes: u64,
    pub chunks: u64,
    /// Fetched before the restore could start (metadata, eager pages).
    pub chunks_before_restore: u64,
    /// Milliseconds from the checkout's start: the manifest read, the
    /// checkout answered (the restore starts), the first page served, the
    /// last chunk in.
    pub manifest_ms: u64,
    pub ready_ms: u64,
    pub first_page_ms: Option<u64>,
    pub done_ms: u64,
    /// Pages the page server served, and of them those whose chunk was
    /// not in yet when asked (a fault that waited on the object tier).
    pub pages_served: u64,
    pub pages_waited: u64,
    /// The recorded working set this stream fetched first: its pages and
    /// the chunks that hold them (those not in yet went first), and the
    /// pages recorded for the next resume.
    pub working_set_pages: u64,
    pub working_set_chunks: u64,
    pub working_set_recorded: u64,
}

#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Running,
    Done(StreamSummary),
    /// Why, and whether a chunk was corrupt.
    Failed(String, bool),
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Absent,
    Fetching,
    Done,
}

pub(crate) struct ChunkSlot {
    pub(crate) digest: String,
    pub(crate) size: u32,
    /// (manifest entry, offset) of every place the chunk's bytes go.
    pub(crate) places: Vec<(usize, u64)>,
}

/// One streamed checkout (see the module doc).
pub struct Stream {
    /// The first checkout's lease (set once the lease is taken).
    pub(crate) lease: std::sync::OnceLock<String>,
    /// The object-tier pin every lease on the stream records (set with the
    /// first lease).
    pub(crate) pin: std::sync::OnceLock<String>,
    pub id: SnapshotId,
    /// Where its files are being written (the checkout's path).
    pub root: PathBuf,
    pub(crate) key: Option<Arc<Key>>,
    /// Relative path → manifest entry.
    pub(crate) entries: HashMap<String, usize>,
    pub(crate) files: Vec<Option<Arc<std::fs::File>>>,
    /// Per manifest entry: its chunks as (offset, size, chunk), by offset.
    pub(crate) layout: Vec<Vec<(u64, u32, usize)>>,
    pub(crate) chunks: Vec<ChunkSlot>,
    pub(crate) slots: Mutex<Vec<Slot>>,
    /// Bumped when a chunk is in or the stream ends.
    pub(crate) changed: watch::Sender<u64>,
    pub(crate) outcome: Mutex<Outcome>,
    /// (container dir, pid) → its page map (read once the maps are in).
    pub(crate) pagemaps: std::sync::OnceLock<HashMap<(String, u32), Pagemap>>,
    pub(crate) started: Instant,
    /// Bytes of files written so far, of `total` (the transfer's progress).
    pub(crate) written: std::sync::atomic::AtomicU64,
    pub(crate) total: u64,
    pub(crate) stats: Mutex<StreamSummary>,
    pub(crate) first_fault: Mutex<Option<Instant>>,
    pub(crate) working_set: Mutex<Vec<WsPage>>,
    /// Starts fetching one chunk of the stream on the store (its
    /// failure fails the stream); does nothing once the store is gone.
    pub(crate) fetch_chunk: FetchChunk,
    /// `root` stays until its checkouts are released (CRIU reads it by
    /// path until then): the finished copy is placed as hard links beside
    /// it.
    pub(crate) root_state: Mutex<RootState>,
}

/// Who still reads a stream's `root`: it goes once the local copy is
/// placed and no checkout holds it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct RootState {
    pub(crate) checkouts: usize,
    pub(crate) placed: bool,
}

impl RootState {
    pub(crate) fn gone(&self) -> bool {
        self.placed && self.checkouts == 0
    }
}

/// Where the page server finds `nr` pages of a task: the pages file (a
/// manifest entry), the byte offset, the pages it can serve from there.
#[derive(Clone, Copy, Debug)]
pub struct PageSpan {
    pub(crate) entry: usize,
    pub offset: u64,
    pub pages: u64,
}

impl Stream {
    pub fn lease(&self) -> &str {
        self.lease.get().map_or("", |l| l.as_str())
    }

    pub(crate) fn pagemaps(&self) -> impl Iterator<Item = (&(String, u32), &Pagemap)> {
        self.pagemaps.get().into_iter().flatten()
    }

    /// The bytes of `span`, once every chunk under them is in (asked for
    /// first if not): `Err` with the reason when the stream failed.
    pub async fn read(self: &Arc<Self>, span: PageSpan) -> std::result::Result<Vec<u8>, String> {
        let len = span.pages * PAGE_SIZE;
        let wanted = self.chunks_under(span.entry, span.offset, len);
        let waited = self.want(&wanted);
        self.wait_for(&wanted).await?;
        {
            let mut st = lock(&self.stats);
            st.pages_served += span.pages;
            if waited {
                st.pages_waited += span.pages;
            }
            if st.first_page_ms.is_none() {
                st.first_page_ms = Some(self.started.elapsed().as_millis() as u64);
            }
        }
        let f = self.files.get(span.entry).and_then(|f| f.clone()).ok_or("page read of a directory")?;
        let off = span.offset;
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, off).map(|_| buf).map_err(|e| format!("read of {len} bytes at {off} of the pages file: {e}"))
        })
        .await
        .map_err(|e| format!("page read task: {e}"))?
    }

    /// Where `nr` pages of task `pid` from `vaddr` are, in the images of
    /// container directory `dir`. `Err` names what is wrong.
    pub fn locate(&self, dir: &str, pid: u32, vaddr: u64, nr: u64) -> std::result::Result<PageSpan, String> {
        let pm = self
            .pagemaps
            .get()
            .and_then(|m| m.get(&(dir.to_string(), pid)))
            .ok_or_else(|| format!("no page map of task {pid} in {dir:?}"))?;
        let (offset, pages) = pm.locate(vaddr, nr).ok_or_else(|| format!("task {pid} has no saved page at {vaddr:#x}"))?;
        let path = format!("{dir}/pages-{}.img", pm.pages_id);
        let entry = *self.entries.get(&path).ok_or_else(|| format!("{path} is not in the snapshot"))?;
        Ok(PageSpan { entry, offset, pages })
    }

    /// A page the restored process faulted on (`nr` 1: CRIU's lazy-pages
    /// daemon asks for single pages on faults, larger runs in the
    /// background): kept for the working set while within its window.
    pub fn note_request(&self, dir: &str, pid: u32, vaddr: u64, nr: u64) {
        if nr != 1 {
            return;
        }
        let now = Instant::now();
        let first = *lock(&self.first_fault).get_or_insert(now);
        if now.duration_since(first) > WORKING_SET_WINDOW {
            return;
        }
        let mut ws = lock(&self.working_set);
        if ws.len() < MAX_WORKING_SET {
            ws.push(WsPage { dir: dir.to_string(), pid, vaddr });
        }
    }

    /// One more checkout of the stream, if its `root` is still there and
    /// it has not ended.
    pub(crate) fn join(&self) -> bool {
        let mut st = lock(&self.root_state);
        if st.gone() || !matches!(*lock(&self.outcome), Outcome::Running) {
            return false;
        }
        st.checkouts += 1;
        true
    }

    /// A checkout of the stream let go of `root`: whether `root` can go.
    pub(crate) fn leave(&self) -> bool {
        let mut st = lock(&self.root_state);
        st.checkouts = st.checkouts.saturating_sub(1);
        st.gone()
    }

    /// Fails the stream for a reason found outside it (a page request the
    /// snapshot cannot answer).
    pub fn abandon(&self, why: String) {
        self.fail(why);
    }

    /// The reason it failed, if it did.
    pub fn failure(&self) -> Option<String> {
        match &*lock(&self.outcome) {
            Outcome::Failed(why, _) => Some(why.clone()),
            _ => None,
        }
    }

    /// Waits until the stream has ended.
    pub async fn wait(&self) -> Result<StreamSummary> {
        let mut rx = self.changed.subscribe();
        loop {
            match &*lock(&self.outcome) {
                Outcome::Done(s) => return Ok(s.clone()),
                Outcome::Failed(why, corrupt) => {
                    return Err(Error::StreamFailed { id: self.id.clone(), why: why.clone(), corrupt: *corrupt })
                }
                Outcome::Running => {}
            }
            if rx.changed().await.is_err() {
                return Err(Error::Internal("the stream was dropped".into()));
            }
        }
    }

    pub(crate) fn chunks_under(&self, entry: usize, offset: u64, len: u64) -> Vec<usize> {
        let Some(l) = self.layout.get(entry) else { return Vec::new() };
        let first = l.partition_point(|(o, size, _)| o + *size as u64 <= offset);
        l[first..].iter().take_while(|(o, _, _)| *o < offset + len).map(|(_, _, c)| *c).collect()
    }

    /// Starts fetching those of `wanted` nobody fetches yet, ahead of the
    /// background; whether any of them was not in yet.
    pub(crate) fn want(self: &Arc<Self>, wanted: &[usize]) -> bool {
        let mut missing = false;
        let mut start = Vec::new();
        {
            let mut slots = lock(&self.slots);
            for &c in wanted {
                match slots[c] {
                    Slot::Done => {}
                    Slot::Fetching => missing = true,
                    Slot::Absent => {
                        slots[c] = Slot::Fetching;
                        missing = true;
                        start.push(c);
                    }
                }
            }
        }
        for c in start {
            (self.fetch_chunk)(self.clone(), c);
        }
        missing
    }

    /// Claims chunk `c` for the background; false if it is taken or in.
    pub(crate) fn claim(&self, c: usize) -> bool {
        let mut slots = lock(&self.slots);
        if slots[c] == Slot::Absent {
            slots[c] = Slot::Fetching;
            return true;
        }
        false
    }

    pub(crate) async fn wait_for(&self, wanted: &[usize]) -> std::result::Result<(), String> {
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(why) = self.failure() {
                return Err(why);
            }
            if wanted.iter().all(|c| lock(&self.slots)[*c] == Slot::Done) {
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Err("the stream was dropped".into());
            }
        }
    }

    /// (bytes written, bytes in all) while it runs; `None` once it ended.
    pub fn progress(&self) -> Option<(u64, u64)> {
        matches!(*lock(&self.outcome), Outcome::Running).then(|| (self.written.load(std::sync::atomic::Ordering::Relaxed), self.total))
    }

    pub(crate) fn done(&self, c: usize, fetched: u64) {
        let slot = &self.chunks[c];
        self.written.fetch_add(slot.size as u64 * slot.places.len() as u64, std::sync::atomic::Ordering::Relaxed);
        lock(&self.slots)[c] = Slot::Done;
        {
            let mut st = lock(&self.stats);
            st.fetched_bytes += fetched;
            st.chunks += 1;
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Ends the stream as failed (the first reason wins).
    pub(crate) fn fail(&self, why: String) {
        self.failed(why, false);
    }

    pub(crate) fn fail_with(&self, e: &Error) {
        let corrupt = matches!(e, Error::Corrupt { .. });
        self.failed(e.to_string(), corrupt);
    }

    pub(crate) fn failed(&self, why: String, corrupt: bool) {
        {
            let mut o = lock(&self.outcome);
            if !matches!(*o, Outcome::Running) {
                return;
            }
            warn!(snapshot = %self.id, lease = self.lease(), "streamed checkout failed: {why}");
            *o = Outcome::Failed(why, corrupt);
        }
        self.changed.send_modify(|n| *n += 1);
    }
}
