//! Actor identity, and the lookup of a checkpoint kept for it.
//!
//! An app container's identity is its actor id (`torpor.dev/actor`, else
//! `<pod namespace>/<pod name>` from CRI's `io.kubernetes.cri.sandbox-*`
//! annotations) and its container name (`io.kubernetes.cri.container-name`,
//! else the container id). A pod that kubelet creates again after its shim
//! died has the same identity, and gets the dead shim's checkpoint back.
//!
//! The checkpoints live in the node's snapshot store, one snapshot per actor
//! generation with one `<container name>/` image directory per container:
//! [`find_restorable`] is the one place that looks them up (the store's
//! newest snapshot of the actor, in either tier).
//!
//! A new actor can be a clone of another's snapshot (`torpor.dev/restore-from:
//! <actor>[@<generation>]`, a "golden" snapshot): when it has no snapshot of
//! its own it is restored from that one, and lives on as itself (its own
//! generations; the source is only read, pinned by the checkout while the
//! clone restores from it).

use std::collections::HashMap;
use std::path::Path;

use crate::actor::snapshots::Snapshots;
use crate::actor::store_client::SnapshotRef;
use crate::actor::Store;
use crate::error::{Error, Result};
use crate::oci::annotations::{RestoreSource, RESTORE_FROM};
use crate::oci::spec::CRI_CONTAINER_NAME;

/// Who an app container is, across pods and shims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The actor id ([`crate::oci::annotations::ActorSpec::actor`]).
    pub actor: String,
    /// The container's name within the actor.
    pub container: String,
}

impl Identity {
    /// The identity of container `id`, if it has an actor id (from
    /// `torpor.dev/actor` or the CRI pod); without one (a plain `ctr`
    /// container) there is nothing to match a later container with.
    pub fn of(actor: Option<&str>, annotations: &HashMap<String, String>, id: &str) -> Option<Identity> {
        let actor = actor?.to_string();
        let container = annotations.get(CRI_CONTAINER_NAME).cloned().unwrap_or_else(|| id.to_string());
        Some(Identity { actor, container })
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.actor, self.container)
    }
}

/// The snapshot to restore a new container of `identity` from: the
/// actor's newest snapshot in the node's store (local or object tier);
/// without one, the snapshot `clone_of` names (`torpor.dev/restore-from`:
/// an actor's newest, or the given generation, whose existence is seen at
/// its checkout). A `clone_of` actor without any snapshot is an error
/// naming the annotation. Whether the snapshot holds an image of the
/// container (`<name>/`) is seen once it is checked out.
pub async fn find_restorable(store: &dyn Snapshots, identity: &Identity, clone_of: Option<&RestoreSource>) -> Result<Option<SnapshotRef>> {
    if let Some(own) = store.latest(&identity.actor).await? {
        return Ok(Some(own));
    }
    let Some(src) = clone_of else { return Ok(None) };
    if let Some(generation) = src.generation {
        return Ok(Some(SnapshotRef { actor: src.actor.clone(), generation }));
    }
    match store.latest(&src.actor).await? {
        Some(snap) => Ok(Some(snap)),
        None => Err(Error::InvalidAnnotation {
            key: RESTORE_FROM.into(),
            value: src.to_string(),
            reason: format!("the snapshot store has no snapshot of actor {} (local or object tier)", src.actor),
        }),
    }
}

/// The container names a checked-out snapshot holds images of (sorted).
pub fn image_names(checkout: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(checkout)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("inventory.img").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// After a container of `actor` was restored and runs: the records dead
/// shims kept of the actor (for an operator to see, `torporctl status`)
/// are superseded. Removes them; returns their shim ids.
pub fn supersede(root: &Path, actor: &str) -> Vec<String> {
    let mut gone = Vec::new();
    let Ok(entries) = std::fs::read_dir(root.join("actors")) else { return gone };
    for e in entries.flatten() {
        let key = e.file_name().to_string_lossy().into_owned();
        let Ok(store) = Store::new(root, &key) else { continue };
        let Ok(Some(rec)) = store.load() else { continue };
        if rec.orphaned && rec.actor == actor {
            let _ = store.remove();
            gone.push(key);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::{Lifecycle, Record};

    #[test]
    fn identity_from_annotations() {
        let mut ann = HashMap::new();
        assert_eq!(Identity::of(None, &ann, "c1"), None);
        let id = Identity::of(Some("ns/pod"), &ann, "c1").unwrap();
        assert_eq!(id.to_string(), "ns/pod/c1");
        ann.insert(CRI_CONTAINER_NAME.to_string(), "web".to_string());
        assert_eq!(Identity::of(Some("ns/pod"), &ann, "c1").unwrap().to_string(), "ns/pod/web");
    }

    #[test]
    fn kept_records_of_the_actor_are_superseded() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        for (key, actor, orphaned) in [("old", "ns/pod", true), ("other", "ns/other", true), ("live", "ns/pod", false)] {
            let s = Store::new(root, key).unwrap();
            let mut r = Record::new(actor.into());
            r.state = Lifecycle::Suspended;
            r.orphaned = orphaned;
            s.save(&r).unwrap();
        }
        assert_eq!(supersede(root, "ns/pod"), vec!["old".to_string()]);
        assert!(!root.join("actors/old").exists());
        assert!(root.join("actors/other").exists() && root.join("actors/live").exists());
    }
}
