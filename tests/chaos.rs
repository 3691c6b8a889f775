//! Safety under faults: many clients take locks, write to a fenced store with their fences, and
//! the server is killed, restarted, paused, reloaded, rewritten and failed over under them.
//!
//! The **oracle** is a fenced store: it accepts a write to a resource only with a fence at least
//! as large as the largest it accepted for that resource, and logs every accept and reject. It
//! runs in the test process and also listens on a loopback port for the client processes that a
//! scenario stops with SIGSTOP. After each scenario these invariants are checked:
//!
//! - I1: no accepted write has a fence lower than an earlier accepted write (the store's log);
//! - I2: every grant of a key has its own fence, and a grant that ended before another started
//!   has the smaller fence (client-side timestamps of request and reply);
//! - I3: the server never has two live holders of one key: no grant was made while another
//!   grant's lease was certainly running (granted before, not released, deadline ahead);
//! - I4: a key's fence never goes back across restart, reload, AOF rewrite or failover (the
//!   fence the server shows afterwards against the largest fence granted before);
//! - I5: release or renew with a wrong or stale token never succeeds.
//!
//! Scenarios that the README says can lose grants (kill -9 with `appendfsync everysec`, failover
//! without `WAIT 1`) report their violations instead of failing on them; the others must have
//! none. `CHAOS_SCALE` picks the size: unset (a quick pass for `cargo test`), `ci`, or `full`
//! (`make chaos`); `CHAOS_REPORT=path` appends one line per scenario to a file.

mod common;
use common::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Mutex};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Scale

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scale {
    Quick,
    Ci,
    Full,
}

fn scale() -> Scale {
    match std::env::var("CHAOS_SCALE").as_deref() {
        Ok("full") => Scale::Full,
        Ok("ci") => Scale::Ci,
        _ => Scale::Quick,
    }
}

#[derive(Clone, Copy, Debug)]
struct Params {
    /// Load between two faults.
    phase: Duration,
    /// Faults per scenario.
    faults: usize,
    clients: usize,
    keys: usize,
    /// Rounds of the SIGSTOPped holder.
    holder_rounds: usize,
    fuzz_commands: u64,
    fuzz_restores: u64,
}

fn params() -> Params {
    match scale() {
        Scale::Quick => Params {
            phase: Duration::from_millis(400),
            faults: 2,
            clients: 6,
            keys: 4,
            holder_rounds: 3,
            fuzz_commands: 20_000,
            fuzz_restores: 500,
        },
        Scale::Ci => Params {
            phase: Duration::from_millis(2000),
            faults: 5,
            clients: 10,
            keys: 8,
            holder_rounds: 15,
            fuzz_commands: 200_000,
            fuzz_restores: 3_000,
        },
        Scale::Full => Params {
            phase: Duration::from_secs(5),
            faults: 8,
            clients: 16,
            keys: 12,
            holder_rounds: 120,
            fuzz_commands: 1_200_000,
            fuzz_restores: 20_000,
        },
    }
}

/// Slack for comparing client-side instants with the server's millisecond wall clock.
const SLACK: Duration = Duration::from_millis(3);
/// Longest any client read waits (server pauses in these scenarios last at most ~1.5 s).
const CLIENT_READ: Duration = Duration::from_secs(8);

// ---------------------------------------------------------------------------------------------
// A small deterministic random source

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// The fenced store

#[derive(Clone, Debug)]
struct WriteRecord {
    resource: String,
    fence: u64,
    accepted: bool,
}

#[derive(Default)]
struct Oracle {
    state: Mutex<(HashMap<String, u64>, Vec<WriteRecord>)>,
}

impl Oracle {
    /// Accepts the write when `fence` is at least the largest fence accepted for `resource`.
    fn write(&self, resource: &str, fence: u64) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (max, log) = &mut *state;
        let highest = max.entry(resource.to_string()).or_insert(0);
        let accepted = fence >= *highest;
        if accepted {
            *highest = fence;
        }
        log.push(WriteRecord {
            resource: resource.to_string(),
            fence,
            accepted,
        });
        accepted
    }

    fn highest(&self, resource: &str) -> u64 {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0.get(resource).copied().unwrap_or(0)
    }

    fn log(&self) -> Vec<WriteRecord> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1.clone()
    }
}

/// The oracle on a loopback port, for client processes: `W resource fence\n` answers `OK\n` or
/// `STALE\n`.
struct OracleServer {
    port: u16,
    stop: AtomicBool,
}

impl OracleServer {
    fn serve<'s>(
        scope: &'s thread::Scope<'s, '_>,
        oracle: &'s Oracle,
        me: &'s OracleServer,
        listener: TcpListener,
    ) {
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        scope.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(1800);
            while !me.stop.load(Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        scope.spawn(move || serve_oracle_conn(oracle, stream));
                    }
                    Err(_) => sleep(Duration::from_millis(2)),
                }
            }
        });
    }
}

fn serve_oracle_conn(oracle: &Oracle, stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(stream);
    let mut line = String::new();
    while matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let answer = match parts.as_slice() {
            ["W", resource, fence] => match fence.parse::<u64>() {
                Ok(fence) if oracle.write(resource, fence) => "OK\n",
                Ok(_) => "STALE\n",
                Err(_) => "BAD\n",
            },
            _ => "BAD\n",
        };
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
        line.clear();
    }
}

