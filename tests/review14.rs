//! Review of a635652: a replica applies one shared holder's change through the group's kept
//! hints (Lock::apply_member with Group::holds_of / push / replace / remove / remove_where) and
//! follows the oldest hold by event (effects::Known::ByEvent -> holds::follow_change). Each
//! test fails if a suspicion is real; see the unit walk in src/lock/review14_tests.rs for the
//! lock itself.

mod common;

use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn config() -> Config {
    Config::default()
        .module_arg("tombstone-ttl")
        .module_arg("600000")
}

fn pair() -> (Server, Server) {
    let primary = Server::start_with(config());
    let replica = Server::start_with(config());
    replica.replicate_from(&primary);
    (primary, replica)
}

fn shared(c: &mut Conn, key: &str, token: &str, ttl: u64, extra: &[&str]) -> Reply {
    let mut options = vec!["SHARED"];
    options.extend_from_slice(extra);
    acquire_with(c, key, token, ttl, &options)
}

fn permit(c: &mut Conn, key: &str, token: &str, ttl: u64, limit: u32) -> Reply {
    acquire_with(c, key, token, ttl, &["LIMIT", &limit.to_string()])
}

/// LOCK.INFO without the fields that move with time.
fn info_of(server: &Server, key: &str) -> BTreeMap<String, Reply> {
    let mut info: BTreeMap<String, Reply> = lock_info(&mut server.conn(), key)
        .unwrap_or_default()
        .into_iter()
        .collect();
    info.remove("ttl");
    info.remove("delay_ttl");
    info
}

/// LOCK.WHO's holders without the fields that move with time or differ by server by design
/// (`tag` is per process, `connected` is -1 on a replica).
fn who_of(server: &Server, key: &str) -> Vec<BTreeMap<String, Reply>> {
    let reply = server.conn().call(&["LOCK.WHO", key, "COUNT", "10000"]);
    if reply == Reply::Nil {
        return Vec::new();
    }
    let map = fields_map(&reply);
    let holders = map.get("holders").cloned().unwrap_or(Reply::Array(vec![]));
    let mut total = holders
        .items()
        .iter()
        .map(|h| {
            let mut h = fields_map(h);
            for moving in ["held_ms", "ttl", "connected", "tag"] {
                h.remove(moving);
            }
            h
        })
        .collect::<Vec<_>>();
    let mut head = BTreeMap::new();
    head.insert(
        "holders_total".to_string(),
        map.get("holders_total").cloned().unwrap_or(Reply::Nil),
    );
    total.insert(0, head);
    total
}

