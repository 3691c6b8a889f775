//! A lock value removed by anything other than the module (DEL, UNLINK, a value written over it,
//! RESTORE REPLACE, RENAME or COPY onto it, FLUSHDB/FLUSHALL, eviction, a native TTL, lazy
//! freeing) leaves nothing of itself in the module: its lease index entry (its lease's, or the
//! reclaim a release queued) goes with the value, so "acquire, work, DEL" keeps memory flat
//! whatever lease it asked for, and nothing waits for `lock.tombstone-ttl`.

mod common;

use common::*;

/// A lease far longer than any test: an entry left behind would stay for the whole run.
const DAY_MS: &str = "86400000";

fn entries(server: &Server) -> i64 {
    server.info_int("lock_index_entries")
}

/// Sends `rounds` pipelined rounds of `commands(i)` and checks that no reply is an error.
fn pipeline(c: &mut Conn, rounds: usize, commands: impl Fn(usize) -> Vec<Vec<Vec<u8>>>) {
    const BATCH: usize = 500;
    let mut start = 0;
    while start < rounds {
        let end = (start + BATCH).min(rounds);
        let mut sent = 0;
        for i in start..end {
            for command in commands(i) {
                c.send(&command);
                sent += 1;
            }
        }
        for _ in 0..sent {
            let reply = c.read();
            assert!(!reply.is_error(), "{reply:?}");
        }
        start = end;
    }
}

fn args(list: &[&str]) -> Vec<Vec<u8>> {
    list.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn used_memory(server: &Server) -> i64 {
    server.info_int("used_memory")
}

#[test]
fn acquire_then_del_keeps_memory_flat_whatever_the_lease() {
    let server = Server::start();
    let mut c = server.conn();
    let round = |_: usize| {
        vec![
            args(&["LOCK.ACQUIRE", "job:lock", "tok", DAY_MS]),
            args(&["DEL", "job:lock"]),
        ]
    };
    // Warm up whatever the server allocates once (its reply buffers, the dict, the index's root).
    pipeline(&mut c, 2_000, round);
    let before = used_memory(&server);
    pipeline(&mut c, 50_000, round);
    let after = used_memory(&server);
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(0));
    assert_eq!(server.info_int("lock_keys"), 0);
    // An entry left per round was 76 bytes or more (3.8 MB here).
    assert!(
        after - before < 256 * 1024,
        "used_memory grew by {} bytes over 50,000 rounds of ACQUIRE + DEL",
        after - before
    );
    assert_eq!(entries(&server), 0);
}

/// Takes `rounds` locks named `prefix:i` with a day-long lease, removes each with `remove(i)`,
/// and checks that neither lock keys nor index entries remain.
fn each_removal_leaves_no_entry(
    server: &Server,
    c: &mut Conn,
    what: &str,
    remove: impl Fn(usize) -> Vec<Vec<Vec<u8>>>,
) {
    const ROUNDS: usize = 300;
    pipeline(c, ROUNDS, |i| {
        let key = format!("{what}:{i}");
        let mut commands = vec![args(&["LOCK.ACQUIRE", &key, "tok", DAY_MS])];
        commands.extend(remove(i));
        commands
    });
    wait_for(&format!("no lock key left after {what}"), || {
        (server.info_int("lock_keys") == 0).then_some(())
    });
    assert_eq!(entries(server), 0, "index entries left after {what}");
}

