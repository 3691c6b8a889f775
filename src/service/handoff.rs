//! Server-side waiting: blocking `LOCK.ACQUIRE ... WAIT` and `LOCK.WAIT`, granting the lock to
//! the head of the queue from the reply callback Redis runs right after a release, and
//! answering waits that time out or end.

use std::time::Instant;

use redis_module::{Context, RedisString, RedisValue};

use crate::error::LockError;
use crate::host::blocking::{self, OnKey};
use crate::host::command::CommandResult;
use crate::host::server::{key_string, now_ms};
use crate::lock::core::Acquire;
use crate::lock::event::Event;
use crate::lock::floor;
use crate::lock::queues::{Ending, Kind, Tag, Waiter};
use crate::lock::sessions;
use crate::metrics;
use crate::service::change::{change, expire_overdue};
use crate::service::value::in_key_mut;
use crate::service::waiters;

/// Blocks the calling client on `key` until it is served or `timeout` ms pass (0: no limit).
pub fn block(ctx: &Context, key: &RedisString, timeout: u64, kind: Kind) -> CommandResult {
    let id = waiters::queues().next_id();
    let tag = Tag {
        id,
        key: waiters::key_ref(ctx, key),
        watch: match kind {
            Kind::Watch { fence } => Some(fence),
            Kind::Acquire(_) => None,
        },
    };
    let queued = tag.clone();
    let handle = blocking::block_on_key::<Handoff>(ctx, key, timeout, tag).ok_or(
        LockError::internal("the server refused to block the client"),
    )?;
    let waiter = Waiter {
        id,
        handle,
        since: Instant::now(),
        kind,
    };
    waiters::queues().enqueue(&queued, waiter);
    Ok(RedisValue::NoReply)
}

/// Fence replies are RESP integers: signed.
pub fn fence_reply(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

/// The blocked clients of `LOCK.ACQUIRE ... WAIT` and `LOCK.WAIT`.
pub struct Handoff;

impl OnKey for Handoff {
    type Tag = Tag;

    /// The head acquirer of a free lock gets it (and its fence as reply); a watcher whose wait is
    /// over gets 1. `None` keeps the client waiting.
    fn ready(ctx: &Context, tag: &Tag) -> Option<CommandResult> {
        serve(ctx, tag)
    }

    /// A watcher the module woke (see `waiters::wake_watchers`), or a wait that timed out or
    /// was cancelled by `CLIENT UNBLOCK`.
    fn ended(_ctx: &Context, tag: &Tag) -> CommandResult {
        match waiters::queues().take_woken(tag.id) {
            Some(Ending::Watched) => return Ok(RedisValue::Integer(1)),
            Some(Ending::Displaced) => return Err(LockError::Displaced),
            None => {}
        }
        waiters::remove(tag);
        if tag.watch.is_some() {
            Ok(RedisValue::Integer(0))
        } else {
            metrics::ACQUIRE_TIMEOUTS.incr();
            Ok(RedisValue::Null)
        }
    }

    fn disconnected(tag: &Tag) {
        waiters::remove(tag);
    }

    fn freed(tag: Tag) {
        waiters::remove(&tag);
        waiters::queues().take_woken(tag.id);
    }
}

fn serve(ctx: &Context, tag: &Tag) -> Option<CommandResult> {
    let now = now_ms();
    let (db, name) = &tag.key;
    let key_name = key_string(ctx, name);
    let key = ctx.open_key_writable(&key_name);
    let stored = match in_key_mut(&key) {
        Ok(Some(stored)) => stored,
        // Another type took the name: keep waiting for it to become a lock again.
        _ => return None,
    };
    if let Some(waited_on) = tag.watch {
        let lock = stored.lock();
        let over = lock
            .live_holder(now)
            .is_none_or(|_| lock.fence != waited_on);
        return (over && waiters::remove(tag).is_some()).then_some(Ok(RedisValue::Integer(1)));
    }
    expire_overdue(ctx, &key_name, stored, now);
    if stored.lock().is_held(now) || !waiters::queues().is_head(*db, name, tag.id) {
        return None;
    }
    let head = waiters::remove(tag)?;
    let Kind::Acquire(request) = &head.kind else {
        return None;
    };
    let mut outcome = Ok(Acquire::Busy);
    let lock_id = stored.id();
    change(ctx, &key_name, stored, now, |lock| {
        outcome = lock.acquire(
            &request.token,
            request.ttl,
            request.reentrant,
            request.session,
            floor::get(),
            now,
        );
        matches!(outcome, Ok(Acquire::Granted { .. })).then_some(Event::Acquire)
    });
    Some(match outcome {
        Ok(Acquire::Granted { fence } | Acquire::Refreshed { fence }) => {
            if request.session {
                sessions::claim(tag.key.clone(), request.client, &request.token, lock_id);
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
