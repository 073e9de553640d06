//! Encryption and integrity at rest in the object tier.
//!
//! A node holds a **keyring**: 32-byte master keys, each under a key id. The
//! *active* key seals what the node uploads; any key of the ring opens what
//! it reads. Without keys the object tier holds plaintext (as before).
//!
//! From each master key, HKDF-SHA256 (salt `torpor-store-v1`) derives:
//!
//! | info                  | use |
//! | --------------------- | --- |
//! | `chunk address`       | HMAC-SHA256 key naming chunk objects |
//! | `chunk aead`          | XChaCha20-Poly1305 key of chunk payloads |
//! | `manifest aead`       | XChaCha20-Poly1305 key of manifests |
//! | `manifest nonce`      | HMAC-SHA256 key deriving a manifest's nonce |
//! | `chunk nonce`         | HMAC-SHA256 key deriving a chunk's nonce |
//! | `lease mac`           | HMAC-SHA256 key authenticating actor lease objects |
//! | `key check`           | 8 bytes shown as the key's *check value* |
//!
//! A sealed chunk is named `hex(HMAC-SHA256(address key, "sha256:" || digest))`
//! (the digest, hex, of its plaintext): no object name is a sha256 an
//! observer could confirm, and the same chunk under the same key is the same
//! object (deduplication keeps working). Its nonce is
//! `HMAC-SHA256(chunk nonce key, header || address || payload)[..24]`, the
//! payload being the exact bytes encrypted (the zstd output, or the raw
//! chunk): two nodes that compress one chunk differently (another zstd level
//! or version) encrypt different bytes under different nonces, and a nonce
//! repeats under a key only with the very same bytes (same ciphertext). The
//! chunks sealed before (nonce = the first 24 bytes of the address, which
//! depends on the plaintext only) still open: the decoder takes the nonce
//! from the object's header. A manifest's nonce is
//! `HMAC-SHA256(manifest nonce key, aad || 0 || plaintext)[..24]` (a synthetic
//! IV: the same manifest sealed twice is the same object, so a retried
//! upload finds its own manifest identical). The formats are in
//! docs/STORE.md ("Encryption").

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::id::SnapshotId;

/// The AEAD of sealed chunks and manifests, as envelopes name it.
pub const ALG: &str = "xchacha20poly1305";
/// Master key length.
pub const KEY_LEN: usize = 32;
/// Nonce length (XChaCha20).
pub const NONCE_LEN: usize = 24;
/// Poly1305 tag length.
pub const TAG_LEN: usize = 16;
const HKDF_SALT: &[u8] = b"torpor-store-v1";
const MANIFEST_AAD_PREFIX: &[u8] = b"torpor-sealed-manifest-v1\0";
const INTENT_AAD_PREFIX: &[u8] = b"torpor-sealed-intent-v1\0";

/// A key id: `[A-Za-z0-9][A-Za-z0-9._-]*`, at most 64 characters (it is a
/// path segment of chunk objects and goes into chunk headers).
pub fn check_key_id(id: &str) -> std::result::Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("key id {id:?} must be 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit"))
    }
}

