//! LOCK.GUARD key fence command [arg ...]: the command runs only while the fence is the lock's
//! current one, as the calling user, replicated as itself, with its keys declared for cluster
//! routing and ACL key patterns; commands it must not run are refused and nothing changes.

mod common;

use common::cluster::Cluster;
use common::*;

const STALE: &str = "FENCED the fence is not the current holder's; the command did not run";

fn guard(c: &mut Conn, lock: &str, fence: i64, command: &[&str]) -> Reply {
    let fence = fence.to_string();
    let mut call = vec!["LOCK.GUARD", lock, &fence];
    call.extend_from_slice(command);
    c.call(&call)
}

fn refusal(why: &str) -> Reply {
    Reply::Error(format!("ERR LOCK.GUARD cannot run this command: {why}"))
}

#[test]
fn the_command_runs_only_under_the_current_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "lk", "t1", 60_000);
    assert_eq!(
        guard(&mut c, "lk", fence, &["SET", "data", "v1"]),
        Reply::status("OK")
    );
    assert_eq!(c.call(&["GET", "data"]), Reply::bulk("v1"));
    // An older fence, a fence never issued, and no lock at all: nothing runs.
    for (lock, stale) in [("lk", fence - 1), ("lk", fence + 1), ("nolock", fence)] {
        assert_eq!(
            guard(&mut c, lock, stale, &["SET", "data", "stale"]),
            Reply::error(STALE)
        );
    }
    assert_eq!(c.call(&["GET", "data"]), Reply::bulk("v1"));
    // Released, then taken by another holder: the old fence is refused.
    assert_eq!(c.call(&["LOCK.RELEASE", "lk", "t1"]), Reply::Int(1));
    assert_eq!(
        guard(&mut c, "lk", fence, &["SET", "data", "stale"]),
        Reply::error(STALE)
    );
    let newer = acquire(&mut c, "lk", "t2", 60_000);
    assert_eq!(
        guard(&mut c, "lk", fence, &["DEL", "data"]),
        Reply::error(STALE)
    );
    assert_eq!(guard(&mut c, "lk", newer, &["DEL", "data"]), Reply::Int(1));
    assert_eq!(server.info_int("lock_guarded"), 2);
    assert_eq!(server.info_int("lock_guard_rejects"), 5);
}

#[test]
fn a_lease_past_its_deadline_guards_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "lk", "t1", 30);
    wait_for("the lease to end", || {
        (state_of(&mut c, "lk") != "held").then_some(())
    });
    assert_eq!(
        guard(&mut c, "lk", fence, &["SET", "data", "late"]),
        Reply::error(STALE)
    );
    assert_eq!(c.call(&["EXISTS", "data"]), Reply::Int(0));
}

