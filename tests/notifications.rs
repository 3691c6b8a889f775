//! Keyspace notifications and WATCH: every state change is announced and invalidates WATCH.

mod common;

use common::*;

fn notifying_server() -> Server {
    Server::start_with(Config::default().with("notify-keyspace-events", "Kd"))
}

#[test]
fn every_state_change_emits_its_keyspace_event() {
    let server = notifying_server();
    let mut c = server.conn();
    let mut sub = subscribe_keyspace(&server, "k");
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(c.call(&["LOCK.RENEW", "k", "a", "60000"]), Reply::Int(1));
    assert_eq!(next_event(&mut sub), "lock.renew");
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    assert_eq!(next_event(&mut sub), "lock.release");
    acquire(&mut c, "k", "b", 60_000);
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_eq!(next_event(&mut sub), "lock.forcerelease");
    acquire(&mut c, "k", "c", 100);
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(next_event(&mut sub), "lock.expired");
}

#[test]
fn refused_commands_emit_nothing() {
    let server = notifying_server();
    let mut c = server.conn();
    let mut sub = subscribe_keyspace(&server, "k");
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(next_event(&mut sub), "lock.acquire");
    assert_eq!(c.call(&["LOCK.ACQUIRE", "k", "b", "1000"]), Reply::Nil);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(0));
    assert_eq!(c.call(&["LOCK.RENEW", "k", "b", "1000"]), Reply::Int(0));
    // A marker event proves nothing was queued before it.
    assert_eq!(c.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    assert_eq!(next_event(&mut sub), "lock.forcerelease");
}

#[test]
fn lock_events_need_the_module_class_d() {
    let server = Server::start_with(Config::default().with("notify-keyspace-events", "K$"));
    let mut c = server.conn();
    let mut sub = server.conn();
    let reply = sub.call(&["PSUBSCRIBE", "__keyspace@0__:*"]);
    assert_eq!(reply.items()[0], Reply::bulk("psubscribe"));
    acquire(&mut c, "k", "a", 60_000);
    c.call(&["SET", "marker", "1"]);
    // The first event is the marker's: the acquire was not announced without `d`.
    let message = sub.read();
    assert_eq!(
        message.items()[2],
        Reply::bulk("__keyspace@0__:marker"),
        "{message:?}"
    );
    assert_eq!(message.items()[3], Reply::bulk("set"));
    assert_eq!(
        c.call(&["CONFIG", "SET", "notify-keyspace-events", "K$d"]),
        Reply::status("OK")
    );
    c.call(&["LOCK.RELEASE", "k", "a"]);
    let message = sub.read();
    assert_eq!(
        message.items()[2],
        Reply::bulk("__keyspace@0__:k"),
        "{message:?}"
    );
    assert_eq!(message.items()[3], Reply::bulk("lock.release"));
}

/// Starts a WATCH on `key` on a fresh connection, runs `change` on another connection, and
/// returns what EXEC replied.
fn exec_after(server: &Server, key: &str, change: impl FnOnce(&mut Conn)) -> Reply {
    let mut watcher = server.conn();
    assert_eq!(watcher.call(&["WATCH", key]), Reply::status("OK"));
    let mut other = server.conn();
    change(&mut other);
    assert_eq!(watcher.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(watcher.call(&["SET", "data", "x"]), Reply::status("QUEUED"));
    watcher.call(&["EXEC"])
}

#[test]
fn every_state_change_invalidates_watch() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let aborted = Reply::Nil;
    assert_eq!(
        exec_after(&server, "k", |o| assert_eq!(
            o.call(&["LOCK.RENEW", "k", "a", "60000"]),
            Reply::Int(1)
        )),
        aborted
    );
    assert_eq!(
        exec_after(&server, "k", |o| assert!(matches!(
            o.call(&["LOCK.ACQUIRE", "k", "a", "60000"]),
            Reply::Int(_)
        ))),
        aborted
    );
    assert_eq!(
        exec_after(&server, "k", |o| assert_eq!(
            o.call(&["LOCK.RELEASE", "k", "a"]),
            Reply::Int(1)
        )),
        aborted
    );
    assert_eq!(
        exec_after(&server, "k", |o| {
            acquire(o, "k", "b", 60_000);
        }),
        aborted
    );
    assert_eq!(
        exec_after(&server, "k", |o| assert_eq!(
            o.call(&["LOCK.FORCERELEASE", "k"]),
            Reply::Int(1)
        )),
        aborted
    );
    assert_eq!(
        exec_after(&server, "fresh", |o| {
            acquire(o, "fresh", "b", 60_000);
        }),
        aborted
    );
}

#[test]
fn lease_expiry_invalidates_watch() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 150);
    let reply = exec_after(&server, "k", |o| {
        wait_for("the lease to expire", || {
            (server.info_int("lock_expired") == 1).then_some(())
        });
        assert_eq!(state_of(o, "k"), "free");
    });
    assert_eq!(reply, Reply::Nil);
}

#[test]
fn refused_commands_do_not_invalidate_watch() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let reply = exec_after(&server, "k", |o| {
        assert_eq!(o.call(&["LOCK.ACQUIRE", "k", "b", "1000"]), Reply::Nil);
        assert_eq!(o.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(0));
        assert_eq!(o.call(&["LOCK.RENEW", "k", "b", "1000"]), Reply::Int(0));
        assert_eq!(o.call(&["LOCK.FENCE", "k", "1"]), Reply::Int(0));
        assert!(matches!(o.call(&["LOCK.INFO", "k"]), Reply::Array(_)));
    });
    assert_eq!(reply, Reply::Array(vec![Reply::status("OK")]));
}

#[test]
fn watch_and_fence_give_an_atomic_fenced_write() {
    let server = Server::start();
    let mut holder = server.conn();
    let fence = acquire(&mut holder, "k", "a", 60_000);
    // The holder's write goes through while it still holds the lock.
    assert_eq!(holder.call(&["WATCH", "k"]), Reply::status("OK"));
    assert_eq!(
        holder.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
    holder.call(&["MULTI"]);
    holder.call(&["SET", "balance", "100"]);
    assert_eq!(
        holder.call(&["EXEC"]),
        Reply::Array(vec![Reply::status("OK")])
    );

    // A holder that lost the lock between its check and its write is stopped by WATCH.
    assert_eq!(holder.call(&["WATCH", "k"]), Reply::status("OK"));
    assert_eq!(
        holder.call(&["LOCK.FENCE", "k", &fence.to_string()]),
        Reply::Int(1)
    );
    let mut operator = server.conn();
    assert_eq!(operator.call(&["LOCK.FORCERELEASE", "k"]), Reply::Int(1));
    acquire(&mut operator, "k", "b", 60_000);
    holder.call(&["MULTI"]);
    holder.call(&["SET", "balance", "0"]);
    assert_eq!(holder.call(&["EXEC"]), Reply::Nil);
    assert_eq!(holder.call(&["GET", "balance"]), Reply::bulk("100"));
}
