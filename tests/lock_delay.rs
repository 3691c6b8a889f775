//! Lock-delay (Consul's rule): a grant whose lease runs out, or whose session's connection
//! closes, leaves the lock unavailable for its lock-delay; a clean release does not. Waiters are
//! served when it ends; LOCK.FORCERELEASE ends it; it persists, replicates and moves with the key.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn int_field(c: &mut Conn, key: &str, field: &str) -> i64 {
    lock_field(c, key, field).int()
}

/// Waits until the lease of `key` ended and its lock-delay runs; returns the delay left (ms).
fn wait_delayed(c: &mut Conn, key: &str) -> i64 {
    wait_for("the lease to end with a lock-delay", || {
        (state_of(c, key) == "free").then(|| int_field(c, key, "delay_ttl"))
    })
}

#[test]
fn an_expired_lease_keeps_the_lock_unavailable_for_its_lock_delay() {
    let server = Server::start();
    let mut c = server.conn();
    let started = Instant::now();
    let first = acquire_with(&mut c, "lk", "t1", 50, &["LOCKDELAY", "400"]).int();
    assert_eq!(int_field(&mut c, "lk", "lock_delay"), 400);
    assert_eq!(int_field(&mut c, "lk", "delay_ttl"), -1);
    let left = wait_delayed(&mut c, "lk");
    assert!((1..=400).contains(&left), "{left}");
    // Nobody gets it meanwhile, not even the token that held it.
    assert_eq!(acquire_with(&mut c, "lk", "t2", 1000, &[]), Reply::Nil);
    assert_eq!(acquire_with(&mut c, "lk", "t1", 1000, &[]), Reply::Nil);
    assert_eq!(
        c.call(&["LOCK.FENCE", "lk", &first.to_string()]),
        Reply::Int(0)
    );
    let second = wait_for("the lock-delay to end", || {
        match acquire_with(&mut c, "lk", "t2", 1000, &[]) {
            Reply::Int(fence) => Some(fence),
            _ => None,
        }
    });
    assert!(started.elapsed() >= Duration::from_millis(440));
    assert!(second > first);
    assert_eq!(int_field(&mut c, "lk", "delay_ttl"), -1);
    assert_eq!(server.info_int("lock_delayed"), 1);
    assert_eq!(server.info_int("lock_expired"), 1);
}

#[test]
fn a_release_imposes_no_lock_delay() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire_with(&mut c, "lk", "t1", 10_000, &["LOCKDELAY", "60000"]).int();
    assert_eq!(c.call(&["LOCK.RELEASE", "lk", "t1"]), Reply::Int(1));
    assert_eq!(int_field(&mut c, "lk", "delay_ttl"), -1);
    assert!(acquire_with(&mut c, "lk", "t2", 1000, &[]).int() > first);
    assert_eq!(server.info_int("lock_delayed"), 0);
}

#[test]
fn a_closed_session_starts_the_lock_delay() {
    let server = Server::start();
    let mut c = server.conn();
    let mut owner = server.conn();
    acquire_with(
        &mut owner,
        "lk",
        "t1",
        60_000,
        &["SESSION", "LOCKDELAY", "300"],
    )
    .int();
    drop(owner);
    let left = wait_delayed(&mut c, "lk");
    assert!((1..=300).contains(&left), "{left}");
    assert_eq!(acquire_with(&mut c, "lk", "t2", 1000, &[]), Reply::Nil);
    wait_for("the lock-delay to end", || {
        acquire_with(&mut c, "lk", "t2", 1000, &[])
            .is_int()
            .then_some(())
    });
    assert_eq!(server.info_int("lock_session_released"), 1);
    assert_eq!(server.info_int("lock_delayed"), 1);
}

#[test]
fn waiters_are_served_when_the_lock_delay_ends() {
    let server = Server::start();
    let mut c = server.conn();
    let mut waiter = server.conn();
    let started = Instant::now();
    let first = acquire_with(&mut c, "lk", "t1", 50, &["LOCKDELAY", "400"]).int();
    waiter.send(&["LOCK.ACQUIRE", "lk", "t2", "5000", "WAIT", "5000"]);
    let second = waiter.read().int();
    assert!(
        started.elapsed() >= Duration::from_millis(440),
        "served after {:?}",
        started.elapsed()
    );
    assert!(second > first);
    assert_eq!(state_of(&mut c, "lk"), "held");
}

