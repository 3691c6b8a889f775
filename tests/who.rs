//! LOCK.WHO (who holds, who waits, in queue order), LABEL, long holds (`lock.long-hold`, the
//! `lock.longhold` event, LOCK.LONGHOLDS) and the INFO ages of the oldest hold and waiter.

mod common;

use std::collections::BTreeMap;

use common::*;

fn who(c: &mut Conn, args: &[&str]) -> BTreeMap<String, Reply> {
    let mut call = vec!["LOCK.WHO"];
    call.extend_from_slice(args);
    let reply = c.call(&call);
    fields_map(&reply)
}

fn entries(who: &BTreeMap<String, Reply>, list: &str) -> Vec<BTreeMap<String, Reply>> {
    who[list].items().iter().map(fields_map).collect()
}

const TOKEN: &str = "tok-who-5ecr3t";

#[test]
fn who_names_the_holder_by_client_and_label_and_never_the_token() {
    let server = Server::start();
    let mut holder = server.conn();
    assert_eq!(
        holder.call(&["CLIENT", "SETNAME", "billing-worker"]),
        Reply::status("OK")
    );
    let (addr, id) = client_addr_and_id(&mut holder);
    let before = now_ms() as i64;
    let fence = acquire_with(
        &mut holder,
        "orders:42",
        TOKEN,
        60_000,
        &["SESSION", "LABEL", "host-7:pid-42"],
    )
    .int();
    let after = now_ms() as i64;
    let mut op = server.conn();
    let raw = op.call(&["LOCK.WHO", "orders:42"]);
    assert!(!format!("{raw:?}").contains(TOKEN), "{raw:?}");
    let view = fields_map(&raw);
    assert_eq!(view["state"].text(), "held");
    assert_eq!(view["mode"].text(), "exclusive");
    assert_eq!(view["fence"], Reply::Int(fence));
    assert_eq!(view["delay_ttl"], Reply::Int(-1));
    assert_eq!(view["holders_total"], Reply::Int(1));
    assert_eq!(view["waiters_total"], Reply::Int(0));
    assert_eq!(view["watchers"], Reply::Int(0));
    assert_eq!(view["tag"].text().len(), 16);
    let holders = entries(&view, "holders");
    assert_eq!(holders.len(), 1);
    let h = &holders[0];
    assert_eq!(h["mode"].text(), "exclusive");
    assert_eq!(h["fence"], Reply::Int(fence));
    assert!((0..5_000).contains(&h["held_ms"].int()), "{h:?}");
    // Since when, in unix ms: the grant's time, which held_ms counts from.
    let granted_at = h["granted_at"].int();
    assert!((before..=after).contains(&granted_at), "{h:?}");
    assert!(granted_at + h["held_ms"].int() <= now_ms() as i64, "{h:?}");
    assert!((55_000..=60_000).contains(&h["ttl"].int()), "{h:?}");
    assert_eq!(h["holds"], Reply::Int(1));
    assert_eq!(h["session"], Reply::Int(1));
    assert_eq!(h["lock_delay"], Reply::Int(0));
    assert_eq!(h["client_id"], Reply::Int(id));
    assert_eq!(h["client_name"].text(), "billing-worker");
    assert_eq!(h["client_addr"].text(), addr);
    assert_eq!(h["label"].text(), "host-7:pid-42");
    assert_eq!(h["connected"], Reply::Int(1));

    // A refresh from another connection without a label: the new connection, the same label
    // and grant time.
    let mut retry = server.conn();
    let (retry_addr, retry_id) = client_addr_and_id(&mut retry);
    assert_eq!(
        acquire_with(&mut retry, "orders:42", TOKEN, 60_000, &[]),
        Reply::Int(fence)
    );
    let h = entries(&who(&mut op, &["orders:42"]), "holders").remove(0);
    assert_eq!(h["client_id"], Reply::Int(retry_id));
    assert_eq!(h["client_addr"].text(), retry_addr);
    assert_eq!(h["client_name"].text(), "");
    assert_eq!(h["label"].text(), "host-7:pid-42");
    // The grant's connection closed: still named, no longer connected (the session lock
    // belongs to the first connection, which stays).
    drop(retry);
    wait_for("the retry connection to close", || {
        let h = entries(&who(&mut op, &["orders:42"]), "holders").remove(0);
        (h["connected"] == Reply::Int(0)).then_some(())
    });

    // A missing key with nobody waiting: nil. Another type: WRONGTYPE.
    assert_eq!(op.call(&["LOCK.WHO", "nothing"]), Reply::Nil);
    assert_eq!(op.call(&["SET", "plain", "1"]), Reply::status("OK"));
    assert_eq!(
        op.call(&["LOCK.WHO", "plain"]),
        Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    // RESP3: maps.
    let mut c3 = server.conn3();
    let reply = c3.call(&["LOCK.WHO", "orders:42"]);
    let Reply::Map(_) = &reply else {
        panic!("{reply:?}")
    };
    let holders = fields_map(&reply)["holders"].clone();
    assert!(matches!(&holders.items()[0], Reply::Map(_)), "{holders:?}");
}

#[test]
fn who_lists_waiters_in_queue_order_bounded_by_count_and_a_client_finds_its_place() {
    let server = Server::start();
    let mut op = server.conn();
    acquire(&mut op, "q", "holder", 60_000);
    acquire(&mut op, "other", "holder", 60_000);
    let mut waiters = Vec::new();
    for (i, extra) in [
        &["WAIT", "30000", "LABEL", "first"][..],
        &["WAIT", "0", "SHARED"][..],
        &["WAIT", "20000", "REENTRANT"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = server.conn();
        c.call(&["CLIENT", "SETNAME", &format!("waiter-{i}")]);
        let (addr, id) = client_addr_and_id(&mut c);
        let token = format!("{TOKEN}-{i}");
        let mut call = vec!["LOCK.ACQUIRE", "q", &token, "1000"];
        call.extend_from_slice(extra);
        let before = blocked(&server);
        c.send(&call);
        wait_blocked(&server, before + 1);
        waiters.push((c, addr, id));
    }
    // A multi-lock waiter shows on both its keys.
    let mut multi = server.conn();
    let (_, multi_id) = client_addr_and_id(&mut multi);
    multi.send(&[
        "LOCK.MACQUIRE",
        "2",
        "other",
        "q",
        TOKEN,
        "1000",
        "WAIT",
        "10000",
        "LABEL",
        "both",
    ]);
    wait_blocked(&server, 4);

    let view = who(&mut op, &["q"]);
    assert_eq!(view["waiters_total"], Reply::Int(4));
    let listed = entries(&view, "waiters");
    assert_eq!(listed.len(), 4);
    let expected = [
        ("exclusive", 0, "first"),
        ("shared", 0, ""),
        ("exclusive", 0, ""),
        ("exclusive", 0, "both"),
    ];
    for (i, (w, (mode, limit, label))) in listed.iter().zip(expected).enumerate() {
        assert_eq!(w["position"], Reply::Int(i as i64 + 1), "{w:?}");
        assert_eq!(w["mode"].text(), mode, "{w:?}");
        assert_eq!(w["limit"], Reply::Int(limit), "{w:?}");
        assert_eq!(w["label"].text(), label, "{w:?}");
        assert!((0..10_000).contains(&w["waited_ms"].int()), "{w:?}");
        if i < 3 {
            let (_, addr, id) = &waiters[i];
            assert_eq!(w["client_id"], Reply::Int(*id), "{w:?}");
            assert_eq!(w["client_addr"].text(), *addr, "{w:?}");
            assert_eq!(w["client_name"].text(), format!("waiter-{i}"), "{w:?}");
            assert_eq!(w["keys"], Reply::Int(1), "{w:?}");
        }
    }
    assert!((25_000..=30_000).contains(&listed[0]["timeout_ms"].int()));
    assert_eq!(listed[1]["timeout_ms"], Reply::Int(-1));
    assert_eq!(listed[3]["client_id"], Reply::Int(multi_id));
    assert_eq!(listed[3]["keys"], Reply::Int(2));
    let on_other = entries(&who(&mut op, &["other"]), "waiters");
    assert_eq!(on_other.len(), 1);
    assert_eq!(on_other[0]["client_id"], Reply::Int(multi_id));
    assert_eq!(on_other[0]["position"], Reply::Int(1));

    // COUNT bounds each list; the totals stay.
    let view = who(&mut op, &["q", "COUNT", "2"]);
    assert_eq!(entries(&view, "waiters").len(), 2);
    assert_eq!(view["waiters_total"], Reply::Int(4));
    // CLIENT: that client's own place.
    let third = waiters[2].2.to_string();
    let view = who(&mut op, &["q", "CLIENT", &third, "COUNT", "1"]);
    let mine = entries(&view, "waiters");
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["position"], Reply::Int(3));
    assert_eq!(entries(&view, "holders").len(), 0);
    assert_eq!(view["holders_total"], Reply::Int(1));
    // Positions move up as the queue is served.
    assert_eq!(op.call(&["LOCK.RELEASE", "q", "holder"]), Reply::Int(1));
    granted(&mut waiters[0].0);
    let view = who(&mut op, &["q", "CLIENT", &third]);
    assert_eq!(entries(&view, "waiters")[0]["position"], Reply::Int(2));
    let holders = entries(&view, "holders");
    assert_eq!(holders.len(), 0);
    let view = who(&mut op, &["q"]);
    let holder = &entries(&view, "holders")[0];
    assert_eq!(holder["label"].text(), "first");
    assert_eq!(holder["client_id"], Reply::Int(waiters[0].2));
    assert_eq!(holder["client_name"].text(), "waiter-0");

    // A semaphore: permit holders and permit waiters.
    acquire_with(&mut op, "sem", "p1", 60_000, &["LIMIT", "1", "LABEL", "p1"]).int();
    let mut permit = server.conn();
    let before = blocked(&server);
    permit.send(&[
        "LOCK.ACQUIRE",
        "sem",
        "p2",
        "1000",
        "LIMIT",
        "1",
        "WAIT",
        "5000",
    ]);
    wait_blocked(&server, before + 1);
    let view = who(&mut op, &["sem"]);
    assert_eq!(view["mode"].text(), "semaphore");
    assert_eq!(entries(&view, "holders")[0]["mode"].text(), "permit");
    assert_eq!(entries(&view, "holders")[0]["label"].text(), "p1");
    let waiting = entries(&view, "waiters");
    assert_eq!(waiting[0]["mode"].text(), "permit");
    assert_eq!(waiting[0]["limit"], Reply::Int(1));
}

#[test]
fn bad_labels_and_who_options_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let long = "x".repeat(129);
    let bad_label =
        "ERR invalid label: printable ASCII without spaces, at most 128 bytes".to_string();
    for label in ["with space", "", &long, "tab\there", "caf\u{e9}"] {
        assert_eq!(
            c.call(&["LOCK.ACQUIRE", "k", "t", "1000", "LABEL", label]),
            Reply::Error(bad_label.clone()),
            "{label:?}"
        );
    }
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "1000", "LABEL"]),
        Reply::Error(bad_label.clone())
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "1000", "LABEL", "a", "LABEL", "b"]),
        Reply::error("ERR option LABEL given more than once")
    );
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "1", "k", "t", "1000", "LABEL", "a b"]),
        Reply::Error(bad_label)
    );
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    // 128 bytes of printable ASCII is fine.
    let max = "~".repeat(128);
    acquire_with(&mut c, "k", "t", 1000, &["LABEL", &max]).int();
    assert_eq!(
        entries(&who(&mut c, &["k"]), "holders")[0]["label"].text(),
        max
    );

    for (args, error) in [
        (
            &["k", "COUNT", "0"][..],
            "ERR invalid count: must be between 1 and 10000",
        ),
        (
            &["k", "COUNT", "10001"],
            "ERR invalid count: must be between 1 and 10000",
        ),
        (
            &["k", "COUNT", "x"],
            "ERR invalid count: must be between 1 and 10000",
        ),
        (&["k", "COUNT"], "ERR invalid count: missing after COUNT"),
        (
            &["k", "COUNT", "1", "COUNT", "2"],
            "ERR option COUNT given more than once",
        ),
        (
            &["k", "CLIENT", "0"],
            "ERR invalid client-id: must be a positive integer",
        ),
        (
            &["k", "CLIENT", "-3"],
            "ERR invalid client-id: must be a positive integer",
        ),
        (
            &["k", "SOON"],
            "ERR unknown option at argument 2 (expected COUNT or CLIENT)",
        ),
    ] {
        let mut call = vec!["LOCK.WHO"];
        call.extend_from_slice(args);
        assert_eq!(c.call(&call), Reply::error(error), "{args:?}");
    }
    assert_eq!(
        c.call(&["LOCK.WHO"]),
        Reply::error("ERR wrong number of arguments for 'lock.who' command")
    );
}