#[test]
fn every_way_of_removing_a_lock_value_takes_its_index_entry_along() {
    let server = Server::start();
    let mut c = server.conn();
    let key = |what: &str, i: usize| format!("{what}:{i}");
    each_removal_leaves_no_entry(&server, &mut c, "del", |i| {
        vec![args(&["DEL", &key("del", i)])]
    });
    each_removal_leaves_no_entry(&server, &mut c, "unlink", |i| {
        vec![args(&["UNLINK", &key("unlink", i)])]
    });
    each_removal_leaves_no_entry(&server, &mut c, "set", |i| {
        vec![
            args(&["SET", &key("set", i), "a string now"]),
            args(&["DEL", &key("set", i)]),
        ]
    });
    // A native TTL on the lock key: Redis expires the key itself.
    each_removal_leaves_no_entry(&server, &mut c, "pexpire", |i| {
        vec![args(&["PEXPIRE", &key("pexpire", i), "1"])]
    });
    // RESTORE REPLACE of another value over the lock.
    assert_eq!(c.call(&["SET", "s", "v"]), Reply::status("OK"));
    let Reply::Bulk(dump) = c.call(&["DUMP", "s"]) else {
        panic!("DUMP of a string");
    };
    assert_eq!(c.call(&["DEL", "s"]), Reply::Int(1));
    for i in 0..300 {
        let name = key("restore", i);
        acquire(&mut c, &name, "tok", 86_400_000);
        let restore = [
            b"RESTORE".to_vec(),
            name.clone().into_bytes(),
            b"0".to_vec(),
            dump.clone(),
            b"REPLACE".to_vec(),
        ];
        assert_eq!(c.call(&restore), Reply::status("OK"));
        assert_eq!(c.call(&["DEL", &name]), Reply::Int(1));
    }
    assert_eq!(
        entries(&server),
        0,
        "index entries left after RESTORE REPLACE"
    );
    each_removal_leaves_no_entry(&server, &mut c, "renamed-onto", |i| {
        let name = key("renamed-onto", i);
        vec![
            args(&["SET", "src", "v"]),
            args(&["RENAME", "src", &name]),
            args(&["DEL", &name]),
        ]
    });
    each_removal_leaves_no_entry(&server, &mut c, "copied-onto", |i| {
        let name = key("copied-onto", i);
        vec![
            args(&["SET", "src", "v"]),
            args(&["COPY", "src", &name, "REPLACE"]),
            args(&["DEL", "src", &name]),
        ]
    });
    // The lock itself renamed or moved, then deleted under its new name or database.
    each_removal_leaves_no_entry(&server, &mut c, "renamed", |i| {
        let name = key("renamed", i);
        vec![
            args(&["RENAME", &name, "elsewhere"]),
            args(&["DEL", "elsewhere"]),
        ]
    });
    each_removal_leaves_no_entry(&server, &mut c, "moved", |i| {
        let name = key("moved", i);
        vec![
            args(&["MOVE", &name, "1"]),
            args(&["SELECT", "1"]),
            args(&["DEL", &name]),
            args(&["SELECT", "0"]),
        ]
    });
    // A released lock (its reclaim is queued) deleted before its tombstone time.
    each_removal_leaves_no_entry(&server, &mut c, "released", |i| {
        let name = key("released", i);
        vec![args(&["LOCK.RELEASE", &name, "tok"]), args(&["DEL", &name])]
    });
    // A lock renewed to a later deadline (its entry stays at the earlier one), then deleted.
    each_removal_leaves_no_entry(&server, &mut c, "renewed", |i| {
        let name = key("renewed", i);
        vec![
            args(&["LOCK.RENEW", &name, "tok", DAY_MS]),
            args(&["RENAME", &name, "elsewhere"]),
            args(&["DEL", "elsewhere"]),
        ]
    });
}

#[test]
fn lazily_freed_and_flushed_locks_take_their_entries_along() {
    let server = Server::start_with(
        Config::default()
            .with("lazyfree-lazy-user-del", "yes")
            .with("lazyfree-lazy-user-flush", "yes"),
    );
    let mut c = server.conn();
    each_removal_leaves_no_entry(&server, &mut c, "lazy-del", |i| {
        vec![args(&["DEL", &format!("lazy-del:{i}")])]
    });
    for flush in [
        &["FLUSHDB"][..],
        &["FLUSHALL"],
        &["FLUSHALL", "ASYNC"],
        &["FLUSHDB", "SYNC"],
    ] {
        pipeline(&mut c, 1_000, |i| {
            vec![args(&["LOCK.ACQUIRE", &format!("f:{i}"), "tok", DAY_MS])]
        });
        assert_eq!(entries(&server), 1_000);
        assert_eq!(c.call(flush), Reply::status("OK"));
        wait_for(&format!("no lock key left after {flush:?}"), || {
            (server.info_int("lock_keys") == 0).then_some(())
        });
        assert_eq!(entries(&server), 0, "index entries left after {flush:?}");
    }
}