/// A master key's derived subkeys. Key material is zeroed when dropped.
pub struct Key {
    id: String,
    address: Zeroizing<[u8; 32]>,
    chunk: XChaCha20Poly1305,
    manifest: XChaCha20Poly1305,
    manifest_nonce: Zeroizing<[u8; 32]>,
    chunk_nonce: Zeroizing<[u8; 32]>,
    lease_mac: Zeroizing<[u8; 32]>,
    check: String,
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length: new_from_slice cannot fail.
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

impl Key {
    /// Derive the subkeys of `master` under `id`.
    pub fn new(id: &str, master: &[u8; KEY_LEN]) -> std::result::Result<Key, String> {
        check_key_id(id)?;
        if master.iter().all(|b| *b == 0) {
            return Err(format!("key {id:?} is all zeros"));
        }
        let hk = hkdf::Hkdf::<Sha256>::new(Some(HKDF_SALT), master);
        let expand = |info: &str| -> Zeroizing<[u8; 32]> {
            let mut out = Zeroizing::new([0u8; 32]);
            // 32 bytes ≤ 255 × 32: expand cannot fail.
            let _ = hk.expand(info.as_bytes(), &mut out[..]);
            out
        };
        let chunk_key = expand("chunk aead");
        let manifest_key = expand("manifest aead");
        let check = expand("key check");
        Ok(Key {
            id: id.to_string(),
            address: expand("chunk address"),
            chunk: XChaCha20Poly1305::new(&(*chunk_key).into()),
            manifest: XChaCha20Poly1305::new(&(*manifest_key).into()),
            manifest_nonce: expand("manifest nonce"),
            chunk_nonce: expand("chunk nonce"),
            lease_mac: expand("lease mac"),
            check: hex::encode(&check[..8]),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// 16 hex characters derived from the key (not secret): two nodes whose
    /// key `k1` has the same check value have the same key.
    pub fn check_value(&self) -> &str {
        &self.check
    }

    /// The object name (hex HMAC-SHA256) of the chunk whose plaintext has sha256 `digest` (hex).
    pub fn chunk_address(&self, digest: &str) -> String {
        hex::encode(hmac(&self.address[..], &[b"sha256:", digest.as_bytes()]))
    }

    /// The nonce of a chunk object: an HMAC of everything the object holds
    /// before its nonce (`head`: magic, version, flags, lengths, key id),
    /// its address and the exact bytes encrypted (`payload`). Different
    /// bytes under one key never share a nonce (but for an HMAC collision);
    /// the same bytes give the same object (deduplication, retried uploads).
    pub(crate) fn chunk_nonce(&self, head: &[u8], address: &str, payload: &[u8]) -> [u8; NONCE_LEN] {
        let len = (payload.len() as u64).to_le_bytes();
        let mac = hmac(&self.chunk_nonce[..], &[&b"torpor-chunk-nonce-v2\0"[..], head, address.as_bytes(), &[0], &len, payload]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&mac[..NONCE_LEN]);
        nonce
    }

    /// HMAC-SHA256 of an actor lease object's `body` (its canonical JSON
    /// without the MAC) for the lease object at `path`, hex.
    pub fn lease_mac(&self, path: &str, body: &[u8]) -> String {
        hex::encode(hmac(&self.lease_mac[..], &[&b"torpor-lease-v1\0"[..], path.as_bytes(), &[0], body]))
    }

    /// Does `mac` (hex) authenticate `body` at `path`? Constant time.
    pub fn verify_lease_mac(&self, path: &str, body: &[u8], mac: &str) -> bool {
        let Ok(tag) = hex::decode(mac) else { return false };
        let Ok(mut m) = <HmacSha256 as KeyInit>::new_from_slice(&self.lease_mac[..]) else { return false };
        for p in [&b"torpor-lease-v1\0"[..], path.as_bytes(), &[0], body] {
            m.update(p);
        }
        m.verify_slice(&tag).is_ok()
    }

    /// Encrypt `buf[start..]` in place (AAD: `buf[..start]` then `extra_aad`)
    /// and append the tag.
    pub(crate) fn seal_chunk(
        &self,
        nonce: &[u8; NONCE_LEN],
        buf: &mut Vec<u8>,
        start: usize,
        extra_aad: &[u8],
    ) -> std::result::Result<(), String> {
        let (head, body) = buf.split_at_mut(start);
        let aad = [&head[..], extra_aad].concat();
        let tag = self
            .chunk
            .encrypt_inout_detached(&XNonce::from(*nonce), &aad, body.into())
            .map_err(|_| "chunk too large to encrypt".to_string())?;
        buf.extend_from_slice(&tag);
        Ok(())
    }

    /// Decrypt `payload` (ciphertext || tag) with AAD `aad`.
    pub(crate) fn open_chunk(&self, nonce: &[u8], aad: &[u8], payload: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let nonce = XNonce::try_from(nonce).map_err(|_| format!("nonce is {} bytes, not {NONCE_LEN}", nonce.len()))?;
        if payload.len() < TAG_LEN {
            return Err(format!("payload is {} bytes, shorter than its {TAG_LEN}-byte tag", payload.len()));
        }
        let (ct, tag) = payload.split_at(payload.len() - TAG_LEN);
        let tag = chacha20poly1305::Tag::try_from(tag).map_err(|_| "bad tag length".to_string())?;
        let mut out = ct.to_vec();
        self.chunk
            .decrypt_inout_detached(&nonce, aad, out.as_mut_slice().into(), &tag)
            .map_err(|_| format!("fails authentication under key {:?} (tampered or damaged)", self.id))?;
        Ok(out)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({} check {})", self.id, self.check)
    }
}

/// The keys of a node: which one seals uploads, which ones open downloads.
/// Empty: the object tier is not encrypted.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: BTreeMap<String, Arc<Key>>,
    active: Option<String>,
    /// Also read (restore from) manifests the object tier holds unencrypted
    /// (uploaded before encryption was turned on). Off, a keyring refuses
    /// them: anyone who can write the bucket could plant one.
    pub accept_unencrypted: bool,
}

impl Keyring {
    /// A ring of `keys`; `active` names the key uploads are sealed with
    /// (default: the only key). Ids must be unique.
    pub fn new(keys: Vec<Key>, active: Option<&str>, accept_unencrypted: bool) -> std::result::Result<Keyring, String> {
        let mut map = BTreeMap::new();
        for k in keys {
            let id = k.id.clone();
            if map.insert(id.clone(), Arc::new(k)).is_some() {
                return Err(format!("key id {id:?} is given twice"));
            }
        }
        let active = match active {
            Some(a) if map.contains_key(a) => Some(a.to_string()),
            Some(a) => return Err(format!("active key {a:?} is not one of the keys ({})", ids(&map))),
            None if map.len() == 1 => map.keys().next().cloned(),
            None if map.is_empty() => None,
            None => return Err(format!("several keys ({}) and no active one: name the key new uploads use", ids(&map))),
        };
        Ok(Keyring { keys: map, active, accept_unencrypted })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key uploads are sealed with (`None`: uploads are plaintext).
    pub fn active(&self) -> Option<&Arc<Key>> {
        self.active.as_ref().and_then(|a| self.keys.get(a))
    }

    pub fn get(&self, id: &str) -> Option<&Arc<Key>> {
        self.keys.get(id)
    }

    /// `k1 (check …), k2 (check …)`, or `none`.
    pub fn describe(&self) -> String {
        if self.keys.is_empty() {
            return "none".into();
        }
        self.keys.values().map(|k| format!("{} (check {})", k.id, k.check)).collect::<Vec<_>>().join(", ")
    }

    /// Why a snapshot sealed under `key_id` (check value `check`) cannot be
    /// opened here, or `None` when this ring has that key.
    fn missing(&self, key_id: &str, check: &str) -> Option<String> {
        match self.keys.get(key_id) {
            None if self.keys.is_empty() => Some("which this node does not have (no keys configured: [store.encryption])".to_string()),
            None => Some(format!("which this node does not have (its keys: {})", ids(&self.keys))),
            Some(k) if !check.is_empty() && k.check != check => {
                Some(format!("but this node's key {key_id:?} is a different key (check value {}, the snapshot's {check})", k.check))
            }
            Some(_) => None,
        }
    }
}

fn ids(map: &BTreeMap<String, Arc<Key>>) -> String {
    map.keys().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("keys", &self.describe())
            .field("active", &self.active)
            .field("accept_unencrypted", &self.accept_unencrypted)
            .finish()
    }
}

impl PartialEq for Keyring {
    fn eq(&self, other: &Self) -> bool {
        self.describe() == other.describe() && self.active == other.active && self.accept_unencrypted == other.accept_unencrypted
    }
}

/// Parse a master key written as 64 hex characters (surrounding whitespace ignored).
pub fn parse_key_hex(s: &str) -> std::result::Result<Zeroizing<[u8; KEY_LEN]>, String> {
    let t = s.trim();
    let mut out = Zeroizing::new([0u8; KEY_LEN]);
    if t.len() != 2 * KEY_LEN {
        return Err(format!("expected {} hex characters (a {KEY_LEN}-byte key), found {}", 2 * KEY_LEN, t.len()));
    }
    hex::decode_to_slice(t, &mut out[..]).map_err(|e| format!("not hex: {e}"))?;
    Ok(out)
}

/// Read a master key file: exactly 32 raw bytes, or 64 hex characters
/// (optionally followed by a newline). The file must be a regular file not
/// readable or writable by group or others.
pub fn load_key_file(path: &Path) -> std::result::Result<Zeroizing<[u8; KEY_LEN]>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("key file {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("key file {} is not a regular file", path.display()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "key file {} is accessible by group or others (mode {mode:04o}): chmod 600 it (and check who could have read it)",
            path.display()
        ));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(format!("key file {} is owned by uid {}, not by this process (uid {euid}) or root", path.display(), meta.uid()));
    }
    let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| format!("key file {}: {e}", path.display()))?);
    parse_key_bytes(&bytes, &format!("key file {}", path.display()))
}