#[test]
fn who_works_in_multi_and_scripts_and_a_replica_shows_the_same_holder() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    c.call(&["CLIENT", "SETNAME", "app"]);
    let (addr, id) = client_addr_and_id(&mut c);
    let fence = acquire_with(&mut c, "k", TOKEN, 60_000, &["LABEL", "svc-1"]).int();
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(c.call(&["LOCK.WHO", "k"]), Reply::status("QUEUED"));
    let exec = c.call(&["EXEC"]);
    assert_eq!(fields_map(&exec.items()[0])["fence"], Reply::Int(fence));
    let script = c.call(&["EVAL", "return redis.call('LOCK.WHO', KEYS[1])", "1", "k"]);
    assert_eq!(fields_map(&script)["holders_total"], Reply::Int(1));

    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    let h = entries(&who(&mut r, &["k"]), "holders").remove(0);
    assert_eq!(h["fence"], Reply::Int(fence));
    assert_eq!(h["client_id"], Reply::Int(id));
    assert_eq!(h["client_addr"].text(), addr);
    assert_eq!(h["client_name"].text(), "app");
    assert_eq!(h["label"].text(), "svc-1");
    // A replica cannot tell whether the primary's client is connected.
    assert_eq!(h["connected"], Reply::Int(-1));
    assert_eq!(
        digest_value(&mut c, "k"),
        digest_value(&mut r, "k"),
        "primary and replica agree on who holds"
    );
}

