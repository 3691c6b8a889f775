//! Review of the metrics cut by namespace (INFO `lock_namespace_<name>` lines): what a line says
//! against what the README promises and against the server-wide gauges and counters it splits.

mod common;

use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::Duration;

use common::*;

/// The `lock_namespace_<name>` lines of an `INFO lock` text: name -> field -> value.
fn namespace_lines(info: &str) -> BTreeMap<String, BTreeMap<String, i64>> {
    info.lines()
        .filter_map(|l| l.trim().strip_prefix("lock_namespace_"))
        .map(|l| {
            let (name, fields) = l.split_once(':').expect("name:fields");
            let fields = fields
                .split(',')
                .map(|pair| {
                    let (f, v) = pair.split_once('=').expect("field=value");
                    (f.to_string(), v.parse().expect("an integer"))
                })
                .collect();
            (name.to_string(), fields)
        })
        .collect()
}

fn lines_of(server: &Server) -> BTreeMap<String, BTreeMap<String, i64>> {
    namespace_lines(&server.conn().call(&["INFO", "lock"]).text())
}

/// `field` of every namespace line, by name.
fn by_namespace(
    lines: &BTreeMap<String, BTreeMap<String, i64>>,
    field: &str,
) -> BTreeMap<String, i64> {
    lines
        .iter()
        .map(|(name, fields)| (name.clone(), fields[field]))
        .collect()
}

fn sum(lines: &BTreeMap<String, BTreeMap<String, i64>>, field: &str) -> i64 {
    lines.values().map(|fields| fields[field]).sum()
}

fn expect(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
}

/// README, "Metrics by namespace": "until the walk reaches a lock, it counts in its old
/// namespace. Waiters (at most one per connection) move at once." A lock and a waiter on `a:1`
/// (namespace `a`) must never be shown in namespace `b`, which has no key at all. The ages and
/// the waiter queues keep a *position* in the policy (`space`), and INFO reads that position
/// in the new policy, where `b` now sits first.
#[test]
fn a_lock_and_a_waiter_not_moved_yet_never_count_in_a_namespace_they_were_never_in() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    acquire(&mut c, "a:1", "t", 60_000);
    let _waiter = queue_waiter(&server, "a:1", "u", 60_000, 60_000);
    let lines = lines_of(&server);
    assert_eq!(
        by_namespace(&lines, "held"),
        expect(&[("a", 1), ("default", 0)])
    );
    assert_eq!(
        by_namespace(&lines, "waiters"),
        expect(&[("a", 1), ("default", 0)])
    );

    // The new policy puts a namespace without any key before `a`; INFO read in the same
    // transaction as the change (before the module's next timer turn).
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b prefix=b:; a prefix=a:"
        ]),
        Reply::status("QUEUED")
    );
    assert_eq!(c.call(&["INFO", "lock"]), Reply::status("QUEUED"));
    let Reply::Array(replies) = c.call(&["EXEC"]) else {
        panic!("EXEC")
    };
    assert_eq!(replies[0], Reply::status("OK"));
    let lines = namespace_lines(&replies[1].text());
    assert_eq!(
        (
            by_namespace(&lines, "held"),
            by_namespace(&lines, "waiters")
        ),
        (
            expect(&[("a", 1), ("b", 0), ("default", 0)]),
            expect(&[("a", 1), ("b", 0), ("default", 0)])
        ),
        "right after the change: {lines:?}"
    );
}

/// The same, while clients are paused (CLIENT PAUSE WRITE, as a failover does): the module's
/// deferred jobs wait for the pause to end, so for the whole pause INFO shows the lock and its
/// waiter in namespace `b`, a namespace that has no key.
#[test]
fn during_a_client_pause_a_policy_change_shows_locks_in_a_namespace_they_are_not_in() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    acquire(&mut c, "a:1", "t", 60_000);
    let _waiter = queue_waiter(&server, "a:1", "u", 60_000, 60_000);
    assert_eq!(
        c.call(&["CLIENT", "PAUSE", "3000", "WRITE"]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b prefix=b:; a prefix=a:"
        ]),
        Reply::status("OK")
    );
    // Well past several of the module's retries (every 10 ms while paused).
    sleep(Duration::from_millis(300));
    let lines = lines_of(&server);
    assert_eq!(c.call(&["CLIENT", "UNPAUSE"]), Reply::status("OK"));
    assert_eq!(
        (
            by_namespace(&lines, "held"),
            by_namespace(&lines, "waiters")
        ),
        (
            expect(&[("a", 1), ("b", 0), ("default", 0)]),
            expect(&[("a", 1), ("b", 0), ("default", 0)])
        ),
        "300 ms after the change, clients paused: {lines:?}"
    );
}

