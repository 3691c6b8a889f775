//! The LOCK.* commands: argument parsing, a call into the lock core, the reply, and the
//! announcement and replication of whatever changed.

use redis_module::key::{RedisKey, RedisKeyWritable};
use redis_module::{raw, Context, ContextFlags, KeyType, RedisString, RedisValue};

use crate::config;
use crate::core::{Acquire, Lock};
use crate::datatype::{fence_floor, Stored, LOCK_TYPE};
use crate::error::LockError;
use crate::replication::{self, Event};
use crate::waiting::{self, KeyRef, Kind, Request, Tag, Waiter};
use crate::{ffi, metrics, sessions};

pub type CommandResult = Result<RedisValue, LockError>;

/// Wall-clock time in ms since the Unix epoch, as Redis sees it.
pub fn now_ms() -> u64 {
    // SAFETY: RedisModule_Milliseconds takes no arguments and only reads the clock.
    let ms = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    u64::try_from(ms).unwrap_or(0)
}

/// True when the command comes from the primary or the AOF: limits meant for clients do not
/// apply to it.
fn replayed(ctx: &Context) -> bool {
    ctx.get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
}

/// Hides the argument at `pos` (a token) from SLOWLOG, MONITOR and the command log.
fn redact(ctx: &Context, pos: i32) {
    // SAFETY: valid context; Redis checks `pos` against the argument count.
    unsafe {
        if let Some(redact) = raw::RedisModule_RedactClientCommandArgument {
            redact(ctx.ctx, pos);
        }
    }
}

/// Parses a strictly formatted integer (Redis' own rules: no sign but `-`, no spaces).
fn integer(arg: &RedisString) -> Option<i64> {
    let mut value: i64 = 0;
    // SAFETY: valid string and out-pointer.
    let status = unsafe { raw::RedisModule_StringToLongLong.map(|f| f(arg.inner, &mut value)) }?;
    (status == raw::REDISMODULE_OK as i32).then_some(value)
}

/// A duration in ms: a positive integer.
fn duration(arg: &RedisString, name: &'static str) -> Result<u64, LockError> {
    let value = integer(arg).ok_or(LockError::BadInteger {
        name,
        detail: "not an integer",
    })?;
    u64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or(LockError::BadInteger {
            name,
            detail: "must be positive",
        })
}

/// The longest wait a client may ask for (about 1,100 years): beyond it Redis' deadline
/// arithmetic would overflow. 0 means no limit.
const MAX_TIMEOUT_MS: i64 = 1 << 45;

/// A wait timeout in ms: 0 (no limit) or a positive integer.
fn timeout_arg(arg: &RedisString) -> Result<u64, LockError> {
    let bad = |detail| LockError::BadInteger {
        name: "timeout-ms",
        detail,
    };
    let value = integer(arg).ok_or(bad("not an integer"))?;
    if value > MAX_TIMEOUT_MS {
        return Err(bad("too large"));
    }
    u64::try_from(value).map_err(|_| bad("must not be negative"))
}

/// A lease length: a positive integer within `lock.max-ttl` (a limit for clients only).
fn ttl_arg(ctx: &Context, arg: &RedisString) -> Result<u64, LockError> {
    let ttl = duration(arg, "ttl-ms")?;
    let max = config::MAX_TTL.get();
    if i64::try_from(ttl).map_or(true, |t| t > max) && !replayed(ctx) {
        return Err(LockError::TooLarge {
            name: "ttl-ms",
            config: "lock.max-ttl",
            max,
        });
    }
    Ok(ttl)
}

fn token_arg<'a>(ctx: &Context, arg: &'a RedisString) -> Result<&'a [u8], LockError> {
    let token = arg.as_slice();
    if token.is_empty() {
        return Err(LockError::EmptyToken);
    }
    let max = config::MAX_TOKEN_LEN.get();
    if i64::try_from(token.len()).map_or(true, |len| len > max) && !replayed(ctx) {
        return Err(LockError::TokenTooLong { max });
    }
    Ok(token)
}

/// The lock stored in an open key: `None` when the key is empty, WRONGTYPE for other types.
fn stored_mut(key: &RedisKeyWritable) -> Result<Option<&mut Stored>, LockError> {
    match key.key_type() {
        KeyType::Empty => Ok(None),
        KeyType::Module => key
            .get_value::<Stored>(&LOCK_TYPE)
            .map_err(|_| LockError::WrongType),
        _ => Err(LockError::WrongType),
    }
}