#[test]
fn who_holds_survives_debug_reload_restart_and_restore_and_an_older_encoding_loads() {
    let mut server = Server::start_with(
        Config::default()
            .with("appendonly", "yes")
            .with("save", "60 1"),
    );
    let mut c = server.conn();
    c.call(&["CLIENT", "SETNAME", "keeper"]);
    let (addr, id) = client_addr_and_id(&mut c);
    let fence = acquire_with(&mut c, "k", TOKEN, 600_000, &["LABEL", "keep-me"]).int();
    acquire(&mut c, "unlabelled", "t", 600_000);
    let check = |c: &mut Conn, what: &str| {
        let h = entries(&who(c, &["k"]), "holders").remove(0);
        assert_eq!(h["fence"], Reply::Int(fence), "{what}");
        assert_eq!(h["client_id"], Reply::Int(id), "{what}");
        assert_eq!(h["client_addr"].text(), addr, "{what}");
        assert_eq!(h["client_name"].text(), "keeper", "{what}");
        assert_eq!(h["label"].text(), "keep-me", "{what}");
        assert!(h["held_ms"].int() >= 0, "{what}");
        h["held_ms"].int()
    };
    check(&mut c, "before");
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    check(&mut c, "after DEBUG RELOAD");
    let Reply::Bulk(dump) = c.call(&["DUMP", "k"]) else {
        panic!("DUMP")
    };
    assert_eq!(
        c.call(&["RESTORE".as_bytes(), b"copy", b"0", &dump]),
        Reply::status("OK")
    );
    let h = entries(&who(&mut c, &["copy"]), "holders").remove(0);
    assert_eq!(h["label"].text(), "keep-me");
    drop(c);
    server.shutdown_and_restart();
    let mut c = server.conn();
    let held = check(&mut c, "after a restart from the AOF");
    let h = entries(&who(&mut c, &["k"]), "holders").remove(0);
    assert_eq!(
        h["connected"],
        Reply::Int(0),
        "a restart closed every connection"
    );
    assert!(held >= 0);
    // A hold written by the previous encoding (no grant record) shows what is unknown.
    let format = LockDumpFormat::learn(&mut c);
    let deadline = now_ms() + 60_000;
    let old = format.payload_of_version(
        3,
        &held_fields_of_token(fence as u64 + 5, b"old-token", deadline, 1, 0),
    );
    assert_eq!(restore(&mut c, "old", &old), Reply::status("OK"));
    let h = entries(&who(&mut c, &["old"]), "holders").remove(0);
    assert_eq!(h["held_ms"], Reply::Int(-1));
    assert_eq!(h["granted_at"], Reply::Int(-1));
    assert_eq!(h["client_id"], Reply::Int(0));
    assert_eq!(h["client_addr"].text(), "");
    assert_eq!(h["label"].text(), "");
    assert_eq!(h["connected"], Reply::Int(-1));
}

