//! Replicas mirror the primary's locks exactly (effects with absolute deadlines), refuse writes,
//! answer LOCK.FENCE / LOCK.INFO, never expire a lease on their own, and after promotion grant
//! fences above everything the old primary issued, through full and partial resynchronisation.

mod common;
use common::*;

use std::thread::sleep;
use std::time::{Duration, Instant};

/// A primary that starts full syncs at once (Redis 7 waits 5 s for more replicas by default).
fn primary_config() -> Config {
    Config::default().with("repl-diskless-sync-delay", "0")
}

/// A primary and one replica, linked and in sync.
fn pair() -> (Server, Server) {
    let primary = Server::start_with(primary_config());
    let replica = Server::start();
    replica.replicate_from(&primary);
    // After a diskless full sync the primary streams nothing until the replica's first
    // REPLCONF ACK (up to a second): get past that so later changes arrive at once.
    let mut p = primary.conn();
    assert_eq!(p.call(&["SET", "__link_check__", "1"]), Reply::status("OK"));
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(
        replica.conn().call(&["GET", "__link_check__"]),
        Reply::bulk("1")
    );
    assert_eq!(p.call(&["DEL", "__link_check__"]), Reply::Int(1));
    wait_replica_caught_up(&primary, &replica);
    (primary, replica)
}

/// `LOCK.INFO` without `ttl`, and the `ttl` on its own.
fn info_and_ttl(conn: &mut Conn, key: &str) -> (Option<Vec<(String, Reply)>>, Option<i64>) {
    match lock_info(conn, key) {
        None => (None, None),
        Some(fields) => {
            let ttl = fields
                .iter()
                .find(|(n, _)| n == "ttl")
                .map(|(_, v)| v.int());
            (
                Some(fields.into_iter().filter(|(n, _)| n != "ttl").collect()),
                ttl,
            )
        }
    }
}

/// Waits until the replica has every write of the primary (`wait_replica_caught_up`: the
/// harness' `sync_replicas` runs WAIT on a fresh connection, which waits for nothing), then
/// checks that `key` reads alike on both (ttl within 200 ms) and is stored alike (DEBUG
/// DIGEST-VALUE, and the whole DEBUG DIGEST).
fn assert_mirrored(primary: &Server, replica: &Server, key: &str) {
    wait_replica_caught_up(primary, replica);
    let mut p = primary.conn();
    let mut r = replica.conn();
    let (p_info, p_ttl) = info_and_ttl(&mut p, key);
    let (r_info, r_ttl) = info_and_ttl(&mut r, key);
    assert_eq!(p_info, r_info, "LOCK.INFO {key} on primary and replica");
    match (p_ttl, r_ttl) {
        (Some(-1), Some(-1)) | (None, None) => {}
        (Some(a), Some(b)) => assert!(a >= 0 && b >= 0 && (a - b).abs() <= 200, "ttl {a} vs {b}"),
        other => panic!("ttl {other:?}"),
    }
    if p_info.is_some() {
        assert_eq!(
            digest_value(&mut p, key),
            digest_value(&mut r, key),
            "DIGEST-VALUE {key}"
        );
    }
    assert_eq!(
        p.call(&["DEBUG", "DIGEST"]),
        r.call(&["DEBUG", "DIGEST"]),
        "DEBUG DIGEST"
    );
}

fn promote(replica: &Server) {
    assert_eq!(
        replica.conn().call(&["REPLICAOF", "NO", "ONE"]),
        Reply::status("OK")
    );
    wait_for("promoted to primary", || {
        (replica.info_field("replication", "role").as_deref() == Some("master")).then_some(())
    });
}

fn repl_int(server: &Server, field: &str) -> i64 {
    server
        .info_field("replication", field)
        .or_else(|| server.info_field("stats", field))
        .unwrap_or_else(|| panic!("no INFO field {field}"))
        .parse()
        .expect("integer")
}

// ---------------------------------------------------------------------------------------------

