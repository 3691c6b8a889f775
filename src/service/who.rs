//! What an operator sees of one lock: who holds it and who waits for it (`LOCK.WHO`).

use std::time::Instant;

use redis_module::{Context, RedisString, RedisValue};

use crate::error::LockError;
use crate::host::command::{reply_nested, CommandResult, Nested};
use crate::host::server::{is_connected_at, is_primary, now_ms};
use crate::lock::ages::{tag_of, tag_text};
use crate::lock::core::{split_connection, Grant, Holder, Mode};
use crate::lock::queues::{Kind, Waiter};
use crate::service::args;
use crate::service::handoff::fence_reply;
use crate::service::value::in_key;
use crate::service::waiters;

/// Milliseconds from `since` to now, for a wait.
fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Whether the client a hold was granted to is still connected under that id: 1 or 0; -1 when
/// nobody can tell (the id is unknown, or this is a replica, where ids are the primary's).
fn connected(ctx: &Context, grant: &Grant) -> i64 {
    if grant.client == 0 || !is_primary(ctx) {
        return -1;
    }
    i64::from(is_connected_at(grant.client, grant.addr()))
}

/// When a hold was granted, in unix ms, for an operator asking "since when" beside `held_ms`;
/// -1 when not known (a hold stored by a release before 0.2.0).
pub fn granted_at(since: u64) -> i64 {
    if since == 0 {
        -1
    } else {
        i64::try_from(since).unwrap_or(i64::MAX)
    }
}

/// One holder's entry.
fn holder_entry(
    ctx: &Context,
    mode: &'static str,
    fence: u64,
    holder: &Holder,
    now: u64,
) -> Nested {
    let grant = &*holder.grant;
    let held = if grant.since == 0 {
        -1
    } else {
        i64::try_from(now.saturating_sub(grant.since)).unwrap_or(i64::MAX)
    };
    Nested::Map(vec![
        ("mode", Nested::word(mode)),
        ("fence", Nested::int(fence_reply(fence))),
        ("held_ms", Nested::int(held)),
        ("granted_at", Nested::int(granted_at(grant.since))),
        ("ttl", Nested::int(holder.deadline.saturating_sub(now))),
        ("holds", Nested::int(holder.holds)),
        ("session", Nested::int(holder.session)),
        ("lock_delay", Nested::int(grant.delay)),
        ("client_id", Nested::int(grant.client)),
        ("client_name", Nested::bulk(grant.name())),
        ("client_addr", Nested::bulk(grant.addr())),
        ("label", Nested::bulk(grant.label())),
        ("connected", Nested::int(connected(ctx, grant))),
    ])
}

/// One queued acquirer's entry; `position` counts from 1.
fn waiter_entry<H>(position: usize, waiter: &Waiter<H>) -> Option<Nested> {
    let (request, keys) = match &waiter.kind {
        Kind::Acquire(request) => (request, 1),
        Kind::AcquireAll { request, keys, .. } => (request, keys.len()),
        Kind::Watch { .. } => return None,
    };
    let (mode, limit) = match request.mode {
        Mode::Exclusive => ("exclusive", 0),
        Mode::Shared => ("shared", 0),
        Mode::Permit(limit) => ("permit", limit),
    };
    let [addr, name] = split_connection(&request.connection);
    let timeout = waiter.until.map_or(-1, |until| {
        let left = until.saturating_duration_since(Instant::now());
        i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
    });
    Some(Nested::Map(vec![
        ("position", Nested::int(position)),
        ("mode", Nested::word(mode)),
        ("limit", Nested::int(limit)),
        ("client_id", Nested::int(request.client)),
        ("client_name", Nested::bulk(name)),
        ("client_addr", Nested::bulk(addr)),
        ("label", Nested::bulk(&request.label)),
        ("waited_ms", Nested::int(elapsed_ms(waiter.since))),
        ("timeout_ms", Nested::int(timeout)),
        ("keys", Nested::int(keys)),
    ]))
}

/// The client a waiter is.
fn client_of<H>(waiter: &Waiter<H>) -> u64 {
    match &waiter.kind {
        Kind::Acquire(request) | Kind::AcquireAll { request, .. } => request.client,
        Kind::Watch { .. } => 0,
    }
}

/// `LOCK.WHO key [COUNT count] [CLIENT client-id]`: the lock's holders, and the acquirers
/// queued for it in queue order, each with who it is; nil when the key does not exist and
/// nobody waits for it. Never a token.
pub fn who(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, options @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    let options = args::who_options(options, 2)?;
    let key = ctx.open_key(key_name);
    let stored = in_key(&key)?;
    let (db, name) = waiters::key_ref(ctx, key_name);
    let queues = waiters::queues();
    let queued = queues.acquirers_on(db, &name);
    let watchers = queues.watchers_on(db, &name);
    if stored.is_none() && queued == 0 && watchers == 0 {
        return Ok(RedisValue::Null);
    }
    let now = now_ms();
    let wanted = |client: u64| options.client.is_none_or(|c| c == client);

    let mut holders = Vec::new();
    let mut holders_total = 0;
    let mut state = "free";
    let mut mode = "none";
    let (mut fence, mut delay_ttl) = (0, -1);
    if let Some(stored) = stored {
        let lock = stored.lock();
        fence = lock.fence;
        delay_ttl = lock
            .delay_ttl(now)
            .map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX));
        let hold_mode = if lock.limit() > 0 {
            "permit"
        } else if lock.live_holder(now).is_some() {
            "exclusive"
        } else {
            "shared"
        };
        for (fence, holder) in lock.live_holders(now) {
            holders_total += 1;
            if wanted(holder.grant.client) && holders.len() < options.count {
                holders.push(holder_entry(ctx, hold_mode, fence, holder, now));
            }
        }
        if holders_total > 0 {
            state = "held";
        }
        mode = if lock.limit() > 0 {
            "semaphore"
        } else if holders_total == 0 {
            "none"
        } else {
            hold_mode
        };
    }
    let mut waiting = Vec::new();
    for (index, waiter) in queues.acquirers(db, &name).enumerate() {
        if waiting.len() >= options.count {
            break;
        }
        if wanted(client_of(waiter)) {
            waiting.extend(waiter_entry(index + 1, waiter));
        }
    }
    drop(queues);
    reply_nested(
        ctx,
        Nested::Map(vec![
            ("state", Nested::word(state)),
            ("mode", Nested::word(mode)),
            ("fence", Nested::int(fence_reply(fence))),
            ("delay_ttl", Nested::int(delay_ttl)),
            ("tag", Nested::bulk(tag_text(tag_of(&name)).as_bytes())),
            ("holders_total", Nested::int(holders_total)),
            ("holders", Nested::List(holders)),
            ("waiters_total", Nested::int(queued)),
            ("waiters", Nested::List(waiting)),
            ("watchers", Nested::int(watchers)),
        ]),
    )
}