#[test]
fn a_long_hold_is_counted_announced_once_and_logged_with_how_it_ended() {
    let server = Server::start_with(
        Config::default()
            .with("notify-keyspace-events", "KA")
            .module_arg("long-hold")
            .module_arg("300"),
    );
    let mut sub = subscribe_keyspace(&server, "slow");
    let mut c = server.conn();
    c.call(&["CLIENT", "SETNAME", "slowpoke"]);
    let (addr, id) = client_addr_and_id(&mut c);
    assert_eq!(server.info_int("lock_long_hold_ms"), 300);
    assert_eq!(server.info_int("lock_oldest_hold_ms"), 0);
    let fence = acquire_with(&mut c, "slow", TOKEN, 60_000, &["LABEL", "batch-9"]).int();
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(next_event(&mut sub), "lock.longhold");
    assert_eq!(server.info_int("lock_long_holds"), 1);
    let oldest = server.info_int("lock_oldest_hold_ms");
    assert!(oldest >= 300, "{oldest}");
    let tag = server.info_field("lock", "lock_oldest_hold_tag").unwrap();
    assert_eq!(tag, who(&mut c, &["slow"])["tag"].text());
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(1));
    let log = c.call(&["LOCK.LONGHOLDS", "GET"]);
    let entry = fields_map(&log.items()[0]);
    assert_eq!(entry["id"], Reply::Int(0));
    assert_eq!(entry["key"].text(), "slow");
    assert_eq!(entry["tag"].text(), tag);
    assert_eq!(entry["fence"], Reply::Int(fence));
    assert_eq!(entry["label"].text(), "batch-9");
    assert_eq!(entry["client_id"], Reply::Int(id));
    assert_eq!(entry["client_name"].text(), "slowpoke");
    assert_eq!(entry["client_addr"].text(), addr);
    assert_eq!(entry["ended"].text(), "held");
    assert!(entry["held_ms"].int() >= 300);
    // The same grant time LOCK.WHO shows for the hold.
    let holder = entries(&who(&mut c, &["slow"]), "holders").remove(0);
    assert_eq!(entry["granted_at"], holder["granted_at"]);
    assert!(entry["granted_at"].int() > 0);
    let now_s = (now_ms() / 1000) as i64;
    assert!(
        (now_s - 5..=now_s).contains(&entry["time"].int()),
        "{entry:?}"
    );
    assert!(!format!("{log:?}").contains(TOKEN));

    // Renewing and refreshing do not announce it again.
    assert_eq!(
        c.call(&["LOCK.RENEW", "slow", TOKEN, "60000"]),
        Reply::Int(1)
    );
    assert_eq!(next_event(&mut sub), "lock.renew");
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(c.call(&["LOCK.RELEASE", "slow", TOKEN]), Reply::Int(1));
    assert_eq!(next_event(&mut sub), "lock.release");
    assert_eq!(server.info_int("lock_long_holds"), 1);
    let entry = fields_map(&c.call(&["LOCK.LONGHOLDS", "GET"]).items()[0]);
    assert_eq!(entry["ended"].text(), "released");
    let held = entry["held_ms"].int();
    assert!(held >= 700, "{held}");
    // Ended: the time stays.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let entry = fields_map(&c.call(&["LOCK.LONGHOLDS", "GET", "1"]).items()[0]);
    assert_eq!(entry["held_ms"], Reply::Int(held));
    assert_eq!(server.info_int("lock_oldest_hold_ms"), 0);
    assert_eq!(
        server.info_field("lock", "lock_oldest_hold_tag").unwrap(),
        ""
    );

    // An expiry, a forced release and a deletion end the next ones.
    for (key, end) in [("e", "expired"), ("f", "forced"), ("d", "deleted")] {
        let ttl = if end == "expired" { 600 } else { 60_000 };
        acquire(&mut c, key, TOKEN, ttl);
        wait_for("the long hold", || {
            (c.call(&["LOCK.LONGHOLDS", "GET", "1"]).items().first())
                .map(fields_map)
                .filter(|e| e["key"].text() == key)
        });
        match end {
            "forced" => assert_eq!(c.call(&["LOCK.FORCERELEASE", key]), Reply::Int(1)),
            "deleted" => assert_eq!(c.call(&["DEL", key]), Reply::Int(1)),
            _ => {}
        }
        wait_for(end, || {
            let entry = fields_map(&c.call(&["LOCK.LONGHOLDS", "GET", "1"]).items()[0]);
            (entry["ended"].text() == end).then_some(())
        });
    }
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(4));
    assert_eq!(server.info_int("lock_long_holds"), 4);
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "GET", "-1"]).items().len(), 4);
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "GET", "0"]).items().len(), 0);
    // The log is bounded by lock.long-hold-log-len; RESET empties it.
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.long-hold-log-len", "2"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(2));
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "RESET"]), Reply::status("OK"));
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(0));
    for (args, error) in [
        (&["LOCK.LONGHOLDS", "GET", "-2"][..], "ERR invalid count: must be -1 or a non-negative integer"),
        (&["LOCK.LONGHOLDS", "GET", "x"], "ERR invalid count: must be -1 or a non-negative integer"),
        (&["LOCK.LONGHOLDS", "LEN", "1"], "ERR unknown subcommand or wrong number of arguments for LOCK.LONGHOLDS (expected GET [count], LEN or RESET)"),
        (&["LOCK.LONGHOLDS", "FLUSH"], "ERR unknown subcommand or wrong number of arguments for LOCK.LONGHOLDS (expected GET [count], LEN or RESET)"),
    ] {
        assert_eq!(c.call(args), Reply::error(error), "{args:?}");
    }
    // Off: no more long holds.
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.long-hold", "0"]),
        Reply::status("OK")
    );
    acquire(&mut c, "off", TOKEN, 60_000);
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(server.info_int("lock_long_holds"), 4);
}

