//! Server-side waiting: FIFO handoff, timeouts, disconnects, CLIENT UNBLOCK, no overtaking,
//! max-waiters, non-blocking contexts, demotion, sessions and LOCK.WAIT.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;

#[test]
fn waiters_are_granted_in_arrival_order_with_growing_fences() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 10_000);
    let mut b = queue_waiter(&server, "k", "b", 10_000, 0);
    let mut d = queue_waiter(&server, "k", "d", 10_000, 0);
    let mut e = queue_waiter(&server, "k", "e", 10_000, 0);
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(3));
    assert_eq!(server.info_int("lock_waiters"), 3);

    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    let fence_b = granted(&mut b);
    assert!(fence_b > first);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence_b.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(b.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
    let fence_d = granted(&mut d);
    assert!(fence_d > fence_b);
    assert_eq!(d.call(&["LOCK.RELEASE", "k", "d"]), Reply::Int(1));
    let fence_e = granted(&mut e);
    assert!(fence_e > fence_d);
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(0));
    assert_eq!(server.info_int("lock_waiters"), 0);
    assert_eq!(blocked(&server), 0);
}

#[test]
fn lock_is_handed_over_on_expiry_force_release_and_del() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 200);
    let mut w = queue_waiter(&server, "k", "w", 10_000, 0);
    let fence = granted(&mut w);
    assert_eq!(server.info_int("lock_expired"), 1);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );

    let mut x = queue_waiter(&server, "k", "x", 10_000, 0);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    let fence_x = granted(&mut x);
    assert!(fence_x > fence);

    for delete in ["DEL", "UNLINK"] {
        let before = fence_of(&mut c, "k");
        let mut y = queue_waiter(&server, "k", "y", 10_000, 0);
        assert_eq!(c.call(&[delete, "k"]), Reply::Int(1));
        let fence_y = granted(&mut y);
        assert!(fence_y > before, "{delete}: {fence_y} > {before}");
        assert_eq!(state_of(&mut c, "k"), "held");
        assert_eq!(y.call(&["LOCK.RELEASE", "k", "y"]), Reply::Int(1));
        acquire(&mut c, "k", "x", 10_000);
    }

    let before = fence_of(&mut c, "k");
    let mut z = queue_waiter(&server, "k", "z", 10_000, 0);
    assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
    assert!(granted(&mut z) > before);
}

#[test]
fn timed_out_waiter_gets_nil_and_leaves_no_trace() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut w = server.conn();
    assert_eq!(
        w.call(&["LOCK.ACQUIRE", "k", "w", "10000", "WAIT", "100"]),
        Reply::Nil
    );
    assert_eq!(server.info_int("lock_acquire_timeouts"), 1);
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(0));
    assert_eq!(server.info_int("lock_waiters"), 0);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
}

#[test]
fn wait_zero_waits_without_limit() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut forever = queue_waiter(&server, "k", "f", 10_000, 0);
    // A second waiter with a short timeout times out while the first keeps waiting.
    let mut short = server.conn();
    assert_eq!(
        short.call(&["LOCK.ACQUIRE", "k", "s", "10000", "WAIT", "150"]),
        Reply::Nil
    );
    assert_eq!(blocked(&server), 1);
    c.call(&["LOCK.RELEASE", "k", "a"]);
    granted(&mut forever);
}

