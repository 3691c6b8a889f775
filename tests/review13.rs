//! review13: with `lock.tombstone-ttl 0` a release, expiry or forced release that deletes the
//! lock travels as one effect (`event:fence:floor:x`). Every path that frees a lock keeps the
//! replica (and the AOF) identical to the primary: data, counters, namespace lines,
//! notifications, watchers, the fence floor. And the lease index's inline key names follow
//! every key shape and move.

mod common;

use std::collections::BTreeMap;

use common::*;

const POLICY: &str = "app prefix=app: mode=warn";

fn config() -> Config {
    Config::default()
        .with("notify-keyspace-events", "KEA")
        .namespaces(POLICY)
        .module_arg("tombstone-ttl")
        .module_arg("0")
}

fn pair() -> (Server, Server) {
    let primary = Server::start_with(config());
    let replica = Server::start_with(config());
    replica.replicate_from(&primary);
    (primary, replica)
}

fn pair_with_aof() -> (Server, Server) {
    let aof = || {
        config()
            .with("appendonly", "yes")
            .with("aof-use-rdb-preamble", "yes")
    };
    let primary = Server::start_with(aof());
    let replica = Server::start_with(aof());
    replica.replicate_from(&primary);
    (primary, replica)
}

const COUNTERS: [&str; 10] = [
    "lock_acquired",
    "lock_released",
    "lock_expired",
    "lock_forced",
    "lock_reclaimed",
    "lock_session_released",
    "lock_keys",
    "lock_held",
    "lock_shared_grants",
    "lock_permit_grants",
];

fn counters(server: &Server) -> BTreeMap<&'static str, i64> {
    COUNTERS
        .into_iter()
        .map(|field| (field, server.info_int(field)))
        .collect()
}

/// The counted fields of `lock_namespace_app` (ages left out: they are times).
fn namespace_line(server: &Server) -> String {
    let info = server.conn().call(&["INFO", "lock"]).text();
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("lock_namespace_app:"))
        .unwrap_or("")
        .trim()
        .to_string();
    line.split(',')
        .filter(|pair| !pair.contains("_ms="))
        .collect::<Vec<_>>()
        .join(",")
}

/// The replica caught up holds the same data and counted the same, overall and per namespace.
fn assert_same(primary: &Server, replica: &Server) {
    wait_replica_caught_up(primary, replica);
    let mut p = primary.conn();
    let mut r = replica.conn();
    assert_eq!(
        r.call(&["DEBUG", "DIGEST"]),
        p.call(&["DEBUG", "DIGEST"]),
        "DEBUG DIGEST"
    );
    assert_eq!(counters(replica), counters(primary));
    assert_eq!(namespace_line(replica), namespace_line(primary));
}

fn exists(c: &mut Conn, key: &str) -> i64 {
    c.call(&["EXISTS", key]).int()
}

fn wait_gone(server: &Server, key: &str) {
    let mut c = server.conn();
    wait_for(&format!("{key} to be deleted"), || {
        (exists(&mut c, key) == 0).then_some(())
    });
}