/// `held` is "the namespace's share of the server-wide gauge": a lock whose grant time is not
/// known (written by a release before grant times were kept, or any payload without them: the
/// current encoding allows it) is held, counted by `lock_held`, and must be in its namespace's
/// `held`. The ages leave out a lock with no known grant time (`Lock::oldest_grant` filters
/// `since > 0`), and `held` is read from the ages.
#[test]
fn a_held_lock_whose_grant_time_is_unknown_counts_in_its_namespace() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let deadline = now_ms() + 600_000;
    assert_eq!(
        restore(
            &mut c,
            "a:old",
            &format.payload(&held_fields(1 << 20, b"old-token", deadline, 1, 0))
        ),
        Reply::status("OK")
    );
    assert_eq!(state_of(&mut c, "a:old"), "held");
    assert_eq!(server.info_int("lock_held"), 1);
    let lines = lines_of(&server);
    assert_eq!(
        by_namespace(&lines, "held"),
        expect(&[("a", 1), ("default", 0)]),
        "lock_held is 1: {lines:?}"
    );
}

/// Regression (passes now): every counted namespace field adds up to the server-wide figure it
/// splits, on the primary and on a replica, for MACQUIRE (granted at once and from a queue),
/// shared locks and semaphores with several holders whose leases run out, LOCK.WAIT watchers,
/// a SESSION lock ended by a disconnect, a lock-delay, a forced release and a timeout.
#[test]
fn the_namespace_lines_add_up_to_the_server_wide_figures_on_primary_and_replica() {
    const POLICY: &str = "a prefix=a:; b prefix=b:";
    let primary = Server::start_with(Config::default().namespaces(POLICY));
    let replica = Server::start_with(Config::default().namespaces(POLICY));
    replica.replicate_from(&primary);
    let mut c = primary.conn();

    // MACQUIRE across namespaces, granted at once.
    let granted = c.call(&["LOCK.MACQUIRE", "3", "a:m1", "b:m1", "x:m1", "t", "60000"]);
    assert!(
        matches!(granted, Reply::Array(ref f) if f.len() == 3),
        "{granted:?}"
    );
    // MACQUIRE contended on its second key, queued on its first, then granted.
    acquire(&mut c, "b:m2", "x", 60_000);
    let before = blocked(&primary);
    let mut multi = primary.conn();
    multi.send(&[
        "LOCK.MACQUIRE",
        "2",
        "a:m2",
        "b:m2",
        "m",
        "60000",
        "WAIT",
        "10000",
    ]);
    wait_blocked(&primary, before + 1);
    // Shared holders and semaphore permits, some with short leases.
    for (n, ttl) in [(1, 60_000), (2, 150), (3, 150)] {
        let r = acquire_with(&mut c, "a:s", &format!("s{n}"), ttl, &["SHARED"]);
        assert!(r.is_int(), "{r:?}");
        let r = acquire_with(&mut c, "b:p", &format!("p{n}"), ttl, &["LIMIT", "3"]);
        assert!(r.is_int(), "{r:?}");
    }
    // A watcher and a waiter that times out.
    acquire(&mut c, "b:w", "t", 60_000);
    let before = blocked(&primary);
    let mut watcher = primary.conn();
    watcher.send(&["LOCK.WAIT", "b:w", "60000"]);
    wait_blocked(&primary, before + 1);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "b:w", "u", "1000", "WAIT", "30"]),
        Reply::Nil
    );
    // A lock-delay: a lease that runs out leaves the lock refusing new grants for a while.
    let r = acquire_with(&mut c, "a:d", "t", 100, &["LOCKDELAY", "60000"]);
    assert!(r.is_int(), "{r:?}");
    wait_for("the delayed lease to run out", || {
        (lock_field(&mut c, "a:d", "delay_ttl").int() > 0).then_some(())
    });
    assert_eq!(c.call(&["LOCK.ACQUIRE", "a:d", "u", "1000"]), Reply::Nil);
    // A SESSION lock whose connection goes away.
    {
        let mut s = primary.conn();
        let r = acquire_with(&mut s, "a:sess", "t", 60_000, &["SESSION"]);
        assert!(r.is_int(), "{r:?}");
    }
    // A forced release, which hands b:m2 to the queued MACQUIRE.
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "b:m2"]), Reply::Int(1));
    assert!(matches!(multi.read(), Reply::Array(ref f) if f.len() == 2));
    wait_for("the short leases to run out and the session to end", || {
        (primary.info_int("lock_expired") == 5
            && lock_info(&mut c, "a:sess").map(|_| state_of(&mut c, "a:sess"))
                != Some("held".to_string()))
        .then_some(())
    });

    let server_wide = |server: &Server| {
        [
            ("held", "lock_held"),
            ("waiters", "lock_waiters"),
            ("acquired", "lock_acquired"),
            ("contended", "lock_acquire_contended"),
            ("timeouts", "lock_acquire_timeouts"),
            ("expired", "lock_expired"),
            ("forced", "lock_forced"),
        ]
        .into_iter()
        .map(|(field, total)| (field, server.info_int(total)))
        .collect::<BTreeMap<_, _>>()
    };
    let summed = |server: &Server| {
        let lines = lines_of(server);
        [
            "held",
            "waiters",
            "acquired",
            "contended",
            "timeouts",
            "expired",
            "forced",
        ]
        .into_iter()
        .map(|field| (field, sum(&lines, field)))
        .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(summed(&primary), server_wide(&primary));
    wait_replica_caught_up(&primary, &replica);
    wait_for("the replica to apply everything", || {
        (replica.info_int("lock_expired") == 5 && replica.info_int("lock_forced") == 1)
            .then_some(())
    });
    let on_replica = summed(&replica);
    let replica_wide = server_wide(&replica);
    for field in ["held", "acquired", "expired", "forced"] {
        assert_eq!(on_replica[field], replica_wide[field], "replica {field}");
    }
}

