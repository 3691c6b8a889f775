//! The shared side of a lock ([`Group`]): its shared or permit holders ([`Member`]) in grant
//! order, their tokens' fingerprints, which find one token among thousands of holders, what was
//! found of their deadlines, and a semaphore's limit; and one member's change as it is replicated
//! ([`MemberChange`]).

use crate::lock::grant::Holder;
use crate::lock::token::TokenDigest;

/// A shared holder or a permit holder: a holder with the fence of its own grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub fence: u64,
    pub holder: Holder,
    /// A fingerprint of the token (see [`TokenDigest::print`]), beside the fence in the
    /// members' vector: a search for a token among thousands of holders compares these and
    /// reads a digest (behind its grant record) only where they match.
    pub(super) print: u32,
}

impl Member {
    pub fn new(fence: u64, holder: Holder) -> Member {
        let print = holder.token().print();
        Member {
            fence,
            holder,
            print,
        }
    }

    /// True when this member's token is `token`, whose fingerprint is `print`.
    pub(super) fn is(&self, token: &TokenDigest, print: u32) -> bool {
        self.print == print && self.holder.token() == token
    }
}

/// One shared or permit holder's change, replicated on its own rather than with every holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// The holder with this member's token now holds so (a grant, a refresh, a renewal, a
    /// dropped reentrant hold).
    Set(Member),
    /// The holders with these tokens are gone (released, expired, their sessions ended).
    Remove(Vec<TokenDigest>),
}

/// The shared side of a lock: its shared holders, or the permits of a semaphore.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// The number of permits of a semaphore; 0 for the shared holders of a read/write lock.
    /// A semaphore keeps its limit while its key exists, free or not.
    pub limit: u32,
    /// The holders, in grant order (their fences increase).
    pub(super) members: Vec<Member>,
    /// Their tokens' fingerprints, in the same order, packed: a search for a token among a
    /// thousand holders reads these 4 KB, 16 at a time, instead of the members' 40 KB.
    pub(super) prints: Vec<u32>,
    /// No later than the earliest deadline among the members, once a look through them found
    /// it: with a thousand holders, "is one overdue?", "when is the next one due?" and "how
    /// many are live?" are asked several times per command, and answered from it. Exact after
    /// that look; a holder leaving may leave it early (a lease timer set by it fires early,
    /// never late, and the next look makes it exact again). Beside it, whether a member may
    /// have been announced as a long hold.
    pub(super) hints: Hints,
}

impl Group {
    pub fn new(limit: u32, members: Vec<Member>) -> Group {
        Group {
            limit,
            prints: members.iter().map(|m| m.print).collect(),
            members,
            hints: Hints::default(),
        }
    }

    /// The holders, in grant order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Lets `change` change the holders as it likes; what the group keeps about them is
    /// brought up to date afterwards.
    pub fn change_members<R>(&mut self, change: impl FnOnce(&mut Vec<Member>) -> R) -> R {
        let result = change(&mut self.members);
        self.prints.clear();
        self.prints.extend(self.members.iter().map(|m| m.print));
        self.hints = Hints::default();
        result
    }

    /// The index of the newest member whose token is `token` and that `wanted` accepts.
    pub(super) fn find(
        &self,
        token: &TokenDigest,
        wanted: impl Fn(&Member) -> bool,
    ) -> Option<usize> {
        self.look_for(token, |_, member| wanted(member))
    }

    /// Shows `seen` the members whose token is `token` with their indices, newest first, until
    /// it says stop (true): the index it stopped at. One look through the fingerprints, 16 at
    /// a time, whatever `seen` asks; a digest is read only where a fingerprint matches.
    pub(super) fn look_for(
        &self,
        token: &TokenDigest,
        mut seen: impl FnMut(usize, &Member) -> bool,
    ) -> Option<usize> {
        const BLOCK: usize = 16;
        let print = token.print();
        let mut end = self.prints.len();
        while end > 0 {
            let start = end.saturating_sub(BLOCK);
            let block = self.prints.get(start..end)?;
            // No early exit inside a block: the compiler compares it in a few vector steps.
            if block.iter().fold(false, |hit, &p| hit | (p == print)) {
                let found = (start..end).rev().find(|&index| {
                    self.prints.get(index) == Some(&print)
                        && self
                            .members
                            .get(index)
                            .is_some_and(|m| m.is(token, print) && seen(index, m))
                });
                if found.is_some() {
                    return found;
                }
            }
            end = start;
        }
        None
    }

    /// The indices of the holds of `token`, live or not, newest first (one look through the
    /// fingerprints; most often none or one).
    pub(super) fn holds_of(&self, token: &TokenDigest) -> Vec<usize> {
        let mut found = Vec::new();
        self.look_for(token, |index, _| {
            found.push(index);
            false
        });
        found
    }

    /// Removes the holders at `indices`, given from the last one back (as
    /// [`Group::holds_of`] gives them): each removal leaves the others where they were.
    pub(super) fn remove_from_back(&mut self, indices: &[usize]) {
        for &index in indices {
            self.remove(index);
        }
    }

    /// Adds a holder last, keeping the earliest deadline when it is known.
    pub fn push(&mut self, member: Member) {
        let since = member.holder.grant.since;
        let in_order = since > 0
            && self
                .members
                .last()
                .is_none_or(|last| last.holder.grant.since <= since);
        if !in_order && self.hints.ordered.get() == Some(true) {
            self.hints.ordered.set(Some(false));
        }
        self.joins(&member);
        self.prints.push(member.print);
        self.members.push(member);
    }

