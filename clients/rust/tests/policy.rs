//! A server's lock namespaces (`lock.namespaces`): a `-POLICY` refusal is `Error::Policy`, on
//! the first reply; a renewal refused so counts as lost; SYNC and FSYNC reach the server.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{lock_info, Config, Reply, Server};
use redis_lock_client::{Error, Lock, LostReason};
use support::{client, Faulty};

#[test]
fn a_refusal_is_its_own_error_returned_at_once() {
    let server = Server::start_with(
        Config::default()
            .namespaces("orders prefix=orders: mode=enforce max-ttl=30000 label=required"),
    );
    let mut conn = server.conn();
    let connector = Faulty::new(client(&server), Vec::new());
    let long = Lock::new(connector.clone(), "orders:1", Duration::from_secs(600)).label("host-7");
    match long.acquire() {
        Err(Error::Policy { namespace, detail }) => {
            assert_eq!(namespace, "orders");
            assert_eq!(detail, "ttl 600000 above the namespace's max-ttl 30000");
        }
        other => panic!("{other:?}"),
    }
    let unlabelled = Lock::new(connector.clone(), "orders:1", Duration::from_secs(10));
    match unlabelled.acquire() {
        Err(Error::Policy { detail, .. }) => assert_eq!(detail, "a LABEL is required"),
        other => panic!("{other:?}"),
    }
    assert_eq!(connector.count("LOCK.ACQUIRE"), 2, "one try each");
    assert!(
        lock_info(&mut conn, "orders:1").is_none(),
        "nothing changed"
    );
    // A key outside the namespace is not held to it.
    let other = Lock::new(connector, "other:1", Duration::from_secs(600));
    assert!(other.acquire().is_ok());
}

#[test]
fn a_refused_renewal_counts_as_lost() {
    let server = Server::start();
    let mut conn = server.conn();
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&reasons);
    let lock = Lock::new(client(&server), "orders:2", Duration::from_secs(10))
        .on_lost(move |why| seen.lock().expect("reasons").push(why));
    let guard = lock.acquire().expect("acquire");
    let policy = "orders prefix=orders: mode=enforce min-ttl=20000";
    assert_eq!(
        conn.call(&["CONFIG", "SET", "lock.namespaces", policy]),
        Reply::Status("OK".into())
    );
    match guard.renew() {
        Err(Error::Policy { namespace, detail }) => {
            assert_eq!(namespace, "orders");
            assert_eq!(detail, "ttl 10000 below the namespace's min-ttl 20000");
        }
        other => panic!("{other:?}"),
    }
    assert!(guard.is_lost());
    assert_eq!(guard.lost_reason(), Some(LostReason::Refused));
    assert!(matches!(guard.check(), Err(Error::Lost)));
    assert_eq!(*reasons.lock().expect("reasons"), vec![LostReason::Refused]);
    assert!(
        guard.release().expect("release"),
        "the grant was still there"
    );
}

