//! The client load: many clients take locks, write to the fenced store with their fences, and
//! probe with wrong and stale tokens, while a scenario's controller injects faults.

use crate::common::cluster::key_slot;
use crate::common::*;
use crate::history::{Grant, History, Mode, Stamp};
use crate::oracle::Oracle;
use crate::{params, Rng, StopOnDrop, CLIENT_READ, SLACK};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering::Relaxed};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

pub struct Load {
    pub keys: Vec<String>,
    pub clients: usize,
    pub ttl_ms: (u64, u64),
    /// Percent of clients that queue on the server with `WAIT timeout-ms`.
    pub queue_pct: u64,
    /// `WAIT 1 <ms>` after each grant: act only on grants a replica confirmed.
    pub replica_ack: Option<u64>,
    /// `SYNC 1 <ms>` on each ACQUIRE and RENEW: the module answers only once a replica has the
    /// change (and takes back a grant none acknowledged).
    pub sync_ack: Option<u64>,
    /// `FSYNC <ms>` on each ACQUIRE and RENEW: the module answers only once the change is
    /// fsynced to the AOF (and takes back a grant that was not in time). No multi-lock rounds:
    /// LOCK.MACQUIRE has no FSYNC.
    pub fsync_ack: Option<u64>,
    /// Percent of grants whose holder stalls past its lease before writing.
    pub slow_pct: u64,
    /// Percent of grants never released (the lease runs out).
    pub abandon_pct: u64,
}

pub struct Shared {
    /// The port clients should use; 0 while the server is down.
    pub port: AtomicU16,
    /// For a cluster: the nodes' ports, where clients start (they follow redirects from there).
    pub cluster: Vec<u16>,
    pub stop: AtomicBool,
    pub oracle: Oracle,
    pub history: History,
    pub load: Load,
}

impl Shared {
    pub fn new(port: u16, load: Load) -> Shared {
        Shared {
            port: AtomicU16::new(port),
            cluster: Vec::new(),
            stop: AtomicBool::new(false),
            oracle: Oracle::default(),
            history: History::default(),
            load,
        }
    }
}

/// Where a client's commands go: the one server the controller names, or a cluster.
enum Link {
    Single(u16, Conn),
    Cluster(ClusterLink),
}

impl Link {
    /// A link to what the clients should use now, if it can be reached.
    fn open(sh: &Shared) -> Option<Link> {
        if !sh.cluster.is_empty() {
            return Some(Link::Cluster(ClusterLink {
                seeds: sh.cluster.clone(),
                conns: HashMap::new(),
                routes: HashMap::new(),
                last: None,
            }));
        }
        let port = sh.port.load(Relaxed);
        if port == 0 {
            return None;
        }
        let conn = Conn::connect(port, Duration::from_millis(500)).ok()?;
        conn.set_timeout(CLIENT_READ);
        Some(Link::Single(port, conn))
    }

    /// False once the controller moved the clients elsewhere.
    fn current(&self, sh: &Shared) -> bool {
        match self {
            Link::Single(port, _) => *port == sh.port.load(Relaxed),
            Link::Cluster(_) => true,
        }
    }
}

/// A cluster client: commands go to the node serving their key (LOCK.* commands name it first),
/// following MOVED and ASK, and retried after a short pause on TRYAGAIN (a waiter whose key moved
/// away), CLUSTERDOWN (a failover) or UNBLOCKED (its node became a replica), with the same token.
struct ClusterLink {
    seeds: Vec<u16>,
    conns: HashMap<u16, Conn>,
    /// Slot -> port, as MOVED taught.
    routes: HashMap<u16, u16>,
    last: Option<u16>,
}

/// The port of a `MOVED slot host:port` or `ASK slot host:port` error.
fn redirect(error: &str, kind: &str) -> Option<u16> {
    let rest = error.strip_prefix(kind)?.strip_prefix(' ')?;
    rest.split(' ').nth(1)?.rsplit(':').next()?.parse().ok()
}

