//! Chunks shared across nodes: what keeps one node's chunk sweep from
//! deleting a chunk that an upload on another node names (docs/STORE.md,
//! "Chunks shared across nodes").
//!
//! A sweep deletes a chunk object that no manifest references and that is
//! older (by its last-modified time) than the grace period. Three things
//! make that safe while other nodes upload:
//!
//! - **Intents.** Before an upload checks or PUTs any chunk, it writes
//!   `<prefix>/intents/<id>.json` naming every chunk its manifest will name
//!   (sealed under the upload's key when there is one), renews it every
//!   [`INTENT_TTL`]/4 and deletes it once the manifest is written and read
//!   back. A sweep treats the chunks of every intent younger than
//!   [`INTENT_TTL`] (by last-modified, against its own announcement's) as
//!   referenced.
//! - **Announcements.** A sweep deletes only in rounds: it writes
//!   `<prefix>/sweeps/<id>-<round>.json` (with `live_ms`, how long after
//!   that object's last-modified time a delete of the round can still
//!   land), lists the intents and the manifests written since its first
//!   listing, drops from its victims whatever they reference, and issues
//!   deletes for at most [`SWEEP_DELETE_WINDOW`] after the announcement;
//!   the next round announces again. A round's announcement is deleted once
//!   every delete of the round has returned.
//! - **Checks.** After writing its intent, an upload waits while an
//!   announcement older than its intent is there and live (a round that may
//!   have decided without seeing the intent and may still delete); then it
//!   checks every chunk it reuses without sending it (the `chunks` index says
//!   it is durable): a chunk whose last manifest written by this node is
//!   still there is; any other one gets a HEAD, and a missing one is PUT
//!   again from the local copy.
//!
//! A sweep that decided after the intent was written sees the intent (or,
//! later, the manifest); one that decided before has finished deleting
//! before the upload checks its chunks and PUTs the missing ones. Only the
//! object store's clock is compared with itself (last-modified times); the
//! nodes' clocks are not compared with each other.
//!
//! Why `impl Store` here: the sweep takes the sweep lock exclusive against
//! this node's uploads and forgets swept chunks in the metadata database's
//! chunk index, which uploads read.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as OPath;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::crypto::{self, Key};
use crate::db::{self, Tx};
use crate::error::{Error, Result};
use crate::gc::GcReport;
use crate::gc::{Namespace, UnreadableManifest};
use crate::id::{ActorName, SnapshotId};
use crate::manifest::Manifest;
use crate::remote::ChunkName;
use crate::state::Store;
use crate::time::now_ms;
use crate::util::random_id;

/// An upload intent whose object is older than this (by its last-modified
/// time, against a sweep's announcement) is ignored by sweeps (its upload
/// died) and deleted. Uploads renew theirs every quarter of it.
pub const INTENT_TTL: Duration = Duration::from_secs(600);
/// A sweep round issues deletes for at most this long after it announced itself.
pub const SWEEP_DELETE_WINDOW: Duration = Duration::from_secs(20);
/// Object stores give last-modified times in whole seconds (S3): comparisons
/// of them allow this much.
const CLOCK_SLACK_MS: i64 = 2000;
/// How long an announcement whose body cannot be read is taken to be live.
const UNREADABLE_ANNOUNCEMENT_LIVE_MS: i64 = 300_000;
/// An announcement whose round cannot be running any more after this long is
/// deleted by the next sweep (its sweep died).
const STALE_ANNOUNCEMENT: Duration = Duration::from_secs(3600);
/// Per-request timeout of the object store client when the options do not set one (object_store's default).
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const INTENT_FORMAT: u32 = 1;
const ANNOUNCEMENT_FORMAT: u32 = 1;

/// `<prefix>/intents/<id>.json`, and a checkout pin
/// `<prefix>/actors/<actor>/_pins/<id>.json` (`store::pin`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IntentFile {
    format: u32,
    node: String,
    snapshot: String,
    /// Sealed uploads: the key the chunks are named under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_check: Option<String>,
    /// Plaintext: the chunks (sha256 hex). A pin whose fetch is over names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunks: Option<Vec<String>>,
    /// Sealed: the chunk addresses (a JSON array), sealed under the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nonce: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ciphertext: Option<String>,
}

