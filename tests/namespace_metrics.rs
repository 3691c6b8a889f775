//! Metrics cut by namespace: INFO's `lock_namespace_<name>` lines (held, waiters, the counters,
//! refusals and warnings by rule, the oldest hold and wait), counted where the server-wide
//! ones are, on a replica too; held locks follow their keys into a new policy, a rename and a
//! deletion; no line without namespaces.

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::*;

const POLICY: &str = "orders prefix=orders: mode=enforce max-ttl=30000; \
                      batch prefix=batch: mode=warn label=required";

/// The fields of `lock_namespace_<name>` in INFO lock, or `None` without that line.
fn namespace_info(server: &Server, name: &str) -> Option<BTreeMap<String, i64>> {
    line_of(&server.conn().call(&["INFO", "lock"]).text(), name)
}

/// The fields of `lock_namespace_<name>` in the INFO text `info`.
fn line_of(info: &str, name: &str) -> Option<BTreeMap<String, i64>> {
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(&format!("lock_namespace_{name}:")))?;
    Some(
        line.trim()
            .split(',')
            .map(|pair| {
                let (field, value) = pair.split_once('=').expect("field=value");
                (field.to_string(), value.parse().expect("an integer"))
            })
            .collect(),
    )
}

/// The fields every test compares, in the order [`expect`] takes their values.
const COMPARED: [&str; 9] = [
    "held",
    "waiters",
    "acquired",
    "contended",
    "timeouts",
    "expired",
    "forced",
    "refused",
    "warned",
];

/// The compared fields of a namespace's line.
fn counted(fields: &BTreeMap<String, i64>) -> BTreeMap<&'static str, i64> {
    COMPARED
        .into_iter()
        .map(|field| (field, fields[field]))
        .collect()
}

fn expect(values: [i64; 9]) -> BTreeMap<&'static str, i64> {
    COMPARED.into_iter().zip(values).collect()
}

#[test]
fn each_namespace_counts_what_its_locks_did_on_primary_and_replica() {
    let primary = Server::start_with(Config::default().namespaces(POLICY));
    let replica = Server::start_with(Config::default().namespaces(POLICY));
    replica.replicate_from(&primary);
    let started = Instant::now();
    let mut c = primary.conn();
    acquire(&mut c, "orders:1", "t", 30_000);
    acquire(&mut c, "orders:2", "t", 30_000);
    // Warned twice (no label), granted both times; one lease runs out.
    acquire(&mut c, "batch:1", "t", 30_000);
    acquire(&mut c, "batch:2", "t", 100);
    acquire(&mut c, "elsewhere", "t", 30_000);
    // Contended three times: found taken, timed out, and queued.
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "orders:1", "u", "1000"]),
        Reply::Nil
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "orders:1", "u", "1000", "WAIT", "50"]),
        Reply::Nil
    );
    let _waiter = queue_waiter(&primary, "orders:2", "u", 1_000, 60_000);
    // Refused by the max-ttl rule.
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "orders:3", "t", "600000"]),
        Reply::error("POLICY orders: ttl 600000 above the namespace's max-ttl 30000")
    );
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "elsewhere"]), Reply::Int(1));
    wait_for("the short lease to end", || {
        (primary.info_int("lock_expired") == 1).then_some(())
    });

    // One INFO for all three lines: their ages are taken at the same moment.
    let info = c.call(&["INFO", "lock"]).text();
    let orders = line_of(&info, "orders").expect("orders line");
    assert_eq!(counted(&orders), expect([2, 1, 2, 3, 1, 0, 0, 1, 0]));
    assert_eq!(orders["refused_max_ttl"], 1);
    assert!(!orders.contains_key("warned_label"), "{orders:?}");
    let batch = line_of(&info, "batch").expect("batch line");
    assert_eq!(counted(&batch), expect([1, 0, 2, 0, 0, 1, 0, 0, 2]));
    assert_eq!(batch["warned_label"], 2);
    let default = line_of(&info, "default").expect("default line");
    assert_eq!(counted(&default), expect([0, 0, 1, 0, 0, 0, 1, 0, 0]));
    // The ages: orders:1 was granted first, and nobody holds in default.
    // (The server's ages are whole ms on both ends: one more than the test's own count.)
    let elapsed = started.elapsed().as_millis() as i64 + 1;
    assert!(
        orders["oldest_hold_ms"] >= batch["oldest_hold_ms"],
        "{orders:?} {batch:?}"
    );
    assert!(orders["oldest_hold_ms"] <= elapsed, "{orders:?}");
    assert!(orders["oldest_wait_ms"] <= elapsed, "{orders:?}");
    assert_eq!(
        (default["oldest_hold_ms"], default["oldest_wait_ms"]),
        (0, 0)
    );
    assert_eq!(batch["oldest_wait_ms"], 0);

    // The replica counts the changes it applied, in its own namespaces: no contention, no
    // refusal, no waiter (those happen on the primary only).
    wait_for("the replica to apply everything", || {
        (replica.info_int("lock_forced") == 1 && replica.info_int("lock_expired") == 1)
            .then_some(())
    });
    let on_replica = |name| counted(&namespace_info(&replica, name).expect("line"));
    assert_eq!(on_replica("orders"), expect([2, 0, 2, 0, 0, 0, 0, 0, 0]));
    assert_eq!(on_replica("batch"), expect([1, 0, 2, 0, 0, 1, 0, 0, 0]));
    assert_eq!(on_replica("default"), expect([0, 0, 1, 0, 0, 0, 1, 0, 0]));
}