impl ClusterLink {
    fn conn(&mut self, port: u16) -> std::io::Result<&mut Conn> {
        match self.conns.entry(port) {
            std::collections::hash_map::Entry::Occupied(conn) => Ok(conn.into_mut()),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let conn = Conn::connect(port, Duration::from_millis(500))?;
                conn.set_timeout(CLIENT_READ);
                Ok(slot.insert(conn))
            }
        }
    }

    fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Reply> {
        let keyed = args.len() > 1 && !args[0].as_ref().eq_ignore_ascii_case(b"WAIT");
        let slot = keyed.then(|| key_slot(&String::from_utf8_lossy(args[1].as_ref())));
        let mut port = slot
            .and_then(|s| self.routes.get(&s).copied())
            .or(self.last)
            .unwrap_or(self.seeds[0]);
        let mut asking = false;
        for attempt in 0..200 {
            let sent = (|| {
                let conn = self.conn(port)?;
                if asking {
                    conn.try_send(&["ASKING"])?;
                    conn.try_read()?;
                }
                conn.try_send(args)?;
                conn.try_read()
            })();
            let reply = match sent {
                Ok(reply) => reply,
                // A node that is gone: the command may or may not have run there, so it is not
                // sent again; the next command starts from another node.
                Err(e) => {
                    self.conns.remove(&port);
                    let next = self
                        .seeds
                        .iter()
                        .position(|p| *p == port)
                        .map_or(attempt, |i| i + 1);
                    self.last = Some(self.seeds[next % self.seeds.len()]);
                    if let Some(slot) = slot {
                        self.routes.remove(&slot);
                    }
                    return Err(e);
                }
            };
            asking = false;
            if let Reply::Error(e) = &reply {
                if let Some(target) = redirect(e, "MOVED") {
                    if let Some(slot) = slot {
                        self.routes.insert(slot, target);
                    }
                    port = target;
                    continue;
                }
                if let Some(target) = redirect(e, "ASK") {
                    port = target;
                    asking = true;
                    continue;
                }
                if ["TRYAGAIN", "CLUSTERDOWN", "UNBLOCKED"]
                    .iter()
                    .any(|code| e.starts_with(code))
                {
                    sleep(Duration::from_millis(20));
                    continue;
                }
            }
            self.last = Some(port);
            return Ok(reply);
        }
        Err(std::io::Error::other(
            "no node answered without redirecting",
        ))
    }
}

/// One command; an error when the connection broke or sent something unreadable.
fn call<A: AsRef<[u8]>>(link: &mut Link, args: &[A]) -> std::io::Result<Reply> {
    match link {
        Link::Single(_, conn) => {
            conn.try_send(args)?;
            conn.try_read()
        }
        Link::Cluster(cluster) => cluster.call(args),
    }
}

