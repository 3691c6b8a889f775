//! The fourth independent review (issue 34: a command's context flags read once and kept for
//! the command's own context). The cache is right only if nothing a command does changes the
//! flags it reads (MASTER, AOF, RDB, LOADING, LUA, MULTI, ...). The one way a LOCK.* command
//! runs another command is LOCK.GUARD (RM_Call): these tests pin that it cannot run one that
//! changes the role or the persistence (passing on the change as reviewed; no other test runs
//! these through LOCK.GUARD). CLUSTER FAILOVER and CLUSTER REPLICATE are allowed in script mode
//! (and so through LOCK.GUARD), but a write command never runs on a cluster replica and a
//! primary holding a lock key may not become a replica.

mod common;

use common::*;

fn guard(c: &mut Conn, lock: &str, fence: i64, command: &[&str]) -> Reply {
    let fence = fence.to_string();
    let mut call = vec!["LOCK.GUARD", lock, &fence];
    call.extend_from_slice(command);
    c.call(&call)
}

#[test]
fn review4_guard_cannot_change_the_role_or_the_persistence_mid_command() {
    let server = Server::start();
    let other = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "lk", "t", 60_000);
    let port = other.port.to_string();
    let save = c.call(&["CONFIG", "GET", "save"]);
    let aof = c.call(&["CONFIG", "GET", "appendonly"]);
    let scripts = "ERR LOCK.GUARD cannot run this command: scripts may not run it \
                   (transactions, scripts, subscriptions, ...)";
    let script_mode = "ERR command 'config|set' is not allowed on script mode";
    let cases: &[(&[&str], &str)] = &[
        (&["REPLICAOF", "127.0.0.1", &port], scripts),
        (&["SLAVEOF", "127.0.0.1", &port], scripts),
        (&["FAILOVER"], scripts),
        // CONFIG (a container) gets past the module's own check; RM_Call's script mode refuses.
        (&["CONFIG", "SET", "appendonly", "yes"], script_mode),
        (&["CONFIG", "SET", "save", "1 1"], script_mode),
    ];
    for (command, error) in cases {
        assert_eq!(
            guard(&mut c, "lk", fence, command),
            Reply::Error(error.to_string()),
            "{command:?}"
        );
    }
    assert_eq!(
        server.info_field("replication", "role").as_deref(),
        Some("master")
    );
    assert_eq!(
        server.info_field("persistence", "aof_enabled").as_deref(),
        Some("0")
    );
    assert_eq!(c.call(&["CONFIG", "GET", "save"]), save);
    assert_eq!(c.call(&["CONFIG", "GET", "appendonly"]), aof);
    assert_eq!(state_of(&mut c, "lk"), "held");
}
