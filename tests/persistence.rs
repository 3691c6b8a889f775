//! Fences and lock state across everything that stores, reloads or moves a lock: release, expiry,
//! forced release, DEL/UNLINK, DEBUG RELOAD, RDB and AOF restarts (with and without the RDB
//! preamble, before and after an AOF rewrite), DUMP/RESTORE, COPY and MIGRATE.
//!
//! Most grants would exceed older ones by the clock term of the fence alone, so the tests that
//! matter for the fence floor first plant a fence about ten days ahead of the clock (a crafted
//! RESTORE): only a floor that survived can make the next grant larger than that.

mod common;
use common::*;

use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Waits until the lease of `key` has run out and the server itself expired it (not just reads
/// treating it as free): state free and `lock_expired` at `expired`.
fn wait_expired(server: &Server, key: &str, expired: i64) {
    let mut c = server.conn();
    wait_for("lock expired by the server", || {
        (state_of(&mut c, key) == "free" && server.info_int("lock_expired") == expired)
            .then_some(())
    });
}

fn db_digest(c: &mut Conn) -> String {
    c.call(&["DEBUG", "DIGEST"]).text()
}

fn aof_config(preamble: &str) -> Config {
    Config::default()
        .with("appendonly", "yes")
        .with("aof-use-rdb-preamble", preamble)
        .with("appendfsync", "always")
}

fn persistence_field(server: &Server, field: &str) -> String {
    server
        .info_field("persistence", field)
        .unwrap_or_else(|| panic!("no INFO persistence field {field}"))
}

/// Waits until no AOF rewrite is running or scheduled.
fn wait_aof_rewrite_idle(server: &Server) {
    wait_for("AOF rewrite idle", || {
        (persistence_field(server, "aof_rewrite_in_progress") == "0"
            && persistence_field(server, "aof_rewrite_scheduled") == "0")
            .then_some(())
    });
}

/// Runs BGREWRITEAOF to completion and checks it succeeded.
fn rewrite_aof(server: &Server) {
    wait_aof_rewrite_idle(server);
    let reply = server.conn().call(&["BGREWRITEAOF"]);
    assert!(
        reply == Reply::status("Background append only file rewriting started")
            || reply == Reply::status("Background append only file rewriting scheduled"),
        "{reply:?}"
    );
    wait_aof_rewrite_idle(server);
    assert_eq!(persistence_field(server, "aof_last_bgrewrite_status"), "ok");
}

/// Files of the multi-part AOF whose name ends with `suffix`.
fn aof_files(server: &Server, suffix: &str) -> Vec<PathBuf> {
    let dir = server.dir().join("appendonlydir");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    files
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------------------------------
// One server, no restart

#[test]
fn fence_grows_after_release() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(
        fence_of(&mut c, "k"),
        first,
        "a free lock keeps its last fence"
    );
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
    let third = acquire(&mut c, "k", "a", 10_000);
    assert!(third > second, "{third} > {second}");
}

#[test]
fn fence_grows_after_expiry() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 200);
    wait_expired(&server, "k", 1);
    assert_eq!(fence_of(&mut c, "k"), first);
    assert_eq!(lock_field(&mut c, "k", "ttl"), Reply::Int(-1));
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &first.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
}

#[test]
fn fence_grows_after_forcerelease() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(fence_of(&mut c, "k"), first);
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
}

#[test]
fn fence_grows_after_del_and_unlink() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.INFO", "k"]), Reply::Nil);
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
    assert_eq!(c.call(&["UNLINK", "k"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.INFO", "k"]), Reply::Nil);
    let third = acquire(&mut c, "k", "c", 10_000);
    assert!(third > second, "{third} > {second}");
}

#[test]
fn fence_floor_outlives_del_and_unlink_of_a_fence_ahead_of_the_clock() {
    let server = Server::start();
    let mut c = server.conn();
    let planted = fence_far_ahead(&mut c);
    plant_fence(&mut c, "k", planted);
    let next = acquire(&mut c, "k", "a", 10_000);
    assert_eq!(next as u64, planted + 1, "the key's own fence decides");
    assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1));
    let after_del = acquire(&mut c, "k", "b", 10_000);
    assert_eq!(after_del, next + 1, "the floor decides after DEL");
    assert_eq!(c.call(&["UNLINK", "k"]), Reply::Int(1));
    let after_unlink = acquire(&mut c, "k", "c", 10_000);
    assert_eq!(
        after_unlink,
        after_del + 1,
        "the floor decides after UNLINK"
    );
    // The floor is server-wide: another key also gets a larger fence.
    let other = acquire(&mut c, "other", "d", 10_000);
    assert_eq!(other, after_unlink + 1);
}

