//! The token is redacted wherever the server shows commands.

use crate::common::*;
use crate::{texts, TOKEN};

const UNKNOWN_AT_4: &str =
    "ERR unknown option at argument 4 (expected WAIT, REENTRANT, SESSION, SYNC, FSYNC, LOCKDELAY, SHARED, LIMIT or LABEL)";

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
        // A refused call redacts every argument after the key.
        &[
            "lock.acquire",
            "k",
            "(redacted)",
            "(redacted)",
            "(redacted)",
        ],
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
        r#""lock.acquire" "k" "(redacted)" "(redacted)" "(redacted)""#,
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
    let configs = fields_map(&c.call(&["CONFIG", "GET", "commandlog*"]));
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
            "ERR unknown option at argument 5 (expected WAIT, REENTRANT, SESSION, SYNC, FSYNC, LOCKDELAY, SHARED, LIMIT or LABEL)",
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

/// Every malformed shape of every command that carries a token, each with [`TOKEN`] somewhere
/// in it: wrong counts, swapped or missing arguments, bad options, a key of another type, a
/// guarded LOCK.* command. Whatever the error, the token shows nowhere.
fn malformed_calls() -> Vec<Vec<String>> {
    let t = TOKEN;
    let long = format!("{TOKEN}{}", "x".repeat(300));
    let shapes: Vec<Vec<&str>> = vec![
        // LOCK.ACQUIRE key token ttl-ms [options]
        vec!["LOCK.ACQUIRE", "k", t, "1000", "BOGUS"],
        vec!["LOCK.ACQUIRE", "k", "1000", t],
        vec!["LOCK.ACQUIRE", "k", t, "soon"],
        vec!["LOCK.ACQUIRE", "k", t, "0"],
        vec!["LOCK.ACQUIRE", "k", t, "-5"],
        vec!["LOCK.ACQUIRE", "k", t, "99999999999999"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "WAIT"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "WAIT", t],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "SESSION", "SESSION"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "SYNC", "1"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "SYNC", t, "10"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "LOCKDELAY", "-1"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "LIMIT", "2", "LIMIT", "3"],
        vec!["LOCK.ACQUIRE", "k", t, "1000", "LIMIT", "0"],
        vec!["LOCK.ACQUIRE", "k", "other", "1000", t],
        vec!["LOCK.ACQUIRE", "k", "other", "1000", "SESSION", t],
        vec!["LOCK.ACQUIRE", "k", &long, "1000"],
        vec!["LOCK.ACQUIRE", "string", t, "1000"],
        vec!["LOCK.ACQUIRE", t],
        // LOCK.RELEASE key token
        vec!["LOCK.RELEASE", "string", t],
        vec!["LOCK.RELEASE", "k", t, "extra"],
        vec!["LOCK.RELEASE", "k", &long],
        // LOCK.RENEW key token ttl-ms [SYNC n ms]
        vec!["LOCK.RENEW", "k", t, "soon"],
        vec!["LOCK.RENEW", "k", "1000", t],
        vec!["LOCK.RENEW", "k", t, "0"],
        vec!["LOCK.RENEW", "k", t, "1000", "BOGUS"],
        vec!["LOCK.RENEW", "k", t, "1000", "SYNC"],
        vec!["LOCK.RENEW", "k", t, "1000", "WAIT", "5"],
        vec!["LOCK.RENEW", "string", t, "1000"],
        // LOCK.MACQUIRE numkeys key [key ...] token ttl-ms [options]
        vec!["LOCK.MACQUIRE", "2", "a", "a", t, "1000"],
        vec!["LOCK.MACQUIRE", "3", "a", "b", t, "1000"],
        vec!["LOCK.MACQUIRE", "1", "a", "b", t, "1000"],
        vec!["LOCK.MACQUIRE", "0", "a", t, "1000"],
        vec!["LOCK.MACQUIRE", "-1", "a", t, "1000"],
        vec!["LOCK.MACQUIRE", "x", "a", t, "1000"],
        vec!["LOCK.MACQUIRE", "1025", "a", t, "1000"],
        vec!["LOCK.MACQUIRE", "2", "a", t, "1000"],
        vec!["LOCK.MACQUIRE", "1", "a", t],
        vec!["LOCK.MACQUIRE", "1", "a", t, "1000", "REENTRANT"],
        vec!["LOCK.MACQUIRE", "1", "a", t, "1000", "SYNC", "1", "10"],
        vec!["LOCK.MACQUIRE", "1", "a", t, "1000", "BOGUS"],
        vec!["LOCK.MACQUIRE", "1", "a", t, "soon"],
        vec!["LOCK.MACQUIRE", "1", "string", t, "1000"],
        vec!["LOCK.MACQUIRE", "1", "a", &long, "1000"],
        // LOCK.MRELEASE numkeys key [key ...] token
        vec!["LOCK.MRELEASE", "2", "a", "a", t],
        vec!["LOCK.MRELEASE", "2", "a", t],
        vec!["LOCK.MRELEASE", "3", "a", "b", t],
        vec!["LOCK.MRELEASE", "0", "a", t],
        vec!["LOCK.MRELEASE", "x", "a", t],
        vec!["LOCK.MRELEASE", "1", "a", t, "extra"],
        vec!["LOCK.MRELEASE", "1", "string", t],
        // LOCK.GUARD key fence command [arg ...]
        vec!["LOCK.GUARD", "k", t, "SET", "x", "y"],
        vec!["LOCK.GUARD", "k", "1", "LOCK.RELEASE", "k", t],
        vec!["LOCK.GUARD", "k", "x", "LOCK.ACQUIRE", "k", t, "1000"],
        vec![
            "LOCK.GUARD",
            "k",
            "1",
            "LOCK.GUARD",
            "k",
            "1",
            "LOCK.RENEW",
            "k",
            t,
            "1000",
        ],
        vec!["LOCK.GUARD", "k", "1", "lock.mrelease", "1", "k", t],
        // A token given by mistake where a fence, a timeout, a count, a client id or a
        // subcommand belongs.
        vec!["LOCK.FENCE", "k", t],
        vec!["LOCK.FENCE", "string", t],
        vec!["LOCK.WAIT", "k", t],
        vec!["LOCK.WHO", "k", "COUNT", t],
        vec!["LOCK.WHO", "k", "CLIENT", t],
        vec!["LOCK.WHO", "k", t],
        vec!["LOCK.LONGHOLDS", "GET", t],
        vec!["LOCK.LONGHOLDS", t],
    ];
    shapes
        .into_iter()
        .map(|shape| shape.into_iter().map(str::to_string).collect())
        .collect()
}

