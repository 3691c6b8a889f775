//! Free locks do not pile up: a lock that is free and awaited by nobody is deleted
//! `lock.tombstone-ttl` ms after it became free (at once with 0), as DEL would delete it (the
//! `del` event, WATCH), replicated as an effect. Fences of a reclaimed key still grow: the fence
//! floor keeps its last one.

mod common;

use common::*;

fn server_with_tombstone_ttl(ms: &str) -> Server {
    Server::start_with(
        Config::default()
            .with("notify-keyspace-events", "KEA")
            .module_arg("tombstone-ttl")
            .module_arg(ms),
    )
}

fn exists(c: &mut Conn, key: &str) -> i64 {
    c.call(&["EXISTS", key]).int()
}

#[test]
fn a_released_lock_is_reclaimed_after_the_tombstone_ttl_and_fences_still_grow() {
    let server = server_with_tombstone_ttl("300");
    let mut c = server.conn();
    let mut events = subscribe_keyspace(&server, "k");
    let first = acquire(&mut c, "k", "t1", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "t1"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(fence_of(&mut c, "k"), first);
    wait_for("the free lock to be reclaimed", || {
        (exists(&mut c, "k") == 0).then_some(())
    });
    assert_eq!(server.info_int("lock_reclaimed"), 1);
    assert_eq!(server.info_int("lock_keys"), 0);
    assert_eq!(next_event(&mut events), "lock.acquire");
    assert_eq!(next_event(&mut events), "lock.release");
    assert_eq!(next_event(&mut events), "del");
    let second = acquire(&mut c, "k", "t2", 60_000);
    assert!(second > first, "{second} after {first}");
}

#[test]
fn a_lock_keeps_one_index_entry_held_released_or_taken_again() {
    let server = server_with_tombstone_ttl("60000");
    let mut c = server.conn();
    let entries = || server.info_int("lock_index_entries");
    for key in ["a", "b", "c"] {
        acquire(&mut c, key, "t", 3_600_000);
    }
    assert_eq!(entries(), 3);
    // Released: the lease's entry becomes the reclaim's, for each.
    for key in ["a", "b"] {
        assert_eq!(c.call(&["LOCK.RELEASE", key, "t"]), Reply::Int(1));
    }
    assert_eq!(entries(), 3);
    // Taken again while its reclaim is queued, with a lease due after it: the reclaim stays
    // its entry (it comes due first, and the lock is looked at then); released and taken again
    // after that, the same.
    acquire(&mut c, "a", "t", 3_600_000);
    assert_eq!(entries(), 3);
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "t"]), Reply::Int(1));
    acquire(&mut c, "a", "t", 3_600_000);
    assert_eq!(entries(), 3);
    // With a lease due before it: the lease's entry takes the reclaim's place.
    acquire(&mut c, "b", "t", 1_000);
    assert_eq!(entries(), 3);
    wait_for("the short lease to end", || {
        (server.info_int("lock_expired") == 1).then_some(())
    });
    assert_eq!(state_of(&mut c, "b"), "free");
    assert_eq!(entries(), 3);
    // Deleted: their entries go with them.
    assert_eq!(c.call(&["DEL", "a", "b", "c"]), Reply::Int(3));
    assert_eq!(entries(), 0);
}

#[test]
fn with_tombstone_ttl_zero_release_expiry_and_forcerelease_delete_at_once() {
    let server = server_with_tombstone_ttl("0");
    let mut c = server.conn();
    acquire(&mut c, "released", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "released", "t"]), Reply::Int(1));
    assert_eq!(exists(&mut c, "released"), 0);
    acquire(&mut c, "forced", "t", 60_000);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "forced"]), Reply::Int(1));
    assert_eq!(exists(&mut c, "forced"), 0);
    acquire(&mut c, "expiring", "t", 100);
    wait_for("the lease to end", || {
        (server.info_int("lock_expired") == 1).then_some(())
    });
    // Expired and reclaimed in the same step.
    assert_eq!(exists(&mut c, "expiring"), 0);
    assert_eq!(server.info_int("lock_reclaimed"), 3);
    assert_eq!(server.info_int("lock_keys"), 0);
    // A release that only drops one of several holds keeps the lock.
    acquire(&mut c, "reentrant", "t", 60_000);
    let again = c.call(&["LOCK.ACQUIRE", "reentrant", "t", "60000", "REENTRANT"]);
    assert!(matches!(again, Reply::Int(_)), "{again:?}");
    assert_eq!(c.call(&["LOCK.RELEASE", "reentrant", "t"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "reentrant"), "held");
}