/// A master key as a key file or descriptor holds it: exactly 32 raw bytes,
/// or 64 hex characters (optionally followed by a newline). `what` names
/// the source in errors.
pub fn parse_key_bytes(bytes: &[u8], what: &str) -> std::result::Result<Zeroizing<[u8; KEY_LEN]>, String> {
    if bytes.len() == KEY_LEN {
        let mut out = Zeroizing::new([0u8; KEY_LEN]);
        out.copy_from_slice(bytes);
        return Ok(out);
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("{what}: expected {KEY_LEN} raw bytes or {} hex characters, found {} bytes", 2 * KEY_LEN, bytes.len()))?;
    parse_key_hex(text).map_err(|e| format!("{what}: {e} (or exactly {KEY_LEN} raw bytes)"))
}

/// Read a master key from open descriptor `fd` (a pipe or a file the
/// service manager passed), then close it. At most 4 KiB are read; the key
/// is what [`parse_key_bytes`] takes. Descriptors 0-2 are refused.
pub fn load_key_fd(fd: i32) -> std::result::Result<Zeroizing<[u8; KEY_LEN]>, String> {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let what = format!("key descriptor {fd}");
    if fd < 3 {
        return Err(format!("{what}: 0, 1 and 2 are stdin/stdout/stderr, not a key"));
    }
    // SAFETY: fcntl(F_GETFD) only queries the descriptor table entry.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!("{what}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is open (checked above) and is handed to this process
    // for the key alone: it is owned (and closed) here, nothing else uses it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(owned);
    let mut bytes = Zeroizing::new(Vec::with_capacity(128));
    (&mut f).take(4096).read_to_end(&mut bytes).map_err(|e| format!("{what}: {e}"))?;
    parse_key_bytes(&bytes, &what)
}

