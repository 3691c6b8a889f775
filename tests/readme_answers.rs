//! Answers README.md gives to questions a reader writing tests from it asked: each test holds
//! one sentence or table cell of the README to what the server does.

mod common;

use std::collections::BTreeMap;

use common::*;

fn who(c: &mut Conn, args: &[&str]) -> BTreeMap<String, Reply> {
    let mut call = vec!["LOCK.WHO"];
    call.extend_from_slice(args);
    fields_map(&c.call(&call))
}

fn entries(who: &BTreeMap<String, Reply>, list: &str) -> Vec<BTreeMap<String, Reply>> {
    who[list].items().iter().map(fields_map).collect()
}

/// LOCK.WHO: "`holders_total` | how many holders the lock has, all of them even with CLIENT";
/// "`waiters_total` | how many clients are queued to acquire it (LOCK.ACQUIRE or LOCK.MACQUIRE
/// with WAIT), all of them even with CLIENT; LOCK.WAIT callers are counted in `watchers` only".
#[test]
fn who_totals_ignore_client_and_leave_lock_wait_callers_out() {
    let server = Server::start();
    let mut first = server.conn();
    let mut second = server.conn();
    let (_, first_id) = client_addr_and_id(&mut first);
    acquire_with(&mut first, "k", "tok-a", 60_000, &["SHARED"]).int();
    acquire_with(&mut second, "k", "tok-b", 60_000, &["SHARED"]).int();
    let mut waiter = server.conn();
    let (_, waiter_id) = client_addr_and_id(&mut waiter);
    waiter.send(&["LOCK.ACQUIRE", "k", "tok-c", "60000", "WAIT", "0"]);
    wait_blocked(&server, 1);
    let mut multi = server.conn();
    multi.send(&["LOCK.MACQUIRE", "1", "k", "tok-d", "60000", "WAIT", "0"]);
    wait_blocked(&server, 2);
    let mut watcher = server.conn();
    watcher.send(&["LOCK.WAIT", "k", "0"]);
    wait_blocked(&server, 3);

    let mut op = server.conn();
    let all = who(&mut op, &["k"]);
    assert_eq!(all["holders_total"], Reply::Int(2));
    assert_eq!(all["waiters_total"], Reply::Int(2));
    assert_eq!(entries(&all, "waiters").len(), 2);
    assert_eq!(all["watchers"], Reply::Int(1));

    let mine = who(&mut op, &["k", "CLIENT", &first_id.to_string()]);
    assert_eq!(mine["holders_total"], Reply::Int(2));
    assert_eq!(entries(&mine, "holders").len(), 1);
    assert_eq!(mine["waiters_total"], Reply::Int(2));
    assert_eq!(entries(&mine, "waiters").len(), 0);

    let queued = who(&mut op, &["k", "CLIENT", &waiter_id.to_string()]);
    assert_eq!(queued["holders_total"], Reply::Int(2));
    assert_eq!(entries(&queued, "holders").len(), 0);
    assert_eq!(queued["waiters_total"], Reply::Int(2));
    assert_eq!(entries(&queued, "waiters").len(), 1);
    assert_eq!(queued["watchers"], Reply::Int(1));
}

/// INFO: `lock_oldest_wait_tag` is "the same for the client that has waited longest (an
/// acquirer or a LOCK.WAIT caller), 0 and empty when nobody waits"; `lock_oldest_hold_tag` is
/// "empty when nothing is held".
#[test]
fn oldest_tags_are_empty_when_nothing_is_held_or_awaited_and_a_watcher_counts() {
    let server = Server::start();
    let tag = |field: &str| server.info_field("lock", field).unwrap();
    assert_eq!(tag("lock_oldest_hold_tag"), "");
    assert_eq!(tag("lock_oldest_wait_tag"), "");
    assert_eq!(server.info_int("lock_oldest_wait_ms"), 0);
    let mut c = server.conn();
    acquire(&mut c, "busy", "holder", 60_000);
    let busy = who(&mut c, &["busy"])["tag"].text();
    assert_eq!(tag("lock_oldest_hold_tag"), busy);
    assert_eq!(tag("lock_oldest_wait_tag"), "");
    let mut watcher = server.conn();
    watcher.send(&["LOCK.WAIT", "busy", "0"]);
    wait_blocked(&server, 1);
    assert_eq!(tag("lock_oldest_wait_tag"), busy);
    assert_eq!(c.call(&["LOCK.RELEASE", "busy", "holder"]), Reply::Int(1));
    assert_eq!(watcher.read(), Reply::Int(1));
    assert_eq!(tag("lock_oldest_hold_tag"), "");
    assert_eq!(tag("lock_oldest_wait_tag"), "");
    assert_eq!(server.info_int("lock_oldest_hold_ms"), 0);
    assert_eq!(server.info_int("lock_oldest_wait_ms"), 0);
}