fn client_loop(id: usize, sh: &Shared) {
    let mut rng = Rng(0xC11E_0000 + id as u64 * 7919);
    let queues = (id as u64 * 100 / sh.load.clients.max(1) as u64) < sh.load.queue_pct;
    let mut conn: Option<Link> = None;
    let hard_stop = Instant::now() + Duration::from_secs(1800);
    let mut n = 0u64;
    while !sh.stop.load(Relaxed) && Instant::now() < hard_stop {
        if conn.as_ref().is_none_or(|link| !link.current(sh)) {
            conn = Link::open(sh);
            if conn.is_none() {
                sleep(Duration::from_millis(10));
                continue;
            }
        }
        let Some(c) = conn.as_mut() else {
            continue;
        };
        n += 1;
        let key = rng.pick(&sh.load.keys).clone();
        let token = format!("c{id}-{n}");
        let mode = mode_for(&key, &mut rng);
        if is_plain(&key) && sh.load.fsync_ack.is_none() && rng.chance(10) {
            if multi_lock_round(c, sh, &mut rng, &key, &token).is_err() {
                conn = None;
            }
            continue;
        }
        let ttl = rng.range(sh.load.ttl_ms.0, sh.load.ttl_ms.1);
        let ttl_s = ttl.to_string();
        let wait_s = rng.range(20, 400).to_string();
        let sync_s = sh.load.sync_ack.map(|ms| ms.to_string());
        let fsync_s = sh.load.fsync_ack.map(|ms| ms.to_string());
        let limit_s = match mode {
            Mode::Permit(limit) => limit.to_string(),
            _ => String::new(),
        };
        let mut args = vec!["LOCK.ACQUIRE", &key, &token, &ttl_s];
        match mode {
            Mode::Exclusive => {}
            Mode::Shared => args.push("SHARED"),
            Mode::Permit(_) => args.extend(["LIMIT", &limit_s]),
        }
        if queues {
            args.extend(["WAIT", &wait_s]);
        }
        if let Some(ms) = &sync_s {
            args.extend(["SYNC", "1", ms]);
        }
        if let Some(ms) = &fsync_s {
            args.extend(["FSYNC", ms]);
        }
        let start = Stamp::now();
        let reply = match call(c, &args) {
            Ok(reply) => reply,
            Err(_) => {
                conn = None;
                continue;
            }
        };
        let end = Stamp::now();
        let fence = match reply {
            Reply::Int(f) => f as u64,
            Reply::Nil => {
                sh.history.contended.fetch_add(1, Relaxed);
                if !queues {
                    sleep(Duration::from_micros(rng.range(100, 3000)));
                }
                continue;
            }
            // SYNC: no replica acknowledged the grant in time, and it was taken back; FSYNC: it
            // was not fsynced in time, and was taken back.
            Reply::Error(e)
                if e.starts_with("NOREPLICAS")
                    || e.starts_with("ERR the grant was not fsynced") =>
            {
                sh.history.unconfirmed.fetch_add(1, Relaxed);
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
        let release = |c: &mut Link| call(c, &["LOCK.RELEASE", &key, &token]);
        // Readers and permit holders do not write: only an exclusive holder's writes are
        // fenced against each other.
        let writes = mode == Mode::Exclusive;
        let write = |key: &str, fence: u64| {
            if writes {
                sh.oracle.write(key, fence);
            }
        };
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
            mode,
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
                write(&key, fence);
                continue;
            }
        }
        let Some(c) = conn.as_mut() else {
            continue;
        };
        let behaviour = rng.below(100);
        if behaviour < sh.load.slow_pct {
            // Stalls (GC, swap, a paused VM) past its lease, then writes as if it still held.
            sleep(Duration::from_millis(ttl + rng.range(20, 80)));
            write(&key, fence);
            if Instant::now() > end.at + Duration::from_millis(ttl) + SLACK {
                // The lease is certainly over: its token is stale, and so is its fence.
                let mut broken = false;
                match guarded_write(c, sh, &key, fence) {
                    Ok(landed) => sh.history.i5(landed),
                    Err(_) => broken = true,
                }
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
            write(&key, fence);
        } else {
            sleep(Duration::from_micros(rng.range(0, 2000)));
            write(&key, fence);
            if writes && rng.chance(50) && guarded_write(c, sh, &key, fence).is_err() {
                conn = None;
                continue;
            }
            if rng.chance(20) {
                let ttl2 = rng.range(sh.load.ttl_ms.0, sh.load.ttl_ms.1);
                let sent = Stamp::now();
                let ttl2_s = ttl2.to_string();
                let mut renew = vec!["LOCK.RENEW", &key, &token, &ttl2_s];
                if let Some(ms) = &sync_s {
                    renew.extend(["SYNC", "1", ms]);
                }
                if let Some(ms) = &fsync_s {
                    renew.extend(["FSYNC", ms]);
                }
                // RENEW sets the lease to ttl2 from when the server runs it: it may shorten it.
                // What the client can count on afterwards: confirmed, the new lease (at least
                // `sent + ttl2`); unknown (a lost reply, a renewal a failover may lose), the
                // shorter of the old lease and the new one.
                let renewed_until = sent + Duration::from_millis(ttl2);
                let outcome = call(c, &renew);
                let confirmed = match &outcome {
                    Ok(Reply::Int(1)) => match sh.load.replica_ack {
                        None => true,
                        // With WAIT, a renewal counts once WAIT confirms it, as a grant does.
                        Some(ms) => {
                            matches!(call(c, &["WAIT", "1", &ms.to_string()]), Ok(Reply::Int(a)) if a >= 1)
                        }
                    },
                    _ => false,
                };
                sh.history.update(idx, |g| {
                    g.live_until = if confirmed {
                        renewed_until
                    } else {
                        g.live_until.min(renewed_until)
                    }
                });
                match outcome {
                    Ok(Reply::Int(1)) => {
                        write(&key, fence);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        conn = None;
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_mut() else {
                continue;
            };
            let sent = Stamp::now();
            sh.history
                .update(idx, |g| g.live_until = g.live_until.min(sent));
            if release(c).is_err() {
                conn = None;
            }
        }
    }
}

/// Another key of the load in `key`'s hash slot (a cluster's keys share a tag per slot), if any.
fn partner_of<'a>(sh: &'a Shared, rng: &mut Rng, key: &str) -> Option<&'a String> {
    let slot = key_slot(key);
    let others: Vec<&String> = sh
        .load
        .keys
        .iter()
        .filter(|k| {
            k.as_str() != key && is_plain(k) && (sh.cluster.is_empty() || key_slot(k) == slot)
        })
        .collect();
    (!others.is_empty()).then(|| others[rng.below(others.len() as u64) as usize])
}

/// Two keys at once with LOCK.MACQUIRE: a grant of each key for I2 and I3 (one holder per key
/// at a time, multi-locks included), fenced writes for each, then LOCK.MRELEASE.
fn multi_lock_round(
    c: &mut Link,
    sh: &Shared,
    rng: &mut Rng,
    key: &str,
    token: &str,
) -> std::io::Result<()> {
    let Some(other) = partner_of(sh, rng, key) else {
        return Ok(());
    };
    let ttl = rng.range(sh.load.ttl_ms.0, sh.load.ttl_ms.1);
    let start = Stamp::now();
    let ttl_s = ttl.to_string();
    let wait_s = rng.range(20, 400).to_string();
    let mut args = vec!["LOCK.MACQUIRE", "2", key, other, token, &ttl_s];
    // Half of them queue on both keys (granted only at the head of both at once).
    if rng.chance(50) {
        args.extend(["WAIT", &wait_s]);
    }
    let reply = call(c, &args)?;
    let end = Stamp::now();
    let fences: Vec<u64> = match &reply {
        Reply::Array(items) => items.iter().map(|f| f.int() as u64).collect(),
        Reply::Nil => {
            sh.history.contended.fetch_add(1, Relaxed);
            sleep(Duration::from_micros(rng.range(100, 3000)));
            return Ok(());
        }
        other => {
            sh.history.error(&format!("LOCK.MACQUIRE: {other:?}"));
            return Ok(());
        }
    };
    // Act only on grants a replica confirmed, as single grants do (LOCK.MACQUIRE has no SYNC:
    // WAIT confirms it in the SYNC scenarios too).
    if let Some(ms) = sh.load.replica_ack.or(sh.load.sync_ack) {
        if !matches!(call(c, &["WAIT", "1", &ms.to_string()])?, Reply::Int(a) if a >= 1) {
            sh.history.unconfirmed.fetch_add(1, Relaxed);
            call(c, &["LOCK.MRELEASE", "2", key, other, token])?;
            return Ok(());
        }
    }
    let live_until = start + Duration::from_millis(ttl);
    let grants: Vec<usize> = [key, other.as_str()]
        .iter()
        .zip(&fences)
        .map(|(k, fence)| {
            sh.history.add_grant(Grant {
                key: k.to_string(),
                fence: *fence,
                mode: Mode::Exclusive,
                start,
                end,
                live_until,
            })
        })
        .collect();
    sleep(Duration::from_micros(rng.range(0, 2000)));
    for (k, fence) in [key, other.as_str()].iter().zip(&fences) {
        sh.oracle.write(k, *fence);
    }
    let sent = Stamp::now();
    for idx in grants {
        sh.history
            .update(idx, |g| g.live_until = g.live_until.min(sent));
    }
    call(c, &["LOCK.MRELEASE", "2", key, other, token])?;
    Ok(())
}

/// The Redis list a key's holders append their fences to with LOCK.GUARD (same hash slot).
fn guarded_log(key: &str) -> String {
    if key.contains('{') {
        format!("{key}:guarded")
    } else {
        format!("{{{key}}}:guarded")
    }
}

/// `LOCK.GUARD key fence RPUSH <log> fence`: true when it ran (the fence was current), false
/// when it was refused as stale; an error when the connection broke.
fn guarded_write(c: &mut Link, sh: &Shared, key: &str, fence: u64) -> std::io::Result<bool> {
    let fence = fence.to_string();
    let log = guarded_log(key);
    match call(c, &["LOCK.GUARD", key, &fence, "RPUSH", &log, &fence])? {
        Reply::Int(_) => {
            sh.history.guarded_landed.fetch_add(1, Relaxed);
            Ok(true)
        }
        Reply::Error(e) if e.starts_with("FENCED") => {
            sh.history.guarded_refused.fetch_add(1, Relaxed);
            Ok(false)
        }
        other => {
            sh.history.error(&format!("LOCK.GUARD: {other:?}"));
            Ok(false)
        }
    }
}

/// The guarded logs as the server keeps them now: a write under a stale fence that landed
/// after a newer holder's shows up as a fence lower than the one before it. Returns the
/// entries read, the decreases found, and notes.
pub fn check_guarded_logs(sh: &Shared) -> (u64, u64, Vec<String>) {
    let mut notes = Vec::new();
    let Some(mut link) = Link::open(sh) else {
        notes.push("guarded logs: no server to read them from".to_string());
        return (0, 0, notes);
    };
    let (mut entries, mut decreases) = (0, 0);
    for key in &sh.load.keys {
        let log = guarded_log(key);
        // A cluster link moves on to another node after a dead one: a few tries.
        let mut read = call(&mut link, &["LRANGE", &log, "0", "-1"]);
        for _ in 0..sh.cluster.len() {
            if read.is_ok() {
                break;
            }
            read = call(&mut link, &["LRANGE", &log, "0", "-1"]);
        }
        let fences: Vec<u64> = match read {
            Ok(reply @ Reply::Array(_)) => reply
                .items()
                .iter()
                .filter_map(|f| f.text().parse().ok())
                .collect(),
            other => {
                notes.push(format!("guarded log of {key} unreadable: {other:?}"));
                continue;
            }
        };
        entries += fences.len() as u64;
        for pair in fences.windows(2) {
            if pair[1] < pair[0] {
                decreases += 1;
                notes.push(format!(
                    "I1 guarded log of {key}: fence {} written after {}",
                    pair[1], pair[0]
                ));
            }
        }
    }
    notes.push(format!(
        "guarded writes: {} ran, {} refused as stale, {entries} in the logs",
        sh.history.guarded_landed.load(Relaxed),
        sh.history.guarded_refused.load(Relaxed)
    ));
    (entries, decreases, notes)
}

// ---------------------------------------------------------------------------------------------
// Helpers for the controllers

/// `n` plain keys, plus a read/write lock (`:rw`) and a semaphore of 3 permits (`:sem`).
fn keys(prefix: &str, n: usize) -> Vec<String> {
    let mut keys: Vec<String> = (0..n).map(|i| format!("{prefix}:{i}")).collect();
    keys.extend([format!("{prefix}:rw"), format!("{prefix}:sem")]);
    keys
}

/// The permits of the load's semaphores.
const PERMITS: usize = 3;

/// A key taken only exclusively (and in multi-lock rounds).
pub fn is_plain(key: &str) -> bool {
    !key.ends_with(":rw") && !key.ends_with(":sem")
}

/// What a client asks of `key`: a semaphore's permit, a read/write lock's shared hold (three
/// times in four) or its exclusive one, a plain key's exclusive hold.
fn mode_for(key: &str, rng: &mut Rng) -> Mode {
    if key.ends_with(":sem") {
        Mode::Permit(PERMITS)
    } else if key.ends_with(":rw") && rng.chance(75) {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}

pub fn standard_load(prefix: &str) -> Load {
    let p = params();
    Load {
        keys: keys(prefix, p.keys),
        clients: p.clients,
        ttl_ms: (30, 200),
        queue_pct: 50,
        replica_ack: None,
        sync_ack: None,
        fsync_ack: None,
        slow_pct: 3,
        abandon_pct: 2,
    }
}

/// The fence each key shows (LOCK.INFO), 0 for a missing key.
pub fn fences_now(server: &Server, keys: &[String]) -> HashMap<String, u64> {
    let mut conn = server.conn();
    keys.iter()
        .map(|k| (k.clone(), fence_now(&mut conn, k)))
        .collect()
}

/// The fence `key` shows; for a key that is gone (a free lock reclaimed after
/// `lock.tombstone-ttl`) or shows fence 0 (a fresh lock made for acquirers queued on a key
/// just deleted, never granted: with `lock.tombstone-ttl 0` a failover can come before its
/// grant), the fence its next grant gets, taken and released at once by a probe: what must not
/// go back is the fence a holder can get.
fn fence_now(conn: &mut Conn, key: &str) -> u64 {
    for _ in 0..100 {
        if let Some(fields) = lock_info(conn, key) {
            let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
            let free = field("state") == Some(&Reply::status("free"));
            if let Some(fence) = field("fence") {
                // Only a free lock may show 0: a held one is a violation as it shows.
                if fence.int() > 0 || !free {
                    return fence.int() as u64;
                }
            }
        }
        if let Reply::Int(fence) = conn.call(&["LOCK.ACQUIRE", key, "i4-probe", "1000"]) {
            conn.call(&["LOCK.RELEASE", key, "i4-probe"]);
            return fence as u64;
        }
    }
    0
}

/// Runs `clients` against the shared state while `controller` injects faults.
pub fn run_load(sh: &Shared, controller: impl FnOnce()) {
    thread::scope(|s| {
        for id in 0..sh.load.clients {
            s.spawn(move || client_loop(id, sh));
        }
        let _stop = StopOnDrop(&sh.stop);
        controller();
    });
}
