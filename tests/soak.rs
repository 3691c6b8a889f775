//! The soak test: a steady mixed load on one primary with a replica, AOF on both, for
//! `SOAK_MINUTES` (default 30; `make soak`, and `make soak-ci` with 1.5 in CI).
//!
//! The load covers the command surface: exclusive, shared and permit acquires with and without
//! WAIT, SESSION, REENTRANT, LOCKDELAY and SYNC (with the replica sometimes held back), renewals,
//! releases and leases left to expire, LOCK.MACQUIRE / MRELEASE, LOCK.GUARD, LOCK.WAIT, clients
//! that disconnect while holding or waiting, LABEL, LOCK.WHO, LOCK.LIST and LOCK.LONGHOLDS with
//! long holds crossing `lock.long-hold`, and "other" clients that delete, overwrite, rename,
//! move, copy, restore and flush lock keys, or take a lock for a long lease and DEL it.
//!
//! Every few seconds a sample of the primary: used_memory, RSS, lock_keys against the keyspace,
//! the lease index's entries, blocked clients against lock_waiters, and the handoff latency of
//! a probe pair. It fails on sustained memory growth (the slope of used_memory over the second
//! half of the run, not a bare threshold), on a waiter answered long after its timeout (or never),
//! on the module's bookkeeping drifting from the keyspace, on a primary/replica digest difference
//! once the load stops, and on a crash. The figures go to stdout and to `SOAK_REPORT` if set.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

use common::*;

/// Lock keys per family: small enough that clients meet on them.
const KEYS: u64 = 48;
/// A longer read timeout than any wait a worker asks for: a reply later than this is a stuck
/// waiter.
const PATIENT: Duration = Duration::from_secs(20);
/// How much later than its WAIT timeout a waiter may be answered (a SYNC reply waits for the
/// replica on top) before it counts as stuck.
const LATE_MS: u128 = 2_500;

/// A small deterministic generator (xorshift64*): the load is random, but a failing run can be
/// repeated with its seed (`SOAK_SEED`).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What the workers share with the test.
struct Shared {
    stop: AtomicBool,
    port: u16,
    replica_port: u16,
    ops: AtomicU64,
    failures: Mutex<Vec<String>>,
    /// (seconds since the start, handoff latency in µs) of the probe pair.
    handoffs: Mutex<Vec<(f64, u64)>>,
    started: Instant,
    seed: u64,
}

impl Shared {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }
    fn fail(&self, what: String) {
        eprintln!("soak: FAILURE: {what}");
        self.failures.lock().expect("failures").push(what);
        self.stop.store(true, Ordering::Relaxed);
    }
    fn count(&self, n: u64) {
        self.ops.fetch_add(n, Ordering::Relaxed);
    }
    fn conn(&self) -> Conn {
        Conn::connect(self.port, PATIENT).expect("connect to the primary")
    }
    /// A generator of its own for one worker (`salt` tells them apart).
    fn rng(&self, salt: u64) -> Rng {
        Rng::new(self.seed ^ salt)
    }
}

/// A load worker's own connection, random choices and tokens.
struct Worker {
    shared: Arc<Shared>,
    rng: Rng,
    c: Conn,
    tokens: Tokens,
    /// Where this worker's walk of LOCK.LIST is.
    list_cursor: String,
}

impl Worker {
    /// Worker `n` of a kind (`tag` in its tokens, `salt` in its random choices).
    fn new(shared: Arc<Shared>, tag: &str, salt: u64, n: u64) -> Worker {
        Worker {
            rng: shared.rng(salt + n),
            c: shared.conn(),
            tokens: Tokens::new(format!("{tag}{n}")),
            list_cursor: "0".into(),
            shared,
        }
    }
    fn running(&self) -> bool {
        self.shared.running()
    }
    fn token(&mut self) -> String {
        self.tokens.next()
    }
    fn call(&mut self, args: &[String], wait_ms: Option<u64>) -> Option<Reply> {
        call(&self.shared, &mut self.c, args, wait_ms)
    }
}

/// Fresh tokens for one worker: `tok-<tag>-<n>`.
struct Tokens(String, u64);

impl Tokens {
    fn new(tag: String) -> Tokens {
        Tokens(tag, 0)
    }
    fn next(&mut self) -> String {
        self.1 += 1;
        format!("tok-{}-{}", self.0, self.1)
    }
}

