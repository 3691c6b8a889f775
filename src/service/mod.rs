//! The lock service: the commands, server-side waiting and hand-off, lease expiry, replicated
//! effects and the work deferred out of event callbacks. It joins the pure lock layer
//! (`crate::lock`) to the server through the host layer (`crate::host`).
//!
//! Imports go one way, from the top of this list to the bottom:
//! - `events`: what server events and keyspace notifications mean; defers work to
//! - `deferred`: jobs run from a timer (settle waiters, end sessions, check the config);
//! - `expiry`: the lease timer's handler, the index rebuild and the slots being imported;
//! - `commands` (with `args`): the LOCK.* commands; `guard`: LOCK.GUARD, a command run under a
//!   fence; `multi`: LOCK.MACQUIRE and LOCK.MRELEASE, several keys at once; `who`: LOCK.WHO,
//!   who holds a lock and who waits;
//! - `handoff`: blocking and serving waiters;
//! - `acks`: replies that wait for replicas (SYNC) or the AOF's fsync (FSYNC, with `fsync`);
//! - `change`: a change of a stored lock and what follows it;
//! - `waiters`: the queues of waiting clients;
//! - `effects`: announcing and replicating a change;
//! - `holds`: the ages of holds, long holds and their log (LOCK.LONGHOLDS);
//! - `leases`: the lease index and its timer;
//! - `value`: the value behind a lock key and its data type;
//! - `safety`: configurations that endanger locks; `audit`: the audit log.

pub mod acks;
pub mod args;
pub mod audit;
pub mod change;
pub mod commands;
pub mod deferred;
pub mod effects;
pub mod events;
pub mod expiry;
pub mod fsync;
pub mod guard;
pub mod handoff;
pub mod holds;
pub mod leases;
pub mod list;
pub mod multi;
pub mod policy;
pub mod safety;
pub mod value;
pub mod waiters;
pub mod who;

use crate::config;
use crate::host::info::{Fields, Section};
use crate::lock::ages::tag_text;
use crate::metrics;

/// `INFO lock`: the version, the metrics with the ages of the oldest hold and wait, the
/// histograms' cumulative buckets, then the safety warnings.
pub struct Info;

/// The age of the oldest waiter in ms (0 when nobody waits) and its key's tag.
fn oldest_wait() -> (u64, String) {
    match waiters::queues().oldest() {
        Some((since, tag)) => (
            u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
            tag_text(tag),
        ),
        None => (0, String::new()),
    }
}

impl Section for Info {
    fn fields() -> Fields {
        let (hold_age, hold_tag) = holds::oldest();
        let (wait_age, wait_tag) = oldest_wait();
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut fields: Vec<(String, i64)> = metrics::fields()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect();
        // Beside the gauges: the lease index's entries, at most one per lock key, and the ages
        // of the oldest hold and waiter.
        let after_gauges = fields
            .iter()
            .position(|(name, _)| name == "keys")
            .map_or(0, |i| i + 1);
        let beside_gauges = [
            ("index_entries", n(leases::entries() as u64)),
            ("oldest_hold_ms", n(hold_age)),
            ("oldest_wait_ms", n(wait_age)),
            ("long_hold_ms", config::LONG_HOLD.get()),
        ];
        for (at, (name, value)) in beside_gauges.into_iter().enumerate() {
            fields.insert(after_gauges + at, (name.to_string(), value));
        }
        fields.extend(metrics::bucket_fields(
            "acquire_wait_ms",
            &metrics::ACQUIRE_WAIT,
        ));
        fields.extend(metrics::bucket_fields("hold_ms", &metrics::HOLD));
        // The namespaces (service::policy): how many, and what they refused and warned about.
        let (namespaces, refused, warned) = policy::totals();
        fields.push(("namespaces".into(), n(namespaces as u64)));
        fields.push(("policy_refused".into(), n(refused)));
        fields.push(("policy_warned".into(), n(warned)));
        fields.push((
            "warning_eviction_policy".into(),
            i64::from(safety::eviction_risk()),
        ));
        fields.push((
            "warning_no_persistence".into(),
            i64::from(safety::no_persistence()),
        ));
        Fields {
            texts: vec![
                ("version", crate::VERSION.to_string()),
                ("policy_digest", policy::digest()),
                ("oldest_hold_tag", hold_tag),
                ("oldest_wait_tag", wait_tag),
            ],
            numbers: fields,
            dicts: policy::namespace_fields(holds::in_space, waiters::in_space)
                .into_iter()
                .map(|(name, entries)| (format!("namespace_{name}"), entries))
                .collect(),
        }
    }
}
