//! Leader election against a real server: terms, proclaim, an observer that sees each change
//! once and in order, and a leader whose watchdog stalls past its lease, deposed and refused.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use common::{blocked, wait_for, Config, Reply, Server};
use redis_lock_client::{Election, Error, Leader};
use support::{client, Pause};

fn server() -> Server {
    Server::start_with(Config::default().with("notify-keyspace-events", "KA"))
}

/// Runs `Election::observe` in a thread; what it reports arrives on the channel.
struct Observer {
    stop: Arc<AtomicBool>,
    seen: mpsc::Receiver<Option<Leader>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Observer {
    fn start(server: &Server, name: &str) -> Observer {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, seen) = mpsc::channel();
        let (flag, redis) = (Arc::clone(&stop), client(server));
        let election = Election::new(client(server), name, Duration::from_secs(2));
        let thread = thread::spawn(move || {
            election
                .observe(&redis, &flag, Duration::from_millis(50), |leader| {
                    let _ = tx.send(leader);
                })
                .expect("observe");
        });
        Observer {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn next(&self) -> Option<Leader> {
        self.seen.recv_timeout(common::PATIENCE).expect("a change")
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn three_candidates_take_turns_and_the_observer_sees_each_change_once_in_order() {
    let server = server();
    let name = "leader:turns";
    let observer = Observer::start(&server, name);
    assert_eq!(observer.next(), None);
    let election = || Election::new(client(&server), name, Duration::from_secs(2));
    let a = election().campaign("node-a", None).expect("a leads");
    let mut conn = client(&server).get_connection().expect("conn");
    let a_id = election()
        .leader(&mut conn)
        .expect("leader")
        .expect("someone leads")
        .client_id;
    assert_eq!(
        observer.next(),
        Some(Leader {
            value: "node-a".into(),
            term: a.term(),
            client_id: a_id
        })
    );
    let (tx, terms) = mpsc::channel();
    let mut queued = Vec::new();
    for (n, value) in [(1, "node-b"), (2, "node-c")] {
        let (tx, candidate) = (tx.clone(), election());
        queued.push(thread::spawn(move || {
            let leadership = candidate.campaign(value, None).expect("campaign");
            tx.send(leadership.term()).expect("term");
            leadership
        }));
        wait_for("the candidate to queue", || {
            (blocked(&server) >= n).then_some(())
        });
    }
    a.proclaim("node-a-v2").expect("proclaim");
    let seen = observer.next().expect("a leads");
    assert_eq!((seen.value.as_str(), seen.term), ("node-a-v2", a.term()));
    let term_a = a.term();
    assert!(a.resign().expect("resign"));
    let term_b = terms.recv_timeout(common::PATIENCE).expect("b leads");
    let seen = observer.next().expect("b leads");
    assert_eq!((seen.value.as_str(), seen.term), ("node-b", term_b));
    assert!(term_b > term_a);
    let b = queued.remove(0).join().expect("b");
    assert!(b.resign().expect("resign"));
    let term_c = terms.recv_timeout(common::PATIENCE).expect("c leads");
    let seen = observer.next().expect("c leads");
    assert_eq!((seen.value.as_str(), seen.term), ("node-c", term_c));
    assert!(term_c > term_b);
    let c = queued.remove(0).join().expect("c");
    assert!(c.resign().expect("resign"));
    assert_eq!(observer.next(), None);
    thread::sleep(Duration::from_millis(300));
    assert!(observer.seen.try_recv().is_err(), "each change once");
}

#[test]
fn a_leader_stalled_past_its_lease_is_deposed_and_its_writes_are_refused() {
    let server = server();
    let name = "leader:stalled";
    let pause = Pause::at_round(0);
    let first = Election::new(client(&server), name, Duration::from_millis(300))
        .configure(|l| l.before_renewal(pause.hook()));
    let old = first.campaign("sleepy", None).expect("first leads");
    pause.wait_reached();
    let successor = Election::new(client(&server), name, Duration::from_secs(2));
    let new = successor
        .campaign("awake", Some(Duration::from_secs(5)))
        .expect("the successor leads once the lease ran out");
    assert!(new.term() > old.term());
    let _: () = new
        .guarded(
            redis::cmd("SET")
                .arg("leader:stalled:written")
                .arg(new.term()),
        )
        .expect("the new leader writes");
    // The old leader's write is refused, by the helper and by the server.
    let refused = old.guarded::<()>(
        redis::cmd("SET")
            .arg("leader:stalled:written")
            .arg(old.term()),
    );
    assert!(matches!(refused, Err(Error::Lost)), "{refused:?}");
    let mut conn = server.conn();
    support::stale_guarded_write_is_fenced(&mut conn, name, old.term(), "leader:stalled:written");
    assert_eq!(
        conn.call(&["GET", "leader:stalled:written"]),
        Reply::bulk(&new.term().to_string())
    );
    pause.go();
    assert!(!old.resign().expect("resign"));
    assert!(new.resign().expect("resign"));
}
