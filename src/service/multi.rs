//! Several locks at once with one token: `LOCK.MACQUIRE` grants every key or none, and
//! `LOCK.MRELEASE` releases them together. Each key stays an ordinary lock (its own fence, lease,
//! events and effects); one command's effects reach replicas and the AOF together (Redis wraps
//! them in MULTI/EXEC), so no replica ever sees part of a grant.

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString, RedisValue};

use crate::error::LockError;
use crate::host::command::CommandResult;
use crate::host::keys::redact;
use crate::host::server::{
    caller_id, client_id, connection_of, is_replayed, may_block, now_ms, parse_integer,
};
use crate::lock::core::{recorded_connection, Admit, Mode, Request};
use crate::lock::queues;
use crate::lock::sessions;
use crate::metrics;
use crate::service::args::{self, AcquireOptions};
use crate::service::change::{expire_overdue, grant_key, release_key};
use crate::service::handoff::{self, fence_reply};
use crate::service::policy::{self, Judging, Stat};
use crate::service::value::in_key_mut;
use crate::service::waiters;

/// The most keys one call may name.
pub const MAX_KEYS: usize = 1024;

/// Where the keys of a `numkeys key [key ...]` call are (the command name is 0), read-write,
/// for cluster routing, ACL key checks and COMMAND GETKEYS: only when the call has the shape of
/// `command` around its keys (`Shape`). Otherwise none: a miscounted numkeys would put the
/// token in a key's place, and the server would show it where it shows keys (ACL LOG's
/// `object`, a NOPERM error) before the module can refuse the call. A call that declares none
/// is refused by the module itself, changing nothing.
pub fn key_positions(args: &[RedisString], shape: Shape) -> Vec<(usize, u32)> {
    let Some(count) = keys_if_shaped(args, shape) else {
        return Vec::new();
    };
    let flags = redis_module::raw::REDISMODULE_CMD_KEY_RW
        | redis_module::raw::REDISMODULE_CMD_KEY_ACCESS
        | redis_module::raw::REDISMODULE_CMD_KEY_UPDATE;
    (2..2 + count).map(|position| (position, flags)).collect()
}

/// The options of LOCK.ACQUIRE that LOCK.MACQUIRE does not take.
fn refuse_unsupported(options: &AcquireOptions) -> Result<(), LockError> {
    for (given, name) in [
        (options.reentrant, "REENTRANT"),
        (options.sync.is_some_and(|s| s.fsync_ms.is_some()), "FSYNC"),
        (options.sync.is_some(), "SYNC"),
        (options.shared, "SHARED"),
        (options.limit.is_some(), "LIMIT"),
    ] {
        if given {
            return Err(LockError::NotForMulti(name));
        }
    }
    Ok(())
}

/// The number of keys when `args` (the command name first) has the shape of `shape` around them,
/// as the command itself reads them: numkeys keys, then for LOCK.MRELEASE the token alone, for
/// LOCK.MACQUIRE the token, an integer ttl-ms and options LOCK.MACQUIRE takes. Whatever the
/// server's limits say (those are the command's to check).
fn keys_if_shaped(args: &[RedisString], shape: Shape) -> Option<usize> {
    let after: &'static [&'static str] = match shape {
        Shape::Release => &["token"],
        Shape::Acquire => &["token", "ttl-ms"],
    };
    let (keys, rest) = counted_keys(args.get(1..).unwrap_or_default(), after).ok()?;
    let shaped = match (shape, rest) {
        (Shape::Release, [_token]) => true,
        (Shape::Acquire, [_token, ttl, options @ ..]) => {
            args::duration(ttl, "ttl-ms").is_ok()
                && AcquireOptions::parse(options, keys.len() + 4, true)
                    .and_then(|options| refuse_unsupported(&options))
                    .is_ok()
        }
        _ => false,
    };
    shaped.then_some(keys.len())
}

/// What follows the keys of a multi-key command.
#[derive(Clone, Copy)]
pub enum Shape {
    /// LOCK.MACQUIRE: the token, the ttl, options.
    Acquire,
    /// LOCK.MRELEASE: the token alone.
    Release,
}

