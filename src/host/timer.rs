//! One-shot module timers that call a plain function on the main thread.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context};

use crate::host::server::now_ms;
use crate::host::{as_call, guarded};

pub type TimerId = raw::RedisModuleTimerID;

/// What a timer calls when it fires.
pub type Callback = fn(&Context);

/// The longest delay a timer is armed with: one day. Redis turns the delay into microseconds
/// from now without overflow checks, so a delay near `i64::MAX` ms would wrap and fire at once,
/// again and again; a caller that wants a later time re-arms when the timer fires.
pub const MAX_DELAY_MS: u64 = 86_400_000;

/// Arms a timer that calls `callback` after `delay_ms`, or after [`MAX_DELAY_MS`] if that is
/// sooner; its id, or `None` when the server has no timers.
pub fn create(ctx: &Context, delay_ms: u64, callback: Callback) -> Option<TimerId> {
    let delay = i64::try_from(delay_ms.min(MAX_DELAY_MS)).unwrap_or(0);
    // The callback travels as the timer's data: a function pointer fits in a data pointer on
    // every platform Redis runs on.
    let data = callback as *mut c_void;
    // SAFETY: a valid context; `fire` is a plain function and `data` a function pointer that
    // lives as long as the module.
    unsafe { raw::RedisModule_CreateTimer.map(|create| create(ctx.ctx, delay, Some(fire), data)) }
}

/// A timer that is armed at most once at a time: arming it again while it is pending does
/// nothing. Its callback calls [`Single::fired`] first.
#[derive(Default)]
pub struct Single(AtomicBool);

impl Single {
    pub const fn new() -> Self {
        Single(AtomicBool::new(false))
    }

    /// Arms the timer to call `callback` after `delay_ms`, unless it is pending already.
    pub fn arm(&self, ctx: &Context, delay_ms: u64, callback: Callback) {
        if !self.0.swap(true, Ordering::Relaxed) && create(ctx, delay_ms, callback).is_none() {
            self.0.store(false, Ordering::Relaxed);
        }
    }

    /// In the callback: the timer is no longer pending.
    pub fn fired(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// A timer armed for the earliest time it was asked for: a later time leaves it as it is, an
/// earlier one re-arms it. Its callback calls [`Earliest::fired`] first.
#[derive(Default)]
pub struct Earliest(Option<(TimerId, u64)>);

impl Earliest {
    pub const fn new() -> Self {
        Earliest(None)
    }

    /// Makes sure `callback` runs at `at` (ms since the epoch) or earlier.
    pub fn arm(&mut self, ctx: &Context, at: u64, callback: Callback) {
        if self.0.is_some_and(|(_, fires)| fires <= at) {
            return;
        }
        if let Some((id, _)) = self.0.take() {
            stop(ctx, id);
        }
        let delay = at.saturating_sub(now_ms());
        self.0 = create(ctx, delay, callback).map(|id| (id, at));
    }

    /// In the callback: the timer is no longer pending.
    pub fn fired(&mut self) {
        self.0 = None;
    }
}

/// Stops a timer that has not fired yet (a harmless no-op for one that has).
pub fn stop(ctx: &Context, id: TimerId) {
    // SAFETY: a valid context; Redis looks the id up and refuses unknown ones.
    unsafe {
        if let Some(stop) = raw::RedisModule_StopTimer {
            stop(ctx.ctx, id, std::ptr::null_mut());
        }
    }
}

extern "C" fn fire(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: `data` is the `Callback` that `create` stored, converted back to its own type.
    let callback = unsafe { std::mem::transmute::<*mut c_void, Callback>(data) };
    let context = Context::new(ctx);
    as_call(&context, || guarded((), || callback(&context)));
}
