//! Review of a635652 (a replica applies one shared holder's change through the group's kept
//! hints instead of walking every member). Each test fails if a suspicion is real:
//!
//! - `review14_apply_member_equals_the_walk_it_replaced`: the new `Lock::apply_member` against
//!   the walk it replaced (copied below from the parent commit, `reference_apply`), on a
//!   primary's real effects (grants, refreshes, reentrant holds and drops, renewals, releases,
//!   expiries one by one and many together, session ends) interleaved with whole states (a
//!   force release, a downgrade, exclusive grants, a full sync from the effect codec) and with
//!   long marks on both sides; and on adversarial changes (fences off by one, limits up to and
//!   over the cap, tokens absent, duplicated, reused after expiry, >8 and <=8 removals): the
//!   same answer (accepted / refused) and the same lock, and what the group keeps (earliest
//!   deadline bound, live count, overdue, long fences, next long due, fingerprints) true.
//! - `review14_malformed_member_effects_never_panic`: mutated `LOCK.APPLY` member effects
//!   (parsed as the AOF loader parses them) applied to locks of every shape: an error, never a
//!   panic, and the same answer as the walk.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::lock::codec::{
    effect_args, member_effect_args, parse_effect, parse_member_effect, removals_effect_args,
};
use crate::lock::core::tests::{asking, dg, T0};
use crate::lock::core::{Acquire, Lock, Mode, Request, MAX_HOLDERS};
use crate::lock::event::Event;
use crate::lock::grant::{Grant, Holder};
use crate::lock::group::{Group, Member, MemberChange};
use crate::lock::token::TokenDigest;

/// SplitMix64.
use crate::lock::model_tests::Rng;

/// `Lock::apply_member` as it was before a635652 (one walk over the members per change, the
/// group's hints reset by `change_members`).
fn reference_apply(
    lock: &mut Lock,
    fence: u64,
    limit: u32,
    now: u64,
    change: MemberChange,
) -> Result<(), &'static str> {
    if fence < lock.fence || limit > MAX_HOLDERS {
        return Err("member change out of order");
    }
    if let MemberChange::Set(member) = &change {
        let refresh = lock
            .members()
            .iter()
            .any(|m| m.is(member.holder.token(), member.print) && m.fence == member.fence);
        if !refresh {
            let stay = lock
                .members()
                .iter()
                .filter(|m| m.holder.deadline > now && !m.is(member.holder.token(), member.print))
                .count();
            let cap = if limit == 0 { MAX_HOLDERS } else { limit };
            if member.fence != fence || fence <= lock.fence || stay >= cap as usize {
                return Err("member change out of order");
            }
        }
    }
    lock.holder = None;
    lock.delayed_until = 0;
    lock.fence = fence;
    let group = lock.group.get_or_insert_with(Box::default);
    group.limit = limit;
    match change {
        MemberChange::Set(member) => {
            let same = group.find(member.holder.token(), |m| m.fence == member.fence);
            match same {
                Some(index) => group.change_members(|members| members[index] = member),
                None => {
                    group.change_members(|members| {
                        members.retain(|m| m.holder.deadline > now);
                        members.retain(|m| !m.is(member.holder.token(), member.print));
                    });
                    group.push(member);
                }
            }
        }
        MemberChange::Remove(tokens) => {
            let gone: HashSet<TokenDigest> = tokens.into_iter().collect();
            group.change_members(|members| {
                members.retain(|m| !gone.contains(m.holder.token()));
            });
        }
    }
    if group.limit == 0 && group.members.is_empty() {
        lock.group = None;
    }
    Ok(())
}

/// The lock as compared (hints compare equal whatever they hold; the long marks are in memory
/// only and a replicated holder carries none).
fn unmarked(lock: &Lock) -> Lock {
    let mut lock = lock.clone();
    if let Some(holder) = lock.holder.as_mut() {
        holder.long = false;
    }
    if let Some(group) = lock.group.as_deref_mut() {
        for member in &mut group.members {
            member.holder.long = false;
        }
    }
    lock
}

