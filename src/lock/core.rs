//! The lock semantics, free of any Redis API: holder, token, fence, lease deadline and hold count.
//!
//! Time is always passed in (`now`, milliseconds since the Unix epoch), so every rule here is
//! tested deterministically without a server. The module layer (`commands`, `replication`,
//! `expiry`) calls these functions and turns their outcomes into replies, notifications and
//! replicated effects.

/// How many fences fit into one millisecond of the fence clock (see [`next_fence`]).
pub const FENCE_CLOCK_SHIFT: u32 = 11;

/// The largest fence ever handed out: RESP integers are signed 64-bit.
pub const MAX_FENCE: u64 = i64::MAX as u64;

/// Who holds a lock, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub token: Box<[u8]>,
    /// Absolute lease deadline, ms since the Unix epoch.
    pub deadline: u64,
    /// Reentrant hold count, at least 1.
    pub holds: u32,
    /// Released when the acquiring connection closes.
    pub session: bool,
    /// The lock-delay this grant imposes when it ends without a release (its lease ran out or
    /// its session's connection closed), in ms; 0: none.
    pub delay: u64,
}

/// The value stored under a lock key. A released lock keeps its key (a tombstone) so the last
/// fence travels with the key through RDB, AOF, replication, DUMP/RESTORE and MIGRATE.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lock {
    /// The fence of the latest grant; 0 only for a value that never had one.
    pub fence: u64,
    pub holder: Option<Holder>,
    /// A free lock whose last holder ended with a lock-delay: no grant before this time (ms
    /// since the epoch); 0 when there was none. Only meaningful while free.
    pub delayed_until: u64,
}

/// What a grant request asks for.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub token: &'a [u8],
    pub ttl: u64,
    pub reentrant: bool,
    pub session: bool,
    /// The lock-delay the grant imposes if it ends without a release (ms; 0: none).
    pub delay: u64,
}

/// What a grant request turned into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A new grant with a new fence.
    Granted { fence: u64 },
    /// The same token already held it: lease refreshed, fence unchanged.
    Refreshed { fence: u64 },
    /// Someone else holds it.
    Busy,
}

/// The fence space is used up (only reachable with a clock set hundreds of millennia ahead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceExhausted;

/// The next fence for a key: strictly above the key's last fence and above `floor`, the largest
/// fence this server has issued or seen for any key; and at least the wall clock shifted left by
/// [`FENCE_CLOCK_SHIFT`]. The floor makes fences grow across release, expiry, DEL and reload on
/// one server; the clock term makes a fence issued after a failover (or after a key was deleted
/// and the server lost its floor) exceed the fences issued before it, as long as clocks are
/// roughly in step. Fences stay below 2^53 until the year 2109, so JavaScript clients compare
/// them exactly.
pub fn next_fence(floor: u64, key_fence: u64, now: u64) -> Result<u64, FenceExhausted> {
    let by_counter = floor.max(key_fence).checked_add(1).ok_or(FenceExhausted)?;
    let by_clock = now
        .checked_shl(FENCE_CLOCK_SHIFT)
        .filter(|v| v >> FENCE_CLOCK_SHIFT == now);
    let fence = by_counter.max(by_clock.unwrap_or(MAX_FENCE));
    if fence > MAX_FENCE {
        return Err(FenceExhausted);
    }
    Ok(fence)
}

/// `now + ttl` without overflow.
pub fn deadline_after(now: u64, ttl: u64) -> u64 {
    now.saturating_add(ttl)
}

