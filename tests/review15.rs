//! review15: probes of 9de9ce0 (a lock-delay ended early by LOCK.FORCERELEASE restarts the
//! tombstone time from now) and e9201a1 (the oldest hold of a shared lock read off its first
//! holder while the holders are in grant order; `holds::follow_change` rewritten), on a primary
//! and its replica.

mod common;

use std::time::Instant;

use common::*;

fn pair(tombstone_ttl: &str) -> (Server, Server) {
    let config = Config::default()
        .module_arg("tombstone-ttl")
        .module_arg(tombstone_ttl);
    let primary = Server::start_with(config.clone());
    let replica = Server::start_with(config);
    replica.replicate_from(&primary);
    (primary, replica)
}

fn exists(c: &mut Conn, key: &str) -> i64 {
    c.call(&["EXISTS", key]).int()
}

fn same_digest(primary: &Server, replica: &Server) {
    wait_replica_caught_up(primary, replica);
    assert_eq!(
        replica.conn().call(&["DEBUG", "DIGEST"]),
        primary.conn().call(&["DEBUG", "DIGEST"]),
        "DEBUG DIGEST"
    );
}

/// Waits until the primary's timer expired the lease of `key` into its lock-delay (LOCK.INFO
/// shows an overdue lease as free before the expiry is made and replicated) and returns
/// `delay_ttl` then.
fn wait_in_delay(primary: &Server, p: &mut Conn, key: &str) -> i64 {
    wait_for("the lease to run out into its delay", || {
        (primary.info_int("lock_expired") == 1 && state_of(p, key) == "free")
            .then(|| int_field(p, key, "delay_ttl"))
    })
}

fn int_field(c: &mut Conn, key: &str, field: &str) -> i64 {
    lock_field(c, key, field).int()
}

/// A lock in a lock-delay, forced released: kept `lock.tombstone-ttl` (1,500 ms) from the forced
/// release, then reclaimed, on the primary and the replica alike.
#[test]
fn review15_a_forced_release_of_a_delay_keeps_the_free_lock_tombstone_ttl_from_then() {
    let (primary, replica) = pair("1500");
    let mut p = primary.conn();
    assert!(acquire_with(&mut p, "fd", "t", 100, &["LOCKDELAY", "600000"]).is_int());
    let delay = wait_in_delay(&primary, &mut p, "fd");
    assert!(delay > 590_000 && delay <= 600_000, "delay_ttl {delay}");
    same_digest(&primary, &replica);
    let before = now_ms();
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "fd"]), Reply::Int(0));
    let after = now_ms();
    assert_eq!(int_field(&mut p, "fd", "delay_ttl"), -1);
    assert_eq!(state_of(&mut p, "fd"), "free");
    same_digest(&primary, &replica);
    assert_eq!(replica.info_int("lock_forced"), 1);
    // Reclaimed tombstone-ttl after the forced release: not before, and not long after.
    let mut seen = 0;
    let gone_at = wait_for("the free lock to be reclaimed", || {
        let present = exists(&mut p, "fd") == 1;
        let at = now_ms();
        seen += i64::from(present);
        (!present).then_some(at)
    });
    assert!(seen > 0);
    assert!(
        gone_at >= before + 1500,
        "reclaimed {} ms after the forced release",
        gone_at - before
    );
    assert!(
        gone_at <= after + 1500 + 1500,
        "reclaimed {} ms after the forced release",
        gone_at - before
    );
    let mut r = replica.conn();
    wait_for("the replica to delete it too", || {
        (exists(&mut r, "fd") == 0).then_some(())
    });
    assert_eq!(primary.info_int("lock_reclaimed"), 1);
    same_digest(&primary, &replica);
}

/// A lock-delay that ends by itself is unchanged: delay_ttl counts down, a waiter queued in it is
/// served at its end (not before), the lock is kept until then, and the replica agrees.
#[test]
fn review15_a_delay_that_ends_by_itself_serves_its_waiter_at_its_end() {
    let (primary, replica) = pair("200");
    let mut p = primary.conn();
    let started = now_ms();
    assert!(acquire_with(&mut p, "dl", "t", 100, &["LOCKDELAY", "1500"]).is_int());
    let delay = wait_in_delay(&primary, &mut p, "dl");
    assert!(delay > 0 && delay <= 1500, "delay_ttl {delay}");
    // Nobody gets it during the delay.
    assert_eq!(p.call(&["LOCK.ACQUIRE", "dl", "other", "5000"]), Reply::Nil);
    let before_wait = blocked(&primary);
    let mut waiter = primary.conn();
    waiter.send(&["LOCK.ACQUIRE", "dl", "w", "60000", "WAIT", "20000"]);
    wait_blocked(&primary, before_wait + 1);
    same_digest(&primary, &replica);
    let fence = waiter.read();
    let granted_at = now_ms();
    assert!(fence.is_int(), "{fence:?}");
    assert!(
        granted_at >= started + 100 + 1500,
        "served {} ms after the grant (delay not over)",
        granted_at - started
    );
    assert_eq!(state_of(&mut p, "dl"), "held");
    assert_eq!(int_field(&mut p, "dl", "delay_ttl"), -1);
    same_digest(&primary, &replica);
    assert_eq!(p.call(&["LOCK.RELEASE", "dl", "w"]), Reply::Int(1));
    let released = now_ms();
    let gone_at = wait_for("the released lock to be reclaimed", || {
        (exists(&mut p, "dl") == 0).then(now_ms)
    });
    assert!(gone_at >= released, "reclaimed before release");
    same_digest(&primary, &replica);
}