#[test]
fn held_locks_follow_their_keys_into_a_new_policy_a_rename_and_a_deletion() {
    let server = Server::start_with(Config::default().namespaces("a prefix=a:"));
    let mut c = server.conn();
    for key in ["a:1", "b:1", "c:1", "c:2"] {
        acquire(&mut c, key, "t", 60_000);
    }
    let held = |name: &str| namespace_info(&server, name).map(|f| f["held"]);
    let waiting = |name: &str| namespace_info(&server, name).map(|f| f["waiters"]);
    assert_eq!((held("a"), held("default")), (Some(1), Some(3)));
    // A waiter, and a watcher, queued on b:1 while it is in no namespace.
    let _waiter = queue_waiter(&server, "b:1", "u", 60_000, 60_000);
    let before = server.info_int("blocked_clients");
    let mut watcher = server.conn();
    watcher.send(&["LOCK.WAIT", "b:1", "60000"]);
    wait_for("the watcher to block", || {
        (server.info_int("blocked_clients") == before + 1).then_some(())
    });
    assert_eq!((waiting("a"), waiting("default")), (Some(0), Some(2)));
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b prefix=b:; c prefix=c:"
        ]),
        Reply::status("OK")
    );
    wait_for("the held locks to be counted in the new namespaces", || {
        (held("b") == Some(1) && held("c") == Some(2)).then_some(())
    });
    assert_eq!((held("a"), held("default")), (None, Some(1)));
    // The waiters moved with their key.
    assert_eq!((waiting("b"), waiting("default")), (Some(2), Some(0)));
    // A rename takes the lock to its new key's namespace; a deletion out of its own.
    assert_eq!(c.call(&["RENAME", "a:1", "b:2"]), Reply::status("OK"));
    assert_eq!((held("b"), held("default")), (Some(2), Some(0)));
    assert_eq!(c.call(&["DEL", "c:1"]), Reply::Int(1));
    assert_eq!(held("c"), Some(1));
    assert_eq!(server.info_int("lock_held"), 3);
    // Without namespaces, no line at all.
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", ""]),
        Reply::status("OK")
    );
    let info = c.call(&["INFO", "lock"]).text();
    assert!(!info.contains("lock_namespace_"), "{info}");
}

#[test]
fn a_default_namespace_of_the_policy_has_one_line_for_every_key_outside_the_others() {
    let server = Server::start_with(
        Config::default().namespaces("x prefix=x:; default mode=warn max-ttl=1000"),
    );
    let mut c = server.conn();
    acquire(&mut c, "x:1", "t", 60_000);
    acquire(&mut c, "y:1", "t", 60_000);
    acquire(&mut c, "z", "t", 60_000);
    let info = c.call(&["INFO", "lock"]).text();
    assert_eq!(info.matches("lock_namespace_default:").count(), 1, "{info}");
    let default = namespace_info(&server, "default").expect("default line");
    assert_eq!(counted(&default), expect([2, 0, 2, 0, 0, 0, 0, 0, 2]));
    assert_eq!(default["warned_max_ttl"], 2);
    assert_eq!(namespace_info(&server, "x").expect("x line")["held"], 1);
}

#[test]
fn a_policy_or_threshold_changed_again_while_locks_are_being_walked_ends_with_the_last_one() {
    let server = Server::start_with(Config::default());
    let mut c = server.conn();
    // Enough keys that the walk after a change takes several slices.
    assert_eq!(
        c.call(&["DEBUG", "POPULATE", "300000", "filler"]),
        Reply::status("OK")
    );
    const LOCKS: usize = 3_000;
    for i in 0..LOCKS {
        c.send(&["LOCK.ACQUIRE", &format!("k{}:{i}", i % 3), "t", "600000"]);
    }
    for _ in 0..LOCKS {
        assert!(c.read().is_int());
    }
    // Two changes in a row, the second while the first walk has barely begun, and locks taken
    // and deleted meanwhile.
    c.send(&["CONFIG", "SET", "lock.namespaces", "a prefix=k0:"]);
    c.send(&[
        "CONFIG",
        "SET",
        "lock.namespaces",
        "a prefix=k1:; b prefix=k2:",
    ]);
    c.send(&["DEL", "k1:1", "k2:2"]);
    c.send(&["LOCK.ACQUIRE", "k1:new", "t", "600000"]);
    assert_eq!(c.read(), Reply::status("OK"));
    assert_eq!(c.read(), Reply::status("OK"));
    assert_eq!(c.read(), Reply::Int(2));
    assert!(c.read().is_int());
    let third = (LOCKS / 3) as i64;
    // All three at once: while the walk goes on, `a` can read its final count with some of
    // `k0:` still in it and some of `k1:` not yet.
    wait_for("every held lock to be counted in its namespace", || {
        let held = |name| namespace_info(&server, name).map(|f| f["held"]);
        (held("a") == Some(third) && held("b") == Some(third - 1) && held("default") == Some(third))
            .then_some(())
    });
    assert_eq!(server.info_int("lock_held"), LOCKS as i64 - 1);
    // A lower long-hold threshold, then a policy change while that walk goes on: every hold,
    // granted before either, becomes long by the new threshold all the same.
    c.send(&["CONFIG", "SET", "lock.long-hold", "300"]);
    c.send(&["CONFIG", "SET", "lock.namespaces", "a prefix=k0:"]);
    assert_eq!(c.read(), Reply::status("OK"));
    assert_eq!(c.read(), Reply::status("OK"));
    wait_for("every hold to become long", || {
        (server.info_int("lock_long_holds") == LOCKS as i64 - 1).then_some(())
    });
    wait_for("the held locks to be counted in the last policy", || {
        let held = |name| namespace_info(&server, name).map(|f| f["held"]);
        (held("a") == Some(third) && held("default") == Some(2 * third - 1)).then_some(())
    });
}
