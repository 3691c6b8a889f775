//! The LOCK.* commands against a real server: replies, errors, and that bad input changes nothing.

mod common;

use common::*;

#[test]
fn module_loads_as_lock_with_the_lockstate_type() {
    let server = Server::start();
    let mut c = server.conn();
    // Newer servers list their built-in modules too, in no fixed order.
    let modules = c.call(&["MODULE", "LIST"]);
    let lock = modules
        .items()
        .iter()
        .map(Reply::items)
        .find(|fields| fields[0] == Reply::bulk("name") && fields[1] == Reply::bulk("lock"));
    let lock = lock.unwrap_or_else(|| panic!("no module named lock in {modules:?}"));
    assert_eq!(lock[2], Reply::bulk("ver"));
    // MODULE LIST's version: major * 10000 + minor * 100 + patch of the crate's version.
    let version: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|part| part.parse().unwrap())
        .collect();
    assert_eq!(
        lock[3],
        Reply::Int(version[0] * 10_000 + version[1] * 100 + version[2])
    );
    assert_eq!(lock[3], Reply::Int(200));
    acquire(&mut c, "k", "tok", 1000);
    assert_eq!(c.call(&["TYPE", "k"]), Reply::status("lockstate"));
}

#[test]
fn acquire_free_lock_returns_positive_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "tok", 10_000);
    assert!(fence > 0);
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k"), fence);
}

#[test]
fn acquire_held_lock_with_other_token_returns_nil() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["LOCK.ACQUIRE", "k", "b", "10000"]), Reply::Nil);
    assert_eq!(fence_of(&mut c, "k"), fence);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
}

#[test]
fn same_token_reacquire_returns_same_fence_and_refreshes_lease() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 1_000);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "a", "60000"]),
        Reply::Int(fence)
    );
    let ttl = lock_field(&mut c, "k", "ttl").int();
    assert!(ttl > 59_000 && ttl <= 60_000, "ttl {ttl}");
    assert_eq!(lock_field(&mut c, "k", "holds"), Reply::Int(1));
}

#[test]
fn reentrant_acquire_counts_holds_and_release_drops_one_at_a_time() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "a", "10000", "REENTRANT"]),
        Reply::Int(fence)
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "a", "10000", "reentrant"]),
        Reply::Int(fence)
    );
    assert_eq!(lock_field(&mut c, "k", "holds"), Reply::Int(3));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(lock_field(&mut c, "k", "holds"), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
}

#[test]
fn release_with_wrong_token_keeps_lock() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(0));
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
}

#[test]
fn release_of_missing_key_replies_zero_and_creates_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(c.call(&["LOCK.RELEASE", "nokey", "a"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RENEW", "nokey", "a", "1000"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "nokey"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.FENCE", "nokey", "1"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.INFO", "nokey"]), Reply::Nil);
    assert_eq!(c.call(&["EXISTS", "nokey"]), Reply::Int(0));
}

#[test]
fn released_lock_is_free_and_next_grant_has_larger_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(lock_field(&mut c, "k", "ttl"), Reply::Int(-1));
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &first.to_string()]),
        Reply::Int(0)
    );
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
}

#[test]
fn renew_extends_lease_only_for_holder() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 1_000);
    assert_eq!(c.call(&["LOCK.RENEW", "k", "b", "60000"]), Reply::Int(0));
    assert!(lock_field(&mut c, "k", "ttl").int() <= 1_000);
    assert_eq!(c.call(&["LOCK.RENEW", "k", "a", "60000"]), Reply::Int(1));
    let ttl = lock_field(&mut c, "k", "ttl").int();
    assert!(ttl > 59_000 && ttl <= 60_000, "ttl {ttl}");
}

#[test]
fn fence_check_accepts_only_current_holders_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let old = acquire(&mut c, "k", "a", 10_000);
    c.call(&["LOCK.RELEASE", "k", "a"]);
    let current = acquire(&mut c, "k", "b", 10_000);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &current.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &old.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &(current + 1).to_string()]),
        Reply::Int(0)
    );
}

