//! Lock namespaces (`lock.namespaces`, LOCK.POLICY): each requirement enforced and warned
//! about, the lock-delay default, the config's life (module argument, CONFIG SET/GET, CONFIG
//! REWRITE, a malformed one refused), LOCK.POLICY's replies, INFO, and roles: effects from a
//! primary are never held to a replica's policy, and a promoted replica enforces its own.

mod common;

use std::time::{Duration, Instant};

use common::*;

const POLICY: &str = "orders prefix=orders: mode=enforce max-ttl=30000 label=required; \
                      pay prefix=pay: mode=warn sync=1 fsync=required; \
                      q prefix=q: mode=enforce max-waiters=1 max-wait=5000; \
                      s prefix=s: mode=enforce session=refused modes=exclusive,semaphore \
                      max-limit=3 min-ttl=1000; \
                      quiet prefix=quiet: mode=off max-ttl=1";

fn policy_error(namespace: &str, detail: &str) -> Reply {
    Reply::error(&format!("POLICY {namespace}: {detail}"))
}

#[test]
fn each_requirement_refuses_in_enforce_mode_and_changes_nothing() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    let cases: [(&[&str], Reply); 7] = [
        (
            &["LOCK.ACQUIRE", "orders:1", "t", "600000", "LABEL", "x"],
            policy_error("orders", "ttl 600000 above the namespace's max-ttl 30000"),
        ),
        (
            &["LOCK.ACQUIRE", "orders:1", "t", "1000"],
            policy_error("orders", "a LABEL is required"),
        ),
        (
            &["LOCK.ACQUIRE", "q:1", "t", "1000", "WAIT", "0"],
            policy_error("q", "WAIT 0 (no limit) above the namespace's max-wait 5000"),
        ),
        (
            &["LOCK.ACQUIRE", "s:1", "t", "500"],
            policy_error("s", "ttl 500 below the namespace's min-ttl 1000"),
        ),
        (
            &["LOCK.ACQUIRE", "s:1", "t", "5000", "SESSION"],
            policy_error("s", "SESSION is refused"),
        ),
        (
            &["LOCK.ACQUIRE", "s:1", "t", "5000", "SHARED"],
            policy_error("s", "shared holds are not among the namespace's modes"),
        ),
        (
            &["LOCK.ACQUIRE", "s:1", "t", "5000", "LIMIT", "4"],
            policy_error("s", "LIMIT 4 above the namespace's max-limit 3"),
        ),
    ];
    for (args, error) in &cases {
        let reply = c.call(args);
        assert_eq!(&reply, error, "{args:?}");
        // Plain ASCII: every client library decodes it alike (the Rust helper's redis crate
        // cannot parse an error line that is not UTF-8).
        assert!(
            reply.error_bytes().is_some_and(<[u8]>::is_ascii),
            "{reply:?}"
        );
    }
    for key in ["orders:1", "q:1", "s:1"] {
        assert_eq!(c.call(&["EXISTS", key]), Reply::Int(0), "{key}");
    }
    assert_eq!(server.info_int("lock_policy_refused"), 7);
    assert_eq!(server.info_int("lock_acquired"), 0);
    // Within the rules: granted.
    assert!(c
        .call(&["LOCK.ACQUIRE", "orders:1", "t", "30000", "LABEL", "x"])
        .is_int());
    assert!(c
        .call(&["LOCK.ACQUIRE", "s:1", "t", "5000", "LIMIT", "3"])
        .is_int());
    // A renewal is held to the lease rules.
    assert_eq!(
        c.call(&["LOCK.RENEW", "orders:1", "t", "60000"]),
        policy_error("orders", "ttl 60000 above the namespace's max-ttl 30000")
    );
    assert_eq!(
        c.call(&["LOCK.RENEW", "orders:1", "t", "20000"]),
        Reply::Int(1)
    );
    // A multi-lock is refused whole when one of its keys' namespaces refuses it.
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "2", "free:1", "orders:2", "m", "1000"]),
        policy_error("orders", "a LABEL is required")
    );
    assert_eq!(c.call(&["EXISTS", "free:1"]), Reply::Int(0));
    // A key no namespace matches, and a namespace that is off: no rule.
    assert!(c.call(&["LOCK.ACQUIRE", "other:1", "t", "600000"]).is_int());
    assert!(c.call(&["LOCK.ACQUIRE", "quiet:1", "t", "600000"]).is_int());
    assert_eq!(server.info_int("lock_policy_refused"), 9);
    assert_eq!(server.info_int("lock_policy_warned"), 0);
}

