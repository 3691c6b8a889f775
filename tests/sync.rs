//! `SYNC numreplicas timeout-ms`: the reply of LOCK.ACQUIRE (and LOCK.RENEW) waits until that
//! many replicas acknowledged the change, so a client never acts on a grant a failover can lose;
//! a grant not acknowledged in time is taken back (a replicated release) and the client gets an
//! error. The wait blocks only its client.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn pair() -> (Server, Server) {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    // After a full sync the replica's first acknowledgement can take a second: get past it.
    let mut p = primary.conn();
    assert_eq!(p.call(&["SET", "link-check", "1"]), Reply::status("OK"));
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(p.call(&["DEL", "link-check"]), Reply::Int(1));
    wait_replica_caught_up(&primary, &replica);
    (primary, replica)
}

fn not_acknowledged(replicas: u64, ms: u64) -> Reply {
    Reply::error(&format!(
        "NOREPLICAS the grant was not acknowledged by {replicas} replica(s) within {ms} ms and was \
         undone"
    ))
}

#[test]
fn a_grant_is_answered_once_the_replica_has_it() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let mut r = replica.conn();
    let started = Instant::now();
    let fence = p
        .call(&["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "1", "5000"])
        .int();
    let took = started.elapsed();
    eprintln!("LOCK.ACQUIRE ... SYNC 1 answered after {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    // Acknowledged means the replica has applied it: no waiting here.
    assert_eq!(fence_of(&mut r, "k"), fence);
    assert_eq!(state_of(&mut r, "k"), "held");
    assert_eq!(primary.info_int("lock_sync_confirmed"), 1);
    // SYNC 0 answers at once; a refresh by the holder waits like a grant.
    assert_eq!(
        p.call(&["LOCK.ACQUIRE", "other", "t", "60000", "SYNC", "0", "10"]),
        Reply::Int(fence_of(&mut p, "other"))
    );
    assert_eq!(
        p.call(&["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "1", "5000"]),
        Reply::Int(fence)
    );
    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "t", "60000", "SYNC", "1", "5000"]),
        Reply::Int(1)
    );
    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "wrong", "60000", "SYNC", "1", "5000"]),
        Reply::Int(0)
    );
    assert_eq!(primary.info_int("lock_sync_confirmed"), 3);
}

