//! Model-based property tests of the pure lock core (`core.rs`) against a small reference model
//! written from the contract alone: a map of keys to (last fence, semaphore limit, holders in
//! grant order, each with token, fence, deadline, holds, session flag and shared or exclusive
//! mode), and fences formed as the README says (largest of key fence + 1, floor + 1 and wall
//! clock x 2048).
//!
//! A seeded random walk (SplitMix64, no dependency, fully deterministic) drives both with the same
//! operations on a few keys and tokens, with random time steps: none, one ms, small, exactly onto
//! a deadline, big jumps and small steps back. After every operation the outcome and everything
//! observable (live holders, fence, ttl, overdue state, fence checks, limit) must agree, the
//! modes' rules must hold (an exclusive holder alone, at most `limit` permits), every grant's
//! fence must exceed every fence issued before it, and each lock must survive its RDB encoding and
//! its replicated effect unchanged. `LOCK_MODEL_CASES` raises the number of walks (default 120).

use std::collections::BTreeMap;

use crate::lock::codec::{self, Fields};
use crate::lock::core::{
    deadline_after, Acquire, Lock, Mode, Refused, Request, TokenDigest, MAX_FENCE,
};
use crate::lock::event::Event;

/// SplitMix64: small, fast and good enough to pick operations (the random walks of every
/// unit test use it).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MHolder {
    token: Vec<u8>,
    /// The fence of this holder's grant.
    fence: u64,
    deadline: u64,
    holds: u32,
    session: bool,
    /// A shared hold or a permit (else exclusive).
    shared: bool,
}

/// The reference: one lock as the contract describes it. Holders are kept in grant order, live
/// or overdue; a semaphore's limit stays while the key exists.
#[derive(Clone, Debug, Default)]
struct MLock {
    fence: u64,
    holders: Vec<MHolder>,
    limit: u32,
}

#[derive(Debug, PartialEq, Eq)]
enum MAcquire {
    Granted(u64),
    Refreshed(u64),
    Downgraded(u64),
    Busy,
    Exhausted,
    Refused(Refused),
}

impl MLock {
    fn live(&self, now: u64) -> impl Iterator<Item = &MHolder> {
        self.holders.iter().filter(move |h| h.deadline > now)
    }
    fn live_with(&mut self, token: &[u8], now: u64) -> Option<&mut MHolder> {
        self.holders
            .iter_mut()
            .find(|h| h.deadline > now && h.token == token)
    }
    fn remove_live(&mut self, token: &[u8], now: u64) {
        self.holders
            .retain(|h| !(h.deadline > now && h.token == token));
    }
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        token: &[u8],
        ttl: u64,
        reentrant: bool,
        session: bool,
        mode: Mode,
        floor: u64,
        now: u64,
    ) -> MAcquire {
        let deadline = now.saturating_add(ttl);
        let refresh = |h: &mut MHolder| {
            h.deadline = deadline;
            if reentrant {
                h.holds = h.holds.saturating_add(1);
            }
            h.session |= session;
            h.fence
        };
        let live_count = self.live(now).count();
        let exclusive_live = self.live(now).any(|h| !h.shared);
        if let Some(h) = self.live_with(token, now).filter(|h| !h.shared) {
            return match mode {
                Mode::Exclusive => MAcquire::Refreshed(refresh(h)),
                Mode::Shared => {
                    h.shared = true;
                    MAcquire::Downgraded(refresh(h))
                }
                Mode::Permit(_) => MAcquire::Refused(Refused::NotSemaphore),
            };
        }
        match mode {
            Mode::Permit(n) if self.limit > 0 && n != self.limit => {
                return MAcquire::Refused(Refused::Semaphore { limit: self.limit })
            }
            Mode::Exclusive | Mode::Shared if self.limit > 0 => {
                return MAcquire::Refused(Refused::Semaphore { limit: self.limit })
            }
            Mode::Permit(_) if self.limit == 0 && live_count > 0 => {
                return MAcquire::Refused(Refused::NotSemaphore)
            }
            _ => {}
        }
        if let Some(h) = self.live_with(token, now) {
            return match mode {
                Mode::Exclusive => MAcquire::Refused(Refused::Upgrade),
                Mode::Shared | Mode::Permit(_) => MAcquire::Refreshed(refresh(h)),
            };
        }
        let room = match mode {
            Mode::Exclusive => live_count == 0,
            Mode::Shared => !exclusive_live,
            Mode::Permit(n) => live_count < n as usize,
        };
        if !room {
            return MAcquire::Busy;
        }
        // The README's rule, in wide arithmetic.
        let wide = (u128::from(floor) + 1)
            .max(u128::from(self.fence) + 1)
            .max(u128::from(now) * 2048);
        if wide > u128::from(MAX_FENCE) {
            return MAcquire::Exhausted;
        }
        let fence = wide as u64;
        self.fence = fence;
        self.holders.retain(|h| h.deadline > now);
        if let Mode::Permit(n) = mode {
            self.limit = n;
        }
        self.holders.push(MHolder {
            token: token.to_vec(),
            fence,
            deadline,
            holds: 1,
            session,
            shared: mode != Mode::Exclusive,
        });
        MAcquire::Granted(fence)
    }
    fn release(&mut self, token: &[u8], now: u64) -> Option<bool> {
        let h = self.live_with(token, now)?;
        if h.holds > 1 {
            h.holds -= 1;
            return Some(false);
        }
        self.remove_live(token, now);
        Some(true)
    }
    fn renew(&mut self, token: &[u8], ttl: u64, now: u64) -> bool {
        match self.live_with(token, now) {
            Some(h) => {
                h.deadline = now.saturating_add(ttl);
                true
            }
            None => false,
        }
    }
    fn end_session(&mut self, token: &[u8], now: u64) -> bool {
        if self.live_with(token, now).is_some_and(|h| h.session) {
            self.remove_live(token, now);
            return true;
        }
        false
    }
    fn force_release(&mut self, now: u64) -> bool {
        let held = self.live(now).next().is_some();
        if held {
            self.holders.clear();
        }
        held
    }
    /// Removes the holder whose lease ran out first (the earliest granted among equals).
    fn expire(&mut self, now: u64) -> bool {
        let first = self
            .holders
            .iter()
            .enumerate()
            .filter(|(_, h)| h.deadline <= now)
            .min_by_key(|(_, h)| h.deadline)
            .map(|(index, _)| index);
        match first {
            Some(index) => {
                self.holders.remove(index);
                true
            }
            None => false,
        }
    }
}