#[test]
fn debug_reload_keeps_held_lock_with_fence_and_token() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", "owner", 60_000);
    let free_fence = acquire(&mut c, "t", "x", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "t", "x"]), Reply::Int(1));
    let digest = db_digest(&mut c);
    let value_digest = digest_value(&mut c, "k");
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(db_digest(&mut c), digest);
    assert_eq!(digest_value(&mut c, "k"), value_digest);
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k"), fence);
    let ttl = lock_field(&mut c, "k", "ttl").int();
    assert!(ttl > 50_000 && ttl <= 60_000, "ttl {ttl}");
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "intruder", "1000"]),
        Reply::Nil
    );
    assert_eq!(state_of(&mut c, "t"), "free");
    assert_eq!(fence_of(&mut c, "t"), free_fence);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "owner"]), Reply::Int(1));
    let next = acquire(&mut c, "k", "intruder", 1000);
    assert!(next > fence && next > free_fence, "{next}");
}

#[test]
fn debug_reload_after_del_grants_a_larger_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1));
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    let second = acquire(&mut c, "k", "b", 60_000);
    assert!(second > first, "{second} > {first}");

    // Same with a fence ahead of the clock: only the floor (aux data) can carry it.
    let planted = fence_far_ahead(&mut c);
    plant_fence(&mut c, "p", planted);
    assert_eq!(c.call(&["DEL", "p"]), Reply::Int(1));
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    let third = acquire(&mut c, "p", "c", 60_000);
    assert_eq!(third as u64, planted + 1);
}

#[test]
fn debug_digest_is_equal_before_and_after_debug_reload_and_restart() {
    let mut server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "held", "h", 600_000);
    acquire(&mut c, "reentrant", "r", 600_000);
    let reentrant = c
        .call(&["LOCK.ACQUIRE", "reentrant", "r", "600000", "REENTRANT"])
        .int();
    assert_eq!(fence_of(&mut c, "reentrant"), reentrant);
    acquire(&mut c, "free", "f", 600_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "f"]), Reply::Int(1));
    c.call(&["SET", "plain", "value"]);
    let digest = db_digest(&mut c);
    assert_ne!(digest, "0".repeat(40));
    let values: Vec<String> = ["held", "reentrant", "free"]
        .iter()
        .map(|k| digest_value(&mut c, k))
        .collect();

    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(db_digest(&mut c), digest, "after DEBUG RELOAD");

    assert_eq!(c.call(&["SAVE"]), Reply::status("OK"));
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_eq!(db_digest(&mut c), digest, "after restart from RDB");
    let after: Vec<String> = ["held", "reentrant", "free"]
        .iter()
        .map(|k| digest_value(&mut c, k))
        .collect();
    assert_eq!(after, values);
    assert_eq!(lock_field(&mut c, "reentrant", "holds"), Reply::Int(2));
}

// ---------------------------------------------------------------------------------------------
// Restarts

#[test]
fn restart_from_rdb_keeps_locks_and_the_fence_floor() {
    let mut server = Server::start();
    let mut c = server.conn();
    let held = acquire(&mut c, "held", "owner", 60_000);
    let free = acquire(&mut c, "free", "x", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "x"]), Reply::Int(1));
    let planted = fence_far_ahead(&mut c);
    plant_fence(&mut c, "gone", planted);
    assert_eq!(c.call(&["DEL", "gone"]), Reply::Int(1));
    let before = db_digest(&mut c);
    assert_eq!(c.call(&["SAVE"]), Reply::status("OK"));
    server.shutdown_and_restart();

    let mut c = server.conn();
    assert_eq!(db_digest(&mut c), before);
    assert_eq!(state_of(&mut c, "held"), "held");
    assert_eq!(fence_of(&mut c, "held"), held);
    assert_eq!(state_of(&mut c, "free"), "free");
    assert_eq!(fence_of(&mut c, "free"), free);
    assert_eq!(c.call(&["LOCK.INFO", "gone"]), Reply::Nil);
    // Only the floor saved as aux data knows the planted fence.
    let after_gone = acquire(&mut c, "gone", "y", 60_000);
    assert_eq!(after_gone as u64, planted + 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "held", "owner"]), Reply::Int(1));
    let next = acquire(&mut c, "held", "z", 60_000);
    assert_eq!(next, after_gone + 1);
}

