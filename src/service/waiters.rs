//! The process' queues of waiting clients (see `lock::queues`), and waking them.
//!
//! Waiting clients are blocked with `RedisModule_BlockClientOnKeys`, so Redis keeps them in the
//! same arrival order as the queue. When a lock becomes free the module signals its key as ready;
//! right after the command (or timer) that freed it, Redis calls the reply callback of the key's
//! blocked clients in order, and the head of the queue is granted the lock and answered in that
//! same call (see `handoff`). Watchers are unblocked with the outcome recorded here. A waiter
//! that times out, disconnects or is unblocked by `CLIENT UNBLOCK` leaves its queue before
//! anything else can happen to it.
//!
//! All of this runs on the main thread; the mutex only satisfies `static`.

use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::{Context, RedisString};

use crate::host::blocking::{self, BlockedClient};
use crate::host::keys;
use crate::host::server::selected_db;
use crate::lock::core::Lock;
use crate::lock::locked;
use crate::lock::queues::{Ending, Queues, Tag, Waiter};
use crate::lock::KeyRef;
use crate::metrics;

static QUEUES: LazyLock<Mutex<Queues<BlockedClient>>> =
    LazyLock::new(|| Mutex::new(Queues::default()));

/// The queues, locked for one operation.
pub fn queues() -> MutexGuard<'static, Queues<BlockedClient>> {
    locked(&QUEUES)
}

/// True when any client waits on any key (a check that needs no key).
pub fn anyone_waiting() -> bool {
    metrics::WAITERS.get() > 0
}

/// The key as the queues and the session table name it.
pub fn key_ref(ctx: &Context, key: &RedisString) -> KeyRef {
    (selected_db(ctx), key.as_slice().into())
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

/// Lets Redis serve the acquirers of `key` (after the current command or callback).
pub fn signal_ready(ctx: &Context, key: &RedisString) {
    keys::signal_ready(ctx, key);
}

/// Wakes the `LOCK.WAIT` watchers of `key` whose wait is over, given its lock now.
pub fn wake_watchers(ctx: &Context, key: &RedisString, lock: &Lock, now: u64) {
    if !anyone_waiting() {
        return;
    }
    let oldest = lock.live_holders(now).map(|(fence, _)| fence).min();
    let woken = queues().take_watchers(selected_db(ctx), key.as_slice(), oldest);
    for watcher in woken {
        end_wait(&watcher, Ending::Watched);
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
        end_wait(&waiter, Ending::Displaced);
    }
}

/// Unblocks a waiter already taken off its queue; its timeout callback answers for `ending`.
fn end_wait(waiter: &Waiter<BlockedClient>, ending: Ending) {
    queues().mark_woken(waiter.id, ending);
    blocking::unblock(waiter.handle);
}

/// Removes a waiter from its queue (timeout, disconnect, `CLIENT UNBLOCK`, freed).
pub fn remove(tag: &Tag) -> Option<Waiter<BlockedClient>> {
    queues().remove(tag)
}