#[test]
fn with_tombstone_ttl_zero_a_mass_expiry_never_shows_a_free_lock() {
    // Expiring this many at once takes several timer steps of a few ms each. A lock freed late in a
    // step must be reclaimable by the step's own time, or it is left, free, to the next step
    // (an INFO between the two saw keys that no lease held).
    const LOCKS: usize = 40_000;
    let server = server_with_tombstone_ttl("0");
    let mut c = server.conn();
    for start in (0..LOCKS).step_by(1_000) {
        for i in start..start + 1_000 {
            c.send(&["LOCK.ACQUIRE", &format!("mass:{i}"), "t", "2000"]);
        }
        for _ in start..start + 1_000 {
            assert!(matches!(c.read(), Reply::Int(_)));
        }
    }
    // Every lease runs out while the server sleeps: they all come due at once.
    assert_eq!(c.call(&["DEBUG", "SLEEP", "2.1"]), Reply::status("OK"));
    let mut reads = 0;
    wait_for("every lease to end", || {
        let info = c.call(&["INFO", "lock"]).text();
        let field = |name: &str| -> i64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(-1)
        };
        let (keys, held, expired) = (
            field("lock_keys"),
            field("lock_held"),
            field("lock_expired"),
        );
        assert_eq!(keys, held, "a free lock was left after {expired} expiries");
        reads += 1;
        (expired == LOCKS as i64).then_some(())
    });
    assert!(reads > 1, "the expiry was never watched under way");
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(0));
    assert_eq!(server.info_int("lock_reclaimed"), LOCKS as i64);
}

#[test]
fn a_lock_with_waiters_is_handed_over_not_reclaimed() {
    let server = server_with_tombstone_ttl("0");
    let mut c = server.conn();
    acquire(&mut c, "k", "holder", 60_000);
    let mut waiter = queue_waiter(&server, "k", "waiter", 60_000, 5_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "holder"]), Reply::Int(1));
    let fence = granted(&mut waiter);
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k"), fence);
    assert_eq!(server.info_int("lock_reclaimed"), 0);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "waiter"]), Reply::Int(1));
    assert_eq!(exists(&mut c, "k"), 0);
}

#[test]
fn reclaim_is_replicated_and_the_replica_agrees() {
    let primary = server_with_tombstone_ttl("200");
    let replica = server_with_tombstone_ttl("200");
    replica.replicate_from(&primary);
    let mut p = primary.conn();
    let mut tap = ReplicationTap::attach(&primary);
    acquire(&mut p, "k", "t", 60_000);
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    wait_for("the free lock to be reclaimed", || {
        (exists(&mut p, "k") == 0).then_some(())
    });
    let stream = tap.commands_until("LOCK.APPLY");
    assert!(stream[0][2].starts_with("acquire:"), "{stream:?}");
    let stream = tap.commands_until("LOCK.APPLY");
    assert!(stream[0][2].starts_with("release:"), "{stream:?}");
    let stream = tap.commands_until("LOCK.APPLY");
    assert_eq!(stream.len(), 1, "{stream:?}");
    assert!(stream[0][2].starts_with("reclaim:"), "{stream:?}");
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(exists(&mut r, "k"), 0);
    assert_eq!(replica.info_int("lock_reclaimed"), 1);
    assert_eq!(replica.info_int("lock_keys"), 0);
    assert_eq!(r.call(&["DEBUG", "DIGEST"]), p.call(&["DEBUG", "DIGEST"]));
}

