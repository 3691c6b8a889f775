//! LOCK.MACQUIRE numkeys key [key ...] token ttl-ms [WAIT ms] [SESSION] [LOCKDELAY ms]: every
//! key or none, one fence per key in key order; with WAIT, queued on every key and granted only
//! at the head of all of them at once, holding nothing meanwhile. LOCK.MRELEASE releases them
//! together. Each key stays an ordinary lock; one call's effects reach replicas and the AOF
//! together.

mod common;

use common::cluster::Cluster;
use common::*;

fn macquire(c: &mut Conn, keys: &[&str], token: &str, ttl: &str, extra: &[&str]) -> Reply {
    let numkeys = keys.len().to_string();
    let mut call = vec!["LOCK.MACQUIRE", &numkeys];
    call.extend_from_slice(keys);
    call.extend([token, ttl]);
    call.extend_from_slice(extra);
    c.call(&call)
}

fn mrelease(c: &mut Conn, keys: &[&str], token: &str) -> Reply {
    let numkeys = keys.len().to_string();
    let mut call = vec!["LOCK.MRELEASE", &numkeys];
    call.extend_from_slice(keys);
    call.push(token);
    c.call(&call)
}

fn fences(reply: &Reply) -> Vec<i64> {
    reply.items().iter().map(Reply::int).collect()
}

#[test]
fn every_key_or_none_with_a_fence_per_key_in_key_order() {
    let server = Server::start();
    let mut c = server.conn();
    let got = fences(&macquire(&mut c, &["b", "a", "c"], "t1", "10000", &[]));
    assert_eq!(got.len(), 3);
    for (key, fence) in ["b", "a", "c"].iter().zip(&got) {
        assert_eq!(fence_of(&mut c, key), *fence, "{key}");
        assert_eq!(state_of(&mut c, key), "held");
    }
    // One key busy: nothing changes, not even the free keys.
    let digest = c.call(&["DEBUG", "DIGEST"]);
    assert_eq!(
        macquire(&mut c, &["d", "a"], "t2", "10000", &[]),
        Reply::Nil
    );
    assert_eq!(c.call(&["EXISTS", "d"]), Reply::Int(0));
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), digest);
    // The same token again: every lease refreshed, the same fences.
    assert_eq!(
        fences(&macquire(&mut c, &["a", "b", "c"], "t1", "20000", &[])),
        vec![got[1], got[0], got[2]]
    );
    assert!(lock_field(&mut c, "a", "ttl").int() > 10_000);
    assert_eq!(server.info_int("lock_acquired"), 6);
    assert_eq!(server.info_int("lock_acquire_contended"), 1);
    // Released together; the reply counts the keys the token held.
    assert_eq!(
        mrelease(&mut c, &["a", "b", "c", "never"], "t1"),
        Reply::Int(3)
    );
    for key in ["a", "b", "c"] {
        assert_eq!(state_of(&mut c, key), "free", "{key}");
    }
    let next = fences(&macquire(&mut c, &["a", "d"], "t2", "10000", &[]));
    assert!(next[0] > got[1]);
    // Key by key works too: each key is an ordinary lock.
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "t2"]), Reply::Int(1));
    assert_eq!(mrelease(&mut c, &["a", "d"], "t2"), Reply::Int(1));
}

#[test]
fn queued_waiters_and_lock_delays_are_not_overtaken() {
    let server = Server::start();
    let mut c = server.conn();
    let mut waiter = server.conn();
    acquire(&mut c, "a", "holder", 10_000);
    waiter.send(&["LOCK.ACQUIRE", "a", "w", "10000", "WAIT", "10000"]);
    wait_for("the waiter to queue", || {
        (lock_field(&mut c, "a", "waiters") == Reply::Int(1)).then_some(())
    });
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "holder"]), Reply::Int(1));
    assert!(waiter.read().int() > 0);
    // "b" is free, but a lock-delay runs on "c".
    assert!(c
        .call(&["LOCK.ACQUIRE", "c", "x", "20", "LOCKDELAY", "60000"])
        .is_int());
    wait_for("the lease of c to end", || {
        (state_of(&mut c, "c") == "free").then_some(())
    });
    assert_eq!(macquire(&mut c, &["b", "c"], "t", "10000", &[]), Reply::Nil);
    assert_eq!(c.call(&["EXISTS", "b"]), Reply::Int(0));
}

