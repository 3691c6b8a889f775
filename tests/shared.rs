//! Shared (read/write) locks and semaphores: `LOCK.ACQUIRE ... SHARED` and `... LIMIT n`. Each
//! shared or permit holder has its own token, lease and fence; one FIFO queue of mixed requests
//! serves the run of shared requests at its head together; the exclusive holder may downgrade,
//! nobody upgrades; everything persists and replicates as exclusive locks do.

mod common;

use common::*;

fn shared(c: &mut Conn, key: &str, token: &str, ttl: u64) -> i64 {
    match acquire_with(c, key, token, ttl, &["SHARED"]) {
        Reply::Int(fence) => fence,
        other => panic!("SHARED {key} {token}: {other:?}"),
    }
}

fn permit(c: &mut Conn, key: &str, token: &str, ttl: u64, limit: u32) -> Reply {
    acquire_with(c, key, token, ttl, &["LIMIT", &limit.to_string()])
}

/// A primary and its replica, linked.
fn primary_and_replica() -> (Server, Server) {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    (primary, replica)
}

fn int_field(c: &mut Conn, key: &str, field: &str) -> i64 {
    lock_field(c, key, field).int()
}

/// Queues `LOCK.ACQUIRE key token ttl WAIT 10000 extra...` on a new connection, blocked.
fn queue(server: &Server, key: &str, token: &str, extra: &[&str]) -> Conn {
    let before = blocked(server);
    let mut conn = server.conn();
    let mut call = vec!["LOCK.ACQUIRE", key, token, "60000", "WAIT", "10000"];
    call.extend_from_slice(extra);
    conn.send(&call);
    wait_blocked(server, before + 1);
    conn
}

const UPGRADE: &str = "ERR this token holds the lock shared: an upgrade to exclusive is \
     refused, as two upgrades would wait for each other forever; release it and acquire again";
const NOT_SEMAPHORE: &str = "ERR the lock is held as a lock, not a semaphore: LIMIT does not apply";

fn semaphore_of(limit: u32) -> String {
    format!("ERR the key is a semaphore of {limit} permits: acquire it with LIMIT {limit}")
}

#[test]
fn shared_holders_each_have_a_token_a_lease_and_a_larger_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let r1 = shared(&mut c, "rw", "r1", 60_000);
    let r2 = shared(&mut c, "rw", "r2", 30_000);
    assert!(r2 > r1);
    // An exclusive request waits for every holder.
    assert_eq!(acquire_with(&mut c, "rw", "w", 1000, &[]), Reply::Nil);
    for fence in [r1, r2] {
        assert_eq!(
            c.call(&["LOCK.FENCE", "rw", &fence.to_string()]),
            Reply::Int(1)
        );
    }
    assert_eq!(
        c.call(&["LOCK.FENCE", "rw", &(r2 + 1).to_string()]),
        Reply::Int(0)
    );
    assert_eq!(int_field(&mut c, "rw", "holders"), 2);
    assert_eq!(lock_field(&mut c, "rw", "mode"), Reply::status("shared"));
    assert_eq!(int_field(&mut c, "rw", "fence"), r2);
    // The nearest deadline: r2's.
    let ttl = int_field(&mut c, "rw", "ttl");
    assert!((29_000..=30_000).contains(&ttl), "{ttl}");
    // RENEW and RELEASE by token, each for its own hold only.
    assert_eq!(c.call(&["LOCK.RENEW", "rw", "r2", "90000"]), Reply::Int(1));
    let ttl = int_field(&mut c, "rw", "ttl");
    assert!((59_000..=60_000).contains(&ttl), "{ttl}");
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "nobody"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r1"]), Reply::Int(1));
    assert_eq!(
        c.call(&["LOCK.FENCE", "rw", &r1.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(state_of(&mut c, "rw"), "held");
    // REENTRANT counts holds per holder.
    let r3 = acquire_with(&mut c, "rw", "r3", 60_000, &["SHARED", "REENTRANT"]).int();
    assert_eq!(
        acquire_with(&mut c, "rw", "r3", 60_000, &["SHARED", "REENTRANT"]),
        Reply::Int(r3)
    );
    assert_eq!(int_field(&mut c, "rw", "holds"), 3);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r3"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r3"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r2"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "rw"), "free");
    assert_eq!(lock_field(&mut c, "rw", "mode"), Reply::status("none"));
    let w = acquire(&mut c, "rw", "w", 1000);
    assert!(w > r3);
    assert_eq!(
        acquire_with(&mut c, "rw", "r4", 1000, &["SHARED"]),
        Reply::Nil
    );
    assert_eq!(server.info_int("lock_shared_grants"), 3);
    assert_eq!(server.info_int("lock_acquired"), 5);
}

#[test]
fn a_shared_session_hold_ends_with_its_connection_only() {
    let server = Server::start();
    let mut c = server.conn();
    let mut owner = server.conn();
    acquire_with(&mut owner, "rw", "s", 60_000, &["SHARED", "SESSION"]).int();
    shared(&mut c, "rw", "other", 60_000);
    assert_eq!(int_field(&mut c, "rw", "session"), 1);
    drop(owner);
    wait_for("the session hold to end", || {
        (int_field(&mut c, "rw", "holders") == 1).then_some(())
    });
    assert_eq!(int_field(&mut c, "rw", "session"), 0);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "other"]), Reply::Int(1));
    assert_eq!(server.info_int("lock_session_released"), 1);
}