/// The INFO lock fields that say what is held, and the ages (ms) separately.
fn info_lock(server: &Server) -> (BTreeMap<String, String>, BTreeMap<String, i64>) {
    let text = server.conn().call(&["INFO", "lock"]).text();
    let mut exact = BTreeMap::new();
    let mut ages = BTreeMap::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        match name {
            "lock_held" | "lock_keys" => {
                exact.insert(name.to_string(), value.trim().to_string());
            }
            "lock_oldest_hold_ms" => {
                ages.insert(name.to_string(), value.trim().parse().unwrap_or(-1));
            }
            _ if name.starts_with("lock_namespace_") => {
                for field in value.trim().split(',') {
                    let Some((f, v)) = field.split_once('=') else {
                        continue;
                    };
                    match f {
                        "held" => {
                            exact.insert(format!("{name}.held"), v.to_string());
                        }
                        "oldest_hold_ms" => {
                            ages.insert(format!("{name}.oldest"), v.parse().unwrap_or(-1));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (exact, ages)
}

/// The replica answers as the primary does about `keys`, and INFO counts and ages the same
/// (ages within `slack` ms: the two are read a few ms apart).
fn assert_same(primary: &Server, replica: &Server, keys: &[&str], what: &str) {
    wait_replica_caught_up(primary, replica);
    // Live holders are counted at each server's own time: a lease that ends between the two
    // reads shows on one and not on the other. A difference is read again (for at most 3 s)
    // before the assertions below judge it; one that lasts fails them.
    let agree = || {
        keys.iter().all(|key| {
            digest_value(&mut replica.conn(), key) == digest_value(&mut primary.conn(), key)
                && info_of(replica, key) == info_of(primary, key)
                && who_of(replica, key) == who_of(primary, key)
        }) && info_lock(replica).0 == info_lock(primary).0
    };
    let started = Instant::now();
    while !agree() && started.elapsed() < Duration::from_secs(3) {
        sleep(Duration::from_millis(20));
    }
    for key in keys {
        assert_eq!(
            digest_value(&mut replica.conn(), key),
            digest_value(&mut primary.conn(), key),
            "{what}: DEBUG DIGEST-VALUE {key}"
        );
        assert_eq!(
            info_of(replica, key),
            info_of(primary, key),
            "{what}: LOCK.INFO {key}"
        );
        assert_eq!(
            who_of(replica, key),
            who_of(primary, key),
            "{what}: LOCK.WHO {key}"
        );
    }
    let (p_exact, p_ages) = info_lock(primary);
    let (r_exact, r_ages) = info_lock(replica);
    // The replica keeps every lock's index entry as the primary does, once reclaims are far.
    assert_eq!(r_exact, p_exact, "{what}: INFO lock counts");
    assert_eq!(
        r_ages.keys().collect::<Vec<_>>(),
        p_ages.keys().collect::<Vec<_>>(),
        "{what}: INFO lock age lines"
    );
    for (name, p) in &p_ages {
        let r = r_ages[name];
        assert!(
            (r - p).abs() <= 150,
            "{what}: INFO {name}: replica {r} ms, primary {p} ms"
        );
    }
}

fn wait_expired(server: &Server, key: &str, holders: i64) {
    wait_for(&format!("{key} to have {holders} holders"), || {
        (lock_field(&mut server.conn(), key, "holders").int() == holders).then_some(())
    });
}

/// Suspicion: the replica's kept hints (earliest deadline, live count, unmarked bound, long
/// fences) and its ages drift from the truth through member changes (grants, refreshes,
/// reentrant holds and drops, renewals, releases, expiries of many and of few, session ends)
/// interleaved with whole states (DEBUG RELOAD of the replica, a force release, a downgrade,
/// a full resync), so LOCK.INFO / LOCK.WHO / INFO differ; and once promoted, it grants beyond
/// LIMIT, refuses a grant it should make, or expires holders late or early.
#[test]
fn review14_replica_matches_primary_through_member_changes_and_whole_states_then_fails_over() {
    let (primary, mut replica) = pair();
    let mut c = primary.conn();
    let keys = ["rw", "sem", "down", "forced"];
    // Readers: long ones, ten that run out together (one removal of many), three that run out
    // alone, a reentrant one, and one that is refreshed.
    for i in 0..12 {
        assert!(shared(&mut c, "rw", &format!("long{i}"), 600_000, &[]).is_int());
    }
    for i in 0..10 {
        assert!(shared(&mut c, "rw", &format!("batch{i}"), 700, &[]).is_int());
    }
    for i in 0..3 {
        assert!(shared(&mut c, "rw", &format!("few{i}"), 400 + 300 * i, &[]).is_int());
    }
    assert!(shared(&mut c, "rw", "re", 600_000, &["REENTRANT"]).is_int());
    assert!(shared(&mut c, "rw", "re", 600_000, &["REENTRANT"]).is_int());
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "re"]), Reply::Int(1));
    assert!(shared(&mut c, "rw", "long3", 500_000, &["LABEL", "refreshed"]).is_int());
    assert_eq!(
        c.call(&["LOCK.RENEW", "rw", "long4", "550000"]),
        Reply::Int(1)
    );
    // A semaphore of 4 permits: two short, two long.
    for (i, ttl) in [(0, 600), (1, 900), (2, 600_000), (3, 600_000)] {
        assert!(permit(&mut c, "sem", &format!("p{i}"), ttl, 4).is_int());
    }
    assert_eq!(permit(&mut c, "sem", "p4", 600_000, 4), Reply::Nil);
    // A downgrade (whole state) then readers (member changes) on it.
    assert!(acquire(&mut c, "down", "w", 600_000) > 0);
    assert!(shared(&mut c, "down", "w", 600_000, &[]).is_int());
    assert!(shared(&mut c, "down", "r1", 600_000, &[]).is_int());
    // Session readers whose connection closes.
    {
        let mut s = primary.conn();
        for i in 0..11 {
            assert!(shared(&mut s, "rw", &format!("sess{i}"), 600_000, &["SESSION"]).is_int());
        }
        assert!(shared(&mut s, "down", "sess-d", 600_000, &["SESSION"]).is_int());
    }
    // Readers force-released (a whole state), then new readers (member changes).
    for i in 0..5 {
        assert!(shared(&mut c, "forced", &format!("f{i}"), 600_000, &[]).is_int());
    }
    assert_same(&primary, &replica, &keys, "after the grants");

    // The replica reloads (a whole state of every lock), then member changes continue.
    assert_eq!(
        replica.conn().call(&["DEBUG", "RELOAD"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "forced"]), Reply::Int(1));
    for i in 5..8 {
        assert!(shared(&mut c, "forced", &format!("f{i}"), 600_000, &[]).is_int());
    }
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "long0"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "re"]), Reply::Int(1));
    wait_for("the sessions to end", || {
        (lock_field(&mut primary.conn(), "rw", "session").int() == 0).then_some(())
    });
    // The batch, the few and the short permits run out on the primary (expiry effects).
    wait_expired(&primary, "rw", 11);
    wait_expired(&primary, "sem", 2);
    assert_same(
        &primary,
        &replica,
        &keys,
        "after expiries and a replica reload",
    );

    // A token whose hold ran out comes back (a new member with an expired member's token).
    assert!(shared(&mut c, "rw", "batch0", 600_000, &[]).is_int());
    let before_grants = now_ms();
    assert!(shared(&mut c, "rw", "few0", 1_500, &[]).is_int());
    assert!(permit(&mut c, "sem", "p0", 1_500, 4).is_int());
    let after_grants = now_ms();
    assert_same(&primary, &replica, &keys, "after returning tokens");
    let deadline_soon = before_grants + 1_500;

    // Failover: the replica becomes a primary.
    assert_eq!(
        replica.conn().call(&["REPLICAOF", "NO", "ONE"]),
        Reply::status("OK")
    );
    drop(primary);
    let mut r = replica.conn();
    // The semaphore: 3 held (p0 short, p2, p3): exactly one more permit, then none.
    assert_eq!(lock_field(&mut r, "sem", "holders"), Reply::Int(3));
    assert!(
        permit(&mut r, "sem", "n1", 600_000, 4).is_int(),
        "a free permit refused"
    );
    assert_eq!(
        permit(&mut r, "sem", "n2", 600_000, 4),
        Reply::Nil,
        "beyond LIMIT"
    );
    // The short holds run out on time on the promoted replica: not before their deadline, and
    // within the lease timer's slack after it.
    let rw_before = lock_field(&mut r, "rw", "holders").int();
    while now_ms() + 200 < deadline_soon {
        assert_eq!(
            lock_field(&mut r, "rw", "holders").int(),
            rw_before,
            "a holder expired early"
        );
        assert_eq!(lock_field(&mut r, "sem", "holders").int(), 4);
        sleep(Duration::from_millis(50));
    }
    while now_ms() < after_grants + 1_500 + 300 {
        sleep(Duration::from_millis(20));
    }
    assert_eq!(
        lock_field(&mut r, "rw", "holders").int(),
        rw_before - 1,
        "few0 not expired 300 ms after its deadline on the promoted replica"
    );
    assert_eq!(
        lock_field(&mut r, "sem", "holders").int(),
        3,
        "p0 not expired 300 ms after its deadline on the promoted replica"
    );
    assert!(permit(&mut r, "sem", "n3", 600_000, 4).is_int());
    replica.shutdown();
}