/// A reply a worker accepts; anything else fails the run.
fn expected(reply: &Reply) -> bool {
    match reply {
        Reply::Int(_) | Reply::Nil | Reply::Status(_) | Reply::Array(_) | Reply::Bulk(_) => true,
        Reply::Error(text) => [
            "NOREPLICAS",
            "FENCED",
            // A lock deleted or renamed under a waiter by the vandal.
            "TRYAGAIN",
            // The vandal may leave a string where a lock was.
            "WRONGTYPE",
            // A permit asked on a key that is a lock at the moment, and the other way round.
            "ERR the key is a semaphore",
            "ERR the lock is held as a lock",
            "ERR this token holds the lock shared",
            "ERR too many waiters",
            // RENAME of a key the vandal picked while it did not exist.
            "ERR no such key",
        ]
        .iter()
        .any(|prefix| text.starts_with(prefix)),
        _ => false,
    }
}

/// Sends one command and checks its reply; `wait_ms`: the WAIT timeout it carries, if any, so
/// that a late answer is caught. `None` when the run is over or failed.
fn call(shared: &Shared, c: &mut Conn, args: &[String], wait_ms: Option<u64>) -> Option<Reply> {
    let started = Instant::now();
    if c.try_send(args).is_err() {
        shared.fail(format!("the primary closed the connection before {args:?}"));
        return None;
    }
    let reply = match c.try_read() {
        Ok(reply) => reply,
        Err(error) => {
            shared.fail(format!(
                "no reply to {:?} after {:?}: {error} (a stuck waiter or a crash)",
                redacted(args),
                started.elapsed()
            ));
            return None;
        }
    };
    if let Some(wait) = wait_ms {
        let took = started.elapsed().as_millis();
        if took > u128::from(wait) + LATE_MS {
            shared.fail(format!(
                "{:?} answered after {took} ms, its WAIT was {wait} ms",
                redacted(args)
            ));
        }
    }
    if !expected(&reply) {
        shared.fail(format!("{:?} answered {reply:?}", redacted(args)));
        return None;
    }
    shared.count(1);
    Some(reply)
}

fn redacted(args: &[String]) -> Vec<&str> {
    args.iter()
        .map(|a| if a.starts_with("tok-") { "(token)" } else { a })
        .collect()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

fn fence_of_reply(reply: &Reply) -> Option<i64> {
    match reply {
        Reply::Int(fence) => Some(*fence),
        _ => None,
    }
}

/// Exclusive locks with every option: WAIT, REENTRANT, SESSION, LOCKDELAY, SYNC; renewed,
/// released or left to expire.
fn exclusive_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut w = Worker::new(shared, "x", 0x100, n);
    while w.running() {
        let key = format!("soak:x:{}", w.rng.below(KEYS));
        let token = w.token();
        let ttl = w.rng.range(100, 3_000);
        let mut args = strings(&["LOCK.ACQUIRE", &key, &token, &ttl.to_string()]);
        let wait = w.rng.chance(50).then(|| w.rng.range(10, 800));
        if let Some(wait) = wait {
            args.extend(strings(&["WAIT", &wait.to_string()]));
        }
        let reentrant = w.rng.chance(10);
        if reentrant {
            args.push("REENTRANT".into());
        }
        if w.rng.chance(15) {
            args.push("SESSION".into());
        }
        if w.rng.chance(10) {
            args.extend(strings(&["LOCKDELAY", &w.rng.range(20, 200).to_string()]));
        }
        if w.rng.chance(30) {
            args.extend(strings(&["LABEL", &format!("soak-{}", w.rng.below(100))]));
        }
        let sync = w.rng.chance(10);
        if sync {
            args.extend(strings(&["SYNC", "1", "300"]));
        }
        let budget = wait.map(|w| w + if sync { 300 } else { 0 });
        let reply = w.call(&args, budget)?;
        if fence_of_reply(&reply).is_none() {
            continue;
        }
        if reentrant && w.call(&args, budget).is_none() {
            return None;
        }
        if w.rng.chance(30) {
            let renew = strings(&[
                "LOCK.RENEW",
                &key,
                &token,
                &w.rng.range(100, 3_000).to_string(),
            ]);
            w.call(&renew, None)?;
        }
        // Most holders release; the rest leave the lease to run out.
        if w.rng.chance(85) {
            let release = strings(&["LOCK.RELEASE", &key, &token]);
            for _ in 0..if reentrant { 2 } else { 1 } {
                w.call(&release, None)?;
            }
        }
    }
    Some(())
}