#[test]
fn continuous_readers_cannot_starve_a_writer() {
    let server = Server::start();
    let mut c = server.conn();
    shared(&mut c, "rw", "r0", 60_000);
    let mut writer = queue(&server, "rw", "w", &[]);
    assert_eq!(int_field(&mut c, "rw", "waiters_exclusive"), 1);
    // Readers keep coming while the writer waits: none overtakes it, with or without WAIT.
    let mut late = Vec::new();
    for n in 0..5 {
        let token = format!("late{n}");
        assert_eq!(
            acquire_with(&mut c, "rw", &token, 60_000, &["SHARED"]),
            Reply::Nil
        );
        late.push(queue(&server, "rw", &token, &["SHARED"]));
    }
    assert_eq!(int_field(&mut c, "rw", "waiters_shared"), 5);
    assert_eq!(int_field(&mut c, "rw", "holders"), 1);
    // The last holder leaves: the writer is next, whatever queued behind it.
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r0"]), Reply::Int(1));
    let w = granted(&mut writer);
    assert_eq!(lock_field(&mut c, "rw", "mode"), Reply::status("exclusive"));
    // Then every reader queued behind it, together.
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "w"]), Reply::Int(1));
    let mut fences: Vec<i64> = late.iter_mut().map(granted).collect();
    assert!(fences.iter().all(|f| *f > w));
    let sorted = {
        let mut s = fences.clone();
        s.sort_unstable();
        s
    };
    assert_eq!(fences, sorted, "granted in arrival order");
    fences.dedup();
    assert_eq!(fences.len(), 5);
    assert_eq!(int_field(&mut c, "rw", "holders"), 5);
    assert_eq!(blocked(&server), 0);
}

#[test]
fn writers_cannot_starve_readers() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "rw", "w0", 60_000);
    let mut r1 = queue(&server, "rw", "r1", &["SHARED"]);
    let mut w1 = queue(&server, "rw", "w1", &[]);
    let mut r2 = queue(&server, "rw", "r2", &["SHARED"]);
    let mut r3 = queue(&server, "rw", "r3", &["SHARED"]);
    assert_eq!(int_field(&mut c, "rw", "waiters_exclusive"), 1);
    assert_eq!(int_field(&mut c, "rw", "waiters_shared"), 3);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "w0"]), Reply::Int(1));
    // The reader queued before the second writer goes first, alone.
    granted(&mut r1);
    assert_eq!(int_field(&mut c, "rw", "holders"), 1);
    assert_eq!(blocked(&server), 3);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r1"]), Reply::Int(1));
    granted(&mut w1);
    assert_eq!(blocked(&server), 2);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "w1"]), Reply::Int(1));
    granted(&mut r2);
    granted(&mut r3);
    assert_eq!(int_field(&mut c, "rw", "holders"), 2);
    assert_eq!(server.info_int("lock_shared_grants"), 3);
}

