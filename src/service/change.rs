//! Changes of a stored lock and what follows them, shared by the commands, the expiry timer and
//! deferred work: apply the change, announce and replicate it, forget a session that ended, and
//! hand a freed lock to the next waiter.

use std::collections::HashSet;

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString};

use crate::error::LockError;
use crate::host::keys;
use crate::host::server::is_cluster;
use crate::lock::codec::State;
use crate::lock::core::{Acquire, Lock, Member, Mode, Refused, Request, TokenDigest};
use crate::lock::event::Event;
use crate::lock::floor;
use crate::lock::lease_index::Entry;
use crate::lock::sessions::{self, Session};
use crate::metrics;
use crate::service::effects::{self, Known};
use crate::service::policy::{self, Stat};
use crate::service::value::{in_key_mut, Stored, APPLY, LOCK_TYPE};
use crate::service::waiters;
use crate::service::{holds, leases};

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
    change_of(ctx, key, stored, now, None, change)
}

/// [`change`] of the hold of `token` alone: when the lock has shared or permit holders before
/// and after it, only that holder's change is replicated (see `codec::member_effect_args`).
pub fn change_hold(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    token: &TokenDigest,
    change: impl FnOnce(&mut Lock) -> Option<Event>,
) -> Option<Event> {
    change_of(ctx, key, stored, now, Some(token), change)
}

/// [`change`] of `stored`, the lock in `key` (of `token`'s hold alone, as [`change_hold`],
/// when given), then [`reclaim_if_due`] when the change freed it. A lock freed and deleted at
/// once (`lock.tombstone-ttl 0`, nobody queued) travels to replicas and the AOF as one effect,
/// `event:fence:floor:x` (see `codec::State::reclaimed`), instead of its freed state followed
/// by its reclaim. The lock may be deleted: `stored` must not be used after this returns.
pub fn change_and_reclaim(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    stored: &mut Stored,
    now: u64,
    token: Option<&TokenDigest>,
    change: impl FnOnce(&mut Lock) -> Option<Event>,
) -> Option<Event> {
    let (event, held_back) = change_then(ctx, name, stored, now, token, true, change)?;
    if event.frees() {
        reclaim_after(ctx, key, name, now, held_back.then_some(event));
    }
    Some(event)
}

fn change_of(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    token: Option<&TokenDigest>,
    change: impl FnOnce(&mut Lock) -> Option<Event>,
) -> Option<Event> {
    change_then(ctx, key, stored, now, token, false, change).map(|(event, _)| event)
}

/// [`change_of`], which, when `reclaim_next` and the change freed a lock that is reclaimed at
/// once, announces the change but holds its effect back for [`reclaim_after`] to send with the
/// reclaim (true beside the event then). Nothing between here and the reclaim can make the
/// lock unreclaimable: no acquirer is queued, and the watchers woken only read it.
fn change_then(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    token: Option<&TokenDigest>,
    reclaim_next: bool,
    change: impl FnOnce(&mut Lock) -> Option<Event>,
) -> Option<(Event, bool)> {
    let had_group = stored.lock().group.is_some();
    let long = holds::long_before(stored);
    let event = stored.update_at(now, change)?;
    if !long.is_empty() {
        holds::ended(stored, &long, event, now);
    }
    if matches!(event, Event::Expired | Event::SessionEnd) && stored.lock().delay_ttl(now).is_some()
    {
        metrics::DELAYED.incr();
    }
    let alone = matches!(
        event,
        Event::Acquire
            | Event::Release
            | Event::DropHold
            | Event::Renew
            | Event::Expired
            | Event::SessionEnd
    );
    let mut held_back = false;
    match token {
        Some(token) if alone && had_group && stored.lock().group.is_some() => {
            effects::propagate_hold(ctx, key, event, stored, token, now);
        }
        _ if reclaim_next && event.frees() && reclaim_of(ctx, key, stored, now) == Reclaim::Now => {
            effects::announce(ctx, key, event, stored, Known::ByEvent);
            held_back = true;
        }
        _ => effects::propagate(ctx, key, event, stored),
    }
    if event.frees() {
        if sessions::any() {
            let place = waiters::key_ref(ctx, key);
            let lock = stored.lock();
            match token {
                // A change of one hold ended at most that hold's session: one lookup, however
                // many holders have sessions.
                Some(token) if !lock.holds(token, now) => sessions::forget_tokens(&place, [token]),
                Some(_) => {}
                None => {
                    let live: HashSet<&TokenDigest> =
                        lock.live_holders(now).map(|(_, h)| h.token()).collect();
                    sessions::keep_only(&place, |token| live.contains(token));
                }
            }
        }
        hand_over(ctx, key, stored, now);
    }
    Some((event, held_back))
}

