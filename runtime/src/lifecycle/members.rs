//! An actor's membership: its record set up (claim and lease) at the
//! first app container's create, its members named, and the record
//! dropped once the last app container is gone (retention of its
//! snapshots, its leases, its claim; a commit under way lands first).

use tracing::{info, warn};

use crate::actor::claim::Claim;
use crate::actor::record::{self, Lifecycle, Record};
use crate::error::Result;
use crate::lifecycle::{lock, Actor};
use crate::oci::annotations::ActorSpec;

impl Actor {
    /// Sets up the actor record when the first app container is created,
    /// after claiming the actor on this node (see [`crate::actor::claim`]):
    /// a second shim of the same actor is refused here.
    pub async fn init(&self, group: &str, spec: &ActorSpec, explicit: bool) -> Result<()> {
        let _gate = self.gate.lock().await;
        if lock(&self.slot).is_some() {
            return Ok(());
        }
        let store = record::Store::new(&self.config.state_root, group)?;
        let mut rec = Record::new(spec.actor.clone().unwrap_or_else(|| group.to_string()));
        rec.explicit_actor = explicit;
        rec.pod_uid = spec.pod_uid.clone();
        rec.keep_local_s = spec.keep_local.map(|d| d.as_secs().max(1));
        let claim = Claim::take_in(&self.config.claim_dir, &rec.actor, group)?;
        // One node runs the actor: its lease in the object tier (refused,
        // naming the holder, while another node has it).
        let grant = self.store.acquire(&rec.actor, group).await.map_err(|e| e.context(&format!("actor {}", rec.actor)))?;
        info!(actor = rec.actor.as_str(), epoch = grant.epoch, from = ?grant.previous_node, "actor lease held by this node");
        rec.moved_from = grant.previous_node;
        if let Err(e) = store.save(&rec) {
            self.store.surrender_logged(&rec.actor, group).await;
            return Err(e);
        }
        *lock(&self.claim) = Some(claim);
        crate::actor::report::state(&self.store, &rec);
        *lock(&self.slot) = Some((store, rec));
        Ok(())
    }

    /// Records app container `id`'s name (its identity within the actor)
    /// and cgroup, before it runs.
    pub fn add_member(&self, id: &str, name: &str, cgroup: Option<String>) -> Result<()> {
        self.update_if(|rec| {
            rec.names.insert(id.to_string(), name.to_string());
            if let Some(cg) = cgroup {
                rec.cgroups.insert(id.to_string(), cg);
            }
            Some(())
        })
        .map(|_| ())
    }

    /// App container `id` started (cold or restored): the actor ran.
    pub fn ran(&self, id: &str) {
        let r = self.update_if(|rec| {
            if rec.ran || !rec.names.contains_key(id) {
                return None;
            }
            rec.ran = true;
            Some(())
        });
        if let Err(e) = r {
            warn!(container = id, "save the actor record: {e}");
        }
    }

    /// Drops the actor's record once no app container is left: retention
    /// of its snapshots, its leases, its claim.
    pub async fn forget_if_empty(&self) {
        if self.tasks.has_app_containers() {
            return;
        }
        // A suspend's commit under way lands in the store first.
        if let Err(e) = self.wait_commit().await {
            warn!("the actor is removed while its suspend's commit fails: {e}");
        }
        self.wait_lazy_daemons().await;
        let _gate = self.gate.lock().await;
        let Some((store, rec)) = lock(&self.slot).take() else { return };
        for lease in &rec.leases {
            self.store.release_logged(lease).await;
        }
        // Retention: a SUSPENDED actor's snapshots stay (restorable by
        // identity; the store's gc keeps the newest). A running actor has
        // moved past them: with the default id (its pod) they are stale; an
        // explicit actor id keeps them (resume anywhere).
        if matches!(rec.state, Lifecycle::Running | Lifecycle::Frozen) && rec.ran && !rec.explicit_actor {
            self.store.remove_all_logged(&rec.actor).await;
        }
        // Another node may take the actor now (once its newest snapshot is
        // durable: the store uploads it first).
        self.store.surrender_logged(&rec.actor, &store.key()).await;
        if let Err(e) = store.remove() {
            warn!("remove actor state: {e}");
        }
        if let Err(e) = crate::oci::bundle::remove_request_dir(&store.key()) {
            warn!("remove the request directory: {e}");
        }
        self.release_held_ports();
        lock(&self.frozen_watch).take();
        self.freeze_changed.notify_one();
        lock(&self.claim).take();
        lock(&self.commit).take();
    }
}
