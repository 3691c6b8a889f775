//! A replica with `repl-diskless-load swapdb` loads a full sync in the background: it goes on
//! serving its old data (LOCK.INFO, LOCK.FENCE) while the primary's loads aside, then swaps the
//! two at once; an aborted transfer leaves the old data. The module declares that it handles
//! this, so the server does not fall back to a disk load answering LOADING. Afterwards the
//! replica has exactly the data it kept (the primary's, or its own old one), with the lease index
//! and the waiters that data calls for, and once promoted it expires leases by that index and
//! grants fences above everything it loaded.

mod common;
use common::*;

/// Filler keys that make the full sync long enough to look at the replica during it: each
/// crosses `loading-process-events-interval-bytes` (1024 here), so the loading replica answers
/// clients between any two of them.
const FILLER_KEYS: &str = "400";
const FILLER_BYTES: &str = "2000";

/// A primary whose RDB is not compressed (the filler stays as large as it is).
fn primary() -> Server {
    Server::start_with(Config::default().with("rdbcompression", "no"))
}

/// A replica of `primary` that loads full syncs in the background, answering clients often.
fn swapdb_replica(primary: &Server) -> Server {
    let replica = Server::start_with(
        Config::default()
            .with("repl-diskless-load", "swapdb")
            .with("loading-process-events-interval-bytes", "1024"),
    );
    replica.replicate_from(primary);
    replica
}

/// `INFO persistence` field `field` of `server`.
fn persistence(server: &Server, field: &str) -> String {
    server
        .info_field("persistence", field)
        .unwrap_or_else(|| panic!("no INFO persistence field {field}"))
}

/// Runs `changes` on the primary after cutting its replica off and making the backlog too small
/// for it, all in one transaction: the replica then needs a full sync, with the replication id it
/// already has, which a swapdb replica loads in the background. Nothing of `changes` reaches the
/// replica before that sync.
fn force_full_sync_with(primary: &Server, changes: &[Vec<Vec<u8>>]) {
    let mut p = primary.conn();
    assert_eq!(p.call(&["MULTI"]), Reply::status("OK"));
    let pad = "x".repeat(16_384);
    let mut commands: Vec<Vec<Vec<u8>>> = vec![
        args(&["CLIENT", "KILL", "TYPE", "replica"]),
        args(&["CONFIG", "SET", "repl-backlog-size", "16384"]),
    ];
    for i in 0..10 {
        commands.push(args(&["SET", &format!("pad:{i}"), &pad]));
    }
    commands.extend_from_slice(changes);
    for command in &commands {
        assert_eq!(p.call(command), Reply::status("QUEUED"), "{command:?}");
    }
    let done = p.call(&["EXEC"]);
    assert_eq!(done.items()[0], Reply::Int(1), "the replica was cut off");
    for (reply, command) in done.items().iter().zip(&commands) {
        assert!(!matches!(reply, Reply::Error(_)), "{command:?}: {reply:?}");
    }
}

fn args(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// Waits until `replica` loads a full sync in the background (not LOADING: it serves clients).
fn wait_async_loading(replica: &Server) {
    wait_for(
        "the replica to load the full sync in the background",
        || (persistence(replica, "async_loading") == "1").then_some(()),
    );
    assert_eq!(persistence(replica, "loading"), "0");
}

/// The processes whose parent is `pid` (Linux: read from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: the name may hold spaces, so read after its `)`.
            let after_name = &stat[stat.rfind(')')? + 1..];
            let parent: u32 = after_name.split_whitespace().nth(1)?.parse().ok()?;
            (parent == pid).then_some(child)
        })
        .collect()
}

/// `lock_keys` of `server` once it reached `count`: values the background load made or dropped
/// are freed on a background thread.
fn wait_lock_keys(server: &Server, count: i64) {
    wait_for(&format!("lock_keys {count}"), || {
        (server.info_int("lock_keys") == count).then_some(())
    });
}

