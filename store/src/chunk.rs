//! Chunk objects: content-defined chunking of files, and the framed,
//! compressed object format of the object tier.
//!
//! A chunk's address is the sha256 of its *uncompressed* bytes (sealed:
//! an HMAC of that, see `crypto`). The object
//! stored at that address is a header followed by the payload:
//!
//! ```text
//! offset size field
//! 0      4    magic "TPCK"
//! 4      1    format version (1)
//! 5      1    flags: bit 0 = payload is zstd-compressed, bit 1 = sealed (encrypted)
//! 6      1    key id length K (0 unless sealed)
//! 7      1    nonce length N (0 unless sealed; 24)
//! 8      4    uncompressed length, u32 little endian
//! 12     4    payload length, u32 little endian
//! 16     K    key id
//! 16+K   N    nonce
//! 16+K+N …    payload (sealed: XChaCha20-Poly1305 ciphertext || 16-byte tag,
//!             AAD = bytes 0..16+K+N || the object's address; see `crypto`)
//! ```
//!
//! No chunk is larger than [`MAX_CHUNK_BYTES`] (the largest FastCDC cuts):
//! a chunk object, its claimed length and what its payload decompresses to
//! are refused past it (and past the length the manifest gives), whatever
//! the object or the manifest says.

use std::fs::File;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::config::ChunkingConfig;
use crate::crypto::{Key, NONCE_LEN, TAG_LEN};
use crate::error::{Error, Result};

pub const MAGIC: [u8; 4] = *b"TPCK";
pub const FORMAT_VERSION: u8 = 1;
pub const FLAG_ZSTD: u8 = 0b01;
pub const FLAG_ENCRYPTED: u8 = 0b10;
pub const HEADER_LEN: usize = 16;
/// The largest chunk there is: FastCDC's largest maximum chunk size (no
/// chunking configuration cuts larger ones).
pub const MAX_CHUNK_BYTES: u32 = fastcdc::v2020::MAXIMUM_MAX as u32;

/// The largest object a chunk of `size` plain bytes can be stored as: the
/// header with the longest key id and nonce, the raw chunk (stored raw when
/// zstd does not make it smaller) and the tag.
pub fn max_object_len(size: u32) -> u64 {
    (HEADER_LEN + 255 + 255 + TAG_LEN) as u64 + u64::from(size.min(MAX_CHUNK_BYTES))
}

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
    encode_inner(data, level, None)
}

/// Encode one chunk as an object sealed under `key` (see `crypto`):
/// `address` is its object name (`key.chunk_address(digest)`), which the
/// AEAD binds with the header. The nonce is derived from the header, the
/// address and the exact bytes encrypted ([`Key::chunk_nonce`]).
pub fn encode_sealed(data: &[u8], level: i32, key: &Key, address: &str) -> Result<Vec<u8>> {
    encode_inner(data, level, Some((key, address)))
}

fn encode_inner(data: &[u8], level: i32, seal: Option<(&Key, &str)>) -> Result<Vec<u8>> {
    let raw_len = u32::try_from(data.len()).ok().filter(|n| *n <= MAX_CHUNK_BYTES).ok_or_else(|| {
        Error::Internal(format!("chunk of {} bytes is larger than the largest chunk ({MAX_CHUNK_BYTES} bytes)", data.len()))
    })?;
    let compressed = zstd::bulk::compress(data, level).map_err(|e| Error::Internal(format!("zstd compress: {e}")))?;
    let (mut flags, payload): (u8, &[u8]) = if compressed.len() < data.len() { (FLAG_ZSTD, &compressed) } else { (0, data) };
    let (key_id, sealed, tag_len) = match seal {
        Some((key, _)) => {
            flags |= FLAG_ENCRYPTED;
            (key.id().as_bytes(), true, TAG_LEN)
        }
        None => (&[][..], false, 0),
    };
    let stored_len = u32::try_from(payload.len() + tag_len).map_err(|_| Error::Internal("chunk payload too large".into()))?;
    let mut out = Vec::with_capacity(HEADER_LEN + key_id.len() + NONCE_LEN + payload.len() + tag_len);
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(flags);
    out.push(key_id.len() as u8);
    out.push(if sealed { NONCE_LEN as u8 } else { 0 });
    out.extend_from_slice(&raw_len.to_le_bytes());
    out.extend_from_slice(&stored_len.to_le_bytes());
    out.extend_from_slice(key_id);
    if let Some((key, address)) = seal {
        let nonce = key.chunk_nonce(&out, address, payload);
        out.extend_from_slice(&nonce);
        let start = out.len();
        out.extend_from_slice(payload);
        key.seal_chunk(&nonce, &mut out, start, address.as_bytes()).map_err(Error::Internal)?;
    } else {
        out.extend_from_slice(payload);
    }
    Ok(out)
}

/// Decode a chunk object and verify it is the chunk `digest` of `expected_len`
/// bytes. Any mismatch is an error whose text says what is wrong (the caller
/// adds the snapshot and the chunk address).
pub fn decode(object: &[u8], digest: &str, expected_len: u32) -> std::result::Result<Vec<u8>, String> {
    decode_inner(object, digest, expected_len, None)
}

