//! Work that may not run where it is noticed (keyspace-notification and server-event callbacks
//! must not write): queued here, each job once, and run from a 0 ms timer on the next
//! event-loop turn.

use std::collections::VecDeque;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::host::keys::ValueScan;
use crate::host::server::{
    avoid_replica_traffic, is_primary, key_string, now_ms, select_db, selected_db,
};
use crate::host::timer;
use crate::lock::sessions;
use crate::lock::KeyRef;
use crate::lock::{locked, UniqueFifo};
use crate::service::value::{Stored, LOCK_TYPE};
use crate::service::{change, effects, holds, leases, policy, safety, waiters};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Job {
    /// A key with waiters was deleted, flushed, swapped or recreated.
    SettleKey(KeyRef),
    /// A connection that owned session locks closed.
    SessionLost(u64),
    /// Session locks of closed connections are still to be released (see [`ENDING`]).
    EndSessions,
    /// The server's configuration changed: look for settings that endanger locks.
    CheckConfig,
    /// A child was forked: record the fence floor, outside the command that forked.
    RecordFloor,
    /// The policy or `lock.long-hold` changed: every lock is being looked at again (see
    /// [`AFRESH`]).
    Afresh,
}

#[derive(Default)]
struct Pending {
    /// Jobs in the order they were deferred, each once.
    jobs: UniqueFifo<Job>,
    armed: bool,
}

static PENDING: LazyLock<Mutex<Pending>> = LazyLock::new(|| Mutex::new(Pending::default()));

/// Closed connections whose session locks are not all released yet: a connection that held
/// thousands is worked off in slices like any other job. Its sessions stay in the session table
/// until their turn, so a claim by another connection, or a RENAME, meanwhile is respected.
static ENDING: Mutex<VecDeque<Closed>> = Mutex::new(VecDeque::new());

/// A closed connection, and the keys it owned sessions on when last looked (looked again once
/// they are done: a key renamed meanwhile is under its new name).
struct Closed {
    client: u64,
    keys: VecDeque<KeyRef>,
}

/// The walk over the keyspace after a change of `lock.namespaces` or `lock.long-hold`: each
/// lock is put in its namespace's space (see `holds::respace`), and its lease index entry is
/// made no later than its crossing by its threshold now (see `leases::follow`; an entry that
/// comes due early only has the lock looked at; a namespace may have a threshold of its own).
/// Worked off in slices, so neither change stalls the server for a scan of millions of keys:
/// meanwhile a lock not reached yet counts in its old namespace, and a hold that became long by
/// the new threshold is seen when the walk reaches it (a lock that changes is looked at at
/// once). A new change starts it again.
static AFRESH: Mutex<Option<Afresh>> = Mutex::new(None);

/// The two phases of [`AFRESH`]: the walk over the keyspace, then the ages put back in time
/// order (the walk moved locks between spaces in the keyspace's order).
enum Afresh {
    Walk(Walk),
    Merge,
}

/// How many ages entries one step of the merge takes before looking at the clock.
const MERGE_STEP: usize = 1024;

/// Where [`AFRESH`] is: the database and the scan of it.
struct Walk {
    db: i32,
    scan: ValueScan,
    /// The policy change it follows (see `policy::spaces_moved`).
    generation: u64,
}

/// Starts [`AFRESH`] again when `lock.namespaces` or `lock.long-hold` changed since it last
/// started (each change is taken once).
fn follow_config_changes() {
    let moved = holds::threshold_changed();
    let respace = policy::spaces_changed();
    if moved || respace {
        *locked(&AFRESH) = ValueScan::new().map(|scan| {
            Afresh::Walk(Walk {
                db: 0,
                scan,
                generation: policy::generation(),
            })
        });
    }
}

/// SWAPDB while [`AFRESH`] goes on: the part not walked yet may now be under a database it
/// has passed, so it starts again.
pub fn databases_swapped() {
    if let Some(Afresh::Walk(walk)) = locked(&AFRESH).as_mut() {
        walk.db = 0;
        walk.scan.restart();
    }
}

fn pending() -> MutexGuard<'static, Pending> {
    locked(&PENDING)
}

/// Queues `job` (unless it is already queued) for the next event-loop turn.
pub fn defer(ctx: &Context, job: Job) {
    let mut p = pending();
    p.jobs.push(job);
    if !p.armed {
        p.armed = timer::create(ctx, 0, run).is_some();
    }
}

/// How long one run may spend on jobs before yielding to the event loop: a FLUSHALL with many
/// waiters, or many connections closing at once, is worked off in slices so the server keeps
/// answering in between.
const SLICE: Duration = Duration::from_millis(2);
/// How soon work held back by paused clients is tried again.
const PAUSED_RETRY_MS: u64 = 10;

