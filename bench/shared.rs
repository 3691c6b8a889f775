//! Shared locks, two parts:
//!
//! - the acquire/release cycle: 50 client threads each loop `LOCK.ACQUIRE ... SHARED` then
//!   `LOCK.RELEASE` with a token of their own, all on one key (so up to 50 shared holders pile
//!   up on it), against the same loop with exclusive holds, each client on a key of its own
//!   (neither ever waits, so both measure the uncontended cycle). Two more shared variants tell
//!   the holder set's cost apart: one key per client (one holder each), and the one key with
//!   1000 more shared holders held throughout;
//! - 64 readers + 4 writers on one key: readers `LOCK.ACQUIRE ... SHARED WAIT 5000`, writers
//!   the exclusive `LOCK.ACQUIRE ... WAIT 5000`, each holding a short while, then releasing and
//!   queueing again at once; against the same 68 clients all exclusive on that key (the
//!   contention section's handoff loop), so every figure has a baseline from the same clients.
//!   Writer wait p50/p99 show whether the readers starve the writers.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{Conn, Reply, Server, PATIENCE};
use crate::util::{
    self, cpu_ns, flushall, median, micros, pair, percentile, progress, verdict, Pinning, Settings,
    TOKEN,
};

/// Client threads of the cycle rows (single.rs' redis-benchmark clients).
const CYCLE_CLIENTS: usize = 50;
/// Shared holders that stay on the key throughout the crowded variant.
const CROWD: usize = 1000;
/// Lease of every grant: far longer than any run.
const TTL: &str = "10000";
const READERS: usize = 64;
const WRITERS: usize = 4;
/// Each reader's and writer's WAIT.
const WAIT_MS: &str = "5000";
/// How long a reader or writer holds its grant before releasing it.
const HOLD: Duration = Duration::from_millis(1);
/// Bounds every read of a queued client: longer than its WAIT.
const WAITER_PATIENCE: Duration = Duration::from_secs(30);

pub struct Outcome {
    pub table: String,
    pub goals: Vec<(String, bool)>,
}

pub fn run(settings: &Settings, pinning: &Pinning, started: Instant) -> Outcome {
    let server = pinning.server(util::bench_config());
    let (mut table, goals) = cycle_table(settings, &server, started);
    table.push_str(&readers_writers_table(settings, &server, started));
    drop(server);
    Outcome { table, goals }
}

/// The goal of the crowded SHARED cycle against the exclusive one (median ratio).
const CROWDED_GOAL: f64 = 0.9;

/// One acquire/release loop of the cycle rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    /// The baseline: exclusive holds, one key per client.
    Exclusive,
    /// Shared holds, every client on the same key.
    SharedOneKey,
    /// Shared holds, one key per client.
    SharedOwnKey,
    /// Shared holds on the same key as [`Cycle::SharedOneKey`], beside [`CROWD`] more holders.
    SharedCrowded,
}

impl Cycle {
    const ALL: [Cycle; 4] = [
        Cycle::Exclusive,
        Cycle::SharedOneKey,
        Cycle::SharedOwnKey,
        Cycle::SharedCrowded,
    ];

    fn label(self) -> String {
        match self {
            Cycle::Exclusive => "exclusive, one key per client (baseline)".to_string(),
            Cycle::SharedOneKey => format!("SHARED, one key ({CYCLE_CLIENTS} holders at most)"),
            Cycle::SharedOwnKey => "SHARED, one key per client".to_string(),
            Cycle::SharedCrowded => format!(
                "SHARED, one key beside {CROWD} more holders ({} at most)",
                CROWD + CYCLE_CLIENTS
            ),
        }
    }

    fn key(self, client: usize) -> String {
        match self {
            Cycle::Exclusive => format!("bench:x:{client}"),
            Cycle::SharedOwnKey => format!("bench:s:{client}"),
            Cycle::SharedOneKey | Cycle::SharedCrowded => "bench:s".to_string(),
        }
    }

    fn shared(self) -> bool {
        self != Cycle::Exclusive
    }
}

/// `count` connections to the server, each read and write bounded by `patience`.
fn connect_all(server: &Server, count: usize, patience: Duration) -> Vec<Conn> {
    (0..count)
        .map(|_| Conn::connect(server.port, patience).expect("connect"))
        .collect()
}

/// One cycle run's result.
struct CycleRun {
    per_sec: f64,
    /// Server main-thread CPU µs per cycle (NaN where schedstat is missing).
    cpu_us: f64,
}