fn stored(key: &RedisKey) -> Result<Option<&Stored>, LockError> {
    match key.key_type() {
        KeyType::Empty => Ok(None),
        KeyType::Module => key
            .get_value::<Stored>(&LOCK_TYPE)
            .map_err(|_| LockError::WrongType),
        _ => Err(LockError::WrongType),
    }
}

fn deadline(lock: &Lock) -> Option<u64> {
    lock.holder.as_ref().map(|h| h.deadline)
}

/// The key as the waiting and session tables name it.
/// True when acquirers are queued on `key` (cheap when nobody waits anywhere).
fn queued(ctx: &Context, key: &RedisString) -> bool {
    waiting::anyone_waiting() && waiting::has_acquirers(&key_ref(ctx, key))
}

pub fn key_ref(ctx: &Context, key: &RedisString) -> KeyRef {
    (replication::selected_db(ctx), key.as_slice().into())
}

/// True when this command may block its client (not in MULTI, Lua, AOF loading or replication).
fn may_block(ctx: &Context) -> bool {
    !ctx.get_flags().intersects(
        ContextFlags::DENY_BLOCKING
            | ContextFlags::MULTI
            | ContextFlags::LUA
            | ContextFlags::LOADING
            | ContextFlags::REPLICATED,
    )
}

/// Applies `change` to the stored lock and, when it reports an event, announces and replicates
/// it. When the change freed the lock, the session is forgotten and the lock handed over to the
/// next waiter.
fn change(
    ctx: &Context,
    key: &RedisString,
    stored: &mut Stored,
    now: u64,
    change: impl FnOnce(&mut Lock) -> Option<Event>,
) -> Option<Event> {
    let before = deadline(stored.lock());
    let event = stored.update(change)?;
    replication::propagate(ctx, key, event, stored, before);
    if event.frees() {
        if sessions::any() {
            sessions::forget(&key_ref(ctx, key));
        }
        hand_over(ctx, key, stored, now);
    }
    Some(event)
}

/// After a change that freed the lock: lets Redis serve the queue (the head acquirer is granted
/// the lock from its reply callback, right after the current command or callback) and wakes
/// the `LOCK.WAIT` watchers whose wait is over.
fn hand_over(ctx: &Context, key_name: &RedisString, stored: &Stored, now: u64) {
    if !stored.lock().is_held(now) && queued(ctx, key_name) {
        waiting::signal_ready(ctx, key_name);
    }
    wake_watchers(ctx, key_name, stored.lock(), now);
}

/// The reply callback of a waiter whose key was signalled as ready: the head acquirer of a free
/// lock gets it (and its fence as reply); a watcher whose wait is over gets 1. `None` keeps the
/// client waiting.
pub fn serve_waiter(ctx: &Context, tag: &Tag) -> Option<CommandResult> {
    let now = now_ms();
    let key_name = replication::key_string(ctx, &tag.key.1);
    let key = ctx.open_key_writable(&key_name);
    let stored = match stored_mut(&key) {
        Ok(Some(stored)) => stored,
        // Another type took the name: keep waiting for it to become a lock again.
        _ => return None,
    };
    if tag.watch {
        let lock = stored.lock();
        let waited_on = waiting::watched_fence(tag)?;
        let over = lock
            .live_holder(now)
            .is_none_or(|_| lock.fence != waited_on);
        return (over && waiting::remove(tag).is_some()).then_some(Ok(RedisValue::Integer(1)));
    }
    expire_overdue(ctx, &key_name, stored, now);
    if stored.lock().is_held(now) || !waiting::is_head(&tag.key, tag.id) {
        return None;
    }
    let head = waiting::remove(tag)?;
    let Kind::Acquire(request) = &head.kind else {
        return None;
    };
    let mut outcome = Ok(Acquire::Busy);
    change(ctx, &key_name, stored, now, |lock| {
        outcome = lock.acquire(
            &request.token,
            request.ttl,
            request.reentrant,
            request.session,
            fence_floor(),
            now,
        );
        matches!(outcome, Ok(Acquire::Granted { .. })).then_some(Event::Acquire)
    });
    Some(match outcome {
        Ok(Acquire::Granted { fence } | Acquire::Refreshed { fence }) => {
            if request.session {
                sessions::claim(tag.key.clone(), request.client, &request.token);
            }
            let waited = u64::try_from(head.since.elapsed().as_micros()).unwrap_or(u64::MAX);
            metrics::ACQUIRE_WAIT.record(waited);
            metrics::ACQUIRED.incr();
            Ok(RedisValue::Integer(fence_reply(fence)))
        }
        Ok(Acquire::Busy) => Ok(RedisValue::Null),
        Err(_) => Err(LockError::FenceExhausted),
    })
}