fn next_job() -> Option<Job> {
    pending().jobs.pop()
}

/// Releases the session locks of closed connections, a key and at most
/// `change::HOLDS_PER_STEP` holds at a time, until the slice that began at `started` is used up.
fn end_sessions(ctx: &Context, now: u64, started: Instant) {
    loop {
        let next = {
            let mut ending = locked(&ENDING);
            let Some(closed) = ending.front_mut() else {
                return;
            };
            if closed.keys.is_empty() {
                closed.keys = sessions::keys_of(closed.client).into();
            }
            match closed.keys.front() {
                Some(key) => Some((closed.client, key.clone())),
                None => {
                    ending.pop_front();
                    None
                }
            }
        };
        if let Some((client, (db, key))) = next {
            let taken = sessions::take_closed(client, &(db, key.clone()), change::HOLDS_PER_STEP);
            if taken.len() < change::HOLDS_PER_STEP {
                if let Some(closed) = locked(&ENDING).front_mut() {
                    closed.keys.pop_front();
                }
            }
            if !taken.is_empty() && select_db(ctx, db) {
                change::end_sessions(ctx, &key_string(ctx, &key), &taken, now);
            }
        }
        if started.elapsed() >= SLICE {
            return;
        }
    }
}

/// Goes on with [`AFRESH`] for what is left of the slice begun at `started`.
fn afresh(ctx: &Context, started: Instant) {
    let mut state = locked(&AFRESH);
    loop {
        match state.as_mut() {
            None => return,
            Some(Afresh::Merge) => {
                if holds::merge_aside(MERGE_STEP) {
                    *state = None;
                    return;
                }
            }
            Some(Afresh::Walk(walk)) => {
                if !select_db(ctx, walk.db) {
                    // Past the last database: every lock is in its space.
                    policy::spaces_moved(walk.generation);
                    *state = Some(Afresh::Merge);
                    continue;
                }
                let more = walk.scan.step(ctx, &LOCK_TYPE, |key, stored: &Stored| {
                    holds::respace(stored, key);
                    leases::follow(ctx, stored, key);
                });
                if !more {
                    walk.db += 1;
                    walk.scan.restart();
                }
            }
        }
        if started.elapsed() >= SLICE {
            return;
        }
    }
}

/// The timer's callback: runs jobs for one slice, then leaves the rest to the next turn.
fn run(ctx: &Context) {
    pending().armed = false;
    let primary = is_primary(ctx);
    if primary && avoid_replica_traffic() {
        // Clients are paused (CLIENT PAUSE, a failover): nothing may be written or replicated
        // now (Redis would abort). Look again shortly. The walk after a config change writes
        // nothing, and goes on meanwhile.
        follow_config_changes();
        let original_db = selected_db(ctx);
        afresh(ctx, Instant::now());
        select_db(ctx, original_db);
        let mut p = pending();
        p.armed = timer::create(ctx, PAUSED_RETRY_MS, run).is_some();
        return;
    }
    let original_db = selected_db(ctx);
    let now = now_ms();
    let started = Instant::now();
    while let Some(job) = next_job() {
        match job {
            Job::SettleKey((db, key)) => {
                if select_db(ctx, db) {
                    let name = key_string(ctx, &key);
                    if primary {
                        change::settle_key(ctx, &name, now);
                    } else {
                        // Replicas only have LOCK.WAIT watchers, and never write.
                        waiters::wake_watchers_of(ctx, &name, now);
                    }
                }
            }
            Job::CheckConfig => {
                safety::check(ctx);
                // A new lock.long-hold moves every held lock's crossing, a new policy their
                // namespaces (the waiters' moved when it was put in force).
                follow_config_changes();
            }
            Job::RecordFloor => effects::record_floor(ctx),
            // Sessions end only on the primary; a replica's sessions died with its role.
            Job::SessionLost(_) | Job::EndSessions if !primary => locked(&ENDING).clear(),
            Job::SessionLost(client) => {
                locked(&ENDING).push_back(Closed {
                    client,
                    keys: VecDeque::new(),
                });
                end_sessions(ctx, now, started);
            }
            Job::EndSessions => end_sessions(ctx, now, started),
            Job::Afresh => afresh(ctx, started),
        }
        if started.elapsed() >= SLICE {
            break;
        }
    }
    select_db(ctx, original_db);
    let mut p = pending();
    if !locked(&ENDING).is_empty() {
        p.jobs.push(Job::EndSessions);
    }
    if locked(&AFRESH).is_some() {
        p.jobs.push(Job::Afresh);
    }
    if !p.jobs.is_empty() && !p.armed {
        p.armed = timer::create(ctx, 0, run).is_some();
    }
}
