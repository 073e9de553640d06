//! Entry points for fuzzing (the cargo-fuzz targets in `fuzz/` at the
//! repository root) and for the test that replays their corpora
//! (`tests/fuzz_corpus.rs`): each takes arbitrary bytes and answers `Err`
//! only for a broken invariant. Malformed input must be refused with an
//! error, never panic.

use torpor_store::{crypto, ActorName, Key, Keyring, Manifest, SnapshotId};

/// A fuzz target: arbitrary bytes in, `Err` for a broken invariant.
pub type Target = fn(&[u8]) -> Result<(), String>;

/// The fuzz targets, by name (`fuzz/fuzz_targets/<name>.rs`, corpora in
/// `fuzz/corpus/<name>/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("manifest", manifest),
    ("manifest_fields", manifest_fields),
    ("envelope", envelope),
    ("config", config),
    ("lease", lease),
    ("chunk", chunk),
];

fn id() -> Result<SnapshotId, String> {
    Ok(SnapshotId::new(ActorName::new("fuzz/actor").map_err(|e| e.to_string())?, 1))
}

/// `manifest.json` bytes as they come from a local copy or a bucket.
pub fn manifest(data: &[u8]) -> Result<(), String> {
    let id = id()?;
    if let Ok(m) = Manifest::parse(data, None) {
        // What parses serializes again, and that parses to the same.
        let (bytes, _) = m.to_bytes()?;
        let again = Manifest::parse(&bytes, None).map_err(|e| format!("a parsed manifest does not parse again: {e}"))?;
        if again != m {
            return Err("a manifest changed through a round trip".into());
        }
    }
    let _ = Manifest::parse(data, Some(&id));
    Ok(())
}

/// A manifest's fields (JSON of the inner manifest) given a valid
/// self-digest, so that the checks past it (entry paths, sizes, chunk
/// digests, formats) see the input.
pub fn manifest_fields(data: &[u8]) -> Result<(), String> {
    let Ok(m) = serde_json::from_slice::<Manifest>(data) else { return Ok(()) };
    let Ok((bytes, _)) = m.to_bytes() else { return Ok(()) };
    if let Ok(parsed) = Manifest::parse(&bytes, None) {
        for e in &parsed.entries {
            let p = std::path::Path::new(&e.path);
            if p.is_absolute() || p.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
                return Err(format!("a manifest entry escapes its directory: {:?}", e.path));
            }
        }
    }
    Ok(())
}

/// An object-tier manifest (sealed envelope or plaintext) opened with a
/// keyring, as a restore or an import does.
pub fn envelope(data: &[u8]) -> Result<(), String> {
    let id = id()?;
    let key = Key::new("k1", &[7u8; 32])?;
    let ring = Keyring::new(vec![key], Some("k1"), false)?;
    let _ = crypto::is_sealed(data);
    let _ = crypto::sealed_key_id(data);
    if let Ok(o) = crypto::open_manifest(&ring, &id, data) {
        if o.key.is_some() && !crypto::is_sealed(data) {
            return Err("a plaintext manifest opened as sealed".into());
        }
        let _ = Manifest::parse(&o.plain, Some(&id));
    }
    let _ = crypto::open_manifest(&Keyring::default(), &id, data);
    Ok(())
}

/// An actor's lease object (`lease.json`) as the object tier holds it,
/// read without keys and with a keyring (its MAC checked), and every time
/// in it written for a message (issue 38: an expiry past year 9999
/// panicked the daemon there).
pub fn lease(data: &[u8]) -> Result<(), String> {
    use torpor_store::lease_object::{read_lease, seal_lease};
    use torpor_store::{unix_ms_text, MAX_UNIX_MS};
    let actor = ActorName::new("fuzz/actor").map_err(|e| e.to_string())?;
    let path = "objects/actors/fuzz/actor/lease.json";
    let ring = Keyring::new(vec![Key::new("k1", &[7u8; 32])?], Some("k1"), false)?;
    for r in [&Keyring::default(), &ring] {
        let Ok(doc) = read_lease(r, &actor, path, data) else { continue };
        for ms in [doc.acquired_unix_ms, doc.expires_unix_ms, doc.written_unix_ms] {
            if ms > MAX_UNIX_MS {
                return Err(format!("a lease time past year 9999 was accepted: {ms}"));
            }
            let _ = unix_ms_text(ms);
        }
        // What is read seals again, and that reads back the same.
        let mut again = doc.clone();
        let bytes = seal_lease(r, path, &mut again).map_err(|e| e.to_string())?;
        let back = read_lease(r, &actor, path, &bytes).map_err(|e| format!("a lease sealed again does not read back: {e:?}"))?;
        if back != again {
            return Err("a lease changed through a round trip".into());
        }
    }
    if let Some(n) = data.get(..8) {
        let mut b = [0u8; 8];
        b.copy_from_slice(n);
        let _ = unix_ms_text(u64::from_le_bytes(b));
    }
    Ok(())
}

/// A chunk object as the object tier holds it (after a 4-byte little-endian
/// length the manifest claims), decoded plain and sealed: never more than
/// the claimed length (at most the largest chunk) comes out.
pub fn chunk(data: &[u8]) -> Result<(), String> {
    use torpor_store::chunk::{decode, decode_sealed, sha256_hex, MAX_CHUNK_BYTES};
    let Some((len, object)) = data.split_first_chunk::<4>() else { return Ok(()) };
    let claimed = u32::from_le_bytes(*len);
    let key = Key::new("k1", &[7u8; 32])?;
    // The digest of what the object would decode to is unknown to the
    // fuzzer: a wrong one makes every decode end at the digest check,
    // after the header, the AEAD and zstd have run.
    let digest = sha256_hex(object);
    let address = key.chunk_address(&digest);
    for plain in [decode(object, &digest, claimed), decode_sealed(object, &digest, claimed, &key, &address)].into_iter().flatten() {
        if plain.len() != claimed as usize || claimed > MAX_CHUNK_BYTES {
            return Err(format!("a chunk decoded to {} bytes for a claim of {claimed}", plain.len()));
        }
    }
    Ok(())
}

/// The daemon's config file, and the duration and size syntax.
pub fn config(data: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(data) else { return Ok(()) };
    if let Ok(c) = crate::config::Config::parse(text) {
        if c.shutdown_timeout > crate::config::MAX_DURATION {
            return Err("a duration past the bound was accepted".into());
        }
        let _ = c.store_config();
    }
    if let Ok(d) = crate::config::parse_duration(text) {
        if d > crate::config::MAX_DURATION {
            return Err(format!("{text:?} parsed to {d:?}, past the bound"));
        }
    }
    let _ = crate::config::parse_size(text);
    Ok(())
}