fn cycle_run(server: &Server, cycle: Cycle, secs: f64) -> CycleRun {
    let mut conn = server.conn();
    flushall(&mut conn);
    if cycle == Cycle::SharedCrowded {
        // Pipelined: every ACQUIRE first, then every reply.
        for i in 0..CROWD {
            let token = format!("crowd-{i:04}-{TOKEN}");
            conn.send(&["LOCK.ACQUIRE", "bench:s", &token, "600000", "SHARED"]);
        }
        for _ in 0..CROWD {
            let reply = conn.read();
            assert!(matches!(reply, Reply::Int(_)), "crowd ACQUIRE: {reply:?}");
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(CYCLE_CLIENTS + 1));
    // Connected here, so that no thread can fail before the barrier.
    let conns = connect_all(server, CYCLE_CLIENTS, PATIENCE);
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(id, mut conn)| {
            let (stop, cycles, ready) = (stop.clone(), cycles.clone(), ready.clone());
            thread::spawn(move || {
                let key = cycle.key(id);
                // As long as TOKEN (a UUID), and different for every client.
                let token = format!("{id:02}{}", &TOKEN[2..]);
                let mut acquire = vec!["LOCK.ACQUIRE", &key, &token, TTL];
                if cycle.shared() {
                    acquire.push("SHARED");
                }
                let release = ["LOCK.RELEASE", key.as_str(), token.as_str()];
                ready.wait();
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let reply = conn.call(&acquire);
                    assert!(
                        matches!(reply, Reply::Int(_)),
                        "{cycle:?} ACQUIRE: {reply:?}"
                    );
                    let reply = conn.call(&release);
                    assert_eq!(reply, Reply::Int(1), "{cycle:?} RELEASE");
                    done += 1;
                }
                cycles.fetch_add(done, Ordering::SeqCst);
            })
        })
        .collect();
    ready.wait();
    let cpu_before = cpu_ns(server.pid());
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("cycle client thread");
    }
    // The last cycle of each client ends a little after the stop: counted, and timed with it.
    let elapsed = start.elapsed().as_secs_f64();
    let total = cycles.load(Ordering::SeqCst);
    let cpu_us = match (cpu_before, cpu_ns(server.pid())) {
        (Some(before), Some(after)) => (after - before) as f64 / 1e3 / total.max(1) as f64,
        _ => f64::NAN,
    };
    CycleRun {
        per_sec: total as f64 / elapsed,
        cpu_us,
    }
}

#[derive(Default)]
struct CycleSeries {
    per_sec: Vec<f64>,
    cpu_us: Vec<f64>,
    /// Per round: throughput over the baseline's, and the baseline's CPU per cycle over this one's.
    ratio: Vec<f64>,
    cpu_ratio: Vec<f64>,
}

fn cycle_table(
    settings: &Settings,
    server: &Server,
    started: Instant,
) -> (String, Vec<(String, bool)>) {
    let mut series: Vec<CycleSeries> = Cycle::ALL.iter().map(|_| CycleSeries::default()).collect();
    for round in 0..settings.cycle_rounds {
        progress(
            started,
            &format!(
                "shared: acquire/release cycles, round {}/{}",
                round + 1,
                settings.cycle_rounds
            ),
        );
        let mut runs: Vec<Option<CycleRun>> = Cycle::ALL.iter().map(|_| None).collect();
        // Rotate the order from round to round.
        for k in 0..Cycle::ALL.len() {
            let i = (k + round) % Cycle::ALL.len();
            runs[i] = Some(cycle_run(server, Cycle::ALL[i], settings.cycle_secs));
        }
        let runs: Vec<CycleRun> = runs.into_iter().map(|r| r.expect("every run")).collect();
        let base = &runs[0];
        for (s, run) in series.iter_mut().zip(&runs) {
            s.per_sec.push(run.per_sec);
            s.cpu_us.push(run.cpu_us);
            s.ratio.push(run.per_sec / base.per_sec);
            s.cpu_ratio.push(base.cpu_us / run.cpu_us);
        }
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "### Shared locks\n\n#### Acquire/release cycle: shared against exclusive\n\n\
         {CYCLE_CLIENTS} client threads (one connection each) loop `LOCK.ACQUIRE key token {TTL}` \
         (`... SHARED` in the shared rows), then `LOCK.RELEASE key token`, each with its own \
         token, for {:.1} s per variant per round; median of {} rounds in rotating order (ratio: \
         median of the per-round ratios against the exclusive baseline of the same round).\n",
        settings.cycle_secs, settings.cycle_rounds
    );
    let _ = writeln!(
        table,
        "| cycle | cycles/s | ratio | server CPU µs/cycle | CPU ratio |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|");
    for (cycle, s) in Cycle::ALL.iter().zip(&series) {
        let _ = writeln!(
            table,
            "| {} | {:.0} | {:.2}x | {:.2} | {:.2}x |",
            cycle.label(),
            median(&s.per_sec),
            median(&s.ratio),
            median(&s.cpu_us),
            median(&s.cpu_ratio)
        );
    }
    let _ = writeln!(
        table,
        "\nThe comparable pair is the first two rows: no acquire in either ever waits, the \
         exclusive clients because each has a key of its own (a key that stays behind as a \
         released lock between cycles, as the shared key does), the shared ones because shared \
         holds go together; what differs is the mode and the holder set that up to \
         {CYCLE_CLIENTS} shared holders make on the one key. SHARED with one key per client \
         has the mode without the crowd; the last row keeps {CROWD} more shared holders on the \
         key ({} at most), so the holder set's size shows. Tokens are {} bytes. The load is \
         round-trip bound (the client threads share one core), so the server CPU per cycle \
         (its main thread's schedstat over the run, divided by the cycles) shows the module's \
         own cost better; CPU ratio = baseline / variant, so below 1 the variant costs the \
         server more.",
        CROWD + CYCLE_CLIENTS,
        TOKEN.len()
    );
    let crowded = Cycle::ALL
        .iter()
        .zip(&series)
        .find(|(cycle, _)| **cycle == Cycle::SharedCrowded)
        .map_or(0.0, |(_, s)| median(&s.ratio));
    let met = crowded >= CROWDED_GOAL;
    let _ = writeln!(
        table,
        "\nGoal: the SHARED cycle beside {CROWD} more holders >= {CROWDED_GOAL:.2}x the \
         exclusive cycle: {crowded:.2}x, {}.",
        verdict(met)
    );
    let goal =
        format!("SHARED cycle beside {CROWD} holders >= {CROWDED_GOAL:.2}x the exclusive one");
    (table, vec![(goal, met)])
}