#[test]
fn the_writer_downgrades_without_a_free_moment_and_readers_behind_it_get_in() {
    let server = Server::start_with(Config::default().with("notify-keyspace-events", "Kd"));
    let mut c = server.conn();
    let w = acquire(&mut c, "rw", "w", 60_000);
    let mut reader = queue(&server, "rw", "r", &["SHARED"]);
    let mut sub = subscribe_keyspace(&server, "rw");
    assert_eq!(
        acquire_with(&mut c, "rw", "w", 60_000, &["SHARED"]),
        Reply::Int(w)
    );
    assert_eq!(next_event(&mut sub), "lock.downgrade");
    let r = granted(&mut reader);
    assert!(r > w);
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(lock_field(&mut c, "rw", "mode"), Reply::status("shared"));
    assert_eq!(int_field(&mut c, "rw", "holders"), 2);
    assert_eq!(c.call(&["LOCK.FENCE", "rw", &w.to_string()]), Reply::Int(1));
    // A REENTRANT hold keeps its count when it turns shared (and a REENTRANT downgrade adds one).
    for (reentrant, holds) in [(false, 2), (true, 3)] {
        let key = format!("counted-{reentrant}");
        let f = acquire(&mut c, &key, "w", 60_000);
        let again = acquire_with(&mut c, &key, "w", 60_000, &["REENTRANT"]);
        assert_eq!(again, Reply::Int(f));
        let mut shared = vec!["SHARED"];
        if reentrant {
            shared.push("REENTRANT");
        }
        assert_eq!(
            acquire_with(&mut c, &key, "w", 60_000, &shared),
            Reply::Int(f)
        );
        assert_eq!(lock_field(&mut c, &key, "mode"), Reply::status("shared"));
        assert_eq!(int_field(&mut c, &key, "holds"), holds, "{key}");
    }
    // Upgrades are refused outright, with or without WAIT, and change nothing.
    let before = lock_info(&mut c, "rw");
    for extra in [&[][..], &["WAIT", "1000"]] {
        assert_eq!(
            acquire_with(&mut c, "rw", "r", 60_000, extra),
            Reply::error(UPGRADE)
        );
    }
    assert_eq!(blocked(&server), 0);
    assert_eq!(
        acquire_with(&mut c, "rw", "w", 60_000, &[]),
        Reply::error(UPGRADE)
    );
    let after = lock_info(&mut c, "rw");
    assert_eq!(
        before.map(|i| i
            .into_iter()
            .filter(|(k, _)| k != "ttl")
            .collect::<Vec<_>>()),
        after.map(|i| i
            .into_iter()
            .filter(|(k, _)| k != "ttl")
            .collect::<Vec<_>>())
    );
}

#[test]
fn a_semaphore_grants_its_permits_and_a_lapsed_permit_goes_to_the_next_waiter() {
    let server = Server::start_with(Config::default().with("notify-keyspace-events", "Kd"));
    let mut c = server.conn();
    let mut fences = Vec::new();
    for token in ["p1", "p2"] {
        fences.push(permit(&mut c, "sem", token, 60_000, 3).int());
    }
    fences.push(permit(&mut c, "sem", "p3", 150, 3).int());
    assert!(fences.windows(2).all(|f| f[0] < f[1]));
    assert_eq!(permit(&mut c, "sem", "p4", 60_000, 3), Reply::Nil);
    assert_eq!(
        lock_field(&mut c, "sem", "mode"),
        Reply::status("semaphore")
    );
    assert_eq!(int_field(&mut c, "sem", "limit"), 3);
    assert_eq!(int_field(&mut c, "sem", "holders"), 3);
    let mut sub = subscribe_keyspace(&server, "sem");
    let mut waiter = queue(&server, "sem", "p4", &["LIMIT", "3"]);
    assert_eq!(int_field(&mut c, "sem", "waiters_shared"), 1);
    // p3's lease runs out by itself: its permit goes to the waiter, with a larger fence.
    let p4 = granted(&mut waiter);
    assert!(p4 > fences[2]);
    assert_eq!(next_event(&mut sub), "lock.expired");
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(
        c.call(&["LOCK.FENCE", "sem", &fences[2].to_string()]),
        Reply::Int(0)
    );
    assert_eq!(int_field(&mut c, "sem", "holders"), 3);
    // A release frees one permit too.
    assert_eq!(c.call(&["LOCK.RELEASE", "sem", "p1"]), Reply::Int(1));
    assert!(permit(&mut c, "sem", "p5", 60_000, 3).int() > p4);
    assert_eq!(server.info_int("lock_permit_grants"), 5);
    assert_eq!(server.info_int("lock_expired"), 1);
}