/// Regression (passes now): a policy change whose walk over the keyspace is still running when
/// the data is flushed and reloaded ends with every held lock in its namespace, the lines adding
/// up to `lock_held`.
#[test]
fn a_policy_walk_cut_by_a_flush_and_a_reload_ends_with_every_lock_in_its_namespace() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    assert_eq!(
        c.call(&["DEBUG", "POPULATE", "200000", "filler"]),
        Reply::status("OK")
    );
    const LOCKS: usize = 2_000;
    for i in 0..LOCKS {
        c.send(&[
            "LOCK.ACQUIRE",
            &format!("{}:{i}", ["a", "b"][i % 2]),
            "t",
            "600000",
        ]);
    }
    for _ in 0..LOCKS {
        assert!(c.read().is_int());
    }
    c.send(&[
        "CONFIG",
        "SET",
        "lock.namespaces",
        "b prefix=b:; a prefix=a:",
    ]);
    c.send(&["FLUSHALL", "ASYNC"]);
    c.send(&["LOCK.ACQUIRE", "a:after", "t", "600000"]);
    c.send(&["LOCK.ACQUIRE", "b:after", "t", "600000"]);
    c.send(&["LOCK.ACQUIRE", "c:after", "t", "600000"]);
    assert_eq!(c.read(), Reply::status("OK"));
    assert_eq!(c.read(), Reply::status("OK"));
    for _ in 0..3 {
        assert!(c.read().is_int());
    }
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    // lock_held lags while the flushed values are freed on the lazy-free thread.
    wait_for("the lines and lock_held to settle", || {
        let lines = lines_of(&server);
        (by_namespace(&lines, "held") == expect(&[("a", 1), ("b", 1), ("default", 1)])
            && server.info_int("lock_held") == 3)
            .then_some(())
    });
}

