//! The guard against a real server: fences, release on drop, refusal without running the body,
//! waiting on the server, and a lost reply on acquire.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use common::{fence_of, lock_field, lock_info, state_of, Reply, Server};
use redis_lock_client::{Error, Lock};
use support::{calls, client, Fault, Faulty};

// Guard basics: the fence is the server's, drop releases with the token, and a refused
// acquire never runs the body (redis-py #621: code ran although the lock was not acquired).
#[test]
fn guard_gives_the_servers_fence_releases_on_drop_and_refusal_never_runs_the_body() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock = Lock::new(client(&server), "orders:1", Duration::from_secs(30));
    {
        let guard = lock.acquire().expect("acquire");
        assert_eq!(guard.fence(), fence_of(&mut conn, "orders:1"));
        assert_eq!(state_of(&mut conn, "orders:1"), "held");
        assert_eq!(lock_field(&mut conn, "orders:1", "holds"), Reply::Int(1));

        // Another acquisition (its own token) is refused, and its body never runs.
        let other = Lock::new(client(&server), "orders:1", Duration::from_secs(30));
        assert!(matches!(other.acquire(), Err(Error::NotAcquired)));
        let ran = AtomicBool::new(false);
        let result = other.run(|_| ran.store(true, Ordering::SeqCst));
        assert!(matches!(result, Err(Error::NotAcquired)), "{result:?}");
        assert!(!ran.load(Ordering::SeqCst), "body ran without the lock");

        assert_eq!(guard.fenced(|fence| fence).expect("fenced"), guard.fence());
        assert!(guard.check().is_ok());
        assert!(!guard.is_lost());
    }
    // Dropped: released with its token.
    assert_eq!(state_of(&mut conn, "orders:1"), "free");
    assert_eq!(lock_field(&mut conn, "orders:1", "holds"), Reply::Int(0));

    // run() holds the lock for the body and releases after it.
    let fence = lock
        .run(|fence| {
            let mut c = server.conn();
            assert_eq!(state_of(&mut c, "orders:1"), "held");
            assert_eq!(fence_of(&mut c, "orders:1"), fence);
            fence
        })
        .expect("run");
    assert_eq!(state_of(&mut conn, "orders:1"), "free");
    assert_eq!(fence_of(&mut conn, "orders:1"), fence);

    // With tombstones off, an explicit release deletes the key.
    assert_eq!(
        conn.call(&["CONFIG", "SET", "lock.tombstone-ttl", "0"]),
        Reply::status("OK")
    );
    let guard = lock.acquire().expect("acquire again");
    assert!(guard.fence() > fence);
    assert!(guard.release().expect("release"));
    assert_eq!(lock_info(&mut conn, "orders:1"), None);
}

// Waiting on the server: a WAIT acquire is granted when the holder releases.
#[test]
fn waiting_acquire_is_granted_when_the_holder_releases() {
    let server = Server::start();
    let mut conn = server.conn();
    let holder = common::acquire(&mut conn, "jobs:7", "holder-token", 30_000);
    let lock =
        Lock::new(client(&server), "jobs:7", Duration::from_secs(30)).wait(Duration::from_secs(10));
    let waiter = thread::spawn(move || lock.acquire().map(|g| (g.fence(), g)));
    common::wait_blocked(&server, 1);
    assert_eq!(
        conn.call(&["LOCK.RELEASE", "jobs:7", "holder-token"]),
        Reply::Int(1)
    );
    let (fence, guard) = waiter.join().expect("waiter thread").expect("granted");
    assert!(fence > holder);
    assert_eq!(fence_of(&mut conn, "jobs:7"), fence);
    assert_eq!(state_of(&mut conn, "jobs:7"), "held");
    drop(guard);
    assert_eq!(state_of(&mut conn, "jobs:7"), "free");

    // A limited wait that runs out is NotAcquired, after a final non-waiting attempt.
    common::acquire(&mut conn, "jobs:7", "holder-token", 30_000);
    let lock = Lock::new(client(&server), "jobs:7", Duration::from_secs(30))
        .wait(Duration::from_millis(100));
    assert!(matches!(lock.acquire(), Err(Error::NotAcquired)));
    assert_eq!(lock_field(&mut conn, "jobs:7", "waiters"), Reply::Int(0));
}