/// After a change that freed the lock (or a permit, or made room for shared holders): lets Redis
/// serve the queue (the head acquirer is granted from its reply callback, right after the
/// current command or callback) and wakes the `LOCK.WAIT` watchers whose wait is over.
pub fn hand_over(ctx: &Context, key: &RedisString, stored: &Stored, now: u64) {
    if stored.lock().has_room(now) && waiters::queued(ctx, key) {
        waiters::signal_ready(ctx, key);
    }
    waiters::wake_watchers(ctx, key, stored.lock(), now);
}

/// Removes the holders whose lease already ran out, as the expiry timer would have: each
/// announced (`lock.expired`) and replicated on its own (see [`expire_overdue_within`]).
pub fn expire_overdue(ctx: &Context, key: &RedisString, stored: &mut Stored, now: u64) {
    expire_overdue_within(ctx, key, stored, now, usize::MAX);
}

/// True when the lock's exclusive holder's lease ran out by `now`.
fn holder_overdue(stored: &Stored, now: u64) -> bool {
    stored
        .lock()
        .holder
        .as_ref()
        .is_some_and(|h| h.deadline <= now)
}

/// Expires the exclusive holder of `stored`, whose lease ran out by `now`, and counts it. Given
/// the lock's `key`, a lock so freed that is reclaimed at once goes with its expiry as one
/// effect (see [`change_and_reclaim`]), and `stored` must not be used after this returns.
fn expire_holder(
    ctx: &Context,
    name: &RedisString,
    stored: &mut Stored,
    now: u64,
    key: Option<&RedisKeyWritable>,
) {
    let expire = |lock: &mut Lock| lock.expire(now).then_some(Event::Expired);
    let expired = match key {
        Some(key) => change_and_reclaim(ctx, key, name, stored, now, None, expire),
        None => change(ctx, name, stored, now, expire),
    };
    if expired.is_some() {
        metrics::EXPIRED.incr();
        policy::tally(name.as_slice(), Stat::Expired, 1);
    }
}

/// [`expire_overdue`] of at most `budget` holders; true when overdue holders remain. Shared and
/// permit holders go in one pass over them, each announced and replicated on its own, and what
/// follows a change (the lease index, the ages, the queue) is brought up to date once: a key
/// with thousands of holders whose leases end together costs O(N), not O(N) per holder.
pub fn expire_overdue_within(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    budget: usize,
) -> bool {
    if holder_overdue(stored, now) {
        expire_holder(ctx, key, stored, now, None);
        return false;
    }
    if !stored.lock().is_overdue(now) {
        return false;
    }
    let expired = remove_members(ctx, key, stored, now, Event::Expired, |lock| {
        lock.expire_members(now, budget)
    });
    metrics::EXPIRED.add(expired as u64);
    policy::tally(key.as_slice(), Stat::Expired, expired as u64);
    stored.lock().is_overdue(now)
}

/// Removes shared or permit holders together (`take` picks and removes them, in one pass over
/// the holders) and follows the change once: the long-hold log, a notification each, one
/// removal effect naming their tokens' digests, their sessions, the queue. Returns how many
/// went.
fn remove_members(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    event: Event,
    take: impl FnOnce(&mut Lock) -> Vec<Member>,
) -> usize {
    let long = holds::long_before(stored);
    let removed = stored.update_at(now, take);
    if removed.is_empty() {
        return 0;
    }
    if !long.is_empty() {
        holds::ended(stored, &long, event, now);
    }
    let tokens: Vec<TokenDigest> = removed.iter().map(|m| *m.holder.token()).collect();
    effects::propagate_removed(ctx, key, event, stored, &tokens, now);
    sessions::forget_tokens(&waiters::key_ref(ctx, key), &tokens);
    hand_over(ctx, key, stored, now);
    tokens.len()
}

