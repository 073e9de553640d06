//! Keeping an actor lease: the renewal pass (every `lease_ttl / 3`: renewals
//! and the surrenders whose snapshot is durable), the confirmations the
//! shims' lease fences ask for (answered from memory while the lease is
//! valid for long enough), and the fence of an upload's manifest write
//! (`actor_lease` has the rules, the acquire and the surrender).

use std::time::Duration;

use tracing::{info, warn};

use crate::config::millis;
use crate::db::{self, LocalState, RemoteState, Tx};
use crate::error::{Error, Result};
use crate::id::{ActorName, SnapshotId};
use crate::lease_object::{read_object, seal_lease, Unproven};
use crate::leases::Held;
use crate::state::Store;
use crate::time::{now_ms, unix_ms_text};

impl Store {
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

    pub(crate) async fn lease_pass_one(&self, actor: &ActorName) -> Result<()> {
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
                Some(r)
                    if r.remote != RemoteState::Durable
                        && (r.local == LocalState::Absent || waited >= millis(self.cfg.surrender_timeout)) =>
                {
                    // Bounded: the actor must be able to move on (from its
                    // newest durable snapshot) rather than never.
                    let why = if r.local == LocalState::Absent {
                        "it has no local copy left to upload".to_string()
                    } else {
                        format!(
                            "it is still not durable after {} s (surrender_timeout; last error: {})",
                            waited / 1000,
                            r.last_error.as_deref().unwrap_or("none")
                        )
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
                            Ok(d) => format!(
                                "node {} holds it at epoch {} (this node held epoch {}): changed behind this node's back",
                                d.node, d.epoch, held.doc.epoch
                            ),
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
            return Some(Err(Error::LeaseLost {
                actor: actor.clone(),
                detail: "it is being surrendered (its pod was removed from this node)".into(),
            }));
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
    pub(crate) async fn trusted_durable_generation(&self, actor: &ActorName, named: u64, authenticated: bool) -> Result<u64> {
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
    pub(crate) async fn not_held(&self, actor: &ActorName) -> Error {
        let path = self.remote.lease_path(actor).to_string();
        let detail = match self.remote.get_lease(actor).await {
            Ok(Some(o)) => match read_object(&self.cfg.keyring, actor, &path, &o) {
                Ok(d) if d.node != self.node() && !d.released => {
                    format!("node {} holds it (epoch {}, shim {}) until {}", d.node, d.epoch, d.owner, unix_ms_text(d.expires_unix_ms))
                }
                Ok(d) => format!(
                    "this node does not hold it (the lease object says node {}, epoch {}, released: {})",
                    d.node, d.epoch, d.released
                ),
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
                    let doc = read_object(&self.cfg.keyring, actor, &path, &o).map_err(
                        |(Unproven::Untrusted(why) | Unproven::ForeignKey(why))| {
                            lost(format!("{why}: this node's snapshots of it are not published"))
                        },
                    )?;
                    if doc.node != self.node() {
                        Err(lost(format!(
                            "the lease is node {}'s (epoch {}): this node's snapshots of it are not published",
                            doc.node, doc.epoch
                        )))
                    } else if !doc.released && doc.expires_unix_ms <= now_ms() {
                        Err(lost(format!(
                            "this node's lease (epoch {}) expired and is not held here any more: another node may take it at any moment",
                            doc.epoch
                        )))
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
                        Ok(d) => format!(
                            "node {} holds it at epoch {} (this node held epoch {}): this node's snapshots of it are not published",
                            d.node, d.epoch, held.doc.epoch
                        ),
                        Err(Unproven::Untrusted(why) | Unproven::ForeignKey(why)) => {
                            format!("{why}: changed behind this node's back; this node's snapshots of it are not published")
                        }
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
}

/// A confirmation is answered from memory while the validity it promises
/// (`valid_until`, unix ms) has more than a sixth of the TTL to run; past
/// that the lease is renewed first, with that sixth left for the renewal
/// before the shim stops waiting for the answer.
pub(crate) fn answers_from_memory(valid_until: u64, now: u64, ttl_ms: u64) -> bool {
    valid_until > now.saturating_add(ttl_ms / 6)
}