/// The replica's INFO lock_oldest_hold_ms, beside the primary's.
fn oldest(server: &Server) -> i64 {
    server.info_int("lock_oldest_hold_ms")
}

fn assert_oldest_close(primary: &Server, replica: &Server, what: &str) {
    wait_replica_caught_up(primary, replica);
    // The two are read at different instants: a lease the timer ends between the reads (it may
    // end a few ms after its deadline) shows on one only. Read again (at most 3 s) first.
    let started = Instant::now();
    while (oldest(primary) - oldest(replica)).abs() > 150
        && started.elapsed() < Duration::from_secs(3)
    {
        sleep(Duration::from_millis(20));
    }
    let (p, r) = (oldest(primary), oldest(replica));
    assert!(
        (p - r).abs() <= 150,
        "{what}: lock_oldest_hold_ms replica {r}, primary {p}"
    );
}

/// Suspicion: with Known::ByEvent the replica's oldest hold is wrong when the oldest reader
/// leaves by expiry, by its session's end, by a force release, after a refresh of it, after
/// a whole state (DEBUG RELOAD) set its age, and when a returning token's new hold replaces
/// its own old one.
#[test]
fn review14_replica_oldest_hold_follows_every_way_the_oldest_reader_leaves() {
    let (primary, replica) = pair();
    let mut c = primary.conn();
    // The oldest runs out; the next oldest is 700 ms younger.
    assert!(shared(&mut c, "a", "old", 1_200, &[]).is_int());
    sleep(Duration::from_millis(700));
    assert!(shared(&mut c, "a", "mid", 600_000, &[]).is_int());
    sleep(Duration::from_millis(300));
    assert!(shared(&mut c, "a", "new", 600_000, &[]).is_int());
    assert_oldest_close(&primary, &replica, "three readers");
    // A refresh of the oldest keeps its grant time.
    assert!(shared(&mut c, "a", "old", 300, &[]).is_int());
    assert_oldest_close(&primary, &replica, "the oldest refreshed");
    assert!(oldest(&replica) >= 900, "{}", oldest(&replica));
    wait_expired(&primary, "a", 2);
    // LOCK.INFO counts an overdue lease out before the timer ends it: wait for the timer.
    wait_for("the oldest reader's expiry to reach the replica", || {
        (oldest(&replica) < 900).then_some(())
    });
    assert_oldest_close(&primary, &replica, "the oldest expired");
    assert!(oldest(&replica) < 900, "{}", oldest(&replica));

    // A whole state on the replica (DEBUG RELOAD), then the oldest session reader leaves.
    {
        let mut s = primary.conn();
        assert!(shared(&mut s, "b", "sess", 600_000, &["SESSION"]).is_int());
        sleep(Duration::from_millis(400));
        assert!(shared(&mut c, "b", "stay", 600_000, &[]).is_int());
        wait_replica_caught_up(&primary, &replica);
        assert_eq!(
            replica.conn().call(&["DEBUG", "RELOAD"]),
            Reply::status("OK")
        );
        // Everything else younger than "b": the oldest now is "a"'s "mid".
        assert_oldest_close(&primary, &replica, "after the replica's reload");
    }
    wait_for("the session to end", || {
        (lock_field(&mut primary.conn(), "b", "holders").int() == 1).then_some(())
    });
    assert_oldest_close(&primary, &replica, "the session reader left");

    // Only "c" is held; its oldest reader leaves, by release then by a force release.
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "a"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "b"]), Reply::Int(1));
    assert!(shared(&mut c, "c", "c1", 600_000, &[]).is_int());
    sleep(Duration::from_millis(500));
    assert!(shared(&mut c, "c", "c2", 600_000, &[]).is_int());
    sleep(Duration::from_millis(300));
    assert!(shared(&mut c, "c", "c3", 600_000, &["REENTRANT"]).is_int());
    assert!(shared(&mut c, "c", "c3", 600_000, &["REENTRANT"]).is_int());
    assert_oldest_close(&primary, &replica, "c: three readers");
    assert!(oldest(&replica) >= 800, "{}", oldest(&replica));
    assert_eq!(c.call(&["LOCK.RELEASE", "c", "c3"]), Reply::Int(1));
    assert_oldest_close(&primary, &replica, "c: a dropped hold");
    assert_eq!(c.call(&["LOCK.RELEASE", "c", "c1"]), Reply::Int(1));
    assert_oldest_close(&primary, &replica, "c: the oldest released");
    assert!(oldest(&replica) < 750, "{}", oldest(&replica));
    assert_eq!(c.call(&["LOCK.RELEASE", "c", "c2"]), Reply::Int(1));
    assert_oldest_close(&primary, &replica, "c: the next oldest released");
    assert!(oldest(&replica) < 450, "{}", oldest(&replica));
    assert_eq!(c.call(&["LOCK.RELEASE", "c", "c3"]), Reply::Int(1));
    assert_oldest_close(&primary, &replica, "c: free");
    assert_eq!(oldest(&replica), 0);
    // A token whose hold ran out returns before its expiry is applied: its new hold replaces
    // the old one (the primary's grant drops it), the oldest moves to the new one.
    assert!(shared(&mut c, "d", "back", 100, &[]).is_int());
    assert!(shared(&mut c, "d", "keep", 100, &[]).is_int());
    sleep(Duration::from_millis(300));
    assert!(shared(&mut c, "d", "back", 600_000, &[]).is_int());
    assert_oldest_close(
        &primary,
        &replica,
        "d: a token back after its lease ran out",
    );
    assert!(oldest(&replica) < 200, "{}", oldest(&replica));
}