/// The longest `live_ms` an announcement is taken at (a sweep announces a
/// few minutes at most: window, client retries, request timeout).
const MAX_ANNOUNCEMENT_LIVE_MS: u64 = 3_600_000;

/// `<prefix>/sweeps/<id>-<round>.json`
#[derive(Serialize, Deserialize)]
struct Announcement {
    format: u32,
    node: String,
    /// After the object's last-modified time, deletes of this round may land
    /// for this long (window + client retries + request timeout + slack).
    live_ms: u64,
}

/// An upload's intent in the object tier.
pub(crate) struct Intent {
    id: String,
    path: OPath,
    bytes: Vec<u8>,
    /// When the last successful PUT of it started.
    renewed: Instant,
    /// Its last-modified time (the object store's clock, ms) …
    server_ms: i64,
    /// … and when this node learned it.
    server_at: Instant,
}

impl Intent {
    /// A lower bound of the object store's clock now.
    fn server_now(&self) -> i64 {
        self.server_ms + self.server_at.elapsed().as_millis() as i64
    }
}

/// A kind of object that lists chunks in use ([`Store::chunk_lists_refs`]).
struct ChunkListKind {
    what: &'static str,
    why_stale: &'static str,
    read_op: &'static str,
    delete_op: &'static str,
}

const INTENTS: ChunkListKind = ChunkListKind {
    what: "upload intent",
    why_stale: "its upload died",
    read_op: "read upload intent",
    delete_op: "delete stale upload intent",
};

const PINS: ChunkListKind = ChunkListKind {
    what: "checkout pin",
    why_stale: "its node stopped renewing it",
    read_op: "read checkout pin",
    delete_op: "delete stale checkout pin",
};

/// Which part of the chunk objects an unreadable manifest (or intent) may name.
fn namespace_of(bytes: &[u8]) -> Namespace {
    if let Some(k) = crypto::sealed_key_id(bytes) {
        return Namespace::Key(k);
    }
    if crypto::is_sealed(bytes) {
        return Namespace::All;
    }
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) if v.get("manifest").is_some() => Namespace::Plain,
        _ => Namespace::All,
    }
}

/// What the manifests and intents of the object tier reference.
#[derive(Default)]
pub(crate) struct Refs {
    names: HashSet<ChunkName>,
    /// Kept whole: something that cannot be read may name chunks there.
    kept: BTreeSet<Namespace>,
}

impl Refs {
    fn keeps(&self, name: &ChunkName) -> bool {
        if self.names.contains(name) || self.kept.contains(&Namespace::All) {
            return true;
        }
        match name {
            ChunkName::Plain(_) => self.kept.contains(&Namespace::Plain),
            ChunkName::Sealed { key_id, .. } => self.kept.contains(&Namespace::Key(key_id.clone())),
        }
    }
}

impl Store {
    // ----- the uploader's side -----

    /// An intent's (or pin's) bytes: object `object_id`, about snapshot
    /// `id`, naming `names` (all sealed under `key`, or all plaintext).
    pub(crate) fn chunk_list_object(
        &self,
        object_id: &str,
        id: &SnapshotId,
        key: Option<&Arc<Key>>,
        names: &[ChunkName],
    ) -> Result<Vec<u8>> {
        let mut file = IntentFile {
            format: INTENT_FORMAT,
            node: self.cfg.node_id.clone(),
            snapshot: id.to_string(),
            key_id: None,
            key_check: None,
            chunks: None,
            nonce: None,
            ciphertext: None,
        };
        match key {
            None => file.chunks = Some(names.iter().map(|n| n.hex().to_string()).collect()),
            Some(k) => {
                let plain = serde_json::to_vec(&names.iter().map(|n| n.hex()).collect::<Vec<_>>())
                    .map_err(|e| Error::Internal(format!("encode chunk list: {e}")))?;
                let (nonce, ct) = crypto::seal_intent(k, object_id, &plain)?;
                file.key_id = Some(k.id().to_string());
                file.key_check = Some(k.check_value().to_string());
                file.nonce = Some(nonce);
                file.ciphertext = Some(ct);
            }
        }
        serde_json::to_vec(&file).map_err(|e| Error::Internal(format!("encode chunk list: {e}")))
    }