#[test]
fn shared_holders_cross_the_threshold_each_once() {
    let server = Server::start_with(Config::default().module_arg("long-hold").module_arg("200"));
    let mut c = server.conn();
    acquire_with(&mut c, "s", "reader-1", 60_000, &["SHARED", "LABEL", "r1"]).int();
    wait_for("the first long hold", || {
        (server.info_int("lock_long_holds") == 1).then_some(())
    });
    acquire_with(&mut c, "s", "reader-2", 60_000, &["SHARED", "LABEL", "r2"]).int();
    wait_for("the second long hold", || {
        (server.info_int("lock_long_holds") == 2).then_some(())
    });
    assert_eq!(c.call(&["LOCK.RELEASE", "s", "reader-1"]), Reply::Int(1));
    let log = c.call(&["LOCK.LONGHOLDS", "GET"]);
    let entries: Vec<_> = log.items().iter().map(fields_map).collect();
    assert_eq!(entries[0]["label"].text(), "r2");
    assert_eq!(entries[0]["ended"].text(), "held");
    assert_eq!(entries[1]["label"].text(), "r1");
    assert_eq!(entries[1]["ended"].text(), "released");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(server.info_int("lock_long_holds"), 2);
}

#[test]
fn the_oldest_waiter_is_timed_in_info() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(server.info_int("lock_oldest_wait_ms"), 0);
    acquire(&mut c, "busy", "holder", 60_000);
    let mut waiter = queue_waiter(&server, "busy", "w", 1000, 0);
    wait_for("the waiter to age", || {
        (server.info_int("lock_oldest_wait_ms") >= 200).then_some(())
    });
    let tag = server.info_field("lock", "lock_oldest_wait_tag").unwrap();
    assert_eq!(tag, who(&mut c, &["busy"])["tag"].text());
    assert_eq!(c.call(&["LOCK.RELEASE", "busy", "holder"]), Reply::Int(1));
    granted(&mut waiter);
    assert_eq!(server.info_int("lock_oldest_wait_ms"), 0);
    assert_eq!(
        server.info_field("lock", "lock_oldest_wait_tag").unwrap(),
        ""
    );
}