#[test]
fn session_and_lock_delay_apply_to_every_key() {
    let server = Server::start();
    let mut c = server.conn();
    let mut owner = server.conn();
    macquire(
        &mut owner,
        &["a", "b"],
        "t",
        "60000",
        &["SESSION", "LOCKDELAY", "250"],
    )
    .items();
    for key in ["a", "b"] {
        assert_eq!(lock_field(&mut c, key, "session"), Reply::Int(1));
        assert_eq!(lock_field(&mut c, key, "lock_delay"), Reply::Int(250));
    }
    drop(owner);
    wait_for("the session to end", || {
        (state_of(&mut c, "a") == "free" && state_of(&mut c, "b") == "free").then_some(())
    });
    assert_eq!(server.info_int("lock_session_released"), 2);
    assert_eq!(macquire(&mut c, &["a"], "u", "1000", &[]), Reply::Nil);
}

#[test]
fn bad_calls_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(c.call(&["SET", "str", "x"]), Reply::status("OK"));
    let digest = c.call(&["DEBUG", "DIGEST"]);
    let numkeys = |detail: &str| Reply::Error(format!("ERR invalid numkeys: {detail}"));
    let cases: Vec<(Vec<&str>, Reply)> = vec![
        (
            vec!["LOCK.MACQUIRE", "2", "a", "a", "t", "100"],
            Reply::error("ERR duplicate key: each key may be named once"),
        ),
        (
            vec!["LOCK.MACQUIRE", "0", "a", "t", "100"],
            numkeys("must be positive"),
        ),
        (
            vec!["LOCK.MACQUIRE", "-1", "a", "t", "100"],
            numkeys("must be positive"),
        ),
        (
            vec!["LOCK.MACQUIRE", "x", "a", "t", "100"],
            numkeys("not an integer"),
        ),
        (
            vec!["LOCK.MACQUIRE", "3", "a", "t", "100"],
            Reply::error(
                "ERR invalid numkeys: 3 key(s) then the token and ttl-ms need 5 arguments after \
                 numkeys, 3 given (the token and ttl-ms left out, or numkeys too large?)",
            ),
        ),
        (
            vec!["LOCK.MACQUIRE", "1025", "a", "t", "100"],
            numkeys("more than 1024 keys"),
        ),
        (
            vec!["LOCK.MACQUIRE", "2", "a", "str", "t", "100"],
            Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "a", "t", "0"],
            Reply::error("ERR invalid ttl-ms: must be positive"),
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "a", "", "100"],
            Reply::error("ERR invalid token: must not be empty"),
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "a", "t", "100", "WAIT", "-5"],
            Reply::error("ERR invalid timeout-ms: must not be negative"),
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "a", "t", "100", "REENTRANT"],
            Reply::error("ERR option REENTRANT is not supported by LOCK.MACQUIRE"),
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "a", "t", "100", "SYNC", "1", "5"],
            Reply::error("ERR option SYNC is not supported by LOCK.MACQUIRE"),
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "a", "t"],
            Reply::error("ERR wrong number of arguments for 'lock.macquire' command"),
        ),
        (
            vec!["LOCK.MRELEASE", "2", "a", "a", "t"],
            Reply::error("ERR duplicate key: each key may be named once"),
        ),
        (
            vec!["LOCK.MRELEASE", "2", "a", "t"],
            Reply::error(
                "ERR invalid numkeys: 2 key(s) then the token need 3 arguments after numkeys, 2 \
                 given (the token left out, or numkeys too large?)",
            ),
        ),
        (
            vec!["LOCK.MRELEASE", "2", "a", "str", "t"],
            Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ),
        (
            vec!["LOCK.MRELEASE", "1", "a", "t", "extra"],
            Reply::error("ERR wrong number of arguments for 'lock.mrelease' command"),
        ),
    ];
    for (call, expected) in cases {
        assert_eq!(c.call(&call), expected, "{call:?}");
    }
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), digest);
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(1));
}

