//! The actor leases this node holds: the table in memory (kept in the
//! metadata database across restarts) with one lock per actor, and what an
//! acquire grants (`actor_lease` has the operations on them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb::Database;
use serde::{Deserialize, Serialize};

use crate::db::{self, Tx};
use crate::error::Result;
use crate::id::ActorName;
use crate::lease_object::LeaseDoc;
use crate::remote::ObjectVersion;
use crate::util::lock;

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
    pub(crate) fn version(&self) -> ObjectVersion {
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
pub(crate) fn record_held(db: &Database, held: &Held) -> Result<()> {
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
    pub(crate) held: Mutex<HashMap<ActorName, Held>>,
    locks: Mutex<HashMap<ActorName, Arc<tokio::sync::Mutex<()>>>>,
    /// Serializes lease writes on object tiers without conditional updates.
    pub(crate) fallback: tokio::sync::Mutex<()>,
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

    pub(crate) fn get(&self, actor: &ActorName) -> Option<Held> {
        lock(&self.held).get(actor).cloned()
    }

    pub(crate) fn all(&self) -> Vec<Held> {
        let mut v: Vec<Held> = lock(&self.held).values().cloned().collect();
        v.sort_by(|a, b| a.doc.actor.cmp(&b.doc.actor));
        v
    }

    /// The lock of one actor's lease operations on this node.
    pub(crate) fn lock(&self, actor: &ActorName) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(actor.clone()).or_default().clone()
    }

    /// How long this node has watched `actor`'s lease object be `state`
    /// without a gap longer than `max_gap` between two looks (a longer gap
    /// could hide a change: the watch starts again).
    pub(crate) fn watch(&self, actor: &ActorName, state: &str, max_gap: Duration) -> Duration {
        let now = std::time::Instant::now();
        let mut w = lock(&self.watched);
        let e = w.entry(actor.clone()).or_insert_with(|| (state.to_string(), now, now));
        if e.0 != state || now.duration_since(e.2) > max_gap {
            *e = (state.to_string(), now, now);
        }
        e.2 = now;
        now.duration_since(e.1)
    }

    pub(crate) fn unwatch(&self, actor: &ActorName) {
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