#[test]
fn sync_and_fsync_reach_the_server() {
    let server = Server::start();
    let connector = Faulty::new(client(&server), Vec::new());
    // SYNC 0 answers at once.
    let lock = Lock::new(connector.clone(), "orders:3", Duration::from_secs(10))
        .sync(0, Duration::from_millis(100))
        .label("x");
    let guard = lock.acquire().expect("acquire with SYNC 0");
    guard.renew().expect("renew with SYNC 0");
    assert!(guard.release().expect("release"));
    let sent = connector.commands();
    assert_eq!(sent[0][3..], ["10000", "LABEL", "x", "SYNC", "0", "100"]);
    assert_eq!(sent[1][3..], ["10000", "SYNC", "0", "100"]);
    // The test server runs without an AOF.
    let lock = Lock::new(client(&server), "orders:3", Duration::from_secs(10))
        .fsync(Duration::from_millis(100));
    match lock.acquire() {
        Err(Error::Redis(e)) => {
            assert!(e.to_string().contains("FSYNC needs appendonly yes"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

// Review of the -POLICY change (branch review8).
// FAILS: Redlock drops every error reply as "this server did not grant", so a -POLICY refusal
// by all of its servers is retried for `retries` more rounds (each after its delay) and ends as
// Error::NotAcquired ("another token holds it"), while Lock returns Error::Policy after one
// try. Python's Redlock does the same (tests/test_lock.py Review8Policy): the helpers agree,
// but the refusal is retried and misreported.
#[test]
fn review8_redlock_returns_a_policy_refusal_without_retrying() {
    let servers: Vec<Server> = (0..3)
        .map(|_| {
            Server::start_with(
                Config::default().namespaces("orders prefix=orders: mode=enforce max-ttl=30000"),
            )
        })
        .collect();
    let connectors: Vec<Arc<dyn redis_lock_client::Connector>> = servers
        .iter()
        .map(|s| Arc::new(client(s)) as Arc<dyn redis_lock_client::Connector>)
        .collect();
    let result = redis_lock_client::Redlock::new(connectors, "orders:1", Duration::from_secs(600))
        .server_timeout(Duration::from_millis(200))
        .retries(2, Duration::from_millis(20))
        .acquire();
    let rounds = support::calls(&servers[0], "lock.acquire");
    assert!(
        matches!(result, Err(Error::Policy { .. })),
        "{:?} after {rounds} rounds",
        result.as_ref().err()
    );
    assert_eq!(rounds, 1, "one round");
}

// A POLICY refusal by one server of three stops the Redlock after one round, although the two
// others granted (a majority): their grants are given back.
#[test]
fn a_redlock_refused_by_one_server_gives_the_others_grants_back() {
    let servers: Vec<Server> = (0..3)
        .map(|i| {
            let config = Config::default();
            Server::start_with(if i == 1 {
                config.namespaces("orders prefix=orders: mode=enforce max-ttl=30000")
            } else {
                config
            })
        })
        .collect();
    let connectors: Vec<Arc<dyn redis_lock_client::Connector>> = servers
        .iter()
        .map(|s| Arc::new(client(s)) as Arc<dyn redis_lock_client::Connector>)
        .collect();
    let result = redis_lock_client::Redlock::new(connectors, "orders:1", Duration::from_secs(600))
        .server_timeout(Duration::from_millis(500))
        .retries(2, Duration::from_millis(20))
        .acquire();
    match result {
        Err(Error::Policy { namespace, detail }) => {
            assert_eq!(namespace, "orders");
            assert_eq!(detail, "ttl 600000 above the namespace's max-ttl 30000");
        }
        other => panic!("{:?}", other.err()),
    }
    let rounds: Vec<i64> = servers
        .iter()
        .map(|s| support::calls(s, "lock.acquire"))
        .collect();
    assert_eq!(rounds, [1, 1, 1]);
    let states: Vec<String> = servers
        .iter()
        .map(|s| {
            let mut conn = s.conn();
            match conn.call(&["EXISTS", "orders:1"]) {
                Reply::Int(0) => "none".to_string(),
                _ => common::state_of(&mut conn, "orders:1"),
            }
        })
        .collect();
    assert_eq!(states, ["free", "none", "free"]);
}

// NOREPLICAS (SYNC) and the FSYNC change error on LOCK.RENEW: the server renewed the lease and
// could not confirm it. renew() returns the server's error; the guard is not lost, and its
// local lease end is not moved.
#[test]
fn a_renewal_renewed_but_unconfirmed_keeps_the_lock_on_its_old_lease() {
    let server = Server::start();
    for text in [
        "NOREPLICAS the change was not acknowledged by 1 replica(s) within 100 ms: a failover \
         may lose it",
        "ERR the change was not fsynced to the AOF within 100 ms: a crash of this machine may \
         lose it",
    ] {
        let fault = support::Fault {
            at: "LOCK.RENEW".into(),
            nth: support::Nth::These(vec![1]),
            kind: support::FaultKind::ReplyError(text.into()),
        };
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&reasons);
        let lock = Lock::new(
            Faulty::new(client(&server), vec![fault]),
            "orders:4",
            Duration::from_secs(10),
        )
        .sync(0, Duration::from_millis(100))
        .on_lost(move |why| seen.lock().expect("reasons").push(why));
        let guard = lock.acquire().expect("acquire");
        let lease_end = guard.lease_end();
        match guard.renew() {
            Err(Error::Redis(e)) => assert!(e.to_string().contains("the change was not"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(!guard.is_lost(), "{text}");
        assert_eq!(guard.lease_end(), lease_end, "the old lease only");
        assert!(guard.release().expect("release"));
        assert!(reasons.lock().expect("reasons").is_empty());
    }
}
