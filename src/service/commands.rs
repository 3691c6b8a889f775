//! The LOCK.* commands: arguments, a call into the lock core, the reply, and the announcement
//! and replication of whatever changed (through `change`).

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString, RedisValue};

use crate::config;
use crate::error::LockError;
use crate::host::command::{reply_map, Command, CommandResult};
use crate::host::keys::redact;
use crate::host::server::{
    caller_id, client_id, is_loading, is_primary, is_replayed, may_block, now_ms, parse_integer,
    persistence, Connection,
};
use crate::lock::codec::{self, MemberEffect, Reclaimed, Renewal};
use crate::lock::core::{self, Acquire, Grant, Lock, MemberChange, Mode};
use crate::lock::event::Event;
use crate::lock::floor;
use crate::lock::queues::{Kind, Request, SyncRequest};
use crate::lock::sessions;
use crate::metrics;
use crate::policy::Asked;
use crate::service::acks::Confirms;
use crate::service::args::{self, AcquireOptions};
use crate::service::audit;
use crate::service::change::{
    change_and_reclaim, change_hold, count_grant, create_for_waiters, expire_overdue, grant_stored,
    release_key,
};
use crate::service::effects::{self, Known};
use crate::service::guard::guard;
use crate::service::handoff::{self, fence_reply};
use crate::service::holds::{self, longholds};
use crate::service::list::list;
use crate::service::multi::{self, macquire, mrelease};
use crate::service::policy::{self, Judging, Stat};
use crate::service::value::{in_key, in_key_mut, Stored, LOCK_TYPE};
use crate::service::waiters;
use crate::service::who::who;

/// Declares a unit type per command whose `Command::run` is the given handler, and for the
/// commands that carry a token, what a failed call redacts (`Command::secret_on_error`).
macro_rules! commands {
    ($($name:ident => $handler:ident $(, secrets: $secrets:path)?;)*) => {$(
        pub struct $name;
        impl Command for $name {
            fn run(ctx: &Context, args: &[RedisString]) -> CommandResult {
                $handler(ctx, args)
            }
            $(
                fn secret_on_error(args: &[RedisString]) -> Vec<usize> {
                    $secrets(args)
                }
            )?
        }
    )*};
}

// Every command a client may send redacts on error: a token given by mistake where a fence, a
// timeout or a count belongs (`LOCK.FENCE k <token>`) is as secret as one in its own place.
// LOCK.APPLY and LOCK.FLOOR are flagged no-monitor and no-slowlog, and refused from clients.
commands! {
    LockAcquire => acquire, secrets: token_call_secrets;
    LockRelease => release, secrets: after_the_first;
    LockRenew => renew, secrets: token_call_secrets;
    LockFence => fence, secrets: after_the_first;
    LockWait => wait, secrets: after_the_first;
    LockInfo => info, secrets: after_the_first;
    LockForceRelease => force_release, secrets: after_the_first;
    LockApply => apply;
    LockFloor => floor_cmd;
    LockGuard => guard, secrets: crate::service::guard::secrets;
    LockMacquire => macquire, secrets: after_the_first;
    LockMrelease => mrelease, secrets: after_the_first;
    LockWho => who, secrets: after_the_first;
    LockLongholds => longholds, secrets: every_argument;
    LockPolicy => policy_command, secrets: every_argument;
    LockList => list, secrets: every_argument;
}

/// A failed call: anything after its first argument (the key, or numkeys, whose keys end
/// nowhere certain when it is wrong) may be a token.
fn after_the_first(args: &[RedisString]) -> Vec<usize> {
    (2..args.len()).collect()
}

/// A failed LOCK.ACQUIRE or LOCK.RENEW: when its shape is wrong (no integer ttl-ms after the
/// token: the key forgotten, arguments swapped) the token may be its first argument too.
fn token_call_secrets(args: &[RedisString]) -> Vec<usize> {
    if args::has_ttl_in_place(args) {
        after_the_first(args)
    } else {
        every_argument(args)
    }
}

/// `LOCK.POLICY LIST | EXPLAIN key` (see `service::policy`).
fn policy_command(ctx: &Context, args: &[RedisString]) -> CommandResult {
    policy::command(ctx, args)
}

