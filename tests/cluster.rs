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

/// A key served by node `node`, named from `prefix`.
fn key_on(cluster: &Cluster, node: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| cluster.owner_of(k) == node)
        .expect("a key")
}

/// Held, free and session locks of one slot move to another node with MIGRATE: holder, token,
/// deadline and fence arrive intact, the new node's fence floor rises (its next grant of any key
/// exceeds the fences it received), the lease still ends on time there with its `lock.expired`
/// event, and a session lock goes on as a plain lease (its connection was to the old node).
#[test]
fn slot_migration_carries_held_free_and_session_locks_intact() {
    let config = cluster_config().with("notify-keyspace-events", "Kd");
    let cluster = Cluster::start_with(3, false, config);
    let (held, free, session) = ("{moving}:held", "{moving}:free", "{moving}:session");
    let slot = key_slot(held);
    let from = cluster.owner_of(held);
    let to = (from + 1) % 3;
    let mut c = cluster.nodes[from].conn();
    // A fence far ahead of the clock (as a busy node's counter may be): only the floor can
    // carry the target's next grants above it.
    let format = LockDumpFormat::learn(&mut Server::start().conn());
    let ahead = (now_ms() + 30 * 86_400_000) << 11;
    assert_eq!(
        restore(&mut c, free, &format.payload(&tombstone_fields(ahead))),
        Reply::status("OK")
    );
    let held_fence = acquire(&mut c, held, "holder", 1_500);
    let mut owner = cluster.nodes[from].conn();
    owner.call(&["CLIENT", "SETNAME", "mover"]);
    let owner_id = owner.call(&["CLIENT", "ID"]).int();
    let session_fence = owner
        .call(&[
            "LOCK.ACQUIRE",
            session,
            "s",
            "60000",
            "SESSION",
            "LABEL",
            "pod-3",
        ])
        .int();
    let mut events = cluster.nodes[to].conn();
    let channel = format!("__keyspace@0__:{held}");
    assert_eq!(
        events.call(&["SUBSCRIBE", &channel]).items()[0],
        Reply::bulk("subscribe")
    );
    cluster.migrate_slot(slot, from, to);
    let mut t = cluster.nodes[to].conn();
    assert_eq!(state_of(&mut t, held), "held");
    assert_eq!(fence_of(&mut t, held), held_fence);
    let ttl = lock_field(&mut t, held, "ttl").int();
    assert!((1..=1_500).contains(&ttl), "ttl {ttl}");
    assert_eq!(
        t.call(&["LOCK.RENEW", held, "other", "1500"]),
        Reply::Int(0)
    );
    assert_eq!(
        t.call(&["LOCK.FENCE", held, &held_fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(state_of(&mut t, free), "free");
    assert_eq!(fence_of(&mut t, free), ahead as i64);
    assert_eq!(fence_of(&mut t, session), session_fence);
    assert_eq!(lock_field(&mut t, session, "session"), Reply::Int(1));
    // Who was granted it travels with it; its connection is on the old node, not here.
    let who = t.call(&["LOCK.WHO", session]);
    let holder = fields_map(&fields_map(&who)["holders"].items()[0]);
    let field = |name: &str| match &holder[name] {
        Reply::Int(n) => n.to_string(),
        other => other.text(),
    };
    assert_eq!(field("client_id"), owner_id.to_string());
    assert_eq!(field("client_name"), "mover");
    assert_eq!(field("label"), "pod-3");
    assert_eq!(field("connected"), "0");
    assert!(field("held_ms").parse::<i64>().unwrap() >= 0);
    // The target's floor: a key it served all along gets a fence above the one that arrived.
    let resident = key_on(&cluster, to, "resident");
    assert!(acquire(&mut t, &resident, "t", 60_000) > ahead as i64);
    // The lease ends on time on the new node, with its event there.
    assert_eq!(next_event(&mut events), "lock.expired");
    assert_eq!(state_of(&mut t, held), "free");
    assert_eq!(cluster.nodes[to].info_int("lock_expired"), 1);
    // The session's connection closing on the old node leaves the lock a plain lease.
    drop(owner);
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
    assert_eq!(state_of(&mut t, session), "held");
    assert_eq!(t.call(&["LOCK.RELEASE", session, "s"]), Reply::Int(1));
}

/// Shared holders and a semaphore's permits move with their slot: every holder with its token,
/// fence and lease, the semaphore with its limit; a shared waiter is told to retry, and on the
/// new node the queue and the modes work as before.
#[test]
fn slot_migration_carries_shared_holders_and_semaphores() {
    let cluster = Cluster::start(3, false);
    let (rw, sem) = ("{sharing}:rw", "{sharing}:sem");
    let slot = key_slot(rw);
    let from = cluster.owner_of(rw);
    let to = (from + 1) % 3;
    let mut c = cluster.nodes[from].conn();
    let readers: Vec<i64> = ["r1", "r2"]
        .iter()
        .map(|t| c.call(&["LOCK.ACQUIRE", rw, t, "60000", "SHARED"]).int())
        .collect();
    let permit = c
        .call(&["LOCK.ACQUIRE", sem, "p1", "60000", "LIMIT", "2"])
        .int();
    let mut waiter = blocked_in(
        &cluster,
        from,
        &["LOCK.ACQUIRE", rw, "w", "60000", "WAIT", "20000"],
    );
    cluster.migrate_slot(slot, from, to);
    assert_eq!(waiter.read(), Reply::error(TRYAGAIN));
    let mut t = cluster.nodes[to].conn();
    assert_eq!(lock_field(&mut t, rw, "holders"), Reply::Int(2));
    for fence in &readers {
        assert_eq!(
            t.call(&["LOCK.FENCE", rw, &fence.to_string()]),
            Reply::Int(1)
        );
    }
    assert_eq!(lock_field(&mut t, sem, "limit"), Reply::Int(2));
    assert_eq!(
        t.call(&["LOCK.FENCE", sem, &permit.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(t.call(&["LOCK.ACQUIRE", rw, "w", "60000"]), Reply::Nil);
    for token in ["r1", "r2"] {
        assert_eq!(t.call(&["LOCK.RELEASE", rw, token]), Reply::Int(1));
    }
    assert!(t.call(&["LOCK.ACQUIRE", rw, "w", "60000"]).int() > readers[1]);
    assert!(
        t.call(&["LOCK.ACQUIRE", sem, "p2", "60000", "LIMIT", "2"])
            .int()
            > permit
    );
    assert_eq!(
        t.call(&["LOCK.ACQUIRE", sem, "p3", "60000", "LIMIT", "2"]),
        Reply::Nil
    );
}

/// Node `node`'s role: "master" or "slave".
fn role(cluster: &Cluster, node: usize) -> String {
    cluster.nodes[node]
        .info_field("replication", "role")
        .expect("role")
}

/// Failover to a replica, graceful (`CLUSTER FAILOVER`) or by `kill -9` of the primary: the old
/// primary's waiters get an error, never a grant; locks the replica acknowledged (WAIT 1) survive
/// with holder and fence; the new primary's grants exceed every fence it received.
fn failover(graceful: bool) {
    let cluster = Cluster::start(3, true);
    let key = "{failover}:lock";
    let primary = cluster.owner_of(key);
    let replica = cluster.replica_of(primary);
    let mut c = cluster.nodes[primary].conn();
    let fence = acquire(&mut c, key, "holder", 60_000);
    assert_eq!(c.call(&["WAIT", "1", "5000"]), Reply::Int(1));
    let mut waiter = blocked_in(
        &cluster,
        primary,
        &["LOCK.ACQUIRE", key, "w", "60000", "WAIT", "0"],
    );
    let mut cluster = cluster;
    if graceful {
        let reply = cluster.nodes[replica].conn().call(&["CLUSTER", "FAILOVER"]);
        assert_eq!(reply, Reply::status("OK"));
        let answer = waiter.read();
        // Valkey 9 redirects clients blocked on a demoted primary to the new one; Redis and
        // Valkey 8 end their wait with UNBLOCKED. Either way, an error and never a grant.
        let identity = cluster.nodes[primary].identity();
        if identity.product == Product::Valkey && identity.version.0 >= 9 {
            let moved = format!(
                "MOVED {} 127.0.0.1:{}",
                key_slot(key),
                cluster.nodes[replica].port
            );
            assert_eq!(answer, Reply::Error(moved));
        } else {
            assert!(
                matches!(&answer, Reply::Error(e) if e.starts_with("UNBLOCKED")),
                "{answer:?}"
            );
        }
    } else {
        cluster.nodes[primary].kill();
        assert!(waiter.try_read().is_err(), "the waiter's connection ends");
    }
    wait_for("the replica to take over", || {
        (role(&cluster, replica) == "master").then_some(())
    });
    cluster.wait_ok();
    assert_eq!(cluster.owner_of(key), replica);
    let mut r = cluster.nodes[replica].conn();
    assert_eq!(state_of(&mut r, key), "held");
    assert_eq!(fence_of(&mut r, key), fence);
    assert_eq!(
        r.call(&["LOCK.FENCE", key, &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(r.call(&["LOCK.RELEASE", key, "holder"]), Reply::Int(1));
    assert!(acquire(&mut r, key, "next", 60_000) > fence);
    let resident = key_on(&cluster, replica, "resident");
    assert!(acquire(&mut r, &resident, "t", 60_000) > fence);
    if graceful {
        assert_eq!(role(&cluster, primary), "slave");
        assert_eq!(cluster.nodes[primary].info_int("lock_waiters"), 0);
    }
}

#[test]
fn a_graceful_failover_keeps_acknowledged_locks_and_never_grants_the_old_waiters() {
    failover(true);
}

#[test]
fn a_primary_killed_hands_acknowledged_locks_to_its_replica() {
    failover(false);
}

/// The server has atomic slot migration (`CLUSTER MIGRATESLOTS`, Valkey 9), and the module
/// declared it handles it; elsewhere the command does not exist.
fn has_atomic_slot_migration(cluster: &Cluster) -> bool {
    let identity = cluster.nodes[0].identity();
    let has_it = identity.atomic_slot_migration();
    let info = cluster.nodes[0]
        .conn()
        .call(&["COMMAND", "INFO", "cluster|migrateslots"]);
    assert_eq!(
        info.items()[0] != Reply::Nil,
        has_it,
        "{identity:?}: {info:?}"
    );
    if has_it {
        assert!(cluster.nodes[0]
            .log()
            .contains("atomic slot migration: yes"));
    }
    has_it
}

/// Valkey 9's atomic slot migration moves a slot with a held lock, a free lock, a session lock
/// and a lease ending during the move, while a client waits: the locks arrive with holder and
/// fence, the waiter is told to retry at once and is served on the new node, and the lease
/// that ran out during the move was expired by the source only (the new node applies the
/// source's expiry and never expires a lock of a slot it is still importing). The source's
/// snapshot is slowed (`rdb-key-save-delay`) so the import outlasts that lease.
#[test]
fn atomic_slot_migration_carries_locks_and_leaves_their_leases_to_the_source() {
    let cluster = Cluster::start(3, false);
    if !has_atomic_slot_migration(&cluster) {
        return;
    }
    let tag = key_on(&cluster, 0, "asm");
    let key = |name: &str| format!("{{{tag}}}:{name}");
    let slot = key_slot(&key("held")).to_string();
    let mut c = cluster.nodes[0].conn();
    let held = acquire(&mut c, &key("held"), "holder", 60_000);
    let free = acquire(&mut c, &key("free"), "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", &key("free"), "t"]), Reply::Int(1));
    let mut owner = cluster.nodes[0].conn();
    assert!(
        owner
            .call(&["LOCK.ACQUIRE", &key("session"), "s", "60000", "SESSION"])
            .int()
            > 0
    );
    let mut waiter = blocked_in(
        &cluster,
        0,
        &["LOCK.ACQUIRE", &key("held"), "w", "60000", "WAIT", "0"],
    );
    let expired_before = [
        cluster.nodes[0].info_int("lock_expired"),
        cluster.nodes[1].info_int("lock_expired"),
    ];
    // 200 ms per key in the source's snapshot: the import lasts about a second.
    assert_eq!(
        c.call(&["CONFIG", "SET", "rdb-key-save-delay", "200000"]),
        Reply::status("OK")
    );
    let short = acquire(&mut c, &key("short"), "t", 300);
    cluster.migrate_slot_atomically(key_slot(&key("held")), 0, 1);
    assert_eq!(cluster.owner_of(&key("held")), 1);

    // The waiter was told to retry: by the module when the key left (TRYAGAIN), or by Valkey,
    // which redirects clients blocked on a slot it no longer serves, if its cron came first
    // (seen under valgrind). Retried, it queues on the new node.
    let moved = format!(
        "MOVED {} 127.0.0.1:{}",
        key_slot(&key("held")),
        cluster.nodes[1].port
    );
    let answer = waiter.read();
    assert!(
        answer == Reply::Error(TRYAGAIN.into()) || answer == Reply::Error(moved),
        "{answer:?}"
    );
    let mut t = cluster.nodes[1].conn();
    let mut retried = blocked_in(
        &cluster,
        1,
        &["LOCK.ACQUIRE", &key("held"), "w", "60000", "WAIT", "0"],
    );
    assert_eq!(state_of(&mut t, &key("held")), "held");
    assert_eq!(fence_of(&mut t, &key("held")), held);
    assert_eq!(
        t.call(&["LOCK.FENCE", &key("held"), &held.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        t.call(&["LOCK.RELEASE", &key("held"), "holder"]),
        Reply::Int(1)
    );
    assert!(retried.read().int() > held);
    assert_eq!(state_of(&mut t, &key("free")), "free");
    assert_eq!(fence_of(&mut t, &key("free")), free);
    assert_eq!(
        lock_field(&mut t, &key("session"), "session"),
        Reply::Int(1)
    );
    // The session's connection closing on the old node leaves the lock a plain lease.
    drop(owner);
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
    assert_eq!(state_of(&mut t, &key("session")), "held");
    assert_eq!(
        t.call(&["LOCK.RELEASE", &key("session"), "s"]),
        Reply::Int(1)
    );
    // The short lease ended once, on the source; the new node applied that and nothing else.
    assert_eq!(state_of(&mut t, &key("short")), "free");
    assert_eq!(fence_of(&mut t, &key("short")), short);
    assert_eq!(
        [
            cluster.nodes[0].info_int("lock_expired"),
            cluster.nodes[1].info_int("lock_expired"),
        ],
        [expired_before[0] + 1, expired_before[1] + 1]
    );
    // The new node's grants exceed every fence it received, on any key.
    assert!(acquire(&mut t, &key("free"), "again", 60_000) > short.max(held));
    let resident = key_on(&cluster, 1, "resident");
    assert!(acquire(&mut t, &resident, "t", 60_000) > short.max(held));
    // The source kept nothing of the slot, and no waiter.
    assert_eq!(
        c.call(&["CLUSTER", "COUNTKEYSINSLOT", &slot]),
        Reply::Int(0)
    );
    assert_eq!(cluster.nodes[0].info_int("lock_waiters"), 0);
}

/// An atomic slot migration cancelled during its snapshot changes nothing on the source, and
/// the new node keeps nothing of it.
#[test]
fn a_cancelled_atomic_slot_migration_leaves_the_locks_on_the_source() {
    let cluster = Cluster::start(3, false);
    if !has_atomic_slot_migration(&cluster) {
        return;
    }
    let tag = key_on(&cluster, 0, "cancel");
    let key = |name: &str| format!("{{{tag}}}:{name}");
    let slot = key_slot(&key("a")).to_string();
    let mut c = cluster.nodes[0].conn();
    let fences: Vec<i64> = ["a", "b", "c"]
        .iter()
        .map(|name| acquire(&mut c, &key(name), "holder", 60_000))
        .collect();
    // A second per key: the import is still under way when it is cancelled.
    assert_eq!(
        c.call(&["CONFIG", "SET", "rdb-key-save-delay", "1000000"]),
        Reply::status("OK")
    );
    cluster.start_atomic_migration(key_slot(&key("a")), 0, 1);
    assert_eq!(
        c.call(&["CLUSTER", "CANCELSLOTMIGRATIONS"]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&["CONFIG", "SET", "rdb-key-save-delay", "0"]),
        Reply::status("OK")
    );
    wait_for("the new node to hold nothing of the slot", || {
        (cluster.nodes[1].info_int("lock_keys") == 0
            && cluster.nodes[1]
                .conn()
                .call(&["CLUSTER", "COUNTKEYSINSLOT", &slot])
                == Reply::Int(0))
        .then_some(())
    });
    assert_eq!(cluster.owner_of(&key("a")), 0);
    for (name, fence) in ["a", "b", "c"].iter().zip(fences) {
        assert_eq!(fence_of(&mut c, &key(name)), fence);
        assert_eq!(
            c.call(&["LOCK.RELEASE", &key(name), "holder"]),
            Reply::Int(1)
        );
    }
}

/// A key whose slot is `slot`, named from `prefix`.
fn key_in_slot(slot: u16, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|k| key_slot(k) == slot)
        .expect("a key")
}

/// The lowest slot node `node` serves: `redis-cli --cluster reshard` moves a node's slots from
/// its lowest up.
fn first_slot_of(cluster: &Cluster, node: usize) -> u16 {
    (0..SLOTS)
        .find(|s| cluster.owner_of_slot(*s) == node)
        .expect("a slot")
}

/// `redis-cli --cluster reshard`, the operator's tool, moves a slot with a held lock and one
/// with waiters: the lock arrives intact, the waiters are told to retry.
#[test]
fn redis_cli_reshard_moves_locks_intact() {
    let redis_cli = std::env::var_os("REDIS_CLI").unwrap_or_else(|| "redis-cli".into());
    let cluster = Cluster::start(3, false);
    let (from, to) = (0, 1);
    let slot = first_slot_of(&cluster, from);
    let held = key_in_slot(slot, "reshard");
    let mut c = cluster.nodes[from].conn();
    let fence = acquire(&mut c, &held, "holder", 60_000);
    let mut waiter = blocked_in(
        &cluster,
        from,
        &["LOCK.ACQUIRE", &held, "w", "60000", "WAIT", "0"],
    );
    let output = std::process::Command::new(&redis_cli)
        .args([
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{}", cluster.nodes[from].port),
        ])
        .args([
            "--cluster-from",
            &cluster.ids[from],
            "--cluster-to",
            &cluster.ids[to],
        ])
        .args(["--cluster-slots", "1", "--cluster-yes"])
        .output()
        .expect("run redis-cli (install redis-tools or set REDIS_CLI)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(waiter.read(), Reply::error(TRYAGAIN));
    cluster.wait_ok();
    assert_eq!(cluster.owner_of(&held), to);
    let mut t = cluster.nodes[to].conn();
    assert_eq!(fence_of(&mut t, &held), fence);
    assert_eq!(t.call(&["LOCK.RELEASE", &held, "holder"]), Reply::Int(1));
}

/// Stops what `.ci/cluster start` started, however the test ends.
struct ScriptCluster {
    ports: String,
    data: std::path::PathBuf,
}

impl ScriptCluster {
    fn run(&self, args: &[&str]) -> std::process::Output {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/cluster");
        std::process::Command::new(script)
            .args(args)
            .env("PORTS", &self.ports)
            .env("DATA", &self.data)
            .env("REDIS_SERVER", redis_server_binary())
            .output()
            .expect("run .ci/cluster")
    }
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        self.run(&["stop"]);
    }
}

/// Six free ports whose cluster bus ports (+10000) are free too.
fn cluster_ports() -> Vec<u16> {
    let mut ports = Vec::new();
    while ports.len() < 6 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if port < 55_000
            && !ports.contains(&port)
            && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            ports.push(port);
        }
    }
    ports
}

/// `make cluster`'s script starts six nodes with the module, three primaries and three replicas,
/// serving every slot; `make cluster-stop`'s stops every one of them.
#[test]
fn the_make_cluster_script_starts_and_stops_a_working_cluster() {
    // The ports are free when picked, but any outgoing connection of the machine may take one
    // before the script binds it: a start that fails is stopped and tried again on new ports.
    let mut attempts = 0;
    let (data, ports, cluster) = loop {
        attempts += 1;
        let data = tempfile::tempdir().expect("temp dir");
        let ports = cluster_ports();
        let cluster = ScriptCluster {
            ports: ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            data: data.path().to_path_buf(),
        };
        let started = cluster.run(&["start", module_path().to_str().expect("path")]);
        if started.status.success() {
            break (data, ports, cluster);
        }
        assert!(
            attempts < 3,
            "{}{}",
            String::from_utf8_lossy(&started.stdout),
            String::from_utf8_lossy(&started.stderr)
        );
        eprintln!(
            "cluster script: start failed, trying new ports: {}",
            String::from_utf8_lossy(&started.stdout)
        );
    };
    let mut c = Conn::connect(ports[0], PATIENCE).expect("connect");
    let info = c.call(&["CLUSTER", "INFO"]).text();
    assert!(info.contains("cluster_state:ok"), "{info}");
    assert!(info.contains("cluster_size:3"), "{info}");
    let key = "{order:42}:lock";
    let slots = c.call(&["CLUSTER", "SLOTS"]);
    let port = slots
        .items()
        .iter()
        .find_map(|r| {
            let r = r.items();
            let slot = i64::from(key_slot(key));
            (r[0].int() <= slot && slot <= r[1].int()).then(|| r[2].items()[1].int())
        })
        .expect("an owner");
    let mut owner = Conn::connect(port as u16, PATIENCE).expect("connect");
    assert!(acquire(&mut owner, key, "t", 60_000) > 0);
    let pids: Vec<String> = ports
        .iter()
        .map(|p| {
            std::fs::read_to_string(data.path().join(p.to_string()).join("redis.pid"))
                .expect("pid file")
                .trim()
                .to_string()
        })
        .collect();
    let stopped = cluster.run(&["stop"]);
    assert!(String::from_utf8_lossy(&stopped.stdout).contains("stopped 6 node(s)"));
    for pid in pids {
        // Gone, or a zombie waiting for whoever adopted the daemon to reap it.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next());
        assert!(
            matches!(state, None | Some("Z") | Some("X")),
            "node {pid} still runs: {stat}"
        );
    }
}