#[test]
fn one_calls_effects_reach_replicas_and_the_aof_together() {
    let mut primary = Server::start_with(Config::default().with("appendonly", "yes"));
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    let got = fences(&macquire(&mut c, &["a", "b", "c"], "t", "600000", &[]));
    assert_eq!(mrelease(&mut c, &["b"], "t"), Reply::Int(1));
    primary.sync_replicas(1);
    let mut r = replica.conn();
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
    assert_eq!(fence_of(&mut r, "c"), got[2]);
    assert_eq!(state_of(&mut r, "b"), "free");
    // The AOF has the grant as one transaction: MULTI, an effect per key, EXEC.
    let aof = std::fs::read_dir(primary.dir().join("appendonlydir"))
        .expect("appendonlydir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incr.aof"))
        .map(|e| std::fs::read(e.path()).expect("read AOF"))
        .next()
        .expect("an incr AOF");
    let text = String::from_utf8_lossy(&aof);
    let multi = text.find("MULTI").expect("MULTI in the AOF");
    let exec = text[multi..].find("EXEC").expect("EXEC after it") + multi;
    assert_eq!(text[multi..exec].matches("LOCK.APPLY").count(), 3, "{text}");
    drop(c);
    drop(r);
    primary.restart();
    let mut c = primary.conn();
    assert_eq!(fence_of(&mut c, "a"), got[0]);
    assert_eq!(state_of(&mut c, "c"), "held");
}

#[test]
fn command_docs_and_getkeys_name_every_key() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&[
            "COMMAND",
            "GETKEYS",
            "LOCK.MACQUIRE",
            "2",
            "a",
            "b",
            "t",
            "100"
        ]),
        Reply::Array(vec![Reply::bulk("a"), Reply::bulk("b")])
    );
    assert_eq!(
        c.call(&["COMMAND", "GETKEYS", "LOCK.MRELEASE", "1", "a", "t"]),
        Reply::Array(vec![Reply::bulk("a")])
    );
    for name in ["lock.macquire", "lock.mrelease"] {
        let docs = c.call(&["COMMAND", "DOCS", name]);
        assert!(docs.contains_bytes(b"numkeys"), "{name}: {docs:?}");
    }
}

#[test]
fn in_a_cluster_every_key_shares_one_slot() {
    let cluster = Cluster::start(3, false);
    let mut c = cluster.conn_for("{order:1}:a");
    let got = macquire(&mut c, &["{order:1}:a", "{order:1}:b"], "t", "10000", &[]);
    assert_eq!(got.items().len(), 2);
    assert_eq!(
        macquire(&mut c, &["{order:1}:c", "{order:2}:d"], "t", "10000", &[]),
        Reply::error("CROSSSLOT Keys in request don't hash to the same slot")
    );
    assert_eq!(
        mrelease(&mut c, &["{order:1}:a", "{order:1}:b"], "t"),
        Reply::Int(2)
    );
}

#[test]
fn the_token_is_redacted_from_slowlog_and_monitor() {
    let server = Server::start();
    let mut c = server.conn();
    let mut monitor = server.conn();
    monitor.send(&["MONITOR"]);
    assert_eq!(monitor.read(), Reply::status("OK"));
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::status("OK")
    );
    let secret = "tok-m5ecr3t-41";
    macquire(&mut c, &["a", "b"], secret, "10000", &[]).items();
    assert_eq!(mrelease(&mut c, &["a", "b"], secret), Reply::Int(2));
    let slowlog = c.call(&["SLOWLOG", "GET", "10"]);
    assert!(slowlog.contains_bytes(b"lock.macquire") || slowlog.contains_bytes(b"LOCK.MACQUIRE"));
    assert!(!slowlog.contains_bytes(secret.as_bytes()), "{slowlog:?}");
    for _ in 0..2 {
        let line = monitor.read().text();
        assert!(line.to_lowercase().contains("lock.m"), "{line}");
        assert!(!line.contains(secret), "{line}");
    }
}

