//! Review of LOCK.LIST, the max-reentrancy rule and the per-namespace metrics fixes (0502bed,
//! 56085d2): each test checks one thing the README promises, and fails while it does not hold.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

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

/// A whole iteration from cursor 0: every entry, by key.
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

/// CPU time (user and system) the server's main thread has used.
fn main_cpu(server: &Server) -> Duration {
    let info = server.conn().call(&["INFO", "cpu"]).text();
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO cpu {name}"))
    };
    Duration::from_secs_f64(
        field("used_cpu_user_main_thread:") + field("used_cpu_sys_main_thread:"),
    )
}

fn cpu_of(server: &Server, work: impl FnOnce()) -> Duration {
    let before = main_cpu(server);
    work();
    main_cpu(server).saturating_sub(before)
}

/// Sends `commands` pipelined in batches, and checks each reply with `ok`.
fn pipelined(c: &mut Conn, commands: &[Vec<String>], ok: impl Fn(&Reply) -> bool) {
    for batch in commands.chunks(1_000) {
        for command in batch {
            c.send(command);
        }
        for command in batch {
            let reply = c.read();
            assert!(ok(&reply), "{command:?}: {reply:?}");
        }
    }
}

/// Sends PINGs one after another until stopped; returns the longest round trip.
struct Pinger {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl Pinger {
    fn start(server: &Server) -> Pinger {
        let mut c = server.conn();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                let sent = Instant::now();
                assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
                worst = worst.max(sent.elapsed());
            }
            worst
        });
        Pinger { stop, thread }
    }

    fn worst(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("pinger")
    }
}

// ---------------------------------------------------------------------------------------------
// LOCK.LIST: cost of one call.

/// A server with five shared locks `crowd:<k>` of `n` holders each: the CPU of 300
/// `LOCK.LIST 0 COUNT 100` calls (each lists the five locks).
fn list_crowded_locks(n: usize) -> Duration {
    let server = Server::start();
    let mut c = server.conn();
    let commands: Vec<Vec<String>> = (0..5)
        .flat_map(|k| {
            (0..n).map(move |i| {
                [
                    "LOCK.ACQUIRE",
                    &format!("crowd:{k}"),
                    &format!("t{i}"),
                    "600000",
                    "SHARED",
                ]
                .map(String::from)
                .to_vec()
            })
        })
        .collect();
    pipelined(&mut c, &commands, Reply::is_int);
    let (_, entries) = page(&mut c, &["0", "COUNT", "100"]);
    assert_eq!(entries.len(), 5);
    assert!(entries.iter().all(|e| e["holders"] == Reply::Int(n as i64)));
    cpu_of(&server, || {
        for _ in 0..300 {
            let (_, entries) = page(&mut c, &["0", "COUNT", "100"]);
            assert_eq!(entries.len(), 5);
        }
    })
}

/// README, costs table: "LOCK.LIST | O(COUNT) per call, as SCAN". A call walks all the holders
/// of every lock it lists to count them (`lock.live_holders(now).count()` in
/// src/service/list.rs, like LOCK.INFO, whose row says "O(N) for a key with N shared or permit
/// holders"), so the same calls over the same five locks cost several times more when each
/// has 10,000 holders (the most a lock may have) than 10.
#[test]
fn a_lock_list_call_costs_the_same_whatever_the_holders_of_the_locks_it_lists() {
    let small = list_crowded_locks(10);
    let big = list_crowded_locks(10_000);
    println!(
        "300 LOCK.LIST calls over 5 locks: {small:?} with 10 holders each, {big:?} with 10,000"
    );
    assert!(
        big <= small.max(Duration::from_millis(10)) * 3,
        "300 calls over 5 locks: {small:?} with 10 holders each, {big:?} with 10,000"
    );
}

// ---------------------------------------------------------------------------------------------
// max-reentrancy.

/// Sends an acquire on a new connection and waits until the server has blocked it.
fn queue_acquire(server: &Server, args: &[&str]) -> Conn {
    let before = blocked(server);
    let mut conn = server.conn();
    conn.send(args);
    wait_blocked(server, before + 1);
    conn
}