#[test]
fn free_locks_that_arrive_by_restore_copy_or_reload_are_reclaimed_too() {
    let server = server_with_tombstone_ttl("10000");
    let mut c = server.conn();
    acquire(&mut c, "original", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "original", "t"]), Reply::Int(1));
    let Reply::Bulk(dump) = c.call(&["DUMP", "original"]) else {
        panic!("DUMP");
    };
    assert_eq!(c.call(&["COPY", "original", "copied"]), Reply::Int(1));
    assert_eq!(restore(&mut c, "restored", &dump), Reply::status("OK"));
    assert_eq!(
        c.call(&["RENAME", "original", "renamed"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.tombstone-ttl", "100"]),
        Reply::status("OK")
    );
    // Reloaded values got their reclaim time from the setting of the time: move them along.
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    wait_for("every free lock to be reclaimed", || {
        (c.call(&["DBSIZE"]) == Reply::Int(0)).then_some(())
    });
    assert_eq!(server.info_int("lock_reclaimed"), 3);
}

/// Runs `cycles` acquire/release pairs on distinct keys (prefix `prefix`), pipelined.
fn cycle_distinct_keys(c: &mut Conn, prefix: &str, cycles: usize) {
    const BATCH: usize = 500;
    for start in (0..cycles).step_by(BATCH) {
        let end = (start + BATCH).min(cycles);
        for i in start..end {
            let key = format!("{prefix}:{i}");
            c.send(&["LOCK.ACQUIRE", &key, "token", "60000"]);
            c.send(&["LOCK.RELEASE", &key, "token"]);
        }
        for _ in start..end {
            assert!(matches!(c.read(), Reply::Int(_)));
            assert_eq!(c.read(), Reply::Int(1));
        }
    }
}

fn used_memory(server: &Server) -> i64 {
    server
        .info_field("memory", "used_memory")
        .expect("used_memory")
        .parse()
        .expect("integer")
}

#[test]
fn a_million_acquire_release_cycles_on_distinct_keys_leave_used_memory_flat() {
    let server = server_with_tombstone_ttl("0");
    let mut c = server.conn();
    cycle_distinct_keys(&mut c, "warmup", 20_000);
    let before = used_memory(&server);
    cycle_distinct_keys(&mut c, "order", 1_000_000);
    let after = used_memory(&server);
    eprintln!("1M cycles, tombstone-ttl 0: used_memory {before} -> {after}");
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(0));
    assert_eq!(server.info_int("lock_reclaimed"), 1_020_000);
    // A kept free lock costs over 100 bytes: a million would be 100 MB.
    assert!(
        after - before < 1 << 20,
        "used_memory grew from {before} to {after}"
    );
}

#[test]
fn cycles_with_a_tombstone_ttl_leave_used_memory_flat_once_it_passes() {
    let server = server_with_tombstone_ttl("200");
    let mut c = server.conn();
    cycle_distinct_keys(&mut c, "warmup", 20_000);
    wait_for("warm-up locks to be reclaimed", || {
        (server.info_int("lock_keys") == 0).then_some(())
    });
    let before = used_memory(&server);
    cycle_distinct_keys(&mut c, "order", 100_000);
    wait_for("every free lock to be reclaimed", || {
        (server.info_int("lock_keys") == 0).then_some(())
    });
    let after = used_memory(&server);
    eprintln!("100k cycles, tombstone-ttl 200: used_memory {before} -> {after}");
    assert!(
        after - before < 1 << 20,
        "used_memory grew from {before} to {after}"
    );
}