/// A failed call of a command without a key: any argument may be a token.
fn every_argument(args: &[RedisString]) -> Vec<usize> {
    (1..args.len()).collect()
}

// Redis 7.0 routes a module command in a cluster by its legacy key range or its getkeys-api,
// not by key specs: the counted keys are declared here too.
impl crate::host::command::DeclaresKeys for LockMacquire {
    fn keys(_ctx: &Context, args: &[RedisString]) -> Vec<(usize, u32)> {
        multi::key_positions(args, multi::Shape::Acquire)
    }
}

impl crate::host::command::DeclaresKeys for LockMrelease {
    fn keys(_ctx: &Context, args: &[RedisString]) -> Vec<(usize, u32)> {
        multi::key_positions(args, multi::Shape::Release)
    }
}

impl crate::host::command::DeclaresKeys for LockGuard {
    fn keys(ctx: &Context, args: &[RedisString]) -> Vec<(usize, u32)> {
        crate::service::guard::keys(ctx, args)
    }
}

/// SYNC and FSYNC need a primary (a writable replica runs writes too, but what it changes
/// reaches no other replica and its primary's next sync replaces it), a client that can wait,
/// and FSYNC an AOF.
fn check_sync(ctx: &Context, sync: Option<SyncRequest>) -> Result<(), LockError> {
    let Some(sync) = sync else {
        return Ok(());
    };
    if !is_primary(ctx) {
        return Err(LockError::SyncOnReplica);
    }
    let fsync_alone = sync.fsync_ms.is_some() && sync.replicas == 0 && sync.timeout_ms == 0;
    if !may_block(ctx) {
        return Err(if fsync_alone {
            LockError::FsyncCannotWait
        } else {
            LockError::SyncCannotWait
        });
    }
    if sync.fsync_ms.is_some() && !persistence(ctx).0 {
        return Err(LockError::FsyncNeedsAof);
    }
    Ok(())
}

