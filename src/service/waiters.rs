//! The process' queues of waiting clients (see `lock::queues`), and waking them.
//!
//! A single-key acquirer (`LOCK.ACQUIRE ... WAIT`) is blocked on a name nothing signals, in its
//! lock's hash slot (see `handoff::parking_name`): when its lock has room, the module serves the
//! head of the queue itself at the end of the command or timer callback that made the room (see
//! `handoff::serve_ready`) and unblocks it with its grant. Redis offers a signalled key to every
//! client blocked on it, which made a handoff cost O(waiters); this way it costs O(log waiters).
//! Multi-lock acquirers and `LOCK.WAIT` watchers are blocked on their keys: Redis runs their
//! reply callbacks after the command that signalled a key, and they are served there in queue
//! order. Watchers whose wait is over are unblocked with the outcome recorded here. A waiter
//! that times out, disconnects or is unblocked by `CLIENT UNBLOCK` leaves its queue before
//! anything else can happen to it.
//!
//! All of this runs on the main thread; the mutexes only satisfy `static`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::{Context, RedisString};

use crate::error::LockError;
use crate::host::blocking::{self, BlockedClient};
use crate::host::server::{is_primary, key_string, now_ms, select_db, selected_db};
use crate::host::timer::Earliest;
use crate::host::{in_call, keys, timer};
use crate::lock::ages::Space;
use crate::lock::core::Lock;
use crate::lock::queues::{Ending, Queues, Tag, Waiter};
use crate::lock::KeyRef;
use crate::lock::{locked, UniqueFifo};
use crate::metrics;
use crate::service::value::in_key;

static QUEUES: LazyLock<Mutex<Queues<BlockedClient>>> =
    LazyLock::new(|| Mutex::new(Queues::default()));

/// The queues, locked for one operation.
pub fn queues() -> MutexGuard<'static, Queues<BlockedClient>> {
    locked(&QUEUES)
}

/// INFO, per namespace: the waiters in `space`, and how long the oldest has waited in ms (0
/// when none).
pub fn in_space(space: Space) -> (usize, u64) {
    let (count, oldest) = queues().in_space(space);
    let waited = oldest.map_or(0, |since| {
        u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
    });
    (count, waited)
}

/// True when any client waits on any key (a check that needs no key).
pub fn anyone_waiting() -> bool {
    metrics::WAITERS.get() > 0
}

/// The key as the queues and the session table name it.
pub fn key_ref(ctx: &Context, key: &RedisString) -> KeyRef {
    (selected_db(ctx), key.as_slice().into())
}

/// An acquirer may queue (WAIT) on a primary only: a replica follows its primary's grants and
/// serves no queue of its own (see `handoff::serve_ready`), so a client queued there would wait
/// until its timeout, or forever.
pub fn check_may_queue(ctx: &Context, wait: Option<u64>) -> Result<(), LockError> {
    if wait.is_some() && !is_primary(ctx) {
        return Err(LockError::WaitOnReplica);
    }
    Ok(())
}

/// True when acquirers are queued on `key` (cheap when nobody waits anywhere).
pub fn queued(ctx: &Context, key: &RedisString) -> bool {
    anyone_waiting() && queues().acquirers_on(selected_db(ctx), key.as_slice()) > 0
}

/// Number of clients waiting on `key` (acquirers and watchers).
pub fn waiting_on(ctx: &Context, key: &RedisString) -> usize {
    if !anyone_waiting() {
        return 0;
    }
    queues().waiting_on(selected_db(ctx), key.as_slice())
}

/// The acquirers queued on `key`: (exclusive, shared or permit).
pub fn acquirers_by_mode(ctx: &Context, key: &RedisString) -> (usize, usize) {
    if !anyone_waiting() {
        return (0, 0);
    }
    queues().acquirers_by_mode(selected_db(ctx), key.as_slice())
}

/// Keys whose queue heads may be served, in the order they had room, each once.
static READY: LazyLock<Mutex<UniqueFifo<KeyRef>>> =
    LazyLock::new(|| Mutex::new(UniqueFifo::default()));
/// Whether `READY` has keys: the check at the end of every command takes no lock.
static ANY_READY: AtomicBool = AtomicBool::new(false);
/// Serves `READY` when room was made outside a command or timer callback (see [`signal_ready`]).
static READY_TIMER: timer::Single = timer::Single::new();

/// `key`'s lock has room: its queue is served right after the current command or timer callback
/// (the head acquirer is granted and answered, see `handoff::serve_ready`); Redis runs the reply
/// callbacks of the multi-lock waiters and watchers blocked on it. From any other callback (a
/// wait's end, a disconnection, a reply callback), which may not write, a 0 ms timer serves it.
pub fn signal_ready(ctx: &Context, key: &RedisString) {
    keys::signal_ready(ctx, key);
    mark_ready(key_ref(ctx, key));
    if !in_call() {
        // Its callback has nothing to do: the end of the timer callback serves `READY`.
        READY_TIMER.arm(ctx, 0, ready_timer_fired);
    }
}