/// Removes a holder whose lease already ran out, as the expiry timer would have.
fn expire_overdue(ctx: &Context, key: &RedisString, stored: &mut Stored, now: u64) {
    if stored.lock().is_overdue(now) {
        metrics::EXPIRED.incr();
        change(ctx, key, stored, now, |lock| {
            lock.expire(now).then_some(Event::Expired)
        });
    }
}

#[derive(Default)]
struct AcquireOptions {
    wait: Option<u64>,
    reentrant: bool,
    session: bool,
}

fn acquire_options(args: &[RedisString]) -> Result<AcquireOptions, LockError> {
    let mut options = AcquireOptions::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let word = arg.as_slice();
        if word.eq_ignore_ascii_case(b"WAIT") {
            if options.wait.is_some() {
                return Err(LockError::RepeatedOption("WAIT"));
            }
            let timeout = rest.next().ok_or(LockError::BadInteger {
                name: "timeout-ms",
                detail: "missing after WAIT",
            })?;
            let value = timeout_arg(timeout)?;
            options.wait = Some(value);
        } else if word.eq_ignore_ascii_case(b"REENTRANT") {
            if options.reentrant {
                return Err(LockError::RepeatedOption("REENTRANT"));
            }
            options.reentrant = true;
        } else if word.eq_ignore_ascii_case(b"SESSION") {
            if options.session {
                return Err(LockError::RepeatedOption("SESSION"));
            }
            options.session = true;
        } else {
            return Err(LockError::unknown_option(word));
        }
    }
    Ok(options)
}

/// `LOCK.ACQUIRE key token ttl-ms [WAIT timeout-ms] [REENTRANT] [SESSION]`
pub fn acquire(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, token, ttl, options @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, 2);
    let token = token_arg(ctx, token)?;
    let ttl = ttl_arg(ctx, ttl)?;
    let options = acquire_options(options)?;
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let grant = |lock: &mut Lock| {
        lock.acquire(
            token,
            ttl,
            options.reentrant,
            options.session,
            fence_floor(),
            now,
        )
    };
    let outcome = match stored_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            let holds_it = stored
                .lock()
                .live_holder(now)
                .is_some_and(|h| *h.token == *token);
            let mut outcome = Ok(Acquire::Busy);
            // Queued waiters are not overtaken: only their holder may re-acquire.
            if holds_it || !queued(ctx, key_name) {
                change(ctx, key_name, stored, now, |lock| {
                    outcome = grant(lock);
                    matches!(
                        outcome,
                        Ok(Acquire::Granted { .. } | Acquire::Refreshed { .. })
                    )
                    .then_some(Event::Acquire)
                });
            }
            outcome
        }
        None => {
            let mut lock = Lock::default();
            let outcome = grant(&mut lock);
            if outcome.is_ok() {
                key.set_value(&LOCK_TYPE, Stored::granted(lock))
                    .map_err(|_| LockError::Internal)?;
                let stored = stored_mut(&key)?.ok_or(LockError::Internal)?;
                replication::propagate(ctx, key_name, Event::Acquire, stored, None);
            }
            outcome
        }
    };
    match outcome.map_err(|_| LockError::FenceExhausted)? {
        grant @ (Acquire::Granted { fence } | Acquire::Refreshed { fence }) => {
            if options.session {
                sessions::claim(key_ref(ctx, key_name), client_id(ctx), token);
            }
            if matches!(grant, Acquire::Granted { .. }) {
                // Granted without waiting.
                metrics::ACQUIRE_WAIT.record(0);
            }
            metrics::ACQUIRED.incr();
            Ok(RedisValue::Integer(fence_reply(fence)))
        }
        Acquire::Busy => match options.wait {
            Some(timeout) if may_block(ctx) => {
                let place = key_ref(ctx, key_name);
                let max = config::MAX_WAITERS.get();
                if i64::try_from(waiting::acquirers_on(&place)).map_or(true, |n| n >= max) {
                    metrics::ACQUIRE_CONTENDED.incr();
                    return Err(LockError::TooManyWaiters { max });
                }
                let request = Request {
                    token: token.into(),
                    ttl,
                    reentrant: options.reentrant,
                    session: options.session,
                    client: client_id(ctx),
                };
                block(ctx, key_name, place, timeout, Kind::Acquire(request))
            }
            _ => {
                metrics::ACQUIRE_CONTENDED.incr();
                Ok(RedisValue::Null)
            }
        },
    }
}

