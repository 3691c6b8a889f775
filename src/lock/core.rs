//! The lock and its admission rules, free of any Redis API: who may hold it (exclusive, shared
//! or permit requests, refreshes, downgrades, refusals), its fence, lease deadlines, hold counts
//! and lock-delay. A hold's record is in [`grant`](crate::lock::grant) and the shared holders in
//! [`group`](crate::lock::group); their public items are re-exported here.
//!
//! Time is always passed in (`now`, milliseconds since the Unix epoch), so every rule here is
//! tested deterministically without a server. The module layer (`commands`, `replication`,
//! `expiry`) calls these functions and turns their outcomes into replies, notifications and
//! replicated effects.

use crate::error::LockError;
pub use crate::lock::grant::{
    record_connection, recorded_connection, split_connection, split_who, valid_label, Grant,
    Holder, MAX_LABEL_LEN,
};
pub use crate::lock::group::{Group, Member, MemberChange};
pub use crate::lock::token::TokenDigest;

/// How many fences fit into one millisecond of the fence clock (see [`next_fence`]).
pub const FENCE_CLOCK_SHIFT: u32 = 11;

/// The largest fence ever handed out: RESP integers are signed 64-bit.
pub const MAX_FENCE: u64 = i64::MAX as u64;

/// The most shared or permit holders a key may have at once (and so the largest LIMIT): every
/// command on the key looks through them.
pub const MAX_HOLDERS: u32 = 10_000;

/// Up to this many holders leaving in one replicated change are each looked for among the
/// fingerprints (a sixteenth of a pass over the holders each); more take one pass together.
const FEW_TOKENS: usize = 8;

/// The value stored under a lock key. A released lock keeps its key (a tombstone) so the last
/// fence travels with the key through RDB, AOF, replication, DUMP/RESTORE and MIGRATE.
///
/// A lock is held by one exclusive `holder`, or by the members of its `group` (shared holders,
/// or permit holders of a semaphore), never both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lock {
    /// The fence of the latest grant, the largest of the key; 0 only for a value that never had
    /// one.
    pub fence: u64,
    /// The exclusive holder.
    pub holder: Option<Holder>,
    /// Shared or permit holders; `None` for a plain lock without shared holders (boxed: most
    /// locks never have one).
    pub group: Option<Box<Group>>,
    /// A free lock whose last holder ended with a lock-delay: no grant before this time (ms
    /// since the epoch); 0 when there was none. Only meaningful while free.
    pub delayed_until: u64,
}

/// The kind of hold a request asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The only holder of the lock.
    #[default]
    Exclusive,
    /// One of any number of shared holders, never beside an exclusive one.
    Shared,
    /// One of at most `n` holders of a semaphore of `n` permits.
    Permit(u32),
}

/// What a grant request asks for.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub token: TokenDigest,
    pub ttl: u64,
    pub reentrant: bool,
    pub session: bool,
    /// The lock-delay the grant imposes if it ends without a release (ms; 0: none). Exclusive
    /// grants only.
    pub delay: u64,
    pub mode: Mode,
    /// The grant waits for replicas (SYNC): a new hold is provisional (see
    /// [`Holder::provisional`]).
    pub provisional: bool,
    /// The requesting client's id (0: unknown, e.g. a test), its `addr name`, and the label it
    /// gives the hold (empty: none); see [`Grant`].
    pub client: u64,
    pub connection: &'a [u8],
    pub label: &'a [u8],
}

/// What a grant request turned into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A new grant with a new fence.
    Granted { fence: u64 },
    /// The same token already held it: lease refreshed, fence unchanged.
    Refreshed { fence: u64 },
    /// The exclusive holder asked for a shared hold: its hold became one, with the same fence,
    /// and the lock was not free for a moment.
    Downgraded { fence: u64 },
    /// Someone else holds it (or the semaphore has no permit left, or a lock-delay runs).
    Busy,
}

/// The fence space is used up (only reachable with a clock set hundreds of millennia ahead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceExhausted;

/// Why a grant request is refused outright rather than busy: waiting would not help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    FenceExhausted,
    /// A shared holder asked for the lock exclusive: two of them doing so would wait for each
    /// other forever.
    Upgrade,
    /// A permit asked of a key held as a lock (exclusive or shared).
    NotSemaphore,
    /// The key is a semaphore of `limit` permits, and the request asked for something else (no
    /// LIMIT, or another one).
    Semaphore {
        limit: u32,
    },
}

impl From<FenceExhausted> for Refused {
    fn from(_: FenceExhausted) -> Self {
        Refused::FenceExhausted
    }
}

/// The reply a refusal gets (beside the core so that `error` needs nothing from `lock`).
impl From<Refused> for LockError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::FenceExhausted => LockError::FenceExhausted,
            Refused::Upgrade => LockError::Upgrade,
            Refused::NotSemaphore => LockError::NotSemaphore,
            Refused::Semaphore { limit } => LockError::SemaphoreLimit { limit },
        }
    }
}

/// What a request may do with a lock at a given moment (see [`Lock::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// The requester holds it in this mode already: a refresh.
    Refresh,
    /// The exclusive holder asks for a shared hold.
    Downgrade,
    /// A new grant.
    New,
    Busy,
}

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

/// Refreshes a hold the requester already has.
fn refresh(holder: &mut Holder, request: &Request, deadline: u64) {
    holder.deadline = deadline;
    holder.grant.refreshed_by(request);
    // The reply promises this lease: it is no longer taken back.
    holder.provisional = false;
    if request.reentrant {
        holder.holds = holder.holds.saturating_add(1);
    }
    holder.session |= request.session;
}

