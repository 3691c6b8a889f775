//! Changes of a stored lock and what follows them, shared by the commands, the expiry timer and
//! deferred work: apply the change, announce and replicate it, forget a session that ended, and
//! hand a freed lock to the next waiter.

use redis_module::{Context, RedisString};

use crate::host::keys;
use crate::host::server::selected_db;
use crate::lock::core::Lock;
use crate::lock::event::Event;
use crate::lock::lease_index::short_id;
use crate::lock::sessions;
use crate::metrics;
use crate::service::effects;
use crate::service::value::{in_key, in_key_mut, Stored, LOCK_TYPE};
use crate::service::waiters;

/// Applies `change` to the stored lock and, when it reports an event, announces and replicates
/// it. When the change freed the lock, the session is forgotten and the lock handed over to the
/// next waiter.
pub fn change(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    change: impl FnOnce(&mut Lock) -> Option<Event>,
) -> Option<Event> {
    let before = stored.deadline();
    let event = stored.update(change)?;
    effects::propagate(ctx, key, event, stored, before);
    if event.frees() {
        if sessions::any() {
            sessions::forget(&waiters::key_ref(ctx, key));
        }
        hand_over(ctx, key, stored, now);
    }
    Some(event)
}

/// After a change that freed the lock: lets Redis serve the queue (the head acquirer is granted
/// the lock from its reply callback, right after the current command or callback) and wakes
/// the `LOCK.WAIT` watchers whose wait is over.
pub fn hand_over(ctx: &Context, key: &RedisString, stored: &Stored, now: u64) {
    if !stored.lock().is_held(now) && waiters::queued(ctx, key) {
        waiters::signal_ready(ctx, key);
    }
    waiters::wake_watchers(ctx, key, stored.lock(), now);
}

/// Removes a holder whose lease already ran out, as the expiry timer would have.
pub fn expire_overdue(ctx: &Context, key: &RedisString, stored: &mut Stored, now: u64) {
    if stored.lock().is_overdue(now) {
        metrics::EXPIRED.incr();
        change(ctx, key, stored, now, |lock| {
            lock.expire(now).then_some(Event::Expired)
        });
    }
}

/// Expires the lock under `key` (in the selected db) if its lease has run out and it is still
/// the value with (short) id `id`: the expiry timer's work on one key.
pub fn expire_key(ctx: &Context, key_name: &RedisString, id: u64, now: u64) {
    let key = ctx.open_key_writable(key_name);
    if let Ok(Some(stored)) = in_key_mut(&key) {
        // Another lock under this name has an index entry of its own.
        if short_id(stored.id()) == id {
            expire_overdue(ctx, key_name, stored, now);
        }
    }
}

/// The id and lease deadline of the lock under `key`, if it has a holder. Looks without
/// touching the key (see `keys::open_quietly`): it runs for keys that may not be locks at all.
pub fn lease_of(ctx: &Context, key_name: &RedisString) -> Option<(u64, u64)> {
    let key = keys::open_quietly(ctx, key_name);
    let stored = in_key_mut(&key).ok().flatten()?;
    stored.deadline().map(|d| (stored.id(), d))
}

/// Settles a key whose waiters may be able to proceed: it was deleted, flushed, swapped or
/// recreated. A missing key with queued acquirers gets a fresh lock for the head one.
pub fn settle_key(ctx: &Context, key_name: &RedisString, now: u64) {
    let key = ctx.open_key_writable(key_name);
    match in_key_mut(&key) {
        Ok(Some(stored)) => {
            expire_overdue(ctx, key_name, stored, now);
            hand_over(ctx, key_name, stored, now);
        }
        Ok(None) => {
            let acquirers =
                waiters::queues().acquirers_on(selected_db(ctx), key_name.as_slice()) > 0;
            // A fresh lock for the queue: creating the key makes Redis serve its waiters.
            if acquirers
                && key
                    .set_value(&LOCK_TYPE, Stored::new(Lock::default()))
                    .is_ok()
            {
                waiters::signal_ready(ctx, key_name);
            }
            waiters::wake_watchers(ctx, key_name, &Lock::default(), now);
        }
        // Another type took the name: waiters keep waiting for it to become a lock again.
        Err(_) => {}
    }
}

/// Releases, as if by their holder, the session lock of a connection that closed.
pub fn end_session(ctx: &Context, key_name: &RedisString, token: &[u8], now: u64) {
    let key = ctx.open_key_writable(key_name);
    if let Ok(Some(stored)) = in_key_mut(&key) {
        expire_overdue(ctx, key_name, stored, now);
        let ended = change(ctx, key_name, stored, now, |lock| {
            lock.end_session(token, now).then_some(Event::SessionEnd)
        });
        if ended.is_some() {
            metrics::SESSION_RELEASED.incr();
        }
    }
}

/// Wakes the watchers of `key` whose wait is over, without changing anything (replicas).
pub fn wake_watchers_of(ctx: &Context, key_name: &RedisString, now: u64) {
    let key = ctx.open_key(key_name);
    match in_key(&key) {
        Ok(Some(stored)) => waiters::wake_watchers(ctx, key_name, stored.lock(), now),
        Ok(None) => waiters::wake_watchers(ctx, key_name, &Lock::default(), now),
        Err(_) => {}
    }
}