/// Shared holds and semaphore permits, and LOCK.WAIT on them.
fn shared_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut w = Worker::new(shared, "s", 0x200, n);
    while w.running() {
        let token = w.token();
        let permits = w.rng.chance(50);
        let key = if permits {
            format!("soak:p:{}", w.rng.below(KEYS / 4))
        } else {
            format!("soak:s:{}", w.rng.below(KEYS / 4))
        };
        if w.rng.chance(10) {
            let wait = w.rng.range(10, 500);
            let args = strings(&["LOCK.WAIT", &key, &wait.to_string()]);
            w.call(&args, Some(wait))?;
            continue;
        }
        // Operators looking: who holds and waits, and the long-hold log.
        if w.rng.chance(3) {
            let count = w.rng.range(1, 20).to_string();
            w.call(&strings(&["LOCK.WHO", &key, "COUNT", &count]), None)?;
            w.call(&strings(&["LOCK.LONGHOLDS", "GET", "5"]), None)?;
            // A page of every lock, from a cursor of its own walk.
            let cursor = w.list_cursor.clone();
            let page = w.call(&strings(&["LOCK.LIST", &cursor, "COUNT", &count]), None)?;
            w.list_cursor = match &page {
                Reply::Array(items) => items.first().map_or("0".into(), Reply::text),
                other => {
                    w.shared.fail(format!("LOCK.LIST answered {other:?}"));
                    "0".into()
                }
            };
            continue;
        }
        let ttl = w.rng.range(100, 2_000).to_string();
        let mut args = strings(&["LOCK.ACQUIRE", &key, &token, &ttl]);
        // Now and then an exclusive request among the readers.
        if permits {
            args.extend(strings(&["LIMIT", "3"]));
        } else if w.rng.chance(85) {
            args.push("SHARED".into());
        }
        let wait = w.rng.chance(50).then(|| w.rng.range(10, 500));
        if let Some(wait) = wait {
            args.extend(strings(&["WAIT", &wait.to_string()]));
        }
        let reply = w.call(&args, wait)?;
        if fence_of_reply(&reply).is_none() {
            continue;
        }
        if w.rng.chance(30) {
            let renew = strings(&["LOCK.RENEW", &key, &token, &ttl]);
            w.call(&renew, None)?;
        }
        if w.rng.chance(90)
            && w.call(&strings(&["LOCK.RELEASE", &key, &token]), None)
                .is_none()
        {
            return None;
        }
    }
    Some(())
}

/// Several locks at once.
fn multi_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut w = Worker::new(shared, "m", 0x300, n);
    while w.running() {
        let token = w.token();
        let count = w.rng.range(2, 3);
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < count as usize {
            let key = format!("soak:m:{}", w.rng.below(KEYS / 3));
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let mut args = vec!["LOCK.MACQUIRE".to_string(), count.to_string()];
        args.extend(keys.iter().cloned());
        args.extend(strings(&[&token, &w.rng.range(100, 2_000).to_string()]));
        let wait = w.rng.chance(60).then(|| w.rng.range(10, 600));
        if let Some(wait) = wait {
            args.extend(strings(&["WAIT", &wait.to_string()]));
        }
        let reply = w.call(&args, wait)?;
        if !matches!(reply, Reply::Array(_)) || w.rng.chance(10) {
            continue;
        }
        let mut release = vec!["LOCK.MRELEASE".to_string(), count.to_string()];
        release.extend(keys);
        release.push(token);
        w.call(&release, None)?;
    }
    Some(())
}

/// Fenced writes: LOCK.GUARD with the current fence and with a stale one.
fn guard_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut w = Worker::new(shared, "g", 0x400, n);
    while w.running() {
        let token = w.token();
        let key = format!("soak:g:{}", w.rng.below(KEYS / 4));
        let args = strings(&["LOCK.ACQUIRE", &key, &token, "1000", "WAIT", "300"]);
        let reply = w.call(&args, Some(300))?;
        let Some(fence) = fence_of_reply(&reply) else {
            continue;
        };
        let data = format!("{key}:data");
        let fence = if w.rng.chance(20) { fence - 1 } else { fence };
        let guarded = strings(&["LOCK.GUARD", &key, &fence.to_string(), "SET", &data, &token]);
        w.call(&guarded, None)?;
        w.call(&strings(&["LOCK.RELEASE", &key, &token]), None)?;
    }
    Some(())
}

