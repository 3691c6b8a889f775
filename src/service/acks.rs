//! Replies that wait for replicas: `SYNC numreplicas timeout-ms` on LOCK.ACQUIRE and LOCK.RENEW;
//! and for the AOF's fsync, `FSYNC timeout-ms` (its turn is noticed by `fsync`), alone or with
//! SYNC, decided and taken back the same way.
//!
//! The change is made and replicated at once; its client stays blocked (on the lock's key, like a
//! waiter, but in no queue) while a 1 ms timer watches the replicas: the first run after the
//! change reads the primary's replication offset (the change has been propagated by then) and
//! asks the replicas to acknowledge (`REPLCONF GETACK *`, what WAIT sends); each run counts the
//! online replicas whose acknowledged offset reached it. Enough of them: the reply goes out. Time
//! up: a new grant is taken back (a replicated release) and the client gets an error, so it never
//! acts on a grant a failover can lose. Nothing is sent to replicas while the server avoids
//! replica traffic (CLIENT PAUSE, a failover in progress); answers wait until it is over.
//!
//! A reply that promised a lease is never taken back: a grant is provisional until its token
//! refreshes or renews it (a retried ACQUIRE after a lost reply, a RENEW, with or without SYNC),
//! and only a provisional grant is taken back (see `Holder::provisional`). Its own SYNC client
//! then hears that the grant was kept but is not acknowledged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::error::LockError;
use crate::host::blocking::{self, BlockedClient};
use crate::host::keys;
use crate::host::server::{
    avoid_replica_traffic, is_primary, key_string, now_ms, replication_acks, select_db, selected_db,
};
use crate::host::timer;
use crate::lock::core::TokenDigest;
use crate::lock::event::Event;
use crate::lock::locked;
use crate::lock::queues::{Ending, SyncRequest};
use crate::lock::KeyRef;
use crate::metrics;
use crate::service::audit::{self, TakenBack};
use crate::service::change::{change, reclaim_if_due};
use crate::service::fsync;
use crate::service::value::{in_key, in_key_mut};
use crate::service::waiters;

/// How often unacknowledged changes ask the replicas again.
const ASK_AGAIN: Duration = Duration::from_millis(100);

/// What the reply confirms.
#[derive(Debug)]
pub enum Confirms {
    /// A new grant: taken back when the replicas do not acknowledge it.
    Grant { token: TokenDigest, fence: u64 },
    /// A renewal or a refreshed lease: stays, but the client is told it may be lost.
    Change,
}

struct Pending {
    /// The blocked client's waiter id.
    id: u64,
    client: BlockedClient,
    key: KeyRef,
    confirms: Confirms,
    reply: i64,
    sync: SyncRequest,
    /// When the wait gives up (monotonic: wall-clock steps change nothing).
    deadline: Instant,
    /// The replication offset that covers the change, read on the first run after it.
    target: Option<i64>,
    /// FSYNC: the event-loop turn of the change (see `fsync`), and when that wait gives up.
    fsync: Option<(u64, Instant)>,
    /// When the replicas were last asked to acknowledge.
    asked: Option<Instant>,
    /// The client went away (or was unblocked) before its answer.
    abandoned: bool,
}

static PENDING: Mutex<Vec<Pending>> = Mutex::new(Vec::new());
static TIMER: timer::Single = timer::Single::new();
/// Some change waits for replicas: the event-loop hook has work ([`before_sleep`]).
static WAITING: AtomicBool = AtomicBool::new(false);
/// The event-loop hook runs on this server: the timer is only the backstop for deadlines and
/// repeated requests, not the way acknowledgements are noticed.
static HOOKED: AtomicBool = AtomicBool::new(false);

fn pending() -> MutexGuard<'static, Vec<Pending>> {
    locked(&PENDING)
}

/// How soon the timer looks again: at once (1 ms) without the event-loop hook; with it, soon
/// enough for deadlines and repeated requests, which the hook does not wait for.
fn arm(ctx: &Context) {
    let delay = if HOOKED.load(Ordering::Relaxed) {
        10
    } else {
        1
    };
    TIMER.arm(ctx, delay, tick);
}

/// At load: the event-loop hook ([`before_sleep`]) runs on this server.
pub fn hooked(yes: bool) {
    HOOKED.store(yes, Ordering::Relaxed);
}

/// Just before each event-loop sleep: the changes made in this turn get their target offset and
/// one request for acknowledgement (for all of them, after their effects in the replication
/// stream), and acknowledgements that arrived in this turn are answered now, before Redis writes
/// replies out. Returns at once when nothing waits.
pub fn before_sleep(ctx: &Context) {
    if WAITING.load(Ordering::Relaxed) {
        check(ctx);
    }
}