#[test]
fn a_limit_that_disagrees_or_a_mode_that_does_not_fit_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    permit(&mut c, "sem", "p1", 60_000, 2).int();
    acquire(&mut c, "lock", "w", 60_000);
    shared(&mut c, "rw", "r", 60_000);
    let snapshot = |c: &mut Conn| {
        ["sem", "lock", "rw"].map(|k| {
            lock_info(c, k).map(|i| {
                i.into_iter()
                    .filter(|(f, _)| f != "ttl")
                    .collect::<Vec<_>>()
            })
        })
    };
    let before = snapshot(&mut c);
    let refusals: [(&str, &str, &[&str], String); 9] = [
        ("sem", "p2", &["LIMIT", "3"], semaphore_of(2)),
        ("sem", "p1", &["LIMIT", "1"], semaphore_of(2)),
        ("sem", "p2", &[], semaphore_of(2)),
        ("sem", "p2", &["SHARED"], semaphore_of(2)),
        ("sem", "p2", &["LIMIT", "3", "WAIT", "100"], semaphore_of(2)),
        ("lock", "x", &["LIMIT", "2"], NOT_SEMAPHORE.into()),
        ("lock", "w", &["LIMIT", "2"], NOT_SEMAPHORE.into()),
        ("rw", "x", &["LIMIT", "2"], NOT_SEMAPHORE.into()),
        (
            "rw",
            "x",
            &["SHARED", "LOCKDELAY", "10"],
            "ERR option LOCKDELAY applies to exclusive holds only, not SHARED or LIMIT".into(),
        ),
    ];
    for (key, token, extra, error) in refusals {
        assert_eq!(
            acquire_with(&mut c, key, token, 60_000, extra),
            Reply::error(&error),
            "{key} {token} {extra:?}"
        );
    }
    for (extra, error) in [
        (
            &["LIMIT", "0"][..],
            "ERR invalid limit: must be between 1 and 10000",
        ),
        (
            &["LIMIT", "10001"],
            "ERR invalid limit: must be between 1 and 10000",
        ),
        (&["LIMIT", "x"], "ERR invalid limit: not an integer"),
        (&["LIMIT"], "ERR invalid limit: missing after LIMIT"),
        (
            &["LIMIT", "2", "LIMIT", "2"],
            "ERR option LIMIT given more than once",
        ),
        (
            &["SHARED", "SHARED"],
            "ERR option SHARED given more than once",
        ),
    ] {
        assert_eq!(
            acquire_with(&mut c, "new", "t", 1000, extra),
            Reply::error(error)
        );
    }
    assert_eq!(c.call(&["EXISTS", "new"]), Reply::Int(0));
    assert_eq!(snapshot(&mut c), before);
    assert_eq!(blocked(&server), 0);
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "1", "x", "t", "1000", "SHARED"]),
        Reply::error("ERR option SHARED is not supported by LOCK.MACQUIRE")
    );
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "2", "x", "sem", "t", "1000"]),
        Reply::error(&semaphore_of(2))
    );
    assert_eq!(c.call(&["EXISTS", "x"]), Reply::Int(0));
    // Once freed (and before it is reclaimed) a plain lock may become a semaphore.
    assert_eq!(c.call(&["LOCK.RELEASE", "lock", "w"]), Reply::Int(1));
    assert!(permit(&mut c, "lock", "p", 1000, 4).is_int());
    assert_eq!(int_field(&mut c, "lock", "limit"), 4);
}