#[test]
fn replica_mirrors_acquire_renew_release_expiry_and_forcerelease() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let mut r = replica.conn();

    let fence = acquire(&mut p, "k", "owner", 60_000);
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(state_of(&mut r, "k"), "held");
    assert_eq!(fence_of(&mut r, "k"), fence);

    assert_eq!(
        p.call(&["LOCK.ACQUIRE", "k", "owner", "60000", "REENTRANT"]),
        Reply::Int(fence)
    );
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(lock_field(&mut r, "k", "holds"), Reply::Int(2));

    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "owner", "30000"]),
        Reply::Int(1)
    );
    assert_mirrored(&primary, &replica, "k");
    let ttl = lock_field(&mut r, "k", "ttl").int();
    assert!(ttl > 25_000 && ttl <= 30_000, "replica ttl {ttl}");

    assert_eq!(p.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(lock_field(&mut r, "k", "holds"), Reply::Int(1));
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(fence_of(&mut r, "k"), fence);

    // Expiry: the primary's timer removes the holder and the replica gets that change.
    let short = acquire(&mut p, "k", "brief", 300);
    assert!(short > fence);
    assert_mirrored(&primary, &replica, "k");
    wait_for("primary expired the lease", || {
        (primary.info_int("lock_expired") == 1).then_some(())
    });
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(fence_of(&mut r, "k"), short);
    assert_eq!(replica.info_int("lock_expired"), 1);

    let forced = acquire(&mut p, "k", "victim", 60_000);
    assert!(forced > short);
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(fence_of(&mut r, "k"), forced);

    // DEL and a fresh grant.
    assert_eq!(p.call(&["DEL", "k"]), Reply::Int(1));
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(r.call(&["LOCK.INFO", "k"]), Reply::Nil);
    let fresh = acquire(&mut p, "k", "new", 60_000);
    assert!(fresh > forced);
    assert_mirrored(&primary, &replica, "k");
}

/// The module counts applied effects on replicas "so INFO reads alike on both".
#[test]

fn replica_info_counters_match_the_primary() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    acquire(&mut p, "k", "owner", 60_000);
    p.call(&["LOCK.ACQUIRE", "k", "owner", "60000", "REENTRANT"]);
    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "owner", "30000"]),
        Reply::Int(1)
    );
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
    acquire(&mut p, "k", "victim", 60_000);
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    acquire(&mut p, "k", "brief", 200);
    wait_for("primary expired the lease", || {
        (primary.info_int("lock_expired") == 1).then_some(())
    });
    acquire(&mut p, "k2", "held", 60_000);
    wait_replica_caught_up(&primary, &replica);
    for field in [
        "lock_acquired",
        "lock_renewed",
        "lock_expired",
        "lock_forced",
        "lock_keys",
        "lock_held",
        "lock_released",
    ] {
        assert_eq!(
            primary.info_int(field),
            replica.info_int(field),
            "INFO {field}"
        );
    }
}

#[test]
fn replica_refuses_writes_with_readonly() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let fence = acquire(&mut p, "k", "owner", 60_000);
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    let readonly = Reply::error("READONLY You can't write against a read only replica.");
    for args in [
        vec!["LOCK.ACQUIRE", "k", "owner", "1000"],
        vec!["LOCK.ACQUIRE", "other", "t", "1000"],
        vec!["LOCK.RELEASE", "k", "owner"],
        vec!["LOCK.RENEW", "k", "owner", "1000"],
        vec!["LOCK.FORCERELEASE", "k"],
        vec!["LOCK.APPLY", "k", "release", "5", "5"],
    ] {
        assert_eq!(r.call(&args), readonly, "{args:?}");
    }
    assert_eq!(r.call(&["EXISTS", "other"]), Reply::Int(0));
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(state_of(&mut r, "k"), "held");
    assert_eq!(fence_of(&mut r, "k"), fence);
    let ttl = lock_field(&mut r, "k", "ttl").int();
    assert!(ttl > 50_000, "the refused renew changed nothing: {ttl}");
}

#[test]
fn fence_and_info_work_on_the_replica() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let mut r = replica.conn();
    let fence = acquire(&mut p, "k", "owner", 60_000);
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &(fence - 1).to_string()]),
        Reply::Int(0)
    );
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &(fence + 1).to_string()]),
        Reply::Int(0)
    );
    assert_eq!(r.call(&["LOCK.FENCE", "missing", "5"]), Reply::Int(0));
    assert_eq!(r.call(&["LOCK.INFO", "missing"]), Reply::Nil);
    let info = r.call(&["LOCK.INFO", "k"]);
    let items = info.items();
    assert_eq!(items.len(), 26);
    assert_eq!(items[0], Reply::status("state"));
    assert_eq!(items[1], Reply::status("held"));
    assert_eq!(items[3], Reply::Int(fence));
    assert_eq!(items[7], Reply::Int(1));
    assert!(!info.contains_bytes(b"owner"), "{info:?}");
    let mut r3 = replica.conn3();
    let Reply::Map(pairs) = r3.call(&["LOCK.INFO", "k"]) else {
        panic!("RESP3 map")
    };
    assert_eq!(pairs[1], (Reply::status("fence"), Reply::Int(fence)));
    assert_eq!(replica.info_int("lock_fence_checks"), 4);
    assert_eq!(replica.info_int("lock_fence_rejects"), 3);

    assert_eq!(p.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(lock_field(&mut r, "k", "ttl"), Reply::Int(-1));
}