    /// Puts `member` in the place of the holder at `index` (the same grant, changed: refreshed,
    /// renewed, a hold dropped), keeping what is known of the holders as [`Group::push`] and
    /// [`Group::remove`] do. Returns the holder it replaced.
    pub(super) fn replace(&mut self, index: usize, member: Member) -> Option<Member> {
        if index >= self.members.len() || index >= self.prints.len() {
            return None;
        }
        let print = self.prints.get_mut(index)?;
        *print = member.print;
        let old = std::mem::replace(self.members.get_mut(index)?, member);
        let since = self.members.get(index)?.holder.grant.since;
        if old.holder.grant.since != since {
            self.hints.ordered.set(None);
        }
        self.left(&old);
        self.joins(self.members.get(index)?);
        Some(old)
    }

    /// Removes, in one pass, the holders `gone` picks, keeping what is known of the others (the
    /// bounds stay bounds, as after [`Group::remove`]).
    pub(super) fn remove_where(&mut self, mut gone: impl FnMut(&Member) -> bool) {
        // The fences of the long holds that go, increasing (members are in grant order).
        let mut long_gone = Vec::new();
        self.members.retain(|member| {
            let goes = gone(member);
            if goes && member.holder.long {
                long_gone.push(member.fence);
            }
            !goes
        });
        self.prints.clear();
        self.prints.extend(self.members.iter().map(|m| m.print));
        self.thinned();
        if long_gone.is_empty() {
            return;
        }
        if let Some(fences) = self.hints.long_fences.borrow_mut().as_mut() {
            fences.retain(|fence| long_gone.binary_search(fence).is_err());
        }
    }

    /// What is kept about the holders, once `member` is one of them: the earliest deadline
    /// (when known), the bound on grant times not yet long, the long fences (in order).
    fn joins(&self, member: &Member) {
        let holder = &member.holder;
        if let Some(earliest) = self.hints.earliest.get() {
            self.hints.earliest.set(Some(earliest.min(holder.deadline)));
        }
        if holder.long {
            self.hints.long.set(Some(true));
            if let Some(fences) = self.hints.long_fences.borrow_mut().as_mut() {
                let at = fences.partition_point(|fence| *fence < member.fence);
                if fences.get(at) != Some(&member.fence) {
                    fences.insert(at, member.fence);
                }
            }
        } else if let Some(bound) = self.hints.unmarked.get().filter(|_| holder.grant.since > 0) {
            self.hints.unmarked.set(Some(bound.min(holder.grant.since)));
        }
    }

    /// What is kept about the holders, once `member` is no longer one of them: a bound stays
    /// a bound; its fence leaves the long ones.
    fn left(&self, member: &Member) {
        if member.holder.long {
            if let Some(fences) = self.hints.long_fences.borrow_mut().as_mut() {
                fences.retain(|fence| *fence != member.fence);
            }
        }
    }

    /// Removes the holder at `index` (the bound on the deadlines stays a bound).
    pub(super) fn remove(&mut self, index: usize) -> Option<Member> {
        if index >= self.members.len() || index >= self.prints.len() {
            return None;
        }
        self.prints.remove(index);
        let member = self.members.remove(index);
        self.left(&member);
        self.thinned();
        Some(member)
    }

    /// Members left: those left are in order if they were; out of order, look again.
    fn thinned(&self) {
        if self.hints.ordered.get() == Some(false) {
            self.hints.ordered.set(None);
        }
    }

    /// The grant time of the oldest member whose grant time is known. Members come in grant
    /// order, so unless a clock stepped back or a grant was loaded without its time, the first
    /// one's: once a pass over them found them so, it is read without a pass (a lock with
    /// thousands of readers that leave oldest first does not pass over the others each time).
    pub fn oldest_grant(&self) -> Option<u64> {
        let first = self.members.first().map(|m| m.holder.grant.since);
        match self.hints.ordered.get() {
            Some(true) => first,
            Some(false) => self.oldest_known(),
            None => {
                let ordered = self
                    .members
                    .iter()
                    .try_fold(1, |last, m| {
                        let since = m.holder.grant.since;
                        (since >= last).then_some(since)
                    })
                    .is_some();
                self.hints.ordered.set(Some(ordered));
                if ordered {
                    first
                } else {
                    self.oldest_known()
                }
            }
        }
    }

    fn oldest_known(&self) -> Option<u64> {
        self.members
            .iter()
            .map(|m| m.holder.grant.since)
            .filter(|since| *since > 0)
            .min()
    }

    /// The fences of the members marked long, in order: looked for once (a pass over the
    /// members), then kept as members come, go or are marked, so a change of a lock with
    /// thousands of holders does not pass over them all to learn which of its holds are long.
    pub(super) fn long_fences(&self) -> Vec<u64> {
        if let Some(fences) = self.hints.long_fences.borrow().as_ref() {
            return fences.clone();
        }
        let fences: Vec<u64> = self
            .members
            .iter()
            .filter(|m| m.holder.long)
            .map(|m| m.fence)
            .collect();
        self.hints.long_fences.replace(Some(fences.clone()));
        fences
    }