/// Decode a chunk object sealed under `key` at `address`: authenticated and
/// decrypted, then checked like [`decode`]. An unencrypted object, or one
/// sealed under another key id, is refused.
pub fn decode_sealed(object: &[u8], digest: &str, expected_len: u32, key: &Key, address: &str) -> std::result::Result<Vec<u8>, String> {
    decode_inner(object, digest, expected_len, Some((key, address)))
}

fn decode_inner(object: &[u8], digest: &str, expected_len: u32, open: Option<(&Key, &str)>) -> std::result::Result<Vec<u8>, String> {
    if expected_len > MAX_CHUNK_BYTES {
        return Err(format!("the manifest says {expected_len} bytes, more than the largest chunk ({MAX_CHUNK_BYTES} bytes)"));
    }
    if object.len() as u64 > max_object_len(expected_len) {
        return Err(format!(
            "object is {} bytes, more than a chunk of {expected_len} bytes is stored as ({})",
            object.len(),
            max_object_len(expected_len)
        ));
    }
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
    let opened;
    let payload = match (flags & FLAG_ENCRYPTED != 0, open) {
        (false, None) => &object[start..],
        (true, None) => return Err("chunk object is encrypted, but its snapshot's manifest is not (replaced?)".to_string()),
        (false, Some((key, _))) => {
            return Err(format!("chunk object is not encrypted, but its snapshot is sealed under key {:?} (replaced?)", key.id()))
        }
        (true, Some((key, address))) => {
            let key_id = &object[HEADER_LEN..HEADER_LEN + key_len];
            if key_id != key.id().as_bytes() {
                return Err(format!(
                    "chunk object is sealed under key {:?}, its snapshot under {:?}",
                    String::from_utf8_lossy(key_id),
                    key.id()
                ));
            }
            let mut aad = object[..start].to_vec();
            aad.extend_from_slice(address.as_bytes());
            opened = key.open_chunk(&object[HEADER_LEN + key_len..start], &aad, &object[start..])?;
            &opened[..]
        }
    };
    let data = if flags & FLAG_ZSTD != 0 {
        // Bounded: `raw_len` is the manifest's length, itself at most
        // MAX_CHUNK_BYTES; a frame that decodes to more is refused.
        zstd::bulk::decompress(payload, raw_len as usize).map_err(|e| format!("zstd (at most {raw_len} bytes): {e}"))?
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

    fn sealed_key(id: &str, byte: u8) -> Key {
        Key::new(id, &[byte; 32]).unwrap()
    }

    #[test]
    fn sealed_round_trip_is_deterministic_and_hides_the_content() {
        let k = sealed_key("k1", 1);
        let compressible = vec![7u8; 100_000];
        let random: Vec<u8> = (0..100_000).map(|_| fastrand::u8(..)).collect();
        for data in [&compressible[..], &random[..], &[][..]] {
            let d = sha256_hex(data);
            let addr = k.chunk_address(&d);
            let obj = encode_sealed(data, 1, &k, &addr).unwrap();
            assert_eq!(obj[5] & FLAG_ENCRYPTED, FLAG_ENCRYPTED);
            assert_eq!(&obj[HEADER_LEN..HEADER_LEN + 2], b"k1");
            assert_eq!(encode_sealed(data, 1, &k, &addr).unwrap(), obj, "same chunk, same key: the same object (dedup)");
            assert_eq!(decode_sealed(&obj, &d, data.len() as u32, &k, &addr).unwrap(), data);
            // The plain decoder (a manifest without encryption) refuses it.
            assert!(decode(&obj, &d, data.len() as u32).unwrap_err().contains("encrypted"));
        }
        let obj = encode_sealed(&random, 1, &k, &k.chunk_address(&sha256_hex(&random))).unwrap();
        assert!(!obj.windows(32).any(|w| w == &random[1000..1032]), "plaintext not in the object");
        let obj = encode_sealed(&compressible, 1, &k, &k.chunk_address(&sha256_hex(&compressible))).unwrap();
        assert!(obj.len() < 1000, "compressed before sealing");
    }

    /// Issue 38 row 9: the nonce was the first 24 bytes of the address (a
    /// function of the plaintext alone) while the bytes encrypted are the
    /// zstd output: two nodes at different zstd levels encrypted different
    /// bytes under one (key, nonce). Now the nonce follows the bytes
    /// encrypted; the objects sealed before (address nonce) still open.
    #[test]
    fn a_chunk_compressed_two_ways_is_sealed_under_two_nonces() {
        let k = sealed_key("k1", 1);
        let data: Vec<u8> = (0..300_000u32).map(|i| ((i * 7919) % 251) as u8 ^ (i / 1000) as u8).collect();
        let d = sha256_hex(&data);
        let addr = k.chunk_address(&d);
        let fast = encode_sealed(&data, 1, &k, &addr).unwrap();
        let small = encode_sealed(&data, 19, &k, &addr).unwrap();
        let start = HEADER_LEN + 2;
        assert_eq!((fast[5], small[5]), (FLAG_ZSTD | FLAG_ENCRYPTED, FLAG_ZSTD | FLAG_ENCRYPTED));
        assert_ne!(fast.len(), small.len(), "two encodings of one chunk (zstd levels 1 and 19)");
        assert_ne!(fast[start..start + NONCE_LEN], small[start..start + NONCE_LEN], "different bytes encrypted under the same nonce");
        for obj in [&fast, &small] {
            assert_eq!(decode_sealed(obj, &d, data.len() as u32, &k, &addr).unwrap(), data);
        }
        // A chunk sealed the old way (nonce = the address's first 24 bytes).
        let mut legacy = fast[..start].to_vec();
        let mut nonce = [0u8; NONCE_LEN];
        hex::decode_to_slice(&addr[..2 * NONCE_LEN], &mut nonce).unwrap();
        legacy.extend_from_slice(&nonce);
        let body = legacy.len();
        let payload = zstd::bulk::compress(&data, 1).unwrap();
        legacy.extend_from_slice(&payload);
        k.seal_chunk(&nonce, &mut legacy, body, addr.as_bytes()).unwrap();
        assert_eq!(decode_sealed(&legacy, &d, data.len() as u32, &k, &addr).unwrap(), data, "a chunk sealed before still opens");
    }

    /// Issue 38 row 6: a manifest's claimed chunk length bounds what is
    /// read and decompressed, and no chunk is larger than MAX_CHUNK_BYTES.
    #[test]
    fn decoding_is_bounded_by_the_chunk_size_limit() {
        let big = vec![0u8; 4 * 1024 * 1024];
        let obj = encode(&big, 1).unwrap();
        assert!(obj.len() < 4096);
        // The manifest claims less than the frame holds: zstd stops at the bound.
        let mut lying = obj.clone();
        lying[8..12].copy_from_slice(&1024u32.to_le_bytes());
        let e = decode(&lying, &sha256_hex(&big[..1024]), 1024).unwrap_err();
        assert!(e.contains("zstd (at most 1024 bytes)"), "{e}");
        // A claim past the largest chunk is refused before anything is allocated.
        let e = decode(&obj, &sha256_hex(&big), u32::MAX).unwrap_err();
        assert!(e.contains("largest chunk"), "{e}");
        // An object larger than its chunk can be stored as.
        let e = decode(&vec![0u8; 2048], &sha256_hex(b"x"), 1).unwrap_err();
        assert!(e.contains("more than a chunk of 1 bytes"), "{e}");
        assert!(encode(&vec![0u8; MAX_CHUNK_BYTES as usize + 1], 1).is_err());
    }

    #[test]
    fn sealed_tamper_wrong_key_and_moves_are_refused() {
        let k = sealed_key("k1", 1);
        let data: Vec<u8> = (0..20_000).map(|i| (i % 251) as u8).collect();
        let d = sha256_hex(&data);
        let addr = k.chunk_address(&d);
        let obj = encode_sealed(&data, 1, &k, &addr).unwrap();
        let n = data.len() as u32;
        // Every single byte flipped, anywhere in the object: refused.
        for i in 0..obj.len() {
            let mut bad = obj.clone();
            bad[i] ^= 0x01;
            assert!(decode_sealed(&bad, &d, n, &k, &addr).is_err(), "byte {i} of {} flipped was accepted", obj.len());
        }
        let e = decode_sealed(
            &{
                let mut b = obj.clone();
                let l = b.len();
                b[l - 20] ^= 1;
                b
            },
            &d,
            n,
            &k,
            &addr,
        )
        .unwrap_err();
        assert!(e.contains("authentication") && e.contains("k1"), "{e}");
        // The same id with other key material.
        let other = sealed_key("k1", 2);
        assert!(decode_sealed(&obj, &d, n, &other, &addr).unwrap_err().contains("authentication"));
        // Another key id.
        let k2 = sealed_key("k2", 1);
        assert!(decode_sealed(&obj, &d, n, &k2, &addr).unwrap_err().contains("sealed under key \"k1\""));
        // Copied to another chunk's name: the AAD binds the address.
        let other_d = sha256_hex(b"other");
        assert!(decode_sealed(&obj, &d, n, &k, &k.chunk_address(&other_d)).unwrap_err().contains("authentication"));
        // A plaintext object where a sealed one belongs (downgrade).
        let plain = encode(&data, 1).unwrap();
        assert!(decode_sealed(&plain, &d, n, &k, &addr).unwrap_err().contains("not encrypted"));
        // Truncated, or a wrong expected digest.
        assert!(decode_sealed(&obj[..obj.len() - 1], &d, n, &k, &addr).unwrap_err().contains("header says"));
        assert!(decode_sealed(&obj, &other_d, n, &k, &addr).unwrap_err().contains("digest"));
    }
}