/// Connections that close while they hold a session lock or wait in a queue.
fn disconnect_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut rng = shared.rng(0x500 + n);
    let mut tokens = Tokens::new("d".into());
    while shared.running() {
        let token = tokens.next();
        let key = format!("soak:x:{}", rng.below(KEYS));
        let mut c = shared.conn();
        let mut args = strings(&["LOCK.ACQUIRE", &key, &token, "5000"]);
        if rng.chance(50) {
            args.push("SESSION".into());
            call(&shared, &mut c, &args, None)?;
        } else {
            // Queued (or granted at once), then gone before any answer is read.
            args.extend(strings(&["WAIT", "2000"]));
            if c.try_send(&args).is_err() {
                shared.fail("the primary closed a connection".into());
                return None;
            }
            shared.count(1);
        }
        drop(c);
        sleep(Duration::from_millis(rng.range(20, 120)));
    }
    Some(())
}

/// Acquire for a long lease, work, DEL: the key goes without a release (issue 23, item 2).
fn deleting_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut rng = shared.rng(0x600 + n);
    let mut c = shared.conn();
    let mut round = 0u64;
    while shared.running() {
        // Pipelined in small batches.
        let batch = 20;
        for _ in 0..batch {
            round += 1;
            let key = format!("soak:job:{}", round % 1_000);
            let ttl = rng.range(60_000, 600_000).to_string();
            let token = format!("tok-j-{round}");
            c.send(&["LOCK.ACQUIRE", &key, &token, &ttl]);
            c.send(&["DEL", &key]);
        }
        for _ in 0..2 * batch {
            match c.try_read() {
                Ok(reply) if expected(&reply) => shared.count(1),
                other => {
                    shared.fail(format!("acquire + DEL answered {other:?}"));
                    return None;
                }
            }
        }
        sleep(Duration::from_millis(rng.range(30, 70)));
    }
    Some(())
}

/// Other clients: DEL, UNLINK, SET over, RENAME away and onto, MOVE, COPY, DUMP/RESTORE and
/// FLUSHDB on lock keys.
fn vandal_worker(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut rng = shared.rng(0x700 + n);
    let mut c = shared.conn();
    let mut rounds = 0u64;
    while shared.running() {
        rounds += 1;
        let family = ["x", "s", "p", "m", "g"][rng.below(5) as usize];
        let key = format!("soak:{family}:{}", rng.below(KEYS));
        let other = format!("soak:other:{n}:{}", rounds % 64);
        let commands: Vec<Vec<String>> = match rng.below(9) {
            0 => vec![strings(&["DEL", &key])],
            1 => vec![strings(&["UNLINK", &key])],
            2 => vec![strings(&["SET", &key, "a string"]), strings(&["DEL", &key])],
            3 => vec![
                strings(&["RENAME", &key, &other]),
                strings(&["DEL", &other]),
            ],
            4 => vec![
                strings(&["SET", &other, "v"]),
                strings(&["RENAME", &other, &key]),
                strings(&["DEL", &key]),
            ],
            5 => vec![
                strings(&["COPY", &key, &other, "REPLACE"]),
                strings(&["UNLINK", &other]),
            ],
            6 => vec![strings(&["MOVE", &key, "1"])],
            7 => {
                // DUMP, then RESTORE over itself or under another name.
                let reply = call(&shared, &mut c, &strings(&["DUMP", &key]), None)?;
                let Reply::Bulk(payload) = reply else {
                    continue;
                };
                let target = if rng.chance(50) { &key } else { &other };
                let restore = [
                    b"RESTORE".to_vec(),
                    target.as_bytes().to_vec(),
                    b"0".to_vec(),
                    payload,
                    b"REPLACE".to_vec(),
                ];
                match c.call(&restore) {
                    Reply::Status(_) => shared.count(1),
                    other => {
                        shared.fail(format!("RESTORE answered {other:?}"));
                        return None;
                    }
                }
                vec![strings(&["DEL", &other])]
            }
            _ => {
                // Database 1 collects what MOVE sent there; now and then it is flushed.
                if rng.chance(20) {
                    vec![
                        strings(&["SELECT", "1"]),
                        strings(&["FLUSHDB", if rng.chance(50) { "ASYNC" } else { "SYNC" }]),
                        strings(&["SELECT", "0"]),
                    ]
                } else {
                    continue;
                }
            }
        };
        for command in commands {
            call(&shared, &mut c, &command, None)?;
        }
        sleep(Duration::from_millis(rng.range(5, 40)));
    }
    Some(())
}