/// LABEL: "1 to 128 bytes"; the error is `ERR invalid label: printable ASCII without spaces, at
/// most 128 bytes` "also for an empty label, `LABEL ""`", for LOCK.MACQUIRE too.
#[test]
fn an_empty_label_is_refused() {
    let server = Server::start();
    let mut c = server.conn();
    let error =
        Reply::error("ERR invalid label: printable ASCII without spaces, at most 128 bytes");
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "tok", "1000", "LABEL", ""]),
        error
    );
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "1", "k", "tok", "1000", "LABEL", ""]),
        error
    );
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    let longest = "x".repeat(128);
    assert!(acquire_with(&mut c, "k", "tok", 1000, &["LABEL", "x"]).is_int());
    assert!(acquire_with(&mut c, "k", "tok", 1000, &["LABEL", &longest]).is_int());
    assert_eq!(
        c.call(&[
            "LOCK.ACQUIRE",
            "k",
            "tok",
            "1000",
            "LABEL",
            &"x".repeat(129)
        ]),
        error
    );
}

/// LOCK.WHO's `connected`: "`DEBUG RELOAD` closes no connection, so a hold whose connection is
/// open still shows 1 after it".
#[test]
fn connected_stays_1_through_debug_reload() {
    let server = Server::start();
    let mut holder = server.conn();
    acquire(&mut holder, "plain", "tok", 60_000);
    acquire_with(&mut holder, "session", "tok", 60_000, &["SESSION"]).int();
    let mut op = server.conn();
    let connected =
        |op: &mut Conn, key: &str| entries(&who(op, &[key]), "holders")[0]["connected"].clone();
    assert_eq!(connected(&mut op, "plain"), Reply::Int(1));
    assert_eq!(op.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(connected(&mut op, "plain"), Reply::Int(1));
    assert_eq!(connected(&mut op, "session"), Reply::Int(1));
    drop(holder);
    wait_for("the holder's close to be seen", || {
        (connected(&mut op, "plain") == Reply::Int(0)).then_some(())
    });
}

/// INFO's wait histogram: "A new grant that did not wait is a sample of 0 ms (one per key of a
/// LOCK.MACQUIRE); a refresh by the holder's token adds none."
#[test]
fn grants_that_never_waited_are_zero_samples_and_refreshes_are_none() {
    let server = Server::start();
    let count = || server.info_int("lock_acquire_wait_ms_count");
    let le_1 = || server.info_int("lock_acquire_wait_ms_bucket_le_1");
    let sum = || server.info_int("lock_acquire_wait_ms_sum");
    let mut c = server.conn();
    assert_eq!((count(), le_1(), sum()), (0, 0, 0));
    acquire(&mut c, "a", "tok", 60_000);
    assert_eq!((count(), le_1(), sum()), (1, 1, 0));
    acquire(&mut c, "a", "tok", 60_000);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "a", "tok", "60000", "REENTRANT"]),
        Reply::Int(fence_of(&mut c, "a"))
    );
    assert_eq!((count(), le_1(), sum()), (1, 1, 0));
    assert_eq!(
        c.call(&["LOCK.MACQUIRE", "2", "{m}1", "{m}2", "tok", "60000"])
            .items()
            .len(),
        2
    );
    assert_eq!((count(), le_1(), sum()), (3, 3, 0));
    assert_eq!(server.info_int("lock_acquired"), 5);
}