/// Watches the change just made to `key` for the blocked client `client` (waiter `id`), which
/// gets `reply` once `sync.replicas` replicas acknowledged it.
pub fn track(
    ctx: &Context,
    id: u64,
    client: BlockedClient,
    key: KeyRef,
    confirms: Confirms,
    reply: i64,
    sync: SyncRequest,
) {
    pending().push(Pending {
        id,
        client,
        key,
        confirms,
        reply,
        sync,
        deadline: Instant::now() + Duration::from_millis(sync.timeout_ms),
        target: None,
        fsync: sync
            .fsync_ms
            .map(|ms| (fsync::tag(), Instant::now() + Duration::from_millis(ms))),
        asked: None,
        abandoned: false,
    });
    WAITING.store(true, Ordering::Relaxed);
    arm(ctx);
}

/// The client of waiter `id` is gone before the replicas acknowledged: an unconfirmed new grant
/// is taken back on the next run (unless its token made it firm meanwhile).
pub fn abandon(id: u64) {
    if let Some(p) = pending().iter_mut().find(|p| p.id == id && !p.abandoned) {
        p.abandoned = true;
    }
}

/// The wait of waiter `id` ended (its WAIT timeout, CLIENT UNBLOCK) before the replicas
/// acknowledged: as [`abandon`], and the error to answer with, when `id` was waiting for
/// replicas. A grant still provisional now is taken back on the next run; a firm one stays.
pub fn abandon_answer(ctx: &Context, id: u64) -> Option<LockError> {
    let (key, grant, sync) = {
        let mut pending = pending();
        let p = pending.iter_mut().find(|p| p.id == id && !p.abandoned)?;
        p.abandoned = true;
        let grant = match &p.confirms {
            Confirms::Grant { token, fence } => Some((*token, *fence)),
            Confirms::Change => None,
        };
        (p.key.clone(), grant, p.sync)
    };
    // Told undone unless it stands for good: a provisional grant may still be made firm before
    // the next run, which keeps it (the safe way round: the client was told not to rely on it).
    let undone = grant.is_some_and(|(token, fence)| !is_firm(ctx, &key, &token, fence));
    Some(failure(&sync, sync.replicas > 0, undone))
}

/// The error for a wait that did not get what it asked for: the replicas' acknowledgement when
/// they were asked for and missing (`replicas_missing`), the fsync otherwise.
fn failure(sync: &SyncRequest, replicas_missing: bool, undone: bool) -> LockError {
    match sync.fsync_ms {
        Some(timeout_ms) if !replicas_missing => LockError::NotFsynced { undone, timeout_ms },
        _ => LockError::NotAcknowledged {
            undone,
            replicas: sync.replicas,
            timeout_ms: sync.timeout_ms,
        },
    }
}

/// True when `token` still holds the lock under `key` with the grant `fence`, no longer
/// provisional.
fn is_firm(ctx: &Context, (db, key): &KeyRef, token: &TokenDigest, fence: u64) -> bool {
    let original = selected_db(ctx);
    let mut firm = false;
    if select_db(ctx, *db) {
        let handle = ctx.open_key(&key_string(ctx, key));
        if let Ok(Some(stored)) = in_key(&handle) {
            firm = stored
                .lock()
                .grant_of(token, fence, now_ms())
                .is_some_and(|h| !h.provisional);
        }
    }
    select_db(ctx, original);
    firm
}

enum Outcome {
    Confirmed,
    /// `replicas`: the replicas' acknowledgement was missing (else the fsync).
    TimedOut {
        replicas: bool,
    },
    Abandoned,
}

/// The timer: looks as the event-loop hook does, and runs again while anything waits.
fn tick(ctx: &Context) {
    TIMER.fired();
    check(ctx);
    if !pending().is_empty() {
        arm(ctx);
    }
}

