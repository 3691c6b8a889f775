//! Loading the module changes nothing in Redis' own behaviour: keys that are not locks keep
//! their LRU idle time and keyspace statistics however they are renamed, moved, copied or
//! restored, and the module's own work never shows up in SLOWLOG, MONITOR or INFO commandstats.
//! (`make redis-suite` runs Redis' own test suite with the module loaded for the whole picture.)

mod common;

use common::*;

fn stat(server: &Server, field: &str) -> i64 {
    server
        .info_field("stats", field)
        .unwrap_or_else(|| panic!("no INFO field {field}"))
        .parse()
        .expect("integer")
}

/// A string restored with `IDLETIME 1000` keeps that idle time, and renaming, moving and
/// restoring keys counts no keyspace hit or miss (those commands look keys up for writing): with
/// locks in the keyspace, so the module looks at every arriving key, and without.
fn key_events_leave_lru_and_stats_alone(with_locks: bool) {
    let server = Server::start();
    let mut c = server.conn();
    if with_locks {
        acquire(&mut c, "some-lock", "token-1", 60_000);
        acquire(&mut c, "other-lock", "token-2", 60_000);
        assert_eq!(
            c.call(&["LOCK.RELEASE", "other-lock", "token-2"]),
            Reply::Int(1)
        );
    }
    assert_eq!(c.call(&["SET", "plain", "value"]), Reply::status("OK"));
    let Reply::Bulk(payload) = c.call(&["DUMP", "plain"]) else {
        panic!("DUMP");
    };
    let restored = c.call(&[
        &b"RESTORE"[..],
        b"restored",
        b"0",
        &payload,
        b"IDLETIME",
        b"1000",
    ]);
    assert_eq!(restored, Reply::status("OK"));
    let idle = c.call(&["OBJECT", "IDLETIME", "restored"]).int();
    assert!((1000..=1010).contains(&idle), "OBJECT IDLETIME {idle}");
    // (OBJECT itself counts a keyspace hit; what follows looks keys up for writing only.)
    let hits = stat(&server, "keyspace_hits");
    let misses = stat(&server, "keyspace_misses");
    let again = c.call(&[&b"RESTORE"[..], b"again", b"0", &payload]);
    assert_eq!(again, Reply::status("OK"));
    assert_eq!(
        c.call(&["RENAME", "restored", "renamed"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["MOVE", "renamed", "1"]), Reply::Int(1));
    if with_locks {
        assert_eq!(
            c.call(&["RENAME", "other-lock", "lock-renamed"]),
            Reply::status("OK")
        );
    }
    assert_eq!(stat(&server, "keyspace_hits"), hits);
    assert_eq!(stat(&server, "keyspace_misses"), misses);
}

#[test]
fn restore_idletime_and_keyspace_stats_are_untouched_without_locks() {
    key_events_leave_lru_and_stats_alone(false);
}

#[test]
fn restore_idletime_and_keyspace_stats_are_untouched_beside_locks() {
    key_events_leave_lru_and_stats_alone(true);
}

#[test]
fn a_restored_and_renamed_lock_keeps_its_idle_time_and_its_lease() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "held", "token", 400);
    let Reply::Bulk(payload) = c.call(&["DUMP", "held"]) else {
        panic!("DUMP");
    };
    assert_eq!(c.call(&["DEL", "held"]), Reply::Int(1));
    let restored = c.call(&[
        &b"RESTORE"[..],
        b"held",
        b"0",
        &payload,
        b"IDLETIME",
        b"500",
    ]);
    assert_eq!(restored, Reply::status("OK"));
    let idle = c.call(&["OBJECT", "IDLETIME", "held"]).int();
    assert!((500..=510).contains(&idle), "OBJECT IDLETIME {idle}");
    assert_eq!(c.call(&["RENAME", "held", "moved"]), Reply::status("OK"));
    // The module found the lease under its new name: it expires without being touched.
    wait_for("the renamed lease to expire", || {
        (server.info_int("lock_expired") == 1).then_some(())
    });
    assert_eq!(state_of(&mut c, "moved"), "free");
}

/// Entries of SLOWLOG GET as their argument lists.
fn slowlog(c: &mut Conn) -> Vec<Vec<String>> {
    c.call(&["SLOWLOG", "GET", "100"])
        .items()
        .iter()
        .map(|entry| entry.items()[3].items().iter().map(Reply::text).collect())
        .collect()
}

fn commandstat_calls(server: &Server, command: &str) -> i64 {
    server
        .info_field("commandstats", &format!("cmdstat_{command}"))
        .and_then(|v| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls=").map(str::to_string))
        })
        .map_or(0, |calls| calls.parse().expect("calls"))
}

#[test]
fn configuration_checks_leave_no_trace_in_slowlog_monitor_or_commandstats() {
    let server = Server::start();
    let mut c = server.conn();
    let mut monitor = server.conn();
    assert_eq!(monitor.call(&["MONITOR"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]), Reply::status("OK"));
    let config_sets = commandstat_calls(&server, "config|set");
    let config_gets = commandstat_calls(&server, "config|get");
    // Each CONFIG SET makes the module re-check the settings that endanger locks.
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]),
        Reply::status("OK")
    );
    wait_for("the eviction warning", || {
        (server.info_int("lock_warning_eviction_policy") == 1).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        Reply::status("OK")
    );
    wait_for("the eviction warning to clear", || {
        (server.info_int("lock_warning_eviction_policy") == 0).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "yes"]),
        Reply::status("OK")
    );
    wait_for("the persistence warning to clear", || {
        (server.info_int("lock_warning_no_persistence") == 0).then_some(())
    });
    // Only the three CONFIG SETs above ran CONFIG.
    assert_eq!(commandstat_calls(&server, "config|set"), config_sets + 3);
    assert_eq!(commandstat_calls(&server, "config|get"), config_gets);
    let entries = slowlog(&mut c);
    let foreign: Vec<&Vec<String>> = entries
        .iter()
        .filter(|args| {
            !(args[0].eq_ignore_ascii_case("config") && args[1].eq_ignore_ascii_case("set")
                || args[0].eq_ignore_ascii_case("info")
                || args[0].eq_ignore_ascii_case("slowlog"))
        })
        .collect();
    assert!(
        foreign.is_empty(),
        "SLOWLOG has commands nobody sent: {foreign:?}"
    );
    // MONITOR: a marker command, then nothing but what this test sent before it.
    assert_eq!(c.call(&["ECHO", "marker"]), Reply::bulk("marker"));
    monitor.set_timeout(PATIENCE);
    loop {
        let line = monitor.read().text();
        if line.contains("\"ECHO\" \"marker\"") {
            break;
        }
        assert!(
            !line.contains("\"CONFIG\" \"GET\"") && !line.contains("lua") && !line.contains("?:0"),
            "MONITOR shows the module's own command: {line}"
        );
    }
}