#[test]
fn replica_applies_leases_longer_than_its_own_max_ttl() {
    let (primary, replica) = pair();
    let mut r = replica.conn();
    assert_eq!(
        r.call(&["CONFIG", "SET", "lock.max-ttl", "1000"]),
        Reply::status("OK")
    );
    let mut p = primary.conn();
    let fence = acquire(&mut p, "k", "owner", 60_000);
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(state_of(&mut r, "k"), "held");
    assert_eq!(fence_of(&mut r, "k"), fence);
    let ttl = lock_field(&mut r, "k", "ttl").int();
    assert!(ttl > 55_000 && ttl <= 60_000, "replica ttl {ttl}");
    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "owner", "120000"]),
        Reply::Int(1)
    );
    assert_mirrored(&primary, &replica, "k");
    let ttl = lock_field(&mut r, "k", "ttl").int();
    assert!(ttl > 115_000 && ttl <= 120_000, "replica ttl {ttl}");
    // A long token too: limits are for clients, not for the primary's effects.
    assert_eq!(
        r.call(&["CONFIG", "SET", "lock.max-token-len", "4"]),
        Reply::status("OK")
    );
    let long_token = "t".repeat(200);
    acquire(&mut p, "k2", &long_token, 60_000);
    assert_mirrored(&primary, &replica, "k2");
    assert_eq!(state_of(&mut r, "k2"), "held");
    assert_eq!(
        r.call(&["CONFIG", "SET", "lock.max-token-len", "256"]),
        Reply::status("OK")
    );
    // After promotion the replica's own limit applies to its clients.
    promote(&replica);
    assert_eq!(
        r.call(&["LOCK.ACQUIRE", "k3", "t", "60000"]),
        Reply::error("ERR invalid ttl-ms: exceeds lock.max-ttl (1000)")
    );
    assert_eq!(r.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
}

#[test]
fn full_sync_carries_locks_and_the_fence_floor() {
    let primary = Server::start_with(primary_config());
    let mut p = primary.conn();
    let held = acquire(&mut p, "held", "owner", 60_000);
    let free = acquire(&mut p, "free", "x", 60_000);
    assert_eq!(p.call(&["LOCK.RELEASE", "free", "x"]), Reply::Int(1));
    // A fence ahead of the clock that only the floor (RDB aux data of the full sync) carries.
    let planted = fence_far_ahead(&mut p);
    plant_fence(&mut p, "gone", planted);
    let issued = acquire(&mut p, "gone", "g", 60_000);
    assert_eq!(
        issued as u64,
        planted + 1,
        "the primary issued a fence ahead of the clock"
    );
    assert_eq!(p.call(&["DEL", "gone"]), Reply::Int(1));
    // Another key whose fence is also the largest issued, deleted on the replica after promotion.
    let top = acquire(&mut p, "top", "t", 60_000);
    assert_eq!(top, issued + 1);

    let replica = Server::start();
    replica.replicate_from(&primary);
    assert_eq!(repl_int(&primary, "sync_full"), 1);
    assert_mirrored(&primary, &replica, "held");
    assert_mirrored(&primary, &replica, "free");
    assert_mirrored(&primary, &replica, "top");
    let mut r = replica.conn();
    assert_eq!(state_of(&mut r, "held"), "held");
    assert_eq!(fence_of(&mut r, "held"), held);
    assert_eq!(state_of(&mut r, "free"), "free");
    assert_eq!(fence_of(&mut r, "free"), free);
    assert_eq!(r.call(&["LOCK.INFO", "gone"]), Reply::Nil);

    promote(&replica);
    assert_eq!(r.call(&["DEL", "top"]), Reply::Int(1));
    let after_top = acquire(&mut r, "top", "new", 60_000);
    assert!(
        after_top > top,
        "{after_top} > {top}, the largest fence the primary issued"
    );
    let after_gone = acquire(&mut r, "gone", "new", 60_000);
    assert!(after_gone > after_top);
    // The held lock came over with its token.
    assert_eq!(r.call(&["LOCK.RELEASE", "held", "owner"]), Reply::Int(1));
    let next_held = acquire(&mut r, "held", "new", 60_000);
    assert!(next_held > after_gone);
}