#[test]
fn forcerelease_frees_every_holder_and_a_semaphore_keeps_its_limit() {
    let server = Server::start();
    let mut c = server.conn();
    for token in ["a", "b"] {
        shared(&mut c, "rw", token, 60_000);
        permit(&mut c, "sem", token, 60_000, 5).int();
    }
    let mut writer = queue(&server, "rw", "w", &[]);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "rw"]), Reply::Int(1));
    granted(&mut writer);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "sem"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "sem"), "free");
    assert_eq!(int_field(&mut c, "sem", "holders"), 0);
    assert_eq!(int_field(&mut c, "sem", "limit"), 5);
    assert_eq!(
        acquire_with(&mut c, "sem", "x", 1000, &[]),
        Reply::error(&semaphore_of(5))
    );
    assert_eq!(server.info_int("lock_forced"), 2);
}

#[test]
fn lock_wait_waits_for_every_current_holder() {
    let server = Server::start();
    let mut c = server.conn();
    shared(&mut c, "rw", "a", 60_000);
    shared(&mut c, "rw", "b", 60_000);
    let mut watcher = server.conn();
    watcher.send(&["LOCK.WAIT", "rw", "10000"]);
    wait_blocked(&server, 1);
    // A newcomer does not extend the wait; the holders it waited for do.
    shared(&mut c, "rw", "c", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "a"]), Reply::Int(1));
    assert_eq!(blocked(&server), 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "b"]), Reply::Int(1));
    assert_eq!(watcher.read(), Reply::Int(1));
    assert_eq!(state_of(&mut c, "rw"), "held");
}

/// The holders' fields LOCK.INFO shows, without the ttl (which moves).
fn shape(c: &mut Conn, key: &str) -> Vec<(String, Reply)> {
    lock_info(c, key)
        .unwrap_or_else(|| panic!("{key} is missing"))
        .into_iter()
        .filter(|(field, _)| field != "ttl")
        .collect()
}

#[test]
fn shared_holders_and_permits_survive_reload_restore_and_copy() {
    let mut server = Server::start();
    let mut c = server.conn();
    let a = shared(&mut c, "rw", "a", 600_000);
    shared(&mut c, "rw", "b", 600_000);
    permit(&mut c, "sem", "p", 600_000, 3).int();
    let rw = shape(&mut c, "rw");
    let sem = shape(&mut c, "sem");
    let digests = (digest_value(&mut c, "rw"), digest_value(&mut c, "sem"));
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(shape(&mut c, "rw"), rw);
    assert_eq!(shape(&mut c, "sem"), sem);
    assert_eq!(
        (digest_value(&mut c, "rw"), digest_value(&mut c, "sem")),
        digests
    );
    assert_eq!(c.call(&["LOCK.FENCE", "rw", &a.to_string()]), Reply::Int(1));
    let dump = c.call(&["DUMP", "sem"]);
    let Reply::Bulk(payload) = &dump else {
        panic!("DUMP: {dump:?}")
    };
    assert_eq!(restore(&mut c, "sem2", payload), Reply::status("OK"));
    assert_eq!(shape(&mut c, "sem2"), sem);
    assert_eq!(c.call(&["COPY", "rw", "rw2"]), Reply::Int(1));
    assert_eq!(shape(&mut c, "rw2"), rw);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw2", "a"]), Reply::Int(1));
    assert_eq!(int_field(&mut c, "rw", "holders"), 2);
    // A restart from the RDB file keeps them, and fences go on above them.
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_eq!(shape(&mut c, "rw"), rw);
    assert!(permit(&mut c, "sem", "q", 1000, 3).int() > a);
    // Deleted, the key's fences still go on above its last one (the fence floor).
    let last = int_field(&mut c, "sem", "fence");
    assert_eq!(c.call(&["DEL", "sem"]), Reply::Int(1));
    assert!(permit(&mut c, "sem", "r", 1000, 3).int() > last);
}