#[test]
fn max_waiters_caps_the_queue_of_one_key() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    assert!(c.call(&["LOCK.ACQUIRE", "q:1", "holder", "60000"]).is_int());
    let mut waiter = server.conn();
    waiter.send(&["LOCK.ACQUIRE", "q:1", "w1", "60000", "WAIT", "5000"]);
    wait_for("the first waiter queued", || {
        (server.info_int("lock_waiters") == 1).then_some(())
    });
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "q:1", "w2", "60000", "WAIT", "5000"]),
        policy_error(
            "q",
            "1 waiters queued on the key, the namespace's max-waiters 1"
        )
    );
    assert_eq!(server.info_int("lock_waiters"), 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "q:1", "holder"]), Reply::Int(1));
    assert!(waiter.read().is_int());
}

#[test]
fn max_reentrancy_caps_the_holds_of_one_token_in_enforce_and_counts_them_in_warn() {
    let policy = "strict prefix=s: mode=enforce max-reentrancy=2; \
                  loose prefix=l: mode=warn max-reentrancy=2";
    let server = Server::start_with(Config::default().namespaces(policy));
    let mut c = server.conn();
    let reentrant =
        |c: &mut Conn, key: &str| c.call(&["LOCK.ACQUIRE", key, "t", "60000", "REENTRANT"]);
    let first = reentrant(&mut c, "s:1");
    assert!(first.is_int(), "{first:?}");
    assert_eq!(reentrant(&mut c, "s:1"), first);
    // A third hold: refused, and the lock keeps its two.
    assert_eq!(
        reentrant(&mut c, "s:1"),
        policy_error(
            "strict",
            "REENTRANT would make 3 holds, above the namespace's max-reentrancy 2"
        )
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "s:1", "t"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "s:1"), "held");
    assert_eq!(c.call(&["LOCK.RELEASE", "s:1", "t"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "s:1"), "free");
    // Without REENTRANT, a holder's acquire refreshes and adds no hold: never refused.
    assert!(reentrant(&mut c, "s:2").is_int());
    assert!(reentrant(&mut c, "s:2").is_int());
    assert!(c.call(&["LOCK.ACQUIRE", "s:2", "t", "60000"]).is_int());
    // Shared holds count alike.
    let shared =
        |c: &mut Conn| c.call(&["LOCK.ACQUIRE", "s:3", "t", "60000", "SHARED", "REENTRANT"]);
    assert!(shared(&mut c).is_int());
    assert!(shared(&mut c).is_int());
    assert!(matches!(shared(&mut c), Reply::Error(e) if e.starts_with("POLICY strict: ")));
    // In warn mode the third hold is granted, and counted by its rule.
    for _ in 0..3 {
        assert!(reentrant(&mut c, "l:1").is_int());
    }
    for _ in 0..3 {
        assert_eq!(c.call(&["LOCK.RELEASE", "l:1", "t"]), Reply::Int(1));
    }
    assert_eq!(state_of(&mut c, "l:1"), "free");
    assert_eq!(server.info_int("lock_policy_refused"), 2);
    assert_eq!(server.info_int("lock_policy_warned"), 1);
    let info = c.call(&["INFO", "lock"]).text();
    assert!(info.contains(",refused_max_reentrancy=2"), "{info}");
    assert!(info.contains(",warned_max_reentrancy=1"), "{info}");
    // LIST shows the setting.
    let list = c.call(&["LOCK.POLICY", "LIST"]);
    let strict = fields_map(&list.items()[0]);
    assert_eq!(
        fields_map(&strict["settings"])["max-reentrancy"],
        Reply::bulk("2")
    );
}