fn send_macquire(c: &mut Conn, keys: &[&str], token: &str, wait: &str) {
    let numkeys = keys.len().to_string();
    let mut call = vec!["LOCK.MACQUIRE", &numkeys];
    call.extend_from_slice(keys);
    call.extend([token, "60000", "WAIT", wait]);
    c.send(&call);
}

/// Clients queued on `key` (LOCK.INFO; 0 for a missing key).
fn waiters_on(c: &mut Conn, key: &str) -> i64 {
    lock_info(c, key).map_or(0, |fields| {
        fields
            .into_iter()
            .find(|(name, _)| name == "waiters")
            .map_or(0, |(_, value)| value.int())
    })
}

#[test]
fn a_waiting_multi_lock_holds_nothing_until_it_gets_every_key() {
    let server = Server::start();
    let mut c = server.conn();
    let mut m = server.conn();
    acquire(&mut c, "a", "h1", 60_000);
    acquire(&mut c, "b", "h2", 60_000);
    send_macquire(&mut m, &["a", "b"], "tm", "10000");
    wait_blocked(&server, 1);
    assert_eq!(waiters_on(&mut c, "a"), 1);
    assert_eq!(waiters_on(&mut c, "b"), 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "h1"]), Reply::Int(1));
    // "a" is free but not taken: no hold-and-wait. Nobody overtakes the queued multi-lock.
    assert_eq!(state_of(&mut c, "a"), "free");
    assert_eq!(waiters_on(&mut c, "a"), 1);
    assert_eq!(c.call(&["LOCK.ACQUIRE", "a", "x", "1000"]), Reply::Nil);
    assert_eq!(c.call(&["LOCK.RELEASE", "b", "h2"]), Reply::Int(1));
    let got = fences(&m.read());
    assert_eq!(got, vec![fence_of(&mut c, "a"), fence_of(&mut c, "b")]);
    assert_eq!(waiters_on(&mut c, "a"), 0);
    assert_eq!(mrelease(&mut c, &["a", "b"], "tm"), Reply::Int(2));
}

#[test]
fn a_waiting_multi_lock_of_one_key_is_granted_and_the_queue_moves_on() {
    let server = Server::start();
    let mut c = server.conn();
    let mut m = server.conn();
    let mut x = server.conn();
    acquire(&mut c, "one", "h", 60_000);
    send_macquire(&mut m, &["one"], "tm", "10000");
    wait_blocked(&server, 1);
    x.send(&["LOCK.ACQUIRE", "one", "tx", "60000", "WAIT", "10000"]);
    wait_blocked(&server, 2);
    assert_eq!(c.call(&["LOCK.RELEASE", "one", "h"]), Reply::Int(1));
    assert_eq!(fences(&m.read()), vec![fence_of(&mut c, "one")]);
    assert_eq!(mrelease(&mut c, &["one"], "tm"), Reply::Int(1));
    assert_eq!(granted(&mut x), fence_of(&mut c, "one"));
}

#[test]
fn two_multi_locks_in_opposite_orders_do_not_deadlock() {
    let server = Server::start();
    let mut c = server.conn();
    let mut m1 = server.conn();
    let mut m2 = server.conn();
    acquire(&mut c, "a", "h", 60_000);
    send_macquire(&mut m1, &["a", "b"], "t1", "10000");
    wait_blocked(&server, 1);
    send_macquire(&mut m2, &["b", "a"], "t2", "10000");
    wait_blocked(&server, 2);
    assert_eq!(waiters_on(&mut c, "a"), 2);
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "h"]), Reply::Int(1));
    // First come, first served on every key: m1, then m2 once m1 lets go.
    let first = fences(&m1.read());
    assert_eq!(first.len(), 2);
    assert_eq!(waiters_on(&mut c, "a"), 1);
    assert_eq!(mrelease(&mut c, &["a", "b"], "t1"), Reply::Int(2));
    let second = fences(&m2.read());
    assert!(
        second[0] > first[1] && second[1] > first[0],
        "{first:?} {second:?}"
    );
    assert_eq!(state_of(&mut c, "a"), "held");
    assert_eq!(state_of(&mut c, "b"), "held");
}