#[test]
fn the_configured_lock_delay_applies_unless_the_grant_names_one() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.lock-delay", "300"]),
        Reply::status("OK")
    );
    acquire_with(&mut c, "a", "t", 10_000, &[]).int();
    assert_eq!(int_field(&mut c, "a", "lock_delay"), 300);
    acquire_with(&mut c, "b", "t", 10_000, &["LOCKDELAY", "0"]).int();
    assert_eq!(int_field(&mut c, "b", "lock_delay"), 0);
    // A refresh by the holder takes the request's lock-delay.
    acquire_with(&mut c, "b", "t", 10_000, &["LOCKDELAY", "70"]).int();
    assert_eq!(int_field(&mut c, "b", "lock_delay"), 70);
    assert_eq!(
        c.call(&["CONFIG", "GET", "lock.lock-delay"]),
        Reply::Array(vec![Reply::bulk("lock.lock-delay"), Reply::bulk("300")])
    );
    let refused = c.call(&["CONFIG", "SET", "lock.lock-delay", "-1"]);
    assert!(refused.is_error(), "{refused:?}");
}

#[test]
fn forcerelease_ends_a_running_lock_delay_and_serves_the_queue() {
    let server = Server::start();
    let mut c = server.conn();
    let mut waiter = server.conn();
    acquire_with(&mut c, "lk", "t1", 30, &["LOCKDELAY", "60000"]).int();
    wait_delayed(&mut c, "lk");
    waiter.send(&["LOCK.ACQUIRE", "lk", "t2", "5000", "WAIT", "10000"]);
    wait_for("the waiter to queue", || {
        (int_field(&mut c, "lk", "waiters") == 1).then_some(())
    });
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "lk"]), Reply::Int(0));
    assert!(waiter.read().is_int());
    assert_eq!(state_of(&mut c, "lk"), "held");
    assert_eq!(int_field(&mut c, "lk", "delay_ttl"), -1);
}

#[test]
fn bad_lock_delays_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let cases: &[(&[&str], &str)] = &[
        (
            &["LOCKDELAY", "-1"],
            "ERR invalid lock-delay: must not be negative",
        ),
        (
            &["LOCKDELAY", "x"],
            "ERR invalid lock-delay: not an integer",
        ),
        (
            &["LOCKDELAY"],
            "ERR invalid lock-delay: missing after LOCKDELAY",
        ),
        (
            &["LOCKDELAY", "86400001"],
            "ERR invalid lock-delay: exceeds lock.max-ttl (86400000)",
        ),
        (
            &["LOCKDELAY", "5", "LOCKDELAY", "5"],
            "ERR option LOCKDELAY given more than once",
        ),
    ];
    for (extra, error) in cases {
        assert_eq!(
            acquire_with(&mut c, "lk", "t", 1000, extra),
            Reply::error(error),
            "{extra:?}"
        );
    }
    assert_eq!(c.call(&["EXISTS", "lk"]), Reply::Int(0));
    assert_eq!(
        acquire_with(&mut c, "lk", "t", 1000, &["LOCKDELAYS", "5"]),
        Reply::error(
            "ERR unknown option at argument 4 (expected WAIT, REENTRANT, SESSION, SYNC, FSYNC, LOCKDELAY, SHARED, LIMIT or LABEL)"
        )
    );
}

#[test]
fn a_delayed_lock_is_not_reclaimed_before_its_lock_delay_ends() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.tombstone-ttl", "0"]),
        Reply::status("OK")
    );
    acquire_with(&mut c, "lk", "t1", 30, &["LOCKDELAY", "300"]).int();
    wait_delayed(&mut c, "lk");
    assert_eq!(c.call(&["EXISTS", "lk"]), Reply::Int(1));
    wait_for("the lock to be reclaimed after its lock-delay", || {
        (c.call(&["EXISTS", "lk"]) == Reply::Int(0)).then_some(())
    });
    assert_eq!(server.info_int("lock_reclaimed"), 1);
}

#[test]
fn lock_delays_survive_reload_restart_restore_and_reach_replicas() {
    let mut primary = Server::start_with(Config::default().with("appendonly", "yes"));
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    acquire_with(&mut c, "held", "t1", 600_000, &["LOCKDELAY", "5000"]).int();
    acquire_with(&mut c, "delayed", "t2", 30, &["LOCKDELAY", "600000"]).int();
    wait_delayed(&mut c, "delayed");
    primary.sync_replicas(1);
    let mut r = replica.conn();
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
    assert_eq!(int_field(&mut r, "held", "lock_delay"), 5000);
    assert!(int_field(&mut r, "delayed", "delay_ttl") > 500_000);

    let check = |c: &mut Conn, what: &str| {
        assert_eq!(int_field(c, "held", "lock_delay"), 5000, "{what}");
        let left = int_field(c, "delayed", "delay_ttl");
        assert!(
            left > 500_000,
            "{what}: {left} {:?}",
            lock_info(c, "delayed")
        );
        assert_eq!(
            acquire_with(c, "delayed", "t3", 1000, &[]),
            Reply::Nil,
            "{what}"
        );
    };
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    check(&mut c, "DEBUG RELOAD");
    let Reply::Bulk(dump) = c.call(&["DUMP", "delayed"]) else {
        panic!("DUMP")
    };
    assert_eq!(
        c.call(&[&b"RESTORE"[..], b"copy", b"0", &dump]),
        Reply::status("OK")
    );
    assert!(int_field(&mut c, "copy", "delay_ttl") > 500_000);
    assert!(!c.call(&["BGREWRITEAOF"]).is_error());
    wait_for("the AOF rewrite", || {
        (primary
            .info_field("persistence", "aof_rewrite_in_progress")
            .as_deref()
            == Some("0")
            && primary
                .info_field("persistence", "aof_rewrite_scheduled")
                .as_deref()
                == Some("0"))
        .then_some(())
    });
    drop(c);
    drop(r);
    primary.restart();
    let mut c = primary.conn();
    check(&mut c, "restart from the AOF");
}