    /// Write the intent of the upload of `id`, naming `names` (all sealed
    /// under `key`, or all plaintext).
    pub(crate) async fn write_intent(&self, id: &SnapshotId, key: Option<&Arc<Key>>, names: &[ChunkName]) -> Result<Intent> {
        let intent_id = random_id();
        let bytes = self.chunk_list_object(&intent_id, id, key, names)?;
        let now = Instant::now();
        let mut intent =
            Intent { path: self.remote.intent_path(&intent_id), id: intent_id, bytes, renewed: now, server_ms: 0, server_at: now };
        self.put_intent(&mut intent).await?;
        debug!(snapshot = %id, intent = %intent.path, chunks = names.len(), "upload intent written");
        Ok(intent)
    }

    async fn put_intent(&self, it: &mut Intent) -> Result<()> {
        let started = Instant::now();
        self.remote.put_object("write upload intent", &it.path, it.bytes.clone()).await?;
        let meta = self.remote.head("check upload intent", &it.path).await?.ok_or_else(|| Error::Inconsistent {
            path: it.path.to_string(),
            detail: "the upload intent just written is not there".into(),
        })?;
        it.renewed = started;
        it.server_ms = meta.last_modified.timestamp_millis();
        it.server_at = Instant::now();
        Ok(())
    }

    /// Renew the intent when a quarter of its lifetime has passed since it was written.
    pub(crate) async fn renew_intent_if_due(&self, it: &mut Intent) -> Result<()> {
        if it.renewed.elapsed() >= INTENT_TTL / 4 {
            self.put_intent(it).await?;
            debug!(intent = %it.path, "upload intent renewed");
        }
        Ok(())
    }

    /// Delete the intent (its manifest is written, or the upload gave up).
    /// A failure only leaves it to expire.
    pub(crate) async fn drop_intent(&self, it: Intent) {
        if let Err(e) = self.remote.delete_object("delete upload intent", &it.path).await {
            warn!(intent = %it.path, error = %e, "upload intent not deleted (sweeps ignore it once it is stale)");
        }
        debug!(intent = %it.id, "upload intent dropped");
    }

    /// Wait while a sweep round that was announced before the intent (and so
    /// may have decided without it) can still delete.
    pub(crate) async fn wait_for_sweeps(&self, id: &SnapshotId, it: &mut Intent) -> Result<()> {
        let mut waited = false;
        loop {
            let mut until: Option<(i64, String)> = None;
            for m in self.remote.list_objects(&self.remote.sweeps_root()).await? {
                let lm = m.last_modified.timestamp_millis();
                if lm >= it.server_ms + CLOCK_SLACK_MS {
                    // Announced after the intent: that round's listing sees it.
                    continue;
                }
                let (node, live_ms) = match self.remote.get_object("read sweep announcement", &m.location).await? {
                    None => continue,
                    Some(b) => match serde_json::from_slice::<Announcement>(&b) {
                        // Bounded: a planted announcement must not make
                        // uploads wait for ever (nor overflow the sum).
                        Ok(a) if a.live_ms <= MAX_ANNOUNCEMENT_LIVE_MS => (a.node, a.live_ms as i64),
                        Ok(a) => {
                            warn!(announcement = %m.location, live_ms = a.live_ms, "sweep announcement live for longer than any sweep announces ({} s): taken as live for {} s after it was written", MAX_ANNOUNCEMENT_LIVE_MS / 1000, UNREADABLE_ANNOUNCEMENT_LIVE_MS / 1000);
                            (a.node, UNREADABLE_ANNOUNCEMENT_LIVE_MS)
                        }
                        Err(e) => {
                            warn!(announcement = %m.location, error = %e, "unreadable sweep announcement: taken as live for {} s after it was written", UNREADABLE_ANNOUNCEMENT_LIVE_MS / 1000);
                            ("?".to_string(), UNREADABLE_ANNOUNCEMENT_LIVE_MS)
                        }
                    },
                };
                let end = lm + live_ms + CLOCK_SLACK_MS;
                if end > it.server_now() && until.as_ref().is_none_or(|(u, _)| end > *u) {
                    until = Some((end, node));
                }
            }
            let Some((end, node)) = until else {
                if waited {
                    info!(snapshot = %id, "the chunk sweep is done: upload continues");
                }
                return Ok(());
            };
            if !waited {
                info!(snapshot = %id, sweeping_node = %node, at_most_ms = end - it.server_now(), "a chunk sweep (another node) is deleting: the upload waits until it is done");
                self.stats.update(|s| s.sweep_waits += 1);
                waited = true;
            }
            self.renew_intent_if_due(it).await?;
            tokio::time::sleep(Duration::from_millis((end - it.server_now()).clamp(1, 500) as u64)).await;
        }
    }

