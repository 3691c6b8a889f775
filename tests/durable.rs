//! `FSYNC timeout-ms`: the reply of LOCK.ACQUIRE (and LOCK.RENEW) waits until the change is
//! fsynced to this server's AOF, so a grant a client acts on survives a crash of the machine; a
//! grant not fsynced in time is taken back and the client gets an error, as with SYNC. The
//! module fsyncs the AOF files itself (no server tells a module how far its AOF is fsynced), so
//! this holds whatever `appendfsync` says: these tests use `appendfsync no`, where Redis itself
//! never fsyncs.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

fn aof_server() -> Server {
    Server::start_with(
        Config::default()
            .with("appendonly", "yes")
            .with("appendfsync", "no"),
    )
}

fn aof_dir(server: &Server) -> PathBuf {
    server.dir().join("appendonlydir")
}

/// Everything in the AOF's incremental files.
fn incremental_aof(server: &Server) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(aof_dir(server)).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".incr.aof") {
            text.push_str(&String::from_utf8_lossy(&std::fs::read(path).unwrap()));
        }
    }
    text
}

#[test]
fn a_grant_is_answered_once_its_effect_is_fsynced_to_the_aof() {
    let server = aof_server();
    let mut c = server.conn();
    let started = Instant::now();
    let fence = c
        .call(&["LOCK.ACQUIRE", "durable", "t", "60000", "FSYNC", "5000"])
        .int();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(fence > 0);
    assert!(server.info_int("lock_fsyncs") >= 1);
    assert_eq!(server.info_int("lock_sync_confirmed"), 1);
    assert_eq!(server.info_int("lock_fsync_errors"), 0);
    // The effect is in the AOF file the module fsynced.
    let aof = incremental_aof(&server);
    assert!(
        aof.contains("LOCK.APPLY") && aof.contains("durable"),
        "{aof}"
    );
    // A renewal waits the same way; FSYNC beside WAIT for a queued acquirer too.
    assert_eq!(
        c.call(&["LOCK.RENEW", "durable", "t", "60000", "FSYNC", "5000"]),
        Reply::Int(1)
    );
    let mut waiter = server.conn();
    waiter.send(&[
        "LOCK.ACQUIRE",
        "durable",
        "next",
        "60000",
        "WAIT",
        "5000",
        "FSYNC",
        "5000",
    ]);
    wait_blocked(&server, 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "durable", "t"]), Reply::Int(1));
    assert!(waiter.read().int() > fence);
    assert_eq!(server.info_int("lock_sync_confirmed"), 3);
}

#[test]
fn many_clients_at_once_share_fsyncs() {
    let server = aof_server();
    let clients: Vec<Conn> = (0..20)
        .map(|i| {
            let mut c = server.conn();
            c.send(&[
                "LOCK.ACQUIRE",
                &format!("k{i}"),
                "t",
                "60000",
                "FSYNC",
                "5000",
            ]);
            c
        })
        .collect();
    for mut c in clients {
        assert!(c.read().int() > 0);
    }
    assert_eq!(server.info_int("lock_sync_confirmed"), 20);
    let fsyncs = server.info_int("lock_fsyncs");
    assert!((1..=20).contains(&fsyncs), "{fsyncs}");
}

#[test]
fn a_grant_not_fsynced_in_time_is_taken_back_and_a_renewal_reported() {
    let server = aof_server();
    let mut c = server.conn();
    let before = acquire(&mut c, "held", "t", 60_000);
    // The AOF's files are not where the manifest says (the server keeps writing through the
    // descriptor it has): nothing can be confirmed fsynced.
    let away = server.dir().join("appendonlydir.away");
    std::fs::rename(aof_dir(&server), &away).unwrap();
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "60000", "FSYNC", "200"]),
        Reply::error("ERR the grant was not fsynced to the AOF within 200 ms and was undone")
    );
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(
        c.call(&["LOCK.RENEW", "held", "t", "60000", "FSYNC", "200"]),
        Reply::error(
            "ERR the change was not fsynced to the AOF within 200 ms: a crash of this machine may \
             lose it"
        )
    );
    assert_eq!(fence_of(&mut c, "held"), before);
    assert_eq!(state_of(&mut c, "held"), "held");
    assert!(server.info_int("lock_fsync_errors") > 0);
    assert_eq!(server.info_int("lock_sync_failed"), 2);
    // Back in place: confirmed again.
    std::fs::rename(&away, aof_dir(&server)).unwrap();
    let fence = c
        .call(&["LOCK.ACQUIRE", "k", "t", "60000", "FSYNC", "5000"])
        .int();
    assert!(fence > before);
    // SYNC and FSYNC together: the replicas' part missing is reported as for SYNC alone.
    assert_eq!(
        c.call(&[
            "LOCK.ACQUIRE",
            "k2",
            "t",
            "60000",
            "SYNC",
            "1",
            "100",
            "FSYNC",
            "5000"
        ]),
        Reply::error(
            "NOREPLICAS the grant was not acknowledged by 1 replica(s) within 100 ms and was \
             undone"
        )
    );
    assert_eq!(state_of(&mut c, "k2"), "free");
}

#[test]
fn fsync_is_refused_where_it_cannot_be_kept_and_bad_values_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "100"]),
        Reply::error("ERR FSYNC needs appendonly yes")
    );
    assert_eq!(
        c.call(&["LOCK.RENEW", "k", "t", "1000", "FSYNC", "100"]),
        Reply::error("ERR FSYNC needs appendonly yes")
    );
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    drop(c);
    let server = aof_server();
    let mut c = server.conn();
    refused_in_multi_and_script(
        &mut c,
        &["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "100"],
        "ERR FSYNC cannot wait inside MULTI or a script; send WAITAOF after EXEC instead",
    );
    for (args, error) in [
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC"],
            "ERR invalid FSYNC timeout-ms: missing after FSYNC",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "0"],
            "ERR invalid FSYNC timeout-ms: must be positive",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "x"],
            "ERR invalid FSYNC timeout-ms: not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "35184372088833"],
            "ERR invalid FSYNC timeout-ms: too large",
        ),
        (
            vec![
                "LOCK.ACQUIRE",
                "k",
                "t",
                "1000",
                "FSYNC",
                "10",
                "FSYNC",
                "10",
            ],
            "ERR option FSYNC given more than once",
        ),
        (
            vec!["LOCK.RENEW", "k", "t", "1000", "FSYNC"],
            "ERR invalid FSYNC timeout-ms: missing after FSYNC",
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "k", "t", "1000", "FSYNC", "10"],
            "ERR option FSYNC is not supported by LOCK.MACQUIRE",
        ),
    ] {
        assert_eq!(c.call(&args), Reply::error(error), "{args:?}");
    }
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    assert_eq!(server.info_int("lock_fsyncs"), 0);
}