/// Which clients of the readers-and-writers runs a figure is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// Clients `WRITERS..`: readers in the mixed run.
    Readers,
    /// Clients `0..WRITERS`: the writers.
    Writers,
}

impl Group {
    fn of(client: usize) -> Group {
        if client < WRITERS {
            Group::Writers
        } else {
            Group::Readers
        }
    }
}

/// What one group's clients did in one run.
#[derive(Default)]
struct GroupTally {
    grants: AtomicU64,
    timeouts: AtomicU64,
    waits: Mutex<Vec<Duration>>,
}

/// Everything the readers-and-writers threads share.
struct Floor {
    stop: AtomicBool,
    /// Clients holding the lock exclusively, and holding it shared, right now.
    writing: AtomicUsize,
    reading: AtomicUsize,
    /// The most shared holders seen at once.
    most_readers: AtomicUsize,
    readers: GroupTally,
    writers: GroupTally,
}

impl Floor {
    fn tally(&self, group: Group) -> &GroupTally {
        match group {
            Group::Readers => &self.readers,
            Group::Writers => &self.writers,
        }
    }
}

/// One group's figures from one run.
struct GroupRun {
    per_sec: f64,
    timeouts: u64,
    /// Sorted; one per counted grant.
    waits: Vec<Duration>,
}

struct MixRun {
    readers: GroupRun,
    writers: GroupRun,
    most_readers: usize,
    /// Server main-thread CPU µs per grant (NaN where schedstat is missing).
    cpu_us: f64,
}

const RW_KEY: &str = "bench:rw";