#[test]
fn a_grant_no_replica_acknowledges_is_undone_everywhere() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let started = Instant::now();
    assert_eq!(
        p.call(&["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "2", "200"]),
        not_acknowledged(2, 200)
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(state_of(&mut p, "k"), "free");
    assert_eq!(primary.info_int("lock_sync_failed"), 1);
    // The release was replicated like any other.
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(state_of(&mut replica.conn(), "k"), "free");
    // A renewal stays (it cannot be taken back), but the client is told it may be lost.
    let fence = acquire(&mut p, "k", "t", 60_000);
    assert_eq!(
        p.call(&["LOCK.RENEW", "k", "t", "90000", "SYNC", "2", "100"]),
        Reply::error(
            "NOREPLICAS the change was not acknowledged by 2 replica(s) within 100 ms: a failover \
             may lose it"
        )
    );
    assert_eq!(fence_of(&mut p, "k"), fence);
    assert!(lock_field(&mut p, "k", "ttl").int() > 60_000);
}

#[test]
fn a_replica_held_back_never_confirms_and_the_grant_is_undone() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    let mut r = replica.conn();
    // CLIENT PAUSE WRITE on the replica holds back what its primary sends.
    assert_eq!(
        r.call(&["CLIENT", "PAUSE", "5000", "WRITE"]),
        Reply::status("OK")
    );
    assert_eq!(
        p.call(&["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "1", "300"]),
        not_acknowledged(1, 300)
    );
    assert_eq!(state_of(&mut p, "k"), "free");
    // A client that goes away while its grant waits for replicas: the grant is undone too.
    let mut gone = primary.conn();
    gone.send(&["LOCK.ACQUIRE", "k2", "t", "60000", "SYNC", "1", "5000"]);
    wait_blocked(&primary, 1);
    assert_eq!(state_of(&mut p, "k2"), "held");
    drop(gone);
    wait_for("the abandoned grant to be undone", || {
        (state_of(&mut p, "k2") == "free").then_some(())
    });
    assert_eq!(r.call(&["CLIENT", "UNPAUSE"]), Reply::status("OK"));
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(state_of(&mut r, "k2"), "free");
    assert_eq!(primary.info_int("lock_sync_failed"), 2);
}

#[test]
fn a_waiter_granted_from_the_queue_is_answered_once_the_replica_has_it() {
    let (primary, replica) = pair();
    let mut p = primary.conn();
    acquire(&mut p, "k", "holder", 60_000);
    let mut waiter = primary.conn();
    waiter.send(&[
        "LOCK.ACQUIRE",
        "k",
        "w",
        "60000",
        "WAIT",
        "5000",
        "SYNC",
        "1",
        "5000",
    ]);
    wait_blocked(&primary, 1);
    assert_eq!(p.call(&["LOCK.RELEASE", "k", "holder"]), Reply::Int(1));
    let fence = granted(&mut waiter);
    assert_eq!(fence_of(&mut replica.conn(), "k"), fence);
    assert_eq!(primary.info_int("lock_sync_confirmed"), 1);
    assert_eq!(primary.info_int("lock_waiters"), 0);
}

#[test]
fn sync_is_refused_where_a_client_cannot_wait_and_bad_values_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    refused_in_multi_and_script(
        &mut c,
        &["LOCK.ACQUIRE", "k", "t", "1000", "SYNC", "1", "100"],
        "ERR SYNC cannot wait for replicas inside MULTI or a script; send WAIT after EXEC instead",
    );
    for (args, error) in [
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "SYNC"],
            "ERR invalid numreplicas: missing after SYNC",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "SYNC", "1"],
            "ERR invalid SYNC timeout-ms: missing after SYNC",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "SYNC", "-1", "100"],
            "ERR invalid numreplicas: must not be negative",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "SYNC", "1", "0"],
            "ERR invalid SYNC timeout-ms: must be positive",
        ),
        (
            vec![
                "LOCK.ACQUIRE",
                "k",
                "t",
                "1000",
                "SYNC",
                "1",
                "10",
                "SYNC",
                "1",
                "10",
            ],
            "ERR option SYNC given more than once",
        ),
        (
            vec!["LOCK.RENEW", "k", "t", "1000", "SYNC", "x", "10"],
            "ERR invalid numreplicas: not an integer",
        ),
        (
            vec!["LOCK.RENEW", "k", "t", "1000", "BOGUS"],
            "ERR unknown option at argument 4 (expected SYNC or FSYNC)",
        ),
    ] {
        assert_eq!(c.call(&args), Reply::error(error), "{args:?}");
    }
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(0));
}

/// The error of a SYNC grant (or change) that stays although no replica acknowledged it.
fn kept_unacknowledged(replicas: u64, ms: u64) -> Reply {
    Reply::error(&format!(
        "NOREPLICAS the change was not acknowledged by {replicas} replica(s) within {ms} ms: a \
         failover may lose it"
    ))
}

