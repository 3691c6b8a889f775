//! Upgrading from the previous release: its RDB and AOF files load in this build, a replica of
//! this build follows a primary of the previous release and takes over from it, and a replica
//! of the previous release refuses what a primary of this build sends (so replicas go first).
//!
//! `make test-upgrade` builds the previous release and runs these with `LOCK_PREVIOUS_MODULE`
//! pointing at it; they are ignored otherwise.

mod common;

use std::path::PathBuf;

use common::*;

fn previous_module() -> PathBuf {
    let path = std::env::var("LOCK_PREVIOUS_MODULE")
        .expect("LOCK_PREVIOUS_MODULE: the previous release's module (make test-upgrade)");
    let path = PathBuf::from(path);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

fn previous(config: Config) -> Config {
    Config {
        module: Some(previous_module()),
        ..config
    }
}

/// `ver` of the module in MODULE LIST.
fn module_version(c: &mut Conn) -> i64 {
    let modules = c.call(&["MODULE", "LIST"]);
    let lock = modules
        .items()
        .iter()
        .map(Reply::items)
        .find(|m| m[1] == Reply::bulk("lock"))
        .expect("the lock module");
    lock[3].int()
}

/// A field of LOCK.WHO's first holder.
fn holder_field(c: &mut Conn, key: &str, name: &str) -> Reply {
    let who = fields_map(&c.call(&["LOCK.WHO", key]));
    fields_map(&who["holders"].items()[0])[name].clone()
}

/// Locks of every kind the previous release knows: held, reentrant, with lock-delay, shared, a
/// semaphore's permits, and a free tombstone. Returns each key's fence.
fn write_every_kind(c: &mut Conn) -> Vec<(&'static str, i64)> {
    acquire(c, "held", "t-held", 600_000);
    acquire_with(c, "reentrant", "t-re", 600_000, &["REENTRANT"]).int();
    acquire_with(c, "reentrant", "t-re", 600_000, &["REENTRANT"]).int();
    acquire_with(c, "delayed", "t-delay", 600_000, &["LOCKDELAY", "5000"]).int();
    acquire_with(c, "shared", "r1", 600_000, &["SHARED"]).int();
    acquire_with(c, "shared", "r2", 600_000, &["SHARED"]).int();
    acquire_with(c, "sem", "p1", 600_000, &["LIMIT", "3"]).int();
    acquire(c, "free", "t-free", 600_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "free", "t-free"]), Reply::Int(1));
    ["held", "reentrant", "delayed", "shared", "sem", "free"]
        .into_iter()
        .map(|key| (key, fence_of(c, key)))
        .collect()
}

/// The locks of [`write_every_kind`], as this build reads them.
fn check_every_kind(c: &mut Conn, fences: &[(&str, i64)], what: &str) {
    for (key, fence) in fences {
        assert_eq!(fence_of(c, key), *fence, "{key} {what}");
    }
    for key in ["held", "reentrant", "delayed", "shared", "sem"] {
        assert_eq!(state_of(c, key), "held", "{key} {what}");
    }
    assert_eq!(state_of(c, "free"), "free", "{what}");
    assert_eq!(lock_field(c, "reentrant", "holds"), Reply::Int(2), "{what}");
    assert_eq!(
        lock_field(c, "delayed", "lock_delay"),
        Reply::Int(5000),
        "{what}"
    );
    assert_eq!(lock_field(c, "shared", "holders"), Reply::Int(2), "{what}");
    assert_eq!(lock_field(c, "sem", "limit"), Reply::Int(3), "{what}");
    // Holds granted by the previous release: when and to whom is not known.
    assert_eq!(holder_field(c, "held", "held_ms"), Reply::Int(-1), "{what}");
    assert_eq!(
        holder_field(c, "held", "client_id"),
        Reply::Int(0),
        "{what}"
    );
    assert_eq!(
        holder_field(c, "held", "connected"),
        Reply::Int(-1),
        "{what}"
    );
    // The tokens still hold, and new grants exceed every old fence.
    assert_eq!(
        c.call(&["LOCK.RENEW", "held", "t-held", "600000"]),
        Reply::Int(1)
    );
    let newest = fences.iter().map(|(_, f)| *f).max().unwrap();
    assert!(acquire(c, "new-key", "t", 60_000) > newest, "{what}");
    assert_eq!(c.call(&["LOCK.RELEASE", "new-key", "t"]), Reply::Int(1));
}