// ----- sealed manifests -----

/// A manifest in the object tier sealed under a key: the cleartext names the
/// scheme, the key and the snapshot; the ciphertext is `manifest.json`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    sealed: u32,
    snapshot: String,
    alg: String,
    key_id: String,
    key_check: String,
    nonce: String,
    ciphertext: String,
}

const ENVELOPE_FORMAT: u32 = 1;

/// Is this object-tier manifest sealed (a JSON object with a top-level
/// `sealed` member, whatever the order of its members)? Plaintext manifests
/// are `{"manifest": …, "sha256": …}`.
pub fn is_sealed(bytes: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        sealed: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(bytes).is_ok_and(|p| p.sealed.is_some())
}

fn manifest_aad(key_id: &str, id: &SnapshotId) -> Vec<u8> {
    let mut aad = MANIFEST_AAD_PREFIX.to_vec();
    for part in [ALG, key_id, &id.to_string()] {
        aad.extend_from_slice(part.as_bytes());
        aad.push(0);
    }
    aad
}

/// Encrypt `plain` under the key's manifest subkey with a synthetic nonce
/// (`HMAC(K_mnonce, aad || 0 || plain)[..24]`): (nonce, ciphertext || tag).
fn seal_siv(key: &Key, aad: &[u8], plain: &[u8]) -> std::result::Result<([u8; NONCE_LEN], Vec<u8>), String> {
    let mac = hmac(&key.manifest_nonce[..], &[aad, &[0], plain]);
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&mac[..NONCE_LEN]);
    let mut buf = plain.to_vec();
    let tag = key
        .manifest
        .encrypt_inout_detached(&XNonce::from(nonce), aad, buf.as_mut_slice().into())
        .map_err(|_| "too large to encrypt".to_string())?;
    buf.extend_from_slice(&tag);
    Ok((nonce, buf))
}

