//! Every background job and the paths a crowd on one key takes keep their documented order,
//! whatever the shape of one key: N scaled by 10x makes the server's main thread spend about 10x
//! the CPU (checked: at most 30x; a quadratic path spends 100x). CPU time, not wall time: it
//! does not count what other processes on the machine do. Background jobs also yield at their
//! slice inside one key: the longest PING while one runs stays short.
//!
//! - handoff: a multi-lock waiter of K keys served behind another (K x K before);
//! - expiry: N shared holders of one key whose leases end together (N x N, and not sliced,
//!   before);
//! - session close: a connection with N session locks;
//! - flush: FLUSHALL with waiters on N keys;
//! - reclaim: N free locks whose tombstone time ends together.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

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

/// The CPU the server spends on `work` (which ends when the server is done).
fn cpu_of(server: &Server, work: impl FnOnce()) -> Duration {
    let before = main_cpu(server);
    work();
    main_cpu(server).saturating_sub(before)
}

/// `big` was measured with 10x the N of `small`: at most 30x its cost (linear is 10x, quadratic
/// 100x). Below a millisecond the small run is too short to compare with: counted as 1 ms.
fn assert_linear(what: &str, small: Duration, big: Duration) {
    let floor = small.max(Duration::from_millis(1));
    println!("{what}: {small:?} -> {big:?} for 10x N");
    assert!(
        big <= floor * 30,
        "{what}: {small:?} for N, {big:?} for 10N: not linear"
    );
}

/// Polls `done` every 20 ms (so the polling itself costs the server little) for up to 60 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        sleep(Duration::from_millis(20));
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