/// Restart from the AOF (with or without the RDB preamble, optionally after a rewrite) keeps
/// held locks with their tokens, free locks with their fences, and the fence floor.
fn aof_restart_case(preamble: &str, rewrite: bool) {
    let mut server = Server::start_with(aof_config(preamble));
    wait_aof_rewrite_idle(&server);
    let mut c = server.conn();
    let held = acquire(&mut c, "held", "owner", 60_000);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "held", "owner", "60000", "REENTRANT"]),
        Reply::Int(held)
    );
    let free = acquire(&mut c, "free", "x", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "x"]), Reply::Int(1));
    let forced = acquire(&mut c, "forced", "y", 60_000);
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "forced"]), Reply::Int(1));
    let planted = fence_far_ahead(&mut c);
    plant_fence(&mut c, "gone", planted);
    assert_eq!(c.call(&["DEL", "gone"]), Reply::Int(1));
    c.call(&["SET", "plain", "value"]);
    let binary: &[u8] = b"\x00tok\r\n*1\r\n$4\xff";
    let bin = c
        .call(&[&b"LOCK.ACQUIRE"[..], b"bin", binary, b"60000"])
        .int();

    if rewrite {
        rewrite_aof(&server);
        let bases = aof_files(
            &server,
            if preamble == "yes" {
                ".base.rdb"
            } else {
                ".base.aof"
            },
        );
        assert_eq!(bases.len(), 1, "{bases:?}");
        let base = std::fs::read(&bases[0]).expect("read base AOF");
        if preamble == "yes" {
            // Redis and Valkey 8 write `REDIS0010`-style headers, Valkey 9 `VALKEY080`.
            let identity = server.identity();
            let magic: &[u8] = if identity.product == Product::Valkey && identity.version.0 >= 9 {
                b"VALKEY"
            } else {
                b"REDIS"
            };
            assert!(base.starts_with(magic), "RDB preamble on {identity:?}");
        } else {
            // The module's AOF rewrite restates each lock as LOCK.APPLY ... sync ...
            assert!(
                contains(&base, b"LOCK.APPLY"),
                "{}",
                String::from_utf8_lossy(&base)
            );
            assert!(
                contains(&base, b"sync"),
                "{}",
                String::from_utf8_lossy(&base)
            );
            assert!(contains(&base, free.to_string().as_bytes()));
            assert!(contains(&base, held.to_string().as_bytes()));
        }
        // Something for the incremental file after the rewrite.
        assert_eq!(
            c.call(&["LOCK.RENEW", "held", "owner", "50000"]),
            Reply::Int(1)
        );
    }
    let before = db_digest(&mut c);
    let held_digest = digest_value(&mut c, "held");
    server.shutdown_and_restart();
    wait_aof_rewrite_idle(&server);

    let mut c = server.conn();
    assert_eq!(persistence_field(&server, "aof_enabled"), "1");
    assert_eq!(db_digest(&mut c), before, "digest after restart from AOF");
    assert_eq!(digest_value(&mut c, "held"), held_digest);
    assert_eq!(state_of(&mut c, "held"), "held");
    assert_eq!(fence_of(&mut c, "held"), held);
    assert_eq!(lock_field(&mut c, "held", "holds"), Reply::Int(2));
    assert_eq!(
        c.call(&["LOCK.FENCE", "held", &held.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(state_of(&mut c, "free"), "free");
    assert_eq!(fence_of(&mut c, "free"), free);
    assert_eq!(state_of(&mut c, "forced"), "free");
    assert_eq!(fence_of(&mut c, "forced"), forced);
    assert_eq!(c.call(&["GET", "plain"]), Reply::bulk("value"));
    assert_eq!(c.call(&["LOCK.INFO", "gone"]), Reply::Nil);
    assert_eq!(fence_of(&mut c, "bin"), bin);
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"bin", &binary[..binary.len() - 1]]),
        Reply::Int(0)
    );
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"bin", binary]),
        Reply::Int(1)
    );

    let after_gone = acquire(&mut c, "gone", "g", 60_000);
    assert!(
        after_gone as u64 > planted,
        "{after_gone} > planted {planted}"
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "held", "owner"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "held", "owner"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "held"), "free");
    let next_held = acquire(&mut c, "held", "other", 60_000);
    assert!(next_held > after_gone, "{next_held} > {after_gone}");
    let next_free = acquire(&mut c, "free", "other", 60_000);
    assert!(next_free > next_held);
    let next_forced = acquire(&mut c, "forced", "other", 60_000);
    assert!(next_forced > next_free);

    // And once more: what was written after the restart survives another restart.
    let before = db_digest(&mut c);
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_eq!(db_digest(&mut c), before, "digest after the second restart");
    assert_eq!(fence_of(&mut c, "forced"), next_forced);
    assert_eq!(c.call(&["LOCK.RELEASE", "forced", "other"]), Reply::Int(1));
}