#[test]
fn label_pattern_refuses_a_label_that_does_not_match_and_only_a_label_given() {
    let policy = "jobs prefix=job: mode=enforce label-pattern=batch-*; \
                  loose prefix=l: mode=warn label-pattern=batch-*";
    let server = Server::start_with(Config::default().namespaces(policy));
    let mut c = server.conn();
    let refused = policy_error(
        "jobs",
        "the LABEL does not match the namespace's label-pattern batch-*",
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "job:1", "t", "1000", "LABEL", "cron-1"]),
        refused
    );
    assert_eq!(
        c.call(&[
            "LOCK.MACQUIRE",
            "1",
            "job:2",
            "t",
            "1000",
            "LABEL",
            "cron-1"
        ]),
        refused
    );
    assert_eq!(c.call(&["EXISTS", "job:1", "job:2"]), Reply::Int(0));
    assert!(c
        .call(&["LOCK.ACQUIRE", "job:1", "t", "1000", "LABEL", "batch-7"])
        .is_int());
    // Without label=required, a request with no LABEL meets the pattern rule.
    assert!(c.call(&["LOCK.ACQUIRE", "job:3", "t", "1000"]).is_int());
    // In warn mode: granted, counted.
    assert!(c
        .call(&["LOCK.ACQUIRE", "l:1", "t", "1000", "LABEL", "cron-1"])
        .is_int());
    let info = c.call(&["INFO", "lock"]).text();
    assert!(info.contains(",refused_label_pattern=2"), "{info}");
    assert!(info.contains(",warned_label_pattern=1"), "{info}");
}

#[test]
fn a_namespace_long_hold_applies_to_its_holds_and_follows_a_policy_change() {
    // lock.long-hold is off for the server; batch's holds become long after 300 ms.
    let server = Server::start_with(
        Config::default().namespaces("batch prefix=batch: mode=warn long-hold=300"),
    );
    let mut c = server.conn();
    acquire(&mut c, "batch:1", "t", 60_000);
    acquire(&mut c, "other", "t", 60_000);
    wait_for("batch's hold to become long", || {
        (server.info_int("lock_long_holds") == 1).then_some(())
    });
    let log = c.call(&["LOCK.LONGHOLDS", "GET"]);
    assert_eq!(log.items().len(), 1, "{log:?}");
    assert_eq!(fields_map(&log.items()[0])["key"], Reply::bulk("batch:1"));
    let info = c.call(&["INFO", "lock"]).text();
    assert!(info.contains("lock_long_hold_ms:0"), "{info}");
    let batch = info
        .lines()
        .find(|l| l.starts_with("lock_namespace_batch:"))
        .expect("batch line");
    assert!(batch.contains(",long_hold_ms=300,"), "{batch}");
    // The other hold becomes long once a policy gives its key a threshold: the lease index
    // follows the change for the holds already there.
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "batch prefix=batch: mode=warn long-hold=300; rest prefix=oth long-hold=300 mode=enforce"
        ]),
        Reply::status("OK")
    );
    wait_for("the other hold to become long", || {
        (server.info_int("lock_long_holds") == 2).then_some(())
    });
    // A namespace in off mode gives no default.
    acquire(&mut c, "quiet:1", "t", 60_000);
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "quiet prefix=quiet: mode=off long-hold=300"
        ]),
        Reply::status("OK")
    );
    acquire(&mut c, "quiet:2", "t", 60_000);
    let until = std::time::Instant::now() + Duration::from_millis(700);
    while std::time::Instant::now() < until {
        assert_eq!(server.info_int("lock_long_holds"), 2);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn warn_mode_grants_counts_and_logs_once_per_client_and_rule_a_minute() {
    let config = Config::default()
        .namespaces(POLICY)
        .with("appendonly", "yes");
    let server = Server::start_with(config);
    let mut c = server.conn();
    for i in 0..3 {
        let fence = c.call(&["LOCK.ACQUIRE", &format!("pay:{i}"), "t", "1000"]);
        assert!(fence.is_int(), "{fence:?}");
    }
    // With SYNC 1 and no FSYNC: the next rule.
    assert_eq!(server.info_int("lock_policy_warned"), 3);
    assert_eq!(server.info_int("lock_policy_refused"), 0);
    let mut other = server.conn();
    assert!(other.call(&["LOCK.ACQUIRE", "pay:9", "t", "1000"]).is_int());
    let log = std::fs::read_to_string(server.dir().join("server.log")).expect("the log");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("lock audit: namespace pay (warn)"))
        .collect();
    assert_eq!(lines.len(), 2, "one line per client and rule: {lines:?}");
    assert!(lines[0].contains("SYNC with at least 1 replicas is required"));
    assert!(!log.contains("lock audit: namespace pay (warn) would refuse a request by id=0"));
    // LOCK.POLICY LIST counts by rule.
    let list = c.call(&["LOCK.POLICY", "LIST"]);
    let pay = list
        .items()
        .iter()
        .map(fields_map)
        .find(|ns| ns["name"] == Reply::bulk("pay"))
        .expect("pay in LOCK.POLICY LIST");
    assert_eq!(pay["mode"], Reply::status("warn"));
    assert_eq!(fields_map(&pay["warned"])["sync"], Reply::Int(4));
    assert_eq!(pay["refused"], Reply::Array(vec![]));
}