/// `LOCK.ACQUIRE key token ttl-ms [WAIT timeout-ms] [REENTRANT] [SESSION] [SYNC n ms] [FSYNC ms]
/// [LOCKDELAY ms] [SHARED | LIMIT n]`
fn acquire(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, token, ttl, options @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, 2);
    let token = args::token(ctx, token)?;
    let ttl = args::ttl(ctx, ttl)?;
    let options = AcquireOptions::parse(options, 4, is_replayed(ctx))?;
    check_sync(ctx, options.sync)?;
    args::check_session(ctx, options.session)?;
    waiters::check_may_queue(ctx, options.wait)?;
    let namespace_delay = policy::admit(ctx, key_name, Judging::All, || options.asked(ttl))?;
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let client = caller_id(ctx);
    let mut connection = Connection::of(ctx, client);
    core::record_connection(connection.text_mut());
    let label = options.label.as_deref().unwrap_or_default();
    let request = core::Request {
        token,
        ttl,
        reentrant: options.reentrant,
        session: options.session,
        delay: options.delay(namespace_delay),
        mode: options.mode(),
        provisional: options.sync.is_some_and(|s| s.waits()),
        client,
        connection: &connection,
        label,
    };
    // The grant's outcome, and the id of the lock value it concerns.
    let (outcome, lock_id) = match in_key_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            if options.reentrant {
                let holds = stored.lock().hold_count(&token, now);
                if holds > 0 {
                    policy::admit_reentrant(ctx, key_name, Judging::All, holds)?;
                }
            }
            // Queued waiters are not overtaken: only a holder may re-acquire (or downgrade).
            // What could never be granted is refused all the same.
            let outcome = if !waiters::queued(ctx, key_name) || stored.lock().holds(&token, now) {
                grant_stored(ctx, key_name, stored, &request, now)
            } else {
                stored.lock().admit(&request, now).map(|_| Acquire::Busy)
            };
            (outcome, stored.id())
        }
        // The key was deleted a moment ago and acquirers queue for it: a fresh lock for them,
        // served head first; this request does not overtake them.
        None if waiters::queued(ctx, key_name) => {
            create_for_waiters(ctx, &key, key_name);
            (Ok(Acquire::Busy), 0)
        }
        None => {
            let mut lock = Lock::default();
            let outcome = lock.grant(&request, floor::get(), now);
            let mut lock_id = 0;
            if outcome.is_ok() {
                count_grant(request.mode);
                key.set_value(&LOCK_TYPE, Stored::granted(lock))
                    .map_err(|_| LockError::internal("a new lock could not be stored"))?;
                let stored = in_key_mut(&key)?
                    .ok_or(LockError::internal("a new lock vanished from its key"))?;
                effects::propagate(ctx, key_name, Event::Acquire, stored);
                lock_id = stored.id();
            }
            (outcome, lock_id)
        }
    };
    match outcome.map_err(LockError::from)? {
        grant @ (Acquire::Granted { fence }
        | Acquire::Refreshed { fence }
        | Acquire::Downgraded { fence }) => {
            if options.session {
                let key_ref = waiters::key_ref(ctx, key_name);
                sessions::claim(key_ref, client_id(ctx), token, lock_id);
            }
            if matches!(grant, Acquire::Granted { .. }) {
                // Granted without waiting.
                metrics::ACQUIRE_WAIT.record(0);
            }
            metrics::ACQUIRED.incr();
            policy::tally(key_name.as_slice(), Stat::Acquired, 1);
            match options.sync.filter(SyncRequest::waits) {
                Some(sync) => {
                    let confirms = match grant {
                        Acquire::Granted { .. } => Confirms::Grant { token, fence },
                        _ => Confirms::Change,
                    };
                    handoff::block_for_acks(ctx, key_name, confirms, fence_reply(fence), sync)
                }
                None => Ok(RedisValue::Integer(fence_reply(fence))),
            }
        }
        Acquire::Busy => {
            // Found taken: counted here, once, whatever follows (nil, a full queue, a wait that
            // ends in a grant or a timeout), as LOCK.MACQUIRE counts.
            metrics::ACQUIRE_CONTENDED.incr();
            policy::tally(key_name.as_slice(), Stat::Contended, 1);
            match options.wait {
                Some(timeout) if may_block(ctx) => {
                    let (db, name) = waiters::key_ref(ctx, key_name);
                    let max = config::MAX_WAITERS.get();
                    let queued = waiters::queues().acquirers_on(db, &name);
                    if i64::try_from(queued).map_or(true, |n| n >= max) {
                        return Err(LockError::TooManyWaiters { max });
                    }
                    policy::admit_queued(ctx, key_name, Judging::All, queued)?;
                    let request = Request {
                        token,
                        ttl,
                        reentrant: options.reentrant,
                        session: options.session,
                        delay: request.delay,
                        mode: request.mode,
                        client,
                        sync: options.sync,
                        label: label.into(),
                        connection: connection[..].into(),
                    };
                    handoff::block(ctx, key_name, timeout, Kind::Acquire(request))
                }
                _ => Ok(RedisValue::Null),
            }
        }
    }
}

/// `LOCK.RELEASE key token`
fn release(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, token] = args else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, 2);
    let token = args::token(ctx, token)?;
    let key = ctx.open_key_writable(key_name);
    let released = release_key(ctx, &key, key_name, &token, now_ms())?;
    Ok(RedisValue::Integer(i64::from(released)))
}

/// `LOCK.RENEW key token ttl-ms [SYNC numreplicas timeout-ms]`
fn renew(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, token, ttl, options @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, 2);
    let token = args::token(ctx, token)?;
    let ttl = args::ttl(ctx, ttl)?;
    let sync = args::renew_options(options, 4)?;
    check_sync(ctx, sync)?;
    policy::admit(ctx, key_name, Judging::All, || Asked {
        ttl,
        renewal: true,
        ..Asked::default()
    })?;
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let renewed = match in_key_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            change_hold(ctx, key_name, stored, now, &token, |lock| {
                lock.renew(&token, ttl, now).then_some(Event::Renew)
            })
            .is_some()
        }
        None => false,
    };
    if !renewed {
        metrics::RENEW_FAILED.incr();
        return Ok(RedisValue::Integer(0));
    }
    metrics::RENEWED.incr();
    match sync.filter(SyncRequest::waits) {
        Some(sync) => handoff::block_for_acks(ctx, key_name, Confirms::Change, 1, sync),
        None => Ok(RedisValue::Integer(1)),
    }
}