fn aof_rewritten(primary: &Server) {
    wait_for("the AOF rewrite finished", || {
        (primary
            .info_field("persistence", "aof_rewrite_in_progress")
            .as_deref()
            == Some("0")
            && primary
                .info_field("persistence", "aof_rewrite_scheduled")
                .as_deref()
                == Some("0"))
        .then_some(())
    });
}

/// Suspicion: the primary's AOF replay of member effects (now applied through the kept hints,
/// and announced ByEvent while loading) gives another state or wrong ages.
#[test]
fn review14_aof_replay_of_member_effects_keeps_the_state_and_the_ages() {
    let mut primary = Server::start_with(
        config()
            .with("appendonly", "yes")
            .with("aof-use-rdb-preamble", "no"),
    );
    let mut c = primary.conn();
    // A whole state first (the rewrite), then member effects on top of it.
    for i in 0..20 {
        assert!(shared(&mut c, "m", &format!("r{i}"), 600_000, &[]).is_int());
    }
    assert!(permit(&mut c, "s", "p0", 600_000, 3).is_int());
    assert_eq!(
        c.call(&["BGREWRITEAOF"]).text(),
        "Background append only file rewriting started"
    );
    aof_rewritten(&primary);
    sleep(Duration::from_millis(300));
    for i in 20..40 {
        assert!(shared(&mut c, "m", &format!("r{i}"), 300, &[]).is_int());
    }
    assert!(shared(&mut c, "m", "r5", 500_000, &["REENTRANT"]).is_int());
    assert!(shared(&mut c, "m", "r5", 500_000, &["REENTRANT"]).is_int());
    assert_eq!(c.call(&["LOCK.RELEASE", "m", "r5"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "m", "r0"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RENEW", "m", "r1", "400000"]), Reply::Int(1));
    assert!(permit(&mut c, "s", "p1", 300, 3).is_int());
    assert!(permit(&mut c, "s", "p2", 600_000, 3).is_int());
    // The short ones run out (a removal of many, and of one permit).
    wait_expired(&primary, "m", 19);
    wait_expired(&primary, "s", 2);
    assert_eq!(c.call(&["LOCK.RELEASE", "s", "p0"]), Reply::Int(1));
    let keys = ["m", "s"];
    let digests =
        |c: &mut Conn| -> Vec<String> { keys.iter().map(|k| digest_value(c, k)).collect() };
    let before = digests(&mut c);
    let whole = c.call(&["DEBUG", "DIGEST"]).text();
    let age = |server: &Server| oldest(server);
    let (age_before, at) = (age(&primary), Instant::now());
    assert!(age_before >= 300, "{age_before}");

    assert_eq!(c.call(&["DEBUG", "LOADAOF"]), Reply::status("OK"));
    assert_eq!(digests(&mut c), before, "after DEBUG LOADAOF");
    assert_eq!(c.call(&["DEBUG", "DIGEST"]).text(), whole);
    let expected = age_before + at.elapsed().as_millis() as i64;
    let got = age(&primary);
    assert!(
        (got - expected).abs() <= 150,
        "after DEBUG LOADAOF: lock_oldest_hold_ms {got}, expected about {expected}"
    );
    assert_eq!(
        lock_field(&mut c, "m", "holders"),
        Reply::Int(19),
        "after DEBUG LOADAOF"
    );

    primary.shutdown_and_restart();
    let mut c = primary.conn();
    assert_eq!(digests(&mut c), before, "after a restart from the AOF");
    let expected = age_before + at.elapsed().as_millis() as i64;
    let got = age(&primary);
    assert!(
        (got - expected).abs() <= 150,
        "after a restart: lock_oldest_hold_ms {got}, expected about {expected}"
    );
    // The reloaded semaphore still counts its permits (p2 holds): two left, then none.
    assert!(permit(&mut c, "s", "q1", 600_000, 3).is_int());
    assert!(permit(&mut c, "s", "q2", 600_000, 3).is_int());
    assert_eq!(permit(&mut c, "s", "q3", 600_000, 3), Reply::Nil);
}

/// The AOF files of `server` (multi-part AOF of Redis 7+ / Valkey), the incremental one last.
fn incr_aof(server: &Server) -> std::path::PathBuf {
    let dir = server.dir().join("appendonlydir");
    let mut incr: Vec<_> = std::fs::read_dir(&dir)
        .expect("appendonlydir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    incr.sort();
    incr.pop().expect("an incremental AOF")
}

fn resp_command(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The LOCK.APPLY commands in an AOF (naive RESP reading: enough for what the module writes).
fn apply_commands(aof: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut at = 0;
    let line = |at: &mut usize| -> Vec<u8> {
        let start = *at;
        while *at + 1 < aof.len() && &aof[*at..*at + 2] != b"\r\n" {
            *at += 1;
        }
        let l = aof[start..*at].to_vec();
        *at += 2;
        l
    };
    while at < aof.len() {
        let head = line(&mut at);
        let Some(n) = head.strip_prefix(b"*") else {
            continue;
        };
        let n: usize = String::from_utf8_lossy(n).parse().unwrap_or(0);
        let mut args = Vec::new();
        for _ in 0..n {
            let len = line(&mut at);
            let len: usize = String::from_utf8_lossy(&len[1..]).parse().unwrap_or(0);
            args.push(aof[at..at + len].to_vec());
            at += len + 2;
        }
        if args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case(b"LOCK.APPLY"))
        {
            out.push(args);
        }
    }
    out
}

/// Suspicion: a corrupted AOF's member effect (fields past their range, a limit over the cap,
/// a time at u64::MAX, removals naming absent or duplicated tokens, more than 8 of them, a
/// member's state cut short) panics the module while loading instead of being refused.
#[test]
fn review14_corrupted_member_effects_in_the_aof_never_crash_the_server() {
    let mut server = Server::start_with(
        config()
            .with("appendonly", "yes")
            .with("aof-use-rdb-preamble", "no"),
    );
    let mut c = server.conn();
    for i in 0..12 {
        assert!(shared(&mut c, "k", &format!("r{i}"), 600_000, &[]).is_int());
    }
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "r0"]), Reply::Int(1));
    assert!(permit(&mut c, "s", "p0", 600_000, 2).is_int());
    server.shutdown();
    let path = incr_aof(&server);
    let aof = std::fs::read(&path).expect("read the AOF");
    let applies = apply_commands(&aof);
    // A member Set (5+ arguments) and a removal (the release of r0).
    let set = applies
        .iter()
        .rev()
        .find(|a| a.len() >= 4 && a[2].split(|b| *b == b':').nth(3) == Some(b"e"))
        .cloned()
        .unwrap_or_else(|| panic!("no member Set in {applies:?}"));
    let removal = applies
        .iter()
        .find(|a| a.len() == 4)
        .cloned()
        .unwrap_or_else(|| panic!("no member removal in {applies:?}"));
    let with_field = |args: &Vec<Vec<u8>>, arg: usize, field: usize, value: &[u8]| {
        let mut args = args.clone();
        let mut fields: Vec<Vec<u8>> = args[arg]
            .split(|b| *b == b':')
            .map(<[u8]>::to_vec)
            .collect();
        if field < fields.len() {
            fields[field] = value.to_vec();
        }
        args[arg] = fields.join(&b':');
        args
    };
    let mut bad: Vec<Vec<Vec<u8>>> = Vec::new();
    for field in 1..8 {
        for value in [
            &b"18446744073709551615"[..],
            b"0",
            b"4294967295",
            b"10001",
            b"",
        ] {
            bad.push(with_field(&set, 2, field, value));
            bad.push(with_field(&removal, 2, field, value));
            bad.push(with_field(&set, 3, field, value));
        }
    }
    // Removals: r:... with 20 copies of the same digest, and 9 of an absent one.
    let mut many = with_field(&removal, 2, 3, b"r");
    let digest = many[3].clone();
    for _ in 0..19 {
        many.push(digest.clone());
    }
    bad.push(many.clone());
    let mut absent = many.clone();
    for d in absent.iter_mut().skip(3) {
        if let Some(last) = d.last_mut() {
            *last ^= 1;
        }
    }
    bad.push(absent);
    let mut cut = set.clone();
    cut.truncate(4);
    bad.push(cut);
    let mut short_digest = removal.clone();
    short_digest[3].truncate(5);
    bad.push(short_digest);
    let mut appended = aof.clone();
    for args in &bad {
        appended.extend_from_slice(&resp_command(args));
    }
    std::fs::write(&path, &appended).expect("write the AOF");
    server.restart_allowing_failure();
    let log = server.log();
    assert!(
        server.is_running(),
        "the server did not come back from its AOF"
    );
    assert!(lock_info(&mut server.conn(), "k").is_some());
    println!(
        "{} corrupted effects appended; server running: {}; log tail:\n{}",
        bad.len(),
        server.is_running(),
        log.lines().rev().take(12).collect::<Vec<_>>().join("\n")
    );
    assert!(
        !log.contains("panicked")
            && !log.contains("crashed by signal")
            && !log.contains("STACK TRACE"),
        "loading a corrupted member effect crashed the server:\n{}",
        log.lines()
            .filter(|l| l.contains("panicked") || l.contains("signal") || l.contains("lock"))
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

trait RestartAllowingFailure {
    fn restart_allowing_failure(&mut self);
}

impl RestartAllowingFailure for Server {
    /// Starts the server again; it may refuse the AOF and exit (what a corrupted AOF may do),
    /// or start: either is fine here, a crash is not.
    fn restart_allowing_failure(&mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.restart()));
        if result.is_err() {
            sleep(Duration::from_millis(500));
        }
    }
}

/// The CPU time the server's main thread has used.
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

/// Runs `commands` pipelined on the primary, and returns what the primary's and the replica's
/// main threads spent on them.
fn cost(primary: &Server, replica: &Server, commands: &[Vec<String>]) -> (Duration, Duration) {
    let mut c = primary.conn();
    let (p0, r0) = (main_cpu(primary), main_cpu(replica));
    for batch in commands.chunks(1_000) {
        for command in batch {
            c.send(command);
        }
        for command in batch {
            let reply = c.read();
            assert!(
                !reply.is_error() && reply != Reply::Nil,
                "{command:?}: {reply:?}"
            );
        }
    }
    let p = main_cpu(primary).saturating_sub(p0);
    wait_replica_caught_up(primary, replica);
    (p, main_cpu(replica).saturating_sub(r0))
}

static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Suspicion: still-quadratic paths on the replica. N then 8N readers of one key (and permits
/// of a semaphore of 10,000) released in grant order, the oldest first: the replica's cost
/// grows about 8x when linear, 64x when each release passes over every holder. Measured on
/// the replica and, for comparison, the primary.
#[test]
#[ignore = "a debug build magnifies the O(holders) look through the fingerprints and the shift \
            of the member list every RELEASE of a shared lock makes (the documented bound, up to \
            MAX_HOLDERS 10,000): in a release build 8,000 readers leaving oldest first took 41 ms \
            on the primary and 33 ms on the replica against 3.0 and 1.7 ms for 1,000; measure \
            with LOCK_MODULE=target/release/libredis_lock.so and --ignored"]
fn review14_replica_releases_in_grant_order_scale_linearly() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (primary, replica) = pair();
    let run = |key: &str,
               n: usize,
               limit: Option<u32>,
               newest_first: bool|
     -> ((Duration, Duration), (Duration, Duration)) {
        let joins: Vec<Vec<String>> = (0..n)
            .map(|i| {
                let mut cmd = vec![
                    "LOCK.ACQUIRE".to_string(),
                    key.to_string(),
                    format!("{key}-{i}"),
                    "600000".to_string(),
                ];
                match limit {
                    Some(l) => cmd.extend(["LIMIT".to_string(), l.to_string()]),
                    None => cmd.push("SHARED".to_string()),
                }
                cmd
            })
            .collect();
        let mut leaves: Vec<Vec<String>> = (0..n)
            .map(|i| {
                vec![
                    "LOCK.RELEASE".to_string(),
                    key.to_string(),
                    format!("{key}-{i}"),
                ]
            })
            .collect();
        if newest_first {
            leaves.reverse();
        }
        (
            cost(&primary, &replica, &joins),
            cost(&primary, &replica, &leaves),
        )
    };
    let mut report = Vec::new();
    // Newest first (for comparison, not asserted): the oldest hold stays until the end, so
    // no release looks through the holders for the next oldest.
    for (name, limit, newest_first) in [
        ("newest-first", None, true),
        ("readers", None, false),
        ("permits", Some(10_000), false),
    ] {
        let (_, small) = run(&format!("{name}-small"), 1_000, limit, newest_first);
        let (_, big) = run(&format!("{name}-big"), 8_000, limit, newest_first);
        let ratio = |b: Duration, s: Duration| b.as_secs_f64() / s.as_secs_f64().max(0.005);
        report.push(format!(
            "{name}: releases replica {:?} -> {:?} ({:.1}x), primary {:?} -> {:?} ({:.1}x)",
            small.1,
            big.1,
            ratio(big.1, small.1),
            small.0,
            big.0,
            ratio(big.0, small.0)
        ));
        println!("{}", report.last().unwrap());
        if !newest_first && ratio(big.1, small.1) > 24.0 && big.1 > Duration::from_millis(300) {
            report.push(format!("{name}: QUADRATIC on the replica"));
        }
    }
    assert!(
        !report.iter().any(|l| l.contains("QUADRATIC")),
        "{}",
        report.join("\n")
    );
}

/// Suspicion: expiring thousands of readers (one removal of many, in slices) or ending
/// thousands of session readers costs the replica more than the primary.
#[test]
fn review14_replica_applies_mass_expiry_and_session_ends_at_the_primarys_cost() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (primary, replica) = pair();
    let n = 8_000;
    let joins: Vec<Vec<String>> = (0..n)
        .map(|i| {
            ["LOCK.ACQUIRE", "exp", &format!("e{i}"), "3000", "SHARED"]
                .map(String::from)
                .to_vec()
        })
        .collect();
    cost(&primary, &replica, &joins);
    // Everyone also holds a long reader so the key stays held.
    let (p0, r0) = (main_cpu(&primary), main_cpu(&replica));
    wait_for("the readers to expire", || {
        (lock_info(&mut primary.conn(), "exp")
            .is_some_and(|i| i.iter().any(|(f, v)| f == "holders" && *v == Reply::Int(0))))
        .then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    let (p, r) = (
        main_cpu(&primary).saturating_sub(p0),
        main_cpu(&replica).saturating_sub(r0),
    );
    println!("expiry of {n}: primary {p:?}, replica {r:?}");
    assert!(
        r <= p.max(Duration::from_millis(30)) * 3,
        "expiry of {n} readers: replica {r:?}, primary {p:?}"
    );
    assert_eq!(
        digest_value(&mut replica.conn(), "exp"),
        digest_value(&mut primary.conn(), "exp")
    );
    // Session readers, 100 connections of 40 each, closing one after another.
    let mut conns: Vec<Conn> = (0..100).map(|_| primary.conn()).collect();
    for (k, s) in conns.iter_mut().enumerate() {
        for i in 0..40 {
            s.send(&[
                "LOCK.ACQUIRE",
                "sess",
                &format!("s{k}-{i}"),
                "600000",
                "SHARED",
                "SESSION",
            ]);
        }
        for _ in 0..40 {
            assert!(s.read().is_int());
        }
    }
    wait_replica_caught_up(&primary, &replica);
    let (p0, r0) = (main_cpu(&primary), main_cpu(&replica));
    drop(conns);
    wait_for("the sessions to end", || {
        (lock_field(&mut primary.conn(), "sess", "holders").int() == 0).then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    let (p, r) = (
        main_cpu(&primary).saturating_sub(p0),
        main_cpu(&replica).saturating_sub(r0),
    );
    println!("session end of 4,000: primary {p:?}, replica {r:?}");
    assert!(
        r <= p.max(Duration::from_millis(30)) * 3,
        "session ends: replica {r:?}, primary {p:?}"
    );
    assert_eq!(
        digest_value(&mut replica.conn(), "sess"),
        digest_value(&mut primary.conn(), "sess")
    );
}
