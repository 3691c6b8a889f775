//! What the module writes when the server forks a child (a disk-based full sync, BGSAVE,
//! BGREWRITEAOF): only its own `LOCK.FLOOR`, never the command that caused the fork. Every file
//! the server writes must load again, and a replica must not be told to fork.

mod common;
use common::*;

use std::path::Path;

/// Commands that fork or that only a connection may run: none may sit in an AOF file.
const NEVER_IN_THE_AOF: [&[u8]; 5] = [b"PSYNC", b"BGSAVE", b"BGREWRITEAOF", b"\r\nSYNC", b"SAVE"];

fn aof_primary() -> Server {
    Server::start_with(
        Config::default()
            .with("appendonly", "yes")
            .with("appendfsync", "always")
            .with("repl-diskless-sync", "no"),
    )
}

fn persistence(server: &Server, field: &str) -> i64 {
    server
        .info_field("persistence", field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO persistence {field}"))
}

fn total_forks(server: &Server) -> i64 {
    server
        .info_field("stats", "total_forks")
        .and_then(|v| v.parse().ok())
        .expect("INFO stats total_forks")
}

/// Waits until no child of `server` runs or is scheduled.
fn wait_no_child(server: &Server) {
    wait_for("no child process", || {
        (persistence(server, "rdb_bgsave_in_progress") == 0
            && persistence(server, "aof_rewrite_in_progress") == 0
            && persistence(server, "aof_rewrite_scheduled") == 0)
            .then_some(())
    });
}

/// Every byte of the server's AOF files.
fn aof_bytes(dir: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let aof_dir = dir.join("appendonlydir");
    for entry in std::fs::read_dir(&aof_dir).expect("appendonlydir") {
        let path = entry.expect("dir entry").path();
        bytes.extend(std::fs::read(&path).expect("AOF file"));
    }
    bytes
}

fn assert_aof_has_no_forking_command(server: &Server) {
    let bytes = aof_bytes(server.dir());
    for name in NEVER_IN_THE_AOF {
        let found = bytes
            .windows(name.len())
            .any(|w| w.eq_ignore_ascii_case(name));
        assert!(
            !found,
            "{} in the AOF:\n{}",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(&bytes)
        );
    }
}

/// Kills the primary with SIGKILL and starts it on its own files: it must come back with the
/// lock it had and go on with larger fences.
fn restarts_from_its_aof(server: &mut Server, fence: i64) {
    // The floor's deferred write has had its turn once the AOF holds it.
    wait_for("LOCK.FLOOR in the AOF", || {
        let bytes = aof_bytes(server.dir());
        bytes.windows(10).any(|w| w == b"LOCK.FLOOR").then_some(())
    });
    server.kill();
    server.restart();
    assert_aof_has_no_forking_command(server);
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k"), fence);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    assert!(acquire(&mut c, "k", "u", 60_000) > fence);
}

#[test]
fn primary_restarts_from_its_aof_after_a_disk_based_full_sync() {
    let mut primary = aof_primary();
    let mut c = primary.conn();
    let fence = acquire(&mut c, "k", "t", 600_000);
    let replica = Server::start();
    replica.replicate_from(&primary);
    wait_replica_caught_up(&primary, &replica);
    assert!(total_forks(&primary) >= 1, "the full sync forked");
    wait_no_child(&primary);
    restarts_from_its_aof(&mut primary, fence);
}

/// A client's BGSAVE or BGREWRITEAOF on the primary forks there, and only there.
fn fork_by_client_stays_on_the_primary(command: &str) {
    let mut primary = aof_primary();
    let mut c = primary.conn();
    let fence = acquire(&mut c, "k", "t", 600_000);
    let replica = Server::start();
    replica.replicate_from(&primary);
    wait_replica_caught_up(&primary, &replica);
    wait_no_child(&primary);
    let replica_forks = total_forks(&replica);
    let forks = total_forks(&primary);
    let reply = c.call(&[command]);
    assert!(matches!(reply, Reply::Status(_)), "{command}: {reply:?}");
    wait_no_child(&primary);
    assert_eq!(total_forks(&primary), forks + 1);
    // What the fork wrote reached the replica (LOCK.FLOOR), and nothing made it fork.
    wait_for("LOCK.FLOOR in the AOF", || {
        let bytes = aof_bytes(primary.dir());
        bytes.windows(10).any(|w| w == b"LOCK.FLOOR").then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    wait_no_child(&replica);
    assert_eq!(total_forks(&replica), replica_forks, "the replica forked");
    restarts_from_its_aof(&mut primary, fence);
}

#[test]
fn a_bgsave_is_neither_replicated_nor_written_to_the_aof() {
    fork_by_client_stays_on_the_primary("BGSAVE");
}

#[test]
fn a_bgrewriteaof_is_neither_replicated_nor_written_to_the_aof() {
    fork_by_client_stays_on_the_primary("BGREWRITEAOF");
}

/// The replication stream after a fork carries the floor and nothing of the command that forked.
#[test]
fn the_stream_after_a_fork_carries_only_the_floor() {
    let primary = Server::start();
    let mut c = primary.conn();
    let fence = acquire(&mut c, "k", "t", 600_000);
    let mut tap = ReplicationTap::attach(&primary);
    wait_no_child(&primary);
    assert_eq!(
        c.call(&["BGSAVE"]),
        Reply::status("Background saving started")
    );
    wait_no_child(&primary);
    c.call(&["SET", "after", "x"]);
    let commands = tap.commands_until("SET");
    let names: Vec<&str> = commands.iter().map(|c| c[0].as_str()).collect();
    assert!(
        names.iter().all(|n| matches!(*n, "LOCK.FLOOR" | "SET")),
        "{commands:?}"
    );
    let floors: Vec<i64> = commands
        .iter()
        .filter(|c| c[0] == "LOCK.FLOOR")
        .map(|c| c[1].parse().expect("floor"))
        .collect();
    assert!(floors.iter().all(|&f| f >= fence), "{floors:?} {fence}");
}
