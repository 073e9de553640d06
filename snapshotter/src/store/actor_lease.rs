//! Actor leases: one writer per actor across every node that shares the
//! object tier.
//!
//! The lease is an object next to the actor's manifests,
//! `<prefix>/actors/<actor>/lease.json` ([`LeaseDoc`]), written only with
//! conditional PUTs: created if absent, replaced only at the version that was
//! read. A node takes it when the actor's first container is created there
//! ([`Store::acquire`]) and renews it every `lease_ttl / 3` while the actor
//! lives on the node, running or suspended. Another node's create of the
//! actor is refused ([`Error::LeaseHeld`]) until the holder surrenders it
//! (the pod was removed: [`Store::surrender`] lets go once the actor's newest
//! snapshot is durable, so the next node restores that one) or the lease
//! expires (the holder died: no renewal for `lease_ttl`). Every takeover
//! bumps `epoch`; `durable_generation` is the newest generation uploaded by
//! any holder, and a node restoring the actor never picks an older one
//! ([`Store::check_lease_floor`]). An upload writes its manifest only while
//! the lease is this node's or absent ([`Store::fence`]): a node that lost
//! the lease cannot publish a generation behind its successor's back.
//!
//! **A bucket writer.** Anyone who can write the bucket can delete, edit,
//! plant or replay a lease object. With encryption keys configured every
//! lease object carries an HMAC-SHA256 under the writer's active key
//! ([`LeaseMac`]: key id, key check value, MAC over the object's path and
//! its canonical JSON), and a node takes only what authenticates under its
//! ring. A lease object is *proven free* (taken at once) only when it
//! authenticates and was released or expired, and the object tier's
//! last-modified time of it agrees with the time written inside it
//! ([`LeaseDoc::written_unix_ms`], within `lease_ttl / 6` and its one-second
//! resolution): a genuine object replayed later is not fresh. An expired one
//! is taken once `lease_ttl / 6` and one second past its expiry. Anything
//! else that does not name a live holder (no lease object while the actor
//! has durable snapshots; an object that does not parse, has a time past
//! year 9999, carries no MAC or a wrong one; a stale copy of a released or
//! expired one) is taken only after this node has watched it stay exactly
//! the same (same version and bytes), looking at least every
//! `lease_ttl / 8`, for one full `lease_ttl`: a node that held the actor
//! renews its lease every `lease_ttl / 3`, and its renewal finds any change
//! it did not write (a deleted, edited, planted or replayed object) and
//! loses the lease ([`Error::LeaseLost`]), so by then it stopped running the
//! actor (its shims' lease fence holds no promise past `2 × lease_ttl / 3`
//! from its last renewal). A lease object authenticated under a key this
//! node does not have is refused ([`Error::LeaseUnproven`]), not taken: it
//! is another node's, and this node could not tell its durable generation.
//! Without keys nothing authenticates: the absence and the freshness rules
//! still hold, but a bucket writer can forge a released lease.
//!
//! Within one node the node-local claim of the shims arbitrates (two shims of
//! one actor on one node are refused there); the lease names the node and,
//! for messages, the shim that took it.
//!
//! Why `impl Store` here: a lease's `durable_generation` is computed from
//! the records of the metadata database, a surrender queues the upload of
//! the actor's newest snapshot, and the upload's manifest write is fenced
//! by the lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb::Database;
use serde::{Deserialize, Serialize};
use tokio::sync::OwnedMutexGuard;
use tracing::{info, warn};

use super::config::millis;
use super::db::{self, LocalState, RemoteState, Tx};
use super::error::{Error, Result};
use super::id::{ActorName, SnapshotId};
use super::crypto::{self, Keyring};
use super::remote::{ConditionalWrites, Honoured, LeaseObject, ObjectVersion};
use super::{check_unix_ms, lock, now_ms, unix_ms_text, Store};

pub const LEASE_FORMAT: u32 = 1;

/// The lease object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseDoc {
    pub format: u32,
    pub actor: ActorName,
    /// The holder: a node id (`node_id` in the daemon's config) and the
    /// shim that asked for it.
    pub node: String,
    pub owner: String,
    /// Bumped whenever the lease changes hands.
    pub epoch: u64,
    pub acquired_unix_ms: u64,
    /// Renewed by the holder; past it, any node may take the lease over.
    pub expires_unix_ms: u64,
    /// The holder let go (its pod was removed; its newest snapshot is durable).
    pub released: bool,
    /// The holder is letting go: the actor's pod was removed there and its
    /// newest snapshot is being uploaded before the lease is released. An
    /// acquire on another node waits for that ([`LEAVING_WAIT`]) instead of
    /// refusing the actor's next pod. Absent (false) in the objects of
    /// nodes from before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
    /// The newest generation of the actor uploaded by any holder.
    pub durable_generation: u64,
    /// When this version of the object was written, by its writer's clock
    /// (0 in the objects of nodes from before it: never proven fresh).
    #[serde(default)]
    pub written_unix_ms: u64,
    /// The object's authentication (with keys configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<LeaseMac>,
}

/// HMAC-SHA256, under the `lease mac` subkey of key `key_id` (check value
/// `key_check`), of the object's path and its canonical JSON with `mac`
/// left out (`crypto::Key::lease_mac`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseMac {
    pub key_id: String,
    pub key_check: String,
    pub hmac: String,
}

/// Why a lease object read cannot be taken as it says.
#[derive(Debug)]
pub enum Unproven {
    /// Unreadable, out of range, not authenticated or failing it: possibly
    /// planted; taken over once it stayed the same for one TTL.
    Untrusted(String),
    /// Authenticated under a key this node does not have: refused.
    ForeignKey(String),
}

/// The bytes of a lease object: `doc` sealed under the ring's active key
/// (none: plain) at object path `path`.
pub fn seal_lease(ring: &Keyring, path: &str, doc: &mut LeaseDoc) -> Result<Vec<u8>> {
    doc.mac = None;
    if let Some(k) = ring.active() {
        let body = serde_json::to_vec(&*doc).map_err(|e| Error::Internal(format!("encode lease: {e}")))?;
        doc.mac = Some(LeaseMac { key_id: k.id().to_string(), key_check: k.check_value().to_string(), hmac: k.lease_mac(path, &body) });
    }
    serde_json::to_vec_pretty(&*doc).map_err(|e| Error::Internal(format!("encode lease: {e}")))
}

