//! No single value can take the fence space of other keys. A fence is at least the wall clock in
//! ms × 2048, so a fence more than a year ahead of that did not come from a grant: RESTORE (and
//! MIGRATE) refuse a lock carrying one, and a file that holds one (an RDB file, the AOF) still
//! loads, but the server-wide fence floor stops a year ahead of the clock. That key's own fences
//! go on from its fence; other keys keep theirs.

mod common;

use common::*;

/// The largest fence, and one a little below it (what the old failure needed).
const MAX_FENCE: u64 = i64::MAX as u64;
const NEAR_MAX: u64 = MAX_FENCE - 10;
/// The clock term of a time `ms` from now.
fn clock_fence_in(ms: u64) -> u64 {
    (now_ms() + ms) << 11
}
const DAY_MS: u64 = 86_400_000;

/// Grants on other keys are untouched: a fence from the clock, not from the far value.
fn assert_other_keys_unaffected(c: &mut Conn) {
    let fence = acquire(c, "other", "token-other", 10_000) as u64;
    assert!(
        fence < clock_fence_in(DAY_MS),
        "fence {fence} was pushed ahead"
    );
    assert_eq!(
        c.call(&["LOCK.RELEASE", "other", "token-other"]),
        Reply::Int(1)
    );
}

#[test]
fn restore_refuses_a_fence_more_than_a_year_ahead_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    assert_eq!(c.call(&["SET", "keep", "me"]), Reply::status("OK"));
    let digest = c.call(&["DEBUG", "DIGEST"]);
    for fence in [NEAR_MAX, MAX_FENCE, clock_fence_in(400 * DAY_MS)] {
        for fields in [
            tombstone_fields(fence),
            held_fields(fence, b"token", now_ms() + 60_000, 1, 0),
        ] {
            let reply = restore(&mut c, "far", &format.payload(&fields));
            assert_eq!(reply, Reply::error("ERR Bad data format"), "fence {fence}");
        }
    }
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), digest);
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(1));
    assert!(server.log().contains("refused a RESTOREd lock"));
    assert_other_keys_unaffected(&mut c);
}

#[test]
fn restore_accepts_a_fence_days_ahead_and_later_grants_exceed_it() {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let ahead = clock_fence_in(30 * DAY_MS);
    assert_eq!(
        restore(&mut c, "ahead", &format.payload(&tombstone_fields(ahead))),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["DEL", "ahead"]), Reply::Int(1));
    // The floor carries it: even a recreated key, and any other key, gets a larger fence.
    assert!(acquire(&mut c, "ahead", "t1", 10_000) as u64 > ahead);
    assert!(acquire(&mut c, "fresh", "t2", 10_000) as u64 > ahead);
}

/// What a server that loaded a lock with a fence near the maximum does: the key keeps its fence
/// (`fence`) and goes on from it; other keys get fences from the clock.
fn assert_far_key_is_contained(c: &mut Conn, fence: u64) {
    assert_eq!(fence_of(c, "far"), fence as i64);
    assert_other_keys_unaffected(c);
    assert_eq!(acquire(c, "far", "token-far", 10_000), fence as i64 + 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "far", "token-far"]), Reply::Int(1));
}

#[test]
fn an_rdb_file_with_a_fence_near_the_maximum_loads_without_lifting_the_floor() {
    let mut server = Server::start();
    let format = LockDumpFormat::learn(&mut server.conn());
    // The header the server writes: `REDIS0010` (Redis 7.0), `VALKEY080` (Valkey 9), ...
    assert_eq!(server.conn().call(&["SAVE"]), Reply::status("OK"));
    let saved = std::fs::read(server.dir().join("dump.rdb")).expect("read dump.rdb");
    server.kill();
    // An RDB file: header, SELECT 0, one lock value, EOF and a zero checksum (not checked).
    let mut rdb = saved[..9].to_vec();
    rdb.extend([0xFE, 0x00, 7]);
    rdb.extend(rdb_len(3));
    rdb.extend(b"far");
    rdb.extend(rdb_len(format.module_id));
    rdb.extend(tombstone_fields(NEAR_MAX));
    rdb.push(0xFF);
    rdb.extend([0; 8]);
    std::fs::write(server.dir().join("dump.rdb"), rdb).expect("write dump.rdb");
    server.restart();
    let mut c = server.conn();
    assert!(server.log().contains("more than a year ahead of the clock"));
    assert_far_key_is_contained(&mut c, NEAR_MAX);
    // Saved and loaded again, the floor stays where it was.
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_far_key_is_contained(&mut c, NEAR_MAX + 1);
}

#[test]
fn an_aof_with_a_fence_near_the_maximum_loads_without_lifting_the_floor() {
    let mut server = Server::start();
    server.kill();
    // A single-file AOF as older servers wrote it (Redis 7 upgrades it into its AOF directory).
    let resp = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for arg in args {
            out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        out
    };
    let state = format!("sync:{NEAR_MAX}:{NEAR_MAX}");
    let aof = resp(&["SELECT", "0"])
        + &resp(&["LOCK.FLOOR", &NEAR_MAX.to_string()])
        + &resp(&["LOCK.APPLY", "far", &state]);
    std::fs::write(server.dir().join("appendonly.aof"), aof).expect("write appendonly.aof");
    server.config = server.config.clone().with("appendonly", "yes");
    server.restart();
    let mut c = server.conn();
    assert_far_key_is_contained(&mut c, NEAR_MAX);
}
