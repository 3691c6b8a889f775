//! Operability: the `INFO lock` counters, gauges and latency summaries, the `lock.*` configs,
//! COMMAND DOCS / INFO / GETKEYS, ACL users, token redaction and the safety warnings.

mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Gauges and counters of `INFO lock`: exact after every scripted sequence.
const COUNTS: [&str; 15] = [
    "lock_held",
    "lock_waiters",
    "lock_keys",
    "lock_acquired",
    "lock_acquire_contended",
    "lock_acquire_timeouts",
    "lock_released",
    "lock_release_mismatch",
    "lock_renewed",
    "lock_renew_failed",
    "lock_expired",
    "lock_forced",
    "lock_session_released",
    "lock_fence_checks",
    "lock_fence_rejects",
];

/// Latency summaries, in µs.
const LATENCIES: [&str; 6] = [
    "lock_acquire_wait_p50_us",
    "lock_acquire_wait_p99_us",
    "lock_acquire_wait_max_us",
    "lock_hold_p50_us",
    "lock_hold_p99_us",
    "lock_hold_max_us",
];

const WARNINGS: [&str; 2] = [
    "lock_warning_eviction_policy",
    "lock_warning_no_persistence",
];

/// The public commands.
const COMMANDS: [&str; 7] = [
    "lock.acquire",
    "lock.release",
    "lock.renew",
    "lock.fence",
    "lock.wait",
    "lock.info",
    "lock.forcerelease",
];

/// A token distinctive enough that finding it anywhere means it leaked.
const TOKEN: &str = "tok-5ecr3t-7f9c2a51d0e4";

/// Every `lock_*` field of `INFO lock`.
fn lock_fields(server: &Server) -> BTreeMap<String, i64> {
    let info = server.conn().call(&["INFO", "lock"]).text();
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.starts_with("lock_").then(|| {
                let value = value
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("INFO lock field {line:?} is not an integer"));
                (name.to_string(), value)
            })
        })
        .collect()
}

/// Asserts every gauge and counter: the ones named with their value, all others 0.
fn assert_counts(server: &Server, nonzero: &[(&str, i64)]) {
    let mut expected: BTreeMap<String, i64> = COUNTS.iter().map(|n| (n.to_string(), 0)).collect();
    for (name, value) in nonzero {
        assert!(
            expected.insert(name.to_string(), *value).is_some(),
            "{name} is not a lock counter"
        );
    }
    let actual: BTreeMap<String, i64> = lock_fields(server)
        .into_iter()
        .filter(|(name, _)| COUNTS.contains(&name.as_str()))
        .collect();
    assert_eq!(actual, expected);
}

/// (lock_held, lock_waiters, lock_keys).
fn gauges(server: &Server) -> (i64, i64, i64) {
    let f = lock_fields(server);
    (f["lock_held"], f["lock_waiters"], f["lock_keys"])
}

fn error_text(reply: &Reply) -> &str {
    match reply {
        Reply::Error(text) => text,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A flat field/value array (RESP2) or a map (RESP3) as a map keyed by field name.
fn fields_of(reply: &Reply) -> BTreeMap<String, Reply> {
    match reply {
        Reply::Map(pairs) => pairs.iter().map(|(k, v)| (k.text(), v.clone())).collect(),
        other => other
            .items()
            .chunks(2)
            .map(|pair| (pair[0].text(), pair[1].clone()))
            .collect(),
    }
}

fn texts(reply: &Reply) -> Vec<String> {
    reply.items().iter().map(Reply::text).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. INFO lock counters after scripted sequences

#[test]
fn info_lock_has_every_field_at_zero_and_is_part_of_modules_and_everything() {
    let server = Server::start();
    let fields = lock_fields(&server);
    let names: BTreeSet<&str> = fields.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = COUNTS
        .iter()
        .chain(&LATENCIES)
        .chain(&WARNINGS)
        .copied()
        .collect();
    assert_eq!(names, expected);
    assert_counts(&server, &[]);
    for name in LATENCIES {
        assert_eq!(fields[name], 0, "{name}");
    }

    let mut c = server.conn();
    let lock = c.call(&["INFO", "lock"]).text();
    assert!(lock.starts_with("# lock\r\n"), "{lock:?}");
    assert!(!lock.contains("# Server"), "{lock:?}");
    for section in ["modules", "everything"] {
        let text = c.call(&["INFO", section]).text();
        assert!(text.contains("# lock\r\n"), "INFO {section}: {text}");
        assert!(text.contains("\r\nlock_acquired:0\r\n"), "INFO {section}");
        assert!(
            text.contains("\r\nlock_hold_max_us:0\r\n"),
            "INFO {section}"
        );
    }
    // RESP3 clients get the same section (as verbatim text).
    let mut c3 = server.conn3();
    let lock3 = c3.call(&["INFO", "lock"]).text();
    assert!(lock3.contains("lock_keys:0"), "{lock3:?}");
}

#[test]
fn acquire_counts_grants_and_moves_held_and_keys() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k1", "a", 60_000);
    acquire(&mut c, "k2", "b", 60_000);
    assert_counts(
        &server,
        &[("lock_acquired", 2), ("lock_held", 2), ("lock_keys", 2)],
    );
    // A same-token retry is a grant too (the same fence), but no new hold or key.
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k1", "a", "60000"]),
        Reply::Int(fence)
    );
    assert_counts(
        &server,
        &[("lock_acquired", 3), ("lock_held", 2), ("lock_keys", 2)],
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "k2", "b"]), Reply::Int(1));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 3),
            ("lock_released", 1),
            ("lock_held", 1),
            ("lock_keys", 2),
        ],
    );
    // Refused input counts nothing.
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k3", "c", "0"]),
        Reply::error("ERR invalid ttl-ms: must be positive")
    );
    assert_counts(
        &server,
        &[
            ("lock_acquired", 3),
            ("lock_released", 1),
            ("lock_held", 1),
            ("lock_keys", 2),
        ],
    );
}

