//! Chunk objects: content-defined chunking of files, and the framed,
//! compressed object format of the object tier.
//!
//! A chunk's address is the sha256 of its *uncompressed* bytes. The object
//! stored at that address is a header followed by the payload:
//!
//! ```text
//! offset size field
//! 0      4    magic "TPCK"
//! 4      1    format version (1)
//! 5      1    flags: bit 0 = payload is zstd-compressed, bit 1 = encrypted (reserved)
//! 6      1    key id length K (0 unless encrypted; reserved for AEAD)
//! 7      1    nonce length N (0 unless encrypted; reserved for AEAD)
//! 8      4    uncompressed length, u32 little endian
//! 12     4    payload length, u32 little endian
//! 16     K    key id
//! 16+K   N    nonce
//! 16+K+N …    payload
//! ```

use std::fs::File;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::config::ChunkingConfig;
use super::error::{Error, Result};

pub const MAGIC: [u8; 4] = *b"TPCK";
pub const FORMAT_VERSION: u8 = 1;
pub const FLAG_ZSTD: u8 = 0b01;
pub const FLAG_ENCRYPTED: u8 = 0b10;
pub const HEADER_LEN: usize = 16;

/// sha256 of `data`, lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Is `s` a lower-case hex sha256?
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Encode one chunk as an object: zstd at `level` when that is smaller, raw otherwise.
pub fn encode(data: &[u8], level: i32) -> Result<Vec<u8>> {
    let raw_len = u32::try_from(data.len()).map_err(|_| Error::Internal(format!("chunk of {} bytes is too large", data.len())))?;
    let compressed = zstd::bulk::compress(data, level).map_err(|e| Error::Internal(format!("zstd compress: {e}")))?;
    let (flags, payload): (u8, &[u8]) = if compressed.len() < data.len() { (FLAG_ZSTD, &compressed) } else { (0, data) };
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(flags);
    out.push(0);
    out.push(0);
    out.extend_from_slice(&raw_len.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Decode a chunk object and verify it is the chunk `digest` of `expected_len`
/// bytes. Any mismatch is an error whose text says what is wrong (the caller
/// adds the snapshot and the chunk address).
pub fn decode(object: &[u8], digest: &str, expected_len: u32) -> std::result::Result<Vec<u8>, String> {
    if object.len() < HEADER_LEN {
        return Err(format!("object is {} bytes, shorter than the {HEADER_LEN}-byte header", object.len()));
    }
    if object[0..4] != MAGIC {
        return Err("bad magic (not a torpor chunk object)".to_string());
    }
    if object[4] != FORMAT_VERSION {
        return Err(format!("unsupported chunk format version {}", object[4]));
    }
    let flags = object[5];
    if flags & !(FLAG_ZSTD | FLAG_ENCRYPTED) != 0 {
        return Err(format!("unknown flags {flags:#04x}"));
    }
    if flags & FLAG_ENCRYPTED != 0 {
        return Err("chunk is encrypted; this store has no encryption keys".to_string());
    }
    let (key_len, nonce_len) = (object[6] as usize, object[7] as usize);
    let raw_len = u32::from_le_bytes([object[8], object[9], object[10], object[11]]);
    let payload_len = u32::from_le_bytes([object[12], object[13], object[14], object[15]]) as usize;
    let start = HEADER_LEN + key_len + nonce_len;
    if object.len() != start + payload_len {
        return Err(format!("object is {} bytes, header says {}", object.len(), start + payload_len));
    }
    if raw_len != expected_len {
        return Err(format!("header says {raw_len} bytes, the manifest {expected_len}"));
    }
    let payload = &object[start..];
    let data = if flags & FLAG_ZSTD != 0 {
        zstd::bulk::decompress(payload, raw_len as usize).map_err(|e| format!("zstd: {e}"))?
    } else {
        payload.to_vec()
    };
    if data.len() != raw_len as usize {
        return Err(format!("payload decodes to {} bytes, expected {raw_len}", data.len()));
    }
    let actual = sha256_hex(&data);
    if actual != digest {
        return Err(format!("content digest is sha256:{actual}"));
    }
    Ok(data)
}

/// One chunk of a file: its digest and length; its offset is the sum of the
/// lengths before it.
///
/// `xxh3` (XXH3-128 of the chunk, hex) checks the local copy at checkout: it
/// detects the same damage as the sha256 (torn writes, bit rot, truncation)
/// at ~15x the speed, which matters on the resume path. The sha256 stays the
/// chunk's address and is checked on everything fetched from the object tier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkRef {
    pub digest: String,
    pub size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
}

/// XXH3-128 of `data`, hex.
pub fn xxh3_hex(data: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data))
}