#[test]
fn restart_from_aof_with_rdb_preamble() {
    aof_restart_case("yes", false);
}

#[test]
fn restart_from_aof_without_rdb_preamble() {
    aof_restart_case("no", false);
}

#[test]
fn restart_from_aof_with_rdb_preamble_after_rewrite() {
    aof_restart_case("yes", true);
}

#[test]
fn restart_from_aof_without_rdb_preamble_after_rewrite() {
    aof_restart_case("no", true);
}

/// A rewrite of a pure AOF (no RDB preamble) when no lock key is left: the fence floor has no
/// key to ride on.
#[test]
fn aof_rewrite_without_preamble_and_without_lock_keys_keeps_the_fence_floor() {
    let mut server = Server::start_with(aof_config("no"));
    wait_aof_rewrite_idle(&server);
    let mut c = server.conn();
    let planted = fence_far_ahead(&mut c);
    plant_fence(&mut c, "gone", planted);
    assert_eq!(c.call(&["DEL", "gone"]), Reply::Int(1));
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(0));
    rewrite_aof(&server);
    server.shutdown_and_restart();
    let mut c = server.conn();
    let next = acquire(&mut c, "gone", "a", 60_000);
    assert!(
        next as u64 > planted,
        "fence {next} after restart is not above {planted} granted before"
    );
}

#[test]
fn lease_that_ran_out_while_the_server_was_down_is_free_after_restart() {
    let mut server = Server::start();
    let mut c = server.conn();
    let start = Instant::now();
    let first = acquire(&mut c, "k", "a", 300);
    assert_eq!(c.call(&["SAVE"]), Reply::status("OK"));
    server.shutdown();
    // The point of the test: the deadline passes while no server runs.
    if let Some(left) = Duration::from_millis(350).checked_sub(start.elapsed()) {
        sleep(left);
    }
    server.restart();
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(lock_field(&mut c, "k", "ttl"), Reply::Int(-1));
    assert_eq!(fence_of(&mut c, "k"), first);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &first.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(c.call(&["LOCK.RENEW", "k", "a", "1000"]), Reply::Int(0));
    // The restarted primary removes the overdue holder itself.
    wait_expired(&server, "k", 1);
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
}

#[test]
fn aof_replay_does_not_resurrect_a_lock_that_expired_while_running() {
    let mut server = Server::start_with(aof_config("no"));
    wait_aof_rewrite_idle(&server);
    let mut c = server.conn();
    let first = acquire(&mut c, "k", "a", 200);
    wait_expired(&server, "k", 1);
    let digest = digest_value(&mut c, "k");
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(fence_of(&mut c, "k"), first);
    assert_eq!(
        digest_value(&mut c, "k"),
        digest,
        "the AOF holds the expiry"
    );
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &first.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
}

