//! The token is redacted wherever the server shows commands.

use crate::common::*;
use crate::{fields_of, texts, TOKEN};

const UNKNOWN_AT_4: &str =
    "ERR unknown option at argument 4 (expected WAIT, REENTRANT, SESSION, SYNC, LOCKDELAY, SHARED or LIMIT)";

/// Runs acquire, renew, refused acquires (an unknown option; the token put in an option's place
/// by mistake), info, fence and release of `k` with [`TOKEN`].
fn token_workout(c: &mut Conn, k: &str) {
    let fence = acquire(c, k, TOKEN, 60_000);
    assert_eq!(c.call(&["LOCK.RENEW", k, TOKEN, "60000"]), Reply::Int(1));
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", k, TOKEN, "60000", "BOGUS"]),
        Reply::error(UNKNOWN_AT_4)
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", k, "other", "60000", TOKEN]),
        Reply::error(UNKNOWN_AT_4)
    );
    assert!(!c.call(&["LOCK.INFO", k]).contains_bytes(TOKEN.as_bytes()));
    assert_eq!(
        c.call(&["LOCK.FENCE", k, &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(c.call(&["LOCK.RELEASE", k, TOKEN]), Reply::Int(1));
    // A shared hold and a permit beside other holders: their effects carry the holders' tokens.
    for (key, mode) in [("shared", &["SHARED"][..]), ("permits", &["LIMIT", "3"])] {
        for token in ["other", TOKEN] {
            assert!(acquire_with(c, key, token, 60_000, mode).is_int());
        }
        assert_eq!(c.call(&["LOCK.RENEW", key, TOKEN, "60000"]), Reply::Int(1));
        assert_eq!(c.call(&["LOCK.RELEASE", key, TOKEN]), Reply::Int(1));
        assert_eq!(c.call(&["LOCK.FORCERELEASE", key]), Reply::Int(1));
    }
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
    assert_log_redacted(&c.call(&["SLOWLOG", "GET", "100"]));
}

/// `log` (SLOWLOG GET or COMMANDLOG GET: entries of id, time, duration, arguments, ...) holds
/// the workout's commands with the token replaced, and the token nowhere.
fn assert_log_redacted(log: &Reply) {
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
        &["lock.acquire", "k", "(redacted)", "60000", "(redacted)"],
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
        r#""lock.acquire" "k" "(redacted)" "60000" "(redacted)""#,
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
    assert_eq!(
        info.items()[0] != Reply::Nil,
        server.identity().commandlog(),
        "{info:?}"
    );
    if info.items()[0] == Reply::Nil {
        // Redis and Valkey before 8.1 have no COMMANDLOG (only SLOWLOG, tested above).
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
    assert_log_redacted(&c.call(&["COMMANDLOG", "GET", "100", "slow"]));
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
    let cases: [(&[&str], &str); 7] = [
        (&["LOCK.ACQUIRE", "k", TOKEN, "1000", "BOGUS"], UNKNOWN_AT_4),
        // The token where an option belongs.
        (
            &["LOCK.ACQUIRE", "k", "other", "1000", "SESSION", TOKEN],
            "ERR unknown option at argument 5 (expected WAIT, REENTRANT, SESSION, SYNC, LOCKDELAY, SHARED or LIMIT)",
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