#[test]
fn a_version_2_lock_still_loads() {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let deadline = now_ms() + 600_000;
    let payload =
        format.payload_of_version(2, &held_fields_of_token(1 << 40, b"old", deadline, 1, 0));
    assert_eq!(restore(&mut c, "old", &payload), Reply::status("OK"));
    assert_eq!(
        lock_field(&mut c, "old", "mode"),
        Reply::status("exclusive")
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "old", "old"]), Reply::Int(1));
}

#[test]
fn shared_holds_and_permits_replicate_with_equal_digests_and_expire_on_the_replica_too() {
    let (primary, replica) = primary_and_replica();
    let mut p = primary.conn();
    let w = acquire(&mut p, "rw", "w", 60_000);
    assert_eq!(
        acquire_with(&mut p, "rw", "w", 60_000, &["SHARED"]),
        Reply::Int(w)
    );
    shared(&mut p, "rw", "r", 60_000);
    permit(&mut p, "sem", "p1", 60_000, 2).int();
    permit(&mut p, "sem", "p2", 200, 2).int();
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    for key in ["rw", "sem"] {
        assert_eq!(shape(&mut p, key), shape(&mut r, key), "{key}");
        assert_eq!(
            digest_value(&mut p, key),
            digest_value(&mut r, key),
            "{key}"
        );
    }
    assert_eq!(replica.info_int("lock_shared_grants"), 1);
    assert_eq!(replica.info_int("lock_permit_grants"), 2);
    // p2's lease ends on the primary (expired by it, not only past its deadline); the replica
    // follows.
    wait_for("p2 to expire", || {
        (primary.info_int("lock_expired") == 1).then_some(())
    });
    assert_eq!(int_field(&mut p, "sem", "holders"), 1);
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(int_field(&mut r, "sem", "holders"), 1);
    assert_eq!(digest_value(&mut p, "sem"), digest_value(&mut r, "sem"));
    assert_eq!(p.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
    assert_eq!(replica.info_int("lock_expired"), 1);
}

#[test]
fn an_aof_rewrite_restates_shared_holders_and_semaphores() {
    let mut server = Server::start_with(Config::default().with("appendonly", "yes"));
    let mut c = server.conn();
    shared(&mut c, "rw", "a", 600_000);
    shared(&mut c, "rw", "b", 600_000);
    permit(&mut c, "sem", "p", 600_000, 7).int();
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "sem"]), Reply::Int(1));
    let rw = shape(&mut c, "rw");
    let sem = shape(&mut c, "sem");
    assert!(c.call(&["BGREWRITEAOF"]).text().contains("rewriting"));
    wait_for("the AOF rewrite", || {
        (server
            .info_field("persistence", "aof_rewrite_in_progress")
            .as_deref()
            == Some("0"))
        .then_some(())
    });
    // After the rewrite, effects of one holder each, of every length, are appended and replayed.
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "a"]), Reply::Int(1));
    shared(&mut c, "rw", "c", 600_000);
    shared(&mut c, "rw", "d", 600_000);
    assert_eq!(c.call(&["LOCK.RENEW", "rw", "b", "700000"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "d"]), Reply::Int(1));
    shared(&mut c, "rw", "e", 600_000);
    let rw_after = shape(&mut c, "rw");
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_ne!(rw, rw_after);
    assert_eq!(shape(&mut c, "rw"), rw_after);
    assert_eq!(shape(&mut c, "sem"), sem);
}