#[test]
fn force_release_frees_any_holder_and_next_fence_is_larger() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 10_000);
    c.call(&["LOCK.ACQUIRE", "k", "a", "10000", "REENTRANT"]);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first);
}

#[test]
fn info_replies_flat_array_in_resp2_and_map_in_resp3_without_token() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "secret-token-123", 10_000);
    let resp2 = c.call(&["LOCK.INFO", "k"]);
    let items = resp2.items();
    assert_eq!(items.len(), 26);
    let names: Vec<String> = items.iter().step_by(2).map(Reply::text).collect();
    assert_eq!(
        names,
        [
            "state",
            "fence",
            "ttl",
            "holds",
            "waiters",
            "session",
            "lock_delay",
            "delay_ttl",
            "mode",
            "holders",
            "limit",
            "waiters_exclusive",
            "waiters_shared"
        ]
    );
    assert_eq!(items[1], Reply::status("held"));
    assert_eq!(items[3], Reply::Int(fence));
    assert_eq!(items[7], Reply::Int(1));
    assert_eq!(items[9], Reply::Int(0));
    assert_eq!(items[11], Reply::Int(0));
    assert_eq!(items[13], Reply::Int(0));
    assert_eq!(items[15], Reply::Int(-1));
    assert_eq!(items[17], Reply::status("exclusive"));
    assert_eq!(items[19], Reply::Int(1));
    assert_eq!(items[21], Reply::Int(0));
    assert_eq!(items[23], Reply::Int(0));
    assert_eq!(items[25], Reply::Int(0));
    assert!(!resp2.contains_bytes(b"secret-token-123"));

    let mut c3 = server.conn3();
    let resp3 = c3.call(&["LOCK.INFO", "k"]);
    let Reply::Map(pairs) = &resp3 else {
        panic!("expected a map, got {resp3:?}")
    };
    assert_eq!(pairs.len(), 13);
    assert_eq!(pairs[0], (Reply::status("state"), Reply::status("held")));
    assert_eq!(pairs[1], (Reply::status("fence"), Reply::Int(fence)));
    assert!(!resp3.contains_bytes(b"secret-token-123"));
    assert_eq!(c3.call(&["LOCK.INFO", "missing"]), Reply::Nil);
    assert_eq!(c3.call(&["LOCK.ACQUIRE", "k", "other", "1000"]), Reply::Nil);
}

#[test]
fn binary_tokens_are_compared_byte_for_byte() {
    let server = Server::start();
    let mut c = server.conn();
    let token: &[u8] = b"\x00\xff\r\nbin\x00";
    let reply = c.call(&[&b"LOCK.ACQUIRE"[..], b"k", token, b"10000"]);
    assert!(matches!(reply, Reply::Int(f) if f > 0), "{reply:?}");
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"k", b"\x00\xff\r\nbin"]),
        Reply::Int(0)
    );
    assert_eq!(c.call(&[&b"LOCK.RELEASE"[..], b"k", token]), Reply::Int(1));
}

/// Runs `args` and checks it fails with `error` while the key's state and digest stay as they
/// were.
fn assert_refused(c: &mut Conn, args: &[&str], error: &str) {
    let before = (lock_info(c, "k"), digest_value(c, "k"), c.call(&["DBSIZE"]));
    assert_eq!(c.call(args), Reply::error(error), "{args:?}");
    let after = (lock_info(c, "k"), digest_value(c, "k"), c.call(&["DBSIZE"]));
    // ttl moves with the clock; compare everything else.
    let strip = |s: &(Option<Vec<(String, Reply)>>, String, Reply)| {
        let info = s.0.as_ref().map(|i| {
            i.iter()
                .filter(|(n, _)| n != "ttl")
                .cloned()
                .collect::<Vec<_>>()
        });
        (info, s.1.clone(), s.2.clone())
    };
    assert_eq!(strip(&before), strip(&after), "{args:?} changed state");
}

