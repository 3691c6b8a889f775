//! The watchdog against a real server: no renewal after release, no renewal past the lease,
//! renewals set the lease, and the loss of the lock is reported.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{fence_of, lock_field, lock_info, state_of, wait_for, Reply, Server};
use redis_lock_client::{Error, Lock, LostReason};
use support::{client, renews, Pause};

/// Asserts the renew count stays at `expected` for `window` (an observation window, not a
/// synchronization: nothing is waited for).
fn assert_no_renewal_for(server: &Server, expected: i64, window: Duration) {
    let start = Instant::now();
    while start.elapsed() < window {
        assert_eq!(renews(server), expected, "a LOCK.RENEW reached the server");
        sleep(Duration::from_millis(10));
    }
    assert_eq!(renews(server), expected, "a LOCK.RENEW reached the server");
}

// Release racing a renewal (Redisson #7272 / #1626: the watchdog outlived unlock and renewed
// after it). Short ttl, renewals every 100 ms, and many acquire/release cycles released at
// varying points of the renewal period: after each release returns, no LOCK.RENEW reaches
// the server and the lock is free.
#[test]
fn no_renewal_reaches_the_server_after_release_returns() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock = Lock::new(client(&server), "race:1", Duration::from_millis(300)).watchdog(true);
    for cycle in 0..24u64 {
        let before = renews(&server);
        let guard = lock.acquire().expect("acquire");
        // Let 0, 1 or 2 renewals happen, then release somewhere inside the next period
        // (the jitter only moves the release against the renewal timer).
        let wanted = before + (cycle % 3) as i64;
        wait_for("renewals", || (renews(&server) >= wanted).then_some(()));
        sleep(Duration::from_millis((cycle * 37) % 100));
        assert!(guard.release().expect("release"), "cycle {cycle}");
        let after = renews(&server);
        assert_eq!(state_of(&mut conn, "race:1"), "free", "cycle {cycle}");
        assert_no_renewal_for(&server, after, Duration::from_millis(20));
    }
    // Longer than several renewal periods: still nothing.
    let last = renews(&server);
    assert!(
        last >= 16,
        "the watchdog renewed during the cycles ({last})"
    );
    assert_no_renewal_for(&server, last, Duration::from_millis(450));
    assert_eq!(state_of(&mut conn, "race:1"), "free");
}

// Stalled timer (Redisson #5698: a renewal timer that fired late extended a lease that had
// already ended, so two clients held the lock). The watchdog is stalled past the lease while
// another client takes the expired lock; it must report the loss and send no RENEW.
#[test]
fn a_watchdog_stalled_past_the_lease_reports_lost_and_sends_no_renewal() {
    let server = Server::start();
    let mut conn = server.conn();
    // Stalled until the test says so (bounded: never hangs the test).
    let pause = Pause::at_round(0);
    let lost = Arc::new(Mutex::new(Vec::new()));
    let lost_in_callback = Arc::clone(&lost);
    let lock = Lock::new(client(&server), "stall:1", Duration::from_millis(300))
        .watchdog(true)
        .on_lost(move |why| lost_in_callback.lock().expect("lost").push(why))
        .before_renewal(pause.hook());
    let guard = lock.acquire().expect("acquire");
    let fence = guard.fence();
    pause.wait_reached();
    // The lease ends on the server; another client takes the lock.
    let other = wait_for(
        "the lease to end and another client to get the lock",
        || match conn.call(&["LOCK.ACQUIRE", "stall:1", "other-token", "30000"]) {
            Reply::Int(f) => Some(f),
            _ => None,
        },
    );
    assert!(other > fence);
    assert!(Instant::now() >= guard.lease_end());
    let renewals = renews(&server);
    assert_eq!(renewals, 0, "the stalled watchdog had not renewed yet");
    pause.go();
    wait_for("the loss to be reported", || {
        (!lost.lock().expect("lost").is_empty()).then_some(())
    });
    assert_eq!(*lost.lock().expect("lost"), vec![LostReason::LeaseExpired]);
    assert!(guard.is_lost());
    assert_eq!(guard.lost_reason(), Some(LostReason::LeaseExpired));
    assert!(matches!(guard.check(), Err(Error::Lost)));
    let ran = AtomicBool::new(false);
    assert!(matches!(
        guard.fenced(|_| ran.store(true, Ordering::SeqCst)),
        Err(Error::Lost)
    ));
    assert!(!ran.load(Ordering::SeqCst), "fenced ran after the loss");
    // No RENEW was sent after the lease end, and the other client still holds the lock.
    assert_eq!(renews(&server), renewals);
    assert_eq!(fence_of(&mut conn, "stall:1"), other);
    assert_eq!(
        conn.call(&["LOCK.FENCE", "stall:1", &other.to_string()]),
        Reply::Int(1)
    );
    // Our release is token-checked: it does not free the other client's grant.
    assert!(!guard.release().expect("release"));
    assert_eq!(state_of(&mut conn, "stall:1"), "held");
    assert_eq!(fence_of(&mut conn, "stall:1"), other);
    assert_eq!(renews(&server), renewals);
    assert_eq!(lost.lock().expect("lost").len(), 1, "reported once");
}