/// What the group answers from what it keeps, against a pass over the holders; asked in an
/// order that varies (`order`), as commands ask in different orders.
fn check_kept(lock: &Lock, threshold: u64, now: u64, order: u64, what: &str) {
    let members = lock.members();
    if let Some(group) = lock.group.as_deref() {
        let prints: Vec<u32> = group.members.iter().map(|m| m.print).collect();
        assert_eq!(group.prints, prints, "{what}: fingerprints");
        let fences: Vec<u64> = group.members.iter().map(|m| m.fence).collect();
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "{what}: members out of grant order {fences:?}"
        );
    }
    let mut checks: Vec<Box<dyn Fn()>> = vec![
        Box::new(|| {
            let earliest = members
                .iter()
                .map(|m| m.holder.deadline)
                .chain(lock.holder.as_ref().map(|h| h.deadline))
                .min();
            let bound = lock.next_deadline();
            assert!(
                bound <= earliest,
                "{what}: deadline bound {bound:?} later than the earliest {earliest:?}"
            );
            assert_eq!(
                bound.is_some(),
                earliest.is_some(),
                "{what}: bound presence"
            );
        }),
        Box::new(|| {
            let live = members.iter().filter(|m| m.holder.deadline > now).count()
                + usize::from(lock.holder.as_ref().is_some_and(|h| h.deadline > now));
            assert_eq!(lock.live_count(now), live, "{what}: live count");
        }),
        Box::new(|| {
            let overdue = members.iter().any(|m| m.holder.deadline <= now)
                || lock.holder.as_ref().is_some_and(|h| h.deadline <= now);
            assert_eq!(lock.is_overdue(now), overdue, "{what}: overdue");
        }),
        Box::new(|| {
            let long: Vec<u64> = lock
                .holder
                .as_ref()
                .filter(|h| h.long)
                .map(|_| lock.fence)
                .into_iter()
                .chain(members.iter().filter(|m| m.holder.long).map(|m| m.fence))
                .collect();
            assert_eq!(lock.long_fences(), long, "{what}: long fences");
        }),
        Box::new(|| {
            let next_long = members
                .iter()
                .map(|m| &m.holder)
                .chain(lock.holder.as_ref())
                .filter(|h| !h.long && h.grant.since > 0)
                .map(|h| h.grant.since.saturating_add(threshold))
                .min();
            let due = lock.long_due(threshold, now);
            if let Some(truth) = next_long {
                assert!(
                    due.is_some_and(|due| due <= truth),
                    "{what}: long due {due:?} later than {truth}"
                );
            }
        }),
    ];
    let n = checks.len();
    checks.rotate_left((order as usize) % n);
    if order % 2 == 1 {
        checks.reverse();
    }
    for check in &checks {
        check();
    }
}

/// Applies the same change to the new and the reference replica: the same answer, the same lock.
fn apply_both(
    new: &mut Lock,
    old: &mut Lock,
    fence: u64,
    limit: u32,
    now: u64,
    change: MemberChange,
    what: &str,
) -> Result<(), &'static str> {
    let before = new.clone();
    let got = new.apply_member(fence, limit, now, change.clone());
    let want = reference_apply(old, fence, limit, now, change.clone());
    assert_eq!(
        got, want,
        "{what}: apply_member answered differently from the walk it replaced for {change:?} \
         (fence {fence}, limit {limit}, now {now}) on {before:?}"
    );
    assert_eq!(
        unmarked(new),
        unmarked(old),
        "{what}: a different lock than the walk's after {change:?}"
    );
    if got.is_err() {
        assert_eq!(
            unmarked(new),
            unmarked(&before),
            "{what}: a refused change changed it"
        );
    }
    got
}

fn member_of(token: &TokenDigest, fence: u64, deadline: u64, since: u64, holds: u32) -> Member {
    let mut request = asking(b"x", 1, Mode::Shared);
    request.token = *token;
    Member::new(
        fence,
        Holder {
            deadline,
            holds: holds.max(1),
            session: false,
            provisional: false,
            long: false,
            grant: Box::new(Grant::granted(&request, 0, since)),
        },
    )
}