#[test]
fn aof_replay_does_not_resurrect_a_lock_that_expired_while_down() {
    let mut server = Server::start_with(aof_config("no"));
    wait_aof_rewrite_idle(&server);
    let mut c = server.conn();
    let start = Instant::now();
    let first = acquire(&mut c, "k", "a", 500);
    server.shutdown();
    if let Some(left) = Duration::from_millis(550).checked_sub(start.elapsed()) {
        sleep(left);
    }
    server.restart();
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(fence_of(&mut c, "k"), first);
    assert_eq!(
        c.call(&["LOCK.FENCE", "k", &first.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(0));
    wait_expired(&server, "k", 1);
    let second = acquire(&mut c, "k", "b", 10_000);
    assert!(second > first, "{second} > {first}");
    // The expiry and the new grant are in the AOF too.
    server.shutdown_and_restart();
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k"), second);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
}

// ---------------------------------------------------------------------------------------------
// DUMP / RESTORE / COPY / MIGRATE

#[test]
fn dump_restore_to_another_key_keeps_the_fence_and_next_grant_is_larger() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "src", "owner", 60_000);
    let Reply::Bulk(held_dump) = c.call(&["DUMP", "src"]) else {
        panic!("DUMP")
    };
    assert_eq!(restore(&mut c, "dst", &held_dump), Reply::status("OK"));
    assert_eq!(digest_value(&mut c, "dst"), digest_value(&mut c, "src"));
    assert_eq!(state_of(&mut c, "dst"), "held");
    assert_eq!(fence_of(&mut c, "dst"), fence);
    assert_eq!(
        c.call(&["LOCK.FENCE", "dst", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "dst", "intruder", "1000"]),
        Reply::Nil
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "dst", "owner"]), Reply::Int(1));
    assert_eq!(
        state_of(&mut c, "src"),
        "held",
        "the restored copy is independent"
    );
    let next = acquire(&mut c, "dst", "intruder", 1000);
    assert!(next > fence, "{next} > {fence}");

    // A free lock restored elsewhere keeps its fence too.
    let Reply::Bulk(free_dump) = c.call(&["DUMP", "dst"]) else {
        panic!("DUMP")
    };
    assert_eq!(c.call(&["LOCK.RELEASE", "dst", "intruder"]), Reply::Int(1));
    let Reply::Bulk(free_dump2) = c.call(&["DUMP", "dst"]) else {
        panic!("DUMP")
    };
    assert_ne!(free_dump, free_dump2);
    assert_eq!(restore(&mut c, "dst2", &free_dump2), Reply::status("OK"));
    assert_eq!(state_of(&mut c, "dst2"), "free");
    assert_eq!(fence_of(&mut c, "dst2"), next);
    let after = acquire(&mut c, "dst2", "x", 1000);
    assert!(after > next);
    // RESTORE onto an existing key needs REPLACE.
    assert_eq!(
        restore(&mut c, "dst2", &free_dump2),
        Reply::error("BUSYKEY Target key name already exists.")
    );
}

#[test]
fn restored_fence_ahead_of_the_clock_raises_the_floor() {
    let server = Server::start();
    let mut c = server.conn();
    let planted = fence_far_ahead(&mut c);
    plant_fence(&mut c, "p", planted);
    assert_eq!(c.call(&["DEL", "p"]), Reply::Int(1));
    let next = acquire(&mut c, "unrelated", "a", 1000);
    assert_eq!(next as u64, planted + 1);
}

#[test]
fn crafted_held_lock_payload_restores_as_held() {
    // Positive control for the corrupted payloads below: the crafting itself is right.
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let fence = fence_far_ahead(&mut c);
    let deadline = now_ms() + 60_000;
    let payload = format.payload(&held_fields(fence, b"tok\x00en", deadline, 2, 0));
    assert_eq!(restore(&mut c, "k", &payload), Reply::status("OK"));
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k") as u64, fence);
    assert_eq!(lock_field(&mut c, "k", "holds"), Reply::Int(2));
    assert_eq!(c.call(&["DUMP", "k"]), Reply::Bulk(payload));
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"k", b"tok\x00en"]),
        Reply::Int(1)
    );
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"k", b"tok\x00en"]),
        Reply::Int(1)
    );
    assert_eq!(state_of(&mut c, "k"), "free");
}