/// Parse and check the lease object of `actor` at `path`: its format, its
/// actor, its times (none past year 9999), and with keys in `ring` its MAC.
/// Never panics, whatever the bytes.
pub fn read_lease(ring: &Keyring, actor: &ActorName, path: &str, bytes: &[u8]) -> std::result::Result<LeaseDoc, Unproven> {
    let bad = |what: String| Unproven::Untrusted(format!("the lease object of actor {actor} ({path}) {what}"));
    let doc: LeaseDoc = serde_json::from_slice(bytes).map_err(|e| bad(format!("is unreadable: {e}")))?;
    if doc.format != LEASE_FORMAT || doc.actor != *actor {
        return Err(bad(format!("is of format {} for actor {}: not this store's", doc.format, doc.actor)));
    }
    for (field, ms) in [("acquired_unix_ms", doc.acquired_unix_ms), ("expires_unix_ms", doc.expires_unix_ms), ("written_unix_ms", doc.written_unix_ms)] {
        check_unix_ms(field, ms).map_err(|e| bad(format!("is out of range: {e}")))?;
    }
    if ring.is_empty() {
        return Ok(doc);
    }
    let Some(mac) = doc.mac.clone() else {
        return Err(bad("is not authenticated (no MAC; this store's nodes authenticate their leases under the store key)".into()));
    };
    let key = match ring.get(&mac.key_id) {
        Some(k) if k.check_value() == mac.key_check => k,
        Some(k) => {
            return Err(bad(format!(
                "names key {:?} with check value {}, and this node's key {:?} has {}: it does not authenticate",
                mac.key_id,
                mac.key_check,
                mac.key_id,
                k.check_value()
            )))
        }
        None if crypto::check_key_id(&mac.key_id).is_ok() && mac.key_check.len() == 16 && mac.key_check.bytes().all(|b| b.is_ascii_hexdigit()) => {
            return Err(Unproven::ForeignKey(format!(
                "the lease object of actor {actor} ({path}) is authenticated under key {:?} (check {}), which this node does not have (its keys: {}): another node's, refused",
                mac.key_id,
                mac.key_check,
                ring.describe()
            )))
        }
        None => return Err(bad(format!("names a malformed key ({:?}, check {:?})", mac.key_id, mac.key_check))),
    };
    let mut plain = doc.clone();
    plain.mac = None;
    let body = serde_json::to_vec(&plain).map_err(|e| bad(format!("cannot be re-encoded: {e}")))?;
    if !key.verify_lease_mac(path, &body, &mac.hmac) {
        return Err(bad(format!("fails authentication under key {:?} (edited or forged)", mac.key_id)));
    }
    Ok(doc)
}

/// A lease this node holds (kept in the metadata database).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Held {
    pub doc: LeaseDoc,
    pub e_tag: Option<String>,
    pub version: Option<String>,
    /// Let go once the actor's newest snapshot is durable.
    pub surrendering: bool,
    /// When the surrender began (unix ms): it waits at most
    /// `surrender_timeout` for that snapshot.
    #[serde(default)]
    pub surrender_since_ms: Option<u64>,
}

impl Held {
    fn version(&self) -> ObjectVersion {
        ObjectVersion { e_tag: self.e_tag.clone(), version: self.version.clone() }
    }
}

/// What [`Store::acquire`] granted.
#[derive(Clone, Debug)]
pub struct Grant {
    pub epoch: u64,
    pub durable_generation: u64,
    /// The previous holder, when the lease came from another node (expired
    /// or released).
    pub previous: Option<LeaseDoc>,
}

/// Writes `held` to the database (durably: one committed transaction).
fn record_held(db: &Database, held: &Held) -> Result<()> {
    let tx = Tx::begin(db)?;
    tx.put_actor_lease(&held.doc.actor, held)?;
    tx.commit()
}

/// The leases this node holds, in memory (the metadata database keeps them
/// across restarts), and one lock per actor. `Confirm` is answered from
/// here without waiting for the database, the object tier or another
/// lease operation; a slow operation on one actor's lease (an acquire
/// retrying against the object tier) delays no other actor's.
#[derive(Default)]
pub(crate) struct LeaseTable {
    held: Mutex<HashMap<ActorName, Held>>,
    locks: Mutex<HashMap<ActorName, Arc<tokio::sync::Mutex<()>>>>,
    /// Serializes lease writes on object tiers without conditional updates.
    fallback: tokio::sync::Mutex<()>,
    /// Lease objects not proven free that this node watches before it
    /// takes them: actor → (what the object was, first seen, last seen).
    watched: Mutex<HashMap<ActorName, (String, std::time::Instant, std::time::Instant)>>,
}

impl LeaseTable {
    /// The leases the database says this node holds.
    pub(crate) fn load(db: &Database) -> Result<LeaseTable> {
        let t = LeaseTable::default();
        *lock(&t.held) = db::actor_leases::<Held>(db)?.into_iter().map(|h| (h.doc.actor.clone(), h)).collect();
        Ok(t)
    }

    fn get(&self, actor: &ActorName) -> Option<Held> {
        lock(&self.held).get(actor).cloned()
    }

    fn all(&self) -> Vec<Held> {
        let mut v: Vec<Held> = lock(&self.held).values().cloned().collect();
        v.sort_by(|a, b| a.doc.actor.cmp(&b.doc.actor));
        v
    }

    /// The lock of one actor's lease operations on this node.
    fn lock(&self, actor: &ActorName) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(actor.clone()).or_default().clone()
    }

    /// How long this node has watched `actor`'s lease object be `state`
    /// without a gap longer than `max_gap` between two looks (a longer gap
    /// could hide a change: the watch starts again).
    fn watch(&self, actor: &ActorName, state: &str, max_gap: Duration) -> Duration {
        let now = std::time::Instant::now();
        let mut w = lock(&self.watched);
        let e = w.entry(actor.clone()).or_insert_with(|| (state.to_string(), now, now));
        if e.0 != state || now.duration_since(e.2) > max_gap {
            *e = (state.to_string(), now, now);
        }
        e.2 = now;
        now.duration_since(e.1)
    }

    fn unwatch(&self, actor: &ActorName) {
        lock(&self.watched).remove(actor);
    }

    /// Waits for every lease operation under way, the database records of
    /// renewals ([`Store::save_renewed`]) included.
    pub(crate) async fn settle(&self) {
        let all: Vec<_> = lock(&self.locks).values().cloned().collect();
        for one in all {
            drop(one.lock().await);
        }
    }
}

/// [`read_lease`] of a lease object as read from the object tier (one too
/// large to read is untrusted).
fn read_object(ring: &Keyring, actor: &ActorName, path: &str, o: &LeaseObject) -> std::result::Result<LeaseDoc, Unproven> {
    match &o.too_large {
        Some(why) => Err(Unproven::Untrusted(format!("the lease object of actor {actor} ({path}): {why}"))),
        None => read_lease(ring, actor, path, &o.bytes),
    }
}

/// What a lease object read is, to tell whether it changed: absent, or
/// its version and the digest of its bytes.
fn lease_state(o: Option<&LeaseObject>) -> String {
    match o {
        None => "absent".into(),
        Some(o) => format!("{:?}/{:?}/{}", o.version.e_tag, o.version.version, super::chunk::sha256_hex(&o.bytes)),
    }
}