/// Parses a `LOCK.APPLY` member effect as the server does.
fn parsed(args: &[Vec<u8>], what: &str) -> crate::lock::codec::MemberEffect {
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    parse_member_effect(&refs)
        .unwrap_or_else(|| panic!("{what}: not a member effect"))
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// A whole state as the replica receives it (a full sync, RESTORE, a rewritten AOF): the
/// effect's codec round trip, with hints of its own.
fn whole_state(lock: &Lock, _event: Event) -> Lock {
    let args = effect_args(Event::Sync, lock);
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    parse_effect(&refs).expect("a whole state parses").lock
}

#[test]
fn review14_apply_member_equals_the_walk_it_replaced() {
    let threshold = 150;
    let cases: u64 = std::env::var("REVIEW14_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut seen = [0u32; 16];
    for case in 0..cases {
        let mut rng = Rng(0x5EED_0000 + case);
        let mut primary = Lock::default();
        let (mut new, mut old) = (Lock::default(), Lock::default());
        let mut now = T0;
        let mut floor = 0;
        // A semaphore in some walks, shared holders in the others.
        let limit = match case % 3 {
            0 => 0,
            1 => 3 + (case % 5) as u32,
            _ => 12,
        };
        let mode = if limit == 0 {
            Mode::Shared
        } else {
            Mode::Permit(limit)
        };
        let pool = if case % 2 == 0 {
            6 + rng.below(40)
        } else {
            30 + rng.below(30)
        };
        for step in 0..600u64 {
            let what = format!("case {case} step {step}");
            now += match rng.below(10) {
                0 => 0,
                1..=6 => rng.below(20),
                7 | 8 => rng.below(200),
                _ => 400 + rng.below(400),
            };
            let name = format!("t{}", rng.below(pool)).into_bytes();
            let token = dg(&name);
            let ttl = if case % 2 == 0 {
                30 + rng.below(500)
            } else {
                400 + rng.below(900)
            };
            let mut member_effect: Option<Vec<Vec<u8>>> = None;
            let mut whole: Option<Event> = None;
            let op = rng.below(20);
            // Odd walks let holders pile up: no exclusive grants or force releases.
            let op = if case % 2 == 1 && matches!(op, 7 | 15 | 16) {
                0
            } else {
                op
            };
            match op {
                0..=6 => {
                    let mut request: Request = asking(&name, ttl, mode);
                    request.reentrant = rng.chance(25);
                    request.session = rng.chance(20);
                    let had_group = primary.group.is_some();
                    // The caller expires overdue holders first (announced), as the server does.
                    if rng.chance(if case % 2 == 1 { 5 } else { 50 }) {
                        let gone = primary.expire_members(now, usize::MAX);
                        if !gone.is_empty() {
                            let tokens: Vec<_> = gone.iter().map(|m| *m.holder.token()).collect();
                            seen[0] += u32::from(tokens.len() > 8);
                            let args = removals_effect_args(Event::Expired, &primary, &tokens, now);
                            let e = parsed(&args, &what);
                            apply_both(
                                &mut new, &mut old, e.fence, e.limit, e.now, e.change, &what,
                            )
                            .expect("a primary's expiry applies");
                        }
                    }
                    match primary.grant(&request, floor, now) {
                        Ok(Acquire::Granted { fence }) => {
                            floor = floor.max(fence);
                            seen[1] += 1;
                            if had_group && primary.group.is_some() {
                                member_effect =
                                    Some(member_effect_args(Event::Acquire, &primary, &token, now));
                            } else {
                                whole = Some(Event::Acquire);
                            }
                        }
                        Ok(Acquire::Refreshed { .. }) => {
                            seen[2] += 1;
                            member_effect =
                                Some(member_effect_args(Event::Acquire, &primary, &token, now));
                        }
                        Ok(Acquire::Downgraded { .. }) => whole = Some(Event::Downgrade),
                        _ => {}
                    }
                }
                7 => {
                    // An exclusive grant (when free) or a downgrade of it: whole states.
                    let request = asking(&name, ttl, Mode::Exclusive);
                    if primary.group.as_deref().is_none_or(|g| g.limit == 0) {
                        match primary.grant(&request, floor, now) {
                            Ok(Acquire::Granted { fence }) => {
                                floor = floor.max(fence);
                                whole = Some(Event::Acquire);
                            }
                            Ok(Acquire::Refreshed { .. }) => whole = Some(Event::Acquire),
                            _ => {}
                        }
                    }
                }
                8..=10 => match primary.release(&token, now) {
                    Some(true) => {
                        seen[3] += 1;
                        member_effect = primary
                            .group
                            .is_some()
                            .then(|| member_effect_args(Event::Release, &primary, &token, now));
                        if member_effect.is_none() {
                            whole = Some(Event::Release);
                        }
                    }
                    Some(false) => {
                        seen[4] += 1;
                        member_effect = primary
                            .group
                            .is_some()
                            .then(|| member_effect_args(Event::DropHold, &primary, &token, now));
                        if member_effect.is_none() {
                            whole = Some(Event::DropHold);
                        }
                    }
                    None => {}
                },
                11 | 12 => {
                    if primary.renew(&token, ttl, now) {
                        seen[5] += 1;
                        member_effect = primary
                            .group
                            .is_some()
                            .then(|| member_effect_args(Event::Renew, &primary, &token, now));
                        if member_effect.is_none() {
                            whole = Some(Event::Renew);
                        }
                    }
                }
                13 => {
                    // Expiries: one at a time, a few, or all (most leases run out together).
                    if rng.chance(30) {
                        now += 600 + rng.below(900);
                    }
                    let budget = [1, 3, 8, 9, usize::MAX][rng.below(5) as usize];
                    let gone = primary.expire_members(now, budget);
                    let tokens: Vec<_> = gone.iter().map(|m| *m.holder.token()).collect();
                    seen[6] += u32::from(tokens.len() > 8);
                    seen[7] += u32::from(!tokens.is_empty() && tokens.len() <= 8);
                    if !tokens.is_empty() {
                        member_effect =
                            Some(removals_effect_args(Event::Expired, &primary, &tokens, now));
                    } else if primary.expire(now) {
                        whole = Some(Event::Expired);
                    }
                }
                14 => {
                    // Sessions of some tokens end together.
                    let tokens: HashSet<TokenDigest> = (0..1 + rng.below(12))
                        .map(|_| dg(format!("t{}", rng.below(pool)).as_bytes()))
                        .collect();
                    let gone = primary.end_member_sessions(&tokens, now);
                    if !gone.is_empty() {
                        seen[8] += 1;
                        let tokens: Vec<_> = gone.iter().map(|m| *m.holder.token()).collect();
                        member_effect = Some(removals_effect_args(
                            Event::SessionEnd,
                            &primary,
                            &tokens,
                            now,
                        ));
                    }
                }
                15 => {
                    if primary.force_release(now) {
                        whole = Some(Event::ForceRelease);
                    }
                }
                16 => {
                    // A full sync (or RESTORE, DEBUG RELOAD): the replica takes the whole state.
                    seen[9] += 1;
                    whole = Some(Event::Sync);
                }
                17 => {
                    // Each marks its own holds long (a promoted replica does too).
                    primary.mark_long(threshold, now);
                    new.mark_long(threshold, now);
                    old.mark_long(threshold, now);
                }
                _ => {
                    // Adversarial changes (a corrupted AOF, a primary of another history):
                    // the same answer as the walk, and the same lock.
                    let fence = match rng.below(5) {
                        0 => new.fence.saturating_sub(1),
                        1 => new.fence,
                        _ => new.fence + 1 + rng.below(2),
                    };
                    let lim = match rng.below(6) {
                        0 => MAX_HOLDERS + 1,
                        1 => MAX_HOLDERS,
                        2 => 0,
                        _ => new.limit().max(1) + rng.below(3) as u32 - 1,
                    };
                    let at = now - rng.below(300);
                    let change = if rng.chance(50) {
                        // A Set: of an existing member (same fence) or a new one.
                        let existing = new
                            .members()
                            .get(rng.below(new.members().len() as u64 + 1) as usize)
                            .cloned();
                        let m = match existing {
                            Some(m) if rng.chance(60) => {
                                let mut m = m.clone();
                                m.holder.deadline = at + rng.below(900);
                                m
                            }
                            _ => member_of(
                                &token,
                                if rng.chance(70) { fence } else { new.fence },
                                at + rng.below(900),
                                at,
                                1,
                            ),
                        };
                        MemberChange::Set(m)
                    } else {
                        let n = [0, 1, 2, 8, 9, 20][rng.below(6) as usize];
                        let tokens: Vec<TokenDigest> = (0..n)
                            .map(|_| dg(format!("t{}", rng.below(pool + 4)).as_bytes()))
                            .collect();
                        MemberChange::Remove(tokens)
                    };
                    let (mut n2, mut o2) = (new.clone(), old.clone());
                    let got = apply_both(&mut n2, &mut o2, fence, lim, at, change, &what);
                    seen[10] += u32::from(got.is_ok());
                    seen[11] += u32::from(got.is_err());
                    check_kept(&n2, threshold, at, step, &format!("{what} (adversarial)"));
                }
            }
            if let Some(args) = member_effect {
                let e = parsed(&args, &what);
                apply_both(&mut new, &mut old, e.fence, e.limit, e.now, e.change, &what)
                    .unwrap_or_else(|err| panic!("{what}: a primary's effect refused: {err}"));
            }
            if let Some(event) = whole {
                new = whole_state(&primary, event);
                old = new.clone();
                seen[12] += 1;
            }
            assert_eq!(
                unmarked(&new),
                unmarked(&primary),
                "{what}: the replica differs from the primary"
            );
            // Asked most steps, not all: kept hints are also carried over unasked.
            if rng.chance(80) {
                check_kept(&new, threshold, now, step, &what);
            }
        }
    }
    println!("review14 walk coverage: {seen:?}");
    assert!(
        seen[0] + seen[6] > 5 && seen[7] > 20 && seen[8] > 5 && seen[4] > 5 && seen[12] > 20,
        "the walk did not reach every path: {seen:?}"
    );
}

/// Mutated member effects, parsed as the server parses `LOCK.APPLY` from its primary or AOF,
/// then applied to locks of every shape: an error or a change, never a panic; the same answer
/// as the walk.
#[test]
fn review14_malformed_member_effects_never_panic() {
    let mut rng = Rng(0xBAD_A0F);
    // Locks of every shape: free, exclusive, many shared holders (some overdue), a semaphore.
    let mut shapes = vec![Lock::default()];
    let mut exclusive = Lock::default();
    exclusive
        .grant(&asking(b"x", 1000, Mode::Exclusive), 0, T0)
        .unwrap();
    shapes.push(exclusive);
    let mut shared = Lock::default();
    for i in 0..40u64 {
        let name = format!("s{i}");
        shared
            .grant(
                &asking(name.as_bytes(), 10 + i * 10, Mode::Shared),
                0,
                T0 + i,
            )
            .unwrap();
    }
    shapes.push(shared.clone());
    let mut sem = Lock::default();
    for i in 0..3u64 {
        sem.grant(
            &asking(format!("p{i}").as_bytes(), 500, Mode::Permit(3)),
            0,
            T0,
        )
        .unwrap();
    }
    shapes.push(sem);
    // Real effects to mutate.
    let mut seeds: Vec<Vec<Vec<u8>>> = Vec::new();
    let t = dg(b"s3");
    seeds.push(member_effect_args(Event::Acquire, &shared, &t, T0 + 5));
    seeds.push(member_effect_args(Event::Renew, &shared, &t, T0 + 5));
    seeds.push(member_effect_args(Event::Release, &shared, &t, T0 + 5));
    let many: Vec<TokenDigest> = (0..12).map(|i| dg(format!("s{i}").as_bytes())).collect();
    seeds.push(removals_effect_args(
        Event::Expired,
        &shared,
        &many,
        T0 + 500,
    ));
    seeds.push(removals_effect_args(
        Event::Expired,
        &shared,
        &many[..3],
        T0 + 500,
    ));
    let pieces: [&[u8]; 14] = [
        b"0",
        b"1",
        b"-1",
        b"18446744073709551615",
        b"18446744073709551616",
        b"9223372036854775807",
        b"4294967295",
        b"10001",
        b"",
        b"e",
        b"r",
        b"g",
        b"::",
        b"\xff\x00",
    ];
    let mut parsed_ok = 0;
    for round in 0..20_000u64 {
        let mut args = seeds[rng.below(seeds.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(args.len() as u64) as usize;
            match rng.below(6) {
                0 => {
                    // Replace one ':'-field of an argument.
                    let fields: Vec<Vec<u8>> =
                        args[i].split(|b| *b == b':').map(<[u8]>::to_vec).collect();
                    let f = rng.below(fields.len() as u64) as usize;
                    let mut fields = fields;
                    fields[f] = pieces[rng.below(pieces.len() as u64) as usize].to_vec();
                    args[i] = fields.join(&b':');
                }
                1 => {
                    let len = args[i].len();
                    args[i].truncate(rng.below(len as u64 + 1) as usize);
                }
                2 => {
                    if !args[i].is_empty() {
                        let at = rng.below(args[i].len() as u64) as usize;
                        args[i][at] = rng.next() as u8;
                    }
                }
                3 => {
                    let copy = args[i].clone();
                    args.push(copy);
                }
                4 if args.len() > 1 => {
                    args.remove(i);
                }
                _ => {
                    let extra = pieces[rng.below(pieces.len() as u64) as usize].to_vec();
                    args[i].extend_from_slice(b":");
                    args[i].extend_from_slice(&extra);
                }
            }
        }
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let parsed = catch_unwind(AssertUnwindSafe(|| parse_member_effect(&refs)));
        let parsed = parsed.unwrap_or_else(|_| panic!("round {round}: parsing {args:?} panicked"));
        let Some(Ok(effect)) = parsed else { continue };
        parsed_ok += 1;
        for (s, shape) in shapes.iter().enumerate() {
            let (mut new, mut old) = (shape.clone(), shape.clone());
            let what = format!("round {round} shape {s}");
            let result = catch_unwind(AssertUnwindSafe(|| {
                apply_both(
                    &mut new,
                    &mut old,
                    effect.fence,
                    effect.limit,
                    effect.now,
                    effect.change.clone(),
                    &what,
                )
            }));
            assert!(result.is_ok(), "{what}: applying {args:?} panicked");
            let result = catch_unwind(AssertUnwindSafe(|| {
                check_kept(&new, 100, effect.now, round, &what);
            }));
            assert!(result.is_ok(), "{what}: after applying {args:?}");
        }
    }
    assert!(parsed_ok > 500, "only {parsed_ok} mutated effects parsed");
}

/// The group's own changes keep what it knows of its members true on a group of one holder
/// replaced by itself, pushed twice with the same fence, and emptied and refilled (a semaphore
/// keeps its group when free, and its hints with it).
#[test]
fn review14_a_semaphores_group_emptied_and_refilled_keeps_true_bounds() {
    let mut replica = Lock::default();
    let t = |i: u32| dg(format!("p{i}").as_bytes());
    let mut fence = 10;
    let mut now = T0;
    for round in 0..50u32 {
        // Three permits granted with deadlines far apart, then all removed together or one by
        // one; the semaphore's group stays with its hints.
        for i in 0..3 {
            fence += 1;
            let m = member_of(&t(i), fence, now + 1_000 * u64::from(i + 1), now, 1);
            replica
                .apply_member(fence, 3, now, MemberChange::Set(m))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        check_kept(&replica, 100, now, u64::from(round), "filled");
        let tokens: Vec<_> = (0..3).map(t).collect();
        if round % 2 == 0 {
            replica
                .apply_member(fence, 3, now, MemberChange::Remove(tokens))
                .unwrap();
        } else {
            for token in tokens {
                replica
                    .apply_member(fence, 3, now, MemberChange::Remove(vec![token]))
                    .unwrap();
            }
        }
        assert!(replica
            .group
            .as_deref()
            .is_some_and(|g| g.members.is_empty()));
        now += 5_000;
        // A later permit with a later deadline: the bound kept from before is still a bound,
        // and the live count (which a full semaphore's refusal reads) is exact.
        check_kept(&replica, 100, now, u64::from(round), "emptied");
        assert_eq!(replica.live_count(now), 0);
    }
    let _ = Group::default();
}