#[test]
fn restore_of_corrupted_or_truncated_lock_payloads_is_an_error() {
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let fence = acquire(&mut c, "held", "owner", 60_000) as u64;
    c.call(&["SET", "plain", "value"]);
    let held_digest = digest_value(&mut c, "held");
    let deadline = now_ms() + 60_000;
    let good = held_fields(fence, b"tok", deadline, 1, 0);

    let bad_format = Reply::error("ERR Bad data format");
    let mut cases: Vec<(String, Vec<u8>, Reply)> = Vec::new();
    // Every truncation of the module fields, with a correct checksum. Redis reads past the
    // fields into the payload's footer, so cutting the last value byte and the EOF marker makes
    // the footer's RDB version byte (10) the flags word and its next byte (0) the EOF marker: a
    // well-formed value after all, skipped here.
    for cut in (0..good.len()).filter(|cut| *cut != good.len() - 2) {
        cases.push((
            format!("fields cut at {cut}"),
            format.payload(&good[..cut]),
            bad_format.clone(),
        ));
    }
    let with = |fields: Vec<u8>| format.payload(&fields);
    let mut holder_flag_7 = rdb_uint(fence);
    holder_flag_7.extend(rdb_uint(7));
    holder_flag_7.push(0);
    cases.push((
        "holder flag 7".into(),
        with(holder_flag_7),
        bad_format.clone(),
    ));
    cases.push((
        "zero holds".into(),
        with(held_fields(fence, b"tok", deadline, 0, 0)),
        bad_format.clone(),
    ));
    cases.push((
        "holds above u32".into(),
        with(held_fields(fence, b"tok", deadline, 1 << 32, 0)),
        bad_format.clone(),
    ));
    cases.push((
        "empty token".into(),
        with(held_fields_of_token(fence, b"", deadline, 1, 0)),
        bad_format.clone(),
    ));
    cases.push((
        "a digest of 15 bytes".into(),
        with(held_fields_raw(fence, &[7; 15], deadline, 1, DIGEST_FLAG)),
        bad_format.clone(),
    ));
    cases.push((
        "a digest of 17 bytes".into(),
        with(held_fields_raw(fence, &[7; 17], deadline, 1, DIGEST_FLAG)),
        bad_format.clone(),
    ));
    cases.push((
        "held without fence".into(),
        with(held_fields(0, b"tok", deadline, 1, 0)),
        bad_format.clone(),
    ));
    cases.push((
        "fence u64::MAX".into(),
        with(tombstone_fields(u64::MAX)),
        bad_format.clone(),
    ));
    cases.push((
        "fence 2^63".into(),
        with(tombstone_fields(1 << 63)),
        bad_format.clone(),
    ));
    let mut extra_field = rdb_uint(fence);
    extra_field.extend(rdb_uint(0));
    extra_field.extend(rdb_uint(5));
    extra_field.push(0);
    cases.push((
        "extra field before EOF".into(),
        with(extra_field),
        bad_format.clone(),
    ));
    let mut string_for_fence = rdb_string(b"12");
    string_for_fence.extend(rdb_uint(0));
    string_for_fence.push(0);
    cases.push((
        "string where the fence belongs".into(),
        with(string_for_fence),
        bad_format.clone(),
    ));
    let mut token_as_uint = rdb_uint(fence);
    token_as_uint.extend(rdb_uint(1));
    token_as_uint.extend(rdb_uint(42));
    token_as_uint.extend(rdb_uint(deadline));
    token_as_uint.extend(rdb_uint(1));
    token_as_uint.extend(rdb_uint(0));
    token_as_uint.push(0);
    cases.push((
        "integer where the token belongs".into(),
        with(token_as_uint),
        bad_format.clone(),
    ));
    cases.push((
        "newer encoding version".into(),
        format.payload_with_id(
            (format.module_id & !1023) | (LOCK_ENCODING_VERSION + 1),
            &tombstone_fields(fence),
        ),
        bad_format.clone(),
    ));
    cases.push((
        "unknown module type".into(),
        format.payload_with_id(format.module_id ^ (1 << 40), &tombstone_fields(fence)),
        bad_format.clone(),
    ));
    let mut huge_token = vec![5];
    huge_token.extend(rdb_len(1 << 20));
    huge_token.extend_from_slice(b"short");
    let mut huge_token_fields = rdb_uint(fence);
    huge_token_fields.extend(rdb_uint(1));
    huge_token_fields.extend(huge_token);
    cases.push((
        "token length beyond the payload".into(),
        with(huge_token_fields),
        bad_format.clone(),
    ));
    // Payloads whose checksum or framing is wrong never reach the module.
    let checksum = Reply::error("ERR DUMP payload version or checksum are wrong");
    let real = format.payload(&good);
    let mut flipped = real.clone();
    flipped[12] ^= 0x01;
    cases.push(("flipped byte".into(), flipped, checksum.clone()));
    for cut in [0, 1, 5, real.len() / 2, real.len() - 1] {
        cases.push((
            format!("payload cut at {cut}"),
            real[..cut].to_vec(),
            checksum.clone(),
        ));
    }

    for (what, payload, expected) in &cases {
        assert_eq!(&restore(&mut c, "target", payload), expected, "{what}");
        assert_eq!(c.call(&["EXISTS", "target"]), Reply::Int(0), "{what}");
        assert_eq!(c.call(&["PING"]), Reply::status("PONG"), "{what}");
    }
    assert_eq!(c.call(&["GET", "plain"]), Reply::bulk("value"));
    assert_eq!(digest_value(&mut c, "held"), held_digest);
    assert_eq!(fence_of(&mut c, "held") as u64, fence);
    assert_eq!(c.call(&["DBSIZE"]), Reply::Int(2));
    assert_eq!(server.info_int("lock_keys"), 1);
    assert_eq!(server.info_int("lock_held"), 1);
    // The good payload still restores after all that.
    assert_eq!(restore(&mut c, "target", &real), Reply::status("OK"));
    assert_eq!(state_of(&mut c, "target"), "held");
    assert!(
        server.log().contains("lock module cannot load a lock"),
        "{}",
        server.log()
    );
    assert!(
        !server.log().contains("lock module bug"),
        "{}",
        server.log()
    );
}