/// `LOCK.FORCERELEASE key`
fn force_release(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name] = args else {
        return Err(LockError::WrongArity);
    };
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let (changed, freed) = match in_key_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            let ending: Vec<(u64, Grant)> = stored
                .lock()
                .live_holders(now)
                .map(|(fence, holder)| (fence, (*holder.grant).clone()))
                .collect();
            let mut held = false;
            let mut delay_ended = false;
            // The operator's escape hatch also ends a running lock-delay.
            let changed = change_and_reclaim(ctx, &key, key_name, stored, now, None, |lock| {
                held = lock.force_release(now);
                delay_ended = lock.clear_delay(now);
                (held || delay_ended).then_some(Event::ForceRelease)
            });
            audit::force_released(ctx, key_name.as_slice(), &ending, delay_ended, now);
            (changed.is_some(), held)
        }
        None => {
            audit::force_released(ctx, key_name.as_slice(), &[], false, now);
            (false, false)
        }
    };
    if changed {
        // Counted as replicas count the replicated change: a hold freed or a lock-delay ended.
        metrics::FORCED.incr();
        policy::tally(key_name.as_slice(), Stat::Forced, 1);
    }
    Ok(RedisValue::Integer(i64::from(freed)))
}

/// `LOCK.FENCE key fence`
fn fence(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, fence] = args else {
        return Err(LockError::WrongArity);
    };
    let fence = args::fence(fence)?;
    let key = ctx.open_key(key_name);
    let current = in_key(&key)?.is_some_and(|s| s.lock().fence_is_current(fence, now_ms()));
    metrics::FENCE_CHECKS.incr();
    if !current {
        metrics::FENCE_REJECTS.incr();
    }
    Ok(RedisValue::Integer(i64::from(current)))
}

/// `LOCK.INFO key`: a map (RESP3) or flat field/value array (RESP2); never the token.
fn info(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name] = args else {
        return Err(LockError::WrongArity);
    };
    let key = ctx.open_key(key_name);
    let Some(stored) = in_key(&key)? else {
        return Ok(RedisValue::Null);
    };
    let now = now_ms();
    let lock = stored.lock();
    let live = lock.live_holder(now);
    let count = |n: usize| RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    let ttl = lock
        .ttl(now)
        .map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX));
    let waiters = waiters::waiting_on(ctx, key_name);
    let (exclusive_waiters, shared_waiters) = waiters::acquirers_by_mode(ctx, key_name);
    let state = if lock.is_held(now) { "held" } else { "free" };
    let mode = if lock.limit() > 0 {
        "semaphore"
    } else if live.is_some() {
        "exclusive"
    } else if lock.live_members(now).next().is_some() {
        "shared"
    } else {
        "none"
    };
    let holders = || lock.live_holders(now).map(|(_, h)| h);
    reply_map(
        ctx,
        vec![
            ("state", RedisValue::SimpleStringStatic(state)),
            ("fence", RedisValue::Integer(fence_reply(lock.fence))),
            ("ttl", RedisValue::Integer(ttl)),
            (
                "holds",
                RedisValue::Integer(holders().map(|h| i64::from(h.holds)).sum()),
            ),
            ("waiters", count(waiters)),
            ("session", count(holders().filter(|h| h.session).count())),
            (
                "lock_delay",
                RedisValue::Integer(
                    live.map_or(0, |h| i64::try_from(h.grant.delay).unwrap_or(i64::MAX)),
                ),
            ),
            (
                "delay_ttl",
                RedisValue::Integer(
                    lock.delay_ttl(now)
                        .map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX)),
                ),
            ),
            ("mode", RedisValue::SimpleStringStatic(mode)),
            ("holders", count(holders().count())),
            ("limit", RedisValue::Integer(i64::from(lock.limit()))),
            ("waiters_exclusive", count(exclusive_waiters)),
            ("waiters_shared", count(shared_waiters)),
        ],
    )
}

