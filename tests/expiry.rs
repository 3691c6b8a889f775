//! Active expiry: a lease that runs out frees its lock on the primary even when no command
//! touches the key, wherever the key went (other db, RENAME, MOVE, SWAPDB, reload).

mod common;

use std::time::{Duration, Instant};

use common::*;

fn notifying_server() -> Server {
    Server::start_with(Config::default().with("notify-keyspace-events", "Kd"))
}

fn wait_until_expired(server: &Server, count: i64) {
    wait_for("leases to expire", || {
        (server.info_int("lock_expired") >= count).then_some(())
    });
}

#[test]
fn lease_runs_out_without_any_command_touching_the_key() {
    let server = notifying_server();
    let mut c = server.conn();
    let mut sub = subscribe_keyspace(&server, "k");
    let granted_at = Instant::now();
    acquire(&mut c, "k", "a", 300);
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(next_event(&mut sub), "lock.expired");
    let after = granted_at.elapsed().as_millis();
    assert!(
        after >= 290,
        "expired after {after} ms, before its deadline"
    );
    assert!(
        after < 800,
        "expired {after} ms after the grant of a 300 ms lease"
    );
    assert_eq!(server.info_int("lock_held"), 0);
    assert_eq!(server.info_int("lock_expired"), 1);
    assert_eq!(server.info_int("lock_keys"), 1);
    assert_eq!(state_of(&mut c, "k"), "free");
}

#[test]
fn leases_expire_in_deadline_order() {
    let server = notifying_server();
    let mut c = server.conn();
    let mut sub = server.conn();
    sub.call(&["PSUBSCRIBE", "__keyspace@0__:*"]);
    for (key, ttl) in [("k1", 400), ("k2", 100), ("k3", 250)] {
        acquire(&mut c, key, "t", ttl);
    }
    let mut expired = Vec::new();
    while expired.len() < 3 {
        let message = sub.read();
        if message.items()[3] == Reply::bulk("lock.expired") {
            expired.push(message.items()[2].text());
        }
    }
    assert_eq!(
        expired,
        [
            "__keyspace@0__:k2",
            "__keyspace@0__:k3",
            "__keyspace@0__:k1"
        ]
    );
}

#[test]
fn renewed_lease_outlives_its_first_deadline() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "renewed", "a", 200);
    assert_eq!(
        c.call(&["LOCK.RENEW", "renewed", "a", "60000"]),
        Reply::Int(1)
    );
    acquire(&mut c, "marker", "a", 400);
    wait_until_expired(&server, 1);
    assert_eq!(state_of(&mut c, "marker"), "free");
    assert_eq!(state_of(&mut c, "renewed"), "held");
    assert_eq!(server.info_int("lock_held"), 1);
}

#[test]
fn leases_expire_in_other_databases() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(c.call(&["SELECT", "5"]), Reply::status("OK"));
    acquire(&mut c, "k", "a", 100);
    wait_until_expired(&server, 1);
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(server.info_int("lock_held"), 0);
}

/// Database numbers beyond 16 bits keep theirs in the lease index (db 65537 is not db 1).
#[test]
fn leases_expire_in_databases_numbered_beyond_65535() {
    let server = Server::start_with(Config::default().with("databases", "65538"));
    let mut c = server.conn();
    assert_eq!(c.call(&["SELECT", "1"]), Reply::status("OK"));
    acquire(&mut c, "k", "in-db-1", 60_000);
    assert_eq!(c.call(&["SELECT", "65537"]), Reply::status("OK"));
    acquire(&mut c, "k", "in-db-65537", 100);
    wait_until_expired(&server, 1);
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(c.call(&["SELECT", "1"]), Reply::status("OK"));
    assert_eq!(state_of(&mut c, "k"), "held");
}

#[test]
fn renamed_and_moved_locks_still_expire() {
    let server = notifying_server();
    let mut c = server.conn();
    acquire(&mut c, "a", "t", 60_000);
    acquire(&mut c, "b", "t", 60_000);
    // Shorten both leases, then move them away from their original names.
    assert_eq!(c.call(&["LOCK.RENEW", "a", "t", "200"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RENEW", "b", "t", "200"]), Reply::Int(1));
    assert_eq!(c.call(&["RENAME", "a", "a2"]), Reply::status("OK"));
    assert_eq!(c.call(&["MOVE", "b", "3"]), Reply::Int(1));
    wait_until_expired(&server, 2);
    assert_eq!(server.info_int("lock_held"), 0);
    assert_eq!(state_of(&mut c, "a2"), "free");
    c.call(&["SELECT", "3"]);
    assert_eq!(state_of(&mut c, "b"), "free");
}

#[test]
fn copied_and_restored_locks_expire_too() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "t", 60_000);
    assert_eq!(c.call(&["COPY", "k", "copy"]), Reply::Int(1));
    let dump = c.call(&["DUMP", "k"]);
    let Reply::Bulk(payload) = dump else {
        panic!("DUMP: {dump:?}")
    };
    let reply = c.call(&[&b"RESTORE"[..], b"restored", b"0", &payload]);
    assert_eq!(reply, Reply::status("OK"));
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_eq!(server.info_int("lock_held"), 2);
    assert_eq!(c.call(&["LOCK.RENEW", "copy", "t", "100"]), Reply::Int(1));
    assert_eq!(
        c.call(&["LOCK.RENEW", "restored", "t", "100"]),
        Reply::Int(1)
    );
    wait_until_expired(&server, 2);
    assert_eq!(server.info_int("lock_held"), 0);
}

#[test]
fn leases_expire_after_debug_reload_and_swapdb() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "t", 400);
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    c.call(&["SELECT", "1"]);
    acquire(&mut c, "s", "t", 400);
    assert_eq!(c.call(&["SWAPDB", "0", "1"]), Reply::status("OK"));
    wait_until_expired(&server, 2);
    assert_eq!(server.info_int("lock_held"), 0);
    assert_eq!(state_of(&mut c, "k"), "free");
}

