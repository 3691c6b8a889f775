//! Work that may not run where it is noticed (keyspace-notification and server-event callbacks
//! must not write): queued here and run from a 0 ms timer on the next event-loop turn.

use std::sync::{Mutex, MutexGuard};

use redis_module::Context;

use crate::waiting::KeyRef;
use crate::{commands, replication, sessions};

#[derive(Debug, PartialEq, Eq)]
pub enum Job {
    /// A key with waiters was deleted, flushed, swapped or recreated.
    SettleKey(KeyRef),
    /// A connection that owned session locks closed.
    SessionLost(u64),
    /// The server's configuration changed: look for settings that endanger locks.
    CheckConfig,
}

struct Pending {
    jobs: Vec<Job>,
    armed: bool,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    jobs: Vec::new(),
    armed: false,
});

fn pending() -> MutexGuard<'static, Pending> {
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn defer(ctx: &Context, job: Job) {
    let mut p = pending();
    if !p.jobs.contains(&job) {
        p.jobs.push(job);
    }
    if !p.armed {
        let created = crate::ffi::create_timer(ctx, crate::ffi::Timer::Deferred, 0);
        p.armed = created.is_some();
    }
}

/// The timer callback.
pub fn run(ctx: &Context) {
    let jobs = {
        let mut p = pending();
        p.armed = false;
        std::mem::take(&mut p.jobs)
    };
    let primary = ctx.get_flags().contains(redis_module::ContextFlags::MASTER);
    let original_db = replication::selected_db(ctx);
    let now = commands::now_ms();
    for job in jobs {
        match job {
            Job::SettleKey((db, key)) => {
                if replication::select_db(ctx, db) {
                    let name = replication::key_string(ctx, &key);
                    if primary {
                        commands::settle_key(ctx, &name, now);
                    } else {
                        // Replicas only have LOCK.WAIT watchers, and never write.
                        commands::wake_watchers_of(ctx, &name, now);
                    }
                }
            }
            Job::CheckConfig => crate::safety::check(ctx),
            // Sessions end only on the primary; a replica's sessions died with its role.
            Job::SessionLost(_) if !primary => {}
            Job::SessionLost(client) => {
                for ((db, key), token) in sessions::disconnected(client) {
                    if replication::select_db(ctx, db) {
                        commands::end_session(
                            ctx,
                            &replication::key_string(ctx, &key),
                            &token,
                            now,
                        );
                    }
                }
            }
        }
    }
    replication::select_db(ctx, original_db);
}
