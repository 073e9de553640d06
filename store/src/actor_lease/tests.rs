//! Actor leases: confirmations, renewals and their records, lease objects.

use std::sync::Arc;
use std::time::Duration;

use crate::id::ActorName;
use crate::lease_renewal::answers_from_memory;
use crate::time::now_ms;
use crate::util::lock;
use crate::{Remote, Store, StoreConfig};

async fn store_holding(actor: &ActorName, dir: &std::path::Path) -> Arc<Store> {
    let mut cfg = StoreConfig::new(dir.join("store"));
    cfg.background = false;
    // Long enough that a stalled test machine does not let a lease
    // lapse between two steps of a test.
    cfg.lease_ttl = Duration::from_secs(60);
    let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
    let s = Store::open_with_remote(cfg, remote).await.unwrap();
    s.acquire(actor, "shim-1").await.unwrap();
    s
}

/// A bench run's fence freeze: the lease worker's renewal was under
/// way (its object tier and database slow under a 1 GiB dump) when the
/// shim asked with less than a sixth of the TTL left; the confirmation
/// waited behind the renewal past the validity it had, and the shim
/// froze the actor. It is answered with the validity held now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_during_a_renewal_answers_with_the_validity_held() {
    let tmp = tempfile::tempdir().unwrap();
    let actor = ActorName::new("ns/busy").unwrap();
    let s = store_holding(&actor, tmp.path()).await;
    // Renewed 31 s ago (TTL 60 s): valid for 9 s more, less than the
    // sixth of the TTL that is answered from memory without renewing.
    let expires = now_ms() + 29_000;
    lock(&s.leases.held).get_mut(&actor).unwrap().doc.expires_unix_ms = expires;
    assert!(s.confirm_now(&actor, "shim-1").is_none());
    let renewing = s.leases.lock(&actor).lock_owned().await;
    let (_, until) = tokio::time::timeout(Duration::from_secs(5), s.confirm(&actor, "shim-1"))
        .await
        .expect("the confirmation waited for the renewal under way")
        .unwrap();
    assert_eq!(until, expires - 20_000, "the validity held: the expiry less a third of the TTL");
    // Validity run out: it waits for the renewal, then renews.
    lock(&s.leases.held).get_mut(&actor).unwrap().doc.expires_unix_ms = now_ms() + 1_000;
    let asked = tokio::spawn({
        let (s, actor) = (s.clone(), actor.clone());
        async move { s.confirm(&actor, "shim-1").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!asked.is_finished(), "a lapsed validity was promised");
    let renewed_after = now_ms();
    drop(renewing);
    let (_, until) = asked.await.unwrap().unwrap();
    assert!(until >= renewed_after + 40_000, "renewed: two thirds of the TTL from the renewal");
    s.shutdown().await;
}

/// A renewal is in memory when the renewal returns; its database record
/// follows, and the store's shutdown waits for it (a store reopened on
/// the same database finds the renewed version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_recorded_before_the_store_shuts_down() {
    let tmp = tempfile::tempdir().unwrap();
    let actor = ActorName::new("ns/renewed").unwrap();
    let s = store_holding(&actor, tmp.path()).await;
    let before = s.leases.get(&actor).unwrap();
    s.lease_pass().await;
    let after = s.leases.get(&actor).unwrap();
    assert_ne!(after.e_tag, before.e_tag, "renewed in memory");
    s.shutdown().await;
    drop(s);
    let db = crate::db::open(&tmp.path().join("store").join("store.redb")).unwrap();
    let recorded = crate::db::actor_leases::<crate::leases::Held>(&db).unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].e_tag, after.e_tag, "the renewal's record");
}