/// Sets targets, asks replicas (once for every change waiting), answers what is decided.
fn check(ctx: &Context) {
    if !is_primary(ctx) {
        demoted();
        return;
    }
    let Some((offset, acked)) = replication_acks(ctx) else {
        return;
    };
    let now = Instant::now();
    let quiet = avoid_replica_traffic();
    let fsynced = fsync::fsynced_through();
    let mut ask = false;
    let mut decided = Vec::new();
    {
        let mut pending = pending();
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let target = *p.target.get_or_insert(offset);
            let acks = acked.iter().filter(|a| **a >= target).count();
            let enough = u64::try_from(acks).unwrap_or(0) >= p.sync.replicas;
            let durable = p.fsync.is_none_or(|(turn, _)| fsynced >= turn);
            let fsync_late = p.fsync.is_some_and(|(_, until)| now >= until);
            let outcome = if p.abandoned && !quiet {
                Some(Outcome::Abandoned)
            } else if p.abandoned {
                None
            } else if enough && durable {
                Some(Outcome::Confirmed)
            } else if !enough && now >= p.deadline && !quiet {
                Some(Outcome::TimedOut { replicas: true })
            } else if !durable && fsync_late && !quiet {
                Some(Outcome::TimedOut { replicas: false })
            } else if enough {
                None
            } else {
                if p.asked.is_none_or(|at| now >= at + ASK_AGAIN) {
                    ask = true;
                    p.asked = Some(now);
                }
                None
            };
            match outcome {
                Some(outcome) => decided.push((pending.swap_remove(i), outcome)),
                None => i += 1,
            }
        }
    }
    if ask && !quiet {
        keys::request_replica_acks(ctx);
    }
    for (p, outcome) in decided {
        finish(ctx, p, outcome, now_ms());
    }
    WAITING.store(!pending().is_empty(), Ordering::Relaxed);
}

/// This server became a replica: every wait ends, as failed. Nothing may be written, so no grant
/// is taken back (the new primary's data replaces them all). Redis unblocked the waiting clients
/// as it turned (their disconnect calls abandoned them); one still blocked is answered here, so
/// no client ever waits for a reply that cannot come.
fn demoted() {
    let ended: Vec<Pending> = pending().drain(..).collect();
    WAITING.store(false, Ordering::Relaxed);
    for p in ended {
        metrics::SYNC_FAILED.incr();
        if !p.abandoned {
            waiters::queues().mark_woken(p.id, Ending::Answered(Err(LockError::NoLongerPrimary)));
            blocking::unblock(p.client);
        }
    }
}

fn finish(ctx: &Context, p: Pending, outcome: Outcome, now: u64) {
    let answer = match outcome {
        Outcome::Confirmed => {
            metrics::SYNC_CONFIRMED.incr();
            Ok(p.reply)
        }
        Outcome::TimedOut { .. } | Outcome::Abandoned => {
            metrics::SYNC_FAILED.incr();
            let (replicas, why) = match outcome {
                Outcome::TimedOut { replicas: true } => (true, TakenBack::Replicas),
                Outcome::TimedOut { replicas: false } => (false, TakenBack::NotFsynced),
                _ => (p.sync.replicas > 0, TakenBack::ClientGone),
            };
            let undone = match &p.confirms {
                // Undone unless its token made it firm: taken back now, or already ended
                // (released, expired, forced).
                Confirms::Grant { token, fence } => {
                    !take_back(ctx, &p.key, token, *fence, now, why)
                }
                Confirms::Change => false,
            };
            Err(failure(&p.sync, replicas, undone))
        }
    };
    if !matches!(outcome, Outcome::Abandoned) {
        waiters::queues().mark_woken(p.id, Ending::Answered(answer));
        blocking::unblock(p.client);
    }
}

/// Takes back an unacknowledged grant, as a release by its holder (announced, replicated), when
/// it is still provisional. True when the grant stands afterwards (its token made it firm).
fn take_back(
    ctx: &Context,
    (db, key): &KeyRef,
    token: &TokenDigest,
    fence: u64,
    now: u64,
    why: TakenBack,
) -> bool {
    let original = selected_db(ctx);
    let mut stands = false;
    if select_db(ctx, *db) {
        let name = key_string(ctx, key);
        let handle = ctx.open_key_writable(&name);
        if let Ok(Some(stored)) = in_key_mut(&handle) {
            let grant = stored
                .lock()
                .all_holders()
                .find(|(f, h)| *f == fence && h.token() == token)
                .map(|(_, h)| (*h.grant).clone());
            let revoked = change(ctx, &name, stored, now, |lock| {
                lock.revoke(token, fence, now).then_some(Event::Release)
            });
            if revoked.is_some() {
                if let Some(grant) = &grant {
                    audit::taken_back(key, fence, grant, now, why);
                }
                metrics::RELEASED.incr();
                reclaim_if_due(ctx, &handle, &name, now);
            } else {
                stands = stored.lock().grant_of(token, fence, now).is_some();
            }
        }
    }
    select_db(ctx, original);
    stands
}