impl Lock {
    /// The holder, if the lease has not run out at `now`.
    pub fn live_holder(&self, now: u64) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.deadline > now)
    }

    pub fn is_held(&self, now: u64) -> bool {
        self.live_holder(now).is_some()
    }

    /// A holder whose deadline has passed but who has not been removed yet.
    pub fn is_overdue(&self, now: u64) -> bool {
        self.holder.as_ref().is_some_and(|h| h.deadline <= now)
    }

    fn live_holder_mut(&mut self, token: &[u8], now: u64) -> Option<&mut Holder> {
        self.holder
            .as_mut()
            .filter(|h| h.deadline > now && *h.token == *token)
    }

    /// Removes a holder whose lease ran out. Returns true when it did: the caller announces
    /// `lock.expired` and replicates the release. A grant with a lock-delay leaves the lock
    /// unavailable until its deadline plus the delay.
    pub fn expire(&mut self, now: u64) -> bool {
        if self.is_overdue(now) {
            if let Some(holder) = self.holder.take() {
                self.start_delay(holder.deadline, holder.delay);
            }
            return true;
        }
        false
    }

    fn start_delay(&mut self, from: u64, delay: u64) {
        self.delayed_until = if delay == 0 {
            0
        } else {
            from.saturating_add(delay)
        };
    }

    /// Until when no new grant may be made: the running lock-delay's end, counting the one an
    /// overdue holder (not yet expired) would start; 0 when none.
    fn blocked_until(&self, now: u64) -> u64 {
        match &self.holder {
            Some(h) if h.deadline <= now && h.delay > 0 => h.deadline.saturating_add(h.delay),
            Some(_) => 0,
            None => self.delayed_until,
        }
    }

    /// Remaining ms of a running lock-delay, or `None` when there is none at `now`.
    pub fn delay_ttl(&self, now: u64) -> Option<u64> {
        let until = self.blocked_until(now);
        (until > now && !self.is_held(now)).then(|| until - now)
    }

    /// True when a new grant can be made at `now`: nobody holds it, and no lock-delay runs.
    pub fn is_available(&self, now: u64) -> bool {
        !self.is_held(now) && self.delay_ttl(now).is_none()
    }

    /// Ends a running lock-delay at once (LOCK.FORCERELEASE). True when one was running.
    pub fn clear_delay(&mut self, now: u64) -> bool {
        let running = self.holder.is_none() && self.delayed_until > now;
        if self.holder.is_none() {
            self.delayed_until = 0;
        }
        running
    }

    /// Grants the lock to `token` when it is free, or refreshes the lease when `token` already
    /// holds it. The caller must have called [`Lock::expire`] first when it wants an overdue
    /// holder removed with its own announcement; an overdue holder counts as free here anyway.
    pub fn acquire(
        &mut self,
        token: &[u8],
        ttl: u64,
        reentrant: bool,
        session: bool,
        floor: u64,
        now: u64,
    ) -> Result<Acquire, FenceExhausted> {
        let request = Request {
            token,
            ttl,
            reentrant,
            session,
            delay: 0,
        };
        self.grant(&request, floor, now)
    }

    /// [`Lock::acquire`] with every option of the request, the lock-delay included. A running
    /// lock-delay keeps the lock busy for every token; a refresh by the holder takes the
    /// request's lock-delay as its own.
    pub fn grant(
        &mut self,
        request: &Request,
        floor: u64,
        now: u64,
    ) -> Result<Acquire, FenceExhausted> {
        let deadline = deadline_after(now, request.ttl);
        let fence = self.fence;
        if let Some(holder) = self.live_holder_mut(request.token, now) {
            holder.deadline = deadline;
            if request.reentrant {
                holder.holds = holder.holds.saturating_add(1);
            }
            holder.session |= request.session;
            holder.delay = request.delay;
            return Ok(Acquire::Refreshed { fence });
        }
        if !self.is_available(now) {
            return Ok(Acquire::Busy);
        }
        let fence = next_fence(floor, self.fence, now)?;
        self.fence = fence;
        self.delayed_until = 0;
        self.holder = Some(Holder {
            token: request.token.into(),
            deadline,
            holds: 1,
            session: request.session,
            delay: request.delay,
        });
        Ok(Acquire::Granted { fence })
    }

    /// Drops one hold of `token`. Returns `None` when `token` does not hold the lock, otherwise
    /// whether the lock is now free.
    pub fn release(&mut self, token: &[u8], now: u64) -> Option<bool> {
        let holder = self.live_holder_mut(token, now)?;
        if holder.holds > 1 {
            holder.holds -= 1;
            return Some(false);
        }
        self.holder = None;
        Some(true)
    }

    /// Moves the deadline of `token`'s lease to `now + ttl`. False when `token` does not hold it.
    pub fn renew(&mut self, token: &[u8], ttl: u64, now: u64) -> bool {
        match self.live_holder_mut(token, now) {
            Some(holder) => {
                holder.deadline = deadline_after(now, ttl);
                true
            }
            None => false,
        }
    }

    /// Frees a session lock held by `token` entirely (its connection closed), starting its
    /// lock-delay if it has one. True when it did.
    pub fn end_session(&mut self, token: &[u8], now: u64) -> bool {
        if self.live_holder_mut(token, now).is_some_and(|h| h.session) {
            if let Some(holder) = self.holder.take() {
                self.start_delay(now, holder.delay);
            }
            return true;
        }
        false
    }

    /// Frees the lock whoever holds it. True when it was held at `now`.
    pub fn force_release(&mut self, now: u64) -> bool {
        let was_held = self.is_held(now);
        if was_held {
            self.holder = None;
        }
        was_held
    }

    /// Takes back the grant with `fence` from `token` (all its holds), when that grant is the
    /// current one: a grant its replicas never acknowledged. True when it did.
    pub fn revoke(&mut self, token: &[u8], fence: u64, now: u64) -> bool {
        let current = self.fence == fence && self.live_holder_mut(token, now).is_some();
        if current {
            self.holder = None;
        }
        current
    }

    /// True when `fence` is the fence of the current, unexpired holder.
    pub fn fence_is_current(&self, fence: u64, now: u64) -> bool {
        self.is_held(now) && self.fence == fence
    }

    /// Remaining lease in ms, or `None` when free.
    pub fn ttl(&self, now: u64) -> Option<u64> {
        self.live_holder(now).map(|h| h.deadline - now)
    }

    /// Heap bytes this lock owns beyond its own size (the token), for MEMORY USAGE.
    pub fn heap_bytes(&self) -> usize {
        self.holder.as_ref().map_or(0, |h| h.token.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_000_000_000;

    fn granted(r: Result<Acquire, FenceExhausted>) -> u64 {
        match r {
            Ok(Acquire::Granted { fence }) => fence,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn first_grant_gets_a_clock_based_fence() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert_eq!(fence, T0 << FENCE_CLOCK_SHIFT);
        assert_eq!(lock.ttl(T0), Some(1000));
        assert!(lock.fence_is_current(fence, T0));
    }

    #[test]
    fn fences_stay_exact_in_a_double_until_2109() {
        let year_2109 = 4_386_000_000_000u64;
        let fence = next_fence(0, 0, year_2109).unwrap_or(0);
        assert!(fence < 1 << 53, "{fence}");
    }

    #[test]
    fn fence_exceeds_floor_and_key_even_when_clock_is_behind() {
        assert_eq!(
            next_fence(u64::from(u32::MAX) << 20, 5, 1),
            Ok((u64::from(u32::MAX) << 20) + 1)
        );
        assert_eq!(next_fence(3, 9, 0), Ok(10));
        assert_eq!(next_fence(MAX_FENCE, 0, T0), Err(FenceExhausted));
        assert_eq!(next_fence(u64::MAX, 0, T0), Err(FenceExhausted));
        assert_eq!(next_fence(0, 0, u64::MAX), Ok(MAX_FENCE));
    }

    #[test]
    fn busy_lock_refuses_another_token() {
        let mut lock = Lock::default();
        granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert_eq!(
            lock.acquire(b"b", 1000, false, false, 0, T0 + 1),
            Ok(Acquire::Busy)
        );
        assert_eq!(lock.holder.as_ref().map(|h| &*h.token), Some(&b"a"[..]));
    }

    #[test]
    fn same_token_refreshes_lease_and_keeps_fence() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert_eq!(
            lock.acquire(b"a", 5000, false, false, fence, T0 + 500),
            Ok(Acquire::Refreshed { fence })
        );
        assert_eq!(lock.ttl(T0 + 500), Some(5000));
        assert_eq!(lock.holder.as_ref().map(|h| h.holds), Some(1));
    }

    #[test]
    fn reentrant_acquire_counts_holds_and_release_drops_them_one_by_one() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, true, false, 0, T0));
        lock.acquire(b"a", 1000, true, false, fence, T0).ok();
        lock.acquire(b"a", 1000, true, false, fence, T0).ok();
        assert_eq!(lock.holder.as_ref().map(|h| h.holds), Some(3));
        assert_eq!(lock.release(b"a", T0), Some(false));
        assert_eq!(lock.release(b"a", T0), Some(false));
        assert_eq!(lock.release(b"a", T0), Some(true));
        assert_eq!(lock.release(b"a", T0), None);
        assert!(!lock.is_held(T0));
        assert_eq!(lock.fence, fence);
    }

    #[test]
    fn release_with_wrong_token_keeps_lock() {
        let mut lock = Lock::default();
        granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert_eq!(lock.release(b"b", T0), None);
        assert!(lock.is_held(T0));
    }

    #[test]
    fn expired_lease_counts_as_free_everywhere() {
        let mut lock = Lock::default();
        let first = granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        let at = T0 + 1000;
        assert!(!lock.is_held(at));
        assert!(!lock.fence_is_current(first, at));
        assert_eq!(lock.release(b"a", at), None);
        assert!(!lock.renew(b"a", 1000, at));
        assert_eq!(lock.ttl(at), None);
        assert!(lock.is_overdue(at));
        let second = granted(lock.acquire(b"b", 1000, false, false, first, at));
        assert!(second > first);
    }

    #[test]
    fn expire_removes_only_overdue_holders() {
        let mut lock = Lock::default();
        granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert!(!lock.expire(T0 + 999));
        assert!(lock.expire(T0 + 1000));
        assert!(!lock.expire(T0 + 1000));
        assert_eq!(lock.holder, None);
    }

    #[test]
    fn renew_moves_deadline_only_for_holder() {
        let mut lock = Lock::default();
        granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert!(lock.renew(b"a", 3000, T0 + 900));
        assert_eq!(lock.ttl(T0 + 900), Some(3000));
        assert!(!lock.renew(b"b", 3000, T0 + 900));
        assert_eq!(lock.ttl(T0 + 900), Some(3000));
    }

    #[test]
    fn force_release_frees_any_holder_and_next_grant_has_larger_fence() {
        let mut lock = Lock::default();
        let first = granted(lock.acquire(b"a", 1000, true, false, 0, T0));
        lock.acquire(b"a", 1000, true, false, first, T0).ok();
        assert!(lock.force_release(T0));
        assert!(!lock.force_release(T0));
        let second = granted(lock.acquire(b"b", 1000, false, false, first, T0));
        assert_eq!(second, first + 1);
    }

    #[test]
    fn fences_strictly_increase_over_many_grants_at_one_instant() {
        let mut lock = Lock::default();
        let mut floor = 0;
        for _ in 0..10_000 {
            let fence = granted(lock.acquire(b"a", 10, false, false, floor, T0));
            assert!(fence > floor);
            floor = fence;
            assert_eq!(lock.release(b"a", T0), Some(true));
        }
        assert_eq!(floor, (T0 << FENCE_CLOCK_SHIFT) + 9_999);
    }

    #[test]
    fn fence_check_needs_current_fence() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        assert!(lock.fence_is_current(fence, T0));
        assert!(!lock.fence_is_current(fence - 1, T0));
        assert!(!lock.fence_is_current(fence + 1, T0));
        lock.release(b"a", T0);
        assert!(!lock.fence_is_current(fence, T0));
    }

    #[test]
    fn deadline_saturates_instead_of_wrapping() {
        assert_eq!(deadline_after(u64::MAX - 1, 10), u64::MAX);
    }

    #[test]
    fn session_end_frees_all_holds_of_a_session_lock_only() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, true, true, 0, T0));
        lock.acquire(b"a", 1000, true, false, fence, T0).ok();
        assert!(!lock.end_session(b"b", T0));
        assert!(lock.end_session(b"a", T0));
        assert_eq!(lock.holder, None);
        granted(lock.acquire(b"c", 1000, false, false, fence, T0));
        assert!(!lock.end_session(b"c", T0));
        assert!(lock.is_held(T0));
    }

    #[test]
    fn revoke_takes_back_only_that_grant_of_that_token() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, true, false, 0, T0));
        lock.acquire(b"a", 1000, true, false, fence, T0).ok();
        assert!(!lock.revoke(b"b", fence, T0));
        assert!(!lock.revoke(b"a", fence + 1, T0));
        assert!(lock.revoke(b"a", fence, T0));
        assert!(!lock.is_held(T0));
        let next = granted(lock.acquire(b"c", 1000, false, false, fence, T0));
        assert!(!lock.revoke(b"a", fence, T0));
        assert!(lock.fence_is_current(next, T0));
    }

    fn request(token: &[u8], ttl: u64, session: bool, delay: u64) -> Request<'_> {
        Request {
            token,
            ttl,
            reentrant: false,
            session,
            delay,
        }
    }

    #[test]
    fn an_expired_lease_with_a_lock_delay_keeps_the_lock_busy_until_it_ends() {
        let mut lock = Lock::default();
        let first = granted(lock.grant(&request(b"a", 1000, false, 300), 0, T0));
        // Overdue but not yet expired: the delay already counts from the deadline.
        let end = T0 + 1000;
        assert_eq!(lock.delay_ttl(end + 10), Some(290));
        assert!(!lock.is_available(end + 10));
        assert_eq!(
            lock.grant(&request(b"b", 1000, false, 0), first, end + 10),
            Ok(Acquire::Busy)
        );
        assert!(lock.expire(end + 50));
        assert_eq!(lock.delayed_until, end + 300);
        for token in [&b"a"[..], b"b"] {
            assert_eq!(
                lock.grant(&request(token, 1000, false, 0), first, end + 299),
                Ok(Acquire::Busy)
            );
        }
        assert!(!lock.fence_is_current(first, end + 100));
        let second = granted(lock.grant(&request(b"b", 1000, false, 0), first, end + 300));
        assert!(second > first);
        assert_eq!(lock.delayed_until, 0);
        assert_eq!(lock.delay_ttl(end + 300), None);
    }

    #[test]
    fn a_closed_session_starts_the_delay_and_a_release_does_not() {
        let mut lock = Lock::default();
        let fence = granted(lock.grant(&request(b"a", 10_000, true, 500), 0, T0));
        assert!(lock.end_session(b"a", T0 + 100));
        assert_eq!(lock.delay_ttl(T0 + 100), Some(500));
        assert!(!lock.is_available(T0 + 599));
        assert!(lock.is_available(T0 + 600));
        let next = granted(lock.grant(&request(b"b", 10_000, false, 500), fence, T0 + 600));
        assert_eq!(lock.release(b"b", T0 + 700), Some(true));
        assert_eq!(lock.delay_ttl(T0 + 700), None);
        assert!(granted(lock.grant(&request(b"c", 10, false, 0), next, T0 + 700)) > next);
    }

    #[test]
    fn clearing_the_delay_frees_the_lock_at_once() {
        let mut lock = Lock::default();
        let fence = granted(lock.grant(&request(b"a", 10, false, 60_000), 0, T0));
        assert!(lock.expire(T0 + 10));
        assert!(lock.clear_delay(T0 + 20));
        assert!(!lock.clear_delay(T0 + 20));
        assert!(granted(lock.grant(&request(b"b", 10, false, 0), fence, T0 + 20)) > fence);
    }

    #[test]
    fn a_refresh_takes_the_requests_lock_delay() {
        let mut lock = Lock::default();
        let fence = granted(lock.grant(&request(b"a", 1000, false, 100), 0, T0));
        assert_eq!(
            lock.grant(&request(b"a", 1000, false, 0), fence, T0 + 1),
            Ok(Acquire::Refreshed { fence })
        );
        assert!(lock.expire(T0 + 1001));
        assert!(lock.is_available(T0 + 1001));
    }

    #[test]
    fn session_flag_sticks_on_refresh() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(b"a", 1000, false, false, 0, T0));
        lock.acquire(b"a", 1000, false, true, fence, T0).ok();
        assert_eq!(lock.holder.as_ref().map(|h| h.session), Some(true));
    }
}