#[test]
fn contended_acquire_counts_contended_only() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["LOCK.ACQUIRE", "k", "b", "60000"]), Reply::Nil);
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_acquire_contended", 1),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
    // In MULTI, WAIT is a non-blocking attempt: contended at once, never a waiter.
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "5000"]),
        Reply::status("QUEUED")
    );
    assert_eq!(c.call(&["EXEC"]), Reply::Array(vec![Reply::Nil]));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_acquire_contended", 2),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(fence_of(&mut c, "k"), fence);
}

#[test]
fn acquire_wait_that_times_out_counts_a_timeout_and_no_grant() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let mut w = queue_waiter(&server, "k", "b", 60_000, 500);
    // While it waits it is a waiter (and not yet contended or timed out).
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_held", 1),
            ("lock_keys", 1),
            ("lock_waiters", 1),
        ],
    );
    assert_eq!(w.read(), Reply::Nil);
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_acquire_timeouts", 1),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(state_of(&mut c, "k"), "held");
}

#[test]
fn mismatched_release_counts_release_mismatch() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RELEASE", "missing", "a"]), Reply::Int(0));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_release_mismatch", 2),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    // Releasing a free lock is a mismatch too.
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_released", 1),
            ("lock_release_mismatch", 3),
            ("lock_keys", 1),
        ],
    );
}

#[test]
fn failed_renew_counts_renew_failed() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["LOCK.RENEW", "k", "b", "60000"]), Reply::Int(0));
    assert_eq!(
        c.call(&["LOCK.RENEW", "missing", "a", "60000"]),
        Reply::Int(0)
    );
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_renew_failed", 2),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(c.call(&["LOCK.RENEW", "k", "a", "90000"]), Reply::Int(1));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_renewed", 1),
            ("lock_renew_failed", 2),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
}

#[test]
fn rejected_fence_counts_fence_checks_and_rejects() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 60_000);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &(fence + 1).to_string()]),
        Reply::Int(0)
    );
    assert_eq!(c.call(&["LOCK.FENCE", "missing", "1"]), Reply::Int(0));
    // A refused argument is not a check.
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", "0"]),
        Reply::error("ERR invalid fence: must be a positive integer")
    );
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_fence_checks", 3),
            ("lock_fence_rejects", 2),
            ("lock_held", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(0)
    );
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_released", 1),
            ("lock_fence_checks", 4),
            ("lock_fence_rejects", 3),
            ("lock_keys", 1),
        ],
    );
}

#[test]
fn expiry_counts_expired_and_drops_held() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 300);
    acquire(&mut c, "long", "b", 60_000);
    assert_counts(
        &server,
        &[("lock_acquired", 2), ("lock_held", 2), ("lock_keys", 2)],
    );
    wait_for("lock_expired 1", || {
        (server.info_int("lock_expired") == 1).then_some(())
    });
    assert_counts(
        &server,
        &[
            ("lock_acquired", 2),
            ("lock_expired", 1),
            ("lock_held", 1),
            ("lock_keys", 2),
        ],
    );
    assert_eq!(state_of(&mut c, "k"), "free");
}

#[test]
fn force_release_counts_forced() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "missing"]), Reply::Int(0));
    assert_counts(
        &server,
        &[("lock_acquired", 1), ("lock_forced", 1), ("lock_keys", 1)],
    );
}

#[test]
fn session_loss_counts_session_released() {
    let server = Server::start();
    let mut c = server.conn();
    let mut s = server.conn();
    assert!(matches!(
        s.call(&["LOCK.ACQUIRE", "k", "a", "60000", "SESSION"]),
        Reply::Int(_)
    ));
    assert_counts(
        &server,
        &[("lock_acquired", 1), ("lock_held", 1), ("lock_keys", 1)],
    );
    drop(s);
    wait_for("lock_session_released 1", || {
        (server.info_int("lock_session_released") == 1).then_some(())
    });
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_session_released", 1),
            ("lock_keys", 1),
        ],
    );
    assert_eq!(state_of(&mut c, "k"), "free");
}

// ---------------------------------------------------------------------------------------------
// 2. Gauges stay true whichever way values come and go

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
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
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
    assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
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
    assert_eq!(gauges(&server), (2, 0, 3));
    drop(c);

    server.shutdown_and_restart();
    // A new process: the counters start over, the gauges count what was loaded.
    assert_counts(&server, &[("lock_held", 2), ("lock_keys", 3)]);
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "a"), "held");
    assert_eq!(state_of(&mut c, "b"), "held");
    assert_eq!(state_of(&mut c, "free"), "free");
}

// ---------------------------------------------------------------------------------------------
// 3. Latency summaries

