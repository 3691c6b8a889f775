//! Model-based property tests of the pure lock core (`core.rs`) against a small reference model
//! written from the contract alone: a map of keys to (last fence, holder token, deadline, holds,
//! session flag), and fences formed as the README says (largest of key fence + 1, floor + 1 and
//! wall clock x 2048).
//!
//! A seeded random walk (SplitMix64, no dependency, fully deterministic) drives both with the same
//! operations on a few keys and tokens, with random time steps: none, one ms, small, exactly onto
//! a deadline, big jumps and small steps back. After every operation the outcome and everything
//! observable (live holder, fence, ttl, overdue state, fence checks) must agree, every grant's
//! fence must exceed every fence issued before it, and each lock must survive its RDB encoding and
//! its replicated effect unchanged. `LOCK_MODEL_CASES` raises the number of walks (default 120).

use std::collections::BTreeMap;

use crate::lock::codec::{self, Fields};
use crate::lock::core::{deadline_after, Acquire, FenceExhausted, Lock, MAX_FENCE};
use crate::lock::event::Event;

/// SplitMix64: small, fast and good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MHolder {
    token: Vec<u8>,
    deadline: u64,
    holds: u32,
    session: bool,
}

/// The reference: one lock as the contract describes it.
#[derive(Clone, Debug, Default)]
struct MLock {
    fence: u64,
    holder: Option<MHolder>,
}

#[derive(Debug, PartialEq, Eq)]
enum MAcquire {
    Granted(u64),
    Refreshed(u64),
    Busy,
    Exhausted,
}

impl MLock {
    fn live(&self, now: u64) -> Option<&MHolder> {
        self.holder.as_ref().filter(|h| h.deadline > now)
    }
    fn live_with(&mut self, token: &[u8], now: u64) -> Option<&mut MHolder> {
        self.holder
            .as_mut()
            .filter(|h| h.deadline > now && h.token == token)
    }
    fn acquire(
        &mut self,
        token: &[u8],
        ttl: u64,
        reentrant: bool,
        session: bool,
        floor: u64,
        now: u64,
    ) -> MAcquire {
        let deadline = now.saturating_add(ttl);
        let fence = self.fence;
        if let Some(h) = self.live_with(token, now) {
            h.deadline = deadline;
            if reentrant {
                h.holds = h.holds.saturating_add(1);
            }
            h.session |= session;
            return MAcquire::Refreshed(fence);
        }
        if self.live(now).is_some() {
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
        self.holder = Some(MHolder {
            token: token.to_vec(),
            deadline,
            holds: 1,
            session,
        });
        MAcquire::Granted(fence)
    }
    fn release(&mut self, token: &[u8], now: u64) -> Option<bool> {
        let h = self.live_with(token, now)?;
        if h.holds > 1 {
            h.holds -= 1;
            return Some(false);
        }
        self.holder = None;
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
            self.holder = None;
            return true;
        }
        false
    }
    fn force_release(&mut self, now: u64) -> bool {
        let held = self.live(now).is_some();
        if held {
            self.holder = None;
        }
        held
    }
    fn expire(&mut self, now: u64) -> bool {
        if self.holder.as_ref().is_some_and(|h| h.deadline <= now) {
            self.holder = None;
            return true;
        }
        false
    }
}

fn outcome(r: Result<Acquire, FenceExhausted>) -> MAcquire {
    match r {
        Ok(Acquire::Granted { fence }) => MAcquire::Granted(fence),
        Ok(Acquire::Refreshed { fence }) => MAcquire::Refreshed(fence),
        Ok(Acquire::Busy) => MAcquire::Busy,
        Err(FenceExhausted) => MAcquire::Exhausted,
    }
}

const TOKENS: [&[u8]; 5] = [b"a", b"b", b"c\0\xff", b"\r\n*1\r\n", b"a\0"];

