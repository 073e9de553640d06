//! Actor identity, and the lookup of a checkpoint kept for it.
//!
//! An app container's identity is its actor id (`torpor.dev/actor`, else
//! `<pod namespace>/<pod name>` from CRI's `io.kubernetes.cri.sandbox-*`
//! annotations) and its container name (`io.kubernetes.cri.container-name`,
//! else the container id). A pod that kubelet creates again after its shim
//! died has the same identity, and gets the dead shim's checkpoint back.
//!
//! Today the kept checkpoints are the records a dead shim left under
//! `<state root>/actors/<shim id>/` (see [`crate::recovery`]);
//! [`find_restorable`] is the one place that looks them up, so that it can
//! later ask the node daemon's snapshot store instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use log::warn;

use crate::actor::{Lifecycle, Record, Store};
use crate::error::{IoContext, Result};

/// CRI's annotation with the container's name in its pod.
pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";

/// Who an app container is, across pods and shims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The actor id ([`crate::spec::ActorSpec::actor`]).
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

/// A complete checkpoint kept for an identity.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The store that holds it (the dead shim's).
    pub store: Store,
    pub generation: u64,
    /// The id the container had in the dead shim.
    pub container_id: String,
    /// The CRIU image directory.
    pub image: PathBuf,
    pub committed_at_ms: u64,
}

impl Kept {
    /// `<old shim id>/gen-<n>`, for logs and the record.
    pub fn source(&self) -> String {
        format!("{}/gen-{}", self.store.key(), self.generation)
    }
}

/// The checkpoint to restore a new container of `identity` from: the newest
/// committed one that a dead shim kept (its processes are known to be gone).
/// None when there is none, or when the newest was already taken by another
/// container (it is never handed out twice, and an older one is never used
/// in its place).
pub fn find_restorable(root: &Path, identity: &Identity) -> Result<Option<Kept>> {
    let dir = root.join("actors");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).io_context(|| format!("read {dir:?}")),
    };
    // (committed at, image present, generation) orders the candidates.
    let mut best: Option<((u64, bool, u64), Kept)> = None;
    for e in entries.flatten() {
        let key = e.file_name().to_string_lossy().into_owned();
        let Ok(store) = Store::new(root, &key) else { continue };
        let rec = match store.load() {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(err) => {
                warn!("skipping an unreadable actor record: {err}");
                continue;
            }
        };
        let Some(kept) = candidate(&store, &rec, identity) else { continue };
        let present = kept.image.join("inventory.img").is_file();
        let rank = (kept.committed_at_ms, present, kept.generation);
        if best.as_ref().is_none_or(|(r, _)| rank > *r) {
            best = Some((rank, kept));
        }
    }
    Ok(best.and_then(|((_, present, _), k)| present.then_some(k)))
}

/// The checkpoint of `identity` in `rec`, if `rec` is a kept one.
fn candidate(store: &Store, rec: &Record, identity: &Identity) -> Option<Kept> {
    if !rec.orphaned || rec.actor != identity.actor || !matches!(rec.state, Lifecycle::Suspended | Lifecycle::Resuming) {
        return None;
    }
    let (cid, _) = rec.names.iter().find(|(_, name)| **name == identity.container)?;
    Some(Kept {
        store: store.clone(),
        generation: rec.generation,
        container_id: cid.clone(),
        image: store.image_dir(rec.generation, cid),
        committed_at_ms: rec.committed_at_ms.unwrap_or(0),
    })
}

/// Takes the kept image for a new container: moves it to `dest` (a rename on
/// one file system, so exactly one taker wins). False if it was gone (taken
/// by another container meanwhile).
pub fn claim(kept: &Kept, dest: &Path) -> Result<bool> {
    move_image(&kept.image, dest)
}

/// Gives a claimed image back to the store it came from (the restore did
/// not happen): it is restorable again.
pub fn release(kept: &Kept, from: &Path) -> Result<bool> {
    move_image(from, &kept.image)
}

