//! The `lock.*` configs: defaults, bounds, module arguments, and commands from the primary.

use crate::common::*;

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
    assert_eq!(config_get(&mut c, "lock.tombstone-ttl"), "10000");
    assert_eq!(config_get(&mut c, "lock.lock-delay"), "0");
    assert_eq!(config_get(&mut c, "lock.long-hold"), "0");
    assert_eq!(config_get(&mut c, "lock.long-hold-log-len"), "128");
    assert_eq!(config_get(&mut c, "lock.namespaces"), "");
    let all = fields_map(&c.call(&["CONFIG", "GET", "lock.*"]));
    assert_eq!(
        all.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "lock.lock-delay",
            "lock.long-hold",
            "lock.long-hold-log-len",
            "lock.max-token-len",
            "lock.max-ttl",
            "lock.max-waiters",
            "lock.namespaces",
            "lock.tombstone-ttl"
        ]
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
        (
            "lock.tombstone-ttl",
            "-1",
            range("lock.tombstone-ttl", "0 and 31536000000"),
        ),
        (
            "lock.lock-delay",
            "86400001",
            range("lock.lock-delay", "0 and 86400000"),
        ),
        (
            "lock.long-hold",
            "-1",
            range("lock.long-hold", "0 and 31536000000"),
        ),
        (
            "lock.long-hold-log-len",
            "10001",
            range("lock.long-hold-log-len", "0 and 10000"),
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
    assert_eq!(config_get(&mut c, "lock.tombstone-ttl"), "10000");
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
