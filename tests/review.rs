//! What the independent review of issue 33's change found (each test failed on the change as it
//! was reviewed): a replica announces a batch expiry once per holder as its primary does; a
//! closed connection's sessions end key by key as the session table says then (another
//! connection's claim, a RENAME meanwhile); sessions and session holders of one key cost O(1)
//! each however many a key has; a miscounted MACQUIRE or an ACQUIRE without its key shows its
//! token nowhere.

mod common;

use common::*;

/// A RESTORE payload of one shared lock with `n` holders (tokens `t1`..`tn`) whose leases all
/// end at `deadline`.
fn shared_payload(format: &LockDumpFormat, n: u64, deadline: u64) -> Vec<u8> {
    let base = deadline << 11;
    let mut fields = rdb_uint(base + n);
    fields.extend(rdb_uint(3)); // a group
    fields.extend(rdb_uint(0)); // shared: no limit
    fields.extend(rdb_uint(n));
    for i in 1..=n {
        fields.extend(rdb_uint(base + i));
        fields.extend(rdb_string(&token_digest(format!("t{i}").as_bytes())));
        fields.extend(rdb_uint(deadline));
        fields.extend(rdb_uint(1));
        fields.extend(rdb_uint(DIGEST_FLAG));
    }
    fields.push(0);
    format.payload(&fields)
}