/// Whether the free lock `stored` in `key` is deleted now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reclaim {
    /// Not free, in a lock-delay, or its tombstone time is not up.
    NotDue,
    /// Due, but acquirers queue for it: they are served instead.
    Queued,
    /// Due, and nobody queues for it.
    Now,
}

fn reclaim_of(ctx: &Context, key: &RedisString, stored: &Stored, now: u64) -> Reclaim {
    if !stored.reclaimable(now) {
        Reclaim::NotDue
    } else if waiters::queued(ctx, key) {
        Reclaim::Queued
    } else {
        Reclaim::Now
    }
}

/// Deletes the free lock in `key` when its tombstone time is up (at once with
/// `lock.tombstone-ttl 0`) and nobody queues for it: announced as DEL would be, and replicated
/// as `LOCK.APPLY key reclaim:fence:floor`. The floor keeps its last fence, so later grants of
/// the key still exceed it. True when it deleted the lock.
pub fn reclaim_if_due(
    ctx: &Context,
    key: &RedisKeyWritable,
    key_name: &RedisString,
    now: u64,
) -> bool {
    reclaim_after(ctx, key, key_name, now, None)
}

/// [`reclaim_if_due`] right after a change `freed_by` whose effect [`change_then`] held back:
/// sent with the reclaim as one effect, or alone first when the lock is not reclaimed after
/// all.
fn reclaim_after(
    ctx: &Context,
    key: &RedisKeyWritable,
    key_name: &RedisString,
    now: u64,
    freed_by: Option<Event>,
) -> bool {
    let Ok(Some(stored)) = in_key_mut(key) else {
        return false;
    };
    let reclaim = reclaim_of(ctx, key_name, stored, now);
    if reclaim != Reclaim::Now {
        if let Some(event) = freed_by {
            effects::replicate(ctx, key_name, event, stored);
        }
        if reclaim == Reclaim::Queued {
            // Acquirers are served right after the change that freed the lock; look again
            // later.
            stored.postpone_reclaim(now);
            leases::follow(ctx, stored, key_name.as_slice());
            waiters::signal_ready(ctx, key_name);
        }
        return false;
    }
    let state = match freed_by {
        Some(event) => State::reclaimed(event, stored.lock()),
        None => State::of(Event::Reclaim, stored.lock()),
    };
    // The value is freed by the deletion: nothing may use `stored` from here on.
    if key.delete().is_err() {
        if let (Some(event), Ok(Some(stored))) = (freed_by, in_key_mut(key)) {
            effects::replicate(ctx, key_name, event, stored);
        }
        return false;
    }
    effects::announce_deleted(ctx, key_name);
    keys::replicate_key_state(ctx, APPLY, key_name, state.as_bytes(), &[]);
    metrics::RECLAIMED.incr();
    true
}

/// How many shared or permit holds of one key a background job ends before it looks at the clock
/// again (the lease timer, see `expiry::on_due`; a closed connection's sessions, see
/// `deferred`): a key with ten thousand holders ending together is worked off in slices too.
pub const HOLDS_PER_STEP: usize = 512;

/// The lease index's entry `entry` for the lock under `key` (in the selected db) came due:
/// expires it if its lease has run out, reclaims it if it is free and its tombstone time is up.
/// Only while it is still the value with id `id`: another lock under this name has an entry of
/// its own.
pub fn visit_due(ctx: &Context, key_name: &RedisString, id: u64, entry: Entry, now: u64) {
    let key = ctx.open_key_writable(key_name);
    match in_key_mut(&key) {
        Ok(Some(stored)) if stored.id() == id => {
            // Its entry is gone; whatever is due later gets a new one.
            leases::forget(id, stored.entry_came_due(entry));
            // Long holds first: a lease that ran out after its hold became long was one.
            holds::cross(ctx, key_name, stored, now);
            if holder_overdue(stored, now) {
                // With the reclaim it makes due, as one effect: the lock may be gone after.
                expire_holder(ctx, key_name, stored, now, Some(&key));
            } else {
                // In slices: holders left overdue keep the entry due now, and the timer comes
                // back to them after looking at the clock.
                expire_overdue_within(ctx, key_name, stored, now, HOLDS_PER_STEP);
            }
            if let Ok(Some(stored)) = in_key_mut(&key) {
                if stored.take_wake(now) {
                    // A lock-delay ended: the queue is served now.
                    hand_over(ctx, key_name, stored, now);
                }
            }
        }
        _ => return,
    }
    if !reclaim_if_due(ctx, &key, key_name, now) {
        if let Ok(Some(stored)) = in_key_mut(&key) {
            leases::follow(ctx, stored, key_name.as_slice());
        }
    }
}