#[test]
fn waiters_queued_earlier_on_any_key_go_first() {
    let server = Server::start();
    let mut c = server.conn();
    let mut s1 = server.conn();
    let mut m = server.conn();
    acquire(&mut c, "a", "h", 60_000);
    s1.send(&["LOCK.ACQUIRE", "a", "s1", "60000", "WAIT", "10000"]);
    wait_for("s1 to queue", || {
        (waiters_on(&mut c, "a") == 1).then_some(())
    });
    send_macquire(&mut m, &["b", "a"], "tm", "10000");
    wait_blocked(&server, 2);
    assert_eq!(waiters_on(&mut c, "a"), 2);
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "h"]), Reply::Int(1));
    assert!(s1.read().int() > 0);
    assert_eq!(c.call(&["EXISTS", "b"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RELEASE", "a", "s1"]), Reply::Int(1));
    assert_eq!(fences(&m.read()).len(), 2);
}

#[test]
fn a_multi_lock_that_leaves_lets_the_waiters_behind_it_through() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "a", "h", 60_000);
    for leave in ["timeout", "disconnect"] {
        let mut m = server.conn();
        let mut s = server.conn();
        send_macquire(
            &mut m,
            &["a", "b"],
            "tm",
            if leave == "timeout" { "300" } else { "0" },
        );
        wait_blocked(&server, 1);
        // "b" is free, but s queued behind the multi-lock waits for it.
        s.send(&["LOCK.ACQUIRE", "b", "s", "60000", "WAIT", "10000"]);
        wait_blocked(&server, 2);
        assert_eq!(waiters_on(&mut c, "b"), 2);
        if leave == "timeout" {
            assert_eq!(m.read(), Reply::Nil);
        } else {
            drop(m);
        }
        assert!(s.read().int() > 0, "{leave}");
        assert_eq!(c.call(&["LOCK.RELEASE", "b", "s"]), Reply::Int(1));
        assert_eq!(waiters_on(&mut c, "a"), 0, "{leave}");
    }
}

#[test]
fn inside_multi_wait_is_a_single_attempt_and_max_waiters_holds() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "a", "h", 60_000);
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "2", "a", "b", "t", "1000", "WAIT", "0"]),
        Reply::status("QUEUED")
    );
    assert_eq!(c.call(&["EXEC"]), Reply::Array(vec![Reply::Nil]));
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.max-waiters", "1"]),
        Reply::status("OK")
    );
    let mut w = server.conn();
    w.send(&["LOCK.ACQUIRE", "a", "w", "1000", "WAIT", "10000"]);
    wait_for("w to queue", || {
        (waiters_on(&mut c, "a") == 1).then_some(())
    });
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "2", "b", "a", "t", "1000", "WAIT", "100"]),
        Reply::error("ERR too many waiters on this lock (lock.max-waiters is 1)")
    );
    assert_eq!(waiters_on(&mut c, "a"), 1);
    assert_eq!(c.call(&["EXISTS", "b"]), Reply::Int(0));
}

