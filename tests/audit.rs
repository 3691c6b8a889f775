//! The audit log: LOCK.FORCERELEASE, CONFIG SET of `lock.*` and SYNC take-backs are written to
//! the server log at notice level with who did it and the key, never the token.

mod common;

use common::*;

const TOKEN: &str = "tok-audit-5ecr3t-91c2";

/// The log's `lock audit:` lines, waited for until one contains `needle`.
fn audit_line(server: &Server, needle: &str) -> String {
    wait_for(needle, || {
        server
            .log()
            .lines()
            .filter(|l| l.contains("lock audit:"))
            .find(|l| l.contains(needle))
            .map(str::to_string)
    })
}

#[test]
fn force_release_is_logged_with_the_operator_the_holder_and_the_key() {
    let server = Server::start();
    let mut app = server.conn();
    app.call(&["CLIENT", "SETNAME", "app-1"]);
    let (app_addr, app_id) = client_addr_and_id(&mut app);
    let fence = acquire_with(&mut app, "orders:42", TOKEN, 60_000, &["LABEL", "host-7"]).int();
    let mut ops = server.conn();
    ops.call(&["CLIENT", "SETNAME", "oncall"]);
    let (ops_addr, ops_id) = client_addr_and_id(&mut ops);
    assert_eq!(ops.call(&["LOCK.FORCERELEASE", "orders:42"]), Reply::Int(1));
    let line = audit_line(&server, "LOCK.FORCERELEASE 'orders:42'");
    let expected = format!(
        "lock audit: LOCK.FORCERELEASE 'orders:42' ended fence {fence} (granted to id={app_id} \
         name='app-1' addr='{app_addr}' label='host-7', held "
    );
    assert!(line.contains(&expected), "{line}");
    assert!(
        line.ends_with(&format!(
            "by id={ops_id} name=oncall addr={ops_addr} user=default"
        )),
        "{line}"
    );
    assert_eq!(ops.call(&["LOCK.FORCERELEASE", "free:1"]), Reply::Int(0));
    let line = audit_line(&server, "'free:1'");
    assert!(
        line.contains("LOCK.FORCERELEASE 'free:1' found no holder by id="),
        "{line}"
    );
    assert!(!server.log().contains(TOKEN));
}

#[test]
fn config_changes_of_lock_settings_are_logged_with_who_made_them() {
    let server = Server::start();
    let mut ops = server.conn();
    ops.call(&["CLIENT", "SETNAME", "tuner"]);
    let (addr, id) = client_addr_and_id(&mut ops);
    assert_eq!(
        ops.call(&["CONFIG", "SET", "lock.long-hold", "2500"]),
        Reply::status("OK")
    );
    let line = audit_line(&server, "CONFIG SET lock.long-hold");
    if server.identity().filter_knows_the_client() {
        assert!(
            line.ends_with(&format!(
                "CONFIG SET lock.long-hold from 0 to 2500 by id={id} name=tuner addr={addr} \
                 user=default"
            )),
            "{line}"
        );
    } else {
        assert!(
            line.ends_with(
                "CONFIG SET lock.long-hold from 0 to 2500 by a client this server does not \
                 name to modules"
            ),
            "{line}"
        );
        assert!(server
            .log()
            .contains("lock audit: this server does not tell modules who runs CONFIG SET"));
    }
    // A refused value changes nothing and logs nothing; other configs are not logged.
    assert!(matches!(
        ops.call(&["CONFIG", "SET", "lock.long-hold", "-1"]),
        Reply::Error(_)
    ));
    assert_eq!(
        ops.call(&["CONFIG", "SET", "maxmemory", "0"]),
        Reply::status("OK")
    );
    assert_eq!(
        ops.call(&["CONFIG", "SET", "lock.tombstone-ttl", "5000"]),
        Reply::status("OK")
    );
    audit_line(&server, "CONFIG SET lock.tombstone-ttl from 10000 to 5000");
    // Two settings in one call: each line names the caller.
    assert_eq!(
        ops.call(&[
            "CONFIG",
            "SET",
            "lock.max-waiters",
            "500",
            "lock.lock-delay",
            "10"
        ]),
        Reply::status("OK")
    );
    for name in [
        "lock.max-waiters from 1000 to 500",
        "lock.lock-delay from 0 to 10",
    ] {
        let line = audit_line(&server, name);
        if server.identity().filter_knows_the_client() {
            assert!(line.contains(&format!("by id={id} name=tuner")), "{line}");
        }
    }
    let lines = server.log();
    let audits: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("lock audit: CONFIG SET"))
        .collect();
    assert_eq!(audits.len(), 4, "{audits:?}");
}

#[test]
fn a_sync_take_back_is_logged_with_the_grant_it_undid() {
    let server = Server::start();
    let mut c = server.conn();
    let (addr, id) = client_addr_and_id(&mut c);
    let reply = c.call(&[
        "LOCK.ACQUIRE",
        "k",
        TOKEN,
        "60000",
        "SYNC",
        "1",
        "100",
        "LABEL",
        "sync-me",
    ]);
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("NOREPLICAS")),
        "{reply:?}"
    );
    let line = audit_line(&server, "SYNC grant of 'k' taken back");
    assert!(
        line.contains(&format!(
            "(granted to id={id} name='' addr='{addr}' label='sync-me', held "
        )),
        "{line}"
    );
    assert!(!server.log().contains(TOKEN));
}
