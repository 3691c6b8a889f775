//! Configurations under which locks can be lost silently: an eviction policy that may delete
//! lock keys, and a server that persists nothing. Checked at load and whenever the server's
//! configuration changes; logged and shown in `INFO lock`.

use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::Context;

use crate::host;
use crate::host::server::{info_field, persistence};

/// `maxmemory-policy` is an `allkeys-*` policy: under memory pressure lock keys can vanish.
static EVICTION_RISK: AtomicBool = AtomicBool::new(false);
/// Neither AOF nor RDB save points: a restart loses every lock and its fence.
static NO_PERSISTENCE: AtomicBool = AtomicBool::new(false);

pub fn eviction_risk() -> bool {
    EVICTION_RISK.load(Ordering::Relaxed)
}

pub fn no_persistence() -> bool {
    NO_PERSISTENCE.load(Ordering::Relaxed)
}

/// True for policies that may evict keys without a TTL (lock keys have none).
pub fn policy_evicts_locks(policy: &str) -> bool {
    policy.starts_with("allkeys-")
}

/// Reads the relevant settings, updates the flags and logs a warning for each newly found risk.
/// Nothing here runs a command (no CONFIG GET through RM_Call): the module leaves no trace in
/// SLOWLOG, MONITOR or INFO commandstats.
pub fn check(ctx: &Context) {
    if let Some(policy) = info_field(ctx, c"memory", c"maxmemory_policy") {
        let risky = policy_evicts_locks(&policy);
        if risky && !EVICTION_RISK.swap(true, Ordering::Relaxed) {
            host::log_warning(&format!(
                "lock module: maxmemory-policy {policy} can evict lock keys, and an evicted lock \
                 is silently free: set maxmemory-policy to noeviction or a volatile-* policy"
            ));
        }
        EVICTION_RISK.store(risky, Ordering::Relaxed);
    }
    let (aof, save_points) = persistence(ctx);
    let off = !aof && !save_points;
    if off && !NO_PERSISTENCE.swap(true, Ordering::Relaxed) {
        host::log_warning(
            "lock module: persistence is off (appendonly no, no save points): a restart \
             loses every lock; set appendonly yes",
        );
    }
    NO_PERSISTENCE.store(off, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allkeys_policies_endanger_locks() {
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert!(policy_evicts_locks(policy));
        }
        for policy in [
            "noeviction",
            "volatile-lru",
            "volatile-ttl",
            "volatile-random",
        ] {
            assert!(!policy_evicts_locks(policy));
        }
    }
}
