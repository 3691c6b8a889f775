//! A loss is reported through `on_lost` exactly once, by whichever thread sees it first: the
//! watchdog, the caller's `check()`/`fenced()`/`is_lost()`/`renew()`/`guarded()`, or the release
//! after it. One test stops a whole worker process (SIGSTOP) past its lease.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use common::{lock_info, wait_for, Conn, Reply, Server};
use redis_lock_client::{Error, Lock, LockGuard, LostReason};
use support::{client, renews, Pause};

type Calls = Arc<Mutex<Vec<(LostReason, ThreadId)>>>;

/// A lock whose `on_lost` records each call with its thread.
fn counting(server: &Server, key: &str, ttl: Duration) -> (Lock, Calls) {
    let calls: Calls = Arc::default();
    let record = Arc::clone(&calls);
    let lock = Lock::new(client(server), key, ttl).on_lost(move |why| {
        record
            .lock()
            .expect("calls")
            .push((why, thread::current().id()))
    });
    (lock, calls)
}

fn reasons(calls: &Calls) -> Vec<LostReason> {
    calls.lock().expect("calls").iter().map(|c| c.0).collect()
}

/// Whether the server still has a holder on `key`.
fn held(conn: &mut Conn, key: &str) -> bool {
    lock_info(conn, key).is_some_and(|fields| {
        fields
            .iter()
            .any(|(name, value)| name == "state" && value.text() == "held")
    })
}

// The caller notices first: the watchdog is stalled past the lease, the caller's fenced() sees
// the loss (on_lost from the caller's thread), then release() stops the watchdog before it
// resumes; nothing more is reported and no renewal is sent.
#[test]
fn caller_noticing_first_reports_the_loss_once() {
    let server = Server::start();
    let mut conn = server.conn();
    let pause = Pause::at_round(0);
    let (lock, calls) = counting(&server, "first:1", Duration::from_millis(300));
    let lock = lock.watchdog(true).before_renewal(pause.hook());
    let guard = lock.acquire().expect("acquire");
    pause.wait_reached();
    wait_for("the lease to end on the server", || {
        (!held(&mut conn, "first:1")).then_some(())
    });
    let ran = AtomicBool::new(false);
    let outcome = guard.fenced(|_| ran.store(true, Ordering::SeqCst));
    assert!(matches!(outcome, Err(Error::Lost)), "{outcome:?}");
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(
        *calls.lock().expect("calls"),
        vec![(LostReason::LeaseExpired, thread::current().id())],
        "reported by the caller's check"
    );
    let releaser = thread::spawn(move || guard.release());
    // Release is waiting for the stalled watchdog; let it go.
    pause.go();
    let released = releaser.join().expect("releaser");
    assert!(!released.expect("release"));
    assert_eq!(reasons(&calls), vec![LostReason::LeaseExpired], "once");
    assert_eq!(renews(&server), 0);
}

// Every other path: the watchdog first, release after the loss, renew, guarded, the local
// lease running out (is_lost() alone), and drop after the loss. Each reports exactly once.
#[test]
fn every_path_reports_the_loss_once() {
    let server = Server::start();
    let mut conn = server.conn();
    let force = |conn: &mut Conn, key: &str| {
        assert_eq!(conn.call(&["LOCK.FORCERELEASE", key]), Reply::Int(1));
    };

    // The watchdog notices a force-release; the caller's checks and release add nothing.
    let (lock, calls) = counting(&server, "path:watchdog", Duration::from_millis(300));
    let guard = lock.watchdog(true).acquire().expect("acquire");
    force(&mut conn, "path:watchdog");
    wait_for("the watchdog's report", || {
        (!calls.lock().expect("calls").is_empty()).then_some(())
    });
    assert_ne!(calls.lock().expect("calls")[0].1, thread::current().id());
    assert!(matches!(guard.check(), Err(Error::Lost)));
    assert!(guard.is_lost());
    assert!(!guard.release().expect("release"));
    assert_eq!(reasons(&calls), vec![LostReason::NotHeld], "watchdog");

    // release() finds the token gone: nothing could know it before.
    let (lock, calls) = counting(&server, "path:release", Duration::from_secs(10));
    let guard = lock.acquire().expect("acquire");
    force(&mut conn, "path:release");
    assert!(!guard.is_lost());
    assert!(!guard.release().expect("release"));
    assert_eq!(reasons(&calls), vec![LostReason::NotHeld], "release");

    // The same through drop.
    let (lock, calls) = counting(&server, "path:drop", Duration::from_secs(10));
    let guard = lock.acquire().expect("acquire");
    force(&mut conn, "path:drop");
    drop(guard);
    assert_eq!(reasons(&calls), vec![LostReason::NotHeld], "drop");

    // renew() is refused; fenced() and release() after it add nothing.
    let (lock, calls) = counting(&server, "path:renew", Duration::from_secs(10));
    let guard = lock.acquire().expect("acquire");
    force(&mut conn, "path:renew");
    assert!(matches!(guard.renew(), Err(Error::Lost)));
    assert!(matches!(guard.fenced(|f| f), Err(Error::Lost)));
    assert!(!guard.release().expect("release"));
    assert_eq!(reasons(&calls), vec![LostReason::NotHeld], "renew");

    // guarded() is refused by the server's fence check.
    let (lock, calls) = counting(&server, "path:guarded", Duration::from_secs(10));
    let guard = lock.acquire().expect("acquire");
    force(&mut conn, "path:guarded");
    common::acquire(&mut conn, "path:guarded", "other-token", 30_000);
    let refused = guard.guarded::<()>(redis::cmd("SET").arg("path:data").arg("x"));
    assert!(matches!(refused, Err(Error::Lost)), "{refused:?}");
    assert!(!guard.release().expect("release"));
    assert_eq!(reasons(&calls), vec![LostReason::NotHeld], "guarded");

    // The local lease runs out: is_lost() says so without any other call, and reports it.
    let (lock, calls) = counting(&server, "path:lease", Duration::from_millis(50));
    let guard = lock.acquire().expect("acquire");
    wait_for("the lease to end on the server", || {
        (!held(&mut conn, "path:lease")).then_some(())
    });
    assert!(reasons(&calls).is_empty());
    assert!(guard.is_lost());
    assert_eq!(guard.lost_reason(), Some(LostReason::LeaseExpired));
    assert_eq!(reasons(&calls), vec![LostReason::LeaseExpired], "is_lost");
    assert!(!guard.release().expect("release"));
    assert_eq!(
        reasons(&calls),
        vec![LostReason::LeaseExpired],
        "then release"
    );

    // A grant released while held is never reported.
    let (lock, calls) = counting(&server, "path:held", Duration::from_millis(300));
    let guard = lock.watchdog(true).acquire().expect("acquire");
    assert!(guard.release().expect("release"));
    assert!(reasons(&calls).is_empty());
}