fn rw_client(id: usize, mut conn: Conn, mixed: bool, floor: &Floor, ready: &Barrier) {
    let group = Group::of(id);
    let shared = mixed && group == Group::Readers;
    let token = format!("{id:02}{}", &TOKEN[2..]);
    let mut acquire = vec!["LOCK.ACQUIRE", RW_KEY, &token, TTL];
    if shared {
        acquire.push("SHARED");
    }
    acquire.extend(["WAIT", WAIT_MS]);
    let tally = floor.tally(group);
    ready.wait();
    while !floor.stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let reply = match conn.try_send(&acquire).and_then(|()| conn.try_read()) {
            Ok(reply) => reply,
            // At the end the controller closes the connections (CLIENT KILL).
            Err(_) if floor.stop.load(Ordering::SeqCst) => break,
            Err(error) => panic!("readers and writers: ACQUIRE: {error}"),
        };
        let waited = asked.elapsed();
        let counting = !floor.stop.load(Ordering::SeqCst);
        match reply {
            Reply::Int(_) => {}
            Reply::Nil => {
                if counting {
                    tally.timeouts.fetch_add(1, Ordering::SeqCst);
                }
                continue;
            }
            other => panic!("readers and writers: ACQUIRE replied {other:?}"),
        }
        if counting {
            tally.grants.fetch_add(1, Ordering::SeqCst);
            tally.waits.lock().expect("waits").push(waited);
        }
        // The critical section: nobody writes beside a reader, nobody at all beside a writer.
        if shared {
            let now = floor.reading.fetch_add(1, Ordering::SeqCst) + 1;
            assert_eq!(
                floor.writing.load(Ordering::SeqCst),
                0,
                "a reader beside a writer"
            );
            floor.most_readers.fetch_max(now, Ordering::SeqCst);
            thread::sleep(HOLD);
            floor.reading.fetch_sub(1, Ordering::SeqCst);
        } else {
            assert_eq!(
                floor.writing.swap(1, Ordering::SeqCst),
                0,
                "two writers at once"
            );
            assert_eq!(
                floor.reading.load(Ordering::SeqCst),
                0,
                "a writer beside readers"
            );
            thread::sleep(HOLD);
            floor.writing.store(0, Ordering::SeqCst);
        }
        match conn
            .try_send(&["LOCK.RELEASE", RW_KEY, &token])
            .and_then(|()| conn.try_read())
        {
            Ok(reply) => assert_eq!(reply, Reply::Int(1), "readers and writers: RELEASE"),
            Err(_) if floor.stop.load(Ordering::SeqCst) => break,
            Err(error) => panic!("readers and writers: RELEASE: {error}"),
        }
    }
}

/// 68 clients on one key for `secs`: readers SHARED when `mixed`, else all exclusive.
fn mix_run(server: &Server, mixed: bool, secs: f64) -> MixRun {
    let mut conn = server.conn();
    // Holds of the connections the last run closed would outlive it (their lease).
    flushall(&mut conn);
    let floor = Arc::new(Floor {
        stop: AtomicBool::new(false),
        writing: AtomicUsize::new(0),
        reading: AtomicUsize::new(0),
        most_readers: AtomicUsize::new(0),
        readers: GroupTally::default(),
        writers: GroupTally::default(),
    });
    let clients = READERS + WRITERS;
    let ready = Arc::new(Barrier::new(clients + 1));
    let conns = connect_all(server, clients, WAITER_PATIENCE);
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(id, conn)| {
            let (floor, ready) = (floor.clone(), ready.clone());
            thread::spawn(move || rw_client(id, conn, mixed, &floor, &ready))
        })
        .collect();
    ready.wait();
    let cpu_before = cpu_ns(server.pid());
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(secs));
    floor.stop.store(true, Ordering::SeqCst);
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_after = cpu_ns(server.pid());
    // The waits still queued end with their connections.
    conn.call(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let deadline = Instant::now() + PATIENCE;
    while threads.iter().any(|t| !t.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "readers and writers: clients did not stop"
        );
        thread::sleep(Duration::from_millis(5));
    }
    for t in threads {
        t.join().expect("readers and writers client thread");
    }
    let group = |tally: &GroupTally| {
        let mut waits = std::mem::take(&mut *tally.waits.lock().expect("waits"));
        waits.sort();
        GroupRun {
            per_sec: tally.grants.load(Ordering::SeqCst) as f64 / elapsed,
            timeouts: tally.timeouts.load(Ordering::SeqCst),
            waits,
        }
    };
    let (readers, writers) = (group(&floor.readers), group(&floor.writers));
    let grants = readers.waits.len() + writers.waits.len();
    let cpu_us = match (cpu_before, cpu_after) {
        (Some(before), Some(after)) => (after - before) as f64 / 1e3 / grants.max(1) as f64,
        _ => f64::NAN,
    };
    MixRun {
        readers,
        writers,
        most_readers: floor.most_readers.load(Ordering::SeqCst),
        cpu_us,
    }
}

/// One group's (or all clients') figures over the rounds, in one mix.
#[derive(Default)]
struct MixSeries {
    per_sec: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    timeouts: u64,
    grants: usize,
}

impl MixSeries {
    fn add(&mut self, per_sec: f64, waits: &[Duration], timeouts: u64) {
        self.per_sec.push(per_sec);
        self.p50.push(micros(percentile(waits, 0.5)));
        self.p99.push(micros(percentile(waits, 0.99)));
        self.timeouts += timeouts;
        self.grants += waits.len();
    }

    /// Readers and writers together.
    fn add_all(&mut self, run: &MixRun) {
        let mut waits = run.readers.waits.clone();
        waits.extend_from_slice(&run.writers.waits);
        waits.sort();
        self.add(
            run.readers.per_sec + run.writers.per_sec,
            &waits,
            run.readers.timeouts + run.writers.timeouts,
        );
    }
}

