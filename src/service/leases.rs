//! The process' lease index and the one timer armed for its earliest deadline.
//!
//! Changes keep the index in step ([`follow`]); when the timer fires it calls the due handler
//! that [`set_due_handler`] installed at load (expiry, a layer above), which takes entries with
//! [`pop_due`] and re-arms with [`arm_next`].

use std::sync::{Mutex, MutexGuard, OnceLock};

use redis_module::Context;

use crate::host::server::{is_primary, selected_db};
use crate::host::timer::{self, Earliest};
use crate::lock::lease_index::{Due, Entry, LeaseIndex};
use crate::lock::locked;
use crate::service::policy;
use crate::service::value::{IndexPlan, Stored};

struct Leases {
    index: LeaseIndex,
    /// The timer, armed for the earliest entry.
    timer: Earliest,
}

static LEASES: Mutex<Leases> = Mutex::new(Leases {
    index: LeaseIndex::new(),
    timer: Earliest::new(),
});

static DUE_HANDLER: OnceLock<timer::Callback> = OnceLock::new();

fn leases() -> MutexGuard<'static, Leases> {
    locked(&LEASES)
}

/// Installs what runs when the timer fires (once, at load).
pub fn set_due_handler(handler: timer::Callback) {
    let _ = DUE_HANDLER.set(handler);
}

/// Arms the timer to fire at `at` unless it already fires no later.
fn arm(ctx: &Context, leases: &mut Leases, at: u64) {
    if let Some(handler) = DUE_HANDLER.get().copied() {
        leases.timer.arm(ctx, at, handler);
    }
}

/// Makes sure the lock `stored` under `key` (in the selected db) comes due no later than it is
/// due (see `Stored::index_plan`): a later due time leaves its entry where it is; otherwise a
/// reclaim is queued or a B-tree entry added, in place of the entry it had.
pub fn follow(ctx: &Context, stored: &Stored, key: &[u8]) {
    let (db, id) = (selected_db(ctx), stored.id());
    let mut leases = leases();
    let entry = match stored.index_plan(policy::long_hold_of(key)) {
        IndexPlan::Keep => return,
        // Only a primary queues (a replica's queue would pile up: its reclaims arrive from its
        // primary, and then its entry goes).
        IndexPlan::Queue { old, at }
            if is_primary(ctx) && leases.index.queue(at, db, id, key, old) =>
        {
            Entry::queued(at)
        }
        // A replica, or a time before the last queued one (the tombstone time was shortened):
        // in the B-tree.
        IndexPlan::Queue { old, at } | IndexPlan::Move { old, new: at } => {
            leases.index.reindex(db, id, key, old, at);
            Entry::tree(at)
        }
    };
    stored.set_indexed(Some(entry));
    arm(ctx, &mut leases, entry.at);
}

/// The value of lock `id` is being freed, by whatever removed it (DEL, an overwrite, eviction,
/// a flush, the module's own reclaim), possibly on a lazy-free thread: its `entry` leaves the
/// index.
pub fn forget(id: u64, entry: Option<Entry>) {
    if let Some(entry) = entry {
        leases().index.forget(id, entry);
    }
}

/// The lock `stored` now lives under `key` in the selected db, without a grant (RENAME, MOVE,
/// COPY, RESTORE): its entry names the new place, and it comes due in time.
pub fn arrived(ctx: &Context, stored: &Stored, key: &[u8]) {
    match stored.indexed() {
        // Same time and id: the entry's place is replaced.
        Some(Entry { at, queued: false }) => {
            leases()
                .index
                .insert(at, selected_db(ctx), stored.id(), key);
        }
        // Queued again under its new name, below.
        Some(queued) => {
            leases().index.forget(stored.id(), queued);
            stored.set_indexed(None);
        }
        None => {}
    }
    follow(ctx, stored, key);
}

/// Adds an entry (a lock that arrived without a grant: RENAME, MOVE, COPY, RESTORE).
pub fn insert(ctx: &Context, at: u64, db: i32, id: u64, key: &[u8]) {
    let mut leases = leases();
    leases.index.insert(at, db, id, key);
    arm(ctx, &mut leases, at);
}

/// In the timer's handler: forgets the timer that just fired.
pub fn fired() {
    leases().timer.fired();
}

/// Takes the earliest entry if it is due at `now`.
pub fn pop_due(now: u64) -> Option<Due> {
    leases().index.pop_due(now)
}

/// Arms the timer for `at`, or for the earliest entry when `at` is `None` (if there is one).
pub fn arm_next(ctx: &Context, at: Option<u64>) {
    let mut leases = leases();
    if let Some(at) = at.or_else(|| leases.index.first_due()) {
        arm(ctx, &mut leases, at);
    }
}

/// True when no lease is indexed.
pub fn is_empty() -> bool {
    leases().index.is_empty()
}

/// The number of entries in the index (`INFO lock`: at most one per lock key).
pub fn entries() -> usize {
    leases().index.len()
}

/// Forgets the entries of one database, or all for `None` (FLUSHDB / FLUSHALL).
pub fn forget_db(db: Option<i32>) {
    leases().index.forget_db(db);
}

/// SWAPDB: the entries follow their data.
pub fn swap_dbs(a: i32, b: i32) {
    leases().index.swap_dbs(a, b);
}

/// Replaces the whole index (after loading) and arms the timer.
pub fn replace(ctx: &Context, found: Vec<(u64, i32, u64, Box<[u8]>)>) {
    let mut leases = leases();
    leases.index.replace(found);
    if let Some(first) = leases.index.first_due() {
        arm(ctx, &mut leases, first);
    }
}