    /// A time no later than the earliest deadline among the holders (the earliest itself when
    /// the holders were looked through since one left); `None` without holders.
    pub fn deadline_bound(&self) -> Option<u64> {
        if self.members.is_empty() {
            return None;
        }
        self.hints.earliest.get().or_else(|| self.earliest_exact())
    }

    /// The earliest deadline among the holders, looked for (and kept).
    fn earliest_exact(&self) -> Option<u64> {
        let earliest = self.members.iter().map(|m| m.holder.deadline).min()?;
        self.hints.earliest.set(Some(earliest));
        Some(earliest)
    }

    /// The earliest grant time (known) among the members not marked long, or a time no later
    /// than it but after `fresh_after`: a member leaving or being marked keeps the kept bound a
    /// bound, and it is looked for again (one pass over the members) only once it is no later
    /// than `fresh_after`. So with thousands of holders a change costs O(1), and a pass is
    /// made once per hold that becomes long. `None`: every member is marked, or of unknown
    /// grant time.
    pub(super) fn unmarked_since(&self, fresh_after: u64) -> Option<u64> {
        let bound = match self.hints.unmarked.get() {
            Some(bound) if bound > fresh_after => bound,
            _ => {
                let exact = self
                    .members
                    .iter()
                    .filter(|m| !m.holder.long && m.holder.grant.since > 0)
                    .map(|m| m.holder.grant.since)
                    .min()
                    .unwrap_or(u64::MAX);
                self.hints.unmarked.set(Some(exact));
                exact
            }
        };
        (bound != u64::MAX).then_some(bound)
    }

    /// False when no member was announced as a long hold (looked for once, then kept).
    pub(super) fn maybe_long(&self) -> bool {
        self.hints.long.get().unwrap_or_else(|| {
            let long = self.members.iter().any(|m| m.holder.long);
            self.hints.long.set(Some(long));
            long
        })
    }

    /// True when a holder's lease ran out by `now`.
    pub(super) fn any_overdue(&self, now: u64) -> bool {
        if self.deadline_bound().is_none_or(|bound| bound > now) {
            return false;
        }
        self.earliest_exact()
            .is_some_and(|earliest| earliest <= now)
    }

    /// How many holders have a lease still running at `now`.
    pub(super) fn live_count(&self, now: u64) -> usize {
        if !self.any_overdue(now) {
            return self.members.len();
        }
        self.members
            .iter()
            .filter(|m| m.holder.deadline > now)
            .count()
    }

    /// Drops the holders whose lease ran out by `now`.
    pub(super) fn drop_overdue(&mut self, now: u64) {
        if self.any_overdue(now) {
            self.change_members(|members| members.retain(|m| m.holder.deadline > now));
        }
    }
}

/// What a group's members were found to be, kept until they change (`None`: look again). Not
/// part of the lock's value: equal groups compare equal whatever they hold.
#[derive(Clone, Debug, Default)]
pub(super) struct Hints {
    /// See [`Group::deadline_bound`].
    earliest: std::cell::Cell<Option<u64>>,
    /// Whether a member may be marked long (true may be stale after it left: never false while
    /// one is).
    pub(super) long: std::cell::Cell<Option<bool>>,
    /// See [`Group::unmarked_since`]: a time no later than the grant time of every member not
    /// marked long (`u64::MAX`: none).
    unmarked: std::cell::Cell<Option<u64>>,
    /// See [`Group::long_fences`]: the fences of the members marked long, in order.
    long_fences: std::cell::RefCell<Option<Vec<u64>>>,
    /// See [`Group::oldest_grant`]: whether every member's grant time is known and none is
    /// earlier than the one before it (true may stay after members left; never true while one
    /// is out of order).
    ordered: std::cell::Cell<Option<bool>>,
}

impl Hints {
    /// The hints that still hold after members' deadlines moved (a renewal, a refresh): those
    /// about grant times and long marks, which such changes never touch.
    pub(super) fn after_deadlines_moved(&self) -> Hints {
        Hints {
            earliest: std::cell::Cell::new(None),
            long: self.long.clone(),
            unmarked: self.unmarked.clone(),
            long_fences: self.long_fences.clone(),
            ordered: self.ordered.clone(),
        }
    }

    /// Members were marked long: what is known of the long ones is looked for again.
    pub(super) fn marked(&self) {
        self.long.set(None);
        self.long_fences.replace(None);
    }
}

impl PartialEq for Hints {
    fn eq(&self, _: &Hints) -> bool {
        true
    }
}

impl Eq for Hints {}

#[cfg(test)]
mod tests {
    use crate::lock::codec::{member_effect_args, parse_member_effect, removals_effect_args};
    use crate::lock::core::tests::{asking, dg, granted, T0};
    use crate::lock::core::{Acquire, Lock, MemberChange, Mode};
    use crate::lock::event::Event;

