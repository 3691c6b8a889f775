//! Where tokens live: nowhere. The server keeps a digest of each token (src/lock/token.rs), so
//! no reply, DUMP payload, RDB or AOF file, replication stream or replica's MONITOR carries a
//! token another client could present; and a token given where something else belongs is
//! neither declared a key (ACL LOG) nor shown.

mod common;

use std::path::Path;

use common::*;

/// A token nobody could mistake for anything else, printable and binary.
const TOKEN: &str = "tok-n3ver-st0red-5e1d0a7c";
const BINARY: &[u8] = b"\x00bin\xfftok\r\n-n3ver";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every file under `dir`, read whole.
fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

fn assert_no_token_in_files(dir: &Path) {
    let files = files_under(dir);
    assert!(files.iter().any(|(name, _)| name.contains("appendonly")));
    for (name, bytes) in files {
        assert!(!contains(&bytes, TOKEN.as_bytes()), "the token in {name}");
        assert!(!contains(&bytes, BINARY), "the binary token in {name}");
    }
}

/// Every command shape that carries a token, each with [`TOKEN`] or [`BINARY`]: grants (plain,
/// reentrant, session, shared, permits, multi-key, queued and served), renewals, releases.
fn every_shape(server: &Server) {
    let mut c = server.conn();
    let t = TOKEN;
    acquire(&mut c, "plain", t, 600_000);
    assert!(acquire_with(&mut c, "plain", t, 600_000, &["REENTRANT"]).is_int());
    assert_eq!(c.call(&["LOCK.RENEW", "plain", t, "600000"]), Reply::Int(1));
    assert!(acquire_with(&mut c, "session", t, 600_000, &["SESSION", "LABEL", "x"]).is_int());
    for token in ["other", t] {
        assert!(acquire_with(&mut c, "shared", token, 600_000, &["SHARED"]).is_int());
        assert!(acquire_with(&mut c, "sem", token, 600_000, &["LIMIT", "3"]).is_int());
    }
    assert_eq!(c.call(&["LOCK.RELEASE", "shared", t]), Reply::Int(1));
    assert!(
        c.call(&["LOCK.MACQUIRE", "2", "m1", "m2", t, "600000"])
            .items()
            .len()
            == 2
    );
    assert_eq!(c.call(&["LOCK.MRELEASE", "1", "m1", t]), Reply::Int(1));
    // Queued behind another holder, then served.
    acquire(&mut c, "queued", "first", 600_000);
    let mut waiter = server.conn();
    waiter.send(&["LOCK.ACQUIRE", "queued", t, "600000", "WAIT", "5000"]);
    wait_blocked(server, 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "queued", "first"]), Reply::Int(1));
    assert!(waiter.read().int() > 0);
    let binary = c.call(&[&b"LOCK.ACQUIRE"[..], b"binary", BINARY, b"600000"]);
    assert!(binary.is_int(), "{binary:?}");
    // The holders still answer to their tokens.
    assert_eq!(
        c.call(&[&b"LOCK.RENEW"[..], b"binary", BINARY, b"600000"]),
        Reply::Int(1)
    );
    assert_eq!(c.call(&["LOCK.RENEW", "sem", t, "600000"]), Reply::Int(1));
}

#[test]
fn dump_rdb_aof_and_the_replication_stream_carry_only_digests() {
    for preamble in ["yes", "no"] {
        let primary = Server::start_with(
            Config::default()
                .with("appendonly", "yes")
                .with("aof-use-rdb-preamble", preamble)
                .with("appendfsync", "always"),
        );
        let mut tap = ReplicationTap::attach(&primary);
        let replica = Server::start();
        replica.replicate_from(&primary);
        let mut replica_monitor = replica.conn();
        assert_eq!(replica_monitor.call(&["MONITOR"]), Reply::status("OK"));
        every_shape(&primary);
        let mut c = primary.conn();
        // DUMP of every lock: what any user allowed DUMP gets.
        for key in [
            "plain", "session", "shared", "sem", "m2", "queued", "binary",
        ] {
            let dump = c.call(&["DUMP", key]);
            assert!(matches!(dump, Reply::Bulk(_)), "{key}: {dump:?}");
            assert!(
                !dump.contains_bytes(TOKEN.as_bytes()),
                "the token in DUMP {key}"
            );
            assert!(
                !dump.contains_bytes(BINARY),
                "the binary token in DUMP {key}"
            );
        }
        // The digest is what the value keeps.
        assert!(c
            .call(&["DUMP", "plain"])
            .contains_bytes(&token_digest(TOKEN.as_bytes())));
        c.call(&["SET", "end-of-stream", "x"]);
        let stream = tap.commands_until("SET");
        let text = format!("{stream:?}");
        assert!(text.contains("LOCK.APPLY"), "{text}");
        assert!(
            !text.contains(TOKEN),
            "the token in the replication stream: {text}"
        );
        assert!(
            !stream.iter().flatten().any(|arg| arg.as_bytes() == BINARY),
            "the binary token in the stream"
        );
        // Files: the AOF as written, after a rewrite, and an RDB (once the replica's full sync
        // no longer forks).
        wait_for("no child", || {
            (primary
                .info_field("persistence", "rdb_bgsave_in_progress")
                .as_deref()
                == Some("0"))
            .then_some(())
        });
        assert_eq!(c.call(&["SAVE"]), Reply::status("OK"));
        assert_no_token_in_files(primary.dir());
        assert_eq!(
            c.call(&["BGREWRITEAOF"]),
            Reply::status("Background append only file rewriting started")
        );
        wait_for("the rewrite", || {
            (primary
                .info_field("persistence", "aof_rewrite_in_progress")
                .as_deref()
                == Some("0")
                && primary.info_field("persistence", "aof_rewrites").as_deref() != Some("0"))
            .then_some(())
        });
        assert_no_token_in_files(primary.dir());
        // The replica follows (the same locks), and showed nothing in its MONITOR.
        wait_replica_caught_up(&primary, &replica);
        let mut r = replica.conn();
        for key in ["plain", "sem", "binary"] {
            assert_eq!(
                digest_value(&mut c, key),
                digest_value(&mut r, key),
                "{key}"
            );
        }
        assert_eq!(
            r.call(&["ECHO", "end-of-replica-monitor"]),
            Reply::bulk("end-of-replica-monitor")
        );
        loop {
            let line = replica_monitor.read().text();
            assert!(
                !line.contains(TOKEN),
                "the token in the replica's MONITOR: {line}"
            );
            if line.contains("end-of-replica-monitor") {
                break;
            }
        }
        assert!(!primary.log().contains(TOKEN));
        assert!(!replica.log().contains(TOKEN));
    }
}