/// A multi-lock waiter at the head of its queues that can never be granted (one of its keys
/// became a semaphore meanwhile) gets its error, and the waiter queued behind it on that key is
/// served at once, not at its timeout.
#[test]
fn a_refused_multi_lock_waiter_lets_the_queue_behind_it_move_on() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "{t}k2", "holder", 60_000);
    let mut m = server.conn();
    send_macquire(&mut m, &["{t}k2", "{t}k"], "m", "10000");
    wait_blocked(&server, 1);
    let mut s = server.conn();
    // Its wait ends before the free semaphore would be reclaimed (which serves waiters too).
    s.send(&[
        "LOCK.ACQUIRE",
        "{t}k",
        "s",
        "60000",
        "LIMIT",
        "3",
        "WAIT",
        "3000",
    ]);
    wait_blocked(&server, 2);
    // A free semaphore of 3 permits takes the name {t}k.
    assert!(
        c.call(&["LOCK.ACQUIRE", "{t}sem", "x", "60000", "LIMIT", "3"])
            .int()
            > 0
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "{t}sem", "x"]), Reply::Int(1));
    assert_eq!(c.call(&["RENAME", "{t}sem", "{t}k"]), Reply::status("OK"));
    assert_eq!(c.call(&["LOCK.RELEASE", "{t}k2", "holder"]), Reply::Int(1));
    assert_eq!(
        m.read(),
        Reply::error("ERR the key is a semaphore of 3 permits: acquire it with LIMIT 3")
    );
    assert!(matches!(s.read(), Reply::Int(fence) if fence > 0));
    assert_eq!(blocked(&server), 0);
}

/// While clients are paused nothing may be replicated: a multi-lock waiter whose turn comes then
/// (the waiter ahead of it timed out) is granted once the pause is over, and the server keeps
/// running.
#[test]
fn a_multi_lock_waiters_turn_during_a_client_pause_waits_for_its_end() {
    let server = Server::start_with(Config::default().with("appendonly", "yes"));
    let mut c = server.conn();
    acquire(&mut c, "{t}k3", "holder", 60_000);
    for key in ["{t}k", "{t}k2"] {
        acquire(&mut c, key, "x", 60_000);
        assert_eq!(c.call(&["LOCK.RELEASE", key, "x"]), Reply::Int(1));
    }
    let mut ahead = server.conn();
    send_macquire(&mut ahead, &["{t}k2", "{t}k3"], "ahead", "1000");
    wait_blocked(&server, 1);
    let mut m = server.conn();
    send_macquire(&mut m, &["{t}k", "{t}k2"], "m", "20000");
    wait_blocked(&server, 2);
    assert_eq!(
        c.call(&["CLIENT", "PAUSE", "2500", "WRITE"]),
        Reply::status("OK")
    );
    assert_eq!(ahead.read(), Reply::Nil);
    // The pause still runs: m waits.
    assert_eq!(waiters_on(&mut c, "{t}k"), 1);
    let fences = fences(&m.read());
    assert_eq!(fences.len(), 2);
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
    assert_eq!(mrelease(&mut c, &["{t}k", "{t}k2"], "m"), Reply::Int(2));
}

/// A multi-lock waiter is queued on every key it names, but keeps its first key's name a few
/// times, not once per other key: a waiter with a long first key and a thousand short ones
/// takes memory in proportion to what it sent.
#[test]
fn a_waiting_multi_lock_keeps_its_first_key_name_a_few_times_only() {
    const KEYS: usize = 1_000;
    const LONG: usize = 64 * 1024;
    let server = Server::start_with(Config::default().with("slowlog-log-slower-than", "-1"));
    let mut c = server.conn();
    let others: Vec<String> = (1..KEYS).map(|i| format!("k{i}")).collect();
    let last = others[KEYS - 2].as_str();
    acquire(&mut c, last, "holder", 60_000);
    // The memory a waiter queued on `first` and the others takes.
    let queued = |first: &str| -> i64 {
        let keys: Vec<&str> = std::iter::once(first)
            .chain(others.iter().map(String::as_str))
            .collect();
        let mut waiter = server.conn();
        let before = server.info_int("used_memory");
        send_macquire(&mut waiter, &keys, "w", "60000");
        wait_blocked(&server, 1);
        let grown = server.info_int("used_memory") - before;
        drop(waiter);
        wait_blocked(&server, 0);
        grown
    };
    // Once without measuring: what the server keeps for good afterwards is counted before.
    queued("short");
    let short = queued("short");
    let long = queued(&"k".repeat(LONG));
    // The long name once per other key was 64 MB.
    assert!(
        long - short < 16 * LONG as i64,
        "a blocked multi-lock of {KEYS} keys took {long} bytes with a long first key, {short} \
         with a short one"
    );
}