/// A holder and a queued waiter on one key: the time from the release being sent to the
/// waiter's grant being read.
fn handoff_probe(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut holder = shared.conn();
    let mut waiter = shared.conn();
    let (mut holders, mut waiters) = (Tokens::new(format!("h{n}")), Tokens::new(format!("w{n}")));
    while shared.running() {
        let (held, queued) = (holders.next(), waiters.next());
        let reply = call(
            &shared,
            &mut holder,
            &strings(&[
                "LOCK.ACQUIRE",
                "soak:handoff",
                &held,
                "5000",
                "WAIT",
                "3000",
            ]),
            Some(3000),
        )?;
        if fence_of_reply(&reply).is_none() {
            continue;
        }
        if waiter
            .try_send(&[
                "LOCK.ACQUIRE",
                "soak:handoff",
                &queued,
                "5000",
                "WAIT",
                "3000",
            ])
            .is_err()
        {
            shared.fail("the primary closed the probe's connection".into());
            return None;
        }
        // Pacing, not synchronisation: the waiter is most likely queued by now; if not, its
        // grant is simply immediate.
        sleep(Duration::from_millis(5));
        let released_at = Instant::now();
        call(
            &shared,
            &mut holder,
            &strings(&["LOCK.RELEASE", "soak:handoff", &held]),
            None,
        )?;
        match waiter.try_read() {
            Ok(Reply::Int(_)) => {
                let micros = released_at.elapsed().as_micros() as u64;
                let at = shared.started.elapsed().as_secs_f64();
                shared.handoffs.lock().expect("handoffs").push((at, micros));
                shared.count(1);
                call(
                    &shared,
                    &mut waiter,
                    &strings(&["LOCK.RELEASE", "soak:handoff", &queued]),
                    None,
                )?;
            }
            // The vandal does not touch this key: anything else is a failure.
            other => {
                shared.fail(format!("the probe's waiter got {other:?}"));
                return None;
            }
        }
        sleep(Duration::from_millis(15));
    }
    Some(())
}

/// Holds the replica back now and then (CLIENT PAUSE WRITE there stops it applying its
/// primary's stream), so SYNC requests time out and their grants are taken back.
fn replica_pauser(shared: Arc<Shared>, n: u64) -> Option<()> {
    let mut rng = shared.rng(0x800 + n);
    let mut r = Conn::connect(shared.replica_port, PATIENT).expect("connect to the replica");
    while shared.running() {
        sleep(Duration::from_millis(rng.range(3_000, 10_000)));
        if !shared.running() {
            break;
        }
        let pause = rng.range(200, 800).to_string();
        match r
            .try_send(&["CLIENT", "PAUSE", &pause, "WRITE"])
            .and_then(|_| r.try_read())
        {
            Ok(Reply::Status(_)) => shared.count(1),
            other => {
                shared.fail(format!("CLIENT PAUSE on the replica: {other:?}"));
                return None;
            }
        }
    }
    Some(())
}

/// A keyspace-event subscriber on every lock event (the publishing path is under load too).
fn subscriber(shared: Arc<Shared>, _n: u64) -> Option<()> {
    let mut sub = shared.conn();
    sub.set_timeout(Duration::from_millis(500));
    if sub
        .try_send(&["PSUBSCRIBE", "__keyevent@*__:lock.*"])
        .is_err()
    {
        shared.fail("could not subscribe".into());
        return None;
    }
    while shared.running() {
        match sub.try_read() {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                shared.fail(format!("the subscriber's connection failed: {e}"));
                return None;
            }
        }
    }
    Some(())
}

/// One sample of the primary.
#[derive(Clone, Debug)]
struct Sample {
    secs: f64,
    used_memory: i64,
    rss: i64,
    lock_keys: i64,
    dbsize: i64,
    index_entries: i64,
    waiters: i64,
    blocked: i64,
    ops: u64,
}