#[test]
fn shared_and_permit_locks_freed_by_their_last_holder_leave_the_replica_identical() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    // Shared: two readers, each releasing; the last one frees and deletes.
    for reader in ["r1", "r2"] {
        assert!(acquire_with(&mut p, "app:s", reader, 60_000, &["SHARED"]).is_int());
    }
    assert_eq!(p.call(&["LOCK.RELEASE", "app:s", "r1"]), Reply::Int(1));
    assert_eq!(p.call(&["LOCK.RELEASE", "app:s", "r2"]), Reply::Int(1));
    assert_eq!(exists(&mut p, "app:s"), 0);
    // Permits: two of a semaphore of 2.
    for holder in ["p1", "p2"] {
        assert!(acquire_with(&mut p, "app:p", holder, 60_000, &["LIMIT", "2"]).is_int());
    }
    assert_eq!(p.call(&["LOCK.RELEASE", "app:p", "p1"]), Reply::Int(1));
    assert_eq!(p.call(&["LOCK.RELEASE", "app:p", "p2"]), Reply::Int(1));
    assert_eq!(exists(&mut p, "app:p"), 0);
    // A shared holder whose lease runs out, the timer freeing it.
    assert!(acquire_with(&mut p, "app:e", "r", 100, &["SHARED"]).is_int());
    wait_gone(&primary, "app:e");
    // Forced release of a shared lock.
    assert!(acquire_with(&mut p, "app:f", "r", 60_000, &["SHARED"]).is_int());
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "app:f"]), Reply::Int(1));
    assert_same(&primary, &replica);
    let mut r = replica.conn();
    for key in ["app:s", "app:p", "app:e", "app:f"] {
        assert_eq!(exists(&mut r, key), 0, "{key} on the replica");
    }
    assert_eq!(replica.info_int("lock_reclaimed"), 4);
}

#[test]
fn mrelease_multi_exec_and_lua_releases_leave_replica_and_aof_identical() {
    let (primary, replica) = pair_with_aof();
    // A replica of the replica: the one effect is passed on as it came.
    let chained = Server::start_with(config());
    chained.replicate_from(&replica);
    let mut p = primary.conn();
    let mut fences = Vec::new();
    for key in ["app:a", "app:b", "app:c"] {
        fences.push(acquire(&mut p, key, "t", 60_000));
    }
    assert_eq!(
        p.call(&["LOCK.MRELEASE", "3", "app:a", "app:b", "app:c", "t"]),
        Reply::Int(3)
    );
    // MULTI: acquire, release (deleted), acquire again, release again.
    assert_eq!(p.call(&["MULTI"]), Reply::status("OK"));
    for command in [
        ["LOCK.ACQUIRE", "app:m", "t", "60000"],
        ["LOCK.RELEASE", "app:m", "t", ""],
        ["LOCK.ACQUIRE", "app:m", "u", "60000"],
        ["LOCK.RELEASE", "app:m", "u", ""],
    ] {
        let command: Vec<&str> = command.into_iter().filter(|a| !a.is_empty()).collect();
        assert_eq!(p.call(&command), Reply::status("QUEUED"));
    }
    let exec = p.call(&["EXEC"]);
    let items = exec.items();
    assert_eq!(items[1], Reply::Int(1));
    assert_eq!(items[3], Reply::Int(1));
    let (m1, m2) = (items[0].int(), items[2].int());
    assert!(m2 > m1, "{m2} > {m1}");
    fences.extend([m1, m2]);
    // A script.
    fences.push(acquire(&mut p, "app:l", "t", 60_000));
    assert_eq!(
        p.call(&[
            "EVAL",
            "return redis.call('LOCK.RELEASE', KEYS[1], ARGV[1])",
            "1",
            "app:l",
            "t"
        ]),
        Reply::Int(1)
    );
    for key in ["app:a", "app:b", "app:c", "app:m", "app:l"] {
        assert_eq!(exists(&mut p, key), 0, "{key}");
    }
    assert_same(&primary, &replica);
    assert_same(&replica, &chained);
    // A rewrite (RDB preamble), then more freed-and-deleted locks after it, and the AOF loads
    // back to the same data on both.
    assert_eq!(
        p.call(&["BGREWRITEAOF"]),
        Reply::status("Background append only file rewriting started")
    );
    wait_for("the rewrite to finish", || {
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
    fences.push(acquire(&mut p, "app:a", "t2", 60_000));
    assert_eq!(p.call(&["LOCK.RELEASE", "app:a", "t2"]), Reply::Int(1));
    fences.push(acquire(&mut p, "app:f", "t", 60_000));
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "app:f"]), Reply::Int(1));
    acquire(&mut p, "app:held", "t", 600_000);
    assert_same(&primary, &replica);
    let digest = p.call(&["DEBUG", "DIGEST"]);
    assert_eq!(p.call(&["DEBUG", "LOADAOF"]), Reply::status("OK"));
    assert_eq!(p.call(&["DEBUG", "DIGEST"]), digest);
    let mut r = replica.conn();
    assert_eq!(r.call(&["DEBUG", "LOADAOF"]), Reply::status("OK"));
    assert_eq!(r.call(&["DEBUG", "DIGEST"]), digest);
    // The replica promoted grants above every fence granted before, on each key.
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Reply::status("OK"));
    let top = *fences.iter().max().expect("fences");
    for key in ["app:a", "app:b", "app:m", "app:l", "app:f"] {
        let next = acquire(&mut r, key, "new", 60_000);
        assert!(next > top, "{key}: {next} > {top}");
    }
}