    /// Of chunks the index calls durable (index key → the snapshot whose
    /// manifest this node last wrote naming it), the ones not in the object
    /// tier: the manifest still there vouches for its chunks; any other
    /// chunk gets a HEAD.
    pub(crate) async fn missing_reused(&self, reused: &HashMap<String, Option<String>>) -> Result<HashSet<String>> {
        let mut by_manifest: BTreeMap<Option<String>, Vec<&String>> = BTreeMap::new();
        for (k, by) in reused {
            by_manifest.entry(by.clone()).or_default().push(k);
        }
        let mut check: Vec<String> = Vec::new();
        for (by, keys) in by_manifest {
            let vouched = match by.as_deref().and_then(SnapshotId::from_db_key) {
                Some(sid) => self.remote.manifest_exists(&sid).await?,
                None => false,
            };
            if !vouched {
                check.extend(keys.into_iter().cloned());
            }
        }
        let checked = check.len() as u64;
        let missing: Vec<Option<String>> = futures::stream::iter(check.into_iter().map(|k: String| async move {
            let name = ChunkName::from_index_key(&k).ok_or_else(|| Error::DbRecord {
                op: "read chunk index",
                key: k.clone(),
                detail: "not a chunk name".into(),
            })?;
            Ok::<_, Error>(if self.remote.chunk_exists(&name).await? { None } else { Some(k) })
        }))
        .buffer_unordered(self.cfg.upload_concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
        let missing: HashSet<String> = missing.into_iter().flatten().collect();
        let gone = missing.len() as u64;
        self.stats.update(|s| {
            s.chunks_checked += checked;
            s.chunks_missing += gone;
        });
        if !missing.is_empty() {
            warn!(
                missing = missing.len(),
                checked, "chunks this node had uploaded are gone from the object tier (swept by another node): sending them again"
            );
            let tx = Tx::begin(&self.db)?;
            tx.remove_chunks(missing.iter().map(|k| k.as_str()))?;
            tx.commit()?;
        }
        Ok(missing)
    }

    // ----- gc's side -----

    /// Import the object tier's snapshots (of `actor`, or all) this database
    /// does not know; one that cannot be read is recorded in `unreadable`
    /// instead of failing.
    pub(crate) async fn refresh_for_gc(
        &self,
        actor: Option<&ActorName>,
        unreadable: &mut BTreeMap<SnapshotId, UnreadableManifest>,
    ) -> Result<()> {
        let ids = match actor {
            Some(a) => self.remote.generations(a).await?.into_iter().map(|g| SnapshotId::new(a.clone(), g)).collect(),
            None => self.remote.all_snapshots().await?,
        };
        for id in ids {
            if db::record(&self.db, &id)?.is_some() {
                continue;
            }
            match self.import(&id).await {
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e @ (Error::UnknownKey { .. } | Error::Corrupt { .. })) => {
                    let bytes = self.remote.get_manifest(&id).await?;
                    let keeps = bytes.as_deref().map_or(Namespace::All, namespace_of);
                    let key_id = bytes.as_deref().and_then(crypto::sealed_key_id);
                    unreadable.insert(id.clone(), UnreadableManifest { id, key_id, error: e.to_string(), keeps });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The chunks a manifest of the object tier references, into `refs`; one
    /// that cannot be read keeps the part of the chunk objects it may name.
    async fn manifest_refs(
        &self,
        id: &SnapshotId,
        refs: &mut Refs,
        unreadable: &mut BTreeMap<SnapshotId, UnreadableManifest>,
    ) -> Result<()> {
        let Some(bytes) = self.remote.get_manifest(id).await? else { return Ok(()) };
        let parsed = crypto::open_manifest(&self.cfg.keyring, id, &bytes).and_then(|o| {
            Manifest::parse(&o.plain, Some(id))
                .map(|m| (m, o.key))
                .map_err(|what| Error::Corrupt { id: id.clone(), what: format!("manifest in the object tier: {what}") })
        });
        match parsed {
            Ok((m, key)) => refs.names.extend(m.unique_chunks().into_iter().map(|c| ChunkName::of(key.as_deref(), &c.digest))),
            Err(e) => {
                let keeps = namespace_of(&bytes);
                refs.kept.insert(keeps.clone());
                unreadable.insert(
                    id.clone(),
                    UnreadableManifest { id: id.clone(), key_id: crypto::sealed_key_id(&bytes), error: e.to_string(), keeps },
                );
            }
        }
        Ok(())
    }

    /// The node and snapshot an intent or pin names.
    pub(crate) fn chunk_list_header(bytes: &[u8]) -> std::result::Result<(String, String), String> {
        let file: IntentFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        Ok((file.node, file.snapshot))
    }

    /// The chunks an upload intent names, into `refs`.
    pub(crate) fn intent_refs(&self, path: &OPath, bytes: &[u8], refs: &mut Refs) -> std::result::Result<(), String> {
        let file: IntentFile = serde_json::from_slice(bytes).map_err(|e| format!("not an upload intent: {e}"))?;
        let intent_id = path.filename().and_then(|f| f.strip_suffix(".json")).ok_or("not named <id>.json")?;
        if file.format != INTENT_FORMAT {
            return Err(format!("unsupported format {}", file.format));
        }
        let Some(key_id) = file.key_id else {
            for hex in file.chunks.unwrap_or_default() {
                match ChunkName::from_index_key(&hex) {
                    Some(n @ ChunkName::Plain(_)) => {
                        refs.names.insert(n);
                    }
                    _ => return Err(format!("{hex:?} is not a sha256")),
                }
            }
            return Ok(());
        };
        crypto::check_key_id(&key_id)?;
        let opened = match self.cfg.keyring.get(&key_id) {
            Some(k) if file.key_check.as_deref().is_none_or(|c| c == k.check_value()) => {
                crypto::open_intent(k, intent_id, file.nonce.as_deref().unwrap_or(""), file.ciphertext.as_deref().unwrap_or(""))
                    .and_then(|plain| serde_json::from_slice::<Vec<String>>(&plain).map_err(|e| format!("chunk list: {e}")))
            }
            _ => Err(format!("sealed under key {key_id:?}, which this node does not have")),
        };
        match opened {
            Ok(addresses) => {
                for a in addresses {
                    if !crate::chunk::is_digest(&a) {
                        return Err(format!("{a:?} is not a chunk address"));
                    }
                    refs.names.insert(ChunkName::Sealed { key_id: key_id.clone(), address: a });
                }
            }
            Err(why) => {
                debug!(intent = %path, why, "upload intent not readable here: its key's chunks are kept");
                refs.kept.insert(Namespace::Key(key_id));
            }
        }
        Ok(())
    }

    /// How long after an announcement's last-modified time a delete issued
    /// in its round can still reach the object store.
    fn announcement_live(&self) -> Duration {
        let request_timeout = self
            .cfg
            .remote_options
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("timeout"))
            .and_then(|(_, v)| humantime::parse_duration(v).ok())
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        SWEEP_DELETE_WINDOW + self.cfg.remote_retry_timeout + request_timeout + Duration::from_secs(5)
    }

    /// Delete chunk objects that no manifest and no upload in progress
    /// references and that are older than `grace` (module docs).
    pub(crate) async fn sweep_chunks(
        &self,
        grace: Duration,
        report: &mut GcReport,
        unreadable: &mut BTreeMap<SnapshotId, UnreadableManifest>,
    ) -> Result<()> {
        let _w = self.sweep.write().await;
        // Taken before the manifests are listed: a manifest this listing
        // misses was written after it, so its chunks (written or checked
        // after its intent) are younger than any cutoff from it.
        let cutoff = now_ms() as i64 - grace.as_millis() as i64;
        let mut refs = Refs::default();
        let mut seen: HashSet<SnapshotId> = HashSet::new();
        for id in self.remote.all_snapshots().await? {
            self.manifest_refs(&id, &mut refs, unreadable).await?;
            seen.insert(id);
        }
        let mut victims = Vec::new();
        let mut kept_unreadable = 0u64;
        for (name, size, modified) in self.remote.all_chunks().await? {
            if refs.names.contains(&name) {
                continue;
            }
            if modified > cutoff {
                report.chunks_kept_young += 1;
            } else if refs.keeps(&name) {
                kept_unreadable += 1;
            } else {
                victims.push((name, size));
            }
        }
        if victims.is_empty() {
            report.chunks_kept_unreadable += kept_unreadable;
            return Ok(());
        }
        let sweep_id = random_id();
        let mut previous: Option<OPath> = None;
        let mut round = 0u32;
        let outcome = loop {
            round += 1;
            let path = self.remote.sweep_path(&format!("{sweep_id}-{round}"));
            let left = victims.len();
            let res = self.sweep_round(&path, &mut seen, &mut refs, &mut victims, report, &mut kept_unreadable, unreadable).await;
            let stuck = res.is_ok() && !victims.is_empty() && victims.len() == left;
            // The previous round's deletes have all returned.
            if let Some(p) = previous.replace(path) {
                if let Err(e) = self.remote.delete_object("delete sweep announcement", &p).await {
                    warn!(announcement = %p, error = %e, "sweep announcement not deleted (uploads elsewhere wait for it to go stale)");
                }
            }
            match res {
                Err(e) => break Err(e),
                Ok(()) if victims.is_empty() => break Ok(()),
                Ok(()) if stuck => {
                    break Err(Error::SweepIncomplete(format!(
                        "a round confirmed its {left} victims too slowly to delete any within its {} s window; they are left for the next sweep",
                        SWEEP_DELETE_WINDOW.as_secs()
                    )))
                }
                Ok(()) => debug!(round, left = victims.len(), "sweep round done; announcing the next"),
            }
        };
        if let Some(p) = previous {
            if let Err(e) = self.remote.delete_object("delete sweep announcement", &p).await {
                warn!(announcement = %p, error = %e, "sweep announcement not deleted (uploads elsewhere wait for it to go stale)");
            }
        }
        report.chunks_kept_unreadable += kept_unreadable;
        outcome
    }

    /// The chunks named by chunk-list objects (`kind`: upload intents,
    /// checkout pins) count as referenced; one last written before
    /// `stale_before` is deleted instead, one that cannot be read keeps
    /// every chunk until it goes stale.
    async fn chunk_lists_refs(
        &self,
        kind: &ChunkListKind,
        objects: Vec<object_store::ObjectMeta>,
        stale_before: i64,
        refs: &mut Refs,
        report: &mut GcReport,
    ) -> Result<()> {
        for m in objects {
            if m.last_modified.timestamp_millis() < stale_before {
                info!(object = %m.location, "deleting a stale {} ({})", kind.what, kind.why_stale);
                if let Err(e) = self.remote.delete_object(kind.delete_op, &m.location).await {
                    report.errors.push(e.to_string());
                }
                continue;
            }
            let Some(bytes) = self.remote.get_object(kind.read_op, &m.location).await? else { continue };
            if let Err(why) = self.intent_refs(&m.location, &bytes, refs) {
                let msg = format!("{} {} cannot be read ({why}): the chunk sweep deletes nothing until it is gone (it goes stale {} s after it was last written)", kind.what, m.location, INTENT_TTL.as_secs());
                warn!("{msg}");
                report.errors.push(msg);
                refs.kept.insert(Namespace::All);
            }
        }
        Ok(())
    }

    /// One round: announce, confirm the victims against the intents and the
    /// manifests written since, delete for at most the window.
    #[allow(clippy::too_many_arguments)]
    async fn sweep_round(
        &self,
        announcement: &OPath,
        seen: &mut HashSet<SnapshotId>,
        refs: &mut Refs,
        victims: &mut Vec<(ChunkName, u64)>,
        report: &mut GcReport,
        kept_unreadable: &mut u64,
        unreadable: &mut BTreeMap<SnapshotId, UnreadableManifest>,
    ) -> Result<()> {
        let started = Instant::now();
        let live = self.announcement_live();
        let body = serde_json::to_vec(&Announcement {
            format: ANNOUNCEMENT_FORMAT,
            node: self.cfg.node_id.clone(),
            live_ms: live.as_millis() as u64,
        })
        .map_err(|e| Error::Internal(format!("encode sweep announcement: {e}")))?;
        self.remote.put_object("write sweep announcement", announcement, body).await?;
        let ann_ms = self
            .remote
            .head("check sweep announcement", announcement)
            .await?
            .ok_or_else(|| Error::Inconsistent {
                path: announcement.to_string(),
                detail: "the sweep announcement just written is not there".into(),
            })?
            .last_modified
            .timestamp_millis();

        // Uploads in progress.
        let stale_before = ann_ms - INTENT_TTL.as_millis() as i64;
        let intents = self.remote.list_objects(&self.remote.intents_root()).await?;
        self.chunk_lists_refs(&INTENTS, intents, stale_before, refs, report).await?;
        // Manifests written since the first listing, and checkout pins
        // (fetches in progress: the chunks they name).
        let (ids, pins) = self.remote.actor_objects().await?;
        for id in ids {
            if seen.insert(id.clone()) {
                self.manifest_refs(&id, refs, unreadable).await?;
            }
        }
        self.chunk_lists_refs(&PINS, pins, stale_before, refs, report).await?;
        // Sweeps that died: their announcements.
        let stale_ann = ann_ms - (STALE_ANNOUNCEMENT.as_millis() as i64).max(live.as_millis() as i64 * 2);
        for m in self.remote.list_objects(&self.remote.sweeps_root()).await? {
            if m.last_modified.timestamp_millis() < stale_ann {
                let _ = self.remote.delete_object("delete stale sweep announcement", &m.location).await;
            }
        }

        let before = victims.len();
        victims.retain(|(name, _)| {
            if refs.names.contains(name) {
                report.chunks_kept_in_use += 1;
                false
            } else if refs.keeps(name) {
                *kept_unreadable += 1;
                false
            } else {
                true
            }
        });
        if victims.len() < before {
            debug!(kept = before - victims.len(), "chunks referenced by uploads in progress or new manifests: kept");
        }
        let batch = self.cfg.upload_concurrency.max(1) * 4;
        while !victims.is_empty() && started.elapsed() < SWEEP_DELETE_WINDOW {
            let n = batch.min(victims.len());
            let these: Vec<(ChunkName, u64)> = victims.drain(..n).collect();
            // Forget them as durable before deleting them.
            let tx = Tx::begin(&self.db)?;
            let keys: Vec<String> = these.iter().map(|(n, _)| n.index_key()).collect();
            tx.remove_chunks(keys.iter().map(|k| k.as_str()))?;
            tx.commit()?;
            // A delete is issued only within the window (one that would start
            // later waits for the next round and its confirmation).
            let results: Vec<(ChunkName, u64, Option<Result<()>>)> =
                futures::stream::iter(these.into_iter().map(|(name, size)| async move {
                    if started.elapsed() >= SWEEP_DELETE_WINDOW {
                        return (name, size, None);
                    }
                    let r = self.remote.delete_chunk(&name).await;
                    (name, size, Some(r))
                }))
                .buffer_unordered(self.cfg.upload_concurrency)
                .collect()
                .await;
            for (name, size, r) in results {
                match r {
                    None => victims.push((name, size)),
                    Some(Ok(())) => {
                        report.chunks_deleted += 1;
                        report.chunk_bytes_deleted += size;
                    }
                    Some(Err(e)) => report.errors.push(format!("chunk {name}: {e}")),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
