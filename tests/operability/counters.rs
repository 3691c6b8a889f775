//! `INFO lock` counters after scripted sequences.

use crate::common::*;
use crate::{assert_counts, bucket_names, lock_fields, AGES, COUNTS, INDEX, LATENCIES, WARNINGS};

use std::collections::BTreeSet;

#[test]
fn info_lock_has_every_field_at_zero_and_is_part_of_modules_and_everything() {
    let server = Server::start();
    let fields = lock_fields(&server);
    let names: BTreeSet<&str> = fields.keys().map(String::as_str).collect();
    let buckets = bucket_names();
    let expected: BTreeSet<&str> = COUNTS
        .iter()
        .chain(&LATENCIES)
        .chain(&INDEX)
        .chain(&AGES)
        .chain(&WARNINGS)
        .copied()
        .chain(buckets.iter().map(String::as_str))
        .collect();
    assert_eq!(names, expected);
    assert_counts(&server, &[]);
    for name in LATENCIES.into_iter().chain(INDEX).chain(AGES) {
        assert_eq!(fields[name], 0, "{name}");
    }
    for name in &buckets {
        assert_eq!(fields[name.as_str()], 0, "{name}");
    }

    let mut c = server.conn();
    let lock = c.call(&["INFO", "lock"]).text();
    assert!(lock.starts_with("# lock\r\n"), "{lock:?}");
    // The text fields come first: the version, and empty tags while nothing is held or awaited.
    let version = format!("# lock\r\nlock_version:{}\r\n", env!("CARGO_PKG_VERSION"));
    assert!(lock.starts_with(&version), "{lock:?}");
    for tag in ["lock_oldest_hold_tag", "lock_oldest_wait_tag"] {
        assert!(lock.contains(&format!("\r\n{tag}:\r\n")), "{tag}: {lock:?}");
    }
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

/// `lock_acquire_contended` counts every LOCK.ACQUIRE and LOCK.MACQUIRE that found a lock taken
/// by someone else, once per command: whether it answered nil at once or queued with WAIT, and
/// whatever came of the wait (a grant, a timeout).
#[test]
fn contended_counts_each_acquire_that_found_the_lock_taken_once_whether_it_queued_or_not() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    // At once: nil.
    assert_eq!(c.call(&["LOCK.ACQUIRE", "k", "b", "60000"]), Reply::Nil);
    assert_eq!(server.info_int("lock_acquire_contended"), 1);
    // Queued with WAIT, later granted: counted as it queued, not again when served.
    let mut granted_later = queue_waiter(&server, "k", "b", 60_000, 0);
    assert_eq!(server.info_int("lock_acquire_contended"), 2);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    let fence = granted(&mut granted_later);
    assert_eq!(fence_of(&mut c, "k"), fence);
    // Queued with WAIT, timed out.
    let mut timed_out = queue_waiter(&server, "k", "c", 60_000, 100);
    assert_eq!(timed_out.read(), Reply::Nil);
    // LOCK.MACQUIRE with WAIT: once for the command, however many of its keys were taken.
    acquire(&mut c, "j", "a", 60_000);
    let before = blocked(&server);
    let mut multi = server.conn();
    multi.send(&[
        "LOCK.MACQUIRE",
        "3",
        "j",
        "k",
        "free",
        "d",
        "60000",
        "WAIT",
        "0",
    ]);
    wait_blocked(&server, before + 1);
    assert_eq!(server.info_int("lock_acquire_contended"), 4);
    assert_eq!(c.call(&["LOCK.RELEASE", "j", "a"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
    assert_eq!(multi.read().items().len(), 3);
    assert_counts(
        &server,
        &[
            ("lock_acquired", 6),
            ("lock_acquire_contended", 4),
            ("lock_acquire_timeouts", 1),
            ("lock_released", 3),
            ("lock_held", 3),
            ("lock_keys", 3),
        ],
    );
}

#[test]
fn acquire_wait_that_times_out_counts_a_timeout_and_no_grant() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let mut w = queue_waiter(&server, "k", "b", 60_000, 500);
    // It found the lock held: contended as it queued, and a waiter (not yet timed out).
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_acquire_contended", 1),
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
            ("lock_acquire_contended", 1),
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