/// A reply as text, for failure messages.
fn shown(reply: &Reply) -> String {
    match reply {
        Reply::Bulk(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Reply::Array(items) | Reply::Set(items) | Reply::Push(items) => format!(
            "[{}]",
            items.iter().map(shown).collect::<Vec<_>>().join(", ")
        ),
        other => format!("{other:?}"),
    }
}

/// Subscribes to the `lock.expired` keyevent channel and to `sentinel`.
fn subscribe_expired(server: &Server, sentinel: &str) -> Conn {
    let mut sub = server.conn();
    sub.send(&["SUBSCRIBE", "__keyevent@0__:lock.expired", sentinel]);
    for _ in 0..2 {
        let reply = sub.read();
        assert_eq!(reply.items()[0], Reply::bulk("subscribe"), "{reply:?}");
    }
    sub
}

/// The number of `lock.expired` events `sub` received before the message on `sentinel`.
fn expired_events_until(sub: &mut Conn, sentinel: &str) -> usize {
    let mut count = 0;
    loop {
        let message = sub.read();
        let items = message.items();
        assert_eq!(items[0], Reply::bulk("message"), "{message:?}");
        if items[1] == Reply::bulk(sentinel) {
            return count;
        }
        assert_eq!(items[1], Reply::bulk("__keyevent@0__:lock.expired"));
        count += 1;
    }
}

/// README, "Keyspace notifications": "For a shared lock or a semaphore each holder's grant,
/// release, renewal and expiry is its own event." The primary publishes one `lock.expired` per
/// holder of a batch expiry (effects::propagate_removed), but the replica applies the batch as
/// one `r` effect and `commands::applied` announces it once: the replica publishes one event
/// for N expired holders (before the batch it published N, one per `d` effect).
#[test]
fn a_replica_publishes_one_expired_event_per_holder_of_a_batch_expiry() {
    let config = Config::default().with("notify-keyspace-events", "Ed");
    let primary = Server::start_with(config.clone());
    let replica = Server::start_with(config);
    replica.replicate_from(&primary);
    let mut p_sub = subscribe_expired(&primary, "end-p");
    let mut r_sub = subscribe_expired(&replica, "end-r");
    let mut c = primary.conn();
    let format = LockDumpFormat::learn(&mut c);
    let payload = shared_payload(&format, 3, now_ms() + 700);
    assert_eq!(restore(&mut c, "shared", &payload), Reply::status("OK"));
    wait_for("the three holders expired on the primary", || {
        (primary.info_int("lock_expired") == 3).then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    // The replica counts them as the primary did (`times`): only the events differ.
    assert_eq!(replica.info_int("lock_expired"), 3);
    assert_eq!(c.call(&["PUBLISH", "end-p", "x"]).int(), 1);
    assert_eq!(replica.conn().call(&["PUBLISH", "end-r", "x"]).int(), 1);
    let on_primary = expired_events_until(&mut p_sub, "end-p");
    let on_replica = expired_events_until(&mut r_sub, "end-r");
    assert_eq!(on_primary, 3, "the primary publishes one event per holder");
    assert_eq!(
        on_replica, on_primary,
        "the replica publishes what its primary publishes"
    );
}

const SECRET: &str = "review-secret-token-5f1e0c9a";

/// `LOCK.MACQUIRE`'s getkeys (multi::key_positions, Shape::Acquire) declares keys as soon as an
/// integer sits where the ttl would be, without looking at the options the module then refuses.
/// A miscounted numkeys (3 for 1) with a REENTRANT the call may not have puts the token in a
/// key's place: the server checks it against the user's key patterns and ACL LOG shows it as
/// the denied key, while the module would have refused the call (REENTRANT is not for
/// LOCK.MACQUIRE) with nothing declared.
#[test]
fn a_miscounted_macquire_that_the_module_refuses_declares_no_key() {
    let server = Server::start();
    let mut admin = server.conn();
    assert_eq!(
        admin.call(&["ACL", "SETUSER", "app", "on", ">pw", "~lock:*", "+@all"]),
        Reply::status("OK")
    );
    let mut c = server.conn();
    assert_eq!(c.call(&["AUTH", "app", "pw"]), Reply::status("OK"));
    let call = [
        "LOCK.MACQUIRE",
        "3",
        "lock:a",
        SECRET,
        "30000",
        "WAIT",
        "10",
        "REENTRANT",
    ];
    // Without the ACL, the module refuses this call (admin may touch every key).
    let refused = admin.call(&call);
    assert!(
        refused.error_bytes().is_some_and(|e| e.starts_with(b"ERR")),
        "{refused:?}"
    );
    let reply = c.call(&call);
    assert!(reply.is_error(), "{reply:?}");
    let log = admin.call(&["ACL", "LOG"]);
    assert!(
        !log.contains_bytes(SECRET.as_bytes()),
        "the token is in ACL LOG as a denied key: {}",
        shown(&log)
    );
}

/// A call that forgot its key puts the token in the key's place: `LOCK.ACQUIRE <token> 30000
/// SESSION` fails (the ttl is `SESSION`), and the failed call redacts only the arguments after
/// the first (`after_the_first`), so SLOWLOG (and MONITOR, COMMANDLOG) keep the token.
#[test]
fn a_failed_acquire_that_forgot_its_key_does_not_log_the_token() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]), Reply::status("OK"));
    let reply = c.call(&["LOCK.ACQUIRE", SECRET, "30000", "SESSION"]);
    assert!(reply.is_error(), "{reply:?}");
    let log = c.call(&["SLOWLOG", "GET", "10"]);
    assert!(
        !log.contains_bytes(SECRET.as_bytes()),
        "the token in SLOWLOG: {}",
        shown(&log)
    );
}

/// CPU time (user and system) the server's main thread has used.
fn main_cpu(server: &Server) -> std::time::Duration {
    let info = server.conn().call(&["INFO", "cpu"]).text();
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO cpu {name}"))
    };
    std::time::Duration::from_secs_f64(
        field("used_cpu_user_main_thread:") + field("used_cpu_sys_main_thread:"),
    )
}

/// `owner` takes `n` shared SESSION holds of `key` (tokens `t0`..), pipelined, each with `ttl`.
fn session_readers(owner: &mut Conn, key: &str, n: usize, ttl: u64) {
    let ttl = ttl.to_string();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        for i in chunk {
            owner.send(&[
                "LOCK.ACQUIRE",
                key,
                &format!("t{i}"),
                &ttl,
                "SHARED",
                "SESSION",
            ]);
        }
        for _ in chunk {
            let reply = owner.read();
            assert!(reply.is_int(), "{reply:?}");
        }
    }
}

/// The CPU 50 LOCK.RELEASEs of shared holders cost on a key with `n` shared SESSION holders.
fn release_among_session_readers(n: usize) -> std::time::Duration {
    let server = Server::start();
    let mut owner = server.conn();
    session_readers(&mut owner, "s", n, 600_000);
    let mut c = server.conn();
    let before = main_cpu(&server);
    for i in 0..50 {
        assert_eq!(
            c.call(&["LOCK.RELEASE", "s", &format!("t{i}")]),
            Reply::Int(1)
        );
    }
    main_cpu(&server).saturating_sub(before)
}