/// README: "When the policy changes, a lock granted, changed or renamed from then on counts in
/// its new namespace at once". A shared lock on `a:s1` (namespace `a`) gains a holder, and a
/// lock on `a:s2` is renewed, right after a change that puts every `a:s` key in namespace `c`
/// (the longer prefix): both changed, so both count in `c`. A change of a lock already in
/// the ages only moves its grant time (`Ages::set`), never its space.
#[test]
fn a_lock_changed_after_a_policy_change_counts_in_its_new_namespace_at_once() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    let r = acquire_with(&mut c, "a:s1", "t1", 60_000, &["SHARED"]);
    assert!(r.is_int(), "{r:?}");
    acquire(&mut c, "a:s2", "t", 60_000);
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    for command in [
        &[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "a prefix=a:; c prefix=a:s",
        ][..],
        &["LOCK.ACQUIRE", "a:s1", "t2", "60000", "SHARED"],
        &["LOCK.RENEW", "a:s2", "t", "60000"],
        &["INFO", "lock"],
    ] {
        assert_eq!(c.call(command), Reply::status("QUEUED"));
    }
    let Reply::Array(replies) = c.call(&["EXEC"]) else {
        panic!("EXEC")
    };
    assert_eq!(replies[0], Reply::status("OK"));
    assert!(replies[1].is_int(), "{replies:?}");
    assert_eq!(replies[2], Reply::Int(1));
    let lines = namespace_lines(&replies[3].text());
    assert_eq!(
        by_namespace(&lines, "held"),
        expect(&[("a", 0), ("c", 2), ("default", 0)]),
        "{lines:?}"
    );
}

/// The walk that moves held locks to their new namespaces scans one database after another by
/// index; SWAPDB in the middle of it puts the part of a database it had not reached yet under
/// an index it has already passed. No key is renamed, so nothing else moves those locks: they
/// stay in their old place for good (here shown under `b`, a namespace without any key; with
/// the positions fixed they would still sit in the old namespace until the next change).
#[test]
fn a_swapdb_during_the_walk_leaves_no_lock_in_its_old_place() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    assert_eq!(c.call(&["SELECT", "1"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["DEBUG", "POPULATE", "400000", "filler"]),
        Reply::status("OK")
    );
    const LOCKS: i64 = 4_000;
    for i in 0..LOCKS {
        c.send(&["LOCK.ACQUIRE", &format!("a:{i}"), "t", "600000"]);
    }
    for _ in 0..LOCKS {
        assert!(c.read().is_int());
    }
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b prefix=b:; x prefix=a:"
        ]),
        Reply::status("OK")
    );
    // (The locks move from a to x: since namespaces keep their spaces by name, a policy that
    // only reorders them moves no lock at all.)
    // Part of db 1 walked, part not: then the two databases trade places.
    let mut info = server.conn();
    wait_for("the walk to be under way in db 1", || {
        let lines = namespace_lines(&info.call(&["INFO", "lock"]).text());
        let held = by_namespace(&lines, "held");
        (held["x"] > 0 && held["x"] < LOCKS).then_some(())
    });
    assert_eq!(c.call(&["SWAPDB", "0", "1"]), Reply::status("OK"));
    // The walk of 400,000 keys takes well under a second; give it PATIENCE.
    let started = std::time::Instant::now();
    let want = expect(&[("x", LOCKS), ("b", 0), ("default", 0)]);
    let mut held = by_namespace(&lines_of(&server), "held");
    while held != want && started.elapsed() < PATIENCE {
        sleep(Duration::from_millis(20));
        held = by_namespace(&lines_of(&server), "held");
    }
    assert_eq!(held, want, "{:?} after the SWAPDB", started.elapsed());
    assert_eq!(server.info_int("lock_held"), LOCKS);
}

/// The ages keep each namespace's held locks in grant-time order, with a "small ordered set
/// aside" for the rare lock far out of order (src/lock/ages.rs). The walk after a policy change
/// relinks every held lock into its new list in keyspace order, which is no time order, so
/// nearly every one goes to the set aside: each held lock then costs a B-tree entry more, for
/// as long as it is held (measured: +27 B a lock, about 9% of the README's 289 B). A policy
/// change should not make every held lock dearer.
#[test]
fn a_policy_change_does_not_make_every_held_lock_take_more_memory() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    const LOCKS: i64 = 100_000;
    for start in (0..LOCKS).step_by(1_000) {
        for i in start..start + 1_000 {
            c.send(&["LOCK.ACQUIRE", &format!("a:{i}"), "t", "600000"]);
        }
        for _ in 0..1_000 {
            assert!(c.read().is_int());
        }
    }
    let before = server.info_int("used_memory");
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b prefix=b:; a prefix=a:"
        ]),
        Reply::status("OK")
    );
    wait_for("the walk to move every lock", || {
        let held = by_namespace(&lines_of(&server), "held");
        (held == expect(&[("a", LOCKS), ("b", 0), ("default", 0)])).then_some(())
    });
    let grown = (server.info_int("used_memory") - before) / LOCKS;
    assert!(
        grown < 4,
        "each held lock takes {grown} B more after a policy change"
    );
}