/// What DUMP gives another client is of no use to it: the RESTOREd copy answers only to the
/// token, which the payload does not hold.
#[test]
fn a_dumped_lock_cannot_be_released_with_anything_in_its_payload() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = acquire(&mut c, "k", TOKEN, 600_000);
    let Reply::Bulk(dump) = c.call(&["DUMP", "k"]) else {
        panic!("DUMP");
    };
    let digest = token_digest(TOKEN.as_bytes());
    assert!(contains(&dump, &digest));
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"k", &digest]),
        Reply::Int(0)
    );
    assert_eq!(
        c.call(&[&b"RESTORE"[..], b"copy", b"0", &dump]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&[&b"LOCK.RELEASE"[..], b"copy", &digest]),
        Reply::Int(0)
    );
    assert_eq!(fence_of(&mut c, "k"), fence);
    assert_eq!(c.call(&["LOCK.RELEASE", "copy", TOKEN]), Reply::Int(1));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", TOKEN]), Reply::Int(1));
}

/// A user limited to `~lock:*` keys: a miscounted numkeys that would make the token a key
/// declares no key at all, so the server never names the token in ACL LOG or a NOPERM error;
/// the module refuses the call. A well-formed call on another key is still denied by key.
#[test]
fn a_miscounted_numkeys_never_makes_the_token_a_key() {
    let server = Server::start();
    let mut admin = server.conn();
    assert_eq!(
        admin.call(&[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">pw",
            "~lock:*",
            "+@all",
            "-@dangerous"
        ]),
        Reply::status("OK")
    );
    let mut c = server.conn();
    assert_eq!(c.call(&["AUTH", "app", "pw"]), Reply::status("OK"));
    acquire(&mut c, "lock:a", TOKEN, 600_000);
    let calls: [&[&str]; 5] = [
        &["LOCK.MRELEASE", "2", "lock:a", TOKEN],
        &["LOCK.MRELEASE", "3", "lock:a", "lock:b", TOKEN],
        &["LOCK.MACQUIRE", "2", "lock:a", TOKEN, "1000"],
        &["LOCK.MACQUIRE", "2", "lock:a", TOKEN, "1000", "WAIT", "10"],
        &[
            "LOCK.MACQUIRE",
            "3",
            "lock:a",
            "lock:b",
            TOKEN,
            "1000",
            "SESSION",
        ],
    ];
    for call in calls {
        let reply = c.call(call);
        let error = reply
            .error_bytes()
            .map(|e| String::from_utf8_lossy(e).into_owned());
        assert!(
            error.as_deref().is_some_and(|e| e.starts_with("ERR ")),
            "{call:?}: {reply:?}"
        );
        assert!(
            !reply.contains_bytes(TOKEN.as_bytes()),
            "{call:?}: {reply:?}"
        );
    }
    let log = admin.call(&["ACL", "LOG"]);
    assert!(
        !log.contains_bytes(TOKEN.as_bytes()),
        "the token in ACL LOG: {log:?}"
    );
    assert_eq!(log, Reply::Array(vec![]), "nothing was denied by key");
    // Keys are still checked when the call is well formed.
    let denied = c.call(&["LOCK.MRELEASE", "1", "other:x", TOKEN]);
    assert!(
        denied
            .error_bytes()
            .is_some_and(|e| e.starts_with(b"NOPERM")),
        "{denied:?}"
    );
    let log = admin.call(&["ACL", "LOG"]);
    assert!(log.contains_bytes(b"other:x"), "{log:?}");
    assert!(!log.contains_bytes(TOKEN.as_bytes()), "{log:?}");
    // The lock is still held: nothing above changed it.
    assert_eq!(state_of(&mut admin, "lock:a"), "held");
    assert_eq!(
        c.call(&["COMMAND", "GETKEYS", "LOCK.MRELEASE", "1", "lock:a", TOKEN]),
        Reply::Array(vec![Reply::bulk("lock:a")])
    );
}