#[test]
fn session_ends_and_lock_delays_leave_the_replica_identical() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    // A session lock whose connection closes.
    {
        let mut session = primary.conn();
        assert!(acquire_with(&mut session, "app:s", "t", 60_000, &["SESSION"]).is_int());
    }
    wait_gone(&primary, "app:s");
    // A lease that runs out with a lock-delay: freed, kept for the delay, then deleted.
    assert!(acquire_with(&mut p, "app:d", "t", 100, &["LOCKDELAY", "300"]).is_int());
    wait_for("the delayed lock to be deleted", || {
        (exists(&mut p, "app:d") == 0).then_some(())
    });
    assert_same(&primary, &replica);
    assert_eq!(replica.info_int("lock_session_released"), 1);
    assert_eq!(replica.info_int("lock_expired"), 1);
    assert_eq!(replica.info_int("lock_reclaimed"), 2);
}

/// LOCK.FORCERELEASE "also ends a running lock-delay"; with `lock.tombstone-ttl 0` a free lock
/// is deleted at once. A forced release that ends only a delay leaves the lock free: it should
/// go as any freed lock does (one `forcerelease:fence:floor:x` effect), not stay until the
/// delay it ended would have run out (`follow_delay` raised the reclaim time to the delay's
/// end and nothing lowers it again).
#[test]
fn a_forced_release_that_ends_a_lock_delay_deletes_the_lock_at_once_with_tombstone_ttl_zero() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    assert!(acquire_with(&mut p, "app:f", "t", 100, &["LOCKDELAY", "600000"]).is_int());
    wait_for("the lease to run out into its delay", || {
        (state_of(&mut p, "app:f") == "free").then_some(())
    });
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "app:f"]), Reply::Int(0));
    assert_same(&primary, &replica);
    assert_eq!(replica.info_int("lock_forced"), 1);
    assert_eq!(
        exists(&mut p, "app:f"),
        0,
        "the free lock is kept for the delay it ended"
    );
}

#[test]
fn watchers_on_primary_and_replica_are_answered_when_a_freed_lock_is_deleted() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    for (key, ttl) in [("app:r", 60_000), ("app:e", 300)] {
        acquire(&mut p, key, "t", ttl);
        wait_replica_caught_up(&primary, &replica);
        let (pb, rb) = (blocked(&primary), blocked(&replica));
        let mut on_primary = primary.conn();
        on_primary.send(&["LOCK.WAIT", key, "20000"]);
        let mut on_replica = replica.conn();
        on_replica.send(&["LOCK.WAIT", key, "20000"]);
        wait_blocked(&primary, pb + 1);
        wait_blocked(&replica, rb + 1);
        if key == "app:r" {
            assert_eq!(p.call(&["LOCK.RELEASE", key, "t"]), Reply::Int(1));
        }
        assert_eq!(on_primary.read(), Reply::Int(1), "{key} on the primary");
        assert_eq!(on_replica.read(), Reply::Int(1), "{key} on the replica");
    }
    assert_same(&primary, &replica);
}

