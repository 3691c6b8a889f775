//! LOCK.LIST: every lock held or waited for, a page at a time with SCAN's cursor: the fields of
//! an entry (never a token), the filters (NAMESPACE, OLDER, WAITING), COUNT, the errors, the
//! caller's ACL, and SCAN's guarantee under concurrent changes (a lock held from the first call
//! to the last is listed at least once).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;

const POLICY: &str = "orders prefix=orders: mode=enforce; batch prefix=batch: mode=warn";

/// One call: the next cursor and the entries, each as a map.
fn page(c: &mut Conn, args: &[&str]) -> (String, Vec<BTreeMap<String, Reply>>) {
    let mut call = vec!["LOCK.LIST"];
    call.extend_from_slice(args);
    let reply = c.call(&call);
    let items = reply.items();
    assert_eq!(items.len(), 2, "{reply:?}");
    let entries = items[1].items().iter().map(fields_map).collect();
    (items[0].text(), entries)
}

/// A whole iteration from cursor 0: every entry, by key (a key listed twice keeps its last).
fn all(c: &mut Conn, extra: &[&str]) -> BTreeMap<String, BTreeMap<String, Reply>> {
    let mut cursor = "0".to_string();
    let mut found = BTreeMap::new();
    for _ in 0..100_000 {
        let mut args = vec![cursor.as_str()];
        args.extend_from_slice(extra);
        let (next, entries) = page(c, &args);
        for entry in entries {
            found.insert(entry["key"].text(), entry);
        }
        if next == "0" {
            return found;
        }
        cursor = next;
    }
    panic!("the iteration never ended");
}

fn int(reply: &Reply) -> i64 {
    match reply {
        Reply::Int(n) => *n,
        other => panic!("an integer, not {other:?}"),
    }
}

#[test]
fn every_lock_held_or_waited_for_is_listed_with_its_fields_and_no_token() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    let exclusive = [
        "LOCK.ACQUIRE",
        "orders:1",
        "secret-token-1",
        "60000",
        "LABEL",
        "checkout",
    ];
    assert!(c.call(&exclusive).is_int());
    for (token, label) in [("secret-token-2", "a"), ("secret-token-3", "b")] {
        let shared = [
            "LOCK.ACQUIRE",
            "batch:1",
            token,
            "60000",
            "SHARED",
            "LABEL",
            label,
        ];
        assert!(c.call(&shared).is_int());
    }
    let permit = [
        "LOCK.ACQUIRE",
        "sem",
        "secret-token-4",
        "60000",
        "LIMIT",
        "3",
    ];
    assert!(c.call(&permit).is_int());
    // Not listed: a free lock nobody waits for, and a key of another type.
    acquire(&mut c, "was-held", "secret-token-5", 60_000);
    assert_eq!(
        c.call(&["LOCK.RELEASE", "was-held", "secret-token-5"]),
        Reply::Int(1)
    );
    assert_eq!(c.call(&["SET", "plain", "x"]), Reply::status("OK"));
    let _waiter = queue_waiter(&server, "orders:1", "secret-token-6", 60_000, 60_000);

    let raw = c.call(&["LOCK.LIST", "0", "COUNT", "1000"]);
    assert!(!format!("{raw:?}").contains("secret-token"), "{raw:?}");
    let found = all(&mut c, &["COUNT", "3"]);
    assert_eq!(
        found.keys().cloned().collect::<Vec<_>>(),
        ["batch:1", "orders:1", "sem"]
    );
    let orders = &found["orders:1"];
    assert_eq!(orders["namespace"], Reply::bulk("orders"));
    assert_eq!(orders["mode"], Reply::status("exclusive"));
    assert_eq!(orders["holders"], Reply::Int(1));
    assert_eq!(
        orders["labels"],
        Reply::Array(vec![Reply::bulk("checkout")])
    );
    assert_eq!(orders["waiters"], Reply::Int(1));
    assert!((0..60_000).contains(&int(&orders["held_ms"])), "{orders:?}");
    assert!(
        (0..60_000).contains(&int(&orders["waited_ms"])),
        "{orders:?}"
    );
    let batch = &found["batch:1"];
    assert_eq!(batch["mode"], Reply::status("shared"));
    assert_eq!(batch["holders"], Reply::Int(2));
    assert_eq!(
        batch["labels"],
        Reply::Array(vec![Reply::bulk("a"), Reply::bulk("b")])
    );
    assert_eq!(
        (batch["waiters"].clone(), batch["waited_ms"].clone()),
        (Reply::Int(0), Reply::Int(0))
    );
    let sem = &found["sem"];
    assert_eq!(sem["namespace"], Reply::bulk("default"));
    assert_eq!(sem["mode"], Reply::status("semaphore"));
    assert_eq!(sem["labels"], Reply::Array(vec![]));
    // Without a policy, no namespace.
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", ""]),
        Reply::status("OK")
    );
    assert_eq!(all(&mut c, &[])["sem"]["namespace"], Reply::Nil);
}