#[test]
fn every_shared_lease_expires_by_itself_with_its_own_event() {
    let server = Server::start_with(Config::default().with("notify-keyspace-events", "Kd"));
    let mut c = server.conn();
    let mut sub = subscribe_keyspace(&server, "rw");
    for (token, ttl) in [("a", 60), ("b", 120), ("c", 180)] {
        shared(&mut c, "rw", token, ttl);
        assert_eq!(next_event(&mut sub), "lock.acquire");
    }
    for _ in 0..3 {
        assert_eq!(next_event(&mut sub), "lock.expired");
    }
    assert_eq!(state_of(&mut c, "rw"), "free");
    assert_eq!(int_field(&mut c, "rw", "holders"), 0);
    assert_eq!(server.info_int("lock_expired"), 3);
    assert_eq!(server.info_int("lock_held"), 0);
}

#[test]
fn max_waiters_bounds_a_mixed_queue() {
    let server = Server::start_with(Config::default().with("lock.max-waiters", "2"));
    let mut c = server.conn();
    acquire(&mut c, "rw", "w", 60_000);
    let _reader = queue(&server, "rw", "r1", &["SHARED"]);
    let _writer = queue(&server, "rw", "w2", &[]);
    assert_eq!(
        acquire_with(&mut c, "rw", "r2", 60_000, &["SHARED", "WAIT", "1000"]),
        Reply::error("ERR too many waiters on this lock (lock.max-waiters is 2)")
    );
    assert_eq!(int_field(&mut c, "rw", "waiters"), 2);
}

#[test]
fn a_holders_change_replicates_alone_however_many_hold_beside_it() {
    let primary = Server::start();
    let mut p = primary.conn();
    for n in 0..200 {
        permit(&mut p, "sem", &format!("p{n}"), 600_000, 1000).int();
        shared(&mut p, "rw", &format!("r{n}"), 600_000);
    }
    let mut tap = ReplicationTap::attach(&primary);
    let new = permit(&mut p, "sem", "late", 600_000, 1000).int();
    assert_eq!(p.call(&["LOCK.RENEW", "rw", "r7", "900000"]), Reply::Int(1));
    assert_eq!(p.call(&["LOCK.RELEASE", "rw", "r9"]), Reply::Int(1));
    assert_eq!(p.call(&["ECHO", "end"]), Reply::bulk("end"));
    p.call(&["SET", "marker", "1"]);
    let effects: Vec<Vec<String>> = tap
        .commands_until("SET")
        .into_iter()
        .filter(|c| c[0] == "LOCK.APPLY")
        .collect();
    assert_eq!(effects.len(), 3, "{effects:?}");
    // State, then the member's state, token digest and who holds it (`addr name label`), or
    // (gone) its token digest alone.
    assert_eq!(effects[0].len(), 6, "{:?}", effects[0]);
    assert!(
        effects[0][2].starts_with(&format!("acquire:{new}:")),
        "{:?}",
        effects[0]
    );
    assert!(
        effects[0][3].starts_with(&format!("{new}:")),
        "{:?}",
        effects[0]
    );
    assert_eq!(effects[0][4], token_digest_text("late"));
    let (addr, _) = p
        .call(&["CLIENT", "INFO"])
        .text()
        .split(' ')
        .find_map(|f| f.strip_prefix("addr="))
        .map(|a| (a.to_string(), ()))
        .unwrap();
    assert_eq!(effects[0][5], format!("{addr}  "));
    assert_eq!(effects[1].len(), 6);
    assert_eq!(effects[1][4], token_digest_text("r7"));
    assert_eq!(effects[1][5], format!("{addr}  "));
    assert_eq!(effects[2].len(), 4);
    assert_eq!(effects[2][3], token_digest_text("r9"));
    // A replica that follows these changes holds the same locks.
    let replica = Server::start();
    replica.replicate_from(&primary);
    assert_eq!(p.call(&["LOCK.RELEASE", "sem", "p3"]), Reply::Int(1));
    permit(&mut p, "sem", "later", 600_000, 1000).int();
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    for key in ["rw", "sem"] {
        assert_eq!(
            digest_value(&mut p, key),
            digest_value(&mut r, key),
            "{key}"
        );
    }
}