fn outcome<E: Into<Refused>>(r: Result<Acquire, E>) -> MAcquire {
    match r {
        Ok(Acquire::Granted { fence }) => MAcquire::Granted(fence),
        Ok(Acquire::Refreshed { fence }) => MAcquire::Refreshed(fence),
        Ok(Acquire::Downgraded { fence }) => MAcquire::Downgraded(fence),
        Ok(Acquire::Busy) => MAcquire::Busy,
        Err(e) => match e.into() {
            Refused::FenceExhausted => MAcquire::Exhausted,
            refused => MAcquire::Refused(refused),
        },
    }
}

const TOKENS: [&[u8]; 5] = [b"a", b"b", b"c\0\xff", b"\r\n*1\r\n", b"a\0"];

/// Everything observable about `lock` at `now` agrees with `model`, and the lock keeps the
/// rules of modes: an exclusive holder alone, never more permit holders than permits.
fn check_state(lock: &Lock, model: &MLock, now: u64, ctx: &dyn Fn() -> String) {
    assert_eq!(lock.fence, model.fence, "fence; {}", ctx());
    let mut live: Vec<_> = lock
        .live_holders(now)
        .map(|(fence, h)| {
            let shared = lock.live_holder(now).is_none();
            (*h.token(), fence, h.deadline, h.holds, h.session, shared)
        })
        .collect();
    live.sort_by_key(|h| h.1);
    let mlive: Vec<_> = model
        .live(now)
        .map(|h| {
            (
                TokenDigest::of(&h.token),
                h.fence,
                h.deadline,
                h.holds,
                h.session,
                h.shared,
            )
        })
        .collect();
    assert_eq!(live, mlive, "live holders; {}", ctx());
    assert_eq!(lock.is_held(now), !mlive.is_empty(), "is_held; {}", ctx());
    let m_overdue = model.holders.iter().any(|h| h.deadline <= now);
    assert_eq!(lock.is_overdue(now), m_overdue, "overdue; {}", ctx());
    // What the lease timer follows: never later than the earliest deadline, and exact once
    // is_overdue (above) looked for overdue holders at a time past it.
    let m_next = model.holders.iter().map(|h| h.deadline).min();
    let next = lock.next_deadline();
    assert_eq!(next.is_some(), m_next.is_some(), "next deadline; {}", ctx());
    assert!(
        next <= m_next,
        "next deadline {next:?} after {m_next:?}; {}",
        ctx()
    );
    if m_next.is_some_and(|at| lock.is_overdue(at.max(now))) {
        assert_eq!(
            lock.next_deadline(),
            m_next,
            "next deadline once overdue; {}",
            ctx()
        );
    }
    let m_ttl = model.live(now).map(|h| h.deadline - now).min();
    assert_eq!(lock.ttl(now), m_ttl, "ttl; {}", ctx());
    if lock.has_holders() || lock.limit() > 0 {
        assert_eq!(lock.limit(), model.limit, "limit; {}", ctx());
    }
    if lock.live_holder(now).is_some() {
        assert_eq!(live.len(), 1, "an exclusive holder alone; {}", ctx());
    }
    if lock.limit() > 0 {
        assert!(live.len() <= lock.limit() as usize, "permits; {}", ctx());
    }
    let mut probes = vec![model.fence, model.fence.wrapping_add(1)];
    for h in &model.holders {
        probes.extend([h.fence, h.fence.wrapping_sub(1)]);
    }
    for probe in probes {
        let expected = model.live(now).any(|h| h.fence == probe);
        assert_eq!(
            lock.fence_is_current(probe, now),
            expected,
            "fence_is_current({probe}); {}",
            ctx()
        );
    }
    for token in TOKENS {
        assert_eq!(
            lock.holds(&TokenDigest::of(token), now),
            model.live(now).any(|h| h.token == token),
            "holds; {}",
            ctx()
        );
    }
}

