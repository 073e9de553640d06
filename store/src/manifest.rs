//! Snapshot manifests.
//!
//! `manifest.json` is `{"manifest": {...}, "sha256": "<hex>"}` where `sha256`
//! is the digest of the compact JSON serialization of `manifest` (a
//! self-check, so a garbled manifest is refused even where no database
//! remembers its digest). The *manifest digest* of a snapshot is the sha256 of
//! the whole `manifest.json` file; the database records it and every read of
//! the manifest (local or remote) is checked against it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::chunk::{is_digest, sha256_hex, ChunkRef};
use crate::config::ChunkingConfig;
use crate::id::{ActorName, SnapshotId};

pub const MANIFEST_FORMAT: u32 = 1;
pub const MANIFEST_FILE: &str = "manifest.json";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Dir,
    File,
}

/// A file or directory of the snapshot tree, at a relative '/'-separated path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Bytes (files; 0 for directories).
    pub size: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<ChunkRef>,
}

/// Unused: always `null`. The plaintext manifest is the same bytes on every
/// node and in both tiers (its digest names the snapshot's content); whether
/// and under which key the object tier's copy is sealed is said by that
/// copy's envelope (see `crypto`), and recorded per node with the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptionInfo {
    pub algorithm: String,
    pub key_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub actor: ActorName,
    pub generation: u64,
    /// Unix time of the commit, milliseconds.
    pub created_ms: u64,
    pub labels: BTreeMap<String, String>,
    /// "fastcdc-2020" with these sizes.
    pub chunker: String,
    pub chunking: ChunkingConfig,
    /// Chunk address hash ("sha256", of the uncompressed chunk).
    pub hash: String,
    pub encryption: Option<EncryptionInfo>,
    /// Sum of the file sizes.
    pub logical_bytes: u64,
    /// Directories before their contents, sorted by path.
    pub entries: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Wrapper {
    manifest: Manifest,
    sha256: String,
}

impl Manifest {
    pub fn id(&self) -> SnapshotId {
        SnapshotId::new(self.actor.clone(), self.generation)
    }

    /// Distinct chunks with their sizes (first occurrence order).
    pub fn unique_chunks(&self) -> Vec<ChunkRef> {
        let mut seen = std::collections::HashSet::new();
        self.entries.iter().flat_map(|e| e.chunks.iter()).filter(|c| seen.insert(c.digest.clone())).cloned().collect()
    }

    /// The `manifest.json` bytes and their digest.
    pub fn to_bytes(&self) -> Result<(Vec<u8>, String), String> {
        let body = serde_json::to_vec(self).map_err(|e| format!("serialize manifest: {e}"))?;
        let wrapper = Wrapper { manifest: self.clone(), sha256: sha256_hex(&body) };
        let bytes = serde_json::to_vec(&wrapper).map_err(|e| format!("serialize manifest: {e}"))?;
        let digest = sha256_hex(&bytes);
        Ok((bytes, digest))
    }

    /// Parse and check `manifest.json` bytes: its self-digest, its format, its
    /// entries (safe relative paths, sizes matching chunks, well-formed
    /// digests), and, when given, that it is the manifest of `expect`.
    /// The error text says what is wrong; callers name the snapshot.
    pub fn parse(bytes: &[u8], expect: Option<&SnapshotId>) -> Result<Manifest, String> {
        let wrapper: Wrapper = serde_json::from_slice(bytes).map_err(|e| format!("manifest is not valid ({} bytes): {e}", bytes.len()))?;
        let m = wrapper.manifest;
        if m.format != MANIFEST_FORMAT {
            return Err(format!("unsupported manifest format {}", m.format));
        }
        let body = serde_json::to_vec(&m).map_err(|e| format!("serialize manifest: {e}"))?;
        if sha256_hex(&body) != wrapper.sha256 {
            return Err("manifest self-digest does not match its contents (garbled)".to_string());
        }
        if let Some(expect) = expect {
            if &m.id() != expect {
                return Err(format!("manifest is for snapshot {}, not {expect}", m.id()));
            }
        }
        crate::time::check_unix_ms("created_ms", m.created_ms)?;
        if m.hash != "sha256" {
            return Err(format!("unsupported chunk hash {:?}", m.hash));
        }
        if m.encryption.is_some() {
            return Err(
                "manifest sets \"encryption\", which this format leaves null (a sealed manifest is an envelope around a plaintext one)"
                    .to_string(),
            );
        }
        let mut total = 0u64;
        let mut prev: Option<&str> = None;
        for e in &m.entries {
            check_rel_path(&e.path)?;
            if prev.is_some_and(|p| p >= e.path.as_str()) {
                return Err(format!("entries not sorted/unique at {:?}", e.path));
            }
            prev = Some(&e.path);
            match e.kind {
                EntryKind::Dir if !e.chunks.is_empty() || e.size != 0 => return Err(format!("directory entry {:?} has data", e.path)),
                EntryKind::File => {
                    let sum: u64 = e.chunks.iter().map(|c| c.size as u64).sum();
                    if sum != e.size {
                        return Err(format!("file {:?}: chunks add up to {sum} bytes, size says {}", e.path, e.size));
                    }
                    if let Some(c) = e.chunks.iter().find(|c| c.size > crate::chunk::MAX_CHUNK_BYTES) {
                        return Err(format!(
                            "file {:?}: chunk of {} bytes, more than the largest chunk ({} bytes)",
                            e.path,
                            c.size,
                            crate::chunk::MAX_CHUNK_BYTES
                        ));
                    }
                    if let Some(c) = e.chunks.iter().find(|c| !is_digest(&c.digest)) {
                        return Err(format!("file {:?}: malformed chunk digest {:?}", e.path, c.digest));
                    }
                    let bad_xxh3 = |x: &String| x.len() != 32 || !x.bytes().all(|b| b.is_ascii_hexdigit());
                    if let Some(c) = e.chunks.iter().find(|c| c.xxh3.as_ref().is_some_and(bad_xxh3)) {
                        return Err(format!("file {:?}: malformed chunk checksum xxh3 {:?}", e.path, c.xxh3));
                    }
                    total += e.size;
                }
                _ => {}
            }
        }
        if total != m.logical_bytes {
            return Err(format!("files add up to {total} bytes, logical_bytes says {}", m.logical_bytes));
        }
        Ok(m)
    }
}