#[test]
fn keyspace_events_on_the_replica_are_the_primarys() {
    let (primary, replica) = pair();
    let mut on_primary = subscribe_keyspace(&primary, "app:k");
    let mut on_replica = subscribe_keyspace(&replica, "app:k");
    let mut p = primary.conn();
    acquire(&mut p, "app:k", "t", 60_000);
    assert_eq!(p.call(&["LOCK.RELEASE", "app:k", "t"]), Reply::Int(1));
    acquire(&mut p, "app:k", "t", 60_000);
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "app:k"]), Reply::Int(1));
    acquire(&mut p, "app:k", "t", 100);
    wait_gone(&primary, "app:k");
    let expected = [
        "lock.acquire",
        "lock.release",
        "del",
        "lock.acquire",
        "lock.forcerelease",
        "del",
        "lock.acquire",
        "lock.expired",
        "del",
    ];
    let seen_primary: Vec<String> = expected
        .iter()
        .map(|_| next_event(&mut on_primary))
        .collect();
    let seen_replica: Vec<String> = expected
        .iter()
        .map(|_| next_event(&mut on_replica))
        .collect();
    assert_eq!(seen_primary, expected);
    assert_eq!(seen_replica, expected);
    assert_same(&primary, &replica);
}

/// Key names around the lease index's inline limit (22 bytes), empty, binary and long, held
/// with short leases, renamed, moved, copied, swapped: each expires where it is, and the index
/// is empty after.
#[test]
fn key_names_of_every_shape_expire_after_rename_move_copy_and_swapdb() {
    let server = Server::start_with(config());
    let mut c = server.conn();
    let k22 = "k".repeat(22);
    let k23 = "k".repeat(23);
    let long = "L".repeat(300);
    let binary: &[u8] = b"b\0\xff:\r\n\x01binary-key-of-23-b";
    let names: Vec<Vec<u8>> = vec![
        Vec::new(),
        k22.as_bytes().to_vec(),
        k23.as_bytes().to_vec(),
        long.as_bytes().to_vec(),
        binary.to_vec(),
    ];
    let acquire_bytes = |c: &mut Conn, key: &[u8], ttl: &str| {
        let reply = c.call(&[&b"LOCK.ACQUIRE"[..], key, b"t", ttl.as_bytes()]);
        assert!(reply.is_int(), "{reply:?}");
    };
    for name in &names {
        acquire_bytes(&mut c, name, "2000");
    }
    // 22 -> 23 bytes and 23 -> 22 bytes (through a third name), long -> short, short -> long.
    assert_eq!(c.call(&["RENAME", &k22, "tmp"]), Reply::status("OK"));
    assert_eq!(c.call(&["RENAME", &k23, &k22]), Reply::status("OK"));
    assert_eq!(c.call(&["RENAME", "tmp", &k23]), Reply::status("OK"));
    assert_eq!(c.call(&["RENAME", &long, "s"]), Reply::status("OK"));
    assert_eq!(
        c.call(&[&b"RENAME"[..], binary, long.as_bytes()]),
        Reply::status("OK")
    );
    // The empty name moves to db 1; a copy of `s` in db 2; db 2 and 3 swapped.
    assert_eq!(c.call(&["MOVE", "", "1"]), Reply::Int(1));
    assert_eq!(c.call(&["COPY", "s", "s", "DB", "2"]), Reply::Int(1));
    assert_eq!(c.call(&["SWAPDB", "2", "3"]), Reply::status("OK"));
    // A DUMP of the 22-byte one restored under a 23-byte name with REPLACE over a lock.
    let dump = c.call(&["DUMP", &k22]);
    let Reply::Bulk(payload) = dump else {
        panic!("{dump:?}")
    };
    let restored = format!("{k22}r");
    acquire(&mut c, &restored, "u", 2000);
    let reply = c.call(&[
        &b"RESTORE"[..],
        restored.as_bytes(),
        b"0",
        &payload,
        b"REPLACE",
    ]);
    assert_eq!(reply, Reply::status("OK"));
    let expired_before = server.info_int("lock_expired");
    // Every one expires where it now is, and is deleted (tombstone-ttl 0).
    let places: Vec<(u32, Vec<u8>)> = vec![
        (0, k22.as_bytes().to_vec()),
        (0, k23.as_bytes().to_vec()),
        (0, b"s".to_vec()),
        (0, long.as_bytes().to_vec()),
        (1, Vec::new()),
        (3, b"s".to_vec()),
        (0, restored.as_bytes().to_vec()),
    ];
    for (db, key) in &places {
        assert_eq!(c.call(&["SELECT", &db.to_string()]), Reply::status("OK"));
        wait_for(&format!("{key:?} in db {db} to expire"), || {
            (c.call(&[&b"EXISTS"[..], key]).int() == 0).then_some(())
        });
    }
    assert_eq!(c.call(&["SELECT", "0"]), Reply::status("OK"));
    assert!(
        server.info_int("lock_expired") - expired_before >= 7,
        "{}",
        server.info_int("lock_expired") - expired_before
    );
    assert_eq!(server.info_int("lock_keys"), 0);
    assert_eq!(server.info_int("lock_index_entries"), 0);
}