#[test]
fn command_docs_key_specs_and_flags_of_who_and_longholds() {
    let server = Server::start();
    let mut c = server.conn();
    let docs = c.call(&["COMMAND", "DOCS", "lock.who"]);
    let doc = fields_map(&docs.items()[1]);
    assert_eq!(doc["since"].text(), "0.2.0");
    assert_eq!(doc["group"].text(), "module");
    let names: Vec<String> = doc["arguments"]
        .items()
        .iter()
        .map(|a| fields_map(a)["name"].text())
        .collect();
    assert_eq!(names, ["key", "count", "client-id"]);
    assert_eq!(
        c.call(&["COMMAND", "GETKEYS", "LOCK.WHO", "orders:42", "COUNT", "3"]),
        Reply::Array(vec![Reply::bulk("orders:42")])
    );
    let info = c.call(&["COMMAND", "INFO", "lock.who"]);
    let info = &info.items()[0];
    assert_eq!(info.items()[1], Reply::Int(-2));
    let flags: Vec<String> = info.items()[2].items().iter().map(Reply::text).collect();
    assert!(flags.contains(&"readonly".to_string()), "{flags:?}");
    assert!(!flags.contains(&"write".to_string()), "{flags:?}");
    // The key spec: read-only access.
    let specs = format!("{:?}", info.items()[8]);
    assert!(specs.contains("RO"), "{specs}");

    let docs = c.call(&["COMMAND", "DOCS", "lock.longholds"]);
    let doc = fields_map(&docs.items()[1]);
    assert_eq!(doc["since"].text(), "0.2.0");
    let info = c.call(&["COMMAND", "INFO", "lock.longholds"]);
    let flags: Vec<String> = info.items()[0].items()[2]
        .items()
        .iter()
        .map(Reply::text)
        .collect();
    assert!(flags.contains(&"admin".to_string()), "{flags:?}");
    assert_eq!(info.items()[0].items()[3], Reply::Int(0), "no key");
}

#[test]
fn a_label_given_in_a_script_stays_a_label_and_the_connection_is_unknown() {
    let server = Server::start();
    let mut c = server.conn();
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'secret-9', 60000, 'LABEL', 'host-7')";
    assert!(matches!(c.call(&["EVAL", script, "1", "k"]), Reply::Int(_)));
    let h = entries(&who(&mut c, &["k"]), "holders").remove(0);
    assert_eq!(h["label"].text(), "host-7");
    assert_eq!(h["client_name"].text(), "");
    assert_eq!(h["client_addr"].text(), "");
    assert_eq!(h["client_id"], Reply::Int(0));
    assert_eq!(h["connected"], Reply::Int(-1));
    // A refresh from a connection names it; a later one from a script keeps it.
    let (addr, id) = client_addr_and_id(&mut c);
    acquire_with(&mut c, "k", "secret-9", 60_000, &[]).int();
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'secret-9', 60000, 'LABEL', 'host-8')";
    assert!(matches!(c.call(&["EVAL", script, "1", "k"]), Reply::Int(_)));
    let h = entries(&who(&mut c, &["k"]), "holders").remove(0);
    assert_eq!(h["client_id"], Reply::Int(id));
    assert_eq!(h["client_addr"].text(), addr);
    assert_eq!(h["label"].text(), "host-8");
    assert_eq!(h["connected"], Reply::Int(1));
    // LOCK.WHO and LOCK.FORCERELEASE from a script too.
    let script = "return redis.call('LOCK.WHO', KEYS[1])";
    assert_eq!(
        fields_map(&c.call(&["EVAL", script, "1", "k"]))["holders_total"],
        Reply::Int(1)
    );
    let script = "return redis.call('LOCK.FORCERELEASE', KEYS[1])";
    assert_eq!(c.call(&["EVAL", script, "1", "k"]), Reply::Int(1));
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
}

#[test]
fn holds_already_held_become_long_when_the_threshold_is_set_and_tags_survive_swapdb() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "short", TOKEN, 3_000);
    acquire(&mut c, "long", TOKEN, 600_000);
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.long-hold", "300"]),
        Reply::status("OK")
    );
    wait_for("both holds to become long", || {
        (server.info_int("lock_long_holds") == 2).then_some(())
    });
    // SWAPDB moves the locks; their tags stay those of their names.
    let tag = who(&mut c, &["long"])["tag"].text();
    assert_eq!(c.call(&["SWAPDB", "0", "1"]), Reply::status("OK"));
    assert_eq!(c.call(&["SELECT", "1"]), Reply::status("OK"));
    assert_eq!(who(&mut c, &["long"])["tag"].text(), tag);
    let oldest = server.info_field("lock", "lock_oldest_hold_tag").unwrap();
    let short_tag = who(&mut c, &["short"])["tag"].text();
    assert!(oldest == tag || oldest == short_tag, "{oldest}");
}

