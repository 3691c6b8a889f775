//! The fence floor: the largest fence this server has issued or seen, for any key. Every new
//! fence exceeds it, so fences keep growing across DEL and re-creation of a key, and across
//! reloads (the floor travels as RDB aux data and as `LOCK.FLOOR` in the AOF).

use std::sync::atomic::{AtomicU64, Ordering};

static FLOOR: AtomicU64 = AtomicU64::new(0);

/// The current floor.
pub fn get() -> u64 {
    FLOOR.load(Ordering::Relaxed)
}

/// Raises the floor to `fence` (a fence issued here or received with a lock); it never goes down.
pub fn raise(fence: u64) {
    FLOOR.fetch_max(fence, Ordering::Relaxed);
}
