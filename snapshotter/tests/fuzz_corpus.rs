//! Replays the fuzz corpora and crashers (`fuzz/corpus/<target>/`,
//! `fuzz/artifacts/<target>/` at the repository root) through the fuzz
//! targets' functions (`torpor_snapshotter::fuzzing`): what the fuzzer
//! found or kept stays a regression test of `cargo test`, no fuzzer needed.
//!
//! `TORPOR_FUZZ_WRITE_SEEDS=1` (re)writes the seed inputs (`seed-*`) into
//! the corpora first.

use std::path::{Path, PathBuf};

use torpor_snapshotter::fuzzing::TARGETS;
use torpor_store::{ActorName, ChunkingConfig, Entry, EntryKind, Key, Manifest, SnapshotId};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect()).unwrap_or_default();
    v.sort();
    v
}

fn seed_manifest() -> Manifest {
    Manifest {
        format: 1,
        actor: ActorName::new("fuzz/actor").unwrap(),
        generation: 1,
        created_ms: 1_700_000_000_000,
        labels: [("torpor.dev/reason".to_string(), "idle".to_string())].into(),
        chunker: "fastcdc-2020".into(),
        chunking: ChunkingConfig::default(),
        hash: "sha256".into(),
        encryption: None,
        logical_bytes: 5,
        entries: vec![
            Entry { path: "ctr-a".into(), kind: EntryKind::Dir, mode: 0o755, size: 0, chunks: vec![] },
            Entry {
                path: "ctr-a/pages-1.img".into(),
                kind: EntryKind::File,
                mode: 0o644,
                size: 5,
                chunks: vec![serde_json::from_value(
                    serde_json::json!({ "digest": "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", "size": 5 }),
                )
                .unwrap()],
            },
        ],
    }
}

fn write_seeds() {
    let m = seed_manifest();
    let (bytes, _) = m.to_bytes().unwrap();
    let id = SnapshotId::new(m.actor.clone(), 1);
    let key = Key::new("k1", &[7u8; 32]).unwrap();
    let sealed = torpor_store::crypto::seal_manifest(&key, &id, &bytes).unwrap();
    let mut escaping = m.clone();
    escaping.entries[1].path = "../../etc/shadow".into();
    let lease = torpor_store::lease_object::LeaseDoc {
        format: 1,
        actor: m.actor.clone(),
        node: "node-a".into(),
        owner: "shim-1".into(),
        epoch: 3,
        acquired_unix_ms: 1_700_000_000_000,
        expires_unix_ms: 1_700_000_030_000,
        released: false,
        leaving: false,
        durable_generation: 1,
        written_unix_ms: 1_700_000_000_000,
        mac: None,
    };
    let lease_path = "objects/actors/fuzz/actor/lease.json";
    let ring = torpor_store::Keyring::new(vec![Key::new("k1", &[7u8; 32]).unwrap()], Some("k1"), false).unwrap();
    let mut plain_lease = lease.clone();
    let plain_lease = torpor_store::lease_object::seal_lease(&Default::default(), lease_path, &mut plain_lease).unwrap();
    let mut mac_lease = lease.clone();
    let mac_lease = torpor_store::lease_object::seal_lease(&ring, lease_path, &mut mac_lease).unwrap();
    let far = String::from_utf8(plain_lease.clone()).unwrap().replace("1700000030000", "18446744073709551615");
    let edited = String::from_utf8(mac_lease.clone()).unwrap().replace("\"released\": false", "\"released\": true");
    let chunk_data: Vec<u8> = (0..4096u32).map(|i| (i % 13) as u8).collect();
    let with_len = |obj: Vec<u8>| [&(chunk_data.len() as u32).to_le_bytes()[..], &obj].concat();
    let key = Key::new("k1", &[7u8; 32]).unwrap();
    let digest = torpor_store::chunk::sha256_hex(&chunk_data);
    let sealed_chunk = torpor_store::chunk::encode_sealed(&chunk_data, 3, &key, &key.chunk_address(&digest)).unwrap();
    let mut seeds: Vec<(&str, &str, Vec<u8>)> = vec![
        ("lease", "seed-plain.json", plain_lease),
        ("lease", "seed-mac.json", mac_lease),
        ("lease", "seed-expiry-past-9999.json", far.into_bytes()),
        ("lease", "seed-edited.json", edited.into_bytes()),
        ("chunk", "seed-zstd", with_len(torpor_store::chunk::encode(&chunk_data, 3).unwrap())),
        ("chunk", "seed-sealed", with_len(sealed_chunk)),
        ("chunk", "seed-claims-4gib", [&u32::MAX.to_le_bytes()[..], &torpor_store::chunk::encode(&chunk_data, 3).unwrap()].concat()),
    ];
    seeds.extend(vec![
        ("manifest", "seed-valid.json", bytes.clone()),
        ("manifest", "seed-truncated.json", bytes[..bytes.len() / 2].to_vec()),
        ("manifest_fields", "seed-valid.json", serde_json::to_vec(&m).unwrap()),
        ("manifest_fields", "seed-escaping-path.json", serde_json::to_vec(&escaping).unwrap()),
        ("envelope", "seed-sealed.json", sealed.clone()),
        ("envelope", "seed-plaintext.json", bytes),
        ("envelope", "seed-other-key.json", String::from_utf8(sealed).unwrap().replace("\"k1\"", "\"k9\"").into_bytes()),
        (
            "config",
            "seed-shipped.toml",
            std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/torpor/snapshotter.toml")).unwrap(),
        ),
        ("config", "seed-huge-duration.toml", b"[store]\ngc_interval = \"5124095576030431h\"\n".to_vec()),
        ("config", "seed-bad-scheme.toml", b"[store]\nremote_url = \"ftp://h/x\"\nlease_ttl = \"18446744073709551615ms\"\n".to_vec()),
    ]);
    for (target, name, data) in seeds {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), data).unwrap();
    }
}

#[test]
fn fuzz_corpora_and_crashers_replay_clean() {
    if std::env::var_os("TORPOR_FUZZ_WRITE_SEEDS").is_some() {
        write_seeds();
    }
    for (name, target) in TARGETS {
        let corpus = files(&fuzz_dir().join("corpus").join(name));
        assert!(!corpus.is_empty(), "fuzz/corpus/{name}/ is empty (TORPOR_FUZZ_WRITE_SEEDS=1 writes its seeds)");
        let crashers = files(&fuzz_dir().join("artifacts").join(name));
        for f in corpus.iter().chain(&crashers) {
            let data = std::fs::read(f).unwrap();
            target(&data).unwrap_or_else(|e| panic!("{name}: {}: {e}", f.display()));
        }
    }
}