#[test]
fn a_swapdb_replica_serves_its_old_locks_during_a_full_sync_then_has_the_primarys() {
    let primary = primary();
    let replica = swapdb_replica(&primary);
    let mut p = primary.conn();
    let mut r = replica.conn();
    assert_eq!(
        p.call(&["DEBUG", "POPULATE", FILLER_KEYS, "filler", FILLER_BYTES]),
        Reply::status("OK")
    );
    let kept = acquire(&mut p, "kept", "t-kept", 60_000);
    let released = acquire(&mut p, "released", "t-released", 60_000);
    let gone = acquire(&mut p, "gone", "t-gone", 60_000);
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(replica.info_int("lock_keys"), 3);
    assert_eq!(replica.info_int("lock_index_entries"), 3);
    // Clients on the replica waiting (LOCK.WAIT, no timeout) for these grants to end.
    let watchers: Vec<(&str, Conn)> = ["kept", "released", "gone"]
        .into_iter()
        .map(|key| {
            let mut watcher = replica.conn();
            watcher.send(&["LOCK.WAIT", key, "0"]);
            (key, watcher)
        })
        .collect();
    wait_blocked(&replica, 3);

    // Changes the replica learns only from the full sync: a release, a deletion, a new short
    // lease, and a lock whose fence is far ahead of the clock (only the fence floor carries
    // such a fence to other keys).
    let format = LockDumpFormat::learn(&mut p);
    let ahead = fence_far_ahead(&mut p);
    let mut restore_ahead = args(&["RESTORE", "ahead", "0"]);
    restore_ahead.push(format.payload(&tombstone_fields(ahead)));
    assert_eq!(
        replica
            .conn()
            .call(&["CONFIG", "SET", "key-load-delay", "50000"]),
        Reply::status("OK")
    );
    force_full_sync_with(
        &primary,
        &[
            args(&["LOCK.RELEASE", "released", "t-released"]),
            args(&["DEL", "gone"]),
            args(&["LOCK.ACQUIRE", "new", "t-new", "6000"]),
            restore_ahead,
        ],
    );
    let new = fence_of(&mut p, "new");

    // While the sync loads, the replica answers from its old data, never LOADING.
    wait_async_loading(&replica);
    assert_eq!(state_of(&mut r, "kept"), "held");
    assert_eq!(fence_of(&mut r, "kept"), kept);
    assert_eq!(state_of(&mut r, "released"), "held");
    assert_eq!(
        r.call(&["LOCK.FENCE", "released", &released.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(fence_of(&mut r, "gone"), gone);
    assert_eq!(r.call(&["LOCK.INFO", "new"]), Reply::Nil);
    assert_eq!(replica.info_int("lock_index_entries"), 3);
    assert_eq!(blocked(&replica), 3);
    assert_eq!(persistence(&replica, "async_loading"), "1");

    // Then the primary's data takes its place.
    assert_eq!(
        replica
            .conn()
            .call(&["CONFIG", "SET", "key-load-delay", "0"]),
        Reply::status("OK")
    );
    wait_for("the background load to complete", || {
        (persistence(&replica, "async_loading") == "0").then_some(())
    });
    wait_replica_caught_up(&primary, &replica);
    assert_eq!(p.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
    assert_eq!(fence_of(&mut r, "kept"), kept);
    assert_eq!(state_of(&mut r, "released"), "free");
    assert_eq!(
        r.call(&["LOCK.FENCE", "released", &released.to_string()]),
        Reply::Int(0)
    );
    assert_eq!(r.call(&["LOCK.INFO", "gone"]), Reply::Nil);
    assert_eq!(state_of(&mut r, "new"), "held");
    assert_eq!(fence_of(&mut r, "new"), new);
    assert_eq!(fence_of(&mut r, "ahead"), ahead as i64);
    // Four locks, one lease index entry each (the old values' entries left with them).
    wait_lock_keys(&replica, 4);
    assert_eq!(replica.info_int("lock_held"), 2);
    assert_eq!(replica.info_int("lock_index_entries"), 4);
    // The grants that ended in the primary's data ended for their watchers; the one kept is
    // still awaited.
    for (key, mut watcher) in watchers {
        if key == "kept" {
            wait_blocked(&replica, 1);
            drop(watcher);
        } else {
            assert_eq!(watcher.read(), Reply::Int(1), "LOCK.WAIT {key}");
        }
    }
    wait_blocked(&replica, 0);

    // Promoted, it expires the new lease by its own index, and every fence it grants is above
    // what it loaded.
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Reply::status("OK"));
    assert_eq!(
        state_of(&mut r, "new"),
        "held",
        "the lease ended before the promotion"
    );
    let expired = replica.info_int("lock_expired");
    wait_for("the promoted replica to expire the new lease", || {
        (replica.info_int("lock_expired") == expired + 1).then_some(())
    });
    assert_eq!(state_of(&mut r, "new"), "free");
    assert_eq!(state_of(&mut r, "kept"), "held");
    let fresh = acquire(&mut r, "fresh", "t-fresh", 60_000);
    assert!(fresh as u64 > ahead, "{fresh} > {ahead}");
}

#[test]
fn an_aborted_background_full_sync_leaves_the_replicas_old_locks_and_bookkeeping() {
    let primary = primary();
    let replica = swapdb_replica(&primary);
    let mut p = primary.conn();
    let mut r = replica.conn();
    assert_eq!(
        p.call(&["DEBUG", "POPULATE", FILLER_KEYS, "filler", FILLER_BYTES]),
        Reply::status("OK")
    );
    let kept = acquire(&mut p, "kept", "t-kept", 60_000);
    let released = acquire(&mut p, "released", "t-released", 60_000);
    let short = acquire(&mut p, "short", "t-short", 6_000);
    wait_replica_caught_up(&primary, &replica);
    let digest = r.call(&["DEBUG", "DIGEST"]);
    assert_eq!(replica.info_int("lock_keys"), 3);
    assert_eq!(replica.info_int("lock_index_entries"), 3);

    // The primary makes its snapshot slowly (10 ms a key), and goes away in the middle of it.
    assert_eq!(
        p.call(&["CONFIG", "SET", "rdb-key-save-delay", "10000"]),
        Reply::status("OK")
    );
    force_full_sync_with(
        &primary,
        &[
            args(&["LOCK.RELEASE", "released", "t-released"]),
            args(&["LOCK.ACQUIRE", "new", "t-new", "60000"]),
        ],
    );
    wait_async_loading(&replica);
    assert_eq!(fence_of(&mut r, "kept"), kept);
    // The primary and the child writing its snapshot: with Redis 8's RDB channel the child
    // sends the snapshot to the replica itself, and would finish it after its parent died.
    let children = children_of(primary.pid());
    assert!(!children.is_empty(), "no child makes the snapshot");
    let mut primary = primary;
    primary.kill();
    for child in children {
        signal("-KILL", child);
    }
    wait_for("the background load to be given up", || {
        (persistence(&replica, "async_loading") == "0").then_some(())
    });

    // The old data, and the bookkeeping beside it, as they were.
    assert_eq!(r.call(&["DEBUG", "DIGEST"]), digest);
    assert_eq!(state_of(&mut r, "released"), "held");
    assert_eq!(
        r.call(&["LOCK.FENCE", "released", &released.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(r.call(&["LOCK.INFO", "new"]), Reply::Nil);
    wait_lock_keys(&replica, 3);
    assert_eq!(replica.info_int("lock_held"), 3);
    assert_eq!(replica.info_int("lock_index_entries"), 3);

    // Promoted, it expires the short lease by the index it kept, and grants larger fences.
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Reply::status("OK"));
    assert_eq!(
        state_of(&mut r, "short"),
        "held",
        "the lease ended before the promotion"
    );
    wait_for("the promoted replica to expire the short lease", || {
        (replica.info_int("lock_expired") == 1).then_some(())
    });
    assert_eq!(state_of(&mut r, "short"), "free");
    assert_eq!(fence_of(&mut r, "short"), short);
    assert_eq!(state_of(&mut r, "kept"), "held");
    let fresh = acquire(&mut r, "fresh", "t-fresh", 60_000);
    assert!(fresh > kept.max(released).max(short), "{fresh}");
}
