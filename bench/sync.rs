//! `sync`: grants that wait for a replica (`SYNC 1 1000`), for the AOF's fsync (`FSYNC 1000`)
//! or both, against the same grants without either, on a primary with one replica (both with the
//! module, on loopback; the primary with `appendonly yes`, `appendfsync everysec`): 16 clients
//! taking turns on one lock (critical sections per second, handoff from one release to the next
//! grant), and one client's ACQUIRE and RENEW round trips. Rounds interleave the modes; medians
//! reported.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{wait_replica_caught_up, Conn, Reply, Server, PATIENCE};
use crate::util::{self, median, micros, percentile, progress, verdict, Pinning, Settings};

const CLIENTS: usize = 16;
const KEY: &str = "bench:sync";
const TTL: &str = "10000";
/// The modes compared: a name and what each ACQUIRE and RENEW adds.
const MODES: [(&str, &[&str]); 4] = [
    ("without", &[]),
    ("SYNC 1", &["SYNC", "1", "1000"]),
    ("FSYNC", &["FSYNC", "1000"]),
    ("SYNC 1 + FSYNC", &["SYNC", "1", "1000", "FSYNC", "1000"]),
];

pub struct Outcome {
    pub table: String,
    pub goals: Vec<(String, bool)>,
}

/// One contention run: critical sections per second and the handoffs seen.
struct Run {
    per_sec: f64,
    handoffs: Vec<Duration>,
}

/// `CLIENTS` clients taking turns on one lock for `secs`, each ACQUIRE with `WAIT 0` (and
/// `extra`), then RELEASE at once.
fn contend(primary: &Server, extra: &'static [&'static str], secs: f64) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicU64::new(0));
    let released_at = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(Barrier::new(CLIENTS + 1));
    let base = Instant::now();
    let mut threads = Vec::new();
    for id in 0..CLIENTS {
        let (stop, sections, released_at, samples, ready) = (
            stop.clone(),
            sections.clone(),
            released_at.clone(),
            samples.clone(),
            ready.clone(),
        );
        let port = primary.port;
        threads.push(thread::spawn(move || {
            let mut conn = Conn::connect(port, PATIENCE).expect("connect");
            let token = format!("sync-client-{id:02}");
            let mut acquire = vec!["LOCK.ACQUIRE", KEY, &token, TTL, "WAIT", "0"];
            acquire.extend(extra);
            ready.wait();
            while !stop.load(Ordering::SeqCst) {
                let Ok(reply) = conn.try_send(&acquire).and_then(|()| conn.try_read()) else {
                    break;
                };
                if !matches!(reply, Reply::Int(_)) {
                    assert!(stop.load(Ordering::SeqCst), "ACQUIRE: {reply:?}");
                    break;
                }
                let now = base.elapsed().as_nanos() as u64;
                let released = released_at.load(Ordering::SeqCst);
                if released != 0 && !stop.load(Ordering::SeqCst) {
                    let handoff = Duration::from_nanos(now.saturating_sub(released));
                    samples.lock().expect("samples").push(handoff);
                    sections.fetch_add(1, Ordering::SeqCst);
                }
                released_at.store(base.elapsed().as_nanos() as u64, Ordering::SeqCst);
                let Ok(reply) = conn
                    .try_send(&["LOCK.RELEASE", KEY, &token])
                    .and_then(|()| conn.try_read())
                else {
                    break;
                };
                assert_eq!(reply, Reply::Int(1), "RELEASE");
            }
        }));
    }
    ready.wait();
    let started = Instant::now();
    thread::sleep(Duration::from_secs_f64(secs));
    let counted = sections.load(Ordering::SeqCst);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    // The clients still queued are ended by closing their connections.
    let mut admin = primary.conn();
    admin.call(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    for thread in threads {
        thread.join().expect("client");
    }
    let mut handoffs = std::mem::take(&mut *samples.lock().expect("samples"));
    handoffs.sort();
    Run {
        per_sec: counted as f64 / elapsed,
        handoffs,
    }
}

/// One client's round trips of `command` (then `undo`), `rounds` times, sorted.
fn round_trips(primary: &Server, command: &[&str], undo: &[&str], rounds: usize) -> Vec<Duration> {
    let mut conn = primary.conn();
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let reply = conn.call(command);
        out.push(started.elapsed());
        assert!(matches!(reply, Reply::Int(_)), "{command:?}: {reply:?}");
        if !undo.is_empty() {
            conn.call(undo);
        }
    }
    out.sort();
    out
}

/// A table row of p50 / p99 per mode, each after the first with its difference at p50.
fn latency_row(table: &mut String, name: &str, p50: &[f64], p99: &[f64]) {
    let _ = write!(table, "| {name} | {:.0} / {:.0} |", p50[0], p99[0]);
    for at in 1..p50.len() {
        let _ = write!(
            table,
            " {:.0} / {:.0} (+{:.0} at p50) |",
            p50[at],
            p99[at],
            p50[at] - p50[0]
        );
    }
    let _ = writeln!(table);
}