fn holds_of(c: &mut Conn, key: &str) -> i64 {
    lock_field(c, key, "holds").int()
}

/// README, max-reentrancy: "the token holds the lock n times already: -POLICY". A REENTRANT
/// acquire that queued (WAIT) while its token did not hold the lock is granted by the handoff
/// after an earlier waiter with the same token got it: the handoff re-acquires REENTRANT
/// without the policy's check (only `commands::acquire` calls `policy::admit_reentrant`), and
/// the token ends with 2 holds in a namespace of max-reentrancy=1.
#[test]
fn a_queued_reentrant_acquire_never_takes_more_holds_than_max_reentrancy() {
    let server = Server::start_with(
        Config::default().namespaces("orders prefix=orders: max-reentrancy=1 mode=enforce"),
    );
    let mut c = server.conn();
    acquire(&mut c, "orders:1", "other", 60_000);
    // The direct path is refused.
    acquire(&mut c, "orders:2", "tok", 60_000);
    let direct = c.call(&["LOCK.ACQUIRE", "orders:2", "tok", "60000", "REENTRANT"]);
    assert!(
        direct
            .error_bytes()
            .is_some_and(|e| e.starts_with(b"POLICY orders:")),
        "{direct:?}"
    );
    assert_eq!(holds_of(&mut c, "orders:2"), 1);
    // Two waiters with one token (a client's retry on a new connection, say).
    let mut first = queue_acquire(
        &server,
        &["LOCK.ACQUIRE", "orders:1", "tok", "60000", "WAIT", "10000"],
    );
    let mut second = queue_acquire(
        &server,
        &[
            "LOCK.ACQUIRE",
            "orders:1",
            "tok",
            "60000",
            "REENTRANT",
            "WAIT",
            "10000",
        ],
    );
    assert_eq!(
        c.call(&["LOCK.RELEASE", "orders:1", "other"]),
        Reply::Int(1)
    );
    assert!(first.read().is_int());
    let second = second.read();
    let holds = holds_of(&mut c, "orders:1");
    assert_eq!(
        holds, 1,
        "max-reentrancy=1 but the token holds orders:1 {holds} times (second waiter: {second:?})"
    );
    assert!(
        second
            .error_bytes()
            .is_some_and(|e| e.starts_with(b"POLICY orders:")),
        "{second:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The namespaces' spaces, and the walk and merge after a policy change.

/// `count` policies in turn, each of 32 namespaces never named before (the most a policy may
/// have): every name gets a space of its own for the life of the process.
fn churn_namespace_names(c: &mut Conn, count: usize) {
    for round in 0..count {
        let policy: Vec<String> = (0..32)
            .map(|j| format!("r{round}n{j} prefix=r{round}n{j}:"))
            .collect();
        assert_eq!(
            c.call(&["CONFIG", "SET", "lock.namespaces", &policy.join("; ")]),
            Reply::status("OK"),
            "round {round}"
        );
    }
}

/// `n` held locks `m:<i>`, granted over a few hundred ms (their grant times differ, and the
/// keyspace's order is not theirs).
fn hold_spread_over_time(c: &mut Conn, n: usize) {
    for start in (0..n).step_by(250) {
        let commands: Vec<Vec<String>> = (start..(start + 250).min(n))
            .map(|i| {
                ["LOCK.ACQUIRE", &format!("m:{i}"), "t", "600000"]
                    .map(String::from)
                    .to_vec()
            })
            .collect();
        pipelined(c, &commands, Reply::is_int);
        sleep(Duration::from_millis(3));
    }
}

/// The longest PING while the module moves `n` held locks to a namespace put in force after
/// `churn` policies of new names, and puts their ages back in time order.
fn longest_ping_while_locks_move(churn: usize, n: usize) -> Duration {
    let server = Server::start();
    let mut c = server.conn();
    churn_namespace_names(&mut c, churn);
    hold_spread_over_time(&mut c, n);
    let pinger = Pinger::start(&server);
    sleep(Duration::from_millis(100));
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", "moved prefix=m:"]),
        Reply::status("OK")
    );
    // The walk and the merge after it.
    sleep(Duration::from_secs(3));
    let worst = pinger.worst();
    let info = server.conn().call(&["INFO", "lock"]).text();
    assert!(
        info.contains(&format!("lock_namespace_moved:held={n},")),
        "{info}"
    );
    worst
}

/// README, costs table: "after a change of `lock.namespaces` ... O(1) per key, then O(1) per held
/// lock put back in time order | 2 ms" slices. `Ages::merge_aside` (src/lock/ages.rs) looks for
/// the first list with locks set aside from list 0 on, for every lock it puts back: O(spaces)
/// per lock. Spaces are never reused (one per name a policy ever had, src/service/policy.rs
/// SPACES), so after 1,000 policies of 32 new names each, every step of 1,024 locks passes
/// ~32,000 lists, and the server stops answering for far longer than its slice.
#[test]
fn the_merge_after_a_policy_change_keeps_its_slice_after_many_namespace_names() {
    let control = longest_ping_while_locks_move(0, 10_000);
    let churned = longest_ping_while_locks_move(1_000, 10_000);
    println!("longest PING: {control:?} with fresh spaces, {churned:?} after 32,000 names");
    assert!(
        churned <= control.max(Duration::from_millis(20)) * 3,
        "longest PING while 10,000 locks move: {control:?} with few namespace names ever, \
         {churned:?} after 32,000"
    );
}

// ---------------------------------------------------------------------------------------------
// LOCK.LIST: callers.

/// The keys of a page reply (a RESP2 array of `[cursor, entries]`).
fn keys_of_page(reply: &Reply) -> Vec<String> {
    let items = reply.items();
    assert_eq!(items.len(), 2, "{reply:?}");
    let mut keys: Vec<String> = items[1]
        .items()
        .iter()
        .map(|entry| fields_map(entry)["key"].text())
        .collect();
    keys.sort();
    keys
}

/// README, LOCK.LIST: "Only the keys the caller's ACL user may read are listed". The same user
/// calling it directly, in MULTI and from a script sees the same locks: the script client and
/// the transaction run as the caller (checked on every server of the matrix: REDIS_SERVER).
#[test]
fn lock_list_in_multi_and_scripts_lists_what_the_caller_may_read() {
    let server = Server::start();
    let mut c = server.conn();
    for key in ["orders:1", "orders:2", "other"] {
        acquire(&mut c, key, "t", 60_000);
    }
    let setuser = ["ACL", "SETUSER", "app", "on", ">pw", "~orders:*", "+@all"];
    assert_eq!(c.call(&setuser), Reply::status("OK"));
    for (user, expected) in [
        ("default", vec!["orders:1", "orders:2", "other"]),
        ("app", vec!["orders:1", "orders:2"]),
    ] {
        let mut u = server.conn();
        if user == "app" {
            assert_eq!(u.call(&["AUTH", "app", "pw"]), Reply::status("OK"));
        }
        let direct = u.call(&["LOCK.LIST", "0", "COUNT", "100"]);
        assert_eq!(keys_of_page(&direct), expected, "{user} directly");
        assert_eq!(u.call(&["MULTI"]), Reply::status("OK"));
        assert_eq!(
            u.call(&["LOCK.LIST", "0", "COUNT", "100"]),
            Reply::status("QUEUED")
        );
        let exec = u.call(&["EXEC"]);
        assert_eq!(keys_of_page(&exec.items()[0]), expected, "{user} in MULTI");
        let script = "return redis.call('LOCK.LIST', '0', 'COUNT', '100')";
        let scripted = u.call(&["EVAL", script, "0"]);
        assert_eq!(keys_of_page(&scripted), expected, "{user} in a script");
        let ro = u.call(&["EVAL_RO", script, "0"]);
        assert_eq!(keys_of_page(&ro), expected, "{user} in a read-only script");
    }
}

/// `name:held=<n>` of the `lock_namespace_<name>` lines of an INFO text, by name.
fn held_by_namespace(info: &str) -> BTreeMap<String, i64> {
    info.lines()
        .filter_map(|l| l.trim().strip_prefix("lock_namespace_"))
        .map(|l| {
            let (name, fields) = l.split_once(':').expect("name:fields");
            let held = fields
                .split(',')
                .find_map(|f| f.strip_prefix("held="))
                .expect("held=")
                .parse()
                .expect("an integer");
            (name.to_string(), held)
        })
        .collect()
}

/// README, "Metrics by namespace": "until the walk reaches a lock, it counts in the namespace it
/// was in, by name (a namespace only moved in the policy keeps its locks)". The names' spaces
/// are kept in `SPACES` (src/service/policy.rs `install`), which is cleared once 65,535 names
/// have been seen: the next policy hands out space 1 again, and a lock of `orders` (space 1
/// since the first policy) counts in whichever namespace gets space 1 now, `batch` here, while
/// `orders`, still in the policy, counts none. INFO is read in the same MULTI as the CONFIG SET,
/// before the walk can have reached the lock.
#[test]
fn a_lock_not_moved_yet_counts_in_its_own_namespace_after_tens_of_thousands_of_names() {
    let server = Server::start_with(Config::default().namespaces("orders prefix=orders:"));
    let mut c = server.conn();
    acquire(&mut c, "orders:1", "t", 600_000);
    // `orders` has space 1 and `default` space 2; each round adds 31 names, with `orders` kept.
    let rounds = (65_535 - 2 - 33) / 31 + 1;
    for round in 0..rounds {
        let mut policy = vec!["orders prefix=orders:".to_string()];
        policy.extend((0..31).map(|j| format!("r{round}n{j} prefix=r{round}n{j}:")));
        c.send(&["CONFIG", "SET", "lock.namespaces", &policy.join("; ")]);
        if round % 100 == 99 || round + 1 == rounds {
            for _ in 0..(if round % 100 == 99 {
                100
            } else {
                round % 100 + 1
            }) {
                assert_eq!(c.read(), Reply::status("OK"));
            }
        }
    }
    let held = held_by_namespace(&c.call(&["INFO", "lock"]).text());
    assert_eq!(held["orders"], 1, "{held:?}");
    // 32 namespaces again: `batch` first, `orders` second.
    let mut policy = vec![
        "batch prefix=batch:".to_string(),
        "orders prefix=orders:".to_string(),
    ];
    policy.extend((0..30).map(|j| format!("last{j} prefix=last{j}:")));
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["CONFIG", "SET", "lock.namespaces", &policy.join("; ")]),
        Reply::status("QUEUED")
    );
    assert_eq!(c.call(&["INFO", "lock"]), Reply::status("QUEUED"));
    let exec = c.call(&["EXEC"]);
    assert_eq!(exec.items()[0], Reply::status("OK"));
    let held = held_by_namespace(&exec.items()[1].text());
    assert_eq!(
        (held["orders"], held["batch"]),
        (1, 0),
        "orders:1 must count in orders, never in batch: {held:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// LOCK.LIST: secrets and roles (regression tests: these pass).

/// README, Secrets: a token a client sends by mistake as any argument of LOCK.LIST reaches
/// neither the reply nor MONITOR nor SLOWLOG.
#[test]
fn a_token_given_to_lock_list_by_mistake_is_never_shown() {
    let server = Server::start_with(Config::default().namespaces("orders prefix=orders:"));
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]), Reply::status("OK"));
    let mut monitor = server.conn();
    assert_eq!(monitor.call(&["MONITOR"]), Reply::status("OK"));
    const TOKEN: &str = "secret-token-9f2c";
    let calls: [&[&str]; 6] = [
        &["LOCK.LIST", TOKEN],
        &["LOCK.LIST", "0", TOKEN],
        &["LOCK.LIST", "0", "COUNT", TOKEN],
        &["LOCK.LIST", "0", "OLDER", TOKEN],
        &["LOCK.LIST", "0", "NAMESPACE", TOKEN],
        &["LOCK.LIST", "0", "WAITING", "COUNT", "5", TOKEN],
    ];
    for call in calls {
        let reply = c.call(call);
        assert!(reply.is_error(), "{call:?}: {reply:?}");
        assert!(
            !reply.contains_bytes(TOKEN.as_bytes()),
            "{call:?}: {reply:?}"
        );
    }
    assert_eq!(c.call(&["PING", "end-of-calls"]).text(), "end-of-calls");
    let mut lines = Vec::new();
    loop {
        let line = monitor.read().text();
        if line.contains("end-of-calls") {
            break;
        }
        lines.push(line);
    }
    assert_eq!(
        lines.iter().filter(|l| l.contains("LOCK.LIST")).count(),
        calls.len(),
        "{lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains(TOKEN)),
        "the token in MONITOR: {lines:?}"
    );
    let slowlog = c.call(&["SLOWLOG", "GET", "100"]);
    assert!(!slowlog.contains_bytes(TOKEN.as_bytes()), "{slowlog:?}");
}