/// A reply that promised a lease is never taken back. While a grant waits for a replica that
/// never answers, its token's plain retry (the documented answer to a lost reply), a reentrant
/// acquire, a RENEW or a refresh that waits for replicas too is answered with a lease; from then
/// on the grant stays, and its SYNC client hears that it was kept without acknowledgement. The
/// same for shared holds and permits.
#[test]
fn a_grant_its_token_refreshed_while_replicas_were_awaited_is_never_taken_back() {
    let server = Server::start();
    let refreshes: [(&str, &[&str]); 5] = [
        ("ACQUIRE", &["LOCK.ACQUIRE", "KEY", "T", "30000"]),
        (
            "REENTRANT",
            &["LOCK.ACQUIRE", "KEY", "T", "30000", "REENTRANT"],
        ),
        ("RENEW", &["LOCK.RENEW", "KEY", "T", "30000"]),
        (
            "ACQUIRE SYNC",
            &["LOCK.ACQUIRE", "KEY", "T", "30000", "SYNC", "1", "100"],
        ),
        (
            "RENEW SYNC",
            &["LOCK.RENEW", "KEY", "T", "30000", "SYNC", "1", "100"],
        ),
    ];
    let modes: [&[&str]; 3] = [&[], &["SHARED"], &["LIMIT", "2"]];
    let (mut case, mut failed) = (0, 0);
    for mode in modes {
        for (what, refresh) in refreshes {
            case += 1;
            let key = format!("k{case}");
            let with_mode = |command: &[&str]| -> Vec<String> {
                let mut args: Vec<String> = command
                    .iter()
                    .map(|a| {
                        if *a == "KEY" {
                            key.clone()
                        } else {
                            a.to_string()
                        }
                    })
                    .collect();
                if command[0] == "LOCK.ACQUIRE" {
                    args.extend(mode.iter().map(|m| m.to_string()));
                }
                args
            };
            let mut first = server.conn();
            first.send(&with_mode(&[
                "LOCK.ACQUIRE",
                "KEY",
                "T",
                "30000",
                "SYNC",
                "1",
                "500",
            ]));
            wait_blocked(&server, 1);
            let fence = fence_of(&mut server.conn(), &key);
            let mut retry = server.conn();
            let answer = retry.call(&with_mode(refresh));
            let promised = if refresh[0] == "LOCK.RENEW" { 1 } else { fence };
            failed += 1;
            if refresh.contains(&"SYNC") {
                failed += 1;
                assert_eq!(answer, kept_unacknowledged(1, 100), "{what} {mode:?}");
            } else {
                assert_eq!(answer, Reply::Int(promised), "{what} {mode:?}");
            }
            assert_eq!(first.read(), kept_unacknowledged(1, 500), "{what} {mode:?}");
            let mut c = server.conn();
            assert_eq!(
                c.call(&["LOCK.FENCE", &key, &fence.to_string()]),
                Reply::Int(1),
                "{what} {mode:?}: the lease promised to the retry was taken back"
            );
            assert_eq!(state_of(&mut c, &key), "held", "{what} {mode:?}");
            let other = c.call(&with_mode(&["LOCK.ACQUIRE", "KEY", "other", "30000"]));
            if mode.is_empty() {
                assert_eq!(other, Reply::Nil, "{what} {mode:?}");
            }
        }
    }
    assert_eq!(server.info_int("lock_sync_confirmed"), 0);
    assert_eq!(server.info_int("lock_sync_failed"), failed);
}

/// Without a refresh the grant is still taken back, and a refresh after the take-back is a new
/// acquire; a SYNC client whose wait is cut short (CLIENT UNBLOCK) is told whether its grant
/// stays: taken back when still provisional, kept when its token refreshed it.
#[test]
fn an_unrefreshed_grant_is_taken_back_and_an_unblocked_client_hears_its_fate() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "T", "30000", "SYNC", "1", "200"]),
        not_acknowledged(1, 200)
    );
    assert_eq!(state_of(&mut c, "k"), "free");
    for refreshed in [false, true] {
        let key = format!("unblocked-{refreshed}");
        let mut first = server.conn();
        let id = first.call(&["CLIENT", "ID"]).int();
        first.send(&["LOCK.ACQUIRE", &key, "T", "30000", "SYNC", "1", "5000"]);
        wait_blocked(&server, 1);
        let fence = fence_of(&mut c, &key);
        if refreshed {
            assert_eq!(c.call(&["LOCK.RENEW", &key, "T", "30000"]), Reply::Int(1));
        }
        assert_eq!(
            c.call(&["CLIENT", "UNBLOCK", &id.to_string()]),
            Reply::Int(1)
        );
        if refreshed {
            assert_eq!(first.read(), kept_unacknowledged(1, 5000));
            // Past the next run of the acknowledgement timer: still held.
            assert_eq!(
                c.call(&["LOCK.ACQUIRE", "probe", "p", "10", "SYNC", "1", "50"]),
                not_acknowledged(1, 50)
            );
            assert_eq!(
                c.call(&["LOCK.FENCE", &key, &fence.to_string()]),
                Reply::Int(1)
            );
        } else {
            assert_eq!(first.read(), not_acknowledged(1, 5000));
            wait_for("the unblocked grant to be taken back", || {
                (state_of(&mut c, &key) == "free").then_some(())
            });
        }
    }
}