fn latencies(server: &Server) -> BTreeMap<String, i64> {
    lock_fields(server)
        .into_iter()
        .filter(|(name, _)| LATENCIES.contains(&name.as_str()))
        .collect()
}

/// p50 <= p99 <= max for both summaries.
fn assert_ordered(l: &BTreeMap<String, i64>) {
    for what in ["acquire_wait", "hold"] {
        let get = |q: &str| l[&format!("lock_{what}_{q}_us")];
        assert!(
            0 <= get("p50") && get("p50") <= get("p99") && get("p99") <= get("max"),
            "{what}: {l:?}"
        );
    }
}

#[test]
fn latency_summaries_are_zero_on_a_fresh_server() {
    let server = Server::start();
    let l = latencies(&server);
    assert_eq!(l.len(), 6, "{l:?}");
    assert!(l.values().all(|v| *v == 0), "{l:?}");
}

#[test]
fn acquire_wait_summary_records_a_waiter_that_waited_200ms() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let mut w = queue_waiter(&server, "k", "b", 60_000, 5_000);
    let queued = Instant::now();
    // A deliberate wait: the point is its duration.
    sleep(Duration::from_millis(200).saturating_sub(queued.elapsed()));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    granted(&mut w);
    let l = latencies(&server);
    assert!(
        (150_000..10_000_000).contains(&l["lock_acquire_wait_max_us"]),
        "{l:?}"
    );
    // The other sample is the immediate grant: far below the wait.
    assert!(l["lock_acquire_wait_p50_us"] < 150_000, "{l:?}");
    assert_ordered(&l);
}

#[test]
fn hold_summary_records_a_lock_held_200ms_on_an_existing_key() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    acquire(&mut c, "k", "b", 60_000);
    let granted_at = Instant::now();
    sleep(Duration::from_millis(200));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
    let held_for = granted_at.elapsed();
    let l = latencies(&server);
    let max = l["lock_hold_max_us"];
    assert!((150_000..10_000_000).contains(&max), "{l:?}");
    assert!(
        max <= held_for.as_micros() as i64 + 50_000,
        "{l:?} vs {held_for:?}"
    );
    assert_ordered(&l);
}

#[test]
fn hold_summary_records_a_lock_held_200ms_on_a_new_key() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    sleep(Duration::from_millis(200));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    let l = latencies(&server);
    assert!(
        (150_000..10_000_000).contains(&l["lock_hold_max_us"]),
        "{l:?}"
    );
    assert_ordered(&l);
}

#[test]
fn latency_summaries_stay_ordered_over_many_samples() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    for i in 0..50 {
        let token = format!("t{i}");
        acquire(&mut c, "k", &token, 60_000);
        assert_eq!(c.call(&["LOCK.RELEASE", "k", &token]), Reply::Int(1));
        assert_ordered(&latencies(&server));
    }
    let l = latencies(&server);
    assert!(l["lock_hold_max_us"] > 0, "{l:?}");
    assert!(l["lock_hold_max_us"] < 10_000_000, "{l:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. Configs

fn config_get(c: &mut Conn, name: &str) -> String {
    let reply = c.call(&["CONFIG", "GET", name]);
    let items = reply.items();
    assert_eq!(items.len(), 2, "CONFIG GET {name}: {reply:?}");
    assert_eq!(items[0].text(), name);
    items[1].text()
}

#[test]
fn configs_have_their_documented_defaults() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-ttl"), "86400000");
    assert_eq!(config_get(&mut c, "lock.max-token-len"), "256");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "1000");
    let all = fields_of(&c.call(&["CONFIG", "GET", "lock.*"]));
    assert_eq!(
        all.keys().map(String::as_str).collect::<Vec<_>>(),
        ["lock.max-token-len", "lock.max-ttl", "lock.max-waiters"]
    );
}

#[test]
fn config_set_out_of_bounds_is_refused_and_the_value_stays() {
    let server = Server::start();
    let mut c = server.conn();
    let range = |name: &str, bounds: &str| {
        format!(
            "ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be \
             between {bounds} inclusive"
        )
    };
    let cases = [
        (
            "lock.max-ttl",
            "0",
            range("lock.max-ttl", "1 and 31536000000"),
        ),
        (
            "lock.max-ttl",
            "-5",
            range("lock.max-ttl", "1 and 31536000000"),
        ),
        (
            "lock.max-ttl",
            "31536000001",
            range("lock.max-ttl", "1 and 31536000000"),
        ),
        (
            "lock.max-ttl",
            "soon",
            "ERR CONFIG SET failed (possibly related to argument 'lock.max-ttl') - argument \
             couldn't be parsed into an integer"
                .to_string(),
        ),
        (
            "lock.max-token-len",
            "0",
            range("lock.max-token-len", "1 and 65536"),
        ),
        (
            "lock.max-token-len",
            "65537",
            range("lock.max-token-len", "1 and 65536"),
        ),
        (
            "lock.max-waiters",
            "0",
            range("lock.max-waiters", "1 and 1000000"),
        ),
        (
            "lock.max-waiters",
            "1000001",
            range("lock.max-waiters", "1 and 1000000"),
        ),
    ];
    for (name, value, error) in cases {
        assert_eq!(
            c.call(&["CONFIG", "SET", name, value]),
            Reply::Error(error),
            "{name} {value}"
        );
    }
    assert_eq!(config_get(&mut c, "lock.max-ttl"), "86400000");
    assert_eq!(config_get(&mut c, "lock.max-token-len"), "256");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "1000");
    acquire(&mut c, "k", "t", 86_400_000);
}

