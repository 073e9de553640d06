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
//! The lease object's format and reader are in `lease_object`, the table of
//! the leases this node holds in `leases`. Why `impl Store` here: a lease's `durable_generation` is computed from
//! the records of the metadata database, a surrender queues the upload of
//! the actor's newest snapshot, and the upload's manifest write is fenced
//! by the lease.

use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tracing::{info, warn};

use crate::config::millis;
use crate::db::{self, RemoteState, Tx};
use crate::error::{Error, Result};
use crate::id::ActorName;
use crate::lease_object::{lease_state, read_object, seal_lease, LeaseDoc, Unproven, LEASE_FORMAT};
use crate::leases::{record_held, Grant, Held};
use crate::remote::{ConditionalWrites, Honoured, LeaseObject};
use crate::state::Store;
use crate::time::{now_ms, unix_ms_text, MAX_UNIX_MS};
use crate::util::lock;

/// Conditional writes that keep losing (another node churning the same
/// lease) give up after this many rounds.
const ROUNDS: usize = 8;

/// How long an acquire waits for another node that is [`LeaseDoc::leaving`]
/// the actor to release it (its upload of the actor's newest snapshot, then
/// its next lease pass) before it is refused as held. Well inside the
/// shim's deadline for the call, which is inside kubelet's for the start.
pub const LEAVING_WAIT: Duration = Duration::from_secs(60);

impl Store {
    pub(crate) fn node(&self) -> &str {
        &self.cfg.node_id
    }

    pub(crate) fn lease_ttl(&self) -> Duration {
        self.cfg.lease_ttl
    }

    pub(crate) fn save_held(&self, held: &Held) -> Result<()> {
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
    pub(crate) fn save_renewed(&self, held: Held, one: OwnedMutexGuard<()>) {
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

    pub(crate) fn drop_held(&self, actor: &ActorName) -> Result<()> {
        let tx = Tx::begin(&self.db)?;
        tx.remove_actor_lease(actor)?;
        tx.commit()?;
        lock(&self.leases.held).remove(actor);
        Ok(())
    }

    pub(crate) fn held(&self, actor: &ActorName) -> Result<Option<Held>> {
        Ok(self.leases.get(actor))
    }

    /// Actor leases this node holds.
    pub fn actor_leases(&self) -> Result<Vec<Held>> {
        Ok(self.leases.all())
    }

    /// The lease validity a confirmation may promise: the expiry less a
    /// third of the TTL (other nodes judge expiry by their own clocks).
    pub(crate) fn valid_until(&self, h: &Held) -> u64 {
        h.doc.expires_unix_ms.saturating_sub(millis(self.lease_ttl()) / 3)
    }

    /// The newest generation of `actor` durable in the object tier that this
    /// node's database knows.
    pub(crate) fn durable_generation(&self, actor: &ActorName) -> Result<u64> {
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
                        return Err(Error::LeaseHeld {
                            actor: actor.clone(),
                            node: p.node.clone(),
                            owner: p.owner.clone(),
                            until: unix_ms_text(p.expires_unix_ms),
                        });
                    }
                    let lm = current.as_ref().map_or(0, |o| o.last_modified_ms);
                    if !held_here {
                        if p.node == self.node() && !p.released && !expired {
                            unproven = Some(format!(
                                "{path} names this node (epoch {}), which does not hold it: an old copy, or a write whose record was lost",
                                p.epoch
                            ));
                        } else if !self.fresh(&p, lm) {
                            unproven = Some(format!(
                                "{path} ({}, written at {}) was last modified at {} by the object tier's clock: a copy written again later (replayed), not proven free",
                                if p.released { "released" } else { "expired" },
                                unix_ms_text(p.written_unix_ms),
                                unix_ms_text(u64::try_from(lm).unwrap_or(0))
                            ));
                        } else if !p.released && now < p.expires_unix_ms.saturating_add(self.fresh_slack_ms() + 1000) {
                            unproven = Some(format!(
                                "{path} expired at {}: taken {} ms after that",
                                unix_ms_text(p.expires_unix_ms),
                                self.fresh_slack_ms() + 1000
                            ));
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
                        Some(p) if !p.released => {
                            warn!(actor = %actor, from = %p.node, epoch = doc.epoch, expired = %unix_ms_text(p.expires_unix_ms), "actor lease taken over: its holder stopped renewing it")
                        }
                        _ => info!(actor = %actor, epoch = doc.epoch, owner, "actor lease acquired"),
                    }
                    return Ok(Grant { epoch: doc.epoch, durable_generation: doc.durable_generation, previous });
                }
            }
        }
        Err(Error::LeaseLost {
            actor: actor.clone(),
            detail: format!("the lease object {path} kept changing under {ROUNDS} conditional writes"),
        })
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
    pub(crate) fn own_write(
        &self,
        held: &Held,
        tried: &LeaseDoc,
        o: &LeaseObject,
        read: &std::result::Result<LeaseDoc, Unproven>,
    ) -> Option<LeaseDoc> {
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
            && d.expires_unix_ms <= MAX_UNIX_MS
            && d.written_unix_ms >= held.doc.written_unix_ms;
        ours.then_some(d)
    }

    /// How far the object tier's last-modified time of a lease object may
    /// be past the time written in it for the object to be fresh.
    pub(crate) fn fresh_slack_ms(&self) -> u64 {
        millis(self.lease_ttl()) / 6
    }

    /// Was lease object `doc` written when the object tier says it was last
    /// modified (`last_modified_ms`, one-second resolution on S3): not a
    /// copy of an older version written again.
    pub(crate) fn fresh(&self, doc: &LeaseDoc, last_modified_ms: i64) -> bool {
        let Ok(lm) = u64::try_from(last_modified_ms) else { return false };
        doc.written_unix_ms > 0 && lm <= doc.written_unix_ms.saturating_add(self.fresh_slack_ms())
    }

    /// Does the actor have a snapshot durable in the object tier (its
    /// listing, or this node's records)?
    pub(crate) async fn has_durable_snapshots(&self, actor: &ActorName) -> Result<bool> {
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

#[cfg(test)]
mod tests;