#[test]
fn the_oldest_hold_follows_releases_renames_reloads_and_flushes() {
    let server = Server::start();
    let mut c = server.conn();
    let oldest_tag = || server.info_field("lock", "lock_oldest_hold_tag").unwrap();
    // Three grants in three different milliseconds, oldest first.
    for key in ["first", "second", "third"] {
        let before = now_ms();
        acquire(&mut c, key, TOKEN, 600_000);
        wait_for("the clock to move on", || {
            (now_ms() > before + 1).then_some(())
        });
    }
    let tag_of = |c: &mut Conn, key: &str| who(c, &[key])["tag"].text();
    assert_eq!(oldest_tag(), tag_of(&mut c, "first"));
    // A renewal keeps the grant time; a release of a younger hold changes nothing.
    assert_eq!(
        c.call(&["LOCK.RENEW", "first", TOKEN, "600000"]),
        Reply::Int(1)
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "second", TOKEN]), Reply::Int(1));
    assert_eq!(oldest_tag(), tag_of(&mut c, "first"));
    // Renamed, it keeps its age under its new name's tag, and through a reload.
    assert_eq!(c.call(&["RENAME", "first", "renamed"]), Reply::status("OK"));
    let renamed = tag_of(&mut c, "renamed");
    assert_eq!(oldest_tag(), renamed);
    let age = server.info_int("lock_oldest_hold_ms");
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(oldest_tag(), renamed);
    assert!(server.info_int("lock_oldest_hold_ms") >= age);
    // Released, the next oldest is the third; a copy of it is as old.
    assert_eq!(c.call(&["LOCK.RELEASE", "renamed", TOKEN]), Reply::Int(1));
    let third = tag_of(&mut c, "third");
    assert_eq!(oldest_tag(), third);
    assert_eq!(c.call(&["COPY", "third", "copied"]), Reply::Int(1));
    assert_eq!(c.call(&["DEL", "third"]), Reply::Int(1));
    assert_eq!(oldest_tag(), tag_of(&mut c, "copied"));
    assert_eq!(c.call(&["FLUSHALL", "ASYNC"]), Reply::status("OK"));
    wait_for("the flush to end every hold", || {
        (server.info_int("lock_oldest_hold_ms") == 0).then_some(())
    });
    assert_eq!(oldest_tag(), "");
    // New holds after the flush are tracked from scratch.
    acquire(&mut c, "after", TOKEN, 600_000);
    assert_eq!(oldest_tag(), tag_of(&mut c, "after"));
}

#[test]
fn the_oldest_hold_of_a_shared_lock_moves_only_when_its_oldest_holder_leaves() {
    let server = Server::start();
    let mut c = server.conn();
    let oldest = || server.info_int("lock_oldest_hold_ms");
    let mut granted = Vec::new();
    for token in ["first", "second", "third"] {
        granted.push(now_ms());
        let reply = c.call(&["LOCK.ACQUIRE", "shared", token, "600000", "SHARED"]);
        assert!(reply.int() > 0, "{reply:?}");
        let after = now_ms();
        wait_for("300 ms to pass", || (now_ms() > after + 300).then_some(()));
    }
    let age_of = |i: usize| now_ms() - granted[i];
    // A newer holder changes nothing; the oldest is the first.
    let reply = c.call(&["LOCK.ACQUIRE", "shared", "fourth", "600000", "SHARED"]);
    assert!(reply.int() > 0, "{reply:?}");
    let first = oldest() as u64;
    assert!(first.abs_diff(age_of(0)) <= 100, "{first} vs {}", age_of(0));
    // A younger holder leaving changes nothing either.
    assert_eq!(c.call(&["LOCK.RELEASE", "shared", "third"]), Reply::Int(1));
    assert!(oldest() as u64 >= first);
    // The oldest leaving: the second is the oldest now, about 300 ms younger.
    assert_eq!(c.call(&["LOCK.RELEASE", "shared", "first"]), Reply::Int(1));
    let second = oldest() as u64;
    assert!(
        second.abs_diff(age_of(1)) <= 100,
        "{second} vs {}",
        age_of(1)
    );
    assert!(second + 200 <= age_of(0), "{second} vs {}", age_of(0));
    assert_eq!(c.call(&["LOCK.RELEASE", "shared", "second"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "shared", "fourth"]), Reply::Int(1));
    assert_eq!(oldest(), 0);
}