#[test]
fn flushall_of_held_locks_keeps_gauges_true_and_server_healthy() {
    let server = Server::start();
    let mut c = server.conn();
    for i in 0..20 {
        acquire(&mut c, &format!("k{i}"), "t", 200);
    }
    assert_eq!(server.info_int("lock_held"), 20);
    assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
    // Valkey frees flushed values in the background by default (lazyfree-lazy-user-flush): the
    // gauges fall as it does, on Redis by the time of the reply.
    wait_for("the gauges to reach 0 after FLUSHALL", || {
        (server.info_int("lock_held") == 0 && server.info_int("lock_keys") == 0).then_some(())
    });
    acquire(&mut c, "after", "t", 100);
    wait_until_expired(&server, 1);
    assert_eq!(server.info_int("lock_expired"), 1);
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
}

#[test]
fn many_leases_expiring_together_are_all_freed() {
    let server = Server::start();
    let mut c = server.conn();
    let count = 5_000;
    for i in 0..count {
        c.send(&["LOCK.ACQUIRE", &format!("k{i}"), "t", "300"]);
    }
    for _ in 0..count {
        assert!(matches!(c.read(), Reply::Int(_)));
    }
    wait_until_expired(&server, count);
    assert_eq!(server.info_int("lock_held"), 0);
    assert_eq!(server.info_int("lock_keys"), count);
}

#[test]
fn binary_keys_with_nul_bytes_expire_too() {
    let server = Server::start();
    let mut c = server.conn();
    let key: &[u8] = b"lock\x00with\xffbytes";
    let reply = c.call(&[&b"LOCK.ACQUIRE"[..], key, b"t", b"100"]);
    assert!(matches!(reply, Reply::Int(_)), "{reply:?}");
    wait_until_expired(&server, 1);
    assert_eq!(server.info_int("lock_held"), 0);
    let info = c.call(&[&b"LOCK.INFO"[..], key]);
    assert_eq!(info.items()[1], Reply::status("free"));
}

/// CPU time (user + system, in clock ticks of 10 ms) the process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name (which ends with ')'): utime and stime are the 12th and 13th.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// A deadline so far ahead that a timer armed for it would overflow Redis' arithmetic
/// (`period * 1000` microseconds): the expiry timer is armed for at most a day and re-armed, so
/// the server stays idle instead of firing its timer in a loop.
#[test]
fn a_deadline_too_far_for_redis_timers_leaves_the_server_idle() {
    // The payload format is learnt on another server: no grant may arm this server's expiry
    // timer before the far deadlines do.
    let format = LockDumpFormat::learn(&mut Server::start().conn());
    let server = Server::start();
    let mut c = server.conn();
    let fence = now_ms() << 11;
    let payload = format.payload(&held_fields(fence, b"token", u64::MAX, 1, 0));
    assert_eq!(restore(&mut c, "far", &payload), Reply::status("OK"));
    assert_eq!(state_of(&mut c, "far"), "held");
    // One second of the server's CPU time, measured over a window of wall-clock time.
    let before = cpu_ticks(server.pid());
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(server.pid()) - before;
    let elapsed_ticks = started.elapsed().as_millis() as u64 / 10;
    assert!(
        used * 4 < elapsed_ticks,
        "the server used {used} of {elapsed_ticks} ticks of CPU while idle"
    );
    assert_eq!(state_of(&mut c, "far"), "held");
    // The timer still serves ordinary leases.
    acquire(&mut c, "near", "token", 100);
    wait_until_expired(&server, 1);
    assert_eq!(state_of(&mut c, "far"), "held");
}

/// Nothing may be replicated while clients are paused (CLIENT PAUSE, a failover in progress):
/// Redis aborts if anything is. A lease that runs out, or a session whose connection closes,
/// during a pause ends once the pause is over, and the server stays up.
#[test]
fn leases_and_sessions_ending_during_client_pause_end_after_it() {
    let server = Server::start();
    // With a replica, every change is replicated: what the pause forbids.
    let replica = Server::start();
    replica.replicate_from(&server);
    let mut c = server.conn();
    for mode in ["WRITE", "ALL"] {
        let before = server.info_int("lock_expired");
        acquire(&mut c, "lease", "t", 100);
        let mut session = server.conn();
        let reply = session.call(&["LOCK.ACQUIRE", "session", "s", "60000", "SESSION"]);
        assert!(matches!(reply, Reply::Int(_)), "{reply:?}");
        let released = server.info_int("lock_session_released");
        assert_eq!(
            c.call(&["CLIENT", "PAUSE", "500", mode]),
            Reply::status("OK")
        );
        let paused = Instant::now();
        drop(session);
        // The lease ends during the pause; the server must outlive it.
        std::thread::sleep(Duration::from_millis(300));
        wait_for("the pause to end and the lease to expire", || {
            (server.info_int("lock_expired") == before + 1).then_some(())
        });
        assert!(paused.elapsed() >= Duration::from_millis(500));
        wait_for("the session to end", || {
            (server.info_int("lock_session_released") == released + 1).then_some(())
        });
        assert_eq!(state_of(&mut c, "lease"), "free");
        assert_eq!(state_of(&mut c, "session"), "free");
    }
    wait_replica_caught_up(&server, &replica);
    assert_eq!(state_of(&mut replica.conn(), "lease"), "free");
}