    #[test]
    fn a_token_is_found_among_many_holders_and_beside_one_with_the_same_fingerprint() {
        // Two tokens whose fingerprints collide (a birthday search over 32 bits).
        let mut seen = std::collections::HashMap::new();
        let (x, y) = (0u32..)
            .find_map(|n| {
                let token = format!("t{n}").into_bytes();
                let earlier = seen.insert(dg(&token).print(), token.clone())?;
                Some((earlier, token))
            })
            .unwrap();
        assert_ne!(x, y);
        let mut lock = Lock::default();
        let mut fence = 0;
        let mut tokens: Vec<Vec<u8>> = (0..40).map(|n| format!("h{n}").into_bytes()).collect();
        tokens.insert(3, x.clone());
        tokens.insert(20, y.clone());
        for (n, token) in tokens.iter().enumerate() {
            let ttl = 1000 + n as u64;
            fence = granted(lock.grant(&asking(token, ttl, Mode::Shared), fence, T0));
        }
        for (index, token) in tokens.iter().enumerate() {
            assert_eq!(lock.live_member_index(&dg(token), T0), Some(index));
            assert_eq!(
                lock.member(&dg(token)).map(|m| *m.holder.token()),
                Some(dg(token))
            );
        }
        assert_eq!(lock.live_member_index(&dg(b"nobody"), T0), None);
        // The colliding holders end one at a time; the other stays found.
        let (x, y) = (dg(&x), dg(&y));
        assert_eq!(lock.release(&y, T0), Some(true));
        assert!(lock.holds(&x, T0) && !lock.holds(&y, T0));
        assert_eq!(lock.release(&x, T0), Some(true));
        assert!(!lock.holds(&x, T0));
        assert_eq!(lock.members().len(), 40);
        // A member whose lease ran out is not live, but is still its token's member.
        assert_eq!(lock.live_member_index(&dg(b"h0"), T0 + 1000), None);
        assert!(lock.member(&dg(b"h0")).is_some());
    }

    #[test]
    fn the_oldest_grant_is_read_off_the_first_holder_only_while_holders_are_in_grant_order() {
        // The exact answer, by a pass over every holder.
        let exact = |lock: &Lock| {
            lock.all_holders()
                .map(|(_, h)| h.grant.since)
                .filter(|since| *since > 0)
                .min()
        };
        let mut lock = Lock::default();
        let mut fence = 0;
        // Granted in time order, then once with the clock stepped back.
        for (n, at) in [0, 10, 20, 5, 30].into_iter().enumerate() {
            let token = format!("r{n}").into_bytes();
            fence = granted(lock.grant(&asking(&token, 60_000, Mode::Shared), fence, T0 + at));
            assert_eq!(lock.oldest_grant(), exact(&lock), "after grant {n}");
        }
        assert_eq!(lock.oldest_grant(), Some(T0));
        // The oldest leaves, then the one out of order: the next oldest each time.
        for (token, oldest) in [(b"r0", T0 + 5), (b"r3", T0 + 10), (b"r1", T0 + 20)] {
            assert_eq!(lock.release(&dg(token), T0 + 40), Some(true));
            assert_eq!(lock.oldest_grant(), exact(&lock));
            assert_eq!(lock.oldest_grant(), Some(oldest));
        }
        // In order again: a holder granted later stays behind the first.
        fence = granted(lock.grant(&asking(b"late", 60_000, Mode::Shared), fence, T0 + 50));
        assert_eq!(lock.oldest_grant(), Some(T0 + 20));
        // A holder out of order joins last: the first is no longer the oldest.
        granted(lock.grant(&asking(b"early", 60_000, Mode::Shared), fence, T0 + 1));
        assert_eq!(lock.oldest_grant(), Some(T0 + 1));
        assert_eq!(lock.oldest_grant(), exact(&lock));
    }

