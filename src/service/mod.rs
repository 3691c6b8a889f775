//! The lock service: the commands, server-side waiting and hand-off, lease expiry, replicated
//! effects and the work deferred out of event callbacks. It joins the pure lock layer
//! (`crate::lock`) to the server through the host layer (`crate::host`).
//!
//! Imports go one way, from the top of this list to the bottom:
//! - `events`: what server events and keyspace notifications mean; defers work to
//! - `deferred`: jobs run from a timer (settle waiters, end sessions, check the config);
//! - `expiry`: the lease timer's handler, the index rebuild and the slots being imported;
//! - `commands` (with `args`): the LOCK.* commands; `guard`: LOCK.GUARD, a command run under a
//!   fence; `multi`: LOCK.MACQUIRE and LOCK.MRELEASE, several keys at once;
//! - `handoff`: blocking and serving waiters;
//! - `acks`: replies that wait for replicas (SYNC);
//! - `change`: a change of a stored lock and what follows it;
//! - `waiters`: the queues of waiting clients;
//! - `effects`: announcing and replicating a change;
//! - `leases`: the lease index and its timer;
//! - `value`: the value behind a lock key and its data type;
//! - `safety`: configurations that endanger locks.

pub mod acks;
pub mod args;
pub mod change;
pub mod commands;
pub mod deferred;
pub mod effects;
pub mod events;
pub mod expiry;
pub mod guard;
pub mod handoff;
pub mod leases;
pub mod multi;
pub mod safety;
pub mod value;
pub mod waiters;

use crate::host::info::Section;
use crate::metrics;

/// `INFO lock`: the metrics, then the safety warnings.
pub struct Info;

impl Section for Info {
    fn fields() -> Vec<(&'static str, i64)> {
        let mut fields = metrics::fields();
        // Beside the gauges: the lease index's entries, at most two per lock key.
        let entries = i64::try_from(leases::entries()).unwrap_or(i64::MAX);
        let after_gauges = fields
            .iter()
            .position(|(name, _)| *name == "keys")
            .map_or(0, |i| i + 1);
        fields.insert(after_gauges, ("index_entries", entries));
        fields.push((
            "warning_eviction_policy",
            i64::from(safety::eviction_risk()),
        ));
        fields.push((
            "warning_no_persistence",
            i64::from(safety::no_persistence()),
        ));
        fields
    }
}