#[test]
fn disconnected_waiter_is_never_granted() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let gone = queue_waiter(&server, "k", "gone", 10_000, 0);
    let mut next = queue_waiter(&server, "k", "next", 10_000, 0);
    drop(gone);
    wait_blocked(&server, 1);
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(1));
    c.call(&["LOCK.RELEASE", "k", "a"]);
    granted(&mut next);
    assert_eq!(next.call(&["LOCK.RELEASE", "k", "next"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(server.info_int("lock_acquired"), 2);
}

#[test]
fn client_unblock_cancels_a_wait_without_granting() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut w = queue_waiter(&server, "k", "w", 10_000, 0);
    let id = w_id(&server);
    assert_eq!(
        c.call(&["CLIENT", "UNBLOCK", &id.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(w.read(), Reply::Nil);
    let mut e = queue_waiter(&server, "k", "e", 10_000, 0);
    let id = w_id(&server);
    assert_eq!(
        c.call(&["CLIENT", "UNBLOCK", &id.to_string(), "ERROR"]),
        Reply::Int(1)
    );
    assert!(matches!(e.read(), Reply::Error(m) if m.starts_with("UNBLOCKED")));
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(0));
    c.call(&["LOCK.RELEASE", "k", "a"]);
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(w.call(&["PING"]), Reply::status("PONG"));
}

/// The id of the one blocked client.
fn w_id(server: &Server) -> i64 {
    let list = server.conn().call(&["CLIENT", "LIST"]).text();
    let line = list
        .lines()
        .find(|l| l.contains("flags=b"))
        .expect("a blocked client");
    line.split(' ')
        .find_map(|f| f.strip_prefix("id="))
        .expect("id")
        .parse()
        .expect("number")
}

#[test]
fn non_waiting_acquire_never_overtakes_queued_waiters() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut w = queue_waiter(&server, "k", "w", 10_000, 0);
    c.call(&["MULTI"]);
    c.call(&["LOCK.RELEASE", "k", "a"]);
    c.call(&["LOCK.ACQUIRE", "k", "intruder", "10000"]);
    c.call(&["LOCK.ACQUIRE", "k", "intruder2", "10000", "WAIT", "1000"]);
    let exec = c.call(&["EXEC"]);
    // The release handed the lock over at once: nobody else could take it.
    let fence = granted(&mut w);
    assert_eq!(exec.items()[0], Reply::Int(1));
    assert_eq!(exec.items()[1], Reply::Nil);
    assert_eq!(exec.items()[2], Reply::Nil);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
}

#[test]
fn holder_may_reacquire_even_with_waiters_queued() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 10_000);
    let _w = queue_waiter(&server, "k", "w", 10_000, 0);
    assert_eq!(
        c.call(&[
            "LOCK.ACQUIRE",
            "k",
            "a",
            "10000",
            "REENTRANT",
            "WAIT",
            "100"
        ]),
        Reply::Int(fence)
    );
    assert_eq!(lock_field(&mut c, "k", "holds"), Reply::Int(2));
}

#[test]
fn max_waiters_bounds_the_queue_with_a_clear_error() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.max-waiters", "2"]),
        Reply::status("OK")
    );
    acquire(&mut c, "k", "a", 10_000);
    let _w1 = queue_waiter(&server, "k", "w1", 10_000, 0);
    let _w2 = queue_waiter(&server, "k", "w2", 10_000, 0);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "w3", "10000", "WAIT", "1000"]),
        Reply::error("ERR too many waiters on this lock (lock.max-waiters is 2)")
    );
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(2));
    // Without WAIT the answer is the usual nil.
    assert_eq!(c.call(&["LOCK.ACQUIRE", "k", "w3", "10000"]), Reply::Nil);
}

#[test]
fn wait_is_a_plain_attempt_in_multi_and_lua() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    c.call(&["MULTI"]);
    c.call(&["LOCK.ACQUIRE", "k", "b", "10000", "WAIT", "0"]);
    c.call(&["LOCK.ACQUIRE", "free", "b", "10000", "WAIT", "0"]);
    c.call(&["LOCK.WAIT", "k", "0"]);
    let exec = c.call(&["EXEC"]);
    assert_eq!(exec.items()[0], Reply::Nil);
    assert!(matches!(exec.items()[1], Reply::Int(_)));
    assert_eq!(exec.items()[2], Reply::Int(0));
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'c', '10000', 'WAIT', '0')";
    assert_eq!(c.call(&["EVAL", script, "1", "k"]), Reply::Nil);
    assert_eq!(blocked(&server), 0);
}

#[test]
fn demoted_primary_answers_waiters_with_an_error_never_a_grant() {
    let other = Server::start();
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut w = queue_waiter(&server, "k", "w", 10_000, 0);
    server.replicate_from(&other);
    assert!(matches!(w.read(), Reply::Error(m) if m.starts_with("UNBLOCKED")));
    assert_eq!(server.info_int("lock_waiters"), 0);
}