#[test]
fn a_version_1_dump_still_loads_and_version_2_carries_the_delay() {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let fence = (now_ms() << 11) + 5;
    assert_eq!(
        restore(
            &mut c,
            "old",
            &format.payload_of_version(1, &tombstone_fields(fence))
        ),
        Reply::status("OK")
    );
    assert_eq!(fence_of(&mut c, "old") as u64, fence);
    let until = now_ms() + 600_000;
    assert_eq!(
        restore(
            &mut c,
            "new",
            &format.payload(&delayed_tombstone_fields(fence, until))
        ),
        Reply::status("OK")
    );
    assert!(int_field(&mut c, "new", "delay_ttl") > 500_000);
    // Version 1 had no lock-delay: the same fields framed as version 1 are refused.
    assert_eq!(
        restore(
            &mut c,
            "bad",
            &format.payload_of_version(1, &delayed_tombstone_fields(fence, until))
        ),
        Reply::error("ERR Bad data format")
    );
}

#[test]
fn forcerelease_after_a_delay_ended_leaves_primary_and_replica_alike() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut p = primary.conn();
    acquire_with(&mut p, "lk", "t", 50, &["LOCKDELAY", "50"]).int();
    wait_for("the lease and its delay to end", || {
        (state_of(&mut p, "lk") == "free" && int_field(&mut p, "lk", "delay_ttl") == -1)
            .then_some(())
    });
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "lk"]), Reply::Int(0));
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(digest_value(&mut p, "lk"), digest_value(&mut r, "lk"));
    assert_eq!(p.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
}

/// LOCK.WAIT (single-flight) waits for the lock to be takeable: through a running lock-delay as
/// through a hold, on the primary and on a replica, whether it began before the lease ran out or
/// during the delay. When it answers 1, an ACQUIRE succeeds.
#[test]
fn lock_wait_answers_once_the_lock_delay_has_ended() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    let mut r = replica.conn();
    // The delay ends no earlier than this (the server's clock is this machine's).
    let until = now_ms() + 500 + 1500;
    acquire_with(&mut c, "lk", "crashed", 500, &["LOCKDELAY", "1500"]).int();
    wait_replica_caught_up(&primary, &replica);
    // Watchers from before the lease ran out, on both servers.
    let mut early = primary.conn();
    early.send(&["LOCK.WAIT", "lk", "10000"]);
    let mut early_replica = replica.conn();
    early_replica.send(&["LOCK.WAIT", "lk", "10000"]);
    wait_blocked(&primary, 1);
    wait_blocked(&replica, 1);
    wait_delayed(&mut c, "lk");
    wait_for("the replica to see the delay", || {
        (state_of(&mut r, "lk") == "free").then_some(())
    });
    // Watchers that begin during the delay.
    let mut late = primary.conn();
    late.send(&["LOCK.WAIT", "lk", "10000"]);
    let mut late_replica = replica.conn();
    late_replica.send(&["LOCK.WAIT", "lk", "10000"]);
    wait_blocked(&primary, 2);
    wait_blocked(&replica, 2);
    for watcher in [&mut early, &mut late, &mut early_replica, &mut late_replica] {
        assert_eq!(watcher.read(), Reply::Int(1));
        let now = now_ms();
        assert!(
            now >= until,
            "answered {} ms before the delay ended",
            until - now
        );
    }
    assert!(acquire_with(&mut c, "lk", "next", 1000, &[]).is_int());
    // A timeout shorter than the delay still answers 0 in time.
    acquire_with(&mut c, "short", "crashed", 50, &["LOCKDELAY", "5000"]).int();
    wait_delayed(&mut c, "short");
    let started = Instant::now();
    assert_eq!(c.call(&["LOCK.WAIT", "short", "200"]), Reply::Int(0));
    assert!(started.elapsed() < Duration::from_millis(2000));
    // LOCK.FORCERELEASE ends the delay: it answers 0 (nobody held it) and wakes the watchers.
    let mut watcher = primary.conn();
    watcher.send(&["LOCK.WAIT", "short", "10000"]);
    wait_blocked(&primary, 1);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "short"]), Reply::Int(0));
    assert_eq!(watcher.read(), Reply::Int(1));
    assert!(acquire_with(&mut c, "short", "next", 1000, &[]).is_int());
}