/// A replica applies the primary's releases and reclaims, and expires nothing itself: what it
/// keeps to find due locks goes with the locks.
#[test]
fn a_replica_applying_cycles_and_reclaims_keeps_used_memory_flat() {
    // A replica keeps a replication backlog too (for replicas of its own), 10 MB by default on
    // Valkey: a small one, filled by the warm-up, keeps its growth out of the comparison.
    let with_backlog = || {
        Server::start_with(
            Config::default()
                .with("repl-backlog-size", "1mb")
                .module_arg("tombstone-ttl")
                .module_arg("200"),
        )
    };
    let primary = with_backlog();
    let replica = with_backlog();
    replica.replicate_from(&primary);
    let mut p = primary.conn();
    cycle_distinct_keys(&mut p, "warmup", 20_000);
    wait_for("warm-up locks to be reclaimed on the replica", || {
        (replica.info_int("lock_keys") == 0).then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    let before = used_memory(&replica);
    cycle_distinct_keys(&mut p, "order", 100_000);
    wait_for("every free lock to be reclaimed on the replica", || {
        (primary.info_int("lock_keys") == 0 && replica.info_int("lock_keys") == 0).then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(replica.info_int("lock_reclaimed"), 120_000);
    let after = used_memory(&replica);
    eprintln!("100k cycles, tombstone-ttl 200, replica: used_memory {before} -> {after}");
    assert!(
        after - before < 1 << 20,
        "the replica's used_memory grew from {before} to {after}"
    );
}

/// A lock deleted while clients wait for it: a fresh lock is created for them, and that
/// creation reaches replicas and the AOF like every other change, before the grant.
#[test]
fn a_fresh_lock_created_for_waiters_is_replicated() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut tap = ReplicationTap::attach(&primary);
    let mut c = primary.conn();
    acquire(&mut c, "k", "holder", 60_000);
    let mut waiter = queue_waiter(&primary, "k", "waiter", 60_000, 5_000);
    assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1));
    let fence = granted(&mut waiter);
    let stream: Vec<Vec<String>> = (0..3)
        .flat_map(|_| tap.commands_until("LOCK.APPLY"))
        .collect();
    let names: Vec<&str> = stream.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(
        names,
        ["LOCK.APPLY", "DEL", "LOCK.APPLY", "LOCK.APPLY"],
        "{stream:?}"
    );
    assert!(stream[2][2].starts_with("sync:0:"), "{stream:?}");
    assert!(
        stream[3][2].starts_with(&format!("acquire:{fence}:")),
        "{stream:?}"
    );
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(
        replica.conn().call(&["DEBUG", "DIGEST"]),
        c.call(&["DEBUG", "DIGEST"])
    );
}

/// The next propagated command that is not SELECT (MULTI included: a change sent as several
/// effects is wrapped in one).
fn next_effect(tap: &mut ReplicationTap) -> Vec<String> {
    loop {
        let command: Vec<String> = tap
            .next_command()
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if command[0] != "SELECT" {
            return command;
        }
    }
}

#[test]
fn with_tombstone_ttl_zero_a_freeing_change_and_its_reclaim_travel_as_one_effect() {
    let primary = server_with_tombstone_ttl("0");
    let replica = server_with_tombstone_ttl("0");
    replica.replicate_from(&primary);
    let mut events = subscribe_keyspace(&replica, "k");
    let mut tap = ReplicationTap::attach(&primary);
    let mut p = primary.conn();
    let first = acquire(&mut p, "k", "t", 60_000);
    assert_eq!(next_effect(&mut tap)[0], "LOCK.APPLY");
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    assert_eq!(
        next_effect(&mut tap),
        ["LOCK.APPLY", "k", &format!("release:{first}::x")]
    );
    let forced = acquire(&mut p, "f", "t", 60_000);
    next_effect(&mut tap);
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "f"]), Reply::Int(1));
    assert_eq!(
        next_effect(&mut tap),
        ["LOCK.APPLY", "f", &format!("forcerelease:{forced}::x")]
    );
    let expiring = acquire(&mut p, "e", "t", 50);
    next_effect(&mut tap);
    assert_eq!(
        next_effect(&mut tap),
        ["LOCK.APPLY", "e", &format!("expired:{expiring}::x")]
    );
    wait_replica_caught_up(&primary, &replica);
    // The replica announced and counted what its primary did: the release, then the deletion.
    assert_eq!(next_event(&mut events), "lock.acquire");
    assert_eq!(next_event(&mut events), "lock.release");
    assert_eq!(next_event(&mut events), "del");
    let mut r = replica.conn();
    for server in [&primary, &replica] {
        assert_eq!(server.info_int("lock_released"), 1);
        assert_eq!(server.info_int("lock_forced"), 1);
        assert_eq!(server.info_int("lock_expired"), 1);
        assert_eq!(server.info_int("lock_reclaimed"), 3);
        assert_eq!(server.info_int("lock_keys"), 0);
    }
    assert_eq!(exists(&mut r, "k"), 0);
    assert_eq!(r.call(&["DEBUG", "DIGEST"]), p.call(&["DEBUG", "DIGEST"]));
    // The floor kept the fences on both: the replica, promoted, grants above them.
    let again = acquire(&mut p, "k", "t", 60_000);
    assert!(
        again > expiring && expiring > forced && forced > first,
        "{first} {forced} {expiring} {again}"
    );
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(fence_of(&mut r, "k"), again);
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Reply::status("OK"));
    assert_eq!(r.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    let promoted = acquire(&mut r, "f", "u", 60_000);
    assert!(promoted > again, "{promoted} > {again}");
}

