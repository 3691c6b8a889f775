//! Scenario: a holder process stopped with SIGSTOP past its lease.

use crate::clients::{run_load, standard_load, Shared};
use crate::common::*;
use crate::history::{Grant, Mode, Stamp};
use crate::oracle::{oracle_write_tcp, OracleServer};
use crate::report::report;
use crate::{params, StopOnDrop};

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

/// The client process of `paused_holder_is_fenced_off`: takes the lock, reports its fence,
/// "works" (the parent stops it with SIGSTOP meanwhile), then writes to the oracle and tries to
/// renew and release. Does nothing unless started by that test.
#[test]
fn chaos_child_holder_process() {
    let Ok(role) = std::env::var("CHAOS_CHILD") else {
        return;
    };
    assert_eq!(role, "holder");
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name}"));
    let port: u16 = env("CHAOS_PORT").parse().expect("port");
    let oracle: u16 = env("CHAOS_ORACLE").parse().expect("oracle port");
    let key = env("CHAOS_KEY");
    let token = env("CHAOS_TOKEN");
    let ttl = env("CHAOS_TTL");
    let mut conn = Conn::connect(port, Duration::from_secs(5)).expect("connect");
    let fence = match conn.call(&["LOCK.ACQUIRE", &key, &token, &ttl, "WAIT", "5000"]) {
        Reply::Int(f) => f,
        other => {
            println!("CHAOS NOGRANT {other:?}");
            return;
        }
    };
    println!("CHAOS FENCE {fence}");
    // "Work": the parent stops this process here, past the end of the lease.
    sleep(Duration::from_millis(600));
    let written = oracle_write_tcp(oracle, &key, fence as u64);
    println!("CHAOS WRITE {written:?}");
    let renew = conn.call(&["LOCK.RENEW", &key, &token, &ttl]);
    println!("CHAOS RENEW {}", renew.int());
    let release = conn.call(&["LOCK.RELEASE", &key, &token]);
    println!("CHAOS RELEASE {}", release.int());
}

/// The full name libtest gives `chaos_child_holder_process`: its module path without the crate
/// name (`paused_holder::chaos_child_holder_process`), for `--exact`.
fn child_test_name() -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::chaos_child_holder_process")
}

/// Lines starting with `CHAOS ` from a child's stdout, through a channel (reads are bounded).
fn child_lines(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print "test name ... " on the same line first.
            if let Some(at) = line.find("CHAOS ") {
                if tx.send(line[at + 6..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// One round: a child process takes `key`, is stopped past its lease, another client takes the
/// lock and writes; the child resumes and writes with its old fence.
fn paused_holder_round(
    sh: &Shared,
    server_port: u16,
    oracle_port: u16,
    key: &str,
    round: usize,
) -> std::io::Result<()> {
    let ttl = 150u64;
    let token = format!("paused-{key}-{round}");
    let start = Stamp::now();
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            &child_test_name(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CHAOS_CHILD", "holder")
        .env("CHAOS_PORT", server_port.to_string())
        .env("CHAOS_ORACLE", oracle_port.to_string())
        .env("CHAOS_KEY", key)
        .env("CHAOS_TOKEN", &token)
        .env("CHAOS_TTL", ttl.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let lines = child_lines(child.stdout.take().expect("child stdout"));
    let next = |what: &str| {
        lines
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| format!("TIMEOUT waiting for {what}"))
    };
    let first = next("fence");
    if let Some(fence) = first.strip_prefix("FENCE ") {
        let mut stopped = Stopped::stop(child.id());
        let end = Stamp::now();
        let fence: u64 = fence.parse().expect("fence");
        sh.history.add_grant(Grant {
            key: key.to_string(),
            fence,
            mode: Mode::Exclusive,
            start,
            end,
            live_until: start + Duration::from_millis(ttl),
        });
        // Someone else gets the lock after the lease ran out, and writes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while sh.oracle.highest(key) <= fence && Instant::now() < deadline {
            sleep(Duration::from_millis(5));
        }
        let taken_over = sh.oracle.highest(key) > fence;
        if !taken_over {
            sh.history.note(format!(
                "paused holder {key}#{round}: nobody took over in 10 s"
            ));
        }
        stopped.resume();
        let write = next("write");
        let renew = next("renew");
        let release = next("release");
        PAUSED_WRITES.fetch_add(1, Relaxed);
        if taken_over && write != "WRITE Some(false)" {
            PAUSED_NOT_REJECTED.fetch_add(1, Relaxed);
            sh.history.note(format!(
                "paused holder {key}#{round}: {write}, expected a reject"
            ));
        }
        sh.history.i5(renew != "RENEW 0");
        sh.history.i5(release != "RELEASE 0");
    } else {
        sh.history
            .note(format!("paused holder {key}#{round}: {first}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
        sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

static PAUSED_WRITES: AtomicU64 = AtomicU64::new(0);
static PAUSED_NOT_REJECTED: AtomicU64 = AtomicU64::new(0);

#[test]
fn paused_holder_is_fenced_off() {
    let p = params();
    let started = Instant::now();
    let server = Server::start();
    let mut load = standard_load("ph");
    load.keys.truncate(3);
    load.clients = load.clients.min(8);
    load.queue_pct = 100;
    load.slow_pct = 0;
    load.abandon_pct = 0;
    load.ttl_ms = (20, 120);
    let sh = Shared::new(server.port, load);
    let listener = TcpListener::bind("127.0.0.1:0").expect("oracle port");
    let oracle_port = listener.local_addr().expect("addr").port();
    let front = OracleServer {
        port: oracle_port,
        stop: AtomicBool::new(false),
    };
    thread::scope(|s| {
        OracleServer::serve(s, &sh.oracle, &front, listener);
        let _stop_front = StopOnDrop(&front.stop);
        run_load(&sh, || {
            thread::scope(|lanes| {
                for key in sh.load.keys.clone() {
                    let sh = &sh;
                    let port = server.port;
                    let oracle_port = front.port;
                    lanes.spawn(move || {
                        for round in 0..p.holder_rounds.div_ceil(3) {
                            paused_holder_round(sh, port, oracle_port, &key, round)
                                .expect("spawn the holder process");
                            sh.history.faults.fetch_add(1, Relaxed);
                        }
                    });
                }
            });
        });
    });
    let mut rep = report("paused-holder", &sh, started, &[server.log()]);
    let writes = PAUSED_WRITES.load(Relaxed);
    let not_rejected = PAUSED_NOT_REJECTED.load(Relaxed);
    rep.notes.insert(
        0,
        format!(
            "stopped holders' late writes: {writes}, rejected {}",
            writes - not_rejected
        ),
    );
    // A late write that got through is an I1 matter for the store and a safety failure here.
    rep.i[0] += not_rejected;
    assert!(
        writes > 0,
        "no paused holder completed a round: {:?}",
        rep.notes
    );
    rep.finish(&[1, 2, 3, 4, 5]);
}
