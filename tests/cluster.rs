//! The lock module in a Redis Cluster: every command routed by its key, locks that keep holder,
//! token, deadline and fence through slot migration, waiters answered promptly (and never granted
//! a lock the new owner does not know) when their slot moves away, and failover to replicas.

mod common;

use common::cluster::*;
use common::*;

#[test]
fn every_lock_command_is_served_by_its_keys_node_and_redirected_elsewhere() {
    let cluster = Cluster::start(3, false);
    let key = "{order:42}:lock";
    let owner = cluster.owner_of(key);
    let other = (owner + 1) % 3;
    let slot = key_slot(key);
    let moved = format!("MOVED {slot} 127.0.0.1:{}", cluster.nodes[owner].port);
    let mut elsewhere = cluster.nodes[other].conn();
    let mut c = cluster.conn_for(key);
    let fence = acquire(&mut c, key, "t", 60_000).to_string();
    for command in [
        vec!["LOCK.ACQUIRE", key, "t", "60000"],
        vec!["LOCK.RELEASE", key, "t"],
        vec!["LOCK.RENEW", key, "t", "60000"],
        vec!["LOCK.FENCE", key, &fence],
        vec!["LOCK.WAIT", key, "10"],
        vec!["LOCK.INFO", key],
        vec!["LOCK.FORCERELEASE", key],
    ] {
        assert_eq!(
            elsewhere.call(&command),
            Reply::error(&moved),
            "{command:?}"
        );
        let keys = c.call(&[&["COMMAND", "GETKEYS"][..], &command].concat());
        assert_eq!(keys, Reply::Array(vec![Reply::bulk(key)]), "{command:?}");
    }
    assert_eq!(c.call(&["LOCK.FENCE", key, &fence]), Reply::Int(1));
    // A transaction over two slots is refused as a whole.
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.RENEW", key, "t", "60000"]),
        Reply::status("QUEUED")
    );
    let other_key = "{invoice:7}:lock";
    assert_ne!(key_slot(other_key), slot);
    let reply = c.call(&["LOCK.ACQUIRE", other_key, "t", "60000"]);
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("CROSSSLOT") || e.starts_with("MOVED")),
        "{reply:?}"
    );
    let exec = c.call(&["EXEC"]);
    assert!(
        matches!(&exec, Reply::Error(e) if e.starts_with("EXECABORT")),
        "{exec:?}"
    );
    // The lock and its data share a slot with a hash tag: one transaction serves both.
    assert_eq!(key_slot("{order:42}:data"), slot);
    assert_eq!(c.call(&["WATCH", key]), Reply::status("OK"));
    assert_eq!(c.call(&["LOCK.FENCE", key, &fence]), Reply::Int(1));
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["SET", "{order:42}:data", "shipped"]),
        Reply::status("QUEUED")
    );
    assert_eq!(c.call(&["EXEC"]), Reply::Array(vec![Reply::status("OK")]));
}

/// A connection to `node` that sent `command` and is now blocked in it.
fn blocked_in(cluster: &Cluster, node: usize, command: &[&str]) -> Conn {
    let server = &cluster.nodes[node];
    let before = blocked(server);
    let mut conn = server.conn();
    conn.send(command);
    wait_blocked(server, before + 1);
    conn
}

const TRYAGAIN: &str =
    "TRYAGAIN the lock's key was deleted or moved to another node while the client waited; send \
     the command again";

/// A slot moves away while clients wait on a lock in it: MIGRATE deletes the key on the old
/// node, and every waiter there is told at once to send its command again (Redis then routes it
/// to the new node), never granted a lock the new node would not know; the old node's queue is
/// left empty. The lock arrives intact and the retried commands are served there.
#[test]
fn waiters_of_a_migrating_slot_are_told_to_retry_at_once() {
    let cluster = Cluster::start(3, false);
    let key = "{migrating}:lock";
    let slot = key_slot(key);
    let from = cluster.owner_of(key);
    let to = (from + 1) % 3;
    let mut holder = cluster.nodes[from].conn();
    let fence = acquire(&mut holder, key, "holder", 60_000);
    let mut acquirer = blocked_in(
        &cluster,
        from,
        &["LOCK.ACQUIRE", key, "w", "60000", "WAIT", "0"],
    );
    let mut watcher = blocked_in(&cluster, from, &["LOCK.WAIT", key, "0"]);
    cluster.begin_migration(slot, from, to);
    let moved = std::time::Instant::now();
    cluster.move_keys(slot, from, to);
    assert_eq!(acquirer.read(), Reply::error(TRYAGAIN));
    assert_eq!(watcher.read(), Reply::error(TRYAGAIN));
    let answered = moved.elapsed();
    eprintln!("waiters answered {answered:?} after MIGRATE began");
    assert!(
        answered < std::time::Duration::from_millis(500),
        "{answered:?}"
    );
    assert_eq!(cluster.nodes[from].info_int("lock_waiters"), 0);
    assert_eq!(cluster.nodes[from].info_int("lock_keys"), 0);
    cluster.end_migration(slot, to);
    // The retries reach the new node, where the lock is, still held.
    let mut target = cluster.nodes[to].conn();
    assert_eq!(fence_of(&mut target, key), fence);
    assert_eq!(
        target.call(&["LOCK.ACQUIRE", key, "w", "60000"]),
        Reply::Nil
    );
    assert_eq!(target.call(&["LOCK.RELEASE", key, "holder"]), Reply::Int(1));
    assert!(acquire(&mut target, key, "w", 60_000) > fence);
}
