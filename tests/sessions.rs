//! A session lock follows its key: renamed, moved or swapped into another database, it is still
//! released when the connection that took it closes; and the close of that connection never
//! releases a lock it did not take, whatever now sits under the old name (a restored copy, a new
//! lock after DEL or FLUSHALL). A session ends with its lock's value, whatever freed it.

mod common;

use common::*;

/// A connection that took `key` with SESSION (in db `db`), to be dropped to end the session.
fn session_holder(server: &Server, db: &str, key: &str, token: &str) -> Conn {
    let mut conn = server.conn();
    assert_eq!(conn.call(&["SELECT", db]), Reply::status("OK"));
    let reply = conn.call(&["LOCK.ACQUIRE", key, token, "60000", "SESSION"]);
    assert!(matches!(reply, Reply::Int(_)), "{reply:?}");
    conn
}

fn state_in(c: &mut Conn, db: &str, key: &str) -> String {
    assert_eq!(c.call(&["SELECT", db]), Reply::status("OK"));
    state_of(c, key)
}

/// Closes `conn` and waits until the server has seen it go (and so has run what its close set
/// off: session locks end in the event-loop turn of the close).
fn close(server: &Server, mut conn: Conn) {
    let id = conn.call(&["CLIENT", "ID"]).int().to_string();
    drop(conn);
    let mut c = server.conn();
    wait_for("the connection to close", || {
        (c.call(&["CLIENT", "LIST", "ID", &id]).text().is_empty()).then_some(())
    });
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
}

fn session_released(server: &Server) -> i64 {
    server.info_int("lock_session_released")
}

#[test]
fn a_renamed_session_lock_is_released_when_its_connection_closes() {
    let server = Server::start();
    let mut c = server.conn();
    let holder = session_holder(&server, "0", "k", "t");
    assert_eq!(c.call(&["RENAME", "k", "renamed"]), Reply::status("OK"));
    close(&server, holder);
    assert_eq!(session_released(&server), 1);
    assert_eq!(state_of(&mut c, "renamed"), "free");
}

#[test]
fn a_moved_session_lock_is_released_when_its_connection_closes() {
    let server = Server::start();
    let mut c = server.conn();
    let holder = session_holder(&server, "0", "k", "t");
    assert_eq!(c.call(&["MOVE", "k", "1"]), Reply::Int(1));
    close(&server, holder);
    assert_eq!(session_released(&server), 1);
    assert_eq!(state_in(&mut c, "1", "k"), "free");
}

#[test]
fn a_session_lock_swapped_into_another_database_is_released_when_its_connection_closes() {
    let server = Server::start();
    let mut c = server.conn();
    let holder = session_holder(&server, "0", "k", "t");
    let other = session_holder(&server, "1", "k", "u");
    assert_eq!(c.call(&["SWAPDB", "0", "1"]), Reply::status("OK"));
    close(&server, holder);
    assert_eq!(session_released(&server), 1);
    assert_eq!(state_in(&mut c, "1", "k"), "free");
    assert_eq!(state_in(&mut c, "0", "k"), "held");
    close(&server, other);
    assert_eq!(session_released(&server), 2);
    assert_eq!(state_in(&mut c, "0", "k"), "free");
}

#[test]
fn a_rename_onto_a_session_lock_ends_the_overwritten_session_only() {
    let server = Server::start();
    let mut c = server.conn();
    let overwritten = session_holder(&server, "0", "target", "t1");
    let moved = session_holder(&server, "0", "source", "t2");
    assert_eq!(c.call(&["RENAME", "source", "target"]), Reply::status("OK"));
    close(&server, overwritten);
    assert_eq!(session_released(&server), 0);
    assert_eq!(state_of(&mut c, "target"), "held");
    close(&server, moved);
    assert_eq!(session_released(&server), 1);
    assert_eq!(state_of(&mut c, "target"), "free");
}