fn client_id(ctx: &Context) -> u64 {
    // SAFETY: valid context.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}

/// Blocks the calling client on `key` until the module wakes it or `timeout` ms pass (0: no
/// limit).
fn block(
    ctx: &Context,
    key_name: &RedisString,
    place: KeyRef,
    timeout: u64,
    kind: Kind,
) -> CommandResult {
    let id = waiting::next_id();
    let tag = Tag {
        id,
        key: place.clone(),
        watch: matches!(kind, Kind::Watch { .. }),
    };
    let handle = ffi::block_on_key(ctx, key_name, timeout, tag).ok_or(LockError::Internal)?;
    waiting::enqueue(
        place,
        Waiter {
            id,
            handle,
            since: std::time::Instant::now(),
            kind,
        },
    );
    Ok(RedisValue::NoReply)
}

fn fence_reply(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

/// `LOCK.RELEASE key token`
pub fn release(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, token] = args else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, 2);
    let token = token_arg(ctx, token)?;
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let released = match stored_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            let mut released = None;
            change(ctx, key_name, stored, now, |lock| {
                released = lock.release(token, now);
                released.map(|free| {
                    if free {
                        Event::Release
                    } else {
                        Event::DropHold
                    }
                })
            });
            released
        }
        None => None,
    };
    if released.is_some() {
        metrics::RELEASED.incr();
        Ok(RedisValue::Integer(1))
    } else {
        metrics::RELEASE_MISMATCH.incr();
        Ok(RedisValue::Integer(0))
    }
}

/// `LOCK.RENEW key token ttl-ms`
pub fn renew(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, token, ttl] = args else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, 2);
    let token = token_arg(ctx, token)?;
    let ttl = ttl_arg(ctx, ttl)?;
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let renewed = match stored_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            change(ctx, key_name, stored, now, |lock| {
                lock.renew(token, ttl, now).then_some(Event::Renew)
            })
            .is_some()
        }
        None => false,
    };
    if renewed {
        metrics::RENEWED.incr();
    } else {
        metrics::RENEW_FAILED.incr();
    }
    Ok(RedisValue::Integer(i64::from(renewed)))
}

/// `LOCK.FORCERELEASE key`
pub fn force_release(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name] = args else {
        return Err(LockError::WrongArity);
    };
    let now = now_ms();
    let key = ctx.open_key_writable(key_name);
    let freed = match stored_mut(&key)? {
        Some(stored) => {
            expire_overdue(ctx, key_name, stored, now);
            change(ctx, key_name, stored, now, |lock| {
                lock.force_release(now).then_some(Event::ForceRelease)
            })
            .is_some()
        }
        None => false,
    };
    if freed {
        metrics::FORCED.incr();
    }
    Ok(RedisValue::Integer(i64::from(freed)))
}

/// `LOCK.FENCE key fence`
pub fn fence(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, fence] = args else {
        return Err(LockError::WrongArity);
    };
    let fence = integer(fence)
        .and_then(|f| u64::try_from(f).ok())
        .filter(|f| *f > 0)
        .ok_or(LockError::BadInteger {
            name: "fence",
            detail: "must be a positive integer",
        })?;
    let key = ctx.open_key(key_name);
    let current = stored(&key)?.is_some_and(|s| s.lock().fence_is_current(fence, now_ms()));
    metrics::FENCE_CHECKS.incr();
    if !current {
        metrics::FENCE_REJECTS.incr();
    }
    Ok(RedisValue::Integer(i64::from(current)))
}

