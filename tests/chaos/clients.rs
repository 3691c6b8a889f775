//! The client load: many clients take locks, write to the fenced store with their fences, and
//! probe with wrong and stale tokens, while a scenario's controller injects faults.

use crate::common::*;
use crate::history::{Grant, History};
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
    /// Percent of grants whose holder stalls past its lease before writing.
    pub slow_pct: u64,
    /// Percent of grants never released (the lease runs out).
    pub abandon_pct: u64,
}

pub struct Shared {
    /// The port clients should use; 0 while the server is down.
    pub port: AtomicU16,
    pub stop: AtomicBool,
    pub oracle: Oracle,
    pub history: History,
    pub load: Load,
}

impl Shared {
    pub fn new(port: u16, load: Load) -> Shared {
        Shared {
            port: AtomicU16::new(port),
            stop: AtomicBool::new(false),
            oracle: Oracle::default(),
            history: History::default(),
            load,
        }
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
        let sync_s = sh.load.sync_ack.map(|ms| ms.to_string());
        let mut args = vec!["LOCK.ACQUIRE", &key, &token, &ttl_s];
        if queues {
            args.extend(["WAIT", &wait_s]);
        }
        if let Some(ms) = &sync_s {
            args.extend(["SYNC", "1", ms]);
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
            // SYNC: no replica acknowledged the grant in time, and it was taken back.
            Reply::Error(e) if e.starts_with("NOREPLICAS") => {
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
                let ttl2_s = ttl2.to_string();
                let mut renew = vec!["LOCK.RENEW", &key, &token, &ttl2_s];
                if let Some(ms) = &sync_s {
                    renew.extend(["SYNC", "1", ms]);
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
// Helpers for the controllers

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
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
/// `lock.tombstone-ttl`), the fence its next grant gets, taken and released at once by a probe:
/// what must not go back is the fence a holder can get.
fn fence_now(conn: &mut Conn, key: &str) -> u64 {
    for _ in 0..100 {
        if let Some(fields) = lock_info(conn, key) {
            if let Some((_, fence)) = fields.into_iter().find(|(n, _)| n == "fence") {
                return fence.int() as u64;
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