#[test]
fn evicted_locks_take_their_entries_along() {
    let server = Server::start_with(Config::default().with("maxmemory-policy", "allkeys-random"));
    let mut c = server.conn();
    // Every other lock taken again while its reclaim is queued.
    pipeline(&mut c, 20_000, |i| {
        let key = format!("e:{i}");
        if i % 2 == 0 {
            vec![args(&["LOCK.ACQUIRE", &key, "tok", DAY_MS])]
        } else {
            taken_again(&key, if i % 4 == 1 { DAY_MS } else { SHORT_MS })
        }
    });
    assert_eq!(entries(&server), 20_000);
    // Half the memory the locks take: Redis evicts until it fits.
    let used = used_memory(&server);
    let limit = (used - 1_000_000).max(1_000_000).to_string();
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory", &limit]),
        Reply::status("OK")
    );
    // Eviction runs before each command: a few writes make room.
    wait_for("locks to be evicted", || {
        c.call(&["SET", "nudge", "v"]);
        (server.info_int("evicted_keys") > 0).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory", "0"]),
        Reply::status("OK")
    );
    let keys = server.info_int("lock_keys");
    assert!(keys < 20_000, "{keys} lock keys after eviction");
    assert_eq!(entries(&server), keys);
}

/// Shorter than `lock.tombstone-ttl` (10 s by default): a lease that comes due before the
/// reclaim queued by the release before it.
const SHORT_MS: &str = "5000";

/// Acquire, release (a reclaim of the free lock is queued for `lock.tombstone-ttl` later),
/// acquire again with a lease of `lease_ms`.
fn taken_again(key: &str, lease_ms: &str) -> Vec<Vec<Vec<u8>>> {
    vec![
        args(&["LOCK.ACQUIRE", key, "tok", DAY_MS]),
        args(&["LOCK.RELEASE", key, "tok"]),
        args(&["LOCK.ACQUIRE", key, "tok", lease_ms]),
    ]
}

/// A DUMP of a string value, to RESTORE over a lock.
fn dump_of_a_string(c: &mut Conn) -> Vec<u8> {
    assert_eq!(c.call(&["SET", "s", "v"]), Reply::status("OK"));
    let Reply::Bulk(dump) = c.call(&["DUMP", "s"]) else {
        panic!("DUMP of a string");
    };
    assert_eq!(c.call(&["DEL", "s"]), Reply::Int(1));
    dump
}