// A grant at an unknown moment of a wait longer than the lease: the guard renews once to learn
// when its lease ends, instead of calling the fresh grant lost.
#[test]
fn a_grant_after_a_wait_longer_than_the_lease_is_held() {
    let server = Server::start();
    let mut conn = server.conn();
    common::acquire(&mut conn, "jobs:8", "holder-token", 30_000);
    let lock = Lock::new(client(&server), "jobs:8", Duration::from_millis(300))
        .wait(Duration::from_secs(10))
        .watchdog(true);
    let waiter = thread::spawn(move || lock.acquire());
    common::wait_blocked(&server, 1);
    // The wait must outlast the 300 ms lease; there is nothing to poll for.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        conn.call(&["LOCK.RELEASE", "jobs:8", "holder-token"]),
        Reply::Int(1)
    );
    let guard = waiter.join().expect("waiter thread").expect("granted");
    assert!(guard.check().is_ok(), "{:?}", guard.lost_reason());
    assert_eq!(fence_of(&mut conn, "jobs:8"), guard.fence());
    assert!(guard.release().expect("release"));
}

// Lost reply on acquire (failover "unknown" outcome): the grant happened but the client saw an
// I/O error; the retry with the same token gets the same fence, and holds stays 1 (no second
// hold, no second holder).
#[test]
fn lost_acquire_reply_is_retried_with_the_same_token_and_gets_the_same_fence() {
    let server = Server::start();
    let mut conn = server.conn();
    let connector = Faulty::new(client(&server), vec![Fault::drop_reply("LOCK.ACQUIRE", 1)]);
    let lock = Lock::new(connector.clone(), "pay:9", Duration::from_secs(30));
    let guard = lock.acquire().expect("acquire after a lost reply");
    assert_eq!(connector.count("LOCK.ACQUIRE"), 2, "one retry");
    assert_eq!(connector.connects(), 2, "reconnected after the I/O error");
    assert_eq!(calls(&server, "lock.acquire"), 2);
    assert_eq!(guard.fence(), fence_of(&mut conn, "pay:9"));
    assert_eq!(lock_field(&mut conn, "pay:9", "holds"), Reply::Int(1));
    assert_eq!(state_of(&mut conn, "pay:9"), "held");
    assert!(guard.release().expect("release"));
    assert_eq!(state_of(&mut conn, "pay:9"), "free");
}

// Shared holds go together and exclude a writer; a semaphore grants its permits and refuses a
// Lock that names another number of them.
#[test]
fn shared_holders_go_together_and_a_semaphore_counts_permits() {
    let server = Server::start();
    let mut conn = server.conn();
    let reader = Lock::new(client(&server), "report", Duration::from_secs(30)).shared();
    let first = reader.acquire().expect("first reader");
    let second = reader.acquire().expect("second reader");
    assert!(second.fence() > first.fence());
    assert_eq!(lock_field(&mut conn, "report", "holders"), Reply::Int(2));
    let writer = Lock::new(client(&server), "report", Duration::from_secs(30));
    assert!(matches!(writer.acquire(), Err(Error::NotAcquired)));
    drop(first);
    drop(second);
    let last_reader = fence_of(&mut conn, "report");
    assert!(writer.acquire().expect("writer").fence() > last_reader);

    let permit = Lock::new(client(&server), "pool", Duration::from_secs(30)).limit(2);
    let held = [
        permit.acquire().expect("permit"),
        permit.acquire().expect("permit"),
    ];
    assert!(matches!(permit.acquire(), Err(Error::NotAcquired)));
    let other = Lock::new(client(&server), "pool", Duration::from_secs(30)).limit(3);
    let refused = other.acquire();
    assert!(matches!(refused, Err(Error::Redis(_))), "{refused:?}");
    let [a, _b] = held;
    drop(a);
    assert!(permit.acquire().is_ok());
}

// A label names the grant for operators (LOCK.WHO), and a bad one is refused before sending.
#[test]
fn a_label_shows_in_lock_who_and_a_bad_one_is_refused() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock =
        Lock::new(client(&server), "orders:label", Duration::from_secs(30)).label("host-7:pid-42");
    let guard = lock.acquire().expect("acquire");
    let who = conn.call(&["LOCK.WHO", "orders:label"]);
    let items = who.items();
    let at = items
        .iter()
        .step_by(2)
        .position(|f| f.text() == "holders")
        .expect("holders");
    let holder = items[at * 2 + 1].items()[0].items().to_vec();
    let label = holder
        .iter()
        .step_by(2)
        .position(|f| f.text() == "label")
        .expect("label");
    assert_eq!(holder[label * 2 + 1], Reply::bulk("host-7:pid-42"));
    drop(guard);
    for bad in ["", "two words", &"x".repeat(129)] {
        let lock = Lock::new(client(&server), "orders:label", Duration::from_secs(30)).label(bad);
        match lock.acquire() {
            Err(Error::Invalid(invalid)) => assert_eq!(invalid.reason(), "label"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(state_of(&mut conn, "orders:label"), "free");
}