#[test]
fn filters_keep_a_namespace_old_holds_or_locks_with_waiters() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    acquire(&mut c, "orders:old", "t", 60_000);
    acquire(&mut c, "batch:old", "t", 60_000);
    wait_for("the first holds to be 300 ms old", || {
        let found = all(&mut c, &["OLDER", "300"]);
        (found.len() == 2).then_some(())
    });
    acquire(&mut c, "orders:new", "t", 60_000);
    acquire(&mut c, "elsewhere", "t", 60_000);
    let _waiter = queue_waiter(&server, "orders:new", "u", 60_000, 60_000);
    let keys = |found: BTreeMap<String, _>| found.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(all(&mut c, &["NAMESPACE", "orders"])),
        ["orders:new", "orders:old"]
    );
    assert_eq!(keys(all(&mut c, &["NAMESPACE", "default"])), ["elsewhere"]);
    assert_eq!(
        keys(all(&mut c, &["OLDER", "300"])),
        ["batch:old", "orders:old"]
    );
    assert_eq!(keys(all(&mut c, &["WAITING"])), ["orders:new"]);
    assert_eq!(
        keys(all(&mut c, &["WAITING", "NAMESPACE", "batch"])),
        Vec::<String>::new()
    );
    assert_eq!(
        keys(all(
            &mut c,
            &["count", "1", "namespace", "orders", "older", "300"]
        )),
        ["orders:old"]
    );
}

#[test]
fn bad_arguments_are_refused_with_clear_errors() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    let cases: [(&[&str], &str); 9] = [
        (
            &["LOCK.LIST"],
            "ERR wrong number of arguments for 'lock.list' command",
        ),
        (
            &["LOCK.LIST", "x"],
            "ERR invalid cursor: not an unsigned integer",
        ),
        (
            &["LOCK.LIST", "-1"],
            "ERR invalid cursor: not an unsigned integer",
        ),
        (
            &["LOCK.LIST", "0", "COUNT", "0"],
            "ERR invalid count: must be between 1 and 10000",
        ),
        (&["LOCK.LIST", "0", "COUNT"], "ERR invalid count: missing"),
        (
            &["LOCK.LIST", "0", "OLDER", "-5"],
            "ERR invalid older-ms: must not be negative",
        ),
        (
            &["LOCK.LIST", "0", "WAITING", "WAITING"],
            "ERR option WAITING given more than once",
        ),
        (
            &["LOCK.LIST", "0", "secret-token"],
            "ERR unknown option at argument 2 (expected NAMESPACE, OLDER, WAITING or COUNT)",
        ),
        (
            &["LOCK.LIST", "0", "NAMESPACE", "nope"],
            "ERR no such namespace in lock.namespaces (LOCK.POLICY LIST names them)",
        ),
    ];
    for (args, error) in cases {
        assert_eq!(c.call(args), Reply::error(error), "{args:?}");
    }
}

#[test]
fn a_user_sees_only_the_keys_its_acl_lets_it_read() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    for key in ["orders:1", "orders:2", "batch:1", "other"] {
        acquire(&mut c, key, "t", 60_000);
    }
    let setuser = [
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~orders:*",
        "%W~other",
        "+@all",
    ];
    assert_eq!(c.call(&setuser), Reply::status("OK"));
    let mut app = server.conn();
    assert_eq!(app.call(&["AUTH", "app", "pw"]), Reply::status("OK"));
    // "other" is writable only: not readable, so not listed.
    let seen = all(&mut app, &["COUNT", "100"]);
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        ["orders:1", "orders:2"]
    );
    assert_eq!(all(&mut c, &[]).len(), 4);
}

#[test]
fn a_lock_held_for_the_whole_iteration_is_listed_whatever_changes_meanwhile() {
    let server = Server::start();
    let mut c = server.conn();
    const STEADY: usize = 2_000;
    for i in 0..STEADY {
        c.send(&["LOCK.ACQUIRE", &format!("steady:{i}"), "t", "600000"]);
    }
    for _ in 0..STEADY {
        assert!(c.read().is_int());
    }
    let mut other = server.conn();
    let mut cursor = "0".to_string();
    let mut seen = BTreeSet::new();
    let mut round = 0;
    loop {
        let (next, entries) = page(&mut c, &[&cursor, "COUNT", "50"]);
        seen.extend(entries.into_iter().map(|e| e["key"].text()));
        // Between calls: locks come and go, others are deleted, the keyspace grows (the server
        // rehashes its table meanwhile).
        for i in 0..100 {
            let key = format!("churn:{round}:{i}");
            acquire(&mut other, &key, "t", 600_000);
            if i % 2 == 0 {
                assert_eq!(other.call(&["LOCK.RELEASE", &key, "t"]), Reply::Int(1));
            }
        }
        if round < 8 {
            // The keyspace grows to 8 times its size over the first calls: the server rehashes
            // its table, twice or more, while the cursor walks it.
            let filler = format!("filler:{round}");
            assert_eq!(
                other.call(&["DEBUG", "POPULATE", "2000", &filler]),
                Reply::status("OK")
            );
        }
        round += 1;
        if next == "0" {
            break;
        }
        cursor = next;
        assert!(round < 10_000, "the iteration never ended");
    }
    let missing: Vec<usize> = (0..STEADY)
        .filter(|i| !seen.contains(&format!("steady:{i}")))
        .collect();
    assert!(missing.is_empty(), "never listed: {missing:?}");
}
