//! The fence floor: the largest fence this server has issued or seen, for any key. Every new
//! fence exceeds it, so fences keep growing across DEL and re-creation of a key, and across
//! reloads (the floor travels as RDB aux data and as `LOCK.FLOOR` in the AOF).
//!
//! A fence is at least the wall clock term (see `core::next_fence`), and only more than about
//! 2048 grants per millisecond could carry the counter ahead of it. So a fence far ahead of the
//! clock did not come from a grant: it came from a crafted value (RESTORE) or a file written by
//! a server whose clock was far off. Such a fence must not lift the floor for every other key,
//! where it would take their fence space with it: a fence above [`plausible_limit`] leaves the
//! floor as it is (its own key still goes on from it), and RESTORE refuses values above it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lock::core::{FENCE_CLOCK_SHIFT, MAX_FENCE};

/// How far ahead of the clock a fence may be and still be believed: one year.
pub const MAX_LEAD_MS: u64 = 365 * 86_400_000;

static FLOOR: AtomicU64 = AtomicU64::new(0);

/// The current floor.
pub fn get() -> u64 {
    FLOOR.load(Ordering::Relaxed)
}

/// The largest fence believed at `now` (ms since the epoch): the clock term a year from now.
pub fn plausible_limit(now: u64) -> u64 {
    now.saturating_add(MAX_LEAD_MS)
        .checked_shl(FENCE_CLOCK_SHIFT)
        .filter(|v| v >> FENCE_CLOCK_SHIFT == now.saturating_add(MAX_LEAD_MS))
        .map_or(MAX_FENCE, |v| v.min(MAX_FENCE))
}

/// True when `fence` could have been issued by a server whose clock is within a year of `now`.
pub fn is_plausible(fence: u64, now: u64) -> bool {
    fence <= plausible_limit(now)
}

/// Raises the floor to `fence` (issued here or received with a lock), unless `fence` is beyond
/// [`plausible_limit`]; the floor never goes down.
pub fn raise(fence: u64, now: u64) {
    if is_plausible(fence, now) {
        FLOOR.fetch_max(fence, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_000_000_000;

    #[test]
    fn the_limit_is_the_clock_term_a_year_ahead() {
        assert_eq!(plausible_limit(T0), (T0 + MAX_LEAD_MS) << FENCE_CLOCK_SHIFT);
        assert!(is_plausible((T0 + MAX_LEAD_MS) << FENCE_CLOCK_SHIFT, T0));
        assert!(!is_plausible(
            ((T0 + MAX_LEAD_MS) << FENCE_CLOCK_SHIFT) + 1,
            T0
        ));
        assert_eq!(plausible_limit(u64::MAX), MAX_FENCE);
        assert_eq!(plausible_limit(1 << 60), MAX_FENCE);
    }

    #[test]
    fn a_fence_beyond_the_limit_leaves_the_floor_alone() {
        let limit = plausible_limit(T0);
        raise(MAX_FENCE, T0);
        raise(limit + 1, T0);
        assert!(get() <= limit);
        raise(limit, T0);
        assert_eq!(get(), limit);
    }
}