// Renew sets, not adds (redis-py #629: extend() added to the remaining time): after watchdog
// renewals the server's remaining lease is never above the ttl.
#[test]
fn watchdog_renewals_set_the_lease_to_the_ttl() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock = Lock::new(client(&server), "renew:1", Duration::from_millis(600)).watchdog(true);
    let guard = lock.acquire().expect("acquire");
    for n in 1..=3 {
        wait_for("a renewal", || (renews(&server) >= n).then_some(()));
        let ttl = lock_field(&mut conn, "renew:1", "ttl").int();
        assert!(
            ttl > 0 && ttl <= 600,
            "remaining lease {ttl} ms after {n} renewals"
        );
    }
    assert_eq!(server.info_int("lock_renewed"), renews(&server));
    assert!(!guard.is_lost());
    assert!(guard.check().is_ok());
    assert!(guard.release().expect("release"));
    assert_eq!(state_of(&mut conn, "renew:1"), "free");
}

// The loss signal (Redisson PR #7254 / RedLock.net #92: a lost lock went unnoticed by the
// code still running under it): LOCK.FORCERELEASE while the watchdog runs fires the callback
// within a bounded wait, and the guard says lost.
#[test]
fn force_release_is_reported_by_the_watchdog() {
    let server = Server::start();
    let mut conn = server.conn();
    let fired = Arc::new(AtomicUsize::new(0));
    let reason = Arc::new(Mutex::new(None));
    let (fired_in, reason_in) = (Arc::clone(&fired), Arc::clone(&reason));
    let lock = Lock::new(client(&server), "force:1", Duration::from_millis(600))
        .watchdog(true)
        .on_lost(move |why| {
            *reason_in.lock().expect("reason") = Some(why);
            fired_in.fetch_add(1, Ordering::SeqCst);
        });
    let guard = lock.acquire().expect("acquire");
    wait_for("a first renewal", || (renews(&server) >= 1).then_some(()));
    assert!(!guard.is_lost());
    assert_eq!(conn.call(&["LOCK.FORCERELEASE", "force:1"]), Reply::Int(1));
    wait_for("the loss callback", || {
        (fired.load(Ordering::SeqCst) > 0).then_some(())
    });
    assert_eq!(*reason.lock().expect("reason"), Some(LostReason::NotHeld));
    assert!(guard.is_lost());
    assert!(matches!(guard.check(), Err(Error::Lost)));
    assert!(!guard.release().expect("release"));
    assert_eq!(fired.load(Ordering::SeqCst), 1);
}

// Without the watchdog, check() says Lost once the local lease end passed, and renew() is
// token-checked (a renewal after a takeover is refused, never a second holder).
#[test]
fn without_watchdog_check_expires_with_the_lease_and_renew_is_token_checked() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock = Lock::new(client(&server), "plain:1", Duration::from_millis(200));
    let guard = lock.acquire().expect("acquire");
    guard.renew().expect("renew while held");
    assert!(guard.check().is_ok());
    wait_for("the local lease end", || {
        guard.check().is_err().then_some(())
    });
    assert_eq!(guard.lost_reason(), Some(LostReason::LeaseExpired));
    assert!(matches!(guard.renew(), Err(Error::Lost)));
    drop(guard);

    let guard = lock.acquire().expect("acquire again");
    assert_eq!(conn.call(&["LOCK.FORCERELEASE", "plain:1"]), Reply::Int(1));
    let other = common::acquire(&mut conn, "plain:1", "other-token", 30_000);
    assert!(matches!(guard.renew(), Err(Error::Lost)));
    assert_eq!(guard.lost_reason(), Some(LostReason::NotHeld));
    drop(guard);
    assert_eq!(fence_of(&mut conn, "plain:1"), other);
    assert_eq!(state_of(&mut conn, "plain:1"), "held");
}

