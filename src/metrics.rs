//! Counters, gauges and latency histograms for `INFO lock`. Gauges move where state changes
//! (value constructor, Drop, hold/release transitions), so DEL, FLUSHALL, COPY, RESTORE and
//! reloads keep them true.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Instant;

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
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

/// Values below this many µs get a bucket each; above, every power of two is split into
/// `SUB_BUCKETS` equal parts, so a quantile is off by at most 1/16 of its value.
const EXACT: u64 = 16;
const SUB_BITS: u32 = 3;
const SUB_BUCKETS: usize = 1 << SUB_BITS;
const BUCKETS: usize = EXACT as usize + (64 - 4) * SUB_BUCKETS;

/// The most bounds of a histogram's cumulative buckets (see [`Histogram::cumulative`]).
const MAX_BOUNDS: usize = 15;

/// A log-linear histogram of durations in µs: lock-free, O(1) to record, a few hundred atomics.
/// Beside it, counts per fixed bound in ms and the sum, which INFO shows as cumulative buckets
/// that Prometheus can add up across servers.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    max: AtomicU64,
    /// Upper bounds in ms, increasing; a last, unbounded bucket follows.
    bounds: &'static [u64],
    /// Samples per bound (not cumulative): `at_most[i]` counts those above `bounds[i - 1]` and
    /// at most `bounds[i]`; the one after the last bound counts the rest.
    at_most: [AtomicU64; MAX_BOUNDS + 1],
    sum_us: AtomicU64,
}