fn macquire(keys: &[String], token: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["LOCK.MACQUIRE".to_string(), keys.len().to_string()];
    args.extend(keys.iter().cloned());
    args.extend([token.to_string(), "600000".to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A holds the first of `n` keys; B and then C wait for all of them; A releases: B gets them,
/// C keeps waiting. The cost of that release and hand-over.
fn macquire_handoff(n: usize) -> Duration {
    let server = Server::start();
    let keys: Vec<String> = (0..n).map(|i| format!("{{m}}k{i}")).collect();
    let mut a = server.conn();
    acquire(&mut a, &keys[0], "a", 600_000);
    let mut b = server.conn();
    b.send(&macquire(&keys, "b", &["WAIT", "60000"]));
    wait_blocked(&server, 1);
    let mut c = server.conn();
    c.send(&macquire(&keys, "c", &["WAIT", "60000"]));
    wait_blocked(&server, 2);
    let spent = cpu_of(&server, || {
        assert_eq!(a.call(&["LOCK.RELEASE", &keys[0], "a"]), Reply::Int(1));
        assert_eq!(b.read().items().len(), n);
    });
    assert_eq!(blocked(&server), 1, "C still waits");
    assert_eq!(state_of(&mut a, &keys[n - 1]), "held");
    spent
}

#[test]
fn a_multi_lock_handoff_costs_linear_time_in_its_keys() {
    let small = macquire_handoff(100);
    let big = macquire_handoff(1000);
    assert_linear("MACQUIRE handoff behind another waiter", small, big);
}

/// A RESTORE payload of one shared lock with `n` holders whose leases all end at `deadline`.
fn shared_payload(format: &LockDumpFormat, n: u64, deadline: u64) -> Vec<u8> {
    let base = fence_far_ahead_of(deadline);
    let mut fields = rdb_uint(base + n);
    fields.extend(rdb_uint(3)); // a group
    fields.extend(rdb_uint(0)); // shared: no limit
    fields.extend(rdb_uint(n));
    for i in 1..=n {
        fields.extend(rdb_uint(base + i));
        fields.extend(rdb_string(&token_digest(format!("t{i}").as_bytes())));
        fields.extend(rdb_uint(deadline));
        fields.extend(rdb_uint(1));
        fields.extend(rdb_uint(DIGEST_FLAG));
    }
    fields.push(0);
    format.payload(&fields)
}

/// A fence in the clock term of `at` (ms): what a grant then would have had.
fn fence_far_ahead_of(at: u64) -> u64 {
    at << 11
}

/// `n` shared holders of one key whose leases end together: the CPU spent expiring them, or
/// (`ping`) the longest PING meanwhile, from a client that sends them one after another (its
/// PINGs cost the server CPU too, so the two are measured in separate runs).
fn shared_expiry(n: u64, ping: bool) -> Duration {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    // Far enough ahead that the holders are all there when looked at, on a slow server too.
    let deadline = now_ms() + 1500;
    let payload = shared_payload(&format, n, deadline);
    assert_eq!(restore(&mut c, "shared", &payload), Reply::status("OK"));
    assert_eq!(
        lock_field(&mut c, "shared", "holders"),
        Reply::Int(n as i64)
    );
    let expired_before = server.info_int("lock_expired");
    let all_expired = || server.info_int("lock_expired") == expired_before + n as i64;
    let measured = if ping {
        let pinger = Pinger::start(&server);
        wait_until("every shared holder expired", all_expired);
        pinger.worst()
    } else {
        cpu_of(&server, || {
            wait_until("every shared holder expired", all_expired)
        })
    };
    assert_eq!(state_of(&mut c, "shared"), "free");
    measured
}

#[test]
fn shared_holders_expiring_together_cost_linear_time_and_yield_at_the_slice() {
    let small = shared_expiry(1_000, false);
    let big = shared_expiry(10_000, false);
    assert_linear("expiry of one key's shared holders", small, big);
    let worst = shared_expiry(10_000, true);
    println!("longest PING while 10,000 holders expired: {worst:?}");
    assert!(
        worst < Duration::from_millis(100),
        "a PING waited {worst:?} while one key's holders expired"
    );
}

/// A connection holding `n` session locks closes: the CPU spent releasing them.
fn session_close(n: usize) -> Duration {
    let server = Server::start();
    let mut c = server.conn();
    let mut owner = server.conn();
    let mut released = 0;
    let mut i = 0;
    while released < n {
        let count = (n - released).min(1000);
        let keys: Vec<String> = (i..i + count).map(|k| format!("{{s}}k{k}")).collect();
        assert_eq!(
            owner
                .call(&macquire(&keys, "owner", &["SESSION"]))
                .items()
                .len(),
            count
        );
        released += count;
        i += count;
    }
    let spent = cpu_of(&server, || {
        drop(owner);
        wait_until("every session lock released", || {
            server.info_int("lock_session_released") == n as i64
        });
    });
    assert_eq!(server.info_int("lock_held"), 0);
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
    spent
}

#[test]
fn closing_a_connection_with_many_session_locks_costs_linear_time() {
    let small = session_close(500);
    let big = session_close(5_000);
    assert_linear("session close", small, big);
}

/// `n` clients wait on `n` keys; FLUSHALL: the CPU spent settling them (each gets a fresh lock).
fn flush_with_waiters(n: usize) -> Duration {
    let server = Server::start();
    let mut c = server.conn();
    let mut waiters = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("w{i}");
        acquire(&mut c, &key, "holder", 600_000);
        let mut w = server.conn();
        w.send(&["LOCK.ACQUIRE", &key, "waiter", "600000", "WAIT", "60000"]);
        waiters.push(w);
    }
    wait_blocked(&server, n as i64);
    let spent = cpu_of(&server, || {
        assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
        for w in &mut waiters {
            assert!(w.read().int() > 0);
        }
    });
    assert_eq!(server.info_int("lock_held"), n as i64);
    spent
}

#[test]
fn a_flush_with_waiters_on_many_keys_costs_linear_time() {
    let small = flush_with_waiters(100);
    let big = flush_with_waiters(1_000);
    assert_linear("FLUSHALL with waiters", small, big);
}

/// `n` free locks whose tombstone time ends together: the CPU spent reclaiming them.
fn reclaim(n: usize) -> Duration {
    let server = Server::start_with(
        Config::default()
            .module_arg("tombstone-ttl")
            .module_arg("300"),
    );
    let mut c = server.conn();
    for i in 0..n {
        c.send(&["LOCK.ACQUIRE", &format!("r{i}"), "t", "600000"]);
        c.send(&["LOCK.RELEASE", &format!("r{i}"), "t"]);
    }
    for _ in 0..n {
        assert!(c.read().is_int());
        assert_eq!(c.read(), Reply::Int(1));
    }
    cpu_of(&server, || {
        wait_until("every free lock reclaimed", || {
            server.info_int("lock_keys") == 0
        });
    })
}

#[test]
fn reclaiming_many_free_locks_costs_linear_time() {
    let small = reclaim(1_000);
    let big = reclaim(10_000);
    assert_linear("reclaim", small, big);
}

/// On a server with `n` held locks: the CPU of 500 LOCK.LIST calls of COUNT 10 (a cursor walked
/// from 0), and the CPU of a whole iteration with COUNT 1000.
fn list(n: usize) -> (Duration, Duration) {
    let server = Server::start();
    let mut c = server.conn();
    for start in (0..n).step_by(1_000) {
        for i in start..(start + 1_000).min(n) {
            c.send(&["LOCK.ACQUIRE", &format!("l{i}"), "t", "600000"]);
        }
        for _ in start..(start + 1_000).min(n) {
            assert!(c.read().is_int());
        }
    }
    let mut walk = |count: &str, calls: usize| {
        let mut cursor = "0".to_string();
        let mut listed = 0;
        for _ in 0..calls {
            let reply = c.call(&["LOCK.LIST", &cursor, "COUNT", count]);
            let items = reply.items();
            listed += items[1].items().len();
            cursor = items[0].text();
            if cursor == "0" {
                break;
            }
        }
        listed
    };
    let mut pages = 0;
    let some = cpu_of(&server, || pages = walk("10", 500));
    assert!(pages > 0);
    let mut listed = 0;
    let whole = cpu_of(&server, || listed = walk("1000", usize::MAX));
    assert_eq!(listed, n);
    (some, whole)
}

#[test]
fn a_lock_list_call_costs_what_its_count_says_and_a_whole_iteration_linear_time() {
    let (small_pages, small_whole) = list(10_000);
    let (big_pages, big_whole) = list(100_000);
    // The same number of calls of the same COUNT: about the same work, with 10x the locks.
    println!("500 LOCK.LIST calls of COUNT 10: {small_pages:?} -> {big_pages:?} for 10x N");
    assert!(
        big_pages <= small_pages.max(Duration::from_millis(10)) * 3,
        "500 calls: {small_pages:?} with 10,000 locks, {big_pages:?} with 100,000"
    );
    assert_linear("a whole LOCK.LIST iteration", small_whole, big_whole);
}