#[test]
fn replies_and_errors_of_the_command_come_back_as_they_are() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "lk", "t", 60_000);
    assert_eq!(
        guard(&mut c, "lk", fence, &["INCRBY", "n", "5"]),
        Reply::Int(5)
    );
    assert_eq!(
        guard(&mut c, "lk", fence, &["HSET", "h", "a", "1"]),
        Reply::Int(1)
    );
    assert_eq!(
        guard(&mut c, "lk", fence, &["HGETALL", "h"]),
        Reply::Array(vec![Reply::bulk("a"), Reply::bulk("1")])
    );
    assert_eq!(guard(&mut c, "lk", fence, &["GET", "none"]), Reply::Nil);
    assert_eq!(
        guard(&mut c, "lk", fence, &["LPUSH", "h", "x"]),
        Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(
        guard(&mut c, "lk", fence, &["SET", "only-key"]),
        Reply::error("ERR wrong number of arguments for 'set' command")
    );
    let unknown = guard(&mut c, "lk", fence, &["NOSUCHCMD", "x"]);
    assert!(
        matches!(&unknown, Reply::Error(e) if e.starts_with("ERR unknown command 'NOSUCHCMD'")),
        "{unknown:?}"
    );
    // RESP3: the map stays a map.
    let mut c3 = server.conn3();
    let reply = guard(&mut c3, "lk", fence, &["HGETALL", "h"]);
    assert!(
        matches!(reply, Reply::Map(ref pairs) if pairs.len() == 1),
        "{reply:?}"
    );
    // The lock's key holding another type.
    assert_eq!(c.call(&["SET", "plain", "x"]), Reply::status("OK"));
    assert_eq!(
        guard(&mut c, "plain", fence, &["SET", "data", "v"]),
        Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    assert_eq!(c.call(&["EXISTS", "data"]), Reply::Int(0));
}

#[test]
fn commands_that_block_script_or_change_transactions_are_refused() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "lk", "t", 60_000);
    assert_eq!(c.call(&["RPUSH", "list", "a"]), Reply::Int(1));
    let digest = c.call(&["DEBUG", "DIGEST"]);
    let scripts = "scripts may not run it (transactions, scripts, subscriptions, ...)";
    let cases: &[(&[&str], &str)] = &[
        (&["BLPOP", "list", "0"], "it may block"),
        (&["brpoplpush", "list", "other", "1"], "it may block"),
        (&["XREAD", "STREAMS", "s", "0"], "it may block"),
        (&["MULTI"], scripts),
        (&["EXEC"], scripts),
        (&["WATCH", "list"], scripts),
        (
            &["EVAL", "return redis.call('del', KEYS[1])", "1", "list"],
            scripts,
        ),
        (&["SUBSCRIBE", "ch"], scripts),
        (&["LOCK.RELEASE", "lk", "t"], "it is a LOCK.* command"),
        (&["lock.forcerelease", "lk"], "it is a LOCK.* command"),
        (
            &["LOCK.GUARD", "lk", "1", "DEL", "list"],
            "it is a LOCK.* command",
        ),
    ];
    for (command, why) in cases {
        assert_eq!(
            guard(&mut c, "lk", fence, command),
            refusal(why),
            "{command:?}"
        );
    }
    // A subcommand the server refuses in scripts although its command is allowed: the server's
    // own error, and nothing ran (no pause).
    assert_eq!(
        guard(&mut c, "lk", fence, &["CLIENT", "PAUSE", "100000"]),
        Reply::error("ERR command 'client|pause' is not allowed on script mode")
    );
    assert_eq!(c.call(&["SET", "not-paused", "1"]), Reply::status("OK"));
    assert_eq!(c.call(&["DEL", "not-paused"]), Reply::Int(1));
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), digest);
    assert_eq!(state_of(&mut c, "lk"), "held");
    // Bad arguments of LOCK.GUARD itself.
    assert_eq!(
        c.call(&["LOCK.GUARD", "lk", "0", "DEL", "list"]),
        Reply::error("ERR invalid fence: must be a positive integer")
    );
    assert_eq!(
        c.call(&["LOCK.GUARD", "lk", "x", "DEL", "list"]),
        Reply::error("ERR invalid fence: must be a positive integer")
    );
    assert_eq!(
        c.call(&["LOCK.GUARD", "lk", "1"]),
        Reply::error("ERR wrong number of arguments for 'lock.guard' command")
    );
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), digest);
    // Only CLIENT PAUSE got past the module's checks (under a current fence): counted, as a
    // command that ran and answered an error would be.
    assert_eq!(server.info_int("lock_guarded"), 1);
}

#[test]
fn inside_multi_the_fence_is_checked_when_exec_runs() {
    let server = Server::start();
    let mut c = server.conn();
    let mut other = server.conn();
    let fence = acquire(&mut c, "lk", "t", 60_000);
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    let fence_text = fence.to_string();
    for value in ["a", "b"] {
        assert_eq!(
            c.call(&["LOCK.GUARD", "lk", &fence_text, "RPUSH", "log", value]),
            Reply::status("QUEUED")
        );
    }
    assert_eq!(
        c.call(&["EXEC"]),
        Reply::Array(vec![Reply::Int(1), Reply::Int(2)])
    );
    // The lock changes hands after queueing: EXEC runs LOCK.GUARD, which refuses.
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(
        c.call(&["LOCK.GUARD", "lk", &fence_text, "RPUSH", "log", "late"]),
        Reply::status("QUEUED")
    );
    assert_eq!(
        c.call(&["LPUSH", "unguarded", "x"]),
        Reply::status("QUEUED")
    );
    assert_eq!(other.call(&["LOCK.FORCERELEASE", "lk"]), Reply::Int(1));
    assert_eq!(
        c.call(&["EXEC"]),
        Reply::Array(vec![Reply::error(STALE), Reply::Int(1)])
    );
    assert_eq!(c.call(&["LLEN", "log"]), Reply::Int(2));
}

#[test]
fn the_command_is_replicated_and_written_to_the_aof_as_itself() {
    let config = Config::default().with("appendonly", "yes");
    let mut primary = Server::start_with(config);
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    let fence = acquire(&mut c, "lk", "t", 60_000);
    assert_eq!(
        guard(&mut c, "lk", fence, &["SET", "data", "v1"]),
        Reply::status("OK")
    );
    assert_eq!(
        guard(&mut c, "lk", fence + 1, &["SET", "data", "v2"]),
        Reply::error(STALE)
    );
    assert_eq!(guard(&mut c, "lk", fence, &["INCR", "n"]), Reply::Int(1));
    primary.sync_replicas(1);
    let mut r = replica.conn();
    assert_eq!(r.call(&["GET", "data"]), Reply::bulk("v1"));
    assert_eq!(r.call(&["GET", "n"]), Reply::bulk("1"));
    assert_eq!(c.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
    let stats = r.call(&["INFO", "commandstats"]).text();
    assert!(stats.contains("cmdstat_set:calls=1,"), "{stats}");
    assert!(!stats.contains("cmdstat_lock.guard"), "{stats}");
    // The replica refuses LOCK.GUARD from clients like any write.
    let reply = guard(&mut r, "lk", fence, &["SET", "data", "v3"]);
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("READONLY ")),
        "{reply:?}"
    );
    drop(c);
    primary.restart();
    let mut c = primary.conn();
    assert_eq!(c.call(&["GET", "data"]), Reply::bulk("v1"));
    assert_eq!(c.call(&["GET", "n"]), Reply::bulk("1"));
}