// The fenced-write recipe (WATCH, LOCK.FENCE, MULTI, EXEC): writes while the grant is current,
// refuses with Lost after a takeover, and retries when EXEC is aborted by a change.
#[test]
fn fenced_transaction_writes_only_while_the_grant_is_current() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock = Lock::new(client(&server), "{o:1}:lock", Duration::from_secs(30)).watchdog(true);
    let guard = lock.acquire().expect("acquire");
    let (written,): (String,) = guard
        .transaction(&["{o:1}:data"], |pipe, fence| {
            pipe.cmd("SET")
                .arg("{o:1}:data")
                .arg(format!("shipped@{fence}"))
                .ignore()
                .cmd("GET")
                .arg("{o:1}:data");
        })
        .expect("transaction");
    assert_eq!(written, format!("shipped@{}", guard.fence()));

    // EXEC aborted once (a watched key changes inside the first attempt), then it succeeds.
    let mut attempts = 0;
    let port = server.port;
    let value: (i64,) = guard
        .transaction(&["{o:1}:data"], |pipe, _| {
            attempts += 1;
            if attempts == 1 {
                let mut c = common::Conn::connect(port, common::PATIENCE).expect("conn");
                assert_eq!(
                    c.call(&["SET", "{o:1}:data", "meddled"]),
                    Reply::status("OK")
                );
            }
            pipe.cmd("INCR").arg("{o:1}:n");
        })
        .expect("transaction after an abort");
    assert_eq!(value, (1,));
    assert_eq!(attempts, 2);

    // After a takeover: Lost, nothing written.
    assert_eq!(
        conn.call(&["LOCK.FORCERELEASE", "{o:1}:lock"]),
        Reply::Int(1)
    );
    common::acquire(&mut conn, "{o:1}:lock", "other-token", 30_000);
    let result = guard.transaction::<()>(&["{o:1}:data"], |pipe, _| {
        pipe.cmd("SET").arg("{o:1}:data").arg("stale").ignore();
    });
    assert!(matches!(result, Err(Error::Lost)), "{result:?}");
    assert!(guard.is_lost());
    assert_eq!(conn.call(&["GET", "{o:1}:data"]), Reply::bulk("meddled"));
    drop(guard);
    assert_eq!(state_of(&mut conn, "{o:1}:lock"), "held");
    assert!(lock_info(&mut conn, "{o:1}:lock").is_some());
}

// LOCK.GUARD through the guard: the command runs while the fence is current, its own errors come
// back as they are, and after a takeover it is refused (Lost) without running.
#[test]
fn guarded_runs_one_command_only_under_the_current_fence() {
    let server = Server::start();
    let mut conn = server.conn();
    let lock = Lock::new(client(&server), "{o:2}:lock", Duration::from_secs(30));
    let guard = lock.acquire().expect("acquire");
    let added: i64 = guard
        .guarded(
            redis::cmd("HSET")
                .arg("{o:2}:data")
                .arg("status")
                .arg("shipped"),
        )
        .expect("guarded HSET");
    assert_eq!(added, 1);
    let wrong = guard.guarded::<i64>(redis::cmd("LPUSH").arg("{o:2}:data").arg("x"));
    assert!(
        matches!(&wrong, Err(Error::Redis(e)) if e.code() == Some("WRONGTYPE")),
        "{wrong:?}"
    );
    assert!(!guard.is_lost());
    assert_eq!(
        conn.call(&["LOCK.FORCERELEASE", "{o:2}:lock"]),
        Reply::Int(1)
    );
    common::acquire(&mut conn, "{o:2}:lock", "other-token", 30_000);
    let stale = guard.guarded::<i64>(
        redis::cmd("HSET")
            .arg("{o:2}:data")
            .arg("status")
            .arg("stale"),
    );
    assert!(matches!(stale, Err(Error::Lost)), "{stale:?}");
    assert!(guard.is_lost());
    assert_eq!(
        conn.call(&["HGET", "{o:2}:data", "status"]),
        Reply::bulk("shipped")
    );
}