/// A replica grants nothing from a queue (its locks change by its primary's effects alone): a
/// writable replica refuses WAIT at once, whatever the lock's state, and changes nothing, rather
/// than queue a client that would wait until its timeout, or forever with WAIT 0.
#[test]
fn wait_is_refused_on_a_writable_replica_and_changes_nothing() {
    let primary = Server::start();
    let replica = Server::start_with(Config::default().with("replica-read-only", "no"));
    replica.replicate_from(&primary);
    let mut r = replica.conn();
    // A plain grant on a writable replica is a local write, as for any key.
    let fence = acquire(&mut r, "k", "a", 60_000);
    let refused = Reply::error(
        "ERR WAIT cannot queue on a replica, which grants nothing from a queue: send the command \
         to the primary",
    );
    for args in [
        &["LOCK.ACQUIRE", "k", "w", "10000", "WAIT", "0"][..],
        &["LOCK.ACQUIRE", "k", "w", "10000", "WAIT", "100"],
        &["LOCK.ACQUIRE", "free", "w", "10000", "WAIT", "0"],
        &["LOCK.MACQUIRE", "2", "free", "k", "w", "10000", "WAIT", "0"],
        &["LOCK.MACQUIRE", "1", "free", "w", "10000", "WAIT", "0"],
    ] {
        assert_eq!(r.call(args), refused, "{args:?}");
    }
    assert_eq!(r.call(&["EXISTS", "free"]), Reply::Int(0));
    assert_eq!(fence_of(&mut r, "k"), fence);
    assert_eq!(lock_field(&mut r, "k", "waiters"), Reply::Int(0));
    assert_eq!(blocked(&replica), 0);
    assert_eq!(replica.info_int("lock_waiters"), 0);
    assert_eq!(replica.info_int("lock_acquired"), 1);
    assert_eq!(replica.info_int("lock_acquire_contended"), 0);
    // Without WAIT the call answers at once, as on a primary; LOCK.WAIT, which takes nothing,
    // waits on replicas too.
    assert_eq!(r.call(&["LOCK.ACQUIRE", "k", "w", "10000"]), Reply::Nil);
    assert_eq!(r.call(&["LOCK.WAIT", "k", "50"]), Reply::Int(0));
}

#[test]
fn session_lock_is_released_when_its_connection_closes_and_handed_over() {
    let server = Server::start();
    let mut c = server.conn();
    let mut owner = server.conn();
    let fence = match owner.call(&["LOCK.ACQUIRE", "k", "s", "60000", "SESSION"]) {
        Reply::Int(f) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!(lock_field(&mut c, "k", "session"), Reply::Int(1));
    let mut w = queue_waiter(&server, "k", "w", 10_000, 0);
    drop(owner);
    let next = granted(&mut w);
    assert!(next > fence);
    assert_eq!(server.info_int("lock_session_released"), 1);
    assert_eq!(lock_field(&mut c, "k", "session"), Reply::Int(0));
}

#[test]
fn session_moves_to_the_connection_that_reacquired_it() {
    let server = Server::start();
    let mut c = server.conn();
    let mut first = server.conn();
    assert_eq!(
        first.call(&["CLIENT", "SETNAME", "first"]),
        Reply::status("OK")
    );
    let fence = match first.call(&["LOCK.ACQUIRE", "k", "s", "60000", "SESSION"]) {
        Reply::Int(f) => f,
        other => panic!("{other:?}"),
    };
    let mut second = server.conn();
    assert_eq!(
        second.call(&["LOCK.ACQUIRE", "k", "s", "60000", "SESSION"]),
        Reply::Int(fence)
    );
    drop(first);
    wait_for("the first connection to close", || {
        (!c.call(&["CLIENT", "LIST"]).text().contains("name=first")).then_some(())
    });
    // Any session work for the closed connection runs before this later timer fires.
    acquire(&mut c, "marker", "m", 100);
    wait_for("marker expiry", || {
        (server.info_int("lock_expired") == 1).then_some(())
    });
    assert_eq!(state_of(&mut c, "k"), "held");
    drop(second);
    wait_for("session release", || {
        (state_of(&mut c, "k") == "free").then_some(())
    });
    assert_eq!(server.info_int("lock_session_released"), 1);
}

#[test]
fn session_release_is_replicated() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut owner = primary.conn();
    assert!(matches!(
        owner.call(&["LOCK.ACQUIRE", "k", "s", "60000", "SESSION"]),
        Reply::Int(_)
    ));
    primary.sync_replicas(1);
    let mut r = replica.conn();
    assert_eq!(state_of(&mut r, "k"), "held");
    drop(owner);
    wait_for("session release on the primary", || {
        (primary.info_int("lock_session_released") == 1).then_some(())
    });
    primary.sync_replicas(1);
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(
        digest_value(&mut r, "k"),
        digest_value(&mut primary.conn(), "k")
    );
}