#[test]
fn config_set_in_bounds_applies_to_the_next_command() {
    let server = Server::start();
    let mut c = server.conn();
    for (name, value) in [
        ("lock.max-ttl", "60000"),
        ("lock.max-token-len", "8"),
        ("lock.max-waiters", "1"),
    ] {
        assert_eq!(c.call(&["CONFIG", "SET", name, value]), Reply::status("OK"));
        assert_eq!(config_get(&mut c, name), value);
    }
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "60001"]),
        Reply::error("ERR invalid ttl-ms: exceeds lock.max-ttl (60000)")
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "123456789", "5000"]),
        Reply::error("ERR invalid token: longer than lock.max-token-len (8 bytes)")
    );
    acquire(&mut c, "k", "12345678", 60_000);
    let _w = queue_waiter(&server, "k", "w", 60_000, 0);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "x", "5000", "WAIT", "0"]),
        Reply::error("ERR too many waiters on this lock (lock.max-waiters is 1)")
    );
}

#[test]
fn module_arguments_set_configs_at_load_with_or_without_prefix() {
    let server = Server::start_with(
        Config::default()
            .module_arg("max-waiters")
            .module_arg("7")
            .module_arg("lock.max-token-len")
            .module_arg("9")
            .module_arg("lock.max-ttl")
            .module_arg("60000"),
    );
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "7");
    assert_eq!(config_get(&mut c, "lock.max-token-len"), "9");
    assert_eq!(config_get(&mut c, "lock.max-ttl"), "60000");
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "60001"]),
        Reply::error("ERR invalid ttl-ms: exceeds lock.max-ttl (60000)")
    );
}

#[test]
fn bad_module_argument_values_refuse_to_load() {
    for args in [
        &["max-waiters", "0"][..],
        &["lock.max-ttl", "soon"],
        &["max-token-len", "65537"],
        &["max-ttl"],
    ] {
        let mut config = Config::default();
        for arg in args {
            config = config.module_arg(arg);
        }
        let result = std::panic::catch_unwind(|| Server::start_with(config));
        assert!(result.is_err(), "server started with module args {args:?}");
    }
}