#[test]
fn the_command_runs_as_the_calling_user() {
    let server = Server::start();
    let mut admin = server.conn();
    let fence = acquire(&mut admin, "app:lk", "t", 60_000);
    let set_user = |name: &str, rules: &[&str]| {
        let mut call = vec!["ACL", "SETUSER", name, "reset", "on", ">pw"];
        call.extend_from_slice(rules);
        assert_eq!(server.conn().call(&call), Reply::status("OK"));
        let mut conn = server.conn();
        assert_eq!(conn.call(&["AUTH", name, "pw"]), Reply::status("OK"));
        conn
    };
    // NOPERM with the server's wording (Redis 7.0 words a refusal inside a module's call as a
    // plain ERR, which the module turns into its own NOPERM).
    let noperm = |reply: Reply| {
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("NOPERM ")),
            "{reply:?}"
        );
    };
    // Allowed LOCK.GUARD but not SET: the inner command is refused.
    let mut u = set_user("noset", &["~*", "+@all", "-set"]);
    noperm(guard(&mut u, "app:lk", fence, &["SET", "app:data", "x"]));
    assert_eq!(
        guard(&mut u, "app:lk", fence, &["INCR", "app:n"]),
        Reply::Int(1)
    );
    // Keys outside the user's patterns: refused before anything runs.
    let mut u = set_user("app", &["~app:*", "+@all"]);
    noperm(guard(&mut u, "app:lk", fence, &["SET", "other:data", "x"]));
    noperm(guard(
        &mut u,
        "app:lk",
        fence,
        &["MSET", "app:a", "1", "other:b", "2"],
    ));
    assert_eq!(
        guard(
            &mut u,
            "app:lk",
            fence,
            &["MSET", "app:a", "1", "app:b", "2"]
        ),
        Reply::status("OK")
    );
    // Only the lock commands: LOCK.GUARD yes, the command inside no.
    let mut u = set_user(
        "lockonly",
        &["~*", "+lock.acquire", "+lock.release", "+lock.guard"],
    );
    noperm(guard(&mut u, "app:lk", fence, &["SET", "app:data", "x"]));
    assert_eq!(
        admin.call(&["EXISTS", "app:data", "other:data", "other:b"]),
        Reply::Int(0)
    );
}

#[test]
fn command_docs_and_getkeys_name_the_lock_and_the_commands_keys() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&[
            "COMMAND",
            "GETKEYS",
            "LOCK.GUARD",
            "lk",
            "5",
            "MSET",
            "a",
            "1",
            "b",
            "2"
        ]),
        Reply::Array(vec![Reply::bulk("lk"), Reply::bulk("a"), Reply::bulk("b")])
    );
    assert_eq!(
        c.call(&["COMMAND", "GETKEYS", "LOCK.GUARD", "lk", "5", "PING"]),
        Reply::Array(vec![Reply::bulk("lk")])
    );
    let info = c.call(&["COMMAND", "INFO", "lock.guard"]);
    let info = info.items()[0].items();
    assert_eq!(info[1], Reply::Int(-4));
    let flags: Vec<String> = info[2].items().iter().map(Reply::text).collect();
    assert!(
        flags.contains(&"write".into()) && flags.contains(&"movablekeys".into()),
        "{flags:?}"
    );
    assert_eq!(
        info[8].items().len(),
        2,
        "two key specs: the lock, the command's keys"
    );
    let docs = c.call(&["COMMAND", "DOCS", "lock.guard"]);
    assert!(
        docs.contains_bytes(b"Runs a command only if the fence"),
        "{docs:?}"
    );
}

#[test]
fn in_a_cluster_the_lock_and_the_commands_keys_share_a_slot() {
    let cluster = Cluster::start(3, false);
    let lock = "{order:7}:lock";
    let mut c = cluster.conn_for(lock);
    let fence = acquire(&mut c, lock, "t", 60_000);
    assert_eq!(
        guard(&mut c, lock, fence, &["SET", "{order:7}:data", "v"]),
        Reply::status("OK")
    );
    assert_eq!(
        guard(&mut c, lock, fence, &["SET", "{order:8}:data", "v"]),
        Reply::error("CROSSSLOT Keys in request don't hash to the same slot")
    );
    // Sent to a node that does not serve the slot: redirected like any keyed command.
    let elsewhere = (cluster.owner_of(lock) + 1) % 3;
    let reply = guard(
        &mut cluster.nodes[elsewhere].conn(),
        lock,
        fence,
        &["SET", "{order:7}:data", "v2"],
    );
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("MOVED ")),
        "{reply:?}"
    );
    assert_eq!(c.call(&["GET", "{order:7}:data"]), Reply::bulk("v"));
}