fn intent_aad(key_id: &str, intent: &str) -> Vec<u8> {
    let mut aad = INTENT_AAD_PREFIX.to_vec();
    for part in [ALG, key_id, intent] {
        aad.extend_from_slice(part.as_bytes());
        aad.push(0);
    }
    aad
}

/// Seal the chunk list of upload intent `intent` (its object's id) under
/// `key`: (nonce hex, base64 of ciphertext || tag). The AAD binds the key
/// id and the intent id.
pub fn seal_intent(key: &Key, intent: &str, plain: &[u8]) -> Result<(String, String)> {
    let (nonce, buf) =
        seal_siv(key, &intent_aad(&key.id, intent), plain).map_err(|e| Error::Internal(format!("upload intent {intent}: {e}")))?;
    Ok((hex::encode(nonce), base64::engine::general_purpose::STANDARD.encode(&buf)))
}

/// Open what [`seal_intent`] sealed.
pub fn open_intent(key: &Key, intent: &str, nonce_hex: &str, ciphertext_b64: &str) -> std::result::Result<Vec<u8>, String> {
    let mut nonce = [0u8; NONCE_LEN];
    hex::decode_to_slice(nonce_hex, &mut nonce).map_err(|e| format!("nonce: {e}"))?;
    let mut buf = base64::engine::general_purpose::STANDARD.decode(ciphertext_b64.as_bytes()).map_err(|e| format!("ciphertext: {e}"))?;
    if buf.len() < TAG_LEN {
        return Err(format!("ciphertext is {} bytes, shorter than its tag", buf.len()));
    }
    let tag = buf.split_off(buf.len() - TAG_LEN);
    let tag = chacha20poly1305::Tag::try_from(&tag[..]).map_err(|_| "bad tag length".to_string())?;
    key.manifest
        .decrypt_inout_detached(&XNonce::from(nonce), &intent_aad(&key.id, intent), buf.as_mut_slice().into(), &tag)
        .map_err(|_| format!("fails authentication under key {:?} (tampered or damaged)", key.id))?;
    Ok(buf)
}

/// Seal the `manifest.json` bytes of snapshot `id` under `key`. Deterministic.
pub fn seal_manifest(key: &Key, id: &SnapshotId, plain: &[u8]) -> Result<Vec<u8>> {
    let aad = manifest_aad(&key.id, id);
    let (nonce, buf) = seal_siv(key, &aad, plain).map_err(|e| Error::Internal(format!("snapshot {id}: manifest {e}")))?;
    let env = Envelope {
        sealed: ENVELOPE_FORMAT,
        snapshot: id.to_string(),
        alg: ALG.to_string(),
        key_id: key.id.clone(),
        key_check: key.check.clone(),
        nonce: hex::encode(nonce),
        ciphertext: base64::engine::general_purpose::STANDARD.encode(&buf),
    };
    serde_json::to_vec(&env).map_err(|e| Error::Internal(format!("snapshot {id}: serialize sealed manifest: {e}")))
}