#[test]
fn copy_keeps_the_fence_and_the_copy_is_independent() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "src", "owner", 60_000);
    assert_eq!(c.call(&["COPY", "src", "dst"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "dst"), "held");
    assert_eq!(fence_of(&mut c, "dst"), fence);
    assert_eq!(digest_value(&mut c, "dst"), digest_value(&mut c, "src"));
    assert_eq!(server.info_int("lock_keys"), 2);

    // Releasing the copy leaves the original held, and the reverse.
    assert_eq!(c.call(&["LOCK.RELEASE", "dst", "owner"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "dst"), "free");
    assert_eq!(state_of(&mut c, "src"), "held");
    assert_eq!(
        c.call(&["LOCK.FENCE", "src", &fence.to_string()]),
        Reply::Int(1)
    );
    let next = acquire(&mut c, "dst", "other", 60_000);
    assert!(next > fence, "{next} > {fence}");
    assert_eq!(fence_of(&mut c, "src"), fence);
    assert_eq!(c.call(&["LOCK.RELEASE", "src", "owner"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "dst"), "held");
    let src_next = acquire(&mut c, "src", "third", 60_000);
    assert!(src_next > next);

    // A copy of a free lock keeps its fence; COPY onto an existing key needs REPLACE.
    assert_eq!(c.call(&["LOCK.RELEASE", "dst", "other"]), Reply::Int(1));
    assert_eq!(c.call(&["COPY", "dst", "free-copy"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "free-copy"), "free");
    assert_eq!(fence_of(&mut c, "free-copy"), next);
    assert_eq!(c.call(&["COPY", "dst", "src"]), Reply::Int(0));
    assert_eq!(fence_of(&mut c, "src"), src_next);
    assert_eq!(c.call(&["COPY", "dst", "src", "REPLACE"]), Reply::Int(1));
    assert_eq!(state_of(&mut c, "src"), "free");
    assert_eq!(fence_of(&mut c, "src"), next);
    let after = acquire(&mut c, "src", "x", 1000);
    assert!(
        after > src_next,
        "{after} > {src_next}: the floor covers what COPY REPLACE dropped"
    );
    assert_eq!(server.info_int("lock_keys"), 3);
}

#[test]
fn copy_of_a_held_lock_expires_on_its_own() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "src", "owner", 300);
    assert_eq!(c.call(&["COPY", "src", "dst"]), Reply::Int(1));
    assert_eq!(
        c.call(&["LOCK.RENEW", "src", "owner", "60000"]),
        Reply::Int(1)
    );
    wait_expired(&server, "dst", 1);
    assert_eq!(state_of(&mut c, "src"), "held");
    assert_eq!(fence_of(&mut c, "dst"), fence);
    assert_eq!(
        c.call(&["LOCK.FENCE", "src", &fence.to_string()]),
        Reply::Int(1)
    );
}

#[test]
fn held_locks_still_expire_after_debug_reload_restore_and_rename() {
    let server = Server::start();
    let mut c = server.conn();
    for key in ["reloaded", "dumped", "renamed"] {
        acquire(&mut c, key, "owner", 500);
    }
    let Reply::Bulk(dump) = c.call(&["DUMP", "dumped"]) else {
        panic!("DUMP")
    };
    assert_eq!(restore(&mut c, "restored", &dump), Reply::status("OK"));
    assert_eq!(
        c.call(&["RENAME", "renamed", "renamed2"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    for key in ["reloaded", "dumped", "restored", "renamed2"] {
        assert_eq!(state_of(&mut c, key), "held", "{key}");
    }
    // The server itself expires all four (not just reads that treat them as free).
    wait_for("four expiries", || {
        (server.info_int("lock_expired") == 4).then_some(())
    });
    for key in ["reloaded", "dumped", "restored", "renamed2"] {
        assert_eq!(state_of(&mut c, key), "free", "{key}");
    }
    assert_eq!(server.info_int("lock_held"), 0);
    assert_eq!(c.call(&["EXISTS", "renamed"]), Reply::Int(0));
}

#[test]
fn migrated_held_lock_expires_on_the_target() {
    let source = Server::start();
    let target = Server::start();
    let mut s = source.conn();
    let fence = acquire(&mut s, "k", "owner", 400);
    let port = target.port.to_string();
    assert_eq!(
        s.call(&["MIGRATE", "127.0.0.1", &port, "k", "0", "5000"]),
        Reply::status("OK")
    );
    let mut t = target.conn();
    assert_eq!(state_of(&mut t, "k"), "held");
    wait_expired(&target, "k", 1);
    assert_eq!(fence_of(&mut t, "k"), fence);
    let next = acquire(&mut t, "k", "other", 1000);
    assert!(next > fence);
}

#[test]
fn migrate_keeps_the_fence_and_the_target_grants_larger_ones() {
    let source = Server::start();
    let target = Server::start();
    let mut s = source.conn();
    let mut t = target.conn();
    let port = target.port.to_string();
    let fence = acquire(&mut s, "held", "owner", 60_000);
    let digest = digest_value(&mut s, "held");
    assert_eq!(
        s.call(&["MIGRATE", "127.0.0.1", &port, "held", "0", "5000"]),
        Reply::status("OK")
    );
    assert_eq!(s.call(&["EXISTS", "held"]), Reply::Int(0));
    assert_eq!(digest_value(&mut t, "held"), digest);
    assert_eq!(state_of(&mut t, "held"), "held");
    assert_eq!(fence_of(&mut t, "held"), fence);
    assert_eq!(
        t.call(&["LOCK.FENCE", "held", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        t.call(&["LOCK.ACQUIRE", "held", "intruder", "1000"]),
        Reply::Nil
    );
    assert_eq!(t.call(&["LOCK.RELEASE", "held", "owner"]), Reply::Int(1));
    let next = acquire(&mut t, "held", "intruder", 60_000);
    assert!(next > fence, "{next} > {fence}");

    // A free lock whose fence is ahead of the target's clock: the target's floor learns it.
    let planted = fence_far_ahead(&mut s);
    plant_fence(&mut s, "far", planted);
    assert_eq!(
        s.call(&["MIGRATE", "127.0.0.1", &port, "far", "0", "5000", "COPY"]),
        Reply::status("OK")
    );
    assert_eq!(fence_of(&mut t, "far") as u64, planted);
    assert_eq!(state_of(&mut t, "far"), "free");
    assert_eq!(t.call(&["DEL", "far"]), Reply::Int(1));
    let after = acquire(&mut t, "far", "a", 60_000);
    assert_eq!(after as u64, planted + 1);
    let unrelated = acquire(&mut t, "unrelated", "b", 60_000);
    assert_eq!(unrelated as u64, planted + 2);

    // MIGRATE onto an existing lock key needs REPLACE, and REPLACE keeps the source's value.
    assert_eq!(
        s.call(&["MIGRATE", "127.0.0.1", &port, "far", "0", "5000"]),
        Reply::error(
            "ERR Target instance replied with error: BUSYKEY Target key name already exists."
        )
    );
    assert_eq!(
        s.call(&["MIGRATE", "127.0.0.1", &port, "far", "0", "5000", "REPLACE"]),
        Reply::status("OK")
    );
    assert_eq!(fence_of(&mut t, "far") as u64, planted);
    assert_eq!(state_of(&mut t, "far"), "free");
    let again = acquire(&mut t, "far", "c", 60_000);
    assert_eq!(
        again as u64,
        planted + 3,
        "the floor still covers the grant REPLACE dropped"
    );
}