    #[test]
    fn the_next_long_hold_is_never_late_whatever_comes_and_goes() {
        // The exact answer, by a pass over every holder.
        let exact = |lock: &Lock, threshold: u64| {
            lock.all_holders()
                .filter(|(_, h)| !h.long && h.grant.since > 0)
                .map(|(_, h)| h.grant.since + threshold)
                .min()
        };
        let threshold = 100;
        let mut lock = Lock::default();
        let mut fence = 0;
        let mut now = T0;
        let mut state = 7u64;
        for step in 0..2_000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            now += state >> 61;
            let token = format!("h{}", (state >> 33) % 64).into_bytes();
            match (state >> 40) % 4 {
                0 | 1 => {
                    if let Ok(Acquire::Granted { fence: f }) =
                        lock.grant(&asking(&token, 10_000, Mode::Shared), fence, now)
                    {
                        fence = f;
                    }
                }
                2 => {
                    lock.release(&dg(&token), now);
                }
                _ => {
                    lock.mark_long(threshold, now);
                }
            }
            let (due, truth) = (lock.long_due(threshold, now), exact(&lock, threshold));
            // Early is allowed, late never, and never in the past while the truth is not.
            match (due, truth) {
                (Some(due), Some(truth)) => {
                    assert!(due <= truth, "step {step}: {due} after {truth}");
                    assert!(
                        due > now || truth <= now,
                        "step {step}: {due} <= {now} < {truth}"
                    );
                }
                // A look that finds nothing, but never in the past.
                (Some(due), None) => assert!(due > now, "step {step}: {due} <= {now}"),
                (None, None) => {}
                (None, Some(truth)) => panic!("step {step}: none, but one at {truth}"),
            }
        }
    }

    #[test]
    fn a_renewal_keeps_what_is_known_of_grant_times_and_long_holds() {
        let mut lock = Lock::default();
        let mut fence = 0;
        for n in 0..20u64 {
            let token = format!("r{n}").into_bytes();
            fence = granted(lock.grant(&asking(&token, 10_000, Mode::Shared), fence, T0 + n));
        }
        assert_eq!(lock.long_due(100, T0), Some(T0 + 100));
        assert_eq!(lock.mark_long(100, T0 + 101).len(), 2);
        assert_eq!(lock.long_fences().len(), 2);
        let group = lock.group.as_deref().expect("a group");
        assert!(group.hints.long_fences.borrow().is_some());
        // A renewal moves a deadline only: the bound and the long fences stay known.
        assert!(lock.renew(&dg(b"r5"), 10_000, T0 + 102));
        let group = lock.group.as_deref().expect("a group");
        assert!(group.hints.unmarked.get().is_some());
        assert!(group.hints.long_fences.borrow().is_some());
        assert_eq!(lock.long_fences().len(), 2);
        assert_eq!(lock.long_due(100, T0 + 102), Some(T0 + 102));
        // A long holder leaving takes its fence out of what is kept.
        assert_eq!(lock.release(&dg(b"r0"), T0 + 103), Some(true));
        assert_eq!(lock.long_fences().len(), 1);
    }

    /// What the group answers from what it keeps (the earliest deadline, the live count, the
    /// long holds, the next one due), against a pass over every holder.
    fn check_kept(lock: &Lock, threshold: u64, now: u64, step: u64) {
        let members = lock.members();
        let earliest = members.iter().map(|m| m.holder.deadline).min();
        assert!(
            lock.next_deadline() <= earliest,
            "step {step}: deadline bound"
        );
        let live = members.iter().filter(|m| m.holder.deadline > now).count();
        assert_eq!(lock.live_count(now), live, "step {step}: live count");
        assert_eq!(lock.is_overdue(now), live < members.len(), "step {step}");
        let long: Vec<u64> = members
            .iter()
            .filter(|m| m.holder.long)
            .map(|m| m.fence)
            .collect();
        assert_eq!(lock.long_fences(), long, "step {step}: long fences");
        let next_long = members
            .iter()
            .filter(|m| !m.holder.long && m.holder.grant.since > 0)
            .map(|m| m.holder.grant.since + threshold)
            .min();
        if let Some(truth) = next_long {
            let due = lock.long_due(threshold, now);
            assert!(due.is_some_and(|due| due <= truth), "step {step}: long due");
        }
    }

    /// The lock without its long-hold marks (a replicated holder carries none).
    fn unmarked(lock: &Lock) -> Lock {
        let mut lock = lock.clone();
        if let Some(group) = lock.group.as_deref_mut() {
            group.change_members(|members| {
                for member in members {
                    member.holder.long = false;
                }
            });
        }
        lock
    }

    #[test]
    fn a_replica_applying_holders_changes_keeps_what_it_knows_of_them_true() {
        let threshold = 100;
        let (mut primary, mut replica) = (Lock::default(), Lock::default());
        let mut fence = 0;
        let mut now = T0;
        let mut state = 11u64;
        let (mut long_replaced, mut many_gone) = (0u32, 0u32);
        for step in 0..4_000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            now += state >> 61;
            let name = format!("h{}", (state >> 33) % 48).into_bytes();
            let token = dg(&name);
            let ttl = 20 + (state >> 20) % 400;
            let one = |event, lock: &Lock| Some(member_effect_args(event, lock, &token, now));
            let effect = match (state >> 40) % 8 {
                0..=2 => match primary.grant(&asking(&name, ttl, Mode::Shared), fence, now) {
                    Ok(Acquire::Granted { fence: f }) => {
                        fence = f;
                        one(Event::Acquire, &primary)
                    }
                    Ok(Acquire::Refreshed { .. }) => one(Event::Acquire, &primary),
                    _ => None,
                },
                3 => primary
                    .release(&token, now)
                    .and_then(|_| one(Event::Release, &primary)),
                4 => primary
                    .renew(&token, ttl, now)
                    .then(|| one(Event::Renew, &primary))
                    .flatten(),
                5 => {
                    // Expiries, replicated together: a few, or (once in a while, most leases
                    // run out) many at once.
                    if (state >> 50) % 4 == 0 {
                        now += 250;
                    }
                    let gone = primary.expire_members(now, usize::MAX);
                    let tokens: Vec<_> = gone.iter().map(|m| *m.holder.token()).collect();
                    many_gone += u32::from(tokens.len() > 8);
                    (!tokens.is_empty())
                        .then(|| removals_effect_args(Event::Expired, &primary, &tokens, now))
                }
                _ => {
                    // Each marks its own holds long (a replica does once promoted); a
                    // replicated change of a marked holder brings it unmarked.
                    primary.mark_long(threshold, now);
                    replica.mark_long(threshold, now);
                    None
                }
            };
            if let Some(args) = effect {
                let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let effect = parse_member_effect(&refs)
                    .and_then(Result::ok)
                    .unwrap_or_else(|| panic!("step {step}: not a member effect"));
                if let MemberChange::Set(member) = &effect.change {
                    let was = replica.member(member.holder.token());
                    long_replaced += u32::from(was.is_some_and(|m| m.holder.long));
                }
                let applied =
                    replica.apply_member(effect.fence, effect.limit, effect.now, effect.change);
                assert_eq!(applied, Ok(()), "step {step}");
            }
            assert_eq!(unmarked(&replica), unmarked(&primary), "step {step}");
            // Asked after most changes (as the server asks), so what is kept is kept on; not
            // after every one, so that it is also looked for again.
            if step % 5 != 0 {
                check_kept(&replica, threshold, now, step);
            }
        }
        // The walk had marked holds replaced, and many expiries replicated together.
        assert!(
            long_replaced > 10 && many_gone > 10,
            "{long_replaced} {many_gone}"
        );
    }

    #[test]
    fn what_a_group_keeps_about_its_members_follows_them() {
        let mut lock = Lock::default();
        let a = granted(lock.grant(&asking(b"a", 1000, Mode::Shared), 0, T0));
        let b = granted(lock.grant(&asking(b"b", 3000, Mode::Shared), a, T0));
        let c = granted(lock.grant(&asking(b"c", 2000, Mode::Shared), b, T0));
        assert_eq!(lock.next_deadline(), Some(T0 + 1000));
        assert!(lock.has_room(T0 + 999) && !lock.is_overdue(T0 + 999));
        // The earliest holder leaves: the lease timer may look early, never late, and a look
        // for overdue holders finds the new earliest.
        assert_eq!(lock.release(&dg(b"a"), T0 + 10), Some(true));
        assert!(lock.next_deadline() <= Some(T0 + 2000));
        assert!(!lock.is_overdue(T0 + 1500));
        assert_eq!(lock.next_deadline(), Some(T0 + 2000));
        // A renewal moves a deadline back; a new holder may bring an earlier one.
        assert!(lock.renew(&dg(b"c"), 100, T0 + 20));
        assert_eq!(lock.next_deadline(), Some(T0 + 120));
        let d = granted(lock.grant(&asking(b"d", 50, Mode::Shared), c, T0 + 30));
        assert_eq!(lock.next_deadline(), Some(T0 + 80));
        assert!(lock.is_overdue(T0 + 80));
        assert!(lock.expire(T0 + 80));
        assert_eq!(lock.members().len(), 2);
        assert!(!lock.holds(&dg(b"d"), T0 + 80) && d > c);
        // Long holds: none until one is marked, then that one until it ends.
        assert_eq!(lock.long_fences(), Vec::<u64>::new());
        assert_eq!(lock.mark_long(50, T0 + 100).len(), 2);
        assert_eq!(lock.long_fences(), vec![b, c]);
        assert_eq!(lock.release(&dg(b"c"), T0 + 100), Some(true));
        assert_eq!(lock.long_fences(), vec![b]);
        // A long exclusive hold that becomes a shared one stays long.
        let mut lock = Lock::default();
        let x = granted(lock.grant(&asking(b"x", 1000, Mode::Exclusive), 0, T0));
        assert_eq!(lock.mark_long(10, T0 + 10).len(), 1);
        let downgraded = lock.grant(&asking(b"x", 1000, Mode::Shared), x, T0 + 20);
        assert_eq!(downgraded, Ok(Acquire::Downgraded { fence: x }));
        assert_eq!(lock.long_fences(), vec![x]);
        granted(lock.grant(&asking(b"y", 1000, Mode::Shared), x, T0 + 20));
        assert_eq!(lock.long_fences(), vec![x]);
    }
}