/// `LOCK.WAIT key timeout-ms`: waits, without taking the lock, until the current grant ends.
fn wait(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, timeout] = args else {
        return Err(LockError::WrongArity);
    };
    let timeout = args::timeout(timeout)?;
    let now = now_ms();
    let key = ctx.open_key(key_name);
    // The wait is for every current holder to go (those with a fence up to the key's latest),
    // and for a running lock-delay to end: until then nobody can take the lock.
    let (busy, delay_ttl) = match in_key(&key)? {
        Some(stored) => {
            let lock = stored.lock();
            let delay_ttl = lock.delay_ttl(now);
            (
                (lock.is_held(now) || delay_ttl.is_some()).then_some(lock.fence),
                delay_ttl,
            )
        }
        None => (None, None),
    };
    match busy {
        None => Ok(RedisValue::Integer(1)),
        Some(fence) if may_block(ctx) => {
            let blocked = handoff::block(ctx, key_name, timeout, Kind::Watch { fence });
            if let Some(left) = delay_ttl {
                let key = waiters::key_ref(ctx, key_name);
                waiters::watch_delay_end(ctx, key, now.saturating_add(left));
            }
            blocked
        }
        Some(_) => Ok(RedisValue::Integer(0)),
    }
}

/// `LOCK.APPLY key event:fence:floor[:deadline:holds:flags] [token]`: the replicated effect of a
/// change on the primary (the whole resulting state; or one shared or permit holder's change;
/// or an exclusive holder's renewal, `renew:fence:floor:n:deadline`: see `lock::codec`).
/// Refused from ordinary clients.
fn apply(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, rest @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    if !is_replayed(ctx) {
        return Err(LockError::InternalCommand("LOCK.APPLY"));
    }
    // Not redacted: the command is flagged no-monitor and no-slowlog, so its arguments show
    // nowhere, and redacting from the AOF loader's client, which Redis 7.0 runs without
    // resetting its saved arguments between commands, reads past their end.
    let raw_args: Vec<&[u8]> = rest.iter().map(RedisString::as_slice).collect();
    if let Some(effect) = codec::parse_member_effect(&raw_args) {
        return apply_member(ctx, key_name, effect?);
    }
    if let Some(renewal) = codec::parse_renewal(&raw_args) {
        let Renewal {
            fence,
            floor,
            deadline,
        } = renewal?;
        effects::note_floor(floor, fence);
        let key = ctx.open_key_writable(key_name);
        return applied(
            ctx,
            &key,
            key_name,
            Event::Renew,
            1,
            Known::ByEvent,
            |lock| {
                lock.apply_renewal(fence, deadline)
                    .map_err(LockError::BadEffect)
            },
        );
    }
    if let Some(reclaimed) = codec::parse_reclaimed(&raw_args) {
        let Reclaimed {
            event,
            fence,
            floor,
        } = reclaimed?;
        effects::note_floor(floor, fence);
        let key = ctx.open_key_writable(key_name);
        // As the primary did: the change that freed the lock (announced and counted), then the
        // deletion, passed on once.
        applied_here(ctx, &key, key_name, event, 1, Known::WholeState, |lock| {
            *lock = Lock {
                fence,
                ..Lock::default()
            };
            Ok(())
        })?;
        return apply_reclaim(ctx, &key, key_name);
    }
    let effect = codec::parse_effect(&raw_args)?;
    effects::note_floor(effect.floor, effect.lock.fence);
    let key = ctx.open_key_writable(key_name);
    if effect.event == Event::Reclaim {
        return apply_reclaim(ctx, &key, key_name);
    }
    let lock = effect.lock;
    applied(
        ctx,
        &key,
        key_name,
        effect.event,
        1,
        Known::WholeState,
        |current| {
            *current = lock;
            Ok(())
        },
    )
}

/// One shared or permit holder's change (see `codec::member_effect_args`).
fn apply_member(ctx: &Context, key_name: &RedisString, effect: MemberEffect) -> CommandResult {
    effects::note_floor(effect.floor, effect.fence);
    let key = ctx.open_key_writable(key_name);
    let MemberEffect {
        event,
        fence,
        limit,
        now,
        change,
        ..
    } = effect;
    // Holders removed together count as the primary counted them: one each.
    let times = match &change {
        MemberChange::Remove(tokens) => tokens.len(),
        MemberChange::Set(_) => 1,
    };
    applied(ctx, &key, key_name, event, times, Known::ByEvent, |lock| {
        lock.apply_member(fence, limit, now, change)
            .map_err(LockError::BadEffect)
    })
}