/// The lock survives its RDB encoding and its replicated effect unchanged.
fn check_encodings(lock: &Lock, ctx: &dyn Fn() -> String) {
    let mut fields = Fields::default();
    codec::save(lock, &mut fields);
    assert_eq!(
        codec::load(codec::ENCODING_VERSION, &mut fields).as_ref(),
        Ok(lock),
        "RDB round trip; {}",
        ctx()
    );
    if lock.fence > 0 {
        let args = codec::effect_args(Event::Sync, lock);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let effect = codec::parse_effect(&refs);
        assert_eq!(
            effect.as_ref().map(|e| &e.lock),
            Ok(lock),
            "LOCK.APPLY round trip; {}",
            ctx()
        );
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: usize,
        token: usize,
        ttl: u64,
        reentrant: bool,
        session: bool,
        mode: Mode,
    },
    Release {
        key: usize,
        token: usize,
    },
    Renew {
        key: usize,
        token: usize,
        ttl: u64,
    },
    EndSession {
        key: usize,
        token: usize,
    },
    ForceRelease {
        key: usize,
    },
    Expire {
        key: usize,
    },
}

fn random_ttl(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0 => 1,
        1 => 2,
        2 => u64::MAX - rng.below(3),
        3 => 86_400_000,
        _ => 1 + rng.below(500),
    }
}

fn random_op(rng: &mut Rng, keys: usize) -> Op {
    let key = rng.below(keys as u64) as usize;
    let token = rng.below(TOKENS.len() as u64) as usize;
    match rng.below(100) {
        0..=39 => Op::Acquire {
            key,
            token,
            ttl: random_ttl(rng),
            reentrant: rng.chance(30),
            session: rng.chance(30),
            mode: match rng.below(8) {
                0..=3 => Mode::Exclusive,
                4 | 5 => Mode::Shared,
                6 => Mode::Permit(2),
                _ => Mode::Permit(1 + rng.below(3) as u32),
            },
        },
        40..=64 => Op::Release { key, token },
        65..=79 => Op::Renew {
            key,
            token,
            ttl: random_ttl(rng),
        },
        80..=86 => Op::EndSession { key, token },
        87..=91 => Op::ForceRelease { key },
        _ => Op::Expire { key },
    }
}

/// The next time: mostly forward in small steps, sometimes exactly onto (or just before) a
/// deadline, sometimes far ahead, sometimes a little back (a stepped clock).
fn step_time(rng: &mut Rng, now: u64, locks: &[MLock]) -> u64 {
    match rng.below(100) {
        0..=29 => now,
        30..=49 => now + 1,
        50..=74 => now + rng.below(200),
        75..=84 => {
            let deadlines: Vec<u64> = locks
                .iter()
                .flat_map(|l| l.holders.iter().map(|h| h.deadline))
                .filter(|d| *d < now + 10_000_000)
                .collect();
            if deadlines.is_empty() {
                now + 1
            } else {
                let d = deadlines[rng.below(deadlines.len() as u64) as usize];
                if rng.chance(50) {
                    d
                } else {
                    d.saturating_sub(1)
                }
            }
        }
        85..=92 => now + rng.below(100_000),
        _ => now.saturating_sub(rng.below(300)),
    }
}