#[test]
fn a_namespace_gives_its_lock_delay_to_grants_that_name_none() {
    let server = Server::start_with(
        Config::default().namespaces("slow prefix=slow: mode=enforce lock-delay=1500"),
    );
    let mut c = server.conn();
    for (key, extra) in [("slow:1", &[][..]), ("slow:2", &["LOCKDELAY", "0"][..])] {
        let mut args = vec!["LOCK.ACQUIRE", key, "a", "100"];
        args.extend_from_slice(extra);
        assert!(c.call(&args).is_int(), "{key}");
    }
    let expired = Instant::now();
    wait_for("both leases ran out", || {
        (server.info_int("lock_held") == 0).then_some(())
    });
    // slow:2 asked for no lock-delay: free at once; slow:1 got the namespace's 1500 ms.
    assert!(c.call(&["LOCK.ACQUIRE", "slow:2", "b", "1000"]).is_int());
    let first = c.call(&["LOCK.ACQUIRE", "slow:1", "b", "1000"]);
    if expired.elapsed() < Duration::from_millis(1200) {
        assert_eq!(first, Reply::Nil, "in the namespace's lock-delay");
    }
    wait_for("the lock-delay ended", || {
        c.call(&["LOCK.ACQUIRE", "slow:1", "b", "1000"])
            .is_int()
            .then_some(())
    });
    assert!(expired.elapsed() >= Duration::from_millis(1400));
}

#[test]
fn the_config_round_trips_and_a_malformed_one_changes_nothing() {
    let server =
        Server::start_with(Config::default().namespaces("b  prefix=b:   max-ttl=5000 mode=warn"));
    let mut c = server.conn();
    let get = |c: &mut Conn| fields_map(&c.call(&["CONFIG", "GET", "lock.namespaces"]));
    assert_eq!(
        get(&mut c)["lock.namespaces"],
        Reply::bulk("b prefix=b: mode=warn max-ttl=5000")
    );
    let digest = server.info_field("lock", "lock_policy_digest").unwrap();
    assert_eq!(digest.len(), 16);
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", "b prefix=b: max-ttl=0"]),
        Reply::error(
            "ERR CONFIG SET failed (possibly related to argument 'lock.namespaces') - b: \
             max-ttl=0: ms from 1 to 31536000000"
        )
    );
    assert_eq!(
        get(&mut c)["lock.namespaces"],
        Reply::bulk("b prefix=b: mode=warn max-ttl=5000")
    );
    // The same policy written otherwise: the same digest.
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b max-ttl=5000 prefix=b: mode=warn ;"
        ]),
        Reply::status("OK")
    );
    assert_eq!(
        server.info_field("lock", "lock_policy_digest").unwrap(),
        digest
    );
    assert_eq!(server.info_int("lock_namespaces"), 1);
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", ""]),
        Reply::status("OK")
    );
    assert_eq!(server.info_field("lock", "lock_policy_digest").unwrap(), "");
    assert_eq!(server.info_int("lock_namespaces"), 0);
    let log = std::fs::read_to_string(server.dir().join("server.log")).expect("the log");
    let change =
        format!("lock audit: CONFIG SET lock.namespaces from digest '{digest}' to digest '' by ");
    assert!(
        log.lines()
            .any(|line| line.contains(&change) && line.ends_with(": 0 namespaces")),
        "{log}"
    );
}