/// Applies a replicated `change` to the lock in `key` (a fresh one when missing), counts it as
/// the primary did (`times` holders changed so), announces it (as `known`) and passes it on. A
/// change refused leaves the key as it was.
fn applied(
    ctx: &Context,
    key: &RedisKeyWritable,
    key_name: &RedisString,
    event: Event,
    times: usize,
    known: Known,
    change: impl FnOnce(&mut Lock) -> Result<(), LockError>,
) -> CommandResult {
    applied_here(ctx, key, key_name, event, times, known, change)?;
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// [`applied`] without passing the effect on.
fn applied_here(
    ctx: &Context,
    key: &RedisKeyWritable,
    key_name: &RedisString,
    event: Event,
    times: usize,
    known: Known,
    change: impl FnOnce(&mut Lock) -> Result<(), LockError>,
) -> Result<(), LockError> {
    let (old_fence, created) = match in_key_mut(key)? {
        Some(stored) => {
            let old_fence = stored.lock().fence;
            stored.update(change)?;
            (old_fence, false)
        }
        None => {
            let mut lock = Lock::default();
            change(&mut lock)?;
            key.set_value(&LOCK_TYPE, Stored::new(lock))
                .map_err(|_| LockError::internal("an applied lock could not be stored"))?;
            (0, true)
        }
    };
    let stored =
        in_key_mut(key)?.ok_or(LockError::internal("an applied lock vanished from its key"))?;
    if created {
        // A new value has no age yet, whatever the event (announce skips renewals).
        holds::follow(stored, key_name.as_slice());
    }
    if !is_loading(ctx) {
        for _ in 0..times {
            count_applied(key_name.as_slice(), event);
        }
        let lock = stored.lock();
        // A new shared hold or permit: the newest member has the key's new fence.
        let new_member =
            lock.fence > old_fence && lock.members().last().is_some_and(|m| m.fence == lock.fence);
        if event == Event::Acquire && new_member {
            let limit = lock.limit();
            count_grant(if limit > 0 {
                Mode::Permit(limit)
            } else {
                Mode::Shared
            });
        }
        if matches!(event, Event::Expired | Event::SessionEnd)
            && stored.lock().delay_ttl(now_ms()).is_some()
        {
            metrics::DELAYED.incr();
        }
    }
    effects::announce_times(ctx, key_name, event, stored, times, known);
    waiters::wake_watchers(ctx, key_name, stored.lock(), now_ms());
    Ok(())
}

/// The primary deleted a free lock: so does the replica (or the AOF replay).
fn apply_reclaim(ctx: &Context, key: &RedisKeyWritable, key_name: &RedisString) -> CommandResult {
    if in_key_mut(key)?.is_some() {
        key.delete()
            .map_err(|_| LockError::internal("a reclaimed lock could not be deleted"))?;
        effects::announce_deleted(ctx, key_name);
        if !is_loading(ctx) {
            metrics::RECLAIMED.incr();
        }
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `LOCK.FLOOR n`: raises the fence floor (from the AOF or the primary). Refused from clients.
fn floor_cmd(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, value] = args else {
        return Err(LockError::WrongArity);
    };
    if !is_replayed(ctx) {
        return Err(LockError::InternalCommand("LOCK.FLOOR"));
    }
    let value = parse_integer(value)
        .and_then(|f| u64::try_from(f).ok())
        .ok_or(LockError::BadEffect("floor"))?;
    floor::raise(value, now_ms());
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Replicas count what their primary did, so INFO reads alike on both (per namespace too, by
/// the replica's own policy).
fn count_applied(key: &[u8], event: Event) {
    let stat = match event {
        // The primary counts a downgrade as the acquire it is.
        Event::Acquire | Event::Downgrade => {
            metrics::ACQUIRED.incr();
            Stat::Acquired
        }
        Event::Expired => {
            metrics::EXPIRED.incr();
            Stat::Expired
        }
        Event::ForceRelease => {
            metrics::FORCED.incr();
            Stat::Forced
        }
        Event::Release | Event::DropHold => return metrics::RELEASED.incr(),
        Event::SessionEnd => return metrics::SESSION_RELEASED.incr(),
        Event::Renew => return metrics::RENEWED.incr(),
        Event::Sync | Event::Reclaim => return,
    };
    policy::tally(key, stat, 1);
}