fn walk(seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let keys = 1 + rng.below(3) as usize;
    // Realistic clocks, plus a clock far behind the floor (only the counter terms decide then).
    let mut now = match rng.below(4) {
        0 => rng.below(1_000),
        _ => 1_764_000_000_000 + rng.below(1 << 30),
    };
    let mut floor = if rng.chance(20) {
        (now << 11) + (1 << 40)
    } else {
        0
    };
    let mut real: Vec<Lock> = vec![Lock::default(); keys];
    // What a replica holds: the primary's changes applied as the server replicates them (one
    // holder's change alone when the lock has shared or permit holders before and after it).
    let mut replica: Vec<Lock> = vec![Lock::default(); keys];
    let mut model: Vec<MLock> = vec![MLock::default(); keys];
    // Every fence granted so far, per key, in order: strictly increasing, server-wide.
    let mut granted: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let mut last_grant = 0u64;
    let mut history: Vec<(u64, Op)> = Vec::new();
    for step in 0..steps {
        now = step_time(&mut rng, now, &model);
        let op = random_op(&mut rng, keys);
        history.push((now, op.clone()));
        let floor_before = floor;
        let ctx = || {
            let tail: Vec<String> = history
                .iter()
                .rev()
                .take(12)
                .rev()
                .map(|(t, o)| format!("{t}: {o:?}"))
                .collect();
            format!(
                "seed {seed:#x} step {step} floor {floor_before}; last ops:\n  {}",
                tail.join("\n  ")
            )
        };
        let (op_key, op_token) = match op {
            Op::Acquire { key, token, .. }
            | Op::Release { key, token }
            | Op::Renew { key, token, .. }
            | Op::EndSession { key, token } => (key, Some(TokenDigest::of(TOKENS[token]))),
            Op::Expire { key } => (key, real[key].expiring_member(now).copied()),
            Op::ForceRelease { key } => (key, None),
        };
        let before = real[op_key].clone();
        match op {
            Op::Acquire {
                key,
                token,
                ttl,
                reentrant,
                session,
                mode,
            } => {
                let t = TOKENS[token];
                let request = Request {
                    provisional: false,
                    token: TokenDigest::of(t),
                    ttl,
                    reentrant,
                    session,
                    delay: 0,
                    mode,
                    client: 0,
                    connection: b"",
                    label: b"",
                };
                let got = outcome(real[key].grant(&request, floor, now));
                let want = model[key].acquire(t, ttl, reentrant, session, mode, floor, now);
                assert_eq!(got, want, "acquire; {}", ctx());
                if let MAcquire::Granted(fence) = got {
                    assert!(
                        fence > last_grant,
                        "fence {fence} after {last_grant}; {}",
                        ctx()
                    );
                    assert!(fence > floor, "fence above floor; {}", ctx());
                    if now < 1 << 52 {
                        assert!(fence >= now << 11, "clock term; {}", ctx());
                    }
                    last_grant = fence;
                    granted.entry(key).or_default().push(fence);
                    floor = floor.max(fence);
                }
                if let MAcquire::Granted(f) | MAcquire::Refreshed(f) | MAcquire::Downgraded(f) = got
                {
                    let (fence, h) = real[key]
                        .live_holders(now)
                        .find(|(_, h)| *h.token() == TokenDigest::of(t))
                        .expect("holder after acquire");
                    assert_eq!(h.deadline, deadline_after(now, ttl));
                    assert_eq!(fence, f, "the holder's fence; {}", ctx());
                    assert!(real[key].fence >= f);
                }
            }
            Op::Release { key, token } => {
                let t = TOKENS[token];
                let held_before = model[key].live(now).any(|h| h.token == t);
                let got = real[key].release(&TokenDigest::of(t), now);
                assert_eq!(got, model[key].release(t, now), "release; {}", ctx());
                // I5: a token that is not a live holder never releases.
                if !held_before {
                    assert_eq!(got, None, "wrong-token release; {}", ctx());
                }
            }
            Op::Renew { key, token, ttl } => {
                let t = TOKENS[token];
                let held_before = model[key].live(now).any(|h| h.token == t);
                let got = real[key].renew(&TokenDigest::of(t), ttl, now);
                assert_eq!(got, model[key].renew(t, ttl, now), "renew; {}", ctx());
                if !held_before {
                    assert!(!got, "wrong-token renew; {}", ctx());
                }
            }
            Op::EndSession { key, token } => {
                let t = TOKENS[token];
                assert_eq!(
                    real[key].end_session(&TokenDigest::of(t), now),
                    model[key].end_session(t, now),
                    "end_session; {}",
                    ctx()
                );
            }
            Op::ForceRelease { key } => {
                assert_eq!(
                    real[key].force_release(now),
                    model[key].force_release(now),
                    "force_release; {}",
                    ctx()
                );
            }
            Op::Expire { key } => {
                assert_eq!(
                    real[key].expire(now),
                    model[key].expire(now),
                    "expire; {}",
                    ctx()
                );
            }
        }
        let after = &real[op_key];
        if *after != before {
            match op_token {
                Some(token) if before.group.is_some() && after.group.is_some() => {
                    // Through the effect's encoding, as a replica receives it.
                    let args = codec::member_effect_args(Event::Acquire, after, &token, now);
                    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    let effect = codec::parse_member_effect(&refs)
                        .unwrap_or_else(|| panic!("not a member effect; {}", ctx()))
                        .unwrap_or_else(|e| panic!("member effect {e:?}; {}", ctx()));
                    assert_eq!(effect.fence, after.fence);
                    let applied = replica[op_key].apply_member(
                        effect.fence,
                        effect.limit,
                        effect.now,
                        effect.change,
                    );
                    assert_eq!(applied, Ok(()), "member change refused; {}", ctx());
                }
                _ => replica[op_key] = after.clone(),
            }
        }
        assert_eq!(replica[op_key], *after, "replica; {}", ctx());
        for key in 0..keys {
            check_state(&real[key], &model[key], now, &ctx);
            check_encodings(&real[key], &ctx);
            check_batch_expiry(&real[key], now, &ctx);
        }
    }
    for fences in granted.values() {
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "seed {seed:#x}");
    }
}