/// LOCK.LONGHOLDS: "RESET empties the log only: ids go on from where they were ..., and INFO's
/// `lock_long_holds` keeps counting from its old value. Lowering `lock.long-hold-log-len` does
/// not trim the log at the CONFIG SET but before the next LOCK.LONGHOLDS answers (or when the
/// next entry is logged), so LEN and GET never show more entries than the new length, the
/// newest kept."
#[test]
fn longholds_reset_keeps_ids_and_counter_and_a_shorter_log_is_trimmed_lazily() {
    let server = Server::start_with(Config::default().module_arg("long-hold").module_arg("50"));
    let mut c = server.conn();
    let long_holds = || server.info_int("lock_long_holds");
    let cross = |c: &mut Conn, key: &str, total: i64| {
        acquire(c, key, "tok", 600_000);
        wait_for("the hold to become long", || {
            (long_holds() == total).then_some(())
        });
    };
    let ids = |c: &mut Conn| -> Vec<i64> {
        c.call(&["LOCK.LONGHOLDS", "GET", "-1"])
            .items()
            .iter()
            .map(|e| fields_map(e)["id"].int())
            .collect()
    };
    let set_len = |c: &mut Conn, len: &str| {
        assert_eq!(
            c.call(&["CONFIG", "SET", "lock.long-hold-log-len", len]),
            Reply::status("OK")
        );
    };
    for (n, key) in ["a", "b", "c"].into_iter().enumerate() {
        cross(&mut c, key, n as i64 + 1);
    }
    assert_eq!(ids(&mut c), vec![2, 1, 0]);

    // Lowered and raised again before any LOCK.LONGHOLDS: nothing was trimmed.
    set_len(&mut c, "1");
    set_len(&mut c, "128");
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(3));
    // Lowered, the next LOCK.LONGHOLDS keeps the newest; raising it brings nothing back.
    set_len(&mut c, "2");
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(2));
    set_len(&mut c, "128");
    assert_eq!(ids(&mut c), vec![2, 1]);
    // Lowered, the next entry trims it too.
    set_len(&mut c, "1");
    cross(&mut c, "d", 4);
    set_len(&mut c, "128");
    assert_eq!(ids(&mut c), vec![3]);

    // RESET: the log is empty, the counter and the ids go on.
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "RESET"]), Reply::status("OK"));
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(0));
    assert_eq!(long_holds(), 4);
    cross(&mut c, "e", 5);
    assert_eq!(ids(&mut c), vec![4]);
}

/// LOCK.LONGHOLDS errors: "for GET with more than one argument (`LOCK.LONGHOLDS GET 1 2`) `ERR
/// wrong number of arguments for 'lock.longholds' command`".
#[test]
fn longholds_get_with_two_arguments_is_a_wrong_arity() {
    let server = Server::start();
    let mut c = server.conn();
    let arity = Reply::error("ERR wrong number of arguments for 'lock.longholds' command");
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "GET", "1", "2"]), arity);
    assert_eq!(c.call(&["LOCK.LONGHOLDS", "GET", "x", "y"]), arity);
    assert_eq!(
        c.call(&["LOCK.LONGHOLDS", "LEN", "1"]),
        Reply::error(
            "ERR unknown subcommand or wrong number of arguments for LOCK.LONGHOLDS (expected \
             GET [count], LEN or RESET)"
        )
    );
}

/// LOCK.MACQUIRE errors: "`ERR option REENTRANT is not supported by LOCK.MACQUIRE`, likewise
/// for SHARED, LIMIT, SYNC and FSYNC (`ERR option FSYNC is not supported by LOCK.MACQUIRE` for
/// `FSYNC 100`; a missing or malformed ms is reported first, as by LOCK.ACQUIRE)".
#[test]
fn macquire_refuses_fsync_and_the_other_single_key_options() {
    let server = Server::start();
    let mut c = server.conn();
    let base = ["LOCK.MACQUIRE", "1", "k", "tok", "1000"];
    for (extra, error) in [
        (
            &["FSYNC", "100"][..],
            "ERR option FSYNC is not supported by LOCK.MACQUIRE",
        ),
        (
            &["SYNC", "1", "100"],
            "ERR option SYNC is not supported by LOCK.MACQUIRE",
        ),
        (
            &["REENTRANT"],
            "ERR option REENTRANT is not supported by LOCK.MACQUIRE",
        ),
        (
            &["SHARED"],
            "ERR option SHARED is not supported by LOCK.MACQUIRE",
        ),
        (
            &["LIMIT", "2"],
            "ERR option LIMIT is not supported by LOCK.MACQUIRE",
        ),
        (
            &["FSYNC"],
            "ERR invalid FSYNC timeout-ms: missing after FSYNC",
        ),
        (
            &["FSYNC", "x"],
            "ERR invalid FSYNC timeout-ms: not an integer",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_eq!(c.call(&args), Reply::error(error), "{args:?}");
    }
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
}

/// Upgrading: "This release is 0.2.0, `ver` 200 in `MODULE LIST`".
#[test]
fn the_release_named_in_upgrading_is_the_one_module_list_shows() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let parts: Vec<i64> = version.split('.').map(|p| p.parse().unwrap()).collect();
    let ver = parts[0] * 10_000 + parts[1] * 100 + parts[2];
    let sentence = format!("This release is {version}, `ver` {ver} in `MODULE LIST`");
    assert!(readme.contains(&sentence), "README lacks {sentence:?}");
    let server = Server::start();
    let mut c = server.conn();
    let modules = c.call(&["MODULE", "LIST"]);
    let lock = modules
        .items()
        .iter()
        .map(Reply::items)
        .find(|fields| fields[1] == Reply::bulk("lock"))
        .expect("the lock module");
    assert_eq!(lock[3], Reply::Int(ver));
}