/// Everything observable about `lock` at `now` agrees with `model`.
fn check_state(lock: &Lock, model: &MLock, now: u64, ctx: &dyn Fn() -> String) {
    assert_eq!(lock.fence, model.fence, "fence; {}", ctx());
    let live = lock.live_holder(now).map(|h| {
        (
            h.token.to_vec(),
            h.deadline,
            h.holds,
            h.session,
            lock.ttl(now),
        )
    });
    let mlive = model.live(now).map(|h| {
        (
            h.token.clone(),
            h.deadline,
            h.holds,
            h.session,
            Some(h.deadline - now),
        )
    });
    assert_eq!(live, mlive, "live holder; {}", ctx());
    assert_eq!(lock.is_held(now), mlive.is_some(), "is_held; {}", ctx());
    let m_overdue = model.holder.as_ref().is_some_and(|h| h.deadline <= now);
    assert_eq!(lock.is_overdue(now), m_overdue, "overdue; {}", ctx());
    for probe in [
        model.fence,
        model.fence.wrapping_sub(1),
        model.fence.wrapping_add(1),
    ] {
        let expected = model.live(now).is_some() && probe == model.fence;
        assert_eq!(
            lock.fence_is_current(probe, now),
            expected,
            "fence_is_current({probe}); {}",
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
                .filter_map(|l| l.holder.as_ref().map(|h| h.deadline))
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
        match op {
            Op::Acquire {
                key,
                token,
                ttl,
                reentrant,
                session,
            } => {
                let t = TOKENS[token];
                let got = outcome(real[key].acquire(t, ttl, reentrant, session, floor, now));
                let want = model[key].acquire(t, ttl, reentrant, session, floor, now);
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
                if let MAcquire::Granted(f) | MAcquire::Refreshed(f) = got {
                    let h = real[key].live_holder(now).expect("holder after acquire");
                    assert_eq!(&*h.token, t, "token after acquire; {}", ctx());
                    assert_eq!(h.deadline, deadline_after(now, ttl));
                    assert_eq!(real[key].fence, f);
                }
            }
            Op::Release { key, token } => {
                let t = TOKENS[token];
                let holder_before = model[key].live(now).map(|h| h.token.clone());
                let got = real[key].release(t, now);
                assert_eq!(got, model[key].release(t, now), "release; {}", ctx());
                // I5: a token that is not the live holder never releases.
                if holder_before.as_deref() != Some(t) {
                    assert_eq!(got, None, "wrong-token release; {}", ctx());
                }
            }
            Op::Renew { key, token, ttl } => {
                let t = TOKENS[token];
                let holder_before = model[key].live(now).map(|h| h.token.clone());
                let got = real[key].renew(t, ttl, now);
                assert_eq!(got, model[key].renew(t, ttl, now), "renew; {}", ctx());
                if holder_before.as_deref() != Some(t) {
                    assert!(!got, "wrong-token renew; {}", ctx());
                }
            }
            Op::EndSession { key, token } => {
                let t = TOKENS[token];
                assert_eq!(
                    real[key].end_session(t, now),
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
        for key in 0..keys {
            check_state(&real[key], &model[key], now, &ctx);
            check_encodings(&real[key], &ctx);
        }
    }
    for fences in granted.values() {
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "seed {seed:#x}");
    }
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
    let got = outcome(real.acquire(b"a", 10, false, false, MAX_FENCE - 1, now));
    assert_eq!(got, MAcquire::Granted(MAX_FENCE));
    assert_eq!(
        got,
        model.acquire(b"a", 10, false, false, MAX_FENCE - 1, now)
    );
    assert_eq!(real.release(b"a", now), Some(true));
    assert_eq!(model.release(b"a", now), Some(true));
    let got = outcome(real.acquire(b"b", 10, false, false, MAX_FENCE, now));
    assert_eq!(got, MAcquire::Exhausted);
    assert_eq!(got, model.acquire(b"b", 10, false, false, MAX_FENCE, now));
    assert_eq!(real.fence, MAX_FENCE, "an exhausted grant changes nothing");
    assert!(!real.is_held(now));
}