#[test]
fn bad_ttl_is_refused_naming_the_argument_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    for (ttl, error) in [
        ("0", "ERR invalid ttl-ms: must be positive"),
        ("-5", "ERR invalid ttl-ms: must be positive"),
        ("abc", "ERR invalid ttl-ms: not an integer"),
        ("1.5", "ERR invalid ttl-ms: not an integer"),
        ("", "ERR invalid ttl-ms: not an integer"),
        (" 10", "ERR invalid ttl-ms: not an integer"),
        ("99999999999999999999", "ERR invalid ttl-ms: not an integer"),
        (
            "86400001",
            "ERR invalid ttl-ms: exceeds lock.max-ttl (86400000)",
        ),
    ] {
        assert_refused(&mut c, &["LOCK.ACQUIRE", "k", "a", ttl], error);
        assert_refused(&mut c, &["LOCK.ACQUIRE", "k2", "a", ttl], error);
        assert_refused(&mut c, &["LOCK.RENEW", "k", "a", ttl], error);
    }
    assert_eq!(c.call(&["EXISTS", "k2"]), Reply::Int(0));
}

#[test]
fn bad_tokens_and_options_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 10_000);
    let long = "x".repeat(257);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["LOCK.ACQUIRE", "k", "", "1000"],
            "ERR invalid token: must not be empty",
        ),
        (
            vec!["LOCK.RELEASE", "k", ""],
            "ERR invalid token: must not be empty",
        ),
        (
            vec!["LOCK.RENEW", "k", "", "1000"],
            "ERR invalid token: must not be empty",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", &long, "1000"],
            "ERR invalid token: longer than lock.max-token-len (256 bytes)",
        ),
        (
            vec!["LOCK.RELEASE", "k", &long],
            "ERR invalid token: longer than lock.max-token-len (256 bytes)",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "FOO"],
            "ERR unknown option at argument 4 (expected WAIT, REENTRANT, SESSION, SYNC, FSYNC, LOCKDELAY, SHARED, LIMIT or LABEL)",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "REENTRANT", "REENTRANT"],
            "ERR option REENTRANT given more than once",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "WAIT"],
            "ERR invalid timeout-ms: missing after WAIT",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "WAIT", "x"],
            "ERR invalid timeout-ms: not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "WAIT", "-1"],
            "ERR invalid timeout-ms: must not be negative",
        ),
        (
            vec!["LOCK.FENCE", "k", "0"],
            "ERR invalid fence: must be a positive integer",
        ),
        (
            vec!["LOCK.FENCE", "k", "-3"],
            "ERR invalid fence: must be a positive integer",
        ),
        (
            vec!["LOCK.FENCE", "k", "abc"],
            "ERR invalid fence: must be a positive integer",
        ),
    ];
    for (args, error) in cases {
        assert_refused(&mut c, &args, error);
    }
    assert_eq!(state_of(&mut c, "k"), "held");
}

#[test]
fn wrong_arity_gets_the_standard_error() {
    let server = Server::start();
    let mut c = server.conn();
    for (args, name) in [
        (vec!["LOCK.ACQUIRE", "k", "t"], "lock.acquire"),
        (vec!["LOCK.RELEASE", "k"], "lock.release"),
        (vec!["LOCK.RELEASE", "k", "t", "x"], "lock.release"),
        (vec!["LOCK.RENEW", "k", "t"], "lock.renew"),
        (vec!["LOCK.FENCE", "k"], "lock.fence"),
        (vec!["LOCK.INFO"], "lock.info"),
        (vec!["LOCK.INFO", "k", "x"], "lock.info"),
        (vec!["LOCK.FORCERELEASE"], "lock.forcerelease"),
    ] {
        let expected = format!("ERR wrong number of arguments for '{name}' command");
        assert_eq!(c.call(&args), Reply::Error(expected), "{args:?}");
    }
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(0));
}

#[test]
fn other_types_get_wrongtype_and_stay_untouched() {
    let server = Server::start();
    let mut c = server.conn();
    c.call(&["SET", "s", "value"]);
    let wrongtype =
        Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value");
    for args in [
        vec!["LOCK.ACQUIRE", "s", "t", "1000"],
        vec!["LOCK.RELEASE", "s", "t"],
        vec!["LOCK.RENEW", "s", "t", "1000"],
        vec!["LOCK.FENCE", "s", "1"],
        vec!["LOCK.INFO", "s"],
        vec!["LOCK.FORCERELEASE", "s"],
    ] {
        assert_eq!(c.call(&args), wrongtype, "{args:?}");
    }
    assert_eq!(c.call(&["GET", "s"]), Reply::bulk("value"));
    acquire(&mut c, "k", "t", 1000);
    assert_eq!(c.call(&["GET", "k"]), wrongtype);
}