#[test]
fn grants_to_waiters_are_replicated_as_effects() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut w = queue_waiter(&primary, "k", "w", 10_000, 0);
    c.call(&["LOCK.RELEASE", "k", "a"]);
    let fence = granted(&mut w);
    primary.sync_replicas(1);
    let mut r = replica.conn();
    assert_eq!(
        r.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(digest_value(&mut r, "k"), digest_value(&mut c, "k"));
}

#[test]
fn lock_wait_returns_when_the_grant_ends_without_taking_the_lock() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(c.call(&["LOCK.WAIT", "missing", "1000"]), Reply::Int(1));
    acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["LOCK.WAIT", "k", "100"]), Reply::Int(0));
    let mut watchers: Vec<Conn> = (0..3)
        .map(|i| {
            let mut w = server.conn();
            w.send(&["LOCK.WAIT", "k", "0"]);
            wait_blocked(&server, i + 1);
            w
        })
        .collect();
    c.call(&["LOCK.RELEASE", "k", "a"]);
    for w in &mut watchers {
        assert_eq!(w.read(), Reply::Int(1));
    }
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(c.call(&["LOCK.WAIT", "k", "100"]), Reply::Int(1));
}

#[test]
fn lock_wait_also_ends_when_the_lock_changes_hands() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let mut watcher = server.conn();
    watcher.send(&["LOCK.WAIT", "k", "0"]);
    wait_blocked(&server, 1);
    let mut next = queue_waiter(&server, "k", "b", 10_000, 0);
    c.call(&["LOCK.RELEASE", "k", "a"]);
    granted(&mut next);
    assert_eq!(watcher.read(), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "held");
}

#[test]
fn lock_wait_on_a_replica_ends_with_the_primarys_release() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    acquire(&mut c, "k", "a", 10_000);
    primary.sync_replicas(1);
    let mut watcher = replica.conn();
    watcher.send(&["LOCK.WAIT", "k", "0"]);
    wait_blocked(&replica, 1);
    c.call(&["LOCK.RELEASE", "k", "a"]);
    assert_eq!(watcher.read(), Reply::Int(1));
}

#[test]
fn bad_wait_arguments_are_refused() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["LOCK.WAIT", "k", "-1"]),
        Reply::error("ERR invalid timeout-ms: must not be negative")
    );
    assert_eq!(
        c.call(&["LOCK.WAIT", "k", "x"]),
        Reply::error("ERR invalid timeout-ms: not an integer")
    );
    assert_eq!(
        c.call(&["LOCK.WAIT", "k"]),
        Reply::error("ERR wrong number of arguments for 'lock.wait' command")
    );
    c.call(&["SET", "s", "v"]);
    assert_eq!(
        c.call(&["LOCK.WAIT", "s", "10"]),
        Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "100", "WAIT", "10", "WAIT", "10"]),
        Reply::error("ERR option WAIT given more than once")
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "100", "SESSION", "SESSION"]),
        Reply::error("ERR option SESSION given more than once")
    );
    acquire(&mut c, "held", "t", 10_000);
    for args in [
        vec![
            "LOCK.ACQUIRE",
            "held",
            "u",
            "100",
            "WAIT",
            "9223372036854775807",
        ],
        vec!["LOCK.WAIT", "held", "9223372036854775807"],
        vec!["LOCK.ACQUIRE", "held", "u", "100", "WAIT", "35184372088833"],
    ] {
        assert_eq!(
            c.call(&args),
            Reply::error("ERR invalid timeout-ms: too large"),
            "{args:?}"
        );
    }
    assert_eq!(blocked(&server), 0);
    c.call(&["DEL", "held"]);
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
}