/// The long-hold log keeps at most 128 bytes of a key name, client name, address or label, as
/// SLOWLOG keeps of an argument, marked with how many more there were: after the keys are gone,
/// the log takes little memory however long their names were.
#[test]
fn the_long_hold_log_keeps_128_bytes_of_each_name_however_long() {
    const ENTRIES: usize = 16;
    const MIB: usize = 1 << 20;
    // The server's own logs keep a whole client name with each entry: off.
    let server = Server::start_with(Config::default().with("slowlog-log-slower-than", "-1"));
    let mut c = server.conn();
    if server.identity().commandlog() {
        for log in [
            "commandlog-request-larger-than",
            "commandlog-reply-larger-than",
        ] {
            assert_eq!(c.call(&["CONFIG", "SET", log, "-1"]), Reply::status("OK"));
        }
    }
    let (addr, id) = client_addr_and_id(&mut c);
    let name = "n".repeat(MIB);
    assert_eq!(c.call(&["CLIENT", "SETNAME", &name]), Reply::status("OK"));
    let label = "l".repeat(128);
    let key = |i: usize| format!("{i:02}{}", "k".repeat(MIB - 2));
    let hold = |c: &mut Conn, i: usize| {
        acquire_with(c, &key(i), TOKEN, 60_000, &["LABEL", &label]).int();
    };
    // The same commands once, without a long hold: whatever they allocate for good is counted
    // before.
    hold(&mut c, 99);
    assert_eq!(c.call(&["DEL", &key(99)]), Reply::Int(1));
    let before = server.info_int("used_memory");
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.long-hold", "100"]),
        Reply::status("OK")
    );
    for i in 0..ENTRIES {
        hold(&mut c, i);
    }
    wait_for("every hold to become long", || {
        (server.info_int("lock_long_holds") == ENTRIES as i64).then_some(())
    });
    let first_tag = server.info_field("lock", "lock_oldest_hold_tag").unwrap();
    for i in 0..ENTRIES {
        assert_eq!(c.call(&["DEL", &key(i)]), Reply::Int(1));
    }
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.long-hold", "0"]),
        Reply::status("OK")
    );
    let grown = server.info_int("used_memory") - before;
    // Whole, each entry kept its key name and client name: 2 MiB.
    assert!(
        grown < (ENTRIES * MIB / 4) as i64,
        "used_memory grew by {grown} bytes for {ENTRIES} logged holds of deleted keys"
    );
    let cut = |text: &str| format!("{}... ({} more bytes)", &text[..128], text.len() - 128);
    let log = c.call(&["LOCK.LONGHOLDS", "GET", "-1"]);
    assert_eq!(log.items().len(), ENTRIES);
    let mut seen = Vec::new();
    for entry in log.items().iter().map(fields_map) {
        let i: usize = entry["key"].text()[..2].parse().unwrap();
        assert_eq!(entry["key"], Reply::Bulk(cut(&key(i)).into_bytes()), "{i}");
        assert_eq!(entry["client_name"], Reply::Bulk(cut(&name).into_bytes()));
        assert_eq!(entry["client_addr"].text(), addr);
        assert_eq!(entry["client_id"], Reply::Int(id));
        assert_eq!(entry["label"].text(), label);
        assert_eq!(entry["ended"].text(), "deleted");
        if i == 0 {
            // The tag is the whole name's, as INFO showed it.
            assert_eq!(entry["tag"].text(), first_tag);
        }
        seen.push(i);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..ENTRIES).collect::<Vec<_>>());
}

/// A client name is the client's to choose, of any length: a grant and a queued waiter keep at
/// most 128 bytes of it, cut as the long-hold log cuts it. A hold's copy travels with every
/// change of the hold (the AOF, replicas, RDB), and LOCK.WHO shows what it kept.
#[test]
fn a_grant_and_a_waiter_keep_128_bytes_of_a_client_name() {
    const MIB: usize = 1 << 20;
    const RENEWALS: usize = 20;
    let server = Server::start_with(
        Config::default()
            .with("appendonly", "yes")
            .with("slowlog-log-slower-than", "-1"),
    );
    let mut holder = server.conn();
    let mut waiter = server.conn();
    let (waiter_addr, _) = client_addr_and_id(&mut waiter);
    let name = "n".repeat(MIB);
    let cut = format!("{}... ({} more bytes)", &name[..128], MIB - 128);
    let is_cut = |reply: &Reply| {
        assert!(
            *reply == Reply::Bulk(cut.clone().into_bytes()),
            "a client name of {} bytes",
            reply.text().len()
        );
    };
    for c in [&mut holder, &mut waiter] {
        assert_eq!(c.call(&["CLIENT", "SETNAME", &name]), Reply::status("OK"));
    }
    acquire_with(&mut holder, "k", TOKEN, 60_000, &["LABEL", "job-7"]).int();
    // Each renewal writes the hold to the AOF: with the whole name, 1 MiB each.
    let aof = || server.info_int("aof_current_size");
    let before = aof();
    for _ in 0..RENEWALS {
        assert_eq!(
            holder.call(&["LOCK.RENEW", "k", TOKEN, "60000"]),
            Reply::Int(1)
        );
    }
    let grown = aof() - before;
    assert!(
        grown < (RENEWALS * 4096) as i64,
        "the AOF grew by {grown} bytes for {RENEWALS} renewals"
    );
    let mut c = server.conn();
    let usage = c.call(&["MEMORY", "USAGE", "k"]).int();
    assert!(usage < 4096, "MEMORY USAGE {usage}");
    waiter.send(&[
        "LOCK.ACQUIRE",
        "k",
        "other",
        "60000",
        "WAIT",
        "60000",
        "LABEL",
        "next",
    ]);
    wait_blocked(&server, 1);
    let listed = who(&mut c, &["k"]);
    let held = &entries(&listed, "holders")[0];
    is_cut(&held["client_name"]);
    assert_eq!(held["label"].text(), "job-7");
    let queued = &entries(&listed, "waiters")[0];
    is_cut(&queued["client_name"]);
    assert_eq!(queued["client_addr"].text(), waiter_addr);
    assert_eq!(queued["label"].text(), "next");
    // Granted, the waiter's hold keeps the same, after a restart too.
    assert_eq!(holder.call(&["LOCK.RELEASE", "k", TOKEN]), Reply::Int(1));
    assert!(matches!(waiter.read(), Reply::Int(_)));
    let mut server = server;
    server.shutdown_and_restart();
    let mut c = server.conn();
    let listed = who(&mut c, &["k"]);
    let held = &entries(&listed, "holders")[0];
    is_cut(&held["client_name"]);
    assert_eq!(held["client_addr"].text(), waiter_addr);
    assert_eq!(held["label"].text(), "next");
}