/// A write to the oracle over TCP (from a client process).
fn oracle_write_tcp(port: u16, resource: &str, fence: u64) -> Option<bool> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut out = stream.try_clone().ok()?;
    out.write_all(format!("W {resource} {fence}\n").as_bytes())
        .ok()?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).ok()?;
    match answer.trim() {
        "OK" => Some(true),
        "STALE" => Some(false),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// What the clients saw

#[derive(Clone, Debug)]
struct Grant {
    key: String,
    fence: u64,
    /// When the ACQUIRE was sent and when its reply arrived.
    start: Instant,
    end: Instant,
    /// Until when the lease was certainly running on the server: request time + ttl, moved by
    /// successful renewals, cut to the moment a release was sent.
    live_until: Instant,
}

#[derive(Default)]
struct History {
    grants: Mutex<Vec<Grant>>,
    /// Grants a `WAIT 1` did not confirm: the client did not act on them.
    unconfirmed: AtomicU64,
    contended: AtomicU64,
    /// Release/renew with a wrong or certainly stale token.
    i5_attempts: AtomicU64,
    i5_violations: AtomicU64,
    i4_checks: AtomicU64,
    i4_violations: AtomicU64,
    faults: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    notes: Mutex<Vec<String>>,
}

impl History {
    fn add_grant(&self, grant: Grant) -> usize {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.push(grant);
        grants.len() - 1
    }

    fn update(&self, idx: usize, f: impl FnOnce(&mut Grant)) {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut grants[idx]);
    }

    fn error(&self, text: &str) {
        let kind: String = text
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    fn note(&self, text: String) {
        self.notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(text);
    }

    fn i5(&self, succeeded: bool) {
        self.i5_attempts.fetch_add(1, Relaxed);
        if succeeded {
            self.i5_violations.fetch_add(1, Relaxed);
        }
    }

    /// The largest fence granted so far, per key.
    fn max_fences(&self) -> HashMap<String, u64> {
        let grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        let mut max: HashMap<String, u64> = HashMap::new();
        for g in grants.iter() {
            let m = max.entry(g.key.clone()).or_default();
            *m = (*m).max(g.fence);
        }
        max
    }

    /// I4: the fences a server shows after a fault against the largest granted before it.
    fn check_i4(&self, before: &HashMap<String, u64>, after: &HashMap<String, u64>, what: &str) {
        for (key, &was) in before {
            self.i4_checks.fetch_add(1, Relaxed);
            let now = after.get(key).copied().unwrap_or(0);
            if now < was {
                self.i4_violations.fetch_add(1, Relaxed);
                self.note(format!(
                    "I4 after {what}: {key} shows fence {now}, below the granted {was} (-{})",
                    was - now
                ));
            }
        }
    }
}

/// I2: distinct fences per key, and grants ordered in real time have ordered fences.
fn check_i2(grants: &[Grant]) -> (u64, Vec<String>) {
    let mut violations = 0;
    let mut examples = Vec::new();
    for (key, list) in by_key(grants) {
        let mut seen = HashSet::new();
        for g in &list {
            if !seen.insert(g.fence) {
                violations += 1;
                examples.push(format!("I2: {key} fence {} granted twice", g.fence));
            }
        }
        let mut by_end = list.clone();
        by_end.sort_by_key(|g| g.end);
        let mut by_start = list;
        by_start.sort_by_key(|g| g.start);
        let mut i = 0;
        let mut max_before = 0u64;
        for b in &by_start {
            while i < by_end.len() && by_end[i].end < b.start {
                max_before = max_before.max(by_end[i].fence);
                i += 1;
            }
            if max_before >= b.fence {
                violations += 1;
                if examples.len() < 5 {
                    examples.push(format!(
                        "I2: {key} granted fence {} after an earlier grant of fence {max_before}",
                        b.fence
                    ));
                }
            }
        }
    }
    (violations, examples)
}

/// I3: no grant while another grant's lease was certainly running.
fn check_i3(grants: &[Grant]) -> (u64, Vec<String>) {
    let mut violations = 0;
    let mut examples = Vec::new();
    for (key, list) in by_key(grants) {
        let mut by_end = list.clone();
        by_end.sort_by_key(|g| g.end);
        let mut by_start = list;
        by_start.sort_by_key(|g| g.start);
        let mut i = 0;
        let mut live: Option<Grant> = None;
        for b in &by_start {
            while i < by_end.len() && by_end[i].end <= b.start {
                if live
                    .as_ref()
                    .is_none_or(|l| l.live_until < by_end[i].live_until)
                {
                    live = Some(by_end[i].clone());
                }
                i += 1;
            }
            if let Some(a) = &live {
                if a.live_until > b.end + SLACK {
                    violations += 1;
                    if examples.len() < 5 {
                        examples.push(format!(
                            "I3: {key} granted fence {} while fence {} had {} ms of lease left",
                            b.fence,
                            a.fence,
                            (a.live_until - b.end).as_millis()
                        ));
                    }
                }
            }
        }
    }
    (violations, examples)
}

fn by_key(grants: &[Grant]) -> BTreeMap<String, Vec<Grant>> {
    let mut map: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    for g in grants {
        map.entry(g.key.clone()).or_default().push(g.clone());
    }
    map
}

/// I1: the store's accepted fences never go down, per resource.
fn check_i1(log: &[WriteRecord]) -> u64 {
    let mut max: HashMap<&str, u64> = HashMap::new();
    let mut violations = 0;
    for w in log.iter().filter(|w| w.accepted) {
        let m = max.entry(&w.resource).or_default();
        if w.fence < *m {
            violations += 1;
        }
        *m = (*m).max(w.fence);
    }
    violations
}

// ---------------------------------------------------------------------------------------------
// Clients

struct Load {
    keys: Vec<String>,
    clients: usize,
    ttl_ms: (u64, u64),
    /// Percent of clients that queue on the server with `WAIT timeout-ms`.
    queue_pct: u64,
    /// `WAIT 1 <ms>` after each grant: act only on grants a replica confirmed.
    replica_ack: Option<u64>,
    /// Percent of grants whose holder stalls past its lease before writing.
    slow_pct: u64,
    /// Percent of grants never released (the lease runs out).
    abandon_pct: u64,
}

struct Shared {
    /// The port clients should use; 0 while the server is down.
    port: AtomicU16,
    stop: AtomicBool,
    oracle: Oracle,
    history: History,
    load: Load,
}

impl Shared {
    fn new(port: u16, load: Load) -> Shared {
        Shared {
            port: AtomicU16::new(port),
            stop: AtomicBool::new(false),
            oracle: Oracle::default(),
            history: History::default(),
            load,
        }
    }
}

/// Sets the stop flag when dropped, so clients end even when the controller panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// One command; an error when the connection broke or sent something unreadable.
fn call<A: AsRef<[u8]>>(conn: &mut Conn, args: &[A]) -> std::io::Result<Reply> {
    conn.try_send(args)?;
    conn.try_read()
}

fn client_loop(id: usize, sh: &Shared) {
    let mut rng = Rng(0xC11E_0000 + id as u64 * 7919);
    let queues = (id as u64 * 100 / sh.load.clients.max(1) as u64) < sh.load.queue_pct;
    let mut conn: Option<(u16, Conn)> = None;
    let hard_stop = Instant::now() + Duration::from_secs(1800);
    let mut n = 0u64;
    while !sh.stop.load(Relaxed) && Instant::now() < hard_stop {
        let port = sh.port.load(Relaxed);
        if port == 0 {
            conn = None;
            sleep(Duration::from_millis(5));
            continue;
        }
        if conn.as_ref().map(|(p, _)| *p) != Some(port) {
            conn = Conn::connect(port, Duration::from_millis(500))
                .ok()
                .map(|c| {
                    c.set_timeout(CLIENT_READ);
                    (port, c)
                });
            if conn.is_none() {
                sleep(Duration::from_millis(10));
                continue;
            }
        }
        let Some((_, c)) = conn.as_mut() else {
            continue;
        };
        n += 1;
        let key = rng.pick(&sh.load.keys).clone();
        let token = format!("c{id}-{n}");
        let ttl = rng.range(sh.load.ttl_ms.0, sh.load.ttl_ms.1);
        let ttl_s = ttl.to_string();
        let wait_s = rng.range(20, 400).to_string();
        let mut args = vec!["LOCK.ACQUIRE", &key, &token, &ttl_s];
        if queues {
            args.extend(["WAIT", &wait_s]);
        }
        let start = Instant::now();
        let reply = match call(c, &args) {
            Ok(reply) => reply,
            Err(_) => {
                conn = None;
                continue;
            }
        };
        let end = Instant::now();
        let fence = match reply {
            Reply::Int(f) => f as u64,
            Reply::Nil => {
                sh.history.contended.fetch_add(1, Relaxed);
                if !queues {
                    sleep(Duration::from_micros(rng.range(100, 3000)));
                }
                continue;
            }
            Reply::Error(e) => {
                sh.history.error(&e);
                sleep(Duration::from_millis(5));
                continue;
            }
            other => {
                sh.history.error(&format!("{other:?}"));
                continue;
            }
        };
        let release = |c: &mut Conn| call(c, &["LOCK.RELEASE", &key, &token]);
        if let Some(ms) = sh.load.replica_ack {
            match call(c, &["WAIT", "1", &ms.to_string()]) {
                Ok(Reply::Int(acked)) if acked >= 1 => {}
                Ok(_) => {
                    sh.history.unconfirmed.fetch_add(1, Relaxed);
                    if release(c).is_err() {
                        conn = None;
                    }
                    continue;
                }
                Err(_) => {
                    sh.history.unconfirmed.fetch_add(1, Relaxed);
                    conn = None;
                    continue;
                }
            }
        }
        let idx = sh.history.add_grant(Grant {
            key: key.clone(),
            fence,
            start,
            end,
            live_until: start + Duration::from_millis(ttl),
        });
        // I5: a token that never held the lock can neither release nor renew it.
        if rng.chance(15) {
            let wrong = format!("x{id}-{n}");
            let mut broken = false;
            for probe in [
                vec!["LOCK.RELEASE", &key, &wrong],
                vec!["LOCK.RENEW", &key, &wrong, "60000"],
            ] {
                match call(c, &probe) {
                    Ok(reply) => sh.history.i5(reply == Reply::Int(1)),
                    Err(_) => broken = true,
                }
            }
            if broken {
                conn = None;
                // Still holds (as far as it knows): it writes, as a real client would.
                sh.oracle.write(&key, fence);
                continue;
            }
        }
        let Some((_, c)) = conn.as_mut() else {
            continue;
        };
        let behaviour = rng.below(100);
        if behaviour < sh.load.slow_pct {
            // Stalls (GC, swap, a paused VM) past its lease, then writes as if it still held.
            sleep(Duration::from_millis(ttl + rng.range(20, 80)));
            sh.oracle.write(&key, fence);
            if Instant::now() > end + Duration::from_millis(ttl) + SLACK {
                // The lease is certainly over: its token is stale.
                let mut broken = false;
                for probe in [
                    vec!["LOCK.RENEW", &key, &token, &ttl_s],
                    vec!["LOCK.RELEASE", &key, &token],
                ] {
                    match call(c, &probe) {
                        Ok(reply) => sh.history.i5(reply == Reply::Int(1)),
                        Err(_) => broken = true,
                    }
                }
                if broken {
                    conn = None;
                }
            }
        } else if behaviour < sh.load.slow_pct + sh.load.abandon_pct {
            sh.oracle.write(&key, fence);
        } else {
            sleep(Duration::from_micros(rng.range(0, 2000)));
            sh.oracle.write(&key, fence);
            if rng.chance(20) {
                let ttl2 = rng.range(sh.load.ttl_ms.0, sh.load.ttl_ms.1);
                let sent = Instant::now();
                match call(c, &["LOCK.RENEW", &key, &token, &ttl2.to_string()]) {
                    Ok(Reply::Int(1)) => {
                        sh.history.update(idx, |g| {
                            g.live_until = g.live_until.max(sent + Duration::from_millis(ttl2))
                        });
                        sh.oracle.write(&key, fence);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        conn = None;
                        continue;
                    }
                }
            }
            let Some((_, c)) = conn.as_mut() else {
                continue;
            };
            let sent = Instant::now();
            sh.history
                .update(idx, |g| g.live_until = g.live_until.min(sent));
            if release(c).is_err() {
                conn = None;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reports

#[derive(Debug)]
struct Report {
    scenario: String,
    grants: usize,
    unconfirmed: u64,
    accepted: usize,
    rejected: usize,
    i: [u64; 5],
    checks: [u64; 5],
    faults: u64,
    module_panics: usize,
    secs: f64,
    notes: Vec<String>,
}

impl Report {
    fn line(&self) -> String {
        format!(
            "{:<24} grants {:>7}  accepted {:>7}  rejected {:>6}  violations I1 {} I2 {} I3 {} I4 {} I5 {}  ({} faults, {} unconfirmed, {:.0}s)",
            self.scenario,
            self.grants,
            self.accepted,
            self.rejected,
            self.i[0],
            self.i[1],
            self.i[2],
            self.i[3],
            self.i[4],
            self.faults,
            self.unconfirmed,
            self.secs
        )
    }

    /// Prints the report, appends it to `$CHAOS_REPORT`, and fails on violations of the
    /// invariants in `must_hold` (I1..I5 as 1..5) and on any module panic.
    fn finish(self, must_hold: &[usize]) {
        let line = self.line();
        println!("chaos: {line}");
        println!(
            "chaos:   checks: I1 {} writes, I2 {} grants, I3 {} grants, I4 {} key checks, I5 {} probes",
            self.checks[0], self.checks[1], self.checks[2], self.checks[3], self.checks[4]
        );
        for note in self.notes.iter().take(12) {
            println!("chaos:   {note}");
        }
        if let Ok(path) = std::env::var("CHAOS_REPORT") {
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                let _ = writeln!(file, "{line}");
                for note in self.notes.iter().take(6) {
                    let _ = writeln!(file, "    {note}");
                }
            }
        }
        assert_eq!(self.module_panics, 0, "module panics in the server log");
        for &inv in must_hold {
            assert_eq!(
                self.i[inv - 1],
                0,
                "{}: invariant I{inv} violated: {:?}",
                self.scenario,
                self.notes
            );
        }
        assert!(self.grants > 0, "{}: no grants at all", self.scenario);
    }
}

fn module_panics(logs: &[String]) -> usize {
    logs.iter()
        .map(|log| log.matches("lock module bug").count())
        .sum()
}

fn report(name: &str, sh: &Shared, started: Instant, logs: &[String]) -> Report {
    let grants = sh
        .history
        .grants
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let log = sh.oracle.log();
    let (i2, ex2) = check_i2(&grants);
    let (i3, ex3) = check_i3(&grants);
    let mut notes = sh
        .history
        .notes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    notes.extend(ex2);
    notes.extend(ex3);
    let errors = sh.history.errors.lock().unwrap_or_else(|e| e.into_inner());
    if !errors.is_empty() {
        notes.push(format!("error replies seen by clients: {errors:?}"));
    }
    notes.push(format!(
        "contended (nil) acquires: {}",
        sh.history.contended.load(Relaxed)
    ));
    Report {
        scenario: name.to_string(),
        grants: grants.len(),
        unconfirmed: sh.history.unconfirmed.load(Relaxed),
        accepted: log.iter().filter(|w| w.accepted).count(),
        rejected: log.iter().filter(|w| !w.accepted).count(),
        i: [
            check_i1(&log),
            i2,
            i3,
            sh.history.i4_violations.load(Relaxed),
            sh.history.i5_violations.load(Relaxed),
        ],
        checks: [
            log.len() as u64,
            grants.len() as u64,
            grants.len() as u64,
            sh.history.i4_checks.load(Relaxed),
            sh.history.i5_attempts.load(Relaxed),
        ],
        faults: sh.history.faults.load(Relaxed),
        module_panics: module_panics(logs),
        secs: started.elapsed().as_secs_f64(),
        notes,
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers for the controllers

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

fn standard_load(prefix: &str) -> Load {
    let p = params();
    Load {
        keys: keys(prefix, p.keys),
        clients: p.clients,
        ttl_ms: (30, 200),
        queue_pct: 50,
        replica_ack: None,
        slow_pct: 3,
        abandon_pct: 2,
    }
}

/// The fence each key shows (LOCK.INFO), 0 for a missing key.
fn fences_now(server: &Server, keys: &[String]) -> HashMap<String, u64> {
    let mut conn = server.conn();
    keys.iter()
        .map(|k| {
            let fence = lock_info(&mut conn, k)
                .and_then(|f| f.into_iter().find(|(n, _)| n == "fence"))
                .map_or(0, |(_, v)| v.int() as u64);
            (k.clone(), fence)
        })
        .collect()
}

/// Runs `clients` against the shared state while `controller` injects faults.
fn run_load(sh: &Shared, controller: impl FnOnce()) {
    thread::scope(|s| {
        for id in 0..sh.load.clients {
            s.spawn(move || client_loop(id, sh));
        }
        let _stop = StopOnDrop(&sh.stop);
        controller();
    });
}

// ---------------------------------------------------------------------------------------------
// Scenarios: kill -9 and restart

fn kill9(fsync: &str) -> Report {
    let p = params();
    let started = Instant::now();
    let config = Config::default()
        .with("appendonly", "yes")
        .with("appendfsync", fsync)
        .with("aof-use-rdb-preamble", "yes");
    let mut server = Server::start_with(config);
    let sh = Shared::new(server.port, standard_load("k9"));
    let mut logs = Vec::new();
    run_load(&sh, || {
        for round in 0..p.faults {
            sleep(p.phase);
            server.kill();
            sh.port.store(0, Relaxed);
            sh.history.faults.fetch_add(1, Relaxed);
            // Replies already sent are read by now.
            sleep(Duration::from_millis(150));
            let before = sh.history.max_fences();
            logs.push(server.log());
            server.restart();
            // Checked before any client can reach the new port.
            let after = fences_now(&server, &sh.load.keys);
            sh.history
                .check_i4(&before, &after, &format!("kill -9 #{round} ({fsync})"));
            sh.port.store(server.port, Relaxed);
        }
        sleep(p.phase);
    });
    logs.push(server.log());
    report(&format!("kill9-{fsync}"), &sh, started, &logs)
}

#[test]
fn kill9_restart_appendfsync_always() {
    kill9("always").finish(&[1, 2, 3, 4, 5]);
}

/// `appendfsync everysec` may lose the last second of grants on a crash (README); a `kill -9`
/// leaves the page cache intact, so in practice only writes Redis had not yet handed to the
/// kernel are lost. Violations are reported, not failed on, except I1 and I5.
#[test]
fn kill9_restart_appendfsync_everysec() {
    kill9("everysec").finish(&[1, 5]);
}

// ---------------------------------------------------------------------------------------------
// Scenario: the server paused (SIGSTOP, DEBUG SLEEP) while leases run out

#[test]
fn server_paused_while_leases_run_out() {
    let p = params();
    let started = Instant::now();
    let server = Server::start();
    let mut load = standard_load("sp");
    load.ttl_ms = (50, 250);
    let sh = Shared::new(server.port, load);
    let keys = sh.load.keys.clone();
    run_load(&sh, || {
        let mut control = server.conn();
        control.set_timeout(Duration::from_secs(20));
        for round in 0..p.faults {
            sleep(p.phase);
            let before = fences_now(&server, &keys);
            let pause_ms = 400 + 200 * (round as u64 % 4);
            if round % 2 == 0 {
                let mut stopped = Stopped::stop(server.pid());
                sleep(Duration::from_millis(pause_ms));
                stopped.resume();
            } else {
                let secs = format!("{:.3}", pause_ms as f64 / 1000.0);
                assert_eq!(
                    control.call(&["DEBUG", "SLEEP", &secs]),
                    Reply::status("OK")
                );
            }
            sh.history.faults.fetch_add(1, Relaxed);
            let after = fences_now(&server, &keys);
            sh.history
                .check_i4(&before, &after, &format!("server pause #{round}"));
        }
        sleep(p.phase);
    });
    assert_eq!(server.conn().call(&["PING"]), Reply::status("PONG"));
    report("server-paused", &sh, started, &[server.log()]).finish(&[1, 2, 3, 4, 5]);
}

// ---------------------------------------------------------------------------------------------
// Scenario: DEBUG RELOAD and BGREWRITEAOF under load, then restarts from the rewritten AOF

fn wait_rewrite_idle(server: &Server) {
    wait_for("AOF rewrite idle", || {
        let field = |f: &str| server.info_field("persistence", f);
        (field("aof_rewrite_in_progress").as_deref() == Some("0")
            && field("aof_rewrite_scheduled").as_deref() == Some("0"))
        .then_some(())
    });
}

#[test]
fn debug_reload_and_aof_rewrite_under_load() {
    let p = params();
    let started = Instant::now();
    let config = Config::default()
        .with("appendonly", "yes")
        .with("appendfsync", "always")
        .with("aof-use-rdb-preamble", "yes");
    let mut server = Server::start_with(config);
    let sh = Shared::new(server.port, standard_load("rl"));
    let keys = sh.load.keys.clone();
    let mut logs = Vec::new();
    run_load(&sh, || {
        let mut control = server.conn();
        control.set_timeout(Duration::from_secs(30));
        for round in 0..p.faults * 2 {
            sleep(p.phase / 2);
            let before = fences_now(&server, &keys);
            let what = if round % 2 == 0 {
                assert_eq!(control.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
                "DEBUG RELOAD"
            } else {
                wait_rewrite_idle(&server);
                let reply = control.call(&["BGREWRITEAOF"]);
                assert!(matches!(reply, Reply::Status(_)), "{reply:?}");
                wait_rewrite_idle(&server);
                assert_eq!(
                    server.info_field("persistence", "aof_last_bgrewrite_status"),
                    Some("ok".into())
                );
                "BGREWRITEAOF"
            };
            sh.history.faults.fetch_add(1, Relaxed);
            let after = fences_now(&server, &keys);
            sh.history
                .check_i4(&before, &after, &format!("{what} #{round}"));
        }
        // Then a crash: the restarted server replays the rewritten AOF.
        sleep(p.phase / 2);
        server.kill();
        sh.port.store(0, Relaxed);
        sh.history.faults.fetch_add(1, Relaxed);
        sleep(Duration::from_millis(150));
        let before = sh.history.max_fences();
        logs.push(server.log());
        server.restart();
        let after = fences_now(&server, &keys);
        sh.history
            .check_i4(&before, &after, "kill -9 after rewrites");
        sh.port.store(server.port, Relaxed);
        sleep(p.phase / 2);
    });
    logs.push(server.log());
    report("reload-rewrite", &sh, started, &logs).finish(&[1, 2, 3, 4, 5]);
}

// ---------------------------------------------------------------------------------------------
// Scenario: failover to a replica after the primary is killed

/// Makes `replica` replicate `primary` and gets past the first REPLCONF ACK, so `WAIT 1`
/// answers at once from then on.
fn link(primary: &Server, replica: &Server) {
    replica.replicate_from(primary);
    let mut p = primary.conn();
    assert_eq!(p.call(&["SET", "__link_check__", "1"]), Reply::status("OK"));
    wait_replica_caught_up(primary, replica);
    assert_eq!(p.call(&["DEL", "__link_check__"]), Reply::Int(1));
    wait_replica_caught_up(primary, replica);
}

fn failover(replica_ack: Option<u64>) -> Report {
    let p = params();
    let started = Instant::now();
    let mut primary = Server::start();
    let mut replica = Server::start();
    link(&primary, &replica);
    let mut load = standard_load(if replica_ack.is_some() { "fw" } else { "fn" });
    load.replica_ack = replica_ack;
    // Leases that can outlast the failover, so a lost grant can still be running for its holder.
    load.ttl_ms = (100, 1500);
    load.slow_pct = 1;
    load.abandon_pct = 1;
    let sh = Shared::new(primary.port, load);
    let keys = sh.load.keys.clone();
    let mut logs = Vec::new();
    run_load(&sh, || {
        for round in 0..p.faults {
            sleep(p.phase);
            primary.kill();
            sh.port.store(0, Relaxed);
            sh.history.faults.fetch_add(1, Relaxed);
            sleep(Duration::from_millis(150));
            let before = sh.history.max_fences();
            logs.push(primary.log());
            assert_eq!(
                replica.conn().call(&["REPLICAOF", "NO", "ONE"]),
                Reply::status("OK")
            );
            wait_for("promoted", || {
                (replica.info_field("replication", "role").as_deref() == Some("master"))
                    .then_some(())
            });
            let after = fences_now(&replica, &keys);
            sh.history
                .check_i4(&before, &after, &format!("failover #{round}"));
            let fresh = Server::start();
            link(&replica, &fresh);
            sh.port.store(replica.port, Relaxed);
            primary = std::mem::replace(&mut replica, fresh);
        }
        sleep(p.phase);
    });
    logs.push(primary.log());
    logs.push(replica.log());
    let name = if replica_ack.is_some() {
        "failover-wait1"
    } else {
        "failover-no-wait"
    };
    report(name, &sh, started, &logs)
}

/// Clients act only on grants that `WAIT 1` confirmed: everything must hold.
#[test]
fn failover_with_wait_1_after_each_grant() {
    failover(Some(200)).finish(&[1, 2, 3, 4, 5]);
}

/// Without `WAIT 1` a grant the replica never received is lost by failover (README): I3 and I4
/// violations may show and are reported; the fence order (I2) rests on the clock term.
#[test]
fn failover_without_wait() {
    failover(None).finish(&[1, 5]);
}

// ---------------------------------------------------------------------------------------------
// Scenario: a holder process stopped with SIGSTOP past its lease

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
    let start = Instant::now();
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "chaos_child_holder_process",
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
        let end = Instant::now();
        let fence: u64 = fence.parse().expect("fence");
        sh.history.add_grant(Grant {
            key: key.to_string(),
            fence,
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

// ---------------------------------------------------------------------------------------------
// Bad input: LOCK.* commands with random and mutated arguments, and corrupted RESTORE payloads

const NAMES: &[&str] = &[
    "LOCK.ACQUIRE",
    "LOCK.RELEASE",
    "LOCK.RENEW",
    "LOCK.FENCE",
    "LOCK.WAIT",
    "LOCK.INFO",
    "LOCK.FORCERELEASE",
    "LOCK.APPLY",
    "LOCK.FLOOR",
    "lock.acquire",
    "Lock.Release",
    "lock.renew",
    "LOCK.BOGUS",
    "LOCK.",
];
const LOCK_KEYS: &[&str] = &["fz:0", "fz:1", "fz:2", "fz:3"];
/// Keys of other types, created before fuzzing and checked unchanged after.
const OTHER_KEYS: &[(&str, &[&str])] = &[
    ("fz:str", &["SET", "fz:str", "a string"]),
    ("fz:list", &["RPUSH", "fz:list", "a", "b"]),
    ("fz:hash", &["HSET", "fz:hash", "f", "v"]),
    ("fz:set", &["SADD", "fz:set", "m"]),
    ("fz:zset", &["ZADD", "fz:zset", "1", "m"]),
    ("fz:stream", &["XADD", "fz:stream", "1-1", "f", "v"]),
    ("keep:1", &["SET", "keep:1", "unrelated data"]),
    (
        "keep:2",
        &["HSET", "keep:2", "field", "value", "other", "1"],
    ),
];
const TOKENS: &[&str] = &["t1", "t2", "t3"];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "5",
    "20",
    "50",
    "51",
    "-1",
    "-0",
    "00",
    "01",
    "+1",
    " 1",
    "1 ",
    "1.5",
    "1e3",
    "0x1f",
    "",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "35184372088832",
    "35184372088833",
    "86400000",
    "31536000000",
    "99999999999999999999999999",
    "\u{0}1",
];
const WORDS: &[&str] = &[
    "WAIT",
    "wait",
    "Wait",
    "REENTRANT",
    "reentrant",
    "SESSION",
    "session",
    "WAITS",
    "REENTRAN",
    "SESSION\u{0}",
    "--",
    "acquire",
    "release",
    "sync",
    "expired",
    "drophold",
];

fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

fn fuzz_arg(rng: &mut Rng, fences: &[i64]) -> Vec<u8> {
    match rng.below(12) {
        0 | 1 => {
            let all: Vec<&str> = LOCK_KEYS
                .iter()
                .copied()
                .chain(OTHER_KEYS.iter().map(|(k, _)| *k))
                .chain(["fz:none", "", "{fz}:x"])
                .collect();
            rng.pick(&all).as_bytes().to_vec()
        }
        2 | 3 => rng.pick(TOKENS).as_bytes().to_vec(),
        4 => {
            let len = match rng.below(20) {
                0 => 65 + rng.below(300) as usize,
                1 => 70_000,
                _ => rng.below(40) as usize,
            };
            random_bytes(rng, len)
        }
        5 | 6 => rng.pick(NUMBERS).as_bytes().to_vec(),
        7 => rng.pick(WORDS).as_bytes().to_vec(),
        8 => (rng.next() as i64).to_string().into_bytes(),
        9 if !fences.is_empty() => {
            let f = *rng.pick(fences) + rng.range(0, 2) as i64 - 1;
            f.to_string().into_bytes()
        }
        _ => {
            let mut arg = rng.pick(NUMBERS).as_bytes().to_vec();
            let n = rng.below(3) as usize;
            arg.extend(random_bytes(rng, n));
            if !arg.is_empty() && rng.chance(50) {
                let i = rng.below(arg.len() as u64) as usize;
                arg[i] ^= 1 << rng.below(8);
            }
            arg
        }
    }
}

/// A command that makes sense, so the lock state really changes.
fn sane_command(rng: &mut Rng, fences: &[i64]) -> Vec<Vec<u8>> {
    let key = if rng.chance(5) {
        rng.pick(OTHER_KEYS).0.to_string()
    } else {
        rng.pick(LOCK_KEYS).to_string()
    };
    let token = rng.pick(TOKENS).to_string();
    let ms = |rng: &mut Rng| rng.range(1, 60).to_string();
    let words: Vec<String> = match rng.below(8) {
        0 | 1 => {
            let mut w = vec!["LOCK.ACQUIRE".into(), key, token, ms(rng)];
            if rng.chance(40) {
                w.extend(["WAIT".into(), rng.range(1, 5).to_string()]);
            }
            if rng.chance(20) {
                w.push("REENTRANT".into());
            }
            if rng.chance(20) {
                w.push("SESSION".into());
            }
            w
        }
        2 => vec!["LOCK.RELEASE".into(), key, token],
        3 => vec!["LOCK.RENEW".into(), key, token, ms(rng)],
        4 => {
            let fence = fences.last().copied().unwrap_or(1).to_string();
            vec!["LOCK.FENCE".into(), key, fence]
        }
        5 => vec!["LOCK.WAIT".into(), key, rng.range(1, 5).to_string()],
        6 => vec!["LOCK.INFO".into(), key],
        _ => vec!["LOCK.FORCERELEASE".into(), key],
    };
    words.into_iter().map(String::into_bytes).collect()
}

fn fuzz_command(rng: &mut Rng, fences: &[i64]) -> Vec<Vec<u8>> {
    match rng.below(10) {
        0..=3 => sane_command(rng, fences),
        4..=7 => {
            let mut cmd = sane_command(rng, fences);
            for _ in 0..rng.range(1, 3) {
                let i = 1 + rng.below(cmd.len() as u64) as usize;
                match rng.below(6) {
                    0 => cmd.insert(i.min(cmd.len()), fuzz_arg(rng, fences)),
                    1 if cmd.len() > 1 => {
                        cmd.remove(i.min(cmd.len() - 1).max(1));
                    }
                    2 => {
                        let j = rng.below(cmd.len() as u64) as usize;
                        let dup = cmd[j].clone();
                        cmd.insert(i.min(cmd.len()), dup);
                    }
                    3 => {
                        let word = rng
                            .pick(&["WAIT", "REENTRANT", "SESSION"])
                            .as_bytes()
                            .to_vec();
                        cmd.insert(i.min(cmd.len()), word);
                    }
                    _ if i < cmd.len() => cmd[i] = fuzz_arg(rng, fences),
                    _ => cmd.push(fuzz_arg(rng, fences)),
                }
            }
            cmd
        }
        _ => {
            let mut cmd = vec![rng.pick(NAMES).as_bytes().to_vec()];
            for _ in 0..rng.below(9) {
                cmd.push(fuzz_arg(rng, fences));
            }
            cmd
        }
    }
}

#[derive(Default, Debug)]
struct FuzzStats {
    commands: u64,
    in_multi: u64,
    ints: u64,
    nils: u64,
    errors: BTreeMap<String, u64>,
    other: u64,
}

impl FuzzStats {
    fn count(&mut self, reply: &Reply) {
        if let Some(e) = reply.error_bytes() {
            let kind = e.split(|b| *b == b' ').next().unwrap_or(b"");
            *self
                .errors
                .entry(String::from_utf8_lossy(kind).into_owned())
                .or_default() += 1;
            return;
        }
        match reply {
            Reply::Int(_) => self.ints += 1,
            Reply::Nil => self.nils += 1,
            _ => self.other += 1,
        }
    }
}

/// Sends `count` fuzzed commands in pipelined batches; panics when the server goes away.
fn fuzz_commands(server: &Server, seed: u64, count: u64, resp3: bool) -> FuzzStats {
    let mut rng = Rng(seed);
    let mut conn = Conn::connect(server.port, Duration::from_secs(30)).expect("connect");
    if resp3 {
        conn.try_send(&["HELLO", "3"]).expect("HELLO");
        conn.try_read().expect("HELLO reply");
    }
    let mut stats = FuzzStats::default();
    let mut fences: Vec<i64> = Vec::new();
    let mut sent = 0;
    while sent < count {
        let mut batch: Vec<Vec<Vec<u8>>> = Vec::new();
        let size = 256.min(count - sent);
        let multi = rng.chance(3) && std::env::var("CHAOS_FUZZ_TRACE").is_err();
        if multi {
            batch.push(vec![b"MULTI".to_vec()]);
        }
        for _ in 0..size {
            batch.push(fuzz_command(&mut rng, &fences));
        }
        if multi {
            batch.push(vec![b"EXEC".to_vec()]);
            stats.in_multi += size;
        }
        if std::env::var("CHAOS_FUZZ_TRACE").is_ok() {
            // Every command followed by an ECHO marker: a command that answers nothing (or
            // twice) shows at once.
            batch = batch
                .into_iter()
                .enumerate()
                .flat_map(|(i, cmd)| {
                    [
                        cmd,
                        vec![b"ECHO".to_vec(), format!("marker-{i}").into_bytes()],
                    ]
                })
                .collect();
        }
        for cmd in &batch {
            conn.try_send(cmd).unwrap_or_else(|e| {
                panic!("server gone while sending (seed {seed:#x}, after {sent}): {e}")
            });
        }
        for cmd in &batch {
            let reply = conn.try_read().unwrap_or_else(|e| {
                let show = |cmd: &Vec<Vec<u8>>| -> Vec<String> {
                    cmd.iter()
                        .map(|a| String::from_utf8_lossy(a).chars().take(40).collect())
                        .collect()
                };
                let batch_text: Vec<String> =
                    batch.iter().map(|c| format!("{:?}", show(c))).collect();
                let state = Conn::connect(server.port, Duration::from_secs(2))
                    .map(|mut d| {
                        let mut out = d.call(&["CLIENT", "LIST"]).text();
                        for key in LOCK_KEYS {
                            out += &format!("\n{key}: {:?}", d.call(&["LOCK.INFO", key]));
                        }
                        out
                    })
                    .unwrap_or_else(|e| format!("server unreachable: {e}"));
                panic!(
                    "no reply to {:?} (seed {seed:#x}, after {sent}): {e}\nserver state:\n{state}\nbatch:\n{}",
                    show(cmd),
                    batch_text.join("\n")
                )
            });
            if cmd[0] == b"ECHO" {
                assert!(
                    matches!(&reply, Reply::Bulk(b) if *b == cmd[1]),
                    "out of step at {}: {reply:?}; batch: {:?}",
                    String::from_utf8_lossy(&cmd[1]),
                    batch
                        .iter()
                        .map(|c| c
                            .iter()
                            .map(|a| String::from_utf8_lossy(a)
                                .chars()
                                .take(30)
                                .collect::<String>())
                            .collect::<Vec<_>>())
                        .collect::<Vec<_>>()
                );
                continue;
            }
            if let Reply::Int(f) = reply {
                if cmd[0].eq_ignore_ascii_case(b"LOCK.ACQUIRE") && f > 1 {
                    fences.push(f);
                    if fences.len() > 16 {
                        fences.remove(0);
                    }
                }
            }
            stats.count(&reply);
        }
        sent += size;
        stats.commands += size;
    }
    stats
}

/// A corrupted or odd DUMP payload of the lock type (its checksum mostly right, so it reaches the
/// module's loader).
fn fuzz_payload(rng: &mut Rng, format: &LockDumpFormat, now_fence: u64, extreme: bool) -> Vec<u8> {
    let fence = if extreme {
        *rng.pick(&[0, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX])
    } else {
        rng.range(1, now_fence + (1 << 30))
    };
    let mut fields = if rng.chance(40) {
        tombstone_fields(fence)
    } else {
        let n = rng.below(24) as usize;
        let token = random_bytes(rng, n);
        let soon = now_ms() + rng.below(60);
        let deadline = *rng.pick(&[0, 1, soon, u64::MAX, now_ms() - 1000]);
        let holds = *rng.pick(&[0, 1, 2, u64::from(u32::MAX), u64::from(u32::MAX) + 1]);
        let flags = *rng.pick(&[0, 1, 2, 3, u64::MAX]);
        held_fields(fence, &token, deadline, holds, flags)
    };
    for _ in 0..rng.below(4) {
        if fields.is_empty() {
            break;
        }
        let i = rng.below(fields.len() as u64) as usize;
        match rng.below(7) {
            0 => fields[i] ^= 1 << rng.below(8),
            1 => fields.truncate(i),
            2 => {
                let n = rng.range(1, 8) as usize;
                let extra = random_bytes(rng, n);
                fields.splice(i..i, extra);
            }
            3 => fields[i] = *rng.pick(&[0, 1, 2, 3, 4, 5, 0x80, 0x81, 0xC0, 0xFF]),
            4 => {
                let huge = rdb_len(*rng.pick(&[1 << 20, 1 << 31, u64::from(u32::MAX)]));
                fields.splice(i..i, [vec![5], huge].concat());
            }
            5 => fields.extend(rdb_uint(rng.next())),
            _ => {
                fields.pop();
            }
        }
    }
    let module_id = match rng.below(20) {
        0 => format.module_id & !1023,
        1 => (format.module_id & !1023) | 2,
        2 => (format.module_id & !1023) | 1023,
        3 => rng.next() >> 1,
        _ => format.module_id,
    };
    let mut payload = format.payload_with_id(module_id, &fields);
    if rng.chance(3) {
        let n = payload.len();
        payload[n - 1] ^= 0x55;
    }
    payload
}

fn restore_fuzz(
    server: &Server,
    format: &LockDumpFormat,
    seed: u64,
    count: u64,
    extreme: bool,
) -> (u64, u64) {
    let mut rng = Rng(seed);
    let mut conn = server.conn();
    let now_fence = now_ms() << 11;
    let (mut ok, mut refused) = (0, 0);
    for i in 0..count {
        let payload = fuzz_payload(&mut rng, format, now_fence, extreme);
        let key = if rng.chance(30) {
            rng.pick(LOCK_KEYS).to_string()
        } else {
            format!("fz:r:{}", i % 64)
        };
        let reply = conn.call(&[&b"RESTORE"[..], key.as_bytes(), b"0", &payload, b"REPLACE"]);
        match reply {
            Reply::Status(_) => {
                ok += 1;
                // Use what was restored: commands on odd values must behave too.
                for cmd in [
                    vec!["LOCK.INFO", &key],
                    vec!["LOCK.ACQUIRE", &key, "t1", "20"],
                    vec!["LOCK.RENEW", &key, "t1", "20"],
                    vec!["LOCK.FENCE", &key, "1"],
                    vec!["LOCK.RELEASE", &key, "t1"],
                ] {
                    let _ = conn.call(&cmd);
                }
            }
            Reply::Error(_) => refused += 1,
            other => panic!("RESTORE answered {other:?}"),
        }
    }
    (ok, refused)
}

fn lock_type_keys(conn: &mut Conn) -> i64 {
    let mut cursor = "0".to_string();
    let mut count = 0;
    loop {
        let reply = conn.call(&["SCAN", &cursor, "COUNT", "1000", "TYPE", "lockstate"]);
        let items = reply.items();
        cursor = items[0].text();
        count += items[1].items().len() as i64;
        if cursor == "0" {
            return count;
        }
    }
}

#[test]
fn fuzzed_commands_and_corrupted_restores_leave_the_server_up() {
    let p = params();
    let started = Instant::now();
    let server = Server::start();
    let pid = server.pid();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    // Short leases bound every wait a fuzzed command can start; small limits hit their errors.
    for (name, value) in [
        ("lock.max-ttl", "50"),
        ("lock.max-waiters", "4"),
        ("lock.max-token-len", "64"),
    ] {
        assert_eq!(c.call(&["CONFIG", "SET", name, value]), Reply::status("OK"));
    }
    for (_, setup) in OTHER_KEYS {
        assert!(!matches!(c.call(setup), Reply::Error(_)), "{setup:?}");
    }
    let digests: Vec<String> = OTHER_KEYS
        .iter()
        .map(|(k, _)| digest_value(&mut c, k))
        .collect();
    let threads = 3u64;
    let per_thread = p.fuzz_commands / (2 * threads) + 1;
    let stop = AtomicBool::new(false);
    let run_commands = |phase: u64| -> Vec<FuzzStats> {
        thread::scope(|s| {
            // Blocked fuzz clients are unblocked now and then, so no pipeline stalls for long.
            s.spawn(|| {
                let mut control = server.conn();
                while !stop.load(Relaxed) {
                    sleep(Duration::from_millis(200));
                    let list = control.call(&["CLIENT", "LIST", "TYPE", "normal"]).text();
                    for line in list.lines().filter(|l| l.contains("flags=b")) {
                        if let Some(id) = line.split(' ').find_map(|f| f.strip_prefix("id=")) {
                            control.call(&["CLIENT", "UNBLOCK", id]);
                        }
                    }
                }
            });
            let _stop = StopOnDrop(&stop);
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let server = &server;
                    s.spawn(move || {
                        fuzz_commands(server, 0xF022 + phase * 100 + t, per_thread, t == 2)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("fuzz worker"))
                .collect()
        })
    };
    let mut stats = run_commands(0);
    stop.store(false, Relaxed);
    let (ok, refused) = restore_fuzz(&server, &format, 0x5E57, p.fuzz_restores, false);
    stats.extend(run_commands(1));
    let (ok2, refused2) = restore_fuzz(&server, &format, 0x5E58, p.fuzz_restores / 10 + 10, true);

    // The server is the same process, answers, and kept every unrelated key.
    assert_eq!(server.pid(), pid);
    assert_eq!(c.call(&["PING"]), Reply::status("PONG"));
    let after: Vec<String> = OTHER_KEYS
        .iter()
        .map(|(k, _)| digest_value(&mut c, k))
        .collect();
    assert_eq!(after, digests, "keys of other types changed");
    assert_eq!(c.call(&["GET", "keep:1"]), Reply::bulk("unrelated data"));
    // The key gauge matches the keyspace, and everything saves and loads again.
    assert_eq!(server.info_int("lock_keys"), lock_type_keys(&mut c));
    assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::status("OK"));
    assert_eq!(server.info_int("lock_keys"), lock_type_keys(&mut c));
    let fresh = c.call(&["LOCK.ACQUIRE", "fz:after", "final-token", "50"]);
    assert!(
        matches!(fresh, Reply::Int(_) | Reply::Error(_)),
        "a plain acquire after fuzzing: {fresh:?}"
    );
    let log = server.log();
    let panics = module_panics(std::slice::from_ref(&log));
    let refused_loads = log.matches("lock module cannot load a lock").count();
    let total: u64 = stats.iter().map(|s| s.commands).sum();
    let in_multi: u64 = stats.iter().map(|s| s.in_multi).sum();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for s in &stats {
        for (k, v) in &s.errors {
            *errors.entry(k.clone()).or_default() += v;
        }
    }
    let ints: u64 = stats.iter().map(|s| s.ints).sum();
    let nils: u64 = stats.iter().map(|s| s.nils).sum();
    let line = format!(
        "{:<24} commands {total} ({in_multi} in MULTI; {ints} integer, {nils} nil replies, errors {errors:?}); RESTORE payloads {} (accepted {}, refused {}; module refused {refused_loads} loads); crashes 0, module panics {panics}, {:.0}s",
        "fuzz",
        ok + refused + ok2 + refused2,
        ok + ok2,
        refused + refused2,
        started.elapsed().as_secs_f64()
    );
    println!("chaos: {line}");
    if let Ok(path) = std::env::var("CHAOS_REPORT") {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
    assert_eq!(panics, 0, "module panics:\n{log}");
    assert!(total >= p.fuzz_commands, "{total} commands");
}

// ---------------------------------------------------------------------------------------------
// Module bugs the chaos suite found (failing tests, ignored until src/ is fixed)

/// A RESTOREd lock whose lease deadline lies absurdly far ahead (u64::MAX, or more than
/// i64::MAX / 1000 ms from now, where `period * 1000` in RedisModule_CreateTimer would overflow)
/// must not make the expiry timer misfire or spin: the server keeps answering and the lock stays
/// held.
#[test]
fn restored_lock_with_far_future_deadline_keeps_the_server_responsive() {
    let server = Server::start();
    let mut c = server.conn();
    let format = LockDumpFormat::learn(&mut c);
    let fence = fence_far_ahead(&mut c);
    for (key, deadline) in [("far", u64::MAX), ("far2", now_ms() + (1 << 54))] {
        let payload = format.payload(&held_fields(fence, b"token", deadline, 1, 0));
        assert_eq!(restore(&mut c, key, &payload), Reply::status("OK"));
        sleep(Duration::from_millis(200));
        let mut probe = Conn::connect(server.port, Duration::from_secs(3)).expect("connect");
        probe.try_send(&["LOCK.INFO", key]).expect("send");
        let info = probe
            .try_read()
            .expect("the server answers after the RESTORE");
        assert!(info.contains_bytes(b"held"), "{info:?}");
    }
}

/// `ERR unknown option '...'` quotes the option as typed, made printable (src/error.rs
/// `unknown_option`): control characters become '?', but other characters are kept, and the
/// redis-module crate turns the message into a C string with `c as u8` per character
/// (`Context::str_as_legal_resp_string`). A character whose code point is a multiple of 256
/// (U+0100 'Ā', U+0500 'Ԁ', ...) becomes a NUL byte, `CString::new(..).unwrap()` panics inside
/// `reply_error_string`, the module's panic guard in `ffi::run_command` catches it, and the
/// client gets no reply at all: a pipelining client is out of step from then on, a waiting one
/// hangs. The server log shows `lock module bug (caught, server kept running): panicked at
/// .../redis-module-2.0.8/src/context/mod.rs:480:10`. Other non-ASCII characters are cut to
/// their low byte (an 'é' arrives as the byte 0xE9). A fix: keep only printable ASCII in
/// `unknown_option` (anything else as '?'), and have `run_command` answer a fallback error when
/// replying panics.
#[test]
fn unknown_option_with_any_character_gets_an_error_reply() {
    let server = Server::start();
    for option in ["\u{100}", "x\u{500}y", "\u{4e00}"] {
        let mut c = Conn::connect(server.port, Duration::from_secs(3)).expect("connect");
        c.try_send(&["LOCK.ACQUIRE", "k", "token", "1000", option])
            .expect("send");
        let reply = c.try_read();
        assert!(
            matches!(&reply, Ok(Reply::Error(e)) if e.starts_with("ERR unknown option")),
            "option {option:?}: {reply:?}"
        );
    }
    assert!(
        !server.log().contains("lock module bug"),
        "{}",
        server.log()
    );
}

/// Found by `make valgrind` (definitely lost: 160 bytes from RM_CreateDataType under
/// redis_lock::register): a `MODULE LOAD` refused for a bad argument leaks the module's data type.
/// `register` (src/lib.rs) creates the data type before it checks the arguments
/// (`config::check_arg_names`, `value_from_args`); when OnLoad then returns ERR, Redis unloads
/// the module but never frees the type it registered. One small block per refused load (on a
/// running server, through MODULE LOAD; at startup the server exits anyway). A fix: check the
/// arguments before `create_data_type`.
#[test]
fn refused_module_loads_do_not_leak() {
    let mut config = Config::default().with("enable-module-command", "yes");
    config.load_module = false;
    let server = Server::start_with(config);
    let mut c = server.conn();
    let path = module_path().to_string_lossy().into_owned();
    let mut load_bad = || {
        let reply = c.call(&["MODULE", "LOAD", &path, "max-tll", "5"]);
        assert!(matches!(reply, Reply::Error(_)), "{reply:?}");
    };
    // Redis' own bookkeeping grows for the first few hundred refused loads and then stays put
    // (seen with a nonexistent path too); a leak of the module's type (160 B per load) would
    // grow every batch by 16 kB. So: batches of 100 until one grows by less than 4 kB.
    let mut probe = server.conn();
    let mut used = || -> i64 {
        let info = probe.call(&["INFO", "memory"]).text();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory")
    };
    let mut growth = Vec::new();
    for _ in 0..10 {
        let before = used();
        for _ in 0..100 {
            load_bad();
        }
        growth.push(used() - before);
        if growth.last().is_some_and(|g| *g < 4096) {
            break;
        }
    }
    assert!(
        growth.last().is_some_and(|g| *g < 4096),
        "refused loads keep growing used memory, per batch of 100: {growth:?}"
    );
    assert_eq!(
        server.conn().call(&["MODULE", "LOAD", &path]),
        Reply::status("OK")
    );
}