#[derive(Default)]
struct Series {
    per_sec: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

pub fn run(settings: &Settings, pinning: &Pinning, started: Instant) -> Outcome {
    let primary = pinning.server(
        util::bench_config()
            .with("appendonly", "yes")
            .with("appendfsync", "everysec"),
    );
    let replica = pinning.server(util::bench_config());
    replica.replicate_from(&primary);
    let rounds = settings.contention_rounds;
    let secs = settings.contention_secs;
    let trips = settings.handoff_rounds;
    let series = || std::array::from_fn::<Series, 4, _>(|_| Series::default());
    let (mut contention, mut acquire, mut renew) = (series(), series(), series());
    for round in 0..rounds {
        progress(started, &format!("sync: round {}/{rounds}", round + 1));
        // Rotate which mode goes first.
        for step in 0..MODES.len() {
            let at = (round + step) % MODES.len();
            let extra = MODES[at].1;
            let run = contend(&primary, extra, secs);
            contention[at].per_sec.push(run.per_sec);
            contention[at]
                .p50
                .push(micros(percentile(&run.handoffs, 0.5)));
            contention[at]
                .p99
                .push(micros(percentile(&run.handoffs, 0.99)));
            wait_replica_caught_up(&primary, &replica);
            let mut command = vec!["LOCK.ACQUIRE", "bench:sync:one", "t", TTL];
            command.extend(extra);
            let trips_acquire = round_trips(
                &primary,
                &command,
                &["LOCK.RELEASE", "bench:sync:one", "t"],
                trips,
            );
            acquire[at]
                .p50
                .push(micros(percentile(&trips_acquire, 0.5)));
            acquire[at]
                .p99
                .push(micros(percentile(&trips_acquire, 0.99)));
            let mut holder = primary.conn();
            holder.call(&["LOCK.ACQUIRE", "bench:sync:renew", "t", TTL]);
            let mut command = vec!["LOCK.RENEW", "bench:sync:renew", "t", TTL];
            command.extend(extra);
            let trips_renew = round_trips(&primary, &command, &[], trips);
            renew[at].p50.push(micros(percentile(&trips_renew, 0.5)));
            renew[at].p99.push(micros(percentile(&trips_renew, 0.99)));
            holder.call(&["LOCK.RELEASE", "bench:sync:renew", "t"]);
        }
    }
    let m = |values: &Vec<f64>| median(values);
    let mut table = String::from(
        "### SYNC and FSYNC: grants a replica acknowledged, or the AOF fsynced, before the reply\n\n\
         A primary (`appendonly yes`, `appendfsync everysec`) and one replica on loopback, both \
         with the module. `SYNC 1 1000`, `FSYNC 1000` and both against the same command without \
         them, interleaved rounds, medians. Contention: 16 clients taking turns on one lock \
         (`WAIT 0`, release at once); handoff is release to the next grant. Round trips: one \
         client, one command at a time. In brackets: the ratio to, or difference from, the \
         column without.\n\n",
    );
    let _ = write!(table, "| measure |");
    for (name, _) in MODES {
        let _ = write!(table, " {name} |");
    }
    let _ = writeln!(table, "\n|---|---|---|---|---|");
    let per_sec: Vec<f64> = contention.iter().map(|s| m(&s.per_sec)).collect();
    let handoff: Vec<f64> = contention.iter().map(|s| m(&s.p50)).collect();
    let handoff99: Vec<f64> = contention.iter().map(|s| m(&s.p99)).collect();
    let _ = write!(table, "| critical sections/s | {:.0} |", per_sec[0]);
    for at in 1..MODES.len() {
        let _ = write!(
            table,
            " {:.0} ({:.2}x) |",
            per_sec[at],
            per_sec[at] / per_sec[0]
        );
    }
    let _ = writeln!(table);
    latency_row(&mut table, "handoff p50 / p99 (µs)", &handoff, &handoff99);
    for (name, series) in [("LOCK.ACQUIRE", &acquire), ("LOCK.RENEW", &renew)] {
        let p50: Vec<f64> = series.iter().map(|s| m(&s.p50)).collect();
        let p99: Vec<f64> = series.iter().map(|s| m(&s.p99)).collect();
        latency_row(
            &mut table,
            &format!("{name} round trip p50 / p99 (µs)"),
            &p50,
            &p99,
        );
    }
    let renew_gap = m(&renew[1].p50) - m(&renew[0].p50);
    let goals = vec![
        (
            format!(
                "SYNC 1 handoff p50 <= the no-SYNC handoff + 0.5 ms ({:.0} vs {:.0} µs)",
                handoff[1], handoff[0]
            ),
            handoff[1] <= handoff[0] + 500.0,
        ),
        (
            format!(
                "SYNC 1 critical sections/s >= 0.6x the no-SYNC pair ({:.2}x)",
                per_sec[1] / per_sec[0]
            ),
            per_sec[1] >= 0.6 * per_sec[0],
        ),
        (
            format!("RENEW ... SYNC 1 p50 <= RENEW + 0.5 ms (+{renew_gap:.0} µs)"),
            renew_gap <= 500.0,
        ),
    ];
    for (goal, met) in &goals {
        let _ = writeln!(table, "\n{}: {goal}", verdict(*met));
    }
    Outcome { table, goals }
}