fn move_image(from: &Path, to: &Path) -> Result<bool> {
    let parent = to.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).io_context(|| format!("create {parent:?}"))?;
    match std::fs::rename(from, to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).io_context(|| format!("move checkpoint image {from:?} to {to:?}")),
    }
    crate::actor::sync_dir(parent)?;
    if let Some(p) = from.parent() {
        crate::actor::sync_dir(p)?;
    }
    Ok(true)
}

/// After a container of `identity` was restored and runs: every checkpoint
/// dead shims kept for it is superseded. Removes their images of that
/// container, and each store left without an image. Returns what went.
pub fn supersede(root: &Path, identity: &Identity) -> Vec<String> {
    let mut gone = Vec::new();
    let Ok(entries) = std::fs::read_dir(root.join("actors")) else { return gone };
    for e in entries.flatten() {
        let key = e.file_name().to_string_lossy().into_owned();
        let Ok(store) = Store::new(root, &key) else { continue };
        let Ok(Some(rec)) = store.load() else { continue };
        let Some(kept) = candidate(&store, &rec, identity) else { continue };
        let _ = std::fs::remove_dir_all(&kept.image);
        let _ = std::fs::remove_file(store.generation_dir(rec.generation).join(format!("{}.done", kept.container_id)));
        let left = rec.containers.iter().chain(rec.names.keys()).any(|c| store.image_dir(rec.generation, c).exists());
        if !left {
            let _ = store.remove();
        }
        gone.push(kept.source());
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_record(root: &Path, key: &str, actor: &str, name: &str, at: u64, image: bool) -> Store {
        let s = Store::new(root, key).unwrap();
        let mut r = Record::new(actor.into());
        r.state = Lifecycle::Suspended;
        r.generation = 2;
        let cid = format!("{key}-c");
        r.containers = vec![cid.clone()];
        r.names.insert(cid.clone(), name.into());
        r.committed_at_ms = Some(at);
        r.orphaned = true;
        s.save(&r).unwrap();
        if image {
            std::fs::create_dir_all(s.image_dir(2, &cid)).unwrap();
            std::fs::write(s.image_dir(2, &cid).join("inventory.img"), b"x").unwrap();
        }
        s
    }

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
    fn newest_kept_checkpoint_is_found_once() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let id = Identity { actor: "ns/pod".into(), container: "web".into() };
        assert!(find_restorable(root, &id).unwrap().is_none());
        kept_record(root, "old", "ns/pod", "web", 100, true);
        kept_record(root, "new", "ns/pod", "web", 200, true);
        kept_record(root, "other", "ns/other", "web", 300, true);
        kept_record(root, "side", "ns/pod", "sidecar", 400, true);
        // A live shim's record is never a candidate.
        let live = kept_record(root, "live", "ns/pod", "web", 500, true);
        let mut r = live.load().unwrap().unwrap();
        r.orphaned = false;
        live.save(&r).unwrap();

        let k = find_restorable(root, &id).unwrap().unwrap();
        assert_eq!(k.source(), "new/gen-2");
        let dest = root.join("actors/mine/gen-1/c9");
        assert!(claim(&k, &dest).unwrap());
        assert!(dest.join("inventory.img").is_file());
        assert!(!claim(&k, &root.join("actors/thief/gen-1/c9")).unwrap(), "taken once");
        // The newest was taken: the older one is not handed out instead.
        assert!(find_restorable(root, &id).unwrap().is_none());
        // Given back, it is restorable again.
        assert!(release(&k, &dest).unwrap());
        assert_eq!(find_restorable(root, &id).unwrap().unwrap().source(), "new/gen-2");

        let gone = supersede(root, &id);
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(!root.join("actors/old").exists() && !root.join("actors/new").exists());
        assert!(root.join("actors/side").exists() && root.join("actors/other").exists() && root.join("actors/live").exists());
        assert!(find_restorable(root, &id).unwrap().is_none());
    }

    #[test]
    fn a_record_without_its_image_is_not_restorable() {
        let root = tempfile::tempdir().unwrap();
        kept_record(root.path(), "k", "ns/pod", "web", 1, false);
        let id = Identity { actor: "ns/pod".into(), container: "web".into() };
        assert!(find_restorable(root.path(), &id).unwrap().is_none());
    }
}