/// `LOCK.INFO key`: a map (RESP3) or flat field/value array (RESP2); never the token.
pub fn info(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name] = args else {
        return Err(LockError::WrongArity);
    };
    let key = ctx.open_key(key_name);
    let Some(stored) = stored(&key)? else {
        return Ok(RedisValue::Null);
    };
    let now = now_ms();
    let lock = stored.lock();
    let live = lock.live_holder(now);
    let ttl = lock
        .ttl(now)
        .map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX));
    let waiters = i64::try_from(waiting::waiting_on(&key_ref(ctx, key_name))).unwrap_or(i64::MAX);
    let fields: [(&str, RedisValue); 6] = [
        (
            "state",
            RedisValue::SimpleStringStatic(if live.is_some() { "held" } else { "free" }),
        ),
        ("fence", RedisValue::Integer(fence_reply(lock.fence))),
        ("ttl", RedisValue::Integer(ttl)),
        (
            "holds",
            RedisValue::Integer(live.map_or(0, |h| i64::from(h.holds))),
        ),
        ("waiters", RedisValue::Integer(waiters)),
        (
            "session",
            RedisValue::Integer(live.map_or(0, |h| i64::from(h.session))),
        ),
    ];
    // The map header is followed by exactly 2 * len replies.
    raw::reply_with_map(ctx.ctx, fields.len() as std::os::raw::c_long);
    for (name, value) in fields {
        ctx.reply(Ok(RedisValue::SimpleStringStatic(name)));
        ctx.reply(Ok(value));
    }
    Ok(RedisValue::NoReply)
}

/// `LOCK.APPLY key event fence floor [token deadline-ms holds flags]`: the replicated effect of
/// a change on the primary. Refused from ordinary clients.
pub fn apply(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, rest @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    if !replayed(ctx) {
        return Err(LockError::InternalCommand("LOCK.APPLY"));
    }
    redact(ctx, 3);
    let raw_args: Vec<&[u8]> = rest.iter().map(RedisString::as_slice).collect();
    let effect = replication::parse_effect(&raw_args)?;
    replication::note_floor(&effect);
    let key = ctx.open_key_writable(key_name);
    let before = match stored_mut(&key)? {
        Some(stored) => {
            let before = deadline(stored.lock());
            stored.update(|current| *current = effect.lock);
            before
        }
        None => {
            key.set_value(&LOCK_TYPE, Stored::new(effect.lock))
                .map_err(|_| LockError::Internal)?;
            None
        }
    };
    let stored = stored_mut(&key)?.ok_or(LockError::Internal)?;
    if !ctx.get_flags().contains(ContextFlags::LOADING) {
        count_applied(effect.event);
    }
    replication::announce(ctx, key_name, effect.event, stored, before);
    wake_watchers(ctx, key_name, stored.lock(), now_ms());
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `LOCK.FLOOR n`: raises the fence floor (from the AOF or the primary). Refused from clients.
pub fn floor(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, floor] = args else {
        return Err(LockError::WrongArity);
    };
    if !replayed(ctx) {
        return Err(LockError::InternalCommand("LOCK.FLOOR"));
    }
    let floor = integer(floor)
        .and_then(|f| u64::try_from(f).ok())
        .ok_or(LockError::BadEffect("floor"))?;
    crate::datatype::raise_fence_floor(floor);
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Replicas count what their primary did, so INFO reads alike on both.
fn count_applied(event: Event) {
    match event {
        Event::Acquire => metrics::ACQUIRED.incr(),
        Event::Release | Event::DropHold => metrics::RELEASED.incr(),
        Event::SessionEnd => metrics::SESSION_RELEASED.incr(),
        Event::Renew => metrics::RENEWED.incr(),
        Event::Expired => metrics::EXPIRED.incr(),
        Event::ForceRelease => metrics::FORCED.incr(),
        Event::Sync => {}
    }
}

/// Expires the lock under `key` (in the selected db) if its lease has run out: the expiry timer's
/// work on one key.
pub fn expire_key(ctx: &Context, key_name: &RedisString, id: u64, now: u64) {
    let key = ctx.open_key_writable(key_name);
    if let Ok(Some(stored)) = stored_mut(&key) {
        // Another lock under this name has an index entry of its own.
        if crate::expiry::short_id(stored.id()) == id {
            expire_overdue(ctx, key_name, stored, now);
        }
    }
}

/// The id and lease deadline of the lock under `key`, if it has a holder.
pub fn lease_of(ctx: &Context, key_name: &RedisString) -> Option<(u64, u64)> {
    let key = ctx.open_key(key_name);
    let stored = stored(&key).ok().flatten()?;
    deadline(stored.lock()).map(|d| (stored.id(), d))
}

/// `LOCK.WAIT key timeout-ms`: waits, without taking the lock, until the current grant ends.
pub fn wait(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, timeout] = args else {
        return Err(LockError::WrongArity);
    };
    let timeout = timeout_arg(timeout)?;
    let now = now_ms();
    let key = ctx.open_key(key_name);
    let held = stored(&key)?.and_then(|s| s.lock().live_holder(now).map(|_| s.lock().fence));
    match held {
        None => Ok(RedisValue::Integer(1)),
        Some(fence) if may_block(ctx) => block(
            ctx,
            key_name,
            key_ref(ctx, key_name),
            timeout,
            Kind::Watch { fence },
        ),
        Some(_) => Ok(RedisValue::Integer(0)),
    }
}

