//! Active expiry of leases on the primary.
//!
//! An index of leases by (deadline, lock id) -> (db, key), kept in step with grants, renewals
//! and releases (a lock's id is unique per value and lives only in memory),
//! and a single module timer armed for the earliest deadline. When it fires on a primary it
//! expires every overdue lock (announcing `lock.expired` and replicating the release), in slices
//! of a couple of milliseconds so a mass expiry never stalls the event loop. Replicas keep the
//! index too (they apply the same effects) but never expire anything themselves.
//!
//! Entries are hints: a key renamed, moved, deleted or flushed leaves a stale entry, which is
//! dropped when it comes due (the key no longer holds the lock with that id). Keys that arrive without a grant (RENAME, MOVE, COPY, RESTORE,
//! loading) are indexed from keyspace events and by a scan after loading.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_module::{raw, Context, ContextFlags};

use crate::{commands, replication};

/// How long one timer run may spend expiring locks before yielding to the event loop.
const SLICE: Duration = Duration::from_millis(2);
/// How often a replica (or a loading server) looks again.
const IDLE_RECHECK_MS: u64 = 100;

/// (deadline, slot) -> key name, where the slot packs the db (high 16 bits) with the lock id
/// (low 48 bits): 32 bytes per entry, the size that matters with a million leases.
type Entries = BTreeMap<(u64, u64), Box<[u8]>>;

const ID_BITS: u32 = 48;
const ID_MASK: u64 = (1 << ID_BITS) - 1;

fn slot(db: i32, id: u64) -> u64 {
    (u64::from(db as u16) << ID_BITS) | (id & ID_MASK)
}

fn db_of(slot: u64) -> i32 {
    i32::from((slot >> ID_BITS) as u16)
}

/// The part of a lock id the index keeps.
pub fn short_id(id: u64) -> u64 {
    id & ID_MASK
}

struct Index {
    entries: Entries,
    /// The armed timer and the time it fires.
    armed: Option<(raw::RedisModuleTimerID, u64)>,
}

static INDEX: Mutex<Index> = Mutex::new(Index {
    entries: BTreeMap::new(),
    armed: None,
});

fn index() -> MutexGuard<'static, Index> {
    INDEX
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Moves the entry of lock `id` (under `key` in `db`) from `old` to `new` deadline and makes
/// sure the timer fires in time. A renewal reuses the entry's copy of the key name.
pub fn reindex(ctx: &Context, id: u64, db: i32, key: &[u8], old: Option<u64>, new: Option<u64>) {
    let mut idx = index();
    let slot = slot(db, id);
    let previous = old.and_then(|old| idx.entries.remove(&(old, slot)));
    if let Some(new) = new {
        let name = match previous {
            Some(name) if *name == *key => name,
            _ => key.into(),
        };
        idx.entries.insert((new, slot), name);
        arm(ctx, &mut idx, new);
    }
}

/// Arms the timer to fire at `at` unless it already fires no later.
fn arm(ctx: &Context, idx: &mut Index, at: u64) {
    if idx.armed.is_some_and(|(_, fires)| fires <= at) {
        return;
    }
    if let Some((id, _)) = idx.armed.take() {
        // SAFETY: valid context; stopping an id that already fired is a harmless error.
        unsafe {
            if let Some(stop) = raw::RedisModule_StopTimer {
                stop(ctx.ctx, id, std::ptr::null_mut());
            }
        }
    }
    let delay = at.saturating_sub(commands::now_ms());
    let id = crate::ffi::create_timer(ctx, crate::ffi::Timer::Expiry, delay);
    if let Some(id) = id {
        idx.armed = Some((id, at));
    }
}

/// The timer callback: expire what is due, then re-arm for the next deadline.
pub fn on_timer(ctx: &Context) {
    let now = commands::now_ms();
    index().armed = None;
    let flags = ctx.get_flags();
    if !flags.contains(ContextFlags::MASTER) || flags.contains(ContextFlags::LOADING) {
        let mut idx = index();
        if !idx.entries.is_empty() {
            arm(ctx, &mut idx, now + IDLE_RECHECK_MS);
        }
        return;
    }
    let original_db = replication::selected_db(ctx);
    let started = Instant::now();
    let mut more_due = false;
    loop {
        let due = {
            let mut idx = index();
            match idx.entries.first_key_value() {
                Some(((deadline, _), _)) if *deadline <= now => idx.entries.pop_first(),
                _ => None,
            }
        };
        let Some(((_, slot), key)) = due else {
            break;
        };
        expire_key(ctx, slot & ID_MASK, db_of(slot), &key, now);
        if started.elapsed() >= SLICE {
            more_due = true;
            break;
        }
    }
    replication::select_db(ctx, original_db);
    let mut idx = index();
    let next = if more_due {
        Some(now)
    } else {
        idx.entries.first_key_value().map(|((d, _), _)| *d)
    };
    if let Some(next) = next {
        arm(ctx, &mut idx, next);
    }
}

fn expire_key(ctx: &Context, id: u64, db: i32, key: &[u8], now: u64) {
    if !replication::select_db(ctx, db) {
        return;
    }
    let name = replication::key_string(ctx, key);
    commands::expire_key(ctx, &name, id, now);
}

/// Indexes the lock under `key` in the selected db, if it is held (keyspace events for keys
/// that arrive without a grant: RENAME, MOVE, COPY, RESTORE).
pub fn index_key(ctx: &Context, key: &[u8]) {
    let db = replication::selected_db(ctx);
    let name = replication::key_string(ctx, key);
    if let Some((id, deadline)) = commands::lease_of(ctx, &name) {
        let mut idx = index();
        idx.entries.insert((deadline, slot(db, id)), key.into());
        arm(ctx, &mut idx, deadline);
    }
}

/// Forgets the entries of one database, or all for `None` (FLUSHDB / FLUSHALL).
pub fn forget_db(db: Option<i32>) {
    let mut idx = index();
    match db {
        Some(db) => idx.entries.retain(|(_, slot), _| db_of(*slot) != db),
        None => idx.entries.clear(),
    }
}

/// Rebuilds the index from the keyspace (after loading, SWAPDB).
pub fn rebuild(ctx: &Context) {
    let original_db = replication::selected_db(ctx);
    let mut found = Entries::new();
    let mut db = 0;
    while replication::select_db(ctx, db) {
        crate::ffi::scan_locks(ctx, |key, id, deadline| {
            found.insert((deadline, slot(db, id)), key.into());
        });
        db += 1;
    }
    replication::select_db(ctx, original_db);
    let mut idx = index();
    idx.entries = found;
    if let Some(first) = idx.entries.first_key_value().map(|((d, _), _)| *d) {
        arm(ctx, &mut idx, first);
    }
}