/// The worker process of the stall test: this test binary again, running only
/// `stalled_worker` with `STALLED_WORKER=port key ttl-ms` in its environment.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    fn start(port: u16, key: &str, ttl_ms: u64) -> Worker {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["stalled_worker", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("STALLED_WORKER", format!("{port} {key} {ttl_ms}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the worker");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness's "test stalled_worker ... " may start the first line.
                if let Some((_, event)) = line.split_once("worker: ") {
                    if tx.send(event.to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Worker {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next event line starting with `prefix` (bounded wait).
    fn until(&mut self, prefix: &str) -> String {
        let end = Instant::now() + common::PATIENCE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => panic!("no {prefix:?} line from the worker; saw {:?}", self.seen),
            }
        }
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on our own child's pid, which we have not waited for yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {signal}");
    }

    /// The worker's exit, within a bounded wait.
    fn exit_code(&mut self) -> Option<i32> {
        let end = Instant::now() + common::PATIENCE;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            thread::sleep(Duration::from_millis(5));
        }
        panic!("the worker did not exit; saw {:?}", self.seen)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

// The whole process stalls (SIGSTOP) until its lease has ended on the server and another client
// holds the lock, then resumes (SIGCONT): the watchdog and the worker's own fenced() loop wake
// together, and exactly one of them reports the loss.
#[test]
fn a_whole_process_stall_reports_the_loss_once() {
    let server = Server::start();
    let mut conn = server.conn();
    let mut worker = Worker::start(server.port, "stall:proc", 300);
    let fence: i64 = worker
        .until("acquired ")
        .trim_start_matches("acquired ")
        .parse()
        .expect("fence");
    worker.signal(libc::SIGSTOP);
    wait_for("the stopped worker's lease to end on the server", || {
        (!held(&mut conn, "stall:proc")).then_some(())
    });
    let other = common::acquire(&mut conn, "stall:proc", "other-token", 30_000);
    assert!(other > fence);
    worker.signal(libc::SIGCONT);
    let calls = worker.until("on_lost calls ");
    assert_eq!(worker.exit_code(), Some(0), "{:?}", worker.seen);
    let seen = &worker.seen;
    assert!(seen.iter().any(|l| l == "lost-seen"), "{seen:?}");
    assert!(seen.iter().any(|l| l == "released false"), "{seen:?}");
    let reports = seen
        .iter()
        .filter(|l| l.starts_with("on_lost-called "))
        .count();
    assert_eq!(reports, 1, "{seen:?}");
    assert_eq!(calls, "on_lost calls 1", "{seen:?}");
    assert_eq!(
        conn.call(&["LOCK.FENCE", "stall:proc", &other.to_string()]),
        Reply::Int(1)
    );
}

/// Run by `a_whole_process_stall_reports_the_loss_once` in a child process (ignored otherwise):
/// holds the lock with the watchdog on and works in a busy loop that checks it with fenced()
/// between steps, printing each event as a `worker: ` line.
#[test]
#[ignore = "the worker process of a_whole_process_stall_reports_the_loss_once"]
fn stalled_worker() {
    let Ok(spec) = std::env::var("STALLED_WORKER") else {
        return;
    };
    let say = |line: String| println!("worker: {line}");
    let parts: Vec<&str> = spec.split(' ').collect();
    let (port, key, ttl_ms) = (parts[0], parts[1], parts[2].parse().expect("ttl"));
    let calls = Arc::new(Mutex::new(0u32));
    let counted = Arc::clone(&calls);
    let url = format!("redis://127.0.0.1:{port}/");
    let lock = Lock::new(
        redis::Client::open(url).expect("client"),
        key,
        Duration::from_millis(ttl_ms),
    )
    .watchdog(true)
    .on_lost(move |why| {
        *counted.lock().expect("calls") += 1;
        let name = thread::current().name().unwrap_or("?").to_string();
        println!("worker: on_lost-called {name} {why:?}");
    });
    let guard: LockGuard = lock.acquire().expect("acquire");
    say(format!("acquired {}", guard.fence()));
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut work = 0u64;
    loop {
        match guard.fenced(|fence| (0..1000u64).fold(fence as u64, |a, b| a ^ b)) {
            Ok(step) => work = work.wrapping_add(step),
            Err(Error::Lost) => break,
            Err(e) => panic!("fenced: {e}"),
        }
        assert!(Instant::now() < give_up, "the lock was never lost ({work})");
    }
    say("lost-seen".to_string());
    say(format!("released {}", guard.release().expect("release")));
    say(format!("on_lost calls {}", *calls.lock().expect("calls")));
}