/// A replica cannot keep SYNC's or FSYNC's promise: nothing it changes reaches the primary's
/// replicas, and its primary's next sync replaces it. A writable replica refuses both at once,
/// whatever else the call asks, and changes nothing (no grant, no renewal, nobody blocked).
#[test]
fn sync_and_fsync_are_refused_on_a_writable_replica_and_change_nothing() {
    let primary = Server::start();
    let replica = Server::start_with(
        Config::default()
            .with("replica-read-only", "no")
            .with("appendonly", "yes"),
    );
    replica.replicate_from(&primary);
    let mut r = replica.conn();
    // A plain grant on a writable replica is a local write, as for any key.
    acquire(&mut r, "local", "t", 60_000);
    let refused = Reply::error(
        "ERR SYNC and FSYNC cannot be kept on a replica, whose changes its primary's next sync \
         replaces: send the command to the primary",
    );
    for args in [
        &["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "1", "100"][..],
        &["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "0", "100"],
        &["LOCK.ACQUIRE", "k", "t", "60000", "FSYNC", "100"],
        &[
            "LOCK.ACQUIRE",
            "k",
            "t",
            "60000",
            "SYNC",
            "1",
            "100",
            "FSYNC",
            "100",
        ],
        &[
            "LOCK.ACQUIRE",
            "local",
            "other",
            "60000",
            "WAIT",
            "1000",
            "SYNC",
            "1",
            "100",
        ],
        &["LOCK.ACQUIRE", "local", "t", "90000", "SYNC", "1", "100"],
        &["LOCK.RENEW", "local", "t", "90000", "SYNC", "1", "100"],
        &["LOCK.RENEW", "local", "t", "90000", "FSYNC", "100"],
    ] {
        assert_eq!(r.call(args), refused, "{args:?}");
    }
    assert_eq!(r.call(&["EXISTS", "k"]), Reply::Int(0));
    assert!(lock_field(&mut r, "local", "ttl").int() <= 60_000);
    assert_eq!(lock_field(&mut r, "local", "waiters"), Reply::Int(0));
    assert_eq!(blocked(&replica), 0);
    assert_eq!(replica.info_int("lock_acquired"), 1);
    assert_eq!(replica.info_int("lock_renewed"), 0);
    assert_eq!(replica.info_int("lock_sync_failed"), 0);
    // On a read-only replica the server refuses every write first.
    assert_eq!(
        replica
            .conn()
            .call(&["CONFIG", "SET", "replica-read-only", "yes"]),
        Reply::status("OK")
    );
    assert_eq!(
        r.call(&["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "1", "100"]),
        Reply::error("READONLY You can't write against a read only replica.")
    );
}

/// A primary that becomes a replica while a SYNC client waits answers that client (the server
/// unblocks it; the wait is counted as failed), and leaves nothing waiting behind.
#[test]
fn a_sync_client_waiting_when_its_primary_becomes_a_replica_is_answered() {
    let server = Server::start();
    let new_primary = Server::start();
    let mut waiting = server.conn();
    waiting.send(&["LOCK.ACQUIRE", "k", "t", "60000", "SYNC", "1", "60000"]);
    wait_blocked(&server, 1);
    assert_eq!(state_of(&mut server.conn(), "k"), "held");
    assert_eq!(
        server
            .conn()
            .call(&["REPLICAOF", "127.0.0.1", &new_primary.port.to_string()]),
        Reply::status("OK")
    );
    assert_eq!(
        waiting.read(),
        Reply::error(
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> \
             replica?)"
        )
    );
    wait_blocked(&server, 0);
    wait_for("the wait to be counted as failed", || {
        (server.info_int("lock_sync_failed") == 1).then_some(())
    });
    assert_eq!(server.info_int("lock_sync_confirmed"), 0);
    // The new primary's data replaces the demoted one's: its grant is gone.
    wait_for("the sync with the new primary", || {
        (server.conn().call(&["LOCK.INFO", "k"]) == Reply::Nil).then_some(())
    });
}