fn info_fields(c: &mut Conn) -> BTreeMap<String, String> {
    let text = c.call(&["INFO", "everything"]).text();
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn int(fields: &BTreeMap<String, String>, name: &str) -> i64 {
    fields
        .get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no integer INFO field {name}"))
}

/// Keys in every database, from INFO keyspace (`db0:keys=12,expires=0,...`).
fn keyspace_keys(fields: &BTreeMap<String, String>) -> i64 {
    fields
        .iter()
        .filter(|(name, _)| name.starts_with("db") && name[2..].parse::<u32>().is_ok())
        .filter_map(|(_, v)| v.split(',').find_map(|kv| kv.strip_prefix("keys=")))
        .filter_map(|n| n.parse::<i64>().ok())
        .sum()
}

fn sample(c: &mut Conn, shared: &Shared) -> Sample {
    let fields = info_fields(c);
    Sample {
        secs: shared.started.elapsed().as_secs_f64(),
        used_memory: int(&fields, "used_memory"),
        rss: int(&fields, "used_memory_rss"),
        lock_keys: int(&fields, "lock_keys"),
        dbsize: keyspace_keys(&fields),
        // -1 on a module without the field (one from before it, run to show what it misses).
        index_entries: fields
            .get("lock_index_entries")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1),
        waiters: int(&fields, "lock_waiters"),
        blocked: int(&fields, "blocked_clients"),
        ops: shared.ops.load(Ordering::Relaxed),
    }
}