/// Cut a file into content-defined chunks and digest each. Blocking.
pub fn chunk_file(path: &Path, cfg: &ChunkingConfig) -> Result<(u64, Vec<ChunkRef>)> {
    let file = File::open(path).map_err(|e| Error::io("open for chunking", path, e))?;
    let mut chunks = Vec::new();
    let mut total = 0u64;
    let cdc = fastcdc::v2020::StreamCDC::new(file, cfg.min as usize, cfg.avg as usize, cfg.max as usize);
    for chunk in cdc {
        let chunk = chunk.map_err(|e| Error::io("read for chunking", path, std::io::Error::from(e)))?;
        total += chunk.length as u64;
        chunks.push(ChunkRef { digest: sha256_hex(&chunk.data), size: chunk.length as u32, xxh3: Some(xxh3_hex(&chunk.data)) });
    }
    Ok((total, chunks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let compressible = vec![7u8; 100_000];
        let random: Vec<u8> = (0..100_000).map(|_| fastrand::u8(..)).collect();
        for data in [&compressible[..], &random[..], &[][..]] {
            let d = sha256_hex(data);
            let obj = encode(data, 1).unwrap();
            assert!(obj.len() <= data.len() + HEADER_LEN);
            assert_eq!(decode(&obj, &d, data.len() as u32).unwrap(), data);
        }
        let obj = encode(&compressible, 1).unwrap();
        assert!(obj.len() < 1000, "compressible data is compressed");
        assert_eq!(obj[5], FLAG_ZSTD);
        assert_eq!(encode(&random, 1).unwrap()[5], 0, "incompressible data is stored raw");
    }

    #[test]
    fn decode_rejects_damage() {
        let data: Vec<u8> = (0..50_000).map(|i| (i % 251) as u8).collect();
        let d = sha256_hex(&data);
        let obj = encode(&data, 1).unwrap();
        let mut flipped = obj.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(decode(&flipped, &d, data.len() as u32).is_err());
        assert!(decode(&obj[..obj.len() - 1], &d, data.len() as u32).unwrap_err().contains("header says"));
        assert!(decode(&obj[..8], &d, data.len() as u32).unwrap_err().contains("shorter"));
        let mut magic = obj.clone();
        magic[0] = b'X';
        assert!(decode(&magic, &d, data.len() as u32).unwrap_err().contains("magic"));
        let mut enc = obj.clone();
        enc[5] |= FLAG_ENCRYPTED;
        assert!(decode(&enc, &d, data.len() as u32).unwrap_err().contains("encrypted"));
        assert!(decode(&obj, &sha256_hex(b"other"), data.len() as u32).unwrap_err().contains("digest"));
        // A raw (uncompressed) chunk with a flipped payload byte: the digest catches it.
        let random: Vec<u8> = (0..10_000).map(|_| fastrand::u8(..)).collect();
        let mut raw = encode(&random, 1).unwrap();
        raw[HEADER_LEN + 5] ^= 0xff;
        assert!(decode(&raw, &sha256_hex(&random), 10_000).unwrap_err().contains("digest"));
    }
}