/// Signals `place` once clients are no longer paused (see `handoff::serve_ready`), not now:
/// Redis would offer the key again in the same pass.
pub fn signal_later(ctx: &Context, place: KeyRef) {
    mark_ready(place);
    serve_later(ctx, 10);
}

fn mark_ready(place: KeyRef) {
    locked(&READY).push(place);
    ANY_READY.store(true, Ordering::Relaxed);
}

/// The next key whose queue may be served.
pub fn next_ready() -> Option<KeyRef> {
    let mut ready = locked(&READY);
    let next = ready.pop();
    ANY_READY.store(!ready.is_empty(), Ordering::Relaxed);
    next
}

/// True when some queue waits to be served.
pub fn any_ready() -> bool {
    ANY_READY.load(Ordering::Relaxed)
}

fn ready_timer_fired(_ctx: &Context) {
    READY_TIMER.fired();
}

/// Serves the queues in `READY` later (clients are paused: no grant may be replicated now).
pub fn serve_later(ctx: &Context, delay_ms: u64) {
    READY_TIMER.arm(ctx, delay_ms, ready_timer_fired);
}

/// Wakes the `LOCK.WAIT` watchers of `key` whose wait is over, given its lock now.
pub fn wake_watchers(ctx: &Context, key: &RedisString, lock: &Lock, now: u64) {
    if !anyone_waiting() {
        return;
    }
    if let Some(left) = lock.delay_ttl(now) {
        // Nobody holds it, but nobody can take it before the lock-delay ends: a watcher woken
        // now would find a lock it cannot take. They are looked at again when it ends.
        if waiting_on(ctx, key) > 0 {
            watch_delay_end(ctx, key_ref(ctx, key), now.saturating_add(left));
        }
        return;
    }
    let oldest = lock.live_holders(now).map(|(fence, _)| fence).min();
    let woken = queues().take_watchers(selected_db(ctx), key.as_slice(), oldest);
    for watcher in woken {
        end_wait(watcher.id, watcher.handle, Ending::Watched);
    }
}

/// Wakes the watchers of `key` whose wait is over, without changing anything (a replica, or a
/// lock-delay that ended).
pub fn wake_watchers_of(ctx: &Context, key_name: &RedisString, now: u64) {
    let key = ctx.open_key(key_name);
    match in_key(&key) {
        Ok(Some(stored)) => wake_watchers(ctx, key_name, stored.lock(), now),
        Ok(None) => wake_watchers(ctx, key_name, &Lock::default(), now),
        Err(_) => {}
    }
}

/// Keys whose watchers wait for a lock-delay to end, by its end, and the timer armed for the
/// earliest. Kept here rather than left to the lease timer, which expires nothing on a replica,
/// where LOCK.WAIT works too.
struct DelayEnds {
    ends: BTreeSet<(u64, KeyRef)>,
    timer: Earliest,
}

static DELAY_ENDS: Mutex<DelayEnds> = Mutex::new(DelayEnds {
    ends: BTreeSet::new(),
    timer: Earliest::new(),
});

/// Looks at the watchers of `key` again at `at` (a lock-delay's end).
pub fn watch_delay_end(ctx: &Context, key: KeyRef, at: u64) {
    let mut delays = locked(&DELAY_ENDS);
    delays.ends.insert((at, key));
    delays.timer.arm(ctx, at, delays_ended);
}

/// The delay timer: wakes the watchers of every lock whose delay has ended, then re-arms for
/// the next end.
fn delays_ended(ctx: &Context) {
    let now = now_ms();
    let due = {
        let mut delays = locked(&DELAY_ENDS);
        delays.timer.fired();
        let later = delays
            .ends
            .split_off(&(now.saturating_add(1), (i32::MIN, Box::default())));
        std::mem::replace(&mut delays.ends, later)
    };
    let original = selected_db(ctx);
    for (_, (db, key)) in due {
        if select_db(ctx, db) {
            wake_watchers_of(ctx, &key_string(ctx, &key), now);
        }
    }
    select_db(ctx, original);
    let mut delays = locked(&DELAY_ENDS);
    if let Some(&(at, _)) = delays.ends.first() {
        delays.timer.arm(ctx, at, delays_ended);
    }
}

/// Ends every wait on `key`, acquirers' and watchers': each is told to send its command again
/// (see `Ending::Displaced`).
pub fn displace_all(ctx: &Context, key: &RedisString) {
    if !anyone_waiting() {
        return;
    }
    let all = queues().take_all(selected_db(ctx), key.as_slice());
    for waiter in all {
        end_wait(waiter.id, waiter.handle, Ending::Displaced);
    }
}

/// Unblocks waiter `id`, already taken off its queue: its timeout callback, which runs inside
/// this call, answers for `ending`.
pub fn end_wait(id: u64, handle: BlockedClient, ending: Ending) {
    queues().mark_woken(id, ending);
    blocking::unblock(handle);
}

/// Removes a waiter from its queue (timeout, disconnect, `CLIENT UNBLOCK`, freed).
pub fn remove(tag: &Tag) -> Option<Waiter<BlockedClient>> {
    queues().remove(tag)
}