/// 50 connections, 200 critical sections each, on one lock with WAIT; each increments a plain
/// counter with GET then SET. Before they start, ten clients queue for the lock and disconnect:
/// none of them may ever be granted it.
#[test]
fn mutual_exclusion_under_contention() {
    const CLIENTS: usize = 50;
    const ROUNDS: usize = 200;
    let server = Server::start();
    let mut c = server.conn();
    c.call(&["SET", "counter", "0"]);
    acquire(&mut c, "lock", "gate", 60_000);
    let quitters: Vec<Conn> = (0..10)
        .map(|i| queue_waiter(&server, "lock", &format!("quitter-{i}"), 600_000, 0))
        .collect();
    drop(quitters);
    wait_blocked(&server, 0);

    let grants = Arc::new(Mutex::new(Vec::with_capacity(CLIENTS * ROUNDS)));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let port = server.port;
            let grants = Arc::clone(&grants);
            thread::spawn(move || {
                let mut c = Conn::connect(port, PATIENCE).expect("connect");
                let token = format!("worker-{i}");
                for _ in 0..ROUNDS {
                    let fence =
                        match c.call(&["LOCK.ACQUIRE", "lock", &token, "10000", "WAIT", "0"]) {
                            Reply::Int(f) => f,
                            other => panic!("{other:?}"),
                        };
                    let value: i64 = c.call(&["GET", "counter"]).text().parse().expect("number");
                    assert_eq!(
                        c.call(&["SET", "counter", &(value + 1).to_string()]),
                        Reply::status("OK")
                    );
                    grants.lock().expect("grants").push((value, fence));
                    assert_eq!(c.call(&["LOCK.RELEASE", "lock", &token]), Reply::Int(1));
                }
            })
        })
        .collect();
    wait_blocked(&server, CLIENTS as i64);
    assert_eq!(c.call(&["LOCK.RELEASE", "lock", "gate"]), Reply::Int(1));
    for w in workers {
        w.join().expect("worker");
    }
    assert_eq!(c.call(&["GET", "counter"]), Reply::bulk("10000"));
    let mut grants = grants.lock().expect("grants").clone();
    grants.sort();
    let values: Vec<i64> = grants.iter().map(|(v, _)| *v).collect();
    assert_eq!(values, (0..(CLIENTS * ROUNDS) as i64).collect::<Vec<_>>());
    for pair in grants.windows(2) {
        assert!(pair[1].1 > pair[0].1, "fences in grant order: {pair:?}");
    }
    // The gate's grant plus the workers': not one went to a quitter.
    assert_eq!(
        server.info_int("lock_acquired"),
        1 + (CLIENTS * ROUNDS) as i64
    );
    assert_eq!(state_of(&mut c, "lock"), "free");
    assert_eq!(server.info_int("lock_waiters"), 0);
}

#[test]
fn a_free_lock_renamed_onto_a_waited_key_goes_to_the_head_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    let held = acquire(&mut c, "k", "a", 10_000);
    let src = acquire(&mut c, "src", "s", 10_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "src", "s"]), Reply::Int(1));
    let mut w = queue_waiter(&server, "k", "w", 10_000, 0);
    assert_eq!(c.call(&["RENAME", "src", "k"]), Reply::status("OK"));
    let fence = granted(&mut w);
    assert!(fence > held && fence > src);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
}

#[test]
fn lock_wait_on_a_replica_ends_when_the_primary_deletes_the_key() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    acquire(&mut c, "k", "a", 10_000);
    primary.sync_replicas(1);
    let mut watcher = replica.conn();
    watcher.send(&["LOCK.WAIT", "k", "0"]);
    wait_blocked(&replica, 1);
    assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1));
    assert_eq!(watcher.read(), Reply::Int(1));
}