/// FLUSHDB ASYNC of one database: the lease index forgets that database's entries with
/// `retain` (the values go on the lazy-free thread), and `retain` never joins chunks. Locks of
/// db 0 interleaved in time with 63 times as many in db 1 are left one per chunk, each chunk a
/// 64-entry allocation (3,072 bytes for one 48-byte entry). Measured against the same locks
/// taken before the others (their entries in chunks of their own): the layout of the index
/// should cost a held lock little either way (a held lock is documented at 284 bytes).
#[test]
fn flushdb_async_of_another_database_leaves_no_chunk_per_held_lock() {
    let interleaved = per_lock_after_flushdb_async_of_another_db(true);
    let apart = per_lock_after_flushdb_async_of_another_db(false);
    assert!(
        interleaved - apart < 284,
        "a held lock costs {interleaved} bytes of used_memory after FLUSHDB ASYNC of another \
         db when its entry was among the other db's in time, {apart} when apart"
    );
}

/// `used_memory` per kept lock in db 0 after 63 locks per kept one were taken in db 1 (in
/// turn with the kept ones, or all after them) and db 1 was flushed with ASYNC.
fn per_lock_after_flushdb_async_of_another_db(interleaved: bool) -> i64 {
    let server = Server::start_with(Config::default());
    let mut c = server.conn();
    let used = |c: &mut Conn| -> i64 {
        let info = c.call(&["INFO", "memory"]).text();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .expect("used_memory")
            .trim()
            .parse()
            .expect("integer")
    };
    // Warm up what any first lock allocates, then measure from there.
    acquire(&mut c, "warm", "t", 3_600_000);
    let before = used(&mut c);
    let kept = 300;
    let mut db1 = server.conn();
    assert_eq!(db1.call(&["SELECT", "1"]), Reply::status("OK"));
    if !interleaved {
        for i in 0..kept {
            acquire(&mut c, &format!("kept:{i}"), "t", 3_600_000);
        }
    }
    for i in 0..kept {
        for j in 0..63 {
            db1.send(&["LOCK.ACQUIRE", &format!("other:{i}:{j}"), "t", "3600000"]);
        }
        for _ in 0..63 {
            assert!(db1.read().is_int());
        }
        if interleaved {
            acquire(&mut c, &format!("kept:{i}"), "t", 3_600_000);
        }
    }
    assert_eq!(db1.call(&["FLUSHDB", "ASYNC"]), Reply::status("OK"));
    wait_for("the lazy free to finish", || {
        (server
            .info_field("memory", "lazyfree_pending_objects")
            .as_deref()
            == Some("0")
            && server.info_int("lock_keys") == kept + 1)
            .then_some(())
    });
    assert_eq!(server.info_int("lock_index_entries"), kept + 1);
    (used(&mut c) - before) / kept
}