/// A lock taken again while its reclaim is queued has one entry in the lease index, whether
/// its new lease comes due before or after that reclaim, and whatever removes the key takes
/// that entry along: nothing is left to wait for `lock.tombstone-ttl`.
#[test]
fn a_lock_taken_again_while_its_reclaim_is_queued_takes_its_entry_along() {
    const ROUNDS: usize = 2_000;
    let server = Server::start();
    let mut c = server.conn();
    let dump = dump_of_a_string(&mut c);
    type Removal<'a> = Box<dyn Fn(&str) -> Vec<Vec<Vec<u8>>> + 'a>;
    let removals: Vec<(&str, Removal)> = vec![
        ("del", Box::new(|key| vec![args(&["DEL", key])])),
        ("unlink", Box::new(|key| vec![args(&["UNLINK", key])])),
        (
            "set",
            Box::new(|key| vec![args(&["SET", key, "a string now"]), args(&["DEL", key])]),
        ),
        (
            "restore-replace",
            Box::new(|key| {
                let mut restore = args(&["RESTORE", key, "0"]);
                restore.push(dump.clone());
                restore.push(b"REPLACE".to_vec());
                vec![restore, args(&["DEL", key])]
            }),
        ),
        (
            "renamed-onto",
            Box::new(|key| {
                vec![
                    args(&["SET", "src", "v"]),
                    args(&["RENAME", "src", key]),
                    args(&["DEL", key]),
                ]
            }),
        ),
        (
            "pexpire",
            Box::new(|key| vec![args(&["PEXPIRE", key, "1"])]),
        ),
    ];
    for lease in [DAY_MS, SHORT_MS] {
        // Kept: one entry per lock, not one for the lease and one for the queued reclaim.
        pipeline(&mut c, ROUNDS, |i| {
            taken_again(&format!("kept:{lease}:{i}"), lease)
        });
        assert_eq!(server.info_int("lock_keys"), ROUNDS as i64);
        assert_eq!(entries(&server), ROUNDS as i64, "lease {lease}");
        assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
        assert_eq!(entries(&server), 0);
        for (what, remove) in &removals {
            pipeline(&mut c, ROUNDS, |i| {
                let key = format!("{what}:{lease}:{i}");
                let mut commands = taken_again(&key, lease);
                commands.extend(remove(&key));
                commands
            });
            wait_for(&format!("no lock key left after {what}"), || {
                (server.info_int("lock_keys") == 0).then_some(())
            });
            assert_eq!(entries(&server), 0, "after {what}, lease {lease}");
        }
    }
}

#[test]
fn flushed_locks_taken_again_take_their_entries_along() {
    const ROUNDS: usize = 2_000;
    let server = Server::start_with(Config::default().with("lazyfree-lazy-user-flush", "yes"));
    let mut c = server.conn();
    for flush in [
        &["FLUSHALL", "ASYNC"][..],
        &["FLUSHDB", "ASYNC"],
        &["FLUSHALL"],
    ] {
        pipeline(&mut c, ROUNDS, |i| {
            let lease = if i % 2 == 0 { DAY_MS } else { SHORT_MS };
            taken_again(&format!("f:{i}"), lease)
        });
        assert_eq!(entries(&server), ROUNDS as i64);
        assert_eq!(c.call(flush), Reply::status("OK"));
        wait_for(&format!("no lock key left after {flush:?}"), || {
            (server.info_int("lock_keys") == 0).then_some(())
        });
        assert_eq!(entries(&server), 0, "index entries left after {flush:?}");
    }
}

/// The latest time the lease index can name (its marks keep 62 bits).
const LATEST_INDEX_TIME: u64 = (1 << 62) - 1;

/// A RESTOREd lease due later than the lease index can name is indexed at the latest time it
/// can, the same time in the index and in the value: DEL takes the entry out.
#[test]
fn a_restored_far_future_deadline_leaves_with_its_lock() {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let deadlines = [
        LATEST_INDEX_TIME - 1,
        LATEST_INDEX_TIME,
        LATEST_INDEX_TIME + 1,
        1 << 62,
        (1 << 63) - 1,
        1 << 63,
        u64::MAX - 1,
        u64::MAX,
    ];
    for (i, deadline) in deadlines.iter().enumerate() {
        let payload = format.payload(&held_fields(1, b"tok", *deadline, 1, 0));
        assert_eq!(
            restore(&mut c, &format!("far:{i}"), &payload),
            Reply::status("OK")
        );
        assert_eq!(state_of(&mut c, &format!("far:{i}")), "held");
    }
    assert_eq!(entries(&server), deadlines.len() as i64);
    for i in 0..deadlines.len() {
        assert_eq!(c.call(&["DEL", &format!("far:{i}")]), Reply::Int(1));
        assert_eq!(entries(&server), (deadlines.len() - i - 1) as i64, "{i}");
    }
}
