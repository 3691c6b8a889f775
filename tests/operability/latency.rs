//! Latency summaries of `INFO lock`: acquire wait and hold time.

use crate::common::*;
use crate::{lock_fields, LATENCIES};

use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::{Duration, Instant};

fn latencies(server: &Server) -> BTreeMap<String, i64> {
    lock_fields(server)
        .into_iter()
        .filter(|(name, _)| LATENCIES.contains(&name.as_str()))
        .collect()
}

/// p50 <= p99 <= max for both summaries.
fn assert_ordered(l: &BTreeMap<String, i64>) {
    for what in ["acquire_wait", "hold"] {
        let get = |q: &str| l[&format!("lock_{what}_{q}_us")];
        assert!(
            0 <= get("p50") && get("p50") <= get("p99") && get("p99") <= get("max"),
            "{what}: {l:?}"
        );
    }
}

#[test]
fn latency_summaries_are_zero_on_a_fresh_server() {
    let server = Server::start();
    let l = latencies(&server);
    assert_eq!(l.len(), 6, "{l:?}");
    assert!(l.values().all(|v| *v == 0), "{l:?}");
}

#[test]
fn acquire_wait_summary_records_a_waiter_that_waited_200ms() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    let mut w = queue_waiter(&server, "k", "b", 60_000, 5_000);
    let queued = Instant::now();
    // A deliberate wait: the point is its duration.
    sleep(Duration::from_millis(200).saturating_sub(queued.elapsed()));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    granted(&mut w);
    let l = latencies(&server);
    assert!(
        (150_000..10_000_000).contains(&l["lock_acquire_wait_max_us"]),
        "{l:?}"
    );
    // The other sample is the immediate grant: far below the wait.
    assert!(l["lock_acquire_wait_p50_us"] < 150_000, "{l:?}");
    assert_ordered(&l);
}

#[test]
fn hold_summary_records_a_lock_held_200ms_on_an_existing_key() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    acquire(&mut c, "k", "b", 60_000);
    let granted_at = Instant::now();
    sleep(Duration::from_millis(200));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "b"]), Reply::Int(1));
    let held_for = granted_at.elapsed();
    let l = latencies(&server);
    let max = l["lock_hold_max_us"];
    assert!((150_000..10_000_000).contains(&max), "{l:?}");
    assert!(
        max <= held_for.as_micros() as i64 + 50_000,
        "{l:?} vs {held_for:?}"
    );
    assert_ordered(&l);
}

#[test]
fn hold_summary_records_a_lock_held_200ms_on_a_new_key() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "a", 60_000);
    sleep(Duration::from_millis(200));
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "a"]), Reply::Int(1));
    let l = latencies(&server);
    assert!(
        (150_000..10_000_000).contains(&l["lock_hold_max_us"]),
        "{l:?}"
    );
    assert_ordered(&l);
}

#[test]
fn latency_summaries_stay_ordered_over_many_samples() {
    let server = Server::start();
    let mut c = server.conn();
    acquire(&mut c, "k", "t", 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    for i in 0..50 {
        let token = format!("t{i}");
        acquire(&mut c, "k", &token, 60_000);
        assert_eq!(c.call(&["LOCK.RELEASE", "k", &token]), Reply::Int(1));
        assert_ordered(&latencies(&server));
    }
    let l = latencies(&server);
    assert!(l["lock_hold_max_us"] > 0, "{l:?}");
    assert!(l["lock_hold_max_us"] < 10_000_000, "{l:?}");
}