fn bucket_of(value: u64) -> usize {
    if value < EXACT {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    let sub = (value >> (exponent - SUB_BITS)) as usize & (SUB_BUCKETS - 1);
    EXACT as usize + (exponent as usize - 4) * SUB_BUCKETS + sub
}

/// The middle of a bucket's range.
fn value_of(bucket: usize) -> u64 {
    if bucket < EXACT as usize {
        return bucket as u64;
    }
    let exponent = (bucket - EXACT as usize) / SUB_BUCKETS + 4;
    let sub = ((bucket - EXACT as usize) % SUB_BUCKETS) as u64;
    let width = 1u64 << (exponent - SUB_BITS as usize);
    (1u64 << exponent) + sub * width + width / 2
}

impl Histogram {
    /// A histogram whose cumulative buckets end at `bounds` (ms, increasing, at most
    /// [`MAX_BOUNDS`] of them).
    pub const fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; BUCKETS],
            max: AtomicU64::new(0),
            bounds,
            at_most: [const { AtomicU64::new(0) }; MAX_BOUNDS + 1],
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn record(&self, micros: u64) {
        self.buckets[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(micros, Ordering::Relaxed);
        let bounds = &self.bounds[..self.bounds.len().min(MAX_BOUNDS)];
        let slot = bounds.partition_point(|ms| ms.saturating_mul(1000) < micros);
        self.at_most[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(micros, Ordering::Relaxed);
    }

    /// The cumulative buckets: per bound (ms), the samples at most that long, then every sample
    /// (the `+Inf` bucket, equal to the count).
    pub fn cumulative(&self) -> Vec<(Option<u64>, u64)> {
        let bounds = &self.bounds[..self.bounds.len().min(MAX_BOUNDS)];
        let mut total = 0;
        let mut out = Vec::with_capacity(bounds.len() + 1);
        for (slot, bound) in bounds.iter().map(Some).chain([None]).enumerate() {
            total += self.at_most[slot].load(Ordering::Relaxed);
            out.push((bound.copied(), total));
        }
        out
    }

    /// The sum of all samples, in ms.
    pub fn sum_ms(&self) -> u64 {
        self.sum_us.load(Ordering::Relaxed) / 1000
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The value below which a fraction `q` of the samples fall (0 when empty).
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        if rank == total {
            return self.max();
        }
        let mut seen = 0;
        for (bucket, count) in self.buckets.iter().enumerate() {
            seen += count.load(Ordering::Relaxed);
            if seen >= rank {
                return value_of(bucket).min(self.max());
            }
        }
        self.max()
    }
}

static MONOTONIC_EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Monotonic time in µs since the module first asked: for durations only.
pub fn monotonic_us() -> u64 {
    u64::try_from(MONOTONIC_EPOCH.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// How long successful acquires waited for their grant (0-ish for an immediate grant).
pub static ACQUIRE_WAIT: Histogram =
    Histogram::new(&[1, 5, 10, 50, 100, 500, 1_000, 5_000, 10_000, 30_000, 60_000]);
/// How long locks were held, grant to release, expiry, forced release or session end.
pub static HOLD: Histogram = Histogram::new(&[
    10, 100, 1_000, 10_000, 60_000, 300_000, 1_800_000, 3_600_000,
]);

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
/// SYNC replies sent once the replicas acknowledged, and those that gave up.
pub static SYNC_CONFIRMED: Counter = Counter::new();
pub static SYNC_FAILED: Counter = Counter::new();
/// FSYNC: the module's fdatasyncs of the AOF files (each confirms every change waiting for it),
/// and those that failed.
pub static FSYNCS: Counter = Counter::new();
pub static FSYNC_ERRORS: Counter = Counter::new();
/// Free locks deleted after `lock.tombstone-ttl`.
pub static RECLAIMED: Counter = Counter::new();
pub static FENCE_CHECKS: Counter = Counter::new();
pub static FENCE_REJECTS: Counter = Counter::new();
/// Lock-delays begun: a lease with one ran out, or its session's connection closed.
pub static DELAYED: Counter = Counter::new();
/// LOCK.GUARD: commands run under a current fence, and calls refused for a stale one.
pub static GUARDED: Counter = Counter::new();
pub static GUARD_REJECTS: Counter = Counter::new();
/// New shared holds, and new permits of semaphores (both also counted in `ACQUIRED`).
pub static SHARED_GRANTS: Counter = Counter::new();
pub static PERMIT_GRANTS: Counter = Counter::new();
/// Holds that lasted longer than `lock.long-hold`.
pub static LONG_HOLDS: Counter = Counter::new();

/// The fields of `INFO lock`, in order, without the `lock_` prefix Redis adds.
pub fn fields() -> Vec<(&'static str, i64)> {
    let c = |counter: &Counter| i64::try_from(counter.get()).unwrap_or(i64::MAX);
    let us = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    vec![
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
        ("reclaimed", c(&RECLAIMED)),
        ("sync_confirmed", c(&SYNC_CONFIRMED)),
        ("sync_failed", c(&SYNC_FAILED)),
        ("fsyncs", c(&FSYNCS)),
        ("fsync_errors", c(&FSYNC_ERRORS)),
        ("fence_checks", c(&FENCE_CHECKS)),
        ("fence_rejects", c(&FENCE_REJECTS)),
        ("delayed", c(&DELAYED)),
        ("guarded", c(&GUARDED)),
        ("guard_rejects", c(&GUARD_REJECTS)),
        ("shared_grants", c(&SHARED_GRANTS)),
        ("permit_grants", c(&PERMIT_GRANTS)),
        ("acquire_wait_p50_us", us(ACQUIRE_WAIT.quantile(0.5))),
        ("acquire_wait_p99_us", us(ACQUIRE_WAIT.quantile(0.99))),
        ("acquire_wait_max_us", us(ACQUIRE_WAIT.max())),
        ("hold_p50_us", us(HOLD.quantile(0.5))),
        ("hold_p99_us", us(HOLD.quantile(0.99))),
        ("hold_max_us", us(HOLD.max())),
        ("long_holds", c(&LONG_HOLDS)),
    ]
}

/// The cumulative buckets of a histogram as INFO fields named `<name>_bucket_le_<ms>` (the last
/// `_le_inf`), then `<name>_sum` and `<name>_count`.
pub fn bucket_fields(name: &str, histogram: &Histogram) -> Vec<(String, i64)> {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let buckets = histogram.cumulative();
    let count = buckets.last().map_or(0, |(_, total)| *total);
    let mut fields: Vec<(String, i64)> = buckets
        .into_iter()
        .map(|(bound, total)| {
            let le = bound.map_or_else(|| "inf".to_string(), |ms| ms.to_string());
            (format!("{name}_bucket_le_{le}"), n(total))
        })
        .collect();
    fields.push((format!("{name}_sum"), n(histogram.sum_ms())));
    fields.push((format!("{name}_count"), n(count)));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_all_values_in_order() {
        let mut last = 0;
        for value in (0..5000).chain([u64::MAX / 2, u64::MAX]) {
            let bucket = bucket_of(value);
            assert!(bucket < BUCKETS && bucket >= last, "{value}");
            last = bucket;
        }
    }

    #[test]
    fn bucket_midpoints_are_within_a_sixteenth() {
        for value in [16u64, 17, 100, 1_000, 12_345, 1 << 20, 987_654_321] {
            let mid = value_of(bucket_of(value));
            let error = mid.abs_diff(value) as f64 / value as f64;
            assert!(error <= 1.0 / 16.0, "{value} -> {mid}");
        }
        for value in 0..16 {
            assert_eq!(value_of(bucket_of(value)), value);
        }
    }

    #[test]
    fn cumulative_buckets_count_each_sample_at_its_bound_and_above() {
        let h = Histogram::new(&[1, 10]);
        for micros in [0, 1_000, 1_001, 10_000, 50_000] {
            h.record(micros);
        }
        assert_eq!(h.cumulative(), [(Some(1), 2), (Some(10), 4), (None, 5)]);
        assert_eq!(h.sum_ms(), 62);
        let fields = bucket_fields("wait_ms", &h);
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "wait_ms_bucket_le_1",
                "wait_ms_bucket_le_10",
                "wait_ms_bucket_le_inf",
                "wait_ms_sum",
                "wait_ms_count"
            ]
        );
        assert_eq!(fields[4].1, 5);
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let h = Histogram::new(&[]);
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000 {
            h.record(v);
        }
        assert_eq!(h.count(), 1000);
        assert_eq!(h.max(), 1000);
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        assert!((470..=530).contains(&p50), "{p50}");
        assert!((930..=1000).contains(&p99), "{p99}");
        h.record(5_000_000);
        assert_eq!(h.max(), 5_000_000);
        assert_eq!(h.quantile(1.0), 5_000_000);
    }
}