impl Lock {
    /// The exclusive holder, if its lease has not run out at `now`.
    pub fn live_holder(&self, now: u64) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.deadline > now)
    }

    /// The shared or permit holders, live or overdue.
    pub fn members(&self) -> &[Member] {
        self.group.as_deref().map_or(&[], |g| &g.members)
    }

    /// The shared or permit holders whose lease has not run out at `now`.
    pub fn live_members(&self, now: u64) -> impl Iterator<Item = &Member> {
        self.members()
            .iter()
            .filter(move |m| m.holder.deadline > now)
    }

    /// The semaphore's number of permits; 0 when the key is not a semaphore.
    pub fn limit(&self) -> u32 {
        self.group.as_deref().map_or(0, |g| g.limit)
    }

    /// Every holder with the fence of its grant, live or with its lease run out.
    pub fn all_holders(&self) -> impl Iterator<Item = (u64, &Holder)> {
        let fence = self.fence;
        self.holder
            .as_ref()
            .map(move |h| (fence, h))
            .into_iter()
            .chain(self.members().iter().map(|m| (m.fence, &m.holder)))
    }

    /// The grant time of the oldest hold whose grant time is known (without a pass over the
    /// shared holders when they are in grant order: see `Group::oldest_grant`).
    pub fn oldest_grant(&self) -> Option<u64> {
        let exclusive = self
            .holder
            .as_ref()
            .map(|h| h.grant.since)
            .filter(|since| *since > 0);
        let shared = self.group.as_deref().and_then(Group::oldest_grant);
        exclusive.into_iter().chain(shared).min()
    }

    /// When the next hold not yet announced as long becomes one, `threshold` ms after its
    /// grant, or a time before it but after `now` (the lease index may look early, never
    /// late); `None` when none will (or `threshold` is 0: no long holds). O(1) for a shared
    /// lock, but for a pass over its holders once a hold crossed (see `Group::unmarked_since`).
    pub fn long_due(&self, threshold: u64, now: u64) -> Option<u64> {
        if threshold == 0 {
            return None;
        }
        let exclusive = self
            .holder
            .as_ref()
            .filter(|h| !h.long && h.grant.since > 0)
            .map(|h| h.grant.since);
        let shared = self
            .group
            .as_deref()
            .and_then(|g| g.unmarked_since(now.saturating_sub(threshold)));
        let since = match (exclusive, shared) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(since.saturating_add(threshold))
    }

    /// Marks the holds that have lasted `threshold` ms or more at `now` (or by the end of their
    /// lease, when that came first and the lease timer is late) and were not announced yet as
    /// long, and returns their fences and grants.
    pub fn mark_long(&mut self, threshold: u64, now: u64) -> Vec<(u64, Grant)> {
        let mut marked = Vec::new();
        if threshold == 0 || self.long_due(threshold, now).is_none_or(|due| due > now) {
            // Nothing crosses by now: no pass over the holders.
            return marked;
        }
        let fence = self.fence;
        let holders = self.holder.iter_mut().map(|h| (fence, h)).chain(
            self.group
                .iter_mut()
                .flat_map(|g| g.members.iter_mut())
                .map(|m| (m.fence, &mut m.holder)),
        );
        for (fence, holder) in holders {
            let since = holder.grant.since;
            let crossing = since.saturating_add(threshold);
            if !holder.long && since > 0 && crossing <= now && crossing <= holder.deadline {
                holder.long = true;
                marked.push((fence, (*holder.grant).clone()));
            }
        }
        if let Some(group) = self.group.as_deref() {
            if !marked.is_empty() {
                group.hints.marked();
            }
        }
        marked
    }

    /// The fences of the holds announced as long.
    pub fn long_fences(&self) -> Vec<u64> {
        let mut fences: Vec<u64> = self
            .holder
            .as_ref()
            .filter(|h| h.long)
            .map(|_| self.fence)
            .into_iter()
            .collect();
        if let Some(group) = self.group.as_deref().filter(|g| g.maybe_long()) {
            fences.extend(group.long_fences());
        }
        fences
    }

    /// True when a hold with this fence is still there (live or not).
    pub fn has_hold_with(&self, fence: u64) -> bool {
        // Members are in grant order, their fences increasing: a binary search.
        (self.holder.is_some() && self.fence == fence)
            || self
                .members()
                .binary_search_by_key(&fence, |m| m.fence)
                .is_ok()
    }

    /// Every live holder with the fence of its grant, exclusive or not.
    pub fn live_holders(&self, now: u64) -> impl Iterator<Item = (u64, &Holder)> {
        let fence = self.fence;
        self.live_holder(now)
            .map(move |h| (fence, h))
            .into_iter()
            .chain(self.live_members(now).map(|m| (m.fence, &m.holder)))
    }

    /// How many holds `token` has on the lock at `now` (REENTRANT counts each; 0: none).
    pub fn hold_count(&self, token: &TokenDigest, now: u64) -> u32 {
        if let Some(holder) = self.live_holder(now).filter(|h| h.token() == token) {
            return holder.holds;
        }
        self.live_member_index(token, now)
            .and_then(|at| self.members().get(at))
            .map_or(0, |member| member.holder.holds)
    }

    /// True when `token` holds the lock (in any mode) at `now`.
    pub fn holds(&self, token: &TokenDigest, now: u64) -> bool {
        self.live_holder(now).is_some_and(|h| h.token() == token)
            || self.live_member_index(token, now).is_some()
    }

    pub fn is_held(&self, now: u64) -> bool {
        self.live_holder(now).is_some() || self.live_members(now).next().is_some()
    }

    /// A holder whose deadline has passed but who has not been removed yet.
    pub fn is_overdue(&self, now: u64) -> bool {
        self.holder.as_ref().is_some_and(|h| h.deadline <= now)
            || self.group.as_deref().is_some_and(|g| g.any_overdue(now))
    }

    /// The live hold of `token`, exclusive or shared.
    fn live_hold_mut(&mut self, token: &TokenDigest, now: u64) -> Option<&mut Holder> {
        let live = |h: &&mut Holder| h.deadline > now && h.token() == token;
        if let Some(holder) = self.holder.as_mut().filter(live) {
            return Some(holder);
        }
        let group = self.group.as_deref_mut()?;
        let index = group.find(token, |m| m.holder.deadline > now)?;
        // The caller may move its deadline (never its token, its grant time or its long mark:
        // the fingerprints and those hints stay).
        group.hints = group.hints.after_deadlines_moved();
        group.members.get_mut(index).map(|m| &mut m.holder)
    }

    /// Removes the member at `index`, and the group with it when it is neither a semaphore nor
    /// held any more.
    fn remove_member(&mut self, index: usize) -> Option<Member> {
        let group = self.group.as_deref_mut()?;
        let member = group.remove(index)?;
        if group.limit == 0 && group.members.is_empty() {
            self.group = None;
        }
        Some(member)
    }

    /// The index of the live member holding with `token`.
    /// (From the latest grant back: a holder that comes back soon after its grant finds itself
    /// sooner.)
    pub(super) fn live_member_index(&self, token: &TokenDigest, now: u64) -> Option<usize> {
        self.group
            .as_deref()?
            .find(token, |m| m.holder.deadline > now)
    }

    /// Removes one holder whose lease ran out (the exclusive one, or the shared one that ran out
    /// first). Returns true when it did: the caller announces `lock.expired` and replicates the
    /// change, and calls again while [`Lock::is_overdue`]. A grant with a lock-delay leaves the
    /// lock unavailable until its deadline plus the delay.
    pub fn expire(&mut self, now: u64) -> bool {
        if self.holder.as_ref().is_some_and(|h| h.deadline <= now) {
            if let Some(holder) = self.holder.take() {
                self.start_delay(holder.deadline, holder.grant.delay);
            }
            return true;
        }
        self.first_overdue_member(now)
            .is_some_and(|index| self.remove_member(index).is_some())
    }

    /// Removes at most `budget` shared or permit holders whose lease ran out by `now` (in grant
    /// order), in one pass over the holders, and returns them: thousands of holders whose
    /// leases end together cost O(N) to expire, not O(N) each.
    pub fn expire_members(&mut self, now: u64, budget: usize) -> Vec<Member> {
        if budget == 0 || !self.group.as_deref().is_some_and(|g| g.any_overdue(now)) {
            return Vec::new();
        }
        let mut taken = 0;
        self.take_members(|member| {
            let expire = member.holder.deadline <= now && taken < budget;
            taken += usize::from(expire);
            expire
        })
    }

    /// Frees, in one pass over the holders, the live session holds of `tokens` among the shared
    /// or permit holders (their connection closed), and returns them.
    pub fn end_member_sessions(
        &mut self,
        tokens: &std::collections::HashSet<TokenDigest>,
        now: u64,
    ) -> Vec<Member> {
        self.take_members(|member| {
            let h = &member.holder;
            h.session && h.deadline > now && tokens.contains(h.token())
        })
    }

    /// Removes the shared or permit holders `pick` picks (asked of each in grant order), in
    /// one pass, and the group with them when it is neither a semaphore nor held any more.
    fn take_members(&mut self, mut pick: impl FnMut(&Member) -> bool) -> Vec<Member> {
        let Some(group) = self.group.as_deref_mut() else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        group.change_members(|members| {
            let mut kept = Vec::with_capacity(members.len());
            for member in members.drain(..) {
                if pick(&member) {
                    taken.push(member);
                } else {
                    kept.push(member);
                }
            }
            *members = kept;
        });
        if group.limit == 0 && group.members.is_empty() {
            self.group = None;
        }
        taken
    }

    /// The shared or permit holder [`Lock::expire`] removes next: the one whose lease ran out
    /// first (the earliest granted among equals).
    fn first_overdue_member(&self, now: u64) -> Option<usize> {
        self.members()
            .iter()
            .enumerate()
            .filter(|(_, m)| m.holder.deadline <= now)
            .min_by_key(|(_, m)| m.holder.deadline)
            .map(|(index, _)| index)
    }

    /// The token of the shared or permit holder [`Lock::expire`] removes next, if it removes
    /// one (not the exclusive holder).
    pub fn expiring_member(&self, now: u64) -> Option<&TokenDigest> {
        if self.holder.as_ref().is_some_and(|h| h.deadline <= now) {
            return None;
        }
        let index = self.first_overdue_member(now)?;
        Some(self.members()[index].holder.token())
    }

    /// `token`'s shared or permit hold, live or overdue, if it has one. Searched from the
    /// latest grant back: a change just made is most often to the newest holder.
    pub fn member(&self, token: &TokenDigest) -> Option<&Member> {
        let group = self.group.as_deref()?;
        group.members.get(group.find(token, |_| true)?)
    }

    /// Applies one shared or permit holder's change made on the primary at `now`, the key's
    /// fence then being `fence` and its semaphore limit `limit`: the same steps as the grant,
    /// refresh or removal there, so the result is the same lock. A holder with a new fence is a
    /// new grant: holders whose lease ran out by `now` go, and it joins last.
    ///
    /// Refused, changing nothing, when it could not have come from a primary whose lock was this
    /// one: a fence going back, a new holder whose fence is not the key's new one, more holders
    /// than the limit allows.
    pub fn apply_member(
        &mut self,
        fence: u64,
        limit: u32,
        now: u64,
        change: MemberChange,
    ) -> Result<(), &'static str> {
        if fence < self.fence || limit > MAX_HOLDERS {
            return Err("member change out of order");
        }
        // The member's token's holds (one look through the fingerprints, as the primary's
        // grant made), and among them the one of this grant: refreshed if there is one.
        let (own, same) = match (&change, self.group.as_deref()) {
            (MemberChange::Set(member), Some(group)) => {
                let own = group.holds_of(member.holder.token());
                let same = own.iter().copied().find(|&index| {
                    group
                        .members
                        .get(index)
                        .is_some_and(|m| m.fence == member.fence)
                });
                (own, same)
            }
            _ => (Vec::new(), None),
        };
        if let (MemberChange::Set(member), None) = (&change, same) {
            // A new grant: room beside the live holders that stay (the live count is kept by
            // the group; the token's own live hold, if any, is replaced).
            let members = self.members();
            let own_live = own
                .iter()
                .filter(|&&index| members.get(index).is_some_and(|m| m.holder.deadline > now))
                .count();
            let live = self.group.as_deref().map_or(0, |g| g.live_count(now));
            let stay = live.saturating_sub(own_live);
            let cap = if limit == 0 { MAX_HOLDERS } else { limit };
            if member.fence != fence || fence <= self.fence || stay >= cap as usize {
                return Err("member change out of order");
            }
        }
        self.holder = None;
        self.delayed_until = 0;
        self.fence = fence;
        let group = self.group.get_or_insert_with(Box::default);
        group.limit = limit;
        match (change, same) {
            (MemberChange::Set(member), Some(index)) => {
                group.replace(index, member);
            }
            (MemberChange::Set(member), None) => {
                // The token's other holds go, and as in the primary's grant, the holders whose
                // lease ran out (when the group says some may have).
                group.remove_from_back(&own);
                group.drop_overdue(now);
                group.push(member);
            }
            (MemberChange::Remove(tokens), _) if tokens.len() <= FEW_TOKENS => {
                // A release or a few expiries: a look through the fingerprints each.
                for token in &tokens {
                    let holds = group.holds_of(token);
                    group.remove_from_back(&holds);
                }
            }
            (MemberChange::Remove(tokens), _) => {
                // Many left together: one pass, however many.
                let gone: std::collections::HashSet<TokenDigest> = tokens.into_iter().collect();
                group.remove_where(|m| gone.contains(m.holder.token()));
            }
        }
        if group.limit == 0 && group.members.is_empty() {
            self.group = None;
        }
        Ok(())
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
            Some(h) if h.deadline <= now && h.grant.delay > 0 => {
                h.deadline.saturating_add(h.grant.delay)
            }
            Some(_) => 0,
            None => self.delayed_until,
        }
    }

    /// Remaining ms of a running lock-delay, or `None` when there is none at `now`.
    pub fn delay_ttl(&self, now: u64) -> Option<u64> {
        let until = self.blocked_until(now);
        (until > now && !self.is_held(now)).then(|| until - now)
    }

    /// How many holders have a lease that has not run out at `now`: in O(1) unless some have
    /// run out and are not expired yet.
    pub fn live_count(&self, now: u64) -> usize {
        usize::from(self.live_holder(now).is_some())
            + self.group.as_deref().map_or(0, |g| g.live_count(now))
    }

    /// True when a new exclusive grant can be made at `now`: nobody holds it, and no lock-delay
    /// runs.
    pub fn is_available(&self, now: u64) -> bool {
        !self.is_held(now) && self.delay_ttl(now).is_none()
    }

    /// True when some waiter may be granted something at `now`: no exclusive holder, no
    /// lock-delay, and a permit left when it is a semaphore (a shared lock takes at most
    /// [`MAX_HOLDERS`]).
    pub fn has_room(&self, now: u64) -> bool {
        if self.live_holder(now).is_some() || self.delay_ttl(now).is_some() {
            return false;
        }
        let limit = match self.limit() {
            0 => MAX_HOLDERS,
            limit => limit,
        };
        let live = self.group.as_deref().map_or(0, |g| g.live_count(now));
        live < limit as usize
    }

    /// Ends a running lock-delay at once (LOCK.FORCERELEASE). True when one was running.
    /// A delay that already ended is left as it is: nothing changes, so nothing is replicated.
    pub fn clear_delay(&mut self, now: u64) -> bool {
        let running = self.holder.is_none() && self.delayed_until > now;
        if running {
            self.delayed_until = 0;
        }
        running
    }

    /// What `request` may do at `now`, or why it is refused whatever happens meanwhile. An
    /// overdue holder counts as gone.
    pub fn admit(&self, request: &Request, now: u64) -> Result<Admit, Refused> {
        let limit = self.limit();
        if self
            .live_holder(now)
            .is_some_and(|h| *h.token() == request.token)
        {
            return match request.mode {
                Mode::Exclusive => Ok(Admit::Refresh),
                Mode::Shared => Ok(Admit::Downgrade),
                Mode::Permit(_) => Err(Refused::NotSemaphore),
            };
        }
        match request.mode {
            Mode::Permit(asked) if limit > 0 && asked != limit => {
                return Err(Refused::Semaphore { limit })
            }
            Mode::Exclusive | Mode::Shared if limit > 0 => {
                return Err(Refused::Semaphore { limit })
            }
            Mode::Permit(_) if limit == 0 && self.is_held(now) => {
                return Err(Refused::NotSemaphore)
            }
            _ => {}
        }
        if self.live_member_index(&request.token, now).is_some() {
            return match request.mode {
                Mode::Exclusive => Err(Refused::Upgrade),
                Mode::Shared | Mode::Permit(_) => Ok(Admit::Refresh),
            };
        }
        let free = match request.mode {
            Mode::Exclusive => self.is_available(now),
            Mode::Shared | Mode::Permit(_) => self.has_room(now),
        };
        Ok(if free { Admit::New } else { Admit::Busy })
    }

    /// Grants the lock to `token` when it is free, or refreshes the lease when `token` already
    /// holds it, without a lock-delay. An exclusive request; see [`Lock::grant`].
    pub fn acquire(
        &mut self,
        token: TokenDigest,
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
            mode: Mode::Exclusive,
            provisional: false,
            client: 0,
            connection: b"",
            label: b"",
        };
        self.grant(&request, floor, now).map_err(|_| FenceExhausted)
    }

    /// Grants `request` when the lock admits it (see [`Lock::admit`]): a new grant gets a fence
    /// above every earlier one of the key and `floor`; the requester's own hold is refreshed
    /// (its lease, holds and session flag; an exclusive one takes the request's lock-delay), or
    /// downgraded to a shared one. The caller must have called [`Lock::expire`] first when it
    /// wants overdue holders removed with their own announcement.
    pub fn grant(&mut self, request: &Request, floor: u64, now: u64) -> Result<Acquire, Refused> {
        let deadline = deadline_after(now, request.ttl);
        match self.admit(request, now)? {
            Admit::Busy => Ok(Acquire::Busy),
            Admit::Refresh => {
                let fence = match self.live_member_index(&request.token, now) {
                    Some(index) => self.members()[index].fence,
                    None => self.fence,
                };
                let exclusive = self.holder.is_some();
                if let Some(holder) = self.live_hold_mut(&request.token, now) {
                    refresh(holder, request, deadline);
                    if exclusive {
                        holder.grant.delay = request.delay;
                    }
                }
                Ok(Acquire::Refreshed { fence })
            }
            Admit::Downgrade => {
                let Some(mut holder) = self.holder.take() else {
                    return Ok(Acquire::Busy);
                };
                refresh(&mut holder, request, deadline);
                holder.grant.delay = 0;
                let fence = self.fence;
                self.group = Some(Box::new(Group::new(0, vec![Member::new(fence, holder)])));
                Ok(Acquire::Downgraded { fence })
            }
            Admit::New => {
                let fence = next_fence(floor, self.fence, now)?;
                self.fence = fence;
                self.delayed_until = 0;
                // Holders whose lease ran out go (callers expire them first, announced).
                self.holder = None;
                if let Some(group) = self.group.as_deref_mut() {
                    group.drop_overdue(now);
                    if group.limit == 0 && group.members.is_empty() {
                        self.group = None;
                    }
                }
                let exclusive = request.mode == Mode::Exclusive;
                let holder = Holder {
                    deadline,
                    holds: 1,
                    session: request.session,
                    provisional: request.provisional,
                    long: false,
                    grant: Box::new(Grant::granted(
                        request,
                        if exclusive { request.delay } else { 0 },
                        now,
                    )),
                };
                let limit = match request.mode {
                    Mode::Exclusive => {
                        self.holder = Some(holder);
                        return Ok(Acquire::Granted { fence });
                    }
                    Mode::Shared => 0,
                    Mode::Permit(limit) => limit,
                };
                let group = self.group.get_or_insert_with(Box::default);
                group.limit = limit;
                group.push(Member::new(fence, holder));
                Ok(Acquire::Granted { fence })
            }
        }
    }

    /// Drops one hold of `token`. Returns `None` when `token` does not hold the lock, otherwise
    /// whether its hold ended (for an exclusive holder: the lock is now free).
    pub fn release(&mut self, token: &TokenDigest, now: u64) -> Option<bool> {
        let live = |h: &&mut Holder| h.deadline > now && h.token() == token;
        if let Some(holder) = self.holder.as_mut().filter(live) {
            if holder.holds > 1 {
                holder.holds -= 1;
                return Some(false);
            }
            self.holder = None;
            return Some(true);
        }
        // One look through the members; a dropped hold leaves the deadlines as they were.
        let index = self.live_member_index(token, now)?;
        let holder = &mut self.group.as_deref_mut()?.members.get_mut(index)?.holder;
        if holder.holds > 1 {
            holder.holds -= 1;
            return Some(false);
        }
        self.remove_member(index);
        Some(true)
    }

    /// Removes the live hold of `token` entirely, without a lock-delay.
    fn end_hold(&mut self, token: &TokenDigest, now: u64) -> Option<Holder> {
        if self.live_holder(now).is_some_and(|h| h.token() == token) {
            return self.holder.take();
        }
        let index = self.live_member_index(token, now)?;
        self.remove_member(index).map(|m| m.holder)
    }

    /// Moves the deadline of `token`'s lease to `now + ttl`. False when `token` does not hold it.
    pub fn renew(&mut self, token: &TokenDigest, ttl: u64, now: u64) -> bool {
        match self.live_hold_mut(token, now) {
            Some(holder) => {
                holder.deadline = deadline_after(now, ttl);
                holder.provisional = false;
                true
            }
            None => false,
        }
    }

    /// Frees a session hold of `token` entirely (its connection closed), starting its
    /// lock-delay if it has one. True when it did.
    pub fn end_session(&mut self, token: &TokenDigest, now: u64) -> bool {
        if !self.live_hold_mut(token, now).is_some_and(|h| h.session) {
            return false;
        }
        if let Some(holder) = self.end_hold(token, now) {
            if self.holder.is_none() && self.group.is_none() {
                self.start_delay(now, holder.grant.delay);
            }
        }
        true
    }

    /// Frees the lock whoever holds it, every shared and permit holder too (a semaphore keeps
    /// its limit). True when it was held at `now`.
    pub fn force_release(&mut self, now: u64) -> bool {
        let was_held = self.is_held(now);
        if was_held {
            self.holder = None;
            if let Some(group) = self.group.as_deref_mut() {
                group.change_members(Vec::clear);
            }
            if self.limit() == 0 {
                self.group = None;
            }
        }
        was_held
    }

    /// Takes back the grant with `fence` from `token` (all its holds), when that grant is a
    /// current one and still provisional: a grant its replicas never acknowledged, which no
    /// refresh or renewal has promised to its token since. True when it did.
    pub fn revoke(&mut self, token: &TokenDigest, fence: u64, now: u64) -> bool {
        let current = self
            .grant_of(token, fence, now)
            .is_some_and(|h| h.provisional);
        if current {
            self.end_hold(token, now);
        }
        current
    }

    /// Applies a replicated renewal (see `codec::State::renewal`): the exclusive holder, whose
    /// grant has `fence`, now holds until `deadline`. Refused, changing nothing, when this lock
    /// has no exclusive holder of that grant: it is not the lock the primary renewed.
    /// As a whole-state effect would, it leaves the holder without a long-hold mark: a server
    /// that marked the hold as a primary, then followed the primary that renewed it, announces
    /// the hold once more if it is promoted again.
    pub fn apply_renewal(&mut self, fence: u64, deadline: u64) -> Result<(), &'static str> {
        match self.holder.as_mut() {
            Some(holder) if self.fence == fence && self.group.is_none() => {
                holder.deadline = deadline;
                holder.long = false;
                Ok(())
            }
            _ => Err("renewal of a grant this lock does not have"),
        }
    }

    /// The live hold of `token` with the grant `fence`, if it still has it at `now`.
    pub fn grant_of(&self, token: &TokenDigest, fence: u64, now: u64) -> Option<&Holder> {
        self.live_holders(now)
            .find(|(f, h)| *f == fence && h.token() == token)
            .map(|(_, h)| h)
    }

    /// True when `fence` is the fence of a current, unexpired holder.
    pub fn fence_is_current(&self, fence: u64, now: u64) -> bool {
        self.live_holders(now).any(|(f, _)| f == fence)
    }

    /// Remaining lease in ms of the holder whose lease ends first, or `None` when free.
    pub fn ttl(&self, now: u64) -> Option<u64> {
        self.live_holders(now).map(|(_, h)| h.deadline - now).min()
    }

    /// When the lease timer has to look at the lock first: no later than the earliest of every
    /// holder's deadline (exact once overdue holders were looked for, see [`Lock::is_overdue`]);
    /// `None` without holders.
    pub fn next_deadline(&self) -> Option<u64> {
        let members = self.group.as_deref().and_then(Group::deadline_bound);
        self.holder
            .as_ref()
            .map(|h| h.deadline)
            .into_iter()
            .chain(members)
            .min()
    }

    /// True when any holder, live or overdue, is recorded (what the held gauge counts).
    pub fn has_holders(&self) -> bool {
        self.holder.is_some() || !self.members().is_empty()
    }

    /// Heap bytes this lock owns beyond its own size (grant records, shared holders), for
    /// MEMORY USAGE.
    pub fn heap_bytes(&self) -> usize {
        // A holder's own heap: its grant record (with the token's digest) and its who bytes.
        let own = |h: &Holder| std::mem::size_of::<Grant>() + h.grant.text.heap_len();
        let group = self.group.as_deref().map_or(0, |g| {
            std::mem::size_of::<Group>()
                + g.members.capacity() * std::mem::size_of::<Member>()
                + g.prints.capacity() * std::mem::size_of::<u32>()
                + g.members.iter().map(|m| own(&m.holder)).sum::<usize>()
        });
        self.holder.as_ref().map_or(0, own) + group
    }
}

