//! Gauges stay true whichever way values come and go.

use crate::common::*;
use crate::{assert_counts, gauges};

#[test]
fn gauges_follow_del_and_unlink() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "a", "t", 60_000);
    acquire(&mut c, "b", "t", 60_000);
    acquire(&mut c, "free", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "t"]), Reply::Int(1));
    assert_eq!(gauges(&server), (2, 0, 3));
    assert_eq!(c.call(&["DEL", "a"]), Reply::Int(1));
    assert_eq!(gauges(&server), (1, 0, 2));
    assert_eq!(c.call(&["UNLINK", "b"]), Reply::Int(1));
    assert_eq!(gauges(&server), (0, 0, 1));
    assert_eq!(c.call(&["UNLINK", "free"]), Reply::Int(1));
    assert_eq!(gauges(&server), (0, 0, 0));
}

#[test]
fn gauges_follow_a_deleted_lock_handed_to_its_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 60_000);
    let mut w = queue_waiter(&server, "k", "w", 60_000, 0);
    assert_eq!(gauges(&server), (1, 1, 1));
    assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1));
    let fence = granted(&mut w);
    assert!(fence > first, "{fence} > {first}");
    assert_eq!(gauges(&server), (1, 0, 1));
    assert_eq!(c.call(&["UNLINK", "k"]), Reply::Int(1));
    assert_eq!(gauges(&server), (0, 0, 0));
}

#[test]
fn waiters_gauge_follows_watchers_disconnects_and_client_unblock() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let mut watcher = server.conn();
    watcher.send(&["LOCK.WAIT", "k", "0"]);
    wait_blocked(&server, 1);
    let mut unblocked = server.conn();
    let unblocked_id = unblocked.call(&["CLIENT", "ID"]).int();
    unblocked.send(&["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"]);
    wait_blocked(&server, 2);
    let gone = queue_waiter(&server, "k", "c", 60_000, 0);
    assert_eq!(gauges(&server), (1, 3, 1));
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(3));

    drop(gone);
    wait_for("the disconnected waiter leaves the gauge", || {
        (gauges(&server) == (1, 2, 1)).then_some(())
    });
    assert_eq!(
        c.call(&["CLIENT", "UNBLOCK", &unblocked_id.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(unblocked.read(), Reply::Nil);
    assert_eq!(gauges(&server), (1, 1, 1));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(watcher.read(), Reply::Int(1));
    // Both acquirers found the lock held as they queued.
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_acquire_contended", 2),
            ("lock_released", 1),
            ("lock_acquire_timeouts", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(blocked(&server), 0);
}

#[test]
fn gauges_follow_expiry_and_handover_to_a_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    // Leases long enough that the waiter is queued and the gauges read before they end.
    acquire(&mut c, "k", "a", 400);
    acquire(&mut c, "lone", "b", 300);
    let mut w = queue_waiter(&server, "k", "w", 60_000, 0);
    assert_eq!(gauges(&server), (2, 1, 2));
    granted(&mut w);
    wait_for("both leases expired", || {
        (server.info_int("lock_expired") == 2).then_some(())
    });
    // "lone" is free now; "k" went to its waiter.
    assert_eq!(gauges(&server), (1, 0, 2));
    assert_eq!(state_of(&mut c, "lone"), "free");
    assert_eq!(state_of(&mut c, "k"), "held");
}

#[test]
fn gauges_follow_flushall_sync_and_async() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "a", "t", 60_000);
    acquire(&mut c, "b", "t", 60_000);
    acquire(&mut c, "free", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "t"]), Reply::Int(1));
    let mut w = queue_waiter(&server, "a", "w", 60_000, 0);
    assert_eq!(gauges(&server), (2, 1, 3));
    // SYNC: Valkey's plain FLUSHALL is asynchronous (lazyfree-lazy-user-flush yes by default).
    assert_eq!(c.call(&["FLUSHALL", "SYNC"]), Reply::status("OK"));
    // The waiter competes for a fresh lock, and wins it.
    granted(&mut w);
    assert_eq!(gauges(&server), (1, 0, 1));
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(1));
    acquire(&mut c, "c", "t", 60_000);
    assert_eq!(c.call(&["FLUSHALL", "ASYNC"]), Reply::status("OK"));
    wait_for("gauges at zero after FLUSHALL ASYNC", || {
        (gauges(&server) == (0, 0, 0)).then_some(())
    });
}

#[test]
fn gauges_follow_copy() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "t", 60_000);
    acquire(&mut c, "free", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "t"]), Reply::Int(1));
    assert_eq!(gauges(&server), (1, 0, 2));
    assert_eq!(c.call(&["COPY", "k", "k2"]), Reply::Int(1));
    assert_eq!(gauges(&server), (2, 0, 3));
    assert_eq!(state_of(&mut c, "k2"), "held");
    assert_eq!(c.call(&["COPY", "free", "free2"]), Reply::Int(1));
    assert_eq!(gauges(&server), (2, 0, 4));
    // Replacing a free lock with a held one.
    assert_eq!(c.call(&["COPY", "k", "free", "REPLACE"]), Reply::Int(1));
    assert_eq!(gauges(&server), (3, 0, 4));
    assert_eq!(c.call(&["DEL", "k2", "free2"]), Reply::Int(2));
    assert_eq!(gauges(&server), (2, 0, 2));
}

#[test]
fn gauges_follow_restore() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "t", 60_000);
    acquire(&mut c, "free", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "t"]), Reply::Int(1));
    let Reply::Bulk(held_dump) = c.call(&["DUMP", "k"]) else {
        panic!("DUMP of a held lock")
    };
    let Reply::Bulk(free_dump) = c.call(&["DUMP", "free"]) else {
        panic!("DUMP of a free lock")
    };
    assert_eq!(restore(&mut c, "k2", &held_dump), Reply::status("OK"));
    assert_eq!(gauges(&server), (2, 0, 3));
    assert_eq!(state_of(&mut c, "k2"), "held");
    // REPLACE swaps one value for another: the old one leaves the gauges.
    let replace = |c: &mut Conn, key: &str, payload: &[u8]| {
        c.call(&[&b"RESTORE"[..], key.as_bytes(), b"0", payload, b"REPLACE"])
    };
    assert_eq!(replace(&mut c, "k2", &held_dump), Reply::status("OK"));
    assert_eq!(gauges(&server), (2, 0, 3));
    assert_eq!(replace(&mut c, "k2", &free_dump), Reply::status("OK"));
    assert_eq!(gauges(&server), (1, 0, 3));
    assert_eq!(state_of(&mut c, "k2"), "free");
}

#[test]
fn gauges_reflect_loaded_keys_after_debug_reload_and_restart() {
    let mut server = Server::start_with(Config::default().with("appendonly", "yes"));
    let mut c = server.conn();
    acquire(&mut c, "a", "t", 60_000);
    acquire(&mut c, "b", "t", 60_000);
    acquire(&mut c, "free", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "t"]), Reply::Int(1));
    assert_eq!(gauges(&server), (2, 0, 3));
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    // Valkey 9 may free the replaced dataset after DEBUG RELOAD answers (seen under load, with
    // the AOF on): until then its values still count.
    wait_for("gauges of the reloaded dataset alone", || {
        (gauges(&server) == (2, 0, 3)).then_some(())
    });
    drop(c);

    server.shutdown_and_restart();
    // A new process: the counters start over, the gauges count what was loaded.
    assert_counts(&server, &[("lock_held", 2), ("lock_keys", 3)]);
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "a"), "held");
    assert_eq!(state_of(&mut c, "b"), "held");
    assert_eq!(state_of(&mut c, "free"), "free");
}