/// review15: the kept `ordered` hint of e9201a1 against the exact oldest grant, through every
/// way members change, on a primary and on a replica applying its effects.
#[cfg(test)]
mod review15_tests {
    use super::{Group, Member, MemberChange};
    use crate::lock::codec::{
        effect_args, member_effect_args, parse_effect, parse_member_effect, removals_effect_args,
    };
    use crate::lock::core::tests::{asking, dg, T0};
    use crate::lock::core::{Acquire, Lock, Mode};
    use crate::lock::event::Event;
    use crate::lock::grant::{Grant, Holder};

    use crate::lock::model_tests::Rng;

    /// The exact answer, by a pass over every holder.
    fn exact(lock: &Lock) -> Option<u64> {
        lock.all_holders()
            .map(|(_, h)| h.grant.since)
            .filter(|since| *since > 0)
            .min()
    }

    fn whole_state(lock: &Lock) -> Lock {
        let args = effect_args(Event::Sync, lock);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        parse_effect(&refs).expect("a whole state parses").lock
    }

    /// Applies a member effect as a replica does; false when the replica refused it (the
    /// walk then sends the whole state, as a resync would).
    fn apply(replica: &mut Lock, args: &[Vec<u8>], what: &str) -> bool {
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let e = parse_member_effect(&refs)
            .unwrap_or_else(|| panic!("{what}: not a member effect"))
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        replica
            .apply_member(e.fence, e.limit, e.now, e.change)
            .is_ok()
    }

    /// A member granted at `since` (0: unknown, as loaded from an older release).
    fn member(name: &[u8], fence: u64, since: u64, deadline: u64) -> Member {
        Member::new(
            fence,
            Holder {
                deadline,
                holds: 1,
                session: false,
                provisional: false,
                long: false,
                grant: Box::new(Grant::new(dg(name), 0, since, 0, b"")),
            },
        )
    }