/// Expiring every overdue shared or permit holder in one pass leaves the lock that expiring them
/// one at a time leaves, and their removal, replicated together, leaves a replica the same; a
/// budget takes at most that many.
fn check_batch_expiry(lock: &Lock, now: u64, ctx: &dyn Fn() -> String) {
    if lock.holder.is_some() {
        return;
    }
    let mut one_by_one = lock.clone();
    while one_by_one.expire(now) {}
    let mut batch = lock.clone();
    let expired = batch.expire_members(now, usize::MAX);
    assert_eq!(batch, one_by_one, "batch expiry; {}", ctx());
    if !expired.is_empty() {
        let args = codec::removals_effect_args(
            Event::Expired,
            &batch,
            &expired
                .iter()
                .map(|m| *m.holder.token())
                .collect::<Vec<_>>(),
            now,
        );
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let effect = codec::parse_member_effect(&refs)
            .unwrap_or_else(|| panic!("not a member effect; {}", ctx()))
            .unwrap_or_else(|e| panic!("removals {e:?}; {}", ctx()));
        let mut replica = lock.clone();
        let applied = replica.apply_member(effect.fence, effect.limit, effect.now, effect.change);
        assert_eq!(applied, Ok(()), "removals refused; {}", ctx());
        assert_eq!(replica, batch, "replicated removals; {}", ctx());
    }
    let mut budgeted = lock.clone();
    let first = budgeted.expire_members(now, 1);
    assert_eq!(first.len(), expired.len().min(1), "budget; {}", ctx());
}

fn cases() -> u64 {
    std::env::var("LOCK_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120)
}

#[test]
fn core_agrees_with_the_reference_model_on_random_walks() {
    for case in 0..cases() {
        walk(0x5EED_0000 + case, 2_000);
    }
}

#[test]
fn core_agrees_with_the_reference_model_on_long_walks() {
    for case in 0..(cases() / 30).max(4) {
        walk(0x10C6_0000 + case, 40_000);
    }
}

#[test]
fn fence_exhaustion_is_reported_not_wrapped() {
    let mut model = MLock::default();
    let mut real = Lock::default();
    let now = 1_764_000_000_000;
    let got = outcome(real.acquire(TokenDigest::of(b"a"), 10, false, false, MAX_FENCE - 1, now));
    assert_eq!(got, MAcquire::Granted(MAX_FENCE));
    assert_eq!(
        got,
        model.acquire(b"a", 10, false, false, Mode::Exclusive, MAX_FENCE - 1, now)
    );
    assert_eq!(real.release(&TokenDigest::of(b"a"), now), Some(true));
    assert_eq!(model.release(b"a", now), Some(true));
    let got = outcome(real.acquire(TokenDigest::of(b"b"), 10, false, false, MAX_FENCE, now));
    assert_eq!(got, MAcquire::Exhausted);
    assert_eq!(
        got,
        model.acquire(b"b", 10, false, false, Mode::Exclusive, MAX_FENCE, now)
    );
    assert_eq!(real.fence, MAX_FENCE, "an exhausted grant changes nothing");
    assert!(!real.is_held(now));
}