#[test]
#[ignore = "needs the previous release: make test-upgrade"]
fn rdb_and_aof_files_of_the_previous_release_load_in_this_one() {
    for (aof, preamble) in [("no", "yes"), ("yes", "yes"), ("yes", "no")] {
        let what = format!("appendonly {aof}, aof-use-rdb-preamble {preamble}");
        let config = Config::default()
            .with("appendonly", aof)
            .with("aof-use-rdb-preamble", preamble)
            .with("save", "3600 1");
        let mut server = Server::start_with(previous(config.clone()));
        let mut c = server.conn();
        assert_eq!(module_version(&mut c), 1, "the previous release says ver 1");
        let fences = write_every_kind(&mut c);
        if aof == "yes" {
            // Half in the rewritten base, half in the incremental AOF after it.
            assert!(!c.call(&["BGREWRITEAOF"]).is_error());
            wait_for("the AOF rewrite", || {
                (server.info_int("aof_rewrite_in_progress") == 0
                    && server.info_int("aof_rewrite_scheduled") == 0)
                    .then_some(())
            });
            acquire(&mut c, "after-rewrite", "t-after", 600_000);
        }
        drop(c);
        server.shutdown();
        server.config.module = None;
        server.restart();
        let mut c = server.conn();
        assert_eq!(module_version(&mut c), 200, "{what}");
        check_every_kind(&mut c, &fences, &what);
        if aof == "yes" {
            assert_eq!(state_of(&mut c, "after-rewrite"), "held", "{what}");
        }
    }
}

#[test]
#[ignore = "needs the previous release: make test-upgrade"]
fn a_replica_of_this_release_follows_a_primary_of_the_previous_one_and_takes_over() {
    let old_primary = Server::start_with(previous(Config::default()));
    let mut p = old_primary.conn();
    let before = write_every_kind(&mut p);
    let replica = Server::start();
    replica.replicate_from(&old_primary);
    // Changes after the full sync arrive as the previous release's effects.
    let after = acquire_with(&mut p, "later", "t-later", 600_000, &["SESSION"]).int();
    assert_eq!(
        p.call(&["LOCK.RENEW", "held", "t-held", "700000"]),
        Reply::Int(1)
    );
    assert_eq!(p.call(&["LOCK.RELEASE", "shared", "r2"]), Reply::Int(1));
    acquire_with(&mut p, "shared", "r3", 600_000, &["SHARED"]).int();
    wait_replica_caught_up(&old_primary, &replica);
    let before: Vec<(&str, i64)> = before
        .into_iter()
        .map(|(key, _)| (key, fence_of(&mut p, key)))
        .collect();
    let mut r = replica.conn();
    for key in [
        "held",
        "reentrant",
        "delayed",
        "shared",
        "sem",
        "free",
        "later",
    ] {
        // The replica keeps token digests where the previous release kept tokens, so the
        // values' DEBUG DIGEST differs: what LOCK.INFO shows must not (the lease aside).
        let shown = |c: &mut Conn| {
            let mut info = lock_info(c, key).expect("lock");
            info.retain(|(field, _)| field != "ttl");
            info
        };
        assert_eq!(
            shown(&mut p),
            shown(&mut r),
            "{key}: the replica holds what its primary holds"
        );
    }
    // The failover: the replica becomes the primary and carries on above the old fences.
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Reply::status("OK"));
    check_every_kind(&mut r, &before, "after the failover");
    assert_eq!(fence_of(&mut r, "later"), after);
    // The tokens the previous release's effects named (a grant, a shared holder that left, one
    // that joined) answer on the new primary as they did on the old one.
    for (key, token, holds) in [
        ("later", "t-later", 1),
        ("shared", "r1", 1),
        ("shared", "r3", 1),
        ("shared", "r2", 0),
    ] {
        assert_eq!(
            r.call(&["LOCK.RENEW", key, token, "600000"]),
            Reply::Int(holds),
            "{key} {token}"
        );
    }
    let fresh = acquire_with(&mut r, "fresh", "t", 60_000, &["LABEL", "upgraded"]).int();
    assert!(fresh > after);
    assert_eq!(holder_field(&mut r, "fresh", "label").text(), "upgraded");
}

#[test]
#[ignore = "needs the previous release: make test-upgrade"]
fn a_replica_of_the_previous_release_refuses_what_a_primary_of_this_one_sends() {
    let primary = Server::start();
    let mut p = primary.conn();
    acquire_with(&mut p, "k", "t", 600_000, &["LABEL", "new"]).int();
    let mut old_replica = Server::start_with(previous(Config::default()));
    let mut r = old_replica.conn();
    assert_eq!(
        r.call(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]),
        Reply::status("OK")
    );
    drop(r);
    // The full sync carries encoding version 5 (the fence floor's aux field is always in it,
    // lock keys or not), which the previous release cannot read: Redis stops a server that
    // cannot load what its primary sent ("Unrecoverable error, aborting now"). Hence: replicas
    // first.
    wait_for("the replica to stop on the new encoding", || {
        old_replica.has_exited().then_some(())
    });
    let log = old_replica.log();
    assert!(
        log.contains("lock module cannot load fence floor of encoding version 5"),
        "{log}"
    );
    assert!(log.contains("aborting now"), "{log}");
}