/// A relative path with normal, non-empty components only.
pub fn check_rel_path(p: &str) -> Result<(), String> {
    if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c.is_empty() || c == "." || c == "..") || p.contains('\0') {
        return Err(format!("unsafe entry path {p:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT,
            actor: ActorName::new("ns/a").unwrap(),
            generation: 3,
            created_ms: 1,
            labels: [("k".to_string(), "v".to_string())].into(),
            chunker: "fastcdc-2020".into(),
            chunking: ChunkingConfig::default(),
            hash: "sha256".into(),
            encryption: None,
            logical_bytes: 5,
            entries: vec![
                Entry { path: "c1".into(), kind: EntryKind::Dir, mode: 0o755, size: 0, chunks: vec![] },
                Entry {
                    path: "c1/pages".into(),
                    kind: EntryKind::File,
                    mode: 0o600,
                    size: 5,
                    chunks: vec![ChunkRef { digest: sha256_hex(b"hello"), size: 5, xxh3: None }],
                },
            ],
        }
    }

    #[test]
    fn round_trip_and_damage() {
        let m = sample();
        let (bytes, digest) = m.to_bytes().unwrap();
        assert_eq!(sha256_hex(&bytes), digest);
        assert_eq!(Manifest::parse(&bytes, Some(&m.id())).unwrap(), m);
        assert!(Manifest::parse(&bytes[..bytes.len() / 2], None).unwrap_err().contains("not valid"));
        let garbled = String::from_utf8(bytes.clone()).unwrap().replace("\"size\":5", "\"size\":6");
        assert!(Manifest::parse(garbled.as_bytes(), None).unwrap_err().contains("garbled"));
        let other = SnapshotId::new(ActorName::new("ns/b").unwrap(), 3);
        assert!(Manifest::parse(&bytes, Some(&other)).unwrap_err().contains("not ns/b@3"));
        let mut evil = sample();
        evil.entries[1].path = "../x".into();
        let (evil, _) = evil.to_bytes().unwrap();
        assert!(Manifest::parse(&evil, None).unwrap_err().contains("unsafe"));
    }

    /// Issue 38 rows 5 and 6: a time past year 9999 and a chunk larger than
    /// any there is are refused at parse (they reached formatting and
    /// allocations sized by them).
    #[test]
    fn out_of_range_times_and_chunk_sizes_are_refused() {
        let mut m = sample();
        m.created_ms = crate::time::MAX_UNIX_MS + 1;
        let e = Manifest::parse(&m.to_bytes().unwrap().0, None).unwrap_err();
        assert!(e.contains("created_ms") && e.contains("year 9999"), "{e}");
        m.created_ms = crate::time::MAX_UNIX_MS;
        Manifest::parse(&m.to_bytes().unwrap().0, None).unwrap();
        let mut m = sample();
        m.entries[1].chunks[0].size = u32::MAX;
        m.entries[1].size = u32::MAX as u64;
        m.logical_bytes = u32::MAX as u64;
        let e = Manifest::parse(&m.to_bytes().unwrap().0, None).unwrap_err();
        assert!(e.contains("largest chunk"), "{e}");
    }
}
