//! Redlock over five local servers: a majority suffices, a minority does not, and the documented
//! unsafety (a holder paused past its validity while another takes the majority: two holders)
//! beside the same pause against one fenced lock, refused.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{state_of, Reply, Server};
use redis_lock_client::{Connector, Error, Lock, Redlock};
use support::client;

fn servers() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

fn redlock(servers: &[Server], key: &str, ttl: Duration) -> Redlock {
    let connectors: Vec<Arc<dyn Connector>> = servers
        .iter()
        .map(|s| Arc::new(client(s)) as Arc<dyn Connector>)
        .collect();
    Redlock::new(connectors, key, ttl)
        .server_timeout(Duration::from_millis(200))
        .retries(1, Duration::from_millis(20))
}

#[test]
fn a_majority_grants_two_down_still_acquire_three_down_refuse() {
    let mut servers = servers();
    let key = "redlock:majority";
    let held = redlock(&servers, key, Duration::from_secs(2))
        .acquire()
        .expect("all five grant");
    let granted: Vec<usize> = held.fences().iter().map(|(i, _)| *i).collect();
    assert_eq!(granted, [0, 1, 2, 3, 4]);
    assert!(held.validity() > Duration::from_millis(1500));
    assert!(matches!(
        redlock(&servers, key, Duration::from_secs(2)).acquire(),
        Err(Error::NotAcquired)
    ));
    assert_eq!(held.release(), 5);
    servers[0].kill();
    servers[1].kill();
    let held = redlock(&servers, key, Duration::from_secs(2))
        .acquire()
        .expect("three of five grant");
    let granted: Vec<usize> = held.fences().iter().map(|(i, _)| *i).collect();
    assert_eq!(granted, [2, 3, 4]);
    drop(held);
    servers[2].kill();
    assert!(matches!(
        redlock(&servers, key, Duration::from_secs(2)).acquire(),
        Err(Error::NotAcquired)
    ));
    // The minority's grants were given back.
    for server in &servers[3..] {
        assert_eq!(state_of(&mut server.conn(), key), "free");
    }
}

#[test]
fn a_paused_holder_and_a_new_one_both_hold_but_one_fenced_lock_refuses_the_stale_write() {
    let servers = servers();
    let ttl = Duration::from_millis(400);
    let mut storage = servers[0].conn();
    // Redlock: checked, then paused past its validity; another takes the majority; the stale
    // write wins, since no fence can be compared.
    let paused = redlock(&servers, "redlock:pause", ttl)
        .acquire()
        .expect("first");
    assert!(paused.is_held());
    thread::sleep(ttl + Duration::from_millis(100));
    let other = redlock(&servers, "redlock:pause", ttl)
        .acquire()
        .expect("a second holder");
    storage.call(&["SET", "redlock:pause:data", "current"]);
    storage.call(&["SET", "redlock:pause:data", "stale"]);
    assert_eq!(
        storage.call(&["GET", "redlock:pause:data"]),
        Reply::bulk("stale")
    );
    drop(other);
    drop(paused);
    // One primary with fences: the same pause, and the stale write is refused.
    let old = Lock::new(client(&servers[0]), "fenced:pause", ttl)
        .acquire()
        .expect("first");
    thread::sleep(ttl + Duration::from_millis(100));
    let new = Lock::new(client(&servers[0]), "fenced:pause", ttl)
        .acquire()
        .expect("second");
    let _: () = new
        .guarded(redis::cmd("SET").arg("fenced:pause:data").arg("current"))
        .expect("current write");
    let refused = old.guarded::<()>(redis::cmd("SET").arg("fenced:pause:data").arg("stale"));
    assert!(matches!(refused, Err(Error::Lost)), "{refused:?}");
    support::stale_guarded_write_is_fenced(
        &mut storage,
        "fenced:pause",
        old.fence(),
        "fenced:pause:data",
    );
    assert_eq!(
        storage.call(&["GET", "fenced:pause:data"]),
        Reply::bulk("current")
    );
}

#[test]
fn the_watchdog_keeps_a_majority_and_stops_before_release() {
    let servers = servers();
    let ttl = Duration::from_millis(300);
    let held = redlock(&servers, "redlock:watchdog", ttl)
        .watchdog(true)
        .acquire()
        .expect("acquire");
    thread::sleep(ttl * 3);
    assert!(held.is_held());
    for server in &servers {
        assert_eq!(state_of(&mut server.conn(), "redlock:watchdog"), "held");
    }
    assert_eq!(held.release(), 5);
    let renewals = || -> i64 {
        servers
            .iter()
            .map(|s| support::calls(s, "lock.renew"))
            .sum()
    };
    let after_release = renewals();
    assert!(after_release >= 10, "{after_release} renewals");
    thread::sleep(ttl * 2);
    assert_eq!(renewals(), after_release, "no renewal after release");
}