#[test]
fn full_sync_carries_the_fence_floor_without_any_lock_key() {
    let primary = Server::start_with(primary_config());
    let mut p = primary.conn();
    let planted = fence_far_ahead(&mut p);
    plant_fence(&mut p, "gone", planted);
    let issued = acquire(&mut p, "gone", "g", 60_000);
    assert_eq!(p.call(&["DEL", "gone"]), Reply::Int(1));
    assert_eq!(p.call(&["DBSIZE"]), Reply::Int(0));
    let replica = Server::start();
    replica.replicate_from(&primary);
    wait_replica_caught_up(&primary, &replica);
    promote(&replica);
    let mut r = replica.conn();
    let next = acquire(&mut r, "gone", "new", 60_000);
    assert!(next > issued, "{next} > {issued}");
}

#[test]
fn partial_resync_keeps_the_replica_equal() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let fence = acquire(&mut p, "k", "owner", 60_000);
    acquire(&mut p, "gone", "g", 60_000);
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(repl_int(&primary, "sync_full"), 1);
    assert_eq!(repl_int(&primary, "sync_partial_ok"), 0);

    let mut r = replica.conn();
    assert_eq!(r.call(&["CLIENT", "KILL", "TYPE", "master"]), Reply::Int(1));
    // Changes the replica has not seen yet when it reconnects.
    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "owner", "45000"]),
        Reply::Int(1)
    );
    assert_eq!(
        p.call(&["LOCK.ACQUIRE", "k", "owner", "45000", "REENTRANT"]),
        Reply::Int(fence)
    );
    let other = acquire(&mut p, "other", "o", 60_000);
    assert_eq!(p.call(&["LOCK.RELEASE", "other", "o"]), Reply::Int(1));
    assert_eq!(p.call(&["DEL", "gone"]), Reply::Int(1));

    wait_for("partial resync", || {
        (repl_int(&primary, "sync_partial_ok") == 1).then_some(())
    });
    wait_for("replica link up", || {
        (replica
            .info_field("replication", "master_link_status")
            .as_deref()
            == Some("up"))
        .then_some(())
    });
    assert_eq!(repl_int(&primary, "sync_full"), 1, "no second full sync");
    assert_mirrored(&primary, &replica, "k");
    assert_mirrored(&primary, &replica, "other");
    assert_mirrored(&primary, &replica, "gone");
    assert_eq!(lock_field(&mut r, "k", "holds"), Reply::Int(2));
    assert_eq!(state_of(&mut r, "other"), "free");
    assert_eq!(fence_of(&mut r, "other"), other);

    promote(&replica);
    let next = acquire(&mut r, "other", "new", 60_000);
    assert!(next > other);
    let gone = acquire(&mut r, "gone", "new", 60_000);
    assert!(gone > next);
}

#[test]
fn replica_does_not_expire_a_lock_on_its_own() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let mut r = replica.conn();
    let start = Instant::now();
    let fence = acquire(&mut p, "k", "owner", 400);
    assert_mirrored(&primary, &replica, "k");
    let held_digest = digest_value(&mut r, "k");
    assert_eq!(state_of(&mut r, "k"), "held");
    assert_eq!(replica.info_int("lock_held"), 1);

    let mut stopped = Stopped::stop(primary.pid());
    wait_for("replica reads the lease as over", || {
        (state_of(&mut r, "k") == "free").then_some(())
    });
    // Deadlines are whole milliseconds: allow the truncation.
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(398),
        "free {elapsed:?} after a 400 ms grant"
    );
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(lock_field(&mut r, "k", "ttl"), Reply::Int(-1));
    assert_eq!(lock_field(&mut r, "k", "holds"), Reply::Int(0));
    assert_eq!(fence_of(&mut r, "k"), fence);
    // Give a replica that wrongly expires on its own (timer rechecks every 100 ms) time to do it.
    sleep(Duration::from_millis(300));
    assert_eq!(
        digest_value(&mut r, "k"),
        held_digest,
        "the replica still stores the holder"
    );
    assert_eq!(replica.info_int("lock_expired"), 0);
    assert_eq!(replica.info_int("lock_held"), 1);
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(0)
    );

    stopped.resume();
    wait_for("replica receives the expiry", || {
        (digest_value(&mut r, "k") != held_digest).then_some(())
    });
    assert_eq!(replica.info_int("lock_expired"), 1);
    assert_eq!(replica.info_int("lock_held"), 0);
    assert_mirrored(&primary, &replica, "k");
    assert_eq!(primary.info_int("lock_expired"), 1);

    promote(&replica);
    let next = acquire(&mut r, "k", "new", 60_000);
    assert!(next > fence, "{next} > {fence}");
}

