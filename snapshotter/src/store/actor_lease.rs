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
//! Within one node the node-local claim of the shims arbitrates (two shims of
//! one actor on one node are refused there); the lease names the node and,
//! for messages, the shim that took it.
//!
//! Why `impl Store` here: a lease's `durable_generation` is computed from
//! the records of the metadata database, a surrender queues the upload of
//! the actor's newest snapshot, and the upload's manifest write is fenced
//! by the lease.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::db::{self, RemoteState, Tx};
use super::error::{Error, Result};
use super::id::ActorName;
use super::remote::ObjectVersion;
use super::{now_ms, Store};

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
    /// The newest generation of the actor uploaded by any holder.
    pub durable_generation: u64,
}

/// A lease this node holds (kept in the metadata database).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Held {
    pub doc: LeaseDoc,
    pub e_tag: Option<String>,
    pub version: Option<String>,
    /// Let go once the actor's newest snapshot is durable.
    pub surrendering: bool,
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

fn unix_ms_text(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

fn parse(actor: &ActorName, path: &str, bytes: &[u8]) -> Result<LeaseDoc> {
    let doc: LeaseDoc = serde_json::from_slice(bytes).map_err(|e| {
        Error::InvalidArgument(format!("the lease object of actor {actor} ({path}) is unreadable: {e}; delete it to let a node take the actor"))
    })?;
    if doc.format != LEASE_FORMAT || doc.actor != *actor {
        return Err(Error::InvalidArgument(format!(
            "the lease object of actor {actor} ({path}) is of format {} for actor {}: not this store's",
            doc.format, doc.actor
        )));
    }
    Ok(doc)
}

fn encode(doc: &LeaseDoc) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(doc).map_err(|e| Error::Internal(format!("encode lease: {e}")))
}

/// Conditional writes that keep losing (another node churning the same
/// lease) give up after this many rounds.
const ROUNDS: usize = 8;

impl Store {
    fn node(&self) -> &str {
        &self.cfg.node_id
    }

    fn lease_ttl(&self) -> Duration {
        self.cfg.lease_ttl
    }

    fn save_held(&self, held: &Held) -> Result<()> {
        let tx = Tx::begin(&self.db)?;
        tx.put_actor_lease(&held.doc.actor, held)?;
        tx.commit()
    }

    fn drop_held(&self, actor: &ActorName) -> Result<()> {
        let tx = Tx::begin(&self.db)?;
        tx.remove_actor_lease(actor)?;
        tx.commit()
    }

    fn held(&self, actor: &ActorName) -> Result<Option<Held>> {
        Ok(db::actor_leases(&self.db)?.into_iter().find(|h| h.doc.actor == *actor))
    }