/// The key id a sealed manifest names (without opening it).
pub fn sealed_key_id(bytes: &[u8]) -> Option<String> {
    if !is_sealed(bytes) {
        return None;
    }
    serde_json::from_slice::<Envelope>(bytes).ok().map(|e| e.key_id)
}

/// An object-tier manifest, opened.
#[derive(Debug)]
pub struct Opened {
    /// The `manifest.json` bytes.
    pub plain: Vec<u8>,
    /// The key it was sealed with (`None`: it was stored unencrypted).
    pub key: Option<Arc<Key>>,
}

/// Open a manifest read from the object tier for snapshot `id`: a sealed one
/// is authenticated and decrypted with the ring's key of that id (unknown
/// key: [`Error::UnknownKey`]; failed authentication: [`Error::Corrupt`]);
/// a plaintext one is returned as is (the caller decides whether to accept
/// it, see [`Keyring::accept_unencrypted`]).
pub fn open_manifest(ring: &Keyring, id: &SnapshotId, bytes: &[u8]) -> Result<Opened> {
    if !is_sealed(bytes) {
        return Ok(Opened { plain: bytes.to_vec(), key: None });
    }
    let corrupt = |what: String| Error::Corrupt { id: id.clone(), what: format!("sealed manifest in the object tier: {what}") };
    let env: Envelope =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("envelope is not valid ({} bytes): {e}", bytes.len())))?;
    if env.sealed != ENVELOPE_FORMAT {
        return Err(corrupt(format!("unsupported envelope format {}", env.sealed)));
    }
    if env.alg != ALG {
        return Err(corrupt(format!("unsupported algorithm {:?}", env.alg)));
    }
    check_key_id(&env.key_id).map_err(corrupt)?;
    if env.snapshot != id.to_string() {
        return Err(corrupt(format!("envelope is for snapshot {}, not {id}", env.snapshot)));
    }
    if let Some(detail) = ring.missing(&env.key_id, &env.key_check) {
        return Err(Error::UnknownKey { id: id.clone(), key_id: env.key_id, detail });
    }
    let key = ring.get(&env.key_id).cloned().ok_or_else(|| Error::Internal("key vanished from the ring".into()))?;
    let mut nonce = [0u8; NONCE_LEN];
    hex::decode_to_slice(&env.nonce, &mut nonce).map_err(|e| corrupt(format!("nonce: {e}")))?;
    let mut buf =
        base64::engine::general_purpose::STANDARD.decode(env.ciphertext.as_bytes()).map_err(|e| corrupt(format!("ciphertext: {e}")))?;
    if buf.len() < TAG_LEN {
        return Err(corrupt(format!("ciphertext is {} bytes, shorter than its tag", buf.len())));
    }
    let tag = buf.split_off(buf.len() - TAG_LEN);
    let tag = chacha20poly1305::Tag::try_from(&tag[..]).map_err(|_| corrupt("bad tag length".into()))?;
    key.manifest
        .decrypt_inout_detached(&XNonce::from(nonce), &manifest_aad(&env.key_id, id), buf.as_mut_slice().into(), &tag)
        .map_err(|_| corrupt(format!("fails authentication under key {:?} (tampered or damaged)", env.key_id)))?;
    Ok(Opened { plain: buf, key: Some(key) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ActorName;

    pub(crate) fn key(id: &str, byte: u8) -> Key {
        Key::new(id, &[byte; KEY_LEN]).unwrap()
    }

    fn sid(a: &str, g: u64) -> SnapshotId {
        SnapshotId::new(ActorName::new(a).unwrap(), g)
    }

    #[test]
    fn sealed_intents_open_only_with_their_key_and_id() {
        let k = key("k1", 1);
        let plain = br#"["aa","bb"]"#;
        let (nonce, ct) = seal_intent(&k, "0123", plain).unwrap();
        assert_eq!(seal_intent(&k, "0123", plain).unwrap(), (nonce.clone(), ct.clone()), "deterministic");
        assert_eq!(open_intent(&k, "0123", &nonce, &ct).unwrap(), plain);
        assert!(open_intent(&k, "4567", &nonce, &ct).unwrap_err().contains("authentication"), "bound to the intent id");
        assert!(open_intent(&key("k1", 2), "0123", &nonce, &ct).is_err(), "another key");
        assert!(open_intent(&k, "0123", "zz", &ct).unwrap_err().contains("nonce"));
        // Not the manifest AAD: a manifest's envelope cannot pass as an intent.
        assert_ne!(intent_aad("k1", "x"), manifest_aad("k1", &sid("x", 1)));
    }

    #[test]
    fn key_ids_and_rings() {
        for good in ["k1", "2026-01.prod_A", "a"] {
            check_key_id(good).unwrap();
        }
        for bad in ["", "-k", ".k", "k/1", "k 1", &"k".repeat(65), "ké"] {
            assert!(check_key_id(bad).is_err(), "{bad:?}");
        }
        assert!(Key::new("z", &[0; 32]).unwrap_err().contains("zeros"));
        let r = Keyring::new(vec![key("k1", 1)], None, false).unwrap();
        assert_eq!(r.active().unwrap().id(), "k1");
        assert!(Keyring::new(vec![key("k1", 1), key("k2", 2)], None, false).unwrap_err().contains("no active"));
        assert!(Keyring::new(vec![key("k1", 1)], Some("k9"), false).unwrap_err().contains("k9"));
        assert!(Keyring::new(vec![key("k1", 1), key("k1", 2)], Some("k1"), false).unwrap_err().contains("twice"));
        let r = Keyring::new(vec![key("k1", 1), key("k2", 2)], Some("k2"), false).unwrap();
        assert_eq!(r.active().unwrap().id(), "k2");
        assert!(Keyring::default().active().is_none());
        let dbg = format!("{r:?}");
        assert!(dbg.contains("k1") && !dbg.contains("0101"), "{dbg}");
    }

    #[test]
    fn derivations_are_deterministic_and_key_separated() {
        let (a, a2, b) = (key("k1", 1), key("k1", 1), key("k1", 2));
        let d = crate::chunk::sha256_hex(b"chunk");
        assert_eq!(a.chunk_address(&d), a2.chunk_address(&d), "same key, same address: dedup works");
        assert_ne!(a.chunk_address(&d), b.chunk_address(&d));
        assert_ne!(a.chunk_address(&d), d, "the address is not the plain digest");
        assert_eq!(a.chunk_address(&d).len(), 64);
        assert_eq!(a.check_value(), a2.check_value());
        assert_ne!(a.check_value(), b.check_value());
        // Another id, same material: same subkeys (the id only names it).
        assert_eq!(key("k7", 1).chunk_address(&d), a.chunk_address(&d));
    }

    #[test]
    fn key_material_from_files_and_hex() {
        let dir = tempfile::tempdir().unwrap();
        let hexkey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let p = dir.path().join("k");
        std::fs::write(&p, format!("{hexkey}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(hex::encode(*load_key_file(&p).unwrap()), hexkey);
        std::fs::write(&p, [7u8; 32]).unwrap();
        assert_eq!(*load_key_file(&p).unwrap(), [7u8; 32]);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = load_key_file(&p).unwrap_err();
        assert!(e.contains("group or others") && e.contains("0640") && e.contains(p.to_str().unwrap()), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        std::fs::write(&p, b"short").unwrap();
        let e = load_key_file(&p).unwrap_err();
        assert!(e.contains("64 hex") || e.contains("hex characters"), "{e}");
        assert!(load_key_file(&dir.path().join("missing")).unwrap_err().contains("missing"));
        assert!(load_key_file(dir.path()).unwrap_err().contains("regular file"));
        assert!(parse_key_hex(&"zz".repeat(32)).unwrap_err().contains("not hex"));
        assert!(parse_key_hex("abcd").unwrap_err().contains("64"));
    }

    #[test]
    fn manifest_seal_open_round_trip_and_tamper() {
        let ring = Keyring::new(vec![key("k1", 1), key("k2", 2)], Some("k2"), false).unwrap();
        let id = sid("ns/a", 3);
        let plain = br#"{"manifest":{"x":1},"sha256":"00"}"#.to_vec();
        let k2 = ring.active().unwrap().clone();
        let sealed = seal_manifest(&k2, &id, &plain).unwrap();
        assert!(is_sealed(&sealed));
        assert!(!is_sealed(&plain));
        assert_eq!(seal_manifest(&k2, &id, &plain).unwrap(), sealed, "deterministic: a retried upload writes the same object");
        assert_eq!(sealed_key_id(&sealed).as_deref(), Some("k2"));
        let text = String::from_utf8(sealed.clone()).unwrap();
        assert!(!text.contains("\"x\""), "the manifest is not readable in the envelope: {text}");
        let o = open_manifest(&ring, &id, &sealed).unwrap();
        assert_eq!(o.plain, plain);
        assert_eq!(o.key.unwrap().id(), "k2");
        // Plaintext passes through, marked as such.
        assert!(open_manifest(&ring, &id, &plain).unwrap().key.is_none());

        // Any byte of the envelope flipped: refused (as corrupt, or as a
        // different key when the key check itself was hit), never accepted.
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            match open_manifest(&ring, &id, &bad) {
                // No longer recognisable as sealed: taken for a plaintext
                // manifest, which does not parse (and a keyring refuses
                // plaintext manifests anyway).
                Ok(o) if o.key.is_none() && !is_sealed(&bad) => {
                    assert!(crate::manifest::Manifest::parse(&o.plain, None).is_err(), "byte {i}")
                }
                Ok(o) => panic!("byte {i} flipped was accepted: {:?}", String::from_utf8_lossy(&o.plain)),
                Err(Error::Corrupt { id: eid, .. }) | Err(Error::UnknownKey { id: eid, .. }) => assert_eq!(eid, id),
                Err(e) => panic!("byte {i}: unexpected error {e}"),
            }
        }
        // Moved to another snapshot's path: refused.
        let other = sid("ns/a", 4);
        let e = open_manifest(&ring, &other, &sealed).unwrap_err().to_string();
        assert!(e.contains("ns/a@4") && e.contains("ns/a@3"), "{e}");
        // The snapshot field rewritten to match: authentication fails.
        let moved = text.replace("ns/a@3", "ns/a@4");
        let e = open_manifest(&ring, &other, moved.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("authentication") && e.contains("ns/a@4"), "{e}");

        // A ring without k2, an empty ring, a ring whose k2 is another key.
        let only1 = Keyring::new(vec![key("k1", 1)], None, false).unwrap();
        let e = open_manifest(&only1, &id, &sealed).unwrap_err();
        assert!(matches!(e, Error::UnknownKey { .. }));
        let e = e.to_string();
        assert!(e.contains("ns/a@3") && e.contains("\"k2\"") && e.contains("does not have") && e.contains("k1"), "{e}");
        let e = open_manifest(&Keyring::default(), &id, &sealed).unwrap_err().to_string();
        assert!(e.contains("\"k2\"") && e.contains("no keys configured"), "{e}");
        let wrong = Keyring::new(vec![key("k2", 9)], None, false).unwrap();
        let e = open_manifest(&wrong, &id, &sealed).unwrap_err().to_string();
        assert!(e.contains("\"k2\"") && e.contains("different key"), "{e}");
    }
}