/// Issue 38 rows 5 and 7: what `read_lease` refuses, and how: times
/// past year 9999 (a panic formatting them before), no MAC, a wrong
/// MAC, another key's MAC; and a sealed lease reads back the same.
#[test]
fn lease_objects_are_range_checked_and_authenticated() {
    use crate::crypto::{Key, Keyring};
    use crate::lease_object::{read_lease, seal_lease, LeaseDoc, Unproven, LEASE_FORMAT};
    let actor = ActorName::new("ns/a").unwrap();
    let path = "p/actors/ns/a/lease.json";
    let ring = |id: &str, b: u8| Keyring::new(vec![Key::new(id, &[b; 32]).unwrap()], None, false).unwrap();
    let mut doc = LeaseDoc {
        format: LEASE_FORMAT,
        actor: actor.clone(),
        node: "n".into(),
        owner: "o".into(),
        epoch: 1,
        acquired_unix_ms: 1,
        expires_unix_ms: 2,
        released: false,
        leaving: false,
        durable_generation: 0,
        written_unix_ms: 1,
        mac: None,
    };
    let k1 = ring("k1", 1);
    let sealed = seal_lease(&k1, path, &mut doc).unwrap();
    assert_eq!(read_lease(&k1, &actor, path, &sealed).unwrap(), doc);
    assert_eq!(read_lease(&Keyring::default(), &actor, path, &sealed).unwrap(), doc, "without keys the MAC is not checked");
    let untrusted = |r: Result<LeaseDoc, Unproven>, want: &str| match r {
        Err(Unproven::Untrusted(m)) => assert!(m.contains(want) && m.contains("lease.json"), "{want}: {m}"),
        other => panic!("{want}: {other:?}"),
    };
    // Bound to its path: the same object at another actor's path.
    untrusted(read_lease(&k1, &actor, "p/actors/ns/b/lease.json", &sealed), "fails authentication");
    let text = String::from_utf8(sealed.clone()).unwrap();
    untrusted(read_lease(&k1, &actor, path, text.replace("\"epoch\": 1", "\"epoch\": 2").as_bytes()), "fails authentication");
    untrusted(read_lease(&k1, &actor, path, &seal_lease(&Keyring::default(), path, &mut doc.clone()).unwrap()), "not authenticated");
    untrusted(read_lease(&ring("k1", 2), &actor, path, &sealed), "does not authenticate");
    match read_lease(&ring("k2", 2), &actor, path, &sealed) {
        Err(Unproven::ForeignKey(m)) => assert!(m.contains("\"k1\"") && m.contains("does not have"), "{m}"),
        other => panic!("{other:?}"),
    }
    for far in [crate::MAX_UNIX_MS + 1, u64::MAX] {
        let mut d = doc.clone();
        d.expires_unix_ms = far;
        let bytes = seal_lease(&k1, path, &mut d).unwrap();
        untrusted(read_lease(&k1, &actor, path, &bytes), "past the end of year 9999");
        assert!(crate::unix_ms_text(far).contains("past year 9999"), "formatted without a panic");
    }
    untrusted(read_lease(&k1, &actor, path, b"{"), "unreadable");
}

/// A renewal whose record did not reach the database (the daemon was
/// killed right after it; the rig's store suite restarts daemons so)
/// holds an older version: the next renewal's conditional write fails,
/// and the object found, this node's later write, is taken as held (not
/// the lease lost). A copy of an older version of it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_whose_record_was_lost_is_still_this_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let actor = ActorName::new("ns/crashed").unwrap();
    let s = store_holding(&actor, tmp.path()).await;
    let before = s.leases.get(&actor).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.lease_pass().await;
    // The record of that renewal lost: memory (and the database) name
    // the version before it.
    lock(&s.leases.held).insert(actor.clone(), before.clone());
    s.lease_pass().await;
    let h = s.leases.get(&actor).expect("still held: the object was this node's own later write");
    assert_eq!(h.doc.epoch, before.doc.epoch);
    assert!(s.confirm(&actor, "shim-1").await.is_ok());
    // The version held is newer than a replayed copy of an older one.
    let older = before.clone();
    let replay = crate::lease_object::seal_lease(&s.cfg.keyring, s.remote.lease_path(&actor).as_ref(), &mut older.doc.clone()).unwrap();
    object_store::ObjectStoreExt::put(&s.remote.store, &s.remote.lease_path(&actor), replay.into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.lease_pass().await;
    assert!(s.leases.get(&actor).is_none(), "a copy of an older version is not this node's write: lost");
    s.shutdown().await;
}

/// A CI run's fence freeze: a lease renewed at 25.1 s (TTL 6 s) promised
/// validity until 29.1 s; confirmations were answered from memory up to
/// the end, and the renewal asked at 29.15 s came too late.
#[test]
fn a_confirmation_renews_while_there_is_time_left_for_it() {
    let (ttl, valid) = (6_000, 29_100);
    assert!(answers_from_memory(valid, 25_100, ttl), "just renewed");
    assert!(answers_from_memory(valid, 28_000, ttl), "more than a sixth of the TTL left");
    assert!(!answers_from_memory(valid, 28_100, ttl), "a sixth left: renewed first");
    assert!(!answers_from_memory(valid, 29_150, ttl), "run out");
    assert!(!answers_from_memory(0, u64::MAX, ttl));
}
