//! Handoff latency: the time from a holder sending `LOCK.RELEASE` to the queued waiter
//! receiving its grant, against the baseline of one `PING` round trip on the same server in
//! the same run. Run with `make bench` (or `cargo run --release --example handoff`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Conn, Reply, Server, PATIENCE};

const ROUNDS: usize = 2_000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn blocked_clients(probe: &mut Conn) -> i64 {
    let info = probe.call(&["INFO", "clients"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One PING round trip, many times.
fn round_trips(conn: &mut Conn) -> Vec<Duration> {
    let mut out = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        assert_eq!(conn.call(&["PING"]), Reply::status("PONG"));
        out.push(start.elapsed());
    }
    out.sort();
    out
}

/// Release-to-grant latency with a waiter already queued server-side.
fn handoffs(server: &Server) -> Vec<Duration> {
    let mut holder = server.conn();
    let mut probe = server.conn();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (granted_tx, granted_rx) = mpsc::channel::<Instant>();
    let port = server.port;
    let waiter = thread::spawn(move || {
        let mut conn = Conn::connect(port, PATIENCE).expect("connect");
        for _ in 0..ROUNDS {
            started_rx.recv().expect("go");
            conn.send(&["LOCK.ACQUIRE", "bench", "waiter", "10000", "WAIT", "0"]);
            let reply = conn.read();
            let at = Instant::now();
            assert!(matches!(reply, Reply::Int(_)), "{reply:?}");
            assert_eq!(
                conn.call(&["LOCK.RELEASE", "bench", "waiter"]),
                Reply::Int(1)
            );
            granted_tx.send(at).expect("report");
        }
    });
    let mut out = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        assert!(matches!(
            holder.call(&["LOCK.ACQUIRE", "bench", "holder", "10000"]),
            Reply::Int(_)
        ));
        started_tx.send(()).expect("start waiter");
        let deadline = Instant::now() + PATIENCE;
        while blocked_clients(&mut probe) < 1 {
            assert!(Instant::now() < deadline, "waiter never blocked");
        }
        let released = Instant::now();
        assert_eq!(
            holder.call(&["LOCK.RELEASE", "bench", "holder"]),
            Reply::Int(1)
        );
        let granted = granted_rx.recv().expect("grant");
        out.push(granted.saturating_duration_since(released));
    }
    waiter.join().expect("waiter thread");
    out.sort();
    out
}

fn main() {
    let server = Server::start();
    let mut conn = server.conn();
    // Interleave the two measurements over several rounds; report the median round.
    let mut rows = Vec::new();
    for _ in 0..5 {
        let rtt = round_trips(&mut conn);
        let handoff = handoffs(&server);
        rows.push((
            percentile(&rtt, 0.5),
            percentile(&handoff, 0.5),
            percentile(&handoff, 0.99),
        ));
    }
    rows.sort_by_key(|r| r.1);
    let (rtt, p50, p99) = rows[rows.len() / 2];
    println!("| measure | µs | vs PING round trip |");
    println!("|---|---|---|");
    println!("| PING round trip (p50) | {:.1} | 1.00x |", micros(rtt));
    println!(
        "| handoff release→grant (p50) | {:.1} | {:.2}x |",
        micros(p50),
        micros(p50) / micros(rtt)
    );
    println!(
        "| handoff release→grant (p99) | {:.1} | {:.2}x |",
        micros(p99),
        micros(p99) / micros(rtt)
    );
    println!(
        "handoff p50 exceeds one round trip by {:.1} µs (goal: at most 50 µs)",
        micros(p50) - micros(rtt)
    );
}