/// LOCK.LIST is read-only (README: "on replicas too"): a replica lists the locks it follows,
/// in a database other than 0 too, with the same fields as its primary.
#[test]
fn a_replica_lists_the_locks_of_every_database_as_its_primary_does() {
    let primary = Server::start_with(Config::default().namespaces("orders prefix=orders:"));
    let replica = Server::start_with(Config::default().namespaces("orders prefix=orders:"));
    replica.replicate_from(&primary);
    let mut p = primary.conn();
    assert_eq!(p.call(&["SELECT", "3"]), Reply::status("OK"));
    assert!(p
        .call(&["LOCK.ACQUIRE", "orders:7", "t", "600000", "LABEL", "l"])
        .is_int());
    assert!(p
        .call(&["LOCK.ACQUIRE", "shared", "t", "600000", "SHARED"])
        .is_int());
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(r.call(&["SELECT", "3"]), Reply::status("OK"));
    let on_primary = all(&mut p, &["COUNT", "100"]);
    let on_replica = all(&mut r, &["COUNT", "100"]);
    assert_eq!(
        on_replica.keys().cloned().collect::<Vec<_>>(),
        ["orders:7", "shared"]
    );
    for key in ["orders:7", "shared"] {
        for field in ["namespace", "mode", "holders", "labels", "waiters"] {
            assert_eq!(
                on_replica[key][field], on_primary[key][field],
                "{key} {field}: {on_replica:?}"
            );
        }
        assert!(on_replica[key]["held_ms"].int() >= 0, "{on_replica:?}");
    }
    // Database 0 has none.
    let mut r0 = replica.conn();
    assert_eq!(all(&mut r0, &["COUNT", "100"]).len(), 0);
}