    #[test]
    fn review15_oldest_grant_is_exact_whatever_changes_the_members() {
        let cases: u64 = std::env::var("REVIEW15_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(80);
        let mut ops_seen = [0u32; 20];
        let (mut applied, mut refused) = (0u32, 0u32);
        for case in 0..cases {
            let mut rng = Rng(0x0DE5_7000 + case);
            let mut primary = Lock::default();
            let mut replica = Lock::default();
            let mut now = T0;
            let mut floor = 0;
            let limit = if case % 3 == 1 {
                6 + (case % 7) as u32
            } else {
                0
            };
            let mode = if limit == 0 {
                Mode::Shared
            } else {
                Mode::Permit(limit)
            };
            let pool = 4 + rng.below(30);
            for step in 0..500u64 {
                let what = format!("case {case} step {step}");
                // Time goes on, stands still, or steps back (a clock step).
                now = match rng.below(12) {
                    0 => now,
                    1..=7 => now + rng.below(30),
                    8 | 9 => now + rng.below(400),
                    _ => now.saturating_sub(rng.below(200)).max(T0 - 5_000),
                };
                let name = format!("t{}", rng.below(pool)).into_bytes();
                let token = dg(&name);
                let ttl = 200 + rng.below(1_500);
                let mut effect: Option<Vec<Vec<u8>>> = None;
                let mut whole = false;
                let op = rng.below(20);
                ops_seen[op as usize] += 1;
                match op {
                    0..=5 => {
                        let mut request = asking(&name, ttl, mode);
                        request.reentrant = rng.chance(25);
                        request.session = rng.chance(30);
                        let had_group = primary.group.is_some();
                        match primary.grant(&request, floor, now) {
                            Ok(Acquire::Granted { fence }) => {
                                floor = floor.max(fence);
                                if had_group && primary.group.is_some() {
                                    effect = Some(member_effect_args(
                                        Event::Acquire,
                                        &primary,
                                        &token,
                                        now,
                                    ));
                                } else {
                                    whole = true;
                                }
                            }
                            Ok(Acquire::Refreshed { .. }) => {
                                effect = primary.group.is_some().then(|| {
                                    member_effect_args(Event::Acquire, &primary, &token, now)
                                });
                                whole = effect.is_none();
                            }
                            Ok(Acquire::Downgraded { .. }) => whole = true,
                            _ => {}
                        }
                    }
                    6 => {
                        // A member of unknown grant time joins (a holder loaded from an older
                        // release's RDB, or applied by a replica as such).
                        let cap = if limit == 0 { 1_000 } else { limit as usize };
                        if let Some(g) = primary.group.as_deref_mut() {
                            g.drop_overdue(now);
                        }
                        if primary.holder.is_none() && primary.live_count(now) < cap {
                            let fence = primary.fence.max(floor) + 1;
                            if !primary.members().iter().any(|m| m.holder.token() == &token) {
                                primary.group.get_or_insert_with(Box::default).limit = limit;
                                let g = primary.group.as_deref_mut().unwrap();
                                g.push(member(&name, fence, 0, now + ttl));
                                primary.fence = fence;
                                floor = fence;
                                effect =
                                    Some(member_effect_args(Event::Acquire, &primary, &token, now));
                            }
                        }
                    }
                    7 => {
                        if limit == 0 {
                            let request = asking(&name, ttl, Mode::Exclusive);
                            if let Ok(Acquire::Granted { fence } | Acquire::Refreshed { fence }) =
                                primary.grant(&request, floor, now)
                            {
                                floor = floor.max(fence);
                                whole = true;
                            }
                        }
                    }
                    8..=10 => {
                        if let Some(done) = primary.release(&token, now) {
                            let event = if done {
                                Event::Release
                            } else {
                                Event::DropHold
                            };
                            effect = primary
                                .group
                                .is_some()
                                .then(|| member_effect_args(event, &primary, &token, now));
                            whole = effect.is_none();
                        }
                    }
                    11 => {
                        if primary.renew(&token, ttl, now) {
                            effect = primary
                                .group
                                .is_some()
                                .then(|| member_effect_args(Event::Renew, &primary, &token, now));
                            whole = effect.is_none();
                        }
                    }
                    12 | 13 => {
                        if rng.chance(40) {
                            now += 800 + rng.below(900);
                        }
                        let budget = [1, 3, 9, usize::MAX][rng.below(4) as usize];
                        let gone = primary.expire_members(now, budget);
                        let tokens: Vec<_> = gone.iter().map(|m| *m.holder.token()).collect();
                        if !tokens.is_empty() {
                            if primary.group.is_some() {
                                effect = Some(removals_effect_args(
                                    Event::Expired,
                                    &primary,
                                    &tokens,
                                    now,
                                ));
                            } else {
                                whole = true;
                            }
                        }
                        if primary.expire(now) {
                            whole = true;
                        }
                    }
                    14 => {
                        let tokens: std::collections::HashSet<_> = (0..1 + rng.below(12))
                            .map(|_| dg(format!("t{}", rng.below(pool)).as_bytes()))
                            .collect();
                        let gone = primary.end_member_sessions(&tokens, now);
                        let tokens: Vec<_> = gone.iter().map(|m| *m.holder.token()).collect();
                        if !tokens.is_empty() {
                            if primary.group.is_some() {
                                effect = Some(removals_effect_args(
                                    Event::SessionEnd,
                                    &primary,
                                    &tokens,
                                    now,
                                ));
                            } else {
                                whole = true;
                            }
                        }
                    }
                    15 => {
                        if rng.chance(30) && primary.force_release(now) {
                            whole = true;
                        }
                    }
                    16 => {
                        // A member's grant time changes in place (a replica's member restated
                        // by the primary, `replace`): earlier, later or unknown.
                        if let Some(g) = primary.group.as_deref_mut() {
                            if !g.members.is_empty() {
                                let i = rng.below(g.members.len() as u64) as usize;
                                let mut m = g.members[i].clone();
                                m.holder.grant.since = match rng.below(3) {
                                    0 => 0,
                                    1 => now.saturating_sub(rng.below(5_000)),
                                    _ => now + rng.below(100),
                                };
                                g.replace(i, m);
                                whole = true;
                            }
                        }
                    }
                    17 => {
                        // Removals straight on the group: one, from the back, where.
                        if let Some(g) = primary.group.as_deref_mut() {
                            let n = g.members.len() as u64;
                            if n > 0 {
                                match rng.below(3) {
                                    0 => {
                                        g.remove(rng.below(n) as usize);
                                    }
                                    1 => {
                                        let mut at: Vec<usize> = (0..1 + rng.below(3))
                                            .map(|_| rng.below(n) as usize)
                                            .collect();
                                        at.sort_unstable();
                                        at.dedup();
                                        at.reverse();
                                        g.remove_from_back(&at);
                                    }
                                    _ => {
                                        let m = 2 + rng.below(3);
                                        g.remove_where(|x| x.fence % m == 0);
                                    }
                                }
                                if g.limit == 0 && g.members.is_empty() {
                                    primary.group = None;
                                }
                                whole = true;
                            }
                        }
                    }
                    18 => {
                        // A whole state: the primary's lock as loaded (codec round trip).
                        primary = whole_state(&primary);
                        whole = true;
                    }
                    _ => {
                        // Long marks (hint `marked`), then on.
                        let _ = primary.mark_long(100 + rng.below(500), now);
                    }
                }
                if let Some(args) = effect {
                    if apply(&mut replica, &args, &what) {
                        applied += 1;
                    } else {
                        refused += 1;
                        replica = whole_state(&primary);
                    }
                } else if whole {
                    replica = whole_state(&primary);
                }
                // Asked at most steps (keeping the hint), not at all at others.
                if rng.chance(85) {
                    assert_eq!(
                        primary.oldest_grant(),
                        exact(&primary),
                        "{what}: primary {:?}",
                        primary
                            .members()
                            .iter()
                            .map(|m| m.holder.grant.since)
                            .collect::<Vec<_>>()
                    );
                }
                if rng.chance(85) {
                    assert_eq!(
                        replica.oldest_grant(),
                        exact(&replica),
                        "{what}: replica {:?}",
                        replica
                            .members()
                            .iter()
                            .map(|m| m.holder.grant.since)
                            .collect::<Vec<_>>()
                    );
                }
            }
        }
        assert!(ops_seen.iter().all(|n| *n > 0), "{ops_seen:?}");
        // Most member effects apply as they are (the replica's own hint kept through them).
        assert!(
            applied > 20 * refused.max(1),
            "applied {applied}, refused {refused}"
        );
    }

    /// Direct sequences on a group: every order of push (in order, earlier, equal, unknown),
    /// replace, remove, remove_where, change_members, with the hint asked between each.
    #[test]
    fn review15_group_hint_through_direct_sequences() {
        for seed in 0..400u64 {
            let mut rng = Rng(0xAB00 + seed);
            let mut g = Group::default();
            let mut fence = 0;
            let mut t = T0;
            for step in 0..120 {
                let n = g.members.len() as u64;
                match rng.below(8) {
                    0..=2 => {
                        fence += 1;
                        let since = match rng.below(6) {
                            0 => 0,
                            1 => t.saturating_sub(rng.below(50)),
                            2 => t,
                            _ => {
                                t += rng.below(20);
                                t
                            }
                        };
                        g.push(member(
                            format!("m{fence}").as_bytes(),
                            fence,
                            since,
                            T0 + 1_000_000,
                        ));
                    }
                    3 if n > 0 => {
                        let i = rng.below(n) as usize;
                        let mut m = g.members[i].clone();
                        m.holder.grant.since = [0, T0 - 1, t, t + 5][rng.below(4) as usize];
                        g.replace(i, m);
                    }
                    4 if n > 0 => {
                        g.remove(rng.below(n) as usize);
                    }
                    5 if n > 0 => {
                        let m = 2 + rng.below(4);
                        g.remove_where(|x| x.fence % m == 0);
                    }
                    6 if n > 0 => {
                        let i = rng.below(n) as usize;
                        let since = [0, T0 - 3, t + 1][rng.below(3) as usize];
                        g.change_members(|ms| ms[i].holder.grant.since = since);
                    }
                    _ => {
                        g.hints = g.hints.after_deadlines_moved();
                    }
                }
                if rng.chance(70) {
                    let truth = g
                        .members
                        .iter()
                        .map(|m| m.holder.grant.since)
                        .filter(|s| *s > 0)
                        .min();
                    assert_eq!(
                        g.oldest_grant(),
                        truth,
                        "seed {seed} step {step}: {:?}",
                        g.members
                            .iter()
                            .map(|m| m.holder.grant.since)
                            .collect::<Vec<_>>()
                    );
                }
            }
        }
        let _ = MemberChange::Remove(Vec::new());
    }
}