/// Points the lease index at the lock under `key` (in the selected db), which arrived there
/// without a grant: renamed or moved (its entries now name this place), copied or restored (it
/// gets entries of its own). Looks without touching the key (see `keys::open_quietly`): it runs
/// for keys that may not be locks at all.
pub fn index_arrived(ctx: &Context, key_name: &RedisString) {
    let key = keys::open_quietly(ctx, key_name);
    if let Ok(Some(stored)) = in_key_mut(&key) {
        leases::arrived(ctx, stored, key_name.as_slice());
        holds::arrived(stored, key_name.as_slice());
    }
}

/// Settles a key whose waiters may be able to proceed: it was deleted, flushed, swapped or
/// recreated. A missing key with queued acquirers gets a fresh lock for the head one.
pub fn settle_key(ctx: &Context, key_name: &RedisString, now: u64) {
    let key = ctx.open_key_writable(key_name);
    match in_key_mut(&key) {
        Ok(Some(stored)) => {
            expire_overdue(ctx, key_name, stored, now);
            hand_over(ctx, key_name, stored, now);
            reclaim_if_due(ctx, &key, key_name, now);
        }
        // In a cluster the key may have left with its slot (MIGRATE deletes it here), and
        // nothing tells a MIGRATE from a DEL: a lock created here could be one its new node never
        // knows. The waiters send their commands again instead, routed by Redis.
        Ok(None) if is_cluster(ctx) => waiters::displace_all(ctx, key_name),
        Ok(None) => {
            if waiters::queued(ctx, key_name) {
                create_for_waiters(ctx, &key, key_name);
            }
            waiters::wake_watchers(ctx, key_name, &Lock::default(), now);
        }
        // Another type took the name: waiters keep waiting for it to become a lock again.
        Err(_) => {}
    }
}

/// Creates a fresh lock in the missing `key` for the acquirers queued on it, like any change
/// (replicated, announced): the key's existence makes Redis serve them, head first.
pub fn create_for_waiters(ctx: &Context, key: &RedisKeyWritable, key_name: &RedisString) {
    if key
        .set_value(&LOCK_TYPE, Stored::new(Lock::default()))
        .is_ok()
    {
        if let Ok(Some(stored)) = in_key_mut(key) {
            effects::propagate(ctx, key_name, Event::Sync, stored);
        }
        waiters::signal_ready(ctx, key_name);
    }
}

/// How many holds of one key end one by one rather than in a pass over its holders.
const FEW: usize = 8;

/// Releases, as if by their holders, the session holds a closed connection had on the lock in
/// `key_name`: only on the lock value they were taken on, still held by their tokens. Shared
/// and permit holds end together, in one pass over the holders.
pub fn end_sessions(ctx: &Context, key_name: &RedisString, sessions: &[Session], now: u64) {
    let key = ctx.open_key_writable(key_name);
    let Ok(Some(stored)) = in_key_mut(&key) else {
        return;
    };
    let tokens: HashSet<TokenDigest> = sessions
        .iter()
        .filter(|session| session.lock_id == stored.id())
        .map(|session| session.token)
        .collect();
    if tokens.is_empty() {
        return;
    }
    expire_overdue(ctx, key_name, stored, now);
    // Many holds at once: one pass over the key's holders. A few (a reader's connection
    // closing): each found as a release finds it, without a pass over them all.
    if stored.lock().group.is_some() && tokens.len() > FEW {
        let ended = remove_members(ctx, key_name, stored, now, Event::SessionEnd, |lock| {
            lock.end_member_sessions(&tokens, now)
        });
        metrics::SESSION_RELEASED.add(ended as u64);
    } else {
        for token in &tokens {
            let ended = change_hold(ctx, key_name, stored, now, token, |lock| {
                lock.end_session(token, now).then_some(Event::SessionEnd)
            });
            if ended.is_some() {
                metrics::SESSION_RELEASED.incr();
            }
        }
    }
    reclaim_if_due(ctx, &key, key_name, now);
}