#[test]
fn with_tombstone_ttl_zero_a_lock_that_is_not_reclaimed_sends_its_change_alone() {
    let primary = server_with_tombstone_ttl("0");
    let replica = server_with_tombstone_ttl("0");
    replica.replicate_from(&primary);
    let mut tap = ReplicationTap::attach(&primary);
    let mut p = primary.conn();
    // Handed to a waiter: the release, then the grant, no reclaim.
    let first = acquire(&mut p, "k", "holder", 60_000);
    next_effect(&mut tap);
    let mut waiter = queue_waiter(&primary, "k", "waiter", 60_000, 5_000);
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "holder"]), Reply::Int(1));
    let handed = granted(&mut waiter);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let effect = next_effect(&mut tap);
        if effect[0] == "LOCK.APPLY" {
            seen.push(effect[2].clone());
        }
    }
    assert_eq!(seen[0], format!("release:{first}:"));
    assert!(
        seen[1].starts_with(&format!("acquire:{handed}:")),
        "{seen:?}"
    );
    // One of two reentrant holds dropped: held still.
    acquire(&mut p, "r", "t", 60_000);
    let again = acquire_with(&mut p, "r", "t", 60_000, &["REENTRANT"]);
    assert!(matches!(again, Reply::Int(_)), "{again:?}");
    assert_eq!(p.call(&["LOCK.RELEASE", "r", "t"]), Reply::Int(1));
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(state_of(&mut r, "k"), "held");
    assert_eq!(state_of(&mut r, "r"), "held");
    assert_eq!(r.call(&["DEBUG", "DIGEST"]), p.call(&["DEBUG", "DIGEST"]));
}

#[test]
fn with_tombstone_ttl_zero_the_aof_replays_a_freed_and_reclaimed_lock() {
    let server = Server::start_with(
        Config::default()
            .with("appendonly", "yes")
            .with("aof-use-rdb-preamble", "no")
            .module_arg("tombstone-ttl")
            .module_arg("0"),
    );
    let mut c = server.conn();
    let mut last = 0;
    for i in 0..5 {
        last = acquire(&mut c, "k", &format!("t{i}"), 60_000);
        assert_eq!(
            c.call(&["LOCK.RELEASE", "k", &format!("t{i}")]),
            Reply::Int(1)
        );
    }
    acquire(&mut c, "held", "t", 60_000);
    let digest = c.call(&["DEBUG", "DIGEST"]);
    assert_eq!(c.call(&["DEBUG", "LOADAOF"]), Reply::status("OK"));
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), digest);
    assert_eq!(exists(&mut c, "k"), 0);
    let after = acquire(&mut c, "k", "u", 60_000);
    assert!(after > last, "{after} > {last}");
}