/// The slope of a series over time, in units per minute: the median of the slopes between every
/// pair of samples (Theil-Sen), so one spike (an AOF rewrite's buffers, a burst of waiters)
/// does not read as growth.
fn slope_per_minute(points: &[(f64, f64)]) -> f64 {
    let mut slopes: Vec<f64> = Vec::new();
    for (i, (x1, y1)) in points.iter().enumerate() {
        for (x2, y2) in &points[i + 1..] {
            if x2 > x1 {
                slopes.push((y2 - y1) / (x2 - x1) * 60.0);
            }
        }
    }
    slopes.sort_by(f64::total_cmp);
    slopes.get(slopes.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn soak_config() -> Config {
    Config::default()
        .with("appendonly", "yes")
        .with("appendfsync", "everysec")
        .with("notify-keyspace-events", "KEA")
        .with("lazyfree-lazy-user-del", "yes")
        // A backlog that fills up early, so the replication buffers do not read as growth.
        .with("repl-backlog-size", "1mb")
        .module_arg("tombstone-ttl")
        .module_arg("2000")
        // Holds longer than a second are long holds: crossings, endings and a bounded log.
        .module_arg("long-hold")
        .module_arg("1000")
        .module_arg("long-hold-log-len")
        .module_arg("64")
}

/// Waits (bounded) until `check` holds, re-reading; the last values on failure.
fn settle<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<(), T>,
) -> Result<(), String> {
    let started = Instant::now();
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(last) if started.elapsed() > limit => return Err(format!("{what}: {last:?}")),
            Err(_) => sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
#[ignore = "long-running: make soak (SOAK_MINUTES, default 30) or make soak-ci"]
fn soak() {
    let minutes: f64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(30.0);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(now_ms);
    let run_for = Duration::from_secs_f64(minutes * 60.0);
    // About 60 samples a run, every 1 to 10 s.
    let every = Duration::from_secs_f64((minutes * 60.0 / 60.0).clamp(1.0, 10.0));
    let primary = Server::start_with(soak_config());
    let replica = Server::start_with(soak_config());
    replica.replicate_from(&primary);
    let server_line = primary.conn().call(&["INFO", "server"]).text();
    let version = ["valkey_version:", "redis_version:"]
        .iter()
        .find_map(|prefix| server_line.lines().find(|l| l.starts_with(prefix)))
        .unwrap_or("unknown")
        .to_string();
    eprintln!("soak: {minutes} min on {version}, seed {seed}, a sample every {every:?}");

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        port: primary.port,
        replica_port: replica.port,
        ops: AtomicU64::new(0),
        failures: Mutex::new(Vec::new()),
        handoffs: Mutex::new(Vec::new()),
        started: Instant::now(),
        seed,
    });
    // Each worker with how many of it run.
    type Work = fn(Arc<Shared>, u64) -> Option<()>;
    let work: [(Work, u64); 10] = [
        (exclusive_worker, 3),
        (shared_worker, 2),
        (multi_worker, 1),
        (guard_worker, 1),
        (disconnect_worker, 1),
        (deleting_worker, 1),
        (vandal_worker, 1),
        (handoff_probe, 1),
        (replica_pauser, 1),
        (subscriber, 1),
    ];
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    for (worker, copies) in work {
        for n in 0..copies {
            let shared = shared.clone();
            workers.push(thread::spawn(move || {
                // A worker that stops early has recorded why in `failures`.
                let _ = worker(shared, n);
            }));
        }
    }

    // Sampling, and the checks that hold at every moment.
    let mut c = primary.conn();
    let mut samples: Vec<Sample> = Vec::new();
    // Gauges lag a lazily freed database by a moment: only a difference seen in three samples
    // in a row counts.
    let (mut keys_above, mut waiters_above) = (0, 0);
    let deadline = Instant::now() + run_for;
    while shared.running() && Instant::now() < deadline {
        sleep(every.min(deadline.saturating_duration_since(Instant::now())));
        let Ok(mut probe) = Conn::connect(replica.port, PATIENT) else {
            shared.fail("the replica does not accept connections".into());
            break;
        };
        if probe
            .try_send(&["PING"])
            .and_then(|_| probe.try_read())
            .is_err()
        {
            shared.fail("the replica does not answer PING".into());
            break;
        }
        let s = sample(&mut c, &shared);
        keys_above = if s.lock_keys > s.dbsize {
            keys_above + 1
        } else {
            0
        };
        if keys_above >= 3 {
            shared.fail(format!(
                "lock_keys {} above the keyspace's {} keys",
                s.lock_keys, s.dbsize
            ));
        }
        waiters_above = if s.blocked < s.waiters {
            waiters_above + 1
        } else {
            0
        };
        if waiters_above >= 3 {
            shared.fail(format!(
                "lock_waiters {} above blocked_clients {}",
                s.waiters, s.blocked
            ));
        }
        eprintln!(
            "soak: {:>6.0} s  used_memory {:>9}  rss {:>9}  lock_keys {:>5}  keys {:>5}  index {:>6}  waiters {:>3}  blocked {:>3}  ops {}",
            s.secs, s.used_memory, s.rss, s.lock_keys, s.dbsize, s.index_entries, s.waiters, s.blocked, s.ops
        );
        samples.push(s);
    }
    shared.stop.store(true, Ordering::Relaxed);
    for worker in workers {
        if worker.join().is_err() {
            shared.fail("a worker panicked (its message is above)".into());
        }
    }

    // The load is over: everything drains, the bookkeeping matches the keyspace, and the
    // replica agrees with the primary.
    let mut checks: Vec<Result<(), String>> = Vec::new();
    let mut r = replica.conn();
    let _ = r.call(&["CLIENT", "UNPAUSE"]);
    checks.push(settle(
        "waiters and blocked clients drain",
        Duration::from_secs(30),
        || {
            let fields = info_fields(&mut c);
            let (w, b) = (
                int(&fields, "lock_waiters"),
                int(&fields, "blocked_clients"),
            );
            if w == 0 && b == 0 {
                Ok(())
            } else {
                Err((w, b))
            }
        },
    ));
    checks.push(settle(
        "lock_keys equals the lock keys found by SCAN",
        Duration::from_secs(30),
        || {
            let mut found = 0;
            for db in 0..2 {
                c.call(&["SELECT", &db.to_string()]);
                let mut cursor = "0".to_string();
                loop {
                    let reply = c.call(&["SCAN", &cursor, "COUNT", "1000", "TYPE", "lockstate"]);
                    cursor = reply.items()[0].text();
                    found += reply.items()[1].items().len() as i64;
                    if cursor == "0" {
                        break;
                    }
                }
            }
            c.call(&["SELECT", "0"]);
            let gauge = int(&info_fields(&mut c), "lock_keys");
            if gauge == found {
                Ok(())
            } else {
                Err((gauge, found))
            }
        },
    ));
    checks.push(settle(
        "the lease index holds at most two entries per lock key",
        Duration::from_secs(30),
        || {
            let fields = info_fields(&mut c);
            let keys = int(&fields, "lock_keys");
            match fields
                .get("lock_index_entries")
                .and_then(|v| v.parse::<i64>().ok())
            {
                Some(entries) if entries > 2 * keys => Err((entries, keys)),
                _ => Ok(()),
            }
        },
    ));
    checks.push(settle(
        "the replica's digest equals the primary's",
        Duration::from_secs(60),
        || {
            wait_replica_caught_up(&primary, &replica);
            let (p, q) = (c.call(&["DEBUG", "DIGEST"]), r.call(&["DEBUG", "DIGEST"]));
            if p == q {
                Ok(())
            } else {
                Err((p, q))
            }
        },
    ));
    for (server, name) in [(&primary, "primary"), (&replica, "replica")] {
        let alive = Conn::connect(server.port, PATIENT)
            .map(|mut conn| conn.call(&["PING"]) == Reply::status("PONG"))
            .unwrap_or(false);
        if !alive {
            checks.push(Err(format!("the {name} is gone")));
        }
        if server.log().contains("crashed by signal") || server.log().contains("ASSERTION FAILED") {
            checks.push(Err(format!("the {name}'s log shows a crash")));
        }
    }

    // Growth: the slope of used_memory over the second half of the run.
    let half: Vec<&Sample> = samples.iter().skip(samples.len() / 2).collect();
    let points = |f: fn(&Sample) -> i64| -> Vec<(f64, f64)> {
        half.iter().map(|s| (s.secs, f(s) as f64)).collect()
    };
    let memory_slope = slope_per_minute(&points(|s| s.used_memory));
    let rss_slope = slope_per_minute(&points(|s| s.rss));
    let index_slope = slope_per_minute(&points(|s| s.index_entries));
    let median_memory = {
        let mut m: Vec<i64> = samples.iter().map(|s| s.used_memory).collect();
        m.sort_unstable();
        m.get(m.len() / 2).copied().unwrap_or(0)
    };
    // Sustained growth: more than 128 KiB or 1% of the median per minute.
    let allowed = (128.0 * 1024.0f64).max(median_memory as f64 * 0.01);
    if half.len() >= 5 && memory_slope > allowed {
        checks.push(Err(format!(
            "used_memory grows {memory_slope:.0} bytes/min over the second half (allowed {allowed:.0})"
        )));
    }
    if samples.len() < 5 && shared.failures.lock().expect("failures").is_empty() {
        checks.push(Err(format!(
            "only {} samples: too short a run to judge",
            samples.len()
        )));
    }

    // The report.
    let handoffs = shared.handoffs.lock().expect("handoffs").clone();
    let total_secs = shared.started.elapsed().as_secs_f64();
    let mut report = String::new();
    let first = samples.first().cloned();
    let last = samples.last().cloned();
    report += &format!(
        "soak: {minutes} min on {version} (seed {seed}), {} samples\n",
        samples.len()
    );
    if let (Some(first), Some(last)) = (&first, &last) {
        report += &format!(
            "used_memory: {} at the start, {} at the end, median {median_memory}; slope over the second half {memory_slope:.0} bytes/min\n",
            first.used_memory, last.used_memory
        );
        report += &format!(
            "rss: {} at the start, {} at the end; slope over the second half {rss_slope:.0} bytes/min\n",
            first.rss, last.rss
        );
        report += &format!(
            "lease index entries: {} at the start, {} at the end (slope {index_slope:.1}/min); lock_keys {} at the end\n",
            first.index_entries, last.index_entries, last.lock_keys
        );
        report += &format!(
            "commands: {} in {total_secs:.0} s ({:.0}/s)\n",
            last.ops,
            last.ops as f64 / last.secs.max(1.0)
        );
    }
    // Handoff latency by tenth of the run.
    let tenth = total_secs / 10.0;
    report += "handoff latency (µs) by tenth of the run, p50 / p99 / max / count:";
    for i in 0..10 {
        let mut window: Vec<u64> = handoffs
            .iter()
            .filter(|(at, _)| *at >= i as f64 * tenth && *at < (i + 1) as f64 * tenth)
            .map(|(_, us)| *us)
            .collect();
        window.sort_unstable();
        report += &format!(
            " [{} / {} / {} / {}]",
            percentile(&window, 0.5),
            percentile(&window, 0.99),
            window.last().copied().unwrap_or(0),
            window.len()
        );
    }
    report += "\n";
    let failures = shared.failures.lock().expect("failures").clone();
    let failed_checks: Vec<String> = checks.into_iter().filter_map(Result::err).collect();
    report += &format!(
        "verdict: {}\n",
        if failures.is_empty() && failed_checks.is_empty() {
            "passed".to_string()
        } else {
            format!("FAILED: {:?} {:?}", failures, failed_checks)
        }
    );
    println!("{report}");
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        let _ = std::fs::write(path, &report);
    }
    assert!(failures.is_empty(), "failures under load: {failures:#?}");
    assert!(
        failed_checks.is_empty(),
        "failed checks: {failed_checks:#?}"
    );
}