#[test]
fn waiters_on_binary_keys_with_nul_bytes_are_served() {
    let server = Server::start();
    let mut c = server.conn();
    let key: &[u8] = b"q\x00\xfe";
    let first = c.call(&[&b"LOCK.ACQUIRE"[..], key, b"a", b"10000"]).int();
    let mut w = server.conn();
    w.send(&[&b"LOCK.ACQUIRE"[..], key, b"w", b"10000", b"WAIT", b"0"]);
    wait_blocked(&server, 1);
    assert_eq!(c.call(&[&b"DEL"[..], key]), Reply::Int(1));
    let fence = granted(&mut w);
    assert!(fence > first);
    let mut s = server.conn();
    s.send(&[&b"LOCK.ACQUIRE"[..], key, b"s", b"10000", b"WAIT", b"0"]);
    wait_blocked(&server, 1);
    assert_eq!(w.call(&[&b"LOCK.RELEASE"[..], key, b"w"]), Reply::Int(1));
    assert!(granted(&mut s) > fence);
}

/// A deleted lock with queued acquirers: a newcomer right after the DEL (here in the same
/// transaction, before the module settles the key) does not overtake them.
#[test]
fn an_acquire_right_after_del_does_not_overtake_the_queue() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "holder", 60_000);
    let mut waiter = queue_waiter(&server, "k", "waiter", 60_000, 5_000);
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(c.call(&["DEL", "k"]), Reply::status("QUEUED"));
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "newcomer", "60000"]),
        Reply::status("QUEUED")
    );
    assert_eq!(
        c.call(&["EXEC"]),
        Reply::Array(vec![Reply::Int(1), Reply::Nil])
    );
    let fence = granted(&mut waiter);
    assert_eq!(fence_of(&mut c, "k"), fence);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "waiter"]), Reply::Int(1));
}

/// The head waiter is granted right after the command that freed the lock; keys whose braces
/// leave the module no other name in their hash slot to block waiters on are served all the
/// same (their waiters block on the key itself).
#[test]
fn waiters_are_served_in_order_whatever_braces_their_key_has() {
    let server = Server::start();
    let mut c = server.conn();
    for key in ["plain", "{tag}.lock", "a}b", "a{}b", "no{close", "{"] {
        let first = acquire(&mut c, key, "holder", 60_000);
        let mut b = queue_waiter(&server, key, "b", 60_000, 0);
        let mut d = queue_waiter(&server, key, "d", 60_000, 0);
        assert_eq!(c.call(&["LOCK.RELEASE", key, "holder"]), Reply::Int(1));
        let fence_b = granted(&mut b);
        assert!(fence_b > first, "{key}");
        assert_eq!(lock_field(&mut c, key, "waiters"), Reply::Int(1), "{key}");
        // A newcomer does not overtake the waiter still queued.
        assert_eq!(
            c.call(&["LOCK.ACQUIRE", key, "newcomer", "60000"]),
            Reply::Nil,
            "{key}"
        );
        assert_eq!(b.call(&["LOCK.RELEASE", key, "b"]), Reply::Int(1));
        assert!(granted(&mut d) > fence_b, "{key}");
        assert_eq!(d.call(&["LOCK.RELEASE", key, "d"]), Reply::Int(1));
        assert_eq!(blocked(&server), 0, "{key}");
    }
}

/// As Redis serves blocked clients only after a whole transaction or script, a lock freed inside
/// one goes to its head waiter after it: the transaction still sees the waiter queued.
#[test]
fn a_lock_freed_in_a_transaction_or_script_is_handed_over_after_it() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "holder", 60_000);
    let mut w = queue_waiter(&server, "k", "w", 60_000, 0);
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.RELEASE", "k", "holder"]),
        Reply::status("QUEUED")
    );
    assert_eq!(c.call(&["LOCK.INFO", "k"]), Reply::status("QUEUED"));
    let Reply::Array(replies) = c.call(&["EXEC"]) else {
        panic!("EXEC");
    };
    assert_eq!(replies[0], Reply::Int(1));
    assert_eq!(info_field(&replies[1], "waiters"), Reply::Int(1));
    assert_eq!(info_field(&replies[1], "state").text(), "free");
    let fence = granted(&mut w);
    assert_eq!(fence_of(&mut c, "k"), fence);

    let mut x = queue_waiter(&server, "k", "x", 60_000, 0);
    let script = "redis.call('LOCK.RELEASE', KEYS[1], ARGV[1]) \
                  return redis.call('LOCK.INFO', KEYS[1])";
    let info = c.call(&["EVAL", script, "1", "k", "w"]);
    assert_eq!(info_field(&info, "waiters"), Reply::Int(1));
    assert!(granted(&mut x) > fence);
    assert_eq!(blocked(&server), 0);
}