/// With `lock.tombstone-ttl 0`, forcing a lock-delay to end while a client waits in it serves
/// the waiter at once (the lock is not deleted under it), primary and replica alike.
#[test]
fn review15_a_forced_release_of_a_delay_with_a_waiter_serves_it_with_tombstone_ttl_zero() {
    let (primary, replica) = pair("0");
    let mut p = primary.conn();
    assert!(acquire_with(&mut p, "fw", "t", 100, &["LOCKDELAY", "600000"]).is_int());
    wait_in_delay(&primary, &mut p, "fw");
    let before_wait = blocked(&primary);
    let mut waiter = primary.conn();
    waiter.send(&["LOCK.ACQUIRE", "fw", "w", "60000", "WAIT", "20000"]);
    wait_blocked(&primary, before_wait + 1);
    let old_fence = fence_of(&mut p, "fw");
    let asked = Instant::now();
    assert_eq!(p.call(&["LOCK.FORCERELEASE", "fw"]), Reply::Int(0));
    let fence = waiter.read();
    assert!(asked.elapsed().as_millis() < 5_000);
    assert!(
        fence.is_int() && fence.int() > old_fence,
        "{fence:?} after {old_fence}"
    );
    assert_eq!(state_of(&mut p, "fw"), "held");
    assert_eq!(fence_of(&mut p, "fw"), fence.int());
    same_digest(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(state_of(&mut r, "fw"), "held");
}

/// `lock_oldest_hold_ms` of `server` lies within what the grant moments allow: a hold granted
/// between `granted_before` and `granted_after` (ms since the epoch).
fn assert_oldest(server: &Server, granted_before: u64, granted_after: u64, what: &str) {
    let asked = now_ms();
    let age = server.info_int("lock_oldest_hold_ms");
    let answered = now_ms();
    let low = asked.saturating_sub(granted_after) as i64 - 1;
    let high = answered.saturating_sub(granted_before) as i64 + 1;
    assert!(
        (low..=high).contains(&age),
        "{what}: lock_oldest_hold_ms {age}, expected {low}..={high}"
    );
}

fn assert_oldest_both(primary: &Server, replica: &Server, b: u64, a: u64, what: &str) {
    wait_replica_caught_up(primary, replica);
    assert_oldest(primary, b, a, &format!("{what} (primary)"));
    assert_oldest(replica, b, a, &format!("{what} (replica)"));
}

/// Waits (bounded) until the clock has moved `ms` past `since`.
fn wait_clock(since: u64, ms: u64) {
    wait_for("the clock to move on", || {
        (now_ms() >= since + ms).then_some(())
    });
}

/// Readers granted 250 ms apart leave newest first, then oldest first: INFO's oldest hold age
/// on the primary and the replica is the oldest remaining reader's at every step, and after
/// DEBUG RELOAD.
#[test]
fn review15_the_oldest_hold_age_follows_readers_leaving_in_either_order() {
    let (primary, replica) = pair("10000");
    let mut p = primary.conn();
    let mut moments = Vec::new();
    for reader in ["r0", "r1", "r2", "r3", "r4"] {
        let before = now_ms();
        assert!(acquire_with(&mut p, "rw", reader, 600_000, &["SHARED"]).is_int());
        let after = now_ms();
        moments.push((reader, before, after));
        wait_clock(after, 250);
    }
    let (_, b0, a0) = moments[0];
    assert_oldest_both(&primary, &replica, b0, a0, "five readers");
    // Newest first: the oldest stays.
    for reader in ["r4", "r3"] {
        assert_eq!(p.call(&["LOCK.RELEASE", "rw", reader]), Reply::Int(1));
        assert_oldest_both(&primary, &replica, b0, a0, &format!("after {reader} left"));
    }
    // Oldest first: the next one each time.
    for (gone, next) in [(0, 1), (1, 2)] {
        let reader = moments[gone].0;
        assert_eq!(p.call(&["LOCK.RELEASE", "rw", reader]), Reply::Int(1));
        let (_, b, a) = moments[next];
        assert_oldest_both(&primary, &replica, b, a, &format!("after {reader} left"));
    }
    // A reader joins after: r2 stays the oldest; DEBUG RELOAD keeps it.
    assert!(acquire_with(&mut p, "rw", "r5", 600_000, &["SHARED"]).is_int());
    let (_, b2, a2) = moments[2];
    assert_oldest_both(&primary, &replica, b2, a2, "r5 joined");
    assert_eq!(p.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_oldest(&primary, b2, a2, "after DEBUG RELOAD");
    assert_eq!(p.call(&["LOCK.RELEASE", "rw", "r2"]), Reply::Int(1));
    assert_eq!(p.call(&["LOCK.RELEASE", "rw", "r5"]), Reply::Int(1));
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(primary.info_int("lock_oldest_hold_ms"), 0);
    assert_eq!(replica.info_int("lock_oldest_hold_ms"), 0);
}

/// RDB module fields of a shared holder: fence, token digest, deadline, holds, flags; with a
/// grant time when `since` is not 0 (flag 4: since, client id, `addr name label`).
fn member_fields(fence: u64, token: &str, deadline: u64, since: u64) -> Vec<u8> {
    let mut out = rdb_uint(fence);
    out.extend(rdb_string(&token_digest(token.as_bytes())));
    out.extend(rdb_uint(deadline));
    out.extend(rdb_uint(1));
    if since == 0 {
        out.extend(rdb_uint(DIGEST_FLAG));
    } else {
        out.extend(rdb_uint(DIGEST_FLAG | 4));
        out.extend(rdb_uint(since));
        out.extend(rdb_uint(7));
        out.extend(rdb_string(b"127.0.0.1:1000 app job"));
    }
    out
}

/// A shared lock RESTOREd with a reader of unknown grant time first (an older release's RDB),
/// then two with known grant times: the oldest known one counts, and as readers leave, the
/// next one; with only the unknown one left, no age (0); a new reader counts from its grant.
#[test]
fn review15_the_oldest_hold_age_with_a_reader_of_unknown_grant_time() {
    let (primary, replica) = pair("10000");
    let mut p = primary.conn();
    let format = LockDumpFormat::learn(&mut p);
    let now = now_ms();
    let deadline = now + 600_000;
    let (old, young) = (now - 5_000, now - 3_000);
    let mut fields = rdb_uint(103);
    fields.extend(rdb_uint(3)); // a group
    fields.extend(rdb_uint(0)); // no limit: shared
    fields.extend(rdb_uint(3));
    fields.extend(member_fields(101, "unknown", deadline, 0));
    fields.extend(member_fields(102, "old", deadline, old));
    fields.extend(member_fields(103, "young", deadline, young));
    fields.push(0);
    assert_eq!(
        restore(&mut p, "ur", &format.payload(&fields)),
        Reply::status("OK")
    );
    assert_eq!(state_of(&mut p, "ur"), "held");
    assert_eq!(lock_field(&mut p, "ur", "holders").int(), 3);
    assert_oldest_both(&primary, &replica, old, old, "restored");
    // The oldest known leaves.
    assert_eq!(p.call(&["LOCK.RELEASE", "ur", "old"]), Reply::Int(1));
    assert_oldest_both(&primary, &replica, young, young, "old left");
    // A new reader joins behind them.
    let before = now_ms();
    assert!(acquire_with(&mut p, "ur", "new", 600_000, &["SHARED"]).is_int());
    let after = now_ms();
    assert_oldest_both(&primary, &replica, young, young, "new joined");
    assert_eq!(p.call(&["LOCK.RELEASE", "ur", "young"]), Reply::Int(1));
    assert_oldest_both(&primary, &replica, before, after, "young left");
    // Newest first: only the unknown one is left.
    assert_eq!(p.call(&["LOCK.RELEASE", "ur", "new"]), Reply::Int(1));
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(primary.info_int("lock_oldest_hold_ms"), 0);
    assert_eq!(replica.info_int("lock_oldest_hold_ms"), 0);
    assert_eq!(state_of(&mut p, "ur"), "held");
    // DEBUG RELOAD keeps the unknown reader unknown; a new one counts from its grant.
    assert_eq!(p.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(primary.info_int("lock_oldest_hold_ms"), 0);
    let before = now_ms();
    assert!(acquire_with(&mut p, "ur", "late", 600_000, &["SHARED"]).is_int());
    let after = now_ms();
    wait_clock(after, 200);
    assert_oldest_both(&primary, &replica, before, after, "late joined");
    assert_eq!(p.call(&["LOCK.RELEASE", "ur", "unknown"]), Reply::Int(1));
    assert_oldest_both(&primary, &replica, before, after, "unknown left");
    same_digest(&primary, &replica);
}