    /// Actor leases this node holds.
    pub fn actor_leases(&self) -> Result<Vec<Held>> {
        db::actor_leases(&self.db)
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
    /// with [`Error::LeaseHeld`] while another node holds it unexpired.
    pub async fn acquire(&self, actor: &ActorName, owner: &str) -> Result<Grant> {
        let _one = self.lease_lock.lock().await;
        let path = self.remote.lease_path(actor).to_string();
        for _ in 0..ROUNDS {
            let now = now_ms();
            let current = self.remote.get_lease(actor).await?;
            let (previous, expect) = match current {
                None => (None, None),
                Some((bytes, version)) => (Some(parse(actor, &path, &bytes)?), Some(version)),
            };
            if let Some(p) = &previous {
                let free = p.released || p.expires_unix_ms <= now || p.node == self.node();
                if !free {
                    return Err(Error::LeaseHeld {
                        actor: actor.clone(),
                        node: p.node.clone(),
                        owner: p.owner.clone(),
                        until: unix_ms_text(p.expires_unix_ms),
                    });
                }
            }
            let ours = previous.as_ref().is_some_and(|p| p.node == self.node() && !p.released);
            let doc = LeaseDoc {
                format: LEASE_FORMAT,
                actor: actor.clone(),
                node: self.node().to_string(),
                owner: owner.to_string(),
                epoch: match &previous {
                    None => 1,
                    Some(p) if ours => p.epoch,
                    Some(p) => p.epoch + 1,
                },
                acquired_unix_ms: if ours { previous.as_ref().map_or(now, |p| p.acquired_unix_ms) } else { now },
                expires_unix_ms: now + self.lease_ttl().as_millis() as u64,
                released: false,
                durable_generation: previous.as_ref().map_or(0, |p| p.durable_generation).max(self.durable_generation(actor)?),
            };
            match self.remote.put_lease(actor, encode(&doc)?, expect, &self.lease_fallback).await? {
                Err(_) => continue,
                Ok(v) => {
                    let held = Held { doc: doc.clone(), e_tag: v.e_tag, version: v.version, surrendering: false };
                    {
                        let tx = Tx::begin(&self.db)?;
                        tx.put_actor_lease(actor, &held)?;
                        tx.see_generation(actor, doc.durable_generation)?;
                        tx.commit()?;
                    }
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

    /// The actor leaves this node (its pod was removed, or its shim died):
    /// the lease is let go once its newest snapshot is durable (uploaded
    /// first if needed), renewed until then. Unknown actor: nothing to do.
    pub async fn surrender(&self, actor: &ActorName, owner: &str) -> Result<()> {
        {
            let _one = self.lease_lock.lock().await;
            let Some(mut held) = self.held(actor)? else { return Ok(()) };
            if !owner.is_empty() && held.doc.owner != owner {
                // Another shim of this node has taken the actor since.
                return Ok(());
            }
            held.surrendering = true;
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
        for h in held {
            if let Err(e) = self.lease_pass_one(&h.doc.actor).await {
                warn!(actor = %h.doc.actor, error = %e, "actor lease renewal failed");
                self.note_error(format!("actor lease of {}: {e}", h.doc.actor));
            }
        }
        self.renew_pins().await;
    }

    async fn lease_pass_one(&self, actor: &ActorName) -> Result<()> {
        let _one = self.lease_lock.lock().await;
        let Some(held) = self.held(actor)? else { return Ok(()) };
        let durable = self.durable_generation(actor)?.max(held.doc.durable_generation);
        let mut doc = held.doc.clone();
        doc.durable_generation = durable;
        let now = now_ms();
        let mut release = false;
        if held.surrendering {
            let newest = db::records(&self.db, Some(actor))?.into_iter().filter(|r| !r.removing).max_by_key(|r| r.generation);
            match newest {
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
        doc.expires_unix_ms = if release { now } else { now + self.lease_ttl().as_millis() as u64 };
        match self.remote.put_lease(actor, encode(&doc)?, Some(held.version()), &self.lease_fallback).await? {
            Ok(v) => {
                if release {
                    self.drop_held(actor)?;
                    info!(actor = %actor, durable_generation = durable, "actor lease released");
                } else {
                    self.save_held(&Held { doc, e_tag: v.e_tag, version: v.version, surrendering: held.surrendering })?;
                }
                Ok(())
            }
            Err(_) => {
                // Changed behind our back: our own write whose answer was
                // lost, or another node took over after it expired.
                let path = self.remote.lease_path(actor).to_string();
                match self.remote.get_lease(actor).await? {
                    Some((bytes, v)) => {
                        let now_doc = parse(actor, &path, &bytes)?;
                        if now_doc.node == self.node() && now_doc.epoch == held.doc.epoch {
                            self.save_held(&Held { doc: now_doc, e_tag: v.e_tag, version: v.version, surrendering: held.surrendering })?;
                            return Ok(());
                        }
                        self.drop_held(actor)?;
                        let detail = format!("node {} took it over at epoch {} (after it expired here)", now_doc.node, now_doc.epoch);
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
    /// and it stays valid for more than `lease_ttl / 3` — else it is renewed
    /// now. Returns the epoch and the time until which that holds (the
    /// expiry less the margin: other nodes judge expiry by their clocks).
    pub async fn confirm(&self, actor: &ActorName, owner: &str) -> Result<(u64, u64)> {
        let margin = self.lease_ttl().as_millis() as u64 / 3;
        let valid = |h: &Held| h.doc.expires_unix_ms.saturating_sub(margin);
        let held = self.held(actor)?;
        match &held {
            None => return Err(self.not_held(actor).await),
            Some(h) if h.surrendering => {
                return Err(Error::LeaseLost { actor: actor.clone(), detail: "it is being surrendered (its pod was removed from this node)".into() })
            }
            Some(h) if !owner.is_empty() && h.doc.owner != owner => {
                return Err(Error::LeaseLost { actor: actor.clone(), detail: format!("shim {} of this node holds it now", h.doc.owner) })
            }
            Some(h) if valid(h) > now_ms() => return Ok((h.doc.epoch, valid(h))),
            Some(_) => {}
        }
        self.lease_pass_one(actor).await?;
        match self.held(actor)? {
            Some(h) if valid(&h) > now_ms() => Ok((h.doc.epoch, valid(&h))),
            Some(h) => Err(Error::LeaseLost {
                actor: actor.clone(),
                detail: format!("renewed, but valid only until {}", unix_ms_text(h.doc.expires_unix_ms)),
            }),
            None => Err(self.not_held(actor).await),
        }
    }

    /// Why this node does not hold `actor`'s lease, for an error.
    async fn not_held(&self, actor: &ActorName) -> Error {
        let path = self.remote.lease_path(actor).to_string();
        let detail = match self.remote.get_lease(actor).await {
            Ok(Some((bytes, _))) => match parse(actor, &path, &bytes) {
                Ok(d) if d.node != self.node() && !d.released => {
                    format!("node {} holds it (epoch {}, shim {}) until {}", d.node, d.epoch, d.owner, unix_ms_text(d.expires_unix_ms))
                }
                Ok(d) => format!("this node does not hold it (the lease object says node {}, epoch {}, released: {})", d.node, d.epoch, d.released),
                Err(e) => format!("this node does not hold it ({e})"),
            },
            Ok(None) => "this node does not hold it (no lease object)".into(),
            Err(e) => format!("this node does not hold it (the lease object cannot be read: {e})"),
        };
        Error::LeaseLost { actor: actor.clone(), detail }
    }

    /// Before an upload publishes a manifest of `actor`: refused when the
    /// actor's lease belongs to another node (this node lost it, or never
    /// had it). No lease object at all (a store used without leases) is fine.
    pub(crate) async fn fence(&self, actor: &ActorName) -> Result<()> {
        let path = self.remote.lease_path(actor).to_string();
        match self.remote.get_lease(actor).await? {
            Some((bytes, _)) => {
                let doc = parse(actor, &path, &bytes)?;
                if doc.node == self.node() {
                    Ok(())
                } else {
                    Err(Error::LeaseLost {
                        actor: actor.clone(),
                        detail: format!("the lease is node {}'s (epoch {}): this node's snapshots of it are not published", doc.node, doc.epoch),
                    })
                }
            }
            None => Ok(()),
        }
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