/// Conditional writes that keep losing (another node churning the same
/// lease) give up after this many rounds.
const ROUNDS: usize = 8;

/// How long an acquire waits for another node that is [`LeaseDoc::leaving`]
/// the actor to release it (its upload of the actor's newest snapshot, then
/// its next lease pass) before it is refused as held. Well inside the
/// shim's deadline for the call, which is inside kubelet's for the start.
pub const LEAVING_WAIT: Duration = Duration::from_secs(60);

impl Store {
    fn node(&self) -> &str {
        &self.cfg.node_id
    }

    fn lease_ttl(&self) -> Duration {
        self.cfg.lease_ttl
    }

    fn save_held(&self, held: &Held) -> Result<()> {
        record_held(&self.db, held)?;
        lock(&self.leases.held).insert(held.doc.actor.clone(), held.clone());
        Ok(())
    }

    /// A renewal of a lease this node holds (a new expiry and version of
    /// the lease object, already written to the object tier, which is the
    /// lease's truth) takes effect in memory at once: `Confirm` answers
    /// from it, and whoever renewed goes on. The database's record follows
    /// on a blocking thread that holds the actor's lease lock (`one`) until
    /// it is written, so the next operation on this lease comes after it.
    /// Under heavy disk writes (a 1 GiB dump beside it) that commit waited
    /// up to 2 s for the disk, on the runtime that answers `Confirm`, and
    /// the shims' lease fence froze actors whose lease had in fact been
    /// renewed. A record that is not written (a crash, an error) names an
    /// older version of the lease object: the next renewal's conditional
    /// write fails, and the object, read back, shows this node and epoch
    /// still hold it.
    fn save_renewed(&self, held: Held, one: OwnedMutexGuard<()>) {
        lock(&self.leases.held).insert(held.doc.actor.clone(), held.clone());
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = record_held(&db, &held) {
                warn!(actor = %held.doc.actor, error = %e, "the renewed actor lease could not be recorded in the database (the next renewal finds it in the object tier)");
            }
            // The database first, then the lock: once the lock is free
            // (`Store::shutdown` waits for it), this task no longer holds
            // the database open.
            drop(db);
            drop(one);
        });
    }

    fn drop_held(&self, actor: &ActorName) -> Result<()> {
        let tx = Tx::begin(&self.db)?;
        tx.remove_actor_lease(actor)?;
        tx.commit()?;
        lock(&self.leases.held).remove(actor);
        Ok(())
    }

    fn held(&self, actor: &ActorName) -> Result<Option<Held>> {
        Ok(self.leases.get(actor))
    }

    /// Actor leases this node holds.
    pub fn actor_leases(&self) -> Result<Vec<Held>> {
        Ok(self.leases.all())
    }

    /// The lease validity a confirmation may promise: the expiry less a
    /// third of the TTL (other nodes judge expiry by their own clocks).
    fn valid_until(&self, h: &Held) -> u64 {
        h.doc.expires_unix_ms.saturating_sub(millis(self.lease_ttl()) / 3)
    }

    /// The newest generation of `actor` durable in the object tier that this
    /// node's database knows.
    fn durable_generation(&self, actor: &ActorName) -> Result<u64> {
        Ok(db::records(&self.db, Some(actor))?
            .iter()
            .filter(|r| r.remote == RemoteState::Durable && !r.removing)
            .map(|r| r.generation)
            .max()
            .unwrap_or(0))
    }

    /// Takes the actor's lease for this node (for shim `owner`): refused
    /// with [`Error::LeaseHeld`] while another node holds it unexpired. A
    /// lease object not proven free (module docs) is watched for one
    /// `lease_ttl` first, at most [`LEAVING_WAIT`] in one call (past that:
    /// [`Error::LeaseUnproven`], and a retry goes on watching).
    pub async fn acquire(&self, actor: &ActorName, owner: &str) -> Result<Grant> {
        let one = self.leases.lock(actor);
        let _one = one.lock().await;
        let path = self.remote.lease_path(actor).to_string();
        let started = std::time::Instant::now();
        let leaving_until = started + LEAVING_WAIT;
        let mut pause = Duration::from_millis(100);
        let mut rounds = 0;
        let mut told = String::new();
        while rounds < ROUNDS {
            let now = now_ms();
            let current = self.remote.get_lease(actor).await?;
            let state = lease_state(current.as_ref());
            let read = current.as_ref().map(|o| read_object(&self.cfg.keyring, actor, &path, o));
            // Why the object is not proven free, if it is not.
            let mut unproven: Option<String> = None;
            let mut previous: Option<LeaseDoc> = None;
            match read {
                None => {
                    if self.has_durable_snapshots(actor).await? {
                        unproven = Some(format!("{path} is missing while the actor has durable snapshots"));
                    }
                }
                Some(Err(Unproven::ForeignKey(why))) => {
                    return Err(Error::LeaseUnproven { actor: actor.clone(), why, retry: "never, unless this node gets that key".into() })
                }
                Some(Err(Unproven::Untrusted(why))) => {
                    if told != state {
                        self.untrusted(&format!("the lease object of actor {actor}"), &Error::InvalidArgument(why.clone()));
                    }
                    unproven = Some(why);
                }
                Some(Ok(p)) => {
                    let held_here = self.leases.get(actor).is_some_and(|h| h.doc == p);
                    let expired = p.expires_unix_ms <= now;
                    let free = p.released || expired || p.node == self.node();
                    if !free && p.leaving && std::time::Instant::now() < leaving_until {
                        // The actor's pod left that node a moment ago (a drain,
                        // a delete): its next pod here waits for the handover
                        // rather than failing its start.
                        if pause == Duration::from_millis(100) {
                            info!(actor = %actor, from = %p.node, "actor leaving node {}: waiting for its lease (its newest snapshot is being uploaded there)", p.node);
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                        continue;
                    }
                    if !free {
                        return Err(Error::LeaseHeld { actor: actor.clone(), node: p.node.clone(), owner: p.owner.clone(), until: unix_ms_text(p.expires_unix_ms) });
                    }
                    let lm = current.as_ref().map_or(0, |o| o.last_modified_ms);
                    if !held_here {
                        if p.node == self.node() && !p.released && !expired {
                            unproven = Some(format!("{path} names this node (epoch {}), which does not hold it: an old copy, or a write whose record was lost", p.epoch));
                        } else if !self.fresh(&p, lm) {
                            unproven = Some(format!(
                                "{path} ({}, written at {}) was last modified at {} by the object tier's clock: a copy written again later (replayed), not proven free",
                                if p.released { "released" } else { "expired" },
                                unix_ms_text(p.written_unix_ms),
                                unix_ms_text(u64::try_from(lm).unwrap_or(0))
                            ));
                        } else if !p.released && now < p.expires_unix_ms.saturating_add(self.fresh_slack_ms() + 1000) {
                            unproven = Some(format!("{path} expired at {}: taken {} ms after that", unix_ms_text(p.expires_unix_ms), self.fresh_slack_ms() + 1000));
                        }
                    }
                    previous = Some(p);
                }
            }
            if let Some(why) = &unproven {
                let ttl = self.lease_ttl();
                let watched = self.leases.watch(actor, &state, ttl / 6);
                if watched < ttl {
                    if told != state {
                        info!(actor = %actor, why = %why, "actor lease not proven free: watching it for one lease_ttl before taking it (a node that may still run the actor loses it at its next renewal)");
                        told = state.clone();
                    }
                    if std::time::Instant::now() >= leaving_until {
                        return Err(Error::LeaseUnproven {
                            actor: actor.clone(),
                            why: why.clone(),
                            retry: format!("in {} ms (one lease_ttl after this node first saw it so)", (ttl - watched).as_millis()),
                        });
                    }
                    tokio::time::sleep((ttl - watched).min(ttl / 8).min(Duration::from_secs(1))).await;
                    continue;
                }
                warn!(actor = %actor, why = %why, "actor lease taken after watching it unchanged for one lease_ttl");
            }
            let expect = current.as_ref().map(|o| o.version.clone());
            let authenticated = !self.cfg.keyring.is_empty();
            let ours = previous.as_ref().is_some_and(|p| p.node == self.node() && !p.released) && unproven.is_none();
            let epoch = match &previous {
                None => 1,
                Some(p) if ours => p.epoch,
                Some(p) => p.epoch.checked_add(1).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "the lease object of actor {actor} ({path}) has epoch {}, the largest there is: it cannot change hands again (delete it to let a node take the actor)",
                        p.epoch
                    ))
                })?,
            };
            let named = previous.as_ref().map_or(0, |p| p.durable_generation);
            let durable_generation = self.trusted_durable_generation(actor, named, authenticated).await?;
            let mut doc = LeaseDoc {
                format: LEASE_FORMAT,
                actor: actor.clone(),
                node: self.node().to_string(),
                owner: owner.to_string(),
                epoch,
                acquired_unix_ms: if ours { previous.as_ref().map_or(now, |p| p.acquired_unix_ms) } else { now },
                expires_unix_ms: now.saturating_add(millis(self.lease_ttl())),
                released: false,
                leaving: false,
                durable_generation: durable_generation.max(self.durable_generation(actor)?),
                written_unix_ms: now,
                mac: None,
            };
            let bytes = seal_lease(&self.cfg.keyring, &path, &mut doc)?;
            match self.remote.put_lease(actor, bytes, expect, &self.leases.fallback).await? {
                Err(_) => {
                    rounds += 1;
                    continue;
                }
                Ok(v) => {
                    self.leases.unwatch(actor);
                    let held = Held { doc: doc.clone(), e_tag: v.e_tag, version: v.version, surrendering: false, surrender_since_ms: None };
                    {
                        let tx = Tx::begin(&self.db)?;
                        tx.put_actor_lease(actor, &held)?;
                        tx.see_generation(actor, doc.durable_generation)?;
                        tx.commit()?;
                    }
                    lock(&self.leases.held).insert(actor.clone(), held);
                    let previous = previous.filter(|p| p.node != self.node());
                    match &previous {
                        Some(p) if !p.released => warn!(actor = %actor, from = %p.node, epoch = doc.epoch, expired = %unix_ms_text(p.expires_unix_ms), "actor lease taken over: its holder stopped renewing it"),
                        _ => info!(actor = %actor, epoch = doc.epoch, owner, "actor lease acquired"),
                    }
                    return Ok(Grant { epoch: doc.epoch, durable_generation: doc.durable_generation, previous });
                }
            }
        }
        Err(Error::LeaseLost { actor: actor.clone(), detail: format!("the lease object {path} kept changing under {ROUNDS} conditional writes") })
    }

    /// A lease object found in place of the version this node holds
    /// (`held`; it tried to write `tried`) that is this node's own write:
    /// `tried` itself (the answer lost), or a later renewal of this node's
    /// whose record did not reach the database (a crash; possibly by this
    /// node's daemon with other keys, whose MAC this ring cannot check):
    /// it names this node at the epoch held, unreleased, unexpired, written
    /// no earlier than the version held. A copy of an older version
    /// (replayed) or another node's object is not. Taking such an object
    /// for this node's can only keep this node running the actor: no
    /// other node takes a lease object naming a live holder.
    fn own_write(&self, held: &Held, tried: &LeaseDoc, o: &LeaseObject, read: &std::result::Result<LeaseDoc, Unproven>) -> Option<LeaseDoc> {
        let d = match read {
            Ok(d) if d == tried => return Some(d.clone()),
            Ok(d) => d.clone(),
            Err(Unproven::ForeignKey(_)) => serde_json::from_slice::<LeaseDoc>(&o.bytes).ok()?,
            Err(Unproven::Untrusted(_)) => return None,
        };
        let ours = d.node == self.node()
            && d.actor == held.doc.actor
            && d.epoch == held.doc.epoch
            && !d.released
            && d.expires_unix_ms > now_ms()
            && d.expires_unix_ms <= super::MAX_UNIX_MS
            && d.written_unix_ms >= held.doc.written_unix_ms;
        ours.then_some(d)
    }

    /// How far the object tier's last-modified time of a lease object may
    /// be past the time written in it for the object to be fresh.
    fn fresh_slack_ms(&self) -> u64 {
        millis(self.lease_ttl()) / 6
    }

    /// Was lease object `doc` written when the object tier says it was last
    /// modified (`last_modified_ms`, one-second resolution on S3): not a
    /// copy of an older version written again.
    fn fresh(&self, doc: &LeaseDoc, last_modified_ms: i64) -> bool {
        let Ok(lm) = u64::try_from(last_modified_ms) else { return false };
        doc.written_unix_ms > 0 && lm <= doc.written_unix_ms.saturating_add(self.fresh_slack_ms())
    }

    /// Does the actor have a snapshot durable in the object tier (its
    /// listing, or this node's records)?
    async fn has_durable_snapshots(&self, actor: &ActorName) -> Result<bool> {
        Ok(self.durable_generation(actor)? > 0 || !self.remote.generations(actor).await?.is_empty())
    }

    /// The actor leaves this node (its pod was removed, or its shim died):
    /// the lease is let go once its newest snapshot is durable (uploaded
    /// first if needed), renewed until then. Unknown actor: nothing to do.
    pub async fn surrender(&self, actor: &ActorName, owner: &str) -> Result<()> {
        {
            let one = self.leases.lock(actor);
            let _one = one.lock().await;
            let Some(mut held) = self.held(actor)? else { return Ok(()) };
            if !owner.is_empty() && held.doc.owner != owner {
                // Another shim of this node has taken the actor since.
                return Ok(());
            }
            if !held.surrendering {
                held.surrendering = true;
                held.surrender_since_ms = Some(now_ms());
            }
            self.save_held(&held)?;
        }
        self.lease_pass_one(actor).await
    }

    /// Renews every held lease and completes surrenders, and the checkout
    /// pins that are due; run every `lease_ttl / 3` by the daemon. Errors are logged and kept in status.
    pub async fn lease_pass(&self) {
        let held = match self.actor_leases() {
            Ok(h) => h,
            Err(e) => {
                warn!(error = %e, "list actor leases");
                return;
            }
        };
        // Each actor apart: one whose renewal is slow delays no other's.
        use futures::StreamExt;
        futures::stream::iter(held)
            .for_each_concurrent(16, |h| async move {
                if let Err(e) = self.lease_pass_one(&h.doc.actor).await {
                    self.stats.update(|s| s.lease_renew_failures += 1);
                    warn!(actor = %h.doc.actor, error = %e, "actor lease renewal failed");
                    self.note_error(format!("actor lease of {}: {e}", h.doc.actor));
                }
            })
            .await;
        self.renew_pins().await;
    }

    async fn lease_pass_one(&self, actor: &ActorName) -> Result<()> {
        let one = self.leases.lock(actor).lock_owned().await;
        let Some(held) = self.held(actor)? else { return Ok(()) };
        let durable = self.durable_generation(actor)?.max(held.doc.durable_generation);
        let mut doc = held.doc.clone();
        doc.durable_generation = durable;
        let now = now_ms();
        let mut release = false;
        if held.surrendering {
            let newest = db::records(&self.db, Some(actor))?.into_iter().filter(|r| !r.removing).max_by_key(|r| r.generation);
            let waited = now.saturating_sub(held.surrender_since_ms.unwrap_or(now));
            match newest {
                Some(r) if r.remote != RemoteState::Durable && (r.local == LocalState::Absent || waited >= millis(self.cfg.surrender_timeout)) => {
                    // Bounded: the actor must be able to move on (from its
                    // newest durable snapshot) rather than never.
                    let why = if r.local == LocalState::Absent {
                        "it has no local copy left to upload".to_string()
                    } else {
                        format!("it is still not durable after {} s (surrender_timeout; last error: {})", waited / 1000, r.last_error.as_deref().unwrap_or("none"))
                    };
                    let msg = format!(
                        "surrender of actor {actor}: its newest snapshot {} {why}; the lease is let go anyway: the next node restores generation {durable} (the newest durable), and {} stays on this node's local tier",
                        r.id(),
                        r.id()
                    );
                    warn!(actor = %actor, snapshot = %r.id(), durable_generation = durable, "{msg}");
                    self.note_error(msg);
                    release = true;
                }
                Some(r) if r.remote != RemoteState::Durable => {
                    if !r.upload_now {
                        let tx = Tx::begin(&self.db)?;
                        if let Some(mut rec) = tx.get(&r.id())? {
                            rec.upload_now = true;
                            tx.put(&rec)?;
                        }
                        tx.commit()?;
                        self.wake.notify_one();
                        info!(actor = %actor, snapshot = %r.id(), "actor leaving this node: uploading its newest snapshot before letting go of its lease");
                    }
                }
                _ => release = true,
            }
        }
        doc.released = release;
        doc.leaving = held.surrendering && !release;
        doc.expires_unix_ms = if release { now } else { now.saturating_add(millis(self.lease_ttl())) };
        doc.written_unix_ms = now;
        let path = self.remote.lease_path(actor).to_string();
        let bytes = seal_lease(&self.cfg.keyring, &path, &mut doc)?;
        match self.remote.put_lease(actor, bytes, Some(held.version()), &self.leases.fallback).await? {
            Ok(v) => {
                let took = now_ms().saturating_sub(now);
                if took > millis(self.lease_ttl()) / 6 {
                    warn!(
                        actor = %actor,
                        ms = took,
                        "actor lease renewal was slow: the object tier took more than a sixth of lease_ttl to write the lease (once a renewal takes a third, the shims' lease fence freezes the actor until it is confirmed again)"
                    );
                }
                if release {
                    self.drop_held(actor)?;
                    info!(actor = %actor, durable_generation = durable, "actor lease released");
                } else {
                    self.save_renewed(Held { doc, e_tag: v.e_tag, version: v.version, ..held }, one);
                }
                Ok(())
            }
            Err(_) => {
                // Changed behind our back: our own write whose answer was
                // lost (the object is exactly what we wrote), or anything
                // else: another node took over after it expired, or a
                // bucket writer deleted, edited, planted or replayed it.
                // Either way the lease is lost here: another node may take
                // it once it watched the object unchanged for a TTL.
                match self.remote.get_lease(actor).await? {
                    Some(o) => {
                        let now_doc = read_object(&self.cfg.keyring, actor, &path, &o);
                        if let Some(own) = self.own_write(&held, &doc, &o, &now_doc) {
                            let v = o.version;
                            if release && own == doc {
                                self.drop_held(actor)?;
                                return Ok(());
                            }
                            self.save_renewed(Held { doc: own, e_tag: v.e_tag, version: v.version, ..held }, one);
                            return Ok(());
                        }
                        self.drop_held(actor)?;
                        let detail = match now_doc {
                            Ok(d) => format!("node {} holds it at epoch {} (this node held epoch {}): changed behind this node's back", d.node, d.epoch, held.doc.epoch),
                            Err(Unproven::Untrusted(why) | Unproven::ForeignKey(why)) => format!("{why}: changed behind this node's back"),
                        };
                        warn!(actor = %actor, detail, "actor lease LOST: this node's copy of the actor must not run on");
                        Err(Error::LeaseLost { actor: actor.clone(), detail })
                    }
                    None => {
                        self.drop_held(actor)?;
                        Err(Error::LeaseLost { actor: actor.clone(), detail: format!("{path} was deleted") })
                    }
                }
            }
        }
    }

    /// The actor may go on running on this node (a resume, a thaw, the
    /// shim's periodic check): this node holds its lease for shim `owner`
    /// and the validity it may promise ([`Store::valid_until`]) has more
    /// than `lease_ttl / 6` left — else it is renewed now, while there is
    /// still time for the renewal before that validity runs out (the shim
    /// does not wait for an answer past it). Returns the epoch and the time
    /// until which that holds (the expiry less the margin: other nodes judge
    /// expiry by their clocks).
    pub async fn confirm(&self, actor: &ActorName, owner: &str) -> Result<(u64, u64)> {
        if let Some(answer) = self.confirm_now(actor, owner) {
            return answer;
        }
        if self.held(actor)?.is_none() {
            return Err(self.not_held(actor).await);
        }
        if let Some(answer) = self.confirm_while_renewing(actor) {
            return answer;
        }
        self.lease_pass_one(actor).await?;
        match self.held(actor)? {
            Some(h) if self.valid_until(&h) > now_ms() => Ok((h.doc.epoch, self.valid_until(&h))),
            Some(h) => Err(Error::LeaseLost {
                actor: actor.clone(),
                detail: format!("renewed, but valid only until {}", unix_ms_text(h.doc.expires_unix_ms)),
            }),
            None => Err(self.not_held(actor).await),
        }
    }

    /// [`Store::confirm`]'s answer when it needs nothing but memory (no
    /// database, no object tier, no lock another lease operation holds):
    /// the lease is valid for long enough, or it is being surrendered or
    /// another shim's. `None`: it must be renewed (or looked up) first.
    pub fn confirm_now(&self, actor: &ActorName, owner: &str) -> Option<Result<(u64, u64)>> {
        let h = self.leases.get(actor)?;
        if h.surrendering {
            return Some(Err(Error::LeaseLost { actor: actor.clone(), detail: "it is being surrendered (its pod was removed from this node)".into() }));
        }
        if !owner.is_empty() && h.doc.owner != owner {
            return Some(Err(Error::LeaseLost { actor: actor.clone(), detail: format!("shim {} of this node holds it now", h.doc.owner) }));
        }
        let valid = self.valid_until(&h);
        answers_from_memory(valid, now_ms(), millis(self.lease_ttl())).then_some(Ok((h.doc.epoch, valid)))
    }

    /// While another lease operation on `actor` runs (the lease worker's
    /// renewal, most often), a confirmation that would renew is answered
    /// with the validity held now, as long as some is left, rather than
    /// waiting behind that operation: the shim asks again before it runs
    /// out, and by then the renewal is in memory.
    fn confirm_while_renewing(&self, actor: &ActorName) -> Option<Result<(u64, u64)>> {
        let one = self.leases.lock(actor);
        let busy = one.try_lock().is_err();
        let h = self.leases.get(actor)?;
        let valid = self.valid_until(&h);
        (busy && valid > now_ms()).then_some(Ok((h.doc.epoch, valid)))
    }

    /// The `durable_generation` a lease object names, if it can be trusted:
    /// with keys configured (the object tier authenticated), only when this
    /// node knows that generation of the actor or its manifest in the object
    /// tier opens under the ring; otherwise (anyone who can write the bucket
    /// could have planted it, e.g. near u64::MAX to block every commit) it
    /// is ignored, reported and counted. Without keys nothing in the object
    /// tier can be authenticated and it is taken as it is. A lease object
    /// that authenticated (`authenticated`: keys configured and its MAC
    /// checked) is taken as it is.
    async fn trusted_durable_generation(&self, actor: &ActorName, named: u64, authenticated: bool) -> Result<u64> {
        // An authenticated lease object was written by a node with the
        // store key: its generation may be sealed under a key missing here
        // (then the restore is refused rather than going to the past).
        if named == 0 || authenticated || self.cfg.keyring.is_empty() || named <= self.durable_generation(actor)? {
            return Ok(named);
        }
        let id = SnapshotId::new(actor.clone(), named);
        match self.record_or_import(&id).await {
            Ok(_) => Ok(named),
            Err(e) if self.ignores_untrusted(&e) => {
                self.untrusted(&format!("the lease object of actor {actor} names durable generation {named}"), &e);
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Why this node does not hold `actor`'s lease, for an error.
    async fn not_held(&self, actor: &ActorName) -> Error {
        let path = self.remote.lease_path(actor).to_string();
        let detail = match self.remote.get_lease(actor).await {
            Ok(Some(o)) => match read_object(&self.cfg.keyring, actor, &path, &o) {
                Ok(d) if d.node != self.node() && !d.released => {
                    format!("node {} holds it (epoch {}, shim {}) until {}", d.node, d.epoch, d.owner, unix_ms_text(d.expires_unix_ms))
                }
                Ok(d) => format!("this node does not hold it (the lease object says node {}, epoch {}, released: {})", d.node, d.epoch, d.released),
                Err(Unproven::Untrusted(e) | Unproven::ForeignKey(e)) => format!("this node does not hold it ({e})"),
            },
            Ok(None) => "this node does not hold it (no lease object)".into(),
            Err(e) => format!("this node does not hold it (the lease object cannot be read: {e})"),
        };
        Error::LeaseLost { actor: actor.clone(), detail }
    }

    /// Right before an upload publishes a manifest of `actor` (the commit
    /// point). A lease this node holds is renewed at the version held (a
    /// conditional write: it fails if anyone changed the lease since) or
    /// found unchanged in epoch and node, unexpired; the answer is the time
    /// until which the lease then stays this node's, and the manifest write
    /// must end by then ([`tokio::time::timeout_at`] in the upload): a
    /// holder that stalls past it cannot publish after a takeover. Not held
    /// here: refused when the lease object names another node, or this one
    /// expired and not released (it may change hands at any moment). No
    /// lease object at all (a store used without leases): `Ok(None)`.
    pub(crate) async fn fence(&self, actor: &ActorName) -> Result<Option<tokio::time::Instant>> {
        let path = self.remote.lease_path(actor).to_string();
        let lost = |detail: String| Error::LeaseLost { actor: actor.clone(), detail };
        let deadline = |valid: u64| Some(tokio::time::Instant::now() + Duration::from_millis(valid.saturating_sub(now_ms())));
        let one = self.leases.lock(actor).lock_owned().await;
        let Some(held) = self.held(actor)? else {
            return match self.remote.get_lease(actor).await? {
                None => Ok(None),
                Some(o) => {
                    let doc = read_object(&self.cfg.keyring, actor, &path, &o)
                        .map_err(|(Unproven::Untrusted(why) | Unproven::ForeignKey(why))| lost(format!("{why}: this node's snapshots of it are not published")))?;
                    if doc.node != self.node() {
                        Err(lost(format!("the lease is node {}'s (epoch {}): this node's snapshots of it are not published", doc.node, doc.epoch)))
                    } else if !doc.released && doc.expires_unix_ms <= now_ms() {
                        Err(lost(format!("this node's lease (epoch {}) expired and is not held here any more: another node may take it at any moment", doc.epoch)))
                    } else {
                        Ok(None)
                    }
                }
            };
        };
        let now = now_ms();
        let mut doc = held.doc.clone();
        doc.expires_unix_ms = now.saturating_add(millis(self.lease_ttl()));
        doc.written_unix_ms = now;
        let bytes = seal_lease(&self.cfg.keyring, &path, &mut doc)?;
        match self.remote.put_lease(actor, bytes, Some(held.version()), &self.leases.fallback).await? {
            Ok(v) => {
                let renewed = Held { doc, e_tag: v.e_tag, version: v.version, ..held };
                let valid = self.valid_until(&renewed);
                self.save_renewed(renewed, one);
                Ok(deadline(valid))
            }
            Err(_) => match self.remote.get_lease(actor).await? {
                Some(o) => {
                    let now_doc = read_object(&self.cfg.keyring, actor, &path, &o);
                    if let Some(own) = self.own_write(&held, &doc, &o, &now_doc) {
                        let renewed = Held { doc: own, e_tag: o.version.e_tag.clone(), version: o.version.version.clone(), ..held };
                        let valid = self.valid_until(&renewed);
                        self.save_renewed(renewed, one);
                        return Ok(deadline(valid));
                    }
                    self.drop_held(actor)?;
                    let detail = match now_doc {
                        Ok(d) => format!("node {} holds it at epoch {} (this node held epoch {}): this node's snapshots of it are not published", d.node, d.epoch, held.doc.epoch),
                        Err(Unproven::Untrusted(why) | Unproven::ForeignKey(why)) => format!("{why}: changed behind this node's back; this node's snapshots of it are not published"),
                    };
                    warn!(actor = %actor, detail, "actor lease LOST: this node's copy of the actor must not run on");
                    Err(lost(detail))
                }
                None => {
                    self.drop_held(actor)?;
                    Err(lost(format!("{path} was deleted")))
                }
            },
        }
    }

    /// Check that the object tier honours conditional writes (the daemon
    /// runs it at start): creates only if absent (the manifests' commit
    /// point) and updates only at the version read (actor leases). What is
    /// missing is a loud warning naming what it breaks, and kept in the
    /// status's recent errors; an object tier that cannot be reached is
    /// the error.
    pub async fn check_conditional_writes(&self) -> Result<ConditionalWrites> {
        let c = self.remote.probe_conditional_writes().await?;
        let url = &self.remote.url;
        if c.create != Honoured::Yes {
            let msg = format!(
                "object tier {url} does not honour create-if-absent (If-None-Match: {:?}): two nodes can both publish one generation of an actor, and a stale holder's manifest is not refused; do not share it between nodes",
                c.create
            );
            warn!(remote = %url, "{msg}");
            self.note_error(msg);
        }
        match c.update {
            Honoured::Yes => {}
            Honoured::NotImplemented => warn!(
                remote = %url,
                "object tier has no conditional updates (If-Match): actor leases fall back to a lock of this daemon, which guards this node only; do not share this object tier between nodes"
            ),
            Honoured::Ignored => {
                let msg = format!("object tier {url} ignores If-Match on updates: actor leases do not keep two nodes from running one actor; do not share it between nodes");
                warn!(remote = %url, "{msg}");
                self.note_error(msg);
            }
        }
        if c.create == Honoured::Yes && c.update == Honoured::Yes {
            info!(remote = %url, "object tier honours conditional writes (manifests' commit point, actor leases)");
        }
        Ok(c)
    }

    /// The lower bound on the generation a restore of `actor` may use: the
    /// newest generation its lease says was made durable. A newest snapshot
    /// older than that is an error (never restore an actor into its past).
    pub(crate) fn check_lease_floor(&self, actor: &ActorName, newest: Option<u64>) -> Result<()> {
        let floor = match self.held(actor)? {
            Some(h) => h.doc.durable_generation,
            None => return Ok(()),
        };
        match newest {
            Some(g) if g >= floor => Ok(()),
            _ if floor == 0 => Ok(()),
            found => Err(Error::InvalidArgument(format!(
                "actor {actor}: its lease records generation {floor} as durable, but the newest snapshot found is {}: refusing to restore an older state (is the object tier listing stale?)",
                found.map_or("none".to_string(), |g| format!("generation {g}"))
            ))),
        }
    }

    /// Status lines of the leases this node holds.
    pub fn lease_summary(&self) -> Vec<String> {
        match self.actor_leases() {
            Ok(v) => v
                .iter()
                .map(|h| {
                    format!(
                        "{} epoch {} shim {} until {}{}",
                        h.doc.actor,
                        h.doc.epoch,
                        h.doc.owner,
                        unix_ms_text(h.doc.expires_unix_ms),
                        if h.surrendering { " (surrendering: uploading its newest snapshot)" } else { "" }
                    )
                })
                .collect(),
            Err(e) => vec![format!("actor leases unreadable: {e}")],
        }
    }
}

/// A confirmation is answered from memory while the validity it promises
/// (`valid_until`, unix ms) has more than a sixth of the TTL to run; past
/// that the lease is renewed first, with that sixth left for the renewal
/// before the shim stops waiting for the answer.
fn answers_from_memory(valid_until: u64, now: u64, ttl_ms: u64) -> bool {
    valid_until > now.saturating_add(ttl_ms / 6)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::{lock, now_ms, Remote, Store, StoreConfig};
    use super::answers_from_memory;
    use crate::store::id::ActorName;

    async fn store_holding(actor: &ActorName, dir: &std::path::Path) -> Arc<Store> {
        let mut cfg = StoreConfig::new(dir.join("store"));
        cfg.background = false;
        // Long enough that a stalled test machine does not let a lease
        // lapse between two steps of a test.
        cfg.lease_ttl = Duration::from_secs(60);
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
        let s = Store::open_with_remote(cfg, remote).await.unwrap();
        s.acquire(actor, "shim-1").await.unwrap();
        s
    }

    /// A bench run's fence freeze: the lease worker's renewal was under
    /// way (its object tier and database slow under a 1 GiB dump) when the
    /// shim asked with less than a sixth of the TTL left; the confirmation
    /// waited behind the renewal past the validity it had, and the shim
    /// froze the actor. It is answered with the validity held now.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_confirmation_during_a_renewal_answers_with_the_validity_held() {
        let tmp = tempfile::tempdir().unwrap();
        let actor = ActorName::new("ns/busy").unwrap();
        let s = store_holding(&actor, tmp.path()).await;
        // Renewed 31 s ago (TTL 60 s): valid for 9 s more, less than the
        // sixth of the TTL that is answered from memory without renewing.
        let expires = now_ms() + 29_000;
        lock(&s.leases.held).get_mut(&actor).unwrap().doc.expires_unix_ms = expires;
        assert!(s.confirm_now(&actor, "shim-1").is_none());
        let renewing = s.leases.lock(&actor).lock_owned().await;
        let (_, until) = tokio::time::timeout(Duration::from_secs(5), s.confirm(&actor, "shim-1"))
            .await
            .expect("the confirmation waited for the renewal under way")
            .unwrap();
        assert_eq!(until, expires - 20_000, "the validity held: the expiry less a third of the TTL");
        // Validity run out: it waits for the renewal, then renews.
        lock(&s.leases.held).get_mut(&actor).unwrap().doc.expires_unix_ms = now_ms() + 1_000;
        let asked = tokio::spawn({
            let (s, actor) = (s.clone(), actor.clone());
            async move { s.confirm(&actor, "shim-1").await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!asked.is_finished(), "a lapsed validity was promised");
        let renewed_after = now_ms();
        drop(renewing);
        let (_, until) = asked.await.unwrap().unwrap();
        assert!(until >= renewed_after + 40_000, "renewed: two thirds of the TTL from the renewal");
        s.shutdown().await;
    }

    /// A renewal is in memory when the renewal returns; its database record
    /// follows, and the store's shutdown waits for it (a store reopened on
    /// the same database finds the renewed version).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_is_recorded_before_the_store_shuts_down() {
        let tmp = tempfile::tempdir().unwrap();
        let actor = ActorName::new("ns/renewed").unwrap();
        let s = store_holding(&actor, tmp.path()).await;
        let before = s.leases.get(&actor).unwrap();
        s.lease_pass().await;
        let after = s.leases.get(&actor).unwrap();
        assert_ne!(after.e_tag, before.e_tag, "renewed in memory");
        s.shutdown().await;
        drop(s);
        let db = super::super::db::open(&tmp.path().join("store").join("store.redb")).unwrap();
        let recorded = super::super::db::actor_leases::<super::Held>(&db).unwrap();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].e_tag, after.e_tag, "the renewal's record");
    }

    /// Issue 38 rows 5 and 7: what `read_lease` refuses, and how: times
    /// past year 9999 (a panic formatting them before), no MAC, a wrong
    /// MAC, another key's MAC; and a sealed lease reads back the same.
    #[test]
    fn lease_objects_are_range_checked_and_authenticated() {
        use super::{read_lease, seal_lease, LeaseDoc, Unproven, LEASE_FORMAT};
        use crate::store::crypto::{Key, Keyring};
        let actor = ActorName::new("ns/a").unwrap();
        let path = "p/actors/ns/a/lease.json";
        let ring = |id: &str, b: u8| Keyring::new(vec![Key::new(id, &[b; 32]).unwrap()], None, false).unwrap();
        let mut doc = LeaseDoc {
            format: LEASE_FORMAT,
            actor: actor.clone(),
            node: "n".into(),
            owner: "o".into(),
            epoch: 1,
            acquired_unix_ms: 1,
            expires_unix_ms: 2,
            released: false,
            leaving: false,
            durable_generation: 0,
            written_unix_ms: 1,
            mac: None,
        };
        let k1 = ring("k1", 1);
        let sealed = seal_lease(&k1, path, &mut doc).unwrap();
        assert_eq!(read_lease(&k1, &actor, path, &sealed).unwrap(), doc);
        assert_eq!(read_lease(&Keyring::default(), &actor, path, &sealed).unwrap(), doc, "without keys the MAC is not checked");
        let untrusted = |r: Result<LeaseDoc, Unproven>, want: &str| match r {
            Err(Unproven::Untrusted(m)) => assert!(m.contains(want) && m.contains("lease.json"), "{want}: {m}"),
            other => panic!("{want}: {other:?}"),
        };
        // Bound to its path: the same object at another actor's path.
        untrusted(read_lease(&k1, &actor, "p/actors/ns/b/lease.json", &sealed), "fails authentication");
        let text = String::from_utf8(sealed.clone()).unwrap();
        untrusted(read_lease(&k1, &actor, path, text.replace("\"epoch\": 1", "\"epoch\": 2").as_bytes()), "fails authentication");
        untrusted(read_lease(&k1, &actor, path, &seal_lease(&Keyring::default(), path, &mut doc.clone()).unwrap()), "not authenticated");
        untrusted(read_lease(&ring("k1", 2), &actor, path, &sealed), "does not authenticate");
        match read_lease(&ring("k2", 2), &actor, path, &sealed) {
            Err(Unproven::ForeignKey(m)) => assert!(m.contains("\"k1\"") && m.contains("does not have"), "{m}"),
            other => panic!("{other:?}"),
        }
        for far in [crate::store::MAX_UNIX_MS + 1, u64::MAX] {
            let mut d = doc.clone();
            d.expires_unix_ms = far;
            let bytes = seal_lease(&k1, path, &mut d).unwrap();
            untrusted(read_lease(&k1, &actor, path, &bytes), "past the end of year 9999");
            assert!(crate::store::unix_ms_text(far).contains("past year 9999"), "formatted without a panic");
        }
        untrusted(read_lease(&k1, &actor, path, b"{"), "unreadable");
    }

    /// A renewal whose record did not reach the database (the daemon was
    /// killed right after it; the rig's store suite restarts daemons so)
    /// holds an older version: the next renewal's conditional write fails,
    /// and the object found, this node's later write, is taken as held (not
    /// the lease lost). A copy of an older version of it is not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_whose_record_was_lost_is_still_this_nodes() {
        let tmp = tempfile::tempdir().unwrap();
        let actor = ActorName::new("ns/crashed").unwrap();
        let s = store_holding(&actor, tmp.path()).await;
        let before = s.leases.get(&actor).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        s.lease_pass().await;
        // The record of that renewal lost: memory (and the database) name
        // the version before it.
        lock(&s.leases.held).insert(actor.clone(), before.clone());
        s.lease_pass().await;
        let h = s.leases.get(&actor).expect("still held: the object was this node's own later write");
        assert_eq!(h.doc.epoch, before.doc.epoch);
        assert!(s.confirm(&actor, "shim-1").await.is_ok());
        // The version held is newer than a replayed copy of an older one.
        let older = before.clone();
        let replay = super::seal_lease(&s.cfg.keyring, s.remote.lease_path(&actor).as_ref(), &mut older.doc.clone()).unwrap();
        object_store::ObjectStoreExt::put(&s.remote.store, &s.remote.lease_path(&actor), replay.into()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        s.lease_pass().await;
        assert!(s.leases.get(&actor).is_none(), "a copy of an older version is not this node's write: lost");
        s.shutdown().await;
    }

    /// A CI run's fence freeze: a lease renewed at 25.1 s (TTL 6 s) promised
    /// validity until 29.1 s; confirmations were answered from memory up to
    /// the end, and the renewal asked at 29.15 s came too late.
    #[test]
    fn a_confirmation_renews_while_there_is_time_left_for_it() {
        let (ttl, valid) = (6_000, 29_100);
        assert!(answers_from_memory(valid, 25_100, ttl), "just renewed");
        assert!(answers_from_memory(valid, 28_000, ttl), "more than a sixth of the TTL left");
        assert!(!answers_from_memory(valid, 28_100, ttl), "a sixth left: renewed first");
        assert!(!answers_from_memory(valid, 29_150, ttl), "run out");
        assert!(!answers_from_memory(0, u64::MAX, ttl));
    }
}