/// Drops one hold of `token` on the lock in `key`, as LOCK.RELEASE does: announced and
/// replicated, handed over and reclaimed when it freed the lock, counted either way. True when
/// `token` held it.
pub fn release_key(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    token: &TokenDigest,
    now: u64,
) -> Result<bool, LockError> {
    let mut released = None;
    if let Some(stored) = in_key_mut(key)? {
        expire_overdue(ctx, name, stored, now);
        change_and_reclaim(ctx, key, name, stored, now, Some(token), |lock| {
            released = lock.release(token, now);
            released.map(|free| {
                if free {
                    Event::Release
                } else {
                    Event::DropHold
                }
            })
        });
    }
    if released.is_some() {
        metrics::RELEASED.incr();
    } else {
        metrics::RELEASE_MISMATCH.incr();
    }
    Ok(released.is_some())
}

/// Grants `request` on the stored lock (or refreshes the requester's own hold), announced and
/// replicated as `lock.acquire` (a downgrade as `lock.downgrade`); busy changes nothing.
pub fn grant_stored(
    ctx: &Context,
    name: &RedisString,
    stored: &mut Stored,
    request: &Request,
    now: u64,
) -> Result<Acquire, Refused> {
    let mut outcome = Ok(Acquire::Busy);
    change_hold(ctx, name, stored, now, &request.token, |lock| {
        outcome = lock.grant(request, floor::get(), now);
        match outcome {
            Ok(Acquire::Granted { .. } | Acquire::Refreshed { .. }) => Some(Event::Acquire),
            Ok(Acquire::Downgraded { .. }) => Some(Event::Downgrade),
            Ok(Acquire::Busy) | Err(_) => None,
        }
    });
    if let Ok(Acquire::Granted { .. }) = outcome {
        count_grant(request.mode);
    }
    outcome
}

/// Counts a new grant by its kind (INFO `lock_shared_grants`, `lock_permit_grants`).
pub fn count_grant(mode: Mode) {
    match mode {
        Mode::Exclusive => {}
        Mode::Shared => metrics::SHARED_GRANTS.incr(),
        Mode::Permit(_) => metrics::PERMIT_GRANTS.incr(),
    }
}

/// Grants one key that was found grantable (LOCK.MACQUIRE, a multi-lock waiter): (fence, lock
/// id, a new grant rather than a refresh).
pub fn grant_key(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    request: &Request,
    now: u64,
) -> Result<(u64, u64, bool), LockError> {
    let outcome = match in_key_mut(key)? {
        Some(stored) => (grant_stored(ctx, name, stored, request, now), stored.id()),
        None => {
            let mut lock = Lock::default();
            let outcome = lock.grant(request, floor::get(), now);
            if outcome.is_err() {
                (outcome, 0)
            } else {
                count_grant(request.mode);
                key.set_value(&LOCK_TYPE, Stored::granted(lock))
                    .map_err(|_| LockError::internal("a new lock could not be stored"))?;
                let stored = in_key_mut(key)?
                    .ok_or(LockError::internal("a new lock vanished from its key"))?;
                effects::propagate(ctx, name, Event::Acquire, stored);
                (outcome, stored.id())
            }
        }
    };
    match outcome {
        (Ok(Acquire::Granted { fence }), id) => Ok((fence, id, true)),
        (Ok(Acquire::Refreshed { fence } | Acquire::Downgraded { fence }), id) => {
            Ok((fence, id, false))
        }
        // Checked grantable just before, in the same command: cannot happen.
        (Ok(Acquire::Busy), _) => Err(LockError::internal("a key found free was busy")),
        (Err(refused), _) => Err(refused.into()),
    }
}
