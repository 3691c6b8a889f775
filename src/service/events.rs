//! What server events and keyspace notifications mean for locks. Nothing here writes: work that
//! writes is deferred (see `deferred`).

use redis_module::{Context, RedisString};

use crate::host::events::{AsyncLoad, Listener, ServerEvent};
use crate::host::server::{forget_client, selected_db};
use crate::lock::sessions;
use crate::metrics;
use crate::service::deferred::{self, Job};
use crate::service::{expiry, leases, waiters};

/// The module's listener.
pub struct Events;

/// The data of `db` (every db for `None`) was replaced wholesale: what the module keeps beside
/// it by key lets go (the lease index, sessions), and its waiters are looked at again.
fn data_replaced(ctx: &Context, db: Option<i32>) {
    leases::forget_db(db);
    sessions::flushed(db);
    settle_waiters_in(ctx, db);
}

/// Asks for the waiters of every key in `db` (all dbs for `None`) to be settled.
fn settle_waiters_in(ctx: &Context, db: Option<i32>) {
    if !waiters::anyone_waiting() {
        return;
    }
    let keys = waiters::queues().keys_in(db);
    for key in keys {
        deferred::defer(ctx, Job::SettleKey(key));
    }
}

impl Listener for Events {
    fn server_event(ctx: &Context, event: ServerEvent) {
        match event {
            ServerEvent::LoadingEnded => expiry::rebuild(ctx),
            ServerEvent::Flushed(db) => data_replaced(ctx, db),
            // A replica's background load of a full sync. While it runs, the old data serves
            // and keeps its bookkeeping; the values loaded aside are in none of it (only the
            // fence floor rises with them, as it may: it never goes down; and the gauges count
            // them until they are freed). Given up, they are dropped and nothing changes. Completed, they replace every database at once, as
            // a flush and a load would: the old data's bookkeeping goes here, and the
            // `LoadingEnded` that follows indexes the new data. (The old values are freed
            // afterwards, perhaps on a background thread; what they take out of the index
            // and the ages is found by their own ids, never a new value's.)
            ServerEvent::AsyncLoad(AsyncLoad::Completed) => data_replaced(ctx, None),
            ServerEvent::AsyncLoad(AsyncLoad::Started | AsyncLoad::Aborted) => {}
            ServerEvent::SwappedDbs(a, b) => {
                leases::swap_dbs(a, b);
                deferred::databases_swapped();
                sessions::swapped(a, b);
                settle_waiters_in(ctx, Some(a));
                if b != a {
                    settle_waiters_in(ctx, Some(b));
                }
            }
            // A child was just forked; when it rewrites the AOF, the parent's writes from now on
            // go to the new incremental file, which will sit beside the rewritten base: record
            // the fence floor there (a base without RDB preamble has nowhere to keep it). Never
            // from here: the event fires inside the command that forked (PSYNC, BGSAVE,
            // BGREWRITEAOF), and a write replicated from it would propagate that command too,
            // into the AOF and to every replica. A timer replicates the floor alone.
            ServerEvent::ForkChildBorn => deferred::defer(ctx, Job::RecordFloor),
            ServerEvent::ConfigChanged => deferred::defer(ctx, Job::CheckConfig),
            ServerEvent::ClientDisconnected(client) => {
                forget_client(client);
                if sessions::owns_any(client) {
                    deferred::defer(ctx, Job::SessionLost(client));
                }
            }
            ServerEvent::SlotImport(phase, job, ranges) => {
                expiry::slot_import(ctx, phase, &job, ranges)
            }
        }
    }

    fn keyspace_event(ctx: &Context, event: &[u8], key: &RedisString) {
        let name = key.as_slice();
        if sessions::any() {
            let place = (selected_db(ctx), name.into());
            match event {
                b"rename_from" | b"move_from" => sessions::leaving(&place),
                b"rename_to" | b"move_to" => sessions::arrived(&place),
                // The key left, or another value took its place.
                b"del" | b"expired" | b"evicted" | b"restore" | b"copy_to" => {
                    sessions::forget(&place)
                }
                _ => {}
            }
        }
        // A lock that arrived under this name without a grant needs its lease indexed; with no
        // lock value anywhere there is nothing to look at (and other keys are left untouched).
        if metrics::KEYS.get() > 0
            && matches!(event, b"rename_to" | b"move_to" | b"copy_to" | b"restore")
        {
            expiry::index_key(ctx, name);
        }
        // The key left (or another value took its name): its waiters may proceed.
        if matches!(
            event,
            b"del"
                | b"expired"
                | b"evicted"
                | b"rename_from"
                | b"move_from"
                | b"rename_to"
                | b"move_to"
                | b"copy_to"
                | b"restore"
        ) && waiters::anyone_waiting()
            && waiters::queues().waiting_on(selected_db(ctx), name) > 0
        {
            deferred::defer(ctx, Job::SettleKey((selected_db(ctx), name.into())));
        }
    }
}