#[test]
fn promoted_replica_expires_leases_and_grants_larger_fences() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let long = acquire(&mut p, "long", "owner", 60_000);
    let short = acquire(&mut p, "short", "brief", 500);
    let free = acquire(&mut p, "free", "f", 60_000);
    assert_eq!(p.call(&["LOCK.RELEASE", "free", "f"]), Reply::Int(1));
    assert_mirrored(&primary, &replica, "long");
    assert_mirrored(&primary, &replica, "short");
    // The old primary goes away (failover) before the short lease ends.
    let mut primary = primary;
    primary.kill();
    promote(&replica);
    let mut r = replica.conn();
    // The promoted replica expires what the old primary would have.
    wait_for("promoted replica expired the lease", || {
        (replica.info_int("lock_expired") == 1).then_some(())
    });
    assert_eq!(state_of(&mut r, "short"), "free");
    assert_eq!(fence_of(&mut r, "short"), short);
    assert_eq!(state_of(&mut r, "long"), "held");
    assert_eq!(
        r.call(&["LOCK.ACQUIRE", "long", "other", "1000"]),
        Reply::Nil
    );
    assert_eq!(
        r.call(&["LOCK.FENCE", "long", &long.to_string()]),
        Reply::Int(1)
    );
    let largest = long.max(short).max(free);
    let next_short = acquire(&mut r, "short", "new", 60_000);
    assert!(next_short > largest, "{next_short} > {largest}");
    let next_free = acquire(&mut r, "free", "new", 60_000);
    assert!(next_free > next_short);
    assert_eq!(r.call(&["LOCK.RELEASE", "long", "owner"]), Reply::Int(1));
    let next_long = acquire(&mut r, "long", "new", 60_000);
    assert!(next_long > next_free);
}

/// What a replica's LOCK.FENCE means (README): the answer for the state the replica has applied,
/// with the deadline the primary set, checked against the replica's clock. While the stream is
/// held back (`CLIENT PAUSE WRITE` on the replica pauses what its primary sends), a fence the
/// primary already released is still current there, and a new grant is not yet; a lease past
/// its deadline is never current, whether the expiry arrived or not. Once the replica catches
/// up, it answers as the primary does.
#[test]
fn fence_on_a_replica_answers_for_the_state_it_has_applied() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let mut r = replica.conn();
    let released = acquire(&mut p, "released", "t", 60_000);
    let expiring = acquire(&mut p, "expiring", "t", 300);
    wait_replica_caught_up(&primary, &replica);
    let fence = |c: &mut Conn, key: &str, fence: i64| {
        c.call(&["LOCK.FENCE", key, &fence.to_string()]).int()
    };
    assert_eq!(fence(&mut r, "released", released), 1);
    assert_eq!(
        r.call(&["CLIENT", "PAUSE", "10000", "WRITE"]),
        Reply::status("OK")
    );
    assert_eq!(p.call(&["LOCK.RELEASE", "released", "t"]), Reply::Int(1));
    let granted = acquire(&mut p, "granted", "t", 60_000);
    assert_eq!(fence(&mut p, "released", released), 0);
    assert_eq!(fence(&mut p, "granted", granted), 1);
    // Held back: the replica still has the old state.
    assert_eq!(fence(&mut r, "released", released), 1);
    assert_eq!(fence(&mut r, "granted", granted), 0);
    // The 300 ms lease ends by the replica's clock, though the expiry has not arrived.
    let start = Instant::now();
    wait_for("the lease to end on the replica's clock", || {
        (fence(&mut r, "expiring", expiring) == 0).then_some(())
    });
    assert!(start.elapsed() < Duration::from_millis(400));
    assert_eq!(
        lock_field(&mut r, "expiring", "state"),
        Reply::status("free")
    );
    assert_eq!(r.call(&["CLIENT", "UNPAUSE"]), Reply::status("OK"));
    wait_replica_caught_up(&primary, &replica);
    for (key, f) in [
        ("released", released),
        ("granted", granted),
        ("expiring", expiring),
    ] {
        assert_eq!(fence(&mut r, key, f), fence(&mut p, key, f), "{key}");
    }
}