fn readers_writers_table(settings: &Settings, server: &Server, started: Instant) -> String {
    // Per mix (0: all exclusive, the baseline; 1: readers SHARED): readers, writers, all.
    let mut series: [[MixSeries; 3]; 2] = Default::default();
    // Per round, mixed over baseline: readers', writers' and all grants/s.
    let mut ratios: [Vec<f64>; 3] = Default::default();
    let mut most_readers = Vec::new();
    // Per mix: server CPU µs per grant.
    let mut cpu_us: [Vec<f64>; 2] = Default::default();
    for round in 0..settings.readers_writers_rounds {
        progress(
            started,
            &format!(
                "shared: {READERS} readers + {WRITERS} writers, round {}/{}",
                round + 1,
                settings.readers_writers_rounds
            ),
        );
        let (base, mixed) = pair(round % 2 == 1, |mixed| {
            mix_run(server, mixed, settings.readers_writers_secs)
        });
        for (mix, run) in [&base, &mixed].into_iter().enumerate() {
            let s = &mut series[mix];
            s[0].add(
                run.readers.per_sec,
                &run.readers.waits,
                run.readers.timeouts,
            );
            s[1].add(
                run.writers.per_sec,
                &run.writers.waits,
                run.writers.timeouts,
            );
            s[2].add_all(run);
            cpu_us[mix].push(run.cpu_us);
        }
        ratios[0].push(mixed.readers.per_sec / base.readers.per_sec);
        ratios[1].push(mixed.writers.per_sec / base.writers.per_sec);
        ratios[2].push(
            (mixed.readers.per_sec + mixed.writers.per_sec)
                / (base.readers.per_sec + base.writers.per_sec),
        );
        most_readers.push(mixed.most_readers as f64);
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "\n#### {READERS} readers + {WRITERS} writers on one lock\n\n{} client threads, one \
         connection each, on one key: readers loop `LOCK.ACQUIRE key token {TTL} SHARED WAIT \
         {WAIT_MS}`, writers `LOCK.ACQUIRE key token {TTL} WAIT {WAIT_MS}`; each holds its \
         grant {} µs (a sleep), releases it and queues again at once. The baseline is the same \
         {} clients, all exclusive (the handoff loop of the contention section). {:.1} s per \
         run, median of {} rounds, baseline and mixed in alternating order (ratio: median of \
         the per-round ratios). Wait: ACQUIRE sent -> its grant read, granted requests only.\n",
        READERS + WRITERS,
        HOLD.as_micros(),
        READERS + WRITERS,
        settings.readers_writers_secs,
        settings.readers_writers_rounds
    );
    let _ = writeln!(
        table,
        "| clients | grants/s | all exclusive: grants/s | ratio | wait p50 µs | wait p99 µs | \
         all exclusive: wait p50 / p99 µs | timeouts | grants |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|");
    let labels = [
        format!("{READERS} readers (SHARED WAIT)"),
        format!("{WRITERS} writers (WAIT)"),
        format!("all {}", READERS + WRITERS),
    ];
    for (i, label) in labels.iter().enumerate() {
        let (base, mixed) = (&series[0][i], &series[1][i]);
        let _ = writeln!(
            table,
            "| {label} | {:.0} | {:.0} | {:.2}x | {:.1} | {:.1} | {:.1} / {:.1} | {} | {} |",
            median(&mixed.per_sec),
            median(&base.per_sec),
            median(&ratios[i]),
            median(&mixed.p50),
            median(&mixed.p99),
            median(&base.p50),
            median(&base.p99),
            mixed.timeouts,
            mixed.grants
        );
    }
    let writers = &series[1][1];
    let _ = writeln!(
        table,
        "\nWriters: wait p50 {:.1} µs, p99 {:.1} µs beside {READERS} readers (all exclusive: \
         {:.1} / {:.1} µs), {} of {} writer requests timed out after {WAIT_MS} ms. Up to {:.0} \
         readers held the lock at once (median of the rounds' maxima). Server CPU per grant \
         (its main thread's schedstat over the run): {:.1} µs mixed, {:.1} µs all exclusive. \
         Timeouts in the baseline: {}.",
        median(&writers.p50),
        median(&writers.p99),
        median(&series[0][1].p50),
        median(&series[0][1].p99),
        writers.timeouts,
        writers.timeouts as usize + writers.grants,
        median(&most_readers),
        median(&cpu_us[1]),
        median(&cpu_us[0]),
        series[0][2].timeouts
    );
    table
}
