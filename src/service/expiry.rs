//! Active expiry of leases, and reclaim of free locks, on the primary.
//!
//! The lease index (see `leases`) is kept in step with grants, renewals and releases, and its
//! timer is armed for the earliest time due: a lease deadline, or the end of a free lock's
//! tombstone time. When it fires on a primary, [`on_due`] expires every overdue lock (announcing
//! `lock.expired` and replicating the release) and deletes the free locks nobody wants, in slices
//! of a couple of milliseconds so a mass expiry never stalls the event loop. Replicas keep the
//! index too (they apply the same effects) but never expire or reclaim anything themselves.
//!
//! Keys that arrive without a grant (RENAME, MOVE, COPY, RESTORE, loading) are indexed from
//! keyspace events ([`index_key`]) and by a scan after loading ([`rebuild`]).
//!
//! On Valkey, locks arriving by atomic slot migration still belong to the source node until the
//! import completes: their entries are put off ([`slot_import`]) rather than expired or reclaimed
//! here, since the source expires them and its effects follow the import. An aborted import is
//! deleted by the server (with `del` events).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::host::events::SlotImport;
use crate::host::keys::scan_values;
use crate::host::server::{
    avoid_replica_traffic, is_loading, is_primary, key_string, now_ms, select_db, selected_db,
};
use crate::lock::locked;
use crate::lock::slots::{key_slot, Imports};
use crate::service::change;
use crate::service::value::{Stored, LOCK_TYPE};
use crate::service::{holds, leases, policy};

/// How long one timer run may spend expiring locks before yielding to the event loop. Redis
/// fires a due module timer at most once per millisecond, so while leases keep coming due the
/// server expires for SLICE out of every SLICE + 1 ms: 4 ms keeps 80% of a mass expiry's time
/// working and a client's longest wait near 5 ms (the bench's goal: 10 ms).
const SLICE: Duration = Duration::from_millis(4);
/// How often a replica (or a loading server) looks again.
const IDLE_RECHECK_MS: u64 = 100;

/// The slots being imported into this node, and whether there are any (read on every due entry).
static IMPORTS: Mutex<Imports> = Mutex::new(Imports::new());
static IMPORTING: AtomicBool = AtomicBool::new(false);

fn imports() -> MutexGuard<'static, Imports> {
    locked(&IMPORTS)
}

/// True while `key` is in a slot this node is importing.
fn importing(key: &[u8]) -> bool {
    IMPORTING.load(Ordering::Relaxed) && imports().contains(key_slot(key))
}

/// An atomic slot migration into this node started, completed or was aborted. Once its slots
/// are this node's, the entries put off meanwhile are looked at again at once.
pub fn slot_import(ctx: &Context, phase: SlotImport, job: &[u8], ranges: Vec<(u16, u16)>) {
    let mut imports = imports();
    match phase {
        SlotImport::Started => imports.started(job, ranges),
        SlotImport::Completed | SlotImport::Aborted => imports.ended(job),
    }
    IMPORTING.store(!imports.is_empty(), Ordering::Relaxed);
    drop(imports);
    if phase == SlotImport::Completed {
        leases::arm_next(ctx, Some(now_ms()));
    }
}

/// The timer's handler: expire what is due, then re-arm for the next deadline.
pub fn on_due(ctx: &Context) {
    let now = now_ms();
    leases::fired();
    // Nothing may be replicated while clients are paused (CLIENT PAUSE, a failover): Redis
    // would abort. Leases end once the pause is over, as Redis' own expiry does.
    if !is_primary(ctx) || is_loading(ctx) || avoid_replica_traffic() {
        if !leases::is_empty() {
            leases::arm_next(ctx, Some(now + IDLE_RECHECK_MS));
        }
        return;
    }
    let original_db = selected_db(ctx);
    let started = Instant::now();
    let mut more_due = false;
    while let Some(due) = leases::pop_due(now) {
        if importing(due.key.as_bytes()) {
            // Still the source node's lock: look again later.
            leases::insert(
                ctx,
                now + IDLE_RECHECK_MS,
                due.db,
                due.id,
                due.key.as_bytes(),
            );
        } else if select_db(ctx, due.db) {
            change::visit_due(
                ctx,
                &key_string(ctx, due.key.as_bytes()),
                due.id,
                due.entry(),
                now,
            );
        }
        if started.elapsed() >= SLICE {
            more_due = true;
            break;
        }
    }
    select_db(ctx, original_db);
    leases::arm_next(ctx, more_due.then_some(now));
}

/// Indexes the lock under `key` in the selected db (keyspace events for keys that arrive
/// without a grant: RENAME, MOVE, COPY, RESTORE).
pub fn index_key(ctx: &Context, key: &[u8]) {
    change::index_arrived(ctx, &key_string(ctx, key));
}

/// Rebuilds the index from the keyspace (after loading).
pub fn rebuild(ctx: &Context) {
    let original_db = selected_db(ctx);
    let mut found = Vec::new();
    let mut db = 0;
    holds::clear();
    while select_db(ctx, db) {
        scan_values::<Stored>(ctx, &LOCK_TYPE, |key, stored| {
            if let Some(at) = stored.index_afresh(policy::long_hold_of(key)) {
                found.push((at, db, stored.id(), key.into()));
            }
            holds::follow(stored, key);
        });
        db += 1;
    }
    select_db(ctx, original_db);
    leases::replace(ctx, found);
}