/// `numkeys key [key ...]` at the start of `args` (after the command name): the keys, and the
/// arguments after them. `after` names the arguments that must follow the keys (`["token"]`).
fn counted_keys<'a>(
    args: &'a [RedisString],
    after: &'static [&'static str],
) -> Result<(&'a [RedisString], &'a [RedisString]), LockError> {
    let bad = |detail| LockError::BadInteger {
        name: "numkeys",
        detail,
    };
    let [numkeys, rest @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    let count = parse_integer(numkeys).ok_or(bad("not an integer"))?;
    let count = usize::try_from(count)
        .ok()
        .filter(|n| *n > 0)
        .ok_or(bad("must be positive"))?;
    if count > MAX_KEYS {
        return Err(bad("more than 1024 keys"));
    }
    if rest.len() < count + after.len() {
        return Err(LockError::ShortOfKeys {
            numkeys: count,
            given: rest.len(),
            after,
        });
    }
    let (keys, tail) = rest.split_at(count);
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    if !keys.iter().all(|key| seen.insert(key.as_slice())) {
        return Err(LockError::DuplicateKey);
    }
    Ok((keys, tail))
}

/// `LOCK.MACQUIRE numkeys key [key ...] token ttl-ms [WAIT ms] [SESSION] [LOCKDELAY ms]`: every key is
/// granted to `token` (or refreshed where the token already holds it) and the reply is their
/// fences in key order, or nil and nothing changes.
pub fn macquire(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let (keys, rest) = counted_keys(args.get(1..).unwrap_or_default(), &["token", "ttl-ms"])?;
    let [token, ttl, options @ ..] = rest else {
        return Err(LockError::WrongArity);
    };
    let token_position = keys.len() + 2;
    redact(ctx, i32::try_from(token_position).unwrap_or(i32::MAX));
    let token = args::token(ctx, token)?;
    let ttl = args::ttl(ctx, ttl)?;
    let options = AcquireOptions::parse(options, token_position + 2, is_replayed(ctx))?;
    refuse_unsupported(&options)?;
    waiters::check_may_queue(ctx, options.wait)?;
    args::check_session(ctx, options.session)?;
    // Every key's namespace in `enforce` mode first, then (none refused) those in `warn`: a
    // refused call counts no warning. One lock-delay for every key: the longest any key's
    // namespace (or the config) gives.
    let delay = if policy::any() {
        let asked = options.asked(ttl);
        let mut longest = 0;
        for key in keys {
            let namespace_delay = policy::admit(ctx, key, Judging::EnforceOnly, || asked)?;
            longest = longest.max(options.delay(namespace_delay));
        }
        for key in keys {
            policy::admit(ctx, key, Judging::WarnOnly, || asked)?;
        }
        longest
    } else {
        options.delay(None)
    };
    let now = now_ms();
    let client = caller_id(ctx);
    let connection = recorded_connection(connection_of(ctx, client));
    let label = options.label.as_deref().unwrap_or_default();
    let request = Request {
        token,
        ttl,
        reentrant: false,
        session: options.session,
        delay,
        mode: Mode::Exclusive,
        provisional: false,
        client,
        connection: &connection,
        label,
    };
    let opened: Vec<RedisKeyWritable> = keys.iter().map(|k| ctx.open_key_writable(k)).collect();
    // Every key is looked at before any changes: a key of another type refuses the whole call.
    for key in &opened {
        in_key_mut(key)?;
    }
    let mut grantable = true;
    for (key, name) in opened.iter().zip(keys) {
        grantable &= match in_key_mut(key)? {
            Some(stored) => {
                expire_overdue(ctx, name, stored, now);
                // A semaphore, or a shared hold of this token, refuses the whole call here.
                match stored.lock().admit(&request, now)? {
                    Admit::Refresh | Admit::Downgrade => true,
                    Admit::New => !waiters::queued(ctx, name),
                    Admit::Busy => false,
                }
            }
            None => !waiters::queued(ctx, name),
        };
    }
    if !grantable {
        // Counted once, in the namespace of the first key (where the waiter queues).
        metrics::ACQUIRE_CONTENDED.incr();
        if let Some(first) = keys.first() {
            policy::tally(first.as_slice(), Stat::Contended, 1);
        }
        let Some(timeout) = options.wait.filter(|_| may_block(ctx)) else {
            return Ok(RedisValue::Null);
        };
        let max = crate::config::MAX_WAITERS.get();
        let mut queues = Vec::with_capacity(keys.len());
        for name in keys {
            let (db, key) = waiters::key_ref(ctx, name);
            let queued = waiters::queues().acquirers_on(db, &key);
            if i64::try_from(queued).map_or(true, |n| n >= max) {
                return Err(LockError::TooManyWaiters { max });
            }
            policy::admit_queued(ctx, name, Judging::EnforceOnly, queued)?;
            queues.push(queued);
        }
        for (name, queued) in keys.iter().zip(queues) {
            policy::admit_queued(ctx, name, Judging::WarnOnly, queued)?;
        }
        let queued = queues::Request {
            token,
            ttl,
            reentrant: false,
            session: options.session,
            delay: request.delay,
            mode: Mode::Exclusive,
            client,
            sync: None,
            label: label.into(),
            connection: connection.as_slice().into(),
        };
        return handoff::block_all(ctx, keys, timeout, queued);
    }
    let mut fences = Vec::with_capacity(keys.len());
    for (key, name) in opened.iter().zip(keys) {
        let (fence, lock_id, new) = grant_key(ctx, key, name, &request, now)?;
        if options.session {
            sessions::claim(waiters::key_ref(ctx, name), client_id(ctx), token, lock_id);
        }
        if new {
            metrics::ACQUIRE_WAIT.record(0);
        }
        metrics::ACQUIRED.incr();
        policy::tally(name.as_slice(), Stat::Acquired, 1);
        fences.push(RedisValue::Integer(fence_reply(fence)));
    }
    Ok(RedisValue::Array(fences))
}

/// `LOCK.MRELEASE numkeys key [key ...] token`: drops one hold of `token` on each key, as
/// LOCK.RELEASE would; the reply counts the keys it held.
pub fn mrelease(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let (keys, rest) = counted_keys(args.get(1..).unwrap_or_default(), &["token"])?;
    let [token] = rest else {
        return Err(LockError::WrongArity);
    };
    redact(ctx, i32::try_from(keys.len() + 2).unwrap_or(i32::MAX));
    let token = args::token(ctx, token)?;
    let opened: Vec<RedisKeyWritable> = keys.iter().map(|k| ctx.open_key_writable(k)).collect();
    for key in &opened {
        in_key_mut(key)?;
    }
    let now = now_ms();
    let mut released = 0;
    for (key, name) in opened.iter().zip(keys) {
        released += i64::from(release_key(ctx, key, name, &token, now)?);
    }
    Ok(RedisValue::Integer(released))
}
