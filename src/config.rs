//! Module configuration: `CONFIG GET/SET lock.*`, also accepted as module arguments at load
//! (`loadmodule liblock.so max-ttl 60000`). Limits apply to client commands only, never to
//! effects replayed from the primary or the AOF.

use std::sync::atomic::{AtomicI64, Ordering};

/// One numeric config: its name under `lock.`, bounds, default and current value.
pub struct NumericConfig {
    pub name: &'static str,
    pub default: i64,
    pub min: i64,
    pub max: i64,
    pub value: AtomicI64,
}

impl NumericConfig {
    const fn new(name: &'static str, default: i64, min: i64, max: i64) -> Self {
        NumericConfig {
            name,
            default,
            min,
            max,
            value: AtomicI64::new(default),
        }
    }

    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }

    pub fn set(&self, value: i64) {
        self.value.store(value, Ordering::Relaxed);
    }
}

/// The longest lease a client may ask for, in ms (default one day).
pub static MAX_TTL: NumericConfig = NumericConfig::new("max-ttl", 86_400_000, 1, 31_536_000_000);
/// The longest token, in bytes.
pub static MAX_TOKEN_LEN: NumericConfig = NumericConfig::new("max-token-len", 256, 1, 65_536);
/// Waiters queued per key (server-side waiting).
pub static MAX_WAITERS: NumericConfig = NumericConfig::new("max-waiters", 1_000, 1, 1_000_000);

/// How long a free lock stays (with its last fence, for LOCK.INFO and slot migration) before it
/// is deleted, in ms; 0 deletes it at once. Default 10 s.
pub static TOMBSTONE_TTL: NumericConfig =
    NumericConfig::new("tombstone-ttl", 10_000, 0, 31_536_000_000);

/// The lock-delay of a grant that does not name one (`LOCKDELAY ms`), in ms; 0: none. When a
/// holder's lease runs out or its session's connection closes, the lock stays unavailable this
/// long (Consul's rule), so a paused holder has time to notice before anyone else starts.
pub static LOCK_DELAY: NumericConfig = NumericConfig::new("lock-delay", 0, 0, 86_400_000);

/// A hold that lasts longer than this many ms is a long hold: counted (`lock_long_holds`),
/// announced once (`lock.longhold`) and logged (`LOCK.LONGHOLDS`); 0: none is (the default).
pub static LONG_HOLD: NumericConfig = NumericConfig::new("long-hold", 0, 0, 31_536_000_000);
/// The most entries the long-hold log keeps.
pub static LONG_HOLD_LOG_LEN: NumericConfig =
    NumericConfig::new("long-hold-log-len", 128, 0, 10_000);
pub static ALL: [&NumericConfig; 7] = [
    &MAX_TTL,
    &MAX_TOKEN_LEN,
    &MAX_WAITERS,
    &TOMBSTONE_TTL,
    &LOCK_DELAY,
    &LONG_HOLD,
    &LONG_HOLD_LOG_LEN,
];

/// `lock.namespaces`, the namespaces' policy (see `crate::policy`): a string config, set in
/// redis.conf (`lock.namespaces "..."`), on the command line or by CONFIG SET, never as a module
/// argument: CONFIG REWRITE writes a module's arguments back without quotes, and a policy has
/// spaces, so the next start would refuse the module.
pub const NAMESPACES: &str = "namespaces";

/// `lock.long-hold` in ms (0: off).
pub fn long_hold() -> u64 {
    u64::try_from(LONG_HOLD.get()).unwrap_or(0)
}

/// Finds the load-time value of `config` among the module arguments (`name value` pairs,
/// with or without the `lock.` prefix). Returns the default when absent.
pub fn value_from_args(config: &NumericConfig, args: &[Vec<u8>]) -> Result<i64, String> {
    let mut found = config.default;
    let mut pairs = args.chunks(2);
    for pair in &mut pairs {
        let [name, value] = pair else {
            return Err("module arguments must be name value pairs".into());
        };
        let name = name.strip_prefix(b"lock.").unwrap_or(name);
        if !name.eq_ignore_ascii_case(config.name.as_bytes()) {
            continue;
        }
        let parsed = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|v| (config.min..=config.max).contains(v))
            .ok_or_else(|| {
                format!(
                    "lock.{} must be an integer from {} to {}",
                    config.name, config.min, config.max
                )
            })?;
        found = parsed;
    }
    Ok(found)
}

/// Rejects module arguments that name no config.
pub fn check_arg_names(args: &[Vec<u8>]) -> Result<(), String> {
    for pair in args.chunks(2) {
        let name = pair[0].strip_prefix(b"lock.").unwrap_or(&pair[0]);
        if name.eq_ignore_ascii_case(NAMESPACES.as_bytes()) {
            return Err(format!(
                "lock.{NAMESPACES} is not a module argument: set it with a lock.{NAMESPACES} line \
                 in redis.conf, --lock.{NAMESPACES} on the command line, or CONFIG SET"
            ));
        }
        if !ALL
            .iter()
            .any(|c| name.eq_ignore_ascii_case(c.name.as_bytes()))
        {
            return Err(format!(
                "unknown module argument '{}'",
                String::from_utf8_lossy(&pair[0])
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn module_args_set_defaults_with_or_without_prefix() {
        assert_eq!(
            value_from_args(&MAX_TTL, &args(&["max-ttl", "5000"])),
            Ok(5000)
        );
        assert_eq!(
            value_from_args(&MAX_TTL, &args(&["lock.max-ttl", "7"])),
            Ok(7)
        );
        assert_eq!(value_from_args(&MAX_TTL, &args(&[])), Ok(86_400_000));
    }

    #[test]
    fn module_args_out_of_range_or_unknown_are_refused() {
        assert!(value_from_args(&MAX_TTL, &args(&["max-ttl", "0"])).is_err());
        assert!(value_from_args(&MAX_TTL, &args(&["max-ttl", "x"])).is_err());
        assert!(value_from_args(&MAX_TTL, &args(&["max-ttl"])).is_err());
        assert!(check_arg_names(&args(&["max-tll", "5"])).is_err());
        assert!(check_arg_names(&args(&["max-waiters", "5", "lock.max-token-len", "9"])).is_ok());
    }
}
