//! Safety warnings of `INFO lock`: an eviction policy that can evict locks, no persistence.

use crate::common::*;

#[test]
fn allkeys_eviction_policy_is_warned_about_until_it_changes() {
    let server = Server::start_with(Config::default().with("maxmemory-policy", "allkeys-lru"));
    assert_eq!(server.info_int("lock_warning_eviction_policy"), 1);
    assert!(
        server
            .log()
            .contains("maxmemory-policy allkeys-lru can evict lock keys"),
        "{}",
        server.log()
    );
    let mut c = server.conn();
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        Reply::status("OK")
    );
    wait_for("eviction warning cleared", || {
        (server.info_int("lock_warning_eviction_policy") == 0).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"]),
        Reply::status("OK")
    );
    wait_for("eviction warning raised again", || {
        (server.info_int("lock_warning_eviction_policy") == 1).then_some(())
    });
    wait_for("allkeys-lfu warning in the log", || {
        server
            .log()
            .contains("maxmemory-policy allkeys-lfu can evict lock keys")
            .then_some(())
    });
}

#[test]
fn volatile_eviction_policy_gives_no_warning() {
    let server = Server::start_with(Config::default().with("maxmemory-policy", "volatile-lru"));
    assert_eq!(server.info_int("lock_warning_eviction_policy"), 0);
    assert!(!server.log().contains("can evict lock keys"));
}

#[test]
fn no_persistence_is_warned_about_until_aof_or_save_points_are_on() {
    let server = Server::start();
    assert_eq!(server.info_int("lock_warning_no_persistence"), 1);
    assert_eq!(server.info_int("lock_warning_eviction_policy"), 0);
    assert!(
        server.log().contains("persistence is off"),
        "{}",
        server.log()
    );
    let mut c = server.conn();
    let warning = || server.info_int("lock_warning_no_persistence");
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "yes"]),
        Reply::status("OK")
    );
    wait_for("no-persistence warning cleared by AOF", || {
        (warning() == 0).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "no"]),
        Reply::status("OK")
    );
    wait_for("no-persistence warning back", || {
        (warning() == 1).then_some(())
    });
    assert_eq!(
        c.call(&["CONFIG", "SET", "save", "3600 1"]),
        Reply::status("OK")
    );
    wait_for("no-persistence warning cleared by a save point", || {
        (warning() == 0).then_some(())
    });
}

#[test]
fn appendonly_at_start_gives_no_persistence_warning() {
    let server = Server::start_with(Config::default().with("appendonly", "yes"));
    assert_eq!(server.info_int("lock_warning_no_persistence"), 0);
    assert!(!server.log().contains("persistence is off"));
}
