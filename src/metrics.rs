//! Counters and gauges for `INFO lock`. Gauges move where state changes (value constructor,
//! Drop, hold/release transitions), so DEL, FLUSHALL, COPY, RESTORE and reloads keep them true.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct Gauge(AtomicI64);

impl Gauge {
    const fn new() -> Self {
        Gauge(AtomicI64::new(0))
    }
    pub fn add(&self, delta: i64) {
        self.0.fetch_add(delta, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Lock values in the keyspace (held or free).
pub static KEYS: Gauge = Gauge::new();
/// Lock values with a holder (including one whose lease ran out a moment ago and is about to be
/// expired).
pub static HELD: Gauge = Gauge::new();
/// Clients waiting server-side.
pub static WAITERS: Gauge = Gauge::new();

pub static ACQUIRED: Counter = Counter::new();
pub static ACQUIRE_CONTENDED: Counter = Counter::new();
pub static ACQUIRE_TIMEOUTS: Counter = Counter::new();
pub static RELEASED: Counter = Counter::new();
pub static RELEASE_MISMATCH: Counter = Counter::new();
pub static RENEWED: Counter = Counter::new();
pub static RENEW_FAILED: Counter = Counter::new();
pub static EXPIRED: Counter = Counter::new();
pub static FORCED: Counter = Counter::new();
pub static SESSION_RELEASED: Counter = Counter::new();
pub static FENCE_CHECKS: Counter = Counter::new();
pub static FENCE_REJECTS: Counter = Counter::new();

/// The fields of `INFO lock`, in order, without the `lock_` prefix Redis adds.
pub fn fields() -> [(&'static str, i64); 15] {
    let c = |counter: &Counter| i64::try_from(counter.get()).unwrap_or(i64::MAX);
    [
        ("held", HELD.get()),
        ("waiters", WAITERS.get()),
        ("keys", KEYS.get()),
        ("acquired", c(&ACQUIRED)),
        ("acquire_contended", c(&ACQUIRE_CONTENDED)),
        ("acquire_timeouts", c(&ACQUIRE_TIMEOUTS)),
        ("released", c(&RELEASED)),
        ("release_mismatch", c(&RELEASE_MISMATCH)),
        ("renewed", c(&RENEWED)),
        ("renew_failed", c(&RENEW_FAILED)),
        ("expired", c(&EXPIRED)),
        ("forced", c(&FORCED)),
        ("session_released", c(&SESSION_RELEASED)),
        ("fence_checks", c(&FENCE_CHECKS)),
        ("fence_rejects", c(&FENCE_REJECTS)),
    ]
}
