//! An exclusive holder's renewal travels to replicas and the AOF as its new deadline alone
//! (`LOCK.APPLY key renew:fence:floor:n:deadline`), and a lock that is not the one renewed
//! refuses it and stays as it was.

mod common;

use std::path::PathBuf;

use common::*;

const TOKEN: &str = "renewal-effect-token-4b1d";

/// The newest incremental file of the server's multi-part AOF.
fn incr_aof(server: &Server) -> PathBuf {
    let dir = server.dir().join("appendonlydir");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    files.sort();
    files.pop().expect("an incremental AOF file")
}

/// The state argument of every `LOCK.APPLY` in an AOF without an RDB preamble, in order.
fn applied_states(aof: &[u8]) -> Vec<Vec<u8>> {
    let mut states = Vec::new();
    let mut rest = aof;
    let marker = b"$10\r\nLOCK.APPLY\r\n";
    while let Some(at) = rest.windows(marker.len()).position(|w| w == marker) {
        rest = &rest[at + marker.len()..];
        // The key, then the state: `$len\r\nbytes\r\n` each.
        let mut bulk = || -> Vec<u8> {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").expect("length");
            let len: usize = std::str::from_utf8(&rest[1..line_end])
                .expect("utf-8 length")
                .parse()
                .expect("a length");
            let bytes = rest[line_end + 2..line_end + 2 + len].to_vec();
            rest = &rest[line_end + 2 + len + 2..];
            bytes
        };
        bulk();
        states.push(bulk());
    }
    states
}

fn aof_config() -> Config {
    Config::default()
        .with("appendonly", "yes")
        .with("aof-use-rdb-preamble", "no")
        .with("appendfsync", "always")
}

#[test]
fn a_renewal_travels_as_its_deadline_and_replays_exactly_on_a_replica_and_from_the_aof() {
    let mut primary = Server::start_with(aof_config());
    let replica = Server::start();
    replica.replicate_from(&primary);
    let mut c = primary.conn();
    // A name and a label: the grant's whole state would carry them again.
    assert_eq!(
        c.call(&["CLIENT", "SETNAME", "renewing-worker"]),
        Reply::status("OK")
    );
    let fence = acquire_with(&mut c, "k", TOKEN, 600_000, &["LABEL", "payments"]);
    let Reply::Int(fence) = fence else {
        panic!("acquire: {fence:?}")
    };
    let granted = digest_value(&mut c, "k");
    assert_eq!(c.call(&["LOCK.RENEW", "k", TOKEN, "700000"]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RENEW", "k", TOKEN, "800000"]), Reply::Int(1));
    let renewed = digest_value(&mut c, "k");
    assert_ne!(renewed, granted, "a renewal changes the deadline");
    let whole = c.call(&["DEBUG", "DIGEST"]).text();

    // In the AOF: the grant's whole state, then two renewals of its deadline alone.
    let aof = std::fs::read(incr_aof(&primary)).expect("read the AOF");
    let states = applied_states(&aof);
    assert_eq!(states.len(), 3, "{states:?}");
    assert!(states[0].starts_with(format!("acquire:{fence}:").as_bytes()));
    for state in &states[1..] {
        let text = String::from_utf8(state.clone()).expect("a renewal is text");
        let fields: Vec<&str> = text.split(':').collect();
        assert_eq!(fields.len(), 5, "{text}");
        assert_eq!(
            fields[..4],
            ["renew", &fence.to_string(), "", "n"],
            "{text}"
        );
        let deadline: u64 = fields[4].parse().expect("a deadline");
        assert!(deadline > now_ms() + 650_000, "{text}");
    }

    // The replica has the same lock, deadline included.
    wait_replica_caught_up(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(digest_value(&mut r, "k"), renewed, "replica");
    assert_eq!(
        r.call(&["DEBUG", "DIGEST"]).text(),
        whole,
        "replica DEBUG DIGEST"
    );

    // The AOF replayed, by DEBUG LOADAOF and by a restart.
    assert_eq!(c.call(&["DEBUG", "LOADAOF"]), Reply::status("OK"));
    assert_eq!(digest_value(&mut c, "k"), renewed, "after DEBUG LOADAOF");
    drop(c);
    primary.shutdown_and_restart();
    let mut c = primary.conn();
    assert_eq!(digest_value(&mut c, "k"), renewed, "after a restart");
    assert_eq!(c.call(&["DEBUG", "DIGEST"]).text(), whole, "DEBUG DIGEST");
}

#[test]
fn a_renewal_of_a_grant_the_lock_does_not_have_changes_nothing() {
    let mut server = Server::start_with(aof_config());
    let mut c = server.conn();
    let Reply::Int(fence) = acquire_with(&mut c, "k", TOKEN, 600_000, &[]) else {
        panic!("acquire")
    };
    assert!(acquire_with(&mut c, "shared", TOKEN, 600_000, &["SHARED"]).is_int());
    let locks = ["k", "shared"].map(|key| digest_value(&mut c, key));
    drop(c);
    server.shutdown();
    // Renewals no primary of these locks could have sent: another grant's fence, shared
    // holders, no lock at all.
    let wrong = [
        ("k", format!("renew:{}::n:99999999999999", fence + 1)),
        ("k", format!("renew:{}::n:99999999999999", fence - 1)),
        ("shared", "renew:2::n:99999999999999".to_string()),
        ("missing", "renew:5::n:99999999999999".to_string()),
    ];
    let mut appended = Vec::new();
    for (key, state) in &wrong {
        appended.extend_from_slice(
            format!(
                "*3\r\n$10\r\nLOCK.APPLY\r\n${}\r\n{key}\r\n${}\r\n{state}\r\n",
                key.len(),
                state.len()
            )
            .as_bytes(),
        );
    }
    let path = incr_aof(&server);
    let mut aof = std::fs::read(&path).expect("read the AOF");
    aof.extend_from_slice(&appended);
    std::fs::write(&path, aof).expect("write the AOF");
    server.restart();
    let mut c = server.conn();
    assert_eq!(
        ["k", "shared"].map(|key| digest_value(&mut c, key)),
        locks,
        "the locks as they were"
    );
    assert_eq!(c.call(&["EXISTS", "missing"]), Reply::Int(0));
}
