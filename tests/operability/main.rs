//! Operability: the `INFO lock` counters, gauges and latency summaries, the `lock.*` configs,
//! COMMAND DOCS / INFO / GETKEYS, ACL users, token redaction and the safety warnings.
//!
//! One module per subject (`counters`, `gauges`, `latency`, `configs`, `command_docs`, `acl`,
//! `redaction`, `warnings`); the names, token and helpers they share are here.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod command_docs;
mod configs;
mod counters;
mod gauges;
mod latency;
mod redaction;
mod servers;
mod warnings;

use common::*;

use std::collections::BTreeMap;

/// Gauges and counters of `INFO lock`: exact after every scripted sequence.
const COUNTS: [&str; 29] = [
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
    "lock_reclaimed",
    "lock_sync_confirmed",
    "lock_sync_failed",
    "lock_fsyncs",
    "lock_fsync_errors",
    "lock_fence_checks",
    "lock_fence_rejects",
    "lock_delayed",
    "lock_guarded",
    "lock_guard_rejects",
    "lock_shared_grants",
    "lock_permit_grants",
    "lock_long_holds",
    "lock_namespaces",
    "lock_policy_refused",
    "lock_policy_warned",
];

/// Ages in ms of the oldest hold and waiter (0 when none), and `lock.long-hold`.
const AGES: [&str; 3] = [
    "lock_oldest_hold_ms",
    "lock_oldest_wait_ms",
    "lock_long_hold_ms",
];

/// The text fields of `INFO lock` (every other field is an integer).
const TEXT_FIELDS: [&str; 4] = [
    "lock_version",
    "lock_policy_digest",
    "lock_oldest_hold_tag",
    "lock_oldest_wait_tag",
];

/// The cumulative buckets of the wait and hold histograms, with their sums and counts.
fn bucket_names() -> Vec<String> {
    let mut names = Vec::new();
    for (name, bounds) in [
        (
            "lock_acquire_wait_ms",
            &[
                "1", "5", "10", "50", "100", "500", "1000", "5000", "10000", "30000", "60000",
                "inf",
            ][..],
        ),
        (
            "lock_hold_ms",
            &[
                "10", "100", "1000", "10000", "60000", "300000", "1800000", "3600000", "inf",
            ][..],
        ),
    ] {
        names.extend(bounds.iter().map(|le| format!("{name}_bucket_le_{le}")));
        names.push(format!("{name}_sum"));
        names.push(format!("{name}_count"));
    }
    names
}

/// Latency summaries, in µs.
const LATENCIES: [&str; 6] = [
    "lock_acquire_wait_p50_us",
    "lock_acquire_wait_p99_us",
    "lock_acquire_wait_max_us",
    "lock_hold_p50_us",
    "lock_hold_p99_us",
    "lock_hold_max_us",
];

/// The lease index's size: at most one entry per lock key (tests/deleted.rs holds it exact).
const INDEX: [&str; 1] = ["lock_index_entries"];

const WARNINGS: [&str; 2] = [
    "lock_warning_eviction_policy",
    "lock_warning_no_persistence",
];

/// The public commands.
const COMMANDS: [&str; 12] = [
    "lock.acquire",
    "lock.release",
    "lock.renew",
    "lock.fence",
    "lock.wait",
    "lock.info",
    "lock.forcerelease",
    "lock.guard",
    "lock.macquire",
    "lock.mrelease",
    "lock.who",
    "lock.longholds",
];

/// A token distinctive enough that finding it anywhere means it leaked.
const TOKEN: &str = "tok-5ecr3t-7f9c2a51d0e4";

/// Every `lock_*` field of `INFO lock`.
fn lock_fields(server: &Server) -> BTreeMap<String, i64> {
    let info = server.conn().call(&["INFO", "lock"]).text();
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name.starts_with("lock_") && !TEXT_FIELDS.contains(&name)).then(|| {
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
fn texts(reply: &Reply) -> Vec<String> {
    reply.items().iter().map(Reply::text).collect()
}

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
                "sync",
                "fsync-timeout-ms",
                "lock-delay",
                "mode",
                "label",
            ],
            &["k1", "t", "100", "WAIT", "5", "SESSION"],
        ),
        ("lock.release", &["key", "token"], &["k2", "t"]),
        (
            "lock.renew",
            &["key", "token", "ttl-ms", "sync", "fsync-timeout-ms"],
            &["k3", "t", "100"],
        ),
        ("lock.fence", &["key", "fence"], &["k4", "5"]),
        ("lock.wait", &["key", "timeout-ms"], &["k5", "100"]),
        ("lock.info", &["key"], &["k6"]),
        ("lock.forcerelease", &["key"], &["k7"]),
    ]
}