#[test]
fn config_rewrite_keeps_the_policy_across_a_restart() {
    let config = Config {
        load_module: false,
        config_file: Some(format!(
            "loadmodule {}\nlock.namespaces \"a prefix=a: mode=warn\"\n",
            module_path().display()
        )),
        ..Config::default()
    };
    let mut server = Server::start_with(config);
    let mut c = server.conn();
    // A prefix with a quote in it, and more than one namespace.
    let policy = "a prefix=a: mode=enforce max-ttl=100; z prefix=\"z: mode=off";
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", policy]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["CONFIG", "REWRITE"]), Reply::status("OK"));
    drop(c);
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_eq!(
        fields_map(&c.call(&["CONFIG", "GET", "lock.namespaces"]))["lock.namespaces"],
        Reply::bulk(policy)
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "a:1", "t", "1000"]),
        policy_error("a", "ttl 1000 above the namespace's max-ttl 100")
    );
}

#[test]
fn a_malformed_policy_at_load_refuses_the_module_with_its_reason() {
    let server = Server::start_with(Config {
        load_module: false,
        ..Config::default().with("enable-module-command", "yes")
    });
    let mut c = server.conn();
    let path = module_path().display().to_string();
    let reply = c.call(&[
        "MODULE",
        "LOADEX",
        &path,
        "CONFIG",
        "lock.namespaces",
        "x prefix=x: mode=loud",
    ]);
    assert!(reply.is_error(), "{reply:?}");
    // Not a module argument: CONFIG REWRITE would write it back unquoted.
    let reply = c.call(&["MODULE", "LOAD", &path, "namespaces", "x prefix=x:"]);
    assert!(reply.is_error(), "{reply:?}");
    let log = std::fs::read_to_string(server.dir().join("server.log")).expect("the log");
    assert!(
        log.contains("lock.namespaces : x: mode=loud: enforce, warn or off"),
        "{log}"
    );
    assert!(
        log.contains("lock.namespaces is not a module argument"),
        "{log}"
    );
    // (Redis 8 lists modules of its own.)
    let modules = c.call(&["MODULE", "LIST"]);
    assert!(
        modules
            .items()
            .iter()
            .all(|m| fields_map(m)["name"] != Reply::bulk("lock")),
        "{modules:?}"
    );
    // A valid one then loads (nothing of the refused loads is left in the way).
    let reply = c.call(&[
        "MODULE",
        "LOADEX",
        &path,
        "CONFIG",
        "lock.namespaces",
        "x prefix=x: mode=enforce max-ttl=5",
    ]);
    assert_eq!(reply, Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "x:1", "t", "1000"]),
        policy_error("x", "ttl 1000 above the namespace's max-ttl 5")
    );
}