/// The core's unit tests, and the helpers the tests of `grant` and `group` share with them.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The digest of a test token.
    pub(crate) fn dg(token: &[u8]) -> TokenDigest {
        TokenDigest::of(token)
    }

    pub(crate) const T0: u64 = 1_764_000_000_000;

    pub(crate) fn granted<E: std::fmt::Debug>(r: Result<Acquire, E>) -> u64 {
        match r {
            Ok(Acquire::Granted { fence }) => fence,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn first_grant_gets_a_clock_based_fence() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
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
        granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        assert_eq!(
            lock.acquire(dg(b"b"), 1000, false, false, 0, T0 + 1),
            Ok(Acquire::Busy)
        );
        assert_eq!(lock.holder.as_ref().map(|h| *h.token()), Some(dg(b"a")));
    }

    #[test]
    fn same_token_refreshes_lease_and_keeps_fence() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        assert_eq!(
            lock.acquire(dg(b"a"), 5000, false, false, fence, T0 + 500),
            Ok(Acquire::Refreshed { fence })
        );
        assert_eq!(lock.ttl(T0 + 500), Some(5000));
        assert_eq!(lock.holder.as_ref().map(|h| h.holds), Some(1));
    }

    #[test]
    fn reentrant_acquire_counts_holds_and_release_drops_them_one_by_one() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(dg(b"a"), 1000, true, false, 0, T0));
        lock.acquire(dg(b"a"), 1000, true, false, fence, T0).ok();
        lock.acquire(dg(b"a"), 1000, true, false, fence, T0).ok();
        assert_eq!(lock.holder.as_ref().map(|h| h.holds), Some(3));
        assert_eq!(lock.release(&dg(b"a"), T0), Some(false));
        assert_eq!(lock.release(&dg(b"a"), T0), Some(false));
        assert_eq!(lock.release(&dg(b"a"), T0), Some(true));
        assert_eq!(lock.release(&dg(b"a"), T0), None);
        assert!(!lock.is_held(T0));
        assert_eq!(lock.fence, fence);
    }

    #[test]
    fn release_with_wrong_token_keeps_lock() {
        let mut lock = Lock::default();
        granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        assert_eq!(lock.release(&dg(b"b"), T0), None);
        assert!(lock.is_held(T0));
    }

    #[test]
    fn expired_lease_counts_as_free_everywhere() {
        let mut lock = Lock::default();
        let first = granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        let at = T0 + 1000;
        assert!(!lock.is_held(at));
        assert!(!lock.fence_is_current(first, at));
        assert_eq!(lock.release(&dg(b"a"), at), None);
        assert!(!lock.renew(&dg(b"a"), 1000, at));
        assert_eq!(lock.ttl(at), None);
        assert!(lock.is_overdue(at));
        let second = granted(lock.acquire(dg(b"b"), 1000, false, false, first, at));
        assert!(second > first);
    }

    #[test]
    fn expire_removes_only_overdue_holders() {
        let mut lock = Lock::default();
        granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        assert!(!lock.expire(T0 + 999));
        assert!(lock.expire(T0 + 1000));
        assert!(!lock.expire(T0 + 1000));
        assert_eq!(lock.holder, None);
    }

    #[test]
    fn renew_moves_deadline_only_for_holder() {
        let mut lock = Lock::default();
        granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        assert!(lock.renew(&dg(b"a"), 3000, T0 + 900));
        assert_eq!(lock.ttl(T0 + 900), Some(3000));
        assert!(!lock.renew(&dg(b"b"), 3000, T0 + 900));
        assert_eq!(lock.ttl(T0 + 900), Some(3000));
    }

    #[test]
    fn force_release_frees_any_holder_and_next_grant_has_larger_fence() {
        let mut lock = Lock::default();
        let first = granted(lock.acquire(dg(b"a"), 1000, true, false, 0, T0));
        lock.acquire(dg(b"a"), 1000, true, false, first, T0).ok();
        assert!(lock.force_release(T0));
        assert!(!lock.force_release(T0));
        let second = granted(lock.acquire(dg(b"b"), 1000, false, false, first, T0));
        assert_eq!(second, first + 1);
    }

    #[test]
    fn fences_strictly_increase_over_many_grants_at_one_instant() {
        let mut lock = Lock::default();
        let mut floor = 0;
        for _ in 0..10_000 {
            let fence = granted(lock.acquire(dg(b"a"), 10, false, false, floor, T0));
            assert!(fence > floor);
            floor = fence;
            assert_eq!(lock.release(&dg(b"a"), T0), Some(true));
        }
        assert_eq!(floor, (T0 << FENCE_CLOCK_SHIFT) + 9_999);
    }

    #[test]
    fn fence_check_needs_current_fence() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        assert!(lock.fence_is_current(fence, T0));
        assert!(!lock.fence_is_current(fence - 1, T0));
        assert!(!lock.fence_is_current(fence + 1, T0));
        lock.release(&dg(b"a"), T0);
        assert!(!lock.fence_is_current(fence, T0));
    }

    #[test]
    fn deadline_saturates_instead_of_wrapping() {
        assert_eq!(deadline_after(u64::MAX - 1, 10), u64::MAX);
    }

    #[test]
    fn session_end_frees_all_holds_of_a_session_lock_only() {
        let mut lock = Lock::default();
        let fence = granted(lock.acquire(dg(b"a"), 1000, true, true, 0, T0));
        lock.acquire(dg(b"a"), 1000, true, false, fence, T0).ok();
        assert!(!lock.end_session(&dg(b"b"), T0));
        assert!(lock.end_session(&dg(b"a"), T0));
        assert_eq!(lock.holder, None);
        granted(lock.acquire(dg(b"c"), 1000, false, false, fence, T0));
        assert!(!lock.end_session(&dg(b"c"), T0));
        assert!(lock.is_held(T0));
    }

    #[test]
    fn revoke_takes_back_only_that_provisional_grant_of_that_token() {
        let mut lock = Lock::default();
        let sync = Request {
            provisional: true,
            ..request(b"a", 1000, false, 0)
        };
        let fence = granted(lock.grant(&sync, 0, T0));
        assert!(!lock.revoke(&dg(b"b"), fence, T0));
        assert!(!lock.revoke(&dg(b"a"), fence + 1, T0));
        assert!(lock.revoke(&dg(b"a"), fence, T0));
        assert!(!lock.is_held(T0));
        let next = granted(lock.acquire(dg(b"c"), 1000, false, false, fence, T0));
        assert!(!lock.revoke(&dg(b"a"), fence, T0));
        // Granted without SYNC: never provisional.
        assert!(!lock.revoke(&dg(b"c"), next, T0));
        assert!(lock.fence_is_current(next, T0));
    }

    #[test]
    fn a_refresh_or_a_renewal_by_its_token_makes_a_provisional_grant_firm() {
        let sync = |token| Request {
            provisional: true,
            ..request(token, 1000, false, 0)
        };
        type Refresh = fn(&mut Lock);
        let refreshes: [(&str, Refresh); 5] = [
            ("a plain refresh", |lock| {
                lock.acquire(dg(b"a"), 1000, false, false, 0, T0).ok();
            }),
            ("a reentrant acquire", |lock| {
                lock.acquire(dg(b"a"), 1000, true, false, 0, T0).ok();
            }),
            ("a refresh that waits for replicas too", |lock| {
                let again = Request {
                    provisional: true,
                    ..request(b"a", 1000, false, 0)
                };
                lock.grant(&again, 0, T0).ok();
            }),
            ("a renewal", |lock| {
                assert!(lock.renew(&dg(b"a"), 5000, T0));
            }),
            ("a downgrade", |lock| {
                lock.grant(&asking(b"a", 1000, Mode::Shared), 0, T0).ok();
            }),
        ];
        for (what, refresh) in refreshes {
            let mut lock = Lock::default();
            let fence = granted(lock.grant(&sync(b"a"), 0, T0));
            refresh(&mut lock);
            assert!(!lock.revoke(&dg(b"a"), fence, T0), "{what}");
            assert!(lock.holds(&dg(b"a"), T0), "{what}");
        }
        // A release of one of several holds promises nothing: still provisional.
        let mut lock = Lock::default();
        let reentrant = Request {
            reentrant: true,
            ..sync(b"a")
        };
        let fence = granted(lock.grant(&reentrant, 0, T0));
        let holder = lock.holder.as_mut().expect("held");
        holder.holds = 2;
        assert_eq!(lock.release(&dg(b"a"), T0), Some(false));
        assert!(lock.revoke(&dg(b"a"), fence, T0));
    }

    #[test]
    fn a_renewal_applies_to_the_exclusive_grant_it_names_and_to_nothing_else() {
        let mut lock = Lock::default();
        let fence = granted(lock.grant(&request(b"a", 1000, false, 0), 0, T0));
        assert_eq!(lock.apply_renewal(fence, T0 + 9000), Ok(()));
        assert_eq!(lock.holder.as_ref().map(|h| h.deadline), Some(T0 + 9000));
        // Another grant's fence, a free lock, shared holders: refused, nothing changed.
        let before = lock.clone();
        assert!(lock.apply_renewal(fence + 1, T0 + 20_000).is_err());
        assert!(lock.apply_renewal(fence - 1, T0 + 20_000).is_err());
        assert_eq!(lock, before);
        let mut free = Lock::default();
        assert!(free.apply_renewal(0, T0 + 20_000).is_err());
        assert_eq!(free, Lock::default());
        let mut shared = Lock::default();
        let reader = Request {
            mode: Mode::Shared,
            ..request(b"r", 1000, false, 0)
        };
        let fence = granted(shared.grant(&reader, 0, T0));
        let before = shared.clone();
        assert!(shared.apply_renewal(fence, T0 + 20_000).is_err());
        assert_eq!(shared, before);
    }

    pub(crate) fn request(token: &[u8], ttl: u64, session: bool, delay: u64) -> Request<'static> {
        Request {
            provisional: false,
            token: dg(token),
            ttl,
            reentrant: false,
            session,
            delay,
            mode: Mode::Exclusive,
            client: 0,
            connection: b"",
            label: b"",
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
        assert!(lock.end_session(&dg(b"a"), T0 + 100));
        assert_eq!(lock.delay_ttl(T0 + 100), Some(500));
        assert!(!lock.is_available(T0 + 599));
        assert!(lock.is_available(T0 + 600));
        let next = granted(lock.grant(&request(b"b", 10_000, false, 500), fence, T0 + 600));
        assert_eq!(lock.release(&dg(b"b"), T0 + 700), Some(true));
        assert_eq!(lock.delay_ttl(T0 + 700), None);
        assert!(granted(lock.grant(&request(b"c", 10, false, 0), next, T0 + 700)) > next);
    }

    #[test]
    fn clearing_a_delay_that_ended_changes_nothing() {
        let mut lock = Lock::default();
        granted(lock.grant(&request(b"a", 10, false, 100), 0, T0));
        assert!(lock.expire(T0 + 10));
        let ended = lock.clone();
        assert!(!lock.clear_delay(T0 + 200));
        assert_eq!(lock, ended);
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
        let fence = granted(lock.acquire(dg(b"a"), 1000, false, false, 0, T0));
        lock.acquire(dg(b"a"), 1000, false, true, fence, T0).ok();
        assert_eq!(lock.holder.as_ref().map(|h| h.session), Some(true));
    }

    pub(crate) fn asking(token: &[u8], ttl: u64, mode: Mode) -> Request<'static> {
        Request {
            provisional: false,
            token: dg(token),
            ttl,
            reentrant: false,
            session: false,
            delay: 0,
            mode,
            client: 0,
            connection: b"",
            label: b"",
        }
    }

    #[test]
    fn shared_holders_each_get_a_larger_fence_and_exclude_an_exclusive_one() {
        let mut lock = Lock::default();
        let a = granted(lock.grant(&asking(b"a", 1000, Mode::Shared), 0, T0));
        let b = granted(lock.grant(&asking(b"b", 2000, Mode::Shared), a, T0));
        assert!(b > a);
        assert_eq!(lock.fence, b);
        assert!(lock.fence_is_current(a, T0) && lock.fence_is_current(b, T0));
        assert_eq!(lock.ttl(T0 + 10), Some(990));
        assert_eq!(
            lock.grant(&asking(b"w", 1000, Mode::Exclusive), b, T0),
            Ok(Acquire::Busy)
        );
        assert_eq!(lock.release(&dg(b"a"), T0), Some(true));
        assert!(!lock.fence_is_current(a, T0));
        assert_eq!(lock.release(&dg(b"b"), T0), Some(true));
        assert_eq!(lock.group, None);
        let w = granted(lock.grant(&asking(b"w", 1000, Mode::Exclusive), b, T0));
        assert!(w > b);
        assert_eq!(
            lock.grant(&asking(b"r", 1000, Mode::Shared), w, T0),
            Ok(Acquire::Busy)
        );
    }

    #[test]
    fn the_exclusive_holder_downgrades_without_a_free_moment_and_upgrades_are_refused() {
        let mut lock = Lock::default();
        let w = granted(lock.grant(&asking(b"w", 1000, Mode::Exclusive), 0, T0));
        assert_eq!(
            lock.grant(&asking(b"w", 5000, Mode::Shared), w, T0 + 1),
            Ok(Acquire::Downgraded { fence: w })
        );
        assert!(lock.holder.is_none());
        assert!(lock.fence_is_current(w, T0 + 1));
        assert_eq!(lock.ttl(T0 + 1), Some(5000));
        let r = granted(lock.grant(&asking(b"r", 1000, Mode::Shared), w, T0 + 1));
        assert!(r > w);
        assert_eq!(
            lock.grant(&asking(b"r", 1000, Mode::Exclusive), r, T0 + 1),
            Err(Refused::Upgrade)
        );
        assert_eq!(
            lock.grant(&asking(b"r", 2000, Mode::Shared), r, T0 + 1),
            Ok(Acquire::Refreshed { fence: r })
        );
    }

    #[test]
    fn a_semaphore_grants_up_to_its_limit_and_keeps_it_while_free() {
        let mut lock = Lock::default();
        let mut fences = Vec::new();
        for token in [&b"p1"[..], b"p2", b"p3"] {
            fences.push(granted(lock.grant(
                &asking(token, 1000, Mode::Permit(3)),
                0,
                T0,
            )));
        }
        assert!(fences.windows(2).all(|f| f[0] < f[1]));
        assert_eq!(
            lock.grant(&asking(b"p4", 1000, Mode::Permit(3)), 0, T0),
            Ok(Acquire::Busy)
        );
        assert!(!lock.has_room(T0));
        for (request, refused) in [
            (
                asking(b"p4", 1000, Mode::Permit(4)),
                Refused::Semaphore { limit: 3 },
            ),
            (
                asking(b"p4", 1000, Mode::Shared),
                Refused::Semaphore { limit: 3 },
            ),
            (
                asking(b"p4", 1000, Mode::Exclusive),
                Refused::Semaphore { limit: 3 },
            ),
        ] {
            assert_eq!(lock.grant(&request, 0, T0), Err(refused));
        }
        // A lease that ran out frees its permit (once expired, with its own announcement).
        assert!(lock.renew(&dg(b"p2"), 10, T0));
        assert!(lock.renew(&dg(b"p3"), 20, T0));
        assert!(lock.has_room(T0 + 10));
        assert!(lock.expire(T0 + 30));
        assert!(lock.expire(T0 + 30));
        assert!(!lock.expire(T0 + 30));
        assert_eq!(lock.members().len(), 1);
        assert!(lock.force_release(T0 + 30));
        assert_eq!(lock.limit(), 3);
        assert!(!lock.is_held(T0 + 30));
        assert_eq!(
            lock.grant(&asking(b"x", 1000, Mode::Exclusive), 0, T0 + 30),
            Err(Refused::Semaphore { limit: 3 })
        );
    }

    #[test]
    fn a_limit_on_a_held_lock_is_refused_and_a_free_one_becomes_a_semaphore() {
        let mut lock = Lock::default();
        let w = granted(lock.grant(&asking(b"w", 1000, Mode::Exclusive), 0, T0));
        for token in [&b"w"[..], b"other"] {
            assert_eq!(
                lock.grant(&asking(token, 1000, Mode::Permit(2)), w, T0),
                Err(Refused::NotSemaphore)
            );
        }
        assert_eq!(lock.release(&dg(b"w"), T0), Some(true));
        let p = granted(lock.grant(&asking(b"p", 1000, Mode::Permit(2)), w, T0));
        assert!(p > w);
        assert_eq!(lock.limit(), 2);
    }

    #[test]
    fn shared_holds_are_reentrant_renewed_revoked_and_end_with_their_session() {
        let mut lock = Lock::default();
        let reentrant = Request {
            reentrant: true,
            session: true,
            ..asking(b"a", 1000, Mode::Shared)
        };
        let a = granted(lock.grant(&reentrant, 0, T0));
        lock.grant(&reentrant, a, T0).ok();
        let provisional = |token| Request {
            provisional: true,
            ..asking(token, 1000, Mode::Shared)
        };
        let b = granted(lock.grant(&provisional(b"b"), a, T0));
        let c = granted(lock.grant(&provisional(b"c"), b, T0));
        assert_eq!(lock.release(&dg(b"a"), T0), Some(false));
        assert!(lock.renew(&dg(b"b"), 9000, T0 + 500));
        assert_eq!(lock.ttl(T0 + 500), Some(500));
        assert!(!lock.end_session(&dg(b"b"), T0 + 500));
        assert!(lock.end_session(&dg(b"a"), T0 + 500));
        assert!(!lock.revoke(&dg(b"b"), a, T0 + 500));
        // b renewed its grant: firm. c did not.
        assert!(!lock.revoke(&dg(b"b"), b, T0 + 500));
        assert!(lock.revoke(&dg(b"c"), c, T0 + 500));
        assert!(lock.release(&dg(b"b"), T0 + 500).is_some());
        assert!(!lock.is_held(T0 + 500));
        assert_eq!(lock.group, None);
    }

    #[test]
    fn a_shared_lock_is_full_at_max_holders_and_a_replayed_change_is_checked() {
        let member = |n: u64| {
            Member::new(
                n,
                Holder {
                    provisional: false,
                    long: false,
                    deadline: T0 + 1000,
                    holds: 1,
                    session: false,
                    grant: Box::new(Grant::of_token(dg(&n.to_string().into_bytes()))),
                },
            )
        };
        let mut lock = Lock {
            fence: u64::from(MAX_HOLDERS),
            group: Some(Box::new(Group::new(
                0,
                (1..=u64::from(MAX_HOLDERS)).map(member).collect(),
            ))),
            ..Lock::default()
        };
        assert!(!lock.has_room(T0));
        assert_eq!(
            lock.grant(&asking(b"more", 1000, Mode::Shared), 0, T0),
            Ok(Acquire::Busy)
        );
        let next = member(u64::from(MAX_HOLDERS) + 1);
        let fence = next.fence;
        assert!(lock
            .apply_member(fence, 0, T0, MemberChange::Set(next.clone()))
            .is_err());
        // Once one lapsed, the same change fits; a fence going back never does.
        assert!(lock
            .apply_member(fence, 0, T0 + 2000, MemberChange::Set(next.clone()))
            .is_ok());
        assert_eq!(lock.members().len(), 1);
        assert!(lock
            .apply_member(fence - 1, 0, T0, MemberChange::Remove(vec![dg(b"x")]))
            .is_err());
    }
}
