//! The chunk sweep: what an unreadable manifest keeps, chunk names in the index.

use super::*;

#[test]
fn what_an_unreadable_manifest_keeps() {
    let sealed = br#"{"sealed":1,"snapshot":"a@1","alg":"xchacha20poly1305","key_id":"k1","key_check":"00","nonce":"00","ciphertext":""}"#;
    assert_eq!(namespace_of(sealed), Namespace::Key("k1".into()));
    assert_eq!(namespace_of(br#"{"sealed":1,"key_id":"k1""#), Namespace::All, "a broken envelope");
    assert_eq!(namespace_of(br#"{"sealed":1,"key_id":"../x"}"#), Namespace::All);
    assert_eq!(namespace_of(br#"{"manifest":{"format":1},"sha256":"00"}"#), Namespace::Plain);
    assert_eq!(namespace_of(b"\x00junk"), Namespace::All);

    let plain = ChunkName::Plain("ab".repeat(32));
    let k1 = ChunkName::Sealed { key_id: "k1".into(), address: "cd".repeat(32) };
    let k2 = ChunkName::Sealed { key_id: "k2".into(), address: "ef".repeat(32) };
    let mut r = Refs::default();
    assert!(![&plain, &k1, &k2].iter().any(|n| r.keeps(n)));
    r.names.insert(k2.clone());
    r.kept.insert(Namespace::Key("k1".into()));
    assert!(r.keeps(&k1) && r.keeps(&k2) && !r.keeps(&plain));
    r.kept.insert(Namespace::Plain);
    assert!(r.keeps(&plain));
    let mut all = Refs::default();
    all.kept.insert(Namespace::All);
    assert!([&plain, &k1, &k2].iter().all(|n| all.keeps(n)));
}

#[test]
fn chunk_names_round_trip_through_the_index() {
    for n in [ChunkName::Plain("ab".repeat(32)), ChunkName::Sealed { key_id: "k1".into(), address: "cd".repeat(32) }] {
        assert_eq!(ChunkName::from_index_key(&n.index_key()), Some(n));
    }
    for bad in ["", "xy", "hmac-sha256/k1", "hmac-sha256/../aa", "sha256/aa", &format!("hmac-sha256/k/1/{}", "ab".repeat(32))] {
        assert_eq!(ChunkName::from_index_key(bad), None, "{bad:?}");
    }
}