#[test]
fn lock_policy_explain_says_where_each_rule_comes_from() {
    let server = Server::start_with(Config::default().namespaces(POLICY));
    let mut c = server.conn();
    let explained = fields_map(&c.call(&["LOCK.POLICY", "EXPLAIN", "orders:42"]));
    assert_eq!(explained["namespace"], Reply::bulk("orders"));
    assert_eq!(explained["prefix"], Reply::bulk("orders:"));
    assert_eq!(explained["mode"], Reply::status("enforce"));
    let rules: Vec<(Reply, Reply, Reply)> = explained["rules"]
        .items()
        .iter()
        .map(|rule| {
            let rule = fields_map(rule);
            (
                rule["setting"].clone(),
                rule["value"].clone(),
                rule["from"].clone(),
            )
        })
        .collect();
    let rule = |setting: &str, value: &str, from: &str| {
        (
            Reply::status(setting),
            Reply::bulk(value),
            Reply::bulk(from),
        )
    };
    assert_eq!(
        rules,
        [
            rule("max-ttl", "30000", "namespace orders"),
            rule("label", "required", "namespace orders"),
            rule("max-ttl", "86400000", "config lock.max-ttl"),
            rule("max-waiters", "1000", "config lock.max-waiters"),
            rule("max-token-len", "256", "config lock.max-token-len"),
            rule("lock-delay", "0", "config lock.lock-delay"),
            rule("long-hold", "0", "config lock.long-hold"),
        ]
    );
    let nowhere = fields_map(&c.call(&["LOCK.POLICY", "EXPLAIN", "nowhere"]));
    assert_eq!(nowhere["namespace"], Reply::Nil);
    assert_eq!(nowhere["mode"], Reply::status("off"));
    assert_eq!(
        c.call(&["LOCK.POLICY", "EXPLAIN"]),
        Reply::error(
            "ERR unknown subcommand or wrong number of arguments for LOCK.POLICY (expected LIST \
             or EXPLAIN key)"
        )
    );
    // LIST, in the policy's order.
    let names: Vec<Reply> = c
        .call(&["LOCK.POLICY", "LIST"])
        .items()
        .iter()
        .map(|ns| fields_map(ns)["name"].clone())
        .collect();
    assert_eq!(names, ["orders", "pay", "q", "s", "quiet"].map(Reply::bulk));
}

#[test]
fn effects_are_never_held_to_a_replica_policy_and_a_promoted_replica_enforces_its_own() {
    let primary = Server::start();
    let replica = Server::start_with(
        Config::default().namespaces("orders prefix=orders: mode=enforce max-ttl=1000"),
    );
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    let fence = c.call(&["LOCK.ACQUIRE", "orders:1", "t", "600000"]);
    assert!(fence.is_int());
    assert_eq!(
        c.call(&["LOCK.RENEW", "orders:1", "t", "700000"]),
        Reply::Int(1)
    );
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(
        digest_value(&mut r, "orders:1"),
        digest_value(&mut c, "orders:1")
    );
    assert_eq!(replica.info_int("lock_policy_refused"), 0);
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Reply::status("OK"));
    assert_eq!(
        r.call(&["LOCK.ACQUIRE", "orders:2", "t", "600000"]),
        policy_error("orders", "ttl 600000 above the namespace's max-ttl 1000")
    );
}

#[test]
fn the_policy_digest_is_equal_on_every_cluster_node_and_tells_one_that_differs() {
    let policy = "orders prefix={orders}: mode=enforce max-ttl=30000";
    let config = common::cluster::cluster_config().namespaces(policy);
    let cluster = common::cluster::Cluster::start_with(3, true, config);
    let digests = |cluster: &common::cluster::Cluster| -> Vec<String> {
        cluster
            .nodes
            .iter()
            .map(|node| {
                node.info_field("lock", "lock_policy_digest")
                    .expect("a digest")
            })
            .collect()
    };
    let all = digests(&cluster);
    assert_eq!(all.len(), 6);
    assert_eq!(all[0].len(), 16);
    assert!(all.iter().all(|d| *d == all[0]), "{all:?}");
    // One node configured otherwise (written differently, the same policy: the same digest).
    let mut c = cluster.nodes[4].conn();
    let same = "orders  max-ttl=30000 prefix={orders}:  mode=enforce";
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", same]),
        Reply::status("OK")
    );
    assert!(digests(&cluster).iter().all(|d| *d == all[0]));
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "orders prefix={orders}: mode=warn"
        ]),
        Reply::status("OK")
    );
    let now = digests(&cluster);
    let differing: Vec<usize> = (0..6).filter(|&i| now[i] != all[0]).collect();
    assert_eq!(differing, [4], "{now:?}");
}