/// README, "Metrics by namespace": each namespace's `held` is its share of `lock_held`. After a
/// policy change that renames, reorders and drops namespaces, once the walk is done, the shares
/// over every database (a SWAPDB in between) add up to `lock_held`, each where its key is now.
/// (A regression test: this passes.)
#[test]
fn after_a_policy_change_the_namespaces_held_add_up_to_lock_held() {
    let server = Server::start_with(
        Config::default().namespaces("a prefix=a:; b prefix=b:; gone prefix=g:"),
    );
    let mut c = server.conn();
    for db in ["0", "2"] {
        assert_eq!(c.call(&["SELECT", db]), Reply::status("OK"));
        for key in ["a:1", "a:2", "b:1", "g:1", "g:2", "g:3", "x"] {
            acquire(&mut c, key, "t", 600_000);
        }
    }
    assert!(c
        .call(&["LOCK.ACQUIRE", "b:2", "t", "600000", "SHARED"])
        .is_int());
    assert_eq!(c.call(&["SWAPDB", "0", "2"]), Reply::status("OK"));
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "lock.namespaces",
            "b prefix=b:; c prefix=a: prefix=x",
        ]),
        Reply::status("OK")
    );
    let expected: BTreeMap<String, i64> = [("b", 3), ("c", 6), ("default", 6)]
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    let held = wait_for("the walk to move every lock", || {
        let held = held_by_namespace(&server.conn().call(&["INFO", "lock"]).text());
        (held == expected).then_some(held)
    });
    assert_eq!(held.values().sum::<i64>(), server.info_int("lock_held"));
    assert_eq!(server.info_int("lock_held"), 15);
}