/// One field of a LOCK.INFO reply already read.
fn info_field(info: &Reply, field: &str) -> Reply {
    lock_info_fields(info.clone())
        .and_then(|fields| fields.into_iter().find(|(name, _)| name == field))
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("LOCK.INFO has no field {field}: {info:?}"))
}

/// How the lock of [`a_waiter_whose_wait_ran_out_is_never_granted`] is freed.
#[derive(Clone, Copy, Debug)]
enum Freed {
    Release,
    LeaseEnd,
    Del,
    ForceRelease,
    SessionClosed,
}

/// A waiter whose WAIT ran out is never granted the lock, whichever way it is freed before the
/// server got round to answering the timeout (with `hz 1` Redis 7.0 may look at timed-out
/// blocked clients only a second later): it gets nil, and the waiter behind it gets the lock.
/// Also a multi-lock waiter.
#[test]
fn a_waiter_whose_wait_ran_out_is_never_granted() {
    for multi in [false, true] {
        for freed in [
            Freed::Release,
            Freed::LeaseEnd,
            Freed::Del,
            Freed::ForceRelease,
            Freed::SessionClosed,
        ] {
            let what = format!("{freed:?}, multi-lock waiter {multi}");
            let server = Server::start_with(Config::default().with("hz", "1"));
            let mut c = server.conn();
            let mut holder = server.conn();
            let lease = match freed {
                // Ends after the first waiter's wait, before the server answers its timeout.
                Freed::LeaseEnd => 500,
                _ => 600_000,
            };
            let granted_at = std::time::Instant::now();
            match freed {
                Freed::SessionClosed => {
                    assert!(acquire_with(&mut holder, "k", "h", lease, &["SESSION"]).is_int())
                }
                _ => {
                    acquire(&mut holder, "k", "h", lease);
                }
            }
            let mut late = server.conn();
            if multi {
                late.send(&["LOCK.MACQUIRE", "1", "k", "late", "600000", "WAIT", "100"]);
            } else {
                late.send(&["LOCK.ACQUIRE", "k", "late", "600000", "WAIT", "100"]);
            }
            wait_blocked(&server, 1);
            let mut next = server.conn();
            next.send(&["LOCK.ACQUIRE", "k", "next", "600000", "WAIT", "10000"]);
            wait_blocked(&server, 2);
            // Past the late waiter's deadline, with nothing to wake the server meanwhile (no
            // bare sleep: the condition waited on is the time itself).
            let past_deadline = granted_at + Duration::from_millis(300);
            std::thread::sleep(past_deadline.saturating_duration_since(std::time::Instant::now()));
            match freed {
                Freed::Release => assert_eq!(c.call(&["LOCK.RELEASE", "k", "h"]), Reply::Int(1)),
                Freed::LeaseEnd => {}
                Freed::Del => assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1)),
                Freed::ForceRelease => {
                    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1))
                }
                Freed::SessionClosed => drop(holder),
            }
            assert_eq!(late.read(), Reply::Nil, "{what}: the late waiter");
            assert!(next.read().int() > 0, "{what}: the next waiter");
            assert_eq!(lock_field(&mut c, "k", "holders"), Reply::Int(1), "{what}");
            assert_eq!(
                c.call(&["LOCK.RELEASE", "k", "late"]),
                Reply::Int(0),
                "{what}"
            );
            assert_eq!(
                c.call(&["LOCK.RELEASE", "k", "next"]),
                Reply::Int(1),
                "{what}"
            );
            assert_eq!(server.info_int("lock_acquire_timeouts"), 1, "{what}");
        }
    }
}