#[test]
fn limits_do_not_apply_to_commands_replicated_from_the_primary() {
    let primary = Server::start();
    let mut p = primary.conn();
    let long_token = "L".repeat(40);
    // One grant reaches the replica by full sync, the others by the replication stream.
    let early = acquire(&mut p, "early", &long_token, 60_000);
    let replica = Server::start_with(
        Config::default()
            .module_arg("max-ttl")
            .module_arg("1000")
            .module_arg("max-token-len")
            .module_arg("4"),
    );
    replica.replicate_from(&primary);
    let late = acquire(&mut p, "late", &long_token, 120_000);
    assert_eq!(
        p.call(&["LOCK.RENEW", "early", &long_token, "90000"]),
        Reply::Int(1)
    );
    wait_replica_caught_up(&primary, &replica);

    let mut r = replica.conn();
    assert_eq!(config_get(&mut r, "lock.max-ttl"), "1000");
    assert_eq!(config_get(&mut r, "lock.max-token-len"), "4");
    for (key, fence, min_ttl) in [("early", early, 85_000), ("late", late, 115_000)] {
        assert_eq!(state_of(&mut r, key), "held", "{key}");
        assert_eq!(fence_of(&mut r, key), fence, "{key}");
        let ttl = lock_field(&mut r, key, "ttl").int();
        assert!(ttl > min_ttl, "{key}: replica ttl {ttl}");
        assert_eq!(
            r.call(&["LOCK.FENCE", key, &fence.to_string()]),
            Reply::Int(1)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. COMMAND DOCS / INFO / GETKEYS

/// Argument names as COMMAND DOCS lists them, and a sample call's arguments after the name.
fn command_table() -> [(
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
); 7] {
    [
        (
            "lock.acquire",
            &[
                "key",
                "token",
                "ttl-ms",
                "timeout-ms",
                "reentrant",
                "session",
            ],
            &["k1", "t", "100", "WAIT", "5", "SESSION"],
        ),
        ("lock.release", &["key", "token"], &["k2", "t"]),
        (
            "lock.renew",
            &["key", "token", "ttl-ms"],
            &["k3", "t", "100"],
        ),
        ("lock.fence", &["key", "fence"], &["k4", "5"]),
        ("lock.wait", &["key", "timeout-ms"], &["k5", "100"]),
        ("lock.info", &["key"], &["k6"]),
        ("lock.forcerelease", &["key"], &["k7"]),
    ]
}

#[test]
fn command_docs_describe_every_lock_command() {
    let server = Server::start();
    let mut c = server.conn();
    for (name, arg_names, _) in command_table() {
        let reply = c.call(&["COMMAND", "DOCS", name]);
        let items = reply.items();
        assert_eq!(items.len(), 2, "{name}: {reply:?}");
        assert_eq!(items[0].text(), name);
        let doc = fields_of(&items[1]);
        assert!(!doc["summary"].text().is_empty(), "{name}");
        assert_eq!(doc["since"].text(), "0.1.0", "{name}");
        assert_eq!(doc["group"].text(), "module", "{name}");
        assert_eq!(doc["module"].text(), "lock", "{name}");
        assert_eq!(doc["complexity"].text(), "O(1)", "{name}");
        let args: Vec<BTreeMap<String, Reply>> =
            doc["arguments"].items().iter().map(fields_of).collect();
        let names: Vec<String> = args.iter().map(|a| a["name"].text()).collect();
        assert_eq!(names, arg_names, "{name}");
        assert_eq!(args[0]["type"].text(), "key", "{name}");
        assert_eq!(args[0]["key_spec_index"], Reply::Int(0), "{name}");
    }
    // The options of LOCK.ACQUIRE are optional and introduced by their token.
    let reply = c.call(&["COMMAND", "DOCS", "lock.acquire"]);
    let doc = fields_of(&reply.items()[1]);
    let wait = fields_of(&doc["arguments"].items()[3]);
    assert_eq!(wait["token"].text(), "WAIT");
    assert_eq!(wait["type"].text(), "integer");
    assert_eq!(texts(&wait["flags"]), ["optional"]);
}

#[test]
fn command_info_gives_arity_flags_key_specs_and_acl_categories() {
    let server = Server::start();
    let version = server.version();
    let mut c = server.conn();
    let arity = |name: &str| match name {
        "lock.acquire" => -4,
        "lock.renew" => 4,
        "lock.release" | "lock.fence" | "lock.wait" => 3,
        _ => 2,
    };
    for (name, _, _) in command_table() {
        let reply = c.call(&["COMMAND", "INFO", name]);
        let info = reply.items()[0].items();
        assert_eq!(info[0].text(), name);
        assert_eq!(info[1], Reply::Int(arity(name)), "{name}");
        let flags = texts(&info[2]);
        let read_only = matches!(name, "lock.fence" | "lock.info" | "lock.wait");
        assert!(flags.contains(&"module".to_string()), "{name}: {flags:?}");
        assert_eq!(
            flags.contains(&"readonly".to_string()),
            read_only,
            "{name}: {flags:?}"
        );
        assert_eq!(
            flags.contains(&"write".to_string()),
            !read_only,
            "{name}: {flags:?}"
        );
        assert_eq!(
            info[3..6],
            [Reply::Int(1), Reply::Int(1), Reply::Int(1)],
            "{name}"
        );

        let mut categories = texts(&info[6]);
        categories.sort();
        let mut expected = Vec::new();
        if name == "lock.forcerelease" && version >= (7, 2, 0) {
            expected.push("@dangerous".to_string());
        }
        if version >= (7, 4, 0) {
            expected.push("@lock".to_string());
        }
        assert_eq!(categories, expected, "{name} on {version:?}");

        let specs = info[8].items();
        assert_eq!(specs.len(), 1, "{name}: {specs:?}");
        let spec = fields_of(&specs[0]);
        let key_flags = texts(&spec["flags"]);
        let (want, not) = if read_only {
            ("RO", "RW")
        } else {
            ("RW", "RO")
        };
        assert!(
            key_flags.iter().any(|f| f == want) && !key_flags.iter().any(|f| f == not),
            "{name}: {key_flags:?}"
        );
        let begin = fields_of(&spec["begin_search"]);
        assert_eq!(begin["type"].text(), "index", "{name}");
        assert_eq!(fields_of(&begin["spec"])["index"], Reply::Int(1), "{name}");
    }
}

#[test]
fn command_getkeys_returns_the_key_of_every_lock_command() {
    let server = Server::start();
    let mut c = server.conn();
    for (name, _, sample) in command_table() {
        let mut call = vec!["COMMAND", "GETKEYS", name];
        call.extend_from_slice(sample);
        assert_eq!(
            c.call(&call),
            Reply::Array(vec![Reply::bulk(sample[0])]),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 6. ACL with real users

fn set_user(server: &Server, name: &str, rules: &[&str]) {
    let mut call = vec!["ACL", "SETUSER", name, "reset", "on", ">pw"];
    call.extend_from_slice(rules);
    assert_eq!(
        server.conn().call(&call),
        Reply::status("OK"),
        "{name} {rules:?}"
    );
}

fn login(server: &Server, name: &str) -> Conn {
    let mut conn = server.conn();
    assert_eq!(conn.call(&["AUTH", name, "pw"]), Reply::status("OK"));
    conn
}

fn assert_noperm(reply: Reply, what: &str) {
    assert!(
        error_text(&reply).starts_with("NOPERM "),
        "{what}: {reply:?}"
    );
}

#[test]
fn acl_key_patterns_limit_lock_commands_to_matching_keys() {
    let server = Server::start();
    set_user(&server, "app", &["~app:*", "+@all"]);
    let mut u = login(&server, "app");
    let fence = acquire(&mut u, "app:x", "t", 60_000);
    assert_eq!(lock_field(&mut u, "app:x", "state").text(), "held");
    assert_eq!(
        u.call(&["LOCK.FENCE", "app:x", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        u.call(&["LOCK.RENEW", "app:x", "t", "60000"]),
        Reply::Int(1)
    );
    assert_eq!(u.call(&["LOCK.RELEASE", "app:x", "t"]), Reply::Int(1));
    assert_eq!(u.call(&["LOCK.WAIT", "app:x", "100"]), Reply::Int(1));

    let denied: [&[&str]; 7] = [
        &["LOCK.ACQUIRE", "other:x", "t", "60000"],
        &["LOCK.RELEASE", "other:x", "t"],
        &["LOCK.RENEW", "other:x", "t", "60000"],
        &["LOCK.FENCE", "other:x", "1"],
        &["LOCK.WAIT", "other:x", "100"],
        &["LOCK.INFO", "other:x"],
        &["LOCK.FORCERELEASE", "other:x"],
    ];
    for call in denied {
        assert_noperm(u.call(call), call[0]);
    }
    assert_eq!(server.conn().call(&["EXISTS", "other:x"]), Reply::Int(0));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_renewed", 1),
            ("lock_released", 1),
            ("lock_fence_checks", 1),
            ("lock_keys", 1),
        ],
    );
}

#[test]
fn acl_read_only_key_permission_allows_info_and_fence_only() {
    let server = Server::start();
    let mut admin = server.conn();
    let fence = acquire(&mut admin, "app:x", "t", 60_000);
    set_user(&server, "reader", &["%R~app:*", "+@all"]);
    let mut u = login(&server, "reader");
    assert_eq!(lock_field(&mut u, "app:x", "state").text(), "held");
    assert_eq!(
        u.call(&["LOCK.FENCE", "app:x", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(u.call(&["LOCK.WAIT", "app:none", "100"]), Reply::Int(1));
    let denied: [&[&str]; 4] = [
        &["LOCK.ACQUIRE", "app:x", "t", "60000"],
        &["LOCK.RELEASE", "app:x", "t"],
        &["LOCK.RENEW", "app:x", "t", "60000"],
        &["LOCK.FORCERELEASE", "app:x"],
    ];
    for call in denied {
        assert_noperm(u.call(call), call[0]);
    }
    assert_noperm(u.call(&["LOCK.INFO", "other:x"]), "LOCK.INFO other:x");
    assert_eq!(lock_field(&mut admin, "app:x", "holds"), Reply::Int(1));
    assert_eq!(fence_of(&mut admin, "app:x"), fence);
}

/// The LOCK.* commands other than FORCERELEASE all work for `u` on key `k`.
fn assert_everyday_commands_allowed(u: &mut Conn, k: &str) {
    let fence = acquire(u, k, "t", 60_000);
    assert_eq!(u.call(&["LOCK.RENEW", k, "t", "60000"]), Reply::Int(1));
    assert_eq!(
        u.call(&["LOCK.FENCE", k, &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(lock_field(u, k, "state").text(), "held");
    assert_eq!(u.call(&["LOCK.RELEASE", k, "t"]), Reply::Int(1));
    assert_eq!(u.call(&["LOCK.WAIT", k, "100"]), Reply::Int(1));
}

#[test]
fn acl_minus_dangerous_denies_forcerelease_from_redis_7_2() {
    let server = Server::start();
    let version = server.version();
    let mut admin = server.conn();
    acquire(&mut admin, "held", "owner", 60_000);
    set_user(&server, "app", &["~*", "&*", "+@all", "-@dangerous"]);
    let mut u = login(&server, "app");
    assert_everyday_commands_allowed(&mut u, "mine");
    let reply = u.call(&["LOCK.FORCERELEASE", "held"]);
    if version >= (7, 2, 0) {
        assert_eq!(
            reply,
            Reply::error(
                "NOPERM User app has no permissions to run the 'lock.forcerelease' command"
            )
        );
        assert_eq!(state_of(&mut admin, "held"), "held");
    } else {
        // Redis 7.0 cannot put module commands in categories: the README names the command
        // instead (see the next test).
        assert_eq!(reply, Reply::Int(1), "on {version:?}");
    }
}

#[test]
fn acl_documented_recipe_denies_forcerelease_on_every_version() {
    let server = Server::start();
    let mut admin = server.conn();
    acquire(&mut admin, "held", "owner", 60_000);
    set_user(
        &server,
        "app",
        &["~*", "&*", "+@all", "-@dangerous", "-lock.forcerelease"],
    );
    let mut u = login(&server, "app");
    assert_everyday_commands_allowed(&mut u, "mine");
    assert_noperm(u.call(&["LOCK.FORCERELEASE", "held"]), "LOCK.FORCERELEASE");
    assert_eq!(state_of(&mut admin, "held"), "held");
    assert_eq!(admin.call(&["LOCK.FORCERELEASE", "held"]), Reply::Int(1));
}

#[test]
fn acl_lock_category_lists_and_covers_lock_commands_from_redis_7_4() {
    let server = Server::start();
    let version = server.version();
    let mut admin = server.conn();
    let cat = admin.call(&["ACL", "CAT", "lock"]);
    if version < (7, 4, 0) {
        assert_eq!(cat, Reply::error("ERR Unknown category 'lock'"));
        let reply = admin.call(&["ACL", "SETUSER", "u", "-@lock"]);
        assert!(error_text(&reply).starts_with("ERR "), "{reply:?}");
        return;
    }
    let listed: BTreeSet<String> = texts(&cat).into_iter().collect();
    for name in COMMANDS {
        assert!(listed.contains(name), "{name} missing from {listed:?}");
    }
    assert!(listed.iter().all(|n| n.starts_with("lock.")), "{listed:?}");

    acquire(&mut admin, "held", "owner", 60_000);
    set_user(&server, "nolock", &["~*", "&*", "+@all", "-@lock"]);
    let mut u = login(&server, "nolock");
    for (name, _, sample) in command_table() {
        let mut call = vec![name];
        call.extend_from_slice(sample);
        assert_eq!(
            u.call(&call),
            Reply::Error(format!(
                "NOPERM User nolock has no permissions to run the '{name}' command"
            ))
        );
    }
    assert_eq!(u.call(&["SET", "plain", "1"]), Reply::status("OK"));

    set_user(&server, "onlylock", &["~*", "-@all", "+@lock"]);
    let mut u = login(&server, "onlylock");
    assert_everyday_commands_allowed(&mut u, "mine");
    assert_noperm(u.call(&["GET", "plain"]), "GET");
    assert_eq!(state_of(&mut admin, "held"), "held");
}

// ---------------------------------------------------------------------------------------------
// 7. The token is redacted wherever the server shows commands

/// Runs acquire, renew, a refused acquire, info, fence and release of `k` with [`TOKEN`].
fn token_workout(c: &mut Conn, k: &str) {
    let fence = acquire(c, k, TOKEN, 60_000);
    assert_eq!(c.call(&["LOCK.RENEW", k, TOKEN, "60000"]), Reply::Int(1));
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", k, TOKEN, "60000", "BOGUS"]),
        Reply::error("ERR unknown option 'BOGUS'")
    );
    assert!(!c.call(&["LOCK.INFO", k]).contains_bytes(TOKEN.as_bytes()));
    assert_eq!(
        c.call(&["LOCK.FENCE", k, &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(c.call(&["LOCK.RELEASE", k, TOKEN]), Reply::Int(1));
}

#[test]
fn slowlog_never_holds_the_token() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]), Reply::status("OK"));
    token_workout(&mut c, "k");
    let log = c.call(&["SLOWLOG", "GET", "100"]);
    assert!(!log.contains_bytes(TOKEN.as_bytes()), "{log:?}");
    let logged: Vec<Vec<String>> = log
        .items()
        .iter()
        .map(|entry| {
            let mut args = texts(&entry.items()[3]);
            // The log keeps the command name as the client typed it.
            args[0] = args[0].to_lowercase();
            args
        })
        .collect();
    for expected in [
        &["lock.acquire", "k", "(redacted)", "60000"][..],
        &["lock.renew", "k", "(redacted)", "60000"],
        &["lock.acquire", "k", "(redacted)", "60000", "BOGUS"],
        &["lock.release", "k", "(redacted)"],
    ] {
        assert!(
            logged.iter().any(|args| args == expected),
            "{expected:?} not in {logged:?}"
        );
    }
}

/// Reads MONITOR lines until one contains `until`; returns them all.
fn monitor_until(monitor: &mut Conn, until: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for _ in 0..1000 {
        // MONITOR shows the command name as the client typed it.
        let line = monitor.read().text().to_lowercase();
        let done = line.contains(until);
        lines.push(line);
        if done {
            return lines;
        }
    }
    panic!("no MONITOR line with {until:?} in {lines:?}");
}

#[test]
fn monitor_shows_lock_commands_without_the_token() {
    let server = Server::start();
    let mut monitor = server.conn();
    assert_eq!(monitor.call(&["MONITOR"]), Reply::status("OK"));
    let mut c = server.conn();
    token_workout(&mut c, "k");
    let lines = monitor_until(&mut monitor, "\"lock.release\"");
    assert!(
        lines.iter().all(|l| !l.contains(&TOKEN.to_lowercase())),
        "token in MONITOR: {lines:#?}"
    );
    for expected in [
        r#""lock.acquire" "k" "(redacted)" "60000""#,
        r#""lock.renew" "k" "(redacted)" "60000""#,
        r#""lock.acquire" "k" "(redacted)" "60000" "bogus""#,
        r#""lock.release" "k" "(redacted)""#,
    ] {
        assert!(
            lines.iter().any(|l| l.ends_with(expected)),
            "{expected} not in {lines:#?}"
        );
    }
}

#[test]
fn commandlog_never_holds_the_token_where_the_server_has_one() {
    let server = Server::start();
    let mut c = server.conn();
    let info = c.call(&["COMMAND", "INFO", "COMMANDLOG"]);
    if info.items()[0] == Reply::Nil {
        // Redis 7.0 and 8.2 have no COMMANDLOG (only SLOWLOG, tested above).
        return;
    }
    let configs = fields_of(&c.call(&["CONFIG", "GET", "commandlog*"]));
    let threshold = configs
        .keys()
        .find(|name| name.contains("execution") || name.contains("slower-than"))
        .unwrap_or_else(|| panic!("no command log threshold among {configs:?}"))
        .clone();
    assert_eq!(
        c.call(&["CONFIG", "SET", &threshold, "0"]),
        Reply::status("OK")
    );
    token_workout(&mut c, "k");
    let log = c.call(&["COMMANDLOG", "GET", "100", "slow"]);
    assert!(log.contains_bytes(b"lock.release"), "{log:?}");
    assert!(!log.contains_bytes(TOKEN.as_bytes()), "{log:?}");
}

#[test]
fn lock_info_client_list_and_info_never_show_the_token() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", TOKEN, 60_000);
    let waiter_token = format!("{TOKEN}-waiter");
    let _w = queue_waiter(&server, "k", &waiter_token, 60_000, 0);
    let mut c3 = server.conn3();
    for reply in [
        c.call(&["LOCK.INFO", "k"]),
        c3.call(&["LOCK.INFO", "k"]),
        c.call(&["CLIENT", "LIST"]),
        c.call(&["CLIENT", "INFO"]),
        c.call(&["INFO", "everything"]),
    ] {
        assert!(!reply.contains_bytes(TOKEN.as_bytes()), "{reply:?}");
    }
    let clients = c.call(&["CLIENT", "LIST"]).text();
    assert!(clients.contains("cmd=lock.acquire"), "{clients}");
    assert_eq!(lock_field(&mut c, "k", "waiters"), Reply::Int(1));
}

#[test]
fn refused_arguments_are_never_echoed_with_the_token() {
    let server = Server::start();
    let mut c = server.conn();
    let cases: [(&[&str], &str); 6] = [
        (
            &["LOCK.ACQUIRE", "k", TOKEN, "1000", "BOGUS"],
            "ERR unknown option 'BOGUS'",
        ),
        (
            &["LOCK.ACQUIRE", "k", TOKEN, "1000", "WAIT"],
            "ERR invalid timeout-ms: missing after WAIT",
        ),
        (
            &["LOCK.ACQUIRE", "k", TOKEN, "1000", "SESSION", "SESSION"],
            "ERR option SESSION given more than once",
        ),
        // Arguments swapped by mistake.
        (
            &["LOCK.ACQUIRE", "k", "1000", TOKEN],
            "ERR invalid ttl-ms: not an integer",
        ),
        (
            &["LOCK.RENEW", "k", TOKEN, "soon"],
            "ERR invalid ttl-ms: not an integer",
        ),
        (
            &["LOCK.ACQUIRE", "k", TOKEN, "86400001"],
            "ERR invalid ttl-ms: exceeds lock.max-ttl (86400000)",
        ),
    ];
    for (call, error) in cases {
        assert_eq!(c.call(call), Reply::error(error), "{call:?}");
    }
    let long_token = format!("{TOKEN}{}", "x".repeat(300));
    let reply = c.call(&["LOCK.ACQUIRE", "k", &long_token, "1000"]);
    assert_eq!(
        reply,
        Reply::error("ERR invalid token: longer than lock.max-token-len (256 bytes)")
    );
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
}

#[test]
fn replica_monitor_never_shows_the_token() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut monitor = replica.conn();
    assert_eq!(monitor.call(&["MONITOR"]), Reply::status("OK"));
    let mut p = primary.conn();
    token_workout(&mut p, "k");
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(state_of(&mut r, "k"), "free");
    assert_eq!(
        r.call(&["ECHO", "end-of-test-marker"]),
        Reply::bulk("end-of-test-marker")
    );
    // LOCK.APPLY is flagged no-monitor, so it normally does not show at all; whatever does
    // show must not hold the token.
    let lines = monitor_until(&mut monitor, "end-of-test-marker");
    assert!(
        lines.iter().all(|l| !l.contains(&TOKEN.to_lowercase())),
        "token in the replica's MONITOR: {lines:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Safety warnings

#[test]
fn allkeys_eviction_policy_is_warned_about_until_it_changes() {
    let server = Server::start_with(Config::default().with("maxmemory-policy", "allkeys-lru"));
    assert_eq!(server.info_int("lock_warning_eviction_policy"), 1);
    assert!(
        server
            .log()
            .contains("maxmemory-policy allkeys-lru can evict lock keys"),
        "{}",
        server.log()
    );
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        Reply::status("OK")
    );
    wait_for("eviction warning cleared", || {
        (server.info_int("lock_warning_eviction_policy") == 0).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"]),
        Reply::status("OK")
    );
    wait_for("eviction warning raised again", || {
        (server.info_int("lock_warning_eviction_policy") == 1).then_some(())
    });
    wait_for("allkeys-lfu warning in the log", || {
        server
            .log()
            .contains("maxmemory-policy allkeys-lfu can evict lock keys")
            .then_some(())
    });
}

#[test]
fn volatile_eviction_policy_gives_no_warning() {
    let server = Server::start_with(Config::default().with("maxmemory-policy", "volatile-lru"));
    assert_eq!(server.info_int("lock_warning_eviction_policy"), 0);
    assert!(!server.log().contains("can evict lock keys"));
}

#[test]
fn no_persistence_is_warned_about_until_aof_or_save_points_are_on() {
    let server = Server::start();
    assert_eq!(server.info_int("lock_warning_no_persistence"), 1);
    assert_eq!(server.info_int("lock_warning_eviction_policy"), 0);
    assert!(
        server.log().contains("persistence is off"),
        "{}",
        server.log()
    );
    let mut c = server.conn();
    let warning = || server.info_int("lock_warning_no_persistence");
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "yes"]),
        Reply::status("OK")
    );
    wait_for("no-persistence warning cleared by AOF", || {
        (warning() == 0).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "no"]),
        Reply::status("OK")
    );
    wait_for("no-persistence warning back", || {
        (warning() == 1).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "save", "3600 1"]),
        Reply::status("OK")
    );
    wait_for("no-persistence warning cleared by a save point", || {
        (warning() == 0).then_some(())
    });
}

#[test]
fn appendonly_at_start_gives_no_persistence_warning() {
    let server = Server::start_with(Config::default().with("appendonly", "yes"));
    assert_eq!(server.info_int("lock_warning_no_persistence"), 0);
    assert!(!server.log().contains("persistence is off"));
}
