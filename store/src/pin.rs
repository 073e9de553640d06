//! Checkout pins in the object tier: a snapshot that a checkout on one node
//! fetched from the object tier stays there, on every node, until that
//! checkout is released (docs/STORE.md, "Checkout pins across nodes").
//!
//! A fetch writes `<prefix>/actors/<actor>/_pins/<32 hex>.json` after it has
//! read the manifest and before it fetches any chunk: the same object as an
//! upload's intent (`store::sweep`), naming the snapshot, this node and the
//! chunks (sealed under the snapshot's key), so that a sweep anywhere keeps
//! them while the fetch runs. It then checks that the manifest is still
//! there: a removal from then on finds the pin (`remove` and gc's retention
//! on every node refuse to remove a snapshot another node pins), and a sweep
//! that has not seen the pin saw the manifest. The checkout's lease records
//! the pin; the daemon rewrites it every `INTENT_TTL`/4 while the lease is
//! held (after a restart of the daemon without the chunk list: the fetch is
//! over) and deletes it at release. A pin not rewritten for `INTENT_TTL`
//! belonged to a node that died or lost the object tier: it is ignored
//! (and deleted by the next sweep).
//!
//! The pins this node holds are a table of the store's state (`pins`).
//! Why `impl Store` here: pins are written by fetch, renewed by the lease
//! worker, and read by retention (remove, gc); they share the chunk-list
//! object format with upload intents (`store::sweep`).

use std::time::Instant;

use object_store::path::Path as OPath;
use tracing::{debug, info, warn};

use crate::crypto::Key;
use crate::db;
use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::pins::PinState;
use crate::remote::ChunkName;
use crate::state::Store;
use crate::sweep::INTENT_TTL;
use crate::time::now_ms;
use crate::util::{lock, random_id};

impl Store {
    /// Pin snapshot `id` in the object tier for a fetch of `names` (sealed
    /// under `key`, or plaintext). Returns the pin object's path.
    pub(crate) async fn write_pin(&self, id: &SnapshotId, key: Option<&std::sync::Arc<Key>>, names: &[ChunkName]) -> Result<String> {
        let pin_id = random_id();
        let bytes = self.chunk_list_object(&pin_id, id, key, names)?;
        let path = self.remote.pin_path(&id.actor, &pin_id);
        let started = Instant::now();
        self.remote.put_object("write checkout pin", &path, bytes.clone()).await?;
        lock(&self.pins).insert(path.to_string(), PinState { bytes, renewed: started });
        debug!(snapshot = %id, pin = %path, chunks = names.len(), "checkout pin written");
        Ok(path.to_string())
    }

    /// Rewrite a pin of this node when a quarter of its lifetime has passed
    /// (one this daemon did not write, after a restart: without chunks).
    pub(crate) async fn renew_pin_if_due(&self, path: &str, id: &SnapshotId) -> Result<()> {
        let bytes = {
            let pins = lock(&self.pins);
            match pins.get(path) {
                Some(p) if p.renewed.elapsed() < INTENT_TTL / 4 => return Ok(()),
                Some(p) => p.bytes.clone(),
                None => {
                    let pin_id = path.rsplit('/').next().and_then(|f| f.strip_suffix(".json")).unwrap_or_default().to_string();
                    drop(pins);
                    self.chunk_list_object(&pin_id, id, None, &[])?
                }
            }
        };
        let started = Instant::now();
        self.remote.put_object("renew checkout pin", &OPath::from(path), bytes.clone()).await?;
        lock(&self.pins).insert(path.to_string(), PinState { bytes, renewed: started });
        debug!(snapshot = %id, pin = path, "checkout pin renewed");
        Ok(())
    }

    /// Delete a pin of this node (its checkout is released, or its fetch
    /// failed). A failure leaves it to go stale.
    pub(crate) async fn drop_pin(&self, path: &str) {
        lock(&self.pins).remove(path);
        match self.remote.delete_object("delete checkout pin", &OPath::from(path)).await {
            Ok(()) => debug!(pin = path, "checkout pin deleted"),
            Err(e) => warn!(pin = path, error = %e, "checkout pin not deleted (it goes stale once it is not renewed)"),
        }
    }

    /// Renew the pins of this node's checkout leases (run with the actor
    /// lease renewals).
    pub(crate) async fn renew_pins(&self) {
        let leases = match db::leases(&self.db) {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "list checkout leases to renew their pins");
                return;
            }
        };
        for (_, l) in leases {
            let (Some(pin), Some(id)) = (l.remote_pin.as_deref(), SnapshotId::from_db_key(&l.key)) else { continue };
            if let Err(e) = self.renew_pin_if_due(pin, &id).await {
                warn!(snapshot = %id, pin, error = %e, "checkout pin renewal failed");
                self.note_error(format!("checkout pin of {id}: {e}"));
            }
        }
    }

    /// A live pin of snapshot `id` that another node holds: (node, pin path).
    pub(crate) async fn pinned_elsewhere(&self, id: &SnapshotId) -> Result<Option<(String, String)>> {
        let live_after = now_ms() as i64 - INTENT_TTL.as_millis() as i64;
        let want = id.to_string();
        for m in self.remote.pins(&id.actor).await? {
            if m.last_modified.timestamp_millis() < live_after {
                continue;
            }
            let Some(bytes) = self.remote.get_object("read checkout pin", &m.location).await? else { continue };
            match Store::chunk_list_header(&bytes) {
                Ok((node, snapshot)) if snapshot == want && node != self.cfg.node_id => {
                    info!(snapshot = %id, node, pin = %m.location, "kept: pinned by a checkout on another node");
                    return Ok(Some((node, m.location.to_string())));
                }
                Ok(_) => {}
                Err(e) => {
                    // It could be about this snapshot: kept until the pin goes stale.
                    warn!(pin = %m.location, error = %e, "unreadable checkout pin: the actor's snapshots are kept until it goes stale");
                    return Ok(Some((format!("? (unreadable pin: {e})"), m.location.to_string())));
                }
            }
        }
        Ok(None)
    }

    /// Refuse to remove a snapshot another node's checkout pins.
    pub(crate) async fn check_not_pinned_elsewhere(&self, id: &SnapshotId) -> Result<()> {
        match self.pinned_elsewhere(id).await? {
            Some((node, pin)) => Err(Error::PinnedElsewhere { id: id.clone(), node, pin }),
            None => Ok(()),
        }
    }
}