/// Sends every malformed call (each must be refused with an error), directly, inside MULTI and
/// from a script.
fn send_malformed(c: &mut Conn) {
    assert_eq!(c.call(&["SET", "string", "v"]), Reply::status("OK"));
    for call in malformed_calls() {
        let reply = c.call(&call);
        assert!(reply.is_error(), "{call:?} answered {reply:?}");
        assert!(
            !reply.contains_bytes(TOKEN.as_bytes()),
            "{call:?}: {reply:?}"
        );
    }
    for call in malformed_calls() {
        assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
        let queued = c.call(&call);
        let exec = c.call(&["EXEC"]);
        assert!(
            queued.is_error() || exec.items().first().is_some_and(Reply::is_error),
            "{call:?} in MULTI: {queued:?} then {exec:?}"
        );
        assert!(!exec.contains_bytes(TOKEN.as_bytes()), "{call:?}: {exec:?}");
    }
}

#[test]
fn no_malformed_call_shows_the_token_in_monitor_slowlog_commandlog_or_the_log() {
    let server = Server::start_with(Config::default().with("loglevel", "verbose"));
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-max-len", "10000"]),
        Reply::status("OK")
    );
    let commandlog = server.identity().commandlog();
    if commandlog {
        for config in [
            "commandlog-execution-slower-than",
            "commandlog-slow-execution-max-len",
        ] {
            let value = if config.ends_with("than") {
                "0"
            } else {
                "10000"
            };
            assert_eq!(
                c.call(&["CONFIG", "SET", config, value]),
                Reply::status("OK"),
                "{config}"
            );
        }
    }
    let mut monitor = server.conn();
    assert_eq!(monitor.call(&["MONITOR"]), Reply::status("OK"));
    send_malformed(&mut c);
    assert_eq!(
        c.call(&["ECHO", "end-of-malformed"]),
        Reply::bulk("end-of-malformed")
    );
    let lines = monitor_until(&mut monitor, "end-of-malformed");
    let leaked: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(&TOKEN.to_lowercase()))
        .collect();
    assert!(leaked.is_empty(), "token in MONITOR: {leaked:#?}");
    // The calls did show (redacted), so the checks above looked at them.
    assert!(
        lines
            .iter()
            .any(|l| l.contains(r#""lock.mrelease" "2" "(redacted)""#)),
        "{lines:#?}"
    );
    let slowlog = c.call(&["SLOWLOG", "GET", "-1"]);
    assert!(
        slowlog.items().len() > malformed_calls().len(),
        "{slowlog:?}"
    );
    let leaked: Vec<&Reply> = slowlog
        .items()
        .iter()
        .filter(|entry| entry.contains_bytes(TOKEN.as_bytes()))
        .collect();
    assert!(leaked.is_empty(), "token in SLOWLOG: {leaked:#?}");
    if commandlog {
        let log = c.call(&["COMMANDLOG", "GET", "-1", "slow"]);
        assert!(log.items().len() > malformed_calls().len(), "{log:?}");
        assert!(
            !log.contains_bytes(TOKEN.as_bytes()),
            "token in COMMANDLOG: {log:?}"
        );
    }
    assert!(!server.log().contains(TOKEN), "token in the server log");
}

#[test]
fn a_refused_call_redacts_everything_after_its_first_argument_and_a_good_one_only_its_token() {
    let server = Server::start();
    let mut c = server.conn();
    let mut monitor = server.conn();
    assert_eq!(monitor.call(&["MONITOR"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.MRELEASE", "2", "a", TOKEN]),
        Reply::error(
            "ERR invalid numkeys: 2 key(s) then the token need 3 arguments after numkeys, 2 \
             given (the token left out, or numkeys too large?)"
        )
    );
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "2", "a", "b", TOKEN, "1000"]),
        Reply::Array(vec![
            Reply::Int(fence_of(&mut c, "a")),
            Reply::Int(fence_of(&mut c, "b"))
        ])
    );
    assert_eq!(
        c.call(&["LOCK.GUARD", "a", "1", "LOCK.RELEASE", "a", TOKEN]),
        Reply::error("ERR LOCK.GUARD cannot run this command: it is a LOCK.* command")
    );
    let lines = monitor_until(&mut monitor, "\"lock.guard\"");
    for expected in [
        r#""lock.mrelease" "2" "(redacted)" "(redacted)""#,
        r#""lock.macquire" "2" "a" "b" "(redacted)" "1000""#,
        r#""lock.guard" "a" "1" "lock.release" "(redacted)" "(redacted)""#,
    ] {
        assert!(
            lines.iter().any(|l| l.ends_with(expected)),
            "{expected} not in {lines:#?}"
        );
    }
}