/// The old session's key now holds a lock the closing connection never took: a RESTOREd copy of
/// its own session lock (same token, session flag and all), after DEL, after MOVE away, after
/// FLUSHALL.
#[test]
fn a_closing_connection_never_releases_a_lock_it_did_not_take() {
    let server = Server::start();
    let mut c = server.conn();
    let mut released = 0;
    for how in ["del", "move", "flushall"] {
        let holder = session_holder(&server, "0", "k", "t");
        let Reply::Bulk(dump) = c.call(&["DUMP", "k"]) else {
            panic!("DUMP");
        };
        match how {
            "del" => assert_eq!(c.call(&["DEL", "k"]), Reply::Int(1)),
            "move" => assert_eq!(c.call(&["MOVE", "k", "5"]), Reply::Int(1)),
            _ => assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK")),
        }
        assert_eq!(restore(&mut c, "k", &dump), Reply::status("OK"));
        assert_eq!(lock_field(&mut c, "k", "session"), Reply::Int(1));
        close(&server, holder);
        if how == "move" {
            // The moved lock is the session's: released where it went.
            released += 1;
            assert_eq!(state_in(&mut c, "5", "k"), "free");
            assert_eq!(c.call(&["SELECT", "0"]), Reply::status("OK"));
        }
        assert_eq!(session_released(&server), released, "after {how}");
        assert_eq!(state_of(&mut c, "k"), "held", "after {how}");
        assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
    }
}

/// Sends `commands` pipelined and checks that no reply is an error.
fn pipeline(c: &mut Conn, commands: &[Vec<String>]) {
    for batch in commands.chunks(200) {
        for command in batch {
            c.send(command);
        }
        for command in batch {
            let reply = c.read();
            assert!(!reply.is_error(), "{command:?}: {reply:?}");
        }
    }
}

/// A SET, SUNIONSTORE or BITOP over a session lock (which the module hears nothing of) frees
/// its value, and with it the session: its connection, still open, keeps nothing of a lock that
/// is gone, while the value written over it lives.
#[test]
fn a_session_lock_written_over_keeps_nothing_of_its_session() {
    const LOCKS: usize = 1_000;
    let server = Server::start();
    let mut holder = server.conn();
    let mut c = server.conn();
    assert_eq!(c.call(&["SADD", "members", "m"]), Reply::Int(1));
    assert_eq!(c.call(&["SET", "bits", "x"]), Reply::status("OK"));
    // Takes LOCKS locks named after `round`, with SESSION or not, writes over each, and tells
    // how much memory that took.
    let mut round = |round: &str, session: bool| -> i64 {
        let before = server.info_int("used_memory");
        let keys: Vec<String> = (0..LOCKS)
            .map(|i| format!("{round}:{i}:{}", "k".repeat(4096)))
            .collect();
        let acquires: Vec<Vec<String>> = keys
            .iter()
            .map(|key| {
                let mut command = vec!["LOCK.ACQUIRE".into(), key.clone(), "t".into()];
                command.push("60000".into());
                if session {
                    command.push("SESSION".into());
                }
                command
            })
            .collect();
        pipeline(&mut holder, &acquires);
        let overwrites: Vec<Vec<String>> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let words: Vec<&str> = match i % 3 {
                    0 => vec!["SET", key, "v"],
                    1 => vec!["SUNIONSTORE", key, "members"],
                    _ => vec!["BITOP", "OR", key, "bits"],
                };
                words.into_iter().map(String::from).collect()
            })
            .collect();
        pipeline(&mut c, &overwrites);
        assert_eq!(server.info_int("lock_keys"), 0);
        server.info_int("used_memory") - before
    };
    round("warm-up", true);
    let plain = round("plain", false);
    let with_sessions = round("session", true);
    // Kept, the sessions took two copies of each 4 KiB key name: 8 MB.
    assert!(
        with_sessions - plain < 1 << 20,
        "{LOCKS} session locks written over took {with_sessions} bytes, plain locks {plain}"
    );
    close(&server, holder);
    assert_eq!(session_released(&server), 0);
}
