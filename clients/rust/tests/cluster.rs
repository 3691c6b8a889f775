//! Redis Cluster: a lock kept by the watchdog through `ClusterClient` while its slot migrates,
//! and a waiter whose key's slot migrates.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::thread;
use std::time::Duration;

use common::cluster::{key_slot, Cluster};
use common::{fence_of, lock_field, state_of, wait_blocked, wait_for, Reply};
use redis::cluster::ClusterClient;
use redis_lock_client::{Error, Lock};
use support::renews;

fn cluster_client(cluster: &Cluster) -> ClusterClient {
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}/", n.port))
        .collect();
    ClusterClient::new(nodes).expect("cluster client")
}

// Slot migration under a held lock (a client that does not follow MOVED/ASK loses a lock that
// is still valid, or its watchdog dies on the first redirect): renewals keep succeeding on the
// new owner, release returns true there and frees the lock.
#[test]
fn watchdog_keeps_a_lock_through_slot_migration_and_release_frees_it_on_the_new_owner() {
    let cluster = Cluster::start(3, false);
    let key = "{order:42}:lock";
    let slot = key_slot(key);
    let lock = Lock::new(cluster_client(&cluster), key, Duration::from_millis(600)).watchdog(true);
    let guard = lock.acquire().expect("acquire");
    let from = cluster.owner_of(key);
    let to = (from + 1) % 3;
    let mut source = cluster.nodes[from].conn();
    assert_eq!(fence_of(&mut source, key), guard.fence());
    wait_for("a renewal on the source", || {
        (renews(&cluster.nodes[from]) >= 1).then_some(())
    });

    cluster.begin_migration(slot, from, to);
    cluster.move_keys(slot, from, to);
    cluster.end_migration(slot, to);
    assert_eq!(cluster.owner_of(key), to);

    // Three renewals on the new owner: more than the ttl passes, so the lease lives only
    // because renewals (following MOVED) keep succeeding there.
    let target = &cluster.nodes[to];
    wait_for("renewals on the new owner", || {
        (renews(target) >= 3).then_some(())
    });
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    assert!(guard.check().is_ok());
    let mut conn = target.conn();
    assert_eq!(state_of(&mut conn, key), "held");
    assert_eq!(fence_of(&mut conn, key), guard.fence());
    let ttl = lock_field(&mut conn, key, "ttl").int();
    assert!(ttl > 0 && ttl <= 600, "{ttl}");

    assert!(guard.release().expect("release"));
    assert_eq!(state_of(&mut conn, key), "free");
}

// A waiter whose key's slot migrates (the module answers a blocked waiter with TRYAGAIN when
// MIGRATE takes the key): the helper retries with the same token and is granted on the new
// owner once the holder releases there.
#[test]
fn a_waiter_survives_its_slot_migrating_and_is_granted_on_the_new_owner() {
    let cluster = Cluster::start(3, false);
    let key = "{job:7}:lock";
    let slot = key_slot(key);
    let from = cluster.owner_of(key);
    let to = (from + 1) % 3;
    let mut source = cluster.nodes[from].conn();
    let holder = common::acquire(&mut source, key, "holder-token", 30_000);

    let lock = Lock::new(cluster_client(&cluster), key, Duration::from_secs(30))
        .wait(Duration::from_secs(8));
    let waiter = thread::spawn(move || lock.acquire().map(|g| (g.fence(), g)));
    wait_blocked(&cluster.nodes[from], 1);

    cluster.migrate_slot(slot, from, to);
    let target = &cluster.nodes[to];
    // The retried waiter queues again, on the new owner.
    wait_for("the waiter to queue on the new owner", || {
        let mut c = target.conn();
        (lock_field(&mut c, key, "waiters") == Reply::Int(1)).then_some(())
    });
    assert_eq!(common::blocked(&cluster.nodes[from]), 0);
    let mut conn = target.conn();
    assert_eq!(
        conn.call(&["LOCK.RELEASE", key, "holder-token"]),
        Reply::Int(1)
    );
    let result = waiter.join().expect("waiter thread");
    let (fence, guard) = match result {
        Ok(granted) => granted,
        Err(e @ (Error::NotAcquired | Error::Unknown(_) | Error::Redis(_))) => {
            panic!("waiter not granted: {e}")
        }
        Err(e) => panic!("{e}"),
    };
    assert!(fence > holder);
    assert_eq!(fence_of(&mut conn, key), fence);
    assert_eq!(state_of(&mut conn, key), "held");
    drop(guard);
    assert_eq!(state_of(&mut conn, key), "free");
}