#[test]
fn readers_behind_a_writer_that_gives_up_get_in_at_once() {
    let server = Server::start();
    let mut c = server.conn();
    shared(&mut c, "rw", "r1", 60_000);
    // The writer at the head leaves by its timeout, then one by closing its connection.
    for leaves_by_timeout in [true, false] {
        let mut writer = server.conn();
        let timeout = if leaves_by_timeout { "300" } else { "0" };
        let before = blocked(&server);
        writer.send(&["LOCK.ACQUIRE", "rw", "w", "60000", "WAIT", timeout]);
        wait_blocked(&server, before + 1);
        let mut reader = queue(&server, "rw", "r2", &["SHARED"]);
        if leaves_by_timeout {
            assert_eq!(writer.read(), Reply::Nil);
        } else {
            drop(writer);
        }
        let r2 = granted(&mut reader);
        assert!(r2 > 0);
        assert_eq!(int_field(&mut c, "rw", "holders"), 2);
        assert_eq!(c.call(&["LOCK.RELEASE", "rw", "r2"]), Reply::Int(1));
    }
}

#[test]
fn a_queued_holder_refreshed_at_its_turn_is_replicated_and_expires_on_time() {
    let (primary, replica) = primary_and_replica();
    let mut p = primary.conn();
    acquire(&mut p, "rw", "w", 60_000);
    let mut first = queue(&primary, "rw", "t", &["SHARED"]);
    let mut again = server_queue_with_ttl(&primary, "rw", "t", 1500, &["SHARED", "REENTRANT"]);
    assert_eq!(p.call(&["LOCK.RELEASE", "rw", "w"]), Reply::Int(1));
    let fence = granted(&mut first);
    assert_eq!(granted(&mut again), fence);
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(int_field(&mut r, "rw", "holds"), 2);
    assert_eq!(digest_value(&mut p, "rw"), digest_value(&mut r, "rw"));
    // The refreshed lease (1.5 s, not 60 s) is the one that ends, by itself.
    wait_for("the refreshed lease to end", || {
        (state_of(&mut p, "rw") == "free").then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(state_of(&mut r, "rw"), "free");
    assert_eq!(primary.info_int("lock_expired"), 1);
    assert_eq!(
        primary.info_int("lock_acquired"),
        replica.info_int("lock_acquired")
    );
}

/// Like `queue`, with the lease length given.
fn server_queue_with_ttl(
    server: &Server,
    key: &str,
    token: &str,
    ttl: u64,
    extra: &[&str],
) -> Conn {
    let before = blocked(server);
    let mut conn = server.conn();
    let ttl = ttl.to_string();
    let mut call = vec!["LOCK.ACQUIRE", key, token, &ttl, "WAIT", "10000"];
    call.extend_from_slice(extra);
    conn.send(&call);
    wait_blocked(server, before + 1);
    conn
}

#[test]
fn a_sync_reader_granted_later_lets_the_readers_behind_it_in() {
    let (primary, _replica) = primary_and_replica();
    let mut p = primary.conn();
    acquire(&mut p, "rw", "w", 60_000);
    let mut synced = queue(&primary, "rw", "r1", &["SHARED", "SYNC", "1", "2000"]);
    let mut plain = queue(&primary, "rw", "r2", &["SHARED"]);
    assert_eq!(p.call(&["LOCK.RELEASE", "rw", "w"]), Reply::Int(1));
    let r1 = granted(&mut synced);
    let r2 = granted(&mut plain);
    assert!(r2 > r1);
    assert_eq!(int_field(&mut p, "rw", "holders"), 2);
}

#[test]
fn a_downgrade_counts_alike_on_the_replica() {
    let (primary, replica) = primary_and_replica();
    let mut p = primary.conn();
    let w = acquire(&mut p, "rw", "w", 60_000);
    assert_eq!(
        acquire_with(&mut p, "rw", "w", 60_000, &["SHARED"]),
        Reply::Int(w)
    );
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(primary.info_int("lock_acquired"), 2);
    assert_eq!(replica.info_int("lock_acquired"), 2);
}