/// README: LOCK.RELEASE is O(N) for a key with N shared holders. A release that frees a holder
/// runs `sessions::keep_only(key, |token| lock.holds(token, now))` (change::change_of), which
/// asks `Lock::holds` (a search among the N holders) for every one of the key's session holders:
/// O(N x N) per release when the holders hold with SESSION. (The same call runs in every slice
/// of the batch expiry, `change::expire_overdue_within`.)
#[test]
fn a_release_among_many_session_readers_costs_linear_time() {
    let small = release_among_session_readers(800);
    let big = release_among_session_readers(8_000);
    println!("50 releases: {small:?} with 800 session readers, {big:?} with 8000");
    let floor = small.max(std::time::Duration::from_millis(1));
    assert!(
        big <= floor * 30,
        "{small:?} for N, {big:?} for 10N: not linear"
    );
}

/// README, "What each command and background job costs": lease expiry runs in slices of 4 ms
/// (512 holders of one key at a time). With SESSION holders every slice also runs
/// `sessions::keep_only` with a `Lock::holds` search per session holder (O(N x N)): while 8000
/// shared SESSION holders expire, a PING waits far longer than a slice.
#[test]
fn expiring_many_session_readers_yields_at_the_slice() {
    let server = Server::start();
    let mut owner = server.conn();
    let n = 8_000;
    let started = std::time::Instant::now();
    session_readers(&mut owner, "s", n, 4_000);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(3_500),
        "the holders took {:?} to acquire: some expired already",
        started.elapsed()
    );
    let mut c = server.conn();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let pinger = std::thread::spawn(move || {
        let mut worst = std::time::Duration::ZERO;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let sent = std::time::Instant::now();
            assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
            worst = worst.max(sent.elapsed());
        }
        worst
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while server.info_int("lock_expired") < n as i64 {
        assert!(std::time::Instant::now() < deadline, "expiry did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let worst = pinger.join().expect("pinger");
    println!("longest PING while {n} session readers expired: {worst:?}");
    assert!(
        worst < std::time::Duration::from_millis(100),
        "a PING waited {worst:?} while one key's session holders expired"
    );
}

/// The CPU a server spends releasing the `n` shared SESSION holds of one key that a closing
/// connection owned.
fn close_with_session_readers(n: usize) -> std::time::Duration {
    let server = Server::start();
    let mut owner = server.conn();
    session_readers(&mut owner, "s", n, 600_000);
    let before = main_cpu(&server);
    drop(owner);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while server.info_int("lock_session_released") < n as i64 {
        assert!(
            std::time::Instant::now() < deadline,
            "session close did not end"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    main_cpu(&server).saturating_sub(before)
}

/// README: "a connection with session locks closing | O(1) per lock". When the locks are N
/// shared holds of one key, each `change::end_session` (deferred::end_sessions) is a search and
/// a removal among the N holders, one effect and one hand-over each: O(N) per lock, O(N^2) for
/// the close (observed: 18 ms for 800, 1.56 s for 8000), where the batch expiry of the same
/// holders is one pass (`Lock::expire_members`).
#[test]
fn closing_a_connection_with_many_session_readers_of_one_key_costs_linear_time() {
    let small = close_with_session_readers(800);
    let big = close_with_session_readers(8_000);
    println!("session close: {small:?} for 800 readers, {big:?} for 8000");
    let floor = small.max(std::time::Duration::from_millis(1));
    assert!(
        big <= floor * 30,
        "{small:?} for N, {big:?} for 10N: not linear"
    );
}

/// The session holds of a closed connection are ended later, in slices (deferred::ENDING, new
/// in this change): `sessions::disconnected` takes them all out of the session table when the
/// first slice runs, and each is released when its turn comes, turns later. A client that
/// refreshes one of those holds meanwhile with the same token and SESSION is told it holds it
/// (`sessions::claim` makes it the session's owner: "the latest session acquirer owns the
/// lock"), and then the queued end of the closed connection's session releases it behind its
/// back, while it is still connected.
#[test]
fn a_session_refreshed_while_a_closed_connections_sessions_end_is_not_released() {
    let server = Server::start();
    let mut a = server.conn();
    let keys: Vec<String> = (0..5_000).map(|k| format!("{{s}}k{k}")).collect();
    let macquire = |keys: &[String]| -> Vec<String> {
        let mut call = vec!["LOCK.MACQUIRE".to_string(), keys.len().to_string()];
        call.extend(keys.iter().cloned());
        call.extend(["T", "600000", "SESSION"].map(String::from));
        call
    };
    for chunk in keys.chunks(1000) {
        assert_eq!(a.call(&macquire(chunk)).items().len(), chunk.len());
    }
    let mut b = server.conn();
    drop(a);
    // While the 5000 sessions end, slice by slice, b takes every key again with the same token
    // and its own SESSION: each reply is a fence, so b holds all 5000.
    wait_for("the close noticed", || {
        (server.info_int("lock_session_released") > 0).then_some(())
    });
    for chunk in keys.chunks(1000) {
        let reply = b.call(&macquire(chunk));
        assert_eq!(reply.items().len(), chunk.len(), "{reply:?}");
        assert!(reply.items().iter().all(Reply::is_int), "{reply:?}");
    }
    let mut settled = -1;
    wait_for("the sessions of the closed connection all ended", || {
        let now = server.info_int("lock_session_released");
        let done = now == settled;
        settled = now;
        std::thread::sleep(std::time::Duration::from_millis(200));
        done.then_some(())
    });
    let mut c = server.conn();
    let free: Vec<&String> = keys
        .iter()
        .filter(|k| state_of(&mut c, k) != "held")
        .collect();
    assert!(
        free.is_empty(),
        "{} of the 5000 keys b was granted (b still connected) were released: {:?}...",
        free.len(),
        &free[..free.len().min(5)]
    );
    assert_eq!(b.call(&["PING"]), Reply::status("PONG"));
}

/// README: "SESSION ties the grant to the connection: when it closes, the lock is released ...
/// The session follows its key through RENAME". The sessions of a closed connection wait in
/// deferred::ENDING under their key names at the time of the close (sliced, new in this change),
/// out of the session table: a key renamed meanwhile is looked for under its old name, not
/// found, and its session hold stays until its lease ends (here 600 s).
#[test]
fn a_session_key_renamed_while_a_closed_connections_sessions_end_is_released() {
    let server = Server::start();
    let mut a = server.conn();
    let keys: Vec<String> = (0..5_000).map(|k| format!("{{s}}k{k}")).collect();
    for chunk in keys.chunks(1000) {
        let mut call = vec!["LOCK.MACQUIRE".to_string(), chunk.len().to_string()];
        call.extend(chunk.iter().cloned());
        call.extend(["T", "600000", "SESSION"].map(String::from));
        assert_eq!(a.call(&call).items().len(), chunk.len());
    }
    let mut c = server.conn();
    drop(a);
    wait_for("the close noticed", || {
        (server.info_int("lock_session_released") > 0).then_some(())
    });
    // Renamed while the sessions end: pipelined, so that they land between slices.
    for k in &keys {
        c.send(&["RENAME", k, &format!("{k}:moved")]);
    }
    let mut renamed = Vec::new();
    for k in &keys {
        if c.read() == Reply::status("OK") {
            renamed.push(format!("{k}:moved"));
        }
    }
    let mut settled = -1;
    wait_for("the sessions of the closed connection all ended", || {
        let now = server.info_int("lock_session_released");
        let done = now == settled;
        settled = now;
        std::thread::sleep(std::time::Duration::from_millis(200));
        done.then_some(())
    });
    let held: Vec<&String> = renamed
        .iter()
        .filter(|k| state_of(&mut c, k) == "held")
        .collect();
    assert!(
        held.is_empty(),
        "{} of the {} session locks renamed after their connection closed are still held: \
         {:?}... (lock_session_released {}, of 5000)",
        held.len(),
        renamed.len(),
        &held[..held.len().min(3)],
        server.info_int("lock_session_released")
    );
}