#[test]
fn apply_is_refused_from_clients() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&[
            "LOCK.APPLY",
            "k",
            "acquire",
            "5",
            "5",
            "tok",
            "99999999999999",
            "1",
            "0"
        ]),
        Reply::error(
            "ERR LOCK.APPLY is internal: only the replication link and AOF loading may send it"
        )
    );
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    assert_eq!(
        c.call(&["LOCK.FLOOR", "9000000000000000000"]),
        Reply::error(
            "ERR LOCK.FLOOR is internal: only the replication link and AOF loading may send it"
        )
    );
    let fence = acquire(&mut c, "k", "t", 1000);
    assert!(fence < 9_000_000_000_000_000_000, "{fence}");
}

#[test]
fn max_ttl_and_max_token_len_are_configs() {
    let server = Server::start_with(Config::default().module_arg("max-ttl").module_arg("5000"));
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "GET", "lock.max-ttl"]),
        Reply::Array(vec![Reply::bulk("lock.max-ttl"), Reply::bulk("5000")])
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "5001"]),
        Reply::error("ERR invalid ttl-ms: exceeds lock.max-ttl (5000)")
    );
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.max-ttl", "10000"]),
        Reply::status("OK")
    );
    acquire(&mut c, "k", "t", 10_000);
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.max-token-len", "4"]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k2", "12345", "100"]),
        Reply::error("ERR invalid token: longer than lock.max-token-len (4 bytes)")
    );
    let refused = c.call(&["CONFIG", "SET", "lock.max-ttl", "0"]);
    assert!(matches!(refused, Reply::Error(_)), "{refused:?}");
    assert_eq!(
        c.call(&["CONFIG", "GET", "lock.max-ttl"]),
        Reply::Array(vec![Reply::bulk("lock.max-ttl"), Reply::bulk("10000")])
    );
}

#[test]
fn unknown_module_argument_refuses_to_load() {
    let config = Config::default().module_arg("max-tll").module_arg("5");
    let result = std::panic::catch_unwind(|| Server::start_with(config));
    assert!(
        result.is_err(),
        "server started with a misspelt module argument"
    );
}

#[test]
fn command_docs_and_getkeys_know_the_key() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["COMMAND", "GETKEYS", "LOCK.ACQUIRE", "mykey", "tok", "100"]),
        Reply::Array(vec![Reply::bulk("mykey")])
    );
    assert_eq!(
        c.call(&["COMMAND", "GETKEYS", "LOCK.FENCE", "k2", "5"]),
        Reply::Array(vec![Reply::bulk("k2")])
    );
    let docs = c.call(&["COMMAND", "DOCS", "LOCK.RELEASE"]);
    assert!(docs.contains_bytes(b"Drops one hold"), "{docs:?}");
    let info = c.call(&["COMMAND", "INFO", "LOCK.FENCE"]);
    assert!(info.contains_bytes(b"readonly"), "{info:?}");
}

#[test]
fn tokens_are_redacted_from_slowlog() {
    let server = Server::start_with(Config::default().with("slowlog-log-slower-than", "0"));
    let mut c = server.conn();
    acquire(&mut c, "k", "very-secret-token", 10_000);
    c.call(&["LOCK.RENEW", "k", "very-secret-token", "10000"]);
    c.call(&["LOCK.RELEASE", "k", "very-secret-token"]);
    let log = c.call(&["SLOWLOG", "GET", "100"]);
    assert!(
        log.contains_bytes(b"LOCK.ACQUIRE") || log.contains_bytes(b"lock.acquire"),
        "{log:?}"
    );
    assert!(!log.contains_bytes(b"very-secret-token"), "{log:?}");
}
