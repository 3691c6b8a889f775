//! Every lock that is held or waited for, a page at a time (`LOCK.LIST`), the analogue of
//! PostgreSQL's `pg_locks`: a cursor over the keyspace as SCAN's (the server's own SCAN with
//! `TYPE lockstate` finds the keys), each lock with its namespace, mode, holders, the age of its
//! oldest hold, its holders' labels and its waiters. Never a token, and only the keys the
//! caller's ACL user may read.

use std::time::Instant;

use redis_module::{Context, RedisString, RedisValue};

use crate::error::LockError;
use crate::host::call::{scan_page, Reader};
use crate::host::command::{reply_nested, CommandResult, Nested};
use crate::host::keys;
use crate::host::server::now_ms;
use crate::service::args::{self, ListOptions};
use crate::service::value::{in_key_mut, LOCK_TYPE_NAME};
use crate::service::{holds, policy, waiters};

/// The most distinct labels an entry shows, and the most holders looked at to find them (a
/// semaphore of ten thousand holders is not walked for its labels).
const LABELS_SHOWN: usize = 8;
const HOLDERS_LOOKED_AT: usize = 64;

/// `LOCK.LIST cursor [NAMESPACE name] [OLDER ms] [WAITING] [COUNT count]`.
pub fn list(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, cursor, options @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    let cursor = cursor_of(cursor)?;
    let filter = args::list_options(options, 2)?;
    if let Some(name) = &filter.namespace {
        if !policy::has_row(name) {
            return Err(LockError::UnknownNamespace);
        }
    }
    let (next, names) = scan_page(ctx, cursor.as_bytes(), LOCK_TYPE_NAME, filter.count)
        .ok_or(LockError::internal("SCAN answered no page"))?;
    let reader = Reader::of_caller(ctx);
    let now = now_ms();
    let mut entries = Vec::new();
    for name in &names {
        if !reader.as_ref().is_some_and(|r| r.may_read(name)) {
            continue;
        }
        if let Some(entry) = entry(ctx, name, &filter, now) {
            entries.push(entry);
        }
    }
    reply_nested(
        ctx,
        Nested::List(vec![Nested::bulk(&next), Nested::List(entries)]),
    )
}

/// The cursor: an unsigned integer, as SCAN takes it.
fn cursor_of(arg: &RedisString) -> Result<String, LockError> {
    let text = std::str::from_utf8(arg.as_slice()).ok();
    text.filter(|t| !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .map(|c| c.to_string())
        .ok_or(LockError::BadInteger {
            name: "cursor",
            detail: "not an unsigned integer",
        })
}

/// The entry of the lock under `name`, when it is held or waited for and passes `filter`.
fn entry(ctx: &Context, name: &RedisString, filter: &ListOptions, now: u64) -> Option<Nested> {
    let namespace = policy::row_name_of(name.as_slice());
    if let Some(wanted) = &filter.namespace {
        if namespace.as_deref() != Some(wanted.as_str()) {
            return None;
        }
    }
    let key = keys::open_quietly(ctx, name);
    let stored = in_key_mut(&key).ok()??;
    let lock = stored.lock();
    let (db, key_name) = waiters::key_ref(ctx, name);
    let (waiters_now, oldest_wait) = waiters::queues().waiting_on_since(db, &key_name);
    let holders = lock.live_count(now);
    if holders == 0 && waiters_now == 0 {
        return None;
    }
    if filter.waiting && waiters_now == 0 {
        return None;
    }
    let held_ms = holds::since_of(stored).map(|since| now.saturating_sub(since));
    if let Some(older) = filter.older_ms {
        if holders == 0 || held_ms.is_none_or(|held| held < older) {
            return None;
        }
    }
    let mode = if lock.limit() > 0 {
        "semaphore"
    } else if holders == 0 {
        "none"
    } else if lock.live_holder(now).is_some() {
        "exclusive"
    } else {
        "shared"
    };
    let mut labels: Vec<&[u8]> = Vec::new();
    for (_, holder) in lock.live_holders(now).take(HOLDERS_LOOKED_AT) {
        let label = holder.grant.label();
        if !label.is_empty() && !labels.contains(&label) && labels.len() < LABELS_SHOWN {
            labels.push(label);
        }
    }
    let waited_ms = oldest_wait.map_or(0, elapsed_ms);
    let int = |v: u64| Nested::int(i64::try_from(v).unwrap_or(i64::MAX));
    Some(Nested::Map(vec![
        ("key", Nested::bulk(name.as_slice())),
        (
            "namespace",
            namespace.map_or(Nested::Value(RedisValue::Null), |n| {
                Nested::bulk(n.as_bytes())
            }),
        ),
        ("mode", Nested::word(mode)),
        ("holders", int(holders as u64)),
        (
            "held_ms",
            // -1: held, by holds whose grant time is unknown (stored by a release before
            // 0.2.0); 0 when nobody holds it.
            match (holders, held_ms) {
                (0, _) => Nested::int(0),
                (_, Some(held)) => int(held),
                (_, None) => Nested::int(-1),
            },
        ),
        (
            "labels",
            Nested::List(labels.into_iter().map(Nested::bulk).collect()),
        ),
        ("waiters", int(waiters_now as u64)),
        ("waited_ms", int(waited_ms)),
    ]))
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
