//! The actor lease object in the object tier,
//! `<prefix>/actors/<actor>/lease.json`: its format ([`LeaseDoc`]), its
//! authentication ([`LeaseMac`]), and the one reader of it, which never
//! panics whatever the bytes (`actor_lease` says how leases are used).

use serde::{Deserialize, Serialize};

use crate::chunk::sha256_hex;
use crate::crypto::{self, Keyring};
use crate::error::{Error, Result};
use crate::id::ActorName;
use crate::remote::LeaseObject;
use crate::time::check_unix_ms;

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
    /// acquire on another node waits for that (`actor_lease::LEAVING_WAIT`) instead of
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
    for (field, ms) in
        [("acquired_unix_ms", doc.acquired_unix_ms), ("expires_unix_ms", doc.expires_unix_ms), ("written_unix_ms", doc.written_unix_ms)]
    {
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

/// [`read_lease`] of a lease object as read from the object tier (one too
/// large to read is untrusted).
pub(crate) fn read_object(ring: &Keyring, actor: &ActorName, path: &str, o: &LeaseObject) -> std::result::Result<LeaseDoc, Unproven> {
    match &o.too_large {
        Some(why) => Err(Unproven::Untrusted(format!("the lease object of actor {actor} ({path}): {why}"))),
        None => read_lease(ring, actor, path, &o.bytes),
    }
}

/// What a lease object read is, to tell whether it changed: absent, or
/// its version and the digest of its bytes.
pub(crate) fn lease_state(o: Option<&LeaseObject>) -> String {
    match o {
        None => "absent".into(),
        Some(o) => format!("{:?}/{:?}/{}", o.version.e_tag, o.version.version, sha256_hex(&o.bytes)),
    }
}