/// The timeout callback of a waiting client: a watcher the module woke (see
/// `waiting::wake_watcher`), or a wait that timed out or was cancelled by `CLIENT UNBLOCK`.
pub fn on_wait_ended(tag: &Tag) -> CommandResult {
    if waiting::take_woken(tag.id) {
        return Ok(RedisValue::Integer(1));
    }
    waiting::remove(tag);
    if tag.watch {
        Ok(RedisValue::Integer(0))
    } else {
        metrics::ACQUIRE_TIMEOUTS.incr();
        Ok(RedisValue::Null)
    }
}

/// Settles a key whose waiters may be able to proceed: it was deleted, flushed, swapped or
/// recreated. A missing key with queued acquirers gets a fresh lock for the head one.
pub fn settle_key(ctx: &Context, key_name: &RedisString, now: u64) {
    let place = key_ref(ctx, key_name);
    let key = ctx.open_key_writable(key_name);
    match stored_mut(&key) {
        Ok(Some(stored)) => {
            expire_overdue(ctx, key_name, stored, now);
            hand_over(ctx, key_name, stored, now);
        }
        Ok(None) if waiting::has_acquirers(&place) => {
            // A fresh lock for the queue: creating the key makes Redis serve its waiters.
            if key
                .set_value(&LOCK_TYPE, Stored::new(Lock::default()))
                .is_ok()
            {
                waiting::signal_ready(ctx, key_name);
            }
            wake_watchers(ctx, key_name, &Lock::default(), now);
        }
        Ok(None) => wake_watchers(ctx, key_name, &Lock::default(), now),
        // Another type took the name: waiters keep waiting for it to become a lock again.
        Err(_) => {}
    }
}

/// Releases, as if by their holder, the session locks of a connection that closed.
pub fn end_session(ctx: &Context, key_name: &RedisString, token: &[u8], now: u64) {
    let key = ctx.open_key_writable(key_name);
    if let Ok(Some(stored)) = stored_mut(&key) {
        expire_overdue(ctx, key_name, stored, now);
        let ended = change(ctx, key_name, stored, now, |lock| {
            lock.end_session(token, now).then_some(Event::SessionEnd)
        });
        if ended.is_some() {
            metrics::SESSION_RELEASED.incr();
        }
    }
}

/// Wakes `LOCK.WAIT` watchers after a replicated change (replicas have watchers too).
fn wake_watchers(ctx: &Context, key_name: &RedisString, lock: &Lock, now: u64) {
    if !waiting::anyone_waiting() {
        return;
    }
    let current = lock.live_holder(now).map(|_| lock.fence);
    for watcher in waiting::take_watchers(&key_ref(ctx, key_name), current) {
        waiting::wake_watcher(&watcher);
    }
}

/// Wakes the watchers of `key` whose wait is over, without changing anything (replicas).
pub fn wake_watchers_of(ctx: &Context, key_name: &RedisString, now: u64) {
    let key = ctx.open_key(key_name);
    match stored(&key) {
        Ok(Some(stored)) => wake_watchers(ctx, key_name, stored.lock(), now),
        Ok(None) => wake_watchers(ctx, key_name, &Lock::default(), now),
        Err(_) => {}
    }
}
