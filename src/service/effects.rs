//! State changes as effects. The primary decides; replicas and AOF replay apply.
//!
//! Every change of a lock is sent to replicas and the AOF as `LOCK.APPLY key state [token]`
//! (see `lock::codec`): the whole resulting state with absolute values, so applying it never
//! depends on the replica's clock or configs. Two kinds of change travel alone instead: one
//! shared or permit holder's, and an exclusive holder's renewal (its new deadline); a replica
//! whose lock is not the one the change was made to refuses it and keeps its lock. The same code announces the change locally:
//! WATCH invalidation, the keyspace notification and the lease index.

use redis_module::{Context, NotifyEvent, RedisString};

use crate::host::keys;
use crate::host::server::{is_primary, now_ms};
use crate::lock::codec::{self, State};
use crate::lock::core::TokenDigest;
use crate::lock::event::Event;
use crate::lock::floor;
use crate::service::value::{Stored, APPLY};
use crate::service::{holds, leases, policy};

/// The name of the internal effect command (see `value::APPLY`).
const APPLY_NAME: &str = "LOCK.APPLY";

/// The name of the internal floor command.
pub const FLOOR: &str = "LOCK.FLOOR";

/// What is known of an announced change, which tells how the oldest hold is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// The change its event names: made here, or one holder's change applied as the primary
    /// made it (see `Lock::apply_member`). Holds came or went as that event makes them.
    ByEvent,
    /// A whole state applied (from the primary or the AOF): any hold may have come or gone.
    WholeState,
}

/// Tells the rest of the server about a change that already happened to the lock under `key`:
/// WATCH invalidation, the keyspace notification and the lease index.
pub fn announce(ctx: &Context, key: &RedisString, event: Event, stored: &Stored, known: Known) {
    keys::signal_modified(ctx, key);
    if policy::spaces_moving() {
        // The policy changed and the walk may not have reached this lock yet.
        holds::respace(stored, key.as_slice());
    }
    if let Some(name) = event.notification() {
        keys::notify(ctx, NotifyEvent::MODULE, name, key);
    }
    leases::follow(ctx, stored, key.as_slice());
    // A renewal or a dropped reentrant hold keeps every grant, and so the oldest grant time:
    // the ages index is left alone (a lookup in it costs more than the rest of a RENEW).
    // A whole state applied may differ in any hold: every holder is looked through.
    if !matches!(event, Event::Renew | Event::DropHold) {
        match known {
            Known::ByEvent => holds::follow_change(stored, key.as_slice(), event),
            Known::WholeState => holds::follow(stored, key.as_slice()),
        }
    }
}

/// [`announce`] of a change that happened to `times` holders together: a notification each, the
/// rest once.
pub fn announce_times(
    ctx: &Context,
    key: &RedisString,
    event: Event,
    stored: &Stored,
    times: usize,
    known: Known,
) {
    announce(ctx, key, event, stored, known);
    if let Some(name) = event.notification() {
        for _ in 1..times {
            keys::notify(ctx, NotifyEvent::MODULE, name, key);
        }
    }
}

/// Tells the rest of the server that the lock under `key` was deleted by the module, as DEL
/// would: WATCH invalidation and the `del` event. (Its lease index entries left with its value.)
pub fn announce_deleted(ctx: &Context, key: &RedisString) {
    keys::signal_modified(ctx, key);
    keys::notify(ctx, NotifyEvent::GENERIC, c"del", key);
}

/// On the primary: announces a change and sends it to replicas and the AOF.
pub fn propagate(ctx: &Context, key: &RedisString, event: Event, stored: &Stored) {
    announce(ctx, key, event, stored, Known::ByEvent);
    replicate(ctx, key, event, stored);
}

/// On the primary: sends a change already announced to replicas and the AOF (the second half
/// of [`propagate`]).
pub fn replicate(ctx: &Context, key: &RedisString, event: Event, stored: &Stored) {
    let lock = stored.lock();
    if lock.group.is_some() {
        // Shared or permit holders: one state and token per holder.
        replicate_apply(ctx, key, &codec::effect_args(event, lock));
        return;
    }
    if let (Event::Renew, Some(holder)) = (event, &lock.holder) {
        // A renewal changes the deadline alone: the rest of the holder is on every replica.
        let state = State::renewal(lock, holder.deadline);
        keys::replicate_key_state(ctx, APPLY, key, state.as_bytes(), &[]);
        return;
    }
    let state = State::of(event, lock);
    let pair: [&[u8]; 2];
    let holder: &[&[u8]] = match &lock.holder {
        Some(_) if state.holds_inline() => &[],
        Some(holder) => {
            let who = codec::holder_who(holder);
            pair = [holder.token().as_bytes(), who.unwrap_or_default()];
            &pair[..if who.is_some() { 2 } else { 1 }]
        }
        None => &[],
    };
    keys::replicate_key_state(ctx, APPLY, key, state.as_bytes(), holder);
}

/// On the primary: announces the change of `token`'s shared or permit hold (made at `now`) and
/// sends it alone to replicas and the AOF, however many other holders the lock has.
pub fn propagate_hold(
    ctx: &Context,
    key: &RedisString,
    event: Event,
    stored: &Stored,
    token: &TokenDigest,
    now: u64,
) {
    announce(ctx, key, event, stored, Known::ByEvent);
    let args = codec::member_effect_args(event, stored.lock(), token, now);
    replicate_apply(ctx, key, &args);
}

/// On the primary: the shared or permit holds of `tokens` all ended with `event` (made at
/// `now`), leaving `stored` as it is: one notification each, the rest of the announcement once,
/// and the removals replicated together (their tokens' digests, however many holders stay).
pub fn propagate_removed(
    ctx: &Context,
    key: &RedisString,
    event: Event,
    stored: &Stored,
    tokens: &[TokenDigest],
    now: u64,
) {
    announce_times(ctx, key, event, stored, tokens.len(), Known::ByEvent);
    let args = codec::removals_effect_args(event, stored.lock(), tokens, now);
    replicate_apply(ctx, key, &args);
}

/// Sends `LOCK.APPLY key args...` to replicas and the AOF.
fn replicate_apply(ctx: &Context, key: &RedisString, args: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = std::iter::once(key.as_slice())
        .chain(args.iter().map(Vec::as_slice))
        .collect();
    ctx.replicate(APPLY_NAME, refs.as_slice());
}

/// Writes the fence floor to the AOF (and replicas) as `LOCK.FLOOR n`, on a primary that has
/// issued fences.
pub fn record_floor(ctx: &Context) {
    let floor = floor::get();
    if floor > 0 && is_primary(ctx) {
        ctx.replicate(FLOOR, &[floor.to_string().as_bytes()]);
    }
}

/// Raises the fence floor for an applied effect: to its floor and the key's fence.
pub fn note_floor(floor: u64, fence: u64) {
    floor::raise(floor.max(fence), now_ms());
}
